"""The compiled record walk of a perf.data's data section (numba), used by
:func:`harmony.probes.perf_read.walk_records` when :mod:`harmony.core.jit` says so: the records
follow one another, each header's size giving the next one's place, so the walk is one sequential
pass (in Python ~0.3 us a record; here a few ns). And the samples' events and fields read in one
pass over the walked records (:func:`sample_rows`, for
:func:`harmony.probes.perf_read.compiled_samples`), where numpy made a pass over every sample per
field and check: a 9.38 M-event file's samples in 0.30 s instead of 0.64 (one thread, their sort
by time included). Cached like :mod:`harmony.probes.ringbuf_jit`'s kernels
(``harmony.precompile`` compiles them at install)."""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import inline, kernel


@kernel
def walk(buf, offs, types, sizes, err):
    """Walk the records of ``buf`` (a data section: u32 type, u16 misc, u16 size, ...): count them
    (``offs`` empty) or write each one's offset, type and size. Returns the number of records;
    ``err[0]``: the offset of a record whose size is below 8 bytes or runs past ``buf``, else -1."""
    n = len(buf)
    fill = len(offs) > 0
    k = 0
    at = 0
    err[0] = -1
    while at + 8 <= n:
        size = np.int64(buf[at + 6]) | (np.int64(buf[at + 7]) << 8)
        if size < 8 or at + size > n:
            err[0] = at
            return k
        if fill:
            if k >= len(offs):
                return k
            offs[k] = at
            types[k] = (np.uint32(buf[at]) | (np.uint32(buf[at + 1]) << 8)
                        | (np.uint32(buf[at + 2]) << 16) | (np.uint32(buf[at + 3]) << 24))
            sizes[k] = size
        k += 1
        at += size
    if at != n:
        err[0] = at
    return k


# sample_type and read_format bits (perf_read's; a kernel reads module globals as constants)
_READ, _CALLCHAIN = 1 << 4, 1 << 5
_F_ENABLED, _F_RUNNING, _F_ID, _F_GROUP, _F_LOST = 1, 2, 4, 8, 16
_REC_SAMPLE = 9
_CPU_MAX = 32767        # an int16's: a CPU above it is a corrupt sample
_MAX_COUNT = 1 << 16    # a read group's or call chain's count above it is a corrupt sample
#: sample_rows' result besides the number of rows: the numpy path must read this slab (it
#: raises or notes what the compiled pass does not say)
ASK_NUMPY = -1


@inline
def _le(buf, p, size):
    """The little-endian unsigned integer of ``size`` bytes at ``buf[p]``, as an int64."""
    v = np.int64(0)
    for j in range(size):
        v |= np.int64(buf[p + j]) << (8 * j)
    return v


@kernel
def sample_rows(buf, offs, types, sizes, id_at, ids, id_attr, attr_row, attr_code, attr_fixed,
                attr_tid, attr_time, attr_cpu, attr_st, attr_rf, counts, pos, size, ts, cpu,
                code, tid):
    """The samples of a slab's records (``offs``, ``types``, ``sizes``: its walk) in one pass,
    as perf_read's numpy code reads them: each sample's attr by its id (``id_at``: the id's
    offset in the record, 0: every sample is attr 0's; ``ids``, sorted, and ``id_attr``: the
    attr of each), counted in ``counts`` (slot 0: an unknown id, attr k's in k + 1); the samples
    of the attrs whose ``attr_row`` is set read where their sample_type puts the fields: the
    fixed ones' bytes (``attr_fixed``), the offsets in them of the tid (``attr_tid``, -1: none),
    time and cpu, then the read values and call chain (``attr_st``, ``attr_rf``) and the RAW
    payload. Written in file order: the payload's position and size (at most 2**30), time, cpu,
    ``attr_code`` and tid (-1 without one). Returns the rows written, or ASK_NUMPY at the first
    sample the numpy code would refuse (too short for its id, a field past its record, a count
    past 2**16, a time past 2**63, a CPU past an int16's): that code then reads the slab and
    says what is wrong."""
    n_ids = len(ids)
    k = 0
    for r in range(len(offs)):
        if types[r] != _REC_SAMPLE:
            continue
        at = offs[r]
        end = at + sizes[r]
        a = 0
        if id_at > 0:
            if at + id_at + 8 > end:
                return ASK_NUMPY
            a = -1
            if n_ids > 0:
                want = np.uint64(_le(buf, at + id_at, 8))
                lo, hi = 0, n_ids
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if ids[mid] < want:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo == n_ids:
                    lo = n_ids - 1
                if ids[lo] == want:
                    a = id_attr[lo]
        counts[a + 1] += 1
        if a < 0 or not attr_row[a]:
            continue
        p = at + 8
        if p + attr_fixed[a] > end:
            return ASK_NUMPY
        t = _le(buf, p + attr_time[a], 8)
        c = _le(buf, p + attr_cpu[a], 4)
        if t < 0 or c > _CPU_MAX:
            return ASK_NUMPY
        p += attr_fixed[a]
        st = attr_st[a]
        if st & _READ:
            rf = attr_rf[a]
            per = 1 + (1 if rf & _F_ID else 0) + (1 if rf & _F_LOST else 0)
            times = (1 if rf & _F_ENABLED else 0) + (1 if rf & _F_RUNNING else 0)
            if rf & _F_GROUP:
                nr = _le(buf, min(p, end - 8), 8)
                if nr < 0 or nr > _MAX_COUNT:
                    return ASK_NUMPY
                p += 8 * (1 + times) + 8 * per * nr
            else:
                p += 8 * (times + per)
            if p > end:
                return ASK_NUMPY
        if st & _CALLCHAIN:
            if p + 8 > end:
                return ASK_NUMPY
            nr = _le(buf, p, 8)
            if nr < 0 or nr > _MAX_COUNT:
                return ASK_NUMPY
            p += 8 + 8 * nr
            if p > end:
                return ASK_NUMPY
        if p + 4 > end:
            return ASK_NUMPY
        n = _le(buf, p, 4)
        if p + 4 + n > end:
            return ASK_NUMPY
        pos[k] = p + 4
        size[k] = min(n, 1 << 30)
        ts[k] = t
        cpu[k] = c
        code[k] = attr_code[a]
        tid[k] = np.int32(_le(buf, at + 8 + attr_tid[a], 4)) if attr_tid[a] >= 0 else -1
        k += 1
    return k
