"""A kernel under test in a virtual machine: boot it with virtme-ng, run the guest agent, watch it.

:class:`VirtualMachine` boots a :class:`~harmony.vm.kernels.Kernel` with P vCPUs through virtme-ng
(``vng --run IMAGE --cpus P --memory M --rwdir DIR -- CMD``: the host's filesystem shared
read-only, DIR writable) and runs one command in it, the guest agent (:mod:`harmony.vm.guest`). The
agent's lines (``@harmony {json}``) come back through the console; each is handed to the caller
with the host's time of arrival, the rest of the console goes to a log. Every wait is bounded: the
boot (until the agent's first line), and then each step the caller announces (a run's length plus
a margin). A panic, a hang, QEMU dying, Ctrl-C, SIGTERM or an exception on the host end the VM
with one line naming the kernel (:class:`~harmony.core.errors.VmError`), and QEMU and virtme-ng are
killed: nothing is left running.

QEMU's pid (with its start time) is recorded under the lock directory while it runs, so that
:func:`reclaim_stale` (every start, ``harmony clean``) kills a QEMU whose controller died.

The QEMU set-up is one documented, recorded setting (:class:`QemuSetting`, ``--vm-qemu`` or
``HARMONY_VM_QEMU``): the accelerator (KVM where it works, else TCG), TCG's threading
(``multi``: a host thread per vCPU, the vCPUs run in parallel and the guest's clock is the
host's; ``single``: all vCPUs in one thread, in turn; ``icount``: single-threaded with
``-icount shift=auto``, a virtual clock driven by the instructions executed), and pinning of the
vCPU threads to host CPUs (virtme-ng's ``--pin``). Which set-up is the most faithful is a
measurement (bench/README.md); each run records the one it had.

KVM is used where it works: /dev/kvm must exist and a bounded test boot under KVM must reach its
command (on a host without nested virtualisation a KVM guest can hang at boot). The verdict is
kept per boot of the host (:func:`accelerator`); ``harmony doctor`` says which a VM gets and why.

Run delay of the vCPUs: the host reads each vCPU thread's ``/proc/<qemu>/task/<tid>/schedstat``
(its CPU time and the time it waited on a host run queue) at both ends of a run's measured
window (:func:`vcpu_times`); the share of the window a vCPU waited is what the host took from it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harmony.core.errors import ParameterError, VmError  # noqa: F401  (raised here)
from harmony.core.osutil import (
    comm,
    forget_processes,
    lock_dir,
    parse_cpulist,
    proc_starttime,
    record_processes,
    stale_processes,
)
from harmony.hostfacts import MISSING, OK, check
from harmony.vm import reaper
from harmony.vm.topology import VmTopology

#: the prefix of the guest agent's lines on the console
LINE_PREFIX = "@harmony "
#: bounded waits: the boot until the agent's first line (TCG boots in ~10 s here; the agent
#: imports Harmony over 9p), and the KVM test boot
BOOT_TIMEOUT_S = float(os.environ.get("HARMONY_VM_BOOT_TIMEOUT", "300"))
KVM_TEST_TIMEOUT_S = 45.0
#: how long the guest may stay silent between two steps the caller did not bound
IDLE_TIMEOUT_S = 300.0
#: what a console line says when the guest kernel died
PANIC = re.compile(r"Kernel panic|BUG: kernel NULL|Oops: |general protection fault")
#: what the console says when the guest ended by itself: virtme-ng's init on its command's end,
#: the kernel powering off. A VM whose console closed without either was ended from outside:
#: QEMU died or was killed (:func:`ended_from_outside`)
ENDED_ITSELF = re.compile(r"virtme-ng-init: script exited with code|reboot: Power down")
#: the environment variable holding the QEMU set-up (as --vm-qemu)
ENV_QEMU = "HARMONY_VM_QEMU"
#: the vCPU threads' names (QEMU's ``-name ...,debug-threads=on``): "CPU 3/TCG", "CPU 0/KVM"
VCPU_COMM = re.compile(r"CPU (\d+)/(TCG|KVM)")
#: the one thread of single-threaded TCG (tcg=single, icount), which runs every vCPU in turn
ALL_VCPUS_COMM = "ALL CPUs/TCG"


def parse_line(line: str) -> dict | None:
    """The event of a guest agent's line (``@harmony {json}`` with an ``event``: see
    :mod:`harmony.vm.guest`), None if the line is not one (kernel messages, a line cut by one)."""
    if not line.startswith(LINE_PREFIX):
        return None
    try:
        event = json.loads(line[len(LINE_PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


# --- the QEMU set-up ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QemuSetting:
    """How QEMU runs the guest; ``--vm-qemu KEY=VALUE,...`` (or HARMONY_VM_QEMU).

    accel  auto (KVM where it works, else TCG) | kvm | tcg
    tcg    auto (default: multi where the host has more CPUs than the VM has vCPUs, else single;
           :meth:`resolved`) | multi (a thread per vCPU) | single (one thread for all, in turn) |
           icount (single, with ``-icount shift=auto``: a virtual clock driven by the
           instructions executed)
    nice   the vCPU threads' (and QEMU's session's) nice value on the host once the guest has
           booted: -20 (default) lets the host's other work take the least from them
    pin    off (default) | on (each vCPU thread on its own host CPU) | a host CPU list

    Why ``auto`` chooses so: bench/README.md "which QEMU set-up" (bench/fidelity.py). With more
    vCPUs than host CPUs, a thread per vCPU waits for a host CPU 45-71 % of every run (starved:
    the card leaves such runs out), while one thread running them in turn waits 1-12 % and keeps
    the balancing rounds on the guest's ticks (0.2 ms off, against 0.8); with a host CPU to
    spare for each vCPU thread, a thread per vCPU runs them in parallel, as a machine does.
    icount is kept for study only: a 50 % duty task's share came out 27-30 points off.
    Why ``nice=-20``: under two busy host processes of other sessions, one thread for 4 vCPUs
    waited 53-54 % of every run at nice 0 and 1 % at -20 (bench/README.md, the same study).
    """

    accel: str = "auto"
    tcg: str = "auto"
    nice: int = -20
    pin: str = "off"

    CHOICES = {"accel": ("auto", "kvm", "tcg"), "tcg": ("auto", "multi", "single", "icount")}

    @classmethod
    def parse(cls, text: str | None) -> "QemuSetting":
        """From ``accel=tcg,tcg=icount,pin=0-1`` (a pin list with commas comes last);
        ParameterError (one line) if malformed."""
        text = text or ""
        values: dict[str, str] = {}
        m = re.search(r"(?:^|,)\s*pin=([^=]*)$", text)
        if m:                           # a CPU list holds commas itself: pin takes the rest
            values["pin"], text = m.group(1).strip(), text[:m.start()]
        for item in filter(None, (i.strip() for i in text.split(","))):
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in ("accel", "tcg", "nice"):
                raise ParameterError(f"--vm-qemu: expected accel=, tcg=, nice= or pin= items "
                                     f"separated by commas, not {item!r}")
            if key == "nice":
                if not re.fullmatch(r"[+-]?\d{1,2}", value) or not -20 <= int(value) <= 19:
                    raise ParameterError(f"--vm-qemu nice={value}: a nice value, -20..19")
                values["nice"] = int(value)
                continue
            if value not in cls.CHOICES[key]:
                raise ParameterError(f"--vm-qemu {key}={value}: choose "
                                     f"{'|'.join(cls.CHOICES[key])}")
            values[key] = value
        pin = values.get("pin")
        if pin is not None and pin not in ("on", "off"):
            try:
                values["pin"] = ",".join(map(str, parse_cpulist(pin)))
            except ValueError as exc:
                raise ParameterError(f"--vm-qemu pin={pin}: {exc}") from None
        return cls(**values)

    def text(self) -> str:
        return f"accel={self.accel},tcg={self.tcg},nice={self.nice},pin={self.pin}"

    def resolved(self, vcpus: int, host_cpus: int) -> tuple["QemuSetting", str | None]:
        """This setting with ``tcg=auto`` decided for ``vcpus`` vCPUs on a host of ``host_cpus``
        usable CPUs, and why (None when nothing was left to decide)."""
        if self.tcg != "auto":
            return self, None
        if host_cpus > vcpus:
            return (dataclasses.replace(self, tcg="multi"),
                    f"tcg=auto: multi, the host has {host_cpus} CPUs for {vcpus} vCPU threads")
        return (dataclasses.replace(self, tcg="single"),
                f"tcg=auto: single, {vcpus} vCPUs would wait for {host_cpus} host CPUs "
                "(one thread runs them in turn)")


def setting_from_env() -> QemuSetting:
    return QemuSetting.parse(os.environ.get(ENV_QEMU))


def qemu_options(setting: QemuSetting, accel: str) -> list[str]:
    """The QEMU options Harmony adds for ``setting`` under ``accel`` (kvm or tcg): named vCPU
    threads, and TCG's threading and clock."""
    opts = ["-name", "harmony,debug-threads=on"]
    if accel == "tcg":
        thread = "multi" if setting.tcg in ("multi", "auto") else "single"  # auto: resolved()
        opts += ["-accel", f"tcg,thread={thread}"]
        if setting.tcg == "icount":
            opts += ["-icount", "shift=auto"]
    return opts


