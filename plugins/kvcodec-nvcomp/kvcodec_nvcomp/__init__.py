"""kvcodec_nvcomp: nvCOMP's lossless GPU codecs as kvcodec_sdk cold-page codecs.

Registers ``nvcomp-lz4``, ``nvcomp-gdeflate`` (CUDA and CPU reference) and ``nvcomp-ans``
(CUDA only) through the ``kvcodec`` entry point. See ``docs/nvcomp.md`` in the SDK.
"""

from __future__ import annotations

import ctypes
import os
from importlib.metadata import version as _version

__version__ = _version("kvcodec-nvcomp")  # one source: the distribution's metadata (pyproject.toml)


def _preload_nvcomp() -> None:
    """Loads the wheel's nvCOMP libraries by path, so the extension finds them by soname even
    where its RPATH does not lead to the wheel (editable installs, relocated environments)."""
    try:
        import nvidia.libnvcomp as wheel
    except ImportError:
        return  # RPATH or the system loader path must provide them.
    lib64 = os.path.join(os.path.dirname(wheel.__file__), "lib64")
    for name in ("libnvcomp.so.6", "libnvcomp_cpu.so.6"):
        path = os.path.join(lib64, name)
        if os.path.isfile(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)


_preload_nvcomp()

from . import _ext  # noqa: E402

FORMAT_VERSION: int = _ext.FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "__version__"]
