"""``perf script`` text -> the canonical events table: how the perf probe's recordings and
perf.data files from elsewhere were decoded before Harmony read perf.data itself
(:mod:`harmony.probes.perf_read`). Kept as the reference that reader is checked against, row by
row, on real recordings (tests/test_perf_read.py): perf's own decoder (libtraceevent) beside
Harmony's.

:func:`run_perf_script` streams ``perf script -F trace:tid,cpu,time,event,trace --ns
--show-lost-events`` of a perf.data into a :class:`PerfScriptParser`, which turns its text into
columns a chunk at a time (regexes over whole chunks, numbers parsed in bulk with numpy, strings
interned into categorical codes) and counts the PERF_RECORD_LOST records per CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from operator import itemgetter
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.probes.perf_tool import PERF_ENV, die_with_parent_preexec, first_error_line
from harmony.probes.schema import COLUMNS, INT_COLUMNS, SCHED_EVENTS, make_events

# perf script -F trace:tid,cpu,time,event,trace --ns prints, per sample:
#   "%5d [%03d] %5lu.%09lu: %*s: <tracepoint print fmt>"   e.g.
#   " 6468 [000]   354.805768520:       sched:sched_switch: prev_comm=perf prev_pid=6468 ..."
# and with --show-lost-events, per PERF_RECORD_LOST:
#   " 5525 [000]   333.060311719: PERF_RECORD_LOST lost 1"
# Each chunk is prefixed with "\n" so that every line starts with the literal "\n" (lets the regex
# engine skip to candidates quickly instead of trying a match at every character).
# The event is "sched:NAME" (-> NAME) or, for the other subsystems' tracepoints, "SYS:NAME" (kept
# whole, as the trace.dat decoder names them).
# Numbers have at most as many digits as the columns they fill can hold (int64 after the seconds
# are made ns); digits are ASCII (re.A): a line with others is a line that did not parse.
_LINE_RE = re.compile(r"\n *(-?\d{1,10}) +\[(\d{1,6})\] +(\d{1,9})\.(\d{9}): +"
                      r"(?:sched:)?((?:\w+:)?\w+):? ([^\n]*)", re.A)
# Samples of other events (cycles, cpu-clock, ... in a recording that sampled them too) come in
# perf's default fields, one line each (-G hides their call chains), the CPU only if recorded:
#   "  migration/0    18 [000] 11290.807175068:     250000   cpu-clock:  ffffffff8220 _raw_...+0x19"
#   "  python 11120  1099.335764939:     200040 cpu-clock:pppH: "
# They are counted by event name, not taken for lines that did not parse.
_OTHER_SAMPLE_RE = re.compile(r".*? (-?\d{1,10}) +(?:\[\d{1,6}\] +)?\d{1,9}\.\d{9}: +(?:\d+ +)?"
                              r"(\S+):(?: .*)?", re.A)
# perf prints some PERF_RECORD_LOST lines with the comm first ("perf-exec 20671 [000] ...: ...")
_LOST_RE = re.compile(r".*?(-?\d{1,10}) +\[(\d{1,6})\] +\d{1,9}\.\d{9}: +PERF_RECORD_LOST lost "
                      r"(\d{1,18})", re.A)

_INT = r"(-?\d{1,18})"
# Payload patterns, one per event; "(.*?)" comm fields may hold spaces. Optional parts cover the
# formats of other kernel versions (sched_wakeup "success=", sched_process_exit "group_dead=").
_PAYLOAD_RE = {
    "sched_switch": re.compile(
        rf"prev_comm=(.*?) prev_pid={_INT} prev_prio={_INT} prev_state=(\S*) ==> "
        rf"next_comm=(.*?) next_pid={_INT} next_prio={_INT}\n", re.A),
    "sched_migrate_task": re.compile(
        rf"comm=(.*?) pid={_INT} prio={_INT} orig_cpu={_INT} dest_cpu={_INT}\n", re.A),
    "sched_wakeup": re.compile(
        rf"comm=(.*?) pid={_INT} prio={_INT}(?: success=\d+)? target_cpu={_INT}\n", re.A),
    "sched_process_fork": re.compile(rf"comm=(.*?) pid={_INT} child_comm=(.*?) child_pid={_INT}\n",
                                     re.A),
    "sched_process_exit": re.compile(rf"comm=(.*?) pid={_INT} prio={_INT}(?: group_dead=\w+)?\n",
                                     re.A),
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
#: the integer columns narrower than the int64 the numbers are parsed as: (least, greatest) value
_NARROW = {name: (int(np.iinfo(dt).min), int(np.iinfo(dt).max)) for name, dt in INT_COLUMNS.items()
           if np.dtype(dt).itemsize < 8 and name not in _STR_COLUMNS}

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
            odd = [ln for ln in text.split("\n")
                   if ln.strip() and not _LINE_RE.fullmatch("\n" + ln)]
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
                    m = re.fullmatch(r"lost (\d{1,18})", rest[i].strip(), re.A)
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
        # a number its column cannot hold (a pid past int32, a CPU past int16) makes the line one
        # that did not parse, not a value wrapped around
        fits = np.ones(len(kidx), bool)
        for name, arr in chunk.items():
            if name in _NARROW:
                fits &= (arr >= _NARROW[name][0]) & (arr <= _NARROW[name][1])
        if not fits.all():
            self._bad([f"{tid[i]} [{cpu[i]}] {sec[i]}.{nsec[i]}: {ev[i]}: {rest[i]}"
                       for i in kidx[~fits]])
            chunk = {name: arr[fits] for name, arr in chunk.items()}
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
                                env=PERF_ENV, preexec_fn=die_with_parent_preexec(os.getpid()))
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
        raise TraceCorrupt(f"{path}: perf script failed (exit {rc}): " + first_error_line(errtext))
    return parser, errtext


__all__ = ["PerfScriptParser", "STATE_BITS", "prev_state_value", "run_perf_script"]
