"""End to end on the real kernel, through the CLI as a user runs it: a <4,0> single-source run,
its tables against the kernel's own view, and host hygiene after normal ends, SIGTERM and SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from cli_run import HARMONY, cli
from conftest import host_skip, measure_quietly, pids_with_comm

import harmony
from harmony.analysis.metrics import balance_timeline
from harmony.hygiene import WORKER_PREFIX
from harmony.workload.forkserver import COMM as SERVER_COMM
from measured import assert_counted_by_the_kernel, report_kernel_behaviour

TRACEFS = Path("/sys/kernel/tracing")


def our_workers(prefix=WORKER_PREFIX) -> list[int]:
    return pids_with_comm(prefix)


def our_servers() -> list[str]:
    """Fork servers (harmony.workload.forkserver), but the one of this test process (other tests'
    workloads): pid and the parent's command line of each."""
    out = []
    for pid in our_workers(SERVER_COMM):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if ppid != os.getpid():
            out.append(f"{pid} (parent {ppid}: {parent})")
    return out


def our_instances() -> list[str]:
    d = TRACEFS / "instances"
    return sorted(p.name for p in d.iterdir() if p.name.startswith("harmony")) if d.is_dir() else []


def wait_for(predicate, timeout=20.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def report_balance(run, last_ns: int = 1_000_000_000) -> None:
    """Whether the run queues of a single-source ``run`` balanced and stayed balanced over its
    last ``last_ns`` (within its tolerance for at least two thirds of that time, no imbalance
    there lasting longer than 250 ms), and every task got about half a CPU (0.3 to 0.7): the
    kernel's decisions, reported (tests/measured.py), not gated on.

    Not "balanced at the end" (``balanced_at_end``, the state at one instant): the kernel does
    not hold 2-2 still. Its load balancer weighs every task of a CPU, other processes' too, and a
    few ms of them on one CPU tip it to move an experiment task off that CPU (3-1), and one back
    about 0.1 s later. In 12 cold 2 s runs here (2026-11-26), the 8 quiet ones (other tasks under
    5 % of a CPU) made 11 such moves by the periodic balancer, 10 off the CPU where other
    processes (a PID-1 thread, mostly) had run more of the 100 ms before (3.6-13.4 ms, against
    0-9.7 ms on the other), each moved back 20-132 ms later but one: that run ended 7 ms into it
    (balanced_at_end False). One CI run of 3 s went 3-1 twice in its last second, back within 140
    and 96 ms (balanced 76 % of that second)."""
    m = run.manifest
    tl = balance_timeline(run.runqueue, run.tasks, m["cpus"], m["t0_ns"], m["end_ns"],
                          m["params"]["tolerance"])
    start = m["end_ns"] - last_ns
    last = tl[tl["end"] > start]
    dur = last["end"] - last["ts"].clip(lower=start)
    balanced = dur[last["balanced"]].sum() / max(dur.sum(), 1)
    longest = np.max(dur[~last["balanced"]].to_numpy(), initial=0) / 1e6
    report_kernel_behaviour("<4,0> balanced to <2,2> by the fair class and kept so",
                            run.summary["first_balanced_s"] is not None and balanced >= 2 / 3
                            and longest <= 250,
                            f"first balanced {run.summary['first_balanced_s']} s; last second "
                            f"{balanced:.0%} balanced, longest imbalance {longest:.0f} ms")
    shares = run.shares["share"]
    report_kernel_behaviour("each of 4 tasks on 2 CPUs given about half a CPU (0.3 to 0.7)",
                            bool(shares.between(0.3, 0.7).all()), shares.round(3).tolist())


def start_long_run(out: Path, duration=30) -> subprocess.Popen:
    """A run in the background, returned once its workers are released and the probe records."""
    for _ in range(90):
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--layout", "2,0", "--duration",
                                           str(duration), "--out", str(out), "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = wait_for(lambda: proc.poll() is not None or
                           (len(our_workers()) >= 2 and our_instances()), timeout=30)
        if proc.poll() is None and started:
            time.sleep(0.5)  # past the release
            return proc
        err = proc.communicate()[1]
        if "another Harmony run" not in err:
            raise AssertionError(f"run did not start: {err}")
        time.sleep(2)
    raise AssertionError("host stayed busy")


