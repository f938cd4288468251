"""A client of the per-host daemon: pages set into and read from the shared L2 arena in place.

The client (native: ``kvcodec_sdk._native.daemon.Client``) maps the arena whose descriptor the
daemon passed at the handshake. A ``set`` leases slots, writes the pages straight into them and
commits them under their keys; a ``get`` asks where each key's slot is and reads it in place: no
page byte crosses the socket. A read is accepted only when the slot's header still shows the
version the daemon answered (a slot reused meanwhile is detected), the region and the key's
digest, and the bytes' CRC-32C matches (bytes another client wrote where it should not are
detected); anything else is a miss, never wrong data.

Calls are serialised per client (one request in flight per connection) and run without the GIL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._native import daemon as _daemon
from .protocol import MISS, DaemonError

#: How long a call polls for the daemon's reply before its thread sleeps, by default.
DEFAULT_BUSY_POLL_US = 30.0

__all__ = ["DaemonClient", "Hit", "Lookup", "RegionHandle", "RegionLayout"]

#: Where a region lies in the arena: ``region`` (id), ``table`` and ``data`` (offsets of its
#: header table and of slot 0's data), ``stride`` (bytes between slots), ``slots``,
#: ``page_bytes``; ``data_offset(slot)``, ``header_offset(slot)``.
RegionLayout = _daemon.RegionLayout


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


class Lookup(NamedTuple):
    """A batch lookup's answer as arrays, one entry per key: ``slots`` (:data:`MISS` for a key not
    in L2; every other slot is pinned until released), ``versions``, ``lengths`` and ``crcs``."""

    slots: np.ndarray
    versions: np.ndarray
    lengths: np.ndarray
    crcs: np.ndarray

    @property
    def found(self) -> np.ndarray:
        """True where the key was in L2."""
        return self.slots != MISS


class DaemonClient:
    """A connection to the daemon at ``socket_path`` (connected at once).

    :param timeout_s: Bound of each request's round trip; a daemon that does not answer in time
        is treated as gone (:class:`~kvcodec_sdk.daemon.DaemonUnavailable`, the connection closed).
    :param busy_poll_us: Microseconds a call polls for the daemon's reply before its thread
        sleeps on the socket: a reply usually comes within that, and the thread's wake-up would
        cost more than the answer (a round trip of 64 keys: about 18 µs polling, 28 µs sleeping,
        on a 2-core machine). 0 sleeps at once.
    :raises DaemonUnavailable: no daemon answers at ``socket_path``.
    """

    def __init__(self, socket_path: str, timeout_s: float = 10.0, busy_poll_us: float = DEFAULT_BUSY_POLL_US) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.busy_poll_us = busy_poll_us
        self._native = _daemon.Client(socket_path, float(timeout_s), float(busy_poll_us))

    # -- connection ------------------------------------------------------------------------------

    @property
    def arena(self) -> memoryview:
        """The whole arena as mapped in this process (a writable byte view; it keeps the mapping
        alive after :meth:`close`)."""
        return memoryview(self._native.arena)

    @property
    def client_id(self) -> int:
        return self._native.client_id

    @property
    def socket_bytes(self) -> int:
        """Bytes sent and received on the socket so far, for the record (pages never cross it)."""
        return self._native.socket_bytes

    def reconnect(self) -> None:
        """Connects again (after the daemon restarted: L2 starts empty, regions are asked for anew)."""
        self._native.reconnect()

    def close(self) -> None:
        """Disconnects (the daemon releases whatever this client still pinned). Idempotent."""
        self._native.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ----------------------------------------------------------------------------------

    def region(self, identity: str, page_bytes: int, slots: int, *, packed: bool = False) -> RegionHandle:
        """The arena region of (identity, page bytes): created by the first client that asks, with
        up to ``slots`` slots (fewer when the arena has less room); every client of the same
        identity and page size shares it. A ``packed`` new region puts slot s at
        ``data + s * page_bytes`` (the layout a codec addresses) instead of 4 KiB-aligned slots."""
        if int(page_bytes) <= 0 or int(slots) <= 0:
            raise ValueError(f"page_bytes {page_bytes} and slots {slots} must be positive")
        return RegionHandle(str(identity), self._native.region(str(identity), int(page_bytes), int(slots), bool(packed)))

    def find_region(self, identity: str) -> RegionHandle | None:
        """The region of ``identity`` some client created (of the lowest page size, if several), or
        None; never creates one."""
        try:
            return RegionHandle(str(identity), self._native.region(str(identity), 0, 0))
        except DaemonError as e:
            if "does not exist" in str(e):
                return None
            raise

    def slot_view(self, region: RegionHandle, slot: int, length: int | None = None) -> memoryview:
        """A writable view of a slot's data in the arena (``length`` bytes, or the whole page)."""
        layout = region.layout
        if not 0 <= slot < layout.slots:
            raise ValueError(f"slot {slot} is outside region {layout.region} (0..{layout.slots - 1})")
        n = layout.page_bytes if length is None else length
        if not 0 <= n <= layout.page_bytes:
            raise ValueError(f"length {n} exceeds region {layout.region}'s page bytes ({layout.page_bytes})")
        start = layout.data_offset(slot)
        return self.arena[start:start + n]

    def set(self, region: RegionHandle, keys: Sequence[bytes], pages: Sequence[Any], *,
            ephemeral: bool = False) -> list[bool]:
        """Stores each page (a contiguous bytes-like object of at most the region's page bytes)
        under its key, copied straight into leased arena slots; per key, True when stored (False:
        L2 had no slot that nobody pinned)."""
        return self._native.set(region.layout, keys, list(pages), bool(ephemeral))

    def lease(self, region: RegionHandle, count: int) -> np.ndarray:
        """Up to ``count`` slots to fill (fewer when L2 has no more that nobody pinned); each
        must then be committed (:meth:`commit`) or given back (:meth:`abort`). A client that dies
        holding leases has them freed by the daemon."""
        return self._native.lease(region.layout, int(count))

    def commit(self, region: RegionHandle, slots: Sequence[int], keys: Sequence[bytes], lengths: Sequence[int], *,
               ephemeral: bool = False, pin: bool = False) -> list[int]:
        """Stores leased slots holding ``lengths[i]`` bytes under ``keys[i]`` (the CRC-32C of each
        is computed from the arena here). Per slot: 0 stored, 1 not this client's lease, 2 a
        length over the region's page bytes. With ``pin``, each stored slot stays pinned for this
        client, as a :meth:`get` hit would (:meth:`release` it the same way), so the writer keeps
        it from eviction while it goes on reading it."""
        return self._native.commit(region.layout, np.asarray(slots, np.uint32), keys, [int(n) for n in lengths],
                                   bool(ephemeral), bool(pin))

    def abort(self, region: RegionHandle, slots: Sequence[int]) -> None:
        """Gives back leased slots that will not be committed."""
        self._native.abort(region.layout, np.asarray(slots, np.uint32))

    def set_with(self, region: RegionHandle, keys: Sequence[bytes], lengths: Sequence[int],
                 write: Callable[[int, memoryview], None], *, ephemeral: bool = False) -> list[bool]:
        """Like :meth:`set`, but ``write(i, view)`` fills page i's leased slot itself (an encoder
        writing straight into the arena: no staging copy). If ``write`` raises, every slot leased
        for the call is given back and the exception propagates."""
        lengths = [int(n) for n in lengths]
        if len(lengths) != len(keys):
            raise ValueError(f"{len(keys)} keys for {len(lengths)} lengths")
        for i, n in enumerate(lengths):
            if not 0 <= n <= region.layout.page_bytes:
                raise ValueError(f"lengths[{i}] is {n}; the region's pages have at most {region.layout.page_bytes}")
        slots = self.lease(region, len(keys))
        try:
            for i, s in enumerate(slots):
                write(i, self.slot_view(region, int(s), lengths[i]))
        except BaseException:
            self.abort(region, slots)
            raise
        n = len(slots)
        statuses = self.commit(region, slots, keys[:n], lengths[:n], ephemeral=ephemeral)
        return [st == 0 for st in statuses] + [False] * (len(keys) - n)

    # -- reads -----------------------------------------------------------------------------------

    def lookup(self, region: RegionHandle, keys: Sequence[bytes]) -> Lookup:
        """Where each key's page is, as arrays (one round trip; the hits are pinned until
        :meth:`release`). The cheapest form of :meth:`get` for a batch."""
        return Lookup(*self._native.get(region.layout, keys))

    def get(self, region: RegionHandle, keys: Sequence[bytes]) -> list[Hit | None]:
        """Where each key's page is in the arena (pinned until :meth:`release`), or None for a miss.
        Check a hit with :meth:`valid` after reading it (or use :meth:`get_into`)."""
        found = self.lookup(region, keys)
        arena, layout = self.arena, region.layout
        out: list[Hit | None] = []
        for s, v, n, c in zip(found.slots.tolist(), found.versions.tolist(), found.lengths.tolist(),
                              found.crcs.tolist()):
            if s == MISS:
                out.append(None)
                continue
            start = layout.data_offset(s)
            out.append(Hit(s, v, n, c, arena[start:start + n]))
        return out

    def valid(self, region: RegionHandle, key: bytes, hit: Hit, *, check_crc: bool = True) -> bool:
        """True when ``hit``'s slot still holds what the daemon answered for ``key``: the header's
        version, length, region and key digest unchanged, and (``check_crc``) the bytes' CRC-32C."""
        return self._native.valid(region.layout, bytes(key), hit.slot, hit.version, hit.length, hit.crc,
                                  bool(check_crc))

    def release(self, region: RegionHandle, hits: Sequence[Hit | None] | Lookup) -> None:
        """Unpins the slots of ``hits`` (a :class:`Lookup`, or :meth:`get`'s list: None entries are
        skipped); no reply is awaited."""
        if isinstance(hits, Lookup):
            slots = hits.slots  # misses are skipped
        else:
            slots = np.array([h.slot for h in hits if h is not None], np.uint32)
        self._native.release(region.layout, slots)

    def get_into(self, region: RegionHandle, keys: Sequence[bytes], outs: Sequence[Any]) -> list[bool]:
        """Copies each key's page into ``outs[i]`` (a writable contiguous buffer of at least the
        page's length) when it is in L2 and valid, checked on the copied bytes; per key, True when
        copied. Slots are released before returning."""
        return self._native.get_into(region.layout, keys, list(outs))

    def erase(self, region: RegionHandle, keys: Sequence[bytes]) -> list[bool]:
        """Removes each key from L2 (a slot a reader still pins is freed at its last release); per
        key, True when it was stored."""
        return self._native.erase(region.layout, keys)

    def prefetch(self, region: RegionHandle, keys: Sequence[bytes]) -> int:
        """Asks the daemon to read the keys' pages from its long tier into L2 in the background, so a
        later lookup finds them there; keys already in L2, or with no page in the long tier, are
        skipped. Returns how many were queued: 0 without a long tier; at most 65536 keys wait at a
        time (more are dropped and counted as ``prefetch_dropped``). Prefetched pages join L2's
        least recently used order like any other stored page."""
        return self._native.prefetch(region.layout, keys)

    def stats(self) -> dict:
        """The daemon's counters."""
        return json.loads(self._native.stats_json())

    def raw_call(self, payload: bytes) -> bytes:
        """Sends one request payload (op byte and arguments, see :mod:`kvcodec_sdk.daemon.protocol`)
        as it is and returns the reply's payload: for protocol tests and tools."""
        return self._native.raw_call(bytes(payload))
