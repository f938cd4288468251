"""What the installed distributions carry: typing markers, licences, one version per package, and
a clear error when the SDK is imported from its source tree instead of an installation."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import kvcodec_sdk as kv

REPO = Path(__file__).resolve().parents[1]


def test_importing_the_source_tree_says_to_install():
    """Python started in the repository imports ./kvcodec_sdk, which has no compiled module."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # conftest sets it for other children
    out = subprocess.run([sys.executable, "-c", "import kvcodec_sdk"], cwd=REPO, env=env, capture_output=True,
                         text=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "imported from its source tree" in last and "pip install ." in last, out.stderr
    assert "circular import" not in out.stderr


@pytest.mark.parametrize("dist,package", [("kvcodec-sdk", "kvcodec_sdk"), ("kvcodec-fp8", "kvcodec_fp8"),
                                          ("kvcodec-nvcomp", "kvcodec_nvcomp"), ("kvcodec-nvfp4", "kvcodec_nvfp4")])
def test_distributions_carry_py_typed_and_their_licence(dist, package):
    mod = pytest.importorskip(package)
    assert (Path(mod.__file__).parent / "py.typed").exists()
    files = [str(f) for f in metadata.files(dist) or []]
    assert any(Path(f).name.startswith("LICENSE") for f in files), files[:20]
    assert "Apache License" in (REPO / "LICENSE").read_text()


@pytest.mark.parametrize("dist,package", [("kvcodec-fp8", "kvcodec_fp8"), ("kvcodec-nvcomp", "kvcodec_nvcomp"),
                                          ("kvcodec-nvfp4", "kvcodec_nvfp4")])
def test_plugin_versions_come_from_their_metadata(dist, package):
    mod = pytest.importorskip(package)
    version = metadata.version(dist)
    assert mod.__version__ == version
    names = [s.name for s in kv.list_codecs() if s.plugin == package.removeprefix("kvcodec_")]
    assert names and all(kv.get_codec_spec(n).version == version for n in names)
    requires = metadata.requires(dist) or []
    sdk = [r for r in requires if r.startswith("kvcodec-sdk")]
    assert len(sdk) == 1 and set(sdk[0].removeprefix("kvcodec-sdk").split(",")) == {">=0.1", "<0.2"}, requires
