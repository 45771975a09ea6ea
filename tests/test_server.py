"""The server experiment without the kernel: its parameters, its records joined with the trace's
tables, and its metrics computed by hand (service inversion, Ruan's eq. 3.1; Jain's index;
percentiles with unanswered requests)."""

from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_run import cli

from harmony.analysis import requests as req
from harmony.analysis import server_card
from harmony.analysis.policy import Evidence
from harmony.analysis.tables import REQUESTS
from harmony.analysis.thresholds import RQ_WAIT_MIN_NS
from harmony.core.errors import ControllerError, ParameterError
from harmony.experiments import get_experiment
from harmony.vm.guest import PlannedExperiment, PlannedRun, read_job, write_job
from harmony.workload import forkserver, serve

T0 = 1_000_000_000


def test_service_inversion_is_ruans_example():
    # sizes A < B < C < D < E, latencies in the order B, C, A, D, E: distances 2, 1, 1, 0, 0 over 12
    sizes = [1, 2, 3, 4, 5]
    latency = [3.0, 1.0, 2.0, 4.0, 5.0]
    assert req.service_inversion(sizes, latency) == pytest.approx(4 / 12)
    assert req.service_inversion(sizes, sizes) == 0.0
    assert req.service_inversion(sizes, sizes[::-1]) == 1.0          # fully inverted
    assert req.service_inversion([1], [1.0]) is None
    # one size: the N-th observed takes the N-th ideal position, whatever order they came in
    assert req.service_inversion([7, 7, 7], [3.0, 1.0, 2.0]) == 0.0


def test_percentiles_count_unanswered_requests_as_infinitely_late():
    lat = np.array([1e6, 2e6, 3e6, np.nan])
    assert req.percentile_ms(lat, 50) == 2.0
    assert req.percentile_ms(lat, 75) == 3.0
    assert req.percentile_ms(lat, 99) is None             # an unanswered one is there
    assert req.percentile_ms(np.array([]), 50) is None


def _write(path, rows):
    path.write_bytes(b"".join(serve.REC.pack(*r) for r in rows))


@pytest.fixture
def small(tmp_path):
    """Three requests on two connections: one served by pid 100 across a wake-up wait, a
    preemption and a migration, one by pid 101 without either, one never answered (times in us
    after t0)."""
    d = tmp_path / "requests"
    d.mkdir()
    us = 1000
    _write(d / serve.SENT_FILE, [(0, 0, T0 + 10 * us, T0 + 11 * us, 0, 50 * us),
                                 (1, 1, T0 + 200 * us, T0 + 200 * us, 0, 80 * us),
                                 (2, 0, T0 + 500 * us, T0 + 500 * us, 0, 30 * us)])
    # the last record cut short, as a task killed in the middle of a write would leave it
    (d / serve.DONE_FILE).write_bytes(
        serve.REC.pack(0, 0, T0 + 10 * us, T0 + 11 * us, T0 + 100 * us, 50 * us)
        + serve.REC.pack(1, 1, T0 + 200 * us, T0 + 200 * us, T0 + 400 * us, 80 * us) + b"\1\2\3")
    _write(d / ("c00" + serve.STAGE_SUFFIX), [(0, 1, 100, T0 + 20 * us, T0 + 90 * us, 0)])
    _write(d / ("c01" + serve.STAGE_SUFFIX), [(1, 1, 101, T0 + 250 * us, T0 + 350 * us, 0)])
    runs = pd.DataFrame({"pid": [100, 100, 100, 101], "cpu": [0, 0, 1, 1],
                         "start": [T0, T0 + 20 * us, T0 + 60 * us, T0 + 250 * us],
                         "end": [T0 + 15 * us, T0 + 50 * us, T0 + 95 * us, T0 + 350 * us],
                         "end_state": [1, 0, 1, 1]})
    events = pd.DataFrame({"event": ["sched_wakeup", "sched_switch"], "pid": [100, 100],
                           "ts": [T0 + 18 * us, T0 + 19 * us]})
    migrations = pd.DataFrame({"pid": [100], "ts": [T0 + 58 * us]})
    return req.df_requests(d, runs, migrations, events, None, T0, T0 + 1_000_000_000, 0)


