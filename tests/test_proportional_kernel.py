"""Real-kernel run of the proportional experiment through the CLI, on 2 CPUs, about a second a run:
the two 1-CPU baselines captured as companions, pinned to the set's first CPU.

Nothing here asserts a timing or a scheduler decision; only what the harness guarantees (where
the tasks ran, how many each run holds, the declared summary keys, the figure), what follows
from one CPU's arithmetic (tasks confined to one CPU share at most that CPU), each run's moves
and switches as the kernel counted them (tests/measured.py), and the summary's ratios as their
definitions make them of the runs' measured shares. Whether the speedup was proportional is the
kernel's to decide: reported, not gated on.
"""

from __future__ import annotations

import harmony
import pytest
from harmony.experiments import get_experiment

from cli_run import cli
from measured import assert_counted_by_the_kernel, report_kernel_behaviour

pytestmark = [pytest.mark.kernel, pytest.mark.needs_cpus(2)]


def test_proportional_run_with_its_one_cpu_baselines(kernel, tmp_path):
    out = tmp_path / "run"
    p = cli("run", "proportional", "--cpus", "0,1", "--duration", "1", "-p", "ntasks=4",
            "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    run, one, share = harmony.load(out), harmony.load(out / "one"), harmony.load(out / "share")
    exp = get_experiment("proportional")
    for r in (run, one, share):
        assert exp.summary_problems(r.summary) == []
        assert r.manifest["cpus"] == [0, 1]
    assert [len(r.tasks) for r in (run, one, share)] == [4, 4, 2]
    assert sorted(run.tasks["initial_cpu"]) == [0, 0, 1, 1] and not run.tasks["pinned"].any()
    assert_counted_by_the_kernel(run)
    for base in (one, share):
        assert base.tasks["pinned"].all() and (base.tasks["initial_cpu"] == 0).all()
        t0 = base.manifest["t0_ns"]
        assert set(base.runs[base.runs["end"] > t0]["cpu"]) == {0}   # never on CPU 1 in the window
        assert base.summary["migrations"] == 0
        # pinned: the kernel counted no move of them either
        assert assert_counted_by_the_kernel(base)["migrations"]["kernel"] == 0
        assert base.shares["share"].sum() <= 1.0 + 1e-6     # one CPU's worth at most
        assert base.summary["cpus_used"] == 1
    s = run.summary
    assert s["cpus_used"] == 2 and s["ideal_speedup"] == pytest.approx(2.0)
    assert s["concurrency_tasks"] == 2
    # the ratios, by their definitions, of the shares each run measured (tasks matched by name;
    # GPS: 4 tasks get 1/2 a CPU each on 2 CPUs, 1/4 on one, 2 tasks 1/2 on one)
    p_, o_, c_ = (r.shares.set_index("name")["share"] for r in (run, one, share))
    speedup = p_.sum() / o_.sum()
    assert s["speedup"] == pytest.approx(speedup)
    assert s["speedup_ratio"] == pytest.approx(speedup / 2)
    assert s["speedup_ratio_min"] == pytest.approx(min((p_[n] / o_[n]) / 2 for n in p_.index))
    assert s["concurrency_ratio"] == pytest.approx(p_[c_.index].sum() / c_.sum())
    report_kernel_behaviour("a proportional speedup (ratio 0.9 to 1.1)",
                            0.9 <= s["speedup_ratio"] <= 1.1, s)
    assert any(f.endswith("proportional.png") for f in run.manifest["figures"])
