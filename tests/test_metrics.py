"""kvcodec_sdk.metrics against the real prometheus_client: the scrape reads the manager's counters,
the documented table is the collector's, a real HTTP scrape works, and managers that go away
leave the scrape."""

from __future__ import annotations

import gc
import re
import sys
import urllib.request
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvcodec_sdk import (  # noqa: E402
    BufferDesc,
    BufferRole,
    CacheLevel,
    DataType,
    DiskTierConfig,
    KVCacheConfig,
    KVCacheManager,
    LayerGroupConfig,
    metrics,  # noqa: E402
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
PAGE_BYTES = 2 * 16 * 4 * 64 * 2


def make_manager(disk: Path | None = None, host_quota: int = 8 << 20, gpu_quota: int = 8 << 20) -> KVCacheManager:
    buffers = [BufferDesc(layer_id=0, role=role, bytes=PAGE_BYTES // 2, dtype=DataType.BFLOAT16, tokens_per_page=16,
                          num_heads=4, head_dim=64) for role in (BufferRole.KEY, BufferRole.VALUE)]
    config = KVCacheConfig(layer_groups=[LayerGroupConfig(buffers)], gpu_quota=gpu_quota, host_quota=host_quota,
                           device="cpu",
                           disk=DiskTierConfig(str(disk), max_bytes=64 << 20, container_bytes=16 << 20) if disk else None)
    return KVCacheManager(config)


def samples(registry) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one scrape, parsed by prometheus_client's parser."""
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scrape: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    assert key in scrape, f"{name}{labels} not scraped; scraped: {sorted(k for k in scrape if k[0] == name)}"
    return scrape[key]


def test_the_documented_table_is_the_collectors():
    rows = re.findall(r"^\| `(kvcodec_\w+)` \| ([\w ()]+) \| ([^|]*) \| (.*) \|$", DOCS.read_text(), re.M)
    documented = [(name, kind, tuple(re.findall(r"`(\w+)`", labels)), help) for name, kind, labels, help in rows]
    expected = [(m.name, "gauge (info)" if m.kind == "info" else m.kind, m.labels, m.help) for m in metrics.METRICS]
    assert documented == expected


def test_every_metric_is_well_formed():
    names = [m.name for m in metrics.METRICS]
    assert len(set(names)) == len(names)
    for m in metrics.METRICS:
        assert re.fullmatch(r"kvcodec_[a-z0-9_]+", m.name), m.name
        assert m.kind in ("counter", "gauge", "info"), m
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert m.labels[0] == "manager", m
        assert m.help.endswith("."), m


def test_a_scrape_reads_the_managers_counters(tmp_path):
    manager = make_manager(tmp_path / "kv")
    registry = CollectorRegistry()
    metrics.register(manager, name="engine0", registry=registry)
    pages = manager.allocate(0, 4)
    manager.evict(pages)
    manager.onboard(pages)
    manager.evict(pages, level=CacheLevel.DISK)
    scrape = samples(registry)
    host = dict(manager="engine0", level="host", pool_group=0)
    assert value(scrape, "kvcodec_manager_info", manager="engine0", device="cpu", codec="concat") == 1
    assert value(scrape, "kvcodec_pages_offloaded_total", **host) == 4
    assert value(scrape, "kvcodec_pages_onboarded_total", **host) == 4
    assert value(scrape, "kvcodec_slots_used", manager="engine0", level="disk", pool_group=0) == 4
    assert value(scrape, "kvcodec_quota_bytes", manager="engine0", level="host") == 8 << 20
    for level, decodes in (("host", 1), ("disk", 0)):
        codec = dict(manager="engine0", codec="concat", level=level, pool_group=0)
        assert value(scrape, "kvcodec_codec_calls_total", **codec, direction="encode") == 1
        assert value(scrape, "kvcodec_codec_calls_total", **codec, direction="decode") == decodes
        hot = value(scrape, "kvcodec_codec_hot_bytes_total", **codec, direction="encode")
        cold = value(scrape, "kvcodec_codec_cold_bytes_total", **codec, direction="encode")
        assert hot == 4 * PAGE_BYTES and hot / cold == manager.stats(CacheLevel.HOST)[0].achieved_ratio == 1.0
        assert value(scrape, "kvcodec_codec_host_seconds_total", **codec, direction="encode") > 0
    # The hot end of a codec transfer is not reported again.
    assert not any(k[0] == "kvcodec_codec_calls_total" and ("level", "hot") in k[1] for k in scrape)
    for reason in ("capacity", "bad_checksum", "missing", "disk_checksum"):
        assert value(scrape, "kvcodec_pages_dropped_total", **host, reason=reason) == 0
    disk = dict(manager="engine0", pool_group=0)
    assert value(scrape, "kvcodec_disk_puts_total", **disk) == 4
    assert value(scrape, "kvcodec_disk_slots_live", **disk) == 4
    info = [k for k in scrape if k[0] == "kvcodec_disk_region_info"]
    assert len(info) == 1 and ("dir", str(tmp_path / "kv" / "group0")) in info[0][1]
    assert value(scrape, "kvcodec_prefetch_pages_total", manager="engine0", outcome="issued") == 0
    manager.close()


def test_capacity_drops_are_counted_by_reason():
    """The host level is the last: allocating past both levels' capacity drops its oldest pages."""
    manager = make_manager(host_quota=4 * PAGE_BYTES, gpu_quota=4 * PAGE_BYTES)
    registry = CollectorRegistry()
    metrics.register(manager, registry=registry)
    for _ in range(3):
        manager.allocate(0, 4)  # the second evicts the first to the host, the third drops them there
    drops = manager.stats(CacheLevel.HOST)[0].drops
    assert drops == 4
    scrape = samples(registry)
    assert value(scrape, "kvcodec_pages_dropped_total", manager="0", level="host", pool_group=0,
                 reason="capacity") == drops
    manager.close()


def test_a_real_http_scrape():
    manager = make_manager()
    registry = CollectorRegistry()
    metrics.register(manager, name="http", registry=registry)
    manager.evict(manager.allocate(0, 2))
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert 'kvcodec_pages_offloaded_total{level="host",manager="http",pool_group="0"} 2.0' in text
    assert "# TYPE kvcodec_codec_calls_total counter" in text
    manager.close()


def test_registering_reads_no_manager_and_names_are_unique():
    registry = CollectorRegistry()
    manager, other = make_manager(), make_manager()
    collector = metrics.register(manager, registry=registry)
    assert metrics.register(other, registry=registry) is collector  # one collector per registry
    assert collector.names() == ["0", "1"]
    assert {f.name for f in collector.describe()} == {m.family for m in metrics.METRICS}
    assert all(not f.samples for f in collector.describe())
    with pytest.raises(ValueError, match="already collected"):
        collector.add(make_manager(), name="0")
    with pytest.raises(ValueError, match="non-empty string"):
        collector.add(manager, name="")
    assert metrics.unregister(other, registry=registry)
    assert not metrics.unregister(other, registry=registry)
    assert collector.names() == ["0"]
    manager.close()
    other.close()


def test_closed_and_collected_managers_leave_the_scrape():
    registry = CollectorRegistry()
    closed, dropped = make_manager(), make_manager()
    collector = metrics.register(closed, name="closed", registry=registry)
    collector.add(dropped, name="dropped")
    closed.close()
    dropped.close()
    del dropped
    gc.collect()
    scrape = samples(registry)
    assert not any(k[0] == "kvcodec_manager_info" for k in scrape)
    assert collector.names() == []
    assert metrics.register(make_manager(), name="closed", registry=registry) is collector  # the name is free again


def test_without_prometheus_client_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"kvcodec-sdk\[metrics\]"):
        metrics.KVCacheCollector().add(make_manager())


