"""One analysis path for every capture: (capture, tasks, window, origin) ->
a complete run directory.

Every origin of a capture comes through here, and only here: a run recorded on this host
(:mod:`harmony.run`: the probe's raw capture, the kernel's own view sampled during the run, the
workers' counters), a trace recorded elsewhere (:mod:`harmony.importer`), a reference policy's
simulation (:mod:`harmony.simulate`). Each origin hands over the decoded :class:`Capture`, the
tasks table, the measured :class:`Window` and an :class:`Origin` (what it is, what came with the
trace, what it had to assume); :func:`analyse_capture` does the rest, the same way for all:

0. order: events two CPUs stamped with one time, put in the order the scheduler must have
   followed (:mod:`harmony.analysis.ties`; a coarse trace clock, as in a TCG guest);
1. tables: migrations, runs, runqueue, allocation, shares (:mod:`harmony.analysis.reconstruct`)
   from the events, each written once as Parquet and kept in memory for the next steps (a large
   events table written on another thread meanwhile, waited for before the run is complete),
   and the policy's wasted CPU time, handed to the metrics (the task records it reads are freed
   before the runs are built: see :func:`derive_tables`);
2. checks: the probe's blind spots, the release, lost events, foreign load, the kernel's own view
   and the workers' counters against the trace, a second probe's recording (cross-check): facts
   in the manifest, and notes as data (:mod:`harmony.analysis.trust`, which words them);
3. metrics: the experiment's ``analyse()`` on those tables, and what the policy cost (migration
   causes, wasted CPU time, distance from the ideal allocation) -> summary.json;
4. figures (now, or deferred to :func:`draw_figures`) and report.md.

:func:`new_manifest` starts every run directory's manifest; :func:`analyse` analyses a capture
stored on disk -- again, in another process than the one that captured it (a suite's background
analyser), or brought from where it was recorded as raw pages + manifest (a capture made on
another host or inside a virtual machine is analysed here like one made here).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from concurrent import futures
from pathlib import Path

import pandas as pd

from harmony import store
from harmony.analysis import reconstruct, trust
from harmony.analysis.causes import cause_counts, softirq_recorded
from harmony.analysis.cost import df_wasted, idle_spells
from harmony.analysis.counters import (counter_agreement, df_counter_agreement,
                                       schedstat_agreement, schedstat_cpus)
from harmony.analysis.crosscheck import (
    kernel_agreement,
    nr_running_agreement,
    silent_contexts,
    unrecorded_migrations,
)
from harmony.analysis.foreign import df_foreign_load
from harmony.analysis.probe_agreement import probe_agreement
from harmony.analysis.release import release_spread
from harmony.analysis.report import write_report
from harmony.analysis.taskstate import release_records
from harmony.analysis.ties import order_ties
from harmony.core import stops
from harmony.core.errors import ProbeError, RunError
from harmony.core.jit import in_background, on_side_thread
from harmony.core.timing import Laps
from harmony.experiments import experiment_of, get_experiment
from harmony.manifest import new_manifest, now, reason  # noqa: F401  (every origin's manifest)
from harmony.probes import PROBES, Capture, get_probe
from harmony.probes.schema import MARK_END, MARK_RELEASED, MARK_T0, MARK_WARMUP
from harmony.workload.tasks import class_counts

#: a table of this many rows or more (the events, and a long trace's runs and run queue) is written
#: to Parquet on a thread of the pool (harmony.core.jit.in_background) while the checks and metrics
#: run: 10 M events take ~1.3 s to write, their 4.9 M runs 0.6 s and 5.4 M run-queue steps 0.4 s
BACKGROUND_WRITE_ROWS = 500_000

#: origins of a capture (Origin.kind)
ORIGINS = ("recorded", "imported", "simulated")

#: an experiment's analyse() or plot() that raises one of these cannot read the capture it was
#: given (an imported trace's tasks have no roles, cut times...): the run is incomplete, with why
EXPERIMENT_CANNOT_READ = (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError)


@dataclasses.dataclass(frozen=True)
class Window:
    """The measured window on the trace clock (ns): from ``t0`` to ``end``; ``released`` is when
    the controller had freed every task (None where no Harmony controller released them);
    ``warmup`` is where a warm release let the confined tasks run (None: a cold release)."""

    t0: int
    end: int
    released: int | None = None
    warmup: int | None = None


@dataclasses.dataclass
class Origin:
    """Where a capture comes from, and what came with it besides the trace.

    kind               "recorded", "imported" or "simulated"
    notes              trust notes (:mod:`harmony.analysis.trust`) of what the origin assumed
                       (an import: t0 taken from the first event, demand unknown, ...)
    kernel_samples     the kernel's own view of the tasks sampled from /proc during the run
    kernel_nr_running  per-CPU nr_running sampled from debugfs during the run
    kernel_counters    each worker's own counters read at the start and the end
    controller_tids    the controller's own threads and helpers: their CPU time is reported apart
                       from foreign load (empty: no Harmony controller ran beside the tasks)

    The tables are those the origin stored in the run directory already: they are read, never
    written again.
    """

    kind: str
    notes: list[dict] = dataclasses.field(default_factory=list)
    kernel_samples: pd.DataFrame | None = None
    kernel_nr_running: pd.DataFrame | None = None
    kernel_counters: pd.DataFrame | None = None
    controller_tids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in ORIGINS:
            raise ValueError(f"unknown origin {self.kind!r}; one of {', '.join(ORIGINS)}")


# --- a capture stored on disk -------------------------------------------------------------------

def analyse(run_dir: Path, quiet: bool = True, figures: bool = True,
            origin: Origin | None = None, tasks: pd.DataFrame | None = None,
            rebuilt: dict[str, str] | None = None) -> store.Run:
    """Decode ``run_dir``'s stored capture and analyse it (:func:`analyse_capture`).

    For a run recorded here or simulated: the raw capture under ``raw/<probe>/``, t0 / released /
    end from Harmony's markers in it, the tables the capture stored beside it (tasks, the kernel's
    own view, the workers' counters) unless ``origin`` and ``tasks`` hand them over in memory (the
    process that has just captured it). Refuses (RunError) a run whose capture did not finish: it
    stays marked incomplete. ``figures=False`` leaves the figures to :func:`draw_figures`.
    ``rebuilt``: the tables of a complete run that were missing or unreadable ({table: why}),
    rebuilt by this analysis (:func:`load`): its notes say so; a capture that cannot be decoded
    then leaves the run as it was.
    """
    run_dir = Path(run_dir)
    manifest = store.read_json(run_dir / "manifest.json")
    if manifest.get("status") not in ("captured", "complete"):
        raise RunError(f"{run_dir}: capture is {manifest.get('status')} "
                       f"({manifest.get('incomplete_reason', 'unknown reason')}); not analysed")
    if "imported" in _source(manifest):
        raise RunError(f"{run_dir}: an imported trace is analysed by `harmony import` again")
    probe_name = manifest.get("probe")
    if not isinstance(probe_name, str) or probe_name not in PROBES:
        raise RunError(f"{run_dir / 'manifest.json'}: corrupt: probe {str(probe_name)[:40]!r} is "
                       f"none of {', '.join(PROBES)}")
    laps = Laps()
    try:
        cap = get_probe(probe_name).decode_dir(run_dir / "raw" / probe_name)
    except ProbeError as exc:
        if rebuilt is None:
            mark_incomplete(run_dir, manifest, f"trace could not be decoded: {exc}")
        raise RunError(str(exc)) from None
    t0, released, end = (_marker(cap.markers, m) for m in (MARK_T0, MARK_RELEASED, MARK_END))
    missing = [name for name, v in (("t0", t0), ("end", end)) if v is None]
    if missing:
        why = f"markers missing from the trace: {', '.join(missing)}"
        if rebuilt is None:
            mark_incomplete(run_dir, manifest, why)
        raise RunError(f"{run_dir}: {why}")
    laps("decode")
    if origin is None:
        origin = Origin("simulated" if "simulated" in manifest else "recorded",
                        kernel_samples=_stored(run_dir, "kernel_samples"),
                        kernel_nr_running=_stored(run_dir, "kernel_nr_running"),
                        kernel_counters=_stored(run_dir, "kernel_counters"),
                        controller_tids=tuple(manifest.get("controller_tids", ())))
    if rebuilt:
        origin.notes.append(trust.note("tables_rebuilt", tables=rebuilt))
    if tasks is None:
        tasks = store.read_table(run_dir / "tasks.parquet")
    return analyse_capture(run_dir, manifest, cap, tasks,
                           Window(t0, end, released, _marker(cap.markers, MARK_WARMUP)), origin,
                           figures=figures, laps=laps)


def load_checked(run_dir: Path, allow_incomplete: bool = False) -> store.Run:
    """Open a run directory, verified (``harmony.load``, ``harmony report``).

    As :func:`harmony.store.open_run`, and a complete run's tables are checked (each file's Parquet
    footer and schema): a derived table that is missing or unreadable is rebuilt from the raw
    capture (:func:`analyse`; the run's notes then say which and why). RunError naming what is
    wrong when that cannot be done: a table of the capture's own (tasks, the kernel's view, the
    workers' counters) is damaged, the raw capture does not decode (the file is named), or the
    run was imported (its trace is imported again with ``harmony import``).
    """
    run = store.open_run(run_dir, allow_incomplete=allow_incomplete)
    if not run.complete:
        return run
    problems = store.table_problems(run.path, store.held_tables(run.manifest, run.path))
    if not problems:
        return run
    what = "; ".join(f"{name}.parquet {why}" for name, why in problems.items())
    own = sorted(set(problems) - set(store.DERIVED_TABLES))
    if own:
        raise RunError(f"{run.path}: {what}: the capture's own tables ({', '.join(own)}) cannot "
                       "be rebuilt")
    source = _source(run.manifest)
    if "imported" in source:
        raise RunError(f"{run.path}: {what}: import {source['imported']} again (harmony import) "
                       "to rebuild them")
    read_only = store.cannot_write(run.path)
    if read_only:
        raise RunError(f"{run.path}: {what}; they cannot be rebuilt where the run is "
                       f"({read_only}): copy it somewhere writable")
    return analyse(run.path, figures=not run.manifest.get("figures_deferred"), rebuilt=problems)


def _source(manifest: dict) -> dict:
    """The manifest's ``source`` (what an imported run was imported from); {} if it has none,
    or none that is a JSON object (a damaged manifest)."""
    source = manifest.get("source")
    return source if isinstance(source, dict) else {}


def _marker(markers: pd.DataFrame, text: str) -> int | None:
    hit = markers.loc[markers["text"] == text, "ts"]
    return int(hit.iloc[0]) if len(hit) else None


def _stored(run_dir: Path, name: str) -> pd.DataFrame | None:
    path = run_dir / f"{name}.parquet"
    return store.read_table(path) if path.exists() else None


def mark_incomplete(run_dir: Path, manifest: dict, why: str) -> None:
    """Write ``manifest`` into ``run_dir`` as an incomplete run, ``why`` its reason."""
    manifest["status"] = "incomplete"
    manifest["incomplete_reason"] = why
    store.write_json(run_dir / "manifest.json", manifest)


# --- the pipeline -------------------------------------------------------------------------------

def analyse_capture(out: Path, manifest: dict, cap: Capture, tasks: pd.DataFrame, window: Window,
                    origin: Origin, figures: bool = True, progress=None,
                    laps: Laps | None = None, before_complete=None) -> store.Run:
    """Tables, checks, metrics, figures and report of one capture, into the run directory ``out``
    (which holds ``manifest``; the tasks table is written unless it is there already).
    ``before_complete``, if given, is called before the manifest is first written complete (the
    importer waits there for its copy of the trace, made meanwhile); what it raises stops the
    analysis as an error of the analysis would.

    ``progress``, if given, is called with a short line as each long step starts. An error leaves a
    capture of Harmony's own as it was on disk (status "captured": it can be analysed again) and
    marks an imported run incomplete with the reason; an experiment that cannot read the capture
    (its analyse or plot raises one of EXPERIMENT_CANNOT_READ) raises RunError saying so.
    """
    out = Path(out)
    step = progress or (lambda what: None)
    laps = laps or Laps()
    experiment = get_experiment(manifest["experiment"])
    writing = []        # the large tables are written while the checks and metrics run
    checking = None     # the capture's own checks, beside the tables
    stops_before = stops.raised()
    try:
        # events two CPUs stamped alike, in the order the scheduler followed (analysis.ties):
        # before any table, and before the events are written
        cap.events, cap.meta["clock_ties"] = order_ties(cap.events)
        if not (out / "tasks.parquet").exists():
            store.write_table(out, "tasks", tasks)
        if figures:     # the figures' libraries (~0.5 s of imports), on the side thread
            on_side_thread(importlib.import_module, "harmony.analysis.plots")
        step(f"{cap.meta.get('n_events', len(cap.events)):,} events: rebuilding the tables of "
             f"{len(tasks)} tasks")
        # a large events table is written while the tables are built and the checks run. It
        # waited for the task records to be freed while Arrow copied a row group of 1 M rows
        # (~40 MB beside the records); in row groups of 256 K (store.WRITE_CHUNK_ROWS) it starts
        # now, in the CPU time the tables' kernels leave: whole imports of 10.25 M events took
        # 4.06-4.14 s against 4.27-4.38, of 5.12 M 2.88-3.01 s against 3.05-3.17, peaking 2-11
        # MiB higher there (3 interleaved pairs each, 2026-12-05)
        early = len(cap.events) >= BACKGROUND_WRITE_ROWS
        if early:
            writing.append(in_background(store.write_table, out, "events", cap.events))

        def records_freed():
            # the checks that read the capture alone, on the side thread, beside the runs once
            # the task records are freed, not beside the records and the run queues: there they
            # shared the CPUs with the kernels on the main thread's path (whole imports of
            # 10.25 M events: 4.45-4.60 s against 4.59-4.89, 3 interleaved pairs; at 5.12 M
            # the same time and peak)
            nonlocal checking
            checking = on_side_thread(capture_checks, cap, tasks, manifest["cpus"], window,
                                      origin)

        tables, wasted = derive_tables(
            cap, tasks, manifest["cpus"], window, manifest["params"]["window_s"],
            rt_share=(manifest.get("sched") or {}).get("rt_share"),
            domains=manifest.get("topology"), records_freed=records_freed)
        for name, df in tables.items():
            if name == "events" and early:
                continue
            if len(df) >= BACKGROUND_WRITE_ROWS:
                writing.append(in_background(store.write_table, out, name, df))
            else:
                store.write_table(out, name, df)
        own = {"kernel_samples": origin.kernel_samples, "kernel_counters": origin.kernel_counters,
               "kernel_nr_running": origin.kernel_nr_running}
        manifest["tables"] = ["tasks", *tables, *(k for k, v in own.items() if v is not None)]
        laps("tables")
        check(manifest, cap, tasks, window, origin, tables, out, checking.result())
        laps("checks")
        run = store.Run(out, manifest)
        # the experiment reads the tables just written: hand it those in memory as they read back
        # from Parquet (markers' text comes back as pandas' string dtype: left to be read)
        served = {"tasks": tasks, **{k: v for k, v in tables.items() if k != "markers"}}
        if origin.kernel_samples is not None:
            served["kernel_samples"] = origin.kernel_samples
        served["wasted"] = wasted
        run.preload(served)
        try:
            summary = experiment.summarise(run)
        except EXPERIMENT_CANNOT_READ as exc:
            raise _cannot_read(out, experiment, origin, exc) from None
        store.write_json(out / "summary.json", summary)
        run.preload_summary(json.loads(json.dumps(summary, default=store.json_default)))
        laps("metrics")
        manifest["figures"], manifest["figures_deferred"] = [], not figures
        if figures:     # drawn while the large tables are still being written
            drawn = Laps()
            step("drawing the figures")
            try:
                paths = _draw(run)
            except EXPERIMENT_CANNOT_READ as exc:
                raise _cannot_read(out, experiment, origin, exc) from None
            drawn("figures")
            laps.skip()
        for w in writing:
            w.result()
        if before_complete is not None:
            before_complete()
        if writing or before_complete is not None:
            laps("waiting")
        manifest.setdefault("timings_s", {})["analysis"] = laps.steps
        if figures:
            _record_figures(run, paths, drawn)
        else:
            _write_complete(run)
    except BaseException as error:
        # nothing is left writing into the run, or checking it, behind the error
        futures.wait(writing + ([checking] if checking is not None else []))
        # a stop an extension turned into an error of its own is the stop (the figures'
        # matplotlib: a ValueError), never "cannot analyse"
        exc = stops.swallowed(error, stops_before) or error
        # a capture of Harmony's own stays "captured" on disk, to be analysed again; an imported
        # trace's run directory has nothing else to wait for
        if origin.kind == "imported":
            mark_incomplete(out, manifest, reason(exc))
        if isinstance(exc, OSError):    # a full disk, most likely: say where and what is kept
            again = ("the capture is kept (`harmony report` analyses it again)"
                     if origin.kind != "imported" else
                     f"{(manifest.get('source') or {}).get('imported', 'the trace')} is as it "
                     "was: import it again")
            raise RunError(f"{out}: analysis stopped: {exc.filename + ': ' if exc.filename else ''}"
                           f"{exc.strerror or exc}; {again}") from None
        if exc is not error:
            raise exc from error
        raise
    return run


def _cannot_read(out: Path, experiment, origin: Origin, exc: BaseException) -> RunError:
    what = "the imported tasks" if origin.kind == "imported" else "this capture"
    hint = "; try --experiment single-source" if origin.kind == "imported" else ""
    return RunError(f"{out}: experiment {experiment.name} cannot analyse {what} "
                    f"({type(exc).__name__}: {exc}){hint}")


def derive_tables(cap: Capture, tasks: pd.DataFrame, cpus, window: Window, window_s: float,
                  rt_share: float | None = None, domains: dict | None = None,
                  records_freed=None) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """A capture's tables for ``tasks`` in the window: events, markers, migrations, runs,
    runqueue, allocation, shares (see :class:`harmony.store.Run`; ``rt_share``: RT throttling's
    share of a CPU, for the fair shares of real-time tasks; ``domains``: the manifest's
    topology, for the migrations' levels); and the policy's wasted CPU time
    (:func:`harmony.analysis.cost.df_wasted`, for the metrics; not stored).

    The CPUs' idle spells come first, before the task records exist; then the tables made from
    the records (migrations, run queue, wasted time). The records are freed
    (:func:`taskstate.release_records`: no later step reads them) once the wasted time has read
    them, before its sweep, and only then are the runs built: at 10 M events the records take
    502 MB and the runs 249 MB (450 while they are built), so the two never share the memory
    (peak 2003 -> 1755 MiB). Built one after the other, not on two threads as
    :func:`reconstruct.df_core` does (the whole import: 1.04x the time; the events' Parquet
    written meanwhile takes the other CPU). ``records_freed``, if given, is called once the
    records are freed (the pipeline starts the capture's checks there)."""
    t0, t_end = window.t0, window.end
    events = cap.events
    # the CPUs' idle spells, which the wasted time reads, before the task records exist: their
    # temporaries never share the memory with them
    idle = idle_spells(events, cpus)
    migrations = reconstruct.df_migrations(events, tasks, t0, domains)
    # the run queues, then the wasted time: both read the records df_migrations made, and each
    # splits its own work over the CPUs. Built side by side, they shared the CPUs with the
    # capture's checks and with each other, and the import's memory peaked while both held
    # their arrays: one after the other, whole imports of a trace-cmd recording peaked at
    # 775-790 MiB against 786-828 at 5.12 M events, 1319-1342 against 1348-1376 at 10.25 M,
    # in the same time (3.08-3.35 s against 3.37-3.49, 4.56-4.70 against 4.62-4.90; 3
    # interleaved pairs each, 2026-12-05)
    runqueue = reconstruct.df_runqueue(events, tasks, cpus, t0, t_end)
    # the records are freed once the wasted time has read them, before its sweep and table
    wasted = df_wasted(events, tasks, cpus, t0, t_end, idle=idle, records_read=release_records)
    del idle
    if records_freed is not None:
        records_freed()
    runs = reconstruct.df_runs(events, tasks, t0, t_end)
    return {"events": events, "markers": cap.markers, "migrations": migrations, "runs": runs,
            "runqueue": runqueue,
            "allocation": reconstruct.df_allocation(runs, tasks, t0, t_end, int(window_s * 1e9)),
            "shares": reconstruct.df_task_share(runs, tasks, cpus, t0, t_end, rt_share)}, wasted


def capture_checks(cap: Capture, tasks: pd.DataFrame, cpus, window: Window,
                   origin: Origin) -> dict:
    """The checks that read the capture alone, not the tables made from it (:func:`check` takes
    them): its blind spots (their facts into ``cap.meta``; the notes as "blind"), the release's
    spread ("release") and the foreign load ("foreign_load")."""
    events, t0, t_end = cap.events, window.t0, window.end
    return {"blind": blind_spots(cap.meta, events, tasks),
            "release": release_spread(events, tasks, t0, window.released, window.warmup),
            "foreign_load": foreign_load(events, tasks, cpus, t0, t_end, origin.controller_tids,
                                         controller=origin.kind == "recorded")}


def check(manifest: dict, cap: Capture, tasks: pd.DataFrame, window: Window, origin: Origin,
          tables: dict[str, pd.DataFrame], out: Path, early: dict) -> None:
    """Every check of what the capture could not see, into ``manifest``: its facts, and the
    notes (``trust_notes`` as data, ``notes`` worded); status "complete". ``early``: what
    :func:`capture_checks` found (run beside the tables)."""
    events, meta, cpus = cap.events, cap.meta, manifest["cpus"]
    t0, t_end = window.t0, window.end
    runqueue = tables["runqueue"]
    blind = early["blind"]
    manifest["capture"] = {k: v for k, v in meta.items() if k not in ("notes", "cmdlines")}
    manifest["t0_ns"], manifest["released_ns"], manifest["end_ns"] = t0, window.released, t_end
    manifest["measured_s"] = (t_end - t0) / 1e9
    manifest["release"] = early["release"]
    manifest["sched_class_counts"] = class_counts(tasks)
    manifest["lost_events"] = meta.get("lost_events", -1)
    manifest["reconstruction_anomalies"] = int(runqueue.attrs.get("anomalies", 0))
    manifest["reconstruction_anomaly_kinds"] = dict(runqueue.attrs.get("anomaly_kinds", {}))
    manifest["kernel_agreement"] = (
        None if origin.kernel_samples is None
        else kernel_agreement(runqueue, origin.kernel_samples, cpus, t0, t_end))
    manifest["kernel_nr_running_agreement"] = (
        None if origin.kernel_nr_running is None
        else nr_running_agreement(runqueue, origin.kernel_nr_running, cpus, t0, t_end))
    manifest["foreign_load"] = early["foreign_load"]
    manifest["kernel_counter_agreement"] = (
        None if origin.kernel_counters is None
        else counters(events, tasks, origin.kernel_counters, tables["runs"], window,
                      tables["migrations"]))
    manifest["migration_causes"] = migration_causes(tables["migrations"], events, t0, t_end)
    if "kernel_schedstat" in manifest:      # a run recorded here or in a VM (not an import)
        counted = schedstat_cpus(manifest, cpus)
        manifest["schedstat_agreement"] = {**schedstat_agreement(
            manifest["kernel_schedstat"], tables["migrations"], events, counted,
            manifest.get("topology")), "cpus": counted}
    notes = (list(origin.notes) + [trust.note("recorder", text=t) for t in meta.get("notes", [])]
             + blind + [trust.note("controller", text=t)
                        for t in manifest.get("controller_notes", [])]
             + trust.check_notes(manifest, origin.kind))
    if manifest.get("crosscheck_probe"):
        notes += crosscheck(out, manifest, cap, tasks, window)
    manifest["trust_notes"] = notes
    manifest["notes"] = trust.words(notes)
    manifest["status"] = "complete"
    manifest["ended_at"] = manifest.get("ended_at") or now()


def blind_spots(meta: dict, events: pd.DataFrame, tasks: pd.DataFrame) -> list[dict]:
    """What a probe's own stream proves it did not record, without counting it lost: the tasks it
    saw run but recorded nothing in the context of, and the experiment tasks' moves no
    sched_migrate_task holds (see analysis.crosscheck); the facts go into ``meta``, the notes are
    returned. (perf, on some kernels, records nothing while swapper/1 or PID 1's threads run: see
    probes/perf.py.)"""
    meta["silent_contexts"] = silent = silent_contexts(events)
    meta["unrecorded_migrations"] = moves = unrecorded_migrations(events, tasks["pid"].to_numpy())
    return trust.blind_spot_notes(meta.get("probe"), silent, moves)


def migration_causes(migrations: pd.DataFrame, events: pd.DataFrame, t0: int, t_end: int) -> dict:
    """The manifest's migration_causes: the window's migrations (n) by cause (counts, with
    ``inferred``), and whether the scheduler's softirq was recorded (without it periodic and
    new-idle pulls are not told apart)."""
    mig = migrations[(migrations["ts"] >= t0) & (migrations["ts"] <= t_end)]
    return {"n": int(len(mig)), "counts": cause_counts(mig),
            "softirq_recorded": softirq_recorded(events)}


def foreign_load(events, tasks, cpus, t0, t_end, controller_tids, controller: bool = True) -> dict:
    """The manifest's foreign_load: the most any CPU of the set gave to other tasks (share of the
    window, which CPU, the top task), the controller's own share (None where no Harmony controller
    ran: ``controller`` false), and the per-CPU table."""
    df = df_foreign_load(events, tasks, cpus, t0, t_end, controller_tids)
    worst = df.loc[df["foreign_frac"].idxmax()] if df["foreign_frac"].notna().any() else None
    return {"max_frac": None if worst is None else float(worst["foreign_frac"]),
            "max_cpu": None if worst is None else int(worst["cpu"]),
            "top": "" if worst is None else worst["top_foreign"],
            "controller_frac_max": (float((df["controller_s"] / df["window_s"]).max())
                                    if controller else None),
            "per_cpu": df.to_dict(orient="records")}


def counters(events: pd.DataFrame, tasks: pd.DataFrame, table: pd.DataFrame, runs: pd.DataFrame,
             window: Window, migrations: pd.DataFrame | None = None) -> dict:
    """The trace against the workers' own counters (:func:`analysis.counters.counter_agreement`):
    recorded moves and those inferred (the ``migrations`` table's inferred rows), and the moves
    of cause wakeup against the kernel's count of them where it counts scheduler statistics."""
    last_read = int(table["after_ns"].max()) if len(table) else window.end
    if last_read > window.end:       # the end read follows the end marker: runs that cover it
        runs = reconstruct.df_runs(events, tasks, window.t0, last_read)
    inferred = wakeups = None
    if migrations is not None:
        inferred = migrations[migrations["inferred"].to_numpy()]
        wakeups = migrations[(migrations["cause"] == "wakeup").to_numpy()]
    return counter_agreement(df_counter_agreement(events, runs, table, inferred, wakeups))


def crosscheck(out: Path, manifest: dict, cap: Capture, tasks: pd.DataFrame,
               window: Window) -> list[dict]:
    """Compare the cross-check probe's recording with the primary's; write crosscheck.json.

    Sets manifest["probe_agreement"] (the comparison without its examples); returns the notes of
    a disagreement or of a cross-check that could not be done. Never fails the run itself.
    """
    a, name = manifest["probe"], manifest["crosscheck_probe"]
    try:
        other = get_probe(name).decode_dir(out / "raw" / name)
        other.events, other.meta["clock_ties"] = order_ties(other.events)
        blind = blind_spots(other.meta, other.events, tasks)   # its notes say what it did not see
        result = probe_agreement(cap.events, other.events, tasks, window.t0, window.end,
                                 names=(a, name),
                                 lost=(cap.meta.get("lost_events", -1),
                                       other.meta.get("lost_events", -1)),
                                 markers_a=cap.markers, markers_b=other.markers)
        result["events"] = {a: int(len(cap.events)), name: int(len(other.events))}
        result["notes"] = {name: list(other.meta.get("notes", [])) + trust.words(blind)}
    except ProbeError as exc:
        result = {"probes": [a, name], "error": str(exc), "verdict": "not done"}
    store.write_json(out / "crosscheck.json", result)
    manifest["probe_agreement"] = {k: ({kk: vv for kk, vv in v.items() if kk != "examples"}
                                       if isinstance(v, dict) and k in ("migrations", "runs")
                                       else v)
                                   for k, v in result.items() if k not in ("notes",)}
    return trust.crosscheck_notes(result, a, name)


def draw_figures(run: store.Run, into: Path | None = None) -> list[str]:
    """Draw a complete run's figures, record them in its manifest and rewrite report.md.
    ``into``: draw them in ``into/figures/`` instead and leave the run as it is (a run that cannot
    be written: ``harmony report --out``); then their paths are returned, and nothing recorded."""
    if into is not None:
        return [str(p) for p in _draw(run, Path(into) / "figures")]
    laps = Laps()
    paths = _draw(run)
    laps("figures")
    return _record_figures(run, paths, laps)


def _draw(run: store.Run, fig_dir: Path | None = None) -> list[Path]:
    """Draw the run's figures into ``fig_dir`` (default: its figures/ directory); their paths."""
    fig_dir = fig_dir or run.path / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    experiment = experiment_of(run)
    # matplotlib is loaded only to draw (~0.5 s), as the experiments' plot() do
    from harmony.analysis.plots import plot_causes, written_in_parallel

    # the figures held here (their figure functions' calls, or figures made), then made and
    # written by this process and processes forked from it, a share each (matplotlib's Python:
    # one CPU each)
    with written_in_parallel():
        drawn = experiment.plot(run, fig_dir)
        # every run's: why its tasks moved (harmony.analysis.causes)
        m = run.manifest
        drawn.append(plot_causes(run.migrations, m["measured_s"], m["params"].get("bin_s", 0.1),
                                 fig_dir / "causes.png"))
        if (m.get("topology") or {}).get("cpus"):   # the machine, where the run read its shape
            from harmony.analysis.plots_topology import plot_machine

            drawn.append(plot_machine(m, run.migrations, fig_dir / "machine.png"))
    return drawn


def _record_figures(run: store.Run, paths: list[Path], laps: Laps) -> list[str]:
    """Record the figures drawn (``paths``, in ``laps``' "figures" seconds) in the run's manifest;
    write report.md, then the manifest."""
    run.manifest["figures"] = [str(p.relative_to(run.path)) for p in paths]
    run.manifest["figures_deferred"] = False
    run.manifest.setdefault("timings_s", {})["figures"] = laps.steps["figures"]
    _write_complete(run)
    return run.manifest["figures"]


def _write_complete(run: store.Run) -> None:
    """Write the run's report.md, then its manifest (which says the run is complete): a stop
    between the two leaves no complete run without its report."""
    write_report(run)
    store.write_json(run.path / "manifest.json", run.manifest)
