"""Shared helpers for the CPU test suite: numpy-backed hot layouts and page-index arrays.

Everything here runs on the host: pool bases are ``ndarray.ctypes.data`` addresses, which is what
the concat codec's CPU reference (``device="cpu"``) takes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

#: Bytes of guard memory before and after every pool; a codec write outside its slots lands here.
GUARD_BYTES = 64

#: Slot sizes the random layouts draw from: odd, tiny, and one just above a page.
ODD_SLOT_SIZES = (1, 3, 7, 64, 100, 513, 4097)


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random bytes, never zero (so a missed copy of zeros cannot look correct)."""
    return rng.integers(1, 256, size=n, dtype=np.uint8)


def guarded_buffer(rng: np.random.Generator, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(backing, view): ``nbytes`` random bytes between two random guard regions of the backing."""
    backing = random_bytes(rng, nbytes + 2 * GUARD_BYTES)
    return backing, backing[GUARD_BYTES : GUARD_BYTES + nbytes]


def pairs(dst: Sequence[int], src: Sequence[int]) -> np.ndarray:
    """A C-contiguous int32 PageIndexPair array of shape (N, 2), columns (dst, src)."""
    assert len(dst) == len(src)
    return np.ascontiguousarray(np.stack([np.asarray(dst), np.asarray(src)], axis=1).astype(np.int32).reshape(-1, 2))


@dataclass
class HotLayout:
    """Hot pool groups backed by numpy memory.

    ``groups`` is what ``Codec.configure`` takes; ``pools[g][p]`` is pool ``p`` of group ``g`` as a
    (num_slots, slot_bytes) uint8 view; ``backings`` hold the views plus their guard regions and
    keep the memory alive. Unpacks as ``groups, pools = layout``.
    """

    groups: list[PoolGroupDesc]
    pools: list[list[np.ndarray]]
    backings: list[list[np.ndarray]] = field(repr=False)
    lifecycles: list[list[int]]

    def __iter__(self):
        return iter((self.groups, self.pools))

    def num_slots(self, g: int) -> int:
        """Usable hot slots of group ``g``: the minimum over its pools."""
        return min(p.shape[0] for p in self.pools[g])

    def page_bytes(self, g: int) -> int:
        return sum(p.shape[1] for p in self.pools[g])

    def hot_page(self, g: int, slot: int) -> np.ndarray:
        """Independent expectation of a concat blob: the slot of every pool, in pool order."""
        return np.concatenate([p[slot] for p in self.pools[g]])

    def snapshot(self) -> list[list[np.ndarray]]:
        """Copies of every backing (pool bytes and guards)."""
        return [[b.copy() for b in group] for group in self.backings]

    def group_of(self, lifecycle: int) -> int:
        return next(g for g, ids in enumerate(self.lifecycles) if lifecycle in ids)


def make_hot_layout(
    rng: np.random.Generator,
    slot_bytes: Sequence[Sequence[int]],
    num_slots: Sequence[Sequence[int]],
    lifecycles: Sequence[Sequence[int]],
) -> HotLayout:
    """Builds hot pool groups: group ``g`` has pools with ``slot_bytes[g][p]`` bytes per slot and
    ``num_slots[g][p]`` slots, and the lifecycles ``lifecycles[g]``. Pools are filled with random
    non-zero bytes; every lifecycle describes each pool slot as one opaque byte buffer, plus a
    shaped [token][head][dim] uint8 buffer over the same bytes (a copying codec must ignore both).
    """
    groups, pools, backings = [], [], []
    for g, (sizes, counts, ids) in enumerate(zip(slot_bytes, num_slots, lifecycles)):
        group_pools, group_backings, descs = [], [], []
        for size, count in zip(sizes, counts):
            backing, view = guarded_buffer(rng, size * count)
            group_backings.append(backing)
            group_pools.append(view.reshape(count, size))
            descs.append(PoolDesc(base=view.ctypes.data, slot_bytes=size, num_slots=count))
        buffers = []
        for p, size in enumerate(sizes):
            role = (Role.KEY, Role.VALUE, Role.OTHER)[p % 3]
            buffers.append(BufferDesc(layer_id=p, role=role, pool_index=p, byte_offset=0, bytes=size))
            buffers.append(
                BufferDesc(
                    layer_id=p, role=role, pool_index=p, byte_offset=0, bytes=size, dtype=DType.UINT8,
                    tokens_per_page=size, num_heads=1, head_dim=1,
                )
            )
        groups.append(PoolGroupDesc(pools=descs, lifecycles=[LifeCycleDesc(i, tuple(buffers)) for i in ids]))
        pools.append(group_pools)
        backings.append(group_backings)
    return HotLayout(groups, pools, backings, [list(ids) for ids in lifecycles])


def random_hot_layout(
    rng: np.random.Generator, *, num_groups: int = 3, min_pools: int = 3, max_pools: int = 4, max_slots: int = 10
) -> HotLayout:
    """A random layout: several groups, 3+ pools with odd slot sizes (pools of one group may have
    different slot counts), several lifecycles per group with distinct, shuffled IDs."""
    ids = rng.permutation(1000)[: num_groups * 4].tolist()
    sizes, counts, lcs = [], [], []
    for g in range(num_groups):
        n = int(rng.integers(min_pools, max_pools + 1))
        sizes.append([int(s) for s in rng.choice(ODD_SLOT_SIZES, size=n)])
        base = int(rng.integers(2, max_slots + 1))
        counts.append([base + int(rng.integers(0, 3)) for _ in range(n)])
        lcs.append(ids[g * 4 : g * 4 + int(rng.integers(2, 5))])
    return make_hot_layout(rng, sizes, counts, lcs)


def wait_for_stats(stats: Callable[[], dict], cond: Callable[[dict], Any], timeout: float = 10.0) -> dict:
    """Polls ``stats()`` every 10 ms until ``cond`` holds of it or ``timeout`` seconds pass; returns
    the last reading (a daemon handles closed connections and write-backs in its own time)."""
    deadline = time.monotonic() + timeout
    while not cond(s := stats()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return s
