"""Layouts and KV-like data for the fp8 tests (host memory, numpy-backed)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import kvcodec_sdk as kv
from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

NP_DTYPE = {DType.BFLOAT16: ml_dtypes.bfloat16, DType.FLOAT16: np.float16, DType.FLOAT32: np.float32}
GUARD = 64


def kv_like(rng, shape, dtype, *, outlier_channels=2, special=False) -> np.ndarray:
    """[token][head][dim] values shaped like K/V activations: mostly N(0, 1), a few outlier
    channels 30-100x larger, one all-equal head, one denormal-range head; with ``special``
    also the largest finite values of the dtype, NaN and +-Inf."""
    t, h, d = shape
    x = rng.standard_normal(shape).astype(np.float32)
    for c in rng.choice(d, size=min(outlier_channels, d), replace=False):
        x[:, :, c] *= rng.uniform(30, 100)
    if h > 1:
        x[:, 1, :] = np.float32(0.375)
    if h > 2:
        tiny = np.finfo(NP_DTYPE[dtype]).tiny if dtype != DType.BFLOAT16 else np.float32(2.0**-126)
        x[:, 2, :] = rng.standard_normal((t, d)).astype(np.float32) * np.float32(tiny) * 4
    if special and h > 3:
        big = float(np.finfo(NP_DTYPE[dtype]).max) if dtype != DType.BFLOAT16 else float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
        x[0, 3, 0] = big
        x[min(1, t - 1), 3, min(1, d - 1)] = -big
        x[0, 0, 0] = np.nan
        x[min(1, t - 1), 0, 0] = np.inf
        x[min(2, t - 1), 0, min(2, d - 1)] = -np.inf
    return x.astype(NP_DTYPE[dtype]).view(np.uint8).reshape(-1)


@dataclass
class Layout:
    groups: list
    pools: list          # pools[p]: (num_slots, slot_bytes) uint8 view
    backing: list        # with guards
    buffers: list        # BufferDescs of lifecycle 0

    def hot(self, b, slot) -> np.ndarray:
        return self.pools[b.pool_index][slot, b.byte_offset:b.byte_offset + b.bytes]


def build_layout(rng, specs, num_slots, *, special=False, lifecycles=(0,)) -> Layout:
    """One hot pool group. ``specs`` is a list of pools, each a list of buffers
    (layer, role, dtype, (T, H, D) or byte count for opaque). Buffers of a pool are packed one
    after another at 16-byte aligned offsets."""
    pools, backing, descs, buffers = [], [], [], []
    for p, pool_spec in enumerate(specs):
        layout, off = [], 0
        for layer, role, dtype, shape in pool_spec:
            item = DType(dtype).itemsize
            nbytes = int(np.prod(shape)) * item if isinstance(shape, tuple) else int(shape)
            layout.append((layer, role, dtype, shape, off, nbytes))
            off += (nbytes + 15) // 16 * 16
        slot = max(off, 16)
        back = np.zeros(slot * num_slots + 2 * GUARD, np.uint8)
        back[:GUARD] = 0xA5
        back[-GUARD:] = 0xA5
        view = back[GUARD:GUARD + slot * num_slots].reshape(num_slots, slot)
        for layer, role, dtype, shape, off, nbytes in layout:
            if isinstance(shape, tuple) and dtype in NP_DTYPE:
                b = BufferDesc(layer, role, p, off, nbytes, dtype, *shape)
                for s in range(num_slots):
                    view[s, off:off + nbytes] = kv_like(rng, shape, dtype, special=special)
            else:
                dims = shape if isinstance(shape, tuple) else (0, 0, 0)
                b = BufferDesc(layer, role, p, off, nbytes, dtype, *dims)
                view[:, off:off + nbytes] = rng.integers(1, 256, (num_slots, nbytes), dtype=np.uint8)
            buffers.append(b)
        pools.append(view)
        backing.append(back)
        descs.append(PoolDesc(view.ctypes.data, slot, num_slots))
    groups = [PoolGroupDesc(descs, [LifeCycleDesc(i, tuple(buffers)) for i in lifecycles])]
    return Layout(groups, pools, backing, buffers)


def pairs(dst, src) -> np.ndarray:
    return np.ascontiguousarray(np.stack([np.asarray(dst), np.asarray(src)], 1).astype(np.int32))


MIXED = [
    # pool 0: bf16 K and V of two layers, an fp8 buffer already 8-bit, an opaque scratch area
    [(0, Role.KEY, DType.BFLOAT16, (16, 4, 64)), (0, Role.VALUE, DType.BFLOAT16, (16, 4, 64)),
     (1, Role.KEY, DType.BFLOAT16, (16, 4, 64)), (1, Role.VALUE, DType.BFLOAT16, (16, 4, 64)),
     (2, Role.KEY, DType.FLOAT8_E4M3, (16, 4, 64)), (2, Role.OTHER, DType.UINT8, 100)],
    # pool 1: fp16 and fp32 buffers, an int32 buffer, an odd head dim (scalar path)
    [(3, Role.KEY, DType.FLOAT16, (8, 4, 32)), (3, Role.VALUE, DType.FLOAT32, (8, 4, 32)),
     (4, Role.OTHER, DType.INT32, (8, 2, 4)), (5, Role.VALUE, DType.BFLOAT16, (5, 5, 7))],
]


def steered_codec(params=None, device="cpu"):
    """An fp8 CPU codec made by the factory of ``kvcodec_fp8._testing``, which uses the kernel
    variant ``_testing.set_cpu_simd`` chooses (that module has its own copy of the codec's host
    side, without the CUDA kernels; the codecs of ``kv.create_codec("fp8")`` come from
    ``kvcodec_fp8._ext`` and keep choosing the best variant the CPU supports)."""
    from kvcodec_fp8 import _testing
    from kvcodec_fp8.plugin import SPEC

    registry = kv.CodecRegistry(load_entry_points=False, builtins=False)
    registry.register(dataclasses.replace(SPEC, factory=_testing.codec_factory, devices=("cpu",)))
    return registry.create_codec("fp8", params, device)
