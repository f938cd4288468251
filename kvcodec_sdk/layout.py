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
    "DataType",
    "BufferRole",
    "DType",
    "Role",
    "PageIndexLocation",
    "PageStatus",
    "PoolDesc",
    "BufferDesc",
    "LifeCycleDesc",
    "PoolGroupDesc",
]


class DataType(enum.IntEnum):
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


class BufferRole(enum.IntEnum):
    """Role of a buffer inside a hot slot (``kvcodec::BufferRole``)."""

    KEY = 0
    VALUE = 1
    OTHER = 2
    #: K and V side by side along the heads axis: of a shaped buffer's heads, ``2h`` is KV head
    #: ``h``'s K and ``2h + 1`` its V (an even number of heads). One KV head of vLLM's
    #: FlashAttention blocks, whose tokens each hold that head's K row then its V row, is one such
    #: buffer of shape ``(tokens, 2, head_dim)`` (:func:`kvcodec_sdk.kv_tensors.kv_pool_group`, ``"HN2C"``).
    KEY_VALUE = 3


#: Short names of :class:`DataType` and :class:`BufferRole` (the same classes).
DType = DataType
Role = BufferRole


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


@dataclass(frozen=True, eq=False)
class BufferDesc:
    """One buffer of one layer: ``bytes`` bytes of ``dtype``, inside the slot of pool ``pool_index``.

    The one buffer type of the SDK: a :class:`~kvcodec_sdk.KVCacheConfig` lists buffers with
    ``layer_id``, ``role``, ``bytes`` (and optionally ``dtype`` and shape) and leaves
    ``pool_index`` and ``byte_offset`` 0 (the manager places them);
    :meth:`~kvcodec_sdk.KVCacheManager.buffer_layout` answers with them filled in; a codec's
    :class:`LifeCycleDesc` carries them for ``configure``.

    It covers bytes ``[byte_offset, byte_offset + bytes)`` of the slot. When ``tokens_per_page``,
    ``num_heads`` and ``head_dim`` are all set, the buffer is ``[token][head][dim]`` elements of
    ``dtype``; leave all three 0 for opaque bytes.
    """

    layer_id: int
    role: BufferRole
    pool_index: int = 0
    byte_offset: int = 0
    bytes: int = 0
    dtype: DataType = DataType.UINT8
    tokens_per_page: int = 0
    num_heads: int = 0
    head_dim: int = 0

    def _key(self) -> tuple:
        return (self.layer_id, self.role, self.pool_index, self.byte_offset, self.bytes, self.dtype,
                self.tokens_per_page, self.num_heads, self.head_dim)

    def __eq__(self, other: object) -> bool:
        # Instances of the deprecated spellings compare equal to the same BufferDesc.
        return isinstance(other, BufferDesc) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def shape(self) -> tuple:
        """``(tokens_per_page, num_heads, head_dim)``, or ``(bytes // itemsize,)`` when opaque."""
        if self.tokens_per_page:
            return (self.tokens_per_page, self.num_heads, self.head_dim)
        return (self.bytes // DataType(self.dtype).itemsize,)

    # The field names of the former BufferConfig and BufferLayout, read-only.
    @property
    def layer(self) -> int:
        """``layer_id`` (the former BufferConfig/BufferLayout spelling)."""
        return self.layer_id

    @property
    def pool(self) -> int:
        """``pool_index`` (the former BufferLayout spelling)."""
        return self.pool_index

    @property
    def offset(self) -> int:
        """``byte_offset`` (the former BufferLayout spelling)."""
        return self.byte_offset


class _DeprecatedBufferAlias(type):
    """Metaclass of the deprecated buffer spellings: every BufferDesc is an instance of them."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, BufferDesc)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, BufferDesc)


def _deprecated(old: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated; use kvcodec_sdk.BufferDesc (layer_id=, role=, bytes=, ...)",
                  DeprecationWarning, stacklevel=3)


class BufferConfig(BufferDesc, metaclass=_DeprecatedBufferAlias):
    """Deprecated: a :class:`BufferDesc` built with the former configuration spelling
    ``BufferConfig(layer, role, bytes, dtype, tokens_per_page, num_heads, head_dim)``."""

    def __init__(self, layer: int, role: BufferRole, bytes: int, dtype: DataType = DataType.UINT8,
                 tokens_per_page: int = 0, num_heads: int = 0, head_dim: int = 0):
        _deprecated("BufferConfig")
        super().__init__(layer_id=layer, role=role, bytes=bytes, dtype=dtype, tokens_per_page=tokens_per_page,
                         num_heads=num_heads, head_dim=head_dim)


class BufferLayout(BufferDesc, metaclass=_DeprecatedBufferAlias):
    """Deprecated: a :class:`BufferDesc` built with the former layout spelling
    ``BufferLayout(layer, role, pool, dtype, offset, bytes, shape)``."""

    def __init__(self, layer: int, role: BufferRole, pool: int, dtype: DataType, offset: int, bytes: int,
                 shape: tuple = ()):
        _deprecated("BufferLayout")
        dims = tuple(shape) if len(tuple(shape)) == 3 else (0, 0, 0)
        super().__init__(layer_id=layer, role=role, pool_index=pool, byte_offset=offset, bytes=bytes, dtype=dtype,
                         tokens_per_page=dims[0], num_heads=dims[1], head_dim=dims[2])


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
    """The native descriptors ``_native.NativeCodec.configure`` takes (see ``_boundary``)."""
    from ._boundary import pool_groups_to_native

    return pool_groups_to_native(groups)
