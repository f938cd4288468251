"""Hot-layout descriptors handed to ``Codec.configure``: the Python side of ``codec.h``.

A hot pool group is a set of pools allocated together: slot ``s`` of every pool belongs to the
same page. Each lifecycle (layer group) of the group lists the buffers inside a slot, which is
what a quantizing codec needs to interpret the bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

__all__ = [
    "DType",
    "Role",
    "PageIndexLocation",
    "PoolDesc",
    "BufferDesc",
    "LifeCycleDesc",
    "PoolGroupDesc",
]


class DType(enum.IntEnum):
    """Element type of a buffer (``kvcodec::DataType``)."""

    UINT8 = 0
    INT8 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    FLOAT32 = 4
    FLOAT8_E4M3 = 5
    FLOAT8_E5M2 = 6
    INT32 = 7

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 1, 6: 1, 7: 4}[int(self)]


class Role(enum.IntEnum):
    """Role of a buffer inside a hot slot (``kvcodec::BufferRole``)."""

    KEY = 0
    VALUE = 1
    OTHER = 2


class PageIndexLocation(enum.IntEnum):
    """Where a lifecycle's ``PageIndexPair`` array must live (``kvcodec::PageIndexLocation``)."""

    BAD = -1
    HOST = 0
    DEVICE = 1


class PageStatus(enum.IntEnum):
    """One page's outcome of a checked decode (``kvcodec::PageStatus``, one byte per page).

    Values 1-5 equal the envelope check's ``EnvelopeStatus``.
    """

    OK = 0
    BAD_MAGIC = 1  #: the blob does not start with an envelope
    BAD_FORMAT_VERSION = 2  #: the envelope names another format version
    BAD_HEADER = 3  #: header CRC mismatch, sizes outside the blob, or a bad codec header
    DID_NOT_FIT = 4  #: the page did not fit its slot; the blob holds no page
    BAD_CHECKSUM = 5  #: the payload fails its checksum
    DECODE_FAILED = 6  #: the payload passed its checksum but did not decode
    BAD_INDEX = 7  #: the page's index pair is out of range


@dataclass(frozen=True)
class PoolDesc:
    """One hot pool: ``num_slots`` slots of ``slot_bytes`` bytes at address ``base``."""

    base: int
    slot_bytes: int
    num_slots: int


@dataclass(frozen=True)
class BufferDesc:
    """One buffer of one layer inside the slot of pool ``pool_index``.

    It covers bytes ``[byte_offset, byte_offset + bytes)`` of the slot. When ``tokens_per_page``,
    ``num_heads`` and ``head_dim`` are all set, the buffer is ``[token][head][dim]`` elements of
    ``dtype``; leave all three 0 for opaque bytes.
    """

    layer_id: int
    role: Role
    pool_index: int
    byte_offset: int
    bytes: int
    dtype: DType = DType.UINT8
    tokens_per_page: int = 0
    num_heads: int = 0
    head_dim: int = 0


@dataclass(frozen=True)
class LifeCycleDesc:
    """A lifecycle (layer group) and its buffers inside the slots of its hot pool group."""

    lifecycle_id: int
    buffers: Sequence[BufferDesc] = field(default_factory=tuple)


@dataclass(frozen=True)
class PoolGroupDesc:
    """A hot pool group: its pools and the lifecycles stored in them."""

    pools: Sequence[PoolDesc]
    lifecycles: Sequence[LifeCycleDesc]

    @property
    def page_bytes(self) -> int:
        """Bytes of one hot page (the sum of the pools' slot sizes)."""
        return sum(p.slot_bytes for p in self.pools)


def to_native(groups: Sequence[PoolGroupDesc]) -> list:
    """Converts descriptors to the tuples ``_native.NativeCodec.configure`` takes."""
    out = []
    for g, group in enumerate(groups):
        if not isinstance(group, PoolGroupDesc):
            raise TypeError(f"groups[{g}] is a {type(group).__name__}; expected kvcodec_sdk.PoolGroupDesc")
        pools = [(int(p.base), int(p.slot_bytes), int(p.num_slots)) for p in group.pools]
        lifecycles = []
        for lc in group.lifecycles:
            buffers = [
                (
                    int(b.layer_id),
                    int(b.role),
                    int(b.pool_index),
                    int(b.dtype),
                    int(b.byte_offset),
                    int(b.bytes),
                    int(b.tokens_per_page),
                    int(b.num_heads),
                    int(b.head_dim),
                )
                for b in lc.buffers
            ]
            lifecycles.append((int(lc.lifecycle_id), buffers))
        out.append((pools, lifecycles))
    return out
