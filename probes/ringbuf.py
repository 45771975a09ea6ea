"""Decode raw ftrace ring-buffer pages (``per_cpu/cpuN/trace_pipe_raw``) into the canonical tables.

Ring-buffer page (sub-buffer) layout, as events/header_page describes it (64-bit kernel)::

    u64      timestamp      absolute time of the page's first event (trace clock)
    local_t  commit         low 27 bits: bytes of event data; bit 31 RB_MISSED_EVENTS (events were
                            lost before this page), bit 30 RB_MISSED_STORED (their count is stored as
                            an unsigned long right after the data)
    char     data[]         events, 4-byte aligned

Event header (u32): ``type_len`` = low 5 bits, ``time_delta`` = high 27 bits.

==========  ========================================================================================
type_len    meaning
==========  ========================================================================================
1..28       data event, ``type_len*4`` bytes of data at +4
0           data event, ``array[0]`` = data length + 4, data at +8
29          padding: ``time_delta == 0`` -> the rest of the page is empty; else a discarded event of
            ``array[0] + 4`` bytes whose ``time_delta`` still counts (the kernel's own check_buffer
            and libtraceevent's kbuffer both add it)
30          time extend (8 bytes): delta = ``array[0] << 27 | time_delta``
31          absolute time stamp (8 bytes): ts = ``array[0] << 27 | time_delta`` (+ the 5 MSBs of the
            running time)
==========  ========================================================================================

The decoder never loops over events in Python, and has two engines giving the same tables (tested
against each other; :mod:`harmony.jit` picks one). Large traces: compiled kernels
(:mod:`ringbuf_jit`) walk each page once and write every column of every record in one pass.
Otherwise numpy: all pages of all CPUs are walked in lockstep (step k looks at the k-th record of
every page that still has records), the data records found are put back into (page, position)
order with one O(n) scatter, and every field is gathered with one fancy-indexing pass per (event
type, field). Both merge the CPUs with one stable sort on the timestamps and take every offset from
the format files. The cpuN.raw files are mapped, not copied (:mod:`filemap`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.jit import run_split, split, use_compiled
from harmony.memory import prefault_heap
from harmony.probes.base import NOT_NS_CLOCKS, Capture, TraceCorrupt
from harmony.probes.filemap import map_files
from harmony.probes.formats import (EventFormat, Field, HeaderPage, load_formats_dir,
                                    load_header_event, load_header_page, sched_switch_preempt_flag)
from harmony.probes.schema import COLUMNS, INT_COLUMNS, make_events, make_markers

COMMIT_MASK = (1 << 27) - 1
RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
TS_MSB = -(1 << 59)                  # 0xf8 << 56 as an int64 mask
TYPE_PADDING, TYPE_TIME_EXTEND, TYPE_TIME_STAMP = 29, 30, 31
MAX_STRING = 1024                    # dynamic strings longer than this are truncated

# Canonical column <- candidate source fields, per sched event (first field present wins).
# Anything not listed falls back to same-named fields (pid, comm, prio, ...), see _column_map().
_SCHED_MAP = {
    "sched_switch": {"pid": ("next_pid",), "comm": ("next_comm",), "prio": ("next_prio",),
                     "prev_pid": ("prev_pid",), "prev_comm": ("prev_comm",),
                     "prev_prio": ("prev_prio",), "prev_state": ("prev_state",)},
    "sched_migrate_task": {"pid": ("pid",), "comm": ("comm",), "prio": ("prio",),
                           "orig_cpu": ("orig_cpu",), "target_cpu": ("dest_cpu",)},
    "sched_process_fork": {"pid": ("child_pid",), "comm": ("child_comm",),
                           "prev_pid": ("parent_pid",), "prev_comm": ("parent_comm",)},
    # pid is the child waited for, but comm and prio are the waiter's (current, = common_pid):
    # read as the pid's, they would rename the child after its parent
    "sched_process_wait": {"pid": ("pid",)},
}
_GENERIC_MAP = {"pid": ("pid",), "comm": ("comm",), "prio": ("prio",), "target_cpu": ("target_cpu",),
                "orig_cpu": ("orig_cpu",)}
STRING_COLUMNS = ("comm", "prev_comm")


def event_label(fmt: EventFormat) -> str:
    """Name in the events table: bare for the sched system, ``system:name`` otherwise."""
    return fmt.name if fmt.system == "sched" else f"{fmt.system}:{fmt.name}"


def _column_map(fmt: EventFormat) -> dict[str, Field]:
    spec = _SCHED_MAP.get(fmt.name) if fmt.system == "sched" else None
    out = {}
    for col, names in (spec or _GENERIC_MAP).items():
        f = fmt.first_field(*names)
        if f is not None:
            if col in STRING_COLUMNS and not f.is_string:
                continue
            if col not in STRING_COLUMNS and (f.is_array or f.size not in (1, 2, 4, 8)):
                continue
            out[col] = f
    return out


@dataclasses.dataclass
class Records:
    """Data records found in the pages, in (cpu, time) order before the cross-CPU merge."""

    pos: np.ndarray       # int64 byte offset of each record's data in the flat buffer
    length: np.ndarray    # int32 data length (4-byte rounded)
    ts: np.ndarray        # int64
    cpu: np.ndarray       # int16 CPU whose buffer holds the record
    lost: np.ndarray      # per page: events the kernel reported lost before it (-1 = unknown count)
    missed: np.ndarray    # per page: RB_MISSED_EVENTS flag
    code: np.ndarray | None = None   # int32 format code, if walk_pages was given the type look-up
    #                                  (-1 = type id outside it, -2 = record too short for the id)
    short: int = -1       # with code: the first record too short for its type id (-1 = none)

    def page(self, r: int, page_size: int) -> int:
        """The page holding record ``r`` (pages are back to back in the flat buffer)."""
        return int(self.pos[r]) // page_size


class PageSource:
    """Flat buffer of whole pages + which file/CPU each page came from (for messages)."""

    def __init__(self, buf: np.ndarray, page_size: int, page_cpu: np.ndarray,
                 page_file: np.ndarray, files: list[str], page_in_file: np.ndarray):
        self.buf = buf
        self.page_size = page_size
        self.page_cpu = page_cpu
        self.page_file = page_file
        self.files = files
        self.page_in_file = page_in_file
        self._views: dict[str, np.ndarray] = {}

    @property
    def n_pages(self) -> int:
        return len(self.buf) // self.page_size

    def view(self, dtype: str) -> np.ndarray:
        v = self._views.get(dtype)
        if v is None:
            v = self.buf.view(dtype)
            self._views[dtype] = v
        return v

    def where(self, page: int, byte_in_page: int | None = None) -> str:
        f = self.files[int(self.page_file[page])]
        off = int(self.page_in_file[page]) * self.page_size
        if byte_in_page is not None:
            off += int(byte_in_page)
        return f"{f}: page {int(self.page_in_file[page])} (file offset {off})"

    @classmethod
    def from_buffers(cls, pages_by_cpu: dict[int, bytes | np.ndarray], page_size: int,
                     names: dict[int, str] | None = None) -> "PageSource":
        names = names or {}
        cpus = sorted(pages_by_cpu)
        sizes = [len(pages_by_cpu[c]) for c in cpus]
        buf = np.empty(sum(sizes), np.uint8)
        o = 0
        for c, s in zip(cpus, sizes):
            buf[o:o + s] = np.frombuffer(memoryview(pages_by_cpu[c]).cast("B"), np.uint8)
            o += s
        files = [names.get(c, f"cpu{c}") for c in cpus]
        for c, s, f in zip(cpus, sizes, files):
            if s % page_size:
                raise TraceCorrupt(f"{f}: truncated: {s} bytes is not a whole number of "
                                   f"{page_size}-byte pages")
        counts = [s // page_size for s in sizes]
        return cls(buf, page_size, np.repeat(np.asarray(cpus, np.int64), counts),
                   np.repeat(np.arange(len(cpus)), counts), files,
                   np.concatenate([np.arange(k) for k in counts]) if counts else np.zeros(0, np.int64))

    @classmethod
    def from_files(cls, files_by_cpu: dict[int, Path], page_size: int) -> "PageSource":
        cpus = sorted(files_by_cpu)
        sizes = []
        for c in cpus:
            p = Path(files_by_cpu[c])
            try:
                s = p.stat().st_size
            except OSError as e:
                raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
            if s % page_size:
                raise TraceCorrupt(f"{p}: truncated: {s} bytes is not a whole number of "
                                   f"{page_size}-byte pages")
            sizes.append(s)
        paths = [Path(files_by_cpu[c]) for c in cpus]
        buf = map_files(paths, sizes)   # no copy, no fresh memory; None: read them
        if buf is None:
            buf = _read_files(paths, sizes)
        counts = [s // page_size for s in sizes]
        return cls(buf, page_size, np.repeat(np.asarray(cpus, np.int64), counts),
                   np.repeat(np.arange(len(cpus)), counts), [str(p) for p in paths],
                   np.concatenate([np.arange(k) for k in counts]) if counts else np.zeros(0, np.int64))


def _read_files(paths: list[Path], sizes: list[int]) -> np.ndarray:
    """The files' bytes back to back in a new array (where they cannot be mapped)."""
    buf = np.empty(sum(sizes), np.uint8)
    o = 0
    for p, s in zip(paths, sizes):
        try:
            with open(p, "rb", buffering=0) as fh:
                got = fh.readinto(memoryview(buf[o:o + s]))
                while got < s:
                    k = fh.readinto(memoryview(buf[o + got:o + s]))
                    if not k:
                        break
                    got += k
        except OSError as e:
            raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
        if got != s:
            raise TraceCorrupt(f"{p}: truncated while reading ({got} of {s} bytes)")
        o += s
    return buf


