"""Reconstruction of what the experiment tasks did, from the canonical events table.

Inputs shared by every function (see :mod:`harmony.probes.schema` for ``events``):

- ``tasks``: the experiment's tasks (a tasks table, :data:`harmony.workload.tasks.TASKS`; what is
  read of it is pid, name, role, duty and nice). Only these pids are reconstructed; events of other
  tasks are ignored (except that their sched_switch rows delimit the experiment tasks' runs).
- ``cpus``: the experiment CPU set. ``t0``: the release instant (ns, trace clock). ``t_end``: end of
  the measured window (ns).

Each table's columns are declared in :mod:`harmony.analysis.tables` (with their dtypes and
meanings), and built through those declarations. Times are int64 ns on the trace clock; where it
helps plotting a float column ``t`` gives seconds relative to ``t0`` (negative before the release).
Problems found in the trace are never dropped silently: each table carries counts in ``df.attrs``
(documented per function) and :func:`df_anomalies` lists them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis import causes, tables
from harmony.analysis.topology import level_columns
from harmony.analysis import taskstate as ts_
from harmony.analysis.arrays import (
    TABLE_KEYS_MAX,
    event_codes,
    event_mask,
    in_set,
    index_of,
    key_table,
    sorted_unique,
)
from harmony.analysis.taskstate import task_records
from harmony.core import jit as hjit

NS = 1_000_000_000

#: The kernel's sched_prio_to_weight (kernel/sched/core.c), nice -20 .. 19; nice 0 = 1024.
SCHED_PRIO_TO_WEIGHT = np.array([
    88761, 71755, 56483, 46273, 36291,
    29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906,
    3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423,
    335, 272, 215, 172, 137,
    110, 87, 70, 56, 45,
    36, 29, 23, 18, 15,
], dtype=np.int64)


#: the load weight of a SCHED_IDLE task (WEIGHT_IDLEPRIO, kernel/sched/sched.h), whatever its nice
WEIGHT_IDLEPRIO = 3


def nice_to_weight(nice) -> np.ndarray:
    """CFS/EEVDF load weight of each nice value (clipped to -20..19), as int64."""
    n = np.clip(np.asarray(nice, dtype=np.int64), -20, 19)
    return SCHED_PRIO_TO_WEIGHT[n + 20]


def class_weight(nice, policy) -> np.ndarray:
    """The fair class's load weight of each task: :func:`nice_to_weight` for other and batch,
    WEIGHT_IDLEPRIO for idle, 0 for fifo, rr and deadline (not shared by weight)."""
    policy = np.asarray(policy, dtype=object)
    w = nice_to_weight(nice)
    w = np.where(policy == "idle", WEIGHT_IDLEPRIO, w)
    return np.where(np.isin(policy, ("other", "batch", "idle")), w, 0).astype(np.int64)


def task_classes(tasks: pd.DataFrame) -> dict[str, np.ndarray]:
    """The scheduling-class columns of a tasks table (policy, rt_priority, dl_runtime_ms,
    dl_period_ms), filled with SCHED_OTHER's where the table predates them."""
    n = len(tasks)

    def col(name, default, dtype):
        return (tasks[name].to_numpy().astype(dtype) if name in tasks.columns
                else np.full(n, default, dtype=dtype))

    return {"policy": col("policy", "other", object),
            "rt_priority": col("rt_priority", 0, np.int64),
            "dl_runtime_ms": col("dl_runtime_ms", 0.0, np.float64),
            "dl_period_ms": col("dl_period_ms", 0.0, np.float64)}


# ---------------------------------------------------------------------------------------- helpers

def _pids(tasks: pd.DataFrame) -> np.ndarray:
    return tasks["pid"].to_numpy().astype(np.int32)


def _t(ts: np.ndarray, t0: int) -> np.ndarray:
    return (np.asarray(ts, dtype=np.int64) - np.int64(t0)) / NS


def _task_categories(tasks: pd.DataFrame) -> list[tuple[pd.Index, np.ndarray]]:
    """(categories, code of each task row) of the task table's name and role (sorted)."""
    out = []
    for col in ("name", "role"):
        # a task table is small: Python's set and sort beat pd.Categorical of the column
        # (~0.7 ms) and np.unique of objects (~0.5 ms)
        values = [str(v) for v in tasks[col].tolist()]
        cats = sorted(set(values))
        code = {v: i for i, v in enumerate(cats)}
        out.append((pd.Index(cats), np.array([code[v] for v in values], np.int64)))
    return out


def _task_info(pid: np.ndarray, tasks: pd.DataFrame) -> tuple[pd.Categorical, pd.Categorical]:
    """name and role of each pid (categoricals, categories sorted; pids must all be in ``tasks``,
    whose pids are unique)."""
    pos = index_of(pid, _pids(tasks))
    (names, name_code), (roles, role_code) = _task_categories(tasks)
    # valid codes: _task_categories gives every task's value a category
    return (pd.Categorical.from_codes(name_code[pos], categories=names, validate=False),
            pd.Categorical.from_codes(role_code[pos], categories=roles, validate=False))


def _trace_start(events: pd.DataFrame, t0: int) -> int:
    return int(events["ts"].iloc[0]) if len(events) else int(t0)


def _kinds(codes: np.ndarray, names) -> dict[str, int]:
    u, c = np.unique(codes[codes > 0], return_counts=True)
    return {names[i]: int(k) for i, k in zip(u, c)}


# ------------------------------------------------------------------------------------- migrations

