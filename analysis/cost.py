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

import numpy as np
import pandas as pd

from harmony.analysis import tables
from harmony.analysis import thresholds as T
from harmony.analysis.arrays import event_mask, in_set, sorted_unique
from harmony.analysis.causes import CAUSES, cause_counts
from harmony.analysis.metrics import jain_index
from harmony.analysis.reconstruct import NS, class_fair_shares
from harmony.analysis.taskstate import task_records

#: the longest wasted episodes the summary names
LONGEST = 3


def _idle_steps(events: pd.DataFrame, cpu: int) -> tuple[np.ndarray, np.ndarray]:
    """(ts, idle) steps of ``cpu``: idle from a switch to the idle task until the switch out of it.

    A probe blind in the idle task's context (perf on some kernels) misses that switch out: the
    next event the CPU records then shows another task current (a switch away from it, an event
    in its context) while the CPU is believed idle. The idle interval is then cut at the last
    event recorded in the idle context since it began (or at its start: nothing claimed), since
    when the CPU was running is unknown. Before the CPU's first switch its state is unknown,
    counted not idle."""
    rows = np.flatnonzero(events["cpu"].to_numpy() == cpu)
    if not len(rows):               # nothing recorded there (no task ever ran on it): unknown
        return np.array([np.iinfo(np.int64).min]), np.array([False])
    sw = event_mask(events, "sched_switch")[rows]
    cpid = events["common_pid"].to_numpy()[rows]
    ts = events["ts"].to_numpy()[rows]
    to_idle = sw & (events["pid"].to_numpy()[rows] == 0)
    busy_before = (sw & (events["prev_pid"].to_numpy()[rows] != 0)) | (~sw & (cpid > 0))
    sets = sw | (~sw & (cpid > 0))                  # rows that set the state after them
    n = len(rows)
    idx = np.arange(n)
    last_set = np.maximum.accumulate(np.where(sets, idx, -1)) if n else idx
    prev_set = np.r_[-1, last_set[:-1]]
    idle_before = (prev_set >= 0) & to_idle[np.maximum(prev_set, 0)]
    seen_idle = to_idle | (~sw & (cpid == 0))       # evidence the idle task was current
    last_seen = np.r_[-1, np.maximum.accumulate(np.where(seen_idle, idx, -1))[:-1]] if n else idx
    cut = np.flatnonzero(idle_before & busy_before)
    k = np.flatnonzero(sets)
    order = np.r_[k.astype(np.float64), last_seen[cut] + 0.5]
    step_ts = np.r_[ts[k], ts[np.maximum(last_seen[cut], 0)]]
    step_v = np.r_[to_idle[k], np.zeros(len(cut), bool)]
    o = np.lexsort((order, step_ts))
    return np.r_[np.iinfo(np.int64).min, step_ts[o]], np.r_[False, step_v[o]]


def _waiting_steps(events: pd.DataFrame, tasks: pd.DataFrame, cpus) -> dict[int, tuple]:
    """Per CPU of ``cpus``: (ts, count) steps of the experiment tasks waiting there (runnable, not
    running) that are free to move (not pinned)."""
    pids = tasks["pid"].to_numpy().astype(np.int32)
    free = pids[~tasks["pinned"].to_numpy().astype(bool)] if "pinned" in tasks.columns else pids
    r = task_records(events, pids)
    pid = r["pid"].to_numpy()
    ts = r["ts"].to_numpy()
    waiting = r["runnable_after"].to_numpy() & ~r["running_after"].to_numpy() & in_set(pid, free)
    cpu = r["cpu_after"].to_numpy().astype(np.int64)
    nxt_same = np.r_[pid[1:] == pid[:-1], False]
    end = np.where(nxt_same, np.r_[ts[1:], 0], np.iinfo(np.int64).max)
    out = {}
    for c in cpus:
        k = np.flatnonzero(waiting & (cpu == c))
        t = np.r_[ts[k], end[k]]
        d = np.r_[np.ones(len(k), np.int64), -np.ones(len(k), np.int64)]
        o = np.lexsort((d, t))          # at one instant the ends (-1) first
        out[c] = (t[o], np.cumsum(d[o]))
    return out


