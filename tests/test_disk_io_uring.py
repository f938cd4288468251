"""The disk store's I/O backends: io_uring (batched submissions) and the thread pool.

Both write the same files; a region written by one reads back through the other. Where the
kernel refuses io_uring the tests that need it skip and say so (``auto`` then runs the pool).
"""

from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest

from kvcodec_sdk.disk import DiskRegion

SLOT = 16384


def region(path, **kw):
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("max_bytes", 256 * SLOT)
    kw.setdefault("container_bytes", 64 * SLOT)
    return DiskRegion(path, **kw)


def page(i: int, size: int = SLOT) -> bytes:
    """KV-like bytes: bf16 words of a smooth signal plus noise, different per page."""
    rng = np.random.default_rng(i)
    x = np.sin(np.arange(size // 2) / 17.0 + i) + rng.normal(0, 0.05, size // 2)
    words = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    raw = words.tobytes()
    return raw + bytes(size - len(raw))


@pytest.fixture(scope="module")
def uring(tmp_path_factory) -> None:
    """Skips when this kernel (or a sandbox) refuses io_uring."""
    with region(tmp_path_factory.mktemp("probe") / "r", io_backend="auto") as r:
        stats = r.stats()
    if stats["io_backend"] != "io_uring":
        pytest.skip(f"io_uring is not available here: {stats['io_backend_note']}")


def pages_in(buf, n: int, size: int = SLOT) -> list[memoryview]:
    view = memoryview(buf)
    return [view[i * size : (i + 1) * size] for i in range(n)]


@pytest.mark.parametrize("io_mode", ["auto", "buffered"])
def test_io_uring_batches_requests_and_round_trips(tmp_path, uring, io_mode):
    n = 200
    src, dst = mmap.mmap(-1, n * SLOT), mmap.mmap(-1, n * SLOT)
    for i, v in enumerate(pages_in(src, n)):
        v[:] = page(i)
    with region(tmp_path / "r", io_backend="io_uring", io_threads=2, queue_depth=16, io_mode=io_mode) as r:
        writes = [r.submit_write(f"k{i}", v, tag=i) for i, v in enumerate(pages_in(src, n))]
        assert all(r.wait(t).ok for t in writes)
        reads = [r.submit_read(f"k{i}", v) for i, v in enumerate(pages_in(dst, n))]
        done = [r.wait(t) for t in reads]
        stats = r.stats()
    assert all(d.ok for d in done) and [d.tag for d in done] == list(range(n))
    for i, v in enumerate(pages_in(dst, n)):
        assert bytes(v) == page(i), f"page {i} differs"
    assert stats["io_backend"] == "io_uring" and stats["io_backend_note"] == ""
    # Every page went through a queue, and queued submissions carried several requests or merged runs.
    assert stats["queued_submits"] > 0
    assert stats["queued_requests"] + stats["merged_slots"] - stats["merged_ios"] >= 2 * n, stats
    assert stats["queued_requests"] > stats["queued_submits"] or stats["merged_ios"] > 0, stats


def test_a_region_written_with_io_uring_reads_back_through_the_thread_pool(tmp_path, uring):
    with region(tmp_path / "r", io_backend="io_uring") as r:
        for i in range(30):
            r.put(f"k{i}", page(i))
    with region(tmp_path / "r", io_backend="threads") as r:
        assert r.stats()["io_backend"] == "threads" and r.stats()["queued_submits"] == 0
        for i in range(30):
            assert r.get(f"k{i}") == page(i)
        for i in range(30, 40):
            r.put(f"k{i}", page(i))
    with region(tmp_path / "r", io_backend="io_uring") as r:
        for i in range(40):
            assert r.get(f"k{i}") == page(i)


def test_unaligned_buffers_and_padded_slots_take_the_bounce_path(tmp_path, uring):
    """Under O_DIRECT a misaligned buffer or a slot smaller than its stride cannot be used in place:
    such pages go one at a time through the worker's bounce buffer, byte-exact."""
    odd = 5000
    with region(tmp_path / "a", io_backend="io_uring", slot_bytes=odd) as r:
        tickets = [r.submit_write(f"k{i}", page(i, odd)) for i in range(20)]
        assert all(r.wait(t).ok for t in tickets)
        for i in range(20):
            assert r.get(f"k{i}") == page(i, odd)
    with region(tmp_path / "b", io_backend="io_uring") as r:
        raw = bytearray(SLOT + 3)
        src = memoryview(raw)[3:]
        src[:] = page(9)
        r.put("x", src)
        dst = memoryview(bytearray(SLOT + 5))[5:]
        assert r.wait(r.submit_read("x", dst)).ok and bytes(dst) == page(9)


def test_a_damaged_page_read_through_io_uring_is_a_checksum_miss(tmp_path, uring):
    with region(tmp_path / "r", io_backend="io_uring") as r:
        for i in range(8):
            r.put(f"k{i}", page(i))
        loc = r.lookup("k3")
        stride = r._native.slot_stride
    path = tmp_path / "r" / "containers" / ("%04d.bin" % loc["container"])
    with open(path, "r+b") as f:
        f.seek(loc["slot"] * stride + 77)
        b = f.read(1)
        f.seek(loc["slot"] * stride + 77)
        f.write(bytes([b[0] ^ 0x01]))
    with region(tmp_path / "r", io_backend="io_uring") as r:
        bufs = [bytearray(SLOT) for _ in range(8)]
        done = [r.wait(t) for t in [r.submit_read(f"k{i}", bufs[i]) for i in range(8)]]
        assert done[3].status == "checksum_mismatch"
        assert all(d.ok and bytes(bufs[i]) == page(i) for i, d in enumerate(done) if i != 3)
        assert r.stats()["checksum_failures"] == 1


def test_concurrent_submitters_on_io_uring(tmp_path, uring):
    errors: list[str] = []
    with region(tmp_path / "r", io_backend="io_uring", io_threads=3, queue_depth=4) as r:
        def worker(w: int) -> None:
            for j in range(40):
                key = f"w{w}-{j}"
                r.put(key, page(1000 * w + j))
                got = r.get(key)
                if got != page(1000 * w + j):
                    errors.append(key)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(r) == 160
    assert not errors, errors


def test_the_fault_seam_keeps_the_thread_pool_and_says_why(tmp_path):
    faults = [{"op": "pread", "after": 10**9}]  # never fires
    with region(tmp_path / "a", io_backend="auto", _faults=faults) as r:
        stats = r.stats()
        assert stats["io_backend"] == "threads" and "FileIo" in stats["io_backend_note"]
        r.put("a", page(1))
        assert r.get("a") == page(1)
    with pytest.raises(RuntimeError, match="io_backend is io_uring, but .*valid where io_uring is refused: auto or threads"):
        region(tmp_path / "b", io_backend="io_uring", _faults=faults)


@pytest.mark.parametrize("kw", [{}, {"io_backend": "threads"}], ids=["default", "asked"])
def test_threads_backend_is_the_default_and_used_when_asked(tmp_path, kw):
    with region(tmp_path / "r", **kw) as r:
        r.put("a", page(2))
        assert r.get("a") == page(2)
        stats = r.stats()
    assert stats["io_backend"] == "threads" and stats["queued_submits"] == 0 and stats["io_backend_note"] == ""


@pytest.mark.parametrize(("kw", "message"), [
    ({"io_backend": "uring"}, "io_backend is 'uring'; valid: auto, threads, io_uring"),
    ({"queue_depth": 0}, "queue_depth is 0; valid: 1..4096"),
    ({"queue_depth": 5000}, "queue_depth is 5000; valid: 1..4096"),
    ({"queue_depth": -1}, "queue_depth is -1; it must be a non-negative integer"),
])
def test_bad_backend_settings_name_the_field(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        region(tmp_path / "r", **kw)
