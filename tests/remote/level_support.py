"""Builds, in a child process, a manager like level_contract's whose remote level reaches the
parent's server (``store_args``: the backend kind and its address); no tests here."""

from __future__ import annotations

from typing import Any

from level_contract import GROUPS
from test_kvcm_support import config

from kvcodec_sdk import KVCacheManager, RemoteTierConfig


def backend_factory(args: dict[str, Any]):
    """``identity -> backend`` on the server ``args`` names."""
    if args["kind"] == "valkey":
        from kvcodec_sdk.remote.valkey import ValkeyBackend

        return lambda identity: ValkeyBackend("127.0.0.1", args["port"], identity=identity, timeout_s=5.0)
    if args["kind"] == "daemon":
        from kvcodec_sdk.remote.daemon import DaemonBackend

        return lambda identity: DaemonBackend(args["socket"], identity, value_bytes=256 << 10)
    import conftest

    conftest._load_mooncake()
    from kvcodec_sdk.remote.mooncake import MooncakeBackend

    return lambda identity: MooncakeBackend(args["address"], args["metadata_server"], identity=identity,
                                            timeout_s=5.0, global_segment_size=16 << 20)


def reader_manager(args: dict[str, Any]) -> KVCacheManager:
    return KVCacheManager(config(GROUPS, remote=RemoteTierConfig(backend_factory(args))))
