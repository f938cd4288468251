"""Capacity management of the KV-cache manager (CPU backend): pool-ratio validation and projection
across different hot and cold groupings, hot-only floors and structural cold minima, eviction
per level (LRU with priorities, pins, cascades, drops only at the last level), statistics, and a
stateful randomized workload checked against a model."""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_kvcm_support import config, expected_blob, group, hot_bytes, make_test_codec, write_random

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheConfigError, KVCacheManager, _native
from kvcodec_sdk.manager import CapacityError, PageHandle, StalePageError

# -- pool ratio ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio, message",
    [
        ([1.0], r"KVCacheConfig.pool_ratio has 1 entries; it needs one per layer group \(2\)"),
        ([1.0, 2.0, 3.0], r"KVCacheConfig.pool_ratio has 3 entries; it needs one per layer group \(2\)"),
        ([1.0, -2.0], r"KVCacheConfig.pool_ratio\[1\] is -2.0; every weight must be a positive finite number"),
        ([0, 1.0], r"KVCacheConfig.pool_ratio\[0\] is 0; every weight"),
        ([1.0, math.nan], r"KVCacheConfig.pool_ratio\[1\] is nan; every weight"),
        ([math.inf, 1.0], r"KVCacheConfig.pool_ratio\[0\] is inf; every weight"),
    ],
    ids=["short", "long", "negative", "zero", "nan", "inf"],
)
def test_pool_ratio_errors_name_the_field_and_value(ratio, message):
    with pytest.raises(KVCacheConfigError, match=message):
        KVCacheManager(config([group([0], [64]), group([1], [32])], pool_ratio=ratio))


@pytest.mark.parametrize("bad, message", [(math.nan, "is -?nan"), (-1.0, r"is -1\.0*"), (0.0, r"is 0\.0*")])
def test_the_core_validates_the_pool_ratio_too(bad, message):
    # The C++ core is reachable without the Python dataclass: it checks on its own.
    cfg = config([group([0], [64]), group([1], [32])])
    native = cfg.to_native()
    native.pool_ratio = [1.0, bad]
    with pytest.raises(ValueError, match=r"config.poolRatio\[1\] " + message + "; every weight must be a positive finite"):
        _native.kvcm.KvcmCore(native, None, -1)
    native.pool_ratio = [1.0]
    with pytest.raises(ValueError, match=r"config.poolRatio has 1 entries; it needs one per layer group \(2\)"):
        _native.kvcm.KvcmCore(native, None, -1)


def test_projection_shared_hot_group_split_cold_group_and_vice_versa():
    # Hot: layer groups 0 and 1 share a group (one 128-byte pool); 2 is alone (two 32-byte pools).
    # Cold (test codec pads): 0 -> 128, 1 -> 192, 2 -> 64 + 64 = 128: 0 and 2 share cold group 0,
    # 1 is alone in cold group 1. Ratio 1:1:2 of 12800 hot bytes, by hand:
    #   hot group 0 = (3200 + 3200) / 128 = 50 slots, hot group 1 = 6400 / 64 = 100 slots;
    #   implied slots: 25, 25, 100; cold bytes 25*128 + 100*128 = 16000 (group 0), 25*192 = 4800
    #   (group 1); with host_quota = 20800 that is 125 and 25 slots: slot counts are preserved.
    codec = make_test_codec(pad="1:64,2:64")
    m = KVCacheManager(config([group([0], [64, 64]), group([1], [64, 64]), group([2, 3], [32])],
                              gpu_quota=12800, host_quota=20800, pool_ratio=[1, 1, 2]), cold_page_codec=codec)
    assert m.lifecycle_to_pool_group(CacheLevel.HOT) == [0, 0, 1]
    assert m.lifecycle_to_pool_group(CacheLevel.HOST) == [0, 1, 0]
    assert [m.page_bytes(CacheLevel.HOST, g) for g in range(2)] == [128, 192]
    assert [c for c, _ in m.slot_counts(CacheLevel.HOT)] == [50, 100]
    assert [c for c, _ in m.slot_counts(CacheLevel.HOST)] == [125, 25]
    # Half the host quota: every cold group halves (floor), proportions between layer groups hold.
    m2 = KVCacheManager(config([group([0], [64, 64]), group([1], [64, 64]), group([2, 3], [32])],
                               gpu_quota=12800, host_quota=10400, pool_ratio=[1, 1, 2]),
                        cold_page_codec=make_test_codec(pad="1:64,2:64"))
    assert [c for c, _ in m2.slot_counts(CacheLevel.HOST)] == [62, 12]


