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
    mapping (one :func:`map_files` or :func:`mapped_array` returned, or a perf.data's ``mmap``)
    from the process's memory: its pages are the file's, never written, so a later read maps them
    from the page cache again, unchanged. False if the kernel refused (nothing changed then)."""
    libc = _libc()
    return libc is not None and libc.madvise(arr.ctypes.data + lo, hi - lo, _MADV_DONTNEED) == 0


#: file systems whose files are memory: a scratch file there saves no memory
_MEMORY_FS = ("tmpfs", "ramfs")


def scratch_file(nbytes: int, directory: str | Path | None = None):
    """An empty scratch file (binary, read-write) in ``directory`` (the temporary directory by
    default) for ``nbytes`` written to it and then mapped (:func:`mapped_array`): they live in
    the page cache, read from there as a file's pages are, not in this process's memory. The
    file is unlinked at once: nothing is left behind, even by a killed process; it goes when it
    is closed and no array maps it any more. None where that would save no memory (a tmpfs or
    ramfs directory) or the directory lacks the room (``nbytes`` and a quarter more)."""
    import shutil
    import tempfile

    import psutil

    where = os.path.realpath(directory or tempfile.gettempdir())
    mounts = [p for p in psutil.disk_partitions(all=True)
              if where == p.mountpoint or where.startswith(p.mountpoint.rstrip("/") + "/")]
    if nbytes <= 0 or not mounts:
        return None
    if max(mounts, key=lambda p: len(p.mountpoint)).fstype in _MEMORY_FS:
        return None
    try:
        if shutil.disk_usage(where).free < nbytes * 1.25:
            return None
        return tempfile.TemporaryFile(dir=where)
    except OSError:
        return None


def mapped_array(f, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of the open file ``f``, mapped read-only (shared: what was written
    to it, flushed first): a read-only array whose pages :func:`release_mapped` may drop."""
    f.flush()
    return np.frombuffer(mmap.mmap(f.fileno(), nbytes, mmap.MAP_SHARED, mmap.PROT_READ), np.uint8)
