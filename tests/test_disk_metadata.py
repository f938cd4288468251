"""Damaged metadata of the disk tier: a damaged region.json is repaired from the identity the
journal and snapshots record (or the open is refused, naming what disagrees), never a silent wipe;
a damaged journal record never brings back an older value nor an erased key (it is repaired when a
single bit flipped, otherwise the keys whose latest state it hides become misses); buffers handed
to asynchronous reads and writes stay locked until their ticket completes."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import pytest

from kvcodec_sdk.disk import CodecIdentity, DiskRegion, DiskTierWarning

SLOT = 4096


def region(path, **kw):
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("max_bytes", 16 * SLOT)
    kw.setdefault("container_bytes", 8 * SLOT)
    kw.setdefault("io_threads", 1)
    kw.setdefault("io_mode", "buffered")
    kw.setdefault("snapshot_every", 0)
    kw.setdefault("name", "r")
    return DiskRegion(path, **kw)


def page(key: str, version: int) -> bytes:
    return np.random.default_rng([int.from_bytes(key.encode(), "little") & 0xFFFF, version]).integers(0, 256, SLOT, dtype=np.uint8).tobytes()


def flip(path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


# -- region.json -----------------------------------------------------------------------------------

PAGES = {f"k{i}": page(f"k{i}", 0) for i in range(6)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A closed region of six pages: index.snapshot and an index.log with records after it."""
    path = tmp_path_factory.mktemp("pristine") / "r"
    with region(path) as r:
        for k, v in list(PAGES.items())[:4]:
            r.put(k, v)
        r.snapshot()
        for k, v in list(PAGES.items())[4:]:
            r.put(k, v)
    return path


