"""Migration throughput with the Prometheus collector scraped against no metrics at all.

``kvcodec bench metrics [--device auto] [--seconds 3] [--rounds 5]``
(or ``python -m kvcodec_sdk.bench.metrics_overhead``)

One manager evicts and onboards the same pages (hot -> host -> hot, the default concat codec)
in a loop. Rounds of ``--seconds`` alternate between three modes, so drift (clocks, caches, other
load) falls on every mode alike:

* ``off``: the manager is collected by nothing;
* ``scraped``: it is registered on a ``CollectorRegistry`` served by prometheus_client's HTTP
  server, and a thread GETs ``/metrics`` every ``--interval`` seconds (1 s) while the loop runs;
* ``scraped+gpu``: the same, with :meth:`~kvcodec_sdk.KVCacheManager.set_codec_gpu_timing` on
  (CUDA only; left out on the CPU backend).

Reported per mode: the median GB/s over the rounds (bytes moved per direction over wall time)
and its spread, and the ratio of each mode's median to ``off``'s. Target: ``scraped`` within 2%
of ``off`` (ratio >= 0.98). Needs the ``metrics`` extra.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import urllib.request
from typing import Any

from ..kvcm_config import BufferDesc, KVCacheConfig, LayerGroupConfig
from ..layout import Role
from ..manager import CacheLevel, KVCacheManager
from ._common import KiB, spread

TARGET_RATIO = 0.98


class _Scraper:
    """GETs a URL every ``interval`` seconds on its own thread until stopped."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.durations: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as response:
                response.read()
            self.durations.append(time.perf_counter() - t0)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)


def run(device: str = "auto", seconds: float = 3.0, rounds: int = 5, interval: float = 1.0, pages: int = 4096,
        piece_bytes: int = 16 * KiB, pools: int = 3, progress: bool = True) -> dict:
    """Runs the comparison; returns the report (the JSON ``--json`` writes)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise SystemExit("this benchmark needs prometheus_client: pip install 'kvcodec-sdk[metrics]'") from None
    from .. import metrics
    from .machine import now, record

    started, t_start = now(), time.perf_counter()
    buffers = [BufferDesc(layer, Role.KEY if i % 2 == 0 else Role.VALUE, bytes=piece_bytes)
               for i, layer in enumerate(range(pools))]
    page_bytes = pools * piece_bytes
    quota = (pages + 64) * page_bytes
    manager = KVCacheManager(KVCacheConfig(layer_groups=[LayerGroupConfig(buffers)], gpu_quota=quota,
                                           host_quota=quota, device=device))
    ran_on = manager.device
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    handles = manager.allocate(0, pages)
    timed_gpu = manager.set_codec_gpu_timing(True)
    manager.set_codec_gpu_timing(False)
    modes = ["off", "scraped"] + (["scraped+gpu"] if timed_gpu else [])
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    scrapes: list[float] = []

    def loop(duration: float) -> float:
        """GB/s per direction of evict + onboard round trips for about ``duration`` seconds."""
        trips, t0 = 0, time.perf_counter()
        while True:
            manager.evict(handles)
            manager.onboard(handles)
            trips += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= duration:
                manager.synchronize()
                return trips * pages * page_bytes / (time.perf_counter() - t0) / 1e9

    try:
        loop(min(seconds, 1.0))  # warm-up: first touches, staging, the index ring
        for r in range(rounds):
            for mode in modes:
                if mode == "off":
                    per_mode[mode].append(loop(seconds))
                else:
                    manager.set_codec_gpu_timing(mode == "scraped+gpu")
                    metrics.register(manager, name="bench", registry=registry)
                    with _Scraper(url, interval) as scraper:
                        per_mode[mode].append(loop(seconds))
                    metrics.unregister(manager, registry=registry)
                    manager.set_codec_gpu_timing(False)
                    scrapes += scraper.durations
                if progress:
                    print(f"round {r + 1}/{rounds} {mode}: {per_mode[mode][-1]:.2f} GB/s", file=sys.stderr)
        assert manager.stats(CacheLevel.HOST)[0].pages_offloaded > 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        manager.close()
    base = statistics.median(per_mode["off"])
    rows = [{"mode": m, "gbps": spread(per_mode[m]), "ratio_to_off": statistics.median(per_mode[m]) / base}
            for m in modes]
    return {
        "benchmark": "metrics_overhead",
        "machine": record(device=ran_on, started=started,
                          seconds=time.perf_counter() - t_start),
        "params": {"device": ran_on, "seconds": seconds, "rounds": rounds, "interval": interval, "pages": pages,
                   "piece_bytes": piece_bytes, "pools": pools},
        "rows": rows,
        "scrapes": spread(scrapes),
        "target_ratio": TARGET_RATIO,
        "met": rows[1]["ratio_to_off"] >= TARGET_RATIO,
    }


def format_report(report: dict) -> str:
    """The report as a text table."""
    p = report["params"]
    lines = [f"migration throughput (evict + onboard, {p['pages']} pages of {p['pools']} x {p['piece_bytes']} B, "
             f"device {p['device']}), {p['rounds']} rounds of {p['seconds']} s, scrape every {p['interval']} s",
             f"{'mode':<12} {'GB/s median':>12} {'min-max':>14} {'vs off':>8}"]
    for row in report["rows"]:
        g = row["gbps"]
        lines.append(f"{row['mode']:<12} {g['median']:>12.3f} {g['min']:>6.3f}-{g['max']:<7.3f} "
                     f"{row['ratio_to_off']:>8.4f}")
    s = report["scrapes"]
    if s["n"]:
        lines.append(f"{s['n']} scrapes, {s['median'] * 1e3:.2f} ms median ({s['max'] * 1e3:.2f} ms max)")
    lines.append(f"target: scraped >= {report['target_ratio']:.2f} x off: {'met' if report['met'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m``: the same as ``kvcodec bench metrics`` with these arguments."""
    from ..cli import main as cli_main

    return cli_main(["bench", "metrics", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
