"""Codec specifications: what a registry lookup returns, and parameter validation."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import CodecParamError

__all__ = ["ParamSpec", "CodecSpec"]

_TYPE_NAMES = {int: "integer", float: "number", str: "string", bool: "boolean"}


@dataclass(frozen=True)
class ParamSpec:
    """One codec parameter: its type, default, documentation and valid range or choices."""

    name: str
    type: type
    default: Any
    doc: str
    choices: Sequence[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    #: False for a tuning knob that never changes a blob byte (a kernel variant, a copy path): it
    #: stays out of a disk region's codec identity, so retuning keeps the stored pages.
    affects_blob: bool = True

    def __post_init__(self) -> None:
        if self.type not in _TYPE_NAMES:
            raise TypeError(f"ParamSpec {self.name!r}: type must be one of int, float, str, bool; got {self.type!r}")

    def validate(self, codec: str, value: Any) -> Any:
        """Returns ``value`` converted to the parameter's type, or raises CodecParamError."""
        where = f"codec {codec!r} parameter {self.name!r}"
        expected = _TYPE_NAMES[self.type]
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok:
                value = float(value)
                if not math.isfinite(value):
                    raise CodecParamError(f"{where} is {value!r}; it must be a finite number")
        else:
            ok = isinstance(value, str)
        if not ok:
            article = "an" if expected[0] in "aeiou" else "a"
            raise CodecParamError(f"{where} is {value!r} ({type(value).__name__}); it must be {article} {expected}")
        if self.choices is not None and value not in self.choices:
            valid = ", ".join(repr(c) for c in self.choices)
            raise CodecParamError(f"{where} is {value!r}; valid values are {valid}")
        if self.minimum is not None and value < self.minimum:
            raise CodecParamError(f"{where} is {value!r}; it must be >= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise CodecParamError(f"{where} is {value!r}; it must be <= {self.maximum}")
        return value

    def to_json(self) -> dict:
        """JSON-compatible description (used by ``kvcodec list --json``)."""
        out: dict[str, Any] = {"type": _TYPE_NAMES[self.type], "default": self.default, "doc": self.doc}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if not self.affects_blob:
            out["affects_blob"] = False
        return out


@dataclass(frozen=True)
class CodecSpec:
    """Everything the registry knows about a codec.

    :param name: Registry name, e.g. ``"concat"``.
    :param description: One line for ``kvcodec list``.
    :param version: Version of the distribution providing the codec.
    :param format_version: Version of the blob format; must equal the native factory's.
    :param lossless: True when decode(encode(x)) == x byte for byte.
    :param error_bound: For lossy codecs, the declared bound in words (e.g. ``"|x - y| <= ..."``).
    :param params: Parameter schema.
    :param devices: Implementations shipped: ``"cpu"`` (reference) and/or ``"cuda"``.
    :param factory: Returns the PyCapsule carrying the codec's ``KvcodecCodecFactory``.
    :param plugin: Name of the plugin that registered the codec (filled in by the registry).
    :param check_error: For lossy codecs, the machine-checkable form of ``error_bound``:
        ``check_error(original, decoded, buffer, params)`` gets the bytes of one K or V buffer of
        one page before encoding and after decoding (uint8 arrays; ``kvcodec_sdk.testing.to_float32``
        converts them), its :class:`~kvcodec_sdk.layout.BufferDesc` and the codec's full
        parameters, and returns None when the bound holds or a sentence saying where and by how
        much it is exceeded. The conformance suite calls it; without it a lossy codec cannot pass
        the round-trip clause.
    :param envelope: True when every blob starts with the SDK's cold-page envelope
        (``ColdPageEnvelope`` in codec.h): hosts then check each blob before decoding it and drop
        pages that did not fit or fail their checksum.
    """

    name: str
    description: str
    version: str
    format_version: int
    lossless: bool
    factory: Callable[[], Any]
    params: Sequence[ParamSpec] = field(default_factory=tuple)
    devices: Sequence[str] = ("cpu", "cuda")
    error_bound: str | None = None
    plugin: str = ""
    check_error: Callable[[Any, Any, Any, Mapping[str, Any]], str | None] | None = None
    envelope: bool = False

    def __post_init__(self) -> None:
        if not self.lossless and not self.error_bound:
            raise ValueError(f"codec {self.name!r} is lossy and must declare error_bound")
        if self.check_error is not None and not callable(self.check_error):
            raise TypeError(f"codec {self.name!r}: check_error must be callable, got {type(self.check_error).__name__}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"codec {self.name!r} declares a parameter twice: {names}")

    def defaults(self) -> dict[str, Any]:
        """The default value of every parameter."""
        return {p.name: p.default for p in self.params}

    def validate_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Checks ``params`` against the schema and returns them with defaults filled in.

        Raises CodecParamError for an unknown key, a wrong type or a value out of range.
        """
        if params is None:
            params = {}
        if not isinstance(params, Mapping):
            raise CodecParamError(
                f"codec {self.name!r} parameters must be a mapping of name to value, got {type(params).__name__}"
            )
        by_name = {p.name: p for p in self.params}
        out = self.defaults()
        for key, value in params.items():
            if key not in by_name:
                valid = ", ".join(repr(k) for k in by_name) or "none"
                raise CodecParamError(f"codec {self.name!r} has no parameter {key!r}; valid parameters: {valid}")
            out[key] = by_name[key].validate(self.name, value)
        return out

    def params_json(self, params: Mapping[str, Any] | None) -> str:
        """Validated parameters as the JSON object the native factory receives."""
        return json.dumps(self.validate_params(params), sort_keys=True)

    def to_json(self) -> dict:
        """JSON-compatible description of the spec."""
        return {
            "name": self.name,
            "description": self.description,
            "version": self.version,
            "format_version": self.format_version,
            "lossless": self.lossless,
            "error_bound": self.error_bound,
            "devices": list(self.devices),
            "plugin": self.plugin,
            "envelope": self.envelope,
            "params": {p.name: p.to_json() for p in self.params},
        }
