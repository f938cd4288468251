"""``kvcodec bench workload``: a multi-turn, prefix-reuse engine workload on the KV-cache manager.

A deterministic (seeded) simulation of an inference engine: ``sessions`` sessions, each bound to
one of ``prefixes`` long shared prefixes (``prefix_pages`` pages, named by content keys shared by
every session of that prefix), take ``turns`` turns in a shuffled interleaving. A turn needs the
session's prefix pages and all pages of its earlier turns, plus ``new_pages`` fresh pages. Per turn
the engine:

1. looks every needed page up by its key: a *hot* hit, a *host* hit, a *disk* hit (with a disk
   tier) or a *miss* (never made, or dropped by the last level);
2. pins and touches the pages it found (in use: never evicted while the turn runs);
3. makes room on the hot level and onboards the host (and disk) hits;
4. allocates the misses (recompute) and the new pages in one call — under pressure this evicts
   least-recently-used pages to the host tier (or drops them without one) — and writes them;
5. verifies every page it uses, byte for byte, against a pattern derived from its key (a wrong
   byte fails the benchmark), then unpins at the turn's end.

With a disk tier and ``prefetch``, the engine also acts as a scheduler that knows its queue:
before each turn it prefetches the next turn's disk pages to the host tier in the background
(``KVCacheManager.prefetch``, at most one turn's pages in flight or unused), so the next turn
finds them as host hits; the run then reports the prefetch counters and their hit rate (pages
used / pages prefetched).

The working set (all prefixes plus every session's pages) is larger than the hot quota. The same
workload runs twice in one invocation: with the host tier and with it disabled (``host_quota=0``,
a GPU-only manager whose evictions drop). Reported per run:

* hit rate per level (lookups found at each level / all lookups; the rest are misses, of which
  ``cold_misses`` were never written before: the first use of a prefix);
* pages moved per second: pages the manager migrated (observer records) / seconds spent in the
  manager's migrating calls (``make_room``, ``onboard``, ``allocate``), completion included;
* host CPU microseconds per migrated page: thread CPU time inside those calls / pages moved
  (on the CPU backend the codec copies on the calling thread, so this includes the copy);
* allocation under pressure: wall time of each ``allocate`` call that found too few free hot
  slots (completion included), median and p99, and microseconds per allocated page;
* the ratio of the host-tier run to the hot-only run for each.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import _native, gpu
from ..kvcm_config import BufferDesc, DiskTierConfig, KVCacheConfig, LayerGroupConfig
from ..layout import Role
from ..manager import CacheLevel, KVCacheManager
from ._common import Column, KiB, Table, Unpadded, put_rows, take_rows
from ._common import advance as _advance
from ._common import fmt_range as _fmt_range
from ._common import log as _log
from ._common import spread as _spread
from ._common import steps as _steps

LEVELS = ("hot", "host", "disk", "miss")


@dataclass
class Workload:
    """Shape of the simulated workload (all sizes in pages unless named otherwise)."""

    sessions: int = 64
    turns: int = 4
    prefixes: int = 4
    prefix_pages: int = 32
    new_pages: int = 4  # fresh pages per turn
    layers: int = 2  # each layer has a K and a V buffer of piece_bytes
    piece_bytes: int = 4 * KiB
    hot_fraction: float = 0.25  # hot quota as a fraction of the working set
    host_fraction: float = 0.75  # host quota as a fraction of the working set (host run)
    seed: int = 1
    prefetch: bool = False  # with a disk tier: prefetch the next turn's disk pages (host-tier run)

    def validate(self) -> None:
        """Raises ValueError naming the first invalid field, its value and what is valid."""
        for name in ("sessions", "turns", "prefixes", "prefix_pages", "new_pages", "layers", "piece_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"workload {name} is {value!r}; it must be an integer >= 1")
        if self.prefixes > self.sessions:
            raise ValueError(f"workload prefixes is {self.prefixes}; it must be at most sessions ({self.sessions})")
        for name in ("hot_fraction", "host_fraction"):
            value = getattr(self, name)
            if not 0 < value <= 4:
                raise ValueError(f"workload {name} is {value!r}; it must be in (0, 4]")
        if self.hot_slots() < self.turn_pages():
            raise ValueError(
                f"workload hot_fraction is {self.hot_fraction}: {self.hot_slots()} hot slots, but one turn pins up to "
                f"{self.turn_pages()} pages; the hot level needs at least that many")

    @property
    def page_bytes(self) -> int:
        """Bytes of one hot page (a K and a V buffer per layer)."""
        return 2 * self.layers * self.piece_bytes

    def working_set(self) -> int:
        """Distinct pages the whole workload writes."""
        return self.prefixes * self.prefix_pages + self.sessions * self.turns * self.new_pages

    def turn_pages(self) -> int:
        """Most pages one turn uses (and pins) at once."""
        return self.prefix_pages + self.turns * self.new_pages

    def hot_slots(self) -> int:
        """Hot slots of both runs: ``hot_fraction`` of the working set."""
        return int(self.working_set() * self.hot_fraction)

    def host_slots(self) -> int:
        """Host slots of the host-tier run: ``host_fraction`` of the working set."""
        return int(self.working_set() * self.host_fraction)


@dataclass
class RunReport:
    """One run's measurements (see the module docstring for each metric's definition)."""

    host_tier: bool
    hot_slots: int
    host_slots: int
    lookups: int
    hits: dict  # level -> lookups found there (plus "miss")
    hit_rate: dict  # level -> fraction of lookups
    cold_misses: int  # misses of pages never written before (any cache misses them)
    pages_moved: int
    pages_dropped: int  # pages the last level dropped (evictions of the hot-only run)
    migrate_seconds: float
    pages_moved_per_s: float
    host_us_per_moved_page: float | None
    allocations_under_pressure: int
    alloc_p50_us: float | None
    alloc_p99_us: float | None
    alloc_us_per_page: float | None
    pages_verified: int
    wall_seconds: float
    level_stats: dict = field(default_factory=dict)
    prefetch: dict | None = None  # prefetch counters and hit_rate (used / completed), when prefetching
    repeat: int = 1  # runs of the same (seeded) workload: the timed figures are their medians
    spread: dict = field(default_factory=dict)  # timed figure -> {"n", "min", "median", "max"} over the runs


#: The figures of a run that vary between repeats (the counts are the same for the same seed).
TIMED = ("migrate_seconds", "pages_moved_per_s", "host_us_per_moved_page", "alloc_p50_us", "alloc_p99_us",
         "alloc_us_per_page", "wall_seconds")


@dataclass
class Report:
    """Both runs of one invocation and their ratios (host-tier run / hot-only run; None where the
    hot-only value is 0 or absent)."""

    device: str
    workload: dict
    runs: list = field(default_factory=list)  # [with host tier, hot only]
    ratios: dict = field(default_factory=dict)  # host-tier run / hot-only run
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The report as plain JSON-serializable data."""
        out = asdict(self)
        out["runs"] = [asdict(r) for r in self.runs]
        return out


