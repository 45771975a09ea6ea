"""The workload controller: real worker processes placed, held, released at t0 and stopped.

Protocol (thesis 6.1: the imbalance is created "instantly rather than slowly accrued"):

1. ``spawn()`` forks one worker per :class:`TaskSpec`, all in one process group. Each worker sets
   its comm and nice, is confined to its initial CPU, then sleeps on the start gate of that CPU (a
   futex word in shared memory): it exists but is not runnable. The controller waits until every
   worker sleeps at its gate. Confinement is a cpuset cgroup per initial CPU
   (:mod:`harmony.cpuset`, the worker joins it) or, where cpusets are unavailable, the worker's
   own affinity mask; ``pinned`` tasks (static-ideal runs) always pin their own affinity.
2. ``release(mark)`` runs on the CPU holding the most tasks (their wake-ups are then local, half
   the cost of remote ones) as SCHED_FIFO (when allowed: the workers it wakes cannot preempt it
   half-way). It writes the t0 marker, wakes each gate with one FUTEX_WAKE (the workers become
   runnable on their initial CPUs, so the layout is exactly what the scheduler sees at t0), then
   frees the tasks to the experiment CPU set: one ``cpuset.cpus`` write per initial CPU, or one
   ``sched_setaffinity`` per task on the fallback; then it writes the "released" marker. Waking
   before freeing matters: a task freed while asleep would be placed by the wake-up path and the
   layout would never exist.
3. ``stop()`` kills the group, reaps every worker and removes the cgroups. Workers carry
   PR_SET_PDEATHSIG=SIGKILL, so they die with the controller even if it is killed with SIGKILL (a
   worker still asleep at its gate too); the cgroups of a killed controller are removed by the next
   start or ``harmony clean`` (:func:`harmony.cpuset.reclaim_stale`).

``HARMONY_RELEASE_PLACEMENT`` (expert option, for comparisons) = ``cpuset`` | ``affinity`` forces a
confinement; default ``auto``: cpusets when available. ``release_method`` says which one a
workload used; the notes say why cpusets were not.

Each worker counts its work loops in a shared array (``work_done()``), the raw material for the
observer-effect and slowdown measurements.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import mmap
import os
import platform
import random
import signal
import time

import numpy as np

from harmony.cpuset import CpusetGroups, CpusetUnavailable
from harmony.tasks import TaskSpec

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_TIMERSLACK = 1, 15, 29
SPIN_UNIT = 2000  # loop iterations between two work-counter updates (~tens of microseconds)
SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "ppc64le": 221, "ppc64": 221,
             "s390x": 238, "i686": 240, "armv7l": 240}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAKE_ALL = 0x7FFFFFFF
ENV_PLACEMENT = "HARMONY_RELEASE_PLACEMENT"
PLACEMENTS = ("auto", "cpuset", "affinity")


class ControllerError(RuntimeError):
    """The workload could not be created or released; the message is one line for the user."""


def _prctl(option: int, arg) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _futex(addr: int, op: int, val: int) -> int:
    return _libc.syscall(SYS_FUTEX, ctypes.c_void_p(addr), op, val, None, None, 0)


def _wait_at_gate(gate: np.ndarray, addr: int) -> None:
    """Sleep until the controller opens ``gate`` (a shared int32 futex word, 0 = closed)."""
    while gate[0] == 0:
        if _futex(addr, FUTEX_WAIT, 0) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.EINTR):  # never spin on a broken gate
                raise OSError(err, os.strerror(err))


def _spin_for(cpu_ns: int, counter: np.ndarray, slot: int) -> int:
    """Burn ``cpu_ns`` of this thread's CPU time; return the CPU time actually used."""
    start = time.thread_time_ns()
    end = start + cpu_ns
    while True:
        for _ in range(SPIN_UNIT):
            pass
        counter[slot] += 1
        now = time.thread_time_ns()
        if now >= end:
            return now - start


