"""The SDK's conformance suite on the nvfp4 codec (CPU reference here, CUDA on a GPU host), with
golden vectors in the suite's format pinning blob format 1."""

from pathlib import Path

from kvcodec_sdk.testing import CodecConformanceTests


class TestConformance(CodecConformanceTests):
    codec_name = "nvfp4"
    golden_vectors = Path(__file__).parent / "vectors"
