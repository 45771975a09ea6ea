"""Real-kernel runs of the mixed-workload experiments through the CLI, on 2 CPUs, about a second
each: E6 intrinsic-imbalance <3,0>, E7 heavy-light and E11 priority-classes <4,0> with their
static-ideal companions captured automatically into <run_dir>/static/.

Nothing here asserts a timing or a scheduler decision; only what the harness guarantees (the
layout at t0, pinned companions never migrate, the declared summary keys, both reports written),
each run's moves and switches as the kernel counted them (the pinned companion's: none), and the
summary's figures as their definitions make them of what the run measured: its moves (the
trace's own sched_migrate_task records), its shares, its run-queue variances.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import harmony
from harmony.experiments import get_experiment
from harmony.hygiene import WORKER_PREFIX

from cli_run import HARMONY, cli
from measured import NS, assert_counted_by_the_kernel, moves_onto

pytestmark = pytest.mark.kernel
TRACEFS = Path("/sys/kernel/tracing")


def host_is_clean():
    workers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith(WORKER_PREFIX):
                    workers.append(entry.name)
            except OSError:
                pass
    inst = TRACEFS / "instances"
    mine = [p.name for p in inst.iterdir() if p.name.startswith("harmony")] if inst.is_dir() else []
    return workers, mine


WINDOWS = ["-p", "long_warmup_s=0.6", "-p", "short_warmup_s=0.2", "-p", "short_s=0.4"]


@pytest.mark.parametrize("experiment,extra", [
    ("heavy-light", ["-p", "light_duty=50"]),
    ("priority-classes", ["-p", "nice_diff=10"]),
])
def test_paired_run_with_static_ideal(kernel, tmp_path, experiment, extra):
    out = tmp_path / "run"
    p = cli("run", experiment, "--cpus", "0,1", "--duration", "1.2", *WINDOWS, *extra,
            "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    assert "static ideal" in p.stdout and "<run_dir>/static/" in p.stdout

    run, static = harmony.load(out), harmony.load(out / "static")
    assert static.manifest["params"]["static"] == 1 and run.manifest["params"]["static"] == 0
    assert static.manifest["cpus"] == run.manifest["cpus"] == [0, 1]
    s, ss = run.summary, static.summary
    exp = get_experiment(experiment)   # both summaries are the one it declares
    assert exp.summary_problems(s) == [] and exp.summary_problems(ss) == []
    assert s["static_run"] == "static"
    # the static ideal is pinned: one task of each class per CPU, never moved
    assert ss["migrations"] == 0
    assert static.tasks["pinned"].all() and sorted(static.tasks["initial_cpu"]) == [0, 0, 1, 1]
    first = "heavy" if experiment == "heavy-light" else "high"
    if first == "heavy":
        assert ss["one_heavy_one_light_fraction"] == 1.0
    else:
        assert ss["high_spread_index"] == 0.0 and ss["low_cluster_index"] == 0.0
    # the dynamic run starts as <4,0>
    assert (run.tasks["initial_cpu"] == 0).all() and not run.tasks["pinned"].any()
    # each run moved and switched as the kernel counted; the pinned ideal, not at all
    assert_counted_by_the_kernel(run)
    assert assert_counted_by_the_kernel(static)["migrations"]["kernel"] == 0
    # measured with a companion: the ratios and the SMAPE, by their definitions, of the two
    # runs' measured allocations and variances
    ratio = s["heavy_slowdown_long"] if first == "heavy" else s["high_allocation_ratio"]
    assert ratio is not None and ratio == pytest.approx(
        share_of(run, first, "long") / share_of(static, first, "long"))
    if first == "heavy":
        a, b = s["variance_long"], s["static_variance_long"]
        assert s["smape_long"] == pytest.approx(abs(a - b) / (abs(a) + abs(b)) if a or b else 0.0)
    # the migrations per second: the trace's own moves over the measured window
    m = run.manifest
    moved = pd.concat([moves_onto(run, c, 0.0) for c in (0, 1)])
    assert s["migrations"] == int((moved["ts"] <= m["end_ns"]).sum())
    wall = (m["end_ns"] - m["t0_ns"]) / NS
    assert s["migrations_per_s"] == pytest.approx(s["migrations"] / wall)
    for r in (run, static):
        report = (r.path / "report.md").read_text()
        assert "static ideal" in report
        assert all((r.path / f).is_file() for f in r.manifest["figures"])
    assert {"variance.png", "runqueue.png", "allocation.png", "placement.png", "shares.png"} <= \
        {Path(f).name for f in run.manifest["figures"]}
    json.dumps(s)
    assert host_is_clean() == ([], [])


def share_of(run, role: str, window: str) -> float:
    """The CPU share the run's ``role`` tasks got in its ``window`` (the experiment's windows,
    as the summary records them): their run time in it over the window's CPU time, from the
    runs table."""
    t0, (a, b) = run.manifest["t0_ns"], run.summary["windows"][window]
    lo, hi = t0 + round(a * NS), t0 + round(b * NS)
    pids = run.tasks.loc[run.tasks["role"].astype(str) == role, "pid"]
    r = run.runs[run.runs["pid"].isin(pids)]
    ran = (r["end"].clip(lo, hi) - r["start"].clip(lo, hi)).sum()
    return ran / ((hi - lo) * len(pids))


def test_intrinsic_imbalance_three_on_two(kernel, tmp_path):
    out = tmp_path / "run"
    p = cli("run", "intrinsic-imbalance", "--cpus", "0,1", "--duration", "1.5", "-p",
            "warmup_s=0.5", "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    run = harmony.load(out)
    s = run.summary
    assert s["ntasks"] == 3 and s["ncpus"] == 2
    assert s["fair_share"] == pytest.approx(2 / 3)
    assert_counted_by_the_kernel(run)
    # Jain's index of the measured share ratios, by its definition (sum x)^2 / (n sum x^2)
    x = run.shares["ratio"].to_numpy()
    assert s["jain_index"] == pytest.approx(x.sum() ** 2 / (len(x) * (x * x).sum()))
    # the moves after the warm-up, the trace's own, over the rest of the window
    m = run.manifest
    after = pd.concat([moves_onto(run, c, 0.5) for c in (0, 1)])
    after = after[after["ts"] <= m["end_ns"]]
    window = (m["end_ns"] - m["t0_ns"] - int(0.5 * NS)) / NS
    assert s["migrations_per_s"] == pytest.approx(len(after) / window)
    assert run.manifest["params"]["layout"] == [3, 0]
    assert not (out / "static").exists()  # E6 has no companion
    assert host_is_clean() == ([], [])


def test_bad_parameter_starts_nothing(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run(HARMONY + ["run", "heavy-light", "--cpus", "0,1", "--duration", "1",
                                  "-p", "long_warmup_s=2", "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "no long window" in p.stderr
    assert not out.exists()
