"""A kernel and scheduler under test, checked whole before anything starts.

``harmony run|suite --kernel K [--vm-*] [--scx S]`` come here first: :func:`plan_vm` checks the
VM's options (the kernel's name or image, its memory, QEMU's set-up, the tools that boot it) and
:func:`plan_scx` the sched_ext scheduler (its name, a kernel that has sched_ext, the experiments
it can run). Bad input raises :class:`~harmony.core.errors.ParameterError` (a usage error: exit
2); a host that cannot boot a VM, :class:`~harmony.core.errors.VmError` (exit 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harmony.core.errors import ParameterError, VmError
from harmony.vm import kernels, scx, scx_build
from harmony.vm.kernels import kernel_config_text
from harmony.vm.machine import QemuSetting, missing_tools, setting_from_env
from harmony.vm.topology import VmTopology, check_memory, nr_cpus
from harmony.vm.topology import parse as parse_topology


#: the vCPUs of a VM without --vm-cpus or --vm-topology
DEFAULT_VCPUS = 4


@dataclass
class VmPlan:
    """A VM run's options, checked: the guest's CPU set (all its vCPUs), its memory in MiB, how
    QEMU runs it and the machine's shape (:mod:`harmony.vm.topology`; None: a flat machine of
    ``cpus``)."""

    cpus: list[int]
    memory_mb: int
    setting: QemuSetting
    topology: VmTopology | None = None


def parse_memory(text: str) -> int:
    """``2G`` / ``1536M`` / ``2048`` (MiB) -> MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([MmGg]?)\s*", text or "")
    if not m or int(m.group(1)) == 0:
        raise ParameterError(f"--vm-memory: {text!r} is not a size such as 2G or 1536M")
    mib = int(m.group(1)) * (1024 if m.group(2).lower() == "g" else 1)
    if mib < 256:
        raise ParameterError(f"--vm-memory: {text}: a VM needs 256M at least")
    return mib


def plan_vm(kernel: str, vm_cpus: int | None, vm_memory: str, vm_qemu: str | None,
            cpus: str | None = None, probe: str = "tracefs",
            crosscheck: str | None = None, vm_topology: str | None = None) -> VmPlan:
    """Check a VM run's options: ``cpus`` (the host's CPU set) and a probe other than tracefs
    cannot go with a VM; ``vm_topology`` (a spec or preset: :func:`harmony.vm.topology.parse`)
    sets the vCPUs (``vm_cpus``, if given too, must be as many) and splits the memory into its
    NUMA nodes."""
    if cpus is not None:
        raise ParameterError("--cpus is the host's CPU set; a VM's is all its vCPUs (--vm-cpus)")
    if probe != "tracefs" or crosscheck:
        raise ParameterError("a VM records with the tracefs probe only (the host's perf does "
                             "not match the kernel under test)")
    kernels.check_spec(kernel)
    setting = QemuSetting.parse(vm_qemu) if vm_qemu is not None else setting_from_env()
    memory = parse_memory(vm_memory)
    topology = None
    if vm_topology is not None:
        topology = parse_topology(vm_topology)
        if vm_cpus is not None and vm_cpus != topology.vcpus:
            raise ParameterError(f"--vm-cpus {vm_cpus} and --vm-topology {vm_topology} "
                                 f"({topology.vcpus} vCPUs) disagree: give one")
        check_memory(topology, memory)
        vm_cpus, memory = topology.vcpus, topology.vm_memory_mb(memory)
    missing = missing_tools()
    if missing:
        raise VmError(f"cannot boot kernel {kernel}: missing {', '.join(missing)} "
                      "(sudo ./install.sh)")
    return VmPlan(list(range(vm_cpus or DEFAULT_VCPUS)), memory, setting, topology)


