"""BlockCodecStore, the engine-neutral core of the vLLM worker, on the CPU backend: engine KV
tensors adopted in place, round trips per codec, drops as misses, damaged blobs as failed loads,
clear errors, and `kvcodec bench blocks`."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcodec_sdk import cli, get_codec_spec, list_codecs  # noqa: E402
from kvcodec_sdk.integrations.blocks import BlockCodecStore  # noqa: E402
from kvcodec_sdk.kv_tensors import kv_pool_group  # noqa: E402
from kvcodec_sdk.layout import BufferRole  # noqa: E402

LAYERS, HEADS, TOKENS, DIM, BLOCKS = 3, 2, 16, 32, 8
PAGE = HEADS * TOKENS * 2 * DIM * 2  # bf16 K and V of one block of one layer


def engine_tensors(seed: int = 3):
    """Per layer a (blocks, H, N, 2C) bf16 KV tensor as vLLM's CPU attention holds it, and the
    int8 (blocks, page) views an engine hands over."""
    rng = np.random.default_rng(seed)
    layers = [torch.from_numpy(rng.standard_normal((BLOCKS, HEADS, TOKENS, 2 * DIM)).astype(np.float32))
              .to(torch.bfloat16) for _ in range(LAYERS)]
    views = [t.view(torch.int8).view(BLOCKS, PAGE) for t in layers]
    group = kv_pool_group(views, layout="H2NC", num_heads=HEADS, head_dim=DIM, block_size=TOKENS, dtype="bfloat16")
    return layers, views, group


def make_store(codec="concat", params=None, slots=BLOCKS, **kw):
    layers, views, group = engine_tensors()
    return layers, BlockCodecStore(views, group, codec, params or {}, slots, **kw)


@pytest.mark.parametrize("codec", ["concat", "fp8", "nvcomp-lz4"])
def test_blocks_round_trip_through_host_slots(codec):
    layers, store = make_store(codec)
    original = [t.clone() for t in layers]
    assert store.raw_page_bytes == LAYERS * PAGE
    assert store.cold_page_bytes <= (LAYERS * PAGE * 0.52 if codec == "fp8" else LAYERS * PAGE + 4096)
    job = store.store(7, [1, 5], [3, 0])
    assert (job.job_id, job.load) == (7, False)
    [done] = store.poll()
    assert (done.job_id, done.ok, done.nbytes) == (7, True, 2 * LAYERS * PAGE)
    assert store.valid.tolist() == [True, False, False, True, False, False, False, False]
    store.load(8, [0, 3], [2, 6])
    [done] = store.poll()
    assert done.ok and store.poll() == []
    spec = get_codec_spec(codec)
    for layer, (t, o) in enumerate(zip(layers, original)):
        for got, want in ((t[2], o[5]), (t[6], o[1])):
            if spec.lossless:
                assert torch.equal(got, want)
                continue
            assert not torch.equal(got, want)
            x, y = want.view(torch.uint8).reshape(-1).numpy(), got.view(torch.uint8).reshape(-1).numpy()
            for b in store.pool_group.lifecycles[0].buffers:
                if b.pool_index == layer and b.role != BufferRole.OTHER:
                    assert spec.check_error(x[b.byte_offset:b.byte_offset + b.bytes],
                                            y[b.byte_offset:b.byte_offset + b.bytes], b, store.codec.params) is None
    assert store.counters == {"stored": 2, "loaded": 2, "store_dropped": 0, "load_failed": 0}
    assert torch.equal(layers[0][0], original[0][0]), "blocks not loaded into are untouched"
    store.close()


def test_a_page_that_did_not_fit_is_not_stored_and_its_load_fails():
    layers, store = make_store("nvcomp-lz4", {"slot_ratio": 0.5})  # random bf16 does not halve
    store.store(1, [0, 1], [0, 1])
    [result] = store.poll()
    assert result.ok  # a store never fails: its drops are reported as bad slots
    assert store.counters["store_dropped"] == 2 and store.take_bad_slots() == {0, 1} and store.take_bad_slots() == set()
    before = layers[0][4].clone()
    store.load(2, [0], [4])
    [result] = store.poll()
    assert not result.ok and store.counters["load_failed"] == 1
    assert torch.equal(layers[0][4], before), "a dropped page is never decoded"
    store.close()


def test_a_damaged_blob_is_a_load_error_with_report_load_errors():
    layers, store = make_store("nvcomp-lz4", report_load_errors=True)
    store.store(1, [0, 1], [0, 1])
    store.poll()
    store.host[1, store.cold_page_bytes // 2] ^= 0xFF  # a damaged payload byte
    store.load(2, [0, 1], [4, 5])
    [result] = store.poll()
    assert result.ok and store.take_load_errors() == {5} and store.take_bad_slots() == {1}
    assert store.counters["load_failed"] == 1 and store.counters["loaded"] == 1
    assert not store.valid[1] and store.valid[0]
    store.close()


def test_bad_arguments_name_what_is_valid():
    _, store = make_store(slots=4)
    with pytest.raises(ValueError, match="2 blocks for 1 slots"):
        store.store(1, [0, 1], [0])
    with pytest.raises(IndexError, match=r"slot 4 is out of range; valid: 0 \.\. 3"):
        store.store(1, [0], [4])
    with pytest.raises(IndexError, match=r"block 8 is out of range; valid: 0 \.\. 7"):
        store.load(1, [0], [8])
    assert store.poll() == [], "a refused call submits nothing"
    store.close()
    _, views, group = engine_tensors()
    with pytest.raises(ValueError, match="num_slots is 0"):
        BlockCodecStore(views, group, "concat", {}, 0)
    with pytest.raises(ValueError, match="tensors is empty"):
        BlockCodecStore([], group, "concat", {}, 4)


def test_bench_blocks_checks_every_codec_it_times(tmp_path):
    out = tmp_path / "blocks.json"
    assert cli.main(["bench", "blocks", "--device", "cpu", "--codecs", "concat,fp8", "--layers", "2", "--blocks", "4",
                     "--heads", "2", "--head-dim", "32", "--iters", "1", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "blocks" and report["params"]["layout"] == "H2NC" and report["ok"]
    rows = {(r["codec"], r["direction"]): r for r in report["rows"]}
    assert set(rows) == {(c, d) for c in ("concat", "fp8") for d in ("store", "load")}
    assert rows[("concat", "load")]["verified"] == "byte-exact"
    assert rows[("fp8", "store")]["verified"] == "within the declared bound"
    assert rows[("fp8", "store")]["cold_page_bytes"] < rows[("concat", "store")]["cold_page_bytes"] * 0.55
    assert all(r["gbps"] > 0 and r["bare_gbps"] > 0 for r in rows.values())
    ratio = rows[("fp8", "store")]["gbps"] / rows[("concat", "store")]["gbps"]
    assert report["fp8_vs_concat_store"] == pytest.approx(ratio)
    assert set(report["verdicts"]) >= {"fp8 store x concat store", "concat load x bare"}


def test_a_load_right_after_its_store_sees_the_page():
    """No poll between them: the load settles the store first; both results come in order."""
    layers, store = make_store("nvcomp-lz4")
    original = layers[1][0].clone()
    store.store(1, [0], [2])
    store.load(2, [2], [7])
    assert [(r.job_id, r.ok) for r in store.poll()] == [(1, True), (2, True)]
    assert torch.equal(layers[1][7], original) and store.take_bad_slots() == set()
    store.close()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("codec", ["concat", "fp8", "nvcomp-lz4"])
def test_blocks_on_cuda_in_vllm_gpu_layout(codec):
    """vLLM's GPU blocks (HN2C): store and load return before the codec ran, on the store's own
    stream after the caller's; the round trip is exact (lossless) or within the bound."""
    if codec not in [s.name for s in list_codecs()]:
        pytest.skip(f"codec {codec!r} is not installed")  # a GPU host with only some plugins built
    rng = np.random.default_rng(11)
    kv = [torch.from_numpy(rng.standard_normal((BLOCKS, HEADS, TOKENS, 2 * DIM)).astype(np.float32))
          .to(torch.bfloat16).cuda() for _ in range(LAYERS)]
    views = [t.view(torch.int8).view(BLOCKS, PAGE) for t in kv]
    group = kv_pool_group(views, layout="HN2C", num_heads=HEADS, head_dim=DIM, block_size=TOKENS, dtype="bfloat16")
    store = BlockCodecStore(views, group, codec, {}, BLOCKS)
    assert store.host.is_pinned()
    for t in kv:  # written on the caller's stream right before the store: the store must see it
        t[3].mul_(2)
    want = [t[3].clone() for t in kv]
    store.store(1, [3], [0])
    store.load(2, [0], [6])  # settles the store first
    store.wait({2})
    assert [(r.job_id, r.ok) for r in store.poll()] == [(1, True), (2, True)]
    spec = get_codec_spec(codec)
    for t, w in zip(kv, want):
        if spec.lossless:
            assert torch.equal(t[6], w)
        else:
            torch.testing.assert_close(t[6].float(), w.float(), rtol=0.07, atol=0.05)
    store.close()
