"""The per-host daemon: one process owning the L2 arena, serving every client on a Unix socket.

One thread runs a ``selectors`` loop over the listening socket and the clients' connections;
requests are handled in arrival order, each in microseconds (index lookups, no page bytes: those
move through the shared arena). A client that closes or dies (its connection ends) has its pins
released and its leases freed at once, so it leaks no slot.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import protocol
from .arena import Arena
from .l2 import L2Index

__all__ = ["Daemon", "DaemonConfig"]

#: Reply bytes a client may leave unread before the daemon drops it.
_MAX_PENDING_OUT = 64 << 20


@dataclass(frozen=True)
class DaemonConfig:
    """What a daemon serves.

    :param socket_path: The Unix socket clients connect to (a stale one is replaced).
    :param l2_bytes: Bytes of the shared RAM arena (L2), cut into per-codec regions on demand.
    :param hugepages: Back the arena with huge pages where the system has them reserved.
    """

    socket_path: str
    l2_bytes: int = 1 << 30
    hugepages: bool = True

    def validate(self) -> None:
        if not isinstance(self.socket_path, str) or not self.socket_path:
            raise ValueError(f"socket_path is {self.socket_path!r}; give the path of the Unix socket to serve")
        if len(os.fsencode(self.socket_path)) > 107:
            raise ValueError(f"socket_path is {len(os.fsencode(self.socket_path))} bytes long; a Unix socket path "
                             "has at most 107")
        if not isinstance(self.l2_bytes, int) or self.l2_bytes < (1 << 20):
            raise ValueError(f"l2_bytes is {self.l2_bytes!r}; the arena needs at least 1 MiB")


@dataclass
class _Client:
    sock: socket.socket
    id: int
    pid: int = 0
    reader: protocol.FrameReader = field(default_factory=protocol.FrameReader)
    out: bytearray = field(default_factory=bytearray)
    hello: bool = False
    writing: bool = False  # registered for EVENT_WRITE (replies wait for the socket)
    bytes_in: int = 0
    bytes_out: int = 0


class Daemon:
    """Serves :class:`DaemonConfig` on its own thread (:meth:`start`) or the calling one
    (:meth:`serve_forever`); :meth:`stop` ends it and removes the socket."""

    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        self.arena = Arena.create(config.l2_bytes, hugepages=config.hugepages)
        self.index = L2Index(self.arena)
        self.started = time.time()
        self._clients: dict[int, _Client] = {}
        self._next_client = 1
        self._sel = selectors.DefaultSelector()
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._closed_clients = 0
        self._socket_bytes = [0, 0]  # of clients gone: in, out
        if os.path.exists(config.socket_path):
            os.unlink(config.socket_path)  # a stale socket of a daemon that died
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(config.socket_path)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._stop_r, selectors.EVENT_READ, "stop")

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> Daemon:
        """Serves on a background thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="kvcodec-daemon", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serves until :meth:`stop` (from another thread or a signal handler)."""
        try:
            while True:
                for key, events in self._sel.select():
                    if key.data == "stop":
                        return
                    if key.data is None:
                        self._accept()
                    else:
                        self._service(key.data, events)
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Ends serving (idempotent) and waits for the serving thread."""
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _shutdown(self) -> None:
        for c in list(self._clients.values()):
            self._drop(c)
        for f in (self._listener,):
            try:
                self._sel.unregister(f)
            except (KeyError, ValueError):
                pass
            f.close()
        try:
            os.unlink(self.config.socket_path)
        except OSError:
            pass
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._sel.close()
        self.arena.close()

    # -- connections -----------------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        c = _Client(sock, self._next_client)
        self._next_client += 1
        self._clients[c.id] = c
        self._sel.register(sock, selectors.EVENT_READ, c)

    def _service(self, c: _Client, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(c)
        if not events & selectors.EVENT_READ:
            return
        try:
            data = c.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        c.bytes_in += len(data)
        try:
            messages = c.reader.feed(data)
        except protocol.DaemonError:
            self._drop(c)  # not our protocol: the connection goes
            return
        for msg in messages:
            self._handle(c, msg)
            if c.id not in self._clients:
                return
        self._flush(c)

    def _send(self, c: _Client, message: Any, fds: list[int] | None = None) -> None:
        if fds:  # the handshake: sent at once, blocking, with the descriptor
            c.sock.setblocking(True)
            try:
                c.bytes_out += protocol.send_frame(c.sock, message, fds)
            finally:
                c.sock.setblocking(False)
            return
        data = protocol.pack(message)
        c.out += data
        c.bytes_out += len(data)
        if len(c.out) > _MAX_PENDING_OUT:
            self._drop(c)  # a client that does not read its replies is cut off, not buffered for

    def _flush(self, c: _Client) -> None:
        while c.out:
            try:
                n = c.sock.send(c.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(c)
                return
            del c.out[:n]
        if bool(c.out) != c.writing:  # only a change costs a system call
            c.writing = bool(c.out)
            try:
                self._sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.writing else 0), c)
            except (KeyError, ValueError):
                pass

    def _drop(self, c: _Client) -> None:
        if self._clients.pop(c.id, None) is None:
            return
        self.index.drop_client(c.id)
        self._closed_clients += 1
        self._socket_bytes[0] += c.bytes_in
        self._socket_bytes[1] += c.bytes_out
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    # -- requests --------------------------------------------------------------------------------

    def _handle(self, c: _Client, msg: Any) -> None:
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            self._send(c, [protocol.ERROR, "a request is [op, *args]"])
            return
        op, args = msg[0], msg[1:]
        if not c.hello and op != "hello":
            self._send(c, [protocol.ERROR, f"'{op}' before 'hello': the handshake comes first"])
            return
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            self._send(c, [protocol.ERROR, f"unknown op {op!r}"])
            return
        try:
            reply = handler(c, *args)
        except Exception as exc:  # a malformed request must not end the daemon for everyone
            self._send(c, [protocol.ERROR, f"{op}: {type(exc).__name__}: {exc}"])
            return
        if reply is not None:
            self._send(c, [protocol.OK, *reply])

    def _op_hello(self, c: _Client, version: int, pid: int) -> None:
        if version != protocol.PROTOCOL_VERSION:
            self._send(c, [protocol.ERROR, f"protocol version {version} is not served; this daemon speaks "
                                           f"{protocol.PROTOCOL_VERSION}"])
            return None
        c.hello, c.pid = True, int(pid)
        self._send(c, [protocol.OK, protocol.PROTOCOL_VERSION, self.arena.size, c.id], fds=[self.arena.fd])
        return None

    def _op_region(self, c: _Client, identity: str, page_bytes: int, slots: int) -> list:
        r = self.index.region(str(identity), int(page_bytes), int(slots)).layout
        return [r.region, r.table, r.data, r.stride, r.slots]

    def _op_lease(self, c: _Client, region: int, count: int) -> list:
        slots, versions = self.index.lease(c.id, int(region), int(count))
        return [slots, versions]

    def _op_commit(self, c: _Client, region: int, slots: list, keys: list, lengths: list, crcs: list,
                   ephemeral: bool = False) -> list:
        if not len(slots) == len(keys) == len(lengths) == len(crcs):
            raise ValueError("slots, keys, lengths and crcs differ in length")
        return [self.index.commit(c.id, int(region), slots, [bytes(k) for k in keys], lengths, crcs, bool(ephemeral))]

    def _op_abort(self, c: _Client, region: int, slots: list) -> list:
        self.index.abort(c.id, int(region), slots)
        return []

    def _op_get(self, c: _Client, region: int, keys: list) -> list:
        return [self.index.get(c.id, int(region), [bytes(k) for k in keys])]

    def _op_release(self, c: _Client, region: int, slots: list) -> None:
        try:
            self.index.release(c.id, int(region), slots)
        except ValueError:
            pass  # no reply to carry an error: a bad release changes nothing
        return None

    def _op_stats(self, c: _Client) -> list:
        return [self.stats()]

    def stats(self) -> dict:
        """The daemon's counters (what ``kvcodec statctl`` prints)."""
        out = self.index.stats()
        live = list(self._clients.values())
        out.update(clients=len(live), clients_closed=self._closed_clients, uptime_s=round(time.time() - self.started, 3),
                   socket_bytes_in=self._socket_bytes[0] + sum(c.bytes_in for c in live),
                   socket_bytes_out=self._socket_bytes[1] + sum(c.bytes_out for c in live),
                   protocol=protocol.PROTOCOL_VERSION, pid=os.getpid())
        return out
