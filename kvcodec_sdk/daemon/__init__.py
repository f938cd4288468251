"""The per-host cache daemon (L2): one shared RAM arena for every engine process on a machine.

A daemon (:class:`Daemon`, ``kvcodec daemon``) owns a memfd-backed arena, cut into one region per
codec identity and page size, and serves a versioned binary protocol on a Unix socket
(:mod:`kvcodec_sdk.daemon.protocol`); server and client are native (C++, ``_native.daemon``).
Clients (:class:`DaemonClient`) map the arena from the
descriptor passed at the handshake, so a page set by one process is read in place by another:
the socket carries only keys and slot references. Leases and versions make a slot reused while
a reader held a reference detectable; checksums detect bytes written where they should not be; a
client that dies has its pins and leases released by the daemon. ``kvcodec statctl`` prints the
counters.

This is the daemon's first part: L2 shared between processes. The manager's shared cold level,
write-back to a long tier and prefetch build on it (docs/daemon.md says what is there and what
is not).
"""

from .client import DaemonClient, Hit, Lookup, RegionHandle, RegionLayout
from .protocol import PROTOCOL_VERSION, DaemonError, DaemonUnavailable
from .server import Daemon, DaemonConfig

__all__ = ["PROTOCOL_VERSION", "Daemon", "DaemonClient", "DaemonConfig", "DaemonError", "DaemonUnavailable", "Hit",
           "Lookup", "RegionHandle", "RegionLayout"]
