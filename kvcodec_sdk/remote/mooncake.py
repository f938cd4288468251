"""A remote cold tier on Mooncake Store: one object per content key, batched puts and gets.

The client is the ``mooncake`` package (``pip install mooncake-transfer-engine-non-cuda``), which
loads ``libibverbs.so.1`` even over TCP (``scripts/fetch-ibverbs.sh`` in the repository fetches it
without root) and should be told ``MC_TCP_BIND_ADDRESS``. It is imported when a backend is built,
so the SDK does not depend on it. Only the TCP transport is supported (and tested).

Why each choice:

- **Every client call runs on a worker thread and is waited for at most ``timeout_s``.** The
  client's own time-outs are long (with the master stopped, a get returned after 39 s and a put
  after 30 s; a setup against a dead master took 90 s; once a master died, each later call took
  about 4 s to fail). A call that overran raises :class:`RemoteTimeout`; until it returns, later
  calls raise :class:`RemoteUnavailable` at once rather than queue behind it. One batch is one
  worker call, however many client calls it makes, so the whole batch is bounded. A call that
  overran while the master's port refuses connections raises :class:`RemoteUnavailable` instead
  (the client may wait seconds on a dead master before failing: a time-out there would hide
  that the store is gone).
- **Gets read into the backend's own staging buffers** (``batch_get_into``, one per key: the
  caller's buffer size plus the header), and only the caller's thread, once a value has landed,
  checks it and copies its payload out (one native call per run, without the GIL, a large run's
  values over several threads): a late reply never writes into a caller's buffer. A
  batch is read in runs of about 16 MiB (``get_run_bytes``), one ``batch_get_into`` each, so the
  caller checks one run while the worker reads the next.
  The staging buffers are cut from an arena of up to 256 MiB kept between calls (fresh pages cost
  more than the transfer); a call starts only once the previous one returned, so no late reply
  lands in a reused arena. ``batch_get_into`` also answers per key why a key has no data (not
  found, -704; the master unreachable, -900), which the client's ``get_batch`` does not: it
  answers ``b''`` for both, and its ``health_check()`` is no reliable tie-breaker (in one run it
  still answered healthy 4 s after the master was killed).
- **A master that is unreachable fails the batch** with :class:`RemoteUnavailable` (RPC codes
  -900/-901 for any key), never a run of silent misses.
- **Puts read the caller's buffers in place** (``batch_put_from_multi_buffers``: the header and
  the payload are two parts of one object), answering one code per key; no space (-200) is
  :class:`RemoteFull`. The client's own ``put_batch`` copies each value into its local buffer
  and refuses a batch that does not fit there as a whole; this one has no such limit, and needs
  no joined copy of header and payload. The buffers are held until the client's call returns.
- **A key already stored keeps its first value** (the store's put does not overwrite; content keys
  name one blob, so that is the same blob).
- **Removal is forced** (``batch_remove(force=True)``): the master holds a lease on an object for
  ``--default_kv_lease_ttl`` after each read or write, and an unforced remove fails until it ends.
- **Keys are ``prefix + hex(content key)``** (the store's keys are strings).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from .backend import (
    GET_ERROR,
    GET_MISS,
    GET_TOO_SMALL,
    HEADER_BYTES,
    RemoteBackend,
    RemoteError,
    RemoteFull,
    RemoteTimeout,
    RemoteUnavailable,
    Status,
    byte_view,
)

__all__ = ["MooncakeBackend"]

_T = TypeVar("_T")
_NO_SPACE = -200  # NO_AVAILABLE_HANDLE: the segments are full
_INVALID = -600  # INVALID_PARAMS: e.g. a value larger than the get's buffer
_NOT_FOUND = -704  # OBJECT_NOT_FOUND
_UNREACHABLE = (-900, -901)  # RPC_FAIL, RPC_TIMEOUT: the master does not answer
_MIN_SEGMENT = 16 << 20  # the client refuses a smaller global segment (-600)
_ARENA_MAX = 256 << 20  # a get batch needing more staging than this gets it fresh, not kept


def _first_unreachable(codes: Sequence[int]) -> int | None:
    """The first code in ``codes`` saying the master did not answer, or None."""
    return next((c for c in codes if c in _UNREACHABLE), None)


def _runs(sizes: Sequence[int], run_bytes: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` index ranges of ``sizes``, each about ``run_bytes`` (at least one key)."""
    runs, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        total += n
        if total >= run_bytes:
            runs.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs


def _import_store() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        hint = (" (libibverbs.so.1: run scripts/fetch-ibverbs.sh DIR and put the printed LD_LIBRARY_PATH "
                "in the environment)") if "ibverbs" in str(e) or "libnl" in str(e) else ""
        raise ImportError(
            f"MooncakeBackend needs the Mooncake Store client: pip install mooncake-transfer-engine-non-cuda{hint}: {e}"
        ) from None
    return MooncakeDistributedStore


