"""Run-time resize per level and defragmentation of the KV-cache manager (CPU backend): shrinks
that move pages, shrinks that evict, impossible shrinks that change nothing, growth (hot within
the max_gpu_quota reserve, host by reallocation), and compaction that keeps contents and handles."""

from __future__ import annotations

import numpy as np
import pytest
from test_kvcm_support import config, expected_blob, group, hot_bytes, make_test_codec, write_random

from kvcodec_sdk import CacheLevel, KVCacheConfigError, KVCacheManager
from kvcodec_sdk.manager import CapacityError, PageHandle

ONE = [group([0], [48, 16])]  # one hot pool group of 64-byte pages (two pools)
TWO = [group([0], [64]), group([1], [32])]


def snapshot(m, pages):
    return [(p.id, p.level, p.slot) for p in pages]


def assert_hot_intact(m, model):
    m.synchronize()
    for pid, content in model.items():
        p = PageHandle(m, pid)
        assert p.level == CacheLevel.HOT
        assert np.array_equal(hot_bytes(m, p), content), f"page {pid:#x} differs"


def test_hot_shrink_moves_the_pages_beyond_the_new_count(rng):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 8, host_quota=64 * 8))
    pages = m.allocate(0, 8)
    model = write_random(m, pages, rng)
    m.free(pages[:5])  # the survivors sit in slots 5, 6, 7: all beyond a 4-slot pool
    keep = pages[5:]
    assert sorted(p.slot for p in keep) == [5, 6, 7]
    moved_before = m.stats(CacheLevel.HOT)[0].pages_copied
    m.resize(CacheLevel.HOT, 64 * 4)
    assert m.slot_counts(CacheLevel.HOT) == [(4, 1)]
    assert m.quota(CacheLevel.HOT) == 64 * 4
    assert all(p.slot < 4 and p.level == CacheLevel.HOT for p in keep)
    assert m.stats(CacheLevel.HOT)[0].pages_copied - moved_before == 3  # hot -> hot copies
    assert all(m.level_stats(CacheLevel.HOT)[0][k] == 0 for k in ("evictions", "drops"))
    assert_hot_intact(m, {p.id: model[p.id] for p in keep})
    # The shrunk pool hands out only slots below the new count.
    extra = m.allocate(0, 1)
    assert extra[0].slot < 4
    with pytest.raises(CapacityError):
        m.make_room(CacheLevel.HOT, 0, 5)


def test_shrink_that_needs_evictions_moves_the_least_recently_used_colder(rng):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 6, host_quota=64 * 8))
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    m.touch(pages[3:])  # pages[0..2] are the least recently used
    m.resize(CacheLevel.HOT, 64 * 4)
    assert [p.level for p in pages] == [CacheLevel.HOST] * 2 + [CacheLevel.HOT] * 4
    assert m.level_stats(CacheLevel.HOT)[0]["evictions"] == 2
    assert all(p.slot < 4 for p in pages[2:])
    assert_hot_intact(m, {p.id: model[p.id] for p in pages[2:]})
    # The evicted pages are intact on the host and come back byte-exact after room is made.
    m.free(pages[2:4])
    m.onboard(pages[:2])
    assert_hot_intact(m, {p.id: model[p.id] for p in list(pages[:2]) + list(pages[4:])})


def test_impossible_shrink_raises_and_changes_nothing(rng):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 6, host_quota=64 * 8))
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    m.pin(pages[:4])
    m.free(pages[4:])
    before = (snapshot(m, pages[:4]), m.slot_counts(CacheLevel.HOT), m.quota(CacheLevel.HOT))
    with pytest.raises(CapacityError, match=r"pool group 0 would have 3 slots but holds 4 pages of which only 0 "
                                            r"are evictable.*nothing was changed"):
        m.resize(CacheLevel.HOT, 64 * 3)
    assert (snapshot(m, pages[:4]), m.slot_counts(CacheLevel.HOT), m.quota(CacheLevel.HOT)) == before
    assert_hot_intact(m, {p.id: model[p.id] for p in pages[:4]})
    # Pinned pages are relocated (pins prevent eviction, not moves) when they fit.
    m.resize(CacheLevel.HOT, 64 * 4)
    assert all(p.slot < 4 for p in pages[:4]) and m.slot_counts(CacheLevel.HOT) == [(4, 0)]
    assert_hot_intact(m, {p.id: model[p.id] for p in pages[:4]})


