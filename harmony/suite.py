"""The suite: the whole catalog, with repetitions, into one directory and one report.

``plan(ncpus, quick)`` lists the configurations: every experiment registered in CATALOG at run
time, with the sweeps the thesis drew (x for how-many, light duty for heavy-light, nice difference
for priority-classes; and the task count for proportional) where the experiment has that parameter.
``run_suite`` captures them back to back while holding the host lock once (no doctor, lock or
stale-state sweep per run, one probe session), has the runner analyse them (see
:class:`harmony.runners.KernelRunner`), then writes
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
from harmony.core import stops
from harmony.workload.controller import warm_s

#: sweeps the thesis drew: experiment -> (parameter, full values, quick values). A value list may
#: depend on P (how-many: x must be large enough for poly-balance (x/P) and pairwise
#: (x/2) to differ).
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
    "priority-classes": {"duration": 3.0, "long_warmup_s": 1.5, "short_warmup_s": 0.5,
                         "short_s": 0.5},
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
    #: the configuration's own CPU set (a pair placed at a level), or None: the suite's
    cpus: list | None = None

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
         experiments: list[str] | None = None, simulated: bool = False,
         topology: dict | None = None) -> list[Config]:
    """The suite's configurations for this CPU set; ``simulated`` (the reference policies'
    simulator) leaves out the experiments it cannot run (:func:`not_simulated`). On a machine
    whose ``topology`` (the contract's) gives the set more than one level, the questions that
    depend on distance are asked again at each level present (:func:`level_plan`). Raises
    ValueError for an unknown experiment."""
    out = _plan(cpus, quick, repeat, experiments, simulated)
    if topology and (topology.get("cpus") or {}):
        out += level_plan(cpus, topology, quick, repeat, experiments)
    return out


#: the questions that depend on where the source and target sit (issue 45), asked at each level
#: present: (experiment, overrides, label suffix). how-many with 8 tasks against 7 is the
#: imbalance_pct check (114 %: above SMT's 110, below the 117 of the other levels)
LEVEL_CONFIGS = (
    ("time-to-resolve", {}, ""),
    ("detection", {}, ""),
    ("how-many", {}, ""),
    ("how-many", {"base": 7, "x": 1}, "-imbalance"),
    ("work-conservation", {}, ""),
)
#: the spread's task counts: one task per core (cores before siblings) and two (the NUMA
#: level's allowance: a small imbalance stays on one node)
SPREAD_TASKS = (lambda P: max(2, P // 2), lambda P: 2)


def level_plan(cpus: list[int], topology: dict, quick: bool = False, repeat: int | None = None,
               experiments: list[str] | None = None) -> list[Config]:
    """The per-level configurations of a suite on a machine: each of :data:`LEVEL_CONFIGS` on
    the pair of CPUs of each level present in ``cpus`` (:mod:`harmony.experiments.placement`;
    none when the set has one level: its own runs answer there),
    its detection window long enough for the level's slowest predicted check
    (:func:`detection_window`), and the spread experiment on the whole set."""
    from harmony.experiments import get_experiment
    from harmony.experiments.placement import levels_present, placed_cpus

    mode = "quick" if quick else "full"
    wanted = set(experiments) if experiments is not None else None
    out = []
    levels = levels_present(cpus, topology)
    for level in levels if len(levels) > 1 else ():   # one level: the whole set's runs say it
        pair = placed_cpus(level, cpus, topology)
        for name, extra, suffix in LEVEL_CONFIGS:
            if wanted is not None and name not in wanted:
                continue
            exp = get_experiment(name)
            base = {k: v for k, v in QUICK.get(name, {}).items() if _has(exp, k)} if quick else {}
            if name == "detection":
                base |= detection_window(topology, pair, quick)
            overrides = {**base, **extra, "level": level}
            n = repeat if repeat is not None else REPEATS[mode] + EXTRA_REPEATS.get(name, 0)
            cfg = Config(name, overrides, n, f"{name}{suffix}-level={level}", cpus=pair)
            cfg.params = exp.resolve(overrides, pair)
            cfg.companions = len(exp.companions(cfg.params))
            out.append(cfg)
    if wanted is None or "spread" in wanted:
        exp = get_experiment("spread")
        nodes = {v.get("node") for v in topology["cpus"].values()}
        counts = sorted({f(len(cpus)) for f in (SPREAD_TASKS if len(nodes) > 1
                                                 else SPREAD_TASKS[:1])}, reverse=True)
        for n_tasks in counts:
            overrides = {"ntasks": n_tasks} | ({"duration": 2.0} if quick else {})
            n = repeat if repeat is not None else REPEATS[mode]
            cfg = Config("spread", overrides, n, f"spread-ntasks={n_tasks}")
            cfg.params = exp.resolve(overrides, cpus)
            out.append(cfg)
    return out


def detection_window(topology: dict, pair: list[int], quick: bool) -> dict:
    """Detection's cut window and duration for a pair: the run lasts past the latest cut by
    twice the slowest check the kernel's parameters allow at the pair's level (busy_factor x
    max_interval ms), at least the plan's own."""
    from harmony.analysis.topology import migration_level

    index, _ = migration_level(pair[-1], pair[0], topology)
    doms = {int(d["index"]): d for d in (topology.get("domains") or {}).get(str(pair[-1]), ())}
    d = doms.get(index) if index is not None else None
    slowest = ((d.get("busy_factor") or 16) * (d.get("max_interval") or 0) / 1000) if d else 0.0
    window = dict(QUICK["detection"]) if quick else {"duration": 4.0, "cut_from_s": 1.0,
                                                      "cut_to_s": 2.0}
    window["duration"] = max(window["duration"], window["cut_to_s"] + 2 * slowest + 0.5)
    return window


def _plan(cpus: list[int], quick: bool, repeat: int | None, experiments: list[str] | None,
          simulated: bool) -> list[Config]:
    from harmony.experiments import CATALOG, get_experiment

    names = [n for n in (list(CATALOG) if experiments is None else experiments)
             if n != "spread"]           # a question of the machine's levels: level_plan
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

    The time left is measured, not assumed: once a run has finished, the wall time per second of
    configured runs so far times the configured seconds left (analysis and set-up included).
    Before that, a run of real time (``realtime``: a capture lasts its configured duration)
    says the configured seconds left, the least it can take; a simulation, whose runs take
    whatever the simulator needs, says nothing yet.

    A runner that makes its captures later than it is given them (a VM's, at its boot) is handed
    this object and numbers the runs as they happen (:meth:`expect`, :meth:`booted`): the time
    left is then measured from the boot's end, not from the start."""

    def __init__(self, total_runs: int, total_s: float, stream=sys.stderr, quiet: bool = False,
                 realtime: bool = True):
        self.total_runs, self.total_s = total_runs, total_s
        self.done_runs, self.done_s = 0, 0.0
        self.stream, self.quiet, self.realtime = stream, quiet, realtime
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self.t_booted: float | None = None
        self.s_booted = 0.0         # configured seconds done when the VM booted

    def expect(self, runs: int, seconds: float) -> None:
        """The runs (and configured seconds) still to come, after those done: a runner's
        captures, companions included, when it makes them (one numbering across its flushes)."""
        self.total_runs, self.total_s = self.done_runs + runs, self.done_s + seconds

    def booted(self) -> None:
        """The runs begin now (a VM's boot is over): the estimate counts from here."""
        self.t_booted, self.s_booted = time.monotonic(), self.done_s

    def left(self, elapsed: float, done_s: float | None = None) -> str:
        """The time left, in words ("" when it cannot be said yet): ``elapsed`` seconds took
        ``done_s`` configured ones (default: all done so far)."""
        rest = max(0.0, self.total_s - self.done_s)
        done_s = self.done_s if done_s is None else done_s
        if done_s > 0:
            return f", ~{elapsed / done_s * rest:.0f} s left"
        return f", at least {rest:.0f} s left" if self.realtime else ""

    def show(self, what: str):
        if self.quiet:
            return
        el = time.monotonic() - self.start
        left = (self.left(el) if self.t_booted is None else
                self.left(time.monotonic() - self.t_booted, self.done_s - self.s_booted))
        line = (f"[{self.done_runs + 1}/{self.total_runs}] {what:<48} elapsed {el:5.0f} s"
                + left)
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


def run_suite(configs: list[Config], cpus: list[int], out: Path, runner, *,
              facts: dict | None = None, seed: int = 0, quiet: bool = False,
              card_note: str | None = None, resume: bool = False,
              until_decided: int | None = None) -> dict:
    """Run every configuration with ``runner`` (see :mod:`harmony.runners`) and write the report.

    ``runner.capture(exp, params, cpus, out, seed)`` records one run (real or simulated) and
    ``runner.analyse(out)`` analyses it. Returns the suite record (also written as suite.json).
    ``resume``: ``out`` holds a suite that was interrupted (:func:`resume_plan` gives its
    configurations): its complete runs are kept as they are, captured ones only analysed.
    ``until_decided``: after the planned runs, configurations whose questions are undecided get
    more runs, up to this many each (:mod:`harmony.decide`).
    """
    from harmony import batch, decide
    from harmony.experiments import get_experiment

    out = Path(out)
    total_runs = sum(c.repeat for c in configs)
    configured = sum(c.configured_s for c in configs)
    record = {"cpus": cpus, "quick": None, "configs": [dataclasses.asdict(c) for c in configs],
              "configured_s": configured, "runner": runner.name, "host": facts or {},
              "card_note": card_note,     # `harmony report SUITE` writes the report with it again
              "seed": seed, "status": "running", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "until_decided": {"max_repeat": until_decided} if until_decided else None}
    if resume:
        before = store.read_json(out / "suite.json")
        record["started_at"] = before.get("started_at")
        record["resumed_at"] = before.get("resumed_at", []) + [time.strftime("%Y-%m-%dT%H:%M:%S%z")]
    progress = Progress(total_runs, configured, quiet=quiet,
                        realtime=getattr(runner, "realtime", True))
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
    failures, batches, drained, grown = [], [], [], []
    opened = False      # out checked and made (or taken up): its suite.json is this suite's
    try:
        # in the try: a stop as the block that wrote suite.json ended left it "running"
        with store.new_run_dir(out):    # a stop before suite.json is written leaves no directory
            opened = True
            store.write_json(out / "suite.json", record)
        with runner:
            since = stops.raised()
            for cfg in configs:
                exp = get_experiment(cfg.experiment)
                try:
                    batch.run_batch(exp, cfg.params, cfg.cpus or cpus, out / cfg.label,
                                    cfg.repeat, runner, seed=seed,
                                    progress=None if later else progress,
                                    draw_first=False, resume=resume)
                    grown.append(decide.Batch(exp, cfg.params, out / cfg.label, cfg.repeat,
                                              cpus=cfg.cpus))
                except (store.RunError, RuntimeError, ValueError) as exc:
                    stop = stops.behind(exc, since)
                    if stop is not None:    # a Ctrl-C's cleanup failed, or a library took it:
                        # still the Ctrl-C
                        stop.add_note(f"then: {exc}")
                        raise stop from None
                    failures.append({"config": cfg.label, "error": str(exc)})
                batches.append(out / cfg.label)
            if later:
                progress.expect(*runner.to_make())
            runner.flush()          # a VM runner boots here, once, for every capture planned
            if until_decided:       # each round: its captures flushed, analysed, cards read
                progress.phase("analysing the planned runs, then runs until decided")
                drained = runner.drain()
                drained += decide.until_decided(grown, cpus, runner, until_decided, seed=seed,
                                                progress=progress, resume=resume)
                total_runs = sum(b.runs for b in grown) + sum(
                    c.repeat for c in configs if all(b.label != c.label for b in grown))
            t_captured = time.monotonic() - t_start
            if runner.analysis != "in line":
                progress.phase(f"analysing {total_runs} runs ({runner.analysis})")
        t_analysed = time.monotonic() - t_start
        progress.phase("policy card and report")
        for b in batches:
            if (b / "batch.json").exists():
                batch.finish_batch(b, figures=False)
        analysed = {r["path"]: r for r in drained + getattr(runner, "results", [])}
        failures += [r for r in analysed.values() if r["status"] != "ok"]
    except BaseException as exc:        # stopped, or failed as a whole: said so, not "running"
        # not through a link new_run_dir refused, nor where a stop as it was made left none
        if opened and (out / "suite.json").exists():
            _mark_incomplete(out, record, exc)
        raise
    finally:
        progress.close()
    wall = time.monotonic() - t_start
    record |= {"status": "complete" if not failures else "incomplete", "failures": failures,
               "captured_s": t_captured, "analysed_s": t_analysed, "wall_s": wall,
               "efficiency": wall / configured if configured else None, "runs": total_runs,
               "analysis": runner.analysis,
               "until_decided": _until_decided_record(until_decided, grown),
               # a kernel under test in a VM: the guest's facts (kernel, scheduler, CPUs)
               "under_test": getattr(runner, "system", None),
               "analysis_overlapped": bool(getattr(runner, "overlap", False))}
    ended = getattr(runner, "schedulers_ended", None)
    if ended:     # a sched_ext scheduler kept loaded across the runs: how it ended
        record["scheduler_ended"] = ended
    sched = scheduler_of_runs(out)    # a sched_ext scheduler the runs had, not the boot's facts
    system = "under_test" if record.get("under_test") else "host"
    if sched and record.get(system):
        record[system] = {**record[system], "scheduler": sched}
    store.write_json(out / "suite.json", record)
    _import_report().write(out, note=card_note)
    record["wall_with_report_s"] = time.monotonic() - t_start
    store.write_json(out / "suite.json", record)
    return record


def _mark_incomplete(out: Path, record: dict, exc: BaseException) -> None:
    """Write suite.json as a suite that ``exc`` ended before its report (``--resume`` goes on);
    a failure to write it (a second stop, a full disk) leaves ``exc`` the error the user sees."""
    from harmony.manifest import reason

    record |= {"status": "incomplete", "incomplete_reason": reason(exc)}
    try:
        store.write_json(out / "suite.json", record)
    except BaseException as also:       # a full disk, a second stop of any kind
        exc.add_note(f"{out / 'suite.json'} still says running: {reason(also)}")


def _until_decided_record(cap: int | None, grown: list) -> dict | None:
    """suite.json's summary of the runs added until decided (None when not asked): the cap, the
    runs added and the rounds, and per configuration its batch.json's record."""
    if not cap:
        return None
    per = {b.label: store.read_json(b.out / "batch.json").get("until_decided") for b in grown}
    return {"max_repeat": cap, "added_runs": sum(b.runs - b.planned for b in grown),
            "rounds": max((b.rounds for b in grown), default=0), "configs": per}


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


def simulate_suite(policy: str, ncpus: int, out: Path, quick: bool = True,
                   repeat: int | None = None, experiments: list[str] | None = None,
                   seed: int = 0, quiet: bool = True, topology: dict | None = None) -> dict:
    """The suite under a reference policy on ``ncpus`` simulated CPUs (no kernel, no root), on
    the machine ``topology`` (:mod:`harmony.analysis.machines`; its CPUs, then) when given,
    with the questions of distance at each of its levels (:func:`level_plan`)."""
    from harmony.runners import SimRunner

    cpus = list(range(len(topology["cpus"]) if topology else ncpus))
    configs = plan(cpus, quick=quick, repeat=repeat, experiments=experiments, simulated=True,
                   topology=topology)
    runner = SimRunner(policy, topology)
    return run_suite(configs, cpus, out, runner, facts={"kernel": "simulated",
                                                        "scheduler": f"reference policy {policy}",
                                                        "ncpus": len(cpus)},
                     seed=seed, quiet=quiet)


def cpu_limits(ncpus: int) -> list[str]:
    """Plain statements of what a CPU set this small cannot answer, and why."""
    out = []
    if ncpus < 3:
        out.append(f"On {ncpus} CPUs the poly-balance (q_src - N/P) and pairwise "
                   "((q_src - q_target)/2) predictions of how-many are the same number, x/2, so "
                   "the suite cannot tell how the scheduler decides how many tasks to move; that "
                   "needs 3 or more CPUs.")
    return out
