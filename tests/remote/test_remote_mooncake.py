"""The Mooncake Store backend against a real mooncake_master (with its metadata server), per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from level_contract import ManagerLevelContract
from remote_contract import IDENTITY, BackendContract, check_pages, content_key, out_buffers, stop_process

from kvcodec_sdk.remote import RemoteError, RemoteFull, RemoteTimeout, RemoteUnavailable, Status


@pytest.fixture
def store(mooncake_master):
    return mooncake_master


def _backend(master, identity, **options):
    from kvcodec_sdk.remote.mooncake import MooncakeBackend

    return MooncakeBackend(master.address, master.metadata_server, identity=identity, **options)


@pytest.fixture
def make_backend(store):
    made = []

    def make(identity, **options):
        be = _backend(store, identity, **options)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def raw_put():
    def put(backend, key, data):
        assert backend._store.put(backend._key(key), data) == 0

    return put


@pytest.fixture
def restart_iterations():
    # A master takes 1-2 s to start and the client a second to rejoin: fewer rounds than Valkey's.
    return int(os.environ.get("KVCODEC_REMOTE_MOONCAKE_RESTARTS", "6"))


@pytest.fixture
def store_args(store, tmp_path):
    """What a child process needs to reach the master (level_support.backend_factory)."""
    return {"kind": "mooncake", "address": store.address, "metadata_server": store.metadata_server,
            "tmp": str(tmp_path)}


class TestMooncakeBackend(BackendContract):
    """The shared contract, unchanged: Mooncake's semantics ask for no exception."""

    def after_restart(self, backend):
        deadline = time.monotonic() + 10  # the client rejoins a restarted master by itself
        while time.monotonic() < deadline and not backend.healthy():
            time.sleep(0.05)

    def put_when_ready(self, backend, keys, values):
        deadline = time.monotonic() + 10
        while True:  # puts find no segment (-200) until the client has remounted its memory
            try:
                assert backend.put_batch(keys, values) == [Status.OK] * len(keys)
                return
            except RemoteError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class TestMooncakeManagerLevel(ManagerLevelContract):
    """The manager's remote level on Mooncake Store (each manager's client lends the store a
    segment of its own memory, where the pages it puts live while it runs)."""

    timeout_s = 5.0


def _fill(be, rng, batches):
    """Put ``batches`` batches of 4 × 256 KiB: the blobs stored and the number of RemoteFull raised."""
    stored, fulls = [], 0
    for _ in range(batches):
        blobs = [rng.integers(0, 256, 256 << 10, dtype=np.uint8) for _ in range(4)]
        try:
            be.put_batch([content_key(b) for b in blobs], blobs)
            stored += blobs
        except RemoteFull as e:
            assert "no space" in str(e) and Status.FULL in e.statuses
            fulls += 1
            stored += [b for b, st in zip(blobs, e.statuses) if st == Status.OK]
    return stored, fulls


def test_a_full_store_without_eviction_raises_remote_full_and_keeps_what_fit(mooncake_factory):
    master = mooncake_factory(args=["--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0"])
    # 16 MiB is the smallest segment the client mounts; 40 batches of 4 × 256 KiB are 40 MiB.
    be = _backend(master, IDENTITY, global_segment_size=16 << 20, local_buffer_size=16 << 20)
    stored, fulls = _fill(be, np.random.default_rng(3), 40)
    assert fulls > 0 and 10 < len(stored) < 64 and be.stats.put_failures >= 1
    outs = out_buffers([256 << 10] * len(stored))
    assert be.get_batch([content_key(b) for b in stored], outs) == [256 << 10] * len(stored)
    assert all(np.array_equal(o, b) for o, b in zip(outs, stored))
    be.close()


