"""Conformance: memory safety (writes inside slots, sources untouched, nothing retained) and bad arguments."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

from ... import _native, gpu
from ...layout import (
    BufferDesc,
    DType,
    LifeCycleDesc,
    PageIndexLocation,
    PoolDesc,
    PoolGroupDesc,
    Role,
    to_native,
)
from ..clauses import clause, violated
from ..data import from_float32, to_float32
from ..harness import (
    Harness,
    describe_stray_write,
    make_codec,
)
from ._fixtures import (
    PAGES,
    BaseFixtures,
    _blame_round_trip,
    _classes,
    _diff,
    _restored_bytes,
)


class BaseMemorySafetyTests(BaseFixtures):
    @clause("writes-inside-slots")
    @pytest.mark.parametrize("layout", ["mixed", "tiny-odd"])
    @_blame_round_trip
    def test_writes_inside_slots(self, make_harness, layout):
        h = make_harness(layout)
        for lc in h.plan.lifecycle_ids:
            g = h.plan.group_of(lc)
            src, back = h.pages(lc, PAGES)
            n = len(src)
            dst = h.spread_blobs(n)
            allowed = np.zeros(2 * n + 1, bool)
            allowed[dst] = True
            # Random canary bytes, then all-zero and all-one buffers: a write of any value shows.
            for fill in (None, 0x00, 0xFF):
                cold = h.cold_buffer(lc, 2 * n + 1, clause="writes-inside-slots", fill=fill)
                before = cold.read_all()
                h.must("encode", lc, cold.base, h.index_array(lc, dst, src), clause="writes-inside-slots")
                h.sync()
                filled = "random bytes" if fill is None else f"0x{fill:02X}"
                stray = describe_stray_write("encode", before, cold.read_all(), allowed, cold.blob_bytes, "blob",
                                             f"cold buffer (lifecycle {lc}, {cold.blob_bytes}-byte blobs, pre-filled "
                                             f"with {filled})")
                if stray:
                    raise violated("writes-inside-slots", stray)
            before_hot = h.hot_raw()[g]
            h.must("decode", lc, cold.base, h.index_array(lc, back, dst), clause="writes-inside-slots")
            h.sync()
            after_hot = h.hot_raw()[g]
            for p, pool in enumerate(h.plan.groups[g].pools):
                allowed = np.zeros(pool.num_slots, bool)
                allowed[back] = True
                stray = describe_stray_write("decode", before_hot[p], after_hot[p], allowed, pool.slot_bytes, "slot",
                                             f"pool {p} of hot pool group {g} (lifecycle {lc}, {pool.slot_bytes}-byte slots)")
                if stray:
                    raise violated("writes-inside-slots", stray)
            h.restore_hot()

    @clause("source-unmodified")
    @_blame_round_trip
    def test_source_unmodified(self, make_harness):
        h = make_harness()
        for lc in h.plan.lifecycle_ids:
            g = h.plan.group_of(lc)
            src, back = h.pages(lc, PAGES)
            cold = h.cold_buffer(lc, 2 * len(src) + 1, clause="source-unmodified")
            dst = h.spread_blobs(len(src))
            before = h.hot_raw()
            h.must("encode", lc, cold.base, h.index_array(lc, dst, src), clause="source-unmodified")
            h.sync()
            for gg, (x, y) in enumerate(zip(before, h.hot_raw())):
                for p, (a, b) in enumerate(zip(x, y)):
                    if not np.array_equal(a, b):
                        raise violated("source-unmodified", f"encode(lifecycle {lc}) modified its source: pool {p} of "
                                                            f"hot pool group {gg} changed ({_diff(a, b)})")
            blobs = cold.read_all()
            h.must("decode", lc, cold.base, h.index_array(lc, back, dst), clause="source-unmodified")
            h.sync()
            if not np.array_equal(blobs, cold.read_all()):
                raise violated("source-unmodified", f"decode(lifecycle {lc}) modified the cold blobs it read "
                                                    f"({_diff(blobs, cold.read_all())})")
            h.restore_hot()
            del g

    @clause("host-indices-after-return")
    @_blame_round_trip
    def test_host_indices_after_return(self, make_harness):
        h = make_harness()
        lcs = [lc for lc in h.plan.lifecycle_ids if h.location(lc) == PageIndexLocation.HOST]
        if not lcs:
            pytest.skip("no lifecycle takes host page indices on this device")
        _poisoned_sequence(h, lcs, "host-indices-after-return")

    @clause("data-not-retained")
    @_blame_round_trip
    def test_data_not_retained(self, make_harness):
        name = "data-not-retained"
        h = make_harness()
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src_all, back_all = h.pages(rep, 2 * PAGES)
            n = len(src_all) // 2
            src, src2, back, back2 = src_all[:n], src_all[n : 2 * n], back_all[:n], back_all[n : 2 * n]
            dst = h.spread_blobs(n)
            first, second = (h.cold_buffer(rep, 2 * n + 1, clause=name) for _ in range(2))
            h.must("encode", rep, first.base, h.index_array(rep, dst, src), clause=name)
            h.sync()
            # The encode is complete: its hot sources are the caller's again.
            h.fill_hot_slots(g, src, 0x5A)
            h.must("decode", rep, first.base, h.index_array(rep, back, dst), clause=name)
            h.sync()
            h.check_decoded(rep, src, back, clause=name, context="hot sources overwritten after the encode completed, "
                                                                "then decode")
            decoded = h.hot_raw()[g]
            # The decode is complete: its blobs are the caller's again.
            first.region.write(np.full(first.region.nbytes, 0xA5, np.uint8))
            poisoned = first.read_all()
            # More work on other slots and another cold buffer.
            h.must("encode", rep, second.base, h.index_array(rep, dst, src2), clause=name)
            h.must("decode", rep, second.base, h.index_array(rep, back2, dst), clause=name)
            h.sync()
            h.check_decoded(rep, src2, back2, clause=name, context="a later encode and decode")
            if not np.array_equal(poisoned, first.read_all()):
                raise violated(name, f"lifecycle {rep}: later calls wrote into the cold buffer of an earlier, completed "
                                     f"encode ({_diff(poisoned, first.read_all())}): the codec keeps using the data "
                                     "pointers of work that has completed")
            now = h.hot_raw()[g]
            for p, (x, y) in enumerate(zip(decoded, now)):
                x, y = h.hot_slots(x, g, p)[back], h.hot_slots(y, g, p)[back]
                if not np.array_equal(x, y):
                    raise violated(name, f"lifecycle {rep}: later calls changed pool {p} in the hot slots {back.tolist()} "
                                         f"of an earlier, completed decode ({_diff(x, y)}): the codec keeps using the "
                                         "data pointers of work that has completed")
            h.restore_hot()

    @clause("cpu-synchronous")
    @_blame_round_trip
    def test_cpu_synchronous(self, make_harness):
        name = "cpu-synchronous"
        h = _cpu_harness(make_harness)
        bogus = 0x7E57_0000  # not null and no stream: a CPU reference ignores it
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src, back = h.pages(rep, PAGES)
            n = len(src)
            dst = h.spread_blobs(n)
            cold, scratch = (h.cold_buffer(rep, 2 * n + 1, clause=name) for _ in range(2))
            for op, base, idx in (("encode", cold.base, h.index_array(rep, dst, src)),
                                  ("decode", cold.base, h.index_array(rep, back, dst))):
                if not h.call(op, rep, base, idx, clause=name, stream=bogus):
                    raise violated(name, f"{op}(lifecycle {rep}) returned false when given the stream argument "
                                         f"0x{bogus:x}: a CPU reference ignores the stream "
                                         f"({h.native.last_error() or 'no reason given'})")
                if op == "encode":
                    blobs = cold.read_all()  # as the call returned: nothing is synchronized on the CPU
            h.check_decoded(rep, src, back, clause=name, context="read as soon as decode() returned (a CPU reference "
                                                                "completes its work before returning)")
            decoded = h.hot_raw()[g]
            h.must("encode", rep, scratch.base, h.index_array(rep, dst, back), clause=name, stream=bogus)
            if not np.array_equal(blobs, cold.read_all()):
                raise violated(name, f"lifecycle {rep}: the blobs of encode() changed after it returned "
                                     f"({_diff(blobs, cold.read_all())}): a CPU reference completes its work before "
                                     "returning")
            for p, (x, y) in enumerate(zip(decoded, h.hot_raw()[g])):
                if not np.array_equal(x, y):
                    raise violated(name, f"lifecycle {rep}: pool {p} changed after decode() returned ({_diff(x, y)}): "
                                         "a CPU reference completes its work before returning")
            h.restore_hot()

    @clause("fp-environment")
    @_blame_round_trip
    def test_fp_environment(self, make_harness):
        name = "fp-environment"
        h = _cpu_harness(make_harness)
        try:
            _native.swap_fp_control(_native.swap_fp_control(0))
        except RuntimeError as e:
            pytest.skip(f"cannot set the floating-point environment here: {e}")
        # Every lifecycle with float buffers, by its own ID (a class's representative may describe
        # its pages as opaque bytes).
        floats = [lc for lc in h.plan.lifecycle_ids
                  if any(DType(b.dtype) in _SMALLEST_NORMAL for b in h.plan.buffers_of(lc))]
        for lc in floats:
            g = h.plan.group_of(lc)
            src, back = h.pages(lc, PAGES)
            h.write_hot_pages(g, src, _tiny_pages(h, lc, src))
            dst = h.spread_blobs(len(src))
            plain = h.cold_buffer(lc, 2 * len(src) + 1, clause=name)
            hostile = h.cold_buffer(lc, 2 * len(src) + 1, clause=name)
            hostile.region.write(plain.read_all())
            h.must("encode", lc, plain.base, h.index_array(lc, dst, src), clause=name)
            with _hostile_fp_environment():
                h.must("encode", lc, hostile.base, h.index_array(lc, dst, src), clause=name)
            a, b = plain.blobs(), hostile.blobs()
            for i in dst:
                if not np.array_equal(a[i], b[i]):
                    raise violated(name, f"lifecycle {lc}: the same hot pages (values near and below the "
                                         f"smallest normal of their dtype) encoded to other blobs with flush-to-zero, "
                                         f"denormals-are-zero and rounding toward zero set on the calling thread "
                                         f"({_diff(a[i], b[i])}): a CPU reference must compute as IEEE's defaults "
                                         "do whatever the caller set (kvcodec::IeeeScope; CodecBase holds one)")
            decoded = []
            for hostile_env in (False, True):
                h.fill_hot_slots(g, back, 0xEE)
                if hostile_env:
                    with _hostile_fp_environment():
                        h.must("decode", lc, plain.base, h.index_array(lc, back, dst), clause=name)
                else:
                    h.must("decode", lc, plain.base, h.index_array(lc, back, dst), clause=name)
                decoded.append(h.hot_raw()[g])
            for p, (m, x, y) in enumerate(zip(_restored_bytes(h, lc), *decoded)):
                x, y = h.hot_slots(x, g, p)[back][:, m], h.hot_slots(y, g, p)[back][:, m]
                if not np.array_equal(x, y):
                    raise violated(name, f"lifecycle {lc}: the same blobs decoded to other bytes in pool {p} with "
                                         f"flush-to-zero, denormals-are-zero and rounding toward zero set on the "
                                         f"calling thread ({_diff(x, y)}): a CPU reference must compute as IEEE's "
                                         "defaults do whatever the caller set")
            h.restore_hot()

    @clause("bad-arguments")
    def test_bad_arguments(self, make_harness):
        _check_bad_arguments(make_harness)


def _poison_for(h: Harness, valid_dst: np.ndarray, valid_src: np.ndarray) -> Any:
    """Valid but wrong pairs for an index array, made ahead (on the device when the codec takes
    device indices)."""
    # Every pair points at another valid destination and at the first source: not a permutation,
    # so a codec that reads the array twice cannot undo one wrong read with another.
    wrong = np.stack([np.roll(valid_dst, -1), np.full_like(valid_src, valid_src[0])], axis=1).astype(np.int32)
    if h.stream is None:
        return wrong
    return gpu.to_device(wrong, h.device)


def _poison(h: Harness, indices: Any, wrong: Any) -> None:
    """Overwrites an index array with ``wrong``: host arrays at once, device arrays by a copy
    enqueued on the codec's stream (legal: it is ordered after the codec's work)."""
    if isinstance(indices, np.ndarray):
        indices[:] = wrong.numpy() if isinstance(wrong, gpu.DeviceArray) else wrong
        return
    gpu.copy_bytes(indices.address, wrong.address, wrong.nbytes, h.stream)


def _poisoned_sequence(h: Harness, lcs: list[int], clause_name: str) -> None:
    """Per lifecycle: encode, encode, decode, decode, encode, overwriting each index array as soon
    as its call returns (on the GPU while the stream is blocked), then check the decoded pages."""
    for lc in lcs:
        g = h.plan.group_of(lc)
        slots = h.plan.groups[g].num_slots
        n = max(2, min(3, slots // 8))  # two or more pages: wrong pairs then differ from right ones
        odd = h.rng.permutation(np.arange(1, slots, 2))
        even = h.rng.permutation(np.arange(0, slots, 2))
        src, back1, back2 = odd[:n], even[:n], even[n : 2 * n]
        cold_a, cold_b, scratch = (h.cold_buffer(lc, 2 * n + 1, clause=clause_name) for _ in range(3))
        dst_a, dst_b = h.spread_blobs(n), h.spread_blobs(n)
        steps = [("encode", cold_a, dst_a, src), ("encode", cold_b, dst_b, src),
                 ("decode", cold_a, back1, dst_a), ("decode", cold_b, back2, dst_b),
                 ("encode", scratch, dst_a, src)]
        # Index arrays and their poison are made before the stream is blocked (allocations and
        # uploads would wait for the block); while blocked, only enqueueing happens.
        arrays = [(h.index_array(lc, d, s_), _poison_for(h, d, s_)) for _, _, d, s_ in steps]
        with (h.blocked_stream() if h.stream is not None else _null()) as b:
            for (op, cold, d, s_), (idx, poison) in zip(steps, arrays):
                if b is not None:
                    h.call_with_timeout(op, lc, cold.base, idx, clause=clause_name, blocker=b)
                else:
                    h.must(op, lc, cold.base, idx, clause=clause_name)
                _poison(h, idx, poison)
        h.sync()
        for back in (back1, back2):
            h.check_decoded(lc, src, back, clause=clause_name,
                            context="with every page-index array overwritten right after its call returned, the "
                                    "decoded pages are wrong")
        h.restore_hot()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _check_bad_arguments(make_harness) -> None:
    name = "bad-arguments"
    fresh = make_harness(configure=False)
    stream = fresh.stream_handle
    lc0 = fresh.plan.lifecycle_ids[0]
    dummy = np.zeros((1, 2), np.int32)
    for op in ("encode", "decode"):
        if getattr(fresh.native, op)(lc0, 4096, dummy.ctypes.data, 1, stream):
            raise violated(name, f"{op}() before configure() returned true")
    if fresh.cold_bytes(lc0) != 0 or fresh.batching(lc0) >= 0 or fresh.location(lc0) != PageIndexLocation.BAD:
        raise violated(name, "queries before configure() must return 0 / a negative ID / kBadLocation, got "
                             f"{fresh.cold_bytes(lc0)} / {fresh.batching(lc0)} / {fresh.location(lc0).name}")
    good = fresh.groups
    pool0 = good[0].pools[0]
    buf = BufferDesc(0, Role.KEY, 0, pool0.slot_bytes, 1)
    bad_layouts = {
        "a pool with a null base": [PoolGroupDesc([PoolDesc(0, pool0.slot_bytes, pool0.num_slots)], good[0].lifecycles)],
        "a pool with 0-byte slots": [PoolGroupDesc([PoolDesc(pool0.base, 0, pool0.num_slots)], good[0].lifecycles)],
        "a pool with no pools": [PoolGroupDesc([], good[0].lifecycles)],
        "a negative lifecycle ID": [PoolGroupDesc(good[0].pools, [LifeCycleDesc(-3)])],
        "a lifecycle ID listed twice": [good[0], PoolGroupDesc(good[1].pools, [LifeCycleDesc(good[0].lifecycles[0].lifecycle_id)])],
        "a buffer outside its slot": [PoolGroupDesc(good[0].pools, [LifeCycleDesc(0, (buf,))])],
    }
    for what, layout in bad_layouts.items():
        codec = make_codec(fresh.spec, fresh.params, fresh.device)
        try:
            if codec._live().configure(to_native(layout)):
                raise violated(name, f"configure() accepted {what}")
        finally:
            codec.close()
    h = make_harness()
    for lc in h.plan.lifecycle_ids:
        g = h.plan.group_of(lc)
        slots = h.plan.groups[g].num_slots
        cold = h.cold_buffer(lc, 3, clause=name)
        before_cold, before_hot = cold.read_all(), h.hot_raw()
        host = h.location(lc) == PageIndexLocation.HOST
        cases = [("encode", 99_991, cold.base, h.index_array(lc, [1], [1]), "an unknown lifecycle 99991"),
                 ("decode", 99_991, cold.base, h.index_array(lc, [1], [1]), "an unknown lifecycle 99991"),
                 ("encode", lc, 0, h.index_array(lc, [1], [1]), "a null cold base with 1 page"),
                 ("decode", lc, 0, h.index_array(lc, [1], [1]), "a null cold base with 1 page")]
        if host:
            cases += [("encode", lc, cold.base, h.index_array(lc, [1], [slots]), f"hot slot {slots} of {slots}"),
                      ("encode", lc, cold.base, h.index_array(lc, [1], [-1]), "hot slot -1"),
                      ("decode", lc, cold.base, h.index_array(lc, [slots + 5], [1]), f"hot slot {slots + 5} of {slots}"),
                      ("encode", lc, cold.base, h.index_array(lc, [-2], [1]), "cold slot -2"),
                      ("decode", lc, cold.base, h.index_array(lc, [1], [-2]), "cold slot -2")]
        for op, lifecycle, base, idx, what in cases:
            if h.call(op, lifecycle, base, idx, clause=name):
                raise violated(name, f"{op}() with {what} returned true; invalid arguments must return false")
        for op in ("encode", "decode"):
            if h.call(op, lc, cold.base, 0, clause=name, num_pages=1):
                raise violated(name, f"{op}() with a null page-index array and 1 page returned true")
        h.sync()
        if not np.array_equal(before_cold, cold.read_all()):
            raise violated(name, f"a rejected call of lifecycle {lc} wrote into the cold buffer")
        for x, y in zip(before_hot, h.hot_raw()):
            for p, (a, b) in enumerate(zip(x, y)):
                if not np.array_equal(a, b):
                    raise violated(name, f"a rejected call of lifecycle {lc} wrote into hot pool {p}")


def _cpu_harness(make_harness) -> Harness:
    """The default harness, for a clause of the CPU reference: the test skips on a CUDA device."""
    h = make_harness()
    if h.stream is not None:
        pytest.skip("a CPU clause: runs on the cpu device")
    return h


#: MXCSR flush-to-zero, denormals-are-zero and rounding toward zero (what a library such as
#: torch.set_flush_denormal(True) leaves on a thread, and more).
_HOSTILE_FP_CONTROL = 0x8000 | 0x0040 | 0x6000


@contextlib.contextmanager
def _hostile_fp_environment():
    """This thread's floating-point control bits set to _HOSTILE_FP_CONTROL for the block."""
    previous = _native.swap_fp_control(_HOSTILE_FP_CONTROL)
    try:
        yield
    finally:
        _native.swap_fp_control(previous)


