"""Suite plan, batches (repetitions + aggregates), the report, and the CLI around them."""

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harmony.cli import main
from harmony.suite import cpu_limits, plan, scheduler_of_runs


def test_plan_covers_the_catalog_with_sweeps():
    from harmony.experiments import CATALOG

    configs = plan([0, 1], quick=True)
    # the spread is a question of the machine's levels: planned with a topology (level_plan)
    assert {c.experiment for c in configs} == set(CATALOG) - {"spread"}
    # the server: every shape, at one load quick, three in full; the simulator leaves it out
    assert sorted(c.label for c in configs if c.experiment == "server") == [
        "server-shape=event-loop-load=0.5", "server-shape=pool-per-stage-load=0.5",
        "server-shape=thread-per-connection-load=0.5", "server-shape=thread-per-core-load=0.5"]
    assert len([c for c in plan([0, 1]) if c.experiment == "server"]) == 12
    assert "server" not in {c.experiment for c in plan([0, 1], quick=True, simulated=True)}
    for c in configs:
        assert c.params is not None and c.repeat >= 2
    if "how-many" in CATALOG:
        assert any("x" in c.overrides for c in configs if c.experiment == "how-many")
    full = plan([0, 1, 2, 3], quick=False)
    assert sum(c.configured_s for c in full) > sum(c.configured_s for c in configs)
    with pytest.raises(ValueError, match="unknown experiment"):
        plan([0, 1], experiments=["no-such"])


def test_two_cpus_say_what_they_cannot_answer():
    lines = cpu_limits(2)
    assert any("x/2" in line and "3 or more CPUs" in line for line in lines)
    assert cpu_limits(4) == []


