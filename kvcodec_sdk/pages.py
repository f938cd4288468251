"""Levels, page handles, migration results and errors of the KV-cache manager (re-exported by
:mod:`kvcodec_sdk.manager`, which holds :class:`~kvcodec_sdk.manager.KVCacheManager` itself)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from . import _native
from .errors import KvcodecError
from .layout import DataType

if TYPE_CHECKING:
    from .manager import KVCacheManager

_core = _native.kvcm


class _LevelName:
    """``CacheLevel.name``: on a member its enum name ("HOST"); on the class the former helper
    ``CacheLevel.label(level)``, the lower-case name of a level value ("host")."""

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return owner.label
        return obj._name_


class CacheLevel(enum.IntEnum):
    """Storage levels (values of ``kvcm::CacheLevel``)."""

    HOT = 0
    HOST = 1
    DISK = 2
    #: A shared key-value store (:class:`~kvcodec_sdk.RemoteTierConfig`); reached only by an
    #: explicit migration, never by automatic eviction.
    REMOTE = 3

    name = _LevelName()  # type: ignore[assignment]

    @classmethod
    def label(cls, level: int) -> str:
        """Lower-case name of a level value ("hot", "host"); the value itself when unknown."""
        try:
            return cls(int(level))._name_.lower()
        except ValueError:
            return str(level)


class CapacityError(KvcodecError, RuntimeError):
    """A level has too few free slots for the request; nothing was changed."""


class StalePageError(KvcodecError, ValueError):
    """A page handle was freed or dropped (or belongs to another manager)."""


class MigrationError(KvcodecError, RuntimeError):
    """A transfer failed on submission. Transfers before it stay committed
    (``committed_pages``); every other page stays where it was and can be migrated again."""

    def __init__(self, message: str, committed_pages: int):
        super().__init__(message)
        self.committed_pages = committed_pages


#: The former name of :class:`MigrationError` (the C++ core's ``kvcm::MigrationError``).
MigrationFailure = MigrationError


def page_ring_bytes(max_cold_page_bytes: int) -> int:
    """Size of the pinned page ring for the largest cold page: ``max(64 MiB, 3 * max)``, with the
    multiplication checked (OverflowError past 64 bits)."""
    return int(_core.page_ring_bytes(int(max_cold_page_bytes)))


def _content_key(key: Any, where: str) -> bytes:
    if key is None:
        return b""
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"{where} is a {type(key).__name__}; content keys are bytes or str")
    key = bytes(key)
    if not 1 <= len(key) <= 254:
        raise ValueError(f"{where} is {len(key)} bytes; content keys are 1..254 bytes")
    return key


class _native_errors:
    """``with _native_errors():`` raises the native manager's errors as this package's classes.
    A class, not a generator context manager: every manager call enters one, so it stays cheap."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if kind is None:
            return False
        if issubclass(kind, _core.MigrationError):
            raise MigrationError(str(exc), int(getattr(exc, "committed_pages", 0))) from None
        if issubclass(kind, _core.CapacityError):
            raise CapacityError(str(exc)) from None
        if issubclass(kind, _core.StalePageError):
            raise StalePageError(str(exc)) from None
        return False


