"""A matrix: kernels x schedulers x topologies x (a suite or some experiments) x repetitions, as
data, each of its cells what one boot or one host suite runs.

A plan is TOML (:func:`load_plan`; stdlib ``tomllib``). Its top-level keys are the defaults of
every group; each ``[[matrix]]`` table is a group whose cells are the product of its
``kernels``, ``schedulers`` and ``topologies``::

    name = "cfs-vs-eevdf"       # the matrix's name (default: the file's stem)
    suite = "quick"             # "quick" or "full": the suite's plan (harmony.suite.plan)
    experiments = ["how-many"]  # only these experiments of it (default: the whole catalog)
    repeat = 2                  # runs per configuration (default: the suite's)
    until_decided = false       # then more runs until each question is decided (harmony.decide)
    max_repeat = 8              # ... at most this many a configuration
    seed = 0
    [params]                    # experiment parameters, wherever an experiment has them
    duration = 1.0

    [[matrix]]
    kernels = ["simulated"]                     # the reference policies' simulator
    schedulers = ["poly-balance", "pairwise-random"]
    topologies = [4, "2llc"]                    # CPUs, or a machine's shape

    [[matrix]]
    kernels = ["debian:6.1", "debian:6.12"]     # a kernel under test in a VM
    schedulers = ["default"]                    # or "class:batch", "scx:simple"
    topologies = [2]                            # its vCPUs

A kernel is ``simulated`` (schedulers: reference policies, topologies: a CPU count or a
machine's shape of :mod:`harmony.analysis.machines`), ``host`` (this host's running kernel;
topologies: ``all``, a CPU count or a CPU list) or a kernel under test in a VM
(:mod:`harmony.vm.kernels`: a name or an image's path; topologies: vCPU counts). A real
scheduler is ``default`` (the kernel's own, tasks in SCHED_OTHER), ``class:NAME`` (every task in
that scheduling class: ``-p policy=NAME``) or ``scx:NAME`` (a sched_ext scheduler,
:mod:`harmony.vm.scx`).

The plan is checked whole before anything starts (:func:`parse_plan`): every bad cell is one line
of the :class:`PlanError`. What depends on the host that runs a cell (root, CPUs online, a
kernel with sched_ext, QEMU) is checked there, before the cell starts (:func:`preflight`).

A cell's directory is a suite directory (``harmony report``, ``infer`` and ``compare`` read it
as one) with ``cell.json``: the cell, its status and wall time, where it ran and that host's
doctor facts. The matrix directory::

    matrix.json                the plan's cells, each one's state, the failures and their reasons
    cells/<cell>/              one suite directory per finished cell, moved in whole (a rename)
    .partial/<cell>/           a cell being made here, or left interrupted or failed mid-way
                               (what it collected, resumed by --resume; gone once moved in)
    .incoming/<cell>/          a cell's archive from a cluster being unpacked (then moved in)
    report.md  report.json     the cards of every cell side by side (harmony.matrix_report)

:func:`run_local` runs the cells one after another on this host (``resume``: the complete cells
are kept, the others resumed: :func:`take_up`); :mod:`harmony.matrix_dask` runs them on a Dask
cluster.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import socket
import sys
import time
import tomllib
from pathlib import Path

from harmony import store
from harmony.core import stops
from harmony.core.errors import HarmonyError, ParameterError
from harmony.core.wording import plural

SIMULATED, HOST, VM = "simulated", "host", "vm"
#: the keys a plan (top level) and each of its groups may have
GROUP_KEYS = {"kernels", "schedulers", "topologies"}
DEFAULT_KEYS = {"suite", "experiments", "repeat", "until_decided", "max_repeat", "seed",
                "params", "probe"}
TOP_KEYS = DEFAULT_KEYS | {"name", "matrix"}
CELL_FILE, MATRIX_FILE = "cell.json", "matrix.json"
#: cells being made or left unfinished here; cells' archives being unpacked (a cluster's)
PARTIAL, INCOMING = ".partial", ".incoming"


class PlanError(ParameterError):
    """A plan that cannot run: the file, or one line per bad cell."""


class CellError(HarmonyError):
    """A cell that cannot run on the host given it (one line: why)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One cell of the matrix: what one boot (a VM), one host suite or one simulated suite
    runs."""

    kernel: str
    scheduler: str
    topology: int | str
    suite: str = "quick"
    experiments: tuple[str, ...] = ()
    repeat: int | None = None
    until_decided: bool = False
    max_repeat: int | None = None
    seed: int = 0
    params: tuple[tuple[str, object], ...] = ()
    probe: str = "tracefs"

    @property
    def kind(self) -> str:
        return SIMULATED if self.kernel == SIMULATED else HOST if self.kernel == HOST else VM

    @property
    def id(self) -> str:
        """The cell's name and directory: kernel-scheduler-topology, in file-name characters."""
        kernel = Path(self.kernel).name if "/" in self.kernel else self.kernel
        raw = f"{kernel}-{self.scheduler}-{self.topology}"
        return re.sub(r"[^A-Za-z0-9.=+-]+", "_", raw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["experiments"] = list(self.experiments)
        d["params"] = dict(self.params)
        return {"id": self.id, "kind": self.kind, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["experiments"] = tuple(kw.get("experiments") or ())
        kw["params"] = tuple(sorted((kw.get("params") or {}).items()))
        return cls(**kw)


@dataclasses.dataclass
class Plan:
    """A checked plan: its name, its cells in order, the file it came from."""

    name: str
    cells: list[Cell]
    source: str | None = None

    def df_cells(self):
        """The cells as a tidy DataFrame, one row per cell. Columns: cell (its id), kind
        (simulated | host | vm), kernel, scheduler, topology (str), suite (quick | full),
        experiments (comma-separated, "" = the catalog), repeat (0 = the suite's), until_decided,
        max_repeat (0 = none), seed."""
        import pandas as pd

        rows = [(c.id, c.kind, c.kernel, c.scheduler, str(c.topology), c.suite,
                 ",".join(c.experiments), c.repeat or 0, c.until_decided, c.max_repeat or 0,
                 c.seed) for c in self.cells]
        cols = ["cell", "kind", "kernel", "scheduler", "topology", "suite", "experiments",
                "repeat", "until_decided", "max_repeat", "seed"]
        return pd.DataFrame(rows, columns=cols).astype(
            {"repeat": "int64", "max_repeat": "int64", "seed": "int64", "until_decided": bool})

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source,
                "cells": [c.to_dict() for c in self.cells]}


# --- the plan, checked whole ---------------------------------------------------------------------

def load_plan(path) -> Plan:
    """The plan in the TOML file ``path``, checked whole (:func:`parse_plan`); PlanError naming
    the file when it is missing, not TOML or holds bad cells."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{path}: not a TOML plan ({exc})") from None
    return parse_plan(data, name=path.stem, source=str(path))


def parse_plan(data: dict, name: str = "matrix", source: str | None = None) -> Plan:
    """The cells of the plan ``data`` (a parsed TOML document), each checked
    (:func:`check_cell`); PlanError with one line per problem (an unknown key, a bad group, a bad
    or repeated cell) when there is any."""
    where = source or "the plan"
    problems = [f"unknown key {k!r} (known: {', '.join(sorted(TOP_KEYS))})"
                for k in data if k not in TOP_KEYS]
    groups = data.get("matrix")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        problems.append("no [[matrix]] group: each names kernels, schedulers and topologies")
        groups = []
    defaults = {k: v for k, v in data.items() if k in DEFAULT_KEYS}
    cells: list[Cell] = []
    seen: dict[str, int] = {}
    for i, group in enumerate(groups, 1):
        made, bad = _group_cells(i, group, defaults)
        problems += bad
        for cell in made:
            why = check_cell(cell)
            if why:
                problems.append(f"cell {cell.id}: {why}")
            elif cell.id in seen:
                problems.append(f"cell {cell.id}: in groups {seen[cell.id]} and {i} (a cell once)")
            else:
                seen[cell.id] = i
                cells.append(cell)
    if problems:
        raise PlanError(f"{where}: {plural(len(problems), 'problem')}:\n  "
                        + "\n  ".join(problems))
    return Plan(str(data.get("name") or name), cells, source)


def _group_cells(i: int, group: dict, defaults: dict) -> tuple[list[Cell], list[str]]:
    """The cells of the ``i``-th group (its axes' product) and what is wrong with its keys."""
    bad = [f"[[matrix]] {i}: unknown key {k!r} (known: "
           f"{', '.join(sorted(GROUP_KEYS | DEFAULT_KEYS))})"
           for k in group if k not in GROUP_KEYS | DEFAULT_KEYS]
    axes = []
    for key in ("kernels", "schedulers", "topologies"):
        v = group.get(key)
        if not isinstance(v, list) or not v:
            bad.append(f"[[matrix]] {i}: {key} must be a non-empty list")
            v = []
        axes.append(v)
    opts = {**defaults, **{k: v for k, v in group.items() if k in DEFAULT_KEYS}}
    try:
        common = _options(opts)
    except ValueError as exc:
        return [], bad + [f"[[matrix]] {i}: {exc}"]
    cells = []
    for kernel, sched, topo in itertools.product(*axes):
        if not isinstance(kernel, str) or not isinstance(sched, str) or isinstance(topo, bool) \
                or not isinstance(topo, (int, str)):
            bad.append(f"[[matrix]] {i}: {kernel!r} x {sched!r} x {topo!r}: kernels and "
                       "schedulers are strings, topologies integers or strings")
            continue
        cells.append(Cell(kernel, sched, topo, **common))
    return cells, bad


def _options(opts: dict) -> dict:
    """A group's options as Cell fields; ValueError (one line) for a value of the wrong kind."""
    suite = opts.get("suite", "quick")
    if suite not in ("quick", "full"):
        raise ValueError(f"suite = {suite!r}: quick or full")
    exps = opts.get("experiments", [])
    if not isinstance(exps, list) or not all(isinstance(e, str) for e in exps):
        raise ValueError("experiments must be a list of experiment names")
    for key in ("repeat", "max_repeat", "seed"):
        v = opts.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or v < (0 if key == "seed" else 1)):
            raise ValueError(f"{key} = {v!r}: a whole number" + (" >= 1" if key != "seed" else ""))
    if not isinstance(opts.get("until_decided", False), bool):
        raise ValueError("until_decided must be true or false")
    if opts.get("max_repeat") is not None and not opts.get("until_decided"):
        raise ValueError("max_repeat goes with until_decided = true")
    params = opts.get("params", {})
    if not isinstance(params, dict):
        raise ValueError("[params] must be a table of experiment parameters")
    return {"suite": suite, "experiments": tuple(exps), "repeat": opts.get("repeat"),
            "until_decided": bool(opts.get("until_decided", False)),
            "max_repeat": opts.get("max_repeat"), "seed": opts.get("seed") or 0,
            "params": tuple(sorted(params.items())), "probe": str(opts.get("probe", "tracefs"))}


def check_cell(cell: Cell) -> str | None:
    """Why ``cell`` cannot run anywhere (an unknown kernel, scheduler, topology, experiment,
    simulated policy, a parameter its experiments refuse), or None. Nothing on the host is read
    beyond whether a kernel image given by path exists (:func:`preflight` checks the host)."""
    try:
        _check_axes(cell)
        if cell.kind != HOST or isinstance(cell.topology, int):
            configs = cell_configs(cell, list(range(_ncpus(cell))), _sim_topology(cell))
            planned = max((c.repeat for c in configs), default=0)
            if not configs:
                raise ValueError("no configuration to run (its experiments all left out)")
            decide_cap(cell, planned)
    except (ValueError, HarmonyError) as exc:
        return str(exc).splitlines()[0]
    return None


def _check_axes(cell: Cell) -> None:
    from harmony.analysis.machines import machine_topology
    from harmony.analysis.refpolicy import get_policy
    from harmony.workload.tasks import POLICIES

    if cell.kind == SIMULATED:
        get_policy(cell.scheduler)          # ValueError: unknown reference policy
        if isinstance(cell.topology, int):
            if cell.topology < 2:
                raise ValueError(f"topology {cell.topology}: a simulated machine has 2 CPUs "
                                 "or more")
        else:
            machine_topology(cell.topology)  # ValueError: not a machine's shape
        return
    if cell.kind == VM:
        from harmony.vm import kernels
        kernels.check_spec(cell.kernel)      # UnknownKernel, naming the known ones
        if not isinstance(cell.topology, int) or not 1 <= cell.topology <= 64:
            raise ValueError(f"topology {cell.topology!r}: a VM's topology is its vCPU count, "
                             "1 to 64")
    elif isinstance(cell.topology, int):
        if cell.topology < 1:
            raise ValueError(f"topology {cell.topology}: a host cell needs 1 CPU or more")
    elif cell.topology != "all":
        from harmony.core.osutil import parse_cpulist
        try:
            parse_cpulist(cell.topology)
        except ValueError:
            raise ValueError(f"topology {cell.topology!r}: on the host, all, a CPU count or a "
                             "CPU list (0-3)") from None
    kind, _, name = cell.scheduler.partition(":")
    if cell.scheduler == "default":
        pass
    elif kind == "class" and name in POLICIES:
        pass
    elif kind == "scx" and name:
        from harmony.vm import kernels
        if cell.kind == VM and cell.kernel in kernels.NAMED:
            raise ValueError(f"scheduler {cell.scheduler}: kernel {cell.kernel} has no "
                             "sched_ext (Debian's kernels do not set CONFIG_SCHED_CLASS_EXT)")
    else:
        raise ValueError(f"unknown scheduler {cell.scheduler!r}: default, class:"
                         f"{'|'.join(POLICIES)} or scx:NAME (a reference policy goes with "
                         "kernel simulated)")
    if cell.probe != "tracefs" and cell.kind == VM:
        raise ValueError("a VM records with the tracefs probe only")


def _ncpus(cell: Cell) -> int:
    if isinstance(cell.topology, int):
        return cell.topology
    topo = _sim_topology(cell)
    return len(topo["cpus"]) if topo else 0


def _sim_topology(cell: Cell) -> dict | None:
    """A simulated cell's machine (its shape's topology), None for a flat one or a real cell."""
    if cell.kind != SIMULATED or isinstance(cell.topology, int):
        return None
    from harmony.analysis.machines import machine_topology
    return machine_topology(cell.topology)


def cell_params(cell: Cell) -> dict:
    """The experiment parameters the cell sets: its [params], and its scheduling class."""
    params = dict(cell.params)
    kind, _, name = cell.scheduler.partition(":")
    if cell.kind != SIMULATED and kind == "class":
        params["policy"] = name
    return params


def cell_configs(cell: Cell, cpus: list[int], topology: dict | None):
    """The suite's configurations of ``cell`` on ``cpus`` (:func:`harmony.suite.plan`), each
    with the cell's parameters where its experiment has them; ValueError (one line) for an
    experiment or a parameter refused."""
    from harmony.analysis.refpolicy import refuse_classes
    from harmony.experiments import get_experiment
    from harmony.suite import plan

    configs = plan(cpus, quick=cell.suite == "quick", repeat=cell.repeat,
                   experiments=list(cell.experiments) or None, simulated=cell.kind == SIMULATED,
                   topology=topology)
    params = cell_params(cell)
    for cfg in configs:
        exp = get_experiment(cfg.experiment)
        names = {p.name for p in exp.all_params()}
        own = {k: v for k, v in params.items() if k in names}
        if own:
            cfg.overrides = {**cfg.overrides, **own}
            try:
                cfg.params = exp.resolve(cfg.overrides, cfg.cpus or cpus)
            except ValueError as exc:
                raise ValueError(f"{cfg.label}: {exc}") from None
        if cell.kind == SIMULATED:
            refuse_classes(params=cfg.params)
    unused = set(params) - {n for c in configs for n in
                            (p.name for p in get_experiment(c.experiment).all_params())}
    if configs and unused:
        raise ValueError(f"parameter {', '.join(sorted(unused))}: no experiment of the cell has "
                         "it")
    return configs


def decide_cap(cell: Cell, planned: int) -> int | None:
    """The cap on a configuration's runs for until_decided (None without it): max_repeat, or
    the default cap (analysis/thresholds.py); ValueError when it is below the planned runs."""
    from harmony.analysis.thresholds import UNTIL_DECIDED_MAX_REPEAT

    if not cell.until_decided:
        return None
    cap = cell.max_repeat if cell.max_repeat is not None else max(UNTIL_DECIDED_MAX_REPEAT,
                                                                   planned)
    if cap < planned:
        raise ValueError(f"max_repeat = {cap} is fewer runs than the {planned} planned")
    return cap


# --- on the host that runs it --------------------------------------------------------------------

def preflight(cell: Cell) -> str | None:
    """Why this host cannot run ``cell`` (not root, CPUs not online, no sched_ext, no QEMU), or
    None; checked before the cell starts. A simulated cell runs anywhere."""
    if cell.kind == SIMULATED:
        return None
    from harmony.hostfacts import is_root
    if not is_root():
        return "not running as root: a real cell needs root (`harmony doctor` says why)"
    try:
        if cell.kind == HOST:
            _host_cpus(cell)
            if cell.scheduler.startswith("scx:"):
                from harmony.vm import scx
                scx.check_kernel()
        else:
            from harmony.vm.machine import missing_tools
            missing = missing_tools()
            if missing:
                return f"cannot boot kernel {cell.kernel}: missing {', '.join(missing)}"
    except (ValueError, HarmonyError) as exc:
        return str(exc).splitlines()[0]
    return None


def _host_cpus(cell: Cell) -> list[int]:
    from harmony.core.osutil import online_cpus, parse_cpulist

    online = online_cpus()
    if cell.topology == "all":
        return online
    if isinstance(cell.topology, int):
        if cell.topology > len(online):
            raise ValueError(f"topology {cell.topology}: this host has {len(online)} CPUs "
                             "online")
        return online[:cell.topology]
    cpus = parse_cpulist(cell.topology)
    off = sorted(set(cpus) - set(online))
    if off:
        raise ValueError(f"topology {cell.topology}: CPU {','.join(map(str, off))} not online")
    return cpus


def host_record(doctor_facts: dict | None = None) -> dict:
    """Where a cell ran: the host's name, Harmony's and Python's versions, and (a real cell, or
    a worker that checked itself) the host's doctor facts."""
    from harmony.core.version import __version__

    return {"hostname": socket.gethostname(), "harmony": __version__,
            "python": sys.version.split()[0], "pid": os.getpid(), "doctor": doctor_facts}


def run_cell(cell: Cell, out: Path, quiet: bool = True, doctor_facts: dict | None = None,
             resume: bool = False) -> dict:
    """Run ``cell`` into ``out`` (a new directory: a suite directory and its ``cell.json``) on
    this host, by the library's own calls (:func:`harmony.suite.run_suite` with the cell's
    runner); returns the cell's record (cell.json). CellError when the host cannot run it,
    before anything starts; the suite's errors otherwise (``out`` then holds what was done).
    ``resume``: ``out`` holds the cell's suite left interrupted or incomplete: its complete runs
    are kept as they are, the others made (``harmony suite --resume``)."""
    why = preflight(cell)
    if why:
        raise CellError(f"cell {cell.id}: {why}")
    from harmony.suite import run_suite

    start, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    runner, cpus, configs, facts, doctor_facts = _cell_runner(cell, doctor_facts)
    if resume:
        _check_resumable(cell, Path(out), configs)
    cap = decide_cap(cell, max(c.repeat for c in configs))
    record = run_suite(configs, cpus, Path(out), runner, facts=facts, seed=cell.seed,
                       quiet=quiet, until_decided=cap, resume=resume)
    cell_record = {"cell": cell.to_dict(), "status": record["status"],
                   "runs": record["runs"], "failures": record["failures"],
                   "started_at": start, "wall_s": round(time.monotonic() - t0, 3),
                   "resumed": resume, "host": host_record(doctor_facts)}
    store.write_json(Path(out) / CELL_FILE, cell_record)
    return cell_record


def _check_resumable(cell: Cell, out: Path, configs) -> None:
    """CellError unless ``out`` holds a suite of ``cell``'s configurations (a complete one too:
    its cell.json or report not written, a full disk; resuming it keeps every run and writes
    them)."""
    try:
        before = [c["label"] for c in store.read_json(Path(out) / "suite.json")["configs"]]
    except (store.RunError, KeyError, TypeError) as exc:
        raise CellError(f"cell {cell.id}: cannot resume it: {str(exc).splitlines()[0]}") from None
    if before != [c.label for c in configs]:
        raise CellError(f"cell {cell.id}: cannot resume it: {out} holds a suite of other "
                        "configurations")


def _cell_runner(cell: Cell, doctor_facts: dict | None):
    """(runner, CPU set, configurations, the suite's facts, doctor facts) of ``cell`` here."""
    if cell.kind == SIMULATED:
        from harmony.runners import SimRunner

        topology = _sim_topology(cell)
        cpus = list(range(_ncpus(cell)))
        facts = {"kernel": "simulated", "scheduler": f"reference policy {cell.scheduler}",
                 "ncpus": len(cpus)}
        return (SimRunner(cell.scheduler, topology), cpus, cell_configs(cell, cpus, topology),
                facts, doctor_facts)
    from harmony import doctor as host
    from harmony.vm.plan import plan_scx

    scx_name = cell.scheduler[4:] if cell.scheduler.startswith("scx:") else None
    if cell.kind == HOST:
        from harmony.probes import domains
        from harmony.runners import KernelRunner

        doctor_facts = host.doctor(mount=True, test_record=cell.probe != "tracefs")
        if not doctor_facts["verdict"]["can_run"]:
            raise CellError(f"cell {cell.id}: this host cannot run experiments: "
                            + "; ".join(doctor_facts["verdict"]["reasons"]))
        facts = host.run_facts(doctor_facts)
        cpus = _host_cpus(cell)
        configs = cell_configs(cell, cpus, domains.read())
        scx = plan_scx(scx_name, None, None, [c.params for c in configs])
        from harmony.core.osutil import online_cpus
        spare = sorted(set(online_cpus()) - set(cpus))
        runner = KernelRunner(cell.probe, facts, overlap=True, cpus=cpus, pause=not spare,
                              scx=scx)
        return runner, cpus, configs, {k: v for k, v in facts.items() if k != "doctor"}, \
            doctor_facts
    from harmony.vm.kernels import kernel as get_kernel
    from harmony.vm.plan import plan_vm
    from harmony.vm.runner import VmRunner

    vm = plan_vm(cell.kernel, cell.topology, "2G", None)
    configs = cell_configs(cell, vm.cpus, None)
    scx = plan_scx(scx_name, None, cell.kernel, [c.params for c in configs])
    doctor_facts = host.doctor(mount=False, test_record=False)
    facts = host.run_facts(doctor_facts)
    runner = VmRunner(get_kernel(cell.kernel), len(vm.cpus), vm.memory_mb, vm.setting,
                      facts=facts, scx=scx)
    return runner, vm.cpus, configs, runner.facts, doctor_facts


# --- the matrix directory ------------------------------------------------------------------------

def cell_dir(out: Path, cell: Cell) -> Path:
    return Path(out) / "cells" / cell.id


def partial_dir(out: Path, cell: Cell) -> Path:
    """Where ``cell`` is made on this host, and what it collected stays until it is whole."""
    return Path(out) / PARTIAL / cell.id


def finished(out: Path, plan: Plan) -> dict[str, dict]:
    """The cells of ``plan`` whose directory is in ``out/cells`` (each moved in whole): id ->
    its cell.json (its ``status``: complete, or incomplete when some of its runs are not)."""
    done = {}
    for cell in plan.cells:
        path = cell_dir(out, cell) / CELL_FILE
        if path.is_file():
            done[cell.id] = store.read_json(path)
    return done


def complete(out: Path, plan: Plan) -> dict[str, dict]:
    """The cells of ``plan`` finished with every run complete: what ``--resume`` skips."""
    return {k: v for k, v in finished(out, plan).items() if v.get("status") == "complete"}


def take_up(out: Path, cell: Cell) -> str | None:
    """Ready ``out/.partial/<cell>`` for the cell's next try (a cell not complete) and say what
    it holds: ``"whole"`` (the cell finished but was not moved into ``cells/``: move it),
    ``"suite"`` (a suite the cell left interrupted, failed mid-way or incomplete: resume it, its
    complete runs kept; an incomplete cell in ``cells/`` is renamed there first) or None
    (nothing collected: the cell starts afresh). Nothing collected is deleted."""
    tmp, placed = partial_dir(out, cell), cell_dir(out, cell)
    if (placed / CELL_FILE).is_file():
        if tmp.exists():        # cannot both be: kept aside, never deleted
            k = 1
            while (aside := tmp.with_name(f"{cell.id}.aside-{k}")).exists():
                k += 1
            tmp.rename(aside)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        placed.rename(tmp)
    if not tmp.is_dir():
        return None
    try:
        if store.read_json(tmp / CELL_FILE).get("status") == "complete":
            return "whole"
    except store.RunError:
        pass
    if (tmp / "suite.json").is_file():
        return "suite"
    shutil.rmtree(tmp)          # a try that stopped before its suite began: nothing in it
    return None


def open_matrix(out: Path, plan: Plan, resume: bool) -> dict:
    """Make (or, ``resume``, take up) the matrix directory ``out`` for ``plan``; returns its
    matrix.json record. RunError: ``out`` holds something else, or another plan's matrix."""
    out = Path(out)
    path = out / MATRIX_FILE
    if resume:
        if not path.is_file():
            raise store.RunError(f"{out}: no matrix to resume ({MATRIX_FILE} not there)")
        before = store.read_json(path)
        if [c["id"] for c in before.get("cells", [])] != [c.id for c in plan.cells] or \
                before.get("cells") != [c.to_dict() for c in plan.cells]:
            raise store.RunError(f"{out}: its matrix was made from another plan: resume it with "
                                 f"the plan it was made from ({before.get('source')})")
        shutil.rmtree(out / INCOMING, ignore_errors=True)   # archives half-unpacked: copies
        return before | {"status": "running",
                         "resumed_at": before.get("resumed_at", []) + [_now()]}
    if out.exists() and any(out.iterdir()):
        raise store.RunError(f"{out} is not empty: choose another --out, or --resume")
    store.make_run_dir(out)
    return {**plan.to_dict(), "status": "running", "started_at": _now(), "cells_state": {},
            "failures": []}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def place(tmp: Path, out: Path, cell: Cell) -> Path:
    """Move the finished cell directory ``tmp`` into ``out/cells`` at once (a rename on one file
    system); a cell already there (a retry that finished twice) is kept and ``tmp`` removed."""
    dest = cell_dir(out, cell)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, dest)
    except OSError:
        if not (dest / CELL_FILE).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def mark_if_running(out: Path, plan: Plan, record: dict | None, failures: list[dict],
                    status: str) -> None:
    """matrix.json brought up to date with ``status`` (:func:`finish_record`) where it says
    "running": written by this command, which ends; not where it is not there (a stop as the
    matrix was made leaves no directory), nor where another status was written already."""
    try:
        on_disk = store.read_json(Path(out) / MATRIX_FILE).get("status")
    except (store.RunError, OSError):
        return
    if record is not None and on_disk == "running":
        finish_record(out, plan, record, failures, status)


