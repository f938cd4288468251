"""``kvcodec bench daemon``: the per-host cache daemon from a client's side.

A daemon is started as its own process (``kvcodec daemon``), optionally next to ``--load`` busy
processes (a loaded machine). The client stores ``--pages`` KV-like pages, then measures:

- the round trip of a lookup of ``--batch`` keys (``lookup`` and its ``release``), p50 and p99
  over ``--rounds`` requests, against the targets 20 µs and 100 µs (the client polls
  ``--busy-poll-us`` for a reply before sleeping, the daemon ``--daemon-busy-poll-us`` for a request);
  and apart, the lookup request's own round trip (the release is a request of its own, with no reply);
- a hit read out of L2 (``get_into``: in place, checked, copied into the caller's buffer) against
  copying the same pages from this process's own memory (the baseline of a host tier inside one
  process), in GB/s of page bytes;
- the bytes on the socket per page moved (pages travel through the arena, not the socket);
- through the KV-cache manager (``--device``, concat): the same pages evicted to and onboarded
  from the daemon (the remote level on :class:`~kvcodec_sdk.remote.daemon.DaemonBackend`, and the
  shared host level, ``KVCacheConfig.shared``) against the host tier inside the process, and the
  L2 hit: another manager finding the pages in the shared host level and onboarding them, in GB/s
  of page bytes (the target: an L2 hit at least 0.9× the host tier's onboard).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from ._common import CacheEvictor, Column, Table, emit, wall_times

#: The round-trip targets of a lookup of 64 keys (docs/daemon.md).
TARGET_P50_US = 20.0
TARGET_P99_US = 100.0


def add_arguments(p: argparse.ArgumentParser, *, count: Any, size: Any, output_file: Any) -> None:
    p.add_argument("--pages", type=count(1, 1 << 20), default=256, help="pages stored (default 256)")
    p.add_argument("--page-bytes", type=size, default=64 << 10, help="bytes per page (default 64K)")
    p.add_argument("--batch", type=count(1, 4096), default=64, help="keys per lookup (default 64)")
    p.add_argument("--rounds", type=count(10, 1 << 20), default=2000, help="lookups timed (default 2000)")
    p.add_argument("--load", type=count(0, 64), default=0, help="busy processes running meanwhile (default 0)")
    p.add_argument("--busy-poll-us", type=float, default=None, metavar="US",
                   help="microseconds the client polls for a reply before sleeping (default: the client's default)")
    p.add_argument("--daemon-busy-poll-us", type=float, default=0.0, metavar="US",
                   help="microseconds the daemon polls for a request before sleeping (default 0)")
    p.add_argument("--device", default="cpu", help="the managers' device: cpu (default) or cuda[:N]")
    p.add_argument("--hugepages", action="store_true",
                   help="back the daemon's arena with huge pages (where reserved: sysctl vm.nr_hugepages=N); "
                        "default: ordinary pages")
    p.add_argument("--manager-rounds", type=count(2, 100000), default=30,
                   help="rounds of the measurements through the manager (best and median reported; default 30)")
    p.add_argument("--codec", default="concat", metavar="NAME",
                   help="the managers' codec (a registered name, plugins included; default concat)")
    p.add_argument("--params", default=None, metavar="JSON", help="the codec's parameters as a JSON object")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the report as JSON")


def kv_page(rng: np.random.Generator, page_bytes: int) -> np.ndarray:
    """``page_bytes`` bytes of KV-like bf16 values (rows of 128 channels)."""
    from ..layout import DType, Role
    from ..testing.data import from_float32, kv_like

    rows = -(-page_bytes // 256)
    raw = from_float32(kv_like(rng, 1, rows, 1, 128, Role.KEY), DType.BFLOAT16)
    return np.ascontiguousarray(raw[:page_bytes])


def _put(m: Any, page: Any, raw: np.ndarray) -> None:
    """Writes ``raw`` into a hot page (one pool: the page's K and V side by side)."""
    view = m.page_view(page, framework="numpy" if m.device == "cpu" else "torch")[0]
    if m.device == "cpu":
        view[:] = raw
    else:
        import torch

        view.copy_(torch.from_numpy(raw))


def _get(m: Any, page: Any) -> np.ndarray:
    view = m.page_view(page, framework="numpy" if m.device == "cpu" else "torch")[0]
    return np.asarray(view) if m.device == "cpu" else view.cpu().numpy()


def through_manager(sock: str, pages: int, page_bytes: int, rounds: int = 30, device: str = "cpu",
                    codec: Any = "concat") -> dict:
    """Evict and onboard ``pages`` KV-like pages through managers on ``device`` with ``codec`` (a
    name or ``(name, params)``, as :class:`~kvcodec_sdk.KVCacheManager` takes it): with a host tier
    of their own (the baseline), with the daemon as their remote level, and with the shared host
    level in the daemon's arena (their own pages, and another manager's pages found in L2, with and
    without the CRC-32C check). GB/s of page bytes per direction, each call timed until its copies
    completed: the best of ``rounds`` (``..._gbps``) and their median (``..._p50_gbps``), every
    figure measured once per round in turn. Every onboarded page is checked byte for byte against what one
    evict and onboard through a host tier of its own gives (the pages themselves for a lossless
    codec); with a lossy codec the pages are written again before each round, untimed, so no page
    is encoded twice."""
    import kvcodec_sdk as kv

    from ..remote.daemon import DaemonBackend

    half = page_bytes // 2
    # K and V side by side in one pool, each bf16 rows of 128 channels (what kv_page writes), so a
    # quantizing codec sees its dtype; sizes that are no whole number of rows are plain bytes.
    shape = dict(dtype=kv.DType.BFLOAT16, tokens_per_page=half // 256, num_heads=1, head_dim=128) if half % 256 == 0 else {}
    groups = [kv.LayerGroupConfig([kv.BufferDesc(0, role, bytes=half, **shape) for role in (kv.Role.KEY, kv.Role.VALUE)])]
    quota = pages * 2 * half
    host_quota = quota  # until the codec's blob size is known: then room for `pages` blobs
    moved = pages * 2 * half
    keys = [f"bench-manager/{i}".encode() for i in range(pages)]
    model = [kv_page(np.random.default_rng(1000 + i), 2 * half) for i in range(pages)]

    def manager(level: str = "shared", verify_crc: bool = True) -> Any:
        """A manager whose host ("host", "shared") or remote ("daemon") level is measured."""
        return kv.KVCacheManager(kv.KVCacheConfig(
            groups, gpu_quota=quota, host_quota=0 if level == "daemon" else host_quota, device=device,
            remote=kv.RemoteTierConfig(lambda i: DaemonBackend(sock, i), max_pages=pages) if level == "daemon" else None,
            shared=kv.SharedTierConfig(sock, region_slots=8 * pages + 64, verify_crc=verify_crc)
            if level == "shared" else None), cold_page_codec=codec)

    # Every timed onboard starts with the CPU's caches holding other data. A host tier's onboard
    # right after its own evict would otherwise read the blobs it just wrote out of the cache, where
    # an L2 hit reads blobs another process wrote earlier from memory, as any tier does for a page
    # evicted a while ago.
    evict_caches = CacheEvictor()

    def wait(m: Any) -> None:
        """On a GPU a call returns once its copies are queued: the timed call waits for them. On
        the CPU backend the call has done its work when it returns."""
        if device != "cpu":
            m.synchronize()

    def filled(m: Any, names: list[bytes]) -> Any:
        ps = m.allocate(0, pages)
        for p, raw in zip(ps, model):
            _put(m, p, raw)
        m.set_keys(ps, names)
        return ps

    def check(m: Any, ps: Any, what: str) -> None:
        for p, raw in zip(ps, expected):
            if not np.array_equal(_get(m, p), raw):
                raise RuntimeError(f"a page onboarded from {what} differs from the page evicted")

    # What the codec gives back: one evict and onboard through a host tier of its own.
    m = manager("host")
    try:
        ps = filled(m, keys)
        m.evict(ps, level=kv.CacheLevel.HOST)
        m.onboard(ps, source=kv.CacheLevel.HOST)
        wait(m)
        expected = [_get(m, p) for p in ps]
        # A compressing codec's blobs are smaller: each manager's host tier (and its share of the
        # daemon's region) holds the pages' blobs, not twice or four times as many.
        host_quota = pages * m.cold_page_bytes(0)
    finally:
        m.close()
    lossy = any(not np.array_equal(e, raw) for e, raw in zip(expected, model))

    def round_trip(name: str, m: Any, ps: Any, level: Any) -> tuple[float, float]:
        if lossy:
            for p, raw in zip(ps, model):
                _put(m, p, raw)
            wait(m)
        t0 = time.perf_counter()
        m.evict(ps, level=level)
        wait(m)
        evicted = time.perf_counter() - t0
        evict_caches()  # untimed: the blobs just written are no longer in the CPU's cache
        t1 = time.perf_counter()
        r = m.onboard(ps, source=level)
        wait(m)
        t2 = time.perf_counter()
        if r.moved != pages:
            raise RuntimeError(f"the {name} level onboarded {r.moved} of {pages} pages ({len(r.dropped)} dropped)")
        return evicted, t2 - t1

    def found_step(reader: Any) -> tuple[float, float, float]:
        evict_caches()
        t0 = time.perf_counter()
        found = reader.find_shared(keys)
        t1 = time.perf_counter()
        if any(f is None for f in found):
            raise RuntimeError(f"{sum(f is None for f in found)} of {pages} pages were not found in L2")
        r = reader.onboard(found)
        wait(reader)
        t2 = time.perf_counter()
        if r.moved != pages:
            raise RuntimeError(f"onboarded {r.moved} of {pages} pages found in L2 ({len(r.dropped)} dropped)")
        check(reader, found, "L2")
        reader.free(found)
        return t2 - t0, t2 - t1, t1 - t0

    # Every figure is measured once per round, in turn, so a machine that slows down or speeds up
    # during the run moves all of them alike (the ratios compare the same stretch of time).
    made: list = []

    def keep(m: Any) -> Any:
        made.append(m)  # closed at the end, whatever happens
        return m

    try:
        rigs = {}
        for name, level in (("host", kv.CacheLevel.HOST), ("daemon", kv.CacheLevel.REMOTE),
                            ("shared", kv.CacheLevel.HOST)):
            m = keep(manager(name))
            # The shared level's own pages under keys of their own: the reader finds the writer's.
            rigs[name] = (m, filled(m, [b"own/" + k for k in keys]), level)
        # L2 hits: a writer keeps its pages in the shared host level; a reader finds and onboards them.
        writer = keep(manager())
        writer.evict(filled(writer, keys))
        wait(writer)
        readers = {"shared_found": keep(manager(verify_crc=True)),
                   "shared_found_no_crc": keep(manager(verify_crc=False))}
        times: dict[str, list] = {name: [] for name in (*rigs, *readers)}
        for _ in range(rounds + 1):  # the first round warms up (dropped)
            for name, (m, ps, level) in rigs.items():
                times[name].append(round_trip(name, m, ps, level))
            for name, reader in readers.items():
                times[name].append(found_step(reader))
        for name, (m, ps, _level) in rigs.items():
            check(m, ps, f"the {name} level")
    finally:
        for m in made:
            m.close()
    out: dict = {"lossless": not lossy, "rounds": rounds}
    for name, t in times.items():
        t = np.array(t[1:])
        best, p50 = t.min(axis=0), np.median(t, axis=0)
        if name in rigs:
            out[name] = {"evict_gbps": moved / best[0] / 1e9, "onboard_gbps": moved / best[1] / 1e9,
                         "evict_p50_gbps": moved / p50[0] / 1e9, "onboard_p50_gbps": moved / p50[1] / 1e9}
        else:  # "hit": find_shared and onboard together; "onboard": the onboard alone.
            out[name] = {"hit_gbps": moved / best[0] / 1e9, "onboard_gbps": moved / best[1] / 1e9,
                         "hit_p50_gbps": moved / p50[0] / 1e9, "onboard_p50_gbps": moved / p50[1] / 1e9,
                         "find_us": 1e6 * float(p50[2])}
    host = out["host"]
    for name in ("daemon", "shared"):
        out[name]["evict_vs_host"] = out[name]["evict_gbps"] / host["evict_gbps"]
    for name in ("daemon", "shared", "shared_found", "shared_found_no_crc"):
        out[name]["onboard_vs_host"] = out[name]["onboard_gbps"] / host["onboard_gbps"]
        out[name]["onboard_p50_vs_host"] = out[name]["onboard_p50_gbps"] / host["onboard_p50_gbps"]
    for name in ("shared_found", "shared_found_no_crc"):
        out[name]["hit_vs_host"] = out[name]["hit_gbps"] / host["onboard_gbps"]
    out["onboard_vs_host"] = out["daemon"]["onboard_vs_host"]
    out["evict_vs_host"] = out["daemon"]["evict_vs_host"]
    return out


def run(pages: int = 256, page_bytes: int = 64 << 10, batch: int = 64, rounds: int = 2000, load: int = 0,
        busy_poll_us: float | None = None, daemon_busy_poll_us: float = 0.0, device: str = "cpu",
        hugepages: bool = False, codec: str = "concat", params: dict | None = None, manager_rounds: int = 30) -> dict:
    """Measures the daemon (see the module docstring); returns the report. ``codec`` and ``params``
    are the managers' codec."""
    from ..daemon import DaemonClient
    from ..daemon.client import DEFAULT_BUSY_POLL_US

    poll = DEFAULT_BUSY_POLL_US if busy_poll_us is None else busy_poll_us
    folder = tempfile.mkdtemp(prefix="kvcodec-bench-daemon-")
    sock = os.path.join(folder, "l2.sock")
    # The client's region, the remote level's values and the shared host level's region.
    l2 = max(64 << 20, 11 * pages * (page_bytes + 4096) + (64 << 20))
    daemon = subprocess.Popen([sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", sock, "--l2-bytes", str(l2),
                               *([] if hugepages else ["--no-hugepages"]), "--busy-poll-us", str(daemon_busy_poll_us)],
                              stderr=subprocess.PIPE, text=True)
    busy = []
    try:
        if "serving" not in (daemon.stderr.readline() if daemon.stderr else ""):
            raise RuntimeError("the daemon did not start")
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        with DaemonClient(sock, busy_poll_us=poll) as client:
            region = client.region("bench/1/0", page_bytes, pages)
            data = [kv_page(np.random.default_rng(i), page_bytes) for i in range(pages)]
            keys = [f"bench/{i}".encode() for i in range(pages)]
            stored = client.set(region, keys, data)
            if not all(stored):
                raise RuntimeError(f"L2 stored {sum(stored)} of {pages} pages")
            lookup = [keys[i % pages] for i in range(batch)]

            # Each round: the lookup request (its reply awaited), then its release (a request of its
            # own, answered by nothing): both together, and the lookup's own round trip.
            lat, alone = np.empty(rounds), np.empty(rounds)
            clock = time.perf_counter
            for i in range(-50, rounds):  # 50 untimed rounds first
                t0 = clock()
                found = client.lookup(region, lookup)
                t1 = clock()
                client.release(region, found)
                t2 = clock()
                if i >= 0:
                    lat[i], alone[i] = t2 - t0, t1 - t0
            lat, alone = lat * 1e6, alone * 1e6
            outs = [np.empty(page_bytes, np.uint8) for _ in range(pages)]
            moved = pages * page_bytes
            before = client.socket_bytes
            hit = wall_times(lambda: client.get_into(region, keys, outs), 5)
            per_page_socket = (client.socket_bytes - before) / (5 * pages)
            if not all(np.array_equal(o, d) for o, d in zip(outs, data)):
                raise RuntimeError("a page read from L2 differs from the page stored")

            def local_copy():
                for o, d in zip(outs, data):
                    o[:] = d

            base = wall_times(local_copy, 5)
            stats = client.stats()  # the client's figures; the manager's run comes after
            manager = through_manager(sock, pages, page_bytes, manager_rounds, device=device,
                                      codec=codec if params is None else (codec, params))
    finally:
        for b in busy:
            b.kill()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
    hit_gbps, base_gbps = moved / min(hit) / 1e9, moved / min(base) / 1e9
    return {"pages": pages, "page_bytes": page_bytes, "batch": batch, "rounds": rounds, "load": load,
            "busy_poll_us": poll, "daemon_busy_poll_us": daemon_busy_poll_us, "device": device,
            "codec": codec, "params": params,
            "cpus": os.cpu_count(), "hugepages": bool(stats["hugepages"]), "rtt_p50_us": float(np.percentile(lat, 50)),
            "rtt_p99_us": float(np.percentile(lat, 99)), "lookup_p50_us": float(np.percentile(alone, 50)),
            "lookup_p99_us": float(np.percentile(alone, 99)), "target_p50_us": TARGET_P50_US,
            "target_p99_us": TARGET_P99_US, "l2_hit_gbps": hit_gbps, "local_copy_gbps": base_gbps,
            "l2_hit_vs_local": hit_gbps / base_gbps, "socket_bytes_per_page": per_page_socket, "manager": manager,
            "daemon": {k: stats[k] for k in ("sets", "hits", "misses", "socket_bytes_in", "socket_bytes_out")}}


def table(r: dict) -> Table:
    title = [f"kvcodec daemon from one client: {r['pages']} KV-like pages of {r['page_bytes'] >> 10} KiB, lookups "
             f"of {r['batch']} keys, {r['load']} busy processes on {r['cpus']} CPUs, client polls {r['busy_poll_us']:g} us, daemon {r['daemon_busy_poll_us']:g} us, "
             f"arena on {'huge' if r.get('hugepages') else 'ordinary'} pages, managers with "
             f"{r.get('codec', 'concat')}{' ' + json.dumps(r['params']) if r.get('params') else ''}"]
    t = Table(title, [Column("figure", 44, "<"), Column("measured", 10), Column("target / baseline", 20, "<", "  ")])
    t.rows = [
        ["lookup round trip p50 (us)", f"{r['rtt_p50_us']:.1f}", f"<= {r['target_p50_us']:.0f}"],
        ["lookup round trip p99 (us)", f"{r['rtt_p99_us']:.1f}", f"<= {r['target_p99_us']:.0f}"],
        *([["  the lookup request alone p50 / p99 (us)", f"{r['lookup_p50_us']:.1f}",
            f"/ {r['lookup_p99_us']:.1f}, without its release"]] if "lookup_p50_us" in r else []),
        ["L2 hit, checked copy out (GB/s)", f"{r['l2_hit_gbps']:.2f}",
         f"{r['l2_hit_vs_local']:.2f}x of a local copy ({r['local_copy_gbps']:.2f})"],
        ["socket bytes per page moved", f"{r['socket_bytes_per_page']:.1f}", f"of {r['page_bytes']} page bytes"],
    ]
    m = r["manager"]
    rows = [("evict", "daemon", "remote level on daemon"), ("onboard", "daemon", "remote level on daemon"),
            ("evict", "shared", "shared host level"), ("onboard", "shared", "shared host level"),
            ("hit", "shared_found", "L2 hit: find + onboard"), ("onboard", "shared_found", "L2 hit: onboard"),
            ("hit", "shared_found_no_crc", "L2 hit, no CRC: find + onboard"),
            ("onboard", "shared_found_no_crc", "L2 hit, no CRC: onboard")]
    for d, name, what in rows:
        base = "evict" if d == "evict" else "onboard"
        target = ", target 0.9x" if name.startswith("shared_found") else ""
        p50 = f", p50 {m[name]['onboard_p50_vs_host']:.2f}x" if d == "onboard" and "onboard_p50_vs_host" in m[name] else ""
        t.rows.append([f"{what if d == 'hit' else 'manager ' + d + ', ' + what} (GB/s)", f"{m[name][d + '_gbps']:.2f}",
                       f"{m[name][d + '_vs_host']:.2f}x host tier {base} ({m['host'][base + '_gbps']:.2f}){p50}{target}"])
    return t


def main_with(args: argparse.Namespace, params: dict | None = None) -> int:
    """Runs the benchmark from its parsed options (``params``: --params, already checked)."""
    report = run(args.pages, args.page_bytes, args.batch, args.rounds, args.load, args.busy_poll_us,
                 args.daemon_busy_poll_us, args.device, args.hugepages, args.codec, params, args.manager_rounds)
    return emit(table(report), args.json, report)
