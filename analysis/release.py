"""Release spread: how nearly at once the controller made the experiment's tasks runnable at t0.

Needs: sched_wakeup (and sched_wakeup_new) events, the markers "harmony t0" and "harmony released"
(and "harmony warm-up" for a warm release); sched_switch and sched_migrate_task for the checks
that the layout held.

Two releases (:mod:`harmony.controller`): a *cold* one wakes each task at t0 on its initial CPU;
a *warm* one wakes them at the warm-up marker, still confined to their initial CPU, and at t0
widens the CPU set of tasks that are running (not woken). The checks are the same in substance
(every task let go, the layout as asked at t0, nothing moved before the last task was free), and
each is taken where it applies.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, in_set


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
    ours = in_set(pid, pids)
    start = t0 if warmup is None else warmup
    wake = np.flatnonzero(event_mask(events, "sched_wakeup", "sched_wakeup_new")
                          & (ts >= start) & ours)
    # each task's first wake-up after its release: the earliest, and the first row among equal times
    by_time = wake[np.argsort(ts[wake], kind="stable")]
    woken, at = np.unique(pid[by_time], return_index=True)
    firsts = by_time[at]
    first_ts = ts[firsts]
    not_woken = sorted(set(pids.tolist()) - set(woken.tolist()))
    ran = pid[event_mask(events, "sched_switch") & (ts < start) & ours]
    out = {"warm": warmup is not None, "woken": int(len(woken)), "not_woken": not_woken,
           "ran_before_t0": sorted(set(ran.tolist())),
           "warmed_s": None if warmup is None else (int(t0) - int(warmup)) / 1e9}
    if "initial_cpu" in tasks.columns and "target_cpu" in events.columns and len(wake):
        limit = released if warmup is None else t0
        if limit is not None:
            firsts = firsts[first_ts <= limit]
        home = dict(zip(tasks["pid"].tolist(), tasks["initial_cpu"].tolist()))
        target = events["target_cpu"].to_numpy()
        off = {int(p) for p, c in zip(pid[firsts], target[firsts]) if int(c) != int(home[int(p)])}
        if warmup is not None:
            moved = event_mask(events, "sched_migrate_task") & (ts >= warmup) & (ts < t0) & ours
            off |= set(pid[moved].tolist())
        out["woke_off_initial_cpu"] = sorted(int(p) for p in off)
    else:
        out["woke_off_initial_cpu"] = None
    if released is not None:
        moved = event_mask(events, "sched_migrate_task") & (ts >= t0) & (ts <= released)
        out["moved_before_released"] = int((moved & ours).sum())
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
