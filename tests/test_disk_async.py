"""Non-blocking disk migrations and prefetch (CPU backend): a migration returns once submitted with
its pages in flight at their source, lands on the manager's I/O thread, orders every later call on
those pages after it, changes nothing when its I/O fails, and prefetch warms the host tier within
its budget with every page counted."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from test_kvcm_support import config, damage_first_blob, group, hot_bytes, write_random

from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager
from kvcodec_sdk.manager import MigrationError, PendingMigration, StalePageError

GROUPS = [group([0, 1], [64, 32]), group([2], [48])]
HOLD_US = 300_000  # one delayed write: long enough that the caller surely sees the pages in flight


def make(path, faults=None, host_quota=1 << 17, groups=GROUPS, gpu_quota=1 << 16, **disk):
    disk.setdefault("max_bytes", 8 << 20)
    disk.setdefault("container_bytes", 1 << 20)
    disk.setdefault("io_mode", "buffered")
    return KVCacheManager(config(groups, gpu_quota=gpu_quota, host_quota=host_quota,
                                 disk=DiskTierConfig(str(path), _faults=faults, **disk)))


def hold_first_write(us=HOLD_US):
    """A fault rule that only delays the first container write (no error)."""
    return [{"op": "pwrite", "path": "containers", "errno": 0, "delay_us": us, "count": 1}]


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def scribble(m):
    for lc in range(m.num_layer_groups):
        for pool in m.hot_pool_tensors(lc):
            pool[:] = 0


def check_hot(m, pages, model):
    for p in pages:
        assert p.level == CacheLevel.HOT and not p.in_flight
        assert np.array_equal(hot_bytes(m, p), model[p.id]), p


def disk_slots_free(m):
    return all(free == total for total, free in m.slot_counts(CacheLevel.DISK))


def test_a_non_blocking_evict_returns_in_flight_and_lands(tmp_path, rng):
    m = make(tmp_path, hold_first_write())
    pages = m.allocate(0, 5) + m.allocate(1, 3)
    model = write_random(m, pages, rng)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    assert isinstance(pending, PendingMigration) and pending.requested == 8
    # The first write is held: the call returned with every page still hot and in flight.
    assert all(p.in_flight and p.level == CacheLevel.HOT for p in pages)
    assert m.in_flight_transfers() >= 1 and not pending.done()
    assert m.evictable(CacheLevel.HOT, 0) == 0  # in flight: never an eviction candidate
    r = pending.wait()
    assert pending.done() and r.moved == 8 and not len(r.failed) and r.error == ""
    assert all(p.level == CacheLevel.DISK and not p.in_flight for p in pages)
    assert m.in_flight_transfers() == 0
    assert [s.pages_offloaded for s in m.stats(CacheLevel.DISK)] == [5, 3]
    assert [m.disk_stats(g)["slots_live"] for g in (0, 1)] == [5, 3]
    scribble(m)
    r = m.onboard(pages, source=CacheLevel.DISK, blocking=False).wait()
    assert r.moved == 8
    check_hot(m, pages, model)
    assert disk_slots_free(m) and m.page_ring()["live_leases"] == 0


def test_calls_on_in_flight_pages_wait_for_their_transfer(tmp_path, rng):
    m = make(tmp_path, hold_first_write())
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK, blocking=False)
    assert all(p.in_flight for p in pages)
    # Onboarding pages still in flight to disk: ordered after the write (they land, then come
    # back from their blobs), byte-exact. Their hot bytes stay as they are until the eviction is
    # done (its encode runs on the I/O thread), so they are not scribbled here; the tests above
    # scribble after wait().
    assert m.onboard(pages[:3], source=CacheLevel.DISK).moved == 3
    assert m.disk_stats(0)["slots_live"] == 3  # the three came off the disk level
    check_hot(m, pages[:3], model)
    # Re-keying a page in flight to disk waits for the landing, then refuses (the blob is
    # written under its old key), as for any page at the disk level.
    m.set_keys(pages[:1], [b"kept"])
    m.evict(pages[:3], level=CacheLevel.DISK, blocking=False)
    with pytest.raises(ValueError, match="at the disk level"):
        m.set_keys(pages[:1], [b"other"])
    assert pages[0].key == b"kept" and not pages[0].in_flight
    # Freeing pages in flight (disk -> host reads): they land first, then leave every tier.
    m.migrate(pages[1:], CacheLevel.HOST, blocking=False)
    m.free(pages[3:])
    assert m.disk_stats(0)["slots_live"] == 1  # only pages[0]'s blob is left
    for p in pages[3:]:
        with pytest.raises(StalePageError):
            p.level
    m.synchronize()
    assert m.in_flight_transfers() == 0
    assert pages[0].level == CacheLevel.DISK and pages[1].level == CacheLevel.HOST
    m.close()
    m2 = make(tmp_path)
    found = m2.find_on_disk([b"kept"])
    assert found[0] is not None
    m2.onboard(found, source=CacheLevel.DISK)
    assert np.array_equal(hot_bytes(m2, found[0]), model[pages[0].id])


def test_a_failed_non_blocking_write_leaves_the_pages_at_their_source(tmp_path, rng):
    faults = [{"op": "pwrite", "path": "containers", "after": 1, "errno": 5, "count": 1}]
    m = make(tmp_path, faults, io_threads=1)
    pages = m.allocate(0, 4, keys=[b"a", b"b", b"c", b"d"])
    model = write_random(m, pages, rng)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    with pytest.raises(MigrationError, match="stay at their source") as e:
        pending.wait()
    assert e.value.committed_pages == 0
    check_hot(m, pages, model)  # nothing moved, nothing lost, evictable again
    assert m.evictable(CacheLevel.HOT, 0) == 4
    assert disk_slots_free(m) and m.disk_stats(0)["slots_live"] == 0
    assert m.in_flight_transfers() == 0
    # The fault was transient: a retry lands.
    assert m.evict(pages, level=CacheLevel.DISK, blocking=False).wait().moved == 4
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def test_a_blocking_evict_reports_a_failed_write_as_before(tmp_path, rng):
    faults = [{"op": "pwrite", "path": "containers", "after": 2, "errno": 5, "count": 1}]
    m = make(tmp_path, faults, io_threads=1)
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    with pytest.raises(MigrationError, match="disk write") as e:
        m.evict(pages, level=CacheLevel.DISK)
    assert e.value.committed_pages == 0
    check_hot(m, pages, model)


def test_a_non_blocking_read_of_a_corrupt_blob_drops_the_page(tmp_path, rng):
    groups = [group([0], [4096])]
    m = make(tmp_path, groups=groups)
    pages = m.allocate(0, 2, keys=[b"x", b"y"])
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    damage_first_blob(tmp_path)
    m2 = make(tmp_path, groups=groups)
    found = m2.find_on_disk([b"x", b"y"])
    r = m2.migrate(found, CacheLevel.HOST, blocking=False).wait()
    assert r.moved == 1 and len(r.dropped) == 1 and not len(r.failed)
    good = found[1] if r.dropped.ids[0] == found[0].id else found[0]
    assert good.level == CacheLevel.HOST
    assert m2.stats(CacheLevel.DISK)[0].dropped_by_reason["disk_checksum"] == 1
    m2.onboard([good])
    assert any(np.array_equal(hot_bytes(m2, good), model[p.id]) for p in pages)


def test_prefetch_warms_the_host_tier_within_its_budget(tmp_path, rng):
    m = make(tmp_path)
    pages = m.allocate(0, 8)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    page_bytes = m.page_bytes(CacheLevel.HOST, 0)
    pending = m.prefetch(pages, max_bytes=5 * page_bytes)
    r = pending.wait()
    assert r.moved == 5
    s = m.prefetch_stats()
    assert (s.issued, s.completed, s.skipped, s.used, s.wasted) == (5, 5, 3, 0, 0)
    warm = [p for p in pages if p.level == CacheLevel.HOST]
    cold = [p for p in pages if p.level == CacheLevel.DISK]
    assert len(warm) == 5 and len(cold) == 3
    # The budget is full until prefetched pages are used: nothing more is issued.
    m.prefetch(cold, max_bytes=5 * page_bytes).wait()
    assert m.prefetch_stats().issued == 5 and m.prefetch_stats().skipped == 6
    # Onboarding from the host counts used; freeing and evicting unused ones counts wasted.
    scribble(m)
    m.onboard(warm[:3])
    check_hot(m, warm[:3], model)
    m.free(warm[3:4])
    m.migrate(warm[4:5], CacheLevel.DISK)
    s = m.prefetch_stats()
    assert (s.used, s.wasted) == (3, 2)
    # The budget is free again; pages not at the disk level and repeats are skipped.
    m.prefetch(cold + cold[:1] + warm[:1], max_bytes=5 * page_bytes).wait()
    s = m.prefetch_stats()
    assert s.issued == 8 and s.skipped == 6 + 2
    m.onboard(cold)
    check_hot(m, cold, model)
    assert m.prefetch_stats().used == 6


def test_prefetch_never_evicts(tmp_path, rng):
    # A small host tier, full but for one slot: one page can be prefetched.
    m = make(tmp_path, host_quota=1 << 12)
    host_slots = m.slot_counts(CacheLevel.HOST)[0][0]
    assert 1 < host_slots < 32
    pages = m.allocate(0, host_slots + 3)
    write_random(m, pages, rng)
    m.evict(pages[:host_slots - 1])
    m.evict(pages[host_slots - 1:], level=CacheLevel.DISK)
    m.prefetch(pages[host_slots - 1:]).wait()
    assert sum(p.level == CacheLevel.HOST for p in pages[host_slots - 1:]) == 1
    assert all(p.level == CacheLevel.HOST for p in pages[:host_slots - 1])  # nothing evicted
    assert m.prefetch_stats().skipped == 3


def test_prefetch_by_content_key_after_a_restart(tmp_path, rng):
    m = make(tmp_path)
    keys = [b"k%d" % i for i in range(4)]
    pages = m.allocate(0, 4, keys=keys)
    model = {k: v for k, v in zip(keys, write_random(m, pages, rng).values())}
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    m2 = make(tmp_path)
    pending = m2.prefetch(keys + [b"absent"])
    assert pending.wait().moved == 4
    found = list(pending.pages)
    assert [p.key for p in found] == keys
    assert all(p.level == CacheLevel.HOST for p in found)
    m2.onboard(found)
    for k, p in zip(keys, found):
        assert np.array_equal(hot_bytes(m2, p), model[k])
    assert m2.prefetch_stats().used == 4


def test_cancel_gives_up_reads_not_yet_started(tmp_path, rng):
    # Every container write is slowed down: the I/O thread is busy with one while a prefetch queues.
    m = make(tmp_path, [{"op": "pwrite", "path": "containers", "errno": 0, "delay_us": 300_000}], io_threads=1)
    early = m.allocate(0, 4)
    write_random(m, early, rng)
    m.evict(early, level=CacheLevel.HOST)
    late = m.allocate(0, 4)
    model = write_random(m, late, rng)
    m.evict(late, level=CacheLevel.DISK)
    # Hold the I/O thread with another write, then queue a prefetch behind it and cancel it.
    m.migrate(early, CacheLevel.DISK, blocking=False)
    # The I/O thread takes every queued job at once: let it take the write alone first (it wakes
    # within microseconds; a loaded machine once took it together with the prefetch).
    time.sleep(0.05)
    pending = m.prefetch(late)
    pending.cancel()
    r = pending.wait()
    s = m.prefetch_stats()
    assert s.issued == 4 and s.cancelled + s.completed == 4 and r.moved == s.completed
    assert all(p.level in (CacheLevel.DISK, CacheLevel.HOST) and not p.in_flight for p in late)
    assert s.cancelled == 4  # the read never started: it was queued behind the slow write
    scribble(m)
    for p in late:
        if p.level != CacheLevel.HOT:
            m.onboard([p], source=CacheLevel(p.level))
    check_hot(m, late, model)
    with pytest.raises(ValueError, match="only a prefetch"):
        m.evict(m.allocate(0, 1), level=CacheLevel.DISK, blocking=False).cancel()


def test_wait_with_a_timeout_and_argument_checks(tmp_path, rng):
    m = make(tmp_path, hold_first_write(2_000_000))
    pages = m.allocate(0, 2)
    write_random(m, pages, rng)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    with pytest.raises(TimeoutError, match="not done after"):
        pending.wait(timeout=0.01)
    assert pending.wait().moved == 2
    with pytest.raises(TypeError, match="blocking is 'no'"):
        m.onboard(pages, source=CacheLevel.DISK, blocking="no")
    with pytest.raises(ValueError, match="max_bytes is 0"):
        m.prefetch(pages, max_bytes=0)
    no_disk = KVCacheManager(config(GROUPS))
    with pytest.raises(ValueError, match="no disk level"):
        no_disk.prefetch(no_disk.allocate(0, 1))


def test_observers_see_transfers_committed_on_the_io_thread(tmp_path, rng):
    m = make(tmp_path, hold_first_write())
    seen = []
    m.add_migration_observer(lambda r: seen.append((r.src_level, r.dst_level, r.pages, threading.get_ident())))
    pages = m.allocate(0, 3)
    write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK, blocking=False).wait()
    assert [(s, d, n) for s, d, n, _ in seen] == [(CacheLevel.HOT, CacheLevel.DISK, 3)]


def test_close_lands_transfers_in_flight(tmp_path, rng):
    m = make(tmp_path, hold_first_write())
    pages = m.allocate(0, 3, keys=[b"p", b"q", b"r"])
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK, blocking=False)
    m.close()
    m2 = make(tmp_path)
    found = m2.find_on_disk([b"p", b"q", b"r"])
    m2.onboard(found, source=CacheLevel.DISK)
    for p, q in zip(pages, found):
        assert np.array_equal(hot_bytes(m2, q), model[p.id])


def test_threads_migrating_asynchronously_keep_every_byte(tmp_path):
    m = make(tmp_path, host_quota=1 << 18, max_bytes=32 << 20)
    errors = []

    def worker(seed):
        try:
            rng = np.random.default_rng(seed)
            pages = m.allocate(seed % 2, 6)
            model = write_random(m, pages, rng)
            for round_ in range(12):
                level = (CacheLevel.DISK, CacheLevel.HOST)[round_ % 2]
                pending = m.evict(pages, level=level, blocking=False)
                if round_ % 3 == 0:
                    m.prefetch(pages).wait()  # pages in flight: skipped or ordered, never torn
                pending.wait()
                if level == CacheLevel.DISK and round_ % 4 == 0:
                    m.prefetch(pages).wait()
                m.onboard(pages, source=CacheLevel(pages[0].level), blocking=False).wait()
                for p in pages:
                    assert np.array_equal(hot_bytes(m, p), model[p.id]), (seed, round_, p)
            m.free(pages)
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert not errors, errors
    m.synchronize()
    assert m.in_flight_transfers() == 0 and disk_slots_free(m)


def test_an_observer_raising_on_the_io_thread_is_raised_by_wait(tmp_path, rng):
    m = make(tmp_path, hold_first_write())

    def observer(record):
        raise RuntimeError("observer failed")

    oid = m.add_migration_observer(observer)
    pages = m.allocate(0, 2)
    model = write_random(m, pages, rng)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    with pytest.raises(RuntimeError, match="observer raised.*observer failed"):
        pending.wait()  # as a blocking migration re-raises it, once everything committed
    assert all(p.level == CacheLevel.DISK for p in pages)  # the page table is consistent
    assert m.remove_migration_observer(oid)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def test_dropping_a_manager_with_transfers_in_flight_lands_them(tmp_path, rng):
    """No close(): the core's deallocation waits for the I/O thread (which needs the GIL for the
    observer) without holding the GIL, then goes."""
    m = make(tmp_path, hold_first_write())
    seen = []
    m.add_migration_observer(lambda r: seen.append(r.pages))
    pages = m.allocate(0, 3, keys=[b"u", b"v", b"w"])
    model = list(write_random(m, pages, rng).values())
    m.evict(pages, level=CacheLevel.DISK, blocking=False)
    del m, pages
    gc.collect()
    assert seen == [3]
    m2 = make(tmp_path)
    found = m2.find_on_disk([b"u", b"v", b"w"])
    m2.onboard(found, source=CacheLevel.DISK)
    for p, want in zip(found, model):
        assert np.array_equal(hot_bytes(m2, p), want)


def test_with_the_page_ring_held_encodes_stage_in_free_host_slots(tmp_path, rng):
    """More than the pinned page ring in flight: later evictions encode into free host-tier
    slots instead of waiting for the oldest write, so no call waits for the disk."""
    groups = [group([0], [512 << 10, 512 << 10])]  # 1 MiB pages: the 64 MiB ring holds 64
    m = make(tmp_path, hold_first_write(1_000_000), groups=groups, gpu_quota=101 << 20, host_quota=101 << 20,
             max_bytes=256 << 20, container_bytes=64 << 20)
    host = m.slot_counts(CacheLevel.HOST)[0]
    assert host[0] >= 100
    pages = m.allocate(0, 100)
    model = write_random(m, pages, rng)
    pending = [m.evict(pages[i:i + 25], level=CacheLevel.DISK, blocking=False) for i in range(0, 100, 25)]
    # The first write is still held: no call waited for it.
    assert not pending[0].done()
    assert m.slot_counts(CacheLevel.HOST)[0][1] < host[1]  # host slots are staging blobs
    assert sum(p.wait().moved for p in pending) == 100
    assert m.slot_counts(CacheLevel.HOST)[0] == host  # and went back
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def ring_sized_pages(tmp_path, rng, **disk):
    """96 pages of 1 MiB and no host tier (the 64 MiB page ring holds two slices of 32), the first
    write held: the manager, the pages and their bytes."""
    m = make(tmp_path, hold_first_write(), groups=[group([0], [1 << 20])], gpu_quota=97 << 20, host_quota=0,
             max_bytes=128 << 20, container_bytes=8 << 20, **disk)
    pages = m.allocate(0, 96)
    return m, pages, write_random(m, pages, rng)


def test_non_blocking_evictions_beyond_the_page_ring_do_not_wait_for_a_write(tmp_path, rng):
    # Three calls of 32 pages: the third call returns at once although the first write is held:
    # its job waits for a slice with its encode (submitted when the first job frees its slice).
    m, pages, model = ring_sized_pages(tmp_path, rng, io_threads=1)
    handles = [m.evict(pages[i:i + 32], level=CacheLevel.DISK, blocking=False) for i in (0, 32, 64)]
    assert not handles[0].done(), "a call waited for the held write"
    assert all(p.in_flight and p.level == CacheLevel.HOT for p in pages)
    assert m.page_ring()["live_leases"] == 2  # the third job holds no slice yet
    assert [h.wait().moved for h in handles] == [32, 32, 32]
    assert all(p.level == CacheLevel.DISK and not p.in_flight for p in pages)
    assert m.page_ring()["live_leases"] == 0 and m.in_flight_transfers() == 0
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def test_a_blocking_eviction_behind_a_full_page_ring_lands_in_order(tmp_path, rng):
    # The ring is held by non-blocking writes; a blocking eviction queues behind them and returns
    # once its own pages are on disk, its encode submitted when a slice freed.
    m, pages, model = ring_sized_pages(tmp_path, rng)
    first = [m.evict(pages[i:i + 32], level=CacheLevel.DISK, blocking=False) for i in (0, 32)]
    assert m.evict(pages[64:], level=CacheLevel.DISK).moved == 32
    assert all(p.level == CacheLevel.DISK for p in pages[64:])
    assert [h.wait().moved for h in first] == [32, 32]
    scribble(m)
    m.onboard(pages, source=CacheLevel.DISK)
    check_hot(m, pages, model)


def hold_first_read(us=HOLD_US):
    """A fault rule that only delays the first container read (no error)."""
    return [{"op": "pread", "path": "containers", "errno": 0, "delay_us": us, "count": 1}]


def test_a_non_blocking_onboard_from_disk_returns_in_flight_and_decodes_at_commit(tmp_path, rng):
    m = make(tmp_path, hold_first_read())
    pages = m.allocate(0, 5) + m.allocate(1, 3)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    scribble(m)
    pending = m.onboard(pages, source=CacheLevel.DISK, blocking=False)
    # The first read is held: the call returned with every page still on disk and in flight.
    assert all(p.in_flight and p.level == CacheLevel.DISK for p in pages)
    assert not pending.done() and m.in_flight_transfers() >= 1
    assert m.evictable(CacheLevel.DISK, 0) == 0
    r = pending.wait()
    assert r.moved == 8 and not len(r.failed) and not len(r.dropped)
    check_hot(m, pages, model)
    assert [s.pages_onboarded for s in m.stats(CacheLevel.HOT)] == [5, 3]
    assert disk_slots_free(m) and m.page_ring()["live_leases"] == 0
    assert m.in_flight_transfers() == 0


def test_a_non_blocking_onboard_larger_than_a_ring_slice_lands_every_transfer(tmp_path, rng):
    # 1 MiB pages and the 64 MiB page ring: a transfer carries 32 pages (half the ring), so 80
    # pages are three transfers, read, decoded and committed one after another while the later
    # ones are still being read; the third waits for the first's slice.
    groups = [group([0], [1 << 20])]
    m = make(tmp_path, groups=groups, gpu_quota=96 << 20, host_quota=0, max_bytes=96 << 20,
             container_bytes=8 << 20)
    assert m.page_ring()["capacity"] == 64 << 20
    pages = m.allocate(0, 80)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    scribble(m)
    r = m.onboard(pages, source=CacheLevel.DISK, blocking=False).wait()
    assert r.moved == 80
    check_hot(m, pages, model)
    # Blocking onboards take the same path and land in full before returning.
    m.evict(pages, level=CacheLevel.DISK)
    scribble(m)
    assert m.onboard(pages, source=CacheLevel.DISK).moved == 80
    check_hot(m, pages, model)
    assert m.page_ring()["live_leases"] == 0


def test_a_non_blocking_onboard_drops_a_corrupt_blob_and_fails_nothing_else(tmp_path, rng):
    groups = [group([0], [4096])]
    m = make(tmp_path, groups=groups)
    pages = m.allocate(0, 3, keys=[b"x", b"y", b"z"])
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    damage_first_blob(tmp_path)
    m2 = make(tmp_path, groups=groups)
    found = m2.find_on_disk([b"x", b"y", b"z"])
    r = m2.onboard(found, source=CacheLevel.DISK, blocking=False).wait()
    assert r.moved == 2 and len(r.dropped) == 1 and not len(r.failed)
    assert m2.stats(CacheLevel.DISK)[0].dropped_by_reason["disk_checksum"] == 1
    good = [p for p in found if p.id != r.dropped.ids[0]]
    for p in good:
        assert p.level == CacheLevel.HOT and not p.in_flight
        assert any(np.array_equal(hot_bytes(m2, p), model[q.id]) for q in pages)
    assert m2.slot_counts(CacheLevel.HOT)[0][1] == m2.slot_counts(CacheLevel.HOT)[0][0] - 2


def test_a_failed_non_blocking_read_leaves_the_pages_on_disk(tmp_path, rng):
    faults = [{"op": "pread", "path": "containers", "after": 1, "errno": 5, "count": 1}]
    m = make(tmp_path, faults, io_threads=1)
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    hot_free = m.slot_counts(CacheLevel.HOT)[0][1]
    pending = m.onboard(pages, source=CacheLevel.DISK, blocking=False)
    with pytest.raises(MigrationError, match="stay at their source") as e:
        pending.wait()
    assert e.value.committed_pages == 0
    assert all(p.level == CacheLevel.DISK and not p.in_flight for p in pages)
    assert m.slot_counts(CacheLevel.HOT)[0][1] == hot_free  # the destination slots went back
    assert m.evictable(CacheLevel.DISK, 0) == 4
    # The fault was transient: a retry lands, byte-exact.
    scribble(m)
    assert m.onboard(pages, source=CacheLevel.DISK, blocking=False).wait().moved == 4
    check_hot(m, pages, model)


def test_non_blocking_onboards_beyond_the_page_ring_do_not_wait_for_a_slice(tmp_path, rng):
    # Three calls of 32 pages of 1 MiB: the 64 MiB page ring holds two of their slices. The first
    # read is held, yet the third call returns at once (its job waits for a slice without the
    # caller) and every page lands byte-exact once the first job frees its slice.
    groups = [group([0], [1 << 20])]
    m = make(tmp_path, hold_first_read(), groups=groups, gpu_quota=96 << 20, host_quota=0,
             max_bytes=96 << 20, container_bytes=8 << 20, io_threads=1)
    pages = m.allocate(0, 96)
    model = write_random(m, pages, rng)
    m.evict(pages, level=CacheLevel.DISK)
    scribble(m)
    handles = [m.onboard(pages[i:i + 32], source=CacheLevel.DISK, blocking=False) for i in (0, 32, 64)]
    assert not handles[0].done(), "a call waited for the held read"
    assert all(p.in_flight and p.level == CacheLevel.DISK for p in pages)
    assert [h.wait().moved for h in handles] == [32, 32, 32]
    check_hot(m, pages, model)
    assert m.page_ring()["live_leases"] == 0 and m.in_flight_transfers() == 0


def make_with_test_codec(path, **kw):
    """A manager of GROUPS on the test codec (it records each call's thread and overlap)."""
    from test_kvcm_support import make_test_codec

    return KVCacheManager(config(GROUPS, gpu_quota=1 << 16, host_quota=kw.pop("host_quota", 1 << 17),
                                 disk=DiskTierConfig(str(path), max_bytes=8 << 20, container_bytes=1 << 20,
                                                     io_mode="buffered")), cold_page_codec=make_test_codec())


@pytest.fixture
def held_encodes():
    """The test codec's calls, recorded; its encodes and decodes held as a test asks (restored after
    the test)."""
    from test_kvcm_support import T

    T.clear_codec_calls()
    yield T
    T.hold_encodes(0)
    T.hold_decodes(0)
    T.clear_codec_calls()


def until_a_codec_call_began(T, kind, timeout_s=10.0):
    """Waits until the test codec recorded a call of ``kind`` ("encode" or "decode")."""
    deadline = time.monotonic() + timeout_s
    while not any(c.kind == kind for c in T.codec_calls()):
        assert time.monotonic() < deadline, f"no {kind} began within {timeout_s} s"
        time.sleep(0.001)


def test_on_the_cpu_backend_an_eviction_to_disk_encodes_on_the_io_thread(tmp_path, rng, held_encodes):
    # The codec runs where it is called on the CPU backend: on the caller's thread the call would
    # block for the whole encode. It is the I/O thread's, before the job's writes.
    T = held_encodes
    m = make_with_test_codec(tmp_path)
    pages = m.allocate(0, 4) + m.allocate(1, 2)
    model = write_random(m, pages, rng)
    T.hold_encodes(100_000)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    assert all(p.in_flight for p in pages)
    assert pending.wait().moved == 6
    encodes = [c for c in T.codec_calls() if c.kind == "encode"]
    assert encodes and all(c.thread != threading.get_native_id() for c in encodes)
    T.hold_encodes(0)
    # A blocking eviction encodes there too; the caller waits for its job as before.
    more = m.allocate(0, 2)
    model.update(write_random(m, more, rng))
    T.clear_codec_calls()
    assert m.evict(more, level=CacheLevel.DISK).moved == 2
    assert all(c.thread != threading.get_native_id() for c in T.codec_calls() if c.kind == "encode")
    scribble(m)
    assert m.onboard(pages + more, source=CacheLevel.DISK).moved == 8
    check_hot(m, pages + more, model)


def test_an_encode_on_the_io_thread_never_overlaps_a_callers_codec_call(tmp_path, rng, held_encodes):
    # The I/O thread's encode and the caller's decode share one codec, which need not be
    # reentrant: the manager runs them one at a time.
    T = held_encodes
    m = make_with_test_codec(tmp_path)
    warm = m.allocate(0, 3)
    model = write_random(m, warm, rng)
    m.evict(warm, level=CacheLevel.HOST)
    pages = m.allocate(0, 3)
    model.update(write_random(m, pages, rng))
    T.clear_codec_calls()
    T.hold_encodes(150_000)
    pending = m.evict(pages, level=CacheLevel.DISK, blocking=False)
    until_a_codec_call_began(T, "encode")  # on the I/O thread, which holds the codec 150 ms
    assert m.onboard(warm, source=CacheLevel.HOST).moved == 3  # the caller's decode
    assert pending.wait().moved == 3
    calls = T.codec_calls()
    assert {c.kind for c in calls} == {"encode", "decode"}
    assert not any(c.overlapped for c in calls)
    check_hot(m, warm, model)
    scribble(m)
    assert m.onboard(pages, source=CacheLevel.DISK).moved == 3
    check_hot(m, pages, model)


def fail_the_io_threads_codec_call(T, start, match):
    """The next codec call fails: the I/O thread's, in the migration ``start()`` returns, whose
    ``wait()`` raises ``match``."""
    T.fail_codec_calls_after(0)
    try:
        pending = start()
        with pytest.raises(MigrationError, match=match):
            pending.wait()
    finally:
        T.fail_codec_calls_after(-1)


def test_an_encode_failing_on_the_io_thread_leaves_the_pages_hot(tmp_path, rng, held_encodes):
    T = held_encodes
    m = make_with_test_codec(tmp_path)
    pages = m.allocate(0, 3)
    model = write_random(m, pages, rng)
    fail_the_io_threads_codec_call(T, lambda: m.evict(pages, level=CacheLevel.DISK, blocking=False),
                                   "encoding the pages for the disk level failed")
    check_hot(m, pages, model)
    assert disk_slots_free(m) and m.in_flight_transfers() == 0
    assert m.evict(pages, level=CacheLevel.DISK).moved == 3  # and a retry lands
    scribble(m)
    assert m.onboard(pages, source=CacheLevel.DISK).moved == 3
    check_hot(m, pages, model)


def test_on_the_cpu_backend_a_read_from_disk_decodes_on_the_io_thread_without_the_lock(tmp_path, rng, held_encodes):
    # A read job's decode is the I/O thread's too: run at its commit, under the manager's lock, it
    # blocked every caller (even one that needs no codec) for the whole decode.
    T = held_encodes
    m = make_with_test_codec(tmp_path)
    pages = m.allocate(0, 4) + m.allocate(1, 2)
    model = write_random(m, pages, rng)
    assert m.evict(pages, level=CacheLevel.DISK).moved == 6
    scribble(m)
    T.clear_codec_calls()
    T.hold_decodes(2_000_000)
    pending = m.onboard(pages, source=CacheLevel.DISK, blocking=False)
    until_a_codec_call_began(T, "decode")  # on the I/O thread, which holds the codec 2 s
    m.stats(CacheLevel.HOT)  # takes the manager's lock: it returns while the decode still runs
    assert not pending.done()
    assert all(p.in_flight for p in pages)
    T.hold_decodes(0)
    assert pending.wait().moved == 6
    decodes = [c for c in T.codec_calls() if c.kind == "decode"]
    assert decodes and all(c.thread != threading.get_native_id() for c in decodes)
    check_hot(m, pages, model)
    # A blocking onboard decodes there too; the caller waits for its job as before.
    assert m.evict(pages, level=CacheLevel.DISK).moved == 6
    scribble(m)
    T.clear_codec_calls()
    assert m.onboard(pages, source=CacheLevel.DISK).moved == 6
    assert all(c.thread != threading.get_native_id() for c in T.codec_calls() if c.kind == "decode")
    check_hot(m, pages, model)


def test_a_decode_failing_on_the_io_thread_leaves_the_pages_on_disk(tmp_path, rng, held_encodes):
    T = held_encodes
    m = make_with_test_codec(tmp_path)
    pages = m.allocate(0, 3)
    model = write_random(m, pages, rng)
    assert m.evict(pages, level=CacheLevel.DISK).moved == 3
    fail_the_io_threads_codec_call(T, lambda: m.onboard(pages, source=CacheLevel.DISK, blocking=False),
                                   "decoding the blobs read from the disk level failed")
    assert all(p.level == CacheLevel.DISK and not p.in_flight for p in pages)
    assert m.in_flight_transfers() == 0
    scribble(m)
    assert m.onboard(pages, source=CacheLevel.DISK).moved == 3  # and a retry lands
    check_hot(m, pages, model)
