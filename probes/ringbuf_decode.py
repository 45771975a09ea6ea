"""Decoding, the fourth layer of the ring-buffer decoder (:mod:`ringbuf`): the pages of a
:class:`~harmony.probes.ringbuf_pages.PageSource` -> the canonical events and markers tables
(:func:`decode_source`, a :class:`Decoded`).

The records the walk finds (:mod:`ringbuf_walk`) are told apart by their format (markers are
ftrace ``print`` records, events every other system's), the CPUs are merged with one stable sort
on the timestamps (:func:`merged_order`), and every column is read with the offsets of the format
files: by numpy with one gather per (event type, field) (:mod:`ringbuf_fields`), or by the
compiled kernels (:mod:`ringbuf_jit`) in one pass that writes every column of every record.
"""

from __future__ import annotations

import dataclasses
from mmap import PAGESIZE as _SYS_PAGE

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.core.jit import run_split, split
from harmony.core.memory import prefault_heap
from harmony.probes.formats import EventFormat, Field, HeaderPage, sched_switch_preempt_flag
from harmony.probes.ringbuf_fields import decode_cstr, gather_strings, read_field
from harmony.probes.ringbuf_pages import PageSource
from harmony.probes.ringbuf_walk import Records, compiled, walk_pages
from harmony.probes.schema import COLUMNS, INT_COLUMNS, make_events, make_markers

# Canonical column <- candidate source fields, per sched event (first field present wins).
# Anything not listed falls back to same-named fields (pid, comm, prio, ...), see column_map().
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
# Events of other systems (or sched events whose fields are named otherwise) read by the analysis
# of why a task moved (harmony.probes.schema.CAUSE_EVENTS), by (system, name)
_OTHER_MAP = {
    ("irq", "softirq_entry"): {"prio": ("vec",)},
    ("irq", "softirq_exit"): {"prio": ("vec",)},
    # the kernel's names first, then those of Harmony's own export (harmony.probes.encode.GENERIC)
    ("sched", "sched_move_numa"): {"pid": ("pid",), "orig_cpu": ("src_cpu", "orig_cpu"),
                                   "target_cpu": ("dst_cpu", "target_cpu")},
    ("sched", "sched_swap_numa"): {"pid": ("src_pid", "pid"), "prev_pid": ("dst_pid", "prev_pid"),
                                   "orig_cpu": ("src_cpu", "orig_cpu"),
                                   "target_cpu": ("dst_cpu", "target_cpu")},
}
_GENERIC_MAP = {"pid": ("pid",), "comm": ("comm",), "prio": ("prio",),
                "target_cpu": ("target_cpu",), "orig_cpu": ("orig_cpu",)}
STRING_COLUMNS = ("comm", "prev_comm")


def event_label(fmt: EventFormat) -> str:
    """Name in the events table: bare for the sched system, ``system:name`` otherwise."""
    return fmt.name if fmt.system == "sched" else f"{fmt.system}:{fmt.name}"


def column_map(fmt: EventFormat) -> dict[str, Field]:
    spec = _OTHER_MAP.get((fmt.system, fmt.name)) or (
        _SCHED_MAP.get(fmt.name) if fmt.system == "sched" else None)
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
class Decoded:
    events: pd.DataFrame
    markers: pd.DataFrame
    lost_by_cpu: dict[int, int]          # from page flags; -1 = flagged but count not stored
    missed_pages_by_cpu: dict[int, int]
    unknown: dict[int, int]              # event type id -> count (no format)
    notes: list[str]
    n_records: int
    decoder: str = "numpy"               # "compiled" or "numpy": which one decoded the events
    #: the distinct ``ip`` of the markers' print records: where the kernel wrote them
    #: (tracing_mark_write, for a trace_marker write)
    marker_ips: tuple[int, ...] = ()


#: heap memory faulted in ahead of a decode, per byte of pages (harmony.core.memory.prefault_heap):
#: at most what the decode allocates. It was 2.5 (~130 bytes an event at ~54 bytes of pages an
#: event, what the decoder and the state machine allocated on a ping-pong load's 2.1 M events,
#: 2025-11-23); the decoder has since come to allocate less (~1.7 bytes a byte of pages at its
#: peak, 7.06 M events), and memory faulted in and never used is resident all the same: a whole
#: import of 7.06 M events peaked at 1156 MiB with 2.5, 957 with 1.5, 949 with 1.0, 993 with 2.0,
#: in the same time within the noise (4 interleaved imports each, 2026-12-05; bench/README.md)
PREFAULT_PER_PAGE_BYTE = 1.5


