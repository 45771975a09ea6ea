"""The server experiment on the real kernel, through the CLI: two shapes end to end (the requests
table joined with the trace, the summary, the figure), and nothing left running or listening
after a normal end or the controller killed; and the pool in a Debian 6.12 guest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import harmony
from harmony.analysis.policy import collect
from harmony.analysis.report_suite import server_blocks
from harmony.analysis.tables import REQUESTS
from harmony.experiments import get_experiment

from cli_run import HARMONY, cli
from conftest import host_skip, measure_quietly
from test_run_kernel import our_servers, our_workers, wait_for
from test_vm_kernel import VM_TOOLS, _qemu_pids


def listening() -> list[str]:
    """Abstract AF_UNIX sockets of server runs (``@hmy-...``) that exist now."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return [line.split()[-1] for line in lines if line.split()[-1].startswith("@hmy-")]


@pytest.fixture(scope="module")
def two_cpus(kernel):
    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs two CPUs")


SHAPES = ("thread-per-connection", "pool-per-stage")


@pytest.fixture(scope="module")
def server_runs(two_cpus, tmp_path_factory):
    """One 1.5 s run of each of two shapes at load 0.5 (shape -> run directory)."""
    base = tmp_path_factory.mktemp("server")

    def measure(shape):
        def once(k):
            out = base / f"{shape}-{k}"
            p = cli("run", "server", "-p", f"shape={shape}", "-p", "load=0.5", "--duration", 1.5,
                    "--cpus", "0-1", "--out", out, "-q")
            assert p.returncode == 0, p.stderr
            return out
        return once

    def busy(out):      # a run on a busy host is not evidence (the card leaves it out)
        foreign = harmony.load(out).manifest["foreign_load"]["max_frac"]
        return foreign > 0.05 and f"host was busy ({foreign:.0%} of a CPU used by other tasks)"

    return {shape: measure_quietly(measure(shape), busy) for shape in SHAPES}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_server_run_end_to_end(server_runs, shape):
    out = server_runs[shape]
    run = harmony.load(out)
    s, m = run.summary, run.manifest
    assert get_experiment("server").summary_problems(s) == []
    assert not s["overloaded"] and s["requests"] > 100
    assert s["latency_p50_ms"] is not None and s["latency_p50_ms"] <= s["latency_p99_ms"]
    # rate: load x the capacity measured at the start (recorded as parameters, to be replayed)
    assert m["params"]["overhead_ns"] > 0
    assert m["params"]["rate"] == pytest.approx(0.5 * s["capacity_rps"], rel=0.01)
    rq = run.requests
    REQUESTS.check(rq)
    assert "requests" in m["tables"]
    ans = rq[rq["answered"] & rq["measured"]]
    # every serving pid is a task of the run, and a request's CPUs come from the trace's runs
    tasks = run.tasks.set_index("pid")
    servers = {int(x) for s_ in ans["pids"] for x in s_.split(",")}
    assert servers <= set(tasks.index) and set(tasks.loc[list(servers), "role"]) == {"server"}
    assert (ans["cpus"] != "").mean() > 0.99
    assert {int(c) for c_ in ans["cpus"] for c in c_.split(",") if c} <= {0, 1}
    # stamps on the trace's clock: inside the window, in order
    assert m["probe_meta"]["clock"] == "mono"
    assert (ans["arrival"] >= m["t0_ns"]).all() and (ans["done"] <= m["end_ns"]).all()
    assert (ans["start"] >= ans["sent"]).all() and (ans["done"] >= ans["end"]).all()
    assert (out / "figures" / "latency.png").exists()
    assert not our_workers() and not listening()


def test_infer_and_the_suite_report_show_each_shape(server_runs, tmp_path):
    p = cli("infer", *server_runs.values())
    assert p.returncode == 0, p.stderr
    assert "server-shaped workloads (experiment server):" in p.stdout
    for shape in SHAPES:
        assert f"\n{shape}: " in p.stdout
    evidence, _ = collect(list(server_runs.values()))
    blocks = server_blocks(evidence, tmp_path)
    assert blocks[0].text == "Server-shaped workloads (experiment server)"
    assert blocks[-1].path.exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_nothing_left_after_the_controller_is_stopped(two_cpus, tmp_path, sig):
    """Killed, terminated or interrupted (Ctrl-C) while serving: no server task, no listening
    address left, the run not complete (the pipes are in its directory)."""
    out = tmp_path / "stopped"
    for _ in range(90):
        before = set(listening())
        proc = subprocess.Popen(HARMONY + ["run", "server", "-p", "shape=pool-per-stage",
                                           "--duration", "30", "--out", str(out), "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        up = wait_for(lambda: proc.poll() is not None or
                      (len(our_workers()) >= 5 and set(listening()) - before), timeout=30)
        if proc.poll() is None and up:
            break
        err = proc.communicate()[1]
        assert "another Harmony run" in err, err
        time.sleep(2)
    time.sleep(1.0)             # serving
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert wait_for(lambda: not our_workers() and not our_servers() and not listening(),
                    timeout=10), (our_workers(), listening())
    assert json.loads((out / "manifest.json").read_text())["status"] != "complete"
    assert cli("clean").returncode == 0


@pytest.mark.needs_tool(*VM_TOOLS)
def test_a_server_run_in_a_debian_6_12_guest_at_4_vcpus(kernel, tmp_path):
    """The guest agent places the server's tasks, its records and pipes in the guest's memory,
    and measures its capacity inside the VM with every vCPU busy; the pool (the shape whose
    reader once fell behind writing to the host's share, every answer lost) answers what it was
    offered, and the requests table joins the guest's trace: the migrations it counts are the
    guest's, of the tasks that served it, between its sending and its answer."""
    before = _qemu_pids()
    out = tmp_path / "vm"
    p = cli("run", "server", "--kernel", "debian:6.12", "--vm-cpus", "4", "-p",
            "shape=pool-per-stage", "-p", "load=0.5", "--duration", "2", "--out", out, "-q",
            timeout=900)
    assert p.returncode == 0, p.stderr
    run = harmony.load(out)
    m, s = run.manifest, run.summary
    assert m["under_test"]["kernel"].startswith("6.12.") and m["cpus"] == [0, 1, 2, 3]
    # measured in the guest, recorded among the parameters, the rate drawn from it
    assert m["params"]["overhead_ns"] > 0
    assert m["params"]["rate"] == pytest.approx(0.5 * s["capacity_rps"], rel=0.01)
    assert not s["overloaded"] and s["requests"] > 50 and s["latency_p99_ms"] is not None
    assert s["throughput_rps"] >= 0.9 * s["rate_rps"]
    rq = run.requests
    REQUESTS.check(rq)
    measured = rq[rq["measured"]]
    assert measured["answered"].mean() >= 0.9
    # the records were moved from the guest's memory into the run, nothing left beside them
    assert sorted(x.suffix for x in (out / "raw" / "requests").iterdir()) == \
        [".done", ".sent"] + [".stage"] * 9
    ans = rq[rq["answered"]]
    assert {int(c) for c_ in ans["cpus"] for c in c_.split(",") if c} <= {0, 1, 2, 3}
    met = ans[ans["migrations"] > 0]
    assert len(met) > 0
    mig = run.migrations
    for r in met.head(50).itertuples():
        pids = {int(x) for x in r.pids.split(",")}
        seen = mig[mig["pid"].isin(pids) & (mig["ts"] >= r.sent) & (mig["ts"] <= r.done)]
        assert 0 < r.migrations <= len(seen), r
    assert _qemu_pids() <= before and not listening()
