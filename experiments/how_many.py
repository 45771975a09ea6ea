"""E2 how-many (thesis 6.3, figure 6.6): pairwise balance or poly-balance?

Layout <base+x, ..., base+x, base>: every CPU of the set but the last is a source with x extra
tasks, the last CPU is the single target (thesis: <10+x, 10+x, 10+x, 10>, x = 20..90; on 2 CPUs
<base+x, base>). One run takes one x (``--param x=...``); a sweep over x draws figure 6.6.

Measures the tasks moved from the *first source* (the source of the first migration onto the
target) to the target in the *first balancing round* (a burst of balancing migrations onto the
target, bursts separated by more than ``round_gap_ms``; see :mod:`harmony.analysis.rounds`),
against the poly-balance prediction q_src - N/P (global information: x/P at t0) and the pairwise
prediction (q_src - q_target)/2 (x/2). With P = 2 both predict x/2: E2 separates the two policies
only on 3 CPUs or more.

A round counts the periodic balance's migrations (causes ``periodic`` and ``active``; not the
new-idle pulls, wake-up placements, forks, affinity or NUMA moves: the module docstring of
:mod:`harmony.analysis.rounds` says why). Where the run's causes are unknown (the scheduler's
softirq was not recorded: ``--probe perf``, an imported trace without it) it counts every move of
a runnable task, as before causes were told; ``round_rule`` in the summary says which rule
counted, and the policy card's how-many evidence repeats it.

Released warm by default (the thesis's tasks were running before t0; see
:mod:`harmony.experiments.base`): poly-balance and pairwise predict counts of tasks of equal load,
which a cold release (tasks whose load decayed while they slept at their gate) does not give a
load-based balancer.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import metrics, rounds
from harmony.core.wording import plural
from harmony.experiments.base import (
    Experiment,
    Metric,
    Param,
    non_negative,
    pick,
    positive,
    task_class,
)
from harmony.experiments.single_source import SingleSource
from harmony.workload.tasks import TaskSpec


def source_target_tasks(sources: list[int], target_count: int, cpus: list[int],
                        pin_target: bool = False, sched: dict | None = None,
                        **target_spec) -> list[TaskSpec]:
    """``sources[i]`` CPU-bound tasks on cpus[i] (names w00..), ``target_count`` on cpus[-1]
    (t00..).

    The target's own tasks have role "target"; ``pin_target`` keeps them on the target after t0;
    ``target_spec`` (e.g. stop_after_s) applies to them only; ``sched`` (the scheduling class's
    fields, :func:`~harmony.experiments.base.task_class`) to every task.
    """
    out, k, sched = [], 0, sched or {}
    for cpu, count in zip(cpus[:-1], sources):
        for _ in range(count):
            out.append(TaskSpec(name=f"w{k:02d}", initial_cpu=cpu, **sched))
            k += 1
    out += [TaskSpec(name=f"t{j:02d}", role="target", initial_cpu=cpus[-1], pinned=pin_target,
                     **sched, **target_spec) for j in range(target_count)]
    return out


def causes_known(manifest: dict) -> bool:
    """Whether a run's migration causes tell its balancing pulls apart: its probe recorded the
    scheduler's softirq (the manifest's ``migration_causes``, written by the pipeline's checks;
    absent from runs analysed before causes were told)."""
    return bool((manifest.get("migration_causes") or {}).get("softirq_recorded"))


def check_two_cpus(name: str, cpus: list[int]) -> None:
    if len(cpus) < 2:
        raise ValueError(f"{name} needs at least 2 CPUs (sources and one target); "
                         f"the set has {len(cpus)}")


def x_said(x) -> str:
    """x as a screen says it: "?" where an imported trace's layout did not show it."""
    return "?" if x is None else str(x)


