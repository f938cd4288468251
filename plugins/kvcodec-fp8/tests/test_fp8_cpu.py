"""The fp8 codec's CPU reference against independent references (ml_dtypes, numpy), its declared
error bound, mixed lossless layouts, the parameter schema and the layout rules."""

from __future__ import annotations

import itertools

import fp8_reference as ref
import ml_dtypes
import numpy as np
import pytest
from fp8_helpers import GUARD, MIXED, build_layout, kv_like, pairs
from kvcodec_fp8 import _ext, _testing, check_error
from kvcodec_fp8.plugin import SPEC

import kvcodec_sdk as kv
from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

FORMATS = ("e4m3", "e5m2")
GRANULARITIES = ("page_head", "token_head", "page")
ALL_PARAMS = [{"format": f, "granularity": g} for f, g in itertools.product(FORMATS, GRANULARITIES)]
IDS = [f"{p['format']}-{p['granularity']}" for p in ALL_PARAMS]


def interesting_floats(rng) -> np.ndarray:
    """Every upper 16-bit pattern with low halves that sit on, just below and just above the
    rounding points of both fp8 formats, plus random bit patterns."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000, 0x0FFF, 0x1000, 0x1001], np.uint32)
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    more = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, more]).view(np.float32)


# -- scalar conversions ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp32_to_fp8_matches_ml_dtypes_and_cuda_header(fmt):
    x = interesting_floats(np.random.default_rng(1))
    kind, q = ref.FORMATS[fmt]
    mine = _testing.fp32_to_fp8(x, fmt)
    finite = np.isfinite(x)
    want = np.clip(x[finite], -q, q).astype(kind).view(np.uint8)
    assert np.array_equal(mine[finite], want), np.flatnonzero(mine[finite] != want)[:5]
    # NVIDIA's own emulation of __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...) agrees too.
    assert np.array_equal(mine[finite], _testing.fp32_to_fp8_cuda_header(x, fmt)[finite])
    # Saturation: nothing finite becomes a NaN or infinity code.
    assert not np.isnan(mine[finite].view(kind).astype(np.float32)).any()
    assert not np.isinf(mine[finite].view(kind).astype(np.float32)).any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_subnormals_and_overflow_by_hand(fmt):
    kind, q = ref.FORMATS[fmt]
    sub = 2.0**-9 if fmt == "e4m3" else 2.0**-16
    cases = np.array([sub / 2, 3 * sub / 2, 5 * sub / 2, sub * 0.49, q, q * 1.03, q * 4, -q * 1e6, 1e38,
                      1.0 + 2.0**-4 if fmt == "e4m3" else 1.0 + 2.0**-3], np.float32)
    got = _testing.fp32_to_fp8(cases, fmt).view(kind).astype(np.float32)
    assert got[0] == 0 and got[1] == 2 * sub and got[2] == 2 * sub and got[3] == 0   # ties to even
    assert got[4] == q and got[5] == q and got[6] == q and got[7] == -q and got[8] == q  # saturation
    assert got[9] == 1.0                                                                # tie at 1 + ulp/2


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_decode_is_exact(fmt):
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(_testing.fp8_to_fp32(codes, fmt), codes.view(ref.FORMATS[fmt][0]).astype(np.float32),
                          equal_nan=True)


def test_output_rounding_matches_numpy_and_ml_dtypes():
    x = interesting_floats(np.random.default_rng(2))
    x = x[np.isfinite(x)]
    assert np.array_equal(_testing.fp32_to_bf16(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    with np.errstate(over="ignore"):
        assert np.array_equal(_testing.fp32_to_fp16(x), x.astype(np.float16).view(np.uint16))


def test_block_scale_rules():
    s, r = _testing.block_scale(448.0, "e4m3")
    assert s == 1.0 and r == 1.0
    s, r = _testing.block_scale(0.0, "e4m3")  # all-zero block: the smallest normal scale
    assert s == np.float32(2.0**-126) and r == np.float32(2.0**126)
    s, r = _testing.block_scale(57344.0 * 3, "e5m2")
    assert s == 3.0 and r == np.float32(1) / np.float32(3)


# -- blobs against the independent model ------------------------------------------------------


def encode_cpu(layout, params, src, dst, lifecycle=0):
    codec = kv.create_codec("fp8", params, device="cpu")
    codec.configure(layout.groups)
    size = codec.cold_page_bytes(lifecycle)
    cold = np.full((max(dst) + 2, size), 0xC3, np.uint8)
    codec.encode(lifecycle, cold, pairs(dst, src))
    return codec, cold


@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
def test_blob_equals_the_numpy_model(params):
    rng = np.random.default_rng(3)
    layout = build_layout(rng, MIXED, num_slots=5, special=True)
    src, dst = [4, 0, 2], [1, 2, 0]
    codec, cold = encode_cpu(layout, params, src, dst)
    for d, s in zip(dst, src):
        want = ref.encode_page(layout.buffers, lambda b: layout.hot(b, s), params)
        assert len(want) == codec.cold_page_bytes(0)
        got = cold[d].tobytes()
        if got != want:
            i = next(k for k in range(len(want)) if got[k] != want[k])
            pytest.fail(f"blob byte {i} differs: codec {got[i]:#x}, model {want[i]:#x}")
    assert (cold[-1] == 0xC3).all(), "encode wrote outside its destination blobs"
    codec.close()


@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
def test_decode_equals_the_numpy_model_and_meets_the_bound(params):
    rng = np.random.default_rng(4)
    layout = build_layout(rng, MIXED, num_slots=4, special=True)
    original = [p.copy() for p in layout.pools]
    codec, cold = encode_cpu(layout, params, [3, 1], [0, 1])
    guards = [b.copy() for b in layout.backing]
    for p in layout.pools:
        p[:] = 0xEE
    codec.decode(0, cold, pairs([2, 0], [0, 1]))
    full = SPEC.validate_params(params)
    for hot_slot, orig_slot, cold_slot in ((2, 3, 0), (0, 1, 1)):
        model = ref.decode_values(layout.buffers, cold[cold_slot].tobytes(), params)
        for i, b in enumerate(layout.buffers):
            got = layout.hot(b, hot_slot)
            before = original[b.pool_index][orig_slot, b.byte_offset:b.byte_offset + b.bytes]
            if i in model:
                assert np.array_equal(got, model[i]), f"buffer {i}: decode differs from the model"
            else:
                assert np.array_equal(got, before), f"lossless buffer {i} was not restored exactly"
            assert check_error(before, got, b, full) is None
    for p, g in zip(layout.backing, guards):
        assert (p[:GUARD] == 0xA5).all() and (p[-GUARD:] == 0xA5).all()
    # Slots not decoded into, and bytes between buffers, keep the 0xEE pattern.
    assert (layout.pools[0][1] == 0xEE).all() and (layout.pools[0][3] == 0xEE).all()
    codec.close()


# -- the declared bound -----------------------------------------------------------------------


@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
@pytest.mark.parametrize("dtype", [DType.BFLOAT16, DType.FLOAT16, DType.FLOAT32])
def test_round_trip_within_declared_bound(params, dtype):
    rng = np.random.default_rng(5 + int(dtype))
    shape = (16, 8, 128)
    layout = build_layout(rng, [[(0, Role.KEY, dtype, shape), (0, Role.VALUE, dtype, shape)]], num_slots=3,
                          special=True)
    original = layout.pools[0].copy()
    codec, cold = encode_cpu(layout, params, [0, 1, 2], [0, 1, 2])
    layout.pools[0][:] = 0
    codec.decode(0, cold, pairs([0, 1, 2], [0, 1, 2]))
    full = SPEC.validate_params(params)
    for b in layout.buffers:
        for s in range(3):
            before = original[s, b.byte_offset:b.byte_offset + b.bytes]
            after = layout.hot(b, s)
            assert check_error(before, after, b, full) is None
    codec.close()


def test_bound_is_tight_enough_to_catch_errors():
    """The check fails a decode perturbed by one fp8 ulp, so the bound is not vacuous."""
    rng = np.random.default_rng(6)
    shape = (16, 4, 64)
    b = BufferDesc(0, Role.KEY, 0, 0, 16 * 4 * 64 * 2, DType.BFLOAT16, *shape)
    x = kv_like(rng, shape, DType.BFLOAT16)
    vals = ref.hot_values(x, DType.BFLOAT16)
    codes, scales = ref.quantize(vals, shape, "e4m3", "page_head")
    y = ref.dequantize(codes, scales, shape, "e4m3", "page_head")
    params = {"format": "e4m3", "granularity": "page_head"}
    assert check_error(x, ref.hot_bytes(y, DType.BFLOAT16), b, params) is None
    worse = y.copy()
    i = int(np.argmax(np.abs(vals)))
    worse[i] = worse[i] * np.float32(1 + 2.0**-3)
    problem = check_error(x, ref.hot_bytes(worse, DType.BFLOAT16), b, params)
    assert problem is not None and "exceeds" in problem


def test_special_values_have_the_documented_fate():
    shape = (2, 1, 16)
    x = np.zeros(shape, np.float32)
    x[0, 0, :6] = [np.nan, np.inf, -np.inf, 448.0 * 2, -3.0e38, 1.0]
    x[1, 0, :] = 0.0
    for fmt in FORMATS:
        b = BufferDesc(0, Role.KEY, 0, 0, x.nbytes, DType.FLOAT32, *shape)
        pool = x.reshape(1, -1).view(np.uint8).copy()
        group = PoolGroupDesc([PoolDesc(pool.ctypes.data, pool.shape[1], 1)], [LifeCycleDesc(0, (b,))])
        with kv.create_codec("fp8", {"format": fmt, "granularity": "token_head"}) as codec:
            codec.configure([group])
            cold = np.zeros((1, codec.cold_page_bytes(0)), np.uint8)
            codec.encode(0, cold, pairs([0], [0]))
            pool[:] = 0
            codec.decode(0, cold, pairs([0], [0]))
        y = pool.view(np.float32).reshape(shape)
        assert np.isnan(y[0, 0, 0])
        if fmt == "e4m3":
            assert np.isnan(y[0, 0, 1]) and np.isnan(y[0, 0, 2])
        else:
            assert y[0, 0, 1] == np.inf and y[0, 0, 2] == -np.inf
        assert np.all(np.isfinite(y[0, 0, 3:])) and y[0, 0, 4] == np.float32(-3.0e38)
        assert np.all(y[1] == 0) and not np.signbit(y[1]).any()


# -- mixed layouts and the buffer policy ------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"lossless_roles": "key"}, {"lossless_roles": "value,other"},
                                   {"lossless_layers": "0, 3"}, {"lossless_roles": "key,value"}])
def test_lossless_policy(extra):
    rng = np.random.default_rng(7)
    layout = build_layout(rng, MIXED, num_slots=2)
    params = {"granularity": "page_head", **extra}
    codec, cold = encode_cpu(layout, params, [1], [0])
    for p in layout.pools:
        p[0] = 0
    original = [p[1].copy() for p in layout.pools]
    codec.decode(0, cold, pairs([0], [0]))
    exact = 0
    for b in layout.buffers:
        got = layout.hot(b, 0)
        want = original[b.pool_index][b.byte_offset:b.byte_offset + b.bytes]
        if not ref.quantizes(b, params):
            assert np.array_equal(got, want), b
            exact += 1
        else:
            assert not np.array_equal(got, want)  # bf16 noise does not survive e4m3 exactly
    assert exact >= 3  # the fp8, uint8 and int32 buffers at least
    size = codec.cold_page_bytes(0)
    assert size == len(ref.encode_page(layout.buffers, lambda b: layout.hot(b, 1), params))
    codec.close()


def test_cold_page_is_about_half_of_bf16():
    shape = (64, 8, 128)
    nbytes = int(np.prod(shape)) * 2
    bufs = [BufferDesc(l, r, 0, (2 * l + int(r)) * nbytes, nbytes, DType.BFLOAT16, *shape)
            for l in range(4) for r in (Role.KEY, Role.VALUE)]
    pool = np.zeros((1, 8 * nbytes), np.uint8)
    group = PoolGroupDesc([PoolDesc(pool.ctypes.data, pool.shape[1], 1)], [LifeCycleDesc(0, tuple(bufs))])
    for gran, scales in (("page_head", 8), ("token_head", 64 * 8), ("page", 1)):
        with kv.create_codec("fp8", {"granularity": gran}) as codec:
            codec.configure([group])
            assert codec.cold_page_bytes(0) == 8 * (nbytes // 2 + (4 * scales + 15) // 16 * 16)
            assert codec.cold_page_bytes(0) <= 0.52 * pool.shape[1]


def test_lifecycle_without_buffers_is_stored_losslessly():
    rng = np.random.default_rng(8)
    pools = [rng.integers(0, 256, (3, n), dtype=np.uint8) for n in (100, 7)]
    group = PoolGroupDesc([PoolDesc(p.ctypes.data, p.shape[1], 3) for p in pools], [LifeCycleDesc(5)])
    with kv.create_codec("fp8") as codec:
        codec.configure([group])
        assert codec.cold_page_bytes(5) == 112 + 16
        cold = np.zeros((1, 128), np.uint8)
        codec.encode(5, cold, pairs([0], [2]))
        assert np.array_equal(cold[0, :100], pools[0][2]) and np.array_equal(cold[0, 112:119], pools[1][2])
        assert not cold[0, 100:112].any() and not cold[0, 119:].any()


def test_batching_representative_and_queries():
    rng = np.random.default_rng(9)
    shape = (4, 2, 16)
    n = 4 * 2 * 16 * 2
    pool = rng.integers(0, 256, (4, 2 * n), dtype=np.uint8)
    k = BufferDesc(0, Role.KEY, 0, 0, n, DType.BFLOAT16, *shape)
    v = BufferDesc(0, Role.VALUE, 0, n, n, DType.BFLOAT16, *shape)
    group = PoolGroupDesc([PoolDesc(pool.ctypes.data, 2 * n, 4)],
                          [LifeCycleDesc(7, (k, v)), LifeCycleDesc(3, (k, v)), LifeCycleDesc(5, (k,)),
                           LifeCycleDesc(9, (k,))])
    with kv.create_codec("fp8") as codec:
        codec.configure([group])
        assert [codec.batching_layer_group_id(i) for i in (7, 3, 5, 9)] == [3, 3, 5, 5]
        assert codec.batching_layer_group_id(4) < 0 and codec.cold_page_bytes(4) == 0
        assert codec.cold_page_bytes(5) < codec.cold_page_bytes(3)
        assert codec.page_index_location(3) == kv.PageIndexLocation.HOST
        assert codec.page_index_location(4) == kv.PageIndexLocation.BAD


def test_overlapping_quantized_buffer_is_rejected():
    shape = (4, 2, 16)
    n = 4 * 2 * 16 * 2
    pool = np.zeros((2, n), np.uint8)
    bufs = (BufferDesc(0, Role.KEY, 0, 0, n, DType.BFLOAT16, *shape), BufferDesc(0, Role.OTHER, 0, 16, 32))
    group = PoolGroupDesc([PoolDesc(pool.ctypes.data, n, 2)], [LifeCycleDesc(0, bufs)])
    with kv.create_codec("fp8") as codec:
        with pytest.raises(kv.CodecCallError, match=r"buffers\[0\] and buffers\[1\] overlap"):
            codec.configure([group])


def test_bad_indices_are_refused():
    rng = np.random.default_rng(10)
    layout = build_layout(rng, MIXED[:1], num_slots=3)
    with kv.create_codec("fp8") as codec:
        codec.configure(layout.groups)
        cold = np.zeros((2, codec.cold_page_bytes(0)), np.uint8)
        with pytest.raises(kv.CodecCallError, match=r"pageIndices\[1\]\.src is 3; hot slot indices are 0\.\.2"):
            codec.encode(0, cold, pairs([0, 1], [0, 3]))
        with pytest.raises(kv.CodecCallError, match=r"pageIndices\[0\]\.src is -1"):
            codec.decode(0, cold, pairs([0], [-1]))
        codec.encode(0, 0, 0, num_pages=0)  # empty calls succeed


# -- parameters -------------------------------------------------------------------------------


def test_spec_is_registered_with_its_bound():
    spec = kv.get_codec_spec("fp8")
    assert spec.plugin == "fp8" and not spec.lossless and "2^-(m+1)" in spec.error_bound
    assert spec.format_version == _testing.FORMAT_VERSION == 1
    assert spec.defaults() == {"format": "e4m3", "granularity": "page_head", "lossless_roles": "",
                               "lossless_layers": "", "kernel": "auto", "small_blocks": "deep",
                               "finite_check": "block"}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"format": "e3m4"}, r"'format' is 'e3m4'; valid values are 'e4m3', 'e5m2'"),
        ({"granularity": "head"}, r"'granularity' is 'head'; valid values"),
        ({"lossless_roles": "key,query"}, r"'lossless_roles' names 'query'; valid roles"),
        ({"lossless_layers": "1,x"}, r"'lossless_layers' has the item 'x'"),
        ({"lossless_layers": 3}, r"'lossless_layers' is 3 \(int\); it must be a string"),
        ({"scale": "per_head"}, r"has no parameter 'scale'; valid parameters: 'format'"),
        ({"kernel": "v2"}, r"'kernel' is 'v2'; valid values are 'auto', 'v1', 'b2', 'b4', 'tile'"),
        ({"small_blocks": "narrow"}, r"'small_blocks' is 'narrow'; valid values"),
        ({"finite_check": "none"}, r"'finite_check' is 'none'; valid values"),
        ({"kernel": "v1", "finite_check": "element"},
         r"small_blocks='deep' and finite_check='element' need a tunable kernel; 'kernel' is 'v1'"),
        ({"kernel": "v1"}, r"finite_check='block' need a tunable kernel"),
    ],
)
def test_bad_parameters_are_refused_in_python(params, message):
    with pytest.raises(kv.CodecParamError, match=message):
        kv.create_codec("fp8", params)


@pytest.mark.parametrize(
    "json, message",
    [
        ('{"format": "e3m4"}', "'format' is e3m4; valid values are 'e4m3', 'e5m2'"),
        ('{"granularity": 1}', "'granularity' is 1; valid values"),
        ('{"lossless_layers": "-1"}', "'lossless_layers' has the item '-1'"),
        ('{"lossless_roles": "keys"}', "'lossless_roles' names 'keys'"),
        ('{"bogus": 1}', "unknown fp8 parameter 'bogus'"),
        ('{"kernel": "b3"}', "'kernel' is b3; valid values are 'auto', 'v1', 'b2', 'b4', 'tile'"),
        ('{"small_blocks": "x"}', "'small_blocks' is x; valid values are 'wide', 'deep'"),
        ('{"finite_check": 0}', "'finite_check' is 0; valid values are 'element', 'block'"),
        ('{"kernel": "v1", "small_blocks": "deep", "finite_check": "element"}',
         "small_blocks='deep' and finite_check='element' need a tunable kernel; 'kernel' is 'v1'"),
        ('{"kernel": "v1"}', "small_blocks='deep' and finite_check='block' need a tunable kernel"),
        ('{"format": }', "malformed codec parameters"),
    ],
)
def test_bad_parameters_are_refused_natively(json, message):
    from kvcodec_sdk import _native

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _native.NativeCodec(_ext.codec_factory(), json, -1)


TUNINGS = [{"kernel": k, "small_blocks": s, "finite_check": f}
           for k, s, f in itertools.product(("auto", "b2", "b4", "tile"), ("wide", "deep"), ("element", "block"))] + [
    {"kernel": "v1", "small_blocks": "wide", "finite_check": "element"}]


@pytest.mark.parametrize("tuning", TUNINGS, ids=["-".join(t.values()) for t in TUNINGS])
def test_tuning_knobs_are_accepted_and_leave_the_blob_unchanged(tuning):
    """The kernel knobs only steer the CUDA kernel: same cold size and bytes as the defaults (the
    GPU tests check the kernel itself)."""
    rng = np.random.default_rng(21)
    host = build_layout(rng, MIXED, num_slots=4, special=True)
    blobs = []
    for params in ({"granularity": "token_head"}, {"granularity": "token_head", **tuning}):
        codec = kv.create_codec("fp8", params, device="cpu")
        assert codec.params["kernel"] == params.get("kernel", "auto")
        codec.configure(host.groups)
        cold = np.zeros((4, codec.cold_page_bytes(0)), np.uint8)
        codec.encode(0, cold, pairs([0, 1, 2, 3], [3, 2, 1, 0]))
        codec.close()
        blobs.append(cold)
    assert blobs[0].shape == blobs[1].shape and np.array_equal(blobs[0], blobs[1])


def test_tuning_knobs_stay_out_of_a_disk_regions_identity():
    """Kernel variants never change a blob byte, so retuning keeps a disk tier's pages; the format
    does change blobs and must invalidate them."""
    from kvcodec_sdk.disk import CodecIdentity

    default = CodecIdentity.from_name("fp8")
    tuned = CodecIdentity.from_name("fp8", {"kernel": "b4", "small_blocks": "deep", "finite_check": "block"})
    assert tuned.param_hash == default.param_hash
    assert "kernel" not in tuned.params and tuned.params["granularity"] == "page_head"
    assert CodecIdentity.from_name("fp8", {"format": "e5m2"}).param_hash != default.param_hash


def _one_buffer_blob(role, params, hot):
    """The blob of one page holding one (16 tokens, 2 heads, 128) bf16 buffer of ``role``."""
    buf = BufferDesc(0, role, 0, 0, hot.shape[1], DType.BFLOAT16, 16, 2, 128)
    codec = kv.create_codec("fp8", params, device="cpu")
    codec.configure([PoolGroupDesc([PoolDesc(hot.ctypes.data, hot.shape[1], hot.shape[0])], [LifeCycleDesc(0, (buf,))])])
    cold = np.zeros((1, codec.cold_page_bytes(0)), np.uint8)
    codec.encode(0, cold, pairs([0], [1]))
    codec.close()
    return cold[0], buf


@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
def test_a_key_value_buffer_is_quantized_like_a_key_buffer_of_its_shape(params):
    """Role KEY_VALUE (the heads axis alternates K and V; vLLM's GPU blocks per head) is stored
    exactly as a K buffer of the same shape, and as the numpy model says."""
    rng = np.random.default_rng(31)
    hot = np.zeros((2, 16 * 2 * 128 * 2), np.uint8)
    hot[1] = kv_like(rng, (16, 2, 128), DType.BFLOAT16)
    as_key, _ = _one_buffer_blob(Role.KEY, params, hot)
    as_kv, buf = _one_buffer_blob(Role.KEY_VALUE, params, hot)
    assert as_kv.size < hot.shape[1] * 0.6, "a K-and-V buffer is quantized"
    np.testing.assert_array_equal(as_kv, as_key)
    np.testing.assert_array_equal(as_kv, np.frombuffer(ref.encode_page([buf], lambda b: hot[1], params), np.uint8))


@pytest.mark.parametrize("lossless", ["key", "value"])
def test_a_key_value_buffer_stays_lossless_when_either_role_is_listed(lossless):
    rng = np.random.default_rng(32)
    hot = np.zeros((2, 16 * 2 * 128 * 2), np.uint8)
    hot[1] = kv_like(rng, (16, 2, 128), DType.BFLOAT16)
    blob, _ = _one_buffer_blob(Role.KEY_VALUE, {"lossless_roles": lossless}, hot)
    assert blob.size == hot.shape[1] and np.array_equal(blob, hot[1])
