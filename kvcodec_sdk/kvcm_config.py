"""Configuration of the KV-cache manager: layer groups with their buffers, and the tiers.

A layer group (= lifecycle; its position is its ID) lists the buffers of one page: per layer,
K, V or other buffers of ``bytes`` bytes each. The hot slot layout is derived from it: **one hot
pool per layer** (in order of first appearance), whose slot holds that layer's buffers back to
back in configuration order. Layer groups whose pools have identical slot sizes share one hot
pool group automatically.

Quotas are bytes per level. ``pool_ratio`` holds one positive hot-tier byte weight per layer
group (normalized); the host tier keeps the same slot-count proportions between layer groups,
converted with each layer group's cold-page size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .errors import KvcodecError
from .layout import DType, Role

__all__ = ["BufferConfig", "LayerGroupConfig", "KVCacheConfig", "KVCacheConfigError"]

MiB = 1 << 20


class KVCacheConfigError(KvcodecError, ValueError):
    """A KVCacheConfig field is invalid; the message names the field, its value and what is valid."""


def _int(where: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVCacheConfigError(f"{where} is {value!r} ({type(value).__name__}); it must be an integer")
    if value < minimum:
        qualifier = "positive" if minimum == 1 else f">= {minimum}"
        raise KVCacheConfigError(f"{where} is {value}; it must be {qualifier}")
    return value


@dataclass(frozen=True)
class BufferConfig:
    """One buffer of one layer in a page: ``bytes`` bytes of ``dtype``.

    Set ``tokens_per_page``, ``num_heads`` and ``head_dim`` together (the buffer is then
    ``[token][head][dim]`` elements and ``bytes`` must match) or leave all three 0 (opaque).
    """

    layer: int
    role: Role
    bytes: int
    dtype: DType = DType.UINT8
    tokens_per_page: int = 0
    num_heads: int = 0
    head_dim: int = 0


@dataclass(frozen=True)
class LayerGroupConfig:
    """A layer group: the buffers of one of its pages."""

    buffers: Sequence[BufferConfig]


@dataclass(frozen=True)
class KVCacheConfig:
    """Everything a :class:`~kvcodec_sdk.KVCacheManager` needs.

    :param layer_groups: The layer groups; layer group ``i`` is lifecycle ``i``.
    :param gpu_quota: Bytes of the hot tier (GPU memory; host memory with ``device="cpu"``).
    :param host_quota: Bytes of the host tier (pinned, GPU-mapped); 0 for a GPU-only manager.
    :param pool_ratio: One positive hot-tier byte weight per layer group; default equal weights.
    :param device: ``"auto"`` (the codec's device when a Codec is given, else the first GPU when
        present, else the CPU), ``"cpu"`` (host backend: CPU reference codecs, synchronous) or
        ``"cuda[:N]"``.
    :param index_ring_bytes: Device index ring size, allocated lazily only when a layer group's
        codec takes device-resident page indices.
    """

    layer_groups: Sequence[LayerGroupConfig]
    gpu_quota: int
    host_quota: int = 0
    pool_ratio: Sequence[float] | None = None
    device: str = "auto"
    index_ring_bytes: int = field(default=MiB)

    def validate(self) -> None:
        """Raises :class:`KVCacheConfigError` naming the first invalid field."""
        w = "KVCacheConfig"
        if not isinstance(self.layer_groups, (list, tuple)) or not self.layer_groups:
            raise KVCacheConfigError(f"{w}.layer_groups is {self.layer_groups!r}; it must be a non-empty list of LayerGroupConfig")
        for g, group in enumerate(self.layer_groups):
            gw = f"{w}.layer_groups[{g}]"
            if not isinstance(group, LayerGroupConfig):
                raise KVCacheConfigError(f"{gw} is a {type(group).__name__}; it must be a LayerGroupConfig")
            if not group.buffers:
                raise KVCacheConfigError(f"{gw}.buffers is empty; a layer group needs at least one buffer")
            for b, buf in enumerate(group.buffers):
                bw = f"{gw}.buffers[{b}]"
                if not isinstance(buf, BufferConfig):
                    raise KVCacheConfigError(f"{bw} is a {type(buf).__name__}; it must be a BufferConfig")
                _int(f"{bw}.layer", buf.layer, 0)
                _int(f"{bw}.bytes", buf.bytes, 1)
                try:
                    Role(buf.role)
                except ValueError:
                    raise KVCacheConfigError(f"{bw}.role is {buf.role!r}; valid roles are {[r.name for r in Role]}") from None
                try:
                    dtype = DType(buf.dtype)
                except ValueError:
                    raise KVCacheConfigError(f"{bw}.dtype is {buf.dtype!r}; valid dtypes are {[d.name for d in DType]}") from None
                shape = [_int(f"{bw}.{n}", getattr(buf, n), 0) for n in ("tokens_per_page", "num_heads", "head_dim")]
                if any(shape) and not all(shape):
                    raise KVCacheConfigError(
                        f"{bw} sets tokens_per_page/num_heads/head_dim to {tuple(shape)}; set all three or none"
                    )
                if all(shape) and math.prod(shape) * dtype.itemsize != buf.bytes:
                    raise KVCacheConfigError(
                        f"{bw}.bytes is {buf.bytes} but tokens_per_page*num_heads*head_dim*itemsize is "
                        f"{math.prod(shape) * dtype.itemsize}"
                    )
                if buf.bytes % dtype.itemsize:
                    raise KVCacheConfigError(f"{bw}.bytes is {buf.bytes}, not a multiple of the {dtype.name} item size {dtype.itemsize}")
        _int(f"{w}.gpu_quota", self.gpu_quota, 1)
        _int(f"{w}.host_quota", self.host_quota, 0)
        _int(f"{w}.index_ring_bytes", self.index_ring_bytes, 64)
        if self.index_ring_bytes % 8:
            raise KVCacheConfigError(f"{w}.index_ring_bytes is {self.index_ring_bytes}; it must be a multiple of 8")
        if self.pool_ratio is not None:
            if len(self.pool_ratio) != len(self.layer_groups):
                raise KVCacheConfigError(
                    f"{w}.pool_ratio has {len(self.pool_ratio)} entries; it needs one per layer group ({len(self.layer_groups)})"
                )
            for i, r in enumerate(self.pool_ratio):
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
                    raise KVCacheConfigError(f"{w}.pool_ratio[{i}] is {r!r}; every weight must be a positive finite number")
        if not isinstance(self.device, str):
            raise KVCacheConfigError(f"{w}.device is {self.device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'")

    def weights(self) -> list[float]:
        """The pool ratio, one weight per layer group (equal weights by default)."""
        return [float(r) for r in self.pool_ratio] if self.pool_ratio is not None else [1.0] * len(self.layer_groups)

    def to_native(self, envelope_format_version: int = -1) -> tuple:
        """The tuple ``_native.kvcm.KvcmCore`` takes (call :meth:`validate` first)."""
        groups = [
            [
                (int(b.layer), int(b.role), int(b.dtype), int(b.bytes), int(b.tokens_per_page), int(b.num_heads),
                 int(b.head_dim))
                for b in group.buffers
            ]
            for group in self.layer_groups
        ]
        return (groups, int(self.gpu_quota), int(self.host_quota), self.weights(), int(self.index_ring_bytes),
                int(envelope_format_version))
