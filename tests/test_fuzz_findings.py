"""What fuzzing the parsers of outside input found (fuzz/README.md), each kept as a regression test.

Each test feeds the smallest form of the input that broke a parser and checks that it now decodes
or raises Harmony's one-line error naming the file; the input fuzzing found is also saved as
fuzz/corpus/<target>/regress-* and replayed by tests/test_fuzz_corpus.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from harmony.core.errors import HarmonyError

FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))

from targets import unpack, write_tree  # noqa: E402


def one_line_naming(exc: BaseException, path: Path) -> str:
    msg = str(exc)
    assert isinstance(exc, HarmonyError) and "\n" not in msg and str(path) in msg, repr(exc)
    return msg


# --- event formats (fuzz target "formats") -----------------------------------------------------

SWITCH = """name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char next_comm[{n}];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:{off};\tsize:4;\tsigned:1;
"""


def test_decimal_array_length_with_a_leading_zero(tmp_path):
    """char next_comm[08] raised ValueError (int("08", 0)): a length is read in decimal."""
    from harmony.probes.formats import load_format
    p = tmp_path / "format"
    p.write_text(SWITCH.format(n="016", off=24))
    assert load_format(p, "sched").fields["next_comm"].array_len == 16


@pytest.mark.parametrize("n, off", [("16", "9" * 5000), ("9" * 5000, "24"), ("0x" + "f" * 40, "24"),
                                    ("16", "99999999999")])
def test_huge_offsets_and_lengths_are_refused(tmp_path, n, off):
    """An offset of 5000 digits raised ValueError (int's digit limit). Nothing in a ring-buffer
    page lies past 16 MiB: larger numbers are refused as they are read."""
    from harmony.probes.base import TraceCorrupt
    from harmony.probes.formats import load_format
    p = tmp_path / "format"
    p.write_text(SWITCH.format(n=n, off=off))
    with pytest.raises(TraceCorrupt) as e:
        load_format(p, "sched")
    assert "larger than a ring-buffer page" in one_line_naming(e.value, p)


@pytest.mark.parametrize("field, size", [("common_type", 4), ("common_type", 6),
                                         ("common_pid", 0), ("common_pid", 16)])
def test_common_fields_of_impossible_sizes_are_refused(tmp_path, field, size):
    """Fuzzing (targets ringbuf_jit, tracedat, in the campaigns): a common_type of 6 bytes made the
    decoder ask for a type table of 2^48 entries (MemoryError, 1 PiB), one of 4 bytes for 2^32
    (16 GiB, 12 s compiled and 59 s numpy before a later error); a signed common_pid of 0 bytes
    raised ValueError (negative shift count)."""
    from harmony.probes.base import TraceCorrupt
    from harmony.probes.formats import load_format
    p = tmp_path / "format"
    text = SWITCH.format(n=16, off=24) + (
        "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n")
    text = re.sub(rf"{field};\toffset:(\d+);\tsize:\d+;", rf"{field};\toffset:\1;\tsize:{size};",
                  text)
    p.write_text(text)
    with pytest.raises(TraceCorrupt) as e:
        load_format(p, "sched")
    assert f"{field} of {size} bytes" in one_line_naming(e.value, p)


@pytest.mark.parametrize("exprs", ["(1 << 4000000000)", "1+" * 5000 + "1", "1 << 64"])
def test_preempt_mask_is_evaluated_bounded(exprs):
    """A mask of 1 << 4000000000 took 6 s and 500 MB (found reading the parser); one of
    5000 terms raised RecursionError. The mask is evaluated as the kernel's 64-bit arithmetic,
    short expressions only, and never executed."""
    from harmony.probes.formats import eval_c_int_expr, preempt_flag_from_print_fmt
    assert preempt_flag_from_print_fmt(f'"%s", REC->prev_state & ({exprs}) ? "+" : ""') is None
    assert eval_c_int_expr("(((0x00000000 | 0x00000001 | 0x00000040) + 1) << 1)") == 0x84
    assert eval_c_int_expr("~0UL") == (1 << 64) - 1


# --- trace.dat (fuzz target "tracedat") --------------------------------------------------------

def test_compressed_size_header_is_checked_before_memory_is_taken(tmp_path):
    """A zstd chunk whose header claims 4 GiB: 21 s and 8.3 GB (a zero-filled buffer of the
    claimed size, then a copy) before zstd refused the frame. Found reading the parser."""
    import struct

    from harmony.probes.base import TraceCorrupt
    from harmony.probes.tracedat_read import decode_tracedat, read_tracedat
    seed = FUZZ / "corpus" / "tracedat" / "seed-v7-zstd"
    off, _ = read_tracedat(seed).buffers[0].cpus[0]
    data = bytearray(seed.read_bytes())
    csize, usize = struct.unpack_from("<II", data, off + 4)
    for claim in (0xFFFFFFF0, usize + 1):           # more than zstd can give; not the frame's size
        struct.pack_into("<I", data, off + 8, claim)
        bad = tmp_path / "bomb.dat"
        bad.write_bytes(data)
        with pytest.raises(TraceCorrupt) as e:
            decode_tracedat(bad)
        assert f"header says {claim}" in one_line_naming(e.value, bad)


# --- a tracefs recording (fuzz targets "ringbuf", "ringbuf_jit") -------------------------------

def test_header_page_of_an_impossible_layout_is_named(tmp_path):
    """A header_page with the data at offset 17 was refused naming "trace" (no CPU file), not
    the header_page that said so."""
    from harmony.probes.base import TraceCorrupt
    from harmony.probes.ringbuf import decode_dir
    files = unpack((FUZZ / "corpus" / "ringbuf" / "seed-tracefs").read_bytes())
    files = {k: v for k, v in files.items() if not k.endswith(".raw")}
    files["formats/header_page"] = files["formats/header_page"].replace(b"offset:16", b"offset:17")
    write_tree(tmp_path / "raw", files)
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(tmp_path / "raw")
    assert "data at 17" in one_line_naming(e.value, tmp_path / "raw" / "formats" / "header_page")


@pytest.mark.parametrize("key, value", [("cpus", [10 ** 300]), ("events_enabled", 5),
                                        ("events_enabled", [[1]]), ("clock", ["mono"])])
def test_recording_meta_of_the_wrong_kind_is_named(tmp_path, key, value):
    """Found reading the decoder for the fuzz target ringbuf: a CPU number of 300 digits raised
    OSError (file name too long), an events_enabled that is no list of names and a clock that is
    no string TypeError."""
    import json

    from harmony.probes.base import TraceCorrupt
    from harmony.probes.ringbuf import decode_dir
    files = unpack((FUZZ / "corpus" / "ringbuf" / "seed-tracefs").read_bytes())
    meta = json.loads(files["meta.json"])
    files["meta.json"] = json.dumps(dict(meta, **{key: value})).encode()
    write_tree(tmp_path / "raw", files)
    with pytest.raises(TraceCorrupt) as e:
        decode_dir(tmp_path / "raw")
    assert f"bad {key}" in one_line_naming(e.value, tmp_path / "raw" / "meta.json")


# --- run directories (fuzz target "rundir") ----------------------------------------------------

@pytest.mark.parametrize("manifest", ['{"status": "complete", "tables": ["' + "x" * 300 + '"]}',
                                      '{"status": "complete", "tables": 5}',
                                      '[1, 2]', "[" * 100000, '{"a": ' + "9" * 5000 + "}",
                                      '{"status": "running", "controller_pid": "abc"}'])
def test_corrupt_manifest_is_one_line_naming_it(tmp_path, manifest):
    """A table name of 300 characters raised OSError (file name too long) and a 'tables' that is
    no list TypeError; a manifest that is a JSON list AttributeError; deep nesting RecursionError;
    a 5000-digit number ValueError; a controller_pid that is no number ValueError."""
    from harmony import pipeline, store
    (tmp_path / "manifest.json").write_text(manifest)
    for load in (store.open_run, pipeline.load_checked):
        try:
            load(tmp_path)
        except HarmonyError as exc:
            one_line_naming(exc, tmp_path)
    (tmp_path / "manifest.json").write_text('{"status": "complete"}')
    (tmp_path / "summary.json").write_text("[]")
    with pytest.raises(HarmonyError) as e:
        store.open_run(tmp_path).summary
    one_line_naming(e.value, tmp_path / "summary.json")


def test_damaged_parquet_is_one_line_naming_it(tmp_path):
    """A damaged runqueue.parquet was refused with pyarrow's two-line message ("Couldn't
    deserialize thrift: ...\\n") inside the RunError."""
    from harmony import store
    files = unpack((FUZZ / "corpus" / "rundir" / "regress-parquet-error-of-two-lines").read_bytes())
    bad = tmp_path / "runqueue.parquet"
    bad.write_bytes(files["runqueue.parquet"])
    with pytest.raises(HarmonyError) as e:
        store.read_table(bad)
    one_line_naming(e.value, bad)
    assert "unreadable" in store.table_problems(tmp_path, ["runqueue"])["runqueue"]


# --- perf script output (fuzz target "perf_text") ----------------------------------------------

@pytest.mark.parametrize("bad", [
    " 6468 [\u0663]   354.805768520:       sched:sched_migrate_task: comm=a pid=1 prio=1 "
    "orig_cpu=0 dest_cpu=1",                                  # an Arabic-Indic digit: ValueError
    " 6468 [000]   354.805768520:       sched:sched_migrate_task: comm=a pid=999999999999999 "
    "prio=1 orig_cpu=70000 dest_cpu=1",                       # pid and CPU wrapped around
    " 6468 [000]   99999999999999999999999.805768520:       sched:sched_migrate_task: comm=a "
    "pid=1 prio=1 orig_cpu=0 dest_cpu=1",                     # a time past int64 wrapped around
])
def test_perf_script_numbers_that_do_not_fit_are_lines_that_did_not_parse(bad):
    """Found reading the parser for the fuzz target perf_text: a non-ASCII digit raised
    ValueError out of the parser, numbers too large for their columns were silently wrapped (a
    pid of 999999999999999 became -1530494977). Such a line is now counted as one that did not
    parse, and the lines around it are kept."""
    from harmony.probes.perf_script import PerfScriptParser
    ok = (" 6468 [001]   354.805768520:       sched:sched_migrate_task: comm=a pid=12 prio=1 "
          "orig_cpu=0 dest_cpu=1\n")
    p = PerfScriptParser()
    p.feed((ok + bad + "\n" + ok).encode())
    p.finish()
    ev = p.events()
    assert ev["pid"].tolist() == [12, 12] and ev["cpu"].tolist() == [1, 1]
    assert p.bad_lines == 1 and "did not parse" in p.notes()[0]


@pytest.mark.parametrize("probe", [None, "tracefx", ["tracefs"]])
def test_rebuilding_a_run_whose_manifest_names_no_probe_is_one_line(tmp_path, probe):
    """Fuzzing (target rundir, in its campaign): a run whose table had to be rebuilt and whose
    manifest has no probe raised KeyError; one naming an unknown probe was refused without naming
    the file (a list of one would have raised TypeError). A 'source' that is no object (5)
    raised TypeError too."""
    import json

    from harmony import pipeline
    template = FUZZ / "rundir"
    for f in template.glob("*.parquet"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "runqueue.parquet").write_bytes(b"PAR1 damaged")
    manifest = {"status": "complete", "source": 5, "tables": ["runqueue"]}
    if probe is not None:
        manifest["probe"] = probe
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HarmonyError) as e:
        pipeline.load_checked(tmp_path)
    assert "probe" in one_line_naming(e.value, tmp_path / "manifest.json")


# --- perf.data (fuzz target "perf_data") -------------------------------------------------------

def test_an_attr_config_past_int64_is_no_overflow(tmp_path):
    """A pipe-mode perf.data whose one event's config is 2**64 - 1 (a tracepoint's id, in a real
    one) raised OverflowError building the samples' event codes: it is an event Harmony does not
    decode, its sample counted by name."""
    import struct

    from harmony.probes import perf_read

    attr = struct.pack("<IIQQQQQ", 2, 128, 2 ** 64 - 1, 1, 4 | 128, 0, 0).ljust(128, b"\0")
    sample = struct.pack("<IHHQII", 9, 0, 24, 10 ** 9, 1, 0)      # TIME, CPU
    path = tmp_path / "perf.data"
    path.write_bytes(b"PERFILE2" + struct.pack("<Q", 16)
                     + struct.pack("<IHH", 64, 0, 8 + 128 + 8) + attr + struct.pack("<Q", 7)
                     + sample)
    read = perf_read.read_perf_data(path)
    assert read.header.pipe and len(read.events) == 0
    assert read.other_events == {f"attr 0 (type 2, config {2 ** 64 - 1})": 1}
