"""Compiled inner loops of the ring-buffer decoder (numba), used by :mod:`ringbuf_walk` and
:mod:`ringbuf_decode` when available (:func:`harmony.probes.ringbuf_walk.compiled`).

The numpy decoder walks all pages in lockstep (``ringbuf_walk``) and gathers each field with one
fancy-indexing pass (``ringbuf_fields``); each pass allocates arrays as long as the trace, and a
2 M-event trace spends as much time faulting in fresh memory as computing. These kernels make one
pass over the records instead and write straight into the final columns:

- :func:`walk`: per page, the records' data offsets, lengths, timestamps, CPUs and event formats
  (same rules as ``ringbuf_walk.walk_pages``, whose module documents the page and record layout)
- :func:`gather`: per record, every integer column and every fixed-width string (interned in one
  open-addressing hash table, so each distinct string is decoded once)

Both return a status instead of raising (numba cannot raise rich exceptions cheaply): 0 = done,
else an error code with details in ``err`` that the caller turns into a TraceCorrupt naming the
file. When they run rather than the numpy decoder is :mod:`harmony.core.jit`'s choice (the tests run
both and compare them); how they are compiled, :mod:`harmony.core.kernels`'s (ahead of time, or by
numba's JIT, cached next to this file).
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import inline, kernel

# walk() error kinds (err[0]); err[1] = page, err[2] = byte in page, err[3] = type_len, err[4] =
# length word (err[5]: the first record too short for its type id, see walk)
BAD_RECORD = 1
# gather() error kinds
SHORT_RECORD = 1      # err[1] = record index (as walked), err[2] = its length, err[3] = bytes its
                      # format needs
TABLE_FULL = 2        # more distinct strings than the table holds: retry with a bigger one
# not a status (gather goes on, a short record found later wins): err[0] = BAD_STRING, err[1] =
# the first record (as walked) whose dynamic string runs past it, err[2] = the string's offset,
# err[3] = its length, err[4] = its string column
BAD_STRING = 3
# how gather() finds a string (str_spec[..., 2]): a fixed char array, or a dynamic string (u32
# at the field: offset in the record, or past the field for __rel_loc, | length << 16)
STR_FIXED, STR_DATA_LOC, STR_REL_LOC = 0, 1, 2
#: str_codes' value for a dynamic string longer than the table's keys: decoded by the caller
STR_LONG = -2

_TS_MSB = -(1 << 59)
_RAW_CACHE = 1024                  # entries of gather()'s raw-string cache (a power of 2)


@inline
def _uint(buf, p, size):
    v = np.int64(0)
    for j in range(size):
        v |= np.int64(buf[p + j]) << (8 * j)
    return v


@kernel
def walk(buf, w32, page_size, data_offset, page_ts, data_size, active, starts,
         out_pos, out_len, out_ts, out_cpu, out_code, page_cpu, type_off, type_size, type_lut,
         counts, err, p_lo, p_hi):
    """Walk the records of every page ``p`` in [p_lo, p_hi) with ``active[p]`` (pages are
    independent: threads may walk disjoint ranges at once). ``w32``: ``buf`` as little-endian
    uint32 words, for the record headers (4-byte aligned: one load each instead of four).

    Count mode (``out_pos`` empty): ``counts[p]`` = data records in page p. Fill mode: record k of
    page p goes to index ``starts[p] + k`` of the out_* arrays (an empty ``starts``: the records
    one after the other from index 0, in one pass; the out_* arrays must have room for them all,
    which ``len(buf) // 8`` always is: a record takes 8 bytes at least): its data's offset in
    ``buf``, data length, time stamp, CPU (``page_cpu[p]``) and format code: ``type_lut[t]`` for
    the event type id t read at ``type_off`` (``type_size`` bytes), -1 for an id outside
    ``type_lut``, -2 for a record too short to hold the id (the first such record's index goes
    to err[5] if it is -1); an empty ``out_code``: no codes.
    """
    fill = out_pos.shape[0] > 0
    seq = starts.shape[0] == 0
    at = np.int64(0)                       # the next record's index, in one pass (seq)
    codes = out_code.shape[0] > 0          # empty out_code: no format codes wanted
    n_types = type_lut.shape[0]
    nbuf = buf.shape[0]
    for p in range(p_lo, p_hi):
        if not active[p]:
            continue
        base = np.int64(p) * page_size
        pos = base + data_offset
        end = pos + data_size[p]
        ts = page_ts[p]
        k = 0
        while True:
            w = np.int64(w32[pos >> 2])
            tl = w & 31
            td = w >> 5
            arr0 = np.int64(w32[(pos >> 2) + 1]) if pos + 8 <= nbuf else np.int64(0)
            if tl == 30 or tl == 31:
                delta = (arr0 << 27) | td
                if tl == 31:
                    ts = (ts & _TS_MSB) | delta
                else:
                    ts += delta
            else:
                ts += td
            stop = False
            if 1 <= tl <= 28:
                total = 4 + tl * 4
            elif tl == 0:
                total = 4 + ((arr0 + 3) & ~3)
            elif tl == 29:
                total = 4 + arr0
                stop = td == 0
            else:
                total = 8
            newpos = pos + total
            if (tl == 0 and arr0 < 4) or (tl == 29 and not stop and (arr0 & 3) != 0) or \
                    (not stop and newpos > end):
                err[0] = BAD_RECORD
                err[1] = p
                err[2] = pos - base
                err[3] = tl
                err[4] = arr0
                return BAD_RECORD
            if tl <= 28:
                if fill:
                    i = at if seq else starts[p] + k
                    at += 1
                    if tl == 0:
                        out_pos[i] = pos + 8
                        out_len[i] = (arr0 - 4 + 3) & ~3
                    else:
                        out_pos[i] = pos + 4
                        out_len[i] = tl * 4
                    out_ts[i] = ts
                    out_cpu[i] = page_cpu[p]
                    if not codes:
                        pass
                    elif out_len[i] < type_off + type_size:
                        out_code[i] = -2
                        if err[5] < 0:
                            err[5] = i
                    else:
                        t = _uint(buf, out_pos[i] + type_off, type_size)
                        out_code[i] = type_lut[t] if t < n_types else -1
                k += 1
            if stop or newpos >= end:
                break
            pos = newpos
        counts[p] = k
    return 0


# how gather() reads one integer field (spec16/32/64[..., 2])
(READ_U8, READ_I8, READ_U16, READ_I16, READ_U32, READ_I32, READ_64, READ_BYTES,
 READ_SBYTES) = range(9)


def read_kind(offset: int, size: int, signed: bool) -> int:
    """The cheapest read of a field at ``offset`` (records start 4-byte aligned)."""
    if size == 1:
        return READ_I8 if signed else READ_U8
    if size == 2 and offset % 2 == 0:
        return READ_I16 if signed else READ_U16
    if size == 4 and offset % 4 == 0:
        return READ_I32 if signed else READ_U32
    if size == 8 and offset % 4 == 0:
        return READ_64
    return READ_SBYTES if signed else READ_BYTES


@kernel
def _field_other(buf, w16, p, size, kind):
    """A field gather() does not read inline (16/8-bit, unaligned): rare, kept out of its loop
    (inlining these branches made the whole loop 5x slower)."""
    if kind == READ_U16:
        return np.int64(w16[p >> 1])
    if kind == READ_I16:
        return np.int64(np.int16(w16[p >> 1]))
    if kind == READ_U8:
        return np.int64(buf[p])
    if kind == READ_I8:
        return np.int64(np.int8(buf[p]))
    v = _uint(buf, p, size)
    if kind == READ_SBYTES and size < 8 and v >= (np.int64(1) << (8 * size - 1)):
        v -= np.int64(1) << (8 * size)
    return v


@kernel
def _cstr_key_bytes(buf, q, width, key):
    """key = the C string of ``width`` bytes at ``q`` (cut at the first NUL), as 32-bit words."""
    for j in range(key.shape[0]):
        key[j] = 0
    for b in range(width):
        ch = buf[q + b]
        if ch == 0:
            return
        key[b >> 2] |= np.int64(ch) << (8 * (b & 3))


@inline
def _cstr_key(buf, w32, q, width, key):
    """_cstr_key_bytes, a word at a time when the string is 4-byte aligned and sized; returns the
    key's hash. A word holds a NUL iff (w - 0x01010101) & ~w & 0x80808080 != 0, and its lowest
    flagged byte is the first NUL."""
    if (q & 3) != 0 or (width & 3) != 0:
        _cstr_key_bytes(buf, q, width, key)
    else:
        nw = width >> 2
        cut = False
        for j in range(key.shape[0]):
            if j < nw and not cut:
                w = np.int64(w32[(q >> 2) + j])
                z = (w - 0x01010101) & ~w & 0x80808080
                if z != 0:
                    w &= ((z & -z) >> 7) - 1
                    cut = True
                key[j] = w
            else:
                key[j] = 0
    h = np.int64(-3750763034362895579)           # FNV-1a offset basis, one 32-bit word at a time
    for j in range(key.shape[0]):
        h = (h ^ key[j]) * np.int64(1099511628211)
    return h ^ (h >> 29)


#: _intern_missed()'s key index when the hash table is full (gather returns TABLE_FULL)
TABLE_FULL_KEY = -3


@inline
def _intern_missed(buf, w32, p, rec_len, off, width, how, key, slot, raw_code, raw_words, slots,
                   keys, nk, err, r, s):
    """(the key index of string column ``s`` of the record at ``p`` (``rec_len`` bytes), the
    keys interned now), where :func:`gather`'s raw-bytes cache missed (``slot``: its entry for
    the string, where the key found is stored; -1: none).

    (``off``, ``width``, ``how``) = str_spec[f, s]: a fixed char array of ``width`` bytes (how
    STR_FIXED) or a dynamic string (STR_DATA_LOC / STR_REL_LOC, ``width`` unused) at ``off``.
    The key index points into keys (the C string as 32-bit words, zero padded), looked up in the
    hash table ``slots`` (power-of-2 length, -1 = empty; ``nk`` keys in it); a dynamic string
    that does not fit a key (its text longer than 4 * keys.shape[1] bytes) gives STR_LONG; one
    that runs past its record -1, noted in err (BAD_STRING; the first only, and a short record
    found later replaces it); a full table TABLE_FULL_KEY. Not inlined into gather's loop by
    hand: the cache's hits (most strings) never come here."""
    q = p + off
    kw = keys.shape[1]
    if how != STR_FIXED:                 # a dynamic string: where, how long
        loc = np.int64(w32[q >> 2]) if (q & 3) == 0 else _uint(buf, q, 4)
        q = p + (loc & 0xFFFF) + (off + 4 if how == STR_REL_LOC else 0)
        width = loc >> 16
        if q + width > p + rec_len:
            if err[0] == 0:
                err[0] = BAD_STRING
                err[1] = r
                err[2] = loc & 0xFFFF
                err[3] = width
                err[4] = s
            return -1, nk
        for b in range(width):               # the text ends at its first NUL
            if buf[q + b] == 0:
                width = b
                break
        if width > 4 * kw:
            return STR_LONG, nk
    mask = slots.shape[0] - 1
    h = _cstr_key(buf, w32, q, width, key) & mask
    while True:
        k = slots[h]
        if k < 0:
            if nk * 2 >= slots.shape[0] or nk >= keys.shape[0]:
                return TABLE_FULL_KEY, nk
            for b in range(kw):
                keys[nk, b] = key[b]
            slots[h] = nk
            k = nk
            nk += 1
            break
        same = True
        for b in range(kw):
            if keys[k, b] != key[b]:
                same = False
                break
        if same:
            break
        h = (h + 1) & mask
    if slot >= 0:
        for b in range(width >> 2):
            raw_words[slot, b] = np.int64(w32[(q >> 2) + b])
        raw_code[slot] = k
    return k, nk


