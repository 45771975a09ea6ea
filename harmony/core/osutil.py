"""Operating-system helpers every other module may use: the leaf of Harmony's imports.

Standard library only, no Harmony import: the fork server and the workers
(:mod:`harmony.workload.worker`) import it, and they must stay small.

- processes: :func:`pid_alive`, :func:`proc_starttime`, :func:`prctl`, :func:`die_with_parent`,
  :func:`sched_getcpu`; Harmony's own child processes: :func:`harmony_python`
- futexes: :func:`futex` (shared futex words, ``FUTEX_WAIT`` / ``FUTEX_WAKE``)
- CPU lists: :func:`parse_cpulist`, :func:`format_cpulist`, :func:`read_cpulist_file`,
  :func:`online_cpus`
- directories and files it creates, never through a planted link: :func:`own_dir`,
  :func:`open_own_file`; its host lock and markers: :data:`LOCK_DIRS`, :func:`lock_dir`
- processes a run leaves behind if its controller dies (a VM, a sched_ext scheduler):
  :func:`record_processes`, :func:`forget_processes`, :func:`stale_processes`,
  :func:`record_path`, :func:`comm`
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import signal
import stat
import tempfile
import threading
from pathlib import Path

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no C library to load
    _libc = None

# --------------------------------------------------------------------------------------------
# processes

PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_TIMERSLACK = 1, 15, 29


def harmony_top() -> str:
    """The directory this Harmony is imported from: the one holding its ``harmony`` package (a
    site directory, a source tree, or the VM agent's bundle, :mod:`harmony.vm.bundle`)."""
    import sys

    return os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["harmony"].__file__)))


def harmony_python(module: str, *args: str, env: dict | None = None,
                   site: bool = True) -> tuple[list[str], dict]:
    """The argv and environment of a child ``python -m module args`` that runs this very Harmony,
    whichever directory it starts in (``env``: the environment to extend, default this process's).

    ``-P``: the current directory stays off the child's path, where a clone's ``harmony/`` (a
    part of the package: see setup.cfg's package_dir) would shadow the installed one. Where this
    Harmony comes from a source tree rather than an installed site directory, the tree leads the
    child's PYTHONPATH, so that the child finds it without the current directory.

    ``site=False``: ``-S`` too, for a child that imports the standard library and Harmony alone
    (the VM agent, the fork server, the server's calibration): no site directory is processed
    (its .pth files import what they name: 1.6 s of each start in a TCG guest over 9p,
    bench/README.md), and the directory holding this Harmony leads its PYTHONPATH wherever it is.
    """
    import sys
    import sysconfig

    env = dict(os.environ if env is None else env)
    top = harmony_top()
    sites = {os.path.abspath(p) for p in (sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"])}
    if top not in sites or not site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (top, env.get("PYTHONPATH")) if p)
    return [sys.executable, *([] if site else ["-S"]), "-P", "-m", module, *args], env


#: the signals a command is stopped by (Ctrl-C, kill, a closed terminal)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class signals_held:
    """A section no stopping signal (:data:`STOP_SIGNALS`) interrupts: one that comes meanwhile
    is recorded by a handler of this section's, and sent again as it ends, to the handler it has
    (a KeyboardInterrupt raised there). For state that must change together with what a system
    call did, such as a thread started and kept where its stop will find it. Python-level, not
    a signal mask: a process's signal is taken by any thread that does not block it, and Python
    runs its handler in the main thread whichever took it. Only the main thread is interrupted
    by a handler, so elsewhere (and for a signal whose handler Python did not install) this does
    nothing. It costs ~18 us natively (six sigaction calls): one section a step, not one a call."""

    def __enter__(self):
        self._seen: list[int] = []
        self._old: dict = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                old = signal.getsignal(sig)
                if old is not None:
                    self._old[sig] = signal.signal(sig, self._later)
        return self

    def _later(self, signum, frame) -> None:
        self._seen.append(signum)

    def __exit__(self, *exc) -> bool:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        for sig in dict.fromkeys(self._seen):
            signal.raise_signal(sig)
        return False


def pid_alive(pid: int) -> bool:
    """A process with this pid exists (it may be another's: EPERM still means alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def proc_starttime(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None if
    it is gone: with the pid, it names a process even after its pid is recycled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def proc_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (state Z or X): it runs nothing, and
    killing it does nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] in ("Z", "X")


def sched_getcpu() -> int:
    """The CPU this thread runs on now (-1 if the C library cannot tell)."""
    try:
        return int(_libc.sched_getcpu())
    except AttributeError:  # pragma: no cover - not glibc
        return -1


def prctl(option: int, arg) -> None:
    """prctl(2) with one argument; OSError on failure."""
    if _libc is None or _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno() if _libc is not None else 38  # ENOSYS
        raise OSError(err, os.strerror(err))


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Ask the kernel to SIGKILL this process when the thread that forked it dies
    (PR_SET_PDEATHSIG). Returns False if the parent is gone already (then the request can never
    fire: the caller should exit), or if the request was refused; True otherwise.

    ``parent_pid``: the parent expected; default: whoever it is now, unless that is init (the
    parent died before the request: nobody is left to wait for).
    """
    try:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except OSError:
        return False
    parent = os.getppid()
    return parent == parent_pid if parent_pid is not None else parent != 1


# --------------------------------------------------------------------------------------------
# futexes

SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "ppc64le": 221, "ppc64": 221,
             "s390x": 238, "i686": 240, "armv7l": 240}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # shared futexes: no FUTEX_PRIVATE_FLAG (128)
