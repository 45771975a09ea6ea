"""The fuzz targets: each parser of outside input, fed one input (bytes) at a time.

A target writes the input where its parser reads it (files under a scratch directory: trace.dat,
perf.data, a tracefs recording's directory, a run directory...) and calls the parser the way
Harmony does. Its contract, checked by :func:`check_error` and by whoever calls it (``run.py``
when fuzzing, ``tests/test_fuzz_corpus.py`` when replaying the saved corpus): every input either
decodes or raises a :class:`~harmony.core.errors.HarmonyError` whose message is one line naming the
file it read. Anything else that escapes (IndexError, struct.error, numpy's ValueError, a
RecursionError, a MemoryError...) is a finding, and so is an input that takes more than 2 s or
more than 1 GiB of memory (``run.py`` enforces those).

Several files in one input (a recording's directory, a run directory) are packed as sections,
each ``@@ <relative path>\\n<content>`` (:func:`pack`, :func:`unpack`): a mutation of one file's
bytes leaves the others whole, and one of a section's name makes a file go missing or appear.

This module imports Harmony only inside :func:`load` (after ``run.py`` has started atheris's
instrumentation of the Harmony modules) and needs no fuzzer: the corpus replay runs without one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

#: a section header of a packed input: "@@ <relative path>" on a line of its own
SECTION = b"@@ "
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64}){0,3}")
MAX_SECTIONS = 40


def pack(files: dict[str, bytes]) -> bytes:
    """Files (relative path -> bytes) as one input of the packed form (no file may hold a line
    that starts with the section header)."""
    for name, data in files.items():
        if (b"\n" + data).find(b"\n" + SECTION) >= 0:
            raise ValueError(f"{name} holds a line starting with {SECTION!r}: cannot be packed")
    return b"".join(SECTION + name.encode() + b"\n" + data + b"\n" for name, data in files.items())


def unpack(data: bytes) -> dict[str, bytes]:
    """The files of a packed input; sections with an unusable name ("..", absolute, odd
    characters, a part of over 64 characters) are left out, as are those past the first
    MAX_SECTIONS."""
    out: dict[str, bytes] = {}
    parts = (b"\n" + data).split(b"\n" + SECTION)
    if len(parts) > 1 and parts[-1].endswith(b"\n"):
        parts[-1] = parts[-1][:-1]            # the newline pack() ends the last file with
    for part in parts[1:MAX_SECTIONS + 1]:
        name, _, content = part.partition(b"\n")
        name = name.decode("ascii", "replace").strip()
        if not _NAME_RE.fullmatch(name) or any(p in (".", "..") for p in name.split("/")):
            continue
        out[name] = content
    return out


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` under ``root`` (emptied first); a name that clashes with a directory made
    for another is skipped."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name, content in files.items():
        p = root / name
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content)
        except OSError:       # a name that clashes with a directory, or one the system refuses
            continue


class Finding(AssertionError):
    """A target broke its contract: an error that is not one line naming the file."""


def check_error(exc: BaseException, names: tuple[str, ...]) -> None:
    """``exc`` is Harmony's one-line error naming one of ``names``; else raise :class:`Finding`."""
    from harmony.core.errors import HarmonyError
    if not isinstance(exc, HarmonyError):
        raise exc
    msg = str(exc)
    if "\n" in msg or not msg.strip():
        raise Finding(f"{type(exc).__name__} message is not one line: {msg!r}") from exc
    if names and not any(n in msg for n in names):
        raise Finding(f"{type(exc).__name__} message names none of {names}: {msg!r}") from exc


@dataclasses.dataclass
class Target:
    """One fuzz target: ``run(data, scratch)`` parses ``data``, writing files under ``scratch``."""

    name: str
    doc: str
    run: Callable[[bytes, Path], None]
    env: dict = dataclasses.field(default_factory=dict)   # set before Harmony is imported

    def one(self, data: bytes, scratch: Path) -> str | None:
        """Parse one input: None if it decoded, the message of Harmony's one-line error naming the
        file if it raised one; raise otherwise (what the parser let escape, or a Finding)."""
        try:
            self.run(data, scratch)
        except Exception as exc:  # noqa: BLE001  (sorted by check_error: only HarmonyError passes)
            check_error(exc, (str(scratch),))
            return str(exc)
        return None


