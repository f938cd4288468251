"""An independent numpy model of the fp8 blob format 1, for the tests.

It shares no code with the codec: the fp8 conversion is ml_dtypes' (saturation by clipping to
the largest finite value first, which is what round-to-nearest-even with saturation gives), the
output rounding numpy's / ml_dtypes', and the layout rules are re-derived from docs/fp8.md.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvcodec_sdk import DType, Role

FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
ALIGN = 16


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def quantizes(b, params) -> bool:
    roles = {"key": Role.KEY, "value": Role.VALUE, "other": Role.OTHER}
    lossless = {roles[r.strip()] for r in params.get("lossless_roles", "").split(",") if r.strip()} | {Role.OTHER}
    if lossless & {Role.KEY, Role.VALUE}:  # a K-and-V buffer holds both roles
        lossless.add(Role.KEY_VALUE)
    layers = {int(x) for x in params.get("lossless_layers", "").split(",") if x.strip()}
    return (b.dtype in (DType.BFLOAT16, DType.FLOAT16, DType.FLOAT32) and b.tokens_per_page > 0
            and b.num_heads > 0 and b.head_dim > 0 and b.role not in lossless and b.layer_id not in layers)


def hot_values(raw: np.ndarray, dtype) -> np.ndarray:
    raw = np.ascontiguousarray(raw, np.uint8)
    if dtype == DType.BFLOAT16:
        return raw.view(ml_dtypes.bfloat16).astype(np.float32)
    if dtype == DType.FLOAT16:
        return raw.view(np.float16).astype(np.float32)
    return raw.view(np.float32).copy()


def hot_bytes(values: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        if dtype == DType.BFLOAT16:
            out = values.astype(ml_dtypes.bfloat16)
        elif dtype == DType.FLOAT16:
            out = values.astype(np.float16)
        else:
            out = values.astype(np.float32)
    return out.view(np.uint8)


def blocks_index(shape, granularity) -> np.ndarray:
    """(blocks, elements) array of element indices (hot order) of each scale block."""
    t, h, d = shape
    idx = np.arange(t * h * d).reshape(t, h, d)
    if granularity == "page_head":
        return idx.transpose(1, 0, 2).reshape(h, t * d)
    if granularity == "token_head":
        return idx.reshape(t * h, d)
    return idx.reshape(1, -1)


def quantize(x: np.ndarray, shape, fmt: str, granularity: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 in hot order, scales float32) of one page of one buffer."""
    kind, q = FORMATS[fmt]
    index = blocks_index(shape, granularity)
    blocks = x[index]
    finite = np.isfinite(blocks)
    amax = np.where(finite, np.abs(blocks), np.float32(0)).max(axis=1)
    s = np.maximum((amax / np.float32(q)).astype(np.float32), np.float32(2.0**-126))
    r = (np.float32(1) / s).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (blocks * r[:, None]).astype(np.float32)
    codes = np.clip(np.where(finite, v, 0), -q, q).astype(kind).view(np.uint8)
    sign = (np.signbit(blocks).astype(np.uint8) << 7)
    inf_code = 0x7C if fmt == "e5m2" else 0x7F
    codes = np.where(np.isnan(blocks), sign | 0x7F, np.where(np.isinf(blocks), sign | inf_code, codes))
    out = np.empty(x.size, np.uint8)
    out[index] = codes
    return out, s


def dequantize(codes: np.ndarray, scales: np.ndarray, shape, fmt: str, granularity: str) -> np.ndarray:
    """float32 values (hot order) a decoder computes before rounding to the hot dtype."""
    kind, _ = FORMATS[fmt]
    index = blocks_index(shape, granularity)
    vals = codes[index].view(kind).astype(np.float32) * scales[:, None]
    out = np.empty(codes.size, np.float32)
    out[index] = vals
    return out


def encode_page(buffers, hot_of, params) -> bytes:
    """The blob of one page: ``buffers`` the lifecycle's BufferDescs, ``hot_of(b)`` the hot bytes
    of buffer b in that page."""
    fmt = params.get("format", "e4m3")
    gran = params.get("granularity", "page_head")
    out = bytearray()
    for b in buffers:
        raw = np.ascontiguousarray(hot_of(b), np.uint8)
        if quantizes(b, params):
            shape = (b.tokens_per_page, b.num_heads, b.head_dim)
            codes, scales = quantize(hot_values(raw, b.dtype), shape, fmt, gran)
            out += codes.tobytes()
            out += bytes(_align(len(out)) - len(out))
            out += scales.astype("<f4").tobytes()
        else:
            out += raw.tobytes()
        out += bytes(_align(len(out)) - len(out))
    return bytes(out)


def decode_values(buffers, blob: bytes, params) -> dict:
    """Hot bytes of each quantized buffer decoded from ``blob`` (by buffer index)."""
    fmt = params.get("format", "e4m3")
    gran = params.get("granularity", "page_head")
    out, off = {}, 0
    data = np.frombuffer(blob, np.uint8)
    for i, b in enumerate(buffers):
        if quantizes(b, params):
            shape = (b.tokens_per_page, b.num_heads, b.head_dim)
            n = int(np.prod(shape))
            nb = blocks_index(shape, gran).shape[0]
            codes = data[off:off + n]
            off = _align(off + n)
            scales = data[off:off + 4 * nb].view("<f4").astype(np.float32)
            off = _align(off + 4 * nb)
            vals = dequantize(codes, scales, shape, fmt, gran)
            kind, _ = FORMATS[fmt]
            nan = np.isnan(codes.view(kind).astype(np.float32))
            raw = hot_values(hot_bytes(vals, b.dtype), b.dtype)
            bits = hot_bytes(raw, b.dtype)
            canon = {DType.BFLOAT16: (0x7FC0, np.uint16), DType.FLOAT16: (0x7E00, np.uint16),
                     DType.FLOAT32: (0x7FC00000, np.uint32)}[b.dtype]
            word = bits.view(canon[1]).copy()
            neg = (codes & 0x80).astype(bool)
            sign = np.array(1 << (8 * np.dtype(canon[1]).itemsize - 1), canon[1])
            word[nan] = np.where(neg[nan], canon[0] | sign, canon[0]).astype(canon[1])
            out[i] = word.view(np.uint8)
        else:
            off = _align(off + b.bytes)
    return out
