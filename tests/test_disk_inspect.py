"""``kvcodec inspect``: region summary, journal state and decoding one page on the CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvcodec_sdk as kv
from kvcodec_sdk.cli import main
from kvcodec_sdk.disk import CodecIdentity, DiskRegion, crc32c, layout_of


def hot_group(pools):
    bufs = (kv.BufferDesc(0, kv.Role.KEY, 0, 0, pools[0].nbytes, kv.DType.FLOAT16, 16, 2, 64),
            kv.BufferDesc(0, kv.Role.VALUE, 1, 0, pools[1].nbytes, kv.DType.BFLOAT16, 16, 2, 64))
    return kv.PoolGroupDesc([kv.PoolDesc(p.ctypes.data, p.nbytes, 1) for p in pools],
                            [kv.LifeCycleDesc(0, bufs)])


def sealed(meta: dict) -> str:
    """region.json text for `meta` with a matching checksum (what the store writes)."""
    numeric = {"format", "slot_bytes", "slot_stride", "container_bytes", "slots_per_container", "containers",
               "codec_format_version"}

    def text(fields):
        body = ",\n".join(f"  {json.dumps(k)}: {v if k in numeric else json.dumps(v)}" for k, v in sorted(fields.items()))
        return "{\n" + body + "\n}\n"

    fields = {k: v for k, v in meta.items() if k != "crc32c"}
    return text(dict(fields, crc32c="%08x" % crc32c(text(fields).encode())))


def test_inspect_summarizes_and_decodes_a_page(tmp_path, capsys):
    rng = np.random.default_rng(0)
    pools = [rng.integers(0, 256, 4096, dtype=np.uint8), rng.integers(0, 256, 4096, dtype=np.uint8)]
    pools[0].view(np.float16)[:] = rng.standard_normal(2048).astype(np.float16)
    group = hot_group(pools)
    with kv.create_codec("concat", device="cpu") as codec:
        codec.configure([group])
        blob = np.zeros(codec.cold_page_bytes(0), dtype=np.uint8)
        codec.encode(0, blob.ctypes.data, np.array([[0, 0]], dtype=np.int32))
        identity = CodecIdentity.from_codec(codec, layout=layout_of(group))
    root = tmp_path / "tier"
    with DiskRegion(root / "group0", slot_bytes=blob.nbytes, max_bytes=1 << 20, codec=identity,
                    layout=layout_of(group), snapshot_every=0) as r:
        r.put("page-a", blob, tag=0)
        r.put("page-b", blob[::-1].copy(), tag=0)
    with DiskRegion(root / "group1", slot_bytes=4096, max_bytes=1 << 20) as r:
        r.put("other", bytes(4096))

    assert main(["inspect", str(root)]) == 0
    text = capsys.readouterr().out
    assert "region 'group0'" in text and "region 'group1'" in text
    assert "2 / 128 live" in text and "codec      concat format 1" in text

    assert main(["inspect", str(root), "--key-text", "page-a", "--json", "--pages", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    g0 = report["regions"][0]
    assert g0["slots_live"] == 2 and g0["codec"]["param_hash"] == identity.param_hash
    assert g0["journal"]["snapshot_used"] == "index.snapshot" and g0["pages"][0]["key"] == b"page-a".hex()
    page = report["page"]
    assert page["checksum"] == "ok" and page["tag"] == 0
    decoded = page["decoded"]
    assert decoded[0]["crc32c"] == "%08x" % crc32c(pools[0])
    assert decoded[1]["crc32c"] == "%08x" % crc32c(pools[1])
    k_row = decoded[2]
    assert k_row["role"] == "K" and k_row["min"] == pytest.approx(float(pools[0].view(np.float16).min()))


def test_inspect_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:  # a folder argument that names no folder: usage
        main(["inspect", str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no disk region under" in capsys.readouterr().err
    with DiskRegion(tmp_path / "r", slot_bytes=4096, max_bytes=1 << 20) as r:
        r.put("a", bytes(4096))
    assert main(["inspect", str(tmp_path / "r"), "--key", "zz"]) == 2  # a bad option value: usage
    assert "is not hex" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "r"), "--key", "00"]) == 1
    assert "key 00 is in no region" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "r"), "--key-text", "a"]) == 0
    assert "no layout recorded" in capsys.readouterr().out


@pytest.mark.parametrize("damage,message", [
    (lambda lay: lay["pools"][0].update(slot_bytes=1 << 30), "claim 1073745920 hot bytes per page"),
    (lambda lay: lay["pools"][0].update(slot_bytes=1024), "ends at byte 4096 of a 1024-byte slot"),
    (lambda lay: lay["lifecycles"][0]["buffers"][1].update(pool_index=7), "pool_index is 7; there are 2 pools"),
    (lambda lay: lay["lifecycles"][0].update(lifecycle_id=3), "layer group 0 is not among its lifecycles"),
    (lambda lay: lay["pools"].append({"slot_bytes": 64}), "blobs of 8256 bytes"),
])
def test_inspect_validates_the_recorded_layout_before_decoding(tmp_path, capsys, damage, message):
    """The layout in region.json is checked against the blob before anything is allocated or
    decoded (before: a layout claiming larger pools made the CPU codec read past the blob and
    segfault; a 1 GiB claim allocated it)."""
    pools = [np.zeros(4096, np.uint8), np.ones(4096, np.uint8)]
    group = hot_group(pools)
    with kv.create_codec("concat", device="cpu") as codec:
        codec.configure([group])
        blob = np.zeros(codec.cold_page_bytes(0), dtype=np.uint8)
        identity = CodecIdentity.from_codec(codec, layout=layout_of(group))
    with DiskRegion(tmp_path / "g0", slot_bytes=blob.nbytes, max_bytes=1 << 20, codec=identity,
                    layout=layout_of(group)) as r:
        r.put("a", blob, tag=0)
    meta_path = tmp_path / "g0" / "region.json"
    meta = json.loads(meta_path.read_text())
    layout = json.loads(meta["layout"])
    damage(layout)
    meta["layout"] = json.dumps(layout, sort_keys=True, separators=(",", ":"))
    meta_path.write_text(sealed(meta))  # a hostile file with a valid checksum, not mere damage
    assert main(["inspect", str(tmp_path / "g0"), "--key-text", "a"]) == 1
    err = capsys.readouterr().err
    assert message in err and ("layout is damaged" in err or "does not belong to these blobs" in err), err


@pytest.mark.parametrize("codec", ["concat", "fp8"])
def test_inspect_finds_and_decodes_a_page_a_manager_wrote(tmp_path, capsys, codec):
    """The key given to set_keys finds the page (the manager stores it behind its prefix) and the
    blob decodes with the manager's recorded layer groups: exact for concat, within fp8's error."""
    bufs = [kv.BufferDesc(0, role, bytes=16 * 2 * 64 * 2, dtype=kv.DataType.BFLOAT16, tokens_per_page=16,
                          num_heads=2, head_dim=64) for role in (kv.BufferRole.KEY, kv.BufferRole.VALUE)]
    config = kv.KVCacheConfig(layer_groups=[kv.LayerGroupConfig(bufs)], gpu_quota=1 << 20, host_quota=1 << 20,
                              device="cpu", disk=kv.DiskTierConfig(str(tmp_path / "kv"), max_bytes=16 << 20,
                                                                   container_bytes=8 << 20))
    m = kv.KVCacheManager(config, codec)
    pages = m.allocate(0, 2)
    rng = np.random.default_rng(5)
    written = []
    for page in pages:
        for view in m.buffer_views(page, framework="numpy"):
            values = rng.standard_normal(view.size).astype(np.float32)
            view[...] = (values.view(np.uint32) >> 16).astype(np.uint16).reshape(view.shape).view(view.dtype)
            written.append((values.view(np.uint32) >> 16 << 16).view(np.float32))
    original = bytes(np.concatenate([np.array(v) for v in m.page_view(pages[1], framework="numpy")]))
    m.set_keys(pages, ["alpha", "beta"])
    assert m.evict(pages, level=kv.CacheLevel.DISK).moved == 2
    m.synchronize()
    m.close()
    assert main(["inspect", str(tmp_path / "kv"), "--key-text", "beta", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)["page"]
    assert page["key"] == (b"k" + b"beta").hex() and page["checksum"] == "ok"
    pool, k, v = page["decoded"]
    assert pool["bytes"] == len(original)
    if codec == "concat":
        assert pool["crc32c"] == "%08x" % crc32c(np.frombuffer(original, np.uint8))
    for row, want in ((k, written[2]), (v, written[3])):
        assert row["role"] == ("K" if row is k else "V") and row["non_finite"] == 0
        for stat, got in (("min", want.min()), ("max", want.max()), ("mean", want.mean())):
            assert row[stat] == pytest.approx(float(got), abs=0.0 if codec == "concat" else 0.1), stat
    assert main(["inspect", str(tmp_path / "kv"), "--key-text", "gamma"]) == 1
    assert "is in no region" in capsys.readouterr().err
