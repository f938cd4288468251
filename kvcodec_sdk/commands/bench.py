"""``kvcodec bench``: codec throughput against the physical ceiling and a baseline."""

from __future__ import annotations

import argparse
import json
import sys

from ..cli import parse_size

NAME = "bench"
HELP = "benchmark a codec against the copy ceiling and a baseline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codec", help="what to benchmark: concat (the codec) or kvcm (the KV-cache manager)")
    p.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--pools", type=int, default=3, help="hot pools per page (default 3)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",")],
                   default=None, help="piece sizes, comma-separated (default 4K,16K,64K,256K,1M)")
    p.add_argument("--bytes", type=parse_size, default=None,
                   help="bytes moved per direction and size (default 512M on GPU, 64M on CPU)")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--pages", type=int, default=10_000, help="kvcm: scattered pages per migrate call (default 10000)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.codec == "kvcm":
        from ..bench import kvcm

        sizes = args.sizes or list(kvcm.DEFAULT_SIZES)
        kw = {"max_bytes": args.bytes} if args.bytes else {}
        report = kvcm.run(device=args.device, pools=args.pools, sizes=sizes, pages=args.pages, iters=args.iters,
                          progress=not args.quiet, **kw)
        print(kvcm.format_table(report))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.to_json(), f, indent=2)
        return 0
    if args.sizes is None:
        from ..bench.concat import DEFAULT_SIZES

        args.sizes = list(DEFAULT_SIZES)
    if args.codec != "concat":
        print(f"kvcodec bench: no benchmark for {args.codec!r}; available: concat, kvcm", file=sys.stderr)
        return 2
    from ..bench import concat

    report = concat.run(device=args.device, pools=args.pools, sizes=args.sizes, total_bytes=args.bytes,
                        iters=args.iters, progress=not args.quiet)
    print(concat.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


