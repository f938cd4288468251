"""``kvcodec bench ... --report DIR``: PNG plots of a benchmark's JSON report and a Markdown summary.

Everything here reads the JSON form of a report (what ``--json PATH`` writes: the report, its
``benchmark`` kind and the ``machine`` record), so a saved run can be drawn again later. Per kind:

==========  ============================================================================================
benchmark   plots
==========  ============================================================================================
concat      ``concat_throughput.png``: GB/s vs piece size per variant, against the ceiling
kvcm        ``kvcm_throughput.png``: the manager, the bare codec and the ceiling vs piece size;
            ``kvcm_host_cpu.png``: host CPU per page, the manager's own part and the codec's
codecs      ``codecs_ratio_vs_throughput.png``: each codec's compression ratio vs its GB/s through
            the manager (``kvcodec bench kvcm --codec all``, ``kvcodec bench codec NAME``)
disk        ``disk_store.png``: the store against the ceiling and the baseline per backend;
            ``disk_depth.png``: store GB/s vs pages in flight; ``disk_recovery.png``: recovery time
            vs slots; ``disk_manager.png``: the rows through the KV-cache manager
workload    ``workload_hit_rate.png``: lookups per level per run; ``workload_pages_per_s.png``
==========  ============================================================================================

Error bars are the spread (min to max) of the repeats. ``summary.md`` embeds the plots with the
machine record and the report's table. matplotlib is an optional dependency (the ``report``
extra); it is drawn with its Agg canvas, so no display and no global pyplot state are involved.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ._common import fmt_size
from .machine import describe

EXTRA = "report"
SUMMARY = "summary.md"


class ReportUnavailable(RuntimeError):
    """``--report`` was asked for but matplotlib is not installed (the message names the extra)."""


def require_matplotlib() -> Any:
    """The matplotlib module, or :class:`ReportUnavailable` naming the extra that installs it."""
    try:
        mpl = importlib.import_module("matplotlib")
        importlib.import_module("matplotlib.figure")
        importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as exc:
        raise ReportUnavailable(f"--report draws its plots with matplotlib, which is not installed ({exc}); "
                                f"install the {EXTRA!r} extra: pip install 'kvcodec-sdk[{EXTRA}]'") from None
    return mpl


def _figure(ncols: int = 1, width: float = 6.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, directory: str, name: str, out: list[str]) -> None:
    path = os.path.join(directory, name)
    fig.savefig(path, dpi=110)
    out.append(path)


def _err(rows: list[dict], key: str, value: str | None = None) -> list[list[float]] | None:
    """Error bars (below, above) from each row's ``spread[key]``; None when no row has one."""
    lo, hi, any_spread = [], [], False
    for r in rows:
        s = (r.get("spread") or {}).get(key)
        v = r[value or key]
        if s and s.get("n", 0) > 1 and s["min"] is not None:
            any_spread = True
            lo.append(max(0.0, v - s["min"]))
            hi.append(max(0.0, s["max"] - v))
        else:
            lo.append(0.0)
            hi.append(0.0)
    return [lo, hi] if any_spread else None


