"""Metrics of mixed workloads (thesis chapter 7: E6 intrinsic imbalance, E7/E9/E10 heavy-light,
E11 priority classes), computed from the reconstructed tables of a run and of its static ideal.

Step functions are tables with ``ts`` (start, int64 ns on the trace clock) and ``end`` (int64 ns)
per segment; :func:`time_average` averages any of their columns over a window given in seconds
since t0. Windows (:func:`windows`): *short* = ``short_s`` after ``short_warmup_s`` (thesis: 1 s
after 1 s), *long* = from ``long_warmup_s`` to the end of the run (thesis: 30 s after 30 s).

Run-queue variance (definition used for SMAPE, thesis 7.2): at each instant V(t) = the population
variance (ddof = 0) over the P CPUs of q_i(t), the count of runnable experiment tasks on CPU i,
from the exact step function :func:`harmony.analysis.reconstruct.df_runqueue`; V of a window is
the time average of V(t) over it. SMAPE(Vd, Vs) = |Vd - Vs| / (|Vd| + |Vs|), 0 when both are 0.

Placement: the CPU a task belongs to (the kernel's task_cpu), whether it runs, waits or sleeps.
It is its ``initial_cpu`` until its first migration and ``dst_cpu`` of its latest migration after
that, so it needs only sched_migrate_task (through the migrations table).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import index_of, sorted_unique
from harmony.analysis.reconstruct import NS, runqueue_changes
from harmony.store import rows_frame

# ------------------------------------------------------------------------------------- windows


def windows(duration_s: float, long_warmup_s: float, short_warmup_s: float = 1.0,
            short_s: float = 1.0) -> dict[str, tuple[float, float]]:
    """The analysis windows in seconds since t0: ``{"short": (a, b), "long": (c, d)}``.

    A window that does not fit in [0, duration_s] is left out of the dict.
    """
    out = {}
    if short_s > 0 and short_warmup_s + short_s <= duration_s + 1e-9:
        out["short"] = (float(short_warmup_s), float(short_warmup_s + short_s))
    if long_warmup_s < duration_s:
        out["long"] = (float(long_warmup_s), float(duration_s))
    return out


def time_average(steps: pd.DataFrame, column: str, t0: int, t_from_s: float,
                 t_to_s: float) -> float | None:
    """Time-weighted mean of ``steps[column]`` over [t0 + t_from_s, t0 + t_to_s).

    Needs: a step-function table with ``ts`` and ``end`` (int64 ns). NaN values are skipped (their
    time does not count). None if the window is empty or not covered by the table.
    """
    a, b = int(t0) + int(round(t_from_s * NS)), int(t0) + int(round(t_to_s * NS))
    s = np.maximum(steps["ts"].to_numpy(np.int64), a)
    e = np.minimum(steps["end"].to_numpy(np.int64), b)
    v = steps[column].to_numpy(np.float64)
    w = np.where((e > s) & ~np.isnan(v), e - s, 0).astype(np.float64)
    if w.sum() <= 0:
        return None
    return float((np.nan_to_num(v) * w).sum() / w.sum())


def smape(a: float | None, b: float | None) -> float | None:
    """|a - b| / (|a| + |b|): 0 = perfect match, 1 = worst; 0 when both are 0, None if either is."""
    if a is None or b is None or np.isnan(a) or np.isnan(b):
        return None
    den = abs(a) + abs(b)
    return 0.0 if den == 0 else float(abs(a - b) / den)


# ---------------------------------------------------------------------------- run-queue variance


def df_runqueue_variance(runqueue: pd.DataFrame, cpus, t0: int, t_end: int) -> pd.DataFrame:
    """Variance across CPUs of the run-queue lengths, as an exact step function on [t0, t_end).

    Needs: a run-queue table (:func:`harmony.analysis.reconstruct.df_runqueue`; events
    sched_switch, sched_wakeup, sched_wakeup_new, sched_migrate_task, sched_process_exit).

    Columns: ts (int64 ns, segment start; the first is t0), end (int64 ns), t (float s since t0),
    mean (float: mean q_i over the P CPUs), variance (float: population variance, ddof = 0, of
    q_i over the P CPUs of ``cpus``). Consecutive segments differ in the queue vector.
    """
    times, q = runqueue_changes(runqueue, cpus, t0, t_end)
    end = np.append(times[1:], np.int64(t_end))
    return pd.DataFrame({"ts": times, "end": end, "t": (times - t0) / NS,
                         "mean": q.mean(axis=1), "variance": q.var(axis=1)})


def binned_average(steps: pd.DataFrame, column: str, t0: int, duration_s: float,
                   bin_s: float) -> pd.DataFrame:
    """:func:`time_average` of ``column`` in consecutive bins of ``bin_s`` over [0, duration_s).

    Columns: t (float s since t0, bin start), value (float; NaN where the bin is not covered).
    """
    starts = np.arange(0.0, duration_s, bin_s)
    vals = [time_average(steps, column, t0, a, min(a + bin_s, duration_s)) for a in starts]
    return pd.DataFrame({"t": starts, "value": [np.nan if v is None else v for v in vals]})


# ------------------------------------------------------------------------------------- placement


def df_placement(migrations: pd.DataFrame, tasks: pd.DataFrame, t0: int,
                 t_end: int) -> pd.DataFrame:
    """Which CPU each experiment task belongs to, as segments covering [t0, t_end).

    Needs: a migrations table (:func:`harmony.analysis.reconstruct.df_migrations`, from
    sched_migrate_task) and ``tasks`` (pid, name, role, initial_cpu). A task is on its
    ``initial_cpu`` until its first migration, then on the ``dst_cpu`` of its latest migration
    (migrations before t0 set the CPU at t0).

    Columns: pid (int32), name, role (str), cpu (int32), ts (int64 ns, segment start), end (int64
    ns), t (float s since t0 of ts). Sorted by (task order, ts).

    attrs: ``src_mismatches`` (int) = migrations whose src_cpu is not the CPU the task was believed
    on (a lost migration); the placement follows dst_cpu regardless.
    """
    rows, mismatches = [], 0
    m_ts = migrations["ts"].to_numpy(np.int64)
    keep = np.flatnonzero(m_ts < t_end)
    keep = keep[np.argsort(m_ts[keep], kind="stable")]
    by_pid: dict[int, list] = {}
    for p, ts, src, dst in zip(migrations["pid"].to_numpy()[keep].tolist(), m_ts[keep].tolist(),
                               migrations["src_cpu"].to_numpy()[keep].tolist(),
                               migrations["dst_cpu"].to_numpy()[keep].tolist()):
        by_pid.setdefault(int(p), []).append((ts, src, dst))
    for pid, name, role, initial in zip(tasks["pid"].tolist(), tasks["name"].tolist(),
                                        tasks["role"].tolist(), tasks["initial_cpu"].tolist()):
        cpu, start = int(initial), int(t0)
        for ts, src, dst in by_pid.get(int(pid), ()):
            mismatches += int(src) != cpu
            if ts > start:
                rows.append((pid, name, role, cpu, start, ts))
                start = ts
            cpu = int(dst)
        rows.append((pid, name, role, cpu, start, int(t_end)))
    out = rows_frame(rows, {"pid": np.int32, "name": str, "role": str, "cpu": np.int32,
                            "ts": np.int64, "end": np.int64})
    out["t"] = (out["ts"].to_numpy() - int(t0)) / NS
    out.attrs["src_mismatches"] = int(mismatches)
    return out


def df_class_counts(placement: pd.DataFrame, cpus, t0: int, t_end: int) -> pd.DataFrame:
    """How many tasks of each role are placed on each CPU, as a step function on [t0, t_end).

    Needs: a placement table (:func:`df_placement`).

    Columns (tidy, one row per segment x CPU x role): ts (int64 ns), end (int64 ns), t (float s
    since t0), cpu (int32), role (str), count (int64). Every (segment, cpu, role) has a row, zero
    included. Tasks placed outside ``cpus`` are not counted; attrs ``outside_s`` (float) is the
    task-seconds spent there.
    """
    cpus = np.asarray(sorted(set(int(c) for c in cpus)), dtype=np.int32)
    roles = np.asarray(sorted(placement["role"].unique()), dtype=object)
    s = placement["ts"].to_numpy(np.int64)
    e = placement["end"].to_numpy(np.int64)
    times = sorted_unique(np.concatenate([[np.int64(t0)], s[(s > t0) & (s < t_end)]]))
    ends = np.append(times[1:], np.int64(t_end))
    k_n, p_n, r_n = len(times), len(cpus), len(roles)
    ci = np.searchsorted(cpus, placement["cpu"].to_numpy())
    inside = (ci < p_n) & (cpus[np.minimum(ci, p_n - 1)] == placement["cpu"].to_numpy())
    ri = np.searchsorted(roles, placement["role"].to_numpy())
    a = np.searchsorted(times, np.maximum(s, t0), side="right") - 1
    b = np.searchsorted(times, np.minimum(e, t_end), side="left")
    live = inside & (b > a)
    diff = np.zeros((k_n + 1, p_n, r_n), dtype=np.int64)
    np.add.at(diff, (a[live], ci[live], ri[live]), 1)
    np.add.at(diff, (b[live], ci[live], ri[live]), -1)
    counts = np.cumsum(diff, axis=0)[:k_n]
    kk, pp, rr = np.meshgrid(np.arange(k_n), np.arange(p_n), np.arange(r_n), indexing="ij")
    out = pd.DataFrame({
        "ts": times[kk.ravel()], "end": ends[kk.ravel()], "t": (times[kk.ravel()] - t0) / NS,
        "cpu": cpus[pp.ravel()], "role": roles[rr.ravel()],
        "count": counts.ravel(),
    })
    out_ns = np.clip(np.minimum(e, t_end) - np.maximum(s, t0), 0, None)[~inside].sum()
    out.attrs["outside_s"] = float(out_ns / NS)
    return out


def _wide(counts: pd.DataFrame, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, end, matrix segments x CPUs) of one role's counts."""
    # pivot_table(index=["ts", "end"], columns="cpu", values="count", aggfunc="sum") by numpy:
    # segments sorted by (ts, end), CPUs sorted, NaN where a segment has no row for a CPU
    sel = (counts["role"] == role).to_numpy()
    ts, end, cpu = (counts[c].to_numpy()[sel].astype(np.int64) for c in ("ts", "end", "cpu"))
    segs, seg = np.unique(np.stack([ts, end]), axis=1, return_inverse=True)
    cols, col = np.unique(cpu, return_inverse=True)
    seg, col = seg.ravel(), col.ravel()
    m = np.zeros((segs.shape[1], len(cols)), np.float64)
    np.add.at(m, (seg, col), counts["count"].to_numpy()[sel].astype(np.float64))
    seen = np.zeros(m.shape, bool)
    seen[seg, col] = True
    m[~seen] = np.nan
    return segs[0], segs[1], m


