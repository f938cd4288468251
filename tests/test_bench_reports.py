"""Every `kvcodec bench` JSON report carries the machine record and each row's repeats and spread;
`--report DIR` writes the plots and summary.md; `kvcodec bench compare` (and `--baseline`) gives
each figure's new / old ratio; a missing matplotlib is one error line naming the extra. Tiny sizes
on the CPU backend: no figure is judged here (that is the benchmarks' job)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from kvcodec_sdk import cli
from kvcodec_sdk.bench import _common, compare, machine
from kvcodec_sdk.storage_profile import DEVICE_CLASSES

CODEC_TINY = ["--pages", "3", "--iters", "2", "--layers", "2", "--tokens", "4", "--heads", "2", "--head-dim", "32"]
WORKLOAD_TINY = ["--sessions", "8", "--turns", "2", "--prefixes", "2", "--prefix-pages", "4", "--new-pages", "2"]


def _disk_tiny(tmp_path) -> list[str]:
    return ["--dir", str(tmp_path), "--bytes", "1M", "--slot-bytes", "16K", "--io-threads", "2", "--depth", "8",
            "--recovery-slots", "2000", "--codecs", "none", "--io-backend", "threads"]


#: (subcommand arguments, the JSON's benchmark kind, the plots --report draws)
BENCHMARKS = {
    "concat": (["concat", "--device", "cpu", "--bytes", "1M", "--sizes", "4K,16K", "--iters", "2"], "concat",
               ["concat_throughput.png"]),
    "kvcm": (["kvcm", "--device", "cpu", "--sizes", "4K,16K", "--pages", "64", "--iters", "2"], "kvcm",
             ["kvcm_throughput.png", "kvcm_host_cpu.png"]),
    "codec": (["codec", "concat", "--device", "cpu", *CODEC_TINY], "codecs", ["codecs_ratio_vs_throughput.png"]),
    "kvcm-codec": (["kvcm", "--codec", "concat", "--device", "cpu", *CODEC_TINY], "codecs",
                   ["codecs_ratio_vs_throughput.png"]),
    "workload": (["workload", "--device", "cpu", *WORKLOAD_TINY, "--repeat", "2"], "workload",
                 ["workload_hit_rate.png", "workload_pages_per_s.png"]),
    "disk": (["disk", "--repeat", "2"], "disk", ["disk_store.png", "disk_depth.png", "disk_recovery.png"]),
}


def _argv(name: str, tmp_path) -> list[str]:
    argv = ["bench", *BENCHMARKS[name][0], "--quiet"]
    return argv + (_disk_tiny(tmp_path / "fs") if name == "disk" else [])


def _check_spread(s: dict, repeat: int) -> None:
    assert set(s) == {"n", "min", "median", "max"} and s["n"] == repeat, s
    assert s["min"] <= s["median"] <= s["max"]


def _rows(data: dict) -> list[dict]:
    """The rows of a report that carry figures (disk: its sweeps and the recovery too)."""
    if data["benchmark"] == "workload":
        return data["runs"]
    if data["benchmark"] == "disk":
        return [*data["depth_sweep"], *data["recovery_sweep"], data["recovery"], *data["manager"]]
    return data["rows"]


def _check_machine(m: dict, device: str | None) -> None:
    assert m["time"].endswith("+00:00") and m["seconds"] >= 0 and m["device"] == device
    assert m["cpu"]["logical_cores"] >= 1 and m["cpu"]["model"]
    assert m["memory_bytes"] > 0 and m["os"]["system"] and m["os"]["release"]
    assert m["python"].split()[1] == ".".join(map(str, sys.version_info[:3]))
    assert m["versions"]["kvcodec-sdk"] and m["versions"]["numpy"]
    assert m["plugins"]["codecs"]["concat"]["plugin"] == "concat"
    assert "device_count" in m["gpu"] and "cuda_driver" in m["gpu"]
    assert m["git"] is None or len(m["git"]["revision"]) == 40


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_writes_the_machine_spread_plots_and_summary(name, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "fs").mkdir()
    out, report = tmp_path / "run.json", tmp_path / "report"
    assert cli.main([*_argv(name, tmp_path), "--json", str(out), "--report", str(report)]) == 0
    data = json.loads(out.read_text())
    kind, plots = BENCHMARKS[name][1:]
    assert data["benchmark"] == kind and data["command"].split()[0] == BENCHMARKS[name][0][0]
    _check_machine(data["machine"], None if kind == "disk" else "cpu")
    if kind == "disk":
        assert data["machine"]["storage"]["device_class"] in DEVICE_CLASSES
        assert data["repeat"] == 2
        for key in ("ceiling_write", "baseline_read", "store_threads_write", "store_read", "recovery_snapshot_s"):
            _check_spread(data["spread"][key], 2)
        assert data["gbps"]["store_read"] == data["spread"]["store_read"]["median"]
        # --report adds the sweeps its plots need: depths 1..64 and the run's depth, two recovery sizes.
        assert [d["depth"] for d in data["depth_sweep"]] == [1, 4, 8, 16, 64]
        assert [r["slots"] for r in data["recovery_sweep"]] == [125, 500]
        assert "store min-max" in capsys.readouterr().out
    for row in _rows(data):
        repeat = row["repeat"]
        assert repeat >= 2
        assert row["spread"], row
        for s in row["spread"].values():
            _check_spread(s, repeat)
    if kind in ("concat", "kvcm", "codecs"):
        assert all(r["spread"]["gbps"]["min"] <= r["gbps"] <= r["spread"]["gbps"]["max"] for r in data["rows"])
    written = sorted(p.name for p in report.iterdir())
    assert written == sorted([*plots, "summary.md"])
    for p in plots:
        assert (report / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (report / "summary.md").read_text()
    assert all(f"({p})" in summary for p in plots)
    assert "## Machine" in summary and "| CPU |" in summary and data["machine"]["time"] in summary
    assert "```text" in summary  # the report's table


def test_the_table_shows_the_spread(capsys):
    assert cli.main(["bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K", "--iters", "3",
                     "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-2:] == ["GB/s", "min-max"]
    low, high = map(float, lines[2].split()[-1].split("-"))
    assert low <= float(lines[2].split()[4]) <= high  # the median's column lies within it


def test_spread_and_its_cell():
    assert _common.spread([3.0, 1.0, 2.0]) == {"n": 3, "min": 1.0, "median": 2.0, "max": 3.0}
    assert _common.spread([]) == {"n": 0, "min": None, "median": None, "max": None}
    assert _common.fmt_range(_common.spread([1.0, 2.5])) == "1.00-2.50"
    assert _common.fmt_range(_common.spread([1.0])) == "-"


def test_the_machine_record_survives_no_git_and_no_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    m = machine.record(device="cpu", storage_dir=str(tmp_path / "missing" / "dir"))
    assert m["git"] is None or m["git"]["of"] == "the install's VCS record"  # no checkout was asked
    assert m["storage"]["device_class"] in DEVICE_CLASSES
    if m["git"] is None:
        assert dict(machine.describe(m))["git"] == "not run from a checkout"


def test_the_machine_record_names_the_sdk_checkout(tmp_path, monkeypatch):
    """A checkout of something else is not the SDK's: its revision is not reported."""
    repo = tmp_path / "other"
    repo.mkdir()
    if subprocess.run(["git", "init", "-q", str(repo)], capture_output=True).returncode != 0:
        pytest.skip("no git")
    monkeypatch.chdir(repo)
    assert machine._git_at(str(repo)) is None
    (repo / "kvcodec_sdk").mkdir()
    (repo / "kvcodec_sdk" / "x").write_text("x")
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", *env, "-C", str(repo), "commit", "-qm", "x"], check=True)
    found = machine._git_at(str(repo))
    assert found is not None and len(found["revision"]) == 40 and found["dirty"] is False


