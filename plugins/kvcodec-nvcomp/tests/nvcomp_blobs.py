"""Test helpers: an independent Python reading of the plugin's blob format (docs/nvcomp.md),
data generators, numpy hot layouts and the shared fixture.

There is deliberately no conftest.py here: the repository's pytest run collects several test
folders, and a second top-level ``conftest`` module would shadow the core tests' one.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk.testing.envelope import COMPRESSED, DID_NOT_FIT, MAGIC, STORED_RAW  # noqa: F401 (the SDK's envelope)
from kvcodec_sdk.testing.support import fresh_default_registry  # noqa: F401 (re-exported fixture)


def plugin_ext():
    """The plugin's extension module. When the plugin is not installed, a local run skips the
    calling test module; under CI (``CI`` set) it is an error, so a broken install cannot hide."""
    try:
        from kvcodec_nvcomp import _ext
    except ImportError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"kvcodec-nvcomp is not installed ({exc})", allow_module_level=True)
    return _ext


CHUNK_COMPRESSED = 0x80000000
ALGORITHM_IDS = {"nvcomp-lz4": 1, "nvcomp-gdeflate": 2, "nvcomp-ans": 3}

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 & -(_c & 1))
    _TABLE.append(_c & 0xFFFFFFFF)


def crc32c(data: bytes) -> int:
    """CRC-32C, table-driven (independent of the plugin's code)."""
    c = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


@dataclass
class Blob:
    magic: int
    version: int
    flags: int
    header_bytes: int
    payload_bytes: int
    raw_bytes: int
    checksum: int
    header_crc: int
    num_chunks: int = 0
    chunk_bytes: int = 0
    algorithm: int = 0
    element_bytes: int = 0
    bitshuffle: int = 0
    entries: tuple = ()

    def chunks(self, blob: bytes):
        """(compressed, stored bytes) per chunk, following the table."""
        pos = self.header_bytes
        for e in self.entries:
            size = e & 0x7FFFFFFF
            yield bool(e & CHUNK_COMPRESSED), blob[pos : pos + size]
            pos += (size + 15) // 16 * 16


def parse(blob: bytes) -> Blob:
    b = Blob(*struct.unpack_from("<IHHIIQII", blob, 0))
    if b.flags & DID_NOT_FIT:
        return b
    b.num_chunks, b.chunk_bytes, b.algorithm, b.element_bytes, b.bitshuffle = struct.unpack_from("<IIBBB", blob, 32)
    b.entries = struct.unpack_from(f"<{b.num_chunks}I", blob, 48)
    return b


def check(blob: bytes, version: int = 1) -> str:
    """The envelope check of codec.h, written again in Python: 'ok' or the reason."""
    b = Blob(*struct.unpack_from("<IHHIIQII", blob, 0))
    if b.magic != MAGIC:
        return "bad magic"
    if crc32c(blob[:28]) != b.header_crc:
        return "bad header"
    if b.version != version:
        return "bad version"
    if b.flags & DID_NOT_FIT:
        return "did not fit"
    if b.header_bytes < 32 or b.header_bytes > len(blob) or b.payload_bytes > len(blob) - b.header_bytes:
        return "bad header"
    if crc32c(blob[32 : b.header_bytes + b.payload_bytes]) != b.checksum:
        return "bad checksum"
    return "ok"


def bitshuffle(chunk: bytes, w: int) -> bytes:
    """Reference bit shuffle of format version 1 (numpy, independent of the C++ code)."""
    a = np.frombuffer(chunk, dtype=np.uint8)
    groups = len(a) // (8 * w)
    head = a[: groups * 8 * w].reshape(groups, 8, w)  # [group][element j][byte]
    bits = np.unpackbits(head[..., None], axis=-1, bitorder="little")  # [group][j][byte][bit]
    planes = bits.transpose(2, 3, 0, 1)  # [byte][bit][group][j]
    packed = np.packbits(planes, axis=-1, bitorder="little")[..., 0]  # [byte][bit][group]
    return packed.reshape(-1).tobytes() + a[groups * 8 * w :].tobytes()


def chunk_plan(slot_sizes, chunk_bytes):
    """(pool, offset, bytes) of each chunk of a page."""
    out = []
    for p, size in enumerate(slot_sizes):
        for off in range(0, size, chunk_bytes):
            out.append((p, off, min(chunk_bytes, size - off)))
    return out


# -- data --------------------------------------------------------------------------------------


def kv_like_bf16(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """Bytes of bf16 values shaped like KV activations: per-channel scales, heavy-ish tails."""
    n = nbytes // 2
    dim = 128
    scales = rng.lognormal(0.0, 1.0, size=dim).astype(np.float32)
    x = (rng.standard_normal(n).astype(np.float32) * np.resize(scales, n)).astype(np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    out = np.zeros(nbytes, dtype=np.uint8)
    out[: 2 * n] = bf16.view(np.uint8)
    return out


def fill(kind: str, rng: np.random.Generator, nbytes: int) -> np.ndarray:
    if kind == "random":
        return rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    if kind == "zeros":
        return np.zeros(nbytes, dtype=np.uint8)
    if kind == "runs":
        return np.repeat(rng.integers(0, 4, size=nbytes // 64 + 1, dtype=np.uint8), 64)[:nbytes]
    if kind == "kv":
        return kv_like_bf16(rng, nbytes)
    raise ValueError(kind)


@dataclass
class NumpyLayout:
    groups: list
    pools: list  # pools[p] is (num_slots, slot_bytes) uint8

    def page(self, slot: int) -> bytes:
        return b"".join(p[slot].tobytes() for p in self.pools)


def numpy_layout(rng, slot_sizes, num_slots, kind="random", lifecycles=(0,)) -> NumpyLayout:
    pools = []
    for size in slot_sizes:
        pools.append(fill(kind, rng, size * num_slots).reshape(num_slots, size).copy())
    descs = [kv.PoolDesc(base=p.ctypes.data, slot_bytes=p.shape[1], num_slots=num_slots) for p in pools]
    groups = [kv.PoolGroupDesc(pools=descs, lifecycles=[kv.LifeCycleDesc(i) for i in lifecycles])]
    return NumpyLayout(groups, pools)


def pairs(dst, src) -> np.ndarray:
    return np.ascontiguousarray(np.stack([np.asarray(dst), np.asarray(src)], axis=1).astype(np.int32))


# -- damaged blobs (checked decode) ------------------------------------------------------------


def reseal(blob: bytes, *, checksum: bool = True) -> bytes:
    """The blob with its header CRC (and, with ``checksum``, its payload checksum) recomputed
    from its fields: damage that only the structural checks can catch."""
    b = bytearray(blob)
    if checksum:
        header_bytes, payload_bytes = struct.unpack_from("<II", b, 8)
        struct.pack_into("<I", b, 24, crc32c(bytes(b[32 : header_bytes + payload_bytes])))
    struct.pack_into("<I", b, 28, crc32c(bytes(b[:28])))
    return bytes(b)


def rebuild(blob: bytes, chunks) -> bytes:
    """A blob with the envelope fields and codec header of ``blob`` holding ``chunks``
    ((compressed, stored bytes) per chunk): chunk table, payloadBytes and both CRCs recomputed,
    the rest of the cold slot kept."""
    b = parse(blob)
    entries, payload = [], b""
    for compressed, data in chunks:
        entries.append(len(data) | (CHUNK_COMPRESSED if compressed else 0))
        payload += bytes(data) + bytes(-len(data) % 16)
    area = bytes(blob[32:48]) + struct.pack(f"<{len(entries)}I", *entries)
    area += bytes(b.header_bytes - 32 - len(area))
    head = struct.pack("<IHHIIQI", b.magic, b.version, b.flags, b.header_bytes, len(payload), b.raw_bytes,
                       crc32c(area + payload))
    out = head + struct.pack("<I", crc32c(head)) + area + payload
    assert len(out) <= len(blob)
    return out + bytes(blob[len(out):])


#: Damage done to a blob, and the PageStatus a checked decode reports for it (kvcodec/codec.h).
DAMAGE = {
    "good": 0,
    "magic": 1,  # first byte of the magic
    "header-crc": 3,  # the envelope's header CRC field
    "header-field": 3,  # payloadBytes changed, header CRC not updated
    "version": 2,  # format version 2 with a correct header CRC
    "did-not-fit": 4,  # the envelope alone, as encode writes a page that did not fit
    "payload": 5,  # one bit of the payload
    "table": 3,  # a chunk table entry of 0xFFFFFFFF (checksum not updated)
    "table-resealed": 3,  # chunk 0 marked raw with a compressed size, checksum updated
    "codec-header": 3,  # chunk_bytes in the codec header, checksum updated
    "sizes": 3,  # payloadBytes past the cold slot, header CRC updated
    "raw-bytes": 3,  # rawBytes of another page size, header CRC updated
    "decode": 6,  # a full chunk's payload replaced by a shorter chunk's: checksum valid, wrong size
}


def damage(kind: str, blob: bytes, raw_sizes) -> bytes:
    """``blob`` (a whole cold slot holding a valid blob) damaged as DAMAGE[kind] says.
    ``raw_sizes``: each chunk's raw size (chunk_plan). "table-resealed" needs chunk 0
    compressed, "decode" a compressed full chunk and a compressed shorter one."""
    b = bytearray(blob)
    h = parse(blob)
    if kind == "good":
        pass
    elif kind == "magic":
        b[0] ^= 0x01
    elif kind == "header-crc":
        b[29] ^= 0x40
    elif kind == "header-field":
        b[13] ^= 0x08
    elif kind == "version":
        struct.pack_into("<H", b, 4, 2)
        return reseal(b, checksum=False)
    elif kind == "did-not-fit":
        struct.pack_into("<IHHIIQI", b, 0, MAGIC, 1, DID_NOT_FIT, 32, 0, h.raw_bytes, 0)
        return reseal(b, checksum=False)
    elif kind == "payload":
        b[h.header_bytes + h.payload_bytes // 3] ^= 0x04
    elif kind == "table":
        struct.pack_into("<I", b, 48, 0xFFFFFFFF)
    elif kind == "table-resealed":
        assert h.entries[0] & CHUNK_COMPRESSED, "chunk 0 must be compressed"
        struct.pack_into("<I", b, 48, h.entries[0] & ~CHUNK_COMPRESSED)
        return reseal(b)
    elif kind == "codec-header":
        struct.pack_into("<I", b, 36, h.chunk_bytes + 16)
        return reseal(b)
    elif kind == "sizes":
        struct.pack_into("<I", b, 12, len(blob))
        return reseal(b, checksum=False)
    elif kind == "raw-bytes":
        struct.pack_into("<Q", b, 16, h.raw_bytes + 16)
        return reseal(b, checksum=False)
    elif kind == "decode":
        chunks = list(h.chunks(blob))
        compressed = [i for i, (c, _) in enumerate(chunks) if c]
        full = next(i for i in compressed if raw_sizes[i] == max(raw_sizes))
        short = next((i for i in compressed if raw_sizes[i] < raw_sizes[full]), None)
        assert short is not None, "the layout needs a compressed chunk shorter than a full one"
        chunks[full] = chunks[short]
        return rebuild(blob, chunks)
    else:
        raise ValueError(kind)
    return bytes(b)


def damage_pages(cold: np.ndarray, kinds, raw_sizes) -> list:
    """Damages cold slot s (row s of a (pages, cold bytes) uint8 array) as kinds[s] says, in
    place; returns the PageStatus expected for each."""
    for s, kind in enumerate(kinds):
        cold[s] = np.frombuffer(damage(kind, cold[s].tobytes(), raw_sizes), dtype=np.uint8)
    return [DAMAGE[k] for k in kinds]


def with_good_neighbours(kinds) -> list:
    """Each kind preceded by an intact page: ["good", k0, "good", k1, ..., "good"]."""
    out = []
    for k in kinds:
        out += ["good", k]
    return out + ["good"]
