"""Wake-ups for a trace that recorded sched_waking instead of sched_wakeup.

``perf sched record`` records ``sched:sched_waking`` and not ``sched:sched_wakeup`` whenever the
kernel has the former (and users record their own sets of events). Without sched_wakeup the task
state machine (:mod:`harmony.analysis.taskstate`) sees a woken task only when it is switched in:
run queues miss the tasks waiting after a wake-up, every such switch-in counts as a repaired
contradiction, and the release spread cannot be measured.

The kernel's ``try_to_wake_up`` fires sched_waking, then, with interrupts off on the same CPU,
chooses the CPU to wake the task on (``select_task_rq``) and, if that is another CPU, moves it
there (sched_migrate_task), then queues it (sched_wakeup, target_cpu = the chosen CPU). So each
sched_waking stands for the wake-up that follows it, as ``perf sched latency`` takes it:

- if the next event recorded on the waking's CPU is a sched_migrate_task of the same task, made
  by the same current task (common_pid), that is the wake-up's placement: the wake-up comes right
  after it (its row, time and CPU), onto the CPU it moved the task to. Made by another task, it
  is not: no switch can come between the two events of one ``try_to_wake_up``, so the CPU
  switched tasks in between where the probe was blind (an idle CPU's context, some PID-1
  threads' here) and the migration moved the task once woken, queued. On this 2-CPU host that
  was the RT push of one of two SCHED_FIFO controller threads woken together on one CPU: the
  second, queued behind the first, of its priority, is pushed to the CPU running a fair task,
  39 and 147 us after its sched_waking (in 2 of the 36 recordings of 12 single-source and 24
  intrinsic-imbalance runs, 2026-11-26);
- unless that migration is a pull: a CPU left idle when the waker blocks right after the wake-up
  pulls the woken task from the CPU it was queued on (newly-idle balancing) and switches to it.
  Such a migration moves the task onto the CPU that records it and is followed there by a
  sched_switch from the waker (leaving, not runnable) to the task, nearer to that switch than to
  the sched_waking: a placement is made within the wake-up, a pull within the ``schedule()``
  just before the switch. In the 31 recordings of a ``harmony suite --quick`` on a 2-CPU VM
  (both events recorded), the 26 placements followed by such a switch came 0.4-2.7 us after
  their sched_waking and 3.6-41 us before the switch, the 23 pulls 4.3-36 us after and
  0.7-1.8 us before: of the 373 migrations right after a sched_waking, 372 were told apart
  (the other, a pull by the waker's CPU while the waker ran on, until the pulled task
  preempted it, was taken as a placement). Such a move, made by the waker's context once the
  task is queued (right after its sched_wakeup), looks like a placement without sched_wakeup,
  and is taken for one. So is the RT push that the wake-up itself makes (``task_woken_rt``) of
  a woken task queued behind a running one of its priority: 5 us after its sched_waking, 1 of
  the 1 283 migrations of those 36 recordings;
- otherwise the task is woken where it is: right after the sched_waking (its time), onto its
  target_cpu (the task's CPU when the wake-up started); but a task woken while still on its CPU,
  going to sleep, is queued once it is off it: if it was switched in (or current) just before
  the sched_waking and its switch-out to sleep is its next event, the wake-up follows that
  switch-out. Placed at the sched_waking, such a wake-up would leave the task asleep after its
  switch-out, and a pull of it then would look like a wake-up placement; which is what happens
  where the task's switch-in was not recorded (a context the probe is blind in): 1 migration of
  36 in a CI run here. Taking an earlier sched_waking of the task for its unrecorded switch-in
  instead was right there and wrong for 2 of the 15 614 migrations of a suite's 45 recordings
  (a task woken as it was about to sleep runs on, and sleeps later): not done.

A derived wake-up is a few microseconds early (sched_wakeup fires once the task is queued), so a
woken task counts as runnable from the start of its wake-up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask
from harmony.probes.schema import COLUMNS, INT_COLUMNS, make_events


def wakeups_from_waking(events: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """``events`` with a sched_wakeup row derived from each sched_waking (see the module doc), if
    it has sched_waking events and no sched_wakeup; else ``events`` itself.

    Needs events: sched_waking, sched_migrate_task, sched_switch (the next event on the waker's
    CPU tells whether the wake-up moved the task, or a pull did).

    Returns (events, what was derived): ``{}`` when nothing was, else ``{"derived": wake-ups
    derived, "placed": those a placement migration moved, "pulls": migrations right after a
    sched_waking taken as pulls, not placements, "after_switch_out": those of a task still on its
    CPU, put after its switch-out}``. The derived rows have the sched_waking's common_pid, pid,
    comm and prio; their other integer columns are -1 and prev_comm is "".
    """
    waking = np.flatnonzero(event_mask(events, "sched_waking"))
    if not len(waking) or event_mask(events, "sched_wakeup").any():
        return events, {}
    n = len(events)
    cpu = events["cpu"].to_numpy()
    pid = events["pid"].to_numpy()
    # the next event recorded on each event's CPU (-1: none): the table keeps one CPU's events
    # in the order they were recorded, so a stable sort by CPU lists each CPU's in that order
    by_cpu = np.argsort(cpu, kind="stable")
    same = cpu[by_cpu[1:]] == cpu[by_cpu[:-1]]
    nxt = np.full(n, -1, np.int64)
    nxt[by_cpu[:-1][same]] = by_cpu[1:][same]
    after = nxt[waking]
    moved = event_mask(events, "sched_migrate_task")
    mig = np.maximum(after, 0)
    current = events["common_pid"].to_numpy()
    placed = ((after >= 0) & moved[mig] & (pid[mig] == pid[waking])
              & (current[mig] == current[waking]))
    pulled = placed & _pulls(events, waking, mig, nxt)
    placed &= ~pulled
    target = events["target_cpu"].to_numpy()
    target = np.where(placed, target[mig], target[waking])     # a migration's: its dest_cpu
    # a task woken while still on its CPU (going to sleep) is queued once it is off it: after its
    # own switch-out, when that is its next event
    out = _switch_out_next(events, waking)
    at = np.where(placed, after, np.where(out >= 0, out, waking))   # each derived row follows it
    o = np.argsort(at, kind="stable")
    at, waking, target = at[o], waking[o], target[o]

    new = {c: np.full(len(at), -1, dt) for c, dt in INT_COLUMNS.items()}
    new["ts"], new["cpu"], new["target_cpu"] = events["ts"].to_numpy()[at], cpu[at], target
    for c in ("common_pid", "pid", "prio"):
        new[c] = events[c].to_numpy()[waking]
    cols = {}
    for c in COLUMNS:
        if c in INT_COLUMNS:
            cols[c] = np.insert(events[c].to_numpy(), at + 1, new[c])
            continue
        cat = events[c].astype("category").cat
        cats = list(cat.categories)
        value = {"event": "sched_wakeup", "prev_comm": ""}.get(c)
        if value is not None and value not in cats:
            cats.append(value)
        codes = cat.codes.to_numpy().astype(np.int32)
        derived = (codes[waking] if value is None else
                   np.full(len(at), cats.index(value), np.int32))
        cols[c] = pd.Categorical.from_codes(np.insert(codes, at + 1, derived), categories=cats)
    # each derived row shares the time and CPU of the row before it: the order stands
    return make_events(cols, ordered=True), {"derived": int(len(at)), "placed": int(placed.sum()),
                                             "pulls": int(pulled.sum()),
                                             "after_switch_out": int(((out >= 0) & ~placed).sum())}


def _switch_out_next(events: pd.DataFrame, waking: np.ndarray) -> np.ndarray:
    """For each sched_waking row, the row of its task's switch-out to sleep (a sched_switch with
    it as prev_pid, prev_state not 0) if the task was on its CPU when woken (its event before is
    its switch-in, or one it was current for) and that switch-out is its next event (it is not
    current for any event in between: it did not run on), else -1."""
    pid, prev, cur = (events[c].to_numpy() for c in ("pid", "prev_pid", "common_pid"))
    rows = np.arange(len(pid))
    is_switch = event_mask(events, "sched_switch")
    leaves = np.flatnonzero(is_switch)
    current = np.flatnonzero(~is_switch | (prev != cur))     # its own switch-out counts as leaving
    # every event about a task: 0 = it is the pid, 1 = it is current, 2 = it leaves (prev_pid)
    task = np.concatenate([pid, cur[current], prev[leaves]]).astype(np.int64)
    row = np.concatenate([rows, current, leaves])
    role = np.repeat(np.arange(3, dtype=np.int8), [len(pid), len(current), len(leaves)])
    o = np.lexsort((role, row, task))
    task, row, role = task[o], row[o], role[o]
    # each sched_waking among its task's events (role 0: the first of its row and task)
    key = task * (len(pid) + 1) + row
    mine = np.searchsorted(key, pid[waking].astype(np.int64) * (len(pid) + 1) + waking)
    nxt, before = np.minimum(mine + 1, len(task) - 1), np.maximum(mine - 1, 0)
    ok = (mine + 1 < len(task)) & (task[nxt] == pid[waking]) & (role[nxt] == 2)
    ok &= events["prev_state"].to_numpy()[row[nxt]] != 0
    ok &= (mine >= 1) & (task[before] == pid[waking])
    ok &= (role[before] == 1) | ((role[before] == 0) & is_switch[row[before]])
    return np.where(ok, row[nxt], -1)


def _pulls(events: pd.DataFrame, waking: np.ndarray, mig: np.ndarray,
           nxt: np.ndarray) -> np.ndarray:
    """Whether each migration ``mig`` (recorded right after the sched_waking ``waking`` of the
    same task) is a newly-idle pull rather than the wake-up's placement (see the module doc);
    ``nxt``: the next event on each event's CPU."""
    ts, cpu, pid = (events[c].to_numpy() for c in ("ts", "cpu", "pid"))
    sw = nxt[mig]
    s = np.maximum(sw, 0)
    return ((events["target_cpu"].to_numpy()[mig] == cpu[mig]) & (sw >= 0)
            & event_mask(events, "sched_switch")[s] & (pid[s] == pid[mig])
            & (events["prev_pid"].to_numpy()[s] == events["common_pid"].to_numpy()[mig])
            & (events["prev_state"].to_numpy()[s] != 0)
            & (ts[s] - ts[mig] < ts[mig] - ts[waking]))