def _concat_report(tmp_path) -> dict:
    out = tmp_path / "old.json"
    assert cli.main(["bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K", "--iters", "2",
                     "--quiet", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_compare_reports_each_figures_ratio(tmp_path, capsys):
    old = _concat_report(tmp_path)
    new = copy.deepcopy(old)
    new["rows"][0]["gbps"] *= 2  # encode twice as fast: better
    new["rows"][0]["spread"] = {}
    new["rows"][1]["host_us_per_page"] *= 1.5  # decode's host CPU up by half: worse
    (tmp_path / "new.json").write_text(json.dumps(new))
    result = compare.compare(old, new)
    by = {c.figure: c for c in result.changes}
    enc = by["4 KiB encode concat-cpu gbps"]
    assert enc.ratio == pytest.approx(2.0) and enc.verdict == "better"
    dec = by["4 KiB decode concat-cpu host_us_per_page"]
    assert dec.ratio == pytest.approx(1.5) and dec.verdict == "worse"
    assert by["4 KiB decode concat-cpu gbps"].ratio == 1.0 and by["4 KiB decode concat-cpu gbps"].verdict == "same"

    out = tmp_path / "cmp.json"
    assert cli.main(["bench", "compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--json",
                     str(out)]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("4 KiB encode concat-cpu gbps"))
    assert line.split()[-2:] == ["2.000", "better"]
    assert "1 better, 1 worse" in text
    assert json.loads(out.read_text())["changes"][0]["ratio"] == pytest.approx(2.0)


def test_baseline_compares_the_run_with_an_earlier_one(tmp_path, capsys):
    _concat_report(tmp_path)
    capsys.readouterr()
    assert cli.main(["bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K", "--iters", "2",
                     "--quiet", "--baseline", str(tmp_path / "old.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(ln for ln in lines if ln.startswith("4 KiB encode concat-cpu gbps"))
    old, new, ratio = map(float, row.split()[-4:-1])
    assert ratio == pytest.approx(new / old, rel=0.02)


def test_compare_refuses_reports_of_other_benchmarks(tmp_path, capsys):
    old = _concat_report(tmp_path)
    other = dict(old, benchmark="disk")
    (tmp_path / "disk.json").write_text(json.dumps(other))
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert cli.main(["bench", "compare", str(tmp_path / "old.json"), str(tmp_path / "disk.json")]) == 2
    assert "different benchmarks: concat and disk" in capsys.readouterr().err
    assert cli.main(["bench", "compare", str(tmp_path / "old.json"), str(tmp_path / "junk.json")]) == 2
    assert "is not a kvcodec bench report" in capsys.readouterr().err
    assert cli.main(["bench", "compare", str(tmp_path / "old.json"), str(tmp_path / "nope.json")]) == 2
    assert "argument NEW.json:" in capsys.readouterr().err
    assert cli.main(["bench", "concat", "--baseline", str(tmp_path / "nope.json")]) == 2
    assert "argument --baseline:" in capsys.readouterr().err


def test_report_without_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import of a missing package sees
    out, report = tmp_path / "run.json", tmp_path / "report"
    rc = cli.main(["bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K", "--iters", "1",
                   "--quiet", "--json", str(out), "--report", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert "matplotlib" in err[0] and "kvcodec-sdk[report]" in err[0] and "Traceback" not in err[0]
    assert not out.exists() and not report.exists()  # checked before any work


def test_report_into_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "concat", "--report", str(tmp_path / "f")])
    assert exc.value.code == 2 and "is a file" in capsys.readouterr().err


def _fake_cache(cpu_dir, index, level, kind, size, shared):
    d = cpu_dir / "cache" / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")
    (d / "shared_cpu_list").write_text(f"{shared}\n")


def test_last_level_cache_bytes_sums_the_distinct_top_level_caches(tmp_path):
    # Two CPUs per L3 instance, two instances; per-CPU L1 and L2 below them.
    for cpu in range(4):
        d = tmp_path / f"cpu{cpu}"
        _fake_cache(d, 0, 1, "Instruction", "32K", cpu)
        _fake_cache(d, 1, 1, "Data", "48K", cpu)
        _fake_cache(d, 2, 2, "Unified", "2048K", cpu)
        _fake_cache(d, 3, 3, "Unified", "32M" if cpu < 2 else "16384K", "0-1" if cpu < 2 else "2-3")
    assert _common.last_level_cache_bytes(tmp_path) == (32 << 20) + (16 << 20)
    # Without cache folders (or without sysfs) the size is unknown.
    assert _common.last_level_cache_bytes(tmp_path / "missing") == 0


def test_a_cache_evictor_writes_at_least_64_mib():
    evict = _common.CacheEvictor()
    assert (64 << 20) <= evict.nbytes <= (1 << 30)
    before = evict._buf[::4096].copy()
    evict()
    assert np.array_equal(evict._buf[::4096], before + 1)
