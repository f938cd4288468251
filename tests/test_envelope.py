"""CRC-32C and the cold-page envelope check (codec.h), against envelopes built here with struct."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcodec_sdk import _native

MAGIC = 0x5043564B
HEADER = struct.Struct("<IHHIIQII")
assert HEADER.size == 32

OK, BAD_MAGIC, BAD_FORMAT_VERSION, BAD_HEADER, DID_NOT_FIT, BAD_CHECKSUM = range(6)
STORED_RAW, COMPRESSED, DID_NOT_FIT_FLAG = 1, 2, 4


def crc32c_reference(data: bytes, crc: int = 0) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), written independently."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def envelope(
    payload: bytes,
    *,
    format_version: int = 1,
    flags: int = COMPRESSED,
    codec_header: bytes = b"",
    raw_bytes: int = 4096,
    magic: int = MAGIC,
    header_bytes: int | None = None,
    payload_bytes: int | None = None,
    slack: bytes = b"",
) -> bytearray:
    """A blob: 32-byte envelope, codec header area, payload, then unused slack."""
    hb = 32 + len(codec_header) if header_bytes is None else header_bytes
    pb = len(payload) if payload_bytes is None else payload_bytes
    checksum = crc32c_reference(codec_header + payload)
    head = HEADER.pack(magic, format_version, flags, hb, pb, raw_bytes, checksum, 0)
    head = head[:28] + struct.pack("<I", crc32c_reference(head[:28]))
    return bytearray(head + codec_header + payload + slack)


def refresh_header_crc(blob: bytearray) -> bytearray:
    blob[28:32] = struct.pack("<I", crc32c_reference(bytes(blob[:28])))
    return blob


# -- CRC-32C --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),  # the CRC catalogue's check value
        (b"a", 0xC1D04330),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4 test vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_known_values(data, expected):
    assert crc32c_reference(data) == expected
    assert _native.crc32c(data) == expected
    assert _native.crc32c(bytearray(data)) == expected
    assert _native.crc32c(np.frombuffer(data, np.uint8)) == expected


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300), split=st.integers(0, 300))
def test_crc32c_matches_reference_and_continues(data, split):
    split = min(split, len(data))
    expected = crc32c_reference(data)
    assert _native.crc32c(data) == expected
    assert _native.crc32c(data[split:], _native.crc32c(data[:split])) == expected


def test_crc32c_counts_bytes_of_wider_items():
    words = np.arange(10, dtype=np.uint32)
    assert _native.crc32c(words) == crc32c_reference(words.tobytes())


def test_crc32c_of_a_strided_view_is_right_or_refused():
    view = np.arange(100, dtype=np.uint8)[::2]
    try:
        value = _native.crc32c(view)
    except (ValueError, TypeError, BufferError):
        return
    assert value == crc32c_reference(view.tobytes())


# -- envelope statuses ----------------------------------------------------------------------------


def test_check_envelope_ok_variants():
    payload = bytes(range(1, 200))
    assert _native.check_envelope(envelope(payload), 1) == OK
    assert _native.check_envelope(bytes(envelope(payload)), 1) == OK
    assert _native.check_envelope(np.frombuffer(bytes(envelope(payload)), np.uint8), 1) == OK
    assert _native.check_envelope(envelope(payload, codec_header=b"scales!!" * 3), 1) == OK
    assert _native.check_envelope(envelope(payload, slack=b"\x00" * 77), 1) == OK
    assert _native.check_envelope(envelope(b""), 1) == OK
    assert _native.check_envelope(envelope(payload, format_version=0xFFFF, flags=STORED_RAW), 0xFFFF) == OK


def test_bad_magic():
    blob = refresh_header_crc(envelope(b"payload", magic=0x4B564350))  # byte-swapped magic
    assert _native.check_envelope(blob, 1) == BAD_MAGIC
    blob = envelope(b"payload")
    blob[0] ^= 0x01  # the magic is checked before the header CRC
    assert _native.check_envelope(blob, 1) == BAD_MAGIC


def test_bad_format_version():
    blob = envelope(b"payload", format_version=2)
    assert _native.check_envelope(blob, 2) == OK
    assert _native.check_envelope(blob, 1) == BAD_FORMAT_VERSION
    assert _native.check_envelope(blob, 3) == BAD_FORMAT_VERSION


@pytest.mark.parametrize("offset", range(4, 32))
def test_any_header_byte_flip_after_the_magic_is_caught(offset):
    blob = envelope(b"payload bytes", format_version=2)
    blob[offset] ^= 0x40
    # Either the header CRC catches it, or (when the flip is in headerCrc itself) the same.
    assert _native.check_envelope(blob, 2) == BAD_HEADER


def test_header_crc_is_checked_before_the_format_version():
    blob = envelope(b"payload", format_version=7)
    blob[20] ^= 0xFF  # rawBytes, covered by the header CRC
    assert _native.check_envelope(blob, 1) == BAD_HEADER


@pytest.mark.parametrize(
    "fields",
    [
        {"header_bytes": 31},  # smaller than the envelope itself
        {"header_bytes": 0},
        {"header_bytes": 10_000},  # beyond the blob
        {"payload_bytes": 8},  # payload runs past the end of the blob
        {"payload_bytes": 0xFFFFFFFF},
    ],
)
def test_sizes_outside_the_blob_are_bad_headers(fields):
    blob = envelope(b"1234567", **fields)
    assert _native.check_envelope(blob, 1) == BAD_HEADER


def test_did_not_fit():
    blob = envelope(b"", flags=DID_NOT_FIT_FLAG)
    assert _native.check_envelope(blob, 1) == DID_NOT_FIT
    # Checked before sizes and payload checksum: a did-not-fit blob may hold anything after its header.
    blob = envelope(b"garbage", flags=DID_NOT_FIT_FLAG | COMPRESSED, payload_bytes=1 << 30)
    blob[35] ^= 0xFF
    assert _native.check_envelope(blob, 1) == DID_NOT_FIT
    assert _native.check_envelope(envelope(b"", flags=DID_NOT_FIT_FLAG, format_version=3), 1) == BAD_FORMAT_VERSION


def test_payload_flip_is_a_bad_checksum_but_slack_is_not_covered():
    payload = bytes(range(256)) * 4
    blob = envelope(payload, codec_header=b"hdr-area", slack=b"\x11" * 64)
    assert _native.check_envelope(blob, 1) == OK
    for offset in (32, 39, 40, 40 + 500, 40 + len(payload) - 1):  # codec header area and payload
        bad = bytearray(blob)
        bad[offset] ^= 0x01
        assert _native.check_envelope(bad, 1) == BAD_CHECKSUM, offset
    slack = bytearray(blob)
    slack[-1] ^= 0xFF
    assert _native.check_envelope(slack, 1) == OK


def test_truncated_blobs():
    blob = envelope(b"x" * 100)
    assert _native.check_envelope(blob[:-1], 1) == BAD_HEADER
    assert _native.check_envelope(blob[:33], 1) == BAD_HEADER
    assert _native.check_envelope(blob[:31], 1) == BAD_HEADER
    assert _native.check_envelope(b"", 1) == BAD_HEADER


def test_format_version_argument_is_a_uint16():
    with pytest.raises(TypeError):
        _native.check_envelope(envelope(b"x"), 1 << 16)
    with pytest.raises(TypeError):
        _native.check_envelope(envelope(b"x"), -1)


@settings(max_examples=60, deadline=None)
@given(
    payload=st.binary(max_size=200),
    codec_header=st.binary(max_size=24),
    data=st.data(),
)
def test_random_envelopes_and_single_byte_corruption(payload, codec_header, data):
    blob = envelope(payload, codec_header=codec_header)
    assert _native.check_envelope(blob, 1) == OK
    offset = data.draw(st.integers(0, len(blob) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    blob[offset] ^= 1 << bit
    status = _native.check_envelope(blob, 1)
    if offset < 4:
        assert status == BAD_MAGIC
    elif offset < 32:
        assert status == BAD_HEADER
    else:
        assert status == BAD_CHECKSUM
