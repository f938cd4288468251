"""kvcodec_sdk.gpu without a GPU: DeviceArray's views and its exports (DLPack, the array
interfaces) over host memory, which numpy and torch read without a copy, and the reports of what
the GPU tooling lacks. The device paths run in the manager's and the suite's CUDA tests."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from kvcodec_sdk import _native, gpu
from kvcodec_sdk.gpu import DeviceArray


def host_array(a: np.ndarray) -> DeviceArray:
    return DeviceArray(a.ctypes.data, a.shape, a.dtype, kind="host", owner=a)


def test_views_slice_retype_and_reshape_the_same_memory():
    a = np.arange(4 * 6, dtype=np.uint16).reshape(4, 6)
    d = host_array(a)
    assert (d.shape, d.strides, d.nbytes, len(d)) == ((4, 6), (12, 2), 48, 4)
    row = d[2]
    assert row.shape == (6,) and row.address == a.ctypes.data + 24 and row.is_contiguous
    block = d[1:3, 2:5]
    assert block.shape == (2, 3) and block.strides == (12, 2) and not block.is_contiguous
    assert np.array_equal(np.asarray(block), a[1:3, 2:5])
    assert np.array_equal(np.asarray(d[-1]), a[-1])
    as_bytes = d.view(np.uint8)
    assert as_bytes.shape == (4, 12) and np.array_equal(np.asarray(as_bytes), a.view(np.uint8))
    assert np.array_equal(np.asarray(d.reshape(-1)), a.reshape(-1))
    assert np.array_equal(np.asarray(d.reshape(3, 8)), a.reshape(3, 8))
    np.asarray(d[0])[:] = 7  # a view: writes land in the owner's memory
    assert (a[0] == 7).all()


@pytest.mark.parametrize("bad, error, text", [
    (lambda d: d[4], IndexError, "index 4 is out of range for axis 0 of extent 4"),
    (lambda d: d[::2], IndexError, "step-1 slices only"),
    (lambda d: d[0, 0, 0], IndexError, "3 indices for a 2-d array"),
    (lambda d: d["x"], TypeError, "ints and step-1 slices"),
    (lambda d: d[:, 1:].reshape(-1), ValueError, "reshape() needs a contiguous array"),
    (lambda d: d.reshape(5, 5), ValueError, "cannot reshape 24 elements into shape (5, 5)"),
    (lambda d: d[:, :3].view(np.uint32), ValueError, "holds 3 bytes, not a multiple of 4"),
    (lambda d: d.__cuda_array_interface__, AttributeError, "host memory exports __array_interface__"),
])
def test_wrong_views_are_refused_with_what_is_valid(bad, error, text):
    d = host_array(np.zeros((4, 6), np.uint8))
    with pytest.raises(error, match=__import__("re").escape(text)):
        bad(d)


def test_dlpack_hands_numpy_the_memory_with_shape_strides_and_type():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = host_array(a)
    assert d.__dlpack_device__() == (1, 0)
    got = np.from_dlpack(d[1:3, 2:5])
    assert got.shape == (2, 3) and got.strides == (24, 4) and np.array_equal(got, a[1:3, 2:5])
    assert got.ctypes.data == a.ctypes.data + 1 * 24 + 2 * 4  # no copy


def test_dlpack_keeps_the_owner_alive_until_the_consumer_lets_go():
    a = np.arange(64, dtype=np.uint8)
    d = host_array(a)
    base = sys.getrefcount(d)
    capsule = d.__dlpack__()
    assert sys.getrefcount(d) == base + 1, "the capsule holds the array"
    del capsule  # never consumed: its destructor lets go
    gc.collect()
    assert sys.getrefcount(d) == base
    view = np.from_dlpack(d)
    assert sys.getrefcount(d) == base + 1, "the consumer's tensor holds the array"
    del view
    gc.collect()
    assert sys.getrefcount(d) == base


def test_torch_takes_bfloat16_and_fp8_views_without_a_copy():
    torch = pytest.importorskip("torch")
    a = np.arange(16, dtype=np.uint8)
    d = host_array(a)
    bf = torch.from_dlpack(d.view("bfloat16"))
    assert bf.dtype == torch.bfloat16 and bf.shape == (8,)
    assert bf.data_ptr() == a.ctypes.data
    f8 = torch.from_dlpack(d.view("float8_e4m3fn"))
    assert f8.dtype == torch.float8_e4m3fn and f8.view(torch.uint8).tolist() == list(range(16))


def test_the_capsule_refuses_impossible_descriptions():
    with pytest.raises(ValueError, match="dtype is 'q9'"):
        _native.dlpack_capsule(0, [1], [], "q9", 1, 0, None)
    with pytest.raises(ValueError, match="strides has 1 entries for 2 dimensions"):
        _native.dlpack_capsule(0, [1, 1], [1], "u1", 1, 0, None)
    with pytest.raises(ValueError, match="extents must be >= 0"):
        _native.dlpack_capsule(0, [-1], [], "u1", 1, 0, None)


def test_device_arrays_export_the_cuda_array_interface():
    d = DeviceArray(0x7000_0000, (3, 8), np.uint8, kind="device", device_id=1)
    cai = d[1:, 2:6].__cuda_array_interface__
    assert cai["shape"] == (2, 4) and cai["data"] == (0x7000_0000 + 8 + 2, False) and cai["strides"] == (8, 1)
    assert d.__dlpack_device__() == (2, 1)
    with pytest.raises(AttributeError, match="device memory exports __cuda_array_interface__"):
        d.__array_interface__


def test_a_machine_without_a_gpu_is_told_what_is_missing():
    if _native.driver_info()["device_count"] > 0:
        pytest.skip("checks the report of a machine without a GPU")
    assert not gpu.available()
    assert "no CUDA device" in gpu.unavailable_reason()
    from kvcodec_sdk.commands.env import gpu_tooling

    report = gpu_tooling()
    assert report.startswith(("not installed: pip install", "installed, not usable here (no CUDA device"))


def test_cuda_core_views_a_device_array_without_a_copy():
    utils = pytest.importorskip("cuda.core.utils")
    a = np.arange(24, dtype=np.uint16).reshape(4, 6)
    view = utils.StridedMemoryView.from_dlpack(host_array(a)[1:3, 1:4], stream_ptr=-1)
    assert view.ptr == a.ctypes.data + 1 * 12 + 1 * 2
    assert tuple(view.shape) == (2, 3) and tuple(view.strides) == (6, 1) and view.dtype == np.uint16
