"""The KV-cache manager at its boundary (CPU backend). Under several threads: every public call holds the
manager's mutex, so concurrent allocate -> write -> evict -> onboard -> check -> free cycles never
see another thread's bytes and the slot accounting stays consistent; observers that call back in
are refused with a clear error; close() waits for in-flight calls and later calls are refused.
With bad arguments: every query bounds-checks its level, pool group and lifecycle."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_kvcm_support import config, group, hot_bytes, make_test_codec

from kvcodec_sdk import CacheLevel, KVCacheManager


def _run_threads(target, n):
    errors: list[BaseException] = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("codec", ["concat", "checked"])
def test_threads_never_see_each_others_pages(codec):
    """Four threads each cycle allocate -> write -> evict -> onboard -> check -> free. Before the
    manager had a mutex this served other threads' bytes and ended with more free slots than
    slots."""
    c = make_test_codec(envelope=True, checked_decode=True) if codec == "checked" else None
    m = KVCacheManager(config([group([0, 1], [256, 128])], gpu_quota=256 * 384, host_quota=256 * 512),
                       cold_page_codec=c)
    wrong = []

    def work(t):
        rng = np.random.default_rng(t)
        for _ in range(150):
            pages = m.allocate(0, int(rng.integers(1, 12)))
            model = {}
            for p in pages:
                for v in m.page_view(p, framework="numpy"):
                    v[:] = rng.integers(0, 256, v.shape, dtype=np.uint8)
                model[p.id] = hot_bytes(m, p)
            m.evict(pages)
            r = m.onboard(pages)
            assert r.moved == len(pages) and not r.dropped
            for p in pages:
                if not np.array_equal(hot_bytes(m, p), model[p.id]):
                    wrong.append(p.id)
            m.free(pages)

    _run_threads(work, 4)
    assert not wrong, f"{len(wrong)} pages came back with other bytes"
    for level in (CacheLevel.HOT, CacheLevel.HOST):
        for total, free in m.slot_counts(level):
            assert free == total, (level, total, free)


def test_observer_calling_back_into_the_manager_is_refused():
    m = KVCacheManager(config([group([0], [64])]))
    pages = m.allocate(0, 2)
    calls = []

    def observer(rec):
        calls.append(rec)
        m.free(pages)  # would corrupt the migration in flight

    m.add_migration_observer(observer)
    with pytest.raises(RuntimeError, match="observer .* must not call the manager|from a migration observer"):
        m.evict(pages)
    assert calls and all(p.level == CacheLevel.HOST for p in pages)  # the migration itself completed
    total, free = m.slot_counts(CacheLevel.HOST)[0]
    assert total - free == 2


def test_close_waits_for_a_migration_in_flight_and_later_calls_are_refused(tmp_path):
    from kvcodec_sdk import DiskTierConfig

    cfg = config([group([0], [4096])], gpu_quota=4096 * 512, host_quota=4096 * 64,
                 disk=DiskTierConfig(str(tmp_path), max_bytes=64 << 20, container_bytes=8 << 20, io_mode="buffered"))
    m = KVCacheManager(cfg)
    pages = m.allocate(0, 400)
    core = m._live()  # a thread that took the core before close() (as a call in flight does)
    moved_once = threading.Event()
    outcome = {"rounds": 0}

    def mover():
        ids = np.asarray(pages.ids)
        try:
            while True:  # hot -> disk -> hot until the manager refuses
                core.migrate(ids, int(CacheLevel.DISK), 0, None)
                core.migrate(ids, int(CacheLevel.HOT), 0, None)
                outcome["rounds"] += 1
                moved_once.set()
        except Exception as e:  # noqa: BLE001 - inspected below
            outcome["error"] = e
            moved_once.set()

    t = threading.Thread(target=mover)
    t.start()
    moved_once.wait()
    m.close()  # waits for the migration in flight, closes the disk regions
    t.join()
    assert outcome["rounds"] >= 1 and "closed" in str(outcome["error"]), outcome
    with pytest.raises(Exception, match="closed"):
        m.allocate(0, 1)


@pytest.mark.parametrize("call,args,message", [
    ("page_bytes", (CacheLevel.DISK, 0), "which this manager does not have"),
    ("page_bytes", (9, 9), "level is 9; valid levels"),
    ("page_bytes", (0, 9), "pool_group is 9; the hot level has pool groups 0..0"),
    ("lifecycle_to_pool_group", (9,), "level is 9; valid levels"),
    ("hot_pool_tensors", (-1,), "lifecycle is -1; configured layer groups are 0..0"),
    ("num_pool_groups", (-3,), "level is -3"),
    ("stats", (7,), "level is 7"),
    ("evictable", (1, 5), "pool_group is 5; the host level"),
    ("host_pool_array", (4,), "pool_group is 4; the host level"),
    ("slot_counts", (5,), "level is 5"),
])
def test_queries_bounds_check_every_argument(call, args, message):
    """Out-of-range levels, pool groups and lifecycles raise an error naming the field and the
    valid range (before: segfaults, garbage sizes, std::bad_alloc, or the last group)."""
    m = KVCacheManager(config([group([0], [64])]))
    with pytest.raises(ValueError, match=message):
        getattr(m, call)(*args)


def test_codec_refuses_read_only_or_strided_cold_arrays():
    """encode() writes through the cold array's address: a read-only or reversed-stride view
    would be written through (before: silently)."""
    from kvcodec_sdk import LifeCycleDesc, PoolDesc, PoolGroupDesc, create_codec

    hot = np.arange(4 * 64, dtype=np.uint8)
    with create_codec("concat", device="cpu") as codec:
        codec.configure([PoolGroupDesc([PoolDesc(hot.ctypes.data, 64, 4)], [LifeCycleDesc(0)])])
        pairs = np.array([[0, 1]], np.int32)
        frozen = np.zeros(4 * 64, np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            codec.encode(0, frozen, pairs)
        with pytest.raises(ValueError, match="not C-contiguous"):
            codec.encode(0, np.zeros(4 * 64, np.uint8)[::-1], pairs)
        with pytest.raises(ValueError, match="not C-contiguous"):
            codec.decode(0, np.zeros(8 * 64, np.uint8)[::2], np.array([[1, 0]], np.int32))
        cold = np.zeros(4 * 64, np.uint8)
        codec.encode(0, cold, pairs)
        assert np.array_equal(cold[:64], hot[64:128])


@pytest.mark.parametrize("field,value,message", [
    ("pool_ratio", 5, r"pool_ratio is 5; it must be a sequence"),
    ("layer", 2**31, r"layer_id is 2147483648; it must be at most 2147483647"),
    ("host_quota", 2**64, r"host_quota is 18446744073709551616; it must be at most"),
])
def test_config_values_outside_the_native_range_name_the_field(field, value, message):
    from kvcodec_sdk import BufferDesc, KVCacheConfig, KVCacheConfigError, LayerGroupConfig, Role

    layer = value if field == "layer" else 0
    kw = {"pool_ratio": value} if field == "pool_ratio" else {"host_quota": value} if field == "host_quota" else {}
    with pytest.raises(KVCacheConfigError, match=message):
        KVCacheConfig(layer_groups=[LayerGroupConfig([BufferDesc(layer, Role.KEY, bytes=64)])], gpu_quota=1 << 16,
                      device="cpu", **kw).validate()


def test_raw_page_ids_of_one_manager_are_refused_by_another():
    """Page ids start at a random generation per manager: a raw id array of one manager names no
    page of another (before: it acted on the other manager's page in the same table slot)."""
    from kvcodec_sdk.manager import StalePageError

    a = KVCacheManager(config([group([0], [64])]))
    b = KVCacheManager(config([group([0], [64])]))
    pa, pb = a.allocate(0, 4), b.allocate(0, 4)
    with pytest.raises(StalePageError, match="not a page of this manager"):
        b.free(np.asarray(pa.ids))
    with pytest.raises(StalePageError, match="not a page of this manager"):
        b.evict(np.asarray(pa.ids))
    assert all(p.level == CacheLevel.HOT for p in pb)
    a.free(pa)
    with pytest.raises(StalePageError, match="stale"):
        a.free(np.asarray(pa.ids))  # this manager's own freed ids are recognized as stale


def test_a_host_view_taken_before_a_host_resize_stays_readable():
    """A host_pool_array view holds its pool's memory: after resize(HOST) replaced the pool it
    shows the old pool as of the resize (before: it read freed memory)."""
    import gc

    m = KVCacheManager(config([group([0], [4096])], gpu_quota=4096 * 64, host_quota=4096 * 8))
    pages = m.allocate(0, 4)
    for i, p in enumerate(pages):
        m.page_view(p, framework="numpy")[0][:] = i + 1
    m.evict(pages)
    m.synchronize()
    old = m.host_pool_array(0)
    snapshot = old.copy()
    m.resize(CacheLevel.HOST, 4096 * 64)
    # Churn the allocator so freed memory would be reused and overwritten.
    junk = [np.full(1 << 16, 0xAB, np.uint8) for _ in range(64)]
    gc.collect()
    assert np.array_equal(old, snapshot)
    new = m.host_pool_array(0)
    assert new.shape[0] > old.shape[0]
    for p in pages:
        assert np.array_equal(new[p.slot], snapshot[p.slot])
    del junk
