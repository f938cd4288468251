"""CUDA implementation of the nvCOMP codecs: round trips, interchangeability with the CPU
reference and the lz4 package, slot_ratio edges, corruption, asynchrony and checked decode
(a PageStatus per page, in device or mapped pinned memory, agreeing with the CPU reference).

Every test carries the ``gpu`` marker and skips cleanly without a CUDA device and torch.
"""

from __future__ import annotations

import numpy as np
import nvcomp_blobs as blobs
import pytest
from nvcomp_blobs import fill, fresh_default_registry, pairs, parse, plugin_ext  # noqa: F401

import kvcodec_sdk as kv
from kvcodec_sdk.testing.support import cuda_test_module

_ext = plugin_ext()

torch, pytestmark = cuda_test_module()
lz4_block = pytest.importorskip("lz4.block")

GPU_CODECS = ["nvcomp-lz4", "nvcomp-ans", "nvcomp-gdeflate"]
KINDS = ["random", "zeros", "runs", "kv"]
SETTINGS = [
    {},
    {"chunk_bytes": 4096},
    {"data_type": "uint16", "bitshuffle": True},
    {"data_type": "uint16"},
]
SETTING_IDS = ["default", "4k", "u16-shuffle", "u16"]


@pytest.fixture
def stream():
    return torch.cuda.Stream()


class GpuLayout:
    """Hot pools on the GPU filled with `kind` data; one group, lifecycle 0."""

    def __init__(self, slot_sizes, num_slots, kind, seed=1):
        rng = np.random.default_rng(seed)
        self.pools = [
            torch.from_numpy(fill(kind, rng, s * num_slots).reshape(num_slots, s).copy()).cuda() for s in slot_sizes
        ]
        self.groups = [
            kv.PoolGroupDesc(
                pools=[kv.PoolDesc(p.data_ptr(), p.shape[1], num_slots) for p in self.pools],
                lifecycles=[kv.LifeCycleDesc(0)],
            )
        ]
        torch.cuda.synchronize()  # the copies ran on torch's stream; codec calls use others

    def page(self, slot):
        return b"".join(p[slot].cpu().numpy().tobytes() for p in self.pools)

    def fill_(self, value, stream=None):
        """Overwrites every slot. With `stream`, ordered on it (after work already queued
        there); without, finished before returning, so no queued codec call races it."""
        if stream is None:
            for p in self.pools:
                p.fill_(value)
            torch.cuda.synchronize()
            return
        with torch.cuda.stream(stream):
            for p in self.pools:
                p.fill_(value)


