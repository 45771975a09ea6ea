"""``harmony export`` / ``harmony import``: trace.dat (v6, v7 plain and zstd) and perf.data from
elsewhere.

Hermetic tests build trace.dat files from hand-made ring-buffer pages with our writer (and with
``trace-cmd convert`` for version 7); kernel tests record for real: a Harmony run exported and
re-imported must give the same tables, and a capture taken with ``trace-cmd extract`` from a tracefs
instance configured here must import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import harmony
from harmony.cli import main
from harmony.probes.base import TraceCorrupt
from harmony.probes.schema import SCHED_EVENTS

from cli_run import cli
from conftest import ROOT, forks_counted, host_skip, sigint_as_a_terminal, small_tmpfs

from test_ringbuf import (FORMATS_WAKING, PageBuilder, encode, known_capture, parsed_formats,
                          write_dir)

TRACE_CMD = shutil.which("trace-cmd")
PERF = shutil.which("perf")
needs_trace_cmd = pytest.mark.needs_tool("trace-cmd")
TABLES = ("migrations", "runs", "runqueue", "allocation", "shares")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line_error(result, path) -> str:
    """The CLI failed cleanly: exit 1, one 'harmony: error:' line naming ``path``, no traceback."""
    err = result.stderr if hasattr(result, "stderr") else result.output
    assert result.exit_code == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("harmony: error: "), err
    assert str(path) in lines[0] and "Traceback" not in err
    return lines[0]


@pytest.fixture
def writer_dat(tmp_path) -> tuple[Path, Path]:
    """(raw dir, trace.dat v6 written by our writer) of the hand-built capture, with CPU stats."""
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, _ = known_capture()
    stats = {"0": {"entries": 0, "overrun": 3, "commit overrun": 1, "dropped events": 2},
             "1": {"entries": 0, "overrun": 5, "commit overrun": 0, "dropped events": 0}}
    raw = write_dir(tmp_path / "raw", pages, stats=stats)
    return raw, write_tracedat(raw, tmp_path / "trace.dat")


def convert(src: Path, dest: Path, *args) -> Path:
    p = subprocess.run([TRACE_CMD, "convert", "-i", str(src), "-o", str(dest), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return dest


def assert_same_capture(a, b):
    pd.testing.assert_frame_equal(a.events, b.events, check_categorical=False)
    pd.testing.assert_frame_equal(a.markers, b.markers)


# --- the reader --------------------------------------------------------------------------------

def test_reader_agrees_with_the_page_decoder(writer_dat):
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracedat_read import decode_tracedat
    raw, dat = writer_dat
    direct = decode_dir(raw)
    cap, td = decode_tracedat(dat)
    assert td.version == 6 and td.compression == "none" and td.page_size == 4096
    assert [b.name for b in td.buffers] == [""] and set(td.buffers[0].cpus) == {0, 1}
    assert_same_capture(direct, cap)
    # lost events: the pages' missed counts and the CPUSTAT options, as the tracefs probe counts
    # them
    assert cap.meta["lost_by_cpu"] == direct.meta["lost_by_cpu"] == {0: 10, 1: 5}
    assert cap.meta["lost_events"] == 15
    assert cap.meta["clock"] == "mono" and cap.meta["file_version"] == 6
    assert td.cmdlines[12] == "cat-dog"


@needs_trace_cmd
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_reader_reads_version_7(writer_dat, tmp_path, compression):
    from harmony.probes.tracedat_read import decode_tracedat
    _, dat = writer_dat
    v7 = convert(dat, tmp_path / f"v7-{compression}.dat", "--file-version", "7",
                 "--compression", compression)
    assert v7.read_bytes()[10:12] == b"7\0"
    cap6, _ = decode_tracedat(dat)
    cap7, td = decode_tracedat(v7)
    assert td.version == 7 and td.compression == compression
    assert_same_capture(cap6, cap7)
    assert cap7.meta["lost_by_cpu"] == cap6.meta["lost_by_cpu"]


@needs_trace_cmd
def test_compressed_pages_from_a_scratch_file_decode_as_from_memory(writer_dat, tmp_path,
                                                                    monkeypatch):
    """Large compressed pages go through a scratch file (unlinked at once, mapped, released
    behind the decode as a file's pages), small ones into memory: the same capture either way."""
    import tempfile
    from harmony.probes import tracedat_read
    _, dat = writer_dat
    z = convert(dat, tmp_path / "z.dat", "--file-version", "7", "--compression", "zstd")
    cap6, _ = tracedat_read.decode_tracedat(dat)
    td = tracedat_read.read_tracedat(z)
    in_memory, sizes, scratch = tracedat_read.decompressed_pages(td, td.buffers[0])
    assert not scratch and len(in_memory) == sum(sizes.values()) > 0
    scratch_dir = tmp_path / "scratch"
    scratch_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_dir))
    monkeypatch.setattr(tracedat_read, "SCRATCH_FROM", 0)
    monkeypatch.setattr(tracedat_read, "SCRATCH_WRITE", 1)       # one write per chunk
    mapped, sizes2, scratch = tracedat_read.decompressed_pages(td, td.buffers[0])
    assert scratch and sizes2 == sizes and not mapped.flags.writeable
    assert np.array_equal(mapped, in_memory)
    assert list(scratch_dir.iterdir()) == []                     # unlinked at once
    cap, _ = tracedat_read.decode_tracedat(z)
    assert_same_capture(cap6, cap)

    def full(f, n):       # the disk filled up: the pages are decompressed into memory instead
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tracedat_read, "mapped_array", full)
    again, _, scratch = tracedat_read.decompressed_pages(td, td.buffers[0])
    assert not scratch and np.array_equal(again, in_memory)
    assert list(scratch_dir.iterdir()) == []


@needs_trace_cmd
def test_compressed_chunks_decompressed_on_threads_decode_the_same(writer_dat, tmp_path,
                                                                    monkeypatch):
    """The chunks of a compressed buffer are decompressed on threads (one part of the chunks
    each): the same capture, and a bad chunk is named, whichever thread met it."""
    from harmony.probes import tracedat_read
    _, dat = writer_dat
    z = convert(dat, tmp_path / "z.dat", "--file-version", "7", "--compression", "zstd")
    cap6, _ = tracedat_read.decode_tracedat(dat)
    monkeypatch.setattr(tracedat_read, "THREADED_DECOMPRESS", 0)
    monkeypatch.setenv("HARMONY_THREADS", "3")
    td = tracedat_read.read_tracedat(z)
    _, by_cpu = tracedat_read.buffer_chunks(td, td.buffers[0])
    assert sum(len(parts) for parts in by_cpu.values()) >= 2       # parts for two threads
    assert_same_capture(cap6, tracedat_read.decode_tracedat(z)[0])
    start, csize, _ = by_cpu[max(by_cpu)][-1]                       # the last thread's chunk
    data = bytearray(z.read_bytes())
    data[start:start + csize] = bytes(csize)
    z.write_bytes(bytes(data))
    with pytest.raises(TraceCorrupt, match=rf"z\.dat: corrupt compressed CPU {max(by_cpu)} "
                                           rf"data chunk {len(by_cpu[max(by_cpu)]) - 1}"):
        tracedat_read.decode_tracedat(z)


def _writable_tmpfs() -> str:
    """A tmpfs mounted here that this process may write in (skip where there is none)."""
    import psutil
    memory = [p.mountpoint for p in psutil.disk_partitions(all=True) if p.fstype == "tmpfs"
              and os.access(p.mountpoint, os.W_OK)]
    if not memory:
        host_skip("no writable tmpfs mounted here")
    return memory[0]


def test_no_scratch_file_where_it_saves_no_memory_or_lacks_room(tmp_path, monkeypatch):
    import shutil
    from harmony.probes import filemap
    assert filemap.scratch_file(1 << 20, _writable_tmpfs()) is None
    with filemap.scratch_file(1 << 20, tmp_path) as f:
        f.write(b"x" * 4096)
        assert filemap.mapped_array(f, 4096).tolist() == [ord("x")] * 4096
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(1 << 30, 0, 1 << 20))
    assert filemap.scratch_file(1 << 20, tmp_path) is None


@pytest.fixture
def no_reflink(monkeypatch):
    """copy_file's reflink made to fail (an ioctl no file system knows), as on ext4 or a tmpfs:
    the copy tests test the copy, wherever the temporary directory is."""
    from harmony.probes import filemap
    monkeypatch.setattr(filemap, "_FICLONE", 0)


def _resident_bytes(path: Path) -> int:
    """How many of ``path``'s bytes are in the page cache (util-linux fincore)."""
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", str(path)],
                       capture_output=True, text=True, check=True)
    return int(p.stdout.split()[0])


@pytest.mark.needs_tool("fincore")
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 8192 + 17, 1 << 20])
def test_a_copy_goes_past_the_page_cache_whole(no_reflink, tmp_path, size):
    """The trace an import keeps is written with O_DIRECT through a small buffer reused (chunk
    8 KiB here: many chunks, a part block at the end): the same bytes, none of them left in the
    page cache but the last part block, written through it."""
    from harmony.probes import filemap
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(os.urandom(size))
    how = filemap.copy_file(src, dest, chunk=8192)
    if size < 4096:
        assert how == "buffered"                # no whole block to write directly
    elif how != "direct":
        host_skip(f"{tmp_path}'s file system refuses O_DIRECT (copied {how})")
    assert _resident_bytes(dest) <= 4096
    assert dest.read_bytes() == src.read_bytes()


class SetAfter:
    """An event for copy_file's hurry or stop: set once it has been asked ``calls`` times (the
    copy asks once a chunk)."""

    def __init__(self, calls: int):
        self.left = calls

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.mark.needs_tool("fincore")
def test_a_copy_hurried_writes_the_rest_through_the_page_cache(no_reflink, tmp_path):
    """An import hurries its copy once the tables are written: the blocks from there on go
    through the page cache (no wait for the device), those before it did not."""
    from harmony.probes import filemap

    src = tmp_path / "src"
    src.write_bytes(os.urandom(10 * 8192 + 100))
    for calls, how in ((0, "buffered"), (4, "direct, then buffered"), (99, "direct")):
        dest = tmp_path / f"dest-{calls}"
        got = filemap.copy_file(src, dest, chunk=8192, hurry=SetAfter(calls))
        if got == "buffered" and calls:
            host_skip(f"{tmp_path}'s file system refuses O_DIRECT")
        assert got == how
        cached = _resident_bytes(dest)
        assert 10 * 8192 - min(calls, 10) * 8192 <= cached <= 11 * 8192 - min(calls, 10) * 8192
        assert dest.read_bytes() == src.read_bytes()