def test_requests_are_joined_with_the_trace(small):
    REQUESTS.check(small)
    r = small.set_index("id")
    assert r.loc[0, "pids"] == "100" and r.loc[0, "cpus"] == "0,1"
    assert r.loc[0, "migrations"] == 1
    # woken at 18 us, on a CPU at 20; preempted at 50, back at 60
    assert r.loc[0, "wait_ns"] == 2000 + 10000
    assert r.loc[0, "latency_ns"] == 90000 and r.loc[0, "start"] == T0 + 20000
    assert (r.loc[1, "cpus"], r.loc[1, "migrations"], r.loc[1, "wait_ns"]) == ("1", 0, 0)
    assert not r.loc[2, "answered"] and np.isnan(r.loc[2, "latency_ns"])
    assert (r.loc[2, "start"], r.loc[2, "done"], r.loc[2, "pids"]) == (-1, -1, "")
    assert small.attrs["overloaded"] is False


def test_what_a_task_meets_after_the_client_read_the_answer_is_not_the_requests(tmp_path):
    """The pool's reader takes a request in (pid 300), a stage works on it (pid 301), the reader
    sends the answer; the client reads it at 100 us while the reader's answer record ends at
    140 us (a slow sendall in a TCG guest). The reader's migrations at 95 us (its answer stage,
    before the answer was read) counts; its migration at 120 us, after, does not; nor do its
    wait and CPU after 100 us."""
    d = tmp_path / "requests"
    d.mkdir()
    us = 1000
    _write(d / serve.SENT_FILE, [(0, 0, T0, T0 + 1 * us, 0, 20 * us)])
    _write(d / serve.DONE_FILE, [(0, 0, T0, T0 + 1 * us, T0 + 100 * us, 20 * us)])
    _write(d / ("reader" + serve.STAGE_SUFFIX), [(0, 0, 300, T0 + 2 * us, T0 + 5 * us, 0),
                                                 (0, serve.ANSWER, 300, T0 + 90 * us,
                                                  T0 + 140 * us, 0)])
    _write(d / ("s1w1" + serve.STAGE_SUFFIX), [(0, 1, 301, T0 + 10 * us, T0 + 60 * us, 0)])
    runs = pd.DataFrame({"pid": [300, 300, 300, 301], "cpu": [0, 0, 1, 2],
                         "start": [T0, T0 + 90 * us, T0 + 125 * us, T0 + 10 * us],
                         "end": [T0 + 6 * us, T0 + 110 * us, T0 + 145 * us, T0 + 60 * us],
                         "end_state": [1, 0, 1, 1]})
    events = pd.DataFrame({"event": ["sched_wakeup", "sched_wakeup"], "pid": [300, 301],
                           "ts": [T0 + 85 * us, T0 + 8 * us]})
    migrations = pd.DataFrame({"pid": [300, 300], "ts": [T0 + 95 * us, T0 + 120 * us]})
    r = req.df_requests(d, runs, migrations, events, None, T0, T0 + 1_000_000_000, 0).iloc[0]
    assert r["pids"] == "300,301,300" and r["done"] == T0 + 100 * us
    assert r["migrations"] == 1
    # woken at 85 us, on a CPU at 90; preempted at 110, back at 125: after the answer was read
    assert r["wait_ns"] == 5 * us
    assert r["cpus"] == "0,2"


def test_request_metrics_by_hand(small):
    m = req.request_metrics(small, T0, T0 + 1_000_000_000)
    assert (m["requests"], m["unanswered"]) == (3, 1)
    assert m["throughput_rps"] == 2.0
    assert m["latency_p50_ms"] == 0.2               # 90, 200 us and one unanswered: the 2nd
    assert m["latency_p90_ms"] is None
    assert m["jain_answered"] == 1.0                # one answered on each connection
    assert m["jain_latency"] == pytest.approx(290 ** 2 / (2 * (90 ** 2 + 200 ** 2)))
    assert m["service_inversion"] == 0.0            # the smaller was the faster
    assert m["p99_met_migration"] == 0.0 and m["p99_waited"] == 0.0   # the 200 us one: pid 101
    assert m["all_met_migration"] == 0.5
    assert m["all_waited"] == 0.5                   # 12 us >= RQ_WAIT_MIN_NS
    assert m["client_lag_p99_ms"] == 0.001


def test_a_wait_of_the_wake_up_path_alone_is_not_a_run_queue_wait(small):
    short = small.assign(wait_ns=np.where(small["id"] == 0, RQ_WAIT_MIN_NS - 1, 0))
    assert req.request_metrics(short, T0, T0 + 1_000_000_000)["all_waited"] == 0.0


