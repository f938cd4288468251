"""One KVCacheManager under several threads at once (CPU backend; a CUDA variant marked gpu).

Every public call of the manager holds its mutex (docs/kvcm.md, "Threads"), so several threads
may drive one manager concurrently. Here >= 4 threads each run their own random program of
operations against the SAME manager: allocate (with and without content keys), write distinctive
per-thread, per-page, per-version bytes (never zeros) into their hot slots, evict hot -> host and
hot -> disk, migrate host -> disk and disk -> host, onboard back to hot, relocate hot -> hot and
host -> host, pin / unpin (nested), touch, set priorities, make room, look keys up on disk, free,
resize every level and defragment it, while the other threads' allocations evict (and, at the
last level, drop) whatever is not pinned.

The model each thread keeps, and what is checked:

* a page the thread has pinned moves only when the thread moves it: its level is known exactly;
  an unpinned page only ever gets colder (evictions) or is dropped (its handle goes stale);
* every page is compared byte for byte with its model content whenever it is hot (after every
  allocation write, onboard, relocation, resize or defragmentation) and, on the host tier, its
  concat blob is the same bytes;
* pin counts match the model; a keyed page pinned on disk is what ``find_on_disk`` returns;
* expected errors are exactly ``CapacityError`` (a level too full, nothing changed) and
  ``StalePageError`` (an unpinned page another thread's eviction dropped); anything else fails;
* at quiescence: every level's used slots, evictable pages and disk blobs equal the model's live
  pages there, pages lost to drops equal the drop counters, hits equal the touches, and after
  freeing everything every slot is free again and the whole hot capacity can be allocated.

Direct memory access (writing / reading a slot through a view) is coordinated by the engine, not
by the manager: a resize or defragmentation relocates pinned pages too, so the threads hold a
shared lock while they touch page memory and the resizing thread an exclusive one (manager calls
themselves never take it, so resizes still race with every other manager call).

Reproducing a failure: the hypothesis tests print the per-thread programs and the seed (the
interleaving of threads is not reproducible, so hypothesis may report the failure as flaky; the
programs and seed still say what ran). The duration tests run ``KVCODEC_STRESS_SECONDS`` seconds
(default 1) of random operations with ``KVCODEC_STRESS_THREADS`` threads (default 4) from
``KVCODEC_STRESS_SEED`` (default 20240611); every failure message names the seed, the thread and
its last operations. ``KVCODEC_STRESS_EXAMPLES`` (default 10) sets the hypothesis examples per
configuration. Long run on a GPU host (the CUDA tests run at least 2 s):
``KVCODEC_STRESS_SECONDS=60 pytest -m gpu tests/test_kvcm_threads.py``.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kvcm_support import config, group

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager, gpu
from kvcodec_sdk.manager import CapacityError, StalePageError

HOT, HOST, DISK = CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK

# Layer group 0: two layers (two hot pools of 384-byte slots), 768-byte pages; layer group 1: one
# layer, 192-byte pages. Two hot and two cold pool groups.
GROUPS = [group([0, 1], [256, 128]), group([2], [192])]
GPU_QUOTA = 768 * 24  # 12 + 48 hot slots
HOST_QUOTA = 768 * 36  # 18 + 72 host slots
DISK_QUOTA = 48 * 4096  # 24 + 24 disk slots (slots are padded to 4 KiB)
CONTAINER = 4 * 4096

MAX_OWNED = 14  # pages per thread: 4 threads overflow every level of layer group 0 (drops happen)
MAX_PINNED = 5

STRESS_SECONDS = float(os.environ.get("KVCODEC_STRESS_SECONDS", "1"))
STRESS_THREADS = max(4, int(os.environ.get("KVCODEC_STRESS_THREADS", "4")))
STRESS_SEED = int(os.environ.get("KVCODEC_STRESS_SEED", "20240611"))
STRESS_EXAMPLES = int(os.environ.get("KVCODEC_STRESS_EXAMPLES", "10"))  # hypothesis examples per config
THREADS = 4


class RWLock:
    """Shared / exclusive lock for direct page-memory access; exclusive requests block new readers."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def shared(self):
        lock = self

        class _Shared:
            def __enter__(self):
                with lock._cond:
                    while lock._writer or lock._writers_waiting:
                        lock._cond.wait()
                    lock._readers += 1

            def __exit__(self, *exc):
                with lock._cond:
                    lock._readers -= 1
                    if lock._readers == 0:
                        lock._cond.notify_all()

        return _Shared()

    def exclusive(self):
        lock = self

        class _Exclusive:
            def __enter__(self):
                with lock._cond:
                    lock._writers_waiting += 1
                    while lock._writer or lock._readers:
                        lock._cond.wait()
                    lock._writers_waiting -= 1
                    lock._writer = True

            def __exit__(self, *exc):
                with lock._cond:
                    lock._writer = False
                    lock._cond.notify_all()

        return _Exclusive()


