"""The matrix (issue 47): a plan checked whole, its cells run locally (resumable) and through a
Dask cluster of separate processes with the same cards, a worker killed mid-cell, a scheduler
that cannot be reached. Hermetic: every cell is simulated (harmony simulate's policies)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from conftest import host_skip, sigint_as_a_terminal

from harmony import matrix
from harmony.matrix_report import df_matrix_answers

ROOT = Path(__file__).resolve().parent.parent
HARMONY = [sys.executable, "-m", "harmony.cli"]

#: 2 policies x 1 machine of one short experiment: the smallest plan that has cells to compare
TINY = """
name = "tiny"
experiments = ["single-source"]
repeat = {repeat}
[params]
duration = {duration}
[[matrix]]
kernels = ["simulated"]
schedulers = ["poly-balance", "pairwise-random"]
topologies = [2]
"""


def _distributed():
    """Dask distributed (the [matrix] extra, in the [test] one too), or a host_skip."""
    try:
        import distributed
    except ImportError as exc:
        host_skip(f"Dask distributed is not installed ({exc}): pip install '.[matrix]'")
    return distributed


def plan_file(tmp_path: Path, duration: float = 1.0, repeat: int = 1) -> Path:
    p = tmp_path / "plan.toml"
    p.write_text(TINY.format(duration=duration, repeat=repeat))
    return p


def cards(out: Path) -> list[tuple]:
    df = df_matrix_answers(out)
    return sorted(df[["cell", "qid", "label", "state"]].itertuples(index=False, name=None))


# --- the plan -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["matrix-simulated.toml", "matrix-real.toml"])
def test_example_plans_parse(name):
    plan = matrix.load_plan(ROOT / "examples" / name)
    df = plan.df_cells()
    assert len(df) == 4 and df["cell"].is_unique
    if name == "matrix-simulated.toml":
        assert set(df["kind"]) == {"simulated"}
    else:
        assert list(df["kind"]) == ["host", "host", "vm", "vm"]


def test_a_bad_plan_is_refused_whole_one_line_per_bad_cell():
    bad = tomllib.loads("""
        repeatt = 3
        [[matrix]]
        kernels = ["simulated", "debian:5.0"]
        schedulers = ["poly-balance", "no-such-policy"]
        topologies = [4, "no-such-machine"]
        [[matrix]]
        kernels = ["host"]
        schedulers = ["class:nope", "default"]
        topologies = [2]
        [[matrix]]
        kernels = ["simulated"]
        schedulers = ["poly-balance"]
        topologies = [4]
    """)
    with pytest.raises(matrix.PlanError) as e:
        matrix.parse_plan(bad)
    lines = str(e.value).splitlines()[1:]
    assert any("unknown key 'repeatt'" in line for line in lines)
    assert any("simulated-no-such-policy-4" in line and "unknown reference policy" in line
               for line in lines)
    assert any("simulated-poly-balance-no-such-machine" in line for line in lines)
    assert sum("unknown kernel 'debian:5.0'" in line for line in lines) == 4
    assert any("host-class_nope-2" in line and "unknown scheduler" in line for line in lines)
    assert any("simulated-poly-balance-4: in groups 1 and 3" in line for line in lines)
    # every bad cell once, on its own line; the good ones not named
    assert not any("host-default-2" in line for line in lines)
    # the key, 3 simulated cells (policy x2, machine), 4 kernels, the class, the duplicate
    assert len(lines) == 1 + 3 + 4 + 1 + 1


def test_a_plan_that_is_not_toml_names_its_file(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("[[matrix]\nkernels = ")
    with pytest.raises(matrix.PlanError, match="broken.toml: not a TOML plan"):
        matrix.load_plan(p)
    r = subprocess.run(HARMONY + ["matrix", str(p), "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and not (tmp_path / "m").exists()
    assert r.stderr.count("\n") == 1 and "broken.toml: not a TOML plan" in r.stderr
    assert r.stderr.startswith("harmony: error: ") and \
        r.stderr.rstrip().endswith("(harmony matrix --help)"), r.stderr


def test_a_cell_this_host_cannot_run_is_refused_with_no_directory_left(tmp_path):
    """A real cell on CPUs this host does not have (or run by someone not root) is refused
    before anything starts, and the --out directory the command made is gone again."""
    p = tmp_path / "far.toml"
    p.write_text("""
        experiments = ["single-source"]
        [params]
        duration = 1
        [[matrix]]
        kernels = ["host"]
        schedulers = ["default"]
        topologies = ["4000-4001"]
    """)
    r = subprocess.run(HARMONY + ["matrix", str(p), "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "this host cannot run 1 of the cells" in r.stderr
    assert "cell host-default-4000-4001: " in r.stderr, r.stderr   # not online, or not root
    assert not (tmp_path / "m").exists()


def test_a_plan_with_bad_cells_is_a_usage_error_naming_the_help(tmp_path):
    """Bad input, as a bad option is (status 2, the command's --help named on the error's line),
    the bad cells listed under it, one a line."""
    p = tmp_path / "bad.toml"
    p.write_text("""
        repeatt = 2
        [[matrix]]
        kernels = ["simulated"]
        schedulers = ["no-such-policy", "poly-balance"]
        topologies = [4]
    """)
    r = subprocess.run(HARMONY + ["matrix", str(p), "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=60, env={**os.environ,
                                                                         "NO_COLOR": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr and not (tmp_path / "m").exists()
    first, *problems = r.stderr.rstrip("\n").split("\n")
    assert first == f"harmony: error: {p}: 2 problems (harmony matrix --help):", r.stderr
    assert len(problems) == 2 and "unknown key 'repeatt'" in problems[0], r.stderr
    assert "simulated-no-such-policy-4" in problems[1] and "--help" not in problems[1]


# --- the local path -------------------------------------------------------------------------------

def test_local_matrix_runs_resumes_and_reports(tmp_path):
    plan = matrix.load_plan(plan_file(tmp_path))
    out = tmp_path / "m"
    record = matrix.run_local(plan, out, quiet=True)
    assert record["status"] == "complete" and not record["failures"]
    for cell in plan.cells:
        d = out / "cells" / cell.id
        rec = json.loads((d / "cell.json").read_text())
        assert rec["cell"]["id"] == cell.id and rec["status"] == "complete"
        assert (d / "suite.json").is_file() and rec["runs"] == 1
    assert not any((out / ".partial").iterdir())
    # a cell lost (and a half-made one left behind): --resume makes it again, keeps the other
    kept, lost = plan.cells
    stamp = (out / "cells" / kept.id / "cell.json").stat().st_mtime_ns
    os.rename(out / "cells" / lost.id, out / ".partial" / lost.id)
    r = subprocess.run(HARMONY + ["matrix", str(plan.source), "--out", str(out), "--resume"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "1 done, 1 running, 0 left of 2" in r.stderr and "2 of 2 cells complete" in r.stdout
    assert (out / "cells" / kept.id / "cell.json").stat().st_mtime_ns == stamp
    assert (out / "cells" / lost.id / "cell.json").is_file()
    rep = json.loads((out / "report.json").read_text())
    assert [c["id"] for c in rep["cells"]] == [c.id for c in plan.cells]
    balances = next(q for q in rep["questions"] if q["qid"] == "balances")
    assert set(balances["answers"]) == {c.id for c in plan.cells}
    assert "| balances" in (out / "report.md").read_text()
    # harmony compare takes cells of a matrix (each a suite directory)
    cells = [str(out / "cells" / x.id) for x in plan.cells]
    c = subprocess.run(HARMONY + ["compare", "--json", *cells], capture_output=True, text=True,
                       timeout=120)
    assert c.returncode == 0, c.stderr
    assert json.loads(c.stdout)["sources"][0]["source"] == cells[0]
    # --json: the end summary a program reads, as matrix.json and the files say; -q: nothing else
    j = subprocess.run(HARMONY + ["matrix", str(plan.source), "--out", str(out), "--resume",
                                  "--json", "-q"], capture_output=True, text=True, timeout=120)
    assert j.returncode == 0 and j.stderr == "", j.stderr
    summary = json.loads(j.stdout)
    record = json.loads((out / "matrix.json").read_text())
    assert summary["cells_state"] == record["cells_state"] == {c.id: "complete"
                                                               for c in plan.cells}
    assert (summary["cells"], summary["complete"], summary["failures"]) == (2, 2, [])
    assert all(Path(f).is_file() for f in summary["report"]) and len(summary["report"]) == 3


def _files(d: Path) -> dict[str, str]:
    """Every file under ``d``: its path under ``d`` -> its sha256."""
    import hashlib

    return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(d.rglob("*")) if f.is_file()}


def broken_matrix(tmp_path: Path, monkeypatch) -> tuple:
    """A matrix of 2 cells of 2 runs each left as a crash leaves it: the first cell's second run
    failed (the cell finished incomplete, in cells/), the second cell interrupted (Ctrl-C) in its
    second run (its first run in .partial/). Returns (plan, out, each cell's first run's files:
    cell id -> {path: sha256})."""
    from harmony.runners import SimRunner

    plan = matrix.load_plan(plan_file(tmp_path, repeat=2))
    real, calls = SimRunner.capture, []

    def capture(self, exp, params, cpus, out, seed, figures=True):
        calls.append(out)
        if len(calls) == 2:
            raise RuntimeError("the simulator broke (a fault made by the test)")
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(self, exp, params, cpus, out, seed, figures=figures)

    monkeypatch.setattr(SimRunner, "capture", capture)
    out = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        matrix.run_local(plan, out, quiet=True)
    monkeypatch.undo()
    failed, stopped = plan.cells
    record = json.loads((out / "matrix.json").read_text())
    assert record["status"] == "interrupted"
    assert record["cells_state"] == {failed.id: "incomplete", stopped.id: "interrupted"}
    first = {failed.id: out / "cells" / failed.id / "single-source" / "rep-01",
             stopped.id: out / ".partial" / stopped.id / "single-source" / "rep-01"}
    for d in first.values():
        assert json.loads((d / "manifest.json").read_text())["status"] == "complete"
    return plan, out, {k: _files(d) for k, d in first.items()}


def assert_resumed(plan, out: Path, first: dict) -> None:
    """Every cell complete in cells/, each with its first run as it was (kept, not made again)
    and a second run made, by another process (the CLI's, a worker's)."""
    assert not list((out / ".partial").iterdir())
    for cell in plan.cells:
        d = out / "cells" / cell.id
        rec = json.loads((d / "cell.json").read_text())
        assert rec["status"] == "complete" and rec["resumed"] is True
        assert rec["host"]["pid"] != os.getpid()
        assert _files(d / "single-source" / "rep-01") == first[cell.id]
        m2 = json.loads((d / "single-source" / "rep-02" / "manifest.json").read_text())
        assert m2["status"] == "complete"
        suite = json.loads((d / "suite.json").read_text())
        assert suite["status"] == "complete" and suite["resumed_at"]


def test_resume_takes_up_the_cells_left_incomplete_or_interrupted(tmp_path, monkeypatch):
    """--resume runs again a cell that finished incomplete (a run failed) and one interrupted
    mid-way, each from where it stopped: its complete run kept as it was, the missing run made;
    a complete cell is left alone."""
    plan, out, first = broken_matrix(tmp_path, monkeypatch)
    r = subprocess.run(HARMONY + ["matrix", str(plan.source), "--out", str(out), "--resume",
                                  "-q"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 of 2 cells complete" in r.stdout
    assert_resumed(plan, out, first)
    assert json.loads((out / "matrix.json").read_text())["status"] == "complete"
    # complete now: a second --resume has nothing to run and changes no cell
    before = {c.id: _files(out / "cells" / c.id) for c in plan.cells}
    record = matrix.run_local(plan, out, resume=True, quiet=True)
    assert record["status"] == "complete"
    assert {c.id: _files(out / "cells" / c.id) for c in plan.cells} == before


# --- the cluster path -----------------------------------------------------------------------------

#: a LocalCluster's scheduler without its dashboard, its HTTP server (which distributed starts
#: whatever dashboard_address says: None meant the default, 8787) on a free port: two test
#: workers' clusters at once no longer meet on 8787 ("Port 8787 is already in use", CI)
NO_DASHBOARD = {"dashboard_address": ":0", "scheduler_kwargs": {"dashboard": False}}


@pytest.fixture(scope="module")
def cluster():
    distributed = _distributed()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  resources={"host": 1}, **NO_DASHBOARD) as lc, \
            distributed.Client(lc) as client:
        yield lc, client


def test_a_cluster_gives_the_cards_the_local_path_gives(tmp_path, cluster):
    from harmony.matrix_dask import run_cluster

    plan = matrix.load_plan(plan_file(tmp_path))
    matrix.run_local(plan, tmp_path / "local", quiet=True)
    record = run_cluster(plan, tmp_path / "dask", None, quiet=True, client=cluster[1])
    assert record["status"] == "complete" and not record["failures"]
    assert cards(tmp_path / "dask") == cards(tmp_path / "local")
    assert len(cards(tmp_path / "dask")) == 2 * 9


def test_a_cluster_resumes_the_cells_left_incomplete_or_interrupted(tmp_path, monkeypatch,
                                                                     cluster):
    """--resume through the cluster: each unfinished cell travels to a worker with what it
    collected and is resumed there; what it had kept comes home unchanged."""
    from harmony.matrix_dask import run_cluster

    _, client = cluster
    plan, out, first = broken_matrix(tmp_path, monkeypatch)
    record = run_cluster(plan, out, None, resume=True, quiet=True, client=client)
    assert record["status"] == "complete" and not record["failures"]
    assert_resumed(plan, out, first)      # by the workers' processes, not this one
    assert not list((out / ".incoming").glob("*"))


def test_cells_come_home_through_a_shared_directory_checksummed(tmp_path, cluster):
    """--shared-dir: a worker writes the cell's archive there whole (nothing through Dask but
    its path and sha256), the submitter checks the sum before it moves the cell in, and a
    corrupt archive is refused with nothing stored; the directory is left empty."""
    from harmony.matrix_dask import cell_archive, run_cluster, unpack
    from harmony.store import RunError

    _, client = cluster
    shared = tmp_path / "shared"
    shared.mkdir()
    plan = matrix.load_plan(plan_file(tmp_path))
    record = run_cluster(plan, tmp_path / "m", None, quiet=True, client=client, shared=shared)
    assert record["status"] == "complete" and not record["failures"]
    for cell in plan.cells:
        rec = json.loads((tmp_path / "m" / "cells" / cell.id / "cell.json").read_text())
        assert rec["status"] == "complete" and rec["host"]["pid"] != os.getpid()
    assert not list(shared.iterdir())
    # one cell's task by hand: its result names the archive in the shared directory
    cell = plan.cells[0]
    result = client.submit(cell_archive, cell.to_dict(), None, None, str(shared), "t",
                           resources={"host": 1}, pure=False).result()
    assert "archive" not in result and Path(result["shared"]).parent == shared
    path = Path(result["shared"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF           # a byte flipped on the way
    path.write_bytes(bytes(data))
    out = tmp_path / "m2"
    out.mkdir()
    with pytest.raises(RunError, match="sha256 does not match"):
        unpack(result, out, cell)
    assert not (out / "cells").exists() and not path.exists()
    assert not list((out / ".incoming").glob("*"))


def test_a_bad_shared_directory_is_one_line(tmp_path):
    _distributed()
    not_dir = tmp_path / "file"
    not_dir.write_text("")
    r = subprocess.run(HARMONY + ["matrix", str(plan_file(tmp_path)), "--out",
                                  str(tmp_path / "m"), "--cluster", "tcp://127.0.0.1:1",
                                  "--shared-dir", str(not_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--shared-dir {not_dir}: not a directory" in r.stderr
    assert not (tmp_path / "m").exists()


def _scratch_dirs() -> list[Path]:
    return list((Path(tempfile.gettempdir()) / "harmony-cells").glob("cell-*"))


def _cell_parent(pid: int) -> int | None:
    """The worker a cell process says it runs for (its ``--parent PID``), None if gone."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return int(args[args.index(b"--parent") + 1]) if b"--parent" in args else None


