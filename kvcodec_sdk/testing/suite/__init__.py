"""The conformance tests as classes a codec's own test file subclasses.

:class:`CodecConformanceTests` aggregates one mixin per area (``Base*Tests``); each test checks
one clause of the contract (see :data:`~kvcodec_sdk.testing.clauses.CLAUSES`). A codec author's
test file is three lines::

    from kvcodec_sdk.testing import CodecConformanceTests
    class TestMyCodec(CodecConformanceTests):
        codec_name = "mycodec"

Set ``codec_params`` (a dict) to test non-default parameters and ``golden_vectors`` (a folder
holding ``<name>-v<format_version>/``) to check stored vectors; or override the fixtures
``kvcodec_spec``, ``kvcodec_params``, ``kvcodec_golden_dir`` for anything else (e.g. a codec
that is not registered through an entry point).
"""

from __future__ import annotations

from ._fixtures import BaseFixtures
from .basic import BaseConfigureTests, BaseQueryTests, BaseRoundTripTests
from .batching import BaseBatchingTests
from .integrity import BaseCheckedDecodeTests, BaseEnvelopeTests
from .memory import BaseMemorySafetyTests
from .streams import BaseGoldenTests, BaseStreamTests

__all__ = [
    "CodecConformanceTests",
    "BaseFixtures",
    "BaseConfigureTests",
    "BaseQueryTests",
    "BaseRoundTripTests",
    "BaseCheckedDecodeTests",
    "BaseEnvelopeTests",
    "BaseBatchingTests",
    "BaseMemorySafetyTests",
    "BaseGoldenTests",
    "BaseStreamTests",
]


class CodecConformanceTests(BaseConfigureTests, BaseQueryTests, BaseRoundTripTests, BaseEnvelopeTests,
                            BaseCheckedDecodeTests, BaseBatchingTests, BaseMemorySafetyTests, BaseGoldenTests,
                            BaseStreamTests):
    """Every conformance test. Subclass it with ``codec_name = "NAME"`` (see the module docstring)."""