def assert_pages(layout, slots, expect, what="decoded page"):
    """Hot slots `slots` hold the byte strings `expect`; reports the first differing page and
    byte offset instead of handing pytest large sequences to diff."""
    assert len(slots) == len(expect)
    for i, (s, want) in enumerate(zip(slots, expect)):
        got = layout.page(s)
        if got != want:
            at = next((b for b, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            pytest.fail(f"{what} {i} (hot slot {s}) differs at byte {at} of {len(want)}")


def assert_blobs(got, expect, what="blob"):
    """Like assert_pages for lists of blobs."""
    assert len(got) == len(expect)
    for i, (g, e) in enumerate(zip(got, expect)):
        if g != e:
            at = next((b for b, (x, y) in enumerate(zip(g, e)) if x != y), min(len(g), len(e)))
            pytest.fail(f"{what} {i} differs at byte {at} of {len(e)}")


def dev_pairs(dst, src):
    return torch.from_numpy(pairs(dst, src)).cuda()


def encode_decode(name, params, layout, n, stream, *, pinned=True):
    codec = kv.create_codec(name, params, device="cuda")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    cold = torch.full((n, cb), 0xAB, dtype=torch.uint8)
    cold = cold.pin_memory() if pinned else cold.cuda()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    originals = [layout.page(s) for s in range(n)]
    with torch.cuda.stream(stream):
        codec.encode(0, cold, dev_pairs(perm, torch.arange(n)), stream=stream)
    stream.synchronize()
    blobs_out = [cold[perm[s]].cpu().numpy().tobytes() for s in range(n)]
    layout.fill_(0)
    codec.decode(0, cold, dev_pairs(torch.arange(n), perm), stream=stream)
    stream.synchronize()
    assert_pages(layout, range(n), originals)
    return codec, blobs_out, originals


@pytest.mark.parametrize("name", GPU_CODECS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
def test_round_trip(name, kind, params, pinned, stream):
    # Device blobs are decoded in place except for chunks near the slot's end (a full blob of
    # random data has both kinds in one page); host blobs are staged.
    layout = GpuLayout((65536, 32768, 4096 + 32), 12, kind)
    _, out, _ = encode_decode(name, params, layout, 12, stream, pinned=pinned)
    for blob in out:
        assert blobs.check(blob) == "ok"
        if kind == "zeros":
            assert parse(blob).flags == blobs.COMPRESSED
        if kind == "random":
            assert parse(blob).flags == blobs.STORED_RAW


@pytest.mark.parametrize("name", ["nvcomp-lz4", "nvcomp-ans"])
def test_odd_layout_uses_staging(name, stream):
    # Slots of odd sizes: chunk pointers are unaligned, so both directions stage.
    layout = GpuLayout((4097, 131, 70001), 6, "runs")
    encode_decode(name, {"chunk_bytes": 4096}, layout, 6, stream, pinned=False)


@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
def test_batches_larger_than_the_workspace(pinned, stream):
    # Blobs in host memory are cut into at least four batches, blobs in device memory into the
    # largest batches: both exceed a workspace of five pages here.
    layout = GpuLayout((65536,), 40, "kv")
    encode_decode("nvcomp-ans", {"max_batch_bytes": 5 * 65536, "data_type": "uint16"}, layout, 40, stream, pinned=pinned)


@pytest.mark.parametrize("name", ["nvcomp-lz4", "nvcomp-gdeflate"])
@pytest.mark.parametrize("params", [{}, {"data_type": "uint16", "bitshuffle": True, "chunk_bytes": 8192}], ids=["plain", "u16-shuffle"])
def test_gpu_and_cpu_blobs_are_interchangeable(name, params, stream):
    n = 5
    layout = GpuLayout((16384, 8192), n, "kv")
    gpu, gpu_blobs, originals = encode_decode(name, params, layout, n, stream)
    cb = gpu.cold_page_bytes(0)
    # GPU blobs decode on the CPU reference.
    host_pools = [p.cpu().numpy().copy() for p in layout.pools]
    cpu = kv.create_codec(name, params, device="cpu")
    cpu.configure(
        [kv.PoolGroupDesc([kv.PoolDesc(h.ctypes.data, h.shape[1], n) for h in host_pools], [kv.LifeCycleDesc(0)])]
    )
    assert cpu.cold_page_bytes(0) == cb
    cold = np.frombuffer(b"".join(gpu_blobs), dtype=np.uint8).copy()
    for h in host_pools:
        h[:] = 0
    cpu.decode(0, cold, pairs(range(n), range(n)))
    assert_blobs([b"".join(h[s].tobytes() for h in host_pools) for s in range(n)], originals, "CPU-decoded page")
    # CPU blobs decode on the GPU.
    cpu_cold = np.zeros(n * cb, dtype=np.uint8)
    cpu.encode(0, cpu_cold, pairs(range(n), range(n)))
    layout.fill_(0)
    gpu.decode(0, torch.from_numpy(cpu_cold).pin_memory(), dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    assert_pages(layout, range(n), originals)


def test_gpu_lz4_chunks_decode_with_the_lz4_package(stream):
    n = 4
    slot_sizes = (65536, 12288)
    layout = GpuLayout(slot_sizes, n, "runs")
    params = {"chunk_bytes": 16384, "data_type": "uint16", "bitshuffle": True}
    _, out, originals = encode_decode("nvcomp-lz4", params, layout, n, stream)
    plan = blobs.chunk_plan(slot_sizes, 16384)
    offsets = np.cumsum([0, *slot_sizes])
    compressed = 0
    for s, blob in enumerate(out):
        b = parse(blob)
        for (is_comp, stored), (pool, off, nbytes) in zip(b.chunks(blob), plan):
            start = offsets[pool] + off
            expect = blobs.bitshuffle(originals[s][start : start + nbytes], 2)
            got = lz4_block.decompress(stored, uncompressed_size=nbytes) if is_comp else stored
            assert_blobs([got], [expect], f"chunk at {start} of page {s}")
            compressed += is_comp
    assert compressed > 0


def test_lz4_package_blobs_decode_on_the_gpu(stream):
    from test_nvcomp_cpu import build_blob  # the same Python-built blob as the CPU test

    n = 3
    layout = GpuLayout((8192, 1000), n, "runs")
    codec = kv.create_codec("nvcomp-lz4", {"chunk_bytes": 4096}, device="cuda")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)

    class HostView:
        def __init__(self, pools):
            self.pools = pools

    host = HostView([p.cpu().numpy() for p in layout.pools])
    cold = np.frombuffer(b"".join(build_blob(host, s, 4096, cb) for s in range(n)), dtype=np.uint8).copy()
    expect = [layout.page(s) for s in range(n)]
    layout.fill_(3)
    codec.decode(0, torch.from_numpy(cold).pin_memory(), dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    assert_pages(layout, range(n), expect)


def half_slot_codec(name):
    """Four random 64 KiB pages, pages 1 and 3 zeroed (they compress; the others do not fit), and a
    CUDA codec at slot_ratio 0.5 configured on them: (n, layout, codec)."""
    n = 4
    layout = GpuLayout((65536,), n, "random")
    layout.pools[0][1].zero_()
    layout.pools[0][3].zero_()
    torch.cuda.synchronize()  # torch's stream zeroed them; the encode runs on another stream
    codec = kv.create_codec(name, {"slot_ratio": 0.5}, device="cuda")
    codec.configure(layout.groups)
    return n, layout, codec


@pytest.mark.parametrize("name", ["nvcomp-lz4", "nvcomp-ans"])
def test_slot_ratio_did_not_fit(name, stream):
    n, layout, codec = half_slot_codec(name)
    cb = codec.cold_page_bytes(0)
    assert cb == 32768
    cold = torch.zeros((n, cb), dtype=torch.uint8).pin_memory()
    codec.encode(0, cold, dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    status = [blobs.check(cold[s].numpy().tobytes()) for s in range(n)]
    assert status == ["did not fit", "ok", "did not fit", "ok"]
    before = [layout.page(s) for s in range(n)]
    layout.pools[0][1].fill_(9)
    layout.pools[0][3].fill_(9)
    torch.cuda.synchronize()  # the fills ran on torch's stream, the decode runs on `stream`
    codec.decode(0, cold, dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    # Pages that fit decode; pages that did not fit leave their hot slot untouched.
    assert_pages(layout, [0, 2, 1, 3], [before[0], before[2], bytes(65536), bytes(65536)])


def test_slot_ratio_below_the_header_is_refused():
    layout = GpuLayout((65536,), 2, "random")
    codec = kv.create_codec("nvcomp-lz4", {"slot_ratio": 0.0001}, device="cuda")
    with pytest.raises(kv.KvcodecError, match="smallest usable slot_ratio"):
        codec.configure(layout.groups)


@pytest.mark.parametrize("name", GPU_CODECS)
@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
def test_corrupted_blobs_are_never_decoded(name, pinned, stream):
    n = 6
    layout = GpuLayout((32768, 8192), n, "kv")
    params = {"chunk_bytes": 8192, "data_type": "uint16"}
    codec, out, originals = encode_decode(name, params, layout, n, stream)
    rng = np.random.default_rng(3)
    cold = np.frombuffer(b"".join(out), dtype=np.uint8).copy()
    cb = codec.cold_page_bytes(0)
    # Corrupt pages 1..5 at different places (envelope, header CRC, codec header, table, payload);
    # page 0 stays intact and must still decode in the same call.
    for s, where in zip(range(1, n), ["magic", "header", "table", "payload", "payload"]):
        b = parse(out[s])
        pos = {"magic": 0, "header": 12, "table": 48, "payload": b.header_bytes + int(rng.integers(0, b.payload_bytes))}[where]
        cold[s * cb + pos] ^= 0x21
        assert blobs.check(cold[s * cb : (s + 1) * cb].tobytes()) != "ok"
    layout.fill_(0x5A)
    blob = torch.from_numpy(cold)
    codec.decode(0, blob.pin_memory() if pinned else blob.cuda(), dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    assert_pages(layout, range(n), [originals[0]] + [bytes([0x5A]) * len(o) for o in originals[1:]])


def test_calls_do_not_synchronize(stream):
    layout = GpuLayout((65536, 65536), 16, "kv")
    codec = kv.create_codec("nvcomp-ans", {"data_type": "uint16"}, device="cuda")
    codec.configure(layout.groups)
    cold = torch.empty((16, codec.cold_page_bytes(0)), dtype=torch.uint8).pin_memory()
    idx = dev_pairs(range(16), range(16))
    expect = [layout.page(s) for s in range(16)]
    codec.encode(0, cold, idx, stream=stream)  # warm-up: lazy module loading happens here
    codec.decode(0, cold, idx, stream=stream)
    stream.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # tens of ms of GPU work ahead of the codec on its stream
    codec.encode(0, cold, idx, stream=stream)
    assert not stream.query(), "encode() waited for the stream"
    layout.fill_(0, stream=stream)  # behind the queued encode, which still reads the pages
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
    codec.decode(0, cold, idx, stream=stream)
    assert not stream.query(), "decode() waited for the stream"
    stream.synchronize()
    assert_pages(layout, range(16), expect)


def test_calls_on_two_streams_share_the_workspace_safely():
    layout = GpuLayout((65536,), 32, "kv")
    codec = kv.create_codec("nvcomp-lz4", {"data_type": "uint16", "bitshuffle": True}, device="cuda")
    codec.configure(layout.groups)
    cold = torch.empty((32, codec.cold_page_bytes(0)), dtype=torch.uint8, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    expect = [layout.page(s) for s in range(32)]
    with torch.cuda.stream(s1):
        torch.cuda._sleep(50_000_000)
    codec.encode(0, cold, dev_pairs(range(16), range(16)), stream=s1)
    codec.encode(0, cold, dev_pairs(range(16, 32), range(16, 32)), stream=s2)
    torch.cuda.synchronize()
    layout.fill_(0)
    codec.decode(0, cold, dev_pairs(range(32), range(32)), stream=s2)
    torch.cuda.synchronize()
    assert_pages(layout, range(32), expect)


# -- batch independence: a page's blob depends on that page alone ------------------------------


def encode_blobs(codec, layout, slots, cb, stream, *, per_page):
    cold = torch.zeros((len(slots), cb), dtype=torch.uint8).pin_memory()
    if per_page:
        for i, s in enumerate(slots):
            codec.encode(0, cold, dev_pairs([i], [s]), stream=stream)
    else:
        codec.encode(0, cold, dev_pairs(range(len(slots)), slots), stream=stream)
    stream.synchronize()
    return [cold[i].numpy().tobytes() for i in range(len(slots))]


BATCH_LAYOUTS = {
    "staged": (8192, 8192, 37),  # the conformance suite's failing group: odd slot, staged input
    "direct": (65536, 16384),
}


@pytest.mark.parametrize("name", GPU_CODECS)
@pytest.mark.parametrize("shape", list(BATCH_LAYOUTS))
@pytest.mark.parametrize("params", [{}, {"data_type": "uint16", "bitshuffle": True, "chunk_bytes": 4096}], ids=["plain", "u16-shuffle"])
def test_blob_does_not_depend_on_the_rest_of_the_call(name, shape, params, stream):
    slots = BATCH_LAYOUTS[shape]
    if params.get("data_type") == "uint16" and any(s % 2 for s in slots):
        params = {k: v for k, v in params.items() if k != "data_type"}
    n = 9
    layout = GpuLayout(slots, 2 * n, "kv", seed=5)
    codec = kv.create_codec(name, params, device="cuda")
    codec.configure(layout.groups)
    cb = codec.cold_page_bytes(0)
    order = list(range(n, 2 * n))  # other pages than the dirtying call's
    # Stale staging first: a call over the other n pages leaves their bytes in every slot.
    encode_blobs(codec, layout, list(range(n)), cb, stream, per_page=False)
    joined = encode_blobs(codec, layout, order, cb, stream, per_page=False)
    separate = encode_blobs(codec, layout, order, cb, stream, per_page=True)
    reversed_ = encode_blobs(codec, layout, order[::-1], cb, stream, per_page=False)[::-1]
    assert_blobs(separate, joined, "blob of one call per page vs one call, page")
    assert_blobs(reversed_, joined, "blob of the call in reverse order vs forward order, page")


#: Algorithms whose compressed-chunk slots the codec clears before nvCOMP writes them
#: (codec_cuda.h, zeroCompressed()).
OUTPUT_CLEARED = {"gdeflate", "ans"}


@pytest.mark.parametrize("name", ["lz4", "gdeflate", "ans"])
def test_nvcomp_output_ignores_stale_memory(name):
    """Which nvCOMP buffers a compressed chunk depends on: input padding past the chunk, the
    output buffer's old bytes, the temp memory's old bytes, the chunk's place in the batch.

    The codec clears input padding for every algorithm and the output slot for the algorithms in
    OUTPUT_CLEARED (gdeflate and ANS leave bytes of it unwritten: measured on an H200); for those
    the output buffer is filled with the zeros the codec writes. A failure here for another
    buffer means the codec must clear that one too."""
    rng = np.random.default_rng(11)
    sizes = [8192, 8192, 37, 65536, 1000]
    data = torch.from_numpy(np.concatenate([fill("kv", rng, s) for s in sizes])).cuda()
    torch.cuda.synchronize()
    base = _ext.compress_chunks(name, 1, data.data_ptr(), sizes)
    out = 0 if name in OUTPUT_CLEARED else 0xA5
    fills = {"input padding": (0xFF, 0, 0), "temp memory": (0, 0, 0xFF), "all": (0x5A, out, 0x3C)}
    if name not in OUTPUT_CLEARED:
        fills["output buffer"] = (0, 0xFF, 0)
    for what, (in_fill, out_fill, temp_fill) in fills.items():
        got = _ext.compress_chunks(name, 1, data.data_ptr(), sizes, in_fill, out_fill, temp_fill)
        assert_blobs(got, base, f"{name} chunk compressed over stale {what}: chunk")
    # The same chunk alone and after others in one batch.
    offset = sum(sizes[:3])
    alone = _ext.compress_chunks(name, 1, data.data_ptr() + offset, [sizes[3]])
    assert_blobs(alone, [base[3]], f"{name} chunk compressed alone vs in a batch of {len(sizes)}:")


@pytest.mark.parametrize("name", GPU_CODECS)
def test_many_tiny_pages_configure_and_round_trip(name, stream):
    # The conformance suite's many-pages shape: 32-byte slots, 100001 of them, one large call.
    n = 100_001
    layout = GpuLayout((32, 32), n, "kv", seed=3)
    codec = kv.create_codec(name, {}, device="cuda")
    codec.configure(layout.groups)  # used to fail: workspace sized for 64 KiB chunks
    cb = codec.cold_page_bytes(0)
    m = n - 1
    want = torch.cat(layout.pools, dim=1)[:m].clone()
    cold = torch.zeros((m, cb), dtype=torch.uint8, device="cuda")
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(1))
    torch.cuda.synchronize()
    codec.encode(0, cold, dev_pairs(perm, torch.arange(m)), stream=stream)
    layout.fill_(0x77, stream=stream)  # behind the queued encode
    codec.decode(0, cold, dev_pairs(torch.arange(m), perm), stream=stream)
    stream.synchronize()
    got = torch.cat(layout.pools, dim=1)[:m]
    bad = (got != want).any(dim=1).nonzero()
    if bad.numel():
        s = int(bad[0])
        at = int((got[s] != want[s]).nonzero()[0])
        pytest.fail(f"{bad.numel()} of {m} pages differ; first page {s} at byte {at}")
    assert bool((torch.cat(layout.pools, dim=1)[m] == 0x77).all()), "a slot outside the call was written"


# -- checked decode (plugin ABI 2) ---------------------------------------------------------------

#: Pool 0 (runs) and pool 1 (zeros, ending in a shorter chunk) compress with every algorithm and
#: setting, pool 2 (random) is stored raw.
CHECKED_SLOTS = (8192, 3008, 4096)
CHECKED_PARAMS = [{"chunk_bytes": 2048}, {"chunk_bytes": 2048, "data_type": "uint16", "bitshuffle": True}]
CHECKED_IDS = ["plain", "u16-shuffle"]  # plain decompresses into the hot slots, shuffled into staging
FILLER = 0x5A
UNWRITTEN = 0xEE


def checked_layout(num_slots, seed=5):
    layout = GpuLayout(CHECKED_SLOTS, num_slots, "runs", seed=seed)
    rng = np.random.default_rng(seed + 1)
    layout.pools[1].zero_()  # ANS on bit-shuffled runs leaves a 960-byte chunk raw; zeros compress
    layout.pools[2].copy_(torch.from_numpy(fill("random", rng, CHECKED_SLOTS[2] * num_slots).reshape(num_slots, -1)))
    torch.cuda.synchronize()
    return layout


def chunk_sizes(params):
    return [c[2] for c in blobs.chunk_plan(CHECKED_SLOTS, params["chunk_bytes"])]


def encoded_on_gpu(name, params, layout, n, stream):
    """A configured CUDA codec and the blobs of hot slots 0..n-1 as an (n, cold bytes) numpy array."""
    codec = kv.create_codec(name, params, device="cuda")
    codec.configure(layout.groups)
    assert codec.has_checked_decode
    cold = torch.zeros((n, codec.cold_page_bytes(0)), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    codec.encode(0, cold, dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    return codec, cold.cpu().numpy().copy()


def blob_buffer(cold: np.ndarray, pinned: bool):
    t = torch.from_numpy(cold)
    return t.pin_memory() if pinned else t.cuda()


def status_buffer(n: int, where: str):
    """A status array prefilled with UNWRITTEN: mapped pinned host memory or device memory."""
    t = torch.full((n,), UNWRITTEN, dtype=torch.uint8)
    t = t.pin_memory() if where == "pinned" else t.cuda()
    torch.cuda.synchronize()
    return t


def decode_checked(codec, cold, dst, src, stream, *, status_in="pinned", pinned=True):
    status = status_buffer(len(dst), status_in)
    codec.decode_checked(0, blob_buffer(cold, pinned), dev_pairs(dst, src), status, stream=stream)
    stream.synchronize()
    return status.cpu().tolist()


@pytest.mark.parametrize("name", GPU_CODECS)
@pytest.mark.parametrize("params", CHECKED_PARAMS, ids=CHECKED_IDS)
@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
@pytest.mark.parametrize("status_in", ["pinned", "device"], ids=["pinned-status", "device-status"])
def test_checked_status_per_page_and_neighbours_decode(name, params, pinned, status_in, stream):
    kinds = blobs.with_good_neighbours([k for k in blobs.DAMAGE if k != "good"])
    n = len(kinds)
    layout = checked_layout(n + 1)  # slot n: the target of a pair with a bad cold index
    codec, cold = encoded_on_gpu(name, params, layout, n, stream)
    originals = [layout.page(s) for s in range(n + 1)]
    expect = blobs.damage_pages(cold, kinds, chunk_sizes(params))
    layout.fill_(FILLER)
    # Blob s into hot slot n-1-s; then a hot index past the pools and a negative cold index.
    dst = [n - 1 - s for s in range(n)] + [n + 1, n]
    src = list(range(n)) + [0, -1]
    status = decode_checked(codec, cold, dst, src, stream, status_in=status_in, pinned=pinned)
    assert status == expect + [kv.PageStatus.BAD_INDEX] * 2, list(zip(kinds, status))
    filler = bytes([FILLER]) * len(originals[0])
    for s, kind in enumerate(kinds):
        if expect[s] == kv.PageStatus.OK:
            assert_pages(layout, [dst[s]], [originals[s]], f"page {s} ({kind})")
        elif expect[s] != kv.PageStatus.DECODE_FAILED:  # nvCOMP may have written part of it in place
            assert_pages(layout, [dst[s]], [filler], f"refused page {s} ({kind})")
    assert_pages(layout, [n], [filler], "hot slot of a pair with a bad cold index")


@pytest.mark.parametrize("name", ["nvcomp-lz4", "nvcomp-gdeflate"])
@pytest.mark.parametrize("params", CHECKED_PARAMS, ids=CHECKED_IDS)
@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
def test_checked_statuses_agree_with_the_cpu_reference(name, params, pinned, stream):
    """The same damaged blobs, and blobs with one random flipped bit each, get the same status
    from the CUDA implementation and the CPU reference."""
    rng = np.random.default_rng(12)
    kinds = blobs.with_good_neighbours([k for k in blobs.DAMAGE if k != "good"])
    flips = 40
    n = len(kinds) + flips
    layout = checked_layout(n)
    codec, cold = encoded_on_gpu(name, params, layout, n, stream)
    blobs.damage_pages(cold[: len(kinds)], kinds, chunk_sizes(params))
    for s in range(len(kinds), n):
        h = blobs.parse(cold[s].tobytes())
        cold[s, int(rng.integers(0, h.header_bytes + h.payload_bytes))] ^= 1 << int(rng.integers(0, 8))
    perm = rng.permutation(n)
    gpu_status = decode_checked(codec, cold, perm, range(n), stream, pinned=pinned)
    host_pools = [np.zeros((n, size), dtype=np.uint8) for size in CHECKED_SLOTS]
    cpu = kv.create_codec(name, params, device="cpu")
    cpu.configure([kv.PoolGroupDesc([kv.PoolDesc(h.ctypes.data, h.shape[1], n) for h in host_pools],
                                    [kv.LifeCycleDesc(0)])])
    cpu_status = np.full(n, UNWRITTEN, dtype=np.uint8)
    cpu.decode_checked(0, cold, pairs(perm, range(n)), cpu_status)
    assert gpu_status == cpu_status.tolist()
    assert set(gpu_status[len(kinds):]) <= {kv.PageStatus.BAD_MAGIC, kv.PageStatus.BAD_HEADER, kv.PageStatus.BAD_CHECKSUM}


@pytest.mark.parametrize("pinned", [True, False], ids=["host-blobs", "device-blobs"])
@pytest.mark.parametrize("status_in", ["pinned", "device"], ids=["pinned-status", "device-status"])
def test_checked_statuses_of_a_call_cut_into_batches(pinned, status_in, stream):
    """A call of many batches (three pages each, alternating lanes): every status lands at its
    page's position."""
    n = 41
    layout = checked_layout(n)
    page_bytes = sum(CHECKED_SLOTS)
    params = {"chunk_bytes": 2048, "max_batch_bytes": 3 * page_bytes}
    codec, cold = encoded_on_gpu("nvcomp-lz4", params, layout, n, stream)
    originals = [layout.page(s) for s in range(n)]
    bad = {0: "magic", 4: "payload", 5: "decode", 9: "version", 20: "table", 29: "did-not-fit", 40: "header-crc"}
    kinds = [bad.get(s, "good") for s in range(n)]
    expect = blobs.damage_pages(cold, kinds, chunk_sizes(params))
    layout.fill_(FILLER)
    status = decode_checked(codec, cold, range(n), range(n), stream, status_in=status_in, pinned=pinned)
    assert status == expect
    assert_pages(layout, [s for s in range(n) if s not in bad], [originals[s] for s in range(n) if s not in bad])


@pytest.mark.parametrize("name", ["nvcomp-lz4", "nvcomp-ans"])
def test_checked_did_not_fit_from_encode(name, stream):
    n, layout, codec = half_slot_codec(name)
    cold = torch.zeros((n, codec.cold_page_bytes(0)), dtype=torch.uint8, device="cuda")
    codec.encode(0, cold, dev_pairs(range(n), range(n)), stream=stream)
    stream.synchronize()
    layout.fill_(FILLER)
    status = decode_checked(codec, cold.cpu().numpy(), range(n), range(n), stream, pinned=False)
    assert status == [kv.PageStatus.DID_NOT_FIT, 0, kv.PageStatus.DID_NOT_FIT, 0]
    assert_pages(layout, range(n), [bytes([FILLER]) * 65536, bytes(65536)] * 2)


def test_checked_decode_does_not_synchronize(stream):
    n = 16
    layout = GpuLayout((65536, 65536), n, "kv")
    codec = kv.create_codec("nvcomp-ans", {"data_type": "uint16"}, device="cuda")
    codec.configure(layout.groups)
    cold = torch.empty((n, codec.cold_page_bytes(0)), dtype=torch.uint8).pin_memory()
    idx = dev_pairs(range(n), range(n))
    status = status_buffer(n, "pinned")
    expect = [layout.page(s) for s in range(n)]
    codec.encode(0, cold, idx, stream=stream)
    codec.decode_checked(0, cold, idx, status, stream=stream)  # warm-up
    stream.synchronize()
    status.fill_(UNWRITTEN)
    layout.fill_(0)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
    codec.decode_checked(0, cold, idx, status, stream=stream)
    assert not stream.query(), "decodeChecked() waited for the stream"
    stream.synchronize()
    assert status.tolist() == [0] * n
    assert_pages(layout, range(n), expect)


def test_checked_status_memory_the_device_cannot_write(stream):
    """Pageable host memory is refused as a whole call (unless the device writes pageable memory,
    then it works like any other)."""
    n = 2
    layout = checked_layout(n)
    codec, cold = encoded_on_gpu("nvcomp-lz4", CHECKED_PARAMS[0], layout, n, stream)
    status = np.full(n, UNWRITTEN, dtype=np.uint8)
    try:
        codec.decode_checked(0, torch.from_numpy(cold).cuda(), dev_pairs(range(n), range(n)), status, stream=stream)
    except kv.CodecCallError as exc:
        assert "pageable host memory" in str(exc)
        assert (status == UNWRITTEN).all()
    else:
        stream.synchronize()
        assert status.tolist() == [0] * n
