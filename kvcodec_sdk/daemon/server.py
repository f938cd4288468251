"""The per-host daemon: one process owning the L2 arena, serving every client on a Unix socket.

The server is native (``kvcodec_sdk._native.daemon.Server``): one thread runs an epoll loop over the
listening socket and the clients' connections and answers each request in arrival order, in
microseconds (index work only: page bytes move through the shared arena). A client whose
connection ends (closed or killed) has its pins released and its leases freed at once, so it
leaks no slot.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

from .._native import daemon as _daemon

__all__ = ["Daemon", "DaemonConfig", "start_warnings"]


@dataclass(frozen=True)
class DaemonConfig:
    """What a daemon serves.

    :param socket_path: The Unix socket clients connect to (a stale one is replaced).
    :param l2_bytes: Bytes of the shared RAM arena (L2), cut into per-codec regions on demand.
    :param hugepages: Back the arena with huge pages where the system has them reserved.
    :param busy_poll_us: Microseconds the serving thread polls for the next request after
        answering before it sleeps (a request arriving meanwhile is answered without a wake-up).
        0 (the default) sleeps at once: on a loaded machine a polling daemon takes CPU time from
        the engines and its p99 round trip grows (docs/daemon.md has the measurements); the
        clients' own polling (:class:`DaemonClient`'s ``busy_poll_us``) is what shortens a round trip.
    :param long_tier: A directory for the long tier below L2, or None for none. Every page committed
        without ``ephemeral`` is written back there in the background (its L2 slot stays pinned until
        written), and a lookup that misses L2 reads the page back into L2 and answers it as a hit.
        The directory outlives the daemon: a restarted one finds every page written back before.
    :param long_tier_queue_bytes: Bytes of pages at most waiting to be written back; a page that
        finds the queue full is not written back (``write_backs_dropped``) and stays in L2.
    """

    socket_path: str
    l2_bytes: int = 1 << 30
    hugepages: bool = True
    busy_poll_us: float = 0.0
    long_tier: str | None = None
    long_tier_queue_bytes: int = 256 << 20

    def validate(self) -> None:
        """Raises ValueError naming the field that is wrong."""
        if not isinstance(self.socket_path, str) or not self.socket_path:
            raise ValueError(f"socket_path is {self.socket_path!r}; give the path of the Unix socket to serve")
        if len(os.fsencode(self.socket_path)) > 107:
            raise ValueError(f"socket_path is {len(os.fsencode(self.socket_path))} bytes long; a Unix socket path "
                             "has at most 107")
        if not isinstance(self.l2_bytes, int) or self.l2_bytes < (1 << 20):
            raise ValueError(f"l2_bytes is {self.l2_bytes!r}; the arena needs at least 1 MiB")
        if not isinstance(self.busy_poll_us, (int, float)) or not 0 <= self.busy_poll_us <= 1e6:
            raise ValueError(f"busy_poll_us is {self.busy_poll_us!r}; give 0 (sleep at once) to 1000000 microseconds")
        if self.long_tier is not None and (not isinstance(self.long_tier, str) or not self.long_tier):
            raise ValueError(f"long_tier is {self.long_tier!r}; give a directory, or None for no long tier")
        if not isinstance(self.long_tier_queue_bytes, int) or self.long_tier_queue_bytes < (1 << 20):
            raise ValueError(f"long_tier_queue_bytes is {self.long_tier_queue_bytes!r}; give at least 1 MiB")


class Daemon:
    """Serves :class:`DaemonConfig` on its own thread (:meth:`start`) or the calling one
    (:meth:`serve_forever`); :meth:`stop` ends it and removes the socket. The arena and the socket
    exist from construction on."""

    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        self._server = _daemon.Server(config.socket_path, config.l2_bytes, config.hugepages,
                                      float(config.busy_poll_us), config.long_tier or "",
                                      config.long_tier_queue_bytes)
        self.arena = self._server.arena
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> Daemon:
        """Serves on a background thread; returns self."""
        self._thread = threading.Thread(target=self._serve, name="kvcodec-daemon", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self._server.serve()
        except BaseException as exc:  # kept for the thread that waits on it
            self._error = exc

    def serve_forever(self) -> None:
        """Serves until :meth:`stop` (from another thread or a signal handler: the calling thread
        waits in short steps, so Python signal handlers run)."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.2)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Ends serving (idempotent) and waits for the serving thread."""
        self._server.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def stats(self) -> dict:
        """The daemon's counters (what ``kvcodec statctl`` prints)."""
        return json.loads(self._server.stats_json())


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[name] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return out


