"""``kvcodec bench fidelity``: how much a lossy codec changes attention, not just the bytes.

An error bound per element says little about what a model sees: attention mixes V rows with
softmax weights of q·Kᵀ, so an error on an outlier channel of K moves every weight, and an error on
a value that gets no weight costs nothing. This benchmark stores K/V pages through a codec (real
``encode`` / ``decode`` calls, ``create_codec(name, params, device=...)``), then for sampled queries
computes attention outputs ``softmax(q·Kᵀ·scale)·V`` per query head with the original and with the
decoded K/V, and reports per codec and parameters:

* the cosine similarity of the attention outputs (mean and min over every layer, query and head);
* the relative L2 error of the outputs, ``|o' - o| / |o|`` (mean and max);
* top-k agreement of the attention weights: the fraction of the original's k most-weighted keys
  that are among the decoded K's k most-weighted keys (mean and min; k = 8 by default, ``--topk``
  takes a list; k is clipped to the number of keys a query attends; ties go to the earlier key);
* the relative RMS error of the decoded K and V elements, and the codec's cold/hot ratio (bytes of
  a cold page over the bytes of the hot page).

Data (``--data``):

* ``kv-like`` (default): K and V of ``--layers`` layers from the SDK's KV-like generator
  (:func:`kvcodec_sdk.testing.data.kv_like`: per-channel scales over two orders of magnitude,
  outlier channels, smooth token structure), ``--pages`` pages of ``--tokens`` tokens. Each query
  of a head is a key of that head (a random token) plus noise of half the channel's spread over
  tokens, scaled so that its logits over the keys have a standard deviation of ``--logit-std``
  (2 by default: the softmax is neither uniform nor one-hot). Queries attend every key.
* ``captured``: K/V and queries captured from a real model (``--kv FILE.npz``, format in
  :func:`load_captured`; :mod:`kvcodec_sdk.bench.fidelity_capture` writes one from a
  transformers model).

Either way the K/V are rounded to the hot dtype (``--dtype``, bf16 by default) before anything else,
and the rounded values are the original: a lossless codec gives identical outputs (cosine exactly
1, error 0, agreement 1). The layout is one hot pool whose slot (a page) holds the K and the V buffer
of every layer, each ``tokens x KV heads x head dim``; a sequence that does not fill its last page
is padded with zeros, which take no part in attention. Lossy codecs' decoded pages are also checked
against the codec's declared bound (its spec's ``check_error``) on the first pages; a lossless
codec's must equal the original byte for byte. The attention arithmetic is float64 numpy on the
host whatever the device; on ``cuda`` only the codec calls run on the GPU (pools and blobs in
device memory through cuda-python, :mod:`kvcodec_sdk.gpu`).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import zipfile
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from .. import gpu
from ..layout import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role
from ..registry import create_codec, default_registry, get_codec_spec
from ._common import Column, Table
from ._common import advance as _advance
from ._common import fmt_size as _fmt
from ._common import log as _log
from ._common import steps as _steps

DATA_SOURCES = ("kv-like", "captured")
DTYPES = ("bfloat16", "float16")
DEFAULT_TOPK = (8,)
DEFAULTS = {"layers": 4, "pages": 32, "tokens": 16, "heads": 8, "head_dim": 128, "queries": 64}
#: Parameters whose every choice ``--codec all`` compares (each lossy codec's format and scale granularity).
SWEPT_PARAMS = ("format", "granularity")
#: Pages per buffer whose decoded values are judged by a lossy codec's declared bound.
CHECKED_PAGES = 4
QUERY_NOISE = 0.5  # kv-like queries: a key plus this much of each channel's spread over tokens


class CaptureFormatError(ValueError):
    """A ``--kv`` file that is not a capture in the documented format (a usage error)."""


@dataclass
class KVData:
    """K, V and queries of every layer, float32: ``keys[l]`` / ``values[l]`` shaped (tokens, KV
    heads, head dim), ``queries[l]`` (queries, query heads, head dim). ``positions[i]`` is the last
    key query i attends (None: every key); ``scale`` multiplies q·k."""

    keys: list
    values: list
    queries: list
    positions: np.ndarray | None
    scale: float
    source: str

    @property
    def layers(self) -> int:
        return len(self.keys)

    @property
    def tokens(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def kv_heads(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.keys[0].shape[2])

    @property
    def query_heads(self) -> int:
        return int(self.queries[0].shape[1])

    @property
    def num_queries(self) -> int:
        return int(self.queries[0].shape[0])


@dataclass
class Row:
    codec: str
    params: dict  # as compared (the rest are the codec's defaults)
    lossless: bool
    cold_page_bytes: int
    hot_page_bytes: int
    cold_hot_ratio: float
    cosine_mean: float
    cosine_min: float
    rel_l2_mean: float
    rel_l2_max: float
    topk_mean: dict  # str(k) -> mean agreement
    topk_min: dict  # str(k) -> worst agreement
    key_rel_rms: float  # RMS of decoded K - K over the RMS of K
    value_rel_rms: float
    outputs: int  # attention outputs compared: layers x queries x query heads
    checked: str  # what the decoded pages were checked against
    per_layer: list = field(default_factory=list)  # {"layer", "cosine_mean", "cosine_min", "rel_l2_mean", ...}


@dataclass
class FidelityReport:
    device: str
    data: str
    source: str
    dtype: str
    layers: int
    tokens: int
    page_tokens: int
    pages: int
    kv_heads: int
    query_heads: int
    head_dim: int
    queries: int
    scale: float
    topk: list
    seed: int
    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # {"codec", "params", "reason"}
    failed: list = field(default_factory=list)  # {"codec", "params", "error"}
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def _data_module():
    try:
        from ..testing import data
    except ImportError as exc:  # the testing package needs pytest
        raise RuntimeError(f"the KV-like data generator (kvcodec_sdk.testing) could not be imported ({exc}); "
                           "install the test extra: pip install 'kvcodec-sdk[test]'") from None
    return data


def _hot_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to the hot dtype, back as float32 (the values the codec sees)."""
    data = _data_module()
    dt = DType[dtype.upper()]
    return data.to_float32(data.from_float32(x, dt), dt).reshape(x.shape)


