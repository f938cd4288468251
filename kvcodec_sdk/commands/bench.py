"""``kvcodec bench``: codec throughput against the physical ceiling and a baseline."""

from __future__ import annotations

import argparse
import json
import sys

from ..cli import count, parse_size

DEFAULT_CODEC_PAGES = "2048 on a GPU, 64 on the CPU backend"

NAME = "bench"
HELP = "benchmark a codec against the copy ceiling and a baseline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codec", help="what to benchmark: concat (the codec), kvcm (the KV-cache manager; with --codec NAME any "
                        "registered codec through it and bare), workload (the manager under a prefix-reuse engine "
                        "workload) or disk (the disk tier)")
    p.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--pools", type=count(1, 64), default=3, help="hot pools per page (default 3)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",")],
                   default=None, help="piece sizes, comma-separated (default 4K,16K,64K,256K,1M)")
    p.add_argument("--bytes", type=parse_size, default=None,
                   help="bytes moved per direction and size (default 512M on GPU, 64M on CPU)")
    p.add_argument("--iters", type=count(1, 10_000), default=None,
                   help="timed repetitions (median reported; default 5, kvcm --codec on the CPU backend 3)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--pages", type=count(1, 10_000_000), default=None,
                   help=f"kvcm: scattered pages per migrate call (default 10000; with --codec {DEFAULT_CODEC_PAGES})")
    p.add_argument("--overhead", action="store_true",
                   help="kvcm: the manager's own host CPU per page only (64-byte pieces, 100000 resident pages; "
                        "--device defaults to cpu); exits 1 when it misses its 0.1 us/page target")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    kc = p.add_argument_group("kvcm --codec", "options of `kvcodec bench kvcm --codec NAME`: a registered codec "
                              "through the manager and bare, against concat through the manager. Exit status 0 when "
                              "it ran (missed targets are reported), 1 when a check or call failed (or, with --strict, "
                              "a target was missed), 2 for an unknown codec or bad --params")
    kc.add_argument("--codec", dest="codec_name", metavar="NAME", default=None,
                    help="kvcm: run this registered codec (plugins included), or 'all' for every codec that can run "
                         "on the device")
    kc.add_argument("--params", default=None, metavar="JSON", help="kvcm --codec: codec parameters as a JSON object")
    kc.add_argument("--strict", action="store_true", help="kvcm --codec: exit 1 when a target is missed")
    kc.add_argument("--layers", type=count(1, 1024), default=6, help="kvcm --codec: layers per page, each a K and a V buffer "
                                                          "(default 6)")
    kc.add_argument("--tokens", type=count(1, 1 << 20), default=16, help="kvcm --codec: tokens per page (default 16)")
    kc.add_argument("--heads", type=count(1, 4096), default=12, help="kvcm --codec: KV heads (default 12)")
    kc.add_argument("--head-dim", type=count(1, 1 << 16), default=128, help="kvcm --codec: head dim (default 128; bf16: "
                                                              "576 KiB pages by default)")
    wl = p.add_argument_group("workload", "options of `kvcodec bench workload`")
    wl.add_argument("--sessions", type=count(1, 1_000_000), default=64, help="sessions (default 64)")
    wl.add_argument("--turns", type=count(1, 100_000), default=4, help="turns per session (default 4)")
    wl.add_argument("--prefix-pages", type=count(1, 1_000_000), default=32, help="pages of each shared prefix (default 32)")
    wl.add_argument("--prefixes", type=count(1, 1_000_000), default=4, help="distinct shared prefixes (default 4)")
    wl.add_argument("--new-pages", type=count(1, 1_000_000), default=4, help="new pages per turn (default 4)")
    wl.add_argument("--piece-bytes", type=parse_size, default=4 * 1024, help="bytes of each K and V buffer (default 4K)")
    wl.add_argument("--disk-dir", default=None, help="also give both runs a disk tier in a temp dir under this path")
    disk = p.add_argument_group("disk", "options of `kvcodec bench disk`")
    disk.add_argument("--dir", default=None, help="directory on the file system to measure (default: temp dir)")
    disk.add_argument("--slot-bytes", type=parse_size, default=64 * 1024, help="page size (default 64K)")
    disk.add_argument("--io-threads", type=count(1, 4096), default=32, help="store I/O threads (default 32, as a disk tier)")
    disk.add_argument("--depth", type=count(1, 1 << 20), default=256, help="pages in flight (default 256)")
    disk.add_argument("--recovery-slots", type=count(1, 1 << 30), default=1 << 20, help="slots of the recovery test (default 1M)")


def _usage_error(message: str) -> int:
    print(f"kvcodec bench: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    codec_mode = args.codec_name is not None
    if args.params is not None and not codec_mode:
        return _usage_error("--params needs --codec NAME (kvcodec bench kvcm --codec NAME --params JSON)")
    if codec_mode and args.codec != "kvcm":
        return _usage_error(f"--codec is an option of `kvcodec bench kvcm`, not of `kvcodec bench {args.codec}`")
    if args.codec == "kvcm" and codec_mode:
        if args.overhead:
            return _usage_error("--overhead measures concat only; leave out --codec")
        return _run_kvcm_codecs(args)
    pages = 10_000 if args.pages is None else args.pages
    args.iters = 5 if args.iters is None else args.iters
    if args.codec == "kvcm":
        from ..bench import kvcm

        if args.overhead:
            report = kvcm.run_overhead(device="cpu" if args.device == "auto" else args.device, pools=args.pools,
                                       pages=pages, iters=max(args.iters, 15), progress=not args.quiet)
            print(kvcm.format_table(report))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(report.to_json(), f, indent=2)
            return 0 if kvcm.overhead_ok(report) else 1
        sizes = args.sizes or list(kvcm.DEFAULT_SIZES)
        kw = {"max_bytes": args.bytes} if args.bytes else {}
        report = kvcm.run(device=args.device, pools=args.pools, sizes=sizes, pages=pages, iters=args.iters,
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


def _run_kvcm_codecs(args: argparse.Namespace) -> int:
    """``kvcodec bench kvcm --codec NAME``. Exit status: 0 when it ran (missed targets are reported),
    1 when a codec failed its checks or a call, or a target is missed under --strict, 2 for a
    usage error (an unknown codec, parameters that are not a JSON object or that the codec's
    schema rejects)."""
    from ..bench import kvcm_codecs
    from ..errors import CodecParamError, UnknownCodecError

    params = None
    if args.codec_name == "all" and args.params is not None:
        return _usage_error("--params applies to one codec; name it with --codec instead of 'all'")
    if args.params is not None:
        try:
            params = json.loads(args.params)
        except json.JSONDecodeError as exc:
            return _usage_error(f"--params is not valid JSON ({exc.msg} at character {exc.pos}): {args.params!r}; "
                                "pass an object, e.g. '{\"data_type\": \"uint16\"}'")
        if not isinstance(params, dict):
            return _usage_error(f"--params must be a JSON object of parameter names to values, got "
                                f"{type(params).__name__}: {args.params!r}")
    try:
        layout = kvcm_codecs.Layout(args.layers, args.tokens, args.heads, args.head_dim)
    except ValueError as exc:
        return _usage_error(str(exc))
    try:
        report = kvcm_codecs.run_codecs(args.codec_name, params, device=args.device, pages=args.pages,
                                        iters=args.iters, layout=layout, progress=not args.quiet)
    except (UnknownCodecError, CodecParamError) as exc:
        return _usage_error(str(exc))
    print(kvcm_codecs.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    if report.failed:
        return 1
    return 1 if args.strict and kvcm_codecs.misses(report) else 0


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
