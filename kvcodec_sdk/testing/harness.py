"""Memory, codec calls and checks shared by the conformance tests.

A :class:`Harness` owns one codec under test on one device, the hot pools of one layout (filled
with KV-like data, with guard bytes before and after every pool) and the cold buffers of the
calls (guard bytes around them, every blob that is not a destination holding canary bytes). It
calls the native codec directly, so a ``false`` return is seen as such, and turns every deviation
into a :class:`~kvcodec_sdk.testing.clauses.ClauseViolation` naming the clause.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from .. import _interop, _native, gpu
from ..codec import Codec
from ..layout import DType, PageIndexLocation, PoolDesc, PoolGroupDesc, Role, to_native
from ..spec import CodecSpec
from . import bounds
from .clauses import violated
from .data import fill_page_bytes
from .layouts import LayoutPlan

__all__ = ["Harness", "ColdBuffer", "make_codec", "cuda_available", "GUARD_BYTES"]

#: Guard bytes before and after every pool and cold buffer (keeps bases 256-byte aligned).
GUARD_BYTES = 256
#: Most pages of one call whose decoded buffers a lossy codec's own check_error judges (the suite's
#: own bound judges every page).
CHECK_ERROR_PAGES = 2048
#: Seconds a CUDA call may take to return while its stream is blocked.
NO_WAIT_TIMEOUT_S = 5.0


def cuda_available() -> bool:
    """True when a CUDA device and cuda-python are present (the suite's GPU clauses need both;
    torch is not needed)."""
    return gpu.available()


def make_codec(spec: CodecSpec, params: Mapping[str, Any] | None, device: str) -> Codec:
    """A codec straight from its spec (no registry needed): what ``create_codec`` does."""
    label, ordinal = _interop.parse_device(device)
    native = _native.NativeCodec(spec.factory(), spec.params_json(params), ordinal)
    return Codec(native, spec, spec.validate_params(params), label)


# -- memory -------------------------------------------------------------------------------------


class _Region:
    """Bytes at ``address``: host (numpy), pinned host or device memory."""

    def __init__(self, nbytes: int, device: str, pinned: bool = False):
        self.nbytes = nbytes
        self.device = device
        self._array: gpu.DeviceArray | None = None
        if device == "cpu":
            self._host = np.empty(max(nbytes, 1), np.uint8)
        elif pinned:
            self._array = gpu.pinned(max(nbytes, 1), np.uint8, device)
            self._host = np.asarray(self._array)
        else:
            self._array = gpu.empty(max(nbytes, 1), np.uint8, device)
            self._host = None
        self.address = self._host.ctypes.data if self._host is not None else self._array.address

    def read(self) -> np.ndarray:
        """A host copy of every byte (device memory is read on the side stream, so a blocked
        stream of the codec does not hold it up)."""
        if self._host is not None:
            return self._host[: self.nbytes].copy()
        return self._array[: self.nbytes].numpy()

    def write(self, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        assert data.size == self.nbytes
        if self._host is not None:
            self._host[: self.nbytes] = data
        else:
            self._array[: self.nbytes].copy_from(data)


@dataclass
class ColdBuffer:
    """``num_blobs`` blobs of ``blob_bytes`` at ``base``, with guards before and after."""

    region: _Region
    blob_bytes: int
    num_blobs: int

    @property
    def base(self) -> int:
        return self.region.address + GUARD_BYTES

    def read_all(self) -> np.ndarray:
        return self.region.read()

    def blobs(self, raw: np.ndarray | None = None) -> np.ndarray:
        raw = self.read_all() if raw is None else raw
        return raw[GUARD_BYTES : GUARD_BYTES + self.num_blobs * self.blob_bytes].reshape(self.num_blobs, self.blob_bytes)


def _canary(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 256, size=n, dtype=np.uint8)


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    diff = np.flatnonzero(a != b)
    i = int(diff[0])
    return f"{diff.size} of {a.size} bytes differ, first at byte {i} (0x{int(a[i]):02x} expected, got 0x{int(b[i]):02x})"


def describe_stray_write(op: str, before: np.ndarray, after: np.ndarray, allowed: np.ndarray,
                         unit_bytes: int, unit: str, what: str) -> str | None:
    """None, or a sentence locating the first byte changed outside the allowed units.

    ``before``/``after`` cover guard + units + guard; ``allowed`` is a bool per unit.
    """
    changed = before != after
    mask = np.ones_like(changed)
    body = mask[GUARD_BYTES : GUARD_BYTES + allowed.size * unit_bytes].reshape(allowed.size, unit_bytes)
    body[allowed] = False
    stray = np.flatnonzero(changed & mask)
    if stray.size == 0:
        return None
    first = int(stray[0])
    offset = first - GUARD_BYTES
    if offset < 0:
        where = f"{-offset} byte(s) before the first {unit} of the {what}"
    elif offset >= allowed.size * unit_bytes:
        where = f"{offset - allowed.size * unit_bytes + 1} byte(s) after the last {unit} of the {what} (offset {offset})"
    else:
        k = offset // unit_bytes
        dests = np.flatnonzero(allowed)
        near = dests[np.argmin(np.abs(dests - k))] if dests.size else None
        rel = ""
        if near is not None and near < k:
            rel = f", {offset - (near + 1) * unit_bytes + 1} byte(s) after destination {unit} {near} (which ends at offset {(near + 1) * unit_bytes})"
        elif near is not None:
            rel = f", {near * unit_bytes - offset} byte(s) before destination {unit} {near}"
        where = f"{unit} {k} of the {what}, which is not a destination (offset {offset}{rel})"
    return f"{op} wrote {stray.size} byte(s) outside its destination {unit}s: first in {where}"


# -- raw descriptor arrays -----------------------------------------------------------------------


class _CPoolDesc(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("slotBytes", ctypes.c_uint64), ("numSlots", ctypes.c_uint64)]


class _CBufferDesc(ctypes.Structure):
    _fields_ = [("layerId", ctypes.c_int32), ("role", ctypes.c_int32), ("poolIndex", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("byteOffset", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("tokensPerPage", ctypes.c_int32), ("numHeads", ctypes.c_int32), ("headDim", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class _CLifeCycleDesc(ctypes.Structure):
    _fields_ = [("lifeCycleId", ctypes.c_int32), ("numBuffers", ctypes.c_uint32),
                ("buffers", ctypes.POINTER(_CBufferDesc))]


class _CPoolGroupDesc(ctypes.Structure):
    _fields_ = [("poolGroupIndex", ctypes.c_int32), ("numPools", ctypes.c_uint32),
                ("pools", ctypes.POINTER(_CPoolDesc)), ("numLifeCycles", ctypes.c_uint32),
                ("lifeCycles", ctypes.POINTER(_CLifeCycleDesc))]


assert ctypes.sizeof(_CBufferDesc) == 48 and ctypes.sizeof(_CPoolGroupDesc) == 32


class RawDescriptors:
    """The ``PoolGroupDesc`` arrays of ``codec.h`` built in memory the suite owns, so that it can
    overwrite them after ``configure()`` returned (they are valid only during the call)."""

    def __init__(self, groups: list[PoolGroupDesc]):
        self._keep: list[Any] = []
        self.groups = (_CPoolGroupDesc * len(groups))()
        for g, group in enumerate(groups):
            pools = (_CPoolDesc * len(group.pools))(*[_CPoolDesc(p.base, p.slot_bytes, p.num_slots) for p in group.pools])
            lcs = (_CLifeCycleDesc * max(1, len(group.lifecycles)))()
            for i, lc in enumerate(group.lifecycles):
                bufs = (_CBufferDesc * max(1, len(lc.buffers)))(*[
                    _CBufferDesc(b.layer_id, int(b.role), b.pool_index, int(b.dtype), b.byte_offset, b.bytes,
                                 b.tokens_per_page, b.num_heads, b.head_dim, 0) for b in lc.buffers])
                lcs[i] = _CLifeCycleDesc(lc.lifecycle_id, len(lc.buffers), bufs)
                self._keep.append(bufs)
            self.groups[g] = _CPoolGroupDesc(g, len(group.pools), pools, len(group.lifecycles), lcs)
            self._keep += [pools, lcs]

    @property
    def address(self) -> int:
        return ctypes.addressof(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def poison(self, pool_bases: list[list[int]], id_shift: int = 1_000_003) -> None:
        """Points every pool at ``pool_bases[g][p]`` (memory of the same size), shifts every
        lifecycle ID by ``id_shift`` and empties every buffer list: a valid layout, but another."""
        for g, group in enumerate(self.groups):
            for p in range(group.numPools):
                group.pools[p].base = pool_bases[g][p]
            for i in range(group.numLifeCycles):
                group.lifeCycles[i].lifeCycleId += id_shift
                group.lifeCycles[i].numBuffers = 0


# -- the harness --------------------------------------------------------------------------------


class Harness:
    """One configured codec on one layout and device. See the module docstring."""

    def __init__(self, spec: CodecSpec, params: Mapping[str, Any] | None, device: str, plan: LayoutPlan,
                 seed: int = 0, configure: bool = True):
        self.spec = spec
        self.params = params
        self.device = "cpu" if device == "cpu" else ("cuda:0" if device == "cuda" else device)
        self.plan = plan
        self.rng = np.random.default_rng(seed)
        self.stream = None
        if self.device != "cpu":
            # A stream of its own, never the side stream the harness reads and writes memory on.
            self.stream = gpu.new_stream(self.device)
        self.codec = make_codec(spec, params, self.device)
        self.native = self.codec._live()
        # Every cold buffer and index array handed to the codec lives as long as the codec: a codec
        # that keeps a pointer past its call then fails a clause instead of corrupting the heap.
        self._alive: list[Any] = []
        self._probed: set[Any] = set()
        self._pools: list[list[_Region]] = []
        self.original: list[list[np.ndarray]] = []  # contents per group, pool: (slots, slot_bytes)
        for group in plan.groups:
            regions, contents = [], []
            for p, pool in enumerate(group.pools):
                buffers = [b for b in group.lifecycles[0].buffers if b.pool_index == p]
                data = fill_page_bytes(self.rng, pool.slot_bytes, pool.num_slots, buffers)
                region = _Region(pool.num_slots * pool.slot_bytes + 2 * GUARD_BYTES, self.device)
                region.write(np.concatenate([_canary(self.rng, GUARD_BYTES), data.reshape(-1),
                                             _canary(self.rng, GUARD_BYTES)]))
                regions.append(region)
                contents.append(data)
            self._pools.append(regions)
            self.original.append(contents)
        self.groups = [
            PoolGroupDesc([PoolDesc(r.address + GUARD_BYTES, p.slot_bytes, p.num_slots) for r, p in zip(regions, g.pools)],
                          list(g.lifecycles))
            for regions, g in zip(self._pools, plan.groups)
        ]
        if configure:
            self.configure()

    def close(self) -> None:
        self.sync()
        self.codec.close()
        self._alive.clear()

    # -- contract calls ------------------------------------------------------------------------

    def configure(self, clause: str = "configure-once", *, keep_descriptors: bool = False) -> None:
        """configure() with the harness's layout; with ``keep_descriptors`` through descriptor
        arrays that stay valid as long as the harness (a codec that wrongly keeps reading them
        then works as it would if it were right)."""
        if keep_descriptors:
            raw = RawDescriptors(list(self.groups))
            self._alive.append(raw)
            ok = self.native.configure_raw(raw.address, len(raw))
        else:
            ok = self.native.configure(to_native(self.groups))
        if not ok:
            raise violated(clause, f"configure() rejected a valid layout ({self.plan.describe()}): "
                                   f"{self.native.last_error() or 'no reason given'}")

    def cold_bytes(self, lifecycle: int) -> int:
        return int(self.native.query_cold_page_bytes(lifecycle))

    def location(self, lifecycle: int) -> PageIndexLocation:
        return PageIndexLocation(self.native.query_page_index_location(lifecycle))

    def batching(self, lifecycle: int) -> int:
        return int(self.native.get_batching_layer_group_id(lifecycle))

    def index_array(self, lifecycle: int, dst: np.ndarray, src: np.ndarray) -> Any:
        """The (dst, src) pairs where the lifecycle wants them: numpy on the host, a
        :class:`~kvcodec_sdk.gpu.DeviceArray` on the device."""
        pairs = np.ascontiguousarray(np.stack([np.asarray(dst), np.asarray(src)], axis=1).astype(np.int32).reshape(-1, 2))
        if self.location(lifecycle) == PageIndexLocation.DEVICE:
            # Uploaded on the side stream, never waiting for the codec's (possibly blocked) stream.
            device_pairs = gpu.to_device(pairs, self.device)
            self._alive.append(device_pairs)
            return device_pairs
        self._alive.append(pairs)
        return pairs

    @staticmethod
    def _address(indices: Any) -> int:
        if isinstance(indices, int):
            return indices
        if isinstance(indices, np.ndarray):
            return indices.ctypes.data if indices.size else 0
        if isinstance(indices, gpu.DeviceArray):
            return indices.address if indices.size else 0
        return int(indices.data_ptr()) if indices.numel() else 0

    def call(self, op: str, lifecycle: int, base: int, indices: Any, *, clause: str,
             num_pages: int | None = None, stream: int | None = None) -> bool:
        """One encode/decode call; returns the codec's bool. ``stream`` overrides the stream
        handle passed (the harness stream, or 0 on the CPU)."""
        n = len(indices) if num_pages is None else num_pages
        if stream is None:
            stream = self.stream_handle
        return bool(getattr(self.native, op)(lifecycle, base, self._address(indices), n, stream))

    def must(self, op: str, lifecycle: int, base: int, indices: Any, *, clause: str,
             stream: int | None = None) -> None:
        if not self.call(op, lifecycle, base, indices, clause=clause, stream=stream):
            raise self._page_violation(clause, lifecycle, f"{op}(lifecycle {lifecycle}, {len(indices)} pages) "
                                                          "returned false on valid arguments: "
                                                          f"{self.native.last_error() or 'no reason given'}")

    def configure_then_poison_descriptors(self, *, clause: str) -> list[_Region]:
        """configure() through descriptor arrays the suite owns, then overwrites them (pool bases
        pointing at decoy pools of random bytes, other lifecycle IDs, no buffers). Returns the
        decoys, each with ``snapshot`` (its bytes): nothing may touch them."""
        raw = RawDescriptors(list(self.groups))
        if not self.native.configure_raw(raw.address, len(raw)):
            raise violated(clause, f"configure() rejected a valid layout ({self.plan.describe()}): "
                                   f"{self.native.last_error() or 'no reason given'}")
        decoys, bases = [], []
        for regions in self._pools:
            bases.append([])
            for r in regions:
                decoy = self.scratch_buffer(r.nbytes - 2 * GUARD_BYTES)
                decoys.append(decoy)
                bases[-1].append(decoy.address + GUARD_BYTES)
        raw.poison(bases)
        self._alive += [raw, decoys]
        return decoys

    def scratch_buffer(self, nbytes: int) -> _Region:
        """``nbytes`` bytes plus guards on either side, the memory the codec reads and writes on
        this device (pinned host memory on CUDA), filled with canary bytes; ``snapshot`` holds
        them."""
        region = _Region(nbytes + 2 * GUARD_BYTES, self.device, pinned=True)
        region.snapshot = _canary(self.rng, region.nbytes)
        region.write(region.snapshot)
        self._alive.append(region)
        return region

    def scratch_pairs(self, pairs: Any) -> _Region:
        """Index pairs in memory both a host and a device codec can read (pinned on CUDA)."""
        data = np.ascontiguousarray(np.asarray(pairs, np.int32)).view(np.uint8).reshape(-1)
        region = _Region(data.size, self.device, pinned=True)
        region.write(data)
        self._alive.append(region)
        return region

    def status_buffer(self, n: int) -> _Region:
        """A page-status buffer for decodeChecked(): host memory on the CPU, pinned (mapped) host
        memory on CUDA; pre-filled with 0xFF so an entry the codec never writes shows."""
        region = _Region(n, self.device, pinned=True)
        region.write(np.full(n, 0xFF, np.uint8))
        self._alive.append(region)
        return region

    def must_decode_checked(self, lifecycle: int, base: int, indices: Any, status: _Region, *, clause: str) -> None:
        stream = self.stream_handle
        if not self.native.decode_checked(lifecycle, base, self._address(indices), len(indices), status.address, stream):
            raise violated(clause, f"decodeChecked(lifecycle {lifecycle}, {len(indices)} pages) returned false on "
                                   f"valid arguments: {self.native.last_error() or 'no reason given'}")

    @property
    def stream_handle(self) -> int:
        """The raw handle of the harness stream (0 on the CPU)."""
        return 0 if self.stream is None else gpu.stream_handle(self.stream)

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.sync()

    # -- memory --------------------------------------------------------------------------------

    def cold_buffer(self, lifecycle: int, num_blobs: int, *, clause: str, fill: int | None = None) -> ColdBuffer:
        """``num_blobs`` blobs of the lifecycle with guards, pre-filled with random non-zero
        canary bytes, or with the byte ``fill``."""
        size = self.cold_bytes(lifecycle)
        if size == 0:
            # Whatever the caller checks, a zero size breaks this clause.
            raise violated("cold-size-fixed", f"queryColdPageBytes({lifecycle}) is 0 for a configured lifecycle")
        region = _Region(num_blobs * size + 2 * GUARD_BYTES, self.device, pinned=True)
        region.write(_canary(self.rng, region.nbytes) if fill is None else np.full(region.nbytes, fill, np.uint8))
        self._alive.append(region)
        return ColdBuffer(region, size, num_blobs)

    def hot_raw(self) -> list[list[np.ndarray]]:
        """Every pool's bytes including guards, per group."""
        return [[r.read() for r in regions] for regions in self._pools]

    def group_raw(self, g: int) -> list[np.ndarray]:
        """The bytes of every pool of group ``g``, guards included (``hot_raw()[g]``, read alone)."""
        return [r.read() for r in self._pools[g]]

    def hot_slots(self, raw: np.ndarray, g: int, p: int) -> np.ndarray:
        pool = self.plan.groups[g].pools[p]
        return raw[GUARD_BYTES : GUARD_BYTES + pool.num_slots * pool.slot_bytes].reshape(pool.num_slots, pool.slot_bytes)

    def restore_hot(self) -> None:
        """Rewrites every pool with its original contents (guards kept)."""
        for g, regions in enumerate(self._pools):
            for p, r in enumerate(regions):
                raw = r.read()
                self.hot_slots(raw, g, p)[:] = self.original[g][p]
                r.write(raw)

    def write_hot_pages(self, g: int, slots: np.ndarray, pages: list[np.ndarray]) -> None:
        """Writes ``pages[p]`` (``(len(slots), slot_bytes)``) into ``slots`` of every pool ``p``."""
        for p, r in enumerate(self._pools[g]):
            raw = r.read()
            self.hot_slots(raw, g, p)[np.asarray(slots)] = pages[p]
            r.write(raw)

    def classes(self) -> dict[int, list[int]]:
        """Batching classes: representative -> members (sorted)."""
        out: dict[int, list[int]] = {}
        for lc in self.plan.lifecycle_ids:
            out.setdefault(self.batching(lc), []).append(lc)
        return {k: sorted(v) for k, v in out.items()}

    def fill_hot_slots(self, g: int, slots: np.ndarray, value: int = 0xEE) -> None:
        for p, r in enumerate(self._pools[g]):
            raw = r.read()
            self.hot_slots(raw, g, p)[np.asarray(slots)] = value
            r.write(raw)

    # -- page choice ---------------------------------------------------------------------------

    def pages(self, lifecycle: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, back): ``n`` odd hot slots to encode from and ``n`` even hot slots to decode into,
        so every decode destination has non-destination neighbours."""
        slots = self.plan.groups[self.plan.group_of(lifecycle)].num_slots
        odd, even = np.arange(1, slots, 2), np.arange(0, slots, 2)
        n = min(n, odd.size)
        return self.rng.choice(odd, n, replace=False), self.rng.choice(even, n, replace=False)

    def spread_blobs(self, n: int) -> np.ndarray:
        """Cold destinations 1, 3, 5, ... in a shuffled order: every blob has canary neighbours."""
        return self.rng.permutation(2 * np.arange(n) + 1)

    # -- checks --------------------------------------------------------------------------------

    def check_decoded(self, lifecycle: int, src: np.ndarray, back: np.ndarray, *, clause: str, context: str,
                      reference: list[list[np.ndarray]] | None = None) -> None:
        """Hot slots ``back`` must hold the original pages ``src`` (byte-exact when lossless, else
        within the declared bound as :mod:`.bounds` judges it; exact buffers byte-exact)."""
        g = self.plan.group_of(lifecycle)
        original = self.original[g] if reference is None else reference[g]
        want = [original[p][np.asarray(src)] for p in range(len(original))]
        self.check_pages(lifecycle, want, back, clause=clause, context=context,
                         origin=[f"the page encoded from slot {int(s)}" for s in np.asarray(src)])

    def check_pages(self, lifecycle: int, want: list[np.ndarray], back: np.ndarray, *, clause: str, context: str,
                    origin: list[str], raw: list[np.ndarray] | None = None) -> None:
        """Hot slots ``back`` must hold the pages ``want`` (per pool, ``(len(back), slot_bytes)``):
        byte-exact when lossless; else exact buffers exact, K/V buffers within the suite's own
        bound (:func:`.bounds.suite_error`) and then the codec's ``check_error`` (whose ability
        to fail is probed first)."""
        g = self.plan.group_of(lifecycle)
        raw = self.group_raw(g) if raw is None else raw
        back = np.asarray(back)
        if self.spec.lossless:
            for p in range(len(raw)):
                got = self.hot_slots(raw[p], g, p)[back]
                if np.array_equal(got, want[p]):
                    continue
                for i in range(len(back)):
                    if not np.array_equal(got[i], want[p][i]):
                        raise self._page_violation(clause, lifecycle, f"{context}: lifecycle {lifecycle}, pool {p}: hot slot {int(back[i])} "
                                               f"should hold {origin[i]} byte for byte (the codec declares itself "
                                               f"lossless) but {first_difference(want[p][i], got[i])}")
            return
        check = self.spec.check_error
        if check is None:
            raise violated("round-trip", f"codec {self.spec.name!r} is lossy ({self.spec.error_bound}) but its CodecSpec "
                                   "declares no check_error, so its bound cannot be verified")
        params = self.spec.validate_params(self.params)
        for b in self.plan.buffers_of(lifecycle):
            got = self.hot_slots(raw[b.pool_index], g, b.pool_index)[back, b.byte_offset : b.byte_offset + b.bytes]
            expected = want[b.pool_index][:, b.byte_offset : b.byte_offset + b.bytes]
            where = f"{Role(b.role).name} buffer of layer {b.layer_id} in pool {b.pool_index}"
            exact = bounds.must_be_exact(b)
            if exact:
                for i in np.flatnonzero((got != expected).any(axis=1))[:1]:
                    raise self._page_violation(clause, lifecycle, f"{context}: lifecycle {lifecycle}, {where}, hot slot {int(back[i])} "
                                           f"({origin[i]}): {exact} but {first_difference(expected[i], got[i])}")
                continue
            own = bounds.first_suite_error(expected, got, b)
            if own:
                i, why = own
                raise self._page_violation(clause, lifecycle, f"{context}: lifecycle {lifecycle}, {where} ({DType(b.dtype).name}), hot "
                                       f"slot {int(back[i])} ({origin[i]}) is not an approximation of the original "
                                       f"by the suite's own check, whatever the declared bound: {why}")
            if len(back):
                self._probe_check_error(check, expected[0], b, params)
            for i in self._second_opinion_pages(len(back)):
                reason = check(expected[i].copy(), got[i].copy(), b, params)
                if reason:
                    raise self._page_violation(clause, lifecycle, f"{context}: lifecycle {lifecycle}, {where}, hot slot {int(back[i])} "
                                           f"({origin[i]}) exceeds the declared bound ({self.spec.error_bound}): "
                                           f"{reason}")

    def _second_opinion_pages(self, n: int) -> np.ndarray:
        """The pages of a call that the codec's own ``check_error`` judges after the suite's check
        passed on all of them: every page up to CHECK_ERROR_PAGES, else the first half of that
        many and the other half drawn at random (a Python callback per buffer and page would
        otherwise dominate a 100,000-page call)."""
        if n <= CHECK_ERROR_PAGES:
            return np.arange(n)
        half = CHECK_ERROR_PAGES // 2
        drawn = self.rng.choice(np.arange(half, n), CHECK_ERROR_PAGES - half, replace=False)
        return np.concatenate([np.arange(half), np.sort(drawn)])

    def _page_violation(self, clause: str, lifecycle: int, message: str) -> Any:
        """A violation found by checking pages or a call's result: it names the lifecycle, layout
        and device, so a test of another clause can find out whether plain decode(encode(x))
        fails too (see ``suite._blame_round_trip``)."""
        exc = violated(clause, message)
        exc.page_check = (lifecycle, self.plan.name, self.device)
        return exc

    def _probe_check_error(self, check: Any, original: np.ndarray, b: Any, params: Mapping[str, Any]) -> None:
        # Once per buffer description and harness: the probes cost a few check_error calls.
        if b in self._probed:
            return
        self._probed.add(b)
        problem = bounds.probe_check_error(check, original, b, params)
        if problem:
            raise violated("round-trip", f"codec {self.spec.name!r}, {Role(b.role).name} buffer of layer {b.layer_id} "
                                         f"({DType(b.dtype).name}, {b.bytes} bytes): {problem}")

    def round_trip(self, lifecycle: int, n: int, *, clause: str, context: str = "decode(encode(x))") -> None:
        """Encode ``n`` pages into spread blobs, decode them into other slots, check the pages."""
        src, back = self.pages(lifecycle, n)
        cold = self.cold_buffer(lifecycle, 2 * len(src) + 1, clause=clause)
        dst = self.spread_blobs(len(src))
        self.must("encode", lifecycle, cold.base, self.index_array(lifecycle, dst, src), clause=clause)
        self.sync()
        self.must("decode", lifecycle, cold.base, self.index_array(lifecycle, back, dst), clause=clause)
        self.sync()
        self.check_decoded(lifecycle, src, back, clause=clause, context=context)
        self.restore_hot()

    # -- GPU stream blocking ---------------------------------------------------------------------

    @contextlib.contextmanager
    def blocked_stream(self) -> Iterator[Any]:
        """Holds the harness stream at a wait on a host flag; released on exit."""
        blocker = _native.StreamBlocker(self.stream_handle)
        try:
            yield blocker
        finally:
            blocker.release()
            self.sync()

    def call_with_timeout(self, op: str, lifecycle: int, base: int, indices: Any, *, clause: str,
                          blocker: Any, timeout_s: float = NO_WAIT_TIMEOUT_S) -> None:
        """Runs one call in a thread; fails the clause when it does not return in time while the
        stream is blocked (it then releases the stream so the call can finish)."""
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["ok"] = self.call(op, lifecycle, base, indices, clause=clause)
            except BaseException as exc:  # reported below
                result["error"] = exc

        worker = threading.Thread(target=run, daemon=True)
        started = time.monotonic()
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            blocker.release()
            worker.join(60)
            raise violated(clause, f"{op}(lifecycle {lifecycle}, {len(indices)} pages) did not return within "
                                   f"{timeout_s:.0f} s while earlier work on its stream was pending: it waits for the "
                                   f"stream (or the device) instead of only enqueueing work")
        if "error" in result:
            raise result["error"]
        if not result["ok"]:
            raise violated(clause, f"{op}(lifecycle {lifecycle}) returned false on a blocked stream: "
                                   f"{self.native.last_error() or 'no reason given'}")
        self.last_call_seconds = time.monotonic() - started
