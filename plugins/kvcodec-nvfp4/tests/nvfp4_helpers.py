"""Host layouts and KV-like data for the nvfp4 tests (numpy-backed pools)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

NP = {DType.BFLOAT16: ml_dtypes.bfloat16, DType.FLOAT16: np.float16, DType.FLOAT32: np.float32,
      DType.FLOAT8_E4M3: ml_dtypes.float8_e4m3fn}


def kv_values(rng, shape, dtype, *, special=False) -> np.ndarray:
    """[token][head][dim] float32 values like K/V activations: N(0, 1) with two outlier channels
    (30-100x), a constant head, a head in the subnormal range of the dtype, a head 1000x smaller
    than the rest; with ``special`` also the dtype's largest finite values, NaN and +-Inf."""
    t, h, d = shape
    x = rng.standard_normal(shape).astype(np.float32)
    for c in rng.choice(d, size=min(2, d), replace=False):
        x[:, :, c] *= rng.uniform(30, 100)
    if h > 1:
        x[:, 1, :] = np.float32(0.375)
    if h > 2:
        tiny = 2.0**-126 if dtype == DType.BFLOAT16 else 2.0**-14
        x[:, 2, :] *= np.float32(tiny * 4)
    if h > 4:
        x[:, 4, :] *= np.float32(1e-3)
    if special and h > 3:
        big = float(ml_dtypes.finfo(NP[dtype]).max) if dtype != DType.FLOAT32 else 3e38
        x[0, 3, 0], x[-1, 3, d - 1] = big, -big
        x[0, 0, 0] = np.nan
        x[-1, 0, 0] = np.inf
        x[-1, 0, d - 1] = -np.inf
    return x


E2M1_THRESHOLDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


def near_threshold_values(rng, shape, dtype) -> np.ndarray:
    """[token][head][dim] values a few ulps of the dtype either side of an e2m1 rounding threshold
    (0.25, 0.75, ..., 5 times the block's effective scale), with random block scales: the encoder's
    comparisons are exercised where the rounding of |x| / scale decides the code. Every head holds
    the same largest magnitude, so the fp32 scale S, and with it each block's scale, is the same at
    both granularities. Needs whole 16-element blocks (head_dim a multiple of 16)."""
    t, h, d = shape
    half = NP[dtype]
    top = np.float32(4.0)
    s = np.maximum(top / np.float32(2688), np.float32(2.0**-126))
    amax = (top * 10.0 ** rng.uniform(-3, 0, (t, h, d // 16))).astype(np.float32)
    amax[0, :, 0] = top
    amax = amax.astype(half).astype(np.float32)
    sb = np.minimum(amax / (s * np.float32(6)), np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    bs = (sb.astype(np.float32) * s).astype(np.float32)
    c = rng.choice(E2M1_THRESHOLDS, (t, h, d // 16, 16))
    base = (c * bs[..., None]).astype(np.float32).astype(half).view(np.uint16).astype(np.int32)
    bits = np.clip(base + rng.integers(-2, 3, base.shape), 0, None).astype(np.uint16)
    x = np.minimum(bits.view(half).astype(np.float32), amax[..., None])
    x[..., 0] = amax
    x *= rng.choice(np.array([-1, 1], np.float32), x.shape)
    x[..., 0] = amax
    return x.reshape(t, h, d)


@dataclass
class Layout:
    groups: list
    pools: list     # (num_slots, slot_bytes) uint8 arrays
    buffers: list   # the BufferDescs of every lifecycle

    def hot(self, b, slot) -> np.ndarray:
        return self.pools[b.pool_index][slot, b.byte_offset:b.byte_offset + b.bytes]


# Scales that take KV-like values of magnitude below 16 into the subnormal range of the dtype.
SUBNORMAL_SCALE = {DType.BFLOAT16: 2.0**-130, DType.FLOAT16: 2.0**-18}


def build_layout(rng, pools_spec, num_slots, *, special=False, lifecycles=(0,), offset=0, odd_slot=False,
                 near=False, subnormal=False):
    """One hot pool group. ``pools_spec``: per pool, buffers (layer, role, dtype, (T, H, D) or a
    byte count for opaque bytes), packed after ``offset`` bytes; ``odd_slot`` adds 1 byte to each
    slot, so slots after the first are misaligned; ``near`` fills the buffers with
    near_threshold_values() instead of KV-like values; ``subnormal`` scales bf16 and fp16 KV-like
    values by SUBNORMAL_SCALE (most blocks then hold only subnormal values)."""
    pools, descs, buffers = [], [], []
    for p, spec in enumerate(pools_spec):
        placed, off = [], offset
        for layer, role, dtype, shape in spec:
            nbytes = int(np.prod(shape)) * DType(dtype).itemsize if isinstance(shape, tuple) else int(shape)
            placed.append((layer, role, dtype, shape, off, nbytes))
            off += nbytes if odd_slot else (nbytes + 15) // 16 * 16
        slot = max(off, 1) + (1 if odd_slot else 0)
        view = np.zeros((num_slots, slot), np.uint8)
        for layer, role, dtype, shape, off, nbytes in placed:
            if isinstance(shape, tuple):
                b = BufferDesc(layer, role, p, off, nbytes, dtype, *shape)
                for s in range(num_slots):
                    x = near_threshold_values(rng, shape, dtype) if near else kv_values(rng, shape, dtype,
                                                                                          special=special)
                    if subnormal and dtype in SUBNORMAL_SCALE:
                        x = x * np.float32(SUBNORMAL_SCALE[dtype])
                    view[s, off:off + nbytes] = x.astype(NP[dtype]).view(np.uint8).reshape(-1)
            else:
                b = BufferDesc(layer, role, p, off, nbytes, dtype)
                view[:, off:off + nbytes] = rng.integers(1, 256, (num_slots, nbytes), dtype=np.uint8)
            buffers.append(b)
        pools.append(view)
        descs.append(PoolDesc(view.ctypes.data, slot, num_slots))
    groups = [PoolGroupDesc(descs, [LifeCycleDesc(i, tuple(buffers)) for i in lifecycles])]
    return Layout(groups, pools, buffers)


def pairs(dst, src) -> np.ndarray:
    return np.ascontiguousarray(np.stack([np.asarray(dst), np.asarray(src)], 1).astype(np.int32))


BF, FP = DType.BFLOAT16, DType.FLOAT16
K, V, O = Role.KEY, Role.VALUE, Role.OTHER

MIXED = [
    # pool 0: bf16 K/V of two layers (head_dim 128, 64), an opaque block-scale area
    [(0, K, BF, (16, 8, 128)), (0, V, BF, (16, 8, 128)), (1, K, BF, (8, 4, 64)), (1, V, BF, (8, 4, 64)),
     (1, O, DType.UINT8, 100)],
    # pool 1: fp16 K/V with partial blocks (head_dim 24, 8, odd 7), fp8 and fp32 buffers (lossless)
    [(2, K, FP, (4, 3, 24)), (2, V, FP, (2, 1, 8)), (3, K, BF, (5, 5, 7)), (3, V, FP, (5, 5, 7)),
     (4, K, DType.FLOAT8_E4M3, (4, 2, 16)), (4, V, DType.FLOAT32, (4, 2, 16))],
]
