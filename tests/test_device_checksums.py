"""The device runtime's strided CRC-32C (what the manager checks the shared host level's blobs with
on a GPU, after copying them into device memory): every blob's value matches the bitwise
reference, whatever its length, alignment and place in the batch. The host backend runs on every
machine; the CUDA kernel where a device is present."""

from __future__ import annotations

import numpy as np
import pytest

from kvcodec_sdk import _native
from kvcodec_sdk.testing.support import gpu_test_marks

testing = _native.kvcm_testing

DEVICES = [pytest.param(-1, id="host"), pytest.param(0, id="cuda", marks=gpu_test_marks())]

# (stride, lengths): empty and one-byte blobs, lengths either side of the 16-byte loads and of
# the segment sizes the block splits into, a stride that leaves blobs unaligned (6000 bytes),
# and a 576 KiB page.
CASES = [
    (64, [0, 1, 15, 16, 17, 63, 64]),
    (6000, [6000, 5999, 4096, 1, 6000, 3000]),
    (65536, [65536, 65535, 65520, 65536 - 4096 + 7]),
    (576 << 10, [576 << 10, (576 << 10) - 1]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride,lengths", CASES)
def test_each_blob_matches_the_bitwise_reference(device, stride, lengths):
    data = np.random.default_rng(stride).integers(0, 256, stride * len(lengths), dtype=np.uint8).tobytes()
    got = testing.strided_crcs(device, data, stride, lengths)
    want = [_native.crc32c(data[i * stride:i * stride + n]) for i, n in enumerate(lengths)]
    assert got == want


@pytest.mark.parametrize("device", DEVICES)
def test_one_changed_byte_changes_only_its_blob(device):
    stride, n = 4096, 300
    data = bytearray(np.random.default_rng(1).integers(0, 256, stride * n, dtype=np.uint8).tobytes())
    before = testing.strided_crcs(device, bytes(data), stride, [stride] * n)
    data[stride * 123 + 4000] ^= 0x40
    after = testing.strided_crcs(device, bytes(data), stride, [stride] * n)
    assert [i for i in range(n) if before[i] != after[i]] == [123]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="must fit in data"):
        testing.strided_crcs(-1, b"x" * 100, 64, [64, 64])
    with pytest.raises(ValueError, match="at most stride"):
        testing.strided_crcs(-1, b"x" * 128, 64, [65, 1])
