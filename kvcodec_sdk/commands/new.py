"""``kvcodec new``: scaffold a codec plugin from the template shipped with the SDK.

The plugin builds against the installed SDK, registers its codec through the ``kvcodec`` entry
point and passes the conformance suite as generated; replace the example transform with yours.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "new"
HELP = "scaffold a codec plugin (cookiecutter template)"

KEYS = ("codec_name", "distribution_name", "module_name", "author", "description", "page_index_location", "lossless")


def template_dir() -> Path:
    """The codec-plugin template: installed with the wheel, or in a source checkout."""
    from .. import _native

    for candidate in (
        Path(_native.__file__).resolve().parent / "templates" / "codec-plugin",
        Path(__file__).resolve().parents[2] / "templates" / "codec-plugin",
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
    answers = parse_answers(args.answers)
    try:
        out = Path(cookiecutter(str(template_dir()), no_input=args.no_input, extra_context=answers,
                                output_dir=args.output_dir, overwrite_if_exists=args.overwrite))
    except FailedHookException:
        return 1  # the template's validation hook already printed which answer is invalid
    except OutputDirExistsException as exc:
        print(f"kvcodec new: error: {exc}; pass --overwrite to replace it", file=sys.stderr)
        return 1
    codec = _codec_name(out)
    print(f"created {out}")
    print("next:")
    print(f"  pip install --no-build-isolation {out}")
    print(f"  kvcodec check {codec}")
    return 0


def _codec_name(plugin_dir: Path) -> str:
    """The codec name as the generated pyproject registers it (its ``kvcodec`` entry point)."""
    text = (plugin_dir / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.kvcodec]", 1)[1]
    return section.strip().splitlines()[0].split("=", 1)[0].strip().strip('"')
