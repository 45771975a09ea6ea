"""The per-task scheduling state machine, evaluated without a per-event loop.

Needs events: sched_switch, sched_wakeup, sched_wakeup_new, sched_migrate_task, sched_process_exit
(sched_waking and sched_process_fork change no state and are ignored).

Each event about an experiment task becomes one *record* (a sched_switch between two experiment
tasks gives two: the switch-out of prev, then the switch-in of next). A task's state is
``(runnable, running, cpu)``. Every record sets some of these absolutely, so the state after a
record is a per-task forward fill, which numpy does in a few passes over sorted arrays:

===================  ========  =======  ==============  ==========================================
record               runnable  running  cpu             notes
===================  ========  =======  ==============  ==========================================
wakeup               1         keep     target_cpu      waking a running task keeps it running
wakeup_new           1         0        target_cpu
switch_in            1         1        cpu of event    (sched_switch next_pid)
switch_out_runnable  1         0        cpu of event    (prev_pid, prev_state == 0: preempted)
switch_out_sleep     0         0        cpu of event    (prev_pid, prev_state != 0)
migrate              keep      0        dest_cpu        while asleep only the task's CPU changes
exit                 keep      keep     keep            the dead switch-out (X, Z) ends it
===================  ========  =======  ==============  ==========================================

Because each record sets the state it implies, a lost event is *repaired* by the next record that
contradicts it; the contradiction is counted as an anomaly (``ANOMALIES``), never dropped:

- switch_in_not_runnable: switched in while believed asleep (lost wakeup)
- switch_in_wrong_cpu: switched in on another CPU than believed (lost migration)
- switch_in_while_running: switched in while believed running (lost switch-out)
- switch_out_not_running: switched out while not believed running on that CPU (lost switch-in)
- wakeup_wrong_cpu: woken while runnable, onto another CPU than the one it is on
- wakeup_new_runnable: sched_wakeup_new of a task already runnable
- migrate_wrong_cpu: migrated from another CPU than the one it is believed on
- migrate_while_running: migrated while believed running (a lost switch-out, or clock skew)
- runnable_after_exit: switched out with prev_state 0 after its sched_process_exit, and never
  switched in again: its last switch-out, without a dead state; treated as dead. Switched in
  again, it was preempted as it exited (the kernel's exit work runs on after the tracepoint),
  no anomaly: 9 of the 10 repairs left on a guest's trace were such preemptions, until
  2026-12-06 (one dead switch-out, then a switch-in "while asleep")

State before a task's first record (the trace started while it existed) is *inferred*: runnable
if the first record that sets runnability is a switch (it was running, or queued, at trace start),
else asleep; running if it was runnable and the first record that sets running is a switch-out (a
task first seen waking was asleep, hence not running, even if a switch-out follows); CPU = the CPU
of the first record (orig_cpu for a migration, unknown = -1 for a wakeup).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from harmony.analysis.arrays import (
    TABLE_KEYS_MAX,
    LastResult,
    event_kinds,
    event_mask,
    in_set,
    key_table,
)
from harmony.core.jit import run_split, split, use_compiled

WAKEUP, WAKEUP_NEW, SWITCH_IN, SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP, MIGRATE, EXIT = range(7)
RECORDS = ("wakeup", "wakeup_new", "switch_in", "switch_out_runnable", "switch_out_sleep",
           "migrate", "exit")
ANOMALIES = ("", "switch_in_not_runnable", "switch_in_wrong_cpu", "switch_in_while_running",
             "switch_out_not_running", "wakeup_wrong_cpu", "wakeup_new_runnable",
             "migrate_wrong_cpu", "migrate_while_running", "runnable_after_exit")
_A = {name: i for i, name in enumerate(ANOMALIES)}

_EVENT_RECORD = {"sched_wakeup": WAKEUP, "sched_wakeup_new": WAKEUP_NEW,
                 "sched_migrate_task": MIGRATE, "sched_process_exit": EXIT}
#                          wakeup new  in  outR outS migr exit
_RUNNABLE_SET = np.array([1,     1,   1,  1,   0,   -1,  -1], dtype=np.int8)
_RUNNING_SET = np.array([-1,     0,   1,  0,   0,   0,   -1], dtype=np.int8)


def _grouped_ffill(values: np.ndarray, keep: int, gstart_idx: np.ndarray,
                   init: np.ndarray) -> np.ndarray:
    """Forward-fill ``values`` (``keep`` = no value) within groups; ``init`` where none yet.

    ``gstart_idx[i]`` is the index of the first record of i's group; ``init`` is per record.
    """
    n = len(values)
    idx = np.arange(n)
    last = np.maximum.accumulate(np.where(values != keep, idx, -1)) if n else idx
    ok = last >= gstart_idx
    return np.where(ok, values[np.maximum(last, 0)], init)


def _first_set_in_group(values: np.ndarray, keep: int, gstart: np.ndarray,
                        gend: np.ndarray) -> np.ndarray:
    """Per group (given by start/end index arrays): index of the first value != keep, or -1."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    idx = np.arange(n)
    nxt = np.minimum.accumulate(np.where(values != keep, idx, n)[::-1])[::-1]
    first = nxt[gstart]
    return np.where(first < gend, first, -1)


