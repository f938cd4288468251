"""The concat codec's CPU reference: blob format, queries, batching, argument validation, ownership.

Every expected value is computed independently with numpy (a blob is the concatenation, in pool
order, of the page's slot in every pool of its hot pool group), never with the codec itself.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_helpers import (
    GUARD_BYTES,
    ODD_SLOT_SIZES,
    HotLayout,
    guarded_buffer,
    make_hot_layout,
    pairs,
    random_bytes,
)

import kvcodec_sdk
from kvcodec_sdk import (
    BufferDesc,
    CodecCallError,
    CodecConsumedError,
    DType,
    LifeCycleDesc,
    PageIndexLocation,
    PoolDesc,
    PoolGroupDesc,
    Role,
    _native,
)

# -- hypothesis strategies ------------------------------------------------------------------------


@st.composite
def layouts(draw) -> HotLayout:
    """A random hot layout: 1-3 groups, 3-4 pools each with odd slot sizes, 2-12 slots (pools of
    one group may differ in slot count), 1-4 lifecycles per group with distinct IDs."""
    num_groups = draw(st.integers(1, 3))
    counts_per_group = [draw(st.integers(1, 4)) for _ in range(num_groups)]
    ids = draw(st.lists(st.integers(0, 2**31 - 1), min_size=sum(counts_per_group), max_size=sum(counts_per_group),
                        unique=True))
    sizes, slots, lcs = [], [], []
    for g in range(num_groups):
        n = draw(st.integers(3, 4))
        sizes.append(draw(st.lists(st.sampled_from(ODD_SLOT_SIZES), min_size=n, max_size=n)))
        base = draw(st.integers(2, 12))
        slots.append([base + draw(st.integers(0, 2)) for _ in range(n)])
        start = sum(counts_per_group[:g])
        lcs.append(ids[start : start + counts_per_group[g]])
    seed = draw(st.integers(0, 2**32 - 1))
    return make_hot_layout(np.random.default_rng(seed), sizes, slots, lcs)


def cold_buffer(rng: np.random.Generator, num_slots: int, page_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(backing, cold) where cold is a (num_slots, page_bytes) view of random bytes between guards."""
    backing, view = guarded_buffer(rng, num_slots * page_bytes)
    return backing, view.reshape(num_slots, page_bytes)


