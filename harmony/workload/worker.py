"""The body of one worker process, and the shared page it works on.

Imports the standard library only: it runs in the fork server (:mod:`harmony.workload.forkserver`),
which must stay small, and in the controller when that forks the workers itself.

The shared page of a workload (a memfd mapped MAP_SHARED by the controller, by the server and, by
inheritance, by every worker) holds, in order: the t0 cell and one work counter per worker
(int64), one start gate per initial CPU (an int32 futex word, 0 = closed), one "at the gate" flag
per worker (int32), the occupiers' order word and one state word per occupier (int32). The gates
are *shared* futexes (FUTEX_WAIT/FUTEX_WAKE without FUTEX_PRIVATE_FLAG): the kernel keys them by
the memfd's page, so a wake from the controller's mapping reaches waiters in the workers' mappings.

A worker puts itself in its scheduling class (:func:`enter_class`) before it sleeps at its gate;
one the kernel refuses writes minus the errno into its "at the gate" flag and exits, so that the
controller can say why in one line. A SCHED_DEADLINE worker enters its class first, while its
CPU affinity still spans its root domain (the kernel refuses a deadline task a smaller one, EPERM,
and a smaller affinity to a deadline task, EBUSY), and is then confined by joining its cpuset:
the cpuset path does not check, and widening the cpuset at t0 frees it like any other.

In a warm release the gates open before t0 (the tasks run confined to their initial CPU): a
worker reads t0 from the shared page as it works, and counts its stop and cut times from it once
the controller has written it.

An occupier (:func:`occupy`) is not a task of the experiment: during the release it holds one
CPU of the set with a SCHED_FIFO busy loop, so that no CPU but a task's own is idle when the task
wakes, and opens the start gate of its CPU itself (see :mod:`harmony.workload.controller`).

A task of a server-shaped workload (its spec's ``serve``) runs its part of the server
(:mod:`harmony.workload.serve`) from its gate on, instead of the duty-cycle loop.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import time
import types

from harmony.core.osutil import (
    FUTEX_WAIT,
    FUTEX_WAKE,
    PR_SET_NAME,
    PR_SET_TIMERSLACK,
    SCHED_DEADLINE,
    STOP_SIGNALS,
    WAKE_ALL,
    die_with_parent,
    futex,
    prctl,
    sched_setattr,
)
from harmony.workload import serve

SPIN_UNIT = 2000  # loop iterations between two work-counter updates (~tens of microseconds)
#: the same for a server's request work (:mod:`harmony.workload.serve`), which a whole unit past its
#: end would lengthen: 0.5 us of CPU on this host, 7 us in a TCG guest where SPIN_UNIT takes 0.3 ms
#: alone and more with every vCPU busy (bench/README.md)
SERVE_SPIN_UNIT = 50


# the occupiers' order word (Shared.order), set by the controller
HOLD, OPEN, LEAVE = 1, 2, 3        # spin on your CPU; open your CPU's gate too; stop spinning
# an occupier's state word (Shared.occupier(k))
READY, HOLDING, OPENED, FAILED = 1, 2, 3, 4
OCCUPY_MAX_S = 1.0                 # an occupier never spins longer than this, whatever happens


class Shared:
    """Views of a workload's shared page (any writable buffer: an mmap)."""

    def __init__(self, buf, n: int, ngates: int, noccupiers: int = 0):
        self.n, self.ngates, self.noccupiers = n, ngates, noccupiers
        cells = 8 * (n + 1)
        mv = memoryview(buf)
        # [0]: t0 (ns, CLOCK_MONOTONIC; 0 until release), [1 + slot]: work
        self.cells = mv[:cells].cast("q")
        # [i]: gate i, [ngates + slot]: ready, [order]: the occupiers' order, [occupier(k)]: state
        self.words = mv[cells:self.size(n, ngates, noccupiers)].cast("i")
        self._words_addr = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + cells
        self.order = ngates + n

    @staticmethod
    def size(n: int, ngates: int, noccupiers: int = 0) -> int:
        return 8 * (n + 1) + 4 * (ngates + n + 1 + noccupiers)

    def occupier(self, k: int) -> int:
        """Index in ``words`` of occupier k's state."""
        return self.order + 1 + k

    def word_addr(self, i: int) -> int:
        return self._words_addr + 4 * i

    def gate_addr(self, i: int) -> int:
        return self.word_addr(i)


