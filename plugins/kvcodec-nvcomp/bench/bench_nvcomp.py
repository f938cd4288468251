"""Benchmark of the nvCOMP codecs on a GPU (torch with CUDA needed).

For each algorithm and setting, on KV-like bf16 and fp8 data:
  * compression ratio (raw bytes / used blob bytes, envelope and table included);
  * nvCOMP's batched API called directly on the same chunks (compress / decompress GB/s in raw
    bytes) — the baseline;
  * the codec with hot and cold in device memory (encode / decode GB/s) and its overhead over
    the direct calls (time ratio - 1; target <= 10%);
  * end to end: hot (device) -> cold blobs in pinned host memory and back, GB/s in raw bytes,
    next to the concat codec and the pinned-copy ceiling measured in the same run (target for
    the best setting: >= 1.1x concat).

Synthetic "KV-like" data: per-channel log-normal scales times normal values (bf16), and the
same scaled into e4m3 range (fp8). Real activations compress differently; docs/nvcomp.md says
which numbers came from which data.

    python bench/bench_nvcomp.py [--pages 256] [--page-kib 512] [--iters 5] [--budget-s 150] [--json OUT]

Settings left when --budget-s seconds have passed are skipped and listed as such, so a run
always ends in bounded time; the defaults move 128 MiB per setting and direction.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from kvcodec_nvcomp import _ext

import kvcodec_sdk as kv

KiB = 1024

# (codec, params, label); zstd has no CPU reference, so it is measured through nvCOMP directly.
SETTINGS = {
    "bf16": [
        ("nvcomp-lz4", {}, "lz4"),
        ("nvcomp-lz4", {"data_type": "uint16"}, "lz4 u16"),
        ("nvcomp-lz4", {"data_type": "uint16", "bitshuffle": True}, "lz4 u16+bitshuffle"),
        ("nvcomp-ans", {}, "ans"),
        ("nvcomp-ans", {"data_type": "uint16"}, "ans u16"),
        ("nvcomp-ans", {"data_type": "uint16", "bitshuffle": True}, "ans u16+bitshuffle"),
        ("nvcomp-gdeflate", {}, "gdeflate"),
        ("nvcomp-gdeflate", {"data_type": "uint16", "bitshuffle": True}, "gdeflate u16+bitshuffle"),
        ("zstd", {}, "zstd (direct only)"),
    ],
    "fp8": [
        ("nvcomp-lz4", {}, "lz4"),
        ("nvcomp-lz4", {"bitshuffle": True}, "lz4 bitshuffle"),
        ("nvcomp-ans", {}, "ans"),
        ("nvcomp-ans", {"bitshuffle": True}, "ans bitshuffle"),
        ("nvcomp-gdeflate", {}, "gdeflate"),
        ("zstd", {}, "zstd (direct only)"),
    ],
}


_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[bench] {time.monotonic() - _T0:6.1f}s {msg}", file=sys.stderr, flush=True)


def kv_like(kind: str, nbytes: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dim = 128
    if kind == "bf16":
        n = nbytes // 2
        scales = torch.exp(torch.randn(dim, device="cuda", generator=g))
        x = torch.randn(n // dim, dim, device="cuda", generator=g) * scales
        return x.to(torch.bfloat16).view(torch.uint8).reshape(-1)
    scales = torch.exp(0.5 * torch.randn(dim, device="cuda", generator=g))
    x = torch.randn(nbytes // dim, dim, device="cuda", generator=g) * scales
    x = x / x.abs().amax(dim=0, keepdim=True) * 448.0  # per-channel scaling into e4m3 range
    return x.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1)


def bitshuffle_chunks(data: torch.Tensor, chunk: int, w: int) -> torch.Tensor:
    """Format version 1's bit shuffle of every chunk (chunk divides the data, 8w divides chunk)."""
    groups = chunk // (8 * w)
    x = data.view(-1, groups, 8, w)  # [chunk][group][j][byte]
    shifts = torch.arange(8, device=data.device, dtype=torch.uint8)
    bits = (x.unsqueeze(-1) >> shifts) & 1  # [chunk][group][j][byte][bit]
    planes = bits.permute(0, 3, 4, 1, 2)  # [chunk][byte][bit][group][j]
    packed = (planes << shifts).sum(dim=-1, dtype=torch.uint8)
    return packed.reshape(-1).contiguous()


