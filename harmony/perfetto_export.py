"""A run's timeline as a Perfetto trace (``harmony export RUN --format perfetto``): the protobuf
TrackEvent format that Perfetto's UI and trace processor read, written with the ``perfetto``
package's own message classes (its ``TraceProtoBuilder``).

What the trace holds, all from the run's tables (so it shows what the report measured, repairs
included, not the raw events):

- a track per CPU of the run, named "CPU n": one slice per run interval of an experiment task
  (:data:`harmony.analysis.tables.RUNS`), named by the task ("hmy-w01 (30000)"), with its pid,
  its role and the interval's flags (truncated, unseen_start) as arguments;
- a thread track per task, named by its comm (pid = tid = the worker's pid): the same intervals,
  each named by the CPU it ran on, so a task's path through the CPUs reads along one line (an
  interval whose inferred start overlaps the one before it, which a track cannot nest, goes on a
  child track, "CPU n (overlapping 1)");
- a counter track per CPU, "runnable CPU n": the run queue step function (RUNQUEUE's nr);
- a "migrations" track: an instant per migration (MIGRATIONS), named "w01 0->1 (periodic)" by
  its cause, its pid, source, destination, kind, cause and whether it was inferred (no probe
  recorded it, the task's own events prove it) as arguments;
- a "markers" track: an instant per Harmony marker (warm-up, t0, released, end).

Timestamps are the run's, in ns on its trace clock. Every event is on one packet sequence, in
time order.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from harmony import store

#: the packet sequence every event of the trace is written on
SEQUENCE = 1
#: track uuids: (kind << 40) | (lane << 32) | CPU or pid; a lane > 0 is a child track holding the
#: intervals that overlap another of the same track (:func:`lanes`)
CPU_TRACK, TASK_TRACK, COUNTER_TRACK, MIGRATIONS_TRACK, MARKERS_TRACK = 1, 2, 3, 4, 5


def track_uuid(kind: int, key: int = 0, lane: int = 0) -> int:
    return (kind << 40) | (lane << 32) | int(key)


def cpu_track(cpu: int, lane: int = 0) -> int:
    return track_uuid(CPU_TRACK, cpu, lane)


def task_track(pid: int, lane: int = 0) -> int:
    return track_uuid(TASK_TRACK, pid, lane)


def counter_track(cpu: int) -> int:
    return track_uuid(COUNTER_TRACK, cpu)


def lanes(runs: pd.DataFrame, key: str) -> pd.Series:
    """The lane of each interval on its track (one track per value of ``key``): 0, or the first
    lane free at its start when it overlaps an interval already laid (an inferred start, the
    ``unseen_start`` of a lost switch-in, can reach back before the previous interval's end).
    A track's slices must nest, and two overlapping intervals do not."""
    out = pd.Series(0, index=runs.index, dtype=int)
    ends: dict = {}
    for idx, k, start, end in zip(runs.index, runs[key], runs["start"], runs["end"]):
        free = ends.setdefault(k, [])
        lane = next((i for i, e in enumerate(free) if e <= start), len(free))
        if lane == len(free):
            free.append(end)
        free[lane] = end
        out[idx] = lane
    return out


def slice_name(comm: str, pid: int) -> str:
    return f"{comm} ({pid})"


def _describe(builder: TraceProtoBuilder, uuid: int, name: str, *, thread: tuple | None = None,
              counter: bool = False, parent: int | None = None) -> None:
    desc = builder.add_packet().track_descriptor
    desc.uuid = uuid
    if parent is not None:
        desc.parent_uuid = parent
    if thread is not None:
        desc.thread.pid, desc.thread.tid = thread
        desc.thread.thread_name = name
    else:
        desc.name = name
    if counter:
        desc.counter.SetInParent()


def _annotate(event, **args) -> None:
    for key, value in args.items():
        ann = event.debug_annotations.add()
        ann.name = key
        if isinstance(value, bool):
            ann.bool_value = value
        elif isinstance(value, int):
            ann.int_value = value
        else:
            ann.string_value = str(value)


def trace_bytes(runs: pd.DataFrame, migrations: pd.DataFrame, runqueue: pd.DataFrame,
                markers: pd.DataFrame, tasks: pd.DataFrame, cpus: list[int]) -> bytes:
    """The trace of a run's tables (see the module docstring), serialised."""
    builder = TraceProtoBuilder()
    comm = dict(zip(tasks["pid"].astype(int), tasks["comm"].astype(str)))
    for pid in sorted(comm):
        _describe(builder, task_track(pid), comm[pid], thread=(pid, pid))
    for cpu in cpus:
        _describe(builder, cpu_track(cpu), f"CPU {cpu}")
        _describe(builder, counter_track(cpu), f"runnable CPU {cpu}", counter=True)
    _describe(builder, track_uuid(MIGRATIONS_TRACK), "migrations")
    _describe(builder, track_uuid(MARKERS_TRACK), "markers")
    runs = runs.sort_values(["start", "end"], kind="stable")
    cpu_lane, task_lane = lanes(runs, "cpu"), lanes(runs, "pid")
    for (cpu, lane) in sorted(set(zip(runs["cpu"].astype(int), cpu_lane)) - {(c, 0) for c in cpus}):
        _describe(builder, cpu_track(cpu, lane), f"CPU {cpu} (overlapping {lane})",
                  parent=cpu_track(cpu))
    for (pid, lane) in sorted(set(zip(runs["pid"].astype(int), task_lane))):
        if lane:
            _describe(builder, task_track(pid, lane), f"{comm.get(pid, pid)} (overlapping {lane})",
                      parent=task_track(pid))

    events = []     # (ts, order at one ts: ends before begins, then the rest; packet filler)
    for r, cl, tl in zip(runs.itertuples(index=False), cpu_lane, task_lane):
        pid, cpu = int(r.pid), int(r.cpu)
        name = slice_name(comm.get(pid, str(r.name)), pid)
        flags = dict(pid=pid, role=str(r.role), truncated=bool(r.truncated),
                     unseen_start=bool(r.unseen_start))
        for track, label in ((cpu_track(cpu, cl), name), (task_track(pid, tl), f"CPU {cpu}")):
            events.append((int(r.start), 1, _slice(track, label, TrackEvent.TYPE_SLICE_BEGIN, flags)))
            # at one instant a slice ends before the next begins; one of no length after its begin
            events.append((int(r.end), int(r.end == r.start),
                           _slice(track, None, TrackEvent.TYPE_SLICE_END, {})))
    for m in migrations.itertuples(index=False):
        cause = str(getattr(m, "cause", "unknown"))   # a run of a Harmony before causes: unknown
        label = f"{m.name} {int(m.src_cpu)}->{int(m.dst_cpu)} ({cause})"
        events.append((int(m.ts), 2, _slice(track_uuid(MIGRATIONS_TRACK), label, TrackEvent.TYPE_INSTANT,
                                            dict(pid=int(m.pid), src_cpu=int(m.src_cpu),
                                                 dst_cpu=int(m.dst_cpu), kind=str(m.kind), cause=cause,
                                                 inferred=bool(getattr(m, "inferred", False))))))
    for q in runqueue.itertuples(index=False):
        events.append((int(q.ts), 2, _counter(counter_track(int(q.cpu)), int(q.nr))))
    for k in markers.itertuples(index=False):
        events.append((int(k.ts), 2, _slice(track_uuid(MARKERS_TRACK), str(k.text), TrackEvent.TYPE_INSTANT,
                                            dict(cpu=int(k.cpu)))))
    events.sort(key=lambda e: (e[0], e[1]))     # stable: a begin stays before its end
    for ts, _, fill in events:
        packet = builder.add_packet()
        packet.timestamp = ts
        packet.trusted_packet_sequence_id = SEQUENCE
        fill(packet.track_event)
    return builder.serialize()


def _slice(track: int, name: str | None, kind, args: dict):
    def fill(event):
        event.type = kind
        event.track_uuid = track
        if name is not None:
            event.name = name
        _annotate(event, **args)
    return fill


def _counter(track: int, value: int):
    def fill(event):
        event.type = TrackEvent.TYPE_COUNTER
        event.track_uuid = track
        event.counter_value = value
    return fill


def export_perfetto(run, dest: Path) -> Path:
    """Write ``run``'s (a loaded, complete run) timeline as a Perfetto trace at ``dest``."""
    data = trace_bytes(run.runs, run.migrations, run.runqueue, run.markers, run.tasks,
                       [int(c) for c in run.manifest.get("cpus", sorted(run.runs["cpu"].unique()))])
    store.atomic_write(dest, data)
    return Path(dest)
