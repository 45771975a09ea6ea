"""The suite: the whole catalog, with repetitions, into one directory and one report.

``plan(ncpus, quick)`` lists the configurations: every experiment registered in CATALOG at run
time, with the sweeps the thesis drew (x for how-many, light duty for heavy-light, nice difference
for priority-classes; and the task count for proportional) where the experiment has that parameter. ``run_suite`` captures them back to
back while holding the host lock once (no doctor, lock or stale-state sweep per run, one probe
session), has the runner analyse them (see :class:`harmony.runners.KernelRunner`), then writes
:mod:`harmony.analysis.report_suite` (policy card first). The suite draws the cross-run figures of
its report only; each run's own figures and each configuration's repetition figure are drawn on
demand by ``harmony report RUN`` or ``harmony report BATCH`` (drawing them all took longer than
the analysis itself).

Layout of a suite directory::

    suite.json                 the plan, timings (configured vs wall: suite efficiency), host facts
    <experiment>[-<k>=<v>]/    one batch per configuration (see harmony.batch): rep-NN/ + batch.json
    report.md  report.html     figures/*.png
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from harmony import store
from harmony.workload.controller import warm_s

#: sweeps the thesis drew: experiment -> (parameter, full values, quick values). A value list may
#: depend on P (how-many: x must be large enough for poly-balance (x/P) and pairwise (x/2) to differ).
SWEEPS = {
    "how-many": ("x", lambda P: [20, 30, 40, 50, 60, 70, 80, 90], lambda P: [4 * P]),
    "heavy-light": ("light_duty", lambda P: [5, 20, 40, 60, 80, 100], lambda P: [20, 50]),
    "priority-classes": ("nice_diff", lambda P: [2, 6, 10, 18, 30, 38], lambda P: [4, 15]),
    # 2P tasks divide evenly; 2P + 1 need the balancer to rotate a task (an intrinsic imbalance)
    "proportional": ("ntasks", lambda P: [2 * P, 2 * P + 1], lambda P: [2 * P]),
}

#: quick-mode parameter overrides per experiment (shorter runs; applied only if the experiment has
#: the parameter and accepts the value). Windows shrink with the duration.
QUICK = {
    "single-source": {"duration": 2.0},
    "how-many": {"duration": 2.0},
    "time-to-resolve": {"duration": 3.0},
    "work-conservation": {"duration": 2.0, "idle_from_s": 0.5, "idle_to_s": 1.0},
    "detection": {"duration": 2.0, "cut_from_s": 0.5, "cut_to_s": 1.0},
    "intrinsic-imbalance": {"duration": 3.0, "warmup_s": 0.5},
    "heavy-light": {"duration": 3.0, "long_warmup_s": 1.5, "short_warmup_s": 0.5, "short_s": 0.5},
    "priority-classes": {"duration": 3.0, "long_warmup_s": 1.5, "short_warmup_s": 0.5, "short_s": 0.5},
    "server": {"duration": 2.0},
    "proportional": {"duration": 1.0},
}
#: repetitions per configuration (the thesis ran 10-25); detection needs more (a distribution).
REPEATS = {"full": 5, "quick": 2}
EXTRA_REPEATS = {"detection": 2, "work-conservation": 1}


@dataclasses.dataclass
class Config:
    """One configuration of the plan: an experiment, its parameter overrides, how many runs."""

    experiment: str
    overrides: dict
    repeat: int
    label: str  # directory name: experiment[-param=value]
    params: dict | None = None  # resolved for the CPU set (filled by plan())
    note: str | None = None  # why an override was dropped, if one was

    @property
    def configured_s(self) -> float:
        """Seconds of measured time this configuration asks for (companions included), a warm
        release's warm-up included: the tasks run then as the experiment asks."""
        per_run = float(self.params["duration"]) + (warm_s(self.params) or 0.0)
        return self.repeat * per_run * (1 + self.companions)

    companions: int = 0