@dataclass(frozen=True)
class PoolGroupStats:
    """Counters of one pool group of one level (see ``docs/kvcm.md``)."""

    pages_offloaded: int
    bytes_offloaded: int
    pages_onboarded: int
    bytes_onboarded: int
    pages_copied: int
    pages_dropped: int
    codec_calls: int
    codec_seconds: float
    evictions: int = 0  # pages the eviction controller moved out of this group
    drops: int = 0  # pages the eviction controller dropped here (last level only)
    hits: int = 0  # touch() calls on pages in this group
    #: ``pages_dropped`` per reason: the codec's page statuses (``bad_magic``,
    #: ``bad_format_version``, ``bad_header``, ``did_not_fit``, ``bad_checksum``,
    #: ``decode_failed``, ``bad_index``) and the disk tier's (``missing``, ``disk_checksum``).
    dropped_by_reason: dict = field(default_factory=dict)
    #: Hot page bytes of the pages offloaded (what the codec read; ``bytes_offloaded`` is what it
    #: wrote) and of the pages onboarded (what it wrote back; ``bytes_onboarded`` is what it read).
    hot_bytes_offloaded: int = 0
    hot_bytes_onboarded: int = 0
    #: ``codec_calls`` and ``codec_seconds`` split by direction: encode (offloads), decode (onboards).
    encode_calls: int = 0
    decode_calls: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    #: Device time of the codec calls, from timed CUDA events around each call, with
    #: :meth:`KVCacheManager.set_codec_gpu_timing` on: the calls timed (counted once both events
    #: completed, never waited for) and their GPU seconds. Zero on the CPU backend.
    encode_gpu_calls: int = 0
    decode_gpu_calls: int = 0
    encode_gpu_seconds: float = 0.0
    decode_gpu_seconds: float = 0.0

    @property
    def achieved_ratio(self) -> float | None:
        """Hot bytes per cold byte of what was offloaded (``hot_bytes_offloaded /
        bytes_offloaded``: 1.0 for concat, about 2 for fp8 from bf16), or None before an offload."""
        return self.hot_bytes_offloaded / self.bytes_offloaded if self.bytes_offloaded else None


@dataclass(frozen=True)
class MigrationRecord:
    """One submitted transfer, as migration observers receive it."""

    src_level: int
    dst_level: int
    src_pool_group: int
    dst_pool_group: int
    batching_representative: int  # of a codec transfer, else -1
    pages: int
    bytes: int

    @property
    def representative(self) -> int:
        """The former name of :attr:`batching_representative`."""
        return self.batching_representative

    @classmethod
    def _from_native(cls, r: Any) -> MigrationRecord:
        return cls(int(r.src_level), int(r.dst_level), int(r.src_pool_group), int(r.dst_pool_group),
                   int(r.batching_representative), int(r.pages), int(r.bytes))


class PageHandle:
    """One page of a manager. Stable across migrations; stale once freed or dropped."""

    __slots__ = ("_manager", "id")

    def __init__(self, manager: KVCacheManager, page_id: int):
        self._manager = manager
        self.id = int(page_id)

    @classmethod
    def _found(cls, manager: KVCacheManager, ids: np.ndarray) -> list[PageHandle | None]:
        """A handle per native page id of a lookup, None for 0 (no page); built natively without
        ``__init__``'s conversion, as lookups return hundreds at a time."""
        built = _native.kvcm.make_handles(ids, manager, cls)
        if built is None:  # only if the class's __slots__ were changed
            raise TypeError(f"{cls.__name__} must keep '_manager' and 'id' as plain __slots__")
        return built

    @property
    def key(self) -> bytes | None:
        """The page's content key (None when unset). Setting it (bytes or str, 1..254 bytes;
        unique among live pages; before the page goes to disk) names its disk blob, so a later
        manager on the same disk tier can find it (:meth:`~kvcodec_sdk.KVCacheManager.find_on_disk`)."""
        with _native_errors():
            k = self._manager._live().key(self.id)
        return bytes(k) or None

    @key.setter
    def key(self, value: bytes | str | None) -> None:
        self._manager.set_keys([self], [value])

    def _info(self) -> tuple[int, int, int, int]:
        """(lifecycle, level, slot, pool group), read once from the native ``PageInfo``."""
        with _native_errors():
            i = self._manager._live().info(self.id)
        return int(i.lifecycle), int(i.level), int(i.slot), int(i.pool_group)

    @property
    def lifecycle(self) -> int:
        """Layer group (lifecycle) of the page."""
        return self._info()[0]

    @property
    def level(self) -> int:
        """:class:`CacheLevel` value of where the page is now."""
        return self._info()[1]

    @property
    def slot(self) -> int:
        """Slot index of the page in its current level's pool group."""
        return self._info()[2]

    @property
    def pool_group(self) -> int:
        """Pool group at the page's current level (groups of different levels are unrelated)."""
        return self._info()[3]

    @property
    def is_live(self) -> bool:
        """False once the page was freed or dropped (the handle is then stale)."""
        return bool(self._manager._live().is_live(self.id))

    @property
    def in_flight(self) -> bool:
        """True while a non-blocking disk transfer holds the page (see
        :class:`PendingMigration`): it is still at :attr:`level`, its source, until the transfer
        commits."""
        with _native_errors():
            return bool(self._manager._live().info(self.id).in_flight)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PageHandle) and other._manager is self._manager and other.id == self.id

    def __hash__(self) -> int:
        return hash((id(self._manager), self.id))

    def __repr__(self) -> str:
        if not self.is_live:
            return f"<PageHandle {self.id:#x} stale>"
        lc, level, slot, group = self._info()
        return f"<PageHandle {self.id:#x} layer group {lc} at {CacheLevel.label(level)} slot {slot} (pool group {group})>"


