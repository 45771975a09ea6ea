"""The matrix's cluster path against its local path, on simulated cells (issue 47).

One plan of N simulated cells (N reference policies x one flat machine, single-source of 1 s,
1 run each) run three ways, each into a fresh directory: locally (cells one after another in this
process), through a Dask LocalCluster of one worker process, and of two. The cluster's start is
not counted (a cluster is up before a matrix is submitted). Prints each way's wall time per cell,
the cluster's overhead per cell against the local path, cells per hour and the speed-up of two
workers over one.

    flock /tmp/harmony-measure.lock python3 bench/matrix.py [--cells 4] [--json FILE]

``--host N`` (root): one real host cell instead (single-source of 2 s on every CPU, 1 run), run
N times locally and N times through a LocalCluster of one worker (started once, not counted),
alternating: each way's wall per cell, the cell's own wall inside (cell.json's wall_s), and the
cluster path's overhead per cell (medians).

    flock /tmp/harmony-measure.lock python3 bench/matrix.py --host 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit_json, table  # noqa: E402

POLICIES = ("global-queue", "poly-balance", "pairwise-random", "coin-flip", "flat",
            "hierarchical", "scx-like")


def plan_text(n: int) -> str:
    names = ", ".join(f'"{p}"' for p in POLICIES[:n])
    return (f'name = "bench"\nexperiments = ["single-source"]\nrepeat = 1\n[params]\n'
            f'duration = 1.0\n[[matrix]]\nkernels = ["simulated"]\nschedulers = [{names}]\n'
            f'topologies = [2]\n')


def run_local(plan, out: Path) -> float:
    from harmony import matrix
    t = time.monotonic()
    rec = matrix.run_local(plan, out, quiet=True)
    assert rec["status"] == "complete", rec["failures"]
    return time.monotonic() - t


def run_dask(plan, out: Path, workers: int) -> float:
    import distributed

    from harmony.matrix_dask import run_cluster
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                  resources={"host": 1}, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        t = time.monotonic()
        rec = run_cluster(plan, out, None, quiet=True, client=client)
        wall = time.monotonic() - t
    assert rec["status"] == "complete", rec["failures"]
    return wall


HOST_PLAN = ('name = "bench-host"\nexperiments = ["single-source"]\nrepeat = 1\n[params]\n'
             'duration = 2.0\n[[matrix]]\nkernels = ["host"]\nschedulers = ["default"]\n'
             'topologies = ["all"]\n')


def host_cell(reps: int, json_path: str | None) -> int:
    """One real host cell, ``reps`` times each way, alternating (local, then the cluster)."""
    import json
    import statistics

    import distributed

    from harmony import matrix
    from harmony.matrix_dask import run_cluster

    walls: dict[str, list[float]] = {"local": [], "dask, 1 worker": []}
    inside: dict[str, list[float]] = {"local": [], "dask, 1 worker": []}
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp, \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     resources={"host": 1, "measure": 1},  # a real cell's
                                     dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        (Path(tmp) / "plan.toml").write_text(HOST_PLAN)
        plan = matrix.load_plan(Path(tmp) / "plan.toml")
        for k in range(reps):
            for way in walls:
                out = Path(tmp) / f"{way[:5]}-{k}"
                t = time.monotonic()
                rec = (matrix.run_local(plan, out, quiet=True) if way == "local" else
                       run_cluster(plan, out, None, quiet=True, client=client))
                walls[way].append(time.monotonic() - t)
                assert rec["status"] == "complete", rec["failures"]
                cell = json.loads((out / "cells" / plan.cells[0].id / "cell.json").read_text())
                inside[way].append(cell["wall_s"])
    med = {w: statistics.median(v) for w, v in walls.items()}
    rows = [[way, " ".join(f"{x:.2f}" for x in walls[way]), round(med[way], 2),
             round(statistics.median(inside[way]), 2), round(med[way] - med["local"], 2)]
            for way in walls]
    table(["way", "walls s", "median s", "cell's own wall s (median)",
           "overhead s per cell vs local"], rows)
    emit_json(json_path, {"reps": reps, "walls_s": walls, "cell_wall_s": inside})
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=4, help=f"cells, 1-{len(POLICIES)}")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--host", type=int, metavar="N",
                    help="one real host cell N times each way instead (root)")
    args = ap.parse_args(argv)
    if args.host is not None:
        if args.host < 1:
            ap.error("--host: 1 or more")
        return host_cell(args.host, args.json)
    if not 1 <= args.cells <= len(POLICIES):
        ap.error(f"--cells: 1 to {len(POLICIES)}")
    from harmony import matrix

    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        plan_path = Path(tmp) / "plan.toml"
        plan_path.write_text(plan_text(args.cells))
        plan = matrix.load_plan(plan_path)
        walls = {"local": run_local(plan, Path(tmp) / "local"),
                 "dask, 1 worker": run_dask(plan, Path(tmp) / "d1", 1),
                 "dask, 2 workers": run_dask(plan, Path(tmp) / "d2", 2)}
    n = args.cells
    rows = [[way, round(w, 2), round(w / n, 2), round(3600 * n / w),
             round((w - walls["local"]) / n, 2)] for way, w in walls.items()]
    table(["way", "wall s", "s per cell", "cells per hour", "overhead s per cell vs local"],
          rows)
    speedup = walls["dask, 1 worker"] / walls["dask, 2 workers"]
    print(f"two workers over one: x{speedup:.2f} ({n} cells)")
    emit_json(args.json, {"cells": n, "walls_s": walls, "speedup_2_over_1": speedup})
    return 0


if __name__ == "__main__":
    sys.exit(main())
