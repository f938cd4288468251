"""``kvcodec check``: runs the conformance suite on one codec and reports every contract clause.

One line per clause: ``PASS``, ``FAIL`` with what the codec did, or ``SKIP`` with why (e.g. a
CUDA clause on a machine without a GPU). A failure is listed under the clause it breaks, whichever
test found it. The suite runs in a child process: a test that kills it (a codec that throws
through ``noexcept`` or crashes, a test past ``--timeout``) fails its clause and the remaining
tests run in a new process. The exit status is 1 when any clause fails or when no clause ran
(every test skipped; the reason is printed), 2 for a bad option (a device the codec does not
ship, a ``--junit-xml`` path whose folder cannot be created).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ..cli import folder, seconds
from . import _ui

NAME = "check"
#: Tests that may end their process before the check stops running the rest.
MAX_DEATHS = 5
HELP = "run the conformance suite on a codec and report each contract clause"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codec", help="registered codec name (kvcodec list)")
    p.add_argument("--params", default=None, metavar="JSON", help="codec parameters as a JSON object")
    p.add_argument("--device", default="all", choices=("cpu", "cuda", "all"),
                   help="implementations to check: cpu, cuda or all available (default)")
    p.add_argument("--golden", type=folder, default=None, metavar="DIR",
                   help="folder holding <codec>-v<format_version>/ golden vectors (default: the vectors the codec "
                        "ships, declared next to its spec; the clause is skipped when it ships none)")
    p.add_argument("--junit-xml", default=None, metavar="PATH",
                   help="also write a JUnit XML report (its folder is created)")
    p.add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="a test running longer than this dumps every thread's stack and fails its clause (default 300)")
    p.add_argument("--quiet", action="store_true", help="no per-test progress on stderr")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object (clauses with status, message and where)")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output and full tracebacks")


def _fail_usage(message: str) -> int:
    print(f"kvcodec check: error: {message}", file=sys.stderr)
    return 2


def _junit_target(text: str) -> Path:
    """The --junit-xml path, its folder created; raises ValueError saying why it cannot be."""
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"--junit-xml {text}: is a folder; give the path of the report file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--junit-xml {text}: cannot create the folder {path.parent} "
                         f"({exc.strerror or exc})") from None
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"--junit-xml {text}: the folder {path.parent} is not writable")
    return path


class _Run:
    """The outcome of every conformance test, gathered from the event files of one or more
    child processes (a test that kills its process is recorded, and the rest run in a new one)."""

    def __init__(self, codec: str):
        self.codec = codec
        self.tests: dict[str, dict] = {}
        self.clauses: dict[str, str] = {}  # nodeid -> the clause its test checks
        self.collected: list[str] = []
        self.finished: set[str] = set()

    def read(self, path: Path) -> str | None:
        """Takes one child's events; returns the test that was running when it ended, if any."""
        from ..testing.events import param_label

        running = None
        if not path.is_file():
            return None
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the process dying
                continue
            if e["event"] == "collected":
                if not self.collected:
                    self.collected = list(e["nodeids"])
                self.clauses.update(e["clauses"])
            elif e["event"] == "start":
                running = e["nodeid"]
            elif e["event"] == "report":
                nodeid, own = e["nodeid"], e["clause"]
                entry = self.tests.setdefault(nodeid, {"clause": own, "own": own, "outcome": "passed", "message": ""})
                if e["outcome"] == "failed" and entry["outcome"] != "failed":
                    violated = e.get("violated")
                    if violated and violated != own:
                        # Reported under the clause it breaks; the test's own clause is unfinished.
                        entry.update(clause=violated)
                        self.tests[nodeid + "::own-clause"] = {
                            "clause": own, "outcome": "interrupted",
                            "message": f"not fully checked: the test stopped at a {violated} violation "
                                       f"[{param_label(nodeid, self.codec)}]"}
                    entry.update(outcome="failed", message=e["message"])
                elif e["outcome"] == "skipped" and entry["outcome"] == "passed":
                    entry.update(outcome="skipped", message=e["message"])
                if e["when"] == "teardown":
                    self.finished.add(nodeid)
                    running = None
        return running

    def died(self, nodeid: str, how: str) -> None:
        own = self.clauses.get(nodeid, "")
        entry = self.tests.setdefault(nodeid, {"clause": own, "outcome": "passed", "message": ""})
        entry.update(outcome="failed", message=f"the test process died while this test ran ({how}): a codec method "
                                               "threw through noexcept, crashed, or ran past --timeout (stack dump "
                                               "above)" + (f"; before that: {entry['message']}" if entry["message"] else ""))
        self.finished.add(nodeid)


