"""Validates the answers before anything is written: names must be usable as a registry name,
a distribution name and a Python module, in every file the template renders.

The answers reach this script as one JSON string literal (never pasted into the source as code),
and the rules live in kvcodec_sdk.commands.new (one source for the CLI and the template)."""

import json
import sys

from kvcodec_sdk.commands.new import validate_answers

answers = json.loads({{ cookiecutter | jsonify | jsonify }})
errors = validate_answers(answers)
if errors:
    for e in errors:
        print(f"kvcodec new: error: {e}", file=sys.stderr)
    sys.exit(1)