def test_simulated_batch_and_suite_report(tmp_path, no_figures):
    cli = CliRunner()
    out = tmp_path / "batch"
    r = cli.invoke(main, ["simulate", "--policy", "poly-balance", "--ncpus", "4", "--experiment",
                          "single-source", "--repeat", "3", "-p", "duration=0.5",
                          "--out", str(out)])
    assert r.exit_code == 0, r.output
    b = json.loads((out / "batch.json").read_text())
    assert b["complete"] == 3 and [d for d in b["reps"]] == ["rep-01", "rep-02", "rep-03"]
    agg = {a["metric"]: a for a in b["aggregates"]}
    assert agg["balance_migrations"]["n"] == 3 and agg["balance_migrations"]["median"] == 6
    assert (out / "figures" / "reps.png").is_file()

    suite = tmp_path / "suite"
    r = cli.invoke(main, ["simulate", "--policy", "pairwise-random", "--ncpus", "4", "--suite",
                          "--quick", "--repeat", "1", "--out", str(suite)])
    assert r.exit_code == 0, r.output
    # what a simulation cannot run is said, not dropped: the server serves over sockets
    assert "server: left out of a simulated suite (its tasks serve requests" in r.output
    assert not (suite / "server").exists()
    md = (suite / "report.md").read_text()
    html = (suite / "report.html").read_text()
    # `harmony report SUITE` writes the same report again and prints the card
    (suite / "report.md").unlink()
    r = cli.invoke(main, ["report", str(suite)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Policy card: ") and "report.html" in r.output
    assert (suite / "report.md").read_text() == md
    assert md.index("Policy card") < md.index("Evidence per question")
    assert "data:image/png;base64," in html and "src='figures" not in html
    info = json.loads((suite / "suite.json").read_text())
    assert info["status"] == "complete" and info["efficiency"] > 0
    # the suite draws its cross-run figures only; the report says how to draw the others
    assert list((suite / "figures").glob("*.png"))
    runs = [json.loads(m.read_text()) for m in suite.glob("*/rep-*/manifest.json")]
    assert runs and all(m["figures"] == [] and m["figures_deferred"] for m in runs)
    batch = json.loads((suite / "single-source" / "batch.json").read_text())
    assert batch["figures"] == [] and batch["figures_deferred"]
    assert "Not drawn by the suite" in md
    assert "single-source, one run's own figures: " \
           f"`harmony report {suite / 'single-source' / 'rep-01'}`" in md
    # ... and `harmony report CONFIGURATION` draws a configuration's
    config = suite / "single-source"
    assert not (config / "figures" / "reps.png").exists()
    r = cli.invoke(main, ["report", str(config)])
    assert r.exit_code == 0, r.output
    assert "single-source: 1/1 runs complete" in r.output and "reps.png" in r.output
    assert (config / "figures" / "reps.png").stat().st_size > 10_000
    batch = json.loads((config / "batch.json").read_text())
    assert batch["figures"] == ["figures/reps.png"] and not batch["figures_deferred"]

    r = cli.invoke(main, ["infer", str(suite), "--json"])
    assert r.exit_code == 0, r.output
    card = json.loads(r.output)
    assert card["answers"][2]["label"] == "pairwise"


def test_bad_arguments_exit_2(tmp_path):
    cli = CliRunner()
    # a directory to read that is missing or holds no run is input, not usage: status 1
    assert cli.invoke(main, ["infer", str(tmp_path / "missing")]).exit_code == 1
    assert cli.invoke(main, ["infer", str(tmp_path)]).exit_code == 1  # no runs in it
    r = cli.invoke(main, ["simulate", "--policy", "fifo", "--experiment", "single-source",
                          "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown reference policy" in r.output
    r = cli.invoke(main, ["suite", "--experiment", "no-such", "--out", str(tmp_path / "s")])
    assert r.exit_code == 2
    r = cli.invoke(main, ["run", "single-source", "--repeat", "0"])
    assert r.exit_code == 2


def test_kernel_repeat_batch(kernel, tmp_path):
    """Two real runs of one configuration: rep dirs, batch.json, the host lock held throughout."""
    r = CliRunner().invoke(main, ["run", "single-source", "--duration", "1", "--repeat", "2", "-q",
                                  "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "b" / "batch.json").read_text())
    assert b["complete"] == 2 and not b["failed"]
    assert (tmp_path / "b" / "figures" / "reps.png").is_file()
    first, second = (json.loads((tmp_path / "b" / r / "manifest.json").read_text())
                     for r in ("rep-01", "rep-02"))
    assert first["figures"] and second["figures_deferred"]  # analysed after both captures
    # one tracefs instance for both runs, removed at the end
    assert not first["probe_meta"]["instance_reused"] and second["probe_meta"]["instance_reused"]
    assert not list(Path("/sys/kernel/tracing/instances").glob(f"harmony-{os.getpid()}"))


def test_later_repetitions_draw_figures_on_demand(tmp_path):
    """A batch draws the figures of its first repetition; `harmony report` draws the others."""
    import json
    import subprocess
    import sys

    out = tmp_path / "sim"
    cmd = [sys.executable, "-m", "harmony.cli"]
    p = subprocess.run(cmd + ["simulate", "--policy", "poly-balance", "--ncpus", "4",
                              "--experiment", "single-source", "--repeat", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    first, second = (json.loads((out / r / "manifest.json").read_text())
                     for r in ("rep-01", "rep-02"))
    assert first["figures"] and not first["figures_deferred"]
    assert second["figures"] == [] and second["figures_deferred"]
    p = subprocess.run(cmd + ["report", str(out / "rep-02")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    second = json.loads((out / "rep-02" / "manifest.json").read_text())
    assert second["figures"] and not second["figures_deferred"]
    assert all((out / "rep-02" / f).stat().st_size > 10_000 for f in second["figures"])



def test_report_refuses_an_unfinished_batch(tmp_path):
    (tmp_path / "batch.json").write_text(json.dumps({"experiment": "single-source",
                                                     "reps": ["rep-01"], "status": "captured"}))
    r = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert r.exit_code == 1 and "was not finished" in r.output


@pytest.mark.parametrize("experiment", ["single-source", "heavy-light", "priority-classes"])
def test_analysis_serves_written_tables_as_read_back(tmp_path, no_figures, monkeypatch, experiment):
    """analyse() hands the experiment the tables it has just written instead of reading their
    Parquet files back: the summaries (companions' included) equal those computed from the files."""
    from harmony import pipeline, store
    from harmony.simulate import simulate_run

    run = simulate_run("poly-balance", experiment, 4, tmp_path / "run")    # analysed with preload
    dirs = sorted(p.parent for p in run.path.rglob("manifest.json"))
    served = {d: store.read_json(d / "summary.json") for d in dirs}
    preloaded = []
    monkeypatch.setattr(store.Run, "preload", lambda self, tables: preloaded.append(sorted(tables)))
    for d in sorted(dirs, key=lambda d: -len(d.parts)):     # companions first, from the files
        pipeline.analyse(d, figures=False)
        assert store.read_json(d / "summary.json") == served[d], d
    assert all({"events", "runs", "runqueue", "tasks"} <= set(t) for t in preloaded)
    assert len(preloaded) == len(dirs)


def test_paused_analyser_never_runs_while_a_run_is_measured(kernel, tmp_path):
    """--overlap auto without spare CPUs: the background analyser is stopped (state T) before each
    release and records no event in [t0, end]; every run is analysed by the end; it exits."""
    import pandas as pd

    from harmony.core.osutil import online_cpus
    from harmony.experiments import get_experiment
    from harmony.runners import KernelRunner, _proc_state

    cpus = online_cpus()
    exp = get_experiment("single-source")
    params = exp.resolve({"duration": 0.5}, cpus)
    runner = KernelRunner("tracefs", {}, overlap=True, cpus=cpus, pause=True)
    pause, states = runner._pause_worker, []

    def pause_and_look():
        pause()
        states.append(_proc_state(runner.worker.pid))
    runner._pause_worker = pause_and_look
    with runner:
        pid = runner.worker.pid
        for k in range(4):
            runner.capture(exp, params, cpus, tmp_path / f"r{k}", seed=k, figures=False)
            assert len(runner.handed) <= runner.AHEAD
    assert states == ["T"] * 4
    assert sorted(r["path"] for r in runner.results) == [str(tmp_path / f"r{k}") for k in range(4)]
    assert all(r["status"] == "ok" for r in runner.results), runner.results
    assert _proc_state(pid) is None  # waited for: gone
    for k in range(4):
        m = json.loads((tmp_path / f"r{k}" / "manifest.json").read_text())
        assert m["status"] == "complete"
        ev = pd.read_parquet(tmp_path / f"r{k}" / "events.parquet")
        window = ev[(ev["ts"] >= m["t0_ns"]) & (ev["ts"] <= m["end_ns"])]
        its = (window["common_pid"] == pid) | (window["pid"] == pid) | (window["prev_pid"] == pid)
        assert not its.any(), window[its].head()


@pytest.mark.parametrize("when", ["importing", "after a capture"])
def test_stopped_analyser_dies_with_its_controller(tmp_path, when):
    """A controller killed while its analyser is stopped leaves no analyser behind: stopped as
    it imports the analysis (its maps show numpy: past its first step, the death signal) or
    after it analysed a capture (READY, the capture's result, DONE)."""
    import subprocess
    import sys
    import time

    from harmony.runners import _proc_state

    wait = ("w.stdin.write(b'0\\t/nonexistent/run\\n'); w.stdin.flush()\n"
            "[w.stdout.readline() for _ in range(3)]\n" if when == "after a capture" else
            "import time\n"
            "while 'numpy' not in open(f'/proc/{w.pid}/maps').read(): time.sleep(0.001)\n")
    script = ("import os, signal, subprocess, sys\n"
              "w = subprocess.Popen([sys.executable, '-m', 'harmony.analyser'],"
              " stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
              + wait +
              "os.kill(w.pid, signal.SIGSTOP)\n"
              "print(w.pid, flush=True)\n"
              "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _proc_state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    state = _proc_state(pid)
    if state not in (None, "Z"):
        os.kill(pid, 9)  # leave nothing behind, even when failing
    assert state in (None, "Z")


def test_captures_of_an_analyser_that_died_are_analysed_on_exit(tmp_path):
    """Every capture handed to the background analyser is reported once, even if it dies."""
    from harmony.runners import KernelRunner

    runner = KernelRunner("tracefs", {}, overlap=True, cpus=[0], pause=True)
    runner._start_worker()
    groups = [([str(tmp_path / f"r{k}" / "static"), str(tmp_path / f"r{k}")], False)
              for k in range(3)]
    runner.pending = list(groups)
    runner._hand_out()
    assert len(runner.handed) == runner.AHEAD and len(runner.pending) == 1
    runner.worker.kill()        # dies with two captures handed (and maybe reported)
    results = runner.drain()
    assert sorted(r["path"] for r in results) == sorted(d for g in groups for d in g[0])
    assert all(r["status"] == "error" and "not found" in r["error"] for r in results)
    assert runner.worker is None and not runner.handed


@pytest.mark.parametrize("stop", [KeyboardInterrupt, "Interrupted"])
def test_a_stopped_runner_ends_now_its_captures_left_captured(tmp_path, stop):
    """Ctrl-C or SIGTERM out of a suite: the runner kills its analyser (here mid-analysis, handed
    two captures) and analyses nothing more; what was not analysed stays for --resume."""
    from harmony.core.errors import Interrupted
    from harmony.runners import KernelRunner, _proc_state

    stop = Interrupted if stop == "Interrupted" else stop
    runner = KernelRunner("tracefs", {}, overlap=True, cpus=[0], pause=True)
    runner._start_worker()
    pid = runner.worker.pid
    runner.pending = [([str(tmp_path / f"r{k}")], False) for k in range(3)]
    runner._hand_out()
    analysed = []
    runner.drain = lambda: analysed.append(True) or []
    assert runner.__exit__(stop, stop("stopped"), None) is False     # raised on, not swallowed
    assert analysed == [] and runner.worker is None and runner.lock is None
    assert _proc_state(pid) is None     # killed and reaped, not left analysing
    assert len(runner.pending) == 1 and not hasattr(runner, "results")


def test_ctrl_c_at_the_terminal_is_for_the_controller_not_its_analyser():
    """Ctrl-C reaches the terminal's whole process group; the analyser is outside it, so it
    neither dies of it mid-import nor prints a traceback, and ends when its input does."""
    import subprocess
    import sys

    script = ("import os, signal, time\n"
              "from harmony.runners import KernelRunner\n"
              "r = KernelRunner('tracefs', {}, overlap=True, cpus=[0], pause=True)\n"
              "r._start_worker()\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "time.sleep(0.3)\n"             # while it imports pandas
              "os.killpg(0, signal.SIGINT)\n"  # what a terminal's Ctrl-C does
              "time.sleep(0.3)\n"
              "r.worker.stdin.close()\n"
              "print(r.worker.wait(timeout=60), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, start_new_session=True)
    assert out.returncode == 0, out.stderr
    assert "KeyboardInterrupt" not in out.stderr
    assert out.stdout.split() == ["0"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_progress_rewrites_one_line_on_a_terminal_and_clears_it(tty):
    from harmony.suite import Progress
    stream = _Terminal() if tty else io.StringIO()
    p = Progress(1, 0, stream=stream)
    p.phase("reading x.dat (3 MB)")
    p.phase("drawing the figures")
    p.clear()
    text = stream.getvalue()
    if tty:     # each line overwrites the last; cleared, nothing is left on the terminal
        assert text.count("\r") == 4 and "\n" not in text
        assert text.endswith("\r" + " " * 118 + "\r")
    else:       # a log gets plain lines, and nothing to clear
        assert text.splitlines()[0].startswith("reading x.dat (3 MB)") and text.count("\n") == 2


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "Interrupted"])
def test_a_cleanups_error_after_a_ctrl_c_stops_the_suite(tmp_path, monkeypatch, stop):
    """A run stopped by Ctrl-C (or SIGTERM) whose cleanup then fails raises the cleanup's error
    with the stop as its context: the suite stops as the stop asks (not one failed configuration
    and on to the next), the cleanup's error in the stop's notes."""
    from harmony.core.errors import Interrupted, ProbeError
    from harmony.runners import SimRunner
    from harmony.suite import plan, run_suite

    signal_exc = KeyboardInterrupt() if stop == "KeyboardInterrupt" else Interrupted("stopped")
    calls = []

    def capture(self, *a, **k):
        calls.append(1)
        try:
            raise signal_exc
        except BaseException:
            raise ProbeError("cannot remove tracefs instance x: Device or resource busy")

    monkeypatch.setattr(SimRunner, "capture", capture)
    configs = plan([0, 1], quick=True, experiments=["single-source", "how-many"])
    with pytest.raises(type(signal_exc)) as got:
        run_suite(configs, [0, 1], tmp_path / "s", SimRunner("poly-balance"), quiet=True)
    assert got.value is signal_exc and len(calls) == 1
    assert any("Device or resource busy" in n for n in got.value.__notes__)


def test_an_interrupted_suite_resumes_without_redoing_complete_runs(tmp_path):
    """--resume: complete runs are kept as they are, a captured one is analysed only, an
    interrupted one is moved aside (kept) and run again, a missing one is run."""
    from harmony import store
    from harmony.runners import SimRunner
    from harmony.suite import plan, resume_plan, run_suite

    cpus, out = [0, 1, 2, 3], tmp_path / "suite"
    configs = plan(cpus, quick=True, experiments=["single-source", "how-many"])
    run_suite(configs, cpus, out, SimRunner("poly-balance"), quiet=True, seed=3)
    reps = sorted(p.parent for p in out.glob("*/rep-*/manifest.json"))
    assert len(reps) == 4      # single-source and how-many x=16, 2 reps each
    kept, captured, broken, gone = reps[0], reps[1], reps[2], reps[3]
    stamp = (kept / "manifest.json").stat().st_mtime_ns
    m = store.read_json(captured / "manifest.json")
    store.write_json(captured / "manifest.json", {**m, "status": "captured"})
    m = store.read_json(broken / "manifest.json")
    store.write_json(broken / "manifest.json", {**m, "status": "running"})
    shutil.rmtree(gone)
    record = store.read_json(out / "suite.json")
    store.write_json(out / "suite.json", {**record, "status": "running"})

    configs2, cpus2, before = resume_plan(out)
    assert cpus2 == cpus and before["seed"] == 3
    assert [c.label for c in configs2] == [c.label for c in configs]
    record = run_suite(configs2, cpus2, out, SimRunner("poly-balance"), quiet=True, seed=3,
                       resume=True)
    assert record["status"] == "complete" and len(record["resumed_at"]) == 1
    assert (kept / "manifest.json").stat().st_mtime_ns == stamp          # not touched
    assert all(store.read_json(r / "manifest.json")["status"] == "complete" for r in reps)
    aside = broken.with_name(broken.name + ".incomplete-1")
    assert store.read_json(aside / "manifest.json")["status"] == "running"  # kept, not lost
    with pytest.raises(store.RunError, match="the suite is complete: nothing to resume"):
        resume_plan(out)


def test_a_suite_names_the_sched_ext_scheduler_its_runs_had(tmp_path):
    """A VM's boot facts name the kernel's own scheduler (EEVDF); runs under --scx name theirs."""
    rep = tmp_path / "single-source" / "rep-01"
    rep.mkdir(parents=True)
    (rep / "manifest.json").write_text(json.dumps({"under_test": {"scheduler": "EEVDF"}}))
    assert scheduler_of_runs(tmp_path) is None
    (rep / "manifest.json").write_text(json.dumps({"scx": {"name": "simple"},
                                                   "under_test": {"scheduler": "simple"}}))
    assert scheduler_of_runs(tmp_path) == "simple"
    (rep / "manifest.json").write_text("{not json")
    assert scheduler_of_runs(tmp_path) is None

