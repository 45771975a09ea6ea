"""Hermetic tests of the reconstruction (harmony.analysis.reconstruct / taskstate).

Hand-written event streams with hand-checked answers for 4 and 8 CPUs (the test host has 2, so
these prove the analysis for larger P), and randomised streams checked against a per-event replay
written here as a plain loop.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from conftest import COMPILED, IMPLEMENTATIONS, use_implementation

from harmony.analysis import reconstruct as rc
from harmony.analysis.event_streams import Stream, simulate
from harmony.workload.tasks import layout_tasks, tasks_frame


@pytest.fixture(autouse=True, params=IMPLEMENTATIONS)
def state_machine(request, monkeypatch):
    """Every test runs with both implementations of task_records, the runs and the run queue:
    compiled (taskstate_jit, reconstruct_jit), also split over threads, and numpy."""
    from harmony.analysis import taskstate
    taskstate._last.clear()
    return use_implementation(request.param, monkeypatch)

S_RUN, S_SLEEP, S_STOPPED, S_DEAD = 0, 1, 4, 16
CONTROLLER, KWORKER, KWORKER2, STOPPER = 50, 900, 901, 950


def tasks_for(layout, cpus, first_pid, **spec) -> pd.DataFrame:
    """The real tasks table (harmony.workload.tasks) for a layout, with pids first_pid,
    first_pid+1, ..."""
    specs = layout_tasks(layout, cpus, **spec)
    return tasks_frame(specs, list(range(first_pid, first_pid + len(specs))))


def rows(df: pd.DataFrame, cols) -> list[tuple]:
    """The given columns as a list of tuples of plain Python values."""
    return [tuple(v.item() if isinstance(v, np.generic) else v for v in r)
            for r in df[list(cols)].itertuples(index=False, name=None)]


# ------------------------------------------------------------------ P = 4: <8,0,0,0>, scripted

T0_4, TEND_4 = 1_000_000, 6_000_000
CPUS4 = [0, 1, 2, 3]


def scenario_p4() -> pd.DataFrame:
    """8 CPU-bound tasks 101..108 released on CPU 0 of 4, balanced by pulls, with set-up moves
    before t0, a task already running when the trace starts, and outside tasks (kworkers, the
    migration stopper) whose switches delimit the experiment tasks' runs."""
    s = Stream({KWORKER: "kworker", KWORKER2: "kworker2", STOPPER: "migration/1",
                CONTROLLER: "harmony"})
    # before t0: the trace starts with an outside task on CPU 2
    s.switch(100_000, 2, prev=0, state=S_RUN, next=KWORKER)
    # 107 was running on CPU 1 when the trace began; the stopper moves it to CPU 0, where it stops
    s.switch(400_000, 1, prev=107, state=S_RUN, next=STOPPER)
    s.migrate(410_000, 1, pid=107, orig=1, dest=0, common_pid=STOPPER)
    s.switch(415_000, 1, prev=STOPPER, state=S_SLEEP, next=0)
    s.switch(420_000, 0, prev=0, state=S_RUN, next=107)
    s.switch(450_000, 0, prev=107, state=S_STOPPED, next=0)
    # 108 is woken onto CPU 0 (a wakeup placement before t0), runs and stops
    s.migrate(500_000, 3, pid=108, orig=2, dest=0, common_pid=CONTROLLER)
    s.wakeup(500_001, 3, pid=108, target=0, common_pid=CONTROLLER)
    s.switch(510_000, 0, prev=0, state=S_RUN, next=108)
    s.switch(520_000, 0, prev=108, state=S_STOPPED, next=0)
    # the kworker sleeps, is woken onto CPU 1 (its migration must not be reported), sleeps again
    s.switch(600_000, 2, prev=KWORKER, state=S_SLEEP, next=0)
    s.migrate(700_000, 1, pid=KWORKER, orig=2, dest=1)
    s.wakeup(700_001, 1, pid=KWORKER, target=1)
    s.switch(710_000, 1, prev=0, state=S_RUN, next=KWORKER)
    s.switch(800_000, 1, prev=KWORKER, state=S_SLEEP, next=0)
    # t0: the controller wakes all eight on CPU 0
    for i in range(1, 9):
        s.wakeup(T0_4 + i, 3, pid=100 + i, target=0, common_pid=CONTROLLER)
    s.switch(1_000_010, 0, prev=0, state=S_RUN, next=101)
    s.migrate(1_100_000, 1, pid=102, orig=0, dest=1, common_pid=0)
    s.switch(1_100_005, 1, prev=0, state=S_RUN, next=102)
    s.migrate(1_200_000, 2, pid=103, orig=0, dest=2, common_pid=0)
    s.migrate(1_200_001, 2, pid=104, orig=0, dest=2, common_pid=0)
    s.switch(1_200_010, 2, prev=0, state=S_RUN, next=103)
    # the kworker wakes on CPU 2 (a wakeup migration of an outside task), preempts 103, sleeps
    s.migrate(1_249_999, 2, pid=KWORKER, orig=1, dest=2)
    s.wakeup(1_250_000, 2, pid=KWORKER, target=2)
    s.switch(1_250_100, 2, prev=103, state=S_RUN, next=KWORKER)
    s.switch(1_260_000, 2, prev=KWORKER, state=S_SLEEP, next=104)
    s.migrate(1_300_000, 3, pid=105, orig=0, dest=3, common_pid=0)
    s.migrate(1_300_001, 3, pid=106, orig=0, dest=3, common_pid=0)
    s.switch(1_300_010, 3, prev=0, state=S_RUN, next=105)
    s.migrate(1_400_000, 1, pid=107, orig=0, dest=1, common_pid=102)  # balanced: 2,2,2,2
    s.switch(2_000_000, 0, prev=101, state=S_RUN, next=108)
    s.switch(2_500_000, 1, prev=102, state=S_RUN, next=107)
    s.switch(3_000_000, 0, prev=108, state=S_RUN, next=101)
    s.migrate(4_000_000, 3, pid=108, orig=0, dest=3, common_pid=105)  # 1,2,2,3
    s.migrate(4_500_000, 0, pid=106, orig=3, dest=0, common_pid=101)  # 2,2,2,2
    s.switch(5_000_000, 1, prev=107, state=S_SLEEP, next=102)  # 2,1,2,2
    s.migrate(5_200_000, 2, pid=107, orig=1, dest=2, common_pid=104)
    s.wakeup(5_200_000, 2, pid=107, target=2, common_pid=104)  # 2,1,3,2
    s.migrate(5_300_000, 1, pid=103, orig=2, dest=1, common_pid=102)  # 2,2,2,2
    s.wakeup(5_499_000, 3, pid=KWORKER2, target=3)
    s.switch(5_500_000, 3, prev=105, state=S_RUN, next=KWORKER2)
    s.switch(5_600_000, 3, prev=KWORKER2, state=S_SLEEP, next=108)
    # after t_end
    s.switch(6_500_000, 0, prev=101, state=S_RUN, next=106)
    s.migrate(6_600_000, 0, pid=103, orig=1, dest=0, common_pid=106)
    return s.events()


TASKS4 = tasks_for([8, 0, 0, 0], CPUS4, 101)


def test_p4_migrations_exact():
    mig = rc.df_migrations(scenario_p4(), TASKS4, T0_4)
    assert rows(mig, ["ts", "pid", "src_cpu", "dst_cpu", "event_cpu", "kind"]) == [
        (410_000, 107, 1, 0, 1, "balance"),  # set-up move of a runnable task, before t0
        (500_000, 108, 2, 0, 3, "wakeup"),   # set-up wakeup placement, before t0
        (1_100_000, 102, 0, 1, 1, "balance"),
        (1_200_000, 103, 0, 2, 2, "balance"),
        (1_200_001, 104, 0, 2, 2, "balance"),
        (1_300_000, 105, 0, 3, 3, "balance"),
        (1_300_001, 106, 0, 3, 3, "balance"),
        (1_400_000, 107, 0, 1, 1, "balance"),
        (4_000_000, 108, 0, 3, 3, "balance"),
        (4_500_000, 106, 3, 0, 0, "balance"),
        (5_200_000, 107, 1, 2, 2, "wakeup"),
        (5_300_000, 103, 2, 1, 1, "balance"),
        (6_600_000, 103, 1, 0, 0, "balance"),  # after t_end: still a migration of the trace
    ]
    assert mig["t"].tolist() == [(ts - T0_4) / 1e9 for ts in mig["ts"]]
    assert (mig["t"] < 0).sum() == 2  # set-up moves keep their negative time
    assert mig["name"].astype(str).tolist()[:2] == ["w06", "w07"]
    assert set(mig["role"].astype(str)) == {"cpu"}
    assert mig.attrs["anomalies"] == 0
    assert mig["pid"].dtype == np.int32 and mig["ts"].dtype == np.int64


