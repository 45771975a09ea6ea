"""Real-kernel runs of the balancing-round experiments through the CLI, on 2 CPUs, ~2.5 s each:
E2 how-many, E3 time-to-resolve, E4 work-conservation, E5 detection.

What the harness guarantees (a complete run directory with the summary its experiment declares,
the layout asked for, the random time drawn from the run's seed and recorded, the target's tasks
leaving at that time, figures, no worker left); the run's moves and switches of every task as
the kernel counted them (tests/measured.py); what each experiment must produce, which its layout
forces on any balancing scheduler (a round onto a target 10 tasks lighter, a steal by an idle
CPU while 3 tasks wait, a pull onto a CPU cut to 2 of 8 tasks), or the reason it did not; and
the summary's figures recomputed from the trace's own sched_migrate_task records. No timing,
no count of the scheduler's choosing, is asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import harmony
from harmony.experiments import get_experiment
from harmony.experiments.work_conservation import draw_uniform_time
from harmony.hygiene import WORKER_PREFIX

from cli_run import cli
from conftest import QUIET_TRIES, host_skip
from measured import (NS, assert_counted_by_the_kernel, bursts, moves_onto,
                      report_kernel_behaviour)

pytestmark = pytest.mark.kernel


def alive_workers(pids) -> list[int]:
    """Which of these worker pids still exist as Harmony workers (other runs may be going on)."""
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith(WORKER_PREFIX):
                out.append(int(pid))
        except OSError:
            pass
    return out


def run_ok(tmp_path, experiment, *params, seed=0):
    out = tmp_path / experiment
    p = cli("run", experiment, "--cpus", "0,1", "--duration", "2.5", "--seed", seed, *params,
            "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    run = harmony.load(out)
    assert run.complete and run.manifest["experiment"] == experiment
    assert get_experiment(experiment).summary_problems(run.summary) == []  # its declared summary
    figs = [out / f for f in run.manifest["figures"]]
    assert figs and all(f.exists() and f.stat().st_size > 5000 for f in figs)
    assert (out / "report.md").exists()
    assert alive_workers(run.tasks["pid"]) == []
    return run, p.stdout


@pytest.mark.parametrize("experiment", ["how-many", "time-to-resolve"])
def test_multi_source_layout(kernel, tmp_path, experiment):
    run, stdout = run_ok(tmp_path, experiment, "-p", "x=6", "-p", "base=4")
    s, m = run.summary, run.manifest
    assert np.bincount(run.tasks["initial_cpu"], minlength=2).tolist() == [10, 4]
    assert m["params"]["x"] == 6
    assert_counted_by_the_kernel(run)
    # how-many counts the window, time-to-resolve from t0: the trace's own moves
    moved = pd.concat([moves_onto(run, c, 0.0) for c in (0, 1)])
    if experiment == "how-many":
        moved = moved[moved["ts"] <= m["end_ns"]]
    assert s["migrations"] == len(moved)
    if experiment == "how-many":
        assert s["x"] == 6 and s["ntasks"] == 14 and s["ncpus"] == 2
        assert "first round moved" in stdout and s["round_rule"] == "periodic+active"
        # 10 tasks against 4, none pinned: on a quiet host the target pulls, in its balance
        # (softirq or stopper). Whether it did is the kernel's decision, reported, not gated on;
        # the summary's rounds are held to the trace's own either way
        rounds = bursts(moves_onto(run, 1, 0.0, balance_only=True), m["params"]["round_gap_ms"])
        report_kernel_behaviour("the target pulled (10 tasks against 4)", bool(rounds), s)
        assert s["rounds"] == len(rounds) and s["moved_to_target"] == sum(map(len, rounds))
        if not rounds:
            assert s["first_round_moved"] is None and s["first_round_start_s"] is None, s
            return
        first = rounds[0]
        src = int(first["src_cpu"].iat[0])
        assert (s["first_round_source"], s["first_round_moved"], s["first_round_to_target"],
                s["first_round_sources"]) == (src, int((first["src_cpu"] == src).sum()),
                                              len(first), first["src_cpu"].nunique()), s
        assert src == 0 and 1 <= s["first_round_moved"] <= 10
        assert (s["first_round_start_s"], s["first_round_end_s"]) == pytest.approx(
            (first["t"].iat[0], first["t"].iat[-1]), abs=1e-9)
    else:
        assert "resolved" in stdout


def exits(run):
    """Exits of experiment tasks during the measured window (not the kill at the end)."""
    ev = run.events
    return ev[(ev["event"].astype(str) == "sched_process_exit") & ev["pid"].isin(run.tasks["pid"])
              & (ev["ts"] < run.manifest["end_ns"])]


def busy(result) -> str | bool:
    """Why a run's host was too busy for its layout to force the outcome (other jobs' load on a
    CPU tips the balance), or False."""
    foreign = result[0].manifest["foreign_load"]["max_frac"]
    return foreign > 0.05 and f"host was busy ({foreign:.0%} of a CPU used by other tasks)"


def test_work_conservation(kernel, tmp_path):
    def measure(k):
        (tmp_path / f"try{k}").mkdir()
        return run_ok(tmp_path / f"try{k}", "work-conservation", "-p", "idle_from_s=0.8", "-p",
                      "idle_to_s=1.5", "-p", "tasks_per_cpu=3", seed=11)

    # a quiet run whose target went idle, for the path from idle to pull this test is about;
    # where the kernel pulled a task onto the target before its own tasks had all exited (CI
    # once saw it at 1.03 s, its tasks to exit at 1.12 s) it never goes idle, the metric's
    # documented None: tried again, and if every quiet try ends so, that outcome is checked
    quiet = []
    for k in range(QUIET_TRIES):
        result = measure(k)
        if not busy(result):
            quiet.append(result)
            if result[0].summary["target_idle_at_s"] is not None:
                break
    if not quiet:
        host_skip(f"{busy(result)} ({QUIET_TRIES} runs, all busy)")
    run, stdout = quiet[-1]
    p, m = run.manifest["params"], run.manifest
    assert p["idle_at_s"] == draw_uniform_time(11, 0.8, 1.5) and m["seed"] == 11
    own = run.tasks[run.tasks["role"] == "target"]
    assert len(own) == 3 and own["pinned"].all() and (own["initial_cpu"] == 1).all()
    assert (own["stop_after_s"] == p["idle_at_s"]).all()
    ex = exits(run)
    assert set(ex["pid"]) >= set(own["pid"])  # every own task exited, after its time
    # from the workers' own t0, which the t0 marker's stamp follows (controller.workers_t0_ns)
    assert (ex[ex["pid"].isin(own["pid"])]["ts"] >= m["workers_t0_ns"] + p["idle_at_s"] * 1e9).all()
    assert_counted_by_the_kernel(run, exited=len(own))
    s = run.summary
    onto = moves_onto(run, 1, 0.0)
    last_exit = int(ex[ex["pid"].isin(own["pid"])]["ts"].max())
    # on a quiet host, 3 tasks against 3 pinned ones: the target goes idle once its own have
    # exited (at its last one's exit, unless the kernel pulled a task onto it before), with
    # tasks waiting on CPU 0, which an idle CPU's balance pulls
    if s["target_idle_at_s"] is None:
        # never idle: only where a task was moved onto it by its last own task's exit, the
        # moves counted as the kernel counted them (above); nothing was stolen from idle
        assert (onto["ts"] <= last_exit).any(), ("the target never went idle, and nothing "
                                                 f"moved onto it first: {s}")
        assert s["stolen"] is None, s
        return
    ts_idle = m["t0_ns"] + round(s["target_idle_at_s"] * NS)
    if (onto["ts"] < last_exit).any():
        # a task pulled on before may have left again (or ended) by then: idle at the last exit
        # at the soonest (CI once saw exactly then)
        assert ts_idle >= last_exit, (ts_idle, last_exit)
    else:
        assert abs(ts_idle - last_exit) <= 1, (ts_idle, last_exit)   # its last own task's exit
    after = onto[onto["ts"] >= ts_idle]
    assert s["stolen"] is True, f"nothing was pulled onto the idle target: {s}"
    assert len(after), f"the trace holds no move onto the target after {ts_idle}: {s}"
    first = after.iloc[0]
    assert s["first_pull_src_cpu"] == 0
    assert s["first_pull_at_s"] == pytest.approx(first["t"], abs=1e-9)
    assert s["queue_empty_to_pull_s"] == pytest.approx((first["ts"] - ts_idle) / NS, abs=2e-9)
    assert (s["pulls_before_idle"], s["pulls_after_idle"]) == (len(onto) - len(after), len(after))
    assert 0 <= s["steal_latency_s"] <= s["queue_empty_to_pull_s"] + 1e-9
    assert "first pull onto the target" in stdout


@pytest.mark.parametrize("mode", ["exit", "block"])
def test_detection(kernel, tmp_path, mode):
    run, stdout = run_ok(tmp_path, "detection", "-p", "cut_from_s=0.8", "-p", "cut_to_s=1.2",
                         "-p", "tasks_per_cpu=6", "-p", "target_after=2", "-p", f"cut_mode={mode}",
                         seed=5)
    p, m, s = run.manifest["params"], run.manifest, run.summary
    assert s["cut_at_s"] == p["cut_at_s"] == draw_uniform_time(5, 0.8, 1.2)
    on_target = run.tasks[run.tasks["initial_cpu"] == 1]
    assert len(on_target) == 6 and on_target["pinned"].all()
    cut_col = "stop_after_s" if mode == "exit" else "cut_duty_at_s"
    cut = on_target[on_target[cut_col].notna()]
    assert len(cut) == 4 and (cut[cut_col] == p["cut_at_s"]).all()
    if mode == "exit":
        ex = exits(run)
        assert set(ex["pid"]) == set(cut["pid"])
        # from the workers' own t0: CI once saw them leave 0.22 ms before t0_ns + cut_at_s, the
        # t0 marker written that long after the workers' t0 was read
        assert (ex["ts"] >= m["workers_t0_ns"] + p["cut_at_s"] * 1e9).all()
        assert m["workers_t0_ns"] <= m["t0_ns"]
    assert_counted_by_the_kernel(run, exited=len(cut) if mode == "exit" else 0)
    # cut to 2 pinned tasks against 6 free ones on CPU 0: on a quiet host the target pulls, and
    # interval 1 is measured; each interval is the trace's own: cut -> round 1 -> round 2 ->
    # round 3, a round a burst of moves of runnable tasks onto the target (gap > round_gap_ms):
    # a wake-up's placement is none (CI twice saw one, as the run's tasks were stopped, read as a
    # round). Whether it pulled is the kernel's decision, reported, not gated on (CI once saw 2
    # free tasks pulled before the cut: 4 against 4 after it, nothing to pull)
    rounds = bursts(moves_onto(run, 1, p["cut_at_s"], runnable_only=True), p["round_gap_ms"])
    report_kernel_behaviour("the target pulled after the cut", bool(rounds), s)
    marks = [m["t0_ns"] + int(p["cut_at_s"] * NS)] + [int(r["ts"].iat[0]) for r in rounds[:3]]
    want = [(b - a) / 1e6 for a, b in zip(marks[:-1], marks[1:])]
    got = [s[f"interval{k}_ms"] for k in (1, 2, 3)]
    assert got == pytest.approx(want + [None] * (3 - len(want)), abs=1e-6), (got, want)
    assert s["rounds_after_cut"] == len(rounds), (s, [len(r) for r in rounds])
    assert "interval 1" in stdout
