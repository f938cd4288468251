"""The built-in concat codec passes the conformance suite (CPU here; CUDA on a GPU host)."""

from pathlib import Path

import pytest

from kvcodec_sdk.testing import CodecConformanceTests

VECTORS = Path(__file__).parent / "vectors"


class TestConcatConformance(CodecConformanceTests):
    codec_name = "concat"
    golden_vectors = VECTORS

    @pytest.fixture
    def kvcodec_golden_dir(self):
        # tests/vectors/concat-v1 is pinned by test_golden.py, which fails when it is missing.
        if not (VECTORS / "concat-v1").is_dir():
            pytest.skip("tests/vectors/concat-v1 is not in this checkout")
        return VECTORS / "concat-v1"


class TestConcatSmPathConformance(TestConcatConformance):
    """The SM path with device indices (the CUDA implementation's other path)."""

    codec_params = {"path": "sm"}
