"""Checked decode (plugin ABI 2) of the CPU reference: one PageStatus per page, bad blobs are
statuses and not failed calls, and a bad page's neighbours still decode."""

from __future__ import annotations

import numpy as np
import nvcomp_blobs as blobs
import pytest
from nvcomp_blobs import fill, fresh_default_registry, numpy_layout, pairs, plugin_ext  # noqa: F401

import kvcodec_sdk as kv

plugin_ext()

CPU_CODECS = ["nvcomp-lz4", "nvcomp-gdeflate"]
#: Pools 0 and 1 compress (pool 1 ends in a shorter chunk), pool 2 is stored raw.
SLOTS = (8192, 3008, 4096)
PARAMS = [{"chunk_bytes": 2048}, {"chunk_bytes": 2048, "data_type": "uint16", "bitshuffle": True}]
PARAM_IDS = ["plain", "u16-shuffle"]
FILLER = 0x5A
UNWRITTEN = 0xEE


def checked_layout(rng, num_slots):
    layout = numpy_layout(rng, SLOTS, num_slots, "runs")
    layout.pools[2][:] = fill("random", rng, SLOTS[2] * num_slots).reshape(num_slots, SLOTS[2])
    return layout


def encoded(name, params, layout, n):
    """A configured CPU codec and the (n, cold bytes) blobs of hot slots 0..n-1."""
    codec = kv.create_codec(name, params, device="cpu")
    codec.configure(layout.groups)
    assert codec.has_checked_decode
    cold = np.zeros((n, codec.cold_page_bytes(0)), dtype=np.uint8)
    codec.encode(0, cold, pairs(range(n), range(n)))
    return codec, cold


def raw_sizes(params):
    return [c[2] for c in blobs.chunk_plan(SLOTS, params["chunk_bytes"])]


def test_damage_covers_every_blob_status():
    assert set(blobs.DAMAGE.values()) == {int(s) for s in kv.PageStatus} - {int(kv.PageStatus.BAD_INDEX)}


@pytest.mark.parametrize("name", CPU_CODECS)
@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
def test_status_per_page_and_neighbours_decode(name, params):
    rng = np.random.default_rng(5)
    kinds = blobs.with_good_neighbours([k for k in blobs.DAMAGE if k != "good"])
    n = len(kinds)
    layout = checked_layout(rng, n + 1)  # slot n: the target of a pair with a bad cold index
    codec, cold = encoded(name, params, layout, n)
    originals = [layout.page(s) for s in range(n + 1)]
    expect = blobs.damage_pages(cold, kinds, raw_sizes(params))
    for p in layout.pools:
        p[:] = FILLER
    # Blob s into hot slot n-1-s; then a hot index past the pools and a negative cold index.
    dst = [n - 1 - s for s in range(n)] + [n + 1, n]
    src = list(range(n)) + [0, -1]
    status = np.full(n + 2, UNWRITTEN, dtype=np.uint8)
    codec.decode_checked(0, cold, pairs(dst, src), status)
    assert status.tolist() == expect + [kv.PageStatus.BAD_INDEX] * 2, list(zip(kinds, status.tolist()))
    filler = bytes([FILLER]) * len(originals[0])
    for s, kind in enumerate(kinds):
        want = originals[s] if expect[s] == kv.PageStatus.OK else filler
        assert layout.page(dst[s]) == want, f"page {s} ({kind})"
    assert layout.page(n) == filler, "a pair with a bad cold index wrote its hot slot"


@pytest.mark.parametrize("name", CPU_CODECS)
@pytest.mark.parametrize("kind, reason", [("payload", "checksum mismatch"), ("decode", "chunk 0 does not decompress"),
                                          ("table", "chunk 0 table entry is invalid")])
def test_plain_decode_still_refuses_the_call(name, kind, reason):
    """decode() is unchanged: one bad blob fails the call, naming the page and the reason, and
    no hot page is written."""
    rng = np.random.default_rng(6)
    params = PARAMS[0]
    layout = checked_layout(rng, 3)
    codec, cold = encoded(name, params, layout, 3)
    originals = [layout.page(s) for s in range(3)]
    intact = cold.copy()
    blobs.damage_pages(cold, ["good", kind, "good"], raw_sizes(params))
    for p in layout.pools:
        p[:] = FILLER
    with pytest.raises(kv.CodecCallError, match=rf"pageIndices\[1\] \(cold slot 1\): .*{reason}.*no hot page was written"):
        codec.decode(0, cold, pairs(range(3), range(3)))
    assert all((p == FILLER).all() for p in layout.pools)
    codec.decode(0, intact, pairs(range(3), range(3)))
    assert [layout.page(s) for s in range(3)] == originals


