"""Compiled (numba) settling pass of :mod:`harmony.analysis.ties`: each large group of tied events
merged again from its CPUs' own sequences, event by event, its tasks' states followed through
it, going back on a choice where what follows contradicts it.

The same rules as :func:`harmony.analysis.ties._merge`, ``_Events.level`` and ``_Events.apply``
(documented there), on arrays: a task is a dense
index (-1: none, pid <= 0), its state a kind (:data:`ABSENT`: nothing known, as a task missing
from the Python version's dict) and a CPU (-1: unknown). The Python version stays: it settles
small traces, where loading the kernels would cost more than it saves, and the tests compare
the two. A Debian 6.1 guest's recording (2.26 M events, 309 K of them tied in 81 K groups of
up to 200 across 8 CPUs) spent 5-6 s of its 9.6 s import in the Python version.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import inline, kernel

# event kinds (ties.EVENT_KINDS order)
OTHER, SWITCH, WAKING, WAKEUP, WAKEUP_NEW, MIGRATE = range(6)
# task state kinds; ABSENT: nothing known (any state, any CPU)
ABSENT, NONE, ASLEEP, QUEUED, RUN, WAKING_STATE = -1, 0, 1, 2, 3, 4
# how an event fits its tasks' states
LIKELY, POSSIBLE, CONTRADICTED = 0, 1, 2


@inline
def _consistent(st_kind, st_cpu, t, mask, c):
    """Whether task ``t``'s state is one of the kinds in bit ``mask`` and its CPU ``c``, each
    where known (a task of -1, or one of no known state: yes)."""
    if t < 0:
        return True
    k = st_kind[t]
    if k == ABSENT:
        return True
    if k != NONE and not (mask >> k) & 1:
        return False
    w = st_cpu[t]
    return c < 0 or w < 0 or w == c


@inline
def _level(i, kind, ptask, qtask, cpu, orig, target, st_kind, st_cpu):
    """How event ``i`` fits its tasks' states: LIKELY, POSSIBLE or CONTRADICTED."""
    k = kind[i]
    if k == SWITCH:
        if (_consistent(st_kind, st_cpu, ptask[i], 1 << RUN, cpu[i])
                and _consistent(st_kind, st_cpu, qtask[i], 1 << QUEUED, cpu[i])):
            return LIKELY
        return CONTRADICTED
    if k == WAKEUP_NEW:
        return LIKELY
    if k == WAKING or k == WAKEUP:
        mask = (1 << ASLEEP) if k == WAKING else (1 << ASLEEP) | (1 << WAKING_STATE)
        if _consistent(st_kind, st_cpu, qtask[i], mask, target[i]):
            return LIKELY
        if _consistent(st_kind, st_cpu, qtask[i], (1 << QUEUED) | (1 << RUN), target[i]):
            return POSSIBLE
        return CONTRADICTED
    if k == MIGRATE:
        if _consistent(st_kind, st_cpu, qtask[i],
                       (1 << QUEUED) | (1 << ASLEEP) | (1 << WAKING_STATE), orig[i]):
            return LIKELY
        return CONTRADICTED
    return LIKELY


@inline
def _put(t, k, c, st_kind, st_cpu, u_task, u_kind, u_cpu, u):
    """Task ``t``'s state set to (k, c), the one it replaced pushed at ``u``; the undo log's
    new length."""
    u_task[u] = t
    u_kind[u] = st_kind[t]
    u_cpu[u] = st_cpu[t]
    st_kind[t] = k
    st_cpu[t] = c
    return u + 1


@inline
def _apply(i, kind, ptask, qtask, asleep, cpu, target, st_kind, st_cpu, u_task, u_kind, u_cpu,
           u):
    """What event ``i`` leaves its tasks in; the undo log's new length."""
    k = kind[i]
    q = qtask[i]
    if k == SWITCH:
        p = ptask[i]
        if p >= 0:
            u = _put(p, ASLEEP if asleep[i] else QUEUED, cpu[i], st_kind, st_cpu,
                     u_task, u_kind, u_cpu, u)
        if q >= 0:
            u = _put(q, RUN, cpu[i], st_kind, st_cpu, u_task, u_kind, u_cpu, u)
    elif q < 0:
        return u
    elif k == WAKING:
        if st_kind[q] == ASLEEP:
            u = _put(q, WAKING_STATE, target[i], st_kind, st_cpu, u_task, u_kind, u_cpu, u)
    elif k == WAKEUP or k == WAKEUP_NEW:
        if k == WAKEUP_NEW or st_kind[q] != RUN:
            u = _put(q, QUEUED, target[i], st_kind, st_cpu, u_task, u_kind, u_cpu, u)
    elif k == MIGRATE:
        was = st_kind[q]
        u = _put(q, NONE if was == ABSENT else was, target[i], st_kind, st_cpu,
                 u_task, u_kind, u_cpu, u)
    return u