# -- the harness ---------------------------------------------------------------------------------


class Harness:
    """One manager shared by every worker, plus what the workers need to touch page memory."""

    def __init__(self, device: str, disk_dir: str | None):
        disk = None
        if disk_dir is not None:
            disk = DiskTierConfig(disk_dir, max_bytes=DISK_QUOTA, container_bytes=CONTAINER, io_mode="buffered")
        self.device = device
        self.m = KVCacheManager(config(GROUPS, gpu_quota=GPU_QUOTA, host_quota=HOST_QUOTA,
                                       max_gpu_quota=2 * GPU_QUOTA, device=device, disk=disk))
        self.has_disk = disk is not None
        self.levels = [HOT, HOST] + ([DISK] if self.has_disk else [])
        self.base_quota = {HOT: GPU_QUOTA, HOST: HOST_QUOTA, DISK: DISK_QUOTA}
        self.group_of = {lvl: self.m.lifecycle_to_pool_group(lvl) for lvl in self.levels}
        self.page_bytes = [sum(b.bytes for b in self.m.buffer_layout(lc)) for lc in range(len(GROUPS))]
        self.memory = RWLock()
        self.framework = "numpy" if device == "cpu" else "cuda"
        # Pages per (source, destination) level of every transfer, from any thread. Observers run
        # while the migration holds the manager, so they are serialized.
        self.transfers: collections.Counter = collections.Counter()
        self.m.add_migration_observer(lambda r: self.transfers.update({(r.src_level, r.dst_level): r.pages}))

    def on_gpu(self) -> bool:
        return self.device != "cpu"

    def read_hot(self, handle) -> np.ndarray:
        if self.on_gpu():
            self.m.synchronize()  # migrations return after submission
        views = self.m.page_view(handle, framework=self.framework)
        return np.concatenate([_to_numpy(v) for v in views])

    def read_host_blob(self, handle) -> np.ndarray:
        if self.on_gpu():
            self.m.synchronize()
        return np.array(self.m.page_view(handle, framework="numpy")[0])

    def write_hot(self, handle, data: np.ndarray) -> None:
        views = self.m.page_view(handle, framework=self.framework)
        off = 0
        for v in views:
            n = int(v.shape[0])
            if isinstance(v, np.ndarray):
                v[:] = data[off:off + n]
            else:
                v.copy_from(data[off:off + n])  # synchronized: done before any migration can read it
            off += n
        assert off == data.size


def _to_numpy(view) -> np.ndarray:
    return view.copy() if isinstance(view, np.ndarray) else view.numpy()


@dataclass
class Page:
    handle: object
    lc: int
    serial: int
    key: bytes | None
    version: int | None = None  # None: never written (contents unknown)
    pins: int = 0
    level: int = HOT  # exact while pinned; a lower bound (hotter or equal) while unpinned


class Failure(AssertionError):
    pass