def _how(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def run(args: argparse.Namespace) -> int:
    from ..errors import CodecParamError, UnknownCodecError
    from ..registry import get_codec_spec
    from ..testing.clauses import CLAUSES

    try:
        spec = get_codec_spec(args.codec)  # an unknown name fails here, listing the known ones
    except UnknownCodecError as exc:
        return _fail_usage(str(exc))
    params = {}
    if args.params:
        try:
            params = json.loads(args.params)
        except json.JSONDecodeError as exc:
            return _fail_usage(f"--params is not valid JSON: {exc}; pass an object, e.g. '{{\"path\": \"sm\"}}'")
        if not isinstance(params, dict):
            return _fail_usage(f"--params must be a JSON object, got {type(params).__name__}: {args.params!r}")
    try:
        spec.validate_params(params)
    except CodecParamError as exc:
        return _fail_usage(str(exc))
    if args.device != "all" and args.device not in spec.devices:
        return _fail_usage(f"--device {args.device}: codec {spec.name!r} has no {args.device} implementation; it ships "
                           f"{', '.join(spec.devices) or 'none'} (use --device all or one of those)")
    junit = None
    if args.junit_xml:
        try:
            junit = _junit_target(args.junit_xml)
        except ValueError as exc:
            return _fail_usage(str(exc))
    selected = Path(__file__).resolve().parent.parent / "testing" / "selected.py"
    state = _Run(args.codec)
    junit_parts: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="kvcodec-check-") as tmp:
        # An empty ini of our own: the user's pytest configuration (testpaths, addopts) stays out.
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")
        base = [sys.executable, "-m", "pytest", str(selected), "-c", str(Path(tmp) / "pytest.ini"), "--rootdir", tmp,
                "-p", "no:cacheprovider", "-p", "kvcodec_sdk.testing.events",
                "--kvcodec", f"{args.codec}:{json.dumps(params)}", "--kvcodec-device", args.device,
                "-o", "junit_family=xunit1", "--kvcodec-timeout", str(args.timeout)]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            base += ["-p", "kvcodec_sdk.testing.plugin"]
        if args.golden:
            base += ["--kvcodec-golden", str(Path(args.golden).resolve())]
        # On a terminal a progress bar follows the events file; elsewhere the child prints a line
        # per test ([check] ...). --verbose shows pytest's own output instead of a bar.
        live = _ui.LiveProgress(f"kvcodec check {args.codec}") if (
            not args.quiet and not args.verbose and _ui.live_stderr()) else None
        if not args.quiet and live is None:
            base += ["--kvcodec-progress"]
        base += ["-v"] if args.verbose else ["-q", "--tb=no"]
        deselect: list[str] = []
        with live if live is not None else contextlib.nullcontext():
            text, code = _attempts(args, base, tmp, state, junit, junit_parts, deselect, live)
        if not state.tests:
            if not args.verbose:
                sys.stdout.write(text)
            print(f"kvcodec check: nothing ran: the suite collected no test (pytest exit code {code})", file=sys.stderr)
            return 1
        if junit is not None:
            _merge_junit(junit_parts, junit, state)
    if args.json:
        print(_report_json(spec, args.device, params, state.tests, CLAUSES))
    elif _ui.rich_stdout():
        _print_rich(spec, args.device, params, state.tests, CLAUSES)
    else:
        print(_report(spec, args.device, params, state.tests, CLAUSES))
    if junit is not None and not junit.is_file():
        print(f"kvcodec check: error: the JUnit XML report was not written to {junit}", file=sys.stderr)
        return 1
    if any(t["outcome"] == "failed" for t in state.tests.values()):
        return 1
    if not any(t["outcome"] == "passed" for t in state.tests.values()):
        print(f"kvcodec check: no clause ran: {_why_nothing_ran(state.tests)}", file=sys.stderr)
        return 1
    return 0