def _has(exp, name: str) -> bool:
    return any(p.name == name for p in exp.all_params())


def not_simulated(names) -> dict[str, str]:
    """Experiment -> why the reference policies' simulator cannot run it
    (Experiment.not_simulated), for those of ``names`` it cannot."""
    from harmony.experiments import get_experiment

    return {n: get_experiment(n).not_simulated for n in names if get_experiment(n).not_simulated}


def plan(cpus: list[int], quick: bool = False, repeat: int | None = None,
         experiments: list[str] | None = None, simulated: bool = False) -> list[Config]:
    """The suite's configurations for this CPU set; ``simulated`` (the reference policies'
    simulator) leaves out the experiments it cannot run (:func:`not_simulated`). Raises
    ValueError for an unknown experiment."""
    from harmony.experiments import CATALOG, get_experiment

    names = list(CATALOG) if experiments is None else experiments
    if simulated:
        gone = not_simulated(names)
        names = [n for n in names if n not in gone]
    mode = "quick" if quick else "full"
    out = []
    for name in names:
        exp = get_experiment(name)
        base = {k: v for k, v in QUICK.get(name, {}).items() if _has(exp, k)} if quick else {}
        sweep = SWEEPS.get(name)
        points = [{}]
        grid = exp.suite_points(len(cpus), quick)
        if grid:
            points = grid
        elif sweep and _has(exp, sweep[0]):
            values = (sweep[2] if quick else sweep[1])(len(cpus))
            points = [{sweep[0]: v} for v in values]
            if name == "priority-classes" and _has(exp, "high_nice"):
                # nice 0 vs nice d while d fits in -20..19, else shift both down (thesis: 2..38)
                points = [pt | {"high_nice": min(0, 19 - pt["nice_diff"])} for pt in points]
        n = repeat if repeat is not None else REPEATS[mode] + EXTRA_REPEATS.get(name, 0)
        for pt in points:
            label = name + "".join(f"-{k}={v}" for k, v in pt.items()
                                   if grid or (sweep and k == sweep[0]))
            cfg = Config(name, {**base, **pt}, n, label)
            try:
                cfg.params = exp.resolve(cfg.overrides, cpus)
            except ValueError as exc:  # a quick shortening the experiment refuses: keep its default
                cfg.note = f"quick overrides not accepted ({exc}); ran with the defaults"
                cfg.overrides = dict(pt)
                cfg.params = exp.resolve(cfg.overrides, cpus)
            cfg.companions = len(exp.companions(cfg.params))
            out.append(cfg)
    return out


class Progress:
    """One status line per run on a terminal (rewritten in place), plain lines otherwise.

    A runner that makes its captures later than it is given them (a VM's, at its boot) is handed
    this object and numbers the runs as they happen (:meth:`expect`, :meth:`booted`): then, once
    the first runs are done, the line says when the rest will be (the seconds each configured
    second has taken since the boot, times those left)."""

    def __init__(self, total_runs: int, total_s: float, stream=sys.stderr, quiet: bool = False):
        self.total_runs, self.total_s = total_runs, total_s
        self.done_runs, self.done_s = 0, 0.0
        self.stream, self.quiet = stream, quiet
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self.t_booted: float | None = None

    def expect(self, runs: int, seconds: float) -> None:
        """The runs (and configured seconds) still to come, counted anew: a runner's captures,
        companions included, when it makes them."""
        self.total_runs, self.total_s, self.done_runs, self.done_s = runs, seconds, 0, 0.0

    def booted(self) -> None:
        """The runs begin now (a VM's boot is over): the estimate counts from here."""
        self.t_booted = time.monotonic()

    def left(self) -> str:
        """What is left: an estimate once runs are done since the boot, else the configured
        seconds."""
        left = max(0.0, self.total_s - self.done_s)
        if self.t_booted is not None and self.done_s > 0:
            rate = (time.monotonic() - self.t_booted) / self.done_s
            return f"ETA ~{rate * left:4.0f} s"
        return f"~{left:4.0f} s of runs left"

    def show(self, what: str):
        if self.quiet:
            return
        el = time.monotonic() - self.start
        line = (f"[{self.done_runs + 1}/{self.total_runs}] {what:<48} elapsed {el:5.0f} s, "
                f"{self.left()}")
        if self.tty:
            self.stream.write("\r" + line[:118].ljust(118))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def phase(self, what: str):
        """A step after the runs (analysis, report): shown without a run counter."""
        if self.quiet:
            return
        line = f"{what:<60} elapsed {time.monotonic() - self.start:5.0f} s"
        self.stream.write(("\r" + line[:118].ljust(118)) if self.tty else line + "\n")
        self.stream.flush()

    def finished(self, seconds: float):
        self.done_runs += 1
        self.done_s += seconds

    def close(self):
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()

    def clear(self):
        """Take the status line off the terminal (before an error is printed in its place)."""
        if self.tty and not self.quiet:
            self.stream.write("\r" + " " * 118 + "\r")
            self.stream.flush()