@kernel
def _raw_cache(kw):
    """The raw-bytes cache in front of gather's string table, empty: a string's raw words (NULs
    and what follows them included; ``kw`` at most) -> its key index. Most strings (comm) repeat,
    and comparing raw words skips the NUL search, the hash and the probe. Indexed by a cheap mix
    of the first two words."""
    return np.full(_RAW_CACHE, -1, np.int64), np.zeros((_RAW_CACHE, kw), np.int64)


@kernel
def _short_record(err, r, length, need):
    """Note record ``r`` too short for its format (``length`` < ``need`` bytes) in ``err``."""
    err[0] = SHORT_RECORD
    err[1] = r
    err[2] = length
    err[3] = need
    return SHORT_RECORD


@kernel
def gather(buf, w16, w32, order, pos, length, ts, cpu, fmt, need, label_lut, spec16, spec32,
           spec64, ts_out, cpu_out, label_out, row_fmt, row_out, o16, o32, o64, str_spec, str_codes,
           slots, keys, n_keys, err, i_lo, i_hi, j_lo):
    """Fill the event columns: out row j = the j-th event record in merged order, for the records
    at merged positions [i_lo, i_hi), whose first event is row j_lo (threads may fill disjoint
    ranges at once, each with its own string table). buf: the pages as bytes; w16/w32: the same
    memory as u16/u32 (aligned reads). order: record indices in merged (time) order, empty = as
    they are. pos/length/ts/cpu: per record. fmt[r]: record r's format index, -1 = none.
    need[f]: bytes format f needs; label_lut[f]: its label code (-> label_out), -1 = not an event
    format. row_out (if not empty): the record of each event of a format with row_fmt[f].
    Integer columns: the rows of o16/o32/o64 by dtype; spec16[f, row] = (offset, size,
    read_kind(), clear_mask) reads o16's row from format f's records, and so on. str_spec[f, s]:
    string column s, coded in str_codes[s, j] (:func:`_intern_missed`; STR_LONG: its record in
    row_out[j], row_out then as long as the events). Offset -1: absent, written as -1."""
    kw = keys.shape[1]
    key = np.zeros(kw, np.int64)
    raw_code, raw_words = _raw_cache(kw)
    n_str = str_spec.shape[1]
    nk = n_keys[0]
    use_order = order.shape[0] > 0
    keep_rows = row_out.shape[0] > 0
    j = j_lo
    for i in range(i_lo, i_hi):
        r = order[i] if use_order else i
        f = fmt[r]
        if f < 0 or label_lut[f] < 0:      # no format, or not an event's
            continue
        p = pos[r]
        if length[r] < need[f]:
            return _short_record(err, r, length[r], need[f])
        ts_out[j] = ts[r]
        cpu_out[j] = cpu[r]
        label_out[j] = label_lut[f]
        if keep_rows and row_fmt[f]:
            row_out[j] = r
        # the three loops below are one loop written out per dtype: as a helper, called or
        # inlined by numba, it took 1.7-2.9x as long (gather, 2.1 M events, warm memory)
        for row in range(o16.shape[0]):         # the int16 columns
            off = spec16[f, row, 0]
            if off < 0:                    # the format has no such field
                o16[row, j] = -1
                continue
            q = p + off
            rk = spec16[f, row, 2]
            if rk == READ_U32:
                v = np.int64(w32[q >> 2])
            elif rk == READ_I32:
                v = np.int64(np.int32(w32[q >> 2]))
            elif rk == READ_64:
                v = np.int64(w32[q >> 2]) | (np.int64(w32[(q >> 2) + 1]) << 32)
            else:
                v = _field_other(buf, w16, q, spec16[f, row, 1], rk)
            o16[row, j] = v & ~spec16[f, row, 3]
        for row in range(o32.shape[0]):         # the int32 columns
            off = spec32[f, row, 0]
            if off < 0:                    # the format has no such field
                o32[row, j] = -1
                continue
            q = p + off
            rk = spec32[f, row, 2]
            if rk == READ_U32:
                v = np.int64(w32[q >> 2])
            elif rk == READ_I32:
                v = np.int64(np.int32(w32[q >> 2]))
            elif rk == READ_64:
                v = np.int64(w32[q >> 2]) | (np.int64(w32[(q >> 2) + 1]) << 32)
            else:
                v = _field_other(buf, w16, q, spec32[f, row, 1], rk)
            o32[row, j] = v & ~spec32[f, row, 3]
        for row in range(o64.shape[0]):         # the int64 columns
            off = spec64[f, row, 0]
            if off < 0:                    # the format has no such field
                o64[row, j] = -1
                continue
            q = p + off
            rk = spec64[f, row, 2]
            if rk == READ_U32:
                v = np.int64(w32[q >> 2])
            elif rk == READ_I32:
                v = np.int64(np.int32(w32[q >> 2]))
            elif rk == READ_64:
                v = np.int64(w32[q >> 2]) | (np.int64(w32[(q >> 2) + 1]) << 32)
            else:
                v = _field_other(buf, w16, q, spec64[f, row, 1], rk)
            o64[row, j] = v & ~spec64[f, row, 3]
        for s in range(n_str):
            off = str_spec[f, s, 0]
            if off < 0:
                str_codes[s, j] = -1
                continue
            q = p + off
            width = str_spec[f, s, 1]
            slot = -1      # the raw-bytes cache: fixed arrays only (their whole width compared)
            if str_spec[f, s, 2] == STR_FIXED and (q & 3) == 0 and (width & 3) == 0 \
                    and width >= 8:
                wq = q >> 2
                slot = ((np.int64(w32[wq]) * np.int64(0x9E3779B1)) ^
                        (np.int64(w32[wq + 1]) * np.int64(0x85EBCA77))) >> 16 & (_RAW_CACHE - 1)
                k = raw_code[slot]
                if k >= 0:
                    hit = True
                    for b in range(width >> 2):
                        if raw_words[slot, b] != np.int64(w32[wq + b]):
                            hit = False
                            break
                    if hit:
                        str_codes[s, j] = k
                        continue
            k, nk = _intern_missed(buf, w32, p, length[r], off, width, str_spec[f, s, 2], key,
                                   slot, raw_code, raw_words, slots, keys, nk, err, r, s)
            if k == TABLE_FULL_KEY:
                n_keys[0] = nk
                err[0] = TABLE_FULL
                return TABLE_FULL
            if k == STR_LONG:
                row_out[j] = r
            str_codes[s, j] = k
        j += 1
    n_keys[0] = nk
    return 0


