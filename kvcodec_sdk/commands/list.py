"""``kvcodec list``: the registered codecs."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from . import _ui

NAME = "list"
HELP = "list registered codecs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output with parameter schemas")


def run(args: argparse.Namespace) -> int:
    from ..registry import default_registry

    registry = default_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # broken plugins are listed below instead
        specs = registry.list_codecs()
        broken = registry.broken_plugins
    if args.json:
        print(json.dumps({"codecs": [s.to_json() for s in specs], "broken_plugins": broken}, indent=2))
        return 0
    rows = [("NAME", "VERSION", "FORMAT", "LOSSLESS / ERROR BOUND", "DEVICES", "DESCRIPTION")]
    for s in specs:
        rows.append((s.name, s.version, str(s.format_version), "lossless" if s.lossless else str(s.error_bound),
                     ",".join(s.devices), s.description))
    if _ui.rich_stdout():
        # A lossy codec's error bound can be a paragraph: one clipped line here, in full with --json.
        _ui.console().print(_ui.rich_table([h.lower() for h in rows[0]], [list(r) for r in rows[1:]], clip={3: 28}))
        if any(not s.lossless for s in specs):
            _ui.console().print("error bounds in full: kvcodec list --json", style="dim")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5])
    for name, reason in broken.items():
        print(f"warning: plugin {name!r} failed to load: {reason}", file=sys.stderr)
    return 0