def test_a_full_store_with_eviction_evicts_old_pages_never_wrong_data(store):
    """The master's default: from 90 % full it evicts objects whose lease ended, so old pages become
    misses; a put that still finds no room raises RemoteFull. No read is ever wrong."""
    be = _backend(store, IDENTITY, global_segment_size=16 << 20, local_buffer_size=16 << 20)
    stored, _ = _fill(be, np.random.default_rng(4), 40)
    keys = [content_key(b) for b in stored]
    outs = out_buffers([256 << 10] * len(stored))
    hits, wrong = check_pages(keys, be.get_batch(keys, outs), outs)
    assert wrong == 0 and be.stats.corrupt == 0
    assert 0 < hits < len(stored) and be.stats.misses == len(stored) - hits, (hits, len(stored))
    be.close()


def test_a_batch_larger_than_the_client_local_buffer_goes_through(store):
    """The client's own put_batch refuses a batch larger than its local buffer (-600); the backend's
    puts and gets do not stage through that buffer."""
    be = _backend(store, IDENTITY, local_buffer_size=4 << 20)
    rng = np.random.default_rng(5)
    blobs = [rng.integers(0, 256, 1 << 20, dtype=np.uint8) for _ in range(24)]  # 24 MiB through 4 MiB
    blobs.append(rng.integers(0, 256, 5 << 20, dtype=np.uint8))  # one value larger than the buffer alone
    keys = [content_key(b) for b in blobs]
    assert be.put_batch(keys, blobs) == [Status.OK] * 25
    outs = out_buffers([len(b) for b in blobs])
    assert be.get_batch(keys, outs) == [len(b) for b in blobs]
    assert all(np.array_equal(o, b) for o, b in zip(outs, blobs))
    be.close()


