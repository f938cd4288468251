"""``kvcodec inspect DIR``: the disk-tier regions under DIR — codec identity, slot usage and
journal state — and, with ``--key``, one page located, checksum-verified and decoded on the CPU
with the recorded codec. A key is looked up as given and as the KV-cache manager stores a keyed
page (its content key behind the prefix ``k``), so the key given to ``set_keys`` finds its page.
Opens regions read-only: no file is changed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from ..cli import count, folder, output_file

NAME = "inspect"
HELP = "inspect disk-tier regions (codec, slots, journal) and decode a page by key"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=folder, help="a region directory, or a directory whose subdirectories are regions")
    p.add_argument("--key", help="a page key, in hex (as the journal shows it)")
    p.add_argument("--key-text", help="a page key as UTF-8 text")
    p.add_argument("--region", help="with several regions: the one holding the key (directory name)")
    p.add_argument("--dump", metavar="PATH", type=output_file, help="with --key: also write the raw blob to PATH")
    p.add_argument("--pages", type=count(0, 1 << 31), default=0, metavar="N", help="list the N oldest pages of each region")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def find_regions(root: str) -> list[str]:
    """``root`` itself when it is a region, else its subdirectories that are (sorted)."""
    if not os.path.exists(root):
        raise FileNotFoundError(f"{root!r} does not exist")
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root!r} is not a directory")
    if os.path.isfile(os.path.join(root, "region.json")):
        return [root]
    found = sorted(os.path.join(root, d) for d in os.listdir(root)
                   if os.path.isfile(os.path.join(root, d, "region.json")))
    if not found:
        raise FileNotFoundError(f"no disk region under {root!r}: neither it nor a subdirectory holds region.json")
    return found


def describe(path: str, pages: int) -> tuple[dict, Any]:
    from ..disk import DiskRegion

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        region = DiskRegion.open_read_only(path)
    stats, rec = region.stats(), region.recovery()
    files = {leaf: os.path.getsize(os.path.join(path, leaf)) if os.path.exists(os.path.join(path, leaf)) else None
             for leaf in ("index.log", "index.log.1", "index.snapshot", "index.snapshot.bak")}
    info = {
        "path": path,
        "name": region._native.name,
        "codec": region.codec,
        "slot_bytes": region.slot_bytes,
        "slot_stride": region._native.slot_stride,
        "containers": region._native.num_containers,
        "slots_per_container": region._native.slots_per_container,
        "slots_total": stats["slots_total"],
        "slots_live": stats["slots_live"],
        "io": "direct" if stats["direct_io"] else "buffered",
        "layout_recorded": region.layout is not None,
        "journal": {
            "files": files,
            "snapshot_used": rec["snapshot_used"] or None,
            "snapshot_seq": rec["snapshot_seq"],
            "snapshot_entries": rec["snapshot_entries"],
            "records_after_snapshot": rec["journal_records_replayed"],
            "last_seq": stats["last_seq"],
            "truncated_tail_bytes": rec["truncated_tail_bytes"],
            "corrupt_lines": rec["journal_corrupt_lines"],
            "recovery_seconds": rec["seconds"],
        },
        "warnings": [str(w.message) for w in caught],
    }
    if pages:
        info["pages"] = [dict(p, key=p["key"].hex()) for p in region.pages()[:pages]]
    return info, region


#: The KV-cache manager's disk level stores a keyed page under this prefix and its content key
#: (anonymous pages under ``b"a"`` and a number), so a key given as the manager was given it is
#: found under the prefixed name too.
MANAGER_KEY_PREFIX = b"k"


def region_key(region: Any, key: bytes) -> bytes | None:
    """The name ``key`` is stored under in ``region``: itself, or the manager's prefixed name
    (None when neither is there)."""
    for name in (key, MANAGER_KEY_PREFIX + key):
        if region.lookup(name) is not None:
            return name
    return None


def decode_page(region: Any, key: bytes, dump: str | None) -> dict:
    """Reads ``key`` (checksum-verified) and decodes it on the CPU with the recorded codec."""
    import numpy as np

    from ..disk import group_from_layout
    from ..registry import create_codec

    key = region_key(region, key) or key
    loc = region.lookup(key)
    if loc is None:
        known = [p["key"].hex() for p in region.pages()[:5]]
        raise LookupError(f"key {key.hex()} is not in region {region._native.dir!r}; some keys: {known}")
    blob = np.zeros(region.slot_bytes, dtype=np.uint8)
    done = region.wait(region.submit_read(key, blob))
    out: dict[str, Any] = {"key": key.hex(), "container": loc["container"], "slot": loc["slot"], "tag": loc["tag"],
                           "crc": "%08x" % loc["crc"], "checksum": done.status}
    if not done.ok:
        out["error"] = done.message
        return out
    if dump:
        blob.tofile(dump)
        out["dumped_to"] = dump
    layout, ident = region.layout, region.codec
    if isinstance(layout, list):  # a KV-cache manager's layer groups (KVCacheConfig.layout_description)
        out["decoded"] = decode_manager_blob(layout, ident, loc["tag"], blob)
        return out
    if layout is None:
        out["decoded"] = None
        out["note"] = "no layout recorded with the region: the blob cannot be decoded (use --dump for raw bytes)"
        return out
    check_layout(layout, loc["tag"], blob.size)
    pools = [np.zeros(p["slot_bytes"], dtype=np.uint8) for p in layout["pools"]]
    group = group_from_layout(layout, [p.ctypes.data for p in pools])
    with create_codec(ident["name"], ident["params"], device="cpu") as codec:
        if codec.spec.format_version != ident["format_version"]:
            raise ValueError(f"the installed codec {ident['name']!r} has format {codec.spec.format_version}; the "
                             f"region was written with format {ident['format_version']}")
        codec.configure([group])
        lifecycle = loc["tag"]
        if codec.cold_page_bytes(lifecycle) != blob.size:
            raise ValueError(f"the recorded layout gives {ident['name']!r} blobs of {codec.cold_page_bytes(lifecycle)} "
                             f"bytes for layer group {lifecycle}, but the region's slots hold {blob.size}: the layout "
                             "in region.json does not belong to these blobs; refusing to decode")
        pairs = np.array([[0, 0]], dtype=np.int32)  # (hot slot 0, cold slot 0)
        codec.decode(lifecycle, blob.ctypes.data, pairs)
    out["decoded"] = summarize(layout, pools, loc["tag"])
    return out


#: A recorded hot page may be at most this many times its blob (fp8 halves a page; no shipped
#: codec shrinks one 16-fold): a larger claim is a damaged layout, not a page to allocate.
MAX_HOT_TO_BLOB = 16


def check_layout(layout: Any, lifecycle: int, blob_bytes: int) -> None:
    """Validates every recorded size of a layout against the blob before anything is allocated or
    decoded (the layout comes from region.json, which may be damaged or hostile)."""
    def bad(what: str) -> ValueError:
        return ValueError(f"region.json's layout is damaged: {what}; refusing to decode")

    def count(value: Any, what: str, low: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(f"{what} is {value!r}")
        return value

    try:
        pools = [count(p["slot_bytes"], f"pools[{i}].slot_bytes", 1) for i, p in enumerate(layout["pools"])]
        lifecycles = {count(lc["lifecycle_id"], "lifecycle_id"): lc for lc in layout["lifecycles"]}
    except (KeyError, TypeError) as exc:
        raise bad(f"missing or malformed field ({exc})") from None
    if not pools:
        raise bad("it has no pools")
    if sum(pools) > MAX_HOT_TO_BLOB * max(blob_bytes, 1):
        raise bad(f"its pools claim {sum(pools)} hot bytes per page for blobs of {blob_bytes} bytes")
    if lifecycle not in lifecycles:
        raise bad(f"the page's layer group {lifecycle} is not among its lifecycles {sorted(lifecycles)}")
    for lc_id, lc in lifecycles.items():
        for j, b in enumerate(lc.get("buffers", [])):
            where = f"lifecycles[{lc_id}].buffers[{j}]"
            pool = count(b.get("pool_index"), f"{where}.pool_index")
            if pool >= len(pools):
                raise bad(f"{where}.pool_index is {pool}; there are {len(pools)} pools")
            end = count(b.get("byte_offset"), f"{where}.byte_offset") + count(b.get("bytes"), f"{where}.bytes")
            if end > pools[pool]:
                raise bad(f"{where} ends at byte {end} of a {pools[pool]}-byte slot")


_NP_DTYPES = {0: "uint8", 1: "int8", 2: "float16", 4: "float32", 7: "int32"}


def decode_manager_blob(layout: list, ident: dict, lifecycle: int, blob: Any) -> list[dict]:
    """Decodes a blob a KV-cache manager's disk level wrote, as that manager would: a CPU manager
    over the recorded layer groups and codec takes the blob into a host slot and onboards it;
    one row per pool (the hot page's bytes) and per buffer, as :func:`summarize`."""
    import numpy as np

    from ..kvcm_config import KVCacheConfig, LayerGroupConfig
    from ..layout import BufferDesc, BufferRole, DataType
    from ..manager import CacheLevel, KVCacheManager

    try:
        groups = [LayerGroupConfig([BufferDesc(int(b[0]), BufferRole(int(b[1])), bytes=int(b[3]), dtype=DataType(int(b[2])),
                                               tokens_per_page=int(b[4]), num_heads=int(b[5]), head_dim=int(b[6]))
                                    for b in group]) for group in layout]
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"region.json's layout is damaged: a layer group's buffer is malformed ({exc}); "
                         "refusing to decode") from None
    if not 0 <= lifecycle < len(groups):
        raise ValueError(f"region.json's layout is damaged: the page's layer group {lifecycle} is not among its "
                         f"{len(groups)} layer groups; refusing to decode")
    page = sum(b.bytes for b in groups[lifecycle].buffers)
    if page > MAX_HOT_TO_BLOB * max(blob.size, 1):
        raise ValueError(f"region.json's layout is damaged: its layer group {lifecycle} claims {page} hot bytes per "
                         f"page for blobs of {blob.size} bytes; refusing to decode")
    quota = 2 * len(groups) * (max(sum(b.bytes for b in g.buffers) for g in groups) + blob.size + 4096)
    config = KVCacheConfig(layer_groups=groups, gpu_quota=quota, host_quota=quota, device="cpu", auto_evict=False)
    manager = KVCacheManager(config, (ident["name"], ident["params"]))
    try:
        if manager.cold_page_bytes(lifecycle) != blob.size:
            raise ValueError(f"the recorded layer groups give {ident['name']!r} blobs of "
                             f"{manager.cold_page_bytes(lifecycle)} bytes for layer group {lifecycle}, but the "
                             f"region's slots hold {blob.size}: refusing to decode")
        [handle] = manager.allocate(lifecycle, 1)
        manager.evict([handle])
        manager.synchronize()
        manager.page_view(handle)[0][:] = blob
        result = manager.onboard([handle], source=CacheLevel.HOST)
        manager.synchronize()
        if result.moved != 1:
            raise ValueError(f"the codec did not decode the blob: {result.error or 'the page was dropped'}")
        pools = [np.array(v) for v in manager.page_view(handle, framework="numpy")]
        buffers = manager.buffer_layout(lifecycle)
    finally:
        manager.close()
    dict_layout = {"lifecycles": [{"lifecycle_id": lifecycle, "buffers": [
        {"layer_id": b.layer_id, "role": int(b.role), "pool_index": b.pool_index, "byte_offset": b.byte_offset,
         "bytes": b.bytes, "dtype": int(b.dtype)} for b in buffers]}]}
    return summarize(dict_layout, pools, lifecycle)


