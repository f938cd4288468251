"""Conformance: batched, chunked and empty calls."""

from __future__ import annotations

import numpy as np
import pytest

from ..clauses import clause, violated
from ._fixtures import (
    BaseFixtures,
    _blame_round_trip,
    _classes,
    _diff,
)


class BaseBatchingTests(BaseFixtures):
    @clause("batched-calls")
    @_blame_round_trip
    def test_batched_calls(self, make_harness):
        h = make_harness()
        classes = {r: m for r, m in _classes(h).items() if len(m) > 1}
        if not classes:
            pytest.skip("no batching class has two members: every lifecycle batches alone")
        for rep, members in classes.items():
            g = h.plan.group_of(rep)
            slots = h.plan.groups[g].num_slots
            per = max(1, min(3, slots // (4 * len(members))))
            odd = h.rng.permutation(np.arange(1, slots, 2))
            even = h.rng.permutation(np.arange(0, slots, 2))
            srcs = [odd[i * per : (i + 1) * per] for i in range(len(members))]
            backs = [even[i * per : (i + 1) * per] for i in range(len(members))]
            n = per * len(members)
            dst_all = h.spread_blobs(n)
            dsts = [dst_all[i * per : (i + 1) * per] for i in range(len(members))]
            separate = h.cold_buffer(rep, 2 * n + 1, clause="batched-calls")
            joined = h.cold_buffer(rep, 2 * n + 1, clause="batched-calls")
            joined.region.write(separate.read_all())
            for m, d, s in zip(members, dsts, srcs):
                h.must("encode", m, separate.base, h.index_array(m, d, s), clause="batched-calls")
            h.must("encode", rep, joined.base, h.index_array(rep, dst_all, np.concatenate(srcs)), clause="batched-calls")
            h.sync()
            a, b = separate.read_all(), joined.read_all()
            if not np.array_equal(a, b):
                raise violated("batched-calls", f"lifecycles {members} share batching ID {rep}, but encoding their pages "
                                                f"in one call with ID {rep} gave other blobs than separate calls per "
                                                f"lifecycle ({_diff(a, b)})")
            for m, d, back in zip(members, dsts, backs):
                h.must("decode", m, separate.base, h.index_array(m, back, d), clause="batched-calls")
            h.sync()
            one = h.hot_raw()[g]
            h.restore_hot()
            h.must("decode", rep, separate.base, h.index_array(rep, np.concatenate(backs), dst_all), clause="batched-calls")
            h.sync()
            other = h.hot_raw()[g]
            h.restore_hot()
            for p, (x, y) in enumerate(zip(one, other)):
                if not np.array_equal(x, y):
                    raise violated("batched-calls", f"lifecycles {members} share batching ID {rep}, but decoding their "
                                                    f"pages in one call with ID {rep} wrote other bytes into pool {p} "
                                                    f"than separate calls per lifecycle ({_diff(x, y)})")

    @clause("chunked-calls")
    @_blame_round_trip
    def test_chunked_calls(self, make_harness):
        h = make_harness()
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src, back = h.pages(rep, 8)
            n = len(src)
            cuts = [0, 1, min(4, n), n]
            dst = h.spread_blobs(n)
            whole = h.cold_buffer(rep, 2 * n + 1, clause="chunked-calls")
            parts = h.cold_buffer(rep, 2 * n + 1, clause="chunked-calls")
            parts.region.write(whole.read_all())
            h.must("encode", rep, whole.base, h.index_array(rep, dst, src), clause="chunked-calls")
            for lo, hi in zip(cuts, cuts[1:]):
                if hi > lo:
                    h.must("encode", rep, parts.base, h.index_array(rep, dst[lo:hi], src[lo:hi]), clause="chunked-calls")
            h.sync()
            a, b = whole.read_all(), parts.read_all()
            if not np.array_equal(a, b):
                raise violated("chunked-calls", f"lifecycle {rep}: encoding {n} pages in chunks {cuts} gave other blobs "
                                                f"than one call ({_diff(a, b)})")
            h.must("decode", rep, whole.base, h.index_array(rep, back, dst), clause="chunked-calls")
            h.sync()
            one = h.hot_raw()[g]
            h.restore_hot()
            for lo, hi in zip(cuts, cuts[1:]):
                if hi > lo:
                    h.must("decode", rep, whole.base, h.index_array(rep, back[lo:hi], dst[lo:hi]), clause="chunked-calls")
            h.sync()
            other = h.hot_raw()[g]
            h.restore_hot()
            for p, (x, y) in enumerate(zip(one, other)):
                if not np.array_equal(x, y):
                    raise violated("chunked-calls", f"lifecycle {rep}: decoding in chunks {cuts} wrote other bytes into "
                                                    f"pool {p} than one call ({_diff(x, y)})")

    @clause("empty-call")
    @_blame_round_trip
    def test_empty_call(self, make_harness):
        h = make_harness()
        for lc in h.plan.lifecycle_ids:
            cold = h.cold_buffer(lc, 3, clause="empty-call")
            before_cold, before_hot = cold.read_all(), h.hot_raw()
            empty = h.index_array(lc, np.zeros(0, np.int32), np.zeros(0, np.int32))
            for op in ("encode", "decode"):
                for base, idx, what in ((cold.base, empty, "an empty index array"), (0, 0, "null pointers")):
                    stream = h.stream_handle
                    addr = idx if isinstance(idx, int) else h._address(idx)
                    if not getattr(h.native, op)(lc, base, addr, 0, stream):
                        raise violated("empty-call", f"{op}(lifecycle {lc}, 0 pages, {what}) returned false: "
                                                     f"{h.native.last_error() or 'no reason given'}")
            h.sync()
            if not np.array_equal(before_cold, cold.read_all()):
                raise violated("empty-call", f"an empty call of lifecycle {lc} wrote into the cold buffer")
            for g, (x, y) in enumerate(zip(before_hot, h.hot_raw())):
                for p, (a, b) in enumerate(zip(x, y)):
                    if not np.array_equal(a, b):
                        raise violated("empty-call", f"an empty call of lifecycle {lc} wrote into pool {p} of group {g}")


