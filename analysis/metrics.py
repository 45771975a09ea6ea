"""Single-source (E1) metrics over reconstructed tables (see :mod:`harmony.analysis.reconstruct`).

Definitions follow /work/shared/EXPERIMENTS.md, "Metric definitions". Functions return plain dicts
or tidy DataFrames; times are int64 ns on the trace clock (``ts_*``) and float seconds since t0
(``t_*``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.reconstruct import NS, balance_deviations, runqueue_changes
from harmony.analysis.thresholds import FAST_BALANCE_MAX_S


def migrations_over_time(migrations: pd.DataFrame, bin_s: float, t_start: float = 0.0,
                         t_stop: float | None = None) -> pd.DataFrame:
    """Migrations of experiment tasks counted in consecutive bins of ``bin_s`` seconds.

    Needs: a migrations table (:func:`~harmony.analysis.reconstruct.df_migrations`), using its
    ``t`` and ``kind``. Bins are [t_start + k*bin_s, t_start + (k+1)*bin_s) covering
    [t_start, t_stop); ``t_stop`` defaults to just past the last migration (pass the window end,
    (t_end - t0) / 1e9, to get trailing zero bins). Migrations outside [t_start, t_stop) - e.g. the
    set-up moves before the release with the default t_start = 0 - are not counted. Times and
    edges are compared in whole ns (``t`` comes from int64 ns), so a migration exactly on an edge
    counts in the bin that edge starts (float division would put t = 0.3 in [0.2, 0.3)).

    Columns: t (float s since t0, bin start), all, balance, wakeup (int64 counts), per_s (float:
    all / bin_s).
    """
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    t = np.rint(migrations["t"].to_numpy(dtype=np.float64) * NS).astype(np.int64)
    kind = migrations["kind"].astype(str).to_numpy()
    start, width = round(t_start * NS), max(1, round(bin_s * NS))
    if t_stop is None:
        after = t[t >= start]
        nb = int((after.max() - start) // width) + 1 if len(after) else 1
        stop = start + nb * width
    else:
        stop = round(t_stop * NS)
        nb = max(1, -(-(stop - start) // width))
    inside = (t >= start) & (t < stop)
    k = (t[inside] - start) // width
    kd = kind[inside]
    counts = {c: np.bincount(k[kd == c], minlength=nb)[:nb].astype(np.int64)
              for c in ("balance", "wakeup")}
    allc = np.bincount(k, minlength=nb)[:nb].astype(np.int64)
    return pd.DataFrame({"t": t_start + np.arange(nb) * bin_s, "all": allc,
                         "balance": counts["balance"], "wakeup": counts["wakeup"],
                         "per_s": allc / bin_s})


def balance_timeline(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                     tolerance: float = 0.15, n: int | None = None) -> pd.DataFrame:
    """Whether the run queues are balanced within ``tolerance``, as a step function on [t0, t_end).

    Needs: a run-queue table (:func:`~harmony.analysis.reconstruct.df_runqueue`). Balanced means
    max_i |q_i - N/P| <= tolerance * N/P over the CPUs i of ``cpus`` (P = len(cpus)), N =
    ``n`` or len(tasks).

    Columns: ts (int64 ns, start of the segment; the first is t0), t (float s since t0),
    end (int64 ns), max_dev (float: max_i |q_i - N/P|), balanced (bool). Consecutive segments
    always differ in the queue vector (not necessarily in ``balanced``).
    """
    times, end, dev, ok = _balance_steps(rq, tasks, cpus, t0, t_end, tolerance, n)
    return pd.DataFrame({"ts": times, "t": (times - t0) / NS, "end": end, "max_dev": dev,
                         "balanced": ok})


def _balance_steps(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                   tolerance: float, n: int | None, merged: bool = False):
    """:func:`balance_timeline`'s columns ts, end, max_dev and balanced, as arrays. ``merged``:
    consecutive steps of equal ``balanced`` merged into one (a stretch), no max_dev (None): all
    :func:`time_to_balance` and :func:`settled_balance` read, in a few rows, not one a change of
    the run queues (at 4.09 M events of a ping-pong, ~50 MB of steps and their temporaries at an
    import's peak)."""
    cpus = sorted(set(int(c) for c in cpus))
    n_tasks = len(tasks) if n is None else int(n)
    target = n_tasks / len(cpus)
    steps = balance_deviations(rq, cpus, t0, t_end, target)
    if steps is not None:
        times, dev = steps
    else:
        times, q = runqueue_changes(rq, cpus, t0, t_end)
        # the largest |q_j - target| is that of the longest or the shortest queue: no float copy
        # of q, nor of any of its columns (the same floats: a difference rounds monotonically)
        dev = np.subtract(q.max(axis=1), target, dtype=np.float64)
        np.maximum(dev, np.subtract(target, q.min(axis=1), dtype=np.float64), out=dev)
        del q
    ok = dev <= tolerance * target + 1e-9
    if merged:
        del dev
        st = np.flatnonzero(np.r_[True, ok[1:] != ok[:-1]])
        return times[st], np.append(times[st[1:]], np.int64(t_end)), None, ok[st]
    end = np.append(times[1:], np.int64(t_end))
    return times, end, dev, ok


def _stretches(ts: np.ndarray, end: np.ndarray, ok: np.ndarray):
    """Consecutive steps of equal ``ok`` merged into stretches: (each stretch's first step, its
    start, its end)."""
    brk = np.ones(len(ok), dtype=bool)
    brk[1:] = ok[1:] != ok[:-1]
    st = np.flatnonzero(brk)
    return st, ts[st], np.append(ts[st[1:]], end[-1])


def time_to_balance(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                    tolerance: float = 0.15, n: int | None = None,
                    min_excursion_ns: int = 0, steps=None) -> dict:
    """E3 time to resolve: when the run queues become balanced within ``tolerance`` and stay so.

    Needs: a run-queue table (:func:`~harmony.analysis.reconstruct.df_runqueue`); N = ``n`` or
    len(tasks), P = len(cpus); see :func:`balance_timeline`.

    The definition is "within 15% of N/P, *and stays there*": ``ts_balance`` is the start of the
    balanced stretch that lasts until ``t_end`` (None if the queues are not balanced just before
    ``t_end``). Flicker - balanced, then unbalanced, then balanced again - therefore moves
    ``ts_balance`` to the last re-entry; ``ts_first`` is the first entry. Unbalanced excursions
    shorter than ``min_excursion_ns`` between two balanced stretches are ignored (default 0: every
    excursion counts, the strict definition). ``steps``: the balance steps when the caller has
    them (:func:`balance_times`).

    Returns a dict: ts_balance, t_balance (s since t0), ts_first, t_first (ns / s, or None),
    balanced_at_end (bool), n_entries (int: times the queues entered balance, after merging short
    excursions; being balanced at t0 counts as one), balanced_s (float: total time balanced in
    [t0, t_end)), target (N/P), tolerance, n_tasks, ncpus.
    """
    ts, end, _, ok = (steps if steps is not None
                      else _balance_steps(rq, tasks, cpus, t0, t_end, tolerance, n))
    st, s_start, s_end = _stretches(ts, end, ok)
    s_ok = ok[st]
    if min_excursion_ns > 0 and len(st) > 2:
        inner = np.arange(1, len(st) - 1)
        short = inner[(~s_ok[inner]) & ((s_end[inner] - s_start[inner]) < min_excursion_ns)]
        s_ok[short] = True
        brk2 = np.ones(len(s_ok), dtype=bool)
        brk2[1:] = s_ok[1:] != s_ok[:-1]
        k = np.flatnonzero(brk2)
        s_end = np.append(s_start[k[1:]], s_end[-1])
        s_start, s_ok = s_start[k], s_ok[k]
    entries = s_start[s_ok]
    at_end = bool(s_ok[-1])
    ts_first = int(entries[0]) if len(entries) else None
    ts_bal = int(s_start[-1]) if at_end else None
    return {
        "ts_balance": ts_bal,
        "t_balance": None if ts_bal is None else (ts_bal - t0) / NS,
        "ts_first": ts_first,
        "t_first": None if ts_first is None else (ts_first - t0) / NS,
        "balanced_at_end": at_end,
        "n_entries": int(len(entries)),
        "balanced_s": float((end - ts)[ok].sum()) / NS,
        "target": (len(tasks) if n is None else n) / len(set(cpus)),
        "tolerance": tolerance,
        "n_tasks": len(tasks) if n is None else int(n),
        "ncpus": len(set(cpus)),
    }


def balance_times(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                  tolerance: float = 0.15) -> tuple[dict, dict]:
    """(:func:`time_to_balance`, :func:`settled_balance`) of one run, from the same balance
    steps, computed once (0.3 s at 10 M events), merged into stretches (both read stretches)."""
    steps = _balance_steps(rq, tasks, cpus, t0, t_end, tolerance, None, merged=True)
    return (time_to_balance(rq, tasks, cpus, t0, t_end, tolerance, steps=steps),
            settled_balance(rq, tasks, cpus, t0, t_end, tolerance, steps=steps))


def settled_balance(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                    tolerance: float = 0.15, n: int | None = None,
                    restored_ns: int = int(FAST_BALANCE_MAX_S * NS), steps=None) -> dict:
    """E3 as the policy card reads it: when the run queues were balanced and every later loss of
    balance was restored within ``restored_ns`` (an unbalanced stretch the run ends inside,
    shorter than that, included: it is not seen to last longer). See
    :data:`~harmony.analysis.thresholds.FAST_BALANCE_MAX_S`; :func:`time_to_balance` is the
    strict measure (balanced to the end of the run).

    Needs: as :func:`time_to_balance`.

    Returns a dict: ts_settled (ns) and t_settled (s since t0): the start of the balanced stretch
    after the last excursion of ``restored_ns`` or longer, else the first balance; None if the
    queues never balanced or the run ends inside such an excursion. excursions (int): the
    unbalanced stretches after the first balance; longest_excursion_s (float: the longest of
    them, 0.0 if none; None if never balanced); ends_in_excursion (bool: the run ends inside one).
    ``steps``: as :func:`time_to_balance`'s.
    """
    ts, end, _, ok = (steps if steps is not None
                      else _balance_steps(rq, tasks, cpus, t0, t_end, tolerance, n))
    out = {"ts_settled": None, "t_settled": None, "excursions": 0, "longest_excursion_s": None,
           "ends_in_excursion": False}
    balanced = np.flatnonzero(ok)
    if not len(balanced):
        return out
    # stretches of equal flags, from the first balanced segment on
    ts, end, ok = ts[balanced[0]:], end[balanced[0]:], ok[balanced[0]:]
    st, s_start, s_end = _stretches(ts, end, ok)
    away = np.flatnonzero(~ok[st])                  # the excursions, by stretch
    length = s_end[away] - s_start[away]
    long_ = away[length >= restored_ns]
    if not len(long_):
        settled = int(s_start[0])
    elif long_[-1] == len(st) - 1:                 # the run ends inside a long one
        settled = None
    else:
        settled = int(s_start[long_[-1] + 1])
    out.update(ts_settled=settled, t_settled=None if settled is None else (settled - t0) / NS,
               excursions=int(len(away)),
               longest_excursion_s=float(length.max(initial=0)) / NS,
               ends_in_excursion=bool(not ok[-1]))
    return out


def migrations_after_balance(migrations: pd.DataFrame, t_balance: int | None,
                             t_end: int) -> dict:
    """Migrations once the queues are balanced: in (t_balance, t_end], both ns.

    Needs: a migrations table (:func:`~harmony.analysis.reconstruct.df_migrations`); ``t_balance``
    is ``time_to_balance(...)["ts_balance"]``. A migration at exactly t_balance is the one that
    made the balance and is not counted.

    Returns a dict: window_s (float), all, balance (int counts: every kind / moves of runnable
    tasks only), all_per_s, balance_per_s (float). If t_balance is None (never balanced) the counts
    and rates are None and window_s is 0.
    """
    if t_balance is None:
        return {"window_s": 0.0, "all": None, "balance": None, "all_per_s": None,
                "balance_per_s": None}
    ts = migrations["ts"].to_numpy()
    sel = (ts > t_balance) & (ts <= t_end)
    n_all = int(sel.sum())
    n_bal = int((sel & (migrations["kind"].astype(str).to_numpy() == "balance")).sum())
    window = (int(t_end) - int(t_balance)) / NS
    return {"window_s": window, "all": n_all, "balance": n_bal,
            "all_per_s": n_all / window if window > 0 else float("nan"),
            "balance_per_s": n_bal / window if window > 0 else float("nan")}


def jain_index(x) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2); 1 = all equal, k/n when k share all.

    Typically x_i = share_i / fair_i (``df_task_share(...)["ratio"]``). NaN for an empty input or
    all zeros; NaN entries are ignored.
    """
    v = np.asarray(x, dtype=np.float64)
    v = v[~np.isnan(v)]
    sq = float((v * v).sum())
    if len(v) == 0 or sq == 0.0:
        return float("nan")
    return float(v.sum() ** 2 / (len(v) * sq))