def _order_by_task_then_seq(rpid: np.ndarray, seq: np.ndarray, pidset: np.ndarray) -> np.ndarray:
    """Permutation sorting records by (pid, seq): a merge of the time-ordered parts, then a stable
    radix sort on the dense task index (much faster than lexsort on tens of millions of rows)."""
    if len(pidset) > np.iinfo(np.uint16).max:
        return np.lexsort((seq, rpid))
    by_seq = np.argsort(seq, kind="stable")  # concatenated sorted runs: near-linear merge
    dense = np.searchsorted(pidset, rpid[by_seq]).astype(np.uint16)
    return by_seq[np.argsort(dense, kind="stable")]


#: the last table built, for the same events object and pids: df_migrations, df_runqueue and
#: df_anomalies all need it, and building it is most of their cost (dropped with the events: it
#: would hold ~40 bytes per event for nothing until the next trace's)
_last = LastResult()


def release_records() -> None:
    """Drop the task records kept (:func:`task_records`) before their events table is gone: an
    analysis whose steps after the tables need none (harmony.pipeline) frees their memory for
    those steps (25 bytes a record, ~1.2 records an event: ~30 bytes an event, near the events
    table's 37 when most events are the tasks'); a later call builds them again."""
    _last.clear()


def task_records(events: pd.DataFrame, pids) -> pd.DataFrame:
    """One row per state-changing event of the tasks ``pids``, with the state around it (cached:
    a second call with the same ``events`` object and pids returns the same table).

    Needs events: sched_switch, sched_wakeup, sched_wakeup_new, sched_migrate_task,
    sched_process_exit.

    Returns a DataFrame sorted by (pid, seq) with columns:

    - seq (int32; int64 from 2**30 events on, :func:`seq_dtype`): 2 * row position in
      ``events`` (+1 for a switch-in), a total order of records
    - pid (int32), cpu (int16: CPU whose buffer recorded the event)
    - record (int8): index into ``RECORDS``
    - orig_cpu, dest_cpu (int16): migrate -> from/to; wakeup* -> dest_cpu = target_cpu; else -1
    - runnable_before, runnable_after, running_before, running_after (bool)
    - cpu_before, cpu_after (int16): the task's CPU (-1 = unknown)
    - first (bool): the task's first record (its *_before state is inferred, see module doc)
    - anomaly (int8): index into ``ANOMALIES`` (0 = none)

    A record's event is row ``seq // 2`` of ``events``: its time (:func:`record_ts`) and its
    other fields (a switch-out's prev_state, say) are read there, not copied here, and CPU
    numbers are int16, as in the events table: a trace has ~1.2 records per event, held beside
    the events through the tables' steps, whose peak they set, and faulting in their memory is
    most of this table's cost (a record is 25 bytes; 33 with a copy of its time, 63 with an
    int64 seq, int32 CPUs and copies of its time and prev_state).
    """
    key = np.unique(np.asarray(pids, dtype=np.int32)).tobytes()
    held = _last.get(events, key)
    if held is None:
        held = _last.put(events, key, _build_task_records_and_order(events, pids))
    return held[0]


def record_ts(events: pd.DataFrame, seq: np.ndarray) -> np.ndarray:
    """The times (int64 ns) of the records of ``seq`` (their ``seq`` column, or a part of it):
    their events' ``ts``."""
    return events["ts"].to_numpy()[np.asarray(seq) >> 1].astype(np.int64, copy=False)


def seq_before(events: pd.DataFrame, t, side: str = "right") -> np.ndarray:
    """The first seq of a record later than ``t`` (ns, scalar or array; ``side="left"``: at
    ``t`` or later): a record of seq s is at or before t iff s < seq_before(events, t) (before
    t, with "left"). The events table is in time order (:data:`harmony.probes.schema.EVENTS`),
    so are the records' seq: a record's time is compared without being read."""
    return 2 * np.searchsorted(events["ts"].to_numpy(), t, side).astype(np.int64)


