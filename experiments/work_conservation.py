"""E4 work-conservation (thesis 6.4): does a CPU that goes idle steal waiting work at once?

Layout <n, ..., n, n>: every CPU of the set holds ``tasks_per_cpu`` CPU-bound tasks; the last
CPU is the target, whose own tasks are pinned to it (``pin_target``) and all exit at
``idle_at_s`` after t0, a time drawn uniformly from [idle_from_s, idle_to_s] with the run's seed
(recorded in the manifest's params; ``--param idle_at_s=...`` replays it). The target then has
nothing to run while every source has n tasks waiting (thesis <40, 40, 40, 0>).

Measures the delay from the target going idle (its queue, less tasks already exiting, reaches 0;
see :func:`harmony.analysis.rounds.df_target_load`) to the first task pulled onto it, and to the
first run of such a task there (:func:`harmony.analysis.rounds.steal_latency`).
"""

from __future__ import annotations

import random
from pathlib import Path

from harmony.analysis import rounds
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

NS = 1_000_000_000


def draw_uniform_time(seed: int, lo: float, hi: float) -> float:
    """A time in [lo, hi] (s, rounded to 1 us) drawn from ``seed``: same seed, same time."""
    return round(random.Random(int(seed)).uniform(lo, hi), 6)


def check_window(p: dict, at: str, lo: str, hi: str) -> None:
    """Cross-checks of a random-time window against the run's duration (ValueError, one line)."""
    if p[lo] > p[hi]:
        raise ValueError(f"{lo}={p[lo]} is after {hi}={p[hi]}")
    last = p[at] if p[at] >= 0 else p[hi]
    if last >= p["duration"]:
        raise ValueError(f"{at if p[at] >= 0 else hi}={last} s is not before the end of the run "
                         f"(duration={p['duration']} s)")


