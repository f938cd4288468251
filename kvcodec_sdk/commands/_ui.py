"""Terminal output of the ``kvcodec`` command line.

On a terminal, reports are tables drawn with ``rich`` and runs longer than a second show a
progress bar on stderr. Otherwise the output is the plain text that tests and scripts parse:

* stdout is plain when it is not a terminal, with ``--json``, or with ``TERM=dumb``;
* progress is ``[bench] ...`` / ``[check] ...`` lines on stderr when stderr is not a terminal,
  with ``NO_COLOR`` set (a live bar redraws with escape codes) or with ``TERM=dumb``;
* with ``NO_COLOR`` set, terminal tables carry no colour or other escape codes.

``rich`` is imported only when something is drawn, so plain output never needs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Any, Iterator

#: Seconds a run takes before its progress bar appears (shorter runs show none).
PROGRESS_DELAY_S = 1.0

_GOOD = re.compile(r"\b(meets|ok|PASS)\b")
_BAD = re.compile(r"\b(misses|FAILED|FAIL|below target|above target)\b")
_SOSO = re.compile(r"\b(skipped|SKIP|n/a|not judged)\b")


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def no_color() -> bool:
    """NO_COLOR (https://no-color.org): set and not empty."""
    return bool(os.environ.get("NO_COLOR"))


def _dumb() -> bool:
    return os.environ.get("TERM") == "dumb"


def rich_stdout(json_mode: bool = False) -> bool:
    """Whether reports on stdout are drawn as terminal tables."""
    return not json_mode and not _dumb() and _tty(sys.stdout)


def live_stderr() -> bool:
    """Whether progress on stderr is a live bar (else plain lines)."""
    return not no_color() and not _dumb() and _tty(sys.stderr)


def console(stderr: bool = False):
    """A rich console on stdout or stderr; with NO_COLOR no escape codes at all."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, color_system=None if no_color() else "auto")


def styled(line: str):
    """A report line with its verdict words coloured (meets/ok green, misses/FAIL red, skips yellow)."""
    from rich.text import Text

    text = Text(line)
    text.highlight_regex(_GOOD, "green")
    text.highlight_regex(_BAD, "bold red")
    text.highlight_regex(_SOSO, "yellow")
    return text


def rich_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None,
               clip: dict[int, int] | None = None):
    """A rich table with bold headers (none when every header is empty); columns in ``right`` are
    right-justified, columns in ``clip`` (index -> width) are cut to one line of that width."""
    from rich import box
    from rich.table import Table as RichTable

    t = RichTable(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False,
                  show_header=any(headers))
    for i, h in enumerate(headers):
        width = (clip or {}).get(i)
        t.add_column(h, justify="right" if right and i in right else "left", max_width=width,
                     no_wrap=width is not None or i == 0,  # the first column names the row: kept whole
                     overflow="ellipsis" if width is not None else "fold")
    for r in rows:
        t.add_row(*(styled(str(c)) for c in r))
    return t


def print_report(table: Any, *, json_mode: bool = False) -> None:
    """Prints a benchmark :class:`~kvcodec_sdk.bench._common.Table`: plain text, or on a terminal
    the title, a drawn table and the notes with their verdicts coloured."""
    if not rich_stdout(json_mode):
        print(table.plain())
        return
    out = console()
    for line in table.title:
        out.print(line, style="bold", markup=False)
    if table.rows or table.header_without_rows:
        right = {i for i, c in enumerate(table.columns) if c.align == ">"}
        out.print(rich_table([c.header for c in table.columns], table.rows, right))
    for line in table.notes:
        out.print(styled(line))


class LiveProgress:
    """A progress bar on stderr that appears once the run has taken :data:`PROGRESS_DELAY_S`
    and is erased when it ends. It takes the benchmarks' progress calls (``message``, ``total``,
    ``advance``) and child-process lines (``echo``)."""

    def __init__(self, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn(label, markup=False), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.description}", markup=False),
                                  console=console(stderr=True), transient=True)
        self._task = self._progress.add_task("", total=None)
        self._lock = threading.Lock()
        self._shown = self._closed = False
        self._timer = threading.Timer(PROGRESS_DELAY_S, self._show)
        self._timer.daemon = True

    def _show(self) -> None:
        with self._lock:
            if not self._closed:
                self._progress.start()
                self._shown = True

    def __enter__(self) -> "LiveProgress":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._shown:
                self._progress.stop()

    def message(self, text: str) -> None:
        self._progress.update(self._task, description=text.strip())

    def total(self, steps: int) -> None:
        self._progress.update(self._task, total=steps, completed=0)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def set(self, completed: int, total: int | None) -> None:
        """Steps done out of ``total`` (None while unknown)."""
        self._progress.update(self._task, completed=completed, total=total)

    def echo(self, line: str) -> None:
        """A line of other output on stderr, printed above the bar."""
        with self._lock:
            if self._shown:
                self._progress.console.print(line.rstrip("\n"), markup=False, highlight=False)
                return
        sys.stderr.write(line if line.endswith("\n") else line + "\n")
        sys.stderr.flush()


@contextlib.contextmanager
def bench_progress(enabled: bool, label: str) -> Iterator[None]:
    """Routes the benchmarks' progress to a live bar while the block runs, when ``enabled`` and
    stderr is a terminal; otherwise they print ``[bench]`` lines (or nothing when not enabled)."""
    if not (enabled and live_stderr()):
        yield
        return
    from ..bench import _common

    with LiveProgress(label) as bar:
        before, _common.sink = _common.sink, bar
        try:
            yield
        finally:
            _common.sink = before