def df_pair_timeline(counts: pd.DataFrame, first: str = "heavy",
                     second: str = "light") -> pd.DataFrame:
    """Fraction of CPUs holding exactly one ``first`` and one ``second`` task, as a step function.

    Needs: a class-count table (:func:`df_class_counts`) with both roles.

    Columns: ts, end (int64 ns), t (float s since the first ts), fraction (float 0..1: CPUs with
    exactly one of each / P), cpus_one_each (int64).
    """
    ts, end, a = _wide(counts, first)
    ts2, _, b = _wide(counts, second)
    if not np.array_equal(ts, ts2):
        raise ValueError("class counts of the two roles do not share segments")
    ok = ((a == 1) & (b == 1)).sum(axis=1)
    return pd.DataFrame({"ts": ts, "end": end, "t": (ts - ts[0]) / NS if len(ts) else [],
                         "fraction": ok / a.shape[1], "cpus_one_each": ok.astype(np.int64)})


def spread_index(counts) -> np.ndarray:
    """How unevenly k tasks sit on P CPUs: 0 = evenly spread, 1 = all on one CPU.

    ``counts``: array (..., P) of tasks per CPU. Index = sum_i |c_i - k/P| / (2 k (P - 1) / P), the
    total-variation distance of the placement from the uniform one divided by its maximum. When P
    does not divide k the minimum is above 0. NaN when k = 0 or P = 1.
    """
    c = np.asarray(counts, dtype=np.float64)
    p = c.shape[-1]
    k = c.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        dev = np.abs(c - k[..., None] / p).sum(axis=-1)
        out = dev / (2 * k * (p - 1) / p)
    return np.where((k > 0) & (p > 1), out, np.nan)


