"""Ring-buffer pages in memory, the first layer of the ring-buffer decoder (:mod:`ringbuf`).

:class:`PageSource` holds the pages of every CPU back to back in one flat buffer, and which file,
CPU and page of that file each came from (for messages that name the place). The cpuN.raw files
of a recording are mapped, not copied (:mod:`filemap`), and read where they cannot be; a
trace.dat's sections are given as buffers. :func:`read_uint` reads integers at any byte positions.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from harmony.core.errors import TraceCorrupt
from harmony.probes.filemap import map_files, release_mapped

_SYS_PAGE = mmap.PAGESIZE


class PageSource:
    """Flat buffer of whole pages + which file/CPU each page came from (for messages)."""

    def __init__(self, buf: np.ndarray, page_size: int, page_cpu: np.ndarray,
                 page_file: np.ndarray, files: list[str], page_in_file: np.ndarray):
        self.buf = buf
        self.page_size = page_size
        self.page_cpu = page_cpu
        self.page_file = page_file
        self.files = files
        self.page_in_file = page_in_file
        self._views: dict[str, np.ndarray] = {}
        #: the buffer is the files' own pages, mapped (:mod:`filemap`): :meth:`release` drops them
        self.mapped = False
        #: each part's (each CPU's) records are in time order, part after part (a ring buffer's
        #: pages): the decode releases the pages behind its gather by time; otherwise (a
        #: perf.data) by the last record each page holds
        self.parts_in_time_order = True

    @property
    def n_pages(self) -> int:
        return len(self.buf) // self.page_size

    def view(self, dtype: str) -> np.ndarray:
        v = self._views.get(dtype)
        if v is None:
            v = self.buf.view(dtype)
            self._views[dtype] = v
        return v

    def release(self, lo: int, hi: int) -> None:
        """Drop the whole pages inside bytes [lo, hi) of a mapped source from this process's
        memory (``madvise(MADV_DONTNEED)``): they are the files' pages, read again from the page
        cache if touched again, so nothing changes but the resident memory. Nothing is done for a
        source read into memory (its bytes exist nowhere else)."""
        if not self.mapped:
            return
        base = self.buf.ctypes.data         # the pages are the address's: a part may start mid-page
        lo = -(-(base + int(lo)) // _SYS_PAGE) * _SYS_PAGE - base
        hi = (base + min(int(hi), len(self.buf))) // _SYS_PAGE * _SYS_PAGE - base
        if hi > lo:
            release_mapped(self.buf, lo, hi)

    def part_bounds(self) -> np.ndarray:
        """Where each file's (each CPU's) pages start in the buffer, and where the last ends:
        the byte offsets, one more than there are parts."""
        first = np.flatnonzero(np.r_[True, self.page_file[1:] != self.page_file[:-1]])
        return np.r_[first, len(self.page_file)].astype(np.int64) * self.page_size

    def where(self, page: int, byte_in_page: int | None = None) -> str:
        f = self.files[int(self.page_file[page])]
        off = int(self.page_in_file[page]) * self.page_size
        if byte_in_page is not None:
            off += int(byte_in_page)
        return f"{f}: page {int(self.page_in_file[page])} (file offset {off})"

    @classmethod
    def from_buffers(cls, pages_by_cpu: dict[int, bytes | np.ndarray], page_size: int,
                     names: dict[int, str] | None = None) -> "PageSource":
        """Each CPU's pages copied into one new array, CPU after CPU."""
        cpus = sorted(pages_by_cpu)
        sizes = [len(pages_by_cpu[c]) for c in cpus]
        buf = np.empty(sum(sizes), np.uint8)
        o = 0
        for c, s in zip(cpus, sizes):
            buf[o:o + s] = np.frombuffer(memoryview(pages_by_cpu[c]).cast("B"), np.uint8)
            o += s
        return cls.from_flat(buf, dict(zip(cpus, sizes)), page_size, names)

    @classmethod
    def from_flat(cls, buf: np.ndarray, sizes_by_cpu: dict[int, int], page_size: int,
                  names: dict[int, str] | None = None) -> "PageSource":
        """The pages in ``buf`` as they are (no copy): each CPU's ``sizes_by_cpu`` bytes, CPU
        after CPU in the order of their numbers."""
        names = names or {}
        cpus = sorted(sizes_by_cpu)
        sizes = [sizes_by_cpu[c] for c in cpus]
        if sum(sizes) != len(buf):
            raise ValueError(f"{len(buf)} bytes of pages, the CPUs' sizes add up to {sum(sizes)}")
        files = [names.get(c, f"cpu{c}") for c in cpus]
        for c, s, f in zip(cpus, sizes, files):
            if s % page_size:
                raise TraceCorrupt(f"{f}: truncated: {s} bytes is not a whole number of "
                                   f"{page_size}-byte pages")
        counts = [s // page_size for s in sizes]
        return cls(buf, page_size, np.repeat(np.asarray(cpus, np.int64), counts),
                   np.repeat(np.arange(len(cpus)), counts), files,
                   np.concatenate([np.arange(k) for k in counts]) if counts
                   else np.zeros(0, np.int64))

    @classmethod
    def from_file_parts(cls, path: Path, parts_by_cpu: dict[int, tuple[int, int]], page_size: int,
                        names: dict[int, str] | None = None) -> "PageSource":
        """Each CPU's pages from its part (offset, size) of one file (a trace.dat's uncompressed
        CPU data): mapped back to back where the parts are page aligned, no copy and no fresh
        memory (:mod:`filemap`); read into one new array otherwise."""
        names = names or {}
        cpus = sorted(parts_by_cpu)
        offsets = [parts_by_cpu[c][0] for c in cpus]
        sizes = [parts_by_cpu[c][1] for c in cpus]
        files = [names.get(c, f"cpu{c}") for c in cpus]
        for s, f in zip(sizes, files):
            if s % page_size:
                raise TraceCorrupt(f"{f}: truncated: {s} bytes is not a whole number of "
                                   f"{page_size}-byte pages")
        buf = mapped = map_files([Path(path)] * len(cpus), sizes, offsets)
        if buf is None:
            buf = _read_files([Path(path)] * len(cpus), sizes, offsets)
            buf.flags.writeable = False     # as a mapped one: the compiled kernels' same types
        src = cls.from_flat(buf, dict(zip(cpus, sizes)), page_size, names)
        src.mapped = mapped is not None
        return src

    @classmethod
    def from_files(cls, files_by_cpu: dict[int, Path], page_size: int) -> "PageSource":
        cpus = sorted(files_by_cpu)
        sizes = []
        for c in cpus:
            p = Path(files_by_cpu[c])
            try:
                s = p.stat().st_size
            except OSError as e:
                raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
            if s % page_size:
                raise TraceCorrupt(f"{p}: truncated: {s} bytes is not a whole number of "
                                   f"{page_size}-byte pages")
            sizes.append(s)
        paths = [Path(files_by_cpu[c]) for c in cpus]
        buf = mapped = map_files(paths, sizes)   # no copy, no fresh memory; None: read them
        if buf is None:
            buf = _read_files(paths, sizes)
        counts = [s // page_size for s in sizes]
        src = cls(buf, page_size, np.repeat(np.asarray(cpus, np.int64), counts),
                  np.repeat(np.arange(len(cpus)), counts), [str(p) for p in paths],
                  np.concatenate([np.arange(k) for k in counts]) if counts
                  else np.zeros(0, np.int64))
        src.mapped = mapped is not None
        return src


def _read_files(paths: list[Path], sizes: list[int],
                offsets: list[int] | None = None) -> np.ndarray:
    """The files' bytes (``sizes`` of them from ``offsets``, default 0) back to back in a new
    array (where they cannot be mapped)."""
    buf = np.empty(sum(sizes), np.uint8)
    o = 0
    for p, s, at in zip(paths, sizes, offsets or [0] * len(paths)):
        try:
            with open(p, "rb", buffering=0) as fh:
                fh.seek(at)
                got = fh.readinto(memoryview(buf[o:o + s]))
                while got < s:
                    k = fh.readinto(memoryview(buf[o + got:o + s]))
                    if not k:
                        break
                    got += k
        except OSError as e:
            raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
        if got != s:
            raise TraceCorrupt(f"{p}: truncated while reading ({got} of {s} bytes)")
        o += s
    return buf


def read_uint(src: PageSource, byte_pos: np.ndarray, size: int) -> np.ndarray:
    """Unsigned little-endian integers of ``size`` bytes at arbitrary byte positions
    (int64 result)."""
    if size == 8 and not (byte_pos % 8).any():
        return src.view("<i8")[byte_pos >> 3]
    if size == 4 and not (byte_pos % 4).any():
        return src.view("<u4")[byte_pos >> 2].astype(np.int64)
    out = np.zeros(len(byte_pos), np.int64)
    for j in range(size):
        out |= src.buf[byte_pos + j].astype(np.int64) << (8 * j)
    return out


__all__ = ["PageSource", "read_uint"]