def prefault_for_pages(nbytes: int, per_byte: float = PREFAULT_PER_PAGE_BYTE) -> None:
    """Before ``nbytes`` of ring-buffer pages are read and decoded: have the memory the decode will
    need faulted in meanwhile, in idle CPU time (:func:`harmony.core.memory.prefault_heap`),
    ``per_byte`` bytes a byte of them (a perf.data's records, twice a ring buffer's an event,
    take less). Called as early as the size is known: the files' mapping leaves a CPU idle
    already."""
    prefault_heap(int(per_byte * nbytes))


def decode_source(src: PageSource, formats: dict[int, EventFormat], hp: HeaderPage,
                  walked: Records | None = None) -> Decoded:
    """Decode every page of ``src`` with the given formats (keyed by event ID).

    ``walked``: the records :func:`walk_pages` has found in ``src`` already, with each record's
    event type id as its ``code`` (walked with the type look-up ``np.arange``, the type id read
    where these formats' ``common_type`` is) or no code; not walked again."""
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

    if walked is None:
        rec = walk_pages(src, hp, ctype, type_lut)
    elif walked.code is None:
        rec = walked
    else:                       # type id -> format code (-2, a record too short for it, stays)
        rec = dataclasses.replace(walked, code=np.where(
            walked.code >= 0, type_lut[np.maximum(walked.code, 0)], walked.code).astype(np.int32))
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

    jit = compiled(len(src.buf))
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
    markers = decode_markers(src, pos, length, rec.ts, cpu, code, midx, ids, formats)

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
                   "numpy" if jit is None else "compiled",
                   marker_ips(src, pos, code, midx, ids, formats))


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


def marker_ips(src, pos, code, midx, ids, formats) -> tuple[int, ...]:
    """The distinct values of the markers' ``ip`` field (none without the field)."""
    ips: set[int] = set()
    for c in np.unique(code[midx]) if midx.size else ():
        f = formats[ids[int(c)]].field("ip")
        if f is not None:
            ips.update(int(v) & (1 << 64) - 1 for v in
                       np.unique(read_field(src, pos[midx[code[midx] == c]], f)))
    return tuple(sorted(ips))


def decode_markers(src, pos, length, ts, cpu, code, midx, ids, formats) -> pd.DataFrame:
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
    return labels_present(present, ids, formats)


def labels_present(present, ids: list[int], formats) -> tuple[list[str], dict[int, int]]:
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
        cmap = column_map(fmt)
        for col, f in cmap.items():
            if col in STRING_COLUMNS:
                codes, strings = gather_strings(src, p, ln, f,
                                                lambda k, idx=idx: where(int(idx[k])))
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


#: records gathered between two releases of the file's pages behind them (:func:`_pages_behind`)
RELEASE_CHUNK = 1 << 20


