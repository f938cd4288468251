"""Single-thread throughput of the fp8 codec's CPU implementation (and of ``concat`` for scale).

    python bench_fp8_cpu.py [--pages 64] [--layers 8] [--tokens 32] [--repeats 5] [--simd LIST] [--json FILE]

Layout: one hot pool; each page (slot) holds the K and V buffers of ``--layers`` layers, each
``tokens x 8 heads x 128 dims`` bf16, filled with KV-like values (``kvcodec_sdk.testing.data``).
Every configuration (format, granularity) encodes all pages in one call and decodes them back in
one call, through the Python ``Codec`` on ``device="cpu"``; the best of ``--repeats`` calls is
reported as raw hot bytes per second (the CPU codecs run on the calling thread, so this is one
core). Decode writes its output into a second pool, so encode always sees the original data.
The fp8 rows run once per CPU kernel variant (``--simd``, default: every variant this CPU runs;
``portable`` is the build's baseline instruction set, ``avx2`` and ``avx512`` the variants picked at
run time where the CPU has them, the best one first; they write the same bytes). The built-in ``concat`` codec (lossless copy) runs on
the same data as a reference point.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys

import numpy as np
from kvcodec_fp8 import _testing
from kvcodec_fp8.plugin import SPEC as FP8_SPEC

import kvcodec_sdk as kv
from kvcodec_sdk.bench import Column, Table, emit, wall_times
from kvcodec_sdk.testing.data import fill_page_bytes

HEADS, HEAD_DIM = 8, 128
CONFIGS = [("fp8", {"format": "e4m3", "granularity": "page_head"}),
           ("fp8", {"format": "e4m3", "granularity": "token_head"}),
           ("fp8", {"format": "e4m3", "granularity": "page"}),
           ("fp8", {"format": "e5m2", "granularity": "page_head"}),
           ("concat", {})]


def make_layout(pages: int, layers: int, tokens: int, seed: int = 0):
    buf = tokens * HEADS * HEAD_DIM * 2
    buffers = [kv.BufferDesc(layer, role, 0, (2 * layer + i) * buf, buf, kv.DType.BFLOAT16, tokens, HEADS, HEAD_DIM)
               for layer in range(layers) for i, role in enumerate((kv.Role.KEY, kv.Role.VALUE))]
    slot = 2 * layers * buf
    src = fill_page_bytes(np.random.default_rng(seed), slot, pages, buffers)
    dst = np.zeros_like(src)

    def group(pool):
        return [kv.PoolGroupDesc([kv.PoolDesc(pool.ctypes.data, slot, pages)], [kv.LifeCycleDesc(0, tuple(buffers))])]

    return src, dst, group(src), group(dst)


def registry() -> kv.CodecRegistry:
    """concat, and fp8 made by the factory of kvcodec_fp8._testing: its codecs use the CPU kernel
    variant _testing.set_cpu_simd chooses (the installed fp8 codec keeps the best one)."""
    reg = kv.CodecRegistry(load_entry_points=False)
    reg.register(dataclasses.replace(FP8_SPEC, factory=_testing.codec_factory, devices=("cpu",)))
    return reg


def run(name, params, simd, pages, layers, tokens, repeats):
    src, dst, src_groups, dst_groups = make_layout(pages, layers, tokens)
    idx = np.ascontiguousarray(np.stack([np.arange(pages), np.arange(pages)], 1).astype(np.int32))
    codecs = registry()
    enc = codecs.create_codec(name, params, device="cpu")
    enc.configure(src_groups)
    dec = codecs.create_codec(name, params, device="cpu")
    dec.configure(dst_groups)
    cold = np.zeros((pages, enc.cold_page_bytes(0)), np.uint8)
    t_enc = min(wall_times(lambda: enc.encode(0, cold, idx), repeats))
    t_dec = min(wall_times(lambda: dec.decode(0, cold, idx), repeats))
    enc.close()
    dec.close()
    hot = src.nbytes
    return {"codec": name, "params": params, "simd": simd, "pages": pages, "hot_bytes": hot, "cold_bytes": cold.nbytes,
            "encode_gbps": hot / t_enc / 1e9, "decode_gbps": hot / t_dec / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--simd", default=",".join(_testing.cpu_simd_variants()),
                    help="comma-separated fp8 CPU kernel variants to run (default: all this CPU supports)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    rows = []
    for name, params in CONFIGS:
        for simd in (args.simd.split(",") if name == "fp8" else ["-"]):
            if simd != "-":
                _testing.set_cpu_simd(simd)
            try:
                rows.append(run(name, params, simd, args.pages, args.layers, args.tokens, args.repeats))
            finally:
                _testing.set_cpu_simd(None)
    title = (f"CPU codecs, one thread ({platform.processor() or platform.machine()}); {args.pages} pages of "
             f"{args.layers} layers x K,V x {args.tokens} tokens x {HEADS} heads x {HEAD_DIM} dims bf16 "
             f"({rows[0]['hot_bytes'] / 2**20:.0f} MiB hot); GB/s of raw hot bytes")
    table = Table([title], [Column("codec", 7, "<"), Column("format", 6, "<"), Column("granularity", 11, "<"),
                            Column("kernels", 9, "<"), Column("encode", 8), Column("decode", 8)])
    table.rows = [[r["codec"], r["params"].get("format", "-"), r["params"].get("granularity", "-"), r["simd"],
                   f"{r['encode_gbps']:.2f}", f"{r['decode_gbps']:.2f}"] for r in rows]
    return emit(table, args.json, {"args": vars(args), "results": rows})

if __name__ == "__main__":
    sys.exit(main())
