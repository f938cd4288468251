"""Validates the answers before anything is written: names must be usable as a registry name,
a distribution name and a Python module, in every file the template renders."""

import re
import sys

codec = "{{ cookiecutter.codec_name }}"
distribution = "{{ cookiecutter.distribution_name }}"
module = "{{ cookiecutter.module_name }}"

errors = []
if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", codec):
    errors.append(
        f"codec_name is {codec!r}; use lowercase letters, digits and single hyphens, starting with a letter "
        "(e.g. 'lz-2bit')"
    )
if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", distribution):
    errors.append(f"distribution_name is {distribution!r}; it must be a valid Python distribution name")
if not re.fullmatch(r"[a-z_][a-z0-9_]*", module) or module in {"kvcodec_sdk", "kvcodec"}:
    errors.append(f"module_name is {module!r}; it must be a lowercase Python identifier other than kvcodec_sdk")
if errors:
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
