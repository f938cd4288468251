"""Realistic hot layouts for conformance tests.

A :class:`LayoutPlan` describes hot pool groups (pools: slot size and slot count) and their
lifecycles (buffers inside the slots) without any memory; :func:`generate_layout` draws one with
the shapes real engines produce: several pool groups, several lifecycles per group (one of them
describing its slots as opaque ``OTHER`` bytes, so a quantizing codec may give it another cold
size than its neighbours), K and V in separate pools or packed into one slot, odd slot sizes
(padding, block scales), bf16, fp16 and fp8 buffers, and pools of one group with different slot
counts. :data:`NAMED_LAYOUTS` are the fixed plans the suite runs on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..layout import BufferDesc, DType, LifeCycleDesc, Role

__all__ = ["PoolPlan", "GroupPlan", "LayoutPlan", "generate_layout", "named_layout", "NAMED_LAYOUTS"]


@dataclass(frozen=True)
class PoolPlan:
    slot_bytes: int
    num_slots: int


@dataclass(frozen=True)
class GroupPlan:
    pools: tuple[PoolPlan, ...]
    lifecycles: tuple[LifeCycleDesc, ...]

    @property
    def num_slots(self) -> int:
        """Usable hot slots: the minimum over the pools."""
        return min(p.num_slots for p in self.pools)

    @property
    def page_bytes(self) -> int:
        return sum(p.slot_bytes for p in self.pools)


@dataclass(frozen=True)
class LayoutPlan:
    name: str
    groups: tuple[GroupPlan, ...]

    @property
    def lifecycle_ids(self) -> list[int]:
        return [lc.lifecycle_id for g in self.groups for lc in g.lifecycles]

    def group_of(self, lifecycle: int) -> int:
        for g, group in enumerate(self.groups):
            if any(lc.lifecycle_id == lifecycle for lc in group.lifecycles):
                return g
        raise KeyError(f"lifecycle {lifecycle} is not in layout {self.name!r}; it has {self.lifecycle_ids}")

    def buffers_of(self, lifecycle: int) -> tuple[BufferDesc, ...]:
        group = self.groups[self.group_of(lifecycle)]
        return next(tuple(lc.buffers) for lc in group.lifecycles if lc.lifecycle_id == lifecycle)

    def describe(self) -> str:
        parts = []
        for g, group in enumerate(self.groups):
            pools = ", ".join(f"{p.slot_bytes}Bx{p.num_slots}" for p in group.pools)
            ids = ", ".join(str(lc.lifecycle_id) for lc in group.lifecycles)
            parts.append(f"group {g}: pools [{pools}], lifecycles [{ids}]")
        return f"{self.name}: " + "; ".join(parts)


def _kv(layer: int, dtype: DType, tokens: int, heads: int, dim: int,
        k_at: tuple[int, int], v_at: tuple[int, int]) -> list[BufferDesc]:
    """K and V buffers of one layer at (pool index, byte offset) each."""
    nbytes = tokens * heads * dim * dtype.itemsize
    return [BufferDesc(layer, role, pool, offset, nbytes, dtype, tokens, heads, dim)
            for role, (pool, offset) in ((Role.KEY, k_at), (Role.VALUE, v_at))]


def _opaque(buffers: Sequence[BufferDesc]) -> tuple[BufferDesc, ...]:
    """The same bytes described as opaque OTHER buffers (e.g. an indexer's keys)."""
    return tuple(BufferDesc(b.layer_id, Role.OTHER, b.pool_index, b.byte_offset, b.bytes) for b in buffers)


_DTYPES = (DType.BFLOAT16, DType.FLOAT16, DType.FLOAT8_E4M3, DType.FLOAT8_E5M2)


def generate_layout(rng: np.random.Generator, *, name: str = "generated", num_groups: int = 3,
                    min_slots: int = 24, max_slots: int = 40, first_id: int = 0) -> LayoutPlan:
    """A random realistic layout (see the module docstring). Group ``g`` uses dtype
    ``bf16, fp16, fp8 e4m3, fp8 e5m2`` in turn; even groups keep K and V in separate pools, odd
    groups pack K, V and odd padding into one slot; every group has an odd-sized ``OTHER`` pool
    (block scales) and 2-3 lifecycles with shuffled, non-contiguous IDs."""
    ids = (first_id + rng.permutation(num_groups * 8)[: num_groups * 3]).tolist()
    groups = []
    for g in range(num_groups):
        dtype = _DTYPES[g % len(_DTYPES)]
        tokens = int(rng.choice([4, 8, 16]))
        heads = int(rng.choice([1, 2, 4]))
        dim = int(rng.choice([16, 64, 128]))
        kv_bytes = tokens * heads * dim * dtype.itemsize
        slots = int(rng.integers(min_slots, max_slots + 1))
        layers = int(rng.integers(1, 3))
        buffers: list[BufferDesc] = []
        pools: list[PoolPlan] = []
        if g % 2 == 0:
            # Separate K and V pools per layer; pool slot counts differ by a little.
            for layer in range(layers):
                buffers += _kv(layer, dtype, tokens, heads, dim, (2 * layer, 0), (2 * layer + 1, 0))
                pools += [PoolPlan(kv_bytes, slots + int(rng.integers(0, 3))) for _ in range(2)]
        else:
            # K then V of every layer packed in one slot, then odd padding.
            pad = int(rng.choice([1, 7, 13]))
            for layer in range(layers):
                buffers += _kv(layer, dtype, tokens, heads, dim, (0, 2 * layer * kv_bytes), (0, (2 * layer + 1) * kv_bytes))
            pools.append(PoolPlan(2 * layers * kv_bytes + pad, slots))
        scales = int(rng.choice([4, 36, 100])) + 1  # odd: never a multiple of 2 or 4
        buffers.append(BufferDesc(layers, Role.OTHER, len(pools), 0, scales - 1, DType.UINT8))
        pools.append(PoolPlan(scales, slots + 1))
        count = int(rng.integers(2, 4))
        lcs = [LifeCycleDesc(ids[3 * g + i], tuple(buffers)) for i in range(count)]
        lcs[-1] = LifeCycleDesc(lcs[-1].lifecycle_id, _opaque(buffers))
        groups.append(GroupPlan(tuple(pools), tuple(lcs)))
    return LayoutPlan(name, tuple(groups))


def _tiny_odd() -> LayoutPlan:
    # Slots of 1, 3 and 7 bytes: no codec may assume alignment or a minimum size.
    pools = (PoolPlan(1, 17), PoolPlan(3, 16), PoolPlan(7, 18))
    buffers = (BufferDesc(0, Role.KEY, 0, 0, 1, DType.INT8), BufferDesc(0, Role.VALUE, 1, 0, 3, DType.UINT8),
               BufferDesc(1, Role.OTHER, 2, 0, 7, DType.UINT8))
    return LayoutPlan("tiny-odd", (GroupPlan(pools, (LifeCycleDesc(4, buffers), LifeCycleDesc(2, buffers))),))


def _many_pages() -> LayoutPlan:
    # 100k+1 slots of two small fp16 K/V pools: calls of up to 100k pages.
    dtype, tokens, heads, dim = DType.FLOAT16, 2, 1, 8
    buffers = tuple(_kv(0, dtype, tokens, heads, dim, (0, 0), (1, 0)))
    slot = tokens * heads * dim * dtype.itemsize
    pools = (PoolPlan(slot, 100_001), PoolPlan(slot, 100_001))
    return LayoutPlan("many-pages", (GroupPlan(pools, (LifeCycleDesc(0, buffers),)),))


def named_layout(name: str) -> LayoutPlan:
    """One of :data:`NAMED_LAYOUTS`: ``"mixed"`` (a fixed :func:`generate_layout` with 4 groups),
    ``"tiny-odd"`` (1-7 byte slots) or ``"many-pages"`` (100k+1 slots)."""
    if name == "mixed":
        return generate_layout(np.random.default_rng(0x6B76), name="mixed", num_groups=4)
    if name == "tiny-odd":
        return _tiny_odd()
    if name == "many-pages":
        return _many_pages()
    raise KeyError(f"unknown layout {name!r}; named layouts: {', '.join(NAMED_LAYOUTS)}")


NAMED_LAYOUTS = ("mixed", "tiny-odd", "many-pages")
