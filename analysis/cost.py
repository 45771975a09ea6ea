"""What a policy cost: CPUs left idle while work waited, moves undone at once, and the distance of
the allocation from the ideal one.

- :func:`df_wasted`: the work-conservation invariant (after Lozi et al., "The Linux scheduler: a
  decade of wasted cores"): every interval during which a CPU of the set is idle while an
  experiment task allowed on it waits runnable on another CPU. Needs events: sched_switch (every
  task's: a CPU is idle while its idle task runs), and the state machine's
  (:mod:`harmony.analysis.taskstate`: when each task waits, and where).
- :func:`df_useless_migrations`: a task moved and moved back within
  :data:`~harmony.analysis.thresholds.USELESS_MIGRATION_WITHIN_S`. Needs: a migrations table.
- :func:`df_ideal`: the GPS allocation of CPU Futures (the thesis, eq. 4.18-4.22: weights made
  feasible by the tasks' demands, P CPUs, at most one CPU a task) in each window of the
  allocation table, each task's slowdown against it and the policy's distance from it. Needs:
  an allocation table and the tasks table.

:func:`cost_summary` gives the numbers every experiment's summary carries.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from harmony.analysis import tables
from harmony.analysis import thresholds as T
from harmony.analysis.arrays import event_mask, in_set, index_of, key_table, keys_fit
from harmony.analysis.causes import CAUSES, cause_counts
from harmony.analysis.metrics import jain_index
from harmony.analysis.reconstruct import NS, class_fair_shares
from harmony.analysis.taskstate import record_ts, seq_before, task_records
from harmony.core.jit import run_split, split, use_compiled

#: the longest wasted episodes the summary names
LONGEST = 3

#: the task records of the idle periods are looked up (two binary searches per task and
#: period) rather than all taken when tasks x periods x this is less than the records
LOOKUP_COST = 8

#: events from which the compiled sweep (:mod:`harmony.analysis.cost_jit`) is worth loading numba
#: in a new process, as the state machine's: at 7.06 M events it took 0.26 s against 0.39 and
#: 159 MiB at its peak against 290 (the import's peak at 13 M events: 2.12 -> 1.75 GB); once
#: numba is loaded (the decoder loads it for large traces) it is used whatever the size
JIT_MIN_EVENTS = 8_000_000


class _Rows:
    """The columns of an events table the idle spells are found from, and the masks all CPUs
    share."""

    def __init__(self, events: pd.DataFrame):
        self.cpu, self.ts = events["cpu"].to_numpy(), events["ts"].to_numpy()
        self.cpid, self.prev_pid = events["common_pid"].to_numpy(), events["prev_pid"].to_numpy()
        self.sw = event_mask(events, "sched_switch")
        self.to_idle = self.sw & (events["pid"].to_numpy() == 0)
        self.sets = self.sw | (self.cpid > 0)       # the rows that set the state after them


def _idle_changes(ev: _Rows, cpu: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): the times ``cpu`` becomes idle and stops being idle, each in time order,
    alternating from a start. Idle from a switch to the idle task until the switch out of it.

    A probe blind in the idle task's context (perf on some kernels) misses that switch out: the
    next event the CPU records then shows another task current (a switch away from it, an event
    in its context) while the CPU is believed idle. The idle interval is then cut at the last
    event recorded in the idle context since it began (or at its start: nothing claimed), since
    when the CPU was running is unknown. Before the CPU's first switch its state is unknown,
    counted not idle."""
    on_cpu = ev.cpu == cpu
    k = np.flatnonzero(on_cpu & ev.sets)            # the rows setting the CPU's state, in order
    idle = ev.to_idle[k]
    after = np.flatnonzero(idle[:-1]) + 1           # the rows right after a switch to idle
    # of these, those showing the CPU busy (a switch away from a task, an event in a task's
    # context) cut the idle spell short; the others are switches out of the idle task
    rows = k[after]
    cut = ~ev.sw[rows] | (ev.prev_pid[rows] != 0)
    end_row = rows.copy()
    if cut.any():
        # a cut spell ends at the last event of the idle context before the row: one in the
        # idle task's context (not a switch), or the switch to idle
        in_idle = np.r_[-1, np.flatnonzero(on_cpu & ~ev.sw & (ev.cpid == 0))]
        seen = in_idle[np.searchsorted(in_idle, rows[cut]) - 1]
        end_row[cut] = np.maximum(seen, k[after[cut] - 1])
    # a spell starts at a switch to idle unless the CPU was idle until it (not a cut)
    idle_until = np.zeros(len(k), bool)
    idle_until[after[~cut]] = True
    return ev.ts[k[idle & ~idle_until]], ev.ts[end_row[cut | ~idle[after]]]


