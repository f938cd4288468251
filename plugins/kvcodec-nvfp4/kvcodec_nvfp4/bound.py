"""The nvfp4 codec's declared error bound, in words and as a check.

For a finite element x of a quantized buffer, with S the fp32 scale of its group (a head of the
page or the whole page: S = max(amax_group / 2688, 2^-126)), bs its block's effective scale
(bs = e4m3(amax_block / (6 S)) * S, the e4m3 value rounded to nearest even and saturated at 448)
and y the decoded value:

    |y - x| <= (1 + 2u) * max(|x| / 5, bs / 4) + (2u + 2^-21) * |x| + 2^-7 * S + a

where u is the unit roundoff of the hot dtype (2^-8 bf16, 2^-11 fp16) and a its smallest positive
subnormal (2^-133 bf16, 2^-24 fp16). The first term is e2m1's rounding: a scaled value v = |x|/bs
is off by at most max(v/5, 1/4) (the worst ties, 1.25 -> 1, 2.5 -> 2, 5 -> 4, are 20%; below 1 half
a step of 0.5), and rounding the block scale to e4m3 makes v at most 6.4 where e2m1 saturates at
6, still within v/5. The 2^-7 S term covers blocks whose scale is an e4m3 subnormal or zero
(amax_block below 6 * 2^-6 * S). The rest is fp32 arithmetic and the rounding of y to the hot
dtype. Decoded values saturate at the hot dtype's largest finite value, so finite input never
decodes to infinity; NaN decodes to +0; +-Inf decodes to +-6 bs (the block's largest magnitude,
+-0 when bs is 0). amax is taken over finite elements.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvcodec_sdk.quantization import bound_violation, check_buffer
from kvcodec_sdk.testing import data

__all__ = ["ERROR_BOUND", "to_float32", "group_scales", "block_scales", "error_bound_of", "check_error"]

ERROR_BOUND = (
    "per finite element: |y - x| <= (1 + 2u) max(|x|/5, bs/4) + (2u + 2^-21)|x| + 2^-7 S + a, "
    "S = max(amax_group/2688, 2^-126) the fp32 scale of the element's head (page_head) or page (page), "
    "bs = e4m3_rne_satfinite(amax_block/(6S)) * S the scale of its 16-element block (amax over finite "
    "elements), u = 2^-8 (bf16), 2^-11 (fp16), a = 2^-133 (bf16), 2^-24 (fp16); finite input never decodes "
    "to NaN/Inf (saturates at the dtype's largest finite value); NaN -> +0; +-Inf -> +-6 bs; lossless "
    "buffers are exact"
)

_HOT = {2: (2.0**-11, 2.0**-24), 3: (2.0**-8, 2.0**-133)}  # dtype -> (unit roundoff, smallest subnormal)
_MIN_SCALE = np.float32(2.0**-126)
GRANULARITIES = ("page_head", "page")


def to_float32(raw: np.ndarray, dtype: int) -> np.ndarray:
    """Hot bytes (uint8) of a bf16 (3) or fp16 (2) buffer as float32 values."""
    if int(dtype) not in (2, 3):
        raise ValueError(f"dtype is {dtype}; nvfp4 quantizes bf16 (3) and fp16 (2) buffers")
    return data.to_float32(raw, dtype)


def _e4m3_value_rne(t: np.ndarray) -> np.ndarray:
    """Non-negative float32 t rounded to e4m3fn (nearest even, saturating at 448), as float32."""
    t = np.minimum(np.asarray(t, np.float32), np.float32(448))
    bits = t.view(np.uint32).astype(np.uint64)
    sub = t < np.float32(2.0**-6)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20 << 20
    normal = np.minimum(rounded, 0x43E00000).astype(np.uint32).view(np.float32)
    return np.where(sub, np.rint(t * np.float32(512)) / np.float32(512), normal).astype(np.float32)


def _rows(x: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    t, h, d = shape
    return np.asarray(x, np.float32).reshape(t, h, d)


def group_scales(x: np.ndarray, shape: tuple[int, int, int], granularity: str) -> np.ndarray:
    """S of every element's group, broadcast to shape (T, H, 1)."""
    v = _rows(x, shape)
    finite = np.where(np.isfinite(v), np.abs(v), np.float32(0))
    amax = finite.max(axis=(0, 2), keepdims=True) if granularity == "page_head" else finite.max(keepdims=True)
    s = (amax.astype(np.float32) / np.float32(2688)).astype(np.float32)
    return np.broadcast_to(np.maximum(s, _MIN_SCALE), (shape[0], shape[1], 1))


