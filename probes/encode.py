"""Canonical events -> ftrace ring-buffer pages: a tracefs recording directory for a capture that
has none (a perf run, an imported perf.data, a simulated run), so that it exports to trace.dat
(:func:`harmony.probes.tracedat_write.write_tracedat`) like a tracefs capture.

What the events table keeps is what the pages get. Each event is written with a fixed layout of
this module (the sched formats of a 5.x kernel, every comm a ``char[16]``, stored in the
recording's ``formats/`` as any kernel's are); an event outside the seven sched tracepoints is
written with the columns the decoder reads from any event (comm, pid, prio, orig_cpu,
target_cpu). Markers become ftrace ``print`` events on their CPU. What the table does not keep is
not in the pages either: ``common_flags`` and ``common_preempt_count`` are 0, a switch-out's
"preempted" flag (``R+``) is gone, an exit's ``group_dead`` field is absent. Decoding the
directory gives the events table back as it was (the tests check it).

Lost events: a CPU's count goes into its stats (``dropped events``), as tracefs keeps them. A
count that is not per CPU (perf counts lost samples per event type) goes to the first CPU's, and
:func:`write_recording` returns a note saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harmony.store import atomic_write

PAGE_SIZE = 4096
_DATA = 16                           # page header: u64 time stamp, 8-byte commit
_EXTEND = 30                         # time-extend record type
_DELTA_BITS = 27
_MAX_INLINE = 28 * 4                 # longest payload whose length fits the record header
MAX_MARKER = 1024                    # marker text bytes kept (a record must fit a page)
_PRINT_ID = 5
_PRINT_BUF = 16                      # print's buf[]: after the common fields and ip


def header_page(page_size: int) -> str:
    """The ``header_page`` file of pages of ``page_size`` bytes (as tracefs words it)."""
    return ("\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
            "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
            "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
            f"\tfield: char data;\toffset:{_DATA};\tsize:{page_size - _DATA};\tsigned:0;\n")


HEADER_EVENT = ("# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n"
                "\tarray       :   32 bits\n\n\tpadding     : type == 29\n"
                "\ttime_extend : type == 30\n\ttime_stamp : type == 31\n"
                "\tdata max type_len  == 28\n")

_COMMON = ("\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
           "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
           "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
           "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n")

_STATES = ("(REC->prev_state & ((((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | "
           "0x0040) + 1) << 1) - 1)) ? __print_flags(REC->prev_state & ((((0x0000 | 0x0001 | "
           "0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040) + 1) << 1) - 1), \"|\", "
           "{ 0x0001, \"S\" }, { 0x0002, \"D\" }, { 0x0004, \"T\" }, { 0x0008, \"t\" }, "
           "{ 0x0010, \"X\" }, { 0x0020, \"Z\" }, { 0x0040, \"P\" }, { 0x0080, \"I\" }) : \"R\", "
           "REC->prev_state & (((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | "
           "0x0040) + 1) << 1) ? \"+\" : \"\"")

# event -> (payload bytes, fields: (C declaration, offset, canonical column), print fmt); sizes
# and signedness follow from the declaration (char[16]: a string; long: 8 bytes; else 4)
_WAKEUP = (36, (("char comm[16]", 8, "comm"), ("pid_t pid", 24, "pid"), ("int prio", 28, "prio"),
                ("int target_cpu", 32, "target_cpu")),
           '"comm=%s pid=%d prio=%d target_cpu=%03d", REC->comm, REC->pid, REC->prio, '
           'REC->target_cpu')
LAYOUTS = {
    "sched_switch": (64, (("char prev_comm[16]", 8, "prev_comm"),
                          ("pid_t prev_pid", 24, "prev_pid"),
                          ("int prev_prio", 28, "prev_prio"), ("long prev_state", 32, "prev_state"),
                          ("char next_comm[16]", 40, "comm"), ("pid_t next_pid", 56, "pid"),
                          ("int next_prio", 60, "prio")),
                     '"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s '
                     'next_pid=%d next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, '
                     + _STATES + ', REC->next_comm, REC->next_pid, REC->next_prio'),
    "sched_migrate_task": (40, (("char comm[16]", 8, "comm"), ("pid_t pid", 24, "pid"),
                                ("int prio", 28, "prio"), ("int orig_cpu", 32, "orig_cpu"),
                                ("int dest_cpu", 36, "target_cpu")),
                           '"comm=%s pid=%d prio=%d orig_cpu=%d dest_cpu=%d", REC->comm, REC->pid, '
                           'REC->prio, REC->orig_cpu, REC->dest_cpu'),
    "sched_wakeup": _WAKEUP,
    "sched_wakeup_new": _WAKEUP,
    "sched_waking": _WAKEUP,
    "sched_process_fork": (48, (("char parent_comm[16]", 8, "prev_comm"),
                                ("pid_t parent_pid", 24, "prev_pid"),
                                ("char child_comm[16]", 28, "comm"),
                                ("pid_t child_pid", 44, "pid")),
                           '"comm=%s pid=%d child_comm=%s child_pid=%d", REC->parent_comm, '
                           'REC->parent_pid, REC->child_comm, REC->child_pid'),
    "sched_process_exit": (32, (("char comm[16]", 8, "comm"), ("pid_t pid", 24, "pid"),
                                ("int prio", 28, "prio")),
                           '"comm=%s pid=%d prio=%d", REC->comm, REC->pid, REC->prio'),
    # the scheduler's softirq (harmony.probes.schema.CAUSE_EVENTS): the vector, in prio
    "irq:softirq_entry": (12, (("unsigned int vec", 8, "prio"),), '"vec=%u", REC->vec'),
    "irq:softirq_exit": (12, (("unsigned int vec", 8, "prio"),), '"vec=%u", REC->vec'),
}
#: any other event: the columns the decoder reads from an event it has no rule for
GENERIC = (40, (("char comm[16]", 8, "comm"), ("pid_t pid", 24, "pid"), ("int prio", 28, "prio"),
                ("int orig_cpu", 32, "orig_cpu"), ("int target_cpu", 36, "target_cpu")),
           '"comm=%s pid=%d prio=%d orig_cpu=%d target_cpu=%d", REC->comm, REC->pid, REC->prio, '
           'REC->orig_cpu, REC->target_cpu')


def _field_size(decl: str) -> int:
    return 16 if decl.endswith("[16]") else 8 if decl.startswith("long ") else 4


def format_text(name: str, ev_id: int, layout) -> str:
    """The ``format`` file of event ``name`` with ``layout`` (as tracefs words it)."""
    _, fields, fmt = layout
    lines = "".join(f"\tfield:{decl};\toffset:{off};\tsize:{_field_size(decl)};"
                    f"\tsigned:{0 if decl.startswith(('char', 'unsigned')) else 1};\n"
                    for decl, off, _ in fields)
    return f"name: {name}\nID: {ev_id}\nformat:\n{_COMMON}{lines}\nprint fmt: {fmt}\n"


_PRINT_FORMAT = (f"name: print\nID: {_PRINT_ID}\nformat:\n{_COMMON}"
                 "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                 "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n\n"
                 "print fmt: \"%ps: %s\", (void *)REC->ip, REC->buf\n")


def _split_label(label: str) -> tuple[str, str]:
    """(system, name) of an events-table label (bare for the sched system)."""
    system, _, name = label.rpartition(":")
    return system or "sched", name


def _comm_words(cat: pd.Categorical) -> np.ndarray:
    """Each category as a NUL-padded char[16] (cut at 15 bytes, as the kernel's comm), in four
    little-endian u32 words; one row per category, then one of zeros for code -1."""
    raw = [str(s).encode("utf-8", "replace")[:15].ljust(16, b"\0") for s in cat.categories]
    return np.frombuffer(b"".join(raw) + bytes(16), "<u4").reshape(-1, 4)


def _pages(ts: np.ndarray, payload: np.ndarray, page_size: int):
    """Pack records (time stamps in order, payload bytes, multiples of 4) into pages: per record
    its byte in the file, whether a time extend precedes it (and the delta it carries), its header
    bytes and its header's time delta; per page its first time stamp and commit (data bytes)."""
    n = len(ts)
    delta = np.diff(ts, prepend=ts[:1]) if n else np.zeros(0, np.int64)
    ext = delta >= 1 << _DELTA_BITS
    hdr = np.where(payload <= _MAX_INLINE, 4, 8)
    cum = np.cumsum(hdr + payload + 8 * ext)
    cap = page_size - _DATA
    starts = []
    s = 0
    while s < n:    # greedy: as many records as fit; a page's first record needs no extend
        limit = (cum[s - 1] if s else 0) + cap + 8 * int(ext[s])
        starts.append(s)
        s = max(s + 1, int(np.searchsorted(cum, limit, side="right")))
    starts = np.asarray(starts, np.int64)
    page = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    first = np.zeros(n, bool)
    first[starts] = True
    ext &= ~first                                      # the page's time stamp is its own
    size = hdr + payload + 8 * ext
    before = np.cumsum(size) - size                    # bytes before the record, CPU-wide
    pos = page * page_size + _DATA + before - before[starts][page]
    commit = np.add.reduceat(size, starts) if n else np.zeros(0, np.int64)
    return (pos, ext, np.where(ext, delta, 0), hdr, np.where(first | ext, 0, delta),
            ts[starts], commit)


def _cpu_pages(cols: dict, rows: np.ndarray, markers: pd.DataFrame, mrows: np.ndarray,
               layouts: list, ids: np.ndarray, comm_words: dict, page_size: int) -> bytes:
    """One CPU's pages: its events (``rows`` of the events' columns ``cols``, string columns as
    category codes, in time order) and markers (``mrows``)."""
    codes = cols["event"][rows]
    texts = [str(t).encode("utf-8", "replace")[:MAX_MARKER] + b"\n\0"
             for t in markers["text"].to_numpy()[mrows]]
    ts = np.concatenate([cols["ts"][rows], markers["ts"].to_numpy()[mrows]])
    kind = np.concatenate([codes.astype(np.int64), np.full(len(mrows), -1, np.int64)])
    src = np.concatenate([rows, mrows]).astype(np.int64)
    size_of = np.array([lay[0] for lay in layouts] + [0], np.int64)
    payload = np.concatenate([size_of[codes], [(_PRINT_BUF + len(t) + 3) & ~3 for t in texts]])
    order = np.lexsort((kind < 0, ts))                  # a marker after the events of its instant
    ts, kind, src, payload = ts[order], kind[order], src[order], payload[order].astype(np.int64)
    pos, ext, ext_delta, hdr, delta, page_ts, commit = _pages(ts, payload, page_size)
    n_pages = len(page_ts)
    out = np.zeros(n_pages * page_size, np.uint8)
    words = out.view("<u4")
    page_w = np.arange(n_pages) * (page_size // 4)
    words[page_w] = page_ts & 0xFFFFFFFF
    words[page_w + 1] = page_ts >> 32
    words[page_w + 2] = commit
    w = pos // 4
    words[w[ext]] = _EXTEND | ((ext_delta[ext] & ((1 << _DELTA_BITS) - 1)) << 5)
    words[w[ext] + 1] = ext_delta[ext] >> _DELTA_BITS
    w = w + 2 * ext                                    # the record's header word
    inline = hdr == 4
    words[w] = np.where(inline, payload // 4, 0) | (delta << 5)
    words[w[~inline] + 1] = payload[~inline] + 4       # the length word counts itself
    w = w + hdr // 4                                   # the payload's first word
    for k, (_, fields, _) in enumerate(layouts):
        sel = kind == k
        if not sel.any():
            continue
        at, row = w[sel], src[sel]
        words[at] = ids[k]                             # common_type; flags, preempt count 0
        words[at + 1] = cols["common_pid"][row].astype(np.int32).view(np.uint32)
        for decl, off, col in fields:
            if _field_size(decl) == 16:
                c = cols[col][row]
                for j in range(4):
                    words[at + off // 4 + j] = comm_words[col][c, j]
                continue
            v = cols[col][row].astype(np.int64)
            words[at + off // 4] = (v & 0xFFFFFFFF).astype(np.uint32)
            if _field_size(decl) == 8:
                words[at + off // 4 + 1] = ((v >> 32) & 0xFFFFFFFF).astype(np.uint32)
    mpid = markers["pid"].to_numpy()
    for k in np.flatnonzero(kind < 0):                 # markers: few, one at a time
        at, text = int(w[k]), texts[int(np.searchsorted(mrows, src[k]))]
        words[at] = _PRINT_ID
        words[at + 1] = np.int32(mpid[src[k]]).view(np.uint32)
        b = 4 * at + _PRINT_BUF                        # ip is 0
        out[b:b + len(text)] = np.frombuffer(text, np.uint8)
    return out.tobytes()


def write_recording(events: pd.DataFrame, markers: pd.DataFrame, meta: dict, dest: Path,
                    page_size: int = PAGE_SIZE) -> list[str]:
    """Write ``events`` and ``markers`` (canonical tables) as a tracefs recording directory at
    ``dest`` (formats/, cpuN.raw, meta.json) for the CPUs of ``meta["cpus"]`` and every CPU an
    event was recorded on; ``meta`` gives the clock, kernel and lost events. Returns notes for
    the user (what the recording cannot hold as it was)."""
    dest = Path(dest)
    notes = []
    events = events.assign(**{c: events[c].astype("category")
                              for c in ("event", "comm", "prev_comm")
                              if not isinstance(events[c].dtype, pd.CategoricalDtype)})
    labels = [str(c) for c in events["event"].cat.categories]
    layouts = [LAYOUTS.get(lb, GENERIC) for lb in labels]
    ids = np.arange(100, 100 + len(labels), dtype=np.uint32)
    fdir = dest / "formats"
    for lb, lay, ev_id in zip(labels, layouts, ids):
        system, name = _split_label(lb)
        (fdir / system / name).mkdir(parents=True, exist_ok=True)
        (fdir / system / name / "format").write_text(format_text(name, int(ev_id), lay))
    (fdir / "ftrace" / "print").mkdir(parents=True, exist_ok=True)
    (fdir / "ftrace" / "print" / "format").write_text(_PRINT_FORMAT)
    (fdir / "header_page").write_text(header_page(page_size))
    (fdir / "header_event").write_text(HEADER_EVENT)
    comm_words = {col: _comm_words(events[col].cat) for col in ("comm", "prev_comm")}
    # each column once, string ones as their category codes
    cols = {c: (events[c].cat.codes if c in ("event", "comm", "prev_comm") else events[c])
            .to_numpy() for c in events.columns}

    ev_cpu = cols["cpu"].astype(np.int64)
    mk_cpu = markers["cpu"].to_numpy().astype(np.int64)
    cpus = sorted(set(int(c) for c in meta.get("cpus") or []) | set(np.unique(ev_cpu).tolist()))
    cpus = cpus or [0]
    if (mk_cpu < 0).any():
        notes.append(f"{int((mk_cpu < 0).sum())} markers recorded on no known CPU are written "
                     f"on CPU {cpus[0]}")
        mk_cpu = np.where(mk_cpu < 0, cpus[0], mk_cpu)
    long_texts = sum(len(str(t).encode()) > MAX_MARKER for t in markers["text"])
    if long_texts:
        notes.append(f"{long_texts} marker texts cut to {MAX_MARKER} bytes")
    by_cpu = np.argsort(ev_cpu, kind="stable")         # each CPU's events, in time order
    bounds = np.searchsorted(ev_cpu[by_cpu], cpus + [max(cpus) + 1])
    for k, c in enumerate(cpus):
        rows = by_cpu[bounds[k]:bounds[k + 1]]
        mrows = np.flatnonzero(mk_cpu == c)
        data = _cpu_pages(cols, rows, markers, mrows, layouts, ids, comm_words, page_size)
        (dest / f"cpu{c}.raw").write_bytes(data)

    lost = {int(c): int(n) for c, n in (meta.get("lost_by_cpu") or {}).items()}
    total = int(meta.get("lost_events", 0) or 0)
    if total > 0 and sum(lost.values()) < total:
        notes.append(f"{total - sum(lost.values())} lost events counted for no CPU (perf counts "
                     f"them per event type) are written in CPU {cpus[0]}'s stats: a trace.dat "
                     "keeps them per CPU")
        lost[cpus[0]] = lost.get(cpus[0], 0) + total - sum(lost.values())
    elif total < 0:
        notes.append("the capture's lost events were unknown: the trace.dat says none")
    out_meta = {"probe": "tracefs", "encoded_from": meta.get("probe"),
                # the trace clock's name alone (a perf import says "perf (sched_clock, ...)")
                "clock": (str(meta.get("clock") or "mono").split() or ["mono"])[0],
                "page_size": page_size, "cpus": cpus,
                "events_enabled": [f"{s}/{n}" for s, n in map(_split_label, labels)]
                + ["ftrace/print"],
                "stats": {str(c): {"overrun": 0, "commit overrun": 0,
                                   "dropped events": lost.get(c, 0)} for c in cpus}}
    if meta.get("kernel"):
        out_meta["kernel"] = meta["kernel"]
    atomic_write(dest / "meta.json", json.dumps(out_meta, indent=1) + "\n")
    return notes
