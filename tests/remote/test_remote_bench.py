"""``kvcodec bench remote`` on the CPU backend against a real valkey-server: the report's rows, its
checks of every onboarded page, and its option errors."""

from __future__ import annotations

import json
import subprocess
import sys


def kvcodec(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcodec_sdk", *args], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def test_bench_remote_measures_both_directions_per_codec_against_the_client(valkey_server, tmp_path):
    out = tmp_path / "remote.json"
    r = kvcodec("bench", "remote", "--device", "cpu", "--valkey", f"127.0.0.1:{valkey_server.port}", "--bytes", "4M",
                "--batch", "8", "--repeat", "1", "--layers", "2", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["backend"] == "valkey" and data["device"] == "cpu"
    rows = {(row["codec"], row["direction"]): row for row in data["rows"]}
    assert set(rows) == {("concat", "put"), ("concat", "get"), ("fp8", "put"), ("fp8", "get")}
    for (codec, _), row in rows.items():
        assert row["verified"] == ("byte-exact" if codec == "concat" else "within bound")
        assert row["raw_gbps"] > 0 and row["client_gbps"] > 0
        assert row["vs_client"] == row["wire_gbps"] / row["client_gbps"]
        assert row["latency_ms_p99"] >= row["latency_ms_median"] > 0
        assert 0 < row["in_store"] <= 1.01  # a share of the direction's time (clocks read a call apart)
    assert rows["fp8", "put"]["blob_bytes"] * 1.9 < rows["concat", "put"]["blob_bytes"]  # half the wire bytes
    assert rows["concat", "get"]["vs_concat"] == 1.0
    assert "the store's client" in r.stdout and "concat raw" in r.stdout and "in store" in r.stdout


def test_bench_remote_option_errors_are_one_line():
    r = kvcodec("bench", "remote", "--codecs", "no-such-codec", "--device", "cpu")
    assert r.returncode == 2 and "argument --codecs" in r.stderr and "no-such-codec" in r.stderr
    r = kvcodec("bench", "remote", "--backend", "mooncake", "--valkey", "127.0.0.1:1", "--device", "cpu")
    assert r.returncode == 2 and "--valkey needs --backend valkey" in r.stderr
    r = kvcodec("bench", "remote", "--backend", "mooncake", "--mooncake", "nocomma", "--device", "cpu")
    assert r.returncode == 2 and "MASTER_HOST:PORT,METADATA_URL" in r.stderr


def test_bench_remote_a_store_that_is_not_there_is_one_line_and_exit_1():
    from kvcodec_sdk.remote.servers import free_port

    r = kvcodec("bench", "remote", "--device", "cpu", "--valkey", f"127.0.0.1:{free_port()}", "--bytes", "1M",
                "--repeat", "1", "--quiet", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("kvcodec bench remote: error:") and len(r.stderr.strip().splitlines()) == 1