def test_a_copy_through_short_writes_is_whole(no_reflink, tmp_path, monkeypatch):
    """A write may take fewer bytes than given (a disk filling up): the rest is written, and a
    file system that takes none says no space."""
    from harmony.probes import filemap
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(os.urandom(50000))
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, b, off: real(fd, b[:4096], off))
    assert filemap.copy_file(src, dest, chunk=8192) in ("direct", "buffered")
    assert dest.read_bytes() == src.read_bytes()
    monkeypatch.setattr(os, "pwrite", lambda fd, b, off: 0 if len(b) < 4096 else real(fd, b, off))
    with pytest.raises(OSError, match="No space left on device"):
        filemap.copy_file(src, dest, chunk=8192)


def test_a_copy_stopped_leaves_nothing(no_reflink, tmp_path):
    """An import stopped by an error or a signal stops its copy of the trace between two chunks,
    direct or not, and leaves no part of it."""
    import threading
    from harmony.probes import filemap

    src = tmp_path / "src"
    src.write_bytes(os.urandom(10 * 8192))
    for hurry in (None, threading.Event()):
        if hurry is not None:
            hurry.set()                             # the buffered copy stops too
        with pytest.raises(filemap.CopyStopped, match="stopped at 24576 of 81920 bytes"):
            filemap.copy_file(src, tmp_path / "part", chunk=8192, hurry=hurry,
                              stop=SetAfter(3))
    dest = tmp_path / "run" / "trace.dat"
    with pytest.raises(filemap.CopyStopped):
        filemap.copy_atomically(src, dest, stop=SetAfter(0))
    assert list(dest.parent.iterdir()) == []


@pytest.mark.needs_tool("fincore")
def test_a_copy_onto_a_slow_device_goes_on_through_the_page_cache(no_reflink, tmp_path,
                                                                  monkeypatch):
    """A device that writes the first blocks slower than the import it runs beside gets the
    rest through the page cache (here: every device is too slow after 3 chunks)."""
    from harmony.probes import filemap
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(os.urandom(10 * 8192))
    monkeypatch.setattr(filemap, "DIRECT_PROBE_BYTES", 3 * 8192)
    monkeypatch.setattr(filemap, "DIRECT_MIN_RATE", 1e18)
    got = filemap.copy_file(src, dest, chunk=8192)
    if got == "buffered":
        host_skip(f"{tmp_path}'s file system refuses O_DIRECT")
    assert got == "direct, then buffered" and _resident_bytes(dest) == 7 * 8192
    monkeypatch.setattr(filemap, "DIRECT_MIN_RATE", 0.0)
    assert filemap.copy_file(src, dest, chunk=8192) == "direct"
    assert _resident_bytes(dest) == 0 and dest.read_bytes() == src.read_bytes()


def test_a_copy_where_o_direct_is_refused_goes_through_the_page_cache(no_reflink, tmp_path,
                                                                     monkeypatch):
    from harmony.probes import filemap
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(os.urandom(20000))
    dest.write_bytes(b"x" * 50000)                       # emptied first
    opened = os.open

    def no_direct(path, flags, *mode):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return opened(path, flags, *mode)
    monkeypatch.setattr(os, "open", no_direct)
    assert filemap.copy_file(src, dest) == "buffered"
    assert dest.read_bytes() == src.read_bytes()


