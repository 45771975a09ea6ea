"""Synthetic machines: a topology described in a few words, as the data a real machine gives.

The simulator of reference policies (:mod:`harmony.analysis.refpolicy`) runs on machines of any
shape; this module describes one -- sockets, LLCs, cores, SMT threads, NUMA nodes and their
distances -- and builds the kernel's scheduling domains for it by the rules of
kernel/sched/topology.c (``sd_init``, the x86 topology table, ``sched_init_numa``, the removal of
degenerate domains), in the format of the topology data contract (``manifest["topology"]``,
:mod:`harmony.analysis.topology`). The analysis reads a simulated machine exactly as it reads a
guest's or the host's: it cannot tell them apart.

A machine is written ``sockets=2,llcs=2,cores=4,threads=2,numa=socket`` (:func:`parse_machine`):
``cores`` per LLC, ``llcs`` per socket, ``threads`` per core; ``numa`` one node per ``socket``,
per ``llc``, or ``none`` (one node); ``distance=ring`` puts the nodes on a ring (neighbours 20,
two hops 30, ...: the asymmetric machine of "The Linux Scheduler: a Decade of Wasted Cores"),
``distance=10:20:30:20/...`` gives the node distance table row by row; ``kernel=6.1`` names the
package level DIE and the cache flag SD_SHARE_PKG_RESOURCES, as 6.1 does (6.12: PKG,
SD_SHARE_LLC). CPUs are numbered as QEMU numbers them (socket, LLC, core, thread: the threads of
a core are consecutive). Or a preset's name (:data:`PRESETS`).

What is modelled of topology.c (6.1 and 6.12 alike, verified against both): every level's
``min_interval`` = its span's weight in ms, ``max_interval`` = twice that, ``busy_factor`` 16,
``imbalance_pct`` 110 at SMT, 117 elsewhere, ``cache_nice_tries`` 0 at SMT, 1 at MC and the
package, 2 at NUMA; NUMA levels lose SD_PREFER_SIBLING and gain SD_SERIALIZE, SD_OVERLAP and
SD_NUMA, and beyond node_reclaim_distance (30) SD_BALANCE_EXEC, SD_BALANCE_FORK and
SD_WAKE_AFFINE; a level whose span is one CPU or equals the level below it is removed. Not
modelled: clusters (CLS), asymmetric capacities, ITMT priorities.
"""

from __future__ import annotations

import dataclasses

NODE_RECLAIM_DISTANCE = 30
LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20

#: named machines: each a spec :func:`parse_machine` reads. The first four are the issue's
#: (2 cores x 2 threads; 2 LLCs x 2 cores; 2 nodes x 2 cores; 2 nodes x 2 LLCs x 2 cores x 2
#: threads), then servers of 16-64 CPUs and the asymmetric NUMA ring
PRESETS = {
    "smt": "sockets=1,llcs=1,cores=2,threads=2",
    "2llc": "sockets=1,llcs=2,cores=2,threads=1",
    "2node": "sockets=2,llcs=1,cores=2,threads=1,numa=socket",
    "2node-2llc-smt": "sockets=2,llcs=2,cores=2,threads=2,numa=socket",
    "server-16": "sockets=2,llcs=1,cores=4,threads=2,numa=socket",
    "server-32": "sockets=2,llcs=2,cores=4,threads=2,numa=socket",
    "server-64": "sockets=2,llcs=4,cores=4,threads=2,numa=socket",
    "ring-4": "sockets=4,llcs=1,cores=2,threads=1,numa=socket,distance=ring",
}


@dataclasses.dataclass(frozen=True)
class Machine:
    """A synthetic machine (see the module docstring)."""

    sockets: int = 1
    llcs: int = 1
    cores: int = 2
    threads: int = 1
    numa: str = "none"                     # none | socket | llc
    distance: tuple | None = None          # node distance table (rows), or None: 10 / 20
    kernel: str = "6.12"
    text: str = ""                         # as given

    @property
    def ncpus(self) -> int:
        return self.sockets * self.llcs * self.cores * self.threads

    @property
    def nodes(self) -> int:
        return {"none": 1, "socket": self.sockets, "llc": self.sockets * self.llcs}[self.numa]

    def place(self, cpu: int) -> dict:
        """The CPU's socket, LLC (global index), core (global index), thread and node."""
        thread = cpu % self.threads
        core = cpu // self.threads
        llc = core // self.cores
        socket = llc // self.llcs
        node = {"none": 0, "socket": socket, "llc": llc}[self.numa]
        return {"socket": socket, "llc": llc, "core": core, "thread": thread, "node": node}

    def node_distance(self, a: int, b: int) -> int:
        if self.distance is not None:
            return int(self.distance[a][b])
        return LOCAL_DISTANCE if a == b else REMOTE_DISTANCE