def test_the_client_saying_it_stopped_sending_is_kept(tmp_path, small):
    d = tmp_path / "requests"
    with open(d / serve.SENT_FILE, "ab") as f:
        f.write(serve.REC.pack(serve.OVERLOAD, 2001, T0 + 600_000_000, 0, 0, 0))
    df = req.df_requests(d, pd.DataFrame({"pid": [], "cpu": [], "start": [], "end": [],
                                          "end_state": []}),
                         pd.DataFrame({"pid": [], "ts": []}),
                         pd.DataFrame({"event": [], "pid": [], "ts": []}),
                         None, T0, T0 + 1_000_000_000, 0)
    assert df.attrs["overloaded"] is True and df.attrs["overload_t"] == 0.6
    assert len(df) == 3


def test_burstiness_is_weighted_by_time():
    # two CPUs: 1 + 0 runnable for 600 ns, 2 + 2 for 300 ns, 1 + 1 for 100 ns
    rq = pd.DataFrame({"ts": [T0, T0, T0 + 600, T0 + 600, T0 + 900, T0 + 900],
                       "cpu": [0, 1, 0, 1, 0, 1], "nr": [1, 0, 2, 2, 1, 1]})
    b = req.burstiness(rq, [0, 1], T0, T0 + 1000)
    assert b["runnable_mean"] == pytest.approx((1 * 600 + 4 * 300 + 2 * 100) / 1000)
    assert b["runnable_p99"] == 4.0
    assert b["queued_frac"] == pytest.approx(0.3)


@pytest.mark.parametrize("overrides, says", [
    ({"load": "1"}, "cannot keep up"),
    ({"load": "1.5"}, "cannot keep up"),
    ({"load": "0"}, "must be in (0, 1)"),
    ({"shape": "fork-bomb"}, "must be one of"),
    ({"shape": "thread-per-core", "conns": "1"}, "conns >= 2"),
    ({"sizes": "pareto", "alpha": "1"}, "no mean"),
    ({"sizes": "zipf"}, "must be one of"),
    ({"drain_s": "3"}, "leaves nothing"),
    ({"conns": "1000"}, "at most"),
    ({"policy": "deadline", "dl_runtime_ms": "1", "dl_period_ms": "10"}, "block on sockets"),
])
def test_impossible_parameters_are_one_line(overrides, says):
    with pytest.raises(ParameterError) as err:
        get_experiment("server").resolve(overrides, [0, 1])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_load_of_one_exits_2_before_anything_starts(tmp_path):
    out = tmp_path / "srv"
    p = cli("run", "server", "-p", "load=1", "--out", out, check_busy=False)
    assert p.returncode == 2 and "cannot keep up" in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("harmony: error: parameter load")
    assert not out.exists()


@pytest.mark.parametrize("shape, roles", [
    ("thread-per-connection", {"server": 8, "client": 1}),
    ("pool-per-stage", {"server": 1 + 2 * 2, "client": 1}),
    ("event-loop", {"server": 1, "client": 1}),
    ("thread-per-core", {"server": 2, "client": 1}),
])
def test_each_shape_has_its_tasks(tmp_path, shape, roles):
    exp = get_experiment("server")
    p = exp.resolve({"shape": shape, "rate": "100", "overhead_ns": "20000"}, [0, 1])
    specs, settled = exp.place(exp.tasks(p, [0, 1]), tmp_path, p, [0, 1])
    assert settled == {}                # rate and overhead given: nothing measured
    got = {}
    for s in specs:
        got[s.role] = got.get(s.role, 0) + 1
        part = json.loads(s.serve)
        assert part["records"] == str(tmp_path / "raw" / "requests") and part["token"]
    assert got == roles
    assert all(len(s.comm) <= 15 for s in specs)
    client = json.loads(specs[-1].serve)
    assert client["kind"] == "client" and len(client["targets"]) == p["conns"]
    if shape == "thread-per-core":
        assert [s.pinned for s in specs] == [True, True, False]
        assert [s.initial_cpu for s in specs[:2]] == [0, 1]
    if shape == "pool-per-stage":
        fifos = sorted(x.name for x in (tmp_path / "raw" / "requests").iterdir())
        assert fifos == ["answers.fifo", "stage1.fifo", "stage2.fifo"]


def test_capacity_is_the_tightest_bound():
    exp = get_experiment("server")
    p = exp.resolve({"overhead_ns": "10000", "work_us": "200", "rate": "1"}, [0, 1])
    # 2 CPUs over 200 us of work and two touches of 10 us each
    assert serve.capacity(p, 2) == pytest.approx(2e9 / 220_000)
    loop = {**p, "shape": "event-loop"}
    assert serve.capacity(loop, 2) == pytest.approx(1e9 / 210_000)    # one task serves all
    slow = {**p, "block_us": 1000.0, "conns": 2}
    assert serve.capacity(slow, 2) == pytest.approx(2e9 / 1_210_000)   # two sleepy connections


