"""Commands of a matrix: ``matrix`` (a plan of cells, on this host or on a Dask cluster) and
``worker`` (a Dask worker on a measuring host).

The plan and its cells are :mod:`harmony.matrix`; the cluster is :mod:`harmony.matrix_dask`
(Dask distributed, the optional extra ``matrix``, imported only with --cluster or worker).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harmony.cli.common import (
    build_kernels_first,
    check_out,
    default_out,
    echo,
    exit_on_error,
    fail,
    json_option,
    plural,
    print_json,
    quiet_option,
    warn,
)


@click.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="the matrix directory (default runs/matrix-<name>-<time>)")
@click.option("--cluster", metavar="tcp://HOST:8786",
              help="run the cells on the Dask scheduler at this address (its workers: "
                   "`harmony worker ADDRESS`, one cell per host at a time); default: on this "
                   "host, one after another")
@click.option("--shared-dir", type=click.Path(path_type=Path), metavar="DIR",
              help="with --cluster: a directory this machine and every worker see at this path "
                   "(NFS, ...): the cells' archives come home through it (checksummed) rather "
                   "than through Dask's connections")
@click.option("--resume", is_flag=True,
              help="take up the matrix in --out made from this plan: its complete cells are "
                   "kept, the cells left interrupted, failed or incomplete resumed (their "
                   "complete runs kept), the others run")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS", help="with --cluster: how long to try to "
                                                         "reach the scheduler")
@click.option("--wait-host", type=click.FloatRange(min=0), default=1800.0, show_default=True,
              metavar="SECONDS",
              help="with --cluster: how long a cell waits for a host that can run it and is "
                   "free (another Harmony run holding it, no worker able to take it); past it "
                   "the cell fails with the reason (--resume runs it again)")
@click.option("--lost-after", type=click.FloatRange(min=1), default=30.0, show_default=True,
              metavar="SECONDS",
              help="with --cluster: a scheduler that does not answer this long is lost (a "
                   "network cut): one line, the cells not collected listed, --resume goes on")
@quiet_option
@json_option("the end summary (each cell's state, the failures, the report's files)")
def matrix(plan_path, out, cluster, shared_dir, resume, connect_timeout, wait_host, lost_after,
           quiet, as_json):
    """Run a matrix of cells: kernels x schedulers x topologies x a suite (or some experiments)
    x repetitions, each cell what one boot or one host suite runs, as the TOML PLAN says
    (docs/matrix.md; examples/matrix-*.toml). The plan is checked whole before anything starts;
    the cells' directories, report.md and report.json (the cards side by side) land in --out."""
    from harmony import matrix as mx

    with exit_on_error():
        plan = mx.load_plan(plan_path)
    if resume and out is None:
        raise click.UsageError("--resume takes up the matrix in --out: give --out DIR")
    out = out or default_out(f"matrix-{plan.name}")
    check_out(out)
    if shared_dir is not None and cluster is None:
        raise click.UsageError("--shared-dir goes with --cluster (the workers write there)")
    if cluster is not None:
        from harmony.matrix_dask import check_shared, require_distributed

        with exit_on_error():
            require_distributed()
            if shared_dir is not None:
                shared_dir = check_shared(shared_dir)
    if cluster is None:
        build_kernels_first()      # before the first cell: its analysis needs them
    marked = f"{out} holds the cells finished so far (`harmony matrix {plan_path} --out {out} " \
             "--resume` goes on)"
    with exit_on_error(marked=marked, also=(OSError,)):
        if cluster is None:
            record = mx.run_local(plan, out, resume=resume, quiet=quiet)
        else:
            from harmony.matrix_dask import ClusterError, run_cluster

            try:
                record = run_cluster(plan, out, cluster, resume=resume, quiet=quiet,
                                     timeout=connect_timeout, shared=shared_dir,
                                     wait_host=wait_host, lost_after=lost_after)
            except ClusterError as exc:     # lost mid-matrix: what it holds, and what to do
                if not (out / mx.MATRIX_FILE).is_file():
                    raise
                raise ClusterError(f"{exc}; {marked}") from None
    _say(record, out, as_json)


def _say(record: dict, out: Path, as_json: bool = False) -> None:
    """The matrix's report written, and what the cells came to (``as_json``: as JSON on stdout,
    the warnings and the error still on stderr)."""
    from harmony.matrix_report import write_report

    with exit_on_error(also=(OSError,)):
        paths = write_report(out)
    states = record["cells_state"]
    ok = sum(1 for s in states.values() if s == "complete")
    if as_json:
        print_json({"out": str(out), "status": record.get("status"), "cells": len(states),
                    "complete": ok, "cells_state": states, "failures": record["failures"],
                    "report": [str(p) for p in paths]})
    else:
        echo(f"{ok} of {plural(len(states), 'cell')} complete; report: "
             + " and ".join(map(str, paths)))
    for cell, state in states.items():
        if state == "incomplete":
            warn(f"cell {cell}: some of its runs are not complete (see its suite.json)")
    for f in record["failures"]:
        echo(f"failed: cell {f['cell']}: {f['error']}", err=True)
    if ok < len(states):
        fail(f"{plural(len(states) - ok, 'cell')} not complete; `harmony matrix PLAN --out "
             f"{out} --resume` runs the missing ones again")


@click.command()
@click.argument("address", metavar="tcp://HOST:8786")
@click.option("--name", help="the worker's name in the cluster (default: Dask's)")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS",
              help="how long to try to reach the scheduler")
@quiet_option
def worker(address, name, connect_timeout, quiet):
    """A Dask worker on this measuring host for `harmony matrix --cluster`: one thread and the
    resource host=1 (one cell at a time), and measure=1 where `harmony doctor` says experiments
    can run here; where they cannot (not root, ...) it says why in one line and runs simulated
    cells only, leaving real cells to other workers. Its doctor facts go with each cell's
    results. Stops on Ctrl-C or SIGTERM (its running cell stopped and cleaned up first)."""
    from harmony.matrix_dask import start_worker

    if not quiet:
        echo(f"worker: checking this host, then serving {address}", err=True)
    build_kernels_first()          # before it takes a cell: the cells' analysis needs them
    try:
        with exit_on_error():
            start_worker(address, name=name, timeout=connect_timeout, quiet=quiet)
    except KeyboardInterrupt:
        sys.exit(130)
