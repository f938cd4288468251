"""Fixtures of the SDK's own tests; helpers live in sdk_helpers.py (a unique module name, so
they never collide with another test tree's conftest)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gpu_kit import kit  # noqa: F401 (a fixture: the GPU framework of the manager's CUDA tests)
from sdk_helpers import HotLayout, random_hot_layout

import kvcodec_sdk
from kvcodec_sdk.testing.support import fresh_default_registry  # noqa: F401 (a fixture)

# Child interpreters (python -m kvcodec_sdk, crash-test writers) start in the repository root;
# without this they would import the source tree's kvcodec_sdk, which has no built extension,
# instead of the installed package.
os.environ["PYTHONSAFEPATH"] = "1"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


@pytest.fixture
def layout(rng) -> HotLayout:
    return random_hot_layout(rng)


@pytest.fixture
def codec():
    """A fresh, unconfigured CPU concat codec, closed after the test."""
    c = kvcodec_sdk.create_codec("concat", device="cpu")
    yield c
    c.close()


@pytest.fixture
def configured(codec, layout):
    """(codec, layout) with the codec configured on the layout."""
    codec.configure(layout.groups)
    return codec, layout


@pytest.fixture(autouse=True)
def _fresh_default_registry(fresh_default_registry):  # noqa: F811 (the fixture imported above)
    """Every test starts and ends with a fresh process-wide registry and no disabled plugins."""
    yield


@pytest.fixture
def daemon(tmp_path):
    """A cache daemon with a 16 MiB arena on its own thread, serving a socket in ``tmp_path``."""
    from kvcodec_sdk.daemon import Daemon, DaemonConfig

    d = Daemon(DaemonConfig(str(tmp_path / "kvd.sock"), 16 << 20, hugepages=False)).start()
    yield d
    d.stop()
