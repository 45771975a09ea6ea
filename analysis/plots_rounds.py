"""Figures of the balancing-round experiments E2-E5 (thesis figures 6.6, 6.7 and 6.8).

Cross-run figures take the table of :func:`harmony.analysis.rounds.df_run_summaries` (one row per
run, summary keys as columns), so one run gives one point and a sweep gives the thesis's figure.
Single-run figures take the run's tables. Each ``plot_*`` writes a PNG and returns its path.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import ticker

# the shared Agg backend, theme
from harmony.analysis.plots import figure, integer_axis, plain_log_axis, plt, save_figure, sns
from harmony.core.wording import plural

ROUND_PALETTE = "tab10"


def _empty(ax, text):
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


@figure
def plot_first_round(summaries: pd.DataFrame, path: Path) -> Path:
    """Figure 6.6: tasks moved from the first source to the target in the first round, against x.

    Needs columns x, ncpus, first_round_moved, poly_prediction, pairwise_prediction. One panel per
    CPU count; the lines are the median predictions per x (poly-balance: q_src - N/P; pairwise:
    (q_src - q_target)/2). Runs without a round are drawn as crosses at 0.
    """
    df = summaries.copy()
    ncpus = sorted(df["ncpus"].unique()) if len(df) else [0]
    fig, axes = plt.subplots(1, len(ncpus), figsize=(5.5 * len(ncpus), 4), squeeze=False)
    for ax, p in zip(axes[0], ncpus):
        d = df[df["ncpus"] == p]
        if not len(d):
            _empty(ax, "no runs")
            continue
        moved = pd.to_numeric(d["first_round_moved"], errors="coerce")
        ok = moved.notna()
        sns.stripplot(x=d.loc[ok, "x"], y=moved[ok], ax=ax, native_scale=True, jitter=0.15,
                      color="#2c3e50", size=6, alpha=0.8, label="measured (one run each)")
        if (~ok).any():
            ax.scatter(d.loc[~ok, "x"], np.zeros((~ok).sum()), marker="x", color="#c0392b",
                       label="no round onto the target")
        pred = d.groupby("x")[["poly_prediction", "pairwise_prediction"]].median().sort_index()
        # markers of two sizes: equal predictions (2 CPUs) both show, and one x draws no line
        ax.plot(pred.index, pred["poly_prediction"], "-D", ms=10, mfc="none", color="#27ae60",
                label="poly-balance q_src - N/P")
        ax.plot(pred.index, pred["pairwise_prediction"], "--s", ms=5, mfc="none",
                color="#e67e22", label="pairwise (q_src - q_target)/2")
        ax.set_xlabel("x (extra tasks per source CPU)")
        ax.set_ylabel("tasks moved, first source -> target")
        runs = plural(len(d), "run")
        ax.set_title(f"First balancing round, {p} CPUs ({runs})", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        keep = dict(zip(labels, handles))
        ax.legend(keep.values(), keep.keys(), fontsize=8, loc="lower right")
        xs = d["x"].dropna().unique()
        if len(xs) == 1:
            ax.set_xlim(xs[0] - 1, xs[0] + 1)
        integer_axis(ax.xaxis, xs)
        ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        top = np.nanmax(np.r_[moved.to_numpy(float), pred.to_numpy(float).ravel(), 1.0])
        ax.set_ylim(0, top * 1.15 + 0.5)
    return save_figure(fig, path)


@figure
def plot_time_to_resolve(summaries: pd.DataFrame, path: Path, tolerance: float = 0.15) -> Path:
    """Figure 6.7: time until every run queue is within ``tolerance`` of N/P (and stays), against x.

    Needs columns x, ncpus, time_to_balance_s (None/NaN: not resolved within the run, drawn as a
    red cross at the run's duration if a ``p_duration`` column is present, else at the top).
    """
    df = summaries.copy()
    df["t"] = pd.to_numeric(df["time_to_balance_s"], errors="coerce")
    fig, ax = plt.subplots(figsize=(7, 4))
    ok = df["t"].notna()
    if ok.any():
        sns.stripplot(data=df[ok], x="x", y="t", hue="ncpus", native_scale=True, jitter=0.15, ax=ax,
                      palette="colorblind", size=6)
        med = df[ok].groupby(["ncpus", "x"])["t"].median().reset_index()
        for p, g in med.groupby("ncpus"):
            ax.plot(g["x"], g["t"], "-", color="0.4", lw=1)
    if (~ok).any():
        top = df.get("p_duration", pd.Series(dtype=float))
        y = top[~ok] if len(top) else np.full((~ok).sum(), df["t"].max() if ok.any() else 1.0)
        ax.scatter(df.loc[~ok, "x"], y, marker="x", color="#c0392b",
                   label="not resolved in the run")
        ax.legend(fontsize=8)
    if not len(df):
        _empty(ax, "no runs")
    ax.set_xlabel("x (extra tasks per source CPU)")
    ax.set_ylabel("time to resolve (s since t0)")
    ax.set_title(f"Time to resolve: every run queue within {tolerance:.0%} of N/P, for good",
                 fontsize=10)
    ax.set_ylim(bottom=0)
    return save_figure(fig, path)


def df_intervals_long(summaries: pd.DataFrame) -> pd.DataFrame:
    """Detection intervals of many runs, long form: path, ncpus, interval (1..3), ms (NaN = none).

    Needs columns path, ncpus, interval1_ms, interval2_ms, interval3_ms.
    """
    cols = [c for c in ("interval1_ms", "interval2_ms", "interval3_ms") if c in summaries]
    long = summaries.melt(id_vars=["path", "ncpus"], value_vars=cols, var_name="interval",
                          value_name="ms")
    long["interval"] = long["interval"].str.extract(r"(\d)", expand=False).astype("int64")
    long["ms"] = pd.to_numeric(long["ms"], errors="coerce")
    return long


@figure
def plot_detection(summaries: pd.DataFrame, path: Path) -> Path:
    """Figure 6.8 / table 6.1: the three detection intervals of every run (ms, log scale).

    Interval 1: cut -> first migration onto the target; 2: first -> second round; 3: second ->
    third. Each point is one run; the box shows median and quartiles; missing intervals are
    counted in the tick labels.
    """
    long = df_intervals_long(summaries)
    ok = long["ms"].notna()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    if ok.any():
        d = long[ok]
        with warnings.catch_warnings():
            # seaborn 0.13.2 (the newest) still passes vert=, deprecated by matplotlib 3.11
            warnings.filterwarnings("ignore", message=".*vert: bool was deprecated",
                                    category=DeprecationWarning)
            sns.boxplot(data=d, x="interval", y="ms", ax=ax, color="#d6eaf8", fliersize=0,
                        width=0.5)
        sns.stripplot(data=d, x="interval", y="ms", ax=ax, color="#1f618d", size=6, jitter=0.12)
        if (d["ms"] > 0).all():
            ax.set_yscale("log")
            plain_log_axis(ax.yaxis)
    else:
        _empty(ax, "no migration onto the target after the cut")
    labels = []
    for k in (1, 2, 3):
        g = long[long["interval"] == k]
        med = g["ms"].median()
        miss = int(g["ms"].isna().sum())
        labels.append(f"interval {k}\nmedian {med:.1f} ms" + (f"\n{miss} missing" if miss else "")
                      if g["ms"].notna().any() else f"interval {k}\n(none)")
    ax.set_xticks(range(3))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlabel("")
    ax.set_ylabel("ms")
    n = summaries["path"].nunique()
    ax.set_title(f"Imbalance detection ({plural(n, 'run')})", fontsize=10)
    return save_figure(fig, path)


@figure
def plot_rounds_timeline(runqueue: pd.DataFrame, per_migration: pd.DataFrame, cpus, target: int,
                         t_max: float, path: Path, t_min: float = 0.0, marks: dict | None = None,
                         title: str = "Balancing rounds onto the target") -> Path:
    """Run queue of every CPU (steps) and each migration onto the target (ticks, coloured by round).

    ``per_migration`` is :func:`harmony.analysis.rounds.df_target_rounds` output; ``marks`` maps a
    label to a time (s since t0) drawn as a vertical line (e.g. the cut). Window [t_min, t_max].
    """
    cpus = list(cpus)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(9, 5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.2]})
    colours = sns.color_palette("colorblind", len(cpus))
    for cpu, colour in zip(cpus, colours):
        q = runqueue[runqueue["cpu"] == cpu]
        t = np.concatenate([q["t"].to_numpy(), [t_max]])
        nr = np.concatenate([q["nr"].to_numpy(), q["nr"].to_numpy()[-1:] if len(q) else [0]])
        ax.step(t, nr, where="post", color=colour, lw=2.0 if cpu == target else 1.0,
                label=f"CPU {cpu}" + (" (target)" if cpu == target else ""))
    ax.set_ylabel("run queue (tasks)")
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.legend(fontsize=8, ncol=min(4, len(cpus)), loc="upper right")
    ax.set_title(title, fontsize=10)
    m = per_migration[(per_migration["t"] >= t_min) & (per_migration["t"] <= t_max)]
    if len(m):
        pal = sns.color_palette(ROUND_PALETTE, 10)
        for r, g in m.groupby("round"):
            axm.vlines(g["t"], 0, 1, color=pal[(int(r) - 1) % 10], lw=1.5)
            axm.text(g["t"].iloc[0], 1.05, f"{int(r)}: {len(g)}", fontsize=7, rotation=45)
        axm.set_ylim(0, 1.6)
    else:
        _empty(axm, "no migration onto the target in this window")
    axm.set_yticks([])
    axm.set_ylabel("pulls\n(round: n)", fontsize=8)
    for label, t in (marks or {}).items():
        if t is not None:
            for a in (ax, axm):
                a.axvline(t, color="#c0392b", lw=1, ls="--")
            ax.text(t, ax.get_ylim()[1] * 0.95, f" {label}", color="#c0392b", fontsize=8, va="top")
    axm.set_xlim(t_min, t_max)
    axm.set_xlabel("time since t0 (s)")
    return save_figure(fig, path)


@figure
def plot_steal(load: pd.DataFrame, migrations: pd.DataFrame, target: int, steal: dict,
               path: Path, half_window_ms: float = 20.0) -> Path:
    """E4: the target's queue around the moment it went idle, with the migrations onto it.

    ``load`` is :func:`harmony.analysis.rounds.df_target_load` output (nr and effective queue);
    ``steal`` the dict of :func:`harmony.analysis.rounds.steal_latency`. Time axis: ms relative to
    the idle instant.
    """
    fig, ax = plt.subplots(figsize=(8, 3.6))
    t_idle = steal.get("t_idle")
    if t_idle is None:
        _empty(ax, "the target never went idle after its tasks' exit time")
        return save_figure(fig, path)
    lo, hi = t_idle - half_window_ms / 1000, t_idle + half_window_ms / 1000
    d = load[(load["t"] <= hi)]
    before = d[d["t"] < lo]
    d = pd.concat([before.tail(1).assign(t=lo), d[d["t"] >= lo]])
    t = (np.concatenate([d["t"].to_numpy(), [hi]]) - t_idle) * 1000
    for col, style, label in (("nr", dict(color="0.6", lw=1), "rebuilt run queue"),
                              ("effective", dict(color="#2980b9", lw=2), "minus exiting tasks")):
        v = d[col].to_numpy()
        ax.step(t, np.concatenate([v, v[-1:]]), where="post", label=label, **style)
    m = migrations[(migrations["dst_cpu"] == target) & (migrations["t"] >= lo)
                   & (migrations["t"] <= hi)]
    for tm in m["t"]:
        ax.axvline((tm - t_idle) * 1000, color="#c0392b", lw=1)
    ax.axvline(0, color="black", ls="--", lw=1)
    lat = steal.get("latency_s")
    ax.set_title(f"Target CPU {target} going idle (0 ms); red: pulls onto it; "
                 f"steal latency {'none' if lat is None else f'{lat * 1e6:.0f} us'}", fontsize=10)
    ax.set_xlabel("ms since the target went idle")
    ax.set_ylabel("tasks on the target")
    ax.set_xlim(-half_window_ms, half_window_ms)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)
