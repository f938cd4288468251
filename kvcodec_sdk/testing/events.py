"""A pytest plugin that writes every conformance test's outcome as it happens (``kvcodec check``).

``kvcodec check`` runs the suite in a child process with ``-p kvcodec_sdk.testing.events
--kvcodec-events PATH``: each test's start and each phase's report go to ``PATH`` as JSON lines,
flushed at once, so a test that kills the process (a codec that throws through ``noexcept``,
crashes, or is ended by the timeout watchdog) is known, and the parent reports it under its
clause and runs the remaining tests in a fresh process. With ``--kvcodec-progress`` each test's
start and outcome are also printed on stderr.
"""

from __future__ import annotations

import json
import sys

import pytest

from .clauses import clause_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcodec")
    group.addoption("--kvcodec-events", default=None, metavar="PATH", dest="kvcodec_events",
                    help="append each conformance test's start and outcome to PATH as JSON lines")
    group.addoption("--kvcodec-progress", action="store_true", default=False, dest="kvcodec_progress",
                    help="print each conformance test's start and outcome on stderr")


class _Writer:
    def __init__(self, path: str | None, progress: bool, codec: str):
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - closed at unconfigure
        self.progress = progress
        self.codec = codec

    def write(self, event: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(event) + "\n")
            self.file.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        self.write({"event": "collected", "nodeids": [i.nodeid for i in items if clause_of(i) is not None],
                    "clauses": {i.nodeid: clause_of(i) for i in items if clause_of(i) is not None}})

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.write({"event": "start", "nodeid": nodeid})
        if self.progress:
            print(f"[check] {nodeid.rsplit('::', 1)[-1]} ...", file=sys.stderr, flush=True)

    def pytest_runtest_logreport(self, report) -> None:
        props = dict(report.user_properties)
        clause = props.get("kvcodec_clause")
        if clause is None:
            return
        message = ""
        if report.failed:
            message = failure_text(report)
        elif report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
        self.write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                    "clause": clause, "violated": props.get("kvcodec_violated"), "message": message,
                    "duration": report.duration})
        if self.progress and (report.when == "call" or report.outcome != "passed"):
            print(f"[check]   {clause} [{param_label(report.nodeid, self.codec)}] {report.when}: "
                  f"{report.outcome} ({report.duration:.2f} s)", file=sys.stderr, flush=True)

    def pytest_unconfigure(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("kvcodec_events")
    progress = config.getoption("kvcodec_progress")
    if path or progress:
        from .plugin import selected_codecs

        chosen = config.getoption("kvcodec") or []
        codec = selected_codecs(config)[0][0] if chosen else ""
        config.pluginmanager.register(_Writer(path, progress, codec), "kvcodec-events-writer")


def failure_text(report) -> str:
    """The first line of a failure, without the exception's module path or the clause name."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    text = text.split("\n")[0]
    prefix = "kvcodec_sdk.testing.clauses.ClauseViolation: "
    if text.startswith(prefix):
        text = text[len(prefix):].split(": ", 1)[-1]
    return text


def param_label(nodeid: str, codec: str) -> str:
    """The device and layout of a test id, e.g. ``cpu-mixed`` (the codec's own id part dropped)."""
    label = nodeid[nodeid.index("[") + 1 : -1] if "[" in nodeid else ""
    parts = label.split("-")
    if parts and codec and parts[0].startswith(codec):
        parts = parts[1:]
    return "-".join(parts)
