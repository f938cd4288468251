"""One name per concept, one buffer type, and bound structs instead of positional tuples at the
Python <-> C++ boundary; the former names keep working."""

from __future__ import annotations

import enum
import warnings

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk import _native
from kvcodec_sdk.kvcm_config import KVCacheConfig, KVCacheConfigError, LayerGroupConfig
from kvcodec_sdk.manager import CacheLevel, KVCacheManager, MigrationError, MigrationRecord


def small_config(**kw):
    buffers = [kv.BufferDesc(layer_id=layer, role=role, bytes=64) for layer in range(2)
               for role in (kv.BufferRole.KEY, kv.BufferRole.VALUE)]
    return KVCacheConfig(layer_groups=[LayerGroupConfig(buffers)], gpu_quota=64 * 4 * 16, host_quota=1 << 16,
                         device="cpu", **kw)


def test_short_enum_names_are_the_same_classes():
    assert kv.DType is kv.DataType and kv.Role is kv.BufferRole
    assert kv.DataType.BFLOAT16.itemsize == 2 and kv.BufferRole(1) is kv.BufferRole.VALUE


@pytest.mark.parametrize("cls", [kv.DataType, kv.BufferRole, kv.PageIndexLocation, kv.PageStatus, CacheLevel])
def test_every_enum_is_an_int_enum(cls):
    assert issubclass(cls, enum.IntEnum)


def test_cache_level_is_an_int_enum_that_keeps_its_name_helper():
    assert [int(level) for level in CacheLevel] == [0, 1, 2, 3]
    assert CacheLevel.REMOTE.name == "REMOTE" and CacheLevel.name(3) == "remote"
    assert CacheLevel(1) is CacheLevel.HOST and CacheLevel.HOST == 1
    assert CacheLevel.DISK.name == "DISK"
    assert CacheLevel.name(1) == "host" and CacheLevel.label(CacheLevel.DISK) == "disk"
    assert CacheLevel.name(7) == "7"


def test_buffer_config_is_a_deprecated_spelling_of_buffer_desc():
    with pytest.warns(DeprecationWarning, match="BufferConfig is deprecated; use kvcodec_sdk.BufferDesc"):
        old = kv.BufferConfig(3, kv.Role.KEY, 256, kv.DType.FLOAT16, 4, 8, 4)
    assert type(old) is not kv.BufferDesc and isinstance(old, kv.BufferDesc)
    new = kv.BufferDesc(layer_id=3, role=kv.BufferRole.KEY, bytes=256, dtype=kv.DataType.FLOAT16, tokens_per_page=4,
                        num_heads=8, head_dim=4)
    assert old == new and hash(old) == hash(new) and isinstance(new, kv.BufferConfig)
    assert (old.layer, old.bytes, old.shape) == (3, 256, (4, 8, 4))


def test_buffer_layout_is_a_deprecated_spelling_of_buffer_desc():
    from kvcodec_sdk.manager import BufferLayout

    with pytest.warns(DeprecationWarning, match="BufferLayout is deprecated"):
        old = BufferLayout(1, kv.Role.VALUE, 2, kv.DType.UINT8, 64, 32, (32,))
    assert old == kv.BufferDesc(1, kv.Role.VALUE, pool_index=2, byte_offset=64, bytes=32)
    assert (old.layer, old.pool, old.offset, old.shape) == (1, 2, 64, (32,))


def test_a_config_made_with_the_old_spelling_still_builds_a_manager():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        buffers = [kv.BufferConfig(0, kv.Role.KEY, 64), kv.BufferConfig(0, kv.Role.VALUE, 64)]
    m = KVCacheManager(KVCacheConfig(layer_groups=[LayerGroupConfig(buffers)], gpu_quota=1 << 12, device="cpu"))
    assert [b.byte_offset for b in m.buffer_layout(0)] == [0, 64]
    m.close()


