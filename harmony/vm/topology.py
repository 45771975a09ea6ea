"""The shape of a virtual machine under test: sockets, dies, cores, hardware threads, NUMA nodes
and what shares a last-level cache (``--vm-topology``), turned into virtme-ng's and QEMU's
options, and the scheduling domains the guest kernel should build from it, checked in the guest.

A topology is written ``sockets=2,cores=2,threads=2[,dies=2][,numa=per-socket|per-die|N]
[,llc=socket|die][,distance=D][,cpu=MODEL]`` or named by a preset (:data:`PRESETS`), modelled
on a real machine. Every count is per enclosing unit: ``cores`` per die, ``dies`` per socket.
QEMU numbers the vCPUs socket by socket, die by die, core by core, the threads of a core next to
each other (``-smp``'s order), and :meth:`VmTopology.node_cpus` splits them into NUMA nodes in
that order.

What it becomes (:meth:`VmTopology.vng_args`, :meth:`VmTopology.qemu_opts`):

- virtme-ng's ``--cpus N,sockets=S,dies=D,cores=C,threads=T``, which virtme-ng hands to QEMU's
  ``-smp`` as it is;
- ``--numa SIZE,cpus=A-B`` per node (the memory split evenly; virtme-ng wants the nodes' sizes
  to add up to ``--memory``) and ``--numa-distance i,j=D`` between every pair of nodes where a
  distance is given (QEMU's default: 20);
- a CPU model (QEMU's ``-cpu``, after virtme-ng's own ``-cpu max``: the last one counts) whose
  CPUID tells the guest its threads, dies and caches: see :func:`cpu_model`.

What QEMU 7.2 (Debian 12's) and the guest kernels honour, seen here under TCG (bench/README.md,
"topologies under test"): ``clusters=`` is refused for x86 ("clusters not supported by this
machine's CPU topology"), so there is no CLS level to ask for; a last-level cache is shared by
the vCPUs of one die (CPUID leaf 4), so ``llc=die`` is ``dies=`` > 1 and ``llc=socket`` is one
die per socket; the guests see threads and dies only through an Intel vendor string under TCG
(:data:`TCG_CPU_MODEL`).

The guest kernel builds its domains from what it sees (arch/x86/kernel/smpboot.c
``build_sched_topology``, kernel/sched/topology.c): SMT (a core's threads), MC (the CPUs sharing
its LLC), PKG (6.1: DIE; the CPUs of its NUMA node, left out where a package holds several
nodes), then a NUMA level per distance; a domain spanning one CPU or no more than the one below
it is dropped. :meth:`VmTopology.expected_spans` applies those rules, and :func:`check` compares
what the guest built (its ``topology`` as :func:`harmony.probes.domains.read` gives it) with
them: a topology the guest did not get is refused in one line before any run is measured.

Nothing here imports pandas: the guest agent checks its own topology.
"""

from __future__ import annotations

import dataclasses
import re

from harmony.core.errors import ParameterError
from harmony.core.osutil import format_cpulist
from harmony.core.wording import plural
from harmony.probes.domains import chain_keys

#: the largest count of each kind accepted (the VM takes at most 64 vCPUs: --vm-cpus's bound)
MAX_VCPUS = 64
#: the smallest memory a NUMA node gets (MiB)
MIN_NODE_MB = 128
#: the LLC choices: what one last-level cache is shared by
LLC_CHOICES = ("socket", "die")

#: named topologies, each modelled on a machine people run (the spec, and what it stands for)
PRESETS = {
    "smt": ("sockets=1,cores=2,threads=2",
            "a laptop: 2 cores of 2 threads sharing one LLC (SMT, MC)"),
    "2llc": ("sockets=1,dies=2,cores=2,threads=1,llc=die",
             "a small AMD Zen 2 part (Ryzen 3 3100): 2 core complexes of 2 cores, each its own "
             "L3 (MC, PKG)"),
    "2socket": ("sockets=2,cores=2,threads=1",
                "a 2-socket board without NUMA: 2 packages of 2 cores (MC, PKG)"),
    "2node": ("sockets=2,cores=2,threads=1,numa=per-socket",
              "a 2-socket server in miniature: 2 NUMA nodes of 2 cores (MC, NUMA)"),
    "2node-smt": ("sockets=2,cores=2,threads=2,numa=per-socket",
                  "a 2-socket Xeon in miniature: 2 nodes of 2 cores of 2 threads (SMT, MC, "
                  "NUMA)"),
    "2node-2llc-smt": ("sockets=2,dies=2,cores=2,threads=2,numa=per-socket,llc=die",
                       "a 2-socket EPYC in miniature: 2 nodes of 2 LLCs of 2 cores of 2 threads "
                       "(SMT, MC, PKG, NUMA)"),
}


