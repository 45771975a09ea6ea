"""Read a perf.data file directly, without ``perf script``: the file's header, its events'
attributes, the records of its data section, and the tracepoints' RAW payloads decoded with the
formats the file holds, into the canonical events table (:func:`read_perf_data`).

Layouts (little endian; the kernel tree's tools/perf/Documentation/perf.data-file-format.txt and
include/uapi/linux/perf_event.h)::

    header   "PERFILE2" u64 size u64 attr_size {u64 offset u64 size} attrs, data, event_types
             u64 flags[4]: a bit per feature section; their {u64 offset u64 size} table follows
             the data section, in bit order
    attrs    attr_size bytes each: struct perf_event_attr, then {u64 offset u64 size} of its
             sample ids (u64 each)
    data     records: u32 type u16 misc u16 size, then size - 8 bytes. A PERF_RECORD_SAMPLE (9)
             holds the fields its attr's sample_type asks for, in this order: IDENTIFIER u64,
             IP u64, TID u32 pid u32 tid, TIME u64, ADDR u64, ID u64, STREAM_ID u64, CPU u32 cpu
             u32 res, PERIOD u64, READ (read_format's values; GROUP: u64 nr first), CALLCHAIN
             u64 nr u64 ips[nr], RAW u32 size u8 data[size] (a tracepoint's payload, as in the
             ftrace ring buffer), then the rest (branch stack, registers, ...), not read.
             Other kernel records (LOST 2: u64 id u64 lost; LOST_SAMPLES 13: u64 lost) end with
             the sample_id trailer when sample_id_all is set: TID, TIME, ID, STREAM_ID, CPU,
             IDENTIFIER, as asked. perf's own records (type >= 64) have none.
    features TRACING_DATA (1): the tracing data perf writes, a v6 trace.dat's start (formats of
             the recorded tracepoints; :func:`harmony.probes.tracedat_read.read_tracing_data`),
             OSRELEASE (4), NRCPUS (7), EVENT_DESC (12: each attr again, with its name and ids)

The data section is read a slab at a time (:data:`SLAB_BYTES` of whole records, read into memory
the reader keeps: the file is never mapped nor read whole). In each slab the records are found by
one walk (a compiled kernel for large files, :mod:`harmony.probes.perf_read_jit`; a Python loop
over the record headers below that), every sample's event and fields then read in one compiled
pass over the records (numpy's passes at positions computed per attr where the kernels are not
used, and for a slab that pass finds damaged, whose error they name), and the RAW payloads
decoded by the ring-buffer decoder (:func:`harmony.probes.ringbuf_decode.decode_source`) with
the formats from the file: the same column rules as a trace.dat's. The samples are put in time
order, the events of one instant by CPU, each CPU's in file order (:func:`by_time_then_cpu`):
the order of every Harmony events table (``perf script`` prints such ties in file order); the
slabs' events are written one after the other, and put in that order where two slabs overlap in
time (:class:`_Rows`). Two slabs are decoded at once where two CPUs may run the reader: every
other one on the side thread, the next on the calling thread meanwhile.

Everything wrong with a file raises :class:`~harmony.probes.base.TraceCorrupt`, one line naming it.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from array import array
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.core.jit import on_side_thread, on_the_side_thread, threads, use_compiled
from harmony.probes.filemap import anonymous_array, drop_pages
from harmony.probes.formats import EventFormat, FormatError, parse_header_page
from harmony.probes.ringbuf_decode import decode_source, event_label, prefault_for_pages
from harmony.probes.ringbuf_pages import PageSource, read_uint
from harmony.probes.ringbuf_walk import JIT_MIN_BYTES, Records
from harmony.probes.schema import CAUSE_EVENTS, COLUMNS, SCHED_EVENTS, make_events
from harmony.probes.tracedat_read import (
    MAX_RATIO,
    FileReader,
    TraceDat,
    ZstdStream,
    grown,
    map_file,
    read_tracing_data,
)

PERF_MAGIC = b"PERFILE2"
_HEADER = struct.Struct("<8sQQ QQ QQ QQ 4Q")  # magic size attr_size attrs data event_types features
#: perf_event_attr's first fields: type size config sample_period sample_type read_format flags
_ATTR = struct.Struct("<IIQQQQQ")
_ATTR_CLOCKID = 92            # s32 clockid, in attrs of 96 bytes and more (PERF_ATTR_SIZE_VER1+)
ATTR_FLAG_SAMPLE_ID_ALL = 1 << 18
ATTR_FLAG_USE_CLOCKID = 1 << 25
PERF_TYPE_TRACEPOINT = 2

# sample_type bits (enum perf_event_sample_format), the ones before RAW
SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR, SAMPLE_READ = \
    1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4
SAMPLE_CALLCHAIN, SAMPLE_ID, SAMPLE_CPU, SAMPLE_PERIOD = 1 << 5, 1 << 6, 1 << 7, 1 << 8
SAMPLE_STREAM_ID, SAMPLE_RAW, SAMPLE_IDENTIFIER = 1 << 9, 1 << 10, 1 << 16
#: the fields of a sample before its read values, call chain and RAW payload, 8 bytes each in
#: this order where its sample_type has them; those Harmony reads
_FIXED_FIELDS = (SAMPLE_IDENTIFIER, SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR, SAMPLE_ID,
                 SAMPLE_STREAM_ID, SAMPLE_CPU, SAMPLE_PERIOD)
_FIXED_READ = {SAMPLE_TID: "tid", SAMPLE_TIME: "time", SAMPLE_CPU: "cpu"}
# read_format bits
FORMAT_ENABLED, FORMAT_RUNNING, FORMAT_ID, FORMAT_GROUP, FORMAT_LOST = 1, 2, 4, 8, 16

REC_LOST, REC_SAMPLE, REC_LOST_SAMPLES = 2, 9, 13
REC_FINISHED_ROUND, REC_CPU_MAP, REC_COMPRESSED, REC_COMPRESSED2 = 68, 74, 81, 83
#: record type -> name (perf_event.h's kernel records, tools/lib/perf's user records)
RECORD_NAMES = {
    1: "MMAP", 2: "LOST", 3: "COMM", 4: "EXIT", 5: "THROTTLE", 6: "UNTHROTTLE", 7: "FORK",
    8: "READ", 9: "SAMPLE", 10: "MMAP2", 11: "AUX", 12: "ITRACE_START", 13: "LOST_SAMPLES",
    14: "SWITCH", 15: "SWITCH_CPU_WIDE", 16: "NAMESPACES", 17: "KSYMBOL", 18: "BPF_EVENT",
    19: "CGROUP", 20: "TEXT_POKE", 21: "AUX_OUTPUT_HW_ID",
    64: "HEADER_ATTR", 65: "HEADER_EVENT_TYPE", 66: "HEADER_TRACING_DATA",
    67: "HEADER_BUILD_ID", 68: "FINISHED_ROUND", 69: "ID_INDEX", 70: "AUXTRACE_INFO",
    71: "AUXTRACE", 72: "AUXTRACE_ERROR", 73: "THREAD_MAP", 74: "CPU_MAP", 75: "STAT_CONFIG",
    76: "STAT", 77: "STAT_ROUND", 78: "EVENT_UPDATE", 79: "TIME_CONV", 80: "HEADER_FEATURE",
    81: "COMPRESSED", 82: "FINISHED_INIT", 83: "COMPRESSED2",
}
#: the events besides SCHED_EVENTS decoded, that tell why a task moved (the scheduler's softirq,
#: the NUMA balancer's moves): by (system, name)
_CAUSES = {(system, ev) for system, ev, _ in CAUSE_EVENTS}

FEAT_TRACING_DATA, FEAT_OSRELEASE, FEAT_NRCPUS, FEAT_EVENT_DESC = 1, 4, 7, 12
FEAT_DIR_FORMAT, FEAT_COMPRESSED = 24, 27
#: a pipe-mode file's header: the magic and its own size, 16 (a file's is 104 and more)
PIPE_HEADER_SIZE = 16
REC_HEADER_ATTR, REC_HEADER_TRACING_DATA, REC_HEADER_FEATURE = 64, 66, 80
#: the records a pipe-mode file begins with, in place of a file's header
_PIPE_HEADER_RECORDS = {64, 65, 66, 67, 69, 78, 80}


@dataclasses.dataclass
class PerfAttr:
    """One event of the file: what its perf_event_attr says, its sample ids and its name."""

    type: int
    config: int
    sample_type: int
    read_format: int
    flags: int
    clockid: int | None       # None: recorded without use_clockid (perf's default clock)
    ids: list[int]
    name: str = ""

    @property
    def sample_id_all(self) -> bool:
        return bool(self.flags & ATTR_FLAG_SAMPLE_ID_ALL)


@dataclasses.dataclass
class PerfHeader:
    """What a perf.data says about itself (everything but its records)."""

    path: Path
    size: int
    data_offset: int
    data_size: int
    attrs: list[PerfAttr]
    features: dict[int, tuple[int, int]]     # feature bit -> (offset, size) of its section
    tracing: TraceDat | None                 # HEADER_TRACING_DATA: the tracepoints' formats
    os_release: str = ""
    nr_cpus_online: int | None = None
    nr_cpus_avail: int | None = None
    #: HEADER_COMPRESSED (perf record -z): (level, ratio) of its zstd-compressed records, or None
    compression: tuple[int, int] | None = None
    #: written by ``perf record -o -``: no header at its end, so no size of its data section but
    #: the file's own (a file cut short ends in the middle of a record)
    pipe: bool = False

    def formats_for(self, ids) -> dict[int, EventFormat]:
        """Parsed formats of the tracepoint ids ``ids`` the file holds a format of."""
        return self.tracing.formats_for(ids) if self.tracing is not None else {}


class _Bytes(FileReader):
    """The file reader of trace.dat's (bounds-checked little-endian reads; every overrun names the
    file), with the several-field reads and the strings of a perf.data header."""

    def u(self, at: int, fmt: str, what: str):
        """The fields of ``fmt`` (a tuple, even of one)."""
        self.need(at, struct.calcsize("<" + fmt), what)
        return struct.unpack_from("<" + fmt, self.data, at)

    def string(self, at: int, what: str) -> tuple[str, int]:
        """A perf_header_string (u32 len, len bytes, NUL padded) and the offset after it."""
        (n,) = self.u(at, "I", what)
        self.need(at + 4, n, what)
        text = bytes(self.data[at + 4:at + 4 + n]).split(b"\0", 1)[0]
        return text.decode("utf-8", "replace"), at + 4 + n


def read_header(path: Path, data=None) -> PerfHeader:
    """Parse ``path``'s header, attrs and the feature sections Harmony reads (no records).

    Catches the usual ways a recording goes bad: empty/truncated file, perf killed before it
    wrote the final header (data size 0), a file cut short after the data section (the feature
    sections perf appends at the end point past the end of the file); refuses the layouts this
    reader does not read (records compressed otherwise than with zstd, a perf.data directory).
    A pipe-mode file (``perf record -o -``) is read by :func:`_pipe_header`."""
    path = Path(path)
    data = map_file(path) if data is None else data
    r = _Bytes(path, data)
    if bytes(data[:8]) != PERF_MAGIC:
        raise TraceCorrupt(f"{path}: not a perf.data file (bad magic, {r.size} bytes)")
    if r.size >= 16 and r.u(8, "Q", "header size")[0] == PIPE_HEADER_SIZE:
        return _pipe_header(r)
    if r.size < _HEADER.size:
        raise TraceCorrupt(f"{path}: truncated ({r.size} bytes, shorter than a perf.data header)")
    (_magic, hsize, attr_size, attrs_off, attrs_size, data_off, data_size, _et_off, _et_size,
     *flags) = _HEADER.unpack_from(data, 0)
    if data_size == 0:
        raise TraceCorrupt(f"{path}: perf record did not finish it (data size 0 in header)")
    end = data_off + data_size
    if hsize < _HEADER.size or attrs_off + attrs_size > r.size or end > r.size:
        raise TraceCorrupt(f"{path}: truncated ({r.size} bytes, header says data ends at {end})")
    bits = [b for b in range(256) if flags[b // 64] >> (b % 64) & 1]
    features = {}
    for i, bit in enumerate(bits):
        off, sz = r.u(end + 16 * i, "QQ", "feature table")
        if off + sz > r.size:
            raise TraceCorrupt(f"{path}: truncated (feature section past the end of the file)")
        features[bit] = (off, sz)

    # the attrs: perf_event_attr (attr_size - 16 bytes) + the section of its ids
    if attr_size < _ATTR.size + 16 or attrs_size % attr_size or attrs_size // attr_size > 4096:
        raise TraceCorrupt(f"{path}: corrupt attrs section ({attrs_size} bytes of {attr_size}-byte "
                           "attrs)")
    attrs = []
    for k in range(attrs_size // attr_size):
        at = attrs_off + k * attr_size
        ids_off, ids_size = r.u(at + attr_size - 16, "QQ", "attr ids section")
        if ids_size % 8 or ids_size > 8 << 20:
            raise TraceCorrupt(f"{path}: corrupt ids of attr {k} ({ids_size} bytes)")
        r.need(ids_off, ids_size, f"ids of attr {k}")
        attrs.append(_attr(r, at, attr_size - 16, struct.unpack_from(f"<{ids_size // 8}Q", data,
                                                                      ids_off)))
    return _with_features(PerfHeader(path, r.size, data_off, data_size, attrs, features, None), r)


def _attr(r: _Bytes, at: int, attr_size: int, ids) -> PerfAttr:
    """The perf_event_attr of ``attr_size`` bytes at ``at``, with its sample ids."""
    typ, _size, config, _period, sample_type, read_format, aflags = r.u(at, _ATTR.format[1:],
                                                                         "attr")
    clockid = None
    if aflags & ATTR_FLAG_USE_CLOCKID and attr_size >= _ATTR_CLOCKID + 4:
        (clockid,) = r.u(at + _ATTR_CLOCKID, "i", "attr clockid")
    return PerfAttr(typ, config, sample_type, read_format, aflags, clockid, list(ids))


def _with_features(head: PerfHeader, r: _Bytes) -> PerfHeader:
    """``head`` with what its feature sections say: compression, event names, kernel release,
    CPUs, tracepoint formats; refused if they say it is a layout this reader does not read."""
    path, features = head.path, head.features
    if FEAT_COMPRESSED in features:
        # u32 version, u32 type (1: zstd), u32 level, u32 ratio, u32 mmap_len
        off, sz = features[FEAT_COMPRESSED]
        if sz < 20:
            raise TraceCorrupt(f"{path}: corrupt compression section ({sz} bytes)")
        _version, kind, level, ratio, _mmap_len = r.u(off, "IIIII", "compression section")
        if kind != 1:
            raise TraceCorrupt(f"{path}: its records are compressed with type {kind} (perf "
                               "record -z), which Harmony does not read (zstd only): decompress "
                               "it with `perf inject -i IN -o OUT`")
        head.compression = (level, ratio)
    if FEAT_DIR_FORMAT in features:
        raise TraceCorrupt(f"{path}: the header of a perf.data directory (perf record --threads), "
                           "which Harmony does not read: merge it with `perf inject -i DIR -o OUT`")
    if not head.attrs:
        raise TraceCorrupt(f"{path}: corrupt: no events in its attrs section")
    if FEAT_EVENT_DESC in features:
        _event_desc(r, *features[FEAT_EVENT_DESC], head.attrs)
    if FEAT_OSRELEASE in features:
        head.os_release = r.string(features[FEAT_OSRELEASE][0], "os release")[0]
    if FEAT_NRCPUS in features and features[FEAT_NRCPUS][1] >= 8:
        head.nr_cpus_avail, head.nr_cpus_online = r.u(features[FEAT_NRCPUS][0], "II", "nr cpus")
    if FEAT_TRACING_DATA in features:
        off, sz = features[FEAT_TRACING_DATA]
        head.tracing = read_tracing_data(path, bytes(r.data[off:off + sz]))
    return head


def _pipe_header(r: _Bytes) -> PerfHeader:
    """The header of a pipe-mode perf.data (``perf record -o -``): a 16-byte file header, then
    records, the first of them perf's own that a file keeps in its header: HEADER_ATTR (64: the
    perf_event_attr, then its ids to the record's end), HEADER_FEATURE (80: u64 the feature's
    bit, then its section as a file holds it), HEADER_TRACING_DATA (66: u32 size, and that many
    bytes after the record, outside its size), ID_INDEX, EVENT_UPDATE, HEADER_BUILD_ID. The data
    section is the records from the first of any other type to the end of the file."""
    path, data = r.path, r.data
    attrs, features = [], {}
    at = PIPE_HEADER_SIZE
    while at + 8 <= r.size:
        typ, _misc, size = r.u(at, "IHH", "record header")
        if typ not in _PIPE_HEADER_RECORDS:
            break
        if size < 8 or at + size > r.size:
            raise TraceCorrupt(f"{path}: truncated or corrupt {RECORD_NAMES[typ]} record at file "
                               f"offset {at}")
        if typ == REC_HEADER_ATTR:
            (attr_size,) = r.u(at + 12, "I", "attr size")
            if attr_size < _ATTR.size or 8 + attr_size > size or (size - 8 - attr_size) % 8:
                raise TraceCorrupt(f"{path}: corrupt HEADER_ATTR record at file offset {at} "
                                   f"({size} bytes, attr of {attr_size})")
            attrs.append(_attr(r, at + 8, attr_size, struct.unpack_from(
                f"<{(size - 8 - attr_size) // 8}Q", data, at + 8 + attr_size)))
        elif typ == REC_HEADER_FEATURE:
            (bit,) = r.u(at + 8, "Q", "feature record")
            features[bit] = (at + 16, size - 16)
        elif typ == REC_HEADER_TRACING_DATA:
            (n,) = r.u(at + 8, "I", "tracing data record")
            r.need(at + size, n, "tracing data")
            features[FEAT_TRACING_DATA] = (at + size, n)
            at += n
        at += size
    if len(attrs) > 4096:
        raise TraceCorrupt(f"{path}: corrupt: {len(attrs)} HEADER_ATTR records")
    head = PerfHeader(path, r.size, at, r.size - at, attrs, features, None, pipe=True)
    return _with_features(head, r)


def _event_desc(r: _Bytes, off: int, size: int, attrs: list[PerfAttr]) -> None:
    """Names of the attrs from the EVENT_DESC section: u32 nr, u32 attr_size, then per event the
    attr, u32 nr_ids, its name (a perf_header_string) and u64 ids[nr_ids]."""
    end = off + size
    nr, attr_size = r.u(off, "II", "event descriptions")
    at = off + 8
    by_id = {i: a for a in attrs for i in a.ids}
    for k in range(min(nr, 4096)):
        at += attr_size
        (nr_ids,) = r.u(at, "I", "event description")
        name, at = r.string(at + 4, "event name")
        if nr_ids > 1 << 20 or at + 8 * nr_ids > end:
            raise TraceCorrupt(f"{r.path}: corrupt event description {k} (its ids run past the "
                               "section)")
        ids = struct.unpack_from(f"<{nr_ids}Q", r.data, at)
        at += 8 * nr_ids
        named = {id(by_id[i]): by_id[i] for i in ids if i in by_id}
        for a in named.values():
            a.name = name
        if not ids and k < len(attrs) and not attrs[k].name:
            attrs[k].name = name


# --- the records -------------------------------------------------------------------------------

def _walk_python(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(offset, type, size) of every record in ``buf``, and the offset of a record whose size is
    impossible (-1: none): the walk in Python, for small files."""
    unpack = struct.Struct("<IHH").unpack_from
    mv = memoryview(buf)
    n = len(buf)
    offs, types, sizes = array("q"), array("I"), array("I")
    at, bad = 0, -1
    while at + 8 <= n:
        typ, _misc, size = unpack(mv, at)
        if size < 8 or at + size > n:
            bad = at
            break
        offs.append(at)
        types.append(typ)
        sizes.append(size)
        at += size
    if bad < 0 and at != n:
        bad = at
    return (np.frombuffer(offs, np.int64), np.frombuffer(types, np.uint32),
            np.frombuffer(sizes, np.uint32).astype(np.int64), bad)