KEYS = ("sockets", "llcs", "cores", "threads", "numa", "distance", "kernel")
MAX_CPUS = 64   # the reference sched_ext kernel's NR_CPUS; the simulator's range (16-64)


def parse_machine(text: str) -> Machine:
    """A :class:`Machine` from a spec or a preset's name; ValueError (one line) for a bad one."""
    spec = PRESETS.get(text.strip(), text.strip())
    values: dict = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"machine {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(KEYS)} (or a preset: {', '.join(PRESETS)})")
        values[key] = value.strip()
    m = {}
    for key in ("sockets", "llcs", "cores", "threads"):
        try:
            m[key] = int(values.get(key, dataclasses.fields(Machine)[KEYS.index(key)].default))
        except ValueError:
            raise ValueError(f"machine {text!r}: {key}={values[key]} is not a number") from None
        if m[key] < 1:
            raise ValueError(f"machine {text!r}: {key} must be at least 1")
    m["numa"] = values.get("numa", "none")
    if m["numa"] not in ("none", "socket", "llc"):
        raise ValueError(f"machine {text!r}: numa={m['numa']}: choose none, socket or llc")
    m["kernel"] = values.get("kernel", "6.12")
    if m["kernel"] not in ("6.1", "6.12"):
        raise ValueError(f"machine {text!r}: kernel={m['kernel']}: choose 6.1 or 6.12 (names)")
    machine = Machine(**m, text=text.strip())
    if machine.ncpus > MAX_CPUS:
        raise ValueError(f"machine {text!r} has {machine.ncpus} CPUs; at most {MAX_CPUS}")
    if "distance" in values:
        machine = dataclasses.replace(machine, distance=_distances(values["distance"], machine,
                                                                   text))
    return machine


def _distances(value: str, machine: Machine, text: str) -> tuple:
    n = machine.nodes
    if value == "ring":
        return tuple(tuple(LOCAL_DISTANCE if a == b else LOCAL_DISTANCE * (1 + min(
            (a - b) % n, (b - a) % n)) for b in range(n)) for a in range(n))
    try:
        rows = tuple(tuple(int(x) for x in row.split(":")) for row in value.split("/"))
    except ValueError:
        raise ValueError(f"machine {text!r}: distance={value}: rows of numbers a:b:c/d:e:f") \
            from None
    if len(rows) != n or any(len(r) != n for r in rows):
        raise ValueError(f"machine {text!r}: distance has to be a {n} x {n} table (its nodes)")
    if any(rows[a][a] != LOCAL_DISTANCE for a in range(n)) or any(
            rows[a][b] != rows[b][a] or rows[a][b] <= LOCAL_DISTANCE
            for a in range(n) for b in range(n) if a != b):
        raise ValueError(f"machine {text!r}: distance must be symmetric, {LOCAL_DISTANCE} on the "
                         f"diagonal and more elsewhere")
    return rows


def _flags(kernel: str, *extra: str, numa_far: bool = False) -> list[str]:
    """A level's flags: sd_init's defaults, plus ``extra``; NUMA levels as sd_init converts
    them."""
    llc = "SD_SHARE_PKG_RESOURCES" if kernel == "6.1" else "SD_SHARE_LLC"
    flags = ["SD_BALANCE_NEWIDLE", "SD_BALANCE_EXEC", "SD_BALANCE_FORK", "SD_WAKE_AFFINE",
             "SD_PREFER_SIBLING"]
    flags += [llc if f == "SHARE_LLC" else f for f in extra]
    if "SD_NUMA" in flags:
        flags = [f for f in flags if f != "SD_PREFER_SIBLING"] + ["SD_SERIALIZE", "SD_OVERLAP"]
        if numa_far:
            flags = [f for f in flags if f not in ("SD_BALANCE_EXEC", "SD_BALANCE_FORK",
                                                   "SD_WAKE_AFFINE")]
    order = ["SD_BALANCE_NEWIDLE", "SD_BALANCE_EXEC", "SD_BALANCE_FORK", "SD_WAKE_AFFINE",
             "SD_SHARE_CPUCAPACITY", llc, "SD_SERIALIZE", "SD_PREFER_SIBLING", "SD_OVERLAP",
             "SD_NUMA"]
    return [f for f in order if f in flags]