def write_record(out: Path, record: dict) -> None:
    store.write_json(Path(out) / MATRIX_FILE, record)


class MatrixProgress:
    """One line per change: cells done / running / left, failed, and the time left (the mean
    wall time of the cells finished so far, over the cells left, shared by ``slots``)."""

    def __init__(self, total: int, done: int = 0, stream=sys.stderr, quiet: bool = False,
                 slots: int = 1):
        self.total, self.done, self.running, self.failed = total, done, 0, 0
        self.stream, self.quiet, self.slots = stream, quiet, max(1, slots)
        self.walls: list[float] = []
        self.start = time.monotonic()
        self.last = ""

    def eta(self) -> str:
        left = self.total - self.done - self.failed
        if not self.walls or left <= 0:
            return ""
        mean = sum(self.walls) / len(self.walls)
        return f", ~{mean * left / self.slots:.0f} s left"

    def line(self) -> str:
        left = self.total - self.done - self.failed - self.running
        return (f"cells: {self.done} done, {self.running} running, {left} left"
                + (f", {self.failed} failed" if self.failed else "")
                + f" of {self.total}; elapsed {time.monotonic() - self.start:.0f} s" + self.eta())

    def show(self, what: str = "") -> None:
        text = self.line() + (f" ({what})" if what else "")
        if self.quiet or text == self.last:
            return
        self.last = text
        self.stream.write(text + "\n")
        self.stream.flush()


