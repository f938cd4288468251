"""pytest hooks for runs that collect the tests of several plugins (the repository's testpaths,
or the core's and both plugins' test folders in one run).

Every plugin keeps the template's `tests/test_conformance.py`, and no test folder is a package,
so pytest's default (prepend) import mode names each of those modules `test_conformance`: the
second one collected would meet the first in `sys.modules` and fail with "import file mismatch".
Before a test module is imported, a module of the same name from another file is dropped from
`sys.modules`; the one already collected keeps its module object and runs unchanged. (Here, not
at the repository root: pytest puts a conftest's folder on sys.path, and the root would make
subprocesses that inherit sys.path import the SDK's source tree.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def pytest_collectstart(collector: pytest.Collector) -> None:
    if not isinstance(collector, pytest.Module):
        return
    path = Path(collector.path)
    loaded = sys.modules.get(path.stem)
    loaded_file = getattr(loaded, "__file__", None)
    if loaded_file is not None and Path(loaded_file).resolve() != path.resolve():
        del sys.modules[path.stem]
