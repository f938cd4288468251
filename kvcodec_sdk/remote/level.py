"""The worker that runs a manager's remote level: the store I/O of ``CacheLevel.REMOTE``.

The native remote level (``csrc/src/kvcm/remote_level.h``) turns each staged read or write of a
migration into a job of a ``_native.kvcm.RemoteQueue``. :class:`RemoteLevelWorker` is the one
thread that takes those jobs and performs them with the manager's
:class:`~kvcodec_sdk.remote.RemoteBackend`: puts read the blobs in place from the level's pinned
staging or host-tier memory, gets write them there, removals retire anonymous blobs. Every call
is bounded by the backend's ``timeout_s``; any failure finishes the job with an error (the
migration then raises :class:`~kvcodec_sdk.manager.MigrationError` and changes nothing), so neither the
manager's I/O thread nor a caller ever waits longer than the store's time-out.

Store keys: the native level names a blob ``k<lifecycle>/<content key>`` (or an anonymous
``a<nonce>/<n>``); the worker prefixes it with the first 16 hex digits of the identity hash, so
managers of different codecs or layouts never collide on a key, and the backend's value header
refuses a value of another identity anyway.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from dataclasses import dataclass, fields
from typing import Any, Sequence

from .backend import GET_ERROR, RemoteBackend, RemoteError, RemoteFull, Status

__all__ = ["RemoteLevelStats", "RemoteLevelWorker", "blob_name", "find", "start_worker", "store_key"]

log = logging.getLogger("kvcodec_sdk.remote")

_PUT, _GET, _REMOVE = 0, 1, 2
# Per-key put results the native level reads (kvcm::remote_result).
_PUT_RESULT = {Status.OK: 0, Status.FULL: 1, Status.ERROR: 2}


def blob_name(key: bytes, lifecycle: int) -> bytes:
    """The native level's name of the blob of a page with content key ``key`` and lifecycle
    ``lifecycle`` (``k<lifecycle>/<key>``)."""
    from .._native import kvcm

    return bytes(kvcm.KvcmCore.remote_blob_name(bytes(key), int(lifecycle)))


def store_key(identity: bytes, name: bytes) -> bytes:
    """The store key of a blob the native level names ``name``, for a backend of ``identity`` (its
    16-byte identity hash)."""
    return identity[:8].hex().encode() + b"/" + bytes(name)


@dataclass
class RemoteLevelStats:
    """What the worker did (cumulative since the manager was built)."""

    put_batches: int = 0  #: put jobs performed
    get_batches: int = 0  #: get jobs performed
    remove_batches: int = 0  #: removal jobs performed
    failed_batches: int = 0  #: jobs finished with an error (the store failed them as a whole)
    put_seconds: float = 0.0  #: time inside the backend's puts
    get_seconds: float = 0.0  #: time inside the backend's gets

    def as_dict(self) -> dict[str, float]:
        """The counters by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Workers whose manager was not closed are stopped at interpreter exit: a daemon thread that
# returns from a native call while the interpreter finalizes is ended by a forced unwind, which
# aborts the process (SIGABRT) when it crosses the binding's GIL guard.
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_live_workers() -> None:
    for worker in list(_LIVE):
        try:
            worker.stop()
        except Exception:  # exiting anyway: one worker must not keep the others running
            log.exception("remote tier: stopping a worker at exit failed")


