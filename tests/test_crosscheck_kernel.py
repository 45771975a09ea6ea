"""Cross-checks against the kernel's own view: sched debug nr_running, and lost events.

Hermetic tests parse a canned sched debug file and compare hand-made run queues; kernel tests run
real experiments (a few seconds each) and skip with the reason where the host cannot trace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from harmony.analysis.crosscheck import nr_running_agreement
from harmony.probes import ProbeError
from harmony.probes import sched_debug

from conftest import host_skip, measure_quietly, single_source_run

# the kernel's text as it is; each wide row of a table is cut in three by a backslash-newline,
# which the string does not hold
DEBUG_TEXT = """Sched Debug Version: v0.11, 6.18.44 #1
ktime                                   : 1005404.713959
sched_clk                               : 1005434.846400

sysctl_sched
  .sysctl_sched_base_slice                 : 1.400000

cpu#0, 2445.424 MHz
  .nr_running                    : 2
  .nr_switches                   : 652462
  .curr->pid                     : 77

cfs_rq[0]:/
  .nr_queued                     : 2
  .h_nr_runnable                 : 2

runnable tasks:
 S            task   PID       vruntime   eligible    deadline             slice        \
  sum-exec      switches  prio         wait-time        sum-sleep    \
   sum-block  node   group-id  group-path
----------------------------------------------------------------------------------------\
---------------------------------------------------------------------\
----------------------------------
 S     process_api     1    231807.774205   E      231809.156972           1.400000     \
  238.618141       643     120         0.000000         0.000000     \
    0.000000   0      0        /
>R         hmy-w00   501    232981.732112   E      232983.093498           1.400000     \
 1084.970870      7000     120         0.000000         0.000000     \
    0.000000   0      0        /
 R  tokio worker 7   502    232982.306396   E      232983.640764           1.400000     \
  993.868349      6833     120         0.000000         0.000000     \
    0.000000   0      0        /

cpu#1, 2445.424 MHz
  .nr_running                    : 0
  .nr_switches                   : 1000

runnable tasks:
 S            task   PID       vruntime   eligible    deadline             slice        \
  sum-exec      switches  prio         wait-time        sum-sleep    \
   sum-block  node   group-id  group-path
----------------------------------------------------------------------------------------\
---------------------------------------------------------------------\
----------------------------------
 D         hmy-w01   503    106.491175   E         107.829521           1.400000        \
 0.081090         2     120         0.000000         0.000000        \
 0.000000   0      0        /
