"""The engine adapters' pins (kvcodec_sdk.integrations) agree with the packaging and the docs; the
adapters themselves are tested against the real engine packages in tests/engines (own venv)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from kvcodec_sdk.integrations import LMCACHE_VERSION

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def test_engines_extra_pins_the_lmcache_release_the_adapter_is_built_against():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert extras["engines"] == [f"lmcache=={LMCACHE_VERSION}"]


def test_engines_doc_states_the_pin():
    doc = (ROOT / "docs" / "engines.md").read_text()
    assert f"lmcache=={LMCACHE_VERSION}" in doc
    assert '"serde": {"type": "kvcodec-fp8"' in doc


def test_engine_tests_stay_out_of_the_default_run():
    with open(ROOT / "pyproject.toml", "rb") as f:
        addopts = tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--ignore=tests/engines" in addopts
    assert "tests/engines" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is not None, reason="LMCache is installed here")
def test_without_lmcache_the_adapter_says_what_to_install():
    result = subprocess.run([sys.executable, "-c", "import kvcodec_sdk.integrations.lmcache"], capture_output=True,
                            text=True, cwd=ROOT.parent, timeout=120)
    assert result.returncode != 0
    assert f"needs LMCache {LMCACHE_VERSION}" in result.stderr and "'engines' extra" in result.stderr
