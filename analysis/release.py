"""Release spread: how nearly at once the controller made the experiment's tasks runnable at t0.

Needs: sched_wakeup (and sched_wakeup_new) events, the markers "harmony t0" and "harmony released".
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def release_spread(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, released: int | None) -> dict:
    """Measure the release from the trace.

    Returns a dict:
      woken            tasks that became runnable at or after t0 (should be all of them)
      not_woken        pids of tasks never seen waking after t0
      wake_spread_ns   first to last task's first wake-up after t0
      release_spread_ns  first wake-up to the moment the last task was also free to move (the
                       "released" marker, written after the last affinity change): the release
                       window as the scheduler saw it; an upper bound
      first_wakeup_after_t0_ns  delay from the t0 marker to the first wake-up
    """
    pids = tasks["pid"].to_numpy()
    wake = events[events["event"].isin(["sched_wakeup", "sched_wakeup_new"])
                  & (events["ts"] >= t0) & events["pid"].isin(pids)]
    first = wake.groupby("pid", observed=True)["ts"].min()
    not_woken = sorted(set(pids.tolist()) - set(first.index.tolist()))
    out = {"woken": int(len(first)), "not_woken": not_woken}
    if len(first):
        lo, hi = int(first.min()), int(first.max())
        end = max(hi, released) if released is not None else hi
        out |= {"wake_spread_ns": hi - lo, "release_spread_ns": end - lo,
                "first_wakeup_after_t0_ns": lo - t0}
    else:
        out |= {"wake_spread_ns": None, "release_spread_ns": None, "first_wakeup_after_t0_ns": None}
    return out
