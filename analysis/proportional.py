"""Proportional speedup and proportional concurrency (the thesis, 9.2).

The two properties its authors first expected of every multiprocessor scheduler, and found that
neither O(1) nor CFS had:

(a) *proportional speedup*: the allocation a task receives with P CPUs is P times the allocation
    it receives with one CPU - within feasibility: a task takes at most one CPU, so the ideal is
    the GPS allocation's ratio, ``ideal_p / ideal_1`` (CPU Futures eq. 4.20-4.22, weights made
    feasible by the demands: :func:`harmony.analysis.reconstruct.class_fair_shares`), min(n, P)
    for n equal CPU-bound tasks;
(b) *proportional concurrency*: the allocation a task receives with n tasks on P CPUs is the one
    it receives on one CPU with n/P of them, again against the GPS ratio ``ideal_p / ideal_c``
    (1 when the n/P tasks carry the same mix of weights).

Needs: the ``shares`` table (:func:`harmony.analysis.reconstruct.df_task_share`: each task's CPU
time over the measured window) and the tasks table of up to three runs of the same tasks, matched
by name: on the P CPUs; all of them on one CPU; the first n/P of them on one CPU. A run that is
missing leaves its columns NaN and its numbers None.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis import tables
from harmony.analysis.reconstruct import class_fair_shares


def _by_name(shares: pd.DataFrame | None, tasks: pd.DataFrame | None, ncpus: int,
             names) -> tuple[np.ndarray, np.ndarray]:
    """(share, ideal on ``ncpus`` CPUs) of each of ``names`` in one run; NaN for a name the run
    does not hold, or without the run."""
    nan = np.full(len(names), np.nan)
    if shares is None or tasks is None:
        return nan, nan.copy()
    ideal = pd.Series(class_fair_shares(tasks, ncpus), index=tasks["name"].astype(str).to_numpy())
    share = pd.Series(shares["share"].to_numpy(np.float64),
                      index=shares["name"].astype(str).to_numpy())
    return (share.reindex(names).to_numpy(np.float64), ideal.reindex(names).to_numpy(np.float64))


def df_proportional(shares_p: pd.DataFrame, tasks_p: pd.DataFrame, ncpus: int,
                    one: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                    share: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Each task of the run on ``ncpus`` CPUs (``shares_p``, ``tasks_p``) against the same task
    with all the tasks on one CPU (``one`` = its (shares, tasks)) and on one CPU with n/P of the
    tasks (``share``).

    Columns: :data:`harmony.analysis.tables.PROPORTIONAL`.
    """
    names = tasks_p["name"].astype(str).to_numpy()
    s_p, i_p = _by_name(shares_p, tasks_p, ncpus, names)
    s_1, i_1 = _by_name(*(one or (None, None)), 1, names)
    s_c, i_c = _by_name(*(share or (None, None)), 1, names)
    with np.errstate(divide="ignore", invalid="ignore"):
        speedup, ideal_speedup = s_p / s_1, i_p / i_1
        conc = (s_p / s_c) / (i_p / i_c)
        return tables.PROPORTIONAL.frame({
            "name": pd.Categorical(names), "nice": tasks_p["nice"].to_numpy(np.int64),
            "share_p": s_p, "ideal_p": i_p, "share_1": s_1, "ideal_1": i_1,
            "speedup": speedup, "ideal_speedup": ideal_speedup,
            "speedup_ratio": speedup / ideal_speedup,
            "share_c": s_c, "ideal_c": i_c, "concurrency_ratio": conc})


def _finite(v) -> float | None:
    return float(v) if v is not None and np.isfinite(v) else None


def proportional_numbers(df: pd.DataFrame) -> dict:
    """The run's numbers from a :func:`df_proportional` table (None where a run was missing or
    gave the tasks nothing at all; a task given nothing in a baseline alone has an infinite ratio,
    never the worst):

    speedup (the tasks' total share on P CPUs over their total on one), ideal_speedup (the same of
    the GPS shares), speedup_ratio (their ratio: 1 is proportional), speedup_ratio_min (the worst
    task's own ratio: (a) is a property of every task), concurrency_ratio (the tasks' total share on
    P CPUs over their total with n/P tasks on one CPU, over the same of the GPS shares, both over
    the tasks the latter run holds) and concurrency_ratio_min (the worst of those tasks)."""
    s_1 = df["share_1"].to_numpy()
    out = dict.fromkeys(("speedup", "ideal_speedup", "speedup_ratio", "speedup_ratio_min",
                         "concurrency_ratio", "concurrency_ratio_min"))
    if np.isfinite(s_1).all() and s_1.sum() > 0:
        out["speedup"] = _finite(df["share_p"].sum() / s_1.sum())
        out["ideal_speedup"] = _finite(df["ideal_p"].sum() / df["ideal_1"].sum())
        if out["speedup"] is not None and out["ideal_speedup"]:
            out["speedup_ratio"] = out["speedup"] / out["ideal_speedup"]
        out["speedup_ratio_min"] = _finite(df["speedup_ratio"].min(skipna=False))
    c = df[np.isfinite(df["share_c"].to_numpy())]
    if len(c) and c["share_c"].sum() > 0:
        ratio = ((c["share_p"].sum() / c["share_c"].sum())
                 / (c["ideal_p"].sum() / c["ideal_c"].sum()))
        out["concurrency_ratio"] = _finite(ratio)
        out["concurrency_ratio_min"] = _finite(c["concurrency_ratio"].min(skipna=False))
    return out


def df_ideal_curve(tasks: pd.DataFrame, max_cpus: int) -> pd.DataFrame:
    """The GPS allocation of ``tasks`` on 1..``max_cpus`` CPUs, for the figure's ideal lines.

    Columns: cpus (int64), share_mean (float: the tasks' mean GPS share), speedup (float: their
    total GPS share over the total on one CPU)."""
    ks = np.arange(1, max(1, int(max_cpus)) + 1)
    total = np.array([class_fair_shares(tasks, int(k)).sum() for k in ks])
    return pd.DataFrame({"cpus": ks.astype(np.int64), "share_mean": total / max(1, len(tasks)),
                         "speedup": total / total[0] if total[0] > 0 else np.nan})