class WorkConservation(Experiment):
    name = "work-conservation"
    question = "Does a CPU that goes idle steal waiting tasks at once (work-conserving)?"
    thesis = "6.4 (E4)"
    workload = frozenset({"pin_target", "tasks_per_cpu", "idle_from_s", "idle_to_s"})
    import_needs = frozenset({"idle_at_s"})
    params = (
        Param("duration", 4.0, "float", "seconds measured after t0", positive),
        Param("tasks_per_cpu", 4, "int",
              "CPU-bound tasks on every CPU at t0 (the target's exit later)", positive),
        Param("idle_at_s", -1.0, "float", "when the target's tasks exit (s after t0); negative: "
              "drawn uniformly from [idle_from_s, idle_to_s] with the run's seed"),
        Param("idle_from_s", 1.0, "float", "earliest drawn exit time (s after t0)", non_negative),
        Param("idle_to_s", 2.5, "float", "latest drawn exit time (s after t0)", non_negative),
        Param("pin_target", 1, "int", "1: the target's own tasks stay pinned to it until they exit "
              "(so the target, not a source, loses them); 0: released like the others",
              non_negative),
    )

    def validate(self, p, cpus):
        check_two_cpus(self.name, cpus)
        check_window(p, "idle_at_s", "idle_from_s", "idle_to_s")

    def draw(self, p, cpus, seed):
        if p["idle_at_s"] >= 0:
            return {}
        return {"idle_at_s": draw_uniform_time(seed, p["idle_from_s"], p["idle_to_s"])}

    def from_layout(self, placed, cpus):
        """``tasks_per_cpu``: what every CPU holds at t0, when they hold as many."""
        return {"tasks_per_cpu": placed[0] if placed[0] and len(set(placed)) == 1 else None}

    def tasks(self, p, cpus):
        if p["idle_at_s"] < 0:
            raise ValueError("idle_at_s has not been drawn (call draw() first)")
        n = p["tasks_per_cpu"]
        return source_target_tasks([n] * (len(cpus) - 1), n, cpus, pin_target=bool(p["pin_target"]),
                                   sched=task_class(p), stop_after_s=p["idle_at_s"])

    summary = (
        *pick(HowMany.summary, "ncpus", "ntasks", "target_cpu"),
        Metric("idle_at_s", "s",
               "when the target's tasks exit, after t0 (the parameter, or drawn)"),
        Metric("target_idle_at_s", "s", "when the target's queue, less tasks already exiting, "
               "reached 0, after t0",
               none_when="the target never went idle (a task was pulled onto it first)"),
        Metric("steal_latency_s", "s", "from the target CPU going idle (switching to its idle "
               "task) to the first pull onto it; 0 if the pull came first",
               none_when="nothing was pulled"),
        Metric("queue_empty_to_pull_s", "s", "from the target's queue emptying to the first pull",
               none_when="nothing was pulled"),
        Metric("cpu_idle_at_s", "s", "when the target CPU switched to its idle task before the "
               "pull, after t0", none_when="it did not before the pull, or nothing was pulled"),
        Metric("stolen", "bool", "a task was pulled onto the target once it went idle",
               none_when="the target never went idle"),
        Metric("first_pull_at_s", "s", "the first pull onto the idle target, after t0",
               none_when="nothing was pulled"),
        Metric("first_pull_src_cpu", "cpu", "the CPU the first pull came from",
               none_when="nothing was pulled"),
        Metric("first_pull_kind", "name", "the first pull's migration kind (balance, wakeup...)",
               none_when="nothing was pulled"),
        Metric("first_run_latency_s", "s", "from the target going idle to the first run there of "
               "a task from another CPU", none_when="no such run"),
        Metric("idle_before_pull_s", "s",
               "of the time to the pull, what the target spent in its idle task",
               none_when="nothing was pulled"),
        Metric("other_before_pull_s", "s", "of the time to the pull, what the target spent "
               "running tasks outside the experiment", none_when="nothing was pulled"),
        Metric("pulls_before_idle", "count",
               "migrations onto the target from t0 until it went idle"),
        Metric("pulls_after_idle", "count", "migrations onto the target after it went idle"),
        Metric("migrations", "count", "migrations from t0 on"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        t0, target = m["t0_ns"], cpus[-1]
        ts_from = t0 + int(p["idle_at_s"] * NS)
        load = rounds.df_target_load(run.runqueue, run.events, run.tasks, target, t0,
                                     m["end_ns"])
        st = rounds.steal_latency(load, run.migrations, run.runs, run.tasks, target, t0, ts_from,
                                  run.events)
        onto = run.migrations[(run.migrations["dst_cpu"] == target) & (run.migrations["t"] >= 0)]
        before = int((onto["ts"] < (st["ts_idle"] if st["ts_idle"] is not None else ts_from)).sum())
        return {
            "ncpus": len(cpus), "ntasks": int(len(run.tasks)), "target_cpu": target,
            "idle_at_s": p["idle_at_s"],
            "target_idle_at_s": st["t_idle"],
            # the CPU idle (switched to its idle task) -> first pull: work conservation proper
            "steal_latency_s": st["idle_latency_s"],
            "queue_empty_to_pull_s": st["latency_s"],
            "cpu_idle_at_s": None if st["ts_cpu_idle"] is None else (st["ts_cpu_idle"] - t0) / NS,
            "stolen": st["stolen"],
            "first_pull_at_s": st["t_pull"],
            "first_pull_src_cpu": st["pull_src_cpu"],
            "first_pull_kind": st["pull_kind"],
            "first_run_latency_s": st["first_run_latency_s"],
            "idle_before_pull_s": st["idle_s"],
            "other_before_pull_s": st["other_s"],
            "pulls_before_idle": before,
            "pulls_after_idle": int(len(onto)) - before,
            "migrations": int((run.migrations["t"] >= 0).sum()),
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_rounds import plot_rounds_timeline, plot_steal

        m, s = run.manifest, run.summary
        cpus, target, t0 = m["cpus"], m["cpus"][-1], m["t0_ns"]
        load = rounds.df_target_load(run.runqueue, run.events, run.tasks, target, t0,
                                     m["end_ns"])
        st = rounds.steal_latency(load, run.migrations, run.runs, run.tasks, target, t0,
                                  t0 + int(m["params"]["idle_at_s"] * NS), run.events)
        per_mig = rounds.df_target_rounds(run.migrations, target, 1.0, kinds=("balance", "wakeup"))
        return [
            plot_steal(load, run.migrations, target, st, fig_dir / "steal.png"),
            plot_rounds_timeline(run.runqueue, per_mig, cpus, target, m["measured_s"],
                                 fig_dir / "timeline.png",
                                 marks={"target's tasks exit": s["idle_at_s"]},
                                 title=f"Run queues; pulls onto target CPU {target}"),
        ]

    def describe(self, s: dict) -> list[str]:
        def us(v):
            return "n/a" if v is None else f"{v * 1e6:.0f} us"

        idle = ("never went idle (a task had been pulled onto it before its own tasks exited)"
                if s["target_idle_at_s"] is None else f"{s['target_idle_at_s']:.4f} s after t0")
        pull = ("nothing pulled" if not s["stolen"] else
                f"{us(s.get('queue_empty_to_pull_s'))} after its queue emptied, "
                f"{us(s['steal_latency_s'])} after the CPU went idle, from CPU "
                f"{s['first_pull_src_cpu']} ({s['first_pull_kind']})")
        if not s["stolen"]:
            verdict = ("not measurable" if s["stolen"] is None
                       else "nothing was pulled: not work-conserving")
        else:
            idle_s = s["idle_before_pull_s"]
            verdict = (f"target sat idle {us(idle_s)} before the pull (other tasks ran "
                       f"{us(s['other_before_pull_s'])}; exiting tasks held it the rest)")
        return [
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']} "
            f"(target CPU {s['target_cpu']})",
            f"target's tasks exit at       {s['idle_at_s']:.4f} s (drawn); target idle {idle}",
            f"first pull onto the target   {pull}",
            f"pulls onto the target        {s['pulls_before_idle']} before idle, "
            f"{s['pulls_after_idle']} after",
            f"verdict                      {verdict}",
        ]
