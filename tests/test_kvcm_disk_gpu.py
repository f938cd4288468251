"""The disk level on the CUDA backend: the CPU round trips again with the hot pages written on a
side stream (by cuda-python alone and by torch: gpu_kit; hot -> disk is ordered after those writes
without any synchronization by the caller), both concat paths, and the restart + key lookup. Skips
cleanly without a CUDA device and cuda-python."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_kit import LEGACY_STREAM
from test_kvcm_support import config, group, hot_bytes

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()

PATHS = [{"path": "copy_engine"}, {"path": "sm"}]
GROUPS = [group([0, 1, 2], [4096, 4096]), group([3], [1024])]


def cuda_manager(path, codec=None, host_quota=64 << 20):
    disk = DiskTierConfig(str(path), max_bytes=256 << 20, container_bytes=64 << 20, io_mode="auto")
    return KVCacheManager(config(GROUPS, device="cuda:0", gpu_quota=64 << 20, host_quota=host_quota, disk=disk),
                          cold_page_codec=codec)


def write_on_stream(kit, m, pages, stream, seed=0):
    """Random bytes written on ``stream``, not synchronized: the eviction that follows races with
    pending writes. Returns page id -> expected bytes (numpy)."""
    rng = np.random.default_rng(seed)
    expected = {}
    for p in pages:
        parts = []
        for v in m.page_view(p, framework=kit.framework):
            data = rng.integers(0, 256, tuple(v.shape), dtype=np.uint8)
            kit.write(v, data, stream)
            parts.append(data.reshape(-1))
        expected[p.id] = np.concatenate(parts)
    return expected


def zero_hot(kit, m):
    for lc in range(m.num_layer_groups):
        kit.zero_pools(m.hot_pool_tensors(lc, framework=kit.framework))
    kit.sync()


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
@pytest.mark.parametrize("host", [True, False], ids=["with_host", "no_host"])
def test_hot_disk_hot_byte_exact(kit, tmp_path, params, host):
    m = cuda_manager(tmp_path, ("concat", params), host_quota=(64 << 20) if host else 0)
    s = kit.stream()
    pages = m.allocate(0, 300) + m.allocate(1, 100)
    m.free(pages[1::3])
    pages = [p for i, p in enumerate(pages) if i % 3 != 1]
    expected = write_on_stream(kit, m, pages, s)
    m.evict(pages, stream=s, level=CacheLevel.DISK)
    assert all(p.level == CacheLevel.DISK for p in pages)
    zero_hot(kit, m)
    m.onboard(pages, stream=s, source=CacheLevel.DISK)
    kit.sync(s)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
def test_hot_host_disk_host_hot_byte_exact(kit, tmp_path, params):
    m = cuda_manager(tmp_path, ("concat", params))
    s = kit.stream()
    pages = m.allocate(0, 200) + m.allocate(1, 50)
    expected = write_on_stream(kit, m, pages, s)
    m.evict(pages, stream=s)
    m.migrate(pages, CacheLevel.DISK, stream=s)
    m.synchronize()
    for g in range(m.num_pool_groups(CacheLevel.HOST)):
        m.host_pool_array(g)[:] = 0
    m.migrate(pages, CacheLevel.HOST, stream=s)
    zero_hot(kit, m)
    m.onboard(pages, stream=s)
    kit.sync(s)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])


@pytest.mark.parametrize("legacy_busy", [False, True], ids=["idle", "legacy_stream_busy"])
def test_restart_finds_keyed_pages_and_onboards_them(kit, tmp_path, legacy_busy):
    """With ``legacy_busy``: a new manager's device pools are cleared on the legacy stream, and
    with that stream busy an onboard on a non-blocking stream must still land after the zeros,
    not under them."""
    m = cuda_manager(tmp_path)
    s = kit.stream()
    keys = [f"prefix-{i}".encode() for i in range(64)]
    pages = m.allocate(0, 64, keys=keys)
    expected = write_on_stream(kit, m, pages, s)
    m.evict(pages, stream=s, level=CacheLevel.DISK)
    m.close()
    if legacy_busy:
        kit.sync()
        kit.delay(LEGACY_STREAM, 0.1)  # ~100 ms on the legacy default stream
    m2 = cuda_manager(tmp_path)
    found = m2.find_on_disk(keys)
    assert all(f is not None for f in found)
    m2.onboard(found, stream=s, source=CacheLevel.DISK)
    kit.sync(s)
    kit.sync()  # anything still queued behind the delay has run by now
    for f, p in zip(found, pages):
        assert np.array_equal(hot_bytes(m2, f), expected[p.id])


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
def test_non_blocking_evict_does_not_wait_for_the_stream_and_prefetch_lands(kit, tmp_path, params):
    """The encode waits behind a busy stream: a non-blocking evict to disk returns before the
    stream drains (the I/O thread, not the caller, waits for the encode's event), the pages land
    byte-exact, and a prefetch brings them to the host tier for an onboard from memory."""
    m = cuda_manager(tmp_path, ("concat", params))
    s = kit.stream()
    pages = m.allocate(0, 200) + m.allocate(1, 60)
    expected = write_on_stream(kit, m, pages, s)
    kit.delay(s, 0.05)  # tens of ms of GPU work ahead of the encode
    pending = m.evict(pages, stream=s, level=CacheLevel.DISK, blocking=False)
    assert not kit.idle(s), "the caller waited for the stream"
    assert all(p.in_flight and p.level == CacheLevel.HOT for p in pages)
    r = pending.wait()
    assert r.moved == len(pages) and all(p.level == CacheLevel.DISK for p in pages)
    zero_hot(kit, m)
    assert m.prefetch(pages).wait().moved == len(pages)
    assert all(p.level == CacheLevel.HOST for p in pages)
    m.onboard(pages, stream=s)
    kit.sync(s)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])
    assert m.prefetch_stats().used == len(pages)


def _registered(name):
    from kvcodec_sdk import list_codecs

    if name not in [s.name for s in list_codecs()]:
        pytest.skip(f"codec {name!r} is not installed")


@pytest.mark.parametrize("codec", [("concat", {"path": "sm"}), ("nvcomp-lz4", {})], ids=["concat", "nvcomp-lz4"])
def test_non_blocking_onboard_from_disk_decodes_behind_the_read(kit, tmp_path, codec):
    """Disk -> hot with blocking=False returns before the reads land and without waiting for the
    caller's busy stream; after wait() the pages are hot and byte-exact once the stream drains.
    concat commits when its read lands (the decode queued on the stream behind the caller's
    work); nvcomp's checked decode is waited for by the I/O thread first, so a blob that did not
    decode would be dropped, never reported moved."""
    _registered(codec[0])
    m = cuda_manager(tmp_path, codec, host_quota=0)
    s = kit.stream()
    pages = m.allocate(0, 300) + m.allocate(1, 80)
    rng = np.random.default_rng(5)
    expected = {}
    for p in pages:
        parts = []
        for v in m.page_view(p, framework=kit.framework):  # a repeating pattern per page: non-zero, compressible
            pattern = rng.integers(1, 256, size=64, dtype=np.uint8)
            data = np.tile(pattern, v.shape[0] // 64)
            kit.write(v, data, s)
            parts.append(data)
        expected[p.id] = np.concatenate(parts)
    kit.sync(s)
    assert m.evict(pages, stream=s, level=CacheLevel.DISK).moved == len(pages)
    zero_hot(kit, m)
    kit.delay(s, 0.05)  # tens of ms of GPU work ahead of the decode
    pending = m.onboard(pages, stream=s, source=CacheLevel.DISK, blocking=False)
    assert not kit.idle(s), "the caller waited for the stream"
    assert all(p.in_flight and p.level == CacheLevel.DISK for p in pages)
    r = pending.wait()
    assert r.moved == len(pages) and not len(r.dropped) and not len(r.failed)
    assert all(p.level == CacheLevel.HOT and not p.in_flight for p in pages)
    kit.sync(s)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])
    assert m.page_ring()["live_leases"] == 0 and m.in_flight_transfers() == 0
    m.close()


def test_evictions_beyond_the_page_ring_encode_later_on_the_call_stream(kit, tmp_path):
    """No host tier and three calls of 32 pages of 1 MiB behind a busy stream: the 64 MiB page ring
    holds two of their slices, so the third call's job waits for one with its encode (submitted
    on the call's stream once a slice frees) and the call returns at once; every page lands
    byte-exact."""
    disk = DiskTierConfig(str(tmp_path), max_bytes=256 << 20, container_bytes=64 << 20, io_mode="auto")
    m = KVCacheManager(config([group([0], [1 << 20])], device="cuda:0", gpu_quota=97 << 20, host_quota=0,
                              disk=disk))
    s = kit.stream()
    pages = m.allocate(0, 96)
    expected = write_on_stream(kit, m, pages, s)
    kit.delay(s, 0.05)  # the first encodes wait behind tens of ms of GPU work
    handles = [m.evict(pages[i:i + 32], stream=s, level=CacheLevel.DISK, blocking=False) for i in (0, 32, 64)]
    assert not kit.idle(s), "the caller waited for the stream"
    assert m.page_ring()["live_leases"] == 2  # the third job holds no slice yet
    assert all(p.in_flight and p.level == CacheLevel.HOT for p in pages)
    assert [h.wait().moved for h in handles] == [32, 32, 32]
    assert m.page_ring()["live_leases"] == 0
    zero_hot(kit, m)
    m.onboard(pages, stream=s, source=CacheLevel.DISK)
    kit.sync(s)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])
    m.close()
