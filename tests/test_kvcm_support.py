"""Helpers shared by the KV-cache manager tests (imported by the other tests/test_kvcm*.py; no tests here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcodec_sdk import BufferDesc, CacheLevel, KVCacheConfig, KVCacheManager, LayerGroupConfig, Role, _native
from kvcodec_sdk.codec import Codec
from kvcodec_sdk.gpu import DeviceArray
from kvcodec_sdk.manager import PageHandle
from kvcodec_sdk.spec import CodecSpec

T = _native.kvcm_testing


@dataclass(frozen=True)
class EnvelopeSpec(CodecSpec):
    """A CodecSpec that declares (or not) the cold-page envelope."""

    envelope: bool = False


def make_test_codec(abi_version: int | None = None, **params) -> Codec:
    """The knob-driven CPU test codec (see csrc/src/kvcm/testing/test_codec.h); ``abi_version=1``
    creates it through a factory that declares plugin ABI 1."""
    abi = _native.ABI_VERSION if abi_version is None else abi_version
    spec = EnvelopeSpec(
        name="kvcm-test", description="manager test codec", version="0", format_version=1, lossless=True,
        factory=lambda: T.test_codec_factory(abi), devices=("cpu",), envelope=bool(params.get("envelope", False)),
    )
    native = _native.NativeCodec(T.test_codec_factory(abi), json.dumps(params), -1)
    return Codec(native, spec, params, "cpu")


def group(layers, sizes, role_cycle=(Role.KEY, Role.VALUE)) -> LayerGroupConfig:
    """A layer group with, per layer, one buffer per entry of ``sizes`` (roles cycling K, V)."""
    return LayerGroupConfig([BufferDesc(l, role_cycle[i % len(role_cycle)], bytes=s) for l in layers for i, s in enumerate(sizes)])


def config(groups, gpu_quota=1 << 16, host_quota=1 << 17, **kw) -> KVCacheConfig:
    return KVCacheConfig(layer_groups=list(groups), gpu_quota=gpu_quota, host_quota=host_quota, device=kw.pop("device", "cpu"), **kw)


def xor_key(representative: int) -> int:
    """The test codec's per-class XOR key."""
    return ((representative + 1) * 0x3B + 0x11) & 0xFF


def to_numpy(view) -> np.ndarray:
    """A copy of a numpy, torch (CPU or CUDA) or kvcodec_sdk.gpu.DeviceArray view as a numpy array."""
    if isinstance(view, np.ndarray):
        return view.copy()
    if isinstance(view, DeviceArray):
        return view.numpy()
    return view.detach().cpu().numpy().copy()


def hot_bytes(m: KVCacheManager, page) -> np.ndarray:
    """A hot page's bytes: its slot in every pool, in pool order."""
    return np.concatenate([to_numpy(v) for v in m.page_view(page)])


def write_random(m: KVCacheManager, pages, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Fills hot pages with random non-zero bytes; returns page id -> bytes."""
    out = {}
    for p in pages:
        for v in m.page_view(p):
            data = rng.integers(1, 256, size=tuple(v.shape), dtype=np.uint8)
            if isinstance(v, np.ndarray):
                v[:] = data
            elif isinstance(v, DeviceArray):
                v.copy_from(data)
            else:
                import torch

                v.copy_(torch.from_numpy(data))
        out[p.id] = hot_bytes(m, p)
    return out


def expected_blob(m: KVCacheManager, lifecycle: int, content: np.ndarray, codec: str) -> np.ndarray:
    """The cold blob a page with ``content`` encodes to, computed independently of the codec."""
    cold = m.cold_page_bytes(lifecycle)
    if codec == "concat":
        return content
    key = xor_key(m.batching_representative(lifecycle))
    return np.concatenate([content ^ np.uint8(key), np.full(cold - content.size, 0xA5, np.uint8)])


def check_all(m: KVCacheManager, model: dict, lifecycles: dict, codec: str) -> None:
    """Every live page holds its model bytes, byte-exact, at its current level."""
    m.synchronize()
    for pid, content in model.items():
        page = PageHandle(m, pid)
        if page.level == CacheLevel.HOT:
            assert np.array_equal(hot_bytes(m, page), content), f"hot page {pid:#x} differs"
        else:
            blob = np.asarray(m.page_view(page)[0])
            assert np.array_equal(blob, expected_blob(m, lifecycles[pid], content, codec)), f"host page {pid:#x} differs"


def damage_first_blob(disk_dir) -> None:
    """Flips a payload byte of the first slot of pool group 0's first container (a closed disk tier)."""
    container = Path(disk_dir) / "group0" / "containers" / "0000.bin"
    data = bytearray(container.read_bytes())
    data[100] ^= 0xFF
    container.write_bytes(bytes(data))