def _worker(slot: int, spec: TaskSpec, cpus: list[int], counter: np.ndarray, t0_cell: np.ndarray,
            parent: int, seed: int, join: str | None, gate: np.ndarray, gate_addr: int,
            ready: np.ndarray) -> None:
    """Body of one worker process (never returns). ``join``: the cgroup.procs file of the cpuset
    that confines it until t0, or None to pin its own affinity instead."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the controller died before the death signal was armed
        os._exit(1)
    _prctl(PR_SET_NAME, spec.comm.encode())
    _prctl(PR_SET_TIMERSLACK, 1)  # 1 ns: sleeps of a duty cycle end when asked, not 50 us later
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.setpriority(os.PRIO_PROCESS, 0, spec.nice)
    if join is None:
        os.sched_setaffinity(0, {spec.initial_cpu})
    else:
        # never pin as well: the affinity mask and the cpuset intersect. The run's set, so the
        # mask the cpuset widens to does not depend on what the controller was started with.
        os.sched_setaffinity(0, set(cpus))
        with open(join, "w") as f:
            f.write(str(os.getpid()))
    ready[slot] = 1
    _wait_at_gate(gate, gate_addr)  # held here until t0

    rng = random.Random(seed)
    t0 = int(t0_cell[0]) or time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    stop_at = t0 + int(spec.stop_after_s * 1e9) if spec.stop_after_s is not None else None
    cut_at = t0 + int(spec.cut_duty_at_s * 1e9) if spec.cut_duty_at_s is not None else None
    duty, period_ns = spec.duty, spec.period_ms * 1e6
    run_total = sleep_total = 0
    cpu_mark = time.thread_time_ns()  # CPU time already counted in run_total
    while True:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if stop_at is not None and now >= stop_at:
            os._exit(0)
        if cut_at is not None and now >= cut_at:
            duty, cut_at = spec.cut_duty, None
            run_total = sleep_total = 0
            cpu_mark = time.thread_time_ns()
        if duty <= 0:
            # blocked for the rest of the run (or until its exit time)
            time.sleep(max(0.0, (stop_at - now) / 1e9) if stop_at is not None else 3600.0)
            continue
        if duty >= 100:
            _spin_for(1_000_000, counter, slot)
            continue
        # Randomised run length; the sleep is fed back from the totals so the long-run duty is
        # exact even though every sleep overshoots a little. run_total is all the CPU time the
        # worker used (the loop's own overhead and the sleep calls included, ~0.5 pp at a 10 ms
        # period otherwise); sleep_total the wall time asleep less the CPU time of the sleep call.
        _spin_for(int(period_ns * duty / 100 * rng.uniform(0.5, 1.5)), counter, slot)
        now_cpu = time.thread_time_ns()
        run_total += now_cpu - cpu_mark
        cpu_mark = now_cpu
        want = run_total * (100 - duty) / duty - sleep_total
        if want > 0:
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            time.sleep(want / 1e9)
            slept = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - before
            now_cpu = time.thread_time_ns()
            sleep_total += slept - (now_cpu - cpu_mark)
            run_total += now_cpu - cpu_mark
            cpu_mark = now_cpu


def _state(pid: int) -> bytes | None:
    """The process state letter from /proc/<pid>/stat (R, S, Z, ...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


class Workload:
    """A set of worker processes for one run. Use as a context manager: leaving kills them all."""

    def __init__(self, specs: list[TaskSpec], cpus: list[int], seed: int = 0, placement: str | None = None):
        if not specs:
            raise ControllerError("the workload has no tasks")
        self.specs = list(specs)
        self.cpus = list(cpus)
        self.seed = seed
        self.placement = placement or os.environ.get(ENV_PLACEMENT, "auto")
        if self.placement not in PLACEMENTS:
            raise ControllerError(f"{ENV_PLACEMENT}={self.placement!r}: expected one of {', '.join(PLACEMENTS)}")
        if SYS_FUTEX is None:
            raise ControllerError(f"no futex system call number known for {platform.machine()}")
        self.pids: list[int] = []
        self._unreaped: set[int] = set()
        self.pgid: int | None = None
        self.notes: list[str] = []
        self.cpusets: CpusetGroups | None = None
        self.release_method: str | None = None  # "cpuset" or "affinity", known after spawn()
        n = len(specs)
        self._shm = mmap.mmap(-1, 8 * (n + 1), flags=mmap.MAP_SHARED)
        cells = np.frombuffer(self._shm, dtype=np.int64)
        self._t0 = cells[:1]
        self._work = cells[1:]
        # one start gate (futex word) per initial CPU, then one "at the gate" flag per worker
        self._gate_cpus = sorted({s.initial_cpu for s in specs})
        self._gates_shm = mmap.mmap(-1, 4 * (len(self._gate_cpus) + n), flags=mmap.MAP_SHARED)
        words = np.frombuffer(self._gates_shm, dtype=np.int32)
        self._gates, self._ready = words[:len(self._gate_cpus)], words[len(self._gate_cpus):]
        self._gates_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._gates_shm))

    def _gate(self, cpu: int) -> tuple[np.ndarray, int]:
        i = self._gate_cpus.index(cpu)
        return self._gates[i:i + 1], self._gates_addr + 4 * i

    def _confine(self) -> None:
        """Choose how tasks are held on their initial CPU: cpuset cgroups if possible."""
        free = sorted({s.initial_cpu for s in self.specs if not s.pinned})
        if self.placement != "affinity" and free:
            cs = CpusetGroups(free, self.cpus)
            try:
                cs.create()
                self.cpusets, self.release_method = cs, "cpuset"
                return
            except CpusetUnavailable as exc:
                if self.placement == "cpuset":
                    raise ControllerError(f"{ENV_PLACEMENT}=cpuset: {exc}") from None
                self.notes.append(f"release by sched_setaffinity per task (cpusets unavailable: {exc})")
        self.release_method = "affinity"

    # -- life cycle ---------------------------------------------------------------------------
    def spawn(self, timeout_s: float = 30.0) -> None:
        """Fork every worker and wait until all of them are held at their start gate."""
        self._confine()
        parent = os.getpid()
        for slot, spec in enumerate(self.specs):
            join = (self.cpusets.procs_file(spec.initial_cpu)
                    if self.cpusets is not None and not spec.pinned else None)
            gate, addr = self._gate(spec.initial_cpu)
            pid = os.fork()
            if pid == 0:  # child
                try:
                    os.setpgid(0, self.pgid or 0)
                    _worker(slot, spec, self.cpus, self._work, self._t0, parent,
                            seed=self.seed * 100_003 + slot, join=join, gate=gate, gate_addr=addr,
                            ready=self._ready)
                except BaseException:
                    os._exit(1)
                os._exit(0)
            try:  # also from the parent: no race with the child's own setpgid
                os.setpgid(pid, self.pgid or pid)
            except (PermissionError, ProcessLookupError):
                pass
            if self.pgid is None:
                self.pgid = pid
            self.pids.append(pid)
            self._unreaped.add(pid)
        self._wait_at_gates(time.monotonic() + timeout_s, timeout_s)

    def _wait_at_gates(self, deadline: float, timeout_s: float) -> None:
        """Until every worker has flagged itself at its gate and sleeps there (state S)."""
        waiting = list(enumerate(self.pids))
        while waiting:
            left = []
            for slot, pid in waiting:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    self._unreaped.discard(pid)
                    raise ControllerError(f"worker {pid} died before t0 (status {status:#x})")
                if not (self._ready[slot] and _state(pid) == b"S"):
                    left.append((slot, pid))
            if left and time.monotonic() > deadline:
                raise ControllerError(f"worker {left[0][1]} did not reach the start gate in {timeout_s:.0f} s")
            waiting = left
            if waiting:
                time.sleep(0.001)

    def release(self, mark) -> tuple[int, int]:
        """Release every worker at once; ``mark(text)`` writes a trace marker and returns its ns.

        Returns (t0, released): marker times before the first wake-up and after the last task
        was freed to the experiment CPU set.
        """
        allowed = set(self.cpus)
        free_pids = [pid for pid, spec in zip(self.pids, self.specs) if not spec.pinned]
        counts = {c: sum(s.initial_cpu == c for s in self.specs) for c in self._gate_cpus}
        home = max(counts, key=counts.get)
        own_mask = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {home})  # this thread only: the probe's threads stay where they are
        except OSError as exc:
            self.notes.append(f"release ran off CPU {home} ({exc.strerror}); spread may be larger")
        fifo = self._enter_fifo()
        collecting = gc.isenabled()
        gc.disable()  # no collection pause between the first wake-up and the last freed task
        try:
            self._t0[0] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            t0 = mark("harmony t0")
            for i in range(len(self._gate_cpus)):
                self._gates[i] = 1
                if _futex(self._gates_addr + 4 * i, FUTEX_WAKE, WAKE_ALL) < 0:
                    err = ctypes.get_errno()
                    raise ControllerError(f"the start gate could not be opened: {os.strerror(err)}")
            if self.cpusets is not None:
                self.cpusets.widen()
            else:
                for pid in free_pids:
                    os.sched_setaffinity(pid, allowed)
            released = mark("harmony released")
        finally:
            if collecting:
                gc.enable()
            if fifo:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            os.sched_setaffinity(0, own_mask)
        return t0, released

    def _enter_fifo(self) -> bool:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            return True
        except (PermissionError, OSError) as exc:
            self.notes.append(f"release ran without SCHED_FIFO ({exc.strerror}); spread may be larger")
            return False

    def alive(self) -> list[int]:
        """Pids of workers that have not exited (zombies excluded)."""
        return [pid for pid in self.pids if _state(pid) not in (None, b"Z", b"X")]

    def work_done(self) -> np.ndarray:
        """Work loops completed by each worker so far (units of SPIN_UNIT iterations)."""
        return self._work.copy()

    def stop(self) -> None:
        """Kill and reap every worker. Idempotent; safe to call from any error path."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self._unreaped:  # also workers that left the group (there should be none)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in sorted(self._unreaped):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self._unreaped.clear()  # never signal a reaped pid again: it may belong to someone else now
        self.pgid = None
        if self.cpusets is not None:
            self.notes.extend(self.cpusets.remove())
            self.cpusets = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
