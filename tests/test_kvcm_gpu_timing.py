"""GPU time per codec call (KVCacheManager.set_codec_gpu_timing): timed CUDA events around each
call, added to PoolGroupStats once both completed, never waited for. The CPU backend keeps no
event times: there the switch reports False and the fields stay zero."""

from __future__ import annotations

import time

import pytest
from test_kvcm_support import config, group

from kvcodec_sdk import CacheLevel, KVCacheManager, _native


def test_the_cpu_backend_times_nothing():
    m = KVCacheManager(config([group([0], [4096])]))
    assert m.set_codec_gpu_timing(True) is False
    pages = m.allocate(0, 4)
    m.evict(pages)
    m.onboard(pages)
    st = m.stats(CacheLevel.HOST)[0]
    assert st.encode_calls == st.decode_calls == 1
    assert (st.encode_gpu_calls, st.decode_gpu_calls, st.encode_gpu_seconds, st.decode_gpu_seconds) == (0, 0, 0, 0)
    assert m.set_codec_gpu_timing(False) is False
    m.close()


needs_cuda = pytest.mark.skipif(_native.driver_info()["device_count"] == 0, reason="needs a CUDA device")


def gpu_manager(disk=None):
    kw = {"disk": disk} if disk is not None else {}
    return KVCacheManager(config([group([0, 1, 2], [16384, 16384])], gpu_quota=256 << 20, host_quota=256 << 20,
                                 device="cuda:0", **kw))


def settled(m, level, want_calls, timeout=10.0):
    """stats(level)[0] once the GPU times of want_calls encodes and decodes were harvested."""
    deadline = time.monotonic() + timeout
    while True:
        st = m.stats(level)[0]
        if st.encode_gpu_calls >= want_calls[0] and st.decode_gpu_calls >= want_calls[1]:
            return st
        assert time.monotonic() < deadline, f"GPU times not harvested: {st}"
        time.sleep(0.01)


@pytest.mark.gpu
@needs_cuda
def test_codec_calls_are_timed_on_the_gpu():
    m = gpu_manager()
    assert m.set_codec_gpu_timing(True) is True
    pages = m.allocate(0, 2000)
    t0 = time.perf_counter()
    m.evict(pages)
    m.onboard(pages)
    m.synchronize()
    wall = time.perf_counter() - t0
    st = settled(m, CacheLevel.HOST, (1, 1))
    assert st.encode_gpu_calls == st.encode_calls and st.decode_gpu_calls == st.decode_calls
    assert 0 < st.encode_gpu_seconds <= wall and 0 < st.decode_gpu_seconds <= wall
    hot = m.stats(CacheLevel.HOT)[0]  # both ends of the transfer count it, as every counter
    assert (hot.encode_gpu_calls, hot.decode_gpu_seconds) == (st.encode_gpu_calls, st.decode_gpu_seconds)
    # Off: later calls are not timed.
    assert m.set_codec_gpu_timing(False) is False
    m.evict(pages)
    m.synchronize()
    later = m.stats(CacheLevel.HOST)[0]
    assert later.encode_calls == st.encode_calls + 1 and later.encode_gpu_calls == st.encode_gpu_calls
    m.close()


@pytest.mark.gpu
@needs_cuda
def test_timing_never_blocks_the_caller_and_shows_in_a_scrape():
    prometheus_client = pytest.importorskip("prometheus_client")
    from kvcodec_sdk import metrics

    m = gpu_manager()
    m.set_codec_gpu_timing(True)
    pages = m.allocate(0, 500)
    for _ in range(50):  # many timed calls in flight: none waits for an earlier one's events
        m.evict(pages)
        m.onboard(pages)
    m.synchronize()
    st = settled(m, CacheLevel.HOST, (50, 50))
    assert st.encode_gpu_calls == 50 and st.decode_gpu_calls == 50
    registry = prometheus_client.CollectorRegistry()
    metrics.register(m, name="gpu", registry=registry)
    value = registry.get_sample_value("kvcodec_codec_gpu_seconds_total", {
        "manager": "gpu", "codec": "concat", "level": "host", "pool_group": "0", "direction": "decode"})
    assert value == pytest.approx(st.decode_gpu_seconds) and value > 0
    m.close()


@pytest.mark.gpu
@needs_cuda
def test_disk_transfers_are_timed(tmp_path):
    from kvcodec_sdk import DiskTierConfig

    m = gpu_manager(DiskTierConfig(str(tmp_path), max_bytes=256 << 20))
    m.set_codec_gpu_timing(True)
    pages = m.allocate(0, 256)
    m.evict(pages, level=CacheLevel.DISK)
    m.onboard(pages, source=CacheLevel.DISK)
    m.synchronize()
    st = settled(m, CacheLevel.DISK, (1, 1))
    assert st.encode_gpu_seconds > 0 and st.decode_gpu_seconds > 0
    m.close()
