"""The nvCOMP codecs declare their cold-page envelope, so the KV-cache manager checks every blob
before decoding it: a page that did not fit its slot is dropped as a miss, never decoded."""

from __future__ import annotations

import numpy as np

import kvcodec_sdk as kv
from kvcodec_sdk.kvcm_config import BufferConfig, KVCacheConfig, LayerGroupConfig

from nvcomp_blobs import plugin_ext

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
