"""Figures of one run. Each ``plot_*`` takes the tables it draws and a path, writes a PNG, returns it.

Times on the x axis are seconds since t0 (the release).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_migrations(migrations: pd.DataFrame, duration_s: float, bin_s: float, path: Path,
                    title: str = "Migrations over time") -> Path:
    """Migrations of experiment tasks per time bin, stacked by kind (balance / wakeup)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    edges = np.arange(0.0, duration_s + bin_s, bin_s)
    kinds = [k for k in ("balance", "wakeup") if (migrations["kind"] == k).any()] if len(migrations) else []
    if kinds:
        sns.histplot(data=migrations, x="t", hue="kind", hue_order=kinds, bins=edges, multiple="stack",
                     ax=ax, edgecolor="none", palette={"balance": "#c0392b", "wakeup": "#7f8c8d"})
    else:
        ax.text(0.5, 0.5, "no migrations", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlim(0, duration_s)
    ax.set_xlabel("time since t0 (s)")
    ax.set_ylabel(f"migrations per {bin_s * 1000:g} ms")
    ax.set_title(f"{title} (total {len(migrations)})")
    return _save(fig, path)


def plot_runqueue(runqueue: pd.DataFrame, cpus: list[int], ntasks: int, duration_s: float, path: Path,
                  t_balanced: float | None = None, tolerance: float = 0.15) -> Path:
    """Per-CPU run-queue length of experiment tasks as the exact step function, one panel per CPU."""
    n = len(cpus)
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.2 + 1.1 * n), sharex=True, sharey=True, squeeze=False)
    fair = ntasks / n
    colours = sns.color_palette("colorblind", n)
    top = max(int(runqueue["nr"].max()) if len(runqueue) else 1, int(np.ceil(fair)) + 1)
    for ax, cpu, colour in zip(axes[:, 0], cpus, colours):
        q = runqueue[runqueue["cpu"] == cpu]
        t = np.concatenate([q["t"].to_numpy(), [duration_s]])
        nr = np.concatenate([q["nr"].to_numpy(), q["nr"].to_numpy()[-1:] if len(q) else [0]])
        ax.step(t, nr, where="post", color=colour, lw=1.0)
        ax.fill_between(t, nr, step="post", alpha=0.25, color=colour)
        ax.axhspan(fair * (1 - tolerance), fair * (1 + tolerance), color="0.5", alpha=0.15, lw=0)
        ax.axhline(fair, color="0.3", ls="--", lw=0.8)
        if t_balanced is not None:
            ax.axvline(t_balanced, color="#27ae60", lw=1.0)
        ax.set_ylabel(f"CPU {cpu}")
        ax.set_ylim(0, top + 0.5)
    axes[-1, 0].set_xlim(0, duration_s)
    axes[-1, 0].set_xlabel("time since t0 (s)")
    note = f"; green: balanced within {tolerance:.0%} at {t_balanced:.3f} s" if t_balanced is not None else ""
    axes[0, 0].set_title(f"Run queue per CPU (running + waiting experiment tasks; dashed: N/P = {fair:g}{note})",
                         fontsize=10)
    return _save(fig, path)


def plot_shares(shares: pd.DataFrame, path: Path, title: str = "CPU share per task vs fair share") -> Path:
    """Each task's CPU share over the run (bars) against its fair share (black ticks)."""
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(shares) + 3), 3.6))
    order = shares.sort_values("name")
    hue = "role" if order["role"].nunique() > 1 else None
    sns.barplot(data=order, x="name", y="share", hue=hue, ax=ax, color=None if hue else "#2980b9")
    xs = np.arange(len(order))
    ax.scatter(xs, order["fair"], marker="_", s=600, color="black", zorder=3, label="fair share")
    ax.set_ylim(0, max(1.05, float(order["share"].max()) * 1.1))
    ax.set_xlabel("task")
    ax.set_ylabel("share of one CPU")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.tick_params(axis="x", rotation=90 if len(order) > 12 else 0)
    return _save(fig, path)
