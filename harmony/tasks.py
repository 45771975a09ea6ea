"""Task specs: what one synthetic worker does. Shared by the workload controller and the simulator."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harmony.columns import Table

if TYPE_CHECKING:
    import pandas as pd

ROLES = ("cpu", "heavy", "light", "high", "low", "target")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One experiment task.

    name:         unique label, also the worker's comm (``hmy-<name>``, at most 15 bytes)
    role:         what the experiment calls it (cpu, heavy, light, high, low, target)
    duty:         CPU demand in percent, 100 = always runnable; below 100 the task runs and sleeps
                  in randomised periods whose mean run fraction is ``duty``
    period_ms:    mean length of one run+sleep period for duty < 100
    nice:         nice value (-20..19)
    initial_cpu:  CPU the task is pinned to until t0 (it is released to the whole CPU set at t0)
    stop_after_s: the task exits this many seconds after t0 (None = runs until the end)
    cut_duty_at_s / cut_duty: at that time after t0 the task's duty changes to ``cut_duty``
                  (0 = it blocks for the rest of the run); None = never
    pinned:       stays pinned to ``initial_cpu`` after t0 (static-ideal placements), instead of
                  being released to the whole CPU set
    """

    name: str
    role: str = "cpu"
    duty: float = 100.0
    period_ms: float = 10.0
    nice: int = 0
    initial_cpu: int = 0
    stop_after_s: float | None = None
    cut_duty_at_s: float | None = None
    cut_duty: float = 0.0
    pinned: bool = False

    def __post_init__(self):
        if not 0 < self.duty <= 100:
            raise ValueError(f"task {self.name}: duty must be in (0, 100], got {self.duty}")
        if not 0 <= self.cut_duty <= 100:
            raise ValueError(f"task {self.name}: cut duty must be in [0, 100], got {self.cut_duty}")
        if not -20 <= self.nice <= 19:
            raise ValueError(f"task {self.name}: nice must be in -20..19, got {self.nice}")
        if self.period_ms <= 0:
            raise ValueError(f"task {self.name}: period must be positive, got {self.period_ms} ms")

    @property
    def comm(self) -> str:
        return ("hmy-" + self.name)[:15]


def layout_tasks(layout: list[int], cpus: list[int], **spec) -> list[TaskSpec]:
    """Tasks for a layout such as [8, 0]: layout[i] tasks start on cpus[i]. Names are w00, w01, ..."""
    if len(layout) > len(cpus):
        raise ValueError(f"layout has {len(layout)} entries but the CPU set has only {len(cpus)} CPUs")
    out, k = [], 0
    for cpu, count in zip(cpus, layout):
        for _ in range(count):
            out.append(TaskSpec(name=f"w{k:02d}", initial_cpu=cpu, **spec))
            k += 1
    return out


#: The ``tasks`` table of a run (tasks.parquet): ``pid``, then :class:`TaskSpec`'s fields, then
#: ``comm``. The two optional times are float64 where a task has one, else object (all None).
TASKS = Table("tasks", "one row per experiment task, in the experiment's order", [
    ("pid",           "int32",            "the worker's pid; -1 if it was not started"),
    ("name",          "str",              "unique label (TaskSpec.name)"),
    ("role",          "str",              "what the experiment calls it: one of ROLES"),
    ("duty",          "float64",          "CPU demand in percent, 100 = always runnable"),
    ("period_ms",     "float64",          "mean length of one run+sleep period for duty < 100"),
    ("nice",          "int64",            "nice value (-20..19)"),
    ("initial_cpu",   "int64",            "CPU it is pinned to until t0"),
    ("stop_after_s",  "float64 | object", "it exits this many s after t0; NaN or None: never"),
    ("cut_duty_at_s", "float64 | object", "its duty changes to cut_duty this many s after t0; "
                                          "NaN or None: never"),
    ("cut_duty",      "float64",          "its duty from cut_duty_at_s on (0: it blocks)"),
    ("pinned",        "bool",             "stays pinned to initial_cpu after t0"),
    ("comm",          "str",              "its command name (TaskSpec.comm; an imported run's: "
                                          "the traced task's comm)"),
])


def task_rows(specs: list[TaskSpec], pids: list[int] | None = None) -> list[tuple]:
    """The rows of the ``tasks`` table (:data:`TASKS`), as plain tuples in the declared column
    order: each task's pid (-1 if not started), its spec's fields and comm."""
    pids = pids if pids is not None else [-1] * len(specs)
    return [(int(pid), *dataclasses.astuple(s), s.comm) for pid, s in zip(pids, specs)]


def tasks_from_rows(rows: list) -> pd.DataFrame:
    """The ``tasks`` table (:data:`TASKS`) of :func:`task_rows`' rows (or the same read back from
    JSON, as lists: a run captured in a virtual machine)."""
    # pandas here, not at the top: the guest agent (harmony.guest) keeps the rows, loads no pandas
    import pandas as pd

    df = pd.DataFrame([tuple(r[1:]) for r in rows], columns=list(TASKS.names[1:]))
    df.insert(0, "pid", pd.array([r[0] for r in rows], dtype="int32"))
    return df


def tasks_frame(specs: list[TaskSpec], pids: list[int] | None = None) -> pd.DataFrame:
    """The ``tasks`` table of a run (:data:`TASKS`): one row per task, its spec's fields and pid
    (-1 if not started)."""
    return tasks_from_rows(task_rows(specs, pids))
