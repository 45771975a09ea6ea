"""Why each task moved: the cause of every migration, told from the events around it.

Needs events: sched_migrate_task, sched_switch (every task's), sched_waking, sched_wakeup,
sched_wakeup_new (the state machine's, :mod:`harmony.analysis.taskstate`); and, where recorded,
``irq:softirq_entry`` / ``irq:softirq_exit`` of the scheduler's softirq (vector 7) and
``sched_move_numa`` / ``sched_swap_numa`` (:data:`harmony.probes.schema.CAUSE_EVENTS`).

The kernel calls ``set_task_cpu`` (hence ``sched_migrate_task``) from a handful of paths, each
leaving its own mark in the trace:

==========  ========================================================================================
cause       evidence
==========  ========================================================================================
wakeup      the task was asleep and its next record is its sched_wakeup: the CPU was chosen as it
            woke (``select_task_rq`` in ``try_to_wake_up``, between sched_waking and sched_wakeup)
fork        the task was asleep (new) and its next record is its sched_wakeup_new: placement at fork
numa        a sched_move_numa / sched_swap_numa of the task since its previous record
active      moved while runnable by the ``migration/N`` stopper of its CPU, off that CPU, the
            stopper woken from inside the scheduler's softirq (``load_balance`` kicking an
            active balance)
affinity    moved while runnable by the stopper woken outside any softirq from a CPU that is not the
            destination, or by another task's context on a CPU that is not the destination:
            ``set_cpus_allowed`` (sched_setaffinity, a cpuset's change) moving it away, or the
            stopper's other callers (exec placement)
periodic    moved while runnable inside a SCHED softirq: pulled by the destination CPU in its
            periodic balance, or by the idle-load-balance CPU on behalf of an idle destination
            (the nohz idle balance, ``_nohz_idle_balance`` -> ``sched_balance_domains``)
newidle     pulled while runnable by the destination CPU outside a softirq (in any task's
            context, its stopper's as it leaves the CPU too), whose next switch
            (within :data:`~harmony.analysis.thresholds.NEWIDLE_SWITCH_WITHIN_NS`) switches out
            the pulling context asleep or idle: the new-idle balance of ``__schedule``
unknown     anything the evidence does not decide: no record after an asleep move, the softirq not
            recorded (periodic and new-idle pulls look alike from an idle CPU), a real-time or
            deadline task's runnable move (push/pull), a stopper whose wake-up was not seen, or
            one woken outside a softirq from the destination (a new-idle balance's active push
            and an affinity change made there look alike)
==========  ========================================================================================

A task the trace shows asleep may still be queued for the kernel: EEVDF's delayed dequeue (Linux
6.12 on) keeps a task that goes to sleep with lag on its run queue until it is picked or woken,
and the balancer may move it meanwhile (``detach_tasks`` counts the move in ``lb_gained``; its
wake-up, ``ttwu_runnable``, then records sched_waking and sched_wakeup with no placement). Such a
move (no sched_waking of the task pending on the move's CPU: :func:`queued_asleep`) is told by
its context like a runnable task's, not taken for the wake-up's placement its next record would
suggest.

A cause is never guessed: without the softirq events (an import, an older run, a kernel without
them) runnable pulls are ``unknown`` except by the stopper or the NUMA balancer.

Moves a probe did not record but the task's own events prove (:func:`unrecorded_moves`) enter
the migrations table flagged ``inferred``; their cause is ``wakeup`` / ``fork`` when the placement
that proves them is the wake-up that followed the task's own sched_waking (the wake-up chose
the CPU), else ``unknown``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis import taskstate as ts_
from harmony.analysis.arrays import (
    TABLE_KEYS_MAX,
    LastResult,
    event_kinds,
    event_mask,
    growing_windows,
    in_set,
    index_of,
    key_table,
    sorted_unique,
)
from harmony.analysis.thresholds import NEWIDLE_SWITCH_WITHIN_NS
from harmony.core.jit import use_compiled
from harmony.probes.schema import SCHED_SOFTIRQ_VEC
from harmony.workload.tasks import (
    FAIR_POLICIES,  # balanced by load_balance (rt, dl: pushed and pulled)
)

#: the causes, in the order of the migrations table's ``cause`` categories
CAUSES = ("wakeup", "fork", "newidle", "periodic", "active", "affinity", "numa", "unknown")
(WAKEUP, FORK, NEWIDLE, PERIODIC, ACTIVE, AFFINITY, NUMA, UNKNOWN) = range(len(CAUSES))
#: the causes of a load balance's own decision (the card's "how many" counts these rounds)
BALANCE_CAUSES = ("newidle", "periodic", "active")

SOFTIRQ_ENTRY, SOFTIRQ_EXIT = "irq:softirq_entry", "irq:softirq_exit"
NUMA_EVENTS = ("sched_move_numa", "sched_swap_numa")
#: the comm of a CPU's stopper thread (kernel/stop_machine.c): "migration/<cpu>"
STOPPER_PREFIX = "migration/"


def softirq_recorded(events: pd.DataFrame) -> bool:
    """Whether the trace holds the scheduler's softirq entries (a probe that records them)."""
    m = event_mask(events, SOFTIRQ_ENTRY)
    return bool(m.any() and (events["prio"].to_numpy()[m] == SCHED_SOFTIRQ_VEC).any())


