"""Pieces of a codec's (or a plugin's) own test suite: a fresh codec registry per test, a conftest
that leaves a plugin's suite out, saying why, when the plugin is not installed, and the marks of a
module of CUDA tests.

A plugin's ``tests/conftest.py``::

    from kvcodec_sdk.testing.support import plugin_conftest

    plugin_conftest(globals(), module="kvcodec_mycodec", distribution="kvcodec-mycodec")

A test module that wants only the registry fixture imports :func:`fresh_default_registry`; a
module of CUDA tests that uses torch starts with ``torch, pytestmark = cuda_test_module()``, one
that needs only cuda-python (:mod:`kvcodec_sdk.gpu`) with ``pytestmark = gpu_test_marks()``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Iterable

import numpy as np
import pytest

from ..registry import _reset_default_registry

__all__ = ["CANARY", "assert_blobs_match", "cuda_test_module", "encode_on_cuda", "fresh_default_registry",
           "gpu_test_marks", "plugin_conftest"]

#: The byte a fresh cold buffer is filled with, so that a write outside the destination blobs shows.
CANARY = 0xC3

#: Why a CUDA test is skipped.
NEEDS_CUDA = "needs a CUDA device and torch with CUDA"


def gpu_test_marks() -> list:
    """``pytestmark`` for a module of CUDA tests on :mod:`kvcodec_sdk.gpu` (cuda-python, no torch):
    the ``gpu`` marker, and a skip saying what is missing without a CUDA device or cuda-python."""
    from .. import gpu

    reason = gpu.unavailable_reason()
    return [pytest.mark.gpu, pytest.mark.skipif(reason is not None, reason=f"needs a CUDA device and cuda-python: {reason}")]


def cuda_test_module() -> tuple[Any, list]:
    """``(torch, pytestmark)`` for a module of CUDA tests: the tests carry the ``gpu`` marker and
    skip cleanly without a CUDA device or a CUDA build of torch; without torch the whole module is
    skipped (``pytest.importorskip``)."""
    from .. import _native

    torch = pytest.importorskip("torch")
    usable = _native.driver_info()["device_count"] > 0 and torch.cuda.is_available()
    return torch, [pytest.mark.gpu, pytest.mark.skipif(not usable, reason=NEEDS_CUDA)]


@pytest.fixture
def fresh_default_registry(monkeypatch):
    """The process-wide codec registry is rebuilt before and after the test, with no plugin
    disabled through ``KVCODEC_DISABLE_PLUGINS``."""
    monkeypatch.delenv("KVCODEC_DISABLE_PLUGINS", raising=False)
    _reset_default_registry()
    yield
    _reset_default_registry()


def plugin_conftest(namespace: dict[str, Any], *, module: str, distribution: str) -> None:
    """Makes ``namespace`` (a conftest's ``globals()``) the conftest of the tests of a plugin whose
    Python package is ``module`` and whose distribution is ``distribution``:

    - every test runs with a fresh default registry (an autouse :func:`fresh_default_registry`);
    - when ``module`` cannot be imported, the conftest's ``test_*.py`` files are not collected and
      pytest's header says why (install the plugin, e.g. ``pip install --no-build-isolation
      ./plugins/<distribution>``); under CI (the ``CI`` variable set) the import error is raised
      instead, so a broken install cannot hide behind an empty run.
    """
    try:
        importlib.import_module(module)
        missing = None
    except ImportError as exc:  # pragma: no cover - depends on the environment
        if os.environ.get("CI"):
            raise
        missing = str(exc)
        namespace["collect_ignore_glob"] = ["test_*.py"]

    def pytest_report_header(config: pytest.Config) -> str | None:
        return f"{distribution} is not installed ({missing}): its tests are not collected" if missing else None

    @pytest.fixture(autouse=True)
    def _plugin_fresh_registry(fresh_default_registry):
        yield

    namespace["pytest_report_header"] = pytest_report_header
    namespace["fresh_default_registry"] = fresh_default_registry
    namespace["_plugin_fresh_registry"] = _plugin_fresh_registry


def encode_on_cuda(codec: Any, pairs: Any, num_blobs: int, cold_kind: str, stream: Any) -> tuple[Any, np.ndarray]:
    """Encodes with a configured CUDA ``codec`` (lifecycle 0, index ``pairs`` where the codec reads
    them) into a fresh buffer of ``num_blobs`` cold blobs filled with :data:`CANARY`, in pinned host
    memory (``cold_kind="pinned"``) or device memory (``"device"``), and waits for ``stream``
    (anything with ``__cuda_stream__``: cuda.core, torch, CuPy). Returns the buffer (a
    :class:`kvcodec_sdk.gpu.DeviceArray`, which torch, CuPy and numpy wrap without a copy) and a
    host copy of its bytes, one row per blob. Needs cuda-python, not torch."""
    from .. import gpu

    if cold_kind not in ("pinned", "device"):
        raise ValueError(f"cold_kind is {cold_kind!r}; valid: 'pinned', 'device'")
    shape = (num_blobs, codec.cold_page_bytes(0))
    cold = gpu.pinned(shape) if cold_kind == "pinned" else gpu.empty(shape)
    cold.fill_bytes(CANARY)  # synchronized: the fill is done before the codec's stream starts
    codec.encode(0, cold, pairs, stream=stream)
    gpu.synchronize(stream)
    return cold, cold.numpy()


def assert_blobs_match(got: np.ndarray, want: np.ndarray, dst: Iterable[int], label: str) -> None:
    """The blobs in rows ``dst`` of ``got`` (a CUDA encode, :func:`encode_on_cuda`) equal ``want``'s
    (the CPU reference's) byte for byte, and every other row still holds only :data:`CANARY`."""
    dst = [int(d) for d in dst]
    for d in dst:
        if not np.array_equal(got[d], want[d]):
            i = int(np.flatnonzero(got[d] != want[d])[0])
            pytest.fail(f"{label}: cold slot {d}: GPU blob byte {i} is {got[d][i]:#x}, CPU blob {want[d][i]:#x}")
    untouched = sorted(set(range(len(got))) - set(dst))
    assert (got[untouched] == CANARY).all(), f"{label}: encode wrote outside its destination blobs"
