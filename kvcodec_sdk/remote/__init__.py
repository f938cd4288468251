"""The remote cold tier: cold blobs on a shared key-value store, under their content keys.

:class:`RemoteBackend` (``backend.py``) is the interface a store implements, with the header every
stored value carries; :mod:`.valkey` implements it on Valkey or Redis, :mod:`.mooncake` on
Mooncake Store; :mod:`.level` runs a manager's remote level over one, and :mod:`.servers` starts
local servers for trials. The client packages are optional (``pip install kvcodec-sdk[remote]``
for Valkey's, ``pip install mooncake-transfer-engine-non-cuda`` for Mooncake's): a backend
imports its client when it is built.
"""

from .backend import (
    GET_CORRUPT,
    GET_ERROR,
    GET_MISMATCH,
    GET_MISS,
    GET_TOO_SMALL,
    HEADER_BYTES,
    RemoteBackend,
    RemoteError,
    RemoteFull,
    RemoteStats,
    RemoteTimeout,
    RemoteUnavailable,
    Status,
    ValueHeader,
    identity_hash,
)

__all__ = [
    "GET_CORRUPT",
    "GET_ERROR",
    "GET_MISMATCH",
    "GET_MISS",
    "GET_TOO_SMALL",
    "HEADER_BYTES",
    "RemoteBackend",
    "RemoteError",
    "RemoteFull",
    "RemoteStats",
    "RemoteTimeout",
    "RemoteUnavailable",
    "Status",
    "ValueHeader",
    "identity_hash",
]
