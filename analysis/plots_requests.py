"""Figures of a server run's requests (experiment ``server``): latency distribution and latency
over time, with the serving tasks' migrations marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harmony.analysis.plots import plt, save_figure


def plot_latency(requests: pd.DataFrame, migrations: pd.DataFrame, t0: int, duration_s: float,
                 path: Path, title: str = "") -> Path:
    """Left: the CDF of the measured requests' latency (log scale; unanswered ones off the right
    edge, counted in the legend), p50/p99/p99.9 marked. Right: each request's latency against its
    arrival (s since t0), red where it met a migration, orange where its server waited in a run
    queue, grey otherwise; ticks at the top: migrations of the serving tasks."""
    fig, (cdf, over) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
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
        cdf.legend(fontsize=8, loc="lower right")
    else:
        cdf.text(0.5, 0.5, "no request answered", transform=cdf.transAxes, ha="center")
    cdf.set_xlabel("latency (ms, answer - arrival)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_ylim(0, 1.01)
    cdf.set_title("latency CDF")
    kinds = [("no migration, no wait", (ans["migrations"] == 0) & (ans["wait_ns"] == 0), "#95a5a6", 3),
             ("run-queue wait", (ans["migrations"] == 0) & (ans["wait_ns"] > 0), "#e67e22", 4),
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
        top = over.get_ylim()[1]
        over.plot(mig["t"], np.full(len(mig), top), "|", color="#c0392b", ms=10,
                  label=f"server migrations ({len(mig)})")
    over.set_xlim(0, duration_s)
    over.set_xlabel("arrival (s since t0)")
    over.set_ylabel("latency (ms)")
    over.set_title("latency over time")
    if len(ans):
        over.legend(fontsize=8, loc="upper left", markerscale=2)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
