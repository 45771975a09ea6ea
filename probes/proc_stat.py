"""Where each task is and in which state, sampled from ``/proc/<pid>/stat`` (no root needed for a
process's own children): the kernel's own view, against which a run's rebuilt run queues are
checked (:mod:`harmony.analysis.crosscheck`).

Field 39 of the file (``processor``) is ``task_cpu``, the run queue the task is on, and field 3 its
state letter. A sweep reads every worker's file in turn, so it is not an instant: each row carries
how long its sweep took. Sampling misses what happens between sweeps (the thesis learned that it
misses migrations), which is why a run's tables come from the trace and this is only a check.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from harmony.core.columns import Table

if TYPE_CHECKING:   # frame()'s annotation; the guest agent keeps rows, loads no pandas
    import pandas as pd

#: The ``kernel_samples`` table of a run (kernel_samples.parquet): :meth:`KernelSampler.frame`.
KERNEL_SAMPLES = Table("kernel_samples", "one row per worker read in a sweep, sweep by sweep", [
    ("ts",       "int64", "ns, CLOCK_MONOTONIC: the middle of the sweep over all workers"),
    ("sweep_ns", "int64", "how long the sweep took (ns)"),
    ("pid",      "int32", "the worker"),
    ("cpu",      "int16", "its task_cpu: the run queue it is on"),
    ("state",    "str",   "its state letter (R, S, D, ...)"),
])

#: a sweep of the kernel sampler is followed by at least this many times its length of sleep
SWEEP_BUDGET = 100


class KernelSampler(threading.Thread):
    """Samples the kernel's own view of the workers from /proc: which CPU, which state.

    Each sweep adds a row per worker whose file could be read (:data:`KERNEL_SAMPLES`).

    With ``cpus`` and a readable sched debug file it also reads the kernel's own per-CPU
    ``nr_running`` after each sweep (``self.nr``, see :mod:`harmony.probes.sched_debug`);
    ``nr_why_not`` says why not otherwise.

    It sweeps every 1/hz s from ``begin`` on, less often when a sweep is long: after one it
    sleeps at least :data:`SWEEP_BUDGET` times the CPU time it took (the thread's own: a wait
    for the GIL or for a CPU is not the sampler's cost). ``longest_sleep`` says the longest
    sleep it chose (s): how long it may have been blind at the end of a run.
    """

    def __init__(self, pids: list[int], hz: float, cpus: list[int] | None = None):
        from harmony.probes import sched_debug

        super().__init__(name="kernel-sampler", daemon=True)
        self.pids, self.period = pids, 1.0 / hz
        self.rows: list[tuple] = []
        self.longest_sleep = self.period
        # started before the release, it sweeps from begin on: a thread started after it waits
        # its turn among the tasks to run at all, and start() waits for that
        self.begin, self.stopping = threading.Event(), threading.Event()
        self.nr, self.nr_why_not = None, "no CPU set given"
        if cpus is not None:
            ok, self.nr_why_not = sched_debug.available()
            self.nr = sched_debug.NrRunningSampler(pids, cpus, hz) if ok else None

    def run(self):
        try:
            while not self.begin.wait(0.05):
                if self.stopping.is_set():
                    return
            self._sweeps()
        finally:
            if self.nr:
                self.nr.close()

    def _sweeps(self):
        me = threading.get_native_id()
        wait = self.period
        while not self.stopping.wait(wait):
            t = time.thread_time()
            if self.nr:
                self.nr.sample(me)
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            sweep = []
            for pid in self.pids:
                try:
                    with open(f"/proc/{pid}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                    sweep.append((pid, int(fields[36]), fields[0].decode()))
                except (OSError, IndexError, ValueError):
                    continue
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            mid = (before + after) // 2
            self.rows += [(mid, after - before, pid, cpu, state) for pid, cpu, state in sweep]
            # at SCHED_FIFO (while a run is measured) a sweep takes its CPU from the tasks: with
            # many tasks (600: 5.4 ms a sweep) the rate drops so that it takes at most ~1 %
            wait = max(self.period, SWEEP_BUDGET * (time.thread_time() - t))
            self.longest_sleep = max(self.longest_sleep, wait)

    def frame(self) -> pd.DataFrame:
        return KERNEL_SAMPLES.from_rows(self.rows)