class Worker:
    """One thread's program against the shared manager, and its model of its own pages."""

    def __init__(self, h: Harness, tid: int, seed: int):
        self.h, self.m, self.tid, self.seed = h, h.m, tid, seed
        self.rng = random.Random(f"{seed}:{tid}")
        self.pages: list[Page] = []
        self.serial = 0
        self.lost = 0  # pages another thread's eviction dropped
        self.touched = 0
        self.verified = 0
        self.expected = collections.Counter()  # expected error type -> count
        self.ops = collections.Counter()
        self.trace: collections.deque = collections.deque(maxlen=25)

    # -- helpers -----------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        raise Failure(f"thread {self.tid} (seed {self.seed}): {message}; last operations: {list(self.trace)}")

    def content(self, p: Page) -> np.ndarray:
        r = np.random.default_rng([self.seed, self.tid, p.serial, p.version])
        return r.integers(1, 256, size=self.h.page_bytes[p.lc], dtype=np.uint8)

    def pick(self, pages: list[Page], k: int) -> list[Page]:
        return self.rng.sample(pages, min(k, len(pages)))

    def pinned(self, *levels: int) -> list[Page]:
        return [p for p in self.pages if p.pins and (not levels or p.level in levels)]

    def check_pinned_level(self, p: Page) -> None:
        level = p.handle.level
        if level != p.level:
            self.fail(f"pinned page {p.serial} moved from the {CacheLevel.name(p.level)} level to the "
                      f"{CacheLevel.name(level)} level without its owner")

    def drop(self, p: Page) -> None:
        """An unpinned page was dropped by another thread's eviction (its handle is stale)."""
        if p.pins:
            self.fail(f"pinned page {p.serial} was dropped (stale handle)")
        if p.handle.is_live:
            self.fail(f"page {p.serial} raised StalePageError but is live")
        self.pages.remove(p)
        self.lost += 1
        self.expected["StalePageError"] += 1

    def pin(self, p: Page) -> bool:
        """Pins one page; False (and forgets it) if another thread's eviction dropped it."""
        try:
            self.m.pin(p.handle)
        except StalePageError:
            self.drop(p)
            return False
        p.pins += 1
        level = p.handle.level
        if p.pins == 1:
            if level < p.level:
                self.fail(f"unpinned page {p.serial} came back hotter ({CacheLevel.name(p.level)} -> "
                          f"{CacheLevel.name(level)}) without its owner")
            p.level = level
        elif level != p.level:
            self.check_pinned_level(p)
        if self.m.pins(p.handle) != p.pins:
            self.fail(f"page {p.serial} has {self.m.pins(p.handle)} pins, the model {p.pins}")
        return True

    def unpin(self, p: Page) -> None:
        self.m.unpin(p.handle)
        p.pins -= 1

    def verify(self, p: Page) -> None:
        """A pinned page's bytes where it is now (hot: its slots; host: its concat blob)."""
        self.check_pinned_level(p)
        if p.version is None or p.level == DISK:
            return
        with self.h.memory.shared():
            got = self.h.read_hot(p.handle) if p.level == HOT else self.h.read_host_blob(p.handle)
            slot = p.handle.slot
        want = self.content(p)
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            self.fail(f"page {p.serial} v{p.version} (layer group {p.lc}) at the {CacheLevel.name(p.level)} level "
                      f"slot {slot}: {bad.size} of {want.size} bytes differ (first at {bad[0]}: got {got[bad[0]]}, "
                      f"want {want[bad[0]]}; zeros in it: {int((got == 0).sum())})")
        self.verified += 1

    def write(self, p: Page) -> None:
        assert p.pins and p.level == HOT
        p.version = 0 if p.version is None else p.version + 1
        with self.h.memory.shared():
            self.check_pinned_level(p)
            self.h.write_hot(p.handle, self.content(p))
        self.verify(p)

    def make_room(self, level: int, pages: list[Page]) -> None:
        need = collections.Counter(self.h.group_of[level][p.lc] for p in pages)
        for g, n in need.items():
            self.m.make_room(level, g, n)

    def move(self, pages: list[Page], level: int, room: bool, how: str = "migrate") -> None:
        """Moves pinned pages to ``level`` (CapacityError propagates: nothing changed)."""
        if not pages:
            return
        if room:
            self.make_room(level, pages)
        handles = [p.handle for p in pages]
        sources = {p.level for p in pages}
        if how == "evict":
            r = self.m.evict(handles, level=level)
        elif how == "onboard" and len(sources) == 1:
            r = self.m.onboard(handles, source=sources.pop())
        else:
            r = self.m.migrate(handles, level)
        if r.moved != len(pages) or len(r.dropped):
            self.fail(f"migration to the {CacheLevel.name(level)} level moved {r.moved} of {len(pages)} pages "
                      f"and dropped {len(r.dropped)}")
        for p in pages:
            p.level = level
            self.check_pinned_level(p)
            if p.handle.pool_group != self.h.group_of[level][p.lc]:
                self.fail(f"page {p.serial} is in pool group {p.handle.pool_group} of the {CacheLevel.name(level)} level")
        for p in pages:
            self.verify(p)

    # -- operations --------------------------------------------------------------------------

    def run(self, op: tuple) -> None:
        self.trace.append(op)
        self.ops[op[0]] += 1
        try:
            getattr(self, "op_" + op[0])(*op[1:])
        except CapacityError:
            self.expected["CapacityError"] += 1
            self.trace.append("-> CapacityError")
            for p in self.pinned():  # "nothing was changed": every pinned page is where it was
                self.check_pinned_level(p)

    def op_alloc(self, lc: int, n: int, keyed: bool) -> None:
        n = min(n, MAX_OWNED - len(self.pages))
        if n <= 0:
            return
        keys = [f"t{self.tid}s{self.serial + i}".encode() if keyed and self.h.has_disk else None for i in range(n)]
        handles = self.m.allocate(lc, n, keys=keys if any(keys) else None)
        fresh = []
        for handle, key in zip(handles, keys):
            fresh.append(Page(handle, lc, self.serial, key))
            self.serial += 1
        self.pages += fresh
        for p in fresh:
            # Until it is pinned, another thread's allocation may evict (even drop) the fresh page.
            if len(self.pinned()) >= MAX_PINNED or not self.pin(p):
                continue
            if p.handle.lifecycle != lc or p.handle.key != p.key:
                self.fail(f"fresh page {p.serial} has layer group {p.handle.lifecycle}, key {p.handle.key!r}")
            if p.level == HOT:
                self.write(p)  # else evicted before the pin: written once it is hot again

    def op_write(self, k: int) -> None:
        for p in self.pick(self.pinned(HOT), k):
            self.write(p)

    def op_evict(self, k: int, to_disk: bool, room: bool) -> None:
        level = DISK if to_disk and self.h.has_disk else HOST
        self.move(self.pick(self.pinned(HOT), k), level, room, "evict")

    def op_down(self, k: int, room: bool) -> None:
        if self.h.has_disk:
            self.move(self.pick(self.pinned(HOST), k), DISK, room)

    def op_up(self, k: int, room: bool) -> None:
        if self.h.has_disk:
            self.move(self.pick(self.pinned(DISK), k), HOST, room)

    def op_onboard(self, k: int, room: bool) -> None:
        self.move(self.pick(self.pinned(HOST, DISK), k), HOT, room, "onboard")

    def op_relocate(self, k: int, hot: bool) -> None:
        level = HOT if hot else HOST
        self.move(self.pick(self.pinned(level), k), level, False)

    def op_verify(self, k: int, bring_hot: bool) -> None:
        """Pins any of the thread's pages (pinned or not), checks them, brings them hot."""
        for p in self.pick(self.pages, k):
            if not self.pin(p):
                continue
            try:
                self.verify(p)
                if bring_hot and p.level != HOT:
                    self.move([p], HOT, True, "onboard")
                if p.level == HOT and p.version is None:
                    self.write(p)
            finally:
                self.unpin(p)

    def op_pin(self, k: int) -> None:
        for p in self.pick([p for p in self.pages if p.pins < 2], k):
            if len(self.pinned()) >= MAX_PINNED and not p.pins:
                break
            self.pin(p)

    def op_unpin(self, k: int) -> None:
        for p in self.pick(self.pinned(), k):
            self.unpin(p)

    def op_touch(self, k: int) -> None:
        for p in self.pick(self.pages, k):
            try:
                self.m.touch(p.handle)
            except StalePageError:
                self.drop(p)
                continue
            self.touched += 1

    def op_priority(self, k: int, priority: int) -> None:
        for p in self.pick(self.pages, k):
            try:
                self.m.set_priority(p.handle, priority)
            except StalePageError:
                self.drop(p)

    def op_make_room(self, level: int, lc: int, n: int) -> None:
        if level in self.h.levels:
            self.m.make_room(level, self.h.group_of[level][lc], n)

    def op_set_key(self, k: int) -> None:
        """Gives keyless pinned pages a key (pages not yet on disk) or clears a key."""
        if not self.h.has_disk:
            return
        for p in self.pick([p for p in self.pinned(HOT, HOST)], k):
            key = None if p.key is not None else f"t{self.tid}s{p.serial}k".encode()
            self.m.set_keys([p.handle], [key])
            p.key = key
            if p.handle.key != key:
                self.fail(f"page {p.serial} has key {p.handle.key!r} after set_keys({key!r})")

    def op_find(self, k: int) -> None:
        if not self.h.has_disk:
            return
        keyed = [p for p in self.pinned() if p.key is not None]
        for p in self.pick(keyed, k):
            (found,) = self.m.find_on_disk([p.key])
            want = p.handle if p.level == DISK else None
            if found != want:
                self.fail(f"find_on_disk({p.key!r}) is {found!r} for the pinned page at the {CacheLevel.name(p.level)} level")

    def op_free(self, k: int) -> None:
        for p in self.pick(self.pages, k):
            try:
                self.m.free(p.handle)
            except StalePageError:
                self.drop(p)
                continue
            self.pages.remove(p)
            if p.handle.is_live:
                self.fail(f"freed page {p.serial} is still live")

    def op_resize(self, level: int, factor: float) -> None:
        if level not in self.h.levels:
            return
        quota = int(self.h.base_quota[level] * factor)
        if level == DISK:
            quota = max(CONTAINER * 2, quota // CONTAINER * CONTAINER)
        with self.h.memory.exclusive():  # also keeps other resizes out until the quota is checked
            before = self.m.quota(level)
            try:
                self.m.resize(level, quota)
            except CapacityError:
                if self.m.quota(level) != before:
                    self.fail(f"a refused resize({CacheLevel.name(level)}, {quota}) changed the quota from {before}")
                raise
            if self.m.quota(level) != quota:
                self.fail(f"resize({CacheLevel.name(level)}, {quota}) left the quota at {self.m.quota(level)}")
        for p in self.pinned():  # pinned pages may have been relocated, never evicted
            self.verify(p)

    def op_defrag(self, level: int) -> None:
        if level not in self.h.levels:
            return
        with self.h.memory.exclusive():
            self.m.defragment(level)
        for p in self.pinned():
            self.verify(p)

    def op_stats(self) -> None:
        for level in self.h.levels:
            for g, (total, free) in enumerate(self.m.slot_counts(level)):
                if not 0 <= free <= total:
                    self.fail(f"{CacheLevel.name(level)} pool group {g} has {free} free of {total} slots")


# -- operations as data --------------------------------------------------------------------------

_k = st.integers(1, 4)
_level = st.sampled_from([HOT, HOST, DISK])
OP = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 1), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("write"), _k),
    st.tuples(st.just("evict"), _k, st.booleans(), st.booleans()),
    st.tuples(st.just("down"), _k, st.booleans()),
    st.tuples(st.just("up"), _k, st.booleans()),
    st.tuples(st.just("onboard"), _k, st.booleans()),
    st.tuples(st.just("relocate"), _k, st.booleans()),
    st.tuples(st.just("verify"), _k, st.booleans()),
    st.tuples(st.just("pin"), _k),
    st.tuples(st.just("unpin"), _k),
    st.tuples(st.just("touch"), _k),
    st.tuples(st.just("priority"), _k, st.integers(-2, 2)),
    st.tuples(st.just("make_room"), _level, st.integers(0, 1), st.integers(1, 8)),
    st.tuples(st.just("find"), _k),
    st.tuples(st.just("set_key"), _k),
    st.tuples(st.just("free"), _k),
    st.tuples(st.just("resize"), _level, st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0])),
    st.tuples(st.just("defrag"), _level),
    st.tuples(st.just("stats")),
)

