"""Configuration of the KV-cache manager: layer groups with their buffers, and the tiers.

A layer group (= lifecycle; its position is its ID) lists the buffers of one page: per layer,
K, V or other buffers of ``bytes`` bytes each. The hot slot layout is derived from it: **one hot
pool per layer** (in order of first appearance), whose slot holds that layer's buffers back to
back in configuration order. Layer groups whose pools have identical slot sizes share one hot
pool group automatically.

Quotas are bytes per level. ``pool_ratio`` holds one positive hot-tier byte weight per layer
group (normalized); the host tier keeps the same slot-count proportions between layer groups,
converted with each layer group's cold-page size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ._boundary import IO_BACKENDS
from ._boundary import IO_MODES as _IO_MODES
from .errors import KvcodecError
from .layout import BufferConfig, BufferDesc, BufferRole, DataType

if TYPE_CHECKING:
    from .storage_profile import StorageProfile

# BufferConfig: the deprecated spelling of BufferDesc, kept importable from here.
__all__ = ["BufferConfig", "BufferDesc", "LayerGroupConfig", "KVCacheConfig", "KVCacheConfigError", "DiskTierConfig",
           "RemoteTierConfig"]

MiB = 1 << 20


class KVCacheConfigError(KvcodecError, ValueError):
    """A KVCacheConfig field is invalid; the message names the field, its value and what is valid."""


_U64_MAX = 2**64 - 1
_I32_MAX = 2**31 - 1


def _int(where: str, value: object, minimum: int, maximum: int = _U64_MAX) -> int:
    """An integer field in [minimum, maximum] (the native field's range), or an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVCacheConfigError(f"{where} is {value!r} ({type(value).__name__}); it must be an integer")
    if value < minimum:
        qualifier = "positive" if minimum == 1 else f">= {minimum}"
        raise KVCacheConfigError(f"{where} is {value}; it must be {qualifier}")
    if value > maximum:
        raise KVCacheConfigError(f"{where} is {value}; it must be at most {maximum}")
    return value


@dataclass(frozen=True)
class LayerGroupConfig:
    """A layer group: the buffers of one of its pages (:class:`~kvcodec_sdk.BufferDesc` with
    ``layer_id``, ``role``, ``bytes`` and optionally ``dtype`` and the shape; the manager places
    them, so ``pool_index`` and ``byte_offset`` stay 0)."""

    buffers: Sequence[BufferDesc]



@dataclass(frozen=True)
class DiskTierConfig:
    """The disk tier of a manager: one region (``path/group<g>``) per cold pool group.

    :param path: Directory of the tier; created when missing. A manager opened later on the same
        directory with the same codec and layer groups finds the content-keyed pages left there.
    :param max_bytes: Container bytes of all regions, split between cold pool groups like the
        host tier (slot-count proportions of the layer groups).
    :param container_bytes: Bytes per container file (capped at a region's share).
    :param io_mode: ``"auto"`` (by the storage's device class, see
        :mod:`kvcodec_sdk.storage_profile`: O_DIRECT where the file system accepts it on NVMe and
        unrecognised storage, buffered on SATA/SAS SSDs, disks, network and memory file systems),
        ``"direct"`` or ``"buffered"``.
    :param io_threads: I/O worker threads per region; None (default): by the device class (32
        on NVMe).
    :param io_backend: ``"threads"``, ``"auto"`` (io_uring where the kernel allows it, else the
        thread pool) or ``"io_uring"`` (see :class:`kvcodec_sdk.disk.DiskRegion`); None (default):
        by the device class (``"auto"`` on NVMe and virtual disks).
    :param queue_depth: io_uring requests in flight per worker (1..4096); None (default): by the
        device class (8 on NVMe).
    """

    path: str
    max_bytes: int
    container_bytes: int = 1 << 30
    io_mode: str = "auto"
    io_threads: int | None = None
    io_backend: str | None = None
    queue_depth: int | None = None
    _faults: Sequence[dict] | None = None  # Test-only fault injection rules (see kvcodec_sdk.disk).

    def tuned(self, profile: StorageProfile | None = None) -> tuple[str, int, int, str]:
        """``(io_mode, io_threads, queue_depth, io_backend)`` for this tier: what the config
        sets, and for what it leaves to the SDK (``io_mode="auto"``, None) the settings of the
        storage's device class (``profile``, probed from ``path`` when not given)."""
        from .storage_profile import probe_storage

        profile = profile if profile is not None else probe_storage(self.path)
        mode = profile.io_mode if self.io_mode == "auto" else self.io_mode
        threads = profile.io_threads if self.io_threads is None else int(self.io_threads)
        depth = profile.queue_depth if self.queue_depth is None else int(self.queue_depth)
        backend = profile.io_backend if self.io_backend is None else self.io_backend
        return mode, threads, depth, backend

    def validate(self, where: str = "KVCacheConfig.disk") -> None:
        """Raises :class:`KVCacheConfigError` naming the first invalid field."""
        import os

        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise KVCacheConfigError(f"{where}.path is {self.path!r}; it must be a non-empty directory path")
        _int(f"{where}.max_bytes", self.max_bytes, 1)
        _int(f"{where}.container_bytes", self.container_bytes, 1)
        if self.io_threads is not None:
            _int(f"{where}.io_threads", self.io_threads, 1, 4096)
        if self.io_mode not in _IO_MODES:
            raise KVCacheConfigError(f"{where}.io_mode is {self.io_mode!r}; valid: {', '.join(_IO_MODES)}")
        if self.queue_depth is not None:
            _int(f"{where}.queue_depth", self.queue_depth, 1, 4096)
        if self.io_backend is not None and self.io_backend not in IO_BACKENDS:
            raise KVCacheConfigError(f"{where}.io_backend is {self.io_backend!r}; valid: {', '.join(IO_BACKENDS)}")


@dataclass(frozen=True)
class RemoteTierConfig:
    """The remote tier of a manager (``CacheLevel.REMOTE``): cold blobs on a shared key-value store
    under their content keys, found by any manager with the same codec and layer groups.

    :param backend: The store: a :class:`~kvcodec_sdk.remote.RemoteBackend` built with the
        manager's codec identity (:meth:`~kvcodec_sdk.KVCacheManager.remote_identity` tells it
        before a manager exists), or a callable that takes that identity (a
        :class:`~kvcodec_sdk.disk.CodecIdentity`) and returns a backend, e.g.
        ``lambda identity: ValkeyBackend(host, port, identity=identity)``. A backend built by
        the callable is closed with the manager; one given as is stays the caller's.
    :param max_pages: Pages the manager tracks at the remote level, per cold pool group (logical
        slots, no memory of the store's). The store's own capacity, eviction and TTL decide what
        it keeps: a page it no longer holds is a miss when onboarded (dropped, as on disk).
    """

    backend: Any
    max_pages: int = 1 << 16

    def validate(self, where: str = "KVCacheConfig.remote") -> None:
        """Raises :class:`KVCacheConfigError` naming the first invalid field."""
        from .remote.backend import RemoteBackend

        if not isinstance(self.backend, RemoteBackend) and not callable(self.backend):
            raise KVCacheConfigError(
                f"{where}.backend is a {type(self.backend).__name__}; it must be a kvcodec_sdk.remote.RemoteBackend "
                "or a callable taking the codec identity and returning one"
            )
        _int(f"{where}.max_pages", self.max_pages, 1, (1 << 31) - 1)


@dataclass(frozen=True)
class SharedTierConfig:
    """The host tier in the per-host cache daemon's shared arena (``kvcodec daemon``), so every
    manager on the host with the same codec and layer groups finds the pages the others evicted
    (:meth:`~kvcodec_sdk.KVCacheManager.find_shared`) and decodes them where they lie.

    The manager keeps ``host_quota`` bytes of the arena leased as its host tier; the pages it
    evicts there with a content key are published under it once their encode completed.

    :param socket: The daemon's Unix socket path.
    :param region_slots: Slots each cold pool group's region asks for when this manager is the
        first to use it (None: eight times the group's share of ``host_quota``); a region that
        exists keeps its size. Every manager's share and the pages kept for others come out of it.
    :param verify_crc: Check each shared blob's CRC-32C before it is decoded or copied (on the
        host; a CUDA manager checks the copy it decodes on the GPU): a blob another process
        scribbled over is then a miss. With False only the slot's header
        (version, region, key digest) is checked: the daemon never reuses a slot a reader pinned,
        so only a misbehaving process on the host could change the bytes.
    :param timeout_s: How long a call waits for the daemon before the level stops sharing (the
        manager goes on with the slots it holds).
    :param reattach_every_s: None (the default): after the daemon went away the manager goes on
        unshared until :meth:`~kvcodec_sdk.KVCacheManager.reattach_shared` is called. A number of
        seconds: the manager tries that itself at the start of a migration or a
        :meth:`~kvcodec_sdk.KVCacheManager.find_shared`, at most once per that many seconds (0:
        every call), so a restarted daemon is joined again without the engine's help. The call
        that re-attaches waits for the transfers in flight and copies the host tier into the new
        arena, as :meth:`~kvcodec_sdk.KVCacheManager.reattach_shared` does.
    """

    socket: str
    region_slots: int | None = None
    verify_crc: bool = True
    timeout_s: float = 5.0
    reattach_every_s: float | None = None

    @staticmethod
    def region_prefix(identity: Any) -> str:
        """What names the daemon's regions of a manager whose codec identity is ``identity`` (a
        :class:`~kvcodec_sdk.disk.CodecIdentity`, :meth:`~kvcodec_sdk.KVCacheManager.remote_identity`
        tells it): cold pool group ``g``'s region is this followed by ``/g<g>``."""
        return f"kvcm/{identity.name}/{identity.format_version}/{identity.param_hash}"

    def validate(self, where: str = "KVCacheConfig.shared") -> None:
        """Raises :class:`KVCacheConfigError` naming the first invalid field."""
        if not isinstance(self.socket, str) or not self.socket:
            raise KVCacheConfigError(f"{where}.socket is {self.socket!r}; it must be the daemon's socket path")
        if self.region_slots is not None:
            _int(f"{where}.region_slots", self.region_slots, 1, (1 << 32) - 1)
        if not isinstance(self.verify_crc, bool):
            raise KVCacheConfigError(f"{where}.verify_crc is {self.verify_crc!r}; it must be True or False")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not (
                math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise KVCacheConfigError(f"{where}.timeout_s is {self.timeout_s!r}; it must be a positive number of seconds")
        every = self.reattach_every_s
        if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                                  or not (math.isfinite(every) and every >= 0)):
            raise KVCacheConfigError(f"{where}.reattach_every_s is {every!r}; it must be None (re-attach only when "
                                     "reattach_shared() is called) or a number of seconds >= 0")


@dataclass(frozen=True)
class KVCacheConfig:
    """Everything a :class:`~kvcodec_sdk.KVCacheManager` needs.

    :param layer_groups: The layer groups; layer group ``i`` is lifecycle ``i``.
    :param gpu_quota: Bytes of the hot tier (GPU memory; host memory with ``device="cpu"``).
    :param host_quota: Bytes of the host tier (pinned, GPU-mapped); 0 for a GPU-only manager.
    :param pool_ratio: One positive hot-tier byte weight per layer group; default equal weights.
    :param device: ``"auto"`` (the codec's device when a Codec is given, else the first GPU when
        present, else the CPU), ``"cpu"`` (host backend: CPU reference codecs, synchronous) or
        ``"cuda[:N]"``.
    :param index_ring_bytes: Device index ring size, allocated lazily only when a layer group's
        codec takes device-resident page indices.
    :param disk: A :class:`DiskTierConfig` for a disk level (``CacheLevel.DISK``), or None.
    :param remote: A :class:`RemoteTierConfig` for a remote level (``CacheLevel.REMOTE``), or None.
    :param shared: A :class:`SharedTierConfig` to keep the host tier in the per-host cache daemon's
        shared arena instead of this process's memory (needs ``host_quota``), or None.
    :param min_hot_slots: Hot-only feasibility floors: the minimum hot slots of each layer group
        (one integer >= 0 per layer group, or None). They may clamp the hot split given by
        ``pool_ratio``; the cold levels are sized from ``pool_ratio`` alone.
    :param auto_evict: Allocation under hot pressure evicts least-recently-used unpinned pages to
        the next colder level (the last level drops) instead of raising ``CapacityError``.
    :param max_gpu_quota: The largest hot quota :meth:`~kvcodec_sdk.KVCacheManager.resize` may set (None:
        ``gpu_quota``). The hot pools are allocated for it at construction, because the codec is
        configured with their addresses once; a resize changes only how many slots are usable.
    """

    layer_groups: Sequence[LayerGroupConfig]
    gpu_quota: int
    host_quota: int = 0
    pool_ratio: Sequence[float] | None = None
    device: str = "auto"
    index_ring_bytes: int = field(default=MiB)
    disk: DiskTierConfig | None = None
    min_hot_slots: Sequence[int] | None = None
    auto_evict: bool = True
    max_gpu_quota: int | None = None
    remote: RemoteTierConfig | None = None
    shared: SharedTierConfig | None = None

    def validate(self) -> None:
        """Raises :class:`KVCacheConfigError` naming the first invalid field."""
        w = "KVCacheConfig"
        if not isinstance(self.layer_groups, (list, tuple)) or not self.layer_groups:
            raise KVCacheConfigError(f"{w}.layer_groups is {self.layer_groups!r}; it must be a non-empty list of LayerGroupConfig")
        for g, group in enumerate(self.layer_groups):
            gw = f"{w}.layer_groups[{g}]"
            if not isinstance(group, LayerGroupConfig):
                raise KVCacheConfigError(f"{gw} is a {type(group).__name__}; it must be a LayerGroupConfig")
            if not group.buffers:
                raise KVCacheConfigError(f"{gw}.buffers is empty; a layer group needs at least one buffer")
            for b, buf in enumerate(group.buffers):
                bw = f"{gw}.buffers[{b}]"
                if not isinstance(buf, BufferDesc):
                    raise KVCacheConfigError(f"{bw} is a {type(buf).__name__}; it must be a BufferDesc")
                _int(f"{bw}.layer_id", buf.layer_id, 0, _I32_MAX)
                for placed in ("pool_index", "byte_offset"):
                    if getattr(buf, placed) != 0:
                        raise KVCacheConfigError(
                            f"{bw}.{placed} is {getattr(buf, placed)!r}; the manager places configured buffers, "
                            f"leave it 0")
                _int(f"{bw}.bytes", buf.bytes, 1)
                try:
                    BufferRole(buf.role)
                except ValueError:
                    raise KVCacheConfigError(f"{bw}.role is {buf.role!r}; valid roles are {[r.name for r in BufferRole]}") from None
                try:
                    dtype = DataType(buf.dtype)
                except ValueError:
                    raise KVCacheConfigError(f"{bw}.dtype is {buf.dtype!r}; valid dtypes are {[d.name for d in DataType]}") from None
                shape = [_int(f"{bw}.{n}", getattr(buf, n), 0, _I32_MAX) for n in ("tokens_per_page", "num_heads", "head_dim")]
                if any(shape) and not all(shape):
                    raise KVCacheConfigError(
                        f"{bw} sets tokens_per_page/num_heads/head_dim to {tuple(shape)}; set all three or none"
                    )
                if all(shape) and math.prod(shape) * dtype.itemsize != buf.bytes:
                    raise KVCacheConfigError(
                        f"{bw}.bytes is {buf.bytes} but tokens_per_page*num_heads*head_dim*itemsize is "
                        f"{math.prod(shape) * dtype.itemsize}"
                    )
                if buf.bytes % dtype.itemsize:
                    raise KVCacheConfigError(f"{bw}.bytes is {buf.bytes}, not a multiple of the {dtype.name} item size {dtype.itemsize}")
                if BufferRole(buf.role) == BufferRole.KEY_VALUE and shape[1] % 2:
                    raise KVCacheConfigError(
                        f"{bw}.num_heads is {shape[1]}; a KEY_VALUE buffer alternates K and V along its heads, so it "
                        "needs an even number")
        _int(f"{w}.gpu_quota", self.gpu_quota, 1)
        _int(f"{w}.host_quota", self.host_quota, 0)
        if self.max_gpu_quota is not None:
            _int(f"{w}.max_gpu_quota", self.max_gpu_quota, 1)
            if self.max_gpu_quota < self.gpu_quota:
                raise KVCacheConfigError(
                    f"{w}.max_gpu_quota is {self.max_gpu_quota}; it must be at least gpu_quota ({self.gpu_quota})")
        _int(f"{w}.index_ring_bytes", self.index_ring_bytes, 64)
        if self.index_ring_bytes % 8:
            raise KVCacheConfigError(f"{w}.index_ring_bytes is {self.index_ring_bytes}; it must be a multiple of 8")
        if self.pool_ratio is not None:
            if isinstance(self.pool_ratio, (str, bytes)) or not hasattr(self.pool_ratio, "__len__"):
                raise KVCacheConfigError(
                    f"{w}.pool_ratio is {self.pool_ratio!r}; it must be a sequence of one positive weight per "
                    f"layer group ({len(self.layer_groups)}), e.g. {[1.0] * len(self.layer_groups)}"
                )
            if len(self.pool_ratio) != len(self.layer_groups):
                raise KVCacheConfigError(
                    f"{w}.pool_ratio has {len(self.pool_ratio)} entries; it needs one per layer group ({len(self.layer_groups)})"
                )
            for i, r in enumerate(self.pool_ratio):
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
                    raise KVCacheConfigError(f"{w}.pool_ratio[{i}] is {r!r}; every weight must be a positive finite number")
        if self.min_hot_slots is not None:
            if len(self.min_hot_slots) != len(self.layer_groups):
                raise KVCacheConfigError(
                    f"{w}.min_hot_slots has {len(self.min_hot_slots)} entries; it needs one per layer group "
                    f"({len(self.layer_groups)})"
                )
            for i, n in enumerate(self.min_hot_slots):
                _int(f"{w}.min_hot_slots[{i}]", n, 0, _I32_MAX)
        if not isinstance(self.auto_evict, bool):
            raise KVCacheConfigError(f"{w}.auto_evict is {self.auto_evict!r}; it must be True or False")
        if self.disk is not None:
            if not isinstance(self.disk, DiskTierConfig):
                raise KVCacheConfigError(f"{w}.disk is a {type(self.disk).__name__}; it must be a DiskTierConfig or None")
            self.disk.validate(f"{w}.disk")
        if self.remote is not None:
            if not isinstance(self.remote, RemoteTierConfig):
                raise KVCacheConfigError(
                    f"{w}.remote is a {type(self.remote).__name__}; it must be a RemoteTierConfig or None"
                )
            self.remote.validate(f"{w}.remote")
        if self.shared is not None:
            if not isinstance(self.shared, SharedTierConfig):
                raise KVCacheConfigError(
                    f"{w}.shared is a {type(self.shared).__name__}; it must be a SharedTierConfig or None")
            self.shared.validate(f"{w}.shared")
            if self.host_quota == 0:
                raise KVCacheConfigError(
                    f"{w}.host_quota is 0; a shared host tier needs the bytes of the daemon's arena this manager "
                    "keeps (host_quota > 0)")
        if not isinstance(self.device, str):
            raise KVCacheConfigError(f"{w}.device is {self.device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'")

    def weights(self) -> list[float]:
        """The pool ratio, one weight per layer group (equal weights by default)."""
        return [float(r) for r in self.pool_ratio] if self.pool_ratio is not None else [1.0] * len(self.layer_groups)

    def layout_description(self) -> list:
        """What shapes a cold page besides the codec: every layer group's buffers (hashed into the
        disk tier's codec identity, so a restart with other layer groups invalidates it)."""
        return [
            [[int(b.layer_id), int(b.role), int(b.dtype), int(b.bytes), int(b.tokens_per_page), int(b.num_heads),
              int(b.head_dim)] for b in group.buffers]
            for group in self.layer_groups
        ]

    def to_native(self, envelope_format_version: int = -1, identity: object = None,
                  profile: StorageProfile | None = None, remote_queue: Any = None) -> Any:
        """The ``_native.kvcm.KvcmConfig`` that ``_native.kvcm.KvcmCore`` takes (call :meth:`validate`
        first). ``identity`` is the disk tier's :class:`~kvcodec_sdk.disk.CodecIdentity` (required
        with ``disk``); ``profile`` its storage (probed from the disk path when None);
        ``remote_queue`` the remote tier's ``_native.kvcm.RemoteQueue`` (required with ``remote``)."""
        from ._boundary import config_to_native

        return config_to_native(self, envelope_format_version, identity, profile, remote_queue)  # type: ignore[arg-type]
