"""What an experiment is: parameters with documented defaults, the tasks it runs, what it measures.

An experiment never touches the kernel itself: it describes tasks (:class:`harmony.tasks.TaskSpec`)
for the controller and turns the reconstructed tables of a run into metrics and figures.

Its contract is declared, not implied: :attr:`Experiment.params` (:class:`Param`: name, kind,
default, help) are what ``-p KEY=VALUE`` accepts and ``harmony run EXP --help`` lists;
:attr:`Experiment.summary` (:class:`Metric`: name, unit, help, when it may be None) are exactly the
keys its ``analyse`` returns, the ones the policy card and ``harmony compare`` read.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

from harmony.errors import ParameterError


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter. ``default`` may be a function of the CPU count P (``lambda P: [2 * P]``)."""

    name: str
    default: Any
    kind: str  # "int" | "float" | "str" | "list" (comma-separated ints) | "flist" (comma-separated floats)
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
        return str(value)

    def parse(self, text: str):
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
            raise ValueError(f"parameter {self.name}: {text!r} is not a valid {self.kind}") from None


def positive(v) -> str | None:
    return None if v > 0 else "must be positive"


def non_negative(v) -> str | None:
    return None if v >= 0 else "must not be negative"


def percent(v) -> str | None:
    return None if 0 < v <= 100 else "must be in (0, 100]"


def nice_value(v) -> str | None:
    return None if -20 <= v <= 19 else "must be a nice value in -20..19"


COMMON = (
    Param("duration", 10.0, "float", "seconds measured after t0", positive),
    Param("bin_s", 0.1, "float", "width of the migrations-over-time bins (s)", positive),
    Param("window_s", 0.5, "float", "width of the CPU-allocation windows (s)", positive),
    Param("sample_hz", 10.0, "float",
          "rate of sampling the kernel's own view from /proc during the run (0 = off)", non_negative),
)


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
            raise ValueError(f"summary key {self.name}: kind {self.kind!r} is none of {', '.join(_KINDS)}")

    def check(self, value) -> str | None:
        """Why ``value`` does not fit this declaration, or None if it does (an int is a float;
        a bool is neither)."""
        if value is None:
            return None if self.none_when else f"{self.name} is None, which it is declared never to be"
        if isinstance(value, bool) != (self.kind == "bool") or not isinstance(value, _KINDS[self.kind]):
            return f"{self.name} = {value!r} ({type(value).__name__}) is not of kind {self.kind}"
        return None


def pick(metrics: tuple[Metric, ...], *names: str) -> tuple[Metric, ...]:
    """The declarations of ``names`` in ``metrics`` (another experiment's :attr:`Experiment.summary`),
    in that order: for a key two experiments compute alike."""
    by_name = {m.name: m for m in metrics}
    return tuple(by_name[n] for n in names)


class Experiment:
    """Base class of the catalog. Subclasses set the class attributes and implement the methods."""

    name: str = ""
    question: str = ""
    thesis: str = ""  # where the thesis describes it
    params: tuple[Param, ...] = ()
    summary: tuple[Metric, ...] = ()  # exactly the keys analyse() returns

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
            if p.kind in ("float", "flist"):
                for item in items:    # inf would pass "positive" and run forever
                    if not math.isfinite(item):
                        raise ValueError(f"parameter {name}={item}: must be a finite number")
            if p.check is not None:
                for item in items:
                    err = p.check(item)
                    if err:
                        raise ValueError(f"parameter {name}={item}: {err}")
            values[name] = v
        self.validate(values, cpus)
        return values

    def validate(self, p: dict, cpus: list[int]) -> None:
        """Cross-parameter checks (ValueError, one line)."""

    def tasks(self, p: dict, cpus: list[int]) -> list:
        """The TaskSpecs of one run."""
        raise NotImplementedError

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

    def summary_problems(self, summary: dict) -> list[str]:
        """How ``summary`` (what :meth:`analyse` returned) departs from :attr:`summary`: keys
        missing or not declared, values not of the declared kind, None where it is declared never
        to be. [] when it fits."""
        declared = {m.name: m for m in self.summary}
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