_WEIGHTS = {"alloc": 8, "write": 4, "evict": 6, "down": 4, "up": 3, "onboard": 6, "relocate": 2, "verify": 5,
            "pin": 3, "unpin": 4, "touch": 2, "priority": 1, "make_room": 2, "find": 2, "set_key": 1, "free": 4,
            "resize": 1, "defrag": 1, "stats": 1}


def random_op(rng: random.Random) -> tuple:
    """The same operations as OP, drawn from a seeded generator (the duration tests)."""
    name = rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()))[0]
    k, b = rng.randint(1, 4), lambda: rng.random() < 0.5
    return {
        "alloc": lambda: (name, rng.randint(0, 1), rng.randint(1, 5), b()),
        "evict": lambda: (name, k, b(), b()),
        "down": lambda: (name, k, b()), "up": lambda: (name, k, b()), "onboard": lambda: (name, k, b()),
        "relocate": lambda: (name, k, b()), "verify": lambda: (name, k, b()),
        "priority": lambda: (name, k, rng.randint(-2, 2)),
        "make_room": lambda: (name, rng.choice([HOT, HOST, DISK]), rng.randint(0, 1), rng.randint(1, 8)),
        "resize": lambda: (name, rng.choice([HOT, HOST, DISK]), rng.choice([0.25, 0.5, 1.0, 1.5, 2.0])),
        "defrag": lambda: (name, rng.choice([HOT, HOST, DISK])),
        "stats": lambda: (name,),
    }.get(name, lambda: (name, k))()