def _burn(ns):
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass


def _fork(spec, cells) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            serve.prepare(spec.serve, _burn, 7)(cells)
        finally:
            os._exit(3)
    return pid


@pytest.mark.parametrize("shape", ["thread-per-connection", "pool-per-stage", "event-loop",
                                   "thread-per-core"])
def test_the_parts_serve_real_requests(tmp_path, shape):
    """The parts of each shape forked here (no controller, no trace), at a rate small enough to
    cost nothing: every request answered in order of its stamps, by the tasks of its shape."""
    exp = get_experiment("server")
    p = exp.resolve({"shape": shape, "rate": "300", "overhead_ns": "20000", "work_us": "20",
                     "conns": "4", "block_us": "50"}, [0, 1])
    specs, _ = exp.place(exp.tasks(p, [0, 1]), tmp_path, p, [0, 1])
    buf = mmap.mmap(-1, 8)
    cells = memoryview(buf).cast("q")
    pids = []
    try:
        pids = [_fork(s, cells) for s in specs[:-1]]          # the servers listen before...
        time.sleep(0.2)
        cells[0] = serve.mono()
        pids.append(_fork(specs[-1], cells))                  # ...the client connects
        time.sleep(0.5)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
    empty = pd.DataFrame({"pid": [], "cpu": [], "start": [], "end": [], "end_state": []})
    df = req.df_requests(tmp_path / "raw" / "requests", empty, pd.DataFrame({"pid": [], "ts": []}),
                         pd.DataFrame({"event": [], "pid": [], "ts": []}), None, int(cells[0]),
                         serve.mono(), 0)
    ans = df[df["answered"]]
    # (in flight when killed, or late on a busy host: some may be unanswered)
    assert len(ans) >= 20 and len(ans) >= len(df) / 2, (len(ans), len(df))
    assert (ans["arrival"] <= ans["sent"]).all() and (ans["sent"] <= ans["start"]).all()
    assert (ans["start"] < ans["end"]).all() and (ans["end"] <= ans["done"]).all()
    assert (ans["end"] - ans["start"] >= 50_000).all()          # each work stage slept block_us
    servers = [set(map(int, s.split(","))) for s in ans["pids"]]
    assert set().union(*servers) <= set(pids[:-1])
    hops = {"thread-per-connection": 1, "pool-per-stage": 4, "event-loop": 1, "thread-per-core": 1}
    assert {len(s.split(",")) for s in ans["pids"]} == {hops[shape]}
    assert sorted(ans["conn"].unique()) == [0, 1, 2, 3]


def test_request_sizes_have_the_mean_asked():
    n, mean = 200_000, 200_000
    for kind, tol in (("exp", 0.01), ("pareto", 0.05)):
        draw = serve.sizes({"work_ns": mean, "sizes": kind, "alpha": 2.5}, random.Random(1))
        x = np.array([draw() for _ in range(n)])
        assert abs(x.mean() / mean - 1) < tol, kind
    pareto = serve.sizes({"work_ns": mean, "sizes": "pareto", "alpha": 1.5}, random.Random(1))
    x = np.array([pareto() for _ in range(n)])
    assert x.min() >= mean / 3 - 1 and np.quantile(x, 0.999) > 20 * mean      # heavy-tailed
    fixed = serve.sizes({"work_ns": mean, "sizes": "fixed"}, random.Random(1))
    assert {fixed() for _ in range(10)} == {mean}


def test_server_placement_by_hand():
    tasks = pd.DataFrame({"pid": [100, 101, 102], "role": ["server", "server", "client"]})
    runs = pd.DataFrame({"pid": [100, 101, 101, 102], "cpu": [0, 0, 1, 1],
                         "start": [T0 - 500, T0, T0 + 600, T0],
                         "end": [T0 + 300, T0 + 200, T0 + 900, T0 + 1000],
                         "end_state": [0, 1, 1, 1]})
    migrations = pd.DataFrame({"pid": [101, 102, 100], "ts": [T0 + 500, T0 + 500, T0 - 10]})
    got = req.server_placement(runs, migrations, tasks, [0, 1], T0, T0 + 1_000_000_000)
    assert got["server_migrations_per_task_s"] == 0.5     # one in the window, two servers, 1 s
    assert got["server_cpu_jain"] == pytest.approx(800 ** 2 / (2 * (500 ** 2 + 300 ** 2)))
    idle = req.server_placement(runs[runs["pid"] == 102], migrations, tasks, [0, 1], T0, T0 + 10)
    assert idle["server_cpu_jain"] is None


