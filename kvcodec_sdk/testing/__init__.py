"""The codec conformance suite: proof that a codec honours the contract of ``kvcodec/codec.h``.

Run it on a registered codec with ``kvcodec check NAME`` or ``pytest --kvcodec NAME``, or make
it part of a plugin's own tests::

    from kvcodec_sdk.testing import CodecConformanceTests
    class TestMyCodec(CodecConformanceTests):
        codec_name = "mycodec"

See docs/conformance.md. Public pieces: the test classes (:mod:`.suite`), the clauses
(:mod:`.clauses`), realistic layouts (:mod:`.layouts`), KV-like data (:mod:`.data`) and golden
vectors (:mod:`.golden`).
"""

from .clauses import CLAUSES, ClauseViolation, clause, violated
from .data import from_float32, kv_like, to_float32
from .golden import check_vectors, write_golden_vectors
from .harness import Harness, make_codec
from .layouts import NAMED_LAYOUTS, GroupPlan, LayoutPlan, PoolPlan, generate_layout, named_layout
from .suite import (
    BaseBatchingTests,
    BaseConfigureTests,
    BaseFixtures,
    BaseGoldenTests,
    BaseMemorySafetyTests,
    BaseQueryTests,
    BaseRoundTripTests,
    BaseStreamTests,
    CodecConformanceTests,
)

__all__ = [
    "CLAUSES",
    "BaseBatchingTests",
    "BaseConfigureTests",
    "BaseFixtures",
    "BaseGoldenTests",
    "BaseMemorySafetyTests",
    "BaseQueryTests",
    "BaseRoundTripTests",
    "BaseStreamTests",
    "ClauseViolation",
    "CodecConformanceTests",
    "GroupPlan",
    "Harness",
    "LayoutPlan",
    "NAMED_LAYOUTS",
    "PoolPlan",
    "check_vectors",
    "clause",
    "from_float32",
    "generate_layout",
    "kv_like",
    "make_codec",
    "named_layout",
    "to_float32",
    "violated",
    "write_golden_vectors",
]
