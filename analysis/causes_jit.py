"""Compiled (numba) search of :mod:`causes` for the moves no probe recorded: one pass in time order.

The numpy version in :func:`harmony.analysis.causes.find_unrecorded_moves` lists every placement
of every task (~2 per event), sorts them by (task, time) and compares each with the one before
(1.5 s and ~0.5 GB at 10 M events). Here one pass over the events keeps each task's last CPU
and placement code, with the same rules (documented there), and writes only the moves. When it
runs rather than the numpy version is :mod:`harmony.core.jit`'s choice; the tests run both and
compare them. :func:`last_rows` answers, in one pass, each moved task's last wake-ups before its
move (:func:`harmony.analysis.causes.queued_asleep`).
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel

# placement codes, as in causes (PLACED + sched_migrate_task)
SWITCH, WAKING, WAKEUP, WAKEUP_NEW, MIGRATE = range(5)


@kernel
def moves(codes, lut, pid, prev_pid, cpu, orig_cpu, target_cpu, table, n_tasks,
          row, who, from_cpu, to_cpu, proof, before):
    """The moves, in time order (one instant's: a switch's next task before its previous one),
    written to row/who/from_cpu/to_cpu/proof/before while there is room; returns how many there
    are (more than the room: call again with as much).

    Event e's placement code is lut[codes[e]] (codes[e] < 0, or -1 there: none). A task is an
    index table[pid + 1] >= 0 (clipped at both ends) below ``n_tasks``; ``who`` gets its pid.
    """
    room = row.shape[0]
    seen = np.zeros(n_tasks, np.bool_)
    last = np.empty(n_tasks, np.int64)          # each task's CPU after its last placement
    last_code = np.empty(n_tasks, np.int8)      # and that placement's code
    top = table.shape[0] - 1
    k = 0
    for e in range(codes.shape[0]):
        c = codes[e]
        if c < 0:
            continue
        kd = lut[c]
        if kd < 0:
            continue
        # a switch places its next task, then its previous one, on its CPU
        for side in range(2 if kd == SWITCH else 1):
            p = np.int64(prev_pid[e] if side else pid[e])
            if p <= 0:
                continue
            i = min(p + 1, top)
            t = table[i]
            if t < 0:
                continue
            if kd == SWITCH:
                b = np.int64(cpu[e])
                a = b
            else:
                b = np.int64(orig_cpu[e] if kd == MIGRATE else target_cpu[e])
                a = np.int64(target_cpu[e])
            if b < 0:
                continue
            if seen[t] and b != last[t] and kd != WAKEUP_NEW:     # a new task: no move
                if k < room:
                    row[k] = e
                    who[k] = p
                    from_cpu[k] = last[t]
                    to_cpu[k] = b
                    proof[k] = kd
                    before[k] = last_code[t]
                k += 1
            seen[t] = True
            last[t] = a
            last_code[t] = kd
    return k


@kernel
def last_rows(codes, lut, pid, table, rows, task, out):
    """For each question q (``rows`` ascending, ``task[q]`` a task's index), the last events row
    before rows[q] of each kind k whose pid column is that task's: out[k, q] (-1 if none; out
    comes filled with -1). Event e's kind is lut[codes[e]] (codes[e] < 0, or -1 there: none);
    its task table[pid[e] + 1] (clipped at both ends), -1: none."""
    n_kinds = out.shape[0]
    n_tasks = 0
    for q in range(task.shape[0]):
        n_tasks = max(n_tasks, task[q] + 1)
    last = np.full((n_kinds, n_tasks), -1, np.int64)
    top = table.shape[0] - 1
    e = 0
    n = codes.shape[0]
    for q in range(rows.shape[0]):
        stop = min(rows[q], n)
        while e < stop:
            c = codes[e]
            if c >= 0:
                kd = lut[c]
                if kd >= 0:
                    t = table[max(min(np.int64(pid[e]) + 1, top), 0)]
                    if t >= 0:
                        last[kd, t] = e
            e += 1
        for k in range(n_kinds):
            out[k, q] = last[k, task[q]]
