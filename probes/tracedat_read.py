"""Read a trace-cmd ``trace.dat`` (file versions 6 and 7) into the canonical tables.

Only the container is parsed here; the per-CPU ring-buffer pages it holds are decoded by the
ring-buffer decoder (:mod:`harmony.probes.ringbuf_decode`, see :mod:`harmony.probes.ringbuf`),
with the formats stored in the file. Layouts (little endian; see trace-cmd.dat.v6(5),
trace-cmd.dat.v7(5))::

    v6  magic "6\\0" u8 endian u8 long_size u32 page_size
        "header_page\\0" u64 n <text>  "header_event\\0" u64 n <text>
        u32 n {u64 n <ftrace format>}   u32 n_sys {"sys\\0" u32 n {u64 n <format>}}
        u32 n <kallsyms>  u32 n <printk formats>  u64 n <cmdlines>  u32 n_cpus
        "options  \\0" {u16 id u32 n <data>} u16 0
        "flyrecord\\0" {u64 offset u64 size} * n_cpus [u64 n <trace_clock> if TRACECLOCK]
        BUFFER options (id 3): u64 offset of another "flyrecord\\0" block, "name\\0"
    v7  magic "7\\0" u8 endian u8 long_size u32 page_size "algo\\0" "version\\0" u64 options_offset
        sections: u16 id u16 flags(1 = compressed) u32 string id u64 size; compressed content is
        u32 csize u32 usize <data>. Options sections chain through DONE (u64 next offset); options
        16..21 give the offsets of the header, ftrace, event-format, kallsyms, printk and cmdlines
        sections; BUFFER (3): u64 section offset "name\\0" "clock\\0" u32 page_size u32 n_cpus
        {u32 cpu u64 offset u64 size}; compressed CPU data is u32 n_chunks
        {u32 csize u32 usize <data>}, its size counting the chunks only.

Everything that is wrong with a file raises :class:`~harmony.probes.base.TraceCorrupt` with a
one-line message naming it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap
import re
import struct
import threading
import zlib
from concurrent import futures
from pathlib import Path

import numpy as np

from harmony.core.jit import in_background, run_split, threads
from harmony.probes.base import Capture, TraceCorrupt
from harmony.probes.filemap import mapped_array, scratch_file
from harmony.probes.formats import (EventFormat, Field, FormatError, check_page_layout,
                                    parse_format, parse_header_event, parse_header_page)
from harmony.probes.ringbuf import capture_meta, lost_events
from harmony.probes.ringbuf_decode import decode_source, prefault_for_pages
from harmony.probes.ringbuf_fields import read_field
from harmony.probes.ringbuf_pages import PageSource
from harmony.probes.ringbuf_stream import SLAB_BYTES, PageSpace, StreamUnfit, decode_stream
from harmony.probes.ringbuf_walk import compiled, walk_pages

MAGIC = b"\x17\x08\x44tracing"

OPT_DONE, OPT_CPUSTAT, OPT_BUFFER, OPT_TRACECLOCK, OPT_UNAME = 0, 2, 3, 4, 5
OPT_CPUCOUNT, OPT_VERSION, OPT_TSC2NSEC = 8, 9, 14
OPT_HEADER_INFO, OPT_FTRACE_EVENTS, OPT_EVENT_FORMATS = 16, 17, 18
OPT_KALLSYMS, OPT_PRINTK, OPT_CMDLINES, OPT_BUFFER_TEXT = 19, 20, 21, 22
SECTION_STRINGS = 15


@dataclasses.dataclass
class Buffer:
    """One trace instance stored in the file ("" = the top-level buffer)."""

    name: str
    clock: str
    page_size: int
    cpus: dict[int, tuple[int, int]]          # cpu -> (file offset, size in the file)
    compressed: bool = False


@dataclasses.dataclass
class TraceDat:
    """What a trace.dat says about itself (everything but the decoded events)."""

    path: Path
    version: int
    long_size: int
    page_size: int
    compression: str                          # "none", "zstd", "zlib"
    header_page: str
    header_event: str
    format_texts: dict[int, tuple[str, str]]  # event id -> (system, format file text)
    cmdlines: dict[int, str]
    n_cpus: int
    buffers: list[Buffer]
    cpustats: dict[str, dict[int, dict]]      # buffer name -> cpu -> per_cpu/cpuN/stats as numbers
    uname: str = ""
    tracer_version: str = ""
    latency_only: bool = False
    tsc2nsec: bool = False    # holds trace-cmd's cycles-to-ns conversion (record --tsc2nsec)

    def formats_for(self, ids) -> dict[int, EventFormat]:
        """Parsed formats of the event ids ``ids`` (ids the file has no format for are left out)."""
        out = {}
        for i in ids:
            if int(i) not in self.format_texts:
                continue
            system, text = self.format_texts[int(i)]
            try:
                out[int(i)] = parse_format(text, system=system)
            except FormatError as exc:
                raise TraceCorrupt(f"{self.path}: bad format of event id {i} ({exc})") from None
        return out

    @property
    def kernel(self) -> str:
        parts = self.uname.split()
        return parts[2] if len(parts) >= 3 else ""


class FileReader:
    """Bounds-checked little-endian reads from the mapped file; every overrun names the file."""

    def __init__(self, path: Path, data):
        self.path, self.data, self.size = path, data, len(data)

    def need(self, at: int, n: int, what: str) -> None:
        if at < 0 or n < 0 or at + n > self.size:
            raise TraceCorrupt(f"{self.path}: truncated or corrupt: {what} at offset {at} "
                               f"({n} bytes) lies past the end of the file ({self.size} bytes)")

    def bytes(self, at: int, n: int, what: str) -> bytes:
        self.need(at, n, what)
        return bytes(self.data[at:at + n])

    def u(self, at: int, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        self.need(at, n, what)
        return struct.unpack_from("<" + fmt, self.data, at)[0]

    def cstr(self, at: int, what: str, limit: int = 4096) -> tuple[str, int]:
        """The NUL-terminated string at ``at`` and the offset after its NUL."""
        end = self.data.find(b"\0", at, min(self.size, at + limit))
        if end < 0:
            raise TraceCorrupt(f"{self.path}: truncated or corrupt: unterminated {what} "
                               f"at offset {at}")
        return bytes(self.data[at:end]).decode("utf-8", "replace"), end + 1


class _Blob(FileReader):
    """A decompressed section, read with the same checks; messages say which section."""

    def __init__(self, path: Path, data: bytes, section: str):
        super().__init__(path, data)
        self.section = section

    def need(self, at, n, what):
        if at < 0 or n < 0 or at + n > self.size:
            raise TraceCorrupt(f"{self.path}: corrupt {self.section} section: {what} at {at} "
                               f"({n} bytes) runs past its {self.size} bytes")


# --- decompression -----------------------------------------------------------------------------

_zstd = None


def _zstd_lib():
    """libzstd through ctypes (trace-cmd itself links it), or None."""
    global _zstd
    if _zstd is None:
        name = ctypes.util.find_library("zstd") or "libzstd.so.1"
        try:
            lib = ctypes.CDLL(name)
            lib.ZSTD_decompress.restype = ctypes.c_size_t
            lib.ZSTD_decompress.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                            ctypes.c_size_t)
            lib.ZSTD_isError.restype = ctypes.c_uint
            lib.ZSTD_isError.argtypes = (ctypes.c_size_t,)
            lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
            lib.ZSTD_getFrameContentSize.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
            lib.ZSTD_createDCtx.restype = ctypes.c_void_p
            lib.ZSTD_freeDCtx.argtypes = (ctypes.c_void_p,)
            lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
            lib.ZSTD_decompressDCtx.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_void_p, ctypes.c_size_t)
            _zstd = lib
        except (OSError, AttributeError):
            _zstd = False
    return _zstd or None


class _DCtx:
    """A libzstd decompression context, freed with this object: one a thread (:func:`_zstd_dctx`;
    ZSTD_decompress makes and frees one a call, and a trace.dat holds thousands of chunks of
    ~40 KB each)."""

    def __init__(self, lib):
        self.lib, self.ctx = lib, lib.ZSTD_createDCtx()
        if not self.ctx:
            raise MemoryError("ZSTD_createDCtx")

    def __del__(self):
        if getattr(self, "ctx", None):
            self.lib.ZSTD_freeDCtx(self.ctx)


_per_thread = threading.local()


def _zstd_dctx(lib) -> int:
    """This thread's decompression context, made on its first chunk and freed when the thread
    ends (its thread-local :class:`_DCtx` goes with it)."""
    held = getattr(_per_thread, "dctx", None)
    if held is None:
        held = _per_thread.dctx = _DCtx(lib)
    return held.ctx


def grown(buf: np.ndarray, used: int, need: int, most: int | None = None) -> np.ndarray:
    """``buf`` (its first ``used`` bytes kept) with room for ``need`` bytes: itself, or a copy
    half as large again (or ``need``, if more; ``most`` at most, if less)."""
    if need <= len(buf):
        return buf
    size = max(need, len(buf) + len(buf) // 2 + (1 << 20))
    out = np.empty(size if most is None else max(need, min(size, most)), np.uint8)
    out[:used] = buf[:used]
    return out


class _ZstdIn(ctypes.Structure):
    _fields_ = [("src", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


class _ZstdOut(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


class ZstdStream:
    """One zstd stream decompressed from its parts in order (perf record -z writes a stream cut
    into records): :meth:`feed` writes what a part holds into an array, straight from libzstd,
    growing it as needed. libzstd's streaming API through ctypes, as :func:`_decompress` uses its
    one-shot one; :class:`TraceCorrupt` naming ``path`` if libzstd is missing, refuses a part, or
    the output passes ``limit`` bytes."""

    def __init__(self, path: Path, what: str, limit: int):
        lib = _zstd_lib()
        if lib is None or not hasattr(lib, "ZSTD_decompressStream"):
            raise TraceCorrupt(f"{path}: {what} compressed with zstd, but libzstd is not "
                               "available here")
        lib.ZSTD_createDCtx.restype = ctypes.c_void_p
        lib.ZSTD_freeDCtx.argtypes = (ctypes.c_void_p,)
        lib.ZSTD_decompressStream.restype = ctypes.c_size_t
        lib.ZSTD_decompressStream.argtypes = (ctypes.c_void_p, ctypes.POINTER(_ZstdOut),
                                              ctypes.POINTER(_ZstdIn))
        self.lib, self.path, self.what, self.limit = lib, path, what, limit
        self.ctx = lib.ZSTD_createDCtx()
        if not self.ctx:
            raise MemoryError("ZSTD_createDCtx")
        self.hint = 0       # libzstd's last "next input size": 0 at a frame's end

    def feed(self, part, out: np.ndarray, used: int) -> tuple[np.ndarray, int]:
        """Decompress ``part`` (bytes, or a contiguous uint8 array) into ``out`` (uint8) from
        ``used`` on; returns (the array: ``out``, or a larger copy once it is full; the bytes
        used)."""
        src = np.frombuffer(part, np.uint8)       # bytes, or a contiguous slice of an array
        inb = _ZstdIn(src.ctypes.data, len(src), 0)
        while True:
            if used == len(out):
                out = grown(out, used, used + 1, most=self.limit + 1)
            outb = _ZstdOut(out.ctypes.data + used, len(out) - used, 0)
            r = self.lib.ZSTD_decompressStream(self.ctx, ctypes.byref(outb), ctypes.byref(inb))
            if self.lib.ZSTD_isError(r):
                raise TraceCorrupt(f"{self.path}: corrupt {self.what} (zstd refused them)")
            self.hint = r
            used += outb.pos
            if used > self.limit:
                raise TraceCorrupt(f"{self.path}: corrupt {self.what} (they decompress to more "
                                   f"than {self.limit} bytes)")
            if inb.pos >= inb.size and outb.pos < outb.size:
                return out, used

    @property
    def whole(self) -> bool:
        """Whether what was fed ends at a frame's end or a block's (perf flushes the stream
        after each chunk of records it compresses, and never ends the frame): else it was cut
        short inside a block, whose bytes are held back (libzstd then asks for the rest of the
        block, not for the next block's 3-byte header)."""
        return self.hint in (0, 3)

    def close(self) -> None:
        if self.ctx:
            self.lib.ZSTD_freeDCtx(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


#: the most a compressed block can expand: zstd's (an RLE block of 4 bytes holds up to 128 KiB)
#: and deflate's (1032:1) are below it. A size header claiming more than this many times the
#: compressed bytes cannot be true, and is refused before any memory is taken for it.
MAX_RATIO = 1 << 15
ZSTD_CONTENTSIZE_UNKNOWN = (1 << 64) - 1


def _check_ratio(path: Path, csize: int, usize: int, what: str) -> None:
    if usize > MAX_RATIO * csize + (128 << 10):
        raise TraceCorrupt(f"{path}: corrupt compressed {what} (header says {usize} bytes from "
                           f"{csize} compressed)")


def _decompress(path: Path, algo: str, data: bytes, usize: int, what: str,
                into: np.ndarray | None = None):
    """The ``usize`` bytes ``data`` decompresses to: a new bytearray, or written into ``into``
    (a writable uint8 array of ``usize`` bytes), which is returned."""
    _check_ratio(path, len(data), usize, what)
    if algo == "zlib":
        try:
            z = zlib.decompressobj()
            out = z.decompress(data, usize + 1)      # never more than the header says, and one
        except zlib.error as exc:
            raise TraceCorrupt(f"{path}: corrupt compressed {what} ({exc})") from None
        if into is not None and len(out) == usize:
            into[:] = np.frombuffer(out, np.uint8)
            out = into
    elif algo == "zstd":
        lib = _zstd_lib()
        if lib is None:
            raise TraceCorrupt(f"{path}: compressed with zstd but libzstd is not available here; "
                               "convert it with `trace-cmd convert --compression none`")
        out = bytearray(max(usize, 1)) if into is None else into
        to = (ctypes.c_char * len(out)).from_buffer(out) if into is None else into.ctypes.data
        # into at most usize bytes: a frame that says more, or holds more, is refused by libzstd
        n = lib.ZSTD_decompressDCtx(_zstd_dctx(lib), to, usize, data, len(data))
        del to                  # a ctypes view of the bytearray: it cannot be resized under one
        if lib.ZSTD_isError(n) or n != usize:
            frame = lib.ZSTD_getFrameContentSize(data, len(data))
            if frame != ZSTD_CONTENTSIZE_UNKNOWN and frame != usize:
                raise TraceCorrupt(f"{path}: corrupt compressed {what} (header says {usize} "
                                   "bytes, " + ("its zstd frame is damaged)" if frame > 1 << 62
                                                else f"its zstd frame {frame})"))
        if lib.ZSTD_isError(n):
            raise TraceCorrupt(f"{path}: corrupt compressed {what} (zstd refused it)")
        if into is None:
            del out[n:]
        elif n != usize:
            raise TraceCorrupt(f"{path}: corrupt compressed {what} ({n} bytes, header says "
                               f"{usize})")
    else:
        raise TraceCorrupt(f"{path}: compressed with {algo!r}, which Harmony cannot read; convert "
                           "it with `trace-cmd convert --compression none`")
    if len(out) != usize:
        raise TraceCorrupt(f"{path}: corrupt compressed {what} ({len(out)} bytes, "
                           f"header says {usize})")
    return out


# --- shared pieces of v6 and v7 ----------------------------------------------------------------

_ID_LINE = re.compile(r"^\s*ID:\s*(\d+)\s*$", re.M)


def _parse_formats(path: Path, r: FileReader, at: int, system: str | None,
                   into: dict[int, tuple[str, str]]) -> int:
    """u32 n {u64 size <format>} into ``into`` (id -> (system, text)); returns the offset after it.

    Only the ID is read here: trace-cmd stores the format of every event of the kernel (thousands)
    and only those the data uses are parsed, by :meth:`TraceDat.formats_for`."""
    n = r.u(at, "I", "format count")
    at += 4
    if n > 100000:
        raise TraceCorrupt(f"{path}: corrupt: {n} event formats at offset {at - 4}")
    for _ in range(n):
        size = r.u(at, "Q", "format size")
        text = r.bytes(at + 8, size, "event format").decode("utf-8", "replace")
        at += 8 + size
        m = _ID_LINE.search(text)
        if not m:
            raise TraceCorrupt(f"{path}: bad event format in the file (no ID line) "
                               f"at offset {at - size}")
        into[int(m.group(1))] = (system or "ftrace", text)
    return at


def _parse_systems(path: Path, r: FileReader, at: int, into: dict[int, tuple[str, str]]) -> int:
    n_sys = r.u(at, "I", "system count")
    at += 4
    if n_sys > 10000:
        raise TraceCorrupt(f"{path}: corrupt: {n_sys} event systems at offset {at - 4}")
    for _ in range(n_sys):
        system, at = r.cstr(at, "system name")
        at = _parse_formats(path, r, at, system, into)
    return at


def _parse_headers(path: Path, r: FileReader, at: int) -> tuple[str, str, int]:
    texts = []
    for label in (b"header_page\0", b"header_event\0"):
        if r.bytes(at, len(label), label.decode().strip("\0")) != label:
            raise TraceCorrupt(f"{path}: corrupt: expected {label[:-1].decode()!r} at offset {at}")
        at += len(label)
        size = r.u(at, "Q", "header size")
        texts.append(r.bytes(at + 8, size, label[:-1].decode()).decode("utf-8", "replace"))
        at += 8 + size
    return texts[0], texts[1], at


def _parse_cmdlines(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        pid, _, comm = line.strip().partition(" ")
        if pid.lstrip("-").isdigit():
            out[int(pid)] = comm
    return out


def _parse_stats(text: str) -> tuple[int | None, dict]:
    """A CPUSTAT option: (cpu, {key: number}); cpu None when it is a "Buffer: name" separator."""
    stats: dict = {}
    cpu = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "CPU":
            cpu = int(value) if value.isdigit() else None
        elif key:
            try:
                stats[key] = float(value) if "." in value else int(value.split()[0])
            except (ValueError, IndexError):
                stats[key] = value
    return cpu, stats


def _clock_name(text: str) -> str:
    m = re.search(r"\[(\S+)\]", text)
    return m.group(1) if m else text.strip().split()[0] if text.strip() else ""


class _Options:
    """Options shared by both versions, collected while walking them."""

    def __init__(self):
        self.cpustats: dict[str, dict[int, dict]] = {}
        self._stat_buffer = ""
        self.uname = ""
        self.tracer_version = ""
        self.trace_clock = ""
        self.cpu_count = None
        self.tsc2nsec = False
        self.raw: list[tuple[int, bytes]] = []

    def take(self, opt_id: int, data: bytes) -> None:
        self.raw.append((opt_id, data))
        text = data.split(b"\0", 1)[0].decode("utf-8", "replace")
        if opt_id == OPT_CPUSTAT:
            m = re.match(r"\s*Buffer:\s*(\S*)\s*$", text)
            if m:
                self._stat_buffer = m.group(1)
                return
            cpu, stats = _parse_stats(text)
            if cpu is not None:
                self.cpustats.setdefault(self._stat_buffer, {})[cpu] = stats
        elif opt_id == OPT_UNAME:
            self.uname = text
        elif opt_id == OPT_VERSION:
            self.tracer_version = text
        elif opt_id == OPT_TRACECLOCK:
            self.trace_clock = _clock_name(text)
        elif opt_id == OPT_TSC2NSEC:
            self.tsc2nsec = True
        elif opt_id == OPT_CPUCOUNT and len(data) >= 4:
            self.cpu_count = struct.unpack_from("<I", data)[0]


# --- version 6 ---------------------------------------------------------------------------------

def _flyrecord_v6(path: Path, r: FileReader, at: int, n_cpus: int, has_clock: bool,
                  what: str) -> tuple[dict[int, tuple[int, int]], str, int]:
    if r.bytes(at, 10, what) != b"flyrecord\0":
        raise TraceCorrupt(f"{path}: corrupt: expected 'flyrecord' for {what} at offset {at}")
    at += 10
    cpus = {}
    for c in range(n_cpus):
        off, size = r.u(at, "Q", f"{what} CPU table"), r.u(at + 8, "Q", f"{what} CPU table")
        at += 16
        if size:
            cpus[c] = (off, size)
    clock = ""
    if has_clock:
        size = r.u(at, "Q", "trace clock size")
        clock = _clock_name(r.bytes(at + 8, size, "trace clock").decode("utf-8", "replace"))
        at += 8 + size
    return cpus, clock, at


def _read_v6(path: Path, r: FileReader, long_size: int, page_size: int) -> TraceDat:
    hp, he, at = _parse_headers(path, r, 18)
    formats: dict[int, tuple[str, str]] = {}
    at = _parse_formats(path, r, at, None, formats)
    at = _parse_systems(path, r, at, formats)
    at += 4 + r.u(at, "I", "kallsyms size")
    at += 4 + r.u(at, "I", "printk formats size")
    size = r.u(at, "Q", "cmdlines size")
    cmdlines = _parse_cmdlines(r.bytes(at + 8, size, "cmdlines").decode("utf-8", "replace"))
    at += 8 + size
    n_cpus = r.u(at, "I", "CPU count")
    at += 4
    if n_cpus > 8192:
        raise TraceCorrupt(f"{path}: corrupt: {n_cpus} CPUs")
    opts = _Options()
    kind = r.bytes(at, 10, "section label")
    instances = []
    if kind == b"options  \0":
        at += 10
        while True:
            opt_id = r.u(at, "H", "option id")
            at += 2
            if opt_id == OPT_DONE:
                break
            size = r.u(at, "I", "option size")
            data = r.bytes(at + 4, size, f"option {opt_id}")
            at += 4 + size
            opts.take(opt_id, data)
            if opt_id == OPT_BUFFER:
                if size < 9:
                    raise TraceCorrupt(f"{path}: corrupt BUFFER option ({size} bytes)")
                name = data[8:].split(b"\0", 1)[0].decode("utf-8", "replace")
                instances.append((name, struct.unpack_from("<Q", data)[0]))
        kind = r.bytes(at, 10, "section label")
    has_clock = any(i == OPT_TRACECLOCK for i, _ in opts.raw)
    buffers = []
    latency = False
    if kind == b"latency  \0":
        latency = True
    elif kind == b"flyrecord\0":
        cpus, clock, at = _flyrecord_v6(path, r, at, n_cpus, has_clock, "top buffer")
        buffers.append(Buffer("", clock or opts.trace_clock, page_size, cpus))
    else:
        raise TraceCorrupt(f"{path}: corrupt: expected 'flyrecord' or 'latency' at offset {at}")
    for name, off in instances:
        cpus, clock, _ = _flyrecord_v6(path, r, off, n_cpus, has_clock, f"buffer {name!r}")
        buffers.append(Buffer(name, clock or opts.trace_clock, page_size, cpus))
    return TraceDat(path=path, version=6, long_size=long_size, page_size=page_size,
                    compression="none", header_page=hp, header_event=he, format_texts=formats,
                    cmdlines=cmdlines, n_cpus=opts.cpu_count or n_cpus, buffers=buffers,
                    cpustats=opts.cpustats, uname=opts.uname, tracer_version=opts.tracer_version,
                    latency_only=latency, tsc2nsec=opts.tsc2nsec)


def read_tracing_data(path: Path, data: bytes) -> TraceDat:
    """The tracing data a perf.data holds in its HEADER_TRACING_DATA feature section (``data``,
    the section's bytes): perf writes the same layout as a v6 trace.dat's start, up to its
    cmdlines (tools/perf/util/trace-event-info.c): magic, version text ("0.6"), endian, long size,
    page size, the ring-buffer headers, the ftrace and event formats, kallsyms, printk formats
    and (from 0.6 on) the saved cmdlines. Returned as a :class:`TraceDat` with no buffers; a bad
    section raises TraceCorrupt naming ``path``."""
    r = _Blob(path, data, "tracing data")
    if r.bytes(0, min(10, r.size), "magic") != MAGIC:
        raise TraceCorrupt(f"{path}: corrupt tracing data section (bad magic)")
    version, at = r.cstr(10, "tracing data version", limit=16)
    endian, long_size = r.u(at, "B", "endian flag"), r.u(at + 1, "B", "long size")
    page_size = r.u(at + 2, "I", "page size")
    if endian != 0:
        raise TraceCorrupt(f"{path}: big-endian tracing data is not supported")
    if long_size not in (4, 8) or page_size <= 0 or page_size % 8 or page_size > (1 << 24):
        raise TraceCorrupt(f"{path}: corrupt tracing data (long size {long_size}, page size "
                           f"{page_size})")
    hp, he, at = _parse_headers(path, r, at + 6)
    formats: dict[int, tuple[str, str]] = {}
    at = _parse_formats(path, r, at, None, formats)
    at = _parse_systems(path, r, at, formats)
    at += 4 + r.u(at, "I", "kallsyms size")
    at += 4 + r.u(at, "I", "printk formats size")
    cmdlines: dict[int, str] = {}
    if at + 8 <= r.size:            # version 0.6 and later
        size = r.u(at, "Q", "cmdlines size")
        cmdlines = _parse_cmdlines(r.bytes(at + 8, size, "cmdlines").decode("utf-8", "replace"))
    return TraceDat(path=path, version=6, long_size=long_size, page_size=page_size,
                    compression="none", header_page=hp, header_event=he, format_texts=formats,
                    cmdlines=cmdlines, n_cpus=0, buffers=[], cpustats={}, tracer_version=version)


# --- version 7 ---------------------------------------------------------------------------------

def _section(path: Path, r: FileReader, at: int, algo: str,
             what: str) -> tuple[int, FileReader, int]:
    """(section id, reader over its content, offset after the header) of the section at ``at``."""
    sid = r.u(at, "H", f"{what} section header")
    flags = r.u(at + 2, "H", f"{what} section header")
    size = r.u(at + 8, "Q", f"{what} section header")
    start = at + 16
    r.need(start, size, f"{what} section")
    if flags & 1:
        csize, usize = r.u(start, "I", what), r.u(start + 4, "I", what)
        if csize + 8 > size:
            raise TraceCorrupt(f"{path}: corrupt {what} section (compressed size {csize} > {size})")
        data = _decompress(path, algo, r.bytes(start + 8, csize, what), usize, f"{what} section")
        return sid, _Blob(path, data, what), start
    return sid, _Blob(path, r.bytes(start, size, what), what), start


def _check_strings(r: FileReader, at: int) -> None:
    """trace-cmd appends the strings sections after the last options section and nothing points to
    them: walk them so that a file cut short there is still reported as truncated."""
    while at < r.size:
        sid = r.u(at, "H", "strings section header")
        if sid != SECTION_STRINGS:
            return
        size = r.u(at + 8, "Q", "strings section header")
        r.need(at + 16, size, "strings section")
        at += 16 + size


def _read_v7(path: Path, r: FileReader, long_size: int, page_size: int) -> TraceDat:
    algo, at = r.cstr(18, "compression name")
    _algo_version, at = r.cstr(at, "compression version")
    next_opts = r.u(at, "Q", "options offset")
    last_end = at + 8
    opts = _Options()
    sections: dict[int, int] = {}
    buffers: list[Buffer] = []
    seen = set()
    latency = False
    while next_opts:
        if next_opts in seen:
            raise TraceCorrupt(f"{path}: corrupt: options sections loop at offset {next_opts}")
        seen.add(next_opts)
        sid, blob, start = _section(path, r, next_opts, algo, "options")
        last_end = start + r.u(next_opts + 8, "Q", "options section size")
        if sid != 0:
            raise TraceCorrupt(f"{path}: corrupt: section at offset {next_opts} is not an options "
                               f"section (id {sid})")
        next_opts, o = 0, 0
        while o < blob.size:
            opt_id, size = blob.u(o, "H", "option id"), blob.u(o + 2, "I", "option size")
            data = blob.bytes(o + 6, size, f"option {opt_id}")
            o += 6 + size
            if opt_id == OPT_DONE:
                next_opts = struct.unpack_from("<Q", data)[0] if size >= 8 else 0
                break
            opts.take(opt_id, data)
            if OPT_HEADER_INFO <= opt_id <= OPT_CMDLINES and size >= 8:
                sections[opt_id] = struct.unpack_from("<Q", data)[0]
            elif opt_id == OPT_BUFFER_TEXT:
                latency = True
            elif opt_id == OPT_BUFFER:
                buffers.append(_buffer_v7(path, data, algo))
    _check_strings(r, last_end)
    if OPT_HEADER_INFO not in sections:
        raise TraceCorrupt(f"{path}: corrupt: no HEADER_INFO section (ring-buffer layout unknown)")
    _, blob, _ = _section(path, r, sections[OPT_HEADER_INFO], algo, "header info")
    hp, he, _ = _parse_headers(path, blob, 0)
    formats: dict[int, tuple[str, str]] = {}
    if OPT_FTRACE_EVENTS in sections:
        _, blob, _ = _section(path, r, sections[OPT_FTRACE_EVENTS], algo, "ftrace formats")
        _parse_formats(path, blob, 0, None, formats)
    if OPT_EVENT_FORMATS in sections:
        _, blob, _ = _section(path, r, sections[OPT_EVENT_FORMATS], algo, "event formats")
        _parse_systems(path, blob, 0, formats)
    cmdlines: dict[int, str] = {}
    if OPT_CMDLINES in sections:
        _, blob, _ = _section(path, r, sections[OPT_CMDLINES], algo, "cmdlines")
        size = blob.u(0, "Q", "cmdlines size")
        cmdlines = _parse_cmdlines(blob.bytes(8, size, "cmdlines").decode("utf-8", "replace"))
    for b in buffers:
        if not b.page_size:
            b.page_size = page_size
    n_cpus = opts.cpu_count or max((max(b.cpus, default=-1) + 1 for b in buffers), default=0)
    return TraceDat(path=path, version=7, long_size=long_size, page_size=page_size,
                    compression=algo, header_page=hp, header_event=he, format_texts=formats,
                    cmdlines=cmdlines, n_cpus=n_cpus, buffers=buffers, cpustats=opts.cpustats,
                    uname=opts.uname, tracer_version=opts.tracer_version,
                    latency_only=latency and not buffers, tsc2nsec=opts.tsc2nsec)


def _buffer_v7(path: Path, data: bytes, algo: str) -> Buffer:
    b = _Blob(path, data, "BUFFER option")
    name, at = b.cstr(8, "buffer name")
    clock, at = b.cstr(at, "buffer clock")
    page_size, n = b.u(at, "I", "page size"), b.u(at + 4, "I", "CPU count")
    at += 8
    if n > 8192:
        raise TraceCorrupt(f"{path}: corrupt BUFFER option ({n} CPUs)")
    cpus = {}
    for _ in range(n):
        cpu, off, size = b.u(at, "I", "cpu"), b.u(at + 4, "Q", "offset"), b.u(at + 12, "Q", "size")
        at += 20
        if size:
            cpus[cpu] = (off, size)
    return Buffer(name, clock, page_size, cpus, compressed=algo != "none")


# --- entry points ------------------------------------------------------------------------------

def map_file(path: Path):
    """``path`` mapped read-only (``b""`` for an empty file, which cannot be mapped: the caller
    says what it is not); TraceCorrupt naming it if it cannot be read."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise TraceCorrupt(f"{path}: cannot read ({exc.strerror or exc})") from None
    with f:
        try:
            if Path(path).stat().st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise TraceCorrupt(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") \
                from None


def _open(path: Path):
    data = map_file(path)
    if not len(data):
        raise TraceCorrupt(f"{path}: empty file, not a trace.dat")
    return data


def is_tracedat(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_tracedat(path: Path) -> TraceDat:
    """Parse the metadata of ``path`` (no event data is decoded)."""
    path = Path(path)
    data = _open(path)
    r = FileReader(path, data)
    if r.bytes(0, min(10, r.size), "magic") != MAGIC:
        raise TraceCorrupt(f"{path}: not a trace.dat file (bad magic)")
    version_text, at = r.cstr(10, "file version", limit=8)
    if at != 12 or not version_text.isdigit():
        raise TraceCorrupt(f"{path}: corrupt: bad file version {version_text!r}")
    version = int(version_text)
    endian, long_size = r.u(12, "B", "endian flag"), r.u(13, "B", "long size")
    page_size = r.u(14, "I", "page size")
    if endian != 0:
        raise TraceCorrupt(f"{path}: big-endian trace.dat files are not supported")
    if long_size not in (4, 8) or page_size <= 0 or page_size % 8 or page_size > (1 << 24):
        raise TraceCorrupt(f"{path}: corrupt header (long size {long_size}, page size {page_size})")
    if version == 6:
        return _read_v6(path, r, long_size, page_size)
    if version == 7:
        return _read_v7(path, r, long_size, page_size)
    raise TraceCorrupt(f"{path}: trace.dat version {version} is not supported (6 and 7 are)")


def choose_buffer(td: TraceDat, name: str | None) -> Buffer:
    """The buffer ``name``; by default the only buffer that holds data."""
    if name is not None:
        for b in td.buffers:
            if b.name == name:
                return b
        have = ", ".join(repr(b.name) for b in td.buffers) or "none"
        raise TraceCorrupt(f"{td.path}: has no buffer {name!r} (buffers: {have})")
    full = [b for b in td.buffers if b.cpus]
    if td.latency_only or not td.buffers:
        raise TraceCorrupt(f"{td.path}: holds a latency (text) trace, "
                           "not flyrecord ring-buffer data")
    if not full:
        raise TraceCorrupt(f"{td.path}: holds no event data (every CPU buffer is empty)")
    if len(full) > 1:
        names = ", ".join("top" if not b.name else repr(b.name) for b in full)
        raise TraceCorrupt(f"{td.path}: holds several buffers with data ({names}); pick one with "
                           "--buffer")
    return full[0]


def _chunks(r: FileReader, cpu: int, off: int, size: int) -> list[tuple[int, int, int]]:
    """(offset of its compressed bytes, compressed size, decompressed size) of each chunk of a
    compressed CPU's data: from the chunks' headers, nothing decompressed."""
    what = f"CPU {cpu} data"
    # the size trace-cmd stores counts the chunks, not the chunk count before them
    n = r.u(off, "I", f"{what} chunk count")
    at, end, out = off + 4, off + 4 + size, []
    r.need(off, 4 + size, what)
    for k in range(n):
        csize, usize = r.u(at, "I", what), r.u(at + 4, "I", what)
        if at + 8 + csize > end:
            raise TraceCorrupt(f"{r.path}: corrupt {what}: chunk {k} runs past the CPU's data")
        _check_ratio(r.path, csize, usize, f"{what} chunk {k}")
        out.append((at + 8, csize, usize))
        at += 8 + csize
    return out


Chunks = tuple[FileReader, dict[int, list[tuple[int, int, int]]]]


def buffer_chunks(td: TraceDat, buf: Buffer) -> Chunks:
    """(a reader of the file; cpu -> :func:`_chunks` of its data) of a compressed buffer, CPU by
    CPU in the order of their numbers: the chunks' headers, walked once for
    :func:`decompressed_sizes` and :func:`decompressed_pages`."""
    r = FileReader(td.path, _open(td.path))
    return r, {cpu: _chunks(r, cpu, off, size) for cpu, (off, size) in sorted(buf.cpus.items())}


def decompressed_sizes(td: TraceDat, buf: Buffer, chunks: Chunks | None = None) -> dict[int, int]:
    """cpu -> bytes of ring-buffer pages its data holds (decompressed, if it is compressed), read
    from the chunks' headers (``chunks``: :func:`buffer_chunks`'s, if walked already): what an
    import will hold, known before anything is decompressed."""
    if not buf.compressed:
        return {cpu: size for cpu, (_, size) in buf.cpus.items()}
    _, by_cpu = chunks or buffer_chunks(td, buf)
    return {cpu: sum(u for *_, u in parts) for cpu, parts in by_cpu.items()}


#: the decompressed pages are written to a scratch file this many bytes at a time (at least)
SCRATCH_WRITE = 4 << 20
#: and only from this size of pages on: at 520 MB (10 M events of a ping-pong) the import's peak
#: was 0.83x, its time 1.12x (bench/README.md): read from the page cache, every page is faulted
#: in by both passes of the decode, where pages decompressed into memory are already mapped.
#: From the size the compiled decoder takes on (below, the numpy decoder holds far more than
#: the pages): the pages of a 4 M-event trace-cmd record (184 MB) held in memory were a third of
#: the import's data at its peak (issue 48: 150 bytes an event from 4 M events)
SCRATCH_FROM = 64 << 20


def decompressed_pages(td: TraceDat, buf: Buffer,
                       chunks: Chunks | None = None) -> tuple[np.ndarray, dict[int, int], bool]:
    """(every CPU's ring-buffer pages of a compressed buffer, decompressed, CPU after CPU, into
    one array; cpu -> its bytes; whether the array maps a scratch file). The pages are as large
    as an uncompressed file's (520 MB at 10 M events): from :data:`SCRATCH_FROM` bytes on they are
    written to a scratch file (:func:`filemap.scratch_file`), a few MB at a time, and mapped, so
    that the decode reads them as an uncompressed file's, from the page cache, releasing them
    behind it; below that, or where no scratch file would save memory, decompressed straight
    into memory, each chunk into its place. ``chunks``: :func:`buffer_chunks`'s, if walked
    already."""
    path = td.path
    r, chunks = chunks or buffer_chunks(td, buf)
    sizes = decompressed_sizes(td, buf, (r, chunks))
    total = sum(sizes.values())
    f = scratch_file(total) if total >= SCRATCH_FROM else None
    if f is not None:
        try:
            with f:
                largest = max((u for parts in chunks.values() for *_, u in parts), default=0)
                staging = [np.empty(max(SCRATCH_WRITE, largest), np.uint8) for _ in range(2)]
                _fill(td, r, chunks, staging[0], f.write, staging[1])
                return mapped_array(f, total), sizes, True
        except (OSError, ValueError):   # not written or not mapped (a full disk): into memory
            pass
    try:
        pages = np.empty(total, np.uint8)
    except MemoryError:
        raise TraceCorrupt(f"{path}: its pages decompress to {total / 2**30:.1f} GiB, more than "
                           "this host can hold") from None
    _fill(td, r, chunks, pages)
    return pages, sizes, False


def _fill(td: TraceDat, r: FileReader, chunks: dict[int, list[tuple[int, int, int]]],
          out: np.ndarray, flush=None, spare: np.ndarray | None = None) -> int:
    """Decompress every chunk, in order, into ``out``, each into its place; the bytes of ``out``
    filled. With ``flush``, every byte is handed to it instead (``spare``: an array as large as
    ``out``, made if not given): whenever the next chunk would not fit, ``flush`` takes what was
    decompressed so far on a pool thread while the next chunks fill the other array (a scratch
    file's writes beside the decompression, not after it); returns 0. The chunks of each fill
    are decompressed on threads (libzstd and zlib let go of the GIL)."""
    at, batch, writing = 0, [], None
    if flush is not None and spare is None:
        spare = np.empty_like(out)

    def hand_over(done: np.ndarray, n: int):
        nonlocal writing
        if writing is not None:
            writing.result()            # the array it writes is the one filled next
        writing = in_background(flush, done[:n])

    try:
        for cpu, parts in chunks.items():
            what = f"CPU {cpu} data"
            for k, (start, csize, usize) in enumerate(parts):
                if flush is not None and at + usize > len(out):
                    _decompress_batch(td, r, batch, out)
                    hand_over(out, at)
                    out, spare = spare, out
                    at, batch = 0, []
                batch.append((at, start, csize, usize, what, k))
                at += usize
        _decompress_batch(td, r, batch, out)
        if flush is None:
            return at
        hand_over(out, at)
        writing.result()
        return 0
    finally:
        if writing is not None:
            futures.wait([writing])     # never a write left running behind an error


#: a batch of chunks is decompressed on threads from this many bytes on (a thread's start and
#: hand-over cost ~0.05 ms; a 40 KiB chunk decompresses in ~0.03 ms)
THREADED_DECOMPRESS = 4 << 20


def _decompress_batch(td: TraceDat, r: FileReader, batch: list, out: np.ndarray) -> None:
    """Decompress ``batch``'s chunks ((offset in ``out``, file offset, compressed size, size,
    what, chunk number)) into their places, the batch cut into one part per thread by their
    bytes; the first bad chunk, in order, raises."""
    def part(lo: int, hi: int, _k: int) -> None:
        for at, start, csize, usize, what, k in batch[lo:hi]:
            _decompress(td.path, td.compression, r.bytes(start, csize, what), usize,
                        f"{what} chunk {k}", into=out[at:at + usize])

    total = sum(b[3] for b in batch)
    n = threads() if total >= THREADED_DECOMPRESS else 1
    ends = np.cumsum([b[3] for b in batch])
    cuts = [0] + [int(np.searchsorted(ends, total * i // n)) for i in range(1, n)] + [len(batch)]
    ranges = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a] or [(0, 0)]
    run_split(part, ranges)


def _file_pages(td: TraceDat, buf: Buffer, names: dict[int, str]) -> PageSource:
    """The file's own pages of an uncompressed buffer, mapped (read where they cannot be); a
    CPU's data running past the file's end is TraceCorrupt naming it."""
    r = FileReader(td.path, _open(td.path))
    for cpu, (off, size) in buf.cpus.items():
        r.need(off, size, f"CPU {cpu} data")
    return PageSource.from_file_parts(td.path, buf.cpus, buf.page_size, names)


def _stream_space(td: TraceDat, buf: Buffer, chunks: Chunks | None, page_size: int,
                  names: dict[int, str]):
    """(the pages of ``buf`` as a :class:`ringbuf_stream.PageSpace`, load, done, their bytes) for
    the streamed decode: decompressed a slab of chunks at a time into a buffer each part keeps,
    or the file's own pages mapped (read into memory where they cannot be) and released behind
    it."""
    cpus = sorted(buf.cpus)
    if chunks is not None:
        r, by_cpu = chunks
        sizes = [sum(u for *_, u in by_cpu[c]) for c in cpus]
    else:
        sizes = [buf.cpus[c][1] for c in cpus]
    files = [names[c] for c in cpus]
    if any(size % page_size for size in sizes):     # corrupt: the whole decode says how
        raise StreamUnfit("a CPU's data is no whole number of pages")
    counts = [size // page_size for size in sizes]
    base = np.cumsum([0] + counts)
    page_cpu = np.repeat(np.asarray(cpus, np.int64), counts)
    page_file = np.repeat(np.arange(len(cpus)), counts)
    page_in_file = (np.concatenate([np.arange(k) for k in counts]) if counts
                    else np.zeros(0, np.int64))
    total = int(base[-1]) * page_size
    if chunks is None:
        src = _file_pages(td, buf, names)
        space = PageSpace(page_size, page_cpu, page_file, page_in_file, files,
                          np.arange(0, int(base[-1]) + 1, dtype=np.int64))
        return (space, lambda a, b, _k: src.buf[a * page_size:b * page_size],
                lambda a, b: src.release(a * page_size, b * page_size), total)
    # each chunk: (its first byte in the pages laid end to end, file offset, compressed size,
    # size, what, its number)
    table, cut = [], [0]
    for c, first in zip(cpus, base[:-1]):
        at = int(first) * page_size
        for k, (start, csize, usize) in enumerate(by_cpu[c]):
            table.append((at, start, csize, usize, f"CPU {c} data", k))
            at += usize
            if (at - int(first) * page_size) % page_size == 0:
                cut.append(at // page_size)
    starts = np.asarray([t[0] for t in table], np.int64)
    space = PageSpace(page_size, page_cpu, page_file, page_in_file, files,
                      np.unique(np.asarray(cut + [int(base[-1])], np.int64)))
    held: dict[int, np.ndarray] = {}        # part -> the buffer it decompresses into

    def load(a: int, b: int, k: int) -> np.ndarray:
        lo, hi = a * page_size, b * page_size
        out = held.get(k)
        if out is None or len(out) < hi - lo:
            out = held[k] = np.empty(max(hi - lo, SLAB_BYTES), np.uint8)
        for at, start, csize, usize, what, n in table[int(np.searchsorted(starts, lo)):
                                                      int(np.searchsorted(starts, hi))]:
            _decompress(td.path, td.compression, r.bytes(start, csize, what), usize,
                        f"{what} chunk {n}", into=out[at - lo:at - lo + usize])
        pages = out[:hi - lo]
        pages.flags.writeable = False       # as a mapped file's: the compiled kernels' same types
        return pages

    return space, load, lambda a, b: None, total


def decode_tracedat(path: Path, buffer: str | None = None) -> tuple[Capture, TraceDat]:
    """Decode the events of one buffer of ``path`` into a :class:`Capture` (plus the file facts).

    ``meta`` has the keys every probe fills (see :class:`~harmony.probes.base.Capture`; its
    ``events_enabled`` lists the events the data holds: trace-cmd stores the format of every event
    of the kernel, not which were enabled) and ``file_version``, ``compression``, ``buffer``,
    ``uname``, ``tracer_version``, ``cmdlines`` (pid -> comm as the file saved them). Lost events:
    per CPU, the larger of the count the pages' missed-events flags store and the CPUSTAT
    ``overrun``, plus ``commit overrun`` and ``dropped events``; -1 when a page says events were
    lost and neither it nor the statistics say how many.

    With the compiled kernels, the pages are decoded a slab at a time
    (:func:`ringbuf_stream.decode_stream`), never held whole; else, or where that does not
    apply, all at once (:func:`ringbuf_decode.decode_source`).
    """
    path = Path(path)
    td = read_tracedat(path)
    buf = choose_buffer(td, buffer)
    chunks = buffer_chunks(td, buf) if buf.compressed else None
    size = sum(decompressed_sizes(td, buf, chunks).values())
    try:
        hp = parse_header_page(td.header_page)
        parse_header_event(td.header_event)
        check_page_layout(hp, buf.page_size)
    except FormatError as exc:
        raise TraceCorrupt(f"{path}: bad ring-buffer header description ({exc})") from None
    names = {c: f"{path} (CPU {c} data)" for c in buf.cpus}
    # where the type id lives in a record is read from any one format (parse_format insists it
    # has common_type)
    sample = td.formats_for(list(td.format_texts)[:1])
    common_type = (next(iter(sample.values())).field("common_type") if sample
                   else Field("common_type", "unsigned short", 0, 2, False))
    dec = None
    jit = compiled(size)
    if jit is not None and common_type.size <= 2:
        # no heap memory faulted in ahead: the stream's columns are mappings of their own, as
        # long as the most events the pages could hold (with 0.75 a byte of pages faulted in,
        # 5.12 M events of a trace-cmd recording peaked at 682 MB in the decode, 539 without,
        # in the same time)
        try:
            space, load, done, total = _stream_space(td, buf, chunks, buf.page_size, names)
            dec, formats = decode_stream(jit, space, hp, common_type, list(td.format_texts),
                                         td.formats_for, load, done)
        except StreamUnfit:
            dec = None
    if dec is None:
        prefault_for_pages(size)
        dec, formats, total = _decode_whole(td, buf, chunks, hp, names, common_type)
    return _capture(td, buf, dec, formats, total), td


def _decode_whole(td: TraceDat, buf: Buffer, chunks: Chunks | None, hp, names, common_type):
    """(Decoded, the formats of the records, bytes of pages) of ``buf``'s pages held whole:
    decompressed into memory or a scratch file, or the file's own pages mapped."""
    if buf.compressed:
        pages, sizes, scratch = decompressed_pages(td, buf, chunks)
        pages.flags.writeable = False       # as a mapped file's: the compiled kernels' same types
        src = PageSource.from_flat(pages, sizes, buf.page_size, names)
        src.mapped = scratch                # released behind the decode as a file's pages are
        del pages
    else:   # the file's own pages, mapped: no copy (540 MB at 10 M events)
        src = _file_pages(td, buf, names)
    # one walk for both passes: the type ids of the records (the compiled walk reads them as it
    # goes, through an identity look-up: type id -> itself), then their decoding
    identity = (np.arange(1 << (8 * common_type.size), dtype=np.int32)
                if common_type.size <= 2 else None)
    rec = walk_pages(src, hp, common_type, identity)
    if rec.code is not None:
        used = np.flatnonzero(np.bincount(rec.code[rec.code >= 0], minlength=1))
    else:
        ok = rec.length >= common_type.offset + common_type.size
        used = np.unique(read_field(src, rec.pos[ok], common_type)) if ok.any() else []
    print_ids = [i for i, (sys_, t) in td.format_texts.items()
                 if sys_ == "ftrace" and re.search(r"^name:\s*print\s*$", t, re.M)]
    formats = td.formats_for([int(i) for i in used] + print_ids)
    ctype = next((f.field("common_type") for f in formats.values()), None)
    same = ctype is not None and ((ctype.offset, ctype.size)
                                  == (common_type.offset, common_type.size))
    dec = decode_source(src, formats, hp, walked=rec if same else None)
    return dec, formats, len(src.buf)


def _capture(td: TraceDat, buf: Buffer, dec, formats: dict[int, EventFormat],
             total: int) -> Capture:
    notes = list(dec.notes)
    stats = td.cpustats.get(buf.name, {})
    lost_by_cpu, loss_notes = lost_events(sorted(set(buf.cpus) | set(stats)), dec, stats)
    notes += loss_notes
    if not stats:
        notes.append("the file has no per-CPU statistics (CPUSTAT): lost events are known only "
                     "from the pages' missed-events flags")
    enabled = sorted({f"{f.system}/{f.name}" for f in formats.values() if f.system != "ftrace"})
    meta = capture_meta(dec, total, "trace.dat", buf.clock or "unknown", enabled, lost_by_cpu,
                        buf.page_size, notes)
    meta.update({
        "file_version": td.version,
        "compression": td.compression,
        "buffer": buf.name,
        "uname": td.uname,
        "kernel": td.kernel,
        "tracer_version": td.tracer_version,
        "cpus": sorted(buf.cpus),
        "n_cpus": td.n_cpus,
    })
    return Capture(events=dec.events, markers=dec.markers, meta=meta)
