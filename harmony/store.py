"""The run directory: atomic writes, the manifest, and :func:`open_run`, which opens one as it is
(:func:`harmony.load`, through :func:`harmony.pipeline.load_checked`, also checks its tables).

Layout of a run directory::

    manifest.json        every parameter, host facts, scheduler, probe, t0, release spread, lost
                         events, versions, and ``status``: running | complete | incomplete
    summary.json         the experiment's metrics
    tasks.parquet        one row per experiment task (see harmony.workload.tasks.tasks_frame)
    events.parquet       every decoded event (canonical table, harmony.probes.schema)
    markers.parquet      trace markers (t0, released, end)
    migrations.parquet   runs.parquet  runqueue.parquet  allocation.parquet  shares.parquet
    kernel_samples.parquet  the kernel's own view of the tasks, sampled from /proc during the run
    kernel_counters.parquet each worker's own counters (/proc/<pid>/sched) at the start and end
    figures/*.png        report.md
    raw/<probe>/         what the probe recorded, decodable again with ``harmony.probes``
                         (with ``--crosscheck perf`` also raw/perf/, and crosscheck.json: the
                         two probes' migrations and run intervals compared)

A file is written to a temporary name and renamed into place, so a reader never sees half a file.
A run whose manifest does not say ``complete`` is never analysed as complete: :func:`open_run`
refuses it unless asked explicitly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harmony.core.errors import IncompleteRun, RunError  # noqa: F401  (raised here)
from harmony.core.osutil import FILE_MODE, atomic_write, open_own_file, own_dir  # noqa: F401
from harmony.core.stops import held

if TYPE_CHECKING:
    import pandas as pd

#: the tables a run directory can hold, each read as ``run.<name>`` (the declarations of their
#: columns: :func:`harmony.results.declarations`)
TABLES = ("tasks", "migrations", "runs", "runqueue", "allocation", "shares", "kernel_samples",
          "kernel_counters", "kernel_nr_running", "markers", "events", "requests")


def make_run_dir(path: Path) -> Path:
    """Create a run (or suite, batch, output) directory, mode 0755, never through a symbolic
    link planted at its path and never one that others may write in (RunError naming it)."""
    try:
        return own_dir(path, owner=False)
    except OSError as exc:
        raise RunError(str(exc)) from None


@contextlib.contextmanager
def new_run_dir(path: Path):
    """:func:`make_run_dir` for a block that writes the directory's first file (its manifest):
    if the block fails or is stopped, the directory is removed again where this made it and
    nothing but what a write cut short left is in it (a Ctrl-C there left an empty run no
    command could read). A stop (Ctrl-C, SIGTERM) that comes as the directory is made is raised
    once it is made and known to be this block's (:class:`~harmony.core.stops.held`): a stop
    just after ``mkdir``, CI's run of 2026-12-07, left an empty directory. The parents it made
    are removed with it, where empty."""
    path, made = Path(path), []
    try:
        with held():
            made = [d for d in (*reversed(path.parents), path) if not d.exists()]  # outermost 1st
            make_run_dir(path)
        yield
    except BaseException:
        if made:
            remove_unfilled(path)
            for d in reversed(made[:-1]):
                with contextlib.suppress(OSError):
                    d.rmdir()
        raise


def remove_unfilled(path: Path) -> None:
    """Remove the directory ``path`` if nothing but hidden files is in it: the temporary file of
    an :func:`atomic_write` cut short before its rename, a space reserve not released. A file of
    the run's own (a manifest) keeps it, and it is kept where it cannot be read."""
    with contextlib.suppress(OSError):
        left = list(path.iterdir())
        if all(p.name.startswith(".") and not p.is_dir() for p in left):
            for p in left:
                p.unlink()
            path.rmdir()


#: disk space a run holds back from the start, for its manifest's last write on a full disk
RESERVE_BYTES = 256 << 10