class PageList(Sequence[PageHandle]):
    """Pages as a numpy array of ids (``ids``); indexing gives :class:`PageHandle` objects."""

    __slots__ = ("_manager", "ids")

    def __init__(self, manager: KVCacheManager, ids: np.ndarray):
        self._manager = manager
        self.ids = np.ascontiguousarray(ids, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice) or isinstance(i, np.ndarray) or isinstance(i, list):
            return PageList(self._manager, self.ids[i])
        return PageHandle(self._manager, int(self.ids[i]))

    def __iter__(self) -> Iterator[PageHandle]:
        for x in self.ids.tolist():
            yield PageHandle(self._manager, x)

    def __add__(self, other: PageList) -> PageList:
        return PageList(self._manager, np.concatenate([self.ids, other.ids]))

    def __repr__(self) -> str:
        return f"<PageList of {len(self)} pages>"


@dataclass(frozen=True)
class MigrationResult:
    """``moved``: pages now at the destination; ``dropped``: cold pages the envelope check (or
    a missing or corrupt disk blob) dropped (their handles are stale: the engine sees a cache
    miss); ``failed``: pages of a non-blocking migration whose disk transfer failed (they stay at
    their source level and can be retried), with ``error`` the first failure's message."""

    moved: int
    dropped: PageList
    failed: PageList | None = None
    error: str = ""


@dataclass(frozen=True)
class PrefetchStats:
    """Counters of :meth:`KVCacheManager.prefetch` (pages): ``issued`` submitted for reading,
    ``completed`` landed at the host level, ``used`` onboarded to the hot level before leaving
    the host level, ``wasted`` freed, dropped or evicted unused, ``skipped`` not prefetched (not
    at the disk level, in flight, a repeat, over the budget or no free host slot),
    ``cancelled`` given up by :meth:`PendingMigration.cancel`, ``failed`` whose read failed or
    whose blob was missing or corrupt."""

    issued: int
    completed: int
    used: int
    wasted: int
    skipped: int
    cancelled: int
    failed: int


class PendingMigration:
    """A non-blocking migration (``migrate/evict/onboard(..., blocking=False)``) or a
    :meth:`KVCacheManager.prefetch`: its disk transfers finish on the manager's I/O thread.

    Until a transfer commits its pages stay at their source level and are in flight
    (:attr:`PageHandle.in_flight`): never evicted, and a call that frees, migrates or re-keys one
    first waits for it. Thread-safe; keeps its manager's core alive.
    """

    def __init__(self, manager: Any, native: Any, pages: PageList, prefetch: bool = False):
        self._manager = manager
        self._native = native
        self._prefetch = prefetch
        self.pages = pages  #: The pages the call was given (a prefetch by content key: those found).

    @property
    def requested(self) -> int:
        """Number of pages the call was given."""
        return int(self._native.requested)

    def done(self) -> bool:
        """True once every transfer committed or rolled back (never blocks)."""
        with _native_errors():
            return bool(self._native.done())

    def wait(self, timeout: float | None = None) -> MigrationResult:
        """Blocks until :meth:`done` and returns the :class:`MigrationResult`.

        A migration whose disk transfer failed raises :class:`MigrationError` (its
        ``committed_pages`` moved, every other page stayed at its source and can be retried); a
        prefetch never raises for that (its failures are counted in
        :meth:`KVCacheManager.prefetch_stats`). ``timeout`` (seconds): TimeoutError when not done
        by then, the migration still going on.
        """
        if timeout is not None:
            deadline = time.monotonic() + float(timeout)
            while not self.done():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the migration of {self.requested} pages is not done after {timeout} s")
                time.sleep(0.0005)
        with _native_errors():
            r = self._native.wait()
        result = self._manager._result(r)
        if not self._prefetch and len(result.failed):
            raise MigrationError(
                f"{len(result.failed)} of {self.requested} pages failed to migrate and stay at their source "
                f"({result.moved} moved): {result.error}", result.moved)
        if not self._prefetch and result.error:
            # Every page landed; something after the commit (a migration observer) raised.
            raise MigrationError(f"all {result.moved} pages moved, then: {result.error}", result.moved)
        return result

    def cancel(self) -> None:
        """Prefetch: gives up the reads not yet started (their pages stay on disk, counted
        ``cancelled``); a started read still lands. A migration cannot be cancelled."""
        if not self._prefetch:
            raise ValueError("only a prefetch can be cancelled; a migration's pages land or stay at their source")
        self._native.cancel()

    def __repr__(self) -> str:
        kind = "prefetch" if self._prefetch else "migration"
        return f"<PendingMigration: {kind} of {self.requested} pages, {'done' if self.done() else 'in flight'}>"


