"""``kvcodec check``: runs the conformance suite on one codec and reports every contract clause.

One line per clause: ``PASS``, ``FAIL`` with what the codec did, or ``SKIP`` with why (e.g. a
CUDA clause on a machine without a GPU). The exit status is 1 when any clause fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

NAME = "check"
HELP = "run the conformance suite on a codec and report each contract clause"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codec", help="registered codec name (kvcodec list)")
    p.add_argument("--params", default=None, metavar="JSON", help="codec parameters as a JSON object")
    p.add_argument("--device", default="all", choices=("cpu", "cuda", "all"),
                   help="implementations to check: cpu, cuda or all available (default)")
    p.add_argument("--golden", default=None, metavar="DIR",
                   help="folder holding <codec>-v<format_version>/ golden vectors (the clause is skipped without it)")
    p.add_argument("--junit-xml", default=None, metavar="PATH", help="also write a JUnit XML report")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a test running longer than this dumps every thread's stack and ends the check (default 300)")
    p.add_argument("--quiet", action="store_true", help="no per-test progress on stderr")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output and full tracebacks")


class _Collector:
    """Gathers each conformance test's outcome by clause and reports progress on stderr."""

    def __init__(self, codec: str = "", progress: bool = False) -> None:
        self.tests: dict[str, dict] = {}
        self.codec = codec
        self.progress = progress

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        if self.progress:
            print(f"[check] {nodeid.rsplit('::', 1)[-1]} ...", file=sys.stderr, flush=True)

    def pytest_runtest_logreport(self, report) -> None:
        clause = dict(report.user_properties).get("kvcodec_clause")
        if clause is None:
            return
        if self.progress and (report.when == "call" or report.outcome != "passed"):
            print(f"[check]   {clause} [{_param_label(report.nodeid, self.codec)}] {report.when}: "
                  f"{report.outcome} ({report.duration:.2f} s)", file=sys.stderr, flush=True)
        entry = self.tests.setdefault(report.nodeid, {"clause": clause, "outcome": "passed", "message": ""})
        if report.failed and entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            entry["message"] = _failure_text(report)
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = str(report.longrepr[2]).removeprefix("Skipped: ") if isinstance(report.longrepr, tuple) else ""


def _failure_text(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    text = text.split("\n")[0]
    prefix = "kvcodec_sdk.testing.clauses.ClauseViolation: "
    if text.startswith(prefix):
        text = text[len(prefix):].split(": ", 1)[-1]
    return text


def _param_label(nodeid: str, codec: str) -> str:
    """The device and layout of a test id, e.g. ``cpu-mixed`` (the codec's own id part dropped)."""
    label = nodeid[nodeid.index("[") + 1 : -1] if "[" in nodeid else ""
    parts = label.split("-")
    if parts and parts[0].startswith(codec):
        parts = parts[1:]
    return "-".join(parts)


def run(args: argparse.Namespace) -> int:
    import pytest

    from ..registry import get_codec_spec
    from ..testing.clauses import CLAUSES

    spec = get_codec_spec(args.codec)  # an unknown name fails here, listing the known ones
    params = {}
    if args.params:
        try:
            params = json.loads(args.params)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--params is not valid JSON: {exc}") from None
        if not isinstance(params, dict):
            raise ValueError(f"--params must be a JSON object, got {type(params).__name__}")
    spec.validate_params(params)
    selected = Path(__file__).resolve().parent.parent / "testing" / "selected.py"
    collector = _Collector(args.codec, progress=not args.quiet)
    with tempfile.TemporaryDirectory(prefix="kvcodec-check-") as tmp:
        # An empty ini of our own: the user's pytest configuration (testpaths, addopts) stays out.
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")
        argv = [str(selected), "-c", str(Path(tmp) / "pytest.ini"), "--rootdir", tmp, "-p", "no:cacheprovider",
                "--kvcodec", f"{args.codec}:{json.dumps(params)}", "--kvcodec-device", args.device,
                "-o", "junit_family=xunit1", "--kvcodec-timeout", str(args.timeout)]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            argv += ["-p", "kvcodec_sdk.testing.plugin"]
        if args.golden:
            argv += ["--kvcodec-golden", str(Path(args.golden).resolve())]
        if args.junit_xml:
            argv += [f"--junitxml={Path(args.junit_xml).resolve()}"]
        if args.verbose:
            code = pytest.main(argv + ["-v"], plugins=[collector])
        else:
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink):
                code = pytest.main(argv + ["-q", "--tb=no"], plugins=[collector])
            if not collector.tests:
                sys.stdout.write(sink.getvalue())
    if not collector.tests:
        print(f"kvcodec check: the suite collected no test (pytest exit code {int(code)})", file=sys.stderr)
        return 2
    print(_report(spec, args.device, params, collector.tests, CLAUSES))
    return 1 if any(t["outcome"] == "failed" for t in collector.tests.values()) else 0


def _report(spec, device: str, params: dict, tests: dict[str, dict], clauses: dict[str, str]) -> str:
    kind = "lossless" if spec.lossless else f"lossy: {spec.error_bound}"
    lines = [f"kvcodec check {spec.name} (format {spec.format_version}, {kind}) on {device} devices"
             + (f", params {json.dumps(params)}" if params else "")]
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for name in clauses:
        mine = [(nodeid, t) for nodeid, t in tests.items() if t["clause"] == name]
        failed = [(n, t) for n, t in mine if t["outcome"] == "failed"]
        passed = [(n, t) for n, t in mine if t["outcome"] == "passed"]
        if failed:
            nodeid, t = failed[0]
            more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
            status, text = "FAIL", f"{t['message']} [{_param_label(nodeid, spec.name)}]{more}"
        elif passed:
            status, text = "PASS", ""
        elif mine:
            # The most specific reason: a device-wide skip ("runs on the cuda device") comes last.
            reasons = sorted((t["message"] for _, t in mine), key=lambda m: "runs on the" in m)
            status, text = "SKIP", reasons[0]
        else:
            status, text = "SKIP", "no test collected"
        counts[status] += 1
        lines.append(f"{status}  {name}" + (f": {text}" if text else ""))
    lines.append(f"-- {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
                 f"({len(clauses)} clauses)")
    return "\n".join(lines)
