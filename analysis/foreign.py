"""Foreign load: CPU time that tasks outside the experiment took on the experiment's CPUs.

An experiment assumes its tasks have the CPU set to themselves. Other processes (daemons, the
controller's own threads, another job) change what a fair balance is, so a run measures and
reports how much of the CPU set they used, rather than assuming a quiet host.

Needs events: sched_switch.
"""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, in_set, key_table, keys_fit
from harmony.analysis.causes import JIT_MIN_EVENTS
from harmony.analysis.reconstruct import NS
from harmony.analysis.tables import FOREIGN_LOAD
from harmony.core.jit import use_compiled


def df_foreign_load(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                    t_end: int, controller_tids=()) -> pd.DataFrame:
    """CPU time per CPU of ``cpus`` in [t0, t_end], split into experiment, controller, foreign,
    idle.

    A CPU's time between two of its sched_switch events belongs to the switch's ``next`` task:
    the idle task (pid 0), an experiment task (pid in ``tasks``), one of the run's own controller
    threads (``controller_tids``: probe drains or perf record, sampler) or anything else
    (foreign). Time before the CPU's first switch in the window goes to the ``prev`` task of that
    switch.

    Columns: :data:`harmony.analysis.tables.FOREIGN_LOAD`, one row per CPU of ``cpus``; a CPU
    without any switch in the window has all-NaN time columns (nothing was seen, so nothing is
    claimed).
    """
    t0, t_end = int(t0), int(t_end)
    window = (t_end - t0) / NS
    pids = tasks["pid"].to_numpy()
    own = np.asarray(list(controller_tids), dtype=np.int64)
    unique = sorted(set(int(c) for c in cpus))
    if _compiled_fits(events, pids, own, unique):
        return _foreign_compiled(events, pids, own, unique, t0, t_end, window)
    # each CPU's switches: their rows (as narrow as the table allows), in time order; the
    # columns are read one CPU's rows at a time, never gathered for every switch at once (at
    # 10 M events those gathers, ~300 MB, were the checks' peak)
    switches = np.flatnonzero(event_mask(events, "sched_switch"))
    if len(events) <= np.iinfo(np.int32).max:
        switches = switches.astype(np.int32)
    cpu_all = events["cpu"].to_numpy()[switches]
    order = np.argsort(cpu_all, kind="stable")
    cpu_sorted = cpu_all[order]
    del cpu_all
    at = switches[order]
    del switches, order
    ts_col, nxt_col, prev_col = (events[c].to_numpy() for c in ("ts", "pid", "prev_pid"))
    rows = []
    for cpu in unique:
        a, b = np.searchsorted(cpu_sorted, _as_column(cpu_sorted, [cpu, cpu + 1]))
        if a == b:
            rows.append((cpu, window, np.nan, np.nan, np.nan, np.nan, np.nan, ""))
            continue
        mine = at[a:b]
        # segment k in [ts[k - 1], ts[k]) (ts[-1]: the window's start, ts[len]: its end) belongs
        # to the task switched in at its start; before the first switch, that switch's prev
        clipped = np.clip(ts_col.take(mine).astype(np.int64, copy=False), t0, t_end)
        dur = np.diff(clipped, prepend=np.int64(t0), append=np.int64(t_end)).astype(np.float64)
        dur /= NS
        del clipped
        owner = np.concatenate([prev_col[mine[:1]], nxt_col.take(mine)])
        is_idle = owner == 0
        is_exp = in_set(owner, pids)
        is_own = in_set(owner, own)
        is_foreign = ~is_idle & ~is_exp & ~is_own
        foreign_s = float(dur[is_foreign].sum())
        top = ""
        if is_foreign.any():
            comm_codes, comm_names = _codes(events["comm"], mine)
            prev_codes, prev_names = _codes(events["prev_comm"], mine[:1])
            top = _top_comm(comm_codes, comm_names, str(prev_names[prev_codes[0]]), is_foreign,
                            dur)
        rows.append((cpu, window, float(dur[is_exp].sum()), float(dur[is_own].sum()), foreign_s,
                     float(dur[is_idle].sum()), foreign_s / window if window > 0 else np.nan, top))
    return FOREIGN_LOAD.from_rows(rows)