@dataclasses.dataclass(frozen=True)
class VmTopology:
    """A VM's shape (see the module docstring); :func:`parse` makes one."""

    sockets: int = 1
    dies: int = 1           # per socket
    cores: int = 1          # per die
    threads: int = 1        # per core
    numa: int = 1           # NUMA nodes (1: none)
    llc: str = "socket"
    distance: int | None = None     # between two nodes (QEMU's default 20 where None)
    cpu: str | None = None          # a QEMU CPU model asked for
    preset: str | None = None

    @property
    def vcpus(self) -> int:
        return self.sockets * self.dies * self.cores * self.threads

    def spec(self) -> str:
        """The topology written out in full (what the manifest records)."""
        out = (f"sockets={self.sockets},dies={self.dies},cores={self.cores},"
               f"threads={self.threads},numa={self.numa},llc={self.llc}")
        if self.distance is not None:
            out += f",distance={self.distance}"
        return out + (f",cpu={self.cpu}" if self.cpu else "")

    def describe(self) -> str:
        """One line: the preset (if any) and the shape."""
        shape = (f"{plural(self.sockets, 'socket')} x {plural(self.dies, 'die')} x "
                 f"{plural(self.cores, 'core')} x {plural(self.threads, 'thread')} = "
                 f"{plural(self.vcpus, 'vCPU')}, LLC per {self.llc}, "
                 f"{plural(self.numa, 'NUMA node')}")
        return f"{self.preset} ({shape})" if self.preset else shape

    def smp(self) -> str:
        """QEMU's ``-smp`` value (virtme-ng's ``--cpus``)."""
        dies = f",dies={self.dies}" if self.dies > 1 else ""
        return (f"{self.vcpus},sockets={self.sockets}{dies},cores={self.cores},"
                f"threads={self.threads}")

    # --- where each vCPU sits ---

    def core_of(self, cpu: int) -> int:
        return cpu // self.threads

    def llc_of(self, cpu: int) -> int:
        per = self.cores * self.threads * (self.dies if self.llc == "socket" else 1)
        return cpu // per

    def socket_of(self, cpu: int) -> int:
        return cpu // (self.dies * self.cores * self.threads)

    def node_of(self, cpu: int) -> int:
        return cpu // (self.vcpus // self.numa)

    def node_cpus(self) -> list[list[int]]:
        per = self.vcpus // self.numa
        return [list(range(n * per, (n + 1) * per)) for n in range(self.numa)]

    # --- virtme-ng and QEMU ---

    def node_memory_mb(self, memory_mb: int) -> int:
        """Each node's share of ``memory_mb`` (MiB, whole)."""
        return memory_mb // self.numa

    def vng_args(self, memory_mb: int) -> list[str]:
        """virtme-ng's options for this topology (``--cpus``, ``--numa``, ``--numa-distance``);
        with NUMA nodes the VM's ``--memory`` must be :meth:`vm_memory_mb`."""
        args = ["--cpus", self.smp()]
        if self.numa > 1:
            size = self.node_memory_mb(memory_mb)
            for cpus in self.node_cpus():
                args += ["--numa", f"{size}M,cpus={cpus[0]}-{cpus[-1]}"]
            if self.distance is not None:
                for i in range(self.numa):
                    for j in range(self.numa):
                        if i != j:
                            args += ["--numa-distance", f"{i},{j}={self.distance}"]
        return args

    def vm_memory_mb(self, memory_mb: int) -> int:
        """The VM's memory: ``memory_mb`` rounded down to whole nodes' worth."""
        return self.node_memory_mb(memory_mb) * self.numa

    def qemu_opts(self, accel: str = "tcg") -> list[str]:
        """QEMU options this topology needs beyond ``-smp`` and ``-numa`` under ``accel``: its
        CPU model (:func:`cpu_model`)."""
        model = cpu_model(self, accel)
        return ["-cpu", model] if model else []

    def machine_spec(self, kernel: str = "6.12") -> str | None:
        """The same shape as a synthetic machine's spec (:mod:`harmony.analysis.machines`,
        whose domains topology.c's rules build), what plans a run's placement by level and a
        suite's questions of distance before the guest boots (the guest then refuses a shape
        it did not get); None for a shape that spec cannot say (nodes other than one per
        socket or per LLC)."""
        llcs = self.dies if self.llc == "die" else 1
        if self.numa == 1:
            numa = "none"
        elif self.numa == self.sockets:
            numa = "socket"
        elif self.numa == self.sockets * llcs:
            numa = "llc"
        else:
            return None
        spec = (f"sockets={self.sockets},llcs={llcs},cores={self.cores},threads={self.threads},"
                f"numa={numa},kernel={kernel}")
        if self.distance is not None and self.numa > 1:
            spec += ",distance=" + "/".join(
                ":".join("10" if i == j else str(self.distance) for j in range(self.numa))
                for i in range(self.numa))
        return spec

    # --- what the guest should build ---

    def expected_spans(self, without: frozenset[str] = frozenset()
                       ) -> dict[int, list[tuple[str, list[int]]]]:
        """Per vCPU, the scheduling domains a Linux guest builds from this topology: (level,
        span) lowest first, by the kernel's x86 rules (see the module docstring). Level names
        are the 6.12 ones (6.1 calls PKG DIE). ``without``: levels a kernel built without
        their option cannot form (:data:`harmony.vm.plan.LEVEL_OPTIONS`)."""
        numa_in_package = any(len({self.node_of(c) for c in range(self.vcpus)
                                   if self.socket_of(c) == s}) > 1
                              for s in range(self.sockets))
        out = {}
        for cpu in range(self.vcpus):
            levels = [("SMT", [c for c in range(self.vcpus)
                               if self.core_of(c) == self.core_of(cpu)]),
                      ("MC", [c for c in range(self.vcpus) if self.llc_of(c) == self.llc_of(cpu)])]
            if not numa_in_package:
                levels.append(("PKG", self.node_cpus()[self.node_of(cpu)]))
            if self.numa > 1:       # every node equally far: one NUMA level over them all
                levels.append(("NUMA", list(range(self.vcpus))))
            kept: list[tuple[str, list[int]]] = []
            for name, span in levels:
                if name in without:
                    continue
                if len(span) > 1 and (not kept or set(span) != set(kept[-1][1])):
                    kept.append((name, span))
            out[cpu] = kept
        return out


