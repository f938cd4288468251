"""kvcodec_sdk.kv_tensors: engine KV tensors as hot pool groups.

Each layout is checked against the engine's own reading of its tensor: every K and V element a
buffer descriptor points at (pool base + slot x slot bytes + byte offset, read as
``[token][head][dim]``) must be the element the engine's indexing gives for that layer, role,
block, token, head and dim. Then the descriptors configure real CPU codecs over the tensors in
place: blocks encoded and decoded back come out byte-exact (concat) or within the declared bound
(fp8, which sees the K and V buffers with their heads).
"""

from __future__ import annotations

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk.kv_tensors import KV_LAYOUTS, kv_data_type, kv_pool_group
from kvcodec_sdk.testing import kv_like

torch = pytest.importorskip("torch")

BLOCKS, HEADS, TOKENS, DIM, LAYERS = 5, 2, 16, 32, 3


def engine_tensor(layout: str, layer: int, dtype=torch.float32) -> torch.Tensor:
    """One layer's KV tensor in the engine's shape, every element a distinct value."""
    shape = {"H2NC": (BLOCKS, HEADS, TOKENS, 2 * DIM), "HN2C": (BLOCKS, HEADS, TOKENS, 2 * DIM),
             "2NHC": (BLOCKS, 2, TOKENS, HEADS, DIM), "2HNC": (BLOCKS, 2, HEADS, TOKENS, DIM)}[layout]
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float64) + layer * n).reshape(shape).to(dtype)


def engine_kv(layout: str, t: torch.Tensor, role: kv.BufferRole, block: int) -> torch.Tensor:
    """The engine's reading of one block's K or V, as [token][head][dim]."""
    p = 0 if role == kv.BufferRole.KEY else 1
    if layout == "H2NC":  # vLLM CPU attention: [B, H, N, 2C] viewed as [B, H, 2N, C]
        return t.view(BLOCKS, HEADS, 2 * TOKENS, DIM)[block, :, p * TOKENS:(p + 1) * TOKENS].permute(1, 0, 2)
    if layout == "HN2C":  # [B, H, N, 2C] split on the last axis
        return t[block, :, :, p * DIM:(p + 1) * DIM].permute(1, 0, 2)
    if layout == "2NHC":
        return t[block, p]
    return t[block, p].permute(1, 0, 2)  # 2HNC


def read_buffer(tensors, group: kv.PoolGroupDesc, buf: kv.BufferDesc, slot: int, np_dtype) -> np.ndarray:
    """The bytes a buffer descriptor names, as (tokens, heads, dim) values."""
    pool = group.pools[buf.pool_index]
    t = tensors[buf.pool_index]
    assert pool.base == t.data_ptr()
    raw = t.view(-1).view(torch.uint8).numpy() if t.is_contiguous() else None
    if raw is None:  # a strided byte view: read through its storage
        raw = torch.frombuffer(t.untyped_storage(), dtype=torch.uint8).numpy()[t.storage_offset():]
    start = slot * pool.slot_bytes + buf.byte_offset
    return raw[start:start + buf.bytes].view(np_dtype).reshape(buf.tokens_per_page, buf.num_heads, buf.head_dim)


KV_ROLES = (kv.BufferRole.KEY, kv.BufferRole.VALUE, kv.BufferRole.KEY_VALUE)


def kv_buffers(group: kv.PoolGroupDesc) -> list[kv.BufferDesc]:
    return [b for b in group.lifecycles[0].buffers if b.role in KV_ROLES]


def role_parts(b: kv.BufferDesc, part: np.ndarray, role: kv.BufferRole) -> np.ndarray | None:
    """The (tokens, heads, dim) elements of ``role`` a buffer holds: all of a K or V buffer's, the
    even (K) or odd (V) heads of a K-and-V buffer's; None when it holds none."""
    if b.role == kv.BufferRole.KEY_VALUE:
        return part[:, 0::2] if role == kv.BufferRole.KEY else part[:, 1::2]
    return part if b.role == role else None


