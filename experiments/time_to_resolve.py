"""E3 time-to-resolve (thesis 6.4, figure 6.7): how long until a stable balance?

Same layout as E2 (<base+x, ..., base+x, base>, the last CPU the target). Measures the time from
t0 until every run queue is within ``tolerance`` (15%) of N/P *and stays there* to the end of the
run (:func:`harmony.analysis.metrics.time_to_balance`), the first time it was balanced, how often
balance was entered, and the migrations that it took.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import metrics, rounds
from harmony.core.wording import plural
from harmony.experiments.base import Metric, pick
from harmony.experiments.how_many import HowMany, x_said
from harmony.experiments.single_source import SingleSource, settled_lines, settled_summary


class TimeToResolve(HowMany):
    name = "time-to-resolve"
    question = "How long does it take to reach a balance within 15% of N/P that lasts?"
    thesis = "6.4, figure 6.7 (E3)"

    summary = (
        *pick(HowMany.summary, "x", "ncpus", "ntasks"),
        *pick(SingleSource.summary, "time_to_balance_s", "first_balanced_s", "balance_entries",
              "time_to_settle_s", "excursions", "longest_excursion_s"),
        Metric("balanced_s", "s", "time the run queues were within tolerance, in all"),
        *pick(SingleSource.summary, "balanced_at_end"),
        Metric("migrations", "count", "migrations from t0 on"),
        Metric("balance_migrations", "count",
               "of those, moves of runnable tasks (the load balancer's)"),
        *pick(SingleSource.summary, "migrations_after_balance"),
        Metric("rounds_onto_target", "count", "balancing rounds onto the target"),
        *pick(HowMany.summary, "moved_to_target"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, t_end, target = m["t0_ns"], m["end_ns"], cpus[-1]
        balance, settled = metrics.balance_times(run.runqueue, run.tasks, cpus, t0, t_end,
                                                 p["tolerance"])
        after = metrics.migrations_after_balance(run.migrations, balance["ts_balance"], t_end)
        per_mig = rounds.df_target_rounds(run.migrations, target, p["round_gap_ms"])
        mig = run.migrations[run.migrations["t"] >= 0]
        return {
            "x": p.get("x"), "ncpus": len(cpus), "ntasks": int(len(run.tasks)),
            "time_to_balance_s": balance["t_balance"],
            "first_balanced_s": balance["t_first"],
            "balance_entries": balance["n_entries"],
            **settled_summary(settled),
            "balanced_s": balance["balanced_s"],
            "balanced_at_end": balance["balanced_at_end"],
            "migrations": int(len(mig)),
            "balance_migrations": int((mig["kind"] == "balance").sum()),
            "migrations_after_balance": after["all"],
            "rounds_onto_target": int(per_mig["round"].max()) if len(per_mig) else 0,
            "moved_to_target": int(len(per_mig)),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots import plot_migrations, plot_runqueue
        from harmony.analysis.plots_rounds import plot_time_to_resolve

        m, p, s = run.manifest, run.manifest["params"], run.summary
        dur = m["measured_s"]
        return [
            plot_runqueue(run.runqueue, m["cpus"], len(run.tasks), dur, fig_dir / "runqueue.png",
                          t_balanced=s["time_to_balance_s"], tolerance=p["tolerance"],
                          t_first_balanced=s.get("first_balanced_s")),
            plot_migrations(run.migrations, dur, p["bin_s"], fig_dir / "migrations.png"),
            plot_time_to_resolve(rounds.df_run_summaries([run]), fig_dir / "time_to_resolve.png",
                                 tolerance=p["tolerance"]),
        ]

    def describe(self, s: dict) -> list[str]:
        def ms(v):
            return "never (within the run)" if v is None else f"{v * 1000:.1f} ms after t0"

        return [
            f"x / tasks / CPUs             {x_said(s['x'])} / {s['ntasks']} / {s['ncpus']}",
            f"resolved (balanced for good) {ms(s['time_to_balance_s'])}; "
            f"balanced at end: {'yes' if s['balanced_at_end'] else 'no'}",
            f"first balanced               {ms(s['first_balanced_s'])} "
            f"(entered balance {plural(s['balance_entries'], 'time')}, "
            f"balanced {s['balanced_s']:.2f} s in all)",
            f"migrations                   {s['migrations']} "
            f"({s['balance_migrations']} while runnable; "
            + (f"{s['migrations_after_balance']} after the balance)"
               if s["migrations_after_balance"] is not None else "never balanced)"
               if s["first_balanced_s"] is None else "not balanced for good)"),
            *settled_lines(s),
            f"rounds onto the target       {s['rounds_onto_target']} "
            f"({s['moved_to_target']} tasks)",
        ]
