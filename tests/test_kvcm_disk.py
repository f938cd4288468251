"""The disk tier as a cold level of the KV-cache manager (CPU backend): round trips through the
pinned page ring and raw blob copies, content keys found again after a restart, codec identity,
rollback of failed writes, checksum drops, and the page ring's sizing rule."""

from __future__ import annotations

import numpy as np
import pytest
from test_kvcm_support import config, damage_first_blob, group, hot_bytes, make_test_codec, write_random

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheConfigError, KVCacheManager
from kvcodec_sdk.manager import MigrationError, StalePageError, page_ring_bytes

GROUPS = [group([0, 1], [64, 32]), group([2], [48])]  # two cold pool groups (192- and 48-byte pages)


def disk_config(path, groups=GROUPS, host_quota=1 << 17, **disk):
    disk.setdefault("max_bytes", 8 << 20)
    disk.setdefault("container_bytes", 1 << 20)
    disk.setdefault("io_mode", "buffered")
    return config(groups, host_quota=host_quota, disk=DiskTierConfig(str(path), **disk))


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def check_hot(m, pages, model):
    for p in pages:
        assert p.level == CacheLevel.HOT
        assert np.array_equal(hot_bytes(m, p), model[p.id]), p


def scribble(m):
    for lc in range(m.num_layer_groups):
        for pool in m.hot_pool_tensors(lc):
            pool[:] = 0


@pytest.mark.parametrize("codec", [None, "test"])
def test_hot_disk_hot_is_byte_exact(tmp_path, rng, codec):
    m = KVCacheManager(disk_config(tmp_path), cold_page_codec=make_test_codec() if codec else None)
    assert m.lifecycle_to_pool_group(CacheLevel.DISK) == m.lifecycle_to_pool_group(CacheLevel.HOST)
    pages = m.allocate(0, 5) + m.allocate(1, 3)
    model = write_random(m, pages, rng)
    r = m.evict(pages, level=CacheLevel.DISK)
    assert r.moved == 8 and all(p.level == CacheLevel.DISK for p in pages)
    assert [s.pages_offloaded for s in m.stats(CacheLevel.DISK)] == [5, 3]
    assert [m.disk_stats(g)["slots_live"] for g in (0, 1)] == [5, 3]
    scribble(m)
    r = m.onboard(pages, source=CacheLevel.DISK)
    assert r.moved == 8 and not r.dropped
    check_hot(m, pages, model)
    # Onboarded pages leave the disk tier (slots and blobs).
    assert [m.disk_stats(g)["slots_live"] for g in (0, 1)] == [0, 0]
    assert all(free == total for total, free in m.slot_counts(CacheLevel.DISK))
    assert m.page_ring()["live_leases"] == 0


def test_hot_host_disk_host_hot_copies_raw_blobs(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path), cold_page_codec=make_test_codec())
    pages = m.allocate(0, 4) + m.allocate(1, 2)
    model = write_random(m, pages, rng)
    m.evict(pages)
    m.synchronize()
    blobs = {p.id: np.array(m.page_view(p)[0]) for p in pages}
    m.migrate(pages, CacheLevel.DISK)
    assert all(p.level == CacheLevel.DISK for p in pages)
    for g in range(m.num_pool_groups(CacheLevel.HOST)):
        m.host_pool_array(g)[:] = 0  # the host copies are gone: nothing can come from there
    m.migrate(pages, CacheLevel.HOST)
    m.synchronize()
    for p in pages:
        assert p.level == CacheLevel.HOST
        assert np.array_equal(m.page_view(p)[0], blobs[p.id])  # raw copy: the very same blob
    scribble(m)
    m.onboard(pages)
    check_hot(m, pages, model)
    stats = m.stats(CacheLevel.DISK)
    assert sum(s.pages_copied for s in stats) == 6 and sum(s.pages_offloaded for s in stats) == 0


def test_disk_tier_without_host_tier(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path, host_quota=0))
    assert m.num_pool_groups(CacheLevel.HOST) == 0 and m.num_pool_groups(CacheLevel.DISK) == 2
    pages = m.allocate(1, 7)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)
    with pytest.raises(ValueError, match="host level, which this manager does not have"):
        m.evict(pages)


def test_random_walk_across_levels_keeps_every_page(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path), cold_page_codec=make_test_codec())
    pages = m.allocate(0, 6) + m.allocate(1, 6)
    model = write_random(m, pages, rng)
    levels = [CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK]
    for _ in range(25):
        pick = [p for p in pages if rng.random() < 0.5]
        to = int(rng.choice(levels))
        pick = [p for p in pick if not (to == CacheLevel.DISK and p.level == CacheLevel.DISK)]
        m.migrate(pick, to)
    m.migrate([p for p in pages if p.level != CacheLevel.HOT], CacheLevel.HOT)
    check_hot(m, pages, model)