def block_scales(x: np.ndarray, shape: tuple[int, int, int], granularity: str) -> tuple[np.ndarray, np.ndarray]:
    """(bs, S) of every element, each of shape (T, H, D), as the codec computes them."""
    t, h, d = shape
    v = _rows(x, shape)
    s = group_scales(x, shape, granularity)
    blocks = -(-d // 16)
    padded = np.zeros((t, h, blocks * 16), np.float32)
    padded[:, :, :d] = np.where(np.isfinite(v), np.abs(v), np.float32(0))
    amax = padded.reshape(t, h, blocks, 16).max(axis=3)
    ratio = (amax / (s * np.float32(6))).astype(np.float32)
    bs = (_e4m3_value_rne(ratio) * s).astype(np.float32)
    return np.repeat(bs, 16, axis=2)[:, :, :d], np.broadcast_to(s, shape)


def error_bound_of(x: np.ndarray, shape: tuple[int, int, int], dtype: int,
                   granularity: str = "page_head") -> np.ndarray:
    """The declared bound on |y - x| of every element of one page of a quantized buffer (hot
    order, flat; infinite where x is not finite: those elements have exact rules instead)."""
    u, a = _HOT[int(dtype)]
    bs, s = block_scales(x, shape, granularity)
    ax = np.abs(np.asarray(x, np.float64).reshape(shape))
    bs64, s64 = bs.astype(np.float64), s.astype(np.float64)
    bound = (1 + 2 * u) * np.maximum(ax / 5, bs64 / 4) + (2 * u + 2.0**-21) * ax + 2.0**-7 * s64 + a
    return np.where(np.isfinite(ax), bound, np.inf).reshape(-1)


def _check_one(x: np.ndarray, y: np.ndarray, shape, dtype: int, granularity: str) -> str | None:
    if not np.all(np.isfinite(y)):
        i = int(np.flatnonzero(~np.isfinite(y))[0])
        return f"element {i}: {x[i]!r} decoded to {y[i]!r} (nvfp4 never decodes to NaN or infinity)"
    nan = np.isnan(x)
    if np.any(y[nan] != 0):
        i = int(np.flatnonzero(nan & (y != 0))[0])
        return f"element {i}: NaN decoded to {y[i]!r} (0 expected)"
    bs, _ = block_scales(x, shape, granularity)
    bs = bs.reshape(-1)
    inf = np.isinf(x)
    limit = 65504.0 if int(dtype) == 2 else 3.3895313892515355e38  # decoded values saturate here
    want = np.clip(np.sign(x[inf]) * 6.0 * bs[inf].astype(np.float64), -limit, limit)
    if inf.any() and not np.allclose(y[inf], want, rtol=2.0 ** -7, atol=0):
        i = int(np.flatnonzero(inf)[np.flatnonzero(~np.isclose(y[inf], want, rtol=2.0**-7, atol=0))[0]])
        return f"element {i}: {x[i]!r} decoded to {y[i]!r} (+-6 times the block scale {float(bs[i])!r} expected)"
    bound = error_bound_of(x, shape, dtype, granularity)
    return bound_violation(x, y, bound, f"nvfp4/{granularity}")


def check_error(original: np.ndarray, decoded: np.ndarray, buffer: Any,
                params: Mapping[str, Any] | None = None) -> str | None:
    """nvfp4's ``check_error`` (:func:`kvcodec_sdk.quantization.check_buffer` gives the arguments and
    the result): a quantized buffer is held to :data:`ERROR_BOUND` of ``params["granularity"]``, or
    of either granularity without ``params``; a lossless one must match byte for byte."""
    from .plugin import quantizes  # the policy lives beside the spec

    params = dict(params or {})
    grans = [params["granularity"]] if "granularity" in params else GRANULARITIES
    checks = [lambda x, y, shape, dtype, g=g: _check_one(x, y, shape, dtype, g) for g in grans]
    return check_buffer(original, decoded, buffer, quantizes(buffer, params), checks)
