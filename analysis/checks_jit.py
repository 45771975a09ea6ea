"""Compiled (numba) passes of :mod:`harmony.analysis.crosscheck`'s checks of a capture: the
switches into a context the probe recorded nothing in (:func:`dark_switches`, for
:func:`harmony.analysis.crosscheck.silent_contexts`).

The numpy version marks the contexts heard, then gathers every switch's next task and CPU and
the last switch of each CPU: arrays as long as the switches (~60 MB at 5.1 M events of a
ping-pong), on the side thread while the import's runs are built, where its memory peaks. Here
one pass marks the contexts and each CPU's last switch, a second writes the rows of the
switches into a silent context, which are few. When it runs rather than the numpy version is
:mod:`harmony.core.jit`'s choice; the tests run both and compare them.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, boundscheck=False)
def dark_switches(switch, cpu, common_pid, pid, n_cpus, n_pids):
    """The rows of the switches (``switch``: the sched_switch rows' mask) that began a run of a
    task in whose context nothing was recorded, that run completed (a later switch on the same
    CPU). A context is a pid > 0 (``common_pid``, below ``n_pids``), or the idle task of a CPU
    (common_pid 0, ``cpu`` below ``n_cpus``); a switch's next task is ``pid``, and one below 0
    or of ``n_pids`` or more is no context heard. In row order."""
    heard = np.zeros(n_pids, np.bool_)
    idle_heard = np.zeros(n_cpus, np.bool_)
    last = np.full(n_cpus, -1, np.int64)
    n = switch.shape[0]
    for i in range(n):
        c = common_pid[i]
        if c > 0:
            heard[c] = True
        elif c == 0 and cpu[i] >= 0:
            idle_heard[cpu[i]] = True
        if switch[i] and cpu[i] >= 0:
            last[cpu[i]] = i
    count = 0
    for p in range(2):          # counted, then written
        rows = np.empty(count, np.int64)
        count = 0
        for i in range(n):
            if not switch[i] or cpu[i] < 0 or last[cpu[i]] == i:
                continue
            nxt = pid[i]
            if nxt == 0:
                dark = not idle_heard[cpu[i]]
            else:
                dark = nxt < 0 or nxt >= n_pids or not heard[nxt]
            if dark:
                if p == 1:
                    rows[count] = i
                count += 1
    return rows
