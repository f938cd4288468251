"""The installed CMake package lets an out-of-tree plugin find_package(kvcodec_sdk) and build
against the public headers alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import kvcodec_sdk

HERE = Path(__file__).parent

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def test_headers_are_installed():
    include = Path(kvcodec_sdk.get_include())
    for header in ("codec.h", "plugin.h", "layout.h", "params.h", "device_scope.h"):
        assert (include / "kvcodec" / header).is_file(), header


def test_out_of_tree_plugin_builds_against_the_package(tmp_path):
    build = tmp_path / "build"
    configure = subprocess.run(
        ["cmake", "-S", str(HERE / "cmake_consumer"), "-B", str(build),
         f"-Dkvcodec_sdk_DIR={kvcodec_sdk.get_cmake_dir()}"],
        capture_output=True, text=True,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    libs = list(build.glob("libconsumer.*"))
    assert libs, "the consumer library was not produced"
    # The factory symbol is exported with C linkage.
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run([nm, "-D", str(libs[0])], capture_output=True, text=True).stdout
        assert "kvcodec_consumer_factory" in symbols
