"""A remote cold tier on Valkey (or Redis): one string value per content key, pipelined batches.

Every batch is one pipeline (one round trip, no transaction: each key stands alone). The client
is the ``valkey`` package (RESP over TCP, pure Python); it is imported when a backend is built,
so the SDK does not depend on it (``pip install kvcodec-sdk[remote]``).

Why each choice:

- **No retries, socket timeouts on connect, send and receive.** A store that is down or stalled
  fails the call within ``timeout_s`` per socket operation with :class:`RemoteUnavailable` or
  :class:`RemoteTimeout`; the engine thread that waits on the tier is never hung. The client
  drops a connection that failed, so a late reply can never be taken for the next call's.
- **Replies are read in full before any buffer is written.** A connection that dies mid-batch
  leaves the caller's buffers as they were, and the call raises.
- **Plain ``SET`` (overwrite), optional ``EX``.** A content key names one blob, so overwriting is
  harmless and repairs a value that was damaged; eviction (``maxmemory-policy``) and expiry are
  the store's. With ``noeviction`` a full store answers ``OOM``: :class:`RemoteFull`.
- **The payload is sent from the caller's buffer.** A value is its header and the payload, sent as
  two pieces of one bulk string (the same bytes on the wire as the joined value): joining them into
  one copy first cost as much time as the checksum.
- **A key prefix.** The store may be shared with other applications: every key is
  ``prefix + content key``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from .backend import (
    GET_ERROR,
    HEADER_BYTES,
    RemoteBackend,
    RemoteError,
    RemoteFull,
    RemoteTimeout,
    RemoteUnavailable,
    Status,
    byte_view,
)

__all__ = ["ValkeyBackend"]

_T = TypeVar("_T")


class _SplitValue:
    """A command argument sent as its header and its payload, one after the other, without a copy
    that joins them (``_split_value_connection``)."""

    __slots__ = ("header", "payload")

    def __init__(self, header: bytes, payload: memoryview) -> None:
        self.header, self.payload = header, payload


def _split_value_connection(valkey: Any) -> type:
    """A ``valkey.Connection`` whose command packer sends a :class:`_SplitValue` argument as one
    bulk string made of two chunks (the RESP bytes are the same as for the joined value)."""

    class SplitValuePacker:
        def __init__(self, inner: Any, encode: Callable[[Any], Any]) -> None:
            self.inner, self.encode = inner, encode

        def pack(self, *args: Any) -> list[Any]:
            if not any(isinstance(a, _SplitValue) for a in args):
                return self.inner.pack(*args)
            out: list[Any] = []
            buff = b"*%d\r\n" % len(args)
            for a in args:
                if isinstance(a, _SplitValue):
                    out.append(buff + b"$%d\r\n" % (len(a.header) + len(a.payload)) + a.header)
                    out.append(a.payload)
                    buff = b"\r\n"
                else:
                    a = bytes(self.encode(a))
                    buff += b"$%d\r\n" % len(a) + a + b"\r\n"
            out.append(buff)
            return out

    class SplitValueConnection(valkey.connection.Connection):
        def _construct_command_packer(self, packer: Any) -> Any:
            return SplitValuePacker(super()._construct_command_packer(packer), self.encoder.encode)

    return SplitValueConnection


def _import_valkey() -> Any:
    try:
        import valkey
    except ImportError:
        raise ImportError(
            "ValkeyBackend needs the 'valkey' client package: pip install kvcodec-sdk[remote] (or pip install valkey)"
        ) from None
    return valkey


class ValkeyBackend(RemoteBackend):
    """A :class:`~kvcodec_sdk.remote.backend.RemoteBackend` on a Valkey or Redis server.

    :param host: The server's host name or address.
    :param port: The server's TCP port.
    :param identity: The codec identity written into and required of every value.
    :param timeout_s: Bound of each socket operation (connect, send, receive), in seconds.
    :param prefix: Bytes put before every content key in the store (namespaces this tier).
    :param ttl_s: Expiry of each stored value in whole seconds, or None to keep values until the
        store evicts them.
    :param db: The server's database number.
    :param password: The server's password (``AUTH``), or None.
    """

    name = "valkey"

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, identity: Any, timeout_s: float = 2.0,
                 prefix: bytes = b"kvcodec:", ttl_s: int | None = None, db: int = 0,
                 password: str | None = None) -> None:
        super().__init__(identity, timeout_s)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"port: {port!r} is not valid: give a TCP port 1..65535")
        if not isinstance(prefix, (bytes, bytearray)):
            raise TypeError(f"prefix: {prefix!r} is not valid: give bytes (may be empty)")
        if ttl_s is not None and (not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or ttl_s <= 0):
            raise ValueError(f"ttl_s: {ttl_s!r} is not valid: give whole seconds > 0, or None")
        self._valkey = _import_valkey()
        self._address = f"{host}:{port}"
        self.prefix = bytes(prefix)
        self.ttl_s = ttl_s
        pool = self._valkey.ConnectionPool(
            connection_class=_split_value_connection(self._valkey), host=host, port=port, db=db, password=password,
            socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s, retry_on_timeout=False,
            health_check_interval=0)
        self._client: Any = self._valkey.Valkey(connection_pool=pool)
        self._closed = False

    @property
    def address(self) -> str:
        """The server's address, ``host:port``."""
        return self._address

    def _call(self, op: str, fn: Callable[[], _T]) -> _T:
        """Run one client call, turning the client's failures into this tier's errors."""
        if self._closed:
            raise self._error(RemoteUnavailable, op, "the backend is closed")
        exc = self._valkey.exceptions
        try:
            return fn()
        except exc.TimeoutError as e:
            raise self._error(RemoteTimeout, op, f"no answer within {self.timeout_s:g} s ({e})") from e
        except exc.ConnectionError as e:  # refused, reset, closed, or still loading its data
            raise self._error(RemoteUnavailable, op, e) from e
        except exc.ValkeyError as e:  # e.g. NOAUTH, a wrong database: the call as a whole
            raise self._error(RemoteError, op, e) from e
        except OSError as e:
            raise self._error(RemoteUnavailable, op, e) from e

    def _pipeline(self, op: str, queue: Callable[[Any], None]) -> list[Any]:
        """One round trip: ``queue(pipe)`` adds the commands; per-command errors come back as values."""
        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute(raise_on_error=False))

        return self._call(op, run)

    def ping(self) -> bool:
        """Whether the server answers (False instead of an error)."""
        try:
            return bool(self._call("ping", self._client.ping))
        except RemoteError:
            return False

    def put_batch(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[Status]:
        """Store each value behind its header under ``prefix + key`` in one pipeline; see
        :meth:`~kvcodec_sdk.remote.RemoteBackend.put_batch`."""
        keys = self._check_keys(keys, values, "values")
        payloads = [byte_view(v, f"values[{i}]") for i, v in enumerate(values)]
        headers = self._headers(keys, payloads)
        # Header and payload go out as two pieces of one bulk string: the payload is sent from the
        # caller's buffer, never joined into a copy (that copy cost as much as the CRC).
        packed = [_SplitValue(headers[i * HEADER_BYTES:(i + 1) * HEADER_BYTES], p) for i, p in enumerate(payloads)]
        sizes = [len(p.payload) for p in packed]

        def queue(pipe: Any) -> None:
            for k, p in zip(keys, packed):
                pipe.set(self.prefix + k, p, ex=self.ttl_s)

        replies = self._pipeline("put_batch", queue)
        statuses, full = [], []
        oom = self._valkey.exceptions.OutOfMemoryError  # the server's "OOM" reply (maxmemory, noeviction)
        for r in replies:
            if isinstance(r, oom) or (isinstance(r, Exception) and str(r).startswith("OOM")):
                statuses.append(Status.FULL)
                full.append(str(r))
            elif isinstance(r, Exception):
                statuses.append(Status.ERROR)
                self.stats.errors += 1
            else:
                statuses.append(Status.OK if r else Status.ERROR)
        self._count_puts(statuses, sizes)
        if full:
            stored = statuses.count(Status.OK)
            raise RemoteFull(self.name, self.address, "put_batch",
                             f"{len(full)} of {len(keys)} values did not fit ({stored} stored): {full[0]}", statuses)
        return statuses

    def get_batch(self, keys: Sequence[bytes], out_buffers: Sequence[Any]) -> list[int]:
        """Read each key's value in one pipeline, check it and copy its payload out; see
        :meth:`~kvcodec_sdk.remote.RemoteBackend.get_batch`."""
        keys = self._check_keys(keys, out_buffers, "out_buffers")
        outs = [byte_view(b, f"out_buffers[{i}]", writable=True) for i, b in enumerate(out_buffers)]
        replies = self._pipeline("get_batch", lambda pipe: [pipe.get(self.prefix + k) for k in keys])
        codes = [GET_ERROR] * len(keys)
        landed = []
        for i, r in enumerate(replies):
            if isinstance(r, Exception):
                codes[i] = self._count_get(GET_ERROR)
            else:
                landed.append(i)
        if landed:  # one native call for every value (checked and copied without the GIL)
            for i, code in zip(landed, self._unpack_values([keys[i] for i in landed], [replies[i] for i in landed],
                                                           [outs[i] for i in landed])):
                codes[i] = code
        return codes

    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each ``prefix + key`` holds a value (``EXISTS``, one pipeline)."""
        keys = self._check_keys(keys)
        replies = self._pipeline("exists_batch", lambda pipe: [pipe.exists(self.prefix + k) for k in keys])
        return [not isinstance(r, Exception) and int(r) > 0 for r in replies]

    def remove_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Remove each ``prefix + key`` (``DEL``, one pipeline); True where a value was removed."""
        keys = self._check_keys(keys)
        replies = self._pipeline("remove_batch", lambda pipe: [pipe.delete(self.prefix + k) for k in keys])
        return [not isinstance(r, Exception) and int(r) > 0 for r in replies]

    def close(self) -> None:
        """Close the connection; later calls raise :class:`RemoteUnavailable`. Idempotent."""
        if not self._closed:
            self._closed = True
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - a dead server's socket may fail to close cleanly
                pass
