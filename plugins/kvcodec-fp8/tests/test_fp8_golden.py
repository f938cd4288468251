"""Model-level golden vectors pinning the fp8 blob format (format version 1).

``tests/model-vectors/fp8-v1/`` holds one hot page layout (bf16/fp16/fp32 K/V buffers with outliers,
all-equal and denormal-range heads, the largest finite values, NaN and +-Inf, beside lossless
buffers), the blobs it encodes to under three parameter sets, and the hot bytes those blobs
decode to. The blobs were computed by the independent numpy model (fp8_reference.py), never by
the codec. They are written once, when missing and ``KVCODEC_WRITE_VECTORS=1`` is set; without
it, missing vectors fail. A new format gets a new directory; existing vectors are never rewritten.

They complement the conformance suite's golden vectors (``tests/vectors/``, test_conformance.py),
which the codec wrote: these pin three parameter sets and special values against the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import fp8_reference as ref
import numpy as np
import pytest
from fp8_helpers import build_layout, pairs
from kvcodec_fp8 import FORMAT_VERSION as PLUGIN_FORMAT_VERSION
from kvcodec_fp8 import _testing

import kvcodec_sdk as kv
from kvcodec_sdk import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role

FORMAT_VERSION = 1
VECTORS = Path(__file__).parent / "model-vectors" / f"fp8-v{FORMAT_VERSION}"
MANIFEST = VECTORS / "manifest.json"
PARAMS = [
    {"format": "e4m3", "granularity": "page_head", "lossless_roles": "", "lossless_layers": ""},
    {"format": "e5m2", "granularity": "token_head", "lossless_roles": "", "lossless_layers": "3"},
    {"format": "e4m3", "granularity": "page", "lossless_roles": "value", "lossless_layers": ""},
]
SPECS = [
    [(0, Role.KEY, DType.BFLOAT16, (8, 4, 16)), (0, Role.VALUE, DType.BFLOAT16, (8, 4, 16)),
     (1, Role.KEY, DType.FLOAT8_E4M3, (8, 4, 16)), (1, Role.OTHER, DType.UINT8, 37)],
    [(2, Role.KEY, DType.FLOAT16, (4, 4, 8)), (3, Role.VALUE, DType.FLOAT32, (4, 4, 8)),
     (4, Role.VALUE, DType.BFLOAT16, (3, 4, 5))],
]


def _write() -> None:
    rng = np.random.Generator(np.random.PCG64(0x6B76_6638))
    layout = build_layout(rng, SPECS, num_slots=1, special=True)
    VECTORS.mkdir(parents=True, exist_ok=False)
    manifest = {"codec": "fp8", "format_version": FORMAT_VERSION, "pools": [], "buffers": [], "cases": []}
    for p, pool in enumerate(layout.pools):
        np.save(VECTORS / f"pool{p}.npy", pool, allow_pickle=False)
        manifest["pools"].append(f"pool{p}.npy")
    manifest["buffers"] = [[b.layer_id, int(b.role), b.pool_index, b.byte_offset, b.bytes, int(b.dtype),
                            b.tokens_per_page, b.num_heads, b.head_dim] for b in layout.buffers]
    for i, params in enumerate(PARAMS):
        blob = ref.encode_page(layout.buffers, lambda b: layout.hot(b, 0), params)
        (VECTORS / f"case{i}_blob.bin").write_bytes(blob)
        decoded = ref.decode_values(layout.buffers, blob, params)
        hot = [pool.copy() for pool in layout.pools]
        for j, raw in decoded.items():
            b = layout.buffers[j]
            hot[b.pool_index][0, b.byte_offset:b.byte_offset + b.bytes] = raw
        for p, h in enumerate(hot):
            np.save(VECTORS / f"case{i}_decoded_pool{p}.npy", h, allow_pickle=False)
        manifest["cases"].append({"params": params, "blob": f"case{i}_blob.bin",
                                  "decoded": [f"case{i}_decoded_pool{p}.npy" for p in range(len(hot))]})
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


def load():
    if not MANIFEST.is_file():
        if os.environ.get("KVCODEC_WRITE_VECTORS") == "1":
            _write()
        else:
            pytest.fail(f"golden vectors missing: {MANIFEST}; they are committed with the plugin")
    manifest = json.loads(MANIFEST.read_text())
    pools = [np.ascontiguousarray(np.load(VECTORS / f, allow_pickle=False)) for f in manifest["pools"]]
    buffers = tuple(BufferDesc(l, Role(r), p, o, n, DType(d), t, h, hd)
                    for l, r, p, o, n, d, t, h, hd in manifest["buffers"])
    return manifest, pools, buffers


def _group(pools, buffers):
    return [PoolGroupDesc([PoolDesc(p.ctypes.data, p.shape[1], p.shape[0]) for p in pools],
                          [LifeCycleDesc(0, buffers)])]


def test_vectors_describe_format_1():
    manifest, _, _ = load()
    assert manifest["codec"] == "fp8"
    assert manifest["format_version"] == FORMAT_VERSION == _testing.FORMAT_VERSION == PLUGIN_FORMAT_VERSION
    assert kv.get_codec_spec("fp8").format_version == FORMAT_VERSION
    assert sum(f.stat().st_size for f in VECTORS.iterdir()) < 100_000


@pytest.mark.parametrize("case", range(len(PARAMS)))
def test_encode_reproduces_the_stored_blob(case):
    manifest, pools, buffers = load()
    c = manifest["cases"][case]
    want = (VECTORS / c["blob"]).read_bytes()
    with kv.create_codec("fp8", c["params"]) as codec:
        codec.configure(_group(pools, buffers))
        assert codec.cold_page_bytes(0) == len(want)
        cold = np.zeros((1, len(want)), np.uint8)
        codec.encode(0, cold, pairs([0], [0]))
    assert cold.tobytes() == want, "fp8 blob format changed"


@pytest.mark.parametrize("case", range(len(PARAMS)))
def test_decode_reproduces_the_stored_hot_bytes(case):
    manifest, pools, buffers = load()
    c = manifest["cases"][case]
    blob = np.frombuffer((VECTORS / c["blob"]).read_bytes(), np.uint8).copy()
    hot = [p.copy() for p in pools]
    with kv.create_codec("fp8", c["params"]) as codec:
        codec.configure(_group(hot, buffers))
        codec.decode(0, blob.reshape(1, -1), pairs([0], [0]))
    for p, f in enumerate(c["decoded"]):
        assert np.array_equal(hot[p], np.load(VECTORS / f, allow_pickle=False)), f"pool {p}"
