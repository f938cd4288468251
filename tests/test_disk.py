"""The disk tier store: round trips, recovery from snapshot and journal, identity checks,
checksums, full-region policies, bad input and the fast CRC-32C."""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcodec_sdk import _native
from kvcodec_sdk.disk import CodecIdentity, DiskFullError, DiskRegion, DiskTierWarning, crc32c

SLOT = 16384


def region(path, **kw):
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("max_bytes", 64 * SLOT)
    kw.setdefault("container_bytes", 16 * SLOT)
    return DiskRegion(path, **kw)


def page(i: int, size: int = SLOT) -> bytes:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


# -- CRC-32C ---------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_fast_crc32c_matches_bitwise_reference(data, seed):
    ref = _native.crc32c(data, seed)  # codec.h's bitwise kvcodec::crc32c
    assert _native.disk.crc32c_slicing8(data, seed) == ref
    assert crc32c(data, seed) == ref
    if _native.disk.crc32c_hardware_available():
        assert _native.disk.crc32c_hardware(data, seed) == ref


@pytest.mark.parametrize("size", [12287, 12288, 12289, 3 * 4096 * 5 + 77, 1 << 20])
def test_fast_crc32c_three_stream_blocks_match_the_reference(size):
    """Buffers of three 4 KiB blocks and more take the hardware path's three interleaved chains,
    joined by a carry-less shift: they must give the bitwise reference's value, chained too."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    ref = _native.crc32c(data, 0x1234)
    assert crc32c(data, 0x1234) == ref and _native.disk.crc32c_slicing8(data, 0x1234) == ref
    if _native.disk.crc32c_hardware_available():
        assert _native.disk.crc32c_hardware(data, 0x1234) == ref
    half = size // 3
    assert crc32c(data[half:], crc32c(data[:half])) == _native.crc32c(data)


@pytest.mark.parametrize("size", [511, 512, 513, 527, 1023, 1024, 1040, 4097, 65536 + 15, 576 * 1024])
@pytest.mark.parametrize("offset", [0, 1, 13])
def test_folded_crc32c_and_checked_copy_match_the_reference(size, offset):
    """Buffers of 512 bytes and more take the carry-less multiply folding where the CPU has
    AVX-512 with VPCLMULQDQ (every length past a 512-byte step, every alignment, a running CRC);
    crc32c_copy copies while it checksums and must leave exactly the source's bytes."""
    data = np.random.default_rng(size + offset).integers(0, 256, size + offset, dtype=np.uint8)[offset:]
    ref = _native.crc32c(data.tobytes(), 0xA5A5A5A5)
    assert crc32c(data, 0xA5A5A5A5) == ref
    dst = np.zeros(size + 3, np.uint8)
    assert _native.disk.crc32c_copy(dst[3:], data, 0xA5A5A5A5) == ref
    assert np.array_equal(dst[3:], data) and not dst[:3].any()
    with pytest.raises(ValueError, match="dst holds"):
        _native.disk.crc32c_copy(bytearray(size - 1), data)
    assert isinstance(_native.disk.crc32c_fold_available(), bool)


def test_crc32c_known_value_and_chaining():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    data = page(1, 100003)
    assert crc32c(data[5000:], crc32c(data[:5000])) == crc32c(data)


# -- round trips -----------------------------------------------------------------------------

@pytest.mark.parametrize("io_mode", ["auto", "buffered"])
@pytest.mark.parametrize("slot", [SLOT, 5000])
def test_round_trip_and_restart(tmp_path, io_mode, slot):
    with region(tmp_path / "r", io_mode=io_mode, slot_bytes=slot) as r:
        tickets = [r.submit_write(f"k{i}", page(i, slot), tag=i) for i in range(40)]
        assert all(r.wait(t).ok for t in tickets)
        assert r.stats()["puts"] == 40 and len(r) == 40
        assert r.get("k7") == page(7, slot)
        assert r.get("nope") is None
    with region(tmp_path / "r", io_mode=io_mode, slot_bytes=slot) as r:
        assert r.recovery()["snapshot_used"] == "index.snapshot"
        for i in range(40):
            out = bytearray(slot)
            done = r.wait(r.submit_read(f"k{i}", out))
            assert done.ok and done.tag == i and bytes(out) == page(i, slot)


