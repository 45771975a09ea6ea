"""Compiled (numba) inner loops of :mod:`reconstruct`: the run-queue step function and the runs.

The numpy versions sort (run queue: every +1/-1 change by CPU and record; runs: every switch by
CPU) and then evaluate the rules with cumulative sums and masks as long as the trace (~0.15 s each
at 2 M events). Here one pass in time order keeps a count per CPU (:func:`runqueue`), or each
CPU's last switch (:func:`runs`), with the same rules (documented in ``df_runqueue`` and
``df_runs``). :func:`changes` gives the metrics the run-queue vector at each instant it changes,
keeping each CPU's length as it reads the run-queue table. When they run rather than the numpy
versions is :mod:`harmony.core.jit`'s choice; the tests run both and compare the tables.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import inline, kernel


@inline
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


@kernel
def runqueue(order, i_lo, i_hi, seq, ev_ts, rb, ra, cb, ca, t_end, cpu_lut, cpus, init, t_first,
             init_rows, out_ts, out_cpu, out_nr, k):
    """Fill the run-queue table from row ``k`` on; returns (the row after the last written,
    changes that put a task on a CPU outside the set).

    order[i_lo:i_hi]: task-record indices in time (seq) order. seq/rb/ra/cb/ca: per record its
    seq (its time: ev_ts[seq >> 1], its event's), runnable before/after, CPU before/after (-1
    unknown). cpu_lut[c + 1]: index of CPU c in ``cpus`` (sorted), -1 = not in the set. init:
    count per CPU before the first record (at t_first if ``init_rows``: then one initial row per
    CPU is written first, and the records at t_first update it). out_*: room for those rows plus
    two per record (a record changes at most two CPUs' counts). Records at one instant are
    applied together, as their events are in time order: a range must begin at an instant's
    first record (threads may fill disjoint ranges).
    """
    ncpu = cpus.shape[0]
    nr = init.copy()
    last = init.copy()
    init_row = np.arange(ncpu) + k
    if init_rows:
        for c in range(ncpu):
            out_ts[k] = t_first
            out_cpu[k] = cpus[c]
            out_nr[k] = init[c]
            k += 1
    else:
        t_first = np.int64(-(1 << 62))      # no initial rows to update
    touched = np.empty(ncpu, np.int64)
    is_touched = np.zeros(ncpu, np.bool_)
    n_touched = 0
    outside = 0
    cur = t_first
    lut_max = cpu_lut.shape[0] - 1
    for i in range(i_lo, i_hi):
        r = order[i]
        ts = ev_ts[seq[r] >> 1]
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


@kernel
def counts_at(seq, rb, ra, cb, ca, starts, cut, cpu_lut, nr):
    """nr[c] = the experiment tasks runnable on CPU ``cpus[c]`` just before the record of seq
    ``cut``: each task's state after its last record before it, or before its first record.
    The records are by task (task t's are [starts[t], starts[t + 1]), in seq order)."""
    lut_max = cpu_lut.shape[0] - 1
    for c in range(nr.shape[0]):
        nr[c] = 0
    for t in range(starts.shape[0] - 1):
        lo, hi = starts[t], starts[t + 1]
        if hi <= lo:
            continue
        j = lo + np.searchsorted(seq[lo:hi], cut)        # the task's first record from the cut on
        if j > lo:
            on, where = ra[j - 1], ca[j - 1]
        else:
            on, where = rb[lo], cb[lo]
        if on:
            c = cpu_lut[min(max(where + 1, 0), lut_max)]
            if c >= 0:
                nr[c] += 1


@kernel
def move_rows(out_ts, out_cpu, out_nr, src, n, dst):
    """Move rows [src, src + n) of the out_* arrays down to dst (<= src)."""
    for i in range(n):
        out_ts[dst + i] = out_ts[src + i]
        out_cpu[dst + i] = out_cpu[src + i]
        out_nr[dst + i] = out_nr[src + i]


@kernel
def runs(is_sw, cpu, ts, nxt, prv, pst, is_exp, t_start, t_end, last, out_pid, out_cpu, out_start,
         out_end, out_state, out_open, seg2, seg3, n_out, kinds):
    """df_runs' intervals in one pass over the events in time order, keeping each CPU's last
    sched_switch (``last[c]``: its row, -1 = none yet; len = highest CPU + 1).

    is_exp[v + 1]: pid v is an experiment task (clipped at both ends). The runs go to three
    segments of the out_* arrays, in the order the numpy version emits them (so that a stable
    sort of both gives the same table): runs started by a seen switch-in (n_out[0]; the last one
    per CPU left open, to t_end: out_open), then runs of tasks running when the trace began
    (n_out[1]), then runs whose switch-in was lost (n_out[2]; out_start holds the CPU's previous
    switch, the caller moves it to the task's last wake-up). While the events are walked the
    segments start at 0, ``seg2`` and ``seg3``: the first needs room for a run a switch and each
    CPU's last, the second one a CPU; the third, rare, is counted past the arrays' end but not
    written there (n_out[2] > its room: call again with as much). The last two are then moved to
    follow the first, so the rows are out_*[:sum(n_out)], views: the runs are not copied again.
    kinds[0] = run_end_mismatch, kinds[1] = run_start_unseen (see df_runs).
    """
    room = out_pid.shape[0]
    top = is_exp.shape[0] - 1
    a = 0
    h = seg2
    lo = seg3
    for e in range(is_sw.shape[0]):
        if not is_sw[e]:
            continue
        c = cpu[e]
        k = last[c]
        prv_exp = is_exp[min(max(np.int64(prv[e]) + 1, 0), top)]
        if k < 0:
            if prv_exp:                      # running when the trace began
                out_pid[h] = prv[e]
                out_cpu[h] = c
                out_start[h] = t_start
                out_end[h] = ts[e]
                out_state[h] = pst[e]
                out_open[h] = False
                h += 1
        else:
            mismatch = prv[e] != nxt[k]
            nxt_exp = is_exp[min(max(np.int64(nxt[k]) + 1, 0), top)]
            if nxt_exp:
                out_pid[a] = nxt[k]
                out_cpu[a] = c
                out_start[a] = ts[k]
                out_end[a] = ts[e]
                out_state[a] = -1 if mismatch else pst[e]
                out_open[a] = False
                a += 1
                if mismatch:
                    kinds[0] += 1
            if mismatch and prv_exp:
                kinds[1] += 1
                if not nxt_exp:              # switched out, its switch-in not seen
                    if lo < room:
                        out_pid[lo] = prv[e]
                        out_cpu[lo] = c
                        out_start[lo] = ts[k]
                        out_end[lo] = ts[e]
                        out_state[lo] = pst[e]
                        out_open[lo] = False
                    lo += 1
        last[c] = e
    for c in range(last.shape[0]):            # each CPU's last switch-in: open to t_end
        k = last[c]
        if k >= 0 and is_exp[min(max(np.int64(nxt[k]) + 1, 0), top)]:
            out_pid[a] = nxt[k]
            out_cpu[a] = c
            out_start[a] = ts[k]
            out_end[a] = t_end
            out_state[a] = -1
            out_open[a] = True
            a += 1
    n_out[0] = a
    n_out[1] = h - seg2
    n_out[2] = lo - seg3
    if lo > room:
        return
    # every row moves down or stays (a <= seg2, and a + n_out[1] <= seg3): a forward copy never
    # overwrites a row it has yet to move
    dst = a
    for seg_lo, seg_hi in ((seg2, h), (seg3, lo)):
        for src in range(seg_lo, seg_hi):
            out_pid[dst] = out_pid[src]
            out_cpu[dst] = out_cpu[src]
            out_start[dst] = out_start[src]
            out_end[dst] = out_end[src]
            out_state[dst] = out_state[src]
            out_open[dst] = out_open[src]
            dst += 1


@kernel
def finish_runs(order, pid, cpu, start, end, state, is_open, n_seen, t_end, t0, task_pids, task_row,
                name_code, role_code, o_pid, o_cpu, o_start, o_end, o_dur, o_t, o_state, o_trunc,
                o_unseen, o_name, o_role):
    """df_runs' table from :func:`runs`' rows, written straight into its columns (o_*, as long
    as the rows kept): the rows starting before t_end, in (start, cpu, end) order, closed at t_end.

    ``order``: the rows by start (a stable sort; reordered here where starts tie, so that it is
    the stable (start, cpu, end closed at t_end) order of ``np.lexsort``). Rows from ``n_seen``
    on have an unseen start. ``task_pids`` (sorted) / ``task_row``: each experiment pid's row in
    the task table, whose ``name_code`` / ``role_code`` give its categories' codes.
    """
    n = order.shape[0]
    for i in range(1, n):                    # insertion sort of tied starts: ties are rare
        j = i
        while j > 0:
            a, b = order[j - 1], order[j]
            # ends compared as closed at t_end
            if start[a] != start[b] or cpu[a] < cpu[b] or (
                    cpu[a] == cpu[b] and min(end[a], t_end) <= min(end[b], t_end)):
                break
            order[j - 1], order[j] = b, a
            j -= 1
    for i in range(o_pid.shape[0]):          # the kept rows: those first by start
        r = order[i]
        p = pid[r]
        s, e = start[r], end[r]
        trunc = is_open[r] or e > t_end
        e = min(e, t_end)
        o_pid[i] = p
        o_cpu[i] = cpu[r]
        o_start[i] = s
        o_end[i] = e
        o_dur[i] = e - s
        o_t[i] = (s - t0) / 1_000_000_000
        o_state[i] = -1 if trunc else state[r]
        o_trunc[i] = trunc
        o_unseen[i] = r >= n_seen
        k = task_row[np.searchsorted(task_pids, p)]
        o_name[i] = name_code[k]
        o_role[i] = role_code[k]


@kernel
def instants(ts, a, b):
    """How many distinct times rows [a, b) of ``ts`` (ascending) hold."""
    n = 1 if b > a else 0
    for r in range(a + 1, b):
        if ts[r] != ts[r - 1]:
            n += 1
    return n


@kernel
def changes(cpu, ts, nr, slot, p, a, b, times, q, target, dev):
    """The run-queue vectors of :func:`reconstruct.runqueue_changes` in one pass: the vector at
    t0 (each of the ``p`` CPUs' last ``nr`` among rows [0, a), -1: none), then after each
    instant's last row of [a, b) the vector again, that instant's time in ``times`` (times[0] is
    the caller's). ``slot``: a CPU's column at slot[cpu + 1] (clipped at both ends), -1: not one
    of them. Each vector k goes to q[:, k] (an empty ``q``: not kept) and, with a ``dev``, its
    largest distance from ``target`` to dev[k] = max(longest - target, target - shortest) as
    float64 (the balance steps of :func:`harmony.analysis.metrics.balance_timeline`, with no
    vectors held). Returns False where a CPU has no row before some vector (-1 in it)."""
    cur = np.full(p, -1, np.int32)
    top = slot.shape[0] - 1
    k = 0
    covered = True
    for r in range(b):
        if r == a:
            covered = _vector(cur, 0, q, target, dev) and covered
        s = slot[max(min(np.int64(cpu[r]) + 1, top), 0)]
        if s >= 0:
            cur[s] = nr[r]
        if r >= a and (r == b - 1 or ts[r + 1] != ts[r]):
            k += 1
            times[k] = ts[r]
            covered = _vector(cur, k, q, target, dev) and covered
    if b <= a:                  # no row in (t0, t_end): the vector at t0 alone
        covered = _vector(cur, 0, q, target, dev)
    return covered


@inline
def _vector(cur, k, q, target, dev):
    """Vector k, ``cur``, into q[:, k] and dev[k] (each where given); whether every CPU of it
    has a length (no CPU: nothing to write)."""
    if cur.shape[0] == 0:
        return True
    hi = cur[0]
    lo = cur[0]
    for j in range(cur.shape[0]):
        if q.shape[1] > 0:
            q[j, k] = cur[j]
        hi = max(hi, cur[j])
        lo = min(lo, cur[j])
    if dev.shape[0] > 0:
        dev[k] = max(np.float64(hi) - target, target - np.float64(lo))
    return lo >= 0
