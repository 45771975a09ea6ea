"""Synthetic sched event streams: a builder for hand-written tests and a tiny simulator.

:class:`Stream` writes canonical events (see :mod:`harmony.probes.schema`) one tracepoint at a
time::

    ev = (Stream()
          .wakeup(100, cpu=0, pid=101, target=0)
          .switch(110, cpu=0, prev=0, state=0, next=101)
          .migrate(120, cpu=1, pid=102, orig=0, dest=1)
          .events())

:func:`simulate` produces a long, internally consistent random stream together with the exact
ground truth (run-queue length of the experiment tasks per CPU, CPU time per task), for property
tests and for measuring reconstruction speed.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd

from harmony.probes.schema import make_events

TASK_RUNNING = 0
TASK_INTERRUPTIBLE = 1
EXIT_DEAD = 16


class Stream:
    """Minimal builder of a canonical events table. Every method returns ``self``.

    ``names`` maps pid -> comm; other pids are named ``task<pid>`` (pid 0 is ``swapper/<cpu>``).
    Events may be added out of time order; :meth:`events` sorts them stably by ``ts``.
    """

    _COLS = ("ts", "cpu", "event", "common_pid", "pid", "comm", "prio", "prev_pid", "prev_comm",
             "prev_prio", "prev_state", "orig_cpu", "target_cpu")

    def __init__(self, names: dict[int, str] | None = None):
        self.names = dict(names or {})
        self._c = {k: [] for k in self._COLS}

    def __len__(self) -> int:
        return len(self._c["ts"])

    def _comm(self, pid: int, cpu: int) -> str:
        if pid < 0:             # an event about no task (a softirq's)
            return ""
        if pid == 0:
            return f"swapper/{cpu}"
        return self.names.get(pid, f"task{pid}")

    def _add(self, ts, cpu, event, common_pid, pid, prio=120, prev_pid=-1, prev_prio=-1,
             prev_state=-1, orig_cpu=-1, target_cpu=-1, prev_comm=""):
        c = self._c
        c["ts"].append(int(ts))
        c["cpu"].append(int(cpu))
        c["event"].append(event)
        c["common_pid"].append(int(common_pid))
        c["pid"].append(int(pid))
        c["comm"].append(self._comm(pid, cpu))
        c["prio"].append(prio)
        c["prev_pid"].append(int(prev_pid))
        c["prev_comm"].append(prev_comm)
        c["prev_prio"].append(prev_prio)
        c["prev_state"].append(int(prev_state))
        c["orig_cpu"].append(int(orig_cpu))
        c["target_cpu"].append(int(target_cpu))
        return self

    def switch(self, ts, cpu, prev, state, next, prev_prio=120, next_prio=120, common_pid=None):
        """sched_switch on ``cpu``: ``prev`` leaves in ``state`` (0 = runnable), ``next`` runs."""
        return self._add(ts, cpu, "sched_switch", prev if common_pid is None else common_pid, next,
                         prio=next_prio, prev_pid=prev, prev_prio=prev_prio, prev_state=state,
                         prev_comm=self._comm(prev, cpu))

    def wakeup(self, ts, cpu, pid, target, common_pid=-1):
        """sched_wakeup recorded on ``cpu``: ``pid`` becomes runnable on ``target``."""
        return self._add(ts, cpu, "sched_wakeup", common_pid, pid, target_cpu=target)

    def wakeup_new(self, ts, cpu, pid, target, common_pid=-1):
        """sched_wakeup_new recorded on ``cpu``: the new task ``pid`` is enqueued on ``target``."""
        return self._add(ts, cpu, "sched_wakeup_new", common_pid, pid, target_cpu=target)

    def waking(self, ts, cpu, pid, target, common_pid=-1):
        """sched_waking (start of a wakeup; changes no state)."""
        return self._add(ts, cpu, "sched_waking", common_pid, pid, target_cpu=target)

    def migrate(self, ts, cpu, pid, orig, dest, common_pid=-1):
        """sched_migrate_task recorded on ``cpu``: ``pid`` moves from ``orig`` to ``dest``."""
        return self._add(ts, cpu, "sched_migrate_task", common_pid, pid, orig_cpu=orig,
                         target_cpu=dest)

    def softirq(self, ts, cpu, entry: bool, vec: int = 7, common_pid=0):
        """irq:softirq_entry (``entry``) or irq:softirq_exit of vector ``vec`` (7: SCHED) on
        ``cpu``; the vector is in ``prio``, as the decoders put it."""
        return self._add(ts, cpu, "irq:softirq_entry" if entry else "irq:softirq_exit",
                         common_pid, -1, prio=vec)

    def move_numa(self, ts, cpu, pid, src, dst, common_pid=-1):
        """sched_move_numa: the NUMA balancer moves ``pid`` from CPU ``src`` to ``dst``."""
        return self._add(ts, cpu, "sched_move_numa", common_pid, pid, orig_cpu=src, target_cpu=dst)

    def exit(self, ts, cpu, pid):
        """sched_process_exit of ``pid`` (fires while it still runs; a dead switch-out follows)."""
        return self._add(ts, cpu, "sched_process_exit", pid, pid)

    def fork(self, ts, cpu, parent, child):
        """sched_process_fork: ``parent`` created ``child``."""
        c = self._add(ts, cpu, "sched_process_fork", parent, child, prio=-1, prev_pid=parent)
        self._c["prev_comm"][-1] = self._comm(parent, cpu)
        return c

    def events(self) -> pd.DataFrame:
        """The canonical events table."""
        return make_events({k: v for k, v in self._c.items()})


@dataclasses.dataclass
class Simulated:
    """Output of :func:`simulate`.

    events: canonical events table; tasks: the experiment tasks (pid, name, role, duty, nice,
    initial_cpu); truth_rq: one row per change of a CPU's count of runnable experiment tasks (ts,
    cpu, nr; nr after the event; no initial rows); truth_cpu_ns: pid -> CPU ns run in [t0, t_end];
    truth_migrations: ts, pid, src_cpu, dst_cpu, kind ("wakeup" or "balance") of every experiment
    task's migration; t0, t_end: release instant and window end (1 ms after the last event).
    """

    events: pd.DataFrame
    tasks: pd.DataFrame
    truth_rq: pd.DataFrame
    truth_cpu_ns: dict
    truth_migrations: pd.DataFrame
    t0: int
    t_end: int


def simulate(ncpus: int = 4, ntasks: int = 8, n_events: int = 10_000, seed: int = 0,
             n_others: int = 2, p_exit: float = 0.0):
    """A random but internally consistent sched event stream with its exact ground truth.

    Experiment tasks are pids 1000.., other (non-experiment) tasks pids 5000..; all start asleep,
    are woken at t0 = 1_000_000 ns, then the stream mixes preemptions, sleeps, wakeups (with a
    wakeup migration when the CPU changes), balance migrations of queued tasks and, with
    probability ``p_exit`` per step, exits of the running experiment task.

    Returns a :class:`Simulated`.
    """
    rng = random.Random(seed)
    exp = list(range(1000, 1000 + ntasks))
    others = list(range(5000, 5000 + n_others))
    s = Stream({p: f"exp{p - 1000}" for p in exp})
    state = {p: "S" for p in exp + others}
    where = {p: 0 for p in exp + others}
    curr = [0] * ncpus
    queue: list[list[int]] = [[] for _ in range(ncpus)]
    nr = [0] * ncpus
    is_exp = set(exp)
    truth = []
    migs = []
    run_start: dict[int, int] = {}
    cpu_ns = {p: 0 for p in exp}
    t0 = 1_000_000

    def bump(cpu, d, ts):
        nr[cpu] += d
        truth.append((ts, cpu, nr[cpu]))

    def switch(ts, c, prev_state):
        prev = curr[c]
        nxt = queue[c].pop(0) if queue[c] else 0
        s.switch(ts, c, prev, prev_state, nxt)
        if prev:
            if prev in run_start:
                cpu_ns[prev] += ts - run_start.pop(prev)
            if prev_state == TASK_RUNNING:
                state[prev] = "Q"
                queue[c].append(prev)
            else:
                state[prev] = "S" if prev_state != EXIT_DEAD else "X"
                if prev in is_exp:
                    bump(c, -1, ts)
        if nxt:
            state[nxt] = "R"
            if nxt in is_exp:
                run_start[nxt] = ts
        curr[c] = nxt

    everyone = exp + others
    ts = t0
    for p in everyone:  # release: everyone wakes on CPU 0
        ts += 1
        s.wakeup(ts, 0, p, 0)
        state[p] = "Q"
        queue[0].append(p)
        if p in is_exp:
            bump(0, +1, ts)
    while len(s) < n_events:
        ts += rng.randint(1, 999)
        r = rng.random()
        c = rng.randrange(ncpus)
        if r < 0.45:  # tick / preemption
            if queue[c]:
                switch(ts, c, TASK_RUNNING)
        elif r < 0.6:  # the current task sleeps
            if curr[c]:
                switch(ts, c, TASK_INTERRUPTIBLE)
        elif r < 0.8:  # wake a random task if it sleeps
            p = everyone[rng.randrange(len(everyone))]
            if state[p] == "S":
                tgt = rng.randrange(ncpus)
                if tgt != where[p]:
                    s.migrate(ts, c, p, where[p], tgt)
                    if p in is_exp:
                        migs.append((ts, p, where[p], tgt, "wakeup"))
                    where[p] = tgt
                s.wakeup(ts, c, p, tgt)
                state[p] = "Q"
                queue[tgt].append(p)
                if p in is_exp:
                    bump(tgt, +1, ts)
        elif r < 1.0 - p_exit:  # balance: dst pulls a queued task from src
            src = rng.randrange(ncpus)
            if queue[src] and ncpus > 1:
                dst = (src + 1 + rng.randrange(ncpus - 1)) % ncpus
                p = queue[src].pop(rng.randrange(len(queue[src])))
                s.migrate(ts, dst, p, src, dst)
                if p in is_exp:
                    migs.append((ts, p, src, dst, "balance"))
                where[p] = dst
                queue[dst].append(p)
                if p in is_exp:
                    bump(src, -1, ts)
                    bump(dst, +1, ts)
        else:  # the running experiment task exits
            p = curr[c]
            if p in is_exp:
                s.exit(ts, c, p)
                ts += 1
                switch(ts, c, EXIT_DEAD)
    t_end = ts + 1_000_000
    for p, st in run_start.items():
        cpu_ns[p] += t_end - st
    tasks = pd.DataFrame({
        "pid": np.asarray(exp, dtype=np.int32),
        "name": [f"exp{p - 1000}" for p in exp],
        "role": ["cpu"] * ntasks,
        "duty": np.full(ntasks, 100.0),
        "nice": np.zeros(ntasks, dtype=np.int64),
        "initial_cpu": np.zeros(ntasks, dtype=np.int64),
    })
    truth_rq = pd.DataFrame(truth, columns=["ts", "cpu", "nr"]).astype(
        {"ts": np.int64, "cpu": np.int64, "nr": np.int64})
    truth_mig = pd.DataFrame(migs, columns=["ts", "pid", "src_cpu", "dst_cpu", "kind"])
    return Simulated(s.events(), tasks, truth_rq, cpu_ns, truth_mig, t0, t_end)
