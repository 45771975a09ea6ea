"""What a policy cost (harmony.analysis.cost): idle-while-waiting intervals found by hand in small
streams, moves undone at once, and GPS shares computed by hand for a small mix."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harmony.analysis import cost
from harmony.analysis import reconstruct as rc
from harmony.analysis import tables
from harmony.analysis import thresholds as T
from harmony.analysis.event_streams import Stream

MS = 1_000_000
A, B, C = 101, 102, 103


def tasks(pinned=(False, False, False), duty=(100.0, 100.0, 100.0), nice=(0, 0, 0)):
    return pd.DataFrame({"pid": np.array([A, B, C], np.int32), "name": ["a", "b", "c"],
                         "role": ["w"] * 3, "duty": list(duty), "nice": list(nice),
                         "pinned": list(pinned), "policy": ["other"] * 3,
                         "initial_cpu": [0, 0, 1]})


def idle_while_b_waits(gap_ms: float) -> pd.DataFrame:
    """CPU 0 runs A while B waits there; CPU 1 runs C, goes idle at 10 ms, and pulls B gap_ms
    later."""
    t = 10 * MS + int(gap_ms * MS)
    return (Stream()
            .wakeup(0, 0, A, 0).wakeup(1, 0, B, 0).switch(2, 0, 0, 0, A)
            .wakeup(3, 1, C, 1).switch(4, 1, 0, 0, C)
            .switch(10 * MS, 1, C, 1, 0)
            .migrate(t, 1, B, 0, 1, common_pid=0).switch(t + 1000, 1, 0, 0, B)
            .events())


def test_an_idle_cpu_while_a_task_waits_elsewhere_is_found():
    w = cost.df_wasted(idle_while_b_waits(5), tasks(), [0, 1], 0, 50 * MS)
    tables.WASTED.check(w)
    # CPU 1 idle from 10 ms while B waited on CPU 0, until the pull (B no longer waits there)
    assert w[["cpu", "start", "end", "waiting", "long"]].values.tolist() == [
        [1, 10 * MS, 15 * MS, 1, False]]
    assert w.attrs["wasted_cpu_s"] == pytest.approx(0.005)


def test_idle_spells_found_first_give_the_same_table_and_the_records_are_released_once():
    """The pipeline finds the CPUs' idle spells before the task records exist and frees the
    records when df_wasted has read them: the same table; spells of other CPUs are refused."""
    ev = idle_while_b_waits(5)
    read = []
    w = cost.df_wasted(ev, tasks(), [1, 0, 1], 0, 50 * MS, idle=cost.idle_spells(ev, [0, 1]),
                       records_read=lambda: read.append(True))
    pd.testing.assert_frame_equal(w, cost.df_wasted(ev, tasks(), [1, 0, 1], 0, 50 * MS))
    assert read == [True]
    with pytest.raises(ValueError, match="idle spells of CPUs"):
        cost.df_wasted(ev, tasks(), [0, 1], 0, 50 * MS, idle=cost.idle_spells(ev, [0]))


def test_a_pinned_task_waiting_elsewhere_wastes_nothing():
    w = cost.df_wasted(idle_while_b_waits(5), tasks(pinned=(False, True, False)), [0, 1], 0,
                       50 * MS)
    assert len(w) == 0 and w.attrs["wasted_cpu_s"] == 0


def test_two_idle_cpus_and_one_waiting_task_waste_one_cpu():
    ev = (Stream().wakeup(0, 0, A, 0).wakeup(1, 0, B, 0).switch(2, 0, 0, 0, A)
          .switch(3, 1, C, 1, 0).switch(4, 2, 0, 0, 0)
          .events())
    w = cost.df_wasted(ev, tasks(), [0, 1, 2], 0, 10 * MS)
    assert sorted(w["cpu"].tolist()) == [1, 2]
    assert w.attrs["wasted_cpu_s"] == pytest.approx((10 * MS - 3) / 1e9)


def test_a_move_undone_at_once_is_useless():
    def stream(back_ms):
        ev = (Stream().wakeup(0, 0, A, 0).switch(1, 0, 0, 0, A).switch(2, 0, A, 0, 0)
              .migrate(1 * MS, 1, A, 0, 1, common_pid=0)
              .migrate(1 * MS + int(back_ms * MS), 0, A, 1, 0, common_pid=0).events())
        return cost.df_useless_migrations(rc.df_migrations(ev, tasks(), 0), 0, 100 * MS)
    u = stream(3)
    tables.USELESS_MIGRATIONS.check(u)
    assert u[["pid", "src_cpu", "dst_cpu", "back_ns"]].values.tolist() == [[A, 0, 1, 3 * MS]]


def newidle_pull_after(v_s):
    return len(cost.df_wasted(idle_while_b_waits(v_s * 1e3), tasks(), [0, 1], 0, 50 * MS)
               .query("long"))


def back_after(v_s):
    ev = (Stream().wakeup(0, 0, A, 0).switch(1, 0, 0, 0, A).switch(2, 0, A, 0, 0)
          .migrate(1 * MS, 1, A, 0, 1, common_pid=0)
          .migrate(1 * MS + int(round(v_s * 1e9)), 0, A, 1, 0, common_pid=0).events())
    return len(cost.df_useless_migrations(rc.df_migrations(ev, tasks(), 0), 0, 100 * MS))


COST_CASES = [
    # (threshold, rule: its value -> the count, (below, at, above))
    ("WASTED_EPISODE_MIN_S", newidle_pull_after, (0, 1, 1)),
    ("USELESS_MIGRATION_WITHIN_S", back_after, (1, 1, 0)),
]


@pytest.mark.parametrize("name,rule,want", COST_CASES, ids=[c[0] for c in COST_CASES])
def test_cost_thresholds_below_at_and_above(name, rule, want):
    t = T.ALL[name]
    assert tuple(rule(v) for v in (t * 0.9, t, t * 1.1)) == want


def test_gps_shares_by_hand():
    # 3 tasks on 2 CPUs: nice 0 (1024), nice 0 (1024), nice 5 (335), demands 1, 0.3, 1.
    # Unconstrained: 2 * w / 2383 = 0.859, 0.859, 0.281: b is capped at 0.3; the 1.7 left is
    # shared 1024 : 335 -> a = 1.7 * 1024 / 1359 = 1.2809 > 1: capped at 1; c gets 0.7.
    tk = tasks(duty=(100.0, 30.0, 100.0), nice=(0, 0, 5))
    alloc = pd.DataFrame({"pid": np.array([A, B, C], np.int32),
                          "name": pd.Categorical(["a", "b", "c"]),
                          "role": pd.Categorical(["w"] * 3), "window": np.zeros(3, np.int64),
                          "window_start": np.zeros(3, np.int64), "t": np.zeros(3),
                          "window_s": np.ones(3), "cpu_time": [0.9, 0.3, 0.5],
                          "share": [0.9, 0.3, 0.5]})
    ideal = cost.df_ideal(alloc, tk, 2)
    tables.IDEAL.check(ideal)
    assert ideal["ideal"].tolist() == pytest.approx([1.0, 0.3, 0.7])
    assert ideal["slowdown"].tolist() == pytest.approx([1 / 0.9, 1.0, 0.7 / 0.5])
    d = cost.ideal_distance(ideal)
    assert d["mean_abs_error"] == pytest.approx((0.1 + 0 + 0.2) / 3)
    r = np.array([0.9, 1.0, 0.5 / 0.7])
    assert d["jain"] == pytest.approx(r.sum() ** 2 / (3 * (r * r).sum()))
    assert d["slowdown_max"] == pytest.approx(1.4)


def test_an_exited_task_is_owed_nothing():
    tk = tasks().assign(stop_after_s=[np.nan, 1.0, np.nan])
    alloc = pd.DataFrame({"pid": np.array([A, B, C] * 2, np.int32),
                          "name": pd.Categorical(["a", "b", "c"] * 2),
                          "role": pd.Categorical(["w"] * 6), "window": np.repeat([0, 1], 3),
                          "window_start": np.zeros(6, np.int64), "t": np.repeat([0.0, 1.0], 3),
                          "window_s": np.ones(6), "cpu_time": [2 / 3] * 3 + [1, 0, 1],
                          "share": [2 / 3] * 3 + [1, 0, 1]})
    ideal = cost.df_ideal(alloc, tk, 2)
    assert ideal["ideal"].tolist() == pytest.approx([2 / 3] * 3 + [1, 0, 1])
    assert cost.ideal_distance(ideal)["mean_abs_error"] == pytest.approx(0)


def test_the_short_last_window_is_not_judged():
    tk = tasks()
    alloc = pd.DataFrame({"pid": np.array([A, B, C] * 2, np.int32),
                          "name": pd.Categorical(["a", "b", "c"] * 2),
                          "role": pd.Categorical(["w"] * 6), "window": np.repeat([0, 1], 3),
                          "window_start": np.zeros(6, np.int64), "t": np.repeat([0.0, 1.0], 3),
                          "window_s": np.repeat([1.0, 0.001], 3),
                          "cpu_time": [2 / 3, 2 / 3, 1 / 3, 0.001, 0.001, 0],
                          "share": [2 / 3, 2 / 3, 1 / 3, 1, 1, 0]})
    d = cost.ideal_distance(cost.df_ideal(alloc, tk, 2))
    assert d["slowdown_max"] == pytest.approx(2.0)        # c in the first window, not inf
    assert d["mean_abs_error"] == pytest.approx((1 / 3 + 4 / 3 * 0.001) / 3.003)


def test_idleness_a_blind_probe_did_not_see_end_is_cut_at_its_last_sign():
    # as idle_while_b_waits(30), but the switch out of CPU 1's idle task is missing (a probe blind
    # there): C's wake-up recorded on CPU 1 in C's own context at 12 ms shows CPU 1 busy by then,
    # since some instant after the last event of its idle context (a wake-up at 11 ms)
    ev = (Stream()
          .wakeup(0, 0, A, 0).wakeup(1, 0, B, 0).switch(2, 0, 0, 0, A)
          .wakeup(3, 1, C, 1).switch(4, 1, 0, 0, C)
          .switch(10 * MS, 1, C, 1, 0)
          .wakeup(11 * MS, 1, C, 1, common_pid=0)
          .waking(12 * MS, 1, A, 0, common_pid=C)
          .migrate(40 * MS, 1, B, 0, 1, common_pid=0).switch(40 * MS + 1000, 1, C, 1, B)
          .events())
    w = cost.df_wasted(ev, tasks(), [0, 1], 0, 50 * MS)
    assert w[["cpu", "start", "end"]].values.tolist() == [[1, 10 * MS, 11 * MS]]


def test_an_import_hands_its_wasted_table_to_the_metrics_and_frees_the_records(tmp_path):
    """The pipeline makes the wasted table while the task records exist and frees them before the
    checks and metrics (harmony.pipeline.analyse_capture): the summary's waste is what the
    stored tables give when it is made afresh, and no task records are left held."""
    from harmony.analysis import taskstate
    from harmony.importer import import_trace
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat

    events = idle_while_b_waits(5)
    markers = pd.DataFrame({"ts": np.zeros(0, np.int64), "cpu": np.zeros(0, np.int16),
                            "pid": np.zeros(0, np.int32), "text": []})
    write_recording(events, markers, {"cpus": [0, 1]}, tmp_path / "rec")
    run = import_trace(write_tracedat(tmp_path / "rec", tmp_path / "t.dat"), tmp_path / "run",
                       pids=[A, B, C], end_s=0.05)
    assert taskstate._last.value() is None
    m = run.manifest
    fresh = cost.cost_summary(run.events, run.tasks, run.migrations, run.allocation, m["cpus"],
                              m["t0_ns"], m["end_ns"])
    assert run.summary["wasted_cpu_s"] == pytest.approx(0.005) == fresh["wasted_cpu_s"]
    assert run.summary["wasted_episodes"] == fresh["wasted_episodes"]
    assert run.summary["wasted_longest"] == fresh["wasted_longest"]


@pytest.mark.parametrize("n", [0, 1, 3, 4, 200])
@pytest.mark.parametrize("distinct", [2, 7, 10**9])
def test_the_longest_episodes_are_the_stable_sort_cut_short(n, distinct):
    """The summary's longest episodes, taken without sorting every row, are the rows pandas' stable
    descending sort puts first: the same rows in the same order, ties (few distinct durations)
    in the table's order."""
    rng = np.random.default_rng(n * 31 + distinct)
    wasted = pd.DataFrame({"duration": rng.integers(1, distinct, n, dtype=np.int64),
                           "cpu": rng.integers(0, 4, n)})
    want = wasted.sort_values("duration", ascending=False, kind="stable").head(cost.LONGEST)
    got = cost.longest_first(wasted, cost.LONGEST)
    assert got.index.tolist() == want.index.tolist()
    pd.testing.assert_frame_equal(got, want)
