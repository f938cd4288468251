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
    assert rep.recovery["slots"] == 3000 and rep.recovery["snapshot_s"] > 0
    assert "recovery of 3000 slots" in disk.format_table(rep)
    assert list(tmp_path.iterdir()) == []  # the temp directory is removed
