"""The daemon's wire protocol (version 2): length-prefixed binary frames on a Unix stream socket.

The daemon and its client are native (``kvcodec_sdk._native.daemon``); this module names what
they speak. A frame is a u32 little-endian payload length, then the payload. A request's payload
starts with its op (u8); every request but ``release`` gets one reply, whose payload starts with a
status (u8: 0 done, then the values; 1 refused, then a message). Integers are little-endian; a list
is a u32 count then its items; a *str* is a u32 byte count then the bytes. Page bytes never cross
the socket: they live in the shared arena, whose descriptor the daemon passes once, with the
``hello`` reply (``SCM_RIGHTS``).

==  ========  ==========================================  ===============================================
op  name      arguments                                   reply values
==  ========  ==========================================  ===============================================
1   hello     u32 version, u32 pid                        u32 version, u64 arena bytes, u32 client id,
                                                          u8 huge pages (and the arena's descriptor)
2   region    u64 page bytes, u32 slots wanted,           u32 region, u64 table offset, u64 data offset,
              str identity (page bytes and slots 0:       u64 slot stride, u32 slots, u64 page bytes
              find the identity's region, never create)
3   lease     u32 region, u32 count                       u32 n, n × u32 slot, n × u64 version (odd)
4   commit    u32 region, u8 ephemeral, u32 n,            u32 n, n × u8 status (0 stored, 1 not this
              n × (u32 slot, u32 length, u32 crc),        client's lease, 2 a bad length)
              n × str key
5   abort     u32 region, u32 n, n × u32 slot             (none)
6   get       u32 region, u32 n, n × str key              u32 n, n × (u32 slot or ``MISS``, u32 length,
                                                          u32 crc, u32 zero, u64 version); hits are pinned
                                                          (with a long tier, sent once the keys' page
                                                          files were read into L2)
7   release   u32 region, u32 n, n × u32 slot             no reply
8   stats     (none)                                      str: a JSON object of counters
9   erase     u32 region, u32 n, n × str key              u32 n, n × u8 (1: the key was stored; its slot
                                                          is freed, or at its last unpin)
10  prefetch  u32 region, u32 n, n × str key              u32 queued: keys whose long-tier pages are read
                                                          into L2 in the background (0 without a long
                                                          tier)
==  ========  ==========================================  ===============================================

A slot header in the arena (64 bytes, little-endian): u64 version (even: stable, odd: being
written, bumped on every reuse), u64 length, u32 CRC-32C of the bytes, u32 region id, 16 bytes of
the key's digest (:func:`key_digest`), 24 reserved. The daemon alone writes headers.
"""

from __future__ import annotations

from .._native import daemon as _daemon

__all__ = ["MAX_FRAME", "MISS", "PROTOCOL_VERSION", "DaemonError", "DaemonUnavailable", "Op", "key_digest"]

#: The protocol version this SDK speaks; a daemon refuses another at the handshake.
PROTOCOL_VERSION: int = _daemon.PROTOCOL_VERSION
#: The largest frame either side accepts (a batch of many thousand keys fits).
MAX_FRAME: int = _daemon.MAX_FRAME
#: The slot a ``get`` answers for a key that is not in L2.
MISS: int = _daemon.MISS

# The exceptions are raised by the compiled client; they are documented and named here.
DaemonError = _daemon.DaemonError
DaemonError.__doc__ = "The daemon refused a request; the message says why."
DaemonUnavailable = _daemon.DaemonUnavailable
DaemonUnavailable.__doc__ = ("The daemon is not reachable: not started, restarted, not answering within the client's "
                             "timeout, or the socket closed.")
for _cls in (DaemonError, DaemonUnavailable):
    _cls.__module__ = __name__


def key_digest(key: bytes) -> bytes:
    """The 16-byte digest of a content key kept in its slot's header."""
    return _daemon.key_digest(key)


class Op:
    """Request op codes."""

    HELLO = 1
    REGION = 2
    LEASE = 3
    COMMIT = 4
    ABORT = 5
    GET = 6
    RELEASE = 7
    STATS = 8
    ERASE = 9
    PREFETCH = 10
