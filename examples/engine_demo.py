"""An engine-like use of the KV-cache manager: allocate pages, write K/V into them, evict them to
the host tier, bring them back and verify them. Runs on the CPU backend and on a GPU.

    python examples/engine_demo.py --device cpu                      # numpy, or torch when installed
    python examples/engine_demo.py --device cpu --framework numpy    # nothing beyond the SDK's install
    python examples/engine_demo.py --device cuda:0                   # torch with CUDA, else cuda-python
    python examples/engine_demo.py --device cuda:0 --framework cuda  # cuda-python only (the gpu extra)
    python examples/engine_demo.py --disk /tmp/kv                    # through a disk tier, off the caller's thread
    python examples/engine_demo.py --metrics-port 9400 --serve 60    # Prometheus metrics (the metrics extra)

Two engine processes sharing pages through the per-host cache daemon (``kvcodec daemon --socket S``):

    python examples/engine_demo.py --daemon S --share store    # evicts its pages, under content keys, into L2
    python examples/engine_demo.py --daemon S --share load     # another process finds and onboards them

By default L2 is the manager's host level (``KVCacheConfig.shared``: codecs encode into and decode
from the arena in place); ``--via remote`` makes it the manager's remote level instead.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np

from kvcodec_sdk import (
    BufferDesc,
    CacheLevel,
    DiskTierConfig,
    DType,
    KVCacheConfig,
    KVCacheManager,
    LayerGroupConfig,
    RemoteTierConfig,
    Role,
    SharedTierConfig,
)

TOKENS, HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 4


def kv_buffers(layers):
    shape = dict(dtype=DType.BFLOAT16, tokens_per_page=TOKENS, num_heads=HEADS, head_dim=HEAD_DIM)
    nbytes = TOKENS * HEADS * HEAD_DIM * 2
    return [BufferDesc(layer, role, bytes=nbytes, **shape) for layer in layers for role in (Role.KEY, Role.VALUE)]


def random_kv(framework, shape, device, rng):
    """Random bf16 K/V values, as an attention kernel would write them."""
    if framework == "torch":
        import torch

        return torch.randn(shape, dtype=torch.bfloat16, device=device)
    # numpy has no bf16: the views hold its bit patterns (uint16), the upper half of fp32 values.
    return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def equal(framework, a, b) -> bool:
    if framework == "torch":
        import torch

        return bool(torch.equal(a, b))
    if framework == "cuda":  # a kvcodec_sdk.gpu.DeviceArray against the host values written into it
        return bool(np.array_equal(a.numpy(), b))
    return bool(np.array_equal(a, b))


def write(framework, view, values, stream) -> None:
    """What an attention kernel would write: ``values`` into a hot buffer's view."""
    if framework == "cuda":
        view.copy_from(values, stream)  # queued on the stream; ``values`` stays alive in ``expected``
    else:
        view[...] = values