def _seed_of(key: bytes) -> tuple[int, int]:
    """Two pattern parameters derived from a page's key: an offset and an odd multiplier."""
    d = hashlib.blake2b(key, digest_size=8).digest()
    return d[0] | (d[1] << 8), (d[2] | 1)


class _Pattern:
    """Page contents derived from keys: byte ``i`` of a page is ``((i + offset) * mult) mod 256``,
    computed on the host (device pools are written and read through row copies)."""

    def __init__(self, page_bytes: int):
        self.index = np.arange(page_bytes, dtype=np.int64)

    def expected(self, keys: list) -> np.ndarray:
        seeds = [_seed_of(k) for k in keys]
        s = np.array(seeds, dtype=np.int64).reshape(-1, 2)
        return (((self.index[None, :] + s[:, :1]) * s[:, 1:]) & 0xFF).astype(np.uint8)


class _Engine:
    """One run of the workload on one manager."""

    def __init__(self, w: Workload, device: str, host_tier: bool, disk_dir: str | None):
        self.w, self.device = w, device
        buffers = [BufferDesc(layer, role, bytes=w.piece_bytes) for layer in range(w.layers) for role in (Role.KEY, Role.VALUE)]
        disk = None
        if disk_dir is not None:
            disk = DiskTierConfig(disk_dir, max_bytes=2 * w.working_set() * w.page_bytes, io_threads=2)
        self.cfg = KVCacheConfig(
            layer_groups=[LayerGroupConfig(buffers)], gpu_quota=w.hot_slots() * w.page_bytes,
            host_quota=w.host_slots() * w.page_bytes if host_tier else 0, device=device, disk=disk)
        self.m = KVCacheManager(self.cfg)
        self.host_tier = host_tier
        self.disk = disk is not None
        self.hot_group = self.m.lifecycle_to_pool_group(CacheLevel.HOT)[0]
        self.pools = self.m.hot_pool_tensors(0, framework="cuda" if device != "cpu" else "numpy")
        self.pool_bytes = [int(p.shape[1]) for p in self.pools]
        self.pattern = _Pattern(w.page_bytes)
        self.pages: dict[bytes, int] = {}  # key -> page id (may have been dropped since)
        self.moved = 0
        self.m.add_migration_observer(self._observe)
        self.hits = dict.fromkeys(LEVELS, 0)
        self.migrate_s = 0.0
        self.migrate_cpu = 0.0
        self.alloc_s: list[float] = []
        self.alloc_pages = 0
        self.verified = 0
        self.cold_misses = 0

    def _observe(self, rec) -> None:
        self.moved += rec.pages

    def _sync(self) -> None:
        self.m.synchronize()

    def _timed(self, call):
        """Runs a migrating manager call; accounts its wall time (completion included) and its
        host CPU time (submission only: a blocking wait may spin)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        out = call()
        c1 = time.thread_time()
        self.m.synchronize()
        dt = time.perf_counter() - t0
        self.migrate_s += dt
        self.migrate_cpu += c1 - c0
        return out, dt

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        return np.array([self.m._live().info(int(i)).slot for i in ids.tolist()], dtype=np.int64)

    def _write(self, ids: np.ndarray, keys: list) -> None:
        exp = self.pattern.expected(keys)
        slots = self._slots(ids)
        off = 0
        for pool, nb in zip(self.pools, self.pool_bytes):
            put_rows(pool, slots, exp[:, off:off + nb])  # synchronized: before any migration reads it
            off += nb

    def _verify(self, ids: np.ndarray, keys: list, what: str) -> None:
        if not len(keys):
            return
        exp = self.pattern.expected(keys)
        slots = self._slots(ids)
        off = 0
        for p, (pool, nb) in enumerate(zip(self.pools, self.pool_bytes)):
            got = take_rows(pool, slots)
            bad = got != exp[:, off:off + nb]
            if bool(bad.any()):
                row = int(np.argwhere(bad)[0][0])
                raise RuntimeError(f"page {keys[row]!r} ({what}) has wrong bytes in hot pool {p}: the manager "
                                   f"corrupted or lost it")
            off += nb
        self.verified += len(keys)

    def _lookup(self, key: bytes) -> int:
        page = self.pages.get(key)
        if page is None or not self.m._live().is_live(page):
            return -1
        return int(self.m._live().info(page).level)

    def _needed(self, session: int, turn: int) -> list[bytes]:
        w = self.w
        needed = [f"p{session % w.prefixes}/{i}".encode() for i in range(w.prefix_pages)]
        return needed + [f"s{session}/{i}".encode() for i in range(turn * w.new_pages)]

    def prefetch(self, session: int, turn: int) -> None:
        """Warms the host tier with the disk pages a coming turn needs (returns at once)."""
        ids = [self.pages[k] for k in self._needed(session, turn) if self._lookup(k) == CacheLevel.DISK]
        if ids:
            self.m.prefetch(np.array(ids, dtype=np.uint64), max_bytes=self.w.turn_pages() * self.w.page_bytes)

    def turn(self, session: int, turn: int) -> None:
        w, m = self.w, self.m
        needed = self._needed(session, turn)
        found: dict[int, list] = {CacheLevel.HOT: [], CacheLevel.HOST: [], CacheLevel.DISK: []}
        missing: list[bytes] = []
        for key in needed:
            level = self._lookup(key)
            if level < 0:
                missing.append(key)
                self.hits["miss"] += 1
                self.cold_misses += key not in self.pages
            else:
                found[level].append(key)
                self.hits[CacheLevel.name(level)] += 1
        fresh = [f"s{session}/{turn * w.new_pages + i}".encode() for i in range(w.new_pages)]
        in_use = [self.pages[k] for lvl in found.values() for k in lvl]
        ids_in_use = np.array(in_use, dtype=np.uint64)
        m.pin(ids_in_use)  # before any room is made: the pages this turn found stay put
        m.touch(ids_in_use)
        try:
            hot_ids = np.array([self.pages[k] for k in found[CacheLevel.HOT]], dtype=np.uint64)
            self._verify(hot_ids, found[CacheLevel.HOT], "hot hit")
            for source in (CacheLevel.HOST, CacheLevel.DISK):
                keys = found[source]
                if not keys:
                    continue
                ids = np.array([self.pages[k] for k in keys], dtype=np.uint64)
                need = len(keys) - m.slot_counts(CacheLevel.HOT)[self.hot_group][1]
                if need > 0:
                    self._timed(lambda: m.make_room(CacheLevel.HOT, self.hot_group, len(keys)))
                # migrate, not onboard(source=...): a disk page still in flight to the host (a
                # prefetch) is at the host level once the call has waited for it.
                res, _ = self._timed(lambda: m.migrate(ids, CacheLevel.HOT))
                if len(res.dropped):
                    raise RuntimeError(f"{len(res.dropped)} pages were dropped while onboarding from "
                                       f"{CacheLevel.name(source)} (concat has no envelope: none should be)")
                self._verify(ids, keys, f"{CacheLevel.name(source)} hit, onboarded")
            # Recompute the misses and allocate the new pages in one call.
            make = missing + fresh
            pressure = m.slot_counts(CacheLevel.HOT)[self.hot_group][1] < len(make)
            pages, dt = self._timed(lambda: m.allocate(0, len(make)))
            if pressure:
                self.alloc_s.append(dt)
                self.alloc_pages += len(make)
            if self.disk:
                m.set_keys(pages, make)
            for k, pid in zip(make, pages.ids.tolist()):
                self.pages[k] = pid
            m.pin(pages)
            self._write(pages.ids, make)
            self._verify(pages.ids, make, "written this turn")
            # The earlier checks ran before this turn's evictions: re-check the pages in use, so an
            # eviction that touched a pinned page shows up.
            self._verify(ids_in_use, [k for lvl in found.values() for k in lvl], "in use at the turn's end")
            m.unpin(pages)
        finally:
            m.unpin(ids_in_use)

    def close(self) -> None:
        self.m.close()


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.array(values), q)) * 1e6 if values else None


def _run_once(w: Workload, device: str, host_tier: bool, disk_dir: str | None, progress: bool) -> RunReport:
    engine = _Engine(w, device, host_tier, disk_dir)
    rng = np.random.default_rng(w.seed)
    # Every session's turns in order, sessions interleaved at random (deterministic per seed).
    order = np.repeat(np.arange(w.sessions), w.turns)
    rng.shuffle(order)
    next_turn = [0] * w.sessions
    prefetching = w.prefetch and engine.disk and host_tier
    queue = order.tolist()
    t0 = time.perf_counter()
    for i, s in enumerate(queue):
        if prefetching and i + 1 < len(queue):
            following = queue[i + 1]
            engine.prefetch(following, next_turn[following] + (following == s))
        engine.turn(s, next_turn[s])
        next_turn[s] += 1
    engine._sync()
    wall = time.perf_counter() - t0
    m = engine.m
    stats = {CacheLevel.name(lv): m.level_stats(lv)
             for lv in (CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK)
             if (lv != CacheLevel.HOST or host_tier) and (lv != CacheLevel.DISK or engine.disk)}
    lookups = sum(engine.hits.values())
    moved = engine.moved
    host_slots = m.slot_counts(CacheLevel.HOST)[0][0] if host_tier else 0
    report = RunReport(
        host_tier=host_tier, hot_slots=m.slot_counts(CacheLevel.HOT)[engine.hot_group][0], host_slots=host_slots,
        lookups=lookups, hits=dict(engine.hits),
        hit_rate={k: (v / lookups if lookups else 0.0) for k, v in engine.hits.items()},
        cold_misses=engine.cold_misses,
        pages_moved=moved, pages_dropped=sum(g["drops"] for level in stats.values() for g in level),
        migrate_seconds=engine.migrate_s,
        pages_moved_per_s=moved / engine.migrate_s if engine.migrate_s > 0 else 0.0,
        host_us_per_moved_page=engine.migrate_cpu / moved * 1e6 if moved else None,
        allocations_under_pressure=len(engine.alloc_s),
        alloc_p50_us=_pct(engine.alloc_s, 50), alloc_p99_us=_pct(engine.alloc_s, 99),
        alloc_us_per_page=sum(engine.alloc_s) / engine.alloc_pages * 1e6 if engine.alloc_pages else None,
        pages_verified=engine.verified, wall_seconds=wall, level_stats=stats)
    if prefetching:
        p = m.prefetch_stats()
        report.prefetch = asdict(p) | {"hit_rate": p.used / p.completed if p.completed else 0.0}
    engine.close()
    _log(progress, f"{'host tier' if host_tier else 'hot only '}: hit rate "
                   + ", ".join(f"{k} {v:.3f}" for k, v in report.hit_rate.items())
                   + f"; {moved} pages moved; {report.allocations_under_pressure} allocations under pressure; "
                   f"{wall:.2f} s")
    return report


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def _merge(runs: list[RunReport]) -> RunReport:
    """Repeats of one run as one: the first run's counts (the same in every repeat: the workload
    is seeded), the median of each timed figure and its spread."""
    out = runs[0]
    for r in runs[1:]:
        if r.hits != out.hits:
            raise RuntimeError(f"the seeded workload hit differently in two repeats ({out.hits} and {r.hits})")
    out.repeat = len(runs)
    for name in TIMED:
        values = [getattr(r, name) for r in runs if getattr(r, name) is not None]
        if values:  # (a run with no allocation under pressure, or nothing moved, has none)
            out.spread[name] = _spread(values)
            setattr(out, name, out.spread[name]["median"])
    return out


def run(device: str = "auto", workload: Workload | None = None, disk_dir: str | None = None,
        progress: bool = True, repeat: int = 1) -> Report:
    """Runs the workload with the host tier and without it on ``device`` ('auto', 'cpu',
    'cuda[:N]'), each ``repeat`` times (the timed figures are the medians); ``disk_dir`` adds a
    disk tier to both runs. Raises RuntimeError on a wrong byte."""
    w = workload or Workload()
    w.validate()
    if repeat < 1:
        raise ValueError(f"repeat is {repeat}; it must be >= 1")
    if device == "auto":
        device = "cuda:0" if _native.driver_info()["device_count"] > 0 else "cpu"
    if device != "cpu":
        if device == "cuda":
            device = "cuda:0"
        why = gpu.unavailable_reason()
        if why is not None:
            raise RuntimeError(f"device {device!r} requested, but the GPU workload cannot run: {why}")
    report = Report(device, asdict(w) | {"working_set_pages": w.working_set(), "page_bytes": w.page_bytes},
                    info=dict(_native.driver_info()))
    if device != "cpu":
        report.info["gpu"] = gpu.device(device).name
    _log(progress, f"{w.sessions} sessions x {w.turns} turns, {w.prefixes} prefixes of {w.prefix_pages} pages, "
                   f"{w.new_pages} new pages/turn; working set {w.working_set()} pages of {w.page_bytes // KiB} KiB, "
                   f"hot {w.hot_slots()} slots, host {w.host_slots()} slots")
    _steps(progress, 2 * repeat)
    for host_tier in (True, False):
        runs = []
        for _ in range(repeat):
            if disk_dir is None:
                runs.append(_run_once(w, device, host_tier, None, progress))
            else:
                with tempfile.TemporaryDirectory(dir=disk_dir) as d:
                    runs.append(_run_once(w, device, host_tier, os.path.join(d, "kv"), progress))
            _advance(progress)
        report.runs.append(_merge(runs))
    with_host, hot_only = report.runs
    reuse = lambda r: 1.0 - r.hit_rate["miss"]  # noqa: E731
    report.ratios = {
        "hit_rate": _ratio(reuse(with_host), reuse(hot_only)),
        "hot_hit_rate": _ratio(with_host.hit_rate["hot"], hot_only.hit_rate["hot"]),
        "misses": _ratio(with_host.hits["miss"], hot_only.hits["miss"]),
        "pages_dropped": _ratio(with_host.pages_dropped, hot_only.pages_dropped),
        "pages_moved_per_s": _ratio(with_host.pages_moved_per_s, hot_only.pages_moved_per_s),
        "host_us_per_moved_page": _ratio(with_host.host_us_per_moved_page, hot_only.host_us_per_moved_page),
        "alloc_p50": _ratio(with_host.alloc_p50_us, hot_only.alloc_p50_us),
        "alloc_p99": _ratio(with_host.alloc_p99_us, hot_only.alloc_p99_us),
        "wall": _ratio(with_host.wall_seconds, hot_only.wall_seconds),
    }
    return report


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(report: Report) -> Table:
    """The report as table cells (see :class:`Table`): one row per run, then the ratios."""
    w = report.workload
    title = (f"prefix-reuse workload on {report.device}: {w['sessions']} sessions x {w['turns']} turns, {w['prefixes']} "
             f"prefixes of {w['prefix_pages']} pages, {w['new_pages']} new pages/turn, working set "
             f"{w['working_set_pages']} pages of {w['page_bytes'] // KiB} KiB"
             + (f", median of {report.runs[0].repeat} runs" if report.runs and report.runs[0].repeat > 1 else ""))
    cols = [Column("run", 10, "<"), Column("hot", 6), Column("host", 6), Column("disk", 6), Column("miss", 6),
            Column("moved", 7), Column("dropped", 7), Column("pages/s", 10), Column("cpu us/pg", 9),
            Column("alloc p50 us", 12), Column("alloc p99 us", 12), Column("us/alloc pg", 11), Column("verified", 9),
            Column("pages/s min-max", 0, "<", "  ")]

    def cell(x, fmt: str) -> str:
        return Unpadded("-") if x is None else format(x, fmt)

    rows = []
    for r in report.runs:
        hr = r.hit_rate
        rows.append(["host tier" if r.host_tier else "hot only", f"{hr['hot']:.3f}", f"{hr['host']:.3f}",
                     f"{hr['disk']:.3f}", f"{hr['miss']:.3f}", str(r.pages_moved), str(r.pages_dropped),
                     f"{r.pages_moved_per_s:.0f}", cell(r.host_us_per_moved_page, ".2f"), cell(r.alloc_p50_us, ".1f"),
                     cell(r.alloc_p99_us, ".1f"), cell(r.alloc_us_per_page, ".2f"), str(r.pages_verified),
                     _fmt_range(r.spread.get("pages_moved_per_s"), ".0f")])
    notes = ["host tier / hot only: " + ", ".join(f"{k} {_f(v, '.2f')}" for k, v in report.ratios.items())]
    for r in report.runs:
        if r.prefetch:
            p = r.prefetch
            notes.append(f"prefetch (host tier run): {p['issued']} pages issued, {p['completed']} landed, {p['used']} "
                         f"used, {p['wasted']} wasted, {p['skipped']} skipped: hit rate {p['hit_rate']:.3f}")
    return Table([title], cols, rows, notes)


def format_table(report: Report) -> str:
    """The report as a text table: one line per run, then the ratios."""
    return table(report).plain()