def kv_like_data(layers: int, pages: int, page_tokens: int, heads: int, head_dim: int, queries: int,
                 dtype: str = "bfloat16", seed: int = 0, logit_std: float = 2.0) -> KVData:
    """KV-like K/V of ``layers`` layers (``pages * page_tokens`` tokens) and ``queries`` queries per
    layer and head, as the module docstring describes."""
    data = _data_module()
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(head_dim)
    keys, values, qs = [], [], []
    for _ in range(layers):
        k = data.kv_like(rng, pages, page_tokens, heads, head_dim, Role.KEY).reshape(-1, heads, head_dim)
        v = data.kv_like(rng, pages, page_tokens, heads, head_dim, Role.VALUE).reshape(-1, heads, head_dim)
        k, v = _hot_round(k, dtype), _hot_round(v, dtype)
        k64 = k.astype(np.float64)
        pick = rng.integers(0, k.shape[0], size=(queries, heads))
        q = k64[pick, np.arange(heads)[None, :]]  # (queries, heads, dim): a key of each head
        q = q + rng.normal(size=q.shape) * QUERY_NOISE * k64.std(axis=0)[None]
        logits = np.einsum("qhd,shd->qhs", q, k64) * scale
        spread = logits.std(axis=2, keepdims=True)
        q = q * np.where(spread > 0, logit_std / np.where(spread > 0, spread, 1.0), 1.0)
        keys.append(k)
        values.append(v)
        qs.append(q.astype(np.float32))
    source = (f"kv-like (seed {seed}; queries: a key plus noise, logits with standard deviation {logit_std:g}, "
              "attending every key)")
    return KVData(keys, values, qs, None, scale, source)


