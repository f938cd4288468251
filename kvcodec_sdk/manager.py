"""``KVCacheManager``: the Python facade of the KV-cache manager's C++ core.

The manager owns a hot tier (kernel-facing pools: GPU memory, or host memory on the CPU backend)
and a host tier (pinned, GPU-mapped host memory holding fixed-size cold pages), and runs every
migration through the cold-page codec it owns::

    from kvcodec_sdk import KVCacheManager, KVCacheConfig, LayerGroupConfig, BufferDesc, BufferRole

    config = KVCacheConfig(
        layer_groups=[LayerGroupConfig([BufferDesc(layer_id=l, role=r, bytes=16384)
                                        for l in range(4) for r in (BufferRole.KEY, BufferRole.VALUE)])],
        gpu_quota=1 << 30, host_quota=4 << 30)
    manager = KVCacheManager(config)                 # default lossless concat codec
    pages = manager.allocate(0, 128)                 # hot pages of layer group 0
    manager.evict(pages)                             # hot -> host (encode)
    manager.onboard(pages)                           # host -> hot (decode)

Page handles keep their identity across migrations: a :class:`PageHandle` (or a page of a
:class:`PageList`) names the logical page; its level and slot change as it moves. Freeing (or a
cold page dropped by the envelope check) makes every handle of it stale.

Everything per page happens in C++: a :class:`PageList` is a numpy array of page ids.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, overload

import numpy as np

from . import _interop, _native
from ._boundary import buffer_from_native
from .codec import Codec
from .kvcm_config import KVCacheConfig
from .layout import BufferDesc, BufferLayout, PageIndexLocation

__all__ = [
    "CacheLevel",
    "BufferLayout",
    "CapacityError",
    "KVCacheManager",
    "MigrationError",
    "MigrationFailure",
    "MigrationRecord",
    "MigrationResult",
    "PageHandle",
    "PageList",
    "PendingMigration",
    "PoolGroupStats",
    "PrefetchStats",
    "StalePageError",
    "page_ring_bytes",
]

from .pages import (  # noqa: F401  (re-exported: the public names live in kvcodec_sdk.manager)
    _DEVICE_DTYPES,
    _NUMPY_DTYPES,
    CacheLevel,
    CapacityError,
    MigrationError,
    MigrationFailure,
    MigrationRecord,
    MigrationResult,
    PageHandle,
    PageList,
    PendingMigration,
    PoolGroupStats,
    PrefetchStats,
    StalePageError,
    _content_key,
    _core,
    _CudaArray,
    _HostArray,
    _level_stats,
    _LevelName,
    _lookup_keys,
    _native_errors,
    _page_ids,
    _pool_views,
    _resolve_framework,
    _shared_keys,
    _torch_dtype,
    page_ring_bytes,
)

if TYPE_CHECKING:
    from .storage_profile import StorageProfile

log = logging.getLogger("kvcodec_sdk.manager")


class KVCacheManager:
    """A KV-cache manager with a hot and a host tier and an owned cold-page codec.

    :param config: A :class:`~kvcodec_sdk.KVCacheConfig`.
    :param cold_page_codec: ``None`` (the default lossless ``concat`` codec, created internally),
        a :class:`~kvcodec_sdk.Codec` (consumed at once, whether construction succeeds or fails),
        a codec name, or ``(name, params)``.
    """

    def __init__(self, config: KVCacheConfig, cold_page_codec: Codec | str | tuple | None = None):
        # Consumed first, before any validation: the caller's wrapper is dead whatever happens next.
        native = cold_page_codec._consume() if isinstance(cold_page_codec, Codec) else None
        self._core_obj = None
        self._disk_profile: StorageProfile | None = None
        self._remote: Any = None  # The remote level's worker (kvcodec_sdk.remote.level), or None.
        self._identity: Any = None
        try:
            self._core_obj = self._construct(config, cold_page_codec, native)
        finally:
            if native is not None and self._core_obj is None and not native.released:
                native.release()
        self.config = config
        self._pools_cache: dict[tuple, list] = {}

    def _construct(self, config: KVCacheConfig, codec: Any, native: Any) -> Any:
        if not isinstance(config, KVCacheConfig):
            raise TypeError(f"config is a {type(config).__name__}; pass a kvcodec_sdk.KVCacheConfig")
        config.validate()
        device = config.device
        if device == "auto":
            if isinstance(codec, Codec):
                device = codec.device
            else:
                device = "cuda:0" if _native.driver_info()["device_count"] > 0 else "cpu"
        label, ordinal = _interop.parse_device(device)
        spec = None
        if isinstance(codec, Codec):
            spec = codec.spec
        elif codec is not None:
            from .registry import create_codec

            if isinstance(codec, str):
                name, params = codec, None
            elif isinstance(codec, tuple) and len(codec) == 2 and isinstance(codec[0], str):
                name, params = codec
            else:
                raise TypeError(
                    f"cold_page_codec is a {type(codec).__name__}; pass None, a kvcodec_sdk.Codec, a codec name "
                    "or (name, params)"
                )
            created = create_codec(name, params, device=label)
            spec = created.spec
            native = created._consume()
        envelope = int(spec.format_version) if spec is not None and spec.envelope else -1
        identity = None
        if config.disk is not None or config.remote is not None or config.shared is not None:
            from .disk import CodecIdentity

            # Recorded per region: a restart with another codec, parameters or layer groups
            # invalidates the region instead of decoding foreign blobs.
            layout = config.layout_description()
            if isinstance(codec, Codec):
                identity = CodecIdentity.from_codec(codec, layout)
            elif codec is not None:
                identity = CodecIdentity.from_codec(created, layout)
            else:
                identity = CodecIdentity.from_name("concat", None, layout)
        profile = None
        if config.disk is not None:
            from .storage_profile import probe_storage

            profile = probe_storage(config.disk.path)
            for note in profile.warnings:
                log.warning("disk tier %s: %s", config.disk.path, note)
        self._disk_profile = profile
        queue = _core.RemoteQueue() if config.remote is not None else None
        try:
            core = _core.KvcmCore(config.to_native(envelope, identity, profile, queue), native, ordinal)
        except BaseException:
            if native is not None and not native.released:
                native.release()
            raise
        self._identity = identity
        if config.remote is not None:
            try:
                from .remote.level import start_worker

                self._remote = start_worker(config.remote, identity, queue)
            except BaseException:
                core.close_tiers()
                raise
        self._label = label
        self._ordinal = ordinal
        self._codec_name = spec.name if spec is not None else "concat"
        return core

    # -- internals -----------------------------------------------------------------------------

    def _live(self) -> Any:
        if self._core_obj is None:
            raise RuntimeError("this KVCacheManager was closed")
        return self._core_obj

    _ids = _page_ids  # pages -> page ids (pages.py)

    # -- pages ---------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """``"cpu"`` (host backend) or ``"cuda:N"``."""
        return str(self._live().device)

    @property
    def codec_name(self) -> str:
        """Registry name of the manager's cold-page codec."""
        return self._codec_name

    @property
    def num_layer_groups(self) -> int:
        """Number of layer groups (lifecycles) in the configuration."""
        return int(self._live().num_lifecycles())

    def allocate(self, lifecycle: int, count: int, *, stream: Any = None,
                 keys: Sequence[bytes | str | None] | None = None) -> PageList:
        """Allocates ``count`` hot pages of a layer group.

        The slots may still be read by the transfer that vacated them: with ``stream`` that
        stream waits for it (write the pages on that stream); without, the host waits.
        ``keys`` optionally gives each page a content key (see :attr:`PageHandle.key`).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count is {count!r}; it must be an integer >= 0")
        if keys is not None and len(keys) != count:
            raise ValueError(f"keys has {len(keys)} entries; it needs one per page ({count})")
        raw = None if keys is None else [_content_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
        handle = None if stream is None else _interop.stream_handle(stream)
        with _native_errors():
            # The keys are set with the allocation: an eviction by another thread never finds a
            # new page keyless (then unable to take its key at a cold level).
            ids = self._live().allocate(int(lifecycle), count, handle, raw)
        return PageList(self, ids)

    def set_keys(self, pages: Any, keys: Sequence[bytes | str | None]) -> None:
        """Sets the content key of each page (None clears it); see :attr:`PageHandle.key`."""
        ids = self._ids(pages)
        if len(keys) != len(ids):
            raise ValueError(f"keys has {len(keys)} entries; it needs one per page ({len(ids)})")
        core = self._live()
        for i, (page_id, key) in enumerate(zip(ids, keys)):
            raw = _content_key(key, f"keys[{i}]")
            with _native_errors():
                core.set_key(int(page_id), raw)

    def find_on_disk(self, keys: Sequence[bytes | str]) -> list[PageHandle | None]:
        """Pages present in the disk tier under each content key, or None per missing key.

        Pages a previous manager left on the same disk tier (same codec and layer groups) are
        claimed here: they become disk-level pages of this manager, ready to be onboarded with
        ``onboard(pages, source=CacheLevel.DISK)`` (prefix reuse across restarts).
        """
        raw = _lookup_keys(keys)
        with _native_errors():
            ids = self._live().find_on_disk(raw)
        return PageHandle._found(self, ids)

    def find_remote(self, keys: Sequence[bytes | str], *, lifecycle: int | None = None) -> list[PageHandle | None]:
        """Pages in the remote tier under each content key, or None per key the store does not hold.

        A key that a live page of this manager holds at the remote level gives that page; any
        other key is looked up in the store (one batched existence check per lifecycle tried:
        ``lifecycle``, or every lifecycle in order when None) and becomes a remote-level page of
        this manager, ready to be onboarded with ``onboard(pages, source=CacheLevel.REMOTE)``. This
        is how a prefix computed by another instance (same codec and layer groups) is reused. A
        blob the store drops between this call and the onboard is a miss then (the page is
        dropped). Raises :class:`~kvcodec_sdk.remote.RemoteError` when the store fails the lookup.
        """
        from .remote.level import find

        raw = _lookup_keys(keys)
        if self._remote is None:
            raise ValueError("this KVCacheManager has no remote tier: set KVCacheConfig.remote")
        with _native_errors():
            ids = find(self._remote, self._live(), raw, lifecycle)
        return PageHandle._found(self, ids)

    def find_shared(self, keys: Sequence[bytes | str], *, lifecycle: int | None = None) -> list[PageHandle | None]:
        """Pages in the shared host tier (``KVCacheConfig.shared``) under each content key, or None
        per key no manager on the host published there.

        A key a live page of this manager holds at the host level gives that page. Any other key
        is looked up in the cache daemon (one batched lookup per lifecycle tried: ``lifecycle``,
        or every lifecycle in order when None); a hit becomes a host-level page of this manager in
        the very arena slot another manager's encode wrote, pinned there until the page leaves
        the host level, ready for ``onboard(pages, source=CacheLevel.HOST)``. Its blob is checked
        (header, and CRC-32C unless ``verify_crc`` is off) before it is decoded: one that fails is
        dropped, never decoded. Raises ValueError without a shared host tier.
        """
        with _native_errors():
            ids = self._live().find_shared(*_shared_keys(self.config, keys, lifecycle))
        return PageHandle._found(self, ids)

    def prefetch_shared(self, keys: Sequence[bytes | str], *, lifecycle: int | None = None) -> int:
        """Asks the cache daemon to read the pages of ``keys`` from its long tier into L2 in the
        background, so that a later :meth:`find_shared` finds them there instead of waiting for the
        files (keys already in L2, or without a page file, are skipped). Returns how many reads were
        queued: 0 when the daemon has no long tier or stopped answering. ``lifecycle`` as in
        :meth:`find_shared`. Raises ValueError without a shared host tier."""
        with _native_errors():
            return int(self._live().prefetch_shared(*_shared_keys(self.config, keys, lifecycle)))

    def shared_stats(self) -> dict:
        """The shared host tier's counters: ``published`` (pages committed to the daemon under
        their keys), ``found`` / ``missed`` / ``rejected`` (keys of :meth:`find_shared` hit,
        absent, or refused because the daemon's blob is not of the level's size; a blob that
        fails its check is dropped when onboarded), ``released`` (slots given up
        when their pages left), ``leased`` (slots taken from the daemon), ``connected`` (False
        once the daemon stopped answering: the host tier then goes on unshared) and ``reattached``
        (:meth:`reattach_shared` calls that moved it into a restarted daemon's arena). Raises
        ValueError without a shared host tier."""
        with _native_errors():
            stats = self._live().shared_stats()
        if stats is None:
            raise ValueError("this KVCacheManager has no shared host tier: set KVCacheConfig.shared")
        return dict(stats)

    def reattach_shared(self) -> bool:
        """Shares the host tier again after its cache daemon went away (``shared_stats()``'s
        ``connected`` is False): joins the daemon answering at the socket now, copies every
        host-level page into its arena (each transfer in flight is waited for first; the pages keep
        their handles) and lets the old arena go. True when it re-attached; False, nothing changed,
        while connected or while no daemon answers or can lease slots for the pages. Costs a copy of
        the host tier: call it between steps. Raises ValueError without a shared host tier."""
        if self.config.shared is None:
            raise ValueError("this KVCacheManager has no shared host tier: set KVCacheConfig.shared")
        with _native_errors():
            return bool(self._live().reattach_shared())

    def remote_stats(self) -> dict:
        """The remote tier's counters: the backend's (``puts``, ``hits``, ``misses``, ``mismatches``,
        ``corrupt``, ... see :class:`~kvcodec_sdk.remote.RemoteStats`), the worker's
        (:class:`~kvcodec_sdk.remote.level.RemoteLevelStats`), and ``queued`` / ``in_progress``
        batches now, and ``offers``: keys found in the store by :meth:`find_remote` that no page
        claimed yet (0 between calls). Raises ValueError without a remote tier."""
        if self._remote is None:
            raise ValueError("this KVCacheManager has no remote tier: set KVCacheConfig.remote")
        out: dict = dict(self._remote.backend.stats.as_dict())
        out.update(self._remote.stats.as_dict())
        out["queued"] = int(self._remote._queue.queued)
        out["in_progress"] = int(self._remote._queue.taken)
        out["offers"] = int(self._live().remote_offers())
        return out

    @staticmethod
    def remote_identity(config: KVCacheConfig, cold_page_codec: Any = None) -> Any:
        """The :class:`~kvcodec_sdk.disk.CodecIdentity` a manager of ``config`` and
        ``cold_page_codec`` (as the constructor takes it) writes into its remote and disk tiers:
        build a :class:`~kvcodec_sdk.remote.RemoteBackend` with it, or let
        :class:`~kvcodec_sdk.RemoteTierConfig` take a callable that receives it."""
        from .disk import CodecIdentity

        return CodecIdentity.coerce(cold_page_codec, config.layout_description())

    def unclaimed_on_disk(self) -> int:
        """Number of keyed pages a previous manager left on the disk tier that no page claimed
        yet (they hold disk slots until claimed or forgotten)."""
        return int(self._live().unclaimed_on_disk())

    def forget_unclaimed_on_disk(self) -> int:
        """Erases the unclaimed pages a previous manager left on the disk tier; returns how many."""
        with _native_errors():
            return int(self._live().forget_unclaimed_on_disk())

    def free(self, pages: Any) -> None:
        """Frees pages at whatever level they are; their handles become stale."""
        with _native_errors():
            self._live().free(self._ids(pages))

    @overload
    def migrate(self, pages: Any, level: int, *, stream: Any = None, blocking: Literal[True] = True) -> MigrationResult: ...

    @overload
    def migrate(self, pages: Any, level: int, *, stream: Any = None, blocking: Literal[False]) -> PendingMigration: ...

    @overload
    def migrate(self, pages: Any, level: int, *, stream: Any = None, blocking: bool) -> MigrationResult | PendingMigration: ...

    def migrate(self, pages: Any, level: int, *, stream: Any = None,
                blocking: bool = True) -> MigrationResult | PendingMigration:
        """Moves pages to ``level`` (:class:`CacheLevel`), each into a newly allocated slot.

        Hot -> host encodes, host -> hot decodes, hot -> hot copies per pool and host -> host
        copies raw blobs (relocation, e.g. for defragmentation). Work is ordered on ``stream``
        (anything with ``__cuda_stream__``, a ``torch.cuda.Stream`` or a raw handle); None or the
        legacy default stream selects the manager's own stream, which is ordered after work on
        the legacy default stream. The call returns once the work is submitted: call
        :meth:`synchronize` before reading moved bytes on the host.

        Transfers to or from the disk tier block until durable (reads: landed); a failure raises
        :class:`MigrationError` with the failed pages left at their source. With
        ``blocking=False`` the call returns a :class:`PendingMigration` once everything is
        submitted: disk writes and disk -> host reads finish on the manager's I/O thread while the
        caller goes on (see ``docs/disk-tier.md``).
        """
        return self._migrate(pages, level, stream, None, blocking)

    @overload
    def evict(self, pages: Any, *, stream: Any = None, level: int = CacheLevel.HOST, blocking: Literal[True] = True) -> MigrationResult: ...

    @overload
    def evict(self, pages: Any, *, stream: Any = None, level: int = CacheLevel.HOST, blocking: Literal[False]) -> PendingMigration: ...

    @overload
    def evict(self, pages: Any, *, stream: Any = None, level: int = CacheLevel.HOST, blocking: bool) -> MigrationResult | PendingMigration: ...

    def evict(self, pages: Any, *, stream: Any = None, level: int = CacheLevel.HOST,
              blocking: bool = True) -> MigrationResult | PendingMigration:
        """Hot -> ``level`` (host by default, or :attr:`CacheLevel.DISK`) for pages that are all
        hot; ``blocking`` as in :meth:`migrate`."""
        return self._migrate(pages, level, stream, CacheLevel.HOT, blocking)

    @overload
    def onboard(self, pages: Any, *, stream: Any = None, source: int = CacheLevel.HOST, blocking: Literal[True] = True) -> MigrationResult: ...

    @overload
    def onboard(self, pages: Any, *, stream: Any = None, source: int = CacheLevel.HOST, blocking: Literal[False]) -> PendingMigration: ...

    @overload
    def onboard(self, pages: Any, *, stream: Any = None, source: int = CacheLevel.HOST, blocking: bool) -> MigrationResult | PendingMigration: ...

    def onboard(self, pages: Any, *, stream: Any = None, source: int = CacheLevel.HOST,
                blocking: bool = True) -> MigrationResult | PendingMigration:
        """``source`` (host by default, or :attr:`CacheLevel.DISK`) -> hot for pages that are all
        at that level; ``blocking`` as in :meth:`migrate`."""
        return self._migrate(pages, CacheLevel.HOT, stream, source, blocking)

    def _migrate(self, pages: Any, level: int, stream: Any, required: int | None,
                 blocking: bool = True) -> MigrationResult | PendingMigration:
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking is {blocking!r}; it must be True or False")
        ids = self._ids(pages)
        handle = _interop.stream_handle(stream)
        with _native_errors():
            if not blocking:
                return PendingMigration(self, self._live().submit(ids, int(level), handle, required), PageList(self, ids))
            r = self._live().migrate(ids, int(level), handle, required)
        return self._result(r)

    def _result(self, r: Any) -> MigrationResult:
        return MigrationResult(int(r.moved), PageList(self, r.dropped), PageList(self, r.failed), str(r.error))

    def prefetch(self, pages: Any, *, max_bytes: int | None = None) -> PendingMigration:
        """Warms the host tier from the disk tier in the background and returns at once.

        ``pages`` are page handles, or content keys (the pages :meth:`find_on_disk` finds under
        them, missing keys skipped: the handles are the returned ``PendingMigration.pages``). Pages at the disk level are read into free host slots
        on the manager's I/O thread; pages elsewhere, already in flight, beyond ``max_bytes`` of
        host blobs prefetched and not yet used, or without a free host slot are skipped
        (prefetch never evicts). A later ``onboard(pages, source=CacheLevel.HOST)`` then decodes
        from memory; :meth:`prefetch_stats` counts what was issued, used and wasted.
        """
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                      or max_bytes <= 0):
            raise ValueError(f"max_bytes is {max_bytes!r}; it must be an integer > 0, or None for no limit")
        if isinstance(pages, (list, tuple)) and pages and all(isinstance(k, (bytes, str)) for k in pages):
            pages = [p for p in self.find_on_disk(pages) if p is not None]
        ids = self._ids(pages)
        with _native_errors():
            return PendingMigration(self, self._live().prefetch(ids, int(max_bytes or 0)), PageList(self, ids),
                                    prefetch=True)

    def prefetch_stats(self) -> PrefetchStats:
        """Counters of :meth:`prefetch` since the manager was created."""
        s = self._live().prefetch_stats()
        return PrefetchStats(int(s.issued), int(s.completed), int(s.used), int(s.wasted), int(s.skipped),
                             int(s.cancelled), int(s.failed))

    def in_flight_transfers(self) -> int:
        """Non-blocking disk transfers submitted and not yet committed."""
        return int(self._live().in_flight_transfers())

    # -- eviction ------------------------------------------------------------------------------

    def touch(self, pages: Any) -> None:
        """Marks pages as just used: they become the last eviction candidates of their level and
        priority. Counts one hit per page at its current level and pool group."""
        with _native_errors():
            self._live().touch(self._ids(pages))

    def pin(self, pages: Any) -> None:
        """Pins pages (in use): the eviction controller never evicts or drops them. Pins nest;
        explicit migrations still move pinned pages."""
        with _native_errors():
            self._live().pin(self._ids(pages), True)

    def unpin(self, pages: Any) -> None:
        """Undoes one :meth:`pin` per page (ValueError for a page that is not pinned)."""
        with _native_errors():
            self._live().pin(self._ids(pages), False)

    @contextlib.contextmanager
    def pinned(self, pages: Any):
        """``with manager.pinned(pages): ...`` pins the pages for the block."""
        self.pin(pages)
        try:
            yield pages
        finally:
            self.unpin(pages)

    def pins(self, page: PageHandle) -> int:
        """How many times a page is pinned."""
        with _native_errors():
            return int(self._live().pins(page.id))

    def set_priority(self, pages: Any, priority: int) -> None:
        """Eviction priority of pages (a 32-bit integer, default 0): within a pool group, lower
        priorities are evicted first, least recently used first within one priority."""
        if isinstance(priority, bool) or not isinstance(priority, int) or not -2**31 <= priority < 2**31:
            raise ValueError(f"priority is {priority!r}; it must be a 32-bit integer")
        with _native_errors():
            self._live().set_priority(self._ids(pages), priority)

    def evictable(self, level: int, pool_group: int) -> int:
        """Unpinned pages of a pool group of ``level`` (the eviction candidates)."""
        return int(self._live().evictable(int(level), int(pool_group)))

    def make_room(self, level: int, pool_group: int, free_slots: int, *, stream: Any = None) -> None:
        """Evicts until ``free_slots`` slots of a pool group of ``level`` are free: its
        least-recently-used unpinned pages (lowest priority first) move to the next colder level,
        which makes room the same way; the last level drops them (handles become stale, counted in
        ``drops``). Raises :class:`CapacityError` when too few pages are evictable. Evictions run
        the normal migration transaction on ``stream`` (None: the manager's stream)."""
        handle = None if stream is None else _interop.stream_handle(stream)
        with _native_errors():
            self._live().make_room(int(level), int(pool_group), int(free_slots), handle)

    def resize(self, level: int, quota_bytes: int, *, stream: Any = None) -> None:
        """Sets the quota of a level (hot, host or disk) at run time.

        Every pool group's slot count is projected from ``quota_bytes`` as at construction
        (``pool_ratio``; the ``min_hot_slots`` floors on the hot level only; at least one slot per
        host pool group; the disk level splits in the same slot-count proportions into whole
        container files, at least one per cold pool group). Growing extends the pools: the hot
        level up to the reserve (``KVCacheConfig.max_gpu_quota``; its pools never move), the host
        level into a larger pool with the blobs copied over, the disk level by new preallocated
        container files. Shrinking first evicts, least recently used first, the pages that no
        longer fit (to the next colder level; the disk level, the last, drops them, counted in its
        ``drops``), then moves the pages in slots beyond the new count into free slots below it
        (hot: per-pool copies and host: raw blob copies, through the migration transaction on
        ``stream``, None: the manager's; disk: raw blob moves inside each region, each journaled so
        a crash leaves the page valid at its old or new slot) and releases the tail. Handles keep
        their identity, content key and contents; ``handle.slot`` may change, pinned pages too
        (pins prevent eviction, not relocation). The disk quota persists: a restart with the same
        ``DiskTierConfig`` opens with it (see ``docs/kvcm.md``).

        Raises ``ValueError`` for a hot quota above the reserve or an infeasible projection, and
        :class:`CapacityError` when too few pages are evictable, both before anything changed; a
        disk I/O failure raises :class:`kvcodec_sdk.disk.DiskIoError` (or ``DiskNoSpaceError``)
        with the old disk quota still in force and every page readable. Views from
        :meth:`host_pool_array` taken before a host resize keep the old pool's memory alive and
        show its contents as of the resize (fetch them again for the new pool); hot views stay
        valid.
        """
        if isinstance(quota_bytes, bool) or not isinstance(quota_bytes, int) or quota_bytes < 0:
            raise ValueError(f"quota_bytes is {quota_bytes!r}; it must be a positive integer")
        handle = None if stream is None else _interop.stream_handle(stream)
        with _native_errors():
            self._live().resize(int(level), int(quota_bytes), handle)
        self._pools_cache = {k: v for k, v in self._pools_cache.items() if k[0] != int(level)}

    def defragment(self, level: int, *, stream: Any = None) -> int:
        """Compacts every pool group of a level so its used slots are the lowest ones: hot and
        host through the migration transaction on ``stream`` (None: the manager's); disk by
        journaled raw blob moves inside each region, so its blobs also fill the first slots of its
        first container files. Contents, content keys and handles are unchanged (``handle.slot``
        may change). Returns the number of pages moved (disk: blobs moved inside the regions).
        A disk I/O failure raises :class:`kvcodec_sdk.disk.DiskIoError`; pages moved before it stay
        valid."""
        handle = None if stream is None else _interop.stream_handle(stream)
        with _native_errors():
            return int(self._live().defragment(int(level), handle))

    def quota(self, level: int) -> int:
        """The level's current quota in bytes (the disk level: ``DiskTierConfig.max_bytes`` until a
        :meth:`resize`, whose quota a restart with the same configuration keeps)."""
        return int(self._live().quota(int(level)))

    def hot_capacity_slots(self, pool_group: int) -> int:
        """Slots reserved for a hot pool group (``max_gpu_quota``): the most a resize can make usable."""
        return int(self._live().hot_capacity_slots(int(pool_group)))

    def synchronize(self) -> None:
        """Blocks until every transfer submitted so far completed."""
        self._live().synchronize()

    def close(self) -> None:
        """Synchronizes and releases every tier now (views created before keep nothing alive
        afterwards only if they were dropped; live views keep the memory)."""
        if self._core_obj is not None:
            core, self._core_obj = self._core_obj, None
            try:
                core.synchronize()
            finally:
                # The disk regions are closed now (not when the last view lets the core go), so a
                # new manager can open the same directory at once; the remote level's queue is
                # closed, so its worker stops (and closes a backend the manager built), whatever
                # the closing raised.
                try:
                    core.close_tiers()
                finally:
                    if self._remote is not None:
                        self._remote.stop()

    # -- layout and views ----------------------------------------------------------------------

    def lifecycle_to_pool_group(self, level: int) -> list[int]:
        """The level's mapping from layer group to pool group (independent per level)."""
        return list(self._live().mapping(int(level)))

    def num_pool_groups(self, level: int) -> int:
        """Number of pool groups of ``level`` (hot and cold groupings are independent)."""
        return int(self._live().num_pool_groups(int(level)))

    def slot_counts(self, level: int) -> list[tuple[int, int]]:
        """(slots, free slots) per pool group of ``level``."""
        core = self._live()
        counts = [core.slots(int(level), g) for g in range(self.num_pool_groups(level))]
        return [(int(c.num_slots), int(c.free_slots)) for c in counts]

    def page_bytes(self, level: int, pool_group: int) -> int:
        """Bytes of one page of a pool group: hot = sum of pool slots, cold = blob bytes."""
        return int(self._live().page_bytes(int(level), int(pool_group)))

    def cold_page_bytes(self, lifecycle: int) -> int:
        """The codec's fixed cold-page size for a layer group."""
        return int(self._live().lifecycle_info(int(lifecycle)).cold_page_bytes)

    def batching_representative(self, lifecycle: int) -> int:
        """The layer group whose ID the codec is called with for this layer group's pages."""
        return int(self._live().lifecycle_info(int(lifecycle)).batching_representative)

    def page_index_location(self, lifecycle: int) -> PageIndexLocation:
        """Where the codec takes this layer group's page indices (host or device)."""
        return PageIndexLocation(self._live().lifecycle_info(int(lifecycle)).page_index_location)

    def buffer_layout(self, lifecycle: int) -> list[BufferDesc]:
        """Where each configured buffer of a layer group lives inside its hot pages: its
        :class:`~kvcodec_sdk.BufferDesc` with ``pool_index`` and ``byte_offset`` filled in."""
        return [buffer_from_native(b) for b in self._live().lifecycle_info(int(lifecycle)).buffers]

    def _framework(self, framework: str) -> str:
        return _resolve_framework(self.device, framework)

    def _pool_arrays(self, level: int, group: int, framework: str) -> list:
        key = (level, group, framework)
        cached = self._pools_cache.get(key)
        if cached is not None:
            return cached
        core = self._live()
        owner = core
        if level == CacheLevel.HOT:
            pools = [(int(p.base), int(p.slot_bytes), int(p.num_slots)) for p in core.hot_pools(group)]
        else:
            cold = core.cold_pool(level, group)
            pools = [(int(cold.base), int(cold.page_bytes), int(cold.num_slots))]
            memory = cold.owner
            # The core first (it owns the runtime that frees the memory), then the pool memory,
            # which a resize may replace while this view still reads it.
            owner = (core, memory)
        out = _pool_views(pools, owner, self.device, self._ordinal, self.device != "cpu" and level == CacheLevel.HOT,
                          framework)
        self._pools_cache[key] = out
        return out

    def hot_pool_tensors(self, lifecycle: int, *, framework: str = "auto") -> list:
        """The pools of a layer group's hot pool group, each a ``(slots, slot_bytes)`` uint8 view.

        ``framework`` picks the type: ``"torch"`` (tensors), ``"numpy"`` (host pools only),
        ``"cuda"`` (device pools only: :class:`kvcodec_sdk.gpu.DeviceArray`, which torch, CuPy,
        JAX and cuda.core take without a copy) or ``"auto"``: torch where it is installed, else
        numpy on the CPU backend and ``DeviceArray`` on CUDA. Slot ``s`` of every pool is the hot
        page in slot ``s``.
        """
        mapping = self.lifecycle_to_pool_group(CacheLevel.HOT)
        lc = int(lifecycle)
        if not 0 <= lc < len(mapping):
            raise ValueError(f"lifecycle is {lifecycle}; configured layer groups are 0..{len(mapping) - 1}")
        return self._pool_arrays(CacheLevel.HOT, mapping[lc], self._framework(framework))

    def host_pool_array(self, pool_group: int) -> np.ndarray:
        """The host tier's pool of a cold pool group as a ``(slots, page_bytes)`` uint8 numpy view
        (inspection; call :meth:`synchronize` first)."""
        return self._pool_arrays(CacheLevel.HOST, int(pool_group), "numpy")[0]

    def page_view(self, page: PageHandle, *, framework: str = "auto") -> list:
        """Views of a page where it is now: a hot page gives its slot in every pool (one 1-D uint8
        view per pool); a host page gives one view of its cold blob."""
        lc, level, slot, group = page._info()
        if level == CacheLevel.HOT:
            return [p[slot] for p in self._pool_arrays(level, group, self._framework(framework))]
        return [self._pool_arrays(level, group, "numpy")[0][slot]]

    def buffer_views(self, page: PageHandle, *, framework: str = "auto") -> list:
        """Typed views of every configured buffer of a hot page, shaped ``(tokens, heads, dim)``
        (or flat for opaque buffers), in configuration order."""
        lc, level, slot, group = page._info()
        if level != CacheLevel.HOT:
            raise ValueError(f"page {page.id:#x} is at the {CacheLevel.label(level)} level; buffer views need a hot page")
        fw = self._framework(framework)
        pools = self._pool_arrays(level, group, fw)
        out = []
        for b in self.buffer_layout(lc):
            raw = pools[b.pool_index][slot, b.byte_offset : b.byte_offset + b.bytes]
            if fw == "torch":
                import torch

                out.append(raw.view(_torch_dtype(torch, b.dtype)).view(b.shape))
            elif fw == "cuda":
                out.append(raw.view(_DEVICE_DTYPES.get(b.dtype, _NUMPY_DTYPES[b.dtype])).reshape(b.shape))
            else:
                out.append(raw.view(_NUMPY_DTYPES[b.dtype]).reshape(b.shape))
        return out

    # -- observability -------------------------------------------------------------------------

    def stats(self, level: int) -> list[PoolGroupStats]:
        """Counters per pool group of ``level``, in that level's grouping order."""
        return [PoolGroupStats(**d) for d in self._live().stats(int(level))]

    def set_codec_gpu_timing(self, on: bool = True) -> bool:
        """Times each later codec call on the GPU (two timed CUDA events around it on its
        stream) into :class:`PoolGroupStats`' ``encode/decode_gpu_seconds`` and ``_gpu_calls``.
        A time is added once both events completed, read without blocking (at the next codec call
        or ``stats()``); the cost is two event records per call. Off by default. Returns whether
        calls are timed now: False when turned off, and on the CPU backend, which keeps no event
        times."""
        return bool(self._live().set_codec_gpu_timing(bool(on)))

    def level_stats(self, level: int, *, reset_peaks: bool = False) -> list[dict]:
        """Capacity statistics per pool group of ``level``, in that level's grouping order
        (hot and cold groupings are unrelated): ``slots``, ``used``, ``peak`` (used slots' peak
        since the last reset; ``reset_peaks`` restarts it, like
        :meth:`get_and_reset_iteration_peak_block_stats`), ``evictable`` (unpinned pages),
        ``evictions``, ``drops`` and ``hits``."""
        return _level_stats(self._live(), int(level), reset_peaks)

    def get_and_reset_iteration_peak_block_stats(self, level: int) -> list[tuple[int, int]]:
        """(used slots now, peak used slots since the last call) per pool group of ``level``."""
        return [(int(p.used_slots), int(p.peak_used_slots))
                for p in self._live().get_and_reset_iteration_peak_block_stats(int(level))]

    def add_migration_observer(self, observer: Callable[[MigrationRecord], None]) -> int:
        """Calls ``observer(MigrationRecord)`` after every submitted transfer; returns an id for
        :meth:`remove_migration_observer`. An exception raised by an observer is re-raised by the
        migrating call after all its transfers committed."""
        return int(self._live().add_observer(lambda r: observer(MigrationRecord._from_native(r))))

    def remove_migration_observer(self, observer_id: int) -> bool:
        """Removes an observer added with add_migration_observer; False if it was not registered."""
        return bool(self._live().remove_observer(int(observer_id)))

    def page_ring(self) -> dict | None:
        """The pinned page ring staging disk transfers (capacity, memory kind, live leases), or
        None when the manager has no disk tier."""
        ring = self._live().page_ring()
        return None if ring is None else {f: int(getattr(ring, f)) for f in ("capacity", "kind", "live_leases")}

    def disk_profile(self) -> StorageProfile | None:
        """The storage the disk tier was opened on (device class, file system, the I/O settings
        it got, warnings such as a low NFS ``wsize``), or None without a disk tier."""
        return self._disk_profile

    def disk_stats(self, pool_group: int) -> dict:
        """The disk region of a cold pool group: directory, slot usage, puts, reads, checksum
        failures, erases, the I/O it runs (``direct_io``, ``io_backend`` and why ``"auto"`` fell
        back, merged and queued requests), whether it was created or invalidated when opened,
        and its warnings."""
        with _native_errors():
            return dict(self._live().disk_region_stats(int(pool_group)))

    def index_ring(self) -> dict | None:
        """The device index ring (capacity, base, cursor, live leases), or None before its lazy
        allocation."""
        ring = self._live().index_ring()
        fields = ("capacity", "base", "cursor", "live_leases")
        return None if ring is None else {f: int(getattr(ring, f)) for f in fields}

    def __repr__(self) -> str:
        if self._core_obj is None:
            return "<KVCacheManager closed>"
        return (f"<KVCacheManager on {self.device}, codec {self._codec_name!r}, {self.num_layer_groups} layer groups, "
                f"{self.num_pool_groups(CacheLevel.HOT)} hot pool groups>")
