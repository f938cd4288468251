"""Prometheus metrics of KV-cache managers, read when scraped.

:class:`KVCacheCollector` is a custom collector for the ``prometheus_client`` package (the
``metrics`` extra: ``pip install kvcodec-sdk[metrics]``). It holds weak references to the
managers added to it and reads their statistics only while a scrape runs: between scrapes it
costs nothing, and a migration never touches it. Every metric it can produce is listed in
:data:`METRICS` (name, type, labels and help text); ``docs/metrics.md`` is the same table.

.. code-block:: python

    from prometheus_client import start_http_server
    from kvcodec_sdk.metrics import register

    register(manager, name="engine0")     # on prometheus_client's default registry
    start_http_server(9400)               # GET /metrics reads the manager's counters

A scrape takes each manager's lock for the few microseconds of each statistics call, so it
waits for a call in flight on another thread; a closed (or garbage-collected) manager is left
out of the scrape and dropped from the collector.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from .pages import CacheLevel

if TYPE_CHECKING:
    from .manager import KVCacheManager

__all__ = ["METRICS", "KVCacheCollector", "MetricSpec", "register", "unregister"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family the collector produces. ``name`` is the exposed name (counters carry
    their ``_total`` suffix here), ``kind`` ``"counter"``, ``"gauge"`` or ``"info"`` (a gauge
    of value 1 whose labels carry the information)."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str

    @property
    def family(self) -> str:
        """The family name prometheus_client is given (a counter's name without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


_G = ("manager", "level", "pool_group")
_C = ("manager", "codec", "level", "pool_group")
_D = ("manager", "pool_group")

#: Every metric family, in exposition order.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("kvcodec_manager_info", "info", ("manager", "device", "codec"),
               "A KV-cache manager: its device and cold-page codec (value 1)."),
    MetricSpec("kvcodec_quota_bytes", "gauge", ("manager", "level"), "The level's current quota in bytes."),
    MetricSpec("kvcodec_slots", "gauge", _G, "Usable slots of the pool group."),
    MetricSpec("kvcodec_slots_used", "gauge", _G, "Slots holding a page."),
    MetricSpec("kvcodec_slots_peak", "gauge", _G,
               "Most slots used since the last peak reset (a scrape does not reset it)."),
    MetricSpec("kvcodec_pages_evictable", "gauge", _G, "Unpinned pages the eviction controller may move."),
    MetricSpec("kvcodec_in_flight_transfers", "gauge", ("manager",),
               "Non-blocking disk transfers submitted and not yet committed."),
    MetricSpec("kvcodec_pages_offloaded_total", "counter", _G, "Pages encoded hot -> cold through the pool group."),
    MetricSpec("kvcodec_pages_onboarded_total", "counter", _G, "Pages decoded cold -> hot through the pool group."),
    MetricSpec("kvcodec_pages_copied_total", "counter", _G,
               "Pages relocated within the level into the pool group (resize, defragmentation)."),
    MetricSpec("kvcodec_evictions_total", "counter", _G, "Pages the eviction controller moved out of the pool group."),
    MetricSpec("kvcodec_hits_total", "counter", _G, "touch() calls on pages in the pool group."),
    MetricSpec("kvcodec_pages_dropped_total", "counter", (*_G, "reason"),
               "Pages lost at the pool group, by reason: capacity (dropped by the eviction controller at "
               "the last level) or a failed check of the blob (the codec's page statuses, the disk "
               "tier's missing and disk_checksum)."),
    MetricSpec("kvcodec_codec_calls_total", "counter", (*_C, "direction"),
               "Codec calls (encode or decode) of transfers through the cold pool group."),
    MetricSpec("kvcodec_codec_host_seconds_total", "counter", (*_C, "direction"),
               "Host time inside the codec's encode and decode calls."),
    MetricSpec("kvcodec_codec_gpu_calls_total", "counter", (*_C, "direction"),
               "Codec calls timed on the GPU (KVCacheManager.set_codec_gpu_timing; CUDA backend), "
               "counted once their events completed."),
    MetricSpec("kvcodec_codec_gpu_seconds_total", "counter", (*_C, "direction"),
               "GPU time of the timed codec calls, between CUDA events recorded around each call on "
               "its stream."),
    MetricSpec("kvcodec_codec_hot_bytes_total", "counter", (*_C, "direction"),
               "Hot page bytes the codec read (encode) or wrote (decode)."),
    MetricSpec("kvcodec_codec_cold_bytes_total", "counter", (*_C, "direction"),
               "Cold blob bytes the codec wrote (encode) or read (decode); hot over cold bytes is "
               "the ratio the cold tier achieves."),
    MetricSpec("kvcodec_prefetch_pages_total", "counter", ("manager", "outcome"),
               "Prefetched pages by outcome: issued, completed, used, wasted, skipped, cancelled, failed."),
    MetricSpec("kvcodec_disk_region_info", "info", (*_D, "dir", "io_backend", "direct_io"),
               "A disk region of a cold pool group: its folder and I/O backend (value 1)."),
    MetricSpec("kvcodec_disk_slots", "gauge", _D, "Slots of the disk region."),
    MetricSpec("kvcodec_disk_slots_live", "gauge", _D, "Disk slots holding a blob."),
    MetricSpec("kvcodec_disk_puts_total", "counter", _D, "Blobs written durably to the disk region."),
    MetricSpec("kvcodec_disk_put_errors_total", "counter", _D, "Disk writes that failed."),
    MetricSpec("kvcodec_disk_reads_total", "counter", _D, "Blobs read from the disk region."),
    MetricSpec("kvcodec_disk_checksum_failures_total", "counter", _D, "Disk reads whose CRC-32C failed."),
    MetricSpec("kvcodec_disk_erases_total", "counter", _D, "Blobs erased from the disk region."),
    MetricSpec("kvcodec_disk_merged_ios_total", "counter", _D, "Adjacent disk requests merged into one I/O."),
    MetricSpec("kvcodec_disk_queued_requests_total", "counter", _D, "Disk requests queued to the I/O backend."),
)

