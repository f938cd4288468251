"""The disk cold tier: a crash-safe tablespace store for fixed-size cold pages.

One :class:`DiskRegion` per cold pool group: a constant number of preallocated container files
carved into fixed slots of the group's cold-page size, a human-readable journal
(``index.log``) and a periodic atomic snapshot (``index.snapshot`` + ``.bak``). A write is
acknowledged only after its data and its journal record are durable; a restart replays the
snapshot and the journal tail, so every acknowledged page survives a crash and no half-written
page is ever served. I/O runs on worker threads in the native core (O_DIRECT where the file
system supports it); the calling thread only enqueues.

Keys are opaque byte strings (e.g. 16-byte content hashes); a page may carry a small integer
``tag`` (e.g. its lifecycle). See ``docs/disk-tier.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from . import _native
from ._boundary import IO_BACKENDS, IO_MODES
from .errors import KvcodecError

__all__ = [
    "CodecIdentity",
    "Completion",
    "DiskFullError",
    "DiskIoError",
    "DiskNoSpaceError",
    "DiskRegion",
    "DiskTierError",
    "DiskTierWarning",
    "crc32c",
    "group_from_layout",
    "layout_of",
]

log = logging.getLogger("kvcodec_sdk.disk")

WHEN_FULL = {"refuse": 0, "evict": 1}
_FAULT_OPS = ("pwrite", "pread", "fdatasync", "fallocate", "any")


class DiskTierError(KvcodecError, RuntimeError):
    """An operation of the disk tier failed; nothing acknowledged was lost.

    :ivar status: ``"full"``, ``"no_space"`` or ``"io_error"``.
    """

    def __init__(self, status: str, message: str):
        self.status = status
        super().__init__(message)


class DiskFullError(DiskTierError):
    """Every slot is live and the region's ``when_full`` policy is ``"refuse"``."""


class DiskNoSpaceError(DiskTierError):
    """The file system reported ENOSPC (out of space)."""


class DiskIoError(DiskTierError):
    """The file system reported an I/O error (EIO or another errno, named in the message)."""


class DiskTierWarning(UserWarning):
    """Recovery found damage or a region written by another codec (the message says what)."""


_ERRORS = {"full": DiskFullError, "no_space": DiskNoSpaceError, "io_error": DiskIoError}