@pytest.fixture(scope="module")
def e1_run(kernel, tmp_path_factory):
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    base = tmp_path_factory.mktemp("e1")

    def measure(k):
        out = base / f"run{k}"
        # cold: the release's wake-ups and occupier are what the test checks (the catalog's
        # default, warm, is tests/test_sched_classes_kernel.py's)
        p = cli("run", "single-source", "--layout", "4,0", "--duration", 3, "--cpus", "0-1",
                "-p", "release=cold", "--out", out, "-q")
        assert p.returncode == 0, p.stderr
        return out, p

    def busy(result):       # other jobs on the CPUs change what a balanced placement is
        foreign = harmony.load(result[0]).manifest["foreign_load"]["max_frac"]
        return foreign > 0.05 and f"host was busy ({foreign:.0%} of a CPU used by other tasks)"

    return measure_quietly(measure, busy)


def test_run_is_complete_and_measured_as_the_kernel_counted(e1_run):
    out, p = e1_run
    run = harmony.load(out)
    m = run.manifest
    assert m["status"] == "complete"
    assert m["lost_events"] == 0
    assert m["probe"] == "tracefs" and m["cpus"] == [0, 1]
    assert m["params"]["layout"] == [4, 0] and m["params"]["duration"] == 3.0
    # every move and switch of the tasks in the trace, as the kernel counted them
    assert_counted_by_the_kernel(run)
    after_t0 = run.migrations[run.migrations["t"] >= 0]
    rel = m["release"]
    assert rel["woken"] == 4 and not rel["not_woken"] and rel["woke_off_initial_cpu"] == []
    assert m["release_mode"] in ("occupied", "confined")
    if m["release_mode"] == "occupied":  # its occupier (of CPU 1): the run's own, not foreign
        ev = run.events
        occupier = set(ev.loc[ev["comm"] == "hmy-occupy1", "pid"])
        assert occupier and occupier <= set(m["controller_tids"]), occupier
    assert 0 <= rel["wake_spread_ns"] <= rel["release_spread_ns"] < 50e6
    assert "harmony t0" in set(run.markers["text"])
    # the probe's blind spots are looked for in every run (against trace-cmd's reading of the
    # capture: test_the_capture_facts_are_trace_cmds), and each one found is in the notes
    cap = m["capture"]
    assert all(any(c["comm"] in n for n in m["notes"]) for c in cap["silent_contexts"][:5])
    # the release put every task on CPU 0: its run queue reaches 4 before the first move. (Not
    # "before the released marker": a remote wake-up may be enqueued by the target CPU after it.)
    rq = run.runqueue
    first_move = int(after_t0["ts"].min()) if len(after_t0) else m["end_ns"]
    first = rq[(rq["cpu"] == 0) & (rq["ts"] >= m["t0_ns"]) & (rq["ts"] < first_move)]
    assert first["nr"].max() == 4, rq.head(10)
    assert m["foreign_load"]["max_frac"] <= 0.05      # a quiet run (e1_run measures again)
    report_balance(run)


#: a line of ``trace-cmd report -R -t``: comm-pid [cpu] sec.nsec: event: field=value ...
REPORT = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<sec>\d+)\."
                    r"(?P<ns>\d{9}):\s+(?P<event>[\w:]+):\s+(?P<rest>.*)$")
FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def trace_cmd_records(dat: Path) -> list[dict]:
    """Every record trace-cmd reads in ``dat``, its raw fields as trace-cmd prints them (ints
    where they are numbers): event, ts, cpu, common_pid and the event's own fields."""
    p = subprocess.run(["trace-cmd", "report", "-R", "-t", "-i", str(dat)], capture_output=True,
                       text=True, errors="replace", timeout=300)
    assert p.returncode == 0, p.stderr
    out = []
    for line in p.stdout.splitlines():
        m = REPORT.match(line)
        if not m:
            continue
        rec = {k: int(v) if re.fullmatch(r"-?\d+", v) else v
               for k, v in FIELD.findall(m.group("rest"))}
        out.append({**rec, "event": m.group("event"), "cpu": int(m.group("cpu")),
                    "common_pid": int(m.group("pid")),
                    "ts": int(m.group("sec")) * 1_000_000_000 + int(m.group("ns"))})
    return out


