"""The ``kvcodec`` command line. Subcommands live in ``kvcodec_sdk.commands``.

Exit status, for every subcommand:

====  ==========================================================================================
0     done (a benchmark that ran reports missed targets without failing, unless ``--strict``)
1     the work failed: a conformance clause, a check, a codec call, an I/O error, a missed
      target with ``--strict``
2     usage: a bad option value, an unknown codec or key, malformed JSON; one line names the
      option, the value and what is valid
====  ==========================================================================================
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from .version import __version__

_UNITS = {"": 1, "B": 1, "K": 1024, "KIB": 1024, "M": 1024**2, "MIB": 1024**2, "G": 1024**3, "GIB": 1024**3}


#: The largest size an option takes (1 TiB): larger values are typos, not benchmarks.
MAX_SIZE = 1 << 40


def parse_size(text: str) -> int:
    """'4K', '16KiB', '1M', '4096' -> bytes (1 B .. 1 TiB)."""
    t = text.strip().upper()
    digits = t.rstrip("KMGIB")
    unit = t[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a size; use bytes or a K/M/G suffix, e.g. 4K, 1M")
    value = int(digits) * _UNITS[unit]
    if not 1 <= value <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {text!r} is {value} bytes; valid sizes are 1 B to 1T")
    return value


def count(minimum: int = 1, maximum: int = 1 << 31):
    """An argparse type: an integer in [minimum, maximum], with a message naming the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range; valid values are {minimum}..{maximum}")
        return value

    parse.__name__ = "count"
    return parse


def seconds(text: str) -> float:
    """An argparse type: a positive finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number of seconds")
    return value


class CliParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr (the command, the problem and
    where to read more), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .commands import COMMANDS

    parser = CliParser(prog="kvcodec", description="KV-cache cold-page codec tools")
    parser.add_argument("--version", action="version", version=f"kvcodec_sdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name}", __package__)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        # Named after the (sub)command that got them, e.g. an option of another benchmark.
        prog = " ".join(["kvcodec", args.command, *([args.benchmark] if getattr(args, "benchmark", None) else [])])
        print(f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`kvcodec list | head`): stop quietly, as other command-line tools do.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        except OSError:
            pass
        return 1
    except (ValueError, RuntimeError, LookupError, OSError, MemoryError) as exc:
        print(f"kvcodec {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
