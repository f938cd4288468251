"""The disk level on the CUDA backend: the CPU round trips again with torch writing the hot pages
on a side stream (hot -> disk is ordered after those writes without any synchronization by the
caller), both concat paths, and the restart + key lookup. Skips cleanly without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from test_kvcm_support import config, group, hot_bytes

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager
from kvcodec_sdk.testing.support import cuda_test_module

torch, pytestmark = cuda_test_module()

PATHS = [{"path": "copy_engine"}, {"path": "sm"}]
GROUPS = [group([0, 1, 2], [4096, 4096]), group([3], [1024])]


def cuda_manager(path, codec=None, host_quota=64 << 20):
    disk = DiskTierConfig(str(path), max_bytes=256 << 20, container_bytes=64 << 20, io_mode="auto")
    return KVCacheManager(config(GROUPS, device="cuda:0", gpu_quota=64 << 20, host_quota=host_quota, disk=disk),
                          cold_page_codec=codec)


def write_on_stream(m, pages, stream):
    """Random bytes written by torch on ``stream``; returns page id -> expected bytes (numpy)."""
    expected = {}
    with torch.cuda.stream(stream):
        for p in pages:
            for v in m.page_view(p):
                v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, device="cuda"))
    stream.synchronize()
    for p in pages:
        expected[p.id] = hot_bytes(m, p)
    # Rewrite the same bytes on the stream so the eviction below races with pending writes.
    with torch.cuda.stream(stream):
        for p in pages:
            for v in m.page_view(p):
                v.copy_(v.clone())
    return expected


def zero_hot(m):
    for lc in range(m.num_layer_groups):
        for pool in m.hot_pool_tensors(lc):
            pool.zero_()
    torch.cuda.synchronize()


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
@pytest.mark.parametrize("host", [True, False], ids=["with_host", "no_host"])
def test_hot_disk_hot_byte_exact(tmp_path, params, host):
    m = cuda_manager(tmp_path, ("concat", params), host_quota=(64 << 20) if host else 0)
    s = torch.cuda.Stream()
    pages = m.allocate(0, 300) + m.allocate(1, 100)
    m.free(pages[1::3])
    pages = [p for i, p in enumerate(pages) if i % 3 != 1]
    expected = write_on_stream(m, pages, s)
    m.evict(pages, stream=s, level=CacheLevel.DISK)
    assert all(p.level == CacheLevel.DISK for p in pages)
    zero_hot(m)
    m.onboard(pages, stream=s, source=CacheLevel.DISK)
    s.synchronize()
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
def test_hot_host_disk_host_hot_byte_exact(tmp_path, params):
    m = cuda_manager(tmp_path, ("concat", params))
    s = torch.cuda.Stream()
    pages = m.allocate(0, 200) + m.allocate(1, 50)
    expected = write_on_stream(m, pages, s)
    m.evict(pages, stream=s)
    m.migrate(pages, CacheLevel.DISK, stream=s)
    m.synchronize()
    for g in range(m.num_pool_groups(CacheLevel.HOST)):
        m.host_pool_array(g)[:] = 0
    m.migrate(pages, CacheLevel.HOST, stream=s)
    zero_hot(m)
    m.onboard(pages, stream=s)
    s.synchronize()
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])


@pytest.mark.parametrize("legacy_busy", [False, True], ids=["idle", "legacy_stream_busy"])
def test_restart_finds_keyed_pages_and_onboards_them(tmp_path, legacy_busy):
    """With ``legacy_busy``: a new manager's device pools are cleared on the legacy stream, and
    with that stream busy an onboard on a non-blocking stream must still land after the zeros,
    not under them."""
    m = cuda_manager(tmp_path)
    s = torch.cuda.Stream()
    keys = [f"prefix-{i}".encode() for i in range(64)]
    pages = m.allocate(0, 64, keys=keys)
    expected = write_on_stream(m, pages, s)
    m.evict(pages, stream=s, level=CacheLevel.DISK)
    m.close()
    if legacy_busy:
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~100 ms on torch's default (legacy) stream
    m2 = cuda_manager(tmp_path)
    found = m2.find_on_disk(keys)
    assert all(f is not None for f in found)
    m2.onboard(found, stream=s, source=CacheLevel.DISK)
    s.synchronize()
    torch.cuda.synchronize()  # anything still queued behind the sleep has run by now
    for f, p in zip(found, pages):
        assert np.array_equal(hot_bytes(m2, f), expected[p.id])


@pytest.mark.parametrize("params", PATHS, ids=["copy_engine", "sm"])
def test_non_blocking_evict_does_not_wait_for_the_stream_and_prefetch_lands(tmp_path, params):
    """The encode waits behind a busy stream: a non-blocking evict to disk returns before the
    stream drains (the I/O thread, not the caller, waits for the encode's event), the pages land
    byte-exact, and a prefetch brings them to the host tier for an onboard from memory."""
    m = cuda_manager(tmp_path, ("concat", params))
    s = torch.cuda.Stream()
    pages = m.allocate(0, 200) + m.allocate(1, 60)
    expected = write_on_stream(m, pages, s)
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # tens of ms of GPU work ahead of the encode
    pending = m.evict(pages, stream=s, level=CacheLevel.DISK, blocking=False)
    assert not s.query(), "the caller waited for the stream"
    assert all(p.in_flight and p.level == CacheLevel.HOT for p in pages)
    r = pending.wait()
    assert r.moved == len(pages) and all(p.level == CacheLevel.DISK for p in pages)
    zero_hot(m)
    assert m.prefetch(pages).wait().moved == len(pages)
    assert all(p.level == CacheLevel.HOST for p in pages)
    m.onboard(pages, stream=s)
    s.synchronize()
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])
    assert m.prefetch_stats().used == len(pages)


def _registered(name):
    from kvcodec_sdk import list_codecs

    if name not in [s.name for s in list_codecs()]:
        pytest.skip(f"codec {name!r} is not installed")


@pytest.mark.parametrize("codec", [("concat", {"path": "sm"}), ("nvcomp-lz4", {})], ids=["concat", "nvcomp-lz4"])
def test_non_blocking_onboard_from_disk_decodes_behind_the_read(tmp_path, codec):
    """Disk -> hot with blocking=False returns before the reads land and without waiting for the
    caller's busy stream; after wait() the pages are hot and byte-exact once the stream drains.
    concat commits when its read lands (the decode queued on the stream behind the caller's
    work); nvcomp's checked decode is waited for by the I/O thread first, so a blob that did not
    decode would be dropped, never reported moved."""
    _registered(codec[0])
    m = cuda_manager(tmp_path, codec, host_quota=0)
    s = torch.cuda.Stream()
    pages = m.allocate(0, 300) + m.allocate(1, 80)
    rng = np.random.default_rng(5)
    expected = {}
    with torch.cuda.stream(s):
        for p in pages:
            for v in m.page_view(p):  # a repeating pattern per page: non-zero and compressible
                pattern = torch.from_numpy(rng.integers(1, 256, size=64, dtype=np.uint8))
                v.copy_(pattern.repeat(v.numel() // 64).view(v.shape).to("cuda", non_blocking=False))
    s.synchronize()
    for p in pages:
        expected[p.id] = hot_bytes(m, p)
    assert m.evict(pages, stream=s, level=CacheLevel.DISK).moved == len(pages)
    zero_hot(m)
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # tens of ms of GPU work ahead of the decode
    pending = m.onboard(pages, stream=s, source=CacheLevel.DISK, blocking=False)
    assert not s.query(), "the caller waited for the stream"
    assert all(p.in_flight and p.level == CacheLevel.DISK for p in pages)
    r = pending.wait()
    assert r.moved == len(pages) and not len(r.dropped) and not len(r.failed)
    assert all(p.level == CacheLevel.HOT and not p.in_flight for p in pages)
    s.synchronize()
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), expected[p.id])
    assert m.page_ring()["live_leases"] == 0 and m.in_flight_transfers() == 0
    m.close()