def walk_records(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(offset, type, size) of every record of a data section, and the offset of the first record
    that does not fit (-1: every one does): compiled when :func:`harmony.core.jit.use_compiled` says
    so for its size (a pass to count the records, one to write them), in Python otherwise."""
    if not use_compiled(len(buf), JIT_MIN_BYTES):
        return _walk_python(buf)
    from harmony.probes import perf_read_jit
    err = np.full(1, -1, np.int64)
    empty = np.zeros(0, np.int64)
    n = perf_read_jit.walk(buf, empty, np.zeros(0, np.uint32), empty, err)
    bad = int(err[0])
    offs, types, sizes = np.empty(n, np.int64), np.empty(n, np.uint32), np.empty(n, np.int64)
    if n:
        perf_read_jit.walk(buf, offs, types, sizes, err)
    return offs, types, sizes, bad


def _walked(path: Path, buf: np.ndarray, off0: int, place: str = "file offset",
            cut: list | None = None,
            size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`walk_records` of a data section at ``off0`` (``place``: what its offsets are), the
    first record that does not fit a TraceCorrupt naming where it is. ``size``: the section's
    bytes, if ``buf`` holds only its whole 8-byte words (the 1-7 left: a record begun). ``cut``
    (a pipe-mode file's, which has no size of its data but the file's): a last record the file
    ends inside is no error, its offset appended to ``cut`` instead."""
    offs, types, sizes, bad = walk_records(buf)
    if bad < 0 and len(buf) < (size or 0):
        bad = len(buf)
    if bad >= 0:
        record = int(buf[bad + 6]) | int(buf[bad + 7]) << 8 if bad + 8 <= len(buf) else 8
        if cut is None or record < 8:
            raise TraceCorrupt(f"{path}: truncated or corrupt record at {place} {off0 + bad} "
                               f"(its size runs past the data section, or is below 8 bytes)")
        cut.append(bad)
    return offs, types, sizes


class _DataSection(PageSource):
    """A slab of the data section (:func:`_slabs`), starting at ``data_offset``, as the decoder's
    one "page": messages name the file offset of a record (``place``: or its offset in the
    records a compressed file's decompress to)."""

    def __init__(self, path: Path, buf: np.ndarray, data_offset: int, place: str = "file offset"):
        super().__init__(buf, max(1, len(buf)), np.zeros(1, np.int64), np.zeros(1, np.int64),
                         [str(path)], np.zeros(1, np.int64))
        self.data_offset, self.place = data_offset, place

    def where(self, page: int, byte_in_page: int | None = None) -> str:
        at = self.data_offset + int(byte_in_page or 0)
        return f"{self.files[0]}: record at {self.place} {at}"


@dataclasses.dataclass
class PerfRead:
    """A perf.data read: its events table and what perf recorded besides them."""

    header: PerfHeader
    events: pd.DataFrame
    lost_by_cpu: dict[int, int]                # PERF_RECORD_LOST counts, by the CPU it names
    lost_samples_by_event: dict[str, int]      # PERF_RECORD_LOST_SAMPLES counts, by event name
    other_events: dict[str, int]               # samples of events not decoded (not one of the
    #                                            SCHED_EVENTS or CAUSE_EVENTS), by event name
    records: dict[str, int]                    # records of the data section, by type name
    recorded_cpus: set[int] | None             # its PERF_RECORD_CPU_MAP, None if it has none
    notes: list[str]
    n_samples: int
    decoder: str

    def clockids(self, prefix: str = "sched:") -> set:
        """The clockids of the events named ``prefix``... (None: perf's default clock)."""
        return {a.clockid for a in self.header.attrs if a.name.startswith(prefix)}


def _sample_fields(st: int, read_format: int, src: PageSource, p: np.ndarray, end: np.ndarray,
                   path: Path, off: np.ndarray, data_offset: int) -> dict[str, np.ndarray]:
    """The sample fields Harmony reads (tid, time, cpu, raw position and size) of samples of one
    sample_type, their bodies starting at ``p``; ``end``: where each record ends."""
    out: dict[str, np.ndarray] = {}

    def check(pos, what):
        bad = np.flatnonzero((pos > end) | (pos < 0))
        if bad.size:
            raise TraceCorrupt(f"{path}: corrupt sample at {src.place} "
                               f"{data_offset + int(off[bad[0]])}: its {what} runs past the record")

    check(p + 8 * sum(bool(st & b) for b in _FIXED_FIELDS), "fixed fields")
    for bit in _FIXED_FIELDS:
        if not st & bit:
            continue
        name = _FIXED_READ.get(bit)
        if name == "tid":
            out["tid"] = read_uint(src, p + 4, 4).astype(np.int32)
        elif name == "time":
            out["time"] = read_uint(src, p, 8)
        elif name == "cpu":
            out["cpu"] = read_uint(src, p, 4)
        p = p + 8
    if st & SAMPLE_READ:
        per = 1 + bool(read_format & FORMAT_ID) + bool(read_format & FORMAT_LOST)
        times = bool(read_format & FORMAT_ENABLED) + bool(read_format & FORMAT_RUNNING)
        if read_format & FORMAT_GROUP:
            nr = read_uint(src, np.minimum(p, end - 8), 8)
            huge = (nr < 0) | (nr > 1 << 16)       # read as int64: a flipped top bit is < 0
            if huge.any():
                check(np.where(huge, end + 1, p), "read group")
            p = p + 8 * (1 + times) + 8 * per * nr
        else:
            p = p + 8 * (times + per)
        check(p, "read values")
    if st & SAMPLE_CALLCHAIN:
        check(p + 8, "call chain")
        nr = read_uint(src, p, 8)
        huge = (nr < 0) | (nr > 1 << 16)           # read as int64: a flipped top bit is < 0
        if huge.any():
            check(np.where(huge, end + 1, p), "call chain")
        p = p + 8 + 8 * nr
        check(p, "call chain")
    if st & SAMPLE_RAW:
        check(p + 4, "raw data size")
        size = read_uint(src, p, 4)
        out["raw_pos"] = p + 4
        out["raw_size"] = size
        check(p + 4 + size, "raw data")
    return out


def by_time_then_cpu(ts: np.ndarray, cpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the order of samples by time, the events of one instant by CPU, each CPU's in file order;
    ``ts`` in that order): the order of every Harmony events table
    (:func:`harmony.probes.schema.make_events`; the tracefs decoder's merge). A stable sort by
    time, then only the instants several samples share put in CPU order: perf script prints
    those in file order, in which a CPU's sample read a round later comes after another CPU's of
    the same nanosecond (86 instants of a 9.4 M-event recording here)."""
    order = np.argsort(ts, kind="stable")
    t = ts[order]
    at = np.flatnonzero(t[1:] == t[:-1])        # sample at + 1 shares sample at's instant
    if len(at):                                 # (few: no array as long as the samples)
        tied = np.union1d(at, at + 1)
        order[tied] = order[tied][np.lexsort((cpu[order[tied]], t[tied]))]
    return order, t


def read_perf_data(path: Path) -> PerfRead:
    """Decode ``path``: the events table of its samples of the sched tracepoints Harmony reads
    (:data:`~harmony.probes.schema.SCHED_EVENTS`, as ``perf script``'s parser did: the canonical
    columns, in time order) and of those that tell why a task moved
    (:data:`~harmony.probes.schema.CAUSE_EVENTS`: ``irq:softirq_entry`` / ``irq:softirq_exit``
    with the vector in ``prio``, the NUMA balancer's), and the counts of what else it holds (see
    :class:`PerfRead`).

    The data section is read a slab at a time (:func:`_slabs`: :data:`SLAB_BYTES` of whole
    records, read into memory the reader keeps, or decompressed), and each slab decoded on its
    own (:func:`_read_slab`), its events written after the slabs' before (:class:`_Rows`, which
    puts them in order where two slabs overlap in time). What the reader holds at its peak is
    the events and two slabs' records, not the file's pages nor every sample's places and
    fields.

    Two slabs at a time where this process may run on two CPUs: a slab to the side thread
    (:func:`harmony.core.jit.on_side_thread`), the next one read into a buffer of its own and
    decoded here meanwhile, then the two added in file order. One after the other, the decode
    kept one CPU busy and left the other idle (most of a slab's work holds the GIL only between
    numpy's and the kernels' calls). Whole imports of the bench's perf.data took 0.93x the time
    at 4.04 M events (2.35 s against 2.54) and at 9.38 M (4.23 against 4.54), peaking at 548
    against 602 MiB and 1053 against 1085 (5 interleaved pairs each, 2026-12-06, with the
    slabs of 64 MiB one at a time before)."""
    path = Path(path)
    data = map_file(path)
    head = read_header(path, data)
    notes: list[str] = []
    attrs = head.attrs
    # the tracepoint formats the samples need, by tracepoint id (the attr's config)
    tp = [k for k, a in enumerate(attrs) if a.type == PERF_TYPE_TRACEPOINT and a.sample_type &
          SAMPLE_RAW]
    formats = head.formats_for(sorted({attrs[k].config for k in tp if attrs[k].config < 1 << 16}))
    if tp and head.tracing is None:
        notes.append("the file has no tracing data (HEADER_TRACING_DATA): its tracepoint samples "
                     "cannot be decoded")
    rows = _Rows()
    slabs = []

    def add(slab: dict, read_to: tuple) -> None:
        notes.extend(n for n in slab.pop("said") if n not in notes)
        rows.add(slab.pop("events"), slab.pop("decoder"), *read_to)
        slabs.append(slab)
    # two slabs decoded at once: one on the side thread, the next on this one meanwhile (not
    # where this is the side thread: it would wait for itself)
    both = threads() > 1 and not on_the_side_thread()
    side = None
    try:
        for src, walked, read_to in _slabs(path, data, head, notes, buffers=2):
            if side is None and both:
                side = (on_side_thread(_read_slab, path, src, walked, head, formats, tp), read_to)
                continue
            mine = _read_slab(path, src, walked, head, formats, tp)
            del src, walked
            if side is not None:
                add(side[0].result(), side[1])
                side = None
            add(mine, read_to)
        if side is not None:
            add(side[0].result(), side[1])
            side = None
    finally:
        if side is not None:
            wait([side[0]])
    del data
    events, decoder = rows.table(formats)
    lost_by_cpu: dict[int, int] = {}
    lost_samples = {a.name: 0 for a in attrs if a.name}
    other: dict[str, int] = {}
    records: dict[str, int] = {}
    for s in slabs:
        for total, part in ((lost_by_cpu, s["lost_by_cpu"]), (lost_samples, s["lost_samples"]),
                            (other, s["other"]), (records, s["records"])):
            for k, v in part.items():
                total[k] = total.get(k, 0) + v
    recorded = next((s["recorded"] for s in slabs if s["recorded"] is not None), None)
    if other:
        notes.append(f"ignored events other than the {len(SCHED_EVENTS) + len(_CAUSES)} Harmony "
                     f"decodes ({', '.join(SCHED_EVENTS)}, "
                     f"{', '.join(sorted(f'{s}:{e}' for s, e in _CAUSES))}), by count: {other}")
    return PerfRead(head, events, lost_by_cpu, lost_samples, other, records, recorded, notes,
                    sum(s["n_samples"] for s in slabs), decoder)


#: heap memory faulted in ahead of the read per byte of records (core.memory.prefault_heap): what
#: the read holds at its end, the events' columns (~37 bytes an event, and a tenth more room: see
#: :class:`_Rows`) and a slab's temporaries, at the ~111 bytes an event of a sample of the sched
#: tracepoints (a 4.04 M-event file's heap was 302 MB at the read's end, 0.67 bytes a byte)
PREFAULT_PER_RECORD_BYTE = 0.5
#: bytes of a data section read and decoded at a time (:func:`_slabs`): ~600 k samples of the
#: sched tracepoints, whose places and fields (~50 bytes a sample) the slab's decode holds beside
#: its events. A slab is read into memory the reader keeps (``pread``), not mapped: the file's
#: pages stay in the page cache, outside the import's memory. 24 MiB, two decoded at once
#: (:func:`read_perf_data`): the reader alone peaked at 373 / 657 MB at 4.04 / 9.38 M events
#: (64 MiB, one at a time: 473 / 736), in 0.53-0.57 / 1.17-1.19 s; 16 MiB 357 / 641 MB in
#: 0.56-0.58 / 1.22 s, 32 MiB 404 / 673 MB in 0.53-0.56 / 1.12-1.18 s (2026-12-06)
SLAB_BYTES = 24 << 20


def _slabs(path: Path, data, head: PerfHeader, notes: list[str], buffers: int = 1):
    """The data section a slab at a time, in file order: (the slab as a source of whole 8-byte
    words, :class:`_DataSection`, whose ``data_offset`` is where it starts; the walk of its whole
    records: offsets in the slab, types, sizes; (the bytes of records read so far, of them
    all)). A slab is :data:`SLAB_BYTES`, up to the last record that ends in it (one that does
    not fit, made longer), read into one of ``buffers`` buffers kept for the next ones, in turn
    (a slab's buffer is read into again ``buffers`` slabs later), or the records a compressed
    file's decompress to (``perf record -z``: held whole). A record the section ends inside is
    an error naming it, or in a pipe-mode file (no size of its data but the file's) the end of
    what is read, noted."""
    off0, size = head.data_offset, head.data_size
    # a pipe-mode file cut short (perf stopped while it wrote a record): the records before
    cut: list[int] | None = [] if head.pipe else None
    f = None
    if head.compression is not None:
        # the records as perf wrote them before compressing them; offsets in messages are theirs
        raw, n_parts = decompressed_records(path, data, off0, size, head.compression[1], cut)
        _note_cut(notes, cut, off0, size)
        cut = None
        notes.append(f"its records were compressed (perf record -z, zstd level "
                     f"{head.compression[0]}): {n_parts} compressed records, {size} bytes, read "
                     f"as {len(raw)} bytes")
        off0, size = 0, len(raw)
        place = "offset in its records decompressed"

        def read(at: int, n: int) -> np.ndarray:
            return raw[at:at + n]
    else:
        place = "file offset"
        f = _open_records(path)
        kept = [np.empty(0, np.uint8)] * buffers

        def read(at: int, n: int) -> np.ndarray:
            # the slab's buffer (``turn``: read again into it, longer, it stays the slab's)
            if len(kept[turn]) < n:
                kept[turn] = anonymous_array(n, np.uint8)
            held = kept[turn]
            got = 0
            while got < n:
                k = os.preadv(f.fileno(), [memoryview(held[got:n])], off0 + at + got)
                if k <= 0:
                    raise TraceCorrupt(f"{path}: truncated (it ends at file offset "
                                       f"{off0 + at + got}, inside its data section)")
                got += k
            return held[:n]
    # the heap the read will need, faulted in meanwhile: by the records' bytes as they are read
    # (a compressed file's, decompressed)
    prefault_for_pages(size, PREFAULT_PER_RECORD_BYTE)
    try:
        at = 0
        turn = 0
        while at < size:
            turn = (turn + 1) % buffers
            n = min(max(8, SLAB_BYTES - SLAB_BYTES % 8), size - at)
            while True:
                last = at + n >= size
                buf = read(at, n - n % 8 if last else n)
                if last:
                    # the section's last record runs past it: an error, or a pipe-mode file's cut
                    here: list[int] | None = None if cut is None else []
                    offs, types, sizes = _walked(path, buf, off0 + at, place, cut=here,
                                                 size=size - at)
                    if here:
                        cut.append(at + here[0])
                    break
                offs, types, sizes, bad = walk_records(buf)
                if bad != 0:
                    break
                # the slab's first record does not fit in it: longer, if the record is (its size,
                # a u16, is at most 64 KiB), or the walk of the rest says what is wrong with it
                rec = int(buf[6]) | int(buf[7]) << 8
                n = min(max(2 * n, rec + 8 + -rec % 8) if rec >= 8 else size, size - at)
            read_to = size if last else at + (bad if bad > 0 else len(buf))
            yield _DataSection(path, buf, off0 + at, place), (offs, types, sizes), (read_to, size)
            if last:
                break
            at = read_to
    finally:
        if f is not None:
            f.close()
    _note_cut(notes, cut, off0, size)


def _open_records(path: Path):
    """``path`` opened to read its records, TraceCorrupt naming it if it cannot be."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise TraceCorrupt(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_slab(path: Path, src: "_DataSection", walked: tuple, head: PerfHeader, formats,
               tp: list[int]) -> dict:
    """One slab of the data section (:func:`_slabs`) decoded: its events ("events", in time
    order; "decoder": which decoder made them), its records by type name ("records"), its lost
    counts ("lost_by_cpu", "lost_samples"), its samples ("n_samples"; of other events, by name:
    "other") and the CPUs of its first CPU map ("recorded", None: none). The phases: the places
    of its records (:func:`_record_places`), each sample's event (:func:`_sample_attrs`) and the
    events decoded (:func:`_sample_groups`), the samples' fields in time order
    (:func:`_samples_in_order`) -- those three in one compiled pass over the records where the
    kernels are used (:func:`compiled_samples`) --, their payloads decoded
    (:func:`_decoded_events`), and the lost counts (:func:`_lost_counts`). Its notes, each once,
    are "said": the caller adds them to the file's in slab order, once whatever the slabs that
    say them (a slab may be decoded on another thread)."""
    attrs, off0 = head.attrs, src.data_offset
    said: list[str] = []
    rows = _row_attrs(attrs, tp, formats)
    compiled = (compiled_samples(src.buf, walked, attrs, rows)
                if use_compiled(len(src.buf), JIT_MIN_BYTES) else None)
    places = _record_places(*walked, samples=compiled is None)
    del walked
    if compiled is None:
        s_attr, attr_of = _sample_attrs(path, src, attrs, places, off0)
        per_attr = np.bincount(s_attr + 1, minlength=len(attrs) + 1)
        groups, other = _sample_groups(attrs, per_attr, rows)
        cols = _samples_in_order(path, src, attrs, places, s_attr, groups, off0, said)
        del s_attr
    else:
        per_attr, cols = compiled
        attr_of = _attr_lookup(attrs)[2]
        other = _sample_groups(attrs, per_attr, rows)[1]
    del compiled
    n_s = int(per_attr.sum())
    events, decoder = _decoded_events(path, src, head, formats, cols, said)
    del cols
    lost_by_cpu, lost_samples = _lost_counts(path, src, attrs, places, attr_of, off0)
    return {"events": events, "decoder": decoder, "records": places["records"],
            "said": list(dict.fromkeys(said)),
            "lost_by_cpu": lost_by_cpu, "lost_samples": lost_samples, "other": other,
            "n_samples": n_s, "recorded": _cpu_map(src, *places["cpu_map"])}


class _Rows:
    """The events of the slabs (:func:`_read_slab`), each in time order, written one after the
    other into columns sized once, from the events per byte of records of the first slab, with a
    tenth more room (grown if that is too few), then put in the order of every Harmony events
    table where two slabs overlap in time (:meth:`table`). The slabs' own tables, held until all
    were read and then joined, took the events' memory twice: the joined columns did not fit in
    the holes the slabs' tables left between the next slabs' temporaries (a 9.38 M-event
    perf.data's import peaked higher, 1396 against 1366 MB); joined in mappings of their own,
    they paid their pages' first touch (reading it 3.5 s against 1.7)."""

    def __init__(self):
        self.cols: dict[str, np.ndarray] = {}
        self.cats: dict[str, pd.Index] = {}        # a string column's categories so far
        self.starts: list[int] = []                # each slab's first row
        self.n = 0
        self.decoded: dict[str, int] = {}          # rows by the decoder that made them

    def add(self, events: pd.DataFrame, decoder: str, read: int, total: int) -> None:
        """A slab's ``events``, made by ``decoder``, once ``read`` bytes of the ``total`` bytes
        of records are read."""
        k = len(events)
        self.decoded[decoder] = self.decoded.get(decoder, 0) + k
        if not k:
            return
        if self.n + k > len(self.cols.get("ts", ())):
            # the rows the records hold, at the density of those read so far, and a tenth more
            cap = max(self.n + k, int((self.n + k) / max(read, 1) * total * 1.1) + 1024)
            for name in COLUMNS:
                old = self.cols.get(name)
                dtype = (old.dtype if old is not None else np.int8
                         if isinstance(events[name].dtype, pd.CategoricalDtype)
                         else events[name].dtype)
                self.cols[name] = np.empty(cap, dtype)
                if old is not None:
                    self.cols[name][:self.n] = old[:self.n]
                del old
        lo, hi = self.n, self.n + k
        for name in COLUMNS:
            c = events[name].array
            if isinstance(c, pd.Categorical):
                have = self.cats.setdefault(name, pd.Index([], dtype=c.categories.dtype))
                new = c.categories[have.get_indexer(c.categories) < 0]
                if len(new):
                    have = self.cats[name] = have.append(new)
                    # codes as narrow as the categories allow (-1 and their number)
                    need = np.min_scalar_type(-len(have))
                    if np.dtype(need).itemsize > self.cols[name].dtype.itemsize:
                        self.cols[name] = self.cols[name].astype(need)
                # each slab's codes for its categories -> the columns' (-1, no value, stays)
                recode = np.append(have.get_indexer(c.categories), -1)
                self.cols[name][lo:hi] = recode[c.codes]
            else:
                self.cols[name][lo:hi] = c
        self.starts.append(lo)
        self.n = hi

    def table(self, formats) -> tuple[pd.DataFrame, str]:
        """(the events table: in time order, the events of one instant by CPU, each CPU's in file
        order, as :func:`by_time_then_cpu` orders them; the decoder that made most of them). Each
        slab is in that order: where a slab's first events are not later than the rows before
        it (perf writes the CPUs' buffers in rounds), only the rows of the two that overlap are
        put in order. The columns' room beyond the rows is given back."""
        decoder = max(self.decoded, key=self.decoded.get, default="numpy")
        if not self.n:
            return make_events({}), decoder
        n = self.n
        cols = {name: c[:n] for name, c in self.cols.items()}
        for c in self.cols.values():
            drop_pages(c[n:])
        self.cols = {}
        ts, cpu = cols["ts"], cols["cpu"]
        for s, e in zip(self.starts[1:], self.starts[2:] + [n]):
            if ts[s - 1] < ts[s]:
                continue
            # rows [0, s) are in order: its rows from the slab's first instant on, and the
            # slab's up to the last instant before it, are the ones out of order
            lo = int(np.searchsorted(ts[:s], ts[s], "left"))
            hi = s + int(np.searchsorted(ts[s:e], ts[s - 1], "right"))
            order, _ = by_time_then_cpu(ts[lo:hi], cpu[lo:hi])
            for c in cols.values():
                c[lo:hi] = c[lo:hi][order]
        rank: dict[str, int] = {}
        for k in sorted(formats):
            rank.setdefault(event_label(formats[k]), len(rank))
        for name, cats in self.cats.items():
            cat = pd.Categorical.from_codes(cols[name], cats, validate=False)
            if name == "event":   # in the order of their formats' ids, as a whole decode has them
                cat = cat.reorder_categories(sorted(cats, key=lambda c: rank.get(c, len(rank))))
            cols[name] = cat
        return make_events(cols, ordered=True), decoder


def _record_places(offs: np.ndarray, types: np.ndarray, sizes: np.ndarray,
                   samples: bool = True) -> dict:
    """The walk of a slab's records (offsets, types, sizes) as the records by type name
    ("records"), and (start, end) offsets of its samples ("samples", unless ``samples`` is
    false: the compiled pass reads them from the walk), its lost counts ("lost",
    "lost_samples") and CPU maps ("cpu_map")."""
    counts = np.bincount(np.minimum(types, 255).astype(np.int64), minlength=256)
    out = {"records": {RECORD_NAMES.get(t, f"type {t}"): int(c)
                       for t, c in enumerate(counts) if c}}
    for key, kind in (("lost", REC_LOST), ("lost_samples", REC_LOST_SAMPLES),
                      ("cpu_map", REC_CPU_MAP), ("samples", REC_SAMPLE)):
        if key == "samples" and not samples:
            continue
        idx = np.flatnonzero(types == kind)
        out[key] = (offs[idx], offs[idx] + sizes[idx])
    return out


def _sample_attrs(path: Path, src, attrs, places: dict, off0: int):
    """(the attr of each sample, -1 for an unknown id; the function from ids to attrs): by its
    id (IDENTIFIER first, or ID where sample_type puts it, the same in every attr), or the only
    attr."""
    attr_of = _attr_lookup(attrs)[2]
    s_off, s_end = places["samples"]
    types_st = {a.sample_type for a in attrs}
    st0 = attrs[0].sample_type
    if len(attrs) == 1:
        return np.zeros(len(s_off), np.int64), attr_of
    place = src.place
    if all(st & SAMPLE_IDENTIFIER for st in types_st):
        short = np.flatnonzero(s_end < s_off + 16)
        if short.size:
            raise TraceCorrupt(f"{path}: corrupt sample at {place} "
                               f"{off0 + int(s_off[short[0]])}: too short for its id")
        return attr_of(read_uint(src, s_off + 8, 8).astype(np.uint64)), attr_of
    if len(types_st) == 1 and st0 & SAMPLE_ID:
        before = sum(bool(st0 & b) for b in (SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR))
        at = s_off + 8 + 8 * before
        if (at + 8 > s_end).any():
            raise TraceCorrupt(f"{path}: corrupt sample at {place} "
                               f"{off0 + int(s_off[np.flatnonzero(at + 8 > s_end)[0]])}: too short "
                               "for its id")
        return attr_of(read_uint(src, at, 8).astype(np.uint64)), attr_of
    raise TraceCorrupt(f"{path}: its {len(attrs)} events' samples carry no id (sample_type "
                       "without ID or IDENTIFIER): which event a sample is cannot be told")


def _attr_lookup(attrs) -> tuple[np.ndarray, np.ndarray, object]:
    """(every attr's ids, sorted; the attr of each; the function from an array of sample ids
    to their attrs, -1 for an unknown id, or the only attr where no attr has ids)."""
    all_ids = np.array([i for a in attrs for i in a.ids], np.uint64)
    id_attr = np.array([k for k, a in enumerate(attrs) for _ in a.ids], np.int64)
    by_id = np.argsort(all_ids, kind="stable")
    all_ids, id_attr = all_ids[by_id], id_attr[by_id]

    def attr_of(ids: np.ndarray) -> np.ndarray:
        if not len(all_ids):
            return np.full(len(ids), 0 if len(attrs) == 1 else -1, np.int64)
        k = np.minimum(np.searchsorted(all_ids, ids), len(all_ids) - 1)
        return np.where(all_ids[k] == ids, id_attr[k], -1)
    return all_ids, id_attr, attr_of


def _row_attrs(attrs, tp: list[int], formats) -> np.ndarray:
    """Whether each attr's samples become rows: a tracepoint of the sched events or the
    causes Harmony decodes, whose format the file holds."""
    rows = np.zeros(len(attrs), bool)
    for k in tp:
        fmt = formats.get(attrs[k].config)
        rows[k] = fmt is not None and ((fmt.system == "sched" and fmt.name in SCHED_EVENTS)
                                       or (fmt.system, fmt.name) in _CAUSES)
    return rows


def _sample_groups(attrs, per_attr: np.ndarray, rows: np.ndarray) -> tuple[dict, dict]:
    """(the attrs whose samples become rows (``rows``), grouped by their samples' layout
    (sample_type, read_format): the fields of a group's samples are read in one pass; the
    samples of the others, counted by event name), from the samples of each attr
    (``per_attr``; slot 0: of an unknown id, attr k's in k + 1)."""
    other: dict[str, int] = {}
    if per_attr[0]:
        other["(samples of an unknown id)"] = int(per_attr[0])
    groups: dict[tuple[int, int], list[int]] = {}
    for k in np.flatnonzero(per_attr[1:]).tolist():
        a = attrs[k]
        if not rows[k]:
            name = a.name or f"attr {k} (type {a.type}, config {a.config})"
            other[name] = other.get(name, 0) + int(per_attr[k + 1])
        else:
            groups.setdefault((a.sample_type, a.read_format), []).append(k)
    return groups, other


def compiled_samples(buf: np.ndarray, walked: tuple, attrs, rows: np.ndarray):
    """(the samples of each attr, as :func:`_sample_groups` takes them; the rows' columns as
    :func:`_samples_in_order` gives them) of a slab (``buf``, its records' walk ``walked``;
    ``rows``: :func:`_row_attrs`), by the compiled pass
    (:func:`harmony.probes.perf_read_jit.sample_rows`): one pass over the walk's records in
    place of numpy's passes over every sample's places and fields. None where that pass hands
    the slab to the numpy code, which raises or notes what is wrong with it (the first sample too
    short for its id, a field past its record, ...)."""
    from harmony.probes import perf_read_jit
    offs, types, sizes = walked
    st0 = attrs[0].sample_type
    if len(attrs) == 1:
        id_at = 0
    elif all(a.sample_type & SAMPLE_IDENTIFIER for a in attrs):
        id_at = 8
    elif len({a.sample_type for a in attrs}) == 1 and st0 & SAMPLE_ID:
        id_at = 8 + 8 * sum(bool(st0 & b) for b in (SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME,
                                                     SAMPLE_ADDR))
    else:
        return None         # no id to tell the events apart: the numpy code says so
    # each attr's fixed fields: their bytes, where the tid, time and cpu are in them
    fixed, at_tid, at_time, at_cpu = (np.full(len(attrs), -1, np.int64) for _ in range(4))
    for j, a in enumerate(attrs):
        off = 0
        for bit in _FIXED_FIELDS:
            if a.sample_type & bit:
                if bit == SAMPLE_TID:
                    at_tid[j] = off + 4
                elif bit == SAMPLE_TIME:
                    at_time[j] = off
                elif bit == SAMPLE_CPU:
                    at_cpu[j] = off
                off += 8
        fixed[j] = off
        if rows[j] and (at_time[j] < 0 or at_cpu[j] < 0):
            return None     # samples without a time (refused) or a CPU (noted): the numpy code
    ids, id_attr, _ = _attr_lookup(attrs)
    per_attr = np.zeros(len(attrs) + 1, np.int64)
    n = len(offs)
    cols = (np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64),
            np.empty(n, np.int16), np.empty(n, np.int32), np.empty(n, np.int32))
    k = perf_read_jit.sample_rows(
        buf, offs, types, sizes, id_at, ids, id_attr, rows,
        np.array([a.config if a.config < 1 << 16 else -1 for a in attrs], np.int32),
        fixed, at_tid, at_time, at_cpu, np.array([a.sample_type for a in attrs], np.int64),
        np.array([a.read_format for a in attrs], np.int64), per_attr, *cols)
    if k == perf_read_jit.ASK_NUMPY:
        return None
    return per_attr, _in_time_order(*(c[:k] for c in cols))


def _samples_in_order(path: Path, src, attrs, places: dict, s_attr: np.ndarray, groups: dict,
                      off0: int, notes: list[str]) -> tuple:
    """(raw position, raw size, time, cpu, event code, tid) of the samples that become rows, by
    time and the events of one instant by CPU; each column as narrow as the decoder takes it."""
    s_off, s_end = places["samples"]
    # each attr's tracepoint id, the samples' event code ([-1]: an unknown id); the attrs whose
    # samples become rows have one below 2**16 (a format's), another may be any u64
    config_of = np.array([a.config if a.config < 1 << 16 else -1 for a in attrs] + [-1], np.int64)
    parts = []
    for (st, rf), ks in groups.items():
        member = np.zeros(len(attrs) + 1, bool)
        member[ks] = True
        sel = np.flatnonzero(member[s_attr])
        names = ", ".join(attrs[k].name or f"attr {k}" for k in ks)
        off = s_off[sel]
        f = _sample_fields(st, rf, src, off + 8, s_end[sel], path, off, off0)
        del off
        if "time" not in f:
            raise TraceCorrupt(f"{path}: the samples of {names} have no time stamps (recorded "
                               "without PERF_SAMPLE_TIME): they cannot be put in order")
        if "cpu" not in f:
            notes.append(f"the samples of {names} carry no CPU (PERF_SAMPLE_CPU): their cpu is -1")
        elif len(sel) and int(f["cpu"].max()) > np.iinfo(np.int16).max:
            raise TraceCorrupt(f"{path}: corrupt sample of {names}: CPU {int(f['cpu'].max())}")
        if len(sel) and (f["time"] < 0).any():
            raise TraceCorrupt(f"{path}: corrupt sample of {names}: a time stamp past 2**63 ns")
        # each column as narrow as the decoder takes it, as it is made
        parts.append((sel, f.pop("raw_pos"),
                      np.minimum(f.pop("raw_size"), 1 << 30).astype(np.int32), f.pop("time"),
                      f.pop("cpu").astype(np.int16) if "cpu" in f else np.full(len(sel), -1,
                                                                                np.int16),
                      config_of[s_attr[sel]].astype(np.int32),
                      f.pop("tid") if "tid" in f else np.full(len(sel), -1, np.int32)))
        del f
    places["samples"] = None        # the places of the samples are read: freed
    del s_off, s_end
    n_parts = len(parts)
    if n_parts == 1:    # one layout, the common case: its columns as they are, not copied
        cols = list(parts.pop())
    else:
        dtypes = (np.int64, np.int64, np.int32, np.int64, np.int16, np.int32, np.int32)
        cols = [np.concatenate(c) if c else np.zeros(0, dt) for c, dt in zip(zip(*parts), dtypes)] \
            if parts else [np.zeros(0, dt) for dt in dtypes]
    del parts
    sel, rec_pos, rec_len, rec_ts, rec_cpu, rec_code, rec_tid = cols
    del cols
    # in file order, where several layouts' samples were read apart
    order = np.argsort(sel, kind="stable") if n_parts > 1 else None
    del sel
    return _in_time_order(rec_pos, rec_len, rec_ts, rec_cpu, rec_code, rec_tid, order)


def _in_time_order(rec_pos, rec_len, rec_ts, rec_cpu, rec_code, rec_tid,
                   order: np.ndarray | None = None) -> tuple:
    """The samples' columns (``order``: the samples' file order, None: they are in it) by
    time, the events of one instant by CPU (:func:`by_time_then_cpu`)."""
    if order is not None:
        rec_ts = rec_ts[order]
    by_time, rec_ts = by_time_then_cpu(rec_ts, rec_cpu if order is None else rec_cpu[order])
    order = by_time if order is None else order[by_time]
    del by_time
    # one column at a time, each original freed as its sorted copy is made
    rec_pos = rec_pos[order]
    rec_len = rec_len[order]
    rec_cpu = rec_cpu[order]
    rec_code = rec_code[order]
    rec_tid = rec_tid[order]
    return rec_pos, rec_len, rec_ts, rec_cpu, rec_code, rec_tid


def _decoded_events(path: Path, src, head: PerfHeader, formats, cols: tuple,
                    notes: list[str]) -> tuple[pd.DataFrame, str]:
    """(the events table of the samples ``cols`` (:func:`_samples_in_order`), the decoder
    that made it): their payloads decoded by the ring-buffer decoder."""
    rec_pos, rec_len, rec_ts, rec_cpu, rec_code, rec_tid = cols
    if not (formats and len(rec_pos)):
        return make_events({}), "numpy"
    try:
        hp = parse_header_page(head.tracing.header_page)
    except FormatError as exc:
        raise TraceCorrupt(f"{path}: bad ring-buffer header description in its tracing data "
                           f"({exc})") from None
    walked = Records(rec_pos, rec_len, rec_ts, rec_cpu, np.zeros(1, np.int64),
                     np.zeros(1, bool), rec_code)
    dec = decode_source(src, formats, hp, walked=walked)
    events = dec.events
    # the sample's tid, as perf script prints it, not the payload's common_pid: they differ
    # where perf could not name the task (-1 in the last switch of a task that exited)
    events["common_pid"] = rec_tid
    notes.extend(dec.notes)
    return events, dec.decoder


def _lost_counts(path: Path, src, attrs, places: dict, attr_of, off0: int):
    """(lost records by CPU, lost samples by event name): LOST (u64 id, u64 lost) by the CPU of
    its sample_id trailer; LOST_SAMPLES (u64 lost) by the event its trailer's id names."""
    lost_by_cpu: dict[int, int] = {}
    st0 = attrs[0].sample_type
    trailer = attrs[0].sample_id_all
    place = src.place
    lo, le = places["lost"]
    if len(lo):
        if (le - lo < 24).any():
            raise TraceCorrupt(f"{path}: corrupt PERF_RECORD_LOST at {place} "
                               f"{off0 + int(lo[np.flatnonzero(le - lo < 24)[0]])}")
        lost = read_uint(src, lo + 16, 8)
        cpu_at = le - 8 - 8 * bool(st0 & SAMPLE_IDENTIFIER)
        cpus = (read_uint(src, np.maximum(cpu_at, lo + 24), 4) if trailer and st0 & SAMPLE_CPU
                and (cpu_at >= lo + 24).all() else np.full(len(lo), -1, np.int64))
        for c, v in zip(cpus.tolist(), lost.tolist()):
            lost_by_cpu[c] = lost_by_cpu.get(c, 0) + v
    lost_samples = {a.name: 0 for a in attrs if a.name}
    lo, le = places["lost_samples"]
    if len(lo):
        if (le - lo < 16).any():
            raise TraceCorrupt(f"{path}: corrupt PERF_RECORD_LOST_SAMPLES at {place} "
                               f"{off0 + int(lo[np.flatnonzero(le - lo < 16)[0]])}")
        lost = read_uint(src, lo + 8, 8)
        if trailer and st0 & (SAMPLE_IDENTIFIER | SAMPLE_ID):
            after = (bool(st0 & SAMPLE_IDENTIFIER) if st0 & SAMPLE_IDENTIFIER else
                     1 + bool(st0 & SAMPLE_STREAM_ID) + bool(st0 & SAMPLE_CPU))
            id_at = le - 8 * after
            ok = id_at >= lo + 16
            which = np.where(ok, attr_of(read_uint(src, np.maximum(id_at, lo), 8)
                                         .astype(np.uint64)), -1)
        else:
            which = np.full(len(lo), 0 if len(attrs) == 1 else -1)
        for k, v in zip(which.tolist(), lost.tolist()):
            name = attrs[k].name if k >= 0 and attrs[k].name else "(unknown event)"
            lost_samples[name] = lost_samples.get(name, 0) + v
    return lost_by_cpu, lost_samples


def _note_cut(notes: list[str], cut: list[int] | None, off0: int, size: int) -> None:
    """The note of a pipe-mode file cut short (:func:`_walked`'s ``cut``), if it was."""
    if cut:
        notes.append(f"the file ends inside a record (at file offset {off0 + cut[0]}: perf "
                     f"record -o - stopped while writing it): its last {size - cut[0]} bytes are "
                     "not read")


def decompressed_records(path: Path, data, off0: int, size: int, compression_ratio: int = 1,
                         cut: list | None = None) -> tuple[np.ndarray, int]:
    """The data section of a perf.data written by ``perf record -z``, as perf reads it: each
    COMPRESSED record (81: the rest of the record; COMPRESSED2, 83: u64 data_size, then that many
    bytes, padded to 8) fed in order to one zstd stream, whose output is records; the file's
    other records (perf's own, FINISHED_ROUND) each placed after the whole records decompressed
    before it, as perf processes them: a record the stream has only begun (one compressed record
    may end inside it) continues after them. ``compression_ratio``: the one perf wrote in the
    header (HEADER_COMPRESSED), to size the output; ``cut``: :func:`_walked`'s. Returns (the
    records, as uint8; the compressed records read).
    """
    buf = np.frombuffer(data, np.uint8, count=size, offset=off0)
    offs, types, sizes = _walked(path, buf, off0, cut=cut)
    # room for what the ratio perf wrote says they decompress to (grown if it is more)
    limit = MAX_RATIO * size + (1 << 20)
    expected = min(size * (max(1, compression_ratio) + 1) + (1 << 20), limit)
    out = np.empty(expected, np.uint8)
    used = 0
    whole = 0           # out[:whole] are whole records; out[whole:used] are not walked yet
    parts = 0
    what = "compressed records (perf record -z)"
    compiled = use_compiled(expected, JIT_MIN_BYTES)      # walks what it decompresses to
    with ZstdStream(path, what, limit) as z:
        for at, kind, n in zip(offs.tolist(), types.tolist(), sizes.tolist()):
            if kind == REC_COMPRESSED:
                out, used = z.feed(buf[at + 8:at + n], out, used)
            elif kind == REC_COMPRESSED2:
                if n < 16:
                    raise TraceCorrupt(f"{path}: corrupt COMPRESSED2 record at file offset "
                                       f"{off0 + at} ({n} bytes)")
                (m,) = struct.unpack_from("<Q", buf, at + 8)
                if m > n - 16:
                    raise TraceCorrupt(f"{path}: corrupt COMPRESSED2 record at file offset "
                                       f"{off0 + at} (holds {n - 16} bytes, says {m})")
                out, used = z.feed(buf[at + 16:at + 16 + m], out, used)
            else:
                whole += _whole_records(out[whole:used], compiled)
                tail = out[whole:used].copy()
                out = grown(out, used, used + n)
                out[whole:whole + n] = buf[at:at + n]
                out[whole + n:used + n] = tail
                used += n
                whole += n
                continue
            parts += 1
        if not z.whole:
            raise TraceCorrupt(f"{path}: truncated {what}: the last of them stops inside a "
                               "compressed block")
    return out[:used], parts


def _whole_records(buf: np.ndarray, compiled: bool) -> int:
    """How many bytes at the start of ``buf`` are whole records (up to the first one that runs
    past its end, or is impossible)."""
    if compiled:
        from harmony.probes import perf_read_jit
        err, empty = np.full(1, -1, np.int64), np.zeros(0, np.int64)
        perf_read_jit.walk(buf, empty, np.zeros(0, np.uint32), empty, err)
        return len(buf) if err[0] < 0 else int(err[0])
    bad = _walk_python(buf)[3]
    return len(buf) if bad < 0 else bad


def _cpu_map(src: PageSource, offs: np.ndarray, ends: np.ndarray) -> set[int] | None:
    """The CPUs of the first PERF_RECORD_CPU_MAP (None: none, or one not understood): its data is
    u16 type, then 0: u16 nr, u16 cpu[nr]; 1: u16 nr, u16 long_size, a bit mask of nr longs;
    2: u8 any_cpu, u8 pad, u16 start_cpu, u16 end_cpu."""
    if not len(offs):
        return None
    raw = src.buf[int(offs[0]) + 8:int(ends[0])].tobytes()
    if len(raw) < 6:
        return None
    kind, nr = struct.unpack_from("<HH", raw)
    if kind == 0 and len(raw) >= 4 + 2 * nr:
        return set(struct.unpack_from(f"<{nr}H", raw, 4)) or None
    if kind == 1 and len(raw) >= 6:
        long_size = struct.unpack_from("<H", raw, 4)[0]
        start = 6 if long_size == 4 else 8
        if long_size not in (4, 8) or len(raw) < start + nr * long_size:
            return None
        words = struct.unpack_from(f"<{nr}{'I' if long_size == 4 else 'Q'}", raw, start)
        return {w * 8 * long_size + b for w, v in enumerate(words) for b in range(8 * long_size)
                if v >> b & 1} or None
    if kind == 2 and len(raw) >= 8:
        lo, hi = struct.unpack_from("<HH", raw, 4)
        return set(range(lo, hi + 1)) if hi >= lo and hi - lo < 1 << 16 else None
    return None


__all__ = ["PERF_MAGIC", "PerfAttr", "PerfHeader", "PerfRead", "RECORD_NAMES", "read_header",
           "read_perf_data", "walk_records"]