def test_content_keys_survive_a_restart_and_onboard(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    pages = m.allocate(0, 4, keys=[b"p0", "p1", None, b"p3"]) + m.allocate(1, 2, keys=[b"q0", b"q1"])
    assert pages[1].key == b"p1" and pages[2].key is None
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    assert m.find_on_disk([b"p0", b"zz"]) == [pages[0], None]  # live pages of this manager
    m.close()

    m2 = KVCacheManager(disk_config(tmp_path))
    assert m2.unclaimed_on_disk() == 5  # the anonymous page was erased: nobody can name it
    found = m2.find_on_disk([b"p3", b"p0", b"p2", b"q1"])
    assert found[2] is None and all(found[i] is not None for i in (0, 1, 3))
    assert [f.lifecycle for f in found if f] == [0, 0, 1] and all(f.level == CacheLevel.DISK for f in found if f)
    assert found[0].key == b"p3"
    r = m2.onboard([f for f in found if f], source=CacheLevel.DISK)
    assert r.moved == 3
    for f, old in zip([found[0], found[1], found[3]], [pages[3], pages[0], pages[5]]):
        assert np.array_equal(hot_bytes(m2, f), model[old.id])
    assert m2.unclaimed_on_disk() == 2
    assert m2.forget_unclaimed_on_disk() == 2
    assert all(free == total for total, free in m2.slot_counts(CacheLevel.DISK))
    m2.close()
    m3 = KVCacheManager(disk_config(tmp_path))
    assert m3.unclaimed_on_disk() == 0 and m3.find_on_disk([b"p1", b"q0"]) == [None, None]


def test_another_codec_after_a_restart_invalidates_the_disk_tier(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path))
    pages = m.allocate(0, 2, keys=[b"a", b"b"])
    write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    m2 = KVCacheManager(disk_config(tmp_path), cold_page_codec=make_test_codec())
    assert m2.disk_stats(0)["invalidated"] and m2.unclaimed_on_disk() == 0
    assert m2.find_on_disk([b"a", b"b"]) == [None, None]  # no foreign blob is decoded
    m2.close()
    # Other layer groups are another blob layout too.
    m3 = KVCacheManager(disk_config(tmp_path, groups=[group([0, 1], [64, 32]), group([2], [64])]),
                        cold_page_codec=make_test_codec())
    assert m3.disk_stats(0)["invalidated"]


def test_failed_disk_write_rolls_back_and_the_source_stays_retryable(tmp_path, rng):
    faults = [{"op": "pwrite", "path": "containers", "after": 2, "errno": 5, "count": 1}]
    m = KVCacheManager(disk_config(tmp_path, io_threads=1, _faults=faults))
    pages = m.allocate(0, 4, keys=[b"a", b"b", b"c", b"d"])
    model = write_random(m, pages, rng)
    with pytest.raises(MigrationError, match="disk write") as e:
        m.evict(pages, level=CacheLevel.DISK)
    assert e.value.committed_pages == 0
    check_hot(m, pages, model)  # nothing lost, nothing moved
    assert all(free == total for total, free in m.slot_counts(CacheLevel.DISK))
    assert m.disk_stats(0)["slots_live"] == 0  # the blobs written before the failure were erased
    m.evict(pages, level=CacheLevel.DISK)  # the fault was transient: the retry succeeds
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def test_a_put_replacing_an_unclaimed_page_keeps_it_until_the_new_one_is_on_disk(tmp_path, rng):
    """A new page under the key of a page a previous manager left unclaimed replaces it only once
    its own write is durable: when that write fails, the old page is still there (claimable now
    and after a restart); when it succeeds, the new one is served and the old slot is free."""
    m = KVCacheManager(disk_config(tmp_path))
    old = m.allocate(0, 2, keys=[b"r", b"s"])
    old_model = write_random(m, old, rng)
    m.evict(old, level=CacheLevel.DISK)
    m.close()

    faults = [{"op": "pwrite", "path": "containers", "after": 0, "errno": 5, "count": 1}]
    m = KVCacheManager(disk_config(tmp_path, io_threads=1, _faults=faults))
    assert m.unclaimed_on_disk() == 2
    [new] = m.allocate(0, 1, keys=[b"r"])
    new_model = write_random(m, [new], rng)
    with pytest.raises(MigrationError, match="disk write"):
        m.evict([new], level=CacheLevel.DISK)
    check_hot(m, [new], new_model)
    assert m.unclaimed_on_disk() == 2  # the old "r" was not erased before a write that failed
    m.free([new])
    [found] = m.find_on_disk([b"r"])
    m.onboard([found], source=CacheLevel.DISK)
    assert np.array_equal(hot_bytes(m, found), old_model[old[0].id])
    m.evict([found], level=CacheLevel.DISK)
    m.close()

    m = KVCacheManager(disk_config(tmp_path))  # without faults: the replacement lands
    assert m.unclaimed_on_disk() == 2
    used = sum(total - free for total, free in m.slot_counts(CacheLevel.DISK))
    [new] = m.allocate(0, 1, keys=[b"r"])
    new_model = write_random(m, [new], rng)
    m.evict([new], level=CacheLevel.DISK)
    assert m.unclaimed_on_disk() == 1  # "s" only
    assert sum(total - free for total, free in m.slot_counts(CacheLevel.DISK)) == used  # the old slot went back
    scribble(m)
    m.onboard([new], source=CacheLevel.DISK)
    check_hot(m, [new], new_model)
    m.evict([new], level=CacheLevel.DISK)  # (the onboard took it off the disk)
    m.close()
    m = KVCacheManager(disk_config(tmp_path))
    [found] = m.find_on_disk([b"r"])
    m.onboard([found], source=CacheLevel.DISK)
    assert np.array_equal(hot_bytes(m, found), new_model[new.id])
    m.close()


