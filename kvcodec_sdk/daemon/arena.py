"""The L2 arena: one memfd-backed shared memory file that the daemon and every client map.

The arena is cut into regions, one per (codec identity, page bytes). A region is a table of slot
headers followed by its slots' data, each slot's data page-aligned (so a client can register the
arena with CUDA as pinned memory and copy from it directly). The daemon alone writes headers; a
client writes only the data of slots the daemon leased to it, and reads slots it was told about.

A slot header (64 bytes, little-endian)::

    u64 version   even: stable; odd: being written (a lease); bumped on every reuse
    u64 length    bytes of data stored
    u32 crc       CRC-32C of those bytes
    u32 region    the region id (a reference into another region is refused)
    u8[16] key    BLAKE2b-128 of the content key stored

A reader takes ``(slot, version, length, crc)`` from the daemon, reads the data in place, and
accepts it only when the header still shows that version (a slot reused meanwhile is detected)
and the data's CRC-32C matches (a client that wrote where it should not is detected).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass

__all__ = ["HEADER", "Arena", "RegionLayout", "key_digest"]

HEADER = struct.Struct("<QQII16s")
HEADER_BYTES = 64
PAGE = 4096


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def key_digest(key: bytes) -> bytes:
    """The 16-byte digest of a content key kept in its slot's header."""
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(frozen=True)
class RegionLayout:
    """Where a region lies in the arena."""

    region: int
    table: int  # offset of the header table
    data: int  # offset of slot 0's data (page-aligned)
    stride: int  # bytes between slots' data (page bytes rounded up to 4 KiB)
    slots: int
    page_bytes: int

    @property
    def end(self) -> int:
        return self.data + self.slots * self.stride

    @staticmethod
    def bytes_for(page_bytes: int, slots: int) -> int:
        """Arena bytes a region of ``slots`` slots of ``page_bytes`` takes."""
        return _round_up(slots * HEADER_BYTES, PAGE) + slots * _round_up(page_bytes, PAGE)

    def header_offset(self, slot: int) -> int:
        return self.table + slot * HEADER_BYTES

    def data_offset(self, slot: int) -> int:
        return self.data + slot * self.stride

    def check(self, slot: int, length: int | None = None) -> None:
        """Raises ValueError when ``slot`` (and ``length``) do not lie inside this region."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside region {self.region} (0..{self.slots - 1})")
        if length is not None and not 0 <= length <= self.page_bytes:
            raise ValueError(f"length {length} exceeds region {self.region}'s page bytes ({self.page_bytes})")


class Arena:
    """A shared memory file mapped read-write. The daemon creates it (:meth:`create`); a client
    maps the descriptor it received (:meth:`attach`)."""

    def __init__(self, fd: int, size: int, hugepages: bool) -> None:
        self.fd = fd
        self.size = size
        self.hugepages = hugepages
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.map)

    @classmethod
    def create(cls, size: int, name: str = "kvcodec-l2", hugepages: bool = True) -> Arena:
        """A new arena of ``size`` bytes: huge pages where the system has them reserved
        (``MFD_HUGETLB``), else ordinary pages."""
        if size <= 0:
            raise ValueError(f"size is {size}; the arena needs at least one page")
        if hugepages and hasattr(os, "MFD_HUGETLB"):
            try:
                fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_HUGETLB)
                huge = _round_up(size, 2 << 20)
                os.ftruncate(fd, huge)
                try:
                    return cls(fd, huge, True)
                except OSError:
                    os.close(fd)
            except OSError:
                pass  # no huge pages reserved: ordinary pages
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        size = _round_up(size, PAGE)
        os.ftruncate(fd, size)
        return cls(fd, size, False)

    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        """Maps an arena received from the daemon (the descriptor is owned from now on)."""
        return cls(fd, size, False)

    def read_header(self, layout: RegionLayout, slot: int) -> tuple[int, int, int, int, bytes]:
        """(version, length, crc, region, key digest) of a slot's header."""
        return HEADER.unpack_from(self.map, layout.header_offset(slot))

    def write_header(self, layout: RegionLayout, slot: int, version: int, length: int = 0, crc: int = 0,
                     digest: bytes = b"\0" * 16) -> None:
        HEADER.pack_into(self.map, layout.header_offset(slot), version, length, crc, layout.region, digest)

    def data(self, layout: RegionLayout, slot: int, length: int | None = None) -> memoryview:
        """A view of a slot's data (``length`` bytes, or the whole page)."""
        start = layout.data_offset(slot)
        return self.view[start:start + (layout.page_bytes if length is None else length)]

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            pass  # a view of the arena is still alive: the mapping goes when it does
        try:
            os.close(self.fd)
        except OSError:
            pass