def seq_dtype(n_events: int):
    """The ``seq`` column's type for a table of ``n_events`` events: int32 while 2 * row + 1
    fits it (the records live through the tables' steps, whose peak they set: 4 bytes a record
    is ~50 MB at 10 M events), else int64."""
    return np.int32 if 2 * n_events + 1 <= np.iinfo(np.int32).max else np.int64


def seq_rows(records: pd.DataFrame) -> np.ndarray:
    """The rows of a :func:`task_records` table in seq (time) order (its rows are by task). Known
    already for the table task_records returned last, if the compiled state machine built it."""
    held = _last.value()
    if held is not None and held[0] is records and held[1] is not None:
        return held[1]
    return np.argsort(records["seq"].to_numpy(), kind="stable")


#: events from which the compiled state machine repays loading numba in a new process
#: (it saves ~0.1 us per event); once numba is loaded (the decoder loads it for large traces)
#: it is used whatever the size
JIT_MIN_EVENTS = 8_000_000


def _compiled(n_events: int):
    """The compiled state machine (:mod:`taskstate_jit`) if :func:`harmony.core.jit.use_compiled`
    says so, else None (the numpy version runs)."""
    if not use_compiled(n_events, JIT_MIN_EVENTS):
        return None
    from harmony.analysis import taskstate_jit
    return taskstate_jit


def _build_task_records_compiled(jit, events: pd.DataFrame, pidset: np.ndarray):
    """The task_records table by the compiled state machine (the same as the numpy one); (table,
    its rows in seq order)."""
    table = key_table(pidset, np.int32)         # pid v -> its dense index at v + 1
    codes, lut = event_kinds(events, dict(_EVENT_RECORD, sched_switch=jit.SWITCH))
    room = _records_room(codes, lut, jit.SWITCH)
    index = np.int32 if room < 1 << 31 else np.int64   # row numbers: half the memory to fault in
    rows, task, rec_in = np.empty(room, index), np.empty(room, np.int32), np.empty(room, np.int8)
    m = jit.emit(codes, lut, events["pid"].to_numpy(), events["prev_pid"].to_numpy(), table,
                 rows, task, rec_in)
    del codes
    rows, task, rec_in = rows[:m], task[:m], rec_in[:m]
    # records come in seq order: a stable sort by task gives (task, seq)
    order, ends, in_seq = np.empty(m, index), np.empty(len(pidset), np.int64), np.empty(m, index)
    jit.by_task(task, len(pidset), order, ends, in_seq)
    ranges = _whole_tasks(ends, m)
    # the records' seq, pid and rec arranged in that order, then the room and the order freed
    # before the other columns are made: they never share the memory (at 4.09 M events of a
    # ping-pong the build grew the heap to 367 MB, not 437: malloc_info)
    cols = {"seq": np.empty(m, seq_dtype(len(events))), "pid": np.empty(m, np.int32)}
    rec = np.empty(m, np.int8)
    run_split(partial(_arrange, jit, (order, rows, task, rec_in, pidset, cols["seq"],
                                      cols["pid"], rec)), ranges)
    del rows, task, rec_in, order
    cols |= {"cpu": np.empty(m, np.int16), "record": rec, "orig_cpu": np.empty(m, np.int16),
             "dest_cpu": np.empty(m, np.int16),
             "runnable_before": np.empty(m, bool), "runnable_after": np.empty(m, bool),
             "running_before": np.empty(m, bool), "running_after": np.empty(m, bool),
             "cpu_before": np.empty(m, np.int16), "cpu_after": np.empty(m, np.int16),
             "first": np.empty(m, bool), "anomaly": np.empty(m, np.int8)}
    args = (cols["seq"], cols["pid"], rec, events["cpu"].to_numpy(),
            events["orig_cpu"].to_numpy(), events["target_cpu"].to_numpy(),
            events["prev_state"].to_numpy(),
            *(cols[c] for c in ("cpu", "orig_cpu", "dest_cpu", "runnable_before",
                                "runnable_after", "running_before", "running_after",
                                "cpu_before", "cpu_after", "first", "anomaly")))
    run_split(lambda lo, hi, _k: jit.walk(*args, lo, hi), ranges)
    return pd.DataFrame(cols, copy=False), in_seq


def _arrange(jit, arrays: tuple, lo: int, hi: int, _k: int) -> None:
    jit.arrange(*arrays, lo, hi)


#: events counted at a time by :func:`_records_room`
_COUNT_CHUNK = 1 << 20


