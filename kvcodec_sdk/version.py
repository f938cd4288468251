"""The SDK's version (one source of truth for Python; pyproject.toml carries the same string)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvcodec-sdk")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"
