"""The ``kvcodec`` command line. Subcommands live in ``kvcodec_sdk.commands``.

Exit status, for every subcommand (also in ``kvcodec --help`` and docs/cli.md):

====  ==========================================================================================
0     done (a benchmark that ran reports missed targets without failing, unless ``--strict``)
1     the work failed: a conformance clause, a check, a codec call, an I/O error, a missed
      target with ``--strict`` or ``--overhead``, a requested GPU that is not there; or nothing
      ran (every clause skipped, the benchmarked codec skipped): the last line says why
2     usage: a bad option value, an unknown codec or key, malformed JSON, a missing folder;
      one line names the option, the value and what is valid
130   interrupted (Ctrl-C)
====  ==========================================================================================

Errors are one line on stderr, never a traceback; ``KVCODEC_TRACEBACK=1`` adds the traceback
of an unexpected error (for a bug report).
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


def device(text: str) -> str:
    """An argparse type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    t = text.strip().lower()
    if t in ("auto", "cpu", "cuda") or (t.startswith("cuda:") and t[5:].isdigit()):
        return t
    raise argparse.ArgumentTypeError(f"{text!r} is not a device; valid devices: auto, cpu, cuda, cuda:N (e.g. cuda:0)")


def folder(text: str) -> str:
    """An argparse type: an existing directory."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist" if not os.path.exists(text)
                                         else f"{text!r} is not a folder")
    return text


def output_file(text: str) -> str:
    """An argparse type: a file path whose folder exists and is writable (checked before any work)."""
    parent = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give the path of the file to write")
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {parent} is not writable")
    return text


EXIT_CODES = [
    (0, "done (a benchmark reports missed targets without failing, unless --strict)"),
    (1, "the work failed (a clause, a check, a codec call, I/O, a missed target with --strict or --overhead, "
        "a requested GPU that is not there) or nothing ran (every clause skipped, the codec skipped)"),
    (2, "usage: a bad option value, an unknown codec or key, malformed JSON, a missing folder"),
    (130, "interrupted"),
]


def _epilog() -> str:
    rows = "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES)
    return (f"exit status:\n{rows}\n\nOn a terminal reports are tables and long runs show a progress bar on stderr; "
            "piped, with --json or with TERM=dumb the output is plain text, and with NO_COLOR set it has no colour. "
            "Errors are one line on stderr. See docs/cli.md.")


def _one_line(exc: BaseException) -> str:
    """An exception as one line: an OSError without its errno, others as their message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror[0].lower()}{exc.strerror[1:]}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


class CliParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr (the command, the problem and
    where to read more), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .commands import COMMANDS

    parser = CliParser(prog="kvcodec", description="KV-cache cold-page codec tools", epilog=_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
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
    except KeyboardInterrupt:
        print(f"kvcodec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`kvcodec list | head`): stop quietly, as other command-line tools do.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        except OSError:
            pass
        return 1
    except (ValueError, RuntimeError, LookupError, OSError, MemoryError) as exc:
        print(f"kvcodec {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug or a broken plugin: still one line, the traceback on request
        if os.environ.get("KVCODEC_TRACEBACK"):
            import traceback

            traceback.print_exc()
        print(f"kvcodec {args.command}: error: {type(exc).__name__}: {_one_line(exc)} (an unexpected error; set "
              "KVCODEC_TRACEBACK=1 for the traceback and report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
