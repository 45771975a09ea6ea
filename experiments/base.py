"""What an experiment is: parameters with documented defaults, the tasks it runs, what it measures.

An experiment never touches the kernel itself: it describes tasks
(:class:`harmony.workload.tasks.TaskSpec`) for the controller and turns the reconstructed tables of
a run into metrics and figures.

Its contract is declared, not implied: :attr:`Experiment.params` (:class:`Param`: name, kind,
default, help) are what ``-p KEY=VALUE`` accepts and ``harmony run EXP --help`` lists;
:attr:`Experiment.summary` (:class:`Metric`: name, unit, help, when it may be None) are exactly the
keys its ``analyse`` returns; a run's summary (:meth:`Experiment.summarise`) adds what the policy
cost, the same keys for every experiment (:data:`COST_SUMMARY`); the policy card and ``harmony
compare`` read them all (:attr:`Experiment.declared`).

Every experiment takes, besides its own, the parameters of :data:`COMMON`: the window, the
tasks' scheduling class (``policy``, ``rt_priority``, ``dl_*``; one set per class of tasks in a
two-class experiment, :func:`class_params`), the release (``release``, ``warm_s``) and where on
the machine it runs (``level``: :mod:`harmony.experiments.placement`). The
catalog's release is *warm*, because the thesis's was: its controller created and bound its
processes before t0 and released an imbalance "created instantly rather than slowly accrued"
(6.1), and its run-queue timeline starts with the source's processes already queued there
(figure 6.4, "when the experiment begins at time 24.05 s, Core 1 has a run queue containing eight
processes"). Tasks that ran there reach the balancer with a converged load history; tasks woken
from a sleep (``release=cold``) with a decayed one, which a load-based balancer weighs far lighter
(bench/warm_cold.py measures what that changes).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

from harmony.analysis.causes import CAUSES
from harmony.analysis.cost import cost_summary
from harmony.analysis.topology import counts_by_level, domains_of
from harmony.core.errors import ParameterError
from harmony.experiments.placement import check_placed, level_word
from harmony.workload.tasks import POLICIES, RT_POLICIES, RT_PRIORITY_DEFAULT, class_problem


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter. ``default`` may be a function of the CPU count P (``lambda P: [2 * P]``).
    A default of None means "unset" (another parameter stands in: a two-class experiment's
    ``heavy_policy`` is ``policy`` unless given); it reads and prints as an empty value."""

    name: str
    default: Any
    # "int" | "float" | "str" | "list" (comma-separated ints) | "flist" (comma-separated floats)
    kind: str
    help: str
    check: Callable[[Any], str | None] | None = None  # returns an error message, or None if fine

    def default_for(self, ncpus: int):
        return self.default(ncpus) if callable(self.default) else self.default

    @property
    def scales(self) -> bool:
        """The default is a function of the CPU count P (its help says how)."""
        return callable(self.default)

    def format(self, value) -> str:
        """``value`` as ``-p`` takes it (the inverse of :meth:`parse`): a list as "8,0,0,0"."""
        if isinstance(value, (list, tuple)):
            return ",".join(map(str, value))
        return "" if value is None else str(value)

    def parse(self, text: str):
        if self.default is None and str(text).strip() == "":
            return None
        try:
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                return float(text)
            if self.kind == "list":
                return [int(x) for x in str(text).split(",") if x.strip() != ""]
            if self.kind == "flist":
                return [float(x) for x in str(text).split(",") if x.strip() != ""]
            return str(text)
        except ValueError:
            raise ValueError(f"parameter {self.name}: {text!r} "
                             f"is not a valid {self.kind}") from None


def positive(v) -> str | None:
    return None if v > 0 else "must be positive"


def non_negative(v) -> str | None:
    return None if v >= 0 else "must not be negative"


def percent(v) -> str | None:
    return None if 0 < v <= 100 else "must be in (0, 100]"


def nice_value(v) -> str | None:
    return None if -20 <= v <= 19 else "must be a nice value in -20..19"


def policy_name(v) -> str | None:
    return None if v in POLICIES else f"must be one of {', '.join(POLICIES)}"


def release_kind(v) -> str | None:
    return None if v in RELEASES else f"must be one of {', '.join(RELEASES)}"


