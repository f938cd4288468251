"""``kvcodec bench disk``: the disk tier's throughput against the file system's own ceiling.

Everything runs in one temporary directory on the file system under test, in one run:
  * ceiling: raw sequential throughput of one file written (then read) in large 8 MiB chunks
    with one fdatasync at the end: the better of O_DIRECT (where accepted) and buffered I/O;
  * baseline: one synchronous pwrite (pread) per page on the calling thread, the pattern of a
    disk tier driven from a stream callback; its durable variant adds an fdatasync per page;
  * store: DiskRegion with pages submitted asynchronously (``depth`` in flight), every write
    acknowledged durable (data and journal record synced) before it counts; once per I/O backend
    (the thread pool, and io_uring where the kernel allows it), same workers and pages. Pages read
    back are compared with what was written after the timed loop, so the comparison does not
    count as store time;
  * recovery: reopening a region of ``recovery_slots`` slots, from the snapshot and from the
    journal alone.
Reported: GB/s and ratios store/ceiling (target >= 0.9) and store/baseline (target >= 1.5; a
baseline that the kernel's readahead already brings to the ceiling makes this one unreachable,
and the row says so); recovery seconds (target <= 1 s for 1M slots). The ``store_*`` keys are the
store's default backend (``io_backend="threads"``); ``store_<backend>_*`` every backend.
"""

from __future__ import annotations

import inspect
import mmap
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from ..disk import DiskRegion
from ._common import Column, KiB, MiB, Table
from ._common import advance as _advance
from ._common import fmt_range as _fmt_range
from ._common import log as _log
from ._common import spread as _spread
from ._common import steps as _steps

TARGET_RATIO = 0.9
TARGET_BASELINE_RATIO = 1.5
BACKENDS = ("threads", "io_uring")
TARGET_RECOVERY_S = 1.0


@dataclass
class Report:
    dir: str
    io: str
    slot_bytes: int
    total_bytes: int
    io_threads: int
    depth: int
    queue_depth: int = 8
    backends: list = field(default_factory=list)
    default_backend: str = "threads"
    manager: list = field(default_factory=list)  #: disk_manager.ManagerRow per codec and path
    gbps: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    recovery: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    repeat: int = 1  #: measurements of each figure: gbps and recovery hold their medians
    spread: dict = field(default_factory=dict)  #: gbps key, or "recovery_<key>" -> {"n", "min", "median", "max"}
    depth_sweep: list = field(default_factory=list)  #: the store at each depth: {"depth", "write_gbps", ...}
    recovery_sweep: list = field(default_factory=list)  #: recovery at each size: {"slots", "snapshot_s", ...}

    def to_json(self) -> dict:
        d = asdict(self)
        d["round_trip"] = self.round_trip()
        return d

    def round_trip(self) -> dict:
        """Per codec: hot -> disk -> hot through the manager as a ratio to the store alone (cold
        bytes, write and read together), and its raw bytes as a ratio to the store's."""
        out: dict = {}
        w, r = self.gbps.get("store_write", 0.0), self.gbps.get("store_read", 0.0)
        for codec in dict.fromkeys(row.codec for row in self.manager):
            rows = {row.path: row for row in self.manager if row.codec == codec and row.mode == "blocking"}
            ev, on = rows.get("hot->disk"), rows.get("disk->hot")
            if not (ev and on and w and r):
                continue
            store_s = 1 / w + 1 / r
            out[codec] = {"cold_vs_store": store_s / (1 / ev.cold_gbps + 1 / on.cold_gbps),
                          "raw_vs_store": store_s / (1 / ev.raw_gbps + 1 / on.raw_gbps)}
        return out