@pytest.mark.parametrize(
    "level, quota, error, message",
    [
        (CacheLevel.HOT, 64 * 9, ValueError, r"hot pool group 0 would need 9 slots but its pools were reserved for 8"),
        (CacheLevel.HOT, 0, ValueError, r"quota_bytes is 0; a level's quota must be positive"),
        (CacheLevel.HOT, 63, ValueError, r"quota_bytes is 63: hot pool group 0 .* gets less than one page"),
        (CacheLevel.HOST, -1, ValueError, r"quota_bytes is -1; it must be a positive integer"),
        (5, 64, ValueError, r"level is 5; valid levels"),
    ],
    ids=["above-reserve", "zero", "below-one-page", "negative", "bad-level"],
)
def test_resize_errors_name_the_value(level, quota, error, message):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 4, host_quota=64 * 8, max_gpu_quota=64 * 8))
    with pytest.raises(error, match=message):
        m.resize(level, quota)
    assert m.slot_counts(CacheLevel.HOT) == [(4, 4)]


def test_max_gpu_quota_is_validated():
    with pytest.raises(KVCacheConfigError, match=r"KVCacheConfig.max_gpu_quota is 100; it must be at least gpu_quota \(256\)"):
        KVCacheManager(config(ONE, gpu_quota=256, max_gpu_quota=100))


def test_hot_grows_within_the_reserve_without_moving_the_pools(rng):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 4, host_quota=64 * 8, max_gpu_quota=64 * 10))
    assert m.hot_capacity_slots(0) == 10 and m.slot_counts(CacheLevel.HOT) == [(4, 4)]
    views = m.hot_pool_tensors(0, framework="numpy")
    bases = [v.__array_interface__["data"][0] for v in views]
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    m.resize(CacheLevel.HOT, 64 * 10)
    assert m.slot_counts(CacheLevel.HOT) == [(10, 6)]
    more = m.allocate(0, 6)  # no eviction: the new slots are usable
    assert sorted(p.slot for p in more) == list(range(4, 10))
    assert m.level_stats(CacheLevel.HOT)[0]["evictions"] == 0
    assert [v.__array_interface__["data"][0] for v in m.hot_pool_tensors(0, framework="numpy")] == bases
    assert_hot_intact(m, model)


def test_hot_resize_follows_the_construction_projection_with_floors():
    # Hot groups of 64 and 32 bytes, ratio 1:1, floor 6 slots for layer group 1. At 64*6 bytes:
    # shares 192 / 192 -> 3 and 6 slots (floor met). At 64*4: shares 128 / 128 -> 2 and 4 < 6, so
    # group 1 is clamped to 6 (192 bytes) and group 0 gets the rest, 64 bytes = 1 slot.
    m = KVCacheManager(config(TWO, gpu_quota=64 * 6, host_quota=64 * 8, min_hot_slots=[0, 6], max_gpu_quota=64 * 6))
    assert [c for c, _ in m.slot_counts(CacheLevel.HOT)] == [3, 6]
    m.resize(CacheLevel.HOT, 64 * 4)
    assert [c for c, _ in m.slot_counts(CacheLevel.HOT)] == [1, 6]
    with pytest.raises(ValueError, match=r"config.minHotSlots needs 192 hot bytes but quota_bytes is 100: short by 92"):
        m.resize(CacheLevel.HOT, 100)
    assert [c for c, _ in m.slot_counts(CacheLevel.HOT)] == [1, 6]
    # Cold levels ignore the floors: a resize splits by the pool ratio alone.
    host_before = [c for c, _ in m.slot_counts(CacheLevel.HOST)]
    m.resize(CacheLevel.HOST, 64 * 16)
    assert [c for c, _ in m.slot_counts(CacheLevel.HOST)] == [2 * c for c in host_before]