def test_unaligned_buffers_and_direct_mode(tmp_path):
    with region(tmp_path / "r") as r:
        if not r.stats()["direct_io"]:
            pytest.skip("the file system of the temp dir refuses O_DIRECT")
        raw = bytearray(SLOT + 1)
        src = memoryview(raw)[1:]  # deliberately misaligned
        src[:] = page(3)
        r.put("a", src)
        dst = memoryview(bytearray(SLOT + 7))[7:]
        assert r.wait(r.submit_read("a", dst)).ok
        assert bytes(dst) == page(3)


def test_journal_replay_without_snapshot(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        for i in range(10):
            r.put(f"k{i}", page(i))
        assert r.erase("k3") and not r.erase("k3")
        r.put("k4", page(99))  # overwrite
    for leaf in ("index.snapshot", "index.snapshot.bak"):
        (tmp_path / "r" / leaf).unlink(missing_ok=True)
    with region(tmp_path / "r") as r:
        rec = r.recovery()
        assert rec["snapshot_used"] == "" and rec["journal_records_replayed"] == 12
        assert "k3" not in r and r.get("k4") == page(99) and r.get("k9") == page(9)
        assert len(r) == 9 and r.stats()["slots_free"] == r.stats()["slots_total"] - 9


def test_journal_is_human_readable(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        r.put(b"\x00\xffkey", page(1), tag=5)
        r.erase(b"\x00\xffkey")
        lines = (tmp_path / "r" / "index.log").read_text().splitlines()
    header = json.loads(lines[0])
    assert json.loads(header["identity"])["codec"] == "concat"
    put, delete = json.loads(lines[1]), json.loads(lines[2])
    assert put["op"] == "put" and put["key"] == "00ff6b6579" and put["tag"] == 5
    assert put["crc"] == "%08x" % crc32c(page(1))
    assert delete["op"] == "del" and delete["seq"] == put["seq"] + 1


def test_periodic_snapshots_rotate_the_journal(tmp_path):
    with region(tmp_path / "r", snapshot_every=8) as r:
        for i in range(30):
            r.put(f"k{i % 20}", page(i))
        assert r.stats()["snapshots"] >= 3
    assert (tmp_path / "r" / "index.snapshot.bak").exists()
    assert (tmp_path / "r" / "index.log.1").exists()
    with region(tmp_path / "r") as r:
        assert len(r) == 20
        assert all(r.get(f"k{i % 20}") == page(i) for i in range(10, 30))


def test_concurrent_submitters(tmp_path):
    with region(tmp_path / "r", max_bytes=256 * SLOT, io_threads=4) as r:
        errors = []

        def work(t):
            try:
                for i in range(30):
                    r.put(f"t{t}-{i}", page(t * 100 + i))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors
        assert len(r) == 120
        assert r.stats()["journal_batches"] <= 120  # group commit may merge records
        assert all(r.get(f"t{t}-{i}") == page(t * 100 + i) for t in range(4) for i in range(30))


# -- identity ----------------------------------------------------------------------------------

def test_other_codec_invalidates_region_with_warning(tmp_path):
    with region(tmp_path / "r") as r:
        r.put("a", page(1))
        assert r.codec["name"] == "concat"
    with region(tmp_path / "r") as r:  # same identity: kept
        assert "a" in r
    other = CodecIdentity.from_name("concat", layout={"pools": [4096]})  # blobs of another hot layout
    assert other.param_hash != CodecIdentity.from_name("concat").param_hash
    with pytest.warns(DiskTierWarning, match="codec_param_hash"):
        r = region(tmp_path / "r", codec=other)
    assert "a" not in r and r.recovery()["invalidated"]
    r.close()
    with pytest.warns(DiskTierWarning, match="codec_format_version"):
        r = region(tmp_path / "r", codec=CodecIdentity("concat", 2, other.params))
    r.close()
    with pytest.warns(DiskTierWarning, match="slot_bytes"):
        r = region(tmp_path / "r", codec=CodecIdentity("concat", 2, other.params), slot_bytes=8192)
    r.close()


def test_identity_from_codec_object_and_layout():
    import kvcodec_sdk as kv

    with kv.create_codec("concat", {"path": "copy_engine"}) as codec:
        ident = CodecIdentity.from_codec(codec, layout={"pools": [4096, 8192]})
    assert ident.name == "concat" and ident.format_version == 1
    assert ident.param_hash != CodecIdentity("concat", 1, dict(ident.params)).param_hash
    with pytest.raises(TypeError, match="codec is 42"):
        CodecIdentity.coerce(42)


def test_tuning_knobs_stay_out_of_the_identity():
    """concat's copy path never changes a blob byte (ParamSpec(affects_blob=False)): regions keep
    their pages when it is retuned; the layout still counts."""
    import kvcodec_sdk as kv

    hashes = set()
    for params in ({}, {"path": "sm"}, {"path": "copy_engine", "copy_api": "per_copy", "sm_path_below_bytes": 4096}):
        with kv.create_codec("concat", params) as codec:
            ident = CodecIdentity.from_codec(codec, layout={"pools": [4096]})
        assert ident.params == {}, ident.params
        hashes.add(ident.param_hash)
    assert hashes == {CodecIdentity.from_name("concat", {"path": "sm"}, layout={"pools": [4096]}).param_hash}
    assert CodecIdentity.from_name("concat", layout={"pools": [8192]}).param_hash not in hashes
    described = {p.name: p.to_json() for p in kv.get_codec_spec("concat").params}
    assert described["path"]["affects_blob"] is False


# -- checksums -----------------------------------------------------------------------------------

def test_bad_checksum_is_a_counted_logged_miss(tmp_path, caplog):
    with region(tmp_path / "r") as r:
        r.put("a", page(1))
        r.put("b", page(2))
        loc = r.lookup("a")
        stride = r._native.slot_stride
    path = tmp_path / "r" / "containers" / ("%04d.bin" % loc["container"])
    with open(path, "r+b") as f:
        f.seek(loc["slot"] * stride + 100)
        byte = f.read(1)
        f.seek(loc["slot"] * stride + 100)
        f.write(bytes([byte[0] ^ 0x40]))
    with region(tmp_path / "r") as r, caplog.at_level(logging.WARNING, logger="kvcodec_sdk.disk"):
        done = r.wait(r.submit_read("a", bytearray(SLOT)))
        assert done.status == "checksum_mismatch" and not done.ok
        assert r.get("b") == page(2)
        assert r.stats()["checksum_failures"] == 1
    assert "checksum mismatch for key 61" in caplog.text


# -- full regions ----------------------------------------------------------------------------------

def test_full_region_refuses_without_damage(tmp_path):
    with region(tmp_path / "r", max_bytes=4 * SLOT, container_bytes=2 * SLOT) as r:
        for i in range(4):
            r.put(f"k{i}", page(i))
        with pytest.raises(DiskFullError, match="is full .*4 of 4 slots.*'refuse'"):
            r.put("k4", page(4))
        assert r.stats()["puts_refused_full"] == 1
        assert [r.get(f"k{i}") == page(i) for i in range(4)] == [True] * 4


def test_full_region_evicts_oldest_durably(tmp_path):
    with region(tmp_path / "r", max_bytes=4 * SLOT, container_bytes=2 * SLOT, when_full="evict") as r:
        for i in range(7):
            r.put(f"k{i}", page(i))
        assert r.stats()["evictions"] == 3
        assert [f"k{i}" in r for i in range(7)] == [False] * 3 + [True] * 4
    with region(tmp_path / "r", max_bytes=4 * SLOT, container_bytes=2 * SLOT, when_full="evict") as r:
        assert sorted(r.keys()) == [b"k3", b"k4", b"k5", b"k6"]
        assert all(r.get(f"k{i}") == page(i) for i in range(3, 7))


# -- bad input -------------------------------------------------------------------------------------

def test_bad_input_names_the_field(tmp_path):
    with region(tmp_path / "r") as r:
        with pytest.raises(ValueError, match=r"page is 16385 bytes.*slot_bytes = 16384.*too large"):
            r.put("a", bytes(SLOT + 1))
        with pytest.raises(ValueError, match=r"page is 100 bytes"):
            r.put("a", bytes(100))
        with pytest.raises(ValueError, match=r"destination is 10 bytes"):
            r.submit_read("a", bytearray(10))
        with pytest.raises(ValueError, match="keys must be 1..255 bytes"):
            r.put(b"", page(1))
        with pytest.raises(TypeError, match="keys are bytes"):
            r.put(3, page(1))
        assert r.get("unknown") is None and not r.erase("unknown")
    with pytest.raises(ValueError, match="container_bytes is 100; it must hold at least one slot of 16384"):
        region(tmp_path / "x", container_bytes=100)
    with pytest.raises(ValueError, match="max_bytes is 1000; it must be >= container_bytes"):
        region(tmp_path / "x", max_bytes=1000)
    with pytest.raises(ValueError, match="io_mode is 'fast'; valid: auto, direct, buffered"):
        region(tmp_path / "x", io_mode="fast")
    with pytest.raises(ValueError, match="when_full is 'drop'"):
        region(tmp_path / "x", when_full="drop")


def test_closed_region_and_second_writer(tmp_path):
    r = region(tmp_path / "r")
    with pytest.raises(RuntimeError, match="already open for writing in another process"):
        region(tmp_path / "r")
    r.close()
    r.close()
    with pytest.raises(Exception, match="closed"):
        r.put("a", page(1))


def test_missing_directory(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        DiskRegion.open_read_only(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="holds no disk region"):
        DiskRegion.open_read_only(tmp_path / "empty")
    with region(tmp_path / "new" / "deeper" / "r") as r:  # created with its parents
        assert r.recovery()["created"]


def test_read_only_open_changes_nothing(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        r.put("a", page(1), tag=3)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "r").iterdir()}
    ro = DiskRegion.open_read_only(tmp_path / "r")
    assert ro.get("a") == page(1) and ro.lookup("a")["tag"] == 3
    with pytest.raises(RuntimeError, match="read-only"):
        ro.put("b", page(2))
    ro.close()
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "r").iterdir()}
    assert before == after