#: the CPU model a topology gets under TCG: QEMU's ``max`` with Intel's vendor string, whose
#: CPUID topology (leaves 0xB, 0x1F and 4) both Debian kernels read for threads, dies and LLCs
TCG_CPU_MODEL = "max,vendor=GenuineIntel"


def cpu_model(topo: VmTopology, accel: str = "tcg") -> str | None:
    """The QEMU CPU model a topology needs, or None for virtme-ng's default: the one asked for
    (``cpu=``); else, under TCG, :data:`TCG_CPU_MODEL`. Under TCG virtme-ng's ``max`` has AMD's
    vendor string but no topology extensions (TCG does not offer topoext), and then Debian's 6.1
    finds no SMT sibling and neither 6.1 nor 6.12 splits the LLC by die; the EPYC model fares no
    better and panicked 6.12 at boot once (bench/README.md, "topologies under test"). Under KVM
    virtme-ng's ``host,topoext=on`` is left as it is."""
    if topo.cpu:
        return topo.cpu
    return TCG_CPU_MODEL if accel == "tcg" else None


_KEYS = ("sockets", "dies", "cores", "threads", "numa", "llc", "distance", "cpu")


def parse(text: str) -> VmTopology:
    """A :class:`VmTopology` from a preset name or ``key=value,...``; ParameterError (one line)
    for anything else."""
    text = (text or "").strip()
    preset = None
    if text in PRESETS:
        preset, text = text, PRESETS[text][0]
    elif "=" not in text:
        raise ParameterError(f"--vm-topology {text!r}: a preset ({', '.join(PRESETS)}) or "
                             "sockets=S,cores=C,threads=T[,dies=D][,numa=per-socket|per-die|N]"
                             "[,llc=socket|die][,distance=D][,cpu=MODEL]")
    values: dict = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in _KEYS:
            raise ParameterError(f"--vm-topology: {item!r} is not one of "
                                 f"{', '.join(k + '=' for k in _KEYS)}")
        if key in values:
            raise ParameterError(f"--vm-topology: {key}= given twice")
        values[key] = value
    counts = {}
    for key in ("sockets", "dies", "cores", "threads"):
        v = values.get(key, "1")
        if not re.fullmatch(r"\d{1,2}", v) or not 1 <= int(v) <= MAX_VCPUS:
            raise ParameterError(f"--vm-topology {key}={v}: a count, 1..{MAX_VCPUS}")
        counts[key] = int(v)
    llc = values.get("llc", "die" if counts["dies"] > 1 else "socket")
    if llc not in LLC_CHOICES:
        raise ParameterError(f"--vm-topology llc={llc}: choose {'|'.join(LLC_CHOICES)} "
                             "(QEMU 7.2 has no clusters for x86: an LLC is a die's or a socket's)")
    topo = VmTopology(**counts, llc=llc, numa=_nodes(values.get("numa", "1"), counts),
                      distance=_distance(values.get("distance")),
                      cpu=values.get("cpu") or None, preset=preset)
    _check(topo)
    return topo