@pytest.fixture
def xfs(tmp_path):
    """A 320 MiB XFS (the smallest mkfs.xfs makes) mounted from a sparse file through a loop
    device, which the kernel frees at the unmount."""
    img, mnt = tmp_path / "xfs.img", tmp_path / "xfs"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(320 << 20)
    p = subprocess.run(["mkfs.xfs", "-q", str(img)], capture_output=True, text=True)
    if p.returncode:
        host_skip(f"mkfs.xfs: {p.stderr.strip()}")
    p = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True,
                       text=True)
    if p.returncode:
        host_skip(f"cannot mount an XFS image through a loop device: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.needs_tool("mkfs.xfs", "filefrag")
def test_a_copy_on_a_file_system_that_shares_blocks_copies_nothing(xfs, tmp_path):
    from harmony.probes import filemap
    src, dest = xfs / "trace.dat", xfs / "copy.dat"
    src.write_bytes(os.urandom(1 << 20))
    os.sync()
    assert filemap.copy_file(src, dest) == "reflink"
    assert dest.read_bytes() == src.read_bytes()
    extents = subprocess.run(["filefrag", "-v", str(dest)], capture_output=True, text=True,
                             check=True).stdout
    assert "shared" in extents, extents                 # the blocks are src's
    assert filemap.copy_file(src, tmp_path / "elsewhere") == "direct"     # across file systems


def test_truncated_or_damaged_files_raise_naming_the_file(writer_dat, tmp_path):
    from harmony.probes.tracedat_read import decode_tracedat
    _, dat = writer_dat
    data = dat.read_bytes()
    bad = tmp_path / "bad.dat"
    fly = data.index(b"flyrecord\0")
    for cut in (0, 7, 12, 16, 40, 600, fly + 20, len(data) - 4096 - 100, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(TraceCorrupt, match=re.escape(str(bad))):
            decode_tracedat(bad)
    damaged = bytearray(data)
    damaged[10] = ord("9")                                   # file version 9
    bad.write_bytes(bytes(damaged))
    with pytest.raises(TraceCorrupt, match="version 9 is not supported"):
        decode_tracedat(bad)


@needs_trace_cmd
def test_truncated_version_7_raises(writer_dat, tmp_path):
    from harmony.probes.tracedat_read import decode_tracedat
    _, dat = writer_dat
    data = convert(dat, tmp_path / "v7.dat", "--file-version", "7").read_bytes()
    bad = tmp_path / "bad7.dat"
    for cut in (20, len(data) // 3, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(TraceCorrupt, match=re.escape(str(bad))):
            decode_tracedat(bad)


# --- harmony import / export on hand-built traces ----------------------------------------------

def test_import_reports_lost_events_and_makes_a_run(writer_dat, tmp_path):
    _, dat = writer_dat
    out = tmp_path / "run"
    r = invoke("import", dat, "--comm", "cat-*", "--pid", 11, "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stderr == ""           # no progress line but on a terminal
    run = harmony.load(out)
    m = run.manifest
    assert m["status"] == "complete" and m["source"]["imported"] == str(dat.resolve())
    assert m["source"]["t0_from"] == "first event of the chosen tasks"
    assert sorted(run.tasks["pid"]) == [11, 12]
    assert dict(zip(run.tasks["pid"], run.tasks["name"])) == {11: "bee", 12: "cat-dog"}
    assert m["lost_events"] == 15
    assert any("15 events were lost" in n for n in m["notes"])
    assert any("t0 is the first event" in n for n in m["notes"])
    # no exit, wakeup_new or waking in it: listed, but nothing the analysis needs is missing
    assert m["capture"]["events_missing"] == ["sched_wakeup_new", "sched_waking",
                                              "sched_process_exit"]
    assert not any(n.startswith("the trace holds no") for n in m["notes"])
    # as for a recorded run: the probe's blind spots and the other tasks' load are looked for.
    # CPU 0's idle task was switched in and holds no record; cat-dog (12), woken onto CPU 1 and
    # moved 0 -> 1, shows up on CPU 0 twice with no migration recorded: two moves 1 -> 0
    assert m["capture"]["silent_contexts"] == [
        {"pid": 0, "cpu": 0, "comm": "0123456789abcdef", "runs": 1, "records": 0}]
    moved = m["capture"]["unrecorded_migrations"]
    assert (moved["n"], moved["pids"]) == (2, [12])
    assert [(x["pid"], x["ts"], x["from_cpu"], x["to_cpu"]) for x in moved["examples"]] == [
        (12, 1_402_653_215, 1, 0), (12, 11_000_001_000, 1, 0)]
    assert m["foreign_load"]["max_frac"] == 0.0     # no task but bee and cat-dog ran in the window
    assert (out / "report.md").exists() and (out / "raw/import/trace.dat").exists()
    # t0 = the first event of pid 11 or 12 (CPU 0's first switch, to pid 11)
    assert m["t0_ns"] == 1_000_000_005
    rep = invoke("report", out)
    assert rep.exit_code == 0
    # no release by Harmony in it: the first wake-ups after t0 are not called a release spread
    line = next(ln.strip() for ln in rep.output.splitlines() if "release spread" in ln)
    assert "n/a: no release by Harmony in an imported trace" in line and "confined" not in line
    assert "controller's own threads" not in rep.output      # none ran while it was recorded
    assert m["foreign_load"]["controller_frac_max"] is None
    assert (out / "report.md").read_text().count(line) == 1
    # an imported trace.dat exports as itself
    back = tmp_path / "back.dat"
    assert invoke("export", out, "--out", back).exit_code == 0
    assert back.read_bytes() == dat.read_bytes()
    # the library says what it is doing as each long step starts
    from harmony.importer import import_trace
    steps: list[str] = []
    import_trace(dat, tmp_path / "lib", comms=["cat-*"], pids=[11], progress=steps.append)
    assert steps == [f"reading {dat.name} (0 MB)",
                     f"{m['capture']['n_events']:,} events: rebuilding the tables of 2 tasks",
                     "drawing the figures"]


def test_an_import_without_figures_is_complete_and_its_report_draws_them(writer_dat, tmp_path):
    """--no-figures: the run is complete with the same tables and metrics, no figure drawn and
    the manifest saying they are deferred; the screen and the report say how to draw them, and
    `harmony report` draws the ones an import with figures draws."""
    _, dat = writer_dat
    out, full = tmp_path / "nofig", tmp_path / "full"
    r = invoke("import", dat, "--comm", "cat-*", "--pid", 11, "--no-figures", "--out", out)
    assert r.exit_code == 0, r.output
    assert f"figures: not drawn (`harmony report {out}` draws them)" in r.output
    assert invoke("import", dat, "--comm", "cat-*", "--pid", 11, "--out", full).exit_code == 0
    run, ref = harmony.load(out), harmony.load(full)
    assert run.complete and run.manifest["figures_deferred"] is True
    assert run.manifest["figures"] == [] and not (out / "figures").exists()
    assert "figures" not in run.manifest["timings_s"]
    assert run.summary == ref.summary
    for name in TABLES:
        pd.testing.assert_frame_equal(run.table(name), ref.table(name))
    assert f"Not drawn yet: `harmony report {out}` draws them." in (out / "report.md").read_text()
    rep = invoke("report", out)
    assert rep.exit_code == 0, rep.output
    run = harmony.load(out)
    assert run.manifest["figures_deferred"] is False
    assert run.manifest["figures"] == ref.manifest["figures"]
    assert all((out / f).is_file() for f in run.manifest["figures"])
    assert "Not drawn yet" not in (out / "report.md").read_text()


def test_an_imports_figures_written_by_forked_processes_are_those_written_here(writer_dat,
                                                                             tmp_path,
                                                                             monkeypatch):
    """The figures an import writes, a share each by processes forked for them where the CPUs
    allow (analysis.plots.written_in_parallel), are byte for byte those drawn again one after
    the other in this process."""
    from harmony import pipeline
    from harmony.analysis import plots

    _, dat = writer_dat
    fork = os.fork
    forked = forks_counted(monkeypatch)
    out = tmp_path / "run"
    r = invoke("import", dat, "--comm", "cat-*", "--pid", 11, "--out", out)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    figures = run.manifest["figures"]
    assert len(forked) == min(len(os.sched_getaffinity(0)), len(figures)) - 1
    monkeypatch.setattr(os, "fork", fork)
    one_after_another = plots._write_shares
    monkeypatch.setattr(plots, "_write_shares", lambda held, _: one_after_another(held, 1))
    again = pipeline.draw_figures(run, into=tmp_path / "again")
    assert [Path(p).name for p in again] == [Path(f).name for f in figures]
    for f in figures:
        assert (out / f).read_bytes() == (tmp_path / "again" / f).read_bytes(), f


def test_a_trace_piped_in_is_kept_in_the_run_and_imported(writer_dat, tmp_path, monkeypatch):
    """``perf record -o - ... | harmony import -``: what is piped in is written into the run
    directory as it arrives and imported from there, as a file would be; empty or not a trace,
    it is one line about standard input, and nothing is left where the run would have been."""
    import tempfile
    _, dat = writer_dat
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["import", "-", "--comm", "cat-*", "--pid", "11", "--out",
                                  str(out)], input=dat.read_bytes(), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    stored = out / "raw/import/stdin.dat"
    assert run.manifest["status"] == "complete" and stored.read_bytes() == dat.read_bytes()
    assert run.manifest["source"]["stored"] == "raw/import/stdin.dat"
    assert sorted(run.tasks["pid"]) == [11, 12]
    assert [p.name for p in stored.parent.iterdir()] == ["stdin.dat"]     # no part, no copy
    ref = invoke("import", dat, "--comm", "cat-*", "--pid", 11, "--out", tmp_path / "file")
    assert ref.exit_code == 0
    for name in TABLES:
        pd.testing.assert_frame_equal(run.table(name), harmony.load(tmp_path / "file").table(name))
    # --tasks of a trace piped in: read from a temporary directory, removed after
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tempfile.tempdir = None                        # TMPDIR read again
    try:
        r = CliRunner().invoke(main, ["import", "-", "--tasks"], input=dat.read_bytes())
    finally:
        tempfile.tempdir = None
    assert r.exit_code == 0 and r.stdout.split()[:7] == ["PID", "RUN", "s", "SWITCH-INS",
                                                         "EVENTS", "CPUS", "COMM"], r.output
    assert not list((tmp_path / "tmp").iterdir())
    for content, why in ((b"", "empty file"), (b"not a trace at all", "unknown magic")):
        out = tmp_path / "new" / "run"
        r = CliRunner().invoke(main, ["import", "-", "--pid", "11", "--out", str(out)],
                               input=content)
        line = one_line_error(r, "standard input")
        assert why in line and not (tmp_path / "new").exists()


@pytest.mark.parametrize("release, scheduler", [
    ("6.1.0-50-amd64", "CFS (implied by kernel 6.1)"),
    ("6.12.48+deb12-amd64", "EEVDF (implied by kernel 6.12)"),
    ("test", "? (kernel release 'test' is no version)"),
    ("", "? (the trace records no kernel release)")])
def test_import_names_the_scheduler_the_kernel_release_implies(tmp_path, release, scheduler):
    """As doctor does for the running kernel, from the release the trace recorded (a trace.dat
    from a 6.1 guest once imported with scheduler "?"); said to be implied, since a sched_ext
    scheduler leaves no mark in the release."""
    from harmony.importer import import_trace
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, _ = known_capture()
    # trace-cmd's uname option is "sysname nodename release version machine", as our writer
    # words it (the release third)
    raw = write_dir(tmp_path / "raw", pages, extra_meta={"kernel": release})
    dat = write_tracedat(raw, tmp_path / "trace.dat")
    run = import_trace(dat, tmp_path / "run", comms=["cat-*"], pids=[11])
    assert run.manifest["host"]["scheduler"] == scheduler
    assert run.manifest["host"]["kernel"] == (release or "?")
    if release.startswith("6.1.0"):
        from harmony.analysis.policy import setup_of
        assert setup_of(run.manifest) == "6.1.0-50-amd64, CFS (implied by kernel 6.1)"


def test_an_import_lists_no_parameter_its_trace_cannot_tell(writer_dat, tmp_path):
    """How the tasks were started, released and asked to run is not in a trace: an imported
    run lists what the analysis reads, what the trace tells (duration, layout) and what was
    given, and names the rest as not known, never the defaults of a Harmony run."""
    _, dat = writer_dat
    r = invoke("import", dat, "--pid", 11, "-p", "duty=50", "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "a").manifest
    assert {"duration", "layout", "tolerance", "bin_s", "window_s", "duty"} <= set(m["params"])
    assert not {"release", "warm_s", "nice", "policy", "sample_hz"} & set(m["params"])
    assert {"release", "warm_s", "nice"} <= set(m["source"]["params_not_known"])
    assert "duty" not in m["source"]["params_not_known"]
    from harmony.analysis.report import params_line
    assert "; not known from the trace: " in params_line(m) and "release=" not in params_line(m)
    assert "(read from the trace's layout at t0: layout; " in params_line(m)


def test_import_window_ends_with_the_chosen_tasks_unless_given(writer_dat, tmp_path):
    _, dat = writer_dat
    # pid 11's events: 1.000000005 s (its switch-in) .. 1.402653206 s (its switch-out); the
    # file goes on to 11.000001 s with other tasks
    r = invoke("import", dat, "--pid", 11, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "a").manifest
    assert (m["t0_ns"], m["end_ns"]) == (1_000_000_005, 1_402_653_206)
    assert m["source"]["end_from"] == "last event of the chosen tasks"
    assert any("ends at the last event of the chosen tasks" in n for n in m["notes"])
    r = invoke("import", dat, "--pid", 11, "--end", "5", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "b").manifest
    assert m["end_ns"] == 5_000_000_000 and m["source"]["end_from"] == "given time 5.0 s"
    assert not any("ends at the last event" in n for n in m["notes"])


def _dat_of(tmp_path, name: str, events: list[tuple[str, dict]]) -> Path:
    """A trace.dat of one CPU holding ``events`` (format name, fields), 1 ms apart."""
    from harmony.probes.tracedat_write import write_tracedat
    f = parsed_formats(FORMATS_WAKING)
    b = PageBuilder(1_000_000_000)
    for fmt, fields in events:
        b.event(encode(f[f"sched/{fmt}"], fields), 1_000_000)
    return write_tracedat(write_dir(tmp_path / name, {0: [b.page()]}, FORMATS_WAKING),
                          tmp_path / f"{name}.dat")


def _switch(prev: int, nxt: int, state: int = 0) -> tuple[str, dict]:
    """A sched_switch for :func:`_dat_of` between the idle task (0) and task 11, "spin"."""
    comm = {0: "swapper/0", 11: "spin"}
    return "sched_switch", dict(common_pid=prev, prev_comm=comm[prev], prev_pid=prev,
                                prev_prio=120, prev_state=state, next_comm=comm[nxt],
                                next_pid=nxt, next_prio=120)


def _woken(kind: str) -> tuple[str, dict]:
    """A wake-up event (``kind``) of task 11 onto CPU 0, for :func:`_dat_of`."""
    return kind, dict(common_pid=0, comm="spin", pid=11, prio=120, target_cpu=0)


def test_import_says_which_sched_events_the_trace_lacks(tmp_path):
    # trace-cmd record -e sched_switch: runs, but no migration or wake-up is seen
    sw = [_switch(0, 11), _switch(11, 0)] * 3 + [_switch(0, 11)]
    r = invoke("import", _dat_of(tmp_path, "sw", sw), "--pid", 11, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "run").manifest
    assert m["capture"]["events_missing"] == ["sched_migrate_task", "sched_wakeup",
                                              "sched_wakeup_new", "sched_waking",
                                              "sched_process_fork", "sched_process_exit"]
    note = next(n for n in m["notes"] if n.startswith("the trace holds no"))
    assert "migrations are known only" in note and "release spread cannot be measured" in note
    # wake-ups only: nothing to rebuild runs from, refused in one line
    wk = [_woken("sched_wakeup")] * 3
    dat = _dat_of(tmp_path, "wk", wk)
    line = one_line_error(invoke("import", dat, "--pid", 11, "--out", tmp_path / "r2"), dat)
    assert "no sched_switch" in line


def test_import_derives_wake_ups_from_sched_waking(tmp_path):
    # perf sched record's events: sched_waking, no sched_wakeup
    events = [_switch(0, 11), _switch(11, 0, 1)]
    events += [_woken("sched_waking"), _switch(0, 11), _switch(11, 0, 1)] * 3
    dat = _dat_of(tmp_path, "waking", events)
    r = invoke("import", dat, "--pid", 11, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    run = harmony.load(tmp_path / "run")
    m = run.manifest
    assert "sched_wakeup" in m["capture"]["events_missing"]
    assert m["capture"]["derived_events"] == {
        "sched_wakeup": {"derived": 3, "placed": 0, "pulls": 0, "after_switch_out": 0,
                         "source": "sched_waking"}}
    assert [n for n in m["notes"] if n.startswith("the trace holds no sched_wakeup but 3 "
                                                  "sched_waking")], m["notes"]
    assert not [n for n in m["notes"] if "counts as runnable only from its switch-in" in n]
    # each wake-up seen: no switch-in of a task believed asleep
    assert m["reconstruction_anomalies"] == 0
    woken = run.events[run.events["event"] == "sched_wakeup"]
    assert woken["ts"].tolist() == [1_003_000_000, 1_006_000_000, 1_009_000_000]
    # the runqueue counts 11 from each wake-up, not from its switch-in
    rq = run.runqueue
    assert rq[(rq["ts"] == 1_003_000_000)]["nr"].tolist() == [1]
    # a trace.dat exports as it was imported (a perf.data's export leaves the derived rows out:
    # test_perf_sched_record_imports_with_its_wake_ups)
    r = CliRunner().invoke(main, ["export", str(run.path), "--out", str(tmp_path / "x.dat")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "x.dat").read_bytes() == dat.read_bytes()
    # without sched_waking either, the note says what is not seen (a sched_wakeup_new does
    # not show the other wake-ups)
    dat = _dat_of(tmp_path, "new", [_woken("sched_wakeup_new")] + events[:2] * 2)
    r = invoke("import", dat, "--pid", 11, "--out", tmp_path / "r2")
    assert r.exit_code == 0, r.output
    notes = harmony.load(tmp_path / "r2").manifest["notes"]
    assert [n for n in notes if "a woken task counts as runnable only from its switch-in" in n]


def test_import_lists_the_tasks_of_a_trace_to_choose_from(tmp_path):
    from harmony.analysis.event_streams import Stream
    from harmony.importer import df_trace_tasks
    # CPU 0: 11 runs 3 ms, 12 runs 1 ms, 11 runs on (no switch ends it); CPU 1: 12 runs 5 ms
    ev = (Stream({11: "spin", 12: "cat", 13: "sleeper"})
          .switch(0, 0, 0, 0, 11).switch(3_000_000, 0, 11, 0, 12).switch(4_000_000, 0, 12, 1, 11)
          .switch(1_000_000, 1, 0, 0, 12).switch(6_000_000, 1, 12, 1, 0)
          .wakeup(500_000, 0, 13, 1).events())
    tasks = df_trace_tasks(ev, {13: "sleeper.py"})      # a trace.dat's saved cmdlines count too
    assert tasks.to_dict("list") == {
        "pid": [12, 11, 13], "comm": ["cat", "spin", "sleeper|sleeper.py"], "events": [4, 3, 1],
        "switch_ins": [2, 2, 0], "run_s": [0.006, 0.003, 0.0], "cpus": ["0-1", "0", ""]}
    # the CLI lists them without --pid or --comm, and a comm that matches nothing points there
    dat = _dat_of(tmp_path, "sw", [_switch(0, 11), _switch(11, 0, 1)] * 3)
    r = invoke("import", dat, "--tasks")
    assert r.exit_code == 0, r.output
    header, row = r.stdout.splitlines()
    assert header.split() == ["PID", "RUN", "s", "SWITCH-INS", "EVENTS", "CPUS", "COMM"]
    assert row.split() == ["11", "0.003", "3", "6", "0", "spin"]   # 3 runs of 1 ms on CPU 0
    assert not (tmp_path / "runs").exists()
    line = one_line_error(invoke("import", dat, "--comm", "nosuch", "--out", tmp_path / "r"), dat)
    assert line.endswith(f"(harmony import {dat} --tasks lists them)")


def test_import_errors_after_reading_exit_1(writer_dat, tmp_path):
    _, dat = writer_dat
    one_line_error(invoke("import", dat, "--pid", 4242, "--out", tmp_path / "a"), dat)
    one_line_error(invoke("import", dat, "--comm", "nope*", "--out", tmp_path / "b"), dat)
    one_line_error(invoke("import", dat, "--pid", 12, "--t0-marker", "never written",
                          "--out", tmp_path / "c"), dat)
    one_line_error(invoke("import", dat, "--pid", 12, "--buffer", "other",
                          "--out", tmp_path / "d"), dat)
    one_line_error(invoke("import", dat, "--pid", 12, "--t0", "50", "--out", tmp_path / "e"), dat)
    # an experiment that cannot read imported tasks (no "high"/"low" roles) is refused before
    # the trace is read, a usage error, nothing made
    r = invoke("import", dat, "--pid", 12, "--experiment", "priority-classes",
               "-p", "long_warmup_s=0", "--out", tmp_path / "f")
    assert r.exit_code == 2 and "priority-classes cannot be imported: " in r.output, r.output
    assert not (tmp_path / "f").exists()


def test_import_refuses_up_front_a_trace_the_host_has_not_the_memory_for(writer_dat, tmp_path,
                                                                         monkeypatch):
    from harmony import hostfacts, importer
    _, dat = writer_dat
    need, data = importer.memory_needed(dat)
    assert data > 0 and need == int(importer.MEMORY_PER_DATA_BYTE * data) + importer.MEMORY_BASE
    monkeypatch.setattr(hostfacts, "memory_available", lambda: need - 1)
    out = tmp_path / "run"
    line = one_line_error(invoke("import", dat, "--pid", 12, "--out", out), dat)
    assert "needs up to" in line and "GiB available" in line and "--no-memory-check" in line
    assert not out.exists()                                 # refused before anything started
    r = invoke("import", dat, "--pid", 12, "--out", out, "--no-memory-check")
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(hostfacts, "memory_available", lambda: need)
    assert invoke("import", dat, "--pid", 12, "--out", tmp_path / "fits").exit_code == 0


@needs_trace_cmd
def test_a_compressed_trace_is_estimated_from_its_pages_decompressed(writer_dat, tmp_path,
                                                                     monkeypatch):
    """trace-cmd record's default (v7, zstd): the pages as they decompress (the chunks' headers
    say it), held instead of mapped, plus the compressed bytes read; refused up front too."""
    from harmony import hostfacts, importer
    from harmony.probes.tracedat_read import read_tracedat
    _, dat = writer_dat
    _, data = importer.memory_needed(dat)
    z = convert(dat, tmp_path / "z.dat", "--file-version", "7", "--compression", "zstd")
    [buf] = read_tracedat(z).buffers
    compressed = sum(size for _, size in buf.cpus.values())
    assert buf.compressed and 0 < compressed < data
    need, zdata = importer.memory_needed(z)
    assert zdata == data
    assert need == int(importer.MEMORY_PER_DATA_BYTE * data) + compressed + importer.MEMORY_BASE
    monkeypatch.setattr(hostfacts, "memory_available", lambda: need - 1)
    out = tmp_path / "run"
    line = one_line_error(invoke("import", z, "--pid", 12, "--out", out), z)
    assert "needs up to" in line and "--no-memory-check" in line and not out.exists()


def test_import_refuses_up_front_a_disk_without_the_room(writer_dat, tmp_path):
    """A run directory on a file system without the room for the copy of the trace and the
    tables (here a 1 MiB tmpfs) is refused before the trace is read, with the estimate."""
    _, dat = writer_dat
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        out = mnt / "runs" / "one"
        line = one_line_error(invoke("import", dat, "--pid", 12, "--out", out), out)
        assert re.search(f"importing {re.escape(str(dat))} needs up to 16 MiB on its file "
                         r"system \(\d+ KiB for the copy of the trace kept with the run", line)
        assert f"{mnt} has 1 MiB free: give --out on another file system, or --no-disk-check" \
            in line
        assert list(mnt.iterdir()) == []                    # refused before anything started
        r = invoke("import", dat, "--pid", 12, "--out", out, "--no-disk-check")
        assert r.exit_code == 0, r.output                   # a small trace fits after all


def test_the_disk_an_import_needs_counts_a_copy_only_where_one_takes_room(writer_dat, tmp_path):
    from harmony import importer
    from harmony.probes import filemap
    _, dat = writer_dat
    if filemap.shares_blocks(dat, tmp_path):
        host_skip(f"{tmp_path} shares blocks: a copy there takes no room (the XFS test's case)")
    size = dat.stat().st_size
    need, copy = importer.disk_needed(dat, tmp_path / "a" / "b", 1 << 20)
    assert copy == size and need == size + (1 << 19) + importer.DISK_BASE
    piped = tmp_path / "run" / importer.RAW_DIR / "stdin.dat"     # harmony import - wrote it
    piped.parent.mkdir(parents=True)
    piped.write_bytes(dat.read_bytes())
    assert importer.disk_needed(piped, tmp_path / "run", 1 << 20)[1] == 0


@pytest.mark.needs_tool("mkfs.xfs")
def test_the_disk_an_import_needs_counts_no_copy_that_shares_blocks(xfs, tmp_path):
    from harmony import importer
    trace = xfs / "trace.dat"
    trace.write_bytes(os.urandom(1 << 16))
    assert importer.disk_needed(trace, xfs / "run", 0) == (importer.DISK_BASE, 0)
    assert importer.disk_needed(trace, tmp_path / "run", 0)[1] == 1 << 16
    assert list(xfs.iterdir()) == [trace]                   # the probe left nothing


def test_import_refuses_up_front_a_perf_data_the_host_has_not_the_memory_for(tmp_path,
                                                                           monkeypatch):
    """A perf.data's estimate: 3 bytes a byte of its data section; recorded with -z, of what its
    records decompress to (the ratio perf wrote), one more byte a byte for holding them; a
    pipe-mode file's, 4 bytes off a word, are read a slab at a time as a file's are, not
    copied whole to align them: 3 bytes a byte."""
    from harmony import hostfacts, importer
    from harmony.probes.perf_read import read_header
    from test_perf_read import PLAIN, compressed_copy
    src = tmp_path / "perf.data"
    src.write_bytes(PLAIN[0].read_bytes())
    need, data = importer.memory_needed(src)
    assert data == read_header(src).data_size > 0
    assert need == int(importer.MEMORY_PER_PERF_DATA_BYTE * data) + importer.MEMORY_BASE
    z = tmp_path / "z.data"
    compressed_copy(src, z, 4, 1)
    head = read_header(z)
    zneed, zdata = importer.memory_needed(z)
    assert zdata == head.data_size * head.compression[1] and head.compression[1] > 1
    assert zneed == int((importer.MEMORY_PER_PERF_DATA_BYTE + 1) * zdata) + importer.MEMORY_BASE
    pipe = ROOT / "fuzz/corpus/perf_data/seed-pipe"
    head = read_header(pipe)
    assert head.pipe and head.data_offset % 8
    read = (int(importer.MEMORY_PER_PERF_DATA_BYTE * head.data_size) + importer.MEMORY_BASE,
            head.data_size)
    assert importer.memory_needed(pipe) == read
    monkeypatch.undo()
    monkeypatch.setattr(hostfacts, "memory_available", lambda: need - 1)
    out = tmp_path / "run"
    line = one_line_error(invoke("import", src, "--pid", 12, "--out", out), src)
    assert "needs up to" in line and "GiB available" in line and "--no-memory-check" in line
    assert "perf record --switch-output" in line
    assert not out.exists()                                 # refused before anything started


def test_import_whose_copy_of_the_trace_fails_is_incomplete(writer_dat, tmp_path, monkeypatch):
    """The trace is copied into the run while it is analysed: a copy that fails (a full disk)
    leaves the run incomplete, with one line naming the file and no partial copy behind."""
    from harmony.probes import filemap
    _, dat = writer_dat
    real = filemap.copy_file

    def full_disk(src, dst, **how):
        real(src, dst)      # the partial copy exists when the error comes
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(filemap, "copy_file", full_disk)
    out = tmp_path / "run"
    line = one_line_error(invoke("import", dat, "--pid", 12, "--out", out), out)
    assert "No space left on device" in line
    assert line.endswith(f"{dat.resolve()} is as it was: import it again")
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "incomplete" and "No space left" in m["incomplete_reason"]
    assert not list((out / "raw/import").iterdir())
    monkeypatch.setattr(filemap, "copy_file", real)
    ok = tmp_path / "ok"
    assert invoke("import", dat, "--pid", 12, "--out", ok).exit_code == 0
    assert (ok / "raw/import" / dat.name).read_bytes() == dat.read_bytes()
    assert "waiting" in json.loads((ok / "manifest.json").read_text())["timings_s"]["analysis"]


@pytest.mark.parametrize("clock,unit", [("x86-tsc", "CPU cycles"), ("uptime", "jiffies"),
                                        ("counter", "events")])
def test_import_refuses_a_trace_clock_that_does_not_count_nanoseconds(tmp_path, clock, unit):
    from harmony.probes.tracedat_write import write_tracedat
    pages, _, _ = known_capture()
    raw = write_dir(tmp_path / "raw", pages, extra_meta={"clock": clock})
    dat = write_tracedat(raw, tmp_path / "trace.dat")
    out = tmp_path / "run"
    line = one_line_error(invoke("import", dat, "--pid", 12, "--out", out), dat)
    assert f"trace clock {clock!r}, which counts {unit}" in line and not out.exists()
    # the same pages on a nanosecond clock import
    raw = write_dir(tmp_path / "raw-ns", pages, extra_meta={"clock": "global"})
    r = invoke("import", write_tracedat(raw, tmp_path / "ns.dat"), "--pid", 12, "--out", out)
    assert r.exit_code == 0, r.output
    assert harmony.load(out).manifest["capture"]["clock"] == "global"


def test_corrupt_files_exit_1_with_one_line(writer_dat, tmp_path):
    _, dat = writer_dat
    cut = tmp_path / "cut.dat"
    cut.write_bytes(dat.read_bytes()[:-5000])
    line = one_line_error(invoke("import", cut, "--pid", 12, "--out", tmp_path / "r1"), cut)
    assert "truncated" in line
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello, not a trace\n" * 10)
    one_line_error(invoke("import", junk, "--pid", 1, "--out", tmp_path / "r2"), junk)
    perf = tmp_path / "perf.data"                           # perf's magic, then cut short
    perf.write_bytes(b"PERFILE2" + (104).to_bytes(8, "little") + bytes(40))
    one_line_error(invoke("import", perf, "--pid", 1, "--out", tmp_path / "r3"), perf)


def test_bad_arguments_exit_2_before_anything(writer_dat, tmp_path):
    _, dat = writer_dat
    out = tmp_path / "never"
    cases = [
        ["import", dat, "--out", out],                                     # no task named
        ["import", dat, "--pid", 12, "--t0", "1.0", "--t0-marker", "x", "--out", out],
        ["import", dat, "--pid", 12, "--end", "1.0", "--end-marker", "x", "--out", out],
        ["import", dat, "--pid", 12, "--t0", "2", "--end", "1", "--out", out],
        ["import", dat, "--pid", 0, "--out", out],
        ["import", dat, "--pid", "twelve", "--out", out],
        ["import", dat, "--pid", 12, "--cpus", "3-1", "--out", out],
        ["import", dat, "--pid", 12, "--experiment", "no-such", "--out", out],
        ["import", dat, "--pid", 12, "-p", "bogus=1", "--out", out],
        ["import", dat, "--pid", 12, "-p", "nokeyvalue", "--out", out],
        ["import", dat, "--pid", 12, "-p", "duration=3", "--out", out],    # the window is --end's
        # not a regular file (a FIFO would make the read wait for a writer; /dev/null fails fast)
        ["import", "/dev/null", "--pid", 12, "--out", out],
        ["export", tmp_path, "--format", "pcap"],
    ]
    for args in cases:
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output
    # the input missing is status 1 (the exit-status contract: docs/cli.md), before anything
    for args in (["import", tmp_path / "missing.dat", "--pid", 12, "--out", out],
                 ["export", tmp_path / "not-a-run"]):
        r = invoke(*args)
        assert r.exit_code == 1 and "no such" in r.output, (args, r.output)
    assert not out.exists()
    # export into a directory that does not exist: refused before anything is written
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "manifest.json").write_text('{"probe": "tracefs", "status": "complete"}')
    r = invoke("export", run, "--out", tmp_path / "no" / "x.dat")
    assert r.exit_code == 2 and "no such directory" in r.output, r.output
    r = invoke("export", run, "--out", "/proc/x.dat")         # one that cannot be written in
    assert r.exit_code == 2 and "cannot write under /proc" in r.output, r.output
    # a directory that already holds a run is refused too
    (out / "x").mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    assert invoke("import", dat, "--pid", 12, "--out", out).exit_code == 2
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "x"]


def test_export_of_a_run_without_pages_needs_its_decoded_events(tmp_path):
    run = tmp_path / "perf-run"
    (run / "raw/perf").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"probe": "perf", "status": "incomplete"}))
    line = one_line_error(invoke("export", run), run)
    assert "'perf'" in line and "events.parquet" in line and "never analysed" in line
    assert not (run / "trace.dat").exists()
    assert not list(tmp_path.rglob(".harmony-export-*"))


def test_export_of_a_perf_run_writes_its_tracefs_crosscheck(writer_dat, tmp_path):
    raw, dat = writer_dat           # dat: the hand-built capture raw/ as our writer writes it
    run = tmp_path / "perf-run"
    (run / "raw/perf").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"probe": "perf", "crosscheck_probe": "tracefs",
                                                   "status": "complete"}))
    line = one_line_error(invoke("export", run), run)       # the cross-check's capture is missing
    assert "tracefs capture" in line and "missing" in line
    shutil.copytree(raw, run / "raw/tracefs")
    r = invoke("export", run, "--out", tmp_path / "x.dat")
    assert r.exit_code == 0, r.output
    assert "tracefs cross-check" in r.output
    assert (tmp_path / "x.dat").read_bytes() == dat.read_bytes()