def trace_cmd_silent_contexts(recs: list[dict]) -> list[tuple[int, int, int]]:
    """(pid, cpu (pid 0's, -1 for a task), runs) of each context that was switched in and later
    replaced on its CPU, yet holds no record of trace-cmd's reading (markers aside)."""
    def context(pid, cpu):
        return (pid, cpu if pid == 0 else -1)

    heard = {context(r["common_pid"], r["cpu"]) for r in recs if r["event"] != "print"}
    switches = [r for r in recs if r["event"] == "sched_switch"]
    last = {r["cpu"]: i for i, r in enumerate(switches)}
    runs: dict[tuple[int, int], int] = {}
    for i, r in enumerate(switches):
        c = context(r["next_pid"], r["cpu"])
        if last[r["cpu"]] != i and c not in heard:
            runs[c] = runs.get(c, 0) + 1
    return sorted((pid, cpu, n) for (pid, cpu), n in runs.items())


def trace_cmd_unrecorded_moves(recs: list[dict], pids) -> list[tuple[int, int, int, int]]:
    """(pid, ts, from_cpu, to_cpu) of each move of ``pids`` that their own records prove (a
    record placing the task on another CPU than the last one placed it on) but no
    sched_migrate_task records, walking trace-cmd's records in time order: a switch places its
    tasks on its CPU, sched_waking and sched_wakeup[_new] on their target_cpu, a migration takes
    a task from orig_cpu to dest_cpu."""
    pids = set(int(p) for p in pids)
    where: dict[int, int] = {}
    out = []
    for r in sorted(recs, key=lambda r: r["ts"]):      # stable: each CPU's in the order read
        ev = r["event"]
        if ev == "sched_switch":
            places = [(r["next_pid"], r["cpu"], r["cpu"]), (r["prev_pid"], r["cpu"], r["cpu"])]
        elif ev in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
            places = [(r["pid"], r["target_cpu"], r["target_cpu"])]
        elif ev == "sched_migrate_task":
            places = [(r["pid"], r["orig_cpu"], r["dest_cpu"])]
        else:
            continue
        for pid, before, after in places:
            if pid not in pids or before < 0:
                continue
            if pid in where and where[pid] != before:
                out.append((pid, r["ts"], where[pid], before))
            where[pid] = after
    return sorted(out)


@pytest.mark.needs_tool("trace-cmd")
def test_the_capture_facts_are_trace_cmds(e1_run, tmp_path):
    """The blind spots a run states (contexts the probe saw run yet recorded nothing in; moves
    the tasks' own events prove that no sched_migrate_task recorded) against the same facts
    read from trace-cmd's own decoding of the capture (exported as recorded)."""
    out, _ = e1_run
    run = harmony.load(out)
    dat = tmp_path / "run.dat"
    p = cli("export", out, "--out", dat)
    assert p.returncode == 0, p.stderr
    recs = trace_cmd_records(dat)
    assert len([r for r in recs if r["event"] != "print"]) == len(run.events)
    cap = run.manifest["capture"]
    assert [(c["pid"], c["cpu"], c["runs"]) for c in cap["silent_contexts"]] == \
        sorted(trace_cmd_silent_contexts(recs), key=lambda c: -c[2])
    moves = trace_cmd_unrecorded_moves(recs, run.tasks["pid"])
    um = cap["unrecorded_migrations"]
    assert (um["n"], um["pids"]) == (len(moves), sorted({m[0] for m in moves})), (um, moves)
    assert [(e["pid"], e["ts"], e["from_cpu"], e["to_cpu"]) for e in um["examples"]] == moves[:5]


def test_tables_are_documented_columns(e1_run):
    out, _ = e1_run
    run = harmony.load(out)
    assert {"ts", "t", "pid", "src_cpu", "dst_cpu", "kind"} <= set(run.migrations.columns)
    assert {"pid", "cpu", "start", "end"} <= set(run.runs.columns)
    assert {"ts", "cpu", "nr"} <= set(run.runqueue.columns)
    assert {"pid", "name", "role", "duty", "nice", "initial_cpu"} <= set(run.tasks.columns)
    runs = run.runs
    assert (runs["end"] >= runs["start"]).all()
    # every task ran, on both CPUs between them, and every run lies in the experiment's CPU set
    assert set(runs["pid"]) == set(run.tasks["pid"])
    assert set(runs["cpu"]) == {0, 1}