EXPECTED_RUNS_P4 = [  # pid, cpu, start, end, end_state, truncated, unseen_start
    (107, 1, 100_000, 400_000, S_RUN, False, True),
    (107, 0, 420_000, 450_000, S_STOPPED, False, False),
    (108, 0, 510_000, 520_000, S_STOPPED, False, False),
    (101, 0, 1_000_010, 2_000_000, S_RUN, False, False),
    (102, 1, 1_100_005, 2_500_000, S_RUN, False, False),
    (103, 2, 1_200_010, 1_250_100, S_RUN, False, False),
    (104, 2, 1_260_000, TEND_4, -1, True, False),
    (105, 3, 1_300_010, 5_500_000, S_RUN, False, False),
    (108, 0, 2_000_000, 3_000_000, S_RUN, False, False),
    (107, 1, 2_500_000, 5_000_000, S_SLEEP, False, False),
    (101, 0, 3_000_000, TEND_4, -1, True, False),  # ends after t_end: cut
    (102, 1, 5_000_000, TEND_4, -1, True, False),  # still open at the end of the trace
    (108, 3, 5_600_000, TEND_4, -1, True, False),
]


def test_p4_runs_exact():
    runs = rc.df_runs(scenario_p4(), TASKS4, T0_4, TEND_4)
    assert rows(runs, ["pid", "cpu", "start", "end", "end_state", "truncated", "unseen_start"]) \
        == EXPECTED_RUNS_P4
    assert (runs["duration"] == runs["end"] - runs["start"]).all()
    assert runs.attrs["anomalies"] == 0 and runs.attrs["anomaly_kinds"] == {}
    assert 106 not in runs["pid"].tolist()  # its run starts after t_end


EXPECTED_RQ_P4 = [  # ts, cpu, nr
    (100_000, 0, 0), (100_000, 1, 1), (100_000, 2, 0), (100_000, 3, 0),  # 107 runs on CPU 1
    (410_000, 0, 1), (410_000, 1, 0),
    (450_000, 0, 0),
    (500_001, 0, 1),
    (520_000, 0, 0),
    *[(T0_4 + i, 0, i) for i in range(1, 9)],
    (1_100_000, 0, 7), (1_100_000, 1, 1),
    (1_200_000, 0, 6), (1_200_000, 2, 1),
    (1_200_001, 0, 5), (1_200_001, 2, 2),
    (1_300_000, 0, 4), (1_300_000, 3, 1),
    (1_300_001, 0, 3), (1_300_001, 3, 2),
    (1_400_000, 0, 2), (1_400_000, 1, 2),
    (4_000_000, 0, 1), (4_000_000, 3, 3),
    (4_500_000, 0, 2), (4_500_000, 3, 2),
    (5_000_000, 1, 1),
    (5_200_000, 2, 3),
    (5_300_000, 1, 2), (5_300_000, 2, 2),
]


def test_p4_runqueue_exact():
    rq = rc.df_runqueue(scenario_p4(), TASKS4, CPUS4, T0_4, TEND_4)
    assert rows(rq, ["ts", "cpu", "nr"]) == EXPECTED_RQ_P4
    assert rq.attrs["anomalies"] == 0 and rq.attrs["anomaly_kinds"] == {}
    assert rq.attrs["inferred_runnable_at_start"] == 1
    assert rq.attrs["outside_cpus"] == 0
    at = rc.runqueue_at(rq, [50_000, T0_4, 1_450_000, 5_250_000, TEND_4])
    assert at.loc[1_450_000].tolist() == [2, 2, 2, 2]
    assert at.loc[5_250_000].tolist() == [2, 1, 3, 2]
    assert at.loc[50_000].tolist() == [-1, -1, -1, -1]  # before the step function begins


def test_p4_runqueue_outside_cpu_set():
    """On the CPU set {0, 1, 2} a task on CPU 3 escaped the set: counted, not tabled."""
    rq = rc.df_runqueue(scenario_p4(), TASKS4, [0, 1, 2], T0_4, TEND_4)
    assert set(rq["cpu"]) == {0, 1, 2}
    assert rows(rq, ["ts", "cpu", "nr"]) == [r for r in EXPECTED_RQ_P4 if r[1] != 3]
    # 105, 106 (1_300_00x) and 108 (4_000_000) arrive on CPU 3
    assert rq.attrs["outside_cpus"] == 3


def test_p4_allocation_and_share():
    ev = scenario_p4()
    runs = rc.df_runs(ev, TASKS4, T0_4, TEND_4)
    alloc = rc.df_allocation(runs, TASKS4, T0_4, TEND_4, 2_000_000)
    # windows [1, 3), [3, 5), [5, 6) ms; CPU ns of each task in each window, from EXPECTED_RUNS_P4
    want = {
        101: (999_990, 2_000_000, 1_000_000),
        102: (1_399_995, 0, 1_000_000),
        103: (50_090, 0, 0),
        104: (1_740_000, 2_000_000, 1_000_000),
        105: (1_699_990, 2_000_000, 500_000),
        106: (0, 0, 0),
        107: (500_000, 2_000_000, 0),
        108: (1_000_000, 0, 400_000),
    }
    assert len(alloc) == 3 * 8
    assert alloc["window"].tolist() == [k for k in range(3) for _ in range(8)]
    assert alloc["pid"].tolist() == list(range(101, 109)) * 3
    assert alloc["window_start"].tolist() == [T0_4 + 2_000_000 * k
                                              for k in range(3) for _ in range(8)]
    assert alloc["window_s"].tolist() == [0.002] * 16 + [0.001] * 8
    got = {p: tuple(round(v * 1e9) for v in g.sort_values("window")["cpu_time"])
           for p, g in alloc.groupby("pid")}
    assert got == want
    assert np.allclose(alloc["share"], alloc["cpu_time"] / alloc["window_s"])

    share = rc.df_task_share(runs, TASKS4, CPUS4, T0_4, TEND_4)
    assert share["pid"].tolist() == list(range(101, 109))
    assert [round(v * 1e9) for v in share["cpu_time"]] == [sum(want[p]) for p in range(101, 109)]
    assert np.allclose(share["share"], share["cpu_time"] / 0.005)
    assert share["fair"].tolist() == [0.5] * 8  # 8 equal CPU-bound tasks on 4 CPUs
    assert share["weight"].tolist() == [1024] * 8
    assert np.allclose(share["ratio"], share["share"] / 0.5)


# ------------------------------------------------------------------ P = 8: <16,0,...,0>

T0_8 = 10_000_000
CPUS8 = list(range(8))
TASKS8 = tasks_for([16] + [0] * 7, CPUS8, 201)


def scenario_p8() -> tuple[pd.DataFrame, int]:
    """16 CPU-bound tasks 201..216 released on CPU 0 of 8; CPU k pulls 200+2k and 201+2k at
    t0 + k*100 us; an outside kworker 990+k runs briefly on each CPU k before; CPU 3 later pulls
    from CPU 4 and CPU 4 pulls back. Returns (events, t_end)."""
    s = Stream()
    for i in range(1, 17):
        s.wakeup(T0_8 + i, 0, pid=200 + i, target=0, common_pid=CONTROLLER)
    s.switch(T0_8 + 20, 0, prev=0, state=S_RUN, next=201)
    for k in range(1, 8):
        base = T0_8 + k * 100_000
        s.wakeup(base - 60_000, k, pid=990 + k, target=k)
        s.switch(base - 50_000, k, prev=0, state=S_RUN, next=990 + k)
        s.switch(base - 40_000, k, prev=990 + k, state=S_SLEEP, next=0)
        s.migrate(base, k, pid=200 + 2 * k, orig=0, dest=k, common_pid=0)
        s.migrate(base + 1, k, pid=201 + 2 * k, orig=0, dest=k, common_pid=0)
        s.switch(base + 10, k, prev=0, state=S_RUN, next=200 + 2 * k)
    # CPU 3 pulls queued 209 from CPU 4 (3, 1), CPU 4 pulls queued 207 back (2, 2)
    s.migrate(T0_8 + 2_000_000, 3, pid=209, orig=4, dest=3, common_pid=206)
    s.migrate(T0_8 + 2_200_000, 4, pid=207, orig=3, dest=4, common_pid=208)
    return s.events(), T0_8 + 3_000_000


