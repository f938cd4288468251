"""The end-to-end rows of ``kvcodec bench disk``: KV-like pages through the KV-cache manager.

For each codec (concat and fp8 by default, on the GPU when there is one), a manager with a hot,
a host and a disk level moves every page hot -> disk -> hot, then hot -> host -> disk -> host, in
calls of ``batch`` pages, the way an engine evicts and onboards: once with blocking calls and
once with ``blocking=False`` (every call's handle waited for at the end of the path, so the rates
include completion). Each row reports:

* the page's raw (hot) bytes and its blob (cold) bytes per second, completion included;
* the blob rate as a ratio to the store alone (measured in the same run, same direction): the
  manager's own cost on top of the disk; for a compressing codec the raw rate may exceed the
  store's ceiling because fewer bytes reach the disk;
* the caller's blocked time per call (median and max), against the target of 50 us + 0.2 us
  per page: a migration to or from disk that completes inside the call blocks the caller for
  the whole transfer, which this column shows; a non-blocking one returns once submitted (disk
  -> hot included: the decode is submitted when the read lands).

Every page onboarded is compared with the original: byte-exact for a lossless codec, within the
codec's declared bound (its ``check_error``) for a lossy one.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from .. import gpu
from ..kvcm_config import DiskTierConfig, KVCacheConfig, LayerGroupConfig
from ..manager import CacheLevel, KVCacheManager
from ..registry import get_codec_spec
from ._common import MiB, put_rows, take_rows
from ._common import log as _log
from .kvcm_codecs import Layout, _Bench, resolve_device

BLOCKED_TARGET_US = 50.0
BLOCKED_TARGET_US_PER_PAGE = 0.2
PATHS = (("hot", "disk"), ("disk", "hot"), ("host", "disk"), ("disk", "host"))


@dataclass
class ManagerRow:
    codec: str
    device: str
    path: str             #: "hot->disk", "disk->hot", "host->disk" or "disk->host"
    pages: int
    calls: int
    raw_gbps: float       #: hot (raw) bytes per second, completion included
    cold_gbps: float      #: blob bytes per second
    vs_store: float       #: cold_gbps / the store's rate in the same direction (0: not measured)
    blocked_us_median: float
    blocked_us_max: float
    blocked_target_us: float
    verified: str         #: "byte-exact", "within bound" or "" (checked after a later row)
    mode: str = "blocking"  #: "blocking", or "async" (blocking=False, handles waited at the end)
    repeat: int = 1       #: runs behind the figures (medians when more than one)
    spread: dict = field(default_factory=dict)  #: figure -> {"n", "min", "median", "max"} over the runs

    def to_json(self) -> dict:
        return asdict(self)


def blocked_target(pages_per_call: int) -> float:
    return BLOCKED_TARGET_US + BLOCKED_TARGET_US_PER_PAGE * pages_per_call


def run_manager(directory: str | None, *, codecs: Sequence[str] = ("concat", "fp8"), device: str = "auto",
                total_bytes: int = 512 * MiB, batch: int = 256, io_threads: int = 32,
                store_gbps: dict | None = None, layout: Layout | None = None,
                progress: bool = True) -> list[ManagerRow]:
    """The end-to-end rows (see the module docstring). ``store_gbps`` (``{"write": ..., "read":
    ...}``) gives the ratios to the store alone; without it ``vs_store`` is 0."""
    device = resolve_device(device)
    if device != "cpu":
        why = gpu.unavailable_reason()
        if why is not None:
            raise RuntimeError(f"device {device!r} requested, but the GPU benchmark cannot run: {why}")
    layout = layout or Layout()
    n = max(2, total_bytes // layout.page_bytes)
    rows: list[ManagerRow] = []
    for name in codecs:
        _log(progress, f"through the manager: {name} on {device}, {n} pages of {layout.describe()}")
        with tempfile.TemporaryDirectory(prefix="kvcodec-bench-kvcm-disk-", dir=directory) as work:
            rows += _run_codec(name, device, layout, n, batch, io_threads, os.path.join(work, "disk"),
                               store_gbps or {}, progress)
    return rows


def _run_codec(name: str, device: str, layout: Layout, n: int, batch: int, io_threads: int, path: str,
               store_gbps: dict, progress: bool) -> list[ManagerRow]:
    spec = get_codec_spec(name)
    bench = _Bench(device, layout, n, 1, progress)
    quota = int(n * layout.page_bytes * 1.05) + layout.page_bytes
    disk = DiskTierConfig(path, max_bytes=2 * quota, container_bytes=256 * MiB, io_threads=io_threads)
    cfg = KVCacheConfig(layer_groups=[LayerGroupConfig(layout.buffer_configs())], gpu_quota=quota,
                        host_quota=quota, device=device, disk=disk)
    m = KVCacheManager(cfg, (name, {}))
    try:
        cold = m.cold_page_bytes(0)
        pages = list(m.allocate(0, n))
        pools = m.hot_pool_tensors(0, framework="cuda" if device != "cpu" else "numpy")

        def slots() -> np.ndarray:
            return np.array([p.slot for p in pages], dtype=np.int64)

        s = slots()
        for p, pool in enumerate(pools):
            put_rows(pool, s, bench.original(p))
        m.synchronize()

        rows = []
        for blocking in (True, False):
            for src, dst in PATHS:
                if src == "host" and pages[0].level != CacheLevel.HOST:
                    _move(m, pages, CacheLevel.HOST, batch)  # hot -> host, not timed
                rows.append(_timed_path(m, pages, name, device, src, dst, batch, layout.page_bytes, cold,
                                        store_gbps, blocking))
                if dst == "hot":
                    rows[-1].verified = _verify(bench, spec, pools, slots(), layout)
            _move(m, pages, CacheLevel.HOT, batch)
            rows[-1].verified = _verify(bench, spec, pools, slots(), layout)
            _log(progress, f"  {rows[-1].mode}: " + "; ".join(
                f"{r.path} {r.raw_gbps:.2f} GB/s raw, {r.blocked_us_median:.0f} us/call" for r in rows[-len(PATHS):]))
        return rows
    finally:
        m.close()


def _move(m: KVCacheManager, pages: list, level: int, batch: int) -> None:
    for i in range(0, len(pages), batch):
        res = m.migrate(pages[i:i + batch], level)
        if len(res.dropped):
            raise RuntimeError(f"{len(res.dropped)} pages were dropped moving to the {CacheLevel.name(level)} level")
    m.synchronize()


def _timed_path(m: KVCacheManager, pages: list, name: str, device: str, src: str, dst: str, batch: int,
                page_bytes: int, cold: int, store_gbps: dict, blocking: bool = True) -> ManagerRow:
    level = {"hot": CacheLevel.HOT, "host": CacheLevel.HOST, "disk": CacheLevel.DISK}[dst]
    blocked = []
    pending = []
    t0 = time.perf_counter()
    for i in range(0, len(pages), batch):
        c0 = time.perf_counter()
        res = m.migrate(pages[i:i + batch], level, blocking=blocking)
        blocked.append(time.perf_counter() - c0)
        pending.append(res)
    for res in pending:
        res = res if blocking else res.wait()  # a failed transfer raises MigrationError
        if len(res.dropped):
            raise RuntimeError(f"{name}: {len(res.dropped)} pages were dropped on {src}->{dst}")
    m.synchronize()
    seconds = time.perf_counter() - t0
    n = len(pages)
    cold_gbps = n * cold / seconds / 1e9
    store = store_gbps.get("write" if dst == "disk" else "read", 0.0) if "disk" in (src, dst) else 0.0
    return ManagerRow(name, device, f"{src}->{dst}", n, len(blocked), n * page_bytes / seconds / 1e9, cold_gbps,
                      cold_gbps / store if store else 0.0, statistics.median(blocked) * 1e6, max(blocked) * 1e6,
                      blocked_target(min(batch, n)), "", "blocking" if blocking else "async")


def _verify(bench: _Bench, spec, pools: list, slots: np.ndarray, layout: Layout) -> str:
    """Byte-exact for a lossless codec; within ``spec.check_error`` for a lossy one. Raises on a
    wrong page."""
    for p, pool in enumerate(pools):
        got_h = take_rows(pool, slots)
        want_h = bench.original(p)
        if spec.lossless:
            if not np.array_equal(got_h, want_h):
                raise RuntimeError(f"{spec.name}: pool {p} differs after the round trip through the disk level")
            continue
        params = spec.validate_params({})
        for b in layout.pool_buffers(p):
            a = want_h[:, b.byte_offset:b.byte_offset + b.bytes]
            d = got_h[:, b.byte_offset:b.byte_offset + b.bytes]
            for i in range(a.shape[0]):
                why = spec.check_error(np.ascontiguousarray(a[i]), np.ascontiguousarray(d[i]), b, params)
                if why:
                    raise RuntimeError(f"{spec.name}: page {i}, pool {p}, buffer {b.role.name}: {why}")
    return "byte-exact" if spec.lossless else "within bound"

