"""The controller's release on the real kernel: the layout holds until t0, every task is released,
and the cpuset cgroups are gone after a normal end, an error before t0, and a SIGKILL + reclaim."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import host_skip, until

from harmony.hygiene import reclaim_stale
from harmony.workload import cpuset
from harmony.workload.controller import ControllerError, Workload
from harmony.workload.tasks import TaskSpec

CPUS = [0, 1]


def _allowed(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/status").read_text()
    return cpuset.parse_cpus(text.split("Cpus_allowed_list:")[1].split()[0])


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _ours() -> list[Path]:
    return [p for _, root in cpuset.hierarchies()
            for p in root.glob(f"{cpuset.PREFIX}{os.getpid()}")]


def _specs():
    free = [TaskSpec(name=f"f{i}", initial_cpu=0) for i in range(5)]
    return free + [TaskSpec(name="p0", initial_cpu=1, pinned=True)]


def _policy(pid: int) -> int:
    return os.sched_getscheduler(pid)


@pytest.mark.parametrize("placement,mode", [("auto", "auto"), ("affinity", "auto"),
                                            ("auto", "confined"), ("affinity", "confined")])
def test_layout_held_until_t0_then_released(host, placement, mode):
    specs = _specs()
    with Workload(specs, CPUS, placement=placement, mode=mode) as w:
        w.spawn()
        occupied = mode == "auto" and host_sched_ext() != "enabled"
        assert w.release_mode == ("occupied" if occupied else "confined")
        # an occupier per CPU but the home one (CPU 0 holds the most tasks), asleep until t0
        assert len(w.occupier_pids) == (1 if occupied else 0)
        for pid in w.occupier_pids:
            assert _state(pid) == "S" and _allowed(pid) == {1} and _policy(pid) == os.SCHED_FIFO
        if placement == "affinity" or not cpuset.hierarchies():
            assert w.release_method == "affinity" and w.cpusets is None
        else:
            assert w.release_method == "cpuset"
            members = w.cpusets.members()
            assert sorted(members[0]) == sorted(w.pids[:5])  # the pinned task is in no cgroup
        # held: asleep at the gate, confined to the initial CPU, not one loop of work done
        for pid, spec in zip(w.pids, specs):
            assert _state(pid) == "S"
            assert _allowed(pid) == {spec.initial_cpu}
        time.sleep(0.1)
        assert w.work_done().sum() == 0

        marks = []
        t0, released = w.release(lambda text: marks.append(text)
                                 or time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        assert marks == ["harmony t0", "harmony released"] and t0 <= released
        for pid, spec in zip(w.pids, specs):
            assert _allowed(pid) == ({1} if spec.pinned else set(CPUS))
        assert until(lambda: (w.work_done() > 0).all()), w.work_done()  # every task runs
        assert len(w.alive()) == len(specs)
        # the occupiers left their CPUs: asleep, no longer SCHED_FIFO
        for pid in w.occupier_pids:
            assert until(lambda: _state(pid) == "S") and _policy(pid) == os.SCHED_OTHER
        occupiers = list(w.occupier_pids)
    assert w.alive() == []
    assert not [pid for pid in occupiers if Path(f"/proc/{pid}").exists()], "occupiers left"
    assert _ours() == [], "cpuset cgroups left after a normal end"


def host_sched_ext() -> str:
    from harmony.hostfacts import sched_ext_state
    return sched_ext_state()["state"]


@pytest.mark.parametrize("mode", ["occupied", "confined"])
def test_each_task_wakes_on_its_initial_cpu(host, tmp_path, mode):
    """Tasks held on both CPUs, released and traced: the first wake-up of each after t0 puts it
    on its initial CPU (the occupier of CPU 1 opens that CPU's gate itself). Occupied, every
    wake-up happens on a busy CPU and is recorded; confined, the remote ones (CPU 0 waking CPU 1's
    tasks) are recorded by CPU 1, which tracefs on some kernels does not do while CPU 1 is idle:
    those tasks are then seen only by their sched_waking, and not judged."""
    from harmony.analysis.release import release_spread
    from harmony.probes.tracefs import TracefsProbe
    if mode == "occupied" and host_sched_ext() == "enabled":
        host_skip("a sched_ext scheduler is enabled: the release is confined")
    specs = [TaskSpec(name=f"w{i}", initial_cpu=i % 2) for i in range(12)]
    probe = TracefsProbe(tmp_path / "raw", CPUS, 1.0)
    with Workload(specs, CPUS, mode=mode) as w:
        w.spawn()
        assert w.release_mode == mode
        probe.start()           # as a run does: after the workers sleep at their gates
        try:
            t0, released = w.release(probe.mark)
            time.sleep(0.05)
        finally:
            probe.stop()
        pids = list(w.pids)
    events = probe.decode().events
    tasks = pd.DataFrame({"pid": pids, "initial_cpu": [s.initial_cpu for s in specs]})
    rel = release_spread(events, tasks, t0, released)
    assert rel["woken"] == len(specs) if mode == "occupied" \
        else rel["woken"] >= len(specs) // 2, rel
    assert rel["ran_before_t0"] == [] and rel["woke_off_initial_cpu"] == [], rel
    waking = events[(events["event"] == "sched_waking") & (events["ts"] >= t0)]
    assert set(pids) <= set(waking["pid"])      # every gate was opened
    # the wake-ups of CPU 1's tasks were done on CPU 1 when it had an occupier, else from CPU 0
    waking = waking[waking["pid"].isin(pids[1::2]) & (waking["ts"] <= released)]
    assert set(waking["cpu"]) == ({1} if mode == "occupied" else {0})


def test_an_occupier_dying_before_t0_is_reported_and_cleaned(host, monkeypatch):
    """Forked here, so that the occupier inherits a body that exits at once: spawn says so with its
    status (it does not wait for the timeout), and nothing is left."""
    from harmony.workload import worker
    if host_sched_ext() == "enabled":
        host_skip("a sched_ext scheduler is enabled: no occupiers")
    monkeypatch.setenv("HARMONY_FORKSERVER", "0")
    monkeypatch.setattr(worker, "occupy", lambda *a: os._exit(3))
    w = Workload(_specs(), CPUS, mode="occupied")
    with pytest.raises(ControllerError, match=r"occupier \d+ died before t0 \(status 0x300\)"):
        with w:
            w.spawn(timeout_s=20)
    assert w.alive() == [] and _ours() == []


def test_an_occupier_that_cannot_run_fifo_means_a_confined_release(host, monkeypatch):
    """Workers forked here (no fork server), so that the occupier inherits a sched_setscheduler
    that refuses SCHED_FIFO outside this process: the release is confined and says why."""
    monkeypatch.setenv("HARMONY_FORKSERVER", "0")
    me, real = os.getpid(), os.sched_setscheduler

    def refuse(pid, policy, param):
        if os.getpid() != me and policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")
        return real(pid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with Workload(_specs(), CPUS, mode="occupied") as w:
        w.spawn()
        assert w.release_mode == "confined"
        assert any("could not run as SCHED_FIFO" in n for n in w.notes), w.notes
        w.release(lambda text: 0)
        assert _allowed(w.pids[0]) == set(CPUS)
        assert until(lambda: (w.work_done() > 0).all())


def test_release_restores_the_controller(host):
    before_mask, before_policy = os.sched_getaffinity(0), os.sched_getscheduler(0)
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        w.release(lambda text: 0)
        assert os.sched_getaffinity(0) == before_mask
        assert os.sched_getscheduler(0) == before_policy


def test_worker_dying_before_the_gate_is_reported_and_cleaned(host, monkeypatch):
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy")
    # a worker that cannot join its cgroup exits before the gate
    monkeypatch.setattr(cpuset.CpusetGroups, "procs_file",
                        lambda self, cpu: "/nonexistent/cgroup.procs")
    w = Workload(_specs(), CPUS, placement="cpuset")
    with pytest.raises(ControllerError, match="died before t0"):
        with w:
            w.spawn(timeout_s=10)
    assert w.alive() == []
    assert _ours() == []


def test_a_ctrl_c_while_the_cgroups_are_made_leaves_none(host, monkeypatch):
    """Ctrl-C once the run's parent cgroup exists, before its groups are all made: the
    workload's stop() removes what was made (CI once found a suite's group left so)."""
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy")
    made = cpuset.CpusetGroups._create

    def stopped_half_way(self, *args):
        made(self, *args)
        assert _ours(), "no group was made"
        raise KeyboardInterrupt

    monkeypatch.setattr(cpuset.CpusetGroups, "_create", stopped_half_way)
    w = Workload(_specs(), CPUS, placement="cpuset")
    with pytest.raises(KeyboardInterrupt):
        with w:
            w.spawn(timeout_s=10)
    assert _ours() == [] and w.cpusets is None


def test_no_cpuset_falls_back_to_affinity_and_says_so(host, monkeypatch):
    monkeypatch.setattr(cpuset, "hierarchies", lambda: [])
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        assert w.release_method == "affinity"
        assert any("cpusets unavailable" in n for n in w.notes)
        w.release(lambda text: 0)
        assert _allowed(w.pids[0]) == set(CPUS)
    with pytest.raises(ControllerError, match="no cpuset"):
        with Workload(_specs(), CPUS, placement="cpuset") as w:
            w.spawn()


CHILD = textwrap.dedent("""
    import time
    from harmony.workload.controller import Workload
    from harmony.workload.tasks import TaskSpec
    w = Workload([TaskSpec(name=f"k{i}", initial_cpu=0) for i in range(4)], [0, 1])
    w.spawn()
    print(w.cpusets.parent, *w.pids, flush=True)
    time.sleep(60)
