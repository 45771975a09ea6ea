"""Events stamped with the same time on different CPUs, put in the order the scheduler must have
followed.

Needs events: ts, cpu, event, pid, prev_pid (sched_switch, sched_waking, sched_wakeup,
sched_wakeup_new, sched_migrate_task; the others keep their place).

Each CPU's events are in the order its ring buffer holds them; across CPUs only the timestamps
order them, and the decoders merge equal timestamps CPU by CPU (the lowest CPU first). Where the
trace clock is coarser than the scheduler's steps, that order can contradict itself: the
"global" clock of a trace-cmd recording in a QEMU TCG guest gave 16,814 of 149 K events (11 %)
the timestamp of an event on another CPU (perf bench sched messaging on 8 vCPUs, 2026-12-06), and
there a task woken and migrated by CPU 2 at the time CPU 4 switched it out to sleep was merged
woken first: the task state machine then repaired three contradictions (a migration while
running, a switch-in while asleep, on the wrong CPU) and counted two moves no
sched_migrate_task recorded, all of them this order. The kernel cannot have done that: a
wake-up of a task still on a CPU waits for its switch-out (``try_to_wake_up`` spins on
``p->on_cpu``), and a task is switched in only once woken.

So within a group of equal timestamps spanning CPUs, :func:`order_ties` puts a task's wake-up
events (sched_waking / wakeup / wakeup_new / migrate_task) on another CPU than its switches in
the group

- after them if the last of them switched it out (it went to sleep there first),
- before them if the last switched it in (it was woken first),

keeping each CPU's own order (an event is never put before one its CPU recorded earlier). A task
switched on several CPUs within one group keeps its wake-ups where the merge put them. A group
of three events or more is then merged again event by event from its CPUs' sequences, each
next event one that its tasks' states and CPUs do not contradict (:func:`_settle`; a task's
state before the group is what its last switch, wake-up or migration before it left,
:class:`_History`), going back on a choice where what follows contradicts it
(:func:`_merge`): where a vCPU's clock stood still through a ping-pong of switches while
another CPU woke their tasks, no rank can interleave the two. On the guest's trace: 192 repairs
in the merged order, 119 by the ranks, 24 settled from what the group alone shows, 18 from the
states before it (9 of them tasks preempted as they exited, no tie, since read as such: none
left); on a second recording 127, 47 and 10 (all 10 exits). A Debian 6.1 guest's recording
(1.38 M events, 168 K of them tied, in groups of up to 231 events across 5 CPUs, where two
CPUs each woke and ran the same task in turn) kept 453 of its 1,010 repairs from the states
alone, 213 from their CPUs, 93 going back. Nothing else moves. A trace without such groups is
returned untouched; this host's recordings of ~10 M events hold 32-8,861 pairs of tied events,
in groups of two, and 0-2 to move, in 0.02 s. The settling pass runs compiled
(:mod:`harmony.analysis.ties_jit`) on large traces: a second 6.1 recording (2.26 M events,
309 K tied in 81 K groups) took 3.4-3.6 s in Python, 0.7-1.1 s so, the same order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, forget_results, in_set

WAKE_EVENTS = ("sched_waking", "sched_wakeup", "sched_wakeup_new", "sched_migrate_task")

#: a wake-up's place in its group: before the switches (of its task in), with them, after them
#: (of its task out)
_BEFORE, _WITH, _AFTER = 0, 1, 2


def tie_facts(pairs: int = 0, groups: int = 0, events: int = 0, reordered: int = 0) -> dict:
    """The capture's ``clock_ties`` facts: adjacent events of two CPUs with one timestamp
    (``pairs``), the groups of equal timestamps spanning CPUs and their events, and the groups
    :func:`order_ties` reordered."""
    return {"pairs": int(pairs), "groups": int(groups), "events": int(events),
            "reordered": int(reordered)}


def order_ties(events: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """(``events`` with each group of equal timestamps spanning CPUs in the scheduler's order,
    :func:`tie_facts`): the rows of a group that needs another order are moved within it, in
    ``events`` itself (which is returned); any other row, and a frame without such groups, is
    left as it is."""
    n = len(events)
    if n < 2:
        return events, tie_facts()
    ts = events["ts"].to_numpy()
    cpu = events["cpu"].to_numpy()
    same = ts[1:] == ts[:-1]
    if not same.any():
        return events, tie_facts()
    cross = same & (cpu[1:] != cpu[:-1])
    pairs = int(np.count_nonzero(cross))
    if not pairs:
        return events, tie_facts()
    # the rows of runs of equal timestamps (few), their groups, and those spanning CPUs
    at = np.flatnonzero(same)
    tied = np.zeros(n, bool)
    tied[at] = tied[at + 1] = True
    rows = np.flatnonzero(tied)
    new = np.ones(len(rows), bool)
    new[1:] = (rows[1:] != rows[:-1] + 1) | (ts[rows[1:]] != ts[rows[:-1]])
    gid = np.cumsum(new) - 1
    g_cross = np.zeros(gid[-1] + 1, bool)
    g_cross[gid[np.searchsorted(rows, at[cross[at]])]] = True
    keep = g_cross[gid]
    rows, gid = rows[keep], gid[keep]
    facts = dict(pairs=pairs, groups=int(np.count_nonzero(g_cross)), events=len(rows))
    groups = events.iloc[rows]      # the groups' events, read by both passes
    order = _settle(groups, gid, _group_order(groups, gid), _History(events, rows))
    moved = order != np.arange(len(rows))
    if not moved.any():
        return events, tie_facts(**facts)
    reordered = len(np.unique(gid[moved]))
    src = rows[order]
    # in place, column by column: only the groups' rows are written (a new frame of 10 M events
    # took 0.1-1.5 s and as much memory again as the events); a column on memory that cannot be
    # written (a decoder's read-only array) is replaced by a copy, one column at a time
    # (a categorical column's codes are moved: pandas checks each value against its categories,
    # 0.08 s a column at 2.3 M events)
    for j, name in enumerate(events.columns):
        if isinstance(events[name].dtype, pd.CategoricalDtype):
            events[name] = _moved(events[name], rows, src)
            continue
        values = groups.iloc[order, j].to_numpy()
        try:
            events.iloc[rows, j] = values
        except ValueError:
            events[name] = _moved(events[name], rows, src)
    forget_results(events)      # what an analysis kept for the table in its old order
    return events, tie_facts(**facts, reordered=reordered)


def _moved(col: pd.Series, rows: np.ndarray, src: np.ndarray):
    """A copy of ``col``'s values (its dtype kept) with ``rows`` taken from ``src``."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy(copy=True)
        codes[rows] = codes[src]
        return pd.Categorical.from_codes(codes, dtype=col.dtype)
    values = col.to_numpy(copy=True)
    values[rows] = values[src]
    return pd.array(values, dtype=col.dtype) if values.dtype != col.dtype else values


