"""Scheduling classes and the warm release on the real kernel (each run <= 2 s of measurement).

What the RT class predicts for 2P SCHED_FIFO tasks of one priority held on the first CPU of P
(single-source): at t0 each other CPU, as its occupier leaves SCHED_FIFO, pulls one waiting RT
task (pull_rt_task): P - 1 migrations, and then none for good. FIFO never yields the CPU, and a
waiting RT task is pushed only to a CPU running a lower priority: P tasks run (each at most RT
throttling's 95 % of a CPU), the other P wait on the first CPU for the whole run (share 0), and
the run queues stay <P+1, 1, ..., 1>, never balanced by count or load. SCHED_OTHER tasks are
balanced by load: the run queues reach <2, ..., 2>, every task gets about half a CPU (reported,
not gated on: the fair class's decisions; what Harmony measured of them is).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from cli_run import HARMONY, cli
from conftest import host_skip, measure_quietly, until
from measured import assert_counted_by_the_kernel
from test_run_kernel import our_workers, report_balance, wait_for

import harmony
from harmony.core.osutil import SCHED_DEADLINE
from harmony.probes import sched_debug
from harmony.workload import controller
from harmony.workload.controller import ControllerError, Workload
from harmony.workload.tasks import TaskSpec

CPUS = [0, 1]


def _run(tmp_path, name, *params, duration=2):
    out = tmp_path / name
    # -v: the measurement facts (scheduling class, warm-up) the screen keeps behind it
    p = cli("run", "single-source", "--duration", duration, "--cpus", "0-1", "--out", out, "-q",
            "-v", *[x for kv in params for x in ("-p", kv)])
    assert p.returncode == 0, p.stderr
    return harmony.load(out), p.stdout


def _busy(result):
    foreign = result[0].manifest["foreign_load"]["max_frac"]
    return foreign > 0.05 and f"host was busy ({foreign:.0%} of a CPU used by other tasks)"


@pytest.mark.parametrize("prio,release", [(5, "cold"), (20, "cold"), (5, "warm")])
def test_fifo_single_source_is_placed_by_priority_not_load(kernel, tmp_path, prio, release):
    """The prediction of the module docstring, and the release holding (each task let go on its
    initial CPU: the controller and its occupiers run above the tasks), the class said."""
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    run, text = _run(tmp_path, f"fifo{prio}", "policy=fifo", f"rt_priority={prio}",
                     f"release={release}")
    m, s, ncpus = run.manifest, run.summary, 2
    rel = m["release"]
    assert rel["woken"] == 2 * ncpus and rel["not_woken"] == [] and rel["ran_before_t0"] == []
    assert rel["woke_off_initial_cpu"] == [] and rel["warm"] == (release == "warm"), rel
    assert rel["release_spread_ns"] < 50e6, rel
    assert m["sched"]["controller_fifo_priority"] == max(10, prio + 1)
    assert m["sched_classes"] == {"cpu": f"SCHED_FIFO {prio}"}
    assert m["params"]["policy"] == "fifo" and m["release_mode"] == (
        "warm" if release == "warm" else "occupied")
    # the RT class's placement: one pull per other CPU, then nothing; P run, P wait for good
    assert s["balance_migrations"] == ncpus - 1 and s["migrations"] == ncpus - 1, s
    assert s["balanced_at_end"] is False
    shares = sorted(run.shares["share"])
    assert shares[:ncpus] == [0.0] * ncpus and min(shares[ncpus:]) > 0.8, shares
    assert run.shares["fair"].tolist() == pytest.approx([0.95 / 2] * 4)   # equal split, 95 % cap
    kinds = [n["kind"] for n in m["trust_notes"]]
    assert "rt_throttling" in kinds and "woke_off_initial_cpu" not in kinds
    assert f"scheduling class             SCHED_FIFO {prio} (4 tasks)" in text
    assert "\n  RT throttling                " in text
    assert our_workers() == []


def test_other_single_source_is_measured_as_the_kernel_counted(kernel, tmp_path):
    """The SCHED_OTHER side of the comparison, on a quiet host. Gated on what Harmony measured:
    each task's moves and switches in the trace are those the kernel counted for it, the run
    queues it rebuilt are those the kernel's own nr_running gave whenever it was read cleanly,
    the class said. Whether the fair
    class balanced <4,0> to <2,2> and kept it, and gave each task about half a CPU, is the
    kernel's to decide: reported (test_run_kernel.report_balance), not gated on."""
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    run, text = measure_quietly(lambda k: _run(tmp_path, f"other{k}", "release=cold"), _busy)
    m = run.manifest
    assert_counted_by_the_kernel(run)
    nr = m["kernel_nr_running_agreement"]
    if sched_debug.available()[0]:      # the kernel's nr_running, where its debug file is there
        assert nr is not None and nr["agreeing"] == nr["clean"], nr
    assert run.shares["fair"].tolist() == pytest.approx([0.5] * 4)
    report_balance(run)
    assert "scheduling class             SCHED_OTHER (4 tasks)" in text
    assert "RT throttling" not in text
    assert m["sched"]["controller_fifo_priority"] == 10


