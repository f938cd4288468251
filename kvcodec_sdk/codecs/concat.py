"""The built-in ``concat`` codec: lossless concatenation of a page's hot-pool slots."""

from __future__ import annotations

from .. import _native
from ..hookspecs import hookimpl
from ..spec import CodecSpec, ParamSpec
from ..version import __version__

SPEC = CodecSpec(
    name="concat",
    description="Lossless concatenation of a page's slots in every hot pool (the default codec)",
    version=__version__,
    format_version=1,
    lossless=True,
    factory=_native.concat_factory,
    devices=("cpu", "cuda"),
    params=(
        ParamSpec(
            "path",
            str,
            "auto",
            "CUDA copy path: 'copy_engine' (host indices, one cuMemcpyBatchAsync per call), 'sm' (device "
            "indices, one gather kernel per call) or 'auto' (sm where the smallest pool slot of a hot pool "
            "group is below sm_path_below_bytes). The CPU reference ignores it.",
            choices=("auto", "copy_engine", "sm"),
            affects_blob=False,
        ),
        ParamSpec(
            "sm_path_below_bytes",
            int,
            1048576,
            "With path='auto', hot pool groups whose smallest slot is below this many bytes use the SM path "
            "(measured on an H200: copy engines reach the pinned ceiling only from about 1 MiB pieces, the SM "
            "path reaches >= 0.92x at every size). Lower it to leave SMs to compute kernels.",
            minimum=0,
            maximum=2**40,
            affects_blob=False,
        ),
        ParamSpec(
            "copy_api",
            str,
            "auto",
            "Copy-engine submission: 'batch' (cuMemcpyBatchAsync, CUDA 12.8+), 'per_copy' (one cuMemcpyAsync "
            "per descriptor) or 'auto' (batch where the driver has it).",
            choices=("auto", "batch", "per_copy"),
            affects_blob=False,
        ),
    ),
)


@hookimpl
def kvcodec_register_codecs(registry):
    registry.register(SPEC)
