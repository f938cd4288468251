"""The remote cold tier's backend interface, its errors and the header of every stored value.

A backend stores batches of ``(content key, blob bytes)`` in a remote key-value store. Each
value it stores is a :data:`HEADER_BYTES`-byte header written by this layer followed by the blob
(the payload). The header names the codec whose blob it is and checksums the payload, so a read
returns a blob only when it is exactly what a writer of the same codec stored under that key:
anything else is a miss, counted in :class:`RemoteStats`, never data. The key's checksum in the
header guards against a value answered for another key (a client that lost track of its replies
after a timeout, a store that moved a value).

Header format (little-endian, 48 bytes, version 1)::

    offset size field
     0      4   magic            b"KVRB"
     4      2   format version   1
     6      2   header bytes     48
     8      4   flags            0 (reserved)
    12      4   key CRC-32C      of the content key the value was stored under
    16      8   payload length   bytes of blob after the header
    24      4   payload CRC-32C  of the payload (Castagnoli, the disk tier's checksum)
    28     16   identity hash    first 16 bytes of SHA-256 of the codec identity string
    44      4   header CRC-32C   of bytes 0..43

The checksum is the SDK's native CRC-32C (:func:`kvcodec_sdk.disk.crc32c`, hardware-accelerated
where the CPU allows).
"""

from __future__ import annotations

import abc
import enum
import hashlib
import struct
from dataclasses import dataclass, fields
from typing import Any, Sequence

from .. import _native
from ..disk import crc32c

__all__ = [
    "GET_CORRUPT",
    "GET_ERROR",
    "GET_MISMATCH",
    "GET_MISS",
    "GET_TOO_SMALL",
    "HEADER_BYTES",
    "HEADER_MAGIC",
    "HEADER_VERSION",
    "RemoteBackend",
    "RemoteError",
    "RemoteFull",
    "RemoteStats",
    "RemoteTimeout",
    "RemoteUnavailable",
    "Status",
    "ValueHeader",
    "identity_hash",
]

HEADER_MAGIC = b"KVRB"
HEADER_VERSION = 1
HEADER_BYTES = 48
_HEAD = struct.Struct("<4sHHIIQI16s")  # the 44 bytes the header CRC covers
_CRC = struct.Struct("<I")

#: :meth:`RemoteBackend.get_batch` codes (negative; a non-negative entry is the payload bytes read).
GET_MISS = -1  #: no value under the key
GET_MISMATCH = -2  #: a value written by another codec identity (counted as a mismatch)
GET_CORRUPT = -3  #: bad magic, version, length or checksum (counted as corrupt)
GET_TOO_SMALL = -4  #: the caller's buffer is smaller than the stored payload
GET_ERROR = -5  #: the store reported an error for this key alone


class Status(enum.IntEnum):
    """Outcome of one key of :meth:`RemoteBackend.put_batch`."""

    OK = 0  #: stored
    FULL = 1  #: the store has no room (the batch raises :class:`RemoteFull`)
    ERROR = 2  #: the store refused this key for another reason (logged in the stats' errors)


class RemoteError(Exception):
    """A remote store operation failed as a whole.

    :ivar backend: The backend's name (``"valkey"``, ``"mooncake"``).
    :ivar address: The store's address (``host:port``).
    :ivar op: The operation that failed (``"put_batch"``, ``"get_batch"``, ...).
    :ivar detail: What the store or the client said.
    """

    def __init__(self, backend: str, address: str, op: str, detail: str) -> None:
        self.backend, self.address, self.op, self.detail = backend, address, op, detail
        super().__init__(f"{backend} store at {address}: {op} failed: {detail}")


class RemoteUnavailable(RemoteError):
    """The store cannot be reached (refused, reset or closed connection, backend closed)."""


class RemoteTimeout(RemoteError):
    """The store did not answer within the backend's ``timeout_s``."""


class RemoteFull(RemoteError):
    """The store has no room for a value (e.g. Valkey's ``maxmemory`` with ``noeviction``).

    :ivar statuses: Per-key outcome of the batch that raised it: keys marked
        :attr:`Status.OK` were stored.
    """

    def __init__(self, backend: str, address: str, op: str, detail: str, statuses: Sequence[Status] = ()) -> None:
        super().__init__(backend, address, op, detail)
        self.statuses = list(statuses)