@kernel
def mark_strings(codes, j_lo, key_off, used):
    """used[key_off[k] + v] = True for every string code v >= 0 of rows [j_lo[k], j_lo[k + 1]):
    gather()'s per-range string numbers, made global (range k's keys follow the earlier ones')."""
    for k in range(j_lo.shape[0] - 1):
        off = key_off[k]
        for j in range(j_lo[k], j_lo[k + 1]):
            v = codes[j]
            if v >= 0:
                used[off + v] = True


@kernel
def apply_strings(codes, j_lo, key_off, remap, out):
    """out[j] = the category of string code v = codes[j] of range k: remap[key_off[k] + v] if
    v >= 0, else 0 (the empty string's category)."""
    for k in range(j_lo.shape[0] - 1):
        off = key_off[k]
        for j in range(j_lo[k], j_lo[k + 1]):
            v = codes[j]
            out[j] = remap[off + v] if v >= 0 else 0


@kernel
def count_codes(code, counts):
    """counts[c + 1] += records of format code c (slot 0: code -1, no format)."""
    for r in range(code.shape[0]):
        counts[code[r] + 1] += 1


@kernel
def select_codes(code, wanted, out):
    """out[:] = the records r whose wanted[code[r]] (code -1: the last slot), in order; out has
    room for exactly those."""
    k = 0
    for r in range(code.shape[0]):
        if wanted[code[r]]:
            out[k] = r
            k += 1


