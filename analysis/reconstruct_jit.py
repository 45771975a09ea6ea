"""Compiled (numba) inner loops of :mod:`reconstruct`: the run-queue step function.

The numpy version of ``df_runqueue`` sorts every +1/-1 change by (CPU, record) and rebuilds the
counts with cumulative sums and several masks as long as the changes (~0.15 s and ~100 bytes per
event at 2 M events); here one pass over the task records in time order keeps a count per CPU and
writes a row where a count changes, with the same rules (documented in ``df_runqueue``). When it
runs rather than the numpy version is :mod:`harmony.jit`'s choice; the tests run both and compare
them.
"""

from __future__ import annotations

import numpy as np

import numba


def _jit(fn):
    return numba.njit(cache=True, nogil=True, boundscheck=False)(fn)


@_jit
def _flush(ts, touched, n_touched, nr, last, t_first, init_row, cpus, out_ts, out_cpu, out_nr, k):
    """End of the records at instant ``ts``: one row per touched CPU whose count changed (in CPU
    order); at t_first the change replaces that CPU's initial row. Returns the rows written."""
    for a in range(1, n_touched):          # insertion sort: a handful of CPUs per instant
        v = touched[a]
        b = a - 1
        while b >= 0 and touched[b] > v:
            touched[b + 1] = touched[b]
            b -= 1
        touched[b + 1] = v
    for a in range(n_touched):
        c = touched[a]
        if nr[c] != last[c]:
            if ts == t_first:
                out_nr[init_row[c]] = nr[c]
            else:
                out_ts[k] = ts
                out_cpu[k] = cpus[c]
                out_nr[k] = nr[c]
                k += 1
            last[c] = nr[c]
    return k


@_jit
def runqueue(order, rts, rb, ra, cb, ca, t_end, cpu_lut, cpus, init, t_first, out_ts, out_cpu,
             out_nr):
    """Fill the run-queue table; returns (rows, changes that put a task on a CPU outside the set).

    order: task-record indices in time (seq) order. rts/rb/ra/cb/ca: per record its ts,
    runnable before/after, CPU before/after (-1 unknown). cpu_lut[c + 1]: index of CPU c in
    ``cpus`` (sorted), -1 = not in the set. init: count per CPU at t_first. out_*: room for one
    initial row per CPU plus two per record (a record changes at most two CPUs' counts).
    Records at one instant are applied together, as their events are in time order.
    """
    ncpu = cpus.shape[0]
    nr = init.copy()
    last = init.copy()
    init_row = np.arange(ncpu)
    for c in range(ncpu):
        out_ts[c] = t_first
        out_cpu[c] = cpus[c]
        out_nr[c] = init[c]
    k = ncpu
    touched = np.empty(ncpu, np.int64)
    is_touched = np.zeros(ncpu, np.bool_)
    n_touched = 0
    outside = 0
    cur = t_first
    lut_max = cpu_lut.shape[0] - 1
    for i in range(order.shape[0]):
        r = order[i]
        ts = rts[r]
        if ts > t_end:
            continue
        if rb[r] == ra[r] and cb[r] == ca[r]:
            continue
        if ts != cur:
            if n_touched:
                k = _flush(cur, touched, n_touched, nr, last, t_first, init_row, cpus,
                           out_ts, out_cpu, out_nr, k)
                for a in range(n_touched):
                    is_touched[touched[a]] = False
                n_touched = 0
            cur = ts
        if rb[r]:
            c = cpu_lut[min(max(cb[r] + 1, 0), lut_max)]
            if c >= 0:
                nr[c] -= 1
                if not is_touched[c]:
                    is_touched[c] = True
                    touched[n_touched] = c
                    n_touched += 1
        if ra[r]:
            c = cpu_lut[min(max(ca[r] + 1, 0), lut_max)]
            if c >= 0:
                nr[c] += 1
                if not is_touched[c]:
                    is_touched[c] = True
                    touched[n_touched] = c
                    n_touched += 1
            else:
                outside += 1
    if n_touched:
        k = _flush(cur, touched, n_touched, nr, last, t_first, init_row, cpus, out_ts, out_cpu,
                   out_nr, k)
    return k, outside