# -- running and checking ------------------------------------------------------------------------


def run_concurrently(h: Harness, workers: list[Worker], programs) -> None:
    """Runs each worker's program (an iterable of operations) in its own thread, plus a monitor
    thread sampling the slot accounting; re-raises the first failure with its context."""
    errors: list[tuple[int, BaseException]] = []
    done = threading.Event()
    start = threading.Barrier(len(workers) + 1)

    def work(w: Worker, program):
        try:
            start.wait()
            for op in program:
                w.run(op)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((w.tid, e))

    def monitor():
        start.wait()
        while not done.is_set():
            for level in h.levels:
                for g, (total, free) in enumerate(h.m.slot_counts(level)):
                    if not 0 <= free <= total:
                        errors.append((-1, Failure(f"{CacheLevel.name(level)} pool group {g}: {free} free of {total}")))
            time.sleep(0.002)

    threads = [threading.Thread(target=work, args=(w, p)) for w, p in zip(workers, programs)]
    mon = threading.Thread(target=monitor)
    for t in threads + [mon]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    mon.join()
    if errors:
        tid, e = errors[0]
        if isinstance(e, Failure):
            raise e
        w = next((w for w in workers if w.tid == tid), None)
        trace = list(w.trace) if w else []
        where = "".join(traceback.format_tb(e.__traceback__)[-3:])
        raise Failure(f"thread {tid} (seed {workers[0].seed}) raised an undocumented {type(e).__name__}: {e}; "
                      f"last operations: {trace}\n{where}") from e


