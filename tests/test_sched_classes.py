"""Scheduling classes and the warm release, without a kernel: parameters, task specs, what the
host is asked before anything starts, fair shares by class, the release check of a warm release,
the notes, the report's lines, the card's wording, the simulator's refusal."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harmony.analysis import policy, reconstruct, report, trust
from harmony.analysis.refpolicy import refuse_classes
from harmony.analysis.release import release_spread
from harmony.core.errors import ControllerError, ParameterError
from harmony.experiments import CATALOG, get_experiment
from harmony.experiments.base import WARM_S
from harmony.simulate import simulate_run
from harmony.workload.controller import FIFO_PRIO, check_classes, fifo_priority, warm_s
from harmony.workload.tasks import (
    TASKS,
    TaskSpec,
    class_counts,
    class_label,
    classes_text,
    layout_tasks,
    sched_classes,
    tasks_frame,
)

CPUS = [0, 1]
#: a host as hostfacts.rt_bandwidth reads this one: 95 % per CPU, 5 % each for 2 fair servers
BW = {"rt_runtime_us": 950000, "rt_period_us": 1000000, "rt_share": 0.95,
      "dl_bw_per_cpu": 0.95, "dl_reserved": 0.1, "dl_rd_cpus": 2}


# --- parameters -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CATALOG))
def test_every_experiment_takes_the_class_and_the_release(name):
    exp = get_experiment(name)
    p = exp.resolve({}, CPUS)
    assert (p["policy"], p["rt_priority"], p["release"], p["warm_s"]) \
        == ("other", 0, "warm", WARM_S)
    fifo = exp.resolve({"policy": "fifo", "rt_priority": "7", "release": "cold",
                        **({"nice_diff": "0"} if name == "priority-classes" else {})}, CPUS)
    specs = exp.tasks({**fifo, **exp.draw(fifo, CPUS, 0)}, CPUS)
    assert {s.label for s in specs} == {"SCHED_FIFO 7"}


@pytest.mark.parametrize("overrides,says", [
    ({"policy": "rr", "rt_priority": "99"}, "99 is left to Harmony's controller"),
    ({"rt_priority": "5"}, "rt_priority=5 applies to fifo and rr only, not to other"),
    ({"policy": "idle", "nice": "3"}, "nice=3 applies to other and batch only, not to idle"),
    ({"policy": "deadline"}, "deadline has no default bandwidth: add -p dl_runtime_ms=MS -p "
                             "dl_period_ms=MS"),
    ({"policy": "deadline", "dl_runtime_ms": "20", "dl_period_ms": "10"},
     "deadline needs runtime <= deadline <= period, got 20 / 10 / 10 ms"),
    ({"policy": "deadline", "dl_runtime_ms": "5", "dl_deadline_ms": "50", "dl_period_ms": "40"},
     "runtime <= deadline <= period, got 5 / 50 / 40 ms"),
    ({"policy": "deadline", "dl_runtime_ms": "0.0005", "dl_period_ms": "10"},
     "below the kernel's minimum"),
    ({"dl_runtime_ms": "5"}, "apply to deadline only, not to other"),
    ({"policy": "sporadic"}, "parameter policy=sporadic: must be one of other, batch, idle, fifo"),
    ({"release": "tepid"}, "parameter release=tepid: must be one of warm, cold"),
    ({"warm_s": "0"}, "parameter warm_s=0.0: must be positive"),
])
def test_bad_classes_are_one_line_parameter_errors(overrides, says):
    with pytest.raises(ParameterError, match=".*") as exc:
        get_experiment("single-source").resolve(overrides, CPUS)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_two_class_experiments_have_a_class_per_class():
    hl = get_experiment("heavy-light")
    p = hl.resolve({"heavy_policy": "fifo", "heavy_rt_priority": "10"}, CPUS)
    labels = {s.role: s.label for s in hl.tasks(p, CPUS)}
    assert labels == {"heavy": "SCHED_FIFO 10", "light": "SCHED_OTHER"}
    # unset per-class parameters are the common ones
    p = hl.resolve({"policy": "batch", "light_policy": "idle"}, CPUS)
    assert {s.role: s.label for s in hl.tasks(p, CPUS)} == {"heavy": "SCHED_BATCH",
                                                             "light": "SCHED_IDLE"}
    with pytest.raises(ParameterError, match="light tasks: deadline has no default bandwidth: "
                                             "add -p light_dl_runtime_ms=MS"):
        hl.resolve({"light_policy": "deadline"}, CPUS)
    pc = get_experiment("priority-classes")
    with pytest.raises(ParameterError, match="low tasks: nice=10 applies to other and batch only"):
        pc.resolve({"policy": "fifo", "rt_priority": "5"}, CPUS)
    p = pc.resolve({"policy": "rr", "high_rt_priority": "20", "low_rt_priority": "10",
                    "nice_diff": "0"}, CPUS)
    assert {s.role: s.label for s in pc.tasks(p, CPUS)} \
        == {"high": "SCHED_RR 20", "low": "SCHED_RR 10"}
    # an unset per-class parameter reads and prints as an empty value
    param = next(q for q in hl.all_params() if q.name == "heavy_policy")
    assert param.parse("") is None and param.format(None) == ""


def test_fifo_and_rr_without_a_priority_run_at_the_documented_default():
    """-p policy=fifo alone: every task at RT_PRIORITY_DEFAULT, recorded in the parameters; a
    class of a two-class experiment gets it as its own, the other class keeps its own."""
    from harmony.workload.tasks import RT_PRIORITY_DEFAULT

    ss = get_experiment("single-source")
    for policy_name in ("fifo", "rr"):
        p = ss.resolve({"policy": policy_name}, CPUS)
        assert p["rt_priority"] == RT_PRIORITY_DEFAULT == 50
        assert {s.label for s in ss.tasks(p, CPUS)} == {f"SCHED_{policy_name.upper()} 50"}
    assert ss.resolve({"policy": "fifo", "rt_priority": "7"}, CPUS)["rt_priority"] == 7
    assert str(RT_PRIORITY_DEFAULT) in next(q.help for q in ss.all_params()
                                            if q.name == "rt_priority")
    hl = get_experiment("heavy-light")
    p = hl.resolve({"heavy_policy": "fifo"}, CPUS)
    assert {s.role: s.label for s in hl.tasks(p, CPUS)} == {"heavy": "SCHED_FIFO 50",
                                                             "light": "SCHED_OTHER"}
    p = hl.resolve({"policy": "rr", "light_policy": "other"}, CPUS)
    assert (p["rt_priority"], p["heavy_rt_priority"]) == (0, 50)
    assert {s.role: s.label for s in hl.tasks(p, CPUS)} == {"heavy": "SCHED_RR 50",
                                                             "light": "SCHED_OTHER"}


# --- task specs ---------------------------------------------------------------------------------

def test_task_specs_carry_their_class_into_the_tasks_table():
    specs = [TaskSpec("a"), TaskSpec("b", role="heavy", policy="fifo", rt_priority=50),
             TaskSpec("c", role="heavy", policy="deadline", dl_runtime_ms=10, dl_period_ms=100)]
    assert specs[2].dl_deadline_ms == 100 and specs[2].dl_bandwidth == pytest.approx(0.1)
    assert [s.label for s in specs] == ["SCHED_OTHER", "SCHED_FIFO 50",
                                        "SCHED_DEADLINE 10/100/100 ms"]
    df = tasks_frame(specs, [1, 2, 3])
    TASKS.check(df)
    assert df["policy"].tolist() == ["other", "fifo", "deadline"]
    assert sched_classes(specs) == {"cpu": "SCHED_OTHER",
                                    "heavy": "SCHED_FIFO 50 + SCHED_DEADLINE 10/100/100 ms"}
    assert class_counts(df) == {"SCHED_OTHER": 1, "SCHED_FIFO 50": 1,
                                "SCHED_DEADLINE 10/100/100 ms": 1}
    # a tasks table recorded before the classes: all SCHED_OTHER
    assert class_counts(df.drop(columns=["policy", "rt_priority"])) == {"SCHED_OTHER": 3}
    assert classes_text({"cpu": "SCHED_OTHER"}) is None and classes_text(None) is None
    assert classes_text({"cpu": "SCHED_FIFO 5"}) == "SCHED_FIFO 5"
    assert classes_text({"heavy": "SCHED_FIFO 5", "light": "SCHED_OTHER"}) == \
        "heavy SCHED_FIFO 5, light SCHED_OTHER"
    assert class_label("rr", 3) == "SCHED_RR 3"
    with pytest.raises(ValueError, match="task x: rt_priority=0: fifo needs"):
        TaskSpec("x", policy="fifo")


# --- what the host is asked before anything starts -------------------------------------------

def test_the_controller_runs_above_every_real_time_task():
    assert fifo_priority([TaskSpec("a")]) == FIFO_PRIO
    assert fifo_priority(layout_tasks([2, 0], CPUS, policy="fifo", rt_priority=5)) == FIFO_PRIO
    assert fifo_priority(layout_tasks([2, 0], CPUS, policy="rr", rt_priority=40)) == 41
    assert warm_s({"release": "warm", "warm_s": 0.4}) == 0.4
    assert warm_s({"release": "cold", "warm_s": 0.4}) is None and warm_s({}) is None


def _dl(n, runtime, cpu=0, **kw):
    return [TaskSpec(f"d{i}", initial_cpu=cpu, policy="deadline", dl_runtime_ms=runtime,
                     dl_period_ms=100, **kw) for i in range(n)]


def test_deadline_tasks_the_host_cannot_take_are_refused_in_one_line():
    check_classes(_dl(4, 10), CPUS, warm=0.25, placement="cpuset", bandwidth=BW)   # 0.4 of 1.8
    check_classes(layout_tasks([4, 0], CPUS, policy="fifo", rt_priority=5), CPUS, 0.25,
                  "affinity", BW)
    with pytest.raises(ControllerError, match="task d0 is SCHED_DEADLINE and pinned to CPU 1"):
        check_classes(_dl(1, 10, cpu=1, pinned=True), CPUS, bandwidth=BW, placement="cpuset")
    with pytest.raises(ControllerError, match="held on their initial CPU by a cpuset only "
                                              r"\(HARMONY_RELEASE_PLACEMENT=affinity\)"):
        check_classes(_dl(1, 10), CPUS, placement="affinity", bandwidth=BW)
    with pytest.raises(ControllerError) as exc:
        check_classes(_dl(4, 50), CPUS, placement="cpuset", bandwidth=BW)
    assert str(exc.value) == (
        "deadline admission control would refuse the tasks: 4 x SCHED_DEADLINE 50/100/100 ms = "
        "2.00 CPUs, and it admits 0.95 of each of 2 CPUs less 0.10 already reserved (deadline "
        "servers, other deadline tasks) = 1.80")
    # confined through a warm-up, CPU 0 would give them 1.6 of itself: the controller starves
    check_classes(_dl(4, 40), CPUS, warm=None, placement="cpuset", bandwidth=BW)
    with pytest.raises(ControllerError, match="CPU 0's would take 1.60 of it, more than the 0.90"):
        check_classes(_dl(4, 40), CPUS, warm=0.25, placement="cpuset", bandwidth=BW)
    # no limit (sched_rt_runtime_us -1, sched/debug unreadable): nothing to refuse
    check_classes(_dl(4, 90), CPUS, placement="cpuset",
                  bandwidth=BW | {"rt_share": None, "dl_bw_per_cpu": None, "dl_reserved": None})


# --- fair shares by class --------------------------------------------------------------------

def _tasks(rows):
    """(policy, rt_priority, nice, duty, dl_runtime_ms, dl_period_ms) per task."""
    cols = ["policy", "rt_priority", "nice", "duty", "dl_runtime_ms", "dl_period_ms"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(pid=np.arange(len(df)) + 1, dl_deadline_ms=df["dl_period_ms"])


def test_fair_share_of_the_fair_classes_is_as_it_was():
    tasks = _tasks([("other", 0, n, d, 0, 0) for n, d in [(0, 100), (5, 100), (-3, 40), (0, 100)]])
    w = reconstruct.nice_to_weight(tasks["nice"])
    expected = reconstruct.fair_shares(w, tasks["duty"] / 100, 2)
    assert np.allclose(reconstruct.class_fair_shares(tasks, 2), expected)
    # a table recorded before classes existed: the same
    assert np.allclose(reconstruct.class_fair_shares(
        tasks.drop(columns=["policy", "rt_priority", "dl_runtime_ms",
                            "dl_period_ms"]), 2), expected)


def test_fair_share_by_each_class_rule():
    # FIFO tasks of one priority split the CPUs equally, capped by RT throttling
    fifo = _tasks([("fifo", 5, 0, 100, 0, 0)] * 4)
    assert np.allclose(reconstruct.class_fair_shares(fifo, 2, rt_share=0.95), [0.475] * 4)
    assert np.allclose(reconstruct.class_fair_shares(fifo, 2), [0.5] * 4)
    # a higher priority first; the rest for the next; the fair class gets what RT throttling leaves
    mixed = _tasks([("rr", 20, 0, 100, 0, 0), ("fifo", 10, 0, 100, 0, 0),
                    ("fifo", 10, 0, 100, 0, 0), ("fifo", 10, 0, 100, 0, 0),
                    ("other", 0, 0, 100, 0, 0)])
    got = reconstruct.class_fair_shares(mixed, 2, rt_share=0.95)
    assert np.allclose(got, [0.95, 0.95 / 3, 0.95 / 3, 0.95 / 3, 0.1])
    # deadline: its reservation; idle weighs 3 against nice 0's 1024
    dl = _tasks([("deadline", 0, 0, 100, 10, 100), ("other", 0, 0, 100, 0, 0),
                 ("idle", 0, 0, 100, 0, 0), ("other", 0, 0, 100, 0, 0)])
    got = reconstruct.class_fair_shares(dl, 1)
    assert got[0] == pytest.approx(0.1)
    assert got[1] == pytest.approx(got[3]) and got[2] == pytest.approx(0.9 * 3 / (2048 + 3))
    assert list(reconstruct.class_weight([0, 0, 0, 5], ["other", "idle", "fifo", "batch"])) == \
        [1024, 3, 0, 335]


def test_shares_table_says_each_task_class():
    tasks = tasks_frame(layout_tasks([2, 0], CPUS, policy="rr", rt_priority=3), [1, 2])
    runs = pd.DataFrame({"pid": [1, 2], "start": [0, 0], "end": [10**9, 0]})
    shares = reconstruct.df_task_share(runs, tasks, CPUS, 0, 10**9, rt_share=0.95)
    assert shares["policy"].tolist() == ["rr", "rr"] and shares["weight"].tolist() == [0, 0]
    assert shares["fair"].tolist() == pytest.approx([0.95, 0.95])
    assert shares["ratio"].tolist() == pytest.approx([1 / 0.95, 0.0])


# --- the release check of a warm release -------------------------------------------------------

def test_a_warm_release_is_checked_where_it_applies():
    """Woken at the warm-up marker (100), confined; t0 at 500, released at 520."""
    tasks = pd.DataFrame({"pid": [11, 12, 13], "initial_cpu": [0, 0, 1]})
    ev = pd.DataFrame([(50, "sched_switch", 11, -1),        # ran before its gate opened
                       (110, "sched_wakeup", 11, 0), (111, "sched_wakeup", 12, 1),  # 12 elsewhere
                       (112, "sched_wakeup", 13, 1), (300, "sched_migrate_task", 13, -1),
                       (510, "sched_migrate_task", 11, -1), (900, "sched_migrate_task", 12, -1)],
                      columns=["ts", "event", "pid", "target_cpu"]).astype({"event": "category"})
    r = release_spread(ev, tasks, t0=500, released=520, warmup=100)
    assert r["warm"] and r["woken"] == 3 and r["not_woken"] == []
    assert r["warmed_s"] == pytest.approx(400e-9)
    assert r["ran_before_t0"] == [11]
    assert r["woke_off_initial_cpu"] == [12, 13]            # woken off it, moved while confined
    assert r["moved_before_released"] == 1                  # 11 at 510, inside the widening
    assert r["release_spread_ns"] == 20 and r["wake_spread_ns"] == 2
    assert r["first_wakeup_after_t0_ns"] is None
    cold = release_spread(ev, tasks, t0=500, released=520)
    assert not cold["warm"] and cold["warmed_s"] is None and cold["woken"] == 0


# --- notes and the report --------------------------------------------------------------------

def _manifest(**kw):
    m = {"release": {"not_woken": [], "woke_off_initial_cpu": []}, "reconstruction_anomalies": 0,
         "lost_events": 0, "params": {"duration": 1.0}, "measured_s": 1.0}
    return m | kw


def test_notes_on_classes_and_the_release():
    m = _manifest(sched={"rt_runtime_us": 950000, "rt_period_us": 1000000},
                  sched_class_counts={"SCHED_FIFO 5": 3, "SCHED_OTHER": 1})
    (n,) = [n for n in trust.check_notes(m, "recorded") if n["kind"] == "rt_throttling"]
    assert trust.word(n).startswith("3 real-time tasks: RT throttling lets SCHED_FIFO and SCHED_RR "
                                    "tasks have at most 950000 us of every 1000000 us of each "
                                    "CPU (95%)")
    off = trust.note("rt_throttling", tasks=1, runtime_us=-1, period_us=1000000)
    assert "RT throttling off (sched_rt_runtime_us = -1)" in trust.word(off)
    # no real-time task, or no facts (an import): no note
    m = _manifest(sched={"rt_runtime_us": 950000, "rt_period_us": 1000000},
                  sched_class_counts={"SCHED_DEADLINE 1/10/10 ms": 2})
    assert not [n for n in trust.check_notes(m, "recorded") if n["kind"] == "rt_throttling"]
    # a warm-up too short for PELT, and a warm release a simulation cannot model
    m = _manifest(release={"not_woken": [7], "woke_off_initial_cpu": [], "warm": True,
                           "warmed_s": 0.05}, params={"duration": 1.0, "release": "warm"})
    words = trust.words(trust.check_notes(m, "simulated"))
    assert "1 tasks were never seen waking at the warm-up (before t0)" in words
    assert any(w.startswith("the warm release ran the tasks confined for 0.050 s before t0, 1.5 "
                            "PELT half-lives: 34.7% of their load history") for w in words), words
    assert any("the reference policy keeps no load history" in w for w in words)
    m["release"]["warmed_s"] = 0.25
    assert not [n for n in trust.check_notes(m, "recorded")
                if n["kind"] in ("warmup_short", "release_not_modelled")]


def test_report_says_the_class_the_release_and_rt_throttling():
    m = _manifest(release={"warm": True, "warmed_s": 0.25, "woken": 4, "release_spread_ns": 45_000},
                  release_method="cpuset", sched_class_counts={"SCHED_FIFO 5": 4},
                  sched={"rt_runtime_us": 950000, "rt_period_us": 1000000,
                         "controller_fifo_priority": 10})
    lines = report.trust_lines(m)
    assert ("release spread               0.045 ms (warm: 4 tasks ran confined for 0.250 s, then "
            "the CPU set was widened; cpuset)") in lines
    assert "scheduling class             SCHED_FIFO 5 (4 tasks)" in lines
    assert ("RT throttling                950000 of 1000000 us (95% of a CPU); controller at "
            "SCHED_FIFO 10") in lines
    m = _manifest(sched_class_counts={"SCHED_OTHER": 4}, sched={"rt_runtime_us": 950000})
    assert not [x for x in report.trust_lines(m) if x.startswith("RT throttling")]


# --- the card ------------------------------------------------------------------------------

def _evidence(name, classes=None, release="warm", kernel="6.18"):
    m = {"host": {"kernel": kernel, "scheduler": "EEVDF"}, "params": {"release": release},
         "sched_classes": classes}
    return policy.Evidence(policy.Path(f"/runs/{name}"), "single-source", {"duration": 10.0}, 2,
                           {"balance_migrations": 1, "balanced_at_end": False},
                           policy.setup_of(m), policy.classes_of(m))


def test_card_says_which_class_it_describes():
    other = [_evidence(f"o{i}", {"cpu": "SCHED_OTHER"}) for i in range(2)]
    card = policy.infer_evidence(other)
    assert card.setups == {"6.18, EEVDF": 2}
    assert "scheduling class" not in card.text() and "POOLED" not in card.text()
    assert "classes" not in card.to_dict()
    fifo = [_evidence(f"f{i}", {"cpu": "SCHED_FIFO 5"}) for i in range(2)]
    card = policy.infer_evidence(fifo)
    assert "tasks' scheduling class: SCHED_FIFO 5 (2 runs)" in card.text()
    assert card.to_dict()["classes"] == {"SCHED_FIFO 5": 2}
    pooled = policy.infer_evidence(other + fifo).text()
    assert ("POOLED: these runs come from 2 setups (6.18, EEVDF (2 runs); 6.18, EEVDF, tasks "
            "SCHED_FIFO 5 (2 runs))") in pooled
    assert "tasks' scheduling class: SCHED_OTHER (2 runs); SCHED_FIFO 5 (2 runs)" in pooled


def test_a_cold_release_is_a_setup_of_its_own():
    warm, cold = _evidence("w"), _evidence("c", release="cold")
    old = policy.setup_of({"host": {"kernel": "6.18", "scheduler": "EEVDF"}, "params": {}})
    assert old == cold.setup == "6.18, EEVDF, cold release"        # recorded before: cold
    assert "POOLED: these runs come from 2 setups" in policy.infer_evidence([warm, cold]).text()
    mixed = _evidence("m", {"heavy": "SCHED_FIFO 5", "light": "SCHED_OTHER"}, release="cold")
    assert mixed.setup == "6.18, EEVDF, tasks heavy SCHED_FIFO 5, light SCHED_OTHER, cold release"


# --- the simulator -------------------------------------------------------------------------

def test_the_simulator_refuses_real_time_classes(tmp_path):
    with pytest.raises(ParameterError, match="policy deadline, fifo cannot be simulated"):
        refuse_classes(params={"heavy_policy": "fifo", "light_policy": "deadline",
                               "policy": "other"})
    with pytest.raises(ParameterError, match="policy rr cannot be simulated"):
        simulate_run("poly-balance", "single-source", 2, tmp_path / "rr",
                     {"policy": "rr", "rt_priority": "3"})
    assert not (tmp_path / "rr").exists()


def test_the_simulator_runs_idle_tasks_by_their_weight(tmp_path):
    """<1,1,0>... two tasks on one CPU pinned: nice 0 against SCHED_IDLE share 1024 : 3."""
    run = simulate_run("poly-balance", "heavy-light", 2, tmp_path / "idle",
                       {"light_policy": "idle", "light_duty": "100", "static": "1", "duration": "2",
                        "long_warmup_s": "1"})
    s = run.shares.set_index("role")
    assert set(run.shares["policy"]) == {"other", "idle"}
    assert s.loc["heavy", "share"].min() > 0.9 and s.loc["light", "share"].max() < 0.05
    assert run.manifest["sched_classes"] == {"heavy": "SCHED_OTHER", "light": "SCHED_IDLE"}
    assert any("keeps no load history" in n for n in run.manifest["notes"])


def test_the_controllers_threads_are_kept_off_the_cpus_under_test_and_put_back():
    """keep_off moves the given threads to the CPUs this process may use outside the set and
    says which; put_back gives each its CPUs again; a set of every CPU moves nothing."""
    import os
    import threading

    from harmony.workload.controller import keep_off, put_back

    from conftest import host_skip

    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        host_skip("needs two CPUs")
    ready, done = threading.Event(), threading.Event()
    tids = []

    def idle():
        tids.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    t = threading.Thread(target=idle)
    t.start()
    ready.wait(10)
    try:
        assert keep_off(tids, mine) == ({}, [])
        moved, spare = keep_off(tids + [2 ** 22 + 7], mine[:1])     # a gone thread: left out
        assert spare == mine[1:] and set(moved) == set(tids)
        assert os.sched_getaffinity(tids[0]) == set(mine[1:])
        put_back(moved)
        assert moved == {} and os.sched_getaffinity(tids[0]) == set(mine)
        put_back(moved)                                             # again: nothing to do
    finally:
        done.set()
        t.join()
