"""The per-host cache daemon: L2 shared between processes, leases, versions, clients that die.

Every test runs a real daemon (in this process, on its own thread, or as ``kvcodec daemon``) and
real clients, some in other processes; nothing of the protocol is imitated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from kvcodec_sdk.daemon import (
    Daemon,
    DaemonClient,
    DaemonConfig,
    DaemonError,
    DaemonUnavailable,
    RegionHandle,
    RegionLayout,
)
from kvcodec_sdk.daemon.protocol import MAX_FRAME, MISS

PAGE = 64 << 10
IDENTITY = "concat/1/00112233aabbccdd"


@pytest.fixture
def client(daemon):
    with DaemonClient(daemon.config.socket_path) as c:
        yield c


def pages(n, seed=0, size=PAGE):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


def keys(prefix, n):
    return [f"{prefix}/{i}".encode() for i in range(n)]


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the daemon")
        time.sleep(0.01)


def test_set_then_get_is_byte_exact_and_read_in_place(client):
    region = client.region(IDENTITY, PAGE, 32)
    data = pages(8, 1)
    assert client.set(region, keys("a", 8), data) == [True] * 8
    outs = [np.zeros(PAGE, np.uint8) for _ in range(8)]
    assert client.get_into(region, [*keys("a", 8)], outs) == [True] * 8
    assert all(np.array_equal(o, d) for o, d in zip(outs, data))
    hits = client.get(region, [b"a/3", b"missing"])
    assert hits[1] is None and client.valid(region, b"a/3", hits[0])
    assert bytes(hits[0].data) == data[3].tobytes()  # a view of the arena, no copy
    client.release(region, hits)
    st = client.stats()
    assert st["sets"] == 8 and st["hits"] == 9 and st["misses"] == 1 and st["slots_pinned"] == 0


def test_a_batch_lookup_answers_arrays_and_releases_every_pin(client):
    region = client.region(IDENTITY, PAGE, 16)
    data = pages(4, 13)
    assert client.set(region, keys("l", 4), data) == [True] * 4
    found = client.lookup(region, [b"l/2", b"none", b"l/0"])
    assert found.found.tolist() == [True, False, True]
    assert found.slots[1] == MISS and found.lengths.tolist()[0] == PAGE
    assert client.stats()["slots_pinned"] == 2
    client.release(region, found)  # the miss is skipped
    wait_for(lambda: client.stats()["slots_pinned"] == 0)
    view = client.slot_view(region, int(found.slots[0]), PAGE)
    assert bytes(view) == data[2].tobytes()


def test_frames_that_break_the_protocol_cost_only_their_own_connection(daemon, client):
    region = client.region(IDENTITY, PAGE, 8)
    assert all(client.set(region, [b"g/0"], pages(1, 14)))
    for frame in (struct.pack("<I", MAX_FRAME + 1), struct.pack("<I", 0)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as rogue:
            rogue.settimeout(10)
            rogue.connect(daemon.config.socket_path)
            rogue.sendall(frame + b"x" * 64)
            assert rogue.recv(16) == b""  # dropped by the daemon
    assert client.get_into(region, [b"g/0"], [np.zeros(PAGE, np.uint8)]) == [True]


READER = """
import sys, numpy as np
from kvcodec_sdk.daemon import DaemonClient
sock, n, page, identity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with DaemonClient(sock) as c:
    region = c.region(identity, page, 32)
    outs = [np.zeros(page, np.uint8) for _ in range(n)]
    ok = c.get_into(region, [f"x/{i}".encode() for i in range(n)], outs)
    np.save(sys.argv[5], np.stack(outs))
    print(sum(ok), c.socket_bytes)