def run_local(plan: Plan, out: Path, resume: bool = False, quiet: bool = False,
              progress: MatrixProgress | None = None) -> dict:
    """Run ``plan``'s cells one after another on this host into the matrix directory ``out``
    (:func:`open_matrix`); each cell runs in ``out/.partial/<cell>`` and is moved into
    ``out/cells`` once whole. ``resume``: complete cells are skipped, a cell left interrupted,
    failed mid-way or incomplete is resumed (:func:`take_up`). Every cell's host-dependent
    checks run before the first starts (CellError, one line per cell). Returns matrix.json's
    record (status complete, or incomplete with each failed cell and its reason)."""
    failures, record = [], None
    try:
        # in the try: a stop as the block that wrote matrix.json ended left it "running"
        with store.new_run_dir(out):    # refused, or stopped, before matrix.json: no directory
            record = open_matrix(out, plan, resume)
            done = complete(out, plan)
            todo = [c for c in plan.cells if c.id not in done]
            bad = [f"cell {c.id}: {why}" for c in todo if (why := preflight(c))]
            if bad:
                raise CellError(f"this host cannot run {len(bad)} of the cells:\n  "
                                + "\n  ".join(bad))
            write_record(out, record)
        progress = progress or MatrixProgress(len(plan.cells), len(done), quiet=quiet)
        since = stops.raised()
        for cell in todo:
            progress.running = 1
            progress.show(f"running {cell.id}")
            try:
                cell_record = _local_cell(out, cell)
            except (HarmonyError, OSError, ValueError, RuntimeError) as exc:
                if (stop := stops.behind(exc, since)) is not None:
                    stop.add_note(f"then: {exc}")   # a stop in the cell, however it came
                    raise stop from None            # out (as the suite's configurations)
                failures.append({"cell": cell.id, "error": _one_line(exc), "tries": 1})
                progress.failed += 1
            else:
                progress.done += 1
                progress.walls.append(cell_record["wall_s"])
            progress.running = 0
            record = finish_record(out, plan, record, failures, "running")
            progress.show()
    except BaseException:
        mark_if_running(out, plan, record, failures, "interrupted")
        raise
    return finish_record(out, plan, record, failures)


