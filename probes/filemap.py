"""Several files (or parts of files) as one read-only byte array, mapped back to back from the
page cache.

The ring-buffer decoder wants all CPUs' pages in one flat buffer. Reading the files into a fresh
array copies every byte and touches as much new memory as the trace is large: on a VM whose memory
is backed lazily by the host, those page faults cost more than the decoding itself. Mapping the
files instead costs neither: one anonymous reservation of the total size, then each file mapped
over its part of it (``MAP_FIXED``; file sizes are whole pages, so the parts are page aligned).
Not with ``MAP_POPULATE``: the pages are mapped as they are first read, so that a reader going
through them in order can drop those behind it (:func:`release_mapped`) and the file is never
resident whole (the decoder's walk and gather do: 545 MB at 10 M events).

Linux only, through libc's mmap (Python's mmap module cannot place a mapping at an address);
:func:`map_files` returns None wherever that fails, and the caller reads the files instead.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import weakref
from pathlib import Path

import numpy as np

_PROT_NONE = 0
_MAP_FIXED = 0x10
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def map_files(paths: list[Path], sizes: list[int],
              offsets: list[int] | None = None) -> np.ndarray | None:
    """A read-only uint8 array holding the files' bytes back to back (``sizes``: their sizes,
    each a multiple of the system page size; ``offsets``: where in each file its part starts,
    each a multiple of it too, default 0: several parts of one file may be given), or None if
    they cannot be mapped."""
    total = sum(sizes)
    offsets = list(offsets) if offsets is not None else [0] * len(paths)
    libc = _libc() if os.name == "posix" else None
    if (libc is None or total == 0 or any(s % mmap.PAGESIZE for s in sizes)
            or any(o % mmap.PAGESIZE for o in offsets)):
        return None
    base = libc.mmap(None, total, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if base in (None, _MAP_FAILED):
        return None
    off = 0
    try:
        for path, size, at in zip(paths, sizes, offsets):
            if size:
                fd = os.open(path, os.O_RDONLY)
                try:
                    got = libc.mmap(base + off, size, mmap.PROT_READ,
                                    mmap.MAP_PRIVATE | _MAP_FIXED, fd, at)
                finally:
                    os.close(fd)  # the mapping keeps the file
                if got != base + off:
                    raise OSError(ctypes.get_errno(), "mmap failed")
            off += size
    except OSError:
        libc.munmap(base, total)
        return None
    region = (ctypes.c_uint8 * total).from_address(base)
    weakref.finalize(region, libc.munmap, base, total)  # unmapped when no array uses it any more
    arr = np.frombuffer(region, dtype=np.uint8)
    arr.flags.writeable = False
    return arr


_MADV_DONTNEED = 4


def release_mapped(arr: np.ndarray, lo: int, hi: int) -> bool:
    """Drop bytes [lo, hi) (page aligned: of the address) of an array over a read-only file
    mapping (one :func:`map_files` returned, or a perf.data's ``mmap``) from the process's memory:
    its pages are the file's, never written, so a later read maps them from the page cache again,
    unchanged. False if the kernel refused (nothing changed then)."""
    libc = _libc()
    return libc is not None and libc.madvise(arr.ctypes.data + lo, hi - lo, _MADV_DONTNEED) == 0
