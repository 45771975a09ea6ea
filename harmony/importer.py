"""Analyse a trace recorded elsewhere: a trace-cmd ``trace.dat`` or a ``perf.data`` of the sched
tracepoints becomes a normal run directory (``harmony import``; the way back is
:mod:`harmony.export`).

An imported run has no controller: its tasks are whatever the user names (pids, comms), t0 is the
first event of those tasks unless a time or a trace marker is given, the end is their last event
unless given likewise, and what the trace cannot tell (each task's demand) is stated in
the run's notes. Its manifest says ``"source": {"imported": FILE, ...}``, and names the scheduler
the recorded kernel release implies (:func:`imported_scheduler`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import shutil
import sys
import threading
from concurrent import futures
from pathlib import Path

import numpy as np
import pandas as pd

from harmony import hostfacts, pipeline, store
from harmony.analysis import trust
from harmony.analysis.arrays import (
    TABLE_KEYS_MAX,
    event_kinds,
    event_mask,
    growing_windows,
    in_set,
    index_of,
    key_table,
)
from harmony.analysis.waking import wakeups_from_waking
from harmony.core.errors import ImportFailed, ParameterError  # noqa: F401  (raised here)
from harmony.core.jit import in_background, run_split, split, use_compiled
from harmony.core.osutil import format_cpulist
from harmony.experiments import get_experiment
from harmony.probes import filemap, perf_data, perf_read
from harmony.probes.base import NOT_NS_CLOCKS, Capture, ProbeError, TraceCorrupt
from harmony.probes.schema import SCHED_EVENTS, make_markers
from harmony.probes.tracedat_read import (
    MAGIC,
    choose_buffer,
    decode_tracedat,
    decompressed_sizes,
    read_tracedat,
)
from harmony.probes.tracedat_write import SIMULATOR_SYSNAME
from harmony.workload.tasks import TaskSpec, tasks_frame

PERF_MAGIC = b"PERFILE2"
RAW_DIR = "raw/import"


# --- reading -----------------------------------------------------------------------------------

def sniff(path: Path) -> str:
    """"trace.dat" or "perf.data" from the file's magic; TraceCorrupt naming it otherwise."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise TraceCorrupt(f"{path}: cannot read ({exc.strerror or exc})") from None
    if head.startswith(MAGIC):
        return "trace.dat"
    if head.startswith(PERF_MAGIC):
        return "perf.data"
    if not head:
        raise TraceCorrupt(f"{path}: empty file, neither a trace.dat nor a perf.data")
    raise TraceCorrupt(f"{path}: neither a trace.dat nor a perf.data (unknown magic)")


#: what a trace piped into ``harmony import -`` is kept as in the run directory, by its kind
STDIN_NAMES = {"perf.data": "stdin.perf.data", "trace.dat": "stdin.dat"}


def receive_stdin(dest_dir: Path, stream=None) -> Path:
    """Write the trace piped into ``harmony import -`` (``perf record -o - ... |``) from
    ``stream`` (standard input) into ``dest_dir``, under a temporary name until it has ended,
    then as :data:`STDIN_NAMES` of its kind; returns the file. TraceCorrupt (nothing written)
    if it is empty or neither kind; on any error or a signal the part written is removed."""
    stream = stream if stream is not None else sys.stdin.buffer
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / ".stdin.part"
    try:
        read = getattr(stream, "read1", stream.read)    # what has arrived, not a whole MiB
        with open(part, "wb") as f:
            while chunk := read(1 << 20):
                f.write(chunk)
        try:
            kind = sniff(part)
        except TraceCorrupt as exc:
            raise TraceCorrupt(str(exc).replace(str(part), "standard input", 1)) from None
        dest = dest_dir / STDIN_NAMES[kind]
        os.replace(part, dest)
        return dest
    finally:
        part.unlink(missing_ok=True)


def read_perf_data(path: Path) -> Capture:
    """Decode a ``perf record -e 'sched:*'`` file with the perf probe's reader
    (:mod:`harmony.probes.perf_read`: the file itself, no ``perf`` needed).

    Unlike the perf probe's own recordings, a foreign perf.data may use any clock and has no
    markers: the clock is taken from its header and reported, never checked.
    """
    read = perf_read.read_perf_data(path)
    events = read.events
    notes = list(read.notes)
    lost, lost_notes = perf_data.lost_sched_events(sum(read.lost_by_cpu.values()),
                                                   read.lost_samples_by_event or None)
    notes += lost_notes
    clock = perf_data.clock_of(read.clockids("sched:"))
    online = read.header.nr_cpus_online
    recorded = read.recorded_cpus
    if recorded is not None and online is not None and len(recorded) < online:
        notes.append(f"perf recorded CPUs {format_cpulist(recorded)} only, of the {online} its "
                     "host had online (perf record -C): events on the others are not in the "
                     "trace, and tasks are unseen while they run there")
    meta = {
        "probe": "perf.data", "clock": clock, "lost_events": int(lost),
        "lost_by_cpu": {int(k): int(v) for k, v in sorted(read.lost_by_cpu.items())},
        "lost_samples_by_event": read.lost_samples_by_event,
        "events_enabled": sorted(set(map(str, events["event"].cat.categories))),
        "bytes": read.header.size, "n_events": int(len(events)), "n_markers": 0,
        "kernel": read.header.os_release,
        "cpus": sorted(int(c) for c in np.unique(events["cpu"])),
        "n_cpus": online, "recorded_cpus": sorted(recorded) if recorded is not None else None,
        "decoder": read.decoder, "perf_records": read.records, "notes": notes,
    }
    return Capture(events=events, markers=make_markers(), meta=meta)


