"""The compiled record walk of a perf.data's data section (numba), used by
:func:`harmony.probes.perf_read.walk_records` when :mod:`harmony.core.jit` says so: the records
follow one another, each header's size giving the next one's place, so the walk is one sequential
pass (in Python ~0.3 us a record; here a few ns). Cached like :mod:`harmony.probes.ringbuf_jit`'s
kernels (``harmony.precompile`` compiles it at install)."""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel


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
