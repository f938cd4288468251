"""The fixtures every conformance mixin uses, and the helpers they share."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from ... import gpu
from ...spec import CodecSpec
from .. import envelope, golden
from ..clauses import ClauseViolation
from ..harness import (
    Harness,
    cuda_available,
)
from ..layouts import NAMED_LAYOUTS, LayoutPlan, named_layout

UNKNOWN_IDS = (-1, -7, 2**31 - 1, 99_991)
#: Pages per call in most tests: enough for several blobs per call, small enough to stay fast.
PAGES = 6


class BaseFixtures:
    """The fixtures every mixin uses. Provide the codec through ``codec_name`` or by overriding
    :meth:`kvcodec_spec`."""

    #: Registry name of the codec under test.
    codec_name: str | None = None
    #: Parameters of the codec under test (validated against its schema).
    codec_params: dict | None = None
    #: Folder holding ``<name>-v<format_version>/`` golden vectors, or None.
    golden_vectors: str | Path | None = None

    @pytest.fixture
    def kvcodec_spec(self) -> CodecSpec:
        """The CodecSpec of the codec under test.

        Provide it: set ``codec_name = "NAME"`` on the test class (a registered codec), or override
        this fixture to return a :class:`~kvcodec_sdk.CodecSpec` (e.g. one built around a factory
        capsule of a codec that is not installed).
        """
        if self.codec_name:
            from ...registry import get_codec_spec

            return get_codec_spec(self.codec_name)
        raise NotImplementedError(
            f"{type(self).__name__} does not say which codec to test: set codec_name = 'NAME' on the class or "
            "override the kvcodec_spec fixture to return a kvcodec_sdk.CodecSpec"
        )

    @pytest.fixture
    def kvcodec_params(self) -> dict:
        """Codec parameters (JSON-compatible dict). Set ``codec_params`` or override this fixture."""
        return dict(self.codec_params or {})

    @pytest.fixture
    def kvcodec_golden_dir(self, kvcodec_spec) -> Path:
        """Folder of the golden vectors of the codec's current format version.

        The class's ``golden_vectors`` (a folder holding ``<name>-v<format_version>/``) when
        set, else the vectors the codec ships next to its spec (``CodecSpec.golden_vectors``);
        or override this fixture. Write them once with
        :func:`kvcodec_sdk.testing.write_golden_vectors`.
        """
        if self.golden_vectors is not None:
            return Path(self.golden_vectors) / f"{kvcodec_spec.name}-v{kvcodec_spec.format_version}"
        declared = golden.declared_vectors(kvcodec_spec)
        if declared is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no golden vectors: declare them next to the codec's spec "
                f"(CodecSpec golden_vectors = <folder holding {kvcodec_spec.name}-v{kvcodec_spec.format_version}/>), "
                "set golden_vectors on the class (create them once with kvcodec_sdk.testing.write_golden_vectors) or "
                "override the kvcodec_golden_dir fixture"
            )
        return declared

    @pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
    def kvcodec_device(self, request, kvcodec_spec) -> str:
        """The device under test: every implementation the codec ships on every available device,
        narrowed by ``--kvcodec-device``. The CUDA cases carry the ``gpu`` marker."""
        device = request.param
        selected = request.config.getoption("kvcodec_device", default="all") or "all"
        if selected not in ("all", device):
            pytest.skip(f"--kvcodec-device {selected}")
        if device not in kvcodec_spec.devices:
            pytest.skip(f"codec {kvcodec_spec.name!r} has no {device} implementation")
        if device == "cuda" and not cuda_available():
            pytest.skip(f"the cuda clauses need a CUDA device and cuda-python: {gpu.unavailable_reason()}")
        return device

    @pytest.fixture
    def make_harness(self, kvcodec_spec, kvcodec_params, kvcodec_device) -> Iterator[Callable[..., Harness]]:
        """Factory: ``make_harness(layout="mixed", configure=True, seed=0, device=None)``."""
        made: list[Harness] = []

        def make(layout: str | LayoutPlan = "mixed", configure: bool = True, seed: int = 0,
                 device: str | None = None) -> Harness:
            plan = named_layout(layout) if isinstance(layout, str) else layout
            h = Harness(kvcodec_spec, kvcodec_params, device or kvcodec_device, plan, seed=seed, configure=configure)
            made.append(h)
            return h

        yield make
        for h in made:
            h.close()


def _blame_round_trip(test: Callable) -> Callable:
    """For a test of a clause that checks pages under some condition (a blocked stream, poisoned
    arrays, a long sequence...): when it finds a wrong page or a failed call, it first finds out
    whether plain ``decode(encode(x))`` of that lifecycle fails on a fresh codec too; then the
    violation is round-trip's (reported there), not the condition's."""
    @functools.wraps(test)
    def run(self, *args, **kwargs):
        try:
            return test(self, *args, **kwargs)
        except ClauseViolation as exc:
            where = getattr(exc, "page_check", None)
            make_harness = kwargs.get("make_harness")
            if where is None or exc.clause == "round-trip" or make_harness is None:
                raise
            lifecycle, layout, device = where
            try:
                plain = make_harness(layout if layout in NAMED_LAYOUTS else "mixed", device=device, configure=False)
                plain.configure(keep_descriptors=True)  # judges decode(encode(x)) alone, nothing else
            except ClauseViolation:
                raise exc from None
            if lifecycle in plain.plan.lifecycle_ids:
                plain.round_trip(lifecycle, PAGES, clause="round-trip",
                                 context=f"decode(encode(x)) on a fresh codec (found by the {exc.clause} test, "
                                         f"whose check failed too)")
            raise

    return run


def _classes(h: Harness) -> dict[int, list[int]]:
    """Batching classes: representative -> members (sorted)."""
    out: dict[int, list[int]] = {}
    for lc in h.plan.lifecycle_ids:
        out.setdefault(h.batching(lc), []).append(lc)
    return {k: sorted(v) for k, v in out.items()}




def _meaningful_end(h: Harness, blob: np.ndarray) -> int:
    """Bytes of a blob that carry the page: all of them, except for an enveloped codec, whose
    envelope declares the bytes after ``headerBytes + payloadBytes`` unused (the ``envelope``
    clause proves that its decode ignores them)."""
    if not h.spec.envelope or blob.size < envelope.ENVELOPE_BYTES:
        return blob.size
    e = envelope.parse(blob)
    if e.magic != envelope.MAGIC:
        return blob.size
    if e.did_not_fit:
        return envelope.ENVELOPE_BYTES
    return min(max(e.covered_end, envelope.ENVELOPE_BYTES), blob.size)


def _covered(h: Harness, end: int, blob_bytes: int) -> str:
    return f" in the {end} bytes the envelope covers" if end < blob_bytes else ""


def _restored_bytes(h: Harness, lifecycle: int) -> list[np.ndarray]:
    """Per pool of the lifecycle's group, the slot bytes a decode must restore: all of them for a
    lossless codec; those covered by a buffer for a lossy one."""
    g = h.plan.group_of(lifecycle)
    pools = h.plan.groups[g].pools
    if h.spec.lossless:
        return [np.ones(p.slot_bytes, bool) for p in pools]
    masks = [np.zeros(p.slot_bytes, bool) for p in pools]
    for b in h.plan.buffers_of(lifecycle):
        masks[b.pool_index][b.byte_offset : b.byte_offset + b.bytes] = True
    return masks


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    d = np.flatnonzero(a != b)
    return f"{d.size} bytes differ, first at byte {int(d[0])}"


def _flip_bit(cold, blob: int, offset: int, bit: int) -> None:
    """Flips one bit of one blob of a cold buffer (host copy, written back)."""
    raw = cold.read_all()
    blobs = cold.blobs(raw)
    blobs[blob, offset] ^= np.uint8(1 << bit)
    cold.region.write(raw)