#: The smallest NFS write size the long tier runs well with (page files are written whole).
NFS_MIN_WSIZE = 1 << 20


def _mount_of(path: str, mounts: str | None = None) -> tuple[str, str, str] | None:
    """(mount point, file system type, options) of the mount holding ``path``, from /proc/mounts."""
    try:
        text = open("/proc/mounts").read() if mounts is None else mounts
    except OSError:
        return None
    real = os.path.realpath(path)
    best = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, parts[2], parts[3])
    return best


def start_warnings(config: DaemonConfig, arena_hugepages: bool, meminfo: dict[str, int] | None = None,
                   long_tier_free: int | None = None, mounts: str | None = None) -> list[str]:
    """What an operator should hear at start about sizing: an arena larger than the memory the
    host has (it is allocated as pages are written, so the shortfall shows later, as swapping or
    the daemon killed), huge pages asked for but not reserved, a long tier with less free space
    than L2 (each tier should hold at least the one above), and a long tier on NFS mounted with a
    write size under 1 MiB, with the remount command."""
    info = _meminfo() if meminfo is None else meminfo
    out = []
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    gib = 1 << 30
    if total and config.l2_bytes > total:
        out.append(f"the L2 arena ({config.l2_bytes / gib:.1f} GiB) is larger than this host's memory "
                   f"({total / gib:.1f} GiB): lower --l2-bytes")
    elif available and config.l2_bytes > available:
        out.append(f"the L2 arena ({config.l2_bytes / gib:.1f} GiB) is larger than the memory available now "
                   f"({available / gib:.1f} GiB): once it fills, the host swaps or ends a process; lower --l2-bytes "
                   "or free memory")
    if config.hugepages and not arena_hugepages:
        pages = -(-config.l2_bytes // (2 << 20))
        out.append(f"huge pages were asked for but none are reserved, so the arena is on ordinary pages; reserve "
                   f"them with: sysctl vm.nr_hugepages={pages} (or start with --no-hugepages)")
    if config.long_tier:
        if long_tier_free is None:
            try:
                st = os.statvfs(config.long_tier)
                long_tier_free = st.f_bavail * st.f_frsize
            except OSError:
                long_tier_free = None
        if long_tier_free is not None and long_tier_free < config.l2_bytes:
            out.append(f"the long tier {config.long_tier} has {long_tier_free / gib:.1f} GiB free, less than the L2 "
                       f"arena ({config.l2_bytes / gib:.1f} GiB): each tier should hold at least the one above; "
                       "free space there or lower --l2-bytes")
        mount = _mount_of(config.long_tier, mounts)
        if mount is not None and mount[1].startswith("nfs"):
            opts = dict(o.split("=", 1) if "=" in o else (o, "") for o in mount[2].split(","))
            wsize = int(opts["wsize"]) if opts.get("wsize", "").isdigit() else None
            if wsize is not None and wsize < NFS_MIN_WSIZE:
                out.append(f"the long tier is on NFS ({mount[0]}) with wsize={wsize}: page files are written in "
                           f"pieces of {wsize} bytes; remount with a 1 MiB write size: "
                           f"mount -o remount,wsize={NFS_MIN_WSIZE},rsize={NFS_MIN_WSIZE} {mount[0]}")
    return out