class _HostArray:
    """Exposes raw host memory through ``__array_interface__``; keeps its owner alive."""

    def __init__(self, owner: Any, ptr: int, shape: tuple, typestr: str = "|u1"):
        self._owner = owner
        self.__array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3}


class _CudaArray:
    """Exposes raw device memory through ``__cuda_array_interface__``; keeps its owner alive."""

    def __init__(self, owner: Any, ptr: int, shape: tuple, typestr: str = "|u1"):
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3, "strides": None, "stream": None,
        }


def _pool_views(pools: list, owner: Any, device: str, ordinal: int, on_device: bool, framework: str) -> list:
    """One ``(slots, slot_bytes)`` uint8 view per ``(address, slot_bytes, slots)`` pool, of
    ``framework``'s type, keeping ``owner`` alive (device pools when ``on_device``)."""
    from .gpu import DeviceArray

    out: list = []
    for ptr, slot_bytes, slots in pools:
        shape = (int(slots), int(slot_bytes))
        if on_device and framework == "cuda":
            out.append(DeviceArray(ptr, shape, np.uint8, kind="device", device_id=ordinal, owner=owner))
        elif on_device:
            import torch

            out.append(torch.as_tensor(_CudaArray(owner, ptr, shape), device=device))
        else:
            arr = np.asarray(_HostArray(owner, ptr, shape))
            if framework == "torch":
                import torch

                arr = torch.from_numpy(arr)
            out.append(arr)
    return out


def _level_stats(core: Any, level: int, reset_peaks: bool) -> list[dict]:
    """KVCacheManager.level_stats of the native manager ``core``."""
    if reset_peaks:
        peaks = [int(p.peak_used_slots) for p in core.get_and_reset_iteration_peak_block_stats(level)]
    else:
        peaks = [int(core.peak(level, g)) for g in range(int(core.num_pool_groups(level)))]
    out = []
    for g, st in enumerate(core.stats(level)):
        counts = core.slots(level, g)
        slots, free = int(counts.num_slots), int(counts.free_slots)
        out.append({
            "slots": slots, "used": slots - free, "peak": peaks[g], "evictable": int(core.evictable(level, g)),
            "evictions": int(st["evictions"]), "drops": int(st["drops"]), "hits": int(st["hits"]),
        })
    return out


