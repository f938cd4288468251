"""Throughput, cold page size and error of the nvfp4 codec, next to fp8 and concat.

    python bench_nvfp4.py [--device cpu|cuda] [--pages 64] [--layers 8] [--tokens 16] [--repeats 5]
                          [--calls 1] [--data kv-like|skewed-heads] [--json FILE]

Layout: one hot pool; each page (slot) holds the K and V buffers of ``--layers`` layers, each
``tokens x 8 heads x 128 dims`` bf16, filled with the conformance suite's KV-like values
(``kvcodec_sdk.testing.data``: per-channel scales over two orders of magnitude, outlier channels).
Every configuration encodes all pages in one call and decodes them back in one call; the best of
``--repeats`` calls is reported as raw hot bytes per second. On ``cpu`` the codecs run on the
calling thread (one core); on ``cuda`` the pools and blobs are device memory and each call is
timed with CUDA events on its stream (``--calls N``: N calls issued back to back between the two
events, so that only the first call's host time leaves the device idle; the time per call), next
to the device's copy ceiling measured in the same run
(a 1 GiB device-to-device copy, best of ``--repeats``): each codec's bytes read and written per
second (hot bytes times 1 + cold/hot) over the ceiling's. Error columns compare the decoded pages with the originals
over every quantized element: the root-mean-square error relative to the data's RMS, the largest
error relative to the largest magnitude of its buffer and page, and the mean cosine similarity of the (token,
head) rows. fp8 and concat are installed alongside in this repository; a codec that is not
installed is left out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

import kvcodec_sdk as kv
from kvcodec_sdk.bench import wall_times
from kvcodec_sdk.testing.data import fill_page_bytes, from_float32, to_float32

HEADS, HEAD_DIM = 8, 128
CONFIGS = [("nvfp4", {"granularity": "page_head"}), ("nvfp4", {"granularity": "page"}),
           ("fp8", {"format": "e4m3", "granularity": "page_head"}), ("concat", {})]


def make_pages(pages: int, layers: int, tokens: int, data: str, seed: int = 0):
    buf = tokens * HEADS * HEAD_DIM * 2
    buffers = [kv.BufferDesc(layer, role, 0, (2 * layer + i) * buf, buf, kv.DType.BFLOAT16, tokens, HEADS, HEAD_DIM)
               for layer in range(layers) for i, role in enumerate((kv.Role.KEY, kv.Role.VALUE))]
    slot = 2 * layers * buf
    src = fill_page_bytes(np.random.default_rng(seed), slot, pages, buffers)
    if data == "skewed-heads":  # head h scaled by 10^(-h/2): 3.5 orders of magnitude between heads of a page
        x = to_float32(src.reshape(-1), kv.DType.BFLOAT16).reshape(-1, HEADS, HEAD_DIM)
        x = x * (10.0 ** (-np.arange(HEADS) / 2)).astype(np.float32)[None, :, None]
        src = from_float32(x.reshape(-1), kv.DType.BFLOAT16).reshape(pages, slot)
    return np.ascontiguousarray(src), buffers, slot


def error_stats(src: np.ndarray, out: np.ndarray, buffers, tokens: int) -> dict:
    x = to_float32(src.reshape(-1), kv.DType.BFLOAT16).astype(np.float64)
    y = to_float32(out.reshape(-1), kv.DType.BFLOAT16).astype(np.float64)
    err = y - x
    per = tokens * HEADS * HEAD_DIM  # one buffer of one page
    rows_x, rows_y = x.reshape(-1, HEAD_DIM), y.reshape(-1, HEAD_DIM)
    dot = np.sum(rows_x * rows_y, axis=1)
    norm = np.linalg.norm(rows_x, axis=1) * np.linalg.norm(rows_y, axis=1)
    cos = np.where(norm > 0, dot / np.where(norm > 0, norm, 1), 1.0)
    return {"relative_rms_error": float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(x**2))),
            "max_error_over_amax": float(np.max(np.max(np.abs(err).reshape(-1, per), axis=1)
                                                / np.maximum(np.max(np.abs(x).reshape(-1, per), axis=1), 1e-30))),
            "mean_row_cosine": float(np.mean(cos)), "min_row_cosine": float(np.min(cos))}


class Host:
    def __init__(self, src):
        self.src, self.dst = src, np.zeros_like(src)

    def group(self, pool, slot, pages, buffers):
        return [kv.PoolGroupDesc([kv.PoolDesc(pool.ctypes.data, slot, pages)], [kv.LifeCycleDesc(0, tuple(buffers))])]

    def time(self, fn, repeats):
        return min(wall_times(fn, repeats))


def run_cpu(name, params, src, buffers, slot, pages, repeats, calls=1):
    host = Host(src)
    enc = kv.create_codec(name, params, device="cpu")
    enc.configure(host.group(host.src, slot, pages, buffers))
    dec = kv.create_codec(name, params, device="cpu")
    dec.configure(host.group(host.dst, slot, pages, buffers))
    cold = np.zeros((pages, enc.cold_page_bytes(0)), np.uint8)
    ident = np.ascontiguousarray(np.stack([np.arange(pages)] * 2, 1).astype(np.int32))
    t_enc = host.time(lambda: enc.encode(0, cold, ident), repeats)
    t_dec = host.time(lambda: dec.decode(0, cold, ident), repeats)
    page = enc.cold_page_bytes(0)
    enc.close()
    dec.close()
    return t_enc, t_dec, page, host.dst, None


def run_cuda(name, params, src, buffers, slot, pages, repeats, calls=1):
    import torch

    hot = torch.from_numpy(src).cuda()
    out = torch.zeros_like(hot)

    def group(t):
        return [kv.PoolGroupDesc([kv.PoolDesc(t.data_ptr(), slot, pages)], [kv.LifeCycleDesc(0, tuple(buffers))])]

    enc = kv.create_codec(name, params, device="cuda")
    enc.configure(group(hot))
    dec = kv.create_codec(name, params, device="cuda")
    dec.configure(group(out))
    page = enc.cold_page_bytes(0)
    cold = torch.zeros((pages, page), dtype=torch.uint8, device="cuda")
    ident = torch.from_numpy(np.ascontiguousarray(np.stack([np.arange(pages)] * 2, 1).astype(np.int32))).cuda()
    stream = torch.cuda.Stream()

    host = {}

    def timed(fn, what):
        fn()
        stream.synchronize()
        best, issue = float("inf"), []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            t0 = time.perf_counter()
            fn()
            issue.append(time.perf_counter() - t0)  # the host's time to issue one call
            for _ in range(calls - 1):
                fn()
            b.record(stream)
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3 / calls)
        host[what] = statistics.median(issue)
        return best

    t_enc = timed(lambda: enc.encode(0, cold, ident, stream=stream), "encode")
    t_dec = timed(lambda: dec.decode(0, cold, ident, stream=stream), "decode")
    enc.close()
    dec.close()
    return t_enc, t_dec, page, out.cpu().numpy(), host


def copy_ceiling(repeats: int) -> float:
    """Bytes read and written per second by a 1 GiB device-to-device copy (best of ``repeats``)."""
    import torch

    a = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats + 1):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    del a, b
    return 2 * (1 << 30) / best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--pages", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=1,
                   help="cuda: calls per timed sample, issued back to back (default 1: each call timed alone)")
    p.add_argument("--data", choices=("kv-like", "skewed-heads"), default="kv-like",
                   help="the suite's KV-like values, or the same with heads 10^(-h/2) apart")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args(argv)
    if a.calls < 1:
        p.error(f"--calls: {a.calls} is not valid: give 1 or more")
    src, buffers, slot = make_pages(a.pages, a.layers, a.tokens, a.data)
    known = {s.name for s in kv.list_codecs()}
    run = run_cpu if a.device == "cpu" else run_cuda
    raw = a.pages * slot
    rows = []
    print(f"{a.device}: {a.pages} pages of {slot} B (K and V of {a.layers} layers, {a.tokens} tokens x {HEADS} heads x "
          f"{HEAD_DIM} bf16, {a.data}), best of {a.repeats}"
          + (f", {a.calls} calls back to back per sample" if a.device == "cuda" and a.calls > 1 else ""))
    print(f"{'codec':7} {'params':48} {'ratio':>6} {'enc GB/s':>9} {'dec GB/s':>9} {'rel RMS':>8} {'max/amax':>9} "
          f"{'cos mean':>9} {'cos min':>8}")
    ceiling = copy_ceiling(a.repeats) if a.device == "cuda" else None
    for name, params in CONFIGS:
        if name not in known:
            continue
        t_enc, t_dec, page, out, host = run(name, params, src, buffers, slot, a.pages, a.repeats, a.calls)
        row = {"codec": name, "params": params, "cold_page_bytes": page, "hot_page_bytes": slot,
               "ratio": page / slot, "encode_gbps": raw / t_enc / 1e9, "decode_gbps": raw / t_dec / 1e9,
               **error_stats(src, out, buffers, a.tokens)}
        if host is not None:  # the host's time to issue one call (median), against the device's per call
            row.update({"encode_issue_us": host["encode"] * 1e6, "decode_issue_us": host["decode"] * 1e6,
                        "encode_device_us": t_enc * 1e6, "decode_device_us": t_dec * 1e6})
        if ceiling is not None:  # bytes read + written over the copy ceiling's
            moved = raw * (1 + page / slot)
            row["encode_vs_copy_ceiling"] = moved / t_enc / ceiling
            row["decode_vs_copy_ceiling"] = moved / t_dec / ceiling
        rows.append(row)
        print(f"{name:7} {json.dumps(params):48} {row['ratio']:6.4f} {row['encode_gbps']:9.3f} {row['decode_gbps']:9.3f} "
              f"{row['relative_rms_error']:8.4f} {row['max_error_over_amax']:9.4f} {row['mean_row_cosine']:9.5f} "
              f"{row['min_row_cosine']:8.5f}"
              + (f"  {row['encode_vs_copy_ceiling']:.3f}x / {row['decode_vs_copy_ceiling']:.3f}x ceiling" if ceiling else "")
              + (f"  issue {row['encode_issue_us']:.0f} / {row['decode_issue_us']:.0f} us of "
                 f"{row['encode_device_us']:.0f} / {row['decode_device_us']:.0f}" if host is not None else ""))
    if ceiling is not None:
        print(f"device copy ceiling: {ceiling / 1e9:.0f} GB/s read + written (1 GiB device-to-device copy)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "machine": platform.machine(), "processor": platform.processor(),
                       "python": sys.version.split()[0], "pages": a.pages, "calls": a.calls, "layers": a.layers, "data": a.data, "tokens": a.tokens,
                       "copy_ceiling_gbps": None if ceiling is None else ceiling / 1e9, "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
