"""Capacity management on the CUDA backend: the CPU suite's stateful randomized workload
(allocations that evict, writes, touches, pins, priorities, make_room, onboards, resizes
and defragmentation of every level, the disk's included; hot → host → disk cascades and drops at
the last level) against the same model, plus an eviction ordered after writes on a side
stream, by cuda-python alone and by torch (gpu_kit). Skips cleanly without a CUDA device and
cuda-python."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from test_kvcm_capacity import CapacityMachine
from test_kvcm_support import config, group, hot_bytes

from kvcodec_sdk import CacheLevel, KVCacheManager
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()


class CudaCapacityMachine(CapacityMachine):
    device = "cuda:0"
    codecs = ("concat",)


class CudaCapacityDiskMachine(CudaCapacityMachine):
    with_disk = True


TestCudaCapacityMachine = CudaCapacityMachine.TestCase
TestCudaCapacityMachine.settings = settings(max_examples=20, stateful_step_count=30, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
TestCudaCapacityDiskMachine = CudaCapacityDiskMachine.TestCase
TestCudaCapacityDiskMachine.settings = settings(max_examples=10, stateful_step_count=25, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow])


def test_eviction_under_allocation_is_ordered_after_side_stream_writes(kit):
    # Pages written by a kernel on a side stream, then evicted by an allocation on that stream:
    # the encode must see the writes (no host synchronization in between).
    m = KVCacheManager(config([group([0], [4096])], gpu_quota=4096 * 64, host_quota=4096 * 64, device="cuda:0"))
    s = kit.stream()
    pages = m.allocate(0, 64, stream=s)
    for i, p in enumerate(pages):
        kit.fill(m.page_view(p, framework=kit.framework)[0], i % 251 + 1, s)
    m.allocate(0, 32, stream=s)  # evicts pages[:32] on s
    m.synchronize()
    for i, p in enumerate(pages[:32]):
        assert p.level == CacheLevel.HOST
        assert np.all(np.asarray(m.page_view(p)[0]) == i % 251 + 1)
    m.make_room(CacheLevel.HOT, 0, 32, stream=s)  # pages[32:] go to the 32 free host slots
    m.onboard(pages[:32], stream=s)
    kit.sync(s)
    for i, p in enumerate(pages[:32]):
        assert np.all(hot_bytes(m, p) == i % 251 + 1)
