"""Fault injection for the disk tier: out-of-space, I/O errors and torn writes through the
store's FileIo seam, plus damaged files on disk (truncated journal, corrupt snapshot). In every
case the failing operation surfaces as an error and nothing acknowledged is lost or corrupted."""

from __future__ import annotations

import errno
import os
import warnings

import numpy as np
import pytest

from kvcodec_sdk.disk import DiskIoError, DiskNoSpaceError, DiskRegion, DiskTierWarning

SLOT = 8192


def region(path, **kw):
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("max_bytes", 32 * SLOT)
    kw.setdefault("container_bytes", 8 * SLOT)
    kw.setdefault("io_threads", 2)
    return DiskRegion(path, **kw)


def page(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, SLOT, dtype=np.uint8).tobytes()


def fill(r, keys):
    for i in keys:
        r.put(f"k{i}", page(i))


def check_clean_reopen(path, present, absent):
    with region(path) as r:
        for i in present:
            assert r.get(f"k{i}") == page(i), f"k{i} lost or corrupt"
        for i in absent:
            assert f"k{i}" not in r, f"k{i} is a phantom"
        assert r.stats()["checksum_failures"] == 0


@pytest.mark.parametrize("target", ["containers", "index.log"])
@pytest.mark.parametrize("err,exc", [(errno.ENOSPC, DiskNoSpaceError), (errno.EIO, DiskIoError)])
def test_write_error_surfaces_and_loses_nothing(tmp_path, target, err, exc):
    # Operations counted per rule: let the first puts through, then fail one write.
    after = 5 if target == "containers" else 6  # the journal's header is its first write
    rules = [{"op": "pwrite", "path": target, "after": after, "errno": err, "count": 1}]
    with region(tmp_path / "r", _faults=rules) as r:
        fill(r, range(5))
        with pytest.raises(exc, match=os.strerror(err)):
            r.put("k5", page(5))
        assert "k5" not in r
        fill(r, range(6, 9))  # the fault was transient: the region keeps working
        assert r.stats()["put_errors"] == 1
    check_clean_reopen(tmp_path / "r", present=[0, 1, 2, 3, 4, 6, 7, 8], absent=[5])


@pytest.mark.parametrize("target", ["containers", "index.log"])
def test_torn_write_is_never_served(tmp_path, target):
    after = 3 if target == "containers" else 4
    rules = [{"op": "pwrite", "path": target, "after": after, "errno": errno.EIO, "torn": True, "count": 1}]
    with region(tmp_path / "r", _faults=rules, snapshot_every=0) as r:
        fill(r, range(3))
        with pytest.raises(DiskIoError):
            r.put("k3", page(3))
        fill(r, range(4, 6))
        if target == "index.log":
            # The torn line was cut back: the journal holds only whole, checksummed records.
            lines = (tmp_path / "r" / "index.log").read_bytes().split(b"\n")
            assert lines[-1] == b"" and len(lines) == 2 + 5
    check_clean_reopen(tmp_path / "r", present=[0, 1, 2, 4, 5], absent=[3])


def test_data_sync_error_fails_the_put(tmp_path):
    rules = [{"op": "fdatasync", "path": "containers", "after": 2, "errno": errno.EIO, "count": 1}]
    with region(tmp_path / "r", _faults=rules) as r:
        fill(r, range(2))
        with pytest.raises(DiskIoError, match="syncing container"):
            r.put("k2", page(2))
        fill(r, [3])
    check_clean_reopen(tmp_path / "r", present=[0, 1, 3], absent=[2])


def test_unrepairable_journal_fails_the_region_safely(tmp_path):
    # Every journal sync fails: the append cannot be made durable nor cut back reliably.
    rules = [{"op": "fdatasync", "path": "index.log", "after": 3, "errno": errno.EIO}]
    r = region(tmp_path / "r", _faults=rules, snapshot_every=0)
    fill(r, range(2))
    with pytest.raises(DiskIoError, match="syncing the journal"):
        r.put("k2", page(2))
    with pytest.raises(DiskIoError, match="refuses writes until it is reopened"):
        r.put("k3", page(3))
    assert r.stats()["failed"] and r.get("k1") == page(1)  # reads still work
    r.close()
    check_clean_reopen(tmp_path / "r", present=[0, 1], absent=[2, 3])


def test_read_error_is_an_error_not_a_miss(tmp_path):
    rules = [{"op": "pread", "path": "containers", "after": 2, "errno": errno.EIO, "count": 1}]
    with region(tmp_path / "r", _faults=rules, io_mode="buffered") as r:
        fill(r, range(2))
        assert r.get("k0") == page(0)
        assert r.get("k1") == page(1)
        with pytest.raises(DiskIoError, match="reading container 0 slot 0"):
            r.get("k0")
        assert r.get("k0") == page(0) and r.stats()["read_errors"] == 1


def test_no_space_while_preallocating(tmp_path):
    rules = [{"op": "fallocate", "after": 2, "errno": errno.ENOSPC}]
    with pytest.raises(RuntimeError, match=r"cannot preallocate container .*0002\.bin.*No space left.*max_bytes"):
        region(tmp_path / "r", _faults=rules)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing was ever recorded: nothing to warn about
        region(tmp_path / "r").close()  # the directory is usable afterwards