def df_migrations(events: pd.DataFrame, tasks: pd.DataFrame, t0: int,
                  domains: dict | None = None) -> pd.DataFrame:
    """Every sched_migrate_task of an experiment task, and the moves its own events prove that
    no sched_migrate_task recorded (``inferred``), in time order.

    Needs events: sched_migrate_task, plus sched_switch, sched_wakeup, sched_wakeup_new,
    sched_process_exit (to know whether the task was runnable when it moved), sched_waking, and
    for the causes the events of :mod:`harmony.analysis.causes` (the scheduler's softirq, the
    NUMA balancer's moves) where recorded.

    Columns: :data:`harmony.analysis.tables.MIGRATIONS`. Whether the task was runnable as it
    moved (its ``kind``) comes from :func:`harmony.analysis.taskstate.task_records`, the
    ``cause`` from :func:`harmony.analysis.causes.migration_causes`; an inferred move's kind and
    cause from :func:`harmony.analysis.causes.inferred_causes`; its ``level`` from ``domains``
    (the manifest's topology, or its ``domains``: :func:`harmony.analysis.topology.
    level_columns`; none without).

    attrs: ``anomalies`` (int) = migrations whose orig_cpu contradicts the reconstructed CPU or
    that hit a task believed running; ``inferred`` (int) = the inferred rows.
    """
    r = task_records(events, _pids(tasks))
    sel = np.flatnonzero(r["record"].to_numpy() == ts_.MIGRATE)
    sel = sel[np.argsort(r["seq"].to_numpy()[sel], kind="stable")]
    m = {c: r[c].to_numpy()[sel] for c in ("seq", "pid", "orig_cpu", "dest_cpu", "cpu",
                                           "runnable_before", "anomaly")}
    m["ts"] = ts_.record_ts(events, m["seq"])
    policy = dict(zip(_pids(tasks).tolist(), task_classes(tasks)["policy"].tolist()))
    cause = causes.migration_causes(events, r, sel, policy)
    moves = causes.unrecorded_moves(events, _pids(tasks))
    i_cause, i_runnable = causes.inferred_causes(moves)
    cpu_ev = events["cpu"].to_numpy()
    ts = np.concatenate([m["ts"], moves["ts"]])
    # an inferred move comes before the recorded one of the same instant that proves it
    order = np.lexsort((np.r_[np.ones(len(sel), np.int8), np.zeros(len(moves["ts"]), np.int8)], ts))
    pid = np.concatenate([m["pid"].astype(np.int32), moves["pid"].astype(np.int32)])[order]
    name, role = _task_info(pid, tasks)

    def joined(a, b, dtype):
        return np.concatenate([np.asarray(a).astype(dtype), np.asarray(b).astype(dtype)])[order]

    # a task the kernel held queued as it slept (delayed dequeue) moved as a runnable one does
    queued = causes.queued_asleep(events, r, sel)
    runnable = joined(m["runnable_before"] | queued, i_runnable, bool)
    src = joined(m["orig_cpu"], moves["from_cpu"], np.int32)
    dst = joined(m["dest_cpu"], moves["to_cpu"], np.int32)
    out = tables.MIGRATIONS.frame({
        "ts": ts[order],
        "t": _t(ts[order], t0),
        "pid": pid,
        "name": name, "role": role,
        "src_cpu": src,
        "dst_cpu": dst,
        "event_cpu": joined(m["cpu"], cpu_ev[moves["row"]], np.int32),
        "kind": pd.Categorical.from_codes(np.where(runnable, 1, 0),
                                          categories=["wakeup", "balance"]),
        "cause": pd.Categorical.from_codes(joined(cause, i_cause, np.int8),
                                           categories=list(causes.CAUSES)),
        "inferred": joined(np.zeros(len(sel), bool), np.ones(len(moves["ts"]), bool), bool),
        **level_columns(src, dst, domains),
    }, copy=False)
    out.attrs["anomalies"] = int((m["anomaly"] > 0).sum())
    out.attrs["inferred"] = int(len(moves["ts"]))
    return out


# ------------------------------------------------------------------------------------------- runs

def df_runs(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, t_end: int) -> pd.DataFrame:
    """Every interval during which an experiment task ran on a CPU, sorted by (start, cpu, end).

    Needs events: sched_switch (all tasks': any task's switch-in ends the previous run on that CPU).

    A run of pid X on CPU c starts at a sched_switch on c with next_pid = X and ends at the next
    sched_switch on c (whose prev_pid should be X). Rules:

    - a run still open at the end of the trace, or ending after ``t_end``, is closed at ``t_end``
      and flagged ``truncated``; runs starting at or after ``t_end`` are not returned;
    - a task already running when the trace began (the first sched_switch on c has prev_pid = X
      and no switch-in of X precedes it) gets a run from the trace's first event to that switch,
      flagged ``unseen_start`` (its true start is unknown, so its duration is a lower bound);
    - a run whose switch-in is missing (the task is switched out on c, but the previous switch on
      c put the idle task or a non-experiment task in: some kernels do not emit every switch,
      typically the one out of the idle task) is kept, starting at the later of that previous
      switch and the task's last wake-up before its switch-out, and flagged ``unseen_start``.
      When the CPU was idle and the task was woken onto it, that is when it ran (an idle CPU takes
      it at once); otherwise the start is an estimate and the duration an upper bound. If the
      previous switch put another *experiment* task in, the moment the CPU changed hands is
      unknown and no run is emitted for the switched-out task (the other's run is closed there);
    - runs before ``t0`` are kept (negative ``t``); clip with ``start``/``end`` as needed.

    Columns: :data:`harmony.analysis.tables.RUNS` (an end_state of -1 where the ending switch is
    another task's: see run_end_mismatch).

    attrs: ``anomalies`` (int) and ``anomaly_kinds`` (dict): ``run_end_mismatch`` = a run of an
    experiment task ended by a switch whose prev_pid is another task (a switch was lost; the run
    is still closed there, with end_state -1: how it ended is unknown), ``run_start_unseen`` = an
    experiment task switched out on a CPU where a different task had been switched in (its run's
    switch-in was not seen; the run is emitted with an inferred start unless the CPU was with
    another experiment task, see above).
    """
    t_start = _trace_start(events, t0)
    if ts_._compiled(len(events)) is not None and _pids(tasks).max(initial=0) < 1 << 24:
        cols, kinds = _runs_compiled(events, tasks, t0, t_start, t_end)
    else:
        *rows, kinds = _run_rows_numpy(events, tasks, t_start, t_end)
        cols = _runs_table(*rows, tasks, t0, t_end)
    out = tables.RUNS.frame(cols, copy=False)
    out.attrs["anomalies"] = sum(kinds.values())
    out.attrs["anomaly_kinds"] = {k: v for k, v in kinds.items() if v}
    return out


#: room the compiled runs pass first gives the runs whose switch-in was lost: this many, or this
#: share of the switches if more (a trace that lost more is walked again with room for them all)
LOST_RUNS_ROOM_MIN, LOST_RUNS_ROOM_SHARE = 4096, 16


def _runs_table(pid, rcpu, start, end, end_state, open_end, unseen, tasks: pd.DataFrame, t0: int,
                t_end: int) -> dict:
    """df_runs' columns from the runs' rows (any order): those starting before t_end, closed at
    t_end and sorted by (start, cpu, end)."""
    keep = start < t_end
    pid, rcpu, start, end, end_state, open_end, unseen = (
        a[keep] for a in (pid, rcpu, start, end, end_state, open_end, unseen))
    truncated = open_end | (end > t_end)
    end = np.minimum(end, np.int64(t_end))
    end_state = np.where(truncated, -1, end_state)
    o = np.lexsort((end, rcpu, start))  # end: a zero-length unseen-start run comes first
    pid, rcpu, start, end, end_state, truncated, unseen = (
        a[o] for a in (pid, rcpu, start, end, end_state, truncated, unseen))
    name, role = _task_info(pid, tasks)
    return {"pid": pid, "name": name, "role": role, "cpu": rcpu,
            "start": start.astype(np.int64), "end": end.astype(np.int64),
            "duration": (end - start).astype(np.int64), "t": _t(start, t0),
            "end_state": end_state, "truncated": truncated, "unseen_start": unseen}


