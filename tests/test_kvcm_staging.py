"""The staging manager (kvcm/staging.h) under a runtime whose events log every operation:
next-fit allocation, wrap-around, size granularity and alignment, padding that keeps the events
of every range it came from, capacity pressure, the optional-stream ownership table and the
destruction order."""

from __future__ import annotations

import pytest

from kvcodec_sdk import _native


class Harness:
    """The native StagingHarness, its leases, ranges and log as tuples for compact assertions."""

    def __init__(self, *args, **kwargs):
        self._native = _native.kvcm_testing.StagingHarness(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._native, name)

    def lease(self, lease_id):
        lease = self._native.lease(lease_id)
        return (lease.offset, lease.size, lease.stream, lease.data_offset)

    def ranges(self):
        return [(r.offset, r.size, r.live, r.event) for r in self._native.ranges()]

    def log(self):
        return [(o.op, o.event, o.stream) for o in self._native.log()]


S1, S2, S3 = 0x1001, 0x1002, 0x1003  # stream handles (plain numbers under the recording runtime)


def ops(h, kind=None):
    return [o for o in h.log() if kind is None or o[0] == kind]


def test_backing_owner_decides_kind_and_base():
    dev, host = Harness(4096, "device"), Harness(4096, "host")
    assert (dev.kind, host.kind) == ("device", "host")
    assert dev.capacity == host.capacity == 4096 and dev.base % 4096 == 0
    assert dev.ranges() == [(0, 4096, False, 0)]


@pytest.mark.parametrize(
    "args, message",
    [
        ((8, 8, 0, 8), "granularity is 0"),
        ((8, 8, 8, 3), "alignment is 3; it must be a power of two"),
        ((8, 8, 12, 8), "granularity 12 is not a multiple of the alignment 8"),
        ((0, 8, 8, 8), "minBytes is 0"),
        ((20, 20, 8, 8), "maxBytes 20 rounds down to 16, below minBytes 20 rounded up to 24"),
    ],
)
def test_bad_requests_are_rejected_with_the_parameter_named(args, message):
    h = Harness(4096)
    with pytest.raises(ValueError, match=message):
        h.acquire(*args, None)
    assert h.cursor == 0 and h.ranges() == [(0, 4096, False, 0)]


def test_sizes_round_minimum_up_and_maximum_down_with_any_granularity():
    h = Harness(1000)
    a = h.acquire(10, 100, 24, 8, None)  # granularity 24 (not a power of two), alignment 8
    off, size, stream, _ = h.lease(a)
    assert (off, size, stream) == (0, 96, None)
    b = h.acquire(30, 10_000, 24, 8, None)  # takes what is left, rounded down to 24s
    off, size, _, _ = h.lease(b)
    assert off == 96 and size == (1000 - 96) // 24 * 24 and size % 24 == 0
    # End-of-ring slack stays retired.
    assert h.ranges()[-1] == (96 + size, 1000 - 96 - size, False, 0)


def test_next_fit_cursor_moves_only_on_success():
    h = Harness(1024)
    a = h.acquire(256, 256, 64, 64, None)
    b = h.acquire(256, 256, 64, 64, None)
    assert [h.lease(x)[0] for x in (a, b)] == [0, 256] and h.cursor == 512
    assert h.acquire(1024, 1024, 64, 64, None) is None  # does not fit anywhere
    assert h.cursor == 512
    h.release(a)
    c = h.acquire(64, 64, 64, 64, None)  # next fit continues after b, not in the freed hole
    assert h.lease(c)[0] == 512 and h.cursor == 576


def test_wrap_around_takes_one_pass_from_the_beginning():
    h = Harness(1024)
    leases = [h.acquire(256, 256, 64, 64, None) for _ in range(4)]
    assert h.cursor == 1024
    h.release(leases[1])
    x = h.acquire(200, 256, 8, 8, None)
    assert h.lease(x)[:2] == (256, 256) and h.cursor == 512
    assert h.acquire(8, 8, 8, 8, None) is None  # everything live: fail rather than wait


def test_allocation_skips_live_ranges_inside_a_run():
    h = Harness(1024)
    a, b, c = (h.acquire(128, 128, 8, 8, None) for _ in range(3))
    h.release(a)
    h.release(c)  # retired [0,128) and [256,1024), live b in between
    h2 = h.acquire(200, 200, 8, 8, None)
    assert h.lease(h2)[0] == 384  # from the cursor (384), past the live lease
    h3 = h.acquire(128, 128, 8, 8, None)
    assert h.lease(h3)[0] == 584
    # 400 bytes: [712, 1024) after the cursor is too small, and the second pass finds only the
    # runs [0, 128) and [256, 384), each cut short by a live lease.
    assert h.acquire(400, 400, 8, 8, None) is None
    assert h.cursor == 712


