"""An independent numpy model of the nvfp4 blob format 1 (plugin README, csrc/codec.h).

It shares no code with the codec: e4m3 rounding comes from ml_dtypes, e2m1 rounding picks the
nearest of the eight magnitudes by distance (ties to the even code), the hot dtype rounding is
numpy's / ml_dtypes'. The tests hold the codec's blobs and decoded pages to it byte for byte.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvcodec_sdk import DType, Role

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
F32 = np.float32
HALF = {DType.BFLOAT16: ml_dtypes.bfloat16, DType.FLOAT16: np.float16}
HALF_MAX = {DType.BFLOAT16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), DType.FLOAT16: 65504.0}


def align16(n: int) -> int:
    return (n + 15) // 16 * 16


def quantized(b, params: dict) -> bool:
    roles = {"key": Role.KEY, "value": Role.VALUE, "other": Role.OTHER}
    lossless = {roles[r.strip()] for r in params.get("lossless_roles", "").split(",") if r.strip()} | {Role.OTHER}
    if lossless & {Role.KEY, Role.VALUE}:  # a K-and-V buffer holds both roles
        lossless.add(Role.KEY_VALUE)
    layers = {int(x) for x in params.get("lossless_layers", "").split(",") if x.strip()}
    shaped = b.tokens_per_page > 0 and b.num_heads > 0 and b.head_dim > 0
    return (DType(b.dtype) in HALF and shaped and Role(b.role) not in lossless and b.layer_id not in layers)


def _e2m1_index(v: np.ndarray) -> np.ndarray:
    """Nearest e2m1 magnitude index of every |v| (float32), ties to the even index."""
    d = np.abs(v.astype(np.float64)[..., None] - E2M1)
    best = d.min(axis=-1, keepdims=True)
    tie = d == best
    even = tie & (np.arange(8) % 2 == 0)
    return np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(tie, axis=-1))


def encode_buffer(raw: np.ndarray, b, granularity: str) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """(codes bytes, block scale codes, global scales, nibbles) of one page of a quantized buffer."""
    t, h, d = b.tokens_per_page, b.num_heads, b.head_dim
    x = raw.view(HALF[DType(b.dtype)]).astype(F32).reshape(t, h, d)
    mag = np.where(np.isfinite(x), np.abs(x), F32(0)).astype(F32)
    if granularity == "page_head":
        amax_g = mag.max(axis=(0, 2))                       # (H,)
        s = np.maximum(amax_g / F32(2688), F32(2.0**-126)).astype(F32)
        s_el = s[None, :, None]
    else:
        s = np.array([max(mag.max() / F32(2688), F32(2.0**-126))], F32)
        s_el = s.reshape(1, 1, 1)
    nb = -(-d // 16)
    pad = np.zeros((t, h, nb * 16), F32)
    pad[:, :, :d] = mag
    amax_b = pad.reshape(t, h, nb, 16).max(axis=3)
    ratio = (amax_b / (s_el * F32(6))).astype(F32)
    sb = np.minimum(ratio, F32(448)).astype(ml_dtypes.float8_e4m3fn)
    bs = (sb.astype(F32) * s_el).astype(F32)                # (T, H, B)
    bs_el = np.repeat(bs, 16, axis=2)[:, :, :d]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(bs_el > 0, np.abs(x) / np.where(bs_el > 0, bs_el, F32(1)), F32(0)).astype(F32)
    idx = np.where(np.isinf(x) & (bs_el > 0), 7, _e2m1_index(np.where(np.isfinite(v), v, F32(0))))
    sign = np.signbit(x) & ~np.isnan(x)
    nib = np.where(np.isnan(x), 0, idx | (sign.astype(np.int64) << 3)).astype(np.uint8)
    if d % 2:
        nib = np.concatenate([nib, np.zeros((t, h, 1), np.uint8)], axis=2)
    codes = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
    return codes.tobytes(), sb.view(np.uint8).reshape(-1), s, nib


def decode_buffer(codes: bytes, sb: np.ndarray, s: np.ndarray, b, granularity: str) -> np.ndarray:
    """Hot bytes of one page of a quantized buffer from its regions."""
    t, h, d = b.tokens_per_page, b.num_heads, b.head_dim
    row = (d + 1) // 2
    c = np.frombuffer(codes, np.uint8).reshape(t, h, row)
    nib = np.stack([c & 15, c >> 4], axis=-1).reshape(t, h, 2 * row)[:, :, :d]
    val = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    s_el = s[None, :, None] if granularity == "page_head" else s.reshape(1, 1, 1)
    bs = (sb.view(ml_dtypes.float8_e4m3fn).astype(F32).reshape(t, h, -1) * s_el).astype(F32)
    y = (val.astype(F32) * np.repeat(bs, 16, axis=2)[:, :, :d]).astype(F32)
    lim = F32(HALF_MAX[DType(b.dtype)])
    y = np.clip(y, -lim, lim)
    return y.astype(HALF[DType(b.dtype)]).view(np.uint8).reshape(-1)


def encode_page(buffers, hot_of, params: dict) -> bytes:
    """The blob of one page: ``hot_of(b)`` returns the hot bytes of buffer ``b`` in that page."""
    g = params.get("granularity", "page_head")
    out = bytearray()
    for b in buffers:
        raw = np.ascontiguousarray(hot_of(b), np.uint8)
        if quantized(b, params):
            codes, sb, s, _ = encode_buffer(raw, b, g)
            for region in (codes, sb.tobytes(), s.astype("<f4").tobytes()):
                out += region + bytes(align16(len(region)) - len(region))
        else:
            out += raw.tobytes() + bytes(align16(raw.size) - raw.size)
    return bytes(out)


def decode_page(buffers, blob: bytes, params: dict) -> list[np.ndarray]:
    """Hot bytes of every buffer from one blob."""
    g = params.get("granularity", "page_head")
    out, off = [], 0
    for b in buffers:
        if quantized(b, params):
            rows = b.tokens_per_page * b.num_heads
            n_codes, n_sb = rows * ((b.head_dim + 1) // 2), rows * (-(-b.head_dim // 16))
            n_s = b.num_heads if g == "page_head" else 1
            codes = blob[off:off + n_codes]
            off += align16(n_codes)
            sb = np.frombuffer(blob[off:off + n_sb], np.uint8)
            off += align16(n_sb)
            s = np.frombuffer(blob[off:off + 4 * n_s], "<f4").astype(F32)
            off += align16(4 * n_s)
            out.append(decode_buffer(codes, sb, s, b, g))
        else:
            out.append(np.frombuffer(blob[off:off + b.bytes], np.uint8).copy())
            off += align16(b.bytes)
    return out


def cold_page_bytes(buffers, params: dict) -> int:
    g = params.get("granularity", "page_head")
    total = 0
    for b in buffers:
        if quantized(b, params):
            rows = b.tokens_per_page * b.num_heads
            total += align16(rows * ((b.head_dim + 1) // 2)) + align16(rows * (-(-b.head_dim // 16)))
            total += align16(4 * (b.num_heads if g == "page_head" else 1))
        else:
            total += align16(b.bytes)
    return total
