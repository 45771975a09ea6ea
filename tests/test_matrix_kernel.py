"""A real host cell of a matrix through a one-worker Dask cluster (issue 47, item 6): the cell
runs on the worker (its own process, the host's doctor facts with it), comes home whole, and its
run's migrations and switches agree with the kernel's own counters for every task."""

from __future__ import annotations

import os
import subprocess
import tomllib

from conftest import host_skip
from measured import assert_counted_by_the_kernel

import harmony
from harmony import matrix, store

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
