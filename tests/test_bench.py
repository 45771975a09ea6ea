"""Smoke runs of the benchmark scripts (bench/) at tiny sizes, so that they cannot rot.

No figure is asserted (a timing is never a test); only that each script runs, prints its table and
verdicts, writes its JSON and refuses bad arguments with exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import host_skip
from test_ringbuf import FORMATS_NEW, FORMATS_WAKING, PageBuilder, encode, parsed_formats, write_dir

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = ("ingest", "observer", "release", "duty", "suite_efficiency", "waking", "vm",
           "compare_noise", "controller_death", "pelt_warmup", "warm_cold", "fidelity",
           "whole_import", "first_use", "perf_import", "schbench",
           "server_capacity", "sequential_rule", "until_decided", "probes",
           "schedstat_causes", "guest_profile", "foreign_trace")


def bench(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_and_bad_arguments(name):
    r = bench(name, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
    r = bench(name, "--no-such-option",
              *(["."] if name in ("waking", "until_decided", "schedstat_causes") else []))
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr


def _switch_pages(n_pages: int, per_page: int, cpu: int) -> list[bytes]:
    """Pages of sched_wakeup + sched_switch pairs between pids 11 and 12 (2 * per_page events
    each)."""
    f = parsed_formats(FORMATS_NEW)
    sw, wk = f["sched/sched_switch"], f["sched/sched_wakeup"]
    pages = []
    for k in range(n_pages):
        b = PageBuilder(1_000_000_000 + k * 10_000_000 + cpu)
        for i in range(per_page):
            a, z = (11, 12) if i % 2 else (12, 11)
            b.event(encode(wk, dict(common_pid=a, comm=f"w{z}", pid=z, prio=120,
                                    target_cpu=cpu)), 1000)
            b.event(encode(sw, dict(common_pid=a, prev_comm=f"w{a}", prev_pid=a, prev_prio=120,
                                    prev_state=1, next_comm=f"w{z}", next_pid=z,
                                    next_prio=120)), 1000)
        pages.append(b.page())
    return pages


def test_schedstat_causes_says_when_no_run_read_the_domains(tmp_path):
    """A run that did not read /proc/schedstat (this host's kernel does not count them): said,
    with an empty JSON."""
    from cli_run import cli

    p = cli("simulate", "--policy", "poly-balance", "--cpus", "2", "--experiment", "single-source",
            "-p", "duration=0.5", "--out", tmp_path / "sim")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "s.json"
    r = bench("schedstat_causes", str(tmp_path), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "no run that read /proc/schedstat" in r.stdout and "(1 runs)" in r.stdout
    assert json.loads(out.read_text()) == {"runs": []}


def test_ingest_from_a_capture(tmp_path):
    raw = write_dir(tmp_path / "raw", {0: _switch_pages(3, 30, 0), 1: _switch_pages(2, 30, 1)})
    out = tmp_path / "ingest.json"
    r = bench("ingest", "--from", str(raw), "--pids", "11,12", "--sizes", "300,1200", "--reps", "2",
              "--workdir", str(tmp_path / "work"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "ns/event" in r.stdout \
        and ">= 10x faster than trace-cmd report (first pass; target retired)" in r.stdout
    res = json.loads(out.read_text())
    # 300 events in the base, x1 and x4
    assert [x["events"] for x in res["results"]] == [300, 1200]
    r = bench("ingest", "--from", str(raw), "--pids", "11,12", "--sizes", "100", "--reps", "1",
              "--workdir", str(tmp_path / "work2"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["results"][0]["events"] == 120   # the first page of each CPU
    assert all(x["bytes_per_event"] >= 0 for x in res["results"])


def test_ingest_refuses_bad_sizes():
    r = bench("ingest", "--sizes", "lots")
    assert r.returncode == 2 and "--sizes" in r.stderr


@pytest.mark.needs_tool("trace-cmd", "/usr/bin/time")
def test_whole_import_from_a_capture(tmp_path):
    raw = write_dir(tmp_path / "raw", {0: _switch_pages(3, 30, 0), 1: _switch_pages(2, 30, 1)})
    out = tmp_path / "import.json"
    # --warmups 0: no untimed import before the timed ones (a smoke test: 4 imports fewer)
    r = bench("whole_import", "--from", str(raw), "--comm", "w1*", "--sizes", "300,1200",
              "--reps", "1", "--warmups", "0", "--traces", str(tmp_path / "traces"),
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "trace-cmd / harmony" in r.stdout and "floor: importing the modules" in r.stdout
    assert ">= 5x faster than trace-cmd report (cold)" in r.stdout
    # the smallest trace measures an import's fixed costs too (the compiled kernels forced)
    assert "fixed costs: the import of a 300-event trace of the same kind" in r.stdout
    fixed = json.loads(out.read_text())["fixed"]
    assert fixed["events"] == 300 and fixed["peak_bytes"] > 0
    res = json.loads(out.read_text())["results"]
    assert [x["events"] for x in res] == [300, 1200]
    assert all(x["peak_bytes"] > 0 and x["harmony_s"] > 0 and x["tracecmd_s"] >= 0 for x in res)
    # the reading alone, per size: a process of its own that read the trace (not the import's)
    assert "reading alone s" in r.stdout
    assert all(x["reading_s"] > 0 and x["reading_peak_bytes"] > 0 for x in res), res
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["pingpong-1e03.dat",
                                                                     "pingpong-3e02.dat"]
    assert all(x["estimate_bytes"] >= x["peak_bytes"] > 0 for x in res), res
    # as trace-cmd record writes them: converted once, v7 compressed
    r = bench("whole_import", "--from", str(raw), "--comm", "w1*", "--sizes", "300", "--reps", "1",
              "--warmups", "0", "--traces", str(tmp_path / "traces"), "--compression", "zstd",
              "--fixed-events", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "the memory estimate an import is refused by is not below its peak" in r.stdout
    [x] = json.loads(out.read_text())["results"]
    assert x["events"] == 300 and x["estimate_bytes"] >= x["peak_bytes"] > 0
    assert (tmp_path / "traces" / "pingpong-3e02-zstd.dat").read_bytes()[10:12] == b"7\0"


@pytest.mark.needs_tool("/usr/bin/time")
def test_first_use_of_fresh_installs(tmp_path):
    from harmony.probes.tracedat_write import write_tracedat
    raw = write_dir(tmp_path / "raw", {0: _switch_pages(3, 30, 0), 1: _switch_pages(2, 30, 1)})
    dat = write_tracedat(raw, tmp_path / "t.dat")
    out = tmp_path / "first.json"
    # one way (the one with a target): each fresh install is ~20 s of CI
    r = bench("first_use", "--trace", str(dat), "--comm", "w1*", "--reps", "1", "--ways",
              "install.sh", "--json", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "first import within 1.3x of the second (install.sh)" in r.stdout
    res = json.loads(out.read_text())["results"]
    assert [x["way"] for x in res] == ["install.sh"]
    assert res[0]["precompile_s"] > 0 and all(x["events"] == 300 for x in res)
    r = bench("first_use", "--trace", str(tmp_path / "none.dat"))
    assert r.returncode == 2 and "--trace" in r.stderr


def test_suite_configured_seconds(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_suite", BENCH / "suite_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for rel, d in (("a/rep-01", 2.0), ("a/rep-01/static", 3.0), ("b/rep-01", 1.5)):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "manifest.json").write_text(json.dumps({"experiment": rel[0],
                                                                  "params": {"duration": d}}))
    # the suite's own: no params
    (tmp_path / "manifest.json").write_text(json.dumps({"suite": True}))
    total, runs = mod.configured_seconds(tmp_path)
    assert total == 6.5 and len(runs) == 3
    (tmp_path / "c").mkdir()    # a warm release's warm-up is configured time too
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(
        {"experiment": "c", "params": {"duration": 1.0, "release": "warm", "warm_s": 0.25}}))
    assert mod.configured_seconds(tmp_path)[0] == 7.75


def test_guest_profile_reads_each_runs_set_up_and_teardown_from_the_agents_lines(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_guest_profile",
                                                  BENCH / "guest_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = ["[    1.0] boot noise", '@harmony {"event": "facts", "mono_ns": 1000000000}']
    for run, marks in ((0, {"start": 2.0, "measuring": 2.5, "measured": 4.5, "done": 4.75}),
                       (1, {"start": 5.0, "error": 5.25})):
        lines += ["@harmony " + json.dumps({"event": e, "run": run, "mono_ns": int(t * 1e9)})
                  for e, t in marks.items()]
    (tmp_path / "console.log").write_text("\n".join(lines + ["@harmony {broken"]) + "\n")
    assert mod.guest_runs(tmp_path / "console.log") == [
        {"run": 0, "setup_s": 0.5, "teardown_s": 0.25, "failed": False},
        {"run": 1, "setup_s": 0.25, "teardown_s": None, "failed": True}]


def test_vm_suite_reads_when_the_agents_script_started_from_the_kernel_log(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_vm_suite", BENCH / "vm_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    log = tmp_path / "vm-console.log"
    log.write_text("[    4.616830] virtme-ng-init: basic initialization done\n"
                   "[    4.907950] virtme-ng-init: starting script (console fallback)\n"
                   '@harmony {"event": "facts", "mono_ns": 9466979438}\n')
    assert mod.script_start(log) == 4.90795
    log.write_text('@harmony {"event": "facts", "mono_ns": 9466979438}\n')
    assert mod.script_start(log) is None     # a log that does not say: no part made up


def test_suite_breakdown_adds_up_to_the_wall_time(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_suite", BENCH / "suite_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    capture = {"spawn": 0.1, "probe_start": 0.05, "release": 0.01, "measure": 2.02, "stop": 0.03,
               "write": 0.01}
    for rel, figures in (("a/rep-01", 0.5), ("a/rep-02", None)):
        (tmp_path / rel).mkdir(parents=True)
        timings = {"capture": capture, "analysis": {"decode": 0.2, "tables": 0.1, "checks": 0.05,
                                                    "metrics": 0.1}}
        if figures:
            timings["figures"] = figures
        (tmp_path / rel / "manifest.json").write_text(json.dumps({"params": {"duration": 2.0},
                                                                   "timings_s": timings}))
    (tmp_path / "suite.json").write_text(json.dumps({"captured_s": 4.8, "analysed_s": 5.5,
                                                      "wall_with_report_s": 6.0, "analysis": "x"}))
    rows = {r[0].strip(): r[1] for r in mod.where_the_time_goes(tmp_path, 7.0)}
    assert rows["configured durations"] == 4.0
    assert rows["capture: measuring beyond the duration"] == pytest.approx(0.04)
    assert rows["capture: spawn"] == pytest.approx(0.2)
    assert rows["between captures (batch files, experiment setup)"] == pytest.approx(4.8 - 4.44)
    assert rows["analysis, wall (x)"] == pytest.approx(0.7)
    assert rows["analysis: decode (process-seconds)"] == pytest.approx(0.4)
    assert rows["analysis: figures (process-seconds)"] == pytest.approx(0.5)
    assert rows["batch aggregates, policy card, report"] == pytest.approx(0.5)
    assert rows["start-up and exit (imports, host facts, card print)"] == pytest.approx(1.0)
    wall_parts = [v for k, v in rows.items() if not k.startswith("analysis:") and k != "total wall"
                  and k != "configured durations"]
    assert sum(wall_parts) + rows["configured durations"] == pytest.approx(7.0)


# --- kernel: the scripts that run real workloads, at the smallest sizes -------------------------

def test_release_smoke(kernel, tmp_path):
    out = tmp_path / "r.json"
    r = bench("release", "--tasks", "2,4", "--reps", "1", "--duration", "0.2",
              "--placement", "auto,affinity", "--mode", "auto,confined", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "release spread < 1 ms at 4 tasks" in r.stdout
    res = json.loads(out.read_text())["results"]
    ways = [("auto", "auto"), ("auto", "confined"), ("affinity", "auto"), ("affinity", "confined")]
    assert [(x["tasks"], tuple(x["way"])) for x in res] == [(n, w) for n in (2, 4) for w in ways]
    assert {x["method"].split("/")[0] for x in res if x["way"][0] == "affinity"} == {"affinity"}
    assert {x["method"].split("/")[1] for x in res if x["way"][1] == "confined"} == {"confined"}
    assert all(x["not_woken"] == 0 and x["woke_off"] == 0 for x in res)


def test_duty_smoke(kernel, tmp_path):
    out = tmp_path / "d.json"
    r = bench("duty", "--duties", "50", "--reps", "1", "--duration", "0.6", "--warmup", "0.1",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["results"][0]
    assert res["requested"] == 50 and 0 < res["achieved"] <= 100


def test_observer_smoke(kernel, tmp_path):
    out = tmp_path / "o.json"
    r = bench("observer", "--pairs", "2", "--seconds", "0.2", "--rates", "200", "--pp-pairs", "1",
              "--pp-seconds", "0.3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    w = res["work"]
    assert len(w["off"]) == len(w["on"]) == len(w["ratios"]) == 2 and min(w["off"] + w["on"]) > 0
    assert w["events"] > 0 and w["loss_ci95"][0] <= w["loss"] <= w["loss_ci95"][1]
    assert res["lossless"]["levels"][0]["events"] > 0


def test_probes_smoke(kernel, tmp_path):
    from harmony.probes.pyperf import PyperfProbe

    ok, why = PyperfProbe.available()
    if not ok:
        host_skip(why)
    out = tmp_path / "p.json"
    r = bench("probes", "--probes", "tracefs,pyperf", "--reps", "1", "--seconds", "0.1",
              "--rounds", "1", "--window", "0.3", "--reader-window", "0.2", "--small-kb", "0",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert set(res["start_stop"]) == {"tracefs", "pyperf"}
    [row] = res["storm"]["runs"]["pyperf"]
    assert row["events_s"] > 0 and row["rounds_s"] > 0
    assert res["reader"]["binding_events"] > 0 and res["reader"]["probe_events"] > 0


def test_pelt_warmup_smoke(kernel, tmp_path):
    out = tmp_path / "p.json"
    r = bench("pelt_warmup", "--tasks", "2", "--warm", "0.3", "--reps", "1", "--every", "0.01",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "default warm_s covers PELT's convergence" in r.stdout
    res = json.loads(out.read_text())
    assert res["tasks"] == 2 and len(res["reps"]) == 1
    assert set(res["reps"][0]["warm"]) == {"load_avg", "runnable_avg", "util_avg"}


def test_warm_cold_smoke(kernel, tmp_path):
    out = tmp_path / "w.json"
    r = bench("warm_cold", "--reps", "1", "--duration", "0.5", "--experiments", "single-source",
              "--out", str(tmp_path / "runs"), "--json", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "policy card (each release's runs alone)" in r.stdout
    res = json.loads(out.read_text())
    runs = res["results"]["single-source"]
    assert [len(runs[k]) for k in ("warm", "cold")] == [1, 1]
    assert all("error" not in g for k in ("warm", "cold") for g in runs[k]), runs
    assert set(res["cards"]) == {"warm", "cold"}
    r = bench("warm_cold", "--experiments", "detection")
    assert r.returncode == 2 and "unknown experiment(s) detection" in r.stderr


def test_fidelity_smoke_on_the_host(kernel, tmp_path):
    """The study's plan run on the host only (the reference; a VM set-up boots the same way
    through the VmRunner the VM tests exercise): its figures come out of real runs."""
    out = tmp_path / "f.json"
    r = bench("fidelity", "--host", "--vm-cpus", "", "--reps", "1", "--out", str(tmp_path / "runs"),
              "--json", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    ((label, row),) = json.loads(out.read_text())["setups"].items()
    assert label.startswith("host-p") and label in r.stdout
    assert row["runs"] == 3 and row["card_runs"] == 2 and row["wait_max"] is None
    assert set(row["card"]) == {"balances", "time_to_balance", "detection"}
    assert 0 <= row["duty_worst_pp"] <= 50 and row["release_ms_median"] >= 0
    for sub in ("single-source", "detection", "duty"):
        assert (tmp_path / "runs" / label / sub / "batch.json").is_file()
    assert bench("fidelity", "--setup", "fast", "--host").returncode == 2


def test_waking_on_a_recording_with_both_events(tmp_path):
    """Task 11 woken three times on CPU 0 (sched_waking then sched_wakeup 2 us later), once moved
    to CPU 1 by its wake-up; one wake-up's sched_wakeup is missing."""
    f = parsed_formats(FORMATS_WAKING)
    b = PageBuilder(1_000_000_000)

    def wake(kind, target):
        return encode(f[f"sched/{kind}"], dict(common_pid=0, comm="w", pid=11, prio=120,
                                               target_cpu=target))

    def switch(prev, nxt, state):
        return encode(f["sched/sched_switch"], dict(common_pid=prev, prev_comm="w", prev_pid=prev,
                                                    prev_prio=120, prev_state=state, next_comm="w",
                                                    next_pid=nxt, next_prio=120))
    move = encode(f["sched/sched_migrate_task"], dict(common_pid=0, comm="w", pid=11, prio=120,
                                                      orig_cpu=0, dest_cpu=1))
    for k, (placed, recorded) in enumerate([(False, True), (True, True), (False, False)]):
        b.event(wake("sched_waking", 0), 1_000_000)
        if placed:
            b.event(move, 1000)
        if recorded:
            b.event(wake("sched_wakeup", 1 if placed else 0), 2000)
        b.event(switch(0, 11, 0), 50_000)
        b.event(switch(11, 0, 1), 50_000)
    raw = write_dir(tmp_path / "run" / "raw" / "tracefs", {0: [b.page()]}, FORMATS_WAKING)
    out = tmp_path / "waking.json"
    r = bench("waking", str(tmp_path / "run"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert str(raw) in r.stdout and "3 wake-ups derived, 2 recorded; 2 matched" in r.stdout
    total = json.loads(out.read_text())["total"]
    assert (total["same_cpu"], total["placed"], total["pulls"]) == (2, 1, 0)
    assert total["early_us_median"] == pytest.approx(2.0)   # sched_wakeup: 2 us after either
    r = bench("waking", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no tracefs recording" in r.stderr


def test_compare_noise_at_tiny_sizes(tmp_path):
    """The chance rate of compare's marks, on a few draws and two simulated batches (no root)."""
    out = tmp_path / "noise.json"
    r = bench("compare_noise", "--sizes", "2,5", "--trials", "5", "--suites", "2", "--cpus", "2",
              "--repeat", "2", "--experiment", "how-many", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "interval excludes 0" in r.stdout and "chance marks, normal, 5 runs a side" in r.stdout
    res = json.loads(out.read_text())
    assert [d["runs"] for d in res["draws"]] == [2, 5, 2, 5]
    assert all(d["marked"] == 0 for d in res["draws"] if d["runs"] == 2)   # too few: never marked
    assert len(res["simulated"]["pairs"]) == 1
    r = bench("compare_noise", "--sizes", "1")
    assert r.returncode == 2 and "--sizes" in r.stderr


def test_sequential_rule_prints_its_exact_operating_characteristic(tmp_path):
    """The verdict rule's operating characteristic (exact, no root): its targets at the default
    cap, and a bad --caps refused."""
    out = tmp_path / "rule.json"
    r = bench("sequential_rule", "--caps", "8,20", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "[PASS] a decided label is wrong at most 5 % of the time" in r.stdout
    res = json.loads(out.read_text())
    assert res["fewest"]["2"] == [6, 11, 15] and len(res["oc"]) == 2 * 7
    assert res["peeking"]["fixed-n"] > 0.05 > res["peeking"]["anytime"]
    r = bench("sequential_rule", "--caps", "1", "--start", "2")
    assert r.returncode == 2 and "--start" in r.stderr


def test_until_decided_summarises_a_suite_run_until_decided(tmp_path, monkeypatch):
    """The runs each question took, from a suite's record (made here on a runner of drawn
    labels, tests/test_until_decided.py), and a directory that is no such suite refused."""
    from test_until_decided import CPUS, PARAMS, LabelRunner, _policy

    from harmony import suite
    from harmony.analysis import report_suite

    monkeypatch.setattr(report_suite, "write", lambda out, note=None: None)
    configs = [suite.Config("how-many", {}, 2, "how-many", params=dict(PARAMS))]
    suite.run_suite(configs, CPUS, tmp_path / "s", LabelRunner(_policy("poly-balance")),
                    quiet=True, until_decided=20)
    out = tmp_path / "u.json"
    r = bench("until_decided", str(tmp_path / "s"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "[PASS] every question decided or varies within the cap: card 1 of 1" in r.stdout
    res = json.loads(out.read_text())["suites"][0]
    assert res["per_config"] == [{"config": "how-many", "qid": "how_many", "runs": 7,
                                  "counted": 7, "state": "decided", "label": "poly-balance",
                                  "votes": 7}]
    assert [(a["qid"], a["state"], a["path"]) for a in res["card"]] == \
        [("how_many", "decided", "pooled")]
    r = bench("until_decided", str(tmp_path))
    assert r.returncode == 2 and "suite.json" in r.stderr


@pytest.mark.kernel
@pytest.mark.needs_tool("perf", "/usr/bin/time")
@pytest.mark.parametrize("layout", ["file", "pipe"])
def test_perf_import_of_a_small_recording(kernel, tmp_path, layout):
    """perf_import.py records a ping-pong with perf (to a file, or to a pipe: --pipe) and runs
    its table on it."""
    out = tmp_path / "perf.json"
    r = bench("perf_import", "--sizes", "2e4", "--reps", "1", "--traces", str(tmp_path / "t"),
              "--json", str(out), *(["--pipe"] if layout == "pipe" else []), timeout=600)
    if r.returncode and "perf record failed" in r.stderr:
        host_skip(f"perf cannot record here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr
    assert "target harmony import >= 5x perf script:" in r.stdout
    [row] = json.loads(out.read_text())["rows"]
    assert row["events"] > 0 and row["import_peak_mb"] > 0
    [data] = (tmp_path / "t").glob("pingpong-*.data")
    assert data.name.endswith(".pipe.data") == (layout == "pipe")
    assert (data.read_bytes()[8:16] == (16).to_bytes(8, "little")) == (layout == "pipe")


@pytest.mark.needs_tool("trace-cmd")
def test_foreign_trace_reads_a_recording_with_ties(tmp_path):
    """--from a trace.dat whose two CPUs stamped a wake-up and a switch-out alike (as the TCG
    guest's did): the table says how many repairs the merged order cost and Harmony's did not."""
    from harmony.analysis.event_streams import Stream
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat

    s = Stream({301: "sched-messaging", 900: "other"})
    s.switch(1_000, 1, prev=0, state=0, next=301)
    s.migrate(5_000, 0, pid=301, orig=1, dest=0, common_pid=900)
    s.wakeup(5_000, 0, pid=301, target=0, common_pid=900)
    s.switch(5_000, 1, prev=301, state=1, next=0)
    s.switch(6_000, 0, prev=0, state=0, next=301)
    s.switch(9_000, 0, prev=301, state=1, next=0)
    events = s.events()
    write_recording(events, events.iloc[:0][["ts", "cpu"]].assign(pid=0, text=""),
                    {"cpus": [0, 1], "clock": "global"}, tmp_path / "raw")
    src = tmp_path / "files"
    src.mkdir()
    write_tracedat(tmp_path / "raw", src / "hackbench-tc.dat")
    out = tmp_path / "out.json"
    r = bench("foreign_trace", "--from", str(src), "--out", str(tmp_path / "runs"), "--json",
              str(out))
    assert r.returncode == 0, r.stderr
    assert "repairs merged" in r.stdout
    [x] = json.loads(out.read_text())["results"]
    assert x["events"] == 6 and x["ties"]["reordered"] == 1 and x["ties"]["pairs"] == 1
    assert x["repairs_merged"] > 0 and x["repairs"] == 0
    assert x["unrecorded_merged"] > 0 and x["unrecorded"] == 0
    assert x["harmony_s"] > 0 and x["reference_s"] > 0
