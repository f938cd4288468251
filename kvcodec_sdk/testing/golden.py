"""Golden vectors: stored hot pages, index pairs and the blobs a codec's format version encodes
them to. A format version's vectors are written once and must decode forever.

Layout of one vector folder (``<root>/<codec>-v<format_version>/``)::

    manifest.json        {"codec", "format_version", "params", "groups": [...]}
    group<g>_pool<p>.npy hot slots of pool p of group g, shape (num_slots, slot_bytes), uint8
    group<g>_pairs.npy   encode pairs (dst cold slot, src hot slot), int32 (N, 2)
    group<g>_cold.bin    the cold blobs, num_cold_slots * page_bytes bytes
    group<g>_decoded_pool<p>.npy   (lossy codecs) the decoded hot slots at the pairs' src slots

Each group entry holds ``slot_bytes``, ``num_slots``, ``lifecycles`` (IDs; the blob was encoded
with ``encoded_with``, default the first), optional ``buffers`` (per lifecycle ID, the
BufferDesc fields), ``hot``, ``pairs``, ``blob``, ``num_cold_slots``, ``page_bytes`` (cold page
bytes) and optional ``decoded``. A codec's CPU reference decodes them when possible (else its
device implementation).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import CodecCallError
from ..layout import BufferDesc, DType, LifeCycleDesc, PoolDesc, PoolGroupDesc, Role
from ..spec import CodecSpec
from .clauses import violated
from .data import fill_page_bytes
from .layouts import LayoutPlan, generate_layout

__all__ = ["write_golden_vectors", "check_vectors", "declared_vectors"]

_FILL = 0xEE


def _buffer_json(b: BufferDesc) -> dict:
    d = asdict(b)
    d["role"], d["dtype"] = int(b.role), int(b.dtype)
    return d


def _buffer_from(d: Mapping[str, Any]) -> BufferDesc:
    return BufferDesc(**{**d, "role": Role(d["role"]), "dtype": DType(d["dtype"])})


def declared_vectors(spec: CodecSpec) -> Path | None:
    """The folder of the golden vectors of the codec's current format version that the codec
    ships, or None.

    A plugin declares them next to its spec: ``golden_vectors`` on the ``CodecSpec``, a folder
    holding ``<name>-v<format_version>/`` (the folder :func:`write_golden_vectors` writes to),
    usually one inside the plugin's package, e.g. ``Path(__file__).parent / "vectors"``. The
    suite then checks them by default. A declared folder without the current version's vectors
    fails the clause: a new format version ships new vectors.
    """
    root = getattr(spec, "golden_vectors", None)
    if root is None:
        return None
    return Path(root) / f"{spec.name}-v{spec.format_version}"


def write_golden_vectors(spec: CodecSpec, root: str | Path, params: Mapping[str, Any] | None = None, *,
                         plan: LayoutPlan | None = None, pages: int = 4, seed: int = 0x601D) -> Path:
    """Encodes KV-like pages with the codec and stores them as its format version's vectors.

    Run once per format version, commit the folder, and never rewrite it: a folder that exists
    is an error. Returns ``root/<name>-v<format_version>``.
    """
    from .harness import make_codec

    out = Path(root) / f"{spec.name}-v{spec.format_version}"
    if out.exists():
        raise FileExistsError(f"{out} exists; golden vectors of a format version are written once and never rewritten")
    rng = np.random.default_rng(seed)
    plan = plan or generate_layout(rng, name="golden", num_groups=2, min_slots=8, max_slots=10)
    device = "cpu" if "cpu" in spec.devices else "cuda"
    hot = [[fill_page_bytes(rng, p.slot_bytes, p.num_slots, [b for b in g.lifecycles[0].buffers if b.pool_index == i])
            for i, p in enumerate(g.pools)] for g in plan.groups]
    host_layout = [PoolGroupDesc([PoolDesc(a.ctypes.data, a.shape[1], a.shape[0]) for a in arrays], list(g.lifecycles))
                   for arrays, g in zip(hot, plan.groups)]
    if device != "cpu":
        raise NotImplementedError("write_golden_vectors needs the codec's CPU reference")
    out.mkdir(parents=True)
    manifest: dict[str, Any] = {"codec": spec.name, "format_version": spec.format_version,
                                "params": spec.validate_params(params), "groups": []}
    with make_codec(spec, params, device) as codec:
        codec.configure(host_layout)
        for g, (group, arrays) in enumerate(zip(plan.groups, hot)):
            lc = group.lifecycles[0].lifecycle_id
            n = min(pages, group.num_slots)
            src = rng.choice(group.num_slots, n, replace=False).astype(np.int32)
            dst = rng.permutation(n).astype(np.int32)
            pairs = np.ascontiguousarray(np.stack([dst, src], axis=1))
            page_bytes = codec.cold_page_bytes(lc)
            cold = np.zeros(n * page_bytes, np.uint8)
            codec.encode(lc, cold, pairs)
            entry: dict[str, Any] = {
                "slot_bytes": [int(a.shape[1]) for a in arrays], "num_slots": [int(a.shape[0]) for a in arrays],
                "lifecycles": [int(x.lifecycle_id) for x in group.lifecycles], "encoded_with": int(lc),
                "buffers": {str(x.lifecycle_id): [_buffer_json(b) for b in x.buffers] for x in group.lifecycles},
                "hot": [], "pairs": f"group{g}_pairs.npy", "blob": f"group{g}_cold.bin",
                "num_cold_slots": n, "page_bytes": int(page_bytes),
            }
            for p, a in enumerate(arrays):
                np.save(out / f"group{g}_pool{p}.npy", a, allow_pickle=False)
                entry["hot"].append(f"group{g}_pool{p}.npy")
            np.save(out / entry["pairs"], pairs, allow_pickle=False)
            (out / entry["blob"]).write_bytes(cold.tobytes())
            if not spec.lossless:
                fresh = [np.full_like(a, _FILL) for a in arrays]
                with make_codec(spec, params, device) as dec:
                    dec.configure([PoolGroupDesc([PoolDesc(a.ctypes.data, a.shape[1], a.shape[0]) for a in fresh],
                                                 list(group.lifecycles))])
                    dec.decode(lc, cold, np.ascontiguousarray(pairs[:, ::-1]))
                entry["decoded"] = []
                for p, a in enumerate(fresh):
                    np.save(out / f"group{g}_decoded_pool{p}.npy", a[src], allow_pickle=False)
                    entry["decoded"].append(f"group{g}_decoded_pool{p}.npy")
            manifest["groups"].append(entry)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def check_vectors(spec: CodecSpec, params: Mapping[str, Any] | None, device: str, folder: Path) -> None:
    """Decodes every stored blob and compares with the stored pages (clause ``golden-vectors``)."""
    clause = "golden-vectors"
    manifest_path = Path(folder) / "manifest.json"
    if not manifest_path.is_file():
        raise violated(clause, f"no golden vectors at {folder} (manifest.json missing): every format version ships "
                               "vectors; write them once with kvcodec_sdk.testing.write_golden_vectors(spec, root)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("codec") != spec.name or manifest.get("format_version") != spec.format_version:
        raise violated(clause, f"{manifest_path} holds vectors of {manifest.get('codec')!r} format "
                               f"{manifest.get('format_version')}, not {spec.name!r} format {spec.format_version}")
    params = manifest.get("params", params)
    for g, entry in enumerate(manifest["groups"]):
        stored = [np.load(folder / f, allow_pickle=False) for f in entry["hot"]]
        pairs = np.load(folder / entry["pairs"], allow_pickle=False).astype(np.int32)
        blob = np.frombuffer((folder / entry["blob"]).read_bytes(), np.uint8)
        buffers = entry.get("buffers", {})
        lifecycles = [LifeCycleDesc(int(i), tuple(_buffer_from(b) for b in buffers.get(str(i), [])))
                      for i in entry["lifecycles"]]
        lc = int(entry.get("encoded_with", entry["lifecycles"][0]))
        fresh = [np.full_like(a, _FILL) for a in stored]
        src = pairs[:, 1]
        try:
            got = _decode(spec, params, device, fresh, lifecycles, lc, blob, pairs, entry, g)
        except CodecCallError as exc:
            raise violated(clause, f"{folder.name} group {g}, lifecycle {lc}: decoding the stored blobs failed: {exc}")
        expected = [np.load(folder / f, allow_pickle=False) for f in entry["decoded"]] if "decoded" in entry \
            else [a[src] for a in stored]
        for p, (want, have) in enumerate(zip(expected, got)):
            if not np.array_equal(want, have):
                bad = int(np.flatnonzero((want != have).any(axis=1))[0])
                raise violated(clause, f"{folder.name} group {g}, lifecycle {lc}: decoding the stored blob of cold "
                                       f"slot {int(pairs[bad, 0])} no longer gives the stored page in pool {p} "
                                       f"(hot slot {int(src[bad])}): "
                                       f"{int((want[bad] != have[bad]).sum())} of {want.shape[1]} bytes differ")


def _decode(spec, params, device, fresh, lifecycles, lc, blob, pairs, entry, g) -> list[np.ndarray]:
    from .harness import make_codec

    decode_pairs = np.ascontiguousarray(pairs[:, ::-1])
    if device == "cpu":
        with make_codec(spec, params, "cpu") as codec:
            codec.configure([PoolGroupDesc([PoolDesc(a.ctypes.data, a.shape[1], a.shape[0]) for a in fresh], lifecycles)])
            _check_size(codec, lc, entry, g)
            codec.decode(lc, blob.copy(), decode_pairs)
        return [a[pairs[:, 1]] for a in fresh]
    from .. import gpu
    from ..layout import PageIndexLocation

    pools = [gpu.to_device(a, device) for a in fresh]
    with make_codec(spec, params, device) as codec:
        codec.configure([PoolGroupDesc([PoolDesc(t.address, a.shape[1], a.shape[0]) for t, a in zip(pools, fresh)],
                                       lifecycles)])
        _check_size(codec, lc, entry, g)
        cold = gpu.to_device(blob, device, pinned_memory=True)
        idx = decode_pairs
        if codec.page_index_location(lc) == PageIndexLocation.DEVICE:
            idx = gpu.to_device(decode_pairs, device)
        stream = gpu.new_stream(device)
        codec.decode(lc, cold, idx, stream=stream)
        stream.sync()
    return [t.numpy()[pairs[:, 1]] for t in pools]


def _check_size(codec, lc, entry, g) -> None:
    size = codec.cold_page_bytes(lc)
    if size != entry["page_bytes"]:
        raise violated("golden-vectors", f"group {g}, lifecycle {lc}: the cold page is {size} bytes but the stored "
                                         f"vectors of this format version have {entry['page_bytes']}-byte pages: the "
                                         "format changed without a new format_version")
