"""The type stubs of the compiled module (kvcodec_sdk/_native/*.pyi) match the module itself."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvcodec_sdk

STUBS = Path(kvcodec_sdk.__file__).resolve().parent / "_native"
MODULES = ("__init__", "kvcm", "kvcm_testing", "disk", "daemon")


def test_stubs_are_installed_beside_the_module():
    assert sorted(p.stem for p in STUBS.glob("*.pyi")) == sorted(MODULES)
    assert (STUBS.parent / "py.typed").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the 'test' extra: pip install kvcodec-sdk[test])")
def test_stubtest_finds_no_difference(tmp_path):
    # From a folder outside the source tree, so the installed package (module and stubs) is checked.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    result = subprocess.run([sys.executable, "-m", "mypy.stubtest", "kvcodec_sdk._native"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found in 5 modules" in result.stdout
