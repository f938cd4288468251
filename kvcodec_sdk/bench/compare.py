"""``kvcodec bench compare OLD.json NEW.json`` (or ``--baseline OLD.json`` on any benchmark): how
each figure moved between two runs of the same benchmark.

Each report's headline figures (GB/s, host CPU per page, recovery seconds, pages per second,
allocation latency...) are named by their row (piece size, direction, variant, codec, path, run)
so the same figure is found in both runs. Per figure: the old and the new value, new / old, and
whether it moved the right way: ``better`` or ``worse`` when it moved by more than the threshold
(default 5%) and outside both runs' spreads (min to max of their repeats), else ``same``. A
figure only one run has is listed as such; two runs on other machines are compared, with a note
naming what differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterator

from ._common import Column, Table, fmt_size

DEFAULT_THRESHOLD = 0.05

HIGHER, LOWER = "higher", "lower"


@dataclass
class Figure:
    value: float
    better: str  # HIGHER or LOWER is better
    spread: dict | None = None


@dataclass
class Change:
    figure: str
    old: float | None
    new: float | None
    ratio: float | None  # new / old
    verdict: str  # "better", "worse", "same", "only in old", "only in new"


@dataclass
class Comparison:
    benchmark: str
    old_time: str | None
    new_time: str | None
    changes: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"benchmark": self.benchmark, "old_time": self.old_time, "new_time": self.new_time,
                "changes": [vars(c) for c in self.changes], "notes": list(self.notes)}


def _fig(row: dict, key: str, better: str) -> Figure | None:
    v = row.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    return Figure(float(v), better, (row.get("spread") or {}).get(key))


def _rows(data: dict) -> Iterator[tuple[str, dict, tuple[tuple[str, str], ...]]]:
    """(row name, row, figures as (key, better)) of each kind of report."""
    kind = data.get("benchmark")
    if kind == "concat":
        for r in data.get("rows", []):
            yield (f"{fmt_size(r['piece_bytes'])} {r['direction']} {r['variant']}", r,
                   (("gbps", HIGHER), ("host_us_per_page", LOWER)))
    elif kind == "kvcm":
        for r in data.get("rows", []):
            yield (f"{fmt_size(r['piece_bytes'])} {r['direction']}", r,
                   (("gbps", HIGHER), ("codec_gbps", HIGHER), ("host_us_per_page", LOWER),
                    ("overhead_us_per_page", LOWER)))
    elif kind == "codecs":
        for r in data.get("rows", []):
            params = ",".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
            yield (f"{r['codec']}{' ' + params if params else ''} {r['direction']}", r,
                   (("gbps", HIGHER), ("bare_gbps", HIGHER), ("host_ratio", LOWER), ("host_us_per_page", LOWER)))
    elif kind == "fidelity":
        for r in data.get("rows", []):
            params = ",".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
            topk = {f"top{k}": v for k, v in (r.get("topk_mean") or {}).items()}
            yield (f"{r['codec']}{' ' + params if params else ''}", r | topk,
                   (("cosine_mean", HIGHER), ("cosine_min", HIGHER), ("rel_l2_mean", LOWER), ("rel_l2_max", LOWER),
                    *((k, HIGHER) for k in topk)))
    elif kind == "workload":
        for r in data.get("runs", []):
            yield ("host tier" if r["host_tier"] else "hot only", r | {"reuse": 1.0 - r["hit_rate"]["miss"]},
                   (("reuse", HIGHER), ("pages_moved_per_s", HIGHER), ("host_us_per_moved_page", LOWER),
                    ("alloc_p50_us", LOWER), ("alloc_p99_us", LOWER)))
    elif kind == "disk":
        gbps = dict(data.get("gbps", {}))
        yield "disk", gbps | {"spread": data.get("spread", {})}, tuple((k, HIGHER) for k in gbps)
        rec = data.get("recovery") or {}
        if rec:
            yield f"recovery {rec['slots']} slots", rec, (("snapshot_s", LOWER), ("journal_s", LOWER))
        for rc in data.get("recovery_sweep", []):
            yield f"recovery {rc['slots']} slots", rc, (("snapshot_s", LOWER), ("journal_s", LOWER))
        for s in data.get("depth_sweep", []):
            yield f"depth {s['depth']}", s, (("write_gbps", HIGHER), ("read_gbps", HIGHER))
        for m in data.get("manager", []):
            yield (f"{m['codec']} {m['path']} {m['mode']}", m,
                   (("raw_gbps", HIGHER), ("blocked_us_median", LOWER)))


def figures(data: dict) -> dict[str, Figure]:
    """The headline figures of a report's JSON form, by name (``"4 KiB encode auto gbps"``)."""
    out = {}
    for name, row, keys in _rows(data):
        for key, better in keys:
            f = _fig(row, key, better)
            if f is not None:
                out[f"{name} {key}"] = f
    return out