def test_ratio_is_normalized():
    groups = [group([0], [64]), group([1], [32])]
    a = KVCacheManager(config(groups, gpu_quota=6400, host_quota=6400, pool_ratio=[3, 1]))
    b = KVCacheManager(config(groups, gpu_quota=6400, host_quota=6400, pool_ratio=[0.75, 0.25]))
    assert a.slot_counts(CacheLevel.HOT) == b.slot_counts(CacheLevel.HOT) == [(75, 75), (50, 50)]
    assert a.slot_counts(CacheLevel.HOST) == b.slot_counts(CacheLevel.HOST)


# -- floors ----------------------------------------------------------------------------------------

TWO = [group([0], [64]), group([1], [32])]  # hot pages 64 and 32 bytes, separate groups


def test_hot_floor_clamps_the_hot_split_only():
    # Ratio 3:1 of 6400 bytes: 75 and 50 slots. A floor of 100 slots for layer group 1 (3200 bytes)
    # clamps it; layer group 0 gets the remaining 3200 bytes = 50 slots.
    free = KVCacheManager(config(TWO, gpu_quota=6400, host_quota=4800, pool_ratio=[3, 1]))
    floored = KVCacheManager(config(TWO, gpu_quota=6400, host_quota=4800, pool_ratio=[3, 1], min_hot_slots=[0, 100]))
    assert [c for c, _ in free.slot_counts(CacheLevel.HOT)] == [75, 50]
    assert [c for c, _ in floored.slot_counts(CacheLevel.HOT)] == [50, 100]
    # Floors are not projected into cold storage: the host split comes from the ratio alone.
    assert floored.slot_counts(CacheLevel.HOST) == free.slot_counts(CacheLevel.HOST)
    # A floor already met changes nothing.
    met = KVCacheManager(config(TWO, gpu_quota=6400, host_quota=4800, pool_ratio=[3, 1], min_hot_slots=[75, 50]))
    assert [c for c, _ in met.slot_counts(CacheLevel.HOT)] == [75, 50]


def test_floors_of_layer_groups_sharing_a_hot_group_add_up():
    # 0 and 1 share a 64-byte hot group (ratio 1+1 of 3), 2 has 32-byte pages (ratio 1 of 3).
    groups = [group([0], [64]), group([1], [64]), group([2], [32])]
    m = KVCacheManager(config(groups, gpu_quota=9600, host_quota=4800, min_hot_slots=[60, 60, 0]))
    # Floor 120 slots * 64 = 7680 bytes; the rest (1920) / 32 = 60 slots for layer group 2.
    assert [c for c, _ in m.slot_counts(CacheLevel.HOT)] == [120, 60]


def test_infeasible_floor_says_which_and_by_how_much():
    # 60 * 64 + 100 * 32 = 7040 bytes > 6400: short by 640; the largest floor is layer group 0's.
    with pytest.raises(ValueError, match=r"config.minHotSlots needs 7040 hot bytes but config.gpuQuotaBytes is 6400: "
                                         r"short by 640 bytes \(the largest floor is layer group 0's minHotSlots\[0\] = 60 "
                                         r"slots of 64 bytes\)"):
        KVCacheManager(config(TWO, gpu_quota=6400, min_hot_slots=[60, 100]))
    # Feasible floors that leave another group less than one page are an error too.
    with pytest.raises(ValueError, match=r"hot pool group 0 .* gets less than one page after the minHotSlots floors"):
        KVCacheManager(config(TWO, gpu_quota=6400, min_hot_slots=[0, 199]))