def _records_room(codes: np.ndarray, lut: np.ndarray, switch: int) -> int:
    """The most records ``jit.emit`` can write: two a switch, one an event of another kind it
    reads. Not 2 a row of the events: this room lives on the heap, in memory an earlier step
    freed and the process kept (harmony.core.memory), so what is allocated is resident, written or
    not (at 10 M events 182 MB for 110 of records)."""
    n = np.zeros(len(lut), np.int64)                # events per code (a code past lut: none)
    for lo in range(0, len(codes), _COUNT_CHUNK):   # bincount copies its input as int64: a part
        part = codes[lo:lo + _COUNT_CHUNK]          # at a time (81 MB at once at 10 M events)
        part = part.view(np.uint8) if part.dtype == np.int8 else part[part >= 0]   # -1: 255
        n += np.bincount(part, minlength=len(lut))[:len(lut)]
    kind = np.asarray(lut, np.int64)
    return int(2 * n[kind == switch].sum() + n[(kind >= 0) & (kind != switch)].sum())


def _whole_tasks(ends: np.ndarray, m: int) -> list[tuple[int, int]]:
    """harmony.core.jit.split's ranges of the m records sorted by task, each cut moved to the
    nearest task boundary (``ends``: where each task's records end; a task's records are walked by
    one thread); empty ranges dropped."""
    ranges = split(m)
    if len(ranges) == 1 or not len(ends):
        return ranges
    cuts = [0] + [int(ends[np.abs(ends - hi).argmin()]) for _, hi in ranges[:-1]] + [m]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _build_task_records_and_order(events: pd.DataFrame,
                                  pids) -> tuple[pd.DataFrame, np.ndarray | None]:
    """(the task_records table, its rows in seq order if the compiled state machine built it)."""
    pidset = np.unique(np.asarray(pids, dtype=np.int32))
    jit = _compiled(len(events))
    if jit is not None and (pidset.min(initial=0) >= 0 and pidset.max(initial=0) < TABLE_KEYS_MAX):
        return _build_task_records_compiled(jit, events, pidset)
    return _build_task_records_numpy(events, pidset), None


