"""KVCacheManager migrations on the host backend: every path byte-exact, batching and chunking of
codec calls, the device index ring, the transaction's rollback, the envelope, observers and
statistics; plus randomized migration sequences checked against a model after every step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kvcm_support import T, check_all, config, group, hot_bytes, make_test_codec, write_random

from kvcodec_sdk import CacheLevel, KVCacheManager, _native
from kvcodec_sdk.manager import CapacityError, MigrationError, MigrationRecord, StalePageError

MAX_PAIRS = _native.kvcm.MAX_PAIRS_PER_CALL


@pytest.fixture(autouse=True)
def _clean_codec_log():
    T.clear_codec_calls()
    T.fail_codec_calls_after(-1)
    yield
    T.fail_codec_calls_after(-1)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_constant_is_64_kib_of_pairs():
    assert MAX_PAIRS == 64 * 1024 // 8


def test_evict_writes_concat_blobs_and_onboard_restores_them(rng):
    m = KVCacheManager(config([group([0, 1], [64, 32]), group([2], [48])]))
    pages = m.allocate(0, 6) + m.allocate(1, 3)
    lcs = {p.id: p.lifecycle for p in pages}
    model = write_random(m, pages, rng)
    r = m.evict(pages)
    assert r.moved == 9 and len(r.dropped) == 0
    assert all(p.level == CacheLevel.HOST for p in pages)
    check_all(m, model, lcs, "concat")  # blob == slots of every pool in pool order
    # Hot slots are reusable now: scribble over them before bringing the pages back.
    for pool in m.hot_pool_tensors(0) + m.hot_pool_tensors(1):
        pool[:] = 0
    r = m.onboard(pages)
    assert r.moved == 9 and all(p.level == CacheLevel.HOT for p in pages)
    check_all(m, model, lcs, "concat")


def test_stats_split_the_codec_work_by_direction_with_hot_bytes_and_ratio(rng):
    codec = make_test_codec(pad="1:24")
    m = KVCacheManager(config([group([0, 1], [64, 32])]), cold_page_codec=codec)
    pages = m.allocate(0, 5)
    write_random(m, pages, rng)
    assert m.stats(CacheLevel.HOT)[0].achieved_ratio is None  # nothing offloaded yet
    m.evict(pages)
    hot_page = sum(t[0].nbytes for t in m.hot_pool_tensors(0))
    for s in (m.stats(CacheLevel.HOT)[0], m.stats(CacheLevel.HOST)[0]):
        assert s.hot_bytes_offloaded == 5 * hot_page and s.hot_bytes_onboarded == 0
        assert s.encode_calls >= 1 and s.decode_calls == 0 and s.encode_calls == s.codec_calls
        assert s.encode_seconds == s.codec_seconds and s.decode_seconds == 0
        assert s.achieved_ratio == pytest.approx(hot_page / (s.bytes_offloaded / 5))
    m.onboard(pages[:3])
    s = m.stats(CacheLevel.HOST)[0]
    assert s.hot_bytes_onboarded == 3 * hot_page and s.decode_calls >= 1
    assert s.encode_calls + s.decode_calls == s.codec_calls
    assert s.encode_seconds + s.decode_seconds == pytest.approx(s.codec_seconds)


def test_hot_to_hot_and_host_to_host_relocate_pages(rng):
    m = KVCacheManager(config([group([0, 1], [64])]))
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    slots = [p.slot for p in pages]
    m.migrate(pages, CacheLevel.HOT)  # per-pool copy into new slots
    assert [p.slot for p in pages] != slots and all(p.level == CacheLevel.HOT for p in pages)
    check_all(m, model, {p.id: 0 for p in pages}, "concat")
    m.evict(pages)
    host_slots = [p.slot for p in pages]
    m.migrate(pages, CacheLevel.HOST)  # raw blob copy
    assert [p.slot for p in pages] != host_slots
    check_all(m, model, {p.id: 0 for p in pages}, "concat")
    assert m.stats(CacheLevel.HOT)[0].pages_copied == 4 and m.stats(CacheLevel.HOST)[0].pages_copied == 4
    m.onboard(pages)
    check_all(m, model, {p.id: 0 for p in pages}, "concat")


def test_shared_hot_group_different_cold_groups_round_trip(rng):
    codec = make_test_codec(pad="1:24")
    m = KVCacheManager(config([group([0], [64, 16]), group([1], [64, 16])]), cold_page_codec=codec)
    pages = m.allocate(0, 5) + m.allocate(1, 5)
    lcs = {p.id: p.lifecycle for p in pages}
    model = write_random(m, pages, rng)
    m.evict(pages)
    assert sorted({p.pool_group for p in pages}) == [0, 1]
    check_all(m, model, lcs, "test")  # each blob decoded under its own lifecycle's format
    m.onboard(pages)
    check_all(m, model, lcs, "test")


def test_different_hot_groups_share_a_cold_pool(rng):
    m = KVCacheManager(config([group([0, 1], [64]), group([2], [64, 64])]))
    pages = m.allocate(0, 4) + m.allocate(1, 4)
    lcs = {p.id: p.lifecycle for p in pages}
    model = write_random(m, pages, rng)
    m.evict(pages)
    assert {p.pool_group for p in pages} == {0}
    assert len({p.slot for p in pages}) == 8
    m.onboard(pages)
    check_all(m, model, lcs, "concat")


def test_batching_class_is_one_codec_call_with_the_representative(rng):
    m = KVCacheManager(config([group([0], [64])] * 4), cold_page_codec=make_test_codec(batching="1:0,2:0"))
    pages = m.allocate(2, 3) + m.allocate(0, 2) + m.allocate(1, 4) + m.allocate(3, 5)
    model = write_random(m, pages, rng)
    T.clear_codec_calls()
    m.evict(pages)
    calls = sorted((c.kind, c.lifecycle, c.pages) for c in T.codec_calls())
    assert calls == [("encode", 0, 9), ("encode", 3, 5)]
    m.onboard(pages)
    check_all(m, model, {p.id: p.lifecycle for p in pages}, "test")


def test_batches_over_64_kib_of_indices_split_into_several_codec_calls(rng):
    n = 2 * MAX_PAIRS + 100
    m = KVCacheManager(config([group([0], [8])], gpu_quota=8 * (n + 10), host_quota=8 * (n + 10)),
                       cold_page_codec=make_test_codec())
    pages = m.allocate(0, n)
    model = write_random(m, pages[:50], rng)
    m.evict(pages)
    assert [c.pages for c in T.codec_calls()] == [MAX_PAIRS, MAX_PAIRS, 100]
    assert m.stats(CacheLevel.HOT)[0].codec_calls == 3
    m.onboard(pages)
    check_all(m, model, {p: 0 for p in model}, "test")


def test_device_indices_go_through_a_lazily_allocated_ring(rng):
    # 1 KiB ring = 128 pairs: 1000 pages need 8 codec calls, and the ring wraps several times.
    m = KVCacheManager(config([group([0], [16]), group([1], [16])], gpu_quota=16 * 2100, host_quota=16 * 2100,
                              index_ring_bytes=1024),
                       cold_page_codec=make_test_codec(location="0:device"))
    pages = m.allocate(1, 10)
    m.evict(pages)
    assert m.index_ring() is None  # host-index lifecycles allocate no index staging
    pages = m.allocate(0, 1000)
    model = write_random(m, pages, rng)
    T.clear_codec_calls()
    m.evict(pages)
    ring = m.index_ring()
    assert ring["capacity"] == 1024 and ring["live_leases"] == 0
    calls = T.codec_calls()
    assert sum(c.pages for c in calls) == 1000 and max(c.pages for c in calls) == 128 and len(calls) == 8
    for c in calls:  # every index array lives inside the ring
        assert ring["base"] <= c.indices and c.indices + 8 * c.pages <= ring["base"] + 1024
    assert len({c.indices for c in calls}) < len(calls)  # reused
    m.onboard(pages)
    assert m.index_ring()["base"] == ring["base"]  # allocated once
    check_all(m, model, {p: 0 for p in model}, "test")


def test_injected_submission_failure_rolls_back_and_loses_nothing(rng):
    m = KVCacheManager(config([group([0], [32]), group([1], [64])]), cold_page_codec=make_test_codec())
    pages = m.allocate(0, 5) + m.allocate(1, 7)
    lcs = {p.id: p.lifecycle for p in pages}
    model = write_random(m, pages, rng)
    free_before = m.slot_counts(CacheLevel.HOST)
    T.fail_codec_calls_after(1)  # the first batch commits, the second fails on submission
    with pytest.raises(MigrationError, match="injected submission failure") as info:
        m.evict(pages)
    assert info.value.committed_pages == 5
    levels = {lc: {p.level for p in pages if p.lifecycle == lc} for lc in (0, 1)}
    assert levels == {0: {CacheLevel.HOST}, 1: {CacheLevel.HOT}}
    # The failed batch's destination slots were released; its pages are intact and retryable.
    free_after = m.slot_counts(CacheLevel.HOST)
    assert free_after[1] == free_before[1] and free_after[0][1] == free_before[0][1] - 5
    check_all(m, model, lcs, "test")
    hot = [p for p in pages if p.level == CacheLevel.HOT]
    assert m.evict(hot).moved == 7
    m.onboard(pages)
    check_all(m, model, lcs, "test")


def test_failure_on_the_first_call_changes_nothing(rng):
    m = KVCacheManager(config([group([0], [32])]), cold_page_codec=make_test_codec())
    pages = m.allocate(0, 4)
    model = write_random(m, pages, rng)
    hot_free, host_free = m.slot_counts(CacheLevel.HOT), m.slot_counts(CacheLevel.HOST)
    T.fail_codec_calls_after(0)
    with pytest.raises(MigrationError) as info:
        m.evict(pages)
    assert info.value.committed_pages == 0
    assert m.slot_counts(CacheLevel.HOT) == hot_free and m.slot_counts(CacheLevel.HOST) == host_free
    assert all(p.level == CacheLevel.HOT for p in pages)
    check_all(m, model, {p: 0 for p in model}, "test")


def test_envelope_drops_pages_that_did_not_fit_or_fail_their_checksum(rng):
    m = KVCacheManager(config([group([0], [64])]), cold_page_codec=make_test_codec(envelope=True, did_not_fit_marker=0xEE))
    assert m.cold_page_bytes(0) == 32 + 64
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    m.page_view(pages[1], framework="numpy")[0][0] = 0xEE  # this page "does not fit"
    model[pages[1].id] = hot_bytes(m, pages[1])
    m.evict(pages)
    m.synchronize()
    blob = m.page_view(pages[3])[0]
    blob[40] ^= 0xFF  # corrupt the payload of another page
    r = m.onboard(pages)
    assert sorted(r.dropped.ids.tolist()) == sorted([pages[1].id, pages[3].id]) and r.moved == 4
    for dropped in (pages[1], pages[3]):
        assert not dropped.is_live
        with pytest.raises(StalePageError, match="stale"):
            dropped.level
    assert m.stats(CacheLevel.HOST)[0].pages_dropped == 2
    assert m.slot_counts(CacheLevel.HOST)[0][1] == m.slot_counts(CacheLevel.HOST)[0][0]  # all cold slots free
    for i in (0, 2, 4, 5):
        assert np.array_equal(hot_bytes(m, pages[i]), model[pages[i].id])


def test_codecs_without_envelope_are_not_checked(rng):
    m = KVCacheManager(config([group([0], [64])]))
    pages = m.allocate(0, 2)
    m.evict(pages)
    assert m.onboard(pages).moved == 2


def test_page_handle_errors():
    m = KVCacheManager(config([group([0], [64])]))
    other = KVCacheManager(config([group([0], [64])]))
    pages = m.allocate(0, 3)
    with pytest.raises(ValueError, match=r"pages\[2\] \(page 0x[0-9a-f]+\) appears twice"):
        m.evict(pages[[0, 1, 1]])
    with pytest.raises(ValueError, match="belong to another KVCacheManager"):
        other.evict(pages)
    # A list of handles: each must be one of this manager's; the first that is not is named.
    with pytest.raises(TypeError, match=r"pages\[1\] is .*; expected a PageHandle of this manager"):
        other.evict([other.allocate(0, 1)[0], pages[0]])
    with pytest.raises(TypeError, match=r"pages\[2\] is 7; expected a PageHandle of this manager"):
        m.evict([pages[0], pages[1], 7])
    assert m.evict([]).moved == 0
    m.evict(pages[:1])
    with pytest.raises(ValueError, match=r"pages\[0\] .* is at the host level; this call moves pages from the hot level only"):
        m.evict(pages[:1])
    with pytest.raises(ValueError, match="at the hot level; this call moves pages from the host level only"):
        m.onboard(pages[1:])
    m.free(pages)
    with pytest.raises(StalePageError, match=r"pages\[0\] .* is stale: it was freed or dropped"):
        m.evict(pages)
    with pytest.raises(StalePageError, match="not a page of this manager"):
        m.evict(np.array([12345], dtype=np.uint64))
    with pytest.raises(ValueError, match="lifecycle is 5; configured layer groups are 0..0"):
        m.allocate(5, 1)


def test_page_containers_give_the_same_ids():
    """A list or tuple of handles is read natively; every other container, a handle of a subclass
    and anything the native reader refuses go the checked way, with the same ids or errors."""
    from kvcodec_sdk import _native
    from kvcodec_sdk.manager import PageHandle

    m = KVCacheManager(config([group([0], [64])]))
    other = KVCacheManager(config([group([0], [64])]))
    pages = m.allocate(0, 5)
    want = np.asarray(pages.ids, dtype=np.uint64)
    handles = list(pages)
    read = _native.kvcm.handle_ids
    assert read(handles, m, PageHandle).tolist() == want.tolist()
    assert read(tuple(handles), m, PageHandle).tolist() == want.tolist()
    assert read([], m, PageHandle).tolist() == []
    assert read(handles, other, PageHandle) is None  # another manager's
    assert read(handles + [7], m, PageHandle) is None  # not a handle
    assert read(iter(handles), m, PageHandle) is None  # not a list or tuple
    assert read(handles, m, int) is None  # a type without the slots

    class Handle(PageHandle):
        __slots__ = ()

    sub = Handle(m, int(want[2]))
    assert read([sub], m, PageHandle) is None
    for container in (handles, tuple(handles), (h for h in handles), handles[:2] + [sub] + handles[3:]):
        assert m._ids(container).tolist() == want.tolist()
    odd = PageHandle(m, 0)
    odd.id = 2**64  # past 64 bits: refused natively, then by the native call that takes the ids
    assert read([odd], m, PageHandle) is None
    with pytest.raises((OverflowError, TypeError, ValueError)):
        m.evict([odd])
    # Lookups build their handles natively: None for id 0, and handles that read back as given.
    made = _native.kvcm.make_handles(np.array([want[0], 0, want[4]], dtype=np.uint64), m, PageHandle)
    assert made[1] is None and [type(h) for h in (made[0], made[2])] == [PageHandle, PageHandle]
    assert read([made[0], made[2]], m, PageHandle).tolist() == [want[0], want[4]]
    assert made[0]._manager is m and made[2].level == CacheLevel.HOT
    assert _native.kvcm.make_handles(want, m, int) is None
    assert PageHandle._found(m, np.array([0, want[1]], dtype=np.uint64))[1].id == want[1]
    assert m.evict(tuple(handles[:2])).moved == 2
    assert [h.level for h in handles] == [CacheLevel.HOST] * 2 + [CacheLevel.HOT] * 3
    with pytest.raises(TypeError, match=r"pages\[1\] is .*; expected a PageHandle of this manager"):
        m.evict((handles[2], other.allocate(0, 1)[0]))


def test_capacity_errors_change_nothing(rng):
    m = KVCacheManager(config([group([0], [64])], gpu_quota=64 * 8, host_quota=64 * 4))
    assert m.slot_counts(CacheLevel.HOT) == [(8, 8)] and m.slot_counts(CacheLevel.HOST) == [(4, 4)]
    with pytest.raises(CapacityError, match="hot pool group 0 has 8 free of 8 slots"):
        m.allocate(0, 9)
    pages = m.allocate(0, 6)
    model = write_random(m, pages, rng)
    with pytest.raises(CapacityError, match="6 go to its pool group 0, which has 4 free of 4 slots"):
        m.evict(pages)
    assert m.slot_counts(CacheLevel.HOST) == [(4, 4)] and all(p.level == CacheLevel.HOT for p in pages)
    check_all(m, model, {p: 0 for p in model}, "concat")


def test_observers_see_every_transfer_and_errors_surface_after_commit(rng):
    m = KVCacheManager(config([group([0], [64]), group([1], [32])]))
    seen: list[MigrationRecord] = []
    oid = m.add_migration_observer(seen.append)
    pages = m.allocate(0, 3) + m.allocate(1, 2)
    m.evict(pages)
    assert sorted((r.src_level, r.dst_level, r.src_pool_group, r.dst_pool_group, r.batching_representative, r.pages, r.bytes)
                  for r in seen) == [(0, 1, 0, 0, 0, 3, 192), (0, 1, 1, 1, 1, 2, 64)]
    assert m.remove_migration_observer(oid) and not m.remove_migration_observer(oid)

    def boom(record):
        raise KeyError("observer failed")

    m.add_migration_observer(boom)
    with pytest.raises(RuntimeError, match="observer failed"):
        m.onboard(pages)
    assert all(p.level == CacheLevel.HOT for p in pages)  # committed despite the observer


def test_counters_and_iteration_peaks_are_per_level():
    m = KVCacheManager(config([group([0], [64]), group([1], [32])]), cold_page_codec=make_test_codec(pad="1:8"))
    pages = m.allocate(0, 10)
    small = m.allocate(1, 4)
    m.free(pages[5:])
    assert m.get_and_reset_iteration_peak_block_stats(CacheLevel.HOT) == [(5, 10), (4, 4)]
    assert m.get_and_reset_iteration_peak_block_stats(CacheLevel.HOT) == [(5, 5), (4, 4)]
    m.evict(pages[:5])
    m.evict(small)
    hot, host = m.stats(CacheLevel.HOT), m.stats(CacheLevel.HOST)
    assert (hot[0].pages_offloaded, hot[0].bytes_offloaded) == (5, 5 * 64)
    assert (host[1].pages_offloaded, host[1].bytes_offloaded) == (4, 4 * 40)  # 32-byte page + 8 pad: its own cold group
    assert host[0].codec_calls == 1 and host[0].codec_seconds >= 0
    assert m.get_and_reset_iteration_peak_block_stats(CacheLevel.HOST) == [(5, 5), (4, 4)]
    m.onboard(small)
    assert m.stats(CacheLevel.HOST)[1].pages_onboarded == 4 and m.stats(CacheLevel.HOT)[1].bytes_onboarded == 4 * 40


# -- randomized sequences ---------------------------------------------------------------------------

CODECS = {
    "concat": lambda: None,
    "padded-classes": lambda: make_test_codec(pad="1:24", batching="2:0"),
    "device-indices": lambda: make_test_codec(location="0:device,1:device", batching="1:0"),
}
GROUPS = [group([0], [48, 16]), group([1], [48, 16]), group([2], [48, 16]), group([3, 4], [40])]

op = st.one_of(
    st.tuples(st.just("allocate"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.sampled_from(["evict", "onboard", "hot", "host", "free"]), st.lists(st.integers(0, 10_000), max_size=16)),
)


def run_sequence(m: KVCacheManager, ops, codec: str, rng: np.random.Generator) -> None:
    model: dict[int, np.ndarray] = {}
    lcs: dict[int, int] = {}
    from kvcodec_sdk.manager import PageHandle

    for step in ops:
        live = sorted(model)
        if step[0] == "allocate":
            _, lc, n = step
            try:
                pages = m.allocate(lc, n)
            except CapacityError:
                continue
            model.update(write_random(m, pages, rng))
            lcs.update({p.id: lc for p in pages})
        else:
            kind, picks = step
            if not live:
                continue
            chosen = sorted({live[i % len(live)] for i in picks})
            handles = [PageHandle(m, i) for i in chosen]
            if kind == "evict":
                handles = [h for h in handles if h.level == CacheLevel.HOT]
            elif kind == "onboard":
                handles = [h for h in handles if h.level == CacheLevel.HOST]
            try:
                if kind == "evict":
                    m.evict(handles)
                elif kind == "onboard":
                    m.onboard(handles)
                elif kind == "hot":
                    m.migrate(handles, CacheLevel.HOT)
                elif kind == "host":
                    m.migrate(handles, CacheLevel.HOST)
                else:
                    m.free(handles)
                    for h in handles:
                        del model[h.id]
            except CapacityError:
                pass
        check_all(m, model, lcs, codec)


@pytest.mark.parametrize("codec", sorted(CODECS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=25), seed=st.integers(0, 2**32 - 1))
def test_random_migration_sequences_match_the_model(codec, ops, seed):
    # Explicit migrations only: allocation must fail, not evict, when the hot tier is full.
    m = KVCacheManager(config(GROUPS, gpu_quota=64 * 40 * 2, host_quota=64 * 50, index_ring_bytes=64, auto_evict=False),
                       cold_page_codec=CODECS[codec]())
    run_sequence(m, ops, "concat" if codec == "concat" else "test", np.random.default_rng(seed))


@pytest.mark.parametrize("checked,abi", [(True, None), (True, 1), (False, None)],
                         ids=["checked-decode", "abi1-host-check", "host-check"])
def test_bad_blobs_are_dropped_and_counted_by_reason(rng, checked, abi):
    """Damaged host blobs (header, payload, did-not-fit) are dropped and counted per reason,
    whether the codec reports page statuses (checked decode, no host pass) or the manager
    checks the envelope on the host (codecs without it, and plugins built for ABI 1)."""
    codec = make_test_codec(abi_version=abi, envelope=True, did_not_fit_marker=0xEE, checked_decode=checked)
    m = KVCacheManager(config([group([0], [64])]), cold_page_codec=codec)
    pages = m.allocate(0, 8)
    model = write_random(m, pages, rng)
    m.page_view(pages[1], framework="numpy")[0][0] = 0xEE  # this page "does not fit"
    model[pages[1].id] = hot_bytes(m, pages[1])
    m.evict(pages)
    m.synchronize()
    m.page_view(pages[3])[0][40] ^= 0x04  # payload bit flip
    m.page_view(pages[5])[0][12] ^= 0x80  # header bit flip (payloadBytes): the header CRC fails
    m.page_view(pages[6])[0][0] ^= 0x01  # magic
    free_hot = m.slot_counts(CacheLevel.HOT)[0][1]
    T.clear_codec_calls()
    r = m.onboard(pages)
    decodes = [c for c in T.codec_calls() if c.kind == "decode"]
    # The checked decode gets every page (and decodes the good ones one by one); the host check
    # hands only the 4 good pages to one plain decode call.
    assert [c.pages for c in decodes] == ([1, 1, 1, 1] if checked and abi is None else [4])
    bad = [pages[i] for i in (1, 3, 5, 6)]
    assert sorted(r.dropped.ids.tolist()) == sorted(p.id for p in bad) and r.moved == 4
    for p in bad:
        assert not p.is_live
    st = m.stats(CacheLevel.HOST)[0]
    assert st.pages_dropped == 4 and st.pages_onboarded == 4
    assert st.dropped_by_reason["did_not_fit"] == 1 and st.dropped_by_reason["bad_checksum"] == 1
    assert st.dropped_by_reason["bad_header"] == 1 and st.dropped_by_reason["bad_magic"] == 1
    assert sum(st.dropped_by_reason.values()) == 4
    assert m.stats(CacheLevel.HOT)[0].pages_onboarded == 4
    assert m.slot_counts(CacheLevel.HOT)[0][1] == free_hot - 4  # the dropped pages' hot slots went back
    assert m.slot_counts(CacheLevel.HOST)[0][1] == m.slot_counts(CacheLevel.HOST)[0][0]
    for i in (0, 2, 4, 7):
        assert np.array_equal(hot_bytes(m, pages[i]), model[pages[i].id])
    # The pages that came back can go round again; the dropped ones are gone for good.
    good = [pages[i] for i in (0, 2, 4, 7)]
    assert m.evict(good).moved == 4 and m.onboard(good).moved == 4


def test_checked_decode_is_used_only_for_abi2_codecs():
    """A codec whose factory declares ABI 1 never gets decodeChecked() calls (its vtable would
    not have them); one built for ABI 2 with hasCheckedDecode() does."""
    new = make_test_codec(envelope=True, checked_decode=True)
    old = make_test_codec(abi_version=1, envelope=True, checked_decode=True)
    assert new.has_checked_decode and not old.has_checked_decode
    with pytest.raises(ValueError, match="no checked decode"):
        old.decode_checked(0, 0, np.zeros((0, 2), np.int32), np.zeros(1, np.uint8))