def test_checksum_mismatch_drops_the_page(tmp_path, rng):
    m = KVCacheManager(disk_config(tmp_path, groups=[group([0], [4096])]))
    pages = m.allocate(0, 2, keys=[b"x", b"y"])
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    damage_first_blob(tmp_path)
    m2 = KVCacheManager(disk_config(tmp_path, groups=[group([0], [4096])]))
    found = m2.find_on_disk([b"x", b"y"])
    r = m2.onboard(found, source=CacheLevel.DISK)
    assert r.moved == 1 and len(r.dropped) == 1
    bad, good = (found[0], found[1]) if r.dropped.ids[0] == found[0].id else (found[1], found[0])
    with pytest.raises(StalePageError):
        bad.level
    assert m2.stats(CacheLevel.DISK)[0].pages_dropped == 1
    assert m2.stats(CacheLevel.DISK)[0].dropped_by_reason["disk_checksum"] == 1
    assert m2.disk_stats(0)["checksum_failures"] == 1
    assert any(np.array_equal(hot_bytes(m2, good), model[p.id]) for p in pages)


def test_page_ring_sizing_and_presence(tmp_path):
    mib = 1 << 20
    assert page_ring_bytes(0) == 64 * mib and page_ring_bytes(21 * mib) == 64 * mib
    assert page_ring_bytes(22 * mib) == 66 * mib
    assert page_ring_bytes((1 << 64) // 3) == 3 * ((1 << 64) // 3)
    with pytest.raises(OverflowError, match="overflows"):
        page_ring_bytes((1 << 64) // 3 + 1)
    assert KVCacheManager(config(GROUPS)).page_ring() is None  # no disk tier, no ring
    m = KVCacheManager(disk_config(tmp_path))
    ring = m.page_ring()
    assert ring["capacity"] == page_ring_bytes(max(m.cold_page_bytes(lc) for lc in range(2)))


def test_disk_config_and_key_errors_name_the_field(tmp_path, rng):
    with pytest.raises(KVCacheConfigError, match=r"KVCacheConfig.disk.max_bytes is 0"):
        KVCacheManager(disk_config(tmp_path, max_bytes=0))
    with pytest.raises(KVCacheConfigError, match=r"KVCacheConfig.disk.io_mode is 'fast'"):
        KVCacheManager(disk_config(tmp_path, io_mode="fast"))
    with pytest.raises(ValueError, match="config.disk: cold pool group"):
        KVCacheManager(disk_config(tmp_path, max_bytes=1000))  # less than one slot per region
    m = KVCacheManager(disk_config(tmp_path))
    pages = m.allocate(0, 2, keys=[b"k", None])
    with pytest.raises(ValueError, match="already the content key of live page"):
        pages[1].key = b"k"
    with pytest.raises(ValueError, match="1..254 bytes"):
        pages[1].key = b"x" * 255
    m.evict(pages, level=CacheLevel.DISK)
    with pytest.raises(ValueError, match="already at the disk level"):
        m.migrate(pages, CacheLevel.DISK)
    with pytest.raises(ValueError, match="set the key before the page goes to disk"):
        pages[1].key = b"late"
    m.free(pages)
    assert all(free == total for total, free in m.slot_counts(CacheLevel.DISK))
    assert m.find_on_disk([b"k"]) == [None]


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "non-blocking"])
@pytest.mark.parametrize("checked", [True, False], ids=["checked-decode", "host-check"])
def test_disk_to_hot_drops_blobs_the_codec_refuses(tmp_path, rng, checked, blocking):
    """Disk -> hot with an enveloped codec: a blob that holds no page (did not fit) is dropped
    and counted, by the codec's page status or by the host envelope check, whether the call
    waits or its job commits later."""
    codec = make_test_codec(envelope=True, did_not_fit_marker=0xEE, checked_decode=checked)
    m = KVCacheManager(disk_config(tmp_path, groups=[group([0], [64])]), cold_page_codec=codec)
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    m.page_view(pages[2], framework="numpy")[0][0] = 0xEE
    assert m.evict(pages, level=CacheLevel.DISK).moved == 4
    scribble(m)
    r = m.onboard(pages, source=CacheLevel.DISK, blocking=blocking)
    r = r if blocking else r.wait()
    assert r.moved == 3 and r.dropped.ids.tolist() == [pages[2].id]
    st = m.stats(CacheLevel.DISK)[0]
    assert st.pages_dropped == 1 and st.dropped_by_reason["did_not_fit"] == 1 and st.pages_onboarded == 3
    check_hot(m, [pages[i] for i in (0, 1, 3)], model)
    assert all(free == total for total, free in m.slot_counts(CacheLevel.DISK))
    assert m.page_ring()["live_leases"] == 0