# --- the targets -------------------------------------------------------------------------------

def _tracedat(data: bytes, scratch: Path) -> None:
    from harmony.probes.tracedat_read import decode_tracedat, is_tracedat, read_tracedat
    path = scratch / "trace.dat"
    path.write_bytes(data)
    is_tracedat(path)
    td = read_tracedat(path)
    names = [b.name for b in td.buffers if b.cpus][:2]
    for name in names or [None]:
        decode_tracedat(path, buffer=name)


def _ringbuf(data: bytes, scratch: Path) -> None:
    from harmony.probes.ringbuf import decode_dir
    d = scratch / "raw"
    write_tree(d, unpack(data))
    decode_dir(d)


def _ringbuf_both(data: bytes, scratch: Path) -> None:
    """The compiled decoder, and the numpy one on the same input: both decode the same tables or
    both refuse it with the same error."""
    import pandas as pd

    from harmony.probes.ringbuf import decode_dir
    d = scratch / "raw"
    write_tree(d, unpack(data))
    got = {}
    for mode in ("1", "0"):
        os.environ["HARMONY_JIT"] = mode
        try:
            got[mode] = decode_dir(d)
        except Exception as exc:  # noqa: BLE001  (compared below, then checked)
            got[mode] = exc
    os.environ["HARMONY_JIT"] = "1"
    jit, ref = got["1"], got["0"]
    if isinstance(jit, Exception) or isinstance(ref, Exception):
        # both must refuse it; they may name different damaged records (numpy walks every page
        # in lockstep and meets the damage of a later page first, the compiled walk page by page)
        if type(jit) is not type(ref):
            raise Finding(f"the decoders disagree: compiled {type(jit).__name__}: {jit}; "
                          f"numpy {type(ref).__name__}: {ref}")
        check_error(ref, (str(scratch),))
        raise jit
    try:
        pd.testing.assert_frame_equal(jit.events, ref.events, check_categorical=False)
        pd.testing.assert_frame_equal(jit.markers, ref.markers)
    except AssertionError as exc:
        raise Finding(f"the decoders give different tables: {exc}") from None
    keys = ("lost_events", "lost_by_cpu", "n_events", "n_markers", "n_records",
            "unknown_event_types")
    if [jit.meta[k] for k in keys] != [ref.meta[k] for k in keys]:
        raise Finding(f"the decoders disagree on {keys}: {[jit.meta[k] for k in keys]} != "
                      f"{[ref.meta[k] for k in keys]}")


def _formats(data: bytes, scratch: Path) -> None:
    from harmony.probes.formats import (
        load_format,
        load_formats_dir,
        load_header_event,
        load_header_page,
        sched_switch_preempt_flag,
    )
    path = scratch / "formats" / "sched" / "sched_switch" / "format"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    for load in (load_header_page, load_header_event):
        try:
            load(path)
        except Exception as exc:  # noqa: BLE001  (checked: the next parser reads the same text)
            check_error(exc, (str(path),))
    fmt = load_format(path)
    sched_switch_preempt_flag(fmt)
    load_formats_dir(scratch / "formats")


def _perf_data(data: bytes, scratch: Path) -> None:
    """The header check, then the whole reader (records walked in Python, payloads by numpy)."""
    from harmony.probes.perf_data import check_perf_data
    from harmony.probes.perf_read import read_perf_data
    path = scratch / "perf.data"
    path.write_bytes(data)
    check_perf_data(path)
    read_perf_data(path)