def _level(name: str, span: list[int], flags: list[str]) -> dict:
    w = len(span)
    if "SD_SHARE_CPUCAPACITY" in flags:
        pct, tries = 110, 0
    elif "SD_SHARE_LLC" in flags or "SD_SHARE_PKG_RESOURCES" in flags:
        pct, tries = 117, 1
    elif "SD_NUMA" in flags:
        pct, tries = 117, 2
    else:
        pct, tries = 117, 1
    return {"name": name, "span": span, "flags": flags, "min_interval": w,
            "max_interval": 2 * w, "busy_factor": 16, "imbalance_pct": pct,
            "cache_nice_tries": tries, "max_newidle_lb_cost": 0}


def domains_of(machine: Machine, cpu: int) -> list[dict]:
    """The domains of ``cpu``, lowest first, degenerate levels removed (see the module
    docstring), each a dict of the contract's fields."""
    cpus = range(machine.ncpus)
    me = machine.place(cpu)
    k = machine.kernel
    chain = []
    if machine.threads > 1:
        chain.append(_level("SMT", [c for c in cpus if machine.place(c)["core"] == me["core"]],
                            _flags(k, "SD_SHARE_CPUCAPACITY", "SHARE_LLC")))
    chain.append(_level("MC", [c for c in cpus if machine.place(c)["llc"] == me["llc"]],
                        _flags(k, "SHARE_LLC")))
    # x86's package level spans the CPU's node (cpu_cpu_mask = cpumask_of_node)
    chain.append(_level("DIE" if k == "6.1" else "PKG",
                        [c for c in cpus if machine.place(c)["node"] == me["node"]], _flags(k)))
    distances = sorted({machine.node_distance(a, b) for a in range(machine.nodes)
                        for b in range(machine.nodes)})
    for d in distances[1:]:        # the local distance's level (NODE) is the package's span
        near = [c for c in cpus if machine.node_distance(me["node"], machine.place(c)["node"])
                <= d]
        chain.append(_level("NUMA", near, _flags(k, "SD_NUMA",
                                                 numa_far=d > NODE_RECLAIM_DISTANCE)))
    kept = []
    for level in chain:
        if len(level["span"]) <= 1 or (kept and set(level["span"]) == set(kept[-1]["span"])):
            continue
        kept.append(level)
    return [{"index": i, **level} for i, level in enumerate(kept)]


def machine_topology(machine: Machine | str) -> dict:
    """The machine as the contract's ``manifest["topology"]``: cpus, domains, source (debugfs
    False: nothing was read; ``synthetic`` names the machine), numa_balancing (None: no NUMA
    balancer is simulated)."""
    if isinstance(machine, str):
        machine = parse_machine(machine)
    cpus = {}
    for c in range(machine.ncpus):
        p = machine.place(c)
        llc_cpus = [x for x in range(machine.ncpus) if machine.place(x)["llc"] == p["llc"]]
        cpus[str(c)] = {"package": p["socket"], "die": p["socket"], "core": p["core"],
                        "thread_siblings": [x for x in range(machine.ncpus)
                                            if machine.place(x)["core"] == p["core"]],
                        "llc": min(llc_cpus), "node": p["node"]}
    return {"cpus": cpus,
            "domains": {str(c): domains_of(machine, c) for c in range(machine.ncpus)},
            "source": {"debugfs": False, "verbose_toggled": False, "schedstat_version": None,
                       "missing": [], "synthetic": machine.text or describe(machine)},
            "numa_balancing": {"before": None, "during": None}}


def describe(machine: Machine) -> str:
    """The machine in words: "2 nodes x 2 LLCs x 4 cores x 2 threads (32 CPUs)"."""
    parts = []
    if machine.nodes > 1:
        parts.append(f"{machine.nodes} nodes")
    if machine.sockets > 1 and machine.numa != "socket":
        parts.append(f"{machine.sockets} sockets")
    llcs = machine.sockets * machine.llcs // max(1, machine.nodes)
    if llcs > 1:
        parts.append(f"{llcs} LLCs")
    parts.append(f"{machine.cores} cores")
    if machine.threads > 1:
        parts.append(f"{machine.threads} threads")
    ring = ", nodes on a ring" if machine.distance is not None else ""
    return " x ".join(parts) + f" ({machine.ncpus} CPUs{ring})"


def flat_topology(ncpus: int) -> dict:
    """A machine of ``ncpus`` cores sharing one LLC (one MC domain): what the simulator runs on
    when no machine is given, as the policies without levels assume."""
    return machine_topology(Machine(cores=ncpus, text=f"cores={ncpus}"))
