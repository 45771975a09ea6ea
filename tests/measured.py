"""What a real-kernel test of an experiment holds its run to, whatever the kernel decided.

A kernel test gates on Harmony's measurement agreeing with an independent reading, never on the
scheduler's choices (HELPERS.md, "Standards"):

- the kernel's own counts: every experiment task moved and switched exactly as often in the
  trace as the kernel counted for it (/proc/PID/sched, read at the start and the end of the run:
  the manifest's ``kernel_counter_agreement``, :func:`assert_counted_by_the_kernel`);
- the values a summary states, recomputed here from the trace's own records by their definitions
  (a move is a sched_migrate_task of an experiment task to another CPU; a wake-up's placement
  one recorded inside its wake-up; a balancing round a burst of moves onto one CPU; its context
  the SCHED softirq or the CPU's stopper), not by Harmony's analysis (:func:`moves_onto`,
  :func:`bursts`).

What the kernel decided in a run (balanced or not, fair shares or not) is reported
(:func:`report_kernel_behaviour`: a warning in pytest's summary), not gated on.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from conftest import host_skip

NS = 1_000_000_000
#: the scheduler's softirq vector (kernel: SCHED_SOFTIRQ), written here, not imported
SCHED_SOFTIRQ = 7


class KernelBehaviour(UserWarning):
    """What the kernel decided in a run that a test reports without gating on it."""


def report_kernel_behaviour(what: str, held: bool, detail) -> None:
    """Say in pytest's warnings summary when a kernel-behaviour expectation ``what`` did not
    hold in this run (``detail``: the figures); never fails."""
    if not held:
        warnings.warn(KernelBehaviour(f"{what}: not so in this run ({detail})"), stacklevel=2)


def assert_counted_by_the_kernel(run, exited: int = 0) -> dict:
    """Every experiment task read at both ends of the run (all of them, but for up to ``exited``
    that left before the end read; one not yet reaped is still read) moved to another CPU and
    was switched away from exactly as often in the trace as the kernel counted for it. A run
    that lost events is the host's loss, not judged (host_skip: a failure in CI)."""
    m = run.manifest
    if m["lost_events"]:
        host_skip(f"the run lost {m['lost_events']} events: its counts are not judged")
    kc = m["kernel_counter_agreement"]
    assert len(run.tasks) - exited <= kc["tasks"] <= len(run.tasks), kc
    assert kc["migrations"]["agreeing"] == kc["switches"]["agreeing"] == kc["tasks"], kc
    return kc


def _names(events: pd.DataFrame) -> dict[int, str]:
    """Each pid's command name, from the switches that name it."""
    sw = events[events["event"].astype(str) == "sched_switch"]
    out = dict(zip(sw["prev_pid"].astype(int), sw["prev_comm"].astype(str)))
    out.update(zip(sw["pid"].astype(int), sw["comm"].astype(str)))
    return out


