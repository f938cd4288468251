"""CodecSpecs around the deliberately broken codecs of libbroken_codecs (built by the tests from
broken_codecs.cpp; its path is in KVCODEC_BROKEN_LIB). The factory pointer is wrapped in a
PyCapsule named "kvcodec.codec_factory", as a plugin's extension module would."""

from __future__ import annotations

import ctypes
import os

from kvcodec_sdk import CodecSpec

CAPSULE_NAME = b"kvcodec.codec_factory"  # referenced by every capsule: lives as long as the module

_lib = ctypes.CDLL(os.environ["KVCODEC_BROKEN_LIB"])
_lib.kvcodec_broken_factory.restype = ctypes.c_void_p
_lib.kvcodec_broken_factory.argtypes = [ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def factory(flaw: str):
    """A PyCapsule carrying the factory of the codec with this flaw."""
    pointer = _lib.kvcodec_broken_factory(flaw.encode())
    if not pointer:
        raise KeyError(f"libbroken_codecs has no codec named {flaw!r}")
    return _new_capsule(pointer, CAPSULE_NAME, None)


def spec(flaw: str, *, name: str | None = None, lossless: bool = True) -> CodecSpec:
    """The CodecSpec of the codec with this flaw (named ``name`` when given)."""
    factory(flaw)  # fail early on an unknown flaw
    return CodecSpec(name=name or flaw, description=f"deliberately broken: {flaw}", version="0", format_version=1,
                     lossless=lossless, factory=lambda: factory(flaw),
                     error_bound=None if lossless else "none")
