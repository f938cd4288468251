"""The manager benchmark's overhead mode runs end to end at a tiny size on the CPU backend: every
row carries the manager's own host time per page (its time beyond the bare codec's), the verdict
follows the target, resident pages really are held, and the CLI writes the report. Nothing here
checks a timing against the target: that is the benchmark's job (`kvcodec bench kvcm --overhead`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvcodec_sdk import cli
from kvcodec_sdk.bench import kvcm


def test_overhead_rows_are_the_manager_time_beyond_the_bare_codec():
    rep = kvcm.run_overhead(pages=300, resident=1001, iters=1, progress=False)
    assert rep.device == "cpu" and rep.resident == 1001
    assert [r.direction for r in rep.rows] == ["evict", "onboard"]
    for r in rep.rows:
        assert r.piece_bytes == kvcm.OVERHEAD_PIECE and r.pages == 300
        assert r.host_us_per_page > 0 and r.codec_host_us_per_page >= 0
        assert r.overhead_us_per_page == pytest.approx(r.host_us_per_page - r.codec_host_us_per_page)
    table = kvcm.format_table(rep)
    assert "1001 resident pages" in table and "manager us/page" in table
    assert f"the {kvcm.TARGET_OVERHEAD_US_PER_PAGE} us target" in table.splitlines()[-1]
    # The verdict follows the rows.
    slow = dataclasses.replace(rep.rows[0], overhead_us_per_page=kvcm.TARGET_OVERHEAD_US_PER_PAGE * 2)
    fast = [dataclasses.replace(r, overhead_us_per_page=0.0) for r in rep.rows]
    assert kvcm.overhead_ok(dataclasses.replace(rep, rows=fast))
    assert not kvcm.overhead_ok(dataclasses.replace(rep, rows=[slow] + fast[1:]))
    assert "misses the" in kvcm.format_table(dataclasses.replace(rep, rows=[slow] + fast[1:])).splitlines()[-1]
    assert not kvcm.overhead_ok(dataclasses.replace(rep, rows=[]))


def test_overhead_arguments_are_checked():
    with pytest.raises(ValueError, match="resident is -1; it must be >= 0"):
        kvcm.run_overhead(resident=-1, progress=False)
    with pytest.raises(ValueError, match=r"piece \(0\)"):
        kvcm.run_overhead(piece=0, progress=False)


def test_cli_overhead_writes_the_json_report_and_exits_by_the_verdict(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    rc = cli.main(["bench", "kvcm", "--overhead", "--pages", "200", "--quiet", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["resident"] == kvcm.OVERHEAD_RESIDENT and len(data["rows"]) == 2
    ok = all(r["overhead_us_per_page"] <= kvcm.TARGET_OVERHEAD_US_PER_PAGE for r in data["rows"])
    assert rc == (0 if ok else 1)
    assert "manager's own host CPU" in capsys.readouterr().out
    assert data["benchmark"] == "kvcm" and data["machine"]["device"] == "cpu" and data["machine"]["cpu"]["model"]
    for r in data["rows"]:  # 15 timed samples at least (--overhead)
        assert r["repeat"] == 15 and r["spread"]["gbps"]["n"] == 15
        assert r["spread"]["gbps"]["min"] <= r["gbps"] <= r["spread"]["gbps"]["max"]
