"""The conformance tests as classes a codec's own test file subclasses.

:class:`CodecConformanceTests` aggregates one mixin per area (``Base*Tests``); each test checks
one clause of the contract (see :data:`~kvcodec_sdk.testing.clauses.CLAUSES`). A codec author's
test file is three lines::

    from kvcodec_sdk.testing import CodecConformanceTests
    class TestMyCodec(CodecConformanceTests):
        codec_name = "mycodec"

Set ``codec_params`` (a dict) to test non-default parameters and ``golden_vectors`` (a folder
holding ``<name>-v<format_version>/``) to check stored vectors; or override the fixtures
``kvcodec_spec``, ``kvcodec_params``, ``kvcodec_golden_dir`` for anything else (e.g. a codec
that is not registered through an entry point).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from ..layout import BufferDesc, LifeCycleDesc, PageIndexLocation, PoolDesc, PoolGroupDesc, Role, to_native
from ..spec import CodecSpec
from . import envelope, golden
from .clauses import ClauseViolation, clause, violated
from .harness import GUARD_BYTES, Harness, cuda_available, describe_stray_write, make_codec
from .layouts import NAMED_LAYOUTS, LayoutPlan, named_layout

__all__ = [
    "CodecConformanceTests",
    "BaseFixtures",
    "BaseConfigureTests",
    "BaseQueryTests",
    "BaseRoundTripTests",
    "BaseCheckedDecodeTests",
    "BaseEnvelopeTests",
    "BaseBatchingTests",
    "BaseMemorySafetyTests",
    "BaseGoldenTests",
    "BaseStreamTests",
]

UNKNOWN_IDS = (-1, -7, 2**31 - 1, 99_991)
#: Pages per call in most tests: enough for several blobs per call, small enough to stay fast.
PAGES = 6


class BaseFixtures:
    """The fixtures every mixin uses. Provide the codec through ``codec_name`` or by overriding
    :meth:`kvcodec_spec`."""

    #: Registry name of the codec under test.
    codec_name: str | None = None
    #: Parameters of the codec under test (validated against its schema).
    codec_params: dict | None = None
    #: Folder holding ``<name>-v<format_version>/`` golden vectors, or None.
    golden_vectors: str | Path | None = None

    @pytest.fixture
    def kvcodec_spec(self) -> CodecSpec:
        """The CodecSpec of the codec under test.

        Provide it: set ``codec_name = "NAME"`` on the test class (a registered codec), or override
        this fixture to return a :class:`~kvcodec_sdk.CodecSpec` (e.g. one built around a factory
        capsule of a codec that is not installed).
        """
        if self.codec_name:
            from ..registry import get_codec_spec

            return get_codec_spec(self.codec_name)
        raise NotImplementedError(
            f"{type(self).__name__} does not say which codec to test: set codec_name = 'NAME' on the class or "
            "override the kvcodec_spec fixture to return a kvcodec_sdk.CodecSpec"
        )

    @pytest.fixture
    def kvcodec_params(self) -> dict:
        """Codec parameters (JSON-compatible dict). Set ``codec_params`` or override this fixture."""
        return dict(self.codec_params or {})

    @pytest.fixture
    def kvcodec_golden_dir(self, kvcodec_spec) -> Path:
        """Folder of the golden vectors of the codec's current format version.

        The class's ``golden_vectors`` (a folder holding ``<name>-v<format_version>/``) when
        set, else the vectors the codec ships next to its spec (``CodecSpec.golden_vectors``);
        or override this fixture. Write them once with
        :func:`kvcodec_sdk.testing.write_golden_vectors`.
        """
        if self.golden_vectors is not None:
            return Path(self.golden_vectors) / f"{kvcodec_spec.name}-v{kvcodec_spec.format_version}"
        declared = golden.declared_vectors(kvcodec_spec)
        if declared is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no golden vectors: declare them next to the codec's spec "
                f"(CodecSpec golden_vectors = <folder holding {kvcodec_spec.name}-v{kvcodec_spec.format_version}/>), "
                "set golden_vectors on the class (create them once with kvcodec_sdk.testing.write_golden_vectors) or "
                "override the kvcodec_golden_dir fixture"
            )
        return declared

    @pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
    def kvcodec_device(self, request, kvcodec_spec) -> str:
        """The device under test: every implementation the codec ships on every available device,
        narrowed by ``--kvcodec-device``. The CUDA cases carry the ``gpu`` marker."""
        device = request.param
        selected = request.config.getoption("kvcodec_device", default="all") or "all"
        if selected not in ("all", device):
            pytest.skip(f"--kvcodec-device {selected}")
        if device not in kvcodec_spec.devices:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no {device} implementation")
        if device == "cuda" and not cuda_available():
            pytest.skip("needs a CUDA device and torch with CUDA")
        return device

    @pytest.fixture
    def make_harness(self, kvcodec_spec, kvcodec_params, kvcodec_device) -> Iterator[Callable[..., Harness]]:
        """Factory: ``make_harness(layout="mixed", configure=True, seed=0, device=None)``."""
        made: list[Harness] = []

        def make(layout: str | LayoutPlan = "mixed", configure: bool = True, seed: int = 0,
                 device: str | None = None) -> Harness:
            plan = named_layout(layout) if isinstance(layout, str) else layout
            h = Harness(kvcodec_spec, kvcodec_params, device or kvcodec_device, plan, seed=seed, configure=configure)
            made.append(h)
            return h

        yield make
        for h in made:
            h.close()


def _blame_round_trip(test: Callable) -> Callable:
    """For a test of a clause that checks pages under some condition (a blocked stream, poisoned
    arrays, a long sequence...): when it finds a wrong page or a failed call, it first finds out
    whether plain ``decode(encode(x))`` of that lifecycle fails on a fresh codec too; then the
    violation is round-trip's (reported there), not the condition's."""
    @functools.wraps(test)
    def run(self, *args, **kwargs):
        try:
            return test(self, *args, **kwargs)
        except ClauseViolation as exc:
            where = getattr(exc, "page_check", None)
            make_harness = kwargs.get("make_harness")
            if where is None or exc.clause == "round-trip" or make_harness is None:
                raise
            lifecycle, layout, device = where
            try:
                plain = make_harness(layout if layout in NAMED_LAYOUTS else "mixed", device=device, configure=False)
                plain.configure(keep_descriptors=True)  # judges decode(encode(x)) alone, nothing else
            except ClauseViolation:
                raise exc from None
            if lifecycle in plain.plan.lifecycle_ids:
                plain.round_trip(lifecycle, PAGES, clause="round-trip",
                                 context=f"decode(encode(x)) on a fresh codec (found by the {exc.clause} test, "
                                         f"whose check failed too)")
            raise

    return run


def _classes(h: Harness) -> dict[int, list[int]]:
    """Batching classes: representative -> members (sorted)."""
    out: dict[int, list[int]] = {}
    for lc in h.plan.lifecycle_ids:
        out.setdefault(h.batching(lc), []).append(lc)
    return {k: sorted(v) for k, v in out.items()}


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
                stream = 0 if h.stream is None else int(h.stream.cuda_stream)
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
        from .stateful import run_sequence

        run_sequence(make_harness(), clause="stateful-sequence")


def _meaningful_end(h: Harness, blob: np.ndarray) -> int:
    """Bytes of a blob that carry the page: all of them, except for an enveloped codec, whose
    envelope declares the bytes after ``headerBytes + payloadBytes`` unused (the ``envelope``
    clause proves that its decode ignores them)."""
    if not h.spec.envelope or blob.size < envelope.ENVELOPE_BYTES:
        return blob.size
    e = envelope.parse(blob)
    if e.magic != envelope.MAGIC:
        return blob.size
    if e.did_not_fit:
        return envelope.ENVELOPE_BYTES
    return min(max(e.covered_end, envelope.ENVELOPE_BYTES), blob.size)


def _covered(h: Harness, end: int, blob_bytes: int) -> str:
    return f" in the {end} bytes the envelope covers" if end < blob_bytes else ""


def _restored_bytes(h: Harness, lifecycle: int) -> list[np.ndarray]:
    """Per pool of the lifecycle's group, the slot bytes a decode must restore: all of them for a
    lossless codec; those covered by a buffer for a lossy one."""
    g = h.plan.group_of(lifecycle)
    pools = h.plan.groups[g].pools
    if h.spec.lossless:
        return [np.ones(p.slot_bytes, bool) for p in pools]
    masks = [np.zeros(p.slot_bytes, bool) for p in pools]
    for b in h.plan.buffers_of(lifecycle):
        masks[b.pool_index][b.byte_offset : b.byte_offset + b.bytes] = True
    return masks


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    d = np.flatnonzero(a != b)
    return f"{d.size} bytes differ, first at byte {int(d[0])}"


def _flip_bit(cold, blob: int, offset: int, bit: int) -> None:
    """Flips one bit of one blob of a cold buffer (host copy, written back)."""
    raw = cold.read_all()
    blobs = cold.blobs(raw)
    blobs[blob, offset] ^= np.uint8(1 << bit)
    cold.region.write(raw)


class BaseCheckedDecodeTests(BaseFixtures):
    @clause("checked-decode")
    @_blame_round_trip
    def test_checked_decode(self, make_harness, kvcodec_spec):
        h = make_harness()
        if not h.codec.has_checked_decode:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no checked decode (optional, plugin ABI 2)")
        for rep in _classes(h):
            src, back = h.pages(rep, PAGES)
            n = len(src)
            cold = h.cold_buffer(rep, 2 * n + 1, clause="checked-decode")
            dst = h.spread_blobs(n)
            h.must("encode", rep, cold.base, h.index_array(rep, dst, src), clause="checked-decode")
            h.sync()
            status = h.status_buffer(n)
            h.must_decode_checked(rep, cold.base, h.index_array(rep, back, dst), status, clause="checked-decode")
            h.sync()
            got = status.read()[:n]
            if np.any(got != 0):
                raise violated("checked-decode", f"lifecycle {rep}: decodeChecked() reported statuses "
                                                 f"{got.tolist()} for {n} good blobs; every entry must be 0 (kPageOk)")
            h.check_decoded(rep, src, back, clause="checked-decode", context="decodeChecked(encode(x))")
            h.restore_hot()
            if not kvcodec_spec.envelope:
                continue
            # Damage: the magic, the envelope header (its CRC covers it) and the last payload byte
            # the envelope covers, one page each; the other pages must decode as before.
            raw = cold.read_all()
            blobs = cold.blobs(raw)
            damaged = {0: (0, 0), 1: (12, 3)}
            for k in range(2, n):
                payload = int(blobs[dst[k]][12:16].view("<u4")[0])
                header = int(blobs[dst[k]][8:12].view("<u4")[0])
                flags = int(blobs[dst[k]][6:8].view("<u2")[0])
                if flags & 4 == 0 and payload > 0:
                    damaged[k] = (header + payload - 1, 5)
                    break
            for k, (offset, bit) in damaged.items():
                _flip_bit(cold, int(dst[k]), offset, bit)
            h.fill_hot_slots(h.plan.group_of(rep), back)
            status = h.status_buffer(n)
            h.must_decode_checked(rep, cold.base, h.index_array(rep, back, dst), status, clause="checked-decode")
            h.sync()
            got = status.read()[:n]
            for k in range(n):
                if k in damaged and got[k] == 0:
                    raise violated("checked-decode", f"lifecycle {rep}: blob {int(dst[k])} has bit {damaged[k][1]} of "
                                                     f"byte {damaged[k][0]} flipped but decodeChecked() reported "
                                                     "status 0 (kPageOk) for it")
                if k not in damaged and got[k] != 0:
                    raise violated("checked-decode", f"lifecycle {rep}: blob {int(dst[k])} is intact but "
                                                     f"decodeChecked() reported status {int(got[k])} for it")
            good = np.array([k for k in range(n) if k not in damaged], dtype=np.int64)
            h.check_decoded(rep, src[good], back[good], clause="checked-decode",
                            context="the intact neighbours of damaged blobs")
            h.restore_hot()


class BaseEnvelopeTests(BaseFixtures):
    @clause("envelope")
    @_blame_round_trip
    def test_envelope(self, make_harness, kvcodec_spec):
        name = "envelope"
        if not kvcodec_spec.envelope:
            pytest.skip(f"codec {kvcodec_spec.name!r} does not declare the cold-page envelope")
        for layout in ("mixed", "tiny-odd"):
            h = make_harness(layout)
            for rep in _classes(h):
                g = h.plan.group_of(rep)
                src, back = h.pages(rep, PAGES)
                n = len(src)
                dst = h.spread_blobs(n)
                cold = h.cold_buffer(rep, 2 * n + 1, clause=name)
                h.must("encode", rep, cold.base, h.index_array(rep, dst, src), clause=name)
                h.sync()
                raw = cold.read_all()
                blobs = cold.blobs(raw)
                fits = []
                for k in range(n):
                    problem = envelope.field_problems(blobs[dst[k]], kvcodec_spec.format_version,
                                                      h.plan.groups[g].page_bytes)
                    if problem:
                        raise violated(name, f"lifecycle {rep} ({layout}), blob {int(dst[k])} (encoded from hot slot "
                                             f"{int(src[k])}): {problem}")
                    if not envelope.parse(blobs[dst[k]]).did_not_fit:
                        fits.append(k)
                # Bytes past headerBytes + payloadBytes are covered by neither CRC: damaging them must
                # not change what decode writes.
                flipped = []
                for k in fits:
                    blob = blobs[dst[k]]
                    end = envelope.parse(blob).covered_end
                    for offset in sorted({end, (end + blob.size) // 2, blob.size - 1}):
                        if end <= offset < blob.size:
                            blob[offset] ^= np.uint8(0x81)
                            flipped.append((k, offset))
                if not flipped:
                    continue
                good = np.array(fits)
                h.must("decode", rep, cold.base, h.index_array(rep, back[good], dst[good]), clause=name)
                h.sync()
                expected = h.hot_raw()[g]
                cold.region.write(raw)  # the damaged copy
                h.fill_hot_slots(g, back[good])
                h.must("decode", rep, cold.base, h.index_array(rep, back[good], dst[good]), clause=name)
                h.sync()
                for p, (x, y) in enumerate(zip(expected, h.hot_raw()[g])):
                    x, y = h.hot_slots(x, g, p)[back[good]], h.hot_slots(y, g, p)[back[good]]
                    for i, k in enumerate(good):
                        if not np.array_equal(x[i], y[i]):
                            where = [o for kk, o in flipped if kk == k]
                            end = envelope.parse(cold.blobs()[dst[k]]).covered_end
                            raise violated(name, f"lifecycle {rep} ({layout}), blob {int(dst[k])}: bytes {where} lie "
                                                 f"after headerBytes + payloadBytes ({end}), outside what the CRCs "
                                                 f"cover, yet damaging them changed the decoded page in pool {p} "
                                                 f"({_diff(x[i], y[i])}): a damaged blob would pass the envelope check "
                                                 "and decode to a wrong page")
                h.restore_hot()


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
                    stream = 0 if h.stream is None else int(h.stream.cuda_stream)
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
        h = make_harness()
        if h.stream is not None:
            pytest.skip("a CPU clause: runs on the cpu device")
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
    from .harness import upload_to_device

    return upload_to_device(wrong, h.device)


def _poison(h: Harness, indices: Any, wrong: Any) -> None:
    """Overwrites an index array with ``wrong``: host arrays at once, device arrays by a copy
    enqueued on the codec's stream (legal: it is ordered after the codec's work)."""
    if isinstance(indices, np.ndarray):
        indices[:] = np.asarray(wrong.cpu() if hasattr(wrong, "cpu") else wrong)
        return
    import torch

    with torch.cuda.stream(h.stream):
        indices.copy_(wrong, non_blocking=True)


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
    stream = 0 if fresh.stream is None else int(fresh.stream.cuda_stream)
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


class BaseGoldenTests(BaseFixtures):
    @clause("golden-vectors")
    def test_golden_vectors(self, kvcodec_spec, kvcodec_params, kvcodec_device, kvcodec_golden_dir):
        golden.check_vectors(kvcodec_spec, kvcodec_params, kvcodec_device, kvcodec_golden_dir)


def _cuda_only(h: Harness) -> None:
    if h.stream is None:
        pytest.skip("a CUDA clause: runs on the cuda device")


class BaseStreamTests(BaseFixtures):
    @clause("stream-no-wait")
    @_blame_round_trip
    def test_stream_no_wait(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        for rep in _classes(h):
            src, back = h.pages(rep, PAGES)
            dst = h.spread_blobs(len(src))
            cold = h.cold_buffer(rep, 2 * len(src) + 1, clause="stream-no-wait")
            # Everything that allocates or uploads happens before the stream is blocked: a device
            # allocation is an implicit synchronization point and would wait for the block.
            enc, dec = h.index_array(rep, dst, src), h.index_array(rep, back, dst)
            with h.blocked_stream() as b:
                h.call_with_timeout("encode", rep, cold.base, enc, clause="stream-no-wait", blocker=b)
                h.call_with_timeout("decode", rep, cold.base, dec, clause="stream-no-wait", blocker=b)
            h.check_decoded(rep, src, back, clause="stream-no-wait", context="calls enqueued on a blocked stream")
            h.restore_hot()

    @clause("stream-ordered")
    @_blame_round_trip
    def test_stream_ordered(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src, back = h.pages(rep, PAGES)
            dst = h.spread_blobs(len(src))
            cold = h.cold_buffer(rep, 2 * len(src) + 1, clause="stream-ordered")
            before_cold, before_hot = cold.read_all(), h.hot_raw()[g]
            enc, dec = h.index_array(rep, dst, src), h.index_array(rep, back, dst)
            with h.blocked_stream() as b:
                h.call_with_timeout("encode", rep, cold.base, enc, clause="stream-ordered", blocker=b)
                h.call_with_timeout("decode", rep, cold.base, dec, clause="stream-ordered", blocker=b)
                time.sleep(0.05)  # time for work wrongly put on another stream to run
                if not np.array_equal(before_cold, cold.read_all()):
                    raise violated("stream-ordered", f"encode(lifecycle {rep}) wrote the cold buffer while earlier work "
                                                     "on its stream was still pending: its work is not ordered on the "
                                                     "given stream")
                for p, (x, y) in enumerate(zip(before_hot, h.hot_raw()[g])):
                    if not np.array_equal(x, y):
                        raise violated("stream-ordered", f"decode(lifecycle {rep}) wrote hot pool {p} while earlier "
                                                         "work on its stream was still pending: its work is not ordered "
                                                         "on the given stream")
            h.check_decoded(rep, src, back, clause="stream-ordered", context="after the stream was released")
            h.restore_hot()

    @clause("device-indices-on-stream")
    @_blame_round_trip
    def test_device_indices_on_stream(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        lcs = [lc for lc in h.plan.lifecycle_ids if h.location(lc) == PageIndexLocation.DEVICE]
        if not lcs:
            pytest.skip("no lifecycle takes device page indices")
        _poisoned_sequence(h, lcs, "device-indices-on-stream")

    @clause("cpu-gpu-interchange")
    @_blame_round_trip
    def test_cpu_gpu_interchange(self, make_harness, kvcodec_spec):
        gpu = make_harness()
        _cuda_only(gpu)
        if "cpu" not in kvcodec_spec.devices:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no CPU reference")
        cpu = make_harness(device="cpu")
        for rep in _classes(gpu):
            src, back = gpu.pages(rep, PAGES)
            dst = gpu.spread_blobs(len(src))
            for enc, dec in ((gpu, cpu), (cpu, gpu)):
                a = enc.cold_buffer(rep, 2 * len(src) + 1, clause="cpu-gpu-interchange")
                enc.must("encode", rep, a.base, enc.index_array(rep, dst, src), clause="cpu-gpu-interchange")
                enc.sync()
                b = dec.cold_buffer(rep, 2 * len(src) + 1, clause="cpu-gpu-interchange")
                if a.blob_bytes != b.blob_bytes:
                    raise violated("cpu-gpu-interchange", f"lifecycle {rep}: cold page of {a.blob_bytes} bytes on "
                                                          f"{enc.device}, {b.blob_bytes} on {dec.device}")
                b.region.write(a.read_all())
                dec.must("decode", rep, b.base, dec.index_array(rep, back, dst), clause="cpu-gpu-interchange")
                dec.sync()
                dec.check_decoded(rep, src, back, clause="cpu-gpu-interchange",
                                  context=f"blobs encoded on {enc.device} and decoded on {dec.device}")
                dec.restore_hot()


class CodecConformanceTests(BaseConfigureTests, BaseQueryTests, BaseRoundTripTests, BaseEnvelopeTests,
                            BaseCheckedDecodeTests, BaseBatchingTests, BaseMemorySafetyTests, BaseGoldenTests,
                            BaseStreamTests):
    """Every conformance test. Subclass it with ``codec_name = "NAME"`` (see the module docstring)."""