def vng_argv(kernel, vcpus: int, memory_mb: int, rwdir: Path, command: list[str],
             setting: QemuSetting, accel: str, vng: str = "vng",
             topology: VmTopology | None = None) -> list[str]:
    """The virtme-ng command line booting ``kernel`` with ``vcpus`` vCPUs and ``memory_mb`` MiB,
    ``rwdir`` writable, running ``command``. ``--verbose``: the console (kernel messages and the
    command's output) comes to our stdout. With a ``topology`` (:mod:`harmony.vm.topology`), its
    ``--cpus`` and NUMA nodes instead of ``vcpus``, and the CPU model it needs."""
    shape = topology.vng_args(memory_mb) if topology else ["--cpus", str(vcpus)]
    argv = [vng, "--verbose", "--run", str(kernel.image), *shape,
            "--memory", f"{memory_mb}M", "--rwdir", str(rwdir)]
    if not virtiofs_works():
        argv.append("--force-9p")     # not the 3.1 s a shared directory it would wait in vain
    if accel == "tcg":
        argv.append("--disable-kvm")
    if setting.pin == "on":
        argv.append("--pin")
    elif setting.pin != "off":
        argv += ["--pin", setting.pin]
    # one argument with "=": a value starting with "-" would be taken for an option of vng's
    opts = qemu_options(setting, accel) + (topology.qemu_opts(accel) if topology else [])
    argv += [f"--qemu-opts={shlex.join(opts)}", "--", shlex.join(command)]
    return argv


