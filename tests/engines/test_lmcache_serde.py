"""kvcodec codecs as LMCache serdes, run through the real LMCache package (its serde registry,
``AsyncSerdeProcessor`` and host memory allocator), never a re-implementation of its interface.

Lossless codecs must give back every byte; fp8 must stay inside its declared bound (the spec's
``check_error``, element by element); damaged, foreign and did-not-fit blobs must fail the task,
which LMCache turns into a miss. The data is KV-like (``kvcodec_sdk.testing.kv_like``: smooth
per-channel structure with outliers), never zeros. Runs in its own environment (the ``engines``
CI step); the SDK's default test run leaves this folder out.
"""

from __future__ import annotations

import select
import time

import numpy as np
import pytest
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
from lmcache.v1.distributed.l1_manager import L1Manager
from lmcache.v1.distributed.l2_adapters.mock_l2_adapter import MockL2Adapter, MockL2AdapterConfig
from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
from lmcache.v1.distributed.serde import AsyncSerdeProcessor, SerdeConfig, create_serde_processor
from lmcache.v1.distributed.serde.factory import get_registered_serde_types
from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
from lmcache.v1.memory_management import MemoryFormat

import kvcodec_sdk
from kvcodec_sdk.integrations import lmcache as kl
from kvcodec_sdk.testing import kv_like

pytestmark = pytest.mark.engines

LAYERS, TOKENS, HEADS, HEAD_DIM = 3, 32, 4, 32
SHAPE = torch.Size([2, LAYERS, TOKENS, HEADS * HEAD_DIM])
CPU_CODECS = sorted(s.name for s in kvcodec_sdk.list_codecs() if "cpu" in s.devices)
LOSSLESS = [n for n in CPU_CODECS if kvcodec_sdk.get_codec_spec(n).lossless]
LOSSY = [n for n in CPU_CODECS if not kvcodec_sdk.get_codec_spec(n).lossless]


@pytest.fixture(scope="module")
def serdes() -> list[str]:
    return kl.register_all()


@pytest.fixture
def alloc():
    return HostMemoryAllocator(64 << 20)


