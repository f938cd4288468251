"""A vLLM offloading spec whose host tier holds codec-encoded KV blocks.

vLLM's ``OffloadingConnector`` moves KV blocks between its KV cache and an offloading medium
through an *offloading spec*: a scheduler-side :class:`KvcodecOffloadingManager` that decides
which blocks live in which host slot, and a worker-side :class:`KvcodecOffloadingWorker` that
moves the bytes. Selecting this spec is a configuration change only::

    KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                     kv_connector_extra_config={"spec_name": "KvcodecOffloadingSpec",
                                                "spec_module_path": "kvcodec_sdk.integrations.vllm",
                                                "codec": "fp8", "codec_params": {}, "cpu_bytes": 1 << 30})

The worker adopts vLLM's own KV tensors as the codec's hot pools
(:func:`kvcodec_sdk.kv_tensors.kv_pool_group`: block ``b`` of every layer is hot slot ``b``), so
storing a block encodes it straight from vLLM's KV cache into one host blob slot of
``cold_page_bytes`` and loading decodes it straight back. The host tier holds
``cpu_bytes // cold_page_bytes`` slots: a codec that halves a page (fp8 on bf16 KV) holds twice
the blocks in the same memory. On vLLM's CPU platform the codec's CPU reference backend runs
synchronously; on CUDA every transfer runs on the worker's own stream, ordered after the
compute stream, and ``get_finished`` polls one event per job.

**Drops are misses.** A block whose page did not fit its cold page (an ``nvcomp-*`` codec with
``slot_ratio`` below 1) or whose blob fails the codec's checks when loaded is a failed load.
vLLM 0.32's ``OffloadingConnector`` has no failed-load path (a failed transfer stops the engine):
select :class:`KvcodecOffloadingConnector` (``kv_connector="KvcodecOffloadingConnector"``,
``kv_connector_module_path="kvcodec_sdk.integrations.vllm"``) with
``kv_load_failure_policy="recompute"`` to have vLLM recompute those blocks instead.

Built and tested against vLLM :data:`~kvcodec_sdk.integrations.VLLM_VERSION`; vLLM marks the
offloading-spec API experimental, and another release may differ.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from ..kv_tensors import kv_data_type, kv_pool_group
from ..registry import create_codec
from . import VLLM_VERSION
from .blocks import BlockCodecStore

__all__ = ["KvcodecOffloadingSpec", "KvcodecOffloadingManager", "KvcodecOffloadingWorker",
           "KvcodecOffloadingConnector", "KvcodecWorkerMetadata", "HostSlotsSpec", "KvGeometry", "VLLM_VERSION"]

#: Metric names this spec reports through vLLM's offloading connector stats.
METRIC_STORED = "kvcodec:blocks_stored"
METRIC_LOADED = "kvcodec:blocks_loaded"
METRIC_EVICTED = "kvcodec:blocks_evicted"
METRIC_REJECTED = "kvcodec:stores_rejected"
METRIC_DROPPED = "kvcodec:blocks_dropped"
METRIC_USAGE = "kvcodec:host_slot_usage"

# The spec's keys, and those vLLM's offloading connector reads itself (checked by geometry()).
_EXTRA_KEYS = {"spec_name", "spec_module_path", "codec", "codec_params", "cpu_bytes", "kv_layout",
               "num_kv_heads", "head_dim", "offload_prompt_only", "self_describing_kv_events",
               "block_size", "blocks_per_chunk", "canonical_layout"}


class HostSlotsSpec(BlockIDsLoadStoreSpec):
    """Where blocks are in the host tier: one host blob slot index per block."""


# -- geometry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvGeometry:
    """What a codec needs to know of one KV cache group's blocks (the same on both sides)."""

    layers: int  #: attention layers of the group
    num_heads: int  #: KV heads per layer on this rank
    head_dim: int  #: elements of one head
    block_size: int  #: tokens of one block
    dtype: str  #: the KV element type (vLLM's cache dtype name)
    page_bytes: int  #: bytes of one block of one layer (vLLM's padded page)
    layout: str  #: where K and V lie inside a block (:data:`kvcodec_sdk.kv_tensors.KV_LAYOUTS`)

    def pool_group(self, tensors: list[Any] | None = None):
        """The hot pool group over ``tensors`` (default: one-block scratch arrays, for sizing)."""
        if tensors is None:
            tensors = [np.zeros((1, self.page_bytes), np.uint8) for _ in range(self.layers)]
        return kv_pool_group(tensors, layout=self.layout, num_heads=self.num_heads, head_dim=self.head_dim,
                             block_size=self.block_size, dtype=self.dtype)


