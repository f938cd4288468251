"""The nvCOMP codecs declare their cold-page envelope, so the KV-cache manager checks every blob
before decoding it: a page that did not fit its slot is dropped as a miss, never decoded."""

from __future__ import annotations

import numpy as np
import pytest
from nvcomp_blobs import plugin_ext

import kvcodec_sdk as kv
from kvcodec_sdk.kvcm_config import BufferConfig, KVCacheConfig, LayerGroupConfig

plugin_ext()


def test_specs_declare_the_envelope():
    for name in ("nvcomp-lz4", "nvcomp-gdeflate", "nvcomp-ans"):
        assert kv.get_codec_spec(name).envelope, name


def test_manager_drops_pages_that_did_not_fit_and_restores_the_others():
    cfg = KVCacheConfig(
        layer_groups=[LayerGroupConfig([BufferConfig(0, kv.Role.KEY, 4096), BufferConfig(0, kv.Role.VALUE, 4096)])],
        gpu_quota=1 << 16, host_quota=1 << 16, device="cpu")
    m = kv.KVCacheManager(cfg, cold_page_codec=("nvcomp-lz4", {"slot_ratio": 0.5, "chunk_bytes": 1024}))
    rng = np.random.default_rng(7)
    pages = m.allocate(0, 4)
    written = {}
    for i, page in enumerate(pages):
        for view in m.page_view(page, framework="numpy"):
            if i % 2:  # incompressible: cannot fit half a page
                view[:] = rng.integers(1, 256, size=view.shape, dtype=np.uint8)
            else:  # a repeating KV-like pattern: compresses well below half
                view[:] = np.tile(rng.integers(1, 256, size=64, dtype=np.uint8), view.size // 64)
        written[page.id] = np.concatenate([v.copy() for v in m.page_view(page, framework="numpy")])
    m.evict(pages)
    result = m.onboard(pages)
    assert sorted(result.dropped.ids.tolist()) == sorted([pages[1].id, pages[3].id])
    assert result.moved == 2
    for page in (pages[0], pages[2]):
        got = np.concatenate([v.copy() for v in m.page_view(page, framework="numpy")])
        assert np.array_equal(got, written[page.id])
    assert not pages[1].is_live and not pages[3].is_live


# -- damaged host blobs through the manager, on both backends ------------------------------------

def _cuda_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return kv._native.driver_info()["device_count"] > 0 and torch.cuda.is_available()


CHECKED_CASES = [
    pytest.param("cpu", "nvcomp-lz4", id="cpu-lz4"),
    pytest.param("cpu", "nvcomp-gdeflate", id="cpu-gdeflate"),
    *[pytest.param("cuda:0", name, id=f"cuda-{name.removeprefix('nvcomp-')}", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device and torch with CUDA")])
      for name in ("nvcomp-lz4", "nvcomp-gdeflate", "nvcomp-ans")],
]
#: Where each damaged page gets its flipped bit (offsets in its blob) and the reasons it may be dropped
#: for (a chunk-table entry is checked against the chunk plan, then covered by the checksum).
DAMAGE = {1: ("magic", 0, {"bad_magic"}), 3: ("header: payloadBytes", 12, {"bad_header"}),
          5: ("chunk table", 49, {"bad_header", "bad_checksum"}), 6: ("payload", None, {"bad_checksum"})}


def _kv_like(rng, nbytes):
    """bf16 values of per-channel scaled normals (compressible once bit-shuffled), as bytes."""
    vals = rng.standard_normal(nbytes // 2).astype(np.float32) * np.float32(0.02)
    return (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def _write(view, data):
    if isinstance(view, np.ndarray):
        view[:] = data
    else:  # a torch CUDA tensor
        import torch
        view.copy_(torch.from_numpy(data))
        torch.cuda.synchronize()


def _read(view):
    return view.copy() if isinstance(view, np.ndarray) else view.cpu().numpy()


@pytest.mark.parametrize("device,name", CHECKED_CASES)
def test_damaged_host_blobs_are_dropped_and_counted_by_reason(device, name):
    """Single flipped bits in the magic, the envelope header, the chunk table and the payload of
    host blobs: onboarding through the manager drops exactly those pages, counts each reason,
    frees their slots, and brings every other page back byte for byte."""
    cfg = KVCacheConfig(
        layer_groups=[LayerGroupConfig([BufferConfig(layer, role, 8192, dtype=kv.DType.BFLOAT16)
                                        for layer in range(2) for role in (kv.Role.KEY, kv.Role.VALUE)])],
        gpu_quota=1 << 20, host_quota=1 << 20, device=device)
    params = {"chunk_bytes": 4096, "data_type": "uint16", "bitshuffle": True}
    m = kv.KVCacheManager(cfg, cold_page_codec=(name, params))
    rng = np.random.default_rng(11)
    fw = "numpy" if device == "cpu" else "torch"
    pages = m.allocate(0, 8)
    written = {}
    for page in pages:
        for view in m.page_view(page, framework=fw):
            _write(view, _kv_like(rng, int(view.shape[0])))
        written[page.id] = np.concatenate([_read(v) for v in m.page_view(page, framework=fw)])
    assert m.evict(pages).moved == 8
    m.synchronize()
    for i, (what, offset, _) in DAMAGE.items():
        blob = m.page_view(pages[i], framework="numpy")[0]
        header_bytes = int(blob[8:12].view(np.uint32)[0])
        payload_bytes = int(blob[12:16].view(np.uint32)[0])
        assert header_bytes >= 52 and payload_bytes > 16, (what, header_bytes, payload_bytes)
        at = header_bytes + payload_bytes // 2 if offset is None else offset
        blob[at] ^= np.uint8(1 << (i % 8))
    hot_free = m.slot_counts(kv.CacheLevel.HOT)[0][1]
    result = m.onboard(pages)
    m.synchronize()
    dropped = {pages[i].id for i in DAMAGE}
    assert set(result.dropped.ids.tolist()) == dropped and result.moved == 8 - len(DAMAGE)
    stats = m.stats(kv.CacheLevel.HOST)[0]
    counted = {k: v for k, v in stats.dropped_by_reason.items() if v}
    assert sum(counted.values()) == len(DAMAGE) and set(counted) <= set().union(*(r for _, _, r in DAMAGE.values()))
    for reasons in ({"bad_magic"}, {"bad_header"}, {"bad_checksum"}):
        least = sum(1 for _, _, r in DAMAGE.values() if r == reasons)
        assert counted.get(next(iter(reasons)), 0) >= least, counted
    assert stats.pages_dropped == len(DAMAGE)
    assert m.slot_counts(kv.CacheLevel.HOT)[0][1] == hot_free - (8 - len(DAMAGE))
    assert m.slot_counts(kv.CacheLevel.HOST)[0][1] == m.slot_counts(kv.CacheLevel.HOST)[0][0]
    for page in pages:
        if page.id in dropped:
            assert not page.is_live
        else:
            assert np.array_equal(np.concatenate([_read(v) for v in m.page_view(page, framework=fw)]), written[page.id])
