"""The workload controller: real worker processes placed, held, released at t0 and stopped.

Protocol (thesis 6.1: the imbalance is created "instantly rather than slowly accrued"):

1. ``spawn()`` forks one worker per :class:`TaskSpec`, all in one process group. Each worker pins
   itself to its initial CPU, sets its comm and nice, then stops itself (SIGSTOP): it exists but is
   not runnable. The controller waits until every worker is stopped.
2. ``release(mark)`` writes the t0 marker, wakes the whole group with one ``killpg(SIGCONT)`` (the
   workers become runnable on their initial CPUs, so the layout is exactly what the scheduler sees
   at t0), then widens each worker's affinity to the experiment CPU set (except ``pinned`` tasks,
   which stay on their CPU: static-ideal runs) and writes a "released" marker. Waking before unpinning matters: a task unpinned while asleep would be placed by the
   wake-up path and the layout would never exist. The controller runs SCHED_FIFO during the release
   (when allowed) so the workers it wakes cannot preempt it half-way.
3. ``stop()`` kills the group and reaps every worker. Workers carry PR_SET_PDEATHSIG=SIGKILL, so
   they die with the controller even if it is killed with SIGKILL.

Each worker counts its work loops in a shared array (``work_done()``), the raw material for the
observer-effect and slowdown measurements.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import signal
import time

import numpy as np

from harmony.tasks import TaskSpec

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_TIMERSLACK = 1, 15, 29
SPIN_UNIT = 2000  # loop iterations between two work-counter updates (~tens of microseconds)


class ControllerError(RuntimeError):
    """The workload could not be created or released; the message is one line for the user."""


def _prctl(option: int, arg) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
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
            parent: int, seed: int) -> None:
    """Body of one worker process (never returns)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the controller died before the death signal was armed
        os._exit(1)
    _prctl(PR_SET_NAME, spec.comm.encode())
    _prctl(PR_SET_TIMERSLACK, 1)  # 1 ns: sleeps of a duty cycle end when asked, not 50 us later
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.setpriority(os.PRIO_PROCESS, 0, spec.nice)
    os.sched_setaffinity(0, {spec.initial_cpu})
    os.kill(os.getpid(), signal.SIGSTOP)  # the gate: held here until t0

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


class Workload:
    """A set of worker processes for one run. Use as a context manager: leaving kills them all."""

    def __init__(self, specs: list[TaskSpec], cpus: list[int], seed: int = 0):
        if not specs:
            raise ControllerError("the workload has no tasks")
        self.specs = list(specs)
        self.cpus = list(cpus)
        self.seed = seed
        self.pids: list[int] = []
        self._unreaped: set[int] = set()
        self.pgid: int | None = None
        self.notes: list[str] = []
        n = len(specs)
        self._shm = mmap.mmap(-1, 8 * (n + 1), flags=mmap.MAP_SHARED)
        cells = np.frombuffer(self._shm, dtype=np.int64)
        self._t0 = cells[:1]
        self._work = cells[1:]

    # -- life cycle ---------------------------------------------------------------------------
    def spawn(self, timeout_s: float = 30.0) -> None:
        """Fork every worker and wait until all of them are held at the gate (stopped)."""
        parent = os.getpid()
        for slot, spec in enumerate(self.specs):
            pid = os.fork()
            if pid == 0:  # child
                try:
                    os.setpgid(0, self.pgid or 0)
                    _worker(slot, spec, self.cpus, self._work, self._t0, parent,
                            seed=self.seed * 100_003 + slot)
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
        deadline = time.monotonic() + timeout_s
        for pid in self.pids:
            while True:
                got, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
                if got and os.WIFSTOPPED(status):
                    break
                if got:
                    raise ControllerError(f"worker {pid} died before t0 (status {status:#x})")
                if time.monotonic() > deadline:
                    raise ControllerError(f"worker {pid} did not reach the start gate in {timeout_s:.0f} s")
                time.sleep(0.001)

    def release(self, mark) -> tuple[int, int]:
        """Release every worker at once; ``mark(text)`` writes a trace marker and returns its ns.

        Returns (t0, released): marker times before the wake-up and after the last unpin.
        """
        fifo = self._enter_fifo()
        try:
            self._t0[0] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            t0 = mark("harmony t0")
            os.killpg(self.pgid, signal.SIGCONT)
            allowed = set(self.cpus)
            for pid, spec in zip(self.pids, self.specs):
                if not spec.pinned:
                    os.sched_setaffinity(pid, allowed)
            released = mark("harmony released")
        finally:
            if fifo:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
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
        out = []
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
                if state not in (b"Z", b"X"):
                    out.append(pid)
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
        return out

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
