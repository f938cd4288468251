"""The eviction order of the KV-cache manager (CPU backend) against a reference model.

The manager keeps each pool group's eviction queue as a heap whose stale entries are skipped and
swept out lazily; this checks, after every step of seeded random workloads, that which pages were
evicted or dropped is exactly what a plain sort by (priority, recency) picks: allocation under
pressure, touches, pins, priorities, frees, explicit evictions and onboardings (an eviction keeps
a page's age, a move to the hot level makes it the most recent) and explicit ``make_room``."""

from __future__ import annotations

import numpy as np
import pytest
from test_kvcm_support import config, group

from kvcodec_sdk import CacheLevel, KVCacheManager
from kvcodec_sdk.manager import CapacityError

HOT_SLOTS, HOST_SLOTS = 16, 24


class Model:
    """Pages by id: level, priority, recency tick and pins, as the manager documents them."""

    def __init__(self):
        self.pages: dict[int, dict] = {}
        self.clock = 0

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def at(self, level):
        return [pid for pid, p in self.pages.items() if p["level"] == level]

    def evictable(self, level):
        return [pid for pid in self.at(level) if self.pages[pid]["pins"] == 0]

    def free_slots(self, level):
        return (HOT_SLOTS if level == CacheLevel.HOT else HOST_SLOTS) - len(self.at(level))

    def make_room(self, level, free_slots):
        """Returns False (nothing changed) where the manager raises CapacityError."""
        if self.free_slots(level) >= free_slots:
            return True
        need = free_slots - self.free_slots(level)
        candidates = self.evictable(level)
        if len(candidates) < need:
            return False
        victims = sorted(candidates, key=lambda pid: (self.pages[pid]["prio"], self.pages[pid]["tick"]))[:need]
        if level == CacheLevel.HOST:  # the last level drops
            for pid in victims:
                del self.pages[pid]
            return True
        if not self.make_room(CacheLevel.HOST, need):
            return False
        for pid in victims:
            self.pages[pid]["level"] = CacheLevel.HOST  # keeps its age
        return True


def check(m: KVCacheManager, model: Model, handles: dict):
    for pid, h in handles.items():
        if pid in model.pages:
            assert h.is_live, f"page {pid:#x} was dropped; the model keeps it"
            assert h.level == model.pages[pid]["level"], f"page {pid:#x} is at level {h.level}"
        else:
            assert not h.is_live, f"page {pid:#x} is live; the model dropped or freed it"
    for level in (CacheLevel.HOT, CacheLevel.HOST):
        assert m.evictable(level, 0) == len(model.evictable(level))


@pytest.mark.parametrize("seed", range(6))
def test_eviction_order_matches_a_sort_by_priority_and_recency(seed):
    rng = np.random.default_rng(seed)
    m = KVCacheManager(config([group([0], [64])], gpu_quota=64 * HOT_SLOTS, host_quota=64 * HOST_SLOTS))
    model, handles = Model(), {}

    def pick(level=None, most=4):
        live = sorted(pid for pid, p in model.pages.items() if level is None or p["level"] == level)
        k = int(rng.integers(0, min(most, len(live)) + 1)) if live else 0
        return [int(x) for x in rng.choice(live, size=k, replace=False)] if k else []

    for _ in range(300):
        op = rng.choice(["allocate", "touch", "pin", "unpin", "priority", "free", "evict", "onboard", "make_room"],
                        p=[0.3, 0.15, 0.07, 0.07, 0.08, 0.05, 0.1, 0.1, 0.08])
        if op == "allocate":
            n = int(rng.integers(1, 6))
            free = model.free_slots(CacheLevel.HOT)
            ok = free >= n or (free + len(model.evictable(CacheLevel.HOT)) >= n
                               and model.make_room(CacheLevel.HOT, n))
            if ok:
                pages = m.allocate(0, n)
                for h in pages:
                    handles[h.id] = h
                    model.pages[h.id] = {"level": CacheLevel.HOT, "prio": 0, "tick": model.tick(), "pins": 0}
            else:
                with pytest.raises(CapacityError):
                    m.allocate(0, n)
        elif op == "touch":
            ids = pick()
            m.touch([handles[i] for i in ids])
            for i in ids:
                model.pages[i]["tick"] = model.tick()
        elif op == "pin":
            ids = pick()
            m.pin([handles[i] for i in ids])
            for i in ids:
                model.pages[i]["pins"] += 1
        elif op == "unpin":
            ids = [i for i in pick() if model.pages[i]["pins"]]
            m.unpin([handles[i] for i in ids])
            for i in ids:
                model.pages[i]["pins"] -= 1
        elif op == "priority":
            ids, prio = pick(), int(rng.integers(-2, 3))
            m.set_priority([handles[i] for i in ids], prio)
            for i in ids:
                model.pages[i]["prio"] = prio
        elif op == "free":
            ids = pick(most=2)
            m.free([handles[i] for i in ids])
            for i in ids:
                del model.pages[i]
        elif op in ("evict", "onboard"):
            src, dst = ((CacheLevel.HOT, CacheLevel.HOST) if op == "evict" else (CacheLevel.HOST, CacheLevel.HOT))
            ids = pick(src)
            if not ids:
                continue
            call = m.evict if op == "evict" else m.onboard
            if model.free_slots(dst) < len(ids):
                with pytest.raises(CapacityError):  # explicit migrations never evict
                    call([handles[i] for i in ids])
            else:
                call([handles[i] for i in ids])
                for i in ids:  # one layer group: one transfer, in call order
                    model.pages[i]["level"] = dst
                    if dst == CacheLevel.HOT:
                        model.pages[i]["tick"] = model.tick()
        else:
            level = CacheLevel.HOT if rng.random() < 0.6 else CacheLevel.HOST
            want = int(rng.integers(0, 8))
            if model.make_room(level, want):
                m.make_room(level, 0, want)
            else:
                with pytest.raises(CapacityError):
                    m.make_room(level, 0, want)
        check(m, model, handles)
    m.close()


def test_many_round_trips_keep_the_queues_exact():
    # Round trips leave a stale entry behind per page and direction; the queues sweep them out
    # and still evict exactly the least recently used pages afterwards.
    m = KVCacheManager(config([group([0], [64])], gpu_quota=64 * 64, host_quota=64 * 64))
    pages = m.allocate(0, 64)
    for _ in range(20):
        m.evict(pages[::2])
        m.onboard(pages[::2])  # newest now, in call order
    assert m.evictable(CacheLevel.HOT, 0) == 64 and m.evictable(CacheLevel.HOST, 0) == 0
    m.make_room(CacheLevel.HOT, 0, 32)
    assert [p.level for p in pages[1::2]] == [CacheLevel.HOST] * 32  # never moved: the oldest
    assert [p.level for p in pages[::2]] == [CacheLevel.HOT] * 32
    m.make_room(CacheLevel.HOT, 0, 40)
    assert [p.level for p in pages[::2][:8]] == [CacheLevel.HOST] * 8
    assert [p.level for p in pages[::2][8:]] == [CacheLevel.HOT] * 24
    m.close()
