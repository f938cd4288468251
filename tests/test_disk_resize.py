"""Run-time resize and defragmentation of one disk region: pages keep their keys, bytes and tags
across moves, the new size survives a restart, and an I/O error during a shrink leaves every page
readable and the old size working."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from kvcodec_sdk.disk import DiskFullError, DiskIoError, DiskRegion

SLOT = 4096
CONTAINER = 8 * SLOT


def region(path, containers=4, **kw):
    kw.setdefault("io_mode", "buffered")
    kw.setdefault("io_threads", 2)
    return DiskRegion(path, slot_bytes=SLOT, max_bytes=containers * CONTAINER, container_bytes=CONTAINER, **kw)


def page(i: int) -> bytes:
    return np.random.default_rng(1000 + i).integers(0, 256, SLOT, dtype=np.uint8).tobytes()


def container_files(path) -> list[str]:
    return sorted(os.listdir(os.path.join(path, "containers")))


def spread(r, n: int) -> None:
    """Writes n pages, then erases every other one so the live pages spread over all slots."""
    for i in range(2 * n):
        r.put(f"k{i}", page(i), tag=i % 7)
    for i in range(0, 2 * n, 2):
        assert r.erase(f"k{i}")


def check(r, keys) -> None:
    for i in keys:
        assert r.get(f"k{i}") == page(i), f"k{i} lost or changed"
        assert r.lookup(f"k{i}")["tag"] == i % 7


def test_grow_adds_preallocated_containers_and_keeps_pages(tmp_path):
    with region(tmp_path / "r", 2) as r:
        for i in range(10):
            r.put(f"k{i}", page(i), tag=i % 7)
        report = r.resize(5 * CONTAINER)
        assert report == {"containers_before": 2, "containers_after": 5, "moved": 0, "dropped": 0, "checksum_drops": 0}
        assert r.stats()["slots_total"] == 5 * 8 and r.max_bytes == 5 * CONTAINER
        for i in range(10, 40):  # the new slots are usable at once
            r.put(f"k{i}", page(i), tag=i % 7)
        check(r, range(40))
    assert container_files(tmp_path / "r") == [f"{c:04d}.bin" for c in range(5)]
    assert all(os.path.getsize(tmp_path / "r" / "containers" / f) == CONTAINER for f in container_files(tmp_path / "r"))
    # A restart with the new size recovers every page without invalidating anything.
    with region(tmp_path / "r", 5) as r:
        assert not r.recovery()["invalidated"] and not r.recovery()["warnings"]
        check(r, range(40))


def test_shrink_moves_the_cut_pages_and_survives_a_restart(tmp_path):
    with region(tmp_path / "r", 4) as r:
        spread(r, 12)  # 12 live pages, odd keys, in slots up to 23
        assert max(p["container"] for p in r.pages()) >= 2
        calls = []
        report = r.resize(2 * CONTAINER, batch_pages=3, progress=lambda done, total: calls.append((done, total)))
        assert report["containers_after"] == 2 and report["dropped"] == 0
        assert report["moved"] > 0
        assert calls and calls[-1] == (report["moved"], report["moved"]) and all(d <= 3 * (n + 1) for n, (d, _) in enumerate(calls))
        assert all(p["container"] < 2 for p in r.pages())
        check(r, range(1, 24, 2))
        assert all(f"k{i}" not in r for i in range(0, 24, 2))
        assert r.stats()["slots_total"] == 16
    assert container_files(tmp_path / "r") == ["0000.bin", "0001.bin"]
    with region(tmp_path / "r", 2) as r:
        assert not r.recovery()["invalidated"] and not r.recovery()["warnings"]
        check(r, range(1, 24, 2))
        assert len(r) == 12


def test_shrink_that_cannot_fit_changes_nothing_unless_dropping_oldest(tmp_path):
    with region(tmp_path / "r", 4) as r:
        for i in range(20):
            r.put(f"k{i}", page(i), tag=i % 7)
        with pytest.raises(DiskFullError, match=r"20 live pages|only 0 slots|erase 4 pages"):
            r.resize(2 * CONTAINER)
        assert r.stats()["slots_total"] == 32
        check(r, range(20))
        r.put("k20", page(20), tag=20 % 7)  # the old size keeps working
        report = r.resize(2 * CONTAINER, drop_oldest=True)
        assert report["dropped"] == 5 and report["moved"] == 0
        # The oldest pages of the cut containers went: keys 16..20 lay in container 2.
        assert len(r) == 16
        check(r, range(16))


def test_defragment_compacts_without_changing_pages(tmp_path):
    with region(tmp_path / "r", 4) as r:
        spread(r, 10)
        slots_before = sorted(p["container"] * 8 + p["slot"] for p in r.pages())
        assert slots_before != list(range(10))
        report = r.defragment()
        assert report["moved"] > 0
        assert sorted(p["container"] * 8 + p["slot"] for p in r.pages()) == list(range(10))
        check(r, range(1, 20, 2))
        assert r.defragment()["moved"] == 0
    with region(tmp_path / "r", 4) as r:
        assert sorted(p["container"] * 8 + p["slot"] for p in r.pages()) == list(range(10))
        check(r, range(1, 20, 2))


# Faults armed after the reopen: the first matching operations pass, then one fails mid-shrink
# (a page write, a page read, a journal sync of moved pages, the new region.json).
@pytest.mark.parametrize("op,target,after", [("pwrite", "containers", 1), ("pread", "containers", 1),
                                             ("fdatasync", "index.log", 1), ("pwrite", "region.json", 0)])
def test_io_error_during_a_shrink_loses_nothing(tmp_path, op, target, after):
    with region(tmp_path / "r", 4) as r:
        spread(r, 12)
    rules = [{"op": op, "path": target, "after": after, "errno": errno.EIO, "count": 1}]
    with region(tmp_path / "r", 4, _faults=rules) as r:
        with pytest.raises(DiskIoError, match="keeps its 4 containers"):
            r.resize(2 * CONTAINER, batch_pages=4)
        assert r.stats()["slots_total"] == 32
        check(r, range(1, 24, 2))
        r.put("new", page(99))  # the old size keeps working
        assert r.get("new") == page(99)
    with region(tmp_path / "r", 4) as r:
        assert not r.recovery()["invalidated"]
        check(r, range(1, 24, 2))
        assert len(r) == 13
        r.resize(2 * CONTAINER)  # the same shrink succeeds once the fault is gone
        check(r, range(1, 24, 2))


def test_reopen_with_another_size_resizes_in_place_only_when_asked(tmp_path):
    with region(tmp_path / "r", 4) as r:
        spread(r, 6)
    with region(tmp_path / "r", 3) as r:  # plain regions keep invalidating on a new geometry
        assert r.recovery()["invalidated"] and len(r) == 0


def test_bad_input_names_the_field(tmp_path):
    with region(tmp_path / "r", 2) as r:
        with pytest.raises(ValueError, match=r"max_bytes is 100; with container_bytes 32768 it must give 1..9999"):
            r.resize(100)
        with pytest.raises(ValueError, match=r"max_bytes is 0; it must be a positive integer"):
            r.resize(0)
        with pytest.raises(ValueError, match=r"batch_pages is 0"):
            r.defragment(batch_pages=0)


CRASH_WORKER = r"""
import sys, warnings
import numpy as np
from kvcodec_sdk.disk import DiskRegion
warnings.simplefilter("ignore")
path, containers = sys.argv[1], int(sys.argv[2])
SLOT, CONTAINER = %d, %d
def page(i):
    return np.random.default_rng(1000 + i).integers(0, 256, SLOT, dtype=np.uint8).tobytes()