def in_sched_softirq(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Whether each of the event ``rows`` lies inside a SCHED softirq on its own CPU: after an
    ``irq:softirq_entry`` of vector 7 on that CPU with no ``irq:softirq_exit`` of it since (rows
    are in time order, one CPU's events in the order they happened)."""
    rows = np.asarray(rows, np.int64)
    out = np.zeros(len(rows), bool)
    vec = events["prio"].to_numpy()
    ent = np.flatnonzero(event_mask(events, SOFTIRQ_ENTRY) & (vec == SCHED_SOFTIRQ_VEC))
    ext = np.flatnonzero(event_mask(events, SOFTIRQ_EXIT) & (vec == SCHED_SOFTIRQ_VEC))
    if not len(ent) or not len(rows):
        return out
    cpu = events["cpu"].to_numpy()
    for c in np.unique(cpu[rows]):
        # each CPU's entries and exits, after a -1 standing for "none yet"
        e, x = np.r_[-1, ent[cpu[ent] == c]], np.r_[-1, ext[cpu[ext] == c]]
        mine = np.flatnonzero(cpu[rows] == c)
        r = rows[mine]
        last_in = e[np.searchsorted(e, r, side="left") - 1]     # the last entry before the row
        last_out = x[np.searchsorted(x, r, side="left") - 1]
        out[mine] = last_in > last_out
    return out


#: the rows :func:`_comms` reads first, then 4x as many at a time, at most COMMS_WINDOW_MOST: the
#: pids asked about (those of the moves' callers) are usually named by the first switches, and a
#: pass over a 10 M-event table at once grew the heap by 128 MB there (its look-up's temporaries
#: and the rows of every switch naming one of them)
COMMS_WINDOW = 1 << 16
COMMS_WINDOW_MOST = 1 << 20


def _comms(events: pd.DataFrame, pids: np.ndarray) -> dict[int, str]:
    """The comm of each of ``pids`` the switches give it: the prev_comm of the first switch away
    from it, else the next_comm of the first switch to it."""
    sw = event_mask(events, "sched_switch")
    out = {}
    for col, ccol in (("pid", "comm"), ("prev_pid", "prev_comm")):
        p = events[col].to_numpy()
        left = np.asarray(pids)
        for lo, hi in growing_windows(0, len(p), COMMS_WINDOW, COMMS_WINDOW_MOST):
            rows = lo + np.flatnonzero(sw[lo:hi] & in_set(p[lo:hi], left))
            if len(rows):
                u, first = np.unique(p[rows], return_index=True)
                comm = events[ccol].iloc[rows[first]].astype(str).tolist()
                out.update({int(k): c for k, c in zip(u, comm)})
                left = left[~in_set(left, u)]
                if not len(left):
                    break
    return out


def _last_before(key_rows: np.ndarray, key_vals: np.ndarray, vals: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    """For each (vals[i], rows[i]): the last of ``key_rows`` before rows[i] whose key is vals[i]
    (-1 if none). ``key_rows`` ascending; ``key_vals`` integers (pids) read in their own type.

    The keys asked about are few (the tasks that moved): each key row's position among them
    (:func:`index_of`, a gather), a stable sort of those small positions (numpy's radix sort of
    16-bit integers: no comparison sort of millions of rows) and one binary search of every
    question at once, as (position, row) pairs sorted as one 64-bit number."""
    out = np.full(len(rows), -1, np.int64)
    if not len(key_rows) or not len(rows):
        return out
    want = sorted_unique(np.asarray(vals, np.int64))
    k = index_of(key_vals, want, dtype=np.int16 if len(want) < 1 << 15 else np.int32)
    mine = np.flatnonzero(k >= 0)
    k = k[mine]
    order = np.argsort(k, kind="stable")
    span = np.int64(max(int(key_rows[-1]), int(np.max(rows))) + 1)
    kr = np.asarray(key_rows, np.int64)[mine][order]
    pair = k[order].astype(np.int64) * span + kr           # ascending: by position, then row
    ask = np.searchsorted(want, vals).astype(np.int64)
    j = np.searchsorted(pair, ask * span + np.asarray(rows, np.int64), side="left") - 1
    hit = j >= 0
    hit[hit] = (pair[j[hit]] // span) == ask[hit]
    out[hit] = kr[j[hit]]
    return out


def _neighbours(records: pd.DataFrame, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(next record's kind, previous record's events row) of each record ``sel``: -1 where the
    task has none."""
    rec_pid = records["pid"].to_numpy()
    seq = records["seq"].to_numpy()
    nxt = sel + 1
    has_next = nxt < len(records)
    has_next[has_next] = rec_pid[nxt[has_next]] == rec_pid[sel[has_next]]
    nrec = np.where(has_next, records["record"].to_numpy()[np.minimum(nxt, len(records) - 1)], -1)
    prv = sel - 1
    has_prev = prv >= 0
    has_prev[has_prev] = rec_pid[prv[has_prev]] == rec_pid[sel[has_prev]]
    prev_row = np.where(has_prev, seq[np.maximum(prv, 0)] // 2, -1)
    return nrec, prev_row


def queued_asleep(events: pd.DataFrame, records: pd.DataFrame, sel: np.ndarray) -> np.ndarray:
    """Which migrate records ``sel`` (as in :func:`migration_causes`) moved a task the trace shows
    asleep but that the kernel still held queued: EEVDF's delayed dequeue (Linux 6.12 on,
    ``DELAY_DEQUEUE``) leaves a task that goes to sleep with lag on its run queue, where
    ``sched_balance_rq`` (``detach_tasks``, which counts the move in ``lb_gained``), an active
    balance or an affinity change may move it; its later wake-up (``ttwu_runnable``) then
    records sched_waking and sched_wakeup with no placement.

    A wake-up's own placement is made by ``try_to_wake_up`` after its sched_waking, on the same
    CPU, in one section with interrupts off, before its sched_wakeup: so an asleep move is a
    placement only when the task's last sched_waking before it was recorded on the move's CPU
    and is still pending (no sched_wakeup and no switch-in of the task since). That waking may
    come before the task's switch-out: a task woken as it goes to sleep is placed once it is
    off its CPU (seen in a 6.12 guest, 10 ms later under TCG). A forked task's placement, with
    no sched_waking, is not judged, nor a move of a task with no wake-up in the trace before it
    (a trace that begins as the task goes to sleep). All False where the trace holds no
    sched_waking (nothing tells them apart then)."""
    out = np.zeros(len(sel), bool)
    if not len(sel) or not event_mask(events, "sched_waking").any():
        return out
    asleep = ~records["runnable_before"].to_numpy()[sel]
    nrec, _ = _neighbours(records, sel)
    todo = np.flatnonzero(asleep & (nrec != ts_.WAKEUP_NEW))
    if not len(todo):
        return out
    row = (records["seq"].to_numpy()[sel[todo]] // 2).astype(np.int64)
    pid = records["pid"].to_numpy()[sel[todo]].astype(np.int64)
    waking, wakeup, switch_in = last_wakes(events, pid, row)
    # the task's last wake-up that completed: its sched_wakeup, or its switch-in (pid: the task
    # switched in), should the sched_wakeup have fired where the probe is blind
    completed = np.maximum(wakeup, switch_in)
    pending = (waking >= 0) & (waking > completed)
    cpu = events["cpu"].to_numpy()
    placed = pending & (cpu[np.maximum(waking, 0)] == cpu[row])
    # no wake-up of the task in the trace before the move, pending or completed (a trace that
    # begins as it goes to sleep): nothing tells, the move is left to the next record
    out[todo] = ~placed & (pending | (completed >= 0))
    return out


#: the events :func:`last_wakes` finds, in the order it returns them; each keyed by its pid column
#: (the task woken, or switched in)
WAKES = ("sched_waking", "sched_wakeup", "sched_switch")


def last_wakes(events: pd.DataFrame, pid: np.ndarray, row: np.ndarray) -> list[np.ndarray]:
    """For each task ``pid[i]`` and events row ``row[i]``: the task's last sched_waking, its last
    sched_wakeup and its last switch-in before that row (each -1 if none). On large traces one
    compiled pass (:func:`harmony.analysis.causes_jit.last_rows`), else three searches
    (:func:`_last_before`): the same rows."""
    if use_compiled(len(events), JIT_MIN_EVENTS) and len(row):
        want = sorted_unique(pid)
        if int(want.min()) >= 0 and int(want.max()) < TABLE_KEYS_MAX:
            from harmony.analysis import causes_jit  # the compiled kernels: only on this path
            codes, lut = event_kinds(events, {name: k for k, name in enumerate(WAKES)})
            order = np.argsort(row, kind="stable")
            out = np.full((len(WAKES), len(row)), -1, np.int64)
            causes_jit.last_rows(codes, lut, events["pid"].to_numpy(), key_table(want, np.int32),
                                 row[order], index_of(pid[order], want), out)
            found = np.empty_like(out)
            found[:, order] = out
            return list(found)
    pid_col = events["pid"].to_numpy()

    def last(name):
        rows = np.flatnonzero(event_mask(events, name))
        return _last_before(rows, pid_col[rows], pid, row)
    return [last(name) for name in WAKES]


def migration_causes(events: pd.DataFrame, records: pd.DataFrame, sel: np.ndarray,
                     policy_of_pid: dict[int, str] | None = None) -> np.ndarray:
    """The cause (index into :data:`CAUSES`) of each migrate record ``sel`` (positions in
    ``records``, a :func:`harmony.analysis.taskstate.task_records` table, sorted by (pid, seq)).
    A move of a task asleep in the trace but queued for the kernel (:func:`queued_asleep`) is
    told by its context, as a runnable task's is."""
    n = len(sel)
    cause = np.full(n, UNKNOWN, np.int8)
    if not n:
        return cause
    seq = records["seq"].to_numpy()
    row = (seq[sel] // 2).astype(np.int64)
    pid = records["pid"].to_numpy()[sel].astype(np.int64)
    nrec, prev_row = _neighbours(records, sel)
    queued = queued_asleep(events, records, sel)
    runnable = records["runnable_before"].to_numpy()[sel] | queued

    asleep = ~runnable
    cause[asleep & (nrec == ts_.WAKEUP)] = WAKEUP
    cause[asleep & (nrec == ts_.WAKEUP_NEW)] = FORK

    # the NUMA balancer names its moves just before making them
    nm = np.flatnonzero(event_mask(events, *NUMA_EVENTS))
    if len(nm):
        for col in ("pid", "prev_pid"):         # swap_numa: both tasks
            p = events[col].to_numpy()[nm].astype(np.int64)
            last = _last_before(nm, p, pid, row)
            cause[(last >= 0) & (last > prev_row)] = NUMA

    todo = runnable & (cause == UNKNOWN)
    if not todo.any():
        return cause
    cpu = events["cpu"].to_numpy()         # as it is (int16): widened where read, not whole
    cpid = events["common_pid"].to_numpy()[row].astype(np.int64)
    ecpu = cpu[row].astype(np.int64)
    dst = events["target_cpu"].to_numpy()[row].astype(np.int64)
    fair = np.ones(n, bool)
    if policy_of_pid is not None:
        fair = np.array([policy_of_pid.get(int(p), "other") in FAIR_POLICIES for p in pid])
    softirq = softirq_recorded(events)
    comms = _comms(events, np.unique(cpid[todo]))
    stopper = np.array([comms.get(int(c), "").startswith(STOPPER_PREFIX) for c in cpid])

    # the stopper pushes a task off its own CPU (an active balance, an affinity change): who woke
    # it says why. A move onto its CPU in its context is no push but a pull made as the stopper,
    # its work done, leaves the CPU (the new-idle balance of its __schedule): told below as any
    # pull (a 6.12 guest's domains counted it new-idle where this had said active)
    pushed = stopper & (ecpu != dst)
    st = np.flatnonzero(todo & pushed)
    if len(st):
        wk = np.flatnonzero(event_mask(events, "sched_waking", "sched_wakeup"))
        woke = _last_before(wk, events["pid"].to_numpy()[wk], cpid[st], row[st])
        seen = woke >= 0
        in_sirq = np.zeros(len(st), bool)
        in_sirq[seen] = in_sched_softirq(events, woke[seen])
        cause[st[seen & in_sirq]] = ACTIVE
        if softirq:
            # woken outside a softirq: an affinity change, unless it was woken from the move's
            # destination, where a new-idle balance (in __schedule, no softirq) kicks an active
            # push to itself too (the stopper's push_cpu is the balancing CPU): that, or an
            # affinity change made there, the trace cannot tell apart -- unknown
            wkg = np.flatnonzero(event_mask(events, "sched_waking"))
            by = _last_before(wkg, events["pid"].to_numpy()[wkg], cpid[st],
                              row[st])
            elsewhere = (by >= 0) & (cpu[np.maximum(by, 0)] != dst[st])
            cause[st[seen & ~in_sirq & elsewhere]] = AFFINITY

    if not softirq:
        return cause
    other = np.flatnonzero(todo & ~pushed & fair)
    if not len(other):
        return cause
    in_sirq = in_sched_softirq(events, row[other])
    pulled = ecpu[other] == dst[other]
    cause[other[in_sirq]] = PERIODIC        # pulled, or by the nohz balancer for another CPU
    cause[other[~pulled & ~in_sirq]] = AFFINITY
    # a pull outside the softirq: new-idle if the CPU's next switch puts the puller to sleep
    cand = other[pulled & ~in_sirq]
    if len(cand):
        sw = np.flatnonzero(event_mask(events, "sched_switch"))
        sw_cpu = cpu[sw]
        prev_pid = events["prev_pid"].to_numpy()
        prev_state = events["prev_state"].to_numpy()
        ts = events["ts"].to_numpy()
        for c in np.unique(ecpu[cand]):
            mine = cand[ecpu[cand] == c]
            s = sw[sw_cpu == c]
            k = np.searchsorted(s, row[mine], side="right")
            ok = k < len(s)
            nxt_sw = s[np.minimum(k, len(s) - 1)] if len(s) else np.zeros(len(mine), np.int64)
            ok &= prev_pid[nxt_sw] == cpid[mine]
            ok &= (prev_state[nxt_sw] != 0) | (cpid[mine] == 0)
            ok &= ts[nxt_sw] - ts[row[mine]] <= NEWIDLE_SWITCH_WITHIN_NS
            cause[mine[ok]] = NEWIDLE
    return cause


def df_all_moves(events: pd.DataFrame) -> pd.DataFrame:
    """Every task's recorded move to another CPU, not only an experiment's: what the kernel's
    machine-wide counters of balance moves count (:func:`harmony.analysis.counters.
    schedstat_agreement`). A task with a real-time or deadline priority (prio < 100 in its
    sched_migrate_task) is not balanced by load_balance.

    Needs events: those of :func:`migration_causes`, every task's. Columns: ts, pid, src_cpu,
    dst_cpu (int64), cause (category of :data:`CAUSES`), rt (bool: the task had a real-time or
    deadline priority as it moved), in time order."""
    mg = event_mask(events, "sched_migrate_task")
    pid_col = events["pid"].to_numpy()
    pids = sorted_unique(pid_col[mg])
    pids = pids[pids > 0]
    r = ts_.task_records(events, pids)
    rec = r["record"].to_numpy()
    sel = np.flatnonzero((rec == ts_.MIGRATE)
                         & (r["orig_cpu"].to_numpy() != r["dest_cpu"].to_numpy()))
    sel = sel[np.argsort(r["seq"].to_numpy()[sel], kind="stable")]
    prio = events["prio"].to_numpy()[(r["seq"].to_numpy()[sel] // 2).astype(np.int64)]
    cause = migration_causes(events, r, sel)
    # a task's class can change (Harmony's own threads run SCHED_FIFO while a run is measured):
    # judged move by move, a real-time or deadline task's move is no load balance's
    rt = prio < 100
    cause[rt & np.isin(cause, (PERIODIC, NEWIDLE))] = UNKNOWN
    return pd.DataFrame({
        "ts": ts_.record_ts(events, r["seq"].to_numpy()[sel]),
        "pid": r["pid"].to_numpy()[sel].astype(np.int64),
        "src_cpu": r["orig_cpu"].to_numpy()[sel].astype(np.int64),
        "dst_cpu": r["dest_cpu"].to_numpy()[sel].astype(np.int64),
        "cause": pd.Categorical.from_codes(cause, categories=list(CAUSES)), "rt": rt})


# ---------------------------------------------------------------------------- inferred moves

def _by_task_in_time(pid: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The order sorting placements by (pid, seq), each (pid, seq) once: a stable sort by seq
    (a few sorted runs: merged, not sorted), then a stable sort by the pid's rank among the
    distinct pids (a radix sort when there are fewer than 65536)."""
    by_seq = np.argsort(seq, kind="stable")
    codes, uniq = pd.factorize(pid[by_seq])
    if len(uniq) >= 1 << 16:
        return np.argsort((pid.astype(np.int64) << 36) | seq)
    rank = np.empty(len(uniq), np.uint16)
    rank[np.argsort(uniq)] = np.arange(len(uniq), dtype=np.uint16)
    return by_seq[np.argsort(rank[codes], kind="stable")]


#: the events that place a task on a CPU (besides sched_migrate_task), by placement code
PLACED = ("sched_switch", "sched_waking", "sched_wakeup", "sched_wakeup_new")
_SWITCH, _WAKING, _WAKEUP, _WAKEUP_NEW, _MIGRATE = range(5)
_PLACEMENT = dict(zip(PLACED + ("sched_migrate_task",), range(5)))

#: the last moves found, for the same events object and pids: the migrations table and the
#: capture's blind-spot check both ask for the same tasks'
_last_moves = LastResult()

#: events from which the compiled search repays loading numba in a new process (it saves ~0.08
#: us per event against the numpy version: 0.04 against 0.86 s at 10 M events; numba's start-up
#: is ~0.5-1 s); once numba is loaded (the decoder loads it for large traces) it is used
#: whatever the size
JIT_MIN_EVENTS = 8_000_000


def unrecorded_moves(events: pd.DataFrame, pids=None) -> dict[str, np.ndarray]:
    """:func:`find_unrecorded_moves`, its last result kept for the same events object and pids
    (the arrays read-only: callers share them)."""
    key = b"all" if pids is None else sorted_unique(np.asarray(list(pids), np.int64)).tobytes()
    moves = _last_moves.get(events, key)
    if moves is None:
        moves = find_unrecorded_moves(events, pids)
        for a in moves.values():
            a.flags.writeable = False
        _last_moves.put(events, key, moves)
    return moves


def find_unrecorded_moves(events: pd.DataFrame, pids=None) -> dict[str, np.ndarray]:
    """Moves a task's own events prove but no sched_migrate_task records.

    Each task's events place it on a CPU: a sched_switch to or from it (the CPU that recorded it),
    sched_waking (its CPU before the wake-up chooses one), sched_wakeup[_new] (the chosen CPU), and
    sched_migrate_task (orig_cpu, then dest_cpu). Walking them in time order, a placement on another
    CPU than the last one, with no migration in between, is a move the stream does not hold (a
    migration whose orig_cpu is not the task's last CPU counts the same way). A placement on no
    CPU (-1) is skipped; one instant's switch places its next task before its previous one. A
    sched_wakeup_new starts a new task: what its pid did before was another task's (a pid used
    again), so it proves no move (the kernel places a new task without sched_waking or
    sched_migrate_task: a fork's choice of CPU is the reconstruction's ``fork`` cause).

    ``pids``: tasks to check (default: every task but the swappers). Returns arrays, one entry a
    move, by task then time: row (the events row of the placement that proved it), pid, ts,
    from_cpu, to_cpu, proof and before (placement codes, indices into PLACED +
    ("sched_migrate_task",), of the proving placement and of the task's placement before it).

    On large traces a compiled pass (:mod:`harmony.analysis.causes_jit`) finds them, else the
    numpy version (the same moves).
    """
    want = None if pids is None else np.asarray(list(pids), np.int64)
    if use_compiled(len(events), JIT_MIN_EVENTS):
        moves = _moves_compiled(events, want)
        if moves is not None:
            return moves
    return _moves_numpy(events, want)


def _moves_compiled(events: pd.DataFrame, want: np.ndarray | None) -> dict[str, np.ndarray] | None:
    """find_unrecorded_moves by one compiled pass; None where its look-up table of pids would be
    too large (a pid of 2**24 or more: a damaged trace's, or asked for)."""
    from harmony.analysis import causes_jit  # the compiled kernels: only on this path
    pid, prev = events["pid"].to_numpy(), events["prev_pid"].to_numpy()
    if want is None:        # every pid > 0 is a task, its own index
        top = max(int(pid.max(initial=0)), int(prev.max(initial=0)), 0)
        if top >= TABLE_KEYS_MAX:
            return None
        table = np.arange(-1, top + 1, dtype=np.int32)      # pid v at v + 1
        n_tasks = top + 1
    else:
        want = want[want > 0]
        top = int(want.max(initial=0))
        if top >= TABLE_KEYS_MAX:
            return None
        table = key_table(want, np.int32)
        n_tasks = max(1, len(want))
    codes, lut = event_kinds(events, _PLACEMENT)
    cols = (pid, prev, events["cpu"].to_numpy(), events["orig_cpu"].to_numpy(),
            events["target_cpu"].to_numpy())
    room = 4096                 # moves are rare: a second pass when there are more
    while True:
        out = (np.empty(room, np.int64), np.empty(room, np.int64), np.empty(room, np.int64),
               np.empty(room, np.int64), np.empty(room, np.int8), np.empty(room, np.int8))
        n = causes_jit.moves(codes, lut, *cols, table, n_tasks, *out)
        if n <= room:
            break
        room = n
    row, who, from_cpu, to_cpu, proof, before = (a[:n] for a in out)
    by_task = np.argsort(who, kind="stable")        # found in time order
    row = row[by_task]
    return {"row": row, "pid": who[by_task], "ts": events["ts"].to_numpy()[row].astype(np.int64),
            "from_cpu": from_cpu[by_task], "to_cpu": to_cpu[by_task], "proof": proof[by_task],
            "before": before[by_task]}


def _moves_numpy(events: pd.DataFrame, want: np.ndarray | None) -> dict[str, np.ndarray]:
    """find_unrecorded_moves by sorting every placement by (task, time): one per (task, event),
    in the events' own narrow types."""
    sw = event_mask(events, "sched_switch")
    mg = event_mask(events, "sched_migrate_task")
    cpu, tgt, ts = (events[c].to_numpy() for c in ("cpu", "target_cpu", "ts"))
    index = np.int32 if len(events) < 1 << 31 else np.int64
    # one placement per (task, event): seq (row: rows are in time order), pid, cpu_before,
    # cpu_after, placement code
    seq, pid, before, after, code = [], [], [], [], []
    for sel, pid_col, b_cpu, a_cpu, c in (
            (sw, "pid", cpu, cpu, _SWITCH), (sw, "prev_pid", cpu, cpu, _SWITCH),
            (event_mask(events, "sched_waking"), "pid", tgt, tgt, _WAKING),
            (event_mask(events, "sched_wakeup"), "pid", tgt, tgt, _WAKEUP),
            (event_mask(events, "sched_wakeup_new"), "pid", tgt, tgt, _WAKEUP_NEW),
            (mg, "pid", events["orig_cpu"].to_numpy(), tgt, _MIGRATE)):
        p = events[pid_col].to_numpy()
        keep = sel & (p > 0) & (b_cpu >= 0)
        if want is not None:
            keep &= in_set(p, want)
        i = np.flatnonzero(keep)
        seq.append(i.astype(index))
        pid.append(p[i])
        before.append(b_cpu[i])
        after.append(a_cpu[i])
        code.append(np.full(len(i), c, np.int8))
    seq, pid, before, after, code = (np.concatenate(x) for x in (seq, pid, before, after, code))
    order = _by_task_in_time(pid, seq)
    seq, pid, before, after, code = (x[order] for x in (seq, pid, before, after, code))
    same_task = np.r_[False, pid[1:] == pid[:-1]]
    hit = np.flatnonzero(same_task[1:] & (before[1:] != after[:-1])
                         & (code[1:] != _WAKEUP_NEW)) + 1
    row = seq[hit].astype(np.int64)
    return {"row": row, "pid": pid[hit].astype(np.int64), "ts": ts[row].astype(np.int64),
            "from_cpu": after[hit - 1].astype(np.int64), "to_cpu": before[hit].astype(np.int64),
            "proof": code[hit], "before": code[hit - 1]}


def inferred_causes(moves: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(cause, runnable) of each move of :func:`unrecorded_moves`: a wake-up's placement that
    follows the task's own sched_waking chose the CPU (``wakeup``, the task asleep); anything
    else is ``unknown``, the task counted runnable unless a wake-up proved the move (a
    sched_wakeup_new proves none: it starts a new task)."""
    proof, before = moves["proof"], moves["before"]
    cause = np.full(len(proof), UNKNOWN, np.int8)
    woke = before == _WAKING
    cause[woke & (proof == _WAKEUP)] = WAKEUP
    runnable = proof != _WAKEUP
    return cause, runnable


# ---------------------------------------------------------------------------- counts and figures

def cause_counts(migrations: pd.DataFrame) -> dict[str, int]:
    """Migrations by cause (every cause, 0 where none), and ``inferred``: how many of them no
    probe recorded (see the table's ``inferred``)."""
    c = migrations["cause"].astype(str).to_numpy()
    out = {k: int((c == k).sum()) for k in CAUSES}
    out["inferred"] = int(migrations["inferred"].to_numpy().sum())
    return out


def causes_over_time(migrations: pd.DataFrame, bin_s: float, t_stop: float) -> pd.DataFrame:
    """Migrations counted by cause in consecutive bins of ``bin_s`` s over [0, t_stop) after t0.

    Needs: a migrations table (its ``t`` and ``cause``). Columns: t (bin start, s since t0), then
    one int64 column per cause of :data:`CAUSES`."""
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    nb = max(1, int(np.ceil(t_stop / bin_s)))
    t = migrations["t"].to_numpy(np.float64)
    c = migrations["cause"].astype(str).to_numpy()
    inside = (t >= 0) & (t < nb * bin_s)
    k = np.minimum((t[inside] // bin_s).astype(np.int64), nb - 1)
    cc = c[inside]
    cols = {"t": np.arange(nb) * bin_s}
    for name in CAUSES:
        cols[name] = np.bincount(k[cc == name], minlength=nb)[:nb].astype(np.int64)
    return pd.DataFrame(cols)