# -- round trips ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), data=st.data())
def test_round_trip_is_byte_exact_and_stays_in_bounds(layout: HotLayout, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    with kvcodec_sdk.create_codec("concat", device="cpu") as codec:
        codec.configure(layout.groups)
        for g in range(len(layout.groups)):
            if not layout.lifecycles[g]:
                continue
            lifecycle = data.draw(st.sampled_from(layout.lifecycles[g]), label=f"lifecycle of group {g}")
            n_hot = layout.num_slots(g)
            page = layout.page_bytes(g)
            # Non-contiguous, destination-unique index sets; sources may repeat on encode.
            n = data.draw(st.integers(1, n_hot), label="pages")
            num_cold = n + data.draw(st.integers(1, 6), label="spare cold slots")
            cold_dst = rng.permutation(num_cold)[:n]
            hot_src = rng.integers(0, n_hot, size=n) if data.draw(st.booleans()) else rng.permutation(n_hot)[:n]
            cold_backing, cold = cold_buffer(rng, num_cold, page)
            cold_before = cold_backing.copy()
            hot_before = layout.snapshot()
            expected_pages = [layout.hot_page(g, int(s)) for s in hot_src]

            codec.encode(lifecycle, cold, pairs(cold_dst, hot_src))

            for d, want in zip(cold_dst, expected_pages):
                np.testing.assert_array_equal(cold[d], want, err_msg=f"blob at cold slot {d}")
            untouched = np.setdiff1d(np.arange(num_cold), cold_dst)
            expected_cold = cold_before[GUARD_BYTES:-GUARD_BYTES].reshape(num_cold, page)
            np.testing.assert_array_equal(cold[untouched], expected_cold[untouched])
            np.testing.assert_array_equal(cold_backing[:GUARD_BYTES], cold_before[:GUARD_BYTES])
            np.testing.assert_array_equal(cold_backing[-GUARD_BYTES:], cold_before[-GUARD_BYTES:])
            for before, after in zip(hot_before, layout.backings):
                for b, a in zip(before, after):
                    np.testing.assert_array_equal(a, b, err_msg="encode modified a hot pool")

            # Decode every written blob into distinct hot slots (a different mapping from encode's).
            hot_dst = rng.permutation(n_hot)[:n]
            expected_backings = [[b.copy() for b in group] for group in layout.backings]
            for p, pool in enumerate(layout.pools[g]):
                slot = pool.shape[1]
                view = expected_backings[g][p][GUARD_BYTES:-GUARD_BYTES].reshape(pool.shape[0], slot)
                offset = sum(q.shape[1] for q in layout.pools[g][:p])
                for h, want in zip(hot_dst, expected_pages):
                    view[h] = want[offset : offset + slot]
            cold_after_encode = cold_backing.copy()

            codec.decode(lifecycle, cold, pairs(hot_dst, cold_dst))

            for want_group, got_group in zip(expected_backings, layout.backings):
                for want, got in zip(want_group, got_group):
                    np.testing.assert_array_equal(got, want, err_msg="decode wrote the wrong bytes or outside its slots")
            np.testing.assert_array_equal(cold_backing, cold_after_encode, err_msg="decode modified the cold buffer")


def test_round_trip_of_every_slot_through_every_lifecycle(configured):
    codec, layout = configured
    for g, ids in enumerate(layout.lifecycles):
        n = layout.num_slots(g)
        for lifecycle in ids:
            cold = np.zeros((n, layout.page_bytes(g)), np.uint8)
            codec.encode(lifecycle, cold, pairs(np.arange(n)[::-1], np.arange(n)))
            originals = [p.copy() for p in layout.pools[g]]
            for s in range(n):
                np.testing.assert_array_equal(cold[n - 1 - s], layout.hot_page(g, s))
            for p in layout.pools[g]:
                p[:] = 0
            codec.decode(lifecycle, cold, pairs(np.arange(n), np.arange(n)[::-1]))
            for pool, orig in zip(layout.pools[g], originals):
                np.testing.assert_array_equal(pool[:n], orig[:n])


def test_flat_index_array_and_num_pages_prefix(configured):
    codec, layout = configured
    g, lifecycle = 0, layout.lifecycles[0][0]
    cold = np.zeros((3, layout.page_bytes(g)), np.uint8)
    flat = pairs([2, 0, 1], [1, 0, 1]).reshape(-1)  # (2N,) form
    codec.encode(lifecycle, cold, flat, num_pages=2)  # only the first two pairs
    np.testing.assert_array_equal(cold[2], layout.hot_page(g, 1))
    np.testing.assert_array_equal(cold[0], layout.hot_page(g, 0))
    assert not cold[1].any(), "num_pages=2 must not process the third pair"


def test_raw_addresses_and_any_stream_on_cpu(configured):
    codec, layout = configured
    g, lifecycle = 0, layout.lifecycles[0][0]
    cold = np.zeros((2, layout.page_bytes(g)), np.uint8)
    idx = pairs([1, 0], [0, 1])
    codec.encode(lifecycle, cold.ctypes.data, idx.ctypes.data, num_pages=2, stream=12345)
    np.testing.assert_array_equal(cold[1], layout.hot_page(g, 0))
    np.testing.assert_array_equal(cold[0], layout.hot_page(g, 1))


# -- queries --------------------------------------------------------------------------------------


def test_queries(configured):
    codec, layout = configured
    for g, ids in enumerate(layout.lifecycles):
        expected_bytes = sum(p.slot_bytes for p in layout.groups[g].pools)
        assert expected_bytes == layout.groups[g].page_bytes
        rep = min(ids)
        for lifecycle in ids:
            assert codec.cold_page_bytes(lifecycle) == expected_bytes
            assert codec.batching_layer_group_id(lifecycle) == rep
            assert codec.page_index_location(lifecycle) is PageIndexLocation.HOST
        assert codec.batching_layer_group_id(rep) == rep


def test_lifecycles_of_different_groups_never_share_a_batching_id(configured):
    codec, layout = configured
    reps = [codec.batching_layer_group_id(ids[0]) for ids in layout.lifecycles]
    assert len(set(reps)) == len(reps)


@pytest.mark.parametrize("unknown", [-1, -(2**31), 2**31 - 1, 1001])
def test_queries_for_unknown_lifecycles(configured, unknown):
    codec, _ = configured
    assert codec.cold_page_bytes(unknown) == 0
    assert codec.batching_layer_group_id(unknown) < 0
    assert codec.page_index_location(unknown) is PageIndexLocation.BAD


def test_queries_before_configure_report_failure(codec):
    assert codec.cold_page_bytes(0) == 0
    assert codec.batching_layer_group_id(0) < 0
    assert codec.page_index_location(0) is PageIndexLocation.BAD


def test_group_without_lifecycles_and_empty_configuration(rng):
    layout = make_hot_layout(rng, [[7, 1, 3], [5, 5, 5]], [[2, 2, 2], [3, 3, 3]], [[], [4]])
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure(layout.groups)
        assert codec.cold_page_bytes(4) == 15
        assert codec.batching_layer_group_id(4) == 4
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure([])
        assert codec.cold_page_bytes(0) == 0


# -- batching and chunking ------------------------------------------------------------------------


def _batched_layout(rng):
    # One group with three lifecycles (representative 2), a second group as a bystander.
    return make_hot_layout(rng, [[100, 7, 1, 4097], [3, 3, 3]], [[9, 9, 10, 9], [4, 4, 4]], [[11, 2, 5], [0]])


def test_concatenated_lifecycle_calls_equal_separate_calls(rng):
    layout = _batched_layout(rng)
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure(layout.groups)
        rep = codec.batching_layer_group_id(11)
        assert rep == 2 and codec.batching_layer_group_id(5) == 2
        page = layout.page_bytes(0)
        per_lc = {11: pairs([0, 7, 3], [8, 1, 4]), 2: pairs([5], [0]), 5: pairs([1, 9], [2, 2])}

        separate = np.zeros((10, page), np.uint8)
        for lc, idx in per_lc.items():
            codec.encode(lc, separate, idx)
        together = np.zeros((10, page), np.uint8)
        codec.encode(rep, together, np.concatenate(list(per_lc.values())))
        np.testing.assert_array_equal(together, separate)
        np.testing.assert_array_equal(together[7], layout.hot_page(0, 1))

        # Decode: separate calls per lifecycle vs one call with the representative.
        originals = [p.copy() for p in layout.pools[0]]
        dec = {11: pairs([0, 1, 2], [0, 7, 3]), 2: pairs([3], [5]), 5: pairs([4, 5], [1, 9])}
        for lc, idx in dec.items():
            codec.decode(lc, separate, idx)
        after_separate = [p.copy() for p in layout.pools[0]]
        for p, orig in zip(layout.pools[0], originals):
            p[:] = orig
        codec.decode(rep, together, np.concatenate(list(dec.values())))
        for got, want in zip(layout.pools[0], after_separate):
            np.testing.assert_array_equal(got, want)
        # Hot slot 3 now holds cold blob 5, which was encoded from the original hot slot 0.
        np.testing.assert_array_equal(layout.hot_page(0, 3), np.concatenate([p[0] for p in originals]))


def test_call_split_into_chunks_equals_one_call(rng):
    layout = _batched_layout(rng)
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure(layout.groups)
        page = layout.page_bytes(0)
        idx = pairs(rng.permutation(12)[:9], rng.permutation(9))
        one = random_bytes(rng, 12 * page).reshape(12, page)
        chunked = one.copy()
        codec.encode(5, one, idx)
        for chunk in (idx[:1], idx[1:5], idx[5:5], idx[5:]):
            codec.encode(5, chunked, np.ascontiguousarray(chunk))
        np.testing.assert_array_equal(chunked, one)

        # Decode in chunks vs one call, starting from the same hot state.
        dec = pairs(rng.permutation(9), idx[:, 0])
        start = [p.copy() for p in layout.pools[0]]
        codec.decode(5, one, dec)
        after_one = [p.copy() for p in layout.pools[0]]
        for p, s in zip(layout.pools[0], start):
            p[:] = s
        for chunk in (dec[:4], dec[4:]):
            codec.decode(5, one, np.ascontiguousarray(chunk))
        for got, want in zip(layout.pools[0], after_one):
            np.testing.assert_array_equal(got, want)


# -- empty calls ----------------------------------------------------------------------------------


def test_empty_calls_succeed_and_touch_nothing(configured):
    codec, layout = configured
    lifecycle = layout.lifecycles[0][0]
    before = layout.snapshot()
    cold = np.full((2, layout.page_bytes(0)), 0x5A, np.uint8)
    for op in (codec.encode, codec.decode):
        op(lifecycle, 0, 0, num_pages=0)  # null base and null indices
        op(lifecycle, cold, np.empty((0, 2), np.int32))
        op(lifecycle, cold, np.empty((0,), np.int32))
        op(lifecycle, 0, pairs([0], [0]), num_pages=0)
    assert (cold == 0x5A).all()
    for b, a in zip(before, layout.snapshot()):
        for x, y in zip(b, a):
            np.testing.assert_array_equal(x, y)


# -- invalid calls --------------------------------------------------------------------------------


def test_configure_twice_is_refused_and_keeps_the_first_layout(configured, rng):
    codec, layout = configured
    other = make_hot_layout(rng, [[1, 1, 1]], [[2, 2, 2]], [[layout.lifecycles[0][0]]])
    with pytest.raises(CodecCallError, match="exactly once"):
        codec.configure(other.groups)
    with pytest.raises(CodecCallError, match="exactly once"):
        codec.configure(layout.groups)
    lifecycle = layout.lifecycles[0][0]
    assert codec.cold_page_bytes(lifecycle) == layout.page_bytes(0)
    cold = np.zeros((1, layout.page_bytes(0)), np.uint8)
    codec.encode(lifecycle, cold, pairs([0], [1]))
    np.testing.assert_array_equal(cold[0], layout.hot_page(0, 1))


@pytest.mark.parametrize("op", ["encode", "decode"])
def test_calls_before_configure_fail(codec, op):
    buf = np.zeros(16, np.uint8)
    with pytest.raises(CodecCallError, match=r"before configure\(\)"):
        getattr(codec, op)(0, buf, pairs([0], [0]))


@pytest.mark.parametrize("op", ["encode", "decode"])
def test_unknown_lifecycle_call_fails(configured, op):
    codec, layout = configured
    buf = np.zeros((4, layout.page_bytes(0)), np.uint8)
    with pytest.raises(CodecCallError, match=f"{op}.*unknown lifecycle 999999"):
        getattr(codec, op)(999999, buf, pairs([0], [0]))
    with pytest.raises(CodecCallError, match="unknown lifecycle -1"):
        getattr(codec, op)(-1, buf, pairs([0], [0]))
    assert "unknown lifecycle" in codec.last_error()


@pytest.mark.parametrize("op", ["encode", "decode"])
def test_null_cold_base_with_pages_fails(configured, op):
    codec, layout = configured
    with pytest.raises(CodecCallError, match="cold base pointer is null with 2 pages"):
        getattr(codec, op)(layout.lifecycles[0][0], 0, pairs([0, 1], [0, 1]))


@pytest.mark.parametrize("op", ["encode", "decode"])
def test_null_indices_with_pages_fails(configured, op):
    codec, layout = configured
    cold = np.zeros((4, layout.page_bytes(0)), np.uint8)
    with pytest.raises(CodecCallError, match="pageIndices is null with 3 pages"):
        getattr(codec, op)(layout.lifecycles[0][0], cold, 0, num_pages=3)


def test_bad_indices_name_the_pair_and_value(configured):
    codec, layout = configured
    lifecycle = layout.lifecycles[0][0]
    n = layout.num_slots(0)
    cold = np.zeros((4, layout.page_bytes(0)), np.uint8)
    cases = [
        ("encode", pairs([0, 1], [0, n]), rf"pageIndices\[1\]\.src is {n}; hot slot indices are 0\.\.{n - 1}"),
        ("encode", pairs([0], [-1]), r"pageIndices\[0\]\.src is -1"),
        ("encode", pairs([0, 1, -1], [0, 0, 0]), r"pageIndices\[2\]\.dst is -1; cold slot indices must be >= 0"),
        ("decode", pairs([0, n + 5], [0, 1]), rf"pageIndices\[1\]\.dst is {n + 5}; hot slot indices are 0\.\.{n - 1}"),
        ("decode", pairs([-3], [0]), r"pageIndices\[0\]\.dst is -3"),
        ("decode", pairs([0], [-(2**31)]), rf"pageIndices\[0\]\.src is {-(2**31)}; cold slot indices must be >= 0"),
    ]
    for op, idx, message in cases:
        with pytest.raises(CodecCallError, match=message):
            getattr(codec, op)(lifecycle, cold, idx)


def test_hot_index_limit_is_the_smallest_pool_of_the_group(rng):
    layout = make_hot_layout(rng, [[7, 100, 1]], [[5, 3, 4]], [[0]])
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure(layout.groups)
        cold = np.zeros((1, 108), np.uint8)
        codec.encode(0, cold, pairs([0], [2]))
        with pytest.raises(CodecCallError, match=r"src is 3; hot slot indices are 0\.\.2"):
            codec.encode(0, cold, pairs([0], [3]))


def test_failed_call_writes_nothing(configured):
    # The CPU reference validates every pair before copying: a bad last pair leaves the output intact.
    codec, layout = configured
    lifecycle = layout.lifecycles[0][0]
    cold = np.full((4, layout.page_bytes(0)), 0x77, np.uint8)
    with pytest.raises(CodecCallError):
        codec.encode(lifecycle, cold, pairs([0, 1, 2], [0, 1, layout.num_slots(0)]))
    assert (cold == 0x77).all()
    before = layout.snapshot()
    with pytest.raises(CodecCallError):
        codec.decode(lifecycle, cold, pairs([0, -1], [0, 1]))
    for b, a in zip(before, layout.snapshot()):
        for x, y in zip(b, a):
            np.testing.assert_array_equal(x, y)


def _pool(arr, slot=8, n=4):
    return PoolDesc(arr.ctypes.data, slot, n)


def _bad_layouts(mem):
    ok_pools = [_pool(mem), _pool(mem), _pool(mem)]
    buf = lambda **kw: BufferDesc(**{"layer_id": 0, "role": Role.KEY, "pool_index": 0, "byte_offset": 0, "bytes": 8,
                                     **kw})
    lc = lambda *bufs, lid=0: LifeCycleDesc(lid, bufs)
    one = lambda *bufs: [PoolGroupDesc(ok_pools, [lc(*bufs)])]
    return {
        "zero pools": ([PoolGroupDesc([], [lc()])], r"gpuDescs\[0\] has no pools \(numPools 0"),
        "null base": (
            [PoolGroupDesc(ok_pools, []), PoolGroupDesc([_pool(mem), PoolDesc(0, 8, 4)], [])],
            r"gpuDescs\[1\]\.pools\[1\]\.base is null",
        ),
        "zero slot bytes": ([PoolGroupDesc([_pool(mem, slot=0)], [])], r"gpuDescs\[0\]\.pools\[0\]\.slotBytes is 0"),
        "zero slots": ([PoolGroupDesc([_pool(mem, n=0)], [])], r"gpuDescs\[0\]\.pools\[0\]\.numSlots is 0"),
        "too many slots": ([PoolGroupDesc([_pool(mem, n=2**31 + 1)], [])], r"pools\[0\]\.numSlots is 2147483649"),
        "size overflow": ([PoolGroupDesc([_pool(mem, slot=2**62, n=8)], [])], r"pools\[0\] is too large"),
        "duplicate lifecycle": (
            [PoolGroupDesc(ok_pools, [lc(lid=5)]), PoolGroupDesc(ok_pools, [lc(lid=1), lc(lid=5)])],
            r"gpuDescs\[1\]\.lifeCycles\[1\]\.lifeCycleId 5 appears twice",
        ),
        "negative lifecycle": (
            [PoolGroupDesc(ok_pools, [lc(lid=0), lc(lid=-3)])],
            r"gpuDescs\[0\]\.lifeCycles\[1\]\.lifeCycleId is -3; it must be >= 0",
        ),
        "buffer past slot": (one(buf(byte_offset=4, bytes=8)), r"lifeCycles\[0\]\.buffers\[0\] covers bytes \[4, 12\)"),
        "empty buffer": (one(buf(bytes=0)), r"buffers\[0\] covers bytes \[0, 0\)"),
        "bad pool index": (one(buf(), buf(pool_index=3)), r"buffers\[1\]\.poolIndex is 3; valid pool indices are 0\.\.2"),
        "negative pool index": (one(buf(pool_index=-1)), r"buffers\[0\]\.poolIndex is -1"),
        "bad role": (one(buf(role=7)), r"buffers\[0\]\.role is 7; valid roles are 0 \(K\), 1 \(V\), 2 \(other\), 3"),
        "odd K-and-V heads": (
            one(buf(role=3, bytes=8, dtype=DType.FLOAT16, tokens_per_page=1, num_heads=1, head_dim=4)),
            r"buffers\[0\]\.numHeads is 1; a K-and-V buffer \(role 3\) alternates K and V along its heads",
        ),
        "bad dtype": (one(buf(dtype=42)), r"buffers\[0\]\.dtype is 42"),
        "shape/bytes mismatch": (
            one(buf(dtype=DType.FLOAT16, tokens_per_page=1, num_heads=2, head_dim=3)),
            r"buffers\[0\]\.bytes is 8 but tokensPerPage\*numHeads\*headDim\*sizeof\(dtype\) = 12",
        ),
        "partial shape": (one(buf(tokens_per_page=8)), r"buffers\[0\] sets only some of tokensPerPage/numHeads/headDim"),
        "negative shape": (one(buf(tokens_per_page=-1, num_heads=1, head_dim=1)), r"buffers\[0\] has a negative"),
        "bytes not a multiple": (one(buf(bytes=6, dtype=DType.FLOAT32)), r"buffers\[0\]\.bytes is 6, not a multiple"),
    }


@pytest.mark.parametrize("case", list(_bad_layouts(np.ones(1, np.uint8))))
def test_bad_layouts_are_rejected_naming_the_field(case):
    mem = np.ones(64, np.uint8)
    groups, message = _bad_layouts(mem)[case]
    with kvcodec_sdk.create_codec("concat") as codec:
        with pytest.raises(CodecCallError, match=message) as info:
            codec.configure(groups)
        assert "configure() rejected the layout" in str(info.value)
        # A rejected configuration leaves nothing configured.
        assert codec.cold_page_bytes(0) == 0
        assert codec.page_index_location(5) is PageIndexLocation.BAD


def test_configure_takes_only_pool_group_descs(codec):
    with pytest.raises(TypeError, match=r"groups\[0\] is a dict"):
        codec.configure([{"pools": []}])


@pytest.mark.parametrize(
    "indices, error, message",
    [
        (np.zeros((2, 2), np.int64), TypeError, "dtype int64; it must be int32"),
        (np.zeros((2, 2), np.float32), TypeError, "dtype float32"),
        (np.zeros((2, 2), np.uint32), TypeError, "dtype uint32"),
        (np.zeros((3,), np.int32), ValueError, r"shape \(3,\)"),
        (np.zeros((2, 3), np.int32), ValueError, r"shape \(2, 3\)"),
        (np.zeros((2, 2, 2), np.int32), ValueError, r"shape \(2, 2, 2\)"),
        (np.zeros((2, 4), np.int32)[:, ::2], ValueError, "contiguous"),
        (np.zeros((2, 2), np.int32, order="F"), ValueError, "contiguous"),
    ],
    ids=["int64", "float32", "uint32", "odd flat", "3 columns", "3d", "strided", "fortran"],
)
def test_bad_page_index_arrays(configured, indices, error, message):
    codec, layout = configured
    cold = np.zeros((4, layout.page_bytes(0)), np.uint8)
    before = cold.copy()
    for op in (codec.encode, codec.decode):
        with pytest.raises(error, match=message):
            op(layout.lifecycles[0][0], cold, indices)
    np.testing.assert_array_equal(cold, before)


def test_bad_num_pages_and_addresses(configured):
    codec, layout = configured
    lifecycle = layout.lifecycles[0][0]
    cold = np.zeros((4, layout.page_bytes(0)), np.uint8)
    idx = pairs([0, 1], [0, 1])
    with pytest.raises(ValueError, match="num_pages is 3; page_indices holds 2 pairs"):
        codec.encode(lifecycle, cold, idx, num_pages=3)
    with pytest.raises(ValueError, match="num_pages is -1"):
        codec.encode(lifecycle, cold, idx, num_pages=-1)
    with pytest.raises(ValueError, match="raw address; pass num_pages"):
        codec.encode(lifecycle, cold, idx.ctypes.data)
    with pytest.raises(ValueError, match="dst_base is -8"):
        codec.encode(lifecycle, -8, idx)
    with pytest.raises(ValueError, match="src_base is -8"):
        codec.decode(lifecycle, -8, idx)
    with pytest.raises(TypeError, match="dst_base must be an address or an array, not a bool"):
        codec.encode(lifecycle, True, idx)
    with pytest.raises(TypeError, match="dst_base is a str"):
        codec.encode(lifecycle, "cold", idx)
    with pytest.raises(TypeError, match="stream is a object"):
        codec.encode(lifecycle, cold, idx, stream=object())
    assert not cold.any()


def test_converted_page_indices_stay_alive_during_the_native_call(configured):
    codec, layout = configured
    lifecycle = layout.lifecycles[0][0]
    made = []

    class Indices:  # array-like without a dtype attribute, converted by np.asarray
        def __array__(self, dtype=None, copy=None):
            arr = pairs([1, 0], [0, 1])
            made.append(weakref.ref(arr))
            return arr

    alive_during_call = []

    class Spy:
        def __init__(self, native):
            self._native = native

        def encode(self, *args):
            alive_during_call.append(all(r() is not None for r in made))
            return self._native.encode(*args)

        def __getattr__(self, name):
            return getattr(self._native, name)

    codec._native = Spy(codec._native)
    cold = np.zeros((2, layout.page_bytes(0)), np.uint8)
    codec.encode(lifecycle, cold, Indices())
    assert made and alive_during_call == [True]


# -- the native object directly -------------------------------------------------------------------


@pytest.fixture
def native():
    n = _native.NativeCodec(_native.concat_factory(), "{}", _native.DEVICE_CPU)
    yield n
    n.release()


def test_native_configure_raw_null_descriptors(native):
    assert native.configure_raw(0, 3) is False
    assert "gpuDescs is null but numGpuDescs is 3" in native.last_error()
    # Even a rejected configuration is final: configure is called exactly once.
    assert native.configure_raw(0, 0) is False
    assert "exactly once" in native.last_error()
    assert native.query_cold_page_bytes(0) == 0


def test_native_configure_raw_negative_count():
    n = _native.NativeCodec(_native.concat_factory(), "{}", _native.DEVICE_CPU)
    assert n.configure_raw(0, -1) is False
    assert "numGpuDescs is -1" in n.last_error()
    n.release()


def test_native_configure_raw_empty_is_valid_once():
    n = _native.NativeCodec(_native.concat_factory(), "{}", _native.DEVICE_CPU)
    assert n.configure_raw(0, 0) is True  # an empty configuration is valid
    assert n.configure_raw(0, 0) is False
    assert "exactly once" in n.last_error()
    n.release()


# ctypes mirrors of the POD descriptors in codec.h, for configure_raw.
class _PoolDesc(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("slotBytes", ctypes.c_uint64), ("numSlots", ctypes.c_uint64)]


class _LifeCycleDesc(ctypes.Structure):
    _fields_ = [("lifeCycleId", ctypes.c_int32), ("numBuffers", ctypes.c_uint32), ("buffers", ctypes.c_void_p)]


class _PoolGroupDesc(ctypes.Structure):
    _fields_ = [
        ("poolGroupIndex", ctypes.c_int32),
        ("numPools", ctypes.c_uint32),
        ("pools", ctypes.POINTER(_PoolDesc)),
        ("numLifeCycles", ctypes.c_uint32),
        ("lifeCycles", ctypes.POINTER(_LifeCycleDesc)),
    ]


def _raw_group(index, pools, lcs, num_lcs=None):
    pool_arr = (_PoolDesc * len(pools))(*pools)
    lc_arr = (_LifeCycleDesc * len(lcs))(*lcs) if lcs else None
    desc = _PoolGroupDesc(index, len(pools), pool_arr, len(lcs) if num_lcs is None else num_lcs,
                          lc_arr if lc_arr is not None else ctypes.POINTER(_LifeCycleDesc)())
    return desc, (pool_arr, lc_arr)


def test_native_configure_raw_with_ctypes_descriptors(native, rng):
    hot = random_bytes(rng, 2 * 10).reshape(2, 10)
    descs, keep = [], []
    for gi in range(2):
        d, k = _raw_group(gi, [_PoolDesc(hot[gi].ctypes.data, 3, 2), _PoolDesc(hot[gi].ctypes.data + 6, 2, 2)],
                          [_LifeCycleDesc(gi + 7, 0, None)])
        descs.append(d)
        keep.append(k)
    arr = (_PoolGroupDesc * 2)(*descs)
    assert native.configure_raw(ctypes.addressof(arr), 2) is True, native.last_error()
    assert native.query_cold_page_bytes(8) == 5
    cold = np.zeros(5, np.uint8)
    idx = pairs([0], [1])
    assert native.encode(8, cold.ctypes.data, idx.ctypes.data, 1, 0) is True
    np.testing.assert_array_equal(cold, np.concatenate([hot[1, 3:6], hot[1, 8:10]]))


@pytest.mark.parametrize(
    "case, message",
    [
        ("wrong index", r"gpuDescs\[0\]\.poolGroupIndex is 1; descriptors must be ordered"),
        ("null lifecycles", r"gpuDescs\[0\]\.lifeCycles is null but numLifeCycles is 2"),
        ("null buffers", r"gpuDescs\[0\]\.lifeCycles\[0\]\.buffers is null but numBuffers is 4"),
        ("null pools", r"gpuDescs\[0\] has no pools \(numPools 1, pools null\)"),
    ],
)
def test_native_configure_raw_rejects_inconsistent_pointers(native, case, message):
    mem = np.ones(64, np.uint8)
    pool = _PoolDesc(mem.ctypes.data, 8, 4)
    if case == "wrong index":
        d, keep = _raw_group(1, [pool], [])
    elif case == "null lifecycles":
        d, keep = _raw_group(0, [pool], [], num_lcs=2)
    elif case == "null buffers":
        d, keep = _raw_group(0, [pool], [_LifeCycleDesc(0, 4, None)])
    else:
        d, keep = _raw_group(0, [pool], [])
        d.pools = ctypes.POINTER(_PoolDesc)()
    arr = (_PoolGroupDesc * 1)(d)
    assert native.configure_raw(ctypes.addressof(arr), 1) is False
    assert __import__("re").search(message, native.last_error()), native.last_error()


def test_native_properties_and_release(rng):
    n = _native.NativeCodec(_native.concat_factory(), '{"path": "sm", "sm_path_below_bytes": 0}', -1)
    assert (n.name, n.format_version, n.device, n.released) == ("concat", 1, -1, False)
    n.release()
    n.release()  # idempotent
    assert n.released is True
    for call in (lambda: n.query_cold_page_bytes(0), lambda: n.configure([]), lambda: n.last_error(),
                 lambda: n.encode(0, 0, 0, 0, 0)):
        with pytest.raises(RuntimeError, match="released"):
            call()


@pytest.mark.parametrize(
    "params_json, message",
    [
        ("[]", "malformed codec parameters: parameters must be a JSON object"),
        ('{"path": "auto"} trailing', "unexpected text after the object"),
        ('{"path": {"nested": 1}}', "value of 'path' must be a string, number, boolean or null"),
        ('{"bogus": 1}', "unknown concat parameter 'bogus'; valid parameters are 'path', 'sm_path_below_bytes', 'copy_api'"),
        ('{"path": "fast"}', "concat parameter 'path' is fast; valid values are 'auto', 'copy_engine', 'sm'"),
        ('{"path": 3}', "concat parameter 'path' is 3"),
        ('{"copy_api": "x"}', "concat parameter 'copy_api' is x; valid values are 'auto', 'batch', 'per_copy'"),
        ('{"sm_path_below_bytes": -1}', "'sm_path_below_bytes' is -1; it must be an integer >= 0"),
        ('{"sm_path_below_bytes": 1.5}', "'sm_path_below_bytes' is 1.5"),
        ('{"sm_path_below_bytes": "x"}', "'sm_path_below_bytes' is x"),
    ],
)
def test_native_factory_validates_params(params_json, message):
    with pytest.raises(ValueError, match="cannot create codec 'concat' on cpu: ") as info:
        _native.NativeCodec(_native.concat_factory(), params_json, -1)
    assert message in str(info.value)


def test_native_factory_rejects_negative_devices_other_than_cpu():
    with pytest.raises(ValueError, match="device is -2; use -1 for the CPU reference"):
        _native.NativeCodec(_native.concat_factory(), "{}", -2)


# -- ownership ------------------------------------------------------------------------------------


def _every_method(codec, layout):
    cold = np.zeros((1, 1), np.uint8)
    return {
        "configure": lambda: codec.configure(layout.groups),
        "cold_page_bytes": lambda: codec.cold_page_bytes(0),
        "batching_layer_group_id": lambda: codec.batching_layer_group_id(0),
        "page_index_location": lambda: codec.page_index_location(0),
        "encode": lambda: codec.encode(0, cold, pairs([0], [0])),
        "decode": lambda: codec.decode(0, cold, pairs([0], [0])),
        "last_error": lambda: codec.last_error(),
        "_consume": lambda: codec._consume(),
    }


def test_close_consumes_the_codec(layout):
    codec = kvcodec_sdk.create_codec("concat")
    assert not codec.consumed and "live" in repr(codec)
    codec.close()
    codec.close()  # idempotent
    assert codec.consumed
    assert "consumed (closed)" in repr(codec)
    for name, call in _every_method(codec, layout).items():
        with pytest.raises(CodecConsumedError, match=r"was closed; it cannot be used again.*create_codec\('concat'"):
            call()


def test_context_manager_closes(layout):
    with kvcodec_sdk.create_codec("concat") as codec:
        codec.configure(layout.groups)
    assert codec.consumed
    with pytest.raises(CodecConsumedError):
        codec.cold_page_bytes(layout.lifecycles[0][0])


def test_consume_hands_over_the_live_native_codec(layout):
    codec = kvcodec_sdk.create_codec("concat")
    codec.configure(layout.groups)
    native = codec._consume()
    try:
        assert codec.consumed
        assert "consumed (consumed by a KVCacheManager)" in repr(codec)
        for name, call in _every_method(codec, layout).items():
            with pytest.raises(CodecConsumedError, match="consumed by a KVCacheManager"):
                call()
        codec.close()  # closing a consumed wrapper does not destroy what it handed over
        assert not native.released
        lifecycle = layout.lifecycles[0][0]
        assert native.query_cold_page_bytes(lifecycle) == layout.page_bytes(0)
    finally:
        native.release()


# -- the default codec ----------------------------------------------------------------------------


def test_default_codec_round_trips(layout, rng):
    with kvcodec_sdk.create_default_kv_cache_cold_page_codec() as codec:
        assert codec.spec.name == "concat" and codec.device == "cpu"
        assert codec.params == kvcodec_sdk.get_codec_spec("concat").defaults()
        codec.configure(layout.groups)
        for g, ids in enumerate(layout.lifecycles):
            n = layout.num_slots(g)
            cold = np.zeros((n, layout.page_bytes(g)), np.uint8)
            src = rng.permutation(n)
            codec.encode(ids[-1], cold, pairs(np.arange(n), src))
            for d, s in enumerate(src):
                np.testing.assert_array_equal(cold[d], layout.hot_page(g, s))
            originals = [p.copy() for p in layout.pools[g]]
            for p in layout.pools[g]:
                p[:n] = 0
            codec.decode(ids[0], cold, pairs(src, np.arange(n)))
            for p, o in zip(layout.pools[g], originals):
                np.testing.assert_array_equal(p, o)


@pytest.mark.parametrize("device, message", [("cuda", "not available"), ("tpu", "device is 'tpu'")])
def test_default_codec_device_errors(device, message):
    if device == "cuda" and _native.driver_info()["device_count"] > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match=message):
        kvcodec_sdk.create_default_kv_cache_cold_page_codec(device)


