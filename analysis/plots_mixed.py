"""Figures of the mixed-workload experiments (thesis 7.1-7.15). Each ``plot_*`` takes tables, a
path, writes a PNG and returns the path. Times are seconds since t0 (each run's own t0).

Single run: :func:`plot_runqueue_detail` (fig 7.3), :func:`plot_allocation_timeline` (7.4),
:func:`plot_runqueue_pair` (7.5), :func:`plot_variance_timeline` (7.9), :func:`plot_placement`
(placement of each class per CPU over time, 7.3 E11), :func:`plot_shares_vs_static`,
:func:`plot_class_allocation` (7.12 / 7.15 for one run). Sweeps (tables from
:func:`harmony.analysis.mixed.df_sweep`): :func:`plot_smape_vs_duty` (7.6, 7.11),
:func:`plot_slowdown_vs_duty` (7.12), :func:`plot_priority_sweep` (7.13-7.15).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from harmony.analysis import mixed, plots  # noqa: E402
from harmony.analysis.plots import (HEAT_BINS, MANY_TASKS, fair_norm, figure, heat_height,  # noqa: E402
                                    heat_rows, ranked, runqueue_means, save_figure)

ROLE_COLOURS = {"heavy": "#c0392b", "light": "#2980b9", "high": "#8e44ad", "low": "#16a085",
                "cpu": "#7f8c8d"}
RUN_COLOURS = {"dynamic": "#e67e22", "static ideal": "#34495e"}


def _steps(rq: pd.DataFrame, cpu: int, a: float, b: float):
    """(t, nr) of one CPU's run queue clipped to [a, b] s, ready for ``step(where="post")``."""
    q = rq[rq["cpu"] == cpu]
    t, nr = q["t"].to_numpy(), q["nr"].to_numpy()
    i = max(0, np.searchsorted(t, a, side="right") - 1)
    t, nr = t[i:], nr[i:]
    keep = t < b
    t, nr = np.clip(t[keep], a, b), nr[keep]
    return np.append(t, b), np.append(nr, nr[-1:] if len(nr) else [0])


@figure
def plot_runqueue_detail(runqueue: pd.DataFrame, cpus, window: tuple[float, float], path: Path,
                         title: str = "Run queue per CPU", fair: float | None = None) -> Path:
    """Each CPU's run-queue length (exact step function) over a short window (thesis fig 7.3);
    beyond :data:`~harmony.analysis.plots.MANY_CPUS` CPUs a heat map, a row per CPU, its mean
    length per time bin (white at ``fair``, N/P, if given)."""
    a, b = window
    if len(cpus) > plots.MANY_CPUS:
        grid = runqueue_means(runqueue, list(cpus), a, b, HEAT_BINS)
        fig, ax = plt.subplots(figsize=(9, heat_height(len(cpus))))
        _runqueue_heat(fig, ax, grid, (a, b), list(cpus), fair, max(1.0, float(grid.max())))
        ax.set_title(f"{title}, {a:g}-{b:g} s (runnable experiment tasks), mean per "
                     f"{(b - a) / HEAT_BINS * 1e3:.3g} ms{_fair_note(fair)}", fontsize=10)
        return save_figure(fig, path)
    fig, axes = plt.subplots(len(cpus), 1, figsize=(9, 1.0 + 1.0 * len(cpus)), sharex=True,
                             sharey=True, squeeze=False)
    colours = sns.color_palette("colorblind", len(cpus))
    for ax, cpu, c in zip(axes[:, 0], cpus, colours):
        t, nr = _steps(runqueue, cpu, a, b)
        ax.step(t, nr, where="post", color=c, lw=1.0)
        ax.fill_between(t, nr, step="post", color=c, alpha=0.25)
        ax.set_ylabel(f"CPU {cpu}")
    top = int(runqueue["nr"].max()) if len(runqueue) else 1
    axes[0, 0].set_ylim(0, top + 0.5)
    axes[-1, 0].set_xlim(a, b)
    axes[-1, 0].set_xlabel("time since t0 (s)")
    axes[0, 0].set_title(f"{title}, {a:g}-{b:g} s (runnable experiment tasks)", fontsize=10)
    return save_figure(fig, path)


def _runqueue_heat(fig, ax, grid: np.ndarray, window: tuple[float, float], cpus: list,
                   fair: float | None, top: float) -> None:
    """One run-queue heat map (a row per CPU) on ``ax``, with its colour bar: centred at
    ``fair`` if given, from 0 to ``top``."""
    mesh = heat_rows(ax, grid, np.linspace(*window, grid.shape[1] + 1), cpus, "CPU",
                     "vlag" if fair else "rocket_r", fair_norm(top, fair or 0.0))
    ax.set_xlabel("time since t0 (s)")
    bar = fig.colorbar(mesh, ax=ax, pad=0.015)
    bar.set_label("run-queue length,\nmean per bin")
    if fair:
        bar.ax.axhline(fair, color="black", lw=1)


