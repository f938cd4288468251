"""The nvfp4 CPU reference: blobs and decoded pages byte for byte equal to the independent numpy
model (nvfp4_reference.py), round-to-nearest-even ties, special values, the declared bound, the
cold page size, the lossless lists, parameters and layouts the codec refuses."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from kvcodec_nvfp4 import check_error, error_bound_of
from nvfp4_helpers import BF, FP, MIXED, K, O, V, build_layout, pairs
from nvfp4_reference import cold_page_bytes, decode_page, encode_page

import kvcodec_sdk as kv
from kvcodec_sdk import BufferDesc, LifeCycleDesc, PoolDesc, PoolGroupDesc
from kvcodec_sdk.errors import CodecParamError

GRANULARITIES = ("page_head", "page")


def values(raw, dtype) -> np.ndarray:
    return raw.view(np.float16 if dtype == FP else ml_dtypes.bfloat16).astype(np.float32)


def to_hot(x, dtype) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16 if dtype == FP else ml_dtypes.bfloat16).view(np.uint8)


def round_trip(layout, params, slots, lc=0):
    """Encodes hot ``slots`` into cold slots 0..n-1 and decodes them into fresh pools."""
    codec = kv.create_codec("nvfp4", params, device="cpu")
    codec.configure(layout.groups)
    page = codec.cold_page_bytes(lc)
    cold = np.full((len(slots), page), 0xCD, np.uint8)
    codec.encode(lc, cold, pairs(range(len(slots)), slots))
    fresh = [np.zeros_like(p) for p in layout.pools]
    dec = kv.create_codec("nvfp4", params, device="cpu")
    dec.configure([PoolGroupDesc([PoolDesc(a.ctypes.data, a.shape[1], a.shape[0]) for a in fresh],
                                 list(layout.groups[0].lifecycles))])
    dec.decode(lc, cold, pairs(slots, range(len(slots))))
    codec.close()
    dec.close()
    return cold, fresh


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("odd_slot", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
def test_blobs_and_decoded_pages_equal_the_numpy_model(granularity, odd_slot, special):
    rng = np.random.default_rng(7)
    layout = build_layout(rng, MIXED, 5, special=special, odd_slot=odd_slot, offset=3 if odd_slot else 0)
    params = {"granularity": granularity}
    slots = [4, 0, 2]
    cold, fresh = round_trip(layout, params, slots)
    assert cold.shape[1] == cold_page_bytes(layout.buffers, params)
    for i, s in enumerate(slots):
        want = encode_page(layout.buffers, lambda b: layout.hot(b, s), params)
        got = cold[i].tobytes()
        assert got == want, f"slot {s}: first differing byte {next(j for j in range(len(want)) if got[j] != want[j])}"
        for b, ref in zip(layout.buffers, decode_page(layout.buffers, want, params)):
            out = fresh[b.pool_index][s, b.byte_offset:b.byte_offset + b.bytes]
            assert np.array_equal(out, ref), (b, np.flatnonzero(out != ref)[:5])


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_values_next_to_every_rounding_threshold_encode_as_the_numpy_model(granularity):
    # The encoder compares |x| with per-block thresholds instead of dividing by the block scale;
    # values 0-2 ulps either side of every threshold, under random block scales, pin that it
    # codes exactly what rounding the quotient does (the model divides).
    rng = np.random.default_rng(11)
    spec = [[(0, K, BF, (16, 12, 128)), (0, V, FP, (16, 12, 128)), (1, K, FP, (8, 2, 32))]]
    layout = build_layout(rng, spec, 3, near=True)
    params = {"granularity": granularity}
    cold, fresh = round_trip(layout, params, [2, 0, 1])
    for i, s in enumerate([2, 0, 1]):
        want = encode_page(layout.buffers, lambda b: layout.hot(b, s), params)
        assert cold[i].tobytes() == want
        for b, ref in zip(layout.buffers, decode_page(layout.buffers, want, params)):
            assert np.array_equal(fresh[b.pool_index][s, b.byte_offset:b.byte_offset + b.bytes], ref)


def _tie_page(dtype):
    """A (1, 1, 32) page whose second block holds every e2m1 tie: the group amax 2.625 makes
    S = 2^-10 exactly, the block amax 1.5 makes its scale 256 * 2^-10 = 0.25 exactly."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32) * np.float32(0.25)
    x = np.zeros(32, np.float32)
    x[0] = 2.625
    x[16:24], x[24:32] = ties, -ties
    return x.astype(ml_dtypes.bfloat16 if dtype == BF else np.float16)