def summarize(layout: dict, pools: list, lifecycle: int) -> list[dict]:
    import numpy as np

    from ..disk import crc32c

    rows = []
    for i, p in enumerate(pools):
        rows.append({"pool": i, "bytes": int(p.size), "crc32c": "%08x" % crc32c(p), "head": p[:16].tobytes().hex()})
    for lc in layout["lifecycles"]:
        if lc["lifecycle_id"] != lifecycle:
            continue
        for b in lc["buffers"]:
            raw = pools[b["pool_index"]][b["byte_offset"]: b["byte_offset"] + b["bytes"]]
            row = {"layer": b["layer_id"], "role": ("K", "V", "other", "K+V")[b["role"]], "pool": b["pool_index"],
                   "bytes": b["bytes"]}
            if b["dtype"] == 3:  # bfloat16: the high half of a float32
                vals = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif b["dtype"] in _NP_DTYPES:
                vals = raw.view(_NP_DTYPES[b["dtype"]])
            else:
                vals = None
            if vals is not None and vals.size:
                with np.errstate(invalid="ignore"):
                    v = vals.astype(np.float64)
                finite = v[np.isfinite(v)]
                row["non_finite"] = int(v.size - finite.size)
                if finite.size:
                    row.update(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()))
            rows.append(row)
    return rows


