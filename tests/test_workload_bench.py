"""The prefix-reuse workload benchmark runs end to end at a tiny size on the CPU backend: the report
has every metric per run, the host tier turns misses into host hits, and a wrong byte fails it."""

from __future__ import annotations

import json

import pytest

from kvcodec_sdk import cli
from kvcodec_sdk.bench import workload
from kvcodec_sdk.manager import CacheLevel, PageHandle

TINY = workload.Workload(sessions=12, turns=3, prefixes=3, prefix_pages=6, new_pages=2)


def test_workload_reports_both_runs_and_the_host_tier_improves_the_hit_rate():
    rep = workload.run(device="cpu", workload=TINY, progress=False)
    with_host, hot_only = rep.runs
    assert (with_host.host_tier, hot_only.host_tier) == (True, False)
    assert with_host.host_slots > 0 and hot_only.host_slots == 0
    assert with_host.hot_slots == hot_only.hot_slots < TINY.working_set()  # the working set does not fit
    for r in rep.runs:
        assert set(r.hits) == {"hot", "host", "disk", "miss"}
        assert sum(r.hits.values()) == r.lookups > 0
        assert sum(r.hit_rate.values()) == pytest.approx(1.0)
        # Only first uses of a prefix are cold; every lookup of a page used before hits or is a
        # capacity miss, and every cold miss is a prefix page or an earlier turn's page.
        assert r.cold_misses == TINY.prefixes * TINY.prefix_pages
        assert r.allocations_under_pressure > 0 and 0 < r.alloc_p50_us <= r.alloc_p99_us
        assert r.pages_verified >= r.lookups
        assert r.hits["disk"] == 0
    # Without a host tier, evictions drop and nothing moves; with it, evicted pages come back.
    assert hot_only.pages_moved == 0 and hot_only.pages_dropped > 0 and hot_only.hits["host"] == 0
    assert with_host.pages_moved > 0 and with_host.hits["host"] > 0
    assert with_host.pages_moved_per_s > 0 and with_host.host_us_per_moved_page > 0
    assert with_host.hits["miss"] < hot_only.hits["miss"]
    assert rep.ratios["hit_rate"] > 1.0
    assert rep.ratios["misses"] == with_host.hits["miss"] / hot_only.hits["miss"]
    # The same seed gives the same workload: the hot level sees identical hits in both runs.
    assert with_host.hits["hot"] == hot_only.hits["hot"]
    again = workload.run(device="cpu", workload=TINY, progress=False)
    assert [r.hits for r in again.runs] == [r.hits for r in rep.runs]
    table = workload.format_table(rep)
    assert "host tier" in table and "hot only" in table and "host tier / hot only" in table


def test_workload_with_a_disk_tier_hits_on_disk(tmp_path):
    w = workload.Workload(sessions=12, turns=3, prefixes=3, prefix_pages=6, new_pages=2, host_fraction=0.25)
    rep = workload.run(device="cpu", workload=w, disk_dir=str(tmp_path), progress=False)
    for r in rep.runs:
        assert r.hits["disk"] > 0 and "disk" in r.level_stats
        assert r.cold_misses == r.hits["miss"]  # the disk holds the whole working set: no capacity miss
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_byte_fails_the_workload(monkeypatch):
    write = workload._Engine._write

    def corrupt(self, ids, keys):
        write(self, ids, keys)
        if self.host_tier and self.moved > 0:  # after the first evictions: damage one page later reused
            self.pools[0][self._slots(ids[:1])[0], 3] ^= 0x5A

    monkeypatch.setattr(workload._Engine, "_write", corrupt)
    with pytest.raises(RuntimeError, match=r"has wrong bytes in hot pool 0"):
        workload.run(device="cpu", workload=TINY, progress=False)


def test_cli_writes_the_json_report(tmp_path, capsys):
    out = tmp_path / "w.json"
    assert cli.main(["bench", "workload", "--device", "cpu", "--sessions", "8", "--turns", "2", "--prefixes", "2",
                     "--prefix-pages", "4", "--new-pages", "2", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["workload"]["sessions"] == 8 and len(data["runs"]) == 2
    assert {"hit_rate", "pages_moved_per_s", "alloc_p50", "alloc_p99"} <= set(data["ratios"])
    assert "host tier / hot only" in capsys.readouterr().out


def test_repeats_report_the_median_and_the_spread_of_the_timed_figures():
    once = workload.run(device="cpu", workload=TINY, progress=False)
    rep = workload.run(device="cpu", workload=TINY, progress=False, repeat=3)
    with_host = rep.runs[0]
    assert with_host.repeat == 3 and with_host.hits == once.runs[0].hits  # seeded: the counts do not vary
    s = with_host.spread["pages_moved_per_s"]
    assert s["n"] == 3 and s["min"] <= with_host.pages_moved_per_s == s["median"] <= s["max"]
    assert "host_us_per_moved_page" not in rep.runs[1].spread  # nothing moved without a host tier
    assert "median of 3 runs" in workload.format_table(rep)
    with pytest.raises(ValueError, match="repeat is 0"):
        workload.run(device="cpu", workload=TINY, progress=False, repeat=0)


def test_invalid_workloads_name_the_field():
    with pytest.raises(ValueError, match=r"workload sessions is 0; it must be an integer >= 1"):
        workload.run(device="cpu", workload=workload.Workload(sessions=0), progress=False)
    with pytest.raises(ValueError, match=r"workload hot_fraction is 0.01: .* the hot level needs at least that many"):
        workload.run(device="cpu", workload=workload.Workload(hot_fraction=0.01), progress=False)


def test_a_blob_damaged_on_the_host_fails_at_onboarding(monkeypatch):
    turn = workload._Engine.turn
    damaged = []

    def damage_host_then_turn(self, session, t):
        if self.host_tier and not damaged and self.moved > 0:
            host = self.m.host_pool_array(0)
            self.m.synchronize()
            for key, pid in self.pages.items():
                h = PageHandle(self.m, pid)
                if h.is_live and h.level == CacheLevel.HOST:
                    host[h.slot, 0] ^= 0xFF  # concat keeps bytes as they are: the hot page gets it
                    damaged.append(key)
        turn(self, session, t)

    monkeypatch.setattr(workload._Engine, "turn", damage_host_then_turn)
    with pytest.raises(RuntimeError, match=r"\(host hit, onboarded\) has wrong bytes"):
        workload.run(device="cpu", workload=TINY, progress=False)
    assert damaged


def test_workload_prefetching_the_next_turn_turns_disk_hits_into_host_hits(tmp_path):
    shape = dict(sessions=12, turns=3, prefixes=3, prefix_pages=6, new_pages=2, host_fraction=0.25)
    plain = workload.run(device="cpu", workload=workload.Workload(**shape), disk_dir=str(tmp_path), progress=False)
    rep = workload.run(device="cpu", workload=workload.Workload(**shape, prefetch=True), disk_dir=str(tmp_path),
                       progress=False)
    with_host, hot_only = rep.runs
    p = with_host.prefetch
    assert p is not None and hot_only.prefetch is None  # no host tier: nothing to prefetch into
    assert p["issued"] > 0 and p["completed"] + p["failed"] + p["cancelled"] <= p["issued"]
    assert 0 < p["used"] <= p["completed"] and p["hit_rate"] == p["used"] / p["completed"]
    assert with_host.hits["disk"] < plain.runs[0].hits["disk"]
    assert with_host.hits["miss"] == plain.runs[0].hits["miss"]  # prefetch changes where, never whether
    assert "prefetch (host tier run)" in workload.format_table(rep)