class SpaceReserve:
    """Disk space held back in ``directory`` (a file of ``nbytes``, allocated now), so that a run
    whose recording fills the disk can still write its last words (its manifest, saying why it is
    incomplete) after :meth:`release`. RunError if the disk has not even that much free."""

    def __init__(self, directory: Path, nbytes: int = RESERVE_BYTES):
        self.path: Path | None = Path(directory) / ".harmony-reserve"
        try:
            fd = open_own_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                # written, not posix_fallocate: where the file system has no fallocate (a VM's
                # 9p share) the C library writes the file a block at a time, 64 round trips a run
                if os.write(fd, bytes(nbytes)) != nbytes:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            finally:
                os.close(fd)
        except OSError as exc:
            self.release()
            raise RunError(f"{directory}: cannot set {nbytes >> 10} KiB aside for the run's "
                           f"manifest ({exc.strerror or exc})") from None

    def release(self) -> None:
        """Give the space back (idempotent)."""
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self.path = None


def json_default(obj):
    """How write_json stores what json cannot: numpy scalars and arrays, paths."""
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


#: how :func:`write_json` indents (None: compact; the VM agent's, :func:`compact_json`)
_indent: int | None = 1


def compact_json() -> None:
    """From now on, :func:`write_json` writes compact JSON in this process. For the VM agent:
    json indents in Python, and compact in C, ~4x faster (a run's manifest, 40 kB: 1.4 ms
    against 0.35 here, ten times that under TCG); the host rewrites, indented, what it keeps
    (each run's manifest as it lands the run; the side tables become Parquet)."""
    global _indent
    _indent = None


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=_indent, default=json_default, allow_nan=True)
                 + "\n")


def rows_frame(rows: list[tuple], dtypes: dict) -> pd.DataFrame:
    """A DataFrame of ``rows`` (tuples, one value per column of ``dtypes``: name -> dtype), each
    column made with its dtype at once: ``DataFrame(rows).astype(dtypes)`` costs ~5 ms even for
    a few rows. ``str`` columns get pandas' string dtype, as astype(str) gives."""
    # pandas here and in read_table, not at the top: the guest agent (harmony.vm.guest) writes its
    # manifests and JSON through this module in a virtual machine, where pandas costs seconds
    # (numpy too: 6 s of a TCG boot)
    import numpy as np
    import pandas as pd

    cols = list(zip(*rows)) or [()] * len(dtypes)
    return pd.DataFrame({name: np.asarray(col, dtype=dtype)
                         for (name, dtype), col in zip(dtypes.items(), cols)})


#: a table of more rows is converted to Arrow and written a row group of this many rows at a time.
#: The events' file is written beside the runs and the checks, where a whole import peaks: with
#: 2**20 rows (~37 MB of events, and Arrow's copy of them) whole imports of 5.12 M events peaked
#: at 750-765 MiB, with 2**18 at 738-744 MiB, in 0.88-0.98x the time (4 interleaved pairs; 10.25
#: M events: 1185-1197 MiB against 1197-1217, 2 pairs; 2026-12-05)
WRITE_CHUNK_ROWS = 1 << 18