def load_captured(path: str, dtype: str = "bfloat16", layers: int | None = None,
                  queries: int | None = None) -> KVData:
    """K/V and queries from an ``.npz`` file, raising :class:`CaptureFormatError` naming what is wrong.

    The file holds, for each layer ``l`` = 0, 1, ... (consecutive from 0):

    * ``k_<l>`` and ``v_<l>``: shape (tokens, KV heads, head dim), a float dtype; the keys as the
      attention uses them (after any rotary embedding);
    * ``q_<l>``: shape (queries, query heads, head dim), the query heads a multiple of the KV heads
      (grouped-query attention: query head h uses KV head h // (query heads / KV heads));

    and optionally ``positions``, shape (queries,), integers: the last key (token index) each
    query attends, causal attention as at the query's own position (without it: every key), and
    ``scale``, a scalar multiplying q·k (without it: 1/sqrt(head dim)). Every layer has the same
    shapes. ``layers`` / ``queries`` keep the first ones only. The values are rounded to ``dtype``.
    """
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CaptureFormatError(f"--kv {path!r} is not a readable .npz file ({exc})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise CaptureFormatError(f"--kv {path!r} is one array (.npy), not an .npz file of arrays per layer")
    try:
        return _captured(f, path, dtype, layers, queries)
    except (ValueError, zipfile.BadZipFile) as exc:
        if isinstance(exc, CaptureFormatError):
            raise
        raise CaptureFormatError(f"--kv {path!r} cannot be read: {exc}") from None
    finally:
        f.close()


def _captured(f, path: str, dtype: str, layers: int | None, queries: int | None) -> KVData:
    names = set(f.files)
    n = 0
    while f"k_{n}" in names:
        n += 1
    if n == 0:
        raise CaptureFormatError(f"--kv {path!r} has no k_0 array; a capture holds k_<layer>, v_<layer> and "
                                 f"q_<layer> for layers 0, 1, ... (it has: {', '.join(sorted(names)) or 'nothing'})")
    n = n if layers is None else min(n, layers)
    keys, values, qs = [], [], []
    for layer in range(n):
        arrays = []
        for kind in ("k", "v", "q"):
            name = f"{kind}_{layer}"
            if name not in names:
                raise CaptureFormatError(f"--kv {path!r}: layer {layer} has no {name} array")
            a = f[name]
            if a.ndim != 3 or not np.issubdtype(a.dtype, np.floating) or 0 in a.shape:
                raise CaptureFormatError(f"--kv {path!r}: {name} has shape {a.shape} and dtype {a.dtype}; it must "
                                         "be a non-empty float array of 3 dimensions")
            if not np.all(np.isfinite(a)):
                raise CaptureFormatError(f"--kv {path!r}: {name} has NaN or infinite values")
            arrays.append(a.astype(np.float32))
        k, v, q = arrays
        if k.shape != v.shape:
            raise CaptureFormatError(f"--kv {path!r}: k_{layer} {k.shape} and v_{layer} {v.shape} differ in shape")
        if keys and (k.shape != keys[0].shape or q.shape[1:] != qs[0].shape[1:]):
            raise CaptureFormatError(f"--kv {path!r}: layer {layer} has other shapes than layer 0 (k {k.shape} "
                                     f"against {keys[0].shape}, q {q.shape} against {qs[0].shape})")
        if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
            raise CaptureFormatError(f"--kv {path!r}: q_{layer} {q.shape} does not fit k_{layer} {k.shape}: the "
                                     "head dims must be equal and the query heads a multiple of the KV heads")
        k, v = _hot_round(k, dtype), _hot_round(v, dtype)
        if not (np.all(np.isfinite(k)) and np.all(np.isfinite(v))):
            raise CaptureFormatError(f"--kv {path!r}: layer {layer}'s K or V exceeds the range of {dtype} "
                                     "(use --dtype bfloat16)")
        keys.append(k)
        values.append(v)
        qs.append(q)
    if len({q.shape[0] for q in qs}) != 1:
        raise CaptureFormatError(f"--kv {path!r}: the layers have different numbers of queries")
    count = qs[0].shape[0]
    positions = None
    if "positions" in names:
        p = f["positions"]
        if p.shape != (count,) or not np.issubdtype(p.dtype, np.integer):
            raise CaptureFormatError(f"--kv {path!r}: positions has shape {p.shape} and dtype {p.dtype}; it must "
                                     f"be integers of shape ({count},), one per query")
        positions = p.astype(np.int64)
        if positions.min() < 0 or positions.max() >= keys[0].shape[0]:
            raise CaptureFormatError(f"--kv {path!r}: positions must be key indices 0..{keys[0].shape[0] - 1}")
    if queries is not None:
        qs = [q[:queries] for q in qs]
        positions = None if positions is None else positions[:queries]
    scale = 1.0 / math.sqrt(keys[0].shape[2])
    if "scale" in names:
        s = f["scale"]
        if s.size != 1 or not np.isfinite(float(s.reshape(-1)[0])) or float(s.reshape(-1)[0]) <= 0:
            raise CaptureFormatError(f"--kv {path!r}: scale must be one positive number")
        scale = float(s.reshape(-1)[0])
    model = str(f["model"]) if "model" in names and f["model"].dtype.kind == "U" else None
    source = f"captured from {model}" if model else "captured"
    return KVData(keys, values, qs, positions, scale, f"{source} ({path})")


# -- the codec round trip -------------------------------------------------------------------------


def _buffers(kv: KVData, page_tokens: int, dtype: str) -> list[BufferDesc]:
    dt = DType[dtype.upper()]
    nbytes = page_tokens * kv.kv_heads * kv.head_dim * dt.itemsize
    return [BufferDesc(layer, role, 0, (2 * layer + i) * nbytes, nbytes, dt, page_tokens, kv.kv_heads, kv.head_dim)
            for layer in range(kv.layers) for i, role in enumerate((Role.KEY, Role.VALUE))]


def hot_pages(kv: KVData, page_tokens: int, dtype: str) -> np.ndarray:
    """(pages, slot bytes) uint8: every layer's K and V, the last page padded with zeros."""
    data = _data_module()
    dt = DType[dtype.upper()]
    pages = -(-kv.tokens // page_tokens)
    per = page_tokens * kv.kv_heads * kv.head_dim * dt.itemsize
    out = np.zeros((pages, 2 * kv.layers * per), np.uint8)
    for layer in range(kv.layers):
        for i, x in enumerate((kv.keys[layer], kv.values[layer])):
            padded = np.zeros((pages * page_tokens, kv.kv_heads, kv.head_dim), np.float32)
            padded[:kv.tokens] = x
            off = (2 * layer + i) * per
            out[:, off:off + per] = data.from_float32(padded, dt).reshape(pages, per)
    return out


def _unpack(kv: KVData, pages: np.ndarray, page_tokens: int, dtype: str) -> tuple[list, list]:
    """Decoded hot pages back into per-layer K and V (float32, the padding dropped)."""
    data = _data_module()
    dt = DType[dtype.upper()]
    per = page_tokens * kv.kv_heads * kv.head_dim * dt.itemsize
    keys, values = [], []
    for layer in range(kv.layers):
        for i, out in enumerate((keys, values)):
            off = (2 * layer + i) * per
            x = data.to_float32(np.ascontiguousarray(pages[:, off:off + per]), dt)
            out.append(x.reshape(-1, kv.kv_heads, kv.head_dim)[:kv.tokens])
    return keys, values


class _Skip(RuntimeError):
    """A codec that cannot run on this layout or device (its creation or configuration failed)."""


def round_trip(name: str, params: Mapping[str, Any] | None, device: str, src: np.ndarray,
               buffers: list[BufferDesc]) -> tuple[np.ndarray, int]:
    """Encodes every page of ``src`` with the codec and decodes the blobs into fresh pages: the
    decoded pages (host numpy) and the cold page bytes. On a GPU the pools and blobs are device
    memory (:mod:`kvcodec_sdk.gpu`)."""
    pages, slot = src.shape
    ident = np.ascontiguousarray(np.stack([np.arange(pages)] * 2, axis=1).astype(np.int32))
    on_gpu = device != "cpu"
    if on_gpu:
        hot = gpu.to_device(np.ascontiguousarray(src), device)
        out = gpu.empty(src.shape, np.uint8, device)
        out.fill_bytes(0)
    else:
        hot, out = src, np.zeros_like(src)

    def group(pool) -> list[PoolGroupDesc]:
        base = pool.address if on_gpu else pool.ctypes.data
        return [PoolGroupDesc([PoolDesc(base, slot, pages)], [LifeCycleDesc(0, tuple(buffers))])]

    codecs = []
    try:
        for pool in (hot, out):
            try:
                codecs.append(create_codec(name, params, device=device))
            except (ValueError, RuntimeError) as exc:
                raise _Skip(f"cannot be created on {device}: {exc}") from None
            try:
                codecs[-1].configure(group(pool))
            except (ValueError, RuntimeError) as exc:
                raise _Skip(f"cannot be configured for this layout: {exc}") from None
        enc, dec = codecs
        cold_bytes = enc.cold_page_bytes(0)
        if not on_gpu:
            blobs = np.zeros((pages, cold_bytes), np.uint8)
            enc.encode(0, blobs, ident)
            dec.decode(0, blobs, ident)
            return out, cold_bytes
        stream = gpu.new_stream(device)
        cold = gpu.empty((pages, cold_bytes), np.uint8, device)
        cold.fill_bytes(0)  # synchronized, as the copies above: done before the codec's calls
        idx = gpu.to_device(ident, device) if enc.page_index_location(0).name == "DEVICE" else ident
        enc.encode(0, cold, idx, stream=stream)
        dec.decode(0, cold, idx, stream=stream)
        stream.sync()
        return out.numpy(), cold_bytes
    finally:
        for c in codecs:
            c.close()


def check_pages(name: str, params: Mapping[str, Any] | None, src: np.ndarray, got: np.ndarray,
                buffers: list[BufferDesc]) -> str:
    """What the decoded pages were checked against; raises RuntimeError when they fail it."""
    spec = get_codec_spec(name)
    if spec.lossless:
        if not np.array_equal(src, got):
            raise RuntimeError(f"{name} declares itself lossless but its round trip changed the pages")
        return "lossless: byte-exact"
    if spec.check_error is None:
        return f"lossy, no check_error declared: the bound ({spec.error_bound}) is not verified"
    full = spec.validate_params(params)
    sample = min(len(src), CHECKED_PAGES)
    for b in buffers:
        lo, hi = b.byte_offset, b.byte_offset + b.bytes
        for i in range(sample):
            reason = spec.check_error(src[i, lo:hi].copy(), got[i, lo:hi].copy(), b, full)
            if reason:
                raise RuntimeError(f"{name}: {Role(b.role).name} buffer of layer {b.layer_id}, page {i}, exceeds the "
                                   f"declared bound: {reason}")
    return f"lossy: within the declared bound ({sample} pages judged)"


# -- attention --------------------------------------------------------------------------------------


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
              positions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Attention weights (queries, query heads, keys) and outputs (queries, query heads, head dim)
    in float64; query head h uses KV head h // (query heads / KV heads)."""
    kv_of = np.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k[:, kv_of], v[:, kv_of]))
    logits = np.einsum("qhd,shd->qhs", q64, k64) * scale
    if positions is not None:
        masked = np.arange(k.shape[0])[None, :] > positions[:, None]  # (queries, keys)
        logits = np.where(masked[:, None, :], -np.inf, logits)
    logits -= logits.max(axis=2, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=2, keepdims=True)
    return w, np.einsum("qhs,shd->qhd", w, v64)


