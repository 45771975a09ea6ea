"""Exports of a run, one module for every format (``harmony export RUN --format F``).

- ``trace.dat`` (:func:`export_tracedat`): trace-cmd's format, the capture itself, for KernelShark
  and ``trace-cmd report``;
- ``perfetto`` (:func:`export_perfetto`): the run's timeline, for Perfetto's UI and trace
  processor.

:func:`export` writes either, :data:`FORMATS` names them and their default file names.

The trace.dat of a run: a tracefs capture is converted
(:func:`harmony.probes.tracedat_write.write_tracedat`), an imported trace.dat copied as it was, any
other capture written from its decoded events (:func:`export_source` says which).

The Perfetto trace: the protobuf TrackEvent format that Perfetto's UI and trace processor read,
written with the ``perfetto`` package's own message classes (its ``TraceProtoBuilder``).

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

import tempfile
from pathlib import Path

import pandas as pd

from harmony import store
from harmony.analysis.arrays import event_mask
from harmony.core.errors import ImportFailed
from harmony.probes import filemap
from harmony.probes.encode import write_recording
from harmony.probes.tracedat_write import SIMULATOR_SYSNAME, write_tracedat

#: the formats of :func:`export`, and the file each is written to by default, in the run directory
FORMATS = {"trace.dat": "trace.dat", "perfetto": "trace.pftrace"}


def export(run_dir: Path, fmt: str, dest: Path | None = None) -> tuple[Path, list[str]]:
    """Write run ``run_dir``'s capture or timeline in format ``fmt`` (:data:`FORMATS`) at ``dest``
    (default: the format's file in the run directory); (the file written, notes for the user)."""
    run_dir = Path(run_dir)
    dest = Path(dest) if dest is not None else run_dir / FORMATS[fmt]
    if fmt == "perfetto":
        from harmony.pipeline import load_checked  # the run's tables, checked

        return export_perfetto(load_checked(run_dir), dest), []
    return export_tracedat(run_dir, dest)


# --- trace.dat --------------------------------------------------------------------------------

def export_tracedat(run_dir: Path, dest: Path) -> tuple[Path, list[str]]:
    """Write the run's capture as a trace.dat at ``dest``; (dest, notes for the user: which
    capture, and what the file cannot hold).

    A tracefs capture is converted (:func:`harmony.probes.tracedat_write.write_tracedat`): the run's
    own, or the cross-check's when another probe recorded the run (:func:`export_source` says
    which); an imported trace.dat is copied as it was. Any other run (the perf probe, an imported
    perf.data, a simulation) has its decoded events written as ring-buffer pages first
    (:mod:`harmony.probes.encode`, whose notes say what those pages cannot hold). ImportFailed
    (one line) when the capture or the events are missing.
    """
    run_dir = Path(run_dir)
    manifest = store.read_json(run_dir / "manifest.json")
    which = export_source(manifest)
    if which in ("tracefs", "tracefs cross-check"):
        raw = run_dir / "raw" / "tracefs"
        if not raw.is_dir():
            raise ImportFailed(f"{run_dir}: the tracefs capture {raw} is missing")
        return write_tracedat(raw, dest, host_facts(manifest)), (
            [f"{run_dir}: recorded with another probe; this is its tracefs cross-check's capture"]
            if which == "tracefs cross-check" else [])
    if which == "import":
        stored = run_dir / manifest["source"]["stored"]
        if not stored.is_file():
            raise ImportFailed(f"{run_dir}: the imported trace {stored} is missing")
        filemap.copy_atomically(stored, dest)
        return dest, []
    return _export_events(run_dir, manifest, Path(dest))


def _export_events(run_dir: Path, manifest: dict, dest: Path) -> tuple[Path, list[str]]:
    """export_tracedat of a run without ring-buffer pages: from its events and markers tables."""
    tables = {}
    for name in ("events", "markers"):
        path = run_dir / f"{name}.parquet"
        if not path.is_file():
            raise ImportFailed(f"{run_dir}: recorded with probe {manifest.get('probe')!r}, which "
                               f"keeps no ftrace ring-buffer pages, and {path.name}, the decoded "
                               "capture they would be written from, is missing (the run was never "
                               "analysed)")
        tables[name] = store.read_table(path)
    meta = dict(manifest.get("capture") or {})
    events, left_out = tables["events"], []
    for name, how in (meta.get("derived_events") or {}).items():
        # every row of a derived event is derived (none was recorded): the file holds what was
        derived = event_mask(events, name)
        events = events[~derived].reset_index(drop=True)
        left_out.append(f"{run_dir}: its {int(derived.sum())} {name} rows, derived from "
                        f"{how.get('source', '?')} at import, are left out")
    with tempfile.TemporaryDirectory(prefix=".harmony-export-", dir=dest.parent) as tmp:
        meta["cpus"] = meta.get("cpus") or manifest.get("cpus") or []   # CPUs without an event too
        notes = write_recording(events, tables["markers"], meta, Path(tmp))
        write_tracedat(Path(tmp), dest, host_facts(manifest))
    return dest, [f"{run_dir}: recorded with probe {manifest.get('probe')!r}, which keeps no "
                  "ring-buffer pages: written from its decoded events (each with a fixed layout; "
                  "common_flags, preempt count and the 'R+' preempted flag are not kept); its "
                  "markers are tracing_mark_write prints at address 0 (the kernel's is not kept)"
                  ] + left_out + notes


def host_facts(manifest: dict) -> dict:
    """What the run's manifest says of the recording host's kernel, for the trace.dat's UNAME
    option (:func:`harmony.probes.tracedat_write.uname_text`): release, build and machine as
    doctor saw them (an imported run: the uname its trace recorded); a simulated run's names the
    simulator and its policy, not Linux."""
    simulated = manifest.get("simulated")
    if simulated:
        return {"sysname": SIMULATOR_SYSNAME, "kernel": "simulated",
                "kernel_build": simulated.get("policy") or "-"}
    host = manifest.get("host") or {}
    kernel = (host.get("doctor") or {}).get("kernel") or {}
    facts = {"uname": host.get("uname") or None, "kernel": host.get("kernel"),
             "kernel_build": kernel.get("build"), "machine": kernel.get("machine")}
    return {k: v for k, v in facts.items() if v and v != "?"}


def export_source(manifest: dict) -> str:
    """Which capture of a run :func:`export_tracedat` writes: "tracefs" (the run's probe),
    "tracefs cross-check" (the second probe's, when the run's is another), "import" (an imported
    trace.dat) or "events" (its decoded events, written as ring-buffer pages)."""
    probe = manifest.get("probe")
    if probe == "tracefs":
        return "tracefs"
    if probe == "import:trace.dat" and manifest.get("source", {}).get("stored"):
        return "import"
    if manifest.get("crosscheck_probe") == "tracefs":
        return "tracefs cross-check"
    return "events"


# --- Perfetto ---------------------------------------------------------------------------------

#: TrackEvent's types (perfetto_trace.proto), so that their classes load only when a trace is made
TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4
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


def _describe(builder, uuid: int, name: str, *, thread: tuple | None = None,
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
    # perfetto's protobuf classes take ~0.3 s to import: only a Perfetto export loads them
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

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
            events.append((int(r.start), 1, _slice(track, label, TYPE_SLICE_BEGIN, flags)))
            # at one instant a slice ends before the next begins; one of no length after its begin
            events.append((int(r.end), int(r.end == r.start),
                           _slice(track, None, TYPE_SLICE_END, {})))
    for m in migrations.itertuples(index=False):
        cause = str(getattr(m, "cause", "unknown"))   # a run of a Harmony before causes: unknown
        label = f"{m.name} {int(m.src_cpu)}->{int(m.dst_cpu)} ({cause})"
        events.append((int(m.ts), 2, _slice(track_uuid(MIGRATIONS_TRACK), label, TYPE_INSTANT,
                                            dict(pid=int(m.pid), src_cpu=int(m.src_cpu),
                                                 dst_cpu=int(m.dst_cpu), kind=str(m.kind),
                                                 cause=cause,
                                                 inferred=bool(getattr(m, "inferred", False))))))
    for q in runqueue.itertuples(index=False):
        events.append((int(q.ts), 2, _counter(counter_track(int(q.cpu)), int(q.nr))))
    for k in markers.itertuples(index=False):
        events.append((int(k.ts), 2, _slice(track_uuid(MARKERS_TRACK), str(k.text), TYPE_INSTANT,
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
        event.type = TYPE_COUNTER
        event.track_uuid = track
        event.counter_value = value
    return fill


def export_perfetto(run, dest: Path) -> Path:
    """Write ``run``'s (a loaded, complete run) timeline as a Perfetto trace at ``dest``."""
    data = trace_bytes(run.runs, run.migrations, run.runqueue, run.markers, run.tasks,
                       [int(c) for c in run.manifest.get("cpus", sorted(run.runs["cpu"].unique()))])
    store.atomic_write(dest, data)
    return Path(dest)