@pytest.mark.parametrize(
    "floors, message",
    [([1], r"KVCacheConfig.min_hot_slots has 1 entries; it needs one per layer group \(2\)"),
     ([1, -1], r"KVCacheConfig.min_hot_slots\[1\] is -1; it must be >= 0"),
     ([1, 2.5], r"KVCacheConfig.min_hot_slots\[1\] is 2.5 \(float\); it must be an integer")],
)
def test_floor_config_errors_name_the_field(floors, message):
    with pytest.raises(KVCacheConfigError, match=message):
        KVCacheManager(config(TWO, min_hot_slots=floors))


def test_cold_levels_get_only_their_structural_minimum():
    # A host quota far below one page per cold group still gives every cold group one slot
    # (the slot allocator's minimum), whatever the hot floors say.
    m = KVCacheManager(config(TWO, gpu_quota=6400, host_quota=1, min_hot_slots=[10, 10]))
    assert m.slot_counts(CacheLevel.HOST) == [(1, 1), (1, 1)]


# -- eviction --------------------------------------------------------------------------------------

ONE = [group([0], [64])]


def small(host=64 * 4, **kw):
    return KVCacheManager(config(ONE, gpu_quota=64 * 4, host_quota=host, **kw))


def levels(pages):
    return [p.level if p.is_live else None for p in pages]


def test_allocation_under_pressure_evicts_lru_to_host_and_drops_at_the_last_level(rng):
    m = small()
    a = m.allocate(0, 4)
    model = write_random(m, a, rng)
    b = m.allocate(0, 2)  # evicts a[0], a[1] (least recently used)
    assert levels(a) == [CacheLevel.HOST, CacheLevel.HOST, CacheLevel.HOT, CacheLevel.HOT]
    m.touch(a[2])  # a[3] is now older than a[2]
    c = m.allocate(0, 1)
    assert levels(a)[2:] == [CacheLevel.HOT, CacheLevel.HOST]
    m.allocate(0, 3)  # host full after 2 more: the oldest host pages are dropped (last level)
    assert not a[0].is_live and not a[1].is_live
    with pytest.raises(StalePageError):
        m.onboard(a[0])
    st = m.level_stats(CacheLevel.HOT)[0]
    assert st["evictions"] == 2 + 1 + 3 and st["drops"] == 0 and st["hits"] == 1
    host = m.level_stats(CacheLevel.HOST)[0]
    assert host["drops"] == 2 and host["evictions"] == 0 and host["used"] == 4
    m.synchronize()
    assert a[3].level == CacheLevel.HOST  # the survivor on the host holds its bytes
    assert np.array_equal(np.asarray(m.page_view(a[3])[0]), model[a[3].id])
    assert all(p.is_live for p in list(b) + list(c))


def test_pinned_pages_are_never_evicted(rng):
    m = small()
    a = m.allocate(0, 4)
    m.pin(a[:3])
    assert m.evictable(CacheLevel.HOT, 0) == 1 and m.pins(a[0]) == 1
    with pytest.raises(CapacityError, match="hot pool group 0 has 0 free of 4 slots and 1 evictable pages"):
        m.allocate(0, 2)
    assert levels(a) == [CacheLevel.HOT] * 4  # nothing changed
    d = m.allocate(0, 1)
    assert levels(a) == [CacheLevel.HOT] * 3 + [CacheLevel.HOST]
    m.pin(d)
    with m.pinned(a[:3]):  # pins nest: a[:3] are pinned twice here
        m.unpin(a[:3])
        with pytest.raises(CapacityError, match="0 evictable pages"):
            m.allocate(0, 1)
    with pytest.raises(ValueError, match=r"pages\[0\] .* is not pinned"):
        m.unpin(a[3])
    assert [m.pins(p) for p in a[:3]] == [0, 0, 0] and m.evictable(CacheLevel.HOT, 0) == 3
    m.allocate(0, 3)
    assert levels(a) == [CacheLevel.HOST] * 4 and d[0].level == CacheLevel.HOT


