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
from kvcodec_fp8.plan import blob_plan

from kvcodec_sdk import DType, PoolDesc, PoolGroupDesc
from kvcodec_sdk.testing.harness import GUARD_BYTES
from kvcodec_sdk.testing.layouts import generate_layout, named_layout

REGION_ALIGN = 16  # kRegionAlign (format.h)
ELEM_BYTES = {int(DType.FLOAT16): 2, int(DType.BFLOAT16): 2, int(DType.FLOAT32): 4}

PARAMS = [
    {},
    {"granularity": "token_head"},
    {"granularity": "page"},
    {"kernel": "b2", "small_blocks": "deep"},
    {"kernel": "b4", "small_blocks": "deep", "finite_check": "block", "granularity": "token_head"},
    {"kernel": "tile"},
    {"kernel": "tile", "small_blocks": "deep", "granularity": "token_head"},
    {"kernel": "tile", "granularity": "page"},
]
PARAM_IDS = ["default", "token_head", "page", "b2-deep", "b4-deep-token_head", "tile", "tile-deep-token_head",
             "tile-page"]

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
    kernel's order (elemOffset in kernel_common.cuh): access k of block j covers elements
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
            # Warp units cover every block (rounds of 32 / group_lanes blocks per unit).
            per_unit = 32 // b["group_lanes"] * b["rounds"]
            assert b["warp_units"] * per_unit >= b["num_blocks"], w
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

    real = plan_module._testing.plan_layout

    def forced(groups, params_json, tile_budget):
        out = real(groups, params_json, tile_budget)
        for p in out.values():
            for b in p["buffers"]:
                if b["quantized"]:
                    b["hot_aligned"] = 1
        return out

    monkeypatch.setattr(plan_module._testing, "plan_layout", forced)
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



# ---------------------------------------------------------------------------------------------
# The tile variant's plan (kernel="tile"): which buffers are tiled, how their blocks are split
# into tiles, the work units and the shared memory of the launches, recomputed from the rules
# (docs/fp8.md, Performance) and checked against the kernel's address arithmetic.
# ---------------------------------------------------------------------------------------------

from kvcodec_fp8.plan import DEFAULT_TILE_BUDGET, MAX_TILE_BUDGET, TILE_META_BYTES, WARPS_PER_CTA, tile_budget  # noqa: E402

KIB = 1024
TILE_PARAMS = [{"kernel": "tile", "granularity": g, **extra}
               for g in ("page_head", "token_head", "page")
               for extra in ({}, {"small_blocks": "deep", "finite_check": "block"})]
TILE_IDS = [f"{p['granularity']}{'-deep' if 'small_blocks' in p else ''}" for p in TILE_PARAMS]
BUDGETS = [DEFAULT_TILE_BUDGET, 49 * KIB, 4 * KIB, 0]


