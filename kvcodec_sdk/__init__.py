"""kvcodec_sdk: KV-cache cold-page codecs.

A codec converts a KV-cache page that spans several hot GPU pools into one fixed-size cold blob
and back. This package holds the codec contract's Python side, the plugin registry, the built-in
``concat`` codec and the tools. The C++ contract is in ``get_include()/kvcodec/codec.h``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from . import _native
except ImportError as _exc:  # the source tree on sys.path (e.g. Python started in the repository)
    if not any(Path(__path__[0]).glob("_native*")):
        raise ImportError(
            f"kvcodec_sdk is imported from its source tree ({__path__[0]}), which holds no compiled "
            "kvcodec_sdk._native: install the package (`pip install .` in the repository) and import it "
            "from outside the source folder"
        ) from None
    raise _exc
if getattr(_native, "__file__", None) is None:  # only the stubs' folder (_native/*.pyi) was found
    raise ImportError(
        f"kvcodec_sdk is imported from its source tree ({__path__[0]}), which holds no compiled "
        "kvcodec_sdk._native: install the package (`pip install .` in the repository) and import it "
        "from outside the source folder"
    )
from . import _logging
from .codec import Codec
from .errors import (
    CodecCallError,
    CodecConsumedError,
    CodecParamError,
    KvcodecError,
    PluginAbiError,
    UnknownCodecError,
)
from .hookspecs import hookimpl, hookspec
from .layout import (
    BufferConfig,
    BufferDesc,
    BufferRole,
    DataType,
    DType,
    LifeCycleDesc,
    PageIndexLocation,
    PageStatus,
    PoolDesc,
    PoolGroupDesc,
    Role,
)
from .registry import CodecRegistry, create_codec, get_codec_spec, list_codecs
from .spec import CodecSpec, ParamSpec
from .version import __version__

_logging.install()

__all__ = [
    "__version__",
    "ABI_VERSION",
    "BufferConfig",
    "BufferDesc",
    "BufferRole",
    "CacheLevel",
    "Codec",
    "CodecCallError",
    "CodecConsumedError",
    "CodecParamError",
    "CodecRegistry",
    "CodecSpec",
    "DataType",
    "DType",
    "DiskTierConfig",
    "RemoteTierConfig",
    "SharedTierConfig",
    "KVCacheConfig",
    "KVCacheConfigError",
    "KVCacheManager",
    "KvcodecError",
    "LayerGroupConfig",
    "LifeCycleDesc",
    "PageHandle",
    "PageIndexLocation",
    "PageStatus",
    "PageList",
    "ParamSpec",
    "PluginAbiError",
    "PoolDesc",
    "PoolGroupDesc",
    "Role",
    "UnknownCodecError",
    "create_codec",
    "create_default_kv_cache_cold_page_codec",
    "get_cmake_dir",
    "get_codec_spec",
    "get_include",
    "hookimpl",
    "hookspec",
    "list_codecs",
]

#: Version of the plugin ABI (``KVCODEC_PLUGIN_ABI_VERSION``) this SDK speaks.
ABI_VERSION: int = _native.ABI_VERSION

# Headers and the CMake package are installed next to the native module (which, in an editable
# install, is not next to this file).
_INSTALLED = Path(_native.__file__).resolve().parent
_SOURCE = Path(__file__).resolve().parent.parent


def get_include() -> str:
    """Directory holding the public C++ headers (``kvcodec/codec.h``, ``kvcodec/plugin.h``, ...)."""
    for candidate in (_INSTALLED / "include", _SOURCE / "csrc" / "include"):
        if (candidate / "kvcodec" / "codec.h").is_file():
            return str(candidate)
    raise FileNotFoundError(f"kvcodec headers not found under {_INSTALLED / 'include'}; reinstall kvcodec-sdk")


def get_cmake_dir() -> str:
    """Directory holding ``kvcodec_sdk-config.cmake``: pass it as ``kvcodec_sdk_DIR``."""
    path = _INSTALLED / "share" / "cmake" / "kvcodec_sdk"
    if not (path / "kvcodec_sdk-config.cmake").is_file():
        raise FileNotFoundError(f"kvcodec_sdk-config.cmake not found under {path}; reinstall kvcodec-sdk")
    return str(path)


# The manager is imported on first use, so that importing the package (which build tools do to
# find the CMake package) never depends on more of the native module than the codec contract.
_LAZY = {
    "DiskTierConfig": "kvcm_config",
    "RemoteTierConfig": "kvcm_config",
    "SharedTierConfig": "kvcm_config",
    "KVCacheConfig": "kvcm_config",
    "KVCacheConfigError": "kvcm_config",
    "LayerGroupConfig": "kvcm_config",
    "CacheLevel": "manager",
    "KVCacheManager": "manager",
    "PageHandle": "manager",
    "PageList": "manager",
}


if TYPE_CHECKING:  # what type checkers see of the names above; at run time they load on first use
    from .kvcm_config import (
        DiskTierConfig,
        KVCacheConfig,
        KVCacheConfigError,
        LayerGroupConfig,
        RemoteTierConfig,
        SharedTierConfig,
    )
    from .manager import CacheLevel, KVCacheManager, PageHandle, PageList


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcodec_sdk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def create_default_kv_cache_cold_page_codec(device: Any = "cpu") -> Codec:
    """The default lossless ``concat`` codec, created directly (not through the registry).

    Not needed to select the default (``KVCacheManager(config)`` does that); it demonstrates the
    ownership-transfer contract and is the reference for binding native codecs.
    """
    from . import _interop
    from .codecs.concat import SPEC

    label, ordinal = _interop.parse_device(device)
    native = _native.NativeCodec(_native.concat_factory(), SPEC.params_json(None), ordinal)
    return Codec(native, SPEC, SPEC.defaults(), label)