#: an import's peak resident memory per byte of a trace.dat's ring-buffer data, and beside it
#: (bench/whole_import.py, 2026-11-27): 2.75 bytes at 10 M events of a pipe ping-pong whose tasks
#: are the experiment's (54 bytes of records an event; a run per switch), 2.25 at 50 M (6.1 and
#: 5.4 the day before). With room for smaller records (more events per byte): 4 bytes a byte
#: holds 160 bytes an event at 40 bytes of records an event
MEMORY_PER_DATA_BYTE = 4.0
MEMORY_BASE = 400 << 20
#: the same per byte of a perf.data's records (bench/perf_import.py, 2026-11-27): 1.33 bytes at
#: 9.9 M events of the ping-pong (148 bytes an event), whose samples take 111 bytes an event
#: (header, tid, time, cpu, id, period and the raw payload: twice a ring buffer's 54); but at 3 M
#: events (342 MB) the peak was 1310 MB, 2.6 bytes a byte over the base (2 had said 1103 MB), at
#: 1 M 1.8: 3 bytes a byte (1444 MB at 3 M, 763 at 1 M). A compressed file's records (perf
#: record -z) are estimated from the ratio perf wrote, and held decompressed while they are
#: read: one more byte a byte. Read a slab at a time (2026-12-05), an import of 4.04 M events
#: (452 MB of records) peaked at 712 MB, 1.58 bytes a byte, and of 9.38 M at 1.29 GB (1.23)
MEMORY_PER_PERF_DATA_BYTE = 3.0


def memory_needed(path: Path, buffer: str | None = None,
                  kind: str | None = None) -> tuple[int, int] | None:
    """(bytes of memory an import of ``path`` needs, at most; bytes of records it holds: a
    trace.dat's ring-buffer pages, decompressed if they are compressed, a perf.data's data
    section as recorded, or decompressed by perf's ratio); None for a file that does not parse
    (reading it says why). ``kind``: :func:`sniff`'s, if known already."""
    kind = kind or sniff(path)
    if kind == "perf.data":
        try:
            head = perf_read.read_header(path)
        except ProbeError:
            return None
        if head.compression is None:
            return int(MEMORY_PER_PERF_DATA_BYTE * head.data_size) + MEMORY_BASE, head.data_size
        data = head.data_size * max(1, head.compression[1])
        return int((MEMORY_PER_PERF_DATA_BYTE + 1) * data) + MEMORY_BASE, data
    if kind != "trace.dat":
        return None
    try:
        td = read_tracedat(path)
        buf = choose_buffer(td, buffer)
        data = sum(decompressed_sizes(td, buf).values())
    except ProbeError:
        return None
    # a compressed buffer's pages are held decompressed instead of mapped from the file, whose
    # compressed bytes are read on top
    held = sum(size for _, size in buf.cpus.values()) if buf.compressed else 0
    return int(MEMORY_PER_DATA_BYTE * data) + held + MEMORY_BASE, data


def check_memory(path: Path, est: tuple[int, int] | None, kind: str | None) -> None:
    """ImportFailed, before anything is read, if importing ``path`` may need more memory than
    this host has available (``est``: :func:`memory_needed`'s), with the estimate and what to
    do."""
    have = hostfacts.memory_available()
    if est is None or est[0] <= have:
        return
    need, data = est
    part = ("a shorter recording (perf record --switch-output cuts one into parts)"
            if kind == "perf.data" else "a part of it (trace-cmd split)")
    raise ImportFailed(f"{path}: importing it needs up to {need / 2**30:.1f} GiB of memory "
                       f"(for its {data / 2**30:.1f} GiB of records), this host has "
                       f"{have / 2**30:.1f} GiB available: import it where there is more, or "
                       f"{part}, or give --no-memory-check to try")


#: what an import writes beside its copy of the trace, per byte of the trace's records (the
#: pages or records :func:`memory_needed` counts): its tables, figures and report. Measured
#: (2026-11-27, the ping-pong of bench/, every other event a switch): a trace.dat's run took
#: 0.26 bytes a byte of its pages at 9.6 M events (133 MB for 513 MB), 0.28 at 1.0 M; a
#: perf.data's 0.13 at 1.0 and 2.9 M events (42 MB for 321 MB): half a byte a byte leaves
#: room, DISK_BASE the figures and report of a small trace
DISK_PER_DATA_BYTE = 0.5
DISK_BASE = 16 << 20


def disk_needed(path: Path, out: Path, data: int) -> tuple[int, int]:
    """(bytes the import of ``path``, ``data`` bytes of records, needs on ``out``'s file
    system at most; of those, the copy of the trace kept with the run: none where the trace is
    there already (piped in) or the copy would share its blocks, :func:`filemap.shares_blocks`)."""
    where = _existing(out)
    in_place = filemap.same_file(path, out / RAW_DIR / path.name)
    copy = 0 if in_place or filemap.shares_blocks(path, where) else path.stat().st_size
    return copy + int(DISK_PER_DATA_BYTE * data) + DISK_BASE, copy


def check_disk(path: Path, out: Path, est: tuple[int, int] | None) -> None:
    """ImportFailed, before anything is read, if importing ``path`` into ``out`` may need more
    room than its file system has free (:func:`disk_needed`; ``est``: :func:`memory_needed`'s,
    for the size of the records), with the estimate and what to do."""
    if est is None:
        return                  # a file that does not parse: reading it says why
    where = _existing(out)
    need, copy = disk_needed(path, out, est[1])
    free = shutil.disk_usage(where).free
    if need <= free:
        return
    raise ImportFailed(f"{out}: importing {path} needs up to {_size(need)} on its file system "
                       f"({_size(copy)} for the copy of the trace kept with the run, the rest for "
                       f"its tables and figures), {where} has {_size(free)} free: give --out on "
                       "another file system, or --no-disk-check to try")


def _existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists (a run directory not made yet)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.{1 if shift == 30 else 0}f} {unit}"
    return f"{-(-nbytes >> 10)} KiB"


def read_trace(path: Path, buffer: str | None = None) -> tuple[Capture, str]:
    """(capture, format) of a trace.dat or perf.data; TraceCorrupt naming the file if it is bad."""
    kind = sniff(path)
    if kind == "trace.dat":
        cap, td = decode_tracedat(path, buffer)
        clock = cap.meta.get("clock", "")
        if clock in NOT_NS_CLOCKS:
            # every time and duration would be off by an unknown factor: refuse, not guess
            conversion = (" (Harmony does not apply the file's tsc2nsec conversion)"
                          if td.tsc2nsec else "")
            raise ImportFailed(f"{path}: recorded with trace clock {clock!r}, which counts "
                               f"{NOT_NS_CLOCKS[clock]}, not nanoseconds{conversion}; record "
                               "with a nanosecond clock (trace-cmd record -C mono, or local, "
                               "global, boot)")
        cap.meta["cmdlines"] = {int(k): v for k, v in td.cmdlines.items()}
        return cap, kind
    if buffer is not None:
        raise ImportFailed(f"{path}: --buffer applies to trace.dat files, this is a perf.data")
    return read_perf_data(path), kind


