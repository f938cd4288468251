"""The device benchmark script (bench/bench_nvfp4.py) on the CPU: it runs, writes its JSON report
with the calls per sample it was given, and refuses a count of calls below 1."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_nvfp4.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_nvfp4", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_report(bench, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--device", "cpu", "--pages", "2", "--layers", "1", "--repeats", "1", "--calls", "3",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["calls"] == 3 and report["pages"] == 2 and report["copy_ceiling_gbps"] is None
    rows = {(r["codec"], r["params"].get("granularity")) for r in report["results"]}
    assert ("nvfp4", "page_head") in rows and ("nvfp4", "page") in rows
    for r in report["results"]:
        assert r["encode_gbps"] > 0 and r["decode_gbps"] > 0
        assert "encode_issue_us" not in r  # the host's issue time is a CUDA figure
        if r["codec"] == "nvfp4":
            assert r["ratio"] < 0.30 and 0.9 < r["mean_row_cosine"] <= 1.0
    assert "nvfp4" in capsys.readouterr().out


def test_calls_below_one_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--calls", "0"])
    assert "--calls: 0 is not valid" in capsys.readouterr().err
