"""The prefix-reuse workload on the CUDA backend (the hot pools as kvcodec_sdk.gpu.DeviceArray, no
torch): the same seeded workload gives the same hits per level as on the CPU backend, every page
verified, and a host blob damaged between turns fails the run at onboarding."""

from __future__ import annotations

import pytest

from kvcodec_sdk.bench import workload
from kvcodec_sdk.manager import CacheLevel, PageHandle
from kvcodec_sdk.testing.support import gpu_test_marks

pytestmark = gpu_test_marks()

TINY = workload.Workload(sessions=12, turns=3, prefixes=3, prefix_pages=6, new_pages=2)


def test_cuda_workload_matches_the_cpu_hits_and_verifies_every_page():
    gpu = workload.run(device="cuda:0", workload=TINY, progress=False)
    cpu = workload.run(device="cpu", workload=TINY, progress=False)
    assert [r.hits for r in gpu.runs] == [r.hits for r in cpu.runs]  # placement policy is device-independent
    assert [r.pages_verified for r in gpu.runs] == [r.pages_verified for r in cpu.runs]
    with_host, hot_only = gpu.runs
    assert with_host.hits["miss"] < hot_only.hits["miss"] and with_host.pages_moved > 0
    assert hot_only.pages_moved == 0 and hot_only.pages_dropped > 0


def test_cuda_workload_catches_a_damaged_host_blob(monkeypatch):
    turn = workload._Engine.turn
    damaged = []

    def damage_host_then_turn(self, session, t):
        if self.host_tier and not damaged and self.moved > 0:
            self._sync()
            host = self.m.host_pool_array(0)
            for key, pid in self.pages.items():
                h = PageHandle(self.m, pid)
                if h.is_live and h.level == CacheLevel.HOST:
                    host[h.slot, 0] ^= 0xFF
                    damaged.append(key)
        turn(self, session, t)

    monkeypatch.setattr(workload._Engine, "turn", damage_host_then_turn)
    with pytest.raises(RuntimeError, match=r"\(host hit, onboarded\) has wrong bytes"):
        workload.run(device="cuda:0", workload=TINY, progress=False)
    assert damaged
