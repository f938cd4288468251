"""What every remote backend must do, checked against its real server: a mixin each backend's test
module subclasses (pandas' extension-test style), providing the fixtures named below.

Fixtures a subclass provides:

- ``store``: the running server, with ``kill()`` (SIGKILL) and ``start()`` (same address).
- ``make_backend``: ``make_backend(identity=..., **options)`` → a backend on ``store``; all are
  closed at teardown.
- ``raw_put``: ``raw_put(backend, key, data)`` writes ``data`` as the stored value of content
  key ``key``, bypassing the header (what another writer, a bug or bit rot would leave).
- ``restart_iterations``: how many kill/restart rounds the data-safety loop runs.

Content keys are the SHA-256 of the payload, so any payload returned can be checked against its
key: a wrong page is one whose bytes do not hash to the key it was read under.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest

from kvcodec_sdk.remote import (
    GET_CORRUPT,
    GET_MISMATCH,
    GET_MISS,
    GET_TOO_SMALL,
    HEADER_BYTES,
    RemoteError,
    RemoteUnavailable,
    Status,
    ValueHeader,
)

IDENTITY = "concat/1/0123456789abcdef"
OTHER_IDENTITY = "fp8/1/fedcba9876543210"


def content_key(blob) -> bytes:
    """The content key of a blob: its SHA-256 (32 bytes)."""
    return hashlib.sha256(memoryview(blob).cast("B")).digest()


def stop_process(proc, timeout_s: float = 5.0) -> None:
    """Sends SIGSTOP to ``proc`` and returns once the kernel shows it stopped: kill() returns before
    the signal takes effect, and a server thread still running could answer one more request."""
    import signal

    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.001)
    raise AssertionError(f"process {proc.pid} did not stop within {timeout_s} s of SIGSTOP")


def out_buffers(sizes, fill: int = 0xA5) -> list[np.ndarray]:
    """Writable buffers of the given sizes, filled with a sentinel byte."""
    return [np.full(n, fill, dtype=np.uint8) for n in sizes]


def check_pages(keys, codes, outs) -> tuple[int, int]:
    """``(hits, wrong)``: payloads returned, and those whose bytes do not hash to their key."""
    hits = wrong = 0
    for k, code, out in zip(keys, codes, outs):
        if code >= 0:
            hits += 1
            wrong += content_key(out[:code]) != k
    return hits, wrong


class BackendContract:
    """Tests every backend passes against its real server."""

    def test_round_trip_is_byte_exact(self, make_backend, blobs):
        be = make_backend(identity=IDENTITY)
        keys = [content_key(b) for b in blobs]
        assert be.put_batch(keys, blobs) == [Status.OK] * len(blobs)
        outs = out_buffers([len(b) + 100 for b in blobs])  # larger than the payload: the rest is untouched
        codes = be.get_batch(keys, outs)
        assert codes == [len(b) for b in blobs]
        for b, out in zip(blobs, outs):
            assert np.array_equal(out[:len(b)], b)
            assert (out[len(b):] == 0xA5).all()
        assert be.stats.puts == len(blobs) and be.stats.hits == len(blobs)
        assert be.stats.put_bytes == be.stats.get_bytes == sum(len(b) for b in blobs)

    def test_a_second_instance_reads_what_the_first_wrote(self, make_backend, blobs):
        writer, reader = make_backend(identity=IDENTITY), make_backend(identity=IDENTITY)
        keys = [content_key(b) for b in blobs]
        writer.put_batch(keys, [bytes(b) for b in blobs])  # bytes as well as arrays
        outs = out_buffers([len(b) for b in blobs])
        assert reader.get_batch(keys, [bytearray(o) for o in outs]) == [len(b) for b in blobs]
        assert check_pages(keys, reader.get_batch(keys, outs), outs) == (len(blobs), 0)

    def test_unknown_keys_are_misses(self, make_backend, blobs):
        be = make_backend(identity=IDENTITY)
        be.put_batch([content_key(blobs[0])], [blobs[0]])
        keys = [content_key(b"never stored %d" % i) for i in range(5)] + [content_key(blobs[0])]
        outs = out_buffers([len(blobs[0])] * 6)
        assert be.get_batch(keys, outs) == [GET_MISS] * 5 + [len(blobs[0])]
        assert be.stats.misses == 5 and be.stats.hits == 1
        assert all((o == 0xA5).all() for o in outs[:5])
        assert be.exists_batch(keys) == [False] * 5 + [True]

    def test_remove(self, make_backend, blobs):
        be = make_backend(identity=IDENTITY)
        keys = [content_key(b) for b in blobs[:4]]
        be.put_batch(keys, blobs[:4])
        assert be.remove_batch(keys[:2]) == [True, True]
        assert be.exists_batch(keys) == [False, False, True, True]
        assert be.get_batch(keys[:2], out_buffers([len(b) for b in blobs[:2]])) == [GET_MISS, GET_MISS]
        assert be.remove_batch(keys[:1]) == [False]

    def test_another_codec_identity_is_refused(self, make_backend, blobs):
        mine, theirs = make_backend(identity=IDENTITY), make_backend(identity=OTHER_IDENTITY)
        keys = [content_key(b) for b in blobs[:6]]
        theirs.put_batch(keys, blobs[:6])
        outs = out_buffers([len(b) for b in blobs[:6]])
        assert mine.get_batch(keys, outs) == [GET_MISMATCH] * 6
        assert mine.stats.mismatches == 6 and mine.stats.hits == 0
        assert all((o == 0xA5).all() for o in outs)
        assert theirs.get_batch(keys, outs) == [len(b) for b in blobs[:6]]

    def test_damaged_values_are_misses_never_data(self, make_backend, raw_put, blobs):
        be = make_backend(identity=IDENTITY)
        payload = bytes(blobs[3])  # 4096 bytes
        good_key = content_key(payload)
        be.put_batch([good_key], [payload])
        good = be._pack_value(good_key, payload, "payload")
        other = be._pack_value(content_key(b"other"), b"other page", "payload")

        def flip(data: bytes, at: int) -> bytes:
            return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]

        damaged = {
            "shorter than a header": good[:HEADER_BYTES - 1],
            "header alone": good[:HEADER_BYTES],
            "payload cut short": good[:-1],
            "one byte too many": good + b"\0",
            "payload bit flipped": flip(good, HEADER_BYTES + 100),
            "magic bit flipped": flip(good, 0),
            "length bit flipped": flip(good, 16),
            "header checksum bit flipped": flip(good, 45),
            "stored under another key": other,
            "not a value of this tier": b"x" * 5000,
        }
        keys = [content_key(name.encode()) for name in damaged]
        for k, data in zip(keys, damaged.values()):
            raw_put(be, k, data)
        outs = out_buffers([8192] * len(keys))
        codes = be.get_batch(keys, outs)
        assert codes == [GET_CORRUPT] * len(keys), dict(zip(damaged, codes))
        assert be.stats.corrupt == len(keys) and be.stats.hits == 0
        assert all((o == 0xA5).all() for o in outs)
        assert ValueHeader.check(good, good_key, be.identity, len(good)) == (len(payload), ValueHeader.for_payload(
            good_key, memoryview(payload), be.identity).payload_crc)

    def test_a_buffer_too_small_is_refused(self, make_backend, blobs):
        be = make_backend(identity=IDENTITY)
        key = content_key(blobs[4])
        be.put_batch([key], [blobs[4]])
        out = out_buffers([len(blobs[4]) - 1])
        assert be.get_batch([key], out) == [GET_TOO_SMALL]
        assert be.stats.too_small == 1 and (out[0] == 0xA5).all()

    def test_bad_arguments_name_the_field(self, make_backend):
        be = make_backend(identity=IDENTITY)
        with pytest.raises(ValueError, match="values: 1 entries for 2 keys"):
            be.put_batch([b"a", b"b"], [b"x"])
        with pytest.raises(TypeError, match=r"keys\[0\]"):
            be.put_batch(["a"], [b"x"])
        with pytest.raises(ValueError, match=r"out_buffers\[0\]: the buffer is read-only"):
            be.get_batch([b"a"], [b"read-only"])
        with pytest.raises(ValueError, match="identity"):
            make_backend(identity="")
        with pytest.raises(ValueError, match="timeout_s"):
            make_backend(identity=IDENTITY, timeout_s=0)

    def test_a_closed_backend_raises(self, make_backend):
        be = make_backend(identity=IDENTITY)
        be.close()
        be.close()
        with pytest.raises(RemoteUnavailable, match="closed"):
            be.get_batch([b"k"], [bytearray(8)])

    def test_a_dead_store_is_a_clear_error_soon(self, store, make_backend, blobs):
        be = make_backend(identity=IDENTITY, timeout_s=1.0)
        keys = [content_key(b) for b in blobs[:4]]
        be.put_batch(keys, blobs[:4])
        store.kill()
        for call in (lambda: be.put_batch(keys, blobs[:4]), lambda: be.get_batch(keys, out_buffers([1 << 18] * 4))):
            t0 = time.monotonic()
            with pytest.raises(RemoteError) as info:
                call()
            assert time.monotonic() - t0 < 3.0
            assert info.value.backend == be.name and info.value.address == be.address
            assert isinstance(info.value, RemoteUnavailable), info.value

    def test_store_killed_mid_batch_never_gives_wrong_data(self, store, make_backend, restart_iterations):
        """Kill the store at a random moment during put and get batches, restart it, again:
        every call returns or raises a RemoteError in bounded time, and no page read is wrong."""
        rng = np.random.default_rng(50)
        be = make_backend(identity=IDENTITY, timeout_s=1.0)
        hits = wrong = failures = 0
        for it in range(restart_iterations):
            blobs = [rng.integers(0, 256, int(n), dtype=np.uint8) for n in rng.integers(1 << 14, 1 << 17, 16)]
            keys = [content_key(b) for b in blobs]
            killer = threading.Timer(float(rng.uniform(0, 0.01)), store.kill)
            killer.start()
            t0 = time.monotonic()
            for op in ("put", "get"):
                try:
                    if op == "put":
                        be.put_batch(keys, blobs)
                    else:
                        outs = out_buffers([len(b) for b in blobs])
                        h, w = check_pages(keys, be.get_batch(keys, outs), outs)
                        hits, wrong = hits + h, wrong + w
                except RemoteError:
                    failures += 1
            assert time.monotonic() - t0 < 6.0, f"iteration {it}: calls took too long"
            killer.join()
            store.start()
            self.after_restart(be)
            outs = out_buffers([len(b) for b in blobs])
            try:  # after the restart: misses or the right pages, whatever was kept
                h, w = check_pages(keys, be.get_batch(keys, outs), outs)
                hits, wrong = hits + h, wrong + w
            except RemoteError:
                failures += 1
        assert wrong == 0
        assert failures > 0, "the kill never hit a call: the test did not test anything"
        assert be.stats.corrupt == 0
        # The store came back every time: a fresh batch goes through and reads back exactly.
        blob = rng.integers(0, 256, 5000, dtype=np.uint8)
        self.put_when_ready(be, [content_key(blob)], [blob])
        out = out_buffers([5000])
        assert be.get_batch([content_key(blob)], out) == [5000] and np.array_equal(out[0], blob)

    def after_restart(self, backend) -> None:
        """Hook: what a backend's client needs after its store restarted (nothing by default)."""

    def put_when_ready(self, backend, keys, values) -> None:
        """Hook: a put after a restart (a backend may need a moment to rejoin)."""
        backend.put_batch(keys, values)