def _page_ids(self: KVCacheManager, pages: Any, what: str = "pages") -> np.ndarray:
    """The page ids of ``pages`` (a PageList, a list or tuple of handles, one handle, ids, or any
    iterable of handles) for a call of manager ``self``; the error names what is wrong."""
    kind = type(pages)
    if kind is list or kind is tuple:  # handles, read natively: one pass over their slots
        ids = _native.kvcm.handle_ids(pages, self, PageHandle)
        if ids is not None:
            return ids
    elif kind is PageList or isinstance(pages, PageList):
        if pages._manager is not self:
            raise ValueError(f"{what} belong to another KVCacheManager")
        return pages.ids
    if isinstance(pages, PageHandle):
        if pages._manager is not self:
            raise ValueError(f"{what} belongs to another KVCacheManager")
        return np.array([pages.id], dtype=np.uint64)
    if isinstance(pages, np.ndarray):
        return np.ascontiguousarray(pages, dtype=np.uint64)
    pages = pages if isinstance(pages, list) else list(pages)
    ids = np.fromiter([p.id for p in pages if isinstance(p, PageHandle) and p._manager is self], np.uint64)
    if len(ids) != len(pages):  # one pass over the handles above; now say which is wrong
        for i, p in enumerate(pages):
            if not isinstance(p, PageHandle) or p._manager is not self:
                raise TypeError(f"{what}[{i}] is {p!r}; expected a PageHandle of this manager")
    return ids


def _shared_keys(config: Any, keys: Any, lifecycle: int | None) -> tuple[list[bytes], list[int]]:
    """The checked keys of a shared-tier lookup of a manager of ``config``, and the lifecycle to
    look under per key (-1: every one)."""
    raw = _lookup_keys(keys)
    if config.shared is None:
        raise ValueError("this KVCacheManager has no shared host tier: set KVCacheConfig.shared")
    if lifecycle is not None and not 0 <= int(lifecycle) < len(config.layer_groups):
        raise ValueError(f"lifecycle is {lifecycle!r}; configured layer groups are 0..{len(config.layer_groups) - 1}")
    return raw, [-1 if lifecycle is None else int(lifecycle)] * len(raw)


def _lookup_keys(keys: Any) -> list[bytes]:
    """Content keys to look up, as bytes; ValueError for a missing or empty one."""
    raw = list(keys)
    if _native.kvcm.plain_keys(raw):
        return raw  # the common case, checked natively without a message built per key
    raw = [_content_key(k, f"keys[{i}]") for i, k in enumerate(raw)]
    if any(not k for k in raw):
        raise ValueError("keys contains None or an empty key; every key must be 1..254 bytes")
    return raw


_NUMPY_DTYPES = {
    DataType.UINT8: np.uint8, DataType.INT8: np.int8, DataType.FLOAT16: np.float16, DataType.BFLOAT16: np.uint16,
    DataType.FLOAT32: np.float32, DataType.FLOAT8_E4M3: np.uint8, DataType.FLOAT8_E5M2: np.uint8, DataType.INT32: np.int32,
}

def _resolve_framework(device: str, framework: str) -> str:
    """What ``framework`` ('auto', 'numpy', 'torch' or 'cuda') gives for a manager on ``device``."""
    if framework not in ("auto", "numpy", "torch", "cuda"):
        raise ValueError(f"framework is {framework!r}; use 'auto', 'numpy', 'torch' or 'cuda'")
    on_gpu = device != "cpu"
    if framework == "numpy" and on_gpu:
        raise ValueError("hot pools of a CUDA manager are device memory; use framework='cuda', 'torch' or 'auto'")
    if framework == "cuda" and not on_gpu:
        raise ValueError("framework='cuda' gives device memory; this manager's hot pools are host memory "
                         "(use 'numpy', 'torch' or 'auto')")
    if framework != "auto":
        return framework
    try:
        import torch  # noqa: F401
    except ImportError:
        return "cuda" if on_gpu else "numpy"
    return "torch"


# Element types numpy lacks, by the names kvcodec_sdk.gpu.DeviceArray exports through DLPack.
_DEVICE_DTYPES = {DataType.BFLOAT16: "bfloat16", DataType.FLOAT8_E4M3: "float8_e4m3fn", DataType.FLOAT8_E5M2: "float8_e5m2"}


def _torch_dtype(torch: Any, dtype: DataType) -> Any:
    return {
        DataType.UINT8: torch.uint8, DataType.INT8: torch.int8, DataType.FLOAT16: torch.float16, DataType.BFLOAT16: torch.bfloat16,
        DataType.FLOAT32: torch.float32, DataType.FLOAT8_E4M3: torch.float8_e4m3fn, DataType.FLOAT8_E5M2: torch.float8_e5m2,
        DataType.INT32: torch.int32,
    }[dtype]


