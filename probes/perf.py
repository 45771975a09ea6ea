"""The ``perf`` probe: records the sched tracepoints with ``perf record`` and decodes them with
``perf script``. It is independent of the tracefs probe (own kernel interface: perf_event_open ring
buffers instead of the ftrace ring buffer; own decoder: perf's libtraceevent text instead of raw
records), so the two cross-check each other.

Files in ``out_dir``::

    perf.data      what ``perf record`` wrote
    perf.log       perf record's stderr
    owner.pid      "<pid> <starttime>" of the Python process that owns the recording
    perf.pid       pid of the perf record process (lets reclaim_stale() prove a perf is ours)
    markers.jsonl  one JSON object per mark(): ts (CLOCK_MONOTONIC ns), cpu, pid, text
    meta.json      written by stop(): perf version, command line, clock, events, cpus, kernel, ...

How start() knows recording is live: perf is started with every event disabled (``-D -1``) and a
control pipe (``--control fd:CTL,ACK``). Once perf has opened and mmapped all events, start()
writes ``enable`` to the control pipe; perf enables every event (ioctl PERF_EVENT_IOC_ENABLE on every
per-CPU fd, synchronous in the kernel) and only then answers ``ack``. start() returns after reading
the ``ack``, so every tracepoint hit after start() returns is recorded (barring ring-buffer loss,
which perf reports and decode() counts).

Timestamps: ``-k CLOCK_MONOTONIC`` makes the kernel stamp every sample with ktime_get_mono_fast_ns(),
the clock tracefs calls "mono" and ``time.clock_gettime_ns(time.CLOCK_MONOTONIC)`` reads, so the
events, the markers and the tracefs probe's events share one time base. decode() checks that every
sched event in perf.data really carries clockid 1.

Markers: a ``trace_marker`` write is an ftrace ``print`` event; it goes into tracefs ring buffers
only, never to perf (perf can open ``ftrace:print`` but receives nothing). So mark() reads
CLOCK_MONOTONIC in user space (vDSO: the same timekeeper as the kernel's stamps) immediately before
returning to the caller's action and appends it to markers.jsonl. The marker therefore precedes
the action it marks (e.g. the SIGCONT that releases the workers) by the few microseconds of one
JSON write; it is never late. Measured against the tracefs probe in ``--crosscheck perf`` runs
(where the perf marker is written right after the tracefs one), over 10 runs: the user-space
stamp trails the kernel's trace_marker stamp by 10-22 us at t0, 4-8 us at "released" and 8-46 us
at the end; this includes the tracefs write itself, so a perf-only marker is closer still. A kernel-stamped alternative (a filtered syscall
tracepoint) would put the marker into perf.data but needs CONFIG_FTRACE_SYSCALLS and still would not
carry the text; the user-space stamp is simpler and precise enough for t0 and end.

Blind task contexts (measured on this host, kernel 6.18, perf 6.1): perf records *nothing* that fires
while certain tasks are current - swapper/1 (CPU 1's idle task) and threads of PID 1 (the VM's init
agent) - at any level: their sched_switch, and the hardirq/softirq work done on their stack (an idle
CPU 1's timer wake-ups and its idle balancer's migrations), while the same tracepoints in every
other task's context, swapper/0's included, are recorded. No LOST or THROTTLE record appears. The
kernel does count those hits: a tracepoint event opened with perf_event_open() directly (no perf
tool), sampling every hit on CPU 1, read 621 hits (tracefs: 621, 541 of them in swapper/1) but
wrote 74 samples, none from swapper/1, and its lost-sample counter stayed 0. So they are dropped
between the event's count and its ring buffer, inside the kernel; why is not known (tracefs also
records none of these tasks' task-level events, e.g. no switch out of swapper/1, so the kernel
treats those tasks specially). In a ``<4,0>`` run this drops exactly the first moves, which idle
CPU 1 pulls. Every run's analysis (``harmony.pipeline.blind_spots``, for any probe) therefore
reports, from the probe's own stream, the contexts it saw run but recorded nothing in
(``silent_contexts``) and the moves that the tasks' own events prove but no sched_migrate_task
records (``unrecorded_migrations``), in the manifest and notes.

Tracepoint order: when both probes record, the kernel calls the handlers of one tracepoint hit in
the order the probes were enabled; ``harmony run --crosscheck perf`` starts perf first, so perf's
stamp of a hit is ~2 us earlier than tracefs's (see :mod:`harmony.analysis.probe_agreement`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from operator import itemgetter
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.osutil import (die_with_parent, online_cpus, parse_cpulist, proc_starttime,
                            sched_getcpu)
from harmony.probes.base import Capture, Probe, ProbeError, TraceCorrupt
from harmony.probes.schema import COLUMNS, SCHED_EVENTS, make_events, make_markers

PERF_EVENTS = ",".join(f"sched:{e}" for e in SCHED_EVENTS)
CLOCK_NAME = "mono"  # the tracefs name of CLOCK_MONOTONIC (ktime_get_mono_fast_ns)
CLOCK_ID = "CLOCK_MONOTONIC"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

_ENV = {**os.environ, "LC_ALL": "C", "PAGER": "cat", "PERF_PAGER": "cat"}


# --------------------------------------------------------------------------------------------------
# process helpers

def _die_with_parent(parent_pid: int):
    """preexec_fn: the child gets SIGKILL when the thread that forked it dies (PR_SET_PDEATHSIG)."""
    def setup():
        if not die_with_parent(parent_pid):  # the parent died before the request took effect
            os._exit(1)
    return setup


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def mmap_pages_for(duration_s: float, ncpus: int) -> int:
    """Per-CPU ring-buffer size in pages (a power of two, as perf requires).

    perf drains the buffers continuously, so the buffer only has to absorb bursts while perf is
    descheduled or blocked on writing. We budget a burst of ~100k events/s/CPU at ~136 bytes per
    sample for at least 0.3 s (1024 pages of 4 KiB), longer runs get more headroom (up to 8192 pages
    = 32 MiB per CPU), and the total stays under 1/8 of the available memory.
    """
    pages = _pow2_ceil(min(8192, max(1024, int(duration_s * 256))))
    try:
        avail_kb = next(int(line.split()[1]) for line in open("/proc/meminfo")
                        if line.startswith("MemAvailable:"))
        cap = avail_kb * 1024 // 8 // max(1, ncpus) // PAGE_SIZE
        while pages > 64 and pages > cap:
            pages //= 2
    except (OSError, StopIteration, ValueError):
        pass
    if os.geteuid() != 0:  # unprivileged: perf_event_mlock_kb bounds the buffer of each CPU
        try:
            mlock_kb = int(Path("/proc/sys/kernel/perf_event_mlock_kb").read_text())
            while pages > 1 and pages * PAGE_SIZE // 1024 > mlock_kb:
                pages //= 2
        except (OSError, ValueError):
            pass
    return pages


def _perf_version(perf: str) -> str:
    try:
        out = subprocess.run([perf, "version"], capture_output=True, text=True, timeout=10,
                             env=_ENV).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.removeprefix("perf version ").strip()


@functools.lru_cache(maxsize=None)
def _record_help(perf: str) -> str:
    """``perf record -h``'s text ("" if it does not run), asked once per binary."""
    try:
        r = subprocess.run([perf, "record", "-h"], capture_output=True, text=True, timeout=10,
                           env=_ENV)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout + r.stderr


