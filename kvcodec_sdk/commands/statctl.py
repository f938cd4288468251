"""``kvcodec statctl``: the cache daemon's counters.

Healthy after clients ran: ``sets`` > 0, ``gets`` > 0 and ``hits`` > 0. ``hits`` staying 0 after a
repeated prompt usually means the engine is not connected to this daemon (check the socket path).
"""

from __future__ import annotations

import argparse
import json

NAME = "statctl"
HELP = "print the cache daemon's counters"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", required=True, help="the daemon's Unix socket")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON object")
    out.add_argument("--prometheus", action="store_true",
                     help="Prometheus' text exposition format (the metrics extra), as `kvcodec daemon --metrics-port` "
                          "serves it")


def run(args: argparse.Namespace) -> int:
    from ..daemon import DaemonClient, DaemonUnavailable

    try:
        with DaemonClient(args.socket, timeout_s=5.0) as client:
            stats = client.stats()
    except DaemonUnavailable as exc:
        raise RuntimeError(str(exc)) from None
    if args.json:
        print(json.dumps(stats, sort_keys=True))
        return 0
    if args.prometheus:
        from prometheus_client import CollectorRegistry, generate_latest

        from ..daemon.metrics import DaemonCollector

        registry = CollectorRegistry()
        registry.register(DaemonCollector(lambda: stats, name=args.socket))
        print(generate_latest(registry).decode(), end="")
        return 0
    width = max(len(k) for k in stats)
    for key in sorted(stats):
        print(f"{key:<{width}}  {stats[key]}")
    return 0
