"""What a perf.data file says of itself: its header checked (:func:`check_perf_data`), the clock its
sched events were stamped with (:func:`clock_of`) and what the samples perf lost mean for the sched
events (:func:`lost_sched_events`). Used for the perf probe's recordings
(:mod:`harmony.probes.perf`) and perf.data files from elsewhere (:mod:`harmony.importer`), with the
facts :mod:`harmony.probes.perf_read` reads from the file.

The same facts as ``perf report`` prints them (:func:`run_perf_report`): the clock
(:func:`clock_name`), the CPUs it was recorded on (:func:`recorded_cpus`), numbers of its header
(:func:`header_number`), the samples lost per event (:func:`lost_samples_by_event`). They were
the perf probe's source before it read perf.data itself; the tests check the reader against them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from harmony.core.errors import TraceCorrupt
from harmony.core.osutil import parse_cpulist
from harmony.probes.perf_read import read_header
from harmony.probes.perf_script import PerfScriptParser
from harmony.probes.perf_tool import PERF_ENV, die_with_parent_preexec, first_error_line
from harmony.probes.schema import CAUSE_EVENTS

# --------------------------------------------------------------------------------------------------
# perf.data header check

def check_perf_data(path: Path) -> dict:
    """Validate the header of a perf.data file cheaply
    (:func:`harmony.probes.perf_read.read_header`: no record is read); raise TraceCorrupt
    naming the file.

    Catches the usual ways a recording goes bad: empty/truncated file, perf killed before it wrote
    the final header (data size 0), and a file cut short after the data section (the feature
    sections that perf appends at the end point past the end of the file).
    """
    head = read_header(path)
    return {"bytes": head.size, "data_offset": head.data_offset, "data_size": head.data_size}


# --------------------------------------------------------------------------------------------------
# what perf report reads from it

def run_perf_report(perf: str, path: Path, what: str) -> str:
    """``perf report``'s text for ``path`` with the option ``what`` (``--header-only``,
    ``--stats``); raises TraceCorrupt naming ``path`` if perf report fails."""
    r = subprocess.run([perf, "report", "-f", "-i", str(path), what], capture_output=True,
                       env=PERF_ENV, timeout=600, preexec_fn=die_with_parent_preexec(os.getpid()))
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        raise TraceCorrupt(f"{path}: perf report {what} failed (exit {r.returncode}): "
                           + first_error_line(r.stderr.decode("utf-8", "replace") + out))
    return out


def recorded_cpus(perf: str, path: Path, max_lines: int = 20_000) -> set[int] | None:
    """The CPUs ``path`` was recorded on (its PERF_RECORD_CPU_MAP: ``-C``, or every CPU with
    ``-a``), or None if perf does not say. Read from ``perf report -D``, which prints the map with
    the records that precede the samples: perf is stopped as soon as it is found, or after
    ``max_lines`` lines."""

    proc = subprocess.Popen([perf, "report", "-f", "-D", "-i", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=PERF_ENV,
                            preexec_fn=die_with_parent_preexec(os.getpid()))
    found = None
    try:
        for _, line in zip(range(max_lines), proc.stdout):
            m = re.search(rb"PERF_RECORD_CPU_MAP: ([\d,\-]+)\s*$", line)
            if m:
                try:
                    found = set(parse_cpulist(m.group(1).decode()))
                except ValueError:
                    pass
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return found or None


def header_number(header: str, key: str) -> int | None:
    """The number a ``perf report --header-only`` line "# key : N" gives, or None."""
    m = re.search(rf"^# {re.escape(key)} : (\d+)\s*$", header, re.M)
    return int(m.group(1)) if m else None


def sched_clockids(header: str) -> set:
    """The clockids of the sched events in ``perf report --header-only`` (None: one recorded
    without ``-k``); empty if the header lists no sched event."""
    ids = set()
    for line in header.splitlines():
        if line.startswith("# event : name = sched:"):
            m = re.search(r"\bclockid = (\d+)", line)
            ids.add(int(m.group(1)) if m and "use_clockid = 1" in line else None)
    return ids


#: perf's clockids (``perf record -k``) by the names tracefs gives the same clocks
CLOCKID_NAMES = {0: "realtime", 1: "mono", 4: "mono_raw", 7: "boot", 11: "tai"}
DEFAULT_CLOCK = "perf (sched_clock, perf's default)"


def clock_name(header: str) -> str:
    """The clock a perf.data's sched events were stamped with, from ``perf report --header-only``:
    the tracefs name of its ``-k`` clockid, ``clockid N`` for one without, ``mixed clockids`` if
    they differ, or :data:`DEFAULT_CLOCK` when none was asked for."""
    return clock_of(sched_clockids(header))


def clock_of(ids: set) -> str:
    """The clock named as :func:`clock_name` names it, from the sched events' clockids (None:
    one recorded without ``-k``), e.g. :meth:`harmony.probes.perf_read.PerfRead.clockids`."""
    if len(ids) > 1:
        return f"mixed clockids {sorted(ids, key=str)}"
    (clockid,) = ids or {None}
    if clockid is None:
        return DEFAULT_CLOCK
    return CLOCKID_NAMES.get(clockid, f"clockid {clockid}")


def lost_sched_events(lost_records: int,
                      lost_samples: dict[str, int] | None) -> tuple[int, list[str]]:
    """(sched events lost, notes) from perf's own counters: ``lost_records``, what the
    PERF_RECORD_LOST records say (per CPU, every event), and ``lost_samples``, the per-event
    LOST_SAMPLES counts of ``perf report --stats`` (:func:`lost_samples_by_event`), which add up
    to the same total. Only the events Harmony decodes count (the sched events and those that
    tell why a task moved, the scheduler's softirq's among them): other events a recording
    sampled (perf's dummy event, cycles, sched_stat_runtime, ...) are named in a note instead."""
    if lost_samples is None:
        return lost_records, ["the recording has no LOST_SAMPLES counts; lost_events counts "
                              "PERF_RECORD_LOST records only"]
    notes = []
    decoded = {f"sched:{name}" for name in PerfScriptParser.EVENT_NAMES}
    decoded |= {f"{system}:{ev}" for system, ev, _ in CAUSE_EVENTS}     # read by the causes
    sched_lost = sum(v for k, v in lost_samples.items() if k in decoded)
    other = {k: v for k, v in lost_samples.items() if k not in decoded and v}
    other_lost = sum(other.values())
    if other_lost:
        notes.append(f"{other_lost} records of events Harmony does not decode were lost, by event: "
                     f"{other} (perf's dummy event carries comm/mmap/fork side-band records); "
                     "none of them is a decoded sched event")
    if lost_records != sched_lost + other_lost:
        notes.append(f"PERF_RECORD_LOST total {lost_records} != LOST_SAMPLES total "
                     f"{sched_lost + other_lost}")
    # if the per-event counts do not explain every lost record, assume the rest were sched events
    return max(sched_lost, lost_records - other_lost), notes


def lost_samples_by_event(stats: str) -> dict[str, int] | None:
    """Per-event LOST_SAMPLES counts from ``perf report --stats`` (None if it lists no events)."""
    out: dict[str, int] = {}
    current = None
    for line in stats.splitlines():
        m = re.match(r"^(\S+) stats:$", line.strip())
        if m and m.group(1) == "Aggregated":  # its LOST_SAMPLES line counts records, not samples
            current = None
            continue
        if m:
            current = m.group(1)
            out.setdefault(current, 0)
            continue
        m = re.match(r"^\s*LOST_SAMPLES events:\s+(\d+)", line)
        if m and current is not None:
            out[current] += int(m.group(1))
    return out or None


__all__ = ["CLOCKID_NAMES", "DEFAULT_CLOCK", "check_perf_data", "clock_name", "clock_of",
           "header_number", "lost_samples_by_event", "lost_sched_events", "recorded_cpus",
           "run_perf_report", "sched_clockids"]