WAKE_ALL = 0x7FFFFFFF


def futex(addr: int, op: int, val: int) -> int:
    """futex(2) on the int32 at address ``addr`` (no timeout); the syscall's return value."""
    return _libc.syscall(SYS_FUTEX, ctypes.c_void_p(addr), op, val, None, None, 0)


# --------------------------------------------------------------------------------------------
# scheduling classes: SCHED_DEADLINE has no call in the os module, only sched_setattr(2)

SCHED_DEADLINE = 6
SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274, "riscv64": 274, "ppc64le": 355, "ppc64": 355,
                     "s390x": 345, "i686": 351, "armv7l": 380}.get(platform.machine())
SYS_SCHED_GETATTR = None if SYS_SCHED_SETATTR is None else SYS_SCHED_SETATTR + 1


class SchedAttr(ctypes.Structure):
    """struct sched_attr (include/uapi/linux/sched/types.h), SCHED_ATTR_SIZE_VER0 (48 bytes):
    times in ns."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64)]


def sched_setattr(pid: int, policy: int, priority: int = 0, nice: int = 0, runtime_ns: int = 0,
                  deadline_ns: int = 0, period_ns: int = 0) -> None:
    """sched_setattr(2) of ``pid`` (0: the calling thread): any policy, SCHED_DEADLINE's
    runtime / deadline / period included. OSError with the kernel's errno on failure (for
    SCHED_DEADLINE: EBUSY when admission control refuses the bandwidth, EPERM when the task's
    CPU affinity is smaller than its root domain, EINVAL for runtime > deadline > period or a
    period outside sched_deadline_period_{min,max}_us)."""
    if _libc is None or SYS_SCHED_SETATTR is None:
        raise OSError(38, f"sched_setattr: no system call number known for {platform.machine()}")
    attr = SchedAttr(ctypes.sizeof(SchedAttr), policy, 0, nice, priority, runtime_ns,
                     deadline_ns, period_ns)
    if _libc.syscall(SYS_SCHED_SETATTR, int(pid), ctypes.byref(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def sched_getattr(pid: int) -> SchedAttr:
    """sched_getattr(2) of ``pid``: its policy, priority, nice and deadline parameters."""
    if _libc is None or SYS_SCHED_GETATTR is None:
        raise OSError(38, f"sched_getattr: no system call number known for {platform.machine()}")
    attr = SchedAttr()
    if _libc.syscall(SYS_SCHED_GETATTR, int(pid), ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return attr


# --------------------------------------------------------------------------------------------
# CPU lists

SYSFS = Path("/sys")
_MAX_CPU = 1 << 16  # well above any NR_CPUS; guards against "0-999999999"


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist such as ``"0-3,8,10-11"`` into a sorted list of CPU numbers.

    Strict: an empty list, a descending range, a negative or non-numeric entry, an empty item or
    a CPU listed twice raise :class:`ValueError` with a one-line message. Whitespace around items
    (and the trailing newline of a sysfs file) is ignored.
    """
    if not isinstance(text, str):
        raise ValueError(f"cpulist must be a string, not {type(text).__name__}")
    body = text.strip()
    if not body:
        raise ValueError("empty cpulist")
    cpus: set[int] = set()
    for raw in body.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty item in cpulist {body!r}")
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", item)
        if not m:
            raise ValueError(f"bad cpulist item {item!r} in {body!r}: "
                             f"expected N or N-M with N, M >= 0")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"descending range {item!r} in cpulist {body!r}")
        if hi >= _MAX_CPU:
            raise ValueError(f"CPU {hi} in cpulist {body!r} is out of range (max {_MAX_CPU - 1})")
        for cpu in range(lo, hi + 1):
            if cpu in cpus:
                raise ValueError(f"CPU {cpu} listed twice in cpulist {body!r}")
            cpus.add(cpu)
    return sorted(cpus)


