"""``kvcodec env``: the report a bug report needs, as text and as JSON."""

from __future__ import annotations

import json
import sys

import kvcodec_sdk as kv
from kvcodec_sdk.cli import main


def test_env_json_names_the_sdk_driver_packages_and_every_codec(capsys):
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kvcodec_sdk"] == kv.__version__ and report["plugin_abi"] == kv.ABI_VERSION
    assert report["cuda_driver"]["device_count"] == kv._native.driver_info()["device_count"]
    assert report["packages"]["kvcodec-sdk"] == kv.__version__ and "numpy" in report["packages"]
    names = {c["name"]: c for c in report["codecs"]}
    assert set(names) == {s.name for s in kv.list_codecs()}
    assert names["concat"]["plugin"] == "concat" and "cpu" in names["concat"]["devices"]


def test_env_text_lists_the_same(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kvcodec_sdk  {kv.__version__} (plugin ABI {kv.ABI_VERSION})")
    for spec in kv.list_codecs():
        assert f"  {spec.name} " in out


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch, capsys):
    """`kvcodec env | head -1`: when the reader goes away the command stops without an error line."""

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["env"]) == 1
    assert capsys.readouterr().err == ""
