"""Tests of the trace.dat writer: trace-cmd report must read back exactly what the decoder sees."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import host_skip
from harmony.probes.base import TraceCorrupt

from test_ringbuf import (FORMATS_NEW, FORMATS_OLD, known_capture, record_raw_dir, small_load,
                          write_dir)

TRACE_CMD = shutil.which("trace-cmd")
needs_trace_cmd = pytest.mark.needs_tool("trace-cmd")

LINE = re.compile(r"^\s*(?P<task>.*?)-(?P<pid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+"
                  r"(?P<sec>\d+)\.(?P<frac>\d+):\s+(?P<event>[\w:]+):\s+(?P<rest>.*)$")
IGNORED = re.compile(r"^(cpus=\d+|CPU:\s*\d+ \[.*EVENTS? DROPPED\]|\s*)$")


def report(dat: Path, formats_dir: Path) -> list[dict]:
    """Parse ``trace-cmd report -R -t``: raw field values, full ns timestamps."""
    from harmony.probes.formats import load_formats_dir
    out = subprocess.run([TRACE_CMD, "report", "-R", "-t", "-i", str(dat)], capture_output=True,
                         text=True, errors="replace", timeout=60)
    assert out.returncode == 0, out.stderr
    fmts = {f.name: f for f in load_formats_dir(formats_dir).values()}
    recs = []
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            assert IGNORED.match(line), f"unparsed report line: {line!r}"
            continue
        ev = m.group("event")
        names = [n for n in fmts[ev].fields if not n.startswith("common_")]
        fm = re.match("^" + " ".join(f"{n}=(?P<{n}>.*?)" for n in names) + "$", m.group("rest"))
        assert fm, f"cannot split fields of {line!r}"
        frac = m.group("frac")
        assert len(frac) == 9, line
        recs.append({"ts": int(m.group("sec")) * 10**9 + int(frac), "cpu": int(m.group("cpu")),
                     "event": ev, "task": m.group("task").strip(),
                     "common_pid": int(m.group("pid")), **fm.groupdict()})
    return recs


def expected_event(row) -> tuple:
    return (int(row.ts), int(row.cpu), str(row.event), int(row.common_pid), int(row.pid),
            int(row.prev_pid), int(row.prev_state), int(row.orig_cpu), int(row.target_cpu),
            str(row.comm), str(row.prev_comm))


def reported_event(r: dict, preempt_flag: int) -> tuple:
    ev = r["event"]
    pid = prev_pid = prev_state = orig = target = -1
    comm = prev_comm = ""
    if ev == "sched_switch":
        pid, prev_pid = int(r["next_pid"]), int(r["prev_pid"])
        prev_state = int(r["prev_state"]) & ~preempt_flag
        comm, prev_comm = r["next_comm"], r["prev_comm"]
    elif ev == "sched_migrate_task":
        pid, orig, target, comm = int(r["pid"]), int(r["orig_cpu"]), int(r["dest_cpu"]), r["comm"]
    elif ev in ("sched_wakeup", "sched_wakeup_new", "sched_waking"):
        pid, target, comm = int(r["pid"]), int(r["target_cpu"]), r["comm"]
    elif ev == "sched_process_fork":
        pid, prev_pid, comm, prev_comm = (int(r["child_pid"]), int(r["parent_pid"]),
                                          r["child_comm"], r["parent_comm"])
    elif ev == "sched_process_exit":
        pid, comm = int(r["pid"]), r["comm"]
    return (r["ts"], r["cpu"], ev, r["common_pid"], pid, prev_pid, prev_state, orig, target, comm,
            prev_comm)


def compare_with_report(raw_dir: Path, dat: Path) -> tuple[int, int]:
    """Assert the decoder and trace-cmd report agree record for record; return (events, markers)."""
    from harmony.probes.formats import load_format, sched_switch_preempt_flag
    from harmony.probes.ringbuf import decode_dir
    cap = decode_dir(raw_dir)
    flag, _ = sched_switch_preempt_flag(load_format(raw_dir / "formats/sched/sched_switch/format"))
    recs = report(dat, raw_dir / "formats")
    assert len(recs) == len(cap.events) + len(cap.markers)
    rep_events = [reported_event(r, flag) for r in recs if r["event"] != "print"]
    exp_events = [expected_event(row) for row in cap.events.itertuples(index=False)]
    assert len(rep_events) == len(exp_events)
    for i, (a, b) in enumerate(zip(exp_events, rep_events)):
        assert a == b, f"record {i}: decoder {a} != trace-cmd {b}"
    rep_marks = [(r["ts"], r["cpu"], r["common_pid"], r["buf"])
                 for r in recs if r["event"] == "print"]
    exp_marks = [(int(m.ts), int(m.cpu), int(m.pid), m.text)
                 for m in cap.markers.itertuples(index=False)]
    assert rep_marks == exp_marks
    # cmdlines: tasks whose comm the events name are shown by name, not "<...>"
    named = set(cap.events["pid"]) | set(cap.events["prev_pid"])
    unnamed = [r for r in recs if r["common_pid"] in named and r["task"] == "<...>"]
    assert not unnamed, unnamed[:3]
    return len(exp_events), len(exp_marks)


def test_header_layout(tmp_path):
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, _ = known_capture()
    d = write_dir(tmp_path / "raw", pages)
    dat = write_tracedat(d, tmp_path / "trace.dat")
    b = dat.read_bytes()
    assert b[:10] == b"\x17\x08\x44tracing" and b[10:12] == b"6\0"
    assert b[12] == 0 and b[13] == 8
    assert struct.unpack_from("<I", b, 14)[0] == 4096
    assert b[18:30] == b"header_page\0"
    i = b.index(b"flyrecord\0") + 10
    offs = [struct.unpack_from("<QQ", b, i + 16 * c) for c in range(2)]
    raw0 = (d / "cpu0.raw").read_bytes()
    raw1 = (d / "cpu1.raw").read_bytes()
    assert offs[0][0] % 4096 == 0 and offs[1][0] % 4096 == 0
    assert b[offs[0][0]:offs[0][0] + offs[0][1]] == raw0
    assert b[offs[1][0]:offs[1][0] + offs[1][1]] == raw1
    assert len(b) == offs[1][0] + offs[1][1]
    # the TRACECLOCK option holds the clock, NUL-terminated: trace-cmd 3 parses the option's
    # bytes, and an empty option left it parsing uninitialised memory (now and then it printed
    # raw timestamps, failing the comparison below)
    o = b.index(b"options  \0") + 10
    assert struct.unpack_from("<HI", b, o) == (4, 8) and b[o + 6:o + 14] == b"[mono]\n\0"
    assert b[i + 32:i + 32 + 8 + 7] == struct.pack("<Q", 7) + b"[mono]\n"


def test_corrupt_dir_raises(tmp_path):
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, _ = known_capture()
    d = write_dir(tmp_path / "raw", pages)
    (d / "cpu0.raw").write_bytes((d / "cpu0.raw").read_bytes()[:100])
    with pytest.raises(TraceCorrupt, match="cpu0.raw"):
        write_tracedat(d, tmp_path / "trace.dat")
    assert not (tmp_path / "trace.dat").exists()


@needs_trace_cmd
@pytest.mark.parametrize("table", [FORMATS_NEW, FORMATS_OLD], ids=["new-layout", "old-layout"])
def test_report_agrees_on_hand_built_pages(tmp_path, table):
    """Time extends, absolute stamps, type_len 0 records, discarded records: trace-cmd agrees."""
    from harmony.probes.tracedat_write import write_tracedat
    pages, rows, marks = known_capture(table)
    d = write_dir(tmp_path, pages, table)
    dat = write_tracedat(d, tmp_path / "trace.dat")
    assert compare_with_report(d, dat) == (len(rows), len(marks))


@needs_trace_cmd
def test_markers_read_as_tracing_mark_write(tmp_path):
    """As in a trace-cmd recording: each marker's ip is named in the file's kallsyms, so that
    trace-cmd prints "print: tracing_mark_write: TEXT", not the bare address; the UNAME option
    holds the facts given where the recording has none, unknown ones as "-"."""
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, marks = known_capture()
    d = write_dir(tmp_path / "raw", pages)
    dat = write_tracedat(d, tmp_path / "trace.dat",
                         {"kernel": "6.1.0-9", "kernel_build": "#1 SMP Debian",
                          "machine": "x86_64"})
    out = subprocess.run([TRACE_CMD, "report", "-i", str(dat)], capture_output=True,
                         text=True, errors="replace", timeout=60)
    prints = [line for line in out.stdout.splitlines() if " print: " in line]
    assert len(prints) == len(marks)
    for line, (_, _, _, text) in zip(prints, marks):
        assert re.search(r"print:\s+tracing_mark_write: " + re.escape(text[:40]), line), line
    b = dat.read_bytes()        # the kallsyms section: one line per distinct marker ip
    assert b"ffffffff81000000 t tracing_mark_write\n" in b
    assert b"0000000000000001 t tracing_mark_write\n" in b
    out = subprocess.run([TRACE_CMD, "report", "--uname", "-i", str(dat)], capture_output=True,
                         text=True, timeout=60)
    # the recording's own release (its meta.json's "test") before the one given
    assert "Linux - test #1 SMP Debian x86_64" in out.stdout


def test_an_imports_host_is_what_the_uname_says():
    """"sysname nodename release version... machine": the words known, never "-"."""
    from harmony.importer import recorded_on, uname_facts
    full = "Linux web1 6.1.0-9-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.27-1 x86_64"
    assert uname_facts(full) == {"nodename": "web1", "machine": "x86_64",
                                 "kernel_build": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.27-1"}
    assert recorded_on({"uname": full, "kernel": "6.1.0-9-amd64"}) == \
        "host web1, Linux 6.1.0-9-amd64 (x86_64)"
    old = "Linux - 6.18.44-fc-v1147 - -"                  # Harmony's earlier exports
    assert uname_facts(old) == {}
    assert recorded_on({"uname": old, "kernel": "6.18.44-fc-v1147"}) == "Linux 6.18.44-fc-v1147"
    assert recorded_on({}) == "an unknown host"


@needs_trace_cmd
def test_real_capture_matches_trace_cmd(kernel, tmp_path):
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracedat_write import write_tracedat
    info = {}
    raw = tmp_path / "raw"
    record_raw_dir(raw, lambda m: info.update(small_load(m)), kernel)
    cap = decode_dir(raw)
    assert cap.meta["lost_events"] == 0
    dat = write_tracedat(raw, tmp_path / "trace.dat")
    n_events, n_marks = compare_with_report(raw, dat)
    assert n_events > 50 and n_marks == len(info["texts"])
    # the stats and clock made it into the file
    out = subprocess.run([TRACE_CMD, "report", "--stat", "-i", str(dat)], capture_output=True,
                         text=True, timeout=60)
    assert "overrun: 0" in out.stdout
    # the markers' ip is the kernel's own, inside tracing_mark_write by /proc/kallsyms
    from harmony.probes.ringbuf import decode_recording
    ips = decode_recording(raw)[1].marker_ips
    syms = sorted((int(a, 16), n) for a, _, n, *_ in
                  (line.split() for line in Path("/proc/kallsyms").read_text().splitlines())
                  if int(a, 16))
    if not syms:
        host_skip("/proc/kallsyms shows no addresses (kptr_restrict)")
    import bisect
    assert ips and all(syms[bisect.bisect_right(syms, (ip, "~")) - 1][1] == "tracing_mark_write"
                       for ip in ips), [hex(ip) for ip in ips]


@pytest.mark.parametrize("algo", ["zlib", "zstd"])
def test_a_chunk_decompresses_into_its_place_or_is_named_corrupt(algo, tmp_path):
    """The reader's chunks of both algorithms trace-cmd writes (trace-cmd here offers zstd only),
    each decompressed straight into its slice of the pages: the bytes the header says, else one
    line naming the file."""
    import zlib

    import numpy as np

    from harmony.probes import tracedat_read as tr
    from test_perf_read import _zstd_compress
    data = bytes(range(256)) * 64 + b"\0" * 5000
    packed = zlib.compress(data) if algo == "zlib" else _zstd_compress(data)
    pages = np.full(len(data) + 8, 7, np.uint8)
    out = tr._decompress(tmp_path / "t.dat", algo, packed, len(data), "CPU 0 data chunk 0",
                         into=pages[4:4 + len(data)])
    assert bytes(pages[4:4 + len(data)]) == bytes(out) == data
    assert pages[:4].tolist() == pages[-4:].tolist() == [7] * 4
    for wrong in (len(data) - 1, len(data) + 1):
        with pytest.raises(TraceCorrupt, match=r"t\.dat: corrupt compressed CPU 0 data chunk 0"):
            tr._decompress(tmp_path / "t.dat", algo, packed, wrong, "CPU 0 data chunk 0",
                           into=np.empty(wrong, np.uint8))