def format_cpulist(cpus) -> str:
    """Format CPU numbers as a kernel cpulist: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``;
    ``[]`` -> ``""``."""
    values = []
    for c in cpus:
        if isinstance(c, bool) or not isinstance(c, int):
            raise ValueError(f"CPU numbers must be ints, got {c!r}")
        if c < 0:
            raise ValueError(f"negative CPU number {c}")
        values.append(c)
    values = sorted(set(values))
    parts = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def read_cpulist_file(path: Path) -> list[int] | None:
    """A sysfs/cgroup cpulist file: None if missing/unreadable/garbled, [] if empty or "(null)"."""
    try:
        text = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text in ("", "(null)"):
        return []
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


def online_cpus(sysfs: str | Path = SYSFS) -> list[int]:
    """Online CPUs from ``/sys/devices/system/cpu/online``; falls back to the affinity mask."""
    cpus = read_cpulist_file(Path(sysfs) / "devices/system/cpu/online")
    if cpus:
        return cpus
    return sorted(os.sched_getaffinity(0))


# --------------------------------------------------------------------------------------------
# directories and files Harmony creates: never through a link someone planted at their path

DIR_MODE = 0o755


def own_dir(path: Path, owner: bool = True) -> Path:
    """Create the directory ``path`` (and its missing parents) with mode 0755 whatever the umask,
    or take it as it is; either way check, without following a symbolic link, that it is a
    directory -- not a link -- owned by this user and writable by it alone. OSError (naming the
    path and what is wrong) otherwise: a link or a directory planted in a shared place such as
    /tmp would make a root process write where someone else chose.

    Only the last component is checked (its parents may be anyone's: a user's home). ``owner``:
    it must be this user's (a lock directory); False: any owner's (a run directory the user made,
    for root to write in), but never a link and never writable by others."""
    path = Path(path)
    if not path.parent.exists():
        os.makedirs(path.parent, mode=DIR_MODE, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)          # the umask may have removed bits, never added them
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(f"{path} is a symbolic link (to {os.readlink(path)}): not followed")
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} exists and is not a directory")
    if owner and st.st_uid != os.geteuid():
        raise OSError(f"{path} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})")
    if st.st_mode & 0o022:
        raise OSError(f"{path} is writable by others (mode {st.st_mode & 0o777:o})")
    return path


