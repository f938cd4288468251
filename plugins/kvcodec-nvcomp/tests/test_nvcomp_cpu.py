"""CPU reference of the nvCOMP codecs: registration, the LZ4 blocks against the python
``lz4`` package, the blob format read independently, slot_ratio edges and corruption."""

from __future__ import annotations

import json
import struct

import numpy as np
import nvcomp_blobs as blobs
import pytest
from nvcomp_blobs import fill, fresh_default_registry, numpy_layout, pairs, parse, plugin_ext  # noqa: F401

import kvcodec_sdk as kv

_ext = plugin_ext()

lz4_block = pytest.importorskip("lz4.block")

CPU_CODECS = ["nvcomp-lz4", "nvcomp-gdeflate"]
KINDS = ["random", "zeros", "runs", "kv"]


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def round_trip(name, params, layout, num_slots, rng):
    codec = kv.create_codec(name, params, device="cpu")
    codec.configure(layout.groups)
    cold_bytes = codec.cold_page_bytes(0)
    cold = np.full(cold_bytes * num_slots, 0xAB, dtype=np.uint8)
    src = rng.permutation(num_slots)
    dst = rng.permutation(num_slots)
    codec.encode(0, cold, pairs(dst, src))
    originals = [layout.page(s) for s in range(num_slots)]
    for p in layout.pools:
        p[:] = 0
    back = rng.permutation(num_slots)
    codec.decode(0, cold, pairs(back, dst))
    for hot_src, hot_back in zip(src, back):
        assert layout.page(hot_back) == originals[hot_src]
    return codec, cold, dst, src


# -- registration ------------------------------------------------------------------------------


def test_codecs_are_registered():
    specs = {s.name: s for s in kv.list_codecs()}
    for name in ("nvcomp-lz4", "nvcomp-ans", "nvcomp-gdeflate"):
        assert name in specs, name
        assert specs[name].lossless
        assert specs[name].format_version == _ext.FORMAT_VERSION == 1
    assert "cpu" in specs["nvcomp-lz4"].devices
    assert specs["nvcomp-ans"].devices == ("cuda",)