@dataclass
class RemoteStats:
    """Counters of one backend (cumulative since it was built)."""

    puts: int = 0  #: values stored
    put_bytes: int = 0  #: payload bytes stored
    put_failures: int = 0  #: keys not stored (full or refused)
    hits: int = 0  #: payloads returned
    get_bytes: int = 0  #: payload bytes returned
    misses: int = 0  #: keys with no value
    mismatches: int = 0  #: values of another codec identity, refused
    corrupt: int = 0  #: values with a bad magic, version, length or checksum, refused
    too_small: int = 0  #: values larger than the caller's buffer, refused
    errors: int = 0  #: per-key store errors

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def identity_hash(identity: Any) -> bytes:
    """16-byte hash of a codec identity: a string, bytes, or a :class:`~kvcodec_sdk.disk.CodecIdentity`.

    A ``CodecIdentity`` is hashed as ``"name/format_version/param_hash"``.
    """
    if hasattr(identity, "param_hash") and hasattr(identity, "name"):
        identity = f"{identity.name}/{int(identity.format_version)}/{identity.param_hash}"
    if isinstance(identity, str):
        identity = identity.encode()
    if not isinstance(identity, (bytes, bytearray)) or not identity:
        raise ValueError(f"identity: {identity!r} is not valid: give a non-empty str, bytes or CodecIdentity")
    return hashlib.sha256(bytes(identity)).digest()[:16]


def byte_view(buf: Any, field: str, writable: bool = False) -> memoryview:
    """A flat ``uint8`` memoryview of a C-contiguous buffer, or a clear ``TypeError``/``ValueError``."""
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"{field}: {type(buf).__name__} is not a buffer: give bytes, bytearray, memoryview or a numpy array") from None
    if not mv.c_contiguous:
        raise ValueError(f"{field}: the buffer is not C-contiguous: give a contiguous buffer")
    if writable and mv.readonly:
        raise ValueError(f"{field}: the buffer is read-only: give a writable buffer (bytearray, numpy array)")
    return mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv


@dataclass(frozen=True)
class ValueHeader:
    """The header of one stored value (see the module docstring for the layout)."""

    payload_len: int
    payload_crc: int
    identity: bytes
    key_crc: int

    def pack(self) -> bytes:
        """The 48 header bytes."""
        head = _HEAD.pack(HEADER_MAGIC, HEADER_VERSION, HEADER_BYTES, 0, self.key_crc, self.payload_len,
                          self.payload_crc, self.identity)
        return head + _CRC.pack(crc32c(head))

    @classmethod
    def for_payload(cls, key: bytes, payload: memoryview, identity: bytes) -> ValueHeader:
        """The header of ``payload`` stored under ``key`` by ``identity`` (a 16-byte :func:`identity_hash`)."""
        return cls(len(payload), crc32c(payload), identity, crc32c(key))

    @staticmethod
    def check(header: Any, key: bytes, identity: bytes, stored_len: int | None = None) -> tuple[int, int]:
        """Check a stored header: ``(payload_len, payload_crc)``, or ``(GET_*, 0)`` when it is refused.

        ``key`` is the content key the value was read under; ``stored_len`` is the value's total
        size where the store reports it: the header's payload length must match it exactly.
        """
        h = bytes(header[:HEADER_BYTES])
        if len(h) < HEADER_BYTES:
            return GET_CORRUPT, 0
        magic, version, hbytes, _flags, key_crc, plen, pcrc, ident = _HEAD.unpack_from(h)
        if magic != HEADER_MAGIC or version != HEADER_VERSION or hbytes != HEADER_BYTES:
            return GET_CORRUPT, 0
        if _CRC.unpack_from(h, 44)[0] != crc32c(h[:44]):
            return GET_CORRUPT, 0
        if stored_len is not None and stored_len != HEADER_BYTES + plen:
            return GET_CORRUPT, 0
        if key_crc != crc32c(key):
            return GET_CORRUPT, 0
        if ident != identity:
            return GET_MISMATCH, 0
        return plen, pcrc


