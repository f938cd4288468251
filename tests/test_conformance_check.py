"""``kvcodec check``: one report line per contract clause, pass/fail with the reason, JUnit XML.

Runs the command in a subprocess, as a user would; a broken codec is installed as a fake
distribution with a ``kvcodec`` entry point (found through PYTHONPATH like an installed wheel).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_conformance_suite import broken_lib  # noqa: F401  (session fixture: builds libbroken_codecs)

from kvcodec_sdk.testing import CLAUSES, harness

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent


def check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcodec_sdk", "check", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def report_lines(out: str) -> dict[str, str]:
    """clause -> its report line."""
    lines = {}
    for line in out.splitlines():
        status, _, rest = line.partition("  ")
        if status in ("PASS", "FAIL", "SKIP"):
            lines[rest.split(":")[0]] = line
    return lines


def test_concat_passes_on_cpu(tmp_path):
    junit = tmp_path / "check.xml"
    result = check("concat", "--device", "cpu", "--junit-xml", str(junit))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = report_lines(result.stdout)
    assert list(lines) == list(CLAUSES), "one line per clause, in contract order"
    for name in ("configure-once", "round-trip", "writes-inside-slots", "host-indices-after-return", "bad-arguments"):
        assert lines[name] == f"PASS  {name}"
    assert lines["stream-no-wait"].startswith("SKIP  stream-no-wait: ")
    assert "0 failed" in result.stdout
    xml = junit.read_text()
    assert 'name="kvcodec_clause" value="round-trip"' in xml


def test_bad_params_are_an_error():
    result = check("concat", "--params", '{"path": "warp"}')
    assert result.returncode == 2  # usage: parameters the schema rejects
    assert "parameter 'path' is 'warp'" in result.stderr


@pytest.fixture
def installed_broken_codec(tmp_path, broken_lib):  # noqa: F811  (the imported fixture, requested by name)
    """A fake installed plugin registering broken codecs: write_past_slot, decode_ignores_lifecycle,
    throws_on_empty, cuda_only (a correct codec declaring only a CUDA implementation) and
    golden_none (a correct codec shipping golden vectors next to its spec)."""
    import kvcodec_sdk.testing

    (tmp_path / "broken_plugin.py").write_text(textwrap.dedent("""
        import dataclasses, os
        import broken
        from kvcodec_sdk import hookimpl

        @hookimpl
        def kvcodec_register_codecs(registry):
            for flaw in ("write_past_slot", "decode_ignores_lifecycle", "throws_on_empty"):
                registry.register(broken.spec(flaw))
            registry.register(dataclasses.replace(broken.spec("cuda_only"), devices=("cuda",)))
            registry.register(broken.spec("golden_none", golden_vectors=os.environ["BROKEN_GOLDEN"]))
    """))
    dist = tmp_path / "broken_plugin-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[kvcodec]\nbroken = broken_plugin\n")
    # No empty entry: it would put the current directory (the source tree) on the child's path.
    path = os.pathsep.join(p for p in [str(tmp_path), str(HERE / "broken_codecs"), os.environ.get("PYTHONPATH", "")] if p)
    env = {"PYTHONPATH": path, "KVCODEC_BROKEN_LIB": str(broken_lib), "BROKEN_GOLDEN": str(tmp_path / "vectors")}
    sys.path.insert(0, str(HERE / "broken_codecs"))
    os.environ["KVCODEC_BROKEN_LIB"] = str(broken_lib)
    try:
        import broken

        kvcodec_sdk.testing.write_golden_vectors(broken.spec("golden_none"), tmp_path / "vectors")
    finally:
        sys.path.remove(str(HERE / "broken_codecs"))
    return env


def test_broken_codec_fails_with_the_clause_and_reason(installed_broken_codec):
    result = check("write_past_slot", "--device", "cpu", env=installed_broken_codec)
    assert result.returncode == 1, result.stdout + result.stderr
    line = report_lines(result.stdout)["writes-inside-slots"]
    assert line.startswith("FAIL  writes-inside-slots: encode wrote "), line
    assert "byte(s) after destination blob" in line and "[cpu-mixed]" in line, line
    assert report_lines(result.stdout)["round-trip"] == "PASS  round-trip"


def test_json_report_has_every_clause_with_status_message_and_place(installed_broken_codec):
    import json

    result = check("write_past_slot", "--device", "cpu", "--json", "--quiet", env=installed_broken_codec)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["codec"] == "write_past_slot" and report["device"] == "cpu"
    by_clause = {c["clause"]: c for c in report["clauses"]}
    assert list(by_clause) == list(CLAUSES)
    bad = by_clause["writes-inside-slots"]
    assert bad["status"] == "FAIL" and bad["where"] == "cpu-mixed" and "byte(s) after destination blob" in bad["message"]
    assert by_clause["round-trip"]["status"] == "PASS"
    assert report["failed"] == sum(c["status"] == "FAIL" for c in report["clauses"]) >= 1
    assert report["passed"] + report["failed"] + report["skipped"] == len(CLAUSES)


def test_a_failure_is_listed_under_the_clause_it_breaks(installed_broken_codec, tmp_path):
    """The cold-size-fixed test round-trips a page; the round trip that fails there is listed under
    round-trip, and cold-size-fixed says it was not fully checked (it is not a FAIL of its own)."""
    junit = tmp_path / "report.xml"
    result = check("decode_ignores_lifecycle", "--device", "cpu", "--junit-xml", str(junit), env=installed_broken_codec)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = report_lines(result.stdout)
    assert lines["round-trip"].startswith("FAIL  round-trip: "), lines["round-trip"]
    assert lines["cold-size-fixed"].startswith("SKIP  cold-size-fixed: not fully checked: the test stopped at a "
                                               "round-trip violation"), lines["cold-size-fixed"]
    assert 'name="kvcodec_violated" value="round-trip"' in junit.read_text()


def test_a_codec_that_kills_the_process_fails_its_clause_and_the_rest_still_run(installed_broken_codec, tmp_path):
    """throws_on_empty throws through noexcept (std::terminate) on an empty call with null pointers:
    empty-call fails with how the process died, and the other clauses run in a new process."""
    junit = tmp_path / "report.xml"
    result = check("throws_on_empty", "--device", "cpu", "--quiet", "--junit-xml", str(junit),
                   env=installed_broken_codec)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = report_lines(result.stdout)
    assert lines["empty-call"].startswith("FAIL  empty-call: the test process died while this test ran (signal "
                                          "SIGABRT)"), lines["empty-call"]
    for name in ("round-trip", "writes-inside-slots", "bad-arguments", "stateful-sequence"):
        assert lines[name] == f"PASS  {name}", lines[name]
    xml = junit.read_text()
    assert "test_empty_call[throws_on_empty-cpu]" in xml and "the test process died" in xml
    assert 'value="round-trip"' in xml, "the cases of the later process are in the report too"


def test_a_device_the_codec_does_not_ship_is_a_usage_error(installed_broken_codec):
    result = check("cuda_only", "--device", "cpu", env=installed_broken_codec)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--device cpu: codec 'cuda_only' has no cpu implementation; it ships cuda" in result.stderr


@pytest.mark.skipif(harness.cuda_available(), reason="checks the report of a machine without a GPU")
def test_a_check_where_no_clause_ran_fails_and_says_why(installed_broken_codec):
    for args in (("cuda_only",), ("concat", "--device", "cuda")):
        result = check(*args, env=installed_broken_codec)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "kvcodec check: no clause ran: " in result.stderr
        assert "need a CUDA device and cuda-python" in result.stderr.split("no clause ran: ")[1]
        assert "0 passed, 0 failed" in result.stdout


def test_junit_xml_folder_is_created_or_the_path_refused(tmp_path):
    junit = tmp_path / "new" / "folder" / "report.xml"
    result = check("concat", "--device", "cpu", "--quiet", "--junit-xml", str(junit))
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'value="round-trip"' in junit.read_text()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = check("concat", "--device", "cpu", "--junit-xml", str(blocker / "report.xml"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--junit-xml {blocker / 'report.xml'}: cannot create the folder {blocker}" in result.stderr
    assert "PASS" not in result.stdout, "refused before running anything"


def test_golden_vectors_shipped_with_the_codec_run_by_default(installed_broken_codec):
    result = check("golden_none", "--device", "cpu", "--quiet", env=installed_broken_codec)
    assert result.returncode == 0, result.stdout + result.stderr
    assert report_lines(result.stdout)["golden-vectors"] == "PASS  golden-vectors"


def test_a_hanging_conformance_test_is_diagnosed_not_stalled(pytester):
    """--kvcodec-timeout: a conformance test that never returns dumps every thread's stack and
    ends the run (instead of stalling a GPU check until its outer limit)."""
    pytester.makepyfile(test_hang="""
        import time
        from kvcodec_sdk.testing.clauses import clause

        @clause("stream-no-wait")
        def test_codec_that_blocks():
            time.sleep(30)
    """)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kvcodec-timeout", "1")
    assert time.monotonic() - started < 25
    assert result.ret != 0
    err = result.stderr.str()
    assert "Timeout" in err and "test_codec_that_blocks" in err, err


def test_a_hang_that_holds_the_interpreter_lock_is_still_diagnosed(pytester):
    """A codec stuck in native code while holding the GIL (here: libc sleep() through ctypes.PyDLL,
    which keeps the lock) starves the Python-level watchdog; the native one still dumps the stacks
    and ends the run."""
    pytester.makepyfile(test_hang="""
        import ctypes
        from kvcodec_sdk.testing.clauses import clause

        @clause("stream-no-wait")
        def test_native_call_that_never_returns():
            ctypes.PyDLL(None).sleep(60)
    """)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kvcodec-timeout", "1")
    assert time.monotonic() - started < 30
    assert result.ret != 0
    err = result.stderr.str()
    assert "Timeout" in err and "test_native_call_that_never_returns" in err, err