@pytest.mark.parametrize("dtype", [BF, FP], ids=["bf16", "fp16"])
def test_ties_round_to_the_even_e2m1_code(dtype):
    x = _tie_page(dtype)
    layout = build_layout(np.random.default_rng(0), [[(0, K, dtype, (1, 1, 32))]], 1)
    layout.pools[0][0, :64] = x.view(np.uint8)
    cold, fresh = round_trip(layout, {"granularity": "page"}, [0])
    codes = cold[0, :16]
    nibbles = np.stack([codes & 15, codes >> 4], 1).reshape(-1)
    assert nibbles[16:24].tolist() == [0, 2, 2, 4, 4, 6, 6, 7]
    assert nibbles[24:32].tolist() == [8, 10, 10, 12, 12, 14, 14, 15]
    assert cold[0, 17] == 0x78  # e4m3 256: exponent 15, mantissa 0
    assert np.frombuffer(cold[0, 32:36].tobytes(), "<f4")[0] == np.float32(2.0**-10)
    y = fresh[0][0, :64].view(x.dtype).astype(np.float32)
    assert y[16:24].tolist() == [0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 1.5]


def test_special_values_decode_as_declared():
    rng = np.random.default_rng(3)
    layout = build_layout(rng, [[(0, K, FP, (4, 4, 16)), (0, V, BF, (4, 4, 16))]], 2, special=True)
    _, fresh = round_trip(layout, {}, [0, 1])
    for b in layout.buffers:
        for s in (0, 1):
            x = values(layout.hot(b, s), b.dtype)
            y = values(fresh[b.pool_index][s, b.byte_offset:b.byte_offset + b.bytes], b.dtype)
            assert np.all(np.isfinite(y)), "nvfp4 never decodes to NaN or infinity"
            assert np.all(y[np.isnan(x)] == 0)
            assert np.all(np.sign(y[np.isinf(x)]) == np.sign(x[np.isinf(x)]))
            top = np.abs(x) == np.abs(x[np.isfinite(x)]).max()
            assert np.all(np.abs(y[top]) > 0.9 * np.abs(x[top])), "the largest finite values survive (saturated)"


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_the_declared_bound_holds_and_can_fail(granularity):
    rng = np.random.default_rng(11)
    layout = build_layout(rng, MIXED, 4, special=True)
    params = {"granularity": granularity, "lossless_roles": "", "lossless_layers": ""}
    _, fresh = round_trip(layout, params, [0, 1, 2, 3])
    worst = 0.0
    for b in layout.buffers:
        for s in range(4):
            x, y = layout.hot(b, s), fresh[b.pool_index][s, b.byte_offset:b.byte_offset + b.bytes]
            assert check_error(x, y, b, params) is None
            if b.dtype in (BF, FP) and b.role != O:
                xf, yf = values(x, b.dtype), values(y, b.dtype)
                fin = np.isfinite(xf)
                bound = error_bound_of(xf, (b.tokens_per_page, b.num_heads, b.head_dim), int(b.dtype), granularity)
                worst = max(worst, float(np.max(np.abs(yf[fin] - xf[fin]) / bound[fin])))
                i = int(np.flatnonzero(fin)[0])  # off by the page's largest magnitude: must be refused
                bad = y.copy()
                bad[2 * i:2 * i + 2] = to_hot([-np.sign(xf[i] or 1) * np.abs(xf[fin]).max()], b.dtype)
                assert check_error(x, bad, b, params) is not None
    assert 0.3 < worst <= 1.0, f"the bound is loose or broken: worst error is {worst:.3f} of it"


def test_k_and_v_only_pages_take_at_most_0_30_of_bf16():
    layout = build_layout(np.random.default_rng(0), [[(0, K, BF, (16, 8, 128)), (0, V, BF, (16, 8, 128))]], 1)
    for granularity in GRANULARITIES:
        codec = kv.create_codec("nvfp4", {"granularity": granularity}, device="cpu")
        codec.configure(layout.groups)
        ratio = codec.cold_page_bytes(0) / layout.pools[0].shape[1]
        codec.close()
        assert ratio <= 0.30, ratio
        assert ratio == pytest.approx(0.28125, abs=0.003)


def test_lossless_roles_and_layers_are_copied_exactly():
    rng = np.random.default_rng(5)
    layout = build_layout(rng, MIXED, 2)
    params = {"lossless_roles": "value", "lossless_layers": "0, 2"}
    cold, fresh = round_trip(layout, params, [1, 0])
    assert cold.shape[1] == cold_page_bytes(layout.buffers, params)
    for b in layout.buffers:
        exact = b.role == V or b.layer_id in (0, 2) or b.dtype not in (BF, FP) or b.role == O
        same = np.array_equal(layout.hot(b, 1), fresh[b.pool_index][1, b.byte_offset:b.byte_offset + b.bytes])
        assert same == exact or (same and not exact), b