def _print_region(info: dict) -> None:
    c, j = info["codec"], info["journal"]
    pct = 100.0 * info["slots_live"] / max(1, info["slots_total"])
    print(f"region {info['name']!r} at {info['path']}")
    print(f"  codec      {c['name']} format {c['format_version']} param_hash {c['param_hash']} params {json.dumps(c['params'])}")
    print(f"  slots      {info['slots_live']} / {info['slots_total']} live ({pct:.1f}%), {info['slot_bytes']} B "
          f"(stride {info['slot_stride']}), {info['containers']} containers x {info['slots_per_container']} slots, "
          f"{info['io']} I/O")
    snap = f"{j['snapshot_used']} (seq {j['snapshot_seq']}, {j['snapshot_entries']} pages)" if j["snapshot_used"] else "none"
    print(f"  snapshot   {snap}; backup {'present' if j['files']['index.snapshot.bak'] is not None else 'absent'}")
    print(f"  journal    {j['records_after_snapshot']} records after the snapshot, last seq {j['last_seq']}, "
          f"index.log {j['files']['index.log']} B, torn tail {j['truncated_tail_bytes']} B, "
          f"corrupt lines {j['corrupt_lines']}, recovered in {j['recovery_seconds'] * 1e3:.1f} ms")
    print(f"  layout     {'recorded (pages can be decoded)' if info['layout_recorded'] else 'not recorded'}")
    for w in info["warnings"]:
        print(f"  warning    {w}")
    for p in info.get("pages", []):
        print(f"  page       {p['key']} container {p['container']} slot {p['slot']} tag {p['tag']} seq {p['seq']}")


