"""The engine-like example (examples/engine_demo.py) runs byte-exact on the CPU and on a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sdk_helpers import wait_for_stats

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


@pytest.mark.parametrize("via", ["host", "remote"])
def test_two_engine_processes_share_pages_through_the_daemon(via):
    """One demo process stores its pages in the cache daemon's L2 and exits; another finds them by
    their content keys and onboards them byte-exact; the daemon's sockets carried no page. L2 is
    the managers' shared host level, or their remote level."""
    from kvcodec_sdk.daemon import DaemonClient
    from kvcodec_sdk.remote.servers import DaemonProcess

    daemon = DaemonProcess()
    daemon.start()
    try:
        share = ("--framework", "numpy", "--daemon", daemon.socket_path, "--via", via, "--share")
        assert "16 pages stored in the daemon's L2" in run_demo("cpu", *share, "store")
        assert "16 pages loaded from the daemon's L2 byte-exact on cpu (numpy)" in run_demo("cpu", *share, "load")
        with DaemonClient(daemon.socket_path) as client:
            st = wait_for_stats(client.stats, lambda s: s["clients"] <= 1)  # the demo processes' ends handled
        assert st["clients"] == 1  # this test's own connection
        assert st["sets"] == 16 and st["hits"] >= 16 and st["slots_pinned"] == 0
        assert st["socket_bytes_in"] + st["socket_bytes_out"] < st["set_bytes"] / 100
    finally:
        daemon.stop()


@pytest.mark.gpu
@pytest.mark.skipif(_native.driver_info()["device_count"] == 0, reason="needs a CUDA device")
def test_engine_demo_on_the_gpu():
    pytest.importorskip("torch")
    assert "byte-exact on cuda:0 (torch)" in run_demo("cuda:0")
