"""The fp8 codec's blob plan, as the codec computes it at configure time (for tests and tools).

:func:`blob_plan` returns, per lifecycle, the cold page size and one entry per buffer: where
its codes, scales or lossless bytes lie in the blob, its scale blocks, and what the CUDA kernel
may assume about the hot addresses (``vector``: 16-element accesses, 16-byte aligned in every
slot; ``hot_aligned``: every element aligned to its size in every slot, else the element path
moves bytes). Only the pool addresses are used; no memory is read.

Under ``kernel="tile"`` it also gives the tile plan: ``tile_blocks`` (scale blocks per tile, 0
for a buffer that takes warp units), ``units`` in thread blocks (one per tile, or
``WARPS_PER_CTA`` of the buffer's ``warp_units``), and per lifecycle the dynamic shared memory of
the encode and decode launches (``tile_encode_smem``, ``tile_decode_smem``). The budget is the
device's (:func:`tile_budget`); ``DEFAULT_TILE_BUDGET`` is an H100/H200's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from kvcodec_sdk import PoolGroupDesc

from . import _testing
from .plugin import SPEC

__all__ = ["blob_plan", "tile_budget", "DEFAULT_TILE_BUDGET", "MAX_TILE_BUDGET", "TILE_META_BYTES",
           "WARPS_PER_CTA"]

DEFAULT_TILE_BUDGET: int = _testing.DEFAULT_TILE_BUDGET
MAX_TILE_BUDGET: int = _testing.MAX_TILE_BUDGET
TILE_META_BYTES: int = _testing.TILE_META_BYTES
WARPS_PER_CTA: int = _testing.WARPS_PER_CTA


def tile_budget(smem_per_sm: int, smem_optin_per_block: int, reserved_per_block: int) -> int:
    """Shared memory bytes a tile may use on a device with these limits (bytes), as the CUDA
    codec computes it from the device's attributes: the largest tile that lets two thread
    blocks share an SM, at most ``MAX_TILE_BUDGET``, rounded down to 1 KiB."""
    return int(_testing.tile_budget(smem_per_sm, smem_optin_per_block, reserved_per_block))


def blob_plan(groups: Sequence[PoolGroupDesc], params: Mapping[str, Any] | None = None,
              tile_budget: int = DEFAULT_TILE_BUDGET) -> dict[int, dict]:
    """``{lifecycle id: {"group", "num_slots", "cold_page_bytes", "units_per_page",
    "tile_encode_smem", "tile_decode_smem", "buffers"}}`` for ``groups`` under ``params``
    (validated like the codec's) and a tile budget in bytes; ``buffers`` are dicts named after
    the fields of the native BufferPlan (kernel.h). Raises ValueError for a layout the
    codec's configure() would reject."""
    plain = []
    for group in groups:
        pools = [(int(p.base), int(p.slot_bytes), int(p.num_slots)) for p in group.pools]
        lcs = [(int(lc.lifecycle_id),
                [(int(b.layer_id), int(b.role), int(b.pool_index), int(b.dtype), int(b.byte_offset), int(b.bytes),
                  int(b.tokens_per_page), int(b.num_heads), int(b.head_dim)) for b in lc.buffers])
               for lc in group.lifecycles]
        plain.append((pools, lcs))
    return {int(k): v for k, v in _testing.plan_layout(plain, SPEC.params_json(params), int(tile_budget)).items()}
