"""Task specs: what one synthetic worker does. Shared by the workload controller and the simulator.

A task's scheduling class is part of its spec (``policy`` and its parameters): the worker puts
itself in it before it sleeps at its start gate (:mod:`harmony.workload.worker`), the analysis
computes its fair share by the class's own rule
(:func:`harmony.analysis.reconstruct.class_fair_shares`) and the policy card says which class(es) it
describes (:func:`class_label`, :func:`sched_classes`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harmony.core.columns import Table

if TYPE_CHECKING:
    import pandas as pd

ROLES = ("cpu", "heavy", "light", "high", "low", "target")

#: the scheduling classes a task may be given (-p policy=...), and the kernel's name of each
POLICIES = {"other": "SCHED_OTHER", "batch": "SCHED_BATCH", "idle": "SCHED_IDLE",
            "fifo": "SCHED_FIFO", "rr": "SCHED_RR", "deadline": "SCHED_DEADLINE"}
#: the fair classes: balanced by load, shared by weight; nice applies to other and batch only
FAIR_POLICIES = ("other", "batch", "idle")
RT_POLICIES = ("fifo", "rr")
#: the highest rt_priority a task may have: the controller, its occupiers and its threads run one
#: above the highest task's (harmony.workload.controller.fifo_priority) -- a task at the
#: controller's own priority starves it on a CPU it holds (measured: a SCHED_FIFO 50 controller
#: never returned from a 3 s sleep while a SCHED_FIFO 50 busy loop ran)
RT_PRIORITY_MAX = 98
#: the rt_priority a fifo or rr task class gets when none is given (``-p policy=fifo`` alone): the
#: middle of 1..RT_PRIORITY_MAX, the value the kernel's own threaded IRQ handlers run at
#: (MAX_RT_PRIO / 2), so that a task class above or below the default can be asked for either side
RT_PRIORITY_DEFAULT = 50
#: the kernel's limits on a SCHED_DEADLINE runtime (1 << DL_SCALE ns) and period
#: (sched_deadline_period_{min,max}_us, default 100 us .. 4 s)
DL_RUNTIME_MIN_MS = 1024 / 1e6


def class_problem(policy: str, rt_priority: int = 0, nice: int = 0, dl_runtime_ms: float = 0.0,
                  dl_deadline_ms: float = 0.0, dl_period_ms: float = 0.0,
                  prefix: str = "") -> str | None:
    """Why this scheduling class and its parameters cannot be given to a task (one line), or None.
    The one rule, for :class:`TaskSpec` and the experiments' parameter checks; ``prefix``: what
    the parameters of this task class begin with (``heavy_``), to name them as ``-p`` takes them."""
    if policy not in POLICIES:
        return f"policy {policy!r} is none of {', '.join(POLICIES)}"
    if policy in RT_POLICIES:
        if not 1 <= rt_priority <= RT_PRIORITY_MAX:
            return (f"rt_priority={rt_priority}: {policy} needs 1..{RT_PRIORITY_MAX} (99 is left "
                    "to Harmony's controller, which must run above the tasks to end the window)")
    elif rt_priority:
        return f"rt_priority={rt_priority} applies to fifo and rr only, not to {policy}"
    if nice and policy not in ("other", "batch"):
        return f"nice={nice} applies to other and batch only, not to {policy}"
    dl = (dl_runtime_ms, dl_deadline_ms, dl_period_ms)
    if policy != "deadline":
        if any(dl):
            return ("dl_runtime_ms / dl_deadline_ms / dl_period_ms apply to deadline only, "
                    f"not to {policy}")
        return None
    if any(v < 0 for v in dl):
        return "deadline: dl_runtime_ms, dl_deadline_ms and dl_period_ms must not be negative"
    if not dl_runtime_ms or not dl_period_ms:
        # no default: a deadline task's share of a CPU is its bandwidth, which is the question
        return (f"deadline has no default bandwidth: add -p {prefix}dl_runtime_ms=MS -p "
                f"{prefix}dl_period_ms=MS (e.g. 10 and 100: 10 % of a CPU a task; "
                f"{prefix}dl_deadline_ms defaults to the period)")
    deadline = dl_deadline_ms or dl_period_ms
    if dl_runtime_ms < DL_RUNTIME_MIN_MS:
        return (f"deadline: dl_runtime_ms={dl_runtime_ms:g} is below the kernel's minimum "
                f"{DL_RUNTIME_MIN_MS} ms")
    if not dl_runtime_ms <= deadline <= dl_period_ms:
        return (f"deadline needs runtime <= deadline <= period, got {dl_runtime_ms:g} / "
                f"{deadline:g} / {dl_period_ms:g} ms")
    return None


def class_label(policy: str = "other", rt_priority: int = 0, dl_runtime_ms: float = 0.0,
                dl_deadline_ms: float = 0.0, dl_period_ms: float = 0.0, **_) -> str:
    """A class as the card and the report say it: "SCHED_OTHER", "SCHED_FIFO 50",
    "SCHED_DEADLINE 10/100/100 ms" (runtime/deadline/period). Other keyword arguments (a spec's
    other fields, a tasks table row) are ignored."""
    name = POLICIES.get(policy, str(policy))
    if policy in RT_POLICIES:
        return f"{name} {rt_priority}"
    if policy == "deadline":
        return f"{name} {dl_runtime_ms:g}/{dl_deadline_ms or dl_period_ms:g}/{dl_period_ms:g} ms"
    return name


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
    policy:       scheduling class, one of :data:`POLICIES` (other = SCHED_OTHER, the fair class)
    rt_priority:  SCHED_FIFO / SCHED_RR priority (1..RT_PRIORITY_MAX), 0 for the other classes
    dl_runtime_ms / dl_deadline_ms / dl_period_ms: SCHED_DEADLINE's parameters (0 otherwise;
                  deadline 0 = the period): the task may run ``dl_runtime_ms`` in every period
    serve:        "" for the duty-cycle loop; else the JSON of a server-shaped task's part (a
                  client, a connection's server, a stage's pool worker...:
                  :mod:`harmony.workload.serve`), which it runs from its release instead of the loop
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
    policy: str = "other"
    rt_priority: int = 0
    dl_runtime_ms: float = 0.0
    dl_deadline_ms: float = 0.0
    dl_period_ms: float = 0.0
    serve: str = ""

    def __post_init__(self):
        if not 0 < self.duty <= 100:
            raise ValueError(f"task {self.name}: duty must be in (0, 100], got {self.duty}")
        if not 0 <= self.cut_duty <= 100:
            raise ValueError(f"task {self.name}: cut duty must be in [0, 100], got {self.cut_duty}")
        if not -20 <= self.nice <= 19:
            raise ValueError(f"task {self.name}: nice must be in -20..19, got {self.nice}")
        if self.period_ms <= 0:
            raise ValueError(f"task {self.name}: period must be positive, got {self.period_ms} ms")
        why = class_problem(self.policy, self.rt_priority, self.nice, self.dl_runtime_ms,
                            self.dl_deadline_ms, self.dl_period_ms)
        if why:
            raise ValueError(f"task {self.name}: {why}")
        if self.policy == "deadline" and not self.dl_deadline_ms:
            object.__setattr__(self, "dl_deadline_ms", self.dl_period_ms)

    @property
    def label(self) -> str:
        """Its scheduling class as the card says it (:func:`class_label`)."""
        # its fields named, not dataclasses.asdict (a deep copy of every field: 2 ms a task in a
        # TCG guest, where a run's manifest names the class of each of up to 88 tasks)
        return class_label(self.policy, self.rt_priority, self.dl_runtime_ms,
                           self.dl_deadline_ms, self.dl_period_ms)

    @property
    def dl_bandwidth(self) -> float:
        """The share of one CPU SCHED_DEADLINE reserves for it (runtime / period; 0 for the
        other classes)."""
        return self.dl_runtime_ms / self.dl_period_ms if self.policy == "deadline" else 0.0

    @property
    def comm(self) -> str:
        return ("hmy-" + self.name)[:15]


def layout_tasks(layout: list[int], cpus: list[int], **spec) -> list[TaskSpec]:
    """Tasks for a layout such as [8, 0]: layout[i] tasks start on cpus[i].
    Names are w00, w01, ..."""
    if len(layout) > len(cpus):
        raise ValueError(f"layout has {len(layout)} entries but the CPU set has only "
                         f"{len(cpus)} CPUs")
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
    ("policy",        "str",              "scheduling class: one of POLICIES (the class "
                                          "columns are missing from a tasks table recorded before "
                                          "classes existed: read them as other)"),
    ("rt_priority",   "int64",            "SCHED_FIFO / SCHED_RR priority; 0 for the other "
                                          "classes"),
    ("dl_runtime_ms", "float64",          "SCHED_DEADLINE runtime per period (ms); 0 otherwise"),
    ("dl_deadline_ms", "float64",         "SCHED_DEADLINE relative deadline (ms); 0 otherwise"),
    ("dl_period_ms",  "float64",          "SCHED_DEADLINE period (ms); 0 otherwise"),
    ("serve",         "str",              'its part in a server-shaped workload (JSON, '
                                          'harmony.workload.serve); "" for the duty-cycle loop '
                                          "(missing from a tasks table recorded before the "
                                          "server experiment: read it as \"\")"),
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
    # pandas here, not at the top: the guest agent (harmony.vm.guest) keeps the rows,
    # loads no pandas
    import pandas as pd

    df = pd.DataFrame([tuple(r[1:]) for r in rows], columns=list(TASKS.names[1:]))
    df.insert(0, "pid", pd.array([r[0] for r in rows], dtype="int32"))
    return df


def sched_classes(specs: list[TaskSpec]) -> dict[str, str]:
    """Role -> scheduling class of a run's tasks (:func:`class_label`), as the manifest records
    it (``sched_classes``): {"cpu": "SCHED_OTHER"}, {"heavy": "SCHED_FIFO 50", "light":
    "SCHED_OTHER"}. A role whose tasks are in several classes lists them joined by " + "."""
    out: dict[str, list[str]] = {}
    for s in specs:
        labels = out.setdefault(s.role, [])
        if s.label not in labels:
            labels.append(s.label)
    return {role: " + ".join(labels) for role, labels in out.items()}


def class_counts(tasks: pd.DataFrame) -> dict[str, int]:
    """Scheduling class (:func:`class_label`) -> number of tasks, from a tasks table (one that
    predates the classes: all SCHED_OTHER), in the order of the table."""
    fields = ("policy", "rt_priority", "dl_runtime_ms", "dl_deadline_ms", "dl_period_ms")
    have = [f for f in fields if f in tasks.columns]
    out: dict[str, int] = {}
    for row in tasks[have].itertuples(index=False):
        label = class_label(**dict(zip(have, row)))
        out[label] = out.get(label, 0) + 1
    return out if len(tasks) else {}


def classes_text(classes: dict[str, str] | None) -> str | None:
    """A run's ``sched_classes`` in a few words, or None when every task is SCHED_OTHER (or the
    run predates the classes): "SCHED_FIFO 50", "heavy SCHED_FIFO 50, light SCHED_OTHER"."""
    if not classes or set(classes.values()) == {POLICIES["other"]}:
        return None
    if len(set(classes.values())) == 1:
        return next(iter(classes.values()))
    return ", ".join(f"{role} {label}" for role, label in classes.items())


def tasks_frame(specs: list[TaskSpec], pids: list[int] | None = None) -> pd.DataFrame:
    """The ``tasks`` table of a run (:data:`TASKS`): one row per task, its spec's fields and pid
    (-1 if not started)."""
    return tasks_from_rows(task_rows(specs, pids))