@pytest.mark.parametrize("params,fragment", [
    ({"granularity": "token_head"}, "granularity"),
    ({"lossless_roles": "keys"}, "'keys'"),
    ({"lossless_layers": "0,x"}, "'x'"),
    ({"lossless_layers": "-1"}, "'-1'"),
    ({"format": "e4m3"}, "format"),
])
def test_bad_parameters_are_refused_by_name(params, fragment):
    with pytest.raises(CodecParamError, match=fragment):
        kv.create_codec("nvfp4", params, device="cpu")


def test_a_quantized_buffer_sharing_bytes_with_another_is_refused():
    pool = np.zeros((2, 4096), np.uint8)
    bufs = (BufferDesc(0, K, 0, 0, 2048, BF, 8, 1, 128), BufferDesc(0, O, 0, 1024, 64, kv.DType.UINT8))
    codec = kv.create_codec("nvfp4", device="cpu")
    with pytest.raises(Exception, match="overlap"):
        codec.configure([PoolGroupDesc([PoolDesc(pool.ctypes.data, 4096, 2)], [LifeCycleDesc(0, bufs)])])


def test_lifecycles_with_the_same_buffers_batch_together():
    layout = build_layout(np.random.default_rng(1), MIXED, 2, lifecycles=(7, 3, 5))
    codec = kv.create_codec("nvfp4", device="cpu")
    codec.configure(layout.groups)
    assert [codec.batching_layer_group_id(i) for i in (7, 3, 5)] == [3, 3, 3]
    codec.close()


@pytest.mark.parametrize("params,fragment", [
    ({"lossless_roles": "keys"}, "'keys'"),
    ({"lossless_layers": "0,x"}, "'x'"),
    ({"granularity": "token_head"}, "'page_head', 'page'"),
])
def test_the_native_codec_refuses_what_the_spec_would(params, fragment):
    """A native caller skips the Python spec: the C++ parameters refuse the same values."""
    import dataclasses

    from kvcodec_nvfp4.plugin import SPEC

    bare = kv.CodecSpec(**{f.name: getattr(SPEC, f.name) for f in dataclasses.fields(kv.CodecSpec)})
    registry = kv.CodecRegistry(load_entry_points=False, builtins=False)
    registry.register(dataclasses.replace(bare, params=tuple(
        dataclasses.replace(p, choices=None) if p.name == "granularity" else p for p in SPEC.params)))
    with pytest.raises(Exception, match=fragment):
        registry.create_codec("nvfp4", params, "cpu")


def _one_buffer_blob(role, params, hot):
    """The blob of one page holding one (16 tokens, 2 heads, 128) bf16 buffer of ``role``."""
    buf = BufferDesc(0, role, 0, 0, hot.shape[1], BF, 16, 2, 128)
    codec = kv.create_codec("nvfp4", params, device="cpu")
    codec.configure([PoolGroupDesc([PoolDesc(hot.ctypes.data, hot.shape[1], hot.shape[0])], [LifeCycleDesc(0, (buf,))])])
    cold = np.zeros((1, codec.cold_page_bytes(0)), np.uint8)
    codec.encode(0, cold, pairs([0], [1]))
    codec.close()
    return cold[0], buf


def _key_value_page(seed):
    rng = np.random.default_rng(seed)
    hot = np.zeros((2, 16 * 2 * 128 * 2), np.uint8)
    hot[1] = to_hot(rng.standard_normal((16, 2, 128)) * np.array([3.0, 0.5])[None, :, None], BF).reshape(-1)
    return hot


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_a_key_value_buffer_is_quantized_like_a_key_buffer_of_its_shape(granularity):
    """Role KEY_VALUE (the heads axis alternates K and V; vLLM's GPU blocks per head) is stored
    exactly as a K buffer of the same shape, and as the numpy model says."""
    hot = _key_value_page(41)
    params = {"granularity": granularity}
    as_key, _ = _one_buffer_blob(kv.Role.KEY, params, hot)
    as_kv, buf = _one_buffer_blob(kv.Role.KEY_VALUE, params, hot)
    assert as_kv.size < hot.shape[1] * 0.3, "a K-and-V buffer is quantized"
    np.testing.assert_array_equal(as_kv, as_key)
    np.testing.assert_array_equal(as_kv, np.frombuffer(encode_page([buf], lambda b: hot[1], params), np.uint8))


@pytest.mark.parametrize("lossless", ["key", "value"])
def test_a_key_value_buffer_stays_lossless_when_either_role_is_listed(lossless):
    hot = _key_value_page(42)
    blob, _ = _one_buffer_blob(kv.Role.KEY_VALUE, {"lossless_roles": lossless}, hot)
    assert blob.size == hot.shape[1] and np.array_equal(blob, hot[1])
