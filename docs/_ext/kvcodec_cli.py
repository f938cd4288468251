"""The ``kvcodec-cli`` directive: the CLI reference, generated from ``kvcodec``'s argparse parser.

One section per command and subcommand (``kvcodec bench concat`` ...), each with the command's
description and its ``--help`` text as argparse prints it, so the reference cannot drift from
the parser (``kvcodec_sdk.cli.build_parser``). The help is formatted at a fixed width so the
build is the same on every terminal.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

#: Columns argparse formats the help for (it reads $COLUMNS through shutil.get_terminal_size).
HELP_WIDTH = 100


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser``, depth first, with its command path (``("bench", "disk")``)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def help_text(parser: argparse.ArgumentParser) -> str:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)
    try:
        return parser.format_help().rstrip()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


class KvcodecCliDirective(SphinxDirective):
    """Renders every command of the parser as a section with its help."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from kvcodec_sdk.cli import build_parser

        out: list[nodes.Node] = []
        for path, parser in walk(build_parser()):
            name = " ".join(("kvcodec", *path))
            section = nodes.section(ids=[nodes.make_id("cli-" + "-".join(path or ("kvcodec",)))])
            section["names"].append(nodes.fully_normalize_name(name))
            section += nodes.title(text=name)
            section += nodes.literal_block(text=help_text(parser), language="text")
            self.state.document.note_implicit_target(section, section)
            out.append(section)
        return out


def setup(app: Sphinx) -> dict:
    app.add_directive("kvcodec-cli", KvcodecCliDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
