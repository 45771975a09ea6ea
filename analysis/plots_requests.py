"""Figures of a server run's requests (experiment ``server``): latency distribution and latency
over time, with the serving tasks' migrations marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harmony.analysis.plots import figure, plain_log_axis, plt, save_figure
from harmony.analysis.thresholds import RQ_WAIT_MIN_NS


@figure
def plot_latency(requests: pd.DataFrame, migrations: pd.DataFrame, t0: int, duration_s: float,
                 path: Path, title: str = "") -> Path:
    """Left: the CDF of the measured requests' latency (log scale; unanswered ones off the right
    edge, counted in the legend), p50/p99/p99.9 marked. Right: each request's latency against its
    arrival (s since t0), red where it met a migration, orange where its servers waited in a run
    queue (RQ_WAIT_MIN_NS or more), grey otherwise; below it, a tick per migration of a serving
    task."""
    fig = plt.figure(figsize=(12, 4.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.6], height_ratios=[1, 0.12], hspace=0.08)
    cdf, over = fig.add_subplot(grid[:, 0]), fig.add_subplot(grid[0, 1])
    rug = fig.add_subplot(grid[1, 1], sharex=over)
    m = requests[requests["measured"]]
    ans = m[m["answered"]]
    lat = np.sort(ans["latency_ns"].to_numpy() / 1e6)
    if len(lat):
        y = np.arange(1, len(lat) + 1) / len(m)
        cdf.step(lat, y, where="post", color="#2c3e50",
                 label=f"{len(lat)} answered, {len(m) - len(lat)} unanswered")
        for q, style in ((50, ":"), (99, "--"), (99.9, "-.")):
            v = np.quantile(lat, q / 100, method="inverted_cdf")
            cdf.axvline(v, color="#c0392b", ls=style, lw=1, label=f"p{q:g} {v:.2f} ms")
        cdf.set_xscale("log")
        plain_log_axis(cdf.xaxis)
        cdf.legend(fontsize=8, loc="lower right")
    else:
        cdf.text(0.5, 0.5, "no request answered", transform=cdf.transAxes, ha="center")
    cdf.set_xlabel("latency (ms, answer - arrival)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_ylim(0, 1.01)
    cdf.set_title("latency CDF")
    waited = ans["wait_ns"] >= RQ_WAIT_MIN_NS
    kinds = [("no migration, no wait", (ans["migrations"] == 0) & ~waited, "#95a5a6", 3),
             ("run-queue wait", (ans["migrations"] == 0) & waited, "#e67e22", 4),
             ("met a migration", ans["migrations"] > 0, "#c0392b", 8)]
    for label, sel, color, size in kinds:
        part = ans[sel]
        if len(part):
            over.scatter(part["t"], part["latency_ns"] / 1e6, s=size, color=color, lw=0,
                         label=f"{label} ({len(part)})", alpha=0.7)
    servers = set(int(p) for s in requests["pids"] for p in s.split(",") if p)
    mig = migrations[migrations["pid"].isin(servers)]
    mig = mig[(mig["t"] >= 0) & (mig["t"] <= duration_s)]
    if len(ans):
        over.set_yscale("log")
        plain_log_axis(over.yaxis)
        over.legend(fontsize=8, loc="upper left", markerscale=2, ncol=3)
    rug.vlines(mig["t"], 0, 1, color="#c0392b", lw=0.5)
    rug.set_yticks([])
    rug.set_ylabel(f"{len(mig)}\nmigr.", rotation=0, ha="right", va="center", fontsize=8)
    over.set_xlim(0, duration_s)
    over.tick_params(labelbottom=False)
    rug.set_xlabel("arrival (s since t0); below: migrations of the serving tasks")
    over.set_ylabel("latency (ms)")
    over.set_title("latency over time")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def df_latency_by_load(runs) -> pd.DataFrame:
    """One row per server run (``harmony.store.Run``s of experiment server): its shape, load, rate
    and latency percentiles (ms; None where unanswered requests reached them), sorted by shape
    and load."""
    rows = []
    for run in runs:
        p, s = run.manifest["params"], run.summary
        rows.append({"shape": p["shape"], "load": float(p["load"]), "rate_rps": s["rate_rps"],
                     **{k: s[k] for k in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
                                          "latency_p999_ms", "service_inversion",
                                          "p99_met_migration", "all_met_migration")}})
    return pd.DataFrame(rows).sort_values(["shape", "load"], ignore_index=True)


#: plot_latency_by_load's percentiles: (column, name, line style, marker)
PERCENTILES = (("latency_p50_ms", "p50", ":", "o"), ("latency_p99_ms", "p99", "-", "s"),
               ("latency_p999_ms", "p99.9", "--", "^"))


def plot_latency_by_load(df: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Latency p50, p99 and p99.9 against the offered load, one colour per shape (``df``:
    :func:`df_latency_by_load`): each run a marker (the percentile's: circle, square,
    triangle), a line (dotted, solid, dashed) through each load's median of the runs (the title
    says so where there are two loads or more); two legends, the shapes' colours and the
    percentiles' markers. A percentile unanswered requests reached is not drawn."""
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8, 4.6))
    colors = dict(zip(sorted(df["shape"].unique()), ["#2c3e50", "#c0392b", "#27ae60", "#8e44ad",
                                                     "#e67e22", "#16a085"]))
    loads = np.sort(df["load"].dropna().unique())
    # the shapes side by side at each load (a 25th of the closest loads' gap between them), so
    # that their points do not hide one another, yet stay at their load (ticked at the loads)
    gap = float(np.diff(loads).min()) if len(loads) > 1 else 0.2
    for k, (shape, g) in enumerate(df.groupby("shape")):
        dodge = (k - (len(colors) - 1) / 2) * gap / 25
        for key, _, style, mark in PERCENTILES:
            y = pd.to_numeric(g[key], errors="coerce")
            ax.scatter(g["load"] + dodge, y, marker=mark, color=colors.get(shape, "0.4"), s=18,
                       zorder=3)
            med = y.groupby(g["load"]).median().dropna()
            ax.plot(med.index + dodge, med.to_numpy(), style, color=colors.get(shape, "0.4"),
                    lw=1.2)
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)
    if len(loads) == 1:         # one load: the points, not a span of 0.04 in four decimals
        ax.set_xlim(loads[0] - gap / 2, loads[0] + gap / 2)
    if len(loads) <= 8:
        ax.set_xticks(loads, [f"{v:g}" for v in loads])
    ax.set_xlabel("offered load (fraction of the capacity measured)")
    ax.set_ylabel("latency (ms)")
    shapes = ax.legend(handles=[Line2D([], [], color=c, marker="s", ls="-", ms=5, label=sh)
                                for sh, c in colors.items()], title="shape", fontsize=8,
                       title_fontsize=8, loc="upper left")
    ax.add_artist(shapes)
    ax.legend(handles=[Line2D([], [], color="0.3", marker=m, ls=st, ms=5, label=name)
                       for _, name, st, m in PERCENTILES], title="percentile", fontsize=8,
              title_fontsize=8, loc="upper right")
    # lines join two loads or more: with one, the title does not promise them
    lines = " (lines: median of the runs at each load)" if len(loads) > 1 else ""
    ax.set_title((title or "latency against load") + lines)
    return save_figure(fig, path)