def _runs_table_compiled(pid, rcpu, start, end, end_state, open_end, n_seen: int,
                         tasks: pd.DataFrame, t0: int, t_end: int) -> dict:
    """_runs_table in one compiled pass (:func:`reconstruct_jit.finish_runs`) over the rows
    sorted by start: each column is written once, in its place (no filtered, sorted and gathered
    copies of every column)."""
    from harmony.analysis import reconstruct_jit
    order = np.argsort(start, kind="stable")    # merges the rows' runs already in order
    m = int(np.count_nonzero(start < t_end))
    task_pids, task_row = np.unique(_pids(tasks), return_index=True)   # the first of a pid
    (names, name_code), (roles, role_code) = _task_categories(tasks)
    # int32 codes whatever the categories (one compiled signature: a trace of 127 task names or
    # more fell back to numba's JIT, 0.4 s), narrowed below as pandas keeps them
    name_code, role_code = name_code.astype(np.int32), role_code.astype(np.int32)
    cols = {"pid": np.empty(m, np.int32), "cpu": np.empty(m, np.int32),
            "start": np.empty(m, np.int64), "end": np.empty(m, np.int64),
            "duration": np.empty(m, np.int64), "t": np.empty(m, np.float64),
            "end_state": np.empty(m, np.int64), "truncated": np.empty(m, bool),
            "unseen_start": np.empty(m, bool), "name": np.empty(m, name_code.dtype),
            "role": np.empty(m, role_code.dtype)}
    reconstruct_jit.finish_runs(order, pid, rcpu, start, end, end_state, open_end, np.int64(n_seen),
                                np.int64(t_end), np.int64(t0), task_pids, task_row.astype(np.int64),
                                name_code, role_code, *cols.values())
    for k, cats in (("name", names), ("role", roles)):
        codes = cols[k].astype(np.int8, copy=False) if len(cats) < 127 else cols[k]
        cols[k] = pd.Categorical.from_codes(codes, categories=cats, validate=False)
    return {k: cols[k] for k in tables.RUNS.names}


def _run_rows_numpy(events: pd.DataFrame, tasks: pd.DataFrame, t_start: int, t_end: int):
    """df_runs' intervals before the window and the sort (pid, cpu, start, end, end_state,
    open_end, unseen, anomaly kinds): every switch sorted by CPU, each row ending the previous."""
    pids = _pids(tasks)
    is_sw = event_mask(events, "sched_switch")
    rows = np.flatnonzero(is_sw)
    cpu = events["cpu"].to_numpy()[rows]
    # events are in time order: a stable sort keeps it per CPU (a radix sort on int16 cpus)
    order = np.argsort(cpu, kind="stable")
    rows, cpu = rows[order], cpu[order].astype(np.int32)
    ts = events["ts"].to_numpy()[rows]
    nxt = events["pid"].to_numpy()[rows]
    prv = events["prev_pid"].to_numpy()[rows]
    pst = events["prev_state"].to_numpy()[rows]
    n = len(rows)

    last_on_cpu = np.ones(n, dtype=bool)
    last_on_cpu[:-1] = cpu[:-1] != cpu[1:]
    first_on_cpu = np.ones(n, dtype=bool)
    first_on_cpu[1:] = cpu[1:] != cpu[:-1]
    nxt_is_exp = in_set(nxt, pids)
    prv_is_exp = in_set(prv, pids)

    # the row that ends the run started at row k is row k+1 on the same CPU
    has_end = ~last_on_cpu
    end_idx = np.minimum(np.arange(n) + 1, max(n - 1, 0))
    end_prev = np.where(has_end, prv[end_idx], -1)
    mismatch = has_end & (end_prev != nxt)
    kinds = {
        "run_end_mismatch": int((mismatch & nxt_is_exp).sum()),
        "run_start_unseen": int((np.append(False, mismatch[:-1]) & prv_is_exp
                                 if n else np.zeros(0, bool)).sum()),
    }

    sel = np.flatnonzero(nxt_is_exp)
    start = ts[sel]
    end = np.where(has_end[sel], ts[end_idx[sel]], np.int64(t_end))
    end_state = np.where(has_end[sel] & ~mismatch[sel], pst[end_idx[sel]], -1)
    head = np.flatnonzero(first_on_cpu & prv_is_exp)  # running when the trace began
    # switched out without a seen switch-in: start at the later of the CPU's previous switch and
    # the task's last wake-up before the switch-out
    lost_in = (np.flatnonzero(np.append(False, mismatch[:-1] & ~nxt_is_exp[:-1]) & prv_is_exp)
               if n else np.zeros(0, int))
    lost_start = _lost_switch_in_starts(events, prv[lost_in], ts[lost_in - 1], ts[lost_in])

    pid = np.concatenate([nxt[sel], prv[head], prv[lost_in]]).astype(np.int32)
    rcpu = np.concatenate([cpu[sel], cpu[head], cpu[lost_in]])
    start = np.concatenate([start, np.full(len(head), t_start, np.int64), lost_start])
    end = np.concatenate([end, ts[head], ts[lost_in]])
    end_state = np.concatenate([end_state, pst[head], pst[lost_in]]).astype(np.int64)
    open_end = np.concatenate([~has_end[sel], np.zeros(len(head) + len(lost_in), bool)])
    unseen = np.concatenate([np.zeros(len(sel), bool), np.ones(len(head) + len(lost_in), bool)])

    return pid, rcpu, start, end, end_state, open_end, unseen, kinds


