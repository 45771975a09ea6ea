"""The streamed decode, the compiled way through the ring-buffer decoder's layers for a large
trace.dat (:func:`decode_stream`): pages -> the canonical events and markers tables, as
:func:`ringbuf_decode.decode_source`'s, without holding the pages, the records or their order.

The pages are taken a slab at a time (about :data:`SLAB_BYTES` of whole pages: decompressed from
the file's chunks into a buffer the thread keeps, or the file's own pages, mapped and released
behind it). Each slab is walked in one pass (:func:`ringbuf_jit.walk`, into records the thread
keeps for its next slab) and its events gathered (:func:`ringbuf_jit.gather`) at once, while its
bytes are still in the CPU's cache, in the order the records are stored: CPU after CPU, page
after page. The slabs are cut into one part per
thread, by their bytes; a part writes its rows from the start of its own stretch of the columns,
as long as the most events its bytes can hold (untouched memory, never resident). Then the
events are put in time order: one merge of the CPUs' runs (:func:`ringbuf_decode.merged_order`,
stable: equal stamps keep the stored order, as the whole-trace decode keeps them), applied to
every column. The formats are parsed as their type ids are first met (a trace.dat holds every
format of its kernel), and the gather's plan grows with them.

What it holds at its peak is the event columns (~44 bytes an event as gathered, 37 once in
order; each column's memory given back as soon as it is in order) and the merge's order (8 bytes
an event). The whole-trace decode held beside its columns the decompressed pages (50 bytes an
event of a ping-pong recorded by trace-cmd), 26 bytes an event of records and 8 of their order:
reading such a trace alone (the modules an import loads, then the file into its events table)
peaked at 790 MB at 5.12 M events, 597 MB streamed, and took 2.15 s, 1.87 s streamed
(bench/README.md).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.core.jit import run_split, split
from harmony.probes.filemap import anonymous_array, drop_pages
from harmony.probes.formats import EventFormat, Field, HeaderPage
from harmony.probes.ringbuf_decode import (GATHER_DTYPES, STRING_COLUMNS, Decoded, column_map,
                                           decode_markers, gather_plan, labels_present,
                                           marker_ips, merged_order)
from harmony.probes.ringbuf_fields import decode_cstr, gather_strings
from harmony.probes.ringbuf_pages import PageSource
from harmony.probes.ringbuf_walk import PageHeaders
from harmony.probes.schema import COLUMNS, make_events, make_markers

#: pages a slab holds at most (at least one cut's worth): 1024 pages of 4 KiB, about 80 k
#: records of a ping-pong, walked and gathered while they are in the CPU's cache
SLAB_BYTES = 4 << 20
#: the fewest bytes of pages an event takes: a record's header and the 4 bytes of data the
#: shortest record holds; a part's stretch of the columns has room for its bytes / this many
MIN_RECORD_BYTES = 8
#: slots of a part's string table at first (a power of 2; half of them may be used): grown 8x,
#: its keys kept, whenever a slab's strings fill it
TABLE_SLOTS = 1 << 12
_UNPARSED = -3       # the format look-up of a type id whose format is not parsed yet


class StreamUnfit(Exception):
    """The streamed decode does not apply to this trace (its formats place the type id
    elsewhere than the walk read it, or the columns' address space is refused): the caller
    decodes it whole."""


@dataclasses.dataclass
class PageSpace:
    """The pages a stream reads, as :class:`PageSource` would hold them back to back: which CPU,
    file (``files``: the names messages give) and page of it each is; ``cuts``: the page
    indices a slab may begin or end at (rising, from 0 to the number of pages)."""

    page_size: int
    page_cpu: np.ndarray
    page_file: np.ndarray
    page_in_file: np.ndarray
    files: list[str]
    cuts: np.ndarray


#: load(first page, end page, part number) -> those pages' bytes (whole pages), valid until the
#: part's next load; done(first page, end page) once they are decoded
Loader = Callable[[int, int, int], np.ndarray]


def slabs(space: PageSpace, slab_bytes: int | None = None) -> list[tuple[int, int]]:
    """The page ranges [a, b) the stream decodes one at a time: consecutive cuts, as many as fit
    ``slab_bytes`` (:data:`SLAB_BYTES`), at least one."""
    most = max(1, (slab_bytes or SLAB_BYTES) // space.page_size)
    out, a = [], 0
    cuts = [int(c) for c in space.cuts]
    for i, c in enumerate(cuts[1:], 1):
        nxt = cuts[i + 1] if i + 1 < len(cuts) else None
        if nxt is None or nxt - a > most:
            if c > a:
                out.append((a, c))
            a = c
    return out


class _Formats:
    """The formats of the type ids met so far, by format index in the order met, and the gather
    plan over them (:func:`ringbuf_decode.gather_plan`); shared by the parts, grown under a
    lock. Each index keeps its format, and each label its number, as others are added."""

    def __init__(self, jit, format_ids, formats_for, type_field: Field, notes: list[str]):
        self.jit, self.formats_for, self.notes = jit, formats_for, notes
        self.type_field = type_field
        self.lock = threading.Lock()
        self.lut = np.full(1 << (8 * type_field.size), -1, np.int32)     # type id -> index
        known = np.asarray([i for i in format_ids if 0 <= i < len(self.lut)], np.int64)
        self.lut[known] = _UNPARSED
        self.ids: list[int] = []
        self.formats: dict[int, EventFormat] = {}
        self.kinds = np.zeros(1, np.int8)     # by index, then the last slot: index -1, none
        self.plan = None
        self._replan()

    def codes(self, type_ids: np.ndarray) -> np.ndarray:
        """Each record's format index (-1: its type id has no format), its type id given."""
        fmt = self.lut[type_ids]
        if (fmt == _UNPARSED).any():
            with self.lock:
                new = np.unique(type_ids[self.lut[type_ids] == _UNPARSED])
                if len(new):
                    parsed = self.formats_for([int(i) for i in new])
                    index = {}
                    for i in new.tolist():
                        f = parsed.get(i)
                        if f is None:
                            continue
                        ct = f.field("common_type")
                        if ct is None or (ct.offset, ct.size) != (self.type_field.offset,
                                                                  self.type_field.size):
                            raise StreamUnfit(f"format of event id {i} puts its type id "
                                              "elsewhere")
                        index[i] = len(self.ids)
                        self.ids.append(i)
                        self.formats[i] = f
                    self._replan()
                    # only now may another part see the new indices: the plan covers them
                    for i in new.tolist():
                        self.lut[i] = index.get(i, -1)
            fmt = self.lut[type_ids]
        return fmt

    def _replan(self) -> None:
        kinds = np.zeros(len(self.ids) + 1, np.int8)
        for k, i in enumerate(self.ids):
            f = self.formats[i]
            kinds[k] = 2 if f.system != "ftrace" else 1 if f.name == "print" else 0
        events = (kinds[:-1] == 2).astype(np.int64)
        plan = gather_plan(self.jit, events, self.ids, self.formats, self.notes)
        self.kinds, self.plan = kinds, plan     # a part reads the plan after the kinds


@dataclasses.dataclass
class _Part:
    """What one thread's part of the slabs found: its rows are [row0, row), at most up to end."""

    row0: int
    end: int
    row: int = 0
    n_records: int = 0
    other_ftrace: int = 0
    unknown: dict = dataclasses.field(default_factory=dict)
    lost: dict = dataclasses.field(default_factory=dict)        # cpu -> events (-1: unknown)
    missed: dict = dataclasses.field(default_factory=dict)      # cpu -> pages flagged
    markers: list = dataclasses.field(default_factory=list)
    marker_ips: set = dataclasses.field(default_factory=set)
    hand: list = dataclasses.field(default_factory=list)        # (string column, rows, strings)
    slots: np.ndarray | None = None
    keys: np.ndarray | None = None
    n_keys: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1, np.int64))
    error: TraceCorrupt | None = None
    held: tuple = ()            # the records of a slab: pos, length, ts, cpu, type id

    def records(self, most: int) -> tuple:
        """Arrays for the records of a slab (``most`` of them at most), the part's own, made
        once and used again slab after slab."""
        if not self.held or len(self.held[0]) < most:
            self.held = (np.empty(most, np.int64), np.empty(most, np.int32),
                         np.empty(most, np.int64), np.empty(most, np.int16),
                         np.empty(most, np.int32))
        return self.held