def write_table(run_dir: Path, name: str, df: pd.DataFrame) -> None:
    """Store ``df`` as ``name.parquet`` atomically (docstring-documented columns travel in attrs);
    a large table in row groups of WRITE_CHUNK_ROWS rows, converted one at a time."""
    path = Path(run_dir) / f"{name}.parquet"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    try:
        import pyarrow.parquet as pq

        nulls = _with_nulls(df)
        if len(df) <= WRITE_CHUNK_ROWS:
            table = _arrow_table(df, nulls)
            pq.write_table(table, tmp, **_encodings(table.schema))
        else:   # a row group at a time: Arrow's copy of the frame is one chunk, not all of it
            first = _arrow_table(df.iloc[:WRITE_CHUNK_ROWS], nulls)
            with pq.ParquetWriter(tmp, first.schema, **_encodings(first.schema)) as w:
                w.write_table(first)
                for lo in range(WRITE_CHUNK_ROWS, len(df), WRITE_CHUNK_ROWS):
                    w.write_table(_arrow_table(df.iloc[lo:lo + WRITE_CHUNK_ROWS], nulls))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _encodings(schema) -> dict:
    """Parquet writer options for ``schema``: 64-bit integer columns (the tables' times and
    durations, in ns) delta-encoded and not compressed, narrower integer columns (CPUs, pids,
    priorities, states) and float columns byte-stream-split, every other column (names,
    categories, flags) with pyarrow's default dictionary; all but the first compressed by
    snappy.

    Why: pyarrow tries a dictionary for every column and gives it up once the dictionary outgrows
    a page, after paying for it; time stamps almost never repeat, and in time order their
    differences are small. Measured on a 10 M-event import's tables here (pyarrow 26, snappy as
    before): written in 1.14 / 0.44 / 0.22 s instead of 1.40 / 0.70 / 0.42 s (events / runs /
    run queue), 31 / 61 / 48 MB instead of 69 / 98 / 70 MB, read back in half the time. Float
    columns (seconds since t0) rarely repeat either.

    Statistics (each page's and row group's min and max, what a reader filters row groups by)
    only for the 64-bit columns: a time range selects row groups, an id or a CPU number does not
    (each is in every one). The events' other statistics cost 0.18 of their 1.13 s; the whole
    import at 10 M events took 5.20 s instead of 5.39 s (four interleaved pairs).

    Narrow integers: a dictionary hashes every value, ~0.075 s a column of 10 M events (nine of
    the events' thirteen); split into byte streams and compressed they take ~0.03 s, in 2 MB
    rather than 0.3, read back as fast. The events' file at 10.25 M events of a ping-pong: 0.70 s
    and 37 MB instead of 1.04 s and 21 MB; the whole import 4.17-4.26 s instead of 4.69-4.76 s
    (3 interleaved pairs, 2026-12-05: the file is written beside the checks, metrics and
    figures, and the import waited for it). Readers need Arrow 17 or later (the encoding's
    integer form), hence setup.cfg's pin.

    Floats (the runs' and run queue's seconds since t0, ~40 MB each at 10 M events) were plain,
    and snappy found 7-8 % to take out of them; split into byte streams it finds ~30 %, for less
    CPU. Delta-packed times leave snappy nothing (their pages' 1.00 of their size): not
    compressed. A 10.24 M-event import's run queue and runs in 41 / 54 MB instead of 50 / 62,
    the whole import in 0.975x the CPU time, 0.989x the wall time (5 interleaved pairs,
    2026-12-06)."""
    import pyarrow as pa

    wide = [f.name for f in schema if pa.types.is_int64(f.type)]
    split = [f.name for f in schema if (pa.types.is_integer(f.type) and f.name not in wide)
             or pa.types.is_floating(f.type)]
    return {"use_dictionary": [f.name for f in schema if f.name not in wide + split],
            "column_encoding": {**dict.fromkeys(wide, "DELTA_BINARY_PACKED"),
                                **dict.fromkeys(split, "BYTE_STREAM_SPLIT")},
            "compression": {f.name: "NONE" if f.name in wide else "SNAPPY" for f in schema},
            "write_statistics": wide}


#: rows from which pyarrow converts a frame's columns on several threads
THREADED_CONVERSION_ROWS = 100_000


def _with_nulls(df: pd.DataFrame) -> set[str]:
    """The columns of ``df`` that hold a missing value (NaN, None, NA, NaT, a categorical's -1):
    the others are written as Parquet's required columns (:func:`_arrow_table`).

    Why: an optional column stores a definition level for each value, which the writer encodes
    whether or not any value is missing. The tables of a 10 M-event import written with their
    columns required where nothing is missing: events / runs / run queue in 0.56 / 0.31 / 0.15
    CPU s instead of 0.82 / 0.39 / 0.20, the files the same size; whole imports 0.98x the time
    at 10.24 M events of the bench's own trace and at 5.12 M of a trace-cmd recording (5
    interleaved pairs each, 2026-12-06). Read back, a required column is the same pandas
    column. A numpy integer or boolean column holds no missing value, and is not looked at."""
    import numpy as np  # see rows_frame

    return {str(name) for name, col in df.items()
            if not (isinstance(col.dtype, np.dtype) and col.dtype.kind in "biu")
            and col.isna().any()}