#: raw bytes from which the compiled decoder repays numba's start-up (~0.8 s) in a new process:
#: it saves ~0.6 us per event, and a trace holds ~90 bytes per event
JIT_MIN_BYTES = 64 << 20


def _compiled(nbytes: int):
    """The compiled kernels (:mod:`ringbuf_jit`) if :func:`harmony.jit.use_compiled` says so for
    ``nbytes`` of pages, else None (the numpy decoder runs)."""
    if not use_compiled(nbytes, JIT_MIN_BYTES):
        return None
    from harmony.probes import ringbuf_jit
    return ringbuf_jit


# --- the lockstep page walk --------------------------------------------------------------------

def _read_uint(src: PageSource, byte_pos: np.ndarray, size: int) -> np.ndarray:
    """Unsigned little-endian integers of ``size`` bytes at arbitrary byte positions (int64 result)."""
    if size == 8 and not (byte_pos % 8).any():
        return src.view("<i8")[byte_pos >> 3]
    if size == 4 and not (byte_pos % 4).any():
        return src.view("<u4")[byte_pos >> 2].astype(np.int64)
    out = np.zeros(len(byte_pos), np.int64)
    for j in range(size):
        out |= src.buf[byte_pos + j].astype(np.int64) << (8 * j)
    return out


def walk_pages(src: PageSource, hp: HeaderPage, type_field: Field | None = None,
               type_lut: np.ndarray | None = None) -> Records:
    """Find every data record of every page; raise TraceCorrupt on an inconsistent page.

    With ``type_field`` (where a record holds its event type id) and ``type_lut`` (type id ->
    format code, -1 = none), the compiled walk also gives each record's format code in the same
    pass (``Records.code``); the numpy walk leaves that to its caller.
    """
    ps = src.page_size
    n_pages = src.n_pages
    if ps % 8 or hp.data_offset % 4 or hp.data_offset >= ps:
        raise TraceCorrupt(f"{src.files[0] if src.files else 'trace'}: unsupported page layout "
                           f"(page size {ps}, data offset {hp.data_offset})")
    base = np.arange(n_pages, dtype=np.int64) * ps
    page_ts = _read_uint(src, base + hp.timestamp_offset, 8)
    commit = _read_uint(src, base + hp.commit_offset, hp.commit_size)
    size = commit & COMMIT_MASK
    missed = (commit & RB_MISSED_EVENTS) != 0
    stored = missed & ((commit & RB_MISSED_STORED) != 0)
    cap = ps - hp.data_offset
    bad = np.flatnonzero(size > cap)
    if bad.size:
        p = int(bad[0])
        raise TraceCorrupt(f"{src.where(p)}: commit size {int(size[p])} exceeds the page "
                           f"({cap} data bytes)")
    lost = np.where(missed, -1, 0).astype(np.int64)
    if stored.any():
        sp = np.flatnonzero(stored)
        ok = size[sp] + hp.commit_size <= cap
        if not ok.all():
            p = int(sp[~ok][0])
            raise TraceCorrupt(f"{src.where(p)}: missed-events count does not fit after the data")
        lost[sp] = _read_uint(src, base[sp] + hp.data_offset + size[sp], hp.commit_size)

    jit = _compiled(len(src.buf))
    if jit is not None:
        pos, length, ts, cpu, code, short = _walk_compiled(jit, src, hp, page_ts, size, type_field,
                                                           type_lut)
        return Records(pos, length, ts, cpu, lost, missed, code, short)

    words = src.view("<u4")
    nwords = len(words)
    act = np.flatnonzero(size > 0)
    pos = base[act] + hp.data_offset
    end = pos + size[act]
    ts = page_ts[act]
    cnt = np.zeros(n_pages, np.int64)          # data records found so far per page
    steps: list[tuple[np.ndarray, ...]] = []
    while act.size:
        wi = pos >> 2
        w = words[wi]
        tl = (w & 31).astype(np.int64)
        td = (w >> 5).astype(np.int64)
        arr0 = words[np.minimum(wi + 1, nwords - 1)].astype(np.int64)
        is_big = tl == 0
        is_small = (tl > 0) & (tl <= 28)
        is_data = is_big | is_small
        is_pad = tl == TYPE_PADDING
        is_abs = tl == TYPE_TIME_STAMP
        ext = (tl == TYPE_TIME_EXTEND) | is_abs
        delta = np.where(ext, (arr0 << 27) | td, td)
        ts = np.where(is_abs, (ts & TS_MSB) | delta, ts + delta)
        total = np.where(is_small, 4 + tl * 4,
                         np.where(is_big, 4 + ((arr0 + 3) & ~3),
                                  np.where(is_pad, 4 + arr0, 8)))
        stop = is_pad & (td == 0)
        bad = (is_big & (arr0 < 4)) | (is_pad & ~stop & ((arr0 & 3) != 0))
        newpos = pos + total
        bad |= ~stop & (newpos > end)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            p = int(act[k])
            raise TraceCorrupt(f"{src.where(p, int(pos[k] - base[p]))}: bad ring-buffer record "
                               f"(type_len {int(tl[k])}, length word {int(arr0[k])}) running past "
                               f"the page's commit size {int(size[p])}")
        if is_data.any():
            m = np.flatnonzero(is_data)
            pg = act[m]
            dpos = pos[m] + np.where(is_big[m], 8, 4)
            dlen = np.where(is_big[m], (arr0[m] - 4 + 3) & ~3, tl[m] * 4)
            rank = cnt[pg]
            cnt[pg] = rank + 1
            steps.append((dpos, dlen, ts[m], pg, rank))
        keep = np.flatnonzero(~stop & (newpos < end))
        if keep.size != act.size:
            act, pos, end, ts = act[keep], newpos[keep], end[keep], ts[keep]
        else:
            pos = newpos

    n = int(cnt.sum())
    starts = np.zeros(n_pages, np.int64)
    if n_pages:
        np.cumsum(cnt[:-1], out=starts[1:])
    out_pos = np.empty(n, np.int64)
    out_len = np.empty(n, np.int32)
    out_ts = np.empty(n, np.int64)
    out_cpu = np.empty(n, np.int16)
    page_cpu = src.page_cpu.astype(np.int16)
    for dpos, dlen, t, pg, rank in steps:
        i = starts[pg] + rank
        out_pos[i] = dpos
        out_len[i] = dlen
        out_ts[i] = t
        out_cpu[i] = page_cpu[pg]
    return Records(out_pos, out_len, out_ts, out_cpu, lost, missed)


