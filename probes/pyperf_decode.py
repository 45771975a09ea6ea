"""Decode what the ``pyperf`` probe copied out of its perf rings (:mod:`harmony.probes.pyperf`):
``records.raw``, the records of every CPU's ring as the kernel wrote them, chunk after chunk
(each chunk a ring's whole records, each ring's in time order), into the canonical events table.

Layout (include/uapi/linux/perf_event.h; little endian): a record is ``u32 type, u16 misc, u16
size`` and size - 8 bytes. The probe's samples (PERF_RECORD_SAMPLE, 9) hold what its
``sample_type`` asks, in the kernel's order (IDENTIFIER, IP, TID, TIME, ADDR, ID, STREAM_ID, CPU,
PERIOD, then RAW: ``u32 size``, the tracepoint's payload as the ftrace ring buffer holds it);
the probe asks TIME, CPU and RAW (:data:`harmony.probes.pyperf_ring.SAMPLE_TYPE`).
PERF_RECORD_LOST (2) is ``u64 id, u64 lost``, then the sample_id trailer (sample_id_all: TID,
TIME, ID, STREAM_ID, CPU, IDENTIFIER as asked): the samples a full ring could not take.

Which event a sample is: its payload's ``common_type`` (the tracepoint's id), as in the ftrace
ring buffer. The payloads are decoded by the ring-buffer decoder
(:func:`harmony.probes.ringbuf_decode.decode_source`) with the format files the probe saved:
the same column rules as the tracefs probe's and a perf.data's. Every stamp is on the perf clock;
:func:`harmony.probes.pyperf_clock.to_mono` puts it on CLOCK_MONOTONIC with the clock ties the
probe measured, before the samples are put in time order (the events of one instant by CPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.core.errors import TraceCorrupt
from harmony.probes.formats import EventFormat, HeaderPage
from harmony.probes.perf_read import RECORD_NAMES, by_time_then_cpu, walk_records
from harmony.probes.pyperf_clock import to_mono
from harmony.probes.ringbuf_decode import decode_source, prefault_for_pages
from harmony.probes.ringbuf_pages import PageSource, read_uint
from harmony.probes.ringbuf_walk import Records
from harmony.probes.schema import make_events
from harmony.probes.tracedat_read import map_file

REC_LOST, REC_SAMPLE = 2, 9
# sample_type bits, in the order a sample holds their fields (each one u64; CPU: u32 cpu, u32 res)
SAMPLE_IDENTIFIER, SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME = 1 << 16, 1 << 0, 1 << 1, 1 << 2
SAMPLE_ADDR, SAMPLE_ID, SAMPLE_STREAM_ID, SAMPLE_CPU = 1 << 3, 1 << 6, 1 << 9, 1 << 7
SAMPLE_PERIOD, SAMPLE_READ, SAMPLE_CALLCHAIN, SAMPLE_RAW = 1 << 8, 1 << 4, 1 << 5, 1 << 10
_FIXED = (SAMPLE_IDENTIFIER, SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_ADDR, SAMPLE_ID,
          SAMPLE_STREAM_ID, SAMPLE_CPU, SAMPLE_PERIOD)
#: the sample_id trailer of other records, in its order
_TRAILER = (SAMPLE_TID, SAMPLE_TIME, SAMPLE_ID, SAMPLE_STREAM_ID, SAMPLE_CPU, SAMPLE_IDENTIFIER)


def sample_layout(sample_type: int) -> dict[str, int]:
    """Where a sample's time, CPU and RAW size are, in bytes from its record's start; ValueError
    for a sample_type this decoder does not read (no TIME, CPU or RAW; READ or CALLCHAIN)."""
    if sample_type & (SAMPLE_READ | SAMPLE_CALLCHAIN):
        raise ValueError(f"sample_type {sample_type:#x}: READ and CALLCHAIN are not read")
    missing = [n for b, n in ((SAMPLE_TIME, "TIME"), (SAMPLE_CPU, "CPU"), (SAMPLE_RAW, "RAW"))
               if not sample_type & b]
    if missing:
        raise ValueError(f"sample_type {sample_type:#x} lacks {', '.join(missing)}")
    at, out = 8, {}
    for bit in _FIXED:
        if sample_type & bit:
            if bit == SAMPLE_TIME:
                out["time"] = at
            elif bit == SAMPLE_CPU:
                out["cpu"] = at
            at += 8
    out["raw_size"] = at
    return out


def lost_cpu_from_end(sample_type: int) -> int:
    """Bytes from a LOST record's end back to the CPU of its sample_id trailer."""
    after = [b for b in _TRAILER[_TRAILER.index(SAMPLE_CPU):] if sample_type & b]
    return 8 * len(after)


class _Records(PageSource):
    """The records file as the decoder's one "page": messages name its byte offsets."""

    def __init__(self, path: Path, buf: np.ndarray):
        super().__init__(buf, max(1, len(buf)), np.zeros(1, np.int64), np.zeros(1, np.int64),
                         [str(path)], np.zeros(1, np.int64))
        self.parts_in_time_order = False

    def where(self, page: int, byte_in_page: int | None = None) -> str:
        return f"{self.files[0]}: record at file offset {int(byte_in_page or 0)}"