#: how the tasks reach t0 (``-p release=``): ``warm``, running confined to their initial CPU for
#: ``warm_s`` until the CPU set is widened at t0 (the thesis's protocol: its tasks were running,
#: bound to their CPU, before it released them, so the balancer met tasks with a load history);
#: ``cold``, asleep at their start gate until t0, woken there (PELT's load of a sleeping task
#: decays, so a load-based balancer sees light tasks at t0). Warm is the catalog's default.
RELEASES = ("warm", "cold")

#: PELT's half-life is 32 periods of 1024 us (32.8 ms); a task's load converges geometrically,
#: to within 1 % of its final value after log2(100) = 6.6 half-lives (218 ms) from any start.
#: 0.25 s (7.6 half-lives, 0.5 %) measured on this host's 6.18 kernel: bench/pelt_warmup.py.
WARM_S = 0.25

#: the scheduling-class parameters of every task class: (name, default, kind, help, check); the
#: help says "{whom}"
CLASS_FIELDS = (
    ("policy", "other", "str", "scheduling class of {whom}: " + ", ".join(POLICIES), policy_name),
    ("rt_priority", 0, "int", "SCHED_FIFO / SCHED_RR priority of {whom}, 1..98 (0 for the other "
     f"classes; fifo and rr without one: {RT_PRIORITY_DEFAULT})", None),
    ("dl_runtime_ms", 0.0, "float", "SCHED_DEADLINE runtime per period of {whom}, ms",
     non_negative),
    ("dl_deadline_ms", 0.0, "float",
     "SCHED_DEADLINE relative deadline of {whom}, ms (0: the period)", non_negative),
    ("dl_period_ms", 0.0, "float", "SCHED_DEADLINE period of {whom}, ms", non_negative),
)

COMMON = (
    Param("duration", 10.0, "float", "seconds measured after t0", positive),
    Param("bin_s", 0.1, "float", "width of the migrations-over-time bins (s)", positive),
    Param("window_s", 0.5, "float", "width of the CPU-allocation windows (s)", positive),
    Param("sample_hz", 10.0, "float",
          "rate of sampling the kernel's own view from /proc during the run (0 = off)",
          non_negative),
    *(Param(name, default, kind, help.format(whom="every task"), check)
      for name, default, kind, help, check in CLASS_FIELDS),
    Param("release", "warm", "str", "warm: the tasks run confined to their initial CPU for "
          "warm_s, then the CPU set is widened at t0 (the thesis's protocol; their load history "
          "has converged); cold: they sleep at their start gate until t0", release_kind),
    Param("warm_s", WARM_S, "float", "how long a warm release runs the tasks confined before t0 "
          "(PELT converges to within 1% in ~0.22 s; not named warmup_s, which intrinsic-imbalance "
          "and heavy-light use for their analysis windows after t0)", positive),
    Param("level", "", "str", "where the target CPU sits relative to the source: smt, llc, "
          "package, node or remote (SMT siblings, one LLC, one package, one node, two nodes), "
          "resolved against the machine's topology into a CPU set of that pair; empty: the CPU "
          "set as given (harmony.experiments.placement)", level_word),
)


#: the common parameters that say how Harmony started and released the tasks, and nothing the
#: analysis reads: a trace recorded elsewhere (``harmony import``) cannot tell them
WORKLOAD_COMMON = frozenset({"sample_hz", "release", "warm_s", "level"}
                            | {name for name, *_ in CLASS_FIELDS})


def class_params(role: str) -> tuple[Param, ...]:
    """The scheduling-class parameters of one task class of a two-class experiment:
    ``<role>_policy``, ``<role>_rt_priority``, ``<role>_dl_*``; default None = the common one
    (``policy``, ``rt_priority``, ...)."""
    return tuple(Param(f"{role}_{name}", None, kind,
                       help.format(whom=f"the {role} tasks") + f"; unset: {name}", check)
                 for name, _, kind, help, check in CLASS_FIELDS)


