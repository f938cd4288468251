"""The native check of stored values (``_native.remote.unpack_values``, what every backend's gets
use) against the header's Python statement (:meth:`ValueHeader.check`, then the payload's CRC-32C):
value by value, on intact and damaged values of every kind, one at a time and in batches large
enough to be split over threads. No server needed."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from kvcodec_sdk import _native
from kvcodec_sdk.disk import crc32c
from kvcodec_sdk.remote import (
    GET_CORRUPT,
    GET_MISMATCH,
    GET_MISS,
    GET_TOO_SMALL,
    HEADER_BYTES,
    ValueHeader,
    identity_hash,
)

IDENTITY = identity_hash("concat/1/0123456789abcdef")
OTHER = identity_hash("fp8/1/fedcba9876543210")


def reference(key: bytes, stored: bytes, out_bytes: int) -> tuple[int, bytes | None]:
    """What a get answers for ``stored`` read under ``key`` into a buffer of ``out_bytes``, from
    the Python header check: the code, and the payload a hit copies out."""
    if not stored:
        return GET_MISS, None
    plen, pcrc = ValueHeader.check(stored, key, IDENTITY, len(stored))
    if plen < 0:
        return plen, None
    if plen > out_bytes:
        return GET_TOO_SMALL, None
    payload = stored[HEADER_BYTES:]
    if crc32c(payload) != pcrc:
        return GET_CORRUPT, None
    return plen, payload


def value(key: bytes, payload: bytes, identity: bytes = IDENTITY) -> bytes:
    return ValueHeader.for_payload(key, memoryview(payload), identity).pack() + payload


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]


def with_field(data: bytes, fmt: str, at: int, v: int) -> bytes:
    """``data`` with a header field rewritten and the header checksum made right again: only the
    field's own check can refuse it."""
    head = bytearray(data[:HEADER_BYTES])
    struct.pack_into(fmt, head, at, v)
    struct.pack_into("<I", head, 44, crc32c(bytes(head[:44])))
    return bytes(head) + data[HEADER_BYTES:]


def cases(rng: np.random.Generator) -> list[tuple[str, bytes, bytes, int]]:
    """(name, key, stored value, output buffer size): every way a value can be refused, and hits."""
    payload = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
    key = hashlib.sha256(payload).digest()
    good = value(key, payload)
    return [
        ("hit", key, good, len(payload)),
        ("hit into a larger buffer", key, good, len(payload) + 100),
        ("empty payload", hashlib.sha256(b"").digest(), value(hashlib.sha256(b"").digest(), b""), 0),
        ("no value", key, b"", len(payload)),
        ("shorter than a header", key, good[:HEADER_BYTES - 1], len(payload)),
        ("header alone", key, good[:HEADER_BYTES], len(payload)),
        ("payload cut short", key, good[:-1], len(payload)),
        ("one byte too many", key, good + b"\0", len(payload)),
        ("magic", key, flip(good, 1), len(payload)),
        ("magic, checksum made right", key, with_field(good, "<4s", 0, b"KVRX"), len(payload)),
        ("version, checksum made right", key, with_field(good, "<H", 4, 2), len(payload)),
        ("header size, checksum made right", key, with_field(good, "<H", 6, 64), len(payload)),
        ("flags are not checked", key, with_field(good, "<I", 8, 7), len(payload)),
        ("length, checksum made right", key, with_field(good, "<Q", 16, len(payload) - 1), len(payload)),
        ("header checksum", key, flip(good, 45), len(payload)),
        ("identity bit (the header checksum sees it)", key, flip(good, 30), len(payload)),
        ("identity, checksum made right", key, with_field(good, "<16s", 28, OTHER), len(payload)),
        ("another codec's value", key, value(key, payload, OTHER), len(payload)),
        ("read under another key", hashlib.sha256(b"other").digest(), good, len(payload)),
        ("payload bit flipped", key, flip(good, HEADER_BYTES + 2500), len(payload)),
        ("payload checksum, checksum made right", key, with_field(good, "<I", 24, 12345), len(payload)),
        ("buffer one byte short", key, good, len(payload) - 1),
        ("not a value of this tier", key, b"x" * 5000, len(payload)),
    ]


def unpack(keys, stored, sizes):
    outs = [np.full(n, 0xA5, dtype=np.uint8) for n in sizes]
    codes = _native.remote.unpack_values(keys, stored, outs, IDENTITY)
    return codes, outs