def copy_of(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def intact(r) -> bool:
    return len(r) == len(PAGES) and all(r.get(k) == v for k, v in PAGES.items())


def test_every_single_bit_flip_of_region_json_is_repaired_never_a_wipe(pristine, tmp_path):
    """Before: 247 of 302 flips erased every page with only a warning. Now the checksum of
    region.json detects every flip and the journal/snapshot identity repairs it."""
    size = (pristine / "region.json").stat().st_size
    repaired = wipes = refused = 0
    for offset in range(size):
        work = copy_of(pristine, tmp_path / "w")
        flip(work / "region.json", offset, offset % 8)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = region(work)
        except RuntimeError as exc:
            refused += 1
            assert "region.json" in str(exc), exc
            continue
        with r:
            if not intact(r):
                wipes += 1
                continue
            messages = " ".join(str(w.message) for w in caught)
            assert "region.json" in messages and "repaired" in messages, (offset, messages)
            repaired += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the repair was written: the next open is clean
            with region(work) as r:
                assert intact(r)
    assert (wipes, refused, repaired) == (0, 0, size), (wipes, refused, repaired)


def test_damaged_region_json_with_another_configuration_is_refused(pristine, tmp_path):
    """A damaged region.json and a configuration that disagrees with the recorded identity: the
    open is refused with the file and the disagreement named, and nothing is changed."""
    work = copy_of(pristine, tmp_path / "w")
    flip(work / "region.json", 40, 1)
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    other = CodecIdentity.from_name("concat", layout={"pools": [4096]})
    with pytest.raises(RuntimeError, match=r"region\.json is damaged.*codec_param_hash.*refus"):
        region(work, codec=other)
    with pytest.raises(RuntimeError, match=r"region\.json is damaged.*containers '2' -> '3'"):
        region(work, max_bytes=24 * SLOT)
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before
    with pytest.warns(DiskTierWarning, match="region.json .*repaired"):
        r = region(work)  # the configuration it was written with repairs it
    with r:
        assert intact(r)


def test_missing_region_json_is_recreated_from_the_journal_identity(pristine, tmp_path):
    work = copy_of(pristine, tmp_path / "w")
    (work / "region.json").unlink()
    with pytest.warns(DiskTierWarning, match="region.json .*missing.*repaired"):
        r = region(work)
    with r:
        assert intact(r)
    with pytest.raises(RuntimeError, match=r"region\.json is missing.*slot_bytes"):
        (work / "region.json").unlink()
        region(work, slot_bytes=2 * SLOT)


def legacy(path) -> None:
    """region.json as regions before the checksum wrote it."""
    meta = json.loads((path / "region.json").read_text())
    meta.pop("crc32c")
    numeric = {"format", "slot_bytes", "slot_stride", "container_bytes", "slots_per_container", "containers",
               "codec_format_version"}
    body = ",\n".join(f"  {json.dumps(k)}: {v if k in numeric else json.dumps(v)}" for k, v in sorted(meta.items()))
    (path / "region.json").write_text("{\n" + body + "\n}\n")


def test_region_json_without_a_checksum_opens_and_is_upgraded(pristine, tmp_path):
    work = copy_of(pristine, tmp_path / "w")
    legacy(work)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with region(work) as r:
            assert intact(r)
    assert "crc32c" in json.loads((work / "region.json").read_text())
    # A flipped identity field of such a file disagrees with the journal: repaired, not a wipe.
    legacy(work)
    text = (work / "region.json").read_text()
    (work / "region.json").write_text(text.replace('"slot_bytes": 4096', '"slot_bytes": 4097'))
    with pytest.warns(DiskTierWarning, match=r"region\.json .*slot_bytes '4097' -> '4096'.*repaired"):
        r = region(work)
    with r:
        assert intact(r)


def test_read_only_open_of_a_damaged_region_json_uses_the_recorded_identity(pristine, tmp_path):
    work = copy_of(pristine, tmp_path / "w")
    flip(work / "region.json", 60, 3)
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    with pytest.warns(DiskTierWarning, match=r"region\.json is damaged.*read-only"):
        r = DiskRegion.open_read_only(work)
    with r:
        assert intact(r)
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before
    for leaf in ("index.log", "index.log.1", "index.snapshot", "index.snapshot.bak"):
        (work / leaf).unlink(missing_ok=True)
    with pytest.raises(RuntimeError, match=r"region\.json is damaged.*no journal or snapshot"):
        DiskRegion.open_read_only(work)


def test_manager_regions_with_damaged_region_json_are_repaired_and_resized(tmp_path):
    """The KV-cache manager opens its regions with resize_on_open: a damaged region.json whose
    recorded identity differs from the configuration only in the container count is repaired
    as recorded, then resized in place; every page is found again, byte-exact."""
    from test_kvcm_disk_resize import CONTAINER, disk_config, on_disk
    from test_kvcm_support import hot_bytes

    from kvcodec_sdk import CacheLevel, KVCacheManager

    m = KVCacheManager(disk_config(tmp_path))
    pages, model = on_disk(m, np.random.default_rng(5), [4, 4], keys=True)
    keys = {p.key: model[p.id] for p in pages}
    m.close()
    for g in ("group0", "group1"):
        flip(tmp_path / g / "region.json", 50, 2)
    m = KVCacheManager(disk_config(tmp_path, max_bytes=24 * CONTAINER))  # another configured size
    try:
        for g in (0, 1):
            stats = m.disk_stats(g)
            assert not stats["invalidated"] and any("region.json is damaged" in w and "repaired" in w
                                                    for w in stats["warnings"]), stats["warnings"]
        assert m.quota(CacheLevel.DISK) == 24 * CONTAINER
        found = m.find_on_disk(list(keys))
        assert all(f is not None for f in found)
        m.onboard(found, source=CacheLevel.DISK)
        assert all(np.array_equal(hot_bytes(m, f), keys[f.key]) for f in found)
    finally:
        m.close()


# -- journal records -------------------------------------------------------------------------------

def scripted_history(path):
    """Writes, overwrites and erases, one snapshot in the middle; returns (expected, keys).

    The directory is copied while the region is open (every record durable, no final snapshot), as a
    crash would leave it: index.snapshot covers the first records, index.log holds the rest.
    """
    expected: dict[str, bytes | None] = {}
    version = 0
    src = path.parent / (path.name + "-live")
    r = region(src)

    def put(k):
        nonlocal version
        version += 1
        expected[k] = page(k, version)
        r.put(k, expected[k])

    def erase(k):
        assert r.erase(k)
        expected[k] = None

    for k in ("a", "b", "c", "d", "e"):
        put(k)
    r.snapshot()
    for step in (lambda: put("a"), lambda: erase("b"), lambda: put("f"), lambda: put("c"), lambda: erase("f"),
                 lambda: put("b"), lambda: put("c"), lambda: erase("d"), lambda: put("g"), lambda: put("a"),
                 lambda: erase("e"), lambda: put("h")):
        step()
    r.flush()
    shutil.copytree(src, path)
    r.close()
    shutil.rmtree(src)
    return expected


def served(path, expected, messages=None):
    """Opens the region and classifies every key: (right, misses, stale, resurrected); the
    recovery warnings are appended to `messages`."""
    right = misses = stale = resurrected = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = region(path)
    if messages is not None:
        messages.extend(str(w.message) for w in caught)
    with r:
        for k, want in expected.items():
            got = r.get(k)
            if got is None:
                misses += want is not None
            elif want is None:
                resurrected += 1
            elif got != want:
                stale += 1
            else:
                right += 1
    return right, misses, stale, resurrected


def journal_lines(path) -> list[bytes]:
    return (path / "index.log").read_bytes().split(b"\n")[:-1]


def damage_line(path, index: int, how: str) -> None:
    lines = journal_lines(path)
    line = lines[index]
    if how == "garbage":  # several bytes overwritten: beyond what a checksum can repair
        mid = len(line) // 2
        line = line[:mid - 6] + b"zzzzzzzzzzzz" + line[mid + 6:]
    elif how == "drop":
        lines.pop(index)
        (path / "index.log").write_bytes(b"".join(x + b"\n" for x in lines))
        return
    lines[index] = line
    (path / "index.log").write_bytes(b"".join(x + b"\n" for x in lines))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "r"
    expected = scripted_history(path)
    return path, expected


def test_history_is_served_exactly_when_undamaged(history, tmp_path):
    path, expected = history
    work = copy_of(path, tmp_path / "w")
    assert len(journal_lines(work)) == 13  # header + 12 records after the snapshot
    assert served(work, expected) == (sum(v is not None for v in expected.values()), 0, 0, 0)


def test_single_bit_flips_in_every_journal_record_are_repaired(history, tmp_path):
    """Before: a flipped record was skipped (or taken for a torn tail) and the older value of an
    overwritten key or an erased key was served. A single flipped bit is now corrected: no loss."""
    path, expected = history
    live = sum(v is not None for v in expected.values())
    tried = 0
    lines = journal_lines(path)
    for index in range(1, len(lines)):
        start = sum(len(x) + 1 for x in lines[:index])
        for offset in [*range(0, len(lines[index]), 5), len(lines[index])]:  # every 5th byte and the newline
            work = copy_of(path, tmp_path / "w")
            flip(work / "index.log", start + offset, (offset + index) % 8)
            assert served(work, expected) == (live, 0, 0, 0), (index, offset)
            tried += 1
    assert tried > 200


@pytest.mark.parametrize("how", ["garbage", "drop"])
def test_unrepairable_journal_damage_never_serves_an_older_value(history, tmp_path, how):
    """A record damaged beyond repair (or missing): the keys whose latest state it hides read as
    misses; no overwritten value comes back and no erased key reappears."""
    path, expected = history
    n = len(journal_lines(path))
    stale = resurrected = misses = 0
    last = n - 1 if how == "garbage" else n - 2  # a missing last record is a crash before its ack
    for index in range(1, last + 1):
        work = copy_of(path, tmp_path / "w")
        damage_line(work, index, how)
        messages: list[str] = []
        _, m, s, res = served(work, expected, messages)
        stale, resurrected, misses = stale + s, resurrected + res, misses + m
        text = " ".join(messages)
        assert "never acknowledged" not in text, text
        if m:
            assert re.search(r"damaged|missing", text) and "dropped" in text, text
    assert (stale, resurrected) == (0, 0)
    assert misses > 0  # the damage did cost something: it was not silently ignored


@pytest.mark.parametrize("tail", ["cut", "zeros", "cut+zeros"])
def test_an_append_cut_short_by_a_crash_still_recovers_as_before(history, tmp_path, tail):
    """A last record cut short (or a block of the append that never reached the disk, read back as
    zeros) was never acknowledged: it alone is dropped and the journal cut back; nothing older is."""
    path, expected = history
    work = copy_of(path, tmp_path / "w")
    log = work / "index.log"
    data = log.read_bytes()
    last_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    if tail == "cut":
        data = data[:-25]
    elif tail == "zeros":
        data = data[:last_start] + bytes(len(data) - last_start)
    else:
        data = data[:-25] + bytes(4096)
    log.write_bytes(data)
    with pytest.warns(DiskTierWarning, match="index.log ends with a truncated or torn record"):
        r = region(work)
    with r:
        assert r.recovery()["truncated_tail_bytes"] == len(data) - last_start
        assert r.recovery()["dropped_entries"] == 0
        # Cut back to the last whole record, then rotated by the snapshot recovery writes after damage.
        assert (work / "index.log.1").read_bytes() == data[:last_start]
    right, misses, stale, resurrected = served(work, expected)
    assert (misses, stale, resurrected) == (1, 0, 0)  # the last record's key: its put was never acknowledged


def test_flipped_journal_header_keeps_the_records(history, tmp_path):
    """Before: a flipped bit in index.log's header discarded every record after the snapshot (and
    served the snapshot's older values)."""
    path, expected = history
    live = sum(v is not None for v in expected.values())
    header = journal_lines(path)[0]
    for offset in range(0, len(header), 3):
        work = copy_of(path, tmp_path / "w")
        flip(work / "index.log", offset, offset % 8)
        assert served(work, expected) == (live, 0, 0, 0), offset


def test_damage_in_the_previous_generation_when_the_backup_is_used(tmp_path):
    """The main snapshot is damaged, so index.snapshot.bak and both journal generations are
    replayed: damage in index.log.1 is handled like damage in index.log."""
    src = tmp_path / "live"
    expected: dict[str, bytes | None] = {}
    r = region(src)
    for i, k in enumerate("abcd"):
        expected[k] = page(k, i)
        r.put(k, expected[k])
    r.snapshot()                      # .bak will be this one
    expected["a"] = page("a", 10)
    r.put("a", expected["a"])
    r.erase("b")
    expected["b"] = None
    expected["e"] = page("e", 11)
    r.put("e", expected["e"])
    r.snapshot()                      # index.log.1: the three records above
    expected["c"] = page("c", 12)
    r.put("c", expected["c"])
    r.flush()
    base = tmp_path / "base"
    shutil.copytree(src, base)
    r.close()
    snap = base / "index.snapshot"
    snap.write_bytes(snap.read_bytes()[:-10])
    old = (base / "index.log.1").read_bytes().split(b"\n")[:-1]
    assert len(old) == 4
    stale = resurrected = 0
    for index in range(1, 4):
        for how in ("flip", "garbage"):
            work = copy_of(base, tmp_path / "w")
            lines = list(old)
            if how == "flip":
                b = bytearray(lines[index])
                b[20] ^= 4
                lines[index] = bytes(b)
            else:
                lines[index] = lines[index][:30] + b"#" * 10 + lines[index][40:]
            (work / "index.log.1").write_bytes(b"".join(x + b"\n" for x in lines))
            right, m, s, res = served(work, expected)
            stale, resurrected = stale + s, resurrected + res
            if how == "flip":
                assert (m, s, res) == (0, 0, 0), index
    assert (stale, resurrected) == (0, 0)


# -- buffers of asynchronous operations ------------------------------------------------------------

def test_buffers_stay_locked_until_their_ticket_completes(tmp_path):
    """Before: a bytearray resized between submit_read and wait was freed under the worker."""
    with region(tmp_path / "r") as r:
        r.put("a", page("a", 1))
        out = bytearray(SLOT)
        t = r.submit_read("a", out)
        with pytest.raises(BufferError):
            out.extend(b"x" * (1 << 20))
        with pytest.raises(BufferError):
            del out[:]
        assert r.wait(t).ok and bytes(out) == page("a", 1)
        out.extend(b"x")  # released at completion
        src = bytearray(page("b", 2))
        t = r.submit_write("b", src)
        with pytest.raises(BufferError):
            src.clear()
        assert r.wait(t).ok
        src.clear()
        # A ticket never collected keeps its buffer locked until the region closes.
        pending = bytearray(SLOT)
        r.submit_read("a", pending)
        r.flush()
        with pytest.raises(BufferError):
            pending.append(0)
    pending.append(0)