def _walk_compiled(jit, src: PageSource, hp: HeaderPage, page_ts: np.ndarray, size: np.ndarray,
                   type_field: Field | None, type_lut: np.ndarray | None):
    """walk_pages' record search by the compiled kernel: count per page, then fill; both passes
    split the pages over threads (:func:`harmony.jit.split`). Returns (pos, length, ts, cpu, code
    or None, first short record or -1)."""
    n_pages = src.n_pages
    active = size > 0
    counts = np.zeros(n_pages, np.int64)
    none = np.zeros(0, np.int64)
    page_cpu = src.page_cpu.astype(np.int16)
    with_code = type_field is not None and type_lut is not None
    lut = np.asarray(type_lut, np.int32) if with_code else np.zeros(0, np.int32)
    t_off, t_size = (type_field.offset, type_field.size) if with_code else (0, 0)
    args = (src.buf, src.view("<u4"), src.page_size, hp.data_offset, page_ts, size, active)
    types = (page_cpu, t_off, t_size, lut)
    ranges = split(n_pages, per_item=src.page_size // 100)     # records are ~100 bytes

    def count(lo, hi, _k):
        err = np.zeros(6, np.int64)
        return err if jit.walk(*args, counts, none, none.astype(np.int32), none,
                               none.astype(np.int16), none.astype(np.int32), *types, counts, err,
                               lo, hi) else None

    bad = [e for e in run_split(count, ranges) if e is not None]
    if bad:
        e = bad[0]                                        # the first bad page, in page order
        p = int(e[1])
        raise TraceCorrupt(f"{src.where(p, int(e[2]))}: bad ring-buffer record (type_len "
                           f"{int(e[3])}, length word {int(e[4])}) running past the page's "
                           f"commit size {int(size[p])}")
    starts = np.zeros(n_pages, np.int64)
    if n_pages:
        np.cumsum(counts[:-1], out=starts[1:])
    n = int(counts.sum())
    out = (np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64), np.empty(n, np.int16),
           np.empty(n if with_code else 0, np.int32))

    def fill(lo, hi, _k):
        err = np.full(6, -1, np.int64)
        jit.walk(*args, starts, *out, *types, counts, err, lo, hi)
        return int(err[5])

    short = [k for k in run_split(fill, ranges) if k >= 0]
    return (*out[:4], out[4] if with_code else None, min(short) if short else -1)