def df_spread(counts: pd.DataFrame) -> pd.DataFrame:
    """:func:`spread_index` of each role over time, from a class-count table
    (:func:`df_class_counts`).

    Columns: ts, end (int64 ns), role (str), ntasks (int64 placed on the CPU set), index (float).
    """
    parts = []
    for role in sorted(counts["role"].unique()):
        ts, end, m = _wide(counts, role)
        parts.append(pd.DataFrame({"ts": ts, "end": end, "role": role,
                                   "ntasks": m.sum(axis=1).astype(np.int64),
                                   "index": spread_index(m)}))
    return pd.concat(parts, ignore_index=True)


# ------------------------------------------------------------------------------------ allocation


def df_window_allocation(runs: pd.DataFrame, tasks: pd.DataFrame, t0: int,
                         wins: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """CPU time of each role in each window.

    Needs: a runs table (:func:`harmony.analysis.reconstruct.df_runs`, from sched_switch) and
    ``tasks`` (pid, role). Run intervals are clipped to each window.

    Columns (one row per window x role): window (str), t_from, t_to (float s since t0), role (str),
    ntasks (int64), cpu_time (float s, all tasks of the role), share (float: cpu_time / ntasks /
    window length, the mean fraction of one CPU per task).
    """
    n_of = tasks["role"].astype(str).value_counts()
    role = _roles(runs["pid"].to_numpy(), tasks)
    rows = []
    for wname, (a_s, b_s) in wins.items():
        a, b = int(t0) + int(round(a_s * NS)), int(t0) + int(round(b_s * NS))
        d = np.clip(np.minimum(runs["end"].to_numpy(np.int64), b)
                    - np.maximum(runs["start"].to_numpy(np.int64), a), 0, None)
        for r in sorted(n_of.index):
            cpu_s = float(d[role == r].sum()) / NS
            n = int(n_of[r])
            rows.append((wname, a_s, b_s, r, n, cpu_s, cpu_s / n / (b_s - a_s)))
    return pd.DataFrame(rows, columns=["window", "t_from", "t_to", "role", "ntasks", "cpu_time",
                                       "share"])


def _roles(pids: np.ndarray, tasks: pd.DataFrame) -> np.ndarray:
    """The role (str) of each pid in ``tasks``; "" for a pid that is not one of them."""
    roles = np.asarray([str(r) for r in tasks["role"].tolist()] + [""], dtype=object)
    return roles[index_of(pids, tasks["pid"].to_numpy())]      # -1: the "" after the roles


def allocation_ratio(dynamic: pd.DataFrame, static: pd.DataFrame, role: str,
                     window: str) -> float | None:
    """Share of ``role`` in ``window`` of the dynamic run / the same in the static ideal.

    Needs: two :func:`df_window_allocation` tables. None if either lacks that row or the static
    share is 0. Below 1: the role got less CPU than in the ideal placement (slowdown).
    """
    def get(df):
        hit = np.flatnonzero((df["role"].to_numpy() == role) & (df["window"].to_numpy() == window))
        return float(df["share"].to_numpy()[hit[0]]) if len(hit) else None
    d, s = get(dynamic), get(static)
    return None if d is None or s is None or s == 0 else d / s


def df_migration_rate(migrations: pd.DataFrame, runs: pd.DataFrame, tasks: pd.DataFrame,
                      t0: int, t_end: int) -> pd.DataFrame:
    """Migrations normalised by CPU time, per role and over all tasks (thesis 7.3, fig 7.13).

    Needs: migrations (:func:`~harmony.analysis.reconstruct.df_migrations`) and runs
    (:func:`~harmony.analysis.reconstruct.df_runs`) tables; only [t0, t_end] counts.

    Columns: role (str; "all" for every task), ntasks (int64), migrations (int64), cpu_s (float:
    CPU seconds the tasks ran), per_cpu_s (float: migrations / cpu_s; NaN if they never ran),
    per_s (float: migrations / wall seconds).
    """
    m = migrations[(migrations["ts"] >= t0) & (migrations["ts"] <= t_end)]
    d = np.clip(np.minimum(runs["end"].to_numpy(np.int64), t_end)
                - np.maximum(runs["start"].to_numpy(np.int64), t0), 0, None)
    role_of = dict(zip(tasks["pid"].astype(int), tasks["role"].astype(str)))
    run_role = _roles(runs["pid"].to_numpy(), tasks)
    mig_role = _roles(m["pid"].to_numpy(), tasks)
    wall = (int(t_end) - int(t0)) / NS
    rows = []
    for r in sorted(set(role_of.values())) + ["all"]:
        sel_r = np.ones(len(run_role), bool) if r == "all" else run_role == r
        sel_m = np.ones(len(mig_role), bool) if r == "all" else mig_role == r
        cpu_s = float(d[sel_r].sum()) / NS
        n = int(sel_m.sum())
        ntasks = len(role_of) if r == "all" else sum(v == r for v in role_of.values())
        rows.append((r, ntasks, n, cpu_s, n / cpu_s if cpu_s > 0 else np.nan,
                     n / wall if wall > 0 else np.nan))
    return pd.DataFrame(rows, columns=["role", "ntasks", "migrations", "cpu_s", "per_cpu_s",
                                       "per_s"])


# -------------------------------------------------------------------------------------- sweeps


def df_sweep(runs) -> pd.DataFrame:
    """One row per run of a parameter sweep (e.g. light_duty 5..100 or nice_diff 2..19).

    Needs: complete runs (:class:`harmony.store.Run`, e.g. from ``harmony.load``) whose
    summary.json holds scalar metrics. Columns: path (str), experiment (str), seed (int), one
    column ``param_<name>`` per scalar parameter, and one column per scalar summary key.
    """
    rows = []
    for run in runs:
        m = run.manifest
        row = {"path": str(run.path), "experiment": m.get("experiment"), "seed": m.get("seed")}
        row |= {f"param_{k}": v for k, v in m.get("params", {}).items() if not isinstance(v, list)}
        row |= {k: v for k, v in run.summary.items()
                if v is None or isinstance(v, (int, float, bool, str))}
        rows.append(row)
    return pd.DataFrame(rows)