def task_class(p: dict, role: str | None = None) -> dict:
    """The TaskSpec fields of a task class's scheduling class from resolved parameters ``p``:
    ``<role>_<field>`` where the experiment has it and it is set, else the common ``<field>``."""
    out = {}
    for name, default, _, _, _ in CLASS_FIELDS:
        v = p.get(f"{role}_{name}") if role else None
        out[name] = p.get(name, default) if v is None else v
    return out


def class_defaults(p: dict, roles=(None,)) -> None:
    """Give a fifo or rr task class that has no rt_priority (0, or unset and inheriting 0) the
    default, :data:`~harmony.workload.tasks.RT_PRIORITY_DEFAULT`, in ``p`` (so that the run
    records the priority its tasks had): ``rt_priority``, or a two-class experiment's
    ``<role>_rt_priority`` (the other class may be of a class without priorities)."""
    for role in roles:
        fields = task_class(p, role)
        if fields["policy"] in RT_POLICIES and not fields["rt_priority"]:
            p[f"{role}_rt_priority" if role else "rt_priority"] = RT_PRIORITY_DEFAULT


def class_check(p: dict, roles=(None,), nice: dict | None = None) -> None:
    """Every task class's scheduling class is one a task can be given, and a warm release can
    hold it (ValueError, one line, naming the parameters). ``nice``: role -> its nice value."""
    for role in roles:
        fields = task_class(p, role)
        why = class_problem(**fields, nice=(nice or {}).get(role, 0),
                            prefix=f"{role}_" if role else "")
        if why:
            where = f"{role} tasks: " if role else ""
            raise ValueError(f"{where}{why}")


#: the units a summary key may declare, and the kind of value each holds
UNITS = {
    "s": "float", "ms": "float",                 # seconds / milliseconds (after t0, or spans)
    "1/s": "float", "1/CPU-s": "float",          # per second of the run / per CPU-second run
    "fraction": "float",                         # 0..1 (of a CPU, of the CPUs, of the tasks)
    "ratio": "float",                            # one measure over another (e.g. over fair share)
    "index": "float",                            # a dimensionless index (Jain, spread)
    "%": "float",                                # percent (a CPU demand)
    "tasks": "float",                            # a number of tasks that may be fractional
    "tasks^2": "float",                          # a variance of run-queue lengths
    "count": "int",                              # a number of things (tasks, CPUs, migrations)
    "cpu": "int",                                # a CPU number
    "nice": "int",                               # a nice value
    "bool": "bool",
    "name": "str",                               # a word (a migration kind, a companion's name)
}

_KINDS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}


@dataclasses.dataclass(frozen=True)
class Metric:
    """One key of an experiment's summary (what ``analyse`` returns). ``none_when`` says when the
    value is None (not measurable in that run); without it the value is never None. ``kind``
    ("int", "float", "bool", "str", "dict") defaults to the unit's (:data:`UNITS`)."""

    name: str
    unit: str
    help: str
    none_when: str | None = None
    kind: str = ""

    def __post_init__(self):
        if self.unit not in UNITS and not self.kind:
            raise ValueError(f"summary key {self.name}: unit {self.unit!r} is none of "
                             f"{', '.join(UNITS)} (or give its kind)")
        if not self.kind:
            object.__setattr__(self, "kind", UNITS[self.unit])
        if self.kind not in _KINDS:
            raise ValueError(f"summary key {self.name}: kind {self.kind!r} "
                             f"is none of {', '.join(_KINDS)}")

    def check(self, value) -> str | None:
        """Why ``value`` does not fit this declaration, or None if it does (an int is a float;
        a bool is neither)."""
        if value is None:
            return (None if self.none_when
                    else f"{self.name} is None, which it is declared never to be")
        if (isinstance(value, bool) != (self.kind == "bool")
                or not isinstance(value, _KINDS[self.kind])):
            return f"{self.name} = {value!r} ({type(value).__name__}) is not of kind {self.kind}"
        return None


def pick(metrics: tuple[Metric, ...], *names: str) -> tuple[Metric, ...]:
    """The declarations of ``names`` in ``metrics`` (another experiment's
    :attr:`Experiment.summary`), in that order: for a key two experiments compute alike."""
    by_name = {m.name: m for m in metrics}
    return tuple(by_name[n] for n in names)


