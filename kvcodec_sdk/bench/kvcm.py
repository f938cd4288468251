"""``kvcodec bench kvcm``: hot -> host -> hot migration throughput of the KV-cache manager.

Many scattered pages (every other hot slot) of one layer group with ``pools`` layers are evicted
and onboarded with the default concat codec, in one ``migrate`` call per direction. Reported per
piece size and direction, all measured in the same run:

* GB/s of the manager (bytes per direction / wall time of submit + completion);
* the ratio to the pinned copy ceiling (one contiguous pinned copy of the same bytes; on the CPU,
  one contiguous memcpy);
* the ratio to the bare codec (the same concat codec called directly with a prepared index
  array on identical buffers): the manager's overhead;
* host CPU microseconds per page spent inside the ``migrate`` call (thread CPU time: batching,
  slot allocation, events, index staging, codec submission).

Targets: within 10% of the bare codec, and under 1 us of host CPU per page at 10k pages per call.
Each direction's result is checked byte-exact before timing.

The manager's own host work per page (its host CPU beyond the bare codec's on the same pages) is
reported too; :func:`run_overhead` (``kvcodec bench kvcm --overhead``) measures it alone with tiny
pieces, so the copy hardly counts even on the CPU backend, and with many pages resident in both
levels, so per-page work that grows with the manager's size (tree or hash lookups, allocations) shows
up. Its target, at most 0.1 us per page at 10k pages per call, guards the migration fast path; it
runs on the CPU backend as well as on a GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import _native, gpu
from ..kvcm_config import BufferDesc, KVCacheConfig, LayerGroupConfig
from ..layout import LifeCycleDesc, PoolDesc, PoolGroupDesc, Role
from ..manager import KVCacheManager
from ..registry import create_codec
from ._common import Column, KiB, MiB, Table, put_rows, take_rows, zero_pools
from ._common import advance as _advance
from ._common import fmt_range as _fmt_range
from ._common import fmt_size as _fmt
from ._common import log as _log
from ._common import rates as _rates
from ._common import spread as _spread
from ._common import steps as _steps

DEFAULT_SIZES = (4 * KiB, 16 * KiB, 64 * KiB)
TARGET_RATIO_TO_CODEC = 0.9
TARGET_HOST_US_PER_PAGE = 1.0
TARGET_OVERHEAD_US_PER_PAGE = 0.1
OVERHEAD_PIECE = 64
OVERHEAD_RESIDENT = 100_000


@dataclass
class Row:
    piece_bytes: int
    direction: str  # "evict" (hot -> host) or "onboard" (host -> hot)
    pages: int
    gbps: float
    codec_gbps: float
    ceiling_gbps: float
    ratio_to_ceiling: float
    ratio_to_codec: float
    host_us_per_page: float
    codec_host_us_per_page: float
    overhead_us_per_page: float = 0.0  # host_us_per_page - codec_host_us_per_page: the manager's own work
    repeat: int = 0  # timed samples behind each figure (gbps is their median)
    spread: dict = field(default_factory=dict)  # figure -> {"n", "min", "median", "max"} over the samples


@dataclass
class Report:
    device: str
    pools: int
    max_pages: int
    iters: int
    rows: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    resident: int = 0  # pages held in the manager besides the migrated ones (overhead runs)

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def run(device: str = "auto", pools: int = 3, sizes=DEFAULT_SIZES, pages: int = 10_000,
        max_bytes: int = 512 * MiB, iters: int = 5, progress: bool = True, resident: int = 0) -> Report:
    """Runs the benchmark on ``device`` ('auto', 'cpu' or 'cuda[:N]'); ``resident`` extra pages
    stay in the manager (half hot, half on the host tier) while the scattered pages move."""
    if pools < 1 or pages < 1 or iters < 1:
        raise ValueError(f"pools ({pools}), pages ({pages}) and iters ({iters}) must be >= 1")
    if device == "auto":
        device = "cuda:0" if _native.driver_info()["device_count"] > 0 else "cpu"
    elif device == "cuda":
        device = "cuda:0"  # per-device calls want an index
    if device != "cpu":
        why = gpu.unavailable_reason()
        if why is not None:
            raise RuntimeError(f"device {device!r} requested, but the GPU benchmark cannot run: {why}")
    report = Report(device, pools, pages, iters, info=dict(_native.driver_info()))
    if device != "cpu":
        report.info["gpu"] = gpu.device(device).name
    _steps(progress, len(sizes))
    for piece in sizes:
        n = max(1, min(pages, max_bytes // (pools * piece)))
        report.rows.extend(_run_size(device, pools, piece, n, iters, progress, resident))
        _advance(progress)
    return report


def run_overhead(device: str = "cpu", pools: int = 3, pages: int = 10_000, resident: int = OVERHEAD_RESIDENT,
                 piece: int = OVERHEAD_PIECE, iters: int = 15, progress: bool = True) -> Report:
    """The manager's own host CPU per page: :func:`run` with ``piece``-byte pieces (default 64) on
    a manager that also holds ``resident`` pages (half hot, half on the host tier) which stay put.
    Each row's ``overhead_us_per_page`` is compared with ``TARGET_OVERHEAD_US_PER_PAGE`` by
    :func:`overhead_ok`; ``device`` defaults to the CPU backend."""
    if resident < 0:
        raise ValueError(f"resident is {resident}; it must be >= 0")
    if pools < 1 or pages < 1 or iters < 1 or piece < 1:
        raise ValueError(f"pools ({pools}), pages ({pages}), iters ({iters}) and piece ({piece}) must be >= 1")
    report = run(device=device, pools=pools, sizes=(piece,), pages=pages, max_bytes=pages * pools * piece,
                 iters=iters, progress=progress, resident=resident)
    report.resident = resident
    return report


def overhead_ok(report: Report) -> bool:
    """Whether every row of an overhead run meets ``TARGET_OVERHEAD_US_PER_PAGE``."""
    return bool(report.rows) and all(r.overhead_us_per_page <= TARGET_OVERHEAD_US_PER_PAGE for r in report.rows)


def _run_size(device, pools, piece, n, iters, progress, resident=0):
    moved = n * pools * piece
    _log(progress, f"piece {_fmt(piece)}: {n} scattered pages x {pools} pools, {moved / MiB:.0f} MiB per direction"
                   + (f", {resident} resident pages" if resident else ""))
    hot_resident = resident - resident // 2
    cfg = KVCacheConfig(
        layer_groups=[LayerGroupConfig([BufferDesc(layer, Role.KEY, bytes=piece) for layer in range(pools)])],
        gpu_quota=(2 * n + hot_resident) * pools * piece, host_quota=(n + resident // 2) * pools * piece,
        device=device)
    m = KVCacheManager(cfg)
    if resident:
        # Pages that stay in both levels: the eviction queues and page table have their size.
        if resident // 2:
            m.evict(m.allocate(0, resident // 2))
        m.allocate(0, hot_resident)
        m.synchronize()
    all_pages = m.allocate(0, 2 * n)
    m.free(all_pages[1::2])
    pages = all_pages[::2]
    on_gpu = device != "cpu"
    hot = m.hot_pool_tensors(0, framework="cuda" if on_gpu else "numpy")
    slots = np.array([p.slot for p in pages])
    rng = np.random.default_rng(1)
    stream = gpu.new_stream(device) if on_gpu else None

    def sync():
        if stream is not None:
            stream.sync()
        m.synchronize()

    # Random bytes in the pages' slots (the device pools' rows are copied in, synchronized).
    values = [np.frombuffer(rng.bytes(n * piece), np.uint8).reshape(n, piece) for _ in hot]
    for h, v in zip(hot, values):
        put_rows(h, slots, v)
    expected = np.concatenate(values, axis=1)
    values = None

    # Correctness first: one round trip through fresh slots, checked byte for byte.
    m.evict(pages, stream=stream)
    sync()
    host = m.host_pool_array(0)
    if not np.array_equal(host[[p.slot for p in pages]], expected):
        raise RuntimeError(f"manager eviction produced wrong blobs at piece {piece}")
    zero_pools(hot)  # synchronized: before onboarding writes
    m.onboard(pages, stream=stream)
    sync()
    back = np.array([p.slot for p in pages])
    got = np.concatenate([take_rows(h, back) for h in hot], axis=1)
    if not np.array_equal(got, expected):
        raise RuntimeError(f"manager onboarding produced wrong pages at piece {piece}")

    results = {}
    for direction in ("evict", "onboard"):
        forward, back = (m.evict, m.onboard) if direction == "evict" else (m.onboard, m.evict)
        if direction == "onboard":
            m.evict(pages, stream=stream)  # pages start on the host for onboarding
            sync()
        walls, cpus = [], []
        for _ in range(iters):
            sync()
            t0, c0 = time.perf_counter(), time.thread_time()
            forward(pages, stream=stream)
            c1 = time.thread_time()
            sync()
            walls.append(time.perf_counter() - t0)
            cpus.append(c1 - c0)
            back(pages, stream=stream)  # restore the starting level for the next sample
            sync()
        results[direction] = (statistics.median(walls), min(cpus), walls, cpus)
    m.onboard(pages, stream=stream)
    sync()

    codec_results, ceilings = _bare_codec_and_ceiling(device, pools, piece, n, iters, stream)
    rows = []
    for direction in ("evict", "onboard"):
        wall, cpu, walls, cpus = results[direction]
        cwall, ccpu, cwalls, _ = codec_results[direction]
        gbps, cgbps = moved / wall / 1e9, moved / cwall / 1e9
        spread = {"gbps": _spread(_rates(moved, walls)), "codec_gbps": _spread(_rates(moved, cwalls)),
                  "ceiling_gbps": _spread(_rates(moved, ceilings[f"{direction}_samples"])),
                  "host_us_per_page": _spread(c / n * 1e6 for c in cpus)}
        row = Row(piece, direction, n, gbps, cgbps, ceilings[direction], gbps / ceilings[direction], gbps / cgbps,
                  cpu / n * 1e6, ccpu / n * 1e6, (cpu - ccpu) / n * 1e6, iters, spread)
        rows.append(row)
        _log(progress, f"  {direction:7} {gbps:7.2f} GB/s = {row.ratio_to_ceiling:.2f}x ceiling, "
                       f"{row.ratio_to_codec:.2f}x bare codec; host {row.host_us_per_page:.3f} us/page "
                       f"(codec alone {row.codec_host_us_per_page:.3f}, manager {row.overhead_us_per_page:.3f})")
    m.close()
    return rows


def _bare_codec_and_ceiling(device, pools, piece, n, iters, stream):
    """The same concat codec called directly on identically shaped buffers, and the ceiling."""
    moved = n * pools * piece
    slots = 2 * n
    src = np.arange(0, slots, 2, dtype=np.int32)
    dst = np.random.default_rng(2).permutation(n).astype(np.int32)
    enc = np.ascontiguousarray(np.stack([dst, src], axis=1))
    dec = np.ascontiguousarray(np.stack([src, dst], axis=1))
    if stream is not None:
        hot = [gpu.empty(slots * piece, np.uint8, device) for _ in range(pools)]
        zero_pools(hot)
        cold = gpu.pinned(moved, np.uint8, device)
        contig = gpu.empty(moved, np.uint8, device)
        bases = [h.address for h in hot]
    else:
        hot = [np.zeros(slots * piece, np.uint8) for _ in range(pools)]
        cold = np.empty(moved, np.uint8)
        contig = np.empty(moved, np.uint8)
        bases = [h.ctypes.data for h in hot]
    codec = create_codec("concat", device=device)
    codec.configure([PoolGroupDesc([PoolDesc(b, piece, slots) for b in bases], [LifeCycleDesc(0)])])
    on_device = codec.page_index_location(0).name == "DEVICE"
    if on_device:
        enc, dec = gpu.to_device(enc, device), gpu.to_device(dec, device)

    def sync():
        if stream is not None:
            stream.sync()

    def timed(call):
        walls, cpus = [], []
        call()
        sync()
        for _ in range(iters):
            t0, c0 = time.perf_counter(), time.thread_time()
            call()
            c1 = time.thread_time()
            sync()
            walls.append(time.perf_counter() - t0)
            cpus.append(c1 - c0)
        return statistics.median(walls), min(cpus), walls, cpus

    out = {
        "evict": timed(lambda: codec.encode(0, cold, enc, stream=stream)),
        "onboard": timed(lambda: codec.decode(0, cold, dec, stream=stream)),
    }
    codec.close()
    if stream is not None:
        d2h = timed(lambda: gpu.copy_bytes(cold.address, contig.address, moved, stream))
        h2d = timed(lambda: gpu.copy_bytes(contig.address, cold.address, moved, stream))
    else:
        d2h = h2d = timed(lambda: np.copyto(contig, cold))
    return out, {"evict": moved / d2h[0] / 1e9, "onboard": moved / h2d[0] / 1e9, "evict_samples": d2h[2],
                 "onboard_samples": h2d[2]}


def table(report: Report) -> Table:
    """The report as table cells (see :class:`Table`)."""
    title = (f"KV-cache manager on {report.device}: hot -> host -> hot, concat codec, {report.pools} pools/page, "
             f"up to {report.max_pages} scattered pages per call, median of {report.iters}"
             + (f", {report.resident} resident pages" if report.resident else ""))
    cols = [Column("piece", 8), Column("dir", 8, "<"), Column("pages", 6), Column("GB/s", 8), Column("x ceiling", 9),
            Column("x codec", 8), Column("us/page", 8), Column("codec us/page", 13), Column("manager us/page", 15),
            Column("GB/s min-max", 0, "<", "  ")]
    rows = [[_fmt(r.piece_bytes), r.direction, str(r.pages), f"{r.gbps:.2f}", f"{r.ratio_to_ceiling:.2f}",
             f"{r.ratio_to_codec:.2f}", f"{r.host_us_per_page:.3f}", f"{r.codec_host_us_per_page:.3f}",
             f"{r.overhead_us_per_page:.3f}", _fmt_range(r.spread.get("gbps"))] for r in report.rows]
    out = Table([title], cols, rows)
    if not report.rows:
        return out
    big = [r for r in report.rows if r.pages >= 10_000] or report.rows
    own = max(big, key=lambda r: r.overhead_us_per_page)
    own_line = (f"manager's own host CPU at {own.pages} pages/call ({_fmt(own.piece_bytes)} {own.direction}): "
                f"{own.overhead_us_per_page:.3f} us/page: "
                f"{'meets' if own.overhead_us_per_page <= TARGET_OVERHEAD_US_PER_PAGE else 'misses'} the "
                f"{TARGET_OVERHEAD_US_PER_PAGE} us target")
    if report.resident:
        out.notes.append(own_line)
        return out
    worst = min(report.rows, key=lambda r: r.ratio_to_codec)
    host = max(big, key=lambda r: r.host_us_per_page)
    out.notes.append(f"worst ratio to the bare codec {worst.ratio_to_codec:.2f} ({_fmt(worst.piece_bytes)} "
                     f"{worst.direction}): {'meets' if worst.ratio_to_codec >= TARGET_RATIO_TO_CODEC else 'misses'} "
                     f"the {TARGET_RATIO_TO_CODEC} target")
    out.notes.append(f"host CPU at {host.pages} pages/call: {host.host_us_per_page:.3f} us/page: "
                     f"{'meets' if host.host_us_per_page < TARGET_HOST_US_PER_PAGE else 'misses'} the "
                     f"{TARGET_HOST_US_PER_PAGE} us target")
    out.notes.append(own_line)
    return out


def format_table(report: Report) -> str:
    """A readable table of the report (the plain text form)."""
    return table(report).plain()
