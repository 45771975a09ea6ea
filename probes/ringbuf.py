"""Decode raw ftrace ring-buffer pages (``per_cpu/cpuN/trace_pipe_raw``) into the canonical tables.

The decoder never loops over events in Python, and has two engines giving the same tables (tested
against each other; :mod:`harmony.core.jit` picks one). Large traces: compiled kernels
(:mod:`ringbuf_jit`) walk each page once and write every column of every record in one pass.
Otherwise numpy: all pages of all CPUs are walked in lockstep (step k looks at the k-th record of
every page that still has records), the data records found are put back into (page, position)
order with one O(n) scatter, and every field is gathered with one fancy-indexing pass per (event
type, field). Both merge the CPUs with one stable sort on the timestamps and take every offset from
the format files. The cpuN.raw files are mapped, not copied (:mod:`filemap`).

It is built in layers, each using only those before it (and the compiled kernels):

- :mod:`ringbuf_pages`: the pages in memory (:class:`~harmony.probes.ringbuf_pages.PageSource`)
- :mod:`ringbuf_walk`: every data record of every page (the page and record layout is
  documented there)
- :mod:`ringbuf_fields`: one field of many records at once (integers, strings)
- :mod:`ringbuf_decode`: the records -> the events and markers tables, in time order
- this module, the recording: its meta.json (:func:`load_meta`) and cpu<N>.raw files
  (:func:`raw_files`), a tracefs probe's directory (meta.json, formats/, cpu<N>.raw) -> a
  :class:`Capture` (:func:`decode_dir`), and the meta keys of every capture decoded from pages, a
  trace.dat's too (:func:`capture_meta`)
"""

from __future__ import annotations

import json
from pathlib import Path

from harmony.core.osutil import format_cpulist
from harmony.probes.base import NOT_NS_CLOCKS, Capture, TraceCorrupt
from harmony.probes.formats import (
    FormatError,
    check_page_layout,
    load_formats_dir,
    load_header_event,
    load_header_page,
)
from harmony.probes.ringbuf_decode import Decoded, decode_source, prefault_for_pages
from harmony.probes.ringbuf_pages import PageSource


