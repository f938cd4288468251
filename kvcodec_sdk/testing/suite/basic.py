"""Conformance: configure once, the queries, and round trips."""

from __future__ import annotations

import numpy as np
import pytest

from ...layout import (
    BufferDesc,
    LifeCycleDesc,
    PageIndexLocation,
    PoolDesc,
    PoolGroupDesc,
    Role,
    to_native,
)
from ..clauses import clause, violated
from ..harness import (
    GUARD_BYTES,
    make_codec,
)
from ._fixtures import (
    PAGES,
    UNKNOWN_IDS,
    BaseFixtures,
    _blame_round_trip,
    _classes,
    _covered,
    _diff,
    _meaningful_end,
    _restored_bytes,
)


class BaseConfigureTests(BaseFixtures):
    @clause("configure-once")
    @_blame_round_trip
    def test_configure_once(self, make_harness):
        h = make_harness()
        first = h.cold_bytes(h.plan.lifecycle_ids[0])
        if h.native.configure(to_native(h.groups)):
            raise violated("configure-once", "a second configure() returned true; the contract requires false")
        if h.cold_bytes(h.plan.lifecycle_ids[0]) != first:
            raise violated("configure-once", "the rejected second configure() changed queryColdPageBytes")
        h.round_trip(h.plan.lifecycle_ids[0], 2, clause="configure-once",
                     context="after a rejected second configure(), decode(encode(x))")


    @clause("rejected-configure")
    def test_rejected_configure(self, make_harness):
        name = "rejected-configure"
        h = make_harness(configure=False)
        good = list(h.groups)
        first, last = good[0], good[-1]
        pool0 = first.pools[0]
        outside = BufferDesc(0, Role.KEY, 0, pool0.slot_bytes, 1)
        # The invalid group comes last (a codec that keeps the groups it validated before shows)
        # or first (one that validates lazily shows).
        layouts = {
            "its last hot pool group has a pool with 0-byte slots":
                good[:-1] + [PoolGroupDesc([PoolDesc(last.pools[0].base, 0, last.pools[0].num_slots),
                                            *last.pools[1:]], last.lifecycles)],
            "its last hot pool group repeats a lifecycle of the first":
                good[:-1] + [PoolGroupDesc(last.pools, [*last.lifecycles,
                                                        LifeCycleDesc(first.lifecycles[0].lifecycle_id)])],
            "its first hot pool group has a buffer outside its slot":
                [PoolGroupDesc(first.pools, [LifeCycleDesc(first.lifecycles[0].lifecycle_id, (outside,)),
                                             *first.lifecycles[1:]]), *good[1:]],
        }
        ids = h.plan.lifecycle_ids
        page = max(g.page_bytes for g in h.plan.groups)
        before_hot = h.hot_raw()
        for what, layout in layouts.items():
            codec = make_codec(h.spec, h.params, h.device)
            native = codec._live()
            try:
                if native.configure(to_native(layout)):
                    raise violated("bad-arguments", f"configure() accepted a layout where {what}")
                for lc in [*ids, *UNKNOWN_IDS]:
                    size, rep, loc = (int(native.query_cold_page_bytes(lc)), int(native.get_batching_layer_group_id(lc)),
                                      int(native.query_page_index_location(lc)))
                    if size != 0 or rep >= 0 or loc != int(PageIndexLocation.BAD):
                        raise violated(name, f"configure() returned false for a layout where {what}, yet lifecycle {lc} "
                                             f"then has cold size {size}, batching ID {rep} and page-index location "
                                             f"{PageIndexLocation(loc).name}; a rejected configuration must leave every "
                                             "query failing (0 / negative / kBadLocation) as before configure()")
                cold, pairs = h.scratch_buffer(4 * page + 64), h.scratch_pairs([[0, 0], [1, 1]])
                stream = h.stream_handle
                for lc in ids:
                    for op in ("encode", "decode"):
                        if getattr(native, op)(lc, cold.address + GUARD_BYTES, pairs.address, 2, stream):
                            raise violated(name, f"configure() returned false for a layout where {what}, yet "
                                                 f"{op}(lifecycle {lc}) then returned true")
                h.sync()
                if not np.array_equal(cold.read(), cold.snapshot):
                    raise violated(name, f"after a rejected configure() ({what}), a call wrote into the cold buffer")
                for g, (x, y) in enumerate(zip(before_hot, h.hot_raw())):
                    for p, (a, b) in enumerate(zip(x, y)):
                        if not np.array_equal(a, b):
                            raise violated(name, f"after a rejected configure() ({what}), a call wrote into pool {p} "
                                                 f"of hot pool group {g}")
            finally:
                codec.close()

    @clause("descriptors-copied")
    @_blame_round_trip
    def test_descriptors_copied(self, make_harness):
        name = "descriptors-copied"
        h = make_harness(configure=False)
        decoys = h.configure_then_poison_descriptors(clause=name)
        reference = make_harness()
        for lc in h.plan.lifecycle_ids:
            got = (h.cold_bytes(lc), h.batching(lc), h.location(lc))
            want = (reference.cold_bytes(lc), reference.batching(lc), reference.location(lc))
            if got != want:
                raise violated(name, f"after configure()'s descriptor arrays were overwritten, lifecycle {lc} has cold "
                                     f"size, batching ID and index location {got[0]}, {got[1]}, {got[2].name} instead of "
                                     f"{want[0]}, {want[1]}, {want[2].name}: the codec reads the arrays after configure() "
                                     "returned")
        for lc in h.plan.lifecycle_ids:
            h.round_trip(lc, 3, clause=name, context="after configure()'s descriptor arrays were overwritten (pool "
                                                     "bases pointing at decoy pools, other lifecycle IDs), decode(encode(x))")
        for i, decoy in enumerate(decoys):
            if not np.array_equal(decoy.read(), decoy.snapshot):
                raise violated(name, f"a call wrote into decoy pool {i}, whose address was written into configure()'s "
                                     "descriptor arrays after configure() returned: the codec keeps using those arrays")