def _outside_spreads(old: Figure, new: Figure) -> bool:
    """Whether the two runs' ranges (min to max of their repeats) do not overlap; True when a run
    has no spread (one measurement)."""
    a, b = old.spread, new.spread
    if not a or not b or a.get("n", 0) < 2 or b.get("n", 0) < 2:
        return True
    return a["max"] < b["min"] or b["max"] < a["min"]


def compare(old: dict, new: dict, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """How each figure moved from ``old`` to ``new`` (two reports' JSON forms). Raises ValueError
    for reports of different benchmarks."""
    kind_old, kind_new = old.get("benchmark"), new.get("benchmark")
    if kind_old is None or kind_new is None:
        raise ValueError("a report without its benchmark kind (written before reports carried it?): "
                         "rerun it with this version's --json")
    if kind_old != kind_new:
        raise ValueError(f"the reports are of different benchmarks: {kind_old} and {kind_new}")
    mo, mn = old.get("machine") or {}, new.get("machine") or {}
    out = Comparison(kind_new, mo.get("time"), mn.get("time"))
    for what, get in (("GPU", lambda m: (m.get("gpu") or {}).get("name")), ("CPU", lambda m: (m.get("cpu") or {})
                      .get("model")), ("device", lambda m: m.get("device")),
                      ("storage", lambda m: (m.get("storage") or {}).get("device_class"))):
        if get(mo) != get(mn):
            out.notes.append(f"{what} differs: {get(mo)} (old) vs {get(mn)} (new)")
    if old.get("options") and new.get("options") and old["options"] != new["options"]:
        diff = sorted(k for k in set(old["options"]) | set(new["options"])
                      if old["options"].get(k) != new["options"].get(k))
        out.notes.append("options differ: " + ", ".join(
            f"{k} {old['options'].get(k)} -> {new['options'].get(k)}" for k in diff))
    fo, fn = figures(old), figures(new)
    for name in [*fo, *(n for n in fn if n not in fo)]:
        a, b = fo.get(name), fn.get(name)
        if a is None or b is None:
            out.changes.append(Change(name, a and a.value, b and b.value, None,
                                      "only in old" if b is None else "only in new"))
            continue
        ratio = b.value / a.value if a.value else None
        verdict = "same"
        if ratio is not None and abs(ratio - 1) > threshold and _outside_spreads(a, b):
            up = ratio > 1
            verdict = "better" if up == (b.better == HIGHER) else "worse"
        out.changes.append(Change(name, a.value, b.value, ratio, verdict))
    return out


def load(path: str) -> dict:
    """A report written by ``--json PATH``; ValueError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or "benchmark" not in data:
        raise ValueError(f"{path} is not a kvcodec bench report (no 'benchmark' key; written by --json PATH)")
    return data


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def table(c: Comparison) -> Table:
    """The comparison as table cells: one row per figure."""
    w = max([len("figure")] + [len(x.figure) for x in c.changes])
    cols = [Column("figure", w, "<"), Column("old", 10), Column("new", 10), Column("new/old", 8),
            Column("", 0, "<", "  ")]
    rows = [[x.figure, _num(x.old), _num(x.new), f"{x.ratio:.3f}" if x.ratio is not None else "-", x.verdict]
            for x in c.changes]
    counts = {v: sum(x.verdict == v for x in c.changes) for v in ("better", "worse", "same")}
    notes = [f"{counts['better']} better, {counts['worse']} worse, {counts['same']} the same "
             f"(moved by more than the threshold and outside both runs' spreads)", *c.notes]
    title = f"kvcodec bench {c.benchmark}: {c.old_time or '?'} (old) -> {c.new_time or '?'} (new)"
    return Table([title], cols, rows, notes)