def _group_order(sub: pd.DataFrame, gid: np.ndarray) -> np.ndarray:
    """The order of ``sub``'s rows (the groups' events, in merge order; ``gid`` their groups)
    that puts a wake-up after its task's switches on another CPU if the last switched it out,
    before them if it switched it in, each CPU's events kept in their order."""
    cpu = sub["cpu"].to_numpy()
    switch = event_mask(sub, "sched_switch")
    wake = event_mask(sub, *WAKE_EVENTS)
    pid = sub["pid"].to_numpy().astype(np.int64)
    prev = sub["prev_pid"].to_numpy().astype(np.int64)
    g = gid.astype(np.int64) << 32
    key = g | (pid & 0xFFFFFFFF)
    # each task's switches in its group (out: prev_pid, in: pid), in merge order; its last one,
    # and whether they all happened on one CPU
    pos = np.arange(len(sub))
    sw_out, sw_in = switch & (prev > 0), switch & (pid > 0)
    s_key = np.concatenate(((g | (prev & 0xFFFFFFFF))[sw_out], key[sw_in]))
    s_pos = np.concatenate((pos[sw_out], pos[sw_in]))
    s_out = np.concatenate((np.ones(np.count_nonzero(sw_out), bool),
                            np.zeros(np.count_nonzero(sw_in), bool)))
    s_cpu = np.concatenate((cpu[sw_out], cpu[sw_in]))
    by = np.lexsort((s_pos, s_key))
    s_key, s_out, s_cpu = s_key[by], s_out[by], s_cpu[by]
    # a wake-up, on another CPU, of a task whose switches in the group were on one CPU: after
    # them if the last switched it out, before them if it switched it in
    rank = np.full(len(sub), _WITH, np.int64)
    if len(s_key):      # else no switch in any group: no wake-up to place
        first = np.r_[True, s_key[1:] != s_key[:-1]]
        last = np.r_[s_key[1:] != s_key[:-1], True]
        starts = np.flatnonzero(first)
        lo = np.minimum.reduceat(s_cpu, starts)
        one_cpu = lo == np.maximum.reduceat(s_cpu, starts)
        tasks, ended_out = s_key[last], s_out[last]
        at = np.searchsorted(tasks, key)
        at[at >= len(tasks)] = 0
        found = wake & (tasks[at] == key) & one_cpu[at] & (lo[at] != cpu)
        rank[found & ended_out[at]] = _AFTER
        rank[found & ~ended_out[at]] = _BEFORE
    # each CPU's own order kept: a rank never falls along a CPU's events within the group
    # (perf's merge need not keep a CPU's equal timestamps together: grouped here by CPU)
    by_cpu = np.lexsort((pos, cpu, gid))
    g_s, c_s = gid[by_cpu], cpu[by_cpu]
    seg = np.ones(len(sub), bool)
    seg[1:] = (g_s[1:] != g_s[:-1]) | (c_s[1:] != c_s[:-1])
    base = (np.cumsum(seg) - 1) * 4
    rank[by_cpu] = np.maximum.accumulate(base + rank[by_cpu]) - base
    return np.lexsort((pos, rank, gid))


