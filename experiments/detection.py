"""E5 detection (thesis 6.4, figure 6.8, table 6.1): how often is balance checked when no CPU is
idle?

Layout <n, ..., n, n>, the last CPU the target with its own tasks pinned to it (``pin_target``).
At ``cut_at_s`` after t0 - drawn uniformly from [cut_from_s, cut_to_s] with the run's seed and
recorded in the manifest's params - the target's load is cut to ``target_after`` tasks, not
removed: the other target tasks exit (``cut_mode=exit``) or block for the rest of the run
(``cut_mode=block``). The thesis's <40, 40, 40, 10> is n = 40, target_after = 10.

Measures interval 1 (cut -> first migration onto the target), interval 2 (first -> second
balancing round onto the target) and interval 3 (second -> third round), in ms. A round is a
burst of balance migrations onto the target (see :mod:`harmony.analysis.rounds`): one balancing
pass moves several tasks microseconds apart, so single migrations would make intervals 2-3 zero.
A first interval that varies with the (random) cut time means a periodic check; a fixed one, a
check triggered by an event.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import rounds
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
from harmony.experiments.how_many import HowMany, check_two_cpus, source_target_tasks
from harmony.experiments.work_conservation import (
    NS,
    WorkConservation,
    check_window,
    draw_uniform_time,
)
from harmony.workload.tasks import TaskSpec


class Detection(Experiment):
    name = "detection"
    question = ("How soon is an under-loaded (not idle) CPU noticed, and how often is balance "
                "checked?")
    thesis = "6.4, figure 6.8, table 6.1 (E5)"
    workload = frozenset({"cut_mode", "pin_target", "target_after", "tasks_per_cpu", "cut_from_s",
                          "cut_to_s"})
    import_needs = frozenset({"cut_at_s"})
    params = (
        Param("duration", 4.0, "float", "seconds measured after t0", positive),
        Param("tasks_per_cpu", 8, "int", "CPU-bound tasks on every CPU at t0", positive),
        Param("target_after", 2, "int", "tasks left on the target after the cut (thesis 40 -> 10)",
              non_negative),
        Param("cut_at_s", -1.0, "float", "when the target's load is cut (s after t0); negative: "
              "drawn uniformly from [cut_from_s, cut_to_s] with the run's seed"),
        Param("cut_from_s", 1.0, "float", "earliest drawn cut time (s after t0)", non_negative),
        Param("cut_to_s", 2.0, "float", "latest drawn cut time (s after t0)", non_negative),
        Param("cut_mode", "exit", "str",
              "how the cut tasks leave: exit, or block (sleep to the end)"),
        Param("pin_target", 1, "int", "1: the target's own tasks stay pinned to it; 0: released "
              "like the others", non_negative),
        Param("round_gap_ms", 1.0, "float", "a gap longer than this between two migrations onto "
              "the target starts a new balancing round", positive),
    )

    def validate(self, p, cpus):
        check_two_cpus(self.name, cpus)
        check_window(p, "cut_at_s", "cut_from_s", "cut_to_s")
        if p["cut_mode"] not in ("exit", "block"):
            raise ValueError(f"cut_mode={p['cut_mode']}: choose exit or block")
        if p["target_after"] >= p["tasks_per_cpu"]:
            raise ValueError(f"target_after={p['target_after']} does not cut the target's "
                             f"{p['tasks_per_cpu']} tasks")

    def draw(self, p, cpus, seed):
        if p["cut_at_s"] >= 0:
            return {}
        return {"cut_at_s": draw_uniform_time(seed, p["cut_from_s"], p["cut_to_s"])}

    def tasks(self, p, cpus):
        if p["cut_at_s"] < 0:
            raise ValueError("cut_at_s has not been drawn (call draw() first)")
        n, keep, pin = p["tasks_per_cpu"], p["target_after"], bool(p["pin_target"])
        cut = ({"stop_after_s": p["cut_at_s"]} if p["cut_mode"] == "exit"
               else {"cut_duty_at_s": p["cut_at_s"], "cut_duty": 0.0})
        sched = task_class(p)
        specs = source_target_tasks([n] * (len(cpus) - 1), keep, cpus, pin_target=pin, sched=sched)
        specs += [TaskSpec(name=f"c{j:02d}", role="target", initial_cpu=cpus[-1], pinned=pin, **cut,
                           **sched) for j in range(n - keep)]
        return specs

    def _rounds(self, run):
        m, p = run.manifest, run.manifest["params"]
        return rounds.df_target_rounds(run.migrations, m["cpus"][-1], p["round_gap_ms"],
                                       t_from=p["cut_at_s"])

    summary = (
        *pick(HowMany.summary, "ncpus", "ntasks", "target_cpu"),
        Metric("cut_at_s", "s",
               "when the target's load was cut, after t0 (the parameter, or drawn)"),
        Metric("interval1_ms", "ms", "from the cut to the first migration onto the target",
               none_when="no migration onto the target after the cut"),
        Metric("interval2_ms", "ms", "from the first balancing round onto the target to the second",
               none_when="fewer than two rounds after the cut"),
        Metric("interval3_ms", "ms", "from the second round to the third",
               none_when="fewer than three rounds after the cut"),
        Metric("round1_moved", "count", "tasks the first round after the cut moved onto the target",
               none_when="no round after the cut"),
        Metric("rounds_after_cut", "count", "balancing rounds onto the target after the cut"),
        Metric("moved_after_cut", "count", "tasks moved onto the target after the cut"),
        Metric("pulls_before_cut", "count", "migrations onto the target from t0 to the cut"),
        *pick(WorkConservation.summary, "migrations"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, target = m["t0_ns"], cpus[-1]
        per_mig = self._rounds(run)
        iv = rounds.df_detection_intervals(per_mig, t0 + int(p["cut_at_s"] * NS), t0, n=3)
        onto = run.migrations[(run.migrations["dst_cpu"] == target) & (run.migrations["t"] >= 0)]
        return {
            "ncpus": len(cpus), "ntasks": int(len(run.tasks)), "target_cpu": target,
            "cut_at_s": p["cut_at_s"],
            **rounds.interval_keys(iv),
            "round1_moved": int(iv["moved"].iloc[0]) if len(per_mig) else None,
            "rounds_after_cut": int(per_mig["round"].max()) if len(per_mig) else 0,
            "moved_after_cut": int(len(per_mig)),
            "pulls_before_cut": int((onto["t"] < p["cut_at_s"]).sum()),
            "migrations": int((run.migrations["t"] >= 0).sum()),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_rounds import plot_detection, plot_rounds_timeline

        m, p, s = run.manifest, run.manifest["params"], run.summary
        per_mig = self._rounds(run)
        cut = p["cut_at_s"]
        span = sum(s[f"interval{k}_ms"] or 0.0 for k in (1, 2, 3)) / 1000  # cut to round 3
        t_max = min(m["measured_s"], cut + max(0.3, 1.5 * span))
        # an imported trace does not say how many tasks the cut left (a workload parameter)
        cut_to = f" to {p['target_after']} tasks" if "target_after" in p else ""
        return [
            plot_rounds_timeline(run.runqueue, per_mig, m["cpus"], m["cpus"][-1], t_max,
                                 fig_dir / "detection_timeline.png", t_min=max(0.0, cut - 0.1),
                                 marks={"cut": cut},
                                 title=f"Target CPU {m['cpus'][-1]} cut{cut_to}; rounds "
                                       "after the cut"),
            plot_detection(rounds.df_run_summaries([run]), fig_dir / "intervals.png"),
        ]

    def describe(self, s: dict) -> list[str]:
        def ms(v):
            return "none" if v is None else f"{v:.1f} ms"

        return [
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']} "
            f"(target CPU {s['target_cpu']})",
            f"cut at                       {s['cut_at_s']:.4f} s after t0 (drawn)",
            f"interval 1 (cut -> pull)     {ms(s['interval1_ms'])}"
            + (f", moving {plural(s['round1_moved'], 'task')}" if s["round1_moved"] else ""),
            f"interval 2 (round 1 -> 2)    {ms(s['interval2_ms'])}",
            f"interval 3 (round 2 -> 3)    {ms(s['interval3_ms'])}",
            f"after the cut                {plural(s['rounds_after_cut'], 'round')}, "
            f"{plural(s['moved_after_cut'], 'task')} pulled "
            f"({plural(s['pulls_before_cut'], 'pull')} before the cut)",
        ]
