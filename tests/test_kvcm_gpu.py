"""The KV-cache manager on the CUDA backend: pages written on a stream, evictions on the same
stream see the writes, the concat copy-engine and SM (device-index ring) paths, chunking, and
randomized sequences checked against a model. The writes come from cuda-python alone (the pools as
kvcodec_sdk.gpu.DeviceArray) and from torch (tensors): see gpu_kit. Skips cleanly without a CUDA
device and cuda-python; the torch variants also without torch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kvcm_support import config, group, hot_bytes, make_test_codec, to_numpy, write_random

import kvcodec_sdk as kv
from kvcodec_sdk import CacheLevel, KVCacheManager, _native
from kvcodec_sdk.errors import CodecConsumedError
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()

PATHS = [{"path": "copy_engine"}, {"path": "sm"}, {"path": "copy_engine", "copy_api": "per_copy"}, {}]
PATH_IDS = ["copy_engine", "sm", "per_copy", "auto"]


def cuda_manager(groups, codec=None, **kw):
    return KVCacheManager(config(groups, device="cuda:0", **kw), cold_page_codec=codec)


def scattered(m, lifecycle, n):
    """``n`` hot pages in non-contiguous slots."""
    pages = m.allocate(lifecycle, 2 * n)
    m.free(pages[1::2])
    return pages[::2]


def pool_rows(pools, slots) -> np.ndarray:
    """The bytes of hot ``slots`` across ``pools``, one row per slot (a host copy)."""
    return np.concatenate([np.stack([to_numpy(pool[s]) for s in slots]) for pool in pools], axis=1)


@pytest.mark.parametrize("params", PATHS, ids=PATH_IDS)
def test_stream_writes_evict_onboard_byte_exact(kit, params):
    m = cuda_manager([group([0, 1, 2], [4096, 4096]), group([3], [1024])], ("concat", params),
                     gpu_quota=64 << 20, host_quota=64 << 20)
    s = kit.stream()
    rng = np.random.default_rng(1)
    for lc in (0, 1):
        pages = scattered(m, lc, 300)
        pools = m.hot_pool_tensors(lc, framework=kit.framework)
        slots = [p.slot for p in pages]
        expected = []
        for pool in pools:
            data = rng.integers(0, 256, (len(pages), pool.shape[1]), dtype=np.uint8)
            for row, slot in zip(data, slots):
                kit.write(pool[slot], row, s)
            expected.append(data)
        expected = np.concatenate(expected, axis=1)
        m.evict(pages, stream=s)  # same stream as the writes, no synchronization in between
        m.synchronize()
        group_ = m.lifecycle_to_pool_group(CacheLevel.HOST)[lc]
        host = m.host_pool_array(group_)
        kit.sync(s)
        assert np.array_equal(host[[p.slot for p in pages]], expected)  # the pages' host slots now
        kit.zero_pools(pools)
        m.onboard(pages, stream=s)
        m.synchronize()
        assert np.array_equal(pool_rows(pools, [p.slot for p in pages]), expected)


def test_kernel_write_then_immediate_eviction_sees_the_write(kit):
    m = cuda_manager([group([0], [1 << 20])], gpu_quota=8 << 20, host_quota=8 << 20)
    s = kit.stream()
    pages = m.allocate(0, 4, stream=s)
    pool = m.hot_pool_tensors(0, framework=kit.framework)[0]
    kit.zero_pools([pool])
    kit.delay(s, 0.05)  # the writes land long after the eviction is submitted
    for i, p in enumerate(pages):
        kit.fill(pool[p.slot], i + 1, s)
    m.evict(pages, stream=s)
    m.synchronize()
    host = m.host_pool_array(0)
    for i, p in enumerate(pages):
        assert (host[p.slot] == i + 1).all()


def test_sm_path_uploads_device_indices_through_the_ring_and_chunks(kit):
    n = _native.kvcm.MAX_PAIRS_PER_CALL + 808
    m = cuda_manager([group([0], [64, 64])], ("concat", {"path": "sm"}), gpu_quota=128 * (n + 8),
                     host_quota=128 * (n + 8), index_ring_bytes=96 * 1024)
    assert m.page_index_location(0) == kv.PageIndexLocation.DEVICE
    assert m.index_ring() is None
    pages = m.allocate(0, n)
    pool = m.hot_pool_tensors(0, framework=kit.framework)[0]
    s = kit.stream()
    kit.write(pool, np.random.default_rng(2).integers(0, 256, tuple(pool.shape), dtype=np.uint8), s)
    kit.sync(s)
    before = to_numpy(pool)[[p.slot for p in pages]]
    m.evict(pages)
    ring = m.index_ring()
    assert ring is not None and ring["capacity"] == 96 * 1024 and ring["live_leases"] == 0
    assert m.stats(CacheLevel.HOT)[0].codec_calls >= 2
    kit.zero_pools([pool])
    m.onboard(pages)
    m.synchronize()
    assert np.array_equal(to_numpy(pool)[[p.slot for p in pages]], before)  # page i back in its new slot


def test_sm_path_round_trip_is_byte_exact_per_page():
    m = cuda_manager([group([0, 1], [256])], ("concat", {"path": "sm"}), gpu_quota=1 << 20, host_quota=1 << 20,
                     index_ring_bytes=512)
    pages = scattered(m, 0, 200)
    model = write_random(m, pages, np.random.default_rng(3))
    m.evict(pages)
    m.onboard(pages)
    m.synchronize()
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), model[p.id])


def test_a_cpu_codec_is_rejected_by_a_cuda_manager_and_still_consumed():
    codec = make_test_codec()
    with pytest.raises(ValueError, match="created for device cpu but the manager runs on cuda:0"):
        cuda_manager([group([0], [64])], codec)
    assert codec.consumed
    with pytest.raises(CodecConsumedError):
        codec.cold_page_bytes(0)


def test_device_auto_follows_the_codec():
    codec = kv.create_codec("concat", device="cuda:0")
    m = KVCacheManager(config([group([0], [64])], device="auto"), cold_page_codec=codec)
    assert m.device == "cuda:0"


@pytest.mark.parametrize("params", [{"path": "copy_engine"}, {"path": "sm"}], ids=["copy_engine", "sm"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(__import__("test_kvcm_migration").op, min_size=1, max_size=20), seed=st.integers(0, 2**32 - 1))
def test_random_migration_sequences_on_the_gpu(params, ops, seed):
    from test_kvcm_migration import GROUPS, run_sequence

    # Explicit migrations only, as in the CPU version: with automatic eviction an allocation under
    # pressure may drop pages the model still holds.
    m = cuda_manager(GROUPS, ("concat", params), gpu_quota=64 * 40 * 2, host_quota=64 * 50, index_ring_bytes=64,
                     auto_evict=False)
    run_sequence(m, ops, "concat", np.random.default_rng(seed))
