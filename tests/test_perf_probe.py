"""The perf probe and the probe cross-check.

Hermetic tests feed ``perf script`` text and ``perf report --stats`` text to the parsers and
synthetic tables to the matcher. Kernel tests (root, tracefs and a working perf; skipped with the
reason otherwise) record real runs of single-source <4,0>: perf alone, tracefs + perf at once
(``--crosscheck perf``), and tracefs under an independent ``perf record`` the test starts itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harmony.analysis.probe_agreement import (TOL_NS, df_migration_agreement, df_run_agreement,
                                              match_times)
from harmony.probes.base import ProbeError, TraceCorrupt
from harmony.probes.perf import PerfProbe
from harmony.probes.perf_data import (check_perf_data, clock_name, lost_samples_by_event,
                                      lost_sched_events, run_perf_report)
from harmony.probes.perf_script import PerfScriptParser, prev_state_value, run_perf_script
from harmony.probes.perf_tool import first_error_line

from conftest import host_skip, retry_busy

# --------------------------------------------------------------------------------- hermetic: parser

# perf script's text; a line that ends in a backslash goes on in the next: the string holds
# no newline there
SCRIPT = """\
 6468 [000]   354.805768520:       sched:sched_switch: prev_comm=perf prev_pid=6468 prev_prio=120 \
prev_state=S ==> next_comm=Web Content next_pid=42 next_prio=120
   42 [000]   354.805770000:       sched:sched_switch: prev_comm=Web Content prev_pid=42 \
prev_prio=120 prev_state=R+ ==> next_comm=swapper/0 next_pid=0 next_prio=120
    0 [001]   354.805771001: sched:sched_migrate_task: comm=hmy-w00 pid=77 prio=120 orig_cpu=0 \
dest_cpu=1
    0 [001]   354.805772002:      sched:sched_waking: comm=hmy-w00 pid=77 prio=120 target_cpu=001
 5525 [000]   354.805773000: PERF_RECORD_LOST lost 7
       perf-exec 20671 [001]  354.805774000: PERF_RECORD_LOST lost 3
    0 [001]   354.805775000:  sched:sched_process_exit: comm=hmy-w00 pid=77 prio=120 group_dead=1
    0 [000]   354.805776000:       timer:hrtimer_start: hrtimer=0xffff888627c1c6f8 \
function=tick_nohz_handler expires=33804308000000 softexpires=33804308000000 mode=0xa was_armed=1
    0 [001]   354.805777000:         irq:softirq_raise: vec=7 [action=SCHED]
    0 [001]   354.805778000:  sched:sched_stat_runtime: comm=hmy-w00 pid=77 runtime=329565 [ns]
this line is not perf script output
"""

# samples of other events in a recording that also sampled them, as `perf script -F
# trace:tid,cpu,time,event,trace -G` prints them: perf's default fields, with the CPU if recorded
# (a backslash at the end of a line, as in SCRIPT, cuts a long line in two)
OTHER_SAMPLES = """\
     migration/0    18 [000] 11290.807175068:     250000                              cpu-clock:  \
ffffffff82203249 _raw_spin_unlock_irqrestore+0x19 ([kernel.kallsyms])
         swapper     0 [000] 11290.811173964:     250000                              cpu-clock:\x20
 Web Content 2 4242 [001] 11290.811200000:          1 cycles:u:  7f1690514af7 [unknown] \
(/tmp/perf-11120.map)
          python 11120  1099.335764939:     200040 cpu-clock:pppH:\x20
"""


def test_parser_decodes_every_event_kind_and_counts_losses_and_bad_lines():
    p = PerfScriptParser()
    data = SCRIPT.encode()
    for i in range(0, len(data), 37):  # chunk boundaries inside lines must not matter
        p.feed(data[i:i + 37])
    p.finish()
    ev = p.events()
    assert list(ev["event"].astype(str)) == ["sched_switch", "sched_switch", "sched_migrate_task",
                                             "sched_waking", "sched_process_exit"]
    assert ev["ts"].iloc[0] == 354_805_768_520
    first = ev.iloc[0]
    assert (first["comm"], first["pid"], first["prev_pid"], first["prev_state"]) \
        == ("Web Content", 42, 6468, 1)
    assert ev.iloc[1]["prev_state"] == 0 and ev.iloc[1]["prev_comm"] == "Web Content"
    mig = ev.iloc[2]
    assert (mig["pid"], mig["orig_cpu"], mig["target_cpu"], mig["cpu"]) == (77, 0, 1, 1)
    assert ev.iloc[3]["target_cpu"] == 1
    assert p.lost_by_cpu == {0: 7, 1: 3}
    assert p.bad_lines == 1 and "not perf script output" in p.bad_examples[0]
    # other subsystems' events are counted by name (as the trace.dat decoder names them), not bad
    assert p.other_events == {"timer:hrtimer_start": 1, "irq:softirq_raise": 1,
                              "sched_stat_runtime": 1}
    bad, ignored = p.notes()
    assert bad.startswith("1 perf script lines did not parse") and "not perf script" in bad
    assert "sched_stat_runtime': 1" in ignored and "(sched_switch, " in ignored


def test_parser_counts_samples_of_other_events_by_name_not_as_bad_lines():
    p = PerfScriptParser()
    p.feed((SCRIPT.splitlines(keepends=True)[0] + OTHER_SAMPLES).encode())
    p.finish()
    assert list(p.events()["event"].astype(str)) == ["sched_switch"]
    assert p.bad_lines == 0, p.bad_examples
    assert p.other_events == {"cpu-clock": 2, "cycles:u": 1, "cpu-clock:pppH": 1}


def test_only_the_decoded_sched_events_count_as_lost():
    # perf's counters for a recording that also sampled cpu-clock and sched_stat_runtime
    samples = {"sched:sched_switch": 5, "sched:sched_stat_runtime": 7, "cpu-clock": 11,
               "dummy:HG": 2, "sched:sched_waking": 0}
    lost, notes = lost_sched_events(25, samples)
    assert lost == 5
    assert len(notes) == 1 and notes[0].startswith("20 records of events Harmony does not decode")
    assert "'cpu-clock': 11" in notes[0] and "sched_waking" not in notes[0]
    # lost records the per-event counts do not explain are taken as sched events
    lost, notes = lost_sched_events(30, samples)
    assert lost == 10 and "PERF_RECORD_LOST total 30 != LOST_SAMPLES total 25" in notes[1]
    assert lost_sched_events(3, None)[0] == 3


def _header(*clocks) -> str:
    """perf report --header-only lines of sched events recorded with these clockids (None: no
    -k)."""
    lines = ["# cmdline : /usr/bin/perf record -a -e sched:*"]
    for k, c in enumerate(clocks):
        extra = "" if c is None else f", use_clockid = 1, clockid = {c}"
        lines.append(f"# event : name = sched:ev{k}, , id = {{ {k} }}, type = 2, sample_id_all = 1"
                     f"{extra}")
    lines.append("# event : name = dummy:HG, , id = { 99 }, type = 1, use_clockid = 1, clockid = 1")
    return "\n".join(lines)


@pytest.mark.parametrize("clocks,name", [((1, 1), "mono"), ((4,), "mono_raw"), ((7,), "boot"),
                                         ((None, None), "perf (sched_clock, perf's default)"),
                                         ((5,), "clockid 5"), ((1, 4), "mixed clockids [1, 4]"),
                                         ((1, None), "mixed clockids [1, None]")])
def test_clock_of_a_perf_data_is_named_from_its_header(clocks, name):
    assert clock_name(_header(*clocks)) == name


@pytest.mark.parametrize("text,bits", [("R", 0), ("R+", 0), ("S", 1), ("D", 2), ("D|K", 2),
                                       ("I", 128), ("0x402", 0x402), ("?", -1)])
def test_prev_state_value(text, bits):
    assert prev_state_value(text) == bits


STATS = """
Aggregated stats:
           TOTAL events:      95137
            LOST events:         46  ( 0.0%)
    LOST_SAMPLES events:          5  ( 0.0%)
