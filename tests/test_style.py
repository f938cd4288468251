"""Style is checked, not debated: ruff (``[tool.ruff]`` in pyproject.toml) over the Python sources
and clang-format (``.clang-format``) over the C++/CUDA sources of the SDK, its plugins and tests.
Both tools come pinned with the ``test`` extra, so every machine formats alike."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = (".cpp", ".h", ".cu", ".cuh")
CXX_ROOTS = ("csrc", "plugins", "tests")
PY_ROOTS = ("kvcodec_sdk", "tests", "plugins", "examples", "scripts")


def tracked(suffixes: tuple[str, ...], roots: tuple[str, ...]) -> list[Path]:
    """Files of the source tree (the template's Jinja sources are not C++ yet: left out)."""
    out = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.suffix in suffixes and not parts & {"build", "__pycache__", "_skbuild"} and path.is_file():
                out.append(path)
    return out


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff comes with the 'test' extra: pip install kvcodec-sdk[test]")
    from ruff.__main__ import find_ruff_bin

    result = subprocess.run([find_ruff_bin(), "check", "--no-cache", *PY_ROOTS], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_clang_format_changes_nothing():
    clang_format = pytest.importorskip("clang_format",
                                       reason="clang-format comes with the 'test' extra: pip install kvcodec-sdk[test]")
    exe = clang_format.get_executable("clang-format")
    files = tracked(CXX, CXX_ROOTS)
    assert len(files) > 50, files
    bad = []
    for i in range(0, len(files), 40):
        chunk = [str(p) for p in files[i:i + 40]]
        result = subprocess.run([exe, "--dry-run", "--Werror", f"--style=file:{ROOT / '.clang-format'}", *chunk],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            bad += sorted({line.split(":", 1)[0] for line in result.stderr.splitlines() if ": error:" in line})
    assert not bad, "not clang-formatted (run clang-format -i --style=file on them): " + ", ".join(
        str(Path(b).relative_to(ROOT)) for b in bad)