def test_sized_cold_buffer_is_checked_against_the_indices():
    pool = np.arange(4 * 16, dtype=np.uint8)
    codec = kvcodec_sdk.create_codec("concat")
    codec.configure([PoolGroupDesc([PoolDesc(pool.ctypes.data, 16, 4)], [LifeCycleDesc(0)])])
    cold = np.zeros(2 * 16, np.uint8)  # room for cold slots 0 and 1 only
    with pytest.raises(ValueError, match="reach cold slot 2, but dst_base holds 32 bytes = 2 cold pages"):
        codec.encode(0, cold, np.array([[2, 0]], np.int32))
    with pytest.raises(ValueError, match="reach cold slot 5, but src_base holds 32 bytes"):
        codec.decode(0, cold, np.array([[0, 5]], np.int32))
    assert not cold.any(), "a refused call must not write"
    codec.encode(0, cold, np.array([[1, 3]], np.int32))
    assert np.array_equal(cold[16:], pool[48:])


def test_non_integer_index_lists_are_refused():
    pool = np.arange(4 * 16, dtype=np.uint8)
    codec = kvcodec_sdk.create_codec("concat")
    codec.configure([PoolGroupDesc([PoolDesc(pool.ctypes.data, 16, 4)], [LifeCycleDesc(0)])])
    cold = np.zeros(64, np.uint8)
    with pytest.raises(TypeError, match="float64 values; slot indices must be integers"):
        codec.encode(0, cold, [[0.7, 1.9]])
    with pytest.raises(ValueError, match="outside the int32 range"):
        codec.encode(0, cold, [[0, 2**40]])
    codec.encode(0, cold, [[0, 1]])  # a plain list of ints is fine
    assert np.array_equal(cold[:16], pool[16:32])