sched:sched_switch stats:
          SAMPLE events:      57900
    LOST_SAMPLES events:        809
sched:sched_waking stats:
          SAMPLE events:      30726
    LOST_SAMPLES events:        531
dummy:HG stats:
    LOST_SAMPLES events:         28
"""


def test_lost_samples_are_per_event_and_skip_the_aggregated_record_count():
    assert lost_samples_by_event(STATS) == {"sched:sched_switch": 809, "sched:sched_waking": 531,
                                            "dummy:HG": 28}
    assert lost_samples_by_event("nothing here") is None


@pytest.mark.parametrize("content,why", [(b"", "bad magic"), (b"x" * 500, "bad magic"),
                                         (b"PERFILE2" + bytes(96), "did not finish")])
def test_check_perf_data_names_the_file(tmp_path, content, why):
    path = tmp_path / "perf.data"
    path.write_bytes(content)
    with pytest.raises(TraceCorrupt, match=why) as exc:
        check_perf_data(path)
    assert str(path) in str(exc.value)


def test_first_error_line_is_the_line_that_tells():
    assert first_error_line("Events disabled\nError:\nNo permission to enable sched:sched_switch"
                            "\nHint: ...") == "No permission to enable sched:sched_switch"
    assert first_error_line("  \nreading\n invalid option -- 'x'\nusage: perf") == \
        "invalid option -- 'x'"
    assert first_error_line("last words\n[ perf record: Woken up 1 times ]\n") == "last words"
    assert first_error_line("\n \n") == "no output"


def test_perf_report_and_script_failures_name_the_file(tmp_path):
    fake = tmp_path / "perf"
    fake.write_text("#!/bin/sh\necho 'Error:' >&2\necho 'cannot open the data: bad' >&2\nexit 3\n")
    fake.chmod(0o755)
    path = tmp_path / "perf.data"
    with pytest.raises(TraceCorrupt, match=r"perf report --stats failed \(exit 3\): cannot open") \
            as exc:
        run_perf_report(str(fake), path, "--stats")
    assert str(exc.value).startswith(f"{path}: ")
    with pytest.raises(TraceCorrupt, match=r"perf script failed \(exit 3\): cannot open") as exc:
        run_perf_script(str(fake), path)
    assert str(exc.value).startswith(f"{path}: ")


def test_decode_of_a_missing_recording_names_the_file(tmp_path):
    with pytest.raises(TraceCorrupt, match=str(tmp_path / "perf.data")):
        PerfProbe.decode_dir(tmp_path)


# -------------------------------------------------------------------------------- hermetic: matcher

def _migrations(rows):
    return pd.DataFrame(rows, columns=["ts", "pid", "src_cpu", "dst_cpu", "kind"])


def test_match_times_is_one_to_one_and_in_order():
    key = np.array([1, 1, 1])
    ia, ib = match_times(key, np.array([100, 200, 300]), key[:2], np.array([205, 290]), 20)
    assert list(ia) == [-1, 0, 1] and list(ib) == [1, 2]


def test_migration_agreement_matches_within_tolerance_and_reports_the_rest():
    t0, t_end = 1_000_000, 10_000_000
    a = _migrations([(2_000_000, 7, 0, 1, "balance"), (3_000_000, 7, 1, 0, "balance"),
                     (4_000_000, 8, 0, 1, "wakeup"), (500_000, 8, 1, 0, "balance")])
    b = _migrations([(2_000_003, 7, 0, 1, "balance"), (3_000_000 + TOL_NS + 1, 7, 1, 0, "balance"),
                     (4_000_000, 8, 1, 0, "wakeup")])
    m = df_migration_agreement(a, b, t0, t_end)
    assert (m["status"] == "matched").sum() == 1
    assert m.loc[m["status"] == "matched", "dt"].item() == 3
    # late twin and wrong direction; ts 500_000 < t0 dropped
    assert (m["status"] == "only_a").sum() == 2
    assert (m["status"] == "only_b").sum() == 2


def test_run_agreement_pairs_one_switch_stamped_far_apart():
    """The two probes' handlers of one switch ran 1.1 ms apart (a vCPU stall, seen in CI): the
    run it ends and the run it starts are paired, with the shift in dend/dstart; a switch one
    probe lacks stays unmatched."""
    t0, t_end = 0, 100_000_000
    cols = ["pid", "cpu", "start", "end"]
    shift = 2 * TOL_NS + 84_155
    a = pd.DataFrame([(5, 0, 1_000_000, 4_000_000), (6, 0, 4_000_000, 6_000_000)], columns=cols)
    b = pd.DataFrame([(5, 0, 1_000_002, 4_000_000 - shift), (6, 0, 4_000_000 - shift, 6_000_001)],
                     columns=cols)
    r = df_run_agreement(a, b, t0, t_end)
    assert (r["status"] == "matched").all() and len(r) == 2
    assert sorted(r["dend"].tolist() + r["dstart"].tolist()) == [-shift, -shift, 1, 2]
    # b lacks the switch: one long run of 5 where a has 5 then 6: nothing to pair
    b = pd.DataFrame([(5, 0, 1_000_002, 6_000_001)], columns=cols)
    assert df_run_agreement(a, b, t0, t_end)["status"].value_counts().to_dict() \
        == {"only_a": 2, "only_b": 1}


def test_run_agreement_clips_to_the_window_and_needs_both_ends():
    t0, t_end = 1_000, 100_000
    cols = ["pid", "cpu", "start", "end"]
    a = pd.DataFrame([(5, 0, 0, 2_000), (5, 0, 10_000, 20_000), (5, 1, 30_000, 40_000)],
                     columns=cols)
    b = pd.DataFrame([(5, 0, 500, 2_001), (5, 0, 10_002, 20_000), (5, 1, 30_000, 41_000 + TOL_NS)],
                     columns=cols)
    r = df_run_agreement(a, b, t0, t_end)
    assert r["status"].value_counts().to_dict() == {"matched": 2, "only_a": 1, "only_b": 1}
    # first run clipped at t0 - tol
    assert sorted(r.loc[r["status"] == "matched", "dstart"]) == [2, 500]


def _events(rows):
    """Canonical events from (ts, cpu, event, common_pid, pid, prev_pid, orig_cpu, target_cpu)."""
    from harmony.probes.schema import make_events

    cols = ["ts", "cpu", "event", "common_pid", "pid", "prev_pid", "orig_cpu", "target_cpu"]
    d = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    n = len(rows)
    d.update(comm=[f"t{p}" if p else "swapper" for p in d["pid"]], prev_comm=[""] * n,
             prio=[120] * n, prev_prio=[-1] * n, prev_state=[0] * n)
    return make_events(d)


# CPU 1's swapper runs twice; a probe that is blind in its context misses the move it does from
# its softirq (pid 7 pulled from CPU 0) and its switch-out; pid 7's own events still prove the move.
_SEEN = [(10, 0, "sched_switch", 9, 7, 9, -1, -1),       # 9 -> 7 on CPU 0
         (11, 1, "sched_switch", 8, 0, 8, -1, -1),       # 8 -> swapper/1
         (20, 1, "sched_migrate_task", 0, 7, -1, 0, 1),  # swapper/1 pulls 7 (blind probe: lost)
         (21, 1, "sched_switch", 0, 7, 0, -1, -1),       # swapper/1 -> 7 (blind probe: lost)
         (22, 0, "sched_switch", 5, 9, 5, -1, -1),
         (30, 1, "sched_switch", 7, 0, 7, -1, -1),       # 7 -> swapper/1
         (40, 1, "sched_waking", 0, 8, -1, -1, 1),       # in swapper/1's hardirq (blind: lost)
         (41, 1, "sched_switch", 0, 8, 0, -1, -1),       # (blind: lost)
         (50, 1, "sched_switch", 8, 7, 8, -1, -1)]       # 8 -> 7: 7 is on CPU 1


def test_silent_contexts_and_unrecorded_migrations_from_a_probes_own_stream():
    from harmony.analysis.crosscheck import silent_contexts, unrecorded_migrations

    full = _events(_SEEN)
    blind = _events([r for r in _SEEN if not (r[3] == 0 and r[1] == 1)])
    assert silent_contexts(full) == []
    assert silent_contexts(blind) == [{"pid": 0, "cpu": 1, "comm": "swapper", "runs": 2,
                                       "records": 0}]
    assert unrecorded_migrations(full)["n"] == 0
    u = unrecorded_migrations(blind)
    assert (u["n"], u["pids"]) == (1, [7])
    assert u["examples"] == [{"pid": 7, "ts": 30, "from_cpu": 0, "to_cpu": 1}]
    # a migration whose orig_cpu is not the task's last CPU also proves a move the stream lacks
    gap = _events([(10, 0, "sched_switch", 9, 7, 9, -1, -1),
                   (20, 1, "sched_migrate_task", 3, 7, -1, 1, 0)])
    assert unrecorded_migrations(gap)["n"] == 1 and unrecorded_migrations(gap, pids=[8])["n"] == 0


def _notes(manifest: dict, meta: dict) -> list[str]:
    """The worded notes of every check on a recorded run's facts (``meta``: its capture's)."""
    from harmony.analysis import trust

    m = {**manifest, "lost_events": meta.get("lost_events", -1), "capture": meta}
    return trust.words(trust.check_notes(m, "recorded"))


def test_blind_spot_notes_count_in_words():
    """One silent context and one unrecorded move read '1 task', '1 move of 1 task'."""
    import pandas as pd

    from harmony.analysis.trust import words
    from harmony.pipeline import blind_spots

    meta = {"probe": "perf"}
    silent, moved = words(blind_spots(meta,
                                      _events([r for r in _SEEN if not (r[3] == 0 and r[1] == 1)]),
                                      pd.DataFrame({"pid": [7]})))
    assert silent.startswith("perf recorded no event in the context of 1 task it saw run: "
                             "swapper (CPU 1, ran 2x);"), silent
    assert "recording prove 1 move of 1 task that no sched_migrate_task records" in moved, moved


def test_repair_note_names_each_silent_program_once():
    """A program's threads share a comm: the note on repaired contradictions names it once."""
    silent = [{"pid": p, "cpu": 0, "comm": c, "runs": 3, "records": 0}
              for p, c in ((75, "tokio-rt-worker"), (70, "tokio-rt-worker"), (0, "swapper/1"),
                           (68, "tokio-rt-worker"), (9, "kworker/0:1"), (8, "rcu_sched"))]
    manifest = {"release": {"not_woken": []}, "reconstruction_anomalies": 10,
                "reconstruction_anomaly_kinds": {"switch_out_not_running": 10}}
    [note] = _notes(manifest, {"lost_events": 0, "silent_contexts": silent})
    assert "it records nothing while tokio-rt-worker, swapper/1, kworker/0:1 run." in note


