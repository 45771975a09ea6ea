"""E6 intrinsic-imbalance (thesis 7.1, figures 7.1-7.4): N tasks that P does not divide.

Default layout: P + 1 CPU-bound tasks on the first CPU of the set (<3,0> on 2 CPUs, <5,0,0,0> on
4, as in the thesis), the smallest N > P that P does not divide. A fair policy gives every task
P/N of a CPU (67% on 2 CPUs, 80% on 4), which needs migrations for ever; a policy that prefers
affinity leaves some tasks a whole CPU and others a share of one. Measures each task's share
against P/N (Jain index), migrations per second after ``warmup_s``, and how often the run queues
change (oscillation, thesis fig 7.3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harmony.analysis import metrics, mixed
from harmony.experiments.base import (
    Experiment,
    Metric,
    Param,
    non_negative,
    percent,
    pick,
    task_class,
)
from harmony.experiments.single_source import SingleSource
from harmony.workload.tasks import layout_tasks


class IntrinsicImbalance(Experiment):
    name = "intrinsic-imbalance"
    question = "With N tasks that P CPUs do not divide, fairness or affinity?"
    thesis = "7.1, figures 7.1-7.4 (E6)"
    workload = frozenset({"duty"})
    params = (
        Param("layout", lambda P: [P + 1] + [0] * (P - 1), "list",
              "tasks per CPU of the set at t0 (default P+1 on the first CPU, others idle)",
              non_negative),
        Param("duty", 100.0, "float", "CPU demand of every task in percent", percent),
        Param("warmup_s", 1.0, "float", "migration and oscillation rates count only after this (s)",
              non_negative),
    )

    def validate(self, p, cpus):
        n, ncpu = sum(p["layout"]), len(cpus)
        if len(p["layout"]) > ncpu:
            raise ValueError(f"layout {','.join(map(str, p['layout']))} has {len(p['layout'])} "
                             f"entries but the CPU set has {ncpu} CPUs")
        if n <= ncpu or n % ncpu == 0:
            raise ValueError(f"{n} tasks on {ncpu} CPUs is no intrinsic imbalance: N must exceed P "
                             f"and P must not divide N (e.g. layout {ncpu + 1})")
        if p["warmup_s"] >= p["duration"]:
            raise ValueError(f"warmup_s={p['warmup_s']} leaves nothing of duration={p['duration']}")

    def tasks(self, p, cpus):
        return layout_tasks(p["layout"], cpus, duty=p["duty"], **task_class(p))

    summary = (
        *pick(SingleSource.summary, "ntasks", "ncpus", "fair_share", "share_min", "share_max",
              "share_ratio_min", "share_ratio_max", "jain_index", "migrations"),
        Metric("migrations_after_warmup", "count", "migrations after warmup_s"),
        Metric("migrations_per_s", "1/s", "migrations per second after warmup_s",
               none_when="nothing of the run is after warmup_s"),
        Metric("runqueue_changes_per_s", "1/s", "run-queue changes per second after warmup_s "
               "(oscillation)", none_when="nothing of the run is after warmup_s"),
        Metric("runqueue_variance", "tasks^2", "variance across the CPUs of their run-queue "
               "lengths, time-averaged after warmup_s",
               none_when="nothing of the run is after warmup_s"),
        Metric("warmup_s", "s", "the parameter warmup_s"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, t_end = m["t0_ns"], m["end_ns"]
        after = t0 + int(p["warmup_s"] * 1e9)
        mig = run.migrations
        n_after = int(((mig["ts"] >= after) & (mig["ts"] <= t_end)).sum())
        window = (t_end - after) / 1e9
        rq = run.runqueue
        rq_changes = int(((rq["ts"] > after) & (rq["ts"] < t_end) & rq["cpu"].isin(cpus)).sum())
        var = mixed.df_runqueue_variance(rq, cpus, t0, t_end)
        shares = run.shares
        ratio = shares["ratio"].to_numpy()
        return {
            "ntasks": int(len(run.tasks)),
            "ncpus": len(cpus),
            "fair_share": float(shares["fair"].median()),
            "share_min": float(shares["share"].min()),
            "share_max": float(shares["share"].max()),
            "share_ratio_min": float(np.nanmin(ratio)),
            "share_ratio_max": float(np.nanmax(ratio)),
            "jain_index": metrics.jain_index(ratio),
            "migrations": int(((mig["ts"] >= t0) & (mig["ts"] <= t_end)).sum()),
            "migrations_after_warmup": n_after,
            "migrations_per_s": n_after / window if window > 0 else None,
            "runqueue_changes_per_s": rq_changes / window if window > 0 else None,
            "runqueue_variance": mixed.time_average(var, "variance", t0, p["warmup_s"],
                                                    m["measured_s"]),
            "warmup_s": float(p["warmup_s"]),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis import plots, plots_mixed

        m, p = run.manifest, run.manifest["params"]
        dur = m["measured_s"]
        fair = float(run.shares["fair"].median())
        detail = (min(p["warmup_s"], max(0.0, dur - 1.0)),
                  min(p["warmup_s"], max(0.0, dur - 1.0)) + min(1.0, dur))
        return [
            plots.plot_shares(run.shares, fig_dir / "shares.png",
                              title=f"CPU share per task vs fair share P/N = {fair:.2f}"),
            plots.plot_migrations(run.migrations, dur, p["bin_s"], fig_dir / "migrations.png"),
            plots_mixed.plot_runqueue_detail(run.runqueue, m["cpus"], detail,
                                             fig_dir / "runqueue.png",
                                             fair=len(run.tasks) / len(m["cpus"])),
            plots_mixed.plot_allocation_timeline(run.allocation, fair, dur,
                                                 fig_dir / "allocation.png"),
        ]

    def describe(self, s: dict) -> list[str]:
        return [
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']} "
            f"(fair share P/N = {s['fair_share']:.3f})",
            f"share per task               {s['share_min']:.3f} .. {s['share_max']:.3f} "
            f"(ratio to fair {s['share_ratio_min']:.2f} .. {s['share_ratio_max']:.2f})",
            f"Jain fairness index          {s['jain_index']:.4f}",
            f"migrations                   {s['migrations']} in the run; "
            f"{_f(s['migrations_per_s'])}/s after {s['warmup_s']:g} s",
            f"run-queue changes            {_f(s['runqueue_changes_per_s'])}/s "
            f"after {s['warmup_s']:g} s "
            f"(mean variance across CPUs {_f(s['runqueue_variance'], 3)})",
        ]


def _f(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"