def _aligned(nbytes: int) -> np.ndarray:
    """Page-aligned buffer (O_DIRECT needs aligned memory)."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _sequential(path: str, total: int, direct: bool, chunk: int = 8 * MiB) -> tuple[float, float]:
    """Raw sequential write and read GB/s of one file (the physical ceiling in this run)."""
    buf = _aligned(chunk)
    buf[:] = np.random.default_rng(0).integers(0, 256, chunk, dtype=np.uint8)
    flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.posix_fallocate(fd, 0, total)
        os.fsync(fd)
        t0 = time.perf_counter()
        for off in range(0, total, chunk):
            os.pwritev(fd, [memoryview(buf)[: min(chunk, total - off)]], off)
        os.fdatasync(fd)
        write_s = time.perf_counter() - t0
        if not direct:
            _drop_cache(path)
        t0 = time.perf_counter()
        for off in range(0, total, chunk):
            os.preadv(fd, [memoryview(buf)[: min(chunk, total - off)]], off)
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return total / write_s / 1e9, total / read_s / 1e9


def _baseline(path: str, pages: np.ndarray, slot: int, durable: bool) -> tuple[float, float]:
    """One synchronous pwrite (+ fdatasync when durable) and pread per page, buffered."""
    n = pages.shape[0]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, n * slot)
        t0 = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, pages[i], i * slot)
            if durable:
                os.fdatasync(fd)
        os.fdatasync(fd)
        write_s = time.perf_counter() - t0
        _drop_cache(path)
        out = bytearray(slot)
        t0 = time.perf_counter()
        for i in range(n):
            os.preadv(fd, [out], i * slot)
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    nbytes = n * slot
    return nbytes / write_s / 1e9, nbytes / read_s / 1e9


def _store(path: str, pages: np.ndarray, slot: int, io_threads: int, depth: int, backend: str,
           queue_depth: int) -> tuple[float, float, dict]:
    n = pages.shape[0]
    kw = dict(slot_bytes=slot, max_bytes=n * max(slot, 4096) * 2, container_bytes=256 * MiB,
              io_threads=io_threads, io_backend=backend, queue_depth=queue_depth)
    kw["container_bytes"] = min(kw["container_bytes"], kw["max_bytes"])
    keys = [i.to_bytes(16, "little") for i in range(n)]
    with DiskRegion(path, **kw) as r:
        inflight: list[int] = []
        t0 = time.perf_counter()
        for i in range(n):
            inflight.append(r.submit_write(keys[i], pages[i]))
            if len(inflight) >= depth:
                r.wait(inflight.pop(0))
        for t in inflight:
            r.wait(t)
        write_s = time.perf_counter() - t0
        stats = r.stats()
    if not stats["direct_io"]:
        for f in os.listdir(os.path.join(path, "containers")):
            _drop_cache(os.path.join(path, "containers", f))
    out = _aligned(n * slot).reshape(n, slot)
    failed = 0
    with DiskRegion(path, **kw) as r:
        reads: list[int] = []
        t0 = time.perf_counter()
        for i in range(n):
            reads.append(r.submit_read(keys[i], out[i]))
            if len(reads) >= depth:
                failed += not r.wait(reads.pop(0)).ok
        for t in reads:
            failed += not r.wait(t).ok
        read_s = time.perf_counter() - t0
        read_stats = r.stats()
    differ = sum(not np.array_equal(out[i], pages[i]) for i in range(n))
    if failed or differ:
        raise RuntimeError(f"{backend} store: {failed} reads failed and {differ} pages read back differ from what "
                           "was written")
    nbytes = n * slot
    info = {"journal_batches": stats["journal_batches"], "pages": n,
            "pages_per_batch": n / max(1, stats["journal_batches"]), "direct_io": stats["direct_io"],
            "io_backend": stats["io_backend"], "merged_ios": stats["merged_ios"] + read_stats["merged_ios"],
            "queued_submits": stats["queued_submits"] + read_stats["queued_submits"],
            "queued_requests": stats["queued_requests"] + read_stats["queued_requests"]}
    return nbytes / write_s / 1e9, nbytes / read_s / 1e9, info


def _recovery(path: str, slots: int, progress: bool) -> dict:
    """Recovery time of a region holding ``slots`` live pages (small buffered slots: what is
    measured is the index, not the data). Both reopenings are read-only, so neither writes a
    snapshot of its own."""
    slot = 64
    kw = dict(slot_bytes=slot, max_bytes=slots * 4096, container_bytes=min(slots * 4096, 1 << 30),
              io_mode="buffered", io_threads=4, snapshot_every=0, max_batch=16384)
    data = bytes(slot)
    journal_only = path + "-journal"
    with DiskRegion(path, **kw) as r:
        window: list[int] = []
        t0 = time.perf_counter()
        for i in range(slots):
            window.append(r.submit_write(i.to_bytes(16, "little"), data))
            if len(window) >= 8192:
                for t in window:
                    r.wait(t)
                window.clear()
                if progress and i % (1 << 18) < 8192:
                    _log(progress, f"recovery: populated {i + 1}/{slots} slots")
        for t in window:
            r.wait(t)
        populate_s = time.perf_counter() - t0
        # What a crash before the first snapshot leaves: the journal alone (containers linked).
        os.makedirs(os.path.join(journal_only, "containers"))
        for f in os.listdir(os.path.join(path, "containers")):
            os.link(os.path.join(path, "containers", f), os.path.join(journal_only, "containers", f))
        for leaf in ("region.json", "index.log"):
            shutil.copyfile(os.path.join(path, leaf), os.path.join(journal_only, leaf))
    t0 = time.perf_counter()
    with DiskRegion.open_read_only(path) as r:
        from_snapshot = time.perf_counter() - t0
        rec = r.recovery()
        assert len(r) == slots and rec["snapshot_entries"] == slots
    t0 = time.perf_counter()
    with DiskRegion.open_read_only(journal_only) as r:
        from_journal = time.perf_counter() - t0
        rec_j = r.recovery()
        assert len(r) == slots and rec_j["journal_records_replayed"] == slots
    shutil.rmtree(journal_only)
    return {"slots": slots, "snapshot_s": from_snapshot, "snapshot_recover_s": rec["seconds"],
            "journal_s": from_journal, "journal_recover_s": rec_j["seconds"], "populate_s": populate_s,
            "target_s": TARGET_RECOVERY_S}


def run(*, directory: str | None = None, slot_bytes: int = 64 * KiB, total_bytes: int = 512 * MiB,
        io_threads: int = 32, depth: int = 256, recovery_slots: int = 1 << 20, progress: bool = True,
        backends: tuple[str, ...] = BACKENDS, queue_depth: int = 8, codecs: tuple[str, ...] = (),
        device: str = "auto", batch: int = 256, repeat: int = 1, depths: tuple[int, ...] = (),
        recovery_sweep: tuple[int, ...] = (), sweep_bytes: int = 64 * MiB) -> Report:
    """Runs the benchmark (see the module docstring); ``backends`` the store's I/O backends to
    measure (one the kernel refuses is left out, with a note in ``info``); ``codecs`` adds the
    rows through the KV-cache manager on ``device`` (see :mod:`.disk_manager`), in calls of
    ``batch`` pages. Every figure is measured ``repeat`` times (the median is reported, the
    spread beside it); ``depths`` adds the store (default backend) at each depth on up to
    ``sweep_bytes``, ``recovery_sweep`` the recovery time at each number of slots."""
    if repeat < 1:
        raise ValueError(f"repeat is {repeat}; it must be >= 1")

    def say(msg: str) -> None:
        _log(progress, msg)

    work = tempfile.mkdtemp(prefix="kvcodec-bench-disk-", dir=directory)
    try:
        n = max(1, total_bytes // slot_bytes)
        pages = _aligned(n * slot_bytes).reshape(n, slot_bytes)
        rng = np.random.default_rng(1)
        for i in range(0, n, 256):
            pages[i: i + 256] = rng.integers(0, 256, pages[i: i + 256].shape, dtype=np.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = DiskRegion(os.path.join(work, "probe"), slot_bytes=4096, max_bytes=4096, container_bytes=4096,
                               io_backend="auto")
            stats = probe.stats()
            probe.close()
        direct, uring, uring_note = stats["direct_io"], stats["io_backend"] == "io_uring", stats["io_backend_note"]
        default_backend = inspect.signature(DiskRegion).parameters["io_backend"].default  # the store's default
        shutil.rmtree(os.path.join(work, "probe"))
        rep = Report(work, "direct" if direct else "buffered", slot_bytes, n * slot_bytes, io_threads, depth,
                     queue_depth)
        rep.default_backend = default_backend
        rep.backends = [b for b in backends if b != "io_uring" or uring]
        if "io_uring" in backends and "io_uring" not in rep.backends:
            rep.info["io_uring"] = f"not measured: {uring_note}"
        if not rep.backends:
            raise ValueError(f"no I/O backend to measure: {', '.join(backends)} ({uring_note})")
        rep.repeat = repeat
        samples: dict[str, list[float]] = {}

        def measured(key: str, value: float) -> None:
            samples.setdefault(key, []).append(value)
            rep.spread[key] = _spread(samples[key])
            rep.gbps[key] = rep.spread[key]["median"]

        _steps(progress, 3 + bool(recovery_slots) + bool(codecs) + bool(depths) + bool(recovery_sweep))
        say(f"ceiling: sequential {n * slot_bytes // MiB} MiB ({rep.io})" + (f", {repeat} times" if repeat > 1 else ""))
        for _ in range(repeat):
            # The ceiling is the better of direct and buffered sequential I/O on this file system.
            seq = [_sequential(os.path.join(work, "seq"), n * slot_bytes, mode) for mode in ({direct, False})]
            measured("ceiling_write", max(w for w, _ in seq))
            measured("ceiling_read", max(r for _, r in seq))
        _advance(progress)
        say("baseline: one synchronous pwrite/pread per page")
        nd = max(1, min(n, 2048))
        for _ in range(repeat):
            w, r_ = _baseline(os.path.join(work, "base"), pages, slot_bytes, durable=False)
            measured("baseline_write", w)
            measured("baseline_read", r_)
            measured("baseline_durable_write", _baseline(os.path.join(work, "base2"), pages[:nd], slot_bytes,
                                                         durable=True)[0])
        _advance(progress)
        for backend in rep.backends:
            say(f"store ({backend}): {n} pages, {io_threads} I/O threads, depth {depth}"
                + (f", queue depth {queue_depth} per thread" if backend == "io_uring" else ""))
            for _ in range(repeat):
                w, r_, info = _store(os.path.join(work, "store"), pages, slot_bytes, io_threads, depth, backend,
                                     queue_depth)
                shutil.rmtree(os.path.join(work, "store"))
                measured(f"store_{backend}_write", w)
                measured(f"store_{backend}_read", r_)
            rep.info[f"store_{backend}"] = info
            for d in ("write", "read"):
                rep.ratios[f"{backend}_{d}_vs_ceiling"] = rep.gbps[f"store_{backend}_{d}"] / rep.gbps[f"ceiling_{d}"]
                rep.ratios[f"{backend}_{d}_vs_baseline"] = rep.gbps[f"store_{backend}_{d}"] / rep.gbps[f"baseline_{d}"]
        main = default_backend if default_backend in rep.backends else rep.backends[0]
        rep.info["store"] = rep.info[f"store_{main}"]
        for d in ("write", "read"):
            rep.gbps[f"store_{d}"] = rep.gbps[f"store_{main}_{d}"]
            rep.spread[f"store_{d}"] = rep.spread[f"store_{main}_{d}"]
            rep.ratios[f"{d}_vs_ceiling"] = rep.gbps[f"store_{d}"] / rep.gbps[f"ceiling_{d}"]
            rep.ratios[f"{d}_vs_baseline"] = rep.gbps[f"store_{d}"] / rep.gbps[f"baseline_{d}"]
        rep.ratios["write_vs_durable_baseline"] = rep.gbps["store_write"] / rep.gbps["baseline_durable_write"]
        rep.ratios["target"] = TARGET_RATIO
        rep.ratios["target_vs_baseline"] = TARGET_BASELINE_RATIO
        _advance(progress)
        if codecs:
            from .disk_manager import run_manager

            rep.manager = _merge_manager([
                run_manager(work, codecs=codecs, device=device, total_bytes=n * slot_bytes, batch=batch,
                            io_threads=io_threads, progress=progress,
                            store_gbps={"write": rep.gbps["store_write"], "read": rep.gbps["store_read"]})
                for _ in range(repeat)])
            _advance(progress)
        if recovery_slots:
            say(f"recovery: populating {recovery_slots} slots")
            rep.recovery = _recovery_repeated(os.path.join(work, "recovery"), recovery_slots, progress, repeat)
            for key in RECOVERY_TIMES:
                rep.spread[f"recovery_{key}"] = rep.recovery["spread"][key]
            _advance(progress)
        if depths:
            rep.depth_sweep = _depth_sweep(work, pages[:max(1, min(n, sweep_bytes // slot_bytes))], slot_bytes,
                                           io_threads, main, queue_depth, depths, repeat, say)
            _advance(progress)
        if recovery_sweep:
            for slots in recovery_sweep:
                say(f"recovery sweep: {slots} slots")
                rec = _recovery_repeated(os.path.join(work, "recovery"), slots, False, repeat)
                rep.recovery_sweep.append(rec)
            _advance(progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rep


#: The recovery figures (seconds) measured ``repeat`` times.
RECOVERY_TIMES = ("snapshot_s", "snapshot_recover_s", "journal_s", "journal_recover_s", "populate_s")


def _recovery_repeated(path: str, slots: int, progress: bool, repeat: int) -> dict:
    """:func:`_recovery` ``repeat`` times: the medians, with ``repeat`` and each time's ``spread``."""
    runs = []
    for _ in range(repeat):
        runs.append(_recovery(path, slots, progress))
        shutil.rmtree(path, ignore_errors=True)
    out = dict(runs[0])
    out["repeat"] = repeat
    out["spread"] = {k: _spread(r[k] for r in runs) for k in RECOVERY_TIMES}
    out.update({k: v["median"] for k, v in out["spread"].items()})
    return out