r = DiskRegion(path, slot_bytes=SLOT, max_bytes=containers * CONTAINER, container_bytes=CONTAINER,
               io_mode="buffered", io_threads=2)
print("READY", flush=True)
while True:
    r.resize(4 * CONTAINER)
    for i in range(12):          # the same bytes again: the keys land in later slots
        r.put(f"k{i}", page(i), tag=i %% 7)
    r.resize(2 * CONTAINER, batch_pages=3)
    r.defragment(batch_pages=2)
""" % (SLOT, CONTAINER)


def test_kill_during_resizes_loses_nothing_and_serves_no_phantom(tmp_path):
    import random
    import signal
    import subprocess
    import sys
    import time
    import warnings

    path = tmp_path / "r"
    with region(path, 4) as r:
        for i in range(12):
            r.put(f"k{i}", page(i), tag=i % 7)
    rng = random.Random(5)
    for _ in range(int(os.environ.get("KVCODEC_DISK_RESIZE_CRASH_ITERATIONS", "6"))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            containers = DiskRegion.open_read_only(path).max_bytes // CONTAINER
        proc = subprocess.Popen([sys.executable, "-c", CRASH_WORKER, str(path), str(containers)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.02, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn journal tail is repaired with a warning
            r = DiskRegion.open_read_only(path)
        try:
            assert sorted(r.keys()) == sorted(f"k{i}".encode() for i in range(12))  # no loss, no phantom
            check(r, range(12))
            assert r.stats()["checksum_failures"] == 0
        finally:
            r.close()