def df_wakeup_check(events: pd.DataFrame, derived: tuple | None = None) -> pd.DataFrame:
    """The wake-ups derived from a trace's sched_waking (its sched_wakeup dropped) against the
    ones it recorded: how well :func:`wakeups_from_waking` does on a trace that has both.

    Needs events: sched_waking, sched_wakeup, sched_migrate_task, sched_switch.

    One row per derived wake-up: ts (int64 ns), pid (int64), target_cpu (int64), placed (bool:
    onto its placement migration's CPU), waking_ts (int64: its sched_waking's), rec_ts and
    rec_target_cpu (float: its task's first recorded wake-up at or after that sched_waking and
    before the task's next one; NaN where none was recorded, e.g. where the probe was blind),
    early_ns (float: rec_ts - ts; negative for one derived after the recorded one).

    ``derived``: :func:`derived_again` of ``events``, if made already (derived here otherwise).

    attrs: ``derived`` (what :func:`wakeups_from_waking` says it derived).
    """
    woken = event_mask(events, "sched_wakeup")
    got, info = derived if derived is not None else derived_again(events)
    rows = event_mask(got, "sched_wakeup")

    def pick(df: pd.DataFrame, rows: np.ndarray, col: str) -> np.ndarray:
        return df[col].to_numpy()[rows].astype(np.int64)

    mine = pd.DataFrame({"ts": pick(got, rows, "ts"), "pid": pick(got, rows, "pid"),
                         "target_cpu": pick(got, rows, "target_cpu")})
    # a placed one follows its migration (the row before it); the others their sched_waking
    mine["placed"] = event_mask(got, "sched_migrate_task")[np.flatnonzero(rows) - 1]
    waking = event_mask(events, "sched_waking")
    mine = pd.merge_asof(mine, pd.DataFrame({"waking_ts": pick(events, waking, "ts"),
                                             "pid": pick(events, waking, "pid")}),
                         left_on="ts", right_on="waking_ts", by="pid", direction="backward")
    mine = mine.sort_values("waking_ts", kind="stable").reset_index(drop=True)
    nxt = mine.groupby("pid")["waking_ts"].shift(-1).to_numpy(dtype=float)
    theirs = pd.DataFrame({"rec_ts": pick(events, woken, "ts"), "pid": pick(events, woken, "pid"),
                           "rec_target_cpu": pick(events, woken, "target_cpu")})
    out = pd.merge_asof(mine, theirs, left_on="waking_ts", right_on="rec_ts", by="pid",
                        direction="forward")
    out[["rec_ts", "rec_target_cpu"]] = out[["rec_ts", "rec_target_cpu"]].astype(float)
    late = ~(out["rec_ts"].to_numpy() < np.where(np.isnan(nxt), np.inf, nxt))
    out.loc[late, ["rec_ts", "rec_target_cpu"]] = np.nan
    out["early_ns"] = out["rec_ts"] - out["ts"]
    out = out.sort_values("ts", kind="stable").reset_index(drop=True)
    out.attrs["derived"] = info
    return out


