"""Conformance: golden vectors and CUDA stream semantics."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ...layout import (
    PageIndexLocation,
)
from .. import golden
from ..clauses import clause, violated
from ..harness import (
    Harness,
)
from ._fixtures import (
    PAGES,
    BaseFixtures,
    _blame_round_trip,
    _classes,
)
from .memory import _poisoned_sequence


class BaseGoldenTests(BaseFixtures):
    @clause("golden-vectors")
    def test_golden_vectors(self, kvcodec_spec, kvcodec_params, kvcodec_device, kvcodec_golden_dir):
        golden.check_vectors(kvcodec_spec, kvcodec_params, kvcodec_device, kvcodec_golden_dir)


def _cuda_only(h: Harness) -> None:
    if h.stream is None:
        pytest.skip("a CUDA clause: runs on the cuda device")


class BaseStreamTests(BaseFixtures):
    @clause("stream-no-wait")
    @_blame_round_trip
    def test_stream_no_wait(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        for rep in _classes(h):
            src, back = h.pages(rep, PAGES)
            dst = h.spread_blobs(len(src))
            cold = h.cold_buffer(rep, 2 * len(src) + 1, clause="stream-no-wait")
            # Everything that allocates or uploads happens before the stream is blocked: a device
            # allocation is an implicit synchronization point and would wait for the block.
            enc, dec = h.index_array(rep, dst, src), h.index_array(rep, back, dst)
            with h.blocked_stream() as b:
                h.call_with_timeout("encode", rep, cold.base, enc, clause="stream-no-wait", blocker=b)
                h.call_with_timeout("decode", rep, cold.base, dec, clause="stream-no-wait", blocker=b)
            h.check_decoded(rep, src, back, clause="stream-no-wait", context="calls enqueued on a blocked stream")
            h.restore_hot()

    @clause("stream-ordered")
    @_blame_round_trip
    def test_stream_ordered(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        for rep in _classes(h):
            g = h.plan.group_of(rep)
            src, back = h.pages(rep, PAGES)
            dst = h.spread_blobs(len(src))
            cold = h.cold_buffer(rep, 2 * len(src) + 1, clause="stream-ordered")
            before_cold, before_hot = cold.read_all(), h.hot_raw()[g]
            enc, dec = h.index_array(rep, dst, src), h.index_array(rep, back, dst)
            with h.blocked_stream() as b:
                h.call_with_timeout("encode", rep, cold.base, enc, clause="stream-ordered", blocker=b)
                h.call_with_timeout("decode", rep, cold.base, dec, clause="stream-ordered", blocker=b)
                time.sleep(0.05)  # time for work wrongly put on another stream to run
                if not np.array_equal(before_cold, cold.read_all()):
                    raise violated("stream-ordered", f"encode(lifecycle {rep}) wrote the cold buffer while earlier work "
                                                     "on its stream was still pending: its work is not ordered on the "
                                                     "given stream")
                for p, (x, y) in enumerate(zip(before_hot, h.hot_raw()[g])):
                    if not np.array_equal(x, y):
                        raise violated("stream-ordered", f"decode(lifecycle {rep}) wrote hot pool {p} while earlier "
                                                         "work on its stream was still pending: its work is not ordered "
                                                         "on the given stream")
            h.check_decoded(rep, src, back, clause="stream-ordered", context="after the stream was released")
            h.restore_hot()

    @clause("device-indices-on-stream")
    @_blame_round_trip
    def test_device_indices_on_stream(self, make_harness):
        h = make_harness()
        _cuda_only(h)
        lcs = [lc for lc in h.plan.lifecycle_ids if h.location(lc) == PageIndexLocation.DEVICE]
        if not lcs:
            pytest.skip("no lifecycle takes device page indices")
        _poisoned_sequence(h, lcs, "device-indices-on-stream")

    @clause("cpu-gpu-interchange")
    @_blame_round_trip
    def test_cpu_gpu_interchange(self, make_harness, kvcodec_spec):
        gpu = make_harness()
        _cuda_only(gpu)
        if "cpu" not in kvcodec_spec.devices:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no CPU reference")
        cpu = make_harness(device="cpu")
        for rep in _classes(gpu):
            src, back = gpu.pages(rep, PAGES)
            dst = gpu.spread_blobs(len(src))
            for enc, dec in ((gpu, cpu), (cpu, gpu)):
                a = enc.cold_buffer(rep, 2 * len(src) + 1, clause="cpu-gpu-interchange")
                enc.must("encode", rep, a.base, enc.index_array(rep, dst, src), clause="cpu-gpu-interchange")
                enc.sync()
                b = dec.cold_buffer(rep, 2 * len(src) + 1, clause="cpu-gpu-interchange")
                if a.blob_bytes != b.blob_bytes:
                    raise violated("cpu-gpu-interchange", f"lifecycle {rep}: cold page of {a.blob_bytes} bytes on "
                                                          f"{enc.device}, {b.blob_bytes} on {dec.device}")
                b.region.write(a.read_all())
                dec.must("decode", rep, b.base, dec.index_array(rep, back, dst), clause="cpu-gpu-interchange")
                dec.sync()
                dec.check_decoded(rep, src, back, clause="cpu-gpu-interchange",
                                  context=f"blobs encoded on {enc.device} and decoded on {dec.device}")
                dec.restore_hot()

