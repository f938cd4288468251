"""Engine-owned KV tensors as hot pool groups: one call from an engine's per-layer KV cache
tensors to the :class:`~kvcodec_sdk.layout.PoolGroupDesc` a codec is configured with.

Engines allocate their KV cache themselves, one tensor per attention layer whose leading
dimension is the block (page) index. A codec can address that memory directly: each layer's
tensor becomes one hot pool (slot ``s`` = block ``s``), all layers of a KV cache group become one
hot pool group, and a page is then block ``s`` of every layer, which is what an engine offloads
as one unit. :func:`kv_pool_group` builds the descriptors; what it needs to know is how K and V
lie inside one block of one layer (:data:`KV_LAYOUTS`).
"""

from __future__ import annotations

from typing import Any, Sequence

from .layout import BufferDesc, BufferRole, DataType, LifeCycleDesc, PoolDesc, PoolGroupDesc

__all__ = ["KV_LAYOUTS", "kv_pool_group", "kv_data_type"]

#: How K and V lie inside one block of one layer (outermost to innermost; ``2`` is K then V,
#: ``H`` the KV heads, ``N`` the block's tokens, ``C`` one head's elements):
#:
#: - ``"H2NC"``: per head, the K rows of the block's tokens, then their V rows (vLLM's CPU
#:   attention, ``[num_blocks, H, N, 2 C]`` read as ``[num_blocks, H, 2 N, C]``);
#: - ``"HN2C"``: per head and token, K then V side by side (vLLM's FlashAttention under its
#:   ``LBHNC`` layout, ``[num_blocks, H, N, 2 C]`` split on the last axis);
#: - ``"2NHC"``: a K plane ``[N][H][C]``, then a V plane (``[num_blocks, 2, N, H, C]``);
#: - ``"2HNC"``: a K plane ``[H][N][C]``, then a V plane (``[num_blocks, 2, H, N, C]``).
#:
#: A buffer descriptor covers contiguous bytes as ``[token][head][dim]``, so each layout becomes
#: the fewest buffers that say exactly where every K and V element is: one K and one V buffer per
#: layer for ``"2NHC"``, one per head for ``"H2NC"`` and ``"2HNC"``, and for ``"HN2C"`` one
#: ``BufferRole.KEY_VALUE`` buffer per head, shaped ``(tokens, 2, head_dim)``: its two "heads" are
#: that head's K and V. Quantizing codecs (fp8, nvfp4) then see real K and V with their heads
#: (a scale per page and head is one for the head's K and one for its V); lossless codecs copy
#: whole slots either way.
KV_LAYOUTS = ("H2NC", "HN2C", "2NHC", "2HNC")

_TORCH_DTYPES = {
    "torch.float16": DataType.FLOAT16,
    "torch.bfloat16": DataType.BFLOAT16,
    "torch.float32": DataType.FLOAT32,
    "torch.uint8": DataType.UINT8,
    "torch.int8": DataType.INT8,
    "torch.float8_e4m3fn": DataType.FLOAT8_E4M3,
    "torch.float8_e5m2": DataType.FLOAT8_E5M2,
    "torch.int32": DataType.INT32,
}
_NAMED_DTYPES = {
    "float16": DataType.FLOAT16, "half": DataType.FLOAT16, "fp16": DataType.FLOAT16,
    "bfloat16": DataType.BFLOAT16, "bf16": DataType.BFLOAT16,
    "float32": DataType.FLOAT32, "float": DataType.FLOAT32, "fp32": DataType.FLOAT32,
    "fp8": DataType.FLOAT8_E4M3, "fp8_e4m3": DataType.FLOAT8_E4M3, "float8_e4m3fn": DataType.FLOAT8_E4M3,
    "fp8_e5m2": DataType.FLOAT8_E5M2, "float8_e5m2": DataType.FLOAT8_E5M2,
    "uint8": DataType.UINT8, "int8": DataType.INT8, "int32": DataType.INT32,
}


def kv_data_type(dtype: Any) -> DataType:
    """The :class:`~kvcodec_sdk.layout.DataType` of a torch dtype, a numpy dtype or a name such as
    ``"bfloat16"``, ``"float16"``, ``"fp8_e4m3"`` (vLLM's cache dtype names included)."""
    if isinstance(dtype, DataType):
        return dtype
    key = str(dtype)
    if key in _TORCH_DTYPES:
        return _TORCH_DTYPES[key]
    name = key.removeprefix("torch.").lower()
    if name in _NAMED_DTYPES:
        return _NAMED_DTYPES[name]
    raise ValueError(f"KV dtype {dtype!r} has no kvcodec DataType; known: {sorted(_NAMED_DTYPES)}")


def _address(tensor: Any, what: str) -> int:
    ptr = getattr(tensor, "data_ptr", None)
    if callable(ptr):
        return int(ptr())
    ctypes = getattr(tensor, "ctypes", None)
    if ctypes is not None:
        return int(ctypes.data)
    raise TypeError(f"{what} is a {type(tensor).__name__}; pass a torch tensor or a numpy array")