def derived_again(events: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """:func:`wakeups_from_waking` of ``events`` without their recorded sched_wakeup: what both
    checks compare with the recorded wake-ups (derive once, pass it to both)."""
    return wakeups_from_waking(events[~event_mask(events, "sched_wakeup")].reset_index(drop=True))


def df_migration_kind_check(events: pd.DataFrame, derived: tuple | None = None) -> pd.DataFrame:
    """Every task's migrations in a trace that has both sched_waking and sched_wakeup, with their
    kind (:func:`harmony.analysis.reconstruct.df_migrations`: "wakeup" placement or "balance")
    from the recorded wake-ups and from those derived (its sched_wakeup dropped).

    Needs events: those of :func:`df_wakeup_check`, plus sched_process_exit. ``derived``: as
    for :func:`df_wakeup_check`.

    Columns: ts (int64 ns), pid (int32), src_cpu, dst_cpu (int32), kind (str: from the recorded
    wake-ups), derived_kind (str).
    """
    from harmony.analysis.reconstruct import df_migrations

    moved = events["pid"].to_numpy()[event_mask(events, "sched_migrate_task")]
    pids = np.unique(moved[moved > 0])
    tasks = pd.DataFrame({"pid": pids.astype(np.int32), "name": [str(p) for p in pids],
                          "role": "task"})
    t0 = int(events["ts"].iloc[0]) if len(events) else 0
    got = (derived if derived is not None else derived_again(events))[0]
    a, b = (m[~m["inferred"].to_numpy()] for m in (df_migrations(events, tasks, t0),
                                                     df_migrations(got, tasks, t0)))
    # the same sched_migrate_task events, in the same order
    return pd.DataFrame({"ts": a["ts"].to_numpy(), "pid": a["pid"].to_numpy(),
                         "src_cpu": a["src_cpu"].to_numpy(), "dst_cpu": a["dst_cpu"].to_numpy(),
                         "kind": a["kind"].astype(str).to_numpy(),
                         "derived_kind": b["kind"].astype(str).to_numpy()})
