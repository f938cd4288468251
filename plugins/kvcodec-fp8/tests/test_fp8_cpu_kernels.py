"""The CPU implementation's vectorized kernels against straightforward references.

Every kernel variant this build and CPU can run (``portable``, the baseline instruction set,
always; ``avx2`` and ``avx512`` where available) is checked:

- element by element against the scalar conversions of the blob format (``_testing.fp32_to_fp8``,
  ``fp8_to_fp32``, ``fp32_to_bf16``, ``fp32_to_fp16``, themselves pinned to ml_dtypes, numpy and
  ``cuda_fp8.h`` in test_fp8_cpu.py): every bf16/fp16 bit pattern and the rounding-relevant fp32
  patterns under several block reciprocals, every code under special and random scales, at
  aligned and odd addresses and with loop tails;
- whole blobs and decoded pages through the codec against the independent numpy model
  (fp8_reference.py) on KV-like data, random bit patterns and edge values (signed zeros,
  subnormals of the hot dtype and of fp32, the largest finite values, exact fp8 rounding ties,
  NaN and infinities), for every format, granularity and hot dtype, on shapes that run the
  vector loops, shapes that leave tails, and elements at odd addresses;
- the variants against each other on a larger KV-like layout.
"""

from __future__ import annotations

import itertools
import zlib

import fp8_reference as ref
import ml_dtypes
import numpy as np
import pytest
from fp8_helpers import pairs, steered_codec
from kvcodec_fp8 import _testing

from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role
from kvcodec_sdk.testing.data import fill_page_bytes

SIMDS = _testing.cpu_simd_variants()
FORMATS = ("e4m3", "e5m2")
GRANULARITIES = ("page_head", "token_head", "page")
HOT_DTYPES = (DType.BFLOAT16, DType.FLOAT16, DType.FLOAT32)
NP_BITS = {DType.BFLOAT16: np.uint16, DType.FLOAT16: np.uint16, DType.FLOAT32: np.uint32}
CANONICAL_NAN = {DType.BFLOAT16: 0x7FC0, DType.FLOAT16: 0x7E00, DType.FLOAT32: 0x7FC00000}
SIGN_BIT = {DType.BFLOAT16: 0x8000, DType.FLOAT16: 0x8000, DType.FLOAT32: 0x80000000}


@pytest.fixture(params=SIMDS)
def simd(request):
    """A kernel variant, also made the one CPU codecs use for the test."""
    previous = _testing.set_cpu_simd(request.param)
    yield request.param
    _testing.set_cpu_simd(previous)


def test_portable_variant_is_always_there():
    assert SIMDS[0] == "portable" and _testing.cpu_simd() in SIMDS
    with pytest.raises(ValueError, match="valid values are 'portable', 'avx2', 'avx512'"):
        _testing.set_cpu_simd("sse9")
    previous = _testing.set_cpu_simd("portable")
    try:
        assert _testing.cpu_simd() == "portable" and _testing.set_cpu_simd("portable") == "portable"
    finally:
        _testing.set_cpu_simd(previous)


# -- element references -----------------------------------------------------------------------