@kernel
def count_selected(order, lo, hi, code, wanted):
    """How many of the records at positions [lo, hi) of ``order`` (empty = as they are) have
    wanted[code[r]] (code -1: the last slot)."""
    k = 0
    use_order = order.shape[0] > 0
    for i in range(lo, hi):
        r = order[i] if use_order else i
        if wanted[code[r]]:
            k += 1
    return k


MAX_MERGE_RUNS = 8     # more time-ordered runs than this: numpy's stable argsort merges them


@kernel
def run_starts(ts, starts):
    """Where the time-ordered runs of ``ts`` begin (one per CPU: each CPU's records are in time
    order): starts[:k] and starts[k] = len(ts); returns k, or -1 if there are more than
    MAX_MERGE_RUNS (``starts`` has room for MAX_MERGE_RUNS + 1)."""
    n = ts.shape[0]
    starts[0] = 0
    k = 1
    for i in range(1, n):
        if ts[i] < ts[i - 1]:
            if k == MAX_MERGE_RUNS:
                return -1
            starts[k] = i
            k += 1
    starts[k] = n
    return k


@kernel
def merge_path(ts, a_lo, a_hi, b_lo, b_hi, h):
    """How many of run A = [a_lo, a_hi) the first h records of the stable merge of A and run
    B = [b_lo, b_hi) take (ties to A): the least i whose next A record comes after B's
    (h - i)th, by a binary search (the merge path)."""
    lo = max(0, h - (b_hi - b_lo))
    hi = min(h, a_hi - a_lo)
    while lo < hi:
        i = (lo + hi) // 2
        if ts[b_lo + h - i - 1] >= ts[a_lo + i]:      # A's record i goes before B's last taken
            lo = i + 1
        else:
            hi = i
    return lo