def _perf_text(data: bytes, scratch: Path) -> None:
    """``perf script`` output fed in pieces (cut where the first byte says), and the texts of
    ``perf report --header-only`` / ``--stats`` the perf.data facts are read from. None of these
    raises: what does not parse is counted (bad lines) or left out."""
    from harmony.probes import perf_data
    from harmony.probes.perf_script import PerfScriptParser
    p = PerfScriptParser()
    cut = 1 + (data[0] * len(data) // 256 if data else 0)
    for piece in (data[1:cut], data[cut:]):
        p.feed(piece)
    p.finish()
    p.events()
    p.notes()
    text = data.decode("utf-8", "replace")
    perf_data.clock_name(text)
    perf_data.header_number(text, "captured on")
    perf_data.header_number(text, "nrcpus online")
    lost = perf_data.lost_samples_by_event(text)
    perf_data.lost_sched_events(len(data), lost)


def _rundir_files(data: bytes, scratch: Path) -> Path:
    """The run directory of a template (``HARMONY_FUZZ_RUN``: a complete run, its Parquet tables
    linked, never written) with the packed input's files (manifest.json, summary.json) in it."""
    template = Path(os.environ.get("HARMONY_FUZZ_RUN", Path(__file__).parent / "rundir"))
    d = scratch / "run"
    write_tree(d, unpack(data))
    for f in template.glob("*.parquet"):
        if not (d / f.name).exists():
            os.symlink(f.resolve(), d / f.name)
    return d


def _rundir(data: bytes, scratch: Path) -> None:
    """store.open_run (as it is, and allowing an incomplete run), the summary and the tables the
    input holds (a table section replaces the template's), then pipeline.load_checked, which
    verifies the tables the manifest lists."""
    from harmony import pipeline, store
    d = _rundir_files(data, scratch)
    for allow in (False, True):
        try:
            run = store.open_run(d, allow_incomplete=allow)
        except Exception as exc:  # noqa: BLE001  (checked; then read as allow_incomplete)
            check_error(exc, (str(d),))
            continue
        run.complete
        repr(run)
        for read in [lambda: run.summary] + [lambda p=p: run.table(p.stem)
                                             for p in d.glob("*.parquet") if not p.is_symlink()]:
            try:
                read()
            except Exception as exc:  # noqa: BLE001  (checked: the next one is read all the same)
                check_error(exc, (str(d),))
    pipeline.load_checked(d)


TARGETS = {t.name: t for t in (
    Target("tracedat", "trace.dat reader: file versions 6 and 7, plain and zstd (numpy decoder)",
           _tracedat, {"HARMONY_JIT": "0"}),
    Target("ringbuf", "tracefs recording (meta.json, formats/, cpuN.raw) by the numpy decoder",
           _ringbuf, {"HARMONY_JIT": "0"}),
    Target("ringbuf_jit", "the same by the compiled (numba) decoder, checked against numpy's",
           _ringbuf_both, {"HARMONY_JIT": "1"}),
    Target("formats", "event format, header_page and header_event texts; the preempt flag",
           _formats),
    Target("perf_data", "perf.data reader: header, attrs, records, payloads (numpy)", _perf_data,
           {"HARMONY_JIT": "0"}),
    Target("perf_text", "perf script output; perf report --header-only / --stats texts",
           _perf_text),
    Target("rundir", "a run directory's manifest.json and summary.json: store.open_run, "
           "pipeline.load_checked", _rundir, {"HARMONY_JIT": "0"}),
)}

#: Harmony modules atheris must not instrument: numba compiles their functions from bytecode
NOT_INSTRUMENTED = ["harmony.probes.ringbuf_jit", "harmony.analysis.taskstate_jit",
                    "harmony.analysis.reconstruct_jit", "harmony.analysis.causes_jit",
                    "harmony.analysis.cost_jit", "harmony.importer_jit"]


def scratch_dir() -> tempfile.TemporaryDirectory:
    """Where a target writes its files: memory-backed where /dev/shm exists."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return tempfile.TemporaryDirectory(prefix="harmony-fuzz-", dir=base)
