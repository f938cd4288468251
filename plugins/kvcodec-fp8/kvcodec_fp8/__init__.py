"""kvcodec_fp8: the ``fp8`` KV-cache cold-page codec, a kvcodec_sdk plugin.

Hot bf16/fp16/fp32 K and V buffers are quantized to e4m3 (or e5m2) with fp32 scales stored in
the blob; other buffers are copied losslessly into the same blob. Select it with
``kvcodec_sdk.create_codec("fp8", {...})``; the parameters and the blob format are documented in
``docs/fp8.md`` of kvcodec_sdk and in :mod:`kvcodec_fp8.plugin`.
"""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("kvcodec-fp8")  # one source: the distribution's metadata (pyproject.toml)

#: The blob format version (kFormatVersion of csrc/format.h): the registry refuses the plugin
#: when the native factory reports another.
FORMAT_VERSION = 1

from .bound import check_error, error_bound_of  # noqa: E402
from .plugin import SPEC  # noqa: E402

__all__ = ["FORMAT_VERSION", "SPEC", "check_error", "error_bound_of", "__version__"]
