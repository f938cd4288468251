"""Shared fixtures of the fp8 plugin's tests: kvcodec_sdk.testing.support says what they do
and what a run does when the plugin is not installed."""

from kvcodec_sdk.testing.support import plugin_conftest

plugin_conftest(globals(), module="kvcodec_fp8", distribution="kvcodec-fp8")