def _running_in(pids: set[int], holding: str | None = None) -> list[Path]:
    """The scratch directories of the cells running in these worker processes (holding the
    file ``holding`` in the cell's directory)."""
    return [d for d in _scratch_dirs() if int(d.name.split("-")[1]) in pids
            and (holding is None or any(d.glob(f"*/{holding}")))]


def _live_worker_pids(lc, timeout: float = 60.0) -> set[int]:
    """The cluster's worker processes once each is alive (a worker another test killed is
    being started again by its nanny meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {w.process.pid for w in lc.workers.values()
                if w.process is not None and w.process.pid is not None}
        if len(pids) == len(lc.workers) and all(Path(f"/proc/{p}").exists() for p in pids):
            return pids
        assert time.monotonic() < deadline, "the cluster's workers did not come back"
        time.sleep(0.2)


def test_a_worker_killed_mid_cell_its_cell_runs_again(tmp_path, cluster):
    """A worker (its process, SIGKILL) dies while its cell runs: Dask gives the cell to another
    worker; every cell ends complete, once, and the killed cell's process is gone with it."""
    from harmony.matrix_dask import run_cluster

    lc, client = cluster
    plan = matrix.load_plan(plan_file(tmp_path, duration=6.0))
    pids = _live_worker_pids(lc)
    before = set(_scratch_dirs())
    killed: list[int] = []

    def kill_one():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for d in set(_scratch_dirs()) - before:
                pid = int(d.name.split("-")[1])
                if pid in pids:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.1)

    import threading
    t = threading.Thread(target=kill_one)
    t.start()
    record = run_cluster(plan, tmp_path / "m", None, quiet=True, client=client)
    t.join()
    assert killed, "no cell was seen running"
    assert record["status"] == "complete" and not record["failures"]
    assert sorted(p.name for p in (tmp_path / "m" / "cells").iterdir()) == \
        sorted(c.id for c in plan.cells)
    assert not [*(tmp_path / "m").glob(".partial/*"), *(tmp_path / "m").glob(".incoming/*")]
    runs = list((tmp_path / "m" / "cells").glob("*/single-source/rep-*"))
    assert len(runs) == 2          # one run per cell: none lost, none twice
    time.sleep(0.5)
    children = [pid for pid in subprocess.run(["pgrep", "-f", "harmony.matrix --cell"],
                                              capture_output=True, text=True).stdout.split()
                if _cell_parent(int(pid)) in killed]    # this test's: other tests run cells too
    assert not children, "a killed worker's cell process was left running"