def test_a_warm_run(kernel, tmp_path):
    """Warm: woken at the warm-up marker on their initial CPU, run there warm_s, freed at t0; the
    release check, the manifest and the report say so."""
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    run, text = _run(tmp_path, "warm", "warm_s=0.3")
    m = run.manifest
    rel = m["release"]
    assert rel["warm"] and rel["woken"] == 4 and rel["not_woken"] == [] \
        and rel["ran_before_t0"] == []
    assert rel["woke_off_initial_cpu"] == [] and rel["moved_before_released"] == 0, rel
    assert 0.3 <= rel["warmed_s"] == pytest.approx(m["sched"]["warmed_s"], abs=1e-3)
    assert m["release_mode"] == "warm" and m["params"]["release"] == "warm"
    assert rel["release_spread_ns"] < 50e6 and rel["first_wakeup_after_t0_ns"] is None
    markers = run.markers["text"].tolist()
    assert markers.index("harmony warm-up") < markers.index("harmony t0") \
        < markers.index("harmony released")
    # the tasks ran confined on CPU 0 before t0, in the trace
    before = run.runs[run.runs["end"] <= m["t0_ns"]]
    assert set(before["cpu"]) == {0} and set(before["pid"]) == set(run.tasks["pid"])
    assert "(warm: 4 tasks ran confined for 0.3" in text
    assert not [n for n in m["trust_notes"]
                if n["kind"] in ("warmup_short", "woke_off_initial_cpu")]


def test_warm_tasks_count_their_times_from_t0(host):
    """A task that stops 0.3 s after t0, warmed up 0.5 s: still running 0.1 s after t0 (counted
    from the warm-up it would have stopped 0.2 s before t0), gone later."""
    specs = [TaskSpec("stop", stop_after_s=0.3), TaskSpec("stay")]
    with Workload(specs, CPUS, warm_s=0.5) as w:
        w.spawn()
        assert w.release_mode == "warm" and w.occupier_pids == []
        w.release(lambda text: 0)
        assert os.sched_getaffinity(w.pids[0]) == set(CPUS)
        time.sleep(0.1)
        assert len(w.alive()) == 2
        assert until(lambda: w.alive() == [w.pids[1]], timeout_s=10)


def test_deadline_tasks_are_held_by_a_cpuset_and_get_their_reservation(host):
    """SCHED_DEADLINE before the gate, confined by the cpuset (the kernel refuses them a smaller
    affinity, not a cpuset), freed at t0; each gets its reservation of 10 ms per 100 ms."""
    from harmony.workload import cpuset
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy: deadline tasks cannot be held on a CPU")
    specs = [TaskSpec(f"d{i}", policy="deadline", dl_runtime_ms=10, dl_period_ms=100)
             for i in range(4)]
    with Workload(specs, CPUS) as w:
        w.spawn()
        assert [os.sched_getscheduler(p) for p in w.pids] == [SCHED_DEADLINE] * 4
        assert all(os.sched_getaffinity(p) == {0} for p in w.pids)
        w.release(lambda text: 0)
        assert all(os.sched_getaffinity(p) == set(CPUS) for p in w.pids)
        before = [int(open(f"/proc/{p}/schedstat").read().split()[0]) for p in w.pids]
        time.sleep(1.0)
        after = [int(open(f"/proc/{p}/schedstat").read().split()[0]) for p in w.pids]
    got = [(b - a) / 1e9 for a, b in zip(before, after)]
    assert all(0.05 < g <= 0.13 for g in got), got       # 0.1 s of each 1 s, enforced


def test_a_refused_class_is_one_line_naming_the_task(host, monkeypatch):
    """Admission control refusing the third 90 % deadline task (past the check this module's
    check_classes would have made first): the worker says why, spawn says it in one line."""
    from harmony.workload import cpuset
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy: deadline tasks cannot be held on a CPU")
    monkeypatch.setattr(controller, "check_classes", lambda *a, **k: None)
    specs = [TaskSpec(f"d{i}", policy="deadline", dl_runtime_ms=90, dl_period_ms=100,
                      initial_cpu=i % 2)
             for i in range(3)]
    w = Workload(specs, CPUS)
    with pytest.raises(ControllerError) as exc:
        with w:
            w.spawn()
    msg = str(exc.value)
    assert "could not enter SCHED_DEADLINE 90/100/100 ms (Device or resource busy: admission " \
           "control refused the bandwidth)" in msg and "\n" not in msg, msg
    assert w.alive() == []


def test_deadline_admission_refused_before_anything_starts(kernel, tmp_path):
    out = tmp_path / "refused"
    p = cli("run", "single-source", "--out", out, "-p", "policy=deadline", "-p", "dl_runtime_ms=90",
            "-p", "dl_period_ms=100", "-p", "release=cold")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "deadline admission control would refuse the tasks: 4 x SCHED_DEADLINE 90/100/100 ms" \
        in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists()
    p = cli("run", "work-conservation", "--out", out, "-p", "policy=deadline", "-p",
            "dl_runtime_ms=1", "-p", "dl_period_ms=100")
    assert p.returncode == 1 and "is SCHED_DEADLINE and pinned to CPU" in p.stderr, p.stderr
    assert not out.exists()


def test_fifo_workers_die_with_a_killed_controller(kernel, tmp_path):
    """SIGKILL of a controller whose tasks are SCHED_FIFO on both CPUs: they die with it."""
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    for _ in range(90):
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--duration", "30", "-q",
                                           "--out", str(tmp_path / "killed"), "-p", "policy=fifo",
                                           "-p", "rt_priority=3", "-p", "release=cold"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if wait_for(lambda: proc.poll() is not None or len(our_workers()) >= 4, timeout=30) \
                and proc.poll() is None:
            break
        err = proc.communicate()[1]
        assert "another Harmony run" in err, err
        time.sleep(2)
    time.sleep(0.5)     # past the release: the tasks spin at SCHED_FIFO
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_for(lambda: not our_workers(), timeout=10), our_workers()
    assert cli("clean").returncode == 0