"""


def test_parse_sched_debug():
    v = sched_debug.parse(DEBUG_TEXT)
    assert v.ktime_ns == 1_005_404_713_959  # ms with 6 decimals -> ns
    assert v.cpus[0].nr_running == 2 and v.cpus[1].nr_running == 0
    assert [t[0] for t in v.cpus[0].tasks] == [1, 501, 502]
    assert v.cpus[0].runnable() == [501, 502]
    assert v.cpus[0].tasks[1][2] is True                 # ">R": the CPU's current task
    assert v.cpus[0].tasks[2][3] == "tokio worker 7"     # a comm with spaces and digits
    assert v.cpus[1].tasks == [(503, "D", False, "hmy-w01")]


def test_parse_rejects_other_text():
    with pytest.raises(sched_debug.SchedDebugError, match="no cpu#N block"):
        sched_debug.parse("hello\nworld\n")
    with pytest.raises(sched_debug.SchedDebugError, match="nr_running"):
        sched_debug.parse("cpu#0, 1 MHz\n  .nr_switches : 3\n")


def _samples(rows):
    """rows: (t_us, cpu, nr_running, reader, others[, listed]); window +-5 us around t."""
    rows = [r if len(r) == 6 else (*r, r[2]) for r in rows]
    df = pd.DataFrame(rows, columns=["t", "cpu", "nr_running", "reader", "others", "listed"])
    ts = 1_000_000 + df["t"] * 1000
    return pd.DataFrame({"ts": ts, "lo": ts - 5000, "hi": ts + 5000,
                         "cpu": df["cpu"].astype("int16"),
                         "nr_running": df["nr_running"], "listed_runnable": df["listed"],
                         "experiment": df["nr_running"] - df["reader"] - df["others"],
                         "reader": df["reader"], "others": df["others"],
                         "other_comms": np.where(df["others"] > 0, "bash", "")})


def _runqueue():
    # cpu 0: 2 tasks until t=100 us, then 1; cpu 1: 0 until t=100 us, then 1
    ts = np.array([0, 0, 100, 100]) * 1000 + 1_000_000
    return pd.DataFrame({"ts": ts, "t": 0.0, "cpu": [0, 1, 0, 1], "nr": [2, 0, 1, 1]})


def test_nr_running_agreement_counts_clean_samples_and_windows():
    s = _samples([
        (50, 0, 3, 1, 0), (50, 1, 0, 0, 0),      # clean; the reader is subtracted on cpu 0
        (100, 0, 2, 0, 0), (100, 1, 0, 0, 0),    # the change at 100 us lies inside the window
        (150, 0, 1, 0, 0), (150, 1, 2, 0, 1),    # cpu 1 ran a foreign task: not clean
        (200, 0, 5, 0, 0), (200, 1, 1, 0, 0),    # clean but wrong
        (250, 0, 2, 0, 0, 1), (250, 1, 1, 0, 0),  # cpu 0 counts a task it does not list: not clean
    ])
    out = nr_running_agreement(_runqueue(), s, [0, 1], 1_000_000, 2_000_000)
    assert out["samples"] == 5 and out["clean"] == 3 and out["agreeing"] == 2
    assert out["agreement"] == pytest.approx(2 / 3)
    assert out["agreement_at_midpoint"] == pytest.approx(1 / 3)  # at 100 us exactly it is 1, not 2
    assert out["busy_comms"] == {"bash": 1}
    assert out["disagreements"] == [{"t": 0.0002, "cpu": 0, "kernel": 5, "rebuilt_min": 1,
                                     "rebuilt_max": 1}]
    assert out["cpu_clean"] == 8 and out["cpu_agreeing"] == 7
    assert out["adjusted_agreement"] == pytest.approx(3 / 5)
    assert out["count_list_mismatch"] == 1


def test_nr_running_agreement_without_clean_samples():
    s = _samples([(50, 0, 3, 0, 1), (50, 1, 1, 0, 1)])
    out = nr_running_agreement(_runqueue(), s, [0, 1], 1_000_000, 2_000_000)
    assert out["samples"] == 1 and out["clean"] == 0 and out["agreement"] is None


# --- kernel: nr_running during a real run ---------------------------------------------------------

#: what the nr_running agreement is judged on, at least: samples, and clean ones (only experiment
#: tasks runnable on the CPU set); 0.99 agreement over 10 clean samples allows no disagreement
MIN_SAMPLES, MIN_CLEAN = 12, 10


def test_rebuilt_runqueue_matches_kernel_nr_running(kernel, tmp_path):
    ok, why = sched_debug.available()
    if not ok:
        host_skip(why)
    # The sampler takes at most ~1 % of a CPU: after each sweep it sleeps 100 times the CPU time
    # the sweep took, so how many samples a window holds is the host's (15-25 Hz here, fewer where
    # /proc is slower to read), not a result. The agreement is judged on enough samples with only
    # experiment tasks runnable: a run that has too few is measured again, longer.
    def busy(run):
        ka = run.manifest["kernel_nr_running_agreement"]
        if ka["samples"] < MIN_SAMPLES:
            return (f"the sampler made {ka['samples']} samples, fewer than the {MIN_SAMPLES} the "
                    "check needs (it sleeps 100 times the CPU time each sweep took)")
        return ka["clean"] < MIN_CLEAN and (
            f"host busy: only {ka['clean']} of {ka['samples']} samples had only experiment tasks "
            f"runnable on the CPU set (others: {ka['busy_comms']}); adjusted agreement "
            f"{ka['adjusted_agreement']:.1%}")

    # each run again long enough for the samples at the rate the last one got (a slow sitting of
    # the host gave CI 7, 6 and 9 samples in runs of 3, 6 and 9 s: sweeps of 8-15 ms of CPU)
    lengths = [3.0]

    def measure(k):
        run = single_source_run(tmp_path / f"run{k}", lengths[-1], sample_hz=50.0)
        got = run.manifest["kernel_nr_running_agreement"]["samples"]
        lengths.append(min(60.0, max(2 * lengths[-1],
                                     1.5 * lengths[-1] * MIN_SAMPLES / max(1, got))))
        return run

    run = measure_quietly(measure, busy)
    m = run.manifest
    assert m["kernel_nr_running"]["sampled"], m["kernel_nr_running"]
    samples = run.table("kernel_nr_running")
    assert set(samples["cpu"]) == set(m["cpus"])
    ka = m["kernel_nr_running_agreement"]
    assert ka["samples"] >= MIN_SAMPLES
    # the samples reach both ends of the run: within the sampler's own cadence (it may be asleep
    # when the run starts or ends): its longest interval between samples, or the longest sleep
    # it chose (SWEEP_BUDGET times a loop's CPU time: CI once had the run end 1.55 s after the
    # last sample, when the loop's length was still wall time, GIL waits included), plus 0.1 s;
    # 0.3 s at least. A sampler that stopped early still fails.
    stamps = np.unique(samples["ts"].to_numpy())
    slept = m["kernel_nr_running"]["longest_sleep_s"] * 1e9
    reach = max(0.3e9, max(float(np.diff(stamps).max(initial=0)), slept) + 0.1e9)
    assert stamps.min() < m["t0_ns"] + reach and stamps.max() > m["end_ns"] - reach, (
        reach, stamps.min() - m["t0_ns"], m["end_ns"] - stamps.max())
    # the comparison can fail: one task too many on the first CPU is seen as a disagreement
    wrong = run.runqueue.assign(nr=run.runqueue["nr"] + (run.runqueue["cpu"] == m["cpus"][0]))
    bad = nr_running_agreement(wrong, samples, m["cpus"], m["t0_ns"], m["end_ns"])
    assert bad["adjusted_agreement"] < 0.5
    assert ka["clean"] >= MIN_CLEAN   # a quiet run (measured again while the host was busy)
    assert ka["agreement"] >= 0.99, ka
    assert bad["agreement"] < 0.5
    assert "kernel agreement (nr_running)" in (run.path / "report.md").read_text()


# --- lost events: a tiny buffer whose drains stall must overflow, and the run must say so ---------

def test_bad_expert_option_is_one_line(monkeypatch, tmp_path):
    from harmony.probes.tracefs import TracefsProbe

    monkeypatch.setenv("HARMONY_TRACEFS_DRAIN_STALL", "soon")
    with pytest.raises(ProbeError,
                       match="HARMONY_TRACEFS_DRAIN_STALL='soon': expected AFTER:SECONDS"):
        TracefsProbe(tmp_path, [0], 1.0)
    monkeypatch.delenv("HARMONY_TRACEFS_DRAIN_STALL")
    monkeypatch.setenv("HARMONY_TRACEFS_BUFFER_KB", "-3")
    with pytest.raises(ProbeError, match="not a positive integer"):
        TracefsProbe(tmp_path, [0], 1.0)


def test_lost_events_are_detected_and_reported(kernel, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, HARMONY_TRACEFS_BUFFER_KB="16", HARMONY_TRACEFS_DRAIN_STALL="0.5:1")
    for _ in range(60):
        r = subprocess.run([sys.executable, "-m", "harmony.cli", "run", "single-source",
                            "--layout", "8,0", "-p", "duty=30", "--duration", "2.5",
                            "--out", str(out), "-q", "-v"],
                           env=env, capture_output=True, text=True, timeout=120)
        if r.returncode == 0 or "another Harmony run" not in r.stderr:
            break
        time.sleep(2)  # the host lock is held by another run
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    stats = m["probe_meta"]["stats"]
    dropped = sum(int(s["dropped events"]) + int(s["overrun"]) for s in stats.values())
    assert dropped > 0, stats                      # the kernel did drop events
    assert m["lost_events"] == dropped             # ... and every one of them is counted
    assert m["probe_meta"]["buffer_kb_per_cpu"] == 16 \
        and m["probe_meta"]["drain_stall_s"] == [0.5, 1.0]
    lost_note = f"{dropped} events were lost by the probe"
    assert any(lost_note in n for n in m["notes"]), m["notes"]
    assert any("HARMONY_TRACEFS_DRAIN_STALL" in n for n in m["notes"])
    assert f"lost events                  {dropped}" in r.stdout      # the run says so
    assert lost_note in r.stdout
    report = (out / "report.md").read_text()
    assert f"lost events                  {dropped}" in report and lost_note in report
    # the workers' own counters see the switches the trace lost, and the notes say so
    kc = m["kernel_counter_agreement"]         # read in every run: never silently absent
    assert kc is not None, m.keys()
    assert kc["switches"]["trace"] < kc["switches"]["kernel"] and kc["disagreeing"] > 0, kc
    assert any("disagrees with the kernel's own counters" in n and "events were lost" in n
               for n in m["notes"])
