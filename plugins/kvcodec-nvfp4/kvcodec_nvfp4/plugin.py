"""Registration of the ``nvfp4`` codec: its spec, parameters and buffer policy."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import kvcodec_sdk as kv
from kvcodec_sdk import quantization

from . import FORMAT_VERSION, __version__, _ext
from .bound import ERROR_BOUND, check_error

__all__ = ["SPEC", "Nvfp4CodecSpec", "quantizes", "kvcodec_register_codecs"]

_HALF_DTYPES = (kv.DType.BFLOAT16, kv.DType.FLOAT16)


def quantizes(buffer: Any, params: Mapping[str, Any] | None = None) -> bool:
    """True when the codec quantizes ``buffer`` (a BufferDesc) under ``params``: role K, V or both,
    dtype bf16/fp16, shaped, and neither its role in ``lossless_roles`` nor its layer in
    ``lossless_layers`` (:func:`kvcodec_sdk.quantization.quantizes`). Every other buffer is
    copied losslessly."""
    return quantization.quantizes(buffer, params, _HALF_DTYPES)


@dataclasses.dataclass(frozen=True)
class Nvfp4CodecSpec(quantization.QuantizingCodecSpec):
    """The nvfp4 spec: the SDK's checks plus the lossless lists' items."""


_PARAMS = (
    kv.ParamSpec("granularity", str, "page_head", "One fp32 scale per 'page_head' (all tokens of one head of a "
                 "page) or per 'page' (the whole buffer of a page); the e4m3 block scales (one per 16 elements "
                 "along head_dim) are relative to it.", choices=("page_head", "page")),
    *quantization.LOSSLESS_PARAMS,
)

SPEC = Nvfp4CodecSpec(
    name="nvfp4", version=__version__, format_version=FORMAT_VERSION,
    description="NVFP4 (e2m1 values, e4m3 scales per 16 elements, fp32 scales) quantization of bf16/fp16 K/V "
    "buffers; other buffers lossless",
    lossless=False, error_bound=ERROR_BOUND, check_error=check_error,
    factory=_ext.codec_factory, params=_PARAMS,  # devices: CPU reference and CUDA (the default)
)


@kv.hookimpl
def kvcodec_register_codecs(registry: kv.CodecRegistry) -> None:
    """Registers the nvfp4 codec."""
    registry.register(SPEC)
