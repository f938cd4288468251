"""The cache daemon's L2 arena as a remote-tier backend, against a real daemon process started per
test: the backend contract, the manager's remote level on it, and two processes sharing pages."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from level_contract import ManagerLevelContract, keys_for
from remote_contract import IDENTITY, BackendContract, content_key, out_buffers
from test_kvcm_support import group

from kvcodec_sdk import CacheLevel
from kvcodec_sdk.remote import RemoteFull, Status
from kvcodec_sdk.remote.servers import DaemonProcess


@pytest.fixture
def store():
    daemon = DaemonProcess()
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture
def make_backend(store):
    from kvcodec_sdk.remote.daemon import DaemonBackend

    made = []

    def make(identity, **options):
        options.setdefault("value_bytes", 256 << 10)
        be = DaemonBackend(store.socket_path, identity=identity, **options)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def raw_put():
    def put(backend, key, data):
        backend._call("raw put", lambda c: c.set(backend._region_for(c, len(data)), [key], [data]))

    return put


@pytest.fixture
def restart_iterations():
    # As many rounds as Valkey's (the remote tier's target: at least 50); a daemon restart is a
    # Python start-up, about 0.3 s (both tests together take about 30 s on 2 cores).
    return int(os.environ.get("KVCODEC_DAEMON_RESTARTS", "50"))


@pytest.fixture
def store_args(store, tmp_path):
    """What a child process needs to reach the daemon (level_support.backend_factory)."""
    return {"kind": "daemon", "socket": store.socket_path, "tmp": str(tmp_path)}


class TestDaemonBackend(BackendContract):
    pass


class TestDaemonManagerLevel(ManagerLevelContract):
    pass


def test_pages_never_cross_the_socket(store, make_backend, blobs):
    be = make_backend(IDENTITY)
    keys = [content_key(b) for b in blobs]
    before = be._client.socket_bytes
    assert be.put_batch(keys, blobs) == [Status.OK] * len(keys)
    outs = out_buffers([len(b) for b in blobs])
    assert be.get_batch(keys, outs) == [len(b) for b in blobs]
    assert all(np.array_equal(o, b) for o, b in zip(outs, blobs))
    moved = 2 * sum(len(b) for b in blobs)
    assert be._client.socket_bytes - before < moved / 100, (be._client.socket_bytes - before, moved)


def test_a_reader_before_any_writer_misses_and_creates_nothing(store, make_backend):
    from kvcodec_sdk.daemon import DaemonClient
    from kvcodec_sdk.remote.daemon import DaemonBackend

    reader = DaemonBackend(store.socket_path, IDENTITY)  # value_bytes learnt from the writer's region
    try:
        assert reader.exists_batch([b"k"]) == [False]
        assert reader.get_batch([b"k"], out_buffers([64])) == [-1]
        with DaemonClient(store.socket_path) as c:
            assert c.stats()["regions"] == 0
        writer = make_backend(IDENTITY, value_bytes=None)
        blob = np.arange(5000, dtype=np.uint16).view(np.uint8)
        writer.put_batch([b"k"], [blob])
        out = out_buffers([blob.nbytes])
        assert reader.get_batch([b"k"], out) == [blob.nbytes] and np.array_equal(out[0], blob)
        assert reader.value_bytes == writer.value_bytes == 12288
    finally:
        reader.close()


def test_a_region_of_pinned_slots_is_full(store, make_backend):
    be = make_backend(IDENTITY, value_bytes=8192, slots=2)
    from kvcodec_sdk.daemon import DaemonClient

    blobs = [np.full(1000, i, np.uint8) for i in range(3)]
    keys = [content_key(b) for b in blobs]
    assert be.put_batch(keys[:2], blobs[:2]) == [Status.OK] * 2
    with DaemonClient(store.socket_path) as reader:  # holds both slots
        region = reader.find_region("kvcodec-remote-values")
        found = reader.lookup(region, keys[:2])
        assert found.found.all()
        with pytest.raises(RemoteFull) as info:
            be.put_batch(keys[2:], blobs[2:])
        assert info.value.statuses == [Status.FULL]
        reader.release(region, found)


def test_two_managers_share_pages_through_the_daemon(store):
    """What one manager evicted, another finds and onboards byte-exact, and the daemon's sockets
    carried a small fraction of the page bytes (keys and slot references only)."""
    from test_kvcm_support import config, hot_bytes, write_random

    from kvcodec_sdk import KVCacheManager, RemoteTierConfig
    from kvcodec_sdk.daemon import DaemonClient
    from kvcodec_sdk.remote.daemon import DaemonBackend

    def manager():
        factory = lambda identity: DaemonBackend(store.socket_path, identity)  # noqa: E731
        return KVCacheManager(config([group([0, 1], [4096, 4096])], remote=RemoteTierConfig(factory, max_pages=64),
                                     gpu_quota=1 << 20))

    writer, reader = manager(), manager()
    try:
        pages = writer.allocate(0, 8)
        model = write_random(writer, pages, np.random.default_rng(12))
        keys = keys_for("shared", 8)
        writer.set_keys(pages, keys)
        writer.evict(pages, level=CacheLevel.REMOTE)
        found = reader.find_remote(keys)
        assert all(f is not None for f in found)
        assert reader.onboard(found, source=CacheLevel.REMOTE).moved == 8
        assert all(np.array_equal(hot_bytes(reader, f), model[p.id]) for f, p in zip(found, pages))
        with DaemonClient(store.socket_path) as c:
            st = c.stats()
        assert st["sets"] == 8 and st["hits"] >= 8
        assert st["socket_bytes_in"] + st["socket_bytes_out"] < (st["set_bytes"] + st["hit_bytes"]) / 10, st
    finally:
        writer.close()
        reader.close()


EXIT_WITHOUT_CLOSE = """
import sys
import kvcodec_sdk as kv
from kvcodec_sdk.remote.daemon import DaemonBackend
groups = [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=4096), kv.BufferDesc(0, kv.Role.VALUE, bytes=4096)])]
remote = kv.RemoteTierConfig(lambda identity: DaemonBackend(sys.argv[1], identity))
m = kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=1 << 20, host_quota=1 << 20, remote=remote))
pages = m.allocate(0, 4)
m.set_keys(pages, [b"exit-%d" % i for i in range(4)])
m.evict(pages, level=kv.CacheLevel.REMOTE)
print("evicted")
"""


def test_a_process_that_never_closes_its_manager_exits_cleanly(store):
    # The remote level's worker thread is stopped at exit; ended by the interpreter's finalization
    # instead, it aborted the process (SIGABRT).
    r = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, store.socket_path], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == "evicted", (r.returncode, r.stdout, r.stderr)
