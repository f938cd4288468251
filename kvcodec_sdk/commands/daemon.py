"""``kvcodec daemon``: run the per-host cache daemon (the shared L2 arena) in the foreground.

It serves until SIGINT or SIGTERM, then removes its socket. Clients connect with
``kvcodec_sdk.daemon.DaemonClient(SOCKET)``; ``kvcodec statctl --socket SOCKET`` prints its counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys

from ..cli import parse_size

NAME = "daemon"
HELP = "run the per-host cache daemon (shared L2 arena)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", required=True, help="the Unix socket to serve (a stale one is replaced)")
    p.add_argument("--l2-bytes", type=parse_size, default=1 << 30,
                   help="bytes of the shared RAM arena, e.g. 64G (default 1G); each tier below should be at least "
                        "this large")
    p.add_argument("--no-hugepages", action="store_true", help="back the arena with ordinary pages only")
    p.add_argument("--busy-poll-us", type=float, default=None, metavar="US",
                   help="microseconds to poll for the next request before sleeping (default 0: sleep at once; "
                        "polling takes CPU from the engines on a loaded machine)")
    p.add_argument("--long-tier", default=None, metavar="DIR",
                   help="a directory for the long tier below L2: pages are written back there in the background "
                        "and read back into L2 when a lookup misses; it outlives the daemon")
    p.add_argument("--long-tier-queue-bytes", type=parse_size, default=256 << 20, metavar="SIZE",
                   help="bytes of pages at most waiting to be written back (default 256M)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the counters for Prometheus on http://ADDR:PORT/metrics (needs the metrics extra; "
                        "0 picks a free port)")
    p.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                   help="the address the metrics server binds (default 127.0.0.1)")


def run(args: argparse.Namespace) -> int:
    from ..daemon import Daemon, DaemonConfig
    from ..daemon.server import start_warnings

    config = DaemonConfig(args.socket, args.l2_bytes, hugepages=not args.no_hugepages, long_tier=args.long_tier,
                          long_tier_queue_bytes=args.long_tier_queue_bytes)
    if args.busy_poll_us is not None:
        config = dataclasses.replace(config, busy_poll_us=args.busy_poll_us)
    daemon = Daemon(config)

    def stop(signum, frame):  # noqa: ARG001 - the signal module's signature
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    metrics = ""
    server = None
    if args.metrics_port is not None:
        from prometheus_client import CollectorRegistry, start_http_server

        from ..daemon.metrics import DaemonCollector

        registry = CollectorRegistry()
        registry.register(DaemonCollector(daemon.stats, name=args.socket))
        server, _thread = start_http_server(args.metrics_port, addr=args.metrics_addr, registry=registry)
        metrics = f", metrics on http://{args.metrics_addr}:{server.server_port}/metrics"
    long_tier = f", long tier {args.long_tier}" if args.long_tier else ""
    print(f"kvcodec daemon: serving {args.socket} with a {daemon.arena.size / 2**20:.0f} MiB L2 arena"
          f"{' on huge pages' if daemon.arena.hugepages else ''}{long_tier} (pid {daemon.stats()['pid']}){metrics}",
          file=sys.stderr, flush=True)
    for warning in start_warnings(config, daemon.arena.hugepages):
        print(f"kvcodec daemon: warning: {warning}", file=sys.stderr, flush=True)
    daemon.serve_forever()
    if server is not None:
        server.shutdown()
    print("kvcodec daemon: stopped", file=sys.stderr)
    return 0
