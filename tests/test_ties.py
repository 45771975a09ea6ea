"""Hermetic tests of harmony.analysis.ties: events two CPUs stamped with one time, put in the
order the scheduler must have followed.

Each stream is written as a decoder merges it (equal timestamps CPU by CPU, the lowest first);
what order_ties gives is read back by the task state machine (analysis.taskstate, through
reconstruct.df_anomalies) and the blind-spot check (crosscheck.unrecorded_migrations), which
know nothing of ties.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harmony.analysis import trust
from harmony.analysis.crosscheck import unrecorded_migrations
from harmony.analysis.event_streams import Stream, simulate
from harmony.analysis.reconstruct import df_anomalies
from harmony.analysis.ties import order_ties
from harmony.workload.tasks import layout_tasks, tasks_frame

S_RUN, S_SLEEP = 0, 1
P, Q, OTHER = 301, 302, 900


def tasks(*pids) -> pd.DataFrame:
    specs = layout_tasks([len(pids)] + [0] * 7, list(range(8)))
    return tasks_frame(specs, list(pids))


def anomalies(events: pd.DataFrame, *pids) -> list[str]:
    return df_anomalies(events, tasks(*pids), 0)["anomaly"].tolist()


def per_cpu(events: pd.DataFrame) -> dict[int, list[tuple]]:
    """Each CPU's events in order (every column), as its ring buffer held them."""
    rows = list(events.astype(object).itertuples(index=False, name=None))
    out: dict[int, list[tuple]] = {}
    for r, c in zip(rows, events["cpu"].tolist()):
        out.setdefault(c, []).append(r)
    return out


def woken_while_switched_out() -> pd.DataFrame:
    """The guest's case: P runs on CPU 4; at one timestamp CPU 2 migrates P to itself and wakes
    it while CPU 4 switches it out to sleep (merged: CPU 2's events first); CPU 2 then runs P."""
    s = Stream({P: "p", OTHER: "other"})
    s.switch(1_000, 4, prev=0, state=S_RUN, next=P)
    s.migrate(5_000, 2, pid=P, orig=4, dest=2, common_pid=OTHER)
    s.wakeup(5_000, 2, pid=P, target=2, common_pid=OTHER)
    s.switch(5_000, 4, prev=P, state=S_SLEEP, next=0)
    s.switch(6_000, 2, prev=0, state=S_RUN, next=P)
    return s.events()


def test_a_wakeup_goes_after_the_switch_out_the_other_cpu_stamped_alike():
    events = woken_while_switched_out()
    assert anomalies(events, P), "the merged order must contradict itself, or this tests nothing"
    assert unrecorded_migrations(events, [P])["n"] > 0
    given = events.copy()
    assert anomalies(given, P)      # the task records kept for this table, in its old order
    ordered, facts = order_ties(given)
    assert ordered is given         # rows moved in place, the frame not copied
    assert anomalies(ordered, P) == []      # built again: what was kept was dropped
    assert unrecorded_migrations(ordered, [P])["n"] == 0
    assert ordered["event"].tolist()[1:4] == ["sched_switch", "sched_migrate_task",
                                              "sched_wakeup"]
    assert facts == {"pairs": 1, "groups": 1, "events": 3, "reordered": 1}
    assert per_cpu(ordered) == per_cpu(events)
    assert (ordered.dtypes == events.dtypes).all() and ordered["ts"].is_monotonic_increasing


