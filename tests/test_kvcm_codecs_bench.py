"""`kvcodec bench kvcm --codec NAME` on the CPU backend at tiny sizes: the table has its columns,
the JSON its fields, `--codec all` accounts for every registered codec, and usage errors (an
unknown codec, bad --params) are one line with exit status 2. No timing is judged here: that is
the benchmark's job."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcodec_sdk import cli, list_codecs
from kvcodec_sdk.bench import kvcm_codecs

TINY = ["--device", "cpu", "--pages", "3", "--iters", "1", "--layers", "2", "--tokens", "4", "--heads", "2",
        "--head-dim", "32", "--quiet"]
COLUMNS = ["codec", "dir", "pages", "GB/s", "bare GB/s", "x bare", "x concat", "host/raw", "dropped", "us/page",
           "bare us/page", "manager us/page"]
ROW_FIELDS = {"codec", "params", "direction", "pages", "gbps", "bare_gbps", "concat_gbps", "ratio_to_bare",
              "ratio_to_concat", "cold_page_bytes", "page_bytes", "host_ratio", "pages_dropped", "dropped_by_reason",
              "host_us_per_page", "bare_host_us_per_page", "overhead_us_per_page", "noise_us_per_page", "checked"}


def _registered(name: str) -> None:
    if name not in [s.name for s in list_codecs()]:
        pytest.skip(f"codec {name!r} is not installed")


@pytest.mark.parametrize("name", ["concat", "fp8", "nvcomp-lz4"])
def test_one_codec_writes_the_table_and_the_json(name, tmp_path, capsys):
    _registered(name)
    out = tmp_path / "report.json"
    rc = cli.main(["bench", "kvcm", "--codec", name, *TINY, "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("codec"))
    for column in COLUMNS:
        assert column in header
    assert [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")][:2] == ["evict", "onboard"]
    assert f"{name} x bare, target" in text and f"{name} manager us/page, target" in text
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["pages"] == 3 and data["iters"] == 1
    assert data["page_bytes"] == 2 * 2 * 4 * 2 * 32 * 2  # layers x (K, V) x tokens x heads x dim x bf16
    assert [r["direction"] for r in data["rows"]] == ["evict", "onboard"]
    for r in data["rows"]:
        assert set(r) >= ROW_FIELDS
        assert r["codec"] == name and r["pages"] == 3 and r["gbps"] > 0 and r["bare_gbps"] > 0
        assert r["ratio_to_bare"] == pytest.approx(r["gbps"] / r["bare_gbps"])
        assert r["ratio_to_concat"] == pytest.approx(r["gbps"] / r["concat_gbps"])
        assert r["host_ratio"] == pytest.approx(r["cold_page_bytes"] / r["page_bytes"])
        assert r["overhead_us_per_page"] == pytest.approx(r["host_us_per_page"] - r["bare_host_us_per_page"])
        assert r["pages_dropped"] == 0 and isinstance(r["dropped_by_reason"], dict)
        assert "manager = bare codec byte for byte" in r["checked"]
    lossless = name != "fp8"
    assert ("lossless: byte-exact" if lossless else "within the declared bound") in data["rows"][0]["checked"]
    if name == "fp8":
        assert data["rows"][0]["host_ratio"] < 1
        assert any(v["what"] == "x concat" and v["status"] == "not judged (GPU only)" for v in data["verdicts"])
    if name == "concat":
        assert data["rows"][0]["ratio_to_concat"] == 1.0
    assert {v["what"] for v in data["verdicts"]} >= {"x bare", "manager us/page"}


def test_all_lists_every_registered_codec(tmp_path, capsys):
    out = tmp_path / "all.json"
    rc = cli.main(["bench", "kvcm", "--codec", "all", *TINY, "--json", str(out)])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert rc == (1 if data["failed"] else 0)
    accounted = ({r["codec"] for r in data["rows"]} | {s["codec"] for s in data["skipped"]}
                 | {f["codec"] for f in data["failed"]})
    names = {s.name for s in list_codecs()}
    assert accounted == names
    for s in list_codecs():
        if "cpu" not in s.devices:
            assert {"codec": s.name, "reason": f"no cpu implementation (it runs on: {', '.join(s.devices)})"} \
                in data["skipped"]
            assert f"skipped {s.name}: no cpu implementation" in text
        else:
            assert any(line.startswith(f"{s.name} ") and " evict " in line for line in text.splitlines())


def test_unknown_codec_is_a_one_line_usage_error(capsys):
    rc = cli.main(["bench", "kvcm", "--codec", "no-such-codec", *TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1
    assert "unknown codec 'no-such-codec'" in err and "'concat'" in err
    for s in list_codecs():
        assert repr(s.name) in err


@pytest.mark.parametrize("params, words", [
    ("{data_type: uint16}", "--params is not valid JSON"),
    ('["uint16"]', "--params must be a JSON object"),
    ('{"no_such_param": 1}', "has no parameter 'no_such_param'"),
])
def test_bad_params_are_a_one_line_usage_error(params, words, capsys):
    rc = cli.main(["bench", "kvcm", "--codec", "concat", "--params", params, *TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and words in err


def test_options_that_do_not_combine_are_usage_errors(capsys):
    assert cli.main(["bench", "kvcm", "--params", "{}", *TINY]) == 2
    assert "--params needs --codec" in capsys.readouterr().err
    assert cli.main(["bench", "kvcm", "--codec", "all", "--params", "{}", *TINY]) == 2
    assert "--params applies to one codec" in capsys.readouterr().err
    assert cli.main(["bench", "concat", "--codec", "concat", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == "kvcodec bench concat: error: unrecognized arguments: --codec concat (see kvcodec bench concat --help)\n"
    assert cli.main(["bench", "kvcm", "--codec", "concat", "--overhead", "--quiet"]) == 2
    assert cli.main(["bench", "disk", "--sessions", "4"]) == 2  # a workload option
    assert "kvcodec bench disk: error: unrecognized arguments: --sessions 4" in capsys.readouterr().err


def test_bench_codec_name_is_kvcm_codec(tmp_path, capsys):
    """`kvcodec bench codec NAME` runs the same benchmark as `kvcodec bench kvcm --codec NAME`."""
    out = tmp_path / "report.json"
    assert cli.main(["bench", "codec", "concat", *TINY, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {row["codec"] for row in report["rows"]} == {"concat"}
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.startswith("concat ")][:2] == \
        [["concat", "evict"], ["concat", "onboard"]]


def test_an_unknown_benchmark_is_one_usage_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "fp8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'fp8'" in err and "(see kvcodec bench --help)" in err


def test_dropped_pages_are_counted_by_reason_and_left_out_of_the_timing(monkeypatch):
    """Half the pages compress into a small slot, half do not fit: the manager drops those on
    onboarding, the row says so, and both directions time the pages that were kept."""
    _registered("nvcomp-lz4")
    fill = kvcm_codecs._data_generator()

    def half_compressible(rng, slot_bytes, n, buffers):
        out = fill(rng, slot_bytes, n, buffers)
        out[::2] = 7
        return out

    monkeypatch.setattr(kvcm_codecs, "_data_generator", lambda: half_compressible)
    rep = kvcm_codecs.run_codecs("nvcomp-lz4", {"slot_ratio": 0.5}, device="cpu", pages=4, iters=1,
                                 layout=kvcm_codecs.Layout(2, 4, 2, 32), progress=False)
    assert not rep.failed
    evict, onboard = rep.rows
    assert evict.pages == onboard.pages == 2
    assert onboard.pages_dropped == 2 and evict.pages_dropped == 0
    if onboard.dropped_by_reason:  # statistics that carry reasons
        assert onboard.dropped_by_reason == {"did_not_fit": 2}
    assert "(did_not_fit 2)" in kvcm_codecs.format_table(rep) or not onboard.dropped_by_reason


def test_verdicts_never_call_a_negative_overhead_a_success():
    row = dict(codec="concat", params={}, pages=4, gbps=1.0, bare_gbps=1.0, concat_gbps=1.0, ratio_to_bare=1.0,
               ratio_to_concat=1.0, cold_page_bytes=8, page_bytes=8, host_ratio=1.0, pages_dropped=0,
               dropped_by_reason={}, host_us_per_page=1.0, bare_host_us_per_page=1.0, noise_us_per_page=0.0,
               checked="")
    rep = kvcm_codecs.CodecsReport("cpu", {}, 8, 4, 1)
    rep.rows = [kvcm_codecs.Row(direction="evict", overhead_us_per_page=-0.5, **row),
                kvcm_codecs.Row(direction="onboard", overhead_us_per_page=0.05, **row)]
    (bare, own) = kvcm_codecs.verdicts(rep)
    assert bare.status == "meets"
    assert own.statuses == {"evict": "n/a (negative: below the measurement noise)", "onboard": "meets"}
    assert own.status.startswith("n/a") and not kvcm_codecs.misses(rep)
    rep.rows[1] = kvcm_codecs.Row(direction="onboard", overhead_us_per_page=0.5, **row)
    rep.verdicts = kvcm_codecs.verdicts(rep)
    assert [v.what for v in kvcm_codecs.misses(rep)] == ["manager us/page"]
    # A value inside the samples' spread is flagged, not judged.
    noisy = dict(row, noise_us_per_page=1.0)
    rep.rows = [kvcm_codecs.Row(direction=d, overhead_us_per_page=0.5, **noisy) for d in ("evict", "onboard")]
    assert kvcm_codecs.verdicts(rep)[1].status.startswith("n/a (inside")


def test_strict_exits_1_on_a_miss(monkeypatch, capsys):
    real = kvcm_codecs.verdicts

    def missing(report):
        out = real(report)
        out[0].status = "misses"
        return out

    monkeypatch.setattr(kvcm_codecs, "verdicts", missing)
    assert cli.main(["bench", "kvcm", "--codec", "concat", *TINY]) == 0
    assert cli.main(["bench", "kvcm", "--codec", "concat", "--strict", *TINY]) == 1
    assert "misses" in capsys.readouterr().out


def test_layout_defaults_to_a_576_kib_bf16_page():
    lay = kvcm_codecs.Layout()
    assert lay.page_bytes == 576 * 1024 and lay.buffer_bytes == 48 * 1024
    cfgs = lay.buffer_configs()
    assert len(cfgs) == 12 and all(c.tokens_per_page and c.num_heads and c.head_dim for c in cfgs)
    assert np.unique([c.layer_id for c in cfgs]).size == 6
