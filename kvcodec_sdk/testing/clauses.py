"""The contract clauses the conformance suite checks, and how a violation is reported.

Every test of the suite checks one clause of ``kvcodec/codec.h`` and is marked with
``@clause(NAME)``. A violation raises :class:`ClauseViolation`, whose message starts with the
clause name and says what the codec did and what the contract requires, so a pytest failure and
a ``kvcodec check`` report line read the same.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import pytest

__all__ = ["CLAUSES", "ClauseViolation", "clause", "violated", "clause_of"]

#: Clause name -> the contract sentence it checks (in report order).
CLAUSES: dict[str, str] = {
    "configure-once": "configure() is called exactly once; a second call returns false",
    "rejected-configure": "configure() returning false rejects the complete configuration: every query then fails "
    "as before configure() and encode/decode return false",
    "descriptors-copied": "the descriptor arrays are valid only during configure(): overwriting them afterwards "
    "changes nothing",
    "cold-size-fixed": "queryColdPageBytes is fixed and non-zero for every lifecycle, zero for an unknown one",
    "batching-representative": "the batching ID is the smallest member of its class, maps to itself, shares the "
    "hot pool group, and is negative for an unknown lifecycle",
    "index-location": "one page-index location per batching class, never kBadLocation for a known lifecycle, "
    "kBadLocation for an unknown one",
    "round-trip": "decode(encode(x)) is x byte for byte for a lossless codec, within the declared bound for a "
    "lossy one (as the suite computes it and as the codec's check_error confirms), for every lifecycle",
    "page-counts": "calls of 0 to 100k pages round-trip",
    "deterministic": "encoding or decoding the same input twice gives the same bytes, whatever the destination "
    "held before",
    "stateful-sequence": "a long sequence of encodes, decodes and hot-page overwrites over shared slots and "
    "lifecycles matches a model of the hot and cold pools",
    "batched-calls": "one call with the batching representative over the concatenated pairs of a class equals "
    "separate calls per lifecycle",
    "chunked-calls": "a call split into chunks equals one call",
    "empty-call": "a call of zero pages succeeds and writes nothing",
    "writes-inside-slots": "encode and decode write only the destination blobs and slots",
    "source-unmodified": "encode does not modify the hot source; decode does not modify the cold source",
    "host-indices-after-return": "host page-index arrays are not read after the call returns",
    "data-not-retained": "hot and cold data pointers are not used beyond the submitted work",
    "cpu-synchronous": "a CPU reference completes its work before it returns and ignores the stream argument",
    "fp-environment": "a CPU reference writes the same blobs and pages whatever floating-point settings the "
    "calling thread has (flush to zero, denormals are zero, rounding mode)",
    "bad-arguments": "invalid arguments return false without crashing or writing",
    "envelope": "an enveloped codec starts every blob with a consistent cold-page envelope whose CRCs cover every "
    "byte its decode reads",
    "checked-decode": "a codec with decodeChecked() (plugin ABI 2) writes one status per page: 0 for every good "
    "blob, which decodes as decode() does; non-zero for a damaged enveloped blob, whose neighbours still decode",
    "golden-vectors": "stored golden vectors of the codec's format version decode to the stored pages",
    "stream-no-wait": "a CUDA call returns without waiting for earlier work on its stream",
    "stream-ordered": "a CUDA call writes nothing before earlier work on its stream completes, and only on "
    "that stream",
    "device-indices-on-stream": "device page-index arrays are read only by work on the given stream",
    "cpu-gpu-interchange": "blobs of the CUDA implementation decode on the CPU reference and the reverse",
}

_MARK = "kvcodec_clause"

F = TypeVar("F", bound=Callable)


class ClauseViolation(AssertionError):
    """A codec broke a contract clause. ``str(exc)`` is ``"<clause>: <what happened>"``."""

    def __init__(self, clause: str, message: str):
        self.clause = clause
        self.detail = message
        super().__init__(f"{clause}: {message}")


def violated(clause_name: str, message: str) -> ClauseViolation:
    """Builds the violation to raise: ``raise violated("round-trip", "...")``."""
    if clause_name not in CLAUSES:
        raise KeyError(f"unknown clause {clause_name!r}; known clauses: {', '.join(CLAUSES)}")
    return ClauseViolation(clause_name, message)


def clause(name: str) -> Callable[[F], F]:
    """Marks a test as checking clause ``name`` (a key of :data:`CLAUSES`)."""
    if name not in CLAUSES:
        raise KeyError(f"unknown clause {name!r}; known clauses: {', '.join(CLAUSES)}")
    return getattr(pytest.mark, _MARK)(name)


def clause_of(item: pytest.Item) -> str | None:
    """The clause a collected test checks, or None for tests that are not conformance tests."""
    mark = item.get_closest_marker(_MARK)
    return mark.args[0] if mark is not None else None
