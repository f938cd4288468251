"""Helpers shared by the benchmarks: size units, size labels and progress lines."""

from __future__ import annotations

import sys

KiB = 1024
MiB = 1024 * KiB


def fmt_size(n: int) -> str:
    """'4 KiB', '1 MiB' or '100 B'."""
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n // KiB} KiB" if n % KiB == 0 else f"{n} B"


def log(progress: bool, msg: str) -> None:
    """A progress line on stderr (the table and JSON go to stdout)."""
    if progress:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)
