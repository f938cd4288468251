"""Per-kernel GPU time of one nvCOMP codec setting, to see where a call's time goes.

Runs encode and decode with cold blobs in device memory and in pinned host memory under
torch's profiler and prints, per direction, the summed GPU time of every kernel and copy
(the codec's own kernels next to nvCOMP's), with the call's wall time for reference.

    python bench/profile_nvcomp.py [--codec nvcomp-ans] [--params '{"data_type": "uint16"}']
                                   [--pages 256] [--page-kib 512] [--iters 5]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import kvcodec_sdk as kv

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_nvcomp import KiB, kv_like, timed  # noqa: E402


def kernel_table(prof, iters: int) -> list[tuple[str, float, int]]:
    """(name, GPU microseconds per call, launches per call), largest first."""
    rows: dict[str, list[float]] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us <= 0:
            continue
        rows.setdefault(e.key, [0.0, 0])
        rows[e.key][0] += us
        rows[e.key][1] += e.count
    out = [(k, v[0] / iters, round(v[1] / iters)) for k, v in rows.items()]
    return sorted(out, key=lambda r: -r[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codec", default="nvcomp-ans")
    ap.add_argument("--params", default='{"data_type": "uint16"}')
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--page-kib", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profiling the nvCOMP codecs needs a CUDA device", file=sys.stderr)
        return 2
    params = json.loads(args.params)
    page_bytes = args.page_kib * KiB
    total = args.pages * page_bytes
    hot = kv_like("bf16", total)
    stream = torch.cuda.Stream()
    codec = kv.create_codec(args.codec, params, device="cuda")
    codec.configure([kv.PoolGroupDesc([kv.PoolDesc(hot.data_ptr(), page_bytes, args.pages)], [kv.LifeCycleDesc(0)])])
    cb = codec.cold_page_bytes(0)
    idx = torch.stack([torch.arange(args.pages), torch.arange(args.pages)], dim=1).to(torch.int32).cuda()
    colds = {"device": torch.empty((args.pages, cb), dtype=torch.uint8, device="cuda"),
             "pinned": torch.empty((args.pages, cb), dtype=torch.uint8).pin_memory()}
    print(f"{args.codec} {params}: {args.pages} pages of {args.page_kib} KiB, cold page {cb} B")
    for where, cold in colds.items():
        for op in ("encode", "decode"):
            fn = (lambda: codec.encode(0, cold, idx, stream=stream)) if op == "encode" else \
                 (lambda: codec.decode(0, cold, idx, stream=stream))
            ms = timed(fn, stream, args.iters)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    fn()
                stream.synchronize()
            print(f"\n{op}, cold in {where} memory: {ms * 1e3:.0f} us per call, {total / ms / 1e6:.1f} GB/s raw")
            for name, us, n in kernel_table(prof, args.iters):
                print(f"  {us:9.1f} us  x{n:<4d} {name[:110]}")
    codec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
