"""Foreign load: CPU time that tasks outside the experiment took on the experiment's CPUs.

An experiment assumes its tasks have the CPU set to themselves. Other processes (daemons, the
controller's own threads, another job) change what a fair balance is, so a run measures and
reports how much of the CPU set they used, rather than assuming a quiet host.

Needs events: sched_switch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.reconstruct import NS


def df_foreign_load(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                    t_end: int, controller_tids=()) -> pd.DataFrame:
    """CPU time per CPU of ``cpus`` in [t0, t_end], split into experiment, controller, foreign, idle.

    A CPU's time between two of its sched_switch events belongs to the switch's ``next`` task:
    the idle task (pid 0), an experiment task (pid in ``tasks``), one of the run's own controller
    threads (``controller_tids``: probe drains, sampler) or anything else (foreign). Time before the
    CPU's first switch in the window goes to the ``prev`` task of that switch.

    Columns: cpu (int32), window_s (float), experiment_s, controller_s, foreign_s, idle_s (float s),
    foreign_frac (foreign_s / window_s), top_foreign (str: the foreign comm that ran longest, or
    ""). One row per CPU of ``cpus``; a CPU without any switch in the window has all-NaN time
    columns (nothing was seen, so nothing is claimed).
    """
    t0, t_end = int(t0), int(t_end)
    pids = tasks["pid"].to_numpy()
    sw = events[events["event"] == "sched_switch"]
    rows = []
    for cpu in sorted(set(int(c) for c in cpus)):
        s = sw[sw["cpu"] == cpu]
        ts = s["ts"].to_numpy(dtype=np.int64)
        if not len(ts):
            rows.append((cpu, (t_end - t0) / NS, np.nan, np.nan, np.nan, np.nan, np.nan, ""))
            continue
        nxt = s["pid"].to_numpy()
        comm = s["comm"].astype(str).to_numpy()
        # owner of each segment [bounds[k], bounds[k+1]): the task switched in at bounds[k]
        starts = np.concatenate([[np.int64(-2**62)], ts])
        ends = np.concatenate([ts, [np.int64(2**62)]])
        owner = np.concatenate([[s["prev_pid"].iloc[0]], nxt])
        owner_comm = np.concatenate([[str(s["prev_comm"].iloc[0])], comm])
        lo = np.clip(starts, t0, t_end)
        hi = np.clip(ends, t0, t_end)
        dur = (hi - lo).astype(np.float64) / NS
        is_idle = owner == 0
        is_exp = np.isin(owner, pids)
        is_own = np.isin(owner, np.asarray(list(controller_tids), dtype=np.int64))
        is_foreign = ~is_idle & ~is_exp & ~is_own
        foreign_by_comm = pd.Series(dur[is_foreign]).groupby(owner_comm[is_foreign]).sum()
        top = str(foreign_by_comm.idxmax()) if len(foreign_by_comm) and foreign_by_comm.max() > 0 else ""
        window = (t_end - t0) / NS
        rows.append((cpu, window, float(dur[is_exp].sum()), float(dur[is_own].sum()),
                     float(dur[is_foreign].sum()),
                     float(dur[is_idle].sum()), float(dur[is_foreign].sum()) / window if window > 0
                     else np.nan, top))
    out = pd.DataFrame(rows, columns=["cpu", "window_s", "experiment_s", "controller_s", "foreign_s", "idle_s",
                                      "foreign_frac", "top_foreign"])
    return out.astype({"cpu": "int32"})
