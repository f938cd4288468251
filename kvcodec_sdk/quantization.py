"""What lossy K/V codecs share: which buffers they quantize, and the parameters that keep some lossless.

A quantizing codec (fp8, nvfp4, or one a codec author writes) quantizes the K and V buffers of a
page and copies every other buffer byte for byte. Users keep chosen roles or layers lossless (the
first and last layers are often the most sensitive) with two string parameters,
``lossless_roles`` ("key", "value", comma-separated; "other" is always lossless) and
``lossless_layers`` (comma-separated layer ids). This module holds that policy once:

- :data:`LOSSLESS_PARAMS`, the two :class:`~kvcodec_sdk.ParamSpec` entries to add to a codec's
  schema;
- :class:`QuantizingCodecSpec`, a :class:`~kvcodec_sdk.CodecSpec` whose ``validate_params`` also
  checks the lists' items, naming the codec, the parameter, the item and what is valid;
- :func:`quantizes`, the buffer policy the codec's native side implements, for the codec's
  error-bound check and its tests;
- :func:`check_buffer` and :func:`bound_violation`, the frame of a codec's ``check_error``: lossless
  buffers must match byte for byte, quantized ones are checked against the codec's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .errors import CodecParamError
from .layout import DType, Role
from .spec import CodecSpec, ParamSpec

__all__ = ["LOSSLESS_PARAMS", "ROLE_NAMES", "QuantizingCodecSpec", "bound_violation", "check_buffer", "quantizes",
           "split_list"]

#: The role names ``lossless_roles`` takes.
ROLE_NAMES: Mapping[str, Role] = {"key": Role.KEY, "value": Role.VALUE, "other": Role.OTHER}

#: ``lossless_roles`` and ``lossless_layers``: add them to a quantizing codec's parameters.
LOSSLESS_PARAMS: tuple[ParamSpec, ParamSpec] = (
    ParamSpec("lossless_roles", str, "", "Comma-separated roles stored losslessly besides 'other' (always "
              "lossless): 'key', 'value'."),
    ParamSpec("lossless_layers", str, "", "Comma-separated layer ids whose buffers are stored losslessly, e.g. "
              "'0,31'."),
)


def split_list(text: str) -> list[str]:
    """The items of a comma-separated parameter value, stripped, empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def quantizes(buffer: Any, params: Mapping[str, Any] | None, dtypes: Iterable[int]) -> bool:
    """True when a quantizing codec quantizes ``buffer`` (a :class:`~kvcodec_sdk.BufferDesc`).

    That is: its role is K, V or K-and-V (``KEY_VALUE``, lossless when ``key`` or ``value`` is
    listed) and not listed in ``params["lossless_roles"]``, its layer is not
    listed in ``params["lossless_layers"]``, its dtype is one of ``dtypes`` (the codec's
    quantizable dtypes, e.g. ``(DType.BFLOAT16, DType.FLOAT16)``) and it is shaped (tokens per
    page, heads and head dim all set). Every other buffer is copied losslessly. ``params`` are
    validated parameters (missing lists count as empty).
    """
    params = params or {}
    roles = {ROLE_NAMES[r] for r in split_list(params.get("lossless_roles", ""))} | {Role.OTHER}
    if roles & {Role.KEY, Role.VALUE}:
        roles.add(Role.KEY_VALUE)  # it holds both: kept whole when either is
    layers = {int(x) for x in split_list(params.get("lossless_layers", ""))}
    shaped = buffer.tokens_per_page > 0 and buffer.num_heads > 0 and buffer.head_dim > 0
    return (int(buffer.dtype) in {int(DType(d)) for d in dtypes} and shaped and Role(buffer.role) not in roles
            and int(buffer.layer_id) not in layers)


#: One candidate check of a quantized buffer: (x, y, shape, dtype) -> None when it holds, else where
#: and by how much it fails. ``x``/``y`` are the original and decoded elements as float32, ``shape``
#: (tokens per page, heads, head dim), ``dtype`` the buffer's DType value.
BufferCheck = Callable[[np.ndarray, np.ndarray, tuple, int], "str | None"]


def check_buffer(original: np.ndarray, decoded: np.ndarray, buffer: Any, quantized: bool,
                 checks: Iterable[BufferCheck]) -> str | None:
    """Checks one page of one buffer: the frame of a quantizing codec's ``check_error``.

    ``original``/``decoded`` are the buffer's hot bytes (uint8) before encoding and after decoding,
    ``buffer`` its :class:`~kvcodec_sdk.BufferDesc`, ``quantized`` whether the codec quantizes it
    (:func:`quantizes`). A lossless buffer must match byte for byte. A quantized one passes when any
    of ``checks`` (one per parameter set the caller accepts) holds; else the first one's problem is
    returned. Returns None when the buffer passes, else a sentence saying where it fails.
    """
    from .testing.data import to_float32

    original = np.ascontiguousarray(original, np.uint8).reshape(-1)
    decoded = np.ascontiguousarray(decoded, np.uint8).reshape(-1)
    if original.shape != decoded.shape:
        return f"decoded buffer has {decoded.size} bytes, the original {original.size}"
    if not quantized:
        if np.array_equal(original, decoded):
            return None
        i = int(np.flatnonzero(original != decoded)[0])
        return f"losslessly stored buffer differs at byte {i}: {original[i]} -> {decoded[i]}"
    dtype = int(buffer.dtype)
    shape = (int(buffer.tokens_per_page), int(buffer.num_heads), int(buffer.head_dim))
    x = to_float32(original, dtype)
    y = to_float32(decoded, dtype)
    first = None
    for check in checks:
        problem = check(x, y, shape, dtype)
        if problem is None:
            return None
        first = first or problem
    return first


def bound_violation(x: np.ndarray, y: np.ndarray, bound: np.ndarray, label: str) -> str | None:
    """The first finite element of ``x`` whose decoded ``y`` lies farther than ``bound`` (per
    element) from it, as a sentence naming the bound ``label`` (e.g. "e4m3/page_head"), or None."""
    finite = np.isfinite(x)
    err = np.abs(y[finite].astype(np.float64) - x[finite].astype(np.float64))
    over = err > bound[finite]
    if not np.any(over):
        return None
    j = int(np.flatnonzero(over)[0])
    i = int(np.flatnonzero(finite)[j])
    return (f"element {i}: |{y[i]!r} - {x[i]!r}| = {err[j]:.6g} exceeds the {label} bound "
            f"{bound[finite][j]:.6g} by {err[j] / bound[finite][j]:.4g}x")


@dataclasses.dataclass(frozen=True)
class QuantizingCodecSpec(CodecSpec):
    """A :class:`~kvcodec_sdk.CodecSpec` that also checks the items of ``lossless_roles`` and
    ``lossless_layers`` (when the codec's schema has them): roles must be 'key', 'value' or
    'other', layers non-negative integers. Subclass it for further cross-parameter checks
    (call ``super().validate_params`` first)."""

    def validate_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        out = super().validate_params(params)
        for role in split_list(out.get("lossless_roles", "")):
            if role not in ROLE_NAMES:
                raise CodecParamError(
                    f"codec {self.name!r} parameter 'lossless_roles' names {role!r}; valid roles are 'key', "
                    "'value', 'other' (comma-separated)"
                )
        for item in split_list(out.get("lossless_layers", "")):
            if not item.isdigit() or len(item) > 9:
                raise CodecParamError(
                    f"codec {self.name!r} parameter 'lossless_layers' has the item {item!r}; it must be "
                    "comma-separated non-negative layer ids, e.g. '0,31'"
                )
        return out