class Completion(NamedTuple):
    """The outcome of a completed operation.

    :ivar status: ``"ok"``, ``"not_found"`` (a miss) or ``"checksum_mismatch"`` (a miss: the
        slot's CRC-32C failed; counted and logged).
    :ivar tag: The tag given to the write (reads only).
    :ivar message: Details for a checksum mismatch.
    """

    status: str
    tag: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the operation succeeded (for a read: the page was served)."""
        return self.status == "ok"


def crc32c(data: Any, crc: int = 0) -> int:
    """CRC-32C of a buffer (SSE4.2 where available): the per-slot checksum of the disk tier."""
    return int(_native.disk.crc32c(data, crc))


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _blob_params(spec: Any, params: Mapping[str, Any]) -> dict:
    tuning = {p.name for p in spec.params if not p.affects_blob}
    return {k: v for k, v in params.items() if k not in tuning}


@dataclass(frozen=True)
class CodecIdentity:
    """The codec whose blobs a region holds: name, format version and a parameter hash.

    The hash covers the codec's validated parameters and, when given, ``layout`` (anything else
    that shapes the blob, e.g. the cold pool group's hot layout): reopening a region with a
    different identity invalidates its pages instead of decoding foreign blobs.
    """

    name: str
    format_version: int
    params: Mapping[str, Any] = field(default_factory=dict)
    layout: Any = None

    @property
    def param_hash(self) -> str:
        """First 16 hex digits of SHA-256 over the canonical JSON of params and layout."""
        text = _canonical({"params": dict(self.params), "layout": self.layout})
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_codec(cls, codec: Any, layout: Any = None) -> CodecIdentity:
        """Identity of a :class:`~kvcodec_sdk.Codec`: its spec's name and format, and the params that
        shape its blobs (tuning knobs, ``ParamSpec(affects_blob=False)``, are left out)."""
        return cls(codec.spec.name, int(codec.spec.format_version), _blob_params(codec.spec, codec.params), layout)

    @classmethod
    def from_name(cls, name: str, params: Mapping[str, Any] | None = None, layout: Any = None,
                  registry: Any = None) -> CodecIdentity:
        """Identity of a registered codec with ``params`` validated and completed with defaults."""
        from .registry import default_registry

        spec = (registry or default_registry()).get_codec_spec(name)
        return cls(spec.name, int(spec.format_version), _blob_params(spec, spec.validate_params(params)), layout)

    @classmethod
    def coerce(cls, codec: Any, layout: Any = None) -> CodecIdentity:
        """Accepts a CodecIdentity, a Codec, a codec name, ``(name, params)`` or None (concat)."""
        if isinstance(codec, CodecIdentity):
            return codec
        if codec is None:
            return cls.from_name("concat", None, layout)
        if isinstance(codec, str):
            return cls.from_name(codec, None, layout)
        if isinstance(codec, tuple) and len(codec) == 2 and isinstance(codec[0], str):
            return cls.from_name(codec[0], codec[1], layout)
        if hasattr(codec, "spec") and hasattr(codec, "params"):
            return cls.from_codec(codec, layout)
        raise TypeError(
            f"codec is {codec!r}; pass a CodecIdentity, a Codec, a codec name, (name, params) or None"
        )


def _key(key: Any) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key is {type(key).__name__}; keys are bytes (or str, encoded as UTF-8)")
    key = bytes(key)
    if not 1 <= len(key) <= 255:
        raise ValueError(f"key is {len(key)} bytes; keys must be 1..255 bytes")
    return key


def _lock(buf: Any) -> Any:
    """A memoryview of ``buf`` held while an operation uses its memory: its export keeps a
    bytearray (or any resizable exporter) from being resized or freed until it is released."""
    try:
        return memoryview(buf)
    except TypeError:
        return buf  # not a buffer: the native call names what it needs


def _unlock(view: Any) -> None:
    if isinstance(view, memoryview):
        view.release()


def _fault_rules(rules: Sequence[Mapping[str, Any]] | None) -> list:
    """Test-only fault rules as ``_native.disk.FaultRule`` structs."""
    from ._boundary import fault_rules_to_native

    checked = []
    for r in rules or ():
        op = r.get("op", "any")
        if op not in _FAULT_OPS:
            raise ValueError(f"fault op is {op!r}; valid: {', '.join(_FAULT_OPS)}")
        checked.append({"op": op, "path": str(r.get("path", "")), "after": int(r.get("after", 0)),
                        "errno": int(r.get("errno", 5)), "torn": bool(r.get("torn", False)),
                        "count": int(r.get("count", 0)), "delay_us": int(r.get("delay_us", 0))})
    return fault_rules_to_native(checked)


class DiskRegion:
    """One region of the disk tier (one cold pool group) in directory ``path``.

    :param path: Region directory; created when missing (parents included).
    :param slot_bytes: The group's cold-page size: every page is exactly this many bytes.
    :param max_bytes: Bytes of container files (``max_bytes // container_bytes`` files).
    :param container_bytes: Bytes per container file (default: ``min(max_bytes, 1 GiB)``).
    :param codec: The codec whose blobs the region holds (see :meth:`CodecIdentity.coerce`);
        default ``concat`` with default parameters.
    :param layout: JSON-compatible description of the blob layout (hot pool group, lifecycles),
        folded into the parameter hash and recorded for ``kvcodec inspect``.
    :param name: Region name (informational); default: the directory's name.
    :param io_mode: ``"auto"`` (O_DIRECT where supported), ``"direct"`` or ``"buffered"``.
    :param when_full: ``"refuse"`` (a write fails with :class:`DiskFullError`) or ``"evict"``
        (the oldest page not being read is retired durably and its slot reused).
    :param io_threads: Worker threads doing the I/O.
    :param io_backend: ``"threads"`` (the default: one blocking call at a time per worker),
        ``"auto"`` (io_uring where the kernel allows it, else the thread pool) or ``"io_uring"``
        (fail to open without it). With io_uring each worker keeps up to ``queue_depth`` requests in flight and
        submits them with one system call; :meth:`stats` says which backend runs
        (``io_backend``) and, for ``"auto"``, why io_uring did not (``io_backend_note``).
    :param queue_depth: Requests in flight per worker with io_uring (1..4096).
    :param snapshot_every: Journal records between snapshots (0: only on close).
    :param max_batch: Most journal records per group commit.

    Reopening a directory recovers it: warnings (:class:`DiskTierWarning`) report damage that was
    repaired (a damaged ``region.json`` is rewritten from the identity the journal records; a
    journal record with one flipped bit is corrected; keys a record damaged beyond repair may have
    changed become misses) or a region invalidated because it was written by another codec or
    geometry. A damaged ``region.json`` whose recorded identity disagrees with this configuration
    raises RuntimeError naming what disagrees, and nothing is changed.
    """

    def __init__(self, path: Any, *, slot_bytes: int, max_bytes: int, container_bytes: int | None = None,
                 codec: Any = None, layout: Any = None, name: str | None = None, io_mode: str = "auto",
                 when_full: str = "refuse", io_threads: int = 32, snapshot_every: int = 1 << 20,
                 max_batch: int = 4096, io_backend: str = "threads", queue_depth: int = 8, _faults: Sequence[Mapping[str, Any]] | None = None,
                 _read_only: bool = False):
        import os

        path = os.fspath(path)
        if io_mode not in IO_MODES:
            raise ValueError(f"io_mode is {io_mode!r}; valid: {', '.join(IO_MODES)}")
        if io_backend not in IO_BACKENDS:
            raise ValueError(f"io_backend is {io_backend!r}; valid: {', '.join(IO_BACKENDS)}")
        if when_full not in WHEN_FULL:
            raise ValueError(f"when_full is {when_full!r}; valid: {', '.join(WHEN_FULL)}")
        for field_name, value in (("slot_bytes", slot_bytes), ("max_bytes", max_bytes), ("io_threads", io_threads),
                                  ("snapshot_every", snapshot_every), ("max_batch", max_batch),
                                  ("queue_depth", queue_depth)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field_name} is {value!r}; it must be a non-negative integer")
        if _read_only:
            identity = CodecIdentity("?", 0)
            param_hash, params_json, layout_json = "", "", ""
        else:
            identity = CodecIdentity.coerce(codec, layout)
            param_hash, params_json = identity.param_hash, _canonical(dict(identity.params))
            layout_json = "" if layout is None else _canonical(layout)
        if container_bytes is None:
            container_bytes = min(max_bytes, 1 << 30)
        self._native = None
        self._refs: dict[int, Any] = {}
        self._native = _native.disk.DiskRegion(
            dir=path, name=name or os.path.basename(path.rstrip("/")) or "region", slot_bytes=slot_bytes,
            max_bytes=max_bytes, container_bytes=container_bytes, codec_name=identity.name,
            format_version=identity.format_version, param_hash=param_hash, params_json=params_json,
            io_mode=IO_MODES[io_mode], when_full=WHEN_FULL[when_full], io_threads=io_threads,
            snapshot_every=snapshot_every, max_batch=max_batch, layout_json=layout_json, read_only=_read_only,
            faults=_fault_rules(_faults), io_backend=IO_BACKENDS[io_backend], queue_depth=queue_depth)
        for message in self._native.recovery()["warnings"]:
            log.warning("%s", message)
            warnings.warn(message, DiskTierWarning, stacklevel=2)

    @classmethod
    def open_read_only(cls, path: Any, *, io_threads: int = 2) -> DiskRegion:
        """Opens an existing region with its recorded geometry and codec, changing no file.

        A missing directory or one without ``region.json`` raises an error saying so; damage is
        reported as warnings exactly as a writable open would, but nothing is repaired.
        """
        return cls(path, slot_bytes=0, max_bytes=0, container_bytes=0, io_threads=io_threads, _read_only=True)

    # -- asynchronous operations --------------------------------------------------------------

    def submit_write(self, key: Any, data: Any, tag: int = 0) -> int:
        """Enqueues a write of ``data`` (exactly ``slot_bytes`` bytes; any buffer) under ``key``.

        ``data`` is kept alive and locked until the ticket completes (resizing a bytearray meanwhile
        raises BufferError); its bytes must not change. Returns a ticket for :meth:`wait` / :meth:`poll`.
        """
        native, k = self._live(), _key(key)
        view = _lock(data)
        try:
            ticket = native.submit_write(k, view, int(tag))
        except BaseException:
            _unlock(view)
            raise
        self._refs[ticket] = view
        return ticket

    def submit_read(self, key: Any, out: Any) -> int:
        """Enqueues a read of ``key`` into the writable buffer ``out`` (>= ``slot_bytes`` bytes).

        ``out`` is kept alive and locked until the ticket completes: resizing a bytearray
        meanwhile raises BufferError instead of freeing memory the read is writing into.
        """
        native, k = self._live(), _key(key)
        view = _lock(out)
        try:
            ticket = native.submit_read(k, view)
        except BaseException:
            _unlock(view)
            raise
        self._refs[ticket] = view
        return ticket

    def submit_erase(self, key: Any) -> int:
        """Enqueues the durable retirement of ``key`` (served no more from now on)."""
        return self._live().submit_erase(_key(key))

    def poll(self, ticket: int) -> Completion | None:
        """The ticket's :class:`Completion`, or None while pending (errors raise as in :meth:`wait`)."""
        raw = self._live().poll(ticket)
        return None if raw is None else self._finish(ticket, raw)

    def wait(self, ticket: int, timeout: float | None = None) -> Completion:
        """Blocks until the ticket completes; returns its :class:`Completion`.

        A miss (``not_found`` or ``checksum_mismatch``) is a Completion whose ``ok`` is False.
        Errors raise :class:`DiskFullError`, :class:`DiskNoSpaceError` or :class:`DiskIoError`.
        On timeout raises TimeoutError (the ticket stays valid).
        """
        if timeout is not None:
            timeout = float(timeout)
            if timeout != timeout or timeout < 0:
                raise ValueError(f"timeout is {timeout}; it must be None (wait for ever) or a number of seconds >= 0")
        # An infinite timeout waits for ever, like None (the native wait takes -1 for that).
        raw = self._live().wait(ticket, -1.0 if timeout is None or timeout == float("inf") else timeout)
        if raw.status == "pending":
            raise TimeoutError(f"disk ticket {ticket} did not complete within {timeout} s")
        return self._finish(ticket, raw)

    def _finish(self, ticket: int, raw: Any) -> Completion:
        _unlock(self._refs.pop(ticket, None))
        status, message, tag = raw.status, raw.message, raw.tag
        self._log_events()
        if status in _ERRORS:
            raise _ERRORS[status](status, message)
        if status == "checksum_mismatch":
            log.warning("%s", message)
        return Completion(status, int(tag), message)

    def _log_events(self) -> None:
        for message in self._native.drain_events():
            log.warning("%s", message)

    # -- synchronous conveniences -------------------------------------------------------------

    def put(self, key: Any, data: Any, tag: int = 0) -> None:
        """Writes a page and returns once it is durable (raises on failure)."""
        self.wait(self.submit_write(key, data, tag))

    def get(self, key: Any, out: Any = None) -> bytes | None:
        """The page of ``key`` as bytes (or read into ``out``, then returned as bytes), None on a miss."""
        buf = out if out is not None else bytearray(self.slot_bytes)
        done = self.wait(self.submit_read(key, buf))
        return bytes(memoryview(buf).cast("B")[: self.slot_bytes]) if done.ok else None

    def erase(self, key: Any) -> bool:
        """Retires ``key`` durably; False when it was not present."""
        return self.wait(self.submit_erase(key)).ok

    # -- queries ----------------------------------------------------------------------------

    def contains(self, key: Any) -> bool:
        """True when ``key`` is published (its write is durable)."""
        return bool(self._live().contains(_key(key)))

    __contains__ = contains

    def lookup(self, key: Any) -> dict | None:
        """Where ``key`` lives: container, slot, tag, crc, seq; None when absent."""
        return self._live().lookup(_key(key))

    def pages(self) -> list[dict]:
        """Every live page (oldest first): key, container, slot, tag, crc, seq. After a restart
        this is what a manager onboards (prefix reuse across restarts)."""
        return list(self._live().pages())

    def keys(self) -> Iterator[bytes]:
        """Keys of the live pages, oldest first."""
        return (p["key"] for p in self.pages())

    def __len__(self) -> int:
        return int(self.stats()["slots_live"])

    def stats(self) -> dict:
        """Counters: slots, puts, hits/misses, checksum failures, evictions, journal, bytes."""
        return dict(self._live().stats())

    def recovery(self) -> dict:
        """What opening found: snapshot used, records replayed, damage repaired, seconds."""
        return dict(self._live().recovery())

    @property
    def slot_bytes(self) -> int:
        """The cold-page payload size."""
        return int(self._live().slot_bytes)

    @property
    def codec(self) -> dict:
        """The recorded codec identity: name, format_version, param_hash, params (dict)."""
        n = self._live()
        return {"name": n.codec_name, "format_version": n.codec_format_version, "param_hash": n.codec_param_hash,
                "params": json.loads(n.codec_params_json or "{}")}

    @property
    def layout(self) -> Any:
        """The recorded layout description, or None."""
        text = self._live().layout_json
        return json.loads(text) if text else None

    # -- lifecycle --------------------------------------------------------------------------

    def flush(self) -> None:
        """Blocks until every submitted operation has completed."""
        self._live().flush()
        self._log_events()

    def snapshot(self) -> None:
        """Writes a snapshot now and rotates the journal."""
        self._live().snapshot()
        self._log_events()

    # -- resize and defragmentation ---------------------------------------------------------

    @property
    def container_bytes(self) -> int:
        """The configured bytes per container file (a resize counts containers in them)."""
        return int(self._live().container_bytes)

    @property
    def max_bytes(self) -> int:
        """The region's current size: container files times :attr:`container_bytes`."""
        native = self._live()
        return int(native.num_containers) * int(native.container_bytes)

    def resize(self, max_bytes: int, *, drop_oldest: bool = False, progress: Any = None,
               batch_pages: int = 256) -> dict:
        """Changes the region to ``max_bytes // container_bytes`` container files while it stays open.

        Growing preallocates the new files before recording the new geometry. Shrinking first
        moves every page of the cut containers into free slots of the kept ones (raw blob copy
        checked against its CRC-32C, data synced, then a journal record moves the key: a crash at
        any point leaves the page valid at its old or its new slot), ``batch_pages`` pages at a
        time with ``progress(done, total)`` called after each batch, then records the new
        geometry and deletes the cut files. Keys, bytes and tags never change. Other operations
        wait while it runs (``progress`` must not use the region).

        Raises ``ValueError`` for a size outside 1..9999 containers, :class:`DiskFullError` when
        the kept slots cannot hold the live pages (nothing changed; ``drop_oldest=True`` erases
        the oldest pages of the cut containers instead), :class:`DiskNoSpaceError` or
        :class:`DiskIoError` on an I/O failure (pages moved so far stay valid; the region keeps its
        old size and keeps working). Returns ``{"containers_before", "containers_after",
        "moved", "dropped", "checksum_drops"}``.
        """
        for field_name, value in (("max_bytes", max_bytes), ("batch_pages", batch_pages)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field_name} is {value!r}; it must be a positive integer")
        native = self._live()
        containers = max_bytes // int(native.container_bytes)
        if not 1 <= containers <= 9999:
            raise ValueError(f"max_bytes is {max_bytes}; with container_bytes {native.container_bytes} it must give "
                             f"1..9999 container files ({native.container_bytes}.."
                             f"{9999 * native.container_bytes} bytes)")
        return self._resize_result(native.resize(containers, progress, bool(drop_oldest), batch_pages))

    def defragment(self, *, progress: Any = None, batch_pages: int = 256) -> dict:
        """Moves the live pages into the lowest slots (journaled like :meth:`resize`'s moves), so
        the used slots are the first ``len(self)``. Same report, waiting and errors as :meth:`resize`."""
        if not isinstance(batch_pages, int) or isinstance(batch_pages, bool) or batch_pages <= 0:
            raise ValueError(f"batch_pages is {batch_pages!r}; it must be a positive integer")
        return self._resize_result(self._live().defragment(progress, batch_pages))

    def _resize_result(self, raw: dict) -> dict:
        self._log_events()
        if "error" in raw:
            raise _ERRORS.get(raw["status"], DiskIoError)(raw["status"], raw["error"])
        return {k: int(v) for k, v in raw.items()}

    def close(self) -> None:
        """Flushes, writes a final snapshot and closes the files. Idempotent."""
        if self._native is not None:
            self._native.close()
            self._log_events()
            self._native = None
            for view in self._refs.values():  # every operation has completed: release the buffers
                _unlock(view)
            self._refs.clear()

    def _live(self):
        if self._native is None:
            raise KvcodecError("this DiskRegion is closed; open it again with DiskRegion(path, ...)")
        return self._native

    def __enter__(self) -> DiskRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        if self._native is None:
            return "<DiskRegion closed>"
        s = self.stats()
        return (f"<DiskRegion {self._native.dir!r} {s['slots_live']}/{s['slots_total']} slots of "
                f"{self.slot_bytes} B, {'direct' if s['direct_io'] else 'buffered'} I/O>")


# -- layouts: what a region records so tools can decode its blobs ------------------------------

def layout_of(group: Any) -> dict:
    """JSON-compatible description of a hot pool group (no addresses) for ``layout=``.

    Recording it lets ``kvcodec inspect`` decode a page on the CPU with the recorded codec; it is
    also folded into the region's parameter hash, so a changed hot layout invalidates the region.
    """
    return {
        "pools": [{"slot_bytes": int(p.slot_bytes)} for p in group.pools],
        "lifecycles": [
            {
                "lifecycle_id": int(lc.lifecycle_id),
                "buffers": [
                    {"layer_id": int(b.layer_id), "role": int(b.role), "pool_index": int(b.pool_index),
                     "byte_offset": int(b.byte_offset), "bytes": int(b.bytes), "dtype": int(b.dtype),
                     "tokens_per_page": int(b.tokens_per_page), "num_heads": int(b.num_heads),
                     "head_dim": int(b.head_dim)}
                    for b in lc.buffers
                ],
            }
            for lc in group.lifecycles
        ],
    }


def group_from_layout(layout: Mapping[str, Any], bases: Sequence[int], num_slots: int = 1) -> Any:
    """The :class:`~kvcodec_sdk.PoolGroupDesc` of a recorded layout over pools at ``bases``."""
    from .layout import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

    pools = [PoolDesc(int(base), int(p["slot_bytes"]), num_slots) for base, p in zip(bases, layout["pools"])]
    lifecycles = [
        LifeCycleDesc(int(lc["lifecycle_id"]), tuple(
            BufferDesc(b["layer_id"], Role(b["role"]), b["pool_index"], b["byte_offset"], b["bytes"], DType(b["dtype"]),
                       b["tokens_per_page"], b["num_heads"], b["head_dim"])
            for b in lc["buffers"]))
        for lc in layout["lifecycles"]
    ]
    return PoolGroupDesc(pools, lifecycles)