def _runs_compiled(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, t_start: int, t_end: int):
    """df_runs' (columns, anomaly kinds) by compiled passes over the events
    (:func:`reconstruct_jit.runs`) and over the rows they give."""
    from harmony.analysis import reconstruct_jit
    pids = _pids(tasks)
    is_exp = np.zeros(int(pids.max(initial=0)) + 3, bool)      # pid v at v + 1, clipped
    is_exp[pids.astype(np.int64) + 1] = True
    is_sw = event_mask(events, "sched_switch")
    cpu = events["cpu"].to_numpy()
    n_cpu = int(cpu.max(initial=0)) + 1
    # room: a run a switch (the run it ends) and each CPU's last, open; one a CPU running when the
    # trace began; the runs whose switch-in was lost (rare) in a 16th of that, else a second pass
    # with as much. Three segments of a run a switch each (at 10 M events 485 MB for 160 MB of
    # runs) were heap memory the records had freed and the process keeps: resident
    seg2 = int(np.count_nonzero(is_sw)) + n_cpu
    seg3 = seg2 + n_cpu
    lost_room = max(LOST_RUNS_ROOM_MIN, seg2 // LOST_RUNS_ROOM_SHARE)
    while True:
        room = seg3 + lost_room
        # pid, CPU, start, end, prev_state, open: CPUs and states as the events hold them (int16,
        # int32; the table widens them), 27 bytes a row of room, not 33 (the runs are built
        # beside the tables made before them, where an import of 4.09 M events peaked)
        out = (np.empty(room, np.int32), np.empty(room, np.int16), np.empty(room, np.int64),
               np.empty(room, np.int64), np.empty(room, np.int32), np.empty(room, bool))
        n_out, kinds = np.zeros(3, np.int64), np.zeros(2, np.int64)
        reconstruct_jit.runs(is_sw, cpu, events["ts"].to_numpy(), events["pid"].to_numpy(),
                             events["prev_pid"].to_numpy(), events["prev_state"].to_numpy(),
                             is_exp, np.int64(t_start), np.int64(t_end),
                             np.full(n_cpu, -1, np.int64), *out, np.int64(seg2), np.int64(seg3),
                             n_out, kinds)
        if n_out[2] <= lost_room:
            break
        lost_room = int(n_out[2])
    pid, rcpu, start, end, end_state, open_end = (x[:int(n_out.sum())] for x in out)
    lost = slice(int(n_out[0] + n_out[1]), None)
    start[lost] = _lost_switch_in_starts(events, pid[lost], start[lost], end[lost])
    cols = _runs_table_compiled(pid, rcpu, start, end, end_state, open_end, int(n_out[0]), tasks,
                                t0, t_end)
    return cols, {"run_end_mismatch": int(kinds[0]), "run_start_unseen": int(kinds[1])}


def _lost_switch_in_starts(events: pd.DataFrame, pid: np.ndarray, lo: np.ndarray,
                           hi: np.ndarray, windowed: bool | None = None) -> np.ndarray:
    """For runs whose switch-in is missing: max(lo, pid's last wake-up in [lo, hi]) per row.

    A row's window lies between two switches on its CPU, so one CPU's windows do not overlap.
    When the windows hold few events in all (a trace with a few lost switch-ins), only the events
    in them are read (``windowed``; None = choose by size); else every wake-up of the trace is
    taken once and sorted by task (at 2 M events ~25 ms, even for one row)."""
    start = np.asarray(lo, dtype=np.int64).copy()
    if not len(pid):
        return start
    by_code = event_codes(events, "sched_wakeup", "sched_wakeup_new")
    if by_code is not None and windowed is not False:
        ts = events["ts"].to_numpy()
        first, past = np.searchsorted(ts, start, "left"), np.searchsorted(ts, hi, "right")
        n = len(ts)
        if windowed or (len(pid) <= max(8, n >> 11) and int((past - first).sum()) <= n >> 3):
            codes, wake = by_code
            epid = events["pid"].to_numpy()
            for k in np.flatnonzero(past > first).tolist():
                a, b = int(first[k]), int(past[k])
                hit = np.flatnonzero((epid[a:b] == pid[k]) & in_set(codes[a:b], wake))
                if len(hit):    # the last in row order: the latest (rows are in time order)
                    start[k] = max(int(start[k]), int(ts[a + hit[-1]]))
            return start
    wake = np.flatnonzero(event_mask(events, "sched_wakeup", "sched_wakeup_new"))
    wpid, wts = events["pid"].to_numpy()[wake], events["ts"].to_numpy()[wake].astype(np.int64)
    who = sorted_unique(pid)
    wanted = in_set(wpid, who)
    wpid, wts = wpid[wanted], wts[wanted]
    # each task's wake-ups one after another, in time order (rows are): a stable sort by the
    # task's rank in ``who`` (a radix sort while there are fewer than 65536)
    rank = np.searchsorted(who, wpid).astype(np.uint16 if len(who) <= 1 << 16 else np.int64)
    by = np.argsort(rank, kind="stable")
    rank, wts = rank[by], wts[by]
    for k, p in enumerate(who):
        times = wts[np.searchsorted(rank, k, "left"):np.searchsorted(rank, k, "right")]
        rows = np.flatnonzero(pid == p)
        i = np.searchsorted(times, hi[rows], side="right") - 1
        w = np.where(i >= 0, times[np.maximum(i, 0)] if len(times) else 0, np.iinfo(np.int64).min)
        start[rows] = np.maximum(start[rows], np.minimum(w, hi[rows]))
    return start


# --------------------------------------------------------------------------------------- runqueue

def df_runqueue(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                t_end: int) -> pd.DataFrame:
    """Exact run-queue length of experiment tasks per CPU, as a step function rebuilt from events.

    Needs events: sched_switch, sched_wakeup, sched_wakeup_new, sched_migrate_task,
    sched_process_exit. The per-task state machine (rules, repairs and anomaly kinds) is
    documented in :mod:`harmony.analysis.taskstate`; ``nr`` counts the experiment tasks that are
    running or waiting on the CPU.

    Columns: :data:`harmony.analysis.tables.RUNQUEUE`. The first rows, one per CPU of ``cpus`` at
    t_first = min(first event's ts, t0), hold the state inferred at trace start (the state before
    any event; see taskstate), updated by the events at exactly t_first if any; after that one row
    per change (several events at the same ts on one CPU collapse to the last value; events that
    leave nr unchanged give no row), so (ts, cpu) is unique. Rows after ``t_end`` are not
    returned. Sorted by (ts, cpu).

    attrs:

    - ``anomalies`` (int): contradictions repaired in [trace start, t_end] (see taskstate)
    - ``anomaly_kinds`` (dict name -> count)
    - ``inferred_runnable_at_start`` (int): experiment tasks found runnable at trace start
    - ``outside_cpus`` (int): state changes that put a runnable experiment task on a CPU not in
      ``cpus`` (they are not in the table; nonzero means the task escaped the CPU set)
    """
    cpus = np.asarray(sorted(set(int(c) for c in cpus)), dtype=np.int32)
    r = task_records(events, _pids(tasks))
    t_first = min(_trace_start(events, t0), int(t0))
    inwin = r["seq"].to_numpy() < ts_.seq_before(events, t_end)     # at or before t_end

    # initial counts
    init_mask = r["first"].to_numpy() & r["runnable_before"].to_numpy()
    init_cpu = r["cpu_before"].to_numpy()[init_mask]
    init = np.zeros(len(cpus), dtype=np.int64)
    pos = np.searchsorted(cpus, init_cpu)
    ins = (pos < len(cpus)) & (cpus[np.minimum(pos, len(cpus) - 1)] == init_cpu)
    np.add.at(init, pos[ins], 1)
    outside = int((~ins).sum())

    if ts_._compiled(len(events)) is not None:
        all_ts, all_cpu, all_nr, out_n = _runqueue_compiled(events, r, cpus, init, t_first,
                                                            t_end)
    else:
        all_ts, all_cpu, all_nr, out_n = _runqueue_numpy(events, r, cpus, init, t_first, inwin)
    outside += out_n
    out = tables.RUNQUEUE.frame({"ts": all_ts, "t": _t(all_ts, t0), "cpu": all_cpu,
                                 "nr": all_nr}, copy=False)
    an = r["anomaly"].to_numpy()[inwin]
    out.attrs["anomalies"] = int((an > 0).sum())
    out.attrs["anomaly_kinds"] = _kinds(an, ts_.ANOMALIES)
    out.attrs["inferred_runnable_at_start"] = int(init_mask.sum())
    out.attrs["outside_cpus"] = outside
    return out


def _runqueue_numpy(events: pd.DataFrame, r: pd.DataFrame, cpus: np.ndarray, init: np.ndarray,
                    t_first: int, inwin: np.ndarray):
    """df_runqueue's rows (ts, cpu, nr) from the task records of ``events``, and the changes
    that put a task outside ``cpus``: every change sorted by (CPU, record), counts by cumulative
    sums."""
    seq = r["seq"].to_numpy()
    rts = ts_.record_ts(events, seq)
    rb, ra = r["runnable_before"].to_numpy(), r["runnable_after"].to_numpy()
    cb, ca = r["cpu_before"].to_numpy(), r["cpu_after"].to_numpy()
    changed = inwin & ((rb != ra) | (cb != ca))
    m_minus = changed & rb
    m_plus = changed & ra
    d_seq = np.concatenate([seq[m_minus], seq[m_plus]])
    d_ts = np.concatenate([rts[m_minus], rts[m_plus]])
    d_cpu = np.concatenate([cb[m_minus], ca[m_plus]])
    d = np.concatenate([np.full(m_minus.sum(), -1, np.int64), np.ones(m_plus.sum(), np.int64)])
    pos = np.searchsorted(cpus, d_cpu)
    ins = (pos < len(cpus)) & (cpus[np.minimum(pos, len(cpus) - 1)] == d_cpu)
    outside = int((~ins & (d > 0)).sum())
    d_seq, d_ts, d, pos = d_seq[ins], d_ts[ins], d[ins], pos[ins]

    o = np.lexsort((d_seq, pos))
    d_seq, d_ts, d, pos = d_seq[o], d_ts[o], d[o], pos[o]
    n = len(d)
    cum = np.cumsum(d)
    gfirst = np.ones(n, dtype=bool)
    gfirst[1:] = pos[1:] != pos[:-1]
    gidx = np.maximum.accumulate(np.where(gfirst, np.arange(n), 0)) if n else np.zeros(0, int)
    base = cum[gidx] - d[gidx]
    nr = init[pos] + cum - base
    # collapse to the last value per (cpu, ts); drop rows that do not change nr
    last = np.ones(n, dtype=bool)
    last[:-1] = (pos[:-1] != pos[1:]) | (d_ts[:-1] != d_ts[1:])
    pos, d_ts, nr = pos[last], d_ts[last], nr[last]
    prev_nr = np.empty_like(nr)
    if len(nr):
        prev_nr[1:] = nr[:-1]
        gf = np.ones(len(nr), dtype=bool)
        gf[1:] = pos[1:] != pos[:-1]
        prev_nr[gf] = init[pos[gf]]
    keep = nr != prev_nr
    pos, d_ts, nr = pos[keep], d_ts[keep], nr[keep]

    # a change at t_first itself replaces that CPU's initial row: one value per instant
    init_row = np.ones(len(cpus), dtype=bool)
    init_row[pos[d_ts == t_first]] = False
    all_ts = np.concatenate([np.full(int(init_row.sum()), t_first, np.int64),
                             d_ts.astype(np.int64)])
    all_cpu = np.concatenate([cpus[init_row], cpus[pos]]).astype(np.int32)
    all_nr = np.concatenate([init[init_row], nr]).astype(np.int32)
    o = np.lexsort((all_cpu, all_ts))
    return all_ts[o], all_cpu[o], all_nr[o], outside


def _runqueue_compiled(events: pd.DataFrame, r: pd.DataFrame, cpus: np.ndarray,
                       init: np.ndarray, t_first: int, t_end: int):
    """_runqueue_numpy in compiled passes over the records in time order
    (:mod:`reconstruct_jit`): on a large trace, time ranges on several threads, each starting
    from the counts the records before it leave."""
    from harmony.analysis import reconstruct_jit
    seq = r["seq"].to_numpy()
    order = ts_.seq_rows(r)          # the records in time order (the table is by task)
    ev_ts = events["ts"].to_numpy()  # a record's time: its event's (ev_ts[seq >> 1])
    rb, ra = r["runnable_before"].to_numpy(), r["runnable_after"].to_numpy()
    cb, ca = r["cpu_before"].to_numpy(), r["cpu_after"].to_numpy()
    hi = int(max(cb.max(initial=-1), ca.max(initial=-1), cpus.max(initial=-1)))
    lut = np.full(hi + 2, -1, np.int64)
    lut[cpus.astype(np.int64) + 1] = np.arange(len(cpus))
    ranges = _instant_ranges(order, seq, ev_ts, t_first)
    # room for each range's rows, one after the other: a row is written for a CPU whose count a
    # record changed (at most one a record's runnable before, one its runnable after), and the
    # first range's initial rows. Not two a record: at 10 M events 196 instead of 490 MB of room
    # for 106 MB of rows, and this room is resident memory (see the copies below)
    changed = (rb != ra) | (cb != ca)
    most = (changed & rb).view(np.int8) + (changed & ra).view(np.int8)
    del changed
    # summed a range at a time: add.reduceat with an int64 sum casts its whole input first (40
    # MB at 4.09 M events, where the run queue set the import's peak); sum buffers its casts
    per_range = [int(most[order[lo:hi]].sum(dtype=np.int64)) for lo, hi in ranges] or [0]
    del most
    at = np.cumsum(np.r_[len(cpus), per_range]).astype(np.int64)     # where range k writes
    room = int(at[-1])
    # lengths int32: 16 bytes a row of room and of the table, not 20. CPUs stay int32, as in the
    # other tables, which a user joins this one with on them (pandas' merge_asof refuses keys of
    # two integer types)
    ts, cpu, nr = np.empty(room, np.int64), np.empty(room, np.int32), np.empty(room, np.int32)
    inits = [init]
    if len(ranges) > 1:
        pid = r["pid"].to_numpy()
        starts = np.concatenate([[0], np.flatnonzero(pid[1:] != pid[:-1]) + 1, [len(pid)]])
        for lo, _ in ranges[1:]:
            inits.append(np.empty(len(cpus), np.int64))
            reconstruct_jit.counts_at(seq, rb, ra, cb, ca, starts, seq[order[lo]], lut, inits[-1])
    parts = hjit.run_split(lambda lo, hi_, k: reconstruct_jit.runqueue(
        order, lo, hi_, seq, ev_ts, rb, ra, cb, ca, np.int64(t_end), lut, cpus, inits[k],
        np.int64(t_first), k == 0, ts, cpu, nr, at[k] if k else 0), ranges)
    # the bound above is what keeps the compiled pass (no bounds checked) inside its room
    assert all(end <= at[j + 1] for j, (end, _) in enumerate(parts)), "run-queue room overrun"
    k, outside = parts[0]
    for j, (end, out_k) in enumerate(parts[1:], 1):     # each range's rows after the last
        src = int(at[j])
        reconstruct_jit.move_rows(ts, cpu, nr, src, end - src, k)
        k, outside = k + end - src, outside + out_k
    # the room cut to the rows in place (realloc: the rest freed, nothing copied): a view would
    # hold all of it for as long as the table lives, and a copy would be made beside it, where
    # the run queue sets an import's peak (the room is not untouched memory: heap memory freed
    # by the decode and kept, harmony.core.memory)
    for a in (ts, cpu, nr):
        a.resize(k, refcheck=False)     # this function's own arrays: nothing else refers to them
    return ts, cpu, nr, int(outside)


def _instant_ranges(order: np.ndarray, seq: np.ndarray, ev_ts: np.ndarray,
                    t_first: int) -> list[tuple[int, int]]:
    """harmony.core.jit.split's ranges of the records (their ``seq``) in time ``order``, each cut
    moved on to the first record of an instant (a change of ts: ``ev_ts`` of the events) after
    t_first; cuts that find none are dropped."""
    n = len(order)
    ranges = hjit.split(n)
    cuts = [0]
    for _, c in ranges[:-1]:
        c = max(c, cuts[-1] + 1)
        # the first record later than both the one before the cut and t_first (records are in
        # time order), looked for a chunk at a time: an instant may hold many records
        after = max(int(ev_ts[seq[order[c - 1]] >> 1]), int(t_first)) if c <= n else 0
        while c < n:
            later = np.flatnonzero(ev_ts[seq[order[c:c + 4096]] >> 1] > after)
            if len(later):
                c += int(later[0])
                break
            c += 4096
        if c < n:
            cuts.append(c)
    cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:]))