#: a group of this many events or more is settled event by event (:func:`_settle`); smaller ones
#: (one event a CPU: every group in this host's recordings) keep the order the ranks gave
SETTLE_MIN_EVENTS = 3


class _History:
    """Each task's state before a group of ties, and its CPU, from its last switch, wake-up or
    migration before it in the events (``rows``: the groups' rows, in the events; a group's are
    consecutive)."""

    ASLEEP, QUEUED, IN, WOKEN, MOVED = range(5)

    def __init__(self, events: pd.DataFrame, rows: np.ndarray):
        self.events, self.rows = events, rows
        self.keys = None

    def load(self, pids: np.ndarray) -> None:
        """Read the events of ``pids``: once, for the tasks of every group to settle (a scan
        of the events' pids, only where there is such a group)."""
        ev = self.events
        switch = event_mask(ev, "sched_switch")
        woken = event_mask(ev, "sched_wakeup", "sched_wakeup_new")
        moved = event_mask(ev, "sched_migrate_task")
        pid = ev["pid"].to_numpy().astype(np.int64)
        prev = ev["prev_pid"].to_numpy().astype(np.int64)
        out = np.flatnonzero(switch & in_set(prev, pids))
        into = np.flatnonzero(switch & in_set(pid, pids))
        wake = np.flatnonzero((woken | moved) & in_set(pid, pids))
        asleep = ev["prev_state"].to_numpy()[out] != 0
        keys = np.concatenate((prev[out], pid[into], pid[wake]))
        rows = np.concatenate((out, into, wake))
        kind = np.concatenate((np.where(asleep, self.ASLEEP, self.QUEUED),
                               np.full(len(into), self.IN),
                               np.where(moved[wake], self.MOVED, self.WOKEN)))
        by = np.lexsort((rows, keys))
        self.keys, self.at, self.kind = keys[by], rows[by], kind[by]
        # where each record leaves its task: a switch's CPU, a wake-up's or migration's target
        cpu = ev["cpu"].to_numpy()[self.at]
        target = ev["target_cpu"].to_numpy()[self.at]
        self.cpu = np.where(self.kind >= self.WOKEN, target, cpu).astype(np.int64)

    def states(self, pids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each task ``pids[k]`` (loaded) before the event at ``rows[k]``: (the row of its
        last switch, wake-up or migration, -1 if none; its state after it as a code of
        :mod:`harmony.analysis.ties_jit`, ABSENT if none; its CPU, -1 if none). A task switched
        in last is running there (woken while it ran: ``ttwu_runnable``); one whose last records
        are wake-ups or migrations is queued if one was a wake-up (migrations alone say only
        where it is); one switched out asleep and not woken since is asleep; else queued."""
        from harmony.analysis import ties_jit as tj
        pids, rows = np.asarray(pids, np.int64), np.asarray(rows, np.int64)
        at = np.full(len(pids), -1, np.int64)
        kind = np.full(len(pids), tj.ABSENT, np.int8)
        cpu = np.full(len(pids), -1, np.int64)
        keys = self.keys
        if not len(keys) or not len(pids):
            return at, kind, cpu
        n = len(self.events) + 1
        last = np.searchsorted(keys * n + self.at, pids * n + rows) - 1   # by task, then row
        found = last >= 0
        found[found] = keys[last[found]] == pids[found]
        k = last[found]
        # each record's task's last switch at or before it (-1: none), and whether a wake-up
        # (not a migration alone) came after that switch
        idx = np.arange(len(keys))
        switch = np.maximum.accumulate(np.where(self.kind < self.WOKEN, idx, -1))
        switch[switch >= 0] = np.where(keys[switch[switch >= 0]] == keys[switch >= 0],
                                       switch[switch >= 0], -1)
        woke = np.cumsum(self.kind == self.WOKEN)
        since = np.where(switch >= 0, switch, np.searchsorted(keys, keys) - 1)
        woken = woke - np.where(since >= 0, woke[np.maximum(since, 0)], 0) > 0
        sw, wk = switch[k], woken[k]
        sw_kind = np.where(sw >= 0, self.kind[np.maximum(sw, 0)], -1)
        got = np.where(sw < 0, np.where(wk, tj.QUEUED, tj.NONE),
                       np.where(sw_kind == self.IN, tj.RUN,
                                np.where((sw_kind == self.ASLEEP) & ~wk, tj.ASLEEP, tj.QUEUED)))
        at[found] = self.at[k]
        kind[found] = got
        cpu[found] = np.where(sw_kind == self.IN, self.cpu[np.maximum(sw, 0)], self.cpu[k])
        return at, kind, cpu


#: how a CPU's next event fits its tasks' states: as the common case has it; as the kernel
#: allows (a task preempted or running after it set a sleeping state is woken where it is:
#: ``ttwu_runnable``, a 6.1 guest's recording); not at all
_LIKELY, _POSSIBLE, _CONTRADICTED = range(3)
#: the states a sched_waking (False) / sched_wakeup (True) commonly finds its task in; where
#: the kernel allows it (_POSSIBLE), one of _AWAKE
_WOKEN_FROM = {False: ("asleep",), True: ("asleep", "waking")}
_AWAKE = ("queued", "run")


def _consistent(state: dict, p: int, kinds: tuple, cpu: int = -1) -> bool:
    """Whether task ``p``'s state is one of ``kinds`` and its CPU ``cpu``, each where known."""
    known = state.get(p)
    if known is None:
        return True
    kind, where = known
    return (kind is None or kind in kinds) and (cpu < 0 or where < 0 or where == cpu)


class _Events:
    """The columns of the groups' events :func:`_merge` reads, as Python lists."""

    def __init__(self, sub: pd.DataFrame):
        self.switch = event_mask(sub, "sched_switch").tolist()
        self.woken = event_mask(sub, "sched_wakeup", "sched_wakeup_new").tolist()
        self.new = event_mask(sub, "sched_wakeup_new").tolist()
        self.waking = event_mask(sub, "sched_waking").tolist()
        self.migrate = event_mask(sub, "sched_migrate_task").tolist()
        self.pid = sub["pid"].to_numpy().tolist()
        self.prev = sub["prev_pid"].to_numpy().tolist()
        self.asleep = (sub["prev_state"].to_numpy() != 0).tolist()
        self.cpu = sub["cpu"].to_numpy().tolist()
        self.orig = sub["orig_cpu"].to_numpy().tolist()
        self.target = sub["target_cpu"].to_numpy().tolist()

    def level(self, i: int, state: dict) -> int:
        """How event ``i`` fits its tasks' ``state``: _LIKELY, _POSSIBLE or _CONTRADICTED."""
        if self.switch[i]:
            p, q, c = self.prev[i], self.pid[i], self.cpu[i]
            return (_LIKELY if ((p <= 0 or _consistent(state, p, ("run",), c))
                                and (q <= 0 or _consistent(state, q, ("queued",), c)))
                    else _CONTRADICTED)
        if self.new[i]:     # a new task: whatever an earlier task of its pid was
            return _LIKELY
        if self.waking[i] or self.woken[i]:
            p, t = self.pid[i], self.target[i]
            return (_LIKELY if _consistent(state, p, _WOKEN_FROM[self.woken[i]], t)
                    else _POSSIBLE if _consistent(state, p, _AWAKE, t) else _CONTRADICTED)
        if self.migrate[i]:
            return (_LIKELY if _consistent(state, self.pid[i], ("queued", "asleep", "waking"),
                                           self.orig[i])
                    else _CONTRADICTED)
        return _LIKELY

    def apply(self, i: int, state: dict, undo: list) -> None:
        """What event ``i`` leaves its tasks in, written to ``state`` (the values it replaced
        appended to ``undo``)."""
        def put(p, value):
            undo.append((p, state.get(p)))
            state[p] = value
        p = self.pid[i]
        if self.switch[i]:
            if self.prev[i] > 0:
                put(self.prev[i], ("asleep" if self.asleep[i] else "queued", self.cpu[i]))
            if p > 0:
                put(p, ("run", self.cpu[i]))
        elif p <= 0:            # no task (a damaged record): nothing to follow
            return
        elif self.waking[i] and state.get(p, (None,))[0] == "asleep":
            put(p, ("waking", self.target[i]))      # no other wake-up until it has slept
        elif self.woken[i] and (self.new[i] or state.get(p, (None,))[0] != "run"):
            put(p, ("queued", self.target[i]))
        elif self.migrate[i]:
            put(p, (state.get(p, (None,))[0], self.target[i]))


#: how many times :func:`_merge` may go back on a choice, per event of a group (then the rest
#: of the group is merged without going back). A 6.1 guest's recording (1.38 M events, 168 K of
#: them in groups of up to 231 across 5 CPUs) kept 213 contradictions without going back, 110,
#: 93, 101 and 88 at 0.25, 0.5, 1 and 2 times an event, the ties' order taking 1.3, 1.7, 2.0,
#: 2.7 and 4.0 s: half a time an event.
BACKTRACK_PER_EVENT = 0.5


def _undo(state: dict, undo: list, to: int) -> None:
    """``state`` as it was when ``undo`` held ``to`` entries."""
    while len(undo) > to:
        p, old = undo.pop()
        if old is None:
            state.pop(p, None)
        else:
            state[p] = old


def _merge(ev: _Events, ranked: list[int], state: dict) -> list[int]:
    """``ranked`` (one group's events in the ranks' order) merged again from its CPUs' own
    sequences, event by event, ``state`` (pid -> (kind, cpu)) followed through it: the next
    event is, of the CPUs' next ones, the first in the ranks' order of those that fit best
    (:meth:`_Events.level`). Where none fits, the merge goes back to its last choice between
    events that fitted alike which concerned a task of the events that do not fit, and takes
    the next (two CPUs that each woke and ran the same task in turn at one timestamp: which
    came first, only what follows tells); once it has gone back BACKTRACK_PER_EVENT times an
    event of the group, it takes the ranks' first where none fits, and goes on."""
    undo: list = []
    for i in ranked:        # the ranks' order where each event fits: the merge's, made sooner
        if ev.level(i, state) != _LIKELY:
            break
        ev.apply(i, state, undo)
    else:
        return ranked
    _undo(state, undo, 0)
    queues: dict[int, list[int]] = {}
    for i in ranked:
        queues.setdefault(ev.cpu[i], []).append(i)
    place = {i: k for k, i in enumerate(ranked)}
    heads = {c: 0 for c in queues}
    merged: list[int] = []
    # [len(merged), len(undo), the other CPUs whose next event fitted alike, the tasks taken]
    choices: list[list] = []
    budget = int(BACKTRACK_PER_EVENT * len(ranked))

    def take(c):
        i = queues[c][heads[c]]
        heads[c] += 1
        merged.append(i)
        ev.apply(i, state, undo)
        return {ev.pid[i], ev.prev[i]}

    while len(merged) < len(ranked):
        fits = sorted((ev.level(queues[c][h], state), place[queues[c][h]], c)
                      for c, h in heads.items() if h < len(queues[c]))
        if fits[0][0] != _CONTRADICTED:
            alike = [c for lv, _, c in fits[1:] if lv == fits[0][0]]
            n, u = len(merged), len(undo)
            tasks = take(fits[0][2])
            if alike and budget > 0:
                choices.append([n, u, alike, tasks])
            continue
        # the last choice that took an event of a task the CPUs' next events concern
        involved = {t for _, _, c in fits for i in (queues[c][heads[c]],)
                    for t in (ev.pid[i], ev.prev[i]) if t > 0}
        k = len(choices) - 1
        while k >= 0 and not (choices[k][2] and choices[k][3] & involved):
            k -= 1
        if k < 0 or budget <= 0:        # the ranks' first, contradicted as each is
            take(min(fits, key=lambda f: f[1])[2])
            continue
        budget -= 1
        del choices[k + 1:]
        n, u, alike, _ = choices[k]
        _undo(state, undo, u)
        while len(merged) > n:
            heads[ev.cpu[merged.pop()]] -= 1
        choices[k][3] = take(alike.pop(0))
    return merged


#: events in groups to settle from which the compiled pass (:mod:`harmony.analysis.ties_jit`)
#: repays loading numba where the kernels are not built ahead of time (the Python version takes
#: ~10-30 us an event, numba's start-up ~0.5-1 s); built ahead of time, or numba loaded already,
#: it runs whatever the size
JIT_MIN_EVENTS = 50_000

#: a state code of ties_jit -> the Python version's state kind (ABSENT: no state)
_KIND_NAMES = {0: None, 1: "asleep", 2: "queued", 3: "run", 4: "waking"}


def _settle(sub: pd.DataFrame, gid: np.ndarray, order: np.ndarray,
            history: _History) -> np.ndarray:
    """``order`` (the ranks' order of ``sub``'s rows), with each group of SETTLE_MIN_EVENTS
    events or more merged again from its CPUs' own sequences, event by event: the next event is
    the first, in the ranks' order, of the CPUs' next ones that do not contradict the state of
    their tasks or the CPU they are on (a switch-out of a task not running on that CPU, a
    switch-in of one asleep, running or queued elsewhere, a wake-up of one awake or on another
    CPU than the event says, a second sched_waking before the first's sched_wakeup, a migration
    of one running or from another CPU), or the ranks' first if each is contradicted. A task's
    state and CPU before the group are what its last switch, wake-up or migration before it
    left (``history``; after a group settled here, what that group's end left); one with none
    may be in any state, on any CPU. Where a vCPU's clock stood still through many switches
    while another CPU woke their tasks (the TCG guest's recording), the ranks cannot interleave
    the two CPUs; this can. Where two CPUs' clocks stood still while each woke and ran the same
    task in turn (a 6.1 guest's recording), the CPU the task was on says which came first.

    Compiled (:mod:`harmony.analysis.ties_jit`) where :func:`harmony.core.jit.use_compiled`
    says so, else in Python (:func:`_merge`): the same orders."""
    starts = np.flatnonzero(np.r_[True, gid[order][1:] != gid[order][:-1]])
    ends = np.r_[starts[1:], len(order)]
    big = np.flatnonzero(ends - starts >= SETTLE_MIN_EVENTS)
    if not len(big):
        return order
    a_s, b_s = starts[big], ends[big]
    lens = b_s - a_s
    # the big groups' events (rows of sub) and their groups; each group's tasks, once
    at_pos = np.repeat(a_s - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
    g_of = np.repeat(np.arange(len(big), dtype=np.int64), lens)
    ev_rows = order[at_pos]
    pid = sub["pid"].to_numpy().astype(np.int64)
    prev = sub["prev_pid"].to_numpy().astype(np.int64)
    both = np.concatenate((pid[ev_rows], prev[ev_rows]))
    g2 = np.concatenate((g_of, g_of))
    keep = both > 0
    pairs = np.unique((g2[keep] << 32) | both[keep])
    pair_g, pair_pid = pairs >> 32, pairs & 0xFFFFFFFF
    pair_off = np.searchsorted(pair_g, np.arange(len(big) + 1))
    tasks = np.unique(pair_pid)
    if not len(tasks):          # no task in any group (idle switches alone): every order fits
        return order
    history.load(tasks)
    first_row, last_row = history.rows[a_s].astype(np.int64), history.rows[b_s - 1].astype(np.int64)
    pair_at, pair_kind, pair_cpu = history.states(pair_pid, first_row[pair_g])
    order = order.astype(np.int64, copy=True)
    from harmony.core.jit import use_compiled
    if use_compiled(int(lens.sum()), JIT_MIN_EVENTS):
        from harmony.analysis import ties_jit as tj
        kind = np.zeros(len(sub), np.int8)
        for code, name in ((tj.SWITCH, "sched_switch"), (tj.WAKING, "sched_waking"),
                           (tj.WAKEUP, "sched_wakeup"), (tj.WAKEUP_NEW, "sched_wakeup_new"),
                           (tj.MIGRATE, "sched_migrate_task")):
            kind[event_mask(sub, name)] = code

        def dense(p):
            at = np.minimum(np.searchsorted(tasks, p), max(len(tasks) - 1, 0))
            return np.where((p > 0) & (tasks[at] == p), at, -1).astype(np.int64)
        col = {c: sub[c].to_numpy().astype(np.int64) for c in ("cpu", "orig_cpu", "target_cpu")}
        tj.settle(kind, dense(prev), dense(pid), sub["prev_state"].to_numpy() != 0, col["cpu"],
                  col["orig_cpu"], col["target_cpu"], order, a_s.astype(np.int64),
                  b_s.astype(np.int64), last_row, pair_off.astype(np.int64),
                  np.searchsorted(tasks, pair_pid).astype(np.int64), pair_at, pair_kind,
                  pair_cpu, len(tasks), float(BACKTRACK_PER_EVENT))
        return order
    settled: dict[int, tuple[int, object]] = {}   # pid -> (the row its last group ended, state)
    ev = _Events(sub)
    pair_pid, pair_at, pair_cpu = pair_pid.tolist(), pair_at.tolist(), pair_cpu.tolist()
    pair_kind = pair_kind.tolist()
    for g, (a, b) in enumerate(zip(a_s.tolist(), b_s.tolist())):
        ranked = order[a:b].tolist()
        state: dict[int, tuple] = {}
        for j in range(pair_off[g], pair_off[g + 1]):
            p = pair_pid[j]
            known = None if pair_kind[j] < 0 else (_KIND_NAMES[pair_kind[j]], pair_cpu[j])
            end = settled.get(p)
            if end is not None and pair_at[j] <= end[0]:
                known = end[1]          # its last event was in a group settled here
            if known is not None:
                state[p] = known
        order[a:b] = _merge(ev, ranked, state)
        for p, st in state.items():
            settled[p] = (int(last_row[g]), st)
    return order