def _build_task_records_numpy(events: pd.DataFrame, pidset: np.ndarray) -> pd.DataFrame:
    n_ev = len(events)
    pid = events["pid"].to_numpy()
    prev = events["prev_pid"].to_numpy()
    is_sw = event_mask(events, "sched_switch")
    rec_of_event = np.full(n_ev, -1, dtype=np.int8)
    for name, code in _EVENT_RECORD.items():
        rec_of_event[event_mask(events, name)] = code

    rows_out = np.flatnonzero(is_sw & in_set(prev, pidset))
    rows_in = np.flatnonzero(is_sw & in_set(pid, pidset))
    rows_ot = np.flatnonzero((rec_of_event >= 0) & in_set(pid, pidset))

    ps_all = events["prev_state"].to_numpy()
    ps_out = ps_all[rows_out]
    rec = np.concatenate([
        np.where(ps_out == 0, SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP).astype(np.int8),
        np.full(len(rows_in), SWITCH_IN, dtype=np.int8),
        rec_of_event[rows_ot],
    ])
    rows = np.concatenate([rows_out, rows_in, rows_ot])
    seq = 2 * rows.astype(np.int64)
    seq[len(rows_out):len(rows_out) + len(rows_in)] += 1
    rpid = np.concatenate([prev[rows_out], pid[rows_in], pid[rows_ot]]).astype(np.int32)

    order = _order_by_task_then_seq(rpid, seq, pidset)
    rows, seq, rpid, rec = rows[order], seq[order], rpid[order], rec[order]
    n = len(rows)
    cpu = events["cpu"].to_numpy()[rows].astype(np.int16)
    orig = np.where(rec == MIGRATE, events["orig_cpu"].to_numpy()[rows], -1).astype(np.int16)
    dest = np.where(in_set(rec, (MIGRATE, WAKEUP, WAKEUP_NEW)),
                    events["target_cpu"].to_numpy()[rows], -1).astype(np.int16)

    # groups (one per pid)
    first = np.ones(n, dtype=bool)
    first[1:] = rpid[1:] != rpid[:-1]
    gstart = np.flatnonzero(first)
    gend = np.append(gstart[1:], n)
    gid = np.cumsum(first) - 1
    gstart_idx = gstart[gid]

    # exit: a task switched out runnable after its sched_process_exit was preempted as it
    # exited if it is switched in again; if not (before a new task of its pid, wakeup_new),
    # that switch-out was its last, which leaves it not runnable whatever prev_state says (a
    # kernel that reports no dead state). Its dead switch-out (prev_state X or Z) ends the exit.
    idx = np.arange(n)
    is_out = (rec == SWITCH_OUT_RUNNABLE) | (rec == SWITCH_OUT_SLEEP)
    last_exit = np.maximum.accumulate(np.where(rec == EXIT, idx, -1)) if n else idx
    last_end = np.maximum.accumulate(np.where((rec == SWITCH_OUT_SLEEP) | (rec == WAKEUP_NEW),
                                              idx, -1)) if n else idx
    exiting_out = ((rec == SWITCH_OUT_RUNNABLE) & (last_exit >= gstart_idx)
                   & (last_exit > last_end))
    dead_runnable_out = exiting_out
    if exiting_out.any():
        # the index of each record's task's next switch-in, next wakeup_new (n: none)
        next_in, next_new = (
            np.append(np.minimum.accumulate(np.where(rec == code, idx, n)[::-1])[::-1][1:], n)
            for code in (SWITCH_IN, WAKEUP_NEW))
        switched_in_later = (next_in < gend[gid]) & (next_in < next_new)
        dead_runnable_out = exiting_out & ~switched_in_later
    del idx, last_exit, last_end

    runnable_set = _RUNNABLE_SET[rec]
    runnable_set[dead_runnable_out] = 0
    running_set = _RUNNING_SET[rec]
    cpu_set = np.where(in_set(rec, (SWITCH_IN, SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP)), cpu,
                       np.where(rec == EXIT, -1, dest)).astype(np.int16)

    # inferred state before each task's first record
    is_switch_rec = in_set(rec, (SWITCH_IN, SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP))
    f_runnable = _first_set_in_group(runnable_set, -1, gstart, gend)
    runnable_init = np.zeros(len(gstart), dtype=np.int8)
    has = f_runnable >= 0
    runnable_init[has] = is_switch_rec[f_runnable[has]]
    f_running = _first_set_in_group(running_set, -1, gstart, gend)
    running_init = np.zeros(len(gstart), dtype=np.int8)
    has = f_running >= 0
    running_init[has] = in_set(rec[f_running[has]], (SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP))
    running_init &= runnable_init  # asleep at the start means not running
    r0 = rec[gstart]
    cpu_init = np.where(is_switch_rec[gstart] | (r0 == EXIT), cpu[gstart],
                        np.where(r0 == MIGRATE, orig[gstart], -1)).astype(np.int16)

    runnable_after = _grouped_ffill(runnable_set, -1, gstart_idx, runnable_init[gid]).astype(bool)
    running_after = _grouped_ffill(running_set, -1, gstart_idx, running_init[gid]).astype(bool)
    cpu_after = _grouped_ffill(cpu_set, -1, gstart_idx, cpu_init[gid]).astype(np.int16)

    def before(after, init):
        b = np.empty_like(after)
        if n:
            b[1:] = after[:-1]
            b[gstart] = init.astype(after.dtype)
        return b

    runnable_before = before(runnable_after, runnable_init)
    running_before = before(running_after, running_init)
    cpu_before = before(cpu_after, cpu_init)

    # anomalies (later assignments take priority)
    anomaly = np.zeros(n, dtype=np.int8)
    known = cpu_before >= 0
    anomaly[(rec == WAKEUP) & runnable_before & known
            & (cpu_before != dest)] = _A["wakeup_wrong_cpu"]
    anomaly[(rec == WAKEUP_NEW) & runnable_before] = _A["wakeup_new_runnable"]
    anomaly[(rec == MIGRATE) & known & (cpu_before != orig)] = _A["migrate_wrong_cpu"]
    anomaly[(rec == MIGRATE) & running_before] = _A["migrate_while_running"]
    anomaly[is_out & ~(running_before & (cpu_before == cpu))] = _A["switch_out_not_running"]
    anomaly[dead_runnable_out] = _A["runnable_after_exit"]
    sw_in = rec == SWITCH_IN
    anomaly[sw_in & runnable_before & (cpu_before != cpu)] = _A["switch_in_wrong_cpu"]
    anomaly[sw_in & running_before] = _A["switch_in_while_running"]
    anomaly[sw_in & ~runnable_before] = _A["switch_in_not_runnable"]

    return pd.DataFrame({
        "seq": seq.astype(seq_dtype(n_ev), copy=False), "pid": rpid, "cpu": cpu,
        "record": rec,
        "orig_cpu": orig, "dest_cpu": dest,
        "runnable_before": runnable_before, "runnable_after": runnable_after,
        "running_before": running_before, "running_after": running_after,
        "cpu_before": cpu_before, "cpu_after": cpu_after,
        "first": first, "anomaly": anomaly,
    }, copy=False)
