"""The remote level on the CUDA backend against a real valkey-server: pages written by torch on a
side stream go hot -> remote (ordered after those writes, without any synchronization by the
caller) and come back byte-exact through both concat paths, another manager finds them, and the
non-blocking path lands. Skips cleanly without a CUDA device."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kvcodec_sdk import CacheLevel, KVCacheManager, RemoteTierConfig
from kvcodec_sdk.testing.support import cuda_test_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_kvcm_support import config, group, hot_bytes  # noqa: E402

torch, pytestmark = cuda_test_module()

GROUPS = [group([0, 1, 2], [4096, 4096]), group([3], [1024])]


def cuda_manager(port, codec=None, host_quota=16 << 20):
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    factory = lambda identity: ValkeyBackend("127.0.0.1", port, identity=identity, timeout_s=10.0)  # noqa: E731
    cfg = config(GROUPS, device="cuda:0", gpu_quota=64 << 20, host_quota=host_quota,
                 remote=RemoteTierConfig(factory, max_pages=4096))
    return KVCacheManager(cfg, cold_page_codec=codec)


def write_on_stream(m, pages, stream):
    with torch.cuda.stream(stream):
        for p in pages:
            for v in m.page_view(p):
                v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, device="cuda"))
    stream.synchronize()
    expected = {p.id: hot_bytes(m, p) for p in pages}
    with torch.cuda.stream(stream):  # the same bytes again: the eviction races with pending writes
        for p in pages:
            for v in m.page_view(p):
                v.copy_(v.clone())
    return expected


def zero_hot(m):
    for lc in range(m.num_layer_groups):
        for pool in m.hot_pool_tensors(lc):
            pool.zero_()
    torch.cuda.synchronize()


@pytest.mark.parametrize("params", [{"path": "copy_engine"}, {"path": "sm"}], ids=["copy_engine", "sm"])
def test_hot_remote_hot_on_a_stream_is_byte_exact(valkey_server, params):
    m = cuda_manager(valkey_server.port, ("concat", params))
    s = torch.cuda.Stream()
    pages = m.allocate(0, 200) + m.allocate(1, 60)
    expected = write_on_stream(m, pages, s)
    m.set_keys(pages[:100], [f"gpu-{i}".encode() for i in range(100)])
    assert m.evict(pages, stream=s, level=CacheLevel.REMOTE).moved == 260
    zero_hot(m)
    r = m.onboard(pages, stream=s, source=CacheLevel.REMOTE)
    s.synchronize()
    assert r.moved == 260 and not r.dropped
    assert all(np.array_equal(hot_bytes(m, p), expected[p.id]) for p in pages)
    m.close()


def test_another_manager_onboards_and_non_blocking_lands(valkey_server):
    writer, reader = cuda_manager(valkey_server.port), cuda_manager(valkey_server.port, host_quota=0)
    s = torch.cuda.Stream()
    pages = writer.allocate(0, 128)
    expected = write_on_stream(writer, pages, s)
    keys = [f"shared-gpu-{i}".encode() for i in range(128)]
    writer.set_keys(pages, keys)
    writer.evict(pages, stream=s, level=CacheLevel.REMOTE, blocking=False).wait(timeout=60)
    found = reader.find_remote(keys)
    r = reader.onboard(found, stream=s, source=CacheLevel.REMOTE, blocking=False).wait(timeout=60)
    s.synchronize()
    assert r.moved == 128
    assert all(np.array_equal(hot_bytes(reader, f), expected[p.id]) for f, p in zip(found, pages))
    writer.close()
    reader.close()