def test_priorities_order_eviction_before_recency():
    m = small()
    a = m.allocate(0, 4)
    m.set_priority(a[3], -1)  # the newest page, but the lowest priority
    m.set_priority(a[0], 5)   # the oldest, protected by its priority
    m.allocate(0, 2)
    assert levels(a) == [CacheLevel.HOT, CacheLevel.HOST, CacheLevel.HOT, CacheLevel.HOST]
    with pytest.raises(ValueError, match="priority is 1.5"):
        m.set_priority(a, 1.5)


def test_gpu_only_manager_drops_at_the_hot_level():
    m = KVCacheManager(config(ONE, gpu_quota=64 * 4, host_quota=0))
    a = m.allocate(0, 4)
    m.allocate(0, 1)
    assert not a[0].is_live and all(p.is_live for p in a[1:])
    assert m.level_stats(CacheLevel.HOT)[0]["drops"] == 1


def test_auto_evict_off_raises_instead():
    m = small(auto_evict=False)
    m.allocate(0, 4)
    with pytest.raises(CapacityError, match="has 0 free of 4 slots and 4 evictable pages"):
        m.allocate(0, 1)
    m.make_room(CacheLevel.HOT, 0, 2)  # explicit eviction still works
    assert m.slot_counts(CacheLevel.HOT) == [(4, 2)]


