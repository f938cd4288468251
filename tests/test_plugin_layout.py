"""The plugins of this repository are the template's proof: they keep its layout.

A codec author reads a plugin next to a freshly generated one; the same files in the same places,
the version in one place (the distribution's metadata), the SDK's codec base class and no source
file too long to read make that comparison cheap. These checks read the source tree only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "templates" / "codec-plugin" / "{{cookiecutter.distribution_name}}"
PLUGINS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
MODULE_DIR = "{{cookiecutter.module_name}}"
SOURCE_SUFFIXES = {".cpp", ".cu", ".h", ".cuh", ".py"}
MAX_LINES = 800


def module_of(plugin: Path) -> str:
    return tomllib.loads((plugin / "pyproject.toml").read_text())["project"]["name"].replace("-", "_")


def template_files() -> list[str]:
    """Every file the template generates, relative to the plugin root (module folder generic)."""
    files = []
    for path in TEMPLATE.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            files.append(path.relative_to(TEMPLATE).as_posix())
    return sorted(files)


def test_there_are_plugins_and_a_template():
    assert len(PLUGINS) >= 2, PLUGINS
    assert "csrc/codec.h" in template_files()


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_a_plugin_has_every_file_the_template_generates(plugin):
    module = module_of(plugin)
    missing = []
    for rel in template_files():
        if rel == "csrc/kernel.cu":
            if not list((plugin / "csrc").glob("kernel*.cu")):
                missing.append("csrc/kernel*.cu")
            continue
        if not (plugin / rel.replace(MODULE_DIR, module)).is_file():
            missing.append(rel.replace(MODULE_DIR, module))
    assert not missing, f"{plugin.name} lacks the template's {missing}"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_the_version_lives_in_the_package_metadata_only(plugin):
    meta = tomllib.loads((plugin / "pyproject.toml").read_text())["project"]
    assert "version" in meta, "pyproject.toml carries the version"
    literal = re.compile(r"""(__version__|version)\s*=\s*["']\d+\.\d+""")
    for path in (plugin / module_of(plugin)).rglob("*.py"):
        assert not literal.search(path.read_text()), f"{path.relative_to(ROOT)} hard-codes a version"
    cmake = (plugin / "CMakeLists.txt").read_text()
    assert not re.search(r"VERSION\s+\d+\.\d+", cmake.split("project(", 1)[1].split(")", 1)[0]), \
        f"{plugin.name}/CMakeLists.txt hard-codes the project version"


def test_every_plugin_and_the_template_pin_the_sdk_alike():
    def pin(pyproject: Path) -> str:
        # The template's pyproject.toml is a Jinja template (not TOML yet): read the requirement as text.
        deps = re.findall(r"^dependencies = \[(.*)\]$", pyproject.read_text(), re.M)
        assert len(deps) == 1, f"{pyproject} has no single dependencies line"
        return next(d for d in re.findall(r'"([^"]*)"', deps[0]) if d.startswith("kvcodec-sdk"))

    pins = {p.name: pin(p / "pyproject.toml") for p in PLUGINS}
    pins["template"] = pin(TEMPLATE / "pyproject.toml")
    assert len(set(pins.values())) == 1, pins


@pytest.mark.parametrize("plugin", [*PLUGINS, TEMPLATE], ids=lambda p: p.parent.name if p == TEMPLATE else p.name)
def test_codecs_derive_from_the_sdk_base_class(plugin):
    sources = "".join(p.read_text() for p in (plugin / "csrc").rglob("*") if p.suffix in SOURCE_SUFFIXES)
    base = r":\s*public\s+(kvcodec::)?(CodecBase\b|DualCodec<|PlannedCodec<)"
    assert re.search(base, sources), f"{plugin.name} has no codec derived from kvcodec::CodecBase (or DualCodec, PlannedCodec)"
    assert "makeCodecFactory" in sources, f"{plugin.name} does not build its factory with kvcodec::makeCodecFactory"


def production_sources():
    roots = [ROOT / "csrc", ROOT / "kvcodec_sdk"] + [p / "csrc" for p in PLUGINS] + [p / module_of(p) for p in PLUGINS]
    for root in roots:
        for path in root.rglob("*"):
            test_only = "testing" in path.stem or "bench_hooks" in path.stem or (
                "testing" in path.parts and root.name == "csrc")
            if path.suffix in SOURCE_SUFFIXES and not test_only:
                yield path


def test_no_production_source_file_is_over_800_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in production_sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (over {MAX_LINES} lines): {long}"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_the_conformance_test_derives_from_the_suite(plugin):
    text = (plugin / "tests" / "test_conformance.py").read_text()
    assert "CodecConformanceTests" in text and "codec_name" in text