@pytest.mark.parametrize("served", [True, False], ids=["fork-server", "own-processes"])
def test_the_overhead_calibration_leaves_no_process(served, monkeypatch):
    """Its pairs forked by the fork server (or, without one, started as processes of their own),
    and every one of them and their echoes reaped: the server has no child left."""
    forkserver.shutdown()
    if not served:
        monkeypatch.setenv(forkserver.ENV, "0")

    def children(pid):
        return {int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                for c in (t / "children").read_text().split()}

    before = children(os.getpid())
    assert 0 < serve.measure_overhead([0, 1], 200) < 1_000_000  # a hop costs some us, not a ms
    server = forkserver._server
    assert (server is not None) == served
    assert children(os.getpid()) - before <= ({server.pid} if served else set())
    if served:
        assert children(server.pid) == set()


def test_the_calibration_runs_every_cpu_at_once_both_ways_and_takes_the_dearer(monkeypatch):
    """Pairs across two CPUs (the first and second, the third and fourth...) and one within each
    CPU, each way's pairs at once; the dearer way's mean (a switch is the dearer in a TCG guest,
    a wake-up of another CPU on a host's own CPUs)."""
    calls = []

    def at_once(pairs, rounds):
        calls.append(pairs)
        return [5000 if a == b else 3000 + 1000 * a for a, b in pairs]

    monkeypatch.setattr(serve, "_calibrate_at_once", at_once)
    assert serve.measure_overhead([0, 1, 2, 3, 4]) == 5000
    assert calls == [[[0, 1], [2, 3]], [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4]]]
    calls.clear()
    monkeypatch.setattr(serve, "_calibrate_at_once", lambda pairs, rounds: [
        9000 if a != b else 1000 for a, b in pairs])
    assert serve.measure_overhead([0, 1]) == 9000
    assert serve.measure_overhead([3]) == 1000          # one CPU: within it only


@pytest.mark.parametrize("served", [True, False], ids=["fork-server", "own-processes"])
def test_a_calibration_that_fails_is_one_error_and_leaves_no_process(served, monkeypatch):
    forkserver.shutdown()
    if not served:
        monkeypatch.setenv(forkserver.ENV, "0")
    before = set(Path("/proc/self/task/%d/children" % os.getpid()).read_text().split())
    with pytest.raises(ControllerError, match="^the server's calibration failed: "):
        serve.measure_overhead([0, os.cpu_count() + 7], 50)      # a CPU that does not exist
    server = forkserver._server
    after = set(Path("/proc/self/task/%d/children" % os.getpid()).read_text().split())
    assert after - before <= ({str(server.pid)} if served and server else set())
    if served:
        assert Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split() == []


def _evidence(shape, load, **summary):
    base = {"latency_p50_ms": 0.5, "latency_p99_ms": 4.0, "latency_p999_ms": 8.0,
            "p99_met_migration": 0.1, "p99_waited": 0.9, "server_migrations_per_task_s": 50.0,
            "server_cpu_jain": 0.99, "overloaded": False}
    return Evidence(Path("/x"), "server", {"shape": shape, "load": load}, 2, base | summary)


def test_the_server_card_votes_per_shape():
    ev = [_evidence("thread-per-connection", 0.5), _evidence("thread-per-connection", 0.8,
                                                             latency_p99_ms=9.0),
          _evidence("pool-per-stage", 0.5, server_cpu_jain=0.95),
          _evidence("pool-per-stage", 0.5, server_cpu_jain=0.6),
          _evidence("event-loop", 0.5, server_migrations_per_task_s=0.2, overloaded=True),
          _evidence("thread-per-core", 0.5),
          Evidence(Path("/y"), "single-source", {}, 2, {})]
    got = {a["shape"]: a for a in server_card.answers(ev)}
    assert got["thread-per-connection"]["label"] == "moves"
    assert got["thread-per-connection"]["loads"][0.8]["latency_p99_ms"] == 9.0
    assert got["pool-per-stage"]["label"] == "undecided"
    assert got["pool-per-stage"]["votes"] == {"spread": 1, "packed": 1}
    assert got["event-loop"]["label"] == "keeps" \
        and got["event-loop"]["loads"][0.5]["overloaded"] == 1
    assert got["thread-per-core"]["label"] is None
    text = "\n".join(server_card.section_lines(ev))
    assert "pool-per-stage: spreads a stage's pool over the CPUs?  undecided " \
           "(spread in 1, packed in 1)" in text
    assert "OVERLOADED in 1" in text and "SERVER_KEEPS_MAX_PER_TASK_S = 1.0" in text
    assert server_card.section_lines(ev[-1:]) == []


