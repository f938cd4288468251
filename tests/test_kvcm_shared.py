"""The shared host level: the manager's host tier in the per-host cache daemon's arena.

Every test runs a real daemon and real managers (some in other processes); pages are KV-like
random bytes, checked byte for byte after they crossed from one manager to another.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk.daemon import Daemon, DaemonClient, DaemonConfig

# 6000-byte pages: not a multiple of 4 KiB, so the packed region's layout is what codecs address.
BUF = 3000
PAGE = 2 * BUF
HOST_PAGES = 16
SPARES = 8  # leases a manager keeps beyond its quota to replace given-up slots at once (at least 8)


def layer_groups():
    return [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=BUF), kv.BufferDesc(0, kv.Role.VALUE, bytes=BUF)])]


def config(socket_path, **shared):
    shared.setdefault("region_slots", 256)  # room for a few managers' shares and the pages kept for others
    return kv.KVCacheConfig(layer_groups(), gpu_quota=64 * PAGE, host_quota=HOST_PAGES * PAGE, device="cpu",
                            shared=kv.SharedTierConfig(socket_path, **shared))


@pytest.fixture
def managers(daemon):
    made = []

    def make(**shared):
        m = kv.KVCacheManager(config(daemon.config.socket_path, **shared), cold_page_codec="concat")
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def daemon_stats(daemon):
    with DaemonClient(daemon.config.socket_path) as c:
        return c.stats()


def fill(m, pages, seed):
    """Writes KV-like bytes (a smooth signal plus noise, as fp16) into each hot page; returns them."""
    rng = np.random.default_rng(seed)
    out = []
    for p in pages:
        views = m.page_view(p, framework="numpy")
        for v in views:
            base = np.sin(np.linspace(0, 8, v.size // 2)) + 0.05 * rng.standard_normal(v.size // 2)
            v[:] = base.astype(np.float16).view(np.uint8)
        out.append(np.concatenate([v.copy() for v in views]))
    return out


def contents(m, pages):
    return [np.concatenate([v.copy() for v in m.page_view(p, framework="numpy")]) for p in pages]


def keys(prefix, n):
    return [f"{prefix}/{i}".encode() for i in range(n)]


def test_a_page_one_manager_evicted_is_onboarded_byte_exact_by_another(daemon, managers):
    a, b = managers(), managers()
    pages = a.allocate(0, 8)
    data = fill(a, pages, 1)
    a.set_keys(pages, keys("p", 8))
    a.evict(pages)
    assert a.shared_stats()["published"] == 8
    before = daemon_stats(daemon)
    found = b.find_shared(keys("p", 8) + [b"absent"])
    assert found[-1] is None and all(f is not None for f in found[:8])
    assert [f.level for f in found[:8]] == [kv.CacheLevel.HOST] * 8
    result = b.onboard(found[:8])
    assert result.moved == 8 and len(result.dropped) == 0
    assert all(np.array_equal(x, y) for x, y in zip(contents(b, found[:8]), data))
    # No page byte crossed the socket: the lookup and the reads are slot references only.
    after = daemon_stats(daemon)
    socket = (after["socket_bytes_in"] + after["socket_bytes_out"]) - (before["socket_bytes_in"] + before["socket_bytes_out"])
    assert socket < 8 * PAGE / 10, socket
    st = b.shared_stats()
    assert st["found"] == 8 and st["missed"] == 1 and st["connected"]


def test_pages_decode_in_place_from_the_arena_slot_the_other_manager_wrote(daemon, managers):
    a, b = managers(), managers()
    pages = a.allocate(0, 2)
    fill(a, pages, 2)
    a.set_keys(pages, keys("q", 2))
    a.evict(pages)
    found = b.find_shared(keys("q", 2))
    # Both managers see the page in the same slot of the same region: one copy of the bytes.
    assert [f.slot for f in found] == [p.slot for p in pages]
    assert np.array_equal(a.page_view(pages[0])[0], b.page_view(found[0])[0])


def test_leaving_pages_give_their_slots_back_and_the_quota_is_made_up(daemon, managers):
    a, b = managers(), managers()
    pages = a.allocate(0, 6)
    fill(a, pages, 3)
    a.set_keys(pages, keys("r", 6))
    a.evict(pages)
    found = b.find_shared(keys("r", 6))
    assert daemon_stats(daemon)["slots_pinned"] == 6  # a's publications, b's hits pin the same slots
    b.onboard(found)
    b.synchronize()
    st = b.shared_stats()
    assert st["released"] == 6 and st["leased"] == HOST_PAGES + SPARES  # found pages are replaced by nothing
    a.onboard(pages)
    assert a.slot_counts(kv.CacheLevel.HOST)[0][1] == HOST_PAGES  # spares replaced the given-up slots at once
    a.synchronize()
    st = a.shared_stats()
    assert st["released"] == 6 and st["leased"] == HOST_PAGES + SPARES + 6 and st["short"] == 0
    d = daemon_stats(daemon)
    assert d["slots_pinned"] == 0 and d["slots_stored"] == 6  # kept in L2 for whoever asks next
    assert d["slots_leased"] == 2 * (HOST_PAGES + SPARES)
    # The pages left a's host level but stay findable by a third manager.
    c = managers()
    again = c.find_shared(keys("r", 6))
    assert all(f is not None for f in again)


def published_and_found(a, b, prefix, n, seed):
    """``n`` pages of KV-like bytes that ``a`` evicted under keys and ``b`` found: (data, found)."""
    pages = a.allocate(0, n)
    data = fill(a, pages, seed)
    a.set_keys(pages, keys(prefix, n))
    a.evict(pages)
    return data, b.find_shared(keys(prefix, n))


def region_name(m):
    return kv.SharedTierConfig.region_prefix(kv.KVCacheManager.remote_identity(m.config, "concat")) + "/g0"


def test_close_gives_the_daemon_its_slots_back_while_a_call_handle_is_alive(daemon, managers):
    a = managers()
    pages = a.allocate(0, 4)
    fill(a, pages, 5)
    a.set_keys(pages, keys("h", 4))
    pending = a.evict(pages, blocking=False)  # the handle keeps the manager's core alive
    pending.wait()
    assert daemon_stats(daemon)["slots_leased"] == HOST_PAGES + SPARES
    a.close()
    deadline = time.monotonic() + 10
    while (d := daemon_stats(daemon))["slots_leased"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d["slots_leased"] == 0 and d["slots_pinned"] == 0 and d["slots_stored"] == 4
    assert pending.done()


def test_a_blob_scribbled_over_by_another_process_is_a_miss_never_decoded(daemon, managers):
    a, b = managers(), managers()
    data, found = published_and_found(a, b, "s", 3, 4)
    # A misbehaving process writes into the middle slot through its own mapping of the arena.
    with DaemonClient(daemon.config.socket_path) as rogue:
        region = rogue.find_region(region_name(a))
        rogue.slot_view(region, found[1].slot)[100:108] = b"garbage!"
    result = b.onboard(found)
    assert result.moved == 2 and [p.id for p in result.dropped] == [found[1].id]
    ok = [found[0], found[2]]
    assert all(np.array_equal(x, y) for x, y in zip(contents(b, ok), [data[0], data[2]]))


def test_large_onboards_check_each_chunk_before_decoding_it(tmp_path):
    # 64 pages of 64 KiB: the CPU backend checks the blobs a 1 MiB chunk ahead of the decode, on a
    # helper thread. Scribbled blobs in the first, a middle and the last chunk are each dropped,
    # the others decoded byte for byte.
    half = 32 << 10
    d = Daemon(DaemonConfig(str(tmp_path / "big.sock"), 64 << 20, hugepages=False)).start()
    try:
        groups = [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=half),
                                       kv.BufferDesc(0, kv.Role.VALUE, bytes=half)])]

        def make():
            return kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=64 * 2 * half, host_quota=64 * 2 * half,
                                                      device="cpu",
                                                      shared=kv.SharedTierConfig(d.config.socket_path,
                                                                                 region_slots=400)),
                                     cold_page_codec="concat")

        a, b = make(), make()
        try:
            pages = a.allocate(0, 64)
            data = fill(a, pages, 21)
            a.set_keys(pages, keys("big", 64))
            a.evict(pages)
            found = b.find_shared(keys("big", 64))
            bad = [0, 37, 63]
            with DaemonClient(d.config.socket_path) as rogue:
                region = rogue.find_region(region_name(a))
                for i in bad:
                    rogue.slot_view(region, found[i].slot)[5000:5008] = b"garbage!"
            result = b.onboard(found)
            assert result.moved == 61 and sorted(p.id for p in result.dropped) == sorted(found[i].id for i in bad)
            good = [i for i in range(64) if i not in bad]
            assert all(np.array_equal(x, data[i]) for x, i in zip(contents(b, [found[i] for i in good]), good))
            b.free([found[i] for i in good])
        finally:
            a.close()
            b.close()
    finally:
        d.stop()


def test_without_the_crc_check_the_header_still_catches_a_reused_slot(daemon, managers):
    a, b = managers(), managers(verify_crc=False)
    data, found = published_and_found(a, b, "t", 2, 5)
    # A rogue process rewrites the first slot's header version (what a reuse would do).
    with DaemonClient(daemon.config.socket_path) as rogue:
        region = rogue.find_region(region_name(a))
        mm = rogue.arena
        off = region.layout.header_offset(found[0].slot)
        mm[off:off + 8] = (int.from_bytes(bytes(mm[off:off + 8]), "little") + 2).to_bytes(8, "little")
    result = b.onboard(found)
    assert [p.id for p in result.dropped] == [found[0].id]
    assert np.array_equal(contents(b, [found[1]])[0], data[1])


WRITER = """
import sys, numpy as np, kvcodec_sdk as kv
sys.path.insert(0, sys.argv[2])
from test_kvcm_shared import config, fill, keys
m = kv.KVCacheManager(config(sys.argv[1]), cold_page_codec="concat")
pages = m.allocate(0, 4)
data = fill(m, pages, 11)
m.set_keys(pages, keys("w", 4))
m.evict(pages)
np.save(sys.argv[3], np.stack(data))
print("published", m.shared_stats()["published"], flush=True)
sys.stdin.readline()
"""


def test_another_process_evicts_and_this_one_onboards(daemon, managers, tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    saved = tmp_path / "data.npy"
    p = subprocess.Popen([sys.executable, "-c", WRITER, daemon.config.socket_path, here, str(saved)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        assert p.stdout.readline().split() == ["published", "4"]
        b = managers()
        found = b.find_shared(keys("w", 4))
        assert b.onboard(found).moved == 4
        assert all(np.array_equal(x, y) for x, y in zip(contents(b, found), np.load(saved)))
        # The writer is killed while it still holds its pages: the daemon takes its pins and
        # leases back, and the published pages stay in L2 for everyone else.
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
    deadline = time.monotonic() + 10
    while daemon_stats(daemon)["reclaimed_leases"] < HOST_PAGES - 4:
        assert time.monotonic() < deadline, daemon_stats(daemon)
        time.sleep(0.01)
    d = daemon_stats(daemon)
    assert d["reclaimed_pins"] == 4 and d["slots_stored"] == 4
    c = managers()
    again = c.find_shared(keys("w", 4))
    assert c.onboard(again).moved == 4
    assert all(np.array_equal(x, y) for x, y in zip(contents(c, again), np.load(saved)))


def test_a_daemon_that_goes_away_stops_the_sharing_not_the_manager(tmp_path):
    d = Daemon(DaemonConfig(str(tmp_path / "kvd.sock"), 16 << 20, hugepages=False)).start()
    m = kv.KVCacheManager(config(d.config.socket_path, timeout_s=1.0), cold_page_codec="concat")
    try:
        pages = m.allocate(0, 4)
        data = fill(m, pages, 6)
        m.set_keys(pages, keys("u", 4))
        m.evict(pages[:2])
        d.stop()
        m.evict(pages[2:])  # into slots it already holds; publishing them finds the daemon gone
        assert m.shared_stats()["connected"] is False
        assert m.find_shared([b"anything"]) == [None]
        assert m.onboard(pages).moved == 4
        assert all(np.array_equal(x, y) for x, y in zip(contents(m, pages), data))
    finally:
        m.close()


def test_after_a_non_blocking_eviction_the_checksums_are_computed_off_the_callers_thread(daemon, managers):
    # A keyed page's CRC-32C is queued for the level's checksum thread at the first call after its
    # encode completed, and committed by a later call: no call computes it on its own thread.
    a, b = managers(), managers()
    pages = a.allocate(0, 8)
    data = fill(a, pages, 31)
    a.set_keys(pages, keys("bg", 8))
    a.evict(pages, blocking=False).wait()
    assert a.find_shared([b"nothing"]) == [None]  # queues the checksums; commits nothing yet
    assert a.shared_stats()["published"] == 0
    deadline = time.monotonic() + 10
    while a.shared_stats()["published"] < 8 and time.monotonic() < deadline:
        a.find_shared([b"nothing"])  # commits once the thread computed them
        time.sleep(0.001)
    assert a.shared_stats()["published"] == 8
    found = b.find_shared(keys("bg", 8))
    assert b.onboard(found).moved == 8
    assert all(np.array_equal(x, y) for x, y in zip(contents(b, found), data))


def test_the_end_of_a_blocking_call_waits_for_queued_checksums(daemon, managers):
    a, b = managers(), managers()
    pages = a.allocate(0, 8)
    data = fill(a, pages, 37)
    a.set_keys(pages, keys("sync", 8))
    a.evict(pages[:4], blocking=False).wait()
    a.find_shared([b"nothing"])  # the first four's checksums are queued
    a.evict(pages[4:])  # blocking: every page is published before it returns
    assert a.shared_stats()["published"] == 8
    found = b.find_shared(keys("sync", 8))
    assert b.onboard(found).moved == 8
    assert all(np.array_equal(x, y) for x, y in zip(contents(b, found), data))


def start_daemon(sock):
    """A cache daemon with a 16 MiB arena on ordinary pages, serving ``sock`` (restartable)."""
    return Daemon(DaemonConfig(sock, 16 << 20, hugepages=False)).start()


def another_manager_onboards(sock, names, data):
    """A new manager on the daemon at ``sock`` finds every key of ``names`` and onboards the pages
    byte-exact (``data``, in key order)."""
    b = kv.KVCacheManager(config(sock), cold_page_codec="concat")
    try:
        found = b.find_shared(names)
        assert all(f is not None for f in found)
        assert b.onboard(found).moved == len(names)
        assert all(np.array_equal(x, y) for x, y in zip(contents(b, found), data))
    finally:
        b.close()


def test_a_manager_reattaches_to_a_restarted_daemon_and_shares_again(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    d = start_daemon(sock)
    a = kv.KVCacheManager(config(sock, timeout_s=1.0), cold_page_codec="concat")
    try:
        pages = a.allocate(0, 10)
        data = fill(a, pages, 11)
        a.set_keys(pages, keys("r", 10))
        a.evict(pages[:6])  # published in the first daemon's arena
        assert a.reattach_shared() is False  # connected: nothing to do
        d.stop()
        assert a.find_shared([b"anything"]) == [None] and a.shared_stats()["connected"] is False
        assert a.reattach_shared() is False  # no daemon answers yet
        a.evict(pages[6:8])  # private slots of the old arena meanwhile
        d = start_daemon(sock)  # L2 starts empty
        assert a.reattach_shared() is True
        s = a.shared_stats()
        assert s["connected"] is True and s["reattached"] == 1
        # The 8 host-level pages were copied into the new arena: onboarded byte-exact.
        assert a.onboard(pages[:8]).moved == 8
        assert all(np.array_equal(x, y) for x, y in zip(contents(a, pages), data))
        a.evict(pages)  # published in the new daemon this time
        another_manager_onboards(sock, keys("r", 10), data)
    finally:
        a.close()
        d.stop()


def test_with_reattach_every_s_a_manager_rejoins_a_restarted_daemon_by_itself(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    d = start_daemon(sock)
    a = kv.KVCacheManager(config(sock, timeout_s=1.0, reattach_every_s=0), cold_page_codec="concat")
    try:
        pages = a.allocate(0, 6)
        data = fill(a, pages, 13)
        a.set_keys(pages, keys("auto", 6))
        a.evict(pages[:4])
        d.stop()
        # No daemon answers: each call tries (every 0 s), fails quietly and goes on unshared.
        assert a.find_shared([b"anything"]) == [None]
        a.evict(pages[4:])
        s = a.shared_stats()
        assert s["connected"] is False and s["reattached"] == 0
        d = start_daemon(sock)
        # The next migration re-attaches before it moves anything; the host pages came along.
        assert a.onboard(pages[:2]).moved == 2
        s = a.shared_stats()
        assert s["connected"] is True and s["reattached"] == 1
        assert a.onboard(pages[2:]).moved == 4
        assert all(np.array_equal(x, y) for x, y in zip(contents(a, pages), data))
        a.evict(pages)  # published in the new daemon
        another_manager_onboards(sock, keys("auto", 6), data)
    finally:
        a.close()
        d.stop()


def test_reattach_every_s_tries_at_most_once_per_period(tmp_path):
    sock = str(tmp_path / "kvd.sock")
    d = start_daemon(sock)
    a = kv.KVCacheManager(config(sock, timeout_s=1.0, reattach_every_s=3600), cold_page_codec="concat")
    try:
        pages = a.allocate(0, 2)
        data = fill(a, pages, 17)
        a.evict(pages)
        d.stop()
        assert a.find_shared([b"x"]) == [None]  # the daemon is found gone here; the first try comes next
        assert a.find_shared([b"x"]) == [None]  # ... and finds no daemon: the next is an hour away
        d = start_daemon(sock)
        assert a.onboard(pages).moved == 2
        assert a.shared_stats()["connected"] is False  # not yet due: still unshared, nothing lost
        assert all(np.array_equal(x, y) for x, y in zip(contents(a, pages), data))
        assert a.reattach_shared() is True  # the engine can always ask
    finally:
        a.close()
        d.stop()


@pytest.mark.parametrize("every", [-1, float("nan"), "1", True])
def test_reattach_every_s_must_be_none_or_seconds(every):
    with pytest.raises(kv.KVCacheConfigError, match="reattach_every_s"):
        kv.SharedTierConfig("/tmp/x.sock", reattach_every_s=every).validate()


def test_reattach_needs_a_shared_host_tier():
    m = kv.KVCacheManager(kv.KVCacheConfig(layer_groups(), gpu_quota=4 * PAGE, host_quota=4 * PAGE, device="cpu"),
                          cold_page_codec="concat")
    try:
        with pytest.raises(ValueError, match="no shared host tier"):
            m.reattach_shared()
    finally:
        m.close()


def test_configuration_errors_name_the_field(tmp_path, daemon):
    with pytest.raises(kv.KVCacheConfigError, match=r"KVCacheConfig.host_quota is 0"):
        kv.KVCacheConfig(layer_groups(), gpu_quota=64 * PAGE, device="cpu",
                         shared=kv.SharedTierConfig(daemon.config.socket_path)).validate()
    with pytest.raises(kv.KVCacheConfigError, match=r"KVCacheConfig.shared.region_slots is 0"):
        config(daemon.config.socket_path, region_slots=0).validate()
    with pytest.raises(kv.KVCacheConfigError, match=r"KVCacheConfig.shared.socket is ''"):
        config("").validate()
    with pytest.raises(ValueError, match=r"config.shared.socket: no cache daemon answers at"):
        kv.KVCacheManager(config(str(tmp_path / "nobody.sock"), timeout_s=0.2), cold_page_codec="concat")


def test_the_shared_host_level_refuses_resize_and_defragment(managers):
    m = managers()
    with pytest.raises(ValueError, match="leased from the per-host daemon"):
        m.resize(kv.CacheLevel.HOST, 2 * HOST_PAGES * PAGE)
    with pytest.raises(ValueError, match="leased from the per-host daemon"):
        m.defragment(kv.CacheLevel.HOST)
    with pytest.raises(ValueError, match="no shared host tier"):
        private = kv.KVCacheManager(kv.KVCacheConfig(layer_groups(), gpu_quota=64 * PAGE, host_quota=PAGE * 4,
                                                     device="cpu"), cold_page_codec="concat")
        try:
            private.find_shared([b"k"])
        finally:
            private.close()


def test_making_room_drops_pages_from_the_host_level_but_not_from_l2(daemon, managers):
    a = managers()
    pages = a.allocate(0, HOST_PAGES + 4)
    data = fill(a, pages, 7)
    a.set_keys(pages, keys("v", len(pages)))
    a.evict(pages[:HOST_PAGES])
    a.make_room(kv.CacheLevel.HOST, 0, 4)  # the host level is a's last: its 4 oldest pages drop
    a.evict(pages[HOST_PAGES:])
    assert sum(p.is_live for p in pages) == HOST_PAGES
    # The dropped pages left a, not L2: another manager finds all of them, byte-exact.
    b = managers()
    found = b.find_shared(keys("v", len(pages)))
    assert all(f is not None for f in found)
    assert b.onboard(found).moved == len(pages)
    assert all(np.array_equal(x, y) for x, y in zip(contents(b, found), data))


def test_kill_9_of_the_daemon_under_load_serves_no_wrong_page():
    """Two managers evict, find and onboard in a loop while the daemon is killed with SIGKILL: every
    page onboarded is byte-exact, the managers go on unshared, and a daemon started again on the
    same socket serves new managers from an empty L2."""
    from kvcodec_sdk.remote.servers import DaemonProcess

    daemon = DaemonProcess(l2_bytes=32 << 20)
    daemon.start()
    a = kv.KVCacheManager(config(daemon.socket_path, timeout_s=1.0), cold_page_codec="concat")
    b = kv.KVCacheManager(config(daemon.socket_path, timeout_s=1.0), cold_page_codec="concat")
    try:
        served = 0
        for round_ in range(12):
            if round_ == 6:
                daemon.kill()
            pages = a.allocate(0, 4)
            data = fill(a, pages, 100 + round_)
            names = keys(f"x{round_}", 4)
            a.set_keys(pages, names)
            a.evict(pages)
            found = [f for f in b.find_shared(names) if f is not None]
            b.onboard(found)
            for f in found:
                assert np.array_equal(contents(b, [f])[0], data[names.index(f.key)])
            served += len(found)
            b.free(found)
            assert a.onboard(pages).moved == 4  # a's own pages, shared or not
            assert all(np.array_equal(x, y) for x, y in zip(contents(a, pages), data))
            a.free(pages)
        assert served == 6 * 4  # every page before the kill, none after
        assert not a.shared_stats()["connected"] and not b.shared_stats()["connected"]
        daemon.start()
        c, d = (kv.KVCacheManager(config(daemon.socket_path), cold_page_codec="concat") for _ in range(2))
        try:
            assert d.find_shared(keys("x0", 4)) == [None] * 4  # L2 died with the daemon
            pages = c.allocate(0, 2)
            data = fill(c, pages, 200)
            c.set_keys(pages, keys("y", 2))
            c.evict(pages)
            found = d.find_shared(keys("y", 2))
            assert d.onboard(found).moved == 2 and all(np.array_equal(x, y) for x, y in zip(contents(d, found), data))
        finally:
            c.close()
            d.close()
    finally:
        a.close()
        b.close()
        daemon.stop()
