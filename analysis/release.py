"""Release spread: how nearly at once the controller made the experiment's tasks runnable at t0.

Needs: sched_wakeup (and sched_wakeup_new) events, the markers "harmony t0" and "harmony released"
(and "harmony warm-up" for a warm release); sched_switch and sched_migrate_task for the checks
that the layout held.

Two releases (:mod:`harmony.workload.controller`): a *cold* one wakes each task at t0 on its initial
CPU; a *warm* one wakes them at the warm-up marker, still confined to their initial CPU, and at t0
widens the CPU set of tasks that are running (not woken). The checks are the same in substance
(every task let go, the layout as asked at t0, nothing moved before the last task was free), and
each is taken where it applies.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, growing_windows, in_set


def release_spread(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, released: int | None,
                   warmup: int | None = None) -> dict:
    """Measure the release from the trace; ``warmup``: the warm-up marker of a warm release
    (None: a cold one).

    Returns a dict:
      warm             True for a warm release
      woken            tasks that became runnable at or after t0 (warm: after the warm-up
                       marker); should be all of them
      not_woken        pids of tasks never seen waking then
      wake_spread_ns   first to last task's first wake-up then
      release_spread_ns  cold: first wake-up to the moment the last task was also free to move
                       (the "released" marker, written after the last task was freed to the CPU
                       set: the last cpuset write, or the last sched_setaffinity on the
                       fallback): the release window as the scheduler saw it; an upper bound.
                       Warm: t0 to "released", the time the widening of the CPU set took
      first_wakeup_after_t0_ns  delay from the t0 marker to the first wake-up (None when warm)
      warmed_s         warm: from the warm-up marker to t0 (None when cold)
      ran_before_t0    pids switched in before their release (cold: before t0; warm: before the
                       warm-up marker): should be none, held at the gate
      moved_before_released  migrations of tasks between t0 and the "released" marker: the
                       scheduler acting on tasks freed early in the window (None without marker)
      woke_off_initial_cpu  pids not on their ``initial_cpu`` when let go: cold, whose first
                       wake-up after t0, recorded by the "released" marker, put them elsewhere;
                       warm, whose first wake-up after the warm-up marker put them elsewhere or
                       that moved before t0 (confined: they cannot). Should be none: the layout
                       exists at t0. A task whose wake-up the trace lacks there (a probe blind to
                       an idle CPU's context misses remote wake-ups) is not judged. None when
                       ``tasks`` has no initial_cpu or the events no target_cpu
    """
    pids = tasks["pid"].to_numpy()
    ts = events["ts"].to_numpy()
    pid = events["pid"].to_numpy()
    start = t0 if warmup is None else warmup
    # the rows before the release (when the events are in time order, as the canonical table's
    # are: a look-up, not a pass)
    in_order = bool(len(ts) < 2 or (ts[1:] >= ts[:-1]).all())
    bound = int(np.searchsorted(ts, start)) if in_order else None
    firsts = _first_wakeups(events, pids, start, bound)
    first_ts = ts[firsts]
    woken = np.unique(pid[firsts])
    not_woken = sorted(set(pids.tolist()) - set(woken.tolist()))
    before = slice(0, bound) if in_order else slice(None)
    ran = pid[before][event_mask(events.iloc[before], "sched_switch") & (ts[before] < start)
                      & in_set(pid[before], pids)]
    out = {"warm": warmup is not None, "woken": int(len(woken)), "not_woken": not_woken,
           "ran_before_t0": sorted(set(ran.tolist())),
           "warmed_s": None if warmup is None else (int(t0) - int(warmup)) / 1e9}
    if "initial_cpu" in tasks.columns and "target_cpu" in events.columns and len(firsts):
        limit = released if warmup is None else t0
        if limit is not None:
            firsts = firsts[first_ts <= limit]
        home = dict(zip(tasks["pid"].tolist(), tasks["initial_cpu"].tolist()))
        target = events["target_cpu"].to_numpy()
        off = {int(p) for p, c in zip(pid[firsts], target[firsts]) if int(c) != int(home[int(p)])}
        if warmup is not None:
            rows = _between(events, ts, in_order, warmup, t0, "sched_migrate_task", pids, True)
            off |= set(pid[rows].tolist())
        out["woke_off_initial_cpu"] = sorted(int(p) for p in off)
    else:
        out["woke_off_initial_cpu"] = None
    if released is not None:
        rows = _between(events, ts, in_order, t0, released, "sched_migrate_task", pids, False)
        out["moved_before_released"] = int(len(rows))
    else:
        out["moved_before_released"] = None
    if warmup is not None:
        out |= {"wake_spread_ns": int(first_ts.max() - first_ts.min()) if len(woken) else None,
                "release_spread_ns": None if released is None else int(released) - int(t0),
                "first_wakeup_after_t0_ns": None}
    elif len(woken):
        lo, hi = int(first_ts.min()), int(first_ts.max())
        end = max(hi, released) if released is not None else hi
        out |= {"wake_spread_ns": hi - lo, "release_spread_ns": end - lo,
                "first_wakeup_after_t0_ns": lo - t0}
    else:
        out |= {"wake_spread_ns": None, "release_spread_ns": None, "first_wakeup_after_t0_ns": None}
    return out


#: the rows a search for the first wake-ups reads first; each next window is 4x the last (the
#: tasks released at t0 wake within a few events of it: one window, not the whole trace)
FIRST_WINDOW = 1 << 12
#: the longest window: a task that first wakes long after t0 (an import's, chosen by its comm)
#: is searched for in windows of at most this many rows, whose masks and row lists are the
#: search's memory (in windows growing to the whole trace: +18-29 MB at 5.1 M events, beside
#: the import's runs, where its memory peaks)
FIRST_WINDOW_MOST = 1 << 20


def _first_wakeups(events: pd.DataFrame, pids: np.ndarray, start: int,
                   bound: int | None) -> np.ndarray:
    """The row of each task's first sched_wakeup(_new) at or after ``start`` (the earliest, and the
    first row among equal times), in time order. ``bound``: the first row at or after ``start``
    when the events are in time order (then read from there in growing windows until every task
    is found), None when they are not (then all read)."""
    ts, pid = events["ts"].to_numpy(), events["pid"].to_numpy()
    if bound is None:
        wake = np.flatnonzero(event_mask(events, "sched_wakeup", "sched_wakeup_new")
                              & (ts >= start) & in_set(pid, pids))
        by_time = wake[np.argsort(ts[wake], kind="stable")]
        return np.sort(by_time[np.unique(pid[by_time], return_index=True)[1]])
    found: list[np.ndarray] = []
    seen = np.zeros(0, pid.dtype)
    want = len(np.unique(pids))
    for lo, hi in growing_windows(bound, len(ts), FIRST_WINDOW, FIRST_WINDOW_MOST):
        if len(seen) == want:
            break
        rows = lo + np.flatnonzero(event_mask(events.iloc[lo:hi], "sched_wakeup",
                                              "sched_wakeup_new")
                                   & in_set(pid[lo:hi], pids))
        rows = rows[~in_set(pid[rows], seen)]
        if len(rows):
            new, at = np.unique(pid[rows], return_index=True)
            found.append(rows[at])
            seen = np.union1d(seen, new)
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _between(events: pd.DataFrame, ts: np.ndarray, in_order: bool, lo: int, hi: int, name: str,
             pids: np.ndarray, before_hi: bool) -> np.ndarray:
    """Rows of event ``name`` of the tasks ``pids`` stamped in [lo, hi) (``before_hi``) or [lo, hi],
    read from those rows alone when the events are in time order."""
    a, b = ((int(np.searchsorted(ts, lo)), int(np.searchsorted(ts, hi, "left" if before_hi
                                                                   else "right")))
            if in_order else (0, len(ts)))
    t = ts[a:b]
    keep = (event_mask(events.iloc[a:b], name) & (t >= lo) & (t < hi if before_hi else t <= hi)
            & in_set(events["pid"].to_numpy()[a:b], pids))
    return a + np.flatnonzero(keep)
