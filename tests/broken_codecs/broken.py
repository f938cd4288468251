"""CodecSpecs around the deliberately broken codecs of libbroken_codecs (built by the tests from
broken_codecs.cpp; its path is in KVCODEC_BROKEN_LIB). The factory pointer is wrapped in a
PyCapsule named "kvcodec.codec_factory", as a plugin's extension module would."""

from __future__ import annotations

import ctypes
import dataclasses
import os

import numpy as np

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


#: Flaws whose blobs start with the cold-page envelope (CPU reference only).
ENVELOPED = {"envelope", "envelope_raw_bytes", "envelope_uncovered", "checked_skips_checksum"}


@dataclasses.dataclass(frozen=True)
class SpecWithVectors(CodecSpec):
    """A CodecSpec that declares the golden vectors it ships (a folder holding
    ``<name>-v<format_version>/``), as a plugin does next to its spec."""

    golden_vectors: str | None = None


def spec(flaw: str, *, name: str | None = None, lossless: bool = True, check_error=None,
         error_bound: str | None = None, golden_vectors: str | None = None) -> CodecSpec:
    """The CodecSpec of the codec with this flaw (named ``name`` when given)."""
    factory(flaw)  # fail early on an unknown flaw
    fields = dict(name=name or flaw, description=f"deliberately broken: {flaw}", version="0", format_version=1,
                  lossless=lossless, factory=lambda: factory(flaw),
                  error_bound=None if lossless else (error_bound or "none"), check_error=check_error,
                  envelope=flaw in ENVELOPED, devices=("cpu",) if flaw in ENVELOPED else ("cpu", "cuda"))
    if golden_vectors is not None:
        return SpecWithVectors(**fields, golden_vectors=golden_vectors)
    return CodecSpec(**fields)


# check_error functions of deliberately lossy specs. Each is wrong in its own way.


def zeros_are_fine(original, decoded, buffer, params):
    """Relative error <= 7% per element, but an element decoded to zero is taken as underflow
    and always accepted: it misses a codec that zeroes elements."""
    from kvcodec_sdk.testing import to_float32

    x, y = to_float32(original, buffer.dtype), to_float32(decoded, buffer.dtype)
    bad = (np.abs(y - x) > 0.07 * np.abs(x)) & (y != 0)
    return f"{int(bad.sum())} elements off by more than 7%" if bad.any() else None


def sixteen_bit_words(original, decoded, buffer, params):
    """Reads every even-sized buffer as 16-bit words and lets the low byte of each change: right
    for a codec that truncates bf16, blind to the dtype of the buffer (fp8 elements at even
    positions may be anything)."""
    if original.size % 2:
        return None if np.array_equal(original, decoded) else "odd-sized buffer changed"
    diff = (original.view(np.uint16) ^ decoded.view(np.uint16)) >> 8
    return f"{int((diff != 0).sum())} words changed in their high byte" if diff.any() else None


def opaque_is_fine(original, decoded, buffer, params):
    """Exact for shaped buffers; opaque K/V buffers may be anything."""
    if not (buffer.tokens_per_page and buffer.num_heads and buffer.head_dim):
        return None
    return None if np.array_equal(original, decoded) else "a shaped buffer changed"


#: name -> (flaw, check_error): the lossy broken specs.
LOSSY = {
    "zeroes_fp8": ("zeroes_fp8", zeros_are_fine),
    "changes_opaque": ("changes_opaque", opaque_is_fine),
    "checker_blind_to_dtype": ("none", sixteen_bit_words),
}


def lossy_spec(name: str) -> CodecSpec:
    """A lossy spec of :data:`LOSSY`: the codec of its flaw and its (wrong) check_error."""
    flaw, check = LOSSY[name]
    return spec(flaw, name=name, lossless=False, check_error=check, error_bound=check.__doc__.split(":")[0])
