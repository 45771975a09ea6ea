"""The kernel's own run queues, read from ``/sys/kernel/debug/sched/debug`` (debugfs, root).

The file prints, per CPU, ``.nr_running`` (every task on that run queue, of every scheduling class,
the running one included) and a ``runnable tasks:`` list of the tasks whose ``task_cpu`` is that
CPU, one line each, starting with the state: ``>R`` the CPU's current task, `` R`` runnable,
`` S``/`` D``/... not runnable. The header's ``ktime`` is ``ktime_get()`` in ms, i.e.
CLOCK_MONOTONIC, the clock of the tracefs probe's "mono" trace clock: it dates the sample.

:func:`parse` turns the text into numbers; :class:`NrRunningSampler` reads it periodically during
a run; :func:`doctor_check` answers for the file in ``harmony doctor``. The file is generated
while the kernel runs on, CPU block after CPU block, without locking the run queues, so one sample
is not an instant: its rows carry the window [lo, hi] in which the kernel produced it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harmony.core.columns import Table
from harmony.core.errors import SchedDebugError  # noqa: F401  (raised here)
from harmony.core.osutil import format_cpulist, online_cpus
from harmony.hostfacts import MISSING, OK, WARN, check

if TYPE_CHECKING:   # frame()'s annotation; the guest agent keeps rows, loads no pandas
    import pandas as pd

SCHED_DEBUG = Path("/sys/kernel/debug/sched/debug")
#: where kernels before 5.13 print the same file
PROC_SCHED_DEBUG = Path("/proc/sched_debug")

#: The ``kernel_nr_running`` table of a run (kernel_nr_running.parquet):
#: :meth:`NrRunningSampler.frame`.
KERNEL_NR_RUNNING = Table("kernel_nr_running", "one row per sample and CPU, sample by sample", [
    ("ts",              "int64", "ns, CLOCK_MONOTONIC: the middle of the window"),
    ("lo",              "int64", "ns: start of the window in which the kernel wrote this sample "
                                 "(the header's ktime, or the start of the read)"),
    ("hi",              "int64", "ns: end of that window (the end of the read)"),
    ("cpu",             "int16", "the CPU"),
    ("nr_running",      "int32", "the kernel's count: every task on the run queue, of every "
                                 "class, the running one included"),
    ("listed_runnable", "int32", "tasks listed in state R"),
    ("experiment",      "int32", "of those, the experiment's tasks"),
    ("reader",          "int32", "1 if the sampler's own thread is among them"),
    ("others",          "int32", "listed runnable tasks that are neither"),
    ("other_comms",     "str",   "their comms, comma separated"),
])


@dataclasses.dataclass
class CpuView:
    nr_running: int
    tasks: list[tuple[int, str, bool, str]]  # (pid, state char, is current, comm) of listed tasks

    def runnable(self) -> list[int]:
        """Pids listed in state R (the current task included)."""
        return [pid for pid, state, _, _ in self.tasks if state == "R"]


@dataclasses.dataclass
class SchedDebug:
    ktime_ns: int | None
    cpus: dict[int, CpuView]


def _task_line(line: str) -> tuple[int, str, bool, str] | None:
    """One ``runnable tasks`` row: ``>R`` or `` <state>``, comm (%15s, may hold spaces), PID, ..."""
    if len(line) < 20 or line[0] not in " >" or line[1] == " " or line.startswith(" -"):
        return None
    rest = line[18:].split(None, 1)
    if not rest or not rest[0].isdigit():  # comm longer than 15 columns cannot happen; be safe
        parts = line[2:].split()
        digits = [p for p in parts[1:] if p.isdigit()]
        if not digits:
            return None
        return int(digits[0]), line[1], line[0] == ">", parts[0]
    return int(rest[0]), line[1], line[0] == ">", line[3:18].strip()


def parse(text: str) -> SchedDebug:
    """Parse the whole file. Raises SchedDebugError if it has no ``cpu#N`` block."""
    ktime = None
    cpus: dict[int, CpuView] = {}
    cur: CpuView | None = None
    in_tasks = False
    for line in text.splitlines():
        if line.startswith("cpu#"):
            try:
                n = int(line[4:].split(",", 1)[0])
            except ValueError:
                raise SchedDebugError(f"bad CPU header line {line[:40]!r}") from None
            cur = cpus[n] = CpuView(-1, [])
            in_tasks = False
        elif cur is None:
            if line.startswith("ktime"):
                try:
                    ms = line.split(":", 1)[1].strip()
                    whole, _, frac = ms.partition(".")
                    ktime = int(whole) * 1_000_000 + int((frac + "000000")[:6])
                except (IndexError, ValueError):
                    ktime = None
        elif line.startswith("  .nr_running") and cur.nr_running < 0:
            try:
                cur.nr_running = int(line.split(":", 1)[1])
            except (IndexError, ValueError):
                raise SchedDebugError(f"bad nr_running line {line[:60]!r}") from None
        elif line.startswith("runnable tasks:"):
            in_tasks = True
        elif in_tasks:
            row = _task_line(line)
            if row is not None:
                cur.tasks.append(row)
    if not cpus:
        raise SchedDebugError("no cpu#N block")
    missing = [c for c, v in cpus.items() if v.nr_running < 0]
    if missing:
        raise SchedDebugError(f"no .nr_running for CPU {missing[0]}")
    return SchedDebug(ktime, cpus)