def shared_l2(socket: str, pages: int) -> RemoteTierConfig:
    """The cache daemon's arena as the manager's remote level (built with the manager's codec identity)."""
    from kvcodec_sdk.remote.daemon import DaemonBackend

    return RemoteTierConfig(lambda identity: DaemonBackend(socket, identity), max_pages=2 * pages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--pages", type=int, default=64)
    parser.add_argument("--framework", choices=("auto", "torch", "numpy", "cuda"), default="auto",
                        help="what writes and reads the pages: torch when installed, else numpy (CPU) or cuda-python "
                             "(cuda: kvcodec_sdk.gpu, on a GPU)")
    parser.add_argument("--disk", metavar="DIR", help="also use a disk tier in DIR: evict to it without blocking, "
                        "then prefetch back to the host tier before onboarding")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve the manager's Prometheus metrics "
                        "on 127.0.0.1:PORT/metrics (0: any free port; needs the metrics extra)")
    parser.add_argument("--serve", type=float, default=0, metavar="SECONDS",
                        help="with --metrics-port: keep serving this long after the round trip, pages still held")
    parser.add_argument("--daemon", metavar="SOCKET", help="share pages through the cache daemon at SOCKET "
                        "(its L2 arena as the manager's remote level); with --share")
    parser.add_argument("--share", choices=("store", "load"), help="with --daemon: store this process's pages "
                        "under content keys, or load the pages another process stored (the same values: same seed)")
    parser.add_argument("--via", choices=("host", "remote"), default="host", help="with --daemon: L2 as the "
                        "manager's host level (default: the shared host level) or as its remote level")
    args = parser.parse_args()
    if bool(args.daemon) != bool(args.share):
        parser.error("--daemon and --share go together")

    config = KVCacheConfig(
        # Two layer groups (e.g. full attention and sliding window) with identical page layouts:
        # they share one hot pool group; the host tier holds their cold pages.
        layer_groups=[LayerGroupConfig(kv_buffers(range(0, LAYERS))), LayerGroupConfig(kv_buffers(range(LAYERS, 2 * LAYERS)))],
        # In the shared arena, the host tier is this process's share of L2: keep it modest.
        gpu_quota=256 << 20, host_quota=(64 if args.daemon and args.via == "host" else 512) << 20, pool_ratio=[3, 1],
        device=args.device,
        disk=DiskTierConfig(args.disk, max_bytes=1 << 30) if args.disk else None,
        remote=shared_l2(args.daemon, args.pages) if args.daemon and args.via == "remote" else None,
        shared=SharedTierConfig(args.daemon) if args.daemon and args.via == "host" else None)
    manager = KVCacheManager(config)  # the default lossless concat codec
    print(manager)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        from kvcodec_sdk.metrics import register

        register(manager, name="engine_demo")  # read on each scrape, never between
        server, _ = start_http_server(args.metrics_port, addr="127.0.0.1")
        print(f"metrics at http://127.0.0.1:{server.server_port}/metrics", flush=True)
    device = manager.device
    framework = args.framework
    if framework == "auto":
        try:
            import torch  # noqa: F401
        except ImportError:
            framework = "numpy" if device == "cpu" else "cuda"
        else:
            framework = "torch"
    if framework == "numpy" and device != "cpu":
        parser.error(f"--device {device} keeps pages in GPU memory: use --framework cuda or torch")
    if framework == "cuda" and device == "cpu":
        parser.error("--framework cuda writes GPU memory; this manager runs on the CPU (use numpy or torch)")
    if framework == "cuda":
        from kvcodec_sdk import gpu

        stream, on_stream = gpu.new_stream(device), contextlib.nullcontext()
    elif framework == "torch":
        import torch

        torch.manual_seed(0)  # the same values in every run: a loading process checks what a storing one wrote
        stream = torch.cuda.Stream() if device != "cpu" else None
        on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    else:
        stream, on_stream = None, contextlib.nullcontext()
    rng = np.random.default_rng(0)

    keys = [b"engine-demo/prefix/%d" % i for i in range(args.pages)]  # content keys: what other processes look up
    level = CacheLevel.REMOTE if args.via == "remote" else CacheLevel.HOST
    if args.share == "load":
        # Found in L2: pages of this manager at that level (the shared host level: in the very
        # arena slots the other process's encode wrote).
        found = manager.find_remote(keys) if args.via == "remote" else manager.find_shared(keys)
        pages = [p for p in found if p is not None]
        if len(pages) != args.pages:
            raise SystemExit(f"the daemon holds {len(pages)} of the {args.pages} pages; run --share store first")
        manager.onboard(pages, source=level, stream=stream)  # L2 -> hot, decoded
        manager.synchronize()
        with on_stream:
            for page in pages:
                shapes = [tuple(v.shape) for v in manager.buffer_views(page, framework=framework)]
                values = [random_kv(framework, s, device, rng) for s in shapes]  # what the storing process wrote
                for v, x in zip(manager.buffer_views(page, framework=framework), values):
                    assert equal(framework, v, x), f"page {page.id:#x} differs from what the other process stored"
        print(f"{len(pages)} pages loaded from the daemon's L2 byte-exact on {manager.device} ({framework})", flush=True)
        manager.close()
        return

    pages = manager.allocate(0, args.pages, stream=stream)
    expected = []
    with on_stream:
        for page in pages:
            views = manager.buffer_views(page, framework=framework)  # one [token][head][dim] view per K/V buffer
            values = [random_kv(framework, tuple(v.shape), device, rng) for v in views]
            for v, x in zip(views, values):
                write(framework, v, x, stream)
            expected.append(values)

    if args.share == "store":
        manager.set_keys(pages, keys)
        manager.evict(pages, stream=stream, level=level)  # encoded into (host) or written to (remote) the arena
        print(f"{len(pages)} pages stored in the daemon's L2 from {manager.device} ({framework})", flush=True)
        manager.close()
        return

    if args.disk:
        t0 = time.perf_counter()
        # hot -> disk: returns once submitted; the writes land on the manager's I/O thread while
        # the engine goes on (the pages stay hot and in flight until then).
        pending = manager.evict(pages, stream=stream, level=CacheLevel.DISK, blocking=False)
        blocked_us = (time.perf_counter() - t0) * 1e6
        pending.wait()  # durable now (raises MigrationError if a write failed: the pages stay hot)
        assert all(p.level == CacheLevel.DISK for p in pages)
        manager.prefetch(pages).wait()  # disk -> host in the background, e.g. when a prefix is scheduled
        s = manager.prefetch_stats()
        print(f"evicted to disk blocking the caller {blocked_us:.0f} us; prefetched {s.completed} pages to the host")
    else:
        manager.evict(pages, stream=stream)  # hot -> host, ordered after the writes on the same stream
    assert all(p.level == CacheLevel.HOST for p in pages)
    manager.onboard(pages, stream=stream)  # host -> hot, into new slots
    manager.synchronize()
    if stream is not None:
        stream.sync() if framework == "cuda" else stream.synchronize()

    for page, values in zip(pages, expected):
        for v, x in zip(manager.buffer_views(page, framework=framework), values):
            assert equal(framework, v, x), f"page {page.id:#x} differs after the round trip"
    stats = manager.stats(CacheLevel.HOST)[0]
    print(f"{len(pages)} pages evicted and onboarded byte-exact on {manager.device} ({framework}): "
          f"{stats.pages_offloaded} offloaded ({stats.bytes_offloaded >> 20} MiB), {stats.pages_onboarded} onboarded",
          flush=True)
    if args.metrics_port is not None and args.serve > 0:
        print(f"serving metrics for {args.serve:g} s", flush=True)
        time.sleep(args.serve)
    manager.free(pages)
    manager.close()


if __name__ == "__main__":
    main()
