"""The codec registry: a pluggy host over the ``kvcodec`` entry-point group.

Built-in codecs register as ordinary plugins. Entry points load lazily on the first lookup;
``KVCODEC_DISABLE_PLUGINS`` (comma-separated plugin names) blocks named plugins. A plugin that
fails to import is reported (``broken_plugins``) and skipped; the others still load.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import warnings
from typing import Any, Mapping

import pluggy

from . import _interop, hookspecs
from .codec import Codec
from .errors import PluginAbiError, UnknownCodecError
from .spec import CodecSpec

__all__ = ["CodecRegistry", "default_registry", "list_codecs", "get_codec_spec", "create_codec"]

ENTRY_POINT_GROUP = "kvcodec"
DISABLE_ENV = "KVCODEC_DISABLE_PLUGINS"


class CodecRegistry:
    """Codecs by name, gathered from plugins through the ``kvcodec_register_codecs`` hook."""

    def __init__(self, *, load_entry_points: bool = True, builtins: bool = True):
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._load_entry_points = load_entry_points
        self._builtins = builtins
        self._specs: dict[str, CodecSpec] = {}
        self._broken: dict[str, str] = {}
        self._loaded = False
        self._current_plugin = ""

    # -- plugin management (typed pass-throughs; core code never touches pm.hook) -------------

    @property
    def blocked(self) -> list[str]:
        """Plugin names blocked through KVCODEC_DISABLE_PLUGINS."""
        return sorted(n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip())

    @property
    def broken_plugins(self) -> dict[str, str]:
        """Plugins whose entry point failed to load: name -> reason."""
        self._ensure_loaded()
        return dict(self._broken)

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Registers a plugin object (module or instance) before the first lookup."""
        if self._loaded:
            raise RuntimeError(f"plugin {name!r} registered after the registry was loaded")
        if name in self.blocked:
            return
        self._pm.register(plugin, name=name)

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for name in self.blocked:
            self._pm.set_blocked(name)
        if self._builtins:
            from .codecs import concat

            if not self._pm.is_blocked("concat"):
                self._pm.register(concat, name="concat")
        if self._load_entry_points:
            self._load_entry_point_plugins()
        self._pm.check_pending()
        for impl in self._pm.hook.kvcodec_register_codecs.get_hookimpls():
            self._current_plugin = impl.plugin_name
            try:
                impl.function(registry=self)
            except Exception as exc:  # one plugin's bad registration must not hide the others
                self._mark_broken(impl.plugin_name, f"{type(exc).__name__}: {exc}")
        self._current_plugin = ""

    def _load_entry_point_plugins(self) -> None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self._pm.is_blocked(ep.name) or self._pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not hide the others
                self._mark_broken(ep.name, f"{type(exc).__name__}: {exc} (entry point {ep.value})")
                continue
            self._pm.register(plugin, name=ep.name)

    def _mark_broken(self, plugin: str, reason: str) -> None:
        self._broken[plugin] = reason
        warnings.warn(f"kvcodec plugin {plugin!r} failed to load: {reason}", stacklevel=4)

    # -- the hook's side ---------------------------------------------------------------------

    def register(self, spec: CodecSpec) -> None:
        """Registers a codec (called from ``kvcodec_register_codecs``).

        Checks the factory's ABI at once so a mismatched plugin is reported at load time. A name
        registered twice keeps the first registration and warns.
        """
        from . import _native

        if not isinstance(spec, CodecSpec):
            raise TypeError(f"register() takes a CodecSpec, got {type(spec).__name__}")
        plugin = self._current_plugin or spec.plugin
        if spec.name in self._specs:
            first = self._specs[spec.name]
            warnings.warn(
                f"codec {spec.name!r} from plugin {plugin!r} ignored: already registered by plugin {first.plugin!r}",
                stacklevel=2,
            )
            return
        # Raises (and the plugin is reported broken) on an ABI mismatch or a bad capsule.
        info = _native.factory_info(spec.factory())
        if info["name"] != spec.name or info["format_version"] != spec.format_version:
            raise ValueError(
                f"codec {spec.name!r} (format {spec.format_version}) from plugin {plugin!r} has a native factory "
                f"named {info['name']!r} with format {info['format_version']}; they must agree"
            )
        self._specs[spec.name] = dataclasses.replace(spec, plugin=plugin)

    # -- lookups -----------------------------------------------------------------------------

    def list_codecs(self) -> list[CodecSpec]:
        """Every registered codec, sorted by name."""
        self._ensure_loaded()
        return [self._specs[n] for n in sorted(self._specs)]

    def get_codec_spec(self, name: str) -> CodecSpec:
        """The spec of ``name``; raises UnknownCodecError listing the known names."""
        self._ensure_loaded()
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownCodecError(name, sorted(self._specs)) from None

    def create_codec(self, name: str, params: Mapping[str, Any] | None = None, device: Any = "cpu") -> Codec:
        """Creates a codec by name on ``device`` (``"cpu"`` for the CPU reference, ``"cuda[:N]"``).

        ``params`` are validated against the codec's schema and completed with defaults.
        """
        from . import _native

        spec = self.get_codec_spec(name)
        label, ordinal = _interop.parse_device(device)
        kind = "cpu" if ordinal < 0 else "cuda"
        if kind not in spec.devices:
            raise ValueError(f"codec {name!r} has no {kind} implementation; it runs on: {', '.join(spec.devices)}")
        full = spec.validate_params(params)
        try:
            native = _native.NativeCodec(spec.factory(), spec.params_json(full), ordinal)
        except ValueError as exc:
            if "ABI mismatch" in str(exc):
                raise PluginAbiError(str(exc)) from None
            raise
        return Codec(native, spec, full, label)


_default: CodecRegistry | None = None


def default_registry() -> CodecRegistry:
    """The process-wide registry (entry points loaded on first use)."""
    global _default
    if _default is None:
        _default = CodecRegistry()
    return _default


def _reset_default_registry() -> None:
    """Forgets the process-wide registry so the next lookup reloads plugins (for tests)."""
    global _default
    _default = None


def list_codecs() -> list[CodecSpec]:
    """Every registered codec, sorted by name."""
    return default_registry().list_codecs()


def get_codec_spec(name: str) -> CodecSpec:
    """The spec of a codec; raises UnknownCodecError listing the known names."""
    return default_registry().get_codec_spec(name)


def create_codec(name: str, params: Mapping[str, Any] | None = None, device: Any = "cpu") -> Codec:
    """Creates a codec by name (see :meth:`CodecRegistry.create_codec`)."""
    return default_registry().create_codec(name, params, device)