def test_p8_runqueue_migrations_runs_exact():
    ev, t_end = scenario_p8()
    rq = rc.df_runqueue(ev, TASKS8, CPUS8, T0_8, t_end)
    # the trace starts after t0 here, so the initial rows are at t0
    want = [(T0_8, c, 0) for c in CPUS8]
    want += [(T0_8 + i, 0, i) for i in range(1, 17)]
    for k in range(1, 8):
        base = T0_8 + k * 100_000
        want += [(base, 0, 16 - 2 * k + 1), (base, k, 1), (base + 1, 0, 16 - 2 * k),
                 (base + 1, k, 2)]
    want += [(T0_8 + 2_000_000, 3, 3), (T0_8 + 2_000_000, 4, 1),
             (T0_8 + 2_200_000, 3, 2), (T0_8 + 2_200_000, 4, 2)]
    assert rows(rq, ["ts", "cpu", "nr"]) == want
    assert rq.attrs["anomalies"] == 0 and rq.attrs["inferred_runnable_at_start"] == 0

    mig = rc.df_migrations(ev, TASKS8, T0_8)
    want_mig = [(T0_8 + k * 100_000 + j, 200 + 2 * k + j, 0, k, "balance")
                for k in range(1, 8) for j in (0, 1)]
    want_mig += [(T0_8 + 2_000_000, 209, 4, 3, "balance"), (T0_8 + 2_200_000, 207, 3, 4, "balance")]
    assert rows(mig, ["ts", "pid", "src_cpu", "dst_cpu", "kind"]) == want_mig

    runs = rc.df_runs(ev, TASKS8, T0_8, t_end)
    want_runs = [(201, 0, T0_8 + 20, t_end, -1, True, False)]
    want_runs += [(200 + 2 * k, k, T0_8 + k * 100_000 + 10, t_end, -1, True, False)
                  for k in range(1, 8)]
    assert rows(runs, ["pid", "cpu", "start", "end", "end_state", "truncated", "unseen_start"]) \
        == want_runs  # the kworkers' runs delimit nothing of the experiment's and are not listed
    assert runs.attrs["anomalies"] == 0


# ------------------------------------------------------------------ anomalies: lost events

T_A0, T_AEND = 1_000, 100_000
TASKS_A = tasks_for([2, 0, 0, 0], CPUS4, 11)


def anomaly_stream(drop: str | None) -> pd.DataFrame:
    """Tasks 11 and 12 on a 4-CPU set; ``drop`` names one event to leave out."""
    s = Stream()
    s.wakeup(1_000, 0, pid=11, target=1)
    s.switch(2_000, 1, prev=KWORKER, state=S_SLEEP, next=0)
    s.wakeup(1_500, 0, pid=12, target=2)
    s.switch(2_500, 2, prev=0, state=S_RUN, next=12)
    s.switch(5_000, 2, prev=12, state=S_SLEEP, next=0)
    if drop != "idle_to_task":
        s.switch(3_000, 1, prev=0, state=S_RUN, next=11)
    s.switch(9_000, 1, prev=11, state=S_SLEEP, next=0)
    if drop != "wakeup":
        s.wakeup(10_000, 2, pid=12, target=2)
    s.switch(12_000, 2, prev=0, state=S_RUN, next=12)
    s.switch(20_000, 2, prev=12, state=S_RUN, next=KWORKER)  # 12 preempted, queued on 2
    if drop != "migrate":
        s.migrate(30_000, 3, pid=12, orig=2, dest=3, common_pid=0)
    s.switch(40_000, 3, prev=0, state=S_RUN, next=12)
    s.switch(50_000, 3, prev=12, state=S_SLEEP, next=0)
    return s.events()


def test_lost_idle_to_task_switch_is_repaired_and_counted():
    """A lost idle->task switch: the run queue is still exact, the loss is counted."""
    full, lossy = anomaly_stream(None), anomaly_stream("idle_to_task")
    rq_full = rc.df_runqueue(full, TASKS_A, CPUS4, T_A0, T_AEND)
    rq = rc.df_runqueue(lossy, TASKS_A, CPUS4, T_A0, T_AEND)
    assert rows(rq, ["ts", "cpu", "nr"]) == rows(rq_full, ["ts", "cpu", "nr"])
    assert rq_full.attrs["anomalies"] == 0
    assert rq.attrs["anomalies"] == 1
    assert rq.attrs["anomaly_kinds"] == {"switch_out_not_running": 1}
    an = rc.df_anomalies(lossy, TASKS_A, T_A0)
    assert rows(an, ["ts", "pid", "cpu", "record", "anomaly", "cpu_before", "runnable_before",
                     "running_before"]) == [
        (9_000, 11, 1, "switch_out_sleep", "switch_out_not_running", 1, True, False)]
    runs = rc.df_runs(lossy, TASKS_A, T_A0, T_AEND)
    # its switch-in is lost: the run starts at the later of the CPU's previous switch (2_000, the
    # CPU went idle) and 11's last wake-up (1_000), flagged, and the loss is counted
    assert rows(runs[runs["pid"] == 11], ["cpu", "start", "end", "unseen_start"]) == [
        (1, 2_000, 9_000, True)]
    assert runs.attrs["anomaly_kinds"] == {"run_start_unseen": 1}
    full_runs = rc.df_runs(full, TASKS_A, T_A0, T_AEND)
    assert rows(full_runs[full_runs["pid"] == 11], ["cpu", "start", "end"]) == [(1, 3_000, 9_000)]


def test_lost_wakeup_is_repaired_at_the_switch_in():
    rq = rc.df_runqueue(anomaly_stream("wakeup"), TASKS_A, CPUS4, T_A0, T_AEND)
    assert rows(rq, ["ts", "cpu", "nr"]) == [
        (1_000, 0, 0), (1_000, 1, 1), (1_000, 2, 0), (1_000, 3, 0),
        (1_500, 2, 1), (5_000, 2, 0),
        (9_000, 1, 0),
        (12_000, 2, 1),  # not 10_000: the lost wakeup is found at the switch-in
        (30_000, 2, 0), (30_000, 3, 1),
        (50_000, 3, 0),
    ]
    assert rq.attrs["anomaly_kinds"] == {"switch_in_not_runnable": 1}


def test_lost_migration_is_repaired_at_the_switch_in():
    ev = anomaly_stream("migrate")
    rq = rc.df_runqueue(ev, TASKS_A, CPUS4, T_A0, T_AEND)
    assert rows(rq, ["ts", "cpu", "nr"])[-3:] == [(40_000, 2, 0), (40_000, 3, 1), (50_000, 3, 0)]
    assert rq.attrs["anomaly_kinds"] == {"switch_in_wrong_cpu": 1}
    mig = rc.df_migrations(ev, TASKS_A, T_A0)   # the lost move is inferred from the switch-in
    assert rows(mig, ["ts", "pid", "src_cpu", "dst_cpu", "kind", "cause", "inferred"]) == [
        (40_000, 12, 2, 3, "balance", "unknown", True)]


def test_runs_lost_switch_between_two_experiment_tasks():
    """101 -> 102 is lost on CPU 0: 101's run ends at the next switch (mismatch counted)."""
    tasks = tasks_for([2, 0, 0, 0], CPUS4, 101)
    s = Stream()
    s.wakeup(100, 0, pid=101, target=0).wakeup(101, 0, pid=102, target=0)
    s.switch(200, 0, prev=0, state=S_RUN, next=101)
    # lost: switch(300, 0, prev=101, state=0, next=102)
    s.switch(400, 0, prev=102, state=S_SLEEP, next=101)
    s.switch(500, 0, prev=101, state=S_SLEEP, next=0)
    ev = s.events()
    runs = rc.df_runs(ev, tasks, 100, 1_000)
    # the switch that ended the first run was 102's: how 101 left is unknown (-1)
    assert rows(runs, ["pid", "start", "end", "end_state"]) == [(101, 200, 400, -1),
                                                                (101, 400, 500, S_SLEEP)]
    assert runs.attrs["anomaly_kinds"] == {"run_end_mismatch": 1, "run_start_unseen": 1}
    rq = rc.df_runqueue(ev, tasks, CPUS4, 100, 1_000)
    # the wake-up at the first instant is part of the first rows (one row per ts and CPU)
    assert rows(rq, ["ts", "cpu", "nr"]) == [(100, 0, 1), (100, 1, 0), (100, 2, 0), (100, 3, 0),
                                             (101, 0, 2), (400, 0, 1), (500, 0, 0)]
    assert rq.attrs["anomaly_kinds"] == {"switch_out_not_running": 1, "switch_in_while_running": 1}