# -- damaged files ---------------------------------------------------------------------------------

def test_truncated_journal_tail(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        fill(r, range(6))
    for leaf in ("index.snapshot", "index.snapshot.bak"):
        (tmp_path / "r" / leaf).unlink(missing_ok=True)
    os.rename(tmp_path / "r" / "index.log.1", tmp_path / "r" / "index.log")
    log = tmp_path / "r" / "index.log"
    data = log.read_bytes()
    log.write_bytes(data[:-40])  # cut the last record in the middle
    with pytest.warns(DiskTierWarning, match=r"index.log ends with a truncated or torn record"):
        r = region(tmp_path / "r")
    rec = r.recovery()
    assert rec["journal_records_replayed"] == 5 and rec["truncated_tail_bytes"] > 0
    assert "k5" not in r
    fill(r, [7])  # appends start on a clean line
    r.close()
    check_clean_reopen(tmp_path / "r", present=[0, 1, 2, 3, 4, 7], absent=[5])


def test_corrupt_journal_line_in_the_middle_drops_what_it_hides(tmp_path):
    """A record damaged beyond repair (two bits changed) may have overwritten or erased any key
    recorded before it: those keys become misses; keys recorded after it are served."""
    with region(tmp_path / "r", snapshot_every=0) as r:
        fill(r, range(4))
    for leaf in ("index.snapshot", "index.snapshot.bak"):
        (tmp_path / "r" / leaf).unlink(missing_ok=True)
    log = tmp_path / "r" / "index.log.1"
    lines = log.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"slot":1', b'"slot":2')  # k1's record, now failing its line CRC
    log.write_bytes(b"\n".join(lines))
    with pytest.warns(DiskTierWarning, match=r"record seq 2 is damaged beyond repair \(index.log.1 line at byte \d+: "
                                             r"line checksum mismatch\).*1 key whose latest state cannot be established"):
        r = region(tmp_path / "r")
    assert r.recovery()["journal_corrupt_lines"] == 1 and r.recovery()["dropped_entries"] == 1
    assert "k0" not in r and "k1" not in r and all(r.get(f"k{i}") == page(i) for i in (2, 3))
    r.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the drop was recorded by a snapshot at once
        with region(tmp_path / "r") as r:
            assert sorted(r.keys()) == [b"k2", b"k3"]


def test_corrupt_snapshot_falls_back_to_backup(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        fill(r, range(3))
        r.snapshot()          # index.snapshot @3
        fill(r, range(3, 6))
        r.snapshot()          # index.snapshot @6, .bak @3, index.log.1 holds 4..6
        fill(r, range(6, 8))  # index.log holds 7..8
        r.erase("k0")
        r._native.flush()
        native, r._native = r._native, None
    snap = tmp_path / "r" / "index.snapshot"
    # Close writes one more snapshot; damage the state as a crash before that would leave it.
    data = snap.read_bytes()
    native.close()
    del native
    snap.write_bytes(data[: len(data) // 2])
    # Put back the journal generations that match the damaged snapshot: simplest is to check
    # the fallback on the files as they are now (bak = previous snapshot, index.log.1 after it).
    with pytest.warns(DiskTierWarning, match="snapshot index.snapshot is damaged.*falling back to the backup"):
        r = region(tmp_path / "r")
    assert r.recovery()["snapshot_used"] == "index.snapshot.bak"
    assert "k0" not in r and all(r.get(f"k{i}") == page(i) for i in range(1, 8))
    r.close()
    # The damaged snapshot was replaced at once: the next open is clean.
    with region(tmp_path / "r") as r:
        assert r.recovery()["warnings"] == [] and len(r) == 7


def test_both_snapshots_corrupt(tmp_path):
    with region(tmp_path / "r", snapshot_every=0) as r:
        fill(r, range(3))
        r.snapshot()
        fill(r, range(3, 5))
    for leaf in ("index.snapshot", "index.snapshot.bak"):
        (tmp_path / "r" / leaf).write_bytes(b"garbage\n")
    with pytest.warns(DiskTierWarning, match="no intact snapshot; recovering from the journal alone"):
        r = region(tmp_path / "r")
    # Pages recorded only in the snapshots are misses, never wrong data.
    for i in range(5):
        data = r.get(f"k{i}")
        assert data is None or data == page(i)
    assert r.get("k3") == page(3) and r.get("k4") == page(4)  # in index.log.1
    r.close()


def test_missing_container_drops_its_pages(tmp_path):
    with region(tmp_path / "r") as r:
        fill(r, range(12))  # containers 0 (k0..k7) and 1 (k8..k11)
    os.unlink(tmp_path / "r" / "containers" / "0001.bin")
    with pytest.warns(DiskTierWarning, match=r"0001\.bin is missing; pages recorded in it are dropped"):
        r = region(tmp_path / "r")
    assert r.recovery()["dropped_entries"] == 4
    assert all(r.get(f"k{i}") == page(i) for i in range(8))
    assert all(f"k{i}" not in r for i in range(8, 12))
    r.close()
