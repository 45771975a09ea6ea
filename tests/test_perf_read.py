"""The direct perf.data reader (probes/perf_read.py) against what it replaced: ``perf script``'s
text parsed by :class:`~harmony.probes.perf_script.PerfScriptParser`, and the facts ``perf report``
prints. Real recordings (the perf probe's options; call graphs and another event; ``perf sched
record``; one CPU) are compared row by row, every column, with the numpy and the compiled paths; the
perf.data files the fuzz corpus holds likewise; damaged files are one-line errors naming them.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, host_skip
from test_import_export import PINGPONG

from harmony.core.errors import HarmonyError, TraceCorrupt
from harmony.core.jit import numba_version
from harmony.probes import perf_data, perf_read
from harmony.probes.perf import CLOCK_ID, PERF_EVENTS, PerfProbe
from harmony.probes.perf_script import run_perf_script

PERF = shutil.which("perf")
#: the fuzz corpus's seeds: real recordings (its regress-* inputs are what fuzzing made of them)
CORPUS = sorted((ROOT / "fuzz" / "corpus" / "perf_data").glob("seed-*"))


def _plain(path) -> bool:
    head = perf_read.read_header(path)
    return head.compression is None and not head.pipe


#: the corpus files recorded without -z (seed-z-probe was) nor to a pipe (seed-pipe): those
#: whose records are edited or compressed by a test
PLAIN = [p for p in CORPUS if _plain(p)]
#: the corpus files whose records are read in place (seed-pipe's: copied first, aligned)
UNCOMPRESSED = [p for p in CORPUS if perf_read.read_header(p).compression is None]

#: HARMONY_JIT of the reader: "0" its numpy code, "1" its compiled code (:func:`use_jit`)
JIT_MODES = ["0", "1"]


def use_jit(jit: str, monkeypatch) -> None:
    """The reader's numpy ("0") or compiled ("1") code for the test; the compiled one needs numba,
    and without it the case says so (:func:`conftest.host_skip`) rather than vanishing."""
    if jit == "1" and not numba_version():
        host_skip("numba is not installed: the compiled reader cannot run")
    monkeypatch.setenv("HARMONY_JIT", jit)


def assert_same_events(mine: pd.DataFrame, theirs: pd.DataFrame) -> None:
    """Row by row, every column: the same values (categories compared by their strings) and
    dtypes."""
    assert list(mine.columns) == list(theirs.columns)
    assert len(mine) == len(theirs)
    for col in theirs.columns:
        a, b = mine[col], theirs[col]
        assert str(a.dtype) == str(b.dtype), col
        if isinstance(b.dtype, pd.CategoricalDtype):
            a, b = a.astype(str), b.astype(str)
        diff = np.flatnonzero(a.to_numpy() != b.to_numpy())
        assert not diff.size, (col, int(diff[0]), mine.iloc[diff[0]].to_dict(),
                               theirs.iloc[diff[0]].to_dict())


def compare_with_perf(path, monkeypatch, jit: str) -> perf_read.PerfRead:
    """The reader's table and facts against perf script's and perf report's, on ``path``."""
    use_jit(jit, monkeypatch)
    read = perf_read.read_perf_data(path)
    parser, _ = run_perf_script(PERF, path)
    assert_same_events(read.events, parser.events())
    assert read.lost_by_cpu == parser.lost_by_cpu
    assert sum(read.other_events.values()) == sum(parser.other_events.values())
    header = perf_data.run_perf_report(PERF, path, "--header-only")
    assert perf_data.clock_of(read.clockids("sched:")) == perf_data.clock_name(header)
    assert read.header.nr_cpus_online == perf_data.header_number(header, "nrcpus online")
    assert f"# os release : {read.header.os_release}\n" in header
    stats = perf_data.lost_samples_by_event(perf_data.run_perf_report(PERF, path, "--stats"))
    for name, n in (stats or {}).items():
        assert read.lost_samples_by_event.get(name, 0) == n, (name, read.lost_samples_by_event)
    return read


# --- real recordings -----------------------------------------------------------------------------

