"""Every user error of the installed ``kvcodec`` is one line on stderr with the documented exit
status (docs/cli.md): 2 for usage, 1 when the work failed or nothing ran. Never a traceback.

Runs the ``kvcodec`` script next to this interpreter in a subprocess, as a user would, with
stdout and stderr piped (so the output is plain text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvcodec_sdk as kv

KVCODEC = str(Path(sys.executable).with_name("kvcodec"))
HAS_GPU = kv._native.driver_info()["device_count"] > 0
TINY = ["--device", "cpu", "--quiet"]


def kvcodec(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([KVCODEC, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **(env or {})})


def one_error_line(result: subprocess.CompletedProcess) -> str:
    err = result.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def region(tmp_path_factory) -> Path:
    from kvcodec_sdk.disk import DiskRegion

    root = tmp_path_factory.mktemp("regions")
    with DiskRegion(root / "r", slot_bytes=4096, max_bytes=1 << 20) as r:
        r.put("a", bytes(4096))
    return root / "r"


def test_the_script_is_installed():
    assert os.access(KVCODEC, os.X_OK), f"{KVCODEC} is not installed next to {sys.executable}"


USAGE = [
    # the top level
    ([], "the following arguments are required: COMMAND"),
    (["nope"], "invalid choice: 'nope'"),
    (["list", "--bogus"], "kvcodec list: error: unrecognized arguments: --bogus"),
    (["env", "extra"], "kvcodec env: error: unrecognized arguments: extra"),
    # check
    (["check"], "the following arguments are required: codec"),
    (["check", "no-such-codec"], "unknown codec 'no-such-codec'; known codecs: 'concat'"),
    (["check", "concat", "--params", "{bad"], "--params is not valid JSON"),
    (["check", "concat", "--params", "[1]"], "--params must be a JSON object, got list"),
    (["check", "concat", "--params", '{"nokey": 1}'], "codec 'concat' has no parameter 'nokey'; valid parameters"),
    (["check", "concat", "--params", '{"path": "warp"}'], "parameter 'path' is 'warp'"),
    (["check", "concat", "--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["check", "concat", "--timeout", "x"], "argument --timeout: 'x' is not a number of seconds"),
    (["check", "concat", "--timeout", "-1"], "argument --timeout: '-1' must be a positive finite number"),
    (["check", "concat", "--golden", "/no/such/folder"], "argument --golden: '/no/such/folder' does not exist"),
    (["check", "concat", "--junit-xml", "/proc/no/such.xml"], "--junit-xml /proc/no/such.xml: cannot create the folder"),
    # inspect
    (["inspect"], "the following arguments are required: dir"),
    (["inspect", "/no/such/folder"], "argument dir: '/no/such/folder' does not exist"),
    (["inspect", "/etc/hostname"], "argument dir: '/etc/hostname' is not a folder"),
    (["inspect", "{region}", "--key", "zz"], "--key 'zz' is not hex; use --key-text"),
    (["inspect", "{region}", "--key", "00", "--key-text", "a"], "give --key (hex) or --key-text, not both"),
    (["inspect", "{region}", "--dump", "/tmp/x.bin"], "--dump writes the blob of one page; name it with --key"),
    (["inspect", "{region}", "--key-text", "a", "--dump", "/no/such/folder/x.bin"], "the folder /no/such/folder does "
                                                                                     "not exist"),
    (["inspect", "{region}", "--pages", "x"], "argument --pages: 'x' is not an integer"),
    # new
    (["new", "foo"], "answer 'foo' is not KEY=VALUE"),
    (["new", "--no-input", "bogus=1"], "unknown template question 'bogus'"),
    (["new", "--no-input", "codec_name=Bad"], "codec_name is 'Bad'"),
    # bench
    (["bench"], "the following arguments are required: BENCHMARK"),
    (["bench", "fp8"], "invalid choice: 'fp8'"),
    (["bench", "concat", "--device", "foo"], "argument --device: 'foo' is not a device; valid devices: auto, cpu, cuda"),
    (["bench", "kvcm", "--device", "cuda:x"], "argument --device: 'cuda:x' is not a device"),
    (["bench", "concat", "--json", "/no/such/folder/r.json"], "the folder /no/such/folder does not exist"),
    (["bench", "concat", "--json", "/tmp"], "argument --json: '/tmp' is a folder"),
    (["bench", "concat", "--sizes", "4Q"], "argument --sizes: size '4Q' is not a size"),
    (["bench", "concat", "--codec", "concat"], "kvcodec bench concat: error: unrecognized arguments: --codec concat"),
    (["bench", "kvcm", "--params", "{}", *TINY], "--params needs --codec"),
    (["bench", "kvcm", "--codec", "concat", "--overhead", *TINY], "--overhead measures concat only"),
    (["bench", "codec", "no-such-codec", *TINY], "unknown codec 'no-such-codec'"),
    (["bench", "codec", "concat", "--params", "{bad", *TINY], "--params is not valid JSON"),
    (["bench", "codec", "concat", "--params", "3", *TINY], "--params must be a JSON object"),
    (["bench", "codec", "concat", "--params", '{"path": "warp"}', *TINY], "parameter 'path' is 'warp'"),
    (["bench", "codec", "all", "--params", "{}", *TINY], "--params applies to one codec"),
    (["bench", "workload", "--sessions", "2", "--prefixes", "4", *TINY], "prefixes is 4; it must be at most sessions"),
    (["bench", "workload", "--disk-dir", "/no/such/folder", *TINY], "argument --disk-dir: '/no/such/folder' does not"),
    (["bench", "workload", "--prefetch", *TINY], "--prefetch warms the host tier from a disk tier: it needs --disk-dir"),
    (["bench", "workload", "--host-fraction", "9", *TINY], "workload host_fraction is 9.0; it must be in (0, 4]"),
    (["bench", "disk", "--dir", "/no/such/folder"], "argument --dir: '/no/such/folder' does not exist"),
    (["bench", "disk", "--dir", "/etc/hostname"], "argument --dir: '/etc/hostname' is not a folder"),
    (["bench", "disk", "--sizes", "4K"], "kvcodec bench disk: error: unrecognized arguments: --sizes 4K"),
    (["bench", "disk", "--codecs", "nope"], "kvcodec bench: error: argument --codecs: 'nope' is not a registered codec"),
    (["bench", "fidelity", "--codec", "no-such-codec", *TINY], "unknown codec 'no-such-codec'"),
    (["bench", "fidelity", "--params", "{}", *TINY], "--params applies to one codec"),
    (["bench", "fidelity", "--data", "captured", *TINY], "--data captured reads K/V from a file: give --kv FILE.npz"),
    (["bench", "fidelity", "--data", "captured", "--kv", "/no/such/kv.npz"], "argument --kv: '/no/such/kv.npz' does "
                                                                             "not exist"),
    (["bench", "fidelity", "--topk", "0"], "argument --topk: '0': '0' is not a k"),
]


@pytest.mark.parametrize("argv,message", USAGE, ids=[" ".join(a) or "(none)" for a, _ in USAGE])
def test_usage_errors_are_one_line_and_exit_2(argv, message, region, tmp_path):
    argv = [str(region) if a == "{region}" else a for a in argv]
    result = kvcodec(*argv, cwd=str(tmp_path))
    err = one_error_line(result)
    assert result.returncode == 2, (result.returncode, err)
    assert message in err, err
    assert err.startswith("kvcodec"), err
    assert result.stdout == "", "nothing ran"


FAILURES = [
    (["inspect", "{empty}"], "no disk region under"),
    (["inspect", "{region}", "--key", "00"], "key 00 is in no region"),
    (["new", "--no-input", "--output-dir", "/proc/no-such"], "kvcodec new: error:"),
]


@pytest.mark.parametrize("argv,message", FAILURES, ids=[" ".join(a) for a, _ in FAILURES])
def test_failed_work_is_one_line_and_exit_1(argv, message, region, tmp_path):
    argv = [str(region) if a == "{region}" else str(tmp_path) if a == "{empty}" else a for a in argv]
    result = kvcodec(*argv)
    err = one_error_line(result)
    assert result.returncode == 1 and message in err, (result.returncode, err)


@pytest.mark.skipif(HAS_GPU, reason="checks the message for a machine without a CUDA device")
@pytest.mark.parametrize("bench", [["concat"], ["kvcm"], ["codec", "concat"], ["workload"], ["kvcm", "--codec", "fp8"],
                                   ["fidelity"]])
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_a_gpu_that_is_not_there_is_one_line_and_exit_1(bench, device):
    result = kvcodec("bench", *bench, "--device", device, "--quiet")
    err = one_error_line(result)
    assert result.returncode == 1, err
    assert f"--device {device}: no CUDA device here" in err and "use --device cpu" in err, err


def test_a_new_plugin_folder_that_exists_is_one_line_and_exit_1(tmp_path):
    pytest.importorskip("cookiecutter")
    assert kvcodec("new", "--no-input", "--output-dir", str(tmp_path)).returncode == 0
    again = kvcodec("new", "--no-input", "--output-dir", str(tmp_path))
    err = one_error_line(again)
    assert again.returncode == 1 and "already exists; pass --overwrite" in err, err


def test_a_codec_that_is_skipped_means_nothing_ran_exit_1():
    """A benchmark of one codec that cannot run on the device reports why and exits 1."""
    cuda_only = [s.name for s in kv.list_codecs() if "cpu" not in s.devices]
    if not cuda_only:
        pytest.skip("every installed codec has a CPU implementation")
    result = kvcodec("bench", "codec", cuda_only[0], "--device", "cpu", "--pages", "2", "--iters", "1",
                     "--layers", "1", "--tokens", "2", "--heads", "1", "--head-dim", "16", "--quiet")
    assert result.returncode == 1, result.stderr
    assert f"nothing ran: {cuda_only[0]} was skipped (no cpu implementation" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_an_unexpected_error_is_one_line_and_the_traceback_is_on_request(tmp_path):
    """A bug (here: a command whose run raises TypeError) is one line; KVCODEC_TRACEBACK=1 adds the traceback."""
    (tmp_path / "sitecustomize.py").write_text(
        "import kvcodec_sdk.commands.env as e\n"
        "def boom(args):\n    raise TypeError('a bug')\n"
        "e.run = boom\n")
    # No empty entry: an empty PYTHONPATH element means the working directory, which (from the
    # repository root) would import the uninstalled source tree instead of the installed package.
    env = {"PYTHONPATH": os.pathsep.join(p for p in [str(tmp_path), os.environ.get("PYTHONPATH", "")] if p)}
    result = kvcodec("env", env=env, cwd=str(tmp_path))
    err = one_error_line(result)
    assert result.returncode == 1 and "kvcodec env: error: TypeError: a bug" in err and "KVCODEC_TRACEBACK=1" in err
    verbose = kvcodec("env", env={**env, "KVCODEC_TRACEBACK": "1"}, cwd=str(tmp_path))
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_the_help_epilog_lists_every_exit_status():
    out = kvcodec("--help")
    assert out.returncode == 0
    text = out.stdout
    assert "exit status:" in text
    for code in ("0", "1", "2", "130"):
        assert any(line.split()[:1] == [code] for line in text.splitlines()), (code, text)
    assert "docs/cli.md" in text


def test_docs_cli_md_has_the_same_exit_status_table():
    from kvcodec_sdk.cli import EXIT_CODES

    docs = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    text = docs.read_text()
    for code, _ in EXIT_CODES:
        assert f"| {code} |" in text, code
    readme = (docs.parents[1] / "README.md").read_text()
    assert "(docs/cli.md)" in readme


def test_piped_output_is_plain_text_without_escape_codes(tmp_path):
    """Piped (not a terminal), tables are the fixed-width text and progress is [bench] lines."""
    out = tmp_path / "r.json"
    result = kvcodec("bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K", "--iters", "1",
                     "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["piece", "dir", "variant", "GB/s", "x", "ceiling", "x", "base", "us/page", "path", "GB/s",
                                "min-max"]
    assert lines[2].split()[:4] == ["4", "KiB", "encode", "concat-cpu"]
    assert all(line.startswith("[bench] ") for line in result.stderr.splitlines()[:-1])
    assert result.stderr.splitlines()[-1] == f"wrote {out}"
    assert json.loads(out.read_text())["rows"]
    listed = kvcodec("list")
    assert listed.stdout.split()[:6] == ["NAME", "VERSION", "FORMAT", "LOSSLESS", "/", "ERROR"]
    assert "\x1b" not in listed.stdout


def _on_a_terminal(*args: str, env: dict) -> str:
    """Runs kvcodec with stdout and stderr on a pseudo-terminal; returns all it wrote."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([KVCODEC, *args], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "150", "LINES": "40", **env})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize("argv", [["list"], ["bench", "concat", "--device", "cpu", "--bytes", "256K", "--sizes", "4K",
                                              "--iters", "1"]])
def test_a_terminal_gets_a_drawn_table_and_no_color_means_no_escape_codes(argv):
    drawn = _on_a_terminal(*argv, env={"TERM": "xterm-256color", "NO_COLOR": ""})
    assert "─" in drawn and "\x1b[" in drawn, drawn
    plain = _on_a_terminal(*argv, env={"TERM": "xterm-256color", "NO_COLOR": "1"})
    assert "─" in plain and "\x1b" not in plain, repr(plain)
    assert "[bench]" not in drawn  # a short run shows no progress at all on a terminal
