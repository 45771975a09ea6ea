"""`harmony export RUN --format perfetto`: the run's timeline in Perfetto's TrackEvent format.

Perfetto's trace processor is not a Python package: the ``perfetto`` package downloads its
binary (trace_processor_shell) from Google's storage on first use, which this project's machines
cannot reach (only package registries). The trace is therefore read back with the format's own
definition, the ``perfetto`` package's protobuf classes (perfetto_trace.proto), and replayed as
the trace processor builds slices from TrackEvents: per track, a begin opens a slice, an end
closes the innermost open one. The slices so rebuilt must be the run table's intervals.
"""

from __future__ import annotations

import collections

import pandas as pd
import pytest
from click.testing import CliRunner
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

import harmony
from harmony import export as pe
from harmony.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A simulated single-source run on 4 CPUs (pairwise-random: it migrates)."""
    out = tmp_path_factory.mktemp("perfetto") / "batch"
    r = CliRunner().invoke(main, ["simulate", "--policy", "pairwise-random", "--ncpus", "4",
                                  "--experiment", "single-source", "-p", "duration=1", "--out",
                                  str(out)])
    assert r.exit_code == 0, r.output
    return harmony.load(out / "rep-01")


def replay(data: bytes) -> dict:
    """The trace as the trace processor reads it: tracks (uuid -> descriptor), slices per track
    ((start, end, name, args)), instants per track, counters per track; every event checked to be
    on one sequence, in time order, and every end to close an open slice."""
    trace = Trace.FromString(data)
    tracks, open_, slices = {}, collections.defaultdict(list), collections.defaultdict(list)
    instants, counters = collections.defaultdict(list), collections.defaultdict(list)
    last = None
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks
            assert not d.HasField("parent_uuid") or d.parent_uuid in tracks
            tracks[d.uuid] = d
            continue
        assert p.trusted_packet_sequence_id == pe.SEQUENCE
        assert last is None or p.timestamp >= last
        last = p.timestamp
        e = p.track_event
        assert e.track_uuid in tracks
        args = {a.name: (a.string_value or a.int_value or a.bool_value)
                for a in e.debug_annotations}
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid].append((p.timestamp, e.name, args))
        elif e.type == TrackEvent.TYPE_SLICE_END:
            assert open_[e.track_uuid], "an end with no open slice"
            start, name, args = open_[e.track_uuid].pop()
            assert not open_[e.track_uuid], "slices nested on one track"
            slices[e.track_uuid].append((start, p.timestamp, name, args))
        elif e.type == TrackEvent.TYPE_INSTANT:
            instants[e.track_uuid].append((p.timestamp, e.name, args))
        elif e.type == TrackEvent.TYPE_COUNTER:
            counters[e.track_uuid].append((p.timestamp, e.counter_value))
    assert not any(open_.values()), "slices never closed"
    return {"tracks": tracks, "slices": slices, "instants": instants, "counters": counters}


def _intervals(slices: dict, uuids) -> set:
    return {(s, e, n) for u in uuids for s, e, n, _ in slices.get(u, [])}


def test_the_trace_holds_the_run_table(run, tmp_path):
    dest = tmp_path / "run.pftrace"
    r = CliRunner().invoke(main, ["export", str(run.path), "--format", "perfetto",
                                  "--out", str(dest)])
    assert r.exit_code == 0, r.output
    t = replay(dest.read_bytes())
    runs, tasks = run.runs, run.tasks
    comm = dict(zip(tasks["pid"], tasks["comm"]))
    # the experiment's tasks named, one thread track each
    threads = {d.thread.tid: d.thread.thread_name for d in t["tracks"].values()
               if d.HasField("thread")}
    assert threads == comm
    # every run interval a slice on its CPU's track, named by its task, and on its task's track,
    # named by its CPU; nothing else
    lanes = {u for u, d in t["tracks"].items()}
    on_cpus = _intervals(t["slices"], [u for u in lanes if u >> 40 == pe.CPU_TRACK])
    assert on_cpus == {(int(r.start), int(r.end), pe.slice_name(comm[r.pid], r.pid))
                       for r in runs.itertuples()}
    on_tasks = _intervals(t["slices"], [u for u in lanes if u >> 40 == pe.TASK_TRACK])
    assert on_tasks == {(int(r.start), int(r.end), f"CPU {r.cpu}") for r in runs.itertuples()}
    assert sum(map(len, t["slices"].values())) == 2 * len(runs)
    for r in runs.itertuples():
        assert (int(r.start), int(r.end), pe.slice_name(comm[r.pid], r.pid)) in \
            _intervals(t["slices"], [pe.cpu_track(r.cpu, lane) for lane in range(4)])
    names = {d.name for d in t["tracks"].values()}
    assert {f"CPU {c}" for c in run.manifest["cpus"]} <= names
    # the migrations, each an instant with its task and CPUs
    moves = t["instants"][pe.track_uuid(pe.MIGRATIONS_TRACK)]
    assert len(moves) == len(run.migrations) > 0
    assert [(ts, a["pid"], a["src_cpu"], a["dst_cpu"], a["kind"], a["cause"], a["inferred"])
            for ts, _, a in moves] == \
        [(int(m.ts), int(m.pid), int(m.src_cpu), int(m.dst_cpu), str(m.kind), str(m.cause),
          bool(m.inferred))
         for m in run.migrations.sort_values("ts", kind="stable").itertuples()]
    # the t0 and end markers where the manifest puts them
    marks = {name: ts for ts, name, _ in t["instants"][pe.track_uuid(pe.MARKERS_TRACK)]}
    assert marks["harmony t0"] == run.manifest["t0_ns"] \
        and marks["harmony end"] == run.manifest["end_ns"]
    # the run queues, step by step
    for cpu, q in run.runqueue.groupby("cpu"):
        assert t["counters"][pe.counter_track(cpu)] \
            == list(zip(q["ts"].astype(int), q["nr"].astype(float)))


def test_overlapping_intervals_go_on_a_child_track():
    """An inferred start (unseen_start) can reach back before the task's previous interval ended
    on another CPU (seen in real runs): a track's slices must nest, so the later one goes on a
    child track, and every interval still comes back."""
    runs = pd.DataFrame({"pid": [7, 7, 7], "name": ["w"] * 3, "role": ["cpu"] * 3, "cpu": [0, 1, 0],
                         "start": [100, 150, 300], "end": [200, 400, 400], "truncated": False,
                         "unseen_start": [False, True, False]})
    tasks = pd.DataFrame({"pid": [7], "comm": ["hmy-w00"]})
    empty = pd.DataFrame({"ts": [], "cpu": [], "nr": [], "pid": [], "text": []})
    t = replay(pe.trace_bytes(runs, empty.iloc[:0].assign(name=[], src_cpu=[], dst_cpu=[], kind=[]),
                              empty, empty, tasks, [0, 1]))
    assert list(pe.lanes(runs, "pid")) == [0, 1, 0]
    child = t["tracks"][pe.task_track(7, 1)]
    assert child.parent_uuid == pe.task_track(7) and "overlapping" in child.name
    assert t["slices"][pe.task_track(7, 1)] == [(150, 400, "CPU 1", {"pid": 7, "role": "cpu",
                                                                     "truncated": False,
                                                                     "unseen_start": True})]
    assert _intervals(t["slices"], [pe.task_track(7), pe.task_track(7, 1)]) == \
        {(100, 200, "CPU 0"), (150, 400, "CPU 1"), (300, 400, "CPU 0")}


def test_bad_input_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "perfetto"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "not a run, batch or suite directory" in r.output   # harmony.store's one wording


def test_the_commands_formats_are_the_librarys():
    """harmony export's --format choices and default files (the CLI keeps its own copy so that a
    usage error loads no pandas) are harmony.export's."""
    from harmony.cli import traces

    assert traces.FORMATS == pe.FORMATS