def _size_axis(ax, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([fmt_size(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("piece size")


def _concat(data: dict, directory: str, out: list[str]) -> None:
    rows = data["rows"]
    directions = list(dict.fromkeys(r["direction"] for r in rows))
    fig, axes = _figure(len(directions))
    ceiling_key = {"encode": "d2h_pinned", "decode": "h2d_pinned"}
    for ax, d in zip(axes, directions):
        drows = [r for r in rows if r["direction"] == d]
        for variant in dict.fromkeys(r["variant"] for r in drows):
            vr = sorted((r for r in drows if r["variant"] == variant), key=lambda r: r["piece_bytes"])
            ax.errorbar([r["piece_bytes"] for r in vr], [r["gbps"] for r in vr], yerr=_err(vr, "gbps"),
                        marker="o", capsize=3, label=variant)
        sizes = sorted({r["piece_bytes"] for r in drows})
        ceil = [data["ceilings_gbps"][str(s)].get(ceiling_key[d], data["ceilings_gbps"][str(s)].get("memcpy"))
                for s in sizes]
        ax.plot(sizes, ceil, "k--", label="ceiling (one contiguous copy)")
        _size_axis(ax, sizes)
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"concat {d} on {data['device']}")
        ax.legend(fontsize="small")
    _save(fig, directory, "concat_throughput.png", out)


def _kvcm(data: dict, directory: str, out: list[str]) -> None:
    rows = data["rows"]
    directions = list(dict.fromkeys(r["direction"] for r in rows))
    fig, axes = _figure(len(directions))
    for ax, d in zip(axes, directions):
        dr = sorted((r for r in rows if r["direction"] == d), key=lambda r: r["piece_bytes"])
        x = [r["piece_bytes"] for r in dr]
        for key, label, style in (("gbps", "through the manager", "o-"), ("codec_gbps", "concat bare", "s-"),
                                  ("ceiling_gbps", "ceiling (one contiguous copy)", "k--")):
            ax.errorbar(x, [r[key] for r in dr], yerr=_err(dr, key), fmt=style, capsize=3, label=label)
        _size_axis(ax, x)
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"manager {d} on {data['device']}, {dr[0]['pages'] if dr else 0} pages/call")
        ax.legend(fontsize="small")
    _save(fig, directory, "kvcm_throughput.png", out)

    fig, (ax,) = _figure()
    labels = [f"{fmt_size(r['piece_bytes'])} {r['direction']}" for r in rows]
    codec = [r["codec_host_us_per_page"] for r in rows]
    own = [max(0.0, r["overhead_us_per_page"]) for r in rows]
    ax.bar(labels, codec, label="the codec's call")
    ax.bar(labels, own, bottom=codec, label="the manager's own work")
    ax.set_ylabel("host CPU us per page")
    ax.set_title("host CPU per page migrated" + (f", {data['resident']} resident pages" if data.get("resident") else ""))
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize="small")
    _save(fig, directory, "kvcm_host_cpu.png", out)


def _codecs(data: dict, directory: str, out: list[str]) -> None:
    rows = data["rows"]
    fig, (ax,) = _figure(width=7.5)
    markers = {"evict": "o", "onboard": "s"}
    for n, d in enumerate(dict.fromkeys(r["direction"] for r in rows)):
        dr = [r for r in rows if r["direction"] == d]
        x = [r["gbps"] for r in dr]
        y = [r["page_bytes"] / r["cold_page_bytes"] if r["cold_page_bytes"] else 0.0 for r in dr]
        ax.errorbar(x, y, xerr=_err(dr, "gbps"), fmt=markers.get(d, "^"), capsize=3, label=d)
        for r, xi, yi in zip(dr if n == 0 else [], x, y):  # each codec named once, at its first direction
            params = ",".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
            ax.annotate(r["codec"] + (f" {params}" if params else ""), (xi, yi), fontsize="x-small",
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("GB/s through the manager (hot page bytes)")
    ax.set_ylabel("compression ratio (page bytes / cold page bytes)")
    ax.set_title(f"codecs through the manager on {data['device']}, {data['pages']} pages/call")
    ax.legend(fontsize="small")
    _save(fig, directory, "codecs_ratio_vs_throughput.png", out)


def _bars(ax, groups: list[str], series: dict[str, list[float]], errs: dict[str, Any] | None = None) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=label, yerr=(errs or {}).get(label), capsize=3)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)


def _spread_err(data: dict, key: str) -> list[float]:
    s = (data.get("spread") or {}).get(key)
    v = data["gbps"].get(key, 0.0)
    if not s or s.get("n", 0) < 2:
        return [0.0, 0.0]
    return [max(0.0, v - s["min"]), max(0.0, s["max"] - v)]


def _disk(data: dict, directory: str, out: list[str]) -> None:
    g = data["gbps"]
    fig, (ax,) = _figure()
    groups = ["write", "read"]
    series = {"ceiling": [g["ceiling_write"], g["ceiling_read"]],
              "baseline (pwrite/pread per page)": [g["baseline_write"], g["baseline_read"]]}
    errs = {"ceiling": [[_spread_err(data, f"ceiling_{d}")[i] for d in groups] for i in (0, 1)],
            "baseline (pwrite/pread per page)": [[_spread_err(data, f"baseline_{d}")[i] for d in groups]
                                                 for i in (0, 1)]}
    for b in data["backends"]:
        series[f"store ({b})"] = [g[f"store_{b}_write"], g[f"store_{b}_read"]]
        errs[f"store ({b})"] = [[_spread_err(data, f"store_{b}_{d}")[i] for d in groups] for i in (0, 1)]
    _bars(ax, groups, series, errs)
    ax.set_ylabel("GB/s")
    ax.set_title(f"disk tier: {fmt_size(data['slot_bytes'])} pages, depth {data['depth']}, {data['io']} I/O")
    ax.legend(fontsize="small")
    _save(fig, directory, "disk_store.png", out)

    sweep = data.get("depth_sweep") or []
    if sweep:
        fig, (ax,) = _figure()
        depths = [s["depth"] for s in sweep]
        for d in ("write", "read"):
            ax.errorbar(depths, [s[f"{d}_gbps"] for s in sweep], yerr=_err(sweep, f"{d}_gbps"), marker="o",
                        capsize=3, label=f"store {d}")
        for d, style in (("write", "k--"), ("read", "k:")):
            ax.axhline(g[f"ceiling_{d}"], linestyle=style[1:], color="k", label=f"ceiling {d}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths)
        ax.set_xticklabels([str(x) for x in depths])
        ax.minorticks_off()
        ax.set_xlabel("pages in flight")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"store ({sweep[0]['backend']}) vs depth, {sweep[0]['pages']} pages")
        ax.legend(fontsize="small")
        _save(fig, directory, "disk_depth.png", out)

    points = sorted([*data.get("recovery_sweep", []), *([data["recovery"]] if data.get("recovery") else [])],
                    key=lambda r: r["slots"])
    if points:
        fig, (ax,) = _figure()
        slots = [p["slots"] for p in points]
        for key, label in (("snapshot_s", "from the snapshot"), ("journal_s", "from the journal alone")):
            ax.errorbar(slots, [p[key] for p in points], yerr=_err(points, key), marker="o", capsize=3, label=label)
        target = points[-1].get("target_s")
        if target and data.get("recovery"):
            ax.plot([data["recovery"]["slots"]], [target], "rx", markersize=10, label=f"target ({target} s)")
        ax.set_xscale("log")
        ax.set_xlabel("slots")
        ax.set_ylabel("seconds to reopen")
        ax.set_ylim(bottom=0)
        ax.set_title("disk tier recovery time vs slots")
        ax.legend(fontsize="small")
        _save(fig, directory, "disk_recovery.png", out)

    rows = data.get("manager") or []
    if rows:
        fig, (ax,) = _figure(width=8.5)
        paths = list(dict.fromkeys(r["path"] for r in rows))
        series, errs = {}, {}
        for codec in dict.fromkeys(r["codec"] for r in rows):
            for mode in dict.fromkeys(r["mode"] for r in rows):
                sel = {r["path"]: r for r in rows if r["codec"] == codec and r["mode"] == mode}
                if not sel:
                    continue
                picked = [sel.get(p, {"raw_gbps": 0.0}) for p in paths]
                series[f"{codec} {mode}"] = [r["raw_gbps"] for r in picked]
                errs[f"{codec} {mode}"] = _err([r for r in picked if "spread" in r], "raw_gbps") \
                    if all("spread" in r for r in picked) else None
        _bars(ax, paths, series, errs)
        ax.set_ylabel("raw (hot) GB/s, completion included")
        ax.set_title(f"through the KV-cache manager ({rows[0]['device']})")
        ax.legend(fontsize="small")
        _save(fig, directory, "disk_manager.png", out)