_SPECS = {m.name: m for m in METRICS}
_LEVELS = (CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK)
_PREFETCH = ("issued", "completed", "used", "wasted", "skipped", "cancelled", "failed")
_DISK_COUNTERS = (("puts", "kvcodec_disk_puts_total"), ("put_errors", "kvcodec_disk_put_errors_total"),
                  ("reads", "kvcodec_disk_reads_total"),
                  ("checksum_failures", "kvcodec_disk_checksum_failures_total"),
                  ("erases", "kvcodec_disk_erases_total"), ("merged_ios", "kvcodec_disk_merged_ios_total"),
                  ("queued_requests", "kvcodec_disk_queued_requests_total"))


def _prometheus() -> Any:
    try:
        from prometheus_client import core
    except ImportError:
        raise ImportError("kvcodec_sdk.metrics needs prometheus_client: pip install 'kvcodec-sdk[metrics]'") from None
    return core


class _Families:
    """The families of one scrape, created on first use, yielded in the order of ``specs``
    (default :data:`METRICS`)."""

    def __init__(self, samples: bool = True, specs: tuple[MetricSpec, ...] | None = None):
        self._core = _prometheus()
        self._out: dict[str, Any] = {}
        self._order = METRICS if specs is None else specs
        self._specs = _SPECS if specs is None else {m.name: m for m in specs}
        if not samples:
            for spec in self._order:
                self._family(spec)

    def _family(self, spec: MetricSpec) -> Any:
        fam = self._out.get(spec.name)
        if fam is None:
            if spec.kind == "counter":
                fam = self._core.CounterMetricFamily(spec.family, spec.help, labels=spec.labels)
            else:
                fam = self._core.GaugeMetricFamily(spec.family, spec.help, labels=spec.labels)
            self._out[spec.name] = fam
        return fam

    def add(self, name: str, labels: Iterable[Any], value: float) -> None:
        self._family(self._specs[name]).add_metric([str(v) for v in labels], float(value))

    def __iter__(self) -> Iterator[Any]:
        return (self._out[m.name] for m in self._order if m.name in self._out)


