"""The cold-page envelope (``ColdPageEnvelope`` in ``kvcodec/codec.h``) as the suite reads it.

A codec whose spec declares ``envelope=True`` starts every blob with a 32-byte little-endian
header: magic, format version, flags, header and payload sizes, the decoded page size, the CRC-32C
of ``[32, headerBytes + payloadBytes)`` and the CRC-32C of the header's first 28 bytes.
:func:`field_problems` checks every field of one blob against the contract; the ``envelope``
clause also proves that the CRCs cover every byte the codec's decode reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native

__all__ = ["ENVELOPE_BYTES", "MAGIC", "STORED_RAW", "COMPRESSED", "DID_NOT_FIT", "Envelope", "parse", "field_problems"]

ENVELOPE_BYTES = 32
MAGIC = 0x5043564B
STORED_RAW, COMPRESSED, DID_NOT_FIT = 1, 2, 4
_STATUS = {0: "kOk", 1: "kBadMagic", 2: "kBadFormatVersion", 3: "kBadHeader", 4: "kDidNotFit", 5: "kBadChecksum"}


@dataclass(frozen=True)
class Envelope:
    magic: int
    format_version: int
    flags: int
    header_bytes: int
    payload_bytes: int
    raw_bytes: int
    checksum: int
    header_crc: int

    @property
    def did_not_fit(self) -> bool:
        return bool(self.flags & DID_NOT_FIT)

    @property
    def covered_end(self) -> int:
        """End of the bytes the CRCs cover: ``headerBytes + payloadBytes``."""
        return self.header_bytes + self.payload_bytes


def parse(blob: np.ndarray) -> Envelope:
    """The envelope at the start of ``blob`` (uint8, at least 32 bytes)."""
    b = np.ascontiguousarray(blob[:ENVELOPE_BYTES], np.uint8)
    u32 = lambda o: int(b[o : o + 4].view("<u4")[0])  # noqa: E731
    u16 = lambda o: int(b[o : o + 2].view("<u2")[0])  # noqa: E731
    return Envelope(u32(0), u16(4), u16(6), u32(8), u32(12), int(b[16:24].view("<u8")[0]), u32(24), u32(28))


def field_problems(blob: np.ndarray, format_version: int, raw_bytes: int) -> str | None:
    """None when every envelope field of ``blob`` is what the contract requires; else the first
    inconsistency. ``raw_bytes`` is the decoded page size (the lifecycle's hot page bytes)."""
    blob = np.ascontiguousarray(blob, np.uint8).reshape(-1)
    if blob.size < ENVELOPE_BYTES:
        return f"the blob has {blob.size} bytes, fewer than the 32-byte envelope"
    e = parse(blob)
    if e.magic != MAGIC:
        return f"magic is 0x{e.magic:08x}, not 0x{MAGIC:08x} ('KVCP')"
    crc = _native.crc32c(blob[:28].tobytes())
    if e.header_crc != crc:
        return f"headerCrc is 0x{e.header_crc:08x} but the CRC-32C of the first 28 bytes is 0x{crc:08x}"
    if e.format_version != format_version:
        return f"formatVersion is {e.format_version}, not the codec's format_version {format_version}"
    if e.flags & ~(STORED_RAW | COMPRESSED | DID_NOT_FIT):
        return f"flags 0x{e.flags:04x} has bits no envelope flag defines"
    if not e.did_not_fit:
        if (e.flags & (STORED_RAW | COMPRESSED)) not in (STORED_RAW, COMPRESSED):
            return (f"flags 0x{e.flags:04x}: a blob that holds a page sets exactly one of kEnvelopeStoredRaw and "
                    "kEnvelopeCompressed")
        if e.header_bytes < ENVELOPE_BYTES or e.header_bytes > blob.size:
            return f"headerBytes is {e.header_bytes}; it must be in [32, {blob.size}] (the blob's size)"
        if e.payload_bytes > blob.size - e.header_bytes:
            return (f"headerBytes + payloadBytes is {e.covered_end}, past the end of the {blob.size}-byte blob")
        if e.raw_bytes != raw_bytes:
            return f"rawBytes is {e.raw_bytes}, but the decoded page has {raw_bytes} bytes"
        crc = _native.crc32c(blob[ENVELOPE_BYTES : e.covered_end].tobytes())
        if e.checksum != crc:
            return (f"checksum is 0x{e.checksum:08x} but the CRC-32C of bytes [32, {e.covered_end}) is 0x{crc:08x}")
    status = int(_native.check_envelope(blob, format_version))
    want = 4 if e.did_not_fit else 0
    if status != want:
        return (f"the SDK's envelope check (checkColdPageEnvelope) says {_STATUS.get(status, status)} for it, "
                f"not {_STATUS[want]}")
    return None
