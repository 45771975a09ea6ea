"""Compiled (numba) passes of a capture's checks: the switches into a context the probe
recorded nothing in (:func:`dark_switches`, for
:func:`harmony.analysis.crosscheck.silent_contexts`) and the CPU time each CPU gave to whom
(:func:`cpu_time`, for :func:`harmony.analysis.foreign.df_foreign_load`).

The numpy versions gather every switch's columns, sort them by CPU and mask them by owner:
arrays as long as the switches (~60 MB at 5.1 M events of a ping-pong), on the side thread
while the import's runs are built, where its memory peaks, and 0.11 / 0.30 s at 10.25 M events
that the main thread ends up waiting for. Here each is one pass over the events that writes
only what it finds. When they run rather than the numpy versions is :mod:`harmony.core.jit`'s
choice; the tests run both and compare them.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel


@kernel
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


@kernel
def cpu_time(switch, cpu, ts, pid, prev_pid, comm, slot, n, t0, t_end, experiment, own,
             n_names):
    """Each of the ``n`` CPUs of ``slot`` (a key table: CPU -> 0..n-1): the time in ns of
    [t0, t_end] that went to experiment tasks, the controller's own threads, other tasks
    (foreign) and the idle task, as :func:`harmony.analysis.foreign.df_foreign_load` splits it:
    from a switch to the next on the CPU, the time is the next task's (``pid``, whose comm code
    is ``comm``: -1 counts as code ``n_names``); before the CPU's first switch, that switch's
    previous task's. ``experiment`` and ``own``: key tables of their pids.

    Returns (first, spent, first_foreign, by_comm): the row of each CPU's first switch (-1:
    none); spent[j] = (experiment, own, foreign, idle) ns; the foreign ns of the time before the
    first switch; the foreign ns of the time after each switch, by the switched-in comm's code.
    Times are clipped to the window as numpy.clip does (t0 > t_end: every time is t_end)."""
    first = np.full(n, -1, np.int64)
    spent = np.zeros((n, 4), np.int64)
    first_foreign = np.zeros(n, np.int64)
    by_comm = np.zeros((n, n_names + 1), np.int64)
    last = np.zeros(n, np.int64)        # the CPU's last switch: clipped time, next task, comm
    owner = np.zeros(n, np.int64)
    code = np.zeros(n, np.int64)
    top = slot.shape[0] - 1
    for i in range(switch.shape[0]):
        if not switch[i]:
            continue
        # the clipped look-up written out: numba calls a helper per row, not inlined (see
        # harmony.importer_jit.where_at)
        j = slot[max(min(np.int64(cpu[i]) + 1, top), 0)]
        if j < 0:
            continue
        t = min(max(np.int64(ts[i]), t0), t_end)
        if first[j] < 0:
            first[j] = i
            was, d = np.int64(prev_pid[i]), t - t0
        else:
            was, d = owner[j], t - last[j]
        if _add(spent, j, was, d, experiment, own):
            if first[j] == i:
                first_foreign[j] += d
            else:
                by_comm[j, code[j]] += d
        last[j] = t
        owner[j] = pid[i]
        code[j] = comm[i] if comm[i] >= 0 else n_names
    for j in range(n):                  # the time after each CPU's last switch
        if first[j] >= 0 and _add(spent, j, owner[j], t_end - last[j], experiment, own):
            by_comm[j, code[j]] += t_end - last[j]
    return first, spent, first_foreign, by_comm


@kernel
def _add(spent, j, who, d, experiment, own):
    """Count ``d`` ns of CPU j's time to ``who``'s classes; whether it was foreign."""
    is_exp = experiment[max(min(who + 1, experiment.shape[0] - 1), 0)] >= 0
    is_own = own[max(min(who + 1, own.shape[0] - 1), 0)] >= 0
    if who == 0:
        spent[j, 3] += d
    if is_exp:
        spent[j, 0] += d
    if is_own:
        spent[j, 1] += d
    if who != 0 and not is_exp and not is_own:
        spent[j, 2] += d
        return True
    return False