class RemoteBackend(abc.ABC):
    """A remote key-value store that holds cold pages as ``(content key, blob)`` pairs.

    Every call takes a batch. Keys are ``bytes`` (content keys: the same key always names the
    same blob, so a store may keep the first value written under a key). Values are buffers
    (bytes, bytearray, memoryview, numpy arrays; C-contiguous). A call that fails as a whole
    raises a :class:`RemoteError` subclass naming the backend, its address and the operation;
    per-key outcomes are returned. Each call is bounded by the constructor's ``timeout_s``: a
    dead or hung store raises :class:`RemoteUnavailable` or :class:`RemoteTimeout`, never hangs.

    A backend is driven by one thread at a time.

    :param identity: The codec identity written into and required of every value (a string,
        bytes or :class:`~kvcodec_sdk.disk.CodecIdentity`).
    :param timeout_s: Bound of each call, in seconds (> 0).
    """

    #: Short name used in errors and reports.
    name = "remote"

    def __init__(self, identity: Any, timeout_s: float) -> None:
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
            raise ValueError(f"timeout_s: {timeout_s!r} is not valid: give a number of seconds > 0")
        self.identity = identity_hash(identity)
        self.timeout_s = float(timeout_s)
        self.stats = RemoteStats()

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The store's address, ``host:port``."""

    @abc.abstractmethod
    def put_batch(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[Status]:
        """Store ``values[i]`` under ``keys[i]``, each behind a header; one :class:`Status` per key.

        :raises RemoteFull: some key found the store full (``.statuses`` says which were stored).
        :raises RemoteUnavailable, RemoteTimeout: the store failed the call as a whole.
        """

    @abc.abstractmethod
    def get_batch(self, keys: Sequence[bytes], out_buffers: Sequence[Any]) -> list[int]:
        """Read the payload of ``keys[i]`` into ``out_buffers[i]`` (writable, at least the payload's size).

        Returns per key the payload bytes read, or a negative code: :data:`GET_MISS`,
        :data:`GET_MISMATCH`, :data:`GET_CORRUPT`, :data:`GET_TOO_SMALL`, :data:`GET_ERROR`. A
        buffer's contents are unspecified after a negative code (a backend that reads straight
        into it may have written refused bytes there).
        """

    @abc.abstractmethod
    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether a value is stored under each key (not checked: :meth:`get_batch` checks)."""

    @abc.abstractmethod
    def remove_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Remove each key's value; True where one was removed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; later calls raise :class:`RemoteUnavailable`. Idempotent."""

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # Shared checks and bookkeeping for implementations.

    def _error(self, cls: type[RemoteError], op: str, detail: Any) -> RemoteError:
        return cls(self.name, self.address, op, str(detail))

    @staticmethod
    def _check_keys(keys: Sequence[bytes], others: Sequence[Any] | None = None, others_name: str = "") -> list[bytes]:
        keys = list(keys)
        for i, k in enumerate(keys):
            if not isinstance(k, (bytes, bytearray)) or not k:
                raise TypeError(f"keys[{i}]: {k!r} is not valid: give non-empty bytes")
        if others is not None and len(others) != len(keys):
            raise ValueError(f"{others_name}: {len(others)} entries for {len(keys)} keys: give one per key")
        return [bytes(k) for k in keys]

    def _pack_value(self, key: bytes, value: Any, field: str) -> bytes:
        """``value`` behind its header, as one ``bytes`` (the stores take a value in one piece)."""
        payload = byte_view(value, field)
        return self._headers([key], [payload]) + payload

    def _headers(self, keys: Sequence[bytes], payloads: Sequence[Any]) -> bytes:
        """The :data:`HEADER_BYTES`-byte header of each ``payloads[i]`` stored under ``keys[i]``
        (:meth:`ValueHeader.pack` of :meth:`ValueHeader.for_payload`), one after another. The
        payloads' checksums run natively, without the GIL, a large batch's over several threads."""
        return _native.remote.pack_headers(keys, payloads, self.identity)

    def _unpack_value(self, key: bytes, stored: Any, out: memoryview) -> int:
        """Check a stored value and copy its payload into ``out``: bytes copied or a ``GET_*`` code
        (counted). ``stored`` is the whole value, or None/empty where the store has none. The
        checks are :meth:`ValueHeader.check`'s, then the payload's CRC-32C on the way into ``out``
        (a corrupt payload leaves ``out``'s contents unspecified, as get_batch allows)."""
        return self._unpack_values([key], [stored], [out])[0]

    def _unpack_values(self, keys: Sequence[bytes], stored: Sequence[Any], outs: Sequence[memoryview]) -> list[int]:
        """:meth:`_unpack_value` of many values at once: ``stored[i]`` is the whole value read under
        ``keys[i]`` (empty or None: the store has none). The checks and copies run natively, without
        the GIL, a large batch's over several threads; each outcome is counted as one call would."""
        values = [b"" if v is None else v for v in stored]
        codes = _native.remote.unpack_values(keys, values, outs, self.identity)
        return [self._count_get(int(c)) for c in codes]

    def _count_get(self, code: int) -> int:
        s = self.stats
        if code >= 0:
            s.hits += 1
            s.get_bytes += code
        elif code == GET_MISS:
            s.misses += 1
        elif code == GET_MISMATCH:
            s.mismatches += 1
        elif code == GET_CORRUPT:
            s.corrupt += 1
        elif code == GET_TOO_SMALL:
            s.too_small += 1
        else:
            s.errors += 1
        return code

    def _count_puts(self, statuses: list[Status], sizes: Sequence[int]) -> list[Status]:
        for st, n in zip(statuses, sizes):
            if st == Status.OK:
                self.stats.puts += 1
                self.stats.put_bytes += n
            else:
                self.stats.put_failures += 1
        return statuses
