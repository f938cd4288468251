"""kvcodec_nvfp4: the ``nvfp4`` KV-cache cold-page codec, a kvcodec_sdk plugin.

Hot bf16/fp16 K and V buffers are stored as NVFP4 (4-bit e2m1 values, an e4m3 scale per 16
elements along head_dim, an fp32 scale per head of the page or per page); other buffers are copied
losslessly into the same blob. The codec registers itself with kvcodec through the ``kvcodec``
entry point; use it by name::

    import kvcodec_sdk
    codec = kvcodec_sdk.create_codec("nvfp4", {"granularity": "page_head"}, device="cuda")

The parameters, the blob format and the error bound are documented in ``docs/nvfp4.md`` of
kvcodec_sdk and in the plugin's README.
"""

from __future__ import annotations

from importlib.metadata import version as _version

__version__ = _version("kvcodec-nvfp4")  # one source: the distribution's metadata (pyproject.toml)

#: The blob format version (kFormatVersion of csrc/codec.h): the registry refuses the plugin when
#: the native factory reports another.
FORMAT_VERSION = 1

from .bound import check_error, error_bound_of  # noqa: E402
from .plugin import SPEC  # noqa: E402

__all__ = ["FORMAT_VERSION", "SPEC", "check_error", "error_bound_of", "__version__"]
