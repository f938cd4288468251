"""``kvcodec bench concat``: throughput of the default codec against the link's ceiling.

On a GPU (cuda-python allocates, copies and times; torch is not needed):
  * encode = hot (device) -> cold blobs in pinned host memory, decode = the reverse, of
    scattered pages (non-contiguous hot slots, shuffled cold slots), ``pools`` pools per page;
  * ceiling = one large contiguous pinned copy of the same bytes in the same direction;
  * baseline = one ``cuMemcpyAsync`` per piece (the codec with ``copy_api='per_copy'``);
  * variants: the codec's automatic choice, the copy-engine path and the SM path.
On the CPU: the CPU reference against one contiguous memcpy of the same bytes.

Every variant's output is checked against an independent numpy gather before timing.
Reported: GB/s (bytes moved per direction / time), ratios to ceiling and baseline, and host CPU
microseconds per page spent in the encode/decode call (descriptor building and submission).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from .. import _native, gpu
from ..layout import LifeCycleDesc, PoolDesc, PoolGroupDesc
from ..registry import create_codec
from ._common import Column, KiB, MiB, Table, wall_times
from ._common import advance as _advance
from ._common import fmt_range as _fmt_range
from ._common import fmt_size as _fmt_size
from ._common import log as _log
from ._common import rates as _rates
from ._common import spread as _spread
from ._common import steps as _steps

DEFAULT_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
TARGET_RATIO = 0.9


@dataclass
class Row:
    """One measured (piece size, direction, variant)."""

    piece_bytes: int
    direction: str  # "encode" (hot -> cold) or "decode" (cold -> hot)
    variant: str
    pages: int
    gbps: float
    ratio_to_ceiling: float
    ratio_to_baseline: float | None
    host_us_per_page: float
    path: str = ""
    repeat: int = 0  # timed samples behind gbps (its median)
    spread: dict = field(default_factory=dict)  # figure -> {"n", "min", "median", "max"} over the samples


@dataclass
class Report:
    device: str
    pools: int
    bytes_per_direction: int
    iters: int
    ceilings_gbps: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    ceilings_spread: dict = field(default_factory=dict)  # piece -> ceiling -> spread over the samples
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def _layout(bases: list[int], piece: int, slots: int) -> list[PoolGroupDesc]:
    return [PoolGroupDesc(pools=[PoolDesc(b, piece, slots) for b in bases], lifecycles=[LifeCycleDesc(0)])]


def run(device: str = "auto", pools: int = 3, sizes=DEFAULT_SIZES, total_bytes: int | None = None, iters: int = 5,
        progress: bool = True, timer: str = "cuda-core") -> Report:
    """Runs the benchmark; ``device`` is 'auto' (GPU when present), 'cpu' or 'cuda[:N]'. On a GPU,
    memory, streams and copies come from :mod:`kvcodec_sdk.gpu` (cuda-python) and ``timer`` picks
    the events that time them: ``"cuda-core"`` (default) or ``"torch"``."""
    if timer not in ("cuda-core", "torch"):
        raise ValueError(f"timer is {timer!r}; use 'cuda-core' or 'torch'")
    if pools < 1:
        raise ValueError(f"pools is {pools}; it must be >= 1")
    if iters < 1:
        raise ValueError(f"iters is {iters}; it must be >= 1")
    for s in sizes:
        if s < 1:
            raise ValueError(f"piece size {s} must be >= 1 byte")
    if device == "auto":
        device = "cuda:0" if _native.driver_info()["device_count"] > 0 else "cpu"
    if device == "cpu":
        return _run_cpu(pools, sizes, total_bytes or 64 * MiB, iters, progress)
    return _run_gpu(device, pools, sizes, total_bytes or 512 * MiB, iters, progress, timer)


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------

def _run_cpu(pools: int, sizes, total: int, iters: int, progress: bool) -> Report:
    rng = np.random.default_rng(1)
    report = Report("cpu", pools, total, iters, info={"baseline": "one contiguous memcpy (numpy copyto)"})
    _steps(progress, len(sizes))
    for piece in sizes:
        pages = max(1, total // (pools * piece))
        slots = 2 * pages
        hot = [rng.integers(0, 256, size=slots * piece, dtype=np.uint8) for _ in range(pools)]
        cold = np.empty(pages * pools * piece, np.uint8)
        src = rng.permutation(slots)[:pages].astype(np.int32)
        dst = rng.permutation(pages).astype(np.int32)
        enc = np.ascontiguousarray(np.stack([dst, src], axis=1))
        dec = np.ascontiguousarray(np.stack([src, dst], axis=1))
        codec = create_codec("concat", device="cpu")
        codec.configure(_layout([h.ctypes.data for h in hot], piece, slots))

        codec.encode(0, cold, enc)
        expected = np.concatenate([h.reshape(slots, piece)[src] for h in hot], axis=1)
        if not np.array_equal(cold.reshape(pages, pools * piece)[dst], expected):
            raise RuntimeError(f"concat CPU encode produced wrong blobs at piece size {piece}")
        flat_src = np.concatenate(hot)[: pages * pools * piece]
        flat_dst = np.empty_like(flat_src)

        def timed(fn: Callable[[], None]) -> list[float]:
            return wall_times(fn, iters)

        moved = pages * pools * piece
        ceiling_s = timed(lambda: np.copyto(flat_dst, flat_src))
        ceiling = moved / statistics.median(ceiling_s) / 1e9
        report.ceilings_gbps[str(piece)] = {"memcpy": ceiling}
        report.ceilings_spread[str(piece)] = {"memcpy": _spread(_rates(moved, ceiling_s))}
        for direction, idx in (("encode", enc), ("decode", dec)):
            op = codec.encode if direction == "encode" else codec.decode
            samples = timed(lambda: op(0, cold, idx))
            t = statistics.median(samples)
            gbps = moved / t / 1e9
            report.rows.append(Row(piece, direction, "concat-cpu", pages, gbps, gbps / ceiling, None,
                                   t / pages * 1e6, "memcpy", iters, {"gbps": _spread(_rates(moved, samples))}))
            _log(progress, f"{_fmt_size(piece):>8} {direction}: {gbps:7.2f} GB/s = {gbps / ceiling:.2f}x memcpy")
        codec.close()
        _advance(progress)
    return report


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

VARIANTS = {
    "auto": {},
    "copy_engine": {"path": "copy_engine"},
    "sm": {"path": "sm"},
    "baseline_per_copy": {"path": "copy_engine", "copy_api": "per_copy"},
}


def _gpu_timer(kind: str, stream, device: str):
    """A context-manager factory timing work on ``stream``: cuda.core events, or torch's (for a
    side-by-side check of the two timers)."""
    if kind == "cuda-core":
        return lambda: gpu.Timer(stream, device)
    if kind != "torch":
        raise ValueError(f"timer is {kind!r}; use 'cuda-core' or 'torch'")
    try:
        import torch
    except ImportError:
        raise RuntimeError("timer='torch' needs torch with CUDA; the default timer needs only cuda-python") from None
    ext = torch.cuda.ExternalStream(gpu.stream_handle(stream), device=device)

    class _TorchTimer:
        def __enter__(self):
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record(ext)
            return self

        def __exit__(self, *exc):
            self.end.record(ext)

        @property
        def milliseconds(self) -> float:
            self.end.synchronize()
            return self.start.elapsed_time(self.end)

    return _TorchTimer


def _run_gpu(device: str, pools: int, sizes, total: int, iters: int, progress: bool, timer: str = "cuda-core") -> Report:
    why = gpu.unavailable_reason()
    if why is not None:
        raise RuntimeError(f"device {device!r} requested, but the GPU benchmark cannot run: {why}")
    stream = gpu.new_stream(device)
    make_timer = _gpu_timer(timer, stream, device)
    rng = np.random.default_rng(1)
    info = dict(_native.driver_info())
    info["gpu"] = gpu.device(device).name
    info["baseline"] = "one cuMemcpyAsync per piece"
    info["timer"] = timer
    report = Report(device, pools, total, iters, info=info)

    def elapsed(fn: Callable[[], None]) -> list[float]:
        """Seconds per call of each timed sample, with events on `stream` after one warm-up call."""
        fn()
        stream.sync()
        samples = []
        for _ in range(iters):
            with make_timer() as t:
                fn()
            samples.append(t.milliseconds / 1e3)
        return samples

    _steps(progress, len(sizes))
    for piece in sizes:
        pages = max(1, total // (pools * piece))
        slots = 2 * pages
        moved = pages * pools * piece
        _log(progress, f"piece {_fmt_size(piece)}: {pages} pages x {pools} pools, {moved / MiB:.0f} MiB per direction")
        hot_host = [rng.integers(0, 256, (slots, piece), dtype=np.uint8) for _ in range(pools)]
        hot = [gpu.to_device(h, device) for h in hot_host]
        hot_back = [gpu.empty((slots, piece), np.uint8, device) for _ in range(pools)]
        cold = gpu.pinned(moved, np.uint8, device)
        cold_view = np.asarray(cold).reshape(pages, pools * piece)
        contig_dev = gpu.empty(moved, np.uint8, device)
        src = rng.permutation(slots)[:pages].astype(np.int32)
        dst = rng.permutation(pages).astype(np.int32)
        enc_host = np.ascontiguousarray(np.stack([dst, src], axis=1))
        dec_host = np.ascontiguousarray(np.stack([src, dst], axis=1))
        enc_dev, dec_dev = gpu.to_device(enc_host, device), gpu.to_device(dec_host, device)
        expected = np.concatenate([h[src] for h in hot_host], axis=1)
        hot_host = None

        d2h_s = elapsed(lambda: gpu.copy_bytes(cold.address, contig_dev.address, moved, stream))
        h2d_s = elapsed(lambda: gpu.copy_bytes(contig_dev.address, cold.address, moved, stream))
        ceil_d2h = moved / statistics.median(d2h_s) / 1e9
        ceil_h2d = moved / statistics.median(h2d_s) / 1e9
        ceilings = {"encode": ceil_d2h, "decode": ceil_h2d}
        report.ceilings_gbps[str(piece)] = {"d2h_pinned": ceil_d2h, "h2d_pinned": ceil_h2d}
        report.ceilings_spread[str(piece)] = {"d2h_pinned": _spread(_rates(moved, d2h_s)),
                                              "h2d_pinned": _spread(_rates(moved, h2d_s))}
        _log(progress, f"  ceiling: D2H {ceil_d2h:.1f} GB/s, H2D {ceil_h2d:.1f} GB/s")

        measured: dict[tuple[str, str], tuple[float, float, str, dict]] = {}
        for variant, params in VARIANTS.items():
            # One codec over the source pools (encode) and one over fresh pools (decode), so the
            # decode check cannot pass by leaving the original data in place.
            encoder = create_codec("concat", params, device=device)
            encoder.configure(_layout([h.address for h in hot], piece, slots))
            decoder = create_codec("concat", params, device=device)
            decoder.configure(_layout([h.address for h in hot_back], piece, slots))
            path = encoder.page_index_location(0).name.lower()
            on_device = path == "device"
            enc = enc_dev if on_device else enc_host
            dec = dec_dev if on_device else dec_host
            calls = {
                "encode": lambda: encoder.encode(0, cold, enc, stream=stream),
                "decode": lambda: decoder.decode(0, cold, dec, stream=stream),
            }
            cold_view[...] = 0xA5
            for h in hot_back:
                h.fill_bytes(0x5A)
            calls["encode"]()
            stream.sync()
            if not np.array_equal(cold_view[dst], expected):
                raise RuntimeError(f"concat {variant} encode produced wrong blobs at piece {piece}")
            calls["decode"]()
            stream.sync()
            for p in range(pools):
                if not np.array_equal(hot_back[p].numpy()[src], expected[:, p * piece:(p + 1) * piece]):
                    raise RuntimeError(f"concat {variant} decode produced wrong hot pages at piece {piece}")
            for direction, call in calls.items():
                samples = elapsed(call)
                t = statistics.median(samples)
                # Host time of the call alone (descriptor building + submission) on an idle stream.
                host = []
                for _ in range(3):
                    stream.sync()
                    t0 = time.perf_counter()
                    call()
                    host.append(time.perf_counter() - t0)
                stream.sync()
                measured[(variant, direction)] = (moved / t / 1e9, min(host) / pages * 1e6, path,
                                                  _spread(_rates(moved, samples)))
            encoder.close()
            decoder.close()

        for (variant, direction), (gbps, host_us, path, sp) in measured.items():
            base = measured[("baseline_per_copy", direction)][0]
            row = Row(piece, direction, variant, pages, gbps, gbps / ceilings[direction],
                      gbps / base, host_us, "sm" if path == "device" else "copy_engine", iters, {"gbps": sp})
            report.rows.append(row)
            _log(progress, f"  {direction:6} {variant:18} {gbps:7.1f} GB/s  {row.ratio_to_ceiling:5.2f}x ceiling  "
                           f"{row.ratio_to_baseline:6.2f}x baseline  {host_us:6.3f} us/page host ({row.path})")
        stream.sync()
        hot = hot_back = cold = cold_view = contig_dev = enc_dev = dec_dev = expected = None  # frees before the next size
        _advance(progress)
    return report


def table(report: Report) -> Table:
    """The report as table cells (see :class:`Table`)."""
    cols = [Column("piece", 8), Column("dir", 6, "<"), Column("variant", 18, "<"), Column("GB/s", 8),
            Column("x ceiling", 9), Column("x base", 7), Column("us/page", 8), Column("path", 11, "<", "  "),
            Column("GB/s min-max", 0, "<", "  ")]
    rows = [[_fmt_size(r.piece_bytes), r.direction, r.variant, f"{r.gbps:.2f}", f"{r.ratio_to_ceiling:.2f}",
             f"{r.ratio_to_baseline:.2f}" if r.ratio_to_baseline is not None else "-", f"{r.host_us_per_page:.3f}",
             r.path, _fmt_range(r.spread.get("gbps"))] for r in report.rows]
    notes = []
    if report.device != "cpu":
        auto = [r for r in report.rows if r.variant == "auto"]
        worst = min(auto, key=lambda r: r.ratio_to_ceiling) if auto else None
        if worst is not None:
            verdict = "meets" if worst.ratio_to_ceiling >= TARGET_RATIO else "misses"
            notes.append(f"default codec: worst {worst.ratio_to_ceiling:.2f}x of the pinned ceiling "
                         f"({_fmt_size(worst.piece_bytes)} {worst.direction}); {verdict} the {TARGET_RATIO}x target")
    title = (f"concat codec on {report.device}: {report.pools} pools/page, "
             f"{report.bytes_per_direction / MiB:.0f} MiB per direction, median of {report.iters}")
    return Table([title], cols, rows, notes)


def format_table(report: Report) -> str:
    """A readable table of the report (the plain text form)."""
    return table(report).plain()