def test_a_run_planned_for_a_vm_is_placed_and_measured_in_the_guest(tmp_path):
    """The host plans a server run for the guest agent without measuring anything (its overhead
    would not be the guest's); the agent's place() makes the pipes, measures the overhead where
    it runs and settles the client's rate from it, through the job file's round trip."""
    exp = get_experiment("server")
    p = exp.resolve({"shape": "pool-per-stage", "load": "0.5"}, [0, 1])
    planned = PlannedRun.of(exp, p, [0, 1], tmp_path / "run", "tracefs", 1)
    assert planned.params["overhead_ns"] == 0 and planned.params["rate"] == 0
    write_job(tmp_path / "job.json", [planned])
    agent = PlannedExperiment(read_job(tmp_path / "job.json")[0])
    specs, settled = agent.place(agent.tasks(planned.params, [0, 1]), tmp_path / "run",
                                 planned.params, [0, 1])
    assert settled["overhead_ns"] > 0
    assert settled["rate"] == pytest.approx(
        0.5 * serve.capacity({**planned.params, **settled}, 2), abs=0.1)
    assert json.loads(specs[-1].serve)["rate"] == settled["rate"]          # the client's
    assert not any("rate" in json.loads(s.serve) for s in specs[:-1])     # the client's only
    # the pipes and records in a directory of the guest's own: the run directory is shared over
    # 9p; the records join the run once the tasks are stopped, and the directory goes
    parts = [json.loads(s.serve) for s in specs]
    pipes = [Path(x) for x in parts[0]["pipes"]]
    scratch = pipes[0].parent
    try:
        assert sorted(x.name for x in pipes) == ["answers.fifo", "stage1.fifo", "stage2.fifo"]
        assert all(x.is_fifo() for x in pipes) and scratch.name.startswith("hmy-serve-")
        assert {Path(p["records"]) for p in parts} == {scratch} and Path(agent.scratch) == scratch
        (scratch / "client.sent").write_bytes(serve.REC.pack(0, 1, 2, 3, 0, 5))
        (scratch / "reader.stage").write_bytes(b"")
        agent.keep(tmp_path / "run")
        got = tmp_path / "run" / "raw" / serve.RECORDS_DIR
        assert sorted(x.name for x in got.iterdir()) == ["client.sent", "reader.stage"]
        assert (got / "client.sent").read_bytes() == serve.REC.pack(0, 1, 2, 3, 0, 5)
        assert not scratch.exists() and agent.scratch is None
        agent.keep(tmp_path / "run")            # once only: nothing more to move
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # a workload without servers is the agent's as planned
    other = get_experiment("single-source")
    q = other.resolve({}, [0, 1])
    plain = PlannedExperiment(PlannedRun.of(other, q, [0, 1], tmp_path / "ss", "tracefs", 1))
    tasks = plain.tasks(q, [0, 1])
    assert plain.place(tasks, tmp_path / "ss", q, [0, 1]) == (tasks, {})


def test_an_address_taken_is_one_error_before_any_task_starts(tmp_path, monkeypatch):
    """Abstract AF_UNIX addresses with a fresh token: no port to run out of, but a process may
    hold the address a run would listen on; the placement says so before any task starts."""
    exp = get_experiment("server")
    p = exp.resolve({"shape": "event-loop", "rate": "100", "overhead_ns": "20000"}, [0, 1])
    monkeypatch.setattr(serve.secrets, "token_hex", lambda n: "0" * (2 * n))
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        held.bind(serve.address(f"{os.getpid():x}-00000000", "l0"))
        with pytest.raises(ControllerError, match=r"^the server's address @hmy-.*-l0 is taken "
                                                  r"\(Address already in use\)"):
            exp.place(exp.tasks(p, [0, 1]), tmp_path, p, [0, 1])
    finally:
        held.close()
    specs, _ = exp.place(exp.tasks(p, [0, 1]), tmp_path, p, [0, 1])     # free again
    assert json.loads(specs[0].serve)["token"].endswith("-00000000")