"""


def test_another_process_reads_the_pages_with_no_page_bytes_on_the_socket(daemon, client, tmp_path):
    region = client.region(IDENTITY, PAGE, 32)
    data = pages(16, 2)
    assert all(client.set(region, keys("x", 16), data))
    out = tmp_path / "read.npy"
    r = subprocess.run([sys.executable, "-c", READER, daemon.config.socket_path, "16", str(PAGE), IDENTITY, str(out)],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    found, reader_socket_bytes = map(int, r.stdout.split())
    assert found == 16
    assert np.array_equal(np.load(out), np.stack(data))
    moved = 2 * 16 * PAGE  # what set and get would have carried inline
    total = daemon.stats()["socket_bytes_in"] + daemon.stats()["socket_bytes_out"]
    assert reader_socket_bytes < 4096 and total < moved / 100, (reader_socket_bytes, total)


def test_a_full_region_evicts_the_least_recently_used_unpinned_pages(client):
    region = client.region(IDENTITY, PAGE, 4)
    n = region.layout.slots
    assert all(client.set(region, keys("e", n), pages(n, 3)))
    pinned = client.get(region, [b"e/0"])  # most recently used and pinned
    assert client.set(region, [b"new"], pages(1, 4)) == [True]
    st = client.stats()
    assert st["evictions"] == 1
    assert client.get_into(region, [b"e/1"], [np.zeros(PAGE, np.uint8)]) == [False]  # the oldest unpinned went
    assert client.get_into(region, [b"e/0"], [np.zeros(PAGE, np.uint8)]) == [True]
    client.release(region, pinned)


def test_a_pinned_slot_is_never_reused_and_a_reused_one_is_detected(client):
    region = client.region(IDENTITY, PAGE, 2)
    assert all(client.set(region, [b"p/0", b"p/1"], pages(2, 5)))
    (hit,) = client.get(region, [b"p/0"])
    # Every other slot is pinned or taken: a replacement of p/0 cannot reuse its slot while pinned.
    assert client.set(region, [b"p/0"], pages(1, 6)) == [True]
    assert client.valid(region, b"p/0", hit)  # the old bytes stay readable until released
    client.release(region, [hit])
    wait_for(lambda: client.stats()["slots_pinned"] == 0)
    assert client.set(region, [b"q/0"], pages(1, 7)) == [True]  # may now reuse the old slot
    assert not client.valid(region, b"p/0", hit)  # the stale reference is detected, never served


def test_bytes_written_outside_a_lease_fail_the_checksum(client, daemon):
    region = client.region(IDENTITY, PAGE, 8)
    assert all(client.set(region, [b"c/0"], pages(1, 8)))
    (hit,) = client.get(region, [b"c/0"])
    client.release(region, [hit])
    # A misbehaving client scribbles over another's slot in its own mapping of the arena.
    with DaemonClient(daemon.config.socket_path) as rogue:
        rogue.slot_view(region, hit.slot)[:8] = b"garbage!"
    assert client.get_into(region, [b"c/0"], [np.zeros(PAGE, np.uint8)]) == [False]


HOLDER = """
import sys, time
from kvcodec_sdk.daemon import DaemonClient
c = DaemonClient(sys.argv[1])
region = c.region(sys.argv[2], int(sys.argv[3]), 32)
hits = c.get(region, [b"k/0", b"k/1"])
slots = c.lease(region, 3)  # leases it will never commit
print("held", flush=True)
time.sleep(600)
"""


def test_a_client_killed_holding_pins_and_leases_leaks_no_slot(daemon, client):
    region = client.region(IDENTITY, PAGE, 32)
    data = pages(2, 9)
    assert all(client.set(region, keys("k", 2), data))
    free_before = client.stats()["slots_free"]
    p = subprocess.Popen([sys.executable, "-c", HOLDER, daemon.config.socket_path, IDENTITY, str(PAGE)],
                         stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert p.stdout.readline().strip() == "held"
        st = client.stats()
        assert st["slots_pinned"] == 2 and st["slots_leased"] == 3
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
    wait_for(lambda: client.stats()["clients"] == 1)
    st = client.stats()
    assert st["slots_pinned"] == 0 and st["slots_leased"] == 0 and st["slots_free"] == free_before
    assert st["reclaimed_pins"] == 2 and st["reclaimed_leases"] == 3
    outs = [np.zeros(PAGE, np.uint8) for _ in range(2)]
    assert client.get_into(region, keys("k", 2), outs) == [True, True]  # the stored pages are intact
    assert all(np.array_equal(o, d) for o, d in zip(outs, data))


def test_a_daemon_restart_loses_l2_and_clients_reconnect(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    d = Daemon(DaemonConfig(sock, 8 << 20, hugepages=False)).start()
    c = DaemonClient(sock)
    region = c.region(IDENTITY, PAGE, 8)
    assert all(c.set(region, [b"r/0"], pages(1, 10)))
    d.stop()
    with pytest.raises(DaemonUnavailable):
        c.stats()
    with pytest.raises(DaemonUnavailable, match="no daemon answers"):
        c.reconnect()
    d = Daemon(DaemonConfig(sock, 8 << 20, hugepages=False)).start()
    try:
        c.reconnect()
        region = c.region(IDENTITY, PAGE, 8)
        assert c.get_into(region, [b"r/0"], [np.zeros(PAGE, np.uint8)]) == [False]  # L2 is lost by design
        assert all(c.set(region, [b"r/0"], pages(1, 11)))
    finally:
        c.close()
        d.stop()


def test_refusals_name_what_is_wrong(client, daemon, tmp_path):
    region = client.region(IDENTITY, PAGE, 8)
    with pytest.raises(ValueError, match=r"pages\[0\] has 65537 bytes"):
        client.set(region, [b"big"], [np.zeros(PAGE + 1, np.uint8)])
    layout = region.layout
    elsewhere = RegionHandle(IDENTITY, RegionLayout(7, layout.table, layout.data, layout.stride, layout.slots,
                                                    layout.page_bytes))
    with pytest.raises(DaemonError, match="region 7 does not exist"):
        client.lookup(elsewhere, [b"k"])
    reply = client.raw_call(bytes([99]))  # an op this protocol does not have
    assert reply[0] == 1 and b"unknown op 99" in reply
    assert client.raw_call(bytes([6]) + (0).to_bytes(4, "little"))[0] == 1  # a get cut short is refused
    assert client.stats()["requests_refused"] >= 2  # and the connection still serves
    with pytest.raises(DaemonError, match="not enough for one slot"):
        client.region("other/1/0", 64 << 20, 4)
    assert client.commit(region, [0], [b"k"], [1]) == [1]  # not this client's lease
    with pytest.raises(DaemonUnavailable, match="no daemon answers"):
        DaemonClient(str(tmp_path / "none.sock"))
    with pytest.raises(ValueError, match="l2_bytes"):
        DaemonConfig(str(tmp_path / "x.sock"), 1024).validate()


WORKER = """
import sys, time, numpy as np
from kvcodec_sdk.daemon import DaemonClient
sock, identity, page, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
def content(key):  # every writer of a key writes the same bytes, so any hit can be checked
    return np.random.default_rng(abs(hash(key)) % (1 << 32)).integers(0, 256, page, dtype=np.uint8)
