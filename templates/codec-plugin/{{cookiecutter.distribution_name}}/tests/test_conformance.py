from kvcodec_sdk.testing import CodecConformanceTests
class TestConformance(CodecConformanceTests):
    codec_name = {{ cookiecutter.codec_name | tojson }}
