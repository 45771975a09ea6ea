"""E1 single-source (thesis 6.2, figures 6.3-6.5): does it balance, and does it keep affinity?

Default layout: 2P CPU-bound tasks on the first CPU of the set, the others idle (<4,0> on 2 CPUs,
<8,0,0,0> on 4). Measures migrations over time, the time until every run queue is within 15% of
N/P (and stays there), migrations after that (affinity), and each task's share against its fair
share (Jain index).

Released warm by default, as the thesis's tasks were (running on the source before t0; see
:mod:`harmony.experiments.base`): with ``-p release=cold`` they reach t0 asleep, their PELT load
decayed to ~11 % of a running task's (bench/pelt_warmup.py), and a load-based balancer weighs them
as light tasks.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import metrics
from harmony.analysis.thresholds import FAST_BALANCE_MAX_S
from harmony.core.wording import plural
from harmony.experiments.base import (
    Experiment,
    Metric,
    Param,
    nice_value,
    non_negative,
    percent,
    positive,
    task_class,
)
from harmony.workload.tasks import layout_tasks


class SingleSource(Experiment):
    name = "single-source"
    question = "Does it balance, and does it keep affinity?"
    thesis = "6.2, figures 6.3-6.5 (E1)"
    params = (
        Param("layout", lambda P: [2 * P] + [0] * (P - 1), "list",
              "tasks per CPU of the set at t0 (default 2P on the first CPU, others idle)",
              non_negative),
        Param("duty", 100.0, "float", "CPU demand of every task in percent", percent),
        Param("nice", 0, "int", "nice value of every task", nice_value),
        Param("tolerance", 0.15, "float",
              "balanced when every run queue is within this fraction of N/P", positive),
    )

    workload = frozenset({"duty", "nice"})

    def validate(self, p, cpus):
        if len(p["layout"]) > len(cpus):
            raise ValueError(f"layout {','.join(map(str, p['layout']))} has {len(p['layout'])} "
                             f"entries but the CPU set has {len(cpus)} CPUs")
        if sum(p["layout"]) == 0:
            raise ValueError("layout places no task")

    def tasks(self, p, cpus):
        return layout_tasks(p["layout"], cpus, duty=p["duty"], nice=p["nice"], **task_class(p))

    summary = (
        Metric("ntasks", "count", "experiment tasks"),
        Metric("ncpus", "count", "CPUs of the set"),
        Metric("migrations", "count", "migrations in the measured window (from t0 to the end)"),
        Metric("balance_migrations", "count",
               "of those, moves of runnable tasks (the load balancer's)"),
        Metric("time_to_balance_s", "s", "from t0 until every run queue is within tolerance of N/P "
               "and stays there to the end", none_when="not balanced at the end"),
        Metric("first_balanced_s", "s", "from t0 until the run queues were first within tolerance",
               none_when="never balanced"),
        Metric("balance_entries", "count", "times the run queues came within tolerance"),
        Metric("time_to_settle_s", "s", "from t0 until the run queues are within tolerance and "
               "every later loss of balance is restored within FAST_BALANCE_MAX_S (the policy "
               "card's time to balance)", none_when="never balanced, or the run ends in a longer "
               "loss"),
        Metric("excursions", "count", "losses of balance after the first balance"),
        Metric("longest_excursion_s", "s", "the longest of them (0 without any)",
               none_when="never balanced"),
        Metric("balanced_at_end", "bool", "the run queues are within tolerance at the end"),
        Metric("migrations_after_balance", "count", "migrations after time_to_balance_s (affinity)",
               none_when="not balanced at the end"),
        Metric("migrations_after_balance_per_s", "1/s",
               "the same per second of the balanced stretch", none_when="not balanced at the end"),
        Metric("balance_migrations_after_balance", "count",
               "moves of runnable tasks after time_to_balance_s",
               none_when="not balanced at the end"),
        Metric("share_min", "fraction", "smallest CPU share of a task (CPU time / wall time)"),
        Metric("share_max", "fraction", "largest CPU share of a task"),
        Metric("fair_share", "fraction", "a task's fair share of a CPU (median over the tasks)"),
        Metric("share_ratio_min", "ratio", "smallest share over its fair share"),
        Metric("share_ratio_max", "ratio", "largest share over its fair share"),
        Metric("jain_index", "index", "Jain fairness index of the share ratios (1: all equal)"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, t_end = m["t0_ns"], m["end_ns"]
        balance, settled = metrics.balance_times(run.runqueue, run.tasks, cpus, t0, t_end,
                                                 p["tolerance"])
        after = metrics.migrations_after_balance(run.migrations, balance["ts_balance"], t_end)
        # only moves inside the measured window: not the set-up placement before t0
        mig = run.migrations[(run.migrations["ts"] >= t0) & (run.migrations["ts"] <= t_end)]
        shares = run.shares
        ratio = shares["ratio"].to_numpy()
        return {
            "ntasks": int(len(run.tasks)),
            "ncpus": len(cpus),
            "migrations": int(len(mig)),
            "balance_migrations": int((mig["kind"] == "balance").sum()),
            "time_to_balance_s": balance["t_balance"],
            "first_balanced_s": balance["t_first"],
            "balance_entries": balance["n_entries"],
            **settled_summary(settled),
            "balanced_at_end": balance["balanced_at_end"],
            "migrations_after_balance": after["all"],
            "migrations_after_balance_per_s": after["all_per_s"],
            "balance_migrations_after_balance": after["balance"],
            "share_min": float(shares["share"].min()),
            "share_max": float(shares["share"].max()),
            "fair_share": float(shares["fair"].median()),
            "share_ratio_min": float(ratio.min()),
            "share_ratio_max": float(ratio.max()),
            "jain_index": metrics.jain_index(ratio),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots import plot_migrations, plot_runqueue, plot_shares

        m, p, s = run.manifest, run.manifest["params"], run.summary
        dur = m["measured_s"]
        return [
            plot_migrations(run.migrations, dur, p["bin_s"], fig_dir / "migrations.png"),
            plot_runqueue(run.runqueue, m["cpus"], len(run.tasks), dur, fig_dir / "runqueue.png",
                          t_balanced=s["time_to_balance_s"], tolerance=p["tolerance"],
                          t_first_balanced=s.get("first_balanced_s")),
            plot_shares(run.shares, fig_dir / "shares.png"),
        ]

    def describe(self, s: dict) -> list[str]:
        first = s.get("first_balanced_s")
        if s["time_to_balance_s"] is None and first is not None:
            bal = (f"{first * 1000:.1f} ms after t0 first, not for good "
                   f"(entered balance {plural(s['balance_entries'], 'time')})")
        elif s["time_to_balance_s"] is None:
            bal = "never (within the run)"
        elif s["balance_entries"] > 1 and first is not None:
            # balance lost and regained: when it was first reached is the answer to "does it"
            bal = (f"{first * 1000:.1f} ms after t0 first, for good from "
                   f"{s['time_to_balance_s'] * 1000:.1f} ms "
                   f"(entered balance {s['balance_entries']} times)")
        else:
            bal = f"{s['time_to_balance_s'] * 1000:.1f} ms after t0"
        return [
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']}",
            f"migrations                   {s['migrations']} "
            f"({s['balance_migrations']} while runnable)",
            f"balanced within tolerance    {bal}; "
            f"balanced at end: {'yes' if s['balanced_at_end'] else 'no'}",
            *settled_lines(s),
            "migrations after balance     " + (
                f"n/a ({'not balanced for good' if first is not None else 'never balanced'})"
                if s["migrations_after_balance"] is None else
                f"{s['migrations_after_balance']} ({_fmt(s['migrations_after_balance_per_s'])}/s)"),
            f"share per task               {s['share_min']:.3f} .. {s['share_max']:.3f} "
            f"(fair {s['fair_share']:.3f}; "
            f"ratio {s['share_ratio_min']:.2f} .. {s['share_ratio_max']:.2f})",
            f"Jain fairness index          {s['jain_index']:.4f}",
        ]


def _fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def settled_summary(settled: dict) -> dict:
    """The summary keys of :func:`harmony.analysis.metrics.settled_balance`'s result."""
    return {"time_to_settle_s": settled["t_settled"], "excursions": settled["excursions"],
            "longest_excursion_s": settled["longest_excursion_s"]}


def settled_lines(s: dict) -> list[str]:
    """describe()'s line for the settled time (none for a summary made before it was measured)."""
    if "time_to_settle_s" not in s:
        return []
    t = s["time_to_settle_s"]
    when = "never (within the run)" if t is None else f"{t * 1000:.1f} ms after t0"
    lost = (f"; {s['excursions']} after the first balance, the longest "
            f"{s['longest_excursion_s'] * 1000:.0f} ms" if s.get("excursions") else "")
    return [f"{'settled':<29}{when} (losses of balance under {FAST_BALANCE_MAX_S:g} s aside{lost})"]
