"""The fp8 codec's CUDA implementation: blobs bit-identical to the CPU reference, device page
indices, hot pools in device memory with blobs in pinned host or device memory, the scalar
fallbacks, stream ordering and argument checks.

Every test carries the ``gpu`` marker and skips cleanly without a CUDA device and torch.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fp8_helpers import MIXED, build_layout, pairs

import kvcodec_sdk as kv
from kvcodec_sdk import DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role
from kvcodec_sdk.testing.support import assert_blobs_match, cuda_test_module, encode_on_cuda

torch, pytestmark = cuda_test_module()

ALL_PARAMS = [{"format": f, "granularity": g}
              for f, g in itertools.product(("e4m3", "e5m2"), ("page_head", "token_head", "page"))]
IDS = [f"{p['format']}-{p['granularity']}" for p in ALL_PARAMS]

LARGE = [  # 64-token pages (blocks too large for the register cache), 16-token pages, fp16/fp32
    [(0, Role.KEY, DType.BFLOAT16, (64, 8, 128)), (0, Role.VALUE, DType.BFLOAT16, (64, 8, 128))],
    [(1, Role.KEY, DType.BFLOAT16, (16, 8, 128)), (1, Role.VALUE, DType.FLOAT16, (16, 8, 128)),
     (2, Role.KEY, DType.FLOAT32, (16, 2, 64)), (2, Role.OTHER, DType.UINT8, 4096 + 3)],
]

# vLLM's GPU blocks per KV head (HN2C): one K-and-V buffer (16 tokens, K and V, 128) per head and
# layer, and an fp16 one with 64 tokens.
KEY_VALUE = [
    [(layer, Role.KEY_VALUE, DType.BFLOAT16, (16, 2, 128)) for layer in range(2) for _ in range(8)],
    [(2, Role.KEY_VALUE, DType.FLOAT16, (64, 2, 64)), (2, Role.KEY_VALUE, DType.FLOAT16, (64, 2, 64))],
]


@pytest.fixture
def stream():
    return torch.cuda.Stream()


class Mirror:
    """A host layout (for the CPU reference) and the same bytes in device pools."""

    def __init__(self, host, lifecycles=(0,)):
        self.host = host
        self.dev = [torch.from_numpy(p.copy()).cuda() for p in host.pools]
        self.groups = [PoolGroupDesc([PoolDesc(d.data_ptr(), d.shape[1], d.shape[0]) for d in self.dev],
                                     [LifeCycleDesc(i, tuple(host.buffers)) for i in lifecycles])]


def cpu_blobs(host, params, src, num_cold, dst):
    codec = kv.create_codec("fp8", params, device="cpu")
    codec.configure(host.groups)
    cold = np.zeros((num_cold, codec.cold_page_bytes(0)), np.uint8)
    codec.encode(0, cold, pairs(dst, src))
    codec.close()
    return cold


def gpu_codec(mirror, params):
    codec = kv.create_codec("fp8", params, device="cuda")
    codec.configure(mirror.groups)
    assert codec.page_index_location(0) == kv.PageIndexLocation.DEVICE
    return codec


def dev_pairs(dst, src):
    return torch.from_numpy(pairs(dst, src)).cuda()


@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
@pytest.mark.parametrize("spec", [MIXED, LARGE, KEY_VALUE], ids=["mixed", "large", "key-value"])
@pytest.mark.parametrize("cold_kind", ["pinned", "device"])
def test_gpu_blobs_equal_cpu_blobs_and_decode_identically(params, spec, cold_kind, stream):
    check_against_cpu(params, spec, cold_kind, stream)


# Every kernel variant and tuning knob (docs/fp8.md, Performance) must write the v1 blob bytes;
# "auto" (the default) runs b4 or tile per call, by direction and blob location.
V1 = {"kernel": "v1", "small_blocks": "wide", "finite_check": "element"}
TUNINGS = [V1, {"kernel": "auto"}] + [{"kernel": k, "small_blocks": s, "finite_check": f}
                                for k, s, f in itertools.product(("b2", "b4", "tile"), ("wide", "deep"),
                                                                 ("element", "block"))]
TUNING_IDS = ["-".join(t.values()) for t in TUNINGS]


@pytest.mark.parametrize("tuning", TUNINGS, ids=TUNING_IDS)
@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
@pytest.mark.parametrize("spec", [MIXED, LARGE], ids=["mixed", "large"])
def test_every_kernel_variant_writes_the_cpu_blobs_and_decodes_identically(tuning, params, spec, stream):
    check_against_cpu({**params, **tuning}, spec, "device", stream)


@pytest.mark.parametrize("tuning", TUNINGS[1:], ids=TUNING_IDS[1:])
def test_every_kernel_variant_on_the_scalar_path_and_pinned_blobs(tuning, stream):
    for gran in ("page_head", "token_head", "page"):
        scalar_path({"format": "e4m3", "granularity": gran, **tuning}, stream)
    check_against_cpu({"format": "e5m2", "granularity": "token_head", **tuning}, MIXED, "pinned", stream)


def check_against_cpu(params, spec, cold_kind, stream):
    rng = np.random.default_rng(11)
    slots, pages = 12, 9
    host = build_layout(rng, spec, num_slots=slots, special=True)
    mirror = Mirror(host)
    src = rng.permutation(slots)[:pages]
    dst = rng.permutation(pages + 2)[:pages]
    want = cpu_blobs(host, params, src, pages + 2, dst)
    codec = gpu_codec(mirror, params)
    cold, got = encode_on_cuda(codec, dev_pairs(dst, src), pages + 2, cold_kind, stream)
    assert_blobs_match(got, want, dst, str(params))

    # Decode the same blobs on both sides into other slots: identical hot bytes.
    back = rng.permutation(slots)[:pages]
    cpu = kv.create_codec("fp8", params, device="cpu")
    cpu.configure(host.groups)
    cpu.decode(0, want, pairs(back, dst))
    before = [d.clone() for d in mirror.dev]
    stream.wait_stream(torch.cuda.current_stream())  # the copies above are taken before the decode writes
    codec.decode(0, cold, dev_pairs(back, dst), stream=stream)
    stream.synchronize()
    for p, (d, h) in enumerate(zip(mirror.dev, host.pools)):
        assert np.array_equal(d.cpu().numpy()[back], h[back]), f"{params}: pool {p}: GPU decode differs from CPU decode"
        others = sorted(set(range(slots)) - set(back.tolist()))
        assert torch.equal(d[others], before[p][others]), "decode wrote outside its destination slots"
    codec.close()
    cpu.close()


@pytest.mark.parametrize("params", ALL_PARAMS[:3], ids=IDS[:3])
def test_unaligned_cold_base_and_odd_shapes_use_the_scalar_path(params, stream):
    scalar_path(params, stream)


def scalar_path(params, stream):
    rng = np.random.default_rng(12)
    spec = [[(0, Role.KEY, DType.BFLOAT16, (5, 3, 24)), (0, Role.VALUE, DType.FLOAT16, (3, 2, 7)),
             (0, Role.OTHER, DType.UINT8, 13)]]
    host = build_layout(rng, spec, num_slots=6, special=True)
    mirror = Mirror(host)
    src, dst = [5, 1, 3], [0, 2, 1]
    want = cpu_blobs(host, params, src, 3, dst)
    codec = gpu_codec(mirror, params)
    encode_off_alignment(codec, src, dst, want, 3, "pinned", stream, params)
    codec.close()


def encode_off_alignment(codec, src, dst, want, offset, memory, stream, params):
    """Encodes 3 pages at a cold base `offset` bytes past a 16-byte aligned buffer in pinned or
    device `memory` and checks the blobs against the CPU reference's; returns the buffer (keep it
    while the base is used) and the base."""
    size = codec.cold_page_bytes(0)
    backing = torch.zeros(3 * size + 16, dtype=torch.uint8, device="cuda" if memory == "device" else "cpu")
    backing = backing.pin_memory() if memory == "pinned" else backing
    base = backing.data_ptr() + offset
    codec.encode(0, base, dev_pairs(dst, src), stream=stream)
    stream.synchronize()
    got = backing[offset:offset + 3 * size].cpu().numpy().reshape(3, size)
    assert np.array_equal(got, want), f"{params}: GPU blobs differ from CPU blobs on the element path"
    return backing, base


# The conformance suite's own layouts: harness-allocated pools (allocation + guard bytes), packed
# fp16 K/V in odd-sized slots (elements at odd addresses in every other slot), fp8 and opaque
# buffers, 1-7 byte slots. Odd hot slots are encoded (as the suite does) and even ones decoded.
B4_DEEP_BLOCK = {"kernel": "b4", "small_blocks": "deep", "finite_check": "block"}
TILE = {"kernel": "tile", "small_blocks": "wide", "finite_check": "element"}
TILE_DEEP_BLOCK = {"kernel": "tile", "small_blocks": "deep", "finite_check": "block"}
B2_DEEP_ELEMENT = {"kernel": "b2", "small_blocks": "deep", "finite_check": "element"}
AUTO = {"kernel": "auto"}
CONFORMANCE_PARAMS = [{"granularity": "page_head", **t} for t in (V1, B2_DEEP_ELEMENT, B4_DEEP_BLOCK)] + [
    {"granularity": "token_head", **V1}, {"granularity": "page", **V1},
    {"granularity": "page", **B4_DEEP_BLOCK}] + [
    {"granularity": g, **t} for g in ("page_head", "token_head", "page") for t in (TILE, TILE_DEEP_BLOCK, AUTO)]


@pytest.mark.parametrize("params", CONFORMANCE_PARAMS, ids=["-".join(p.values()) for p in CONFORMANCE_PARAMS])
@pytest.mark.parametrize("cold_kind", ["pinned", "device", "unaligned"])
@pytest.mark.parametrize("layout", ["mixed", "tiny-odd"])
def test_conformance_layouts_gpu_blobs_equal_cpu_blobs(layout, cold_kind, params):
    from kvcodec_fp8.plugin import SPEC

    from kvcodec_sdk.testing.harness import GUARD_BYTES, Harness
    from kvcodec_sdk.testing.layouts import named_layout

    plan = named_layout(layout)
    gpu = Harness(SPEC, params, "cuda", plan, seed=5)
    cpu = Harness(SPEC, params, "cpu", plan, seed=5)
    try:
        for lc in plan.lifecycle_ids:
            g = plan.group_of(lc)
            src, back = gpu.pages(lc, 8)
            dst = gpu.spread_blobs(len(src))
            num = 2 * len(src) + 1
            size = gpu.cold_bytes(lc)
            assert size == cpu.cold_bytes(lc), f"lifecycle {lc}: GPU and CPU cold page sizes differ"
            host_cold = cpu.cold_buffer(lc, num, clause="gpu-vs-cpu")
            cpu.must("encode", lc, host_cold.base, cpu.index_array(lc, dst, src), clause="gpu-vs-cpu")
            want = host_cold.blobs()
            shift = 3 if cold_kind == "unaligned" else 0  # a cold base off 16-byte alignment
            backing = torch.full((num * size + 2 * GUARD_BYTES,), 0xC3, dtype=torch.uint8)
            backing = backing.cuda() if cold_kind == "device" else backing.pin_memory()
            base = backing.data_ptr() + GUARD_BYTES + shift
            torch.cuda.synchronize()  # the fill ran on the default stream, the codec uses another
            gpu.must("encode", lc, base, gpu.index_array(lc, dst, src), clause="gpu-vs-cpu")
            gpu.sync()
            raw = backing.cpu().numpy()
            got = raw[GUARD_BYTES + shift:GUARD_BYTES + shift + num * size].reshape(num, size)
            for d in dst:
                if not np.array_equal(got[d], want[d]):
                    i = int(np.flatnonzero(got[d] != want[d])[0])
                    pytest.fail(f"{layout}, lifecycle {lc}, {params}: blob {d}: GPU byte {i} is {got[d][i]:#x}, "
                                f"CPU byte {want[d][i]:#x}")
            untouched = sorted(set(range(num)) - set(dst.tolist()))
            assert (got[untouched] == 0xC3).all(), f"lifecycle {lc}: encode wrote outside its destination blobs"

            # Decode the CPU's blobs on both sides into even slots: identical hot bytes, guards kept.
            backing[GUARD_BYTES + shift:GUARD_BYTES + shift + num * size].copy_(torch.from_numpy(want.reshape(-1)))
            torch.cuda.synchronize()
            cpu.must("decode", lc, host_cold.base, cpu.index_array(lc, back, dst), clause="gpu-vs-cpu")
            gpu.must("decode", lc, base, gpu.index_array(lc, back, dst), clause="gpu-vs-cpu")
            gpu.sync()
            for p, (x, y) in enumerate(zip(gpu.hot_raw()[g], cpu.hot_raw()[g])):
                if not np.array_equal(x, y):
                    i = int(np.flatnonzero(x != y)[0])
                    pytest.fail(f"{layout}, lifecycle {lc}, {params}: pool {p} byte {i} (guard {GUARD_BYTES}): "
                                f"GPU decode wrote {x[i]:#x}, CPU decode {y[i]:#x}")
            gpu.restore_hot()
            cpu.restore_hot()
    finally:
        gpu.close()
        cpu.close()


def test_page_indices_out_of_range_are_skipped_and_legacy_stream_refused(stream):
    rng = np.random.default_rng(13)
    host = build_layout(rng, MIXED, num_slots=4)
    mirror = Mirror(host)
    codec = gpu_codec(mirror, {})
    size = codec.cold_page_bytes(0)
    cold = torch.full((2, size), 0x5A, dtype=torch.uint8, device="cuda")
    codec.encode(0, cold, dev_pairs([0, 1], [7, -1]), stream=stream)  # invalid hot slots: no work
    stream.synchronize()
    assert bool((cold == 0x5A).all())
    with pytest.raises(kv.CodecCallError, match="legacy"):
        codec.encode(0, cold, dev_pairs([0], [0]), stream=0)
    codec.encode(0, 0, 0, num_pages=0, stream=0)
    with pytest.raises(ValueError, match="host"):
        codec.encode(0, cold, pairs([0], [0]), stream=stream)  # host indices for a device lifecycle
    codec.close()


def test_encode_reads_data_written_just_before_on_the_stream(stream):
    rng = np.random.default_rng(14)
    host = build_layout(rng, LARGE[:1], num_slots=8)
    mirror = Mirror(host)
    fresh = torch.from_numpy(build_layout(np.random.default_rng(15), LARGE[:1], num_slots=8).pools[0]).cuda()
    codec = gpu_codec(mirror, {})
    cold = torch.empty((8, codec.cold_page_bytes(0)), dtype=torch.uint8).pin_memory()
    idx = dev_pairs(range(8), range(8))
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        mirror.dev[0].copy_(fresh)
        codec.encode(0, cold, idx, stream=stream)
    stream.synchronize()
    host.pools[0][:] = fresh.cpu().numpy()
    assert np.array_equal(cold.numpy(), cpu_blobs(host, {}, list(range(8)), 8, list(range(8))))
    codec.close()


@pytest.mark.parametrize("tuning", [{}, {"kernel": "b2", "small_blocks": "deep", "finite_check": "block"},
                                    {"kernel": "b4", "small_blocks": "deep"}, {"kernel": "tile"}, V1],
                         ids=["auto", "b2-deep-block", "b4-deep", "tile", "v1"])
@pytest.mark.parametrize("gran", ["page_head", "token_head"])
def test_many_pages_one_call(tuning, gran, stream):
    params = {"granularity": gran, **tuning}
    rng = np.random.default_rng(16)
    slots, pages = 4096, 3000
    spec = [[(0, Role.KEY, DType.BFLOAT16, (16, 2, 64)), (0, Role.VALUE, DType.BFLOAT16, (16, 2, 64))]]
    host = build_layout(rng, spec, num_slots=slots)
    mirror = Mirror(host)
    src = rng.permutation(slots)[:pages]
    dst = rng.permutation(pages)
    want = cpu_blobs(host, params, src, pages, dst)
    codec = gpu_codec(mirror, params)
    cold = torch.empty((pages, codec.cold_page_bytes(0)), dtype=torch.uint8, device="cuda")
    codec.encode(0, cold, dev_pairs(dst, src), stream=stream)
    stream.synchronize()
    assert np.array_equal(cold.cpu().numpy(), want)
    codec.close()

# The tile variant's hard cases: page_head at 64 tokens (two tiles per buffer, a token row's codes
# split between them), 7 heads (tiles of 4 and 3 heads), page granularity at 64 tokens (one
# 128 KiB block: too large for a tile, so warp units) and at 16 tokens (one tile), fp16 and fp32
# tiles, lossless buffers between tiled ones, a buffer off the vector path (odd head dim), and
# NaN/Inf/largest values in the data (kv_like special=True).
TILE_SPEC = [
    [(0, Role.KEY, DType.BFLOAT16, (64, 8, 128)), (0, Role.OTHER, DType.UINT8, 4096 + 3),
     (0, Role.VALUE, DType.BFLOAT16, (64, 7, 128)), (1, Role.KEY, DType.FLOAT16, (16, 8, 128))],
    [(1, Role.VALUE, DType.FLOAT32, (16, 4, 64)), (2, Role.KEY, DType.BFLOAT16, (9, 3, 24)),
     (2, Role.VALUE, DType.BFLOAT16, (16, 8, 128)), (3, Role.OTHER, DType.INT32, (8, 2, 4))],
]
TILE_TUNINGS = [TILE, TILE_DEEP_BLOCK]
TILE_TUNING_IDS = ["tile", "tile-deep-block"]


@pytest.mark.parametrize("tuning", TILE_TUNINGS, ids=TILE_TUNING_IDS)
@pytest.mark.parametrize("params", ALL_PARAMS, ids=IDS)
@pytest.mark.parametrize("cold_kind", ["pinned", "device"])
def test_tile_hard_cases_write_the_cpu_blobs_and_decode_identically(tuning, params, cold_kind, stream):
    from kvcodec_fp8.plan import blob_plan

    rng = np.random.default_rng(17)
    host = build_layout(rng, TILE_SPEC, num_slots=4, special=True)
    # The layout does take both paths (the plan is the codec's own).
    plan = blob_plan(host.groups, {**params, **tuning})[0]
    tiled = [b["tile_blocks"] > 0 for b in plan["buffers"] if b["quantized"]]
    assert any(tiled) and not all(tiled), tiled
    check_against_cpu({**params, **tuning}, TILE_SPEC, cold_kind, stream)


@pytest.mark.parametrize("tuning", TILE_TUNINGS, ids=TILE_TUNING_IDS)
def test_tile_hard_cases_with_an_unaligned_cold_base(tuning, stream):
    # A cold base off 16-byte alignment: the tiles' blocks go to the warps on the element path.
    rng = np.random.default_rng(18)
    for gran in ("page_head", "token_head", "page"):
        params = {"format": "e4m3", "granularity": gran, **tuning}
        host = build_layout(rng, TILE_SPEC, num_slots=3, special=True)
        mirror = Mirror(host)
        src, dst = [2, 0, 1], [1, 2, 0]
        want = cpu_blobs(host, params, src, 3, dst)
        codec = gpu_codec(mirror, params)
        backing, base = encode_off_alignment(codec, src, dst, want, 5, "device", stream, params)
        # Decode into zeroed pools on both sides: identical hot bytes.
        for d in mirror.dev:
            d.zero_()
        torch.cuda.synchronize()
        codec.decode(0, base, dev_pairs(src, dst), stream=stream)
        stream.synchronize()
        for p in host.pools:
            p[:] = 0
        cpu = kv.create_codec("fp8", params, device="cpu")
        cpu.configure(host.groups)
        cpu.decode(0, want, pairs(src, dst))
        cpu.close()
        for p, (d, h) in enumerate(zip(mirror.dev, host.pools)):
            assert np.array_equal(d.cpu().numpy(), h), f"{params}: pool {p}: GPU decode differs from CPU decode"
        codec.close()