def test_rebuilt_runqueues_agree_with_the_kernel(e1_run):
    out, _ = e1_run
    run = harmony.load(out)
    ka = run.manifest["kernel_agreement"]
    assert ka["sweeps"] >= 10
    # a sweep over /proc is not instantaneous, so an honest migration mid-sweep may disagree
    assert ka["agreement"] >= 0.9, ka


def test_report_and_figures(e1_run):
    out, _ = e1_run
    p = cli("report", out)
    assert p.returncode == 0, p.stderr
    assert "lost events" in p.stdout and "release spread" in p.stdout
    assert (out / "report.md").read_text().count("![") >= 3
    for fig in harmony.load(out).manifest["figures"]:
        data = (out / fig).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    js = json.loads(cli("report", out, "--json").stdout)
    assert js["summary"]["ntasks"] == 4 and js["manifest"]["status"] == "complete"


def test_nothing_left_behind_after_a_normal_run(e1_run):
    assert not our_workers()
    assert not our_servers(), our_servers()
    assert not our_instances()


def test_a_crowded_cpu_set_gets_the_window_asked(kernel, tmp_path):
    """600 tasks on two CPUs: the window still ends at t0 + duration (the controller sleeps at
    SCHED_FIFO from the release; counted from after the steps following it, the window was 1.01 s
    for 0.5 s asked), and the end, with the workers stopped first, agrees with their counters."""
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")
    out = tmp_path / "run"
    p = cli("run", "single-source", "--layout", "600,0", "--duration", 0.5, "--cpus", "0-1",
            "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and m["workers_alive_at_end"] == 600
    assert 0.5 <= m["measured_s"] < 0.55, m["timings_s"]
    assert not [n for n in m["notes"] if "late" in n]
    kc = m["kernel_counter_agreement"]
    assert kc["tasks"] == 600 and kc["disagreeing"] == 0
    assert not our_workers()


def test_the_controllers_threads_keep_off_a_set_smaller_than_the_machine(kernel, tmp_path):
    """A set of CPU 0 on a machine of more: once the tasks are released, the controller's own
    threads (the manifest's controller_tids, its probe's drains among them) run only outside
    the set (controller_cpus), so their SCHED_FIFO time does not come off the capacity of the
    CPUs under test. Read from the trace: none of them is switched in on CPU 0 in the window's
    second half."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2 or mine[0] != 0:
        host_skip("needs CPU 0 and another")
    out = tmp_path / "run"
    p = cli("run", "single-source", "--layout", "3", "--duration", 1, "--cpus", "0",
            "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    run = harmony.load(out)
    m = run.manifest
    assert m["controller_cpus"] == mine[1:]
    ev = run.events
    half = m["t0_ns"] + (m["end_ns"] - m["t0_ns"]) // 2
    sw = ev[(ev["event"] == "sched_switch") & (ev["ts"] >= half) & (ev["ts"] < m["end_ns"])]
    own = sw[sw["pid"].isin(m["controller_tids"])]    # switched in: pid is next_pid
    assert len(sw) and not (own["cpu"] == 0).any(), own.head()
    assert os.sched_getaffinity(0) == set(mine)     # this process's own: untouched
    assert not our_workers()


def test_the_kernel_sampler_sweeps_less_often_when_a_sweep_is_long():
    """A sweep of 3000 /proc reads (>= 5 ms of CPU) is followed by >= 0.5 s of sleep (SWEEP_BUDGET),
    whatever the rate asked (100 Hz); a sweep of 3 reads keeps the rate. At SCHED_FIFO a sweep
    takes its CPU from the tasks: this keeps it near 1 %."""
    from harmony.probes.proc_stat import SWEEP_BUDGET, KernelSampler

    def sweeps(n_pids):
        sampler = KernelSampler([os.getpid()] * n_pids, 100.0)
        sampler.start()
        sampler.begin.set()
        time.sleep(0.5)
        sampler.stopping.set()
        sampler.join()
        ts = sampler.frame()
        return ts["ts"].nunique(), ts["sweep_ns"].min()

    n, shortest = sweeps(3000)
    assert n <= 1 + 0.5 / (SWEEP_BUDGET * shortest / 1e9) and n <= 2, (n, shortest)
    assert sweeps(3)[0] >= 10


def test_sigkill_of_the_controller(kernel, tmp_path):
    out = tmp_path / "killed"
    proc = start_long_run(out)
    workers = our_workers()
    assert workers
    proc.kill()
    proc.wait()
    # workers die with their controller (PR_SET_PDEATHSIG), the fork server too
    assert wait_for(lambda: not our_workers() and not our_servers(), timeout=10), our_workers()
    # the dead run's tracing instance is reclaimed by the next start (or `harmony clean`)
    assert our_instances()
    p = cli("clean")
    assert p.returncode == 0 and "removed" in p.stdout, p.stdout + p.stderr
    assert not our_instances()
    # never analysed as complete
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] != "complete"
    p = cli("report", out)
    assert p.returncode == 1 and "killed" in p.stderr and "Traceback" not in p.stderr


def test_sigterm_and_concurrent_run(kernel, tmp_path):
    out = tmp_path / "first"
    proc = start_long_run(out)
    try:
        second = cli("run", "single-source", "--duration", 1, "--out", tmp_path / "second",
                     check_busy=False)
        assert second.returncode == 1
        assert "another Harmony run" in second.stderr
        assert not (tmp_path / "second" / "manifest.json").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "incomplete" in err and "Traceback" not in err
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "incomplete" and "SIGTERM" in m["incomplete_reason"]
    assert not our_workers() and not our_servers()
    assert not our_instances()
    with pytest.raises(harmony.store.RunError, match="incomplete"):
        harmony.load(out)


def test_ctrl_c(kernel, tmp_path):
    out = tmp_path / "interrupted"
    proc = start_long_run(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    assert not our_workers() and not our_servers()
    assert not our_instances()


@pytest.mark.parametrize("args, says", [
    (["--layout", "3,0,0"], "CPU"),
    (["--cpus", "0-63"], "not online"),
    (["--duration", "-1"], "duration"),
    (["--param", "duty=150"], "duty"),
    (["--param", "nosuch=1"], "nosuch"),
    (["--param", "layout=a,b"], "layout"),
    (["--probe", "nope"], "probe"),
    (["--layout", "0,0"], "no task"),
    (["--duration", "inf"], "finite"),                 # would pass "positive" and never end
    (["--param", "bin_s=nan"], "finite"),
])
def test_bad_arguments_exit_2_before_anything_starts(tmp_path, args, says):
    out = tmp_path / "bad"
    p = cli("run", "single-source", *args, "--out", out, check_busy=False)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("command", [
    ["run", "single-source"], ["suite", "--quick"],
    ["simulate", "--policy", "poly-balance", "--experiment", "how-many"],
    ["import", Path(__file__), "--pid", "1"],
])
def test_an_out_that_cannot_be_written_exits_2_before_anything_starts(tmp_path, command):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out, says in ((a_file, "exists and is not a directory"),
                      (a_file / "run", "is not a directory"),
                      (Path("/proc/harmony-out"), "cannot write under /proc")):
        p = cli(*command, "--out", out, check_busy=False)
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]    # no check left behind


def test_unknown_experiment_exit_2(tmp_path):
    p = cli("run", "no-such-experiment", "--out", tmp_path / "x", check_busy=False)
    assert p.returncode == 2 and "no-such-experiment" in p.stderr


@pytest.mark.parametrize("env, command", [("HARMONY_RELEASE_MODE", ["run", "single-source"]),
                                          ("HARMONY_RELEASE_PLACEMENT", ["suite", "--quick"])])
def test_unknown_release_option_exit_2_before_anything_starts(tmp_path, monkeypatch, env, command):
    monkeypatch.setenv(env, "bogus")
    out = tmp_path / "bad"
    p = cli(*command, "--out", out, check_busy=False)
    assert p.returncode == 2 and f"{env}='bogus'" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()
