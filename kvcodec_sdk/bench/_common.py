"""Helpers shared by the benchmarks: size units, size labels, progress and report tables.

Progress goes to stderr as ``[bench] ...`` lines (scripts filter them with ``grep -v '^\\[bench\\]'``)
unless a progress sink is installed: the ``kvcodec`` command line installs a live progress bar
when stderr is a terminal (``kvcodec_sdk.commands._ui``). Tables are built as :class:`Table`
objects: :meth:`Table.plain` is the fixed-width text that tests and scripts parse, and the
command line renders the same cells as a terminal table.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from .. import gpu

KiB = 1024
MiB = 1024 * KiB


def fmt_size(n: int) -> str:
    """'4 KiB', '1 MiB' or '100 B'."""
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n // KiB} KiB" if n % KiB == 0 else f"{n} B"


def spread(values: Iterable[float]) -> dict:
    """The spread of one figure over its repeats: ``{"n", "min", "median", "max"}`` (the JSON
    rows' ``spread`` entries)."""
    v = sorted(float(x) for x in values)
    if not v:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": len(v), "min": v[0], "median": statistics.median(v), "max": v[-1]}


def wall_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls (page
    faults, caches, lazy loading)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def last_level_cache_bytes(base: Path = Path("/sys/devices/system/cpu")) -> int:
    """The CPU's last-level cache in bytes, summed over its distinct instances (0 when the system
    does not say); ``base`` is the sysfs folder of the CPUs."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    caches: dict[tuple[int, str], int] = {}  # (level, the CPUs sharing it) -> bytes
    try:
        for index in base.glob("cpu[0-9]*/cache/index[0-9]*"):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
            m = re.fullmatch(r"(\d+)([KMG]?)", size)
            if m:
                level = int((index / "level").read_text())
                caches[(level, (index / "shared_cpu_list").read_text().strip())] = \
                    int(m.group(1)) * units.get(m.group(2), 1)
    except OSError:
        return 0
    if not caches:
        return 0
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


class CacheEvictor:
    """Calling it writes a buffer twice the CPU's last-level cache (64 MiB to 1 GiB; 256 MiB when
    the size is unknown), so that the next timed step reads its data from memory, as a tier does
    for a page evicted a while ago, not from a cache that a step just before filled."""

    def __init__(self) -> None:
        llc = last_level_cache_bytes()
        nbytes = min(1 << 30, max(64 << 20, 2 * llc)) if llc else 256 << 20
        self._buf = np.zeros(nbytes // 8, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return int(self._buf.nbytes)

    def __call__(self) -> None:
        self._buf += 1


def take_rows(pool: Any, rows: Any) -> np.ndarray:
    """Rows ``rows`` of a hot pool as a host array: a numpy pool (CPU backend) or a
    :class:`~kvcodec_sdk.gpu.DeviceArray` (CUDA, copied out and synchronized)."""
    if isinstance(pool, gpu.DeviceArray):
        return pool.take_rows(rows)
    return pool[np.asarray(rows, dtype=np.int64)]


def put_rows(pool: Any, rows: Any, values: Any) -> None:
    """Writes ``values`` into rows ``rows`` of a numpy pool or a DeviceArray (copied in and
    synchronized: done before any codec call reads them)."""
    if isinstance(pool, gpu.DeviceArray):
        pool.put_rows(rows, values)
    else:
        pool[np.asarray(rows, dtype=np.int64)] = values


def zero_pools(pools: Iterable[Any]) -> None:
    """Zeroes numpy pools or DeviceArrays (the latter synchronized)."""
    for p in pools:
        p.fill_bytes(0) if isinstance(p, gpu.DeviceArray) else p.fill(0)


def write_json(path: str | Path, report: Any) -> None:
    """Writes a benchmark's JSON report (indented, objects it cannot encode as their ``str``)."""
    Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n")


def emit(table: "Table", json_path: str | Path | None = None, report: Any = None) -> int:
    """Prints a benchmark script's table (plain text) and, when ``json_path`` is given, writes
    ``report`` there; returns 0, the script's exit status."""
    print(table.plain())
    if json_path:
        write_json(json_path, report)
    return 0


def rates(nbytes: float, seconds: Iterable[float]) -> list[float]:
    """GB/s of moving ``nbytes`` in each of the ``seconds`` samples."""
    return [nbytes / s / 1e9 for s in seconds if s > 0]


def fmt_range(s: dict | None, fmt: str = ".2f") -> str:
    """A spread as a compact table cell: ``min-max`` of its repeats, ``-`` for a single one."""
    if not s or s.get("n", 0) < 2:
        return "-"
    return f"{format(s['min'], fmt)}-{format(s['max'], fmt)}"


class ProgressSink(Protocol):
    """Receives a benchmark's progress instead of the ``[bench]`` lines."""

    def message(self, text: str) -> None: ...
    def total(self, steps: int) -> None: ...
    def advance(self) -> None: ...


#: The installed progress sink; None prints ``[bench]`` lines on stderr.
sink: ProgressSink | None = None


def log(progress: bool, msg: str) -> None:
    """A progress line on stderr (the table and JSON go to stdout)."""
    if not progress:
        return
    if sink is not None:
        sink.message(msg)
    else:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


def steps(progress: bool, total: int) -> None:
    """Announces how many steps (piece sizes, codecs, runs) the benchmark takes, for a progress bar."""
    if progress and sink is not None:
        sink.total(total)


def advance(progress: bool) -> None:
    """One step of those announced by :func:`steps` is done."""
    if progress and sink is not None:
        sink.advance()


class Unpadded(str):
    """A table cell printed as is in plain text, not padded to its column's width (e.g. '-')."""


@dataclass
class Column:
    """One column of a :class:`Table`: its header, and how plain text lays it out."""

    header: str
    width: int = 0  # plain text pads each cell to this many characters
    align: str = ">"  # '>' right, '<' left
    sep: str = " "  # plain text before the cell (ignored for the first column)


@dataclass
class Table:
    """A benchmark report as cells: title lines, a header, rows and notes (verdicts) below.

    ``plain()`` is the stable text form; the cells are pre-formatted strings so a terminal
    rendering shows exactly the same numbers."""

    title: list[str]
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    header_without_rows: bool = True  # print the header line when there are no rows

    def _line(self, cells: list[str]) -> str:
        out = []
        for i, (col, cell) in enumerate(zip(self.columns, cells)):
            if col.width == 0 and cell == "":
                continue  # an optional trailing cell (a status, a reason) that is absent
            text = cell if isinstance(cell, Unpadded) else format(cell, f"{col.align}{col.width}")
            out.append(("" if i == 0 else col.sep) + text)
        return "".join(out)

    def plain(self) -> str:
        """The fixed-width text form (what non-terminal output prints)."""
        lines = list(self.title)
        if self.rows or self.header_without_rows:
            lines.append(self._line([c.header for c in self.columns]))
        lines.extend(self._line(r) for r in self.rows)
        lines.extend(self.notes)
        return "\n".join(lines)
