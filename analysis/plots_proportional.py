"""The proportional experiment's figure: each task's allocation against the CPUs it may use, and
its speedup, beside the GPS ideal (:mod:`harmony.analysis.proportional`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harmony.analysis.plots import figure, save_figure  # noqa: E402
from harmony.core.wording import plural  # noqa: E402

#: how far right of x = P, on the CPU axis, the n/P-task run's points are drawn (beside the P run's)
OFFSET = 0.25


def _dots(ax, x: float, values: np.ndarray, color: str, marker: str, label: str) -> None:
    """One dot per task at ``x``, spread a little sideways so that equal values stay apart."""
    v = values[np.isfinite(values)]
    if not len(v):
        return
    spread = np.linspace(-0.04, 0.04, len(v)) if len(v) > 1 else np.zeros(1)
    ax.scatter(x + spread, v, s=22, color=color, marker=marker, alpha=0.8, label=label, zorder=3)


@figure
def plot_proportional(per_task: pd.DataFrame, curve: pd.DataFrame, ncpus: int, path: Path,
                      title: str = "Proportional speedup and concurrency") -> Path:
    """Left: each task's share of a CPU with all n tasks on one CPU (x = 1) and on the ``ncpus``
    CPUs (x = P), with n/P of them on one CPU beside it, against the GPS share on 1..P CPUs (the
    line). Right: each task's speedup (share on P / share on 1) against the GPS speedup.

    ``per_task`` is :func:`harmony.analysis.proportional.df_proportional`, ``curve``
    :func:`harmony.analysis.proportional.df_ideal_curve`."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    n = len(per_task)
    a.plot(curve["cpus"], curve["share_mean"], color="0.4", ls="--", marker="o", ms=3,
           label="GPS ideal (mean per task)", zorder=2)
    _dots(a, 1.0, per_task["share_1"].to_numpy(), "#2471a3", "o", f"{n} tasks on 1 CPU")
    _dots(a, float(ncpus), per_task["share_p"].to_numpy(), "#c0392b", "o",
          f"{n} tasks on {ncpus} CPUs")
    conc = per_task["share_c"].to_numpy()
    if np.isfinite(conc).any():
        k = int(np.isfinite(conc).sum())
        _dots(a, ncpus + OFFSET, conc, "#27ae60", "^",
              f"{plural(k, 'task')} on 1 CPU (n/P)")
    a.set_xlabel("CPUs the tasks may use (P)")
    a.set_ylabel("CPU share per task (fraction of one CPU)")
    a.set_xticks(curve["cpus"])
    a.set_ylim(0, min(1.05, max(0.05, 1.15 * np.nanmax(np.r_[per_task["share_p"].to_numpy(),
                                                            curve["share_mean"].to_numpy(),
                                                            conc[np.isfinite(conc)]]))))
    a.legend(fontsize=8, loc="upper left")
    a.set_title("allocation vs P")
    b.plot(curve["cpus"], curve["speedup"], color="0.4", ls="--", marker="o", ms=3,
           label="GPS ideal", zorder=2)
    sp = per_task["speedup"].to_numpy()
    if np.isfinite(sp).any():
        b.scatter([1.0], [1.0], s=22, color="#2471a3", zorder=3, label="1 CPU (the baseline)")
        _dots(b, float(ncpus), sp, "#c0392b", "o", f"each task on {ncpus} CPUs")
    else:
        b.text(0.5, 0.5, "no 1-CPU run to compare with", transform=b.transAxes, ha="center")
    b.set_xlabel("CPUs the tasks may use (P)")
    b.set_ylabel("speedup: share on P / share on 1 CPU")
    b.set_xticks(curve["cpus"])
    b.set_ylim(0, 1.15 * np.nanmax(np.r_[curve["speedup"].to_numpy(), sp[np.isfinite(sp)], 1.0]))
    b.legend(fontsize=8, loc="upper left")
    b.set_title("speedup vs P")
    fig.suptitle(title)
    return save_figure(fig, path)
