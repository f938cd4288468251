"""Registration of the ``fp8`` codec: its spec, parameters and buffer policy."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import kvcodec_sdk as kv
from kvcodec_sdk import quantization
from kvcodec_sdk.errors import CodecParamError

from . import FORMAT_VERSION, __version__, _ext
from .bound import ERROR_BOUND, check_error

__all__ = ["SPEC", "Fp8CodecSpec", "quantizes", "kvcodec_register_codecs"]

_FLOAT_DTYPES = (kv.DType.BFLOAT16, kv.DType.FLOAT16, kv.DType.FLOAT32)


def quantizes(buffer: Any, params: Mapping[str, Any] | None = None) -> bool:
    """True when the codec quantizes ``buffer`` (a BufferDesc) under ``params``: role K, V or both,
    dtype bf16/fp16/fp32, shaped, and neither its role in ``lossless_roles`` nor its layer in
    ``lossless_layers`` (:func:`kvcodec_sdk.quantization.quantizes`). Every other buffer is
    copied losslessly."""
    return quantization.quantizes(buffer, params, _FLOAT_DTYPES)


@dataclasses.dataclass(frozen=True)
class Fp8CodecSpec(quantization.QuantizingCodecSpec):
    """The fp8 spec: the SDK's checks, the lossless lists' items, and the tuning knobs' combinations."""

    def validate_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        out = super().validate_params(params)
        if out["kernel"] == "v1" and (out["small_blocks"] != "wide" or out["finite_check"] != "element"):
            raise CodecParamError(
                f"codec 'fp8' parameters small_blocks={out['small_blocks']!r} and finite_check={out['finite_check']!r} "
                "need a tunable kernel; 'kernel' is 'v1' (use 'auto', 'b2', 'b4' or 'tile', or small_blocks='wide' "
                "and finite_check='element')"
            )
        return out


_PARAMS = (
    kv.ParamSpec("format", str, "e4m3", "fp8 format of quantized elements: 'e4m3' (OCP e4m3fn, max 448, 3 mantissa "
                 "bits) or 'e5m2' (max 57344, 2 mantissa bits, keeps infinities).", choices=("e4m3", "e5m2")),
    kv.ParamSpec("granularity", str, "page_head", "One fp32 scale per 'page_head' (all tokens of one head of a page), "
                 "'token_head' (one token of one head) or 'page' (the whole buffer of a page).",
                 choices=("page_head", "token_head", "page")),
    *quantization.LOSSLESS_PARAMS,
    # Tuning knobs of the CUDA kernel (docs/fp8.md, Performance): they never change a blob byte
    # and the CPU reference ignores them.
    kv.ParamSpec("kernel", str, "auto", "Tuning knob, blobs unchanged: CUDA kernel variant. 'auto' (b4 for encodes "
                 "into device memory, tile for decodes and for encodes into host memory, when tile takes every "
                 "quantized buffer), 'v1' (2 blocks/SM, 128 B per lane cached; takes small_blocks='wide' and "
                 "finite_check='element'), 'b2' (2 blocks/SM, 128 B per lane, large blocks streamed in batches), 'b4' "
                 "(4 blocks/SM, 64 B per lane, batched), 'tile' (one thread block per tile of whole scale blocks staged "
                 "in shared memory; its other buffers run b4's warp code).", choices=("auto", "v1", "b2", "b4", "tile"),
                 affects_blob=False),
    kv.ParamSpec("small_blocks", str, "deep", "Tuning knob, blobs unchanged: 'wide' (a warp unit is one round of "
                 "blocks) or 'deep' (blocks of at most one access per lane are packed several rounds per warp "
                 "unit); 'deep' needs a kernel other than 'v1'.", choices=("wide", "deep"), affects_blob=False),
    kv.ParamSpec("finite_check", str, "block", "Tuning knob, blobs unchanged: look for NaN/Inf per 'element' or "
                 "once per 'block' (exact per-element handling only where one is found); 'block' needs a kernel "
                 "other than 'v1'.", choices=("element", "block"), affects_blob=False),
)

SPEC = Fp8CodecSpec(
    "fp8", "FP8 (e4m3/e5m2) quantization of K/V buffers with fp32 scales; other buffers lossless",
    __version__, FORMAT_VERSION, lossless=False, factory=_ext.codec_factory, params=_PARAMS,
    error_bound=ERROR_BOUND, check_error=check_error,  # devices: CPU reference and CUDA (the default)
)


@kv.hookimpl
def kvcodec_register_codecs(registry):
    registry.register(SPEC)