def timed(fn, stream, iters: int) -> float:
    """Mean milliseconds of fn() on `stream` over iters runs after one warm-up."""
    fn()
    stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / iters


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def measure(kind, codec_name, params, label, hot, pages, page_bytes, iters, stream, pinned_cold, concat):
    total = pages * page_bytes
    chunk = params.get("chunk_bytes", 64 * KiB)
    w = {"uint8": 1, "uint16": 2, "uint32": 4}[params.get("data_type", "uint8")]
    algorithm = codec_name.removeprefix("nvcomp-")
    direct_input = bitshuffle_chunks(hot, chunk, w) if params.get("bitshuffle") else hot
    d = _ext.direct_benchmark(algorithm, w, direct_input.data_ptr(), total, chunk, iters, stream.cuda_stream)
    if not d["round_trip_ok"]:
        raise RuntimeError(f"{label}: direct nvCOMP round trip failed")
    row = {
        "data": kind, "setting": label, "codec": codec_name, "params": params,
        "direct_ratio": total / d["compressed_bytes"],
        "direct_compress_gbps": gbps(total, d["compress_ms"]),
        "direct_decompress_gbps": gbps(total, d["decompress_ms"]),
    }
    if codec_name == "zstd":
        return row
    codec = kv.create_codec(codec_name, params, device="cuda")
    layout = [kv.PoolGroupDesc([kv.PoolDesc(hot.data_ptr(), page_bytes, pages)], [kv.LifeCycleDesc(0)])]
    codec.configure(layout)
    cb = codec.cold_page_bytes(0)
    idx = torch.stack([torch.arange(pages), torch.arange(pages)], dim=1).to(torch.int32).cuda()
    cold_dev = torch.empty((pages, cb), dtype=torch.uint8, device="cuda")
    original = hot.clone()
    # Correctness first: encode, decode into the same slots after clearing, compare.
    codec.encode(0, cold_dev, idx, stream=stream)
    stream.synchronize()
    hot.zero_()
    codec.decode(0, cold_dev, idx, stream=stream)
    stream.synchronize()
    if not torch.equal(hot, original):
        raise RuntimeError(f"{label}: codec round trip changed the data")
    used = 0
    blobs = cold_dev.cpu().numpy()
    for p in range(pages):
        header = blobs[p, :32].tobytes()
        header_bytes, payload_bytes = np.frombuffer(header[8:16], dtype="<u4")
        used += int(header_bytes) + int(payload_bytes)
    enc_dev = timed(lambda: codec.encode(0, cold_dev, idx, stream=stream), stream, iters)
    dec_dev = timed(lambda: codec.decode(0, cold_dev, idx, stream=stream), stream, iters)
    cold_host = pinned_cold[: pages * cb].view(pages, cb)  # contiguous blobs of cb bytes
    enc_host = timed(lambda: codec.encode(0, cold_host, idx, stream=stream), stream, iters)
    dec_host = timed(lambda: codec.decode(0, cold_host, idx, stream=stream), stream, iters)
    if not torch.equal(hot, original):
        raise RuntimeError(f"{label}: data changed after the timed runs")
    codec.close()
    row.update({
        "cold_page_bytes": cb,
        "ratio": total / used,
        "encode_gbps": gbps(total, enc_dev),
        "decode_gbps": gbps(total, dec_dev),
        "encode_overhead": enc_dev / d["compress_ms"] - 1,
        "decode_overhead": dec_dev / d["decompress_ms"] - 1,
        "hot_to_host_gbps": gbps(total, enc_host),
        "host_to_hot_gbps": gbps(total, dec_host),
        "hot_to_host_vs_concat": gbps(total, enc_host) / concat["hot_to_host_gbps"],
        "host_to_hot_vs_concat": gbps(total, dec_host) / concat["host_to_hot_gbps"],
    })
    return row


def concat_baseline(hot, pages, page_bytes, iters, stream, pinned_cold):
    codec = kv.create_codec("concat", device="cuda")
    codec.configure([kv.PoolGroupDesc([kv.PoolDesc(hot.data_ptr(), page_bytes, pages)], [kv.LifeCycleDesc(0)])])
    loc = codec.page_index_location(0)
    idx = torch.stack([torch.arange(pages), torch.arange(pages)], dim=1).to(torch.int32)
    idx = idx.cuda() if loc == kv.PageIndexLocation.DEVICE else idx
    total = pages * page_bytes
    cold = pinned_cold[:total].view(pages, page_bytes)
    enc = timed(lambda: codec.encode(0, cold, idx, stream=stream), stream, iters)
    dec = timed(lambda: codec.decode(0, cold, idx, stream=stream), stream, iters)
    flat = torch.empty(total, dtype=torch.uint8).pin_memory()
    with torch.cuda.stream(stream):
        d2h = timed(lambda: flat.copy_(hot, non_blocking=True), stream, iters)
        h2d = timed(lambda: hot.copy_(flat, non_blocking=True), stream, iters)
    codec.close()
    return {"hot_to_host_gbps": gbps(total, enc), "host_to_hot_gbps": gbps(total, dec),
            "pinned_d2h_gbps": gbps(total, d2h), "pinned_h2d_gbps": gbps(total, h2d)}