@pytest.mark.parametrize("layout", KV_LAYOUTS)
def test_every_kv_element_is_where_the_descriptor_says(layout):
    tensors = [engine_tensor(layout, l) for l in range(LAYERS)]
    group = kv_pool_group(tensors, layout=layout, num_heads=HEADS, head_dim=DIM, block_size=TOKENS,
                          layer_ids=[10, 11, 12])
    assert [p.num_slots for p in group.pools] == [BLOCKS] * LAYERS
    assert [p.slot_bytes for p in group.pools] == [2 * HEADS * TOKENS * DIM * 4] * LAYERS
    buffers = group.lifecycles[0].buffers
    assert all(b.role != kv.BufferRole.OTHER for b in buffers)  # no padding in a packed block
    # K and V of every layer cover its whole block exactly once.
    for pool in range(LAYERS):
        spans = sorted((b.byte_offset, b.byte_offset + b.bytes) for b in buffers if b.pool_index == pool)
        assert spans[0][0] == 0 and spans[-1][1] == group.pools[pool].slot_bytes
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    for block in (0, 3, BLOCKS - 1):
        for pool, layer in enumerate((10, 11, 12)):
            for role in (kv.BufferRole.KEY, kv.BufferRole.VALUE):
                want = engine_kv(layout, tensors[pool], role, block).numpy()
                got = np.zeros_like(want)
                seen = np.zeros(want.shape, bool)
                for b in kv_buffers(group):
                    if b.layer_id != layer:
                        continue
                    assert b.pool_index == pool and b.dtype == kv.DataType.FLOAT32
                    part = role_parts(b, read_buffer(tensors, group, b, block, np.float32), role)
                    if part is None:
                        continue
                    # A buffer holds a run of tokens and heads; find where it sits in the block.
                    first = np.argwhere(want == part.flat[0])
                    assert len(first) == 1, "each value is distinct, so one place matches"
                    t0, h0, _ = first[0]
                    sl = (slice(t0, t0 + part.shape[0]), slice(h0, h0 + part.shape[1]))
                    assert not seen[sl].any(), "two buffers name the same element"
                    got[sl] = part
                    seen[sl] = True
                assert seen.all(), f"layer {layer} {role.name}: elements no buffer names"
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", KV_LAYOUTS)
def test_fewest_buffers_per_layout(layout):
    tensors = [engine_tensor(layout, 0)]
    buffers = kv_pool_group(tensors, layout=layout, num_heads=HEADS, head_dim=DIM, block_size=TOKENS).lifecycles[0].buffers
    want = {"2NHC": 2, "2HNC": 2 * HEADS, "H2NC": 2 * HEADS, "HN2C": HEADS}[layout]
    assert len(buffers) == want
    if layout == "HN2C":  # one K-and-V buffer per head: its tokens' K row, then V row
        assert {(b.role, b.tokens_per_page, b.num_heads, b.head_dim) for b in buffers} == {
            (kv.BufferRole.KEY_VALUE, TOKENS, 2, DIM)}
    if layout == "2NHC":
        assert (buffers[0].tokens_per_page, buffers[0].num_heads, buffers[0].head_dim) == (TOKENS, HEADS, DIM)


def test_vllm_byte_views_with_padding_keep_the_padding_lossless():
    """vLLM hands (num_blocks, page_bytes) int8 views whose block stride may exceed the KV bytes."""
    kv_bytes = 2 * HEADS * TOKENS * DIM * 2
    backing = torch.zeros((BLOCKS, kv_bytes + 64), dtype=torch.int8)
    group = kv_pool_group([backing], layout="H2NC", num_heads=HEADS, head_dim=DIM, block_size=TOKENS,
                          dtype="bfloat16")
    assert group.pools[0].slot_bytes == kv_bytes + 64
    buffers = group.lifecycles[0].buffers
    assert [b.dtype for b in kv_buffers(group)] == [kv.DataType.BFLOAT16] * (2 * HEADS)
    other = [b for b in buffers if b.role == kv.BufferRole.OTHER]
    assert [(o.byte_offset, o.bytes, o.dtype) for o in other] == [(kv_bytes, 64, kv.DataType.UINT8)]
    # A view shorter than its stride (vLLM's padded page) has the same block distance.
    view = backing[:, :kv_bytes]
    assert kv_pool_group([view], layout="H2NC", num_heads=HEADS, head_dim=DIM, block_size=TOKENS,
                         dtype=torch.bfloat16).pools[0].slot_bytes == kv_bytes + 64


def test_numpy_arrays_work_too():
    arr = np.zeros((BLOCKS, 2, TOKENS, HEADS, DIM), np.float16)
    group = kv_pool_group([arr], layout="2NHC", num_heads=HEADS, head_dim=DIM, block_size=TOKENS)
    assert group.pools[0].base == arr.ctypes.data and group.pools[0].slot_bytes == arr[0].nbytes
    assert kv_buffers(group)[0].dtype == kv.DataType.FLOAT16


@pytest.mark.parametrize("name, want", [("bfloat16", kv.DataType.BFLOAT16), ("fp8_e4m3", kv.DataType.FLOAT8_E4M3),
                                        ("fp8", kv.DataType.FLOAT8_E4M3), ("half", kv.DataType.FLOAT16),
                                        (torch.float8_e5m2, kv.DataType.FLOAT8_E5M2), (np.dtype(np.float32), kv.DataType.FLOAT32)])
def test_kv_data_type_names(name, want):
    assert kv_data_type(name) == want