def model_budget(per_sm, optin, reserved):
    half = max(per_sm // 2 - reserved, 0)
    return min(half, MAX_TILE_BUDGET, optin) // KIB * KIB


@pytest.mark.parametrize("limits", [(228 * KIB, 227 * KIB, KIB), (164 * KIB, 163 * KIB, KIB), (100 * KIB, 99 * KIB, KIB),
                                    (64 * KIB, 48 * KIB, 0), (1000, 1000, 0), (0, 0, 0), (228 * KIB, 40 * KIB, KIB)],
                         ids=["sm90", "sm80", "sm86", "small", "tiny", "none", "low-optin"])
def test_tile_budget_lets_two_thread_blocks_share_an_sm(limits):
    per_sm, optin, reserved = limits
    budget = tile_budget(*limits)
    assert budget == model_budget(*limits)
    assert budget % KIB == 0 and budget <= optin and budget <= MAX_TILE_BUDGET
    assert 2 * (budget + reserved) <= per_sm


def test_default_tile_budget_is_the_h200s():
    # The CPU-side plan defaults to the device the benchmark runs on (sm_90: 228 KiB per SM).
    assert DEFAULT_TILE_BUDGET == tile_budget(228 * KIB, 227 * KIB, KIB) == 96 * KIB


def model_tile_blocks(b, budget):
    if not b["quantized"] or not b["vector"]:
        return 0
    fit = budget // (b["block_elems"] * ELEM_BYTES[b["dtype"]] + TILE_META_BYTES)
    if fit == 0:
        return 0
    tiles = -(-b["num_blocks"] // fit)
    return -(-b["num_blocks"] // tiles)


def tile_elements(b, first, nb):
    """Element offsets (inside the buffer) of a tile as the tile kernel walks it: rows of
    nb * row_elems contiguous elements, and the block of each element."""
    rows = b["block_elems"] // b["row_elems"]
    seg = nb * b["row_elems"]
    r = np.arange(rows, dtype=np.int64)[:, None]
    col = np.arange(seg, dtype=np.int64)[None, :]
    return r * b["row_stride"] + first * b["block_stride"] + col, np.broadcast_to(first + col // b["row_elems"], (rows, seg))


def check_tile_plan(groups, params, budget):
    plans = blob_plan(groups, params, tile_budget=budget)
    # The same layout without tiles: the b4 split the non-tiled buffers keep, and the blob.
    base = blob_plan(groups, {**params, "kernel": "b4"}, tile_budget=budget)
    tiled = 0
    for lc_id, plan in plans.items():
        where = f"lifecycle {lc_id}, budget {budget}"
        assert plan["cold_page_bytes"] == base[lc_id]["cold_page_bytes"], where
        unit, enc_smem, dec_smem = 0, 0, 0
        for i, (b, ref) in enumerate(zip(plan["buffers"], base[lc_id]["buffers"])):
            w = f"{where}, buffer {i}"
            for key in ("data_offset", "data_end", "scale_offset", "scale_end", "region_end", "vector",
                        "hot_aligned", "num_blocks", "group_lanes"):
                assert b[key] == ref[key], f"{w}: {key} is {b[key]} with tiles, {ref[key]} without"
            assert b["warp_units"] == ref["units"], w
            want = model_tile_blocks(b, budget)
            assert b["tile_blocks"] == want, f"{w}: tile_blocks is {b['tile_blocks']}, the rule gives {want}"
            assert b["first_unit"] == unit, w
            if b["tile_blocks"]:
                tiled += 1
                nt, tb = b["units"], b["tile_blocks"]
                block_bytes = b["block_elems"] * ELEM_BYTES[b["dtype"]]
                assert tb * (block_bytes + TILE_META_BYTES) <= budget, w
                # As few tiles as the budget allows, none empty.
                assert nt == -(-b["num_blocks"] // (budget // (block_bytes + TILE_META_BYTES))), w
                assert (nt - 1) * tb < b["num_blocks"] <= nt * tb, w
                enc_smem = max(enc_smem, tb * (block_bytes + TILE_META_BYTES))
                dec_smem = max(dec_smem, 4 * tb)
                check_tile_accesses(b, plan["num_slots"], w)
            else:
                assert b["units"] == -(-b["warp_units"] // WARPS_PER_CTA), w
            unit += b["units"]
        assert plan["units_per_page"] == unit, where
        assert (plan["tile_encode_smem"], plan["tile_decode_smem"]) == (enc_smem, dec_smem), where
        assert enc_smem <= budget, where
    return plans, tiled


def check_tile_accesses(b, num_slots, w):
    """Every tile of the buffer: its elements partition the buffer, each element's block is the
    block whose scale it takes in the CPU reference, and every 16-byte hot copy and 16-code store
    is aligned in every slot and in the blob."""
    e = ELEM_BYTES[b["dtype"]]
    seen = np.zeros(b["elems"], np.int64)
    owner = np.full(b["elems"], -1, np.int64)
    ref_offsets, _ = access_offsets(b, 1)  # [block][element]: the reference's blocks
    for j in range(b["num_blocks"]):
        owner[ref_offsets[j]] = j
    starts = hot_slot_starts(b, num_slots)
    for t in range(b["units"]):
        first = t * b["tile_blocks"]
        nb = min(b["tile_blocks"], b["num_blocks"] - first)
        offs, blocks = tile_elements(b, first, nb)
        np.add.at(seen, offs.reshape(-1), 1)
        assert np.array_equal(owner[offs.reshape(-1)], blocks.reshape(-1)), f"{w}: tile {t} maps an element to a wrong block"
        row_starts = offs[:, 0]
        # Rows move as 16-byte pieces: a row's hot bytes and codes start aligned and are whole pieces.
        assert (offs.shape[1] * e) % 16 == 0 and offs.shape[1] % 16 == 0, w
        assert np.all((starts[:, None] + row_starts[None, :] * e) % 16 == 0), f"{w}: tile {t}: a hot row is not 16-byte aligned"
        assert np.all((b["data_offset"] + row_starts) % 16 == 0), f"{w}: tile {t}: a code row is not 16-byte aligned"
        assert (b["scale_offset"] + 4 * first) % 4 == 0, w
    assert np.all(seen == 1), f"{w}: the tiles cover elements {np.flatnonzero(seen != 1)[:4].tolist()} not exactly once"


@pytest.mark.parametrize("budget", BUDGETS, ids=[f"{b // KIB}k" for b in BUDGETS])
@pytest.mark.parametrize("params", TILE_PARAMS, ids=TILE_IDS)
@pytest.mark.parametrize("shift", [0, 2])
@pytest.mark.parametrize("name,layout", layouts(), ids=[n for n, _ in layouts()])
def test_tile_plan_follows_the_rules_and_keeps_the_blob(name, layout, shift, params, budget):
    check_tile_plan(pool_groups(layout, shift), params, budget)


def test_tile_layout_coverage_includes_tiled_and_warp_unit_buffers():
    # The layouts above give the tile rules both outcomes for quantized buffers.
    kinds = set()
    for (name, layout), params in itertools.product(layouts(), TILE_PARAMS):
        for p in blob_plan(pool_groups(layout, 0), params).values():
            for b in p["buffers"]:
                if b["quantized"]:
                    kinds.add("tiled" if b["tile_blocks"] else "warp units")
    assert kinds == {"tiled", "warp units"}


def kv_groups(tokens, heads=8, dim=128, dtype=DType.BFLOAT16, slots=4, base=1 << 20, slot_pad=0):
    """The benchmark's layout: one pool, K and V of one layer per slot."""
    from kvcodec_sdk import BufferDesc, LifeCycleDesc, Role

    nbytes = tokens * heads * dim * ELEM_BYTES[int(dtype)]
    bufs = (BufferDesc(0, Role.KEY, 0, 0, nbytes, dtype, tokens, heads, dim),
            BufferDesc(0, Role.VALUE, 0, nbytes, nbytes, dtype, tokens, heads, dim))
    return [PoolGroupDesc([PoolDesc(base, 2 * nbytes + slot_pad, slots)], [LifeCycleDesc(0, bufs)])]


@pytest.mark.parametrize("tokens", [16, 64])
@pytest.mark.parametrize("granularity", ["page_head", "token_head", "page"])
def test_benchmark_layouts_take_the_tile_path_as_documented(tokens, granularity):
    # bf16, 8 heads x 128 dims: a buffer is 32 KiB (16 tokens) or 128 KiB (64 tokens) per page.
    plans, _ = check_tile_plan(kv_groups(tokens), {"kernel": "tile", "granularity": granularity}, DEFAULT_TILE_BUDGET)
    for b in plans[0]["buffers"]:
        if tokens == 16:
            # The whole buffer is one tile: page_head writes all heads of a token row together.
            assert (b["units"], b["tile_blocks"]) == (1, b["num_blocks"]), b
        elif granularity == "page":
            assert b["tile_blocks"] == 0, "one 128 KiB scale block does not fit the budget: warp units"
        else:
            assert (b["units"], b["tile_blocks"]) == (2, b["num_blocks"] // 2), b  # two 64 KiB tiles
    assert plans[0]["tile_encode_smem"] <= DEFAULT_TILE_BUDGET


def test_odd_slots_unaligned_bases_and_other_kernels_leave_the_tile_path():
    # A slot size that is not a multiple of 16 or a pool base off 16-byte alignment: no vector
    # path, so no tile; the other kernels never tile.
    for groups in (kv_groups(16, slot_pad=2), kv_groups(16, base=(1 << 20) + 8)):
        plan = blob_plan(groups, {"kernel": "tile"})[0]
        assert all(b["tile_blocks"] == 0 and b["vector"] == 0 for b in plan["buffers"])
        assert plan["tile_encode_smem"] == 0
    for tuning in ({"kernel": "v1", "small_blocks": "wide", "finite_check": "element"}, {"kernel": "b2"},
                   {"kernel": "b4"}, {}):
        kernel = tuning.get("kernel", "auto (its b4 plan)")
        plan = blob_plan(kv_groups(16), tuning)[0]
        assert plan["tile_encode_smem"] == plan["tile_decode_smem"] == 0
        for b in plan["buffers"]:
            assert b["tile_blocks"] == 0 and b["units"] == b["warp_units"], (kernel, b)


def test_tile_kernel_is_a_valid_tuning_with_every_knob():
    import kvcodec_sdk as kv

    for extra in ({}, {"small_blocks": "deep"}, {"finite_check": "block"}):
        codec = kv.create_codec("fp8", {"kernel": "tile", **extra}, device="cpu")
        assert codec.params["kernel"] == "tile"
        codec.close()