# ------------------------------------------------------------------ exits

def test_a_task_preempted_as_it_exits_is_queued_until_its_dead_switch_out():
    """The kernel's exit work runs on after sched_process_exit: a task can be preempted there
    (switched out runnable) and switched in again before its dead switch-out. Read as its last
    switch-out, it made two repairs (a guest's trace: 9 of its 10) and an empty run queue."""
    tasks = tasks_for([1, 0], [0, 1], 31)
    s = Stream()
    s.wakeup(10, 0, pid=31, target=1)
    s.switch(20, 1, prev=0, state=S_RUN, next=31)
    s.exit(30, 1, pid=31)
    s.switch(31, 1, prev=31, state=S_RUN, next=0)   # preempted as it exits
    s.switch(40, 1, prev=0, state=S_RUN, next=31)
    s.switch(50, 1, prev=31, state=S_DEAD, next=0)
    ev = s.events()
    rq = rc.df_runqueue(ev, tasks, [0, 1], 0, 100)
    assert rows(rq, ["ts", "cpu", "nr"]) == [(0, 0, 0), (0, 1, 0), (10, 1, 1), (50, 1, 0)]
    assert rq.attrs["anomalies"] == 0
    assert rows(rc.df_runs(ev, tasks, 0, 100), ["pid", "start", "end", "end_state"]) \
        == [(31, 20, 31, S_RUN), (31, 40, 50, S_DEAD)]
    # switched out runnable for the last time (a kernel that writes no dead state), then a new
    # task of that pid (wakeup_new) switched in: the first one's switch-out was its last
    s = Stream()
    s.wakeup(10, 0, pid=31, target=1)
    s.switch(20, 1, prev=0, state=S_RUN, next=31)
    s.exit(30, 1, pid=31)
    s.switch(31, 1, prev=31, state=S_RUN, next=0)
    s.wakeup_new(60, 0, pid=31, target=0)
    s.switch(70, 0, prev=0, state=S_RUN, next=31)
    rq = rc.df_runqueue(s.events(), tasks, [0, 1], 0, 100)
    assert rows(rq, ["ts", "cpu", "nr"]) == [(0, 0, 0), (0, 1, 0), (10, 1, 1), (31, 1, 0),
                                             (60, 0, 1)]
    assert rq.attrs["anomaly_kinds"] == {"runnable_after_exit": 1}


def test_exit_ends_the_task_even_if_switched_out_runnable():
    tasks = tasks_for([1, 0], [0, 1], 31)
    s = Stream()
    s.wakeup(10, 0, pid=31, target=1)
    s.switch(20, 1, prev=0, state=S_RUN, next=31)
    s.exit(30, 1, pid=31)
    s.switch(31, 1, prev=31, state=S_RUN, next=0)  # the dead task's last switch-out
    ev = s.events()
    rq = rc.df_runqueue(ev, tasks, [0, 1], 0, 100)
    assert rows(rq, ["ts", "cpu", "nr"]) == [(0, 0, 0), (0, 1, 0), (10, 1, 1), (31, 1, 0)]
    assert rq.attrs["anomaly_kinds"] == {"runnable_after_exit": 1}
    s2 = Stream().wakeup(10, 0, pid=31, target=1).switch(20, 1, prev=0, state=S_RUN, next=31)
    s2.exit(30, 1, pid=31).switch(31, 1, prev=31, state=S_DEAD, next=0)
    rq2 = rc.df_runqueue(s2.events(), tasks, [0, 1], 0, 100)
    assert rows(rq2, ["ts", "cpu", "nr"]) == rows(rq, ["ts", "cpu", "nr"])
    assert rq2.attrs["anomalies"] == 0
    assert rows(rc.df_runs(s2.events(), tasks, 0, 100), ["pid", "start", "end", "end_state"]) \
        == [(31, 20, 31, S_DEAD)]


# ------------------------------------------------------------------ fair shares, Jain

def test_fair_shares_by_hand():
    w0, w5 = 1024, 335
    assert rc.nice_to_weight([0, 5, -20, 19, 25]).tolist() == [w0, w5, 88761, 15, 15]
    # nice 0 x2 and nice 5 x2 on 2 CPUs: proportional, nobody capped
    got = rc.fair_shares([w0, w0, w5, w5], [1, 1, 1, 1], 2)
    assert np.allclose(got, [2 * w0 / 2718, 2 * w0 / 2718, 2 * w5 / 2718, 2 * w5 / 2718])
    # one nice 0 and two nice 5 on 2 CPUs: nice 0 would get 1.21 CPUs, is capped at 1
    assert np.allclose(rc.fair_shares([w0, w5, w5], [1, 1, 1], 2), [1.0, 0.5, 0.5])
    # a 30% task is capped by its demand, the others share the rest
    assert np.allclose(rc.fair_shares([w0] * 3, [0.3, 1, 1], 2), [0.3, 0.85, 0.85])
    # capping cascades: 0.5 is capped first, then 0.8 (3 CPUs / 4 tasks: 0.75 -> 0.833 -> 0.85)
    assert np.allclose(rc.fair_shares([w0] * 4, [0.5, 0.8, 1, 1], 3), [0.5, 0.8, 0.85, 0.85])
    # fewer tasks than CPUs: everyone gets its demand; zero weight gets nothing
    assert np.allclose(rc.fair_shares([w0, w0, 0], [1, 0.4, 1], 4), [1.0, 0.4, 0.0])
    assert np.allclose(rc.fair_shares([w0] * 8, [1] * 8, 4), [0.5] * 8)


def test_task_share_with_nice_and_duty():
    """3 tasks on 2 CPUs: nice 0, nice 5, nice 5 (duty 30%): fair 1, 0.7, 0.3."""
    specs = layout_tasks([3, 0], [0, 1])
    tasks = tasks_frame(specs, [41, 42, 43])
    tasks["nice"] = [0, 5, 5]
    tasks["duty"] = [100.0, 100.0, 30.0]
    s = Stream()
    s.wakeup(0, 0, pid=41, target=0).wakeup(0, 0, pid=42, target=1).wakeup(0, 0, pid=43, target=1)
    s.switch(0, 0, prev=0, state=S_RUN, next=41)
    s.switch(0, 1, prev=0, state=S_RUN, next=42)
    s.switch(700, 1, prev=42, state=S_RUN, next=43)
    s.switch(1_000, 1, prev=43, state=S_SLEEP, next=42)
    runs = rc.df_runs(s.events(), tasks, 0, 1_000)
    share = rc.df_task_share(runs, tasks, [0, 1], 0, 1_000)
    assert share["weight"].tolist() == [1024, 335, 335]
    assert np.allclose(share["demand"], [1.0, 1.0, 0.3])
    assert np.allclose(share["fair"], [1.0, 0.7, 0.3])
    assert np.allclose(share["share"], [1.0, 0.7, 0.3])
    assert np.allclose(share["ratio"], [1.0, 1.0, 1.0])


# ------------------------------------------------------------------ randomised: loop oracle