# --- canonical events written as pages (runs of the perf probe, imports of perf.data, simulations)

def _stream_to_encode(ncpus: int, n_events: int, stretch: int):
    """A simulated stream on ``ncpus`` CPUs with its time axis stretched ``stretch`` times (so
    that gaps of over 2^27 ns need time-extend records), plus rows of events the decoder has no
    rule for, and markers: one with no CPU, one longer than a page can hold."""
    from harmony.analysis.event_streams import simulate
    from harmony.probes.schema import make_events

    ev = simulate(ncpus=ncpus, ntasks=2 * ncpus, n_events=n_events, seed=3, p_exit=0.002).events
    at = ev["ts"].to_numpy()[[10, 20]]
    other = make_events({"ts": at, "cpu": [1, 0], "common_pid": [7, 0], "pid": [1000, -1],
                         "event": ["sched_process_wait", "irq:irq_handler_entry"],
                         "comm": ["", "eth0"], "prio": [-1, 120]})

    def plain(col):
        return col.astype(str).to_numpy() if isinstance(col.dtype, pd.CategoricalDtype) \
            else col.to_numpy()

    events = make_events({c: np.concatenate([plain(ev[c]), plain(other[c])]) for c in ev.columns})
    events["ts"] *= stretch
    t = events["ts"].to_numpy()
    markers = pd.DataFrame({"ts": t[[0, len(t) // 2, -1]], "cpu": np.array([0, ncpus - 1, -1],
                                                                           np.int16),
                            "pid": np.array([1, 2, 3], np.int32),
                            "text": ["harmony t0", "x" * 5000, "harmony end"]})
    return events, markers


@pytest.mark.parametrize("ncpus,stretch", [(4, 1), (64, 10_000)])
def test_events_written_as_pages_decode_to_the_same_tables(tmp_path, ncpus, stretch):
    from harmony.probes.encode import MAX_MARKER, write_recording
    from harmony.probes.ringbuf import decode_dir

    events, markers = _stream_to_encode(ncpus, 20_000, stretch)
    ts, cpu = events["ts"].to_numpy(), events["cpu"].to_numpy()
    assert any((np.diff(ts[cpu == c]) >= 1 << 27).any() for c in range(ncpus)) == (stretch > 1)
    notes = write_recording(events, markers, {"cpus": list(range(ncpus)) + [ncpus + 3],
                                              "lost_events": 7, "lost_by_cpu": {"2": 4},
                                              "clock": "perf (sched_clock, perf's default)"},
                            tmp_path / "rec")
    cap = decode_dir(tmp_path / "rec")
    # the same rows in the same order (an instant's events on several CPUs: by CPU, in both)
    assert (events["ts"].duplicated() & ~events[["ts", "cpu"]].duplicated()).any()
    pd.testing.assert_frame_equal(cap.events, events, check_categorical=False)
    assert list(cap.markers["text"]) == ["harmony t0", "x" * MAX_MARKER, "harmony end"]
    assert list(cap.markers["cpu"]) == [0, ncpus - 1, 0]
    assert list(cap.markers["ts"]) == list(markers["ts"])
    # every CPU asked for has its file, with or without events; the lost events are all counted
    assert sorted(cap.meta["lost_by_cpu"]) == list(range(ncpus)) + [ncpus + 3]
    assert cap.meta["lost_events"] == 7 and cap.meta["lost_by_cpu"][2] == 4
    assert any("3 lost events counted for no CPU" in n for n in notes)
    assert any("1 markers recorded on no known CPU" in n for n in notes)
    assert any(f"cut to {MAX_MARKER} bytes" in n for n in notes)
    assert cap.meta["clock"] == "perf"      # a trace clock's name, as trace.dat files hold it


@needs_trace_cmd
def test_trace_cmd_reports_events_written_as_pages(tmp_path):
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat
    from harmony.probes.ringbuf import decode_dir

    events, markers = _stream_to_encode(64, 5_000, 10_000)
    write_recording(events, markers, {"cpus": list(range(64))}, tmp_path / "rec")
    dat = write_tracedat(tmp_path / "rec", tmp_path / "x.dat")
    ours = decoded_records(decode_dir(tmp_path / "rec"))
    # trace-cmd names an event without its system
    assert sorted(report_events(dat)) == sorted((t, c, e.rpartition(":")[2]) for t, c, e in ours)
    text = subprocess.run([TRACE_CMD, "report", "-i", str(dat)], capture_output=True,
                          text=True, timeout=120).stdout
    assert "cpus=64" in text and ": harmony end" in text
    assert re.search(r"sched_switch: +\S+:\d+ \[\d+\] [RS] ==> ", text), text[:2000]


@needs_trace_cmd
def test_export_of_a_simulated_run_imports_as_the_same_run(tmp_path):
    r = invoke("simulate", "--policy", "pairwise-random", "--ncpus", 8, "--experiment",
               "single-source", "-p", "duration=3", "--out", tmp_path / "sim")
    assert r.exit_code == 0, r.output
    sim = harmony.load(tmp_path / "sim" / "rep-01")
    r = CliRunner().invoke(main, ["export", str(sim.path), "--out", str(tmp_path / "x.dat")])
    assert r.exit_code == 0, r.output
    assert "written from its decoded events" in r.stderr
    m = sim.manifest
    args = ["--t0", m["t0_ns"] / 1e9, "--end", m["end_ns"] / 1e9, "--out", tmp_path / "back"]
    r = invoke("import", tmp_path / "x.dat", *args,
               *[a for p in sim.tasks["pid"] for a in ("--pid", p)])
    assert r.exit_code == 0, r.output
    back = harmony.load(tmp_path / "back")
    pd.testing.assert_frame_equal(back.events, sim.events, check_categorical=False)
    # a trace holds no scheduling domains: the imported moves have no level (the simulated
    # machine's have theirs)
    assert (back.migrations["level"] == -1).all() and back.migrations["level_name"].isna().all()
    for name in ("migrations", "runs", "runqueue"):
        # an imported task is named by its comm (hmy-w03), a simulated one by its spec (w03)
        mine, theirs = (t.table(name).drop(columns=["name", "level", "level_name"],
                                           errors="ignore") for t in (back, sim))
        pd.testing.assert_frame_equal(mine, theirs, check_categorical=False)
    assert (sim.migrations["level"] >= 0).all()
    # what ran it: the simulator and its policy (trace-cmd's own reading of the UNAME option),
    # not a Linux kernel whose release is "simulated"
    dump = subprocess.run([TRACE_CMD, "dump", "--options", str(tmp_path / "x.dat")],
                          capture_output=True, text=True)
    assert "Harmony-simulator - simulated pairwise-random -" in dump.stdout, dump.stdout
    assert back.manifest["host"]["scheduler"] == \
        "reference policy pairwise-random (a simulated run, exported)"


# --- the real kernel ---------------------------------------------------------------------------

REPORT_LINE = re.compile(r"\[(\d+)\]\s+(\d+)\.(\d{9}):\s+([\w:]+):")


def report_events(dat: Path, buffer: str | None = None) -> list[tuple[int, int, str]]:
    """(ts, cpu, event) of every record ``trace-cmd report`` shows, in its order (only those of
    instance ``buffer`` if given: report prefixes their lines with "<buffer>:")."""
    p = subprocess.run([TRACE_CMD, "report", "-t", "-i", str(dat)], capture_output=True, text=True,
                       errors="replace", timeout=120)
    assert p.returncode == 0, p.stderr
    out = []
    for line in p.stdout.splitlines():
        if buffer is not None and not line.lstrip().startswith(f"{buffer}:"):
            continue
        m = REPORT_LINE.search(line)
        if m:
            out.append((int(m.group(2)) * 10**9 + int(m.group(3)), int(m.group(1)), m.group(4)))
    return out


def decoded_records(cap) -> list[tuple[int, int, str]]:
    # trace-cmd report names an event without its system (softirq_entry, not irq:softirq_entry)
    ev = [(int(t), int(c), str(e).split(":")[-1])
          for t, c, e in zip(cap.events["ts"], cap.events["cpu"], cap.events["event"])]
    mk = [(int(t), int(c), "print") for t, c in zip(cap.markers["ts"], cap.markers["cpu"])]
    return sorted(ev + mk)


@pytest.mark.kernel
@needs_trace_cmd
def test_round_trip_of_a_real_run(kernel, tmp_path):
    """A real <4,0> run, exported to trace.dat and imported by pid, gives the same tables."""
    orig = tmp_path / "orig"
    p = cli("run", "single-source", "--layout", "4,0", "--duration", "2", "--out", orig, "-q")
    assert p.returncode == 0, p.stderr
    a = harmony.load(orig)
    dat = tmp_path / "orig.dat"
    p = cli("export", orig, "--out", dat)
    assert p.returncode == 0 and p.stdout.strip() == str(dat), p.stderr
    # trace-cmd reads every record of the export
    assert sorted(report_events(dat)) == decoded_records(
        type("C", (), {"events": a.events, "markers": a.markers}))
    args = ["import", dat, "--t0-marker", "harmony t0", "--end-marker", "harmony end",
            "--cpus", ",".join(map(str, a.manifest["cpus"])), "--out", tmp_path / "back"]
    for pid in a.tasks["pid"]:
        args += ["--pid", int(pid)]
    p = cli(*args)
    assert p.returncode == 0, p.stderr
    b = harmony.load(tmp_path / "back")
    assert b.manifest["source"]["format"] == "trace.dat" and b.manifest["status"] == "complete"
    assert (b.manifest["t0_ns"], b.manifest["end_ns"]) \
        == (a.manifest["t0_ns"], a.manifest["end_ns"])
    assert b.manifest["lost_events"] == a.manifest["lost_events"]
    assert len(a.runs) > 0  # whether the kernel migrated anything is not this test's business
    comm_of = dict(zip(a.tasks["pid"], a.tasks["comm"]))
    for name in TABLES:
        x, y = a.table(name), b.table(name)
        assert list(x.columns) == list(y.columns), name
        cols = [c for c in x.columns if c != "name"]
        pd.testing.assert_frame_equal(x[cols], y[cols], check_categorical=False, obj=name)
        if "name" in x.columns:     # imported tasks are named by their comm
            assert [comm_of[p] for p in x["pid"]] == list(y["name"].astype(str)), name
    # where the moves were on the machine is the run's topology (its manifest), which a trace
    # does not carry: the imported run has none of it, and every other figure is the same
    machine = ("moves_by_relation", "migrations_by_level")
    assert {k: v for k, v in a.summary.items() if k not in machine} == \
        {k: v for k, v in b.summary.items() if k not in machine}
    assert not b.summary.get("moves_by_relation") and not b.summary.get("migrations_by_level")
    assert cli("report", tmp_path / "back").returncode == 0


SPIN = ("import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, b'hmyimp-spin', 0, 0, 0)\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < float(sys.argv[1]):\n"
        "    pass\n")


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def extract_capture(tmp_path: Path, tracefs: Path) -> tuple[Path, list[int]]:
    """Record sched events in a tracefs instance we configure, while 3 spinners named hmyimp-spin
    run, then ``trace-cmd extract`` it (trace-cmd's default file version). Returns (file, pids)."""
    inst = tracefs / "instances" / f"hmy-import-test-{os.getpid()}"
    events = ("sched_switch", "sched_migrate_task", "sched_wakeup", "sched_wakeup_new",
              "sched_waking", "sched_process_fork", "sched_process_exit")
    inst.mkdir()
    try:
        _write(inst / "buffer_size_kb", "4096")
        for e in events:
            if (inst / "events/sched" / e).is_dir():
                _write(inst / "events/sched" / e / "enable", "1")
        _write(inst / "tracing_on", "1")
        _write(inst / "trace_marker", "import t0")
        procs = [subprocess.Popen([sys.executable, "-c", SPIN, "0.4"]) for _ in range(3)]
        for p in procs:
            p.wait()
        _write(inst / "trace_marker", "import end")
        _write(inst / "tracing_on", "0")
        dat = tmp_path / "extracted.dat"
        p = subprocess.run([TRACE_CMD, "extract", "-B", inst.name, "-o", str(dat)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and dat.exists(), p.stderr
        return dat, [p.pid for p in procs]
    finally:
        if inst.exists():
            for e in events:
                try:
                    _write(inst / "events/sched" / e / "enable", "0")
                except OSError:
                    pass
            inst.rmdir()


@pytest.mark.kernel
@needs_trace_cmd
def test_trace_cmd_extract_imports(kernel, tmp_path):
    from harmony.probes.tracedat_read import decode_tracedat
    dat, pids = extract_capture(tmp_path, kernel)
    assert not list((kernel / "instances").glob("hmy-import-test-*"))
    inst = f"hmy-import-test-{os.getpid()}"
    # trace-cmd also saves the top-level buffer, which holds data if anyone else used it: --buffer
    cap, td = decode_tracedat(dat, buffer=inst)
    assert td.version in (6, 7) and inst in [b.name for b in td.buffers]
    assert decoded_records(cap) == sorted(report_events(dat, inst))
    assert {"import t0", "import end"} <= set(cap.markers["text"])
    # the same capture in the other layouts decodes identically
    for name, args in (("v7-plain", ("--file-version", "7", "--compression", "none")),
                       ("v6", ("--file-version", "6"))):
        other, _ = decode_tracedat(convert(dat, tmp_path / f"{name}.dat", *args), buffer=inst)
        assert_same_capture(cap, other)

    out = tmp_path / "run"
    r = invoke("import", dat, "--comm", "hmyimp-*", "--t0-marker", "import t0", "--end-marker",
               "import end", "--buffer", inst, "--out", out)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    m = run.manifest
    assert sorted(run.tasks["pid"]) == sorted(pids)
    assert m["source"]["t0_from"] == "trace marker 'import t0'"
    assert m["capture"]["file_version"] == td.version and m["lost_events"] == 0
    assert m["host"]["kernel"] == os.uname().release
    assert len(run.runs) > 0 and set(run.runs["pid"]) == set(pids)
    # the three spinners each ran ~0.4 s of CPU inside the window
    cpu_s = run.runs.groupby("pid")["duration"].sum() / 1e9
    assert (cpu_s > 0.1).all(), cpu_s


@pytest.mark.kernel
@pytest.mark.needs_tool("perf")
def test_perf_data_imports(kernel, tmp_path):
    data = tmp_path / "perf.data"
    p = subprocess.run([PERF, "record", "-q", "-e", "sched:*", "-a", "-o", str(data), "--",
                        sys.executable, "-c", SPIN, "0.3"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        host_skip(f"perf record cannot record sched tracepoints here: {p.stderr.strip()[-200:]}")
    out = tmp_path / "run"
    r = invoke("import", data, "--comm", "hmyimp-spin", "--out", out)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    assert run.manifest["source"]["format"] == "perf.data" and len(run.tasks) == 1
    assert run.runs["duration"].sum() > 0.1e9
    cut = tmp_path / "cut.data"
    cut.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    one_line_error(invoke("import", cut, "--comm", "hmyimp-spin", "--out", tmp_path / "r2"), cut)


@pytest.mark.kernel
@pytest.mark.needs_tool("perf")
def test_perf_record_piped_into_harmony_import(kernel, tmp_path):
    """``perf record -o - ... | harmony import -``, two processes and a pipe, as a user types it;
    and an import stopped (SIGINT) while the trace is still arriving leaves nothing behind."""
    import signal
    import time
    from cli_run import HARMONY
    out = tmp_path / "run"
    rec = subprocess.Popen([PERF, "record", "-q", "-e", "sched:*", "-a", "-o", "-", "--",
                            sys.executable, "-c", SPIN, "0.3"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    imp = subprocess.run(HARMONY + ["import", "-", "--comm", "hmyimp-spin", "--out", str(out)],
                         stdin=rec.stdout, capture_output=True, text=True, timeout=180)
    rec.stdout.close()
    if rec.wait(timeout=60) != 0:
        host_skip(f"perf record cannot record here: {rec.stderr.read().decode()[-200:]}")
    assert imp.returncode == 0, imp.stderr
    run = harmony.load(out)
    assert run.manifest["source"]["format"] == "perf.data" and len(run.tasks) == 1
    assert run.runs["duration"].sum() > 0.1e9
    assert (out / "raw/import/stdin.perf.data").read_bytes()[:16] == \
        b"PERFILE2" + (16).to_bytes(8, "little")                          # pipe mode
    # a pipe that stays open: the import waits for the trace's end, and is stopped meanwhile
    stopped = tmp_path / "stopped"
    imp = subprocess.Popen(HARMONY + ["import", "-", "--comm", "x", "--out", str(stopped)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=sigint_as_a_terminal)
    imp.stdin.write(b"PERFILE2" + bytes(4096))
    imp.stdin.flush()
    part = stopped / "raw/import/.stdin.part"
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    imp.send_signal(signal.SIGINT)
    imp.wait(timeout=60)        # before its input ends: the signal, not the end, stops it
    imp.stdin.close()
    err = imp.stderr.read().decode()
    assert imp.returncode != 0 and "interrupted" in err and "Traceback" not in err, err
    assert not stopped.exists()


@pytest.mark.kernel
@pytest.mark.needs_tool("perf")
@pytest.mark.needs_cpus(2)
def test_perf_data_of_some_cpus_says_which_it_recorded(kernel, tmp_path):
    cpu = min(os.sched_getaffinity(0))
    data = tmp_path / "perf.data"
    # perf itself on that CPU: its child (the spinner) is never placed on another one
    p = subprocess.run(["taskset", "-c", str(cpu), PERF, "record", "-q", "-C", str(cpu), "-e",
                        "sched:*", "-o", str(data), "--", sys.executable, "-c", SPIN, "0.3"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        host_skip(f"perf record cannot record here: {p.stderr.strip()[-200:]}")
    out = tmp_path / "run"
    r = invoke("import", data, "--comm", "hmyimp-spin", "--out", out)
    assert r.exit_code == 0, r.output
    m = harmony.load(out).manifest
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    assert m["host"]["ncpus"] == online and m["capture"]["recorded_cpus"] == [cpu]
    said = f"perf recorded CPUs {cpu} only, of the {online}"
    assert [n for n in m["notes"] if n.startswith(said)], m["notes"]
    # a task placed outside the CPU set at t0 is named, not taken for "no task in the layout"
    other = max(os.sched_getaffinity(0))
    r = invoke("import", data, "--comm", "hmyimp-spin", "--cpus", other,
               "--out", out.with_name("r2"))
    assert r.exit_code == 1 and f"were on CPUs [{cpu}], outside the CPU set {other}" in r.output


@pytest.mark.kernel
@pytest.mark.needs_tool("perf")
def test_perf_data_with_call_graphs_and_other_events_imports_every_sched_event(kernel, tmp_path):
    """A perf.data that also sampled cpu-clock, with call graphs: perf script's default output
    for those samples (fields and call chains) must not become unparsed lines or lost events."""
    data = tmp_path / "perf.data"
    p = subprocess.run([PERF, "record", "-q", "-g", "-a", "-e", "sched:*", "-e", "cpu-clock",
                        "-o", str(data), "--", sys.executable, "-c", SPIN, "0.3"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        host_skip(f"perf record cannot record here: {p.stderr.strip()[-200:]}")
    # perf's own count of each decoded event, from its default output (call chains included)
    text = subprocess.run([PERF, "script", "-i", str(data)], capture_output=True, text=True,
                          timeout=120).stdout
    want = {}
    for m in re.finditer(r" sched:(\w+): ", text):
        if m.group(1) in SCHED_EVENTS:
            want[m.group(1)] = want.get(m.group(1), 0) + 1
    assert " cpu-clock" in text and want.get("sched_switch", 0) > 0
    out = tmp_path / "run"
    r = invoke("import", data, "--comm", "hmyimp-spin", "--out", out)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    got = run.events["event"].astype(str).value_counts().to_dict()
    assert got == want
    notes = run.manifest["notes"]
    assert not [n for n in notes if "did not parse" in n], notes
    assert [n for n in notes if n.startswith("ignored events") and "'cpu-clock'" in n], notes
    assert run.manifest["lost_events"] == 0
    assert not [n for n in notes if n.startswith("perf recorded CPUs")]     # -a: every CPU


#: two processes waking each other through pipes (prctl names them) for ``seconds``
PINGPONG = ("import ctypes, os, sys, time\n"
            "r1, w1 = os.pipe(); r2, w2 = os.pipe()\n"
            "child = os.fork() == 0\n"
            "ctypes.CDLL(None).prctl(15, b'hmyimp-pp', 0, 0, 0)\n"
            "while child and os.read(r1, 1) == b'x':\n"
            "    os.write(w2, b'x')\n"
            "t = time.monotonic()\n"
            "while not child and time.monotonic() - t < float(sys.argv[1]):\n"
            "    os.write(w1, b'x'); os.read(r2, 1)\n"
            "if not child:\n"
            "    os.write(w1, b'q'); os.wait()\n")


@pytest.mark.kernel
@pytest.mark.needs_tool("perf")
def test_perf_sched_record_imports_with_its_wake_ups(kernel, tmp_path):
    """perf sched record's perf.data has sched_waking and no sched_wakeup: the import derives
    the wake-ups (the woken tasks are runnable before their switch-in), says so, and the export
    leaves them out."""
    data = tmp_path / "perf.data"
    p = subprocess.run([PERF, "sched", "record", "-o", str(data), "--", sys.executable, "-c",
                        PINGPONG, "0.3"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        host_skip(f"perf sched record cannot record here: {p.stderr.strip()[-200:]}")
    from harmony.importer import read_trace
    recorded = read_trace(data)[0].events
    have = set(recorded["event"].astype(str))
    if "sched_wakeup" in have or "sched_waking" not in have:
        host_skip(f"this perf sched record recorded {sorted(have)}, not sched_waking alone")
    wakings = int((recorded["event"] == "sched_waking").sum())
    out = tmp_path / "run"
    r = invoke("import", data, "--comm", "hmyimp-pp", "--out", out)
    assert r.exit_code == 0, r.output
    run = harmony.load(out)
    m = run.manifest
    assert m["capture"]["derived_events"]["sched_wakeup"]["derived"] == wakings
    assert [n for n in m["notes"] if n.startswith(f"the trace holds no sched_wakeup but "
                                                  f"{wakings} sched_waking")], m["notes"]
    # the ping-pong's thousands of switch-ins follow wake-ups: without the derived ones, each
    # that does not follow a (recorded) sched_wakeup_new is one of a task believed asleep
    from harmony.analysis.reconstruct import df_runqueue
    switch_ins = int(((run.events["event"] == "sched_switch")
                      & run.events["pid"].isin(run.tasks["pid"])).sum())
    assert switch_ins > 1000
    repaired = m["reconstruction_anomaly_kinds"].get("switch_in_not_runnable", 0)
    assert repaired <= 0.01 * switch_ins, m["reconstruction_anomaly_kinds"]
    blind = df_runqueue(recorded, run.tasks, m["cpus"], m["t0_ns"], m["end_ns"]).attrs
    assert blind["anomaly_kinds"]["switch_in_not_runnable"] >= 0.3 * switch_ins
    assert m["release"]["woken"] == len(run.tasks) == 2
    r = CliRunner().invoke(main, ["export", str(out), "--out", str(tmp_path / "x.dat")])
    assert r.exit_code == 0, r.output
    assert "sched_wakeup rows, derived from sched_waking at import, are left out" in r.stderr
    from harmony.probes.tracedat_read import decode_tracedat
    back = decode_tracedat(tmp_path / "x.dat")[0].events["event"].astype(str)
    assert "sched_wakeup" not in set(back) and int((back == "sched_waking").sum()) == wakings
    # imported again, the exported file derives the same wake-ups: the same run
    r = invoke("import", tmp_path / "x.dat", "--comm", "hmyimp-pp", "--out", tmp_path / "back")
    assert r.exit_code == 0, r.output
    again = harmony.load(tmp_path / "back")
    for name in ("events", "migrations", "runs", "runqueue"):
        pd.testing.assert_frame_equal(again.table(name), run.table(name), check_categorical=False)


#: parameters the tasks read and the experiment's own analyse() does not, that are still not
#: workload-only: the layout (an import reads it from the trace), and those another part of the
#: analysis reads (the how-many analysis time-to-resolve inherits; the static companion's card
#: line; the server card's shape)
READ_ELSEWHERE = {"layout", "base", "static", "shape"}


def _subscripted_keys(function) -> set[str]:
    """The string keys a function reads (``p["k"]``, ``p.get("k")``), from its source."""
    import ast
    import inspect
    import textwrap

    keys = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
    return keys


def test_every_parameter_only_the_workload_reads_is_declared_so():
    """An import names what its trace cannot tell from each experiment's ``workload``: a
    parameter the experiment's tasks() reads and its analyse(), plot() and describe() do not is
    declared there (read from the code, so a new parameter is not forgotten), and every declared
    one is a parameter."""
    from harmony.experiments import CATALOG, get_experiment

    for name in CATALOG:
        exp = get_experiment(name)
        own = {p.name for p in exp.params}
        analysis = set().union(*(_subscripted_keys(getattr(type(exp), f))
                                 for f in ("analyse", "plot", "describe")))
        only_workload = ((_subscripted_keys(type(exp).tasks) - analysis) & own) - READ_ELSEWHERE
        assert only_workload <= exp.workload, (name, sorted(only_workload - exp.workload))
        assert exp.workload <= own, (name, sorted(exp.workload - own))


@pytest.fixture(scope="module")
def simulated_dat(tmp_path_factory):
    """A simulated single-source run's export: a trace any experiment can be imported from."""
    tmp = tmp_path_factory.mktemp("simdat")
    r = invoke("simulate", "single-source", "--policy", "pairwise-random", "--ncpus", 4,
               "-p", "duration=2", "-q", "--out", tmp / "sim")
    assert r.exit_code == 0, r.output
    r = invoke("export", tmp / "sim" / "rep-01", "--out", tmp / "x.dat")
    assert r.exit_code == 0, r.output
    return tmp / "x.dat"


@pytest.mark.parametrize("experiment, given", [
    ("work-conservation", ["-p", "idle_at_s=1"]),     # what its analysis reads, given
    ("detection", ["-p", "cut_at_s=1"]),
    ("proportional", []),
    ("spread", [])])
def test_an_import_as_any_experiment_names_its_workload_as_not_known(simulated_dat, tmp_path,
                                                                      experiment, given):
    """Imported as each experiment whose analysis can read a single-source trace: the
    experiment's workload parameters are not in the run's parameters (no default of a Harmony
    run passed off as what the trace did) but listed as not known, unless the trace's layout
    shows them (spread's ntasks: below), and the analysis ran."""
    from harmony.experiments import get_experiment

    r = invoke("import", simulated_dat, "-e", experiment, "--comm", "hmy-w*", "-q", *given,
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    run = harmony.load(tmp_path / "run")
    workload = get_experiment(experiment).workload
    shown = set(run.manifest["source"]["params_from_layout"])
    assert workload and not (workload - shown) & set(run.manifest["params"])
    assert workload - shown <= set(run.manifest["source"]["params_not_known"])
    assert run.manifest["status"] == "complete" and run.summary


#: each experiment of the catalog imported from a single-source trace with nothing given: refused
#: before the trace is read (status 2, nothing made) when its analysis reads what a trace does not
#: hold, or needs a parameter no default may stand for; refused once read (status 1, nothing
#: made) when the trace's layout is none it analyses; analysed otherwise
IMPORT_AS = [
    ("single-source", 0, None),
    ("how-many", 0, None),
    ("time-to-resolve", 0, None),
    ("proportional", 0, None),
    ("spread", 0, None),
    ("work-conservation", 2, "work-conservation's analysis reads what a trace does not show "
                             "(idle_at_s, when the target's tasks exit (s after t0)): give "
                             "-p idle_at_s=..."),
    ("detection", 2, "detection's analysis reads what a trace does not show (cut_at_s, when the "
                     "target's load is cut (s after t0)): give -p cut_at_s=..."),
    ("heavy-light", 2, "heavy-light cannot be imported: its analysis tells its two classes of "
                       "tasks apart by the role Harmony gave each"),
    ("priority-classes", 2, "priority-classes cannot be imported: "),
    ("server", 2, "server cannot be imported: its analysis reads the requests"),
    # read, but its layout (all 8 tasks on the first of 4 CPUs) is none the experiment analyses:
    # the trace's problem, not the options'
    ("intrinsic-imbalance", 1, "its layout at t0 (layout=[8, 0, 0, 0]) is not one "
                               "intrinsic-imbalance analyses: 8 tasks on 4 CPUs is no intrinsic "
                               "imbalance"),
]


def test_every_experiment_of_the_catalog_is_in_the_import_table():
    from harmony.experiments import CATALOG

    assert {e for e, _, _ in IMPORT_AS} == set(CATALOG)


@pytest.mark.parametrize("experiment, status, says", IMPORT_AS,
                         ids=[e for e, _, _ in IMPORT_AS])
def test_an_import_as_each_experiment_is_analysed_or_refused_up_front(simulated_dat, tmp_path,
                                                                      experiment, status, says):
    out = tmp_path / "run"
    r = invoke("import", simulated_dat, "-e", experiment, "--comm", "hmy-w*", "-q",
               "--out", out)
    assert r.exit_code == status, r.output
    assert "Traceback" not in r.output
    if status:
        assert says in " ".join(r.output.split()), r.output
        assert not out.exists()                       # refused before anything was made
        return
    m = harmony.load(out).manifest
    assert m["status"] == "complete" and m["experiment"] == experiment
    # no --cpus: the CPU set is the file's 4 simulated CPUs, and the run says it was chosen so
    assert m["cpus"] == [0, 1, 2, 3] and m["source"]["cpus_from"] == "every CPU the file recorded"
    assert "the CPU set is every CPU the file recorded, 0-3 (no --cpus given)" in m["notes"]
    # every parameter recorded is the trace's (its layout, its window) or the analysis's own
    # (bins, tolerance...), never a default of how Harmony starts its tasks
    from harmony.experiments import get_experiment

    exp = get_experiment(experiment)
    assert not set(m["params"]) & (exp.workload_params()
                                   - set(m["source"]["params_from_layout"])), m["params"]


# --- what an imported trace's layout shows of the experiment's parameters ------------------------

REPORT_PLACING = re.compile(r"\[(\d+)\]\s+[\d.]+:\s+(sched_wakeup|sched_switch):\s+(.*)$")


def first_cpus(dat: Path) -> dict[int, int]:
    """Each hmy- task's first CPU, pid -> CPU, read from `trace-cmd report` (not Harmony's
    reader): the target of its first wake-up, or the CPU it was first switched in on."""
    p = subprocess.run([TRACE_CMD, "report", str(dat)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    first: dict[int, int] = {}
    for line in p.stdout.splitlines():
        m = REPORT_PLACING.search(line)
        if not m:
            continue
        if m.group(2) == "sched_wakeup":
            w = re.match(r"hmy-\S*:(\d+) .*CPU:(\d+)", m.group(3))
            if w:
                first.setdefault(int(w.group(1)), int(w.group(2)))
        else:
            w = re.search(r"==> hmy-\S*:(\d+) ", m.group(3))
            if w:
                first.setdefault(int(w.group(1)), int(m.group(1)))
    return first


def layout_of(dat: Path, ncpus: int) -> list[int]:
    """The tasks on each CPU 0..ncpus-1 at their start, from :func:`first_cpus`."""
    where = list(first_cpus(dat).values())
    return [where.count(c) for c in range(ncpus)]


@pytest.fixture(scope="module")
def how_many_dat(tmp_path_factory):
    """A simulated how-many run (x=3, base=2 on 4 CPUs: <5, 5, 5, 2>) and its export."""
    tmp = tmp_path_factory.mktemp("hmdat")
    r = invoke("simulate", "how-many", "--policy", "poly-balance", "--ncpus", 4, "-p", "x=3",
               "-p", "base=2", "-p", "duration=0.5", "-q", "--out", tmp / "sim")
    assert r.exit_code == 0, r.output
    r = invoke("export", tmp / "sim" / "rep-01", "--out", tmp / "hm.dat", "-q")
    assert r.exit_code == 0, r.output
    return tmp / "hm.dat"


@needs_trace_cmd
@pytest.mark.parametrize("experiment", ["how-many", "time-to-resolve"])
def test_an_import_reads_x_and_base_from_the_traces_layout(how_many_dat, tmp_path, experiment):
    """Imported as how-many or time-to-resolve, a trace gives the run the x and base its layout
    at t0 shows (the tasks trace-cmd report places on each CPU: the sources' excess over the
    target, the target's count), not the experiment's defaults (x=10, base=10), and says they
    were read from the layout; -p still wins."""
    layout = layout_of(how_many_dat, 4)
    assert layout == [5, 5, 5, 2]            # the reading: the simulation's <base+x, ..., base>
    r = invoke("import", how_many_dat, "-e", experiment, "--comm", "hmy-*", "-q",
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "run").manifest
    assert (m["params"]["x"], m["params"]["base"]) == (layout[0] - layout[-1], layout[-1])
    assert {"x", "base"} <= set(m["source"]["params_from_layout"])
    assert not {"x", "base"} & set(m["source"]["params_not_known"])
    run = harmony.load(tmp_path / "run")
    assert run.summary["x"] == 3 and run.summary["ntasks"] == sum(layout)
    from harmony.analysis.report import params_line
    assert "read from the trace's layout at t0: base, x" in params_line(m)
    r = invoke("import", how_many_dat, "-e", experiment, "--comm", "hmy-*", "-q", "-p", "x=7",
               "--out", tmp_path / "given")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "given").manifest
    assert m["params"]["x"] == 7 and "x" not in m["source"]["params_from_layout"]
    assert m["params"]["base"] == layout[-1]


@needs_trace_cmd
def test_a_layout_not_of_the_experiments_shape_leaves_its_parameter_unknown(simulated_dat,
                                                                            tmp_path):
    """A single-source trace (all its tasks on the first CPU) imported as how-many: its sources
    hold unequal counts, so x is not known (not listed, named not known, no prediction made from
    it), base is the last CPU's count; imported as spread, ntasks is the first CPU's count; as
    work-conservation, whose CPUs all hold as many, tasks_per_cpu is not known."""
    layout = layout_of(simulated_dat, 4)
    assert layout[0] > 0 and not any(layout[1:]), layout
    r = invoke("import", simulated_dat, "-e", "how-many", "--comm", "hmy-w*",
               "--out", tmp_path / "hm")
    assert r.exit_code == 0, r.output
    run = harmony.load(tmp_path / "hm")
    m = run.manifest
    assert "x" not in m["params"] and "x" in m["source"]["params_not_known"]
    assert m["params"]["base"] == layout[-1] == 0
    assert run.summary["x"] is None
    if run.summary["first_round_moved"] is None:
        assert run.summary["poly_prediction"] is None
    assert "x / tasks / CPUs             ? / " in r.stdout, r.stdout
    r = invoke("import", simulated_dat, "-e", "spread", "--comm", "hmy-w*", "-q",
               "--out", tmp_path / "sp")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "sp").manifest
    assert m["params"]["ntasks"] == layout[0] and m["source"]["params_from_layout"] == ["ntasks"]
    r = invoke("import", simulated_dat, "-e", "work-conservation", "--comm", "hmy-w*", "-q",
               "-p", "idle_at_s=1", "--out", tmp_path / "wc")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "wc").manifest
    assert "tasks_per_cpu" not in m["params"]
    assert "tasks_per_cpu" in m["source"]["params_not_known"]


@needs_trace_cmd
def test_an_import_as_single_source_reads_its_layout(simulated_dat, tmp_path):
    """single-source's layout is the count trace-cmd report places on each CPU."""
    r = invoke("import", simulated_dat, "--comm", "hmy-w*", "-q", "--out", tmp_path / "ss")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "ss").manifest
    assert m["params"]["layout"] == layout_of(simulated_dat, 4)
    assert m["source"]["params_from_layout"] == ["layout"]
    r = invoke("import", simulated_dat, "--comm", "hmy-w*", "-q", "--cpus", "0-1",
               "--out", tmp_path / "two")
    assert r.exit_code == 0, r.output
    m = harmony.load(tmp_path / "two").manifest
    assert m["cpus"] == [0, 1] and m["source"]["cpus_from"] == "--cpus"
    assert not [n for n in m["notes"] if "every CPU the file recorded" in n]


def test_a_stop_as_the_report_is_written_leaves_no_complete_run_without_it(tmp_path,
                                                                          monkeypatch):
    """A stop that lands while a run's report is written (a simulated run: its capture stays
    "captured", as a recorded one's): the manifest on disk never says "complete" without
    report.md beside it (it did: the manifest was written complete before the report)."""
    from harmony import pipeline

    def stopped(run, *a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline, "write_report", stopped)
    r = invoke("simulate", "single-source", "--policy", "pairwise-random", "--ncpus", 4,
               "-p", "duration=1", "-q", "--out", tmp_path / "sim")
    assert r.exit_code != 0
    manifests = list((tmp_path / "sim").rglob("manifest.json"))
    assert manifests
    for m in manifests:
        if json.loads(m.read_text()).get("status") == "complete":
            assert (m.parent / "report.md").is_file(), m