#: where virtme-ng looks for virtiofsd, in its order (virtme/commands/run.py, 1.42), after its
#: own guest tools' and PATH's
VIRTIOFSD_PATHS = ("/usr/libexec/virtiofsd", "/usr/lib/virtiofsd/virtiofsd", "/usr/lib/virtiofsd",
                   "/usr/lib/qemu/virtiofsd")


@functools.lru_cache(maxsize=1)
def virtiofs_works() -> bool:
    """Whether virtme-ng can share the host's files over virtio-fs here: the virtiofsd it would
    take is the Rust one. QEMU's own C virtiofsd (Debian 12 ships it as /usr/lib/qemu/virtiofsd)
    answers ``--version`` but takes none of the options virtme-ng starts it with: virtme-ng then
    waits 3.1 s for it for each shared directory (the root and the writable one) before it falls
    back to 9p, every boot. Without a virtiofsd, virtme-ng uses 9p at once."""
    for path in (shutil.which("virtiofsd"), *VIRTIOFSD_PATHS):
        if not path or not os.access(path, os.X_OK):
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return "QEMU" not in out.stdout + out.stderr
    return True                         # none: nothing to wait for


# --- versions and the accelerator ---------------------------------------------------------------

def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def versions() -> dict:
    """QEMU's and virtme-ng's versions (None where not installed)."""
    qemu = _first_line(["qemu-system-x86_64", "--version"])
    m = re.search(r"version (\S+)", qemu or "")
    vng = _first_line(["vng", "--version"])
    return {"qemu": m.group(1) if m else qemu, "virtme_ng": (vng or "").removeprefix("virtme-ng ")
            or None}


