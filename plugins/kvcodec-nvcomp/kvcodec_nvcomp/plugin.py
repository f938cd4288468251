"""Codec specifications of the nvCOMP plugin and its ``kvcodec_register_codecs`` hook."""

from __future__ import annotations

import kvcodec_sdk
from kvcodec_sdk import CodecSpec, ParamSpec

from . import FORMAT_VERSION, __version__, _ext


def _params(max_chunk: int) -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "chunk_bytes",
            int,
            65536,
            "Each pool slot of a page is cut into chunks of this many bytes (the last one shorter); every "
            "chunk is compressed independently by nvCOMP's batched API. A multiple of 16.",
            minimum=256,
            maximum=max_chunk,
        ),
        ParamSpec(
            "data_type",
            str,
            "uint8",
            "Element width of the data: 'uint16' for bf16/fp16 KV, 'uint8' for fp8 or opaque bytes. Sets the "
            "bitshuffle width and nvCOMP's data type (LZ4 match granularity, ANS float16/float32 model). Every "
            "pool slot size must be a multiple of the width.",
            choices=("uint8", "uint16", "uint32"),
        ),
        ParamSpec(
            "bitshuffle",
            bool,
            False,
            "Transpose each chunk into bit planes of data_type-wide elements before compressing. Makes "
            "16-bit KV data compressible by LZ4; see docs/nvcomp.md for which settings pay.",
        ),
        ParamSpec(
            "slot_ratio",
            float,
            0.0,
            "Cold page size as a fraction of the raw page (rounded up to 16 bytes). 0 = the worst-case bound "
            "(header + every chunk stored raw): every page fits and the codec is always lossless. Below that, "
            "a page whose compressed blob does not fit is written as a did-not-fit envelope, and the manager "
            "drops it as a miss.",
            minimum=0.0,
            maximum=4.0,
        ),
        ParamSpec(
            "max_batch_bytes",
            int,
            64 << 20,
            "Raw bytes of the largest batch one GPU workspace holds; two workspaces per direction are "
            "allocated at configure time. Calls are cut into batches (at least four for large calls) that "
            "alternate between the two, so transfers overlap (de)compression.",
            minimum=1,
        ),
    )


_COMMON = (
    "pages cut into chunks, each stored compressed or raw, in the cold-page envelope "
    f"(format {FORMAT_VERSION}, CRC-32C)"
)

def _spec(name: str, what: str, factory, devices: tuple[str, ...], max_chunk: int) -> CodecSpec:
    # Every nvCOMP codec writes the same enveloped chunk format: the host checks each blob's
    # envelope (did-not-fit, checksum) before decoding it.
    return CodecSpec(
        name=name,
        description=f"{what}: {_COMMON}",
        version=__version__,
        format_version=FORMAT_VERSION,
        lossless=True,
        factory=factory,
        devices=devices,
        params=_params(max_chunk),
        envelope=True,
    )


SPECS = (
    _spec("nvcomp-lz4", "nvCOMP LZ4 (standard LZ4 blocks)", _ext.lz4_factory, ("cpu", "cuda"), 1 << 24),
    _spec("nvcomp-gdeflate", "nvCOMP gdeflate (CPU reference through nvCOMP's CPU library)", _ext.gdeflate_factory,
          ("cpu", "cuda"), 1 << 16),
    _spec("nvcomp-ans", "nvCOMP ANS (CUDA only: nvCOMP ships no CPU ANS coder)", _ext.ans_factory, ("cuda",),
          1 << 24),
)


@kvcodec_sdk.hookimpl
def kvcodec_register_codecs(registry):
    for spec in SPECS:
        registry.register(spec)