def df_core(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
            t_end: int, domains: dict | None = None) -> dict[str, pd.DataFrame]:
    """The three tables every analysis starts from, {"migrations", "runs", "runqueue"}: the same
    as :func:`df_migrations`, :func:`df_runs` and :func:`df_runqueue` called one by one.

    On a large trace the runs (from the events) are built on a second thread while this one builds
    the task records, migrations and run queue (which share the records): their numpy and compiled
    passes release the GIL, so on two CPUs the tables take about the time of the longer half.
    """
    def rest():
        return {"migrations": df_migrations(events, tasks, t0, domains),
                "runqueue": df_runqueue(events, tasks, cpus, t0, t_end)}

    if len(events) < hjit.PARALLEL_MIN_ITEMS or hjit.threads() < 2:
        return {"runs": df_runs(events, tasks, t0, t_end)} | rest()
    from concurrent.futures import wait
    runs = hjit.on_side_thread(df_runs, events, tasks, t0, t_end)
    try:
        out = rest()
    finally:
        wait([runs])
    return {"runs": runs.result()} | out


def runqueue_steps(rq: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The step function ``rq`` (from :func:`df_runqueue`) as flat arrays, CPU by CPU:
    (cpus, bounds, ts, nr), CPU ``cpus[k]``'s steps being ``ts`` / ``nr`` [bounds[k]:bounds[k+1]]
    in the table's order (time). Read them with :func:`steps_by_cpu` or :func:`steps_at`."""
    cpu = rq["cpu"].to_numpy()
    order = np.argsort(cpu, kind="stable")
    cpus, starts = np.unique(cpu[order], return_index=True)
    bounds = np.append(starts, len(cpu))
    return cpus, bounds, rq["ts"].to_numpy()[order], rq["nr"].to_numpy()[order]


def steps_by_cpu(steps):
    """(cpu, ts, nr) of each CPU of ``steps`` (:func:`runqueue_steps`), in CPU order."""
    cpus, bounds, ts, nr = steps
    for k, c in enumerate(cpus.tolist()):
        yield c, ts[bounds[k]:bounds[k + 1]], nr[bounds[k]:bounds[k + 1]]


def steps_at(steps, times: np.ndarray, cpus=None, absent: int = -1) -> np.ndarray:
    """The run queue lengths at ``times`` (ns; events at exactly that ts included): an int64
    array, one row per time and one column per CPU of ``cpus`` (default: those of ``steps``);
    -1 before a CPU's step function begins, ``absent`` for a CPU it does not have."""
    times = np.asarray(times, dtype=np.int64)
    have = {c: (ts, nr) for c, ts, nr in steps_by_cpu(steps)}
    cpus = list(have) if cpus is None else [int(c) for c in cpus]
    out = np.full((len(times), len(cpus)), absent, np.int64)
    for j, c in enumerate(cpus):
        if c in have:
            ts, nr = have[c]
            i = np.searchsorted(ts, times, side="right") - 1
            out[:, j] = np.where(i >= 0, nr[np.maximum(i, 0)], -1)
    return out


def runqueue_at(rq: pd.DataFrame, times) -> pd.DataFrame:
    """Sample the step function ``rq`` (from :func:`df_runqueue`) at the given ns ``times``.

    Returns a DataFrame indexed by ``ts`` (the times, in the given order) with one int64 column
    per CPU of ``rq``: the nr in force at that instant (events at exactly that ts included);
    -1 before the step function begins.
    """
    times = np.asarray(times, dtype=np.int64)
    steps = runqueue_steps(rq)
    out = pd.DataFrame(steps_at(steps, times), index=pd.Index(times, name="ts"),
                       columns=pd.Index(steps[0].tolist(), name="cpu"))
    return out


#: rows of the run-queue table :func:`runqueue_changes` reads at a time
CHANGES_CHUNK = 1 << 20


def balance_deviations(rq: pd.DataFrame, cpus, t0: int, t_end: int,
                       target: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(times, dev): :func:`runqueue_changes`' times, and at each the largest distance of a CPU's
    run-queue length from ``target`` (float64), by one compiled pass that never holds the
    vectors (:func:`reconstruct_jit.changes` given no room for them: at 10 M events of a
    ping-pong, the vectors and their longest and shortest were 0.3 s of fresh memory and
    passes); None where the compiled pass does not run (then from the vectors). Raises
    ValueError as runqueue_changes does."""
    cpus = sorted(set(int(c) for c in cpus))
    cpu, ts, nr, a, b = _rows_of(rq, cpus, t0, t_end)
    if ts_._compiled(len(ts)) is None or not cpus or max(cpus) >= TABLE_KEYS_MAX \
            or min(cpus) < 0:
        return None
    return _changes_compiled(cpu, ts, nr, cpus, a, b, t0, target)


def _rows_of(rq: pd.DataFrame, cpus: list[int], t0: int, t_end: int):
    """(cpu, ts, nr) of the run-queue rows of ``cpus`` (sorted), and [a, b): those in
    (t0, t_end)."""
    cpu, ts, nr = rq["cpu"].to_numpy(), rq["ts"].to_numpy(), rq["nr"].to_numpy()
    keep = in_set(cpu, cpus)
    if not keep.all():
        cpu, ts, nr = cpu[keep], ts[keep], nr[keep]
    del keep
    a = int(np.searchsorted(ts, t0, "right"))
    b = max(a, int(np.searchsorted(ts, t_end, "left")))
    return cpu, ts, nr, a, b


def runqueue_changes(rq: pd.DataFrame, cpus, t0: int, t_end: int) -> tuple[np.ndarray, np.ndarray]:
    """The run-queue vector of ``cpus`` (sorted) at t0 and at every change of it in (t0, t_end):
    (times: int64 ns, the first t0; q: int32, one row per time and one column per CPU). Raises
    ValueError if ``rq`` (from :func:`df_runqueue`: in time order) does not cover t0 for every
    CPU.

    Read at t0 and after each instant's last row: each CPU's length is that of its last row
    before, found a CPU at a time and :data:`CHANGES_CHUNK` rows at a time, the length carried
    from one chunk to the next (its temporaries a chunk long, not the table's: they are the
    metrics' peak memory at 10 M events); ``q`` is stored CPU by CPU (a transposed view), as
    int32, a queue's length, and the rows read are int32 where they fit: the balance steps'
    arrays, an entry a change, then fit the holes the tables left in the heap (250 -> 170 MB at
    once at 10 M events). On large traces one compiled pass (:func:`reconstruct_jit.changes`)
    writes the vectors with no temporaries at all (0.27 -> 0.02 s at 7.06 M events)."""
    cpus = sorted(set(int(c) for c in cpus))
    cpu, ts, nr, a, b = _rows_of(rq, cpus, t0, t_end)
    if ts_._compiled(len(ts)) is not None and max(cpus, default=0) < TABLE_KEYS_MAX \
            and min(cpus, default=0) >= 0:
        times, q = _changes_compiled(cpu, ts, nr, cpus, a, b, t0)
    else:
        times, q = _changes_numpy(cpu, ts, nr, cpus, a, b, t0)
    if (q < 0).any():
        raise ValueError("run-queue table does not cover t0 for every CPU")
    return times, q


def _changes_compiled(cpu, ts, nr, cpus: list[int], a: int, b: int, t0: int,
                      target: float | None = None):
    """runqueue_changes' (times, vectors) by one compiled pass (:func:`reconstruct_jit.changes`):
    no temporaries, only the vectors; given a ``target``, (times, each vector's largest distance
    from it) instead, no vector held (ValueError where one lacks a CPU's length)."""
    from harmony.analysis import reconstruct_jit
    times = np.empty(1 + reconstruct_jit.instants(ts, a, b), np.int64)
    times[0] = t0
    want_q = target is None
    q = np.empty((len(cpus), len(times)) if want_q else (0, 0), np.int32)   # CPU by CPU
    dev = np.empty(0 if want_q else len(times), np.float64)
    covered = reconstruct_jit.changes(cpu, ts, nr, key_table(cpus, np.int32), len(cpus), a, b,
                                      times, q, np.float64(0 if want_q else target), dev)
    if want_q:
        return times, q.T           # returned transposed
    if not covered:
        raise ValueError("run-queue table does not cover t0 for every CPU")
    return times, dev


def _changes_numpy(cpu, ts, nr, cpus: list[int], a: int, b: int, t0: int):
    """runqueue_changes' vectors by numpy, :data:`CHANGES_CHUNK` rows at a time."""
    # the rows read before each vector: a at t0, then up to each instant's last in (t0, t_end)
    last = np.ones(b - a, bool)
    np.not_equal(ts[a + 1:b], ts[a:b - 1], out=last[:-1])
    index = np.int32 if b < np.iinfo(np.int32).max else np.int64
    upto = np.empty(int(last.sum()) + 1, index)
    upto[0] = a
    upto[1:] = np.flatnonzero(last)
    del last
    upto[1:] += a + 1
    times = np.empty(len(upto), np.int64)
    times[0] = t0
    np.take(ts, upto[1:] - 1, out=times[1:])
    q = np.empty((len(cpus), len(upto)), np.int32)  # CPU by CPU: returned transposed
    step = np.arange(1, min(b, CHANGES_CHUNK) + 1, dtype=np.int64)   # a chunk's rows, from 1
    for j, c in enumerate(cpus):
        latest, k = 0, 0                # the CPU's last row so far, from 1 (0: none yet)
        for lo in range(0, max(b, 1), CHANGES_CHUNK):
            hi = min(lo + CHANGES_CHUNK, b)
            k_hi = int(np.searchsorted(upto, hi, "right")) if hi < b else len(upto)
            # the CPU's last row among the chunk's first i + 1, for each i, from 1
            last = np.where(cpu[lo:hi] == c, step[:hi - lo] + lo, 0)
            if len(last):
                last[0] = max(int(last[0]), latest)
                np.maximum.accumulate(last, out=last)
            read = upto[k:k_hi] - (lo + 1)          # each vector's last row read, in the chunk
            row = last[np.maximum(read, 0)] if len(last) else np.zeros(len(read), np.int64)
            row[read < 0] = latest
            np.copyto(q[j, k:k_hi], -1)
            np.copyto(q[j, k:k_hi], nr[np.maximum(row - 1, 0)] if len(nr) else -1, where=row > 0)
            if len(last):
                latest = int(last[-1])
            k = k_hi
    return times, q.T


def df_anomalies(events: pd.DataFrame, tasks: pd.DataFrame, t0: int) -> pd.DataFrame:
    """Every contradiction the task state machine repaired (see :mod:`harmony.analysis.taskstate`).

    Needs events: as :func:`df_runqueue`.

    Columns: :data:`harmony.analysis.tables.ANOMALIES`.
    """
    r = task_records(events, _pids(tasks))
    a = r[r["anomaly"].to_numpy() > 0].sort_values("seq", kind="stable")
    name, role = _task_info(a["pid"].to_numpy(), tasks)
    ts = ts_.record_ts(events, a["seq"].to_numpy())
    return tables.ANOMALIES.frame({
        "ts": ts, "t": _t(ts, t0), "pid": a["pid"].to_numpy(),
        "name": name, "role": role, "cpu": a["cpu"].to_numpy().astype(np.int32),
        "record": np.asarray(ts_.RECORDS, dtype=object)[a["record"].to_numpy()],
        "anomaly": np.asarray(ts_.ANOMALIES, dtype=object)[a["anomaly"].to_numpy()],
        "cpu_before": a["cpu_before"].to_numpy().astype(np.int32),
        "runnable_before": a["runnable_before"].to_numpy(),
        "running_before": a["running_before"].to_numpy(),
    })


# ------------------------------------------------------------------------------------- allocation

#: runs df_allocation and df_task_share read at a time: their temporaries stay in the CPU's
#: cache, and never grow with the table (df_task_share's, the table's length, were ~100 MB at
#: 1.9 M runs, at a 4.09 M-event import's peak)
ALLOCATION_CHUNK = 1 << 16


def _run_time(runs: pd.DataFrame, pids: np.ndarray, t0: int, t_end: int) -> np.ndarray:
    """Each task of ``pids``' time running in [t0, t_end] (ns, float64), from the runs clipped to
    it, :data:`ALLOCATION_CHUNK` runs at a time. The sums are of whole nanoseconds, exact in a
    float64 in any order (below 2**53 ns, 104 days)."""
    ns = np.zeros(len(pids))
    start, end, pid = (runs[c].to_numpy() for c in ("start", "end", "pid"))
    for lo in range(0, len(runs), ALLOCATION_CHUNK):
        hi = lo + ALLOCATION_CHUNK
        d = np.minimum(end[lo:hi], t_end) - np.maximum(start[lo:hi], t0)
        tix = index_of(pid[lo:hi], pids)
        ok = (d > 0) & (tix >= 0)       # not clipped away, a task of the table
        ns += np.bincount(tix[ok], weights=d[ok], minlength=len(ns))
    return ns


def df_allocation(runs: pd.DataFrame, tasks: pd.DataFrame, t0: int, t_end: int,
                  window_ns: int) -> pd.DataFrame:
    """CPU time of each experiment task in consecutive windows of [t0, t_end).

    Needs: a runs table (:func:`df_runs`). Windows are [t0 + k*w, t0 + (k+1)*w), the last one cut
    at t_end. Run intervals are clipped to [t0, t_end] and split exactly at window boundaries.
    Every (task, window) pair has a row, zero when the task did not run.

    Columns: :data:`harmony.analysis.tables.ALLOCATION`, sorted by (window, task order in
    ``tasks``).
    """
    w = int(window_ns)
    if w <= 0:
        raise ValueError("window_ns must be positive")
    t0, t_end = int(t0), int(t_end)
    k_n = max(0, -(-(t_end - t0) // w))
    tp = _pids(tasks)
    n_t = len(tp)
    ns = np.zeros(k_n * n_t)
    start, end, pid = (runs[c].to_numpy() for c in ("start", "end", "pid"))
    # each run's part in the window it starts in, a chunk of runs at a time; the few that go on
    # into later windows are split afterwards. The sums are of whole nanoseconds, exact in a
    # float64 in any order (below 2**53 ns, 104 days)
    spans = []
    for lo in range(0, len(runs), ALLOCATION_CHUNK):
        hi = lo + ALLOCATION_CHUNK
        s = np.maximum(start[lo:hi], t0)
        e = np.minimum(end[lo:hi], t_end)
        tix = index_of(pid[lo:hi], tp)
        a = (s - t0) // w
        edge = t0 + (a + 1) * w
        first = np.minimum(e, edge) - s
        ok = (first > 0) & (tix >= 0)       # not clipped away, a task of the table
        ns += np.bincount((a * n_t + tix)[ok], weights=first[ok], minlength=len(ns))
        on = np.flatnonzero(ok & (e > edge))
        if len(on):
            spans.append((a[on] + 1, (e[on] - 1 - t0) // w, e[on], tix[on]))
    if spans:
        a, b, e, tix = (np.concatenate(x) for x in zip(*spans))
        cnt = b - a + 1
        rep = np.repeat(np.arange(len(a)), cnt)
        k = a[rep] + np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        part = np.minimum(e[rep], t0 + (k + 1) * w) - (t0 + k * w)
        ns += np.bincount(k * n_t + tix[rep], weights=part, minlength=len(ns))
    kk = np.repeat(np.arange(k_n, dtype=np.int64), n_t)
    ti = np.tile(np.arange(n_t), k_n)
    wstart = t0 + kk * w
    wlen = np.minimum(wstart + w, t_end) - wstart
    name, role = _task_info(tp[ti], tasks)
    cpu_time = ns / NS
    return tables.ALLOCATION.frame({
        "pid": tp[ti], "name": name, "role": role, "window": kk, "window_start": wstart,
        "t": _t(wstart, t0), "window_s": wlen / NS, "cpu_time": cpu_time,
        "share": cpu_time / (wlen / NS),
    })


def fair_shares(weights, demands, ncpus: float) -> np.ndarray:
    """GPS water-filling fair share of each task, in CPUs (0..1 each).

    Each task gets w_i / sum(w) of ``ncpus`` CPUs (or of what is left of them: any capacity),
    capped at 1 CPU and at its demand (fraction of one CPU it would use alone, 0..1); capacity freed
    by capped tasks is re-shared among the rest in proportion to their weights, until no task
    exceeds its cap. Tasks with zero weight get 0. The result sums to min(ncpus, sum of caps).
    """
    w = np.asarray(weights, dtype=np.float64)
    cap = np.minimum(np.asarray(demands, dtype=np.float64), 1.0)
    cap = np.maximum(cap, 0.0)
    share = np.zeros(len(w))
    active = (w > 0) & (cap > 0)
    left = float(ncpus)
    while active.any() and left > 1e-15:
        give = np.where(active, w / w[active].sum() * left, 0.0)
        over = active & (give >= cap - 1e-12)
        if not over.any():
            share[active] = give[active]
            break
        share[over] = cap[over]
        left -= cap[over].sum()
        active &= ~over
    return share


def class_fair_shares(tasks: pd.DataFrame, ncpus: int, rt_share: float | None = None) -> np.ndarray:
    """Each task's fair share of ``ncpus`` CPUs (0..1 each) by the rule of its scheduling class.

    "Fair" is what an ideal scheduler of the task's own class would give it on the whole CPU
    set, the classes taken in the kernel's order (each takes what it is owed, the next shares
    what is left):

    1. SCHED_DEADLINE: its reservation, runtime / period (capped at its demand);
    2. SCHED_FIFO and SCHED_RR: by priority, highest first; the tasks of one priority split what
       is left equally (:func:`fair_shares` with equal weights, capped at their demand). RT
       throttling (``rt_share`` = sched_rt_runtime_us / sched_rt_period_us, None: no limit) caps
       the real-time tasks together at rt_share of every CPU and each at rt_share of one;
    3. the fair classes (other, batch, idle) share the rest by load weight (:func:`class_weight`:
       nice for other and batch, 3 for idle), capped at their demand.

    Without real-time or deadline tasks this is :func:`fair_shares` by nice, as it always was.
    FIFO never shares a CPU in time: tasks of one priority that outnumber the CPUs do not get
    an equal split from it, and the ratio to this share says by how much it departs from one.
    """
    cls = task_classes(tasks)
    policy = cls["policy"]
    demand = np.clip(tasks["duty"].to_numpy().astype(np.float64) / 100.0, 0.0, 1.0)
    share = np.zeros(len(tasks))
    left = float(ncpus)
    dl = policy == "deadline"
    if dl.any():
        period = np.where(cls["dl_period_ms"] > 0, cls["dl_period_ms"], 1.0)
        share[dl] = np.minimum(demand[dl], cls["dl_runtime_ms"][dl] / period[dl])
        left = max(0.0, left - share[dl].sum())
    rt = np.isin(policy, ("fifo", "rr"))
    if rt.any():
        cap = 1.0 if rt_share is None else rt_share
        rt_left = min(left, cap * ncpus)
        for prio in sorted(set(cls["rt_priority"][rt].tolist()), reverse=True):
            level = rt & (cls["rt_priority"] == prio)
            share[level] = fair_shares(np.ones(int(level.sum())), np.minimum(demand[level], cap),
                                       rt_left)
            rt_left -= share[level].sum()
        left = max(0.0, left - share[rt].sum())
    fair = np.isin(policy, ("other", "batch", "idle"))
    if fair.any():
        share[fair] = fair_shares(class_weight(tasks["nice"].to_numpy(), policy)[fair],
                                  demand[fair], left)
    return share


def df_task_share(runs: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                  t_end: int, rt_share: float | None = None) -> pd.DataFrame:
    """Each experiment task's CPU time in [t0, t_end] against its fair share.

    Needs: a runs table (:func:`df_runs`) and ``tasks`` (nice, duty, and the scheduling class
    where the table has it). Fair share is :func:`class_fair_shares` on P = len(cpus) CPUs: for
    tasks of the fair classes alone, :func:`fair_shares` with weights = :func:`nice_to_weight`
    (kernel table) and demand = duty/100. ``rt_share``: RT throttling's share of each CPU (the
    manifest's ``sched``), for real-time tasks.

    Columns (one row per task, in ``tasks`` order): :data:`harmony.analysis.tables.SHARES`.
    """
    tp = _pids(tasks)
    ns = _run_time(runs, tp, int(t0), int(t_end))
    wall = (int(t_end) - int(t0)) / NS
    nice = tasks["nice"].to_numpy().astype(np.int64)
    policy = task_classes(tasks)["policy"]
    weight = class_weight(nice, policy)
    demand = tasks["duty"].to_numpy().astype(np.float64) / 100.0
    fair = class_fair_shares(tasks, len(set(cpus)), rt_share)
    share = ns / NS / wall if wall > 0 else np.full(len(tp), np.nan)
    name, role = _task_info(tp, tasks)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(fair > 0, share / np.where(fair > 0, fair, 1.0), np.nan)
    return tables.SHARES.frame({
        "pid": tp, "name": name, "role": role, "nice": nice, "weight": weight,
        "policy": pd.Categorical(policy.astype(str), categories=sorted(set(policy.tolist()))),
        "demand": demand,
        "cpu_time": ns / NS, "share": share, "fair": fair, "ratio": ratio,
    })