def _nodes(value: str, counts: dict) -> int:
    if value == "per-socket":
        return counts["sockets"]
    if value == "per-die":
        return counts["sockets"] * counts["dies"]
    if not re.fullmatch(r"\d{1,2}", value) or int(value) < 1:
        raise ParameterError(f"--vm-topology numa={value}: per-socket, per-die or a number of "
                             "nodes")
    return int(value)


def _distance(value: str | None) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"\d{1,3}", value) or not 11 <= int(value) <= 254:
        raise ParameterError(f"--vm-topology distance={value}: a NUMA distance, 11..254 (10 is "
                             "a node's own)")
    return int(value)


def _check(topo: VmTopology) -> None:
    """Refuse a shape no machine has or QEMU cannot make, in one line."""
    if topo.vcpus > MAX_VCPUS:
        raise ParameterError(f"--vm-topology {topo.spec()}: {topo.vcpus} vCPUs, more than "
                             f"{MAX_VCPUS}")
    if topo.llc == "die" and topo.dies == 1:
        raise ParameterError("--vm-topology llc=die needs dies=2 or more (an LLC per die)")
    if topo.llc == "socket" and topo.dies > 1:
        raise ParameterError("--vm-topology: with dies > 1 each die has its own LLC in QEMU "
                             "7.2 (llc=socket cannot be made)")
    units = topo.sockets * (topo.dies if topo.llc == "die" else 1)      # LLCs
    if topo.numa > units or units % topo.numa:
        raise ParameterError(f"--vm-topology numa={topo.numa}: {plural(units, 'LLC')} cannot "
                             f"be split evenly into {plural(topo.numa, 'node')} (an LLC never "
                             "spans nodes)")
    if topo.distance is not None and topo.numa == 1:
        raise ParameterError("--vm-topology distance= needs NUMA nodes (numa=)")


def check_memory(topo: VmTopology, memory_mb: int) -> None:
    """Refuse a VM memory too small for its NUMA nodes, in one line."""
    if topo.numa > 1 and topo.node_memory_mb(memory_mb) < MIN_NODE_MB:
        raise ParameterError(f"--vm-memory {memory_mb}M for {topo.numa} NUMA nodes: each needs "
                             f"{MIN_NODE_MB}M at least")


def nr_cpus(config_text: str | None) -> int | None:
    """CONFIG_NR_CPUS of a kernel's config text, None where it does not say."""
    m = re.search(r"^CONFIG_NR_CPUS=(\d+)$", config_text or "", re.M)
    return int(m.group(1)) if m else None


def check(topo: VmTopology, guest: dict) -> str | None:
    """Why the guest did not get ``topo`` (one line), or None if it did: ``guest`` is the
    guest's topology (:func:`harmony.probes.domains.read`). Its CPUs must be all the vCPUs;
    its domains, where it shows them, those :meth:`VmTopology.expected_spans` says (spans
    compared, names only reported); where it shows none, its sysfs thread siblings, LLCs and
    nodes are compared instead and the line says the domains could not be checked."""
    cpus = guest.get("cpus") or {}
    if len(cpus) != topo.vcpus:
        return (f"the guest has {len(cpus)} CPUs online, not the {topo.vcpus} vCPUs of "
                f"{topo.describe()}")
    want = topo.expected_spans()
    doms = {int(c): d for c, d in (guest.get("domains") or {}).items()}
    if doms:
        for cpu in range(topo.vcpus):
            chain = doms.get(cpu, [])
            got = [(k, d.get("span") or []) for d, k in zip(chain, chain_keys(chain))]
            if [sorted(s) for _, s in got] != [sorted(s) for _, s in want[cpu]]:
                return (f"the guest did not get {topo.describe()}: CPU {cpu}'s domains are "
                        f"{_chain(got)}, not {_chain(want[cpu])}{_hint(topo, guest)}")
        return None
    for cpu in range(topo.vcpus):
        fact = cpus.get(str(cpu)) or {}
        sib = [c for c in range(topo.vcpus) if topo.core_of(c) == topo.core_of(cpu)]
        if sorted(fact.get("thread_siblings") or []) != sib:
            return (f"the guest did not get {topo.describe()}: CPU {cpu}'s thread siblings "
                    f"are {format_cpulist(fact.get('thread_siblings') or [])}, not "
                    f"{format_cpulist(sib)}{_hint(topo, guest)}")
    return None


def _chain(levels) -> str:
    return " < ".join(f"{n} {format_cpulist(sorted(s))}" for n, s in levels) or "none"


def _hint(topo: VmTopology, guest: dict) -> str:
    if topo.threads > 1 and all(len(c.get("thread_siblings") or [0]) == 1
                                for c in (guest.get("cpus") or {}).values()):
        return " (it sees no hardware threads: try cpu=EPYC or another CPU model)"
    return ""