def replay_runqueue(events: pd.DataFrame, pids, cpus, t0: int, t_end: int):
    """The documented state machine (taskstate's table and rules), one event at a time.

    Returns (rows [(ts, cpu, nr)], anomaly count in the window, tasks runnable at trace start).
    """
    pidset = set(int(p) for p in pids)
    ev = events.to_dict("records")

    def records(e):
        kind = e["event"]
        if kind == "sched_switch":
            if e["prev_pid"] in pidset:
                yield e["prev_pid"], "out_run" if e["prev_state"] == 0 else "out_sleep"
            if e["pid"] in pidset:
                yield e["pid"], "in"
        elif e["pid"] in pidset and kind in ("sched_wakeup", "sched_wakeup_new",
                                             "sched_migrate_task", "sched_process_exit"):
            yield e["pid"], kind

    recs = [(e, pid, r) for e in ev for pid, r in records(e)]
    # inferred state before each task's first record
    state = {}
    for e, pid, r in recs:
        st = state.setdefault(pid, {"first": r, "cpu0": None, "runnable": None, "running": None})
        if st["cpu0"] is None:
            st["cpu0"] = (e["cpu"] if r in ("in", "out_run", "out_sleep", "sched_process_exit")
                          else e["orig_cpu"] if r == "sched_migrate_task" else -1)
        if st["runnable"] is None and r in ("in", "out_run", "out_sleep", "sched_wakeup",
                                            "sched_wakeup_new"):
            st["runnable"] = r in ("in", "out_run", "out_sleep")
        if st["running"] is None and r in ("in", "out_run", "out_sleep", "sched_wakeup_new",
                                           "sched_migrate_task"):
            st["running"] = r in ("out_run", "out_sleep")
    task = {p: {"runnable": bool(st["runnable"]),
                "running": bool(st["runnable"]) and bool(st["running"]),
                "cpu": st["cpu0"], "exited": False} for p, st in state.items()}
    at_start = sum(t["runnable"] for t in task.values())

    def counts():
        n = dict.fromkeys(cpus, 0)
        for t in task.values():
            if t["runnable"] and t["cpu"] in n:
                n[t["cpu"]] += 1
        return n

    cpus = sorted(cpus)
    t_first = min(int(events["ts"].iloc[0]), t0) if len(events) else t0
    last_emitted = counts()
    out = {(t_first, c): n for c, n in last_emitted.items()}  # (ts, cpu) -> nr: one per instant
    anomalies = 0
    for i, e in enumerate(ev):
        for pid, r in records(e):
            t = task[pid]
            a = False
            if r == "in":
                a = (not t["runnable"]) or t["running"] or t["cpu"] != e["cpu"]
                t.update(runnable=True, running=True, cpu=e["cpu"])
            elif r in ("out_run", "out_sleep"):
                a = not (t["running"] and t["cpu"] == e["cpu"])
                dead = t["exited"]
                if dead and r == "out_run":
                    a = True
                t.update(runnable=(r == "out_run" and not dead), running=False, cpu=e["cpu"],
                         exited=False)
            elif r == "sched_wakeup":
                a = t["runnable"] and t["cpu"] >= 0 and t["cpu"] != e["target_cpu"]
                t.update(runnable=True, cpu=e["target_cpu"])
            elif r == "sched_wakeup_new":
                a = t["runnable"]
                t.update(runnable=True, running=False, cpu=e["target_cpu"])
            elif r == "sched_migrate_task":
                a = (t["cpu"] >= 0 and t["cpu"] != e["orig_cpu"]) or t["running"]
                t.update(running=False, cpu=e["target_cpu"])
            elif r == "sched_process_exit":
                t["exited"] = True
            if e["ts"] <= t_end:
                anomalies += a
        last_of_ts = i + 1 == len(ev) or ev[i + 1]["ts"] != e["ts"]
        if last_of_ts and e["ts"] <= t_end:
            for c, n in counts().items():
                if n != last_emitted[c]:
                    out[int(e["ts"]), c] = n
                    last_emitted[c] = n
    return [(ts, c, n) for (ts, c), n in sorted(out.items())], anomalies, at_start


def replay_runs(events: pd.DataFrame, pids, t_end: int):
    """df_runs's documented rules, one sched_switch at a time per CPU.

    Returns (sorted [(pid, cpu, start, end, end_state, truncated, unseen_start)], anomaly kinds).
    """
    pidset = set(int(p) for p in pids)
    t_start = int(events["ts"].iloc[0])
    cur = {}  # cpu -> (pid switched in, start) of the last switch seen on that CPU
    woke = {}  # pid -> ts of its last wake-up
    out, kinds = [], {"run_end_mismatch": 0, "run_start_unseen": 0}
    for ts, cpu, ev, nxt, prv, pst in events[["ts", "cpu", "event", "pid", "prev_pid",
                                              "prev_state"]].itertuples(index=False, name=None):
        if ev in ("sched_wakeup", "sched_wakeup_new"):
            woke[nxt] = ts
        if ev != "sched_switch":
            continue
        if cpu in cur and prv != cur[cpu][0] and prv in pidset and cur[cpu][0] not in pidset:
            # switch-in lost after idle or a foreign task: start inferred from the wake-up
            out.append([prv, cpu, max(cur[cpu][1], woke.get(prv, cur[cpu][1])), ts, pst, False,
                        True])
        if cpu not in cur:
            if prv in pidset:  # running when the trace began
                out.append([prv, cpu, t_start, ts, pst, False, True])
        else:
            pid, start = cur[cpu]
            if pid in pidset:
                out.append([pid, cpu, start, ts, pst if prv == pid else -1, False, False])
                kinds["run_end_mismatch"] += prv != pid
            kinds["run_start_unseen"] += prv != pid and prv in pidset
        cur[cpu] = (nxt, ts)
    for cpu, (pid, start) in cur.items():
        if pid in pidset:
            out.append([pid, cpu, start, t_end, -1, True, False])
    runs = []
    for pid, cpu, start, end, state, trunc, unseen in out:
        if start >= t_end:
            continue
        if end > t_end:
            end, state, trunc = t_end, -1, True
        runs.append((pid, cpu, start, end, state, trunc, unseen))
    return sorted(runs, key=lambda r: (r[2], r[1], r[3])), {k: v for k, v in kinds.items() if v}


def truth_at(truth_rq: pd.DataFrame, cpus, times) -> np.ndarray:
    """Sample simulate()'s ground truth (changes only, 0 before the first) at ``times``."""
    out = np.zeros((len(times), len(cpus)), dtype=np.int64)
    for j, c in enumerate(cpus):
        g = truth_rq[truth_rq["cpu"] == c]
        i = np.searchsorted(g["ts"].to_numpy(), times, side="right") - 1
        out[:, j] = np.where(i >= 0, g["nr"].to_numpy()[np.maximum(i, 0)], 0)
    return out


def busy_cut(sim, start: int) -> int:
    """The first event index >= start where a new ts begins and >= 3 tasks are runnable."""
    ts = sim.events["ts"].to_numpy()
    cpus = sorted(sim.truth_rq["cpu"].unique())
    total = truth_at(sim.truth_rq, cpus, ts - 1).sum(axis=1)  # just before each event
    i = start
    while ts[i] == ts[i - 1] or total[i] < 3:
        i += 1
    return i


@pytest.mark.parametrize("ncpus,ntasks,seed", [(4, 8, 4), (8, 16, 8)])
def test_random_stream_against_replay_and_truth(ncpus, ntasks, seed):
    sim = simulate(ncpus=ncpus, ntasks=ntasks, n_events=4_000, seed=seed, n_others=3,
                   p_exit=0.001)
    cpus = list(range(ncpus))
    ev, tasks = sim.events, sim.tasks
    assert sim.truth_migrations["kind"].nunique() == 2
    assert (ev["event"] == "sched_process_exit").any()
    rq = rc.df_runqueue(ev, tasks, cpus, sim.t0, sim.t_end)
    want, anomalies, _ = replay_runqueue(ev, tasks["pid"], cpus, sim.t0, sim.t_end)
    assert rows(rq, ["ts", "cpu", "nr"]) == want
    assert anomalies == 0 and rq.attrs["anomalies"] == 0
    # and against the simulator's own bookkeeping, at every event time
    times = np.unique(ev["ts"].to_numpy())
    assert (rc.runqueue_at(rq, times)[cpus].to_numpy() == truth_at(sim.truth_rq, cpus, times)).all()

    mig = rc.df_migrations(ev, tasks, sim.t0)
    assert rows(mig, ["ts", "pid", "src_cpu", "dst_cpu", "kind"]) == \
        rows(sim.truth_migrations, ["ts", "pid", "src_cpu", "dst_cpu", "kind"])
    runs = rc.df_runs(ev, tasks, sim.t0, sim.t_end)
    want_runs, kinds = replay_runs(ev, tasks["pid"], sim.t_end)
    assert rows(runs, ["pid", "cpu", "start", "end", "end_state", "truncated", "unseen_start"]) \
        == want_runs and kinds == {}
    got_ns = runs.groupby("pid")["duration"].sum().reindex(tasks["pid"], fill_value=0)
    assert got_ns.to_dict() == sim.truth_cpu_ns
    assert runs.attrs["anomalies"] == 0


