"""The one place where the facade's dataclasses become the native module's bound structs and back.

Every value that crosses into ``kvcodec_sdk._native`` is a bound class with named fields (see
``_native/*.pyi``); no positional tuple crosses. Conversions check only what the facade did not
already check (types), the native side checks ranges and names the field.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import _native
from .layout import BufferDesc, BufferRole, DataType, PoolGroupDesc

if TYPE_CHECKING:
    from .disk import CodecIdentity
    from .kvcm_config import DiskTierConfig, KVCacheConfig
    from .storage_profile import StorageProfile

__all__ = [
    "buffer_from_native",
    "config_to_native",
    "fault_rules_to_native",
    "pool_groups_to_native",
]

# DiskTierConfig.io_mode -> disk::IoMode.
IO_MODES = {"auto": 0, "direct": 1, "buffered": 2}
IO_BACKENDS = {"auto": 0, "threads": 1, "io_uring": 2}  # disk::IoBackend


def pool_groups_to_native(groups: Sequence[PoolGroupDesc]) -> list[_native.PoolGroupDesc]:
    """Hot pool groups for ``_native.NativeCodec.configure``."""
    out = []
    for g, group in enumerate(groups):
        if not isinstance(group, PoolGroupDesc):
            raise TypeError(f"groups[{g}] is a {type(group).__name__}; expected kvcodec_sdk.PoolGroupDesc")
        pools = [_native.PoolDesc(int(p.base), int(p.slot_bytes), int(p.num_slots)) for p in group.pools]
        lifecycles = [
            _native.LifeCycleDesc(int(lc.lifecycle_id), [_buffer_to_native(b) for b in lc.buffers])
            for lc in group.lifecycles
        ]
        out.append(_native.PoolGroupDesc(pools, lifecycles))
    return out


def _buffer_to_native(b: BufferDesc) -> _native.BufferDesc:
    return _native.BufferDesc(
        layer_id=int(b.layer_id), role=int(b.role), pool_index=int(b.pool_index), dtype=int(b.dtype),
        byte_offset=int(b.byte_offset), bytes=int(b.bytes), tokens_per_page=int(b.tokens_per_page),
        num_heads=int(b.num_heads), head_dim=int(b.head_dim),
    )


def buffer_from_native(b: _native.BufferDesc) -> BufferDesc:
    """A buffer of ``KvcmCore.lifecycle_info`` as the facade's :class:`BufferDesc`."""
    return BufferDesc(
        layer_id=int(b.layer_id), role=BufferRole(b.role), pool_index=int(b.pool_index),
        byte_offset=int(b.byte_offset), bytes=int(b.bytes), dtype=DataType(b.dtype),
        tokens_per_page=int(b.tokens_per_page), num_heads=int(b.num_heads), head_dim=int(b.head_dim),
    )


def fault_rules_to_native(rules: Sequence[Mapping[str, Any]]) -> list[_native.disk.FaultRule]:
    """Test-only fault rules (already checked by ``kvcodec_sdk.disk``) as native structs."""
    out = []
    for r in rules:
        rule = _native.disk.FaultRule()
        rule.op = str(r["op"])
        rule.path_contains = str(r["path"])
        rule.after_ops = int(r["after"])
        rule.error = int(r["errno"])
        rule.torn = bool(r["torn"])
        rule.count = int(r["count"])
        rule.delay_us = int(r["delay_us"])
        out.append(rule)
    return out


def _disk_to_native(d: DiskTierConfig | None, identity: CodecIdentity | None,
                    profile: StorageProfile | None = None) -> _native.kvcm.DiskTierConfig:
    out = _native.kvcm.DiskTierConfig()  # an empty path: no disk tier
    out.io_threads = 1
    if d is None:
        return out
    if identity is None:
        raise ValueError("KVCacheConfig.disk needs the codec identity of its tier")
    from .disk import _fault_rules

    out.path = str(d.path)
    out.max_bytes = int(d.max_bytes)
    out.container_bytes = int(d.container_bytes)
    io_mode, io_threads, queue_depth, io_backend = d.tuned(profile)
    out.io_mode = IO_MODES[io_mode]
    out.io_threads = io_threads
    out.io_backend = IO_BACKENDS[io_backend]
    out.queue_depth = queue_depth
    out.codec_name = identity.name
    out.format_version = int(identity.format_version)
    out.param_hash = identity.param_hash
    out.params_json = json.dumps(dict(identity.params), sort_keys=True)
    out.layout_json = json.dumps(identity.layout, sort_keys=True)
    out.faults = _fault_rules(d._faults)
    return out


def config_to_native(config: KVCacheConfig, envelope_format_version: int = -1,
                     identity: CodecIdentity | None = None,
                     profile: StorageProfile | None = None,
                     remote_queue: Any = None) -> _native.kvcm.KvcmConfig:
    """The ``_native.kvcm.KvcmConfig`` for ``KvcmCore`` (call ``config.validate()`` first);
    ``profile`` is the disk tier's storage (probed from its path when None); ``remote_queue`` the
    ``_native.kvcm.RemoteQueue`` the remote tier's worker serves (required with ``config.remote``)."""
    out = _native.kvcm.KvcmConfig()
    groups = []
    for group in config.layer_groups:
        g = _native.kvcm.LayerGroupConfig()
        buffers = []
        for b in group.buffers:
            nb = _native.kvcm.BufferConfig()
            nb.layer = int(b.layer_id)
            nb.role = int(b.role)
            nb.dtype = int(b.dtype)
            nb.bytes = int(b.bytes)
            nb.tokens_per_page = int(b.tokens_per_page)
            nb.num_heads = int(b.num_heads)
            nb.head_dim = int(b.head_dim)
            buffers.append(nb)
        g.buffers = buffers
        groups.append(g)
    out.layer_groups = groups
    out.gpu_quota_bytes = int(config.gpu_quota)
    out.host_quota_bytes = int(config.host_quota)
    out.pool_ratio = config.weights()
    out.index_ring_bytes = int(config.index_ring_bytes)
    out.envelope_format_version = int(envelope_format_version)
    out.disk = _disk_to_native(config.disk, identity, profile)
    out.min_hot_slots = [int(n) for n in config.min_hot_slots] if config.min_hot_slots is not None else []
    out.auto_evict = bool(config.auto_evict)
    out.max_gpu_quota_bytes = int(config.max_gpu_quota) if config.max_gpu_quota is not None else 0
    remote = _native.kvcm.RemoteTierConfig()
    if config.remote is not None:
        remote.max_pages = int(config.remote.max_pages)
        remote.queue = remote_queue
    out.remote = remote
    shared = _native.kvcm.SharedTierConfig()
    if config.shared is not None:
        if identity is None:
            raise ValueError("a shared host tier needs the codec identity that names its arena regions")
        shared.socket_path = str(config.shared.socket)
        shared.identity = config.shared.region_prefix(identity)
        shared.region_slots = int(config.shared.region_slots or 0)
        shared.verify_crc = bool(config.shared.verify_crc)
        shared.timeout_s = float(config.shared.timeout_s)
        every = config.shared.reattach_every_s
        shared.reattach_every_s = -1.0 if every is None else float(every)
    out.shared = shared
    return out
