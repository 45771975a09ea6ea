"""Balancing rounds, first-round moves, steal latency and detection intervals (E2-E5), hermetic.

Every scenario is a hand-written sched event stream (analysis.event_streams.Stream) for P = 2, 4, 8
CPUs with a known answer; the experiments' analyse() runs on the same streams through a run
directory written here, so the summary keys the policy inference relies on are checked too.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest

from harmony import store
from harmony.analysis import reconstruct, rounds
from harmony.analysis.event_streams import EXIT_DEAD, Stream
from harmony.experiments import get_experiment
from harmony.workload.tasks import tasks_frame

T0 = 1_000_000_000
MS = 1_000_000
CONTRACT = {
    "how-many": ["x", "ncpus", "ntasks", "first_round_moved", "first_round_to_target",
                 "poly_prediction", "pairwise_prediction", "first_round_end_s",
                 "time_to_balance_s"],
    "time-to-resolve": ["time_to_balance_s", "balanced_at_end", "migrations"],
    "work-conservation": ["target_idle_at_s", "steal_latency_s", "stolen"],
    "detection": ["cut_at_s", "interval1_ms", "interval2_ms", "interval3_ms"],
}


class World:
    """Experiment tasks on per-CPU queues (index 0 runs) and the events that change them."""

    def __init__(self, tasks: pd.DataFrame, ncpus: int):
        self.tasks = tasks
        self.s = Stream({int(p): str(c)
                         for p, c in zip(tasks["pid"], tasks.get("comm", tasks["name"]))})
        self.q = {c: [] for c in range(ncpus)}
        ts = T0 + 1000
        for pid, cpu in zip(tasks["pid"], tasks["initial_cpu"]):
            self.s.wakeup(ts, int(cpu), int(pid), int(cpu))
            self.q[int(cpu)].append(int(pid))
            ts += 1
        for cpu, queue in self.q.items():
            self.s.switch(ts, cpu, 0, 0, queue[0] if queue else 0)
        self.last = ts

    def pull(self, ts, src, dst, count, step=2000):
        """``dst`` pulls ``count`` queued (not running) tasks from ``src``, ``step`` ns apart."""
        for k in range(count):
            pid = self.q[src].pop(1)
            self.s.migrate(ts + k * step, dst, pid, src, dst)
            self.q[dst].append(pid)
            if len(self.q[dst]) == 1:  # dst was idle: the pulled task runs at once
                self.s.switch(ts + k * step + 500, dst, 0, 0, pid)
        self.last = max(self.last, ts + count * step)
        return self

    def periodic_pull(self, ts, src, dst, count, step=2000):
        """:meth:`pull` inside ``dst``'s SCHED softirq, in the context of the task running there:
        the periodic balance (cause "periodic")."""
        cur = self.q[dst][0] if self.q[dst] else 0
        self.s.softirq(ts - 100, dst, True, common_pid=cur)
        for k in range(count):
            pid = self.q[src].pop(1)
            self.s.migrate(ts + k * step, dst, pid, src, dst, common_pid=cur)
            self.q[dst].append(pid)
        self.s.softirq(ts + count * step, dst, False, common_pid=cur)
        self.last = max(self.last, ts + count * step)
        return self

    def newidle_pull(self, ts, src, dst):
        """The task running on ``dst`` blocks; before switching away from it ``dst`` pulls one
        queued task from ``src`` in its context (cause "newidle"); the pulled task runs next
        unless others wait there."""
        cur = self.q[dst].pop(0)
        pid = self.q[src].pop(1)
        self.s.migrate(ts, dst, pid, src, dst, common_pid=cur)
        self.q[dst].append(pid)
        self.s.switch(ts + 500, dst, cur, 1, self.q[dst][0])
        self.last = max(self.last, ts + 500)
        return self

    def wakeup_onto(self, ts, src, dst):
        """A queued task of ``src`` runs, sleeps, and is woken onto ``dst`` (cause "wakeup")."""
        pid = self.q[src].pop(1)
        self.s.switch(ts, src, self.q[src][0], 0, pid)
        self.s.switch(ts + 1000, src, pid, 1, self.q[src][0])
        self.s.waking(ts + 2000, src, pid, src, common_pid=self.q[src][0])   # its CPU till now
        self.s.migrate(ts + 2001, src, pid, src, dst, common_pid=self.q[src][0])
        self.s.wakeup(ts + 2002, src, pid, dst)
        self.q[dst].append(pid)
        self.last = max(self.last, ts + 2002)
        return self

    def exit_running(self, ts, cpu, pull_from=None, switch_after=2000):
        """The task running on ``cpu`` exits; with ``pull_from`` the CPU pulls one task from that
        CPU before its switch away from the dead task (newidle balance), as the kernel traces it."""
        pid = self.q[cpu].pop(0)
        self.s.exit(ts, cpu, pid)
        if pull_from is not None:
            moved = self.q[pull_from].pop(1)
            self.s.migrate(ts + switch_after // 2, cpu, moved, pull_from, cpu)
            self.q[cpu].insert(0, moved)
        self.s.switch(ts + switch_after, cpu, pid, EXIT_DEAD, self.q[cpu][0] if self.q[cpu] else 0)
        self.last = max(self.last, ts + switch_after)
        return self

    def tables(self, cpus, t_end=None):
        ev = self.s.events()
        t_end = t_end or self.last + 10 * MS
        return {"events": ev, "tasks": self.tasks,
                "migrations": reconstruct.df_migrations(ev, self.tasks, T0),
                "runqueue": reconstruct.df_runqueue(ev, self.tasks, cpus, T0, t_end),
                "runs": reconstruct.df_runs(ev, self.tasks, T0, t_end), "t_end": t_end}


def layout_tasks_frame(layout, roles=None) -> pd.DataFrame:
    rows, pid = [], 2000
    for cpu, n in enumerate(layout):
        for _ in range(n):
            role = (roles or {}).get(cpu, "cpu")
            rows.append({"pid": pid, "name": f"p{pid}", "role": role, "duty": 100.0, "nice": 0,
                         "initial_cpu": cpu})
            pid += 1
    return pd.DataFrame(rows).astype({"pid": "int32"})


def multi_source(P):
    """<10+x, ..., 10+x, 10> with x = 3P: poly-balance predicts 3, pairwise 1.5P."""
    x = 3 * P
    layout = [10 + x] * (P - 1) + [10]
    return x, layout, World(layout_tasks_frame(layout, {P - 1: "target"}), P)


# ------------------------------------------------------------------------------- rounds

@pytest.mark.parametrize("P", [2, 4, 8])
def test_first_round_counts_moves_from_the_first_source_and_predictions(P):
    x, layout, w = multi_source(P)
    target, first_src = P - 1, P - 2  # the first round starts from the last source, not CPU 0
    ts1 = T0 + 40 * MS
    w.pull(ts1, first_src, target, 3)
    if P > 2:
        w.pull(ts1 + 10_000, 0, target, 2)  # same pass: 10 us later, another source
    w.pull(ts1 + 64 * MS, 0, target, 1)
    t = w.tables(range(P))
    per_mig = rounds.df_target_rounds(t["migrations"], target, gap_ms=1.0)
    assert per_mig["round"].tolist() == [1] * (5 if P > 2 else 3) + [2]
    fr = rounds.first_round(per_mig, t["runqueue"], target, sum(layout), P, T0)
    assert fr["source"] == first_src
    assert fr["moved"] == 3
    assert fr["to_target"] == (5 if P > 2 else 3)
    assert fr["sources"] == (2 if P > 2 else 1)
    assert fr["rounds"] == 2
    assert (fr["q_src"], fr["q_target"]) == (10 + x, 10)
    assert fr["poly_prediction"] == pytest.approx(3.0)
    assert fr["pairwise_prediction"] == pytest.approx(1.5 * P)
    assert fr["t_start"] == pytest.approx((ts1 - T0) / 1e9)
    moves = rounds.df_round_moves(per_mig)
    r1 = moves[moves["round"] == 1].set_index("src_cpu")
    assert r1.loc[first_src, "moved"] == 3 and bool(r1.loc[first_src, "first_source"])
    if P > 2:
        assert r1.loc[0, "moved"] == 2 and not bool(r1.loc[0, "first_source"])
    assert moves["moved"].sum() == len(per_mig)


def test_round_gap_decides_what_one_round_is():
    x, layout, w = multi_source(4)
    w.pull(T0 + 10 * MS, 0, 3, 1).pull(T0 + 12 * MS, 1, 3, 1)  # 2 ms apart
    m = w.tables(range(4))["migrations"]
    assert rounds.df_target_rounds(m, 3, gap_ms=1.0)["round"].tolist() == [1, 2]
    assert rounds.df_target_rounds(m, 3, gap_ms=5.0)["round"].tolist() == [1, 1]
    assert rounds.df_target_rounds(m, 3, gap_ms=1.0, t_from=0.011)["round"].tolist() == [1]
    with pytest.raises(ValueError):
        rounds.df_target_rounds(m, 3, gap_ms=0)


def test_wakeup_placements_are_not_balancing_moves():
    w = World(layout_tasks_frame([3, 1]), 2)
    pid = w.q[0][1]
    s = w.s
    # a queued task sleeps (it is switched out asleep after running), then is woken onto CPU 1
    s.switch(T0 + 5 * MS, 0, w.q[0][0], 0, pid)
    s.switch(T0 + 6 * MS, 0, pid, 1, w.q[0][0])
    s.migrate(T0 + 7 * MS, 0, pid, 0, 1)
    s.wakeup(T0 + 7 * MS, 0, pid, 1)
    m = w.tables(range(2))["migrations"]
    assert m["kind"].astype(str).tolist() == ["wakeup"]
    assert len(rounds.df_target_rounds(m, 1)) == 0
    assert len(rounds.df_target_rounds(m, 1, kinds=("balance", "wakeup"))) == 1
    empty = rounds.first_round(rounds.df_target_rounds(m, 1), reconstruct.df_runqueue(
        w.s.events(), w.tasks, [0, 1], T0, T0 + 20 * MS), 1, 4, 2, T0)
    assert empty["moved"] is None and empty["rounds"] == 0 and empty["poly_prediction"] is None


# -------------------------------------------------------------------------- steal latency

@pytest.mark.parametrize("P", [2, 4, 8])
def test_steal_at_exit_is_seen_although_the_rebuilt_queue_never_reaches_zero(P):
    w = World(layout_tasks_frame([3] * (P - 1) + [2], {P - 1: "target"}), P)
    target = P - 1
    te = T0 + 50 * MS
    w.exit_running(te, target)
    w.exit_running(te + 5 * MS, target, pull_from=0, switch_after=4000)  # pull 2 us after the exit
    t = w.tables(range(P))
    rq = t["runqueue"]
    after = rq[(rq["cpu"] == target) & (rq["ts"] >= te)]
    assert after["nr"].min() == 1  # the naive definition would never see the target idle
    load = rounds.df_target_load(rq, t["events"], t["tasks"], target, T0)
    assert load["effective"].min() == 0
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], target, T0, te,
                              t["events"])
    assert st["ts_idle"] == te + 5 * MS
    assert st["latency_s"] == pytest.approx(2e-6)
    assert st["first_run_latency_s"] == pytest.approx(4e-6)
    assert st["stolen"] is True and st["pull_src_cpu"] == 0 and st["pull_kind"] == "balance"
    assert st["idle_s"] == 0.0


def test_a_target_left_idle_shows_the_idle_time_before_the_pull():
    w = World(layout_tasks_frame([3, 1], {1: "target"}), 2)
    te = T0 + 50 * MS
    w.exit_running(te, 1)  # switches to the idle task
    w.s.switch(te + 10 * MS, 1, 0, 0, 4242)  # another user's task runs for 5 ms
    w.s.switch(te + 15 * MS, 1, 4242, 1, 0)
    w.pull(te + 30 * MS, 0, 1, 1)
    t = w.tables(range(2))
    load = rounds.df_target_load(t["runqueue"], t["events"], t["tasks"], 1, T0)
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], 1, T0, te, t["events"])
    assert st["ts_idle"] == te
    assert st["latency_s"] == pytest.approx(0.030)
    assert st["other_s"] == pytest.approx(0.005)
    assert st["idle_s"] == pytest.approx(0.025 - 2e-6)  # the dying task ran its last 2 us


@pytest.mark.parametrize("migrated", [False, True])
def test_a_task_preempted_as_it_exits_is_exiting_until_it_leaves_the_queue(migrated):
    """Its exit work preempted (switched out runnable after sched_process_exit, then in again),
    the task stays on the rebuilt queue until its dead switch-out: it is still exiting, so the
    target goes idle at its exit (a kernel run in CI: 0.69 ms later, read as its first
    switch-out). Moved off the target after the preemption, it leaves the queue there."""
    w = World(layout_tasks_frame([3, 1], {1: "target"}), 2)
    te = T0 + 50 * MS
    pid = w.q[1].pop(0)
    w.s.exit(te, 1, pid)
    w.s.switch(te + 1000, 1, pid, 0, 4242)  # preempted by another user's task
    if migrated:
        w.s.migrate(te + 2000, 0, pid, 1, 0)
        w.s.switch(te + 3000, 0, w.q[0][0], 0, pid)
        w.s.switch(te + 4000, 0, pid, EXIT_DEAD, w.q[0][0])
    else:
        w.s.switch(te + 700_000, 1, 4242, 1, pid)
        w.s.switch(te + 701_000, 1, pid, EXIT_DEAD, 0)
    w.pull(te + 800_000, 0, 1, 1)
    t = w.tables(range(2))
    load = rounds.df_target_load(t["runqueue"], t["events"], t["tasks"], 1, T0)
    left = te + (2000 if migrated else 701_000)
    rq = t["runqueue"]
    assert rq[(rq["cpu"] == 1) & (rq["ts"] <= left)]["nr"].iloc[-1] == 0
    assert load[load["ts"] < left]["nr"].iloc[-1] == 1  # queued, and exiting: not load
    till_pull = load[(load["ts"] >= te) & (load["ts"] < te + 800_000)]
    assert till_pull["effective"].max() == 0
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], 1, T0, te, t["events"])
    assert st["ts_idle"] == te and st["stolen"] is True


def test_target_that_never_goes_idle_is_not_measurable():
    w = World(layout_tasks_frame([3, 1], {1: "target"}), 2)
    w.pull(T0 + 10 * MS, 0, 1, 1)  # a source task arrives before the own task exits
    w.exit_running(T0 + 50 * MS, 1)
    t = w.tables(range(2))
    load = rounds.df_target_load(t["runqueue"], t["events"], t["tasks"], 1, T0)
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], 1, T0, T0 + 50 * MS)
    assert st["t_idle"] is None and st["stolen"] is None and st["latency_s"] is None


def test_idle_without_any_pull_is_not_stolen():
    w = World(layout_tasks_frame([1, 1], {1: "target"}), 2)  # the source has nothing waiting
    w.exit_running(T0 + 20 * MS, 1)
    t = w.tables(range(2))
    load = rounds.df_target_load(t["runqueue"], t["events"], t["tasks"], 1, T0)
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], 1, T0, T0 + 10 * MS)
    assert st["ts_idle"] == T0 + 20 * MS and st["stolen"] is False and st["latency_s"] is None


# --------------------------------------------------------------------- detection intervals

@pytest.mark.parametrize("P", [2, 4, 8])
def test_detection_intervals_from_the_cut_and_between_rounds(P):
    x, layout, w = multi_source(P)
    target, cut = P - 1, T0 + 300 * MS
    w.pull(T0 + 100 * MS, 0, target, 1)  # before the cut: not counted
    w.pull(cut + 210 * MS, 0, target, 3).pull(cut + 466 * MS, P - 2, target, 1)
    w.pull(cut + 530 * MS, 0, target, 2)
    m = w.tables(range(P))["migrations"]
    per_mig = rounds.df_target_rounds(m, target, 1.0, t_from=(cut - T0) / 1e9)
    iv = rounds.df_detection_intervals(per_mig, cut, T0)
    assert iv["interval"].tolist() == [1, 2, 3]
    assert iv["ms"].tolist() == pytest.approx([210.0, 256.0, 64.0])
    assert iv["moved"].tolist() == [3, 1, 2]
    assert rounds.interval_keys(iv) == pytest.approx(
        {"interval1_ms": 210.0, "interval2_ms": 256.0, "interval3_ms": 64.0})


def test_missing_rounds_give_none_not_a_shorter_table():
    x, layout, w = multi_source(4)
    cut = T0 + 100 * MS
    w.pull(cut + 7 * MS, 0, 3, 1)
    per_mig = rounds.df_target_rounds(w.tables(range(4))["migrations"], 3, t_from=0.1)
    iv = rounds.df_detection_intervals(per_mig, cut, T0)
    assert len(iv) == 3
    assert rounds.interval_keys(iv) == {"interval1_ms": pytest.approx(7.0), "interval2_ms": None,
                                        "interval3_ms": None}
    none = rounds.df_detection_intervals(per_mig.iloc[0:0], cut, T0)
    assert rounds.interval_keys(none) == dict.fromkeys(["interval1_ms", "interval2_ms",
                                                        "interval3_ms"])


# ------------------------------------------------------ experiments on synthetic run dirs

def fake_run(tmp_path, name, cpus, overrides, script, seed=0, manifest_extra=None):
    """A complete run directory of experiment ``name`` whose trace is written by ``script``
    (``manifest_extra``: more manifest keys, e.g. the checks' migration_causes)."""
    exp = get_experiment(name)
    params = exp.resolve(overrides, cpus)
    params = {**params, **exp.draw(params, cpus, seed)}
    specs = exp.tasks(params, cpus)
    tasks = tasks_frame(specs, list(range(3000, 3000 + len(specs))))
    w = World(tasks, len(cpus))
    script(w, params)
    t = w.tables(cpus, t_end=T0 + int(params["duration"] * 1e9))
    for tab in ("events", "tasks", "migrations", "runqueue", "runs"):
        store.write_table(tmp_path, tab, t[tab])
    manifest = {"experiment": name, "params": params, "cpus": list(cpus), "seed": seed,
                "status": "complete", "t0_ns": T0, "end_ns": t["t_end"],
                "measured_s": (t["t_end"] - T0) / 1e9, **(manifest_extra or {})}
    store.write_json(tmp_path / "manifest.json", manifest)
    run = store.Run(tmp_path, manifest)
    summary = exp.analyse(run)
    store.write_json(tmp_path / "summary.json", summary)
    assert set(CONTRACT[name]) <= set(summary), f"missing {set(CONTRACT[name]) - set(summary)}"
    json.dumps(summary, allow_nan=False)  # JSON-serialisable, no NaN
    figs = exp.plot(run, tmp_path)
    assert figs and all(p.exists() and p.stat().st_size > 5000 for p in figs)
    assert all(isinstance(line, str) for line in exp.describe(summary))
    return summary, params


@pytest.mark.parametrize("P", [2, 4])
def test_how_many_summary(tmp_path, P):
    x = 2 * P

    def script(w, p):
        w.pull(T0 + 40 * MS, 0, P - 1, 7)

    s, _ = fake_run(tmp_path, "how-many", list(range(P)), {"x": str(x), "duration": "0.5"}, script)
    assert (s["x"], s["ncpus"], s["ntasks"]) == (x, P, (P - 1) * (10 + x) + 10)
    assert (s["first_round_moved"], s["first_round_to_target"], s["first_round_source"]) \
        == (7, 7, 0)
    assert s["poly_prediction"] == pytest.approx(x / P)
    assert s["pairwise_prediction"] == pytest.approx(x / 2)
    assert s["first_round_end_s"] == pytest.approx(0.040 + 6 * 2e-6)


def test_rounds_by_cause_count_the_periodic_pass_only():
    """A hand-built migrations table onto CPU 1: a newidle pull, a wake-up placement, a fork, an
    affinity move, then a periodic pass of 3 and an active push. By cause, round 1 is the
    periodic pass with the active push (10 us later); by kind (causes unknown) every move of a
    runnable task counts: the newidle pull is round 1, the affinity, NUMA and unknown moves are
    rounds too; wake-up placements and forks never are."""
    rows = [  # (ms after t0, src, cause, kind)
        (1.0, 0, "newidle", "balance"), (5.0, 0, "wakeup", "wakeup"), (9.0, 0, "fork", "wakeup"),
        (13.0, 0, "affinity", "balance"),
        (20.0, 0, "periodic", "balance"), (20.002, 0, "periodic", "balance"),
        (20.004, 0, "periodic", "balance"), (20.010, 0, "active", "balance"),
        (30.0, 0, "numa", "balance"), (40.0, 0, "unknown", "balance")]
    m = pd.DataFrame({"ts": [T0 + int(t * MS) for t, *_ in rows], "t": [t / 1e3 for t, *_ in rows],
                      "pid": range(100, 100 + len(rows)), "name": "w", "role": "cpu",
                      "src_cpu": [r[1] for r in rows], "dst_cpu": 1,
                      "kind": pd.Categorical([r[3] for r in rows]),
                      "cause": pd.Categorical([r[2] for r in rows])})
    known = rounds.round_rule(True)
    by_cause = rounds.df_target_rounds(m, 1, 1.0, **known["select"])
    assert known["rule"] == "periodic+active"
    assert by_cause["cause"].astype(str).tolist() == ["periodic"] * 3 + ["active"]
    assert by_cause["round"].tolist() == [1] * 4
    fallback = rounds.round_rule(False)
    assert fallback["rule"] == "runnable" and "not recorded" in fallback["text"]
    by_kind = rounds.df_target_rounds(m, 1, 1.0, **fallback["select"])
    assert by_kind["cause"].astype(str).tolist() == ["newidle", "affinity", "periodic", "periodic",
                                                     "periodic", "active", "numa", "unknown"]
    assert by_kind["round"].tolist() == [1, 2, 3, 3, 3, 3, 4, 5]


@pytest.mark.parametrize("softirq", [True, False])
def test_how_many_counts_the_periodic_round_when_causes_are_known(tmp_path, softirq):
    """<10+8, 10> on 2 CPUs: the target's running task blocks and pulls one (newidle), a task is
    woken onto the target, then the target's periodic balance pulls 4 at once. By cause the
    first round is the 4; where the causes are unknown (the softirq unrecorded: here the
    manifest says so) the newidle pull is the first round, as before causes were told."""
    def script(w, p):
        w.newidle_pull(T0 + 5 * MS, 0, 1)
        w.wakeup_onto(T0 + 15 * MS, 0, 1)
        w.periodic_pull(T0 + 40 * MS, 0, 1, 4)

    extra = {"migration_causes": {"softirq_recorded": softirq}}
    s, _ = fake_run(tmp_path, "how-many", [0, 1], {"x": "8", "duration": "0.2"}, script,
                    manifest_extra=extra)
    m = store.open_run(tmp_path).migrations
    causes = m[m["dst_cpu"] == 1]["cause"].astype(str).tolist()
    assert causes == ["newidle", "wakeup"] + ["periodic"] * 4     # the stream's causes, told
    if softirq:
        assert s["round_rule"] == "periodic+active"
        assert (s["first_round_moved"], s["rounds"], s["moved_to_target"]) == (4, 1, 4)
        assert s["onto_target_not_counted"] == 2
        assert s["first_round_start_s"] == pytest.approx(0.040)
    else:
        assert s["round_rule"] == "runnable"
        assert (s["first_round_moved"], s["rounds"], s["moved_to_target"]) == (1, 2, 5)
        assert s["onto_target_not_counted"] == 1                  # the wake-up placement
    text = "\n".join(get_experiment("how-many").describe(s))
    assert ("periodic or active" in text) == softirq and ("not recorded" in text) != softirq


def test_how_many_without_a_round_predicts_from_the_layout(tmp_path):
    s, _ = fake_run(tmp_path, "how-many", [0, 1, 2, 3], {"x": "8", "duration": "0.2"},
                    lambda w, p: None)
    assert s["first_round_moved"] is None and s["first_round_end_s"] is None
    assert (s["poly_prediction"], s["pairwise_prediction"]) == (2.0, 4.0)
    assert s["time_to_balance_s"] is None and s["balanced_at_end"] is False


def test_time_to_resolve_summary(tmp_path):
    # <14, 10> on 2 CPUs, N/P = 12, 15% = 1.8 tasks: one pull balances (13, 11); a move back
    # unbalances (14, 10); the second pull balances for good
    def script(w, p):
        w.pull(T0 + 30 * MS, 0, 1, 1).pull(T0 + 60 * MS, 1, 0, 1).pull(T0 + 90 * MS, 0, 1, 1)

    s, _ = fake_run(tmp_path, "time-to-resolve", [0, 1], {"x": "4", "duration": "0.5"}, script)
    assert s["time_to_balance_s"] == pytest.approx(0.090)
    assert s["first_balanced_s"] == pytest.approx(0.030)
    assert s["balance_entries"] == 2
    assert s["balanced_at_end"] is True and s["migrations"] == 3
    assert (s["rounds_onto_target"], s["moved_to_target"]) == (2, 2)


def test_work_conservation_summary_and_random_time(tmp_path):
    def script(w, p):
        te = T0 + int(p["idle_at_s"] * 1e9)
        n = p["tasks_per_cpu"]
        for k in range(n):  # the target's own tasks exit one after the other
            w.exit_running(te + k * MS, 3, pull_from=0 if k == n - 1 else None)

    s, p = fake_run(tmp_path, "work-conservation", [0, 1, 2, 3],
                    {"duration": "1.0", "idle_from_s": "0.2", "idle_to_s": "0.6"}, script, seed=7)
    assert 0.2 <= p["idle_at_s"] <= 0.6
    assert p["idle_at_s"] == get_experiment("work-conservation").draw(p | {"idle_at_s": -1.0},
                                                                      [0], 7)["idle_at_s"]
    assert s["target_idle_at_s"] == pytest.approx(p["idle_at_s"] + 3e-3, abs=1e-6)
    assert s["queue_empty_to_pull_s"] == pytest.approx(1e-6) and s["stolen"] is True
    # the pull came before the target ever switched to its idle task: it never sat idle
    assert s["steal_latency_s"] == 0.0 and s["cpu_idle_at_s"] is None
    assert s["pulls_before_idle"] == 0


@pytest.mark.parametrize("mode", ["exit", "block"])
def test_detection_summary(tmp_path, mode):
    def script(w, p):
        cut = T0 + int(p["cut_at_s"] * 1e9)
        w.pull(cut + 120 * MS, 0, 1, 2).pull(cut + 184 * MS, 0, 1, 1)

    s, p = fake_run(tmp_path, "detection", [0, 1], {"duration": "1.0", "cut_from_s": "0.1",
                                                    "cut_to_s": "0.5", "cut_mode": mode},
                    script, seed=3)
    assert s["cut_at_s"] == p["cut_at_s"] and 0.1 <= s["cut_at_s"] <= 0.5
    assert s["interval1_ms"] == pytest.approx(120.0)
    assert s["interval2_ms"] == pytest.approx(64.0)
    assert s["interval3_ms"] is None
    assert (s["round1_moved"], s["rounds_after_cut"], s["moved_after_cut"]) == (2, 2, 3)


def test_detection_tasks_cut_the_target_not_the_sources():
    exp = get_experiment("detection")
    p = exp.resolve({"cut_at_s": "1.5", "tasks_per_cpu": "8", "target_after": "2"}, [0, 1, 2])
    specs = exp.tasks(p, [0, 1, 2])
    cut = [s for s in specs if s.stop_after_s is not None]
    assert len(specs) == 24 and len(cut) == 6
    assert all(s.initial_cpu == 2 and s.pinned and s.stop_after_s == 1.5 for s in cut)
    assert sum(s.initial_cpu == 2 for s in specs) == 8


@pytest.mark.parametrize("name,overrides,message", [
    ("how-many", {"x": "-1"}, "must not be negative"),
    ("detection", {"cut_from_s": "3", "cut_to_s": "2"}, "is after"),
    ("detection", {"cut_to_s": "9"}, "not before the end"),
    ("detection", {"target_after": "8"}, "does not cut"),
    ("detection", {"cut_mode": "nap"}, "choose exit or block"),
    ("work-conservation", {"idle_at_s": "5"}, "not before the end"),
])
def test_bad_parameters_are_one_line_errors(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        get_experiment(name).resolve(overrides, [0, 1])


@pytest.mark.parametrize("name", list(CONTRACT))
def test_one_cpu_is_refused(name):
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        get_experiment(name).resolve({}, [0])


def test_defaults_scale_with_the_cpu_count():
    for P in (2, 4, 8):
        exp = get_experiment("how-many")
        p = exp.resolve({}, list(range(P)))
        specs = exp.tasks(p, list(range(P)))
        per_cpu = np.bincount([s.initial_cpu for s in specs], minlength=P)
        assert per_cpu.tolist() == [20] * (P - 1) + [10]
        assert not math.isnan(p["round_gap_ms"])


def test_workers_killed_at_the_end_do_not_make_the_target_idle():
    w = World(layout_tasks_frame([3, 1], {1: "target"}), 2)
    w.pull(T0 + 10 * MS, 0, 1, 1)
    t_end = T0 + 40 * MS
    w.exit_running(T0 + 50 * MS, 1)  # the kill after the end: the task that runs exits first
    t = w.tables(range(2), t_end=t_end)
    load = rounds.df_target_load(t["runqueue"], t["events"], t["tasks"], 1, T0, t_end)
    assert load["dying"].max() == 0
    st = rounds.steal_latency(load, t["migrations"], t["runs"], t["tasks"], 1, T0, T0 + 20 * MS)
    assert st["t_idle"] is None