#: what the policy cost, in every experiment's summary besides its own keys (issue 29): the
#: migrations by cause (:mod:`harmony.analysis.causes`), the CPU time left idle while work waited,
#: moves undone at once and the distance from the ideal allocation (:mod:`harmony.analysis.cost`)
COST_SUMMARY = (
    *(Metric(f"cause_{c}", "count", f"migrations in the window whose cause is {c} "
                                    "(harmony.analysis.causes)") for c in CAUSES),
    Metric("migrations_inferred", "count", "moves in the window no probe recorded, proved by the "
                                           "tasks' own events (counted in the causes too)"),
    Metric("wasted_cpu_s", "s", "CPU time a CPU of the set sat idle while a task free to run on "
                                "it waited on another (work-conservation invariant)"),
    Metric("wasted_episodes", "count", "such intervals lasting WASTED_EPISODE_MIN_S or longer"),
    Metric("wasted_longest_ms", "ms", "the longest such interval, of any length (0: none)"),
    Metric("wasted_longest", "", "the longest such intervals: {\"episodes\": [{cpu, t (s since "
                                 "t0), ms, waiting (tasks)}, ...]}, longest first", kind="dict"),
    Metric("useless_migrations", "count", "moves undone by a move back within "
                                          "USELESS_MIGRATION_WITHIN_S"),
    Metric("ideal_share_error", "fraction", "mean |share - ideal share| over (window, task): "
                                            "the distance from the GPS allocation"),
    Metric("ideal_jain", "index", "Jain index of share / ideal share over (window, task)",
           none_when="no task was owed a share"),
    Metric("ideal_slowdown_max", "ratio", "largest ideal share / share of a task in a window",
           none_when="no task was owed a share, or one owed a share ran not at all in a window"),
    Metric("migrations_by_level", "", "migrations in the window by the level of the machine "
                                      "they crossed (the lowest scheduling domain of the "
                                      "destination spanning the source: SMT, MC, PKG, NUMA, "
                                      "NUMA2 for a second NUMA level...) and cause: {level: "
                                      "{cause: count}} "
                                      "(harmony.analysis.topology.counts_by_level)",
           none_when="the run read no scheduling domains", kind="dict"),
)


#: what the run did at each level of the machine, in every experiment's summary besides its own
#: keys (issue 45): its moves by the relation of their source and destination CPUs, and the
#: fair class's design's predictions from the kernel's domains against what the run measured
#: (:mod:`harmony.analysis.levels`, :mod:`harmony.analysis.predictions`); both empty for a run
#: recorded without the machine's topology
LEVEL_SUMMARY = (
    Metric("moves_by_relation", "", "the measured window's moves by where their source and "
           "destination sit: {relation (smt, llc, package, node, remote): {moves, per_s, "
           "locality (their share of the moves over the share of the set's CPU pairs at that "
           "relation; None without moves), causes: {cause: moves}}}", kind="dict"),
    Metric("predictions", "", "the kernel's design's predictions checked on this run: {\"rows\": "
           "[{check, level, domain, predicted, measured, holds (None: not checkable here), "
           "tolerance, source}, ...]}", kind="dict"),
)


def policy_cost(run) -> dict:
    """The :data:`COST_SUMMARY` values of a run (a :class:`harmony.store.Run`; its "wasted"
    table if the analysis handed it over, else made here from the events)."""
    m = run.manifest
    cost = cost_summary(run.events, run.tasks, run.migrations, run.allocation, m["cpus"],
                        m["t0_ns"], m["end_ns"], (m.get("sched") or {}).get("rt_share"),
                        wasted=run.held("wasted"))
    levels = (counts_by_level(run.migrations, m["t0_ns"], m["end_ns"]) if domains_of(m)
              and "level" in run.migrations.columns else None)
    return {**cost, "migrations_by_level": levels}