def kv_object(alloc, rng, shape=SHAPE, dtype=torch.bfloat16, heads=HEADS):
    """A KV-shaped LMCache memory object ([2, L, T, D]) filled with KV-like values."""
    obj = alloc.allocate(shape, dtype, MemoryFormat.KV_2LTD)
    assert obj is not None
    _, layers, tokens, hidden = shape
    planes = [kv_like(rng, 1, tokens, heads, hidden // heads, role).reshape(1, tokens, hidden)
              for role in (kvcodec_sdk.Role.KEY, kvcodec_sdk.Role.VALUE) for _ in range(layers)]
    obj.tensor.copy_(torch.from_numpy(np.concatenate(planes).reshape(shape)).to(dtype))
    return obj


def host_bytes(obj) -> np.ndarray:
    return np.frombuffer(obj.byte_array, dtype=np.uint8).copy()


def wait(fd: int, query, task: int, timeout: float = 60.0) -> bool:
    """Waits on LMCache's event fd until the task reports; True/False as LMCache reports it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(task)
        if result is not None:
            return result
        poller.poll(50)
    raise TimeoutError(f"serde task {task} did not complete in {timeout} s")


def store(serde: AsyncSerdeProcessor, alloc, objs) -> tuple[bool, list]:
    """serialize() through LMCache into temp byte buffers sized by estimate_serialized_size."""
    size = serde.estimate_serialized_size(MemoryLayoutDesc(shapes=objs[0].get_shapes(), dtypes=objs[0].get_dtypes()))
    temps = [alloc.allocate(torch.Size([size]), torch.uint8, MemoryFormat.BINARY_BUFFER) for _ in objs]
    task = serde.submit_serialize(objs, temps, [None] * len(objs))
    return wait(serde.get_serialize_event_fd(), serde.query_serialize_result, task), temps


def load(serde: AsyncSerdeProcessor, alloc, temps, like) -> tuple[bool, list]:
    outs = [alloc.allocate(o.get_shapes(), o.get_dtypes(), MemoryFormat.KV_2LTD) for o in like]
    for o in outs:
        o.raw_tensor[: o.get_size()].fill_(0xA5)  # bytes no round trip of the tests' data gives back
    task = serde.submit_deserialize(temps, outs, [None] * len(temps))
    return wait(serde.get_deserialize_event_fd(), serde.query_deserialize_result, task), outs


def free(*groups) -> None:
    for group in groups:
        for obj in group:
            obj.ref_count_down()


def serde_of(name: str, **kwargs) -> AsyncSerdeProcessor:
    return create_serde_processor(SerdeConfig(type=name, kwargs=kwargs))


# -- registration -------------------------------------------------------------------------------


def test_register_all_adds_every_cpu_codec_once(serdes):
    assert serdes == [f"kvcodec-{n}" for n in CPU_CODECS]
    assert "kvcodec-concat" in serdes and "kvcodec-fp8" in serdes
    assert set(serdes) <= set(get_registered_serde_types())
    assert kl.register_all() == serdes  # again: a no-op, not LMCache's "already registered" error
    with pytest.raises(ValueError, match="already registered for codec 'concat'"):
        kl.register("kvcodec-concat", codec="fp8")


def test_names_and_options_are_checked(serdes):
    with pytest.raises(ValueError, match="does not start with 'kvcodec-'"):
        kl.register("fp8")
    with pytest.raises(kvcodec_sdk.UnknownCodecError, match="known codecs"):
        kl.register("kvcodec-no-such-codec")
    with pytest.raises(ValueError, match="no option 'heads'; valid options: 'codec_params'"):
        serde_of("kvcodec-concat", heads=4)
    with pytest.raises(ValueError, match="'max_workers' is 0; it must be an integer >= 1"):
        serde_of("kvcodec-concat", max_workers=0)
    with pytest.raises(kvcodec_sdk.CodecParamError, match="'format'"):
        serde_of("kvcodec-fp8", codec_params={"format": "e3m4"})
    serde = serde_of("kvcodec-concat", num_heads=5)
    try:
        with pytest.raises(ValueError, match="num_heads is 5, but the hidden size 128"):
            serde.estimate_serialized_size(MemoryLayoutDesc(shapes=[SHAPE], dtypes=[torch.bfloat16]))
    finally:
        serde.close()


def test_layout_becomes_k_and_v_buffers_of_every_layer():
    buffers, nbytes = kl.buffers_of_layout(([SHAPE, torch.Size([2, 4])], [torch.float16, torch.int64]), HEADS)
    plane = TOKENS * HEADS * HEAD_DIM * 2
    assert nbytes == 2 * LAYERS * plane + 8 * 8
    kv = buffers[: 2 * LAYERS]
    assert [(b.role, b.layer_id, b.byte_offset) for b in kv] == (
        [(kvcodec_sdk.Role.KEY, i, i * plane) for i in range(LAYERS)]
        + [(kvcodec_sdk.Role.VALUE, i, (LAYERS + i) * plane) for i in range(LAYERS)])
    assert {(b.dtype, b.tokens_per_page, b.num_heads, b.head_dim, b.bytes) for b in kv} == {
        (kvcodec_sdk.DType.FLOAT16, TOKENS, HEADS, HEAD_DIM, plane)}
    (extra,) = buffers[2 * LAYERS :]
    assert (extra.role, extra.byte_offset, extra.bytes, extra.tokens_per_page) == (
        kvcodec_sdk.Role.OTHER, 2 * LAYERS * plane, 64, 0)


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", LOSSLESS)
def test_lossless_codecs_round_trip_byte_exact(serdes, alloc, codec):
    rng = np.random.default_rng(11)
    params = {"data_type": "uint16", "bitshuffle": True} if codec.startswith("nvcomp-") else {}
    serde = serde_of(f"kvcodec-{codec}", num_heads=HEADS, max_workers=2, codec_params=params)
    try:
        objs = [kv_object(alloc, rng) for _ in range(3)]
        ok, temps = store(serde, alloc, objs)
        assert ok
        ok, outs = load(serde, alloc, temps, objs)
        assert ok
        for src, out in zip(objs, outs):
            np.testing.assert_array_equal(host_bytes(out), host_bytes(src))
        if kvcodec_sdk.get_codec_spec(codec).envelope:  # compressed: LMCache keeps fewer bytes
            raw = objs[0].get_size()
            assert all(kl.FRAME_BYTES < t.get_size() < raw for t in temps), [t.get_size() for t in temps]
        free(objs, temps, outs)
    finally:
        serde.close()


def test_concurrent_tasks_on_several_workers_round_trip(serdes, alloc):
    """Tasks submitted together run on LMCache's worker threads at once, each in its own staging slot."""
    rng = np.random.default_rng(18)
    serde = serde_of("kvcodec-concat", num_heads=HEADS, max_workers=3)
    try:
        objs = [kv_object(alloc, rng) for _ in range(6)]
        size = serde.estimate_serialized_size(MemoryLayoutDesc(shapes=[SHAPE], dtypes=[torch.bfloat16]))
        temps = [alloc.allocate(torch.Size([size]), torch.uint8, MemoryFormat.BINARY_BUFFER) for _ in objs]
        tasks = [serde.submit_serialize([o], [t], [None]) for o, t in zip(objs, temps)]
        assert all(wait(serde.get_serialize_event_fd(), serde.query_serialize_result, t) for t in tasks)
        outs = [alloc.allocate(SHAPE, torch.bfloat16, MemoryFormat.KV_2LTD) for _ in objs]
        tasks = [serde.submit_deserialize([t], [o], [None]) for t, o in zip(temps, outs)]
        assert all(wait(serde.get_deserialize_event_fd(), serde.query_deserialize_result, t) for t in tasks)
        for src, out in zip(objs, outs):
            np.testing.assert_array_equal(host_bytes(out), host_bytes(src))
        free(objs, temps, outs)
    finally:
        serde.close()


@pytest.mark.parametrize("codec", LOSSY)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lossy_codecs_stay_inside_their_declared_bound(serdes, alloc, codec, dtype):
    spec = kvcodec_sdk.get_codec_spec(codec)
    assert spec.check_error is not None, f"{codec} declares no machine-checkable bound"
    rng = np.random.default_rng(12)
    serde = serde_of(f"kvcodec-{codec}", num_heads=HEADS)
    try:
        objs = [kv_object(alloc, rng, dtype=dtype) for _ in range(2)]
        ok, temps = store(serde, alloc, objs)
        assert ok
        ok, outs = load(serde, alloc, temps, objs)
        assert ok
        buffers, _ = kl.buffers_of_layout((objs[0].get_shapes(), objs[0].get_dtypes()), HEADS)
        params = spec.validate_params({})
        changed = 0
        for src, out in zip(objs, outs):
            a, b = host_bytes(src), host_bytes(out)
            for buf in buffers:
                orig, dec = a[buf.byte_offset : buf.byte_offset + buf.bytes], b[buf.byte_offset : buf.byte_offset + buf.bytes]
                assert spec.check_error(orig, dec, buf, params) is None, spec.check_error(orig, dec, buf, params)
                changed += int(not np.array_equal(orig, dec))
        assert changed, "the lossy codec returned every buffer unchanged: it did not quantize"
        if codec == "fp8":
            assert temps[0].get_size() < 0.6 * objs[0].get_size()  # one byte per element plus scales
        free(objs, temps, outs)
    finally:
        serde.close()


def test_layouts_of_several_groups_and_partial_chunks_round_trip(serdes, alloc):
    """Two layouts through one serde (a full and a shorter last chunk), one of them with two groups."""
    rng = np.random.default_rng(13)
    serde = serde_of("kvcodec-concat", num_heads=HEADS, max_layouts=1)
    try:
        full = kv_object(alloc, rng)
        part = kv_object(alloc, rng, shape=torch.Size([2, LAYERS, 7, HEADS * HEAD_DIM]))
        multi = alloc.allocate([SHAPE, torch.Size([LAYERS, 5, 16])], [torch.bfloat16, torch.float32],
                               MemoryFormat.KV_2LTD)
        multi.raw_tensor[: multi.get_size()].copy_(torch.from_numpy(rng.integers(1, 256, multi.get_size(), np.uint8)))
        for obj in (full, part, multi, full):
            ok, temps = store(serde, alloc, [obj])
            assert ok
            ok, outs = load(serde, alloc, temps, [obj])
            assert ok
            np.testing.assert_array_equal(host_bytes(outs[0]), host_bytes(obj))
            free(temps, outs)
        free([full, part, multi])
    finally:
        serde.close()


# -- drops: LMCache reports the task failed, never wrong KV ---------------------------------------


def stored(serde, alloc, rng, **kw):
    objs = [kv_object(alloc, rng, **kw)]
    ok, temps = store(serde, alloc, objs)
    assert ok
    return objs, temps


@pytest.mark.parametrize("where", ["frame magic", "frame identity", "blob start", "blob end"])
@pytest.mark.parametrize("codec", ["concat", "fp8", "nvcomp-lz4"])
def test_a_damaged_object_fails_the_load(serdes, alloc, codec, where):
    if codec not in CPU_CODECS:
        pytest.skip(f"{codec} is not installed with a CPU implementation")
    rng = np.random.default_rng(14)
    serde = serde_of(f"kvcodec-{codec}", num_heads=HEADS)
    try:
        objs, temps = stored(serde, alloc, rng)
        ok, outs = load(serde, alloc, temps, objs)  # intact: loads
        assert ok
        size = temps[0].get_size()
        at = {"frame magic": 0, "frame identity": 9, "blob start": kl.FRAME_BYTES + 3, "blob end": size - 1}[where]
        temps[0].raw_tensor[at] ^= 0x10
        ok, outs2 = load(serde, alloc, temps, objs)
        assert ok is False
        free(objs, temps, outs, outs2)
    finally:
        serde.close()


def test_a_blob_of_another_codec_or_layout_fails_the_load(serdes, alloc):
    rng = np.random.default_rng(15)
    fp8, concat = serde_of("kvcodec-fp8", num_heads=HEADS), serde_of("kvcodec-concat", num_heads=HEADS)
    other_heads = serde_of("kvcodec-fp8", num_heads=2)
    try:
        objs, temps = stored(fp8, alloc, rng)
        # The concat serde's buffers are as large as a concat blob; the fp8 frame fits inside.
        big = [alloc.allocate(torch.Size([concat.estimate_serialized_size(
            MemoryLayoutDesc(shapes=objs[0].get_shapes(), dtypes=objs[0].get_dtypes()))]), torch.uint8,
            MemoryFormat.BINARY_BUFFER)]
        big[0].raw_tensor[: temps[0].get_size()].copy_(temps[0].raw_tensor[: temps[0].get_size()])
        ok, outs = load(concat, alloc, big, objs)
        assert ok is False
        ok, outs2 = load(other_heads, alloc, temps, objs)  # same codec, other scale blocks
        assert ok is False
        ok, outs3 = load(fp8, alloc, temps, objs)
        assert ok
        free(objs, temps, big, outs, outs2, outs3)
    finally:
        for s in (fp8, concat, other_heads):
            s.close()


def test_a_page_that_does_not_fit_is_not_stored(serdes, alloc):
    if "nvcomp-lz4" not in CPU_CODECS:
        pytest.skip("nvcomp-lz4 is not installed with a CPU implementation")
    rng = np.random.default_rng(16)
    serde = serde_of("kvcodec-nvcomp-lz4", codec_params={"slot_ratio": 0.5})
    try:
        obj = alloc.allocate(SHAPE, torch.bfloat16, MemoryFormat.KV_2LTD)
        obj.raw_tensor[: obj.get_size()].copy_(torch.from_numpy(rng.integers(0, 256, obj.get_size(), np.uint8)))
        ok, temps = store(serde, alloc, [obj])  # random bytes do not compress to half
        assert ok is False
        fits = kv_object(alloc, rng)
        fits.tensor.fill_(0.5)  # constant values compress far below half
        ok, temps2 = store(serde, alloc, [fits])
        assert ok
        ok, outs = load(serde, alloc, temps2, [fits])
        assert ok
        np.testing.assert_array_equal(host_bytes(outs[0]), host_bytes(fits))
        free([obj, fits], temps, temps2, outs)
    finally:
        serde.close()


def until(poll, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = poll()
        if result is not None:
            return result
        time.sleep(0.005)
    raise TimeoutError(f"no result in {timeout} s")


@pytest.mark.parametrize("codec", ["concat", "fp8"])
def test_through_lmcaches_storage_path_a_damaged_object_is_a_miss(serdes, alloc, codec):
    """LMCache's own L2 path: SerdeL2AdapterWrapper over its mock L2 adapter, temp buffers from a
    real L1Manager. Stored chunks load back (found in the load bitmap); after one stored object is
    damaged, a load that includes it reports every key of the task missing, and the intact chunk
    alone still loads."""
    rng = np.random.default_rng(17)
    l1 = L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(size_in_bytes=32 << 20, use_lazy=False,
                                                                       shm_name="")))
    inner = MockL2Adapter(MockL2AdapterConfig(max_size_gb=0.05, mock_bandwidth_gb=100.0))
    wrapper = SerdeL2AdapterWrapper(inner, serde_of(f"kvcodec-{codec}", num_heads=HEADS), l1)
    try:
        keys = [ObjectKey(chunk_hash=bytes([i + 1]) * 16, model_name="tiny", kv_rank=0) for i in range(2)]
        srcs = [kv_object(alloc, rng) for _ in keys]
        task = wrapper.submit_store_task(keys, srcs)
        assert until(lambda: wrapper.pop_completed_store_tasks().get(task)).is_successful()
        layout = {0: MemoryLayoutDesc(shapes=srcs[0].get_shapes(), dtypes=srcs[0].get_dtypes())}
        found = until(lambda t=wrapper.submit_lookup_and_lock_task(keys, layout): wrapper.query_lookup_and_lock_result(t))
        assert [found.test(i) for i in range(2)] == [True, True]

        def load(which):
            dsts = [alloc.allocate(SHAPE, torch.bfloat16, MemoryFormat.KV_2LTD) for _ in which]
            for d in dsts:
                d.raw_tensor[: d.get_size()].fill_(0xA5)
            t = wrapper.submit_load_task([keys[i] for i in which], dsts)
            bitmap = until(lambda: wrapper.query_load_result(t))
            return [bitmap.test(i) for i in range(len(which))], dsts

        hits, dsts = load([0, 1])
        assert hits == [True, True]
        for src, dst in zip(srcs, dsts):
            if codec == "concat":
                np.testing.assert_array_equal(host_bytes(dst), host_bytes(src))
            else:
                assert not np.array_equal(host_bytes(dst), host_bytes(src))
                np.testing.assert_allclose(dst.tensor.float().numpy(), src.tensor.float().numpy(), rtol=0.07,
                                           atol=0.07 * float(src.tensor.float().abs().max()))
        # Damage the second stored object where the L2 adapter keeps it (the mock's own dict).
        inner._memory_objects[keys[1]].raw_tensor[kl.FRAME_BYTES + 100] ^= 0x01
        hits, dsts2 = load([0, 1])
        assert hits == [False, False]
        hits, dsts3 = load([0])
        assert hits == [True]
        free(srcs, dsts, dsts2, dsts3)
    finally:
        wrapper.close()