def test_cascade_hot_host_disk_keeps_every_page(tmp_path, rng):
    cfg = config(ONE, gpu_quota=64 * 4, host_quota=64 * 4,
                 disk=DiskTierConfig(str(tmp_path), max_bytes=1 << 20, container_bytes=1 << 20, io_mode="buffered"))
    m = KVCacheManager(cfg)
    pages, model = [], {}
    for _ in range(4):
        new = m.allocate(0, 3)
        model.update(write_random(m, new, rng))
        pages += list(new)
    # 12 pages: 4 hot, 4 host, 4 on disk, the oldest coldest.
    assert levels(pages) == [CacheLevel.DISK] * 4 + [CacheLevel.HOST] * 4 + [CacheLevel.HOT] * 4
    assert m.level_stats(CacheLevel.HOST)[0]["evictions"] == 4 and m.level_stats(CacheLevel.DISK)[0]["drops"] == 0
    # Bring everything back in groups of four: each onboard needs free hot slots first.
    for chunk in (pages[0:4], pages[4:8], pages[8:12]):
        if chunk[0].level != CacheLevel.HOT:
            m.make_room(CacheLevel.HOT, 0, 4)
            src = chunk[0].level
            m.onboard([p for p in chunk], source=src)
        m.synchronize()
        for p in chunk:
            assert p.level == CacheLevel.HOT and np.array_equal(hot_bytes(m, p), model[p.id])
    assert all(p.is_live for p in pages[8:])  # nothing was dropped on the way
    # The disk is the last level: once hot, host and disk are full, the oldest disk pages drop.
    disk_slots = m.slot_counts(CacheLevel.DISK)[0][0]
    total = 4 + 4 + disk_slots
    live = [p for p in pages if p.is_live]
    extra = []
    for _ in range(total // 4 + 1):
        extra += list(m.allocate(0, 4))
    assert m.level_stats(CacheLevel.DISK)[0]["drops"] > 0
    assert m.level_stats(CacheLevel.HOST)[0]["drops"] == 0 and m.level_stats(CacheLevel.HOT)[0]["drops"] == 0
    assert sum(p.is_live for p in live + extra) == total


def test_level_stats_usage_and_peaks():
    m = small()
    a = m.allocate(0, 3)
    m.free(a[:2])
    st = m.level_stats(CacheLevel.HOT)
    assert st == [{"slots": 4, "used": 1, "peak": 3, "evictable": 1, "evictions": 0, "drops": 0, "hits": 0}]
    assert m.level_stats(CacheLevel.HOT, reset_peaks=True)[0]["peak"] == 3
    assert m.level_stats(CacheLevel.HOT)[0]["peak"] == 1
    m.touch(a[2])
    assert m.stats(CacheLevel.HOT)[0].hits == 1
    with pytest.raises(ValueError, match="the disk level, which this manager does not have"):
        m.level_stats(CacheLevel.DISK)


# -- randomized workload ---------------------------------------------------------------------------

GROUPS = [group([0], [48, 16]), group([1], [48, 16]), group([2], [40])]


DISK_CONTAINER = 8192


class CapacityMachine(RuleBasedStateMachine):
    """Allocations (which evict), writes, touches, pins, priorities, explicit make_room, onboards,
    run-time resizes and defragmentation (the disk level's too) against a model: a live page always holds its bytes; a page disappears only by a
    drop at the last level and only when unpinned; every level's quotas hold."""

    with_disk = False
    device = "cpu"
    codecs = ("concat", "test")  # the test codec runs on the CPU backend only

    @initialize(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 1))
    def setup(self, seed, which):
        codec = self.codecs[which % len(self.codecs)]
        self.rng = np.random.default_rng(seed)
        disk = None
        if self.with_disk:
            self.tmp = tempfile.TemporaryDirectory()
            # Two-slot containers (pages are padded to 4 KiB), so disk resizes change whole containers.
            disk = DiskTierConfig(self.tmp.name, max_bytes=64 * 1024, container_bytes=DISK_CONTAINER, io_mode="buffered")
        c = make_test_codec(pad="1:16") if codec == "test" else None
        self.codec = codec
        self.m = KVCacheManager(config(GROUPS, gpu_quota=64 * 12, host_quota=64 * 10, disk=disk, device=self.device,
                                       max_gpu_quota=64 * 16), cold_page_codec=c)
        self.last = max(l for l in (CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK) if self.m._live().has_level(l))
        self.model: dict[int, np.ndarray] = {}
        self.lc: dict[int, int] = {}
        self.pinned: dict[int, int] = {}

    def teardown(self):
        if hasattr(self, "m"):
            self.m.close()
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    def pick(self, data, n):
        live = sorted(self.model)
        if not live:
            return []
        idx = data.draw(st.lists(st.integers(0, len(live) - 1), max_size=n, unique=True))
        return [PageHandle(self.m, live[i]) for i in idx]

    def drops(self):
        return {l: sum(s.drops for s in self.m.stats(l)) for l in range(3) if self.m._live().has_level(l)}

    @rule(lc=st.integers(0, 2), n=st.integers(1, 6))
    def allocate(self, lc, n):
        try:
            pages = self.m.allocate(lc, n)
        except CapacityError:
            return  # everything evictable was already pinned
        self.model.update(write_random(self.m, pages, self.rng))
        self.lc.update({p.id: lc for p in pages})

    @rule(data=st.data())
    def touch(self, data):
        pages = self.pick(data, 4)
        self.m.touch(pages)

    @rule(data=st.data())
    def pin(self, data):
        pages = [p for p in self.pick(data, 2) if self.pinned.get(p.id, 0) < 2]
        self.m.pin(pages)
        for p in pages:
            self.pinned[p.id] = self.pinned.get(p.id, 0) + 1

    @rule(data=st.data())
    def unpin(self, data):
        pages = [p for p in self.pick(data, 3) if self.pinned.get(p.id)]
        self.m.unpin(pages)
        for p in pages:
            self.pinned[p.id] -= 1

    @rule(data=st.data(), prio=st.integers(-2, 2))
    def priority(self, data, prio):
        self.m.set_priority(self.pick(data, 3), prio)

    @rule(data=st.data())
    def free(self, data):
        pages = self.pick(data, 2)
        self.m.free(pages)
        for p in pages:
            del self.model[p.id]
            self.pinned.pop(p.id, None)

    @rule(data=st.data())
    def onboard(self, data):
        pages = [p for p in self.pick(data, 4) if p.level != CacheLevel.HOT]
        for p in pages:
            try:
                self.m.onboard(p, source=p.level)
            except CapacityError:
                pass  # explicit migrations never evict

    @rule(level=st.integers(0, 2), g=st.integers(0, 2), n=st.integers(0, 4))
    def make_room(self, level, g, n):
        if not self.m._live().has_level(level) or g >= self.m.num_pool_groups(level):
            return
        try:
            self.m.make_room(level, g, n)
        except CapacityError:
            pass

    @rule(level=st.integers(0, 1), slots=st.integers(3, 16))
    def resize(self, level, slots):
        if not self.m._live().has_level(level):
            return
        try:
            self.m.resize(level, 64 * slots)
        except CapacityError:
            pass  # too many pinned pages for the new size: nothing changed

    @rule(containers=st.integers(2, 16))
    def resize_disk(self, containers):
        if not self.with_disk:
            return
        quota = DISK_CONTAINER * containers
        try:
            self.m.resize(CacheLevel.DISK, quota)
        except CapacityError:
            return  # too many pinned pages for the new size: nothing changed
        assert self.m.quota(CacheLevel.DISK) == quota

    @rule(level=st.integers(0, 2))
    def defragment(self, level):
        if not self.m._live().has_level(level):
            return
        self.m.defragment(level)
        for g, (slots, free) in enumerate(self.m.slot_counts(level)):
            used = sorted(PageHandle(self.m, pid).slot for pid in self.model
                          if PageHandle(self.m, pid).is_live and PageHandle(self.m, pid).level == level
                          and PageHandle(self.m, pid).pool_group == g)
            assert used == list(range(len(used))), (level, g, used)

    @invariant()
    def pages_are_intact_and_quotas_hold(self):
        if not hasattr(self, "m"):
            return
        m = self.m
        m.synchronize()
        gone = [pid for pid in self.model if not PageHandle(m, pid).is_live]
        for pid in gone:
            assert not self.pinned.get(pid), f"pinned page {pid:#x} was dropped"
            del self.model[pid]
            self.pinned.pop(pid, None)
        drops = self.drops()
        assert all(v == 0 for l, v in drops.items() if l != self.last), drops
        assert drops[self.last] == self.dropped_total() + len(gone)
        self._dropped = drops[self.last]
        used: dict[tuple, int] = {}
        for pid, content in self.model.items():
            p = PageHandle(m, pid)
            lvl, grp = p.level, p.pool_group
            used[(lvl, grp)] = used.get((lvl, grp), 0) + 1
            assert m.pins(p) == self.pinned.get(pid, 0)
            if lvl == CacheLevel.HOT:
                assert np.array_equal(hot_bytes(m, p), content), f"hot page {pid:#x} differs"
            elif lvl == CacheLevel.HOST and self.codec == "concat":
                assert np.array_equal(np.asarray(m.page_view(p)[0]), content), f"host page {pid:#x} differs"
            elif lvl == CacheLevel.HOST:
                blob = np.asarray(m.page_view(p)[0])
                assert np.array_equal(blob, expected_blob(m, self.lc[pid], content, "test")), f"host page {pid:#x}"

        for lvl in range(3):
            if not m._live().has_level(lvl):
                continue
            for g, (slots, free) in enumerate(m.slot_counts(lvl)):
                assert 0 <= free <= slots
                assert slots - free == used.get((lvl, g), 0), (lvl, g)
            if lvl == CacheLevel.DISK:
                # The manager's logical slots and the regions' physical ones agree.
                for g, (slots, free) in enumerate(m.slot_counts(lvl)):
                    st_ = m.disk_stats(g)
                    assert (st_["slots_total"], st_["slots_live"]) == (slots, slots - free), (g, st_)
            else:
                counts = [c for c, _ in m.slot_counts(lvl)]
                held = sum(c * m.page_bytes(lvl, g) for g, c in enumerate(counts))
                # The quota holds (a cold group's structural one-slot minimum may exceed it).
                assert held <= m.quota(lvl) or (lvl == CacheLevel.HOST and min(counts) == 1), (lvl, counts)

    def dropped_total(self):
        return getattr(self, "_dropped", 0)


TestCapacityMachine = CapacityMachine.TestCase
TestCapacityMachine.settings = settings(max_examples=30, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


class CapacityDiskMachine(CapacityMachine):
    with_disk = True


TestCapacityDiskMachine = CapacityDiskMachine.TestCase
TestCapacityDiskMachine.settings = settings(max_examples=15, stateful_step_count=25, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