def _ranks(w: np.ndarray) -> np.ndarray:
    """Rank of each key by weight per row (0 = largest; ties: the earlier key first)."""
    order = np.argsort(-w, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(w.shape[1]), w.shape), axis=1)
    return ranks


def compare_layer(q, k, v, k2, v2, scale, positions, topk) -> dict:
    """One layer's per-output figures: cosine, relative L2 error and top-k agreement arrays."""
    w, o = attention(q, k, v, scale, positions)
    w2, o2 = attention(q, k2, v2, scale, positions)
    a, b = o.reshape(-1, o.shape[-1]), o2.reshape(-1, o.shape[-1])
    same = np.all(a == b, axis=1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = na * nb
    cos = np.where(denom > 0, np.sum(a * b, axis=1) / np.where(denom > 0, denom, 1.0), 0.0)
    cos = np.where(same, 1.0, np.clip(cos, -1.0, 1.0))
    diff = np.linalg.norm(b - a, axis=1)
    rel = np.where(same, 0.0, np.where(na > 0, diff / np.where(na > 0, na, 1.0), np.inf))
    n_keys = k.shape[0]
    attended = np.full(q.shape[0], n_keys) if positions is None else positions + 1
    attended = np.repeat(attended, q.shape[1])  # per (query, head) row
    r1, r2 = _ranks(w.reshape(-1, n_keys)), _ranks(w2.reshape(-1, n_keys))
    agree = {}
    for kk in topk:
        keff = np.minimum(kk, attended)[:, None]
        agree[kk] = np.sum((r1 < keff) & (r2 < keff), axis=1) / keff[:, 0]
    return {"cos": cos, "rel": rel, "agree": agree}


def _rel_rms(orig: list, got: list) -> float:
    num = sum(float(np.sum((g.astype(np.float64) - o) ** 2)) for o, g in zip(orig, got))
    den = sum(float(np.sum(o.astype(np.float64) ** 2)) for o in orig)
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def measure(kv: KVData, keys: list, values: list, topk) -> dict:
    """The figures of decoded ``keys`` / ``values`` against ``kv``'s, over every layer."""
    per_layer, cos, rel, agree = [], [], [], {k: [] for k in topk}
    for layer in range(kv.layers):
        r = compare_layer(kv.queries[layer], kv.keys[layer], kv.values[layer], keys[layer], values[layer], kv.scale,
                          kv.positions, topk)
        cos.append(r["cos"])
        rel.append(r["rel"])
        for k in topk:
            agree[k].append(r["agree"][k])
        per_layer.append({"layer": layer, "cosine_mean": float(r["cos"].mean()), "cosine_min": float(r["cos"].min()),
                          "rel_l2_mean": float(r["rel"].mean()), "rel_l2_max": float(r["rel"].max()),
                          "topk_mean": {str(k): float(r["agree"][k].mean()) for k in topk}})
    c, e = np.concatenate(cos), np.concatenate(rel)
    a = {k: np.concatenate(v) for k, v in agree.items()}
    return {"cosine_mean": float(c.mean()), "cosine_min": float(c.min()), "rel_l2_mean": float(e.mean()),
            "rel_l2_max": float(e.max()), "topk_mean": {str(k): float(v.mean()) for k, v in a.items()},
            "topk_min": {str(k): float(v.min()) for k, v in a.items()},
            "key_rel_rms": _rel_rms(kv.keys, keys), "value_rel_rms": _rel_rms(kv.values, values),
            "outputs": int(c.size), "per_layer": per_layer}


# -- which codecs, and the run --------------------------------------------------------------------


def configurations(codec: str, params: Mapping[str, Any] | None) -> list[tuple[str, dict]]:
    """(codec, parameters) to compare: concat first (the lossless reference), then ``codec`` with
    ``params``, or for ``"all"`` every registered lossy codec at every choice of its format and
    scale granularity (the parameters of :data:`SWEPT_PARAMS` its schema has). Raises
    UnknownCodecError / CodecParamError for an unknown name or invalid parameters."""
    out: list[tuple[str, dict]] = [("concat", {})]
    if codec != "all":
        spec = get_codec_spec(codec)
        spec.validate_params(params)
        if codec != "concat" or params:
            out.append((codec, dict(params or {})))
        return out
    if params:
        raise ValueError("--params applies to one codec; name it with --codec instead of 'all'")
    for spec in default_registry().list_codecs():
        if spec.lossless:
            continue
        swept = [p for p in spec.params if p.name in SWEPT_PARAMS and p.choices]
        for combo in itertools.product(*(p.choices for p in swept)):
            out.append((spec.name, {p.name: c for p, c in zip(swept, combo)}))
    return out


def resolve_device(device: str) -> str:
    if device == "auto":
        from .. import _native

        return "cuda:0" if _native.driver_info()["device_count"] > 0 else "cpu"
    return "cuda:0" if device == "cuda" else device


def label(name: str, params: Mapping[str, Any]) -> str:
    return name + ("" if not params else " " + ",".join(f"{k}={v}" for k, v in params.items()))


def run(kv: KVData, codec: str = "all", params: Mapping[str, Any] | None = None, device: str = "auto",
        page_tokens: int = 16, dtype: str = "bfloat16", topk=DEFAULT_TOPK, data: str = "kv-like", seed: int = 0,
        progress: bool = True) -> FidelityReport:
    """Every configuration of :func:`configurations` through a codec round trip, against ``kv``."""
    configs = configurations(codec, params)
    device = resolve_device(device)
    topk = sorted(set(int(k) for k in topk))
    buffers = _buffers(kv, page_tokens, dtype)
    src = hot_pages(kv, page_tokens, dtype)
    report = FidelityReport(device, data, kv.source, dtype, kv.layers, kv.tokens, page_tokens, int(src.shape[0]),
                            kv.kv_heads, kv.query_heads, kv.head_dim, kv.num_queries, kv.scale, topk, seed)
    broken = default_registry().broken_plugins
    if broken:
        report.info["broken_plugins"] = broken
    kind = "cpu" if device == "cpu" else "cuda"
    _log(progress, f"{kv.layers} layers x K,V of {kv.tokens} tokens in {src.shape[0]} pages of {page_tokens} "
                   f"({_fmt(src.shape[1])} per page, {dtype}), {kv.num_queries} queries x {kv.query_heads} heads "
                   f"per layer, on {device}")
    _steps(progress, len(configs))
    for name, p in configs:
        spec = get_codec_spec(name)
        what = label(name, p)
        if kind not in spec.devices:
            report.skipped.append({"codec": name, "params": p, "reason": f"no {kind} implementation (it runs on: "
                                                                         f"{', '.join(spec.devices)})"})
            _log(progress, f"skipping {what}: {report.skipped[-1]['reason']}")
            _advance(progress)
            continue
        _log(progress, f"{what}: encode + decode {src.shape[0]} pages, attention with the decoded K/V")
        try:
            got, cold_bytes = round_trip(name, p, device, src, buffers)
            checked = check_pages(name, p, src, got, buffers)
        except _Skip as exc:
            report.skipped.append({"codec": name, "params": p, "reason": str(exc)})
            _log(progress, f"skipping {what}: {exc}")
            _advance(progress)
            continue
        except (RuntimeError, ValueError) as exc:  # a failed call or check: report it, go on
            report.failed.append({"codec": name, "params": p, "error": str(exc)})
            _log(progress, f"{what} failed: {exc}")
            _advance(progress)
            continue
        keys, values = _unpack(kv, got, page_tokens, dtype)
        m = measure(kv, keys, values, topk)
        hot = int(src.shape[1])
        report.rows.append(Row(name, dict(p), bool(spec.lossless), int(cold_bytes), hot, cold_bytes / hot,
                               m["cosine_mean"], m["cosine_min"], m["rel_l2_mean"], m["rel_l2_max"], m["topk_mean"],
                               m["topk_min"], m["key_rel_rms"], m["value_rel_rms"], m["outputs"], checked,
                               m["per_layer"]))
        _log(progress, f"  cosine {m['cosine_mean']:.6f} (min {m['cosine_min']:.6f}), rel. error "
                       f"{m['rel_l2_mean']:.4f} (max {m['rel_l2_max']:.4f}), top-{topk[0]} "
                       f"{m['topk_mean'][str(topk[0])]:.4f}")
        _advance(progress)
    return report


# -- the report -----------------------------------------------------------------------------------


def _exact(v: float, fmt: str) -> str:
    """1 and 0 as themselves (a lossless row is exact), other values with ``fmt``."""
    return "1" if v == 1.0 else "0" if v == 0.0 else format(v, fmt)


def table(report: FidelityReport) -> Table:
    """The report as table cells (see :class:`~kvcodec_sdk.bench._common.Table`)."""
    heads = (f"{report.query_heads} query / {report.kv_heads} KV heads" if report.query_heads != report.kv_heads
             else f"{report.kv_heads} heads")
    title = (f"attention fidelity on {report.device}: {report.source}; {report.layers} layers x K,V of "
             f"{report.tokens} tokens in pages of {report.page_tokens}, {heads} x {report.head_dim}, {report.dtype}, "
             f"{report.queries} queries per layer")
    names = [label(r.codec, r.params) for r in report.rows]
    w = max([len("codec")] + [len(n) for n in names])
    cols = [Column("codec", w, "<"), Column("cold/hot", 8), Column("cos mean", 10), Column("cos min", 10),
            Column("err mean", 9), Column("err max", 9)]
    cols += [Column(f"top-{k}", 7) for k in report.topk]
    cols += [Column("top-k min", 9), Column("K rms err", 9), Column("V rms err", 9)]
    rows = []
    for n, r in zip(names, report.rows):
        rows.append([n, f"{r.cold_hot_ratio:.4f}", _exact(r.cosine_mean, ".6f"), _exact(r.cosine_min, ".6f"),
                     _exact(r.rel_l2_mean, ".4f"), _exact(r.rel_l2_max, ".4f"),
                     *(_exact(r.topk_mean[str(k)], ".4f") for k in report.topk),
                     _exact(r.topk_min[str(report.topk[0])], ".3f"), _exact(r.key_rel_rms, ".4f"),
                     _exact(r.value_rel_rms, ".4f")])
    notes = [f"cos: cosine similarity and err: relative L2 error of the attention outputs with the decoded K/V "
             f"against the original, over {report.rows[0].outputs if report.rows else 0} outputs (layers x queries x "
             f"heads); top-k: mean fraction of the original's k most-weighted keys among the decoded's "
             f"(top-k min: the worst output, k = {report.topk[0]}); K/V rms err: of the decoded elements"]
    seen = set()
    for r in report.rows:
        if r.codec not in seen:
            seen.add(r.codec)
            notes.append(f"checked {r.codec}: {r.checked}")
    for s in report.skipped:
        notes.append(f"skipped {label(s['codec'], s['params'])}: {s['reason']}")
    for f in report.failed:
        notes.append(f"FAILED {label(f['codec'], f['params'])}: {f['error']}")
    for plugin, reason in report.info.get("broken_plugins", {}).items():
        notes.append(f"plugin {plugin} did not load: {reason}")
    return Table([title], cols, rows, notes, header_without_rows=False)


# -- the command line -----------------------------------------------------------------------------


def _topk_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 1 << 20:
            raise argparse.ArgumentTypeError(f"{text!r}: {part!r} is not a k; give integers >= 1, comma-separated, "
                                             "e.g. 8 or 1,8,32")
        out.append(int(part))
    return out


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive finite number")
    return value


def add_arguments(p: argparse.ArgumentParser, *, device_type: Any, count: Any, output_file: Any) -> None:
    """The options of ``kvcodec bench fidelity``."""
    p.add_argument("--codec", dest="codec_name", metavar="NAME", default="all",
                   help="a registered codec, compared with concat, or 'all' (default): every installed lossy codec at "
                        "each format and granularity it supports, with concat as the lossless reference")
    p.add_argument("--params", default=None, metavar="JSON", help="the codec's parameters as a JSON object")
    p.add_argument("--device", type=device_type, default="auto",
                   help="where the codec runs: auto (GPU when present), cpu, cuda, cuda:N; attention is computed on "
                        "the host either way")
    p.add_argument("--data", choices=DATA_SOURCES, default="kv-like",
                   help="kv-like (generated, default) or captured (--kv FILE.npz from a real model)")
    p.add_argument("--kv", metavar="FILE.npz", default=None,
                   help="with --data captured: K/V and queries per layer (k_<l>, v_<l>: tokens x KV heads x head dim; "
                        "q_<l>: queries x query heads x head dim; optional positions and scale)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="hot dtype of K and V (default bfloat16)")
    p.add_argument("--tokens", type=count(1, 1 << 16), default=DEFAULTS["tokens"],
                   help=f"tokens per page (default {DEFAULTS['tokens']})")
    p.add_argument("--layers", type=count(1, 1024), default=None,
                   help=f"layers (kv-like default {DEFAULTS['layers']}; captured: the first N, default all)")
    p.add_argument("--queries", type=count(1, 1 << 16), default=None,
                   help=f"queries per layer (kv-like default {DEFAULTS['queries']}; captured: the first N, default all)")
    p.add_argument("--pages", type=count(1, 1 << 16), default=None,
                   help=f"kv-like: pages per layer (default {DEFAULTS['pages']})")
    p.add_argument("--heads", type=count(1, 1024), default=None, help=f"kv-like: KV heads (default {DEFAULTS['heads']})")
    p.add_argument("--head-dim", type=count(1, 1 << 12), default=None,
                   help=f"kv-like: head dim (default {DEFAULTS['head_dim']})")
    p.add_argument("--logit-std", type=_positive, default=None,
                   help="kv-like: standard deviation of each query's logits over the keys (default 2)")
    p.add_argument("--seed", type=count(0, 1 << 31), default=0, help="kv-like: seed of the data (default 0)")
    p.add_argument("--topk", type=_topk_list, default=list(DEFAULT_TOPK), metavar="K[,K...]",
                   help="k of the top-k agreement, comma-separated (default 8)")
    p.add_argument("--json", metavar="PATH", type=output_file,
                   help="also write the report as JSON (the table on stdout is then plain text)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--baseline", metavar="OLD.json", default=None,
                   help="after the run, show how each figure moved from this earlier --json report")
    p.set_defaults(report=None)


def options_problem(args: argparse.Namespace) -> str | None:
    """A usage error of options that do not fit together (None when they do)."""
    if args.data == "captured":
        if args.kv is None:
            return "--data captured reads K/V from a file: give --kv FILE.npz"
        if not os.path.isfile(args.kv):
            return f"argument --kv: {args.kv!r} " + ("is not a file" if os.path.exists(args.kv) else "does not exist")
        for option in ("pages", "heads", "head_dim", "logit_std"):
            if getattr(args, option) is not None:
                return (f"--{option.replace('_', '-')} shapes the kv-like data; with --data captured the shapes "
                        f"come from --kv")
    elif args.kv is not None:
        return "--kv is read with --data captured (add it, or leave out --kv for kv-like data)"
    return None


def load_data(args: argparse.Namespace) -> KVData:
    """The K/V the options name (CaptureFormatError for a bad --kv file)."""
    if args.data == "captured":
        return load_captured(args.kv, args.dtype, args.layers, args.queries)
    d = DEFAULTS
    return kv_like_data(args.layers or d["layers"], args.pages or d["pages"], args.tokens, args.heads or d["heads"],
                        args.head_dim or d["head_dim"], args.queries or d["queries"], args.dtype, args.seed,
                        args.logit_std or 2.0)
