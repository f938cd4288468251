"""The golden vectors of blob format 1 (tests/vectors/nvfp4-v1, written once by the CPU reference)
agree with the independent numpy model: every stored blob is the model's encoding of its hot page
and every stored decoded page is the model's decoding of its blob. The conformance suite checks
that the codec decodes them (test_conformance.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from nvfp4_reference import decode_page, encode_page

from kvcodec_sdk import BufferDesc, DType, Role

FOLDER = Path(__file__).parent / "vectors" / "nvfp4-v1"


def test_stored_blobs_and_pages_are_the_models():
    manifest = json.loads((FOLDER / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    params = manifest["params"]
    checked = 0
    for group in manifest["groups"]:
        buffers = [BufferDesc(**{**d, "role": Role(d["role"]), "dtype": DType(d["dtype"])})
                   for d in group["buffers"][str(group["encoded_with"])]]
        pools = [np.load(FOLDER / name) for name in group["hot"]]
        decoded = [np.load(FOLDER / name) for name in group["decoded"]]
        pairs = np.load(FOLDER / group["pairs"])
        page = group["page_bytes"]
        cold = np.frombuffer((FOLDER / group["blob"]).read_bytes(), np.uint8).reshape(-1, page)
        for i, (dst, src) in enumerate(pairs):
            blob = encode_page(buffers, lambda b: pools[b.pool_index][src, b.byte_offset:b.byte_offset + b.bytes],
                               params)
            assert cold[dst].tobytes() == blob
            for b, want in zip(buffers, decode_page(buffers, blob, params)):
                got = decoded[b.pool_index][i, b.byte_offset:b.byte_offset + b.bytes]
                assert np.array_equal(got, want)
            checked += 1
    assert checked >= 4
