"""The published-package story, read from the repository's files (no build, no install): the SDK's
plugin extras and the plugins' SDK pins agree with the versions, the README's source install
names no plugin extra, every distribution carries one set of cibuildwheel settings, and
docs/install.md names every wheel architecture and extra."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
SDK = "kvcodec-sdk"
SDK_CMAKE_CONFIG = REPO / "csrc/cmake/kvcodec_sdk-config.cmake"
# Distribution name -> folder holding its pyproject.toml.
FOLDERS = {SDK: REPO, "kvcodec-fp8": REPO / "plugins/kvcodec-fp8", "kvcodec-nvcomp": REPO / "plugins/kvcodec-nvcomp",
           "kvcodec-nvfp4": REPO / "plugins/kvcodec-nvfp4"}
PLUGINS = [name for name in FOLDERS if name != SDK]
# SDK extra -> the plugin distribution it installs.
PLUGIN_EXTRAS = {"fp8": "kvcodec-fp8", "nvcomp": "kvcodec-nvcomp", "nvfp4": "kvcodec-nvfp4"}
INSTALL_DOC = REPO / "docs/install.md"
CUDA_SCRIPT = REPO / "scripts/ci/install-cuda-manylinux.sh"
WHEEL_PYTHONS = ["cp310", "cp311", "cp312", "cp313"]


def _pyproject(dist: str) -> dict:
    with open(FOLDERS[dist] / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _version(dist: str) -> Version:
    return Version(_pyproject(dist)["project"]["version"])


def _series(version: Version) -> SpecifierSet:
    """The pin for a 0.x (or later) release series: >=MAJOR.MINOR,<MAJOR.(MINOR+1)."""
    return SpecifierSet(f">={version.major}.{version.minor},<{version.major}.{version.minor + 1}")


def _requirements(entries: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(e) for e in entries]
    by_name = {r.name.lower(): r for r in reqs}
    assert len(by_name) == len(reqs), f"a distribution is listed twice: {entries}"
    return by_name


def _cibuildwheel(dist: str) -> dict:
    return _pyproject(dist)["tool"]["cibuildwheel"]


def _wheel_architectures(dist: str) -> list[str]:
    env = _cibuildwheel(dist)["linux"]["environment"]
    return env["KVCODEC_CUDA_ARCHITECTURES"].split(";")


@pytest.mark.parametrize("extra,plugin", sorted(PLUGIN_EXTRAS.items()))
def test_sdk_extra_pins_the_plugin_series(extra, plugin):
    extras = _pyproject(SDK)["project"]["optional-dependencies"]
    assert extra in extras, f"the SDK has no extra {extra!r}; its extras: {sorted(extras)}"
    reqs = _requirements(extras[extra])
    assert list(reqs) == [plugin], f"extra {extra!r} must install {plugin} alone, not {extras[extra]}"
    version = _version(plugin)
    assert reqs[plugin].specifier == _series(version), (
        f"extra {extra!r} pins {plugin}{reqs[plugin].specifier}; {plugin} is {version}, "
        f"so the pin is {_series(version)}")
    assert reqs[plugin].specifier.contains(version)
    assert not reqs[plugin].extras and reqs[plugin].marker is None


def test_sdk_extra_all_is_every_plugin_extra():
    extras = _pyproject(SDK)["project"]["optional-dependencies"]
    union: list[str] = []
    for extra in sorted(PLUGIN_EXTRAS):
        union += extras[extra]
    assert _requirements(extras["all"]) == _requirements(union), (
        f"extra 'all' is {extras['all']}; the plugin extras together are {union}")


def test_every_plugin_has_an_sdk_extra():
    assert sorted(PLUGIN_EXTRAS.values()) == sorted(PLUGINS)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugin_pins_the_sdk_series(plugin):
    reqs = _requirements(_pyproject(plugin)["project"]["dependencies"])
    assert SDK in reqs, f"{plugin} does not depend on {SDK}: {sorted(reqs)}"
    version = _version(SDK)
    assert reqs[SDK].specifier == _series(version), (
        f"{plugin} pins {SDK}{reqs[SDK].specifier}; {SDK} is {version}, so the pin is {_series(version)}")
    assert reqs[SDK].specifier.contains(version)


@pytest.mark.parametrize("dist", list(FOLDERS))
def test_test_extra_pulls_no_plugin_from_an_index(dist):
    """The README's source install asks for the `test` extras: they must name no plugin and no
    extra of the SDK, or pip would resolve a plugin from an index instead of its folder."""
    for entry in _pyproject(dist)["project"]["optional-dependencies"].get("test", []):
        req = Requirement(entry)
        assert req.name.lower() not in PLUGINS, f"{dist}[test] names the plugin {entry!r}"
        assert not (req.name.lower() == SDK and req.extras), f"{dist}[test] names SDK extras: {entry!r}"


def _source_install_extras(text: str, where: str) -> dict[str, set[str]]:
    """Folder -> extras of the README's `pip install` of this repository's folders."""
    lines = [line for line in text.splitlines() if "pip install" in line and '".[test]"' in line]
    assert lines, f"{where} has no `pip install \".[test]\" ...` line"
    out: dict[str, set[str]] = {}
    for token in shlex.split(lines[0].split("&&")[0], comments=True):
        m = re.fullmatch(r"(\.(?:/[\w./-]+)?)(?:\[([\w,]+)\])?", token)
        if m:
            out[os.path.normpath(m.group(1))] = set(filter(None, (m.group(2) or "").split(",")))
    return out


@pytest.mark.parametrize("path", ["README.md", ".ci/run"])
def test_source_install_builds_every_distribution_from_its_folder(path):
    installed = _source_install_extras((REPO / path).read_text(), path)
    folders = {os.path.normpath(str(f.relative_to(REPO)) if f != REPO else ".") for f in FOLDERS.values()}
    assert set(installed) == folders, f"{path} installs {sorted(installed)}, the repository has {sorted(folders)}"
    for folder, extras in installed.items():
        assert extras == {"test"}, f"{path}: {folder} is installed with extras {sorted(extras)}: only [test] is local"


def test_every_distribution_has_the_same_cibuildwheel_settings():
    """Everything but the tests' environment is one set of settings (the SDK's)."""
    def shared(dist):
        settings = dict(_cibuildwheel(dist))
        settings.pop("test-environment", None)
        return settings
    reference = shared(SDK)
    for plugin in PLUGINS:
        assert shared(plugin) == reference, f"{plugin}'s [tool.cibuildwheel] differs from the SDK's"


@pytest.mark.parametrize("dist", list(FOLDERS))
def test_wheels_are_manylinux_2_28_for_cpython_3_10_to_3_13(dist):
    cibw = _cibuildwheel(dist)
    linux = cibw["linux"]
    assert linux["archs"] == ["x86_64", "aarch64"]
    assert linux["manylinux-x86_64-image"] == linux["manylinux-aarch64-image"] == "manylinux_2_28"
    assert cibw["build"] == [f"{tag}-*" for tag in WHEEL_PYTHONS]
    assert "*-musllinux_*" in cibw["skip"]
    lowest = WHEEL_PYTHONS[0].removeprefix("cp")
    assert _pyproject(dist)["project"]["requires-python"] == f">={lowest[0]}.{lowest[1:]}"


@pytest.mark.parametrize("dist", list(FOLDERS))
def test_wheel_tests_run_the_cpu_tests_of_the_distribution(dist):
    cibw = _cibuildwheel(dist)
    assert cibw["test-extras"] == ["test"]
    command = cibw["test-command"]
    assert "-m 'not gpu'" in command and "{package}/tests" in command, command
    assert (FOLDERS[dist] / "tests").is_dir()
    if dist != SDK:  # the SDK comes from the wheels built first, not from an index
        assert cibw["test-environment"]["PIP_FIND_LINKS"] == "/project/wheelhouse"


def test_wheel_architectures_include_blackwell_machine_code():
    archs = _wheel_architectures(SDK)
    assert all(re.fullmatch(r"\d+-(real|virtual)", a) for a in archs), archs
    assert {"90-real", "100-real", "120-real"} <= set(archs), archs
    virtual = [a for a in archs if a.endswith("-virtual")]
    newest = max(int(a.split("-")[0]) for a in archs)
    assert virtual == [f"{newest}-virtual"], f"PTX of the newest architecture only, for later GPUs: {archs}"


@pytest.mark.parametrize("dist", list(FOLDERS))
def test_wheel_architectures_reach_cmake_through_the_variable_the_build_reads(dist):
    """The wheel list is an environment variable; each pyproject hands that variable to CMake
    and keeps its own default for source builds."""
    define = _pyproject(dist)["tool"]["scikit-build"]["cmake"]["define"]["KVCODEC_CUDA_ARCHITECTURES"]
    assert define["env"] == "KVCODEC_CUDA_ARCHITECTURES"
    assert define["default"] == "80-real;86-real;89-real;90-real;90-virtual"
    cmake = (FOLDERS[dist] / "CMakeLists.txt").read_text()
    # A plugin built with the SDK's helpers leaves enabling CUDA, and reading the variable, to them.
    reader = SDK_CMAKE_CONFIG.read_text() if "COMPONENTS plugin" in cmake else cmake
    assert "KVCODEC_CUDA_ARCHITECTURES" in reader


def test_wheel_repair_leaves_the_driver_and_nvcomp_out():
    repair = shlex.split(_cibuildwheel(SDK)["linux"]["repair-wheel-command"])
    assert repair[:2] == ["auditwheel", "repair"], repair
    excluded = [repair[i + 1] for i, arg in enumerate(repair) if arg == "--exclude"]
    preloaded = re.findall(r'"(libnvcomp\w*\.so\.\d+)"',
                           (FOLDERS["kvcodec-nvcomp"] / "kvcodec_nvcomp/__init__.py").read_text())
    assert preloaded, "kvcodec_nvcomp names no nvCOMP library it preloads"
    for soname in ["libcuda.so.1", *preloaded]:
        assert any(fnmatch.fnmatch(soname, pattern) for pattern in excluded), f"{soname} is bundled: {excluded}"


def test_cuda_is_installed_by_the_script_from_a_repository_in_the_environment():
    linux = _cibuildwheel(SDK)["linux"]
    assert "bash {project}/scripts/ci/install-cuda-manylinux.sh" in linux["before-all"]
    assert "KVCODEC_CUDA_REPO_URL" in linux["environment-pass"]
    assert CUDA_SCRIPT.is_file() and os.access(CUDA_SCRIPT, os.X_OK)
    script = CUDA_SCRIPT.read_text()
    assert "KVCODEC_CUDA_REPO_URL" in script
    assert "://" not in script, "the script names a host; the repository URL comes from the environment"
    assert not any("://" in str(v) for v in linux.values()), linux


def test_install_doc_names_every_wheel_architecture():
    doc = INSTALL_DOC.read_text()
    archs = _wheel_architectures(SDK)
    assert ";".join(archs) in doc
    for arch in archs:
        assert f"`{arch}`" in doc, f"docs/install.md does not name {arch}"


def test_install_doc_names_every_extra_and_nvcomp_wheel():
    doc = INSTALL_DOC.read_text()
    for extra in _pyproject(SDK)["project"]["optional-dependencies"]:
        assert f"| `{extra}` |" in doc, f"docs/install.md's table of extras lacks {extra!r}"
    assert 'pip install "kvcodec-sdk[fp8,nvcomp]"' in doc
    for wheel in ["nvidia-libnvcomp-cu12", "nvidia-libnvcomp-cu13"]:
        assert f"`{wheel}" in doc


def test_readme_links_the_install_doc():
    assert "(docs/install.md)" in (REPO / "README.md").read_text()