def _arrow_table(df: pd.DataFrame, nulls: set[str]):
    """``df`` as the Arrow table ``df.to_parquet(index=False)`` would write, attrs included;
    its fields are required but for the columns ``nulls`` names (:func:`_with_nulls` of the
    whole frame, so that all of a large table's row groups agree).

    pandas lets pyarrow convert the columns on a new thread pool whenever a frame has over 100
    rows per column, which costs ~1 ms a table: more than converting a run's small tables at all
    (a run writes 7-10). Here threads are used from THREADED_CONVERSION_ROWS rows. The attrs that
    are plain JSON values are stored under the key pandas reads back into ``attrs``.
    """
    import pyarrow as pa

    kept = {k: v for k, v in df.attrs.items() if isinstance(v, (int, float, str, bool, list, dict))}
    df = df.copy(deep=False)      # new attrs on a view: the caller's frame keeps its own
    df.attrs = kept
    threads = None if len(df) >= THREADED_CONVERSION_ROWS else 1
    table = pa.Table.from_pandas(df, preserve_index=False, nthreads=threads)
    meta = table.schema.metadata
    if kept:
        meta = {**meta, b"PANDAS_ATTRS": json.dumps(kept).encode()}
    schema = pa.schema([f.with_nullable(f.name in nulls or _untyped(f.type))
                        for f in table.schema], metadata=meta)
    return pa.Table.from_arrays(table.columns, schema=schema)


def _untyped(t) -> bool:
    """Whether Arrow type ``t`` is null (an empty column of objects), or a dictionary of it
    (an empty one's categories): Parquet has no required column of no type."""
    import pyarrow as pa

    return pa.types.is_null(t) or (pa.types.is_dictionary(t) and pa.types.is_null(t.value_type))


def read_json(path: Path) -> dict:
    """The JSON object stored at ``path`` (a manifest, a summary...); RunError naming the file if
    it is missing, unreadable, not JSON or not an object."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RunError(f"{path}: not found") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:   # not JSON, not UTF-8, or a number of over 4300 digits
        raise RunError(f"{path}: corrupt JSON ({str(exc).splitlines()[0][:200]})") from None
    except RecursionError:
        raise RunError(f"{path}: corrupt JSON (nested too deep)") from None
    if not isinstance(obj, dict):
        raise RunError(f"{path}: corrupt: not a JSON object but {type(obj).__name__}")
    return obj


def read_table(path: Path) -> pd.DataFrame:
    import pandas as pd  # see rows_frame

    try:
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise RunError(f"{path}: not found") from None
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RunError(f"{path}: unreadable Parquet ({type(exc).__name__}: "
                       f"{first_line(exc)})") from None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (pyarrow's span several), cut to 300 characters."""
    return (str(exc).strip().splitlines() or [""])[0][:300]


