"""The manager's device pools and kvcodec_sdk.gpu arrays taken by other GPU frameworks without a
copy: torch (DLPack and __cuda_array_interface__), cuda.core (StridedMemoryView) and CuPy where
it is installed; their streams accepted by the manager. Each framework's test skips without it."""

from __future__ import annotations

import numpy as np
import pytest
from test_kvcm_support import config, group

from kvcodec_sdk import KVCacheManager, gpu
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()


def manager_with_pages(n=8):
    m = KVCacheManager(config([group([0], [4096])], gpu_quota=4096 * 32, host_quota=4096 * 32, device="cuda:0"))
    pages = m.allocate(0, n)
    pool = m.hot_pool_tensors(0, framework="cuda")[0]
    return m, pages, pool


def round_trip_through_the_host(m, pages, pool, stream, expected):
    """Evicts on ``stream`` and onboards: the pages come back byte for byte."""
    m.evict(pages, stream=stream)
    m.synchronize()
    pool.fill_bytes(0)
    m.onboard(pages, stream=stream)
    m.synchronize()
    gpu.synchronize(stream)
    assert np.array_equal(pool.take_rows([p.slot for p in pages]), expected)


def test_torch_takes_the_pools_and_its_streams_order_the_manager():
    torch = pytest.importorskip("torch", exc_type=ImportError)
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    m, pages, pool = manager_with_pages()
    t = torch.from_dlpack(pool)
    c = torch.as_tensor(pool, device="cuda")  # __cuda_array_interface__
    assert t.data_ptr() == c.data_ptr() == pool.address and t.device.type == "cuda" and t.shape == pool.shape
    s = torch.cuda.Stream()
    slots = torch.tensor([p.slot for p in pages], device="cuda")
    with torch.cuda.stream(s):
        t[slots] = torch.randint(0, 256, (len(pages), pool.shape[1]), dtype=torch.uint8, device="cuda")
        expected = t[slots].cpu().numpy()
    round_trip_through_the_host(m, pages, pool, s, expected)
    bf = torch.from_dlpack(pool[pages[0].slot].view("bfloat16"))
    assert bf.dtype == torch.bfloat16 and bf.data_ptr() == pool.address + pages[0].slot * pool.strides[0]
    m.close()


def test_cuda_core_views_the_pools_and_its_streams_order_the_manager():
    utils = pytest.importorskip("cuda.core.utils")
    m, pages, pool = manager_with_pages()
    view = utils.StridedMemoryView.from_dlpack(pool, stream_ptr=-1)
    assert view.ptr == pool.address and view.is_device_accessible and tuple(view.shape) == pool.shape
    s = gpu.new_stream()
    data = np.random.default_rng(4).integers(0, 256, (len(pages), pool.shape[1]), dtype=np.uint8)
    for row, p in zip(data, pages):
        pool[p.slot].copy_from(row, s)  # queued on s: the eviction below is ordered after it
    round_trip_through_the_host(m, pages, pool, s, data)
    m.close()


def test_cupy_takes_the_pools_and_its_streams_order_the_manager():
    cupy = pytest.importorskip("cupy")
    m, pages, pool = manager_with_pages()
    a = cupy.asarray(pool)  # __cuda_array_interface__
    b = cupy.from_dlpack(pool)
    assert a.data.ptr == b.data.ptr == pool.address and a.shape == pool.shape
    s = cupy.cuda.Stream(non_blocking=True)
    slots = cupy.asarray([p.slot for p in pages])
    with s:
        a[slots] = cupy.random.randint(0, 256, (len(pages), pool.shape[1])).astype(cupy.uint8)
        expected = cupy.asnumpy(a[slots])
    round_trip_through_the_host(m, pages, pool, s.ptr, expected)
    m.close()


@pytest.mark.parametrize("cold_kind", ["pinned", "device"])
def test_encode_on_cuda_needs_only_cuda_python(cold_kind):
    """The plugins' test helper encodes into canary-filled pinned or device memory on a cuda.core
    stream: concat's blobs equal the CPU reference's and no byte outside them changes."""
    import kvcodec_sdk as kv
    from kvcodec_sdk.testing.support import CANARY, assert_blobs_match, encode_on_cuda

    rng = np.random.default_rng(9)
    slots, sizes = 10, (4096, 100, 7)
    host = [rng.integers(0, 256, (slots, s), dtype=np.uint8) for s in sizes]
    dev = [gpu.to_device(h) for h in host]

    def layout(pools):
        return [kv.PoolGroupDesc([kv.PoolDesc(a, s, slots) for a, s in zip(pools, sizes)], [kv.LifeCycleDesc(0)])]

    src, dst = np.array([7, 2, 5, 0]), np.array([3, 0, 5, 1])
    pairs = np.stack([dst, src], 1).astype(np.int32)
    cpu = kv.create_codec("concat", device="cpu")
    cpu.configure(layout([h.ctypes.data for h in host]))
    want = np.full((6, cpu.cold_page_bytes(0)), CANARY, np.uint8)
    cpu.encode(0, want, pairs)
    codec = kv.create_codec("concat", device="cuda")
    codec.configure(layout([d.address for d in dev]))
    on_device = codec.page_index_location(0) == kv.PageIndexLocation.DEVICE
    stream = gpu.new_stream()
    cold, got = encode_on_cuda(codec, gpu.to_device(pairs) if on_device else pairs, 6, cold_kind, stream)
    assert isinstance(cold, gpu.DeviceArray) and cold.kind == ("host" if cold_kind == "pinned" else "device")
    assert_blobs_match(got, want, dst, f"concat into {cold_kind} memory")
    assert np.array_equal(got[dst], np.concatenate([h[src] for h in host], 1))
    with pytest.raises(ValueError, match="cold_kind is 'managed'"):
        encode_on_cuda(codec, pairs, 6, "managed", stream)
    codec.close()
    cpu.close()