def load_meta(d: Path) -> dict:
    """The recording's meta.json (a JSON object); TraceCorrupt naming it if it is not one."""
    p = d / "meta.json"
    try:
        meta = json.loads(p.read_text())
    except OSError as e:
        raise TraceCorrupt(f"{p}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise TraceCorrupt(f"{p}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise TraceCorrupt(f"{p}: not a JSON object")
    return meta


#: CPU numbers a recording may list: 0 .. MAX_CPUS - 1 (the kernel's largest NR_CPUS)
MAX_CPUS = 8192
#: the largest page (sub-buffer) size, as trace.dat files are read (tracedat_read)
MAX_PAGE_SIZE = 1 << 24


def raw_files(d: Path, meta: dict) -> dict[int, Path]:
    """cpu -> cpu<N>.raw for the CPUs the recording lists (or finds)."""
    d = Path(d)
    cpus = meta.get("cpus")
    if cpus is None:
        cpus = sorted(int(p.stem[3:]) for p in d.glob("cpu*.raw") if p.stem[3:].isdigit())
    if not isinstance(cpus, list) or not all(type(c) is int and 0 <= c < MAX_CPUS for c in cpus):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad cpus list {str(cpus)[:100]}")
    return {c: d / f"cpu{c}.raw" for c in cpus}


def _meta_text(meta: dict, key: str, default, d: Path):
    """meta[key], which must be a string (``default`` if absent); TraceCorrupt naming meta.json."""
    value = meta.get(key, default)
    if not isinstance(value, str):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad {key} {str(value)[:100]}")
    return value


def _stat_int(stats: dict, key: str) -> int:
    try:
        return int(str(stats.get(key, 0)).split()[0])
    except (ValueError, IndexError):
        return 0


#: beyond this many CPUs with pages that follow lost events, one note says them all (a line per
#: CPU, on a 128-CPU host that lost events everywhere, buried the report's other notes)
MANY_LOSS_NOTES = 4


def lost_events(cpus, dec: Decoded, stats: dict) -> tuple[dict[int, int], list[str]]:
    """({cpu: events lost}, notes) of ring-buffer pages decoded (a tracefs recording, a
    trace.dat): the pages' own count of each CPU, or the kernel's per-CPU statistics
    (``stats``, by CPU as int or str: overrun, commit overrun, dropped events), which also give
    the number a flagged page did not store; -1 where neither says how many. A note per CPU
    whose pages follow lost events, or one for all of them beyond :data:`MANY_LOSS_NOTES`."""
    lost: dict[int, int] = {}
    for c in cpus:
        page_lost = dec.lost_by_cpu.get(c, 0)
        st = stats.get(c, stats.get(str(c))) if isinstance(stats, dict) else None
        if isinstance(st, dict) and st:
            overrun = _stat_int(st, "overrun")
            other = _stat_int(st, "commit overrun") + _stat_int(st, "dropped events")
            lost[c] = -1 if page_lost < 0 and not (overrun or other) else \
                max(page_lost, overrun) + other
        else:
            lost[c] = page_lost
    missed = {c: n for c, n in sorted(dec.missed_pages_by_cpu.items()) if n}

    def events(cs) -> str:
        unknown = [c for c in cs if dec.lost_by_cpu.get(c, 0) < 0]
        known = sum(max(0, dec.lost_by_cpu.get(c, 0)) for c in cs)
        if len(unknown) == len(cs):
            return "count not stored"
        return f"{known} events" + (f"; count not stored on CPUs {format_cpulist(unknown)}"
                                    if unknown else "")

    if len(missed) <= MANY_LOSS_NOTES:
        notes = [f"CPU {c}: {n} pages follow lost events ({events([c])})"
                 for c, n in missed.items()]
    else:
        notes = [f"CPUs {format_cpulist(missed)}: {sum(missed.values())} pages follow lost "
                 f"events ({events(list(missed))}; each CPU's count in lost_by_cpu)"]
    return lost, notes


def capture_meta(dec: Decoded, nbytes: int, probe: str, clock: str, enabled: list[str],
                 lost_by_cpu: dict[int, int], page_size: int, notes: list[str]) -> dict:
    """The meta keys of every capture decoded from ring-buffer pages (a tracefs recording, a
    trace.dat file); ``lost_events`` is -1 (unknown) if any CPU's count is."""
    return {
        "probe": probe,
        "clock": clock,
        "events_enabled": enabled,
        "lost_events": (-1 if any(v < 0 for v in lost_by_cpu.values())
                        else sum(lost_by_cpu.values())),
        "lost_by_cpu": lost_by_cpu,
        "bytes": int(nbytes),
        "n_events": int(len(dec.events)),
        "n_markers": int(len(dec.markers)),
        "n_records": dec.n_records,
        "unknown_event_types": {str(k): v for k, v in dec.unknown.items()},
        "page_size": page_size,
        "decoder": dec.decoder,
        "notes": notes,
    }


def decode_dir(out_dir: Path) -> Capture:
    """Decode a tracefs recording directory (meta.json, formats/, cpu<N>.raw) into a Capture."""
    return decode_recording(out_dir)[0]


def decode_recording(out_dir: Path) -> tuple[Capture, Decoded]:
    """:func:`decode_dir`, and the decoder's own result (what the capture does not keep, such
    as the markers' ips)."""
    d = Path(out_dir)
    meta = load_meta(d)
    try:
        page_size = int(meta.get("page_size", 4096))
    except (TypeError, ValueError):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad page_size {meta.get('page_size')!r}") from None
    if page_size <= 0 or page_size % 8 or page_size > MAX_PAGE_SIZE:
        raise TraceCorrupt(f"{d / 'meta.json'}: bad page_size {page_size}")
    fdir = d / "formats"
    hp = load_header_page(fdir / "header_page")
    try:
        check_page_layout(hp, page_size)
    except FormatError as exc:
        raise TraceCorrupt(f"{fdir / 'header_page'}: {exc}") from None
    load_header_event(fdir / "header_event")
    formats = load_formats_dir(fdir)
    files = raw_files(d, meta)
    for c, p in files.items():
        if not p.exists():
            raise TraceCorrupt(f"{p}: missing (meta.json lists CPU {c})")
    prefault_for_pages(sum(p.stat().st_size for p in files.values()))
    src = PageSource.from_files(files, page_size)
    dec = decode_source(src, formats, hp)

    notes = [str(n) for n in meta["notes"]] if isinstance(meta.get("notes"), list) else []
    notes.extend(dec.notes)
    enabled = meta.get("events_enabled", [])
    if not isinstance(enabled, list) or not all(isinstance(e, str) for e in enabled):
        raise TraceCorrupt(f"{d / 'meta.json'}: bad events_enabled {str(enabled)[:100]}")
    have = {f"{f.system}/{f.name}" for f in formats.values()}
    missing = [e for e in enabled if e not in have]
    if missing:
        notes.append(f"no format stored for enabled events {missing}; "
                     "their records cannot be decoded")

    lost_by_cpu, loss_notes = lost_events(files, dec, meta.get("stats") or {})
    notes += loss_notes
    clock = _meta_text(meta, "clock", "local", d)
    if clock in NOT_NS_CLOCKS:
        notes.append(f"trace clock {clock!r} counts {NOT_NS_CLOCKS[clock]}, not ns")
    out_meta = capture_meta(dec, len(src.buf), "tracefs", clock, enabled, lost_by_cpu, page_size,
                            notes)
    for k in ("kernel", "cpus"):
        if k in meta:
            out_meta[k] = meta[k]
    return Capture(events=dec.events, markers=dec.markers, meta=out_meta), dec


__all__ = ["capture_meta", "decode_dir", "decode_recording", "load_meta", "raw_files"]