def _fair_note(fair: float | None) -> str:
    return f";\nwhite: N/P = {fair:g}, red above, blue below" if fair else ""


@figure
def plot_allocation_timeline(allocation: pd.DataFrame, fair: float, duration_s: float,
                             path: Path) -> Path:
    """Each task's share of a CPU per window over the run, one panel per task; dashed: fair (7.4).
    Beyond :data:`~harmony.analysis.plots.MANY_CPUS` tasks a heat map, a row per task, a column
    per window, white at fair."""
    names = sorted(allocation["name"].astype(str).unique())
    if len(names) > plots.MANY_CPUS:
        return _allocation_heat_map(allocation, names, fair, path)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 0.9 + 0.9 * len(names)), sharex=True,
                             sharey=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        g = allocation[allocation["name"].astype(str) == name]
        ax.step(g["t"], g["share"] * 100, where="post", color="#2980b9", lw=1.2)
        ax.axhline(fair * 100, color="0.3", ls="--", lw=0.8)
        ax.set_ylabel(name, rotation=0, labelpad=18)
    axes[0, 0].set_ylim(0, 105)
    axes[-1, 0].set_xlim(0, duration_s)
    axes[-1, 0].set_xlabel("time since t0 (s)")
    axes[0, 0].set_title(f"CPU allocation per task (% of a CPU per window; dashed: fair "
                         f"{fair:.0%})", fontsize=10)
    return save_figure(fig, path)


def _allocation_heat_map(allocation: pd.DataFrame, names: list[str], fair: float,
                         path: Path) -> Path:
    """:func:`plot_allocation_timeline` for many tasks: a row per task (by name), a column per
    window (each its own share, not binned), white at the fair share, red above, blue below."""
    row = np.searchsorted(names, allocation["name"].astype(str).to_numpy())
    window = allocation["window"].to_numpy()
    grid = np.full((len(names), int(window.max()) + 1), np.nan)     # many tasks: never empty
    grid[row, window] = allocation["share"].to_numpy() * 100
    starts = allocation.drop_duplicates("window").sort_values("window")
    t, width = starts["t"].to_numpy(), starts["window_s"].to_numpy()
    edges = np.append(t, t[-1] + width[-1])
    fig, ax = plt.subplots(figsize=(9, heat_height(len(names))))
    mesh = heat_rows(ax, grid, edges, names, "task", "vlag",
                     fair_norm(float(np.nanmax(grid)), fair * 100))
    ax.set_xlabel("time since t0 (s)")
    bar = fig.colorbar(mesh, ax=ax, pad=0.015)
    bar.set_label("% of a CPU in the window")
    bar.ax.axhline(fair * 100, color="black", lw=1)
    ax.set_title(f"CPU allocation per task (% of a CPU per {width[0] * 1e3:.3g} ms window);\n"
                 f"white: fair {fair:.0%}, red above, blue below", fontsize=10)
    return save_figure(fig, path)


@figure
def plot_runqueue_pair(runqueue: pd.DataFrame, static_runqueue: pd.DataFrame, cpus,
                       window: tuple[float, float], path: Path, detail_s: float = 0.5,
                       fair: float | None = None) -> Path:
    """Run queues of the static ideal (top) and the dynamic run (bottom), all CPUs overlaid, over
    ``detail_s`` from the start of ``window`` (thesis fig 7.5); beyond
    :data:`~harmony.analysis.plots.MANY_CPUS` CPUs two heat maps on one colour scale, a row per
    CPU, its mean length per time bin (white at ``fair``, N/P, if given)."""
    a = window[0]
    b = min(window[1], a + detail_s)
    if len(cpus) > plots.MANY_CPUS:
        grids = [runqueue_means(rq, list(cpus), a, b, HEAT_BINS)
                 for rq in (static_runqueue, runqueue)]
        top = max(1.0, *(float(g.max()) for g in grids))
        fig, axes = plt.subplots(2, 1, figsize=(9, 2 * heat_height(len(cpus)) - 1), sharex=True)
        for ax, grid, label in zip(axes, grids, ("static ideal", "dynamic")):
            _runqueue_heat(fig, ax, grid, (a, b), list(cpus), fair, top)
            ax.set_title(label, fontsize=9, loc="left")
        axes[0].set_xlabel("")
        fig.suptitle(f"Run queues, static ideal vs dynamic balance ({a:g}-{b:g} s), mean per "
                     f"{(b - a) / HEAT_BINS * 1e3:.3g} ms{_fair_note(fair)}", fontsize=10)
        return save_figure(fig, path)
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, sharey=True)
    colours = sns.color_palette("colorblind", len(cpus))
    top = 1
    for ax, rq, label in ((axes[0], static_runqueue, "static ideal"),
                          (axes[1], runqueue, "dynamic")):
        for cpu, c in zip(cpus, colours):
            t, nr = _steps(rq, cpu, a, b)
            ax.step(t, nr, where="post", color=c, lw=1.0, label=f"CPU {cpu}")
        top = max(top, int(rq["nr"].max()) if len(rq) else 1)
        ax.set_ylabel(f"{label}\nrun queue")
    axes[0].set_ylim(-0.1, top + 0.5)
    axes[0].legend(loc="upper right", fontsize=8, ncol=min(4, len(cpus)))
    axes[1].set_xlim(a, b)
    axes[1].set_xlabel("time since t0 (s)")
    axes[0].set_title(f"Run queues, static ideal vs dynamic balance ({a:g}-{b:g} s)", fontsize=10)
    return save_figure(fig, path)


@figure
def plot_variance_timeline(variance: pd.DataFrame, static_variance: pd.DataFrame, t0: int,
                           static_t0: int, migrations: pd.DataFrame, duration_s: float,
                           bin_s: float, wins: dict, path: Path) -> Path:
    """Run-queue variance across CPUs (mean per bin) of the dynamic run and of the static ideal,
    migrations as ticks, analysis windows shaded (thesis fig 7.9)."""
    d = mixed.binned_average(variance, "variance", t0, duration_s, bin_s).assign(run="dynamic")
    s = mixed.binned_average(static_variance, "variance", static_t0, duration_s,
                             bin_s).assign(run="static ideal")
    data = pd.concat([d, s], ignore_index=True)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    sns.lineplot(data=data, x="t", y="value", hue="run", palette=RUN_COLOURS,
                 drawstyle="steps-post", ax=ax)
    for name, (a, b) in wins.items():
        ax.axvspan(a, b, color="#f1c40f" if name == "short" else "#95a5a6", alpha=0.15, lw=0)
        ax.text((a + b) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=8)
    after = migrations[migrations["t"] >= 0]
    ax.plot(after["t"], np.zeros(len(after)), "|", color="0.2", ms=10, label="migration")
    ax.set_xlim(0, duration_s)
    ax.set_xlabel("time since t0 (s)")
    ax.set_ylabel(f"variance of run queues\n(mean per {bin_s:g} s)")
    ax.set_title("Run-queue variance across CPUs: dynamic vs static ideal", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)


@figure
def plot_placement(counts: pd.DataFrame, cpus, duration_s: float, path: Path,
                   roles: tuple[str, ...] = ("high", "low")) -> Path:
    """Tasks of each class placed on each CPU over time (stacked steps), one panel per CPU;
    beyond :data:`~harmony.analysis.plots.MANY_CPUS` CPUs a heat map per class, a row per CPU,
    its mean count of the class's tasks per time bin."""
    if len(cpus) > plots.MANY_CPUS:
        return _placement_heat_maps(counts, list(cpus), duration_s, path, roles)
    fig, axes = plt.subplots(len(cpus), 1, figsize=(9, 1.1 + 1.1 * len(cpus)), sharex=True,
                             sharey=True, squeeze=False)
    top = 1
    for ax, cpu in zip(axes[:, 0], cpus):
        sub = counts[counts["cpu"] == cpu]
        base = None
        for role in roles:
            g = sub[sub["role"] == role].sort_values("ts")
            t = np.append(g["t"].to_numpy(), duration_s)
            c = g["count"].to_numpy()
            c = np.append(c, c[-1:] if len(c) else [0])
            lo = np.zeros_like(c) if base is None else base
            ax.fill_between(t, lo, lo + c, step="post", color=ROLE_COLOURS.get(role), alpha=0.7,
                            lw=0, label=role)
            base = lo + c
        if base is not None and len(base):
            top = max(top, int(base.max()))
        ax.set_ylabel(f"CPU {cpu}")
    axes[0, 0].set_ylim(0, top + 0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=len(roles))
    axes[-1, 0].set_xlim(0, duration_s)
    axes[-1, 0].set_xlabel("time since t0 (s)")
    axes[0, 0].set_title(f"Placement of {' / '.join(roles)} tasks per CPU (running, waiting or "
                         "asleep)", fontsize=10)
    return save_figure(fig, path)