def _idle_periods(starts: list, ends: list) -> tuple[np.ndarray, np.ndarray]:
    """The periods [from, to) during which at least one CPU is idle, in time order, from each
    CPU's (starts, ends) of idleness (to: the largest int64 if the last never ends)."""
    t = np.concatenate([np.zeros(0, np.int64), *starts, *ends])
    d = np.concatenate([np.zeros(0, np.int64)] + [np.ones(len(x), np.int64) for x in starts]
                       + [-np.ones(len(x), np.int64) for x in ends])
    o = np.argsort(t, kind="stable")
    t, idle = t[o], np.cumsum(d[o])
    last = np.ones(len(t), bool)                    # the CPUs idle after each instant
    np.not_equal(t[1:], t[:-1], out=last[:-1])
    t, some = t[last], idle[last] > 0
    edges = np.diff(some.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    to = np.r_[t, np.iinfo(np.int64).max][edges == -1]
    return t[edges[:-1] == 1], to


def _records_near(seq: np.ndarray, pid: np.ndarray, bounds) -> np.ndarray | None:
    """The task records (``seq``, ``pid``: task_records' columns, by task and in time order) that
    give each task's state in periods: those inside one and each task's last at or before a
    period's start, by task and in time order; ``bounds``: (lo, hi), the periods' starts and ends
    as seqs (:func:`harmony.analysis.taskstate.seq_before`: a start's "right", an end's "left").
    None (all of them) if looking them up would cost about as much as taking them all, or if
    they are most of them."""
    lo, hi = bounds
    heads = np.r_[0, np.flatnonzero(pid[1:] != pid[:-1]) + 1, len(pid)]
    if (len(heads) - 1) * len(lo) * LOOKUP_COST > len(seq):
        return None
    first, stop = [], []
    for a, b in zip(heads[:-1], heads[1:]):
        t = seq[a:b]
        first.append(a + np.maximum(np.searchsorted(t, lo, "left") - 1, 0))
        stop.append(a + np.searchsorted(t, hi, "left"))
    # a record both in a period and the last before the next one's start comes twice: the
    # second time, it changes nothing
    first, stop = np.concatenate(first), np.concatenate(stop)
    n = np.maximum(stop - first, 0)
    if 2 * int(n.sum()) > len(seq):
        # most of them: all, read in place rather than copied (a ping-pong's 5.1 M events: 2.4 M
        # records of 2.5 M, their columns' copies ~60 MB at the import's peak)
        return None
    return np.repeat(first - np.cumsum(n) + n, n) + np.arange(n.sum())


def _waiting_changes(events: pd.DataFrame, tasks: pd.DataFrame, cpus: list[int],
                     periods) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, k, change): +1 when an experiment task free to move (not pinned) starts waiting
    (runnable, not running) on ``cpus[k]``, -1 when it stops: the starts task by task, each
    task's in time order, then the ends likewise. Exact in the ``periods``
    (:func:`_idle_periods`); outside them the changes of a stretch between two may be summed into
    its last instant, and those after the last left out. Where every record is read (most of
    them are the periods'), a compiled pass writes the changes (:func:`cost_jit.waits`): no mask
    or list of rows as long as the records, while the records are held."""
    pids = tasks["pid"].to_numpy().astype(np.int32)
    free = pids[~tasks["pinned"].to_numpy().astype(bool)] if "pinned" in tasks.columns else pids
    r = task_records(events, pids)
    lo, hi = periods
    at = _records_near(r["seq"].to_numpy(), r["pid"].to_numpy(),
                       (seq_before(events, lo, "right"), seq_before(events, hi, "left")))
    if at is None and use_compiled(len(events), JIT_MIN_EVENTS) and keys_fit(free, cpus):
        from harmony.analysis import cost_jit  # the compiled kernels: only on this path
        return cost_jit.waits(r["pid"].to_numpy(), r["seq"].to_numpy(), events["ts"].to_numpy(),
                              *(r[c].to_numpy() for c in ("cpu_after", "runnable_after",
                                                          "running_after")),
                              key_table(free), key_table(cpus))

    def column(name: str) -> np.ndarray:
        return r[name].to_numpy() if at is None else r[name].to_numpy()[at]

    pid, seq, cpu = column("pid"), column("seq"), column("cpu_after")
    waiting = column("runnable_after") & ~column("running_after")
    waiting &= in_set(pid, free)
    waiting &= in_set(cpu, cpus)
    # a task's next record (of those kept) ends the wait of the one before
    ended = np.flatnonzero(waiting[:-1] & (pid[1:] == pid[:-1]))
    began = np.flatnonzero(waiting)
    del waiting
    # the CPU positions of these rows only, not of every record
    return (record_ts(events, np.concatenate([seq[began], seq[ended + 1]])),
            np.concatenate([index_of(cpu[began], cpus, np.int32),
                            index_of(cpu[ended], cpus, np.int32)]),
            np.r_[np.ones(len(began), np.int8), -np.ones(len(ended), np.int8)])


class IdleSpells(NamedTuple):
    """The CPUs' idle spells :func:`df_wasted` reads (:func:`idle_spells`)."""
    cpus: tuple[int, ...]                       # the distinct CPUs, ascending
    starts: tuple[np.ndarray, ...]              # each one's times it becomes idle, in order
    ends: tuple[np.ndarray, ...]                # each one's times it stops being idle
    periods: tuple[np.ndarray, np.ndarray]      # [from, to) while at least one is idle


def idle_spells(events: pd.DataFrame, cpus) -> IdleSpells:
    """The idle spells of ``cpus`` that :func:`df_wasted` reads (:func:`_idle_changes`,
    :func:`_idle_periods`). Found from the events alone, so a caller may find them before the
    task records are made: the pipeline does, so that their temporaries (~70 MB at 5.1 M events
    of a ping-pong) never share the memory with the records."""
    unique = tuple(sorted(set(int(c) for c in cpus)))
    if unique and use_compiled(len(events), JIT_MIN_EVENTS) and keys_fit(unique):
        # one compiled pass for every CPU, no mask or list of rows as long as the events
        from harmony.analysis import cost_jit  # the compiled kernels: only on this path
        cols = (events[c].to_numpy() for c in ("cpu", "ts"))
        s, s_at, e, e_at = cost_jit.idle_changes(
            *cols, event_mask(events, "sched_switch"),
            *(events[c].to_numpy() for c in ("pid", "prev_pid", "common_pid")),
            key_table(unique), len(unique))
        starts = tuple(s[s_at[j]:s_at[j + 1]] for j in range(len(unique)))
        ends = tuple(e[e_at[j]:e_at[j + 1]] for j in range(len(unique)))
        # a few CPUs' spells merged as they are read, not all sorted (0.25 s at 10.25 M events
        # of a ping-pong on two CPUs)
        periods = (cost_jit.idle_periods(s, s_at, e, e_at, len(unique))
                   if 2 * len(unique) <= MERGED_RUNS_MAX else
                   _idle_periods(list(starts), list(ends)))
        return IdleSpells(unique, starts, ends, periods)
    rows = _Rows(events)
    starts, ends = zip(*(_idle_changes(rows, c) for c in unique)) if unique else ((), ())
    del rows
    return IdleSpells(unique, tuple(starts), tuple(ends), _idle_periods(list(starts), list(ends)))


def df_wasted(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
              idle: IdleSpells | None = None, records_read=None) -> pd.DataFrame:
    """Every interval in [t0, t_end] during which a CPU of ``cpus`` is idle while an experiment task
    free to run on it (not pinned) waits runnable on another CPU of the set.

    Columns: :data:`harmony.analysis.tables.WASTED`. attrs: ``wasted_cpu_s`` (float) = the CPU time
    those intervals could have given, integral over time of min(CPUs idle with a task waiting
    elsewhere, tasks waiting): two idle CPUs and one waiting task waste one CPU, not two.

    One sweep: every CPU's changes of idleness and of tasks waiting there, merged in time order
    (each CPU's and each task's are in order already) and summed up to each instant; the tasks
    waiting are followed only while a CPU is idle (:func:`_idle_periods`). On large traces the
    sum runs as one compiled pass over the merged changes (:mod:`harmony.analysis.cost_jit`),
    which keeps each source's level rather than an array of it: the same table.

    ``idle``: :func:`idle_spells` of these events and CPUs, if found already. ``records_read``,
    if given, is called once the task records have been read (the pipeline frees them there:
    the sweep and the table then reuse their memory).
    """
    cpus = [int(c) for c in cpus]
    unique = sorted(set(cpus))
    n = len(unique)
    if idle is None:
        idle = idle_spells(events, cpus)
    elif idle.cpus != tuple(unique):
        raise ValueError(f"df_wasted: idle spells of CPUs {list(idle.cpus)}, not of {unique}")
    starts, ends, periods = idle.starts, idle.ends, idle.periods
    del idle
    wt, wk, wd = _waiting_changes(events, tasks, unique, periods)
    if records_read is not None:
        records_read()
    # sources: i for CPU unique[i] idle, n + k for the tasks waiting on unique[k]
    ts = np.concatenate([*starts, *ends, wt])
    src = np.concatenate([np.full(len(x), i, np.int32) for part in (starts, ends)
                          for i, x in enumerate(part)] + [wk.astype(np.int32) + n])
    change = np.concatenate([np.ones(len(x), np.int8) for x in starts]
                            + [-np.ones(len(x), np.int8) for x in ends] + [wd])
    # the parts, merged: freed now (this runs beside the run queues, at the import's peak)
    del starts, ends, wt, wk, wd
    compiled = use_compiled(len(events), JIT_MIN_EVENTS)
    # the runs in time order: a few the compiled sweep merges as it goes; else sorted here
    bounds = (np.r_[0, np.flatnonzero(ts[1:] < ts[:-1]) + 1, len(ts)].astype(np.int64)
              if compiled else None)
    if bounds is None or len(bounds) - 1 > MERGED_RUNS_MAX:
        order = np.argsort(ts, kind="stable")       # a merge of the sorted runs
        ts, src, change = ts[order], src[order], change[order]
        del order
        bounds = np.array([0, len(ts)], np.int64)
    if compiled:
        changes = [ts, src, change]
        del ts, src, change                         # the sweep frees them once it is done
        return _wasted_compiled(changes, bounds, n, unique, cpus, t0, t_end)
    # the state at t0 (every change until then), then every instant of change in (t0, t_end)
    a = int(np.searchsorted(ts, t0, "right"))
    b = max(a, int(np.searchsorted(ts, t_end, "left")))
    init = np.bincount(src[:a], weights=change[:a], minlength=2 * n).astype(np.int64)
    ts, src, change = ts[a:b], src[a:b], change[a:b]
    last = np.ones(len(ts), bool)                   # the last change of each instant
    np.not_equal(ts[1:], ts[:-1], out=last[:-1])
    left = np.r_[np.int64(t0), ts[last]]
    dur = np.r_[left[1:], np.int64(t_end)] - left

    def level(s: int) -> np.ndarray:
        """Source s's level at each ``left``: 0..n-1 CPU unique[s] idle, n + k tasks waiting on
        unique[k]."""
        steps = np.cumsum(np.where(src == s, change, 0), dtype=np.int64)[last]
        return np.r_[init[s], init[s] + steps]

    wait = {c: level(n + i) for i, c in enumerate(unique)}
    total = sum((wait[c] for c in cpus), np.zeros(len(left), np.int64))
    count = np.zeros(len(left), np.int64)           # CPUs wasting at each left
    cols = {x: [np.zeros(0, np.int64)] for x in ("cpu", "start", "end", "waiting")}
    for c in cpus:
        elsewhere = total - wait[c]
        on = (level(unique.index(c)) > 0) & (elsewhere > 0)
        count += on
        edges = np.diff(on.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        first, after = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        cols["cpu"].append(np.full(len(first), c, np.int64))
        cols["start"].append(left[first])
        cols["end"].append(left[after - 1] + dur[after - 1])
        # the most waiting elsewhere in each episode: from its start to the next one's, the
        # CPU not wasting (0) in between
        cols["waiting"].append(np.maximum.reduceat(np.where(on, elsewhere, 0), first)
                               if len(first) else np.zeros(0, np.int64))
    cpu, start, end, waiting = (np.concatenate(cols[x]) for x in ("cpu", "start", "end", "waiting"))
    return _wasted_frame(cpu, start, end, waiting, t0,
                         float((np.minimum(count, total) * dur).sum() / NS))


def _wasted_frame(cpu, start, end, waiting, t0: int, wasted_cpu_s: float) -> pd.DataFrame:
    """The episodes (each CPU's column, int64) as df_wasted's table, by (start, cpu)."""
    o = np.lexsort((cpu, start))
    cpu, start, end, waiting = cpu[o], start[o], end[o], waiting[o]
    out = tables.WASTED.frame({
        "cpu": cpu.astype(np.int32), "start": start, "end": end, "duration": end - start,
        "t": (start - t0) / NS, "waiting": waiting,
        "long": (end - start) / NS >= T.WASTED_EPISODE_MIN_S}, copy=False)
    out.attrs["wasted_cpu_s"] = wasted_cpu_s
    return out


#: a change in how many the compiled sweep's room for episodes is made for at first: a
#: ping-pong's sweep found one in 4 (2.0 M episodes of 8.1 M changes at 10 M events; 0.80 M of
#: 3.9 M at 5.1 M), up to one in 3.8 in one of two stretches of time. With room for one in 16,
#: it swept every stretch twice, the second time with room for all it had found (each sweep
#: 0.07 s at 10 M events)
EPISODES_PER_CHANGE = 3
#: the most runs in time order the compiled sweep merges itself (a scan of their heads for each
#: change); more (many tasks), and the changes are sorted first
MERGED_RUNS_MAX = 16


def _wasted_compiled(changes: list, bounds: np.ndarray, n: int, unique: list[int],
                     cpus: list[int], t0: int, t_end: int) -> pd.DataFrame:
    """df_wasted's sweep by :func:`harmony.analysis.cost_jit.episodes` of ``changes`` (ts, src,
    change: runs in time order from each of ``bounds``, each CPU's idle spells and each task's
    waits; emptied, so that the arrays are freed as soon as the sweep is done, before the table
    is made: 2.0 M episodes at 10 M events of a ping-pong), with room for as many episodes as it
    finds. A few runs are merged by the sweep as it goes, not by a sort: no order array (31 MB at
    5.1 M events of a ping-pong, at the import's peak) and no sort."""
    from harmony.analysis import cost_jit  # the compiled kernels: only on this path

    ts, src, change = changes
    slot = np.array([unique.index(c) for c in cpus], np.int64)
    # stretches of time swept on threads at once, each from the levels its start finds
    k = len(split(len(ts))) if t_end - t0 >= 1024 else 1
    cuts = [int(t0) + (int(t_end) - int(t0)) * i // k for i in range(k)] + [int(t_end)]
    stretches = []
    for a in cuts[:-1]:
        first = bounds[:-1].copy()
        lvl0 = np.zeros(2 * n, np.int64)
        if a > t0:      # every change at or before a: its level at the stretch's start
            for r in range(len(bounds) - 1):
                lo, hi = int(bounds[r]), int(bounds[r + 1])
                first[r] = lo + int(np.searchsorted(ts[lo:hi], a, "right"))
                lvl0 += np.bincount(src[lo:first[r]], weights=change[lo:first[r]],
                                    minlength=2 * n).astype(np.int64)
        stretches.append((first, lvl0))

    del ts, src, change

    def sweep(_lo: int, _hi: int, k: int):
        first, lvl0 = stretches[k]
        room = max(1024, len(changes[0]) // EPISODES_PER_CHANGE // len(stretches))
        while True:
            out = [np.empty(room, np.int64) for _ in range(4)]
            found, wasted = cost_jit.episodes(*changes, bounds, first, lvl0, n, slot,
                                              np.int64(cuts[k]), np.int64(cuts[k + 1]), *out)
            if found <= room:
                return [a[:found] for a in out], wasted
            room = found

    parts = run_split(sweep, [(0, 0)] * len(stretches))
    changes.clear()
    which, start, end, waiting = _stitched(parts, cuts)
    cpu = np.asarray(cpus, np.int64)[which] if len(cpus) else which
    return _wasted_frame(cpu, start, end, waiting, t0, float(sum(w for _, w in parts) / NS))


def _stitched(parts: list, cuts: list[int]) -> list[np.ndarray]:
    """The episodes of stretches of time swept apart (``parts``: each one's [cpu index, start,
    end, waiting] and wasted time; stretch k from cuts[k] to cuts[k + 1]) as one sweep finds
    them: an episode open where a stretch ends (it ends there) and open where the next begins
    (it starts there) is one episode, the most waiting of both."""
    cols = [list(a) for a in zip(*(p for p, _ in parts))]      # per column, per stretch
    for k in range(1, len(parts)):
        t = cuts[k]
        before = np.flatnonzero(cols[2][k - 1] == t)           # at most one a CPU
        after = np.flatnonzero(cols[1][k] == t)
        if not len(before) or not len(after):
            continue
        at = {int(j): i for i, j in zip(after, cols[0][k][after])}
        gone = []
        for i in before:
            b = at.get(int(cols[0][k - 1][i]))
            if b is None:
                continue
            cols[1][k][b] = cols[1][k - 1][i]
            cols[3][k][b] = max(cols[3][k][b], cols[3][k - 1][i])
            gone.append(i)
        if gone:
            keep = np.ones(len(cols[0][k - 1]), bool)
            keep[gone] = False
            for c in cols:
                c[k - 1] = c[k - 1][keep]
    return [np.concatenate(c) if len(c) > 1 else c[0] for c in cols]


def df_useless_migrations(migrations: pd.DataFrame, t0: int, t_end: int) -> pd.DataFrame:
    """Every move of a task from a CPU to another undone by its next move, back, within
    :data:`~harmony.analysis.thresholds.USELESS_MIGRATION_WITHIN_S`, both in [t0, t_end].

    Columns: :data:`harmony.analysis.tables.USELESS_MIGRATIONS`."""
    m = migrations[(migrations["ts"] >= t0) & (migrations["ts"] <= t_end)]
    m = m.sort_values(["pid", "ts"], kind="stable")
    pid, ts = m["pid"].to_numpy(), m["ts"].to_numpy()
    src, dst = m["src_cpu"].to_numpy(), m["dst_cpu"].to_numpy()
    cause = m["cause"].astype(str).to_numpy()
    back = np.flatnonzero((pid[1:] == pid[:-1]) & (src[1:] == dst[:-1]) & (dst[1:] == src[:-1])
                          & (ts[1:] - ts[:-1] <= T.USELESS_MIGRATION_WITHIN_S * NS)
                          & (src[:-1] != dst[:-1]))
    rows = [(int(pid[k]), int(ts[k]), (int(ts[k]) - t0) / NS, int(src[k]), int(dst[k]),
             int(ts[k + 1] - ts[k]), str(cause[k]), str(cause[k + 1])) for k in back]
    rows.sort(key=lambda r: r[1])
    return tables.USELESS_MIGRATIONS.from_rows(rows)


def _demand_at(tasks: pd.DataFrame, t_s: float) -> np.ndarray:
    """Each task's demand (fraction of one CPU) at ``t_s`` s after t0: its duty, its cut duty once
    cut, 0 once it has exited."""
    duty = tasks["duty"].to_numpy(np.float64)
    if "cut_duty_at_s" in tasks.columns:
        cut_at = pd.to_numeric(tasks["cut_duty_at_s"], errors="coerce").to_numpy(np.float64)
        duty = np.where(np.isfinite(cut_at) & (t_s >= cut_at),
                        tasks["cut_duty"].to_numpy(np.float64), duty)
    if "stop_after_s" in tasks.columns:
        stop = pd.to_numeric(tasks["stop_after_s"], errors="coerce").to_numpy(np.float64)
        duty = np.where(np.isfinite(stop) & (t_s >= stop), 0.0, duty)
    return np.clip(duty / 100.0, 0.0, 1.0)


def df_ideal(allocation: pd.DataFrame, tasks: pd.DataFrame, ncpus: int,
             rt_share: float | None = None) -> pd.DataFrame:
    """Each task's share in each window of ``allocation`` against its ideal share there.

    The ideal is :func:`harmony.analysis.reconstruct.class_fair_shares` (for the fair classes the
    GPS allocation made feasible: each task's weight, nice -> the kernel's load weight, capped by
    its demand, at most one CPU, the capacity freed re-shared by weight: CPU Futures eq.
    4.20-4.22) of ``ncpus`` CPUs, with each task's demand at the window's middle (its cut duty
    once cut, 0 once it exited).

    Columns: :data:`harmony.analysis.tables.IDEAL`.
    """
    a = allocation
    win = a["window"].to_numpy()
    mid = a["t"].to_numpy(np.float64) + a["window_s"].to_numpy(np.float64) / 2
    pos = pd.Index(tasks["pid"].to_numpy()).get_indexer(a["pid"].to_numpy())
    ideal = np.zeros(len(a))
    # the demands change only where a task's duty is cut or it stops: the windows of one set of
    # demands share one computation (96 windows of a 10 M-event import: 0.10 -> 0.01 s)
    shares: dict[bytes, np.ndarray] = {}
    for w in np.unique(win):
        sel = np.flatnonzero(win == w)
        demand = _demand_at(tasks, float(mid[sel[0]]))
        key = demand.tobytes()
        if key not in shares:
            shares[key] = class_fair_shares(tasks.assign(duty=demand * 100.0), ncpus, rt_share)
        ideal[sel] = shares[key][pos[sel]]
    share = a["share"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = np.where(ideal > 0, ideal / share, np.nan)
    return tables.IDEAL.frame({
        "pid": a["pid"].to_numpy(), "name": a["name"], "role": a["role"], "window": win,
        "t": a["t"].to_numpy(), "window_s": a["window_s"].to_numpy(), "share": share,
        "ideal": ideal, "error": share - ideal, "slowdown": slowdown}, copy=False)


#: a window shorter than this fraction of the run's window length (the last one, cut by the end
#: of the run: often under a millisecond, less than one time slice) shares nothing worth judging:
#: left out of Jain's index and the slowdown, and weighs by its length in the mean error
SHORT_WINDOW_FRACTION = 0.5


def ideal_distance(ideal: pd.DataFrame) -> dict:
    """The policy's distance from the ideal allocation (a :func:`df_ideal` table): mean absolute
    share error (fraction of a CPU; each window weighs by its length), Jain's index of share /
    ideal over the (window, task) pairs with an ideal share, and the largest slowdown (ideal /
    share; inf for a task given nothing that was owed something, None where no task was owed
    anything); these two over the windows of at least SHORT_WINDOW_FRACTION of the longest."""
    ws = ideal["window_s"].to_numpy()
    full = ws >= SHORT_WINDOW_FRACTION * ws.max(initial=0)
    owed = (ideal["ideal"].to_numpy() > 0) & full
    ratio = ideal["share"].to_numpy()[owed] / ideal["ideal"].to_numpy()[owed]
    slow = ideal["slowdown"].to_numpy()[owed]
    err = np.abs(ideal["error"].to_numpy())
    return {"mean_abs_error": float((err * ws).sum() / ws.sum()) if ws.sum() > 0 else 0.0,
            "jain": jain_index(ratio) if len(ratio) else None,
            "slowdown_max": float(slow.max()) if len(slow) else None}


def longest_first(wasted: pd.DataFrame, k: int) -> pd.DataFrame:
    """The ``k`` longest episodes of a :func:`df_wasted` table, longest first, equal ones in the
    table's order: its stable sort by duration, descending, cut to ``k``, without sorting every
    row (2.0 M episodes at 10 M events of a ping-pong: 16 ms instead of 0.39 s)."""
    d = wasted["duration"].to_numpy()
    rows = np.arange(len(d))
    if len(d) > k:
        # every row at least as long as the k-th longest: k of them, and the ties of the last
        rows = np.flatnonzero(d >= np.partition(d, len(d) - k)[len(d) - k])
    return wasted.iloc[rows[np.argsort(-d[rows], kind="stable")][:k]]


def cost_summary(events: pd.DataFrame, tasks: pd.DataFrame, migrations: pd.DataFrame,
                 allocation: pd.DataFrame, cpus, t0: int, t_end: int,
                 rt_share: float | None = None, wasted: pd.DataFrame | None = None) -> dict:
    """The numbers of what the policy cost, for every experiment's summary
    (:data:`harmony.experiments.base.COST_SUMMARY` declares them); ``wasted``: the
    :func:`df_wasted` table of the same arguments, if it was made already."""
    mig = migrations[(migrations["ts"] >= t0) & (migrations["ts"] <= t_end)]
    counts = cause_counts(mig)
    if wasted is None:
        wasted = df_wasted(events, tasks, cpus, t0, t_end)
    long = wasted[wasted["long"].to_numpy()]
    dist = ideal_distance(df_ideal(allocation, tasks, len(cpus), rt_share))
    slow = dist["slowdown_max"]
    return {
        **{f"cause_{c}": counts[c] for c in CAUSES},
        "migrations_inferred": counts["inferred"],
        "wasted_cpu_s": wasted.attrs["wasted_cpu_s"],
        "wasted_episodes": int(len(long)),
        "wasted_longest_ms": float(wasted["duration"].max() / 1e6) if len(wasted) else 0.0,
        "wasted_longest": {"episodes": [
            {"cpu": int(r.cpu), "t": float(r.t), "ms": r.duration / 1e6, "waiting": int(r.waiting)}
            for r in longest_first(wasted, LONGEST).itertuples()]},
        "useless_migrations": int(len(df_useless_migrations(migrations, t0, t_end))),
        "ideal_share_error": dist["mean_abs_error"],
        "ideal_jain": dist["jain"],
        "ideal_slowdown_max": None if slow is None or not np.isfinite(slow) else slow,
    }