def _depth_sweep(work: str, pages: np.ndarray, slot: int, io_threads: int, backend: str, queue_depth: int,
                 depths: tuple[int, ...], repeat: int, say) -> list[dict]:
    """The store's write and read GB/s at each number of pages in flight (on ``pages``)."""
    out = []
    for depth in depths:
        say(f"depth sweep ({backend}): depth {depth}, {pages.shape[0]} pages")
        w, r = [], []
        for _ in range(repeat):
            wi, ri, _ = _store(os.path.join(work, "sweep"), pages, slot, io_threads, depth, backend, queue_depth)
            shutil.rmtree(os.path.join(work, "sweep"))
            w.append(wi)
            r.append(ri)
        sw, sr = _spread(w), _spread(r)
        out.append({"depth": depth, "backend": backend, "pages": int(pages.shape[0]), "repeat": repeat,
                    "write_gbps": sw["median"], "read_gbps": sr["median"],
                    "spread": {"write_gbps": sw, "read_gbps": sr}})
    return out


#: The figures of a manager row that vary between repeats.
MANAGER_TIMED = ("raw_gbps", "cold_gbps", "vs_store", "blocked_us_median", "blocked_us_max")


def _merge_manager(runs: list[list]) -> list:
    """Repeats of the rows through the manager as one list: each row's medians and spread."""
    rows = runs[0]
    for i, row in enumerate(rows):
        same = [r[i] for r in runs]
        row.repeat = len(runs)
        row.spread = {k: _spread(getattr(r, k) for r in same) for k in MANAGER_TIMED}
        for k in MANAGER_TIMED:
            setattr(row, k, row.spread[k]["median"])
    return rows