def _accepts_o_direct(directory) -> bool:
    path = os.path.join(directory, "probe")
    with open(path, "wb") as f:
        f.write(bytes(4096))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap

        buf = mmap.mmap(-1, 4096)  # page-aligned
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(path)


def test_io_mode_auto_matches_what_the_file_system_accepts(tmp_path):
    with region(tmp_path / "r") as r:
        assert r.stats()["direct_io"] == _accepts_o_direct(tmp_path)


def test_refused_o_direct_falls_back_to_buffered(tmp_path):
    # The probe is the first pread: make it fail as a file system without O_DIRECT would.
    refuse = [{"op": "pread", "errno": 22, "count": 1}]
    with region(tmp_path / "r", _faults=refuse) as r:
        assert r.stats()["direct_io"] is False
        r.put("a", page(1))
        assert r.get("a") == page(1)
    with pytest.raises(RuntimeError, match="refuses O_DIRECT.*'auto' or 'buffered'"):
        region(tmp_path / "r2", io_mode="direct", _faults=refuse)


def _pages_in(buf, n: int) -> list[memoryview]:
    view = memoryview(buf)
    return [view[i * SLOT : (i + 1) * SLOT] for i in range(n)]


@pytest.mark.parametrize("faulty", [False, True], ids=["posix", "fault-seam"])
def test_adjacent_slots_move_in_merged_ios(tmp_path, faulty):
    """Writes and reads of adjacent slots queued together go out as one vectored I/O each, byte-exact
    and durable; behind the fault-injection seam every slot keeps its own call."""
    import mmap

    n = 48
    faults = [{"op": "pread", "after": 10**9}] if faulty else None  # a rule that never fires
    src, dst = mmap.mmap(-1, n * SLOT), mmap.mmap(-1, n * SLOT)  # page-aligned, as O_DIRECT wants
    for i, v in enumerate(_pages_in(src, n)):
        v[:] = page(i)
    with region(tmp_path / "r", io_threads=1, _faults=faults) as r:
        assert all(r.wait(t).ok for t in [r.submit_write(f"k{i}", v) for i, v in enumerate(_pages_in(src, n))])
        assert all(r.wait(t).ok for t in [r.submit_read(f"k{i}", v) for i, v in enumerate(_pages_in(dst, n))])
        stats = r.stats()
    for i, v in enumerate(_pages_in(dst, n)):
        assert bytes(v) == page(i), f"page {i} differs"
    if faulty:
        assert stats["merged_ios"] == 0 and stats["merged_slots"] == 0
    else:
        assert stats["merged_ios"] > 0 and stats["merged_slots"] >= 2 * stats["merged_ios"], stats
    with region(tmp_path / "r") as r:  # the merged writes reached their slots and were journaled
        for i in range(n):
            assert r.get(f"k{i}") == page(i), f"page {i} after restart"


def test_wait_with_an_infinite_timeout_waits_and_a_bad_one_is_refused(tmp_path):
    """timeout=inf waits for ever like None (before: TimeoutError at once); NaN or a negative
    timeout is an error naming the value."""
    with region(tmp_path) as r:
        assert r.wait(r.submit_write("a", page(1)), timeout=float("inf")).ok
        for bad in (float("nan"), -1.0):
            with pytest.raises(ValueError, match="timeout is"):
                r.wait(r.submit_write("b", page(2)), timeout=bad)
