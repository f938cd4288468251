"""An engine's KV blocks stored and loaded through the block store, per codec, against the codec bare.

``kvcodec bench blocks [--device auto] [--codecs concat,fp8,nvcomp-lz4] [--blocks 256]``

What an engine's offloading worker does (:class:`kvcodec_sdk.integrations.blocks.BlockCodecStore`,
the core of the vLLM worker): per layer one KV tensor laid out as vLLM hands it (``HN2C`` on a
GPU, vLLM's FlashAttention blocks; ``H2NC`` on the CPU backend, vLLM's CPU attention), viewed as
``(num_blocks, page_bytes)`` bytes and adopted in place as the codec's hot pools through
:func:`kvcodec_sdk.kv_tensors.kv_pool_group`; KV-like bf16 contents
(:func:`kvcodec_sdk.testing.data.fill_page_bytes`). Per codec and direction, the best of
``--iters`` timed calls of:

* ``store``: ``store()`` of every block into host slots, then ``wait()`` and ``poll()`` (the
  index upload, the codec call, the event and the bookkeeping the worker does);
* ``bare``: the same codec object's ``encode`` (``decode``) on the same index pairs, already on the
  device, then a stream synchronize.

GB/s are the engine's bytes (raw block bytes) per second. Loaded blocks are checked: lossless
codecs every block byte-exact, lossy ones the first 8 blocks' every K and V buffer within the
declared bound (the codec spec's ``check_error``). ``--layout`` takes any of
:data:`kvcodec_sdk.kv_tensors.KV_LAYOUTS` (``2NHC``: a K and a V plane per block, the fewest and
largest buffers); ``--params`` a JSON object of parameters per codec name.
Targets: ``store`` >= 0.9x ``bare`` per codec and direction; fp8 stores >= 1.8x the raw bytes per
second of concat. Needs torch (a CUDA build for the GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from ._common import spread

TARGET_VS_BARE = 0.9
TARGET_FP8_VS_CONCAT = 1.8
#: Blocks whose every K and V buffer a lossy codec's bound is checked on (lossless: every block).
LOSSY_CHECKED_BLOCKS = 8


def _layers(torch, device: str, layout: str, layers: int, blocks: int, heads: int, block_size: int, head_dim: int):
    """KV tensors with KV-like contents, the int8 views the store adopts, and their pool group."""
    from ..kv_tensors import kv_pool_group
    from ..testing.data import fill_page_bytes

    page = 2 * heads * block_size * head_dim * 2  # bf16 K and V of one block of one layer
    probe = [np.zeros((1, page), np.uint8) for _ in range(layers)]
    group = kv_pool_group(probe, layout=layout, num_heads=heads, head_dim=head_dim, block_size=block_size,
                          dtype="bfloat16")
    buffers = group.lifecycles[0].buffers
    rng = np.random.default_rng(7)
    views = []
    for p in range(layers):
        host = fill_page_bytes(rng, page, blocks, [b for b in buffers if b.pool_index == p])
        views.append(torch.from_numpy(host).to(device).view(torch.int8))
    group = kv_pool_group(views, layout=layout, num_heads=heads, head_dim=head_dim, block_size=block_size,
                          dtype="bfloat16")
    return views, group


def _verify(store, original: list, spec) -> str:
    """'' when every block equals (lossless) or is within the bound of (lossy) the original."""
    from ..layout import BufferRole

    buffers = store.pool_group.lifecycles[0].buffers
    for p, (t, o) in enumerate(zip(store.tensors, original)):
        got, want = t.cpu().numpy().view(np.uint8), o.view(np.uint8)
        if spec.lossless:
            if not np.array_equal(got, want):
                return f"pool {p}: a loaded block differs from the stored one"
            continue
        for b in (b for b in buffers if b.pool_index == p):
            for i in range(min(len(got), LOSSY_CHECKED_BLOCKS)):
                x = want[i, b.byte_offset:b.byte_offset + b.bytes]
                y = got[i, b.byte_offset:b.byte_offset + b.bytes]
                problem = (None if np.array_equal(x, y) else "a lossless buffer differs") if b.role == BufferRole.OTHER \
                    else spec.check_error(x, y, b, store.codec.params)
                if problem:
                    return f"pool {p}, block {i}: {problem}"
    return ""


def run(device: str = "auto", codecs: tuple[str, ...] = ("concat", "fp8", "nvcomp-lz4"), layers: int | None = None,
        blocks: int | None = None, heads: int = 8, block_size: int = 16, head_dim: int = 128, iters: int = 5,
        progress: bool = True, layout: str | None = None, params: dict | None = None) -> dict:
    """Runs the benchmark; returns the report (the JSON ``--json`` writes)."""
    try:
        import torch
    except ImportError:
        raise SystemExit("kvcodec bench blocks: needs torch (pip install torch)") from None
    from ..integrations.blocks import BlockCodecStore
    from ..registry import get_codec_spec
    from .machine import now, record

    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    cuda = device.startswith("cuda")
    layers = layers or (32 if cuda else 4)
    blocks = blocks or (256 if cuda else 32)
    layout = layout or ("HN2C" if cuda else "H2NC")
    params = params or {}
    started, t_start = now(), time.perf_counter()
    views, group = _layers(torch, device, layout, layers, blocks, heads, block_size, head_dim)
    original = [v.cpu().numpy().copy() for v in views]
    ids = np.arange(blocks, dtype=np.int64)
    rows, skipped = [], {}
    for name in codecs:
        spec = get_codec_spec(name)
        try:
            store = BlockCodecStore(views, group, name, dict(params.get(name, {})), blocks)
        except Exception as exc:  # a codec that cannot run here (CUDA-only on the CPU backend)
            skipped[name] = f"{type(exc).__name__}: {exc}"
            continue
        sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        host = store.host if cuda else store.host.numpy()
        pairs = np.ascontiguousarray(np.stack([ids, ids], axis=1), dtype=np.int32)
        bare_pairs = torch.from_numpy(pairs).to(device) if store._device_indices else pairs
        stream = {"stream": store._stream} if cuda else {}
        times: dict[tuple[str, str], list[float]] = {}
        for it in range(iters + 1):  # the first round warms up (staging, the codec's workspaces)
            for direction in ("store", "load"):
                sync()
                t0 = time.perf_counter()
                if direction == "store":
                    store.store(it, ids, ids)
                else:
                    store.load(it, ids, ids)
                store.wait({it})
                results = store.poll()
                t = time.perf_counter() - t0
                assert [r.ok for r in results] == [True], results
                if it:
                    times.setdefault((direction, "store"), []).append(t)
                sync()
                t0 = time.perf_counter()
                if direction == "store":
                    store.codec.encode(0, host, bare_pairs, **stream)
                else:
                    store.codec.decode(0, host, bare_pairs, **stream)
                sync()
                if it:
                    times.setdefault((direction, "bare"), []).append(time.perf_counter() - t0)
            if it == 0:  # the blocks now hold decode(encode(original)): checked before the timed rounds
                problem = _verify(store, original, spec)
        dropped = store.counters["store_dropped"]
        nbytes = blocks * store.raw_page_bytes
        for direction in ("store", "load"):
            gb = {mode: [nbytes / t / 1e9 for t in times[(direction, mode)]] for mode in ("store", "bare")}
            rows.append({"codec": name, "params": dict(params.get(name, {})), "direction": direction, "blocks": blocks, "raw_page_bytes": store.raw_page_bytes,
                         "cold_page_bytes": store.cold_page_bytes, "gbps": max(gb["store"]),
                         "bare_gbps": max(gb["bare"]), "ratio_to_bare": max(gb["store"]) / max(gb["bare"]),
                         "spread": {"gbps": spread(gb["store"]), "bare_gbps": spread(gb["bare"])},
                         "verified": problem or ("byte-exact" if spec.lossless else "within the declared bound"),
                         "ok": not problem, "dropped": dropped, "repeat": iters})
        if progress:
            print(f"{name}: store {rows[-2]['gbps']:.2f} GB/s, load {rows[-1]['gbps']:.2f} GB/s", file=sys.stderr)
        store.close()
        for v, o in zip(views, original):  # the next codec starts from the same blocks
            v.copy_(torch.from_numpy(o).to(device))
    by = {(r["codec"], r["direction"]): r for r in rows}
    verdicts = {}
    for r in rows:
        verdicts[f"{r['codec']} {r['direction']} x bare"] = r["ratio_to_bare"] >= TARGET_VS_BARE
    if ("fp8", "store") in by and ("concat", "store") in by:
        ratio = by[("fp8", "store")]["gbps"] / by[("concat", "store")]["gbps"]
        verdicts["fp8 store x concat store"] = ratio >= TARGET_FP8_VS_CONCAT
    else:
        ratio = None
    return {
        "benchmark": "blocks",
        "machine": record(device=device, started=started, seconds=time.perf_counter() - t_start),
        "params": {"device": device, "layout": layout, "layers": layers, "blocks": blocks, "heads": heads,
                   "block_size": block_size, "head_dim": head_dim, "iters": iters, "codecs": list(codecs),
                   "codec_params": params},
        "rows": rows, "skipped": skipped, "fp8_vs_concat_store": ratio, "verdicts": verdicts,
        "targets": {"vs_bare": TARGET_VS_BARE, "fp8_vs_concat": TARGET_FP8_VS_CONCAT},
        "ok": all(r["ok"] for r in rows),
    }


def format_report(report: dict) -> str:
    """The report as a text table."""
    p = report["params"]
    lines = [f"engine KV blocks through the block store on {p['device']} ({p['layout']}: {p['layers']} layers x "
             f"{p['heads']} heads x {p['block_size']} tokens x {p['head_dim']}, bf16), {p['blocks']} blocks per call, "
             f"best of {p['iters']}",
             f"{'codec':<16}{'dir':<7}{'GB/s':>8}{'bare GB/s':>11}{'x bare':>8}{'blob/raw':>10}  verified"]
    for r in report["rows"]:
        lines.append(f"{r['codec']:<16}{r['direction']:<7}{r['gbps']:>8.2f}{r['bare_gbps']:>11.2f}"
                     f"{r['ratio_to_bare']:>8.2f}{r['cold_page_bytes'] / r['raw_page_bytes']:>10.3f}  {r['verified']}")
    for name, why in report["skipped"].items():
        lines.append(f"{name}: skipped ({why})")
    if report["fp8_vs_concat_store"] is not None:
        lines.append(f"fp8 store / concat store: {report['fp8_vs_concat_store']:.2f}x raw bytes per second")
    for what, met in report["verdicts"].items():
        target = report["targets"]["fp8_vs_concat" if "concat" in what and "fp8" in what else "vs_bare"]
        lines.append(f"target {what} >= {target}: {'met' if met else 'MISSED'}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser, device_type: Any = str, count: Any = int) -> None:
    """The command line's options (``kvcodec bench blocks`` and ``python -m``)."""
    p.add_argument("--device", type=device_type, default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--codecs", default="concat,fp8,nvcomp-lz4", help="codecs, comma-separated")
    p.add_argument("--layers", type=count, default=None, help="layers (default 32 on a GPU, 4 on the CPU backend)")
    p.add_argument("--blocks", type=count, default=None, help="blocks per call (default 256 on a GPU, 32 on the CPU)")
    p.add_argument("--heads", type=count, default=8, help="KV heads (default 8)")
    p.add_argument("--block-size", type=count, default=16, help="tokens per block (default 16)")
    p.add_argument("--head-dim", type=count, default=128, help="elements per head (default 128)")
    p.add_argument("--layout", choices=("H2NC", "HN2C", "2NHC", "2HNC"), default=None,
                   help="where K and V lie in a block (default HN2C on a GPU, vLLM's FlashAttention; H2NC on the CPU)")
    p.add_argument("--params", default=None, metavar="JSON",
                   help='parameters per codec name as a JSON object, e.g. \'{"fp8": {"granularity": "page"}}\'')
    p.add_argument("--iters", type=count, default=5, help="timed calls per direction, the best reported (default 5)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main_with(args: argparse.Namespace) -> int:
    """Runs from parsed options: 0 when it ran and every block checked out (1 when one did not,
    or with ``--strict`` when a target was missed)."""
    codecs = tuple(c for c in args.codecs.split(",") if c)
    params = None
    if args.params is not None:
        try:
            params = json.loads(args.params)
        except json.JSONDecodeError as exc:
            print(f"kvcodec bench blocks: error: --params is not valid JSON ({exc.msg}): {args.params!r}", file=sys.stderr)
            return 2
        if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
            print(f"kvcodec bench blocks: error: --params must map codec names to parameter objects, got "
                  f"{args.params!r}", file=sys.stderr)
            return 2
    report = run(args.device, codecs, args.layers, args.blocks, args.heads, args.block_size, args.head_dim, args.iters,
                 progress=not args.quiet, layout=args.layout, params=params)
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    if not report["ok"]:
        return 1
    return 1 if args.strict and not all(report["verdicts"].values()) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcodec_sdk.bench.engine_blocks", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return main_with(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