def _attempts(args: argparse.Namespace, base: list[str], tmp: str, state: "_Run", junit: Path | None,
              junit_parts: list[Path], deselect: list[str], live) -> tuple[str, int]:
    """Runs the suite in child processes until every test has run (a test that ends its process
    is recorded and the rest run in a new one). Returns the last child's stdout and exit code."""
    import subprocess

    text, code = "", 0
    for attempt in range(MAX_DEATHS):
        events = Path(tmp) / f"events-{attempt}.jsonl"
        argv = base + ["--kvcodec-events", str(events)] + [f"--deselect={n}" for n in deselect]
        if junit is not None:
            junit_parts.append(Path(tmp) / f"junit-{attempt}.xml")
            argv.append(f"--junitxml={junit_parts[-1]}")
        out = None if args.verbose else open(Path(tmp) / f"stdout-{attempt}.txt", "w+")  # noqa: SIM115
        try:
            if live is None:
                code = subprocess.run(argv, stdout=out, stderr=None, check=False).returncode
            else:
                code = _watched(argv, out, events, len(state.finished), live)
            if out is not None:
                out.seek(0)
                text = out.read()
        finally:
            if out is not None:
                out.close()
        running = state.read(events)
        if running is None:
            break
        state.died(running, _how(code))
        deselect = sorted(state.finished)
        left = [n for n in state.collected if n not in state.finished]
        if not left:
            break
        if attempt + 1 >= MAX_DEATHS:  # e.g. a device that hangs every test: stop, say so
            for nodeid in left:
                state.tests[nodeid] = {"clause": state.clauses.get(nodeid, ""), "outcome": "interrupted",
                                       "message": f"not run: the check stopped after {MAX_DEATHS} tests ended "
                                                  "their process"}
            break
    return text, code


def _watched(argv: list[str], out, events: Path, done_before: int, live) -> int:
    """Runs one child with a progress bar that follows its events file; the child's stderr
    (a stack dump, a warning) is printed above the bar. Returns the child's exit code."""
    import subprocess
    import threading
    import time

    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True, errors="replace")

    def forward() -> None:
        for line in proc.stderr:
            live.echo(line)

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    total, offset, done, current = None, 0, done_before, ""
    while True:
        finished = proc.poll() is not None
        try:
            with open(events, encoding="utf-8") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = ""
        complete = chunk[: chunk.rfind("\n") + 1]  # whole lines only; the rest is read next time
        offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e["event"] == "collected" and total is None:
                total = done_before + len(e["nodeids"])
            elif e["event"] == "start":
                current = e["nodeid"].rsplit("::", 1)[-1]
            elif e["event"] == "report" and e["when"] == "teardown":
                done += 1
        live.set(done, total)
        live.message(current)
        if finished:
            break
        time.sleep(0.2)
    reader.join(timeout=5)
    return proc.returncode


def _why_nothing_ran(tests: dict[str, dict]) -> str:
    reasons: dict[str, int] = {}
    for t in tests.values():
        if t["message"]:
            reasons[t["message"]] = reasons.get(t["message"], 0) + 1
    if not reasons:
        return "every test was skipped"
    # The most common reasons are the device-wide ones ("has no cpu implementation", "needs a
    # CUDA device"): one per device checked.
    common = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
    return "; ".join(text for text, n in common if n * 4 >= common[0][1])


def _merge_junit(parts: list[Path], target: Path, state: _Run) -> None:
    """One JUnit XML file from the reports of every child process, with a failed test case for
    each test that died with its process."""
    import xml.etree.ElementTree as ET

    root = suite = None
    seen: set[tuple[str, str]] = set()
    for part in parts:
        if not part.is_file():
            continue
        tree = ET.parse(part)
        this = tree.getroot()
        this_suite = this if this.tag == "testsuite" else this.find("testsuite")
        if root is None:
            root, suite = this, this_suite
            seen = {(c.get("classname", ""), c.get("name", "")) for c in suite.iter("testcase")}
            continue
        for case in this_suite.findall("testcase"):
            key = (case.get("classname", ""), case.get("name", ""))
            if key not in seen:
                suite.append(case)
                seen.add(key)
    if root is None:
        root = ET.Element("testsuites")
        suite = ET.SubElement(root, "testsuite", name="pytest")
    names = {c.get("name", "") for c in suite.iter("testcase")}
    for nodeid, t in state.tests.items():
        name = nodeid.rsplit("::", 1)[-1]
        if "the test process died" in t["message"] and name not in names:
            case = ET.SubElement(suite, "testcase", classname=nodeid.rsplit("::", 1)[0].replace("/", ".").removesuffix(".py"),
                                 name=name, time="0")
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="kvcodec_clause", value=t["clause"])
            ET.SubElement(case, "failure", message=t["message"])
    cases = list(suite.iter("testcase"))
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    ET.ElementTree(root).write(target, encoding="utf-8", xml_declaration=True)


