"""Why each task moved (harmony.analysis.causes), on hand-built event streams: one per path of the
kernel's set_task_cpu, each with the marks it leaves; moves no probe recorded, inferred."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harmony.analysis import causes
from harmony.analysis import reconstruct as rc
from harmony.analysis import thresholds as T
from harmony.analysis.event_streams import Stream

A, B, C = 101, 102, 103            # experiment tasks
STOPPER0, STOPPER1, CONTROLLER = 50, 51, 900     # migration/0, /1, a task calling sched_setaffinity
NAMES = {A: "w-a", B: "w-b", C: "w-c", STOPPER0: "migration/0", STOPPER1: "migration/1",
         CONTROLLER: "harmony"}
US = 1_000


def tasks(policy=None):
    pids = [A, B, C]
    return pd.DataFrame({"pid": np.array(pids, np.int32), "name": ["a", "b", "c"],
                         "role": ["w"] * 3, "duty": [100.0] * 3, "nice": [0] * 3,
                         "policy": [policy or "other"] * 3})


def queued_on_0(s: Stream, at: int) -> Stream:
    """A runs on CPU 0 and B waits there (it ran, then was preempted); CPU 1 runs C; the
    softirq is recorded (a SCHED softirq on CPU 1 earlier)."""
    return (s.softirq(at, 1, True).softirq(at + 1, 1, False)
             .switch(at + 2, 0, 0, 0, B).switch(at + 3, 0, B, 0, A)
             .switch(at + 4, 1, 0, 0, C))


def cause_of(s: Stream, pid: int = B, policy=None) -> list[tuple[str, bool]]:
    mig = rc.df_migrations(s.events(), tasks(policy), 0)
    mig = mig[mig["pid"] == pid]
    return list(zip(mig["cause"].astype(str), mig["inferred"]))


def test_wakeup_placement_and_fork():
    s = Stream(NAMES).switch(10, 0, 0, 0, A).switch(20, 0, A, 1, 0)    # A runs, then sleeps
    s.waking(30, 1, A, 0, common_pid=C).migrate(31, 1, A, 0, 1, common_pid=C).wakeup(32, 1, A, 1)
    s.migrate(40, 0, B, 0, 1).wakeup_new(41, 0, B, 1)                  # B placed at fork
    assert cause_of(s, A) == [("wakeup", False)]
    assert cause_of(s, B) == [("fork", False)]


def test_an_asleep_move_without_its_wakeup_is_unknown():
    s = Stream(NAMES).switch(10, 0, 0, 0, A).switch(20, 0, A, 1, 0).migrate(31, 1, A, 0, 1)
    assert cause_of(s, A) == [("unknown", False)]


def delayed_then_woken(moved_by_waker: bool) -> Stream:
    """A runs on CPU 0 and goes to sleep; CPU 1, running C, then moves it in its SCHED softirq
    (the kernel still holds it queued: EEVDF's delayed dequeue), and CPU 2's task wakes it
    where it is (ttwu_runnable: sched_waking, sched_wakeup, no placement). With
    ``moved_by_waker`` the move is instead the waker's placement, after its sched_waking."""
    s = Stream(NAMES).softirq(5, 1, True).softirq(6, 1, False)
    s.switch(10, 0, 0, 0, A).switch(20, 0, A, 1, 0).switch(21, 1, 0, 0, C)
    if moved_by_waker:
        s.waking(300, 2, A, 0, common_pid=CONTROLLER)
        s.migrate(301, 2, A, 0, 1, common_pid=CONTROLLER).wakeup(302, 2, A, 1, CONTROLLER)
    else:
        s.softirq(200, 1, True, common_pid=C).migrate(201, 1, A, 0, 1, common_pid=C)
        s.softirq(202, 1, False, common_pid=C)
        s.waking(300, 2, A, 1, common_pid=CONTROLLER).wakeup(302, 2, A, 1, CONTROLLER)
    return s.switch(400, 1, C, 0, A)


def test_a_sleeping_task_still_queued_is_moved_by_the_balance_not_its_wake_up():
    """A move of a task asleep in the trace, made before its sched_waking (or on another CPU
    than it), is no wake-up's placement, even though its next record is a sched_wakeup: the
    kernel held the task queued (delayed dequeue, Linux 6.12 on) and load_balance moved it
    (lb_gained counts it; nr_wakeups_migrate does not). Told by its context: periodic, a
    balance move; the same move made by the waker after its sched_waking is a wake-up."""
    ev = delayed_then_woken(False).events()
    mig = rc.df_migrations(ev, tasks(), 0)
    assert list(zip(mig["cause"].astype(str), mig["kind"].astype(str))) == [
        ("periodic", "balance")]
    assert causes.df_all_moves(ev)["cause"].astype(str).tolist() == ["periodic"]
    mig = rc.df_migrations(delayed_then_woken(True).events(), tasks(), 0)
    assert list(zip(mig["cause"].astype(str), mig["kind"].astype(str))) == [("wakeup", "wakeup")]


def test_a_task_woken_as_it_goes_to_sleep_is_placed_after_its_switch_out():
    """The waker on CPU 1 fires A's sched_waking while A still runs on CPU 0 (going to sleep),
    waits for it to be off its CPU, then places it on CPU 1 and wakes it: the placement follows
    A's switch-out, its sched_waking before it, pending. A wake-up (as in a 6.12 guest's trace,
    the placement 10 ms after the sched_waking under TCG)."""
    s = Stream(NAMES).softirq(5, 1, True).softirq(6, 1, False)
    s.switch(10, 0, 0, 0, A).waking(20, 1, A, 0, common_pid=C).switch(30, 0, A, 2, 0)
    s.migrate(40, 1, A, 0, 1, common_pid=C).wakeup(41, 1, A, 1, C)
    mig = rc.df_migrations(s.events(), tasks(), 0)
    assert list(zip(mig["cause"].astype(str), mig["kind"].astype(str))) == [("wakeup", "wakeup")]
    # the same move on another CPU than the pending sched_waking's is no placement of it
    s = Stream(NAMES).softirq(5, 1, True).softirq(6, 1, False)
    s.switch(10, 0, 0, 0, A).waking(20, 2, A, 0, common_pid=C).switch(30, 0, A, 2, 0)
    s.softirq(39, 1, True, common_pid=0).migrate(40, 1, A, 0, 1, common_pid=0)
    s.softirq(42, 1, False, common_pid=0).wakeup(43, 2, A, 1, C)
    mig = rc.df_migrations(s.events(), tasks(), 0)
    assert list(zip(mig["cause"].astype(str), mig["kind"].astype(str))) == [("periodic", "balance")]


def test_a_move_of_a_task_with_no_wake_up_in_the_trace_before_it_is_left_to_its_next_record():
    """A trace that begins as A goes to sleep (its sched_waking, if any, came before the trace):
    nothing says whether A's next move is a placement; its next record, a sched_wakeup, makes it
    one, as before (a 6.12 guest's trace began so, the move by the waker's CPU)."""
    s = Stream(NAMES).softirq(5, 1, True).softirq(6, 1, False).switch(10, 0, A, 2, 0)
    s.waking(15, 2, C, 2, common_pid=B)                       # another task's wake-up
    s.migrate(20, 1, A, 0, 2, common_pid=B).wakeup(30, 2, A, 2, common_pid=0)
    assert cause_of_events(s.events(), A) == [("wakeup", False)]


def test_a_sleeping_tasks_move_without_any_sched_waking_in_the_trace_stays_a_wake_up():
    """A trace without sched_waking (an import of one recorded without it) cannot tell the two
    apart: a sleeping task's move followed by its sched_wakeup is the wake-up's, as before."""
    ev = delayed_then_woken(False).events()
    ev = ev[ev["event"].astype(str) != "sched_waking"].reset_index(drop=True)
    assert cause_of_events(ev, A) == [("wakeup", False)]


def cause_of_events(ev: pd.DataFrame, pid: int) -> list[tuple[str, bool]]:
    mig = rc.df_migrations(ev, tasks(), 0)
    mig = mig[mig["pid"] == pid]
    return list(zip(mig["cause"].astype(str), mig["inferred"]))


def test_periodic_balance_inside_the_sched_softirq():
    s = queued_on_0(Stream(NAMES), 100)
    s.softirq(200, 1, True, common_pid=C).migrate(201, 1, B, 0, 1, common_pid=C)
    s.softirq(202, 1, False, common_pid=C)
    assert cause_of(s) == [("periodic", False)]


def test_nohz_idle_balance_on_behalf_of_another_cpu_is_periodic():
    """The idle-load-balance CPU runs the balance of every idle CPU in its own softirq
    (_nohz_idle_balance -> sched_balance_domains(rq of balance_cpu)): the move is recorded on
    the balancer, its destination another idle CPU."""
    s = queued_on_0(Stream(NAMES), 100)
    s.softirq(200, 1, True, common_pid=0).migrate(201, 1, B, 0, 2, common_pid=0)
    s.softirq(202, 1, False, common_pid=0)
    assert cause_of(s) == [("periodic", False)]


def test_another_softirq_vector_is_not_the_balance():
    s = queued_on_0(Stream(NAMES), 100)
    s.softirq(200, 1, True, vec=1, common_pid=C).migrate(201, 1, B, 0, 1, common_pid=C)
    s.softirq(202, 1, False, vec=1, common_pid=C)
    assert cause_of(s) == [("unknown", False)]      # not new-idle either: C does not sleep


def newidle(gap_ns: int, sleeps: bool = True) -> Stream:
    s = queued_on_0(Stream(NAMES), 100)
    s.migrate(200, 1, B, 0, 1, common_pid=C).switch(200 + gap_ns, 1, C, 1 if sleeps else 0, B)
    return s


def test_newidle_pull_precedes_the_pullers_switch_to_sleep():
    assert cause_of(newidle(500 * US)) == [("newidle", False)]
    assert cause_of(newidle(500 * US, sleeps=False)) == [("unknown", False)]


def test_newidle_from_the_idle_task():
    s = queued_on_0(Stream(NAMES), 100)
    s.switch(150, 1, C, 1, 0)                                        # CPU 1 goes idle
    s.migrate(200, 1, B, 0, 1, common_pid=0).switch(210, 1, 0, 0, B)
    assert cause_of(s) == [("newidle", False)]


NEWIDLE_CASES = [
    # (threshold, rule: its value -> the label, (below, at, above))
    ("NEWIDLE_SWITCH_WITHIN_NS", lambda v: cause_of(newidle(int(v)))[0][0],
     ("newidle", "newidle", "unknown")),
]


@pytest.mark.parametrize("name,rule,want", NEWIDLE_CASES, ids=[c[0] for c in NEWIDLE_CASES])
def test_newidle_threshold_below_at_and_above(name, rule, want):
    t = T.ALL[name]
    assert tuple(rule(v) for v in (t * 0.9, t, t * 1.1)) == want


def test_without_the_softirq_a_pull_is_unknown():
    s = Stream(NAMES).switch(102, 0, 0, 0, B).switch(103, 0, B, 0, A).switch(104, 1, 0, 0, C)
    s.migrate(200, 1, B, 0, 1, common_pid=C).switch(210, 1, C, 1, B)
    assert not causes.softirq_recorded(s.events())
    assert cause_of(s) == [("unknown", False)]


def stopper_move(woken_in_softirq: bool, waker_cpu: int = 2) -> Stream:
    s = queued_on_0(Stream(NAMES), 100)
    if woken_in_softirq:        # CPU 1's load_balance kicks an active balance from its softirq
        s.softirq(200, 1, True, common_pid=C).waking(201, 1, STOPPER0, 0, common_pid=C)
        s.softirq(202, 1, False, common_pid=C)
    else:                       # a task changes B's affinity while B runs: the stopper moves it
        s.waking(201, waker_cpu, STOPPER0, 0, common_pid=CONTROLLER)
    s.switch(210, 0, A, 0, STOPPER0).migrate(211, 0, B, 0, 1, common_pid=STOPPER0)
    return s


def test_active_balance_by_the_stopper_kicked_from_the_softirq():
    assert cause_of(stopper_move(True)) == [("active", False)]


def test_the_stopper_woken_by_a_task_is_an_affinity_change():
    assert cause_of(stopper_move(False)) == [("affinity", False)]


def test_the_stopper_woken_outside_a_softirq_from_the_destination_is_unknown():
    """A new-idle balance (in __schedule, no softirq) that finds nothing to pull kicks an active
    push to its own CPU: its stopper is woken from the destination outside any softirq, as an
    affinity change made from that CPU would be (the kernel counted such a push, alb_pushed, in
    a 6.12 guest where the trace had said affinity)."""
    assert cause_of(stopper_move(False, waker_cpu=1)) == [("unknown", False)]


def test_a_pull_as_the_stopper_leaves_its_cpu_is_new_idle():
    """CPU 0's balance kicks CPU 1's stopper, which pushes C to CPU 0; its work done, it leaves
    CPU 1 with nothing to run, and the new-idle balance of that __schedule pulls B from CPU 0 in
    the stopper's context: a new-idle pull, not a second active push (a 6.12 guest's domains
    counted it new-idle: bench/README.md, "2llc")."""
    s = queued_on_0(Stream(NAMES), 100)
    s.softirq(200, 0, True, common_pid=A).waking(201, 0, STOPPER1, 1, common_pid=A)
    s.softirq(202, 0, False, common_pid=A)
    s.switch(210, 1, C, 0, STOPPER1).migrate(211, 1, C, 1, 0, common_pid=STOPPER1)
    s.migrate(215, 1, B, 0, 1, common_pid=STOPPER1).switch(220, 1, STOPPER1, 1, B)
    assert cause_of(s, C) == [("active", False)]
    assert cause_of(s, B) == [("newidle", False)]


def test_a_queued_task_moved_away_by_another_task_is_an_affinity_change():
    s = queued_on_0(Stream(NAMES), 100)
    s.migrate(200, 0, B, 0, 1, common_pid=A)            # A, on CPU 0, sets B's affinity to 1
    assert cause_of(s) == [("affinity", False)]


def test_numa_balancing_names_its_moves():
    s = queued_on_0(Stream(NAMES), 100)
    s.move_numa(200, 0, B, 0, 1).switch(210, 0, A, 0, STOPPER0)
    s.migrate(211, 0, B, 0, 1, common_pid=STOPPER0)
    assert cause_of(s) == [("numa", False)]


def test_a_real_time_tasks_pull_is_not_told():
    s = queued_on_0(Stream(NAMES), 100)
    s.softirq(200, 1, True, common_pid=C).migrate(201, 1, B, 0, 1, common_pid=C)
    s.softirq(202, 1, False, common_pid=C)
    assert cause_of(s, policy="fifo") == [("unknown", False)]


def test_moves_no_probe_recorded_are_inferred():
    s = Stream(NAMES).switch(10, 0, 0, 0, A).switch(20, 0, A, 1, 0)
    s.waking(30, 1, A, 0).wakeup(32, 1, A, 1)                    # its migrate was not recorded
    s.switch(40, 1, 0, 0, A).switch(50, 1, A, 0, 0)               # runnable on CPU 1 ...
    s.switch(60, 0, 0, 0, A)                                      # ... runs on CPU 0: moved
    mig = rc.df_migrations(s.events(), tasks(), 0)
    got = mig[["ts", "src_cpu", "dst_cpu", "kind", "cause", "inferred"]].astype(
        {"kind": str, "cause": str}).values.tolist()
    assert got == [[32, 0, 1, "wakeup", "wakeup", True], [60, 1, 0, "balance", "unknown", True]]
    assert mig.attrs["inferred"] == 2
    counts = causes.cause_counts(mig)
    assert counts["inferred"] == 2 and sum(counts[c] for c in causes.CAUSES) == len(mig)


def test_the_moves_found_are_kept_for_the_same_events_and_pids_only():
    """unrecorded_moves keeps its last result (read-only: callers share it) for the next call
    about the same events object and pids, and drops it with that object."""
    import gc
    import weakref
    s = Stream(NAMES).switch(10, 0, 0, 0, A).switch(20, 0, A, 1, 0).switch(40, 1, 0, 0, A)
    ev = s.events()
    moves = causes.unrecorded_moves(ev, [A, B])
    assert len(moves["pid"]) == 1 and not moves["pid"].flags.writeable
    assert causes.unrecorded_moves(ev, [B, A]) is moves
    assert causes.unrecorded_moves(ev, [B]) is not moves
    assert causes.unrecorded_moves(ev.copy(), [A, B]) is not moves
    again = causes.unrecorded_moves(ev, [A, B])
    assert again is not moves and all(np.array_equal(again[k], moves[k]) for k in moves)
    kept = weakref.ref(again["pid"])
    del ev, moves, again
    gc.collect()
    assert causes._last_moves.value() is None and kept() is None


def test_causes_over_time_add_up():
    s = stopper_move(True)
    s.migrate(5_000_000, 1, B, 1, 0, common_pid=0).wakeup_new(5_000_001, 1, B, 0)
    mig = rc.df_migrations(s.events(), tasks(), 0)
    over = causes.causes_over_time(mig, 0.001, 0.01)
    assert list(over.columns) == ["t", *causes.CAUSES]
    assert over[list(causes.CAUSES)].to_numpy().sum() == len(mig) == 2
    assert over.loc[0, "active"] == 1


def test_the_table_declares_its_causes():
    mig = rc.df_migrations(stopper_move(True).events(), tasks(), 0)
    rc.tables.MIGRATIONS.check(mig)
    assert list(mig["cause"].cat.categories) == list(causes.CAUSES)
