"""Subcommands of ``kvcodec``. Each module defines NAME, HELP, add_arguments(parser) and
run(args) -> exit code, and is listed in COMMANDS (in help order)."""

COMMANDS = ["list", "new", "check", "bench", "inspect", "env", "daemon", "statctl"]