def _usage(message: str) -> int:
    print(f"kvcodec inspect: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.key and args.key_text:
        return _usage("give --key (hex) or --key-text, not both")
    if args.dump and not (args.key or args.key_text):
        return _usage("--dump writes the blob of one page; name it with --key or --key-text")
    key = None
    if args.key:
        try:
            key = bytes.fromhex(args.key)
        except ValueError:
            return _usage(f"--key {args.key!r} is not hex; use --key-text for a text key")
    elif args.key_text:
        key = args.key_text.encode()
    report: dict[str, Any] = {"regions": []}
    for path in find_regions(args.dir):
        info, region = describe(path, args.pages)
        try:
            wanted = args.region is None or os.path.basename(path.rstrip("/")) == args.region
            if key is not None and wanted and region_key(region, key) is not None:
                report["page"] = decode_page(region, key, args.dump)
                report["page"]["region"] = path
        finally:
            region.close()
        report["regions"].append(info)
    if key is not None and "page" not in report:
        raise LookupError(f"key {key.hex()} is in no region under {args.dir!r}")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for info in report["regions"]:
        _print_region(info)
    page = report.get("page")
    if page:
        print(f"page {page['key']} in {page['region']}: container {page['container']} slot {page['slot']} "
              f"tag {page['tag']} crc {page['crc']} checksum {page['checksum']}")
        if "error" in page:
            print(f"  {page['error']}")
            return 1
        if page.get("decoded") is None:
            print(f"  {page['note']}")
        for row in page.get("decoded") or []:
            print("  " + "  ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return 0
