"""The concat codec's CUDA implementation, checked against torch gathers and the CPU reference.

Every test carries the ``gpu`` marker and skips cleanly without a CUDA device and torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk.testing.support import cuda_test_module

torch, pytestmark = cuda_test_module()

PATHS = [
    {"path": "copy_engine"},
    {"path": "sm"},
    {"path": "copy_engine", "copy_api": "per_copy"},
    {},
]
PATH_IDS = ["copy_engine", "sm", "per_copy", "auto"]


@pytest.fixture
def stream():
    return torch.cuda.Stream()


def after_inputs(stream):
    """``stream``, made to wait for what torch's current stream has queued so far (the index pairs
    and pools a test just made there), as an engine orders a codec call after the work that fills
    its inputs. Without it a call on ``stream`` may read device index pairs not yet written: on a
    GPU busy with other work, the SM path then moved the wrong slots."""
    stream.wait_stream(torch.cuda.current_stream())
    return stream


def make_pools(slot_sizes, slots, gen):
    return [torch.randint(0, 256, (slots * s,), dtype=torch.uint8, device="cuda", generator=gen) for s in slot_sizes]


def layout_of(groups_pools, slots, lifecycles_per_group):
    groups = []
    next_id = 0
    for pools in groups_pools:
        lcs = []
        for _ in range(lifecycles_per_group):
            lcs.append(kv.LifeCycleDesc(next_id))
            next_id += 1
        groups.append(kv.PoolGroupDesc([kv.PoolDesc(p.data_ptr(), p.numel() // slots, slots) for p in pools], lcs))
    return groups


def expected_blobs(pools, slots, src):
    return torch.cat([p.view(slots, -1)[src.long()] for p in pools], dim=1)


def index_pairs(dst, src, location):
    pairs = torch.stack([dst, src], dim=1).to(torch.int32).contiguous()
    return pairs.cuda() if location == kv.PageIndexLocation.DEVICE else pairs.cpu()


@pytest.mark.parametrize("params", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize(
    "slot_sizes",
    [(4096, 4096, 8192), (7, 100, 4097), (65536 + 16, 16, 1), (3, 5, 9, 11)],
    ids=["aligned", "odd", "large-tiny", "tiny-odd"],
)
def test_round_trip_random_layouts(params, slot_sizes, stream):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(sum(slot_sizes))
    slots, pages = 64, 40
    # Two hot pool groups; lifecycles 0,1 in group 0 and 2,3 in group 1.
    pools_a = make_pools(slot_sizes, slots, gen)
    pools_b = make_pools(slot_sizes[::-1], slots, gen)
    codec = kv.create_codec("concat", params, device="cuda")
    codec.configure(layout_of([pools_a, pools_b], slots, 2))
    for lc, pools in ((1, pools_a), (3, pools_b)):
        rep = codec.batching_layer_group_id(lc)
        assert rep == lc - 1
        page_bytes = codec.cold_page_bytes(lc)
        assert page_bytes == sum(p.numel() // slots for p in pools)
        location = codec.page_index_location(lc)
        cold = torch.full((pages + 3, page_bytes), 0xC3, dtype=torch.uint8).pin_memory()
        src = torch.randperm(slots, generator=gen, device="cuda")[:pages]
        dst = torch.randperm(pages, generator=gen, device="cuda")
        codec.encode(rep, cold, index_pairs(dst, src, location), stream=after_inputs(stream))
        stream.synchronize()
        blobs = cold.cuda()
        assert torch.equal(blobs[dst.long()], expected_blobs(pools, slots, src))
        assert bool((blobs[pages:] == 0xC3).all()), "encode wrote outside its destination blobs"

        # Decode into other hot slots of the same pools and compare with the originals.
        originals = [p.clone() for p in pools]
        back = torch.randperm(slots, generator=gen, device="cuda")[:pages]
        codec.decode(lc, cold, index_pairs(back, dst, location), stream=after_inputs(stream))
        stream.synchronize()
        for p, orig in zip(pools, originals):
            view, ref = p.view(slots, -1), orig.view(slots, -1)
            assert torch.equal(view[back.long()], ref[src.long()])
            untouched = torch.ones(slots, dtype=torch.bool, device="cuda")
            untouched[back.long()] = False
            assert torch.equal(view[untouched], ref[untouched]), "decode wrote outside its destination slots"
    codec.close()


@pytest.mark.parametrize("params", PATHS[:2], ids=PATH_IDS[:2])
def test_65536_noncontiguous_pages(params, stream):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    slots, pages, sizes = 2 * 65536, 65536, (512, 256, 1024)
    pools = make_pools(sizes, slots, gen)
    codec = kv.create_codec("concat", params, device="cuda")
    codec.configure(layout_of([pools], slots, 1))
    location = codec.page_index_location(0)
    src = torch.randperm(slots, generator=gen, device="cuda")[:pages]
    dst = torch.randperm(pages, generator=gen, device="cuda")
    cold = torch.empty((pages, sum(sizes)), dtype=torch.uint8).pin_memory()
    codec.encode(0, cold, index_pairs(dst, src, location), stream=after_inputs(stream))
    stream.synchronize()
    assert torch.equal(cold.cuda()[dst.long()], expected_blobs(pools, slots, src))


@pytest.mark.parametrize("params", PATHS[:3], ids=PATH_IDS[:3])
def test_pool_of_5mib_plus_16(params, stream):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    slots, piece = 6, 5 * 1024 * 1024 + 16
    pools = make_pools((piece, 4096, 1), slots, gen)
    codec = kv.create_codec("concat", params, device="cuda")
    codec.configure(layout_of([pools], slots, 1))
    location = codec.page_index_location(0)
    src = torch.tensor([5, 0, 3], device="cuda")
    dst = torch.tensor([2, 0, 1], device="cuda")
    cold = torch.empty((3, codec.cold_page_bytes(0)), dtype=torch.uint8).pin_memory()
    codec.encode(0, cold, index_pairs(dst, src, location), stream=after_inputs(stream))
    stream.synchronize()
    assert torch.equal(cold.cuda()[dst.long()], expected_blobs(pools, slots, src))


@pytest.mark.parametrize("params", PATHS[:3], ids=PATH_IDS[:3])
def test_source_written_by_kernel_just_before_encode_is_captured(params, stream):
    """Stream ordering: a delayed kernel rewrites the hot pages right before encode on the same
    stream; the blobs must hold the new data, not the old."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    slots, pages, sizes = 256, 128, (16384, 8192, 4096)
    pools = make_pools(sizes, slots, gen)
    fresh = make_pools(sizes, slots, gen)
    codec = kv.create_codec("concat", params, device="cuda")
    codec.configure(layout_of([pools], slots, 1))
    location = codec.page_index_location(0)
    src = torch.randperm(slots, generator=gen, device="cuda")[:pages]
    dst = torch.arange(pages, device="cuda")
    pairs = index_pairs(dst, src, location)
    cold = torch.empty((pages, sum(sizes)), dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # ~25 ms: encode would read stale data if it ignored the stream
        for p, f in zip(pools, fresh):
            p.copy_(f)
        codec.encode(0, cold, pairs, stream=after_inputs(stream))
    stream.synchronize()
    assert torch.equal(cold.cuda(), expected_blobs(fresh, slots, src))

    # Decode ordering: the blob is rewritten on the stream right before decode.
    new_blobs = torch.randint(0, 256, cold.shape, dtype=torch.uint8, device="cuda", generator=gen)
    back = index_pairs(src, dst, location)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        cold.copy_(new_blobs, non_blocking=True)
        codec.decode(0, cold, back, stream=after_inputs(stream))
    stream.synchronize()
    assert torch.equal(expected_blobs(pools, slots, src), new_blobs)


@pytest.mark.parametrize("params", PATHS[:2], ids=PATH_IDS[:2])
def test_temporary_index_tensor_outlives_its_queued_call(params, stream):
    """Codec.encode records a device index tensor on the call's stream: torch's allocator must not
    hand its block to the next allocation (on torch's own stream) before the queued call read it."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(17)
    slots, pages, sizes = 128, 96, (4096, 100)
    pools = make_pools(sizes, slots, gen)
    codec = kv.create_codec("concat", params, device="cuda")
    codec.configure(layout_of([pools], slots, 1))
    location = codec.page_index_location(0)
    if location != kv.PageIndexLocation.DEVICE:
        pytest.skip("this path consumes host indices before returning")
    src = torch.randperm(slots, generator=gen, device="cuda")[:pages]
    dst = torch.arange(pages, device="cuda")
    cold = torch.zeros((pages, sum(sizes)), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # ~50 ms: the encode runs well after it is queued
    codec.encode(0, cold, index_pairs(dst, src, location), stream=after_inputs(stream))  # a temporary, freed here
    # Same size, allocated and written on torch's stream while the encode still waits. (Nothing
    # here blocks a stream indefinitely: an allocation may wait for the device.)
    other = index_pairs(dst, src.flip(0), location)
    stream.synchronize()
    assert torch.equal(cold, expected_blobs(pools, slots, src))
    del other


@pytest.mark.parametrize("params", PATHS[:2], ids=PATH_IDS[:2])
def test_gpu_and_cpu_blobs_are_interchangeable(params, stream):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    slots, pages, sizes = 32, 20, (100, 4097, 7)
    pools = make_pools(sizes, slots, gen)
    gpu = kv.create_codec("concat", params, device="cuda")
    gpu.configure(layout_of([pools], slots, 1))
    host_pools = [p.cpu().numpy() for p in pools]
    cpu = kv.create_codec("concat", device="cpu")
    cpu.configure([kv.PoolGroupDesc([kv.PoolDesc(h.ctypes.data, h.size // slots, slots) for h in host_pools],
                                    [kv.LifeCycleDesc(0)])])
    cpu_gen = torch.Generator()
    cpu_gen.manual_seed(4)
    src = torch.randperm(slots, generator=cpu_gen)[:pages]
    dst = torch.randperm(pages, generator=cpu_gen)
    cold_gpu = torch.empty((pages, sum(sizes)), dtype=torch.uint8).pin_memory()
    gpu.encode(0, cold_gpu, index_pairs(dst, src, gpu.page_index_location(0)), stream=after_inputs(stream))
    stream.synchronize()
    cold_cpu = np.empty((pages, sum(sizes)), np.uint8)
    cpu.encode(0, cold_cpu, np.stack([dst.numpy(), src.numpy()], 1).astype(np.int32))
    assert np.array_equal(cold_gpu.numpy(), cold_cpu)

    # A CPU-encoded blob decoded on the GPU restores the pages.
    for p in pools:
        p.zero_()
    cold_pinned = torch.from_numpy(cold_cpu).pin_memory()
    gpu.decode(0, cold_pinned, index_pairs(src, dst, gpu.page_index_location(0)), stream=after_inputs(stream))
    stream.synchronize()
    for p, h in zip(pools, host_pools):
        assert np.array_equal(p.view(slots, -1)[src.long().cuda()].cpu().numpy(), h.reshape(slots, -1)[src.numpy()])


def test_legacy_stream_rejected_and_empty_calls_succeed():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    pools = make_pools((4096, 4096, 4096), 4, gen)
    for params in PATHS[:2]:
        codec = kv.create_codec("concat", params, device="cuda")
        codec.configure(layout_of([pools], 4, 1))
        cold = torch.empty((4, 3 * 4096), dtype=torch.uint8).pin_memory()
        pairs = index_pairs(torch.tensor([0]), torch.tensor([1]), codec.page_index_location(0))
        for legacy in (0, 1):
            with pytest.raises(kv.CodecCallError, match="legacy"):
                codec.encode(0, cold, pairs, stream=legacy)
            with pytest.raises(kv.CodecCallError, match="legacy"):
                codec.decode(0, cold, pairs, stream=legacy)
        codec.encode(0, 0, 0, num_pages=0, stream=0)  # empty call: succeeds, enqueues nothing
        codec.decode(0, 0, 0, num_pages=0, stream=0)


def test_descriptors_split_at_host_registration_boundaries(stream):
    """Cold blobs straddling two adjacent cudaHostRegister regions round-trip exactly."""
    cudart = torch.cuda.cudart()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    slots, pages, sizes = 64, 48, (4096, 1000, 3000)  # 8096-byte pages straddle the boundary
    pools = make_pools(sizes, slots, gen)
    region = 1 << 18  # 256 KiB per registration
    backing = np.zeros(2 * region + 4096, np.uint8)
    base = (backing.ctypes.data + 4095) // 4096 * 4096
    for k in range(2):
        err = cudart.cudaHostRegister(base + k * region, region, 3)  # portable | mapped
        assert int(err) == 0, f"cudaHostRegister failed: {err}"
    try:
        assert pages * sum(sizes) <= 2 * region
        for params in PATHS[:3]:
            codec = kv.create_codec("concat", params, device="cuda")
            codec.configure(layout_of([pools], slots, 1))
            location = codec.page_index_location(0)
            src = torch.randperm(slots, generator=gen, device="cuda")[:pages]
            dst = torch.arange(pages, device="cuda")
            codec.encode(0, base, index_pairs(dst, src, location), stream=after_inputs(stream))
            stream.synchronize()
            view = np.frombuffer((np.ctypeslib.as_ctypes_type(np.uint8) * (pages * sum(sizes))).from_address(base),
                                 np.uint8).reshape(pages, -1)
            assert np.array_equal(view, expected_blobs(pools, slots, src).cpu().numpy()), params
            codec.close()
    finally:
        for k in range(2):
            cudart.cudaHostUnregister(base + k * region)
