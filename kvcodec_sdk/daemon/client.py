"""A client of the per-host daemon: pages set into and read from the shared L2 arena in place.

The client maps the arena whose descriptor the daemon passed at the handshake. A ``set`` leases
slots, writes the pages straight into them and commits them under their keys; a ``get`` asks
where each key's slot is and reads it in place: no page byte crosses the socket. A read is
accepted only when the slot's header still shows the version the daemon answered (a slot reused
meanwhile is detected) and the bytes' CRC-32C matches (bytes another client wrote where it should
not are detected); anything else is a miss, never wrong data.

One client serves one thread at a time (it holds a lock per call).
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..disk import crc32c as _crc
from . import protocol
from .arena import Arena, RegionLayout, key_digest
from .protocol import DaemonError, DaemonUnavailable

__all__ = ["DaemonClient", "Hit", "RegionHandle"]


@dataclass(frozen=True)
class RegionHandle:
    """A region of the arena, as the daemon answered: pass it to :meth:`DaemonClient.set` /
    :meth:`DaemonClient.get`."""

    identity: str
    layout: RegionLayout


class Hit(NamedTuple):
    """A key found in L2: its slot (pinned until released), the version, length and CRC-32C the
    daemon answered, and a view of the bytes in the arena."""

    slot: int
    version: int
    length: int
    crc: int
    data: memoryview


class DaemonClient:
    """A connection to the daemon at ``socket_path`` (connected at once).

    :param timeout_s: Bound of each request's round trip.
    :raises DaemonUnavailable: no daemon answers at ``socket_path``.
    """

    def __init__(self, socket_path: str, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.arena: Arena | None = None
        self.client_id = 0
        self.socket_bytes = 0  # bytes sent and received on the socket, for the record
        self._regions: dict[tuple[str, int], RegionHandle] = {}
        self._connect()

    # -- connection ------------------------------------------------------------------------------

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise DaemonUnavailable(f"no daemon answers at {self.socket_path}: {exc.strerror or exc}") from None
        fds: list[int] = []
        try:
            self.socket_bytes += protocol.send_frame(sock, ["hello", protocol.PROTOCOL_VERSION, os.getpid()])
            reply, n = protocol.recv_frame(sock, fds)
            self.socket_bytes += n
        except OSError as exc:
            sock.close()
            raise DaemonUnavailable(f"the daemon at {self.socket_path} did not complete the handshake: {exc}") from None
        if reply[0] != protocol.OK:
            sock.close()
            raise DaemonError(f"the daemon refused the handshake: {reply[1]}")
        if not fds:
            sock.close()
            raise DaemonError("the daemon passed no arena descriptor")
        for extra in fds[1:]:
            os.close(extra)
        _, _version, size, self.client_id = reply
        self.arena = Arena.attach(fds[0], size)
        self._sock = sock
        self._reader = protocol.SocketReader(sock)
        self._regions.clear()

    def reconnect(self) -> None:
        """Connects again (after the daemon restarted: L2 starts empty, regions are asked for anew)."""
        with self._lock:
            self._close_connection()
            self._connect()

    def _close_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def close(self) -> None:
        """Disconnects (the daemon releases whatever this client still pinned). Idempotent."""
        with self._lock:
            self._close_connection()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, *message: Any) -> list:
        if self._sock is None:
            raise DaemonUnavailable("this client is closed (reconnect() to use it again)")
        try:
            data = protocol.pack(list(message))
            self._sock.sendall(data)
            reply, n = self._reader.frame()
        except (OSError, DaemonUnavailable) as exc:
            raise DaemonUnavailable(f"the daemon at {self.socket_path} went away: {exc}") from None
        self.socket_bytes += n + len(data)
        if reply[0] != protocol.OK:
            raise DaemonError(reply[1])
        return reply[1:]

    def _tell(self, *message: Any) -> None:
        """A request without a reply (release)."""
        if self._sock is None:
            return
        try:
            self.socket_bytes += protocol.send_frame(self._sock, list(message))
        except OSError:
            pass  # the daemon is gone: it released everything with the connection

    # -- requests --------------------------------------------------------------------------------

    def region(self, identity: str, page_bytes: int, slots: int) -> RegionHandle:
        """The arena region of (identity, page bytes): created by the first client that asks, with
        up to ``slots`` slots; every client of the same identity and page size shares it."""
        with self._lock:
            key = (str(identity), int(page_bytes))
            if key not in self._regions:
                rid, table, data, stride, n = self._call("region", key[0], key[1], int(slots))
                self._regions[key] = RegionHandle(key[0], RegionLayout(rid, table, data, stride, n, key[1]))
            return self._regions[key]

    def set(self, region: RegionHandle, keys: Sequence[bytes], pages: Sequence[Any], *,
            ephemeral: bool = False) -> list[bool]:
        """Stores each page (bytes-like, at most the region's page bytes) under its key, written
        straight into leased arena slots; per key, True when stored (False: L2 had no slot that
        nobody pinned)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        views = [memoryview(p).cast("B") for p in pages]
        for i, v in enumerate(views):
            if v.nbytes > region.layout.page_bytes:
                raise ValueError(f"pages[{i}] has {v.nbytes} bytes; the region's pages have at most "
                                 f"{region.layout.page_bytes}")
        with self._lock:
            return self._set(region, keys, lambda i, dst: dst.__setitem__(slice(0, views[i].nbytes), views[i]),
                             [v.nbytes for v in views], ephemeral)

    def set_with(self, region: RegionHandle, keys: Sequence[bytes], lengths: Sequence[int],
                 write: Callable[[int, memoryview], None], *, ephemeral: bool = False) -> list[bool]:
        """Like :meth:`set`, but ``write(i, view)`` fills page i's leased slot itself (an encoder
        writing straight into the arena: no staging copy)."""
        with self._lock:
            return self._set(region, keys, write, list(lengths), ephemeral)

    def _set(self, region: RegionHandle, keys: Sequence[bytes], write: Callable[[int, memoryview], None],
             lengths: list[int], ephemeral: bool) -> list[bool]:
        layout = region.layout
        slots, _versions = self._call("lease", layout.region, len(keys))
        crcs = []
        try:
            for i, s in enumerate(slots):
                dst = self.arena.data(layout, s, lengths[i])
                write(i, dst)
                crcs.append(_crc(dst))
        except BaseException:
            self._call("abort", layout.region, slots)
            raise
        n = len(slots)
        (statuses,) = self._call("commit", layout.region, slots, [bytes(k) for k in keys[:n]], lengths[:n], crcs,
                                 ephemeral)
        return [st == 0 for st in statuses] + [False] * (len(keys) - n)

    def get(self, region: RegionHandle, keys: Sequence[bytes]) -> list[Hit | None]:
        """Where each key's page is in the arena (pinned until :meth:`release`), or None for a miss.
        Check a hit with :meth:`valid` after reading it (or use :meth:`get_into`)."""
        layout = region.layout
        with self._lock:
            (found,) = self._call("get", layout.region, [bytes(k) for k in keys])
        out: list[Hit | None] = []
        view, data, stride, slots, page = self.arena.view, layout.data, layout.stride, layout.slots, layout.page_bytes
        for f in found:
            if f is None:
                out.append(None)
                continue
            s, version, length, crc = f
            if not (0 <= s < slots and 0 <= length <= page):
                layout.check(s, length)  # a reference outside the region is refused, never read
            start = data + s * stride
            out.append(Hit(s, version, length, crc, view[start:start + length]))
        return out

    def valid(self, region: RegionHandle, key: bytes, hit: Hit, *, check_crc: bool = True) -> bool:
        """True when ``hit``'s slot still holds what the daemon answered for ``key``: the header's
        version, length, region and key digest unchanged, and (``check_crc``) the bytes' CRC-32C."""
        version, length, crc, region_id, digest = self.arena.read_header(region.layout, hit.slot)
        if (version, length, crc, region_id) != (hit.version, hit.length, hit.crc, region.layout.region):
            return False
        if digest != key_digest(bytes(key)):
            return False
        return not check_crc or _crc(hit.data) == hit.crc

    def release(self, region: RegionHandle, hits: Sequence[Hit | None]) -> None:
        """Unpins the slots of ``hits`` (None entries are skipped); no reply is awaited."""
        slots = [h.slot for h in hits if h is not None]
        if slots:
            with self._lock:
                self._tell("release", region.layout.region, slots)

    def get_into(self, region: RegionHandle, keys: Sequence[bytes], outs: Sequence[Any]) -> list[bool]:
        """Copies each key's page into ``outs[i]`` (writable, at least the page's length) when it is
        in L2 and valid; per key, True when copied. Slots are released before returning."""
        hits = self.get(region, keys)
        try:
            got = []
            for key, hit, out in zip(keys, hits, outs):
                if hit is None:
                    got.append(False)
                    continue
                dst = np.frombuffer(out, dtype=np.uint8)
                dst[:hit.length] = np.frombuffer(hit.data, dtype=np.uint8)
                got.append(self.valid(region, key, hit, check_crc=False) and _crc(dst[:hit.length]) == hit.crc)
            return got
        finally:
            self.release(region, hits)

    def stats(self) -> dict:
        """The daemon's counters."""
        with self._lock:
            (stats,) = self._call("stats")
        return stats
