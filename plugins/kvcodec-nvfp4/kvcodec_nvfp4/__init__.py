"""kvcodec-nvfp4: NVFP4 (e2m1 values, e4m3 block scales per 16 elements, fp32 scales) quantization of K/V buffers; other buffers lossless

The codec registers itself with kvcodec through the ``kvcodec`` entry point; use it by name::

    import kvcodec_sdk
    codec = kvcodec_sdk.create_codec("nvfp4", device="cuda")
"""

from .plugin import SPEC

__all__ = ["SPEC"]
__version__ = SPEC.version
