"""The nvfp4 CUDA kernel: blobs byte for byte equal to the CPU reference's and decoded pages equal
to the CPU decode, with device page indices, hot pools in device memory and blobs in device or
pinned host memory, on aligned and misaligned layouts (the kernel's vector and scalar paths),
partial blocks, special values and both granularities; large calls and out-of-range indices.

Every test carries the ``gpu`` marker and skips cleanly without a CUDA device and torch.
"""

from __future__ import annotations

import numpy as np
import pytest
from nvfp4_helpers import BF, FP, MIXED, K, O, V, build_layout, pairs

import kvcodec_sdk as kv
from kvcodec_sdk import LifeCycleDesc, PoolDesc, PoolGroupDesc
from kvcodec_sdk.testing.support import assert_blobs_match, cuda_test_module, encode_on_cuda

torch, pytestmark = cuda_test_module()

LARGE = [  # 64-token pages with 8 heads (several blocks per thread), fp16 next to bf16, an 8 KiB+ opaque buffer
    [(0, K, BF, (64, 8, 128)), (0, V, BF, (64, 8, 128))],
    [(1, K, BF, (16, 8, 128)), (1, V, FP, (16, 8, 128)), (1, O, kv.DType.UINT8, 3 * 8192 + 5)],
]
# vLLM's GPU blocks per KV head (HN2C): one K-and-V buffer (16 tokens, K and V, 128) per head and
# layer, and an fp16 one with 64 tokens.
KEY_VALUE = [
    [(layer, kv.Role.KEY_VALUE, BF, (16, 2, 128)) for layer in range(2) for _ in range(8)],
    [(2, kv.Role.KEY_VALUE, FP, (64, 2, 64)), (2, kv.Role.KEY_VALUE, FP, (64, 2, 64))],
]
# Only quantized buffers with several heads: with a scale per head and blobs in device memory, the
# warp kernels take them. Groups of 15 blocks (a partial warp) and of 320 (three rounds of 128).
WARP = [[(0, K, BF, (5, 3, 48)), (0, V, FP, (40, 2, 128))]]
# Groups of at most 4 KiB take the warp-staged encoder. Rows of 4, 8 or 16 blocks (its copy by
# strides): partial groups of 5 and 3 rows, full ones of 8 rows of 16 and 16 rows of 8 blocks.
WARP_STAGED = [[(0, K, BF, (5, 3, 64)), (0, V, FP, (8, 2, 256)), (1, K, BF, (3, 4, 128)), (1, V, FP, (16, 3, 128))]]
# Rows of 3 and 6 blocks: its general copy.
WARP_STAGED_ODD = [[(0, K, BF, (5, 3, 48)), (0, V, FP, (7, 2, 96))]]
GRANULARITIES = ("page_head", "page")


@pytest.fixture
def stream():
    return torch.cuda.Stream()


def device_groups(host, dev):
    return [PoolGroupDesc([PoolDesc(d.data_ptr(), d.shape[1], d.shape[0]) for d in dev],
                          [LifeCycleDesc(lc.lifecycle_id, lc.buffers) for lc in host.groups[0].lifecycles])]


def dev_pairs(dst, src):
    return torch.from_numpy(pairs(dst, src)).cuda()