class KVCacheCollector:
    """A prometheus_client collector of the managers added to it (:meth:`add`); register it on a
    ``CollectorRegistry``. It reads every manager's statistics in :meth:`collect`, that is on
    each scrape, and keeps no manager alive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._managers: dict[str, weakref.ref] = {}
        self._counter = 0

    def add(self, manager: KVCacheManager, name: str | None = None) -> str:
        """Adds a manager; its metrics carry ``manager=name`` (default: ``"0"``, ``"1"``, ... in
        the order added). Returns the name. A name already in use raises ``ValueError``."""
        _prometheus()
        with self._lock:
            if name is None:
                while str(self._counter) in self._managers:
                    self._counter += 1
                name = str(self._counter)
            elif not isinstance(name, str) or not name:
                raise ValueError(f"name is {name!r}; it must be a non-empty string")
            live = self._managers.get(name)
            if live is not None and live() is not None:
                raise ValueError(f"a manager named {name!r} is already collected; pass another name")
            self._managers[name] = weakref.ref(manager)
        return name

    def remove(self, manager: KVCacheManager) -> bool:
        """Stops collecting a manager; False when it was not collected."""
        with self._lock:
            for name, ref in list(self._managers.items()):
                if ref() is manager:
                    del self._managers[name]
                    return True
        return False

    def names(self) -> list[str]:
        """The names of the managers collected now."""
        with self._lock:
            return [n for n, ref in self._managers.items() if ref() is not None]

    def describe(self) -> Iterator[Any]:
        """Every family without samples: registering the collector reads no manager."""
        return iter(_Families(samples=False))

    def collect(self) -> Iterator[Any]:
        """Reads every collected manager now (prometheus_client calls it on each scrape)."""
        fams = _Families()
        with self._lock:
            entries = list(self._managers.items())
        for name, ref in entries:
            manager = ref()
            if manager is None or manager._core_obj is None:
                with self._lock:
                    if self._managers.get(name) is ref:
                        del self._managers[name]
                continue
            try:
                _collect_manager(fams, name, manager)
            except RuntimeError:
                continue  # closed while this scrape read it: left out
        return iter(fams)


def _collect_manager(fams: _Families, name: str, m: KVCacheManager) -> None:
    codec = m.codec_name
    fams.add("kvcodec_manager_info", (name, m.device, codec), 1)
    levels = [lv for lv in _LEVELS if m.num_pool_groups(lv) > 0]
    for level in levels:
        label = CacheLevel.label(level)
        fams.add("kvcodec_quota_bytes", (name, label), m.quota(level))
        capacity = m.level_stats(level)
        for g, st in enumerate(m.stats(level)):
            key = (name, label, g)
            cap = capacity[g]
            fams.add("kvcodec_slots", key, cap["slots"])
            fams.add("kvcodec_slots_used", key, cap["used"])
            fams.add("kvcodec_slots_peak", key, cap["peak"])
            fams.add("kvcodec_pages_evictable", key, cap["evictable"])
            fams.add("kvcodec_pages_offloaded_total", key, st.pages_offloaded)
            fams.add("kvcodec_pages_onboarded_total", key, st.pages_onboarded)
            fams.add("kvcodec_pages_copied_total", key, st.pages_copied)
            fams.add("kvcodec_evictions_total", key, st.evictions)
            fams.add("kvcodec_hits_total", key, st.hits)
            fams.add("kvcodec_pages_dropped_total", (*key, "capacity"), st.drops)
            for reason, count in st.dropped_by_reason.items():
                fams.add("kvcodec_pages_dropped_total", (*key, reason), count)
            if level == CacheLevel.HOT:
                continue  # codec transfers count at both ends: the cold end reports them
            ckey = (name, codec, label, g)
            for direction, calls, seconds, gpu_calls, gpu_seconds, hot, cold in (
                    ("encode", st.encode_calls, st.encode_seconds, st.encode_gpu_calls, st.encode_gpu_seconds,
                     st.hot_bytes_offloaded, st.bytes_offloaded),
                    ("decode", st.decode_calls, st.decode_seconds, st.decode_gpu_calls, st.decode_gpu_seconds,
                     st.hot_bytes_onboarded, st.bytes_onboarded)):
                fams.add("kvcodec_codec_calls_total", (*ckey, direction), calls)
                fams.add("kvcodec_codec_host_seconds_total", (*ckey, direction), seconds)
                fams.add("kvcodec_codec_gpu_calls_total", (*ckey, direction), gpu_calls)
                fams.add("kvcodec_codec_gpu_seconds_total", (*ckey, direction), gpu_seconds)
                fams.add("kvcodec_codec_hot_bytes_total", (*ckey, direction), hot)
                fams.add("kvcodec_codec_cold_bytes_total", (*ckey, direction), cold)
    fams.add("kvcodec_in_flight_transfers", (name,), m.in_flight_transfers())
    pf = m.prefetch_stats()
    for outcome in _PREFETCH:
        fams.add("kvcodec_prefetch_pages_total", (name, outcome), getattr(pf, outcome))
    if CacheLevel.DISK in levels:
        for g in range(m.num_pool_groups(CacheLevel.DISK)):
            d = m.disk_stats(g)
            fams.add("kvcodec_disk_region_info", (name, g, d["dir"], d.get("io_backend", ""),
                                                  str(bool(d["direct_io"])).lower()), 1)
            fams.add("kvcodec_disk_slots", (name, g), d["slots_total"])
            fams.add("kvcodec_disk_slots_live", (name, g), d["slots_live"])
            for key, metric in _DISK_COUNTERS:
                if key in d:
                    fams.add(metric, (name, g), d[key])


_default_lock = threading.Lock()
_default: dict[int, tuple[Any, KVCacheCollector]] = {}


def register(manager: KVCacheManager, name: str | None = None, registry: Any = None) -> KVCacheCollector:
    """Collects ``manager`` on ``registry`` (default: prometheus_client's ``REGISTRY``), through
    one :class:`KVCacheCollector` per registry, created and registered on first use. Returns
    that collector (:meth:`KVCacheCollector.add` says what ``name`` is)."""
    core = _prometheus()
    if registry is None:
        registry = core.REGISTRY
    with _default_lock:
        entry = _default.get(id(registry))
        if entry is None or entry[0] is not registry:
            collector = KVCacheCollector()
            registry.register(collector)
            _default[id(registry)] = (registry, collector)
        else:
            collector = entry[1]
    collector.add(manager, name)
    return collector


def unregister(manager: KVCacheManager, registry: Any = None) -> bool:
    """Stops collecting a manager that :func:`register` added to ``registry``; False when it
    was not collected there."""
    if registry is None:
        registry = _prometheus().REGISTRY
    with _default_lock:
        entry = _default.get(id(registry))
    return entry is not None and entry[0] is registry and entry[1].remove(manager)