class Run:
    """A stored run, as returned by :func:`harmony.load`.

    Attributes (DataFrames are read lazily, on first use). Each table's columns, with their dtypes
    and meanings, are declared once, where the table is built (``print()`` a declaration to see
    it):

    manifest     dict: the run's manifest.json
    summary      dict: the experiment's metrics (summary.json)
    tasks        one row per experiment task (harmony.workload.tasks.TASKS)
    migrations   every migration of a task (harmony.analysis.tables.MIGRATIONS)
    runs         every interval a task ran on a CPU (harmony.analysis.tables.RUNS)
    runqueue     per-CPU count of runnable experiment tasks, a step function
                 (harmony.analysis.tables.RUNQUEUE)
    allocation   CPU time per task per time window (harmony.analysis.tables.ALLOCATION)
    shares       each task's CPU time over the run against its fair share
                 (harmony.analysis.tables.SHARES)
    kernel_samples  the kernel's own view (/proc) sampled during the run
                 (harmony.probes.proc_stat.KERNEL_SAMPLES)
    kernel_counters each worker's own counters at the start and the end
                 (harmony.probes.proc_sched.KERNEL_COUNTERS)
    markers      trace markers (harmony.probes.schema)
    events       the canonical decoded events (harmony.probes.schema)
    requests     a server run's requests (harmony.analysis.tables.REQUESTS; experiment server)

    kernel_nr_running  the kernel's own per-CPU counts, where the run sampled them
                 (harmony.probes.sched_debug.KERNEL_NR_RUNNING)

    ``table_names`` lists the tables this run holds (``dir(run)`` shows them too), ``table(name)``
    reads one. ``t`` columns are seconds since t0; ``ts``, ``start``, ``end`` are ns on the
    trace clock. ``help(harmony.load)`` lists every table's columns.
    """

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self._cache: dict[str, pd.DataFrame] = {}
        self._summary: dict | None = None

    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = read_json(self.path / "summary.json")
        return self._summary

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._cache:
            self._cache[name] = read_table(self.path / f"{name}.parquet")
        return self._cache[name]

    def preload(self, tables: dict[str, pd.DataFrame]) -> None:
        """Serve these tables from memory instead of reading their Parquet files (the analysis
        that has just written them); each must be what reading its file back gives."""
        self._cache.update(tables)

    def held(self, name: str) -> pd.DataFrame | None:
        """The table ``name`` if it is in memory (read already, or preloaded), else None: for
        a table the analysis may hand over without storing it (e.g. "wasted")."""
        return self._cache.get(name)

    def preload_summary(self, summary: dict) -> None:
        """Serve this summary instead of reading summary.json (the analysis that has just written
        it); it must be what reading the file back gives (JSON types: lists, string keys)."""
        self._summary = summary

    def companion(self, name: str) -> "Run":
        """The paired run ``name`` stored in ``<run_dir>/<name>/`` (see Experiment.companions).

        Raises RunError (naming the path) if it is missing or not complete.
        """
        return open_run(self.path / name)

    @property
    def table_names(self) -> list[str]:
        """The tables this run holds: those its manifest lists, else (an older run, or one not
        analysed) those whose files are there."""
        listed = self.manifest.get("tables")
        if isinstance(listed, list) and all(isinstance(n, str) for n in listed):
            return list(listed)
        return [t for t in TABLES if (self.path / f"{t}.parquet").is_file()]

    def __getattr__(self, name):
        if name in TABLES:
            return self.table(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self):
        return sorted({*super().__dir__(), *self.table_names})

    def __repr__(self):
        m = self.manifest
        return f"<Run {self.path} {m.get('experiment')} {m.get('status')}>"


#: the tables every analysed run holds (the pipeline's); a run that sampled the kernel's own view
#: or read the workers' counters holds those too (manifest "tables" lists what a run holds)
DERIVED_TABLES = ("events", "markers", "migrations", "runs", "runqueue", "allocation", "shares")


_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def held_tables(manifest: dict, path: Path | None = None) -> list[str]:
    """The tables a complete run directory must hold: those its manifest lists (``tables``, written
    by the analysis since it lists them), else -- a run of an older Harmony -- the tasks, the
    derived tables and whichever of the capture's own tables are there."""
    if "tables" in manifest:
        names = manifest["tables"]
        if not isinstance(names, list) or not all(isinstance(n, str) and _TABLE_NAME.fullmatch(n)
                                                  for n in names):
            where = Path(path) / "manifest.json" if path is not None else "manifest"
            raise RunError(f"{where}: corrupt: 'tables' is not a list of table names")
        return list(names)
    extra = [t for t in ("kernel_samples", "kernel_counters", "kernel_nr_running")
             if path is not None and (Path(path) / f"{t}.parquet").exists()]
    return ["tasks", *DERIVED_TABLES, *extra]


