"""Compiled (numba) sweep of :func:`harmony.analysis.cost.df_wasted`: the wasted episodes in one
pass in time order.

The numpy version sums every source's changes up to every instant, one array per source and per
CPU (each as long as the changes: ~150 MiB beside the tables at 7 M events, where an import's
memory peaks). Here one pass over the changes keeps each source's level and each CPU's open
episode, and writes only the episodes; it merges the changes' few runs in time order as it goes
(no order array). When it runs rather than the numpy version is
:mod:`harmony.core.jit`'s choice; the tests run both and compare them.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel


@kernel
def _next(ts, heads, stops):
    """The run whose head comes next in time order (ties: the lowest run, whose changes come
    first in the arrays), -1 when every run is done."""
    best = -1
    for r in range(heads.shape[0]):
        h = heads[r]
        if h < stops[r] and (best < 0 or ts[h] < ts[heads[best]]):
            best = r
    return best


@kernel
def episodes(ts, src, change, bounds, first, lvl0, n, slot, t0, t_end, cpu, start, end, waiting):
    """The wasted episodes of the changes ``ts``/``src``/``change``, which are runs in time order,
    run r from ``bounds[r]`` to ``bounds[r + 1]``: taken merged in time order, ties in array
    order (the order a stable sort of ``ts`` gives; a scan of the runs' heads for each change, so
    for a few runs: a CPU's idle spells, a task's waits). Source s < n is CPU s idle, n + k the
    tasks waiting on CPU k (``n`` unique CPUs); ``slot[j]``: the unique index of the j-th CPU
    asked (duplicates allowed). The levels at t0 are every change at or before it; then each
    instant in (t0, t_end) starts an interval. An episode (j-th CPU idle while tasks wait
    elsewhere: cpu[i] = j, from start[i] to end[i], waiting[i] the most waiting elsewhere) is
    written while there is room. Returns (how many episodes, the wasted CPU time in ns): call
    again with as much room if there were more.

    ``first[r]``: run r's first change to take (``bounds[:-1]``: all of them), the levels of the
    changes before them being ``lvl0``: a sweep of a later stretch of time, [t0, t_end), started
    where its changes begin (threads may sweep disjoint stretches at once)."""
    room = cpu.shape[0]
    heads = first.copy()
    stops = bounds[1:]
    lvl = lvl0.copy()
    k = slot.shape[0]
    open_ = np.zeros(k, np.bool_)
    since = np.zeros(k, np.int64)
    most = np.zeros(k, np.int64)
    r = _next(ts, heads, stops)
    while r >= 0 and ts[heads[r]] <= t0:
        e = heads[r]
        lvl[src[e]] += change[e]
        heads[r] += 1
        r = _next(ts, heads, stops)
    cur = t0
    found = 0
    wasted = np.int64(0)
    while True:
        nxt = t_end
        if r >= 0 and ts[heads[r]] < t_end:
            nxt = ts[heads[r]]
        total = np.int64(0)
        for j in range(k):
            total += lvl[n + slot[j]]
        count = np.int64(0)
        for j in range(k):
            elsewhere = total - lvl[n + slot[j]]
            if lvl[slot[j]] > 0 and elsewhere > 0:
                count += 1
                if open_[j]:
                    most[j] = max(most[j], elsewhere)
                else:
                    open_[j] = True
                    since[j] = cur
                    most[j] = elsewhere
            elif open_[j]:
                if found < room:
                    cpu[found], start[found], end[found], waiting[found] = j, since[j], cur, most[j]
                found += 1
                open_[j] = False
        wasted += min(count, total) * (nxt - cur)
        if nxt == t_end:        # no change left before the end (t_end <= t0 included)
            break
        while r >= 0 and ts[heads[r]] == nxt:
            e = heads[r]
            lvl[src[e]] += change[e]
            heads[r] += 1
            r = _next(ts, heads, stops)
        cur = nxt
    for j in range(k):
        if open_[j]:
            if found < room:
                cpu[found], start[found], end[found], waiting[found] = j, since[j], t_end, most[j]
            found += 1
    return found, wasted


@kernel
def waits(pid, seq, ev_ts, cpu, runnable, running, free, slot):
    """The changes of tasks waiting of the task records ``pid``/``seq``/``cpu`` (the CPU after
    the record)/``runnable``/``running`` (after it), by task and in time order (a record's time
    is its event's, ``ev_ts[seq >> 1]``), as
    :func:`harmony.analysis.cost._waiting_changes` gives them: (ts, k, change), +1 at each
    record after which a task of ``free`` (a key table of the pids free to move) waits runnable
    and not running on CPU ``k`` (``slot``: a key table of the CPUs), then -1 at the task's next
    record for each of those the same task has one after. Counted first, then written: no mask
    or list of rows as long as the records."""
    n = pid.shape[0]
    began = 0
    ended = 0
    # the clipped look-ups written out: numba calls a helper per row, not inlined (see
    # harmony.importer_jit.where_at)
    top_free, top_slot = free.shape[0] - 1, slot.shape[0] - 1
    for i in range(n):
        if (runnable[i] and not running[i]
                and free[max(min(np.int64(pid[i]) + 1, top_free), 0)] >= 0
                and slot[max(min(np.int64(cpu[i]) + 1, top_slot), 0)] >= 0):
            began += 1
            if i + 1 < n and pid[i + 1] == pid[i]:
                ended += 1
    out_ts = np.empty(began + ended, np.int64)
    out_k = np.empty(began + ended, np.int32)
    out_change = np.empty(began + ended, np.int8)
    b = 0
    e = began
    for i in range(n):
        if not runnable[i] or running[i] or free[max(min(np.int64(pid[i]) + 1, top_free), 0)] < 0:
            continue
        k = slot[max(min(np.int64(cpu[i]) + 1, top_slot), 0)]
        if k < 0:
            continue
        out_ts[b] = ev_ts[seq[i] >> 1]
        out_k[b] = k
        out_change[b] = 1
        b += 1
        if i + 1 < n and pid[i + 1] == pid[i]:
            out_ts[e] = ev_ts[seq[i + 1] >> 1]
            out_k[e] = k
            out_change[e] = -1
            e += 1
    return out_ts, out_k, out_change


@kernel
def idle_changes(cpu, ts, switch, pid, prev_pid, common_pid, slot, n):
    """The idle spells of the ``n`` CPUs of ``slot`` (a key table: CPU -> 0..n-1), as
    :func:`harmony.analysis.cost._idle_changes` finds them one CPU at a time, for all of them in
    one pass over the events (``switch``: the sched_switch rows' mask; ``pid`` the next task of
    a switch). Returns (starts, start_at, ends, end_at): CPU j's starts are
    ``starts[start_at[j]:start_at[j + 1]]``, its ends likewise, each in time order. Counted
    first, then written."""
    idle_before = np.zeros(n, np.bool_)     # the CPU's last state-setting row went to idle
    to_idle_row = np.full(n, -1, np.int64)  # its last switch to idle
    heard_idle = np.full(n, -1, np.int64)   # its last event in the idle task's context
    n_starts = np.zeros(n + 1, np.int64)
    n_ends = np.zeros(n + 1, np.int64)
    starts = np.empty(0, np.int64)
    ends = np.empty(0, np.int64)
    top = slot.shape[0] - 1
    for p in range(2):
        if p == 1:
            for j in range(n):              # counts -> offsets
                n_starts[j + 1] += n_starts[j]
                n_ends[j + 1] += n_ends[j]
            starts = np.empty(n_starts[n], np.int64)
            ends = np.empty(n_ends[n], np.int64)
            put_s = n_starts[:n].copy()
            put_e = n_ends[:n].copy()
            idle_before[:] = False
            to_idle_row[:] = -1
            heard_idle[:] = -1
        for i in range(cpu.shape[0]):
            j = slot[max(min(np.int64(cpu[i]) + 1, top), 0)]     # written out: see waits
            if j < 0:
                continue
            sw = switch[i]
            if not sw and common_pid[i] == 0:
                heard_idle[j] = i
                continue
            if not sw and common_pid[i] <= 0:
                continue                    # no row that sets the CPU's state
            to_idle = sw and pid[i] == 0
            end = -1                                # the row the CPU's spell ends at, if one
            if idle_before[j]:
                if not sw or prev_pid[i] != 0:      # the CPU shown busy: the spell cut short
                    end = max(heard_idle[j], to_idle_row[j])
                elif not to_idle:                   # idle to idle: the spell goes on
                    end = i
                if end >= 0:
                    if p == 0:
                        n_ends[j + 1] += 1
                    else:
                        ends[put_e[j]] = ts[end]
                        put_e[j] += 1
            if to_idle:
                if end >= 0 or not idle_before[j]:  # not a spell going on
                    if p == 0:
                        n_starts[j + 1] += 1
                    else:
                        starts[put_s[j]] = ts[i]
                        put_s[j] += 1
                to_idle_row[j] = i
            idle_before[j] = to_idle
    return starts, n_starts, ends, n_ends


@kernel
def idle_periods(starts, start_at, ends, end_at, n):
    """The periods [from, to) during which at least one of the ``n`` CPUs is idle, in time order,
    from :func:`idle_changes`' spells (to: the largest int64 if the last never ends), as
    :func:`harmony.analysis.cost._idle_periods` finds them: the CPUs' runs merged as they are
    read (a scan of their heads for each instant: for a few CPUs), no sort of all of them."""
    hs = start_at[:n].copy()
    he = end_at[:n].copy()
    lo = np.empty(starts.shape[0], np.int64)     # every period begins at a start
    hi = np.empty(starts.shape[0], np.int64)
    m = 0
    idle = 0
    is_open = False
    while True:
        t = np.int64(0)
        found = False
        for j in range(n):
            if hs[j] < start_at[j + 1] and (not found or starts[hs[j]] < t):
                t = starts[hs[j]]
                found = True
            if he[j] < end_at[j + 1] and (not found or ends[he[j]] < t):
                t = ends[he[j]]
                found = True
        if not found:
            break
        for j in range(n):          # every change of the instant, then the CPUs idle after it
            while hs[j] < start_at[j + 1] and starts[hs[j]] == t:
                idle += 1
                hs[j] += 1
            while he[j] < end_at[j + 1] and ends[he[j]] == t:
                idle -= 1
                he[j] += 1
        if idle > 0 and not is_open:
            lo[m] = t
            is_open = True
        elif idle <= 0 and is_open:
            hi[m] = t
            m += 1
            is_open = False
    if is_open:
        hi[m] = np.iinfo(np.int64).max
        m += 1
    return lo[:m].copy(), hi[:m].copy()