def _record(path, *args):
    """``perf record ARGS -o path -- python PINGPONG 0.1``; skips where perf cannot record. A
    name ending in ``-pipe``: ``-o -``, its output (pipe mode) written to ``path``. A tenth of a
    second holds tens of thousands of switches, every kind of record the tests read, and keeps
    the system-wide recordings a few MB (0.3 s made 10-15 MB: the fuzz of damaged copies, which
    reads each copy whole, took ~70 s of the kernel session on them)."""
    piped = path.stem.endswith("-pipe")
    cmd = [PERF, *args, "-o", "-" if piped else str(path), "--", sys.executable, "-c", PINGPONG,
           "0.1"]
    with open(path, "wb") if piped else open(os.devnull, "wb") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        host_skip(f"{' '.join(cmd[:3])} cannot record here: {p.stderr.strip()[-200:]}")
    return path


RECORDINGS = {
    # the perf probe's own options (PerfProbe.command), system-wide
    "probe": ["record", "-q", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID, "-B", "-N", "--synth=no"],
    # every sched tracepoint, call chains, and samples of another event (cpu-clock)
    "callgraph": ["record", "-q", "-g", "-a", "-e", "sched:*", "-e", "cpu-clock"],
    # perf's own sched recording: sched_waking, the sched_stat_* events, perf's default clock
    "sched": ["sched", "record"],
    # the probe's options, its records compressed (zstd) as perf record -z writes them
    "compressed": ["record", "-q", "-z", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID, "-B", "-N",
                   "--synth=no"],
    # pipe mode (perf record -o -): the header's attrs, features and tracing data are records
    "probe-pipe": ["record", "-q", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID, "-B", "-N"],
    "compressed-pipe": ["record", "-q", "-z", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID, "-B",
                        "-N"],
}


@pytest.fixture(scope="module")
def recordings(kernel, tmp_path_factory):
    if PERF is None:
        host_skip("perf is not installed")
    ok, why = PerfProbe.available()
    if not ok:
        host_skip(why)
    d = tmp_path_factory.mktemp("perfread")
    return {name: _record(d / f"{name}.data", *args) for name, args in RECORDINGS.items()}


@pytest.mark.kernel
@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_kernel_recordings_read_as_perf_script_prints_them(recordings, monkeypatch, name, jit):
    read = compare_with_perf(recordings[name], monkeypatch, jit)
    assert len(read.events) > 100 and read.decoder == ("compiled" if jit == "1" else "numpy")
    assert read.records["SAMPLE"] == read.n_samples
    assert (read.header.compression is not None) == name.startswith("compressed")
    assert any("were compressed" in n for n in read.notes) == name.startswith("compressed")
    assert read.header.pipe == name.endswith("-pipe")
    assert not any("ends inside a record" in n for n in read.notes)


@pytest.mark.kernel
@pytest.mark.parametrize("name", ["probe", "callgraph", "sched", "probe-pipe"])
def test_kernel_compiled_samples_are_the_samples_numpy_reads(recordings, name):
    """As test_compiled_samples_are_the_samples_numpy_reads, on real recordings: the perf
    probe's, call chains and another event's, perf sched record's, a pipe's."""
    if not numba_version():
        host_skip("numba is not installed")
    assert compiled_samples_as_numpy_reads(recordings[name]) > 1000


def pipe_record_starts(whole: bytes) -> set[int]:
    """Where each record of a pipe-mode perf.data starts, and where the file ends, by perf's
    format and nothing of the reader's: a 16-byte file header, then records of a perf_event_header
    (u32 type, u16 misc, u16 size), HEADER_TRACING_DATA (66) followed by as many bytes as its u32
    says."""
    starts, at = set(), 16
    while at + 8 <= len(whole):
        starts.add(at)
        typ, _misc, size = struct.unpack_from("<IHH", whole, at)
        assert size >= 8, f"a record of {size} bytes at file offset {at}"
        at += size + (struct.unpack_from("<I", whole, at + 8)[0] if typ == 66 else 0)
    return starts | {at}


