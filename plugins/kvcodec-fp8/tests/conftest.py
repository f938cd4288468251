"""Every test starts with a fresh process-wide codec registry."""

import pytest

from kvcodec_sdk.registry import _reset_default_registry


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.delenv("KVCODEC_DISABLE_PLUGINS", raising=False)
    _reset_default_registry()
    yield
    _reset_default_registry()