def run_suite(configs: list[Config], cpus: list[int], out: Path, runner, *, facts: dict | None = None,
              seed: int = 0, quiet: bool = False, card_note: str | None = None,
              resume: bool = False) -> dict:
    """Run every configuration with ``runner`` (see :mod:`harmony.runners`) and write the report.

    ``runner.capture(exp, params, cpus, out, seed)`` records one run (real or simulated) and
    ``runner.analyse(out)`` analyses it. Returns the suite record (also written as suite.json).
    ``resume``: ``out`` holds a suite that was interrupted (:func:`resume_plan` gives its
    configurations): its complete runs are kept as they are, captured ones only analysed.
    """
    from harmony import batch
    from harmony.experiments import get_experiment

    out = Path(out)
    store.make_run_dir(out)
    total_runs = sum(c.repeat for c in configs)
    configured = sum(c.configured_s for c in configs)
    record = {"cpus": cpus, "quick": None, "configs": [dataclasses.asdict(c) for c in configs],
              "configured_s": configured, "runner": runner.name, "host": facts or {},
              "card_note": card_note,     # `harmony report SUITE` writes the report with it again
              "seed": seed, "status": "running", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if resume:
        before = store.read_json(out / "suite.json")
        record["started_at"] = before.get("started_at")
        record["resumed_at"] = before.get("resumed_at", []) + [time.strftime("%Y-%m-%dT%H:%M:%S%z")]
    store.write_json(out / "suite.json", record)
    progress = Progress(total_runs, configured, quiet=quiet)
    # the report's modules (matplotlib: ~0.5 s) are imported while the analysis runs after the
    # captures, in CPU time it leaves idle, rather than before the first capture
    if hasattr(runner, "while_analysing"):
        runner.while_analysing = _import_report
    if hasattr(runner, "say") and not quiet:    # a VM runner's steps: boot, each run in the guest
        runner.say = progress.phase
    # a runner that makes its captures later (a VM's, in one boot at flush) numbers them itself
    later = hasattr(runner, "to_make")
    if later:
        runner.progress = progress
    t_start = time.monotonic()
    failures, batches = [], []
    try:
        with runner:
            for cfg in configs:
                exp = get_experiment(cfg.experiment)
                try:
                    batch.run_batch(exp, cfg.params, cpus, out / cfg.label, cfg.repeat, runner,
                                    seed=seed, progress=None if later else progress,
                                    draw_first=False, resume=resume)
                except (store.RunError, RuntimeError, ValueError) as exc:
                    failures.append({"config": cfg.label, "error": str(exc)})
                batches.append(out / cfg.label)
            if later:
                progress.expect(*runner.to_make())
            runner.flush()          # a VM runner boots here, once, for every capture planned
            t_captured = time.monotonic() - t_start
            if runner.analysis != "in line":
                progress.phase(f"analysing {total_runs} runs ({runner.analysis})")
        t_analysed = time.monotonic() - t_start
        progress.phase("policy card and report")
        for b in batches:
            if (b / "batch.json").exists():
                batch.finish_batch(b, figures=False)
        failures += [r for r in getattr(runner, "results", []) if r["status"] != "ok"]
    finally:
        progress.close()
    wall = time.monotonic() - t_start
    record |= {"status": "complete" if not failures else "incomplete", "failures": failures,
               "captured_s": t_captured, "analysed_s": t_analysed, "wall_s": wall,
               "efficiency": wall / configured if configured else None, "runs": total_runs,
               "analysis": runner.analysis,
               # a kernel under test in a VM: the guest's facts (kernel, scheduler, CPUs)
               "under_test": getattr(runner, "system", None),
               "analysis_overlapped": bool(getattr(runner, "overlap", False))}
    sched = scheduler_of_runs(out)    # a sched_ext scheduler the runs had, not the boot's facts
    system = "under_test" if record.get("under_test") else "host"
    if sched and record.get(system):
        record[system] = {**record[system], "scheduler": sched}
    store.write_json(out / "suite.json", record)
    _import_report().write(out, note=card_note)
    record["wall_with_report_s"] = time.monotonic() - t_start
    store.write_json(out / "suite.json", record)
    return record


def scheduler_of_runs(out: Path) -> str | None:
    """The sched_ext scheduler (``--scx``) the suite's runs under ``out`` had, as their manifests
    name it, or None (no run had one): the facts taken at the start (a VM's boot, the host's
    doctor) name the kernel's own scheduler, as it was before any run started its own."""
    for path in sorted(out.glob("*/rep-*/manifest.json")):
        try:
            m = store.read_json(path)
        except store.RunError:
            continue
        if m.get("scx"):
            return (m.get("under_test") or m.get("host") or {}).get("scheduler")
    return None


def resume_plan(out: Path) -> tuple[list[Config], list[int], dict]:
    """(configurations, CPU set, the suite record) of the suite in ``out``, to resume it; RunError
    naming the directory if it holds no suite, or a finished one."""
    record = store.read_json(Path(out) / "suite.json")
    if record.get("status") == "complete":
        raise store.RunError(f"{out}: the suite is complete: nothing to resume")
    fields = {f.name for f in dataclasses.fields(Config)}
    configs = [Config(**{k: v for k, v in c.items() if k in fields}) for c in record["configs"]]
    return configs, list(record["cpus"]), record


def _import_report():
    from harmony.analysis import report_suite
    return report_suite


def simulate_suite(policy: str, ncpus: int, out: Path, quick: bool = True, repeat: int | None = None,
                   experiments: list[str] | None = None, seed: int = 0, quiet: bool = True) -> dict:
    """The suite under a reference policy on ``ncpus`` simulated CPUs (no kernel, no root)."""
    from harmony.runners import SimRunner

    cpus = list(range(ncpus))
    configs = plan(cpus, quick=quick, repeat=repeat, experiments=experiments, simulated=True)
    runner = SimRunner(policy)
    return run_suite(configs, cpus, out, runner, facts={"kernel": "simulated",
                                                        "scheduler": f"reference policy {policy}",
                                                        "ncpus": ncpus},
                     seed=seed, quiet=quiet)


def cpu_limits(ncpus: int) -> list[str]:
    """Plain statements of what a CPU set this small cannot answer, and why."""
    out = []
    if ncpus < 3:
        out.append(f"On {ncpus} CPUs the poly-balance (q_src - N/P) and pairwise ((q_src - q_target)/2) "
                   "predictions of how-many are the same number, x/2, so the suite cannot tell how the "
                   "scheduler decides how many tasks to move; that needs 3 or more CPUs.")
    return out
