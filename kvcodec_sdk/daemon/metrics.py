"""Prometheus metrics of the per-host cache daemon, read when scraped.

:class:`DaemonCollector` is a ``prometheus_client`` collector (the ``metrics`` extra) of one
daemon's counters, the ones ``kvcodec statctl`` prints: it reads them on each scrape, from the
daemon in this process (``kvcodec daemon --metrics-port PORT`` serves them over HTTP) or through a
client of its socket. Every metric it can produce is listed in :data:`DAEMON_METRICS`;
``docs/daemon.md`` is the same table.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

from ..metrics import MetricSpec, _Families

__all__ = ["DAEMON_METRICS", "DaemonCollector"]

_D = ("daemon",)

#: Counters of the daemon, by their ``statctl`` name: (statctl name, metric, help).
_COUNTERS = (
    ("sets", "kvcodec_daemon_sets_total", "Pages stored into L2."),
    ("set_bytes", "kvcodec_daemon_set_bytes_total", "Page bytes stored into L2."),
    ("set_refused", "kvcodec_daemon_set_refused_total",
     "Commits refused (a slot that was not the client's lease, or a length over the region's pages)."),
    ("gets", "kvcodec_daemon_gets_total", "Keys looked up."),
    ("hits", "kvcodec_daemon_hits_total", "Keys found in L2 (each pinned until released)."),
    ("misses", "kvcodec_daemon_misses_total", "Keys not in L2."),
    ("hit_bytes", "kvcodec_daemon_hit_bytes_total", "Page bytes of the keys found."),
    ("evictions", "kvcodec_daemon_evictions_total", "Stored pages evicted (least recently used) to make room."),
    ("erased", "kvcodec_daemon_erased_total", "Stored pages removed by clients."),
    ("ephemeral", "kvcodec_daemon_ephemeral_total", "Pages stored with the ephemeral flag."),
    ("leases", "kvcodec_daemon_leases_total", "Slots leased to clients for writing."),
    ("aborted", "kvcodec_daemon_aborted_total", "Leases given back unwritten."),
    ("reclaimed_pins", "kvcodec_daemon_reclaimed_pins_total", "Pins released for clients that went away."),
    ("reclaimed_leases", "kvcodec_daemon_reclaimed_leases_total", "Leases freed for clients that went away."),
    ("clients_closed", "kvcodec_daemon_clients_closed_total", "Client connections that ended."),
    ("socket_bytes_in", "kvcodec_daemon_socket_bytes_in_total", "Bytes received on the clients' sockets."),
    ("socket_bytes_out", "kvcodec_daemon_socket_bytes_out_total", "Bytes sent on the clients' sockets."),
    ("write_backs_queued", "kvcodec_daemon_write_backs_queued_total", "Pages queued for writing back to the long tier."),
    ("write_backs", "kvcodec_daemon_write_backs_total", "Pages written back to the long tier."),
    ("write_back_bytes", "kvcodec_daemon_write_back_bytes_total", "Page bytes written back to the long tier."),
    ("write_backs_dropped", "kvcodec_daemon_write_backs_dropped_total",
     "Pages not written back: the write-back queue was full (they stayed in L2)."),
    ("write_backs_failed", "kvcodec_daemon_write_backs_failed_total", "Write-backs the file system refused."),
    ("long_hits", "kvcodec_daemon_long_hits_total", "Lookups that missed L2 and found the page in the long tier."),
    ("long_hit_bytes", "kvcodec_daemon_long_hit_bytes_total", "Page bytes read back from the long tier."),
    ("long_misses", "kvcodec_daemon_long_misses_total", "Lookups that missed L2 and the long tier."),
    ("long_corrupt", "kvcodec_daemon_long_corrupt_total",
     "Long-tier page files of another key, truncated or failing their CRC-32C (removed, never served)."),
    ("long_erased", "kvcodec_daemon_long_erased_total", "Long-tier page files removed by clients' erases."),
    ("promotions", "kvcodec_daemon_promotions_total", "Pages read back from the long tier into L2."),
    ("lookups_parked", "kvcodec_daemon_lookups_parked_total",
     "Lookups that waited for pages read back from the long tier (off the serving thread)."),
    ("prefetch_keys", "kvcodec_daemon_prefetch_keys_total", "Keys queued by prefetches for reading into L2."),
    ("prefetched", "kvcodec_daemon_prefetched_total", "Pages prefetches read from the long tier into L2."),
    ("prefetch_dropped", "kvcodec_daemon_prefetch_dropped_total",
     "Keys of prefetches dropped: 65536 were waiting already."),
)
_SLOT_STATES = (("free", "slots_free"), ("stored", "slots_stored"), ("leased", "slots_leased"),
                ("pinned", "slots_pinned"))

#: Every metric family, in exposition order.
DAEMON_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("kvcodec_daemon_up", "gauge", _D, "1 when the daemon answered this scrape, else 0."),
    MetricSpec("kvcodec_daemon_info", "info", (*_D, "protocol", "hugepages"),
               "The daemon: its protocol version and whether its arena is on huge pages (value 1)."),
    MetricSpec("kvcodec_daemon_arena_bytes", "gauge", _D, "Bytes of the L2 arena."),
    MetricSpec("kvcodec_daemon_arena_used_bytes", "gauge", _D, "Arena bytes cut into regions."),
    MetricSpec("kvcodec_daemon_regions", "gauge", _D, "Regions (one per codec identity and page size)."),
    MetricSpec("kvcodec_daemon_slots", "gauge", (*_D, "state"),
               "Slots by state: free, stored, leased (being written) and pinned (stored and held by readers)."),
    MetricSpec("kvcodec_daemon_clients", "gauge", _D, "Clients connected."),
    MetricSpec("kvcodec_daemon_write_back_queue_bytes", "gauge", _D,
               "Page bytes waiting to be written back to the long tier, counted until each one's L2 slot is "
               "released (pinned meanwhile)."),
    *(MetricSpec(metric, "counter", _D, text) for _, metric, text in _COUNTERS),
)


class DaemonCollector:
    """A prometheus_client collector of one daemon's counters; register it on a ``CollectorRegistry``.

    :param source: The daemon's socket path (a client connects at the first scrape, and again
        after the daemon restarted), or a callable returning the counters (``Daemon.stats`` of a
        daemon in this process).
    :param name: The ``daemon`` label (default: the socket path, or ``"daemon"``).
    """

    def __init__(self, source: str | Callable[[], dict], name: str | None = None) -> None:
        from ..metrics import _prometheus

        _prometheus()
        self._lock = threading.Lock()
        self._client: Any = None
        if callable(source):
            self._stats, self.name = source, name or "daemon"
        elif isinstance(source, str) and source:
            self._socket, self._stats, self.name = source, self._read_socket, name or source
        else:
            raise ValueError(f"source is {source!r}; give the daemon's socket path or a callable returning its counters")

    def _read_socket(self) -> dict:
        from . import DaemonClient

        with self._lock:
            if self._client is None:
                self._client = DaemonClient(self._socket, timeout_s=5.0)
            try:
                return self._client.stats()
            except Exception:
                self._client.close()
                self._client = None
                raise

    def describe(self) -> Iterator[Any]:
        """Every family without samples: registering the collector reads nothing."""
        return iter(_Families(samples=False, specs=DAEMON_METRICS))

    def collect(self) -> Iterator[Any]:
        """Reads the daemon's counters now (prometheus_client calls it on each scrape); a daemon
        that does not answer gives ``kvcodec_daemon_up 0`` and nothing else."""
        fams = _Families(specs=DAEMON_METRICS)
        n = (self.name,)
        try:
            st = self._stats()
        except Exception:
            fams.add("kvcodec_daemon_up", n, 0)
            return iter(fams)
        fams.add("kvcodec_daemon_up", n, 1)
        fams.add("kvcodec_daemon_info", (*n, st["protocol"], str(bool(st["hugepages"])).lower()), 1)
        fams.add("kvcodec_daemon_arena_bytes", n, st["arena_bytes"])
        fams.add("kvcodec_daemon_arena_used_bytes", n, st["arena_used"])
        fams.add("kvcodec_daemon_regions", n, st["regions"])
        for state, key in _SLOT_STATES:
            fams.add("kvcodec_daemon_slots", (*n, state), st[key])
        fams.add("kvcodec_daemon_clients", n, st["clients"])
        fams.add("kvcodec_daemon_write_back_queue_bytes", n, st.get("write_back_queue_bytes", 0))
        for key, metric, _ in _COUNTERS:
            fams.add(metric, n, st.get(key, 0))  # a daemon of an earlier version lacks the long tier's
        return iter(fams)

    def close(self) -> None:
        """Closes the collector's connection to the daemon (if it made one)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
