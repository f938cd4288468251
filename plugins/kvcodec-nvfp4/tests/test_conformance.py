from kvcodec_sdk.testing import CodecConformanceTests
class TestConformance(CodecConformanceTests):
    codec_name = "nvfp4"