class Experiment:
    """Base class of the catalog. Subclasses set the class attributes and implement the methods."""

    name: str = ""
    question: str = ""
    thesis: str = ""  # where the thesis describes it
    params: tuple[Param, ...] = ()
    summary: tuple[Metric, ...] = ()  # exactly the keys analyse() returns
    #: why the reference policies' simulator cannot run it (None: it can): a workload that is
    #: more than CPU demand, such as the server experiment's requests over sockets
    not_simulated: str | None = None
    #: the experiment's own parameters that only shape its workload (a task's demand, its
    #: nice...), which a trace recorded elsewhere cannot tell (:meth:`workload_params`)
    workload: frozenset[str] = frozenset()
    #: why a trace recorded elsewhere (``harmony import``) cannot be analysed as this experiment
    #: (None: it can): an analysis that tells its tasks apart by the role Harmony gave each
    not_imported: str | None = None
    #: parameters its analysis reads that a trace does not show and no default may stand for
    #: (when the target's load was cut...): an import as this experiment is given each (-p)
    import_needs: frozenset[str] = frozenset()

    def import_problem(self, given) -> str | None:
        """Why a trace cannot be imported as this experiment with the parameters ``given``
        (names): one line, or None when it can (:attr:`not_imported`, :attr:`import_needs`)."""
        if self.not_imported:
            return f"{self.name} cannot be imported: {self.not_imported}"
        missing = sorted(self.import_needs - set(given))
        if not missing:
            return None
        helps = {p.name: p.help.split(";")[0] for p in self.all_params()}
        what = "; ".join(f"{n}, {helps[n]}" for n in missing)
        return (f"{self.name}'s analysis reads what a trace does not show ({what}): give "
                + " ".join(f"-p {n}=..." for n in missing))

    def workload_params(self) -> frozenset[str]:
        """The parameters an imported trace cannot know: how the tasks were started, released
        and what they were asked to do (:data:`WORKLOAD_COMMON` and the experiment's
        ``workload``), as opposed to what the analysis reads (duration, bins, tolerance)."""
        return WORKLOAD_COMMON | self.workload

    def from_layout(self, placed: list[int], cpus: list[int]) -> dict[str, Any]:
        """The parameters the layout of an imported trace shows (``harmony import``): ``placed``
        holds the chosen tasks on each CPU of ``cpus`` at t0. A parameter mapped to None shapes
        the layout, and this trace's layout is not of the shape the experiment places (sources
        of unequal counts, say): it is not known, and the run does not list it. The default: an
        experiment's ``layout`` (the counts themselves); the others say what their layout shows
        (how-many: ``x`` and ``base``)."""
        return {"layout": list(placed)} if "layout" in {p.name for p in self.params} else {}

    def all_params(self) -> tuple[Param, ...]:
        own = {p.name for p in self.params}
        return tuple(p for p in COMMON if p.name not in own) + self.params

    def resolve(self, overrides: dict[str, Any], cpus: list[int]) -> dict:
        """Defaults for this CPU set, with ``overrides`` (strings or values) applied and checked.

        Raises ParameterError (a ValueError) with a one-line message for an unknown or bad
        parameter.
        """
        try:
            return self._resolve(overrides, cpus)
        except ParameterError:
            raise
        except ValueError as exc:   # a parse, a check or validate(): the one error class
            raise ParameterError(str(exc)) from None

    def _resolve(self, overrides: dict[str, Any], cpus: list[int]) -> dict:
        known = {p.name: p for p in self.all_params()}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"{self.name} has no parameter {', '.join(unknown)} "
                             f"(it has: {', '.join(sorted(known))})")
        values = {}
        for name, p in known.items():
            v = overrides.get(name, p.default_for(len(cpus)))
            if isinstance(v, str) and p.kind != "str":
                v = p.parse(v)
            items = v if isinstance(v, list) else [v]
            if p.kind in ("float", "flist") and v is not None:
                for item in items:    # inf would pass "positive" and run forever
                    if not math.isfinite(item):
                        raise ValueError(f"parameter {name}={item}: must be a finite number")
            if p.check is not None and v is not None:
                for item in items:
                    err = p.check(item)
                    if err:
                        raise ValueError(f"parameter {name}={item}: {err}")
            values[name] = v
        class_defaults(values, self.class_roles)
        check_placed(values.get("level") or "", cpus)
        self.validate(values, cpus)
        self.check_classes(values)
        return values

    def validate(self, p: dict, cpus: list[int]) -> None:
        """Cross-parameter checks (ValueError, one line)."""

    #: the task classes whose scheduling class has its own parameters (``<role>_policy``...);
    #: (None,) = one class for every task, the common ``policy``, ``rt_priority``...
    class_roles: tuple = (None,)

    def check_classes(self, p: dict) -> None:
        """Each task class's scheduling class and its parameters (:func:`class_check`); nice
        values the experiment gives its classes must fit their class."""
        class_check(p, self.class_roles, self.class_nice(p))

    def class_nice(self, p: dict) -> dict:
        """Role (None: every task) -> the nice value the experiment gives that class's tasks."""
        return {None: p.get("nice", 0)}

    def tasks(self, p: dict, cpus: list[int]) -> list:
        """The TaskSpecs of one run."""
        raise NotImplementedError

    def suite_points(self, ncpus: int, quick: bool) -> list[dict] | None:
        """The suite's configurations of this experiment when they vary in several parameters at
        once: a list of overrides, each a configuration labelled by all its values (None: the
        suite's own sweep, if any, harmony.suite.SWEEPS)."""
        return None

    def place(self, specs: list, run_dir: Path, params: dict, cpus: list[int]) -> tuple[list, dict]:
        """The tasks of a run about to be captured into ``run_dir`` on ``cpus``, its directory
        made, and the parameters the run settles only now, where it is captured (on the host or
        in a VM's guest agent), to be recorded with the others (default: ``specs`` as they are,
        nothing settled). Tasks that keep records of their own (the server experiment's
        requests) are told here where, and what they share is made there (its pipes); the
        server's capacity is measured here."""
        return specs, {}

    def draw(self, p: dict, cpus: list[int], seed: int) -> dict[str, Any]:
        """Random choices of one run (e.g. a random cut time), drawn from the run's ``seed``.

        ``harmony.run.capture`` merges the returned parameters into ``p`` before :meth:`tasks`, so
        they are recorded in the manifest and ``--param`` can replay them. Default: none.
        """
        return {}

    def companions(self, p: dict) -> dict[str, dict[str, Any]]:
        """Paired runs this run is compared with: name -> parameter overrides (default none).

        ``harmony.run.execute`` captures each companion first, into ``<run_dir>/<name>/``, as a run
        of this same experiment with ``p`` updated by the overrides (e.g. ``{"static": {"static":
        1}}`` for a static-ideal placement); ``analyse`` reads it with ``run.companion(name)``.
        """
        return {}

    def analyse(self, run) -> dict:
        """Metrics of one run (JSON-serialisable) from its tables (a :class:`harmony.store.Run`):
        one value for each key :attr:`summary` declares, and no other."""
        raise NotImplementedError

    @property
    def declared(self) -> tuple[Metric, ...]:
        """Every key of a run's summary: the experiment's own (:attr:`summary`), then what the
        policy cost (:data:`COST_SUMMARY`) and what it did by level (:data:`LEVEL_SUMMARY`)."""
        return self.summary + COST_SUMMARY + LEVEL_SUMMARY

    def summarise(self, run) -> dict:
        """A run's summary: :meth:`analyse`'s keys, then :func:`policy_cost`'s, then
        :func:`harmony.analysis.predictions.level_summary`'s."""
        from harmony.analysis.predictions import level_summary

        return {**self.analyse(run), **policy_cost(run), **level_summary(run)}

    def summary_problems(self, summary: dict) -> list[str]:
        """How ``summary`` (what :meth:`summarise` returned) departs from :attr:`declared`: keys
        missing or not declared, values not of the declared kind, None where it is declared never
        to be. [] when it fits."""
        declared = {m.name: m for m in self.declared}
        out = [f"{self.name}: {k} is declared but missing" for k in declared if k not in summary]
        out += [f"{self.name}: {k} is not declared" for k in summary if k not in declared]
        out += [f"{self.name}: {err}" for k, v in summary.items() if k in declared
                for err in [declared[k].check(v)] if err]
        return out

    def plot(self, run, fig_dir: Path) -> list[Path]:
        """Write this experiment's figures; return their paths."""
        return []

    def describe(self, summary: dict) -> list[str]:
        """Readable lines for the terminal and report.md, from ``analyse``'s output."""
        return [f"{k}: {v}" for k, v in summary.items()]