@kernel
def merge2(ts, a, a_hi, b, b_hi, order, j):
    """order[j:] = the stable merge of runs [a, a_hi) and [b, b_hi) (ties to the first)."""
    while a < a_hi and b < b_hi:
        if ts[b] < ts[a]:       # strict: a tie goes to the earlier run
            order[j] = b
            b += 1
        else:
            order[j] = a
            a += 1
        j += 1
    while a < a_hi:
        order[j] = a
        a += 1
        j += 1
    while b < b_hi:
        order[j] = b
        b += 1
        j += 1


@kernel
def merge_runs(ts, starts, k, order):
    """order = the stable merge of the k runs starts[:k + 1] (ties to the earlier run), by a scan
    of the runs' heads."""
    heads = starts[:k].copy()
    for j in range(ts.shape[0]):
        best = -1
        best_ts = np.int64(0)
        for r in range(k):
            h = heads[r]
            if h < starts[r + 1] and (best < 0 or ts[h] < best_ts):
                best = r
                best_ts = ts[h]
        order[j] = heads[best]
        heads[best] += 1


@kernel
def rehash(keys, nk, slots):
    """Put the ``nk`` keys of ``keys`` (rows of 32-bit words, zero padded) into the empty hash
    table ``slots`` (a power-of-2 length, -1 = empty), hashed as :func:`gather` hashes a string:
    a table grown, or its keys widened, while the strings already interned keep their numbers."""
    mask = slots.shape[0] - 1
    for k in range(nk):
        h = np.int64(-3750763034362895579)
        for j in range(keys.shape[1]):
            h = (h ^ keys[k, j]) * np.int64(1099511628211)
        h = (h ^ (h >> 29)) & mask
        while slots[h] >= 0:
            h = (h + 1) & mask
        slots[h] = k


@kernel
def take(src, idx, out, lo, hi):
    """out[i] = src[idx[i]] for i in [lo, hi) (threads may fill disjoint ranges at once)."""
    for i in range(lo, hi):
        out[i] = src[idx[i]]


@kernel
def to_rows(order, starts, rows):
    """Each position v of ``order`` (into the runs laid end to end: run k from starts[k]) made
    the row where run k's rows begin, rows[k], plus v's place in the run; ``starts`` rising."""
    k_max = starts.shape[0] - 1
    for i in range(order.shape[0]):
        v = order[i]
        k = k_max
        while starts[k] > v:
            k -= 1
        order[i] = rows[k] + v - starts[k]
