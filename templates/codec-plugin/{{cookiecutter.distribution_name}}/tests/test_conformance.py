"""The SDK's conformance suite on the {{ cookiecutter.codec_name }} codec (CPU reference, and CUDA when a GPU is present)."""

from kvcodec_sdk.testing import CodecConformanceTests


class TestConformance(CodecConformanceTests):
    codec_name = {{ cookiecutter.codec_name | tojson }}