def markdown(report) -> str:
    c = report["concat"]
    lines = [
        f"Device: {report['device']}; {report['pages']} pages of {report['page_bytes'] // KiB} KiB "
        f"({report['pages'] * report['page_bytes'] >> 20} MiB per direction), 64 KiB chunks unless noted.",
        "",
        f"Pinned copy ceiling: D2H {c['pinned_d2h_gbps']:.1f} GB/s, H2D {c['pinned_h2d_gbps']:.1f} GB/s; "
        f"concat codec: hot->host {c['hot_to_host_gbps']:.1f} GB/s, host->hot {c['host_to_hot_gbps']:.1f} GB/s.",
        "",
        "| data | setting | ratio | nvCOMP comp GB/s | nvCOMP decomp GB/s | codec enc GB/s (overhead) "
        "| codec dec GB/s (overhead) | hot->host GB/s (x concat) | host->hot GB/s (x concat) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        if "ratio" not in r:
            lines.append(f"| {r['data']} | {r['setting']} | {r['direct_ratio']:.2f} | {r['direct_compress_gbps']:.0f} "
                         f"| {r['direct_decompress_gbps']:.0f} | - | - | - | - |")
            continue
        lines.append(
            f"| {r['data']} | {r['setting']} | {r['ratio']:.2f} | {r['direct_compress_gbps']:.0f} "
            f"| {r['direct_decompress_gbps']:.0f} | {r['encode_gbps']:.0f} ({r['encode_overhead']:+.0%}) "
            f"| {r['decode_gbps']:.0f} ({r['decode_overhead']:+.0%}) "
            f"| {r['hot_to_host_gbps']:.1f} ({r['hot_to_host_vs_concat']:.2f}x) "
            f"| {r['host_to_hot_gbps']:.1f} ({r['host_to_hot_vs_concat']:.2f}x) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--page-kib", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--data", default="bf16,fp8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the settings left after this many seconds")
    args = ap.parse_args(argv)
    if not (1 <= args.pages <= 4096 and 4 <= args.page_kib <= 8192 and 1 <= args.iters <= 100):
        print(f"--pages {args.pages}, --page-kib {args.page_kib}, --iters {args.iters}: valid ranges are "
              "[1, 4096], [4, 8192], [1, 100]", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("the nvCOMP benchmark needs a CUDA device", file=sys.stderr)
        return 2
    page_bytes = args.page_kib * KiB
    stream = torch.cuda.Stream()
    report = {"device": torch.cuda.get_device_name(), "pages": args.pages, "page_bytes": page_bytes,
              "iters": args.iters, "rows": []}
    worst = max(page_bytes * 2, page_bytes + 64 * KiB)
    pinned_cold = torch.empty(args.pages * worst, dtype=torch.uint8).pin_memory()
    status = 0
    for kind in args.data.split(","):
        hot = kv_like(kind, args.pages * page_bytes)
        if "concat" not in report:
            report["concat"] = concat_baseline(hot, args.pages, page_bytes, args.iters, stream, pinned_cold)
            log(f"concat: {report['concat']}")
        for codec_name, params, label in SETTINGS[kind]:
            if time.monotonic() - _T0 > args.budget_s:
                log(f"{kind} {label}: skipped, past the {args.budget_s:.0f} s budget")
                report["rows"].append({"data": kind, "setting": label, "error": "skipped: time budget"})
                status = 1
                continue
            log(f"{kind} {label}: measuring")
            try:
                row = measure(kind, codec_name, params, label, hot, args.pages, page_bytes, args.iters, stream,
                              pinned_cold, report["concat"])
            except Exception as e:  # keep measuring the other settings, report the failure
                log(f"{kind} {label}: FAILED: {e}")
                report["rows"].append({"data": kind, "setting": label, "error": str(e)})
                status = 1
                continue
            log(f"{kind} {label}: {row}")
            report["rows"].append(row)
    report["rows_ok"] = [r for r in report["rows"] if "error" not in r]
    text = markdown({**report, "rows": report["rows_ok"]})
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return status


if __name__ == "__main__":
    sys.exit(main())