def _block_stride_bytes(tensor: Any, what: str) -> tuple[int, int]:
    """(bytes from one block to the next, number of blocks) of a tensor whose axis 0 is the block."""
    shape = tuple(int(d) for d in tensor.shape)
    if not shape:
        raise ValueError(f"{what} is a scalar; its first axis must be the block index")
    if hasattr(tensor, "element_size"):
        stride = int(tensor.stride(0)) * int(tensor.element_size())
    else:
        stride = int(tensor.strides[0])
    return stride, shape[0]


def _layer_buffers(layout: str, layer_id: int, pool: int, dtype: DataType, heads: int, tokens: int,
                   dim: int) -> list[BufferDesc]:
    item = dtype.itemsize
    row = dim * item  # one head's elements of one token
    out: list[BufferDesc] = []

    def add(role: BufferRole, offset: int, n_tokens: int, n_heads: int) -> None:
        out.append(BufferDesc(layer_id=layer_id, role=role, pool_index=pool, byte_offset=offset,
                              bytes=n_tokens * n_heads * row, dtype=dtype, tokens_per_page=n_tokens,
                              num_heads=n_heads, head_dim=dim))

    roles = (BufferRole.KEY, BufferRole.VALUE)
    if layout == "2NHC":
        for p, role in enumerate(roles):
            add(role, p * tokens * heads * row, tokens, heads)
    elif layout == "2HNC":
        for p, role in enumerate(roles):
            for h in range(heads):
                add(role, (p * heads + h) * tokens * row, tokens, 1)
    elif layout == "H2NC":
        for h in range(heads):
            for p, role in enumerate(roles):
                add(role, (h * 2 + p) * tokens * row, tokens, 1)
    elif layout == "HN2C":
        for h in range(heads):  # [token][K, V][dim]: a K-and-V buffer whose two "heads" are K and V
            add(BufferRole.KEY_VALUE, h * tokens * 2 * row, tokens, 2)
    else:
        raise ValueError(f"KV layout {layout!r} is not one of {', '.join(KV_LAYOUTS)}")
    return out


def kv_pool_group(tensors: Sequence[Any], *, layout: str, num_heads: int, head_dim: int, block_size: int,
                  dtype: Any = None, layer_ids: Sequence[int] | None = None, lifecycle_id: int = 0,
                  num_blocks: int | None = None) -> PoolGroupDesc:
    """The hot pool group of one KV cache group: one pool per layer tensor, one lifecycle.

    :param tensors: one tensor per layer (torch or numpy), axis 0 the block index, each block's
        bytes laid out as ``layout`` says; any view works whose ``stride(0)`` is the distance
        between blocks (vLLM's ``int8`` ``(num_blocks, page_bytes)`` views included). The
        engine keeps them alive and in place while the codec is configured on them.
    :param layout: where K and V lie inside one block (:data:`KV_LAYOUTS`).
    :param num_heads: KV heads of one layer on this rank.
    :param head_dim: elements of one head.
    :param block_size: tokens of one block.
    :param dtype: the KV element type (torch dtype, numpy dtype or name); default: the tensors'
        own dtype (required for byte views such as vLLM's ``int8`` ones).
    :param layer_ids: the layer id of each tensor (default 0, 1, ...).
    :param lifecycle_id: the lifecycle of the group (the ``lifecycle`` argument of encode/decode).
    :param num_blocks: slots per pool (default: the tensors' first dimension).
    :returns: a :class:`~kvcodec_sdk.layout.PoolGroupDesc` whose slot ``s`` is block ``s`` of
        every layer; a block's bytes past its K and V (padding) become a buffer of role *other*,
        stored losslessly.
    """
    if not tensors:
        raise ValueError("kv_pool_group needs at least one layer tensor")
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} is {value!r}; it must be an integer >= 1")
    if layout not in KV_LAYOUTS:
        raise ValueError(f"KV layout {layout!r} is not one of {', '.join(KV_LAYOUTS)}")
    kv = kv_data_type(dtype if dtype is not None else tensors[0].dtype)
    ids = list(range(len(tensors))) if layer_ids is None else [int(i) for i in layer_ids]
    if len(ids) != len(tensors):
        raise ValueError(f"{len(tensors)} tensors but {len(ids)} layer ids")
    used = 2 * num_heads * block_size * head_dim * kv.itemsize
    pools: list[PoolDesc] = []
    buffers: list[BufferDesc] = []
    for i, (tensor, layer) in enumerate(zip(tensors, ids)):
        what = f"layer tensor {i} (layer {layer})"
        stride, blocks = _block_stride_bytes(tensor, what)
        slots = blocks if num_blocks is None else int(num_blocks)
        if slots < 1 or slots > blocks:
            raise ValueError(f"num_blocks is {num_blocks}; {what} holds {blocks} blocks")
        if stride < used:
            raise ValueError(f"{what}: one block is {stride} bytes apart from the next, but {num_heads} heads x "
                             f"{block_size} tokens x {head_dim} elements of K and V of {kv.name} take {used} bytes")
        pools.append(PoolDesc(base=_address(tensor, what), slot_bytes=stride, num_slots=slots))
        buffers += _layer_buffers(layout, layer, i, kv, num_heads, block_size, head_dim)
        if stride > used:
            buffers.append(BufferDesc(layer_id=layer, role=BufferRole.OTHER, pool_index=i, byte_offset=used,
                                      bytes=stride - used, dtype=DataType.UINT8))
    return PoolGroupDesc(pools=pools, lifecycles=[LifeCycleDesc(lifecycle_id, buffers)])