class BaseQueryTests(BaseFixtures):
    @clause("cold-size-fixed")
    def test_cold_size_fixed(self, make_harness):
        h = make_harness()
        sizes = {lc: h.cold_bytes(lc) for lc in h.plan.lifecycle_ids}
        for lc, size in sizes.items():
            if size == 0:
                raise violated("cold-size-fixed", f"queryColdPageBytes({lc}) is 0 for a configured lifecycle")
        for bad in UNKNOWN_IDS:
            if h.cold_bytes(bad) != 0:
                raise violated("cold-size-fixed", f"queryColdPageBytes({bad}) is {h.cold_bytes(bad)} for an unknown "
                                                  "lifecycle; it must be 0")
        for lc in h.plan.lifecycle_ids:  # calls must not change any size
            h.round_trip(lc, 2, clause="round-trip")
        for lc, size in sizes.items():
            now = h.cold_bytes(lc)
            if now != size:
                raise violated("cold-size-fixed", f"queryColdPageBytes({lc}) was {size} after configure() and is {now} "
                                                  "after some encode/decode calls; it must be fixed")

    @clause("batching-representative")
    def test_batching_representative(self, make_harness):
        h = make_harness()
        for bad in UNKNOWN_IDS:
            if h.batching(bad) >= 0:
                raise violated("batching-representative", f"getBatchingLayerGroupId({bad}) is {h.batching(bad)} for an "
                                                          "unknown lifecycle; it must be negative")
        for rep, members in _classes(h).items():
            if rep < 0:
                raise violated("batching-representative", f"getBatchingLayerGroupId({members[0]}) is {rep} for a "
                                                          "configured lifecycle")
            if rep not in h.plan.lifecycle_ids:
                raise violated("batching-representative", f"lifecycles {members} map to {rep}, which is not a "
                                                          "configured lifecycle")
            if h.batching(rep) != rep:
                raise violated("batching-representative", f"lifecycles {members} map to {rep}, but {rep} maps to "
                                                          f"{h.batching(rep)}; the representative must map to itself")
            if rep != min(members):
                raise violated("batching-representative", f"lifecycles {members} map to {rep}; the representative must "
                                                          f"be the smallest member ({min(members)})")
            groups = {h.plan.group_of(m) for m in members}
            if len(groups) > 1:
                raise violated("batching-representative", f"lifecycles {members} share batching ID {rep} but live in "
                                                          f"different hot pool groups {sorted(groups)}")
            sizes = {m: h.cold_bytes(m) for m in members}
            if len(set(sizes.values())) > 1:
                raise violated("batching-representative", f"lifecycles {members} share batching ID {rep} but have "
                                                          f"different cold-page sizes {sizes}")

    @clause("index-location")
    def test_index_location(self, make_harness):
        h = make_harness()
        for bad in UNKNOWN_IDS:
            if h.location(bad) != PageIndexLocation.BAD:
                raise violated("index-location", f"queryPageIndexLocation({bad}) is {h.location(bad).name} for an "
                                                 "unknown lifecycle; it must be kBadLocation")
        for rep, members in _classes(h).items():
            locations = {m: h.location(m).name for m in members}
            for m, loc in locations.items():
                if loc == "BAD":
                    raise violated("index-location", f"queryPageIndexLocation({m}) is kBadLocation for a configured "
                                                     "lifecycle")
                if h.device == "cpu" and loc != "HOST":
                    raise violated("index-location", f"queryPageIndexLocation({m}) is {loc} on the CPU reference; "
                                                     "host codecs take host indices")
            if len(set(locations.values())) > 1:
                raise violated("index-location", f"lifecycles of batching class {rep} want their page indices in "
                                                 f"different places {locations}; one location per class")