def check_quiescent(h: Harness, workers: list[Worker]) -> None:
    """With no thread running: the manager's accounting equals the model, page by page."""
    m = h.m
    where = collections.Counter()  # (level, group) -> live pages
    unpinned = collections.Counter()
    for w in workers:
        for p in list(w.pages):
            if not p.handle.is_live:
                w.drop(p)
                continue
            level, group_ = p.handle.level, p.handle.pool_group
            if p.pins:
                w.check_pinned_level(p)
            elif level < p.level:
                w.fail(f"unpinned page {p.serial} came back hotter without its owner")
            assert m.pins(p.handle) == p.pins, (w.tid, p.serial)
            assert group_ == h.group_of[level][p.lc], (w.tid, p.serial, level, group_)
            where[level, group_] += 1
            unpinned[level, group_] += p.pins == 0
    for level in h.levels:
        for g, st_ in enumerate(m.level_stats(level)):
            assert st_["used"] == where[level, g], (CacheLevel.name(level), g, st_, where[level, g])
            assert st_["evictable"] == unpinned[level, g], (CacheLevel.name(level), g, st_, unpinned[level, g])
            assert 0 <= st_["used"] <= st_["slots"] and st_["peak"] >= st_["used"], st_
    if h.has_disk:
        for g in range(m.num_pool_groups(DISK)):
            assert m.disk_stats(g)["slots_live"] == where[DISK, g], (g, m.disk_stats(g), where[DISK, g])
        assert m.page_ring()["live_leases"] == 0


