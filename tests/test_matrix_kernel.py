"""A real host cell of a matrix through a one-worker Dask cluster (issue 47, item 6): the cell
runs on the worker (its own process, the host's doctor facts with it), comes home whole, and its
run's migrations and switches agree with the kernel's own counters for every task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import host_skip
from measured import assert_counted_by_the_kernel
from test_matrix import descendants, start_scheduler, stop_all

import harmony
from harmony import matrix, store

ROOT = Path(__file__).resolve().parent.parent

#: one single-source run of 2 s on every CPU of this host: the shortest real cell
PLAN = """
name = "host"
experiments = ["single-source"]
repeat = 1
[params]
duration = 2.0
[[matrix]]
kernels = ["host"]
schedulers = ["default"]
topologies = ["all"]
"""


def test_a_real_host_cell_runs_through_a_one_worker_cluster(kernel, tmp_path):
    try:
        import distributed
    except ImportError as exc:
        host_skip(f"Dask distributed is not installed ({exc}): pip install '.[matrix]'")
    from harmony.matrix_dask import run_cluster

    plan = matrix.parse_plan(tomllib.loads(PLAN))
    (cell,) = plan.cells
    out = tmp_path / "m"
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  resources={"host": 1, "measure": 1},
                                  dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        record = run_cluster(plan, out, None, quiet=True, client=client)
    if record["failures"] and "busy" in record["failures"][0]["error"]:
        host_skip(f"the host was busy: {record['failures'][0]['error']}")
    assert record["status"] == "complete", record["failures"]
    d = out / "cells" / cell.id
    rec = store.read_json(d / "cell.json")
    assert rec["status"] == "complete" and rec["runs"] == 1
    assert rec["host"]["pid"] != os.getpid()            # run by the worker's child
    assert rec["host"]["doctor"]["verdict"]["can_run"]  # the host's doctor facts came with it
    run = harmony.load(d / "single-source" / "rep-01")
    assert run.manifest["status"] == "complete"
    assert_counted_by_the_kernel(run)     # every task: its moves as the kernel counted them
    left = subprocess.run(["pgrep", "-f", "harmony.matrix --cell"], capture_output=True)
    assert not left.stdout, "the cell's process was left running"


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_worker_losing_its_scheduler_leaves_nothing_running(kernel, tmp_path, how):
    """`harmony worker` (its own doctor check) runs a real host cell; its scheduler then stops
    answering (SIGSTOP: the network cut) or dies: the submitter says so in one line naming it, and
    the worker stops its cell, which cleans up as a stopped run does: no process of the cell under
    the worker, no tracing instance it made, no orphaned workload."""
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        host_skip(f"Dask distributed is not installed ({exc}): pip install '.[matrix]'")
    from harmony.hygiene import orphans

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace("duration = 2.0", "duration = 30.0"))
    sched, address = start_scheduler(tmp_path)
    procs = [sched]
    instances = kernel / "instances"
    before = set(os.listdir(instances)) if instances.is_dir() else set()
    try:
        with open(tmp_path / "worker.err", "w") as werr:
            worker = subprocess.Popen([sys.executable, "-m", "harmony.cli", "worker", address,
                                       "--name", "real", "--connect-timeout", "5"],
                                      stdout=subprocess.DEVNULL, stderr=werr, env=env)
        procs.append(worker)
        out = tmp_path / "m"
        run = subprocess.Popen([sys.executable, "-m", "harmony.cli", "matrix", str(plan),
                                "--out", str(out), "--cluster", address, "-q", "--lost-after",
                                "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
        procs.append(run)
        # the cell's workload running under the worker (its processes named hmy-*)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None and not any(
                _comm(p).startswith("hmy-") for p in descendants(worker.pid)):
            time.sleep(0.2)
        assert run.poll() is None, run.communicate()
        if not any(_comm(p).startswith("hmy-") for p in descendants(worker.pid)):
            pytest.fail("the cell's workload was not seen running")
        os.kill(sched.pid, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        _, err = run.communicate(timeout=120)
        lines = err.strip().splitlines()
        if "busy" in err:
            host_skip(f"the host was busy: {err.strip()}")
        assert run.returncode == 1 and len(lines) == 1, err
        assert f"lost the Dask scheduler at {address}" in lines[0]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and descendants(worker.pid):
            time.sleep(0.2)
        assert not descendants(worker.pid), "the worker left its cell's processes running"
        assert not orphans(), "a workload process was left behind"
        left = (set(os.listdir(instances)) if instances.is_dir() else set()) - before
        assert not left, f"tracing instances left behind: {left}"
    finally:
        stop_all(procs, wait_s=60)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