def table(rep: Report) -> Table:
    """The report as table cells (see :class:`Table`)."""
    g, r = rep.gbps, rep.ratios
    title = (f"disk tier benchmark: {rep.total_bytes // MiB} MiB of {rep.slot_bytes // KiB} KiB pages, {rep.io} I/O, "
             f"{rep.io_threads} I/O threads, depth {rep.depth} (io_uring: queue depth {rep.queue_depth} per thread)"
             + (f", median of {rep.repeat}" if rep.repeat > 1 else ""))
    cols = [Column("", 20, "<", ""), Column("store GB/s", 12, sep=""), Column("ceiling", 10, sep=""),
            Column("baseline", 10, sep=""), Column("x ceiling", 11, sep=""), Column("x baseline", 12, sep=""),
            Column("store min-max", 15, sep=""), Column("", 0, "<", "  ")]
    rows = []
    for backend in rep.backends:
        for d in ("write", "read"):
            vc, vb = r[f"{backend}_{d}_vs_ceiling"], r[f"{backend}_{d}_vs_baseline"]
            verdict = [] if vc >= TARGET_RATIO else [f"below {TARGET_RATIO}x ceiling"]
            if vb < TARGET_BASELINE_RATIO:
                verdict.append(f"below {TARGET_BASELINE_RATIO}x baseline"
                               + (" (baseline at the ceiling)" if g[f"baseline_{d}"] >= TARGET_RATIO * g[f"ceiling_{d}"]
                                  else ""))
            mark = " *" if backend == rep.default_backend else ""
            rows.append([f"{d} ({backend}){mark}", f"{g[f'store_{backend}_{d}']:.2f}", f"{g[f'ceiling_{d}']:.2f}",
                         f"{g[f'baseline_{d}']:.2f}", f"{vc:.2f}", f"{vb:.2f}",
                         _fmt_range(rep.spread.get(f"store_{backend}_{d}")), "; ".join(verdict) or "ok"])
    notes = [f"durable baseline (fdatasync per page) write {g['baseline_durable_write']:.3f} GB/s: store is "
             f"{r['write_vs_durable_baseline']:.1f}x; {rep.info['store']['pages_per_batch']:.1f} pages per "
             "journal group commit; * the store's default backend"]
    if "io_uring" in rep.info:
        notes.append(f"io_uring {rep.info['io_uring']}")
    if rep.recovery:
        rc = rep.recovery
        verdict = "ok" if max(rc["snapshot_s"], rc["journal_s"]) <= TARGET_RECOVERY_S else "above target"
        sp = rc.get("spread", {})
        ranges = (f" (ranges {_fmt_range(sp.get('snapshot_s'))} s, {_fmt_range(sp.get('journal_s'))} s)"
                  if rc.get("repeat", 1) > 1 else "")
        notes.append(f"recovery of {rc['slots']} slots: {rc['snapshot_s']:.2f} s from the snapshot, "
                     f"{rc['journal_s']:.2f} s from the journal alone (target <= {TARGET_RECOVERY_S} s: {verdict})"
                     + ranges)
    for d in rep.depth_sweep:
        notes.append(f"depth {d['depth']}: store write {d['write_gbps']:.2f} GB/s, read {d['read_gbps']:.2f} GB/s "
                     f"({d['backend']}, {d['pages']} pages)")
    for rc in rep.recovery_sweep:
        notes.append(f"recovery of {rc['slots']} slots: {rc['snapshot_s']:.3f} s from the snapshot, "
                     f"{rc['journal_s']:.3f} s from the journal alone")
    return Table([title], cols, rows, notes)


