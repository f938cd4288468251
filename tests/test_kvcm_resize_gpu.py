"""Resize and defragmentation on the CUDA backend: pages written on a side stream (by cuda-python
alone and by torch: gpu_kit) are
compacted, then moved by a hot shrink and a host shrink, all ordered on that stream without a host
synchronization in between; contents and handles survive; the disk level shrinks, grows and
defragments between an eviction and an onboard on a side stream. Skips cleanly without a CUDA
device and cuda-python."""

from __future__ import annotations

import numpy as np
from test_kvcm_support import config, group, hot_bytes

from kvcodec_sdk import CacheLevel, KVCacheManager
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()


def fill_on_stream(kit, m, pages, stream):
    """Page i's bytes become i % 251 + 1, written on ``stream`` (not synchronized)."""
    for i, p in enumerate(pages):
        for v in m.page_view(p, framework=kit.framework):
            kit.fill(v, i % 251 + 1, stream)


def test_shrink_and_defragment_after_side_stream_writes(kit):
    page = 4096
    m = KVCacheManager(config([group([0], [3072, 1024])], gpu_quota=page * 64, host_quota=page * 64,
                              max_gpu_quota=page * 96, device="cuda:0"))
    s = kit.stream()
    pages = m.allocate(0, 64, stream=s)
    fill_on_stream(kit, m, pages, s)
    m.free(pages[::2])
    keep = list(pages[1::2])  # slots 1, 3, ..., 63
    assert m.defragment(CacheLevel.HOT, stream=s) == 16
    assert sorted(p.slot for p in keep) == list(range(32))
    m.resize(CacheLevel.HOT, page * 96, stream=s)  # grow within the reserve
    more = m.allocate(0, 64, stream=s)
    m.free(more)
    m.free(keep[:16])  # survivors now sit in scattered slots below 32
    m.resize(CacheLevel.HOT, page * 8, stream=s)  # 16 pages, 8 slots: 8 evicted, 8 moved
    assert m.slot_counts(CacheLevel.HOT) == [(8, 0)]
    m.resize(CacheLevel.HOST, page * 4, stream=s)  # 8 on the host, 4 slots: 4 dropped (last level)
    kit.sync(s)
    index = {p.id: i for i, p in enumerate(pages)}
    live = [p for p in keep[16:] if p.is_live]
    assert len(live) == 12
    for p in live:
        i = index[p.id]
        if p.level == CacheLevel.HOT:
            assert np.all(hot_bytes(m, p) == i % 251 + 1)
        else:
            assert np.all(np.asarray(m.page_view(p)[0]) == i % 251 + 1)
    m.close()


def test_disk_shrink_grow_and_defragment_after_side_stream_writes(kit, tmp_path):
    # Pages written on a side stream go hot -> disk (encode into the pinned ring on that
    # stream), then the disk level shrinks (journaled blob moves), grows and defragments; the
    # onboard on the stream must return the side-stream bytes.
    from kvcodec_sdk import DiskTierConfig

    page = 4096
    disk = DiskTierConfig(str(tmp_path), max_bytes=32 * 4 * page, container_bytes=4 * page, io_mode="buffered")
    m = KVCacheManager(config([group([0], [3072, 1024])], gpu_quota=page * 64, host_quota=0, disk=disk,
                              device="cuda:0"))
    try:
        s = kit.stream()
        pages = m.allocate(0, 48, stream=s)
        fill_on_stream(kit, m, pages, s)
        m.evict(pages, level=CacheLevel.DISK, stream=s)
        m.free(pages[::2])
        keep = list(pages[1::2])  # 24 pages spread over 48 slots
        m.resize(CacheLevel.DISK, 8 * 4 * page, stream=s)  # 32 slots: moves, no drops
        assert m.slot_counts(CacheLevel.DISK) == [(32, 8)]
        m.resize(CacheLevel.DISK, 16 * 4 * page, stream=s)
        m.free(keep[:8])
        m.defragment(CacheLevel.DISK, stream=s)
        rest = keep[8:]
        assert sorted(p.slot for p in rest) == list(range(16))
        assert sum(st.drops for st in m.stats(CacheLevel.DISK)) == 0
        m.onboard(rest, source=CacheLevel.DISK, stream=s)
        kit.sync(s)
        index = {p.id: i for i, p in enumerate(pages)}
        for p in rest:
            assert np.all(hot_bytes(m, p) == index[p.id] % 251 + 1)
    finally:
        m.close()
