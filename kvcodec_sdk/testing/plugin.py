"""The ``kvcodec`` pytest plugin (registered through the ``pytest11`` entry point).

Options:

- ``--kvcodec NAME[:JSON-PARAMS]`` (repeatable): run the conformance suite on these codecs;
- ``--kvcodec-device cpu|cuda|all``: which implementations to test (default all available);
- ``--kvcodec-timeout SECONDS``: a conformance test running longer than this dumps every
  thread's stack and ends the run (default 300; 0 disables), so a hanging codec is diagnosed
  instead of stalling the run. A thread stuck in native code while holding the interpreter lock
  cannot run Python, so a second, native watchdog (:mod:`faulthandler`) dumps the stacks and ends
  the process up to ``WATCHDOG_GRACE_S`` seconds later (not when pytest's own ``faulthandler_timeout`` is
  set, which uses the same mechanism).

The suite is collected only when asked: when either option is given, the module
``kvcodec_sdk.testing.selected`` is added to the run, parametrized over the named codecs (every
registered codec when only ``--kvcodec-device`` is given). Test classes that subclass
:class:`~kvcodec_sdk.testing.CodecConformanceTests` are collected as usual and honour
``--kvcodec-device``. An ordinary ``pytest`` run without these options is not slowed down.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from .clauses import ClauseViolation, clause_of

#: Seconds after ``--kvcodec-timeout`` (at most; never more than the timeout itself) at which the
#: native watchdog ends a run whose Python-level watchdog could not (a thread holding the
#: interpreter lock is stuck in native code).
WATCHDOG_GRACE_S = 15.0


def _stderr_fd() -> int:
    # The real standard error, duplicated when the plugin loads (before pytest captures fd 2),
    # so the native watchdog's dump reaches the terminal and not a capture file.
    try:
        return os.dup(2)
    except OSError:
        return 2


_WATCHDOG_FD = _stderr_fd()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcodec", "kvcodec codec conformance suite")
    group.addoption("--kvcodec", action="append", default=[], metavar="NAME[:JSON-PARAMS]", dest="kvcodec",
                    help="run the conformance suite on this registered codec, optionally with parameters as a JSON "
                         "object (repeatable); e.g. --kvcodec concat or --kvcodec 'concat:{\"path\": \"sm\"}'")
    group.addoption("--kvcodec-device", default=None, choices=("cpu", "cuda", "all"), dest="kvcodec_device",
                    help="implementations to test: cpu, cuda or all available (default)")
    group.addoption("--kvcodec-timeout", default=300.0, type=float, metavar="SECONDS", dest="kvcodec_timeout",
                    help="a conformance test running longer than this dumps every thread's stack and ends the run "
                         "(default 300; 0 disables)")
    group.addoption("--kvcodec-golden", default=None, metavar="DIR", dest="kvcodec_golden",
                    help="folder holding <codec>-v<format_version>/ golden vectors for codecs named by --kvcodec")


def parse_selection(text: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:{json}`` -> (name, params)."""
    name, sep, raw = text.partition(":")
    if not name:
        raise pytest.UsageError(f"--kvcodec {text!r}: give a codec name, e.g. --kvcodec concat")
    if not sep:
        return name, {}
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise pytest.UsageError(f"--kvcodec {text!r}: the parameters are not valid JSON ({exc})") from None
    if not isinstance(params, dict):
        raise pytest.UsageError(f"--kvcodec {text!r}: the parameters must be a JSON object, got {type(params).__name__}")
    return name, params


def selected_codecs(config: pytest.Config) -> list[tuple[str, dict]]:
    """Codecs named by --kvcodec, or every registered codec."""
    chosen = [parse_selection(t) for t in config.getoption("kvcodec") or []]
    if chosen:
        return chosen
    from ..registry import list_codecs

    return [(spec.name, {}) for spec in list_codecs()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvcodec_clause(name): the codec contract clause a conformance test checks")
    # The suite's CUDA cases carry it, so `pytest -m gpu` selects them on a GPU host.
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")
    if config.getoption("kvcodec") or config.getoption("kvcodec_device"):
        for text in config.getoption("kvcodec") or []:
            parse_selection(text)  # a usage error before collection
        module = str(Path(__file__).with_name("selected.py"))
        if module not in config.args:
            config.args.append(module)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if config.getoption("kvcodec") or config.getoption("kvcodec_device"):
        names = ", ".join(n + (f" {json.dumps(p)}" if p else "") for n, p in selected_codecs(config))
        return [f"kvcodec conformance: {names} on {config.getoption('kvcodec_device') or 'all'} devices"]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Name the clause in the test's user properties, so JUnit XML carries it.
    for item in items:
        name = clause_of(item)
        if name is not None:
            item.user_properties.append(("kvcodec_clause", name))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # A test of one clause can find a violation of another (a round trip inside the
    # cold-size-fixed test): name the clause actually violated, so reports list it there.
    outcome = yield
    excinfo = call.excinfo
    if excinfo is None or clause_of(item) is None or not isinstance(excinfo.value, ClauseViolation):
        return
    report = outcome.get_result()
    prop = ("kvcodec_violated", excinfo.value.clause)
    report.user_properties.append(prop)
    if prop not in item.user_properties:
        item.user_properties.append(prop)  # the teardown report, which JUnit XML takes properties from


def _on_timeout(item: pytest.Item, timeout: float) -> None:
    # Runs on a timer thread: show the real stderr, dump every stack, end the process (a thread
    # stuck in a native call cannot be interrupted any other way).
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        try:
            capman.suspend_global_capture(in_=True)
        except Exception:  # noqa: BLE001 - best effort; the dump below matters more
            pass
    sys.stderr.write(f"\n+++ kvcodec conformance: Timeout: {item.nodeid} ran longer than {timeout:g} s "
                     "(a codec call or the device is blocked); stacks of every thread:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(3)


def _pytest_faulthandler_timeout(config: pytest.Config) -> float:
    try:
        return float(config.getini("faulthandler_timeout") or 0)
    except (ValueError, TypeError):  # pytest's faulthandler plugin is disabled
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # A codec that blocks (on a stream, on the device) would otherwise stall the run silently.
    timeout = float(item.config.getoption("kvcodec_timeout") or 0)
    timer = None
    native = False
    if timeout > 0 and clause_of(item) is not None:
        timer = threading.Timer(timeout, _on_timeout, args=(item, timeout))
        timer.daemon = True
        timer.start()
        if not _pytest_faulthandler_timeout(item.config):
            faulthandler.dump_traceback_later(timeout + min(WATCHDOG_GRACE_S, timeout), exit=True, file=_WATCHDOG_FD)
            native = True
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        if native:
            faulthandler.cancel_dump_traceback_later()