@pytest.mark.parametrize("measured,late", [(2.0, None), (2.04, None), (2.2, "0.200 s late"),
                                          (0.5, None)])
def test_a_window_longer_than_asked_is_noted(measured, late):
    manifest = {"release": {"not_woken": []}, "reconstruction_anomalies": 0,
                "params": {"duration": 2.0}, "measured_s": measured}
    notes = _notes(manifest, {"lost_events": 0})
    assert [n for n in notes if "late" in n] == ([] if late is None else [
        f"the measured window is {measured:.3f} s, not the 2 s asked: the end marker came "
        f"{late} (the controller, waking at the end, waited for a CPU)"])


@pytest.mark.parametrize("sweeps,hz,noted", [(0, 10.0, True), (3, 10.0, False), (0, 0.5, False),
                                              (12, 10.0, False)])
def test_a_sampler_that_never_ran_is_noted(sweeps, hz, noted):
    from harmony.analysis.report import trust_lines
    manifest = {"release": {"not_woken": []}, "reconstruction_anomalies": 0,
                "params": {"duration": 2.0, "sample_hz": hz}, "measured_s": 2.0,
                "kernel_agreement": {"sweeps": sweeps, "agreeing": sweeps,
                                     "agreement": 1.0 if sweeps else None, "sweep_us_median": 80}}
    notes = [n for n in _notes(manifest, {"lost_events": 0}) if "sampler made no sweep" in n]
    assert notes == ([f"the kernel sampler made no sweep in the window ({2 * hz:.0f} were due): "
                      "it got no CPU time among the tasks (SCHED_FIFO refused?), so the run "
                      "queues were not compared with the kernel's /proc or nr_running"]
                     if noted else [])
    [line] = [ln for ln in trust_lines(manifest) if ln.startswith("kernel agreement (/proc)")]
    assert line.endswith("no sweep in the window" if not sweeps else "sweep 80 us)")


@pytest.mark.parametrize("sweeps,noted", [(3, True), (9, True), (10, False), (20, False)])
def test_a_sampler_slower_than_asked_says_how_many_sweeps_it_made(sweeps, noted):
    manifest = {"release": {"not_woken": []}, "reconstruction_anomalies": 0,
                "params": {"duration": 2.0, "sample_hz": 10.0}, "measured_s": 2.0,
                "kernel_agreement": {"sweeps": sweeps, "agreeing": sweeps, "agreement": 1.0,
                                     "sweep_us_median": 480}}
    notes = [n for n in _notes(manifest, {"lost_events": 0}) if "kernel sampler swept" in n]
    assert notes == ([f"the kernel sampler swept {sweeps} times in the window, not the 20 that "
                      "10 Hz asks: after a sweep it sleeps 100 times the CPU time the sweep "
                      "took (its /proc reads alone, 480 us of wall time here), so that it takes "
                      "at most ~1 % of a CPU from the tasks"] if noted else [])


def test_run_anomalies_compared_over_the_stretch_both_probes_recorded():
    """perf starts and stops tens of ms apart from tracefs: a contradiction in the part only one
    probe recorded is not counted against the other."""
    from harmony.analysis.probe_agreement import probe_agreement

    tasks = pd.DataFrame({"pid": [7], "name": ["w"], "role": ["worker"]})
    both = [(100, 0, "sched_switch", 9, 7, 9, -1, -1), (110, 0, "sched_switch", 7, 9, 7, -1, -1),
            (120, 0, "sched_switch", 9, 7, 9, -1, -1), (130, 0, "sched_switch", 8, 9, 8, -1, -1)]
    # the longer recording also holds, after the other one stopped, a switch out of 7 on a CPU
    # where it was never switched in (a lost switch-in: one anomaly)
    later = [(200, 1, "sched_switch", 5, 3, 5, -1, -1), (210, 1, "sched_switch", 7, 5, 7, -1, -1)]
    x = probe_agreement(_events(both), _events(both + later), tasks, 100, 150,
                        names=("tracefs", "perf"))
    # the switch at 130 ends 7's run: one each
    assert x["run_anomalies"] == {"tracefs": 1, "perf": 1}