def _record_knows(perf: str, option: str) -> bool:
    """Whether this ``perf record`` has ``option`` (its help lists it)."""
    return option in _record_help(perf)


def _first_error_line(text: str) -> str:
    """The most telling line of a perf error message."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Events disabled", "[ perf record"))]
    for i, ln in enumerate(lines):
        if ln.rstrip(":").lower() == "error" and i + 1 < len(lines):
            return lines[i + 1]
    for ln in lines:
        if "error" in ln.lower() or "fail" in ln.lower() or "invalid" in ln.lower():
            return ln
    return lines[-1] if lines else "no output"


# --------------------------------------------------------------------------------------------------
# perf.data header check (struct perf_file_header, tools/perf/util/header.h)

_HEADER = struct.Struct("<8sQQ QQ QQ QQ 4Q")  # magic size attr_size attrs data event_types features


def check_perf_data(path: Path) -> dict:
    """Validate the header of a perf.data file cheaply; raise TraceCorrupt naming the file.

    Catches the usual ways a recording goes bad: empty/truncated file, perf killed before it wrote
    the final header (data size 0), and a file cut short after the data section (the feature
    sections that perf appends at the end point past the end of the file).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            (magic, hsize, _attr_size, attrs_off, attrs_size, data_off, data_size, _et_off,
             _et_size, *features) = _HEADER.unpack(head) if len(head) == _HEADER.size else (
                b"",) + (0,) * 12
            if magic != b"PERFILE2":
                raise TraceCorrupt(f"{path}: not a perf.data file (bad magic, {size} bytes)")
            if data_size == 0:
                raise TraceCorrupt(f"{path}: perf record did not finish it (data size 0 in header)")
            end = data_off + data_size
            if hsize < _HEADER.size or attrs_off + attrs_size > size or end > size:
                raise TraceCorrupt(f"{path}: truncated ({size} bytes, header says data ends at "
                                   f"{end})")
            nfeat = sum(bin(w).count("1") for w in features)
            f.seek(end)
            table = f.read(16 * nfeat)
            if len(table) != 16 * nfeat:
                raise TraceCorrupt(f"{path}: truncated (feature table past the end of the file)")
            for i in range(nfeat):
                off, sz = struct.unpack_from("<QQ", table, 16 * i)
                if off + sz > size:
                    raise TraceCorrupt(f"{path}: truncated (feature section past the end of the "
                                       f"file)")
    except OSError as e:
        raise TraceCorrupt(f"{path}: cannot read: {e.strerror or e}") from None
    return {"bytes": size, "data_offset": data_off, "data_size": data_size}