def _clause_results(spec, tests: dict[str, dict], clauses: dict[str, str]) -> list[dict]:
    """One entry per clause: its status (PASS, FAIL, SKIP), the message and where it happened."""
    from ..testing.events import param_label

    out = []
    for name in clauses:
        mine = [(nodeid, t) for nodeid, t in tests.items() if t["clause"] == name]
        # A failure found by the clause's own test first, then those found by other tests.
        failed = sorted(((n, t) for n, t in mine if t["outcome"] == "failed"), key=lambda nt: nt[1].get("own") != name)
        passed = [(n, t) for n, t in mine if t["outcome"] == "passed"]
        stopped = [(n, t) for n, t in mine if t["outcome"] == "interrupted"]
        where, more = "", 0
        if failed:
            nodeid, t = failed[0]
            status, text, where, more = "FAIL", t["message"], param_label(nodeid, spec.name), len(failed) - 1
        elif stopped:
            status, text = "SKIP", stopped[0][1]["message"]
        elif passed:
            status, text = "PASS", ""
        elif mine:
            # The most specific reason: a device-wide skip ("runs on the cuda device") comes last.
            reasons = sorted((t["message"] for _, t in mine), key=lambda m: "runs on the" in m)
            status, text = "SKIP", reasons[0]
        else:
            status, text = "SKIP", "no test collected"
        out.append({"clause": name, "status": status, "message": text, "where": where, "more_failures": more,
                    "tests": {nodeid: t["outcome"] for nodeid, t in mine}})
    return out


def _report_json(spec, device: str, params: dict, tests: dict[str, dict], clauses: dict[str, str]) -> str:
    results = _clause_results(spec, tests, clauses)
    counts = {k: sum(r["status"] == k for r in results) for k in ("PASS", "FAIL", "SKIP")}
    return json.dumps({"codec": spec.name, "format_version": spec.format_version, "lossless": spec.lossless,
                       "error_bound": spec.error_bound, "device": device, "params": params,
                       "passed": counts["PASS"], "failed": counts["FAIL"], "skipped": counts["SKIP"],
                       "clauses": results}, indent=2)


def _title(spec, device: str, params: dict) -> str:
    kind = "lossless" if spec.lossless else f"lossy: {spec.error_bound}"
    return (f"kvcodec check {spec.name} (format {spec.format_version}, {kind}) on {device} devices"
            + (f", params {json.dumps(params)}" if params else ""))


def _print_rich(spec, device: str, params: dict, tests: dict[str, dict], clauses: dict[str, str]) -> None:
    """The report as a terminal table: status, clause, what happened."""
    results = _clause_results(spec, tests, clauses)
    rows = []
    for r in results:
        text = r["message"]
        if r["status"] == "FAIL":
            text += f" [{r['where']}]" + (f" (+{r['more_failures']} more)" if r["more_failures"] else "")
        rows.append([r["status"], r["clause"], text])
    counts = {k: sum(r["status"] == k for r in results) for k in ("PASS", "FAIL", "SKIP")}
    out = _ui.console()
    out.print(_title(spec, device, params), style="bold", markup=False)
    out.print(_ui.rich_table(["status", "clause", "detail"], rows))
    out.print(_ui.styled(f"-- {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
                         f"({len(clauses)} clauses)"))


def _report(spec, device: str, params: dict, tests: dict[str, dict], clauses: dict[str, str]) -> str:
    lines = [_title(spec, device, params)]
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for r in _clause_results(spec, tests, clauses):
        text = r["message"]
        if r["status"] == "FAIL":
            text += f" [{r['where']}]" + (f" (+{r['more_failures']} more)" if r["more_failures"] else "")
        counts[r["status"]] += 1
        lines.append(f"{r['status']}  {r['clause']}" + (f": {text}" if text else ""))
    lines.append(f"-- {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
                 f"({len(clauses)} clauses)")
    return "\n".join(lines)