@pytest.mark.parametrize("ncpus,ntasks,seed", [(4, 8, 40), (8, 16, 80)])
def test_random_lossy_stream_against_replay(ncpus, ntasks, seed):
    """Drop 3% of the events and cut the trace's beginning: the vectorised repairs and the
    inferred start state equal the per-event replay of the same rules."""
    sim = simulate(ncpus=ncpus, ntasks=ntasks, n_events=4_000, seed=seed, n_others=3,
                   p_exit=0.001)
    rng = random.Random(seed)
    cut = busy_cut(sim, 300)
    keep = [i >= cut and rng.random() > 0.03 for i in range(len(sim.events))]
    ev = sim.events[np.array(keep)].reset_index(drop=True)
    cpus = list(range(ncpus))
    t_end = int(ev["ts"].iloc[-200])  # some events fall after the window
    rq = rc.df_runqueue(ev, sim.tasks, cpus, sim.t0, t_end)
    want, anomalies, at_start = replay_runqueue(ev, sim.tasks["pid"], cpus, sim.t0, t_end)
    assert anomalies > 0 and at_start > 0  # the test exercises repairs and inference
    assert rows(rq, ["ts", "cpu", "nr"]) == want
    assert rq.attrs["anomalies"] == anomalies
    assert rq.attrs["inferred_runnable_at_start"] == at_start
    assert len(rc.df_anomalies(ev, sim.tasks, sim.t0)) >= anomalies

    runs = rc.df_runs(ev, sim.tasks, sim.t0, t_end)
    want_runs, kinds = replay_runs(ev, sim.tasks["pid"], t_end)
    assert sum(kinds.values()) > 0
    assert rows(runs, ["pid", "cpu", "start", "end", "end_state", "truncated", "unseen_start"]) \
        == want_runs
    assert runs.attrs["anomaly_kinds"] == kinds


def test_random_trace_cut_at_start_infers_the_true_state():
    """A trace that begins mid-run (no loss after that): the inferred start state is the truth."""
    sim = simulate(ncpus=8, ntasks=16, n_events=3_000, seed=5, n_others=2)
    ev = sim.events.iloc[busy_cut(sim, 1_000):].reset_index(drop=True)
    cpus = list(range(8))
    rq = rc.df_runqueue(ev, sim.tasks, cpus, sim.t0, sim.t_end)
    times = np.unique(ev["ts"].to_numpy())
    truth = truth_at(sim.truth_rq, cpus, np.concatenate([[ev["ts"].iloc[0] - 1], times]))
    assert rq["ts"].iloc[0] == sim.t0 and rq.attrs["anomalies"] == 0
    # from the cut on the rebuilt step function is the truth (the first rows: the state before)
    assert (rc.runqueue_at(rq, times)[cpus].to_numpy() == truth[1:]).all()
    first = rq[rq["ts"] == sim.t0].sort_values("cpu")["nr"].to_numpy()
    assert (first == truth[0]).all()


def test_in_set_matches_isin():
    """taskstate.in_set (a table look-up) agrees with np.isin, at the edges too: negative values,
    values above the largest member, the largest member itself, huge members (isin fallback)."""
    from harmony.analysis.arrays import in_set
    rng = np.random.default_rng(7)
    for _ in range(300):
        members = rng.integers(0, 60, rng.integers(0, 6))
        values = np.concatenate([rng.integers(-5, 80, 200), members, members + 1, members - 1])
        assert (in_set(values, members) == np.isin(values, members)).all()
    big = np.array([5, 1 << 30])
    assert (in_set(np.array([5, 6, 1 << 30, -1]), big) == [True, False, True, False]).all()


