"""Figures of a run by the machine's levels: where tasks sit on the machine over time.

Times on the x axis are seconds since t0 (the release).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harmony.analysis.levels import df_move_levels, df_queue_means, relation_table  # noqa: E402
from harmony.analysis.plots import figure, save_figure  # noqa: E402
from harmony.analysis.topology import df_cpus  # noqa: E402

#: time bins of the placement map
SPREAD_BINS = 200
#: the colour of each relation's first-arrival mark, nearest first
RELATION_COLOURS = {"smt": "#0173b2", "llc": "#029e73", "package": "#de8f05",
                    "node": "#cc78bc", "remote": "#d55e00"}


def machine_order(manifest: dict, cpus: list[int]) -> pd.DataFrame:
    """The set's CPUs ordered by node, package, LLC, core and CPU: cpu, node, package, llc,
    core, and the row's boundary above it ("node", "llc", "core" or "": where a thicker line
    is drawn)."""
    table = df_cpus(manifest)
    table = table[table["cpu"].isin(cpus)].copy()
    for col in ("node", "package", "llc", "core"):
        table[col] = table[col].fillna(-1)
    table = table.sort_values(["node", "package", "llc", "core", "cpu"], kind="stable")
    edge, prev = [], None
    for r in table.itertuples():
        if prev is None:
            edge.append("")
        elif r.node != prev.node:
            edge.append("node")
        elif r.llc != prev.llc or r.package != prev.package:
            edge.append("llc")
        elif r.core != prev.core:
            edge.append("core")
        else:
            edge.append("")
        prev = r
    table["edge"] = edge
    return table.reset_index(drop=True)


@figure
def plot_spread(runqueue: pd.DataFrame, manifest: dict, migrations: pd.DataFrame,
                path: Path) -> Path:
    """The placement map: one row per CPU of the set, ordered by node, LLC and core (thick lines
    between nodes, thin between LLCs, dotted between cores), each cell its mean of experiment
    tasks over a time bin; the first arrival at each relation to the source CPU marked above."""
    cpus = manifest["cpus"]
    t0, t_end = manifest["t0_ns"], manifest["end_ns"]
    duration = (t_end - t0) / 1e9
    moved = migrations[migrations["t"] >= 0]["t"] if len(migrations) else pd.Series([], float)
    # the moves' part of the run, and a margin: the placement after the last move is the end's
    shown = min(duration, max(0.25, 1.5 * float(moved.max()))) if len(moved) else duration
    if (manifest.get("topology") or {}).get("cpus"):
        order = machine_order(manifest, cpus)
    else:
        order = pd.DataFrame({"cpu": sorted(cpus), "edge": [""] * len(cpus)})
    edges = np.linspace(t0, t0 + int(shown * 1e9), SPREAD_BINS + 1).astype(np.int64)
    grid = np.zeros((len(order), SPREAD_BINS))
    for j in range(SPREAD_BINS):
        means = df_queue_means(runqueue, list(order["cpu"]), int(edges[j]), int(edges[j + 1]))
        grid[:, j] = means.to_numpy()
    with plt.rc_context({"axes.grid": False}):
        fig, ax = plt.subplots(figsize=(9, 1.8 + 0.22 * len(order)))
    top = max(1.0, float(grid.max()))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0,
                   vmax=top, extent=(0, shown, len(order) - 0.5, -0.5))
    ax.grid(False)
    styles = {"node": ("white", 2.2, "-"), "llc": ("white", 1.2, "-"),
              "core": ("white", 0.6, ":")}
    for k, edge in enumerate(order["edge"]):
        if edge:
            colour, lw, ls = styles[edge]
            ax.axhline(k - 0.5, color=colour, lw=lw, ls=ls)
    ax.set_yticks(range(len(order)), [f"CPU {c}" for c in order["cpu"]],
                  fontsize=7 if len(order) > 16 else 9)
    src = cpus[0]
    marks = []
    if len(migrations) and (manifest.get("topology") or {}).get("cpus"):
        moves = df_move_levels(migrations, manifest)
        rels = relation_table(cpus, manifest)
        seen = {}
        for r in moves.sort_values("t").itertuples():
            rel = rels.get((src, r.dst_cpu), "same")
            if rel not in seen and rel != "same":
                seen[rel] = r.t
        for rel, t in seen.items():
            colour = RELATION_COLOURS.get(rel, "k")
            ax.axvline(t, color=colour, lw=1.2, ls="--")
            marks.append(f"{rel} {t * 1000:.0f} ms")
    ax.set_xlabel("time since t0 (s)" + ("" if shown >= duration else
                                         f"; the run goes on to {duration:g} s, no move after"))
    ax.set_xlim(0, shown)
    fig.colorbar(im, ax=ax, pad=0.01, label="tasks (mean per bin)")
    title = (f"Where the tasks released on CPU {src} went (rows: CPUs by node, LLC, core)")
    if marks:
        title += "\ndashed: first arrival at each relation to the source: " + ", ".join(marks)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def df_level_runs(evidence: list) -> pd.DataFrame:
    """The placed runs' numbers the per-level figure draws, one row per run: level, experiment,
    interval1_ms (detection), time_to_settle_s (time-to-resolve), steal_latency_ms
    (work-conservation), period_ms (the detection period predicted for its level; NaN where
    none)."""
    import re

    rows = []
    for e in evidence:
        level = (e.params or {}).get("level") or ""
        if not level:
            continue
        s = e.summary
        period = float("nan")
        for r in (s.get("predictions") or {}).get("rows", []):
            m = re.search(r"within ([0-9.]+) ms", r.get("predicted") or "")
            if r.get("check") == "detection period" and m:
                period = float(m.group(1))
        steal = s.get("steal_latency_s")
        rows.append({"level": level, "experiment": e.experiment,
                     "interval1_ms": s.get("interval1_ms") if e.experiment == "detection"
                     else None,
                     "time_to_settle_s": s.get("time_to_settle_s")
                     if e.experiment == "time-to-resolve" else None,
                     "steal_latency_ms": None if steal is None or e.experiment !=
                     "work-conservation" else steal * 1000, "period_ms": period})
    return pd.DataFrame(rows, columns=["level", "experiment", "interval1_ms", "time_to_settle_s",
                                       "steal_latency_ms", "period_ms"])


#: the experiment each panel of plot_levels reads
EXPERIMENT_OF = {"interval1_ms": "detection", "time_to_settle_s": "time-to-resolve",
                 "steal_latency_ms": "work-conservation"}


def plot_levels(df: pd.DataFrame, path: Path) -> Path | None:
    """The questions of distance at each level, one panel each (detection's first check after
    the cut, with the period the kernel's parameters predict as a bar; the time to a stable
    balance; the idle target's first pull), every run a point, levels nearest first. None
    when no run was placed at a level."""
    from harmony.analysis.topology import RELATIONS

    panels = [("interval1_ms", "detection: cut to first pull (ms)"),
              ("time_to_settle_s", "time to a stable balance (s)"),
              ("steal_latency_ms", "idle target to first pull (ms)")]
    panels = [(c, t) for c, t in panels if c in df and pd.to_numeric(df[c]).notna().any()]
    if df.empty or not panels:
        return None
    levels = [lv for lv in RELATIONS if lv in set(df["level"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (col, title) in zip(axes[0], panels):
        for k, lv in enumerate(levels):
            mine = df[(df["level"] == lv) & (df["experiment"] == EXPERIMENT_OF[col])]
            v = pd.to_numeric(mine[col]).dropna().to_numpy(float)
            missing = len(mine) - len(v)
            if missing:            # a run that never got there: said below its level
                ax.text(k, 0, f"{missing} never", ha="center", va="bottom", fontsize=7,
                        color="#c0392b")
            if len(v):
                jitter = (np.arange(len(v)) - (len(v) - 1) / 2) * 0.06
                ax.plot(k + jitter, v, "o", color=RELATION_COLOURS.get(lv, "k"), ms=5,
                        alpha=0.8)
                ax.hlines(np.median(v), k - 0.3, k + 0.3, color="#c0392b", lw=2)
            if col == "interval1_ms":
                p = pd.to_numeric(df[df["level"] == lv]["period_ms"]).dropna()
                if len(p):
                    ax.hlines(float(p.median()), k - 0.35, k + 0.35, color="0.3", lw=1.2,
                              ls="--")
        ax.set_xticks(range(len(levels)), levels)
        ax.set_xlim(-0.6, len(levels) - 0.4)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
    # wrapped to the figure's width (one panel is 4.2 in: ~60 characters at 9 pt), never cut
    fig.suptitle(textwrap.fill("By level (red: median of the runs; dashed: the period predicted "
                               "from the kernel's domains)", int(fig.get_figwidth() * 14)),
                 fontsize=9)
    return save_figure(fig, path)