@pytest.mark.parametrize("field", ["pool_index", "byte_offset"])
def test_a_config_buffer_leaves_placement_to_the_manager(field):
    buf = kv.BufferDesc(layer_id=0, role=kv.Role.KEY, bytes=64, **{field: 1})
    with pytest.raises(KVCacheConfigError, match=rf"layer_groups\[0\]\.buffers\[0\]\.{field} is 1; the manager places"):
        KVCacheConfig(layer_groups=[LayerGroupConfig([buf])], gpu_quota=1 << 12).validate()


def test_buffer_layout_answers_buffer_descs_with_placement_filled_in():
    m = KVCacheManager(small_config())
    layout = m.buffer_layout(0)
    assert all(type(b) is kv.BufferDesc for b in layout)
    assert [(b.layer_id, b.role, b.pool_index, b.byte_offset, b.bytes) for b in layout] == [
        (0, kv.Role.KEY, 0, 0, 64), (0, kv.Role.VALUE, 0, 64, 64), (1, kv.Role.KEY, 1, 0, 64),
        (1, kv.Role.VALUE, 1, 64, 64)]
    m.close()


def test_native_results_are_bound_structs_with_named_fields():
    m = KVCacheManager(small_config())
    core = m._live()
    info = core.lifecycle_info(0)
    assert isinstance(info, _native.kvcm.LifeCycleInfo) and not isinstance(info, tuple)
    assert info.batching_representative == 0 and info.cold_page_bytes == m.cold_page_bytes(0)
    assert all(isinstance(b, _native.BufferDesc) for b in info.buffers)
    pages = m.allocate(0, 2)
    page = core.info(int(pages.ids[0]))
    assert (page.lifecycle, page.level, page.pool_group) == (0, CacheLevel.HOT, 0)
    result = core.migrate(pages.ids, CacheLevel.HOST, 0, None)
    assert result.moved == 2 and result.dropped.dtype == np.uint64 and result.dropped.size == 0
    counts = core.slots(CacheLevel.HOST, 0)
    assert counts.num_slots - counts.free_slots == 2
    assert all(isinstance(p, _native.PoolDesc) for p in core.hot_pools(0))
    m.close()


def test_migration_records_carry_the_batching_representative():
    m = KVCacheManager(small_config())
    seen: list[MigrationRecord] = []
    m.add_migration_observer(seen.append)
    m.evict(m.allocate(0, 3))
    assert [(r.src_level, r.dst_level, r.batching_representative, r.pages) for r in seen] == [(0, 1, 0, 3)]
    assert seen[0].representative == seen[0].batching_representative  # the former name
    m.close()


def test_migration_error_has_one_name_and_keeps_the_former_one():
    from kvcodec_sdk import manager

    assert manager.MigrationFailure is MigrationError
    assert _native.kvcm.MigrationFailure is _native.kvcm.MigrationError


def test_codec_batching_representative_and_its_former_name():
    codec = kv.create_default_kv_cache_cold_page_codec()
    pool = np.zeros((4, 16), np.uint8)
    codec.configure([kv.PoolGroupDesc([kv.PoolDesc(pool.ctypes.data, 16, 4)],
                                      [kv.LifeCycleDesc(5, [kv.BufferDesc(0, kv.Role.KEY, 0, 0, 16)])])])
    assert codec.batching_representative(5) == codec.batching_layer_group_id(5) == 5
    assert codec.batching_representative(6) < 0


def test_config_crosses_as_a_bound_struct():
    native = small_config(min_hot_slots=[2], max_gpu_quota=1 << 13).to_native()
    assert isinstance(native, _native.kvcm.KvcmConfig)
    assert [b.bytes for b in native.layer_groups[0].buffers] == [64] * 4
    assert (native.gpu_quota_bytes, native.max_gpu_quota_bytes, native.min_hot_slots) == (4096, 1 << 13, [2])
    assert native.disk.path == ""  # no disk tier
