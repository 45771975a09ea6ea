"""The canonical events table: what every probe returns and every analysis reads.

One row per kernel tracepoint hit, in time order; the events of one instant recorded on several
CPUs come by CPU (as the ring-buffer decoder merges them, whatever the probe). Its columns, with
their dtypes and meanings, are declared once in :data:`EVENTS` (``print(EVENTS)``); integers use
-1 for "not applicable".

The columns are as narrow as the kernel's values allow: a prio is at most 139 and a task state a
few bits (the kernel's own fields are an int and a long): at 10 M events the table takes 37
bytes an event instead of 45, held from the decode to the end of the analysis.

An imported trace that recorded sched_waking but no sched_wakeup (``perf sched record``) gets a
sched_wakeup row derived from each sched_waking (:mod:`harmony.analysis.waking`); the run's
manifest says so (``capture.derived_events``), and ``harmony export`` leaves those rows out.

Markers written to ``trace_marker`` (ftrace ``print`` events) are kept apart in a markers table
(:data:`MARKERS`).

pandas and numpy are imported where a table is built, not at the top: the controller takes the
marker texts from here, also in the guest agent (:mod:`harmony.vm.guest`), which loads neither
(each module a TCG guest imports is read over 9p).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harmony.core.columns import Table

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

SCHED_EVENTS = (
    "sched_switch",
    "sched_migrate_task",
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_waking",
    "sched_process_fork",
    "sched_process_exit",
)

#: events recorded besides SCHED_EVENTS, where the kernel has them, to tell why a task moved
#: (:mod:`harmony.analysis.causes`): (system, event, filter or None). The scheduler's softirq
#: (SCHED_SOFTIRQ, vector 7) brackets the periodic and nohz idle balance; the NUMA balancer
#: names its moves. The filter keeps the other vectors' entries and exits (timers, RCU, network:
#: most of a softirq's hits) out of the buffer; where it cannot be set, every vector is recorded
#: and the analysis keeps vector 7. In the events table they are ``irq:softirq_entry``,
#: ``irq:softirq_exit`` (the vector in ``prio``), ``sched_move_numa`` and ``sched_swap_numa``.
SCHED_SOFTIRQ_VEC = 7
CAUSE_EVENTS = (
    ("irq", "softirq_entry", f"vec == {SCHED_SOFTIRQ_VEC}"),
    ("irq", "softirq_exit", f"vec == {SCHED_SOFTIRQ_VEC}"),
    ("sched", "sched_move_numa", None),
    ("sched", "sched_swap_numa", None),
)

EVENTS = Table("events", "one row per kernel tracepoint hit, in time order (one instant's by "
                         "CPU)", [
    ("ts",         "int64",    "event time in ns on the probe's trace clock (see Capture.clock)"),
    ("cpu",        "int16",    "CPU whose buffer recorded the event (where the tracepoint fired)"),
    ("event",      "category", "tracepoint name without the sched: system, e.g. sched_switch"),
    ("common_pid", "int32",    "task that was current when the event fired"),
    ("pid",        "int32",    "the task the event is about: switch -> next_pid, "
                               "migrate/wakeup*/waking/exit -> pid, fork -> child_pid"),
    ("comm",       "category", "command name of pid (switch -> next_comm, fork -> child_comm)"),
    ("prio",       "int16",    "kernel prio of pid (switch -> next_prio: -1..139); -1 where the "
                               "event has none; irq:softirq_entry/exit -> the softirq's vector "
                               "(vec)"),
    ("prev_pid",   "int32",    "switch -> prev_pid; fork -> parent_pid; swap_numa -> dst_pid "
                               "(pid: src_pid)"),
    ("prev_comm",  "category", 'switch -> prev_comm; fork -> parent_comm; "" elsewhere'),
    ("prev_prio",  "int16",    "switch -> prev_prio"),
    ("prev_state", "int32",    'switch -> the state prev_pid left in, with the kernel\'s '
                               '"preempted" flag removed: 0 = still runnable ("R" or "R+"), else '
                               "TASK_* bits (1 = S, 2 = D)"),
    ("orig_cpu",   "int16",    "migrate -> orig_cpu; move_numa/swap_numa -> src_cpu"),
    ("target_cpu", "int16",    "migrate -> dest_cpu; wakeup/wakeup_new/waking -> target_cpu; "
                               "move_numa/swap_numa -> dst_cpu"),
])

MARKERS = Table("markers", "one row per trace marker (an ftrace print event: Harmony's t0, "
                           "released, end, and any other written to trace_marker)", [
    ("ts",   "int64", "marker time in ns on the trace clock"),
    ("cpu",  "int16", "CPU that recorded it"),
    ("pid",  "int32", "the task that wrote it"),
    ("text", "str",   "what was written, trailing newline stripped"),
])

#: the events' integer columns and their numpy dtypes (by name: numpy.dtype takes them),
#: categorical columns, all in order
INT_COLUMNS = {c.name: c.dtype for c in EVENTS.columns if c.dtype != "category"}
CATEGORY_COLUMNS = tuple(c.name for c in EVENTS.columns if c.dtype == "category")
COLUMNS = EVENTS.names
MARKER_COLUMNS = MARKERS.names

#: the markers a Harmony controller writes into every run's trace (harmony.workload.controller):
#: t0, the release instant; "released", once every task is free to move; "end", the end of the
#: window; "warm-up", where a warm release opened the gates of the still confined tasks (before t0)
MARK_T0, MARK_RELEASED, MARK_END = "harmony t0", "harmony released", "harmony end"
MARK_WARMUP = "harmony warm-up"


def make_events(columns: dict, ordered: bool = False) -> pd.DataFrame:
    """Build a canonical events table from a dict of column arrays.

    Missing integer columns are filled with -1 and missing string columns with "". Rows are
    sorted by ``ts``, and the events of one instant by ``cpu`` (a stable sort: one CPU's events
    of an instant keep the order they were given in). ``ordered``: the caller gives them in that
    order already (the ring-buffer decoder's merge does), so it is not checked.
    """
    import numpy as np
    import pandas as pd  # see the module's docstring

    n = len(next(iter(columns.values()))) if columns else 0
    out = {}
    for name in COLUMNS:
        if name in INT_COLUMNS:
            values = columns.get(name)
            out[name] = (np.full(n, -1, INT_COLUMNS[name]) if values is None
                         else np.asarray(values).astype(INT_COLUMNS[name], copy=False))
        else:
            values = columns.get(name)
            if not isinstance(values, pd.Categorical):   # one given is kept: rebuilding copies it
                values = pd.Categorical([""] * n if values is None else values)
            out[name] = values
    # copy=False keeps one block per column: consolidating them would copy the whole table
    # (half a second at 2.5 M rows) for nothing, since analyses read columns one by one
    df = pd.DataFrame(out, columns=list(COLUMNS), copy=False)
    if n and not ordered and not _in_order(out["ts"], out["cpu"]):
        df = df.iloc[np.lexsort((out["cpu"], out["ts"]))].reset_index(drop=True)
    return df


def _in_order(ts: np.ndarray, cpu: np.ndarray) -> bool:
    """Whether rows are by ts, and one instant's by cpu (numpy's check: pandas' took ~1.5x as
    long)."""
    later = ts[1:] > ts[:-1]
    if later.all():
        return True
    return bool((later | ((ts[1:] == ts[:-1]) & (cpu[1:] >= cpu[:-1]))).all())


def make_markers(ts=(), cpu=(), pid=(), text=()) -> pd.DataFrame:
    """Build a markers table (see the module docstring)."""
    import numpy as np
    import pandas as pd  # see the module's docstring

    return pd.DataFrame({
        "ts": np.asarray(ts, dtype=np.int64),
        "cpu": np.asarray(cpu, dtype=np.int16),
        "pid": np.asarray(pid, dtype=np.int32),
        "text": pd.Series(list(text), dtype=object),
    }, columns=list(MARKER_COLUMNS))


def check_events(df: pd.DataFrame) -> None:
    """Raise ValueError if ``df`` is not a canonical events table."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"events table lacks columns {missing}")
    if len(df) and not df["ts"].is_monotonic_increasing:
        raise ValueError("events table is not sorted by ts")
