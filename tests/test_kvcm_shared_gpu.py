"""The shared host level on the CUDA backend: codecs encode into and decode from the daemon's
arena regions registered as pinned memory; pages written on a side stream, evicted without
blocking, published once their encode completed and onboarded byte-exact by another manager.
Skips cleanly without a CUDA device and cuda-python."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_kvcm_support import hot_bytes, write_random

import kvcodec_sdk as kv
from kvcodec_sdk.daemon import Daemon, DaemonClient, DaemonConfig
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()

BUF = 3000  # pages of 6000 bytes: a packed region, not 4 KiB-aligned slots
PAGES = 64


def opaque_groups():
    return [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=BUF), kv.BufferDesc(0, kv.Role.VALUE, bytes=BUF)])]


def shaped_groups():  # what a quantizing codec needs: [token][head][dim] bf16
    shape = dict(dtype=kv.DType.BFLOAT16, tokens_per_page=16, num_heads=2, head_dim=64)
    return [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=4096, **shape),
                                 kv.BufferDesc(0, kv.Role.VALUE, bytes=4096, **shape)])]


def region_name(groups, codec):
    identity = kv.KVCacheManager.remote_identity(kv.KVCacheConfig(groups, gpu_quota=1), codec)
    return kv.SharedTierConfig.region_prefix(identity) + "/g0"


def manager(sock, codec, verify_crc=True, groups=None):
    groups = groups or opaque_groups()
    return kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=4 * PAGES * 2 * BUF, host_quota=PAGES * 2 * BUF,
                                              device="cuda:0", shared=kv.SharedTierConfig(sock, region_slots=1024,
                                                                                           verify_crc=verify_crc)),
                             cold_page_codec=codec)


@pytest.mark.parametrize("params", [{"path": "copy_engine"}, {"path": "sm"}])
def test_another_manager_onboards_pages_evicted_without_blocking(daemon, params):
    sock = daemon.config.socket_path
    a = manager(sock, ("concat", params))
    b = manager(sock, ("concat", params))
    try:
        pages = a.allocate(0, PAGES)
        expected = write_random(a, pages, np.random.default_rng(3))
        keys = [b"g/%d" % i for i in range(PAGES)]
        a.set_keys(pages, keys)
        pending = a.evict(pages, blocking=False)
        pending.wait()
        a.synchronize()  # publishes what the non-blocking call encoded
        assert a.shared_stats()["published"] == PAGES
        found = b.find_shared(keys)
        assert all(f is not None for f in found)
        assert b.onboard(found).moved == PAGES
        assert all(np.array_equal(hot_bytes(b, f), expected[p.id]) for f, p in zip(found, pages))
        # a's own pages come back from the same slots too.
        assert a.onboard(pages).moved == PAGES
        assert all(np.array_equal(hot_bytes(a, p), expected[p.id]) for p in pages)
    finally:
        a.close()
        b.close()
    # The daemon takes the closed managers' pins and leases back as it notices their sockets close.
    deadline = time.monotonic() + 10
    with DaemonClient(sock) as c:
        while (st := c.stats())["slots_leased"] != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert st["slots_pinned"] == 0 and st["slots_leased"] == 0 and st["slots_stored"] == PAGES


def test_a_scribbled_blob_is_dropped_before_the_gpu_decodes_it(daemon):
    sock = daemon.config.socket_path
    a = manager(sock, "concat")
    b = manager(sock, "concat")
    try:
        pages = a.allocate(0, 4)
        expected = write_random(a, pages, np.random.default_rng(4))
        a.set_keys(pages, [b"s/%d" % i for i in range(4)])
        a.evict(pages)
        found = b.find_shared([b"s/%d" % i for i in range(4)])
        with DaemonClient(sock) as rogue:
            region = rogue.find_region(region_name(opaque_groups(), "concat"))
            rogue.slot_view(region, found[2].slot)[:8] = b"garbage!"
        result = b.onboard(found)
        assert [p.id for p in result.dropped] == [found[2].id]
        kept = [0, 1, 3]
        assert all(np.array_equal(hot_bytes(b, found[i]), expected[pages[i].id]) for i in kept)
    finally:
        a.close()
        b.close()


def test_a_plugin_codec_shares_pages_through_the_arena(daemon):
    if "fp8" not in [c.name for c in kv.list_codecs()]:
        pytest.skip("the fp8 plugin is not installed")
    sock = daemon.config.socket_path
    a = manager(sock, "fp8", groups=shaped_groups())
    b = manager(sock, "fp8", groups=shaped_groups())
    try:
        pages = a.allocate(0, 8)
        write_random(a, pages, np.random.default_rng(5))
        a.set_keys(pages, [b"f/%d" % i for i in range(8)])
        a.evict(pages)
        blobs = [a.page_view(p)[0] for p in pages]
        found = b.find_shared([b"f/%d" % i for i in range(8)])
        assert all(np.array_equal(np.asarray(b.page_view(f)[0]), np.asarray(x)) for f, x in zip(found, blobs))
        assert b.onboard(found).moved == 8
        assert a.onboard(pages).moved == 8
        # Both decoded the same blob: the same (lossy) pages.
        assert all(np.array_equal(hot_bytes(a, p), hot_bytes(b, f)) for p, f in zip(pages, found))
    finally:
        a.close()
        b.close()


def test_a_cuda_manager_reattaches_to_a_restarted_daemon(tmp_path):
    # The new arena is registered for the GPU's copies, the host-level pages are copied into it,
    # and pages evicted after the restart are onboarded by another manager.
    sock = str(tmp_path / "kvd.sock")
    d = Daemon(DaemonConfig(sock, 16 << 20, hugepages=False)).start()
    a, b = manager(sock, "concat"), None
    try:
        pages = a.allocate(0, 8)
        expected = write_random(a, pages, np.random.default_rng(6))
        keys = [b"r/%d" % i for i in range(8)]
        a.set_keys(pages, keys)
        a.evict(pages[:6])
        d.stop()
        assert a.find_shared([b"anything"]) == [None] and a.shared_stats()["connected"] is False
        d = Daemon(DaemonConfig(sock, 16 << 20, hugepages=False)).start()
        assert a.reattach_shared() is True and a.shared_stats()["reattached"] == 1
        assert a.onboard(pages[:6]).moved == 6
        assert all(np.array_equal(hot_bytes(a, p), expected[p.id]) for p in pages)
        a.evict(pages)
        b = manager(sock, "concat")
        found = b.find_shared(keys)
        assert all(f is not None for f in found)
        assert b.onboard(found).moved == 8
        assert all(np.array_equal(hot_bytes(b, f), expected[p.id]) for f, p in zip(found, pages))
    finally:
        a.close()
        if b is not None:
            b.close()
        d.stop()


@pytest.mark.parametrize("n,calls", [(128, 1), (1024, 2)])
def test_a_large_onboard_drops_each_scribbled_blob_and_decodes_the_rest(tmp_path, n, calls):
    # Pages of 64 KiB: 8 MiB in one call, and 64 MiB in two calls (each more than the device
    # staging area the blobs are checked in, so its regions are reused within a call and across
    # calls). Scribbled blobs at the start, in the middle and at the end are each dropped before
    # the GPU decodes them; the others arrive byte for byte, together with pages of the
    # onboarding manager's own (no CRC) in the same calls. Neighbouring slots are copied out of
    # the arena as one run; the second call's pages come in no order.
    half, own = 32 << 10, 16
    groups = [kv.LayerGroupConfig([kv.BufferDesc(0, kv.Role.KEY, bytes=half),
                                   kv.BufferDesc(0, kv.Role.VALUE, bytes=half)])]
    slots = 2 * (n + own) + 64
    d = Daemon(DaemonConfig(str(tmp_path / "big.sock"), (slots + 64) * 2 * half, hugepages=False)).start()
    try:
        def make():
            quota = (n + own) * 2 * half
            return kv.KVCacheManager(kv.KVCacheConfig(groups, gpu_quota=quota, host_quota=quota, device="cuda:0",
                                                      shared=kv.SharedTierConfig(d.config.socket_path,
                                                                                 region_slots=slots)),
                                     cold_page_codec="concat")

        a, b = make(), make()
        try:
            pages = a.allocate(0, n)
            expected = write_random(a, pages, np.random.default_rng(8))
            names = [b"big/%d" % i for i in range(n)]
            a.set_keys(pages, names)
            a.evict(pages)
            mine = b.allocate(0, own)
            mine_expected = write_random(b, mine, np.random.default_rng(9))
            b.evict(mine)
            found = b.find_shared(names)
            assert all(f is not None for f in found)
            bad = sorted({0, 40, n // 2 + 1, n - 2, n - 1})
            with DaemonClient(d.config.socket_path) as rogue:
                region = rogue.find_region(region_name(groups, "concat"))
                for i in bad:
                    rogue.slot_view(region, found[i].slot)[5000:5008] = b"garbage!"
            cut = [0, *(n * k // calls + 3 for k in range(1, calls)), n]
            moved, dropped = 0, []
            order = np.random.default_rng(10)
            for k in range(calls):
                batch = list(found[cut[k]:cut[k + 1]]) + (list(mine) if k == calls - 1 else [])
                if k == 1:  # neither in the order of the slots nor against it: the check copies sort them
                    batch = [batch[i] for i in order.permutation(len(batch))]
                result = b.onboard(batch)
                moved += result.moved
                dropped += [p.id for p in result.dropped]
            assert moved == n - len(bad) + own
            assert sorted(dropped) == sorted(found[i].id for i in bad)
            b.synchronize()
            good = [i for i in range(n) if i not in bad]
            assert all(np.array_equal(hot_bytes(b, found[i]), expected[pages[i].id]) for i in good)
            assert all(np.array_equal(hot_bytes(b, p), mine_expected[p.id]) for p in mine)
        finally:
            a.close()
            b.close()
    finally:
        d.stop()