def kill_and_reap(pgid: int | None, pids) -> list[list[int]]:
    """SIGKILL the process group ``pgid`` and every one of ``pids`` (children of this process, not
    reaped yet: an unreaped member keeps the group's id from being reused, so the group is safe to
    signal), then reap them; returns [pid, wait status] of each."""
    pids = sorted(pids)
    if pgid is not None and pids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:  # also any that left the group (there should be none)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = []
    for pid in pids:
        try:
            out.append([pid, os.waitpid(pid, 0)[1]])
        except ChildProcessError:
            pass
    return out


def wait_at_gate(shared: Shared, gate: int) -> None:
    """Sleep until the controller opens start gate ``gate``."""
    addr = shared.gate_addr(gate)
    while shared.words[gate] == 0:
        if futex(addr, FUTEX_WAIT, 0) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.EINTR):  # never spin on a broken gate
                raise OSError(err, os.strerror(err))


def spin_for(cpu_ns: int, cells, slot: int, unit: int = SPIN_UNIT) -> int:
    """Burn ``cpu_ns`` of this thread's CPU time, looking at the clock every ``unit`` loop
    iterations (it ends up to one unit late); return the CPU time actually used."""
    start = time.thread_time_ns()
    end = start + cpu_ns
    i = 1 + slot
    while True:
        for _ in range(unit):
            pass
        cells[i] += 1
        now = time.thread_time_ns()
        if now >= end:
            return now - start


def start(task: dict, cpus: list[int], shared: Shared, parent: int, controller: int) -> None:
    """Body of a process the controller asked for (never returns): an occupier if ``task`` says
    ``kind: occupy``, else a worker (:func:`run`)."""
    if task.get("kind") == "occupy":
        occupy(task["k"], task["cpu"], task["gate"], task["prio"], shared, parent, controller)
    run(task["slot"], task["spec"], cpus, shared, task["gate"], parent, controller, task["seed"],
        task["join"])


def _adopt(parent: int, controller: int, comm: str) -> None:
    """A new child's first steps: die with the process that forked it, name itself."""
    if not die_with_parent(parent):  # that one died before the death signal was armed
        os._exit(1)
    # the server dies with the controller; this is the belt to those braces
    if controller != parent:
        try:
            os.kill(controller, 0)
        except ProcessLookupError:
            os._exit(1)
    prctl(PR_SET_NAME, comm.encode())
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def occupy(k: int, cpu: int, gate: int, prio: int, shared: Shared, parent: int,
           controller: int) -> None:
    """Body of occupier ``k`` (never returns): on ``cpu`` as SCHED_FIFO ``prio``, it waits for the
    controller's orders (the order word): HOLD = spin, OPEN = open start gate ``gate`` (-1: none)
    and go on spinning, LEAVE = sleep until killed with the workload. Its state word says where it
    is (READY, HOLDING, OPENED; FAILED if it could not get its CPU or its policy). It never spins
    longer than OCCUPY_MAX_S."""
    _adopt(parent, controller, f"hmy-occupy{cpu}"[:15])
    words, order, me = shared.words, shared.order, shared.occupier(k)
    try:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
    except OSError:
        words[me] = FAILED
        while True:
            signal.pause()
    words[me] = READY
    while words[order] == 0:
        futex(shared.word_addr(order), FUTEX_WAIT, 0)
    give_up = time.monotonic() + OCCUPY_MAX_S
    words[me] = HOLDING
    while words[order] == HOLD and time.monotonic() < give_up:
        pass
    if words[order] == OPEN:
        if gate >= 0:
            words[gate] = 1
            futex(shared.gate_addr(gate), FUTEX_WAKE, WAKE_ALL)
        words[me] = OPENED
        while words[order] == OPEN and time.monotonic() < give_up:
            pass
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    while True:
        signal.pause()


#: the os module's policy numbers of TaskSpec.policy (deadline: sched_setattr)
POLICY_NUMBERS = {"other": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE,
                  "fifo": os.SCHED_FIFO, "rr": os.SCHED_RR, "deadline": SCHED_DEADLINE}