def topology_facts(topology: VmTopology | None) -> dict | None:
    """The manifest's ``vm.topology``: the shape asked for (None: a flat VM)."""
    if topology is None:
        return None
    return {"spec": topology.spec(), "preset": topology.preset, "describe": topology.describe(),
            "smp": topology.smp(),
            "numa_nodes": topology.node_cpus() if topology.numa > 1 else None}


def missing_tools() -> list[str]:
    """What a VM needs and this host lacks (install.sh installs them)."""
    need = {"qemu-system-x86_64": "qemu-system-x86", "vng": "virtme-ng (pip)",
            "busybox": "busybox-static", "depmod": "kmod"}
    return [pkg for tool, pkg in need.items() if shutil.which(tool) is None]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


def _verdict_path() -> Path:
    return lock_dir() / "kvm-verdict.json"


def accelerator(setting: QemuSetting, kernel=None, test: bool = True) -> tuple[str, str]:
    """("kvm" or "tcg", why) for a VM with ``setting``.

    accel=auto: KVM if /dev/kvm opens read-write and a test boot under KVM (``kernel``; at most
    :data:`KVM_TEST_TIMEOUT_S`) reached its command; the verdict is kept for this boot of the host.
    Without a verdict and without a test (``test`` false or no kernel), TCG is assumed and the
    reason says so."""
    if setting.accel == "tcg":
        return "tcg", "TCG asked for (--vm-qemu accel=tcg)"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as exc:
        if setting.accel == "kvm":
            raise VmError(f"--vm-qemu accel=kvm: /dev/kvm cannot be opened ({exc.strerror})") \
                from None
        return "tcg", f"/dev/kvm cannot be opened ({exc.strerror})"
    if setting.accel == "kvm":
        return "kvm", "KVM asked for (--vm-qemu accel=kvm)"
    cached = _read_verdict()
    if cached is not None:
        return cached["accel"], cached["why"] + " (verdict kept for this boot of the host)"
    if not test or kernel is None:
        return "tcg", "/dev/kvm opens, but KVM was not tried yet (no test boot): TCG"
    works, why = _kvm_test_boot(kernel)
    verdict = {"boot_id": _boot_id(), "accel": "kvm" if works else "tcg", "why": why}
    try:
        lock_dir().mkdir(parents=True, exist_ok=True)
        _verdict_path().write_text(json.dumps(verdict) + "\n")
    except OSError:
        pass
    return verdict["accel"], why


def _read_verdict() -> dict | None:
    try:
        v = json.loads(_verdict_path().read_text())
    except (OSError, ValueError):
        return None
    return v if isinstance(v, dict) and v.get("boot_id") == _boot_id() else None


