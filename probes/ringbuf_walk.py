"""The record walk, the second layer of the ring-buffer decoder (:mod:`ringbuf`): every data
record of every page (:func:`walk_pages`), as :class:`Records`.

Ring-buffer page (sub-buffer) layout, as events/header_page describes it (64-bit kernel)::

    u64      timestamp      absolute time of the page's first event (trace clock)
    local_t  commit         low 27 bits: bytes of event data; bit 31 RB_MISSED_EVENTS (events were
                            lost before this page), bit 30 RB_MISSED_STORED (their count is stored
                            as an unsigned long right after the data)
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

Two engines find the same records (:func:`compiled` says which runs): the compiled kernels
(:mod:`ringbuf_jit`) walk each page once; numpy walks all pages of all CPUs in lockstep (step k
looks at the k-th record of every page that still has records) and puts the data records found
back into (page, position) order with one O(n) scatter.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from harmony.core.errors import TraceCorrupt
from harmony.core.jit import run_split, split, use_compiled
from harmony.probes.formats import Field, FormatError, HeaderPage, check_page_layout
from harmony.probes.ringbuf_pages import PageSource, read_uint

COMMIT_MASK = (1 << 27) - 1
RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
TS_MSB = -(1 << 59)                  # 0xf8 << 56 as an int64 mask
TYPE_PADDING, TYPE_TIME_EXTEND, TYPE_TIME_STAMP = 29, 30, 31


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


#: raw bytes from which the compiled decoder repays numba's start-up (~0.8 s) in a new process:
#: it saves ~0.6 us per event, and a trace holds ~90 bytes per event
JIT_MIN_BYTES = 64 << 20


def compiled(nbytes: int):
    """The compiled kernels (:mod:`ringbuf_jit`) if :func:`harmony.core.jit.use_compiled` says so
    for ``nbytes`` of pages, else None (the numpy decoder runs)."""
    if not use_compiled(nbytes, JIT_MIN_BYTES):
        return None
    from harmony.probes import ringbuf_jit
    return ringbuf_jit


#: pages of a mapped source a pass reads between two releases of them (16 MiB of 4 KiB pages)
RELEASE_PAGES = 4096


def _chunks(src: PageSource, lo: int, hi: int):
    """Pages [lo, hi) as (a, b) ranges of :data:`RELEASE_PAGES`, each released from the process's
    memory once the caller is done with it and asks for the next (:meth:`PageSource.release`); the
    whole range at once for a source read into memory.

    The compiled walk reads a mapped source's pages twice (page headers and count, then fill),
    and the decode's gather a third time, each in page order: released behind each pass, the
    file is never resident whole (545 MB at 10 M events); read again, its pages come back from
    the page cache unchanged."""
    if not src.mapped:
        yield lo, hi
        return
    for a in range(lo, hi, RELEASE_PAGES):
        b = min(a + RELEASE_PAGES, hi)
        yield a, b
        src.release(a * src.page_size, b * src.page_size)


class PageHeaders:
    """The pages' headers (timestamp, commit size, missed-events flag and count), read and checked
    a range of pages at a time (:meth:`read`)."""

    def __init__(self, src: PageSource, hp: HeaderPage):
        n = src.n_pages
        self.src, self.hp = src, hp
        self.ts, self.size = np.empty(n, np.int64), np.empty(n, np.int64)
        self.active, self.missed = np.empty(n, bool), np.empty(n, bool)
        self.lost = np.empty(n, np.int64)    # -1: events were lost, their count unknown

    def read(self, a: int, b: int) -> str | None:
        """Fill pages [a, b); the first bad one's error message, or None."""
        src, hp = self.src, self.hp
        ps = src.page_size
        base = np.arange(a, b, dtype=np.int64) * ps
        self.ts[a:b] = read_uint(src, base + hp.timestamp_offset, 8)
        commit = read_uint(src, base + hp.commit_offset, hp.commit_size)
        size = self.size[a:b]
        np.bitwise_and(commit, COMMIT_MASK, out=size)
        missed = self.missed[a:b]
        np.not_equal(commit & RB_MISSED_EVENTS, 0, out=missed)
        np.greater(size, 0, out=self.active[a:b])
        cap = ps - hp.data_offset
        bad = np.flatnonzero(size > cap)
        if bad.size:
            p = int(bad[0])
            return (f"{src.where(a + p)}: commit size {int(size[p])} exceeds the page "
                    f"({cap} data bytes)")
        lost = self.lost[a:b]
        lost[:] = np.where(missed, -1, 0)
        sp = np.flatnonzero(missed & ((commit & RB_MISSED_STORED) != 0))
        if sp.size:
            ok = size[sp] + hp.commit_size <= cap
            if not ok.all():
                return (f"{src.where(a + int(sp[~ok][0]))}: missed-events count does not fit "
                        f"after the data")
            lost[sp] = read_uint(src, base[sp] + hp.data_offset + size[sp], hp.commit_size)
        return None


