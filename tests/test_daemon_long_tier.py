"""The cache daemon's long tier: pages written back below L2 in the background, read back into L2
when a lookup misses, kept across a daemon killed with SIGKILL and restarted.

Every test runs real daemons (threads of this process, or `kvcodec daemon` processes for the
restarts) and checks page bytes byte for byte.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from sdk_helpers import wait_for_stats

import kvcodec_sdk as kv
from kvcodec_sdk.daemon import Daemon, DaemonClient, DaemonConfig
from kvcodec_sdk.daemon.server import start_warnings

PAGE = 48 << 10  # 48 KiB pages: 12 of them per MiB of region


def pages(n, seed):
    rng = np.random.default_rng(seed)
    # KV-like: a smooth signal plus noise, as fp16 bytes.
    return [(np.sin(np.linspace(0, 9, PAGE // 2) + i) + 0.05 * rng.standard_normal(PAGE // 2)).astype(np.float16)
            .view(np.uint8) for i in range(n)]


def keys(prefix, n):
    return [f"{prefix}/{i}".encode() for i in range(n)]


def read_back(client, region, names):
    outs = [np.zeros(PAGE, np.uint8) for _ in names]
    return client.get_into(region, names, outs), outs


@pytest.fixture
def tiered(tmp_path):
    made = []

    def make(l2=8 << 20, **kw):
        d = Daemon(DaemonConfig(str(tmp_path / f"kvd{len(made)}.sock"), l2, hugepages=False,
                                long_tier=str(tmp_path / "long"), **kw)).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def test_pages_are_written_back_and_l2_evictions_are_read_back_from_the_long_tier(tiered):
    d = tiered()
    data = pages(40, 1)
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/evict", PAGE, 16)  # L2 holds 16 of the 40 pages
        for i in range(0, 40, 8):  # in batches, letting write-backs unpin their slots
            assert all(c.set(region, keys("e", 40)[i:i + 8], data[i:i + 8]))
            wait_for_stats(c.stats, lambda s: s["write_back_queue_bytes"] == 0)
        s = wait_for_stats(c.stats, lambda s: s["write_backs"] == 40)
        assert s["write_backs"] == 40 and s["write_backs_failed"] == 0 and s["evictions"] >= 24
        for i in range(0, 40, 8):  # a lookup pins its hits: at most what L2 holds at once
            ok, outs = read_back(c, region, keys("e", 40)[i:i + 8])
            assert all(ok)
            assert all(np.array_equal(o, x) for o, x in zip(outs, data[i:i + 8]))
        s = c.stats()
        assert s["promotions"] >= 24 and s["long_hits"] >= 24 and s["long_corrupt"] == 0
        assert s["gets"] == 40 and s["hits"] == 40 and s["misses"] == 0  # a promoted lookup counts as one hit
        assert s["sets"] == 40  # a page read back is not a client's set
        assert s["slots_pinned"] == 0


def test_ephemeral_pages_are_not_written_back(tiered):
    d = tiered()
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/eph", PAGE, 16)
        assert all(c.set(region, keys("x", 4), pages(4, 2), ephemeral=True))
        assert all(c.set(region, keys("y", 2), pages(2, 3)))
        s = wait_for_stats(c.stats, lambda s: s["write_backs"] == 2)
        assert s["write_backs"] == 2 and s["write_backs_queued"] == 2
    assert sorted(os.listdir(d.config.long_tier)) and sum(len(f) for _, _, f in os.walk(d.config.long_tier)) == 2


def test_a_damaged_or_foreign_page_file_is_a_miss_never_served(tiered):
    d = tiered()
    data = pages(3, 4)
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/bad", PAGE, 16)
        assert all(c.set(region, keys("b", 3), data))
        wait_for_stats(c.stats, lambda s: s["write_backs"] == 3)
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d.config.long_tier) for f in fs)
        assert len(files) == 3
        c.erase(region, keys("b", 3))  # from L2 and from the long tier
        assert not [f for _, _, fs in os.walk(d.config.long_tier) for f in fs]
        # Written again, then the files damaged behind the daemon's back: one flipped byte, one cut short.
        assert all(c.set(region, keys("b", 3), data))
        wait_for_stats(c.stats, lambda s: s["write_backs"] == 6)
    d.stop()
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d.config.long_tier) for f in fs)
    with open(files[0], "r+b") as f:
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    with open(files[1], "r+b") as f:
        f.truncate(os.path.getsize(files[1]) - 10)
    d2 = tiered()  # the same long tier, an empty L2
    with DaemonClient(d2.config.socket_path) as c:
        region = c.region("lt/bad", PAGE, 16)
        ok, outs = read_back(c, region, keys("b", 3))
        assert sum(ok) == 1
        assert all(np.array_equal(o, x) for o, x, k in zip(outs, data, ok) if k)
        s = c.stats()
        assert s["long_corrupt"] == 2 and s["promotions"] == 1
        # Another region (another codec identity) never sees these pages.
        other = c.region("lt/other", PAGE, 16)
        assert c.get(other, keys("b", 3)) == [None, None, None]


def onboarded(m, found):
    """Onboards pages a manager found and returns their bytes (K and V of each page joined)."""
    assert all(f is not None for f in found)
    assert m.onboard(found).moved == len(found)
    return [np.concatenate([v.copy() for v in m.page_view(f, framework="numpy")]) for f in found]


def long_files(d):
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(d.config.long_tier) for f in fs)


def test_prefetch_reads_long_tier_pages_into_l2_before_a_lookup_asks(tiered):
    d = tiered()
    data = pages(24, 8)
    names = keys("p", 24)
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/prefetch", PAGE, 16)
        for i in range(0, 24, 8):
            assert all(c.set(region, names[i:i + 8], data[i:i + 8]))
            wait_for_stats(c.stats, lambda s: s["write_back_queue_bytes"] == 0)
        wait_for_stats(c.stats, lambda s: s["write_backs"] == 24)
        # The last 16 are in L2; the first 8 only in the long tier. Unknown keys and keys already in
        # L2 are not queued.
        assert c.prefetch(region, names[:8] + names[20:] + [b"absent"]) == 8
        s = wait_for_stats(c.stats, lambda s: s["prefetched"] == 8)
        assert s["prefetched"] == 8 and s["prefetch_keys"] == 8 and s["prefetch_dropped"] == 0
        parked = s["lookups_parked"]
        ok, outs = read_back(c, region, names[:8])  # L2 hits: no lookup waits for the long tier
        assert all(ok) and all(np.array_equal(o, x) for o, x in zip(outs, data[:8]))
        s = c.stats()
        assert s["lookups_parked"] == parked and s["promotions"] == 8 and s["slots_pinned"] == 0
        assert c.prefetch(region, names[:8]) == 0  # in L2 now
        other = c.region("lt/prefetch-other", PAGE, 4)
        assert c.prefetch(other, names) == 0  # another identity has no pages there
    d2 = Daemon(DaemonConfig(d.config.socket_path + "2", 8 << 20, hugepages=False)).start()
    try:
        with DaemonClient(d2.config.socket_path) as c:
            assert c.prefetch(c.region("lt/none", PAGE, 4), names) == 0  # no long tier
    finally:
        d2.stop()


def test_a_manager_prefetches_pages_of_the_long_tier_into_l2_before_it_finds_them(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    d = Daemon(DaemonConfig(sock, 8 << 20, hugepages=False, long_tier=str(tmp_path / "long"))).start()

    def manager():
        groups = [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=PAGE // 2),
                                       kv.BufferDesc(0, kv.Role.VALUE, bytes=PAGE // 2)])]
        return kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=16 * PAGE, host_quota=8 * PAGE, device="cpu",
                                                  shared=kv.SharedTierConfig(sock, region_slots=24)),
                                 cold_page_codec="concat")

    a = manager()
    b = None
    try:
        pages_a = a.allocate(0, 6)
        data = pages(6, 10)
        for p, x in zip(pages_a, data):
            [view] = a.page_view(p, framework="numpy")  # K and V side by side in one pool
            view[:] = x
        names = keys("mp", 6)
        a.set_keys(pages_a, names)
        a.evict(pages_a)
        with DaemonClient(sock) as c:
            wait_for_stats(c.stats, lambda s: s["write_backs"] == 6)
        a.close()
        d.stop()
        d = Daemon(DaemonConfig(sock, 8 << 20, hugepages=False, long_tier=str(tmp_path / "long"))).start()  # L2 empty
        b = manager()
        assert b.prefetch_shared(names + [b"absent"]) == 6
        with DaemonClient(sock) as c:
            s = wait_for_stats(c.stats, lambda s: s["prefetched"] == 6)
            assert s["prefetched"] == 6
            parked = s["lookups_parked"]
        got = onboarded(b, b.find_shared(names))
        assert all(np.array_equal(x, y) for x, y in zip(got, data))
        with DaemonClient(sock) as c:
            assert c.stats()["lookups_parked"] == parked  # found in L2: no lookup waited for a file
        with pytest.raises(ValueError, match="lifecycle is 3"):
            b.prefetch_shared(names, lifecycle=3)
    finally:
        a.close()  # idempotent
        if b is not None:
            b.close()
        d.stop()


def test_a_lookup_waiting_for_the_long_tier_holds_up_no_other_client(tiered):
    """A page file replaced by a FIFO blocks its read until someone writes to it: the lookup that
    asked for it waits, the daemon goes on answering another client, and the bytes written into the
    FIFO (not a page file) are a miss, never served."""
    d = tiered()
    data = pages(17, 9)
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/slow", PAGE, 16)
        assert all(c.set(region, [b"slow"], data[:1]))
        s = wait_for_stats(c.stats, lambda s: s["write_backs"] == 1)
        assert s["slots_pinned"] == 0  # a write-back is counted once its pin is released
        assert all(c.set(region, keys("o", 16), data[1:], ephemeral=True))  # evicts "slow" from L2
        [path] = long_files(d)
        os.unlink(path)
        os.mkfifo(path)
        answer = {}
        waiter = threading.Thread(target=lambda: answer.update(got=read_back(c, region, [b"slow"])))
        waiter.start()
        try:
            with DaemonClient(d.config.socket_path) as other:
                s = wait_for_stats(other.stats, lambda s: s["lookups_parked"] == 1)
                assert s["lookups_parked"] == 1
                ok, outs = read_back(other, region, keys("o", 16)[8:])
                assert all(ok) and all(np.array_equal(o, x) for o, x in zip(outs, data[9:]))
                assert all(other.set(region, [b"new"], data[:1], ephemeral=True))
                assert waiter.is_alive()  # still waiting on its file
        finally:
            deadline = time.monotonic() + 10
            while True:  # once the daemon's reader has the FIFO open (ENXIO until then)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            os.write(fd, b"not a page file")
            os.close(fd)
            waiter.join(10)
        assert not waiter.is_alive()
        ok, outs = answer["got"]
        assert ok == [False]
        s = c.stats()
        assert s["long_corrupt"] == 1 and s["promotions"] == 0 and s["slots_pinned"] == 0


def test_a_daemon_killed_with_sigkill_restarts_and_serves_the_long_tier(tmp_path):
    sock, long_dir = str(tmp_path / "kvd.sock"), str(tmp_path / "long")

    def start():
        p = subprocess.Popen([sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", sock, "--l2-bytes", "16M",
                              "--no-hugepages", "--long-tier", long_dir], stderr=subprocess.PIPE, text=True)
        line = p.stderr.readline()
        assert "serving" in line and "long tier" in line, line
        return p

    data = pages(12, 5)
    p = start()
    try:
        with DaemonClient(sock) as c:
            region = c.region("lt/kill", PAGE, 32)
            assert all(c.set(region, keys("k", 12), data))
            wait_for_stats(c.stats, lambda s: s["write_backs"] == 12)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        p = start()
        with DaemonClient(sock) as c:
            region = c.region("lt/kill", PAGE, 32)
            assert c.stats()["slots_stored"] == 0  # L2 is gone with the process
            ok, outs = read_back(c, region, keys("k", 12) + [b"absent"])
            assert ok == [True] * 12 + [False]
            assert all(np.array_equal(o, x) for o, x in zip(outs, data))
            s = c.stats()
            assert s["promotions"] == 12 and s["long_misses"] == 1 and s["write_backs"] == 0
    finally:
        p.kill()
        p.wait(10)


def test_a_full_write_back_queue_drops_write_backs_not_pages(tiered):
    d = tiered(long_tier_queue_bytes=1 << 20)  # room for 21 pages waiting
    data = pages(64, 6)
    with DaemonClient(d.config.socket_path) as c:
        region = c.region("lt/full", PAGE, 128)
        assert all(c.set(region, keys("f", 64), data))  # one batch: the writer cannot keep up with all of it
        s = wait_for_stats(c.stats, lambda s: s["write_backs"] + s["write_backs_dropped"] == 64)
        assert s["write_backs"] + s["write_backs_dropped"] == 64 and s["write_backs"] >= 21
        ok, outs = read_back(c, region, keys("f", 64))  # every page still in L2
        assert all(ok) and all(np.array_equal(o, x) for o, x in zip(outs, data))


def test_long_tier_configuration_and_start_warnings(tmp_path):
    with pytest.raises(ValueError, match="long_tier is ''"):
        DaemonConfig(str(tmp_path / "s"), long_tier="").validate()
    with pytest.raises(ValueError, match="long_tier_queue_bytes is 5"):
        DaemonConfig(str(tmp_path / "s"), long_tier=str(tmp_path), long_tier_queue_bytes=5).validate()
    (tmp_path / "f").write_text("")
    with pytest.raises(RuntimeError, match="cannot be created"):
        Daemon(DaemonConfig(str(tmp_path / "s"), 4 << 20, hugepages=False, long_tier=str(tmp_path / "f" / "x")))
    cfg = DaemonConfig(str(tmp_path / "s"), 8 << 30, hugepages=False, long_tier="/mnt/kv/long")
    mounts = ("server:/export /mnt/kv nfs4 rw,relatime,vers=4.2,rsize=65536,wsize=65536,hard 0 0\n"
              "/dev/sda1 / ext4 rw 0 0\n")
    warnings = start_warnings(cfg, False, {"MemTotal": 64 << 30, "MemAvailable": 32 << 30},
                              long_tier_free=4 << 30, mounts=mounts)
    assert any("4.0 GiB free, less than the L2 arena (8.0 GiB)" in w for w in warnings)
    assert any("wsize=65536" in w and "mount -o remount,wsize=1048576,rsize=1048576 /mnt/kv" in w for w in warnings)
    fine = start_warnings(cfg, False, {"MemTotal": 64 << 30, "MemAvailable": 32 << 30}, long_tier_free=100 << 30,
                          mounts=mounts.replace("wsize=65536", "wsize=1048576"))
    assert fine == []


def test_pages_a_manager_published_outlive_the_daemon_and_a_new_manager_onboards_them(tmp_path):
    import kvcodec_sdk as kv

    sock, long_dir = str(tmp_path / "kvd.sock"), str(tmp_path / "long")
    half = 3000

    def start():
        p = subprocess.Popen([sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", sock, "--l2-bytes", "16M",
                              "--no-hugepages", "--long-tier", long_dir], stderr=subprocess.PIPE, text=True)
        assert "serving" in p.stderr.readline()
        return p

    def manager():
        groups = [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=half),
                                       kv.BufferDesc(0, kv.Role.VALUE, bytes=half)])]
        return kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=32 * 2 * half, host_quota=16 * 2 * half,
                                                  device="cpu", shared=kv.SharedTierConfig(sock, region_slots=256)),
                                 cold_page_codec="concat")

    names = keys("m", 8)
    p = start()
    try:
        a = manager()
        pages_a = a.allocate(0, 8)
        rng = np.random.default_rng(7)
        expected = []
        for page in pages_a:
            views = a.page_view(page, framework="numpy")
            for v in views:
                v[:] = (np.sin(np.linspace(0, 5, v.size // 2)) + 0.05 * rng.standard_normal(v.size // 2)).astype(
                    np.float16).view(np.uint8)
            expected.append(np.concatenate([v.copy() for v in views]))
        a.set_keys(pages_a, names)
        a.evict(pages_a)
        assert a.shared_stats()["published"] == 8
        with DaemonClient(sock) as c:
            wait_for_stats(c.stats, lambda s: s["write_backs"] == 8)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        a.close()
        p = start()
        b = manager()
        try:
            got = onboarded(b, b.find_shared(names))
            assert len(got) == 8 and all(np.array_equal(x, y) for x, y in zip(got, expected))
            with DaemonClient(sock) as c:
                assert c.stats()["promotions"] == 8
        finally:
            b.close()
    finally:
        p.kill()
        p.wait(10)