def _compiled_fits(events: pd.DataFrame, pids: np.ndarray, own: np.ndarray,
                   cpus: list[int]) -> bool:
    """The compiled pass runs: its time has come (:func:`harmony.core.jit.use_compiled`), the
    comms are categorical (their codes read as they are) and the pids and CPUs fit key tables.
    From as many events as the other checks' passes (:data:`causes.JIT_MIN_EVENTS`)."""
    return (use_compiled(len(events), JIT_MIN_EVENTS) and bool(cpus)
            and all(isinstance(events[c].dtype, pd.CategoricalDtype)
                    for c in ("comm", "prev_comm"))
            and keys_fit(pids, own, cpus))


def _foreign_compiled(events: pd.DataFrame, pids: np.ndarray, own: np.ndarray, cpus: list[int],
                      t0: int, t_end: int, window: float) -> pd.DataFrame:
    """df_foreign_load's table by one compiled pass over the events (no array as long as the
    switches), the time summed in ns: the same table, its sums exact rather than of floats."""
    from harmony.analysis import checks_jit  # the compiled kernels: only on this path
    comm, prev_comm = events["comm"], events["prev_comm"]
    names = np.append(np.asarray(comm.cat.categories.astype(str), dtype=object), "nan")
    prev_names = np.append(np.asarray(prev_comm.cat.categories.astype(str), dtype=object), "nan")
    first, spent, first_foreign, by_comm = checks_jit.cpu_time(
        event_mask(events, "sched_switch"), events["cpu"].to_numpy(), events["ts"].to_numpy(),
        events["pid"].to_numpy(), events["prev_pid"].to_numpy(), comm.cat.codes.to_numpy(),
        key_table(cpus), len(cpus), t0, t_end, key_table(pids), key_table(own),
        len(names) - 1)
    prev_codes = prev_comm.cat.codes.to_numpy()
    rows = []
    for j, cpu in enumerate(cpus):
        if first[j] < 0:
            rows.append((cpu, window, np.nan, np.nan, np.nan, np.nan, np.nan, ""))
            continue
        by_name = collections.Counter()
        by_name[str(prev_names[prev_codes[first[j]]])] += int(first_foreign[j])
        for k in np.flatnonzero(by_comm[j]):
            by_name[str(names[k])] += int(by_comm[j, k])
        best = max(by_name.values())
        top = "" if best <= 0 else min(n for n, v in by_name.items() if v == best)
        exp_s, own_s, foreign_s, idle_s = (int(x) / NS for x in spent[j])
        rows.append((cpu, window, exp_s, own_s, foreign_s, idle_s,
                     foreign_s / window if window > 0 else np.nan, top))
    return FOREIGN_LOAD.from_rows(rows)


def _top_comm(codes: np.ndarray, names: np.ndarray, first: str, foreign: np.ndarray,
              dur: np.ndarray) -> str:
    """The comm that took the most foreign time ("" if none took any; at a tie, the least name):
    segment 0 is ``first``'s (the first switch's prev), segment k > 0 that of ``codes[k - 1]``
    (into ``names``; -1 is the last name). Summed by code, in segment order, then by name."""
    codes = np.where(codes < 0, len(names) - 1, codes)
    known = np.flatnonzero(names == first)
    first_id = int(known[0]) if len(known) else len(names)
    ids = np.concatenate([[first_id], codes])[foreign]
    by_id = np.bincount(ids, weights=dur[foreign], minlength=len(names) + 1)
    present = np.unique(ids)
    label = {int(i): (first if i == len(names) else str(names[i])) for i in present}
    best = max(float(by_id[i]) for i in present)
    return "" if best <= 0 else min(label[int(i)] for i in present if by_id[i] == best)


def _as_column(column: np.ndarray, values: list[int]) -> np.ndarray:
    """``values`` in the integer type of ``column`` when they fit it: searched for otherwise,
    numpy converts the whole column to the values' type (0.07 s a search at 5 M switches)."""
    out = np.asarray(values)
    if column.dtype.kind in "iu":
        info = np.iinfo(column.dtype)
        if info.min <= out.min() and out.max() <= info.max:
            return out.astype(column.dtype)
    return out


def _codes(column: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, names) of a string column's ``rows`` (in that order): names[codes[k]] is the string
    of row rows[k]. Categorical columns (the canonical table's) give their codes; others are
    factorized."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        # code -1 (a missing value) picks the last name: "nan", as astype(str) would say
        names = np.append(np.asarray(column.cat.categories.astype(str), dtype=object), "nan")
        return column.cat.codes.to_numpy().take(rows), names
    codes, uniques = pd.factorize(column.astype(str).to_numpy()[rows])
    return codes, np.asarray(uniques, dtype=object)