class BaseRoundTripTests(BaseFixtures):
    @clause("round-trip")
    @pytest.mark.parametrize("layout", ["mixed", "tiny-odd"])
    def test_round_trip(self, make_harness, layout):
        h = make_harness(layout)
        for lc in h.plan.lifecycle_ids:
            h.round_trip(lc, PAGES, clause="round-trip")

    @clause("page-counts")
    @_blame_round_trip
    def test_page_counts(self, make_harness):
        h = make_harness("many-pages")
        lc = h.plan.lifecycle_ids[0]
        slots = h.plan.groups[0].num_slots
        for n in (0, 1, 2, 1000, 100_000):
            src = h.rng.choice(slots, n, replace=False)
            back = np.setdiff1d(np.arange(slots), src)[:n] if n < slots // 2 else h.rng.permutation(src)
            cold = h.cold_buffer(lc, max(n, 1), clause="page-counts")
            dst = h.rng.permutation(n)
            h.must("encode", lc, cold.base, h.index_array(lc, dst, src), clause="page-counts")
            h.sync()
            if n >= slots // 2:  # decode over the sources themselves: clear them first
                h.fill_hot_slots(0, src)
            h.must("decode", lc, cold.base, h.index_array(lc, back, dst), clause="page-counts")
            h.sync()
            h.check_decoded(lc, src, back, clause="page-counts", context=f"a call of {n} pages")
            h.restore_hot()

    @clause("deterministic")
    @_blame_round_trip
    def test_deterministic(self, make_harness):
        name = "deterministic"
        h = make_harness()
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src, back = h.pages(rep, PAGES)
            dst = h.spread_blobs(len(src))
            a = h.cold_buffer(rep, 2 * len(src) + 1, clause=name)
            b = h.cold_buffer(rep, 2 * len(src) + 1, clause=name)
            b.region.write(a.read_all())
            # The same page into buffers that held other bytes: blob bytes the codec never writes
            # (uninitialised padding) keep what was there and show.
            prefilled = {f"0x{v:02X}": h.cold_buffer(rep, 2 * len(src) + 1, clause=name, fill=v) for v in (0x00, 0xFF)}
            for cold in (a, b, *prefilled.values()):
                h.must("encode", rep, cold.base, h.index_array(rep, dst, src), clause=name)
            h.sync()
            blobs_a, blobs_b = a.blobs(), b.blobs()
            for i in dst:
                if not np.array_equal(blobs_a[i], blobs_b[i]):
                    raise violated(name, f"lifecycle {rep}: encoding the same hot page twice gave different "
                                         f"blobs ({_diff(blobs_a[i], blobs_b[i])})")
            for what, cold in prefilled.items():
                other = cold.blobs()
                for i in dst:
                    end = _meaningful_end(h, blobs_a[i])
                    if not np.array_equal(blobs_a[i][:end], other[i][:end]):
                        raise violated(name, f"lifecycle {rep}: encoding the same hot page into a cold buffer pre-filled "
                                             f"with {what} gave another blob than into one holding random bytes "
                                             f"({_diff(blobs_a[i][:end], other[i][:end])}{_covered(h, end, a.blob_bytes)})"
                                             ": blob bytes the codec never writes keep the buffer's old contents")
            decoded = []
            for fill in (0xEE, 0xEE, 0x00, 0xFF):
                h.fill_hot_slots(g, back, fill)
                h.must("decode", rep, a.base, h.index_array(rep, back, dst), clause=name)
                h.sync()
                decoded.append((fill, h.hot_raw()[g]))
            masks = _restored_bytes(h, rep)
            (_, first), *others = decoded
            for k, (fill, other) in enumerate(others):
                for p, (x, y) in enumerate(zip(first, other)):
                    x, y = h.hot_slots(x, g, p)[back], h.hot_slots(y, g, p)[back]
                    if not np.array_equal(x[:, masks[p]], y[:, masks[p]]):
                        how = "twice gave different bytes" if k == 0 else \
                            f"into hot slots pre-filled with 0x{fill:02X} instead of 0xEE gave different bytes"
                        raise violated(name, f"lifecycle {rep}: decoding the same blobs {how} in pool {p} "
                                             f"({_diff(x[:, masks[p]], y[:, masks[p]])})")
            h.restore_hot()

    @clause("stateful-sequence")
    @_blame_round_trip
    def test_stateful_sequence(self, make_harness):
        from ..stateful import run_sequence

        run_sequence(make_harness(), clause="stateful-sequence")


