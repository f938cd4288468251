"""The codec conformance suite: proof that a codec honours the contract of ``kvcodec/codec.h``.

Run it on a registered codec with ``kvcodec check NAME`` or ``pytest --kvcodec NAME``, or make
it part of a plugin's own tests::

    from kvcodec_sdk.testing import CodecConformanceTests
    class TestMyCodec(CodecConformanceTests):
        codec_name = "mycodec"

See docs/conformance.md. Public pieces: the test classes (:mod:`.suite`), the clauses
(:mod:`.clauses`), realistic layouts (:mod:`.layouts`), KV-like data (:mod:`.data`), golden
vectors (:mod:`.golden`), the suite's own bound for lossy codecs (:mod:`.bounds`), the cold-page
envelope (:mod:`.envelope`) and the stateful sequence (:mod:`.stateful`).
"""

from .clauses import CLAUSES, ClauseViolation, clause, violated
from .data import from_float32, kv_like, to_float32
from .golden import check_vectors, declared_vectors, write_golden_vectors
from .harness import Harness, make_codec
from .layouts import NAMED_LAYOUTS, GroupPlan, LayoutPlan, PoolPlan, generate_layout, named_layout
from .suite import (
    BaseBatchingTests,
    BaseCheckedDecodeTests,
    BaseConfigureTests,
    BaseEnvelopeTests,
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
    "BaseCheckedDecodeTests",
    "BaseConfigureTests",
    "BaseEnvelopeTests",
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
    "declared_vectors",
    "from_float32",
    "generate_layout",
    "kv_like",
    "make_codec",
    "named_layout",
    "to_float32",
    "violated",
    "write_golden_vectors",
]