class _Columns:
    """The event columns, each as long as every part's stretch laid end to end, each of its own
    anonymous mapping (:func:`filemap.anonymous_array`): of the heap, the columns' untouched room
    and their dropped pages became free heap memory, not resident, that the tables' arrays took
    next and faulted in again. Mapped apart, whole imports of a trace-cmd recording peaked 18-22
    MiB lower at 5.12 M events (786 against 804-808 MiB) and 6-30 lower at 10.25 M, in the same
    time (3 interleaved pairs each)."""

    def __init__(self, cap: int, of_dtype: list[list[str]]):
        mapped = anonymous_array
        try:
            self.ts = mapped(cap, np.int64)
            self.cpu = mapped(cap, np.int16)
            self.label = mapped(cap, np.int16)
            self.strs = mapped((len(STRING_COLUMNS), cap), np.int32)
            self.src_row = mapped(cap, np.int64)    # written only where strings are by hand
            self.outs = [mapped((len(cs), cap), dt) for cs, dt in zip(of_dtype, GATHER_DTYPES)]
        except (MemoryError, OSError, ValueError):
            raise StreamUnfit(f"{cap} rows of address space refused") from None
        self.cap = cap


class _Stream:
    def __init__(self, jit, space: PageSpace, hp: HeaderPage, forms: _Formats, cols: _Columns,
                 load: Loader, done):
        self.jit, self.space, self.hp, self.forms, self.cols = jit, space, hp, forms, cols
        self.load, self.done = load, done
        self.identity = np.arange(len(forms.lut), dtype=np.int32)
        # an empty int64 array: the kernels' "none" (no starts: one pass; no order: as stored;
        # no rows kept)
        self.none = np.zeros(0, np.int64)

    def part(self, part: _Part, ranges: list[tuple[int, int]], k: int) -> None:
        """Decode the slabs ``ranges`` into ``part``, stopping at the first corrupt one."""
        part.row = part.row0
        try:
            for a, b in ranges:
                self._slab(part, a, b, self.load(a, b, k))
                self.done(a, b)
        except TraceCorrupt as exc:
            part.error = exc

    def _slab(self, part: _Part, a: int, b: int, pages: np.ndarray) -> None:
        jit, sp, hp, forms = self.jit, self.space, self.hp, self.forms
        ps = sp.page_size
        src = PageSource(pages, ps, sp.page_cpu[a:b].astype(np.int16), sp.page_file[a:b],
                         sp.files, sp.page_in_file[a:b])
        heads = PageHeaders(src, hp)
        bad = heads.read(0, b - a)
        if bad:
            raise TraceCorrupt(bad)
        pos, length, ts, cpu, code = part.records(len(pages) // MIN_RECORD_BYTES)
        counts = np.zeros(b - a, np.int64)
        err = np.full(6, -1, np.int64)
        if jit.walk(src.buf, src.view("<u4"), ps, hp.data_offset, heads.ts, heads.size,
                    heads.active, self.none, pos, length, ts, cpu, code, src.page_cpu,
                    forms.type_field.offset, forms.type_field.size, self.identity, counts, err,
                    0, b - a):
            p = int(err[1])
            raise TraceCorrupt(f"{src.where(p, int(err[2]))}: bad ring-buffer record (type_len "
                               f"{int(err[3])}, length word {int(err[4])}) running past the "
                               f"page's commit size {int(heads.size[p])}")
        n = int(counts.sum())
        pos, length, ts, cpu, code = pos[:n], length[:n], ts[:n], cpu[:n], code[:n]
        short = int(err[5])
        for c in np.unique(src.page_cpu):
            sel = src.page_cpu == c
            lp = heads.lost[sel]
            c = int(c)
            part.missed[c] = part.missed.get(c, 0) + int(heads.missed[sel].sum())
            before = part.lost.get(c, 0)
            part.lost[c] = -1 if before < 0 or (lp < 0).any() else before + int(lp.sum())
        part.n_records += n

        def where(r: int) -> str:
            return src.where(int(pos[r]) // ps, int(pos[r] % ps))

        if short >= 0:
            raise TraceCorrupt(f"{where(short)}: record of {int(length[short])} bytes is too "
                               f"short for an event header")
        if not n:
            return
        fmt = forms.codes(code)
        plan, kinds, ids, formats = forms.plan, forms.kinds, forms.ids, forms.formats
        counts = np.zeros(len(kinds), np.int64)     # slot 0: no format, then by index
        jit.count_codes(fmt, counts)
        if counts[0]:
            u, c = np.unique(code[fmt < 0], return_counts=True)
            for t, m in zip(u.tolist(), c.tolist()):
                part.unknown[t] = part.unknown.get(t, 0) + m
        by_kind = np.bincount(kinds[:-1], weights=counts[1:], minlength=3)
        part.other_ftrace += int(by_kind[0])
        if by_kind[1]:
            midx = np.flatnonzero(kinds[fmt] == 1)
            part.markers.append(decode_markers(src, pos, length, ts, cpu, fmt, midx, ids,
                                                formats))
            part.marker_ips.update(marker_ips(src, pos, fmt, midx, ids, formats))
        n_ev = int(by_kind[2])
        if not n_ev:
            return
        j0 = part.row
        if j0 + n_ev > part.end:        # cannot be: each event takes MIN_RECORD_BYTES at least
            raise StreamUnfit("more events than the part's bytes can hold")
        self._gather(part, src, pos, length, ts, cpu, fmt, plan, j0, where)
        part.row = j0 + n_ev
        if plan.by_hand or plan.dynamic:
            self._strings_by_hand(part, src, pos, length, fmt, plan, j0, part.row, where)

    def _table(self, part: _Part, kw: int, cap: int) -> None:
        """The part's string table made (or grown to ``cap`` slots, keys ``kw`` words wide),
        its keys kept with their numbers."""
        nk = int(part.n_keys[0])
        slots = np.full(cap, -1, np.int64)
        keys = np.zeros((cap // 2, kw), np.int64)
        if part.keys is not None:
            keys[:nk, :part.keys.shape[1]] = part.keys[:nk]
            self.jit.rehash(keys, nk, slots)
        part.slots, part.keys = slots, keys

    def _gather(self, part, src, pos, length, ts, cpu, fmt, plan, j0, where) -> None:
        jit, cols, forms = self.jit, self.cols, self.forms
        if part.keys is None or part.keys.shape[1] < plan.kw:
            self._table(part, plan.kw, len(part.slots) if part.slots is not None else TABLE_SLOTS)
        row_fmt = np.zeros(len(forms.ids), np.uint8)
        row_fmt[[c for c, _, _ in plan.by_hand]] = 1
        keep = cols.src_row if (plan.by_hand or plan.dynamic) else self.none
        outs = cols.outs
        while True:
            err = np.zeros(5, np.int64)
            status = jit.gather(src.buf, src.view("<u2"), src.view("<u4"), self.none, pos,
                                length, ts, cpu, fmt, plan.need, plan.label_lut, *plan.specs,
                                cols.ts, cols.cpu, cols.label, row_fmt, keep, *outs,
                                plan.str_spec, cols.strs, part.slots, part.keys, part.n_keys,
                                err, 0, len(pos), j0)
            if status != jit.TABLE_FULL:
                break
            self._table(part, part.keys.shape[1], len(part.slots) * 8)
        if status == jit.SHORT_RECORD:
            r = int(err[1])
            raise TraceCorrupt(f"{where(r)}: {forms.formats[forms.ids[int(fmt[r])]].full_name} "
                               f"record of {int(err[2])} bytes is shorter than its format "
                               f"({int(err[3])})")
        if err[0] == jit.BAD_STRING:
            r = int(err[1])
            f = forms.formats[forms.ids[int(fmt[r])]]
            name = column_map(f)[STRING_COLUMNS[int(err[4])]].name
            raise TraceCorrupt(f"{where(r)}: {name} string (offset {int(err[2])}, length "
                               f"{int(err[3])}) runs past its record ({f.full_name})")

    def _strings_by_hand(self, part, src, pos, length, fmt, plan, j0, j1, where) -> None:
        """The strings of rows [j0, j1) the gather left (formats decoded by hand, dynamic
        strings longer than its keys), read from the slab while it is here."""
        cols, jit = self.cols, self.jit
        todo: list[tuple[int, np.ndarray, Field]] = []
        for c, col, f in plan.by_hand:
            rows = j0 + np.flatnonzero(cols.label[j0:j1] == plan.label_lut[c])
            rows = rows[fmt[cols.src_row[rows]] == c]
            todo.append((STRING_COLUMNS.index(col), rows, f))
        for (c, col), f in plan.dynamic.items():
            s = STRING_COLUMNS.index(col)
            rows = j0 + np.flatnonzero(cols.strs[s, j0:j1] == jit.STR_LONG)
            rows = rows[fmt[cols.src_row[rows]] == c]
            todo.append((s, rows, f))
        for s, rows, f in todo:
            if len(rows):
                recs = cols.src_row[rows]
                hc, strings = gather_strings(src, pos[recs], length[recs], f,
                                             lambda k, recs=recs: where(int(recs[k])))
                part.hand.append((s, rows, np.asarray(strings, dtype=object)[hc]))


def decode_stream(jit, space: PageSpace, hp: HeaderPage, type_field: Field, format_ids,
                  formats_for, load: Loader, done, slab_bytes: int | None = None
                  ) -> tuple[Decoded, dict[int, EventFormat]]:
    """Decode the pages of ``space``, slab by slab (see the module's doc), into a
    :class:`Decoded` (as :func:`ringbuf_decode.decode_source`'s, its events and markers in the
    same order), and the formats of the type ids the records hold.

    ``type_field``: where a record holds its type id (at most 2 bytes); ``format_ids``: the type
    ids the file has a format for, ``formats_for(ids)`` parses theirs. ``load`` and ``done``: see
    :data:`Loader`. TraceCorrupt for the first corrupt slab (in stored order); StreamUnfit where
    the trace must be decoded whole."""
    if type_field.size > 2:
        raise StreamUnfit(f"type ids of {type_field.size} bytes")
    notes: list[str] = []
    forms = _Formats(jit, format_ids, formats_for, type_field, notes)
    ranges = slabs(space, slab_bytes)
    sizes = np.asarray([b - a for a, b in ranges], np.int64) * space.page_size
    total = int(sizes.sum())
    # one part per thread (as many as split() gives the records, ~100 bytes each), cut by
    # bytes between slabs
    ends = np.cumsum(sizes)
    n_parts = len(split(len(ranges), per_item=max(1, total // 100 // max(1, len(ranges)))))
    cuts = sorted({0, len(ranges)} | {int(np.searchsorted(ends, total * i // n_parts, "right"))
                                      for i in range(1, n_parts)}) if ranges else [0, 0]
    room = [int(sizes[lo:hi].sum()) // MIN_RECORD_BYTES for lo, hi in zip(cuts[:-1], cuts[1:])]
    cols = _Columns(max(1, sum(room)), forms.plan.of_dtype)
    parts = [_Part(row0=int(r0), end=int(r0) + r)
             for r0, r in zip(np.cumsum([0] + room[:-1]), room)]
    stream = _Stream(jit, space, hp, forms, cols, load, done)
    run_split(lambda lo, hi, k: stream.part(parts[k], ranges[lo:hi], k),
              list(zip(cuts[:-1], cuts[1:])) or [(0, 0)])
    for p in parts:
        if p.error is not None:
            raise p.error
    return _assemble(jit, forms, cols, parts, notes), dict(forms.formats)


def _assemble(jit, forms: _Formats, cols: _Columns, parts: list[_Part], notes: list[str]
              ) -> Decoded:
    """The parts' stretches as one events table in time order, and the rest of the Decoded."""
    plan = forms.plan
    ev_notes = list(notes)
    notes.clear()
    unknown: dict[int, int] = {}
    lost: dict[int, int] = {}
    missed: dict[int, int] = {}
    for p in parts:
        for t, m in p.unknown.items():
            unknown[t] = unknown.get(t, 0) + m
        for c, v in p.lost.items():
            lost[c] = -1 if v < 0 or lost.get(c, 0) < 0 else lost.get(c, 0) + v
        for c, v in p.missed.items():
            missed[c] = missed.get(c, 0) + v
    if unknown:
        unknown = dict(sorted(unknown.items()))
        notes.append(f"{sum(unknown.values())} records of event types with no format in "
                     f"formats/ were not decoded (type id: count {unknown})")
    other = sum(p.other_ftrace for p in parts)
    if other:
        notes.append(f"{other} ftrace-internal records (not print) were skipped")
    notes.extend(ev_notes)

    spans = [(p.row0, p.row - p.row0) for p in parts if p.row > p.row0]
    n = sum(m for _, m in spans)
    starts = np.cumsum([0] + [m for _, m in spans[:-1]]).astype(np.int64)
    if len(spans) <= 1:     # one part's rows (or none): in time order already, or merged
        r0 = spans[0][0] if spans else 0
        order = merged_order(cols.ts[r0:r0 + n], jit)
        if order is None:
            order = slice(r0, r0 + n)
        else:
            order += r0
    else:
        ts = np.concatenate([cols.ts[r:r + m] for r, m in spans])
        order = merged_order(ts, jit)
        del ts
        if order is not None:
            jit.to_rows(order, starts, np.asarray([r for r, _ in spans], np.int64))
        else:
            order = np.concatenate([np.arange(r, r + m) for r, m in spans])

    def put(col: np.ndarray) -> np.ndarray:
        """``col``'s rows in time order, as a new array; ``col``'s memory then given back
        (:func:`filemap.drop_pages`): the columns are never held twice."""
        if isinstance(order, slice):
            out = col[order].copy()
        else:
            out = np.empty(n, col.dtype)
            run_split(lambda lo, hi, _k: jit.take(col, order, out, lo, hi), split(n))
        drop_pages(col)
        return out

    out: dict[str, object] = {"ts": put(cols.ts), "cpu": put(cols.cpu)}
    outs = cols.outs or []
    for col, (k, row) in plan.where_col.items():
        out[col] = put(outs[k][row])
    cols.outs = None
    # the labels in the order of their formats' type ids, as the whole-trace decode has them
    present = sorted(range(len(forms.ids)), key=lambda c: forms.ids[c])
    labels, label_of = labels_present([c for c in present if plan.label_lut[c] >= 0],
                                       forms.ids, forms.formats)
    relabel = np.zeros(max(1, len(plan.labels)), np.int64)
    for c in range(len(forms.ids)):
        if plan.label_lut[c] >= 0:
            relabel[plan.label_lut[c]] = label_of[c]
    lab = put(cols.label)
    ev = relabel.astype(np.int8 if len(labels) < 128 else np.int32)[lab]
    del lab
    out["event"] = (pd.Categorical.from_codes(ev, categories=labels, validate=False) if labels
                    else pd.Categorical([]))
    for s, col in enumerate(STRING_COLUMNS):
        out[col] = _strings(jit, cols, parts, spans, s, put)
    cols.strs = cols.src_row = None
    events = make_events({k: out.pop(k) for k in COLUMNS}, ordered=True)

    markers = [m for p in parts for m in p.markers]
    if markers:
        mk = pd.concat(markers, ignore_index=True)
        mk = mk.iloc[np.argsort(mk["ts"].to_numpy(), kind="stable")].reset_index(drop=True)
    else:
        mk = make_markers()
    ips = tuple(sorted(set().union(*(p.marker_ips for p in parts))))
    return Decoded(events, mk, lost, missed, unknown, notes, sum(p.n_records for p in parts),
                   "compiled", ips)


def _strings(jit, cols: _Columns, parts: list[_Part], spans, s: int, put) -> pd.Categorical:
    """String column ``s`` as a categorical in time order: each part's own key numbers made the
    categories', the strings decoded by hand put in, then the rows put in order."""
    codes = cols.strs[s]
    texts = [decode_cstr(p.keys[i].astype("<u4").tobytes()) for p in parts if p.keys is not None
             for i in range(int(p.n_keys[0]))]
    key_off = np.cumsum([0] + [int(p.n_keys[0]) if p.keys is not None else 0
                               for p in parts])[:-1].astype(np.int64)
    used = np.zeros(len(texts), bool)
    live = [(k, p) for k, p in enumerate(parts) if p.row > p.row0]
    for k, p in live:
        jit.mark_strings(codes, np.asarray([p.row0, p.row], np.int64), key_off[k:k + 1], used)
    cats = {"": 0}
    remap = np.zeros(len(texts), np.int64)
    for i in np.flatnonzero(used):
        remap[i] = cats.setdefault(texts[i], len(cats))
    hand = [(rows, strings) for p in parts for hs, rows, strings in p.hand if hs == s]
    hand_codes = [np.asarray([cats.setdefault(t, len(cats)) for t in strings], np.int64)
                  for _, strings in hand]
    dt = np.int8 if len(cats) < 127 else np.int16 if len(cats) < 32767 else np.int32
    narrow = np.empty(cols.cap, dt)
    for k, p in live:
        jit.apply_strings(codes, np.asarray([p.row0, p.row], np.int64), key_off[k:k + 1], remap,
                          narrow)
    for (rows, _), hc in zip(hand, hand_codes):
        narrow[rows] = hc
    drop_pages(codes)
    return pd.Categorical.from_codes(put(narrow), categories=list(cats), validate=False)


__all__ = ["Loader", "MIN_RECORD_BYTES", "PageSpace", "SLAB_BYTES", "StreamUnfit",
           "decode_stream", "slabs"]