def _hf_heads(model: str, tp_size: int) -> tuple[int, int]:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model)
    hf = getattr(hf, "text_config", None) or hf
    total = int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return max(1, total // max(1, tp_size)), int(head_dim)


def geometry(config: OffloadingConfig) -> KvGeometry:
    """The KV geometry of the offloaded group, from vLLM's offloading configuration (the scheduler
    side sees no model); ``num_kv_heads``, ``head_dim`` and ``kv_layout`` in the extra
    configuration override what is derived from the model's configuration and the platform."""
    extra = config.extra_config
    if len(config.groups) != 1:
        raise ValueError(f"KvcodecOffloadingSpec offloads one KV cache group; this model has {len(config.groups)}")
    if config.cache.blocks_per_chunk != 1:
        raise ValueError(f"KvcodecOffloadingSpec stores one block per host slot; blocks_per_chunk is "
                         f"{config.cache.blocks_per_chunk} (leave 'block_size' and 'blocks_per_chunk' unset)")
    if config.canonical_layout:
        raise ValueError("KvcodecOffloadingSpec stores each worker's own blocks; set canonical_layout to False")
    group = config.groups[0]
    layers = len(group.layer_names)
    if "num_kv_heads" in extra and "head_dim" in extra:
        heads, head_dim = int(extra["num_kv_heads"]), int(extra["head_dim"])
    else:
        heads, head_dim = _hf_heads(config.model.name, config.parallel.tp_size)
    layout = extra.get("kv_layout")
    if layout is None:
        from vllm.platforms import current_platform

        layout = "H2NC" if current_platform.is_cpu() else "HN2C"
    page_bytes = config.worker_kv_bytes_per_block // max(1, layers)
    dtype = config.model.dtype
    used = 2 * heads * group.tokens_per_block * head_dim * kv_data_type(dtype).itemsize
    if page_bytes < used:
        raise ValueError(f"a block of one layer is {page_bytes} bytes, but {heads} KV heads x {head_dim} x "
                         f"{group.tokens_per_block} tokens of {dtype} K and V take {used}: set 'num_kv_heads' "
                         "and 'head_dim' in kv_connector_extra_config")
    return KvGeometry(layers, heads, head_dim, group.tokens_per_block, dtype, page_bytes, str(layout))


def _codec_args(extra: Any) -> tuple[str, dict]:
    unknown = sorted(set(extra) - _EXTRA_KEYS)
    if unknown:
        raise ValueError(f"kv_connector_extra_config has unknown keys {unknown}; KvcodecOffloadingSpec reads "
                         f"{sorted(_EXTRA_KEYS)}")
    name = extra.get("codec", "concat")
    params = extra.get("codec_params") or {}
    if not isinstance(name, str) or not isinstance(params, dict):
        raise ValueError(f"codec is {name!r} and codec_params {params!r}; pass a codec name and a dict")
    return name, dict(params)


# -- scheduler side ----------------------------------------------------------------------------


class _Entry:
    __slots__ = ("slot", "refs")

    def __init__(self, slot: int):
        self.slot = slot
        self.refs = -1  # -1: being stored; 0: idle (evictable); > 0: loads in flight


class KvcodecOffloadingManager(OffloadingManager):
    """Tracks which blocks are in which host blob slot, least recently used evicted first.

    :param num_slots: host blob slots (``cpu_bytes // cold_page_bytes``).
    :param enable_events: record :class:`OffloadingEvent` s for vLLM's KV cache events.
    """

    def __init__(self, num_slots: int, enable_events: bool = False):
        if num_slots < 1:
            raise ValueError(f"the host tier holds {num_slots} blob slots; raise cpu_bytes to at least one cold page")
        self.num_slots = num_slots
        self._entries: OrderedDict[OffloadKey, _Entry] = OrderedDict()  # oldest first
        self._free = list(range(num_slots - 1, -1, -1))
        # Dropped blocks whose loads are still in flight: their slots are freed when the loads end.
        self._draining: dict[OffloadKey, _Entry] = {}
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self.counters = {METRIC_STORED: 0, METRIC_LOADED: 0, METRIC_EVICTED: 0, METRIC_REJECTED: 0,
                         METRIC_DROPPED: 0}
        self._reported = dict.fromkeys(self.counters, 0)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT for a stored block, HIT_PENDING while its store runs, MISS otherwise."""
        entry = self._entries.get(key)
        if entry is None:
            return LookupResult.MISS
        return LookupResult.HIT if entry.refs >= 0 else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """The host slots of stored blocks, protected from eviction until :meth:`complete_load`."""
        slots = []
        for key in keys:
            entry = self._entries[key]
            if entry.refs < 0:
                raise ValueError(f"block {key!r} is still being stored; lookup says HIT_PENDING")
            entry.refs += 1
            slots.append(entry.slot)
        self.counters[METRIC_LOADED] += len(slots)
        return HostSlotsSpec(slots)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Marks blocks as just used; the first key (a prefix's head) becomes the most recent."""
        for key in reversed(list(keys)):
            if key in self._entries:
                self._entries.move_to_end(key)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Ends the loads of :meth:`prepare_load`; idle blocks become evictable again."""
        for key in keys:
            entry = self._draining.get(key)
            if entry is not None:
                entry.refs -= 1
                if entry.refs <= 0:
                    self._free.append(self._draining.pop(key).slot)
                continue
            entry = self._entries.get(key)
            if entry is not None and entry.refs > 0:
                entry.refs -= 1

    def drop_slots(self, slots: Iterable[int]) -> list[OffloadKey]:
        """Forgets the stored blocks in host ``slots`` (the worker found their blobs unusable: did
        not fit, failed a check), so later lookups miss and vLLM recomputes them; returns their
        keys. A slot with loads in flight is freed when they end."""
        bad = set(int(s) for s in slots)
        keys = [k for k, e in self._entries.items() if e.slot in bad and e.refs >= 0]
        for key in keys:
            entry = self._entries.pop(key)
            if entry.refs > 0:
                self._draining[key] = entry
            else:
                self._free.append(entry.slot)
        self.counters[METRIC_DROPPED] += len(keys)
        if keys and self._events is not None:
            self._events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=True))
        return keys

    def _evict(self, count: int, protected: set) -> list[OffloadKey] | None:
        victims = []
        for key, entry in self._entries.items():
            if len(victims) == count:
                break
            if entry.refs == 0 and key not in protected:
                victims.append(key)
        if len(victims) < count:
            return None
        for key in victims:
            self._free.append(self._entries.pop(key).slot)
        return victims

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Host slots for the blocks not stored yet, evicting idle blocks as needed; None (nothing
        changed) when too few are idle."""
        keys = list(keys)
        new = [k for k in dict.fromkeys(keys) if k not in self._entries]
        evicted: list[OffloadKey] = []
        if len(new) > len(self._free):
            victims = self._evict(len(new) - len(self._free), set(keys))
            if victims is None:
                self.counters[METRIC_REJECTED] += 1
                return None
            evicted = victims
            self.counters[METRIC_EVICTED] += len(victims)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=victims, medium=Medium.CPU, removed=True))
        slots = []
        for key in new:
            entry = _Entry(self._free.pop())
            self._entries[key] = entry
            slots.append(entry.slot)
        return PrepareStoreOutput(keys_to_store=new, store_spec=HostSlotsSpec(slots), evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Stored blocks become loadable; a failed store frees their slots."""
        done = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.refs >= 0:
                continue
            if success:
                entry.refs = 0
                done.append(key)
            else:
                self._free.append(self._entries.pop(key).slot)
        self.counters[METRIC_STORED] += len(done)
        if done and self._events is not None:
            self._events.append(OffloadingEvent(keys=done, medium=Medium.CPU, removed=False))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Every request offloads its newly computed blocks (vLLM's default policy)."""
        return RequestOffloadingContext()

    def reset_cache(self) -> None:
        """Forgets every block (vLLM ignores completions of jobs from before the reset)."""
        self._entries.clear()
        self._draining.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The store and eviction events since the last call."""
        if self._events:
            yield from self._events
            self._events.clear()

    def used_slots(self) -> int:
        """Host slots holding a block or a store in flight."""
        return self.num_slots - len(self._free)

    def get_stats(self) -> OffloadingConnectorStats:
        """Blocks stored, loaded and evicted and stores rejected since the last call, and the
        fraction of host slots in use."""
        stats = OffloadingConnectorStats()
        for name, value in self.counters.items():
            stats.increase_counter(name, value - self._reported[name])
        self._reported = dict(self.counters)
        stats.set_gauge(METRIC_USAGE, self.used_slots() / self.num_slots)
        return stats


# -- worker side -------------------------------------------------------------------------------


class KvcodecOffloadingWorker(BlockCodecStore, OffloadingWorker):
    """Encodes stored blocks from vLLM's KV tensors into host blob slots and decodes them back:
    a :class:`~kvcodec_sdk.integrations.blocks.BlockCodecStore` behind vLLM's worker interface.

    :param kv_caches: vLLM's canonical KV caches (one ``(num_blocks, page_bytes)`` view per layer).
    :param geom: the group's :class:`KvGeometry`.
    :param codec: codec name; ``params`` its parameters; ``num_slots`` host blob slots.
    :param report_load_errors: report failed loads as successful transfers whose blocks
        :meth:`take_load_errors` returns (set by :class:`KvcodecOffloadingConnector`); otherwise
        they are failed transfers.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, geom: KvGeometry, codec: str, params: dict, num_slots: int,
                 report_load_errors: bool = False):
        refs = kv_caches.group_data_refs[0]
        tensors = [kv_caches.tensors[r.tensor_idx].tensor for r in refs]
        if len(tensors) != geom.layers:
            raise ValueError(f"vLLM handed {len(tensors)} KV tensors for {geom.layers} layers")
        BlockCodecStore.__init__(self, tensors, geom.pool_group(tensors), codec, params, num_slots,
                                 report_load_errors=report_load_errors)

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Encodes the source KV blocks into their host slots (CUDA: on the worker's stream)."""
        self.store(job_id, src_spec.block_ids, dst_spec.block_ids)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        """Decodes host slots into the destination KV blocks; blocks whose blob is known bad are
        not decoded and fail the load."""
        self.load(job_id, src_spec.block_ids, dst_spec.block_ids)
        return True

    def get_finished(self) -> list[TransferResult]:
        """Results of the jobs whose codec calls completed (CPU: every submitted job)."""
        return [TransferResult(r.job_id, r.ok, r.nbytes, r.seconds) for r in self.poll()]

    def shutdown(self) -> None:
        """Waits for every job and releases the codec."""
        self.close()


# -- the spec and the connector ----------------------------------------------------------------


class KvcodecOffloadingSpec(OffloadingSpec):
    """vLLM offloading spec: blocks encoded with a kvcodec codec into a host tier of blob slots.

    Extra configuration (``kv_connector_extra_config``): ``codec`` (default ``"concat"``),
    ``codec_params`` (the codec's parameters), ``cpu_bytes`` (host tier bytes, required),
    optionally ``kv_layout`` (:data:`kvcodec_sdk.kv_tensors.KV_LAYOUTS`; default ``"H2NC"`` on
    vLLM's CPU platform, ``"HN2C"`` on CUDA) and ``num_kv_heads`` with ``head_dim`` (default:
    from the model's configuration).
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """The counters and the gauge :meth:`KvcodecOffloadingManager.get_stats` reports."""
        counter = OffloadingCounterMetadata
        return {METRIC_STORED: counter("KV blocks stored into the kvcodec host tier"),
                METRIC_LOADED: counter("KV blocks loaded from the kvcodec host tier"),
                METRIC_EVICTED: counter("KV blocks evicted from the kvcodec host tier"),
                METRIC_REJECTED: counter("stores rejected: every host slot busy"),
                METRIC_DROPPED: counter("stored KV blocks dropped: did not fit, or failed a check when loaded"),
                METRIC_USAGE: OffloadingGaugeMetadata("fraction of kvcodec host slots in use")}

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self.codec_name, self.codec_params = _codec_args(self.extra_config)
        cpu_bytes = self.extra_config.get("cpu_bytes")
        if isinstance(cpu_bytes, bool) or not isinstance(cpu_bytes, int) or cpu_bytes <= 0:
            raise ValueError(f"cpu_bytes is {cpu_bytes!r}; set kv_connector_extra_config['cpu_bytes'] to the host "
                             "tier's size in bytes")
        self.geometry = geometry(config)
        sizing = create_codec(self.codec_name, self.codec_params, device="cpu")
        try:
            sizing.configure([self.geometry.pool_group()])
            self.cold_page_bytes = sizing.cold_page_bytes(0)
        finally:
            sizing.close()
        self.num_slots = cpu_bytes // self.cold_page_bytes
        self.report_load_errors = False
        self._manager: KvcodecOffloadingManager | None = None
        self._worker: KvcodecOffloadingWorker | None = None

    def get_manager(self) -> KvcodecOffloadingManager:
        """The scheduler side's slot manager (one per spec)."""
        if self._manager is None:
            self._manager = KvcodecOffloadingManager(self.num_slots, self.kv_events_config.enable_kv_cache_events)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> KvcodecOffloadingWorker:
        """The worker over vLLM's KV tensors (one per spec); checks the geometry against vLLM's."""
        if self._worker is None:
            self._check_geometry(kv_caches)
            self._worker = KvcodecOffloadingWorker(kv_caches, self.geometry, self.codec_name, self.codec_params,
                                                   self.num_slots, self.report_load_errors)
            if self._worker.cold_page_bytes != self.cold_page_bytes:
                raise ValueError(f"{self.codec_name}: {self._worker.cold_page_bytes}-byte cold pages on the worker, "
                                 f"{self.cold_page_bytes} sized on the scheduler")
        return self._worker

    def _check_geometry(self, kv_caches: CanonicalKVCaches) -> None:
        from vllm.config import get_current_vllm_config_or_none

        g = self.geometry
        pages = {kv_caches.tensors[r.tensor_idx].tensor.stride(0) for r in kv_caches.group_data_refs[0]}
        if pages != {g.page_bytes}:
            raise ValueError(f"vLLM's KV blocks are {sorted(pages)} bytes apart; the spec derived {g.page_bytes}")
        vc = get_current_vllm_config_or_none()
        if vc is not None:
            real = (vc.model_config.get_num_kv_heads(vc.parallel_config), vc.model_config.get_head_size())
            if real != (g.num_heads, g.head_dim):
                raise ValueError(f"vLLM runs {real[0]} KV heads of {real[1]}; the spec derived {g.num_heads} of "
                                 f"{g.head_dim}: set 'num_kv_heads' and 'head_dim' in kv_connector_extra_config")


@dataclass
class KvcodecWorkerMetadata(OffloadingWorkerMetadata):
    """vLLM's worker-to-scheduler offloading metadata plus the host slots found unusable."""

    bad_slots: set[int] = field(default_factory=set)

    def aggregate(self, other: Any) -> KvcodecWorkerMetadata:
        """Merges the metadata of several workers (one per rank)."""
        merged = OffloadingWorkerMetadata.aggregate(self, other)
        bad = self.bad_slots | getattr(other, "bad_slots", set())
        return KvcodecWorkerMetadata(merged.completed_jobs, merged.transfer_stats, bad)


class KvcodecOffloadingConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` plus failed loads: blocks the codec could not load (did not
    fit, bad checksum) go to vLLM as load errors, which it recomputes under
    ``kv_load_failure_policy="recompute"``, and the scheduler side forgets them, so the next
    lookup misses. Select it with ``kv_connector="KvcodecOffloadingConnector"`` and
    ``kv_connector_module_path="kvcodec_sdk.integrations.vllm"`` (the extra configuration names
    :class:`KvcodecOffloadingSpec` as with the plain connector)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        if self.connector_worker is not None and isinstance(self.connector_worker.spec, KvcodecOffloadingSpec):
            self.connector_worker.spec.report_load_errors = True

    def _kvcodec_worker(self) -> KvcodecOffloadingWorker | None:
        worker = self.connector_worker.worker if self.connector_worker is not None else None
        return worker if isinstance(worker, KvcodecOffloadingWorker) else None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """KV blocks whose load failed since the last call."""
        worker = self._kvcodec_worker()
        return worker.take_load_errors() if worker is not None else set()

    def build_connector_worker_meta(self) -> OffloadingWorkerMetadata | None:
        """vLLM's completed jobs, with the host slots found unusable in the same steps."""
        meta = super().build_connector_worker_meta()
        worker = self._kvcodec_worker()
        bad = worker.take_bad_slots() if worker is not None else set()
        if not bad:
            return meta
        if meta is None:
            meta = OffloadingWorkerMetadata()
        return KvcodecWorkerMetadata(meta.completed_jobs, meta.transfer_stats, bad)

    def update_connector_output(self, connector_output: Any) -> None:
        """vLLM's completions first (they end the loads), then the unusable slots are forgotten."""
        super().update_connector_output(connector_output)
        meta = connector_output.kv_connector_worker_meta
        manager = self.connector_scheduler.manager if self.connector_scheduler is not None else None
        if isinstance(meta, KvcodecWorkerMetadata) and isinstance(manager, KvcodecOffloadingManager):
            manager.drop_slots(meta.bad_slots)