def read_only(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` on arrays that cannot be written, as a decoder may hand them over."""
    cols = {}
    for name in events.columns:
        col = events[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy(copy=True)
            codes.flags.writeable = False
            cols[name] = pd.Categorical.from_codes(codes, dtype=col.dtype)
        else:
            values = col.to_numpy(copy=True)
            values.flags.writeable = False
            cols[name] = values
    return pd.DataFrame(cols, copy=False)


def test_columns_that_cannot_be_written_are_replaced_not_failed():
    """A perf.data's events came on read-only arrays ("assignment destination is read-only",
    and no import): such a column is replaced by a moved copy, its dtype kept."""
    probe = read_only(woken_while_switched_out())
    with pytest.raises(ValueError, match="read-only"):     # what order_ties meets
        probe.iloc[[0], 0] = probe.iloc[[1], 0].to_numpy()
    events = read_only(woken_while_switched_out())
    ordered, facts = order_ties(events)
    assert facts["reordered"] == 1 and anomalies(ordered, P) == []
    assert per_cpu(ordered) == per_cpu(woken_while_switched_out())
    assert (ordered.dtypes == woken_while_switched_out().dtypes).all()


def test_a_wakeup_goes_before_the_switch_in_the_other_cpu_stamped_alike():
    """Q asleep; at one timestamp CPU 1 switches it in and CPU 3 wakes it (merged: CPU 1 first)."""
    s = Stream({Q: "q", OTHER: "other"})
    s.switch(1_000, 1, prev=0, state=S_RUN, next=Q)
    s.switch(2_000, 1, prev=Q, state=S_SLEEP, next=0)
    s.switch(5_000, 1, prev=0, state=S_RUN, next=Q)
    s.waking(5_000, 3, pid=Q, target=1, common_pid=OTHER)
    s.wakeup(5_000, 3, pid=Q, target=1, common_pid=OTHER)
    events = s.events()
    assert anomalies(events, Q)
    ordered, facts = order_ties(events.copy())
    assert anomalies(ordered, Q) == []
    assert ordered["event"].tolist()[2:] == ["sched_waking", "sched_wakeup", "sched_switch"]
    assert facts["reordered"] == 1 and per_cpu(ordered) == per_cpu(events)


def test_a_task_switched_in_and_out_on_one_cpu_is_woken_after_its_last_switch():
    """At one timestamp CPU 5 switches P in and out to sleep, and CPU 4 wakes it and pulls it
    (merged: CPU 4 first): the wake-ups go after CPU 5's switches, the last of which put it to
    sleep."""
    s = Stream({P: "p", OTHER: "other"})
    s.switch(1_000, 5, prev=0, state=S_RUN, next=P)
    s.switch(2_000, 5, prev=P, state=S_RUN, next=OTHER)
    s.waking(5_000, 4, pid=P, target=5, common_pid=OTHER)
    s.migrate(5_000, 4, pid=P, orig=5, dest=4, common_pid=OTHER)
    s.wakeup(5_000, 4, pid=P, target=4, common_pid=OTHER)
    s.switch(5_000, 5, prev=OTHER, state=S_RUN, next=P)
    s.switch(5_000, 5, prev=P, state=S_SLEEP, next=OTHER)
    s.switch(7_000, 4, prev=0, state=S_RUN, next=P)
    events = s.events()
    assert anomalies(events, P)
    ordered, _ = order_ties(events.copy())
    assert anomalies(ordered, P) == []
    assert per_cpu(ordered) == per_cpu(events)


def test_a_clock_that_stood_still_through_a_ping_pong_is_settled_event_by_event(monkeypatch):
    """The guest's other case: CPU 3 ping-pongs P and Q at one timestamp while CPU 0 wakes Q
    twice (merged: CPU 0's events first). No rank puts Q's second wake-up between its
    switch-out and its next switch-in on CPU 3; merged event by event from what the group itself
    shows, every event follows one it needs."""
    s = Stream({P: "p", Q: "q", OTHER: "other"})
    s.switch(500, 3, prev=0, state=S_RUN, next=Q)
    s.switch(800, 3, prev=Q, state=S_SLEEP, next=P)
    for _ in range(2):
        s.waking(5_000, 0, pid=Q, target=3, common_pid=OTHER)
        s.wakeup(5_000, 0, pid=Q, target=3, common_pid=OTHER)
    s.switch(5_000, 3, prev=P, state=S_SLEEP, next=Q)
    s.wakeup(5_000, 3, pid=P, target=3, common_pid=Q)
    s.switch(5_000, 3, prev=Q, state=S_SLEEP, next=P)
    s.switch(5_000, 3, prev=P, state=S_SLEEP, next=Q)
    events = s.events()
    assert "switch_in_not_runnable" in anomalies(events, P, Q)
    from harmony.analysis import ties
    monkeypatch.setattr(ties, "SETTLE_MIN_EVENTS", 10**9)    # the ranks alone
    assert "switch_in_not_runnable" in anomalies(order_ties(events.copy())[0], P, Q)
    monkeypatch.undo()
    ordered, facts = order_ties(events.copy())
    assert anomalies(ordered, P, Q) == []
    assert per_cpu(ordered) == per_cpu(events) and facts["reordered"] == 1
    assert [(c, e) for c, e in zip(ordered["cpu"], ordered["event"])][2:] == [
        (0, "sched_waking"), (0, "sched_wakeup"), (3, "sched_switch"), (3, "sched_wakeup"),
        (3, "sched_switch"), (0, "sched_waking"), (0, "sched_wakeup"), (3, "sched_switch")]


def test_a_group_is_settled_from_the_state_its_tasks_were_in_before_it(monkeypatch):
    """The guest's third case: P and Q asleep before the group (switched out to sleep on CPU
    4); at one timestamp CPU 4 switches Q in then P, while CPU 7 wakes them (merged: CPU 4's
    events first). Within the group, nothing says they were asleep: the switch-ins seemed
    possible first, and stayed first. Known from the events before the group, they wait for
    their wake-ups; a state the last group settled carries into the next."""
    s = Stream({P: "p", Q: "q", OTHER: "other"})
    s.switch(1_000, 4, prev=0, state=S_RUN, next=P)
    s.switch(2_000, 4, prev=P, state=S_SLEEP, next=Q)
    s.switch(3_000, 4, prev=Q, state=S_SLEEP, next=0)
    for t in (5_000, 9_000):
        s.switch(t, 4, prev=0, state=S_RUN, next=Q)
        s.switch(t, 4, prev=Q, state=S_SLEEP, next=P)
        s.switch(t, 4, prev=P, state=S_SLEEP, next=0)
        for pid in (Q, P):
            s.waking(t, 7, pid=pid, target=4, common_pid=OTHER)
            s.wakeup(t, 7, pid=pid, target=4, common_pid=OTHER)
    events = s.events()
    assert "switch_in_not_runnable" in anomalies(events, P, Q)
    from harmony.analysis import ties
    monkeypatch.setattr(ties._History, "states", lambda self, p, rows: (   # the group alone
        np.full(len(p), -1), np.full(len(p), -1, np.int8), np.full(len(p), -1)))
    assert "switch_in_not_runnable" in anomalies(order_ties(events.copy())[0], P, Q)
    monkeypatch.undo()
    ordered, facts = order_ties(events.copy())
    assert anomalies(ordered, P, Q) == []
    assert per_cpu(ordered) == per_cpu(events) and facts["reordered"] == 2
    assert [(c, e[6:], p) for c, e, p in zip(ordered["cpu"], ordered["event"],
                                             ordered["pid"])][3:10] == [
        (7, "waking", Q), (7, "wakeup", Q), (4, "switch", Q), (7, "waking", P),
        (7, "wakeup", P), (4, "switch", P), (4, "switch", 0)]


def woken_and_run_by_two_cpus(first: int, then: int, was_on: int, then_from: int) -> pd.DataFrame:
    """A 6.1 guest's case: at one timestamp CPU ``first`` wakes P (asleep on ``was_on``), runs
    it until it sleeps, then CPU ``then`` wakes it from ``then_from``, runs it until it sleeps;
    merged CPU by CPU, the lowest first (``then`` < ``first``: the wrong order)."""
    s = Stream({P: "p", OTHER: "other"})
    s.switch(1_000, was_on, prev=0, state=S_RUN, next=P)
    s.switch(2_000, was_on, prev=P, state=S_SLEEP, next=0)
    for cpu, src in ((first, was_on), (then, then_from)):
        s.waking(5_000, cpu, pid=P, target=src, common_pid=OTHER)
        if src != cpu:
            s.migrate(5_000, cpu, pid=P, orig=src, dest=cpu, common_pid=OTHER)
        s.wakeup(5_000, cpu, pid=P, target=cpu, common_pid=OTHER)
        s.switch(5_000, cpu, prev=OTHER, state=S_RUN, next=P)
        s.switch(5_000, cpu, prev=P, state=S_SLEEP, next=OTHER)
    return s.events()


def test_the_cpu_a_task_was_on_says_which_wake_up_came_first():
    """CPU 5 takes P from CPU 0, CPU 1 then from CPU 5: CPU 1's wake-up, merged first, says P
    was on CPU 5, where it was not yet."""
    events = woken_and_run_by_two_cpus(first=5, then=1, was_on=0, then_from=5)
    assert "migrate_wrong_cpu" in anomalies(events, P)
    ordered, facts = order_ties(events.copy())
    assert anomalies(ordered, P) == [] and facts["reordered"] == 1
    assert per_cpu(ordered) == per_cpu(events)
    assert ordered["cpu"].tolist()[2:] == [5] * 5 + [1] * 5


def test_where_two_wake_ups_fit_alike_what_follows_decides(monkeypatch):
    """CPU 4 wakes P where it slept and runs it, CPU 1 then takes it from CPU 4: both wake-ups
    say P was on CPU 4, and CPU 1's, merged first, fits until CPU 4's wake-up finds P on CPU 1
    (a move no sched_migrate_task recorded). The merge goes back to that choice; not allowed
    to, it leaves the move unrecorded."""
    events = woken_and_run_by_two_cpus(first=4, then=1, was_on=4, then_from=4)
    assert unrecorded_migrations(events, [P])["n"] == 1
    from harmony.analysis import ties
    monkeypatch.setattr(ties, "BACKTRACK_PER_EVENT", 0)
    assert unrecorded_migrations(order_ties(events.copy())[0], [P])["n"] == 1
    monkeypatch.undo()
    ordered, facts = order_ties(events.copy())
    assert unrecorded_migrations(ordered, [P])["n"] == 0 and anomalies(ordered, P) == []
    assert per_cpu(ordered) == per_cpu(events) and facts["reordered"] == 1
    assert ordered["cpu"].tolist()[2:] == [4] * 4 + [1] * 5


def test_a_new_task_of_a_pid_is_not_held_to_the_last_one_s_state():
    """P (301) exits on CPU 3; at one timestamp a new task of its pid is forked onto CPU 1 by
    CPU 2, pulled by CPU 0, run and preempted there, and pulled again by CPU 4 (merged: CPU 0's
    events first; switched on two CPUs, no rank moves its wake-ups). Its sched_wakeup_new goes
    first whatever the dead task's state and CPU were."""
    s = Stream({P: "p", OTHER: "other"})
    s.wakeup(500, 3, pid=P, target=3)
    s.switch(1_000, 3, prev=0, state=S_RUN, next=P)
    s.exit(1_500, 3, pid=P)
    s.switch(2_000, 3, prev=P, state=16, next=0)    # X: dead
    s.migrate(5_000, 0, pid=P, orig=1, dest=0)
    s.switch(5_000, 0, prev=0, state=S_RUN, next=P)
    s.switch(5_000, 0, prev=P, state=S_RUN, next=OTHER)
    s.wakeup_new(5_000, 2, pid=P, target=1, common_pid=OTHER)
    s.migrate(5_000, 4, pid=P, orig=0, dest=4)
    s.switch(5_000, 4, prev=0, state=S_RUN, next=P)
    events = s.events()
    assert "wakeup_new_runnable" in anomalies(events, P)
    ordered, facts = order_ties(events.copy())
    assert anomalies(ordered, P) == [] and facts["reordered"] == 1
    assert ordered["cpu"].tolist()[-6:] == [2, 0, 0, 0, 4, 4]


def test_groups_without_a_switch_are_left_as_they_are():
    """Ties of wake-ups and migrations alone (a real run's: no switch among them) place
    nothing; the groups are counted, none moved."""
    s = Stream({P: "p", Q: "q", OTHER: "other"})
    s.wakeup(5_000, 0, pid=P, target=0, common_pid=OTHER)
    s.migrate(5_000, 1, pid=Q, orig=0, dest=1, common_pid=OTHER)
    s.wakeup(5_000, 1, pid=Q, target=1, common_pid=OTHER)
    events = s.events()
    ordered, facts = order_ties(events.copy())
    assert facts == {"pairs": 1, "groups": 1, "events": 3, "reordered": 0}
    assert per_cpu(ordered) == per_cpu(events)


@pytest.mark.parametrize("implementation", ["numpy", "compiled"])
def test_a_group_of_no_task_is_left_as_it_is(implementation, monkeypatch):
    """A group of three events or more naming no task (idle switches alone) has nothing to
    settle, compiled or not (the compiled pass once indexed an empty task table)."""
    from conftest import use_implementation
    use_implementation(implementation, monkeypatch)
    s = Stream({OTHER: "other"})
    s.switch(5_000, 0, prev=0, state=S_RUN, next=0)
    s.switch(5_000, 0, prev=0, state=S_RUN, next=0)
    s.switch(5_000, 1, prev=0, state=S_RUN, next=0)
    events = s.events()
    ordered, facts = order_ties(events.copy())
    assert facts == {"pairs": 1, "groups": 1, "events": 3, "reordered": 0}
    assert per_cpu(ordered) == per_cpu(events)


def test_a_trace_without_ties_across_cpus_is_returned_as_it_is():
    s = Stream({P: "p", OTHER: "other"})
    s.switch(1_000, 0, prev=0, state=S_RUN, next=P)
    s.switch(1_000, 0, prev=P, state=S_SLEEP, next=OTHER)   # one CPU: its own order
    s.wakeup(2_000, 1, pid=P, target=0, common_pid=OTHER)
    events = s.events()
    ordered, facts = order_ties(events)
    assert ordered is events
    assert facts == {"pairs": 0, "groups": 0, "events": 0, "reordered": 0}
    assert order_ties(events.iloc[:0])[0].empty


@pytest.mark.parametrize("seed,without", [(0, None), (1, None), (2, None), (3, "sched_switch"),
                                          (4, "sched_wakeup"), (5, "sched_migrate_task")])
def test_a_coarse_clock_moves_rows_only_within_their_group_and_keeps_each_cpus_order(seed,
                                                                                     without):
    """A simulated stream on 8 CPUs stamped by a clock of 20 us (ties everywhere), merged as a
    decoder does, whole or without one kind of event (a real run's ties without a switch broke
    the first version): order_ties moves rows only among those of one timestamp, keeps every
    row and each CPU's order."""
    events = simulate(ncpus=8, ntasks=24, n_events=6_000, seed=seed).events
    if without:
        events = events[events["event"] != without]
    events = events.assign(ts=events["ts"].to_numpy() // 20_000 * 20_000)
    events = events.iloc[np.lexsort((np.arange(len(events)), events["cpu"].to_numpy(),
                                     events["ts"].to_numpy()))].reset_index(drop=True)
    ordered, facts = order_ties(events.copy())
    assert facts["groups"] > 0 and (facts["reordered"] > 0 or without == "sched_switch")
    assert (ordered["ts"].to_numpy() == events["ts"].to_numpy()).all()
    assert per_cpu(ordered) == per_cpu(events)
    moved = (ordered.astype(object).to_numpy() != events.astype(object).to_numpy()).any(axis=1)
    assert np.count_nonzero(moved) <= facts["events"]


def test_the_notes_say_what_was_reordered_and_why_contradictions_may_remain():
    ties = {"pairs": 4924, "groups": 4449, "events": 16814, "reordered": 163}
    m = {"release": {"not_woken": []}, "reconstruction_anomalies": 119,
         "reconstruction_anomaly_kinds": {"switch_in_not_runnable": 119}, "lost_events": 0,
         "capture": {"lost_events": 0, "clock": "global", "clock_ties": ties}}
    reordered, repaired = trust.words(trust.check_notes(m, "imported"))
    assert reordered.startswith("4,924 times two CPUs' events carry the same timestamp (the global "
                                "clock's resolution)"), reordered
    assert "163 of those 4,449 groups were put in an order the scheduler can have followed" \
        in reordered
    assert "missing or out of order" in repaired and "among the 16,814 events" in repaired
    # no tie reordered: no note of its own, and the repairs worded as before
    m["capture"]["clock_ties"] = {"pairs": 0, "groups": 0, "events": 0, "reordered": 0}
    [repaired] = trust.words(trust.check_notes(m, "imported"))
    assert "is missing;" in repaired and "kernel recorded none for them" in repaired


@pytest.mark.parametrize("clock_ns", [20_000, 200_000])
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_settling_pass_gives_the_python_order(seed, clock_ns, monkeypatch):
    """The settling pass compiled (analysis.ties_jit) and in Python (ties._merge) put every
    group in the same order: on simulated streams on 8 CPUs stamped by a clock of 20 or 200 us
    (groups of up to ~100 events, contradicted as merged, gone back on), and with no going back
    allowed."""
    from conftest import use_implementation
    from harmony.analysis import ties

    events = simulate(ncpus=8, ntasks=24, n_events=6_000, seed=seed).events
    events = events.assign(ts=events["ts"].to_numpy() // clock_ns * clock_ns)
    events = events.iloc[np.lexsort((np.arange(len(events)), events["cpu"].to_numpy(),
                                     events["ts"].to_numpy()))].reset_index(drop=True)
    for per_event in (ties.BACKTRACK_PER_EVENT, 0):
        monkeypatch.setattr(ties, "BACKTRACK_PER_EVENT", per_event)
        got = {}
        for how in ("numpy", "compiled"):
            use_implementation(how, monkeypatch)
            got[how] = order_ties(events.copy())
        assert got["numpy"][1] == got["compiled"][1] and got["numpy"][1]["reordered"] > 0
        pd.testing.assert_frame_equal(got["numpy"][0], got["compiled"][0])