def test_ans_has_no_cpu_reference():
    with pytest.raises(ValueError, match="no cpu implementation"):
        kv.create_codec("nvcomp-ans", device="cpu")
    # The native factory refuses too, naming the reason.
    spec = kv.get_codec_spec("nvcomp-ans")
    from kvcodec_sdk import _native

    with pytest.raises(Exception, match="no CPU implementation"):
        _native.NativeCodec(spec.factory(), spec.params_json(None), -1)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"chunk_bytes": 100}, "chunk_bytes"),
        ({"chunk_bytes": 1000}, "multiple of 16"),
        ({"data_type": "bf16"}, "data_type"),
        ({"slot_ratio": -0.5}, "slot_ratio"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_parameters_name_the_field(params, match):
    # The schema refuses most; the native factory the rest (multiple of 16).
    with pytest.raises((kv.KvcodecError, ValueError), match=match):
        kv.create_codec("nvcomp-lz4", params, device="cpu")


def test_gdeflate_chunk_limit():
    with pytest.raises((kv.KvcodecError, ValueError), match="chunk_bytes"):
        kv.create_codec("nvcomp-gdeflate", {"chunk_bytes": 1 << 17}, device="cpu")


# -- LZ4 block coder vs the lz4 package -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [1, 12, 13, 100, 4096, 65536, 70001])
def test_lz4_blocks_cross_decode(kind, size, rng):
    data = fill(kind, rng, size).tobytes()
    ours = _ext.lz4_compress(data)
    assert lz4_block.decompress(ours, uncompressed_size=size) == data
    theirs = lz4_block.compress(data, store_size=False)
    assert _ext.lz4_decompress(theirs, size) == data
    if kind == "zeros" and size >= 4096:
        assert len(ours) < size // 50


def test_lz4_decoder_refuses_malformed_blocks(rng):
    data = fill("runs", rng, 8192).tobytes()
    block = bytearray(lz4_block.compress(data, store_size=False))
    assert _ext.lz4_decompress(bytes(block), len(data) - 1) is None  # too small a buffer
    truncated = _ext.lz4_decompress(bytes(block[:-3]), len(data))
    assert truncated is None or truncated != data  # a truncated block never yields the data
    for _ in range(200):  # random corruption: never a crash, never more than capacity
        bad = bytearray(block)
        bad[int(rng.integers(0, len(bad)))] ^= 1 << int(rng.integers(0, 8))
        out = _ext.lz4_decompress(bytes(bad), len(data))
        assert out is None or len(out) <= len(data)


# -- CRC-32C as the GPU computes it -----------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 1000, 4096, 65536 + 7])
@pytest.mark.parametrize("threads", [1, 4, 256])
def test_segmented_crc_matches_crc32c(size, threads, rng):
    data = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
    assert _ext.segmented_crc32c(data, threads) == blobs.crc32c(data)


@pytest.mark.parametrize("chunk_threads,page_threads", [(1, 1), (4, 8), (256, 128)])
@pytest.mark.parametrize("chunks", [0, 1, 7, 300])
def test_piece_crc_matches_crc32c(chunks, chunk_threads, page_threads, rng):
    """The blob checksum from pieces (header words, chunk segments, zero padding, runs of chunks
    combined in trees) equals the CRC-32C of the whole region."""
    header = 16 + 4 * chunks
    header += -header % 16
    stored = [int(s) for s in rng.integers(0, 5000, size=chunks)]
    if chunks:
        stored[0] = 16  # one chunk without padding
    parts = [rng.integers(0, 256, size=header, dtype=np.uint8).tobytes()]
    for s in stored:
        parts.append(rng.integers(0, 256, size=s, dtype=np.uint8).tobytes() + bytes(-s % 16))
    region = b"".join(parts)
    assert _ext.piece_crc32c(region, header, stored, chunk_threads, page_threads) == blobs.crc32c(region)


def test_piece_crc_rejects_a_region_of_the_wrong_size():
    with pytest.raises(ValueError, match="header_bytes 16"):
        _ext.piece_crc32c(bytes(40), 16, [20], 4, 4)


def test_crc_thread_counts_are_powers_of_two():
    """The kernels join equal pieces with operators from the power table: blocks of 2^k threads."""
    with pytest.raises(ValueError, match="threads is 3"):
        _ext.segmented_crc32c(b"123456789", 3)


def test_crc32c_check_value():
    assert blobs.crc32c(b"123456789") == 0xE3069283
    assert _ext.segmented_crc32c(b"123456789", 4) == 0xE3069283


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CPU_CODECS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "params",
    [{}, {"chunk_bytes": 4096}, {"data_type": "uint16", "bitshuffle": True, "chunk_bytes": 4096}],
    ids=["default", "4k", "u16-shuffle"],
)
def test_round_trip(name, kind, params, rng):
    slot_sizes = (6144, 4096 + 16, 130) if params.get("data_type") else (6144, 4097, 131)
    layout = numpy_layout(rng, slot_sizes, 6, kind)
    codec, cold, dst, _ = round_trip(name, params, layout, 6, rng)
    cb = codec.cold_page_bytes(0)
    for d in dst:
        assert blobs.check(cold[d * cb : (d + 1) * cb].tobytes()) == "ok"