# --------------------------------------------------------------------------------------------------
# perf script text -> canonical columns

# perf script -F trace:tid,cpu,time,event,trace --ns prints, per sample:
#   "%5d [%03d] %5lu.%09lu: %*s: <tracepoint print fmt>"   e.g.
#   " 6468 [000]   354.805768520:       sched:sched_switch: prev_comm=perf prev_pid=6468 ..."
# and with --show-lost-events, per PERF_RECORD_LOST:
#   " 5525 [000]   333.060311719: PERF_RECORD_LOST lost 1"
# Each chunk is prefixed with "\n" so that every line starts with the literal "\n" (lets the regex
# engine skip to candidates quickly instead of trying a match at every character).
# The event is "sched:NAME" (-> NAME) or, for the other subsystems' tracepoints, "SYS:NAME" (kept
# whole, as the trace.dat decoder names them).
_LINE_RE = re.compile(r"\n *(-?\d+) +\[(\d+)\] +(\d+)\.(\d{9}): +"
                      r"(?:sched:)?((?:\w+:)?\w+):? ([^\n]*)")
# Samples of other events (cycles, cpu-clock, ... in a recording that sampled them too) come in
# perf's default fields, one line each (-G hides their call chains), the CPU only if recorded:
#   "  migration/0    18 [000] 11290.807175068:     250000   cpu-clock:  ffffffff8220 _raw_...+0x19"
#   "  python 11120  1099.335764939:     200040 cpu-clock:pppH: "
# They are counted by event name, not taken for lines that did not parse.
_OTHER_SAMPLE_RE = re.compile(r".*? (-?\d+) +(?:\[\d+\] +)?\d+\.\d{9}: +(?:\d+ +)?(\S+):(?: .*)?")
# perf prints some PERF_RECORD_LOST lines with the comm first ("perf-exec 20671 [000] ...: ...")
_LOST_RE = re.compile(r".*?(-?\d+) +\[(\d+)\] +\d+\.\d{9}: +PERF_RECORD_LOST lost (\d+)")

_INT = r"(-?\d+)"
# Payload patterns, one per event; "(.*?)" comm fields may hold spaces. Optional parts cover the
# formats of other kernel versions (sched_wakeup "success=", sched_process_exit "group_dead=").
_PAYLOAD_RE = {
    "sched_switch": re.compile(
        rf"prev_comm=(.*?) prev_pid={_INT} prev_prio={_INT} prev_state=(\S*) ==> "
        rf"next_comm=(.*?) next_pid={_INT} next_prio={_INT}\n"),
    "sched_migrate_task": re.compile(
        rf"comm=(.*?) pid={_INT} prio={_INT} orig_cpu={_INT} dest_cpu={_INT}\n"),
    "sched_wakeup": re.compile(
        rf"comm=(.*?) pid={_INT} prio={_INT}(?: success=\d+)? target_cpu={_INT}\n"),
    "sched_process_fork": re.compile(rf"comm=(.*?) pid={_INT} child_comm=(.*?) child_pid={_INT}\n"),
    "sched_process_exit": re.compile(rf"comm=(.*?) pid={_INT} prio={_INT}(?: group_dead=\w+)?\n"),
}
_PAYLOAD_RE["sched_wakeup_new"] = _PAYLOAD_RE["sched_waking"] = _PAYLOAD_RE["sched_wakeup"]

# group index -> canonical column, per event (strings go through the interner, ints are parsed)
_FIELDS = {
    "sched_switch": {0: "prev_comm", 1: "prev_pid", 2: "prev_prio", 3: "prev_state", 4: "comm",
                     5: "pid", 6: "prio"},
    "sched_migrate_task": {0: "comm", 1: "pid", 2: "prio", 3: "orig_cpu", 4: "target_cpu"},
    "sched_wakeup": {0: "comm", 1: "pid", 2: "prio", 3: "target_cpu"},
    "sched_process_fork": {0: "prev_comm", 1: "prev_pid", 2: "comm", 3: "pid"},
    "sched_process_exit": {0: "comm", 1: "pid", 2: "prio"},
}
_FIELDS["sched_wakeup_new"] = _FIELDS["sched_waking"] = _FIELDS["sched_wakeup"]
_STR_COLUMNS = ("comm", "prev_comm", "prev_state")

# prev_state letters (kernel's __print_flags table for sched_switch) -> TASK_* report bits
STATE_BITS = {"S": 1, "D": 2, "T": 4, "t": 8, "X": 16, "Z": 32, "P": 64, "I": 128}


