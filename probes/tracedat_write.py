"""Write a trace-cmd ``trace.dat`` (file version 6, uncompressed, flyrecord) from a tracefs
recording directory (meta.json, formats/, cpu<N>.raw), so that ``trace-cmd report`` and KernelShark
can open a Harmony capture.

Layout written (all numbers little endian, see trace-cmd.dat.v6(5) and trace-cmd's trace-input.c)::

    "\\x17\\x08\\x44" "tracing" "6\\0"  u8 endian(0)  u8 long size  u32 page size
    "header_page\\0"  u64 size  <events/header_page>
    "header_event\\0" u64 size  <events/header_event>
    u32 n  { u64 size <ftrace/<event>/format> } * n               ftrace system formats
    u32 n_systems { "<system>\\0" u32 n { u64 size <format> } * n } * n_systems
    u32 size "<ip> t tracing_mark_write\\n"...                   kallsyms: the markers' ips
    u32 0                                                         printk formats (none)
    u64 size "<pid> <comm>\\n"...                                 cmdlines
    u32 n_cpus
    "options  \\0"  { u16 id u32 size data } ... u16 0            TRACECLOCK(4), UNAME(5),
                                                                  CPUSTAT(2)
                   TRACECLOCK holds "[clock]\\0" too: trace-cmd 3 parses the option's own bytes,
                   and an empty one made it parse uninitialised memory (raw timestamps, at times)
                   UNAME is "sysname nodename release version machine", as trace-cmd writes it
    "flyrecord\\0"   { u64 offset u64 size } * n_cpus
    u64 size "<trace_clock file with [clock]>"                    read because of the TRACECLOCK
                                                                  option
    <zero padding to a page boundary>  cpu0 pages, cpu1 pages ...  (each page aligned)
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np

from harmony.probes.base import TraceCorrupt
from harmony.probes.formats import load_formats_dir, load_header_event, load_header_page
from harmony.probes.ringbuf import decode_recording, load_meta, raw_files

MAGIC = b"\x17\x08\x44tracing"
OPTION_DONE = 0
OPTION_CPUSTAT = 2
OPTION_TRACECLOCK = 4
OPTION_UNAME = 5


def _cmdlines(events) -> dict[int, str]:
    """pid -> the comm the events last show it with (from pid/comm and prev_pid/prev_comm)."""
    n = len(events)
    if not n:
        return {}
    names: dict[str, int] = {}
    parts = []
    for k, (pid_col, comm_col) in enumerate((("prev_pid", "prev_comm"), ("pid", "comm"))):
        cat = events[comm_col].cat
        remap = np.array([names.setdefault(str(s), len(names)) for s in cat.categories] or [0],
                         np.int64)
        codes = cat.codes.to_numpy().astype(np.int64)
        name = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1)
        parts.append((events[pid_col].to_numpy().astype(np.int64), name, 2 * np.arange(n) + k))
    pid = np.concatenate([p[0] for p in parts])
    name = np.concatenate([p[1] for p in parts])
    when = np.concatenate([p[2] for p in parts])
    empty = names.get("", -2)
    ok = (pid >= 0) & (name >= 0) & (name != empty)
    pid, name, when = pid[ok], name[ok], when[ok]
    order = np.argsort(-when, kind="stable")            # latest first
    uniq, first = np.unique(pid[order], return_index=True)
    strings = list(names)
    return {int(p): strings[int(name[order][i])] for p, i in zip(uniq, first)}


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _option(opt_id: int, data: bytes) -> bytes:
    return struct.pack("<HI", opt_id, len(data)) + data


def kallsyms(marker_ips) -> bytes:
    """The kallsyms section's text: each of the markers' ips named ``tracing_mark_write``.

    A marker is an ``ftrace:print`` record the kernel writes in tracing_mark_write with its own
    address (``_THIS_IP_``) as the ``ip`` field, which trace-cmd prints through kallsyms
    ("print: tracing_mark_write: harmony t0"). A Harmony capture's print records are all trace
    marker writes: it records in a tracefs instance of its own, where ``trace_printk`` (the
    other writer of print records) never writes. Each ip is listed as the symbol's address
    itself: libtraceevent resolves an address between two symbols, or equal to one."""
    return "".join(f"{ip:016x} t tracing_mark_write\n" for ip in sorted(set(marker_ips))).encode()


#: the UNAME sysname of a simulated run's export: the release "simulated", the version the
#: reference policy (not Linux's: nothing in it was recorded by a kernel)
SIMULATOR_SYSNAME = "Harmony-simulator"


def uname_text(meta: dict) -> str:
    """The UNAME option's text: ``meta["uname"]`` (the recording's, as trace-cmd writes it:
    sysname nodename release version machine), else built from the facts meta has, each one
    not known written as "-" (the kernel release alone: "Linux - 6.18.44 - -")."""
    if meta.get("uname"):
        return str(meta["uname"])
    return " ".join(str(meta.get(k) or "-") for k in ("sysname", "nodename", "kernel",
                                                       "kernel_build", "machine"))


def write_tracedat(raw_dir: Path, dest_path: Path, facts: dict | None = None) -> Path:
    """Write ``dest_path`` (trace.dat v6) from the recording in ``raw_dir``; return dest_path.
    ``facts``: what the recording's meta.json lacks about its host, for the UNAME option
    (:func:`uname_text`'s keys).

    Raises TraceCorrupt (naming the file) if the recording cannot be decoded.
    """
    d = Path(raw_dir)
    dest = Path(dest_path)
    meta = load_meta(d)
    page_size = int(meta.get("page_size", 4096))
    fdir = d / "formats"
    hp = load_header_page(fdir / "header_page")
    load_header_event(fdir / "header_event")
    header_page = (fdir / "header_page").read_bytes()
    header_event = (fdir / "header_event").read_bytes()
    formats = load_formats_dir(fdir)
    files = raw_files(d, meta)
    for c, p in files.items():
        if not p.exists():
            raise TraceCorrupt(f"{p}: missing (meta.json lists CPU {c})")
        if p.stat().st_size % page_size:
            raise TraceCorrupt(f"{p}: truncated: {p.stat().st_size} bytes is not a whole number "
                               f"of {page_size}-byte pages")
    # decoding validates every page and gives the pid -> comm table
    cap, dec = decode_recording(d)
    cmdlines = _cmdlines(cap.events)

    long_size = hp.commit_size
    out = bytearray()
    out += MAGIC + b"6\0" + bytes([0, long_size]) + _u32(page_size)
    out += b"header_page\0" + _u64(len(header_page)) + header_page
    out += b"header_event\0" + _u64(len(header_event)) + header_event

    by_system: dict[str, list[bytes]] = {}
    for ev_id in sorted(formats):
        f = formats[ev_id]
        by_system.setdefault(f.system, []).append(f.text.encode())
    ftrace = by_system.pop("ftrace", [])
    out += _u32(len(ftrace))
    for text in ftrace:
        out += _u64(len(text)) + text
    out += _u32(len(by_system))
    for system in sorted(by_system):
        out += system.encode() + b"\0" + _u32(len(by_system[system]))
        for text in by_system[system]:
            out += _u64(len(text)) + text
    syms = kallsyms(dec.marker_ips)
    out += _u32(len(syms)) + syms
    out += _u32(0)                                     # printk formats
    cl = "".join(f"{pid} {comm}\n" for pid, comm in sorted(cmdlines.items())).encode()
    out += _u64(len(cl)) + cl

    n_cpus = (max(files) + 1) if files else 0
    out += _u32(n_cpus)
    clock_text = f"[{meta.get('clock', 'local')}]\n".encode()
    out += b"options  \0"
    out += _option(OPTION_TRACECLOCK, clock_text + b"\0")
    host = {"sysname": "Linux", **(facts or {}), **{k: v for k, v in meta.items() if v}}
    if host.get("uname") or host.get("kernel"):
        out += _option(OPTION_UNAME, uname_text(host).encode() + b"\0")
    stats = meta.get("stats") or {}
    for c in range(n_cpus):
        st = stats.get(str(c)) if isinstance(stats, dict) else None
        if isinstance(st, dict):
            text = f"CPU: {c}\n" + "".join(f"{k}: {v}\n" for k, v in st.items())
            out += _option(OPTION_CPUSTAT, text.encode() + b"\0")
    out += struct.pack("<H", OPTION_DONE)
    out += b"flyrecord\0"
    table_at = len(out)
    out += bytes(16 * n_cpus)                          # offsets/sizes, filled below
    out += _u64(len(clock_text)) + clock_text

    offset = -(-len(out) // page_size) * page_size
    table = []
    for c in range(n_cpus):
        size = files[c].stat().st_size if c in files else 0
        table.append((offset if size else 0, size))
        offset += -(-size // page_size) * page_size
    for c, (off, size) in enumerate(table):
        struct.pack_into("<QQ", out, table_at + 16 * c, off, size)

    tmp = dest.with_name(dest.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(out)
            for c in range(n_cpus):
                off, size = table[c]
                if not size:
                    continue
                fh.write(bytes(off - fh.tell()))
                with open(files[c], "rb") as src:
                    shutil.copyfileobj(src, fh, 1 << 20)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest
