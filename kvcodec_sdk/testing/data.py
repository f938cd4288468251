"""Data that looks like a KV cache, and conversions between element bytes and float32.

Codecs that quantize or compress behave differently on real KV caches than on zeros or uniform
noise: K and V have per-channel scales that differ by orders of magnitude, a few outlier
channels, and values that change smoothly from token to token. :func:`kv_like` generates that
structure; :func:`fill_page_bytes` fills whole hot slots (every shaped buffer with KV-like
values of its dtype, everything else with non-zero bytes, never all zeros).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..layout import BufferDesc, DType, Role

__all__ = ["to_float32", "from_float32", "kv_like", "fill_page_bytes", "nonzero_bytes"]


@lru_cache(maxsize=None)
def _fp8_table(dtype: DType) -> np.ndarray:
    """float32 value of each of the 256 fp8 codes (NaN for non-finite codes)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    if dtype == DType.FLOAT8_E4M3:
        exp, man, bias, mbits = (codes >> 3) & 0xF, codes & 0x7, 7, 3
        nonfinite = (codes & 0x7F) == 0x7F  # e4m3fn: only S.1111.111 is NaN, no infinities
    else:
        exp, man, bias, mbits = (codes >> 2) & 0x1F, codes & 0x3, 15, 2
        nonfinite = exp == 0x1F
    normal = (1.0 + man / (1 << mbits)) * np.exp2(exp.astype(np.float64) - bias)
    subnormal = (man / (1 << mbits)) * np.exp2(1.0 - bias)
    value = sign * np.where(exp == 0, subnormal, normal)
    value[nonfinite] = np.nan
    return value.astype(np.float32)


def to_float32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Elements of ``dtype`` stored in the bytes ``raw`` (uint8, any shape) as float32 (flat)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    dtype = DType(dtype)
    if dtype in (DType.FLOAT8_E4M3, DType.FLOAT8_E5M2):
        return _fp8_table(dtype)[raw]
    if dtype == DType.BFLOAT16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    numpy_type = {DType.FLOAT16: np.float16, DType.FLOAT32: np.float32, DType.INT8: np.int8,
                  DType.UINT8: np.uint8, DType.INT32: np.int32}[dtype]
    return raw.view(numpy_type).astype(np.float32)


def from_float32(values: np.ndarray, dtype: DType) -> np.ndarray:
    """float32 values rounded to ``dtype`` (nearest, saturating for fp8), as flat uint8 bytes."""
    v = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    dtype = DType(dtype)
    if dtype in (DType.FLOAT8_E4M3, DType.FLOAT8_E5M2):
        table = _fp8_table(dtype)
        codes = np.flatnonzero(np.isfinite(table))
        order = np.argsort(table[codes], kind="stable")
        sorted_values, sorted_codes = table[codes][order], codes[order]
        clipped = np.clip(v, sorted_values[0], sorted_values[-1])
        hi = np.clip(np.searchsorted(sorted_values, clipped), 1, len(sorted_values) - 1)
        lo = hi - 1
        pick = np.where(clipped - sorted_values[lo] <= sorted_values[hi] - clipped, lo, hi)
        return sorted_codes[pick].astype(np.uint8)
    if dtype == DType.BFLOAT16:
        u = v.view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
        return rounded.view(np.uint8)
    if dtype == DType.FLOAT16:
        return v.astype(np.float16).view(np.uint8)
    if dtype == DType.FLOAT32:
        return v.view(np.uint8).copy()
    if dtype == DType.INT8:
        return np.clip(np.rint(v), -128, 127).astype(np.int8).view(np.uint8)
    if dtype == DType.UINT8:
        return np.clip(np.rint(v), 0, 255).astype(np.uint8)
    return np.clip(np.rint(v), -(2**31), 2**31 - 1).astype(np.int32).view(np.uint8)


def nonzero_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random bytes in 1..255: a missed copy of zeros can never look right."""
    return rng.integers(1, 256, size=n, dtype=np.uint8)


def kv_like(rng: np.random.Generator, pages: int, tokens: int, heads: int, dim: int, role: Role) -> np.ndarray:
    """float32 values shaped (pages, tokens, heads, dim) with the structure of real K or V (for
    ``Role.KEY_VALUE``: K in the even heads, V in the odd ones).

    - per-channel scales log-normally spread over about two orders of magnitude;
    - a few outlier channels (about 3%, at least one) 20-60x larger, more pronounced in K;
    - smooth token structure: a per-channel mean plus a slow random walk along tokens, so
      neighbouring tokens are correlated;
    - small independent noise on top.
    """
    if role == Role.KEY_VALUE:
        out = np.empty((pages, tokens, heads, dim), np.float32)
        out[:, :, 0::2] = kv_like(rng, pages, tokens, (heads + 1) // 2, dim, Role.KEY)
        out[:, :, 1::2] = kv_like(rng, pages, tokens, heads // 2, dim, Role.VALUE)
        return out
    scale = np.exp(rng.normal(0.0, 0.9, size=(heads, dim))).astype(np.float32)
    outliers = rng.random((heads, dim)) < 0.03
    outliers.flat[rng.integers(0, heads * dim)] = True
    boost = 60.0 if role == Role.KEY else 20.0
    scale = np.where(outliers, scale * rng.uniform(boost / 3, boost, size=(heads, dim)), scale)
    mean = rng.normal(0.0, 1.0, size=(pages, 1, heads, dim))
    walk = np.cumsum(rng.normal(0.0, 0.15, size=(pages, tokens, heads, dim)), axis=1)
    noise = rng.normal(0.0, 0.05, size=(pages, tokens, heads, dim))
    return ((mean + walk + noise) * scale).astype(np.float32)


def _buffer_values(rng: np.random.Generator, pages: int, b: BufferDesc) -> np.ndarray:
    """(pages, b.bytes) bytes for one buffer in every page."""
    shaped = b.tokens_per_page and b.num_heads and b.head_dim
    dtype = DType(b.dtype)
    if shaped and dtype in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT8_E4M3, DType.FLOAT8_E5M2):
        values = kv_like(rng, pages, b.tokens_per_page, b.num_heads, b.head_dim, Role(b.role))
        if dtype == DType.FLOAT8_E4M3:
            values = values / (np.abs(values).max() / 400.0)  # inside e4m3's range, outliers near its top
        out = from_float32(values, dtype)
    elif dtype == DType.FLOAT32 or dtype in (DType.FLOAT16, DType.BFLOAT16):
        # Opaque float buffers (e.g. block scales): positive, spread over a few octaves.
        values = np.exp(rng.normal(-3.0, 1.0, size=pages * (b.bytes // dtype.itemsize)))
        out = from_float32(values, dtype)
    else:
        out = nonzero_bytes(rng, pages * b.bytes)
    return out.reshape(pages, b.bytes)


def fill_page_bytes(rng: np.random.Generator, slot_bytes: int, num_slots: int,
                    buffers: list[BufferDesc]) -> np.ndarray:
    """(num_slots, slot_bytes) uint8 contents of one pool: each buffer (of this pool) filled as its
    role and dtype suggest, the remaining bytes with random non-zero bytes."""
    out = nonzero_bytes(rng, num_slots * slot_bytes).reshape(num_slots, slot_bytes)
    for b in buffers:
        out[:, b.byte_offset : b.byte_offset + b.bytes] = _buffer_values(rng, num_slots, b)
    return out
