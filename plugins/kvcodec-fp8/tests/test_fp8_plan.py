"""The blob plan's alignment invariants, checked on the CPU for every address the CUDA kernel
derives from it.

The kernel trusts the plan: ``vector`` buffers are moved with 16-byte hot loads/stores and
16-byte code stores, ``hot_aligned`` buffers with one 2- or 4-byte access per element, scales
with 4-byte accesses when the cold base is 16-byte aligned. A plan flag that promises more than
the addresses of some hot slot give faults on the device ("misaligned address"), so these
tests recompute every access of every slot from the plan's fields and the layout alone, on the
conformance suite's named layouts and on random generated ones, with the harness's pool bases
(allocator-aligned plus guard bytes) and with bases shifted off alignment.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvcodec_sdk import DType, PoolDesc, PoolGroupDesc
from kvcodec_sdk.testing.harness import GUARD_BYTES
from kvcodec_sdk.testing.layouts import generate_layout, named_layout

from kvcodec_fp8.plan import blob_plan

REGION_ALIGN = 16  # kRegionAlign (fp8_format.h)
ELEM_BYTES = {int(DType.FLOAT16): 2, int(DType.BFLOAT16): 2, int(DType.FLOAT32): 4}

PARAMS = [
    {},
    {"granularity": "token_head"},
    {"granularity": "page"},
    {"kernel": "b2", "small_blocks": "deep"},
    {"kernel": "b4", "small_blocks": "deep", "finite_check": "block", "granularity": "token_head"},
]
PARAM_IDS = ["default", "token_head", "page", "b2-deep", "b4-deep-token_head"]

# Pool base of the harness: a device/host allocation (at least 256-byte aligned) plus the guard
# bytes in front of the pool. The shifted bases model pools carved out of a larger allocation.
BASE_SHIFTS = [0, 1, 2, 4, 8]


def layouts():
    out = [("mixed", named_layout("mixed")), ("tiny-odd", named_layout("tiny-odd"))]
    out += [(f"seed{s}", generate_layout(np.random.default_rng(s), num_groups=4)) for s in range(6)]
    return out


def pool_groups(layout, shift):
    """PoolGroupDescs for a layout with every pool at its own 1 MiB-aligned address + guard + shift."""
    groups, k = [], 0
    for group in layout.groups:
        pools = []
        for pool in group.pools:
            k += 1
            pools.append(PoolDesc((k << 20) + GUARD_BYTES + shift, pool.slot_bytes, pool.num_slots))
        groups.append(PoolGroupDesc(pools, list(group.lifecycles)))
    return groups


def access_offsets(b, n):
    """Element offsets (inside the buffer) of every n-element access of every block, in the
    kernel's order (elemOffset in fp8_kernel.cu): access k of block j covers elements
    [k*n, k*n + n) of the block, row by row."""
    k = np.arange(b["block_elems"] // n, dtype=np.int64)
    e = k * n
    row = e // b["row_elems"]
    within = e - row * b["row_elems"]
    block = np.arange(b["num_blocks"], dtype=np.int64)[:, None]
    return row * b["row_stride"] + block * b["block_stride"] + within, within


def hot_slot_starts(b, num_slots):
    # The plan does not depend on the slot count, so every flag must hold for a second slot too.
    slots = np.arange(max(num_slots, 2), dtype=np.int64)
    return b["pool_base"] + b["hot_offset"] + slots * b["slot_bytes"]


def check_plan(groups, params):
    plans = blob_plan(groups, params)
    assert set(plans) == {lc.lifecycle_id for g in groups for lc in g.lifecycles}
    for lc_id, plan in plans.items():
        where = f"lifecycle {lc_id}"
        cold = plan["cold_page_bytes"]
        # Blob i starts at base + i * cold_page_bytes: a 16-byte aligned base keeps every blob
        # and every region aligned only if the page size and region offsets are multiples of 16.
        assert cold % REGION_ALIGN == 0, f"{where}: cold page bytes {cold} is not a multiple of 16"
        end = 0
        for i, b in enumerate(plan["buffers"]):
            w = f"{where}, buffer {i}"
            assert b["data_offset"] == end, f"{w}: region starts at {b['data_offset']}, previous ends at {end}"
            for key in ("data_offset", "scale_offset", "region_end"):
                assert b[key] % REGION_ALIGN == 0, f"{w}: {key} {b[key]} is not 16-byte aligned"
            assert b["data_offset"] <= b["data_end"] <= b["scale_offset"] <= b["scale_end"] <= b["region_end"], w
            end = b["region_end"]
            if not b["quantized"]:
                assert b["data_end"] - b["data_offset"] == b["bytes"], w
                continue
            e = ELEM_BYTES[b["dtype"]]
            assert b["elems"] * e == b["bytes"], w
            assert b["scale_end"] - b["scale_offset"] == 4 * b["num_blocks"], w
            assert b["scale_offset"] % 4 == 0, f"{w}: scales at {b['scale_offset']} are not 4-byte aligned"
            starts = hot_slot_starts(b, plan["num_slots"])
            # hot_aligned must be exact: set only when every element of every slot is aligned to
            # its size (else the kernel's element loads fault), and set whenever it is (else the
            # element path needlessly moves bytes).
            every_slot_aligned = bool(np.all(starts % e == 0))
            assert bool(b["hot_aligned"]) == every_slot_aligned, (
                f"{w}: hot_aligned is {b['hot_aligned']} but the {e}-byte elements of the slots starting at "
                f"{(starts % 64).tolist()[:4]} (mod 64) are {'all' if every_slot_aligned else 'not all'} aligned "
                f"(base {b['pool_base']:#x}, hot offset {b['hot_offset']}, slot bytes {b['slot_bytes']})")
            n = 16 if b["vector"] else 1
            offsets, within = access_offsets(b, n)
            # The accesses of all blocks cover each element of the buffer exactly once.
            covered = np.sort(offsets.reshape(-1))
            assert covered.size * n == b["elems"], f"{w}: the accesses cover {covered.size * n} of {b['elems']} elements"
            if n == 1:
                assert np.array_equal(covered, np.arange(b["elems"])), f"{w}: element accesses do not cover the buffer"
            if not b["vector"]:
                continue
            # A 16-element access stays inside one row and is 16-byte aligned in the hot slot
            # (16 * e bytes as uint4 loads/stores) and in the blob (one uint4 of 16 codes).
            assert np.all(within + 16 <= b["row_elems"]), f"{w}: a 16-element access crosses a row"
            assert np.array_equal(np.unique(covered), covered), f"{w}: two vector accesses overlap"
            hot = starts[:, None] + (offsets.reshape(-1) * e)[None, :]
            bad = np.argwhere(hot % 16 != 0)
            assert bad.size == 0, (f"{w}: vector hot access at slot {bad[0][0]}, element offset "
                                   f"{offsets.reshape(-1)[bad[0][1]]} is {int(hot[tuple(bad[0])] % 16)} bytes off "
                                   "16-byte alignment")
            codes = b["data_offset"] + offsets.reshape(-1)
            assert np.all(codes % 16 == 0), f"{w}: a 16-code store is not 16-byte aligned in the blob"
            # Work units cover every block (rounds of 32 / group_lanes blocks per unit).
            per_unit = 32 // b["group_lanes"] * b["rounds"]
            assert b["units"] * per_unit >= b["num_blocks"], w
    return plans


@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
@pytest.mark.parametrize("shift", BASE_SHIFTS)
@pytest.mark.parametrize("name,layout", layouts(), ids=[n for n, _ in layouts()])
def test_every_kernel_access_of_the_plan_is_aligned(name, layout, shift, params):
    check_plan(pool_groups(layout, shift), params)


def test_mixed_packed_fp16_slots_of_odd_size_take_the_byte_element_path():
    # The conformance layout "mixed" packs fp16 K and V into 1025-byte slots: every other slot
    # starts at an odd address, so the element path must not use 2-byte accesses there.
    layout = named_layout("mixed")
    plans = blob_plan(pool_groups(layout, 0))
    packed = [b for p in plans.values() for b in p["buffers"]
              if b["quantized"] and b["slot_bytes"] % 2 == 1 and b["dtype"] == int(DType.FLOAT16)]
    assert packed, "the mixed layout no longer has a quantized fp16 buffer in odd-sized slots"
    for b in packed:
        assert (b["vector"], b["hot_aligned"]) == (0, 0), b


def test_aligned_pools_keep_the_vector_path():
    # The fix for odd slots must not cost the common case: K/V pools with 16-byte slots and a
    # head dim that is a multiple of 16 stay on the vector path, word-aligned.
    layout = named_layout("mixed")
    plans = blob_plan(pool_groups(layout, 0))
    aligned = [b for p in plans.values() for b in p["buffers"] if b["quantized"] and b["slot_bytes"] % 16 == 0]
    assert aligned
    for b in aligned:
        assert (b["vector"], b["hot_aligned"]) == (1, 1), b
    shifted = blob_plan(pool_groups(layout, 2))
    for p in shifted.values():
        for b in p["buffers"]:
            if b["quantized"] and b["slot_bytes"] % 16 == 0:
                assert (b["vector"], b["hot_aligned"]) == (0, 1), b


def test_plan_of_a_rejected_layout_raises_with_the_reason():
    layout = named_layout("mixed")
    groups = pool_groups(layout, 0)
    bad = PoolGroupDesc([PoolDesc(0, p.slot_bytes, p.num_slots) for p in groups[0].pools], groups[0].lifecycles)
    with pytest.raises(ValueError, match="base is null"):
        blob_plan([bad] + groups[1:])


@pytest.mark.parametrize("granularity", ["page_head", "token_head", "page"])
def test_plan_matches_the_cpu_codecs_cold_page_sizes(granularity):
    # The plan binding is the codec's own plan: its page sizes are what configure() answers.
    import kvcodec_sdk as kv

    layout = named_layout("mixed")
    pools = [[np.zeros(p.slot_bytes * p.num_slots + 2 * GUARD_BYTES, np.uint8) for p in g.pools] for g in layout.groups]
    groups = [PoolGroupDesc([PoolDesc(a.ctypes.data + GUARD_BYTES, p.slot_bytes, p.num_slots)
                             for a, p in zip(arrays, g.pools)], list(g.lifecycles))
              for arrays, g in zip(pools, layout.groups)]
    params = {"granularity": granularity}
    codec = kv.create_codec("fp8", params, device="cpu")
    codec.configure(groups)
    plans = check_plan(groups, params)
    for lc_id, plan in plans.items():
        assert codec.cold_page_bytes(lc_id) == plan["cold_page_bytes"], lc_id
    assert len({p["cold_page_bytes"] for p in plans.values()}) > 1, "expected lifecycles of different cold sizes"


def test_the_check_catches_a_flag_that_promises_too_much(monkeypatch):
    # The checker itself must fail on the plan the kernel used to get (element accesses assumed
    # aligned in every slot): replay it by forcing hot_aligned to 1.
    import kvcodec_fp8.plan as plan_module

    real = plan_module._ext.plan_layout

    def forced(groups, params_json):
        out = real(groups, params_json)
        for p in out.values():
            for b in p["buffers"]:
                if b["quantized"]:
                    b["hot_aligned"] = 1
        return out

    monkeypatch.setattr(plan_module._ext, "plan_layout", forced)
    with pytest.raises(AssertionError, match="hot_aligned is 1 but the 2-byte elements"):
        check_plan(pool_groups(named_layout("mixed"), 0), {})


def test_layout_coverage_includes_every_path():
    # The layouts above exercise vector, aligned-element and byte-element buffers and lossless
    # ones, so a plan regression on any path shows up.
    seen = set()
    for (name, layout), shift in itertools.product(layouts(), BASE_SHIFTS):
        for p in blob_plan(pool_groups(layout, shift)).values():
            for b in p["buffers"]:
                seen.add("lossless" if not b["quantized"] else
                         "vector" if b["vector"] else "element" if b["hot_aligned"] else "bytes")
    assert seen == {"lossless", "vector", "element", "bytes"}
