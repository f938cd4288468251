"""CLI numeric options: zero, negative, huge or malformed values are usage errors (exit status 2)
with one line naming the option, the value and the valid range; never a traceback or an errno."""

from __future__ import annotations

import pytest

from kvcodec_sdk.cli import main


@pytest.mark.parametrize("argv,message", [
    (["bench", "kvcm", "--pages", "0"], "argument --pages: 0 is out of range; valid values are 1.."),
    (["bench", "kvcm", "--pages", "-5"], "argument --pages: -5 is out of range"),
    (["bench", "kvcm", "--pages", "99999999999"], "argument --pages: 99999999999 is out of range"),
    (["bench", "kvcm", "--iters", "0"], "argument --iters: 0 is out of range"),
    (["bench", "concat", "--bytes", "0"], "argument --bytes: size '0' is 0 bytes"),
    (["bench", "concat", "--bytes", "9999999G"], "valid sizes are 1 B to 1T"),
    (["bench", "concat", "--sizes", "4K,0"], "argument --sizes: size '0' is 0 bytes"),
    (["bench", "disk", "--io-threads", "100000"], "argument --io-threads: 100000 is out of range"),
    (["bench", "workload", "--sessions", "x"], "argument --sessions: 'x' is not an integer"),
    (["inspect", ".", "--pages", "-1"], "argument --pages: -1 is out of range"),
])
def test_bad_numeric_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