class RemoteLevelWorker:
    """Runs the store I/O of one manager's remote level on a thread of its own.

    :param queue: The level's ``_native.kvcm.RemoteQueue``.
    :param backend: The store's backend (built with the manager's identity).
    :param owns_backend: Close the backend when the worker stops.
    """

    def __init__(self, queue: Any, backend: RemoteBackend, owns_backend: bool) -> None:
        self._queue = queue
        self.backend = backend
        self._owns = owns_backend
        # A backend is driven by one thread at a time: the worker and find_remote's lookups.
        self.lock = threading.Lock()
        self.stats = RemoteLevelStats()
        self._thread = threading.Thread(target=self._run, name="kvcodec-remote", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def key(self, name: bytes) -> bytes:
        """The store key of the native level's blob name ``name``."""
        return store_key(self.backend.identity, name)

    def exists(self, names: Sequence[bytes]) -> list[bool]:
        """Whether the store holds a value under each blob name (one bounded backend call)."""
        with self.lock:
            return [bool(x) for x in self.backend.exists_batch([self.key(n) for n in names])]

    def stop(self) -> None:
        """Closes the queue (the manager's tiers were closed first, so nothing is in flight) and
        waits for the thread, which closes an owned backend as it ends. Idempotent."""
        self._queue.close("the remote tier was closed")
        self._thread.join()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            # The queue was closed (the manager closed its tiers, or was collected).
            if self._owns:
                with self.lock:
                    self.backend.close()

    def _serve(self) -> None:
        while True:
            job = self._queue.take(0.2)
            if job is None:
                if self._queue.closed:
                    return
                continue
            try:
                results = self._perform(job)
            except RemoteError as e:
                self.stats.failed_batches += 1
                self._queue.finish(job.id, [], str(e))
            except Exception as e:  # A bug or an unexpected client error: the job fails, the thread lives.
                self.stats.failed_batches += 1
                log.exception("remote tier: a %s batch failed", ("put", "get", "remove")[job.op])
                self._queue.finish(job.id, [], f"{type(e).__name__}: {e}")
            else:
                self._queue.finish(job.id, results, "")

    def _perform(self, job: Any) -> list[int]:
        keys = [self.key(n) for n in job.names]
        with self.lock:
            if job.op == _PUT:
                start = time.perf_counter()
                try:
                    statuses = self.backend.put_batch(keys, job.buffers)
                except RemoteFull as e:  # Per-key outcomes: what was stored stays stored.
                    statuses = list(e.statuses) or [Status.FULL] * len(keys)
                finally:
                    self.stats.put_seconds += time.perf_counter() - start
                self.stats.put_batches += 1
                return [_PUT_RESULT.get(Status(s), 2) for s in statuses]
            if job.op == _GET:
                start = time.perf_counter()
                try:
                    codes = self.backend.get_batch(keys, job.buffers)
                finally:
                    self.stats.get_seconds += time.perf_counter() - start
                self.stats.get_batches += 1
                return [int(c) if isinstance(c, int) else GET_ERROR for c in codes]
            self.backend.remove_batch(keys)
            self.stats.remove_batches += 1
            return [0] * len(keys)


def start_worker(remote: Any, identity: Any, queue: Any) -> RemoteLevelWorker:
    """The worker of a manager's remote level: ``remote`` is its
    :class:`~kvcodec_sdk.RemoteTierConfig`, ``identity`` the manager's codec identity (a
    :class:`~kvcodec_sdk.disk.CodecIdentity`), ``queue`` the level's ``RemoteQueue``. A backend given
    as a callable is built here (and owned: closed with the worker); one given as is must carry
    ``identity``, or :class:`~kvcodec_sdk.KVCacheConfigError` says which to build it with."""
    from ..kvcm_config import KVCacheConfigError
    from .backend import identity_hash

    backend, owned = remote.backend, False
    if not isinstance(backend, RemoteBackend):
        backend, owned = remote.backend(identity), True
        if not isinstance(backend, RemoteBackend):
            raise KVCacheConfigError(
                f"KVCacheConfig.remote.backend returned a {type(backend).__name__}; it must return a "
                "kvcodec_sdk.remote.RemoteBackend"
            )
    if backend.identity != identity_hash(identity):
        if owned:
            backend.close()
        raise KVCacheConfigError(
            f"KVCacheConfig.remote.backend was built for another codec identity; build it with "
            f"identity={identity.name}/{identity.format_version}/{identity.param_hash} "
            "(KVCacheManager.remote_identity(config, codec)), or pass a callable that takes the identity"
        )
    return RemoteLevelWorker(queue, backend, owned)


def find(worker: RemoteLevelWorker, core: Any, keys: Sequence[bytes], lifecycle: int | None) -> Any:
    """The page ids :meth:`~kvcodec_sdk.KVCacheManager.find_remote` returns (0: not found): one
    batched existence check per lifecycle tried (``lifecycle``, or each in order when None), then
    the native level claims the keys found."""
    count = int(core.num_lifecycles())
    if lifecycle is not None and not (isinstance(lifecycle, int) and 0 <= lifecycle < count):
        raise ValueError(f"lifecycle is {lifecycle!r}; valid lifecycles are 0..{count - 1}, or None for all")
    found = [-1] * len(keys)
    for lc in range(count) if lifecycle is None else [lifecycle]:
        todo = [i for i, f in enumerate(found) if f < 0]
        if not todo:
            break
        for i, there in zip(todo, worker.exists([blob_name(keys[i], lc) for i in todo])):
            if there:
                found[i] = lc
    return core.find_remote(list(keys), found)