def table_problems(path: Path, names) -> dict[str, str]:
    """{table: what is wrong} for the tables of ``names`` in the run directory ``path`` that are
    missing or unreadable (their Parquet footer and schema are read, not their data)."""
    import pyarrow.parquet as pq

    out = {}
    for name in names:
        f = Path(path) / f"{name}.parquet"
        if not f.is_file():
            out[name] = "missing"
            continue
        try:
            pq.read_metadata(f)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            out[name] = f"unreadable ({type(exc).__name__}: {first_line(exc)})"
    return out


def open_run(run_dir, allow_incomplete: bool = False) -> Run:
    """Open a run directory written by ``harmony run``.

    Raises RunError (naming the path) if it is not a run, or IncompleteRun if the run is not
    complete and ``allow_incomplete`` is false: an interrupted run is never analysed as if it were
    whole.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise missing_dir(path)
    if not (path / "manifest.json").exists():
        raise no_results(path)
    manifest = read_json(path / "manifest.json")
    if manifest.get("status") != "complete" and not allow_incomplete:
        raise IncompleteRun(f"{path}: {why_incomplete(manifest)}", path, manifest.get("status"))
    return Run(path, manifest)


def cannot_write(directory) -> str | None:
    """Why nothing can be written in ``directory`` (the error, e.g. "Read-only file system"), or
    None if something can: a real write, since root passes permission checks that a read-only
    mount does not."""
    try:
        tempfile.TemporaryDirectory(dir=directory, prefix=".harmony-check-").cleanup()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


#: the files that make a directory a run, a batch or a suite
RESULT_FILES = {"manifest.json": "run", "batch.json": "batch", "suite.json": "suite"}


def missing_dir(path) -> RunError:
    """The error of a run, batch or suite directory that is not there (or not a directory): one
    wording for every command and for :func:`harmony.load`."""
    path = Path(path)
    return RunError(f"{path}: not a directory" if path.exists() else f"{path}: no such directory")


def no_results(path) -> RunError:
    """The error of a directory that holds no run, batch or suite: one wording everywhere."""
    return RunError(f"{path}: not a run, batch or suite directory (no "
                    f"{', '.join(RESULT_FILES)} in it)")


def about(path, why: str) -> str:
    """``why`` said of ``path``: "PATH: WHY", unless ``why`` names a file of it first already
    ("PATH/summary.json: not found"), which is not said twice."""
    return why if str(why).startswith(f"{path}/") else f"{path}: {why}"


def no_complete_run(where, skipped: list) -> RunError:
    """The error of a directory (``where``) under which no complete run can be used, ``skipped``
    the (run directory, why) of those found: the first one's reason, never hidden."""
    if not skipped:
        return no_results(where)
    path, why = skipped[0]
    if len(skipped) == 1 and Path(path) == Path(where):
        return RunError(about(path, why))
    return RunError(f"{where}: no complete run ({len(skipped)} not used; the first, "
                    f"{about(path, why)})")


def results_kind(path) -> str:
    """"run", "batch" or "suite": what the directory ``path`` holds (by the file that says so);
    RunError (:func:`missing_dir`, :func:`no_results`) if it is none."""
    path = Path(path)
    if not path.is_dir():
        raise missing_dir(path)
    for name, kind in RESULT_FILES.items():
        if (path / name).is_file():
            return kind
    raise no_results(path)


def why_incomplete(manifest: dict) -> str:
    """"run is <status> (<why>)" for a run that is not complete."""
    status = manifest.get("status")
    why = manifest.get("incomplete_reason", "the run did not finish")
    if status == "captured":
        why = "captured, not analysed yet: `harmony report` analyses it"
    if status == "running" and not _alive(manifest.get("controller_pid")):
        why = "its controller is gone: killed before it could finish"
    return f"run is {status or 'of unknown status'} ({why})"


def _alive(pid) -> bool:
    """Whether a Harmony controller with this pid still runs (a recycled pid is not ours)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, TypeError, ValueError, OverflowError):   # gone, or not a pid (a bad file)
        return False
    return b"harmony" in cmdline or b"python" in cmdline