def check_drops_and_hits(h: Harness, workers: list[Worker]) -> None:
    lost = sum(w.lost for w in workers)
    drops = sum(s["drops"] for lvl in h.levels for s in h.m.level_stats(lvl))
    dropped = sum(s.pages_dropped for lvl in h.levels for s in h.m.stats(lvl))
    assert dropped == 0, "the concat codec is not checked and the disk never failed: nothing is dropped on read"
    assert lost == drops, f"{lost} pages went stale without being freed, but the levels counted {drops} drops"
    hits = sum(s["hits"] for lvl in h.levels for s in h.m.level_stats(lvl))
    assert hits == sum(w.touched for w in workers), (hits, [w.touched for w in workers])


def check_transfer_counters(h: Harness) -> None:
    """The per-level counters add up to what the observers saw, from every thread: codec
    transfers count at both ends (offloaded / onboarded), raw copies at the destination (as in
    test_kvcm_disk.py's host -> disk -> host test)."""
    r = h.transfers
    want = {
        HOT: (r[HOT, HOST] + r[HOT, DISK], r[HOST, HOT] + r[DISK, HOT], r[HOT, HOT]),
        HOST: (r[HOT, HOST], r[HOST, HOT], r[HOST, HOST] + r[DISK, HOST]),
        DISK: (r[HOT, DISK], r[DISK, HOT], r[HOST, DISK]),
    }
    for level in h.levels:
        stats = h.m.stats(level)
        got = (sum(s.pages_offloaded for s in stats), sum(s.pages_onboarded for s in stats),
               sum(s.pages_copied for s in stats))
        assert got == want[level], (CacheLevel.name(level), "offloaded, onboarded, copied", got, want[level], dict(r))


def finish(h: Harness, workers: list[Worker]) -> None:
    """Single-threaded: checks the accounting, brings every page hot and verifies it, frees
    everything, and checks that every slot is free and the whole hot capacity is usable."""
    m = h.m
    check_quiescent(h, workers)
    for w in workers:
        for p in w.pinned():
            while p.pins:
                w.unpin(p)
    check_quiescent(h, workers)
    for w in workers:
        w.trace.append("final check")
        for p in list(w.pages):
            if not w.pin(p):
                continue
            w.verify(p)
            if p.level != HOT:
                w.move([p], HOT, True, "onboard")  # nothing else is pinned: this must fit
            w.verify(p)
            w.unpin(p)
    check_quiescent(h, workers)
    check_drops_and_hits(h, workers)
    check_transfer_counters(h)
    for w in workers:
        for p in list(w.pages):
            try:
                m.free(p.handle)
            except StalePageError:
                w.drop(p)  # dropped by the final check's evictions
                continue
            w.pages.remove(p)
    check_drops_and_hits(h, workers)
    for level in h.levels:
        for g, (total, free) in enumerate(m.slot_counts(level)):
            assert total >= 1 and free == total, (CacheLevel.name(level), g, total, free)
        for st_ in m.level_stats(level):
            assert st_["used"] == 0 and st_["evictable"] == 0, st_
    if h.has_disk:
        assert all(m.disk_stats(g)["slots_live"] == 0 for g in range(m.num_pool_groups(DISK)))
        assert m.unclaimed_on_disk() == 0
    # Every hot slot is usable again: allocating the whole capacity evicts nothing.
    evictions = sum(s["evictions"] for s in m.level_stats(HOT))
    for lc in range(len(GROUPS)):
        total, _ = m.slot_counts(HOT)[h.group_of[HOT][lc]]
        pages = m.allocate(lc, total)
        assert len(pages) == total and len({p.slot for p in pages}) == total
        m.free(pages)
    assert sum(s["evictions"] for s in m.level_stats(HOT)) == evictions