def prev_state_value(text: str) -> int:
    """Normalise a prev_state as printed by perf ("R", "R+", "S", "D|K", ...) to the schema's bits.

    "R" and "R+" (still runnable; "+" is the preempted flag) -> 0; otherwise the OR of the TASK_*
    bits of the letters; -1 if no letter is known.
    """
    text = text.strip().rstrip("+")
    if text in ("R", ""):
        return 0
    bits, known = 0, False
    for part in text.split("|"):
        if part in STATE_BITS:
            bits |= STATE_BITS[part]
            known = True
        elif part.startswith("0x"):
            try:
                bits |= int(part, 16)
                known = True
            except ValueError:
                pass
    return bits if known else -1


def _ints(strings) -> np.ndarray:
    """Decimal strings -> int64 array (one C-level parse of the joined text)."""
    if not strings:
        return np.zeros(0, np.int64)
    arr = np.fromstring(" ".join(strings), dtype=np.int64, sep=" ")  # noqa: NPY201 (text mode)
    if len(arr) != len(strings):
        raise ValueError("non-numeric field")
    return arr


class _Interner:
    """Maps strings to dense int codes across chunks (for the categorical columns)."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.values: list[str] = []

    def codes(self, strings) -> np.ndarray:
        local, uniques = pd.factorize(pd.Series(strings, dtype=object), sort=False)
        remap = np.empty(len(uniques), np.int32)
        for i, s in enumerate(uniques):
            code = self.index.get(s)
            if code is None:
                code = self.index[s] = len(self.values)
                self.values.append(s)
            remap[i] = code
        return remap[local] if len(local) else np.zeros(0, np.int32)

    def categorical(self, codes: np.ndarray) -> pd.Categorical:
        return pd.Categorical.from_codes(codes, categories=pd.Index(self.values, dtype=object),
                                         validate=False) if self.values else \
            pd.Categorical([""] * len(codes))


class PerfScriptParser:
    """Incremental parser of ``perf script`` text into canonical columns.

    Work per chunk: one regex pass splits lines into header fields and payload, then one regex per
    event type runs over that type's payloads joined into one string; numeric groups are parsed in
    bulk with numpy. Lines that fit no pattern are counted and a few kept for the notes.
    """

    EVENT_NAMES = SCHED_EVENTS

    def __init__(self):
        self.strings = _Interner()
        self.chunks: list[dict] = []
        self.lost_by_cpu: dict[int, int] = {}
        self.bad_lines = 0
        self.bad_examples: list[str] = []
        self.other_events: dict[str, int] = {}
        self._tail = b""

    def notes(self) -> list[str]:
        """What the parse left out: lines it could not read, events it does not decode."""
        notes = []
        if self.bad_lines:
            notes.append(f"{self.bad_lines} perf script lines did not parse, e.g. "
                         f"{self.bad_examples[:2]!r}")
        if self.other_events:
            notes.append(f"ignored events other than the {len(self.EVENT_NAMES)} Harmony decodes "
                         f"({', '.join(self.EVENT_NAMES)}), by count: {self.other_events}")
        return notes

    def feed(self, data: bytes) -> None:
        data = self._tail + data
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        if cut:
            self._parse(data[:cut].decode("utf-8", "replace"))

    def finish(self) -> None:
        if self._tail.strip():
            self._parse(self._tail.decode("utf-8", "replace") + "\n")
        self._tail = b""

    def _bad(self, lines) -> None:
        lines = [ln for ln in lines if ln.strip()]
        self.bad_lines += len(lines)
        self.bad_examples.extend(lines[: max(0, 3 - len(self.bad_examples))])

    def _parse(self, text: str) -> None:
        rows = _LINE_RE.findall("\n" + text)
        nlines = text.count("\n")
        if len(rows) != nlines:
            # find the lines the header pattern rejected (slow path, only for odd chunks)
            odd = [ln for ln in text.split("\n") if ln.strip() and not _LINE_RE.fullmatch("\n" + ln)]
            bad = []
            for ln in odd:
                m = _LOST_RE.fullmatch(ln)
                if m:
                    c = int(m.group(2))
                    self.lost_by_cpu[c] = self.lost_by_cpu.get(c, 0) + int(m.group(3))
                    continue
                m = _OTHER_SAMPLE_RE.fullmatch(ln)
                if m:
                    self.other_events[m.group(2)] = self.other_events.get(m.group(2), 0) + 1
                else:
                    bad.append(ln)
            self._bad(bad)
        if not rows:
            return
        tid, cpu, sec, nsec, ev, rest = (list(map(itemgetter(k), rows)) for k in range(6))
        ev_codes, ev_names = pd.factorize(pd.Series(ev, dtype=object), sort=False)
        keep = np.zeros(len(rows), bool)
        cols: dict[str, np.ndarray] = {}
        n = len(rows)
        for name in COLUMNS:
            if name not in ("ts", "cpu", "event", "common_pid"):
                cols[name] = np.full(n, -1, np.int64)
        rest_arr = np.array(rest, dtype=object)
        for k, name in enumerate(ev_names):
            idx = np.flatnonzero(ev_codes == k)
            if name == "PERF_RECORD_LOST":
                for i in idx:
                    m = re.fullmatch(r"lost (\d+)", rest[i].strip())
                    if m:
                        c = int(cpu[i])
                        self.lost_by_cpu[c] = self.lost_by_cpu.get(c, 0) + int(m.group(1))
                continue
            pattern = _PAYLOAD_RE.get(name)
            if pattern is None:
                self.other_events[name] = self.other_events.get(name, 0) + len(idx)
                continue
            payloads = rest_arr[idx]
            found = pattern.findall("\n".join(payloads) + "\n")
            if len(found) != len(idx):
                # some payloads do not fit: match one by one to keep rows aligned
                good, found = [], []
                for j, p in zip(idx, payloads):
                    m = pattern.fullmatch(p + "\n")
                    if m:
                        good.append(j)
                        found.append(m.groups())
                    else:
                        self._bad([f"{name}: {p}"])
                idx = np.asarray(good, dtype=np.int64)
                if not len(idx):
                    continue
            keep[idx] = True
            for g, col in _FIELDS[name].items():
                values = list(map(itemgetter(g), found))
                if col in _STR_COLUMNS:
                    cols[col][idx] = self.strings.codes(values)
                else:
                    cols[col][idx] = _ints(values)
        kidx = np.flatnonzero(keep)
        if not len(kidx):
            return
        ts = _ints(sec) * 1_000_000_000 + _ints(nsec)
        chunk = {"ts": ts[kidx], "cpu": _ints(cpu)[kidx], "common_pid": _ints(tid)[kidx],
                 "event": self.strings.codes(list(ev_names))[ev_codes[kidx]]}
        for name, arr in cols.items():
            chunk[name] = arr[kidx]
        self.chunks.append(chunk)

    def events(self) -> pd.DataFrame:
        """The canonical events table of everything fed so far."""
        if not self.chunks:
            return make_events({})
        cols = {k: np.concatenate([c[k] for c in self.chunks]) for k in self.chunks[0]}
        values = np.asarray(self.strings.values, dtype=object)
        # prev_state: codes of strings -> normalised bits (only switch rows have one)
        state = cols["prev_state"]
        has = state >= 0
        if has.any():
            used = np.unique(state[has])
            lut = np.full(len(values), -1, np.int64)
            lut[used] = [prev_state_value(values[u]) for u in used]
            state = np.where(has, lut[np.where(has, state, 0)], -1)
        cols["prev_state"] = state
        out = {k: v for k, v in cols.items() if k not in ("event", "comm", "prev_comm")}
        for k in ("event", "comm", "prev_comm"):
            codes = cols[k].astype(np.int32)
            if (codes < 0).any():  # rows without the string: "" (fill via an extra category)
                empty = self.strings.codes([""])[0]
                codes = np.where(codes < 0, empty, codes)
            out[k] = self.strings.categorical(codes)
        df = make_events({k: out[k] for k in COLUMNS})
        for k in ("event", "comm", "prev_comm"):  # keep only the categories this column uses
            df[k] = df[k].cat.remove_unused_categories()
        return df


# --------------------------------------------------------------------------------------------------
# the probe

class PerfProbe(Probe):
    """Records the sched tracepoints system-wide with ``perf record``; see the module docstring."""

    name = "perf"
    START_TIMEOUT_S = 30.0
    STOP_TIMEOUT_S = 60.0
    _available_ok_until = 0.0

    def __init__(self, out_dir: Path, cpus: list[int], duration_s: float):
        super().__init__(out_dir, cpus, duration_s)
        self._proc: subprocess.Popen | None = None
        self._ctl_w: int | None = None
        self._ack_r: int | None = None
        self._log = None
        self._lock = threading.Lock()
        self._markers = None
        self._stopped = False
        self._meta: dict = {}
        self.meta: dict = {}  # recording facts, complete after stop() (also in meta.json)
        self._finalizer = None

    # ---------------------------------------------------------------------------- availability
    @staticmethod
    def perf_binary() -> str | None:
        return shutil.which("perf")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        perf = cls.perf_binary()
        if not perf:
            return False, "perf is not installed (no 'perf' in PATH)"
        if time.monotonic() < cls._available_ok_until:
            return True, ""
        if not _perf_version(perf):
            return False, f"{perf} does not run ('perf version' failed; no perf for this kernel?)"
        # the real test: a tiny system-wide record of one sched tracepoint on the monotonic clock
        with tempfile.TemporaryDirectory(prefix="harmony-perf-check-") as tmp:
            cmd = [perf, "record", "-q", "-a", "-e", "sched:sched_switch", "-k", CLOCK_ID,
                   "--synth=no", "-B", "-N", "-o", f"{tmp}/perf.data", "--", "true"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=_ENV,
                                   cwd=tmp, preexec_fn=_die_with_parent(os.getpid()))
            except subprocess.TimeoutExpired:
                return False, "perf record of sched:sched_switch did not finish within 20 s"
            except OSError as e:
                return False, f"cannot run perf: {e}"
            if r.returncode != 0:
                return False, ("perf cannot record sched tracepoints system-wide: "
                               + _first_error_line(r.stderr + r.stdout))
        cls._available_ok_until = time.monotonic() + 60.0
        return True, ""

    # ---------------------------------------------------------------------------- recording
    @property
    def perf_data(self) -> Path:
        return self.out_dir / "perf.data"

    def command(self, ctl_fd: int, ack_fd: int, perf: str = "perf") -> list[str]:
        self.mmap_pages = mmap_pages_for(self.duration_s, os.cpu_count() or 1)
        return [perf, "record", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID,
                "-m", str(self.mmap_pages),
                "-B", "-N",          # no build-id post-processing: stop() is quick
                "--synth=no",        # no /proc walk at start: comms come from the tracepoints
                # no side-band thread for BPF program events, which perf waits ~0.5 s for at exit
                # (a perf without the option, older ones, is not given it)
                *(["--no-bpf-event"] if _record_knows(perf, "--no-bpf-event") else []),
                "-D", "-1",          # start with events disabled ...
                "--control", f"fd:{ctl_fd},{ack_fd}",  # ... until start() says "enable"
                "-o", str(self.perf_data)]

    def start(self) -> None:
        if self._proc is not None:
            raise ProbeError("perf probe already started")
        perf = self.perf_binary()
        if not perf:
            raise ProbeError("perf is not installed (no 'perf' in PATH)")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("perf.data", "perf.data.old", "markers.jsonl", "meta.json"):
            (self.out_dir / stale).unlink(missing_ok=True)
        me = os.getpid()
        (self.out_dir / "owner.pid").write_text(f"{me} {proc_starttime(me)}\n")
        ctl_r, ctl_w = os.pipe()
        ack_r, ack_w = os.pipe()
        cmd = self.command(ctl_r, ack_w, perf)
        self._log = open(self.out_dir / "perf.log", "wb")
        try:
            proc = subprocess.Popen(
                cmd, pass_fds=(ctl_r, ack_w), stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=subprocess.STDOUT, env=_ENV, cwd=self.out_dir,
                start_new_session=True,  # Ctrl-C of the terminal reaches us, and we stop perf
                preexec_fn=_die_with_parent(me))
        except OSError as e:
            for fd in (ctl_r, ctl_w, ack_r, ack_w):
                os.close(fd)
            self._log.close()
            raise ProbeError(f"cannot run perf: {e}") from None
        os.close(ctl_r)
        os.close(ack_w)
        self._proc, self._ctl_w, self._ack_r = proc, ctl_w, ack_r
        self._stopped = False
        self._finalizer = weakref.finalize(self, _emergency_stop, proc)
        (self.out_dir / "perf.pid").write_text(f"{proc.pid}\n")
        self._meta = {"command": cmd, "owner_pid": me, "perf_pid": proc.pid,
                      "start_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC)}
        try:
            self._wait_live()
        except BaseException:
            self._kill()
            self._close()
            self._stopped = True
            raise
        self._meta["live_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self._markers = open(self.out_dir / "markers.jsonl", "a", encoding="utf-8")

    def _wait_live(self) -> None:
        """Send "enable" on the control pipe and wait for perf's "ack" (see module docstring)."""
        os.write(self._ctl_w, b"enable\n")
        deadline = time.monotonic() + self.START_TIMEOUT_S
        got = b""
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeError(f"perf record did not enable its events within "
                                 f"{self.START_TIMEOUT_S:.0f} s (see {self.out_dir / 'perf.log'})")
            ready, _, _ = select.select([self._ack_r], [], [], min(left, 0.1))
            if ready:
                chunk = os.read(self._ack_r, 64)
                if not chunk:  # perf closed the pipe: it exited
                    break
                got += chunk
            elif self._proc.poll() is not None:
                break
        if b"ack" not in got:
            self._proc.wait(timeout=5)
            raise ProbeError("perf record failed to start: "
                             + _first_error_line(self._read_log()))

    def _read_log(self) -> str:
        try:
            return (self.out_dir / "perf.log").read_text(errors="replace")
        except OSError:
            return ""

    def helper_tids(self) -> list[int]:
        """perf record's threads (its main thread and the helpers perf starts), while it records."""
        if self._proc is None or self._stopped or self._proc.poll() is not None:
            return []
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self._proc.pid}/task"))
        except OSError:         # exited meanwhile
            return []

    def mark(self, text: str) -> int:
        with self._lock:
            if self._proc is None or self._stopped or self._markers is None:
                raise ProbeError("perf probe is not recording: call start() before mark()")
            ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            cpu = sched_getcpu()
            self._markers.write(json.dumps({"ts": ts, "cpu": cpu, "pid": threading.get_native_id(),
                                            "text": text.rstrip("\n")}) + "\n")
            self._markers.flush()
        return ts

    def stop(self) -> None:
        with self._lock:
            if self._proc is None or self._stopped:
                return
            self._stopped = True
        proc = self._proc
        clean, how = False, "exited"
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=self.STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    how = f"hung after SIGINT for {self.STOP_TIMEOUT_S:.0f} s, killed"
            else:
                how = "had already exited before stop()"
        finally:
            self._kill()  # no-op unless it is still alive (or we were interrupted)
            self._close()
        log = self._read_log()
        rc = proc.returncode
        if how == "exited":
            clean = rc in (0, -signal.SIGINT) and "Captured and wrote" in log
        meta = dict(self._meta)
        meta.update({
            "probe": self.name, "perf_version": _perf_version(self.perf_binary() or "perf"),
            "clock": CLOCK_NAME, "clockid": CLOCK_ID,
            "events_enabled": list(SCHED_EVENTS), "cpus": self.cpus,
            "cpus_online": online_cpus(), "kernel": os.uname().release,
            "duration_s": self.duration_s, "mmap_pages": getattr(self, "mmap_pages", None),
            "stop_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "perf_returncode": rc, "perf_clean_exit": clean, "perf_exit": how,
            "perf_log": log.strip().splitlines()[-5:],
        })
        self.meta = meta
        tmp = self.out_dir / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(self.out_dir / "meta.json")
        if not clean:
            raise ProbeError(f"perf record {how} (exit status {rc}): "
                             + _first_error_line(log))

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if self._finalizer is not None:
            self._finalizer.detach()

    def _close(self) -> None:
        for attr in ("_ctl_w", "_ack_r"):
            fd = getattr(self, attr)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, attr, None)
        for attr in ("_log", "_markers"):
            f = getattr(self, attr)
            if f is not None:
                f.close()
                setattr(self, attr, None)

    # ---------------------------------------------------------------------------- decoding
    @classmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        out_dir = Path(out_dir)
        path = out_dir / "perf.data"
        if not path.exists():
            raise TraceCorrupt(f"{path}: missing")
        info = check_perf_data(path)
        perf = cls.perf_binary()
        if not perf:
            raise ProbeError("perf is not installed (no 'perf' in PATH): cannot decode "
                             f"{path}")
        notes: list[str] = []
        meta: dict = {}
        meta_path = out_dir / "meta.json"
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                notes.append("meta.json is unreadable; recording facts are missing")
        else:
            notes.append("meta.json missing (stop() never ran?)")
        header = _run_perf_report(perf, path, "--header-only")
        if _sched_clockids(header) - {1}:       # one not on CLOCK_MONOTONIC (clockid 1)
            raise TraceCorrupt(f"{path}: events were not recorded on CLOCK_MONOTONIC (clockid 1)")
        stats = _run_perf_report(perf, path, "--stats")
        lost_samples = _lost_samples(stats)

        t0 = time.perf_counter()
        parser, errtext = run_perf_script(perf, path)
        events = parser.events()
        decode_s = time.perf_counter() - t0

        notes.extend(parser.notes())
        for line in errtext.splitlines():
            if "lost" in line.lower() or "warning" in line.lower():
                notes.append("perf script: " + line.strip())
        lost, lost_notes = lost_sched_events(sum(parser.lost_by_cpu.values()), lost_samples)
        notes.extend(lost_notes)
        if lost:
            notes.append(f"{lost} sched events lost (perf ring buffer full); lost_by_cpu is from "
                         "PERF_RECORD_LOST records")
        notes.append("markers are not in the kernel trace: mark() timestamps CLOCK_MONOTONIC in "
                     "user space (markers.jsonl)")
        if not meta.get("perf_clean_exit", True):
            notes.append(f"perf record did not exit cleanly: {meta.get('perf_exit')}")

        markers = _read_markers(out_dir / "markers.jsonl")
        meta.update({
            "probe": cls.name, "clock": CLOCK_NAME, "clockid": CLOCK_ID,
            "events_enabled": meta.get("events_enabled", list(SCHED_EVENTS)),
            "lost_events": int(lost), "lost_by_cpu": {int(k): int(v) for k, v in
                                                       sorted(parser.lost_by_cpu.items())},
            "lost_samples_by_event": lost_samples or {},
            "bytes": info["bytes"], "n_events": int(len(events)),
            "decode_s": round(decode_s, 3),
            "notes": list(meta.get("notes", [])) + notes,
        })
        return Capture(events=events, markers=markers, meta=meta)

    # ---------------------------------------------------------------------------- cleanup
    @classmethod
    def reclaim_stale(cls) -> list[str]:
        """Stop ``perf record`` processes writing into a Harmony out dir whose owner is gone.

        A perf process is ours only if its argv is ``perf record ... -o DIR/perf.data`` and
        DIR/perf.pid names exactly that process; it is stale only if DIR/owner.pid names a process
        that no longer exists (pid gone, or reused: start time differs). Anything else is left alone.
        """
        removed = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            argv = [a.decode("utf-8", "replace") for a in argv if a]
            if len(argv) < 4 or not os.path.basename(argv[0]).startswith("perf") \
                    or "record" not in argv or "-o" not in argv:
                continue
            try:
                out = Path(argv[argv.index("-o") + 1])
            except IndexError:
                continue
            if out.name != "perf.data":
                continue
            out_dir = out.parent if out.is_absolute() else None
            if out_dir is None:
                try:
                    out_dir = (Path(os.readlink(entry / "cwd")) / out).parent
                except OSError:
                    continue
            try:
                if int((out_dir / "perf.pid").read_text().split()[0]) != pid:
                    continue
                owner = (out_dir / "owner.pid").read_text().split()
            except (OSError, ValueError, IndexError):
                continue
            owner_pid = int(owner[0])
            owner_start = owner[1] if len(owner) > 1 else "None"
            start_now = proc_starttime(owner_pid)
            if start_now is not None and (owner_start == "None" or str(start_now) == owner_start):
                continue  # owner alive
            if _stop_pid(pid, proc_starttime(pid)):
                removed.append(f"perf record pid {pid} writing {out} (owner pid {owner_pid} gone)")
        return removed