def to_f32(bits: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.BFLOAT16:
        return bits.view(ml_dtypes.bfloat16).astype(np.float32)
    if dtype == DType.FLOAT16:
        return bits.view(np.float16).astype(np.float32)
    return bits.view(np.float32)


def expected_codes(x: np.ndarray, r: float, fmt: str) -> np.ndarray:
    """The codes of fp32 values x under reciprocal r, by the scalar conversion."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = (x * np.float32(r)).astype(np.float32)
    codes = _testing.fp32_to_fp8(np.where(np.isfinite(x), y, 0).astype(np.float32), fmt)
    sign = (np.signbit(x).astype(np.uint8) << 7)
    special = np.where(np.isinf(x) & (fmt == "e5m2"), 0x7C, 0x7F).astype(np.uint8)
    return np.where(np.isfinite(x), codes, sign | special).astype(np.uint8)


def expected_hot(codes: np.ndarray, scale: float, fmt: str, dtype: DType) -> np.ndarray:
    """Hot element bits of codes under one scale, by the scalar conversions."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = (_testing.fp8_to_fp32(codes, fmt) * np.float32(scale)).astype(np.float32)
    if dtype == DType.BFLOAT16:
        bits = _testing.fp32_to_bf16(y)
    elif dtype == DType.FLOAT16:
        bits = _testing.fp32_to_fp16(y)
    else:
        bits = y.view(np.uint32)
    kind = ref.FORMATS[fmt][0]
    nan = np.isnan(codes.view(kind).astype(np.float32))
    canon = np.where(codes & 0x80, CANONICAL_NAN[dtype] | SIGN_BIT[dtype], CANONICAL_NAN[dtype])
    return np.where(nan, canon, bits).astype(NP_BITS[dtype])


def at_offset(raw: np.ndarray, offset: int) -> np.ndarray:
    """The bytes `raw` in a fresh buffer starting `offset` bytes past an aligned address."""
    buf = np.zeros(raw.nbytes + 64, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start:start + raw.nbytes]
    out[:] = raw.view(np.uint8).reshape(-1)
    return out


def rounding_floats(rng) -> np.ndarray:
    """Every upper 16-bit pattern with low halves on, below and above the rounding points of
    both fp8 formats, and random patterns."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000, 0x0FFF, 0x1000, 0x1001], np.uint32)
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    more = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, more]).view(np.float32)


RECIPROCALS = [1.0, 3.0, 1.0 / 3.0, 2.0**-126, 2.0**126, 448.0 / 65504.0, 57344.0 / 3.0e38, 7.25e-3]


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_fp32_matches_the_scalar_conversion(fmt, simd):
    x = rounding_floats(np.random.default_rng(11))
    for r, offset in zip(RECIPROCALS, itertools.cycle((0, 1, 2, 3))):
        got = _testing.cpu_quantize(at_offset(x, offset), int(DType.FLOAT32), fmt, r, simd)
        want = expected_codes(x, r, fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, \
            f"r={r}: bits={x[bad[:3]].view(np.uint32)} got {got[bad[:3]]} want {want[bad[:3]]}"


@pytest.mark.parametrize("dtype", [DType.BFLOAT16, DType.FLOAT16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_every_half_pattern(dtype, fmt, simd):
    bits = np.arange(1 << 16, dtype=np.uint16)
    x = to_f32(bits, dtype)
    rng = np.random.default_rng(12)
    reciprocals = RECIPROCALS + list(np.exp2(rng.uniform(-120, 120, 12)).astype(np.float32))
    for r, offset in zip(reciprocals, itertools.cycle((0, 1))):
        got = _testing.cpu_quantize(at_offset(bits, offset), int(dtype), fmt, float(r), simd)
        want = expected_codes(x, float(r), fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"r={r}: bits={bits[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}"


SPECIAL_SCALES = np.array([0x00800000, 0x3F800000, 0x7F7FFFFF, 0x00000001, 0x007FFFFF, 0x00000000, 0x80000000,
                           0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0xBF800000, 0x4780_0000,
                           0x477F_F000, 0x3880_0000, 0x3300_0000, 0x3380_0000], np.uint32).view(np.float32)


@pytest.mark.parametrize("dtype", HOT_DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_every_code(dtype, fmt, simd):
    rng = np.random.default_rng(13)
    # All codes four times over plus a tail of 7, so both the vector loop and its tail see them.
    codes = np.concatenate([np.tile(np.arange(256, dtype=np.uint8), 4), np.arange(249, 256, dtype=np.uint8)])
    rng.shuffle(codes)
    random_scales = rng.integers(0, 2**32, 300, dtype=np.uint64).astype(np.uint32).view(np.float32)
    finite_scales = np.exp2(rng.uniform(-126, 110, 300)).astype(np.float32)
    esize = np.dtype(NP_BITS[dtype]).itemsize
    for i, s in enumerate(np.concatenate([SPECIAL_SCALES, random_scales, finite_scales])):
        offset = i % 3
        raw = _testing.cpu_dequantize(codes, int(dtype), fmt, float(s), simd, offset)
        got = raw[offset:].view(NP_BITS[dtype])
        want = expected_hot(codes, float(s), fmt, dtype)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"scale bits {np.float32(s).view(np.uint32):#x}: codes {codes[bad[:3]]} got " \
                              f"{got[bad[:3]]} want {want[bad[:3]]}"
        assert raw.size == offset + codes.size * esize


@pytest.mark.parametrize("dtype", HOT_DTYPES, ids=["bf16", "fp16", "fp32"])
def test_finite_amax(dtype, simd):
    rng = np.random.default_rng(14)
    bits_type = NP_BITS[dtype]
    for n in (0, 1, 7, 128, 1000):
        for kind in ("finite", "nonfinite", "all-nonfinite"):
            x = rng.standard_normal(n).astype(np.float32) * np.float32(rng.uniform(1e-3, 1e3))
            raw = ref.hot_bytes(x, dtype).view(bits_type).copy()
            if kind != "finite" and n:
                inf = ref.hot_bytes(np.array([np.inf, -np.inf, np.nan], np.float32), dtype).view(bits_type)
                where = rng.integers(0, n, max(1, n // 10)) if kind == "nonfinite" else np.arange(n)
                raw[where] = inf[rng.integers(0, 3, where.size)]
            vals = to_f32(raw, dtype)
            finite = np.isfinite(vals)
            want = np.float32(np.abs(vals[finite]).max()) if finite.any() else np.float32(0)
            got = _testing.cpu_finite_amax(at_offset(raw, n % 2), int(dtype), simd)
            assert np.float32(got) == want, (n, kind)


# -- whole blobs through the codec, against the numpy model ------------------------------------


def special_values(dtype: DType, n: int, rng) -> np.ndarray:
    """n hot elements (bits): normal values with signed zeros, subnormals (of the hot dtype and,
    for fp32, of fp32), the largest finite values, NaN and +-Inf scattered among them."""
    bits_type = NP_BITS[dtype]
    if dtype == DType.FLOAT32:
        special = np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
                            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32)
    elif dtype == DType.FLOAT16:
        special = np.array([0, 0x8000, 1, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
                            0x7C01, 0xFFFF], np.uint16)
    else:
        special = np.array([0, 0x8000, 1, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0,
                            0x7F81, 0xFFFF], np.uint16)
    out = ref.hot_bytes(rng.standard_normal(n).astype(np.float32), dtype).view(bits_type).copy()
    where = rng.choice(n, size=min(n, 2 * special.size), replace=False)
    out[where] = special[rng.integers(0, special.size, where.size)]
    # A few runs of subnormals of the hot dtype (whole blocks of them, for small blocks).
    run = rng.integers(0, n, 4)
    for start in run:
        out[start:start + 40] = rng.integers(0, 0x80 if dtype != DType.FLOAT16 else 0x400, out[start:start + 40].size)
    return out


def tie_values(dtype: DType, fmt: str, shape, rng) -> np.ndarray:
    """Hot elements (bits) on the fp8 format's rounding ties and one hot-dtype step either side,
    with +-Q (the largest fp8 value) at dimension 0 of every token and head: every scale block of
    every granularity has amax Q, so its scale is 1 and the scaled values are these values."""
    q = ref.FORMATS[fmt][1]
    kind = ref.FORMATS[fmt][0]
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(kind).astype(np.float32)))
    grid = grid[np.isfinite(grid)]
    ties = ref.hot_bytes((grid[:-1] + grid[1:]) / 2, dtype).view(NP_BITS[dtype])
    near = np.concatenate([ties, ties - 1, ties + 1, ref.hot_bytes(grid, dtype).view(NP_BITS[dtype])])
    near = near[np.abs(to_f32(near, dtype)) <= q]
    sign = np.array(SIGN_BIT[dtype], NP_BITS[dtype])
    out = near[rng.integers(0, near.size, shape)] | np.where(rng.random(shape) < 0.5, sign, 0).astype(NP_BITS[dtype])
    out[:, :, 0] = ref.hot_bytes(np.float32(q) * np.where(rng.random(shape[:2]) < 0.5, -1, 1).astype(np.float32),
                                 dtype).view(NP_BITS[dtype]).reshape(shape[:2])
    return out.reshape(-1)


def hot_data(kind: str, dtype: DType, fmt: str, shape, slots: int, rng) -> np.ndarray:
    """(slots, elements) hot element bits of one buffer."""
    n = int(np.prod(shape))
    bits_type = NP_BITS[dtype]
    if kind == "kv":
        desc = BufferDesc(0, Role.KEY, 0, 0, n * np.dtype(bits_type).itemsize, dtype, *shape)
        return fill_page_bytes(rng, desc.bytes, slots, [desc]).view(bits_type).reshape(slots, n)
    if kind == "bits":
        return rng.integers(0, np.iinfo(bits_type).max, (slots, n), dtype=np.uint64, endpoint=True).astype(bits_type)
    if kind == "specials":
        return np.stack([special_values(dtype, n, rng) for _ in range(slots)])
    return np.stack([tie_values(dtype, fmt, shape, rng) for _ in range(slots)])


def single_buffer(dtype, shape, slots, *, odd: bool):
    """One hot pool holding one K buffer per slot; with `odd`, the slot size is odd and the pool
    starts at an odd address, so the elements of every other slot sit at odd addresses."""
    esize = np.dtype(NP_BITS[dtype]).itemsize
    nbytes = int(np.prod(shape)) * esize
    slot = nbytes + 1 if odd else nbytes
    backing = np.zeros(slot * slots + 128, np.uint8)
    start = (-backing.ctypes.data) % 64 + (1 if odd else 0)
    pool = backing[start:start + slot * slots].reshape(slots, slot)
    buf = BufferDesc(0, Role.KEY, 0, 0, nbytes, dtype, *shape)
    group = PoolGroupDesc([PoolDesc(pool.ctypes.data, slot, slots)], [LifeCycleDesc(0, (buf,))])
    return backing, pool, buf, group


SHAPES = {"vector": (32, 8, 128), "tails": (5, 3, 37), "odd-address": (4, 3, 40)}


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("kind", ["kv", "bits", "specials", "ties"])
@pytest.mark.parametrize("dtype", HOT_DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("gran", GRANULARITIES)
def test_blobs_and_decoded_pages_equal_the_model(gran, fmt, dtype, kind, shape_name, simd):
    shape = SHAPES[shape_name]
    slots = 3
    rng = np.random.default_rng(zlib.crc32(f"{gran}-{fmt}-{int(dtype)}-{kind}-{shape_name}".encode()))
    backing, pool, buf, group = single_buffer(dtype, shape, slots, odd=shape_name == "odd-address")
    data = hot_data(kind, dtype, fmt, shape, slots, rng)
    pool[:, :buf.bytes] = data.view(np.uint8).reshape(slots, -1)
    params = {"format": fmt, "granularity": gran}
    with steered_codec(params, device="cpu") as codec:
        codec.configure([group])
        size = codec.cold_page_bytes(0)
        cold = np.full((slots + 1, size), 0xC3, np.uint8)
        codec.encode(0, cold, pairs([2, 0, 1], [0, 1, 2]))
        for c, h in ((2, 0), (0, 1), (1, 2)):
            want = ref.encode_page([buf], lambda b: pool[h, :b.bytes], params)
            got = cold[c].tobytes()
            if got != want:
                i = next(k for k in range(len(want)) if got[k] != want[k])
                pytest.fail(f"slot {h}: blob byte {i} differs: codec {got[i]:#x}, model {want[i]:#x}")
        assert (cold[slots] == 0xC3).all()
        pool[:] = 0xEE
        codec.decode(0, cold, pairs([0, 1, 2], [2, 0, 1]))
        for h, c in ((0, 2), (1, 0), (2, 1)):
            want = ref.decode_values([buf], cold[c].tobytes(), params)[0]
            assert np.array_equal(pool[h, :buf.bytes], want), f"slot {h}: decoded bytes differ from the model"
            assert (pool[h, buf.bytes:] == 0xEE).all()


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_variants_write_the_same_bytes(gran, fmt):
    """Every variant writes the same blobs and decodes to the same hot bytes on a KV-like layout
    of bf16 K and V buffers of several layers (the benchmark's layout, fewer pages)."""
    tokens, heads, dim, layers, slots = 32, 8, 128, 3, 4
    nbytes = tokens * heads * dim * 2
    bufs = [BufferDesc(l, role, 0, (2 * l + i) * nbytes, nbytes, DType.BFLOAT16, tokens, heads, dim)
            for l in range(layers) for i, role in enumerate((Role.KEY, Role.VALUE))]
    hot = fill_page_bytes(np.random.default_rng(15), 2 * layers * nbytes, slots, bufs)
    out = np.zeros_like(hot)
    groups = [PoolGroupDesc([PoolDesc(p.ctypes.data, p.shape[1], slots)], [LifeCycleDesc(0, tuple(bufs))])
              for p in (hot, out)]
    idx = pairs(np.arange(slots), np.arange(slots)[::-1])
    results = []
    previous = _testing.set_cpu_simd(None)
    try:
        for variant in SIMDS:
            _testing.set_cpu_simd(variant)
            with steered_codec({"format": fmt, "granularity": gran}, device="cpu") as enc, \
                    steered_codec({"format": fmt, "granularity": gran}, device="cpu") as dec:
                enc.configure(groups[:1])
                dec.configure(groups[1:])
                cold = np.zeros((slots, enc.cold_page_bytes(0)), np.uint8)
                enc.encode(0, cold, idx)
                out[:] = 0
                dec.decode(0, cold, idx)
                results.append((variant, cold.copy(), out.copy()))
    finally:
        _testing.set_cpu_simd(previous)
    want = ref.encode_page(bufs, lambda b: hot[slots - 1, b.byte_offset:b.byte_offset + b.bytes],
                           {"format": fmt, "granularity": gran})
    for variant, cold, decoded in results:
        assert cold[0].tobytes() == want, variant
        assert np.array_equal(cold, results[0][1]) and np.array_equal(decoded, results[0][2]), variant
