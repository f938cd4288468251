"""Recovery paths of the disk tier that the fast snapshot loader takes: entries applied while
they are parsed (so a malformed entry behind a good checksum must undo what was applied), and
the previous journal generation skipped by looking only at its last record."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvcodec_sdk.disk import DiskRegion, DiskTierWarning, crc32c

SLOT = 4096


def region(path, **kw):
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("max_bytes", 64 * SLOT)
    kw.setdefault("container_bytes", 16 * SLOT)
    kw.setdefault("io_threads", 2)
    kw.setdefault("snapshot_every", 0)
    return DiskRegion(path, **kw)


def page(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, SLOT, dtype=np.uint8).tobytes()


def reseal(text: bytes, mutate) -> bytes:
    """Applies `mutate` to the snapshot's entry lines and writes a matching body CRC, so only the
    entry parser can notice the damage."""
    lines = text.split(b"\n")
    header, body, trailer = lines[0], lines[1:-2], lines[-2]
    body = mutate(body)
    body_bytes = b"".join(line + b"\n" for line in body)
    crc = crc32c(body_bytes)
    trailer = re.sub(rb'"crc":"[0-9a-f]{8}"', b'"crc":"%08x"' % crc, trailer)
    return header + b"\n" + body_bytes + trailer + b"\n"


def two_generations(path):
    """After close: index.snapshot @8 (k0..k7), .bak @6 (k0..k5), index.log.1 = records 7..8."""
    with region(path) as r:
        for i in range(3):
            r.put(f"k{i}", page(i))
        r.snapshot()
        for i in range(3, 6):
            r.put(f"k{i}", page(i))
        r.snapshot()
        for i in range(6, 8):
            r.put(f"k{i}", page(i))
    return (path / "index.snapshot").read_bytes()


@pytest.mark.parametrize("damage", ["outside", "bad_hex", "short_count"])
def test_malformed_entry_behind_good_checksum_falls_back_cleanly(tmp_path, damage):
    path = tmp_path / "r"
    snap = two_generations(path)

    def mutate(body):
        body = list(body)
        assert len(body) == 8
        # A key no other file has, in an entry parsed (and applied) before the damage: it must
        # not survive the fallback.
        body[0] = b"ghost".hex().encode() + body[0][body[0].index(b" "):]
        if damage == "outside":    # the last entry names a container the region does not have
            f = body[-1].split(b" ")
            f[1] = b"999"
            body[-1] = b" ".join(f)
        elif damage == "bad_hex":  # a key that is not hex
            body[-1] = b"zz" + body[-1][2:]
        else:                      # one entry fewer than the header says
            body = body[:-1]
        return body

    (path / "index.snapshot").write_bytes(reseal(snap, mutate))
    with pytest.warns(DiskTierWarning, match="snapshot index.snapshot is damaged.*falling back to the backup"):
        r = region(path)
    with r:
        rec = r.recovery()
        assert rec["snapshot_used"] == "index.snapshot.bak" and rec["snapshot_entries"] == 6
        assert rec["dropped_entries"] == 0 and rec["journal_records_replayed"] == 2
        # Exactly the pages of .bak + both journal generations: nothing of the rejected
        # snapshot's partial application survives, nothing is lost.
        assert len(r) == 8
        assert all(r.get(f"k{i}") == page(i) for i in range(8))
        assert r.stats()["slots_live"] == 8


def test_resealed_snapshot_is_accepted_when_intact(tmp_path):
    """The helper above rewrites a snapshot the store accepts, so the damage cases fail for the
    damage alone."""
    path = tmp_path / "r"
    snap = two_generations(path)
    (path / "index.snapshot").write_bytes(reseal(snap, lambda body: body))
    with region(path) as r:
        rec = r.recovery()
        assert rec["snapshot_used"] == "index.snapshot" and rec["snapshot_entries"] == 8
        assert rec["journal_records_replayed"] == 0  # index.log.1 is covered and skipped
        assert all(r.get(f"k{i}") == page(i) for i in range(8))


def test_covered_generation_is_skipped_uncovered_one_replayed(tmp_path):
    path = tmp_path / "r"
    two_generations(path)
    with region(path) as r:
        assert r.recovery()["journal_records_replayed"] == 0
    # Without the main snapshot, the backup (@6) does not cover index.log.1 (7..8): replayed.
    two_generations(tmp_path / "s")
    (tmp_path / "s" / "index.snapshot").unlink()
    with region(tmp_path / "s") as r:
        rec = r.recovery()
        assert rec["snapshot_used"] == "index.snapshot.bak"
        assert rec["journal_records_replayed"] == 2
        assert all(r.get(f"k{i}") == page(i) for i in range(8))


def test_long_keys_and_large_covered_generation(tmp_path):
    """Keys of the maximum length and an index.log.1 larger than the 64 KiB read at each end."""
    path = tmp_path / "r"
    keys = [bytes([i % 251 + 1]) * 255 for i in range(40)] + [b"x"]
    with region(path, max_bytes=64 * SLOT) as r:
        for rnd in range(6):  # overwrites grow the journal past 64 KiB
            for i, k in enumerate(keys):
                r.put(k, page(i + rnd))
    # close() snapshotted and rotated every record above into index.log.1.
    assert (path / "index.log.1").stat().st_size > 128 << 10
    with region(path) as r:
        rec = r.recovery()
        assert rec["journal_records_replayed"] == 0 and rec["snapshot_entries"] == len(keys)
        assert all(r.get(k) == page(i + 5) for i, k in enumerate(keys))