def absent_events(events: pd.DataFrame) -> list[str]:
    """The sched events Harmony reads of which the trace holds none."""
    present = set(map(str, pd.unique(events["event"])))     # by its codes: no string per row
    return [e for e in SCHED_EVENTS if e not in present]


# --- choosing the tasks, t0 and the end ---------------------------------------------------------

def _pid_comms(events: pd.DataFrame, cmdlines: dict[int, str]) -> dict[int, set[str]]:
    """Every comm each pid is seen with (events' pid/comm,
    prev_pid/prev_comm, the file's cmdlines)."""
    out: dict[int, set[str]] = {}
    for pid_col, comm_col in (("pid", "comm"), ("prev_pid", "prev_comm")):
        for pid, comm in _pairs(events[pid_col], events[comm_col]):
            if pid > 0 and comm:
                out.setdefault(int(pid), set()).add(comm)
    for pid, comm in cmdlines.items():
        if pid > 0:
            out.setdefault(int(pid), set()).add(comm)
    return out


def _pairs(pid: pd.Series, comm: pd.Series) -> list[tuple[int, str]]:
    """The distinct (pid, comm) pairs of two columns (a missing comm is "nan", as astype(str)
    says). A categorical comm by its codes: one hash of a 64-bit key per row, no string per row."""
    if not isinstance(comm.dtype, pd.CategoricalDtype):
        pairs = pd.DataFrame({"p": pid, "c": comm}).drop_duplicates()
        return list(zip(pairs["p"].tolist(), pairs["c"].astype(str)))
    names = np.append(np.asarray(comm.cat.categories.astype(str), dtype=object), "nan")
    p, c = pid.to_numpy(), comm.cat.codes.to_numpy()
    width = len(names)                  # a pair's slot: (pid + 1) * width + code + 1
    top = int(p.max(initial=-1))
    if len(p) and int(p.min()) >= -1 and (top + 2) * width <= PAIR_SLOTS:
        # a mark per slot, a chunk of rows at a time: no hashing of millions of keys
        seen = np.zeros((top + 2) * width, bool)
        if use_compiled(len(p), JIT_MIN_EVENTS) and int(c.min(initial=0)) >= -1:
            from harmony import importer_jit  # the compiled kernels: only on this path
            importer_jit.mark_pairs(p, c, width, seen)      # one pass, no chunk of keys
            slot = np.flatnonzero(seen)
            return list(zip((slot // width - 1).tolist(), names[slot % width - 1]))
        key = np.empty(min(len(p), CHUNK_ROWS), np.int64)
        for lo in range(0, len(p), CHUNK_ROWS):
            k = key[:len(p[lo:lo + CHUNK_ROWS])]
            np.add(p[lo:lo + CHUNK_ROWS], 1, out=k)
            k *= width
            k += c[lo:lo + CHUNK_ROWS]
            seen[k + 1] = True
        slot = np.flatnonzero(seen)
        return list(zip((slot // width - 1).tolist(), names[slot % width - 1]))
    key = pd.unique((p.astype(np.int64) << 32) | (c.astype(np.int64) & 0xFFFFFFFF))
    codes = (key & 0xFFFFFFFF).astype(np.int64)
    return list(zip((key >> 32).tolist(), names[np.where(codes == 0xFFFFFFFF, -1, codes)]))


#: the most (pid, comm) slots :func:`_pairs` marks in a table (a pid_max of 4 M and 8 comms, 32 MB)
PAIR_SLOTS = 1 << 25


def df_trace_tasks(events: pd.DataFrame, cmdlines: dict[int, str] | None = None) -> pd.DataFrame:
    """The tasks of a trace, to choose an experiment's from (``harmony import FILE --tasks``).

    Needs events: sched_switch (any others count in ``events``).

    One row per pid (but 0, the idle tasks), by ``run_s`` then pid: pid (int64), comm (str: every
    comm it was seen with, "|"-separated), events (int64: events about it, as pid or prev_pid),
    switch_ins (int64), run_s (float: time it ran, from each CPU's sched_switch to the next one
    there; a run the trace does not end is not counted), cpus (str: the CPUs it ran on).
    """
    pid, prev = events["pid"].to_numpy(), events["prev_pid"].to_numpy()
    sw = np.flatnonzero(event_mask(events, "sched_switch"))
    cpu, ts, nxt = events["cpu"].to_numpy()[sw], events["ts"].to_numpy()[sw], pid[sw]
    by_cpu = np.argsort(cpu, kind="stable")         # each CPU's switches in time order
    cpu, ts, nxt = cpu[by_cpu], ts[by_cpu], nxt[by_cpu]
    ended = cpu[1:] == cpu[:-1]                     # a later switch on the same CPU ends the run
    runs = pd.DataFrame({"pid": nxt[:-1][ended], "cpu": cpu[:-1][ended],
                         "dur": np.diff(ts)[ended]})
    about = np.concatenate([pid, prev[prev != pid]])
    counts = pd.Series(about[about > 0]).value_counts()
    out = pd.DataFrame({"pid": counts.index.to_numpy(np.int64),
                        "events": counts.to_numpy(np.int64)})
    seen = _pid_comms(events, cmdlines or {})
    out["comm"] = ["|".join(sorted(seen.get(int(p), []))) for p in out["pid"]]
    out["switch_ins"] = out["pid"].map(pd.Series(nxt).value_counts()).fillna(0).astype(np.int64)
    out["run_s"] = out["pid"].map(runs.groupby("pid")["dur"].sum() / 1e9).fillna(0.0)
    cpus = runs.groupby("pid")["cpu"].agg(lambda c: format_cpulist(sorted(set(c.tolist()))))
    out["cpus"] = out["pid"].map(cpus).fillna("")
    out = out.sort_values(["run_s", "pid"], ascending=[False, True], kind="stable")
    return out[["pid", "comm", "events", "switch_ins", "run_s", "cpus"]].reset_index(drop=True)


def trace_tasks_text(tasks: pd.DataFrame, limit: int = 40) -> str:
    """:func:`df_trace_tasks` as a table for the terminal, the ``limit`` that ran longest."""
    lines = [f"{'PID':>8}  {'RUN s':>9}  {'SWITCH-INS':>10}  {'EVENTS':>8}  {'CPUS':<9}  COMM"]
    for r in tasks.head(limit).itertuples():
        lines.append(f"{r.pid:>8}  {r.run_s:>9.3f}  {r.switch_ins:>10}  {r.events:>8}  "
                     f"{r.cpus:<9}  {r.comm}")
    if len(tasks) > limit:
        lines.append(f"... and {len(tasks) - limit} more tasks (of {len(tasks)})")
    return "\n".join(lines)


def select_pids(events: pd.DataFrame, seen: dict[int, set[str]], pids, comms, path) -> list[int]:
    """The pids of the experiment: the given pids plus every pid whose comm (``seen``:
    :func:`_pid_comms`) matches a glob.

    Raises ImportFailed if a given pid never appears or a comm matches nothing.
    """
    in_events = _distinct_pids([events[c].to_numpy() for c in ("pid", "prev_pid", "common_pid")])
    chosen = []
    for pid in pids:
        if pid not in in_events:
            raise ImportFailed(f"{path}: pid {pid} has no event in the trace (harmony import "
                               f"{path} --tasks lists its tasks)")
        chosen.append(pid)
    for pattern in comms:
        hit = sorted(p for p, names in seen.items() if p in in_events
                     and any(fnmatch.fnmatchcase(n, pattern) for n in names))
        if not hit:
            raise ImportFailed(f"{path}: no task with an event in the trace has a comm matching "
                               f"{pattern!r} (harmony import {path} --tasks lists them)")
        chosen += hit
    return sorted(set(chosen))


def _distinct_pids(columns: list[np.ndarray]) -> set[int]:
    """The distinct values of integer columns of pids: marked in a table as large as the largest
    pid (none is above pid_max, 2**22), no concatenation of the columns nor hashing of millions of
    values; hashed where a value lies outside (a damaged trace's)."""
    lows = [int(c.min()) for c in columns if len(c)]
    tops = [int(c.max()) for c in columns if len(c)]
    if not lows:
        return set()
    if min(lows) < -1 or max(tops) >= TABLE_KEYS_MAX:
        return set(pd.unique(np.concatenate(columns)).tolist())
    seen = np.zeros(max(tops) + 2, bool)      # -1 (no pid) marks the last slot, left out
    if use_compiled(sum(len(c) for c in columns), JIT_MIN_EVENTS):
        from harmony import importer_jit  # the compiled kernels: only on this path
        for c in columns:
            run_split(lambda lo, hi, _k, c=c: importer_jit.mark(c, seen, lo, hi), split(len(c)))
    else:
        for c in columns:
            seen[c] = True
    return set(np.flatnonzero(seen[:-1]).tolist()) | ({-1} if seen[-1] else set())


def _first_and_last(events: pd.DataFrame, pids: list[int]) -> tuple[int, int]:
    """The first and the last row of the events of ``pids`` (as pid, prev_pid or common_pid);
    the chosen tasks have some. A compiled pass from each end where it is used
    (:func:`_lookups_compiled`), else the rows marked."""
    cols = [events[c].to_numpy() for c in ("pid", "prev_pid", "common_pid")]
    want = np.asarray(sorted(pids), np.int64)
    jit = _lookups_compiled(events, want)
    if jit is not None:
        first, last = jit.first_and_last(*cols, key_table(want, np.int32))
        return int(first), int(last)
    theirs = in_set(cols[0], pids) | in_set(cols[1], pids) | in_set(cols[2], pids)
    return int(theirs.argmax()), len(theirs) - 1 - int(theirs[::-1].argmax())


def find_marker(markers: pd.DataFrame, text: str, path) -> int:
    """ts of the first marker whose text equals ``text`` (else the first that contains it)."""
    exact = markers.loc[markers["text"] == text, "ts"]
    if len(exact):
        return int(exact.iloc[0])
    part = markers.loc[markers["text"].astype(str).str.contains(text, regex=False), "ts"]
    if len(part):
        return int(part.iloc[0])
    if not len(markers):
        raise ImportFailed(f"{path}: holds no trace markers (perf.data never does); give the time "
                           "instead (--t0 / --end)")
    raise ImportFailed(f"{path}: no trace marker with the text {text!r} "
                       f"({len(markers)} markers in the file)")


def _task_index(values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Each of ``values``' position in ``want`` (sorted distinct pids), -1 for any other value, in
    the narrowest type (:func:`index_of`)."""
    return index_of(values, want, dtype=np.int16 if len(want) < 1 << 15 else np.int32)


#: the first window of events a look-up near one end of the trace (or t0) reads; it grows 4x
#: while a task is still missing (most tasks are found in the first)
LOOK_UP_WINDOW = 1 << 14


def _where_at(events: pd.DataFrame, pids: list[int], t0: int) -> dict[int, int]:
    """Per pid, the CPU it was on at t0: its last placement (switched in or out there, or moved
    or woken to it) before t0, else its first one after; -1 if none. Read from t0 backwards,
    then forwards, in growing windows, until every pid is placed: the rows around t0 only,
    where every task of a busy trace has an event."""
    pid, prev = events["pid"].to_numpy(), events["prev_pid"].to_numpy()
    want = np.asarray(sorted(pids), np.int64)
    codes, lut = event_kinds(events, {"sched_switch": 0, "sched_migrate_task": 1,
                                      "sched_wakeup": 1, "sched_wakeup_new": 1})
    cpu, target = events["cpu"].to_numpy(), events["target_cpu"].to_numpy()
    bound = int(np.searchsorted(events["ts"].to_numpy(), t0, side="right"))   # rows <= t0
    where = np.full(len(want), -1, np.int64)
    jit = _lookups_compiled(events, want)
    if jit is not None:
        jit.where_at(codes, lut, pid, prev, cpu, target, key_table(want, np.int32), bound, where)
        return {p: int(where[np.searchsorted(want, p)]) for p in pids}
    lut = np.append(lut, np.int8(-1))               # a missing event's code, -1: no placement
    todo = np.ones(len(want), bool)
    for start, stop, pick in ((bound, 0, np.maximum), (bound, len(events), np.minimum)):
        for lo, hi in growing_windows(start, stop, LOOK_UP_WINDOW):
            if not todo.any():
                break
            kind = lut[codes[lo:hi]]
            placed = []
            for is_kind, p, c in ((0, pid, cpu), (0, prev, cpu), (1, pid, target)):
                k, c = _task_index(p[lo:hi], want), c[lo:hi]
                r = np.flatnonzero((kind == is_kind) & (k >= 0) & (c >= 0))
                placed.append((r, k[r], c[r]))
            best = np.full(len(want), -1 if pick is np.maximum else hi, np.int64)
            for r, k, _ in placed:
                pick.at(best, k, r)
            found = todo & (best >= 0) & (best < hi)
            for r, k, c in placed:  # a row places a pid once (or twice on one CPU: to itself)
                hit = found[k] & (r == best[k])
                where[k[hit]] = c[hit]
            todo &= ~found
    return {p: int(where[np.searchsorted(want, p)]) for p in pids}


def _nice(events: pd.DataFrame, pids: list[int]) -> dict[int, tuple[int, int | None]]:
    """Per pid, (nice, kernel prio) from the prio its events show most often (the lowest of
    equally frequent ones)."""
    want = np.asarray(sorted(pids), np.int64)
    cols = [(events[pc].to_numpy(), events[qc].to_numpy())
            for pc, qc in (("pid", "prio"), ("prev_pid", "prev_prio"))]
    counts, values = _prio_counts(cols, want)
    out = {p: (0, None) for p in pids}
    if not counts.size:
        return out
    best = counts.argmax(axis=1)           # the most frequent, the lowest of equally frequent
    for k, p in enumerate(want.tolist()):
        if counts[k, best[k]]:
            q = int(values[best[k]])
            out[p] = ((q - 120 if 100 <= q <= 139 else 0), q)
    return out


#: rows taken at a time by _prio_counts and _pairs: their temporaries stay in the CPU's cache
CHUNK_ROWS = 1 << 16


def _prio_counts(cols, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, values): how many rows of the (pid, prio) columns ``cols`` name each of ``want``
    (sorted pids) with each prio ``values[j]`` >= 0, as counts[pid's index, j]."""
    lows, tops = zip(*((int(q.min(initial=0)), int(q.max(initial=-1))) for _, q in cols))
    width = max(tops) + 1
    if len(want) and want[0] >= 1 and want[-1] < 1 << 24 and min(lows) >= -1 and width <= 4096:
        # prios are small (0-139): a count per (pid, prio + 1), prio -1 (none) in column 0 and any
        # other pid in a last row, each row's bin one gather from a table of the pids
        row = width + 1
        table = np.full(int(want[-1]) + 2, len(want) * row + 1, np.int32)
        table[want] = np.arange(len(want), dtype=np.int32) * row + 1
        counts = np.zeros((len(want) + 1) * row, np.int64)
        if use_compiled(sum(len(p) for p, _ in cols), JIT_MIN_EVENTS):
            from harmony import importer_jit  # the compiled kernels: only on this path
            for p, q in cols:       # one pass each (10.25 M events: 0.07 s in chunks)
                importer_jit.prio_counts(p, q, table, counts)
            return counts.reshape(-1, row)[:-1, 1:], np.arange(width)
        buf = np.empty(CHUNK_ROWS, np.int32)
        for p, q in cols:
            for lo in range(0, len(p), CHUNK_ROWS):
                b = buf[:len(p[lo:lo + CHUNK_ROWS])]
                np.take(table, p[lo:lo + CHUNK_ROWS], mode="clip", out=b)   # pid < 1: table[0]
                b += q[lo:lo + CHUNK_ROWS]
                counts += np.bincount(b, minlength=len(counts))
        return counts.reshape(-1, row)[:-1, 1:], np.arange(width)
    who, prio = [], []
    for p, q in cols:
        k = index_of(p, want)
        keep = np.flatnonzero((k >= 0) & (q >= 0))
        who.append(k[keep]), prio.append(q[keep].astype(np.int64))
    who, prio = np.concatenate(who), np.concatenate(prio)
    if not len(prio):
        return np.zeros((len(want), 0), np.int64), np.zeros(0, np.int64)
    values = np.arange(int(prio.max()) + 1)
    if len(values) > 4096:                     # a damaged trace's: counted among those it holds
        values, prio = np.unique(prio, return_inverse=True)
    width = len(values)
    return (np.bincount(who * width + prio, minlength=len(want) * width).reshape(len(want), width),
            values)


def _last_comms(events: pd.DataFrame, pids: list[int]) -> dict[int, str]:
    """Per pid, the comm of its last event that names it (pid/comm or prev_pid/prev_comm; a task
    renames itself by exec or prctl); absent when none does. Read from the end backwards in
    growing windows, until every pid is named."""
    want = np.asarray(sorted(pids), np.int64)
    ts = events["ts"].to_numpy()
    best: dict[int, tuple] = {}
    jit = _lookups_compiled(events, want)
    for src, (pc, cc) in enumerate((("pid", "comm"), ("prev_pid", "prev_comm"))):
        p, named = events[pc].to_numpy(), _named(events[cc])
        last = np.full(len(want), -1, np.int64)       # each pid's last such row
        windows = growing_windows(len(events), 0, LOOK_UP_WINDOW)
        if jit is not None and isinstance(events[cc].dtype, pd.CategoricalDtype):
            cats = events[cc].cat.categories
            jit.last_named(p, events[cc].cat.codes.to_numpy(),
                           cats.get_loc("") if "" in cats else -2, key_table(want, np.int32),
                           last)
            windows = ()                                # every row read
        for lo, hi in windows:
            if (last >= 0).all():
                break
            k = _task_index(p[lo:hi], want)
            rows = np.flatnonzero((k >= 0) & named(lo, hi))
            found = np.full(len(want), -1, np.int64)
            np.maximum.at(found, k[rows], rows + lo)
            last = np.where(last >= 0, last, found)
        for k in np.flatnonzero(last >= 0):
            r, pid = int(last[k]), int(want[k])
            key = (int(ts[r]), src, r)                # the latest; at a tie, a prev_comm
            if pid not in best or key >= best[pid][0]:
                best[pid] = (key, cc)
    return {pid: str(events[cc].iat[key[2]]) for pid, (key, cc) in best.items()}


#: events from which the compiled look-ups repay loading numba in a new process, as the state
#: machine's; once numba is loaded (the decoder loads it for large traces) they are used whatever
#: the size
JIT_MIN_EVENTS = 8_000_000


def _lookups_compiled(events: pd.DataFrame, want: np.ndarray):
    """The compiled look-ups (:mod:`harmony.importer_jit`) where :func:`harmony.core.jit.
    use_compiled` says so and the pids ``want`` (sorted) fit a look-up table; else None."""
    if not len(want) or want[0] < 0 or want[-1] >= TABLE_KEYS_MAX \
            or not use_compiled(len(events), JIT_MIN_EVENTS):
        return None
    from harmony import importer_jit  # the compiled kernels: only on this path
    return importer_jit


def _named(comm: pd.Series):
    """A function of (lo, hi): whether the rows lo..hi of ``comm`` name a task (not ""; a
    missing comm does, as pandas compares it). Of a categorical column, by its codes."""
    if isinstance(comm.dtype, pd.CategoricalDtype):
        codes, cats = comm.cat.codes.to_numpy(), comm.cat.categories
        empty = cats.get_loc("") if "" in cats else -2      # -1 is a missing comm's code
        return lambda lo, hi: codes[lo:hi] != empty
    return lambda lo, hi: (comm.iloc[lo:hi] != "").to_numpy()


def tasks_from_trace(events: pd.DataFrame, pids: list[int], seen: dict[int, set[str]],
                     t0: int) -> tuple[pd.DataFrame, list[str]]:
    """The tasks table of an imported run (see :mod:`harmony.workload.tasks`), plus trust notes.

    name: the task's comm (``comm-pid`` if several chosen tasks share it); role "cpu"; duty 100
    (the trace does not say what a task demands); nice from its kernel prio; initial_cpu: the CPU
    it was on at t0.
    """
    last = _last_comms(events, pids)
    comms = {pid: last.get(pid) or sorted(seen.get(pid, {f"pid{pid}"}))[0] for pid in pids}
    counts = pd.Series(list(comms.values())).value_counts()
    nice, where = _nice(events, pids), _where_at(events, pids, t0)
    specs, notes, rt = [], [], []
    for pid in pids:
        comm = comms[pid]
        n, prio = nice[pid]
        if prio is not None and prio < 100:
            rt.append(pid)
        name = comm if counts[comm] == 1 else f"{comm}-{pid}"
        specs.append(TaskSpec(name=name, nice=n, initial_cpu=where[pid]))
    df = tasks_frame(specs, pids)
    df["comm"] = [comms[p] for p in pids]
    if rt:
        notes.append(trust.note("realtime_tasks", pids=rt))
    return df, notes


# --- the run directory -------------------------------------------------------------------------

#: what a uname field holds when it was not known ("-": Harmony's exports; "(none)": Linux's)
UNKNOWN_WORDS = ("", "-", "(none)", "?")


def uname_facts(uname: str) -> dict:
    """The facts of a trace's UNAME text as trace-cmd writes it ("sysname nodename release
    version... machine", the version of several words): {"nodename", "kernel_build",
    "machine"}, each only when the text gives it."""
    parts = str(uname or "").split()
    if len(parts) < 3:
        return {}
    facts = {"nodename": parts[1],
             "kernel_build": " ".join(parts[3:-1]) if len(parts) >= 5 else "",
             "machine": parts[-1] if len(parts) >= 4 else ""}
    return {k: v for k, v in facts.items() if v not in UNKNOWN_WORDS}


def recorded_on(meta: dict) -> str:
    """Where a trace was recorded, from what its file says: "host NAME, Linux RELEASE (MACHINE)"
    with the parts it does not say left out ("an unknown host" when it says none)."""
    facts = uname_facts(meta.get("uname", ""))
    sysname = (str(meta.get("uname") or "").split() or ["Linux"])[0]
    kernel = meta.get("kernel")
    words = ([f"host {facts['nodename']}"] if "nodename" in facts else []) + (
        [f"{sysname} {kernel}" + (f" ({facts['machine']})" if "machine" in facts else "")]
        if kernel else [])
    return ", ".join(words) or "an unknown host"


def imported_scheduler(release: str | None, uname: str = "") -> str:
    """The manifest's ``host.scheduler`` of a trace recorded on a kernel ``release``: the one the
    release implies, said to be implied -- "CFS (implied by kernel 6.1)", "EEVDF (implied by
    kernel 6.12)" -- since a sched_ext scheduler enabled when it was recorded leaves no mark in
    the release; "?" with the reason when it records none, or one that is no version. A
    simulated run's export (its ``uname`` names the simulator): the reference policy it ran."""
    if str(uname).split()[:1] == [SIMULATOR_SYSNAME]:
        policy = uname_facts(uname).get("kernel_build") or "?"
        return f"reference policy {policy} (a simulated run, exported)"
    if not release:
        return "? (the trace records no kernel release)"
    name = hostfacts.implied_scheduler(release)
    if name is None:
        return f"? (kernel release {release!r} is no version)"
    major, minor = hostfacts.kernel_version(release)
    return f"{name} (implied by kernel {major}.{minor})"


def layout_params(exp, tasks: pd.DataFrame, cpus: list[int],
                  given: dict) -> tuple[dict, set[str]]:
    """What the layout of an imported trace at t0 (the chosen tasks on each CPU of ``cpus``,
    from ``tasks``' initial_cpu) shows of ``exp``'s parameters (its
    :meth:`~harmony.experiments.base.Experiment.from_layout`): ({name: value}, the names it
    does not show), leaving out those ``given`` (-p)."""
    where = tasks["initial_cpu"].to_numpy()
    placed = [int((where == c).sum()) for c in cpus]
    said = {k: v for k, v in exp.from_layout(placed, list(cpus)).items() if k not in given}
    return ({k: v for k, v in said.items() if v is not None},
            {k for k, v in said.items() if v is None})


def import_trace(path: Path, out: Path, pids=(), comms=(), cpus: list[int] | None = None,
                 t0_s: float | None = None, t0_marker: str | None = None,
                 end_s: float | None = None, end_marker: str | None = None,
                 experiment: str = "single-source", params: dict | None = None,
                 buffer: str | None = None, progress=None,
                 memory_check: bool = True, disk_check: bool = True,
                 figures: bool = True) -> store.Run:
    """Analyse ``path`` into the run directory ``out``; returns the loaded, complete run.
    ``progress``: called with a short line as each long step starts (reading, tables, figures).
    ``figures=False`` leaves the figures to ``harmony report`` (:func:`pipeline.draw_figures`):
    the run is complete, its manifest says they are deferred.
    ``memory_check``: refuse a trace this host has not the memory for (:func:`check_memory`);
    ``disk_check``: one ``out``'s file system has not the room for (:func:`check_disk`).

    Raises ParameterError before anything is read for an ``out`` that holds a run already, an
    experiment a trace cannot be analysed as, or one whose analysis needs a parameter not given
    (:meth:`Experiment.import_problem`); TraceCorrupt / ProbeError (the file cannot be read),
    ImportFailed (it can, but not as asked) or ValueError (bad experiment parameters); ``out``
    is then marked incomplete with the reason if it was already created. A stop (Ctrl-C) leaves
    no directory, or the run marked incomplete.

    The phases: the checks before anything is read (:func:`_check_room`), the reading and the
    choice of the tasks (:func:`_read_chosen`), the window (:func:`_window`), the CPU set and
    the tasks table (:func:`_tasks_and_cpus`), the run directory (:func:`_new_run`), and the
    analysis, with the copy of the trace made meanwhile (:func:`_analyse_copying`).
    """
    path, out = Path(path), Path(out)
    if (out / "manifest.json").exists():    # not overwritten, nor marked incomplete on an error
        raise ParameterError(f"{out} already holds a run; choose another out")
    exp = get_experiment(experiment)
    why = exp.import_problem(params or {})
    if why:
        raise ParameterError(why)
    step = progress or (lambda what: None)
    _check_room(path, out, buffer, memory_check, disk_check)
    step(f"reading {path.name} ({path.stat().st_size / 1e6:,.0f} MB)")
    read = _read_chosen(path, buffer, pids, comms)
    window = _window(read, path, t0_s, t0_marker, end_s, end_marker)
    tasks, cpu_set = _tasks_and_cpus(read, path, cpus, window)
    overrides = dict(params or {})
    overrides["duration"] = str((window.end - window.t0) / 1e9)
    shown, unshown = layout_params(exp, tasks, cpu_set, given=overrides)
    values = _resolve_shown(exp, overrides, shown, cpu_set, path)
    # how the tasks were started, released and asked to run is not in a trace, nor what its
    # layout does not show: not listed
    not_known = sorted((exp.workload_params() | unshown) & set(values) - set(overrides)
                       - set(shown))
    values = {k: v for k, v in values.items() if k not in not_known}
    manifest = _new_manifest(exp, values, cpu_set, read, path, pids, comms, window, not_known,
                             sorted(shown), cpus_given=bool(cpus))
    try:
        _new_run(out, manifest)
        return _analyse_copying(path, out, manifest, read, tasks, window, step, figures)
    except BaseException as exc:
        # stopped before the analysis could say so: as the run was made (a stop that lands in
        # _new_run leaves no directory), or just after
        if manifest.get("status") == "running" and (out / "manifest.json").exists():
            pipeline.mark_incomplete(out, manifest, pipeline.reason(exc))
        raise


def _resolve_shown(exp, overrides: dict, shown: dict, cpu_set: list[int], path: Path) -> dict:
    """``exp``'s parameters with ``overrides`` (-p) and what the trace's layout ``shown``; a
    layout the experiment cannot analyse (intrinsic-imbalance's N a multiple of P) is the trace's
    problem, ImportFailed (status 1), not a usage error: the parameters given are fine alone."""
    try:
        return exp.resolve(overrides | shown, cpu_set)
    except ParameterError as exc:
        if not shown:
            raise
        exp.resolve(overrides, cpu_set)     # the parameters given at fault: a usage error
        layout = ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        raise ImportFailed(f"{path}: its layout at t0 ({layout}) is not one {exp.name} "
                           f"analyses: {exc}") from None


@dataclasses.dataclass
class _Read:
    """A trace read for an import: its capture and kind, every comm each pid was seen with, the
    pids chosen, the trust notes so far and the files' CPUs."""

    cap: Capture
    kind: str
    seen: dict[int, set[str]]
    chosen: list[int]
    notes: list[dict]
    file_cpus: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Window:
    """t0 and the end of an import's window (ns), and where each came from."""

    t0: int
    end: int
    t0_from: str
    end_from: str


def _check_room(path: Path, out: Path, buffer: str | None, memory_check: bool,
                disk_check: bool) -> None:
    """Refuse, before anything is read, a trace this host has not the memory or ``out`` the
    room for (as asked)."""
    if memory_check or disk_check:
        kind = sniff(path)
        est = memory_needed(path, buffer, kind)
        if memory_check:
            check_memory(path, est, kind)
        if disk_check:
            check_disk(path, out, est)


def _read_chosen(path: Path, buffer: str | None, pids, comms) -> _Read:
    """Read ``path`` and choose its tasks (the pids given, and those whose comm matches);
    ImportFailed where the trace holds nothing to import. The sched_wakeup events of a trace
    that has none are derived from its sched_waking."""
    cap, kind = read_trace(path, buffer)
    events, meta = cap.events, cap.meta
    if not len(events):
        raise ImportFailed(f"{path}: holds no sched event")
    absent = absent_events(events)
    if "sched_switch" in absent:
        raise ImportFailed(f"{path}: holds no sched_switch event: no run or run queue can be "
                           "rebuilt without them (record sched:sched_switch at least)")
    seen = _pid_comms(events, meta.get("cmdlines", {}))
    chosen = select_pids(events, seen, pids, comms, path)
    what = kind if kind == "perf.data" else (
        f"trace.dat v{meta.get('file_version')}, {meta.get('compression')}"
        + (f", buffer {meta['buffer']!r}" if meta.get("buffer") else ""))
    notes = [trust.note("imported_from", path=str(path), what=what,
                        host=recorded_on(meta))]
    notes += trust.absent_events_notes(absent)
    meta["events_missing"] = absent
    if "sched_wakeup" in absent:
        events, derived = wakeups_from_waking(events)
        if derived:
            cap = dataclasses.replace(cap, events=events)
            meta["derived_events"] = {"sched_wakeup": dict(derived, source="sched_waking")}
            notes.append(trust.note("wakeups_derived", **derived))
    return _Read(cap, kind, seen, chosen, notes)


def _window(read: _Read, path: Path, t0_s, t0_marker, end_s, end_marker) -> _Window:
    """t0 and the end: a marker's, a time given, else the first and last events of the chosen
    tasks; ImportFailed unless t0 lies in the trace before the end."""
    events, markers, notes = read.cap.events, read.cap.markers, read.notes
    # the first and last events of the chosen tasks (two stamps, not a copy of theirs: that
    # would live as long as the analysis, 8 bytes an event)
    stamp = events["ts"].to_numpy()
    mine = stamp[list(_first_and_last(events, read.chosen))]
    if t0_marker is not None:
        t0, t0_from = find_marker(markers, t0_marker, path), f"trace marker {t0_marker!r}"
    elif t0_s is not None:
        t0, t0_from = int(round(t0_s * 1e9)), f"given time {t0_s} s"
    else:
        t0 = int(mine[0])
        t0_from = "first event of the chosen tasks"
        notes.append(trust.note("t0_default"))
    if end_marker is not None:
        t_end, end_from = find_marker(markers, end_marker, path), f"trace marker {end_marker!r}"
    elif end_s is not None:
        t_end, end_from = int(round(end_s * 1e9)), f"given time {end_s} s"
    elif int(mine[-1]) > t0:
        # as t0: the stretch the tasks were seen in; after the last of them exits, the file's
        # tail would only dilute their shares
        t_end, end_from = int(mine[-1]), "last event of the chosen tasks"
        notes.append(trust.note("end_default"))
    else:
        t_end, end_from = int(events["ts"].iloc[-1]), "last event in the file"
    stamps = np.concatenate([events["ts"].to_numpy()[[0, -1]], markers["ts"].to_numpy()])
    first, last = int(stamps.min()), int(stamps.max())      # markers are part of the trace too
    if not first <= t0 < t_end:
        raise ImportFailed(f"{path}: t0 ({t0 / 1e9:.6f} s, {t0_from}) must lie in the trace "
                           f"({first / 1e9:.6f} .. {last / 1e9:.6f} s) and before the end "
                           f"({t_end / 1e9:.6f} s, {end_from})")
    return _Window(t0, t_end, t0_from, end_from)


def _tasks_and_cpus(read: _Read, path: Path, cpus, window: _Window) -> tuple[pd.DataFrame,
                                                                             list[int]]:
    """(the tasks table, the CPU set): the CPUs given, else the file's; ImportFailed if every
    chosen task was outside them at t0 (some: a note)."""
    events, meta, notes = read.cap.events, read.cap.meta, read.notes
    t0 = window.t0
    read.file_cpus = sorted(set(int(c) for c in meta.get("cpus", []))
                            | _distinct_pids([events["cpu"].to_numpy()]))   # marked, not sorted
    cpu_set = list(cpus) if cpus else read.file_cpus
    if not cpus:
        notes.append(trust.note("cpus_default", cpus=format_cpulist(cpu_set)))
    outside = sorted(set(cpu_set) - set(read.file_cpus))
    if outside:
        notes.append(trust.note("cpus_without_events", cpus=outside))
    tasks, task_notes = tasks_from_trace(events, read.chosen, read.seen, t0)
    notes += task_notes
    where = dict(zip(tasks["pid"].tolist(), tasks["initial_cpu"].tolist()))
    off = {pid: c for pid, c in where.items() if c not in cpu_set}
    if off:
        # e.g. a task placed on a CPU `perf record -C` did not record, just after the default t0
        what = (f"at t0 ({t0 / 1e9:.6f} s, {window.t0_from}) the chosen tasks {sorted(off)[:10]} "
                f"were on CPUs {sorted(set(off.values()))}"
                + (" (-1: not yet placed)" if -1 in off.values() else "")
                + f", outside the CPU set {format_cpulist(cpu_set)}")
        if len(off) == len(where):
            raise ImportFailed(f"{path}: {what}; give --cpus, or a later t0 (--t0, --t0-marker)")
        notes.append(trust.note("tasks_outside_cpu_set", what=what))
    notes.append(trust.note("demand_unknown"))
    return tasks, cpu_set


def _new_manifest(exp, values, cpu_set: list[int], read: _Read, path: Path, pids, comms,
                  window: _Window, not_known: list[str], from_layout: list[str],
                  cpus_given: bool = False) -> dict:
    """The manifest of the run (``not_known``: the parameters the trace cannot tell;
    ``from_layout``: those its layout at t0 showed)."""
    meta, kind = read.cap.meta, read.kind
    return pipeline.new_manifest(
        exp, values, cpu_set, f"import:{kind}", None,
        host={"kernel": meta.get("kernel") or "?",
              "scheduler": imported_scheduler(meta.get("kernel"), meta.get("uname", "")),
              "ncpus": meta.get("n_cpus") or len(read.file_cpus), "uname": meta.get("uname", ""),
              **uname_facts(meta.get("uname", ""))},
        source={"imported": str(path.resolve()), "format": kind,
                "file_version": meta.get("file_version"), "compression": meta.get("compression"),
                "buffer": meta.get("buffer"), "pids": list(pids), "comms": list(comms),
                "t0_from": window.t0_from, "end_from": window.end_from,
                "cpus_from": "--cpus" if cpus_given else "every CPU the file recorded",
                "stored": f"{RAW_DIR}/{path.name}", "params_not_known": not_known,
                "params_from_layout": from_layout})


def _new_run(out: Path, manifest: dict) -> None:
    """Make the run directory ``out`` and write ``manifest`` in it."""
    with store.new_run_dir(out):
        store.write_json(out / "manifest.json", manifest)


def _analyse_copying(path: Path, out: Path, manifest: dict, read: _Read, tasks: pd.DataFrame,
                     window: _Window, step, figures: bool = True) -> store.Run:
    """The analysis of the run (:func:`pipeline.analyse_capture`), while the copy of the trace
    kept with it (filemap.copy_file: by the device, past the page cache) is made; waited for
    before the run is written complete, what is left of it then going through the page cache
    (a slow disk's wait)."""
    hurry, stop = threading.Event(), threading.Event()
    copying = in_background(filemap.copy_atomically, path, out / RAW_DIR / path.name, hurry, stop)

    def copied():
        hurry.set()
        copying.result()
    try:
        return pipeline.analyse_capture(out, manifest, read.cap, tasks,
                                        pipeline.Window(window.t0, window.end),
                                        pipeline.Origin("imported", notes=read.notes),
                                        progress=step, before_complete=copied, figures=figures)
    finally:
        stop.set()                  # an error or a signal: the run is incomplete, its copy moot
        futures.wait([copying])     # never leave the copy running behind an error
