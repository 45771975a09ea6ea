"""Tests of the ring-buffer decoder (harmony.probes.ringbuf) and the format parser.

Hermetic tests build pages by hand with PageBuilder; kernel tests record a small capture into the
tracefs probe's directory layout with record_raw_dir() (also used by test_tracedat.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import COMPILED, IMPLEMENTATIONS, use_implementation

from harmony.probes.base import TraceCorrupt

TRACEFS = Path("/sys/kernel/tracing")


@pytest.fixture(autouse=True, params=IMPLEMENTATIONS)
def decoder(request, monkeypatch):
    """Every test runs with both decoders: the compiled kernels (ringbuf_jit), also split over
    threads, and the numpy one."""
    return use_implementation(request.param, monkeypatch)


SCHED = ("sched_switch", "sched_migrate_task", "sched_wakeup", "sched_wakeup_new", "sched_waking",
         "sched_process_fork", "sched_process_exit")


# --- recording a real capture into the tracefs probe's directory layout ------------------------

def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _drain(path: Path, page_size: int) -> tuple[bytes, list[int]]:
    """Read trace_pipe_raw until it is empty; pad every read to page_size; return (data, read
    sizes)."""
    chunks, sizes = [], []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                b = os.read(fd, page_size)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EINTR):
                    break
                raise
            if not b:
                break
            sizes.append(len(b))
            chunks.append(b + bytes(page_size - len(b)))
    finally:
        os.close(fd)
    return b"".join(chunks), sizes


def record_raw_dir(out: Path, load, tracefs: Path = TRACEFS, tag: str = "") -> dict:
    """Record the sched events + ftrace print of a fresh instance while ``load(marker)`` runs.

    ``marker(text)`` writes to the instance's trace_marker. Stores the probe's directory layout in
    ``out`` and returns meta (plus "read_sizes": {cpu: [bytes per read]}).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    page_size = os.sysconf("SC_PAGE_SIZE")
    inst = tracefs / "instances" / f"harmony-test-{os.getpid()}{tag}"
    enabled = [f"sched/{e}" for e in SCHED if (tracefs / "events/sched" / e).is_dir()]
    cpus = sorted(int(p.name[3:]) for p in (tracefs / "per_cpu").glob("cpu*"))
    os.mkdir(inst)
    try:
        _write(inst / "trace_clock", "mono")
        _write(inst / "buffer_size_kb", "2048")
        for e in enabled:
            _write(inst / "events" / e / "enable", "1")
        marker_fd = os.open(inst / "trace_marker", os.O_WRONLY)

        def marker(text: str) -> None:
            os.write(marker_fd, text.encode())

        try:
            _write(inst / "tracing_on", "1")
            load(marker)
            _write(inst / "tracing_on", "0")
        finally:
            os.close(marker_fd)
        stats, sizes = {}, {}
        for c in cpus:
            text = (inst / "per_cpu" / f"cpu{c}" / "stats").read_text()
            st = {}
            for line in text.splitlines():
                k, _, v = line.partition(":")
                v = v.strip()
                if v and v.split()[0].isdigit() and not k.endswith(" ts"):
                    st[k.strip()] = int(v.split()[0])
            data, sizes[c] = _drain(inst / "per_cpu" / f"cpu{c}" / "trace_pipe_raw", page_size)
            (out / f"cpu{c}.raw").write_bytes(data)
            stats[str(c)] = st
        fdir = out / "formats"
        fdir.mkdir(exist_ok=True)
        for h in ("header_page", "header_event"):
            shutil.copyfile(tracefs / "events" / h, fdir / h)
        for e in enabled + ["ftrace/print"]:
            (fdir / e).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tracefs / "events" / e / "format", fdir / e / "format")
        meta = {"page_size": page_size, "clock": "mono", "cpus": cpus,
                "events_enabled": enabled + ["ftrace/print"], "stats": stats,
                "kernel": os.uname().release}
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
    finally:
        for e in enabled:
            try:
                _write(inst / "events" / e / "enable", "0")
            except OSError:
                pass
        try:
            _write(inst / "tracing_on", "0")
        except OSError:
            pass
        os.rmdir(inst)
    return dict(meta, read_sizes=sizes)


def small_load(marker) -> dict:
    """A few short spinning subprocesses and markers; returns what it did."""
    texts = [f"harmony test marker {i}" for i in range(5)]
    marker(texts[0] + "\n")
    procs = [subprocess.Popen([sys.executable, "-c",
                               "import time\nt=time.time()\nwhile time.time()-t<0.05: pass"])
             for _ in range(3)]
    for i, t in enumerate(texts[1:4], 1):
        marker(t + ("\n" if i % 2 else ""))
    for p in procs:
        p.wait()
    marker(texts[4] + "\n")
    return {"pids": [p.pid for p in procs], "texts": texts}


# --- hermetic: hand-built pages ----------------------------------------------------------------

HEADER_PAGE = """\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
"""
HEADER_EVENT = """# compressed entry header
\ttype_len    :    5 bits
\ttime_delta  :   27 bits
\tarray       :   32 bits

\tpadding     : type == 29
\ttime_extend : type == 30
\ttime_stamp : type == 31
\tdata max type_len  == 28
"""
COMMON = """\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"""
_MASK = ("(((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | "
         "0x00000020 | 0x00000040) + 1) << 1)")
SWITCH_PRINT = ('print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> '
                'next_comm=%s next_pid=%d next_prio=%d", REC->prev_comm, REC->prev_pid, '
                'REC->prev_prio, '
                f'(REC->prev_state & ({_MASK} - 1)) ? '
                f'__print_flags(REC->prev_state & ({_MASK} - 1), "|", '
                '{ 0x00000001, "S" }, { 0x00000002, "D" }) : "R", '
                f'REC->prev_state & {_MASK} ? "+" : "", '
                'REC->next_comm, REC->next_pid, REC->next_prio')