# --------------------------------------------------------------------------------------------------
# helpers for decode / cleanup

def run_perf_script(perf: str, path: Path) -> tuple[PerfScriptParser, str]:
    """Stream ``perf script`` of ``path`` into a :class:`PerfScriptParser`, 8 MiB at a time.

    Returns the finished parser and perf's stderr text; raises TraceCorrupt naming ``path`` if
    perf script fails.
    """
    parser = PerfScriptParser()
    cmd = [perf, "script", "-f", "-i", str(path), "--ns", "--show-lost-events",
           "-F", "trace:tid,cpu,time,event,trace", "-G"]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                env=_ENV, preexec_fn=_die_with_parent(os.getpid()))
        try:
            for chunk in iter(lambda: proc.stdout.read(8 << 20), b""):
                parser.feed(chunk)
            parser.finish()
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        errtext = err.read().decode("utf-8", "replace")
    if rc != 0:
        raise TraceCorrupt(f"{path}: perf script failed (exit {rc}): " + _first_error_line(errtext))
    return parser, errtext


def _emergency_stop(proc: subprocess.Popen) -> None:
    """weakref/atexit fallback: a started probe that was never stopped stops perf gracefully."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except OSError:
            pass


def _stop_pid(pid: int, starttime: int | None) -> bool:
    """SIGINT a process we do not parent; SIGKILL it if it is still there after 5 s."""
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if proc_starttime(pid) != starttime:
            return True
        try:  # reap it if it happens to be our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _run_perf_report(perf: str, path: Path, what: str) -> str:
    r = subprocess.run([perf, "report", "-f", "-i", str(path), what], capture_output=True,
                       env=_ENV, timeout=600, preexec_fn=_die_with_parent(os.getpid()))
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        raise TraceCorrupt(f"{path}: perf report {what} failed (exit {r.returncode}): "
                           + _first_error_line(r.stderr.decode("utf-8", "replace") + out))
    return out


def recorded_cpus(perf: str, path: Path, max_lines: int = 20_000) -> set[int] | None:
    """The CPUs ``path`` was recorded on (its PERF_RECORD_CPU_MAP: ``-C``, or every CPU with
    ``-a``), or None if perf does not say. Read from ``perf report -D``, which prints the map with
    the records that precede the samples: perf is stopped as soon as it is found, or after
    ``max_lines`` lines."""

    proc = subprocess.Popen([perf, "report", "-f", "-D", "-i", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=_ENV,
                            preexec_fn=_die_with_parent(os.getpid()))
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


def _sched_clockids(header: str) -> set:
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
    ids = _sched_clockids(header)
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
    LOST_SAMPLES counts of ``perf report --stats`` (:func:`_lost_samples`), which add up to the
    same total. Only the sched events Harmony decodes count: other events a recording sampled
    (perf's dummy event, cycles, sched_stat_runtime, ...) are named in a note instead."""
    if lost_samples is None:
        return lost_records, ["perf report --stats gave no LOST_SAMPLES counts; lost_events counts "
                              "PERF_RECORD_LOST records only"]
    notes = []
    decoded = {f"sched:{name}" for name in PerfScriptParser.EVENT_NAMES}
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


def _lost_samples(stats: str) -> dict[str, int] | None:
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


def _read_markers(path: Path) -> pd.DataFrame:
    if not path.exists():
        return make_markers()
    ts, cpu, pid, text = [], [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ts.append(int(rec["ts"]))
                cpu.append(int(rec["cpu"]))
                pid.append(int(rec["pid"]))
                text.append(str(rec["text"]))
            except (ValueError, KeyError, TypeError):
                raise TraceCorrupt(f"{path}: line {n} is not a marker record") from None
    df = make_markers(ts, cpu, pid, text)
    return df.sort_values("ts", kind="stable", ignore_index=True)


__all__ = ["PerfProbe", "PerfScriptParser", "prev_state_value", "check_perf_data",
           "mmap_pages_for", "PERF_EVENTS"]
