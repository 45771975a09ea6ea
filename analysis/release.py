"""Release spread: how nearly at once the controller made the experiment's tasks runnable at t0.

Needs: sched_wakeup (and sched_wakeup_new) events, the markers "harmony t0" and "harmony released";
sched_switch and sched_migrate_task for the checks that the layout held.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, in_set


def release_spread(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, released: int | None) -> dict:
    """Measure the release from the trace.

    Returns a dict:
      woken            tasks that became runnable at or after t0 (should be all of them)
      not_woken        pids of tasks never seen waking after t0
      wake_spread_ns   first to last task's first wake-up after t0
      release_spread_ns  first wake-up to the moment the last task was also free to move (the
                       "released" marker, written after the last task was freed to the CPU set:
                       the last cpuset write, or the last sched_setaffinity on the fallback): the
                       release window as the scheduler saw it; an upper bound
      first_wakeup_after_t0_ns  delay from the t0 marker to the first wake-up
      ran_before_t0    pids switched in before t0 in the trace (should be none: held at the gate)
      moved_before_released  migrations of tasks between t0 and the "released" marker: the
                       scheduler acting on tasks freed early in the window (None without marker)
      woke_off_initial_cpu  pids whose first wake-up after t0, recorded by the "released" marker,
                       put them on a CPU other than their ``initial_cpu`` (should be none: the
                       layout exists at t0). A task whose wake-up the trace lacks there (a probe
                       blind to an idle CPU's context misses remote wake-ups) is not judged. None
                       when ``tasks`` has no initial_cpu or the events no target_cpu
    """
    pids = tasks["pid"].to_numpy()
    ts = events["ts"].to_numpy()
    pid = events["pid"].to_numpy()
    ours = in_set(pid, pids)
    wake = np.flatnonzero(event_mask(events, "sched_wakeup", "sched_wakeup_new")
                          & (ts >= t0) & ours)
    # each task's first wake-up after t0: the earliest, and the first row among equal times
    by_time = wake[np.argsort(ts[wake], kind="stable")]
    woken, at = np.unique(pid[by_time], return_index=True)
    firsts = by_time[at]
    first_ts = ts[firsts]
    not_woken = sorted(set(pids.tolist()) - set(woken.tolist()))
    ran = pid[event_mask(events, "sched_switch") & (ts < t0) & ours]
    out = {"woken": int(len(woken)), "not_woken": not_woken,
           "ran_before_t0": sorted(set(ran.tolist()))}
    if "initial_cpu" in tasks.columns and "target_cpu" in events.columns and len(wake):
        if released is not None:
            firsts = firsts[first_ts <= released]
        home = dict(zip(tasks["pid"].tolist(), tasks["initial_cpu"].tolist()))
        target = events["target_cpu"].to_numpy()
        out["woke_off_initial_cpu"] = sorted(int(p) for p, c in zip(pid[firsts], target[firsts])
                                             if int(c) != int(home[int(p)]))
    else:
        out["woke_off_initial_cpu"] = None
    if released is not None:
        moved = event_mask(events, "sched_migrate_task") & (ts >= t0) & (ts <= released)
        out["moved_before_released"] = int((moved & ours).sum())
    else:
        out["moved_before_released"] = None
    if len(woken):
        lo, hi = int(first_ts.min()), int(first_ts.max())
        end = max(hi, released) if released is not None else hi
        out |= {"wake_spread_ns": hi - lo, "release_spread_ns": end - lo,
                "first_wakeup_after_t0_ns": lo - t0}
    else:
        out |= {"wake_spread_ns": None, "release_spread_ns": None, "first_wakeup_after_t0_ns": None}
    return out
