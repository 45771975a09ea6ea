"""Real-kernel smoke of the balancing-round experiments through the CLI, on 2 CPUs, ~2.5 s each:
E2 how-many, E3 time-to-resolve, E4 work-conservation, E5 detection.

Nothing here asserts a timing or a scheduler decision; only what the harness guarantees: a
complete run directory with the summary its experiment declares, the layout asked for, the random
time drawn from the run's seed and recorded, the target's tasks leaving at that time, figures, no
worker left.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import harmony
from harmony.experiments import get_experiment
from harmony.experiments.work_conservation import draw_uniform_time
from harmony.hygiene import WORKER_PREFIX

from cli_run import cli

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
    s = run.summary
    assert np.bincount(run.tasks["initial_cpu"], minlength=2).tolist() == [10, 4]
    assert run.manifest["params"]["x"] == 6
    m, mig = run.manifest, run.migrations     # how-many counts the window, time-to-resolve from t0
    counted = ((mig["ts"] >= m["t0_ns"]) & (mig["ts"] <= m["end_ns"]) if experiment == "how-many"
               else mig["t"] >= 0)
    assert s["migrations"] == int(counted.sum())
    if experiment == "how-many":
        assert s["x"] == 6 and s["ntasks"] == 14 and s["ncpus"] == 2
        assert "first round moved" in stdout
        if s["first_round_moved"] is not None:  # a round onto the target happened
            assert 1 <= s["first_round_moved"] <= s["first_round_to_target"] <= 10
            assert s["first_round_source"] == 0 and s["first_round_end_s"] >= 0
    else:
        assert "resolved" in stdout


def exits(run):
    """Exits of experiment tasks during the measured window (not the kill at the end)."""
    ev = run.events
    return ev[(ev["event"].astype(str) == "sched_process_exit") & ev["pid"].isin(run.tasks["pid"])
              & (ev["ts"] < run.manifest["end_ns"])]


def test_work_conservation(kernel, tmp_path):
    run, stdout = run_ok(tmp_path, "work-conservation", "-p", "idle_from_s=0.8", "-p", "idle_to_s=1.5",
                         "-p", "tasks_per_cpu=3", seed=11)
    p, m = run.manifest["params"], run.manifest
    assert p["idle_at_s"] == draw_uniform_time(11, 0.8, 1.5) and m["seed"] == 11
    own = run.tasks[run.tasks["role"] == "target"]
    assert len(own) == 3 and own["pinned"].all() and (own["initial_cpu"] == 1).all()
    assert (own["stop_after_s"] == p["idle_at_s"]).all()
    ex = exits(run)
    assert set(ex["pid"]) >= set(own["pid"])  # every own task exited, after its time
    assert (ex[ex["pid"].isin(own["pid"])]["ts"] >= m["t0_ns"] + p["idle_at_s"] * 1e9).all()
    s = run.summary
    if s["target_idle_at_s"] is not None:
        assert s["target_idle_at_s"] >= p["idle_at_s"]
        assert s["stolen"] in (True, False)
        if s["stolen"]:
            assert s["steal_latency_s"] >= 0
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
        assert (ex["ts"] >= m["t0_ns"] + p["cut_at_s"] * 1e9).all()
    vals = [s[f"interval{k}_ms"] for k in (1, 2, 3)]
    present = [v is not None for v in vals]
    assert present == sorted(present, reverse=True)  # an interval exists only after the previous
    assert all(v > 0 for v in vals if v is not None)
    assert "interval 1" in stdout
