"""Proportional speedup and concurrency (thesis 9.2): does a task get P times the CPU on P CPUs,
and on P CPUs what it would get on one with 1/P of the tasks?

One run puts n CPU-bound tasks (default 2P) on the P CPUs of the set, spread over them (task i
starts on CPU i mod P; released warm, the load balancer then keeps or changes that), and captures
first, as companions (:meth:`Experiment.companions`), the two baselines on one CPU of the same
host: ``one``, the same n tasks pinned to the set's first CPU (the speedup's 1-CPU system), and
``share``, the first n/P of them pinned there (the concurrency's; max(1, n // P) of them when P
does not divide n, compared through the GPS shares, which then differ). The one-CPU systems are made
by confining the tasks (the controller's cpuset, as every pinned task is), not by booting one CPU:
the other CPUs stay online and idle.

Measures each task's share of a CPU over the window in the three runs, matched by name, against
the GPS allocation of their weights (nice) on P and on one CPU
(:mod:`harmony.analysis.proportional`): speedup and its ratio to the ideal min(n, P) (for equal
weights), the worst task's, and the same for concurrency. A suite at several CPU counts (or runs
with ``--cpus`` / ``--vm-cpus``) gives the curve over P; the policy card lists the ratios by P.
With n not a multiple of P the GPS shares need the balancer to rotate tasks (an intrinsic
imbalance, E6): a scheduler that keeps affinity is then not proportional.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import proportional as prop
from harmony.core.errors import RunError
from harmony.core.wording import plural
from harmony.experiments.base import (
    Experiment,
    Metric,
    Param,
    nice_value,
    pick,
    positive,
    task_class,
)
from harmony.experiments.single_source import SingleSource
from harmony.workload.tasks import TaskSpec

#: where a run puts its tasks (``-p on=``): the run itself, and its two companions
PLACES = {"set": "released to the whole CPU set",
          "one": "all pinned to the set's first CPU (the speedup's 1-CPU baseline)",
          "share": "the first ntasks/P (at least 1) pinned to the set's first CPU (the "
                   "concurrency baseline)"}


def place_name(v) -> str | None:
    return None if v in PLACES else f"must be one of {', '.join(PLACES)}"


class Proportional(Experiment):
    name = "proportional"
    question = ("Does a task get P times its 1-CPU allocation on P CPUs, and what it gets on one "
                "CPU with 1/P of the tasks?")
    thesis = "9.2 (a) proportional speedup, (b) proportional concurrency"
    workload = frozenset({"nices", "ntasks"})
    params = (
        Param("ntasks", lambda P: 2 * P, "int", "CPU-bound tasks (default 2P)", positive),
        Param("nices", [0], "list", "nice values of the tasks, given in turn (0: equal weights)",
              nice_value),
        Param("on", "set", "str", "where the tasks run: " + "; ".join(f"{k}: {v}" for k, v in
              PLACES.items()) + " (a set run captures one and share itself)", place_name),
    )

    def validate(self, p, cpus):
        if len(cpus) < 2:
            raise ValueError(f"{self.name} compares P CPUs with one: the set has {len(cpus)} CPU")
        if not p["nices"]:
            raise ValueError("nices is empty: give at least one nice value")

    def class_nice(self, p):
        return {None: next((n for n in p["nices"] if n), 0)}

    def tasks(self, p, cpus):
        n, P = p["ntasks"], len(cpus)
        count = max(1, n // P) if p["on"] == "share" else n
        return [TaskSpec(name=f"c{i:02d}", initial_cpu=cpus[0] if p["on"] != "set" else cpus[i % P],
                         pinned=p["on"] != "set", nice=p["nices"][i % len(p["nices"])],
                         **task_class(p)) for i in range(count)]

    def companions(self, p):
        return {} if p["on"] != "set" else {"one": {"on": "one"}, "share": {"on": "share"}}

    summary = (
        *pick(SingleSource.summary, "ntasks", "ncpus"),
        Metric("cpus_used", "count", "CPUs the tasks may use: P for on=set, 1 for the baselines"),
        Metric("share_mean", "fraction", "the tasks' mean share of a CPU over the window"),
        Metric("share_min", "fraction", "the smallest task's share"),
        Metric("ideal_share", "fraction", "their mean GPS share on cpus_used CPUs"),
        Metric("one_cpu_share", "fraction", "their mean share with all of them on one CPU (the "
               "one companion)", none_when="a baseline run, or its companion is missing"),
        Metric("speedup", "ratio", "the tasks' total share on P CPUs over their total on one",
               none_when="no 1-CPU companion, or a task got nothing there"),
        Metric("ideal_speedup", "ratio", "the same of the GPS shares: min(n, P) for equal weights",
               none_when="no 1-CPU companion"),
        Metric("speedup_ratio", "ratio", "speedup / ideal_speedup (1: proportional speedup)",
               none_when="no 1-CPU companion"),
        Metric("speedup_ratio_min", "ratio", "the worst task's own speedup over its ideal one",
               none_when="no 1-CPU companion"),
        Metric("concurrency_tasks", "count", "tasks of the concurrency baseline (n/P on one CPU; "
               "max(1, n // P) when P does not divide n)",
               none_when="no concurrency companion, or a baseline run"),
        Metric("concurrency_ratio", "ratio", "the share of those tasks on P CPUs over theirs on "
               "one CPU with n/P tasks, over the same of the GPS shares "
               "(1: proportional concurrency)",
               none_when="no concurrency companion"),
        Metric("concurrency_ratio_min", "ratio", "the worst of those tasks' own ratio",
               none_when="no concurrency companion"),
        *pick(SingleSource.summary, "migrations"),
    )

    def baselines(self, run) -> dict:
        """The companions' (shares, tasks) by name, for those that exist and are complete."""
        out = {}
        for name in self.companions(run.manifest["params"]):
            try:
                c = run.companion(name)
            except RunError:
                continue
            out[name] = (c.shares, c.tasks)
        return out

    def per_task(self, run):
        m = run.manifest
        base = self.baselines(run)
        used = len(m["cpus"]) if m["params"]["on"] == "set" else 1
        return prop.df_proportional(run.shares, run.tasks, used, base.get("one"),
                                    base.get("share")), used

    def analyse(self, run) -> dict:
        m, p = run.manifest, run.manifest["params"]
        t0, t_end = m["t0_ns"], m["end_ns"]
        df, used = self.per_task(run)
        nums = prop.proportional_numbers(df)
        one = df["share_1"].dropna()
        conc = int(df["share_c"].notna().sum())
        mig = run.migrations[(run.migrations["ts"] >= t0) & (run.migrations["ts"] <= t_end)]
        return {
            "ntasks": int(len(run.tasks)), "ncpus": len(m["cpus"]), "cpus_used": used,
            "share_mean": float(df["share_p"].mean()), "share_min": float(df["share_p"].min()),
            "ideal_share": float(df["ideal_p"].mean()),
            "one_cpu_share": (float(one.mean()) if len(one) == len(df) and p["on"] == "set"
                              else None),
            **{k: nums[k] for k in ("speedup", "ideal_speedup", "speedup_ratio",
                                    "speedup_ratio_min", "concurrency_ratio",
                                    "concurrency_ratio_min")},
            "concurrency_tasks": conc or None,
            "migrations": int(len(mig)),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_proportional import plot_proportional

        df, used = self.per_task(run)
        return [plot_proportional(df, prop.df_ideal_curve(run.tasks, used), used,
                                  fig_dir / "proportional.png",
                                  title=f"Proportional speedup and concurrency: {len(df)} tasks, "
                                        f"{plural(used, 'CPU')}")]

    def describe(self, s: dict) -> list[str]:
        def f(v, fmt="{:.3f}"):
            return "n/a" if v is None else fmt.format(v)

        lines = [f"tasks / CPUs used            {s['ntasks']} / {s['cpus_used']} "
                 f"(of {s['ncpus']})",
                 f"share per task               mean {s['share_mean']:.3f}, "
                 f"min {s['share_min']:.3f} (GPS {s['ideal_share']:.3f})"]
        if s["cpus_used"] > 1:
            lines += [
                f"on one CPU (all tasks)       mean {f(s['one_cpu_share'])}",
                f"speedup                      {f(s['speedup'], '{:.2f}')} of an ideal "
                f"{f(s['ideal_speedup'], '{:.2f}')}: ratio {f(s['speedup_ratio'])}, worst task "
                f"{f(s['speedup_ratio_min'])}",
                "concurrency ratio            " + (
                    "n/a (no n/P-task run)" if s["concurrency_tasks"] is None else
                    f"{f(s['concurrency_ratio'])} against "
                    f"{plural(s['concurrency_tasks'], 'task')} on one CPU, worst task "
                    f"{f(s['concurrency_ratio_min'])}")]
        lines.append(f"migrations                   {s['migrations']}")
        return lines