def _placement_heat_maps(counts: pd.DataFrame, cpus: list, duration_s: float, path: Path,
                         roles: tuple[str, ...]) -> Path:
    """:func:`plot_placement` for many CPUs: a heat map per role on one colour scale."""
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    # every (segment, cpu, role) has a row (df_class_counts): a matrix segments x CPUs per role
    cpu_of = {c: i for i, c in enumerate(cpus)}
    grids = []
    for role in roles:
        g = counts[(counts["role"] == role) & counts["cpu"].isin(cpus)]
        ts = np.unique(g["t"].to_numpy())
        m = np.zeros((len(ts), len(cpus)))
        m[np.searchsorted(ts, g["t"].to_numpy()), g["cpu"].map(cpu_of).to_numpy()] = g["count"]
        grids.append(plots.step_means(ts, m, duration_s, HEAT_BINS))
    top = max(1.0, *(float(g.max()) for g in grids))
    fig, axes = plt.subplots(len(roles), 1, figsize=(9, len(roles) * heat_height(len(cpus))),
                             sharex=True, squeeze=False)
    edges = np.linspace(0, duration_s, HEAT_BINS + 1)
    for ax, grid, role in zip(axes[:, 0], grids, roles):
        cmap = LinearSegmentedColormap.from_list(role, ["white", ROLE_COLOURS.get(role, "black")])
        mesh = heat_rows(ax, grid, edges, cpus, "CPU", cmap, Normalize(0, top))
        fig.colorbar(mesh, ax=ax, pad=0.015).set_label(f"{role} tasks, mean per bin")
        ax.set_title(role, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time since t0 (s)")
    fig.suptitle(f"Placement of {' / '.join(roles)} tasks per CPU (running, waiting or asleep), "
                 f"mean per {duration_s / HEAT_BINS * 1e3:.3g} ms", fontsize=10)
    return save_figure(fig, path)


@figure
def plot_shares_vs_static(shares: pd.DataFrame, static_shares: pd.DataFrame, path: Path) -> Path:
    """Each task's CPU share over the run in the dynamic run and in the static ideal (bars)."""
    both = pd.concat([shares.assign(run="dynamic"), static_shares.assign(run="static ideal")],
                     ignore_index=True)
    if len(shares) > MANY_TASKS:     # one rank per task, from its static share and its own
        # the static ideal is another run (its own pids) of the same tasks: matched by name
        order = ranked(shares.merge(static_shares[["name", "share"]], on="name",
                                    suffixes=("", "_static")), ["role", "share_static", "share"])
        both = both.merge(order[["name", "rank"]], on="name")
        fig, ax = plt.subplots(figsize=(9, 3.8))
        sns.scatterplot(data=both, x="rank", y="share", hue="run", style="role", s=12,
                        linewidth=0, palette=RUN_COLOURS, ax=ax)
        ax.set_xlabel(f"task ({len(shares)}, ranked by static ideal share within its role)")
        top = 1.15 * float(max(both["share"].max(), 1e-3))     # small shares: not scaled to 1
    else:
        both["task"] = both["name"].astype(str) + "\n" + both["role"].astype(str)
        fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(shares) + 3), 3.8))
        both = both.sort_values(["role", "name"])
        sns.barplot(data=both, x="task", y="share", hue="run", palette=RUN_COLOURS, ax=ax)
        ax.set_xlabel("task")
        plots.fit_category_labels(ax, list(both["task"].drop_duplicates()))
        top = 1.05
    ax.set_ylim(0, top)
    ax.set_ylabel("share of one CPU (whole run)")
    ax.set_title("CPU share per task: dynamic balance vs static ideal", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)


