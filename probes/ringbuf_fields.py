"""Field gathering, the third layer of the ring-buffer decoder (:mod:`ringbuf`): one field of many
records at once, from the positions the walk (:mod:`ringbuf_walk`) found. :func:`read_field`
reads an integer field with one fancy-indexing pass; :func:`gather_strings` a string field (fixed
char array or dynamic ``__data_loc``), each distinct string decoded once: the rows of bytes are
factorised first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.probes.formats import Field
from harmony.probes.ringbuf_pages import PageSource, read_uint

MAX_STRING = 1024                    # dynamic strings longer than this are truncated


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
    v = read_uint(src, bp, s)
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


def decode_cstr(row: bytes) -> str:
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
        return codes, [decode_cstr(mat[i].tobytes()) for i in first]
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
    strings = [decode_cstr(mat[i].tobytes()) for i in first]
    return codes, strings


__all__ = ["MAX_STRING", "decode_cstr", "gather_strings", "read_field"]