def _pages_behind(src: PageSource, rec: Records, order: np.ndarray | None):
    """f(lo, b, first): release the pages of a mapped source (:meth:`PageSource.release`) that
    hold only records the gather of merged positions [lo, b) has read: in each CPU's part, those
    stamped before the record at merged position b, from those stamped at position lo's time on
    (from the part's start if ``first``). The page where a range begins may hold an earlier
    range's records (read by another thread meanwhile) and is kept; a CPU whose stamps do not
    rise page after page only has pages read again from the page cache, not wrong data.

    Without it a 10 M-event trace.dat's 545 MB of pages would all be resident again by the end
    of the decode (the walk releases them behind itself, ringbuf_walk._chunks, and the gather
    reads them again, in time order across the CPUs). Measured when the file was still mapped
    with MAP_POPULATE: the decode's peak was 1702 MiB, with it 1630 (six pairs of whole
    processes, 0.98x the time)."""
    bounds = src.part_bounds()
    starts = np.searchsorted(rec.pos, bounds)        # each part's records: [starts[s], starts[s+1])
    parts = [(int(bounds[i]), int(bounds[i + 1]), int(starts[i]), int(starts[i + 1]))
             for i in range(len(bounds) - 1) if starts[i + 1] > starts[i]]
    n = len(rec.pos)
    page = src.page_size
    done: dict[tuple[int, int], int] = {}     # (range's first position, part): released up to

    def stamp(i: int) -> int:
        return int(rec.ts[order[i] if order is not None else i])

    def release(lo: int, b: int, first: bool) -> None:
        t_b = stamp(b) if b < n else None
        for s, (byte_lo, byte_hi, r_lo, r_hi) in enumerate(parts):
            t = rec.ts[r_lo:r_hi]
            frm = done.get((lo, s))
            if frm is None:
                if first:
                    frm = byte_lo
                else:
                    r = r_lo + int(np.searchsorted(t, stamp(lo), "left"))
                    frm = byte_hi if r >= r_hi else int(rec.pos[r]) // page * page + page
            upto = r_hi if t_b is None else r_lo + int(np.searchsorted(t, t_b, "left"))
            to = byte_hi if upto >= r_hi else int(rec.pos[upto]) // page * page
            if to > frm:
                src.release(frm, to)
                frm = to
            done[(lo, s)] = frm

    return release