""")


def test_sigkill_leaves_cgroups_that_the_next_start_reclaims(host):
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        parent, *pids = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    parent = Path(parent)
    assert parent.name == f"{cpuset.PREFIX}{child.pid}" and len(pids) == 4
    # the workers die with their controller (PR_SET_PDEATHSIG), even asleep at the gate
    assert until(lambda: not any(Path(f"/proc/{p}").exists() for p in pids))
    assert parent.is_dir()  # nothing could remove it: the controller was killed
    removed = reclaim_stale()
    assert any(str(parent) in r for r in removed), removed
    assert not parent.exists()
    assert not any(str(parent) in r for r in reclaim_stale())  # and only once


KEPT = textwrap.dedent("""
    import os
    from pathlib import Path
    from harmony.workload import cpuset
    from harmony.workload.controller import Workload
    from harmony.workload.tasks import TaskSpec

    def allowed(pid):
        text = Path(f"/proc/{pid}/status").read_text()
        return sorted(cpuset.parse_cpus(text.split("Cpus_allowed_list:")[1].split()[0]))

    cpuset.keep_within_the_boot()
    version, root = cpuset.hierarchies()[0]
    had = version == "v2" and "cpuset" in (root / "cgroup.subtree_control").read_text().split()
    for cpu in (0, 1, 0):       # each run's tasks held on their initial CPU, then released
        with Workload([TaskSpec(name=f"k{i}", initial_cpu=cpu) for i in range(3)], [0, 1]) as w:
            w.spawn()
            held = [allowed(p) for p in w.pids]
            w.release(lambda text: 0)
            print(w.release_method, held == [[cpu]] * 3,
                  [allowed(p) for p in w.pids] == [[0, 1]] * 3, flush=True)
        print("kept", w.cpusets is None and (root / f"{cpuset.PREFIX}{os.getpid()}").is_dir(),
              flush=True)
    print("root", root, version, had, os.getpid(), flush=True)
""")


def test_groups_kept_within_a_boot_hold_each_run_and_go_at_exit(host):
    """keep_within_the_boot (the guest agent's): the groups stay from one run to the next, each
    run's tasks are held on their initial CPU until t0 all the same, and the process's exit
    removes them and gives the root's +cpuset back as it found it."""
    if not cpuset.hierarchies():
        host_skip("no cpuset hierarchy")
    out = subprocess.run([sys.executable, "-c", KEPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    runs = [line for line in lines if line.startswith("cpuset")]
    assert runs == ["cpuset True True"] * 3, out.stdout
    assert [line for line in lines if line.startswith("kept")] == ["kept True"] * 3, out.stdout
    _, root, version, had, pid = next(line for line in lines if line.startswith("root")).split()
    assert not (Path(root) / f"{cpuset.PREFIX}{pid}").exists(), "the kept groups outlived it"
    if version == "v2" and not any(Path(root).glob(f"{cpuset.PREFIX}*")):
        enabled = "cpuset" in (Path(root) / "cgroup.subtree_control").read_text().split()
        assert enabled == (had == "True"), "the root's +cpuset not given back as it was"