def _at(steps: tuple, times: np.ndarray, before=0) -> np.ndarray:
    ts, v = steps
    if not len(ts):
        return np.full(len(times), before)
    i = np.searchsorted(ts, times, side="right") - 1
    return np.where(i >= 0, v[np.maximum(i, 0)], before)


def df_wasted(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int) -> pd.DataFrame:
    """Every interval in [t0, t_end] during which a CPU of ``cpus`` is idle while an experiment task
    free to run on it (not pinned) waits runnable on another CPU of the set.

    Columns: :data:`harmony.analysis.tables.WASTED`. attrs: ``wasted_cpu_s`` (float) = the CPU time
    those intervals could have given, integral over time of min(CPUs idle with a task waiting
    elsewhere, tasks waiting): two idle CPUs and one waiting task waste one CPU, not two.
    """
    cpus = [int(c) for c in cpus]
    idle = {c: _idle_steps(events, c) for c in cpus}
    wait = _waiting_steps(events, tasks, cpus)
    times = sorted_unique(np.concatenate(
        [np.array([t0, t_end], np.int64)] + [s[0][1:] for s in idle.values()]
        + [s[0] for s in wait.values()]))
    times = times[(times >= t0) & (times <= t_end)]
    if len(times) < 2:
        times = np.array([t0, t_end], np.int64)
    left, dur = times[:-1], np.diff(times)
    w = np.array([_at(wait[c], left) for c in cpus]).reshape(len(cpus), len(left))
    i = np.array([_at(idle[c], left, False) for c in cpus], bool).reshape(len(cpus), len(left))
    total = w.sum(axis=0)
    rows = []
    wasting = np.zeros((len(cpus), len(left)), bool)
    for k, c in enumerate(cpus):
        elsewhere = total - w[k]
        on = i[k] & (elsewhere > 0)
        wasting[k] = on
        edges = np.diff(np.r_[0, on.astype(np.int8), 0])
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            start, end = int(left[a]), int(left[b - 1] + dur[b - 1])
            rows.append((c, start, end, end - start, (start - t0) / NS,
                         int(elsewhere[a:b].max()), (end - start) / NS >= T.WASTED_EPISODE_MIN_S))
    rows.sort(key=lambda r: (r[1], r[0]))
    out = tables.WASTED.from_rows(rows)
    out.attrs["wasted_cpu_s"] = float((np.minimum(wasting.sum(axis=0), total) * dur).sum() / NS)
    return out


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
        duty = np.where(np.isfinite(cut_at) & (t_s >= cut_at), tasks["cut_duty"].to_numpy(np.float64),
                        duty)
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
    for w in np.unique(win):
        sel = np.flatnonzero(win == w)
        t = tasks.assign(duty=_demand_at(tasks, float(mid[sel[0]])) * 100.0)
        ideal[sel] = class_fair_shares(t, ncpus, rt_share)[pos[sel]]
    share = a["share"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = np.where(ideal > 0, ideal / share, np.nan)
    return tables.IDEAL.frame({
        "pid": a["pid"].to_numpy(), "name": a["name"], "role": a["role"], "window": win,
        "t": a["t"].to_numpy(), "window_s": a["window_s"].to_numpy(), "share": share, "ideal": ideal, "error": share - ideal,
        "slowdown": slowdown}, copy=False)


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


def cost_summary(events: pd.DataFrame, tasks: pd.DataFrame, migrations: pd.DataFrame,
                 allocation: pd.DataFrame, cpus, t0: int, t_end: int,
                 rt_share: float | None = None) -> dict:
    """The numbers of what the policy cost, for every experiment's summary
    (:data:`harmony.experiments.base.COST_SUMMARY` declares them)."""
    mig = migrations[(migrations["ts"] >= t0) & (migrations["ts"] <= t_end)]
    counts = cause_counts(mig)
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
            for r in wasted.sort_values("duration", ascending=False, kind="stable")
                           .head(LONGEST).itertuples()]},
        "useless_migrations": int(len(df_useless_migrations(migrations, t0, t_end))),
        "ideal_share_error": dist["mean_abs_error"],
        "ideal_jain": dist["jain"],
        "ideal_slowdown_max": None if slow is None or not np.isfinite(slow) else slow,
    }