def enter_class(spec) -> None:
    """Put the calling process in ``spec``'s scheduling class (OSError as the kernel refuses)."""
    policy = getattr(spec, "policy", "other")
    if policy == "deadline":
        ms = 1_000_000
        sched_setattr(0, SCHED_DEADLINE, runtime_ns=int(spec.dl_runtime_ms * ms),
                      deadline_ns=int((spec.dl_deadline_ms or spec.dl_period_ms) * ms),
                      period_ns=int(spec.dl_period_ms * ms))
    elif policy != "other":
        os.sched_setscheduler(0, POLICY_NUMBERS[policy], os.sched_param(spec.rt_priority))


def _enter_class_or_say(spec, shared: Shared, ready: int) -> None:
    """Enter the task's scheduling class; refused, write minus the errno into its flag (the
    controller says why, naming the class) and exit 3."""
    try:
        enter_class(spec)
    except OSError as exc:
        shared.words[ready] = -(exc.errno or errno.EINVAL)
        os._exit(3)


def run(slot: int, spec: dict, cpus: list[int], shared: Shared, gate: int, parent: int,
        controller: int, seed: int, join: str | None) -> None:
    """Body of one worker process (never returns), forked by ``parent`` (the controller or its fork
    server) for ``controller``. ``spec``: a TaskSpec's fields and its ``comm``. ``join``: the
    cgroup.procs file of the cpuset that confines it until t0, or None to pin its own affinity."""
    spec = types.SimpleNamespace(**spec)
    _adopt(parent, controller, spec.comm)
    prctl(PR_SET_TIMERSLACK, 1)  # 1 ns: sleeps of a duty cycle end when asked, not 50 us later
    os.setpriority(os.PRIO_PROCESS, 0, spec.nice)
    ready = shared.ngates + slot
    deadline = getattr(spec, "policy", "other") == "deadline"
    if deadline:  # while its affinity still spans the root domain (see the module docstring)
        _enter_class_or_say(spec, shared, ready)
    # a failure to take its place is not the class's: it propagates (the worker exits 1 and the
    # controller reports its status)
    if join is None:
        os.sched_setaffinity(0, {spec.initial_cpu})
    else:
        # never pin as well: the affinity mask and the cpuset intersect. The run's set, so the
        # mask the cpuset widens to does not depend on what the controller was started with
        # (a deadline task keeps the one it has: a smaller one is refused it).
        if not deadline:
            os.sched_setaffinity(0, set(cpus))
        with open(join, "w") as f:
            f.write(str(os.getpid()))
    if not deadline:
        _enter_class_or_say(spec, shared, ready)
    cells = shared.cells
    # a server-shaped task (TaskSpec.serve) binds and opens what it serves before its gate, so
    # that every peer can reach it once released, and runs its part instead of the loop below
    body = (serve.prepare(spec.serve, lambda ns: spin_for(ns, cells, slot, SERVE_SPIN_UNIT), seed)
            if getattr(spec, "serve", "") else None)
    shared.words[ready] = 1
    wait_at_gate(shared, gate)  # held here until t0 (cold), or until the warm-up starts (warm)
    if body is not None:
        body(cells)
        os._exit(0)

    rng = random.Random(seed)
    t0 = stop_at = cut_at = None
    duty, period_ns = spec.duty, spec.period_ms * 1e6
    run_total = sleep_total = 0
    cpu_mark = time.thread_time_ns()  # CPU time already counted in run_total
    while True:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if t0 is None and cells[0]:  # written before the gates open (cold), at t0 (warm)
            t0 = int(cells[0])
            stop_at = t0 + int(spec.stop_after_s * 1e9) if spec.stop_after_s is not None else None
            cut_at = t0 + int(spec.cut_duty_at_s * 1e9) if spec.cut_duty_at_s is not None else None
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
            spin_for(1_000_000, cells, slot)
            continue
        # Randomised run length; the sleep is fed back from the totals so the long-run duty is
        # exact even though every sleep overshoots a little. run_total is all the CPU time the
        # worker used (the loop's own overhead and the sleep calls included, ~0.5 pp at a 10 ms
        # period otherwise); sleep_total the wall time asleep less the CPU time of the sleep call.
        spin_for(int(period_ns * duty / 100 * rng.uniform(0.5, 1.5)), cells, slot)
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