@figure
def plot_class_allocation(allocation: pd.DataFrame, static_allocation: pd.DataFrame,
                          path: Path) -> Path:
    """Mean share per task of each class in each window, dynamic vs static ideal, annotated with
    the ratio (thesis figs 7.12, 7.15 for one run)."""
    both = pd.concat([allocation.assign(run="dynamic"),
                      static_allocation.assign(run="static ideal")], ignore_index=True)
    both["class / window"] = both["role"] + " / " + both["window"]
    order = sorted(both["class / window"].unique())
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    sns.barplot(data=both, x="class / window", y="share", hue="run", order=order,
                palette=RUN_COLOURS, ax=ax)
    for i, key in enumerate(order):
        role, window = key.split(" / ")
        r = mixed.allocation_ratio(allocation, static_allocation, role, window)
        if r is not None:
            top = float(both.loc[both["class / window"] == key, "share"].max())
            ax.text(i, top + 0.02, f"{r:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.12)
    ax.set_xlabel("")
    ax.set_ylabel("mean share of a CPU per task")
    ax.set_title("Allocation per class vs static ideal (label: dynamic / static)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------- sweeps


def _long(sweep: pd.DataFrame, x: str, cols: dict[str, str]) -> pd.DataFrame:
    parts = [pd.DataFrame({x: sweep[x], "value": sweep[c], "metric": label})
             for c, label in cols.items() if c in sweep]
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"])


def plot_smape_vs_duty(sweep: pd.DataFrame, path: Path) -> Path:
    """SMAPE of run-queue variance against the static ideal vs the light tasks' duty, short and
    long window; one point per run, line = median (thesis figs 7.6, 7.11)."""
    data = _long(sweep, "light_duty", {"smape_short": "short (E9)", "smape_long": "long (E7)"})
    fig, ax = plt.subplots(figsize=(8, 3.8))
    sns.stripplot(data=data, x="light_duty", y="value", hue="metric", jitter=False, alpha=0.5,
                  ax=ax, native_scale=True, legend=False)
    sns.lineplot(data=data, x="light_duty", y="value", hue="metric", estimator="median",
                 errorbar=None, marker="o", ax=ax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("light task CPU demand (%)")
    ax.set_ylabel("SMAPE of run-queue variance\n(0 = matches static ideal)")
    ax.set_title("Run queue match with the static ideal", fontsize=10)
    return save_figure(fig, path)


def plot_slowdown_vs_duty(sweep: pd.DataFrame, path: Path) -> Path:
    """Heavy tasks' allocation / static ideal vs light duty, short and long window (fig 7.12)."""
    data = _long(sweep, "light_duty",
                 {"heavy_slowdown_short": "short", "heavy_slowdown_long": "long"})
    fig, ax = plt.subplots(figsize=(8, 3.8))
    sns.lineplot(data=data, x="light_duty", y="value", hue="metric", estimator="median",
                 errorbar=None, marker="o", ax=ax)
    ax.axhline(1.0, color="0.3", ls="--", lw=0.8)
    ax.set_xlabel("light task CPU demand (%)")
    ax.set_ylabel("heavy allocation / static ideal")
    ax.set_title("CPU allocation of the heavy tasks relative to the static ideal", fontsize=10)
    return save_figure(fig, path)


def plot_priority_sweep(sweep: pd.DataFrame, path: Path) -> Path:
    """Against the nice difference: spread index of high and low tasks, high tasks' allocation /
    static ideal (fig 7.15), migrations per CPU-second by class (fig 7.13)."""
    x = "nice_diff"
    panels = [
        ({"high_spread_index": "high", "low_cluster_index": "low"},
         "spread index\n(0 even, 1 one CPU)"),
        ({"high_allocation_ratio_short": "short", "high_allocation_ratio_long": "long"},
         "high allocation\n/ static ideal"),
        ({"high_migrations_per_cpu_s": "high", "low_migrations_per_cpu_s": "low"},
         "migrations per\nCPU-second"),
    ]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for ax, (cols, ylabel) in zip(axes, panels):
        data = _long(sweep, x, cols)
        sns.lineplot(data=data, x=x, y="value", hue="metric", estimator="median", errorbar=None,
                     marker="o", ax=ax)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, loc="best")
    axes[1].axhline(1.0, color="0.3", ls="--", lw=0.8)
    axes[-1].set_xlabel("nice difference (low - high)")
    axes[0].set_title("Priority classes vs nice difference", fontsize=10)
    return save_figure(fig, path)


def sweep_figures(run_dirs, fig_dir: Path) -> list[Path]:
    """Load the runs of a sweep (heavy-light over light_duty and/or priority-classes over
    nice_diff) and draw the sweep figures into ``fig_dir``; returns their paths."""
    from harmony.store import open_run

    sweep = mixed.df_sweep([open_run(d) for d in run_dirs])
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    hl = sweep[sweep["experiment"] == "heavy-light"]
    if len(hl):
        out += [plot_smape_vs_duty(hl, fig_dir / "smape_vs_duty.png"),
                plot_slowdown_vs_duty(hl, fig_dir / "slowdown_vs_duty.png")]
    pc = sweep[sweep["experiment"] == "priority-classes"]
    if len(pc):
        out.append(plot_priority_sweep(pc, fig_dir / "priority_sweep.png"))
    return out
