"""The fp8 codec's blob plan, as the codec computes it at configure time (for tests and tools).

:func:`blob_plan` returns, per lifecycle, the cold page size and one entry per buffer: where
its codes, scales or lossless bytes lie in the blob, its scale blocks, and what the CUDA kernel
may assume about the hot addresses (``vector``: 16-element accesses, 16-byte aligned in every
slot; ``hot_aligned``: every element aligned to its size in every slot, else the element path
moves bytes). Only the pool addresses are used; no memory is read.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from kvcodec_sdk import PoolGroupDesc

from . import _ext
from .plugin import SPEC

__all__ = ["blob_plan"]


def blob_plan(groups: Sequence[PoolGroupDesc], params: Mapping[str, Any] | None = None) -> dict[int, dict]:
    """``{lifecycle id: {"group", "num_slots", "cold_page_bytes", "units_per_page", "buffers"}}``
    for ``groups`` under ``params`` (validated like the codec's); ``buffers`` are dicts named
    after the fields of the native BufferPlan (fp8_kernel.h). Raises ValueError for a layout the
    codec's configure() would reject."""
    plain = []
    for group in groups:
        pools = [(int(p.base), int(p.slot_bytes), int(p.num_slots)) for p in group.pools]
        lcs = [(int(lc.lifecycle_id),
                [(int(b.layer_id), int(b.role), int(b.pool_index), int(b.dtype), int(b.byte_offset), int(b.bytes),
                  int(b.tokens_per_page), int(b.num_heads), int(b.head_dim)) for b in lc.buffers])
               for lc in group.lifecycles]
        plain.append((pools, lcs))
    return {int(k): v for k, v in _ext.plan_layout(plain, SPEC.params_json(params)).items()}
