"""The codec-plugin template: baked with awkward answers, built against the installed SDK,
registered, and run through the conformance suite on the CPU (CUDA too on a GPU host)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcodec_sdk import _native
from kvcodec_sdk.commands import new

cookiecutter = pytest.importorskip("cookiecutter.main")

REPO = Path(__file__).resolve().parents[1]
HAS_GPU = _native.driver_info()["device_count"] > 0


def bake(tmp_path: Path, *answers: str) -> tuple[Path, str]:
    out = subprocess.run(
        [sys.executable, "-m", "kvcodec_sdk", "new", "--no-input", "--output-dir", str(tmp_path), *answers],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    created = Path(lines[0].removeprefix("created "))
    # The tool prints the next two commands, which must be the ones that work.
    assert lines[1] == "next:"
    assert lines[2].strip() == f"pip install --no-build-isolation {created}"
    assert lines[3].strip().startswith("kvcodec check ")
    return created, lines[3].strip().removeprefix("kvcodec check ")


def test_bad_answers_are_refused_with_the_field_named(tmp_path):
    for answer, field in (("codec_name=Bad Name", "codec_name"), ("module_name=kvcodec_sdk", "module_name"),
                          ("codec_name=9lives", "codec_name")):
        out = subprocess.run(
            [sys.executable, "-m", "kvcodec_sdk", "new", "--no-input", "--output-dir", str(tmp_path), answer],
            capture_output=True, text=True,
        )
        assert out.returncode != 0
        assert f"error: {field} is" in out.stderr, out.stderr
    assert not any(tmp_path.iterdir()), "a refused answer must not leave a half-written plugin"
    with pytest.raises(ValueError, match="unknown template question 'colour'"):
        new.parse_answers(["colour=blue"])


def test_awkward_answers_render_valid_files(tmp_path):
    plugin, codec = bake(tmp_path, "codec_name=kv-2bit-x9", 'description=It\'s "quoted" & <odd>',
                         "author=O'Neil \"Q\"", "lossless=no", "page_index_location=host")
    assert codec == "kv-2bit-x9"
    assert plugin.name == "kvcodec-kv-2bit-x9"
    module = plugin / "kvcodec_kv_2bit_x9"
    compile((module / "plugin.py").read_text(), "plugin.py", "exec")
    compile((module / "__init__.py").read_text(), "__init__.py", "exec")
    import tomllib

    meta = tomllib.loads((plugin / "pyproject.toml").read_text())
    assert meta["project"]["description"] == 'It\'s "quoted" & <odd>'
    assert meta["project"]["authors"][0]["name"] == "O'Neil \"Q\""
    assert meta["project"]["entry-points"]["kvcodec"] == {"kv-2bit-x9": "kvcodec_kv_2bit_x9.plugin"}
    import ast

    # A plugin's conformance test is the suite named once: an import and one class (and its docstring).
    tree = ast.parse((plugin / "tests" / "test_conformance.py").read_text())
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    assert [type(node).__name__ for node in body] == ["ImportFrom", "ClassDef"], ast.dump(tree)
    [cls] = [node for node in body if isinstance(node, ast.ClassDef)]
    assert [ast.unparse(b) for b in cls.bases] == ["CodecConformanceTests"]
    assert [ast.unparse(n) for n in cls.body] == ["codec_name = 'kv-2bit-x9'"]


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="building a plugin needs the CUDA toolkit")
@pytest.mark.parametrize("answers", [
    ("codec_name=tmpl-dev1",),
    ("codec_name=tmpl-host2", "page_index_location=host", "lossless=no", 'description=Lossy "demo"'),
], ids=["device-lossless", "host-lossy"])
def test_baked_plugin_builds_registers_and_passes_the_suite(tmp_path, answers):
    started = time.perf_counter()
    plugin, codec = bake(tmp_path, *answers)
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target", str(target),
         str(plugin)],
        capture_output=True, text=True, env={**os.environ, "KVCODEC_CUDA_ARCHITECTURES": "90-real"},
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    listed = subprocess.run([sys.executable, "-m", "kvcodec_sdk", "list", "--json"], capture_output=True,
                            text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert codec in [c["name"] for c in report["codecs"]], report
    assert report["broken_plugins"] == {}
    device = "all" if HAS_GPU else "cpu"
    check = subprocess.run([sys.executable, "-m", "kvcodec_sdk", "check", codec, "--device", device],
                           capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert "FAIL" not in check.stdout
    elapsed = time.perf_counter() - started
    print(f"kvcodec new -> passing kvcodec check {codec} ({device}): {elapsed:.1f} s")


def test_answers_are_never_executed_by_the_template_hook(tmp_path):
    """The validation hook gets the answers as data: an answer with a quote and a newline is
    refused, not run (before: the hook pasted it into its Python source and executed it), and the
    CLI refuses it before rendering with one line and exit status 2, no traceback."""
    from cookiecutter.exceptions import FailedHookException

    marker = tmp_path / "ran"
    evil = f'x"\nopen({str(marker)!r}, "w").close()\n#'
    with pytest.raises(FailedHookException):
        cookiecutter.cookiecutter(str(new.template_dir()), no_input=True, output_dir=str(tmp_path / "out"),
                                  extra_context={"module_name": evil})
    assert not marker.exists(), "the hook executed an answer"
    for answer, field in ((f"module_name={evil}", "module_name"), ('codec_name=a"b', "codec_name"),
                          ("module_name=os", "module_name"), ("lossless=maybe", "lossless")):
        out = subprocess.run([sys.executable, "-m", "kvcodec_sdk", "new", "--no-input", "--output-dir",
                              str(tmp_path / "cli"), answer], capture_output=True, text=True)
        assert out.returncode == 2 and f"error: {field} is" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not marker.exists() and not (tmp_path / "cli").exists()


def test_a_new_plugin_holds_no_build_artefacts(tmp_path, monkeypatch, capsys):
    """A template copy with byte-compiled files in it (an installed one whose hooks or modules
    were imported) still gives a plugin of sources only."""
    from kvcodec_sdk.cli import main

    template = tmp_path / "template"
    shutil.copytree(new.template_dir(), template)
    package = next(p for p in (template / "{{cookiecutter.distribution_name}}").iterdir()
                   if p.is_dir() and (p / "plugin.py").exists())
    for folder in (template / "hooks" / "__pycache__", package / "__pycache__"):
        folder.mkdir(exist_ok=True)
        (folder / "plugin.cpython-311.pyc").write_bytes(b"\x00\x01compiled")
    monkeypatch.setattr(new, "template_dir", lambda: template)
    assert main(["new", "--no-input", "--output-dir", str(tmp_path / "out")]) == 0
    created = Path(capsys.readouterr().out.splitlines()[0].removeprefix("created "))
    assert (created / "pyproject.toml").exists()
    leftovers = [p for p in created.rglob("*") if p.name == "__pycache__" or p.suffix in (".pyc", ".pyo")]
    assert leftovers == [], leftovers