def test_every_value_is_judged_as_the_header_check_judges_it():
    rng = np.random.default_rng(1)
    table = cases(rng)
    codes, outs = unpack([c[1] for c in table], [c[2] for c in table], [c[3] for c in table])
    for (name, key, stored, size), code, out in zip(table, codes, outs):
        want, payload = reference(key, stored, size)
        assert code == want, name
        if payload is not None:
            assert bytes(out[:len(payload)]) == payload, name
            assert (out[len(payload):] == 0xA5).all(), name
    by_name = dict(zip((c[0] for c in table), codes))
    assert by_name["hit"] == 5000 and by_name["flags are not checked"] == 5000 and by_name["empty payload"] == 0
    assert by_name["no value"] == GET_MISS and by_name["buffer one byte short"] == GET_TOO_SMALL
    assert by_name["another codec's value"] == GET_MISMATCH == by_name["identity, checksum made right"]
    assert by_name["identity bit (the header checksum sees it)"] == GET_CORRUPT
    assert by_name["payload bit flipped"] == GET_CORRUPT and by_name["read under another key"] == GET_CORRUPT


@pytest.mark.parametrize("count", [1, 64, 200])
def test_large_batches_over_threads_match_value_by_value(count):
    """Up to 200 values of 288-640 KiB (tens of MiB: several threads), one in seven damaged."""
    rng = np.random.default_rng(count)
    keys, stored, sizes, want = [], [], [], []
    for i in range(count):
        payload = rng.integers(0, 256, int(rng.integers(288, 640)) << 10, dtype=np.uint8).tobytes()
        key = hashlib.sha256(payload).digest()
        v = value(key, payload)
        if i % 7 == 3:
            v = flip(v, HEADER_BYTES + int(rng.integers(0, len(payload))))
        keys.append(key)
        stored.append(np.frombuffer(v, dtype=np.uint8))  # any buffer, as staging slices are
        sizes.append(len(payload))
        want.append(reference(key, v, len(payload)))
    codes, outs = unpack(keys, stored, sizes)
    assert codes == [w[0] for w in want]
    for (code, payload), out in zip(want, outs):
        if payload is not None:
            assert bytes(out) == payload
    assert sum(c == GET_CORRUPT for c in codes) == len(range(3, count, 7))


def test_bad_arguments_say_what_is_valid():
    with pytest.raises(ValueError, match="keys, stored and outs have 2, 1 and 2 items"):
        _native.remote.unpack_values([b"a", b"b"], [b""], [bytearray(1), bytearray(1)], IDENTITY)
    with pytest.raises(ValueError, match="identity holds 3 bytes; it must be the 16-byte identity hash"):
        _native.remote.unpack_values([b"a"], [b""], [bytearray(1)], b"abc")
    with pytest.raises(BufferError):
        _native.remote.unpack_values([b"a"], [b""], [b"read-only"], IDENTITY)


@pytest.mark.parametrize("count", [0, 1, 7, 150])
def test_native_headers_are_the_python_headers(count):
    """pack_headers() against ValueHeader.for_payload(...).pack(), payloads of 0 bytes to 600 KiB
    (150 of them: tens of MiB, several threads), and each one read back by unpack_values()."""
    rng = np.random.default_rng(100 + count)
    payloads = [rng.integers(0, 256, int(rng.integers(0, 600)) << 10, dtype=np.uint8) for _ in range(count)]
    if count:
        payloads[0] = np.zeros(0, dtype=np.uint8)
    keys = [hashlib.sha256(p.tobytes()).digest() + bytes([i % 3]) for i, p in enumerate(payloads)]
    headers = _native.remote.pack_headers(keys, payloads, IDENTITY)
    assert len(headers) == count * HEADER_BYTES
    for i, (k, p) in enumerate(zip(keys, payloads)):
        assert headers[i * HEADER_BYTES:(i + 1) * HEADER_BYTES] == ValueHeader.for_payload(
            k, memoryview(p), IDENTITY).pack()
    stored = [headers[i * HEADER_BYTES:(i + 1) * HEADER_BYTES] + p.tobytes() for i, p in enumerate(payloads)]
    codes, outs = unpack(keys, stored, [p.size for p in payloads])
    assert codes == [p.size for p in payloads]
    assert all(np.array_equal(o, p) for o, p in zip(outs, payloads))


def test_native_headers_say_what_is_valid():
    with pytest.raises(ValueError, match="keys and payloads have 1 and 2 items: give one payload per key"):
        _native.remote.pack_headers([b"a"], [b"x", b"y"], IDENTITY)
    with pytest.raises(ValueError, match="identity holds 15 bytes; it must be the 16-byte identity hash"):
        _native.remote.pack_headers([b"a"], [b"x"], IDENTITY[:15])