@inline
def _undo(st_kind, st_cpu, u_task, u_kind, u_cpu, u, to):
    """The states as they were when the undo log held ``to`` entries; ``to``."""
    while u > to:
        u -= 1
        t = u_task[u]
        st_kind[t] = u_kind[u]
        st_cpu[t] = u_cpu[u]
    return to


@inline
def _take(k, q_ev, q_start, heads, merged, m, kind, ptask, qtask, asleep, cpu, target, st_kind,
          st_cpu, u_task, u_kind, u_cpu, u):
    """CPU queue ``k``'s next event taken as the merge's ``m``-th, applied: (the event, the undo
    log's new length)."""
    i = q_ev[q_start[k] + heads[k]]
    heads[k] += 1
    merged[m] = i
    return i, _apply(i, kind, ptask, qtask, asleep, cpu, target, st_kind, st_cpu, u_task, u_kind,
                     u_cpu, u)


@kernel
def settle(kind, ptask, qtask, asleep, cpu, orig, target, order, starts, ends, last_row,
           pair_off, pair_task, pair_at, pair_kind, pair_cpu, n_tasks, per_event):
    """Each group g (``order[starts[g]:ends[g]]``: its events, indices into the other arrays, in
    the ranks' order) merged again in place. Its tasks' states before it are pairs
    ``pair_off[g]:pair_off[g + 1]`` (task, the row of its last record before the group, kind,
    CPU), unless a group settled here later than that row left the task's state (``last_row``:
    each group's last row in the events). ``per_event``: how many times a group may go back on
    a choice, per event. Returns how many groups changed order."""
    st_kind = np.full(n_tasks, ABSENT, np.int8)
    st_cpu = np.full(n_tasks, -1, np.int64)
    set_row = np.full(n_tasks, -2, np.int64)        # -2: no group settled it
    set_kind = np.full(n_tasks, ABSENT, np.int8)
    set_cpu = np.full(n_tasks, -1, np.int64)
    n_ev = kind.shape[0]
    pos_of = np.zeros(n_ev, np.int64)               # an event's place in its group's ranks
    q_of = np.zeros(n_ev, np.int64)                 # its CPU's queue in its group
    most = 1
    for g in range(starts.shape[0]):
        most = max(most, ends[g] - starts[g])
    u_task = np.empty(2 * most + 2, np.int64)
    u_kind = np.empty(2 * most + 2, np.int8)
    u_cpu = np.empty(2 * most + 2, np.int64)
    rk = np.empty(most, np.int64)
    merged = np.empty(most, np.int64)
    q_cpu = np.empty(most, np.int64)
    q_start = np.empty(most + 1, np.int64)
    q_fill = np.empty(most, np.int64)
    q_ev = np.empty(most, np.int64)
    heads = np.empty(most, np.int64)
    lv = np.empty(most, np.int64)
    ch_n = np.empty(most, np.int64)
    ch_u = np.empty(most, np.int64)
    ch_t1 = np.empty(most, np.int64)
    ch_t2 = np.empty(most, np.int64)
    ch_head = np.empty(most, np.int64)
    ch_end = np.empty(most, np.int64)
    alike = np.empty(4 * most, np.int64)
    cand = np.empty(most, np.int64)
    involved = np.empty(2 * most, np.int64)
    changed = 0
    for g in range(starts.shape[0]):
        a, b = starts[g], ends[g]
        n = b - a
        for j in range(pair_off[g], pair_off[g + 1]):
            t = pair_task[j]
            if set_row[t] != -2 and pair_at[j] <= set_row[t]:
                st_kind[t] = set_kind[t]
                st_cpu[t] = set_cpu[t]
            else:
                st_kind[t] = pair_kind[j]
                st_cpu[t] = pair_cpu[j]
        for x in range(n):
            rk[x] = order[a + x]
            pos_of[rk[x]] = x
        # the ranks' order where each event fits
        u = 0
        fits = True
        for x in range(n):
            i = rk[x]
            if _level(i, kind, ptask, qtask, cpu, orig, target, st_kind, st_cpu) != LIKELY:
                fits = False
                break
            u = _apply(i, kind, ptask, qtask, asleep, cpu, target, st_kind, st_cpu,
                       u_task, u_kind, u_cpu, u)
        if not fits:
            u = _undo(st_kind, st_cpu, u_task, u_kind, u_cpu, u, 0)
            # each CPU's queue, in the ranks' order
            nq = 0
            for x in range(n):
                c = cpu[rk[x]]
                k = 0
                while k < nq and q_cpu[k] != c:
                    k += 1
                if k == nq:
                    q_cpu[nq] = c
                    q_fill[nq] = 0
                    nq += 1
                q_fill[k] += 1
                q_of[rk[x]] = k
            q_start[0] = 0
            for k in range(nq):
                q_start[k + 1] = q_start[k] + q_fill[k]
                q_fill[k] = q_start[k]
                heads[k] = 0
            for x in range(n):
                k = q_of[rk[x]]
                q_ev[q_fill[k]] = rk[x]
                q_fill[k] += 1
            m = 0
            nch = 0
            top = 0                 # the alike buffer's length
            budget = np.int64(per_event * n)
            while m < n:
                best = -1
                for k in range(nq):
                    if q_start[k] + heads[k] < q_start[k + 1]:
                        i = q_ev[q_start[k] + heads[k]]
                        lv[k] = _level(i, kind, ptask, qtask, cpu, orig, target, st_kind,
                                       st_cpu)
                        if best < 0 or lv[k] < lv[best] or (
                                lv[k] == lv[best] and pos_of[i] < pos_of[
                                    q_ev[q_start[best] + heads[best]]]):
                            best = k
                if lv[best] != CONTRADICTED:
                    # the other CPUs whose next event fits alike, in the ranks' order
                    nc = 0
                    for k in range(nq):
                        if k != best and q_start[k] + heads[k] < q_start[k + 1] and \
                                lv[k] == lv[best]:
                            pk = pos_of[q_ev[q_start[k] + heads[k]]]
                            y = nc
                            while y > 0 and pos_of[q_ev[q_start[cand[y - 1]]
                                                        + heads[cand[y - 1]]]] > pk:
                                cand[y] = cand[y - 1]
                                y -= 1
                            cand[y] = k
                            nc += 1
                    n0, u0 = m, u
                    i, u = _take(best, q_ev, q_start, heads, merged, m, kind, ptask, qtask, asleep,
                                 cpu, target, st_kind, st_cpu, u_task, u_kind, u_cpu, u)
                    m += 1
                    if nc > 0 and budget > 0:
                        if top + nc > alike.shape[0]:
                            grown = np.empty(2 * (top + nc), np.int64)
                            grown[:top] = alike[:top]
                            alike = grown
                        ch_n[nch] = n0
                        ch_u[nch] = u0
                        ch_t1[nch] = ptask[i]
                        ch_t2[nch] = qtask[i]
                        ch_head[nch] = top
                        for y in range(nc):
                            alike[top] = cand[y]
                            top += 1
                        ch_end[nch] = top
                        nch += 1
                    continue
                # none fits: the last choice that took an event of a task the CPUs' next
                # events concern
                ni = 0
                for k in range(nq):
                    if q_start[k] + heads[k] < q_start[k + 1]:
                        i = q_ev[q_start[k] + heads[k]]
                        if ptask[i] >= 0:
                            involved[ni] = ptask[i]
                            ni += 1
                        if qtask[i] >= 0:
                            involved[ni] = qtask[i]
                            ni += 1
                c = nch - 1
                while c >= 0:
                    if ch_head[c] < ch_end[c]:
                        hit = False
                        for y in range(ni):
                            if involved[y] == ch_t1[c] or involved[y] == ch_t2[c]:
                                hit = True
                                break
                        if hit:
                            break
                    c -= 1
                if c < 0 or budget <= 0:        # the ranks' first, contradicted as each is
                    first = -1
                    for k in range(nq):
                        if q_start[k] + heads[k] < q_start[k + 1] and (
                                first < 0 or pos_of[q_ev[q_start[k] + heads[k]]]
                                < pos_of[q_ev[q_start[first] + heads[first]]]):
                            first = k
                    i, u = _take(first, q_ev, q_start, heads, merged, m, kind, ptask, qtask, asleep,
                                 cpu, target, st_kind, st_cpu, u_task, u_kind, u_cpu, u)
                    m += 1
                    continue
                budget -= 1
                nch = c + 1
                top = ch_end[c]
                u = _undo(st_kind, st_cpu, u_task, u_kind, u_cpu, u, ch_u[c])
                while m > ch_n[c]:
                    m -= 1
                    heads[q_of[merged[m]]] -= 1
                k = alike[ch_head[c]]
                ch_head[c] += 1
                i, u = _take(k, q_ev, q_start, heads, merged, m, kind, ptask, qtask, asleep, cpu,
                             target, st_kind, st_cpu, u_task, u_kind, u_cpu, u)
                m += 1
                ch_t1[c] = ptask[i]
                ch_t2[c] = qtask[i]
            moved = False
            for x in range(n):
                if order[a + x] != merged[x]:
                    moved = True
                order[a + x] = merged[x]
            if moved:
                changed += 1
        # what the group left its tasks in, for the groups after it; the next group's
        # states start from nothing
        for j in range(pair_off[g], pair_off[g + 1]):
            t = pair_task[j]
            if st_kind[t] != ABSENT:
                set_row[t] = last_row[g]
                set_kind[t] = st_kind[t]
                set_cpu[t] = st_cpu[t]
            st_kind[t] = ABSENT
            st_cpu[t] = -1
    return changed
