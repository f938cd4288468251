"""Shared fixtures of the nvfp4 plugin's tests.

The tests need the plugin installed (``pip install --no-build-isolation ./plugins/kvcodec-nvfp4``).
When it is not, a local run of the repository's ``pytest`` leaves them out and says so in the
header; under CI (``CI`` set) a missing plugin is an error, so a broken install cannot hide.
"""

from __future__ import annotations

import os

import pytest

try:
    import kvcodec_nvfp4  # noqa: F401

    _MISSING = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("CI"):
        raise
    _MISSING = str(exc)
    collect_ignore_glob = ["test_*.py"]

from kvcodec_sdk.registry import _reset_default_registry


def pytest_report_header(config):
    if _MISSING:
        return f"kvcodec-nvfp4 is not installed ({_MISSING}): its tests are not collected"
    return None


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    """Every test starts with a fresh process-wide codec registry."""
    monkeypatch.delenv("KVCODEC_DISABLE_PLUGINS", raising=False)
    _reset_default_registry()
    yield
    _reset_default_registry()
