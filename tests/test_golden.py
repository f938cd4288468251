"""Golden vectors pinning the concat blob format (format version 1).

``tests/vectors/concat-v1/`` holds hot pools, index pairs and the cold blobs they must encode to,
computed with numpy from the format's definition (a blob is the page's slot in every pool of its hot
pool group, concatenated in pool order). Any change to the bytes the codec writes or reads fails
here. The vectors are written once, when they are missing and ``KVCODEC_WRITE_VECTORS=1`` is set;
without that variable, missing vectors are a failure, never a skip. A new blob format gets a new
directory (``concat-v2``); existing vectors are never rewritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import kvcodec_sdk
from kvcodec_sdk import LifeCycleDesc, PoolDesc, PoolGroupDesc, _native

FORMAT_VERSION = 1
VECTORS = Path(__file__).parent / "vectors" / f"concat-v{FORMAT_VERSION}"
MANIFEST = VECTORS / "manifest.json"
WRITE_ENV = "KVCODEC_WRITE_VECTORS"

# The generated layout: two hot pool groups of three pools with odd slot sizes (pools of group 0
# differ in slot count, so its usable slots are the minimum, 6), shuffled lifecycle IDs, and
# non-contiguous hot sources mapped to permuted cold slots.
_GROUPS = [
    {"slot_bytes": [1, 7, 100], "num_slots": [6, 7, 6], "lifecycles": [3, 1], "dst": [2, 0, 3, 1], "src": [5, 1, 3, 0]},
    {"slot_bytes": [4097, 33, 5], "num_slots": [5, 5, 5], "lifecycles": [0, 4, 2], "dst": [1, 2, 0], "src": [4, 0, 2]},
]


def _write_vectors() -> None:
    rng = np.random.Generator(np.random.PCG64(0x6B76_6331))
    VECTORS.mkdir(parents=True, exist_ok=False)
    manifest = {
        "codec": "concat",
        "format_version": FORMAT_VERSION,
        "description": "blob = concatenation, in pool order, of the page's slot in every pool of its hot pool group",
        "groups": [],
    }
    for g, spec in enumerate(_GROUPS):
        hot_files = []
        pools = []
        for p, (size, count) in enumerate(zip(spec["slot_bytes"], spec["num_slots"])):
            pool = rng.integers(1, 256, size=(count, size), dtype=np.uint8)
            name = f"group{g}_pool{p}.npy"
            np.save(VECTORS / name, pool, allow_pickle=False)
            hot_files.append(name)
            pools.append(pool)
        pairs = np.stack([spec["dst"], spec["src"]], axis=1).astype(np.int32)
        np.save(VECTORS / f"group{g}_pairs.npy", pairs, allow_pickle=False)
        num_cold = max(spec["dst"]) + 1
        page_bytes = sum(spec["slot_bytes"])
        cold = np.zeros((num_cold, page_bytes), np.uint8)
        for dst, src in zip(spec["dst"], spec["src"]):
            cold[dst] = np.concatenate([pool[src] for pool in pools])
        (VECTORS / f"group{g}_cold.bin").write_bytes(cold.tobytes())
        manifest["groups"].append(
            {
                "slot_bytes": spec["slot_bytes"],
                "num_slots": spec["num_slots"],
                "lifecycles": spec["lifecycles"],
                "hot": hot_files,
                "pairs": f"group{g}_pairs.npy",
                "blob": f"group{g}_cold.bin",
                "num_cold_slots": num_cold,
                "page_bytes": page_bytes,
            }
        )
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")


def load_manifest() -> dict:
    """The manifest; writes the vectors first when they are missing and writing is enabled.

    Called from each test body (not a fixture) so missing vectors are reported as test failures.
    """
    if not MANIFEST.is_file():
        if os.environ.get(WRITE_ENV) == "1":
            _write_vectors()
        else:
            pytest.fail(
                f"golden vectors missing: {MANIFEST} does not exist. They are committed with the repository; "
                f"to create them for a new format version run: {WRITE_ENV}=1 python -m pytest tests/test_golden.py"
            )
    return json.loads(MANIFEST.read_text())


def _load(manifest: dict):
    """(hot pools per group, pairs per group, blob bytes per group) from the vector files."""
    hot = [[np.ascontiguousarray(np.load(VECTORS / f, allow_pickle=False)) for f in g["hot"]] for g in manifest["groups"]]
    pairs = [np.ascontiguousarray(np.load(VECTORS / g["pairs"], allow_pickle=False)) for g in manifest["groups"]]
    blobs = [(VECTORS / g["blob"]).read_bytes() for g in manifest["groups"]]
    return hot, pairs, blobs


def _layout(manifest: dict, hot) -> list[PoolGroupDesc]:
    return [
        PoolGroupDesc(
            [PoolDesc(pool.ctypes.data, pool.shape[1], pool.shape[0]) for pool in pools],
            [LifeCycleDesc(i) for i in g["lifecycles"]],
        )
        for g, pools in zip(manifest["groups"], hot)
    ]


def test_vectors_describe_the_registered_codec():
    manifest = load_manifest()
    spec = kvcodec_sdk.get_codec_spec("concat")
    assert manifest["codec"] == "concat"
    assert manifest["format_version"] == FORMAT_VERSION == spec.format_version
    assert _native.factory_info(spec.factory())["format_version"] == FORMAT_VERSION
    total = sum(f.stat().st_size for f in VECTORS.iterdir())
    assert total < 200_000, f"golden vectors are {total} bytes; keep them small"


def test_vectors_are_self_consistent():
    manifest = load_manifest()
    hot, pairs, blobs = _load(manifest)
    for g, group in enumerate(manifest["groups"]):
        assert [p.shape[1] for p in hot[g]] == group["slot_bytes"]
        assert [p.shape[0] for p in hot[g]] == group["num_slots"]
        assert pairs[g].dtype == np.int32 and pairs[g].shape[1] == 2
        page = group["page_bytes"]
        assert page == sum(group["slot_bytes"])
        assert len(blobs[g]) == group["num_cold_slots"] * page
        cold = np.frombuffer(blobs[g], np.uint8).reshape(-1, page)
        for dst, src in pairs[g]:
            np.testing.assert_array_equal(cold[dst], np.concatenate([p[src] for p in hot[g]]))


def test_encode_reproduces_the_stored_blobs():
    manifest = load_manifest()
    hot, pairs, blobs = _load(manifest)
    with kvcodec_sdk.create_codec("concat", device="cpu") as codec:
        codec.configure(_layout(manifest, hot))
        for g, group in enumerate(manifest["groups"]):
            assert codec.cold_page_bytes(group["lifecycles"][0]) == group["page_bytes"]
            for lifecycle in group["lifecycles"]:  # every lifecycle of a group encodes identically
                cold = np.zeros(group["num_cold_slots"] * group["page_bytes"], np.uint8)
                codec.encode(lifecycle, cold, pairs[g])
                assert cold.tobytes() == blobs[g], f"group {g} lifecycle {lifecycle}: blob format changed"


def test_decode_reproduces_the_stored_hot_slots():
    manifest = load_manifest()
    stored, pairs, blobs = _load(manifest)
    fresh = [[np.full_like(p, 0xEE) for p in pools] for pools in stored]
    with kvcodec_sdk.create_codec("concat", device="cpu") as codec:
        codec.configure(_layout(manifest, fresh))
        for g, group in enumerate(manifest["groups"]):
            cold = np.frombuffer(blobs[g], np.uint8).copy()
            decode_pairs = np.ascontiguousarray(pairs[g][:, ::-1])  # (dst hot, src cold)
            codec.decode(group["lifecycles"][-1], cold, decode_pairs)
            written = set(int(s) for s in pairs[g][:, 1])
            for p, (got, want) in enumerate(zip(fresh[g], stored[g])):
                for slot in range(got.shape[0]):
                    if slot in written:
                        np.testing.assert_array_equal(got[slot], want[slot], err_msg=f"group {g} pool {p} slot {slot}")
                    else:
                        assert (got[slot] == 0xEE).all(), f"group {g} pool {p} slot {slot} was written"
