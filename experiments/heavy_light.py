"""E7/E9/E10 heavy-light (thesis 7.2, figures 7.5, 7.6, 7.9-7.12): is mixed demand balanced by
weight?

P heavy (100%) and P light (``light_duty``%) tasks start on the first CPU of the set (<4,0> on 2
CPUs, <8,0,0,0> on 4). The only weighted balance puts one heavy and one light task on each CPU; a
*static ideal* companion run pins exactly that (``static=1``, captured automatically into
``<run_dir>/static/``) and gives the reference run-queue variance and allocations.

Measures (see :mod:`harmony.analysis.mixed` for the definitions): SMAPE of the run-queue variance
against the static ideal in the short window (E9: 1 s after 1 s) and the long window (E7), the
fraction of CPUs holding one heavy + one light (E9: informed or blind selection), heavy tasks'
allocation over the static ideal's (E10), migrations.

:class:`TwoClassExperiment` is shared with E11 priority-classes (high / low nice).

Each class has its own scheduling class (``heavy_policy``, ``heavy_rt_priority``, ...; default:
the common ``policy``, ``rt_priority``, ...), e.g. ``-p heavy_policy=fifo -p heavy_rt_priority=10``
for SCHED_FIFO heavy tasks among fair light ones.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import mixed
from harmony.experiments.base import (
    Experiment,
    Metric,
    Param,
    class_params,
    non_negative,
    percent,
    pick,
    positive,
    task_class,
)
from harmony.experiments.single_source import SingleSource
from harmony.store import RunError
from harmony.workload.tasks import TaskSpec


def _flag(v) -> str | None:
    return None if v in (0, 1) else "must be 0 or 1"


WINDOW_PARAMS = (
    Param("duration", 10.0, "float", "seconds measured after t0 (thesis: 60)", positive),
    Param("long_warmup_s", 5.0, "float",
          "the long window starts this many seconds after t0 and lasts to the end (thesis: 30)",
          non_negative),
    Param("short_warmup_s", 1.0, "float",
          "the short window starts this many seconds after t0 (thesis: 1)", non_negative),
    Param("short_s", 1.0, "float", "length of the short window (thesis: 1)", positive),
    Param("static", 0, "int", "1 = static-ideal placement (one task of each class pinned per CPU); "
          "set automatically for the companion run in <run_dir>/static/", _flag),
)


NO_WINDOW = "the window does not fit in the run"
NO_STATIC = "the window does not fit, or no static-ideal companion (a static run, or it is missing)"


def windowed(name: str, unit: str, help: str, none_when: str = NO_WINDOW) -> tuple[Metric, Metric]:
    """``name_short`` and ``name_long``: one measure in the short and in the long window."""
    return tuple(Metric(f"{name}_{w}", unit, f"{help}, in the {w} window", none_when)
                 for w in ("short", "long"))


#: the summary keys of :meth:`TwoClassExperiment.common_summary`
TWO_CLASS_SUMMARY = (
    *pick(SingleSource.summary, "ntasks", "ncpus"),
    Metric("static", "bool", "this run is a static ideal (one task of each class pinned per CPU)"),
    Metric("static_run", "name", "the static-ideal companion's directory in the run's",
           none_when="a static run, or its companion is missing"),
    Metric("windows", "s", "the analysis windows that fit in the run, s after t0: "
           "{\"short\": [a, b], \"long\": [c, d]}", kind="dict"),
    Metric("migrations", "count", "migrations from t0 to the end"),
    Metric("migrations_per_s", "1/s", "migrations per second of the run"),
    Metric("migrations_per_cpu_s", "1/CPU-s",
           "migrations per CPU-second the tasks ran (NaN if none ran)"),
    Metric("placement_src_mismatches", "count",
           "migrations whose source CPU was not where the placement had the task"),
    *windowed("variance", "tasks^2",
              "variance across the CPUs of their run-queue lengths, time-averaged"),
    *windowed("static_variance", "tasks^2", "the same in the static ideal", NO_STATIC),
    *windowed("smape", "index", "SMAPE of the run-queue variance against the static ideal's "
              "(0: the same, 1: worst)", NO_STATIC),
)


class TwoClassExperiment(Experiment):
    """P tasks of class ``first`` and P of class ``second``, all on the first CPU at t0, with a
    static-ideal companion that pins one of each per CPU."""

    first, second = "heavy", "light"
    prefix = {"heavy": "h", "light": "l"}
    not_imported = ("its analysis tells its two classes of tasks apart by the role Harmony gave "
                    "each, which a trace does not record")

    def validate(self, p, cpus):
        if len(cpus) < 2:
            raise ValueError(f"{self.name} needs at least 2 CPUs (the CPU set has {len(cpus)})")
        if p["long_warmup_s"] >= p["duration"]:
            raise ValueError(f"long_warmup_s={p['long_warmup_s']} leaves no long window in "
                             f"duration={p['duration']}")
        if p["short_warmup_s"] + p["short_s"] > p["duration"]:
            raise ValueError(f"the short window {p['short_warmup_s']}+{p['short_s']} s does not "
                             f"fit in duration={p['duration']}")

    def spec(self, role: str, p: dict) -> dict:
        """TaskSpec fields of a task of ``role`` (duty, nice, period_ms)."""
        raise NotImplementedError

    @property
    def class_roles(self):
        return (self.first, self.second)

    def class_nice(self, p):
        return {role: self.spec(role, p).get("nice", 0) for role in self.class_roles}

    def tasks(self, p, cpus):
        out = []
        for role in (self.first, self.second):
            for i, cpu in enumerate(cpus):
                placed = cpu if p["static"] else cpus[0]
                out.append(TaskSpec(name=f"{self.prefix[role]}{i:02d}", role=role,
                                    initial_cpu=placed, pinned=bool(p["static"]),
                                    **self.spec(role, p), **task_class(p, role)))
        return out

    def companions(self, p):
        return {} if p["static"] else {"static": {"static": 1}}

    def windows(self, run) -> dict[str, tuple[float, float]]:
        p = run.manifest["params"]
        return mixed.windows(run.manifest["measured_s"], p["long_warmup_s"], p["short_warmup_s"],
                             p["short_s"])

    def measure(self, run) -> dict:
        """Tables of one run (dynamic or static) that the metrics compare."""
        m, cpus = run.manifest, run.manifest["cpus"]
        t0, t_end = m["t0_ns"], m["end_ns"]
        placement = mixed.df_placement(run.migrations, run.tasks, t0, t_end)
        counts = mixed.df_class_counts(placement, cpus, t0, t_end)
        return {
            "variance": mixed.df_runqueue_variance(run.runqueue, cpus, t0, t_end),
            "placement": placement,
            "counts": counts,
            "allocation": mixed.df_window_allocation(run.runs, run.tasks, t0, self.windows(run)),
            "rate": mixed.df_migration_rate(run.migrations, run.runs, run.tasks, t0, t_end),
        }

    def static_of(self, run):
        """The static-ideal companion (a Run), or None for a static run or when it is missing."""
        if run.manifest["params"].get("static"):
            return None
        try:
            return run.companion("static")
        except RunError:
            return None

    def common_summary(self, run, dyn: dict, static: dict | None) -> dict:
        m = run.manifest
        t0, wins = m["t0_ns"], self.windows(run)
        rate = dyn["rate"].set_index("role")
        out = {"ntasks": int(len(run.tasks)), "ncpus": len(m["cpus"]),
               "static": bool(m["params"]["static"]),
               "static_run": None if static is None else "static",
               "windows": {k: list(v) for k, v in wins.items()},
               "migrations": int(rate.loc["all", "migrations"]),
               "migrations_per_s": float(rate.loc["all", "per_s"]),
               "migrations_per_cpu_s": float(rate.loc["all", "per_cpu_s"]),
               "placement_src_mismatches": int(dyn["placement"].attrs["src_mismatches"])}
        for w in ("short", "long"):
            span = wins.get(w)
            out[f"variance_{w}"] = None if span is None else \
                mixed.time_average(dyn["variance"], "variance", t0, *span)
            out[f"static_variance_{w}"] = None
            if static is not None and span is not None:
                out[f"static_variance_{w}"] = mixed.time_average(
                    static["variance"], "variance", static["t0"], *span)
            out[f"smape_{w}"] = mixed.smape(out[f"variance_{w}"], out[f"static_variance_{w}"])
        return out

    def load_pair(self, run):
        dyn = self.measure(run)
        srun = self.static_of(run)
        static = None
        if srun is not None:
            static = self.measure(srun)
            static["t0"] = srun.manifest["t0_ns"]
            static["run"] = srun
        return dyn, static

    # -- figures -----------------------------------------------------------------------------
    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis import plots, plots_mixed

        m, p = run.manifest, run.manifest["params"]
        dyn, static = self.load_pair(run)
        dur, wins = m["measured_s"], self.windows(run)
        out = [plots.plot_migrations(run.migrations, dur, p["bin_s"], fig_dir / "migrations.png"),
               plots_mixed.plot_placement(dyn["counts"], m["cpus"], dur, fig_dir / "placement.png",
                                          roles=(self.first, self.second))]
        if static is None:
            out.append(plots.plot_shares(run.shares, fig_dir / "shares.png"))
            return out
        srun = static["run"]
        out += [
            plots_mixed.plot_shares_vs_static(run.shares, srun.shares, fig_dir / "shares.png"),
            plots_mixed.plot_variance_timeline(dyn["variance"], static["variance"], m["t0_ns"],
                                               static["t0"], run.migrations, dur,
                                               max(p["bin_s"], 0.1), wins,
                                               fig_dir / "variance.png"),
            plots_mixed.plot_runqueue_pair(run.runqueue, srun.runqueue, m["cpus"],
                                           wins.get("long", (0.0, dur)), fig_dir / "runqueue.png",
                                           fair=len(run.tasks) / len(m["cpus"])),
            plots_mixed.plot_class_allocation(dyn["allocation"], static["allocation"],
                                              fig_dir / "allocation.png"),
        ]
        return out


class HeavyLight(TwoClassExperiment):
    name = "heavy-light"
    question = ("Is a mixed CPU demand balanced by weight, and which tasks are chosen "
                "(informed or blind)?")
    thesis = "7.2, figures 7.5, 7.6, 7.9-7.12 (E7, E9, E10)"
    params = (
        Param("light_duty", 50.0, "float",
              "CPU demand of the light tasks in percent (thesis sweeps 5..100)", percent),
        Param("period_ms", 10.0, "float", "mean run+sleep period of the light tasks (ms)",
              positive),
    ) + WINDOW_PARAMS + class_params("heavy") + class_params("light")

    def spec(self, role, p):
        return {"duty": 100.0 if role == "heavy" else p["light_duty"], "period_ms": p["period_ms"]}

    summary = (
        Metric("light_duty", "%", "CPU demand of the light tasks (the parameter)"),
        *TWO_CLASS_SUMMARY,
        *windowed("one_heavy_one_light_fraction", "fraction",
                  "fraction of the CPUs holding one heavy and one light task, time-averaged"),
        *windowed("heavy_slowdown", "ratio", "heavy tasks' CPU allocation over the static ideal's",
                  NO_STATIC),
        *windowed("light_slowdown", "ratio", "light tasks' CPU allocation over the static ideal's",
                  NO_STATIC),
        Metric("one_heavy_one_light_fraction", "fraction", "one_heavy_one_light_fraction_long",
               NO_WINDOW),
    )

    def analyse(self, run) -> dict:
        dyn, static = self.load_pair(run)
        out = {"light_duty": float(run.manifest["params"]["light_duty"])}
        out |= self.common_summary(run, dyn, static)
        t0, wins = run.manifest["t0_ns"], self.windows(run)
        pairs = mixed.df_pair_timeline(dyn["counts"], "heavy", "light")
        for w in ("short", "long"):
            span = wins.get(w)
            out[f"one_heavy_one_light_fraction_{w}"] = None if span is None else \
                mixed.time_average(pairs, "fraction", t0, *span)
            out[f"heavy_slowdown_{w}"] = None if static is None else \
                mixed.allocation_ratio(dyn["allocation"], static["allocation"], "heavy", w)
            out[f"light_slowdown_{w}"] = None if static is None else \
                mixed.allocation_ratio(dyn["allocation"], static["allocation"], "light", w)
        out["one_heavy_one_light_fraction"] = out["one_heavy_one_light_fraction_long"]
        return out

    def describe(self, s: dict) -> list[str]:
        kind = "static ideal (one heavy + one light pinned per CPU)" if s["static"] else "dynamic"
        lines = [
            f"run                          {kind}; light duty {s['light_duty']:g}%",
            f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']}",
            f"migrations                   {s['migrations']} "
            f"({number_text(s['migrations_per_s'])}/s)",
        ]
        for w in ("short", "long"):
            where = window_text(s["windows"].get(w))
            lines.append(f"{w:5} window {where:16} run-queue variance "
                         f"{number_text(s[f'variance_{w}'], 3)}"
                         f" vs static {number_text(s[f'static_variance_{w}'], 3)}: "
                         f"SMAPE {number_text(s[f'smape_{w}'], 3)}; "
                         "one heavy + one light on "
                         f"{_pct(s[f'one_heavy_one_light_fraction_{w}'])} of CPUs; "
                         f"heavy allocation / static {number_text(s[f'heavy_slowdown_{w}'], 3)}")
        if not s["static"] and s["static_run"] is None:
            lines.append("static ideal                 missing (no <run_dir>/static/): "
                         "no SMAPE or slowdown")
        elif s["static_run"]:
            lines.append(f"static ideal                 <run_dir>/{s['static_run']}/ "
                         "(its own report.md)")
        return lines


def number_text(v, digits=2) -> str:
    """A metric to ``digits`` decimals, "n/a" when there is none."""
    return "n/a" if v is None else f"{v:.{digits}f}"


def _pct(v):
    return "n/a" if v is None else f"{v:.0%}"


def window_text(span) -> str:
    """A measurement window [a, b] (s after t0) as "a-b s", to the ms ("1.5-3 s", not the
    "1.5-3.00012 s" of a window that ends with a run measured 0.12 ms past its duration)."""
    return "n/a" if span is None else f"{round(span[0], 3):g}-{round(span[1], 3):g} s"