class HowMany(Experiment):
    name = "how-many"
    question = ("Does one balancing move take the global excess (poly-balance) or half the "
                "pair's gap (pairwise)?")
    thesis = "6.3, figure 6.6 (E2)"
    params = (
        Param("x", 10, "int", "extra tasks on each source CPU: layout <base+x, ..., base+x, base> "
              "(the thesis sweeps 20..90)", non_negative),
        Param("base", 10, "int", "tasks on the target CPU, and the base of every source",
              non_negative),
        Param("round_gap_ms", 1.0, "float", "a gap longer than this between two migrations onto "
              "the target starts a new balancing round", positive),
        Param("tolerance", 0.15, "float",
              "balanced when every run queue is within this fraction of N/P", positive),
    )

    def validate(self, p, cpus):
        check_two_cpus(self.name, cpus)
        if p["base"] + p["x"] == 0:
            raise ValueError("base + x is 0: the layout places no task")

    def layout(self, p, cpus) -> list[int]:
        return [p["base"] + p["x"]] * (len(cpus) - 1) + [p["base"]]

    def from_layout(self, placed, cpus):
        """``base``, the tasks on the target (the last CPU), and ``x``, what every source holds
        beyond it: not known unless the sources hold as many tasks each, and not fewer than the
        target."""
        *sources, target = placed
        even = len(set(sources)) == 1 and sources[0] >= target    # one source at least
        return {"base": target, "x": sources[0] - target if even else None}

    def tasks(self, p, cpus):
        return source_target_tasks([p["base"] + p["x"]] * (len(cpus) - 1), p["base"], cpus,
                                   sched=task_class(p))

    summary = (
        Metric("x", "count", "extra tasks on each source CPU (the parameter)",
               none_when="not known: an imported trace whose sources hold unequal counts"),
        *pick(SingleSource.summary, "ncpus", "ntasks"),
        Metric("target_cpu", "cpu", "the target CPU (the last of the set)"),
        Metric("first_round_moved", "count", "tasks the first balancing round onto the target "
               "moved from its first source", none_when="no balancing round onto the target"),
        Metric("first_round_to_target", "count",
               "tasks the first round moved onto the target in all", none_when="no round"),
        Metric("first_round_source", "cpu",
               "the first source: source CPU of the round's first migration",
               none_when="no round"),
        Metric("first_round_sources", "count", "source CPUs the first round moved tasks from",
               none_when="no round"),
        Metric("poly_prediction", "tasks", "poly-balance prediction q_src - N/P (from the layout "
               "at t0 without a round)", none_when="no round, and x not known"),
        Metric("pairwise_prediction", "tasks", "pairwise prediction (q_src - q_target) / 2 (from "
               "the layout at t0 without a round)", none_when="no round, and x not known"),
        Metric("q_src_before", "count", "the first source's run queue just before the round",
               none_when="no round"),
        Metric("q_target_before", "count", "the target's run queue just before the round",
               none_when="no round"),
        Metric("first_round_start_s", "s", "first migration of the first round, after t0",
               none_when="no round"),
        Metric("first_round_end_s", "s", "last migration of the first round, after t0",
               none_when="no round"),
        Metric("rounds", "count", "balancing rounds onto the target"),
        Metric("moved_to_target", "count", "tasks moved onto the target in all rounds"),
        Metric("round_rule", "name", "which migrations the rounds count: \"periodic+active\" (by "
               "cause: harmony.analysis.rounds.ROUND_CAUSES) or \"runnable\" (every move of a "
               "runnable task: the run's causes are unknown, its probe did not record the "
               "scheduler's softirq)"),
        Metric("onto_target_not_counted", "count", "migrations onto the target after t0 that no "
               "round counts (wake-up placements, forks, new-idle pulls, affinity, NUMA; by cause "
               "also the unknown ones)"),
        *pick(SingleSource.summary, "migrations", "balance_migrations", "time_to_balance_s",
              "balanced_at_end"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, t_end, target = m["t0_ns"], m["end_ns"], cpus[-1]
        n, ncpus = int(len(run.tasks)), len(cpus)
        rule = rounds.round_rule(causes_known(m))
        per_mig = rounds.df_target_rounds(run.migrations, target, p["round_gap_ms"],
                                          **rule["select"])
        first = rounds.first_round(per_mig, run.runqueue, target, n, ncpus, t0)
        x = p.get("x")      # an imported trace's layout may not show it
        if first["poly_prediction"] is None and x is not None:  # no round: from the layout
            first.update(rounds.predictions(p["base"] + x, p["base"], n, ncpus))
        balance = metrics.time_to_balance(run.runqueue, run.tasks, cpus, t0, t_end, p["tolerance"])
        # totals over the measured window only, not the set-up placement before t0
        mig = run.migrations[(run.migrations["ts"] >= t0) & (run.migrations["ts"] <= t_end)]
        onto = int(((run.migrations["dst_cpu"] == target) & (run.migrations["t"] >= 0)).sum())
        return {
            "x": x, "ncpus": ncpus, "ntasks": n, "target_cpu": target,
            "first_round_moved": first["moved"],
            "first_round_to_target": first["to_target"],
            "first_round_source": first["source"],
            "first_round_sources": first["sources"],
            "poly_prediction": first["poly_prediction"],
            "pairwise_prediction": first["pairwise_prediction"],
            "q_src_before": first["q_src"], "q_target_before": first["q_target"],
            "first_round_start_s": first["t_start"],
            "first_round_end_s": first["t_end"],
            "rounds": first["rounds"],
            "moved_to_target": int(len(per_mig)),
            "round_rule": rule["rule"],
            "onto_target_not_counted": onto - int(len(per_mig)),
            "migrations": int(len(mig)),
            "balance_migrations": int((mig["kind"] == "balance").sum()),
            "time_to_balance_s": balance["t_balance"],
            "balanced_at_end": balance["balanced_at_end"],
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_rounds import plot_first_round, plot_rounds_timeline

        m, p, s = run.manifest, run.manifest["params"], run.summary
        per_mig = rounds.df_target_rounds(run.migrations, m["cpus"][-1], p["round_gap_ms"],
                                          **rounds.round_rule(causes_known(m))["select"])
        end = s["first_round_end_s"]
        x = p.get("x", "not known")
        t_max = min(m["measured_s"], max(0.25, 4 * end) if end is not None else m["measured_s"])
        return [
            plot_rounds_timeline(run.runqueue, per_mig, m["cpus"], m["cpus"][-1], t_max,
                                 fig_dir / "rounds.png",
                                 title=f"Balancing rounds onto CPU {m['cpus'][-1]} (x = {x})"),
            plot_first_round(rounds.df_run_summaries([run]), fig_dir / "first_round.png"),
        ]

    def describe(self, s: dict) -> list[str]:
        if s["first_round_moved"] is None:
            first = "no balancing round onto the target"
        else:
            first = (f"{s['first_round_moved']} from CPU {s['first_round_source']} "
                     f"({s['first_round_to_target']} onto the target from "
                     f"{plural(s['first_round_sources'], 'source')}), ending "
                     f"{s['first_round_end_s'] * 1000:.1f} ms after t0")
        bal = ("never (within the run)" if s["time_to_balance_s"] is None
               else f"{s['time_to_balance_s'] * 1000:.1f} ms after t0")
        lines = [
            f"x / tasks / CPUs             {x_said(s['x'])} / {s['ntasks']} / {s['ncpus']} "
            f"(target CPU {s['target_cpu']})",
            f"first round moved            {first}",
            "predicted                    " + (
                f"poly-balance {s['poly_prediction']:g}, pairwise {s['pairwise_prediction']:g}"
                if s["poly_prediction"] is not None
                else "nothing: no round, and the layout at t0 shows no x"),
            f"rounds onto the target       {s['rounds']} ({s['moved_to_target']} tasks in all"
            + (f"; {s['onto_target_not_counted']} other moves onto it not counted)"
               if s.get("onto_target_not_counted") is not None else ")"),
            # a summary written before the rule was recorded counted every runnable move
            "rounds count                 "
            + rounds.round_rule(s.get("round_rule", "runnable") != "runnable")["text"],
            f"balanced within tolerance    {bal}; "
            f"balanced at end: {'yes' if s['balanced_at_end'] else 'no'}",
        ]
        if s["ncpus"] == 2:
            lines.append("note                         on 2 CPUs both policies predict x/2: "
                         "E2 needs 3+ CPUs to tell them apart")
        return lines