# Today's layouts (6.x) ...
FORMATS_NEW = {
    "sched/sched_switch": ("sched_switch", 372, """\
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;
""", SWITCH_PRINT),
    "sched/sched_migrate_task": ("sched_migrate_task", 371, """\
\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:16;\tsize:4;\tsigned:1;
\tfield:int orig_cpu;\toffset:20;\tsize:4;\tsigned:1;
\tfield:int dest_cpu;\toffset:24;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d prio=%d orig_cpu=%d dest_cpu=%d", __get_str(comm), REC->pid, '
     'REC->prio, REC->orig_cpu, REC->dest_cpu'),
    "sched/sched_wakeup": ("sched_wakeup", 374, """\
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d prio=%d target_cpu=%03d", REC->comm, REC->pid, REC->prio, '
     'REC->target_cpu'),
    "sched/sched_process_fork": ("sched_process_fork", 366, """\
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d child_comm=%s child_pid=%d", __get_str(parent_comm), '
     'REC->parent_pid, __get_str(child_comm), REC->child_pid'),
    "ftrace/print": ("print", 5, """\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;
\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;
""", 'print fmt: "%ps: %s", (void *)REC->ip, REC->buf'),
}

#: FORMATS_NEW, with sched_waking and sched_wakeup_new laid out as sched_wakeup
FORMATS_WAKING = dict(FORMATS_NEW, **{f"sched/{name}": (
    name, ev_id, *FORMATS_NEW["sched/sched_wakeup"][2:])
    for name, ev_id in (("sched_waking", 375), ("sched_wakeup_new", 376))})

# ... and an older kernel's: fixed comm arrays, int prev_state, other IDs, TASK_STATE_MAX flag.
FORMATS_OLD = {
    "sched/sched_switch": ("sched_switch", 300, """\
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:1;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int prev_state;\toffset:32;\tsize:4;\tsigned:1;
\tfield:char next_comm[16];\toffset:36;\tsize:16;\tsigned:1;
\tfield:pid_t next_pid;\toffset:52;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:56;\tsize:4;\tsigned:1;
""", 'print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s '
     'next_pid=%d next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, REC->prev_state & '
     '(2048-1) ? __print_flags(REC->prev_state & (2048-1), "|", { 1, "S"} , { 2, "D" }) : "R", '
     'REC->prev_state & 2048 ? "+" : "", REC->next_comm, REC->next_pid, REC->next_prio'),
    "sched/sched_migrate_task": ("sched_migrate_task", 301, """\
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:1;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int orig_cpu;\toffset:32;\tsize:4;\tsigned:1;
\tfield:int dest_cpu;\toffset:36;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d prio=%d orig_cpu=%d dest_cpu=%d", REC->comm, REC->pid, REC->prio, '
     'REC->orig_cpu, REC->dest_cpu'),
    "sched/sched_wakeup": FORMATS_NEW["sched/sched_wakeup"][:1] + (302,)
                          + FORMATS_NEW["sched/sched_wakeup"][2:],
    "sched/sched_process_fork": ("sched_process_fork", 303, """\
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:1;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:1;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d child_comm=%s child_pid=%d", REC->parent_comm, REC->parent_pid, '
     'REC->child_comm, REC->child_pid'),
    "ftrace/print": FORMATS_NEW["ftrace/print"],
}


def format_text(spec) -> str:
    name, ev_id, fields, pfmt = spec
    return f"name: {name}\nID: {ev_id}\nformat:\n{COMMON}\n{fields}\n{pfmt}\n"


def parsed_formats(table) -> dict:
    from harmony.probes.formats import parse_format
    return {key: parse_format(format_text(spec), system=key.split("/")[0])
            for key, spec in table.items()}


def encode(fmt, values: dict) -> bytes:
    """A record of event ``fmt`` with ``values`` (ints, or str for strings), laid out by its
    format."""
    fixed = max(f.offset + f.size for f in fmt.fields.values())
    out = bytearray(fixed)
    tail = bytearray()
    values = dict(values, common_type=fmt.id)
    for name, f in fmt.fields.items():
        v = values.get(name, 0)
        if f.data_loc:
            s = v.encode() + b"\0"
            struct.pack_into("<I", out, f.offset, (len(s) << 16) | (fixed + len(tail)))
            tail += s
        elif f.is_array and f.array_len:
            s = v.encode()[:f.size] if isinstance(v, str) else bytes(f.size)
            out[f.offset:f.offset + len(s)] = s
        elif f.is_array:                      # flexible array (print buf)
            tail += v.encode() + b"\0"
        else:
            out[f.offset:f.offset + f.size] = int(v).to_bytes(f.size, "little", signed=f.signed)
    return bytes(out + tail)


class PageBuilder:
    """Builds one ring-buffer page the way the kernel lays it out (64-bit, little endian)."""

    def __init__(self, ts: int, page_size: int = 4096):
        self.ts0 = ts
        self.page_size = page_size
        self.data = bytearray()

    def _hdr(self, type_len: int, delta: int) -> bytes:
        assert 0 <= delta < (1 << 27)
        return struct.pack("<I", type_len | (delta << 5))

    def event(self, payload: bytes, delta: int, big: bool = False) -> "PageBuilder":
        n = (len(payload) + 3) & ~3
        payload = payload + bytes(n - len(payload))
        if big or n > 28 * 4:
            self.data += self._hdr(0, delta) + struct.pack("<I", n + 4) + payload
        else:
            self.data += self._hdr(n // 4, delta) + payload
        return self

    def time_extend(self, delta: int) -> "PageBuilder":
        self.data += self._hdr(30, delta & ((1 << 27) - 1)) + struct.pack("<I", delta >> 27)
        return self

    def time_stamp(self, ts: int) -> "PageBuilder":
        self.data += self._hdr(31, ts & ((1 << 27) - 1)) + struct.pack("<I", ts >> 27)
        return self

    def discarded(self, length: int, delta: int) -> "PageBuilder":
        """A discarded event turned into padding: array[0] = length - 4, time_delta kept (!= 0)."""
        assert length % 4 == 0 and length >= 8 and delta
        self.data += self._hdr(29, delta) + struct.pack("<I", length - 4) + bytes(length - 8)
        return self

    def page(self, missed: int | None = None, stored: bool = True,
             end_padding: bool = False) -> bytes:
        commit = len(self.data)
        body = bytearray(self.data)
        if end_padding:              # an end-of-page padding event beyond commit (never read)
            body += self._hdr(29, 0)
        if missed is not None:
            commit |= 1 << 31
            if stored:
                commit |= 1 << 30
                body[len(self.data):len(self.data)] = struct.pack("<Q", missed)
        page = struct.pack("<Qq", self.ts0,
                           commit if commit < (1 << 63) else commit - (1 << 64)) + body
        assert len(page) <= self.page_size, "page overflow"
        return page + bytes(self.page_size - len(page))


def write_dir(d: Path, pages_by_cpu: dict, table=FORMATS_NEW, stats=None, page_size=4096,
              extra_meta=None) -> Path:
    d = Path(d)
    (d / "formats").mkdir(parents=True, exist_ok=True)
    (d / "formats/header_page").write_text(HEADER_PAGE)
    (d / "formats/header_event").write_text(HEADER_EVENT)
    for key, spec in table.items():
        (d / "formats" / key).mkdir(parents=True, exist_ok=True)
        (d / "formats" / key / "format").write_text(format_text(spec))
    for cpu, pages in pages_by_cpu.items():
        (d / f"cpu{cpu}.raw").write_bytes(b"".join(pages))
    meta = {"page_size": page_size, "clock": "mono", "cpus": sorted(pages_by_cpu),
            "events_enabled": [k for k in table], "kernel": "test"}
    if stats is not None:
        meta["stats"] = stats
    meta.update(extra_meta or {})
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def known_capture(table=FORMATS_NEW):
    """Pages for two CPUs covering every record kind; returns (pages_by_cpu, expected rows,
    markers)."""
    f = parsed_formats(table)
    sw, mg, wk, fk, pr = (f["sched/sched_switch"], f["sched/sched_migrate_task"],
                          f["sched/sched_wakeup"], f["sched/sched_process_fork"], f["ftrace/print"])
    flag = 0x100 if table is FORMATS_NEW else 2048
    rows, marks = [], []
    T0 = 1_000_000_000
    # CPU 0, page 1: plain events, a time extend, a big (type_len 0) marker, a discarded record
    b = PageBuilder(T0)
    b.event(encode(sw, dict(common_pid=10, prev_comm="a", prev_pid=10, prev_prio=120,
                            prev_state=flag, next_comm="bee", next_pid=11, next_prio=100)), 5)
    rows.append((T0 + 5, 0, "sched_switch", 10, 11, "bee", 100, 10, "a", 120, 0, -1, -1))
    b.event(encode(wk, dict(common_pid=11, comm="cat-dog", pid=12, prio=110, target_cpu=1)), 7)
    rows.append((T0 + 12, 0, "sched_wakeup", 11, 12, "cat-dog", 110, -1, "", -1, -1, -1, 1))
    b.time_extend(3 << 27 | 9)                                   # needs the array word
    b.event(encode(sw, dict(common_pid=11, prev_comm="bee", prev_pid=11, prev_prio=100,
                            prev_state=1, next_comm="0123456789abcdef", next_pid=0,
                            next_prio=120)), 1)
    t = T0 + 12 + (3 << 27 | 9) + 1
    rows.append((t, 0, "sched_switch", 11, 0, "0123456789abcdef", 120, 11, "bee", 100, 1, -1, -1))
    b.discarded(24, 4)                                           # its delta still counts
    t += 4
    long_text = "x" * 150
    b.event(encode(pr, dict(common_pid=0, ip=0xffffffff81000000, buf=long_text + "\n")), 2)
    t += 2
    marks.append((t, 0, 0, long_text))
    b.event(encode(pr, dict(common_pid=0, ip=1, buf="short")), 3, big=True)   # forced type_len 0
    t += 3
    marks.append((t, 0, 0, "short"))
    b.event(encode(mg, dict(common_pid=21, comm="mover", pid=12, prio=110, orig_cpu=0,
                            dest_cpu=1)), 0)
    rows.append((t, 0, "sched_migrate_task", 21, 12, "mover", 110, -1, "", -1, -1, 0, 1))
    p0 = b.page(end_padding=True)
    # CPU 0, page 2: missed events (count stored), fork with two strings, an absolute time stamp
    T1 = T0 + 10_000_000_000
    b = PageBuilder(T1)
    b.event(encode(fk, dict(common_pid=12, parent_comm="cat-dog", parent_pid=12,
                            child_comm="kitten", child_pid=13)), 0)
    rows.append((T1, 0, "sched_process_fork", 12, 13, "kitten", -1, 12, "cat-dog", -1, -1, -1, -1))
    b.time_stamp(T1 + 1000)
    b.event(encode(sw, dict(common_pid=12, prev_comm="cat-dog", prev_pid=12, prev_prio=110,
                            prev_state=2 | flag, next_comm="kitten", next_pid=13,
                            next_prio=120)), 0)
    rows.append((T1 + 1000, 0, "sched_switch", 12, 13, "kitten", 120, 12, "cat-dog", 110, 2,
                 -1, -1))
    p1 = b.page(missed=7)
    # CPU 1: one event on a page that says "events were missed" without a count; a zero page
    b = PageBuilder(T0 + 6)
    b.event(encode(wk, dict(common_pid=-1 & 0x7fffffff, comm="bee", pid=11, prio=100,
                            target_cpu=0)), 0)
    rows.append((T0 + 6, 1, "sched_wakeup", 0x7fffffff, 11, "bee", 100, -1, "", -1, -1, -1, 0))
    p2 = b.page(missed=0, stored=False)
    rows.sort(key=lambda r: r[0])   # stable: ties keep cpu order
    return {0: [p0, p1], 1: [p2, bytes(4096)]}, rows, marks


COLS = ("ts", "cpu", "event", "common_pid", "pid", "comm", "prio", "prev_pid", "prev_comm",
        "prev_prio", "prev_state", "orig_cpu", "target_cpu")


def rows_of(df):
    return [tuple(r) for r in df[list(COLS)].astype(object).itertuples(index=False)]


@pytest.mark.parametrize("release_pages", [1, 4096])
@pytest.mark.parametrize("table", [FORMATS_NEW, FORMATS_OLD], ids=["new-layout", "old-layout"])
def test_known_answer(tmp_path, monkeypatch, table, release_pages):
    """Every event, marker and lost count of a known capture, also when the walk reads its pages
    one at a time (the pages' headers, lost counts among them, read a chunk at a time)."""
    from harmony.probes import ringbuf_walk
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.schema import check_events
    monkeypatch.setattr(ringbuf_walk, "RELEASE_PAGES", release_pages)
    pages, rows, marks = known_capture(table)
    cap = decode_dir(write_dir(tmp_path, pages, table))
    check_events(cap.events)
    assert rows_of(cap.events) == rows
    got_marks = [tuple(r) for r in cap.markers.astype(object).itertuples(index=False)]
    assert got_marks == marks
    m = cap.meta
    assert m["probe"] == "tracefs" and m["clock"] == "mono"
    assert m["lost_by_cpu"] == {0: 7, 1: -1}
    assert m["lost_events"] == -1
    assert m["n_events"] == len(rows)
    assert m["bytes"] == 4 * 4096
    assert str(cap.events["event"].dtype) == "category"
    assert str(cap.events["comm"].dtype) == "category"


def test_lost_from_stats(tmp_path):
    from harmony.probes.ringbuf import decode_dir
    pages, _, _ = known_capture()
    stats = {"0": {"entries": 0, "overrun": 3, "commit overrun": 1, "dropped events": 2},
             "1": {"entries": 0, "overrun": 5, "commit overrun": 0, "dropped events": 0}}
    cap = decode_dir(write_dir(tmp_path, pages, stats=stats))
    # CPU 0: pages say 7 lost (> overrun 3) + 1 commit overrun + 2 dropped; CPU 1: overrun gives
    # the count
    assert cap.meta["lost_by_cpu"] == {0: 10, 1: 5}
    assert cap.meta["lost_events"] == 15
    assert any("pages follow lost events" in n for n in cap.meta["notes"])
    # pages flagged with no stored count while the kernel's counters say 0: unknown, as the
    # trace.dat reader says for the same pages, never 0
    stats["1"]["overrun"] = 0
    cap = decode_dir(write_dir(tmp_path / "zero", pages, stats=stats))
    assert cap.meta["lost_by_cpu"] == {0: 10, 1: -1} and cap.meta["lost_events"] == -1


def test_losses_on_many_cpus_are_one_note():
    """A note per CPU whose pages follow lost events, up to MANY_LOSS_NOTES CPUs; beyond, one
    note for all (128 lines buried the report's other notes), each CPU's count kept in
    lost_by_cpu."""
    from harmony.probes.ringbuf import MANY_LOSS_NOTES, lost_events
    from harmony.probes.ringbuf_decode import Decoded

    def decoded(lost):
        return Decoded(None, None, lost, {c: 2 for c in lost}, {}, [], 0)

    few = {c: 5 for c in range(MANY_LOSS_NOTES)} | {MANY_LOSS_NOTES - 1: -1}
    lost, notes = lost_events(sorted(few), decoded(few), {})
    assert lost == few
    assert notes[0] == "CPU 0: 2 pages follow lost events (5 events)"
    assert notes[-1] == f"CPU {MANY_LOSS_NOTES - 1}: 2 pages follow lost events (count not stored)"
    many = {c: 5 for c in range(128)} | {7: -1, 9: -1}
    stats = {7: {"overrun": 4}}                  # the kernel counts what CPU 7's pages did not
    lost, notes = lost_events(range(130), decoded(many), stats)
    assert lost == many | {7: 4, 128: 0, 129: 0}
    assert notes == ["CPUs 0-127: 256 pages follow lost events (630 events; count not stored on "
                     "CPUs 7,9; each CPU's count in lost_by_cpu)"]


def test_empty_and_zero_pages(tmp_path):
    from harmony.probes.ringbuf import decode_dir
    cap = decode_dir(write_dir(tmp_path, {0: [bytes(4096)] * 3, 1: []}))
    assert len(cap.events) == 0 and len(cap.markers) == 0
    assert cap.meta["lost_events"] == 0 and cap.meta["n_events"] == 0


def test_unknown_event_type_is_reported(tmp_path):
    from harmony.probes.ringbuf import decode_dir
    f = parsed_formats(FORMATS_NEW)
    b = PageBuilder(100)
    b.event(struct.pack("<HBBi", 999, 0, 0, 5) + bytes(8), 1)
    b.event(encode(f["sched/sched_wakeup"], dict(common_pid=1, comm="x", pid=2, prio=3,
                                                 target_cpu=0)), 1)
    cap = decode_dir(write_dir(tmp_path, {0: [b.page()]}))
    assert list(cap.events["event"]) == ["sched_wakeup"]
    assert cap.meta["unknown_event_types"] == {"999": 1}
    assert any("999" in n for n in cap.meta["notes"])
    assert not any("ftrace-internal" in n for n in cap.meta["notes"])    # unknown: not ftrace's


def test_process_wait_names_the_waited_for_pid_not_the_waiter(tmp_path):
    """sched_process_wait's comm and prio are the waiter's (current), its pid the child's: the row
    is about the child (pid) and must not pair the child's pid with its parent's comm."""
    from harmony.probes.formats import parse_format
    from harmony.probes.ringbuf import decode_dir
    wait = ("sched_process_wait", 390, """\
\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:16;\tsize:4;\tsigned:1;
""", 'print fmt: "comm=%s pid=%d prio=%d", __get_str(comm), REC->pid, REC->prio')
    table = dict(FORMATS_NEW, **{"sched/sched_process_wait": wait})
    fmt = parse_format(format_text(wait), system="sched")
    b = PageBuilder(100)
    b.event(encode(fmt, dict(common_pid=7, comm="parent", pid=42, prio=120)), 1)
    cap = decode_dir(write_dir(tmp_path, {0: [b.page()]}, table))
    assert rows_of(cap.events) == [(101, 0, "sched_process_wait", 7, 42, "", -1, -1, "", -1, -1,
                                    -1, -1)]


def test_ftrace_internal_records_are_skipped_with_a_note(tmp_path):
    """Records of an ftrace event other than print (here a made-up "bputs" format) are neither
    events nor markers: they are counted in a note."""
    from harmony.probes.ringbuf import decode_dir
    table = dict(FORMATS_NEW, **{"ftrace/bputs": ("bputs", 6, "\tfield:unsigned long ip;\toffset:8;"
                                                  "\tsize:8;\tsigned:0;\n", 'print fmt: "%ps"')})
    f = parsed_formats(table)
    b = PageBuilder(100)
    for k in range(3):
        b.event(encode(f["ftrace/bputs"], dict(common_pid=1, ip=k)), 1)
    b.event(encode(f["sched/sched_wakeup"], dict(common_pid=1, comm="x", pid=2, prio=3,
                                                 target_cpu=0)), 1)
    b.event(encode(f["ftrace/print"], dict(common_pid=0, ip=1, buf="hello\n")), 1)
    cap = decode_dir(write_dir(tmp_path, {0: [b.page()]}, table=table))
    assert list(cap.events["event"]) == ["sched_wakeup"] and list(cap.markers["text"]) == ["hello"]
    assert any(n.startswith("3 ftrace-internal records") for n in cap.meta["notes"])


@pytest.mark.parametrize("release_pages", [1, 4096])
def test_record_too_short_for_its_type_id(tmp_path, monkeypatch, release_pages):
    """A record whose data (type_len 0, length word 4: no data at all) cannot hold the event type
    id: a clear error naming the file and page, on the second page of the second CPU (also when
    the walk goes a page at a time, releasing each behind it)."""
    from harmony.probes import ringbuf_walk
    from harmony.probes.ringbuf import decode_dir
    monkeypatch.setattr(ringbuf_walk, "RELEASE_PAGES", release_pages)
    pages, _, _ = known_capture()
    b = PageBuilder(2_000_000_000)
    b.event(encode(parsed_formats(FORMATS_NEW)["sched/sched_wakeup"],
                   dict(common_pid=1, comm="x", pid=2, prio=3, target_cpu=0)), 1)
    b.data += struct.pack("<II", 0 | (1 << 5), 4)
    pages[1][1] = b.page()
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(write_dir(tmp_path, pages))
    msg = _one_line(e)
    assert "cpu1.raw: page 1 " in msg and "too short for an event header" in msg


def test_padding_of_short_reads_is_harmless(tmp_path):
    """A short read padded with zeros: commit bounds the data, the zeros are never decoded."""
    from harmony.probes.ringbuf import decode_dir
    pages, rows, _ = known_capture()
    p0 = pages[0][0]
    commit = struct.unpack_from("<Q", p0, 8)[0] & ((1 << 27) - 1)
    short = p0[:16 + commit] + bytes(4096 - 16 - commit)
    cap = decode_dir(write_dir(tmp_path, {0: [short]}))
    assert len(cap.events) + len(cap.markers) == 6


# --- corrupt input -----------------------------------------------------------------------------

def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_truncated_file(tmp_path):
    from harmony.probes.ringbuf import decode_dir
    pages, _, _ = known_capture()
    d = write_dir(tmp_path, pages)
    raw = (d / "cpu0.raw").read_bytes()
    (d / "cpu0.raw").write_bytes(raw[:5000])
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(d)
    assert "cpu0.raw" in _one_line(e) and "truncated" in str(e.value)


@pytest.mark.parametrize("release_pages", [1, 4096])
@pytest.mark.parametrize("damage", ["commit", "record", "big_length", "padding_length"])
def test_corrupt_page(tmp_path, monkeypatch, damage, release_pages):
    from harmony.probes import ringbuf_walk
    from harmony.probes.ringbuf import decode_dir
    monkeypatch.setattr(ringbuf_walk, "RELEASE_PAGES", release_pages)
    pages, _, _ = known_capture()
    p = bytearray(pages[1][0])
    if damage == "commit":
        struct.pack_into("<Q", p, 8, 5000)
    elif damage == "record":       # first event claims 28 words but the commit ends sooner
        struct.pack_into("<Q", p, 8, 8)
        struct.pack_into("<I", p, 16, 28 | (1 << 5))
    elif damage == "big_length":
        struct.pack_into("<I", p, 16, 0)
        struct.pack_into("<I", p, 20, 100000)
    elif damage == "padding_length":
        struct.pack_into("<I", p, 16, 29 | (1 << 5))
        struct.pack_into("<I", p, 20, 3)
    pages[1][0] = bytes(p)
    d = write_dir(tmp_path, pages)
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(d)
    assert "cpu1.raw: page 0 " in _one_line(e)


def test_corrupt_string_location(tmp_path):
    from harmony.probes.ringbuf import decode_dir
    f = parsed_formats(FORMATS_NEW)
    rec = bytearray(encode(f["sched/sched_migrate_task"], dict(comm="abc", pid=1)))
    struct.pack_into("<I", rec, 8, (200 << 16) | 28)        # 200-byte string in a 32-byte record
    b = PageBuilder(1).event(bytes(rec), 1)
    d = write_dir(tmp_path, {0: [b.page()]})
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(d)
    assert "cpu0.raw" in _one_line(e) and "comm" in str(e.value)


def test_dynamic_strings_of_any_length(tmp_path):
    """__data_loc strings (a migration's comm here; sched_stat_runtime's since kernel 6.10) of
    every length: those that fit the compiled gather's keys interned by it, longer ones (past 16
    bytes) decoded apart, both in one column, in the order of the events."""
    from harmony.probes.ringbuf import decode_dir
    f = parsed_formats(FORMATS_NEW)
    mg, sw = f["sched/sched_migrate_task"], f["sched/sched_switch"]
    names = ["a", "0123456789abcde", "0123456789abcdef", "0123456789abcdefg", "y" * 40, "a",
             "y" * 40, "", "0123456789abcdefg"]
    b = PageBuilder(1000)
    for k, name in enumerate(names):
        b.event(encode(mg, dict(common_pid=7, comm=name, pid=100 + k, prio=120, orig_cpu=0,
                                dest_cpu=1)), 1)
        b.event(encode(sw, dict(common_pid=7, prev_comm="p", prev_pid=7, next_comm="q",
                                next_pid=8)), 1)
    cap = decode_dir(write_dir(tmp_path, {0: [b.page()]}))
    mig = cap.events[cap.events["event"] == "sched_migrate_task"]
    assert mig["comm"].astype(str).tolist() == names
    assert mig["pid"].tolist() == [100 + k for k in range(len(names))]
    sw_rows = cap.events[cap.events["event"] == "sched_switch"]
    assert set(sw_rows["comm"].astype(str)) == {"q"} and set(sw_rows["prev_comm"]) == {"p"}


@pytest.mark.parametrize("what", ["meta", "meta_json", "header_page", "format", "raw"])
def test_missing_or_bad_files(tmp_path, what):
    from harmony.probes.ringbuf import decode_dir
    pages, _, _ = known_capture()
    d = write_dir(tmp_path, pages)
    if what == "meta":
        (d / "meta.json").unlink()
        name = "meta.json"
    elif what == "meta_json":
        (d / "meta.json").write_text("{not json")
        name = "meta.json"
    elif what == "header_page":
        (d / "formats/header_page").unlink()
        name = "header_page"
    elif what == "format":
        (d / "formats/sched/sched_switch/format").write_text("name: sched_switch\nID: x\n")
        name = "sched_switch/format"
    else:
        (d / "cpu1.raw").unlink()
        name = "cpu1.raw"
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(d)
    assert name in _one_line(e)


def test_events_of_one_instant_come_by_cpu_whatever_the_probe():
    from harmony.probes.schema import make_events
    ev = make_events({"ts": [5, 3, 5, 5, 5], "cpu": [1, 0, 0, 1, 0], "pid": [1, 2, 3, 4, 5]})
    # by ts, an instant's events by CPU, one CPU's events of an instant in the order given
    assert list(ev["ts"]) == [3, 5, 5, 5, 5] and list(ev["cpu"]) == [0, 0, 0, 1, 1]
    assert list(ev["pid"]) == [2, 3, 5, 1, 4]
    given = make_events({"ts": [3, 5, 5], "cpu": [1, 0, 1], "pid": [7, 8, 9]})
    assert list(given["pid"]) == [7, 8, 9]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("runs", [1, 2, 3, 8, 9, 40])
def test_merged_order_is_a_stable_argsort(runs, threads, monkeypatch):
    """Time-ordered runs (one per CPU) merged as numpy's stable argsort orders them, ties to the
    earlier run; more runs than the merge takes fall back to argsort; in order already: None.
    Two runs are merged in parts on threads (here however few the records)."""
    from harmony.probes.ringbuf_decode import merged_order
    from harmony.probes.ringbuf_walk import compiled
    monkeypatch.setenv("HARMONY_THREADS", str(threads))
    monkeypatch.setattr("harmony.core.jit.PARALLEL_MIN_ITEMS", 1)
    rng = np.random.default_rng(runs)
    for _ in range(40):
        parts = [np.sort(rng.integers(0, 40, rng.integers(0, 25))) for _ in range(runs)]
        ts = np.concatenate(parts).astype(np.int64)
        order = merged_order(ts, compiled(1 << 40))
        if order is None:
            assert (np.diff(ts) >= 0).all()
        else:
            assert np.array_equal(order, np.argsort(ts, kind="stable"))


# --- format parsing ----------------------------------------------------------------------------

def test_format_parsing_and_preempt_flag():
    from harmony.probes.formats import (
        parse_format,
        preempt_flag_from_print_fmt,
        sched_switch_preempt_flag,
    )
    new = parsed_formats(FORMATS_NEW)
    old = parsed_formats(FORMATS_OLD)
    assert sched_switch_preempt_flag(new["sched/sched_switch"]) == (0x100, None)
    assert sched_switch_preempt_flag(old["sched/sched_switch"]) == (2048, None)
    c = new["sched/sched_migrate_task"].fields["comm"]
    assert c.data_loc and c.is_string and c.offset == 8
    c = old["sched/sched_migrate_task"].fields["comm"]
    assert not c.data_loc and c.array_len == 16 and c.offset == 8
    assert new["sched/sched_switch"].fields["prev_state"].size == 8
    assert old["sched/sched_switch"].fields["prev_state"].size == 4
    buf = new["ftrace/print"].fields["buf"]
    assert buf.is_array and buf.array_len is None
    # fallback when the term cannot be evaluated
    odd = parse_format(format_text(("sched_switch", 1, "",
                                    'print fmt: "x", REC->prev_state & TASK_REPORT_MAX ? '
                                    '"+" : ""')), "sched")
    flag, note = sched_switch_preempt_flag(odd)
    assert flag == 0x100 and note
    assert preempt_flag_from_print_fmt('"%s", (REC->prev_state & (0x0100UL)) ? "+" : ""') == 0x100


def test_real_kernel_formats_parse(kernel):
    from harmony.probes.formats import load_format, load_header_page, sched_switch_preempt_flag
    hp = load_header_page(kernel / "events/header_page")
    assert hp.data_offset == hp.commit_offset + hp.commit_size
    sw = load_format(kernel / "events/sched/sched_switch/format")
    flag, note = sched_switch_preempt_flag(sw)
    assert note is None and flag & (flag - 1) == 0


# --- real kernel -------------------------------------------------------------------------------

def test_real_capture_decodes(kernel, tmp_path):
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.schema import check_events
    info = {}
    meta = record_raw_dir(tmp_path, lambda m: info.update(small_load(m)), kernel)
    # every read of trace_pipe_raw returned one whole page
    assert all(s == meta["page_size"] for sizes in meta["read_sizes"].values() for s in sizes)
    cap = decode_dir(tmp_path)
    check_events(cap.events)
    assert cap.meta["lost_events"] == 0, cap.meta
    assert list(cap.markers["text"]) == info["texts"]
    ev = cap.events
    for pid in info["pids"]:
        assert ((ev["event"] == "sched_process_fork") & (ev["pid"] == pid)).sum() == 1
        assert ((ev["event"] == "sched_process_exit") & (ev["pid"] == pid)).sum() == 1
        assert ((ev["event"] == "sched_switch") & (ev["pid"] == pid)).any()
    sw = ev[ev["event"] == "sched_switch"]
    assert set(np.unique(sw["prev_state"])) <= {0, 1, 2, 4, 8, 16, 32, 64, 128}
    assert (sw["comm"].astype(str) != "").all()
    assert not cap.meta["unknown_event_types"]


@pytest.mark.parametrize("decoder", COMPILED, indirect=True)  # each compared with numpy
def test_decoders_agree_on_real_capture(kernel, tmp_path, monkeypatch, decoder):
    """The compiled and the numpy decoder give the same tables, row for row, on a real capture
    (its CPUs' records interleave in time, so the cross-CPU merge is exercised too), also when
    the compiled one splits its input over threads."""
    import pandas as pd

    from harmony.probes.ringbuf import decode_dir
    record_raw_dir(tmp_path, lambda m: small_load(m), kernel)
    got = {}
    for name, flag in (("compiled", "1"), ("numpy", "0")):
        monkeypatch.setenv("HARMONY_JIT", flag)
        got[name] = decode_dir(tmp_path)
    a, b = got["compiled"], got["numpy"]
    # small_load forks, switches and reaps a few tasks: a few dozen events of several kinds
    assert len(a.events) >= 20 and a.events["event"].nunique() >= 3, \
        a.events["event"].value_counts()
    for col in a.events.columns:  # categories may be numbered differently: compare the values
        assert (a.events[col].astype(object).to_numpy()
                == b.events[col].astype(object).to_numpy()).all(), col
    pd.testing.assert_frame_equal(a.markers, b.markers)
    assert (a.meta.pop("decoder"), b.meta.pop("decoder")) == ("compiled", "numpy")
    assert a.meta == b.meta



def test_files_mapped_or_read_give_the_same_buffer(tmp_path, monkeypatch):
    """PageSource maps the cpuN.raw files back to back (probes/filemap.py) and reads them where
    mapping fails: same bytes, same decode."""
    from harmony.probes import filemap, ringbuf, ringbuf_pages
    pages, rows, _ = known_capture(FORMATS_NEW)
    d = write_dir(tmp_path, pages, FORMATS_NEW)
    files = ringbuf.raw_files(d, json.loads((d / "meta.json").read_text()))
    mapped = ringbuf_pages.PageSource.from_files(files, 4096)
    assert not mapped.buf.flags.writeable  # it is the mapping, not a copy
    monkeypatch.setattr(ringbuf_pages, "map_files", lambda paths, sizes: None)
    read = ringbuf_pages.PageSource.from_files(files, 4096)
    assert read.buf.flags.writeable and (read.buf == mapped.buf).all()
    assert bytes(mapped.buf) == b"".join(p.read_bytes() for p in files.values())
    assert rows_of(ringbuf.decode_dir(d).events) == rows
    assert filemap.map_files([files[0]], [files[0].stat().st_size + 1]) is None  # not whole pages


@pytest.mark.parametrize("decoder", ["compiled"], indirect=True)  # the auto mode, checked once
def test_auto_mode_uses_the_compiled_decoder_for_large_traces_only(tmp_path, monkeypatch, decoder):
    """HARMONY_JIT=auto: a small trace is decoded by numpy unless numba is already loaded, a trace
    over ringbuf_walk.JIT_MIN_BYTES by the compiled kernels; the capture says which."""
    from harmony.core.jit import numba_version
    from harmony.probes import ringbuf, ringbuf_walk
    monkeypatch.setenv("HARMONY_JIT", "auto")
    pages, rows, _ = known_capture(FORMATS_NEW)
    d = write_dir(tmp_path, pages, FORMATS_NEW)
    monkeypatch.setattr("harmony.core.jit.numba_loaded", lambda: False)  # as in a new process
    assert ringbuf.decode_dir(d).meta["decoder"] == "numpy"
    monkeypatch.setattr(ringbuf_walk, "JIT_MIN_BYTES", 4096)
    cap = ringbuf.decode_dir(d)
    assert cap.meta["decoder"] == ("compiled" if numba_version() else "numpy")
    assert rows_of(cap.events) == rows



@pytest.mark.parametrize("decoder", COMPILED, indirect=True)
def test_the_gather_releases_the_pages_behind_it_and_decodes_the_same(tmp_path, monkeypatch,
                                                                      decoder):
    """A mapped recording's pages are released behind the compiled gather a chunk of records at
    a time (ringbuf_decode._pages_behind): every byte read after a release comes from the page
    cache again, so the table is the one a decode without releases gives; and the pages are
    released (the source's release is called with ranges inside each CPU's part)."""
    import pandas as pd
    from test_import_export import _stream_to_encode

    from harmony.probes import ringbuf_decode
    from harmony.probes.encode import write_recording
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.ringbuf_pages import PageSource

    events, markers = _stream_to_encode(4, 20_000, 1)
    write_recording(events, markers, {"cpus": [0, 1, 2, 3]}, tmp_path / "rec")
    whole = decode_dir(tmp_path / "rec")
    released = []
    real = PageSource.release

    def spy(self, lo, hi):
        assert self.mapped
        released.append((lo, hi))
        real(self, lo, hi)

    monkeypatch.setattr(PageSource, "release", spy)
    monkeypatch.setattr(ringbuf_decode, "RELEASE_CHUNK", 997)
    chunked = decode_dir(tmp_path / "rec")
    pd.testing.assert_frame_equal(chunked.events, whole.events)
    pd.testing.assert_frame_equal(chunked.markers, whole.markers)
    assert len(released) > 20 and all(hi > lo for lo, hi in released)


@pytest.mark.parametrize("decoder", COMPILED, indirect=True)
def test_the_walk_releases_every_page_behind_each_pass_and_decodes_the_same(tmp_path,
                                                                           monkeypatch, decoder):
    """A mapped recording is walked a few pages at a time (ringbuf_walk.RELEASE_PAGES, here 3),
    each chunk released once read, in each of the walk's two passes (page headers and count,
    then fill): the file is never resident whole (it is mapped without MAP_POPULATE). Every byte
    read after a release comes from the page cache again: the tables are those of the same files
    read into memory (never released)."""
    import pandas as pd
    from test_import_export import _stream_to_encode

    from harmony.probes import ringbuf_decode, ringbuf_pages, ringbuf_walk
    from harmony.probes.encode import write_recording
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.ringbuf_pages import PageSource

    events, markers = _stream_to_encode(4, 20_000, 1)
    write_recording(events, markers, {"cpus": [0, 1, 2, 3]}, tmp_path / "rec")
    with monkeypatch.context() as m:
        m.setattr(ringbuf_pages, "map_files", lambda *a, **k: None)
        read = decode_dir(tmp_path / "rec")
    walking, walked = [], []
    real_release, real_walk = PageSource.release, ringbuf_decode.walk_pages

    def release(self, lo, hi):
        assert self.mapped
        if walking:
            walked.append((lo, hi))
        real_release(self, lo, hi)

    def walk(src, *a, **k):
        walking.append(src)
        try:
            return real_walk(src, *a, **k)
        finally:
            walking.pop()

    monkeypatch.setattr(ringbuf_walk, "RELEASE_PAGES", 3)
    monkeypatch.setattr(PageSource, "release", release)
    monkeypatch.setattr(ringbuf_decode, "walk_pages", walk)
    mapped = decode_dir(tmp_path / "rec")
    pd.testing.assert_frame_equal(mapped.events, read.events)
    pd.testing.assert_frame_equal(mapped.markers, read.markers)
    page, n_pages = 4096, max(hi for _, hi in walked) // 4096
    assert n_pages > 12 and all(0 < hi - lo <= 3 * page and lo % page == 0 for lo, hi in walked)
    times = np.zeros(n_pages, np.int64)     # how often the walk released each page
    for lo, hi in walked:
        times[lo // page:hi // page] += 1
    assert (times == 2).all(), times


def test_an_imported_traces_losses_name_the_cpus_that_lost_any():
    """The note of an imported trace's lost events named every CPU's count, zeros included (a
    dict of 128 entries on a 128-CPU host): it names those that lost any, and beyond
    LOST_CPUS_NAMED how many did and which lost most."""
    from harmony.analysis import trust

    def said(by_cpu):
        lost = sum(v for v in by_cpu.values() if v > 0)
        return trust.word(trust.note("lost_events", lost=lost, by_cpu=by_cpu, origin="imported"))

    assert said({0: 10, 1: 0, "2": -1}) == ("10 events were lost when the trace was recorded (per "
                                            "CPU: 10 on CPU 0, unknown on CPU 2): tables may miss "
                                            "migrations or switches")
    many = {str(c): (c % 3) * 7 for c in range(128)}           # as a manifest's JSON has them
    text = said(many)
    assert "(on 85 CPUs, most on CPU 2: 14; each CPU's count in the manifest's " in text
    assert len(text) < 250
