"""The fp8 codec's declared error bound, in words and as a check.

For a finite element x of a quantized buffer, with s the fp32 scale of its block (s =
max(amax/Q, 2^-126), amax the largest finite |x| of the block, Q = 448 for e4m3 and 57344 for
e5m2) and y the decoded value:

    |y - x| <= max(2^-(m+1) * |x|, 2^(-k-1) * s) + (u + 2^-21) * (c * |x| + 2^-k * s) + a

where m is the fp8 mantissa width (3 for e4m3, 2 for e5m2), 2^-k its smallest subnormal
(k = 9 for e4m3, 16 for e5m2), c = 1 + 2^-(m+1) + 2^-6, u the unit roundoff of the hot dtype
(2^-8 bf16, 2^-11 fp16, 2^-24 fp32) and a its smallest positive subnormal (2^-133 bf16, 2^-24
fp16, 2^-149 fp32). The first term is half an fp8 ulp of the scaled value x/s (relative
2^-(m+1) in the normal range, the subnormal floor below it); the second covers the fp32
arithmetic and the rounding of the decoded value to the hot dtype. Saturation adds nothing:
|x/s| never exceeds Q by more than fp32 rounding. Finite input never decodes to NaN or
infinity; NaN decodes to NaN; +-Inf decodes to NaN (e4m3, which has no infinity) or +-Inf (e5m2).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvcodec_sdk.quantization import bound_violation, check_buffer
from kvcodec_sdk.testing import data

__all__ = ["ERROR_BOUND", "error_bound_of", "block_scales", "check_error", "to_float32"]

ERROR_BOUND = (
    "per finite element: |y - x| <= max(2^-(m+1)|x|, 2^(-k-1)s) + (u + 2^-21)(c|x| + 2^-k s) + a, "
    "s = max(amax/Q, 2^-126) the block's fp32 scale (amax over finite elements; Q = 448 e4m3, 57344 e5m2), "
    "m = 3 (e4m3) or 2 (e5m2) mantissa bits, 2^-k = 2^-9 (e4m3) or 2^-16 (e5m2) the smallest fp8 subnormal, "
    "c = 1 + 2^-(m+1) + 2^-6, u = 2^-8 (bf16), 2^-11 (fp16), 2^-24 (fp32), a = 2^-133 (bf16), 2^-24 (fp16), "
    "2^-149 (fp32); finite input never decodes to NaN/Inf; NaN -> NaN; +-Inf -> NaN (e4m3) or +-Inf (e5m2); "
    "lossless buffers are exact"
)

_FORMATS = {"e4m3": (3, 9, 448.0), "e5m2": (2, 16, 57344.0)}
_HOT = {  # dtype value -> (numpy dtype of the bits, unit roundoff, smallest subnormal)
    2: (np.float16, 2.0**-11, 2.0**-24),
    3: ("bf16", 2.0**-8, 2.0**-133),
    4: (np.float32, 2.0**-24, 2.0**-149),
}
_MIN_SCALE = np.float32(2.0**-126)


def to_float32(raw: np.ndarray, dtype: int) -> np.ndarray:
    """Hot bytes (uint8) of a bf16 (3), fp16 (2) or fp32 (4) buffer as float32 values."""
    if int(dtype) not in (2, 3, 4):
        raise ValueError(f"dtype is {dtype}; fp8 quantizes bf16 (3), fp16 (2) and fp32 (4) buffers")
    return data.to_float32(raw, dtype)


def block_scales(x: np.ndarray, format: str) -> np.ndarray:
    """fp32 scale of every block of ``x`` (shape (blocks, elements)), as the codec computes it."""
    q = np.float32(_FORMATS[format][2])
    finite = np.where(np.isfinite(x), np.abs(x), np.float32(0))
    amax = finite.max(axis=1).astype(np.float32)
    s = (amax / q).astype(np.float32)
    return np.maximum(s, _MIN_SCALE)


def _blocks(values: np.ndarray, shape: tuple[int, int, int], granularity: str) -> np.ndarray:
    t, h, d = shape
    v = values.reshape(t, h, d)
    if granularity == "page_head":
        return v.transpose(1, 0, 2).reshape(h, t * d)
    if granularity == "token_head":
        return v.reshape(t * h, d)
    if granularity == "page":
        return v.reshape(1, t * h * d)
    raise ValueError(f"granularity is {granularity!r}; valid values are 'page_head', 'token_head', 'page'")


def error_bound_of(x: np.ndarray, shape: tuple[int, int, int], dtype: int, format: str = "e4m3",
                   granularity: str = "page_head") -> np.ndarray:
    """The declared bound on |y - x| for every element of one page of a quantized buffer.

    ``x`` holds the float32 values of the buffer in hot order ([token][head][dim]); the result
    has the same shape (infinite where x is not finite: those elements have exact rules
    instead). Computed in float64.
    """
    m, k, _ = _FORMATS[format]
    _, u, a = _HOT[int(dtype)]
    blocks = _blocks(np.asarray(x, np.float32), shape, granularity)
    s = block_scales(blocks, format).astype(np.float64)[:, None]
    ax = np.abs(blocks.astype(np.float64))
    c = 1 + 2.0 ** -(m + 1) + 2.0**-6
    bound = np.maximum(2.0 ** -(m + 1) * ax, 2.0 ** (-k - 1) * s) + (u + 2.0**-21) * (c * ax + 2.0**-k * s) + a
    bound = np.where(np.isfinite(blocks), bound, np.inf)
    t, h, d = shape
    if granularity == "page_head":
        return bound.reshape(h, t, d).transpose(1, 0, 2).reshape(-1)
    return bound.reshape(-1)


def _check_one(x: np.ndarray, y: np.ndarray, shape, dtype: int, format: str, granularity: str) -> str | None:
    bound = error_bound_of(x, shape, dtype, format, granularity)
    finite = np.isfinite(x)
    if not np.all(np.isfinite(y[finite])):
        i = int(np.flatnonzero(finite & ~np.isfinite(y))[0])
        return f"element {i}: finite input {x[i]!r} decoded to {y[i]!r}"
    nan = np.isnan(x)
    if not np.all(np.isnan(y[nan])):
        i = int(np.flatnonzero(nan & ~np.isnan(y))[0])
        return f"element {i}: NaN input decoded to {y[i]!r}"
    inf = np.isinf(x)
    want_inf = y[inf] == x[inf] if format == "e5m2" else np.isnan(y[inf])
    if not np.all(want_inf):
        i = int(np.flatnonzero(inf)[np.flatnonzero(~want_inf)[0]])
        return f"element {i}: {x[i]!r} decoded to {y[i]!r} ({'itself' if format == 'e5m2' else 'NaN'} expected)"
    return bound_violation(x, y, bound, f"{format}/{granularity}")


def check_error(original: np.ndarray, decoded: np.ndarray, buffer: Any,
                params: Mapping[str, Any] | None = None) -> str | None:
    """The codec's ``check_error``: one page of one buffer against :data:`ERROR_BOUND`, in the frame
    of :func:`kvcodec_sdk.quantization.check_buffer` (arguments and result as there). With
    ``params`` the bound of their format and granularity is checked; without them, the bound of
    any format and granularity is accepted."""
    from .plugin import quantizes  # the policy lives beside the spec

    params = dict(params or {})
    formats = [params["format"]] if "format" in params else list(_FORMATS)
    grans = [params["granularity"]] if "granularity" in params else ["token_head", "page_head", "page"]
    checks = [lambda x, y, shape, dtype, f=f, g=g: _check_one(x, y, shape, dtype, f, g) for f in formats for g in grans]
    return check_buffer(original, decoded, buffer, quantizes(buffer, params), checks)
