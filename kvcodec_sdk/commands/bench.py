"""``kvcodec bench``: codec throughput against the physical ceiling and a baseline."""

from __future__ import annotations

import argparse
import json
import sys

from ..cli import parse_size

NAME = "bench"
HELP = "benchmark a codec against the copy ceiling and a baseline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codec", help="what to benchmark: concat (the codec), kvcm (the KV-cache manager), workload (the manager under a "
                        "prefix-reuse engine workload) or disk (the disk tier)")
    p.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--pools", type=int, default=3, help="hot pools per page (default 3)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",")],
                   default=None, help="piece sizes, comma-separated (default 4K,16K,64K,256K,1M)")
    p.add_argument("--bytes", type=parse_size, default=None,
                   help="bytes moved per direction and size (default 512M on GPU, 64M on CPU)")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--pages", type=int, default=10_000, help="kvcm: scattered pages per migrate call (default 10000)")
    p.add_argument("--overhead", action="store_true",
                   help="kvcm: the manager's own host CPU per page only (64-byte pieces, 100000 resident pages; "
                        "--device defaults to cpu); exits 1 when it misses its 0.1 us/page target")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    wl = p.add_argument_group("workload", "options of `kvcodec bench workload`")
    wl.add_argument("--sessions", type=int, default=64, help="sessions (default 64)")
    wl.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    wl.add_argument("--prefix-pages", type=int, default=32, help="pages of each shared prefix (default 32)")
    wl.add_argument("--prefixes", type=int, default=4, help="distinct shared prefixes (default 4)")
    wl.add_argument("--new-pages", type=int, default=4, help="new pages per turn (default 4)")
    wl.add_argument("--piece-bytes", type=parse_size, default=4 * 1024, help="bytes of each K and V buffer (default 4K)")
    wl.add_argument("--disk-dir", default=None, help="also give both runs a disk tier in a temp dir under this path")
    disk = p.add_argument_group("disk", "options of `kvcodec bench disk`")
    disk.add_argument("--dir", default=None, help="directory on the file system to measure (default: temp dir)")
    disk.add_argument("--slot-bytes", type=parse_size, default=64 * 1024, help="page size (default 64K)")
    disk.add_argument("--io-threads", type=int, default=32, help="store I/O threads (default 32, as a disk tier)")
    disk.add_argument("--depth", type=int, default=256, help="pages in flight (default 256)")
    disk.add_argument("--recovery-slots", type=int, default=1 << 20, help="slots of the recovery test (default 1M)")


def run(args: argparse.Namespace) -> int:
    if args.codec == "kvcm":
        from ..bench import kvcm

        if args.overhead:
            report = kvcm.run_overhead(device="cpu" if args.device == "auto" else args.device, pools=args.pools,
                                       pages=args.pages, iters=max(args.iters, 15), progress=not args.quiet)
            print(kvcm.format_table(report))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(report.to_json(), f, indent=2)
            return 0 if kvcm.overhead_ok(report) else 1
        sizes = args.sizes or list(kvcm.DEFAULT_SIZES)
        kw = {"max_bytes": args.bytes} if args.bytes else {}
        report = kvcm.run(device=args.device, pools=args.pools, sizes=sizes, pages=args.pages, iters=args.iters,
                          progress=not args.quiet, **kw)
        print(kvcm.format_table(report))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.to_json(), f, indent=2)
        return 0
    if args.codec == "workload":
        return _run_workload(args)
    if args.sizes is None:
        from ..bench.concat import DEFAULT_SIZES

        args.sizes = list(DEFAULT_SIZES)
    if args.codec == "disk":
        return _run_disk(args)
    if args.codec != "concat":
        print(f"kvcodec bench: no benchmark for {args.codec!r}; available: concat, kvcm, workload, disk", file=sys.stderr)
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


def _run_disk(args: argparse.Namespace) -> int:
    from ..bench import disk

    report = disk.run(directory=args.dir, slot_bytes=args.slot_bytes, total_bytes=args.bytes or 512 * 1024 * 1024,
                      io_threads=args.io_threads, depth=args.depth, recovery_slots=args.recovery_slots,
                      progress=not args.quiet)
    print(disk.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _run_workload(args: argparse.Namespace) -> int:
    from ..bench import workload

    w = workload.Workload(sessions=args.sessions, turns=args.turns, prefixes=args.prefixes,
                          prefix_pages=args.prefix_pages, new_pages=args.new_pages, piece_bytes=args.piece_bytes)
    report = workload.run(device=args.device, workload=w, disk_dir=args.disk_dir, progress=not args.quiet)
    print(workload.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
