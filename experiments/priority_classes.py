"""E11 priority-classes (thesis 7.3, figures 7.13-7.15): how are priority classes spread over CPUs?

P high-priority (nice ``high_nice``) and P low-priority (nice ``high_nice + nice_diff``) CPU-bound
tasks start on the first CPU of the set (<4,0> on 2 CPUs, <8,0,0,0> on 4). The thesis sweeps the
difference 2..38 (nice -19..19); with the default high_nice = 0 the difference goes to 19, set
high_nice below 0 for larger ones. Run queue variance cannot tell <2,2,0,0> high + <0,0,2,2> low
from a balance, so the placement of each class is measured directly: a spread index per class
(0 = evenly spread over the CPUs, 1 = all on one CPU), time-averaged over the long window.
A *static ideal* companion (one high + one low pinned per CPU, ``<run_dir>/static/``) gives the
reference allocation of the high tasks.

Each class has its own scheduling class (``high_policy``, ``high_rt_priority``, ...; default the
common ``policy``...): ``-p policy=fifo -p high_rt_priority=20 -p low_rt_priority=10 -p
nice_diff=0`` sets two SCHED_FIFO priorities against each other (nice applies to the fair classes
only, so nice_diff must then be 0).
"""

from __future__ import annotations

from harmony.analysis import mixed
from harmony.experiments.base import Metric, Param, class_params, nice_value, non_negative
from harmony.experiments.heavy_light import (
    NO_STATIC,
    NO_WINDOW,
    TWO_CLASS_SUMMARY,
    WINDOW_PARAMS,
    TwoClassExperiment,
    number_text,
    window_text,
    windowed,
)


class PriorityClasses(TwoClassExperiment):
    name = "priority-classes"
    question = "How are high- and low-priority tasks spread over the CPUs, and what does it cost?"
    thesis = "7.3, figures 7.13-7.15 (E11)"
    first, second = "high", "low"
    prefix = {"high": "hi", "low": "lo"}
    params = (
        Param("nice_diff", 10, "int",
              "nice of the low tasks minus nice of the high tasks (thesis 2..38)", non_negative),
        Param("high_nice", 0, "int", "nice value of the high-priority tasks", nice_value),
    ) + WINDOW_PARAMS + class_params("high") + class_params("low")

    def validate(self, p, cpus):
        super().validate(p, cpus)
        low = p["high_nice"] + p["nice_diff"]
        if not -20 <= low <= 19:
            raise ValueError(f"high_nice={p['high_nice']} + nice_diff={p['nice_diff']} = {low} is "
                             "not a nice value (-20..19); lower high_nice for large differences")

    def spec(self, role, p):
        return {"duty": 100.0, "nice": p["high_nice"] + (p["nice_diff"] if role == "low" else 0)}

    summary = (
        Metric("nice_diff", "nice",
               "nice of the low tasks minus nice of the high tasks (the parameter)"),
        Metric("high_nice", "nice", "nice value of the high-priority tasks (the parameter)"),
        Metric("low_nice", "nice", "nice value of the low-priority tasks"),
        *TWO_CLASS_SUMMARY,
        Metric("high_migrations_per_cpu_s", "1/CPU-s",
               "migrations of high tasks per CPU-second they ran"),
        Metric("low_migrations_per_cpu_s", "1/CPU-s",
               "migrations of low tasks per CPU-second they ran"),
        *windowed("high_spread_index", "index", "spread of the high tasks over the CPUs, "
                  "time-averaged (0: even, 1: all on one CPU)"),
        *windowed("low_spread_index", "index", "spread of the low tasks, time-averaged"),
        *windowed("high_allocation_ratio", "ratio",
                  "high tasks' CPU allocation over the static ideal's", NO_STATIC),
        *windowed("low_allocation_ratio", "ratio",
                  "low tasks' CPU allocation over the static ideal's", NO_STATIC),
        Metric("high_spread_index", "index", "high_spread_index_long", NO_WINDOW),
        Metric("low_cluster_index", "index", "low_spread_index_long", NO_WINDOW),
        Metric("high_allocation_ratio", "ratio", "high_allocation_ratio_long", NO_STATIC),
    )

    def analyse(self, run) -> dict:
        dyn, static = self.load_pair(run)
        p = run.manifest["params"]
        out = {"nice_diff": int(p["nice_diff"]), "high_nice": int(p["high_nice"]),
               "low_nice": int(p["high_nice"] + p["nice_diff"])}
        out |= self.common_summary(run, dyn, static)
        t0, wins = run.manifest["t0_ns"], self.windows(run)
        spread = mixed.df_spread(dyn["counts"])
        rate = dyn["rate"].set_index("role")
        for role in ("high", "low"):
            out[f"{role}_migrations_per_cpu_s"] = float(rate.loc[role, "per_cpu_s"])
        for w in ("short", "long"):
            span = wins.get(w)
            for role in ("high", "low"):
                out[f"{role}_spread_index_{w}"] = None if span is None else mixed.time_average(
                    spread[spread["role"] == role], "index", t0, *span)
                out[f"{role}_allocation_ratio_{w}"] = None if static is None else \
                    mixed.allocation_ratio(dyn["allocation"], static["allocation"], role, w)
        out["high_spread_index"] = out["high_spread_index_long"]
        out["low_cluster_index"] = out["low_spread_index_long"]
        out["high_allocation_ratio"] = out["high_allocation_ratio_long"]
        return out

    def describe(self, s: dict) -> list[str]:
        kind = "static ideal (one high + one low pinned per CPU)" if s["static"] else "dynamic"
        lines = [
            f"run                          {kind}; nice {s['high_nice']} (high) vs {s['low_nice']} "
            f"(low), difference {s['nice_diff']}",
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']}",
            f"migrations                   {s['migrations']} "
            f"({number_text(s['migrations_per_s'])}/s; "
            f"{number_text(s['migrations_per_cpu_s'])} per CPU-second; "
            f"high {number_text(s['high_migrations_per_cpu_s'])}, "
            f"low {number_text(s['low_migrations_per_cpu_s'])})",
        ]
        for w in ("short", "long"):
            where = window_text(s["windows"].get(w))
            lines.append(f"{w:5} window {where:16} spread index "
                         f"high {number_text(s[f'high_spread_index_{w}'], 3)}, "
                         f"low {number_text(s[f'low_spread_index_{w}'], 3)} "
                         "(0 even, 1 all on one CPU); high allocation / static "
                         f"{number_text(s[f'high_allocation_ratio_{w}'], 3)}")
        if not s["static"] and s["static_run"] is None:
            lines.append("static ideal                 missing (no <run_dir>/static/): "
                         "no allocation ratio")
        elif s["static_run"]:
            lines.append(f"static ideal                 <run_dir>/{s['static_run']}/ "
                         "(its own report.md)")
        return lines
