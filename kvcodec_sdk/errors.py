"""Exceptions raised by kvcodec_sdk. Every message names the offending field and value."""

from __future__ import annotations


class KvcodecError(Exception):
    """Base class of every kvcodec_sdk error."""


class UnknownCodecError(KvcodecError, LookupError):
    """No registered codec has the requested name. The message lists the known names."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = list(known)
        listing = ", ".join(repr(k) for k in self.known) or "none (no codec plugin is installed or enabled)"
        super().__init__(f"unknown codec {name!r}; known codecs: {listing}")

    def __str__(self) -> str:  # LookupError would quote the message otherwise
        return self.args[0]


class CodecParamError(KvcodecError, ValueError):
    """A codec parameter is unknown, of the wrong type or out of range."""


class CodecConsumedError(KvcodecError, RuntimeError):
    """A Codec wrapper was used after a KVCacheManager consumed it (or after close())."""


class CodecCallError(KvcodecError, RuntimeError):
    """A codec call returned false; the message carries the codec's reason."""


class PluginAbiError(KvcodecError, ValueError):
    """A plugin was built against another version of the plugin ABI."""