def _balance_context(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Whether each event row fired inside a SCHED softirq on its CPU (an
    irq:softirq_entry of vector 7 with no exit since, on that CPU) or in a CPU stopper's context
    (migration/N: an active balance), walked here row by row."""
    ev = events["event"].astype(str).to_numpy()
    cpu = events["cpu"].to_numpy()
    vec = events["prio"].to_numpy()
    cpid = events["common_pid"].to_numpy()
    stoppers = {p for p, c in _names(events).items() if c.startswith("migration/")}
    edge = np.isin(ev, ["irq:softirq_entry", "irq:softirq_exit"]) & (vec == SCHED_SOFTIRQ)
    want = np.zeros(len(ev), bool)
    want[rows] = True
    inside: dict[int, bool] = {}
    out = {}
    for i in np.flatnonzero(edge | want).tolist():      # in time order, one CPU's as it went
        if edge[i]:
            inside[int(cpu[i])] = ev[i] == "irq:softirq_entry"
        if want[i]:
            out[i] = inside.get(int(cpu[i]), False) or int(cpid[i]) in stoppers
    return np.array([out[int(r)] for r in rows], bool)


def _placements(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Whether each sched_migrate_task row is a wake-up's own placement: ``try_to_wake_up``
    records sched_waking, then (choosing the CPU) the move, then sched_wakeup, on one CPU with
    interrupts off; so a move is a placement when the task's last sched_waking before it was
    recorded on the move's CPU and its wake-up is still pending (no sched_wakeup or
    sched_wakeup_new of the task, and no switch-in of it, since). A balancer's move of a task the
    kernel held queued as it slept (EEVDF's delayed dequeue) is then no placement, as it is not.
    Walked here row by row."""
    ev = events["event"].astype(str).to_numpy()
    cpu = events["cpu"].to_numpy()
    pid = events["pid"].to_numpy()           # of a sched_switch: the task switched in
    want = np.zeros(len(ev), bool)
    want[rows] = True
    waking = ev == "sched_waking"
    done = np.isin(ev, ["sched_wakeup", "sched_wakeup_new", "sched_switch"])
    pending: dict[int, int] = {}             # pid -> the CPU of its pending sched_waking
    out = {}
    for i in np.flatnonzero(waking | done | want).tolist():      # in time order
        p = int(pid[i])
        if want[i]:
            out[i] = pending.get(p) == int(cpu[i])
        elif waking[i]:
            pending[p] = int(cpu[i])
        else:
            pending.pop(p, None)
    return np.array([out[int(r)] for r in rows], bool)


def moves_onto(run, cpu: int, t_from_s: float = 0.0, balance_only: bool = False,
               runnable_only: bool = False) -> pd.DataFrame:
    """The moves of experiment tasks onto ``cpu`` at or after ``t_from_s`` (s after t0), from
    the trace's sched_migrate_task records (orig_cpu != dest_cpu), with the moves Harmony proved
    that no probe recorded (the migrations table's ``inferred`` rows; with ``balance_only``, none
    of those, whose context is unknown). ``balance_only``: only those made in a SCHED softirq or
    by a stopper (a periodic or active balance). ``runnable_only``: none of the wake-ups' own
    placements (:func:`_placements`; of the inferred rows, those of kind ``balance``, the only
    reading of a move no probe recorded): the moves of runnable tasks. Columns: ts, t (s after
    t0), pid, src_cpu; in time order."""
    ev = run.events
    t0 = run.manifest["t0_ns"]
    mig = ((ev["event"].astype(str) == "sched_migrate_task") & ev["pid"].isin(run.tasks["pid"])
           & (ev["target_cpu"] == cpu) & (ev["orig_cpu"] != cpu))
    rows = np.flatnonzero(mig.to_numpy() & ((ev["ts"].to_numpy() - t0) / NS >= t_from_s))
    if balance_only:
        rows = rows[_balance_context(ev, rows)]
    if runnable_only:
        rows = rows[~_placements(ev, rows)]
    out = pd.DataFrame({"ts": ev["ts"].to_numpy()[rows].astype(np.int64),
                        "pid": ev["pid"].to_numpy()[rows].astype(np.int64),
                        "src_cpu": ev["orig_cpu"].to_numpy()[rows].astype(np.int64)})
    if not balance_only:
        m = run.migrations
        inf = m[m["inferred"] & (m["dst_cpu"] == cpu) & (m["t"] >= t_from_s)]
        if runnable_only:
            inf = inf[inf["kind"].astype(str) == "balance"]
        out = pd.concat([out, pd.DataFrame({"ts": inf["ts"].astype(np.int64),
                                            "pid": inf["pid"].astype(np.int64),
                                            "src_cpu": inf["src_cpu"].astype(np.int64)})])
    out = out.sort_values("ts", kind="stable").reset_index(drop=True)
    return out.assign(t=(out["ts"] - t0) / NS)


def bursts(moves: pd.DataFrame, gap_ms: float) -> list[pd.DataFrame]:
    """``moves`` (time order) cut into bursts: a gap longer than ``gap_ms`` starts the next."""
    if moves.empty:
        return []
    gap = np.diff(moves["ts"].to_numpy()) / 1e6
    starts = np.r_[0, np.flatnonzero(gap > gap_ms) + 1, len(moves)]
    return [moves.iloc[a:b] for a, b in zip(starts[:-1], starts[1:])]
