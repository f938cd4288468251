"""The engine-like example (examples/engine_demo.py) runs byte-exact on the CPU and on a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcodec_sdk import _native

DEMO = Path(__file__).resolve().parent.parent / "examples" / "engine_demo.py"


def run_demo(device: str, *extra: str) -> str:
    out = subprocess.run([sys.executable, str(DEMO), "--device", device, "--pages", "16", *extra], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_engine_demo_on_the_cpu_with_numpy_alone():
    """The CPU path needs nothing beyond the SDK's install."""
    assert "16 pages evicted and onboarded byte-exact on cpu (numpy)" in run_demo("cpu", "--framework", "numpy")


def test_engine_demo_on_the_cpu_with_torch():
    pytest.importorskip("torch")
    assert "16 pages evicted and onboarded byte-exact on cpu (torch)" in run_demo("cpu", "--framework", "torch")


def test_engine_demo_through_a_disk_tier(tmp_path):
    """Non-blocking eviction to disk, prefetch back to the host, onboard: byte-exact."""
    out = run_demo("cpu", "--framework", "numpy", "--disk", str(tmp_path / "kv"))
    assert "prefetched 16 pages to the host" in out and "16 pages evicted and onboarded byte-exact" in out


@pytest.mark.gpu
@pytest.mark.skipif(_native.driver_info()["device_count"] == 0, reason="needs a CUDA device")
def test_engine_demo_on_the_gpu():
    pytest.importorskip("torch")
    assert "byte-exact on cuda:0 (torch)" in run_demo("cuda:0")
