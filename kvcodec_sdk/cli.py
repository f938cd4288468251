"""The ``kvcodec`` command line: list codecs, benchmark them."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Sequence

from .version import __version__

_UNITS = {"": 1, "B": 1, "K": 1024, "KIB": 1024, "M": 1024**2, "MIB": 1024**2, "G": 1024**3, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """'4K', '16KiB', '1M', '4096' -> bytes."""
    t = text.strip().upper()
    digits = t.rstrip("KMGIB")
    unit = t[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a size; use bytes or a K/M/G suffix, e.g. 4K, 1M")
    return int(digits) * _UNITS[unit]


def _cmd_list(args: argparse.Namespace) -> int:
    from .registry import default_registry

    registry = default_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # broken plugins are listed below instead
        specs = registry.list_codecs()
        broken = registry.broken_plugins
    if args.json:
        print(json.dumps({"codecs": [s.to_json() for s in specs], "broken_plugins": broken}, indent=2))
        return 0
    rows = [("NAME", "VERSION", "FORMAT", "LOSSLESS / ERROR BOUND", "DEVICES", "DESCRIPTION")]
    for s in specs:
        rows.append((s.name, s.version, str(s.format_version), "lossless" if s.lossless else str(s.error_bound),
                     ",".join(s.devices), s.description))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5])
    for name, reason in broken.items():
        print(f"warning: plugin {name!r} failed to load: {reason}", file=sys.stderr)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.codec != "concat":
        print(f"kvcodec bench: no benchmark for codec {args.codec!r}; available: concat", file=sys.stderr)
        return 2
    from .bench import concat

    report = concat.run(device=args.device, pools=args.pools, sizes=args.sizes, total_bytes=args.bytes,
                        iters=args.iters, progress=not args.quiet)
    print(concat.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcodec", description="KV-cache cold-page codec tools")
    parser.add_argument("--version", action="version", version=f"kvcodec_sdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list registered codecs")
    p.add_argument("--json", action="store_true", help="machine-readable output with parameter schemas")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("bench", help="benchmark a codec against the copy ceiling and a baseline")
    p.add_argument("codec", help="codec to benchmark (concat)")
    p.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument("--pools", type=int, default=3, help="hot pools per page (default 3)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",")],
                   default=None, help="piece sizes, comma-separated (default 4K,16K,64K,256K,1M)")
    p.add_argument("--bytes", type=parse_size, default=None,
                   help="bytes moved per direction and size (default 512M on GPU, 64M on CPU)")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "sizes", 0) is None:
        from .bench.concat import DEFAULT_SIZES

        args.sizes = list(DEFAULT_SIZES)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError, LookupError) as exc:
        print(f"kvcodec {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