def test_stream_release_records_and_next_owner_waits_without_invalidating():
    h = Harness(1024)
    a = h.acquire(512, 512, 8, 8, S1)
    h.release(a)
    assert ops(h) == [("record", 1, S1)]
    assert h.ranges()[0] == (0, 512, False, 1)
    h.clear_log()
    b = h.acquire(256, 256, 8, 8, S2)  # cursor is at 512: takes [512, 768), nothing to wait for
    assert ops(h) == []
    c = h.acquire(256, 256, 8, 8, S2)  # [768, 1024)
    d = h.acquire(128, 128, 8, 8, S2)  # wraps into [0, 128): waits on event 1 on S2
    assert ops(h) == [("wait", 1, S2)]
    # The rest of that range still holds event 1: a later owner waits on it again.
    assert h.ranges()[1] == (128, 384, False, 1)
    e = h.acquire(128, 128, 8, 8, S3)
    assert ops(h)[-1] == ("wait", 1, S3)
    for x in (b, c, d, e):
        h.release(x)


def test_synchronous_acquisition_synchronizes_source_events():
    h = Harness(256)
    a = h.acquire(256, 256, 8, 8, S1)
    h.release(a)
    h.clear_log()
    b = h.acquire(64, 64, 8, 8, None)  # CPU owner: host-synchronize before returning
    assert ops(h) == [("sync_event", 1, S1)]
    h.release(b)  # a synchronously owned lease is reusable at once: no event
    assert ops(h, "record") == []
    assert h.ranges()[0] == (0, 64, False, 0)


def test_padding_across_several_retired_ranges_keeps_each_fragment_event():
    h = Harness(4096)
    pin = h.acquire(8, 8, 8, 8, None)                      # [0, 8) stays live
    a, b, c = (h.acquire(40, 40, 8, 8, s) for s in (S1, S2, S3))  # [8,48) [48,88) [88,128)
    rest = h.acquire(8, 4096, 8, 8, None)                  # [128, 4096) live
    for x in (a, b, c):
        h.release(x)                                       # events 1, 2, 3
    h.clear_log()
    x = h.acquire(64, 64, 64, 64, S2)                      # second pass: run [8, 128) aligned to 64
    assert h.lease(x)[:2] == (64, 64)
    # Padding [8, 64) stays retired, split where its sources were split: [8,48) event 1 and
    # [48,64) event 2. The payload waited on the events of the bytes it took (2 is on S2 itself
    # but the recording runtime logs every wait) and never on event 1.
    assert h.ranges()[:4] == [(0, 8, True, 0), (8, 40, False, 1), (48, 16, False, 2), (64, 64, True, 0)]
    waited = {o[1] for o in ops(h, "wait")}
    assert waited == {2, 3}
    h.release(x)
    h.clear_log()
    y = h.acquire(40, 40, 8, 8, None)  # now the padding fragment [8, 48): its own event 1
    assert h.lease(y)[0] == 8 and ops(h) == [("sync_event", 1, S1)]
    for z in (y, pin, rest):
        h.release(z)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (None, None, []),
        (None, S1, []),
        (S1, S1, []),
        (S1, S2, [("record", 1, S1), ("wait", 1, S2)]),
        (S1, None, [("sync_stream", 0, S1)]),
    ],
    ids=["cpu-cpu", "cpu-stream", "same-stream", "stream-stream", "stream-cpu"],
)
def test_every_ownership_transition(old, new, expected):
    h = Harness(256)
    a = h.acquire(64, 64, 8, 8, old)
    h.clear_log()
    h.set_stream(a, new)
    assert ops(h) == expected
    assert h.lease(a)[2] == new
    h.clear_log()
    h.release(a)  # the release follows the new owner
    assert ops(h) == ([("record", 2 if expected and expected[0][0] == "record" else 1, new)] if new else [])


def test_synchronous_acquisition_before_cpu_overwrite_then_handing_to_a_stream():
    # The documented pattern: acquire with no stream (host waits for the previous GPU reader),
    # write on the CPU, then setStream before submitting asynchronous work.
    h = Harness(128)
    a = h.acquire(128, 128, 8, 8, S1)
    h.release(a)
    h.clear_log()
    b = h.acquire(128, 128, 8, 8, None)
    assert ops(h) == [("sync_event", 1, S1)]
    h.set_stream(b, S2)
    assert ops(h) == [("sync_event", 1, S1)]  # CPU work is already complete: no extra op
    h.release(b)
    assert ops(h)[-1] == ("record", 2, S2)


def test_capacity_pressure_fails_instead_of_waiting():
    h = Harness(512)
    a = h.acquire(256, 256, 8, 8, S1)
    b = h.acquire(256, 256, 8, 8, S1)
    assert h.acquire(8, 8, 8, 8, S1) is None
    h.release(a)
    c = h.acquire(8, 1024, 8, 8, S1)  # as much as the freed run allows
    assert h.lease(c)[:2] == (0, 256)
    for x in (b, c):
        h.release(x)


def test_destruction_synchronizes_every_retired_event():
    h = Harness(512)
    a = h.acquire(128, 128, 8, 8, S1)
    b = h.acquire(128, 128, 8, 8, S2)
    h.release(a)
    h.release(b)
    h.clear_log()
    h.close()
    assert sorted(o[1] for o in ops(h, "sync_event")) == [1, 2]