def check_kernel_cpus(kernel, vcpus: int) -> None:
    """Refuse (ParameterError, one line) more vCPUs than the kernel ``kernel``
    (:class:`~harmony.vm.kernels.Kernel`) can bring up: its CONFIG_NR_CPUS, from the config
    beside its image (a Debian package's boot/config-RELEASE) or its build's; nothing is
    refused where no config says."""
    limit = nr_cpus(kernel_config_text(kernel))
    if limit is not None and vcpus > limit:
        raise ParameterError(f"kernel {kernel.spec} brings up at most {limit} CPUs "
                             f"(CONFIG_NR_CPUS={limit}): {vcpus} vCPUs asked")


#: the kernel option each domain level of a topology needs in the guest (arch/x86's
#: build_sched_topology adds SMT only with CONFIG_SCHED_SMT, MC only with CONFIG_SCHED_MC; the
#: NUMA levels need CONFIG_NUMA); PKG is always built
LEVEL_OPTIONS = {"SMT": "CONFIG_SCHED_SMT", "MC": "CONFIG_SCHED_MC", "NUMA": "CONFIG_NUMA"}


def check_kernel_topology(kernel, topology: VmTopology | None) -> None:
    """Refuse (ParameterError, one line) a topology whose levels the kernel ``kernel`` cannot
    form, from the config beside its image or its build's (before a boot that would end in the
    guest's own refusal); nothing is refused where no config says."""
    text = kernel_config_text(kernel) if topology is not None else None
    if text is None:
        return
    lacking = frozenset(level for level, opt in LEVEL_OPTIONS.items()
                        if not re.search(rf"^{opt}=y$", text, re.M))
    want = topology.expected_spans()
    if _spans(want) == _spans(topology.expected_spans(lacking)):
        return              # the levels it lacks are not this shape's (or another level has
                            # their spans, as the guest's check compares spans, not names)
    lacks = [LEVEL_OPTIONS[level] for level in LEVEL_OPTIONS
             if level in lacking and any(n == level for ch in want.values() for n, _ in ch)]
    hint = (": --kernel sched-ext-full has it"
            if kernel.spec == "sched-ext" and lacks == ["CONFIG_SCHED_MC"] else "")
    raise ParameterError(f"--vm-topology {topology.preset or topology.spec()}: kernel "
                         f"{kernel.spec} was built without {', '.join(lacks)}, so its guests "
                         f"cannot form {topology.describe()}{hint}")


def _spans(chains: dict) -> dict:
    return {cpu: [sorted(span) for _, span in chain] for cpu, chain in chains.items()}


def plan_scx(name: str | None, args: str | None, kernel: str | None, params: list[dict]):
    """Check ``--scx``: the scheduler's name (found in the sched-ext kernel's build), a kernel
    that has sched_ext (and what a Rust scheduler needs of it), experiments it can run (each of
    ``params``); returns its :class:`~harmony.vm.scx.ScxSpec`, or None without ``name``."""
    if name is None:
        if args is not None:
            raise ParameterError("--scx-args goes with --scx NAME")
        return None
    for p in params:
        scx.check_params(p)
    if kernel is not None and kernel in kernels.NAMED:
        raise ParameterError(f"kernel {kernel} has no sched_ext (CONFIG_SCHED_CLASS_EXT is not "
                             "set in Debian's kernels): --kernel sched-ext has it")
    if kernel is None:
        scx.check_kernel()
    short = name.removeprefix("scx_")
    if short in scx_build.names() and "/" not in name and kernel in kernels.BUILT:
        config = kernels.built_config(kernel)   # not built: what its recipe sets
        lacks = (scx_build.kernel_lacks(config) if config is not None
                 else scx_build.recipe_lacks(kernels.recipe(kernel)["configitems"]))
        if lacks:
            raise ParameterError(f"scheduler {short} needs {', '.join(lacks)}, which kernel "
                                 f"{kernel} does not have: --kernel sched-ext-full has it")
    directory = None
    if short in scx.KNOWN and "/" not in name:
        if kernel is not None and kernel not in kernels.BUILT:   # an image given by path
            directory = Path(kernel).absolute().parent
        else:
            try:
                directory = kernels.kernel(kernel or "sched-ext").image.parent
            except kernels.KernelError as exc:
                raise scx.UnknownScheduler(f"scheduler {name}: {exc}") from None
    return scx.resolve(name, args, directory)
