"""The suite's own judgement of a lossy codec's decoded pages, independent of the codec.

A lossy codec declares its bound in words (``CodecSpec.error_bound``) and as a check
(``CodecSpec.check_error``). The suite does not take the check's word for it: for every buffer of
a decoded page it first applies what holds for any K/V codec, with its own element conversion
(:func:`~kvcodec_sdk.testing.to_float32`) per buffer and per dtype, then asks the codec's
``check_error`` for a second opinion, after making sure that opinion can say no.

- **Exact buffers are exact.** ``OTHER`` buffers (``BufferRole::kOther``: "codecs must not
  reinterpret it") and opaque buffers (tokens, heads and head dim zero: the codec does not know
  their elements) come back byte for byte.
- **Floating-point K/V buffers stay close** (fp16, bf16, fp32, fp8 e4m3/e5m2): finite elements
  decode to finite values; no element moves by more than the largest magnitude of its buffer in
  that page (``amax``); the error's root mean square is at most :data:`MAX_RELATIVE_RMS` of the
  buffer's. These are the loosest properties any approximation of KV data keeps: a codec that
  zeroes, negates or garbles elements breaks them whatever its declared bound says.
- **check_error must be able to fail.** Before its verdict counts, the codec's ``check_error``
  must accept an exact copy of a buffer and reject copies with one element replaced by
  ``-sign(x) * amax`` (off by at least ``amax``) at element positions that cover every byte
  offset of a 32-bit word. A check that reads the buffer with the wrong element size or ignores
  part of it admits such a copy.

Bytes of a slot covered by no buffer are not checked for lossy codecs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..layout import BufferDesc, DType, Role
from .data import from_float32, to_float32

__all__ = ["MAX_RELATIVE_RMS", "FLOAT_DTYPES", "must_be_exact", "suite_error", "first_suite_error",
           "probe_check_error"]

#: The largest root-mean-square error of a decoded K/V buffer page, relative to the root mean
#: square of its original values, that the suite accepts from any lossy codec.
MAX_RELATIVE_RMS = 0.5

#: Element types the suite judges numerically.
FLOAT_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT8_E4M3, DType.FLOAT8_E5M2)


def is_shaped(b: BufferDesc) -> bool:
    return bool(b.tokens_per_page and b.num_heads and b.head_dim)


def must_be_exact(b: BufferDesc) -> str | None:
    """Why the buffer must come back byte for byte from any codec, or None."""
    if Role(b.role) == Role.OTHER:
        return "OTHER buffers must be restored exactly"
    if not is_shaped(b):
        return "opaque buffers (no tokens/heads/head dim) must be restored exactly"
    return None


def suite_error(original: np.ndarray, decoded: np.ndarray, b: BufferDesc) -> str | None:
    """The suite's verdict on one decoded page of one K/V buffer: None, or what is wrong."""
    dtype = DType(b.dtype)
    if dtype not in FLOAT_DTYPES:
        return None
    x = to_float32(original, dtype).astype(np.float64)
    y = to_float32(decoded, dtype).astype(np.float64)
    finite = np.isfinite(x)
    bad = finite & ~np.isfinite(y)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"element {i}: the finite value {x[i]:.6g} decoded to {y[i]}"
    if not finite.any():
        return None
    xf, yf = x[finite], y[finite]
    amax = float(np.max(np.abs(xf)))
    err = np.abs(yf - xf)
    worst = int(np.argmax(err))
    if err[worst] > amax:
        i = int(np.flatnonzero(finite)[worst])
        return (f"element {i}: {x[i]:.6g} decoded to {y[i]:.6g}, off by {err[worst]:.6g}, more than the largest "
                f"magnitude in the buffer ({amax:.6g})")
    norm = float(np.sqrt(np.mean(xf * xf)))
    if norm > 0:
        rms = float(np.sqrt(np.mean(err * err))) / norm
        if rms > MAX_RELATIVE_RMS:
            wrong = int(np.count_nonzero(err > 0.5 * np.abs(xf)))
            return (f"the root-mean-square error is {rms:.3f} of the buffer's root mean square (at most "
                    f"{MAX_RELATIVE_RMS} for any lossy codec); {wrong} of {xf.size} elements are off by more than "
                    "half their value")
    return None


def first_suite_error(original: np.ndarray, decoded: np.ndarray, b: BufferDesc) -> tuple[int, str] | None:
    """:func:`suite_error` over many pages at once (``(pages, b.bytes)`` each): the first page
    that fails and why, or None."""
    dtype = DType(b.dtype)
    if dtype not in FLOAT_DTYPES or len(original) == 0:
        return None
    pages = len(original)
    x = to_float32(original, dtype).astype(np.float64).reshape(pages, -1)
    y = to_float32(decoded, dtype).astype(np.float64).reshape(pages, -1)
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0.0)
    err = np.where(finite, np.abs(np.where(np.isfinite(y), y, np.inf) - xf), 0.0)
    amax = np.max(np.abs(xf), axis=1)
    norm = np.sqrt(np.mean(xf * xf, axis=1))
    rms = np.sqrt(np.mean(np.where(np.isfinite(err), err, 0.0) ** 2, axis=1))
    bad = (err > amax[:, None]).any(axis=1) | (rms > MAX_RELATIVE_RMS * norm)
    for i in np.flatnonzero(bad):
        reason = suite_error(original[i], decoded[i], b)
        if reason:
            return int(i), reason
    return None


def _probe_positions(n: int, itemsize: int, x: np.ndarray) -> list[int]:
    """Element indices whose first bytes cover every offset in a 32-bit word, the largest
    element and the last one."""
    per_word = max(1, 4 // itemsize)
    picks = list(range(min(per_word, n)))
    middle = (n // 2) // per_word * per_word
    picks += [middle + k for k in range(per_word) if middle + k < n]
    finite = np.isfinite(x)
    if finite.any():
        picks.append(int(np.flatnonzero(finite)[np.argmax(np.abs(x[finite]))]))
    picks.append(n - 1)
    return sorted(set(picks))


def probe_check_error(check: Callable[..., str | None], original: np.ndarray, b: BufferDesc,
                      params: Mapping[str, Any]) -> str | None:
    """None when the codec's ``check_error`` accepts an exact copy of ``original`` (one page of
    buffer ``b``) and rejects every gross corruption the suite builds; else what it got wrong."""
    dtype = DType(b.dtype)
    if dtype not in FLOAT_DTYPES:
        return None
    original = np.ascontiguousarray(original, np.uint8).reshape(-1)
    verdict = check(original.copy(), original.copy(), b, params)
    if verdict:
        return f"check_error rejects an exact copy of the buffer ({verdict})"
    x = to_float32(original, dtype)
    finite = np.isfinite(x)
    if not finite.any():
        return None
    amax = float(np.max(np.abs(x[finite])))
    if amax == 0:
        return None
    size = dtype.itemsize
    for i in _probe_positions(x.size, size, x):
        value = -amax if (not np.isfinite(x[i]) or x[i] >= 0) else amax
        corrupted = original.copy()
        corrupted[i * size : (i + 1) * size] = from_float32(np.array([value], np.float32), dtype)
        if not check(original.copy(), corrupted, b, params):
            return (f"check_error accepts a copy of the buffer whose element {i} (byte {i * size}) is {value:.6g} "
                    f"instead of {float(x[i]):.6g}, off by at least the largest magnitude in the buffer ({amax:.6g}): "
                    "a check that admits this bounds nothing, so its verdicts cannot be trusted")
    return None
