"""The daemon's wire protocol (version 1): length-prefixed msgpack frames on a Unix stream socket.

A frame is a 4-byte little-endian payload length, then the payload: a msgpack array. A request is
``[op, *args]``; every request but ``release`` gets one reply, ``[status, *values]`` (status 0:
done; otherwise ``[status, message]``). Page bytes never cross the socket: they live in the shared
arena, whose descriptor the daemon passes once, at the handshake, with ``SCM_RIGHTS``.

========  ==============================================  =============================================
op        arguments                                       reply values
========  ==============================================  =============================================
hello     protocol version, client pid                    protocol version, arena bytes, client id
                                                          (and the arena's descriptor, SCM_RIGHTS)
region    identity (str), page bytes, slots wanted        region id, table offset, data offset, slot
                                                          stride, slots
lease     region id, count                                slot ids, versions (odd: being written)
commit    region id, slots, keys, lengths, checksums,     one status per slot (0 stored, else why)
          ephemeral flag
abort     region id, slots                                (none)
get       region id, keys                                 per key: ``[slot, version, length, crc]`` or
                                                          None (a miss); each hit is pinned
release   region id, slots (no reply)                     —
stats     —                                               a map of counters
========  ==============================================  =============================================
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

__all__ = ["PROTOCOL_VERSION", "DaemonError", "DaemonUnavailable", "FrameReader", "SocketReader", "pack", "recv_frame",
           "send_frame"]

#: The protocol version this SDK speaks; a daemon refuses another at the handshake.
PROTOCOL_VERSION = 1
#: The largest frame either side accepts (a batch of a few thousand keys fits many times over).
MAX_FRAME = 16 << 20
_LEN = struct.Struct("<I")

#: Reply statuses.
OK = 0
ERROR = 1


class DaemonError(RuntimeError):
    """The daemon refused a request; the message says why."""


class DaemonUnavailable(DaemonError):
    """The daemon is not reachable (not started, restarted, or the socket closed)."""


def pack(message: Any) -> bytes:
    """One frame: length prefix and msgpack payload."""
    payload = msgpack.packb(message, use_bin_type=True)
    return _LEN.pack(len(payload)) + payload


def send_frame(sock: socket.socket, message: Any, fds: list[int] | None = None) -> int:
    """Sends one frame (with ``fds`` passed by SCM_RIGHTS); returns the bytes sent."""
    data = pack(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)
    return len(data)


def recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    """``n`` bytes from a blocking socket; descriptors that come with them are appended to ``fds``."""
    chunks, got = [], 0
    while got < n:
        if fds is not None:
            data, received, _flags, _addr = socket.recv_fds(sock, n - got, 4)
            fds.extend(received)
        else:
            data = sock.recv(n - got)
        if not data:
            raise DaemonUnavailable("the daemon closed the connection")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, fds: list[int] | None = None) -> tuple[Any, int]:
    """One frame from a blocking socket: (the message, the bytes received)."""
    (n,) = _LEN.unpack(recv_exact(sock, 4, fds))
    if n > MAX_FRAME:
        raise DaemonError(f"a frame of {n} bytes exceeds the protocol's {MAX_FRAME}")
    return msgpack.unpackb(recv_exact(sock, n, fds), raw=False), 4 + n


class SocketReader:
    """Frames from a blocking socket, reading as much as is there in one call (a reply usually
    arrives whole: one system call instead of two)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def frame(self) -> tuple[Any, int]:
        """The next message and its bytes on the wire."""
        while True:
            if len(self._buf) >= 4:
                (n,) = _LEN.unpack_from(self._buf)
                if n > MAX_FRAME:
                    raise DaemonError(f"a frame of {n} bytes exceeds the protocol's {MAX_FRAME}")
                if len(self._buf) >= 4 + n:
                    message = msgpack.unpackb(bytes(self._buf[4:4 + n]), raw=False)
                    del self._buf[:4 + n]
                    return message, 4 + n
            data = self.sock.recv(1 << 16)
            if not data:
                raise DaemonUnavailable("the daemon closed the connection")
            self._buf += data


class FrameReader:
    """Frames out of a non-blocking byte stream (the daemon's side)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Appends received bytes; returns the complete messages (raises DaemonError on a frame
        over :data:`MAX_FRAME` or a payload that is not msgpack)."""
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise DaemonError(f"a frame of {n} bytes exceeds the protocol's {MAX_FRAME}")
            if len(self._buf) < 4 + n:
                break
            try:
                out.append(msgpack.unpackb(bytes(self._buf[4:4 + n]), raw=False))
            except (ValueError, msgpack.ExtraData) as exc:
                raise DaemonError(f"a frame is not msgpack: {exc}") from None
            del self._buf[:4 + n]
        return out
