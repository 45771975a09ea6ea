"""What :func:`harmony.load` opens: a run, a batch or a suite directory, as it is on disk.

- a run directory (``manifest.json``): a :class:`harmony.store.Run`, its tables checked
  (:func:`harmony.pipeline.load_checked`);
- a batch directory (``batch.json``: ``harmony run --repeat``, or one configuration of a suite):
  a :class:`Batch`, its repetitions and their aggregates;
- a suite directory (``suite.json``: ``harmony suite``, ``harmony simulate --suite``): a
  :class:`Suite`, its configurations (each a batch) and its policy card.

Nothing here writes: a result on a read-only file system opens as any other. The tables' columns
are documented from their declarations (:func:`declarations`), never copied.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from harmony import store

if TYPE_CHECKING:
    import pandas as pd

    from harmony.analysis.policy import Card


@functools.cache
def declarations() -> dict:
    """Every table a run directory can hold, by name: its :class:`harmony.core.columns.Table`
    declaration (``print()`` one for its columns, dtypes and meanings)."""
    from harmony.analysis import tables
    from harmony.probes import proc_sched, proc_stat, sched_debug, schema
    from harmony.workload.tasks import TASKS

    found = [TASKS, tables.MIGRATIONS, tables.RUNS, tables.RUNQUEUE, tables.ALLOCATION,
             tables.SHARES, proc_stat.KERNEL_SAMPLES, proc_sched.KERNEL_COUNTERS,
             sched_debug.KERNEL_NR_RUNNING, schema.MARKERS, schema.EVENTS, tables.REQUESTS]
    return {t.name: t for t in found}


def tables_doc(width: int = 96) -> str:
    """The tables of a run as :func:`harmony.load`'s docstring lists them: each declaration's
    name, what its rows are and its columns (name, dtype), generated from the declarations."""
    import textwrap

    out = []
    for name, table in declarations().items():
        out += textwrap.wrap(f"run.{name}: {table.about}", width, subsequent_indent="    ")
        cols = ", ".join(f"{c.name} ({c.dtype})" for c in table.columns)
        out += textwrap.wrap(cols, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(out)


class _Results:
    """What a batch and a suite share: the directory, its record, its runs and its card."""

    record_file = ""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.record: dict = store.read_json(self.path / self.record_file)

    def run_dirs(self) -> list[Path]:
        """Every run directory under this one (the companions inside a run are not runs of
        their own), in order."""
        from harmony.analysis.policy import find_runs

        return find_runs([self.path])[0]

    def runs(self, allow_incomplete: bool = False) -> list[store.Run]:
        """Every run under this directory, opened (:func:`harmony.load`); incomplete ones too
        with ``allow_incomplete`` (else they are left out: :meth:`not_complete` lists them)."""
        out = []
        for d in self.run_dirs():
            try:
                out.append(load(d, allow_incomplete=allow_incomplete))
            except store.IncompleteRun:
                continue
        return out

    def not_complete(self) -> list[tuple[Path, str]]:
        """(run directory, why) of every run here that is not complete or cannot be read."""
        from harmony.analysis.policy import collect

        return [(p, why) for p, why in collect([self.path])[1]]

    @functools.cached_property
    def card(self) -> Card:
        """The policy card of the complete runs here (:func:`harmony.analysis.policy.infer`;
        ``print(card.text())`` is what ``harmony infer`` prints)."""
        from harmony.analysis.policy import infer

        return infer([self.path])

    def df_summaries(self) -> pd.DataFrame:
        """One row per complete run: path, experiment, config (its batch's directory), ncpus, then
        one column per scalar summary key (None where a run has no value): what each run
        measured, to group and plot with pandas."""
        from harmony.analysis.policy import collect
        from harmony.analysis.report_suite import df_suite_runs

        return df_suite_runs(collect([self.path])[0])


class Batch(_Results):
    """A batch directory: ``repeat`` runs of one configuration in ``rep-NN/``, and batch.json.

    path          the directory
    record        batch.json: experiment, params, cpus, repeat, reps, status, aggregates...
    experiment    the experiment's name
    reps          the repetitions' run directories, in order
    aggregates    per metric: median, IQR and 95% CI over the complete runs (a DataFrame)
    runs()        the repetitions, opened; run(k) the k-th (1-based)
    card          the policy card of its runs
    """

    record_file = "batch.json"

    @property
    def experiment(self) -> str:
        return self.record.get("experiment", "?")

    @property
    def reps(self) -> list[Path]:
        return [self.path / name for name in self.record.get("reps", [])]

    def run_dirs(self) -> list[Path]:
        return [p for p in self.reps if (p / "manifest.json").exists()]

    def run(self, k: int, allow_incomplete: bool = False) -> store.Run:
        """The ``k``-th repetition (1 is rep-01), opened as :func:`harmony.load` does."""
        return load(self.path / f"rep-{k:02d}", allow_incomplete=allow_incomplete)

    @property
    def aggregates(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.record.get("aggregates") or [],
                            columns=["metric", "median", "iqr", "ci_low", "ci_high", "n"])

    def __repr__(self):
        r = self.record
        return (f"<Batch {self.path} {self.experiment}: {r.get('complete', '?')}/"
                f"{r.get('repeat', '?')} runs complete>")


class Suite(_Results):
    """A suite directory: one batch per configuration of the plan, suite.json and the report.

    path          the directory
    record        suite.json: cpus, configs, runner, host, status, runs, wall_s, failures...
    batches       the configurations, by label: each a :class:`Batch`
    run_dirs()    every run directory; runs() every complete run, opened
    card          the policy card (``print(suite.card.text())``: what ``harmony infer`` prints)
    df_summaries()  one row per complete run with its scalar metrics
    """

    record_file = "suite.json"

    @functools.cached_property
    def batches(self) -> dict[str, Batch]:
        out = {}
        for cfg in self.record.get("configs", []):
            label = cfg.get("label")
            if label and (self.path / label / "batch.json").is_file():
                out[label] = Batch(self.path / label)
        return out

    def __repr__(self):
        r = self.record
        host = r.get("under_test") or r.get("host") or {}
        return (f"<Suite {self.path}: {len(r.get('configs', []))} configurations, "
                f"{r.get('runs', '?')} runs on {len(r.get('cpus', []))} CPUs, "
                f"{host.get('kernel', '?')} / {host.get('scheduler', '?')}, "
                f"{r.get('status', '?')}>")


def captured(run: store.Run) -> dict:
    """What an incomplete run holds, as data (``harmony report --allow-incomplete``): why it is
    incomplete, the files and tables it has, the VM it was captured in (its ``vm`` facts, a death
    among them), and what its raw capture holds if it decodes (events,
    lost events, the markers, how far after t0 it recorded, the migrations of the experiment's
    tasks after t0 by cause). Reads only; nothing here is a result of the experiment."""
    from harmony.core.errors import HarmonyError
    from harmony.probes import PROBES, get_probe
    from harmony.probes.schema import MARK_END, MARK_T0

    m = run.manifest
    params = m.get("params") or {}
    out = {"path": str(run.path), "status": m.get("status"), "why": store.why_incomplete(m),
           "experiment": m.get("experiment"), "params": params,
           "tables": [t for t in store.TABLES if (run.path / f"{t}.parquet").is_file()],
           "summary": (run.path / "summary.json").is_file(), "capture": None,
           # a VM's facts (harmony.vm.runner: kept when the guest died) and the host's
           "vm": m.get("vm"), "host": m.get("host")}
    probe = m.get("probe")
    raw = run.path / "raw" / str(probe)
    if probe not in PROBES or not raw.is_dir():
        return out
    size = sum(f.stat().st_size for f in raw.rglob("*") if f.is_file())
    try:
        cap = get_probe(probe).decode_dir(raw)
    except (HarmonyError, OSError, ValueError) as exc:
        out["capture"] = {"raw": str(raw), "bytes": size, "decoded": False, "error": str(exc)}
        return out
    ev, marks = cap.events, cap.markers
    at = dict(zip(marks["text"].astype(str), marks["ts"].astype("int64")))
    t0 = at.get(MARK_T0)
    last = int(ev["ts"].max()) if len(ev) else None
    facts = {"raw": str(raw), "bytes": size, "decoded": True, "events": int(len(ev)),
             "lost_events": cap.meta.get("lost_events"), "markers": list(at),
             "t0": t0 is not None, "end": MARK_END in at,
             "recorded_after_t0_s": (last - t0) / 1e9 if t0 is not None and last else None,
             "asked_s": params.get("duration")}
    if t0 is not None and "tasks" in out["tables"]:
        from harmony.analysis.causes import cause_counts
        from harmony.analysis.reconstruct import df_migrations

        moves = df_migrations(ev, run.table("tasks"), t0)
        moves = moves[moves["t"].to_numpy() >= 0]
        facts["migrations_after_t0"] = int(len(moves))
        facts["by_cause"] = {k: v for k, v in cause_counts(moves).items() if v}
    out["capture"] = facts
    return out


def load(path, allow_incomplete: bool = False):
    """(replaced below by the docstring made from the declarations)"""
    kind = store.results_kind(path)
    if kind == "batch":
        return Batch(path)
    if kind == "suite":
        return Suite(path)
    from harmony.pipeline import load_checked

    return load_checked(path, allow_incomplete=allow_incomplete)


LOAD_DOC = """Open a run, batch or suite directory as it is on disk (nothing is written to it).

    harmony.load(path, allow_incomplete=False) -> Run | Batch | Suite

    - a run directory (manifest.json) -> :class:`harmony.store.Run`, verified: a complete run's
      tables are checked, and a derived table that is missing or unreadable is rebuilt from the
      raw capture (the run's notes then say which and why). An incomplete run raises
      :class:`harmony.core.errors.IncompleteRun` unless ``allow_incomplete`` (then it opens as
      it is, with whatever tables it holds);
    - a batch directory (batch.json) -> :class:`harmony.results.Batch`: ``reps``, ``run(k)``,
      ``runs()``, ``aggregates``, ``card``, ``df_summaries()``;
    - a suite directory (suite.json) -> :class:`harmony.results.Suite`: ``batches`` (each a
      Batch), ``run_dirs()``, ``runs()``, ``card``, ``df_summaries()``.

    Raises :class:`harmony.core.errors.RunError` naming what is wrong: no such directory; not a
    run, batch or suite directory; a corrupt file (named); a table that cannot be rebuilt.

    A run's attributes: ``path``, ``manifest`` (dict: manifest.json), ``summary`` (dict: the
    experiment's metrics), ``complete``, ``table_names`` (the tables it holds),
    ``table(name)``, ``companion(name)``; and each table it holds, read on first use as a pandas
    DataFrame (``run.migrations``...). ``t`` columns are seconds since t0; ``ts``, ``start``,
    ``end`` are ns on the trace clock. The tables (``print(harmony.results.declarations()[NAME])``
    prints one's meanings):

"""


def _document_load() -> None:
    import textwrap

    load.__doc__ = LOAD_DOC + textwrap.indent(tables_doc(), "    ") + "\n"


_document_load()
