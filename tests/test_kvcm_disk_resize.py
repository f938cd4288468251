"""Run-time resize and defragmentation of the manager's disk level (CPU backend): the quota
splits per cold pool group like the host level's, moves keep page identity and bytes, a shrink
drops least-recently-used pages at the disk level only (counted), the new quota and the moved
pages survive a restart, and an injected I/O error mid-shrink leaves the old quota working."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from test_kvcm_support import config, group, hot_bytes, write_random

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager
from kvcodec_sdk.disk import DiskIoError, DiskRegion
from kvcodec_sdk.manager import CapacityError

GROUPS = [group([0, 1], [64, 32]), group([2], [48])]  # lifecycle = cold pool group (192- and 48-byte pages)
CONTAINER = 4 * 4096  # four slots per container file (slots are padded to 4 KiB)


def disk_config(path, max_bytes=16 * CONTAINER, **disk):
    disk.setdefault("io_mode", "buffered")
    return config(GROUPS, gpu_quota=1 << 16, host_quota=1 << 14,
                  disk=DiskTierConfig(str(path), max_bytes=max_bytes, container_bytes=CONTAINER, **disk))


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def disk_slots(m) -> list[int]:
    return [total for total, _ in m.slot_counts(CacheLevel.DISK)]


def on_disk(m, rng, counts, keys=False):
    """Allocates counts[lc] pages per lifecycle, fills them and evicts them to the disk level."""
    pages = []
    for lc, n in enumerate(counts):
        ks = [f"l{lc}p{i}".encode() for i in range(n)] if keys else None
        pages += m.allocate(lc, n, keys=ks)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    assert all(p.level == CacheLevel.DISK for p in pages)
    return pages, model


def check_bytes(m, pages, model):
    """Onboards `pages` and compares them with the model, then sends them back to the disk."""
    m.onboard(pages, source=CacheLevel.DISK)
    for p in pages:
        assert np.array_equal(hot_bytes(m, p), model[p.id]), p
    m.evict(pages, level=CacheLevel.DISK)


def physical_slots(m, g) -> list[int]:
    r = DiskRegion.open_read_only(m.disk_stats(g)["dir"])
    try:
        per = r.container_bytes // 4096  # slots per container: the pages are padded to 4 KiB
        return sorted(p["container"] * per + p["slot"] for p in r.pages())
    finally:
        r.close()


def test_grow_shrink_defragment_round_trip_is_byte_exact(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    try:
        before = disk_slots(m)
        assert m.quota(CacheLevel.DISK) == 16 * CONTAINER
        pages, model = on_disk(m, rng, [6, 8])
        # Grow: each group's share doubles, in whole containers.
        m.resize(CacheLevel.DISK, 32 * CONTAINER)
        grown = disk_slots(m)
        assert m.quota(CacheLevel.DISK) == 32 * CONTAINER
        assert all(b < g for b, g in zip(before, grown)) and all(g % 4 == 0 for g in grown)
        # The split follows the slot-count weights as at construction (the host level's rule).
        host = [t for t, _ in m.slot_counts(CacheLevel.HOST)]
        assert (grown[0] > grown[1]) == (host[0] > host[1])
        more, more_model = on_disk(m, rng, [10, 12])  # the new slots are usable at once
        model.update(more_model)
        pages += more
        ids = [p.id for p in pages]
        # Free every other page so the survivors spread over the slots, then shrink back.
        m.free(pages[::2])
        keep = pages[1::2]
        m.resize(CacheLevel.DISK, 16 * CONTAINER)
        assert disk_slots(m) == before and m.quota(CacheLevel.DISK) == 16 * CONTAINER
        assert [p.id for p in keep] == ids[1::2] and all(p.is_live and p.level == CacheLevel.DISK for p in keep)
        for g, total in enumerate(before):
            assert all(p.slot < total for p in keep if p.pool_group == g)
            assert all(s < total for s in physical_slots(m, g))
        assert sum(s.drops for s in m.stats(CacheLevel.DISK)) == 0
        check_bytes(m, keep, model)
        # Defragment after more holes: logical and physical slots become a prefix.
        m.free(keep[::3])
        rest = [p for i, p in enumerate(keep) if i % 3]
        moved = m.defragment(CacheLevel.DISK)
        assert moved > 0
        for g in range(m.num_pool_groups(CacheLevel.DISK)):
            n = sum(1 for p in rest if p.pool_group == g)
            assert sorted(p.slot for p in rest if p.pool_group == g) == list(range(n))
            assert physical_slots(m, g) == list(range(n))
        assert m.defragment(CacheLevel.DISK) == 0
        check_bytes(m, rest, model)
    finally:
        m.close()


def test_shrink_drops_least_recently_used_at_the_disk_level_only(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    try:
        total = disk_slots(m)
        pages, model = on_disk(m, rng, [total[0], total[1]])  # every disk slot used
        m.touch(pages[:4])  # recently used: they must survive
        m.resize(CacheLevel.DISK, 8 * CONTAINER)
        after = disk_slots(m)
        dropped = [p for p in pages if not p.is_live]
        assert len(dropped) == sum(total) - sum(after)
        assert [s.drops for s in m.stats(CacheLevel.DISK)] == [t - a for t, a in zip(total, after)]
        assert sum(s.drops for s in m.stats(CacheLevel.HOT)) == sum(s.drops for s in m.stats(CacheLevel.HOST)) == 0
        assert all(p.is_live for p in pages[:4])
        alive = [p for p in pages if p.is_live]
        assert [sum(1 for p in alive if p.pool_group == g) for g in (0, 1)] == after
        check_bytes(m, alive, model)
    finally:
        m.close()


def test_pinned_pages_make_a_shrink_fail_before_anything_changes(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    try:
        total = disk_slots(m)
        pages, model = on_disk(m, rng, [total[0], 0])
        m.pin(pages)
        with pytest.raises(CapacityError, match=r"cannot resize the disk level to .* pool group 0 would have \d+ slots"
                                                 r" but holds \d+ pages of which only 0 are evictable"):
            m.resize(CacheLevel.DISK, 4 * CONTAINER)
        assert disk_slots(m) == total and m.quota(CacheLevel.DISK) == 16 * CONTAINER
        assert all(p.is_live for p in pages)
        m.unpin(pages)
        check_bytes(m, pages, model)
    finally:
        m.close()


def test_bad_quota_names_the_field(tmp_path):
    m = KVCacheManager(disk_config(tmp_path))
    try:
        with pytest.raises(ValueError, match=r"quota_bytes is 0; a level's quota must be positive"):
            m.resize(CacheLevel.DISK, 0)
        with pytest.raises(ValueError, match=r"quota_bytes is \d+: cold pool group \d would get .* at most 9999"):
            m.resize(CacheLevel.DISK, 30000 * CONTAINER)
        assert m.quota(CacheLevel.DISK) == 16 * CONTAINER
    finally:
        m.close()


def test_restart_after_resize_sees_the_new_quota_and_the_moved_pages(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    pages, model = on_disk(m, rng, [8, 8], keys=True)
    m.free(pages[:8:2] + pages[8::2])  # holes, so the shrink moves pages
    kept = [p for p in pages if p.is_live]
    keys = {p.key: model[p.id] for p in kept}
    m.resize(CacheLevel.DISK, 6 * CONTAINER)
    small = disk_slots(m)
    m.close()

    m2 = KVCacheManager(disk_config(tmp_path))  # the same configuration: the resized quota holds
    try:
        assert m2.quota(CacheLevel.DISK) == 6 * CONTAINER and disk_slots(m2) == small
        assert all(not m2.disk_stats(g)["invalidated"] for g in (0, 1))
        found = m2.find_on_disk(list(keys))
        assert all(f is not None for f in found)
        m2.onboard(found, source=CacheLevel.DISK)
        for f in found:
            assert np.array_equal(hot_bytes(m2, f), keys[f.key])
        m2.evict(found, level=CacheLevel.DISK)
        m2.resize(CacheLevel.DISK, 24 * CONTAINER)
    finally:
        m2.close()
    m3 = KVCacheManager(disk_config(tmp_path))
    try:
        assert m3.quota(CacheLevel.DISK) == 24 * CONTAINER
        assert len([f for f in m3.find_on_disk(list(keys)) if f]) == len(keys)
    finally:
        m3.close()
    # Another configured size wins over the recorded quota; the regions resize in place.
    m4 = KVCacheManager(disk_config(tmp_path, max_bytes=12 * CONTAINER))
    try:
        assert m4.quota(CacheLevel.DISK) == 12 * CONTAINER
        assert len([f for f in m4.find_on_disk(list(keys)) if f]) == len(keys)
    finally:
        m4.close()


def test_io_error_during_a_shrink_keeps_the_old_quota_working(tmp_path, rng):
    # The fault is armed for the data writes of region group0 only; the shrink's moves hit it.
    m = KVCacheManager(disk_config(tmp_path))
    pages, model = on_disk(m, rng, [8, 0], keys=True)
    m.free(pages[:8:2])
    live = [p for p in pages if p.is_live]
    live_keys = [p.key for p in live]
    live_bytes = [model[p.id] for p in live]
    m.close()
    faults = [{"op": "pwrite", "path": "group0/containers", "after": 1, "errno": errno.EIO, "count": 1}]
    m = KVCacheManager(disk_config(tmp_path, _faults=faults))
    try:
        found = m.find_on_disk(live_keys)
        assert all(found)
        before = disk_slots(m)
        with pytest.raises(DiskIoError, match=r"cold pool group 0: .*moving a page failed .*keeps its quota of"):
            m.resize(CacheLevel.DISK, 2 * CONTAINER)
        assert m.quota(CacheLevel.DISK) == 16 * CONTAINER and disk_slots(m) == before
        m.onboard(found, source=CacheLevel.DISK)
        for f, expected in zip(found, live_bytes):
            assert np.array_equal(hot_bytes(m, f), expected)
        m.evict(found, level=CacheLevel.DISK)  # the old quota keeps working
        more, _ = on_disk(m, rng, [4, 0])
    finally:
        m.close()
    m = KVCacheManager(disk_config(tmp_path))  # a restart sees the old quota and every page
    try:
        assert m.quota(CacheLevel.DISK) == 16 * CONTAINER
        assert all(m.find_on_disk(live_keys))
        m.resize(CacheLevel.DISK, 2 * CONTAINER)  # the same shrink succeeds without the fault
        assert m.quota(CacheLevel.DISK) == 2 * CONTAINER
    finally:
        m.close()