class _CountingStore:
    """The client, with the keys of each ``batch_get_into`` call recorded."""

    def __init__(self, inner):
        self.inner, self.runs = inner, []

    def batch_get_into(self, keys, ptrs, sizes):
        self.runs.append(len(keys))
        return self.inner.batch_get_into(keys, ptrs, sizes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_get_reads_its_batch_in_runs_and_answers_each_key(store):
    """A batch larger than get_run_bytes is read in runs (one batch_get_into each); a miss, a
    buffer too small and hits in different runs are each answered as in one call."""
    from kvcodec_sdk.remote.backend import GET_MISS, GET_TOO_SMALL

    be = _backend(store, IDENTITY)
    be.get_run_bytes = 3 << 20
    rng = np.random.default_rng(11)
    blobs = [rng.integers(0, 256, 1 << 20, dtype=np.uint8) for _ in range(10)]
    keys = [content_key(b) for b in blobs]
    assert be.put_batch(keys[:4] + keys[5:], blobs[:4] + blobs[5:]) == [Status.OK] * 9  # 4 is missing
    sizes = [len(b) for b in blobs]
    sizes[7] = 1000  # too small for its value
    outs = out_buffers(sizes)
    counting = be._store = _CountingStore(be._store)
    got = be.get_batch(keys, outs)
    assert counting.runs == [3, 3, 4]  # runs of at least 3 MiB of staging; 7's is 1000 bytes
    want = [len(b) for b in blobs]
    want[4], want[7] = GET_MISS, GET_TOO_SMALL
    assert got == want
    assert all(np.array_equal(outs[i], blobs[i]) for i in range(10) if want[i] > 0)
    assert (be.stats.hits, be.stats.misses, be.stats.too_small) == (8, 1, 1)
    be._store = counting.inner
    be.close()


def test_a_stalled_master_times_out_and_the_next_call_reads_the_right_reply(store):
    """A stopped master (SIGSTOP) makes a call time out within timeout_s and the next one fail at
    once (the timed-out call still runs); once the master runs again, the late reply is never taken
    for a later call's and the caller's buffers were never written."""
    be = _backend(store, IDENTITY, timeout_s=0.5)
    a, b = np.arange(1000, dtype=np.uint8), np.arange(3000, dtype=np.uint16).view(np.uint8)
    be.put_batch([content_key(a), content_key(b)], [a, b])
    stop_process(store.proc)
    try:
        outs = out_buffers([1000])
        t0 = time.monotonic()
        with pytest.raises(RemoteTimeout, match="no answer within 0.5 s"):
            be.get_batch([content_key(a)], outs)
        with pytest.raises(RemoteUnavailable, match="has not returned yet"):
            be.get_batch([content_key(b)], out_buffers([6000]))
        assert time.monotonic() - t0 < 1.5
    finally:
        store.proc.send_signal(signal.SIGCONT)
    assert be._inflight.done.wait(30), "the timed-out call did not return once the master ran again"
    assert (outs[0] == 0xA5).all()
    got = out_buffers([6000])
    assert be.get_batch([content_key(b)], got) == [6000] and np.array_equal(got[0], b)
    be.close()


def test_a_dead_master_fails_setup_soon(store):
    store.kill()
    t0 = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="setup failed: the master does not answer"):
        _backend(store, IDENTITY, timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0


def test_bad_options_name_the_field(store):
    from kvcodec_sdk.remote.mooncake import MooncakeBackend

    with pytest.raises(ValueError, match="master_address"):
        MooncakeBackend("no-port", store.metadata_server, identity=IDENTITY)
    with pytest.raises(ValueError, match="protocol: 'rdma' is not supported"):
        _backend(store, IDENTITY, protocol="rdma")
    with pytest.raises(ValueError, match="global_segment_size"):
        _backend(store, IDENTITY, global_segment_size=4 << 20)
    with pytest.raises(ValueError, match="local_buffer_size"):
        _backend(store, IDENTITY, local_buffer_size=0)


WRITER = """
import sys, hashlib, numpy as np
sys.path.insert(0, sys.argv[3])
import conftest  # the source tree's remote package where the installed SDK lacks it
conftest._load_mooncake()
from kvcodec_sdk.remote.mooncake import MooncakeBackend
be = MooncakeBackend(sys.argv[1], sys.argv[2], identity="concat/1/0123456789abcdef")
rng = np.random.default_rng(99)
blobs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (100, 4096, 65536, 1 << 20)]
assert be.put_batch([hashlib.sha256(b).digest() for b in blobs], blobs) == [0] * 4
print("stored", flush=True)
sys.stdin.readline()
be.close()
"""


def test_one_process_puts_another_gets(store):
    """Values put by one process (held in its segment) are read by another over TCP."""
    here = Path(__file__).resolve().parent
    writer = subprocess.Popen([sys.executable, "-c", WRITER, store.address, store.metadata_server, str(here)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert writer.stdout.readline().strip() == "stored"
        rng = np.random.default_rng(99)
        blobs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (100, 4096, 65536, 1 << 20)]
        be = _backend(store, IDENTITY)
        outs = out_buffers([len(b) for b in blobs])
        assert be.get_batch([content_key(b) for b in blobs], outs) == [len(b) for b in blobs]
        assert all(np.array_equal(o, b) for o, b in zip(outs, blobs))
        be.close()
    finally:
        writer.communicate("done\n", timeout=30)
    assert writer.returncode == 0


def test_bench_remote_on_mooncake_against_the_client(store, tmp_path):
    """``kvcodec bench remote --backend mooncake`` on a running master: both directions through the
    manager, every page checked, against the client's own put_batch/get_batch."""
    import json

    out = tmp_path / "remote.json"
    r = subprocess.run([sys.executable, "-m", "kvcodec_sdk", "bench", "remote", "--backend", "mooncake", "--mooncake",
                        f"{store.address},{store.metadata_server}", "--device", "cpu", "--codecs", "concat",
                        "--bytes", "4M", "--batch", "8", "--repeat", "1", "--layers", "2", "--json", str(out),
                        "--quiet"], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["backend"] == "mooncake"
    assert [(row["direction"], row["verified"]) for row in data["rows"]] == [("put", "byte-exact"),
                                                                             ("get", "byte-exact")]
    assert all(row["client_gbps"] > 0 and row["wire_gbps"] > 0 for row in data["rows"])