# --- the lockstep page walk --------------------------------------------------------------------

def walk_pages(src: PageSource, hp: HeaderPage, type_field: Field | None = None,
               type_lut: np.ndarray | None = None) -> Records:
    """Find every data record of every page; raise TraceCorrupt on an inconsistent page.

    With ``type_field`` (where a record holds its event type id) and ``type_lut`` (type id ->
    format code, -1 = none), the compiled walk also gives each record's format code in the same
    pass (``Records.code``); the numpy walk leaves that to its caller.
    """
    ps = src.page_size
    n_pages = src.n_pages
    try:
        check_page_layout(hp, ps)   # the caller has checked it, naming the file that describes it
    except FormatError as exc:
        raise TraceCorrupt(f"{src.files[0] if src.files else 'trace'}: {exc}") from None
    heads = PageHeaders(src, hp)
    jit = compiled(len(src.buf))
    if jit is not None:     # the headers read as the count pass goes
        pos, length, ts, cpu, code, short = _walk_compiled(jit, src, hp, heads, type_field,
                                                           type_lut)
        return Records(pos, length, ts, cpu, heads.lost, heads.missed, code, short)

    bad = heads.read(0, n_pages)
    if bad:
        raise TraceCorrupt(bad)
    page_ts, size, lost, missed = heads.ts, heads.size, heads.lost, heads.missed
    base = np.arange(n_pages, dtype=np.int64) * ps
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


def _walk_compiled(jit, src: PageSource, hp: HeaderPage, heads: PageHeaders,
                   type_field: Field | None, type_lut: np.ndarray | None):
    """walk_pages' record search by the compiled kernel: the page headers read and records
    counted per page, then filled; both passes split the pages over threads
    (:func:`harmony.core.jit.split`), each :func:`_chunks` at a time. Returns (pos, length, ts, cpu,
    code or None, first short record or -1)."""
    n_pages = src.n_pages
    size = heads.size
    counts = np.zeros(n_pages, np.int64)
    none = np.zeros(0, np.int64)
    page_cpu = src.page_cpu.astype(np.int16)
    with_code = type_field is not None and type_lut is not None
    lut = np.asarray(type_lut, np.int32) if with_code else np.zeros(0, np.int32)
    t_off, t_size = (type_field.offset, type_field.size) if with_code else (0, 0)
    args = (src.buf, src.view("<u4"), src.page_size, hp.data_offset, heads.ts, size, heads.active)
    types = (page_cpu, t_off, t_size, lut)
    ranges = split(n_pages, per_item=src.page_size // 100)     # records are ~100 bytes

    def count(lo, hi, _k):
        """The range's first bad page's error message, or None."""
        for a, b in _chunks(src, lo, hi):
            bad = heads.read(a, b)
            if bad:
                return bad
            err = np.zeros(6, np.int64)
            if jit.walk(*args, counts, none, none.astype(np.int32), none, none.astype(np.int16),
                        none.astype(np.int32), *types, counts, err, a, b):
                p = int(err[1])
                return (f"{src.where(p, int(err[2]))}: bad ring-buffer record (type_len "
                        f"{int(err[3])}, length word {int(err[4])}) running past the page's "
                        f"commit size {int(size[p])}")
        return None

    bad = [e for e in run_split(count, ranges) if e is not None]
    if bad:
        raise TraceCorrupt(bad[0])                        # the first bad page, in page order
    starts = np.zeros(n_pages, np.int64)
    if n_pages:
        np.cumsum(counts[:-1], out=starts[1:])
    n = int(counts.sum())
    out = (np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64),
           np.empty(n, np.int16), np.empty(n if with_code else 0, np.int32))

    def fill(lo, hi, _k):
        first_short = -1
        for a, b in _chunks(src, lo, hi):
            err = np.full(6, -1, np.int64)
            jit.walk(*args, starts, *out, *types, counts, err, a, b)
            if first_short < 0:
                first_short = int(err[5])
        return first_short

    short = [k for k in run_split(fill, ranges) if k >= 0]
    return (*out[:4], out[4] if with_code else None, min(short) if short else -1)


__all__ = ["JIT_MIN_BYTES", "PageHeaders", "Records", "compiled", "walk_pages"]