def check_against_cpu(params, spec, cold_kind, stream, *, odd_slot=False, special=True, slots=12, pages=9,
                      near=False, subnormal=False):
    rng = np.random.default_rng(23)
    host = build_layout(rng, spec, slots, special=special, odd_slot=odd_slot, offset=5 if odd_slot else 0,
                        near=near, subnormal=subnormal)
    dev = [torch.from_numpy(p.copy()).cuda() for p in host.pools]
    src = rng.permutation(slots)[:pages]
    dst = rng.permutation(pages + 2)[:pages]

    cpu = kv.create_codec("nvfp4", params, device="cpu")
    cpu.configure(host.groups)
    size = cpu.cold_page_bytes(0)
    want = np.zeros((pages + 2, size), np.uint8)
    cpu.encode(0, want, pairs(dst, src))

    gpu = kv.create_codec("nvfp4", params, device="cuda")
    gpu.configure(device_groups(host, dev))
    assert gpu.page_index_location(0) == kv.PageIndexLocation.DEVICE
    assert gpu.cold_page_bytes(0) == size
    cold, got = encode_on_cuda(gpu, dev_pairs(dst, src), pages + 2, cold_kind, stream)
    assert_blobs_match(got, want, dst, str(params))

    back = rng.permutation(slots)[:pages]
    cpu.decode(0, want, pairs(back, dst))
    before = [d.clone() for d in dev]
    stream.wait_stream(torch.cuda.current_stream())  # the copies above are taken before the decode writes
    gpu.decode(0, cold, dev_pairs(back, dst), stream=stream)
    stream.synchronize()
    others = sorted(set(range(slots)) - set(back.tolist()))
    for p, (d, h) in enumerate(zip(dev, host.pools)):
        assert np.array_equal(d.cpu().numpy()[back], h[back]), f"{params}: pool {p}: GPU decode differs from CPU decode"
        assert torch.equal(d[others], before[p][others]), "decode wrote outside its destination slots"
    gpu.close()
    cpu.close()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("spec", [MIXED, LARGE, KEY_VALUE, WARP, WARP_STAGED, WARP_STAGED_ODD],
                         ids=["mixed", "large", "key-value", "warp", "warp-staged", "warp-staged-odd"])
@pytest.mark.parametrize("cold_kind", ["device", "pinned"])
def test_gpu_blobs_equal_cpu_blobs_and_decode_identically(granularity, spec, cold_kind, stream):
    check_against_cpu({"granularity": granularity}, spec, cold_kind, stream)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_misaligned_slots_take_the_scalar_path_with_the_same_bytes(granularity, stream):
    check_against_cpu({"granularity": granularity}, MIXED, "device", stream, odd_slot=True)
    check_against_cpu({"granularity": granularity}, LARGE, "pinned", stream, odd_slot=True)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_values_next_to_every_rounding_threshold_code_as_on_the_cpu(granularity, stream):
    # The kernel's whole-buffer path: 12 heads (groups not a power of two; a thread's blocks span
    # several heads), 64 tokens of 4 heads (more than one round of 2048 blocks), one head.
    spec = [[(0, K, BF, (16, 12, 128)), (0, V, FP, (16, 12, 128))],
            [(1, K, BF, (64, 4, 128)), (1, V, BF, (4, 1, 64))]]
    check_against_cpu({"granularity": granularity}, spec, "device", stream, near=True)
    check_against_cpu({"granularity": granularity}, spec, "pinned", stream, near=True, special=False)


@pytest.mark.parametrize("spec", [WARP_STAGED, MIXED], ids=["warp-staged", "mixed"])
def test_subnormal_blocks_code_as_on_the_cpu(spec, stream):
    # Blocks of subnormal values only, and groups whose scale is clamped to 2^-126: the largest
    # magnitudes and the codes come out of the kernels' packed half-precision arithmetic.
    check_against_cpu({"granularity": "page_head"}, spec, "device", stream, special=False, subnormal=True)


def test_lossless_lists_on_the_gpu(stream):
    check_against_cpu({"lossless_roles": "key", "lossless_layers": "1"}, MIXED, "device", stream)


def test_many_pages_in_one_call(stream):
    check_against_cpu({}, [[(0, K, FP, (2, 1, 8)), (0, V, BF, (2, 1, 8))]], "device", stream, special=False,
                      slots=5000, pages=4000)


@pytest.mark.parametrize("spec", [MIXED, WARP, WARP_STAGED, WARP_STAGED_ODD],
                         ids=["mixed", "warp", "warp-staged", "warp-staged-odd"])
def test_out_of_range_device_indices_write_nothing(spec, stream):
    rng = np.random.default_rng(1)
    host = build_layout(rng, spec, 4)
    dev = [torch.from_numpy(p.copy()).cuda() for p in host.pools]
    gpu = kv.create_codec("nvfp4", device="cuda")
    gpu.configure(device_groups(host, dev))
    cold = torch.full((3, gpu.cold_page_bytes(0)), 0x5A, dtype=torch.uint8, device="cuda")
    gpu.encode(0, cold, dev_pairs([0, 1, 2], [-1, 4, 1 << 30]), stream=stream)
    stream.synchronize()
    assert bool((cold == 0x5A).all()), "pairs with hot indices outside the pools must be skipped"
    gpu.close()