@pytest.mark.parametrize("codec", ["concat", "test"])
def test_host_grow_and_shrink_keep_the_blobs(rng, codec):
    c = make_test_codec(pad="0:16") if codec == "test" else None
    m = KVCacheManager(config(ONE, gpu_quota=64 * 8, host_quota=64 * 4), cold_page_codec=c)
    blob = m.page_bytes(CacheLevel.HOST, 0)
    m.resize(CacheLevel.HOST, blob * 4)
    assert m.slot_counts(CacheLevel.HOST) == [(4, 4)]
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    m.evict(pages)
    m.resize(CacheLevel.HOST, blob * 8)  # grow: a new, larger pool
    assert m.slot_counts(CacheLevel.HOST) == [(8, 4)]
    m.free(pages[:2])  # survivors in slots 2, 3
    m.synchronize()
    for p in pages[2:]:
        assert np.array_equal(np.asarray(m.page_view(p)[0]), expected_blob(m, 0, model[p.id], codec))
    more = m.allocate(0, 4)
    model.update(write_random(m, more, rng))
    m.evict(more)  # slots 0, 1, 4, 5
    m.free(more[:2])
    survivors = list(pages[2:]) + list(more[2:])
    assert max(p.slot for p in survivors) >= 4
    m.resize(CacheLevel.HOST, blob * 4)  # shrink: blobs beyond slot 3 are copied below it
    assert m.slot_counts(CacheLevel.HOST) == [(4, 0)]
    assert all(p.level == CacheLevel.HOST and p.slot < 4 for p in survivors)
    assert m.stats(CacheLevel.HOST)[0].pages_copied >= 1
    m.synchronize()
    for p in survivors:
        assert np.array_equal(np.asarray(m.page_view(p)[0]), expected_blob(m, 0, model[p.id], codec))
    m.onboard(survivors)
    assert_hot_intact(m, {p.id: model[p.id] for p in survivors})


def test_host_shrink_below_use_drops_at_the_last_level(rng):
    m = KVCacheManager(config(ONE, gpu_quota=64 * 8, host_quota=64 * 6))
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    m.evict(pages)
    m.touch(pages[2:])
    m.resize(CacheLevel.HOST, 64 * 4)
    assert [p.is_live for p in pages] == [False, False, True, True, True, True]
    assert m.level_stats(CacheLevel.HOST)[0]["drops"] == 2
    m.onboard(pages[2:])
    assert_hot_intact(m, {p.id: model[p.id] for p in pages[2:]})


def test_defragment_compacts_to_a_prefix_with_the_same_handles_and_bytes(rng):
    m = KVCacheManager(config(TWO, gpu_quota=64 * 8 + 32 * 8, host_quota=64 * 16, pool_ratio=[2, 1]))
    a = m.allocate(0, 8)
    b = m.allocate(1, 8)
    model = write_random(m, list(a) + list(b), rng)
    m.free([a[i] for i in (0, 2, 3, 5)] + [b[i] for i in (1, 4)])
    keep = [a[i] for i in (1, 4, 6, 7)] + [b[i] for i in (0, 2, 3, 5, 6, 7)]
    ids = [p.id for p in keep]
    moved = m.defragment(CacheLevel.HOT)
    assert moved == 3 + 2  # a: slots 4, 6, 7 -> below 4; b: slots 6, 7 -> below 6
    assert sorted(p.slot for p in keep[:4]) == [0, 1, 2, 3]
    assert sorted(p.slot for p in keep[4:]) == [0, 1, 2, 3, 4, 5]
    assert [p.id for p in keep] == ids and all(p.is_live for p in keep)
    assert_hot_intact(m, {p.id: model[p.id] for p in keep})
    assert m.defragment(CacheLevel.HOT) == 0  # already compact
    # Freed slots are handed out lowest first after a compaction.
    assert [p.slot for p in m.allocate(0, 2)] == [4, 5]
    # The host level compacts the same way (raw blob copies).
    m.evict(keep)
    m.free([keep[0], keep[5]])
    rest = [p for p in keep if p.id not in (keep[0].id, keep[5].id)]
    m.defragment(CacheLevel.HOST)
    for g in range(m.num_pool_groups(CacheLevel.HOST)):
        slots = sorted(p.slot for p in rest if p.pool_group == g)
        assert slots == list(range(len(slots)))
    m.onboard(rest)
    assert_hot_intact(m, {p.id: model[p.id] for p in rest})