def test_index_of_finds_the_first_position():
    """arrays.index_of agrees with a dict of first positions, by look-up table (keys close
    together, negatives included) and by binary search (keys spread wide), -1 for strangers."""
    from harmony.analysis.arrays import index_of
    rng = np.random.default_rng(11)
    for spread in (60, 1 << 20, 1 << 40):
        for _ in range(100):
            keys = rng.integers(-spread // 4, spread, rng.integers(0, 8))
            values = np.concatenate([rng.integers(-spread // 2, 2 * spread, 50), keys, keys + 1])
            first = {}
            for k, key in enumerate(keys.tolist()):
                first.setdefault(key, k)
            assert index_of(values, keys).tolist() == [first.get(v, -1) for v in values.tolist()]


@pytest.mark.parametrize("vtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                   np.uint32, np.uint64])
def test_index_of_reads_narrow_values_at_their_edges(vtype):
    """The key-table path reads the values in their own type: their type's smallest and largest
    values (where v + 1 wraps) and every value around the keys are looked up right; the positions
    come in the type asked for; key_table is what index_of and the compiled passes index."""
    from harmony.analysis.arrays import TABLE_MIN_SLOTS, index_of, key_table
    info = np.iinfo(vtype)
    rng = np.random.default_rng(int(info.max) % 1000)
    top = min(int(info.max), 3 * TABLE_MIN_SLOTS)   # a key may be the largest value
    for _ in range(60):
        keys = rng.integers(0, top + 1, rng.integers(1, 9))
        keys[0] = rng.choice([0, top, keys[0]])                 # the ends of the table too
        edge = [info.min, info.min + 1, info.max - 1, info.max, 0, 1, top, min(top + 1, info.max)]
        values = np.concatenate([np.array(edge, dtype=vtype)] + [
            a.astype(vtype) for a in (keys, keys + 1, np.maximum(keys - 1, 0),
                                      rng.integers(0, top + 2, 300))])
        first = {}
        for k, key in enumerate(keys.tolist()):
            first.setdefault(key, k)
        want = [first.get(v, -1) for v in values.tolist()]
        for dtype in (np.int64, np.int16):
            got = index_of(values, keys, dtype=dtype)
            assert got.dtype == dtype and got.tolist() == want
        table = key_table(keys)
        assert len(table) == keys.max() + 3 and table[0] == table[-1] == -1
        assert [table[v + 1] for v in keys.tolist()] == [first[v] for v in keys.tolist()]
    with pytest.raises(ValueError, match="must lie in"):
        key_table([-1, 3])
    with pytest.raises(ValueError, match="do not fit"):
        key_table(np.arange(200), np.int8)
    with pytest.raises(ValueError, match="do not fit"):
        index_of([1, 2], np.arange(-100, 100), dtype=np.int8)     # whichever path it would take


def test_sorted_unique_is_np_unique():
    from harmony.analysis.arrays import sorted_unique
    rng = np.random.default_rng(3)
    for n, hi in ((0, 5), (1, 5), (50, 3), (1000, 1 << 40), (1000, 10)):
        values = rng.integers(-hi, hi, n)
        got = sorted_unique(values)
        assert got.dtype == values.dtype and got.tolist() == np.unique(values).tolist()
    assert sorted_unique([3, 1, 3]).tolist() == [1, 3]


def lossy_stream(ncpus: int, ntasks: int, seed: int):
    """A random stream with 5% of events lost, a cut beginning, exits and foreign tasks:
    (the simulation, its events)."""
    sim = simulate(ncpus=ncpus, ntasks=ntasks, n_events=5_000, seed=seed, n_others=3, p_exit=0.002)
    rng = np.random.default_rng(seed)
    ev = sim.events[(np.arange(len(sim.events)) >= 200) & (rng.random(len(sim.events)) > 0.05)]
    return sim, ev.reset_index(drop=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lost_switch_in_starts_windowed_equals_whole_trace(seed):
    """The start of a run whose switch-in was lost, read from the events in its window only or
    from every wake-up of the trace: the same, on windows wide and narrow, empty, at one instant
    (several events share a ts), and for tasks never woken in them."""
    sim, ev = lossy_stream(4, 9, seed)
    ts = ev["ts"].to_numpy()
    rng = np.random.default_rng(seed)
    n = 300
    a = rng.integers(0, len(ts), n)
    b = np.minimum(a + rng.choice([0, 1, 5, 50, 2_000], n), len(ts) - 1)
    lo, hi = ts[a], ts[b]
    instants, count = np.unique(ts, return_counts=True)
    lo[:5] = hi[:5] = instants[count > 1][:5]          # windows of one instant several events share
    pid = rng.choice(np.append(sim.tasks["pid"].to_numpy(), 99_999), n).astype(np.int32)
    whole = rc._lost_switch_in_starts(ev, pid, lo, hi, windowed=False)
    windowed = rc._lost_switch_in_starts(ev, pid, lo, hi, windowed=True)
    assert (windowed == whole).all()
    assert (whole > lo).sum() > n // 10 and (whole == lo).sum() > n // 10   # both cases occur
    assert (rc._lost_switch_in_starts(ev, pid, lo, hi) == whole).all()


@pytest.mark.parametrize("state_machine", COMPILED, indirect=True)  # each compared with numpy
@pytest.mark.parametrize("ncpus,ntasks,seed", [(2, 5, 1), (4, 9, 2), (8, 20, 3), (16, 40, 4)])
def test_state_machines_agree_on_lossy_streams(ncpus, ntasks, seed, monkeypatch, state_machine):
    """The compiled and the numpy task_records give the same table, column for column, on random
    streams with 5% of events lost, a cut beginning, exits and foreign tasks."""
    from harmony.analysis import taskstate
    sim, ev = lossy_stream(ncpus, ntasks, seed)
    got = {}
    for name, flag in (("compiled", "1"), ("numpy", "0")):
        monkeypatch.setenv("HARMONY_JIT", flag)
        got[name] = taskstate._build_task_records_and_order(ev, sim.tasks["pid"])[0]
    a, b = got["compiled"], got["numpy"]
    assert (a["anomaly"] > 0).any() and a["first"].sum() == ntasks
    pd.testing.assert_frame_equal(a, b, check_dtype=True)


@pytest.mark.parametrize("count_chunk", [1 << 20, 7])
@pytest.mark.parametrize("categorical", [True, False])
def test_the_records_room_holds_every_record_and_no_more_when_all_are_tasks(categorical,
                                                                            count_chunk,
                                                                            monkeypatch):
    """The compiled state machine writes its records into room sized by _records_room (two a
    switch, one a read event of another kind): never fewer slots than records (a compiled pass
    does not check bounds), and exactly as many when every task of the stream is chosen; also
    when the events are counted a few at a time."""
    from harmony.analysis import taskstate, taskstate_jit
    monkeypatch.setattr(taskstate, "_COUNT_CHUNK", count_chunk)
    from harmony.analysis.arrays import event_kinds
    _, ev = lossy_stream(4, 9, 5)
    if not categorical:
        ev = ev.assign(event=ev["event"].astype(str).astype(object))
    every = np.unique(np.r_[ev["pid"].to_numpy(), ev["prev_pid"].to_numpy()])
    every = every[every >= 0].astype(np.int32)
    kinds = dict(taskstate._EVENT_RECORD, sched_switch=taskstate_jit.SWITCH)
    codes, lut = event_kinds(ev, kinds)
    room = taskstate._records_room(codes, lut, taskstate_jit.SWITCH)
    for pids, exact in ((every, True), (every[::3], False)):
        table = taskstate.key_table(pids, np.int32)
        big = 2 * len(ev) + 1
        rows, task, rec = np.empty(big, np.int32), np.empty(big, np.int32), np.empty(big, np.int8)
        m = taskstate_jit.emit(codes, lut, ev["pid"].to_numpy(), ev["prev_pid"].to_numpy(),
                               table, rows, task, rec)
        assert (m == room) if exact else (0 < m < room), (m, room)


@pytest.mark.parametrize("state_machine", COMPILED, indirect=True)  # each compared with numpy
@pytest.mark.parametrize("ncpus,ntasks,seed", [(2, 5, 1), (4, 9, 2), (8, 20, 3), (16, 40, 4)])
def test_tables_agree_compiled_and_numpy(ncpus, ntasks, seed, monkeypatch, state_machine):
    """df_runqueue, df_runs and df_migrations are the same tables, attrs included, whether the
    compiled kernels or numpy build them: on random lossy streams, with a window that ends between
    two events, a trace cut while tasks run, and a CPU left out of the set (changes outside it are
    counted, not tabled)."""
    from harmony.analysis import taskstate
    sim, ev = lossy_stream(ncpus, ntasks, seed)
    ts = ev["ts"].to_numpy()
    cpus = list(range(ncpus - 1))
    t0 = int(ts[len(ts) // 10])
    switch_in = np.flatnonzero((ev["event"] == "sched_switch") & ev["pid"].isin(sim.tasks["pid"]))
    cut = ev.iloc[:switch_in[len(switch_in) * 6 // 10] + 1]    # stops right after a switch-in
    for ev, t_end in ((ev, int(ts[-len(ts) // 10] + ts[-len(ts) // 10 + 1]) // 2),
                      (cut, int(cut["ts"].iloc[-1]) + 1)):
        got = {}
        for name, flag in (("compiled", "1"), ("numpy", "0")):
            monkeypatch.setenv("HARMONY_JIT", flag)
            taskstate._last.clear()
            got[name] = (rc.df_runqueue(ev, sim.tasks, cpus, t0, t_end),
                         rc.df_runs(ev, sim.tasks, t0, t_end), rc.df_migrations(ev, sim.tasks, t0))
        for a, b in zip(got["compiled"], got["numpy"]):
            pd.testing.assert_frame_equal(a, b, check_dtype=True)
            assert a.attrs == b.attrs
        rq, runs = got["compiled"][0], got["compiled"][1]
        assert rq.attrs["outside_cpus"] > 0 and len(rq) > ncpus
        # the kinds of run are there: seen, running at trace start, lost switch-in
        assert runs["unseen_start"].any() and (runs["start"] == ts[0]).any()
        assert set(runs.attrs["anomaly_kinds"]) == {"run_end_mismatch", "run_start_unseen"}
    assert runs["truncated"].any()   # left open by the cut trace


@pytest.mark.parametrize("state_machine", ["compiled"], indirect=True)  # compared with numpy
def test_runs_whose_switch_in_was_lost_beyond_their_room_are_walked_again(state_machine,
                                                                          monkeypatch):
    """The compiled runs pass gives the runs whose switch-in was lost a small room first; a
    stream with more is walked again with room for them all: the same table as numpy's."""
    from harmony.analysis import taskstate
    sim, ev = lossy_stream(4, 9, 2)
    ts = ev["ts"].to_numpy()
    t0, t_end = int(ts[len(ts) // 10]), int(ts[-1]) + 1
    monkeypatch.setenv("HARMONY_JIT", "0")
    want = rc.df_runs(ev, sim.tasks, t0, t_end)
    assert want["unseen_start"].sum() >= 2
    monkeypatch.setenv("HARMONY_JIT", "1")
    from harmony.analysis import reconstruct_jit
    walks, real = [], reconstruct_jit.runs

    def counted(*args):
        walks.append(1)
        return real(*args)

    monkeypatch.setattr(rc, "LOST_RUNS_ROOM_MIN", 1)
    monkeypatch.setattr(rc, "LOST_RUNS_ROOM_SHARE", 1 << 40)
    monkeypatch.setattr(reconstruct_jit, "runs", counted)
    taskstate._last.clear()
    got = rc.df_runs(ev, sim.tasks, t0, t_end)
    assert len(walks) == 2
    pd.testing.assert_frame_equal(got, want, check_dtype=True)
    assert got.attrs == want.attrs


@pytest.mark.parametrize("state_machine", ["compiled"], indirect=True)  # compared with numpy
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_runs_table_compiled_is_the_numpy_one(seed, state_machine):
    """The runs' columns written by one compiled pass are those numpy's filter, lexsort and
    gathers give: on rows in no order with many tied starts (ties broken by cpu, then end, then
    row order), runs starting at or after t_end, ends past it, open ends and unseen starts."""
    rng = np.random.default_rng(seed)
    n, n_seen, t0, t_end = 3000, 2200, 40, 90
    tasks = tasks_frame(layout_tasks([3, 2, 2, 1], [0, 1, 2, 3]), [7, 3, 12, 5, 9, 30, 11, 4])
    tasks["role"] = ["light", "heavy"] * 4                     # two categories for each column
    pid = rng.choice(tasks["pid"].to_numpy(), n).astype(np.int32)
    cpu = rng.integers(0, 4, n).astype(np.int32)
    start = rng.integers(0, 100, n).astype(np.int64)          # ~30 rows share each start
    end = start + rng.integers(0, 3, n)                        # zero-length runs tie on end too
    state = rng.integers(0, 3, n).astype(np.int64)
    is_open = rng.random(n) < 0.1
    rows = (pid, cpu, start, end, state, is_open)
    want = rc._runs_table(*rows, np.arange(n) >= n_seen, tasks, t0, t_end)
    got = rc._runs_table_compiled(*rows, n_seen, tasks, t0, t_end)
    assert list(got) == list(want)
    assert len(want["pid"]) < n and want["truncated"].any() and want["unseen_start"].any()
    pd.testing.assert_frame_equal(pd.DataFrame(got), pd.DataFrame(want), check_exact=True)


@pytest.mark.parametrize("state_machine", ["threads"], indirect=True)  # compared with one pass
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_runqueue_in_time_ranges_is_one_pass(seed, monkeypatch, state_machine):
    """The run queue built in time ranges on threads, each from the counts the records before it
    leave, is the table one pass builds: with instants of many records where the ranges are cut
    (coarse timestamps), and a task first seen late (its state before its first record counts)."""
    from harmony.analysis import taskstate
    from harmony.core import jit as hjit
    sim, ev = lossy_stream(4, 9, seed)
    ev = ev.assign(ts=ev["ts"] // 5_000 * 5_000)              # ~10 events an instant
    ts = ev["ts"].to_numpy()
    # a task whose events before one of its switch-outs in the second half are dropped: first
    # seen there, it was running (and so counted) from the start
    row = np.arange(len(ev))
    outs = (ev["event"] == "sched_switch").to_numpy() & (row > len(ev) // 2)
    cands = np.intersect1d(ev["prev_pid"].to_numpy()[outs], sim.tasks["pid"])
    late = int(cands[seed % len(cands)])
    out = row[outs & (ev["prev_pid"] == late).to_numpy()][0]
    early = (row < out) & ((ev["pid"] == late) | (ev["prev_pid"] == late)).to_numpy()
    ev = ev[~early].reset_index(drop=True)
    cpus, t0, t_end = [0, 1, 2], int(ts[len(ts) // 10]), int(ts[-len(ts) // 20])
    got = {}
    for threads in (3, 1):
        monkeypatch.setenv("HARMONY_THREADS", str(threads))
        taskstate._last.clear()
        got[threads] = rc.df_runqueue(ev, sim.tasks, cpus, t0, t_end)
    pd.testing.assert_frame_equal(got[3], got[1], check_exact=True)
    assert got[3].attrs == got[1].attrs
    r = taskstate.task_records(ev, sim.tasks["pid"])
    first = r[r["pid"] == late].iloc[0]
    monkeypatch.setenv("HARMONY_THREADS", "3")
    assert taskstate.record_ts(ev, first["seq"]) >= ts[len(ts) // 2] and first["runnable_before"]
    assert len(rc._instant_ranges(taskstate.seq_rows(r), r["seq"].to_numpy(),
                                  ev["ts"].to_numpy(), ts[0])) == 3
    assert hjit.PARALLEL_MIN_ITEMS == 1


def test_instant_ranges_cut_at_an_instants_first_record(monkeypatch):
    """The run queue's time ranges begin at an instant's first record after t_first: a cut inside
    an instant (of any length, here 10,000 records) moves past it, one in t_first's instant too,
    and a cut that finds no later instant is dropped."""
    monkeypatch.setenv("HARMONY_THREADS", "4")
    monkeypatch.setattr("harmony.core.jit.PARALLEL_MIN_ITEMS", 1)
    # instants [0, 7000), [7000, 20000), [20000, 30000), [30000, 40000); cuts asked at 10000,
    # 20000 and 30000 (four threads)
    ts = np.repeat(np.array([5, 7, 9, 11], np.int64), [7_000, 13_000, 10_000, 10_000])
    order = np.random.default_rng(1).permutation(len(ts))       # any table order
    seq = np.empty(len(ts), np.int64)
    seq[order] = 2 * np.arange(len(ts))           # order: rows in time order; event k at ts[k]
    assert rc._instant_ranges(order, seq, ts, 5) == [(0, 20_000), (20_000, 30_000),
                                                     (30_000, 40_000)]
    assert rc._instant_ranges(order, seq, ts, 9) == [(0, 30_000), (30_000, 40_000)]
    one = np.full(50_000, 3, np.int64)
    assert rc._instant_ranges(np.arange(50_000), 2 * np.arange(50_000), one, 0) == [(0, 50_000)]


@pytest.mark.parametrize("side_by_side", [True, False])
def test_core_tables_are_the_three_tables(side_by_side, monkeypatch, state_machine):
    """df_core gives df_migrations, df_runs and df_runqueue as called one by one, attrs included,
    whether it builds the runs on a second thread (forced here, however small the input) or not."""
    from harmony.analysis import taskstate
    sim, ev = lossy_stream(4, 9, 5)
    ts = ev["ts"].to_numpy()
    cpus, t0, t_end = [0, 1, 2, 3], int(ts[len(ts) // 10]), int(ts[-len(ts) // 10])
    monkeypatch.setattr("harmony.core.jit.PARALLEL_MIN_ITEMS", 1 if side_by_side else 1 << 40)
    monkeypatch.setenv("HARMONY_THREADS", "2")
    got = rc.df_core(ev, sim.tasks, cpus, t0, t_end)
    taskstate._last.clear()
    want = {"migrations": rc.df_migrations(ev, sim.tasks, t0),
            "runs": rc.df_runs(ev, sim.tasks, t0, t_end),
            "runqueue": rc.df_runqueue(ev, sim.tasks, cpus, t0, t_end)}
    assert sorted(got) == sorted(want)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_dtype=True)
        assert got[name].attrs == want[name].attrs
    assert len(got["migrations"]) and len(got["runs"]) and len(got["runqueue"]) > 4


def test_the_cached_records_go_with_their_events(state_machine):
    """task_records keeps the last table for the analyses of the same events, and no longer: a
    long-lived process would otherwise hold the last trace's records (~37 bytes per event) until
    the next trace's, in the middle of the memory that trace is decoded into."""
    import gc
    import weakref

    from harmony.analysis import taskstate
    sim, ev = lossy_stream(4, 9, 2)
    r = taskstate.task_records(ev, sim.tasks["pid"])
    assert taskstate.task_records(ev, sim.tasks["pid"]) is r      # the same events: cached
    table = weakref.ref(r)
    del r, ev
    gc.collect()
    assert taskstate._last.value() is None and table() is None


def test_seq_rows_is_the_time_order_of_the_records(state_machine):
    """taskstate.seq_rows: the rows of the records table in seq order, whether the compiled state
    machine handed them over (a counting sort's inverse) or they are sorted afresh."""
    from harmony.analysis import taskstate
    sim, ev = lossy_stream(8, 20, 3)
    r = taskstate.task_records(ev, sim.tasks["pid"])
    want = np.argsort(r["seq"].to_numpy(), kind="stable")
    assert (np.diff(r["seq"].to_numpy()) < 0).any()          # the table itself is by task
    assert (taskstate.seq_rows(r) == want).all()
    assert (taskstate.seq_rows(r.copy()) == want).all()      # not the table built last: sorted


@pytest.mark.parametrize("pids", [[4100, 4101, 4102], [7, 300_000, 42], [5]])
def test_task_info_names_and_roles_each_pid(pids):
    # close pids take the look-up table, far-apart ones the binary search; categories sorted
    tasks = pd.DataFrame({"pid": pids, "name": ["wörker-b", "a", "wörker-b"][:len(pids)],
                          "role": pd.Categorical(["cpu", "io", "cpu"][:len(pids)])})
    rng = np.random.default_rng(len(pids))
    pid = rng.choice(np.asarray(pids, np.int32), 1000)
    name, role = rc._task_info(pid, tasks)
    by_pid = tasks.set_index("pid")
    assert list(name.astype(str)) == [by_pid.at[p, "name"] for p in pid]
    assert list(role.astype(str)) == [by_pid.at[p, "role"] for p in pid]
    assert list(name.categories) == sorted(set(tasks["name"]))
    assert name.categories.dtype == pd.Index(["x"]).dtype      # pandas' own string dtype
    empty_name, _ = rc._task_info(np.zeros(0, np.int32), tasks)
    assert len(empty_name) == 0
