"""The ``kvcodec`` command line. Subcommands live in ``kvcodec_sdk.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
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


def build_parser() -> argparse.ArgumentParser:
    from .commands import COMMANDS

    parser = argparse.ArgumentParser(prog="kvcodec", description="KV-cache cold-page codec tools")
    parser.add_argument("--version", action="version", version=f"kvcodec_sdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name}", __package__)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError, LookupError, OSError) as exc:
        print(f"kvcodec {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
