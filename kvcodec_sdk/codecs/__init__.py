"""Codecs built into the SDK, each registered as an ordinary plugin."""