def test_an_unreachable_scheduler_is_one_line(tmp_path):
    _distributed()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # free, and nobody listens on it
    out = tmp_path / "m"
    r = subprocess.run(HARMONY + ["matrix", str(plan_file(tmp_path)), "--out", str(out),
                                  "--cluster", f"tcp://127.0.0.1:{port}", "--connect-timeout",
                                  "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in r.stderr
    assert not out.exists()


def test_without_distributed_the_extra_is_named(tmp_path):
    code = ("import sys; sys.modules['distributed'] = None; from harmony.cli import entry; "
            "sys.argv = ['harmony'] + sys.argv[1:]; entry()")
    r = subprocess.run([sys.executable, "-c", code, "worker", "tcp://127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "harmony-sched[matrix]" in r.stderr.splitlines()[-1]


def test_ctrl_c_stops_the_running_cells_and_leaves_the_workers_clean(tmp_path, cluster):
    """Ctrl-C of `harmony matrix --cluster`: exit 130, the matrix marked interrupted, the
    cells running on the workers stopped (their processes gone) within seconds, and what they
    had collected brought home into .partial/."""
    lc, _ = cluster
    out = tmp_path / "m"
    # a simulated run is much faster than its duration (60 s took 0.3 s here): cells of 5 runs
    # of 600 s (about 15 s each here) are still running when the Ctrl-C comes
    plan = plan_file(tmp_path, duration=600.0, repeat=5)
    pids = _live_worker_pids(lc)
    before = set(_running_in(pids))    # cells another test left on these workers
    p = subprocess.Popen(HARMONY + ["matrix", str(plan), "--out",
                                    str(out), "--cluster", lc.scheduler_address, "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=sigint_as_a_terminal)
    deadline = time.monotonic() + 60
    # a cell of ours running, its suite begun: our matrix begun (matrix.json is written before
    # its cells are sent) and a cell started since (CI once sent the Ctrl-C before the command
    # had written its record: a cell directory not of this matrix was taken for one of its own)
    while time.monotonic() < deadline and not (
            (out / "matrix.json").is_file()
            and set(_running_in(pids, "suite.json")) - before):
        time.sleep(0.1)
    assert (out / "matrix.json").is_file(), "the matrix did not begin within 60 s"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    record = json.loads((out / "matrix.json").read_text())
    assert record["status"] == "interrupted"
    # what the running cells collected came home, for --resume to go on from
    kept = [f["cell"] for f in record["failures"] if "interrupted on its worker" in f["error"]]
    assert kept, record["failures"]
    for cell in kept:
        suite = json.loads((out / ".partial" / cell / "suite.json").read_text())
        assert suite["configs"][0]["experiment"] == "single-source"
    # the cells' processes end and their workers remove their scratch as they wind down (a
    # loaded host may take a few seconds): gone within 20 s, or left behind
    # (this cluster's workers: another test's cells may run beside)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_running_in(pids)
                                           or any(descendants(pid) for pid in pids)):
        time.sleep(0.2)
    assert not any(descendants(pid) for pid in pids), "a cell's process was left running"
    assert not _running_in(pids), "a cell's scratch directory was left"


# --- faults ---------------------------------------------------------------------------------------

def test_a_full_disk_is_one_line_and_the_matrix_resumes(tmp_path):
    """The submitting side's disk fills up during the second cell: one line says so, the first
    cell stays as it was, and once there is room --resume finishes the matrix."""
    from conftest import small_tmpfs

    plan = plan_file(tmp_path)
    with small_tmpfs(tmp_path / "disk", "400k") as disk:
        out = disk / "m"
        r = subprocess.run(HARMONY + ["matrix", str(plan), "--out", str(out), "-q"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "No space left on device" in r.stderr and "Traceback" not in r.stderr
        cells = sorted((out / "cells").iterdir())
        assert len(cells) == 1          # the first cell fitted, the second did not
        kept = _files(cells[0])
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        r = subprocess.run(HARMONY + ["matrix", str(plan), "--out", str(out), "--resume", "-q"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "2 of 2 cells complete" in r.stdout
        assert _files(cells[0]) == kept
        assert not list((out / ".partial").iterdir())


def test_a_matrix_directory_that_cannot_be_made_is_one_line(tmp_path):
    """--out where no directory can be made (under a file): refused as a bad option (a usage
    error: one line naming it, exit status 2) before anything runs."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = subprocess.run(HARMONY + ["matrix", str(plan_file(tmp_path)), "--out",
                                  str(blocker / "m"), "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("harmony: error: "), r.stderr
    assert f"{blocker} is not a directory" in r.stderr
    assert blocker.is_file()


def test_a_worker_without_qemu_fails_its_cell_in_one_line(tmp_path):
    """A worker host that cannot boot a kernel (no QEMU, no virtme-ng on its PATH): its VM cell
    fails with that one line, after its retries; the simulated cell completes; nothing hangs."""
    distributed = _distributed()
    from harmony.matrix_dask import run_cluster

    plan = tmp_path / "plan.toml"
    plan.write_text(TINY.format(duration=1.0, repeat=1).replace(
        '"pairwise-random"', '"pairwise-random"]\ntopologies = [2]\n[[matrix]]\n'
        'kernels = ["debian:6.1"]\nschedulers = ["default"'))
    plan = matrix.load_plan(plan)
    vm = next(c for c in plan.cells if c.kind == matrix.VM)
    empty = tmp_path / "bin"
    empty.mkdir()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  resources={"host": 1, "measure": 1}, **NO_DASHBOARD,
                                  env={"PATH": str(empty)}) as lc, \
            distributed.Client(lc) as client:
        record = run_cluster(plan, tmp_path / "m", None, quiet=True, client=client)
    assert record["status"] == "incomplete"
    assert record["cells_state"][vm.id] == "failed"
    assert sum(s == "complete" for s in record["cells_state"].values()) == 2
    (failure,) = record["failures"]
    assert failure["cell"] == vm.id and "\n" not in failure["error"]
    assert f"cannot boot kernel {vm.kernel}: missing qemu-system-x86" in failure["error"]


def test_the_scheduler_killed_mid_matrix_is_one_line_and_resumable(tmp_path):
    """The Dask scheduler dies (SIGKILL) while a cell runs: `harmony matrix` says so in one line
    and exits, matrix.json lists every unfinished cell with that reason, the worker's cell
    process ends, and --resume (here, without a cluster) finishes the matrix."""
    _distributed()
    plan = plan_file(tmp_path, duration=6.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sched, address = start_scheduler(tmp_path)
    procs = [sched]
    try:
        deadline = time.monotonic() + 60
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
             "--resources", "host=1", "--no-nanny", "--no-dashboard", "--death-timeout", "5"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        out = tmp_path / "m"
        run = subprocess.Popen(HARMONY + ["matrix", str(plan), "--out", str(out), "--cluster",
                                          address, "-q", "--connect-timeout", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(run)
        while time.monotonic() < deadline and not _running_in({procs[1].pid}):
            time.sleep(0.1)
        assert _running_in({procs[1].pid}), "no cell was seen running"
        sched.kill()
        _, err = run.communicate(timeout=90)
        assert run.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Dask scheduler" in lines[0], err
        record = json.loads((out / "matrix.json").read_text())
        assert record["status"] == "incomplete"
        assert {f["cell"] for f in record["failures"]} == set(record["cells_state"])
        assert all("scheduler" in f["error"] for f in record["failures"]), record["failures"]
        assert until_gone("harmony.matrix --cell", 30), "the cell's process was left running"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    r = subprocess.run(HARMONY + ["matrix", str(plan), "--out", str(out), "--resume", "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "2 of 2 cells complete" in r.stdout, r.stderr


def until_gone(pattern: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# --- a worker that cannot measure, a busy host, the network cut -----------------------------------

#: a simulated cell and a real host cell: which worker may take which
MIXED = """
name = "mixed"
experiments = ["single-source"]
repeat = 1
[params]
duration = {duration}
[[matrix]]
kernels = ["simulated"]
schedulers = ["poly-balance"]
topologies = [2]
[[matrix]]
kernels = ["host"]
schedulers = ["default"]
topologies = ["all"]
"""


def start_scheduler(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """A Dask scheduler in a process of its own (to kill, or stop): (it, its address)."""
    sfile = tmp_path / "scheduler.json"
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port",
                              "0", "--no-dashboard", "--scheduler-file", str(sfile)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sched.poll() is None:
        # the scheduler writes its file in place: it can be seen empty or half written
        try:
            return sched, json.loads(sfile.read_text())["address"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    sched.kill()
    sched.wait()
    raise AssertionError(f"the Dask scheduler wrote no address to {sfile} in 60 s")


def start_worker(address: str, name: str, tmp_path: Path, before: str = "",
                 check_host: bool = False) -> subprocess.Popen:
    """`harmony worker` (start_worker) in a process of its own, its stderr in a file; ``before``:
    Python run first (a host made to look unlike this one)."""
    code = (f"import sys\n{before}\nfrom harmony.matrix_dask import start_worker\n"
            f"start_worker(sys.argv[1], name={name!r}, timeout=5, check_host={check_host})\n")
    import distributed

    with open(tmp_path / f"worker-{name}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, address], stdout=subprocess.DEVNULL,
                                stderr=err, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # registered before the matrix starts (else its cells would wait for a worker: --wait-host)
    with distributed.Client(address, set_as_default=False) as client:
        try:
            client.wait_for_workers(1, timeout=60)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    return proc


def stop_all(procs: list[subprocess.Popen], wait_s: float = 30) -> None:
    """Stop each process still running (a stopped one continued first): SIGTERM, then SIGKILL
    past ``wait_s``."""
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.terminate()
            try:
                p.wait(wait_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (its children, theirs, ...)."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                          text=True).stdout.split()
    return [int(k) for k in kids] + [d for k in kids for d in descendants(int(k))]


def mixed_plan(tmp_path: Path, duration: float = 1.0) -> matrix.Plan:
    p = tmp_path / "mixed.toml"
    p.write_text(MIXED.format(duration=duration))
    return matrix.load_plan(p)


def test_a_worker_that_cannot_measure_runs_simulated_cells_and_declines_real_ones(tmp_path):
    """A worker whose host cannot measure (harmony doctor: not root; made so here) starts all the
    same, says why in one line, runs the simulated cell, and never takes the real one: that cell
    waits with a line naming the worker and why, then fails past --wait-host with that reason;
    the simulated cell stays complete for --resume."""
    _distributed()
    plan = mixed_plan(tmp_path)
    sim, real = plan.cells
    sched, address = start_scheduler(tmp_path)
    procs = [sched, start_worker(address, "nonroot", tmp_path, check_host=True, before=(
        "from harmony import hostfacts\nhostfacts.is_root = lambda: False"))]
    out = tmp_path / "m"
    try:
        r = subprocess.run(HARMONY + ["matrix", str(plan.source), "--out", str(out),
                                      "--cluster", address, "--wait-host", "4"],
                           capture_output=True, text=True, timeout=120)
    finally:
        stop_all(procs)
    assert r.returncode == 1, r.stderr
    worker_err = (tmp_path / "worker-nonroot.err").read_text()
    assert "cannot measure here: not running as root" in worker_err
    assert "it runs simulated cells only" in worker_err
    record = json.loads((out / "matrix.json").read_text())
    assert record["cells_state"] == {sim.id: "complete", real.id: "failed"}
    (failure,) = record["failures"]
    why = (f"no worker can run a real cell: worker nonroot on {socket.gethostname()}: cannot "
           "measure here: not running as root")
    assert failure["cell"] == real.id and failure["error"].startswith(why), failure
    assert "gave up after" in failure["error"] and "(--wait-host 4)" in failure["error"]
    # said while it waited, and once per failed cell at the end
    assert f"1 real cell wait: {why}" in r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("failed:")] == \
        [f"failed: cell {real.id}: {failure['error']}"]
    rec = json.loads((out / "cells" / sim.id / "cell.json").read_text())
    assert rec["status"] == "complete" and rec["host"]["pid"] != os.getpid()


def test_a_busy_worker_host_is_said_while_the_cell_waits_then_fails_it(tmp_path, monkeypatch):
    """Another Harmony run holds the worker's host (here: this test holds the host lock of the
    worker's lock directory): its real cell waits, the worker's stderr and the submitter's
    progress say which host, why (the holder's pid) and since when; past --wait-host the cell
    fails with that one line, not retried; the simulated cell completes."""
    _distributed()
    from harmony.core import osutil
    from harmony.hygiene import HostLock

    from harmony.hostfacts import is_root
    if not is_root():
        host_skip("a real cell's checks before it waits need root")
    locks = tmp_path / "locks"
    monkeypatch.setattr(osutil, "LOCK_DIRS", (locks,))
    plan = mixed_plan(tmp_path)
    sim, real = plan.cells
    sched, address = start_scheduler(tmp_path)
    procs = [sched, start_worker(address, "busy", tmp_path, before=(
        f"from harmony.core import osutil\nosutil.LOCK_DIRS = ({str(locks)!r},)\n"
        "from pathlib import Path\nosutil.LOCK_DIRS = tuple(map(Path, osutil.LOCK_DIRS))"))]
    out = tmp_path / "m"
    lock = HostLock().acquire()
    try:
        r = subprocess.run(HARMONY + ["matrix", str(plan.source), "--out", str(out),
                                      "--cluster", address, "--wait-host", "3"],
                           capture_output=True, text=True, timeout=120)
    finally:
        lock.release()
        stop_all(procs)
    assert r.returncode == 1, r.stderr
    holder = f"another Harmony run (pid {os.getpid()}) is using this host"
    worker_err = (tmp_path / "worker-busy.err").read_text()
    assert f"cell {real.id} waits: {holder} (since " in worker_err
    assert f"cell {real.id} waits on worker busy on {socket.gethostname()}: {holder}, since " \
        in r.stderr
    record = json.loads((out / "matrix.json").read_text())
    assert record["cells_state"] == {sim.id: "complete", real.id: "failed"}
    (failure,) = record["failures"]
    assert failure["error"].startswith(f"worker busy on {socket.gethostname()}: {holder} "
                                       "(since "), failure
    assert failure["error"].endswith("(--wait-host 3)")
    # given up once, not retried (a retry would wait, and say so, again)
    assert worker_err.count(f"cell {real.id} waits:") == 1
    assert worker_err.count(f"cell {real.id} failed: ") == 1


def test_wait_for_host_says_when_the_wait_starts_and_ends(tmp_path, monkeypatch):
    """The host lock held, then released: the wait is said once with the holder, then ended."""
    import threading

    from harmony.core import osutil
    from harmony.hygiene import HostLock
    from harmony.matrix_dask import HostWait, wait_for_host

    monkeypatch.setattr(osutil, "LOCK_DIRS", (tmp_path / "locks",))
    monkeypatch.setattr("harmony.matrix_dask.POLL_S", 0.05)
    said: list = []
    lock = HostLock().acquire()
    t = threading.Timer(0.5, lock.release)
    t.start()
    wait_for_host(None, 30, lambda why, since: said.append(why))
    t.join()
    assert said == [f"another Harmony run (pid {os.getpid()}) is using this host", None]
    lock = HostLock().acquire()
    try:
        with pytest.raises(HostWait, match=r"\(--wait-host 0.2\)$"):
            wait_for_host(None, 0.2)
    finally:
        lock.release()
    wait_for_host(None, 0)      # a free host: no wait at all


def test_the_network_cut_mid_matrix_is_one_line_and_resumable(tmp_path):
    """The scheduler stops answering (SIGSTOP: its connections stay open, as behind a cut
    network) while the second cell runs: `harmony matrix` says in one line that it lost the
    scheduler at its address, the first cell stays as it came home, the worker stops its cell's
    process (its scheduler silent too), and --resume finishes the matrix."""
    _distributed()
    plan = plan_file(tmp_path, duration=8.0)
    cells = matrix.load_plan(plan).cells
    sched, address = start_scheduler(tmp_path)
    worker = start_worker(address, "cut", tmp_path)
    procs = [sched, worker]
    out = tmp_path / "m"
    try:
        run = subprocess.Popen(HARMONY + ["matrix", str(plan), "--out", str(out), "--cluster",
                                          address, "-q", "--lost-after", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(run)
        first = out / "cells" / cells[0].id
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (first / "cell.json").is_file():
            time.sleep(0.1)
        assert (first / "cell.json").is_file(), "the first cell did not come home"
        while time.monotonic() < deadline and not descendants(worker.pid):
            time.sleep(0.1)
        assert descendants(worker.pid), "the second cell was not seen running"
        kept = _files(first)
        t0 = time.monotonic()
        os.kill(sched.pid, signal.SIGSTOP)
        _, err = run.communicate(timeout=90)
        took = time.monotonic() - t0
        assert run.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert f"lost the Dask scheduler at {address}: no answer for 3 s (the network cut, or " \
            "the scheduler stopped)" in lines[0]
        assert f"`harmony matrix {plan} --out {out} --resume` goes on" in lines[0]
        assert took < 30
        record = json.loads((out / "matrix.json").read_text())
        assert record["cells_state"][cells[0].id] == "complete"
        (failure,) = record["failures"]
        assert failure["cell"] == cells[1].id
        assert f"lost the Dask scheduler at {address}" in failure["error"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and descendants(worker.pid):
            time.sleep(0.2)
        assert not descendants(worker.pid), "the worker left its cell's process running"
    finally:
        stop_all(procs)
    assert _files(first) == kept
    r = subprocess.run(HARMONY + ["matrix", str(plan), "--out", str(out), "--resume", "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "2 of 2 cells complete" in r.stdout, r.stderr
    assert _files(first) == kept