class _Call:
    """One client call on a daemon thread (a stuck client call never blocks interpreter exit)."""

    def __init__(self, fn: Callable[[], Any], keep: Any = None) -> None:
        self.keep = keep  # memory the client reads or writes through raw pointers, alive until it returns
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), daemon=True, name="kvcodec-mooncake-call").start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            self.done.set()


class MooncakeBackend(RemoteBackend):
    """A :class:`~kvcodec_sdk.remote.backend.RemoteBackend` on a Mooncake Store cluster (TCP transport).

    The backend is a Mooncake client: it also contributes ``global_segment_size`` bytes of this
    process's memory to the store (objects put by any client may live there while it runs, and
    are lost when it closes). A master restart loses every object; the client rejoins by itself
    within seconds (puts find no space until it has remounted its segment).

    :param master_address: The master's RPC address, ``host:port``.
    :param metadata_server: The metadata server's URL (the master's embedded one:
        ``http://host:port/metadata``).
    :param identity: The codec identity written into and required of every value.
    :param timeout_s: Bound of each call (a whole batch), in seconds.
    :param local_hostname: This client's address as the other clients reach it.
    :param global_segment_size: Bytes of this process's memory mounted into the store (at least
        16 MiB: the client refuses less).
    :param local_buffer_size: Bytes of the client's own transfer buffer (this backend's puts and gets
        do not stage through it).
    :param protocol: The transport: ``"tcp"`` (the only one supported).
    :param prefix: Put before every key in the store (namespaces this tier).
    :param setup_timeout_s: Bound of joining the cluster (default: ``timeout_s``).
    """

    name = "mooncake"
    #: Bytes of values a get reads per ``batch_get_into`` (at least one value): the caller's thread
    #: checks one run while the worker reads the next.
    get_run_bytes: int = 16 << 20

    def __init__(self, master_address: str, metadata_server: str, *, identity: Any, timeout_s: float = 5.0,
                 local_hostname: str = "127.0.0.1", global_segment_size: int = 64 << 20,
                 local_buffer_size: int = 16 << 20, protocol: str = "tcp", prefix: str = "kvcodec/",
                 setup_timeout_s: float | None = None) -> None:
        super().__init__(identity, timeout_s)
        host, _, port = master_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"master_address: {master_address!r} is not valid: give host:port")
        if protocol != "tcp":
            raise ValueError(f"protocol: {protocol!r} is not supported: give 'tcp' (gets read into memory that "
                             "is not registered with the transfer engine, which RDMA would need)")
        for field, size, least in (("global_segment_size", global_segment_size, _MIN_SEGMENT),
                                   ("local_buffer_size", local_buffer_size, 1)):
            if not isinstance(size, int) or isinstance(size, bool) or size < least:
                raise ValueError(f"{field}: {size!r} is not valid: give a number of bytes >= {least}")
        if setup_timeout_s is not None and not (isinstance(setup_timeout_s, (int, float)) and setup_timeout_s > 0):
            raise ValueError(f"setup_timeout_s: {setup_timeout_s!r} is not valid: give seconds > 0, or None")
        self._address = master_address
        self.prefix = str(prefix)
        self._inflight: _Call | None = None
        self._arena: np.ndarray | None = None
        self._closed = False
        store_cls = _import_store()
        self._master = (host, int(port))
        refused = self._master_refuses(self.timeout_s)  # a dead master makes setup wait 90 s: look first
        if refused is not None:
            self._closed = True
            raise self._error(RemoteUnavailable, "setup", f"the master does not answer: {refused}")
        self._store = store_cls()
        try:
            rc = self._run("setup", lambda: self._store.setup(
                local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, "",
                master_address), setup_timeout_s)
        except RemoteError:
            self._closed = True
            raise
        if rc != 0:
            self._closed = True
            raise self._error(RemoteUnavailable, "setup", f"the client could not join the store (code {rc})")

    @property
    def address(self) -> str:
        """The master's address, ``host:port``."""
        return self._address

    def _master_refuses(self, timeout_s: float) -> OSError | None:
        """Why a TCP connection to the master failed within ``timeout_s``, or None if it opened."""
        try:
            socket.create_connection(self._master, timeout=timeout_s).close()
        except OSError as e:
            return e
        return None

    def _start(self, op: str, fn: Callable[[], Any], keep: Any = None) -> _Call:
        """Start ``fn`` on a worker thread (``keep`` held until it returns, however late)."""
        if self._closed:
            raise self._error(RemoteUnavailable, op, "the backend is closed")
        if self._inflight is not None and not self._inflight.done.is_set():
            raise self._error(RemoteUnavailable, op, "an earlier call that timed out has not returned yet")
        self._inflight = _Call(fn, keep)
        return self._inflight

    def _overran(self, op: str, bound: float) -> RemoteError:
        """The error of a call that did not answer within ``bound`` seconds."""
        refused = self._master_refuses(min(bound, 0.5))
        if refused is not None:
            return self._error(RemoteUnavailable, op, f"no answer within {bound:g} s, and the master does "
                               f"not answer: {refused}")
        return self._error(RemoteTimeout, op, f"no answer within {bound:g} s")

    def _run(self, op: str, fn: Callable[[], _T], timeout_s: float | None = None, keep: Any = None) -> _T:
        """Run ``fn`` on a worker thread, waiting at most ``timeout_s`` (default: the backend's);
        ``keep`` is held until ``fn`` returns, however late."""
        call = self._start(op, fn, keep)
        bound = self.timeout_s if timeout_s is None else float(timeout_s)
        if not call.done.wait(bound):
            raise self._overran(op, bound)
        if call.error is not None:
            raise self._error(RemoteError, op, call.error) from call.error
        return call.result

    def _key(self, key: bytes) -> str:
        return self.prefix + key.hex()

    def _unreachable(self, op: str, codes: Sequence[int]) -> None:
        bad = _first_unreachable(codes)
        if bad is not None:
            raise self._error(RemoteUnavailable, op, f"the master is unreachable (code {bad})")

    def put_batch(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[Status]:
        """Store each value behind its header, header and payload as two parts of one object, the
        payload read straight from the caller's buffer (one ``batch_put_from_multi_buffers``); see
        :meth:`~kvcodec_sdk.remote.RemoteBackend.put_batch`. A key already stored keeps
        its first value (content keys: the same blob).

        After a :class:`RemoteTimeout` the client may still read ``values`` until its call returns
        (the backend holds them): a buffer changed meanwhile stores a value whose payload checksum
        fails, which every read refuses.

        :raises RemoteUnavailable: the master did not answer for some key.
        """
        keys = self._check_keys(keys, values, "values")
        payloads = [np.frombuffer(byte_view(v, f"values[{i}]"), dtype=np.uint8) for i, v in enumerate(values)]
        headers = np.frombuffer(self._headers(keys, payloads), dtype=np.uint8)
        ptrs, sizes = [], []
        for i, p in enumerate(payloads):
            head = headers.ctypes.data + i * HEADER_BYTES
            ptrs.append([head, p.ctypes.data] if p.size else [head])
            sizes.append([HEADER_BYTES, p.size] if p.size else [HEADER_BYTES])
        skeys = [self._key(k) for k in keys]
        store = self._store

        def work() -> list[int]:
            return [int(c) for c in store.batch_put_from_multi_buffers(skeys, ptrs, sizes)]

        # The call holds the buffers behind ``ptrs`` until it returns, even past a time-out.
        codes = self._run("put_batch", work, keep=(payloads, headers)) if keys else []
        statuses = [Status.OK if c == 0 else Status.FULL if c == _NO_SPACE else Status.ERROR for c in codes]
        self._count_puts(statuses, [p.size for p in payloads])
        self._unreachable("put_batch", codes)
        self.stats.errors += statuses.count(Status.ERROR)
        if Status.FULL in statuses:
            raise RemoteFull(self.name, self.address, "put_batch",
                             f"no space in the store (code {_NO_SPACE}); {statuses.count(Status.OK)} of {len(keys)} "
                             "stored", statuses)
        return statuses

    def get_batch(self, keys: Sequence[bytes], out_buffers: Sequence[Any]) -> list[int]:
        """Read each key's value into a staging buffer, check it and copy its payload out; see
        :meth:`~kvcodec_sdk.remote.RemoteBackend.get_batch`. A caller's buffer is written only
        for a hit.

        The keys are read in runs of about :attr:`get_run_bytes` (one ``batch_get_into`` each, in
        turn, on the worker thread), and the caller's thread checks and copies out each run as
        soon as it has landed, while the worker reads the next: the check overlaps the transfer.

        :raises RemoteUnavailable: the master did not answer for some key.
        """
        keys = self._check_keys(keys, out_buffers, "out_buffers")
        outs = [byte_view(b, f"out_buffers[{i}]", writable=True) for i, b in enumerate(out_buffers)]
        if not keys and not self._closed:  # nothing to ask (a closed backend still raises)
            return []
        skeys = [self._key(k) for k in keys]
        sizes = [len(out) + HEADER_BYTES for out in outs]
        staging = self._staging_for(sizes)
        ptrs = [s.ctypes.data for s in staging]
        runs = _runs(sizes, self.get_run_bytes)
        landed: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        store = self._store

        def work() -> None:
            """Per run, in turn: each key's value size or a code, and for values too large for their
            staging, their size. Stops after a run where the master did not answer, or when asked."""
            try:
                for a, b in runs:
                    if stop.is_set():
                        return
                    codes = [int(c) for c in store.batch_get_into(skeys[a:b], ptrs[a:b], sizes[a:b])]
                    large = {i: int(store.get_size(skeys[i])) for i, c in zip(range(a, b), codes) if c == _INVALID}
                    landed.put((a, codes, large))
                    if _first_unreachable([*codes, *large.values()]) is not None:
                        return  # the caller fails the batch on this run
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
                landed.put(e)
                raise

        op, bound = "get_batch", self.timeout_s
        call = self._start(op, work)
        deadline = time.monotonic() + bound
        out: list[int] = [GET_ERROR] * len(keys)
        try:
            for _ in runs:
                try:
                    got = landed.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise self._overran(op, bound) from None
                if isinstance(got, BaseException):
                    raise self._error(RemoteError, op, got) from got
                a, codes, large = got
                self._unreachable(op, [*codes, *large.values()])
                hits = [i for i, code in zip(range(a, a + len(codes)), codes) if code >= 0]
                if hits:  # one native call for the run's values (checked and copied without the GIL)
                    unpacked = self._unpack_values([keys[i] for i in hits], [staging[i][:codes[i - a]] for i in hits],
                                                   [outs[i] for i in hits])
                    for i, code in zip(hits, unpacked):
                        out[i] = code
                for i, code in zip(range(a, a + len(codes)), codes):
                    if code >= 0:
                        continue
                    elif code == _NOT_FOUND or large.get(i) == _NOT_FOUND:
                        out[i] = self._count_get(GET_MISS)
                    elif code == _INVALID and large[i] > staging[i].size:
                        out[i] = self._count_get(GET_TOO_SMALL)
                    else:
                        out[i] = self._count_get(GET_ERROR)
        finally:
            # On a failure the worker reads no further run; either way it is let finish within the
            # bound, so the next call finds it done.
            stop.set()
            call.done.wait(max(0.0, deadline - time.monotonic()))
        return out

    def _staging_for(self, sizes: Sequence[int]) -> list[np.ndarray]:
        """One staging buffer per size, cut from an arena kept between calls (fresh pages cost more
        than the transfer). Reusing it is safe: a call starts only once the previous one returned."""
        total = sum(sizes)
        if total > _ARENA_MAX:
            arena = np.empty(total, dtype=np.uint8)
        else:
            if self._arena is None or self._arena.size < total:
                self._arena = np.empty(max(total, 1 << 20), dtype=np.uint8)
            arena = self._arena
        offsets = np.cumsum([0, *sizes])
        return [arena[a:b] for a, b in zip(offsets[:-1], offsets[1:])]

    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key holds an object (``batch_is_exist``, not checked).

        :raises RemoteUnavailable: the master did not answer.
        """
        keys = self._check_keys(keys)
        if not keys and not self._closed:  # nothing to ask (a closed backend still raises)
            return []
        skeys = [self._key(k) for k in keys]
        found = [int(f) for f in self._run("exists_batch", lambda: self._store.batch_is_exist(skeys))]
        self._unreachable("exists_batch", found)
        return [f == 1 for f in found]

    def remove_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Remove each key's object, leases notwithstanding (``batch_remove(force=True)``); True
        where one was removed.

        :raises RemoteUnavailable: the master did not answer.
        """
        keys = self._check_keys(keys)
        if not keys and not self._closed:  # nothing to ask (a closed backend still raises)
            return []
        skeys = [self._key(k) for k in keys]
        codes = [int(c) for c in self._run("remove_batch", lambda: self._store.batch_remove(skeys, True))]
        self._unreachable("remove_batch", codes)
        return [c == 0 for c in codes]

    def healthy(self) -> bool:
        """The client's own view of the master (``health_check() == 0``; it may lag a master's
        death), False instead of an error."""
        try:
            return self._run("health_check", self._store.health_check) == 0
        except RemoteError:
            return False

    def close(self) -> None:
        """Leave the store (bounded by ``timeout_s``); later calls raise :class:`RemoteUnavailable`.
        Idempotent. Where a call that timed out has not returned, the client is left to the
        interpreter's exit (its segment stays mounted until then)."""
        if self._closed:
            return
        try:
            if self._inflight is None or self._inflight.done.is_set():
                self._run("close", self._store.close)
        except RemoteError:
            pass  # a dead master: the client's own clean-up finishes in the background
        finally:
            self._closed = True
