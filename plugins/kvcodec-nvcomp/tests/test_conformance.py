"""The SDK's conformance suite (every clause of codec.h) on the nvCOMP codecs, one class per
algorithm (and one for bit-shuffled LZ4): CPU reference and CUDA (CUDA cases skip without a
device). Golden vectors pin format version 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvcomp_blobs import plugin_ext

from kvcodec_sdk.testing import CodecConformanceTests

plugin_ext()

VECTORS = Path(__file__).parent / "vectors"


class TestLz4(CodecConformanceTests):
    codec_name = "nvcomp-lz4"
    golden_vectors = VECTORS


class TestLz4Shuffled(CodecConformanceTests):
    # The suite's layouts have odd slot sizes, so the element width stays 1 byte; bit planes
    # of bytes still exercise the shuffle in both directions.
    codec_name = "nvcomp-lz4"
    codec_params = {"bitshuffle": True, "chunk_bytes": 4096}
    golden_vectors = VECTORS


class TestGdeflate(CodecConformanceTests):
    codec_name = "nvcomp-gdeflate"
    golden_vectors = VECTORS


class TestAns(CodecConformanceTests):
    codec_name = "nvcomp-ans"

    @pytest.fixture
    def kvcodec_golden_dir(self):
        pytest.skip("nvcomp-ans has no CPU reference to write golden vectors with")
