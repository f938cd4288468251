"""``kvcodec bench BENCHMARK``: throughput against the physical ceiling and a baseline.

One subcommand per benchmark, each with its own options (``kvcodec bench BENCHMARK --help``):
``concat``, ``kvcm``, ``codec NAME`` (any registered codec through the manager and bare),
``workload``, ``disk``, ``remote`` (the remote tier through the manager against the store's own
client, :mod:`kvcodec_sdk.bench.remote`), ``blocks`` (an engine's KV blocks through
:class:`~kvcodec_sdk.integrations.blocks.BlockCodecStore`), ``metrics`` (migration throughput with the Prometheus collector scraped
against no metrics) and ``fidelity`` (how much lossy codecs change attention outputs,
:mod:`kvcodec_sdk.bench.fidelity`); ``compare OLD.json NEW.json`` shows how each figure moved between two
runs. An option of another benchmark is a usage error (exit status 2).

Every benchmark's ``--json PATH`` report carries the machine record (``kvcodec_sdk.bench.machine``)
and the spread (min / median / max) of each row's figures over its repeats; ``--report DIR`` draws
its plots and a Markdown summary (``kvcodec_sdk.bench.report``, the ``report`` extra), and
``--baseline OLD.json`` compares the run with an earlier one (``kvcodec_sdk.bench.compare``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from ..cli import count, device, folder, output_file, parse_size
from . import _ui

DEFAULT_CODEC_PAGES = "2048 on a GPU, 64 on the CPU backend"

NAME = "bench"
HELP = "benchmark a codec against the copy ceiling and a baseline"

#: The benchmarks, each a subcommand with its own options.
BENCHMARKS = {
    "concat": "the concat codec bare: encode and decode against the copy ceiling",
    "kvcm": "the KV-cache manager hot -> host -> hot with concat (with --codec NAME: any codec through it and bare)",
    "codec": "a registered codec (plugins included) through the manager and bare, against concat",
    "workload": "the manager under a prefix-reuse engine workload, host tier against hot only",
    "disk": "the disk tier against the file system's sequential ceiling and a pread/pwrite loop",
    "metrics": "migration throughput with the manager's Prometheus metrics scraped every second, against none",
    "blocks": "an engine's KV blocks (vLLM's layout) stored and loaded through the block store, against the codec bare",
    "remote": "the remote tier (Valkey, Mooncake Store) through the manager, against the store's own client",
    "daemon": "the per-host cache daemon from a client: lookup round trips, L2 hits against a local copy",
    "fidelity": "how much a lossy codec changes attention outputs (cosine, relative error, top-k agreement), "
                "against concat",
    "compare": "how each figure moved between two runs' JSON reports (new / old per row)",
}


def report_dir(text: str) -> str:
    """An argparse type: a folder for the report (made, with its parents, before the run starts)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder for the plots and summary")
    return text


def _params_object(text: str, example: str) -> tuple[dict | None, str | None]:
    """``--params``: the parsed JSON object, or a usage error's message (``example`` shows a valid one)."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (f"--params is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}; pass an object, "
                      f"e.g. '{example}'")
    if not isinstance(params, dict):
        return None, f"--params must be a JSON object of parameter names to values, got {type(params).__name__}: {text!r}"
    return params, None


def _load_report(option: str, path: str):
    """A --json report read before any work: the data, or a usage error's message."""
    from ..bench.compare import load

    if not os.path.isfile(path):
        return None, f"argument {option}: {path!r} " + ("is not a file" if os.path.exists(path) else "does not exist")
    try:
        return load(path), None
    except (ValueError, OSError) as exc:
        return None, f"argument {option}: {exc}"


def _sizes(text: str) -> list[int]:
    return [] if text == "none" else [parse_size(x) for x in text.split(",") if x]


def _counts(text: str) -> list[int]:
    if text == "none":
        return []
    return [count(1, 1 << 30)(x) for x in text.split(",") if x]


def _common(p: argparse.ArgumentParser, iters_help: str | None) -> None:
    p.add_argument("--device", type=device, default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    if iters_help is not None:
        p.add_argument("--iters", type=count(1, 10_000), default=None, help=iters_help)
    _output(p)


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", type=output_file,
                   help="also write the report as JSON (the table on stdout is then plain text)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--report", metavar="DIR", type=report_dir, default=None,
                   help="also write PNG plots and summary.md (the machine, the table, the plots) into DIR "
                        "(needs matplotlib: the report extra)")
    p.add_argument("--baseline", metavar="OLD.json", default=None,
                   help="after the run, show how each figure moved from this earlier --json report")


