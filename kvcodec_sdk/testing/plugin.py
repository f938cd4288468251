"""The ``kvcodec`` pytest plugin (registered through the ``pytest11`` entry point).

Options:

- ``--kvcodec NAME[:JSON-PARAMS]`` (repeatable): run the conformance suite on these codecs;
- ``--kvcodec-device cpu|cuda|all``: which implementations to test (default all available).

The suite is collected only when asked: when either option is given, the module
``kvcodec_sdk.testing.selected`` is added to the run, parametrized over the named codecs (every
registered codec when only ``--kvcodec-device`` is given). Test classes that subclass
:class:`~kvcodec_sdk.testing.CodecConformanceTests` are collected as usual and honour
``--kvcodec-device``. An ordinary ``pytest`` run without these options is not slowed down.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .clauses import clause_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcodec", "kvcodec codec conformance suite")
    group.addoption("--kvcodec", action="append", default=[], metavar="NAME[:JSON-PARAMS]", dest="kvcodec",
                    help="run the conformance suite on this registered codec, optionally with parameters as a JSON "
                         "object (repeatable); e.g. --kvcodec concat or --kvcodec 'concat:{\"path\": \"sm\"}'")
    group.addoption("--kvcodec-device", default=None, choices=("cpu", "cuda", "all"), dest="kvcodec_device",
                    help="implementations to test: cpu, cuda or all available (default)")
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