def _local_cell(out: Path, cell: Cell) -> dict:
    """One cell made (or resumed, or only moved in) here and moved into ``cells/``; its
    cell.json. On an error what it collected stays in ``.partial/`` for ``--resume``."""
    tmp = partial_dir(out, cell)
    held = take_up(out, cell)
    if held != "whole":
        tmp.parent.mkdir(parents=True, exist_ok=True)
        run_cell(cell, tmp, quiet=True, resume=held == "suite")
    cell_record = store.read_json(tmp / CELL_FILE)
    place(tmp, out, cell)
    return cell_record


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def finish_record(out: Path, plan: Plan, record: dict, failures: list[dict],
                  status: str | None = None) -> dict:
    """matrix.json brought up to date: each cell's state (complete, incomplete: its suite's
    runs not all complete, failed: with the reason, interrupted: its runs so far in
    ``.partial/``, or not run), the failures; ``status``, or complete when every cell is."""
    done = finished(out, plan)
    failed = {f["cell"]: f for f in failures}
    states = {}
    for cell in plan.cells:
        if cell.id in done:
            states[cell.id] = done[cell.id].get("status", "complete")
        elif cell.id in failed:
            states[cell.id] = "failed"
        elif (partial_dir(out, cell) / "suite.json").is_file():
            states[cell.id] = "interrupted"     # its runs so far kept: --resume takes it up
        else:
            states[cell.id] = "not run"
    if status is None:
        status = "complete" if all(s == "complete" for s in states.values()) else "incomplete"
    record = record | {"status": status, "cells_state": states,
                       "failures": list(failed.values()), "updated_at": _now()}
    write_record(out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    """``python -m harmony.matrix --cell JSON --out DIR [--facts FILE] [--parent PID]
    [--resume]``: one cell run in a process of its own (a Dask worker's cell: signal handlers
    need a main thread), killed if its worker dies; ``--resume``: ``--out`` holds the cell's
    suite, resumed. Exit 0 done, 1 with the one-line reason on stderr."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harmony.matrix")
    ap.add_argument("--cell", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--facts")
    ap.add_argument("--parent", type=int, help="die with this process (a Dask worker)")
    ap.add_argument("--resume", action="store_true", help="--out holds the cell's suite: resume it")
    args = ap.parse_args(argv)
    if args.parent is not None:
        from harmony.core.osutil import die_with_parent
        if not die_with_parent(args.parent):
            return 1
    cell = Cell.from_dict(json.loads(args.cell))
    facts = json.loads(Path(args.facts).read_text()) if args.facts else None
    try:
        run_cell(cell, Path(args.out), quiet=True, doctor_facts=facts, resume=args.resume)
    except (HarmonyError, OSError, ValueError, RuntimeError) as exc:
        print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
