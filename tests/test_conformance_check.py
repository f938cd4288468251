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

pytest_plugins = ["pytester"]

from kvcodec_sdk.testing import CLAUSES
from test_conformance_suite import broken_lib  # noqa: F401  (session fixture: builds libbroken_codecs)

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
    assert result.returncode == 1
    assert "parameter 'path' is 'warp'" in result.stderr


@pytest.fixture
def installed_broken_codec(tmp_path, broken_lib):
    """A fake installed plugin registering the write_past_slot codec."""
    (tmp_path / "broken_plugin.py").write_text(textwrap.dedent("""
        import broken
        from kvcodec_sdk import hookimpl

        @hookimpl
        def kvcodec_register_codecs(registry):
            registry.register(broken.spec("write_past_slot"))
    """))
    dist = tmp_path / "broken_plugin-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[kvcodec]\nbroken = broken_plugin\n")
    # No empty entry: it would put the current directory (the source tree) on the child's path.
    path = os.pathsep.join(p for p in [str(tmp_path), str(HERE / "broken_codecs"), os.environ.get("PYTHONPATH", "")] if p)
    return {"PYTHONPATH": path, "KVCODEC_BROKEN_LIB": str(broken_lib)}


def test_broken_codec_fails_with_the_clause_and_reason(installed_broken_codec):
    result = check("write_past_slot", "--device", "cpu", env=installed_broken_codec)
    assert result.returncode == 1, result.stdout + result.stderr
    line = report_lines(result.stdout)["writes-inside-slots"]
    assert line.startswith("FAIL  writes-inside-slots: encode wrote "), line
    assert "byte(s) after destination blob" in line and "[cpu-mixed]" in line, line
    assert report_lines(result.stdout)["round-trip"] == "PASS  round-trip"


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