# --- field gathering ---------------------------------------------------------------------------

def read_field(src: PageSource, pos: np.ndarray, f: Field) -> np.ndarray:
    """The integer field ``f`` of the records whose data start at ``pos`` (4-byte aligned)."""
    o, s = f.offset, f.size
    bp = pos + o
    if s == 1:
        return src.view("i1" if f.signed else "u1")[bp]
    if s in (2, 4) and o % s == 0:
        return src.view(("<i" if f.signed else "<u") + str(s))[bp // s]
    if s == 8 and o % 4 == 0:
        u = src.view("<u4")
        wi = bp >> 2
        return (u[wi + 1].astype(np.int64) << 32) | u[wi].astype(np.int64)
    v = _read_uint(src, bp, s)
    if f.signed and s < 8:
        v = np.where(v >= (1 << (8 * s - 1)), v - (1 << (8 * s)), v)
    return v


def _factorize_rows(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, first_index) of the distinct rows of a 2-D uint8 matrix (width multiple of 8).

    One factorize of a 64-bit hash of each row, checked against the rows themselves; only if two
    different rows share a hash (never seen in practice) is the exact column-by-column way taken.
    """
    keys = np.ascontiguousarray(mat).view("<u8")
    if keys.shape[1] > 1 and len(keys):
        h = keys[:, 0].copy()
        for j in range(1, keys.shape[1]):
            h *= np.uint64(0x9E3779B97F4A7C15)
            h ^= keys[:, j]
        codes = pd.factorize(h)[0].astype(np.int64)
        first = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
        if (keys[first][codes] == keys).all():
            return codes, first
    return _factorize_rows_exact(keys)


def _factorize_rows_exact(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes, uniq = pd.factorize(keys[:, 0])
    for j in range(1, keys.shape[1]):
        cj, uj = pd.factorize(keys[:, j])
        if len(uj) > 1:
            codes, uniq = pd.factorize(codes.astype(np.int64) * len(uj) + cj)
    codes = codes.astype(np.int64)
    # pandas numbers codes by first appearance: a new code is where the running max grows
    if len(codes):
        first = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
    else:
        first = np.zeros(0, np.int64)
    return codes, first


def _decode_cstr(row: bytes) -> str:
    return row.split(b"\0", 1)[0].decode("utf-8", "replace")


def gather_strings(src: PageSource, pos: np.ndarray, length: np.ndarray, f: Field,
                   where) -> tuple[np.ndarray, list[str]]:
    """(codes, strings) of a string field for records at ``pos`` (data lengths ``length``)."""
    m = len(pos)
    if f.data_loc or f.rel_loc:
        loc = read_field(src, pos, dataclasses.replace(f, size=4, signed=False))
        off = loc & 0xFFFF
        ln = loc >> 16
        start = pos + off + (f.offset + 4 if f.rel_loc else 0)
        bad = (start + ln > pos + length) | (off < 0)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise TraceCorrupt(f"{where(k)}: {f.name} string (offset {int(off[k])}, length "
                               f"{int(ln[k])}) runs past its record")
        width = int(min(ln.max(initial=0), MAX_STRING))
    elif f.is_array and f.array_len:
        start = pos + f.offset
        width = f.size
        ln = None
    else:
        raise TraceCorrupt(f"{where(0)}: field {f.name} is not a supported string")
    width = max(8, (width + 7) & ~7)
    if ln is None and f.size == width and m:
        # one gather of width-byte items from a byte-strided view (start + width <= len(buf):
        # every record was checked to hold its fixed fields)
        items = np.ndarray(shape=(len(src.buf) - width + 1,), dtype=f"V{width}", buffer=src.buf,
                           strides=(1,))
        mat = items[start].view(np.uint8).reshape(m, width)
        codes, first = _factorize_rows(mat)
        return codes, [_decode_cstr(mat[i].tobytes()) for i in first]
    mat = np.zeros((m, width), np.uint8)
    if ln is None and f.offset % 4 == 0 and f.size % 4 == 0:
        u = src.view("<u4")
        wi = start >> 2
        m32 = mat.view("<u4")
        for j in range(f.size // 4):
            m32[:, j] = u[wi + j]
    else:
        b = src.buf
        top = len(b) - 1
        lim = ln if ln is not None else np.full(m, f.size, np.int64)
        for j in range(min(width, int(lim.max(initial=0)))):
            col = b[np.minimum(start + j, top)]
            mat[:, j] = np.where(j < lim, col, 0)
    codes, first = _factorize_rows(mat)
    strings = [_decode_cstr(mat[i].tobytes()) for i in first]
    return codes, strings


# --- the full decode ---------------------------------------------------------------------------

@dataclasses.dataclass
class Decoded:
    events: pd.DataFrame
    markers: pd.DataFrame
    lost_by_cpu: dict[int, int]          # from page flags; -1 = flagged but count not stored
    missed_pages_by_cpu: dict[int, int]
    unknown: dict[int, int]              # event type id -> count (no format)
    notes: list[str]
    n_records: int
    decoder: str = "numpy"               # "compiled" or "numpy": which one decoded the events


#: heap memory faulted in ahead of a decode, per byte of pages (harmony.memory.prefault_heap):
#: about what the decoder and the state machine allocate on the decoding thread, ~130 bytes an
#: event at ~54 bytes of pages an event (a ping-pong load's 2.1 M events); the tables built on
#: other threads get memory of their own
PREFAULT_PER_PAGE_BYTE = 2.5


def prefault_for_pages(nbytes: int) -> None:
    """Before ``nbytes`` of ring-buffer pages are read and decoded: have the memory the decode will
    need faulted in meanwhile, in idle CPU time (:func:`harmony.memory.prefault_heap`). Called as
    early as the size is known: the files' mapping leaves a CPU idle already."""
    prefault_heap(int(PREFAULT_PER_PAGE_BYTE * nbytes))


def decode_source(src: PageSource, formats: dict[int, EventFormat], hp: HeaderPage) -> Decoded:
    """Decode every page of ``src`` with the given formats (keyed by event ID)."""
    notes: list[str] = []
    # where a record holds its event type id: the same in every format
    ctype = None
    for f in formats.values():
        ctype = f.field("common_type")
        break
    if ctype is None:
        ctype = Field("common_type", "unsigned short", 0, 2, False)
    ids = sorted(formats)
    type_lut = np.full(1 << (8 * ctype.size), -1, np.int32)     # type id -> format code
    for i, ev_id in enumerate(ids):
        if 0 <= ev_id < len(type_lut):
            type_lut[ev_id] = i

    rec = walk_pages(src, hp, ctype, type_lut)
    n = len(rec.pos)
    pos, length, cpu = rec.pos, rec.length, rec.cpu     # in (cpu, page, position) order

    def where(r: int) -> str:
        return src.where(rec.page(r, src.page_size), int(pos[r] % src.page_size))

    if rec.code is None:        # the numpy walk: the event type of each record, here
        short = np.flatnonzero(length < ctype.offset + ctype.size)
        first_short = int(short[0]) if short.size else -1
    else:
        first_short = rec.short
    if first_short >= 0:
        raise TraceCorrupt(f"{where(first_short)}: record of {int(length[first_short])} bytes is "
                           f"too short for an event header")
    code = rec.code if rec.code is not None else (          # the numpy walk: read them here
        type_lut[read_field(src, pos, ctype)] if n else np.zeros(0, np.int32))

    jit = _compiled(len(src.buf))
    # what each record is, by format code: 1 = marker (ftrace print), 2 = event (any other
    # system), 0 = neither (other ftrace-internal records; the last slot is code -1, no format)
    kinds = np.zeros(len(ids) + 1, np.int8)
    kinds[[i for i, ev_id in enumerate(ids)
           if formats[ev_id].system == "ftrace" and formats[ev_id].name == "print"]] = 1
    kinds[[i for i, ev_id in enumerate(ids) if formats[ev_id].system != "ftrace"]] = 2
    # records per format code (slot 0: code -1): the kinds' counts without a pass per kind
    counts = np.zeros(len(ids) + 1, np.int64)
    if jit is not None:
        jit.count_codes(code, counts)
    elif n:
        counts += np.bincount(code + 1, minlength=len(ids) + 1)
    by_kind = np.bincount(kinds[np.r_[len(ids), 0:len(ids)]], weights=counts, minlength=3)

    unknown: dict[int, int] = {}
    if counts[0]:
        unk = np.flatnonzero(code < 0)
        u, c = np.unique(read_field(src, pos[unk], ctype), return_counts=True)
        unknown = {int(a): int(b) for a, b in zip(u, c)}
        notes.append(f"{unk.size} records of event types with no format in formats/ were not "
                     f"decoded (type id: count {unknown})")

    # cross-CPU merge: stable, so equal timestamps keep (cpu, page, position) order
    order = merged_order(rec.ts, jit)

    if jit is not None:
        midx = np.empty(int(by_kind[1]), np.int64)
        jit.select_codes(code, kinds == 1, midx)
    else:
        midx = np.flatnonzero(kinds[code] == 1) if n else np.zeros(0, np.int64)
    if order is not None:       # the markers in merged order (a stable sort keeps ties in order)
        midx = midx[np.argsort(rec.ts[midx], kind="stable")]
    markers = _decode_markers(src, pos, length, rec.ts, cpu, code, midx, ids, formats)

    # events: everything else with a known format (except other ftrace-internal records)
    other_ftrace = int(by_kind[0]) - int(counts[0])
    if other_ftrace:
        notes.append(f"{other_ftrace} ftrace-internal records (not print) were skipped")
    if jit is not None:
        events, ev_notes = _decode_events_compiled(jit, src, rec, code, counts, kinds[:-1] == 2,
                                                   order, ids, formats, where)
    else:
        is_event = kinds[code] == 2
        eidx = np.flatnonzero(is_event) if order is None else order[is_event[order]]
        events, ev_notes = _decode_events(src, pos[eidx], length[eidx], rec.ts[eidx], cpu[eidx],
                                          code[eidx], ids, formats,
                                          lambda k: where(int(eidx[k])))
    notes.extend(ev_notes)

    lost_by_cpu: dict[int, int] = {}
    missed_pages: dict[int, int] = {}
    for c in np.unique(src.page_cpu):
        sel = src.page_cpu == c
        lp = rec.lost[sel]
        missed_pages[int(c)] = int(rec.missed[sel].sum())
        lost_by_cpu[int(c)] = -1 if (lp < 0).any() else int(lp.sum())
    return Decoded(events, markers, lost_by_cpu, missed_pages, unknown, notes, n,
                   "numpy" if jit is None else "compiled")


def merged_order(ts: np.ndarray, jit=None) -> np.ndarray | None:
    """The records in time order, ties in record order (a stable argsort of ``ts``), or None if
    they are in time order already. With the compiled kernels, the per-CPU runs of a few CPUs are
    merged in one pass (measured at 2.1 M records: 16-18 ms, numpy's argsort 23-30 ms); two runs
    (two CPUs) in parts on threads, each part's start found by a binary search."""
    if len(ts) < 2:
        return None
    if jit is not None:
        starts = np.empty(jit.MAX_MERGE_RUNS + 1, np.int64)
        k = jit.run_starts(ts, starts)
        if k == 1:
            return None
        if k > 0:
            order = np.empty(len(ts), np.int64)
            if k > 2:
                jit.merge_runs(ts, starts, k, order)
                return order
            m, n = int(starts[1]), len(ts)
            parts = split(n)
            # part t, output [lo, hi): the first run's [took[t], took[t + 1]), the second's rest
            took = [0] + [jit.merge_path(ts, 0, m, m, n, hi) for _, hi in parts[:-1]] + [m]
            run_split(lambda lo, hi, t: jit.merge2(ts, took[t], took[t + 1],
                                                   m + lo - took[t], m + hi - took[t + 1],
                                                   order, lo), parts)
            return order
    elif (ts[1:] >= ts[:-1]).all():
        return None
    return np.argsort(ts, kind="stable")


def _decode_markers(src, pos, length, ts, cpu, code, midx, ids, formats) -> pd.DataFrame:
    if not midx.size:
        return make_markers()
    texts = []
    pids = np.full(midx.size, -1, np.int32)
    by_code: dict[int, list[int]] = {}
    for j, k in enumerate(midx):
        by_code.setdefault(int(code[k]), []).append(j)
    for c, js in by_code.items():
        fmt = formats[ids[c]]
        js = np.asarray(js)
        cp = fmt.field("common_pid")
        if cp is not None:
            pids[js] = read_field(src, pos[midx[js]], cp)
    buf_field = {c: formats[ids[c]].field("buf") for c in by_code}
    raw = src.buf
    for j, k in enumerate(midx):
        f = buf_field[int(code[k])]
        if f is None:
            texts.append("")
            continue
        a = int(pos[k]) + f.offset
        b = int(pos[k]) + int(length[k])
        s = raw[a:b].tobytes().split(b"\0", 1)[0].decode("utf-8", "replace")
        texts.append(s[:-1] if s.endswith("\n") else s)
    return make_markers(ts=ts[midx], cpu=cpu[midx], pid=pids, text=texts)


def _labels(code: np.ndarray, ids: list[int], formats) -> tuple[list[str], dict[int, int]]:
    """(event labels, format index -> label index) of the formats present in ``code``."""
    present = np.flatnonzero(np.bincount(code, minlength=len(ids))) if len(code) else []
    return _labels_present(present, ids, formats)


def _labels_present(present, ids: list[int], formats) -> tuple[list[str], dict[int, int]]:
    """_labels, given the format indices present."""
    labels: list[str] = []
    label_of_code: dict[int, int] = {}
    for c in present:
        lab = event_label(formats[ids[int(c)]])
        if lab not in labels:
            labels.append(lab)
        label_of_code[int(c)] = labels.index(lab)
    return labels, label_of_code


def _record_need(fmt: EventFormat) -> int:
    """Bytes a record of ``fmt`` must hold: its fixed fields and its dynamic-string words."""
    return max((f.offset + (4 if (f.data_loc or f.rel_loc) else f.size)
                for f in fmt.fields.values() if not (f.is_array and not f.array_len
                                                     and not (f.data_loc or f.rel_loc))),
               default=0)


def _int_value_mask(col: str, fmt: EventFormat, notes: list[str]) -> int:
    """Bits cleared from column ``col``'s values: the preempt flag of sched_switch prev_state."""
    if col != "prev_state":
        return 0
    flag, note = sched_switch_preempt_flag(fmt)
    if note and note not in notes:
        notes.append(note)
    return int(flag)


def _decode_events(src, pos, length, ts, cpu, code, ids, formats, where):
    """The events table of the given event records (numpy: one gather per event type and field)."""
    notes: list[str] = []
    n = len(pos)
    cols: dict[str, np.ndarray] = {"ts": ts, "cpu": cpu}
    for name, dt in INT_COLUMNS.items():
        if name not in cols:
            cols[name] = np.full(n, -1, dt)
    str_codes = {c: np.zeros(n, np.int32) for c in STRING_COLUMNS}   # 0 = ""
    str_cats = {c: {"": 0} for c in STRING_COLUMNS}
    labels, label_of_code = _labels(code, ids, formats)
    event_codes = np.zeros(n, np.int32)
    for c, li in label_of_code.items():
        idx = np.flatnonzero(code == c)
        event_codes[idx] = li
        fmt = formats[ids[c]]
        p = pos[idx]
        ln = length[idx]
        need = _record_need(fmt)
        short = np.flatnonzero(ln < need)
        if short.size:
            raise TraceCorrupt(f"{where(int(idx[short[0]]))}: {fmt.full_name} record of "
                               f"{int(ln[short[0]])} bytes is shorter than its format ({need})")
        cpf = fmt.field("common_pid")
        if cpf is not None:
            cols["common_pid"][idx] = read_field(src, p, cpf)
        cmap = _column_map(fmt)
        for col, f in cmap.items():
            if col in STRING_COLUMNS:
                codes, strings = gather_strings(src, p, ln, f, lambda k, idx=idx: where(int(idx[k])))
                cat = str_cats[col]
                remap = np.empty(len(strings), np.int32)
                for i, s in enumerate(strings):
                    remap[i] = cat.setdefault(s, len(cat))
                str_codes[col][idx] = remap[codes]
                continue
            v = read_field(src, p, f)
            mask = _int_value_mask(col, fmt, notes)
            cols[col][idx] = v & ~np.int64(mask) if mask else v
    for col in STRING_COLUMNS:
        cats = list(str_cats[col])
        cols[col] = pd.Categorical.from_codes(str_codes[col], categories=cats)
    cols["event"] = pd.Categorical.from_codes(event_codes, categories=labels) if labels else \
        pd.Categorical([])
    return make_events({k: cols[k] for k in COLUMNS}, ordered=True), notes  # merged order


_JIT_INT_COLUMNS = tuple(c for c in INT_COLUMNS if c not in ("ts", "cpu"))
_JIT_MAX_STRING = 64           # fixed char arrays up to this width are interned by the kernel


def _decode_events_compiled(jit, src, rec: Records, code, counts, event_fmt, order, ids, formats,
                            where):
    """_decode_events in one compiled pass (``jit.gather``) over the records in merged order
    (``order``, None = as walked); ``code``: each record's format index (-1 = none), ``counts``:
    records per format index + 1 (slot 0: none), ``event_fmt``: by format index, whether its
    records are events."""
    notes: list[str] = []
    counts = counts[1:] * event_fmt                               # events per format
    labels, label_of_code = _labels_present(np.flatnonzero(counts), ids, formats)
    n = int(counts.sum())
    n_fmt = len(ids)
    # the integer columns by dtype: each dtype's are the rows of one 2-D array, read by its spec
    dtypes = (np.int16, np.int32, np.int64)
    of_dtype = [[c for c in _JIT_INT_COLUMNS if np.dtype(INT_COLUMNS[c]) == dt] for dt in dtypes]
    outs = [np.empty((len(cs), n), dt) for cs, dt in zip(of_dtype, dtypes)]  # gather writes all
    specs = [np.full((n_fmt, max(1, len(cs)), 4), -1, np.int64) for cs in of_dtype]
    where_col = {c: (k, row) for k, cs in enumerate(of_dtype) for row, c in enumerate(cs)}
    str_spec = np.full((n_fmt, len(STRING_COLUMNS), 2), -1, np.int64)
    need = np.zeros(n_fmt, np.int64)
    by_hand: list[tuple[int, str, Field]] = []       # strings the kernel does not intern
    label_lut = np.full(n_fmt, -1, np.int32)              # -1: not an event format
    for c, li in label_of_code.items():
        label_lut[c] = li
        fmt = formats[ids[c]]
        need[c] = _record_need(fmt)
        fields = dict(_column_map(fmt))
        cpf = fmt.field("common_pid")
        if cpf is not None:
            fields["common_pid"] = cpf
        for col, f in fields.items():
            if col in STRING_COLUMNS:
                if f.is_array and f.array_len and not (f.data_loc or f.rel_loc) \
                        and f.size <= _JIT_MAX_STRING:
                    str_spec[c, STRING_COLUMNS.index(col)] = (f.offset, f.size)
                else:
                    by_hand.append((c, col, f))
            else:
                k, row = where_col[col]
                specs[k][c, row] = (f.offset, f.size, jit.read_kind(f.offset, f.size, f.signed),
                                    _int_value_mask(col, fmt, notes))
    kw = max(1, (int(str_spec[:, :, 1].max(initial=0)) + 3) // 4)
    ts = np.empty(n, np.int64)
    ev_cpu = np.empty(n, np.int16)
    ev_label = np.empty(n, np.int8 if len(labels) < 128 else np.int32)   # few labels: no copy later
    # the record of each event whose strings are decoded by hand (only those rows are written:
    # the other pages of src_row are never touched)
    src_row = np.empty(n if by_hand else 0, np.int64)
    row_fmt = np.zeros(n_fmt, np.uint8)
    row_fmt[[c for c, _, _ in by_hand]] = 1
    str_codes = np.empty((len(STRING_COLUMNS), n), np.int32)
    order_arg = np.zeros(0, np.int64) if order is None else order
    n_rec = len(code)
    ranges = split(n_rec)
    j_lo = [0, n]
    if len(ranges) > 1:  # first event row of each range: the events before it, in merged order
        is_event = np.append(event_fmt, False)        # by format code, -1 (the last slot) too
        j_lo = np.cumsum([0] + [jit.count_selected(order_arg, lo, hi, code, is_event)
                                for lo, hi in ranges[:-1]]).tolist() + [n]

    def fill(lo, hi, k):
        """Records [lo, hi) -> rows from j_lo[k]; (status, err, interned keys)."""
        err = np.zeros(4, np.int64)
        cap = 1 << 12
        while True:  # a hash table too small for the distinct strings is retried 8x bigger
            slots = np.full(cap, -1, np.int64)
            keys = np.zeros((cap // 2, kw), np.int64)
            n_keys = np.zeros(1, np.int64)
            status = jit.gather(
                src.buf, src.view("<u2"), src.view("<u4"), order_arg, rec.pos, rec.length, rec.ts,
                rec.cpu, code, need, label_lut, *specs,
                ts, ev_cpu, ev_label, row_fmt, src_row, *outs, str_spec, str_codes, slots, keys,
                n_keys, err, lo, hi, int(j_lo[k]))
            if status != jit.TABLE_FULL:
                return status, err, keys[:int(n_keys[0])]
            cap *= 8

    parts = run_split(fill, ranges)
    for status, err, _ in parts:     # the first short record in merged order
        if status == jit.SHORT_RECORD:
            r = int(err[1])
            raise TraceCorrupt(f"{where(r)}: {formats[ids[int(code[r])]].full_name} record of "
                               f"{int(err[2])} bytes is shorter than its format ({int(err[3])})")
    # each range numbered its strings from 0: range k's keys follow the earlier ranges' keys
    key_text = [_decode_cstr(keys[i].astype("<u4").tobytes()) for _, _, keys in parts
                for i in range(len(keys))]
    key_off = np.cumsum([0] + [len(keys) for _, _, keys in parts])[:-1].astype(np.int64)
    j_bounds = np.asarray(j_lo, np.int64)

    cols: dict[str, np.ndarray] = {"ts": ts, "cpu": ev_cpu}
    for col, (k, row) in where_col.items():
        cols[col] = outs[k][row]
    # the events whose strings are decoded by hand (a few formats' strings): one pass finds them
    hand_rows = np.zeros(0, np.int64)
    if by_hand:
        wanted = np.zeros(len(labels), bool)
        wanted[[label_lut[c] for c, _, _ in by_hand]] = True
        hand_rows = np.empty(int(sum(counts[c] for c in range(n_fmt)
                                     if label_lut[c] >= 0 and wanted[label_lut[c]])), np.int64)
        jit.select_codes(ev_label, wanted, hand_rows)
    ranges_j = [(k, k + 1) for k in range(len(j_bounds) - 1)]
    for s, col in enumerate(STRING_COLUMNS):
        codes = str_codes[s]
        used = np.zeros(len(key_text), bool)
        # ranges on threads: each marks its own keys, [key_off[k], key_off[k + 1])
        run_split(lambda a, b, _k: jit.mark_strings(codes, j_bounds[a:b + 1], key_off[a:b], used),
                  ranges_j)
        cats = {"": 0}
        remap = np.zeros(len(key_text), np.int64)
        for k in np.flatnonzero(used):
            remap[k] = cats.setdefault(key_text[k], len(cats))
        hand = []
        for c, hcol, f in by_hand:
            if hcol != col:
                continue
            idx = hand_rows[ev_label[hand_rows] == label_lut[c]]      # the events of format c
            rows = src_row[idx]
            hc, strings = gather_strings(src, rec.pos[rows], rec.length[rows], f,
                                         lambda k, rows=rows: where(int(rows[k])))
            hand.append((idx, np.array([cats.setdefault(t, len(cats)) for t in strings])[hc]))
        # category codes as narrow as pandas keeps them (int8 below 127 categories): no copy
        out = np.empty(n, np.int8 if len(cats) < 127 else np.int16 if len(cats) < 32767
                       else np.int32)
        run_split(lambda a, b, _k: jit.apply_strings(codes, j_bounds[a:b + 1], key_off[a:b],
                                                     remap, out), ranges_j)
        for idx, hcodes in hand:
            out[idx] = hcodes
        # codes built here are valid: pandas' check would cost a pass over the events
        cols[col] = pd.Categorical.from_codes(out, categories=list(cats), validate=False)
    cols["event"] = pd.Categorical.from_codes(ev_label, categories=labels, validate=False) \
        if labels else pd.Categorical([])
    return make_events({k: cols[k] for k in COLUMNS}, ordered=True), notes  # merged order


# --- directory level ---------------------------------------------------------------------------

def _load_meta(d: Path) -> dict:
    p = d / "meta.json"
    try:
        meta = json.loads(p.read_text())
    except OSError as e:
        raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise TraceCorrupt(f"{p}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise TraceCorrupt(f"{p}: not a JSON object")
    return meta


def raw_files(d: Path, meta: dict) -> dict[int, Path]:
    """cpu -> cpu<N>.raw for the CPUs the recording lists (or finds)."""
    d = Path(d)
    cpus = meta.get("cpus")
    if cpus is None:
        cpus = sorted(int(p.stem[3:]) for p in d.glob("cpu*.raw") if p.stem[3:].isdigit())
    try:
        cpus = [int(c) for c in cpus]
    except (TypeError, ValueError):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad cpus list {cpus!r}") from None
    return {c: d / f"cpu{c}.raw" for c in cpus}


def _stat_int(stats: dict, key: str) -> int:
    try:
        return int(str(stats.get(key, 0)).split()[0])
    except (ValueError, IndexError):
        return 0


def capture_meta(dec: Decoded, src: PageSource, probe: str, clock: str, enabled: list[str],
                 lost_by_cpu: dict[int, int], page_size: int, notes: list[str]) -> dict:
    """The meta keys of every capture decoded from ring-buffer pages (a tracefs recording, a
    trace.dat file); ``lost_events`` is -1 (unknown) if any CPU's count is."""
    return {
        "probe": probe,
        "clock": clock,
        "events_enabled": enabled,
        "lost_events": (-1 if any(v < 0 for v in lost_by_cpu.values())
                        else sum(lost_by_cpu.values())),
        "lost_by_cpu": lost_by_cpu,
        "bytes": int(len(src.buf)),
        "n_events": int(len(dec.events)),
        "n_markers": int(len(dec.markers)),
        "n_records": dec.n_records,
        "unknown_event_types": {str(k): v for k, v in dec.unknown.items()},
        "page_size": page_size,
        "decoder": dec.decoder,
        "notes": notes,
    }


def decode_dir(out_dir: Path) -> Capture:
    """Decode a tracefs recording directory (meta.json, formats/, cpu<N>.raw) into a Capture."""
    d = Path(out_dir)
    meta = _load_meta(d)
    try:
        page_size = int(meta.get("page_size", 4096))
    except (TypeError, ValueError):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad page_size {meta.get('page_size')!r}") from None
    if page_size <= 0 or page_size % 8:
        raise TraceCorrupt(f"{d / 'meta.json'}: bad page_size {page_size}")
    fdir = d / "formats"
    hp = load_header_page(fdir / "header_page")
    load_header_event(fdir / "header_event")
    formats = load_formats_dir(fdir)
    files = raw_files(d, meta)
    for c, p in files.items():
        if not p.exists():
            raise TraceCorrupt(f"{p}: missing (meta.json lists CPU {c})")
    prefault_for_pages(sum(p.stat().st_size for p in files.values()))
    src = PageSource.from_files(files, page_size)
    dec = decode_source(src, formats, hp)

    notes = list(meta.get("notes", [])) if isinstance(meta.get("notes"), list) else []
    notes.extend(dec.notes)
    enabled = list(meta.get("events_enabled", []))
    have = {f"{f.system}/{f.name}" for f in formats.values()}
    missing = [e for e in enabled if e not in have]
    if missing:
        notes.append(f"no format stored for enabled events {missing}; their records cannot be decoded")

    stats = meta.get("stats") or {}
    lost_by_cpu: dict[int, int] = {}
    for c in files:
        page_lost = dec.lost_by_cpu.get(c, 0)
        st = stats.get(str(c), stats.get(c)) if isinstance(stats, dict) else None
        if isinstance(st, dict):
            overrun = _stat_int(st, "overrun")
            other = _stat_int(st, "commit overrun") + _stat_int(st, "dropped events")
            lost_by_cpu[c] = max(page_lost, overrun) + other
            if page_lost < 0 and overrun + other == 0:
                lost_by_cpu[c] = -1   # pages say events were lost, no counter says how many
        else:
            lost_by_cpu[c] = page_lost
        if dec.missed_pages_by_cpu.get(c):
            notes.append(f"CPU {c}: {dec.missed_pages_by_cpu[c]} pages follow lost events "
                         f"({'count not stored' if page_lost < 0 else f'{page_lost} events'})")
    clock = meta.get("clock", "local")
    if clock in NOT_NS_CLOCKS:
        notes.append(f"trace clock {clock!r} counts {NOT_NS_CLOCKS[clock]}, not ns")
    out_meta = capture_meta(dec, src, "tracefs", clock, enabled, lost_by_cpu, page_size, notes)
    for k in ("kernel", "cpus"):
        if k in meta:
            out_meta[k] = meta[k]
    return Capture(events=dec.events, markers=dec.markers, meta=out_meta)