def available(path: Path = SCHED_DEBUG) -> tuple[bool, str]:
    """(True, "") if the file can be read and parsed here, else (False, why)."""
    try:
        with open(path) as f:
            parse(f.read())
        return True, ""
    except FileNotFoundError:
        return False, (f"{path} does not exist (debugfs not mounted, or a kernel without "
                       "CONFIG_SCHED_DEBUG)")
    except PermissionError:
        return False, f"{path} is not readable (needs root)"
    except (OSError, SchedDebugError) as exc:
        return False, f"{path}: {exc}"


def doctor_check(debugfs: str | None, debugfs_mounted_now: bool = False,
                 mount_error: str = "") -> dict:
    """``harmony doctor``'s ``sched_debug`` check: is the file readable (``sched/debug`` in
    ``debugfs``, mounted there, else :data:`PROC_SCHED_DEBUG`), and does it give ``nr_running``
    for every online CPU? ``debugfs_mounted_now``: the doctor mounted it (``mount_error``: why it
    could not)."""
    candidates = ([Path(debugfs) / "sched/debug"] if debugfs else []) + [PROC_SCHED_DEBUG]
    online = online_cpus()
    tried = []
    for path in candidates:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        except OSError as e:
            tried.append(f"{path}: {e.strerror or e}")
            continue
        try:
            shown = sorted(parse(text).cpus)
        except SchedDebugError:
            shown = []
        shows = bool(online) and all(c in shown for c in online)
        listed = format_cpulist(shown) if shown else "none"
        detail = (f"{path} readable; nr_running for "
                  f"{'every online CPU' if shows else 'CPUs ' + listed}")
        if debugfs_mounted_now:
            detail += " (mounted debugfs now)"
        return check(OK if shows else WARN, detail, path=str(path), readable=True,
                     nr_running_per_cpu=shows, debugfs=debugfs,
                     debugfs_mounted_by_doctor=debugfs_mounted_now)
    if tried:
        why = "; ".join(tried)
    elif debugfs is None:
        why = ("debugfs not mounted" + (f" (mount failed: {mount_error})" if mount_error else "")
               + ", no /proc/sched_debug")
    else:
        why = "no sched/debug in debugfs (CONFIG_SCHED_DEBUG off?), no /proc/sched_debug"
    return check(WARN if tried else MISSING, why, path=None, readable=False,
                 nr_running_per_cpu=False, debugfs=debugfs,
                 debugfs_mounted_by_doctor=debugfs_mounted_now)


class NrRunningSampler(threading.Thread):
    """Reads the sched debug file ``hz`` times a second during a run (as a thread of its own, or
    through :meth:`sample` from another sampler's loop).

    One row per sample and CPU of ``cpus`` (:data:`KERNEL_NR_RUNNING`). ``pids`` are the
    experiment's tasks; the reading thread, which is running while it reads, is counted apart.
    """

    def __init__(self, pids: list[int], cpus: list[int], hz: float, path: Path = SCHED_DEBUG):
        super().__init__(name="nr-running-sampler", daemon=True)
        self.pids, self.cpus, self.period, self.path = set(pids), list(cpus), 1.0 / hz, path
        self.rows: list[tuple] = []
        self.errors: list[str] = []  # the first few read or parse failures (samples skipped)
        self.stopping = threading.Event()
        self._fd: int | None = None

    def run(self):
        me = threading.get_native_id()
        try:
            while not self.stopping.wait(self.period):
                self.sample(me)
        finally:
            self.close()

    def sample(self, reader_tid: int) -> None:
        """Read the file once and add one row per CPU; ``reader_tid`` is the calling thread's id."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            os.lseek(self._fd, 0, os.SEEK_SET)
            chunks = []
            while True:
                b = os.read(self._fd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            view = parse(b"".join(chunks).decode("utf-8", "replace"))
        except (OSError, SchedDebugError) as exc:
            if len(self.errors) < 10:
                self.errors.append(f"{self.path}: {getattr(exc, 'strerror', None) or exc}")
            return
        lo = view.ktime_ns if view.ktime_ns and before <= view.ktime_ns <= after else before
        for cpu in self.cpus:
            v = view.cpus.get(cpu)
            if v is None:
                continue
            run = [(pid, comm) for pid, state, _, comm in v.tasks if state == "R"]
            exp = sum(pid in self.pids for pid, _ in run)
            reader = sum(pid == reader_tid for pid, _ in run)
            others = [comm for pid, comm in run if pid not in self.pids and pid != reader_tid]
            self.rows.append(((lo + after) // 2, lo, after, cpu, v.nr_running, len(run), exp,
                              reader, len(others), ",".join(others)))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def frame(self) -> pd.DataFrame:
        """The samples taken, as a :data:`KERNEL_NR_RUNNING` table."""
        return KERNEL_NR_RUNNING.from_rows(self.rows)