def _pages_last_read(src: PageSource, rec: Records, order: np.ndarray | None):
    """f(lo, b, first) as :func:`_pages_behind`, for a source whose records are in no time order
    page after page (a perf.data's data section, written in rounds of every CPU's buffer): a page
    is released once the gather has read every record on it, known by the merged positions of
    the first and the last of them; one read by two threads' ranges is kept (freed with the
    mapping), as are the pages inside a record longer than a page."""
    n = len(rec.pos)
    page = _SYS_PAGE
    base = src.buf.ctypes.data % page               # pages are the address's: the data may start
    n_pages = (base + len(src.buf) + page - 1) // page      # mid-page
    first = np.full(n_pages, n, np.int64)           # each page's first and last reader
    last = np.full(n_pages, -1, np.int64)
    for lo in range(0, n, RELEASE_CHUNK):           # a chunk of records at a time: no temporary
        hi = min(lo + RELEASE_CHUNK, n)             # the length of the records
        rows = np.arange(lo, hi) if order is None else order[lo:hi]
        merged = np.arange(lo, hi, dtype=np.int64)  # the merged position of each row
        pos = rec.pos[rows] + base
        for pg in (pos // page, (pos + np.maximum(rec.length[rows], 1) - 1) // page):
            np.minimum.at(first, pg, merged)
            np.maximum.at(last, pg, merged)
    read = np.flatnonzero(last >= 0)
    by_last = read[np.argsort(last[read], kind="stable")]     # the pages read, by their last reader
    last_sorted = last[by_last]
    done: dict[int, int] = {}        # a range's first position: its pages released up to here

    def release(lo: int, b: int, first_call: bool) -> None:
        k0 = done.get(lo, 0)
        k1 = int(np.searchsorted(last_sorted, b, "left"))
        done[lo] = k1
        pages = by_last[k0:k1]
        pages = np.sort(pages[first[pages] >= lo])
        if not len(pages):
            return
        for run in np.split(pages, np.flatnonzero(np.diff(pages) != 1) + 1):   # consecutive ones
            src.release(int(run[0]) * page - base, (int(run[-1]) + 1) * page - base)

    return release


_JIT_INT_COLUMNS = tuple(c for c in INT_COLUMNS if c not in ("ts", "cpu"))
_JIT_MAX_STRING = 64           # fixed char arrays up to this width are interned by the kernel


@dataclasses.dataclass
class GatherPlan:
    """How ``jit.gather`` reads the event formats present (see its docstring): the labels, the
    integer columns by dtype (``of_dtype``, each dtype's read by ``specs[k]``; ``where_col``:
    column -> (dtype index, row)), the strings it interns (``str_spec``, keys of ``kw`` words)
    and those left to :func:`gather_strings` (``by_hand``: format code, column, field)."""

    labels: list[str]
    label_lut: np.ndarray
    n: int
    of_dtype: list[list[str]]
    specs: list[np.ndarray]
    where_col: dict[str, tuple[int, int]]
    str_spec: np.ndarray
    need: np.ndarray
    by_hand: list[tuple[int, str, Field]]
    kw: int
    dynamic: dict[tuple[int, str], Field]      # (format code, column) -> its dynamic string


GATHER_DTYPES = (np.int16, np.int32, np.int64)
#: a dynamic string (__data_loc: sched_stat_runtime's comm from kernel 6.10) is interned by the
#: kernel when its text fits a key at least this wide (a comm: 15 bytes); longer ones by hand
_JIT_DYNAMIC_KEY = 16


def gather_plan(jit, counts: np.ndarray, ids, formats, notes: list[str]) -> GatherPlan:
    """The plan of a compiled gather of the events, ``counts`` of them per format index."""
    labels, label_of_code = labels_present(np.flatnonzero(counts), ids, formats)
    n_fmt = len(ids)
    of_dtype = [[c for c in _JIT_INT_COLUMNS if np.dtype(INT_COLUMNS[c]) == dt]
                for dt in GATHER_DTYPES]
    specs = [np.full((n_fmt, max(1, len(cs)), 4), -1, np.int64) for cs in of_dtype]
    where_col = {c: (k, row) for k, cs in enumerate(of_dtype) for row, c in enumerate(cs)}
    str_spec = np.full((n_fmt, len(STRING_COLUMNS), 3), -1, np.int64)
    need = np.zeros(n_fmt, np.int64)
    by_hand: list[tuple[int, str, Field]] = []
    dynamic: dict[tuple[int, str], Field] = {}
    label_lut = np.full(n_fmt, -1, np.int32)              # -1: not an event format
    for c, li in label_of_code.items():
        label_lut[c] = li
        fmt = formats[ids[c]]
        need[c] = _record_need(fmt)
        fields = dict(column_map(fmt))
        cpf = fmt.field("common_pid")
        if cpf is not None:
            fields["common_pid"] = cpf
        for col, f in fields.items():
            if col not in STRING_COLUMNS:
                k, row = where_col[col]
                specs[k][c, row] = (f.offset, f.size, jit.read_kind(f.offset, f.size, f.signed),
                                    _int_value_mask(col, fmt, notes))
            elif f.data_loc or f.rel_loc:
                how = jit.STR_REL_LOC if f.rel_loc else jit.STR_DATA_LOC
                str_spec[c, STRING_COLUMNS.index(col)] = (f.offset, 0, how)
                dynamic[(c, col)] = f
            elif f.is_array and f.array_len and f.size <= _JIT_MAX_STRING:
                str_spec[c, STRING_COLUMNS.index(col)] = (f.offset, f.size, jit.STR_FIXED)
            else:
                by_hand.append((c, col, f))
    widest = max(int(str_spec[:, :, 1].max(initial=0)), _JIT_DYNAMIC_KEY if dynamic else 0)
    return GatherPlan(labels, label_lut, int(counts.sum()), of_dtype, specs, where_col,
                       str_spec, need, by_hand, max(1, (widest + 3) // 4), dynamic)


def _decode_events_compiled(jit, src, rec: Records, code, counts, event_fmt, order, ids, formats,
                            where):
    """_decode_events in one compiled pass (``jit.gather``) over the records in merged order
    (``order``, None = as walked); ``code``: each record's format index (-1 = none), ``counts``:
    records per format index + 1 (slot 0: none), ``event_fmt``: by format index, whether its
    records are events."""
    notes: list[str] = []
    counts = counts[1:] * event_fmt                               # events per format
    plan = gather_plan(jit, counts, ids, formats, notes)
    n = plan.n
    outs = [np.empty((len(cs), n), dt) for cs, dt in zip(plan.of_dtype, GATHER_DTYPES)]
    ts = np.empty(n, np.int64)
    ev_cpu = np.empty(n, np.int16)
    ev_label = np.empty(n, np.int8 if len(plan.labels) < 128 else np.int32)  # few: no copy later
    # the record of each event whose strings are decoded by hand (only those rows are written:
    # the other pages of src_row are never touched)
    src_row = np.empty(n if plan.by_hand or plan.dynamic else 0, np.int64)
    row_fmt = np.zeros(len(ids), np.uint8)
    row_fmt[[c for c, _, _ in plan.by_hand]] = 1
    str_codes = np.empty((len(STRING_COLUMNS), n), np.int32)
    order_arg = np.zeros(0, np.int64) if order is None else order
    ranges = split(len(code))
    j_lo = [0, n]
    is_event = np.append(event_fmt, False)            # by format code, -1 (the last slot) too
    if len(ranges) > 1:  # first event row of each range: the events before it, in merged order
        j_lo = np.cumsum([0] + [jit.count_selected(order_arg, lo, hi, code, is_event)
                                for lo, hi in ranges[:-1]]).tolist() + [n]
    behind = (None if not src.mapped else _pages_behind(src, rec, order)
              if src.parts_in_time_order else _pages_last_read(src, rec, order))

    def fill(lo, hi, k):
        """Records [lo, hi) -> rows from j_lo[k]; (status, err, interned keys). A chunk of
        records at a time, the file's pages behind each released (:func:`_pages_behind`)."""
        cuts = list(range(lo, hi, RELEASE_CHUNK)) + [hi]
        chunks = list(zip(cuts[:-1], cuts[1:]))
        # each chunk's first event row: the events of the chunks before it
        j_at = np.cumsum([int(j_lo[k])] + [jit.count_selected(order_arg, a, b, code, is_event)
                                            for a, b in chunks[:-1]]).tolist()
        cap = 1 << 12
        while True:  # a hash table too small for the distinct strings is retried 8x bigger
            err = np.zeros(5, np.int64)
            slots = np.full(cap, -1, np.int64)
            keys = np.zeros((cap // 2, plan.kw), np.int64)
            n_keys = np.zeros(1, np.int64)
            status = 0
            for (a, b), j in zip(chunks, j_at):
                status = jit.gather(
                    src.buf, src.view("<u2"), src.view("<u4"), order_arg, rec.pos, rec.length,
                    rec.ts, rec.cpu, code, plan.need, plan.label_lut, *plan.specs,
                    ts, ev_cpu, ev_label, row_fmt, src_row, *outs, plan.str_spec, str_codes,
                    slots, keys, n_keys, err, a, b, j)
                if status:
                    break
                if behind is not None:
                    behind(lo, b, k == 0)
            if status != jit.TABLE_FULL:
                return status, err, keys[:int(n_keys[0])]
            cap *= 8

    parts = run_split(fill, ranges)
    _raise_gather_errors(jit, parts, code, ids, formats, where)
    cols: dict[str, np.ndarray] = {"ts": ts, "cpu": ev_cpu}
    for col, (k, row) in plan.where_col.items():
        cols[col] = outs[k][row]
    strings = _StringColumns(jit, src, rec, plan, parts, np.asarray(j_lo, np.int64), ev_label,
                             src_row, counts, code, where)
    for s, col in enumerate(STRING_COLUMNS):
        cols[col] = strings.column(s, col, str_codes[s])
    cols["event"] = pd.Categorical.from_codes(ev_label, categories=plan.labels, validate=False) \
        if plan.labels else pd.Categorical([])
    return make_events({k: cols[k] for k in COLUMNS}, ordered=True), notes  # merged order


def _raise_gather_errors(jit, parts, code, ids, formats, where) -> None:
    """TraceCorrupt for the first short record in merged order, else for the first dynamic
    string running past its record (``parts``: each thread's (status, err, keys), in order)."""
    for status, err, _ in parts:
        if status == jit.SHORT_RECORD:
            r = int(err[1])
            raise TraceCorrupt(f"{where(r)}: {formats[ids[int(code[r])]].full_name} record of "
                               f"{int(err[2])} bytes is shorter than its format ({int(err[3])})")
    for _, err, _ in parts:
        if err[0] == jit.BAD_STRING:
            r = int(err[1])
            name = column_map(formats[ids[int(code[r])]])[STRING_COLUMNS[int(err[4])]].name
            raise TraceCorrupt(f"{where(r)}: {name} string (offset {int(err[2])}, length "
                               f"{int(err[3])}) runs past its record")


class _StringColumns:
    """The string columns of a compiled gather as categoricals: each thread numbered its strings
    from 0 (range k's keys follow the earlier ranges'); the strings the kernel left (formats
    ``plan.by_hand``, dynamic strings too long for its keys) are decoded by
    :func:`gather_strings`."""

    def __init__(self, jit, src, rec, plan: GatherPlan, parts, j_bounds, ev_label, src_row,
                 counts, code, where):
        self.jit, self.src, self.rec, self.plan, self.ev_label = jit, src, rec, plan, ev_label
        self.src_row, self.code, self.where, self.j_bounds = src_row, code, where, j_bounds
        self.key_text = [decode_cstr(keys[i].astype("<u4").tobytes()) for _, _, keys in parts
                         for i in range(len(keys))]
        self.key_off = np.cumsum([0] + [len(keys) for _, _, keys in parts])[:-1].astype(np.int64)
        self.ranges_j = [(k, k + 1) for k in range(len(j_bounds) - 1)]
        # the events of the formats decoded by hand (a few formats' strings): one pass finds them
        self.hand_rows = np.zeros(0, np.int64)
        if plan.by_hand:
            wanted = np.zeros(len(plan.labels), bool)
            wanted[[plan.label_lut[c] for c, _, _ in plan.by_hand]] = True
            self.hand_rows = np.empty(int(sum(counts[c] for c in range(len(counts))
                                              if plan.label_lut[c] >= 0
                                              and wanted[plan.label_lut[c]])), np.int64)
            jit.select_codes(ev_label, wanted, self.hand_rows)

    def column(self, s: int, col: str, codes: np.ndarray) -> pd.Categorical:
        jit, jb, ko, n = self.jit, self.j_bounds, self.key_off, len(codes)
        used = np.zeros(len(self.key_text), bool)
        # ranges on threads: each marks its own keys, [key_off[k], key_off[k + 1])
        run_split(lambda a, b, _k: jit.mark_strings(codes, jb[a:b + 1], ko[a:b], used),
                  self.ranges_j)
        cats = {"": 0}
        remap = np.zeros(len(self.key_text), np.int64)
        for k in np.flatnonzero(used):
            remap[k] = cats.setdefault(self.key_text[k], len(cats))
        hand = []
        for c, hcol, f in self.plan.by_hand:
            if hcol == col:
                idx = self.hand_rows[self.ev_label[self.hand_rows] == self.plan.label_lut[c]]
                hand.append((idx, self._by_hand(self.src_row[idx], f, cats)))
        if any(hcol == col for _, hcol in self.plan.dynamic):
            long = np.flatnonzero(codes == jit.STR_LONG)      # rare: texts past a key's width
            rows = self.src_row[long]
            fmt = self.code[rows]
            for c in np.unique(fmt):
                pick = fmt == c
                hand.append((long[pick], self._by_hand(rows[pick],
                                                       self.plan.dynamic[(int(c), col)], cats)))
        # category codes as narrow as pandas keeps them (int8 below 127 categories): no copy
        out = np.empty(n, np.int8 if len(cats) < 127 else np.int16 if len(cats) < 32767
                       else np.int32)
        run_split(lambda a, b, _k: jit.apply_strings(codes, jb[a:b + 1], ko[a:b], remap, out),
                  self.ranges_j)
        for idx, hcodes in hand:
            out[idx] = hcodes
        # codes built here are valid: pandas' check would cost a pass over the events
        return pd.Categorical.from_codes(out, categories=list(cats), validate=False)

    def _by_hand(self, rows: np.ndarray, f: Field, cats: dict) -> np.ndarray:
        """The category codes (added to ``cats``) of field ``f`` of the records ``rows``."""
        hc, strings = gather_strings(self.src, self.rec.pos[rows], self.rec.length[rows], f,
                                     lambda k: self.where(int(rows[k])))
        return np.array([cats.setdefault(t, len(cats)) for t in strings], np.int64)[hc]


__all__ = ["Decoded", "GATHER_DTYPES", "GatherPlan", "PREFAULT_PER_PAGE_BYTE", "STRING_COLUMNS",
           "column_map", "decode_markers", "decode_source", "event_label", "gather_plan",
           "labels_present", "marker_ips", "merged_order", "prefault_for_pages"]
