"""Sphinx configuration of the kvcodec_sdk documentation site.

Why Sphinx: the public docstrings are already written with Sphinx roles (``:class:``, ``:meth:``,
``:func:``) and reStructuredText tables, which Sphinx's autodoc renders as they are; and the
libraries this SDK sits next to, PyTorch, CuPy, Numba and cuda-python, document with Sphinx, so
their users know its layout, search and cross-references. MyST keeps the guides in Markdown.

Build (strict: every warning, unresolved cross-reference included, fails the build)::

    sphinx-build -E -W --keep-going -n -b html docs docs/_build/html

The API reference imports the installed ``kvcodec_sdk`` (its compiled module included): build
after installing the package. The CLI reference is generated from ``kvcodec``'s argparse parser
by ``_ext/kvcodec_cli.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kvcodec_sdk

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "kvcodec_sdk"
author = "kvcodec_sdk contributors"
copyright = "kvcodec_sdk contributors"
release = kvcodec_sdk.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "kvcodec_cli",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
# The guides link to repository files outside docs/ (headers, sources, examples): those links
# are rewritten to the repository browser when one is configured, and checked to exist here.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# API reference: the documented names are the public ones (``kvcodec_sdk.X``), in source order.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True

# Strict: an unresolved reference is a warning, and the build runs with -W.
nitpicky = True
# The build runs offline, so there is no intersphinx inventory of the standard library or numpy:
# type hints naming them stay plain text. So do the annotations naming private helpers
# (``_Region``, a TypeVar, the compiled module's codec type). Everything of this project must
# resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|os|pathlib|enum|typing|collections\.abc|faulthandler|abc|subprocess)(\..*)?"),
    (r"py:class", r".*\._\w+"),
    (r"py:class", r"pybind11_builtins\..*"),  # the base of the compiled module's classes
    (r"py:class", r"(kvcodec_sdk\.testing\.clauses\.F|NativeCodec|kvcodec_sdk\.testing\.harness\.ColdBuffer)"),
]

html_theme = "furo"
html_title = f"kvcodec_sdk {release}"
html_static_path: list[str] = []


def _resolve_short_name(app, env, node, contnode):
    """A docstring's ``:class:`PendingMigration``` written in the module that defines the name, but
    rendered on a page of the public namespace (``kvcodec_sdk.KVCacheManager``), resolves to the
    one documented object with that name; none or several stay unresolved (and fail the build)."""
    if node.get("refdomain") != "py" or node.get("refspecific"):
        return None
    domain = env.get_domain("py")
    target = node["reftarget"].lstrip("~")
    matches = domain.find_obj(env, node.get("py:module"), node.get("py:class"), target,
                              node["reftype"], 1)
    # A class documented under a public name is also registered under its defining module's name
    # (an alias of the same entry): count each object once.
    matches = [m for m in matches if not m[1].aliased]
    if len(matches) != 1:
        return None
    node = node.deepcopy()
    node["reftarget"] = matches[0][0]
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], matches[0][0], node, contnode)


def setup(app):
    app.connect("missing-reference", _resolve_short_name)

