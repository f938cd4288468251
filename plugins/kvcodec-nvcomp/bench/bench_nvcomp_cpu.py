"""Single-thread throughput of the nvCOMP codecs' CPU reference, against the python ``lz4``
package compressing the same chunks.

    python bench_nvcomp_cpu.py [--pages 64] [--layers 6] [--repeats 5] [--json FILE]

Layout: one hot pool; each page holds the K and V buffers of ``--layers`` layers, each 16 tokens
x 12 heads x 128 dims bf16 of KV-like values (``kvcodec_sdk.testing.data``). Each setting encodes
every page in one call and decodes them back in one call, through the Python ``Codec`` on
``device="cpu"`` (envelope, chunk table and CRC-32C included); the best of ``--repeats`` calls is
reported as raw hot bytes per second (one core: the CPU reference runs on the calling thread).
The baseline is ``lz4.block`` compressing and decompressing the same bytes cut into the codec's
chunks (``chunk_bytes``, default 64 KiB), one Python call per chunk, with no envelope or checksum.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np

import kvcodec_sdk as kv
from kvcodec_sdk.bench import Column, Table, emit, wall_times
from kvcodec_sdk.testing.data import fill_page_bytes

TOKENS, HEADS, HEAD_DIM = 16, 12, 128
SETTINGS = [("nvcomp-lz4", {}), ("nvcomp-lz4", {"data_type": "uint16", "bitshuffle": True}),
            ("nvcomp-gdeflate", {}), ("nvcomp-gdeflate", {"data_type": "uint16", "bitshuffle": True}), ("concat", {})]


def kv_pages(pages: int, layers: int):
    buf = TOKENS * HEADS * HEAD_DIM * 2
    buffers = [kv.BufferDesc(layer, role, 0, (2 * layer + i) * buf, buf, kv.DType.BFLOAT16, TOKENS, HEADS, HEAD_DIM)
               for layer in range(layers) for i, role in enumerate((kv.Role.KEY, kv.Role.VALUE))]
    slot = 2 * layers * buf
    return fill_page_bytes(np.random.default_rng(0), slot, pages, buffers), buffers


def run_codec(name, params, src, buffers, repeats):
    pages, slot = src.shape
    dst = np.zeros_like(src)
    idx = np.ascontiguousarray(np.stack([np.arange(pages), np.arange(pages)], 1).astype(np.int32))
    codecs = []
    for pool in (src, dst):
        c = kv.create_codec(name, params, device="cpu")
        c.configure([kv.PoolGroupDesc([kv.PoolDesc(pool.ctypes.data, slot, pages)], [kv.LifeCycleDesc(0, tuple(buffers))])])
        codecs.append(c)
    cold = np.zeros((pages, codecs[0].cold_page_bytes(0)), np.uint8)
    t_enc = min(wall_times(lambda: codecs[0].encode(0, cold, idx), repeats))
    t_dec = min(wall_times(lambda: codecs[1].decode(0, cold, idx), repeats))
    if not np.array_equal(src, dst):
        raise SystemExit(f"{name} {params}: decoded pages differ from the originals")
    for c in codecs:
        c.close()
    return {"what": name, "params": params, "encode_gbps": src.nbytes / t_enc / 1e9, "decode_gbps": src.nbytes / t_dec / 1e9}


def run_lz4_package(src, chunk, repeats):
    import lz4.block

    data = src.tobytes()
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    out: list = []
    t_enc = min(wall_times(lambda: out.__setitem__(slice(None), [lz4.block.compress(p, store_size=False) for p in pieces]),
                           repeats))
    t_dec = min(wall_times(lambda: [lz4.block.decompress(c, uncompressed_size=len(p)) for c, p in zip(out, pieces)], repeats))
    return {"what": "lz4 package", "params": {"chunk_bytes": chunk}, "encode_gbps": len(data) / t_enc / 1e9,
            "decode_gbps": len(data) / t_dec / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    src, buffers = kv_pages(args.pages, args.layers)
    rows = [run_codec(name, params, src, buffers, args.repeats) for name, params in SETTINGS]
    rows.append(run_lz4_package(src, 65536, args.repeats))
    base = rows[-1]
    title = (f"nvCOMP codecs' CPU reference, one thread ({platform.processor() or platform.machine()}); {args.pages} "
             f"pages of {args.layers} layers x K,V x {TOKENS} tokens x {HEADS} heads x {HEAD_DIM} dims bf16 "
             f"({src.nbytes / 2**20:.0f} MiB hot); GB/s of raw hot bytes, x the lz4 package on the same 64 KiB chunks")
    table = Table([title], [Column("codec", 16, "<"), Column("params", 38, "<"), Column("encode", 8),
                            Column("x lz4", 6), Column("decode", 8), Column("x lz4", 6)])
    table.rows = [[r["what"], json.dumps(r["params"]), f"{r['encode_gbps']:.3f}",
                   f"{r['encode_gbps'] / base['encode_gbps']:.2f}", f"{r['decode_gbps']:.3f}",
                   f"{r['decode_gbps'] / base['decode_gbps']:.2f}"] for r in rows]
    return emit(table, args.json, {"args": vars(args), "results": rows})

if __name__ == "__main__":
    sys.exit(main())
