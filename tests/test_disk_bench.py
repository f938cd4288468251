"""The disk benchmark runs end to end on a small size and reports ratios (targets are checked by
the benchmark's report, not here)."""

from __future__ import annotations

from kvcodec_sdk.bench import disk


def test_disk_bench_small_run(tmp_path):
    rep = disk.run(directory=str(tmp_path), slot_bytes=16384, total_bytes=4 << 20, io_threads=2, depth=32,
                   recovery_slots=3000, progress=False)
    for key in ("ceiling_write", "ceiling_read", "store_write", "store_read", "baseline_write", "baseline_read"):
        assert rep.gbps[key] > 0
    assert rep.ratios["write_vs_ceiling"] == rep.gbps["store_write"] / rep.gbps["ceiling_write"]
    # Every backend measured has its rows; the thread pool always runs, io_uring where the kernel allows it.
    assert "threads" in rep.backends and rep.default_backend in ("threads", "io_uring")
    for backend in rep.backends:
        assert rep.gbps[f"store_{backend}_read"] > 0 and rep.info[f"store_{backend}"]["io_backend"] == backend
        assert f"read ({backend})" in disk.format_table(rep)
    assert ("io_uring" in rep.backends) == (rep.default_backend == "io_uring")
    if "io_uring" in rep.backends:
        assert rep.info["store_io_uring"]["queued_submits"] > 0
    assert rep.info["store"] == rep.info[f"store_{rep.default_backend}"]
    assert rep.recovery["slots"] == 3000 and rep.recovery["snapshot_s"] > 0
    assert "recovery of 3000 slots" in disk.format_table(rep)
    assert list(tmp_path.iterdir()) == []  # the temp directory is removed