wrong = hits = 0
with DaemonClient(sock) as c:
    region = c.region(identity, page, 24)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        ks = [b"w/%d" % k for k in rng.integers(0, 64, int(rng.integers(1, 9)))]
        if rng.random() < 0.5:
            c.set(region, ks, [content(k) for k in ks])
        else:
            outs = [np.zeros(page, np.uint8) for _ in ks]
            for k, ok, out in zip(ks, c.get_into(region, ks, outs), outs):
                hits += ok
                wrong += ok and not np.array_equal(out, content(k))
print(wrong, hits)
"""


def test_clients_in_many_processes_never_read_a_wrong_page(daemon, tmp_path):
    # 4 processes set and read 64 keys through a region of 24 slots: constant eviction and reuse.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, daemon.config.socket_path, IDENTITY, str(PAGE // 4),
                               str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/", env=env)
             for i in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(tuple(map(int, out.split())))
    assert sum(w for w, _ in results) == 0
    assert sum(h for _, h in results) > 0
    wait_for(lambda: daemon.stats()["clients"] == 0)  # every connection's end has been handled
    st = daemon.stats()
    assert st["evictions"] > 0 and st["slots_pinned"] == 0 and st["slots_leased"] == 0


def test_kvcodec_daemon_and_statctl(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    p = subprocess.Popen([sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", sock, "--l2-bytes", "8M",
                          "--no-hugepages"], stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert "serving" in p.stderr.readline()
        with DaemonClient(sock) as c:
            region = c.region(IDENTITY, PAGE, 8)
            assert all(c.set(region, [b"s/0"], pages(1, 12)))
            c.get_into(region, [b"s/0"], [np.zeros(PAGE, np.uint8)])
        out = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "statctl", "--socket", sock, "--json"],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert out.returncode == 0, out.stderr
        stats = json.loads(out.stdout)
        assert stats["sets"] == 1 and stats["hits"] == 1 and stats["regions"] == 1
        text = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "statctl", "--socket", sock],
                              capture_output=True, text=True, timeout=30, cwd="/").stdout
        assert "hits" in text and "slots_free" in text
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        assert not os.path.exists(sock)
    finally:
        p.kill()
    gone = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "statctl", "--socket", sock],
                          capture_output=True, text=True, timeout=30, cwd="/")
    assert gone.returncode == 1 and "no daemon answers" in gone.stderr


def test_kvcodec_bench_daemon_reports_round_trips_and_socket_bytes(tmp_path):
    out = tmp_path / "daemon.json"
    r = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "bench", "daemon", "--pages", "16", "--rounds", "20",
                        "--json", str(out)], capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert "lookup round trip p50" in r.stdout
    report = json.loads(out.read_text())
    assert report["rtt_p50_us"] > 0 and report["rtt_p99_us"] >= report["rtt_p50_us"]
    # The lookup's own round trip is part of each round's, so none of its percentiles is above
    assert 0 < report["lookup_p50_us"] <= report["rtt_p50_us"] and report["lookup_p99_us"] <= report["rtt_p99_us"]
    assert "the lookup request alone" in r.stdout
    assert report["daemon"]["sets"] == 16 and report["daemon"]["hits"] >= 16 * 5
    assert report["socket_bytes_per_page"] < report["page_bytes"] / 100  # pages never cross the socket
    manager = report["manager"]  # through the manager: the daemon as its remote and shared host level, and a host tier
    for name in ("daemon", "shared", "shared_found", "shared_found_no_crc"):
        assert manager[name]["onboard_gbps"] > 0 and manager[name]["onboard_vs_host"] > 0
    assert manager["shared_found"]["hit_gbps"] < manager["shared_found"]["onboard_gbps"]  # the lookup costs time
    assert manager["host"]["onboard_gbps"] > 0
    assert "manager onboard, remote level on daemon" in r.stdout and "L2 hit: find + onboard" in r.stdout
    assert report["hugepages"] is False and "arena on ordinary pages" in r.stdout  # without --hugepages
    assert report["codec"] == "concat" and manager["lossless"] is True


def test_kvcodec_bench_daemon_runs_a_lossy_codec_and_refuses_unknown_ones(tmp_path):
    out = tmp_path / "daemon-fp8.json"
    r = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "bench", "daemon", "--pages", "256", "--rounds", "10",
                        "--manager-rounds", "3", "--codec", "fp8", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    # fp8 gives back other bytes than it was given: every page onboarded is checked against what a
    # host tier of its own gave back, and the pages are written again before each round. Its blobs
    # are half a page: each manager leases slots for its pages' blobs (256 pages would overfill the
    # daemon's region with slots for twice as many).
    assert report["codec"] == "fp8" and report["manager"]["lossless"] is False
    assert report["manager"]["shared_found"]["onboard_gbps"] > 0 and "managers with fp8" in r.stdout
    for args, problem in ((["--codec", "nope"], "unknown codec 'nope'"),
                          (["--params", "[1]"], "--params must be a JSON object"),
                          (["--params", "{"], "--params is not valid JSON"),
                          (["--params", '{"path": "x"}'], "valid values are 'auto', 'copy_engine', 'sm'")):
        bad = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "bench", "daemon", *args],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert bad.returncode == 2 and problem in bad.stderr, (args, bad.stderr)


def test_the_documented_metrics_table_is_the_collectors():
    from kvcodec_sdk.daemon.metrics import DAEMON_METRICS

    text = (Path(__file__).resolve().parent.parent / "docs" / "daemon.md").read_text()
    rows = re.findall(r"^\| `(kvcodec_daemon_\w+)` \| ([\w ()]+) \| ([^|]*) \| (.*) \|$", text, re.M)
    documented = [(name, kind, tuple(re.findall(r"`(\w+)`", labels)), help) for name, kind, labels, help in rows]
    assert documented == [(m.name, "gauge (info)" if m.kind == "info" else m.kind, m.labels, m.help)
                          for m in DAEMON_METRICS]


def test_prometheus_scrapes_the_daemon_over_http_and_statctl_prints_the_same(tmp_path):
    pytest.importorskip("prometheus_client", reason="the metrics extra: pip install kvcodec-sdk[metrics]")
    sock = str(tmp_path / "kvd.sock")
    p = subprocess.Popen([sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", sock, "--l2-bytes", "8M",
                          "--no-hugepages", "--metrics-port", "0"], stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        line = p.stderr.readline()
        url = re.search(r"metrics on (http://\S+/metrics)", line)
        assert url, line
        with DaemonClient(sock) as c:
            region = c.region(IDENTITY, PAGE, 8)
            assert all(c.set(region, [b"m/0", b"m/1"], pages(2, 15)))
            assert c.get_into(region, [b"m/0", b"none"], [np.zeros(PAGE, np.uint8)] * 2) == [True, False]
        with urllib.request.urlopen(url.group(1), timeout=10) as response:
            text = response.read().decode()
        label = f'{{daemon="{sock}"}}'
        for line in (f"kvcodec_daemon_up{label} 1.0", f"kvcodec_daemon_sets_total{label} 2.0",
                     f"kvcodec_daemon_hits_total{label} 1.0", f"kvcodec_daemon_misses_total{label} 1.0",
                     f'kvcodec_daemon_slots{{daemon="{sock}",state="stored"}} 2.0'):
            assert line in text, line
        printed = subprocess.run([sys.executable, "-m", "kvcodec_sdk.cli", "statctl", "--socket", sock, "--prometheus"],
                                 capture_output=True, text=True, timeout=30, cwd="/")
        assert printed.returncode == 0, printed.stderr
        assert f"kvcodec_daemon_hits_total{label} 1.0" in printed.stdout
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    from prometheus_client import CollectorRegistry, generate_latest

    from kvcodec_sdk.daemon.metrics import DaemonCollector

    registry = CollectorRegistry()
    registry.register(DaemonCollector(sock))  # the daemon is gone: up 0, and nothing else
    text = generate_latest(registry).decode()
    assert f'kvcodec_daemon_up{{daemon="{sock}"}} 0.0' in text and "kvcodec_daemon_sets_total{" not in text


def test_start_warnings_name_the_sizing_problem_and_the_remedy(tmp_path):
    from kvcodec_sdk.daemon.server import start_warnings

    gib = 1 << 30
    config = DaemonConfig(str(tmp_path / "s.sock"), 8 * gib, hugepages=True)
    assert start_warnings(config, True, {"MemTotal": 64 * gib, "MemAvailable": 32 * gib}) == []
    (over,) = start_warnings(config, True, {"MemTotal": 4 * gib, "MemAvailable": 2 * gib})
    assert "larger than this host's memory (4.0 GiB)" in over and "--l2-bytes" in over
    (busy,) = start_warnings(config, True, {"MemTotal": 64 * gib, "MemAvailable": 6 * gib})
    assert "available now (6.0 GiB)" in busy
    (huge,) = start_warnings(config, False, {"MemTotal": 64 * gib, "MemAvailable": 32 * gib})
    assert "sysctl vm.nr_hugepages=4096" in huge
    assert start_warnings(DaemonConfig(str(tmp_path / "s.sock"), 8 * gib, hugepages=False), False,
                          {"MemTotal": 64 * gib}) == []


def test_a_packed_region_puts_slots_a_page_apart_and_a_pinned_commit_stays_pinned(client):
    odd = 6000  # not a multiple of 4 KiB
    packed = client.region("packed/" + IDENTITY, odd, 8, packed=True)
    assert packed.layout.stride == odd and packed.layout.data_offset(3) == packed.layout.data + 3 * odd
    assert client.region("loose/" + IDENTITY, odd, 8).layout.stride == 8192
    slots = client.lease(packed, 2)
    for s, page in zip(slots.tolist(), pages(2, 3, odd)):
        client.slot_view(packed, s)[:] = page.tobytes()
    assert client.commit(packed, slots, [b"a", b"b"], [odd, odd], pin=True) == [0, 0]
    st = client.stats()
    assert st["slots_pinned"] == 2 and st["slots_stored"] == 2
    # Pinned by its writer: a full region's leases cannot evict it...
    others = client.lease(packed, 8)
    assert len(others) == 6
    client.abort(packed, others)
    hits = client.get(packed, [b"a", b"b"])
    assert [h.slot for h in hits] == slots.tolist()
    client.release(packed, hits)
    # ...until the writer releases its pins like a reader's: then it joins the LRU.
    client.release(packed, [h for h in hits])
    wait_for(lambda: client.stats()["slots_pinned"] == 0)
    assert len(client.lease(packed, 8)) == 8 and client.stats()["evictions"] == 2