@dataclasses.dataclass
class RingRecords:
    """What the records of the rings held: the events table and the rest."""

    events: pd.DataFrame
    lost_by_cpu: dict[int, int]        # the LOST records' counts, by the CPU of their trailer
    records: dict[str, int]            # records by type name
    n_samples: int
    bytes: int
    decoder: str
    notes: list[str]


def decode_records(path: Path, sample_type: int, formats: dict[int, EventFormat],
                   hp: HeaderPage, tie_start: dict, tie_stop: dict | None) -> RingRecords:
    """Decode ``path`` (see the module docstring); TraceCorrupt naming it and the offset of
    the first record that does not fit."""
    path = Path(path)
    try:
        lay = sample_layout(sample_type)
    except ValueError as exc:
        raise TraceCorrupt(f"{path}: {exc}") from None
    data = map_file(path)
    size = len(data)
    if size % 8:
        raise TraceCorrupt(f"{path}: truncated: {size} bytes is not a whole number of records "
                           "(each a multiple of 8 bytes)")
    prefault_for_pages(size)
    buf = np.frombuffer(data, np.uint8) if size else np.zeros(0, np.uint8)
    offs, types, sizes, bad = walk_records(buf)
    if bad >= 0:
        raise TraceCorrupt(f"{path}: truncated or corrupt record at file offset {bad} (its size "
                           "runs past the file, or is below 8 bytes)")
    counts = np.bincount(np.minimum(types, 255).astype(np.int64), minlength=256)
    records = {RECORD_NAMES.get(t, f"type {t}"): int(c) for t, c in enumerate(counts) if c}
    src = _Records(path, buf)
    ends = offs + sizes
    s = np.flatnonzero(types == REC_SAMPLE)
    s_off, s_end = offs[s], ends[s]
    short = np.flatnonzero(s_off + lay["raw_size"] + 4 > s_end)
    if short.size:
        raise TraceCorrupt(f"{path}: corrupt sample at file offset {int(s_off[short[0]])}: "
                           f"{int(s_end[short[0]] - s_off[short[0]])} bytes, too short for its "
                           "fields")
    raw_size = read_uint(src, s_off + lay["raw_size"], 4)
    raw_pos = s_off + lay["raw_size"] + 4
    over = np.flatnonzero(raw_pos + raw_size > s_end)
    if over.size:
        raise TraceCorrupt(f"{path}: corrupt sample at file offset {int(s_off[over[0]])}: its "
                           "payload runs past the record")
    perf_ts = read_uint(src, s_off + lay["time"], 8)
    cpu = read_uint(src, s_off + lay["cpu"], 4)
    if len(cpu) and int(cpu.max()) > np.iinfo(np.int16).max:
        bad_cpu = int(np.argmax(cpu))
        raise TraceCorrupt(f"{path}: corrupt sample at file offset {int(s_off[bad_cpu])}: CPU "
                           f"{int(cpu[bad_cpu])}")
    cpu = cpu.astype(np.int16)
    notes: list[str] = []
    ts = to_mono(perf_ts, cpu, tie_start, tie_stop)
    del perf_ts
    order, ts = by_time_then_cpu(ts, cpu)
    raw_pos, raw_size, cpu = raw_pos[order], raw_size[order], cpu[order]
    decoder = "numpy"
    if formats and len(raw_pos):
        ctype = next(iter(formats.values())).field("common_type")
        at, width = (ctype.offset, ctype.size) if ctype is not None else (0, 2)
        fits = raw_size >= at + width
        code = np.where(fits, read_uint(src, raw_pos + at, width), -2).astype(np.int32)
        short = np.flatnonzero(~fits)
        walked = Records(raw_pos, raw_size.astype(np.int32), ts, cpu, np.zeros(1, np.int64),
                         np.zeros(1, bool), code, int(short[0]) if short.size else -1)
        dec = decode_source(src, formats, hp, walked=walked)
        events, decoder = dec.events, dec.decoder
        notes.extend(dec.notes)
    else:
        events = make_events({})
        if len(raw_pos):
            notes.append(f"{len(raw_pos)} samples but no format to decode them with")
    lost_by_cpu: dict[int, int] = {}
    li = np.flatnonzero(types == REC_LOST)
    if len(li):
        lo, le = offs[li], ends[li]
        back = lost_cpu_from_end(sample_type)
        if (le - lo < 24 + back).any():
            first = int(lo[np.flatnonzero(le - lo < 24 + back)[0]])
            raise TraceCorrupt(f"{path}: corrupt PERF_RECORD_LOST at file offset {first}")
        lost = read_uint(src, lo + 16, 8)
        where = (read_uint(src, le - back, 4) if back else np.full(len(li), -1, np.int64))
        for c, n in zip(where.tolist(), lost.tolist()):
            lost_by_cpu[int(c)] = lost_by_cpu.get(int(c), 0) + int(n)
    other = {k: v for k, v in records.items() if k not in ("SAMPLE", "LOST")}
    if other:
        notes.append(f"records other than samples and lost counts in the rings: {other}")
    return RingRecords(events, dict(sorted(lost_by_cpu.items())), records, int(len(s)), size,
                       decoder, notes)


__all__ = ["RingRecords", "decode_records", "lost_cpu_from_end", "sample_layout"]
