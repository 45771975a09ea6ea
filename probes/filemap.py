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

For the same reason a file is copied past the page cache (:func:`copy_file`; under a temporary
name first: :func:`copy_atomically`), and a scratch file holds what would otherwise be a large
array (:func:`scratch_file`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import threading
import time
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


def anonymous_array(shape: tuple | int, dtype) -> np.ndarray:
    """A zeroed array of its own anonymous mapping, not of the heap: its pages are the kernel's
    only once written, and given back to it when the array goes (the heap keeps freed memory for
    the next arrays: what a reader frees there, between arrays it keeps, is resident and often
    too small for them)."""
    shape = (shape,) if isinstance(shape, int) else shape
    count = int(np.prod(shape))
    n = count * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, max(n, 1)), dtype, count=count).reshape(shape)


def drop_pages(arr: np.ndarray) -> None:
    """Give the whole pages of ``arr`` (contiguous, never read again) back to the kernel
    (``madvise(MADV_DONTNEED)``: anonymous memory reads as zeros after it), while the array
    itself is freed only with the rest of its allocation."""
    base = arr.ctypes.data
    lo = -(-base // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (base + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        release_mapped(arr, lo - base, hi - base)


#: file systems whose files are memory: a scratch file there saves no memory
_MEMORY_FS = ("tmpfs", "ramfs")


def scratch_file(nbytes: int, directory: str | Path | None = None):
    """An empty scratch file (binary, read-write) in ``directory`` (the temporary directory by
    default) for ``nbytes`` written to it and then mapped (:func:`mapped_array`): they live in
    the page cache, read from there as a file's pages are, not in this process's memory. The
    file is unlinked at once: nothing is left behind, even by a killed process; it goes when it
    is closed and no array maps it any more. None where :func:`scratch_saves_memory` says no."""
    import tempfile

    if not scratch_saves_memory(nbytes, directory):
        return None
    try:
        return tempfile.TemporaryFile(dir=os.path.realpath(directory or tempfile.gettempdir()))
    except OSError:
        return None


def scratch_saves_memory(nbytes: int, directory: str | Path | None = None) -> bool:
    """Whether a scratch file for ``nbytes`` in ``directory`` (the temporary directory by
    default) would keep them out of memory: not where the directory is memory itself (a tmpfs
    or ramfs: a file there is as much memory as an array), nor where it lacks the room
    (``nbytes`` and a quarter more). What an import's memory estimate asks too."""
    import shutil
    import tempfile

    import psutil

    where = os.path.realpath(directory or tempfile.gettempdir())
    mounts = [p for p in psutil.disk_partitions(all=True)
              if where == p.mountpoint or where.startswith(p.mountpoint.rstrip("/") + "/")]
    if nbytes <= 0 or not mounts:
        return False
    if max(mounts, key=lambda p: len(p.mountpoint)).fstype in _MEMORY_FS:
        return False
    try:
        return shutil.disk_usage(where).free >= nbytes * 1.25
    except OSError:
        return False


def mapped_array(f, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of the open file ``f``, mapped read-only (shared: what was written
    to it, flushed first): a read-only array whose pages :func:`release_mapped` may drop."""
    f.flush()
    return np.frombuffer(mmap.mmap(f.fileno(), nbytes, mmap.MAP_SHARED, mmap.PROT_READ), np.uint8)


#: a copy (:func:`copy_file`) moves this many bytes at a time, through one buffer reused
COPY_CHUNK = 8 << 20
#: ioctl: make a file share another's blocks (a reflink; btrfs, XFS, bcachefs, NFS 4.2 ...)
_FICLONE = 0x40049409
#: a direct copy goes on through the page cache once it has written this many bytes at less than
#: DIRECT_MIN_RATE bytes a second: the device is slower than the import it runs beside (10 M
#: events, 513 MB, in ~3.5 s here, the copy begun ~1.5 s in: 250 MB/s), as a disk or a network
#: file system may be. This machine's disk writes 3.5 GB/s; onto one throttled to 150 MB/s (a
#: blkio cgroup) a direct copy made the import 1.23x slower than a buffered one, 1.11x when
#: hurried at the end, 1.00x with this switch (bench/README.md)
DIRECT_PROBE_BYTES = 16 << 20
DIRECT_MIN_RATE = 400e6
#: O_DIRECT wants offsets, lengths and the buffer's address in whole logical blocks: 4096 bytes
#: is a multiple of any usual one (a device whose blocks are larger refuses: a buffered copy)
_DIRECT_ALIGN = 4096


#: ioctl: make a range of a file share another's blocks
_FICLONERANGE = 0x4020940D


def shares_blocks(src: str | Path, directory: str | Path) -> bool:
    """Whether :func:`copy_file` of ``src`` into ``directory`` would share its blocks (a
    reflink: no room taken): its first block cloned into an unlinked scratch file there, to see.
    False for a file of less than a block (nothing to try it with)."""
    import struct
    import tempfile

    try:
        with open(src, "rb") as s, tempfile.TemporaryFile(dir=directory) as d:
            if os.fstat(s.fileno()).st_size < _DIRECT_ALIGN:
                return False
            fcntl.ioctl(d.fileno(), _FICLONERANGE,
                        struct.pack("qQQQ", s.fileno(), 0, _DIRECT_ALIGN, 0))
            return True
    except OSError:
        return False


class CopyStopped(Exception):
    """:func:`copy_file` was stopped (its ``stop`` set) before the end."""


def copy_file(src: str | Path, dest: str | Path, chunk: int = COPY_CHUNK,
              hurry: threading.Event | None = None, stop: threading.Event | None = None) -> str:
    """Copy ``src`` to ``dest`` (created, or emptied first) and say how: "reflink" (the file
    system shares the blocks, copying nothing), "direct" (written with ``O_DIRECT`` through one
    reused buffer of ``chunk`` bytes: no page-cache page is taken for the copy, none is left
    dirty to write back), "direct, then buffered" (``hurry`` was set before the end, or the
    device wrote its first :data:`DIRECT_PROBE_BYTES` slower than :data:`DIRECT_MIN_RATE`: the
    rest went through the page cache, as a usual copy's does, without waiting for the device),
    else "buffered" (where ``O_DIRECT`` is refused, or ``hurry`` was set from the start).
    CopyStopped once ``stop`` is set (checked between chunks): ``dest`` is then a part.

    Why: an import keeps a copy of its trace while it builds the tables. Copied through the page
    cache, each of its pages is new memory, which on this machine (a VM backed lazily by its host)
    cost an import of 10 M events (513 MB) 1.1 s of system time and 0.5 s of its 4.3 s wall time,
    and it fills the page cache with a second copy of the trace. A direct copy waits for the
    device instead: the import sets ``hurry`` once its tables are written, so that on a disk
    slower than the analysis it waits for one chunk at most, then writes the rest as a buffered
    copy would (onto a disk throttled to 150 MB/s: as long as copyfile, bench/README.md)."""
    with open(src, "rb") as s, open(dest, "wb") as d:
        with contextlib.suppress(OSError):
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
            return "reflink"
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            fd = None               # the file system refuses O_DIRECT: through the page cache
        chunk = max(_DIRECT_ALIGN, chunk - chunk % _DIRECT_ALIGN)
        try:
            with mmap.mmap(-1, chunk) as buf:       # page aligned, as O_DIRECT wants
                return _copy_through(s.fileno(), d.fileno(), fd, memoryview(buf), hurry, stop)
        finally:
            if fd is not None:
                os.close(fd)


def _copy_through(src_fd: int, dest_fd: int, direct_fd: int | None, buf: memoryview,
                  hurry: threading.Event | None, stop: threading.Event | None) -> str:
    """copy_file's loop, through ``buf``: whole blocks into ``direct_fd`` (O_DIRECT, if there
    is one) until ``hurry`` is set or the device proves slow (DIRECT_MIN_RATE) or refuses, the
    rest (and a last part block) into ``dest_fd``, through the page cache."""
    size = os.fstat(src_fd).st_size
    body = size - size % _DIRECT_ALIGN
    off = direct_bytes = 0
    writing_s = 0.0
    with buf:
        while off < size:
            if stop is not None and stop.is_set():
                raise CopyStopped(f"stopped at {off} of {size} bytes")
            if direct_fd is not None and (
                    (hurry is not None and hurry.is_set())
                    or (direct_bytes >= DIRECT_PROBE_BYTES
                        and direct_bytes < DIRECT_MIN_RATE * writing_s)):
                direct_fd = None
            direct = direct_fd is not None and off < body
            with buf[:min(len(buf), (body if direct else size) - off)] as part:
                _read_into(src_fd, part, off)
                t = time.perf_counter()
                try:
                    n = os.pwrite(direct_fd if direct else dest_fd, part, off)
                except OSError as exc:
                    if not (direct and exc.errno == errno.EINVAL and off == 0):
                        raise
                    direct_fd = None        # the device refuses O_DIRECT: nothing written yet
                    continue
                if n < len(part):           # a disk filling up: the next write says why
                    with part[n:] as rest:
                        _write_all(dest_fd, rest, off + n)
                off += len(part)
                if direct:
                    direct_bytes += len(part)
                    writing_s += time.perf_counter() - t
    if not direct_bytes:
        return "buffered"
    return "direct, then buffered" if direct_bytes < body else "direct"


def _write_all(fd: int, part: memoryview, off: int) -> None:
    """Write all of ``part`` at ``off`` of ``fd``, through short writes; OSError (no space) if
    the file system takes no more."""
    done = 0
    while done < len(part):
        with part[done:] as rest:
            n = os.pwrite(fd, rest, off + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


def _read_into(fd: int, part: memoryview, off: int) -> None:
    """Fill ``part`` with ``fd``'s bytes from ``off``; OSError if the file ends first (it
    shrank while being copied)."""
    got = 0
    while got < len(part):
        with part[got:] as rest:
            n = os.preadv(fd, [rest], off + got)
        if n <= 0:
            raise OSError(errno.EIO, f"the file ended at {off + got} bytes while it was copied")
        got += n


def same_file(path: Path, other: Path) -> bool:
    """Whether ``other`` is ``path`` (a trace piped in is written where its copy would go)."""
    try:
        return os.path.samefile(path, other)
    except OSError:             # one of them is not there
        return False


def copy_atomically(src: Path, dest: Path, hurry: threading.Event | None = None,
                    stop: threading.Event | None = None) -> None:
    """Copy ``src`` to ``dest`` (:func:`copy_file`, with its ``hurry`` and ``stop``) under a
    temporary name first: a copy cut short is never found. Nothing to do where ``dest`` is
    ``src`` (a trace piped in is written there)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if same_file(src, dest):
        return
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        copy_file(src, tmp, hurry=hurry, stop=stop)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