_SMALLEST_NORMAL = {DType.BFLOAT16: 2.0**-126, DType.FLOAT32: 2.0**-126, DType.FLOAT16: 2.0**-14}


def _tiny_pages(h: Harness, lifecycle: int, src: np.ndarray) -> list[np.ndarray]:
    """The original pages of hot slots ``src``, per pool, with every float buffer (bf16, fp16,
    fp32) scaled so that its largest magnitude is 4x its dtype's smallest normal: most elements
    subnormal, where flush-to-zero and denormals-are-zero change results."""
    g = h.plan.group_of(lifecycle)
    pages = [h.original[g][p][np.asarray(src)].copy() for p in range(len(h.original[g]))]
    for b in h.plan.buffers_of(lifecycle):
        if DType(b.dtype) not in _SMALLEST_NORMAL:
            continue
        raw = pages[b.pool_index][:, b.byte_offset : b.byte_offset + b.bytes]
        values = to_float32(raw, b.dtype).astype(np.float64)
        amax = np.abs(values[np.isfinite(values)]).max(initial=0.0)
        if amax > 0:
            values = values * (4 * _SMALLEST_NORMAL[DType(b.dtype)] / amax)
        raw[:] = from_float32(values.astype(np.float32), b.dtype).reshape(raw.shape)
    return pages
