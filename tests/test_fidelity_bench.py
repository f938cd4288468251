"""`kvcodec bench fidelity` on the CPU backend at small sizes: concat (lossless) leaves attention
exactly as it was, fp8 changes it a little, `--codec all` compares every format and granularity the
lossy codecs' schemas offer, the attention and top-k arithmetic is right on hand-made cases, a
captured .npz is read as documented, and bad options are one-line usage errors (exit status 2)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from kvcodec_sdk import cli, list_codecs
from kvcodec_sdk.bench import compare, fidelity
from kvcodec_sdk.registry import get_codec_spec

SMALL = ["--device", "cpu", "--layers", "2", "--pages", "4", "--tokens", "16", "--heads", "2", "--head-dim", "64",
         "--queries", "8", "--quiet"]
ROW_FIELDS = {"codec", "params", "lossless", "cold_page_bytes", "hot_page_bytes", "cold_hot_ratio", "cosine_mean",
              "cosine_min", "rel_l2_mean", "rel_l2_max", "topk_mean", "topk_min", "key_rel_rms", "value_rel_rms",
              "outputs", "checked", "per_layer"}
REPORT_FIELDS = {"benchmark", "command", "options", "machine", "device", "data", "source", "dtype", "layers", "tokens",
                 "page_tokens", "pages", "kv_heads", "query_heads", "head_dim", "queries", "scale", "topk", "seed",
                 "rows", "skipped", "failed", "info"}


def _registered(name: str) -> None:
    if name not in [s.name for s in list_codecs()]:
        pytest.skip(f"codec {name!r} is not installed")


def _bench(tmp_path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "fidelity.json"
    rc = cli.main(["bench", "fidelity", *SMALL, "--json", str(out), *args])
    return rc, (json.loads(out.read_text()) if out.exists() else {}), str(out)


def test_concat_leaves_attention_exactly_as_it_was(tmp_path, capsys):
    rc, data, _ = _bench(tmp_path, "--codec", "concat", "--topk", "1,8")
    assert rc == 0
    assert set(data) == REPORT_FIELDS
    assert data["benchmark"] == "fidelity" and data["command"] == "fidelity" and data["device"] == "cpu"
    assert (data["layers"], data["tokens"], data["pages"], data["kv_heads"], data["head_dim"]) == (2, 64, 4, 2, 64)
    assert data["topk"] == [1, 8] and data["scale"] == pytest.approx(1 / 8)
    [row] = data["rows"]
    assert set(row) == ROW_FIELDS
    assert row["codec"] == "concat" and row["lossless"] and row["checked"] == "lossless: byte-exact"
    assert row["cosine_mean"] == 1.0 and row["cosine_min"] == 1.0
    assert row["rel_l2_mean"] == 0.0 and row["rel_l2_max"] == 0.0
    assert row["topk_mean"] == {"1": 1.0, "8": 1.0} and row["topk_min"] == {"1": 1.0, "8": 1.0}
    assert row["key_rel_rms"] == 0.0 and row["value_rel_rms"] == 0.0
    assert row["outputs"] == 2 * 8 * 2  # layers x queries x heads
    assert row["cold_hot_ratio"] == pytest.approx(row["cold_page_bytes"] / row["hot_page_bytes"])
    assert row["hot_page_bytes"] == 2 * 2 * 16 * 2 * 64 * 2  # layers x (K, V) x tokens x heads x dim x bf16
    assert [layer["layer"] for layer in row["per_layer"]] == [0, 1]
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("attention fidelity on cpu: kv-like")
    assert lines[1].split() == ["codec", "cold/hot", "cos", "mean", "cos", "min", "err", "mean", "err", "max", "top-1",
                                "top-8", "top-k", "min", "K", "rms", "err", "V", "rms", "err"]
    assert lines[2].split()[:6] == ["concat", "1.0000", "1", "1", "0", "0"]


def test_fp8_changes_attention_a_little(tmp_path):
    _registered("fp8")
    rc, data, _ = _bench(tmp_path, "--codec", "fp8")
    assert rc == 0
    concat, fp8 = data["rows"]
    assert concat["codec"] == "concat" and concat["cosine_min"] == 1.0  # the lossless reference row comes first
    assert fp8["codec"] == "fp8" and not fp8["lossless"] and "within the declared bound" in fp8["checked"]
    assert 0.99 < fp8["cosine_mean"] < 1.0 and fp8["cosine_min"] < 1.0
    assert fp8["cosine_min"] <= fp8["cosine_mean"]
    assert 0 < fp8["rel_l2_mean"] <= fp8["rel_l2_max"] and fp8["rel_l2_mean"] < 0.1
    assert 0.5 < fp8["topk_mean"]["8"] <= 1.0 and fp8["topk_min"]["8"] <= fp8["topk_mean"]["8"]
    assert 0 < fp8["key_rel_rms"] < 0.05 and 0 < fp8["value_rel_rms"] < 0.05  # e4m3: 3 mantissa bits
    assert 0.5 <= fp8["cold_hot_ratio"] < 0.6  # 1-byte codes of bf16 plus the scales


def test_all_compares_every_format_and_granularity_of_the_lossy_codecs(tmp_path, capsys):
    rc, data, _ = _bench(tmp_path, "--layers", "1", "--pages", "2")
    assert rc == 0
    want = [("concat", {})]
    for spec in list_codecs():
        if not spec.lossless:
            swept = [p for p in spec.params if p.name in ("format", "granularity") and p.choices]
            want += [(spec.name, dict(zip([p.name for p in swept], c))) for c in
                     itertools.product(*(p.choices for p in swept))]
    assert [(r["codec"], r["params"]) for r in data["rows"]] == want
    names = {spec.name for spec in list_codecs()}
    if "fp8" in names:
        fp8 = [tuple(sorted(r["params"].items())) for r in data["rows"] if r["codec"] == "fp8"]
        assert len(fp8) == 6 and {dict(p)["format"] for p in fp8} == {"e4m3", "e5m2"}
        assert {dict(p)["granularity"] for p in fp8} == {"page_head", "token_head", "page"}
    if "nvfp4" in names:
        assert [r["params"] for r in data["rows"] if r["codec"] == "nvfp4"] == [{"granularity": "page_head"},
                                                                                {"granularity": "page"}]
        nvfp4 = next(r for r in data["rows"] if r["codec"] == "nvfp4")
        assert nvfp4["cold_hot_ratio"] < 0.3 and nvfp4["cosine_mean"] < 1.0
    assert all(not r["lossless"] for r in data["rows"][1:])
    assert data["failed"] == []
    out = capsys.readouterr().out
    assert "checked concat: lossless: byte-exact" in out


def test_the_baseline_compares_the_figures_of_two_runs(tmp_path):
    _registered("fp8")
    _, old, path = _bench(tmp_path, "--codec", "fp8")
    figures = compare.figures(old)
    assert {"fp8 cosine_mean", "fp8 cosine_min", "fp8 rel_l2_mean", "fp8 rel_l2_max", "fp8 top8"} <= set(figures)
    assert figures["fp8 cosine_mean"].better == compare.HIGHER and figures["fp8 rel_l2_mean"].better == compare.LOWER
    result = compare.compare(old, old)
    assert {c.verdict for c in result.changes} == {"same"}


# -- the arithmetic on hand-made cases --------------------------------------------------------------


def _naive_attention(q, k, v, scale, positions):
    queries, qh, _ = q.shape
    group = qh // k.shape[1]
    out = np.zeros(q.shape)
    for i in range(queries):
        last = k.shape[0] - 1 if positions is None else positions[i]
        for h in range(qh):
            logits = [float(np.dot(q[i, h], k[j, h // group])) * scale for j in range(last + 1)]
            w = np.exp(np.array(logits) - max(logits))
            w /= w.sum()
            out[i, h] = sum(w[j] * v[j, h // group] for j in range(last + 1))
    return out


@pytest.mark.parametrize("positions", [None, np.array([0, 3, 9])])
def test_attention_is_softmax_of_scaled_logits_times_v_with_grouped_heads(positions):
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 4, 8)), rng.normal(size=(10, 2, 8)), rng.normal(size=(10, 2, 8))
    w, o = fidelity.attention(q, k, v, 0.3, positions)
    np.testing.assert_allclose(o, _naive_attention(q, k, v, 0.3, positions), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=2), 1.0)
    if positions is not None:
        assert np.all(w[0, :, 1:] == 0) and np.all(w[1, :, 4:] == 0)


def test_top_k_agreement_counts_the_original_top_keys_kept():
    # One head, 6 keys along one axis: the query's weights rank keys 5, 4, 3, 2, 1, 0.
    k = np.arange(6, dtype=np.float64).reshape(6, 1, 1)
    v = np.ones((6, 1, 1))
    q = np.ones((1, 1, 1))
    k2 = k.copy()
    k2[5] = -1.0  # the top key drops to the bottom: the top 2 become keys 4, 3
    r = fidelity.compare_layer(q, k, v, k2, v, 1.0, None, [1, 2, 3, 6])
    assert r["agree"][1][0] == 0.0  # key 5 is not the new top 1
    assert r["agree"][2][0] == 0.5  # {5, 4} against {4, 3}
    assert r["agree"][3][0] == pytest.approx(2 / 3)  # {5, 4, 3} against {4, 3, 2}
    assert r["agree"][6][0] == 1.0  # every key
    assert r["cos"][0] == 1.0 and r["rel"][0] == 0.0  # V is all ones: the output does not change
    # k larger than the keys a query attends is clipped to them.
    r = fidelity.compare_layer(q, k, v, k, v, 1.0, np.array([2]), [8])
    assert r["agree"][8][0] == 1.0


def test_output_cosine_and_relative_error():
    q = np.zeros((1, 1, 2))  # uniform weights over the two keys
    k = np.zeros((2, 1, 2))
    v = np.array([[[1.0, 0.0]], [[1.0, 0.0]]])
    v2 = np.array([[[1.0, 0.0]], [[1.0, 2.0]]])  # output (1, 0) -> (1, 1)
    r = fidelity.compare_layer(q, k, v, k, v2, 1.0, None, [1])
    assert r["cos"][0] == pytest.approx(1 / np.sqrt(2)) and r["rel"][0] == pytest.approx(1.0)


# -- captured data ----------------------------------------------------------------------------------


def _capture(path, layers=2, tokens=40, kv_heads=2, q_heads=4, dim=32, queries=5, **extra):
    rng = np.random.default_rng(3)
    arrays = {}
    for layer in range(layers):
        arrays[f"k_{layer}"] = rng.normal(size=(tokens, kv_heads, dim)).astype(np.float32)
        arrays[f"v_{layer}"] = rng.normal(size=(tokens, kv_heads, dim)).astype(np.float16)
        arrays[f"q_{layer}"] = rng.normal(size=(queries, q_heads, dim)).astype(np.float32)
    arrays.update(extra)
    np.savez(path, **arrays)
    return str(path)


def test_a_captured_file_is_read_as_documented(tmp_path, capsys):
    path = _capture(tmp_path / "kv.npz", positions=np.array([3, 10, 20, 30, 39]), scale=np.float64(0.2),
                    model=np.array("tiny-test"))
    kv = fidelity.load_captured(path)
    assert (kv.layers, kv.tokens, kv.kv_heads, kv.query_heads, kv.head_dim, kv.num_queries) == (2, 40, 2, 4, 32, 5)
    assert kv.scale == 0.2 and kv.positions.tolist() == [3, 10, 20, 30, 39] and "tiny-test" in kv.source
    raw = np.load(path)["k_0"]
    assert np.max(np.abs(kv.keys[0] - raw)) <= np.max(np.abs(raw)) * 2**-8  # rounded to bf16, nothing more
    assert fidelity.load_captured(path, layers=1, queries=2).positions.tolist() == [3, 10]
    rc = cli.main(["bench", "fidelity", "--device", "cpu", "--quiet", "--codec", "concat", "--data", "captured",
                   "--kv", path, "--tokens", "16"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "captured from tiny-test" in out and "4 query / 2 KV heads x 32" in out
    assert out.splitlines()[2].split()[:6] == ["concat", "1.0000", "1", "1", "0", "0"]


def test_captured_data_through_fp8_with_a_partial_last_page(tmp_path):
    _registered("fp8")
    path = _capture(tmp_path / "kv.npz", tokens=37)  # 3 pages of 16, the last one padded
    out = tmp_path / "r.json"
    rc = cli.main(["bench", "fidelity", "--device", "cpu", "--quiet", "--codec", "fp8", "--data", "captured",
                   "--kv", path, "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["data"] == "captured" and data["tokens"] == 37 and data["pages"] == 3
    fp8 = data["rows"][1]
    assert 0.99 < fp8["cosine_mean"] < 1.0 and fp8["outputs"] == 2 * 5 * 4


# -- usage errors -------------------------------------------------------------------------------------


def _bad_captures(tmp_path) -> dict:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "empty.npz", other=np.zeros(3))
    np.savez(tmp_path / "shape.npz", k_0=np.zeros((4, 2, 8)), v_0=np.zeros((4, 2, 9)), q_0=np.zeros((1, 2, 8)))
    np.savez(tmp_path / "heads.npz", k_0=np.zeros((4, 2, 8)), v_0=np.zeros((4, 2, 8)), q_0=np.zeros((1, 3, 8)))
    np.savez(tmp_path / "noq.npz", k_0=np.zeros((4, 2, 8)), v_0=np.zeros((4, 2, 8)))
    np.savez(tmp_path / "pos.npz", k_0=rng.normal(size=(4, 2, 8)), v_0=np.zeros((4, 2, 8)), q_0=np.zeros((1, 2, 8)),
             positions=np.array([4]))
    np.savez(tmp_path / "nan.npz", k_0=np.full((4, 2, 8), np.nan), v_0=np.zeros((4, 2, 8)), q_0=np.zeros((1, 2, 8)))
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "text.npz").write_text("not a zip")
    return {name: str(tmp_path / name) for name in ("empty.npz", "shape.npz", "heads.npz", "noq.npz", "pos.npz",
                                                     "nan.npz", "one.npy", "text.npz")}


USAGE = [
    (["--params", "{}"], "--params applies to one codec"),
    (["--codec", "fp8", "--params", "{bad"], "--params is not valid JSON"),
    (["--codec", "fp8", "--params", "[1]"], "--params must be a JSON object"),
    (["--codec", "no-such-codec"], "unknown codec 'no-such-codec'"),
    (["--codec", "concat", "--params", '{"path": "warp"}'], "parameter 'path' is 'warp'"),
    (["--data", "captured"], "--data captured reads K/V from a file: give --kv FILE.npz"),
    (["--kv", "{shape.npz}"], "--kv is read with --data captured"),
    (["--data", "captured", "--kv", "/no/such/file.npz"], "argument --kv: '/no/such/file.npz' does not exist"),
    (["--data", "captured", "--kv", "{shape.npz}", "--heads", "4"], "--heads shapes the kv-like data"),
    (["--data", "captured", "--kv", "{empty.npz}"], "has no k_0 array"),
    (["--data", "captured", "--kv", "{shape.npz}"], "differ in shape"),
    (["--data", "captured", "--kv", "{heads.npz}"], "the query heads a multiple of the KV heads"),
    (["--data", "captured", "--kv", "{noq.npz}"], "layer 0 has no q_0 array"),
    (["--data", "captured", "--kv", "{pos.npz}"], "positions must be key indices 0..3"),
    (["--data", "captured", "--kv", "{nan.npz}"], "k_0 has NaN or infinite values"),
    (["--data", "captured", "--kv", "{one.npy}"], "is one array (.npy), not an .npz file"),
    (["--data", "captured", "--kv", "{text.npz}"], "is not a readable .npz file"),
    (["--data", "web"], "argument --data: invalid choice: 'web'"),
    (["--topk", "0"], "argument --topk: '0': '0' is not a k"),
    (["--topk", "8,x"], "'x' is not a k"),
    (["--logit-std", "-1"], "argument --logit-std: -1.0 must be a positive finite number"),
    (["--tokens", "0"], "argument --tokens: 0 is out of range"),
    (["--dtype", "float32"], "argument --dtype: invalid choice: 'float32'"),
    (["--device", "gpu"], "argument --device: 'gpu' is not a device"),
    (["--iters", "3"], "kvcodec bench fidelity: error: unrecognized arguments: --iters 3"),
]


@pytest.mark.parametrize("argv,message", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_bad_options_are_one_line_usage_errors(argv, message, tmp_path, capsys):
    files = _bad_captures(tmp_path)
    argv = [files.get(a[1:-1], a) if a.startswith("{") and a.endswith("}") else a for a in argv]
    try:
        rc = cli.main(["bench", "fidelity", "--quiet", *argv])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err and err.startswith("kvcodec bench"), err
    assert captured.out == "", "nothing ran"


def test_a_codec_without_a_cpu_implementation_means_nothing_ran(capsys):
    gpu_only = [s.name for s in list_codecs() if "cpu" not in s.devices]
    if not gpu_only:
        pytest.skip("every installed codec has a CPU implementation")
    rc = cli.main(["bench", "fidelity", *SMALL, "--codec", gpu_only[0]])
    assert rc == 1
    assert f"nothing ran: {gpu_only[0]} was skipped (no cpu implementation" in capsys.readouterr().err


def test_configurations_read_the_schema():
    assert fidelity.configurations("concat", None) == [("concat", {})]
    if "fp8" in [s.name for s in list_codecs()]:
        assert fidelity.configurations("fp8", {"format": "e5m2"}) == [("concat", {}), ("fp8", {"format": "e5m2"})]
        schema = {p.name: p.choices for p in get_codec_spec("fp8").params}
        n = len(schema["format"]) * len(schema["granularity"])
        assert sum(1 for name, _ in fidelity.configurations("all", None) if name == "fp8") == n


def test_the_capture_helper_records_what_the_attention_computes(tmp_path):
    """The mechanics of kvcodec_sdk.bench.fidelity_capture on a tiny randomly initialised Llama (no
    real weights: this checks what is recorded, not what a trained model looks like)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kvcodec_sdk.bench import fidelity_capture

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 24))
    arrays = fidelity_capture.capture(model, ids, queries=6)
    assert arrays["k_0"].shape == (24, 2, 16) and arrays["v_1"].shape == (24, 2, 16)
    assert arrays["q_0"].shape == (6, 4, 16) and arrays["positions"].tolist() == list(range(18, 24))
    assert float(arrays["scale"]) == pytest.approx(16 ** -0.5)
    assert fidelity_capture.self_check(arrays) > fidelity_capture.MIN_SELF_CHECK_COSINE
    with torch.no_grad():  # the captured keys and values are the KV cache's
        cache = model(input_ids=ids, use_cache=True).past_key_values
    keys = cache.layers[1].keys if hasattr(cache, "layers") else cache.key_cache[1]  # transformers 5 / 4
    np.testing.assert_allclose(arrays["k_1"], keys[0].transpose(0, 1).numpy(), rtol=1e-5, atol=1e-6)
    path = tmp_path / "kv.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if not k.startswith("o_")})
    kv = fidelity.load_captured(str(path))
    assert (kv.layers, kv.tokens, kv.query_heads, kv.num_queries) == (2, 24, 4, 6)