def _kvm_test_boot(kernel) -> tuple[bool, str]:
    """Boot ``kernel`` under KVM with one vCPU to run ``echo``: (worked, why)."""
    token = f"harmony-kvm-ok-{os.getpid()}"
    argv = vng_argv(kernel, 1, 256, Path("/tmp"), ["echo", token], QemuSetting(accel="kvm"),
                    "kvm")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(reaper.command(argv), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return False, f"test boot under KVM could not start ({exc.strerror}): TCG"
    try:
        out, _ = proc.communicate(timeout=KVM_TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return False, (f"a test boot under KVM did not reach its command in "
                       f"{KVM_TEST_TIMEOUT_S:.0f} s (nested virtualisation?): TCG")
    if token.encode() in out:
        return True, f"/dev/kvm works (a test boot under KVM took {time.monotonic() - t0:.1f} s)"
    return False, f"a test boot under KVM failed (exit {proc.returncode}): TCG"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def doctor_check(kernel=None) -> dict:
    """``harmony doctor``'s ``vm`` check: can this host boot a kernel under test, which
    accelerator a VM gets and why, QEMU's and virtme-ng's versions. With ``kernel`` (a cached one)
    it may test KVM with a bounded boot, once per boot of the host."""
    missing = missing_tools()
    ver = versions()
    if missing:
        return check(MISSING, f"cannot boot kernels under test: missing {', '.join(missing)} "
                              "(sudo ./install.sh)", missing=missing, **ver)
    accel, why = accelerator(setting_from_env(), kernel)
    return check(OK, f"{accel.upper()}: {why}; QEMU {ver['qemu']}, virtme-ng {ver['virtme_ng']}",
                 accelerator=accel, why=why, setting=setting_from_env().text(), **ver)


# --- the vCPU threads ---------------------------------------------------------------------------

def vcpu_threads(qemu_pid: int, vcpus: int = 0) -> dict[int, int]:
    """vCPU index -> thread id of a QEMU started with named threads (:func:`qemu_options`).
    Under single-threaded TCG one thread (:data:`ALL_VCPUS_COMM`) runs all ``vcpus`` vCPUs in
    turn: each maps to it, since what the host takes from that thread it takes from every vCPU."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{qemu_pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            comm = Path(f"/proc/{qemu_pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        m = VCPU_COMM.fullmatch(comm)
        if m:
            out[int(m.group(1))] = int(tid)
        elif comm == ALL_VCPUS_COMM:
            out.update(dict.fromkeys(range(vcpus), int(tid)))
    return out


def renice_threads(qemu_pid: int, threads: dict[int, int], nice: int) -> list[int]:
    """Give the vCPU threads (:func:`vcpu_threads`) of QEMU ``qemu_pid`` the nice value ``nice``;
    the thread ids changed (a thread gone, or a value refused, is left as it was).

    Where the host groups tasks by session (``kernel.sched_autogroup_enabled``), a thread's nice
    value weighs only against its own session's: QEMU runs in a session of its own
    (:class:`VirtualMachine`), whose autogroup gets the value too, so that it weighs against
    every other session's work (``/proc/PID/autogroup``)."""
    done = []
    for tid in sorted(set(threads.values())):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            done.append(tid)
        except OSError:
            continue
    try:
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            Path(f"/proc/{qemu_pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass
    return done


def vcpu_times(qemu_pid: int, threads: dict[int, int]) -> dict[int, tuple[int, int]]:
    """vCPU index -> (ns on a host CPU, ns waited on a host run queue) now, from each thread's
    schedstat (its 1st and 2nd fields); a thread gone is left out."""
    out = {}
    for vcpu, tid in threads.items():
        try:
            fields = Path(f"/proc/{qemu_pid}/task/{tid}/schedstat").read_text().split()
            out[vcpu] = (int(fields[0]), int(fields[1]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def wait_fractions(before: dict, after: dict, seconds: float) -> dict[int, float]:
    """Per vCPU, the share of ``seconds`` (a window on the host's clock) its thread waited for a
    host CPU, from two :func:`vcpu_times` readings."""
    if seconds <= 0:
        return {}
    return {v: max(0, after[v][1] - before[v][1]) / 1e9 / seconds
            for v in sorted(before) if v in after}


# --- the VM -------------------------------------------------------------------------------------

def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            children[int(stat[stat.rindex(")") + 2:].split()[1])].append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class VirtualMachine:
    """One boot of ``kernel`` with ``vcpus`` vCPUs running one command, the guest agent.

    :meth:`start` boots it; :meth:`pump` reads the console, handing each agent line to the
    caller, until the caller has what it waits for or the VM ends; :meth:`send` writes a line to
    the command's standard input (virtme-ng's ``virtme.stdin`` virtio-serial port: the host's
    channel to the agent); :meth:`finish` closes that input and waits for the VM to end;
    :meth:`stop` kills it. :meth:`run` is the whole of it for a command that needs no input.

    virtme-ng runs under a reaper (:mod:`harmony.vm.reaper`): whatever ends this process,
    SIGKILL included, QEMU, virtme-ng and what they started are killed at once.

    After :meth:`start`: ``accel`` / ``accel_why`` (the accelerator and why), ``qemu_pid``,
    ``boot_s`` (from the start of virtme-ng to the agent's first line), ``console_tail`` (the last
    console lines, for errors), ``returncode`` once it ended.
    """

    def __init__(self, kernel, vcpus: int, memory_mb: int = 2048,
                 setting: QemuSetting | None = None, boot_timeout: float = BOOT_TIMEOUT_S,
                 console_log: Path | None = None, topology: VmTopology | None = None):
        self.topology = topology        # the shape asked for (harmony.vm.topology), or None
        if topology is not None:
            vcpus, memory_mb = topology.vcpus, topology.vm_memory_mb(memory_mb)
        self.kernel, self.vcpus, self.memory_mb = kernel, vcpus, memory_mb
        self.setting, self.setting_why = (setting or QemuSetting()).resolved(
            vcpus, len(os.sched_getaffinity(0)))
        self.boot_timeout = boot_timeout
        self.console_log = console_log
        self.accel, self.accel_why = None, None
        self.qemu_pid: int | None = None
        self.proc: subprocess.Popen | None = None
        self.boot_s: float | None = None
        self.console_tail: collections.deque[str] = collections.deque(maxlen=30)
        self.deadline = 0.0
        self.returncode: int | None = None
        self._console = None            # the console's line reader (:meth:`_lines`)
        self._log = None
        self._t_start = 0.0

    def describe(self) -> dict:
        """The manifest's ``vm`` facts of this VM (the caller adds what it measured)."""
        return {"kernel": self.kernel.to_dict(), "accelerator": self.accel,
                "accelerator_why": self.accel_why, "vcpus": self.vcpus,
                "memory_mb": self.memory_mb, "qemu_setting": self.setting.text(),
                "qemu_setting_why": self.setting_why if self.accel != "kvm" else None,
                "qemu_options": qemu_options(self.setting, self.accel or "tcg")
                + (self.topology.qemu_opts(self.accel or "tcg") if self.topology else []),
                "topology": topology_facts(self.topology), **versions()}

    def _fail(self, what: str) -> VmError:
        why = guest_error(self.console_tail)
        tail = [line for line in self.console_tail if line.strip()][-3:]
        hint = (f"; the guest said: {why}" if why else
                f"; console: {' | '.join(tail)}" if tail else "")
        return VmError(f"kernel {self.kernel.spec}: {what}{hint}"[:600])

    def run(self, command: list[str], rwdir: Path, on_event) -> int:
        """Boot, run ``command`` (its standard input empty) and wait for the VM to end; returns
        the command's exit status as virtme-ng reports it (:meth:`pump` for ``on_event``).
        Raises VmError naming the kernel on a failed boot, a panic, a guest silent for too long
        or QEMU gone; QEMU and virtme-ng are killed whatever happens."""
        try:
            self.start(command, rwdir, stdin=False)
            self.pump(on_event)
            return self.returncode
        finally:
            self.stop()

    def start(self, command: list[str], rwdir: Path, stdin: bool = True,
              scratch: Path | None = None) -> None:
        """Start virtme-ng booting the kernel to run ``command`` with ``rwdir`` writable; with
        ``stdin``, :meth:`send` writes to the command's standard input; ``scratch``, a directory
        of the caller's for this boot, is removed by the reaper if this process dies (the caller
        removes it otherwise). The boot's deadline runs from now (:meth:`pump` waits for it)."""
        self.accel, self.accel_why = accelerator(self.setting, self.kernel)
        argv = vng_argv(self.kernel, self.vcpus, self.memory_mb, rwdir, command, self.setting,
                        self.accel, topology=self.topology)
        self._log = open(self.console_log, "w") if self.console_log else None
        self._t_start = time.monotonic()
        try:
            reaped = reaper.command(argv, remove=[scratch] if scratch else ())
            self.proc = subprocess.Popen(reaped, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as exc:
            self.stop()
            raise self._fail(f"virtme-ng could not start ({exc.strerror})") from None
        self._record()
        self.deadline = self._t_start + self.boot_timeout
        self._console = self._lines()

    def pump(self, on_event, until=None) -> bool:
        """Read the console, handing each agent line to ``on_event(event, t_host)`` (the event
        as a dict, the host's ``time.monotonic()`` at its arrival), until ``until()`` is true
        after an event (True) or the VM ends (False; ``returncode`` set). ``on_event`` may return
        a number of seconds: the guest must send its next line within that (else
        :data:`IDLE_TIMEOUT_S`). VmError naming the kernel (the VM killed) on a boot that fails
        or takes too long, a panic, a guest silent for too long."""
        try:
            for line in self._console:
                if self._log:
                    self._log.write(line + "\n")
                now = time.monotonic()
                event = parse_line(line)
                if event is None:
                    self.console_tail.append(line)
                    if PANIC.search(line):
                        raise self._fail(f"the guest kernel died: {line.strip()[:200]}")
                    continue
                if self._log:
                    self._log.flush()       # the agent's steps can be followed as they come
                if self.boot_s is None:
                    self.boot_s = now - self._t_start
                more = on_event(event, now)
                self.deadline = now + (more if more else IDLE_TIMEOUT_S)
                if until is not None and until():
                    return True
            self.returncode = self.proc.wait()
            if self.boot_s is None:
                raise self._fail(f"the VM ended (exit {self.returncode}) before the guest "
                                 "agent started")
            return False
        except BaseException:
            self.stop()
            raise

    def send(self, line: str, within: float | None = None) -> None:
        """Write one line to the guest command's standard input; the guest must answer within
        ``within`` seconds (else :data:`IDLE_TIMEOUT_S`). VmError if the VM is gone."""
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, AttributeError):
            self.stop()
            raise self._fail("the VM is gone: it cannot be sent more work") from None
        self.deadline = time.monotonic() + (within or IDLE_TIMEOUT_S)

    def finish(self, on_event, timeout: float = 60.0) -> int | None:
        """Close the guest command's input (it ends when it has read all of it), wait up to
        ``timeout`` s for the VM to end (:meth:`pump`), then :meth:`stop`; its exit status,
        None if it had to be killed."""
        try:
            if self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except BrokenPipeError:
                    pass
            if self.running:
                self.deadline = time.monotonic() + timeout
                self.pump(on_event)
            return self.returncode
        except VmError:
            return None
        finally:
            self.stop()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None and self.proc.poll() is None

    def _lines(self):
        """The console's lines as they come, until it closes; VmError past the deadline."""
        sel = selectors.DefaultSelector()
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
        buf = b""
        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    if self.boot_s is None:
                        raise self._fail(f"the guest did not boot within "
                                         f"{self.boot_timeout:.0f} s (hung, or too slow)")
                    raise self._fail("the guest went silent: no word from it within the time "
                                     "its step was given (hung?)")
                if self.qemu_pid is None:
                    self._find_qemu()
                if not sel.select(min(left, 1.0)):
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    yield raw.decode(errors="replace").rstrip("\r")
            if buf:
                yield buf.decode(errors="replace")
        finally:
            sel.close()

    def _find_qemu(self) -> None:
        below = _descendants(self.proc.pid)
        for pid in below:
            if comm(pid).startswith("qemu-system"):
                self.qemu_pid = pid
                self._record(below)
                return

    def _record(self, below: list[int] = ()) -> None:
        """Record the reaper's, virtme-ng's and QEMU's pids with their start times (for
        reclaim_stale: the reaper ends them with this process, this is for the rest)."""
        record_processes("vm", [self.proc.pid if self.proc else None, *below],
                         kernel=self.kernel.spec)

    def stop(self) -> None:
        """Kill the reaper's process group (virtme-ng, QEMU and the rest) and QEMU
        (idempotent); remove the record."""
        if self.proc is not None:
            if self.proc.poll() is None or self.qemu_pid:
                _kill_group(self.proc)
            if self.qemu_pid and comm(self.qemu_pid).startswith("qemu-system"):
                try:
                    os.kill(self.qemu_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.returncode is None:
                self.returncode = self.proc.poll()
            for f in (self.proc.stdout, self.proc.stdin):
                if f:
                    try:
                        f.close()
                    except OSError:
                        pass
        if self._log:
            self._log.close()
            self._log = None
        forget_processes("vm")


#: a Python exception's last line in a traceback ("ValueError: ..."; "harmony.x.Error: ...")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|"
                        r"Warning)(?::\s.*)?$")
#: what the console adds around the agent's own words: kernel messages, virtme-ng's lines
_NOT_THE_AGENT = re.compile(r"^\s*\[\s*\d+\.\d+\]|^virtme-ng-init:|^\s*$")


def ended_from_outside(machine: VirtualMachine | None) -> bool:
    """Whether a VM that ended (its ``returncode`` set) did so without the guest ending it: no
    line of :data:`ENDED_ITSELF` in its console's tail -- QEMU died or was killed."""
    return (machine is not None and machine.returncode is not None
            and not any(ENDED_ITSELF.search(line) for line in machine.console_tail))


def guest_error(lines) -> str | None:
    """What the guest's command said of its own failure on the console (``lines``, newest
    last): the last line of its last Python traceback, else its last line that is neither a
    kernel message nor virtme-ng's; None if there is none."""
    lines = list(lines)
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].startswith("Traceback (most recent call last)"):
            for line in lines[k + 1:]:
                if _EXCEPTION.match(line.strip()):
                    return line.strip()[:300]
    own = [line.strip() for line in lines if not _NOT_THE_AGENT.search(line)]
    return own[-1][:300] if own else None


#: a boot's job directory (the guest agent's job, a scheduler's copy): its controller's pid and
#: start time in the name, so that the next start knows one whose controller is gone
JOB_DIR = re.compile(r"harmony-vm-(\d+)-(\d+)-")


def make_job_dir() -> Path:
    """A new job directory for one boot, in the temporary directory, named for this process."""
    me = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"harmony-vm-{me}-{proc_starttime(me)}-"))


def reclaim_stale() -> list[str]:
    """Kill the QEMU and virtme-ng processes of VMs whose controller is gone (recorded by
    :func:`~harmony.core.osutil.record_processes`: a recycled pid is never killed) and remove
    their job directories (the reaper removes them when it outlives the controller; this is for
    the rest); return a line per process killed or directory removed."""
    out = []
    for rec, pid in stale_processes("vm"):
        name = comm(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            out.append(f"VM process {pid} ({name}) of kernel {rec.get('kernel', '?')}")
        except ProcessLookupError:
            pass
    for path in Path(tempfile.gettempdir()).glob("harmony-vm-*-*-*"):
        owner = JOB_DIR.match(path.name)
        if owner and path.is_dir() and str(proc_starttime(int(owner[1]))) != owner[2]:
            shutil.rmtree(path, ignore_errors=True)
            out.append(f"VM job directory {path} (its controller, pid {owner[1]}, is gone)")
    return out