def _workload(data: dict, directory: str, out: list[str]) -> None:
    runs = data["runs"]
    names = ["host tier" if r["host_tier"] else "hot only" for r in runs]
    fig, (ax,) = _figure()
    bottom = [0.0] * len(runs)
    for level in ("hot", "host", "disk", "miss"):
        values = [r["hit_rate"][level] for r in runs]
        ax.bar(names, values, bottom=bottom, label=level)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("fraction of lookups")
    ax.set_title("prefix-reuse workload: where each lookup was found")
    ax.legend(fontsize="small")
    _save(fig, directory, "workload_hit_rate.png", out)

    fig, (ax,) = _figure()
    ax.bar(names, [r["pages_moved_per_s"] for r in runs], yerr=_err(runs, "pages_moved_per_s"), capsize=4)
    ax.set_ylabel("pages migrated per second in migrating calls")
    ax.set_title(f"prefix-reuse workload on {data['device']}"
                 + (f", median of {runs[0].get('repeat', 1)} runs" if runs and runs[0].get("repeat", 1) > 1 else ""))
    _save(fig, directory, "workload_pages_per_s.png", out)


PLOTS = {"concat": _concat, "kvcm": _kvcm, "codecs": _codecs, "disk": _disk, "workload": _workload}


def write(data: dict, directory: str, tables: list[str] | None = None) -> list[str]:
    """Draws the plots of ``data`` (a report's JSON form with its ``benchmark`` and ``machine``)
    into ``directory`` (created when missing) and writes ``summary.md`` embedding them with the
    machine record and ``tables`` (plain text). Returns the paths written, the summary last."""
    require_matplotlib()
    kind = data.get("benchmark")
    if kind not in PLOTS:
        raise ValueError(f"no plots for benchmark {kind!r}; known: {', '.join(PLOTS)}")
    os.makedirs(directory, exist_ok=True)
    out: list[str] = []
    if data.get("rows", True):  # a run where nothing ran (every codec skipped) has no plot to draw
        PLOTS[kind](data, directory, out)
    out.append(_summary(data, directory, out, tables or []))
    return out


def _summary(data: dict, directory: str, plots: list[str], tables: list[str]) -> str:
    machine = data.get("machine") or {}
    lines = [f"# kvcodec bench {data.get('command') or data['benchmark']}", ""]
    lines.append(f"Measured {machine.get('time', 'at an unknown time')} on {data.get('device') or machine.get('device')}"
                 + (f" ({machine['gpu']['name']})" if (machine.get("gpu") or {}).get("name") else "") + ".")
    lines += ["", "## Machine", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in describe(machine)]
    options = data.get("options")
    if options:
        lines += ["", "Options: " + ", ".join(f"`{k}={v}`" for k, v in options.items()) + "."]
    if tables:
        lines += ["", "## Report", ""]
        for t in tables:
            lines += ["```text", t, "```", ""]
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            name = os.path.basename(p)
            lines += [f"![{name[:-4].replace('_', ' ')}]({name})", ""]
    path = os.path.join(directory, SUMMARY)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    return path