@pytest.mark.parametrize("kwargs, message", [
    ({"layout": "NHD"}, "KV layout 'NHD' is not one of H2NC, HN2C, 2NHC, 2HNC"),
    ({"num_heads": 0}, "num_heads is 0; it must be an integer >= 1"),
    ({"block_size": 2.0}, "block_size is 2.0; it must be an integer >= 1"),
    ({"num_blocks": BLOCKS + 1}, f"num_blocks is {BLOCKS + 1}; layer tensor 0 (layer 0) holds {BLOCKS} blocks"),
    ({"layer_ids": [0, 1]}, "1 tensors but 2 layer ids"),
    ({"dtype": "complex64"}, "KV dtype 'complex64' has no kvcodec DataType"),
    ({"head_dim": 2 * DIM}, f"one block is {2 * HEADS * TOKENS * DIM * 4} bytes apart from the next, but {HEADS} heads x "
                            f"{TOKENS} tokens x {2 * DIM} elements of K and V of FLOAT32 take {4 * HEADS * TOKENS * DIM * 4} bytes"),
])
def test_errors_name_the_argument_and_what_is_valid(kwargs, message):
    args = {"layout": "2NHC", "num_heads": HEADS, "head_dim": DIM, "block_size": TOKENS, **kwargs}
    with pytest.raises(ValueError) as err:
        kv_pool_group([engine_tensor("2NHC", 0)], **args)
    assert message in str(err.value)


def test_no_tensors_is_an_error():
    with pytest.raises(ValueError, match="at least one layer tensor"):
        kv_pool_group([], layout="2NHC", num_heads=1, head_dim=1, block_size=1)


def _fill_kv_like(tensors, layout, rng):
    for t in tensors:
        for b in range(BLOCKS):
            for role in (kv.BufferRole.KEY, kv.BufferRole.VALUE):
                values = torch.from_numpy(kv_like(rng, 1, TOKENS, HEADS, DIM, role)[0])
                engine_kv(layout, t, role, b).copy_(values.to(t.dtype))


def _rebased(group: kv.PoolGroupDesc, tensors) -> kv.PoolGroupDesc:
    """The same descriptors over copies of the tensors (other base addresses)."""
    pools = [kv.PoolDesc(t.data_ptr(), p.slot_bytes, p.num_slots) for t, p in zip(tensors, group.pools)]
    return kv.PoolGroupDesc(pools=pools, lifecycles=group.lifecycles)


@pytest.mark.parametrize("codec_name", ["concat", "fp8"])
@pytest.mark.parametrize("layout", KV_LAYOUTS)
def test_codecs_encode_and_decode_engine_tensors_in_place(layout, codec_name):
    rng = np.random.default_rng(7)
    tensors = [engine_tensor(layout, l, torch.bfloat16) for l in range(LAYERS)]
    _fill_kv_like(tensors, layout, rng)
    original = [t.clone() for t in tensors]
    group = kv_pool_group(tensors, layout=layout, num_heads=HEADS, head_dim=DIM, block_size=TOKENS)
    codec = kv.create_codec(codec_name, device="cpu")
    codec.configure([group])
    blob = codec.cold_page_bytes(0)
    page = sum(p.slot_bytes for p in group.pools)
    assert blob == page if codec_name == "concat" else blob < page  # fp8 halves bf16 K and V, plus scales
    cold = np.zeros((3, blob), np.uint8)
    blocks = [4, 1, 2]
    codec.encode(0, cold, np.array([[i, b] for i, b in enumerate(blocks)], np.int32))
    for t in tensors:
        t.zero_()
    codec.decode(0, cold, np.array([[b, i] for i, b in enumerate(blocks)], np.int32))
    spec = kv.get_codec_spec(codec_name)
    for t, o in zip(tensors, original):
        for b in range(BLOCKS):
            if b not in blocks:
                assert not t[b].any(), "a block nobody decoded was written"
            elif spec.lossless:
                assert torch.equal(t[b], o[b])
            else:
                assert not torch.equal(t[b], o[b]), "fp8 changes bf16 KV"
    if not spec.lossless:  # the codec's own bound, judged on every K and V buffer it was given
        for b in blocks:
            for buf in kv_buffers(group):
                x = read_buffer(original, _rebased(group, original), buf, b, np.uint16).view(np.uint8).ravel()
                y = read_buffer(tensors, group, buf, b, np.uint16).view(np.uint8).ravel()
                problem = spec.check_error(x, y, buf, codec.params)
                assert problem is None, problem
    codec.close()


def test_vllm_gpu_blocks_quantize_as_one_key_value_buffer_per_head():
    """HN2C (vLLM's FlashAttention blocks): one K-and-V buffer per head, so fp8 keeps a scale per
    head's K and V (about half the bf16 bytes), not one per token's 32-element row."""
    tensors = [engine_tensor("HN2C", l, torch.bfloat16) for l in range(LAYERS)]
    _fill_kv_like(tensors, "HN2C", np.random.default_rng(9))
    group = kv_pool_group(tensors, layout="HN2C", num_heads=HEADS, head_dim=DIM, block_size=TOKENS)
    codec = kv.create_codec("fp8", device="cpu")
    codec.configure([group])
    ratio = codec.cold_page_bytes(0) / sum(p.slot_bytes for p in group.pools)
    codec.close()
    assert 0.5 < ratio < 0.52, ratio