def test_probe_agreement_explains_migrations_missed_in_a_blind_context():
    from harmony.analysis.probe_agreement import agreement_lines, probe_agreement

    full = _events(_SEEN)
    blind = _events([r for r in _SEEN if not (r[3] == 0 and r[1] == 1)])
    tasks = pd.DataFrame({"pid": [7], "name": ["w"], "role": ["worker"]})
    x = probe_agreement(full, blind, tasks, 0, 100, names=("tracefs", "perf"))
    mig = x["migrations"]
    assert (mig["only_tracefs"], mig["only_perf"], mig["unmatched_in_blind_context"]) == (1, 0, 1)
    ex = mig["examples"]["only_tracefs"][0]
    assert (ex["ctx_pid"], ex["ctx_cpu"], ex["blind"]) == (0, 1, True)
    assert x["unrecorded_migrations"]["perf"]["n"] == 1 \
        and x["unrecorded_migrations"]["tracefs"]["n"] == 0
    assert x["blind_contexts"]["perf"][0]["comm"] == "swapper" \
        and x["blind_contexts"]["tracefs"] == []
    assert any("blind contexts" in ln for ln in agreement_lines(x))
    assert x["verdict"] == "disagree (blind contexts)" and x["unmatched"] == 1
    # with a tolerance below the 10 ns the blind probe's repaired run start is off, a run differs
    # too: blindness explains the migration, not the run, so the verdict is a plain disagreement
    z = probe_agreement(full, blind, tasks, 0, 100, names=("tracefs", "perf"), tol_ns=5)
    assert z["runs"]["only_tracefs"] >= 1 and z["verdict"] == "disagree"
    # an unmatched migration in a context the other probe does record stays unexplained
    seen = _events([r for r in _SEEN if r[2] != "sched_migrate_task"])
    y = probe_agreement(full, seen, tasks, 0, 100, names=("tracefs", "perf"))
    assert y["migrations"]["unmatched_in_blind_context"] == 0 and y["verdict"] == "disagree"


# ----------------------------------------------------------------------------------- real kernel