def make_harness(kind: str, device: str, disk_dir) -> Harness:
    return Harness(device, str(disk_dir) if kind == "disk" else None)


# -- the tests -----------------------------------------------------------------------------------

KINDS = ["host", "disk"]


# Every program starts by owning pages of both layer groups, so the drawn operations act on some.
PROLOGUE = [("alloc", 0, 4, True), ("alloc", 1, 4, False)]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=STRESS_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
@given(programs=st.lists(st.lists(OP, min_size=30, max_size=80), min_size=THREADS, max_size=THREADS),
       seed=st.integers(0, 2**32 - 1))
def test_concurrent_programs_keep_every_page(kind, programs, seed):
    """Four threads, each with its own hypothesis-drawn program, against one CPU manager."""
    disk_dir = tempfile.mkdtemp(prefix="kvcm-threads-") if kind == "disk" else None
    try:
        h = make_harness(kind, "cpu", disk_dir)
        workers = [Worker(h, t, seed) for t in range(THREADS)]
        run_concurrently(h, workers, [PROLOGUE + p for p in programs])
        finish(h, workers)
        h.m.close()
    finally:
        if disk_dir:
            shutil.rmtree(disk_dir, ignore_errors=True)


def _stress(kind: str, device: str, tmp_path, seconds: float, threads: int, seed: int) -> None:
    h = make_harness(kind, device, tmp_path / "disk")
    workers = [Worker(h, t, seed) for t in range(threads)]
    deadline = time.monotonic() + seconds

    def program(w: Worker):
        rng = random.Random(f"ops:{seed}:{w.tid}")
        while time.monotonic() < deadline:
            yield random_op(rng)

    run_concurrently(h, workers, [program(w) for w in workers])
    ops = sum(sum(w.ops.values()) for w in workers)
    finish(h, workers)
    # The run did real work: pages moved through every level, were checked, and some
    # operations met a full level.
    moved_to = {lvl: sum(s.pages_offloaded + s.pages_onboarded + s.pages_copied for s in h.m.stats(lvl))
                for lvl in h.levels}
    assert ops >= 50 * threads, ops
    assert all(moved_to[lvl] > 0 for lvl in h.levels), moved_to
    assert sum(w.verified for w in workers) >= 20 * threads
    h.m.close()


@pytest.mark.parametrize("kind", KINDS)
def test_random_operations_for_a_while(kind, tmp_path):
    """KVCODEC_STRESS_SECONDS of random operations from KVCODEC_STRESS_THREADS threads (CPU)."""
    _stress(kind, "cpu", tmp_path, STRESS_SECONDS, STRESS_THREADS, STRESS_SEED)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.available(), reason=f"needs a CUDA device and cuda-python: {gpu.unavailable_reason()}")
@pytest.mark.parametrize("kind", KINDS)
def test_random_operations_for_a_while_on_the_gpu(kind, tmp_path):
    """The same on the CUDA backend: hot pages are kvcodec_sdk.gpu.DeviceArray views written from the
    host (no torch)."""
    _stress(kind, "cuda:0", tmp_path, max(STRESS_SECONDS, 2.0), STRESS_THREADS, STRESS_SEED)