def test_a_running_engine_demo_is_scraped(tmp_path):
    """The operator tutorial's scrape: the engine demo serves its manager's metrics while it runs."""
    import subprocess

    demo = Path(__file__).resolve().parent.parent / "examples" / "engine_demo.py"
    proc = subprocess.Popen([sys.executable, str(demo), "--device", "cpu", "--framework", "numpy", "--disk",
                             str(tmp_path / "kv"), "--metrics-port", "0", "--serve", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("metrics at "):
                url = line.split()[-1]
            if line.startswith("serving metrics"):
                break
        assert url, proc.stderr.read()
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    finally:
        proc.kill()
        proc.wait(30)
    scrape = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    demo_labels = dict(manager="engine_demo", pool_group=0)
    assert value(scrape, "kvcodec_pages_offloaded_total", level="disk", **demo_labels) == 64
    assert value(scrape, "kvcodec_pages_onboarded_total", level="host", **demo_labels) == 64
    assert value(scrape, "kvcodec_disk_puts_total", **demo_labels) == 64
    assert value(scrape, "kvcodec_prefetch_pages_total", manager="engine_demo", outcome="used") == 64
    # Every line the operator tutorial shows is a line of this scrape.
    tutorial = (DOCS.parent / "tutorials" / "operator.md").read_text()
    shown = [line for line in tutorial.splitlines() if line.startswith("kvcodec_")]
    assert shown and set(shown) <= set(text.splitlines()), set(shown) - set(text.splitlines())


def test_bench_metrics_compares_scraped_with_unscraped_runs(tmp_path):
    """`kvcodec bench metrics`: both modes ran, the scraper really scraped, the ratio is what the rows say."""
    import json

    from kvcodec_sdk import cli

    out = tmp_path / "metrics.json"
    assert cli.main(["bench", "metrics", "--device", "cpu", "--seconds", "0.2", "--rounds", "2", "--interval", "0.05",
                     "--pages", "64", "--piece-bytes", "4K", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "metrics_overhead" and report["machine"]["device"] == "cpu"
    rows = {row["mode"]: row for row in report["rows"]}
    assert set(rows) == {"off", "scraped"}  # no GPU timing on the CPU backend
    assert all(row["gbps"]["n"] == 2 and row["gbps"]["min"] > 0 for row in rows.values())
    assert rows["scraped"]["ratio_to_off"] == pytest.approx(rows["scraped"]["gbps"]["median"] / rows["off"]["gbps"]["median"])
    assert report["scrapes"]["n"] >= 2 and report["met"] == (rows["scraped"]["ratio_to_off"] >= report["target_ratio"])


def test_bench_metrics_refuses_a_non_positive_interval(capsys):
    from kvcodec_sdk import cli

    assert cli.main(["bench", "metrics", "--interval", "0"]) == 2
    assert "--interval" in capsys.readouterr().err
