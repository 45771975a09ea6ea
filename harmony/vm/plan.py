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
from harmony.vm.machine import QemuSetting, missing_tools, setting_from_env


@dataclass
class VmPlan:
    """A VM run's options, checked: the guest's CPU set (all its vCPUs), its memory in MiB and
    how QEMU runs it."""

    cpus: list[int]
    memory_mb: int
    setting: QemuSetting


def parse_memory(text: str) -> int:
    """``2G`` / ``1536M`` / ``2048`` (MiB) -> MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([MmGg]?)\s*", text or "")
    if not m or int(m.group(1)) == 0:
        raise ParameterError(f"--vm-memory: {text!r} is not a size such as 2G or 1536M")
    mib = int(m.group(1)) * (1024 if m.group(2).lower() == "g" else 1)
    if mib < 256:
        raise ParameterError(f"--vm-memory: {text}: a VM needs 256M at least")
    return mib


def plan_vm(kernel: str, vm_cpus: int, vm_memory: str, vm_qemu: str | None,
            cpus: str | None = None, probe: str = "tracefs",
            crosscheck: str | None = None) -> VmPlan:
    """Check a VM run's options: ``cpus`` (the host's CPU set) and a probe other than tracefs
    cannot go with a VM."""
    if cpus is not None:
        raise ParameterError("--cpus is the host's CPU set; a VM's is all its vCPUs (--vm-cpus)")
    if probe != "tracefs" or crosscheck:
        raise ParameterError("a VM records with the tracefs probe only (the host's perf does "
                             "not match the kernel under test)")
    kernels.check_spec(kernel)
    setting = QemuSetting.parse(vm_qemu) if vm_qemu is not None else setting_from_env()
    memory = parse_memory(vm_memory)
    missing = missing_tools()
    if missing:
        raise VmError(f"cannot boot kernel {kernel}: missing {', '.join(missing)} "
                      "(sudo ./install.sh)")
    return VmPlan(list(range(vm_cpus)), memory, setting)


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