@pytest.mark.parametrize("name", CPU_CODECS)
def test_random_bit_flips(name):
    """Any single flipped bit inside a blob's used bytes is a status of magic, header or
    checksum, never OK or a decode failure; the intact pages of the call decode."""
    rng = np.random.default_rng(8)
    params = PARAMS[0]
    layout = checked_layout(rng, 3)
    codec, cold = encoded(name, params, layout, 3)
    originals = [layout.page(s) for s in range(3)]
    h = blobs.parse(cold[1].tobytes())
    used = h.header_bytes + h.payload_bytes
    positions = sorted({0, 3, 4, 6, 8, 12, 16, 24, 28, 31, 32, 36, 40, 48, 52, used - 1}
                       | set(rng.integers(0, used, 40).tolist()))
    good = cold[1].copy()
    for pos in positions:
        cold[1] = good
        cold[1, pos] ^= 1 << int(rng.integers(0, 8))
        for p in layout.pools:
            p[:] = FILLER
        status = np.full(3, UNWRITTEN, dtype=np.uint8)
        codec.decode_checked(0, cold, pairs(range(3), range(3)), status)
        assert status[0] == 0 and status[2] == 0, (pos, status)
        assert status[1] in (kv.PageStatus.BAD_MAGIC, kv.PageStatus.BAD_HEADER, kv.PageStatus.BAD_CHECKSUM), (pos, status)
        assert layout.page(0) == originals[0] and layout.page(2) == originals[2], pos


def test_did_not_fit_from_encode():
    rng = np.random.default_rng(9)
    layout = numpy_layout(rng, (8192,), 2, "random")
    layout.pools[0][1] = 0  # slot 1 compresses, slot 0 does not fit a quarter page
    codec = kv.create_codec("nvcomp-lz4", {"slot_ratio": 0.25}, device="cpu")
    codec.configure(layout.groups)
    cold = np.zeros(codec.cold_page_bytes(0) * 2, dtype=np.uint8)
    codec.encode(0, cold, pairs([0, 1], [0, 1]))
    layout.pools[0][:] = FILLER
    status = np.full(2, UNWRITTEN, dtype=np.uint8)
    codec.decode_checked(0, cold, pairs([0, 1], [0, 1]), status)
    assert status.tolist() == [kv.PageStatus.DID_NOT_FIT, kv.PageStatus.OK]
    assert (layout.pools[0][0] == FILLER).all() and (layout.pools[0][1] == 0).all()


@pytest.mark.parametrize("name", CPU_CODECS)
def test_statuses_of_a_call_spanning_decode_windows(name):
    """The CPU reference decodes 1024 pages at a time: statuses land at their pages' positions
    in every window."""
    rng = np.random.default_rng(10)
    n = 2100
    layout = numpy_layout(rng, (64, 48), n, "runs")
    codec = kv.create_codec(name, {}, device="cpu")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    cold = np.zeros((n, cb), dtype=np.uint8)
    codec.encode(0, cold, pairs(range(n), range(n)))
    originals = [layout.page(s) for s in range(n)]
    bad = {3: "magic", 1023: "payload", 1024: "version", 1500: "did-not-fit", 2047: "header-crc", 2099: "payload"}
    kinds = [bad.get(s, "good") for s in range(n)]
    expect = blobs.damage_pages(cold, kinds, [64, 48])
    for p in layout.pools:
        p[:] = FILLER
    perm = rng.permutation(n)
    status = np.full(n, UNWRITTEN, dtype=np.uint8)
    codec.decode_checked(0, cold, pairs(perm, range(n)), status)
    assert status.tolist() == expect
    for s in range(n):
        if s not in bad:
            assert layout.page(perm[s]) == originals[s], s
        else:
            assert layout.page(perm[s]) == bytes([FILLER]) * 112, s


def test_checked_decode_arguments():
    rng = np.random.default_rng(11)
    layout = checked_layout(rng, 2)
    codec, cold = encoded("nvcomp-lz4", PARAMS[0], layout, 2)
    codec.decode_checked(0, cold, pairs([], []), np.zeros(0, dtype=np.uint8))  # empty: nothing to do
    with pytest.raises(kv.CodecCallError, match="unknown lifecycle 7"):
        codec.decode_checked(7, cold, pairs([0], [0]), np.zeros(1, dtype=np.uint8))
    with pytest.raises(kv.CodecCallError, match="pageStatus is null"):
        codec.decode_checked(0, cold, pairs([0], [0]), 0)
