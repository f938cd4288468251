"""The disk benchmark runs end to end on a small size and reports ratios (targets are checked by
the benchmark's report, not here)."""

from __future__ import annotations

from kvcodec_sdk.bench import disk


def test_disk_bench_small_run(tmp_path):
    rep = disk.run(directory=str(tmp_path), slot_bytes=16384, total_bytes=4 << 20, io_threads=2, depth=32,
                   recovery_slots=3000, progress=False, depths=(1, 8), recovery_sweep=(500,), sweep_bytes=1 << 20)
    for key in ("ceiling_write", "ceiling_read", "store_write", "store_read", "baseline_write", "baseline_read"):
        assert rep.gbps[key] > 0
    assert rep.ratios["write_vs_ceiling"] == rep.gbps["store_write"] / rep.gbps["ceiling_write"]
    # Every backend measured has its rows; the thread pool always runs, io_uring where the kernel allows it.
    assert "threads" in rep.backends and rep.default_backend == "threads"
    for backend in rep.backends:
        assert rep.gbps[f"store_{backend}_read"] > 0 and rep.info[f"store_{backend}"]["io_backend"] == backend
        assert f"read ({backend})" in disk.format_table(rep)
    if "io_uring" in rep.backends:
        assert rep.info["store_io_uring"]["queued_submits"] > 0
    assert rep.info["store"] == rep.info[f"store_{rep.default_backend}"]
    assert rep.recovery["slots"] == 3000 and rep.recovery["snapshot_s"] > 0
    assert "recovery of 3000 slots" in disk.format_table(rep)
    # One measurement per figure by default: the spread has one sample, the sweeps their points.
    assert rep.repeat == 1 and rep.spread["store_write"]["n"] == 1
    assert rep.spread["store_write"]["median"] == rep.gbps["store_write"]
    assert [(d["depth"], d["pages"]) for d in rep.depth_sweep] == [(1, 64), (8, 64)]
    assert all(d["write_gbps"] > 0 and d["read_gbps"] > 0 for d in rep.depth_sweep)
    assert [r["slots"] for r in rep.recovery_sweep] == [500] and rep.recovery_sweep[0]["snapshot_s"] > 0
    assert "depth 8: store write" in disk.format_table(rep)
    assert list(tmp_path.iterdir()) == []  # the temp directory is removed


def test_disk_bench_rows_through_the_manager(tmp_path):
    """Every page goes hot -> disk -> hot and host -> disk -> host through a manager and comes back
    byte-exact (concat) or within its declared bound (fp8, when installed); each row times the
    caller's blocked time per call."""
    from kvcodec_sdk.bench import disk_manager
    from kvcodec_sdk.bench.kvcm_codecs import Layout
    from kvcodec_sdk.registry import list_codecs

    codecs = tuple(c for c in ("concat", "fp8") if c in {s.name for s in list_codecs()})
    layout = Layout(layers=2, tokens=4, heads=2, head_dim=64)
    rows = disk_manager.run_manager(str(tmp_path), codecs=codecs, device="cpu", total_bytes=256 * layout.page_bytes,
                                    batch=64, io_threads=2, store_gbps={"write": 1.0, "read": 1.0}, layout=layout,
                                    progress=False)
    assert [(r.codec, r.path, r.mode) for r in rows] == [
        (c, f"{s}->{d}", mode) for c in codecs for mode in ("blocking", "async") for s, d in disk_manager.PATHS]
    for r in rows:
        assert r.pages == 256 and r.calls == 4 and r.raw_gbps > 0 and r.blocked_us_max >= r.blocked_us_median > 0
        assert r.blocked_target_us == 50 + 0.2 * 64
        assert r.vs_store == r.cold_gbps  # the store's rate given as 1.0 GB/s
    verified = {(r.codec, r.path, r.mode): r.verified for r in rows}
    for mode in ("blocking", "async"):
        assert verified[("concat", "disk->hot", mode)] == verified[("concat", "disk->host", mode)] == "byte-exact"
        if "fp8" in codecs:
            assert verified[("fp8", "disk->hot", mode)] == "within bound"
        fp8 = [r for r in rows if r.codec == "fp8"]
        assert all(abs(r.raw_gbps / r.cold_gbps - 2.0) < 0.1 for r in fp8)  # fp8 blobs are about half the page
    rep = disk.Report(str(tmp_path), "buffered", 4096, 1, 2, 2, manager=rows)
    rep.gbps.update(store_write=1.0, store_read=1.0)
    assert set(rep.round_trip()) == set(codecs)
    text = disk.manager_table(rep).plain()
    assert "hot->disk" in text and "blocked us/call" in text and "async" in text
    assert list(tmp_path.iterdir()) == []
