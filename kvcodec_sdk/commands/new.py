"""``kvcodec new``: scaffold a codec plugin from the template shipped with the SDK.

The plugin builds against the installed SDK, registers its codec through the ``kvcodec`` entry
point and passes the conformance suite as generated; replace the example transform with yours.
"""

from __future__ import annotations

import argparse
import keyword
import re
import shutil
import sys
from pathlib import Path

NAME = "new"
HELP = "scaffold a codec plugin (cookiecutter template)"

KEYS = ("codec_name", "distribution_name", "module_name", "author", "description", "page_index_location", "lossless")


_CODEC_RE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
_DIST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_MODULE_RE = re.compile(r"[a-z_][a-z0-9_]*")
_CHOICES = {"page_index_location": ("device", "host"), "lossless": ("yes", "no")}


def validate_answers(answers: dict) -> list[str]:
    """Every problem with the template's answers, one line each (empty when they are valid).

    Names must be usable as a registry name, a distribution name and a Python module in every
    file the template renders; free text must be one printable line without backslashes (the
    template escapes quotes where it renders it)."""
    errors = []
    codec = answers.get("codec_name")
    if codec is not None and not (isinstance(codec, str) and _CODEC_RE.fullmatch(codec) and len(codec) <= 64):
        errors.append(f"codec_name is {codec!r}; use lowercase letters, digits and single hyphens, starting with a "
                      "letter, at most 64 characters (e.g. 'lz-2bit')")
    dist = answers.get("distribution_name")
    if dist is not None and not (isinstance(dist, str) and _DIST_RE.fullmatch(dist)):
        errors.append(f"distribution_name is {dist!r}; it must be a valid Python distribution name "
                      "(letters, digits, '.', '_', '-'; e.g. 'kvcodec-lz-2bit')")
    module = answers.get("module_name")
    if module is not None:
        if not (isinstance(module, str) and _MODULE_RE.fullmatch(module)):
            errors.append(f"module_name is {module!r}; it must be a lowercase Python identifier (e.g. 'kvcodec_lz_2bit')")
        elif module in {"kvcodec_sdk", "kvcodec"} or module in getattr(sys, "stdlib_module_names", ()) \
                or keyword.iskeyword(module):
            errors.append(f"module_name is {module!r}, which names the SDK, a standard-library module or a Python "
                          "keyword; choose another (e.g. 'kvcodec_lz_2bit')")
    for key in ("author", "description"):
        text = answers.get(key)
        if text is not None and (not isinstance(text, str) or not text.isprintable() or "\\" in text
                                 or len(text) > 200):
            errors.append(f"{key} is {text!r}; it must be one printable line of at most 200 characters without "
                          "backslashes")
    for key, valid in _CHOICES.items():
        value = answers.get(key)
        if value is not None and not isinstance(value, list) and value not in valid:
            errors.append(f"{key} is {value!r}; valid values: {', '.join(valid)}")
    return errors


def template_dir() -> Path:
    """The codec-plugin template: from the source checkout this package runs from (an editable
    install), else the copy installed with the wheel."""
    from .. import _native

    for candidate in (
        Path(__file__).resolve().parents[2] / "templates" / "codec-plugin",
        Path(_native.__file__).resolve().parent / "templates" / "codec-plugin",
    ):
        if (candidate / "cookiecutter.json").is_file():
            return candidate
    raise FileNotFoundError("the codec-plugin template is not installed with this kvcodec_sdk; reinstall it")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("answers", nargs="*", metavar="KEY=VALUE",
                   help=f"answers to the template's questions; keys: {', '.join(KEYS)}")
    p.add_argument("--no-input", action="store_true", help="do not prompt; use the answers given and the defaults")
    p.add_argument("--output-dir", default=".", help="where the plugin folder is created (default: .)")
    p.add_argument("--overwrite", action="store_true", help="overwrite an existing plugin folder")


def parse_answers(items: list[str]) -> dict[str, str]:
    answers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"answer {item!r} is not KEY=VALUE; keys: {', '.join(KEYS)}")
        if key not in KEYS:
            raise ValueError(f"unknown template question {key!r}; valid keys: {', '.join(KEYS)}")
        answers[key] = value
    return answers


def run(args: argparse.Namespace) -> int:
    try:
        from cookiecutter.exceptions import FailedHookException, OutputDirExistsException
        from cookiecutter.main import cookiecutter
    except ImportError:
        print("kvcodec new needs cookiecutter: pip install 'kvcodec-sdk[new]' (or pip install cookiecutter)",
              file=sys.stderr)
        return 2
    try:
        answers = parse_answers(args.answers)
    except ValueError as exc:
        print(f"kvcodec new: error: {exc}", file=sys.stderr)
        return 2
    problems = validate_answers(answers)
    if problems:
        for problem in problems:
            print(f"kvcodec new: error: {problem}", file=sys.stderr)
        return 2
    try:
        out = Path(cookiecutter(str(template_dir()), no_input=args.no_input, extra_context=answers,
                                output_dir=args.output_dir, overwrite_if_exists=args.overwrite))
    except FailedHookException:
        return 1  # the template's validation hook already printed which answer is invalid
    except OutputDirExistsException as exc:
        print(f"kvcodec new: error: {exc}; pass --overwrite to replace it", file=sys.stderr)
        return 1
    _remove_build_artefacts(out)
    codec = _codec_name(out)
    print(f"created {out}")
    print("next:")
    print(f"  pip install --no-build-isolation {out}")
    print(f"  kvcodec check {codec}")
    return 0


def _remove_build_artefacts(plugin_dir: Path) -> None:
    """Deletes byte-compiled files a template copy may carry (``__pycache__``, ``*.pyc``): a new
    plugin holds sources only."""
    for cache in sorted(plugin_dir.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)
    for compiled in plugin_dir.rglob("*.py[co]"):
        compiled.unlink(missing_ok=True)


def _codec_name(plugin_dir: Path) -> str:
    """The codec name as the generated pyproject registers it (its ``kvcodec`` entry point)."""
    text = (plugin_dir / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.kvcodec]", 1)[1]
    return section.strip().splitlines()[0].split("=", 1)[0].strip().strip('"')