def _pieces(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pools", type=count(1, 64), default=3, help="hot pools per page (default 3)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",")],
                   default=None, help="piece sizes, comma-separated (default 4K,16K,64K,256K,1M; kvcm 4K,16K,64K)")
    p.add_argument("--bytes", type=parse_size, default=None,
                   help="bytes moved per direction and size (default 512M on GPU, 64M on CPU)")


def _codec_options(p: argparse.ArgumentParser, *, prefix: str) -> None:
    p.add_argument("--params", default=None, metavar="JSON", help=f"{prefix}codec parameters as a JSON object")
    p.add_argument("--strict", action="store_true", help=f"{prefix}exit 1 when a target is missed")
    p.add_argument("--layers", type=count(1, 1024), default=6, help=f"{prefix}layers per page, each a K and a V "
                                                                     "buffer (default 6)")
    p.add_argument("--tokens", type=count(1, 1 << 20), default=16, help=f"{prefix}tokens per page (default 16)")
    p.add_argument("--heads", type=count(1, 4096), default=12, help=f"{prefix}KV heads (default 12)")
    p.add_argument("--head-dim", type=count(1, 1 << 16), default=128, help=f"{prefix}head dim (default 128; bf16: "
                                                                            "576 KiB pages by default)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, help_text in BENCHMARKS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    c = sub.choices["concat"]
    _common(c, "timed repetitions (median reported; default 5)")
    _pieces(c)
    c.add_argument("--timer", choices=("cuda-core", "torch"), default="cuda-core",
                   help="the CUDA events that time a GPU run: cuda.core's (default; torch not needed) or torch's, to "
                        "compare the two")

    k = sub.choices["kvcm"]
    _common(k, "timed repetitions (median reported; default 5, with --codec on the CPU backend 3)")
    _pieces(k)
    k.add_argument("--pages", type=count(1, 10_000_000), default=None,
                   help=f"scattered pages per migrate call (default 10000; with --codec {DEFAULT_CODEC_PAGES})")
    k.add_argument("--overhead", action="store_true",
                   help="the manager's own host CPU per page only (64-byte pieces, 100000 resident pages; --device "
                        "defaults to cpu); exits 1 when it misses its 0.1 us/page target")
    kc = k.add_argument_group("--codec", "a registered codec through the manager and bare, against concat through the "
                              "manager (the same as `kvcodec bench codec NAME`). Exit status 0 when it ran (missed "
                              "targets are reported), 1 when a check or call failed (or, with --strict, a target was "
                              "missed), 2 for an unknown codec or bad --params")
    kc.add_argument("--codec", dest="codec_name", metavar="NAME", default=None,
                    help="run this registered codec (plugins included), or 'all' for every codec that can run on the "
                         "device")
    _codec_options(kc, prefix="with --codec: ")

    cd = sub.choices["codec"]
    cd.add_argument("codec_name", metavar="NAME", help="a registered codec (see kvcodec list), or 'all'")
    _common(cd, "timed repetitions (default 5, on the CPU backend 3)")
    cd.add_argument("--pages", type=count(1, 10_000_000), default=None,
                    help=f"scattered pages per migrate call (default {DEFAULT_CODEC_PAGES})")
    _codec_options(cd, prefix="")

    w = sub.choices["workload"]
    _common(w, None)  # one deterministic run per --repeat
    w.add_argument("--repeat", type=count(1, 1000), default=1,
                   help="runs of the (seeded) workload; the timed figures are their medians (default 1)")
    w.add_argument("--sessions", type=count(1, 1_000_000), default=64, help="sessions (default 64)")
    w.add_argument("--turns", type=count(1, 100_000), default=4, help="turns per session (default 4)")
    w.add_argument("--prefix-pages", type=count(1, 1_000_000), default=32, help="pages of each shared prefix (default 32)")
    w.add_argument("--prefixes", type=count(1, 1_000_000), default=4, help="distinct shared prefixes (default 4)")
    w.add_argument("--new-pages", type=count(1, 1_000_000), default=4, help="new pages per turn (default 4)")
    w.add_argument("--piece-bytes", type=parse_size, default=4 * 1024, help="bytes of each K and V buffer (default 4K)")
    w.add_argument("--disk-dir", type=folder, default=None, help="also give both runs a disk tier in a temp dir under this path")
    w.add_argument("--host-fraction", type=float, default=0.75,
                   help="host quota of the host-tier run as a fraction of the working set, in (0, 4] (default 0.75)")
    w.add_argument("--prefetch", action="store_true",
                   help="with --disk-dir: prefetch the next turn's disk pages to the host tier before each turn")

    d = sub.choices["disk"]
    _output(d)
    d.add_argument("--bytes", type=parse_size, default=None, help="bytes written and read (default 512M)")
    d.add_argument("--dir", type=folder, default=None, help="directory on the file system to measure (default: temp dir)")
    d.add_argument("--slot-bytes", type=parse_size, default=64 * 1024, help="page size (default 64K)")
    d.add_argument("--io-threads", type=count(1, 4096), default=32, help="store I/O threads (default 32, as a disk tier)")
    d.add_argument("--depth", type=count(1, 1 << 20), default=256, help="pages in flight (default 256)")
    d.add_argument("--io-backend", choices=("both", "threads", "io_uring"), default="both",
                   help="store I/O backends to measure (default both; io_uring is left out, with a note, where "
                        "the kernel refuses it)")
    d.add_argument("--queue-depth", type=count(1, 4096), default=8,
                   help="io_uring requests in flight per I/O thread (default 8, the store's default)")
    d.add_argument("--codecs", default="concat,fp8",
                   help="codecs whose pages also go hot -> disk -> hot and host <-> disk through the KV-cache "
                        "manager, comma-separated (default concat,fp8; 'none' skips these rows)")
    d.add_argument("--device", default="auto", help="device of the manager rows: auto (a GPU when there is one), "
                   "cpu, cuda or cuda:N")
    d.add_argument("--batch", type=count(1, 1 << 20), default=256, help="pages per manager call (default 256)")
    d.add_argument("--recovery-slots", type=count(1, 1 << 30), default=1 << 20, help="slots of the recovery test (default 1M)")
    d.add_argument("--repeat", type=count(1, 1000), default=1,
                   help="measurements of each figure; the median is reported with the spread (default 1)")
    d.add_argument("--depths", type=_counts, default=None, metavar="N,N,...",
                   help="also the store at each of these pages in flight, on up to --sweep-bytes (default none; "
                        "with --report 1,4,16,64 and --depth; 'none' for no sweep)")
    d.add_argument("--recovery-sweep", type=_counts, default=None, metavar="SLOTS,...",
                   help="also the recovery time at each of these slot counts (default none; with --report "
                        "1/16 and 1/4 of --recovery-slots; 'none' for no sweep)")
    d.add_argument("--sweep-bytes", type=parse_size, default=64 * 1024 * 1024,
                   help="bytes written and read at each depth of the sweep (default 64M, at most --bytes)")

    mt = sub.choices["metrics"]
    mt.add_argument("--device", type=device, default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    mt.add_argument("--seconds", type=float, default=3.0, help="seconds per round (default 3)")
    mt.add_argument("--rounds", type=count(1, 1000), default=5, help="rounds per mode, alternating (default 5)")
    mt.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    mt.add_argument("--pages", type=count(1, 10_000_000), default=4096, help="pages per migrate call (default 4096)")
    mt.add_argument("--piece-bytes", type=parse_size, default=16 * 1024,
                    help="bytes of each of the page's 3 pieces (default 16K)")
    mt.add_argument("--strict", action="store_true", help="exit 1 when scraped throughput misses its target")
    mt.add_argument("--json", metavar="PATH", type=output_file, help="also write the report as JSON")
    mt.add_argument("--quiet", action="store_true", help="no progress on stderr")
    mt.set_defaults(report=None, baseline=None)

    from ..bench import engine_blocks

    bl = sub.choices["blocks"]
    engine_blocks.add_arguments(bl, device_type=device, count=count(1, 1 << 20))
    bl.set_defaults(report=None, baseline=None)

    from ..bench import remote

    rm = sub.choices["remote"]
    remote.add_arguments(rm, device_type=device, count=count(1, 1 << 20), output_file=output_file, size=parse_size)
    rm.set_defaults(report=None, baseline=None)

    from ..bench import daemon

    dm = sub.choices["daemon"]
    daemon.add_arguments(dm, count=count, size=parse_size, output_file=output_file)
    dm.set_defaults(report=None, baseline=None)

    from ..bench import fidelity

    fidelity.add_arguments(sub.choices["fidelity"], device_type=device, count=count, output_file=output_file)

    cp = sub.choices["compare"]
    cp.add_argument("old", metavar="OLD.json", help="the earlier run's --json report")
    cp.add_argument("new", metavar="NEW.json", help="the later run's --json report")
    cp.add_argument("--threshold", type=float, default=0.05,
                    help="a figure moving by less than this fraction is 'same' (default 0.05)")
    cp.add_argument("--json", metavar="PATH", type=output_file, help="also write the comparison as JSON")


#: The benchmarks whose GPU runs need cuda-python only (kvcodec_sdk.gpu); the others use torch.
CUDA_PYTHON_BENCHMARKS = frozenset({"concat", "kvcm", "codec", "workload", "disk", "remote", "fidelity"})


def _usage_error(message: str) -> int:
    print(f"kvcodec bench: error: {message}", file=sys.stderr)
    return 2


def _no_gpu(args: argparse.Namespace) -> str | None:
    """Why ``--device cuda[:N]`` cannot run here (None when it can): checked before any work so a
    missing GPU, cuda-python (concat) or CUDA build of torch (the others) is one line, not a
    failure deep in the benchmark."""
    dev = getattr(args, "device", "auto")
    if not dev.startswith("cuda"):
        return None
    from .. import _native

    n = int(_native.driver_info()["device_count"])
    index = int(dev.partition(":")[2] or 0)
    if n == 0:
        return f"--device {dev}: no CUDA device here (the CUDA driver reports none); use --device cpu"
    if index >= n:
        return f"--device {dev}: there are {n} CUDA device(s) here; valid: cuda:0 .. cuda:{n - 1}"
    if args.benchmark in CUDA_PYTHON_BENCHMARKS and getattr(args, "timer", "cuda-core") == "cuda-core":
        from .. import gpu

        why = gpu.unavailable_reason()
        return None if why is None else f"--device {dev}: the {args.benchmark} benchmark runs on cuda-python: {why}"
    try:
        import torch
    except ImportError:
        return (f"--device {dev}: the {args.benchmark} benchmark allocates and times with torch, which is not "
                f"installed ({', '.join(sorted(CUDA_PYTHON_BENCHMARKS))} need only cuda-python)")
    if not torch.cuda.is_available():
        return f"--device {dev}: torch {torch.__version__} sees no CUDA device (a CPU-only build?); use --device cpu"
    return None


def run(args: argparse.Namespace) -> int:
    if args.benchmark == "compare":
        return _run_compare(args)
    why = _no_gpu(args)
    if why is None and args.report is not None:
        from ..bench.report import ReportUnavailable, require_matplotlib

        try:
            require_matplotlib()  # before any work: a long run must not end without its report
        except ReportUnavailable as exc:
            why = str(exc)
    if why is not None:
        print(f"kvcodec bench {args.benchmark}: error: {why}", file=sys.stderr)
        return 1
    if args.baseline is not None:
        args.baseline_data, problem = _load_report("--baseline", args.baseline)
        if problem:
            return _usage_error(problem)
    if args.report is not None:
        try:
            os.makedirs(args.report, exist_ok=True)
        except OSError as exc:
            return _usage_error(f"argument --report: {args.report!r} cannot be made: {exc.strerror or exc}")
    args.started = (_machine_now(), time.perf_counter())
    if args.benchmark == "codec":
        return _run_kvcm_codecs(args)
    if args.benchmark == "workload":
        return _run_workload(args)
    if args.benchmark == "disk":
        return _run_disk(args)
    if args.benchmark == "metrics":
        return _run_metrics(args)
    if args.benchmark == "blocks":
        from ..bench import engine_blocks

        return engine_blocks.main_with(args)
    if args.benchmark == "fidelity":
        return _run_fidelity(args)
    if args.benchmark == "remote":
        from ..bench import remote

        return remote.main_with(args)
    if args.benchmark == "daemon":
        return _run_daemon(args)
    args.iters = 5 if args.iters is None else args.iters
    if args.benchmark == "kvcm":
        if args.codec_name is None and args.params is not None:
            return _usage_error("--params needs --codec NAME (kvcodec bench kvcm --codec NAME --params JSON)")
        if args.codec_name is not None:
            if args.overhead:
                return _usage_error("--overhead measures concat only; leave out --codec")
            return _run_kvcm_codecs(args)
        return _run_kvcm(args)
    from ..bench import concat

    sizes = args.sizes or list(concat.DEFAULT_SIZES)
    with _progress(args):
        report = concat.run(device=args.device, pools=args.pools, sizes=sizes, total_bytes=args.bytes,
                            iters=args.iters, progress=not args.quiet, timer=args.timer)
    _show(args, concat.table(report))
    _write_json(args, report, concat.table(report))
    return 0


def _progress(args: argparse.Namespace):
    """Progress while a benchmark runs: a bar on a terminal, ``[bench]`` lines otherwise."""
    return _ui.bench_progress(not args.quiet, f"kvcodec bench {args.benchmark}")


def _show(args: argparse.Namespace, table) -> None:
    """The report table on stdout: drawn on a terminal, plain text otherwise or with --json."""
    _ui.print_report(table, json_mode=bool(args.json))


def _machine_now() -> str:
    from ..bench.machine import now

    return now()


def _kind(report) -> str:
    """The report's shape, the JSON's ``benchmark`` key (what --report and compare read)."""
    from ..bench import concat, disk, fidelity, kvcm, kvcm_codecs, workload

    for module, cls, kind in ((concat, "Report", "concat"), (kvcm, "Report", "kvcm"),
                              (kvcm_codecs, "CodecsReport", "codecs"), (disk, "Report", "disk"),
                              (workload, "Report", "workload"), (fidelity, "FidelityReport", "fidelity")):
        if isinstance(report, getattr(module, cls)):
            return kind
    raise TypeError(f"no benchmark kind for {type(report).__name__}")


#: Namespace entries that are no options of the run (the command's plumbing).
_NOT_OPTIONS = {"command", "benchmark", "func", "json", "quiet", "report", "baseline", "baseline_data", "started"}


def _data(args: argparse.Namespace, report) -> dict:
    """The report's JSON form with its kind, the command, its options and the machine record."""
    from ..bench.machine import record

    started, t0 = getattr(args, "started", (None, time.perf_counter()))
    data = report.to_json()
    data["benchmark"] = _kind(report)
    data["command"] = args.benchmark + (f" {args.codec_name}" if args.benchmark == "codec" else "")
    data["options"] = {k: v for k, v in vars(args).items()
                       if k not in _NOT_OPTIONS and isinstance(v, (str, int, float, bool, list, type(None)))}
    storage, device = None, getattr(report, "device", None)
    if data["benchmark"] == "disk":  # a device only for the rows through the manager
        storage = getattr(args, "dir", None) or tempfile.gettempdir()
        device = report.manager[0].device if report.manager else None
    elif getattr(args, "disk_dir", None):
        storage = args.disk_dir
    data["machine"] = record(device=device, storage_dir=storage,
                             started=started, seconds=time.perf_counter() - t0)
    return data


def _write_json(args: argparse.Namespace, report, *tables) -> None:
    """The run's outputs beyond the table: --json, --report and --baseline."""
    if not (args.json or args.report or args.baseline):
        return
    data = _data(args, report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.report:
        from ..bench import report as plots

        written = plots.write(data, args.report, [t.plain() for t in tables])
        print(f"wrote {len(written) - 1} plots and {written[-1]}", file=sys.stderr)
    if args.baseline:
        from ..bench import compare

        try:
            _show(args, compare.table(compare.compare(args.baseline_data, data)))
        except ValueError as exc:
            print(f"kvcodec bench {args.benchmark}: --baseline: {exc}", file=sys.stderr)


def _run_metrics(args: argparse.Namespace) -> int:
    """``kvcodec bench metrics``: exit 0 when it ran (1 with --strict and a missed target, 1 without
    the metrics extra, 2 for an option out of range)."""
    import importlib.util

    from ..bench import metrics_overhead

    for name in ("seconds", "interval"):
        if not getattr(args, name) > 0:
            return _usage_error(f"argument --{name}: {getattr(args, name)} must be positive")
    if importlib.util.find_spec("prometheus_client") is None:
        print("kvcodec bench metrics: error: this benchmark scrapes with prometheus_client, which is not installed: "
              "pip install 'kvcodec-sdk[metrics]'", file=sys.stderr)
        return 1
    report = metrics_overhead.run(args.device, args.seconds, args.rounds, args.interval, args.pages, args.piece_bytes,
                                  progress=not args.quiet)
    print(metrics_overhead.format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if args.strict and not report["met"] else 0


def _run_compare(args: argparse.Namespace) -> int:
    from ..bench import compare

    if not 0 <= args.threshold < 1:
        return _usage_error(f"argument --threshold: {args.threshold} is out of range; valid values are 0 to 1")
    old, problem = _load_report("OLD.json", args.old)
    new, problem = (None, problem) if problem else _load_report("NEW.json", args.new)
    if problem:
        return _usage_error(problem)
    try:
        result = compare.compare(old, new, args.threshold)
    except ValueError as exc:
        return _usage_error(str(exc))
    _show(args, compare.table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _run_kvcm(args: argparse.Namespace) -> int:
    from ..bench import kvcm

    pages = 10_000 if args.pages is None else args.pages
    if args.overhead:
        with _progress(args):
            report = kvcm.run_overhead(device="cpu" if args.device == "auto" else args.device, pools=args.pools,
                                       pages=pages, iters=max(args.iters, 15), progress=not args.quiet)
        _show(args, kvcm.table(report))
        _write_json(args, report, kvcm.table(report))
        return 0 if kvcm.overhead_ok(report) else 1
    sizes = args.sizes or list(kvcm.DEFAULT_SIZES)
    kw = {"max_bytes": args.bytes} if args.bytes else {}
    with _progress(args):
        report = kvcm.run(device=args.device, pools=args.pools, sizes=sizes, pages=pages, iters=args.iters,
                          progress=not args.quiet, **kw)
    _show(args, kvcm.table(report))
    _write_json(args, report, kvcm.table(report))
    return 0


def _run_daemon(args: argparse.Namespace) -> int:
    """``kvcodec bench daemon``: an unknown --codec or bad --params is a usage error (2), found
    before a daemon starts."""
    from ..bench import daemon
    from ..errors import CodecParamError, UnknownCodecError
    from ..registry import get_codec_spec

    params = None
    if args.params is not None:
        params, problem = _params_object(args.params, '{"path": "sm"}')
        if problem:
            return _usage_error(problem)
    try:
        get_codec_spec(args.codec).validate_params(params)
    except (UnknownCodecError, CodecParamError) as exc:
        return _usage_error(f"--codec {args.codec}: {exc}")
    return daemon.main_with(args, params)


def _run_kvcm_codecs(args: argparse.Namespace) -> int:
    """``kvcodec bench kvcm --codec NAME``. Exit status: 0 when it ran (missed targets are reported),
    1 when a codec failed its checks or a call, or a target is missed under --strict, 2 for a
    usage error (an unknown codec, parameters that are not a JSON object or that the codec's
    schema rejects)."""
    from ..bench import kvcm_codecs
    from ..errors import CodecParamError, UnknownCodecError

    params = None
    if args.codec_name == "all" and args.params is not None:
        return _usage_error("--params applies to one codec; name it with --codec instead of 'all'")
    if args.params is not None:
        params, problem = _params_object(args.params, '{"data_type": "uint16"}')
        if problem:
            return _usage_error(problem)
    try:
        layout = kvcm_codecs.Layout(args.layers, args.tokens, args.heads, args.head_dim)
    except ValueError as exc:
        return _usage_error(str(exc))
    try:
        with _progress(args):
            report = kvcm_codecs.run_codecs(args.codec_name, params, device=args.device, pages=args.pages,
                                            iters=args.iters, layout=layout, progress=not args.quiet)
    except (UnknownCodecError, CodecParamError) as exc:
        return _usage_error(str(exc))
    _show(args, kvcm_codecs.table(report))
    _write_json(args, report, kvcm_codecs.table(report))
    if report.failed:
        return 1
    if not any(r.codec == args.codec_name for r in report.rows) and args.codec_name != "all":
        reason = next((s["reason"] for s in report.skipped if s["codec"] == args.codec_name), "it did not run")
        print(f"kvcodec bench {args.benchmark}: nothing ran: {args.codec_name} was skipped ({reason})", file=sys.stderr)
        return 1
    return 1 if args.strict and kvcm_codecs.misses(report) else 0


def _run_disk(args: argparse.Namespace) -> int:
    from ..bench import disk
    from ..registry import list_codecs

    codecs = () if args.codecs == "none" else tuple(c for c in args.codecs.split(",") if c)
    known = [s.name for s in list_codecs()]
    for c in codecs:
        if c not in known:
            return _usage_error(f"argument --codecs: {c!r} is not a registered codec; "
                                f"valid: {', '.join(known)} or none")
    depths, sweep = args.depths, args.recovery_sweep
    if args.report:  # the report's plots of throughput vs depth and recovery time vs slots
        depths = sorted({1, 4, 16, 64, args.depth}) if depths is None else depths
        sweep = [s for s in (args.recovery_slots // 16, args.recovery_slots // 4) if s] if sweep is None else sweep
    total = args.bytes or 512 * 1024 * 1024
    with _progress(args):
        report = disk.run(directory=args.dir, slot_bytes=args.slot_bytes, total_bytes=total,
                          io_threads=args.io_threads, depth=args.depth, recovery_slots=args.recovery_slots,
                          progress=not args.quiet, queue_depth=args.queue_depth,
                          backends=disk.BACKENDS if args.io_backend == "both" else (args.io_backend,),
                          codecs=codecs, device=args.device, batch=args.batch, repeat=args.repeat,
                          depths=tuple(depths or ()), recovery_sweep=tuple(sweep or ()),
                          sweep_bytes=min(args.sweep_bytes, total))
    tables = [disk.table(report)]
    _show(args, tables[0])
    extra = disk.manager_table(report)
    if extra is not None:
        _show(args, extra)
        tables.append(extra)
    _write_json(args, report, *tables)
    return 0


def _run_workload(args: argparse.Namespace) -> int:
    from ..bench import workload

    w = workload.Workload(sessions=args.sessions, turns=args.turns, prefixes=args.prefixes,
                          prefix_pages=args.prefix_pages, new_pages=args.new_pages, piece_bytes=args.piece_bytes,
                          host_fraction=args.host_fraction, prefetch=args.prefetch)
    if args.prefetch and args.disk_dir is None:
        return _usage_error("--prefetch warms the host tier from a disk tier: it needs --disk-dir")
    try:
        w.validate()
    except ValueError as exc:  # options that do not fit together, e.g. more prefixes than sessions
        return _usage_error(str(exc))
    with _progress(args):
        report = workload.run(device=args.device, workload=w, disk_dir=args.disk_dir, progress=not args.quiet,
                              repeat=args.repeat)
    _show(args, workload.table(report))
    _write_json(args, report, workload.table(report))
    return 0


def _run_fidelity(args: argparse.Namespace) -> int:
    """``kvcodec bench fidelity``: 0 when it ran, 1 when a codec call or check failed or nothing but
    the reference ran, 2 for a usage error (options that do not fit, an unknown codec, bad --params,
    a --kv file that is not a capture)."""
    from ..bench import fidelity
    from ..errors import CodecParamError, UnknownCodecError

    problem = fidelity.options_problem(args)
    if problem:
        return _usage_error(problem)
    params = None
    if args.params is not None:
        if args.codec_name == "all":
            return _usage_error("--params applies to one codec; name it with --codec instead of 'all'")
        params, problem = _params_object(args.params, '{"granularity": "page"}')
        if problem:
            return _usage_error(problem)
    try:
        fidelity.configurations(args.codec_name, params)  # an unknown codec or bad parameters: before any work
        kv = fidelity.load_data(args)
    except (UnknownCodecError, CodecParamError, fidelity.CaptureFormatError) as exc:
        return _usage_error(str(exc))
    with _progress(args):
        report = fidelity.run(kv, args.codec_name, params, device=args.device, page_tokens=args.tokens,
                              dtype=args.dtype, topk=args.topk, data=args.data, seed=args.seed,
                              progress=not args.quiet)
    _show(args, fidelity.table(report))
    _write_json(args, report, fidelity.table(report))
    if report.failed:
        return 1
    if args.codec_name != "all" and not any(r.codec == args.codec_name for r in report.rows):
        reason = next((s["reason"] for s in report.skipped if s["codec"] == args.codec_name), "it did not run")
        print(f"kvcodec bench fidelity: nothing ran: {args.codec_name} was skipped ({reason})", file=sys.stderr)
        return 1
    return 0
