"""Compiled (numba) look-ups of :mod:`harmony.importer`: where each chosen task was at t0, and the
last event naming it.

The numpy versions read growing windows of rows around t0 (or back from the end) until every task
is found; a task that left the trace early (a short-lived process matching ``--comm``) is found
only after every window, each a handful of masks and gathers as long as itself (0.15 and 0.11 s
at 7.06 M events). Here one pass stops as soon as every task is found. When they run rather than
the numpy versions is :mod:`harmony.core.jit`'s choice; the tests run both and compare them.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel


@kernel
def where_at(codes, lut, pid, prev, cpu, target, table, bound, where):
    """Each task's CPU at row ``bound`` into where[task] (filled with -1): its last placement
    in the rows before it, else its first from it on (see importer._where_at). A row's
    placements: a switch's next and previous tasks on its CPU; an event of kind 1 its task on its
    target CPU.

    The clipped look-up is written out for each of the three placements on purpose: as a
    helper function numba did not inline it, and the pass took 0.35 s against 9 ms on 7.06 M
    events (bench/README.md, issue 48.2; with ``inline="always"`` 58 ms, in one try)."""
    found = np.zeros(where.shape[0], np.bool_)
    left = where.shape[0]
    top = table.shape[0] - 1
    n = codes.shape[0]
    for i in range(n):
        if not left:
            break
        r = bound - 1 - i if i < bound else i       # back from bound, then on from it
        c = codes[r]
        if c < 0:
            continue
        kd = lut[c]
        if kd == 0:
            if cpu[r] < 0:
                continue
            t = table[max(min(np.int64(pid[r]) + 1, top), 0)]
            if t >= 0 and not found[t]:
                where[t] = cpu[r]
                found[t] = True
                left -= 1
            t = table[max(min(np.int64(prev[r]) + 1, top), 0)]
            if t >= 0 and not found[t]:
                where[t] = cpu[r]
                found[t] = True
                left -= 1
        elif kd == 1:
            if target[r] < 0:
                continue
            t = table[max(min(np.int64(pid[r]) + 1, top), 0)]
            if t >= 0 and not found[t]:
                where[t] = target[r]
                found[t] = True
                left -= 1


@kernel
def last_named(pid, comm, empty, table, last):
    """Each task's last row whose pid column is it and whose comm code is not ``empty`` into
    last[task] (filled with -1), read from the end until every task is found."""
    left = last.shape[0]
    top = table.shape[0] - 1
    r = pid.shape[0] - 1
    while r >= 0 and left:
        if comm[r] != empty:
            t = table[max(min(np.int64(pid[r]) + 1, top), 0)]
            if t >= 0 and last[t] < 0:
                last[t] = r
                left -= 1
        r -= 1


@kernel
def first_and_last(pid, prev, common, table):
    """The first and the last row whose pid, prev_pid or common_pid column is a task of
    ``table`` (looked up as where_at does); (0, the last row) if none is, as numpy's argmax
    of a mask of none says."""
    top = table.shape[0] - 1
    n = pid.shape[0]
    ends = np.array([0, n - 1], np.int64)
    for side in range(2):
        for i in range(n):
            r = i if side == 0 else n - 1 - i
            if (table[max(min(np.int64(pid[r]) + 1, top), 0)] >= 0
                    or table[max(min(np.int64(prev[r]) + 1, top), 0)] >= 0
                    or table[max(min(np.int64(common[r]) + 1, top), 0)] >= 0):
                ends[side] = r
                break
    return ends[0], ends[1]


@kernel
def mark(values, seen, lo, hi):
    """seen[v] = True for every value v of values[lo:hi] (each below ``len(seen) - 1``; -1, no
    pid, marks the last slot): the distinct pids (or CPUs) of a column, in one pass (numpy's
    fancy assignment took 0.03-0.05 s a column of 10 M events). Threads may mark disjoint ranges
    at once: they only ever write True."""
    last = seen.shape[0] - 1
    for i in range(lo, hi):
        v = values[i]
        seen[v if v >= 0 else last] = True


@kernel
def prio_counts(p, q, table, counts):
    """counts[table[p] + q] += 1 for every row (``table`` looked up clipped at both ends, written
    out: see :func:`where_at`): importer._prio_counts's count of each (task, prio) in one pass,
    with no chunk of offsets and no bincount of it."""
    top = table.shape[0] - 1
    for i in range(p.shape[0]):
        counts[table[max(min(np.int64(p[i]), top), 0)] + q[i]] += 1


@kernel
def mark_pairs(p, c, width, seen):
    """seen[(p + 1) * width + c + 1] = True for every row: importer._pairs's mark of each (pid,
    comm code) in one pass (every p >= -1 and c >= -1, and the table as large as they need: the
    caller's)."""
    for i in range(p.shape[0]):
        seen[(np.int64(p[i]) + 1) * width + np.int64(c[i]) + 1] = True
