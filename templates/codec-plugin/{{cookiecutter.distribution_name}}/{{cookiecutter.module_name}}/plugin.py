"""Registers the {{ cookiecutter.codec_name }} codec with kvcodec (entry point group ``kvcodec``)."""

from __future__ import annotations

from importlib.metadata import version

import kvcodec_sdk
{%- if cookiecutter.lossless == "no" %}
import numpy as np
{%- endif %}

from . import _ext

__version__ = version({{ cookiecutter.distribution_name | tojson }})  # one source: pyproject.toml
{% if cookiecutter.lossless == "no" %}
DEFAULT_DROP_BITS = 4


def check_error(original: np.ndarray, decoded: np.ndarray, buffer: kvcodec_sdk.BufferDesc,
                params: dict) -> str | None:
    """The declared bound, checked: every 16-bit word of a K or V buffer may differ from the
    original only in its lowest ``drop_bits`` bits."""
    drop_bits = int(params.get("drop_bits", DEFAULT_DROP_BITS))
    a = original.view(np.uint16) if original.size % 2 == 0 else None
    b = decoded.view(np.uint16) if decoded.size % 2 == 0 else None
    if a is None or b is None:
        return None if np.array_equal(original, decoded) else "odd-sized buffer changed"
    bad = np.flatnonzero((a ^ b) >> drop_bits)
    if bad.size:
        i = int(bad[0])
        return f"word {i} changed from {int(a[i]):#06x} to {int(b[i]):#06x} (beyond the lowest {drop_bits} bits)"
    return None

{% endif %}
SPEC = kvcodec_sdk.CodecSpec(
    name={{ cookiecutter.codec_name | tojson }},
    description={{ cookiecutter.description | tojson }},
    version=__version__,
    format_version=1,
{%- if cookiecutter.lossless == "yes" %}
    lossless=True,
{%- else %}
    lossless=False,
    error_bound="16-bit words of K/V buffers (bf16/fp16) lose at most their lowest drop_bits bits "
    "(bf16: relative error < 2**(drop_bits - 7)); everything else is exact",
    check_error=check_error,
{%- endif %}
    factory=_ext.codec_factory,
    devices=("cpu", "cuda"),
    params=(
{%- if cookiecutter.lossless == "yes" %}
        kvcodec_sdk.ParamSpec(
            "word_bytes", int, 2, "Bytes per word split into byte planes (2 for bf16/fp16 KV data).",
            choices=(1, 2, 4, 8),
        ),
{%- else %}
        kvcodec_sdk.ParamSpec(
            "drop_bits", int, DEFAULT_DROP_BITS, "Low bits cleared in each 16-bit word of K/V buffers.",
            minimum=0, maximum=DEFAULT_DROP_BITS,
        ),
{%- endif %}
    ),
)


@kvcodec_sdk.hookimpl
def kvcodec_register_codecs(registry: kvcodec_sdk.CodecRegistry) -> None:
    """Registers the {{ cookiecutter.codec_name }} codec."""
    registry.register(SPEC)
