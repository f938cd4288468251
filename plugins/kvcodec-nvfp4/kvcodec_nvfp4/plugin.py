"""Registration of the ``nvfp4`` codec: its spec, parameters and buffer policy."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import kvcodec_sdk as kv
from kvcodec_sdk.errors import CodecParamError

from . import FORMAT_VERSION, __version__, _ext
from .bound import ERROR_BOUND, check_error

__all__ = ["SPEC", "Nvfp4CodecSpec", "quantizes", "kvcodec_register_codecs"]

_ROLES = {"key": kv.Role.KEY, "value": kv.Role.VALUE, "other": kv.Role.OTHER}
_HALF_DTYPES = (kv.DType.BFLOAT16, kv.DType.FLOAT16)


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def quantizes(buffer: Any, params: Mapping[str, Any] | None = None) -> bool:
    """True when the codec quantizes ``buffer`` (a BufferDesc) under ``params``: role K or V,
    dtype bf16/fp16, shaped (tokens, heads, head dim all set), and neither its role in
    ``lossless_roles`` nor its layer in ``lossless_layers``. Every other buffer is copied
    losslessly."""
    params = params or {}
    roles = {_ROLES[r] for r in _split(params.get("lossless_roles", ""))} | {kv.Role.OTHER}
    layers = {int(x) for x in _split(params.get("lossless_layers", ""))}
    shaped = buffer.tokens_per_page > 0 and buffer.num_heads > 0 and buffer.head_dim > 0
    return (int(buffer.dtype) in _HALF_DTYPES and shaped and kv.Role(buffer.role) not in roles
            and int(buffer.layer_id) not in layers)


@dataclasses.dataclass(frozen=True)
class Nvfp4CodecSpec(kv.CodecSpec):
    """The nvfp4 spec: the SDK's checks plus the list-valued parameters' contents."""

    def validate_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        out = super().validate_params(params)
        for role in _split(out["lossless_roles"]):
            if role not in _ROLES:
                raise CodecParamError(
                    f"codec 'nvfp4' parameter 'lossless_roles' names {role!r}; valid roles are 'key', 'value', "
                    "'other' (comma-separated)"
                )
        for item in _split(out["lossless_layers"]):
            if not item.isdigit() or len(item) > 9:
                raise CodecParamError(
                    f"codec 'nvfp4' parameter 'lossless_layers' has the item {item!r}; it must be comma-separated "
                    "non-negative layer ids, e.g. '0,31'"
                )
        return out


_PARAMS = (
    kv.ParamSpec("granularity", str, "page_head", "One fp32 scale per 'page_head' (all tokens of one head of a "
                 "page) or per 'page' (the whole buffer of a page); the e4m3 block scales (one per 16 elements "
                 "along head_dim) are relative to it.", choices=("page_head", "page")),
    kv.ParamSpec("lossless_roles", str, "", "Comma-separated roles stored losslessly besides 'other' (always "
                 "lossless): 'key', 'value'."),
    kv.ParamSpec("lossless_layers", str, "", "Comma-separated layer ids whose buffers are stored losslessly, e.g. "
                 "'0,31'."),
)

SPEC = Nvfp4CodecSpec(
    name="nvfp4",
    description="NVFP4 (e2m1 values, e4m3 scales per 16 elements, fp32 scales) quantization of bf16/fp16 K/V "
    "buffers; other buffers lossless",
    version=__version__,
    format_version=FORMAT_VERSION,
    lossless=False,
    error_bound=ERROR_BOUND,
    check_error=check_error,
    factory=_ext.codec_factory,
    devices=("cpu", "cuda"),
    params=_PARAMS,
)


@kv.hookimpl
def kvcodec_register_codecs(registry: kv.CodecRegistry) -> None:
    """Registers the nvfp4 codec."""
    registry.register(SPEC)