def _perf_processes_writing(under: Path) -> list[int]:
    """Pids of perf processes whose command line names a path under ``under``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).startswith(b"perf") \
                and str(under).encode() in b" ".join(argv):
            out.append(int(entry.name))
    return out


def _harmony_instances() -> list[str]:
    inst = Path("/sys/kernel/tracing/instances")
    return sorted(p.name for p in inst.iterdir() if p.name.startswith("harmony")) \
        if inst.is_dir() else []


@pytest.fixture(scope="session")
def perf_kernel(kernel):
    ok, why = PerfProbe.available()
    if not ok:
        host_skip(why)
    return kernel


def _run(out: Path, probe="tracefs", crosscheck=None, layout="4,0"):
    """One short single-source run (<4,0>), through the library entry point `harmony run` uses."""
    from harmony.experiments import get_experiment
    from harmony.hygiene import HostBusy
    from harmony.run import execute

    exp = get_experiment("single-source")
    cpus = [0, 1]
    params = exp.resolve({"layout": layout, "duration": "2"}, cpus)

    def attempt():
        try:
            return execute(exp, params, cpus, out, probe, quiet=True, crosscheck=crosscheck)
        except HostBusy:
            shutil.rmtree(out, ignore_errors=True)
            raise

    run = retry_busy(attempt)  # the host lock serialises kernel runs of every helper: wait our turn
    assert not _perf_processes_writing(out), "a perf process outlived the run"
    assert not [i for i in _harmony_instances() if i.endswith(f"-{os.getpid()}")], "instance left"
    return run


@pytest.fixture(scope="module")
def perf_run(perf_kernel, tmp_path_factory):
    return _run(tmp_path_factory.mktemp("perf") / "run", probe="perf")


@pytest.fixture(scope="module")
def crosscheck_run(perf_kernel, tmp_path_factory):
    # <5,1>: CPU 1 runs a task from t0 on and never goes idle, so every pull onto it fires in
    # a task's context, which perf records: the 5-to-1 imbalance makes it pull (periodic
    # balance of a busy CPU) in a context both probes see. (<4,0>'s moves are pulls by an idle
    # CPU 1, in whose idle context perf records nothing on this host: nothing to compare causes
    # on; <5,0> counted on the kernel bouncing its odd task between the CPUs afterwards.)
    return _run(tmp_path_factory.mktemp("xc") / "run", crosscheck="perf", layout="5,1")


@pytest.mark.kernel
def test_kernel_perf_run_decodes_like_tracefs(perf_kernel, perf_run, crosscheck_run):
    import harmony

    run = harmony.load(perf_run.path)
    m = run.manifest
    assert m["probe"] == "perf" and m["capture"]["clock"] == "mono"
    assert m["capture"]["n_events"] > 0
    # the losses are perf's own counts, read here from the recording without Harmony's parser
    assert m["lost_events"] == _perf_lost(perf_run.path / "raw" / "perf" / "perf.data",
                                          m["capture"]["lost_samples_by_event"])
    assert {"harmony t0", "harmony released", "harmony end"} <= set(run.markers["text"])
    assert m["t0_ns"] < m["released_ns"] < m["end_ns"]
    # <4,0>: tasks released on CPU 0 must have run on CPU 1 (the run intervals prove they moved)
    runs = run.runs
    assert (runs[runs["start"] >= m["t0_ns"]]["cpu"] == 1).any(), "no task ran on CPU 1 after t0"
    # the same tables, with the same columns and dtypes, as a tracefs run
    other = harmony.load(crosscheck_run.path)
    for name in ("events", "markers", "migrations", "runs", "runqueue", "allocation", "shares"):
        mine, theirs = run.table(name), other.table(name)
        assert list(mine.columns) == list(theirs.columns), name
        assert mine.dtypes.astype(str).to_dict() == theirs.dtypes.astype(str).to_dict(), name
    # perf record's CPU time is the run's own, not foreign load
    assert m["probe_meta"]["perf_pid"] in m["controller_tids"]
    assert other.manifest["crosscheck_meta"]["perf_pid"] in other.manifest["controller_tids"]
    assert "(perf record, sampler)" in (perf_run.path / "report.md").read_text()
    raw = perf_run.path / "raw" / "perf"
    assert {"perf.data", "markers.jsonl", "meta.json", "perf.log"} \
        <= {p.name for p in raw.iterdir()}
    # perf drops, without counting them lost, the hits in the context of tasks it is blind in
    # (swapper/1: the first moves of <4,0>, pulled by idle CPU 1). Its own stream must prove every
    # move it lacks, and the run must say so; with no such move there is nothing to say.
    from harmony.analysis.crosscheck import unrecorded_migrations

    moved = unrecorded_migrations(run.events, run.tasks["pid"])
    if m["lost_events"] == 0:
        if moved["n"]:
            assert m["capture"]["silent_contexts"], moved
            assert any("perf recorded no event in the context of" in n
                       for n in m["notes"]), m["notes"]
            from harmony.core.wording import plural     # as the note words it (analysis.trust)
            proved = f"prove {plural(moved['n'], 'move')} of"
            assert any(proved in n and "no sched_migrate_task" in n for n in m["notes"]), m["notes"]
        if not (run.migrations["ts"] >= m["t0_ns"]).any():  # the tasks did reach CPU 1 (above)
            assert moved["n"] >= 1, "perf lacks the moves to CPU 1 and its stream does not show it"
    else:
        host_skip(f"the perf run lost {m['lost_events']} events: the moves it lacks are not judged")


@pytest.mark.kernel
def test_kernel_crosscheck_probes_agree(perf_kernel, crosscheck_run):
    x = json.loads((crosscheck_run.path / "crosscheck.json").read_text())
    assert x["probes"] == ["tracefs", "perf"]
    assert x["migrations"]["tracefs"] >= 1 and x["runs"]["tracefs"] >= 1
    assert crosscheck_run.manifest["probe_agreement"]["verdict"] == x["verdict"]
    report = (crosscheck_run.path / "report.md").read_text()
    assert "probe cross-check" in report and "tracefs vs perf" in report
    if x["lost_events"]["tracefs"] == 0 and x["lost_events"]["perf"] == 0:
        s = x["runs"]
        assert s["only_tracefs"] == 0 and s["only_perf"] == 0, s["examples"]
        assert s["matched"] == s["tracefs"] == s["perf"]
        s = x["migrations"]
        assert s["only_perf"] == 0, s["examples"]
        # every migration perf lacks fired in a context perf records nothing in (swapper/1's idle
        # balancing), and perf's own stream proves a move it does not record
        assert s["unmatched_in_blind_context"] == s["only_tracefs"], s["examples"]
        if s["only_tracefs"]:
            assert x["unrecorded_migrations"]["perf"]["n"] >= 1, x["unrecorded_migrations"]
        assert x["unrecorded_migrations"]["tracefs"]["n"] == 0 or x["blind_contexts"]["tracefs"]
        assert s["matched"] == s["perf"]
        assert x["verdict"] == ("agree" if s["only_tracefs"] == 0 else "disagree (blind contexts)")
        # a sched_switch fired where both are blind (the switch out of swapper/1) is missing from
        # both
        assert x["run_anomalies"]["tracefs"] == x["run_anomalies"]["perf"]
    else:
        assert x["verdict"] != "agree" or x["unmatched"] == 0
        host_skip(f"the cross-checked run lost events (tracefs {x['lost_events']['tracefs']}, perf "
                  f"{x['lost_events']['perf']}): the probes' agreement is not judged")


@pytest.mark.kernel
def test_kernel_perf_records_the_sched_softirq_and_tells_causes_as_tracefs(perf_kernel, perf_run,
                                                                          crosscheck_run):
    """perf records irq:softirq_entry/exit of the SCHED vector only, as tracefs does, so the
    same migrations get the same causes from either probe's stream (periodic inside the
    softirq, new-idle outside it): compared on the cross-checked run, where both recorded the
    same moves."""
    import harmony
    from harmony.analysis.reconstruct import df_migrations
    from harmony.probes.schema import SCHED_SOFTIRQ_VEC

    if not Path("/sys/kernel/tracing/events/irq/softirq_entry").is_dir():
        host_skip("this kernel has no irq:softirq_entry tracepoint")
    assert perf_run.manifest["migration_causes"]["softirq_recorded"]
    assert {"irq:softirq_entry", "irq:softirq_exit"} <= set(
        perf_run.manifest["probe_meta"]["events_enabled"])
    run = harmony.load(crosscheck_run.path)
    data = crosscheck_run.path / "raw" / "perf" / "perf.data"
    ev = PerfProbe.decode_dir(data.parent).events
    soft = ev[ev["event"].astype(str).str.startswith("irq:softirq_")]
    assert len(soft) and set(soft["prio"]) == {SCHED_SOFTIRQ_VEC}
    # the entries decoded are those perf script prints (counted here without Harmony's reader)
    text = subprocess.run(["perf", "script", "-f", "-i", str(data), "-F", "cpu,event,trace"],
                          capture_output=True, text=True, check=True).stdout
    printed = [ln.split() for ln in text.splitlines() if "irq:softirq_entry:" in ln]
    assert all(f"vec={SCHED_SOFTIRQ_VEC}" in ln for ln in printed)
    assert len(printed) == int((soft["event"] == "irq:softirq_entry").sum())
    m = run.manifest
    mine = df_migrations(ev, run.tasks, m["t0_ns"])
    pairs = df_migration_agreement(run.migrations.assign(kind=run.migrations["cause"].astype(str)),
                                   mine.assign(kind=mine["cause"].astype(str)),
                                   m["t0_ns"], m["end_ns"])
    both = pairs[pairs["status"] == "matched"]
    lost = json.loads((crosscheck_run.path / "crosscheck.json").read_text())["lost_events"]
    if any(lost.values()):
        host_skip(f"the cross-checked run lost events {lost}: which moves both saw is not judged")
    # <5,1> (crosscheck_run): CPU 1 is never idle, so its pulls fire in a task's context, which
    # perf records: there are moves both probes saw, and periodic ones among them
    assert not both.empty, pairs.to_string()
    assert (both["kind_a"] == both["kind_b"]).all(), both.to_string()
    balance = both[both["kind_a"].isin(["periodic", "newidle"])]
    assert not balance.empty, both.to_string()
    assert set(balance["kind_b"]) <= {"periodic", "newidle"}


def _independent_migrations(data: Path) -> tuple[pd.DataFrame, int, set, set]:
    """sched_migrate_task rows of a perf.data, decoded here without Harmony's parser, plus the
    contexts perf recorded anything in and the contexts it saw switched in, as (tid, cpu) with cpu
    -1 except for tid 0 (one swapper per CPU)."""
    text = subprocess.run(["perf", "script", "-f", "-i", str(data), "--ns", "--show-lost-events",
                           "-F", "tid,cpu,time,trace"],
                          capture_output=True, text=True, check=True).stdout
    rows, lost, recorded, ran = [], 0, set(), set()
    for line in text.splitlines():
        if "PERF_RECORD_LOST" in line:
            lost += int(line.split()[-1])
            continue
        if "pid=" not in line:
            continue
        head, _, rest = line.partition(": ")
        tid, cpu, stamp = head.split()
        tid, cpu = int(tid), int(cpu.strip("[]"))
        recorded.add((tid, cpu if tid == 0 else -1))
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        if "next_pid" in fields:
            nxt = int(fields["next_pid"])
            ran.add((nxt, cpu if nxt == 0 else -1))
            continue
        sec, nsec = stamp.rstrip(":").split(".")
        rows.append((int(sec) * 10**9 + int(nsec), int(fields["pid"]), int(fields["orig_cpu"]),
                     int(fields["dest_cpu"])))
    return pd.DataFrame(rows, columns=["ts", "pid", "src_cpu", "dst_cpu"]), lost, recorded, ran


def _perf_lost(data: Path, lost_samples: dict) -> int:
    """The sched events a recording lost, from the PERF_RECORD_LOST records `perf script` shows
    (counted here, not by Harmony's parser) and the capture's LOST_SAMPLES counts per event."""
    text = subprocess.run(["perf", "script", "-f", "-i", str(data), "--show-lost-events",
                           "-F", "tid,cpu,time,trace"], capture_output=True, text=True,
                          check=True).stdout
    lost = sum(int(line.split()[-1]) for line in text.splitlines() if "PERF_RECORD_LOST" in line)
    return lost_sched_events(lost, lost_samples or None)[0]


@pytest.mark.kernel
def test_kernel_independent_perf_sees_the_migrations_harmony_reports(perf_kernel, tmp_path):
    data = tmp_path / "independent.data"
    ctl, ack = tmp_path / "ctl.fifo", tmp_path / "ack.fifo"
    os.mkfifo(ctl)
    os.mkfifo(ack)
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-e",
                             "sched:sched_migrate_task,sched:sched_switch",
                             "-k", "CLOCK_MONOTONIC", "--synth=no", "-D", "-1",
                             "--control", f"fifo:{ctl},{ack}", "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with open(ctl, "w") as c, open(ack) as a:  # perf opens both ends once its events exist
            c.write("enable\n")
            c.flush()
            assert a.readline().strip() == "ack"
        run = _run(tmp_path / "run")
    finally:
        perf.send_signal(signal.SIGINT)
        err = perf.communicate(timeout=60)[1].decode(errors="replace")
    assert perf.returncode in (0, -signal.SIGINT), err
    seen, lost, recorded, ran = _independent_migrations(data)
    m = run.manifest
    t0, t_end = m["t0_ns"], m["end_ns"]
    mine = seen[seen["pid"].isin(run.tasks["pid"]) & (seen["ts"] >= t0) & (seen["ts"] <= t_end)]
    harmony_mig = run.migrations[(run.migrations["ts"] >= t0) & (run.migrations["ts"] <= t_end)]
    assert len(harmony_mig) >= 1
    pairs = df_migration_agreement(harmony_mig.assign(kind="?"), mine.assign(kind="?"), t0, t_end)
    if lost == 0 and m["lost_events"] == 0:
        only_perf = pairs[pairs["status"] == "only_b"]
        assert only_perf.empty, \
            f"perf saw migrations Harmony does not report:\n{only_perf.to_string()}"
        # a migration only Harmony (tracefs) holds must have fired in a context this perf saw run
        # but recorded nothing in (swapper/1's idle balancing); any other miss fails
        ev = run.events[run.events["event"] == "sched_migrate_task"]
        for r in pairs[pairs["status"] == "only_a"].itertuples():
            hit = ev[(ev["ts"] == r.ts_a) & (ev["pid"] == r.pid)]
            assert len(hit) == 1, r
            ctx = (int(hit["common_pid"].iat[0]),
                   int(hit["cpu"].iat[0]) if hit["common_pid"].iat[0] == 0 else -1)
            assert ctx in ran and ctx not in recorded, \
                (r, ctx, "perf missed a move in a context it records")
        # every move Harmony's probe recorded is paired; a move neither probe recorded, which
        # the tasks' own events prove (analysis.causes: "inferred"), is not a probe's to pair
        recorded_mig = harmony_mig[~harmony_mig["inferred"].to_numpy()]
        assert (pairs["status"] != "only_b").sum() == len(recorded_mig)
    else:
        host_skip(f"events were lost (the independent perf {lost}, Harmony's run "
                  f"{m['lost_events']}): which migrations each saw is not judged")


@pytest.mark.kernel
def test_kernel_perf_run_exports_a_trace_dat_that_imports_as_the_same_run(perf_kernel, perf_run,
                                                                          tmp_path):
    from click.testing import CliRunner
    from harmony.cli import main

    import harmony

    run = harmony.load(perf_run.path)
    dat = tmp_path / "perf-run.dat"
    r = CliRunner().invoke(main, ["export", str(run.path), "--out", str(dat)])
    assert r.exit_code == 0, r.output
    assert "written from its decoded events" in r.stderr
    pids = [a for p in run.tasks["pid"] for a in ("--pid", str(p))]
    r = CliRunner().invoke(main, ["import", str(dat), *pids, "--t0-marker", "harmony t0",
                                  "--end-marker", "harmony end", "--out", str(tmp_path / "back")])
    assert r.exit_code == 0, r.output
    back = harmony.load(tmp_path / "back")
    pd.testing.assert_frame_equal(back.events, run.events, check_categorical=False)
    assert (back.manifest["t0_ns"], back.manifest["end_ns"]) == (run.manifest["t0_ns"],
                                                                  run.manifest["end_ns"])
    for name in ("migrations", "runs", "runqueue"):
        mine, theirs = (t.table(name).drop(columns=["name"], errors="ignore")
                        for t in (back, run))
        pd.testing.assert_frame_equal(mine, theirs, check_categorical=False)


@pytest.mark.kernel
@pytest.mark.needs_tool("trace-cmd")
def test_kernel_perf_runs_trace_dat_is_read_whole_by_trace_cmd(perf_kernel, perf_run, tmp_path):
    """The trace.dat a perf run exports, read by trace-cmd itself (the independent reader):
    every event and marker of the run."""
    from click.testing import CliRunner
    from harmony.cli import main
    from test_import_export import report_events

    import harmony

    run = harmony.load(perf_run.path)
    dat = tmp_path / "perf-run.dat"
    r = CliRunner().invoke(main, ["export", str(run.path), "--out", str(dat)])
    assert r.exit_code == 0, r.output
    assert len(report_events(dat)) == len(run.events) + len(run.markers)


@pytest.mark.kernel
def test_kernel_corrupt_perf_data_is_a_one_line_error_naming_the_file(perf_kernel, perf_run,
                                                                      tmp_path):
    from harmony.pipeline import analyse
    from harmony.store import RunError

    src = perf_run.path / "raw" / "perf" / "perf.data"
    size = src.stat().st_size
    cases = {"truncated": src.read_bytes()[: size // 2], "empty": b"",
             "garbage": os.urandom(4096),
             "flipped": src.read_bytes()[: size // 2] + bytes(4096)
                        + src.read_bytes()[size // 2 + 4096:]}
    for name, content in cases.items():
        d = tmp_path / name
        shutil.copytree(perf_run.path / "raw" / "perf", d)
        (d / "perf.data").write_bytes(content)
        try:
            PerfProbe.decode_dir(d)
        except TraceCorrupt as exc:
            assert str(d / "perf.data") in str(exc) and "\n" not in str(exc), (name, exc)
        else:  # zeroed sample bytes can still parse; then every decoded row must be sane
            assert name == "flipped"
    # a whole run with a damaged recording: analyse refuses with the file's name, no traceback
    run_copy = tmp_path / "run"
    shutil.copytree(perf_run.path, run_copy)
    (run_copy / "raw" / "perf" / "perf.data").write_bytes(cases["truncated"])
    with pytest.raises(RunError, match="perf.data"):
        analyse(run_copy)


@pytest.mark.kernel
def test_kernel_probe_stop_leaves_nothing_and_errors_are_probe_errors(perf_kernel, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)     # a relative directory, as `harmony run --out DIR` gives it
    probe = PerfProbe(Path("p"), [0, 1], 1.0)
    with pytest.raises(ProbeError):
        probe.mark("too early")
    assert probe.helper_tids() == []
    probe.start()
    try:
        writing = _perf_processes_writing(tmp_path)
        assert writing
        # the threads a run raises with its own and counts as its own: perf record's
        assert set(writing) <= set(probe.helper_tids())
        probe.mark("harmony t0")
    finally:
        probe.stop()
    probe.stop()  # idempotent
    assert not _perf_processes_writing(tmp_path) and probe.helper_tids() == []
    cap = PerfProbe.decode_dir(tmp_path / "p")
    assert list(cap.markers["text"]) == ["harmony t0"]
    assert cap.meta["lost_events"] == _perf_lost(tmp_path / "p" / "perf.data",
                                                 cap.meta["lost_samples_by_event"])


@pytest.mark.parametrize("knows", [True, False])
def test_perf_record_records_no_bpf_events_when_it_can_be_told(tmp_path, knows):
    # without them perf starts no side-band thread, which it waits ~0.5 s for when it stops
    fake = tmp_path / "perf"
    option = "echo '        --no-bpf-event    do not record bpf events'\n"
    fake.write_text("#!/bin/sh\necho ' usage: perf record [<options>]'\n"
                    + (option if knows else "") + "exit 129\n")
    fake.chmod(0o755)
    cmd = PerfProbe(tmp_path / "p", [0], 1.0).command(5, 6, str(fake))
    assert ("--no-bpf-event" in cmd) == knows
    assert cmd[:2] == [str(fake), "record"]
    assert cmd[-2:] == ["-o", str(tmp_path / "p" / "perf.data")]


@pytest.mark.parametrize("args", [["--crosscheck", "tracefs"], ["--crosscheck", "dtrace"],
                                  ["--probe", "perf", "--crosscheck", "perf"]])
def test_bad_crosscheck_is_refused_before_anything_starts(tmp_path, args):
    from click.testing import CliRunner

    from harmony.cli import main

    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", "single-source", "--duration", "1", "--out", str(out),
                                  *args])
    assert r.exit_code == 2, r.output
    assert "--crosscheck" in r.output and not out.exists()


def test_a_low_proc_agreement_note_says_how_long_a_sweep_took():
    manifest = {"release": {"not_woken": []}, "reconstruction_anomalies": 0,
                "params": {"duration": 2.0, "sample_hz": 10.0}, "measured_s": 2.0,
                "kernel_agreement": {"sweeps": 18, "agreeing": 16, "agreement": 16 / 18,
                                     "sweep_us_median": 5398.3}}
    [note] = [n for n in _notes(manifest, {"lost_events": 0}) if "/proc view" in n]
    assert note.startswith("rebuilt run queues agree with the kernel's /proc view on only 88.9% "
                           "of 18 sweeps (a sweep reads each task's /proc/PID/stat in turn, "
                           "5398 us here")