def manager_table(rep: Report) -> Table | None:
    """The rows through the KV-cache manager as table cells, or None when none ran."""
    if not rep.manager:
        return None
    title = (f"through the KV-cache manager ({rep.manager[0].device}): KV-like pages, calls of up to "
             f"{rep.manager[0].pages // max(1, rep.manager[0].calls)} pages; x store = blob GB/s over the store alone")
    cols = [Column("codec", 8, "<", ""), Column("path", 11, "<"), Column("mode", 9, "<"), Column("raw GB/s", 9),
            Column("blob GB/s", 10),
            Column("x store", 8), Column("blocked us/call", 16), Column("target", 8), Column("raw min-max", 12),
            Column("", 0, "<", "  ")]
    rows = []
    for m in rep.manager:
        ok = "ok" if m.blocked_us_median <= m.blocked_target_us else "blocks the caller"
        rows.append([m.codec, m.path, m.mode, f"{m.raw_gbps:.2f}", f"{m.cold_gbps:.2f}",
                     f"{m.vs_store:.2f}" if m.vs_store else "-", f"{m.blocked_us_median:.0f} (max {m.blocked_us_max:.0f})",
                     f"{m.blocked_target_us:.0f}", _fmt_range(m.spread.get("raw_gbps")),
                     "; ".join(x for x in (ok, m.verified) if x)])
    notes = [f"{codec}: hot -> disk -> hot is {v['cold_vs_store']:.2f}x the store alone in blob bytes, "
             f"{v['raw_vs_store']:.2f}x in raw bytes (targets 0.8x; 1.6x raw for a codec that halves the page)"
             for codec, v in rep.round_trip().items()]
    return Table([title], cols, rows, notes)


def format_table(rep: Report) -> str:
    """A readable table of the report (the plain text form)."""
    text = table(rep).plain()
    extra = manager_table(rep)
    return text + ("\n" + extra.plain() if extra is not None else "")