def test_cold_size_is_the_worst_case_bound(rng):
    layout = numpy_layout(rng, (4097, 100), 2, "random")
    codec = kv.create_codec("nvcomp-lz4", {"chunk_bytes": 1024}, device="cpu")
    codec.configure(layout.groups)
    plan = blobs.chunk_plan((4097, 100), 1024)
    header = (48 + 4 * len(plan) + 15) // 16 * 16
    assert codec.cold_page_bytes(0) == header + sum((c[2] + 15) // 16 * 16 for c in plan)


@pytest.mark.parametrize("data_type,width,slot_sizes", [("uint8", 1, (8192, 2061)), ("uint16", 2, (8192, 2064)),
                                                      ("uint32", 4, (8192, 2084))], ids=["u8", "u16", "u32"])
def test_blob_layout_read_independently(rng, data_type, width, slot_sizes):
    """Every chunk of a CPU blob decodes with the lz4 package to the bit-shuffled raw chunk (the
    shuffle checked against numpy, for every element width; the last chunks have tails shorter
    than a group of 8 elements, which are stored unshuffled)."""
    layout = numpy_layout(rng, slot_sizes, 3, "kv")
    params = {"chunk_bytes": 2048, "data_type": data_type, "bitshuffle": True}
    codec = kv.create_codec("nvcomp-lz4", params, device="cpu")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    cold = np.zeros(cb * 3, dtype=np.uint8)
    codec.encode(0, cold, pairs([0, 1, 2], [0, 1, 2]))
    plan = blobs.chunk_plan(slot_sizes, 2048)
    for slot in range(3):
        blob = cold[slot * cb : (slot + 1) * cb].tobytes()
        b = parse(blob)
        assert (b.magic, b.version, b.raw_bytes) == (blobs.MAGIC, 1, sum(slot_sizes))
        assert (b.num_chunks, b.chunk_bytes, b.algorithm, b.element_bytes, b.bitshuffle) == (len(plan), 2048, 1, width, 1)
        assert b.flags in (blobs.COMPRESSED, blobs.STORED_RAW)
        compressed_any = False
        for (compressed, stored), (pool, off, nbytes) in zip(b.chunks(blob), plan):
            expect = blobs.bitshuffle(layout.pools[pool][slot, off : off + nbytes].tobytes(), width)
            got = lz4_block.decompress(stored, uncompressed_size=nbytes) if compressed else stored
            assert got == expect
            compressed_any |= compressed
        assert compressed_any == bool(b.flags & blobs.COMPRESSED)


def build_blob(layout, slot, chunk_bytes, cold_bytes) -> bytes:
    """A blob written entirely in Python with the lz4 package (no shuffle)."""
    slot_sizes = [p.shape[1] for p in layout.pools]
    plan = blobs.chunk_plan(slot_sizes, chunk_bytes)
    header = (48 + 4 * len(plan) + 15) // 16 * 16
    entries, payload = [], b""
    for pool, off, nbytes in plan:
        raw = layout.pools[pool][slot, off : off + nbytes].tobytes()
        comp = lz4_block.compress(raw, store_size=False, mode="high_compression")
        stored, flag = (comp, blobs.CHUNK_COMPRESSED) if len(comp) < nbytes else (raw, 0)
        entries.append(len(stored) | flag)
        payload += stored + b"\0" * ((-len(stored)) % 16)
    area = struct.pack("<IIBBBBI", len(plan), chunk_bytes, 1, 1, 0, 0, 0) + struct.pack(f"<{len(plan)}I", *entries)
    area += b"\0" * (header - 32 - len(area))
    body = area + payload
    head = struct.pack("<IHHIIQI", blobs.MAGIC, 1, blobs.COMPRESSED, header, len(payload), sum(slot_sizes), blobs.crc32c(body))
    blob = head + struct.pack("<I", blobs.crc32c(head)) + body
    assert len(blob) <= cold_bytes
    return blob + b"\0" * (cold_bytes - len(blob))


def test_lz4_package_blob_decodes(rng):
    layout = numpy_layout(rng, (8192, 1000), 2, "runs")
    codec = kv.create_codec("nvcomp-lz4", {"chunk_bytes": 4096}, device="cpu")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    cold = np.frombuffer(b"".join(build_blob(layout, s, 4096, cb) for s in range(2)), dtype=np.uint8).copy()
    expect = [layout.page(s) for s in range(2)]
    for p in layout.pools:
        p[:] = 7
    codec.decode(0, cold, pairs([1, 0], [0, 1]))
    assert layout.page(1) == expect[0] and layout.page(0) == expect[1]


# -- slot_ratio edges ---------------------------------------------------------------------------


def test_slot_ratio_edges(rng):
    size = 8192
    layout = numpy_layout(rng, (size,), 2, "random")
    layout.pools[0][1] = 0  # slot 1 compresses, slot 0 does not
    # Smaller than the header: refused at configure, naming the smallest usable ratio.
    tiny = kv.create_codec("nvcomp-lz4", {"slot_ratio": 0.001}, device="cpu")
    with pytest.raises(kv.KvcodecError, match="smallest usable slot_ratio"):
        tiny.configure(layout.groups)
    codec = kv.create_codec("nvcomp-lz4", {"slot_ratio": 0.25}, device="cpu")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    assert cb == size // 4
    cold = np.zeros(cb * 2, dtype=np.uint8)
    codec.encode(0, cold, pairs([0, 1], [0, 1]))
    assert blobs.check(cold[:cb].tobytes()) == "did not fit"
    assert parse(cold[:cb].tobytes()).flags == blobs.DID_NOT_FIT
    assert blobs.check(cold[cb:].tobytes()) == "ok"
    before = layout.pools[0].copy()
    with pytest.raises(kv.CodecCallError, match="did not fit"):
        codec.decode(0, cold, pairs([1, 0], [0, 1]))
    assert np.array_equal(layout.pools[0], before), "a failed decode wrote a hot page"
    zeros = layout.page(1)
    layout.pools[0][1] = 9
    codec.decode(0, cold, pairs([1], [1]))
    assert layout.page(1) == zeros


def test_slot_ratio_exactly_at_the_bound_fits_everything(rng):
    layout = numpy_layout(rng, (4096,), 2, "random")
    bound = kv.create_codec("nvcomp-lz4", device="cpu")
    bound.configure(layout.groups)
    ratio = bound.cold_page_bytes(0) / 4096
    codec = kv.create_codec("nvcomp-lz4", {"slot_ratio": ratio}, device="cpu")
    codec.configure(layout.groups)
    assert codec.cold_page_bytes(0) == bound.cold_page_bytes(0)
    cold = np.zeros(codec.cold_page_bytes(0) * 2, dtype=np.uint8)
    codec.encode(0, cold, pairs([0, 1], [0, 1]))
    cb = codec.cold_page_bytes(0)
    for s in range(2):
        blob = cold[s * cb : (s + 1) * cb].tobytes()
        assert blobs.check(blob) == "ok"
        assert parse(blob).flags == blobs.STORED_RAW  # random data: every chunk raw


def test_uint16_needs_even_slots(rng):
    layout = numpy_layout(rng, (4097,), 2, "random")
    codec = kv.create_codec("nvcomp-lz4", {"data_type": "uint16"}, device="cpu")
    with pytest.raises(kv.KvcodecError, match="slotBytes 4097"):
        codec.configure(layout.groups)


# -- corruption ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CPU_CODECS)
def test_corrupted_blobs_are_refused(name, rng):
    layout = numpy_layout(rng, (8192, 1024), 1, "kv")
    codec = kv.create_codec(name, {"chunk_bytes": 2048}, device="cpu")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    cold = np.zeros(cb, dtype=np.uint8)
    codec.encode(0, cold, pairs([0], [0]))
    used = parse(cold.tobytes()).header_bytes + parse(cold.tobytes()).payload_bytes
    original = layout.page(0)
    positions = sorted({0, 4, 10, 28, 30, 32, 40, 48, 52, used // 2, used - 1} | set(rng.integers(0, used, 20).tolist()))
    for pos in positions:
        bad = cold.copy()
        bad[pos] ^= 0x10
        assert blobs.check(bad.tobytes()) != "ok"
        for p in layout.pools:
            p[:] = 0x55
        with pytest.raises(kv.CodecCallError):
            codec.decode(0, bad, pairs([0], [0]))
        assert all((p == 0x55).all() for p in layout.pools), f"corruption at byte {pos} wrote a hot page"
    codec.decode(0, cold, pairs([0], [0]))
    assert layout.page(0) == original


# -- CUDA workspace sizing (host-side planner; no device needed) -------------------------------

MANY_PAGES = ([[32, 32]], [100_001])  # the conformance suite's many-pages layout


@pytest.mark.parametrize("algorithm", ["lz4", "gdeflate", "ans"])
def test_workspace_of_tiny_slots_is_sized_from_the_real_chunks(algorithm):
    w = _ext.workspace_plan(algorithm, "{}", *MANY_PAGES)
    assert w["max_chunk_bytes"] == 32
    assert w["chunk_stride"] < 65536
    assert 2 <= w["max_chunks_per_batch"] <= 65536
    assert w["max_chunks_per_batch"] == 2 * w["max_pages_per_batch"]
    assert max(w["compress_temp_bytes"], w["decompress_temp_bytes"]) <= w["temp_budget_bytes"]
    # Configure used to ask for 72 GB (gdeflate temp) and 18 GB (ans staging) here.
    assert w["device_bytes"] < 2 << 30, w


@pytest.mark.parametrize("algorithm", ["lz4", "gdeflate", "ans"])
def test_workspace_of_full_chunks_keeps_max_batch_bytes(algorithm):
    w = _ext.workspace_plan(algorithm, "{}", [[65536, 65536]], [4096])
    assert w["max_chunk_bytes"] == 65536 and w["chunk_stride"] == 65536
    assert w["max_pages_per_batch"] == (64 << 20) // (2 * 65536)
    small = _ext.workspace_plan(algorithm, json.dumps({"chunk_bytes": 4096}), [[1000, 20000]], [10])
    assert small["max_chunk_bytes"] == 4096
    assert small["max_pages_per_batch"] == 10  # the pool's slots


def test_workspace_caps_chunks_per_batch():
    # 1 GiB batches of 256-byte chunks would be 4M chunks; the cap keeps 65536.
    w = _ext.workspace_plan("ans", json.dumps({"chunk_bytes": 256, "max_batch_bytes": 1 << 30}), [[65536]], [100_000])
    assert w["max_chunks_per_batch"] <= 65536
    assert w["max_pages_per_batch"] == 65536 // 256


def test_workspace_plan_rejects_what_configure_rejects():
    with pytest.raises(ValueError, match="chunk_bytes"):
        _ext.workspace_plan("lz4", json.dumps({"chunk_bytes": 17}), *MANY_PAGES)
    with pytest.raises(ValueError, match="num_slots"):
        _ext.workspace_plan("lz4", "{}", [[32]], [])