def open_own_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o644) -> int:
    """os.open of a file in a directory of :func:`own_dir`, never through a symbolic link at its
    path (O_NOFOLLOW); OSError if it is one."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


#: the files Harmony writes: readable by every user (a report, an import, a card need no root),
#: written by their owner alone
FILE_MODE = 0o644


#: whether :func:`atomic_write` makes each file durable (fsync) before it replaces the old one;
#: the VM agent turns it off (:func:`no_fsync`)
_fsync = True


def no_fsync() -> None:
    """From now on, files :func:`atomic_write` writes in this process are not fsynced before
    their rename (readers still see the old file or the new one, never a part). For the VM
    agent: its files go to the host through the share (9p), where each fsync is a round trip
    to the host's disk (36 ms a manifest under TCG, six a run: bench/README.md), and the host
    rewrites durably what it keeps (each run's manifest and tables, as it lands the run). A
    guest that dies leaves its writes in the host's page cache: only the host's own crash loses
    them, and that ends the VM and marks its runs incomplete all the same."""
    global _fsync
    _fsync = False


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part;
    durable (fsynced) before the rename unless :func:`no_fsync` was called."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except FileNotFoundError:       # its directory made only where it is missing: a round trip
        path.parent.mkdir(parents=True, exist_ok=True)      # less a write on a VM's share
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            if _fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------------------------
# where Harmony keeps its host lock (harmony.hygiene) and the cpuset marker
# (harmony.workload.cpuset)

LOCK_DIRS = (Path("/run/harmony"), Path("/tmp/harmony"))


def lock_dir() -> Path:
    """The first of :data:`LOCK_DIRS` that is, or can be made, a directory of this user's own
    (:func:`own_dir`); OSError naming each one's problem if none can."""
    problems = []
    for d in LOCK_DIRS:
        try:
            return own_dir(d)
        except OSError as exc:
            problems.append(str(exc))
    raise OSError("no lock directory: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------
# processes a run starts that would outlive a killed controller (a VM's QEMU, a sched_ext
# scheduler): recorded under the lock directory with their start times, so that the next start
# stops them, and never a process that merely got a recycled pid

def comm(pid: int) -> str:
    """The command name of ``pid`` ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def record_path(kind: str, pid: int | None = None) -> Path:
    """Where the record of ``kind`` of controller ``pid`` (default: this process) is."""
    return lock_dir() / f"{kind}-{pid or os.getpid()}.json"


def record_processes(kind: str, pids, **facts) -> None:
    """Record (or re-record) that this controller started ``pids`` for a ``kind`` of thing
    ("vm", "scx"), with their start times and ``facts`` (JSON-able) for the lines the
    reclaimer writes. Best effort: a record that cannot be written only loses the reclaim."""
    rec = {"controller_pid": os.getpid(), "controller_start": proc_starttime(os.getpid()),
           "pids": [{"pid": p, "start": proc_starttime(p)} for p in pids if p], **facts}
    try:
        record_path(kind).write_text(json.dumps(rec) + "\n")
    except OSError:
        pass


def forget_processes(kind: str) -> None:
    """Remove this controller's record of ``kind`` (its processes are stopped)."""
    try:
        record_path(kind).unlink()
    except OSError:
        pass


def stale_records(kind: str):
    """Yield each record of ``kind`` (:func:`record_processes`) whose controller is gone; a record
    is removed once the caller has handled it (resumed the generator). Records of live controllers
    are left alone; a record that cannot be read is yielded empty, then removed."""
    for d in LOCK_DIRS:
        try:
            paths = sorted(d.glob(f"{kind}-*.json")) if d.is_dir() else []
        except OSError:
            continue
        for path in paths:
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                rec = {}
            owner = rec.get("controller_pid")
            if owner and proc_starttime(owner) is not None \
                    and proc_starttime(owner) == rec.get("controller_start"):
                continue          # its controller still runs
            yield rec
            try:
                path.unlink()
            except OSError:
                pass


def stale_processes(kind: str):
    """Yield ``(record, pid)`` for each recorded process of ``kind`` still alive (same start
    time) whose controller is gone (:func:`stale_records`: the caller stops each as it is
    yielded, the record is removed after its processes)."""
    for rec in stale_records(kind):
        for p in rec.get("pids", []):
            # a zombie (an exited reaper its dead controller left to init) runs nothing
            if (p.get("start") is not None and proc_starttime(p["pid"]) == p["start"]
                    and not proc_zombie(p["pid"])):
                yield rec, p["pid"]