@pytest.mark.kernel
def test_kernel_pipe_mode_cut_short_is_read_to_its_last_whole_record(recordings, tmp_path):
    """A pipe-mode file has no size of its data but its own: one cut short (perf stopped while
    it wrote) is read to the last whole record, and says how much it left unread; a file cut
    inside the records that stand for its header is an error naming it. A cut that falls
    between two records leaves a file nothing tells from a whole one, and a fixed offset does
    now and then (a fresh clone's CI, 2026-12-07: the middle of the file, 5 bytes on, was where
    a record began among the uncompressed ones a -z recording starts with): such a cut is moved
    a byte into the record."""
    for name in ("probe-pipe", "compressed-pipe"):
        whole = recordings[name].read_bytes()
        full = perf_read.read_perf_data(recordings[name])
        head = full.header
        path = tmp_path / "cut.data"
        starts = pipe_record_starts(whole)
        assert max(starts) == len(whole) and head.data_offset in starts
        for keep in (len(whole) - 3, (head.data_offset + len(whole)) // 2 + 5):
            keep += keep in starts          # records are 8 bytes or more: keep + 1 is inside
            path.write_bytes(whole[:keep])
            read = perf_read.read_perf_data(path)
            cut = [n for n in read.notes if "ends inside a record" in n]
            assert len(cut) == 1 and "its last" in cut[0], read.notes
            at = int(re.search(r"at file offset (\d+)", cut[0]).group(1))
            assert at in starts and at < keep and not any(at < s < keep for s in starts)
            # events of the whole file, as many as the whole records before the cut hold (a
            # probe-pipe record is one event, so half the file holds some; one compressed record
            # may hold the whole recording, and a cut one then holds none)
            def rows(df):
                return collections.Counter(map(tuple, df.astype(str).itertuples(index=False)))
            assert not rows(read.events) - rows(full.events)
            assert len(read.events) > 0 or name.startswith("compressed"), read.notes
        path.write_bytes(whole[:head.data_offset - 100])
        with pytest.raises(TraceCorrupt, match=str(path)):
            perf_read.read_perf_data(path)


@pytest.mark.kernel
@pytest.mark.needs_cpus(2)
def test_kernel_recorded_cpus_are_the_cpu_map_perf_reports(kernel, tmp_path, monkeypatch):
    if PERF is None:
        host_skip("perf is not installed")
    cpu = max(os.sched_getaffinity(0))
    path = _record(tmp_path / "perf.data", "record", "-q", "-C", str(cpu), "-e", "sched:*")
    read = compare_with_perf(path, monkeypatch, "0")
    assert read.recorded_cpus == perf_data.recorded_cpus(PERF, path) == {cpu}


@pytest.mark.kernel
@pytest.mark.parametrize("jit", JIT_MODES)
def test_kernel_damaged_recordings_are_one_line_errors(recordings, tmp_path, monkeypatch, jit):
    use_jit(jit, monkeypatch)
    # fewer cases than the hermetic corpus test (test_damaged_corpus_files_are_one_line_errors):
    # these are CPU-bound and run in the serial kernel session (26 s of CI at 200/100/100)
    damaged(recordings["callgraph"].read_bytes(), tmp_path / "perf.data", cases=100)
    damaged(recordings["compressed"].read_bytes(), tmp_path / "perf.data", cases=50)
    damaged(recordings["probe-pipe"].read_bytes(), tmp_path / "perf.data", cases=50)


# --- the files the fuzz corpus holds -------------------------------------------------------------

@pytest.mark.needs_tool("perf")
@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_files_read_as_perf_script_prints_them(path, tmp_path, monkeypatch, jit):
    """Every seed is a whole recording perf made: it reads, as perf script prints it."""
    p = tmp_path / "perf.data"
    p.write_bytes(path.read_bytes())
    perf_data.check_perf_data(p)
    compare_with_perf(p, monkeypatch, jit)


def damaged(content: bytes, path, cases: int) -> None:
    """Truncated and bit-flipped copies of ``content`` at ``path``: each one decodes or is a
    HarmonyError of one line naming ``path``; a truncated copy of a file is refused, of a
    pipe-mode file read to its last whole record (refused if cut in the records it begins
    with)."""
    path.write_bytes(content)
    head = perf_read.read_header(path)
    rng = random.Random(26)
    variants = [content[:k] for k in range(0, len(content), max(1, len(content) // cases))]
    for _ in range(cases):
        b = bytearray(content)
        for _ in range(rng.choice((1, 4, 16))):
            b[rng.randrange(len(b))] = rng.randrange(256)
        variants.append(bytes(b))
    refused = []
    for v in variants:
        path.write_bytes(v)
        try:
            perf_read.read_perf_data(path)
        except HarmonyError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc), str(exc)
            refused.append(v)
    if not head.pipe:
        assert len(refused) >= len(variants) // 4     # every cut short one, at least
        return
    cut = [len(v) for v in variants if len(v) < len(content)]
    assert [n for n in cut if n > head.data_offset]       # some cut in its records
    refused_cut = [len(v) for v in refused if len(v) < len(content)]
    assert [n for n in refused_cut if n > head.data_offset] == []


@pytest.mark.parametrize("jit", JIT_MODES)
def test_damaged_corpus_files_are_one_line_errors(tmp_path, monkeypatch, jit):
    use_jit(jit, monkeypatch)
    for path in CORPUS:
        damaged(path.read_bytes(), tmp_path / "perf.data", cases=150)


def _header(hsize=104, data_size=8, flags0=0) -> bytes:
    return struct.pack("<8sQQ QQ QQ QQ 4Q", b"PERFILE2", hsize, 136, 104, 0, 104, data_size, 0,
                       0, flags0, 0, 0, 0) + bytes(8)


@pytest.mark.parametrize("content,why", [
    (b"", "bad magic"), (b"PERFILE2" + (16).to_bytes(8, "little"), "no events"),
    (_header(data_size=0), "did not finish"),
    (_header(data_size=4096), "truncated"),
    (_header(flags0=1 << 27) + bytes(16), "corrupt compression section"),
    (_header(flags0=1 << 27) + struct.pack("<QQ5I", 128, 20, 0, 2, 1, 5, 0), "with type 2"),
])
def test_layouts_it_does_not_read_are_named(tmp_path, content, why):
    path = tmp_path / "perf.data"
    path.write_bytes(content)
    with pytest.raises(TraceCorrupt, match=why) as exc:
        perf_read.read_perf_data(path)
    assert str(exc.value).startswith(f"{path}: ") and "\n" not in str(exc.value)


def test_compiled_walk_finds_the_records_python_finds(monkeypatch):
    if not numba_version():
        host_skip("numba is not installed")
    for path in CORPUS:
        head = perf_read.read_header(path)
        buf = np.frombuffer(path.read_bytes(), np.uint8, count=head.data_size,
                            offset=head.data_offset)
        monkeypatch.setenv("HARMONY_JIT", "0")
        py = perf_read.walk_records(buf)
        monkeypatch.setenv("HARMONY_JIT", "1")
        jit = perf_read.walk_records(buf)
        for a, b in zip(py[:3], jit[:3]):
            assert a.tolist() == b.tolist()
        assert py[3] == jit[3] == -1
        cut = buf[:len(buf) - 4]       # the last record runs past the end: both say where
        assert perf_read.walk_records(cut)[3] == int(py[0][-1])


def _slab_samples(path):
    """(the data section of ``path`` as one slab, its walk, its attrs, which become rows)."""
    head = perf_read.read_header(path)
    content = path.read_bytes()
    if head.pipe:       # a pipe-mode file's records are 4 bytes off a word: copied, aligned
        content = bytes(4) + content
        start = 4 + head.data_offset
    else:
        start = head.data_offset
    size = len(content) - start if head.pipe else head.data_size
    buf = np.frombuffer(content, np.uint8, count=size - size % 8, offset=start)
    attrs = head.attrs
    tp = [k for k, a in enumerate(attrs)
          if a.type == perf_read.PERF_TYPE_TRACEPOINT and a.sample_type & perf_read.SAMPLE_RAW]
    formats = head.formats_for(sorted({attrs[k].config for k in tp}))
    walked = perf_read.walk_records(buf)[:3]
    return perf_read._DataSection(path, buf, start), walked, attrs, perf_read._row_attrs(
        attrs, tp, formats)


def compiled_samples_as_numpy_reads(path) -> int:
    """perf_read.compiled_samples against numpy's passes on ``path``'s records as one slab;
    and on copies of them with the last row's sample damaged: its CPU past an int16's, its
    payload's size past its record. Returns the rows."""
    src, walked, attrs, rows = _slab_samples(path)
    got = perf_read.compiled_samples(src.buf, walked, attrs, rows)
    assert got is not None
    places = perf_read._record_places(*walked)
    s_off = places["samples"][0]
    s_attr, _ = perf_read._sample_attrs(path, src, attrs, places, 0)
    per_attr = np.bincount(s_attr + 1, minlength=len(attrs) + 1)
    groups, _ = perf_read._sample_groups(attrs, per_attr, rows)
    want = perf_read._samples_in_order(path, src, attrs, places, s_attr, groups, 0, [])
    assert got[0].tolist() == per_attr.tolist()
    for mine, theirs in zip(got[1], want):
        assert mine.dtype == theirs.dtype and mine.tolist() == theirs.tolist()
    # the last sample that becomes a row, if its payload follows its fixed fields
    last = int(np.flatnonzero(rows[s_attr])[-1])
    st = attrs[int(s_attr[last])].sample_type
    fixed = [b for b in perf_read._FIXED_FIELDS if st & b]
    body = int(s_off[last]) + 8
    damages = [(body + 8 * fixed.index(perf_read.SAMPLE_CPU), (1 << 16) + 1, "CPU 65537")]
    if not st & (perf_read.SAMPLE_READ | perf_read.SAMPLE_CALLCHAIN):
        damages.append((body + 8 * len(fixed), 1 << 20, "raw data runs past the record"))
    for at, value, why in damages:
        buf = src.buf.copy()
        buf[at:at + 4] = np.frombuffer(struct.pack("<I", value), np.uint8)
        bad = perf_read._DataSection(path, buf, src.data_offset)
        assert perf_read.compiled_samples(buf, walked, attrs, rows) is None
        with pytest.raises(TraceCorrupt, match=why):
            perf_read._samples_in_order(path, bad, attrs, perf_read._record_places(*walked),
                                        s_attr, groups, 0, [])
    return len(want[0])


@pytest.mark.parametrize("path", UNCOMPRESSED, ids=[p.name for p in UNCOMPRESSED])
def test_compiled_samples_are_the_samples_numpy_reads(path):
    """perf_read.compiled_samples (one compiled pass over a slab's records) gives each attr's
    samples and the rows' columns, in time order, that numpy's passes give (_sample_attrs,
    _sample_groups, _samples_in_order); a sample numpy refuses it hands to numpy, which names
    it."""
    if not numba_version():
        host_skip("numba is not installed")
    assert compiled_samples_as_numpy_reads(path) >= 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_read_a_slab_at_a_time_it_is_the_same(path, tmp_path, monkeypatch, jit, threads):
    """The reader reads the data section a slab at a time (perf_read.SLAB_BYTES), each slab's
    events decoded on its own and the slabs' joined: slabs of a few records (one longer than a
    slab is read in a longer one) give the same table, category order and facts as the file read
    in one slab (which test_corpus_files_read_as_perf_script_prints_them holds to perf script),
    whatever the alignment of the records in the file (a pipe-mode file's are 4 bytes off a
    word), and whether the slabs are decoded two at a time (every other one on the side thread,
    while the next is read into a buffer of its own) or one after the other."""
    use_jit(jit, monkeypatch)
    monkeypatch.setattr(perf_read, "threads", lambda: threads)
    p = tmp_path / "perf.data"
    p.write_bytes(path.read_bytes())
    whole = perf_read.read_perf_data(p)      # a seed is a whole recording: it reads
    sizes, where = [], set()
    real = perf_read._read_slab

    def spy(path, src, walked, *args):
        sizes.append(len(src.buf))
        where.add(threading.current_thread().name.startswith("harmony-side"))
        return real(path, src, walked, *args)

    monkeypatch.setattr(perf_read, "_read_slab", spy)
    for slab in (64, 1000, 4096):
        monkeypatch.setattr(perf_read, "SLAB_BYTES", slab)
        sizes.clear()
        where.clear()
        bits = perf_read.read_perf_data(p)
        assert len(sizes) > 1 or whole.header.data_size <= slab
        # the first slab on the side thread, the next on this one; or all on this one
        assert where == ({False} if threads == 1 else {True} if len(sizes) == 1 else
                         {True, False})
        assert_same_events(bits.events, whole.events)
        assert list(bits.events["event"].cat.categories) == \
            list(whole.events["event"].cat.categories)
        assert (bits.lost_by_cpu, bits.lost_samples_by_event, bits.other_events, bits.records,
                bits.recorded_cpus, bits.notes, bits.n_samples, bits.decoder) == \
            (whole.lost_by_cpu, whole.lost_samples_by_event, whole.other_events, whole.records,
             whole.recorded_cpus, whole.notes, whole.n_samples, whole.decoder)


def test_slabs_events_are_joined_in_order_whatever_their_strings():
    """perf_read._Rows: slabs' events (each in order, overlapping in time where perf's rounds
    did) written one after the other are the table of them all in the order of every events
    table, their string columns' categories joined, however many (here 300 comms: codes wider
    than the first slab's), with columns sized short at first and grown."""
    from harmony.probes.schema import make_events
    rng = np.random.default_rng(48)
    slabs = []
    t0 = 0
    for k in range(3):
        n = 1000
        ts = np.sort(t0 + rng.integers(0, 5000, n))      # each slab overlaps the one before
        t0 += 3000
        slabs.append(make_events({
            "ts": ts, "cpu": rng.integers(0, 4, n).astype(np.int16), "pid": rng.integers(1, 9, n),
            "event": rng.choice(["sched_switch", "sched_wakeup"], n),
            "comm": [f"task-{k * 100 + int(i)}" for i in rng.integers(0, 100, n)],
            "prev_comm": rng.choice(["a", "b"], n)}))
    whole = make_events({c: np.concatenate([s[c].astype(object if isinstance(
        s[c].dtype, pd.CategoricalDtype) else s[c].dtype).to_numpy() for s in slabs])
        for c in slabs[0].columns})
    rows = perf_read._Rows()
    total = 3 * 1000
    for k, s in enumerate(slabs):
        rows.add(s, "numpy", (k + 1) * 1000, total // 2)     # sized short: grown on the way
    rows.add(slabs[0].iloc[:0], "compiled", total, total)       # an empty slab: nothing
    got, decoder = rows.table({})
    assert decoder == "numpy"
    assert_same_events(got, whole)
    assert got["comm"].cat.codes.dtype == np.int16 and len(got["comm"].cat.categories) == 300


def test_a_sample_too_short_for_its_id_is_named(tmp_path):
    """The last record of the data section cut into header-only samples (8 bytes each): the
    sample id after the header would lie past the section."""
    for path in PLAIN:
        head = perf_read.read_header(path)
        content = bytearray(path.read_bytes())
        buf = np.frombuffer(bytes(content), np.uint8, count=head.data_size,
                            offset=head.data_offset)
        offs, _, sizes, _ = perf_read.walk_records(buf)
        at, size = head.data_offset + int(offs[-1]), int(sizes[-1])
        content[at:at + size] = struct.pack("<IHH", 9, 0, 8) * (size // 8)
        p = tmp_path / "perf.data"
        p.write_bytes(bytes(content))
        with pytest.raises(TraceCorrupt, match="too short for its id") as exc:
            perf_read.read_perf_data(p)
        assert str(exc.value).startswith(f"{p}: ")


@pytest.mark.parametrize("field, sample_type", [
    ("call chain", perf_read.SAMPLE_CALLCHAIN | perf_read.SAMPLE_RAW),
    ("read group", perf_read.SAMPLE_READ | perf_read.SAMPLE_RAW)])
def test_a_count_with_its_top_bit_flipped_is_a_one_line_error(tmp_path, field, sample_type):
    """A call chain's or read group's count read as int64 is negative when a damaged file sets
    its top bit: refused like one too large, never a position before the record (found by the
    damaged-recordings test in CI: an IndexError)."""
    body = np.zeros(8, np.uint64)
    body[0] = (1 << 63) | 1                     # the count
    buf = body.view(np.uint8)
    src = perf_read._DataSection(tmp_path / "perf.data", buf, 4096)
    p, end = np.array([0], np.int64), np.array([len(buf)], np.int64)
    with pytest.raises(TraceCorrupt, match=rf"perf\.data: corrupt sample at file offset 4096: its "
                                           rf"{field} runs past the record$"):
        perf_read._sample_fields(sample_type, perf_read.FORMAT_GROUP, src, p, end,
                                 tmp_path / "perf.data", np.array([0], np.int64), 4096)


# --- compressed records (perf record -z) ----------------------------------------------------------

def _zstd_compress(data: bytes) -> bytes:
    import ctypes

    from harmony.probes.tracedat_read import _zstd_lib
    lib = _zstd_lib()
    if lib is None or not hasattr(lib, "ZSTD_compress"):
        host_skip("libzstd is not available")
    lib.ZSTD_compressBound.restype = ctypes.c_size_t
    lib.ZSTD_compressBound.argtypes = (ctypes.c_size_t,)
    lib.ZSTD_compress.restype = ctypes.c_size_t
    lib.ZSTD_compress.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_int)
    out = ctypes.create_string_buffer(lib.ZSTD_compressBound(len(data)))
    n = lib.ZSTD_compress(out, len(out), data, len(data), 1)
    assert not lib.ZSTD_isError(n)
    return out.raw[:n]


def compressed_copy(src, dst, cuts: int, seed: int, stream: bytes | None = None) -> int:
    """``src`` as perf record -z writes it: its data section's records as one zstd stream
    (``stream``: these bytes instead) cut at random places into COMPRESSED and COMPRESSED2 records
    (8-byte aligned, padded), a FINISHED_ROUND after some, and a HEADER_COMPRESSED feature; the
    other feature sections moved behind the new data section. The stream is frames of the
    records cut at random bytes, each part ending at one or inside one: as perf flushes its
    stream, a part may end inside a record, and a FINISHED_ROUND come before the rest of it.
    Returns the compressed records written."""
    raw = src.read_bytes()
    head = list(struct.unpack_from("<8sQQ QQ QQ QQ 4Q", raw, 0))
    data_off, data_size, flags = head[5], head[6], head[9:13]
    bits = [b for b in range(256) if flags[b // 64] >> (b % 64) & 1]
    table = data_off + data_size
    sections = {b: struct.unpack_from("<QQ", raw, table + 16 * i) for i, b in enumerate(bits)}
    records = raw[data_off:data_off + data_size]
    rng = random.Random(seed)
    if stream is None:
        byte_cuts = sorted(rng.sample(range(1, len(records)), min(cuts, len(records) - 1)))
        frames = [_zstd_compress(records[a:b])
                  for a, b in zip([0] + byte_cuts, byte_cuts + [len(records)])]
        ends = list(itertools.accumulate(len(f) for f in frames))[:-1]
        frame = b"".join(frames)
    else:
        frame, ends = stream, []
    inner = rng.sample(range(1, len(frame)), min(cuts, len(frame) - 1))
    at = sorted(set(ends) | set(inner[:len(inner) // 2]))
    cuts = len(at)
    data = bytearray()
    for k, (a, b) in enumerate(zip([0] + at, at + [len(frame)])):
        part = frame[a:b]
        if rng.random() < 0.5:
            data += struct.pack("<IHH", 81, 0, 8 + len(part)) + part
        else:
            pad = -(16 + len(part)) % 8
            data += struct.pack("<IHHQ", 83, 0, 16 + len(part) + pad, len(part)) + part + bytes(pad)
        if rng.random() < 0.3:
            data += struct.pack("<IHH", 68, 0, 8)      # FINISHED_ROUND
    bits2 = sorted(set(bits) | {27})
    content = {b: raw[o:o + n] for b, (o, n) in sections.items()}
    content[27] = struct.pack("<5I", 0, 1, 1, max(1, len(records) // len(frame)), 528384)
    pos = data_off + len(data) + 16 * len(bits2)
    tab, body = bytearray(), bytearray()
    for b in bits2:
        tab += struct.pack("<QQ", pos + len(body), len(content[b]))
        body += content[b]
    head[6] = len(data)
    head[9] |= 1 << 27
    out = bytearray(raw[:data_off])
    struct.pack_into("<8sQQ QQ QQ QQ 4Q", out, 0, *head)
    dst.write_bytes(bytes(out) + bytes(data) + bytes(tab) + bytes(body))
    return cuts + 1


@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("path", PLAIN, ids=[p.name for p in PLAIN])
def test_compressed_records_read_as_the_records_they_hold(path, tmp_path, monkeypatch, jit):
    """The stream cut anywhere (inside a record's header too), in records of both kinds: the
    same table and facts as the file uncompressed, and a note that says so."""
    use_jit(jit, monkeypatch)
    plain = perf_read.read_perf_data(path)
    for seed, cuts in ((1, 1), (2, 7), (3, 400)):
        z = tmp_path / f"z{seed}.data"
        parts = compressed_copy(path, z, cuts, seed)
        read = perf_read.read_perf_data(z)
        pd.testing.assert_frame_equal(read.events, plain.events)
        assert (read.lost_by_cpu, read.lost_samples_by_event, read.other_events, read.recorded_cpus,
                read.n_samples) == (plain.lost_by_cpu, plain.lost_samples_by_event,
                                    plain.other_events, plain.recorded_cpus, plain.n_samples)
        assert read.header.compression == (1, read.header.compression[1])
        assert [n for n in read.notes if "were compressed" not in n] == plain.notes
        assert any(f"zstd level 1): {parts} compressed records" in n for n in read.notes)


def test_damaged_compressed_records_are_one_line_errors(tmp_path):
    path = PLAIN[0]
    frame = _zstd_compress(path.read_bytes()[2000:40000])
    for name, stream in (("garbage", bytes(range(256)) * 8), ("cut", frame[:len(frame) // 2]),
                         ("not records", frame)):
        z = tmp_path / f"{name}.data"
        compressed_copy(path, z, 5, 4, stream=stream)
        with pytest.raises(TraceCorrupt) as exc:
            perf_read.read_perf_data(z)
        assert str(exc.value).startswith(f"{z}") and "\n" not in str(exc.value), str(exc.value)
    z = tmp_path / "z.data"
    compressed_copy(path, z, 20, 5)
    damaged(z.read_bytes(), tmp_path / "perf.data", cases=120)


def test_a_stream_decompressed_into_too_small_an_array_grows_it():
    from harmony.probes.tracedat_read import ZstdStream
    records = PLAIN[0].read_bytes()[:50_000]
    frames = b"".join(_zstd_compress(records[a:a + 7000]) for a in range(0, len(records), 7000))
    out, used = np.empty(1, np.uint8), 0
    with ZstdStream(PLAIN[0], "test records", 1 << 20) as z:
        for a in range(0, len(frames), 999):
            out, used = z.feed(frames[a:a + 999], out, used)
        assert z.whole
    assert bytes(out[:used]) == records
    with ZstdStream(PLAIN[0], "test records", 10_000) as z:      # past the limit: refused
        with pytest.raises(TraceCorrupt, match="decompress to more than 10000 bytes"):
            z.feed(frames, np.empty(1, np.uint8), 0)


def test_the_events_of_one_instant_come_by_cpu_as_in_every_events_table():
    """perf script prints the samples of one nanosecond in file order, where a CPU's sample read a
    round later follows another CPU's; every Harmony table (make_events, the tracefs merge) puts
    them by CPU, one CPU's in file order: the reader's order is lexsort's (cpu, then time)."""
    rng = np.random.default_rng(7)
    for n, span in ((1, 1), (50, 3), (5000, 400), (5000, 10**9)):
        ts = rng.integers(0, span, n).astype(np.int64)
        cpu = rng.integers(0, 4, n).astype(np.int16)
        order, in_order = perf_read.by_time_then_cpu(ts, cpu)
        assert np.array_equal(order, np.lexsort((cpu, ts))), (n, span)
        assert np.array_equal(in_order, ts[order])
