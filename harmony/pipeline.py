"""Turn a stored capture into tables, metrics and figures (the second half of a run)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harmony import store
from harmony.probes import get_probe
from harmony.probes.base import ProbeError
from harmony.probes.proc_stat import SWEEP_BUDGET
from harmony.timing import Laps

T0, RELEASED, END = "harmony t0", "harmony released", "harmony end"
FOREIGN_LOAD_NOTE = 0.05  # above this share of a CPU used by other tasks, the report warns
SLOW_SAMPLER = 0.5        # below this share of the sweeps asked, the report says how many it made


def _marker(markers: pd.DataFrame, text: str) -> int | None:
    hit = markers.loc[markers["text"] == text, "ts"]
    return int(hit.iloc[0]) if len(hit) else None


def analyse(run_dir: Path, quiet: bool = True, figures: bool = True) -> store.Run:
    """Decode ``run_dir``'s raw capture and write every table, summary.json, figures and report.md.

    ``figures=False`` leaves the figures to be drawn later, by :func:`draw_figures` (which
    ``harmony report`` calls): drawing is most of the analysis time, and a batch needs the
    figures of one repetition, not of all.

    Refuses (RunError) a run whose capture did not finish: it stays marked incomplete.
    """
    from harmony.analysis.crosscheck import kernel_agreement, nr_running_agreement
    from harmony.analysis.release import release_spread
    from harmony.analysis.report import write_report
    from harmony.experiments import get_experiment

    run_dir = Path(run_dir)
    manifest = store.read_json(run_dir / "manifest.json")
    if manifest.get("status") not in ("captured", "complete"):
        raise store.RunError(f"{run_dir}: capture is {manifest.get('status')} "
                             f"({manifest.get('incomplete_reason', 'unknown reason')}); not analysed")
    experiment = get_experiment(manifest["experiment"])
    probe_name = manifest["probe"]
    laps = Laps()  # manifest["timings_s"]["analysis"]
    try:
        cap = get_probe(probe_name).decode_dir(run_dir / "raw" / probe_name)
    except ProbeError as exc:
        manifest["status"] = "incomplete"
        manifest["incomplete_reason"] = f"trace could not be decoded: {exc}"
        store.write_json(run_dir / "manifest.json", manifest)
        raise store.RunError(str(exc)) from None
    events, markers = cap.events, cap.markers
    t0, released, t_end = (_marker(markers, m) for m in (T0, RELEASED, END))
    missing = [name for name, v in (("t0", t0), ("end", t_end)) if v is None]
    if missing:
        manifest["status"] = "incomplete"
        manifest["incomplete_reason"] = f"markers missing from the trace: {', '.join(missing)}"
        store.write_json(run_dir / "manifest.json", manifest)
        raise store.RunError(f"{run_dir}: {manifest['incomplete_reason']}")
    tasks = store.read_table(run_dir / "tasks.parquet")
    cpus = manifest["cpus"]
    params = manifest["params"]
    laps("decode")

    tables = write_tables(run_dir, cap, tasks, cpus, t0, t_end, params["window_s"])
    runqueue = tables["runqueue"]
    laps("tables")

    samples_path = run_dir / "kernel_samples.parquet"
    samples = store.read_table(samples_path) if samples_path.exists() else None
    meta = cap.meta
    blind_spots(meta, events, tasks)
    manifest["capture"] = {k: v for k, v in meta.items() if k not in ("notes",)}
    manifest["t0_ns"], manifest["released_ns"], manifest["end_ns"] = t0, released, t_end
    manifest["measured_s"] = (t_end - t0) / 1e9
    manifest["release"] = release_spread(events, tasks, t0, released)
    manifest["lost_events"] = meta.get("lost_events", -1)
    manifest["reconstruction_anomalies"] = int(runqueue.attrs.get("anomalies", 0))
    manifest["reconstruction_anomaly_kinds"] = dict(runqueue.attrs.get("anomaly_kinds", {}))
    manifest["kernel_agreement"] = (kernel_agreement(runqueue, samples, cpus, t0, t_end)
                                    if samples is not None else None)
    nr_path = run_dir / "kernel_nr_running.parquet"
    manifest["kernel_nr_running_agreement"] = (
        nr_running_agreement(runqueue, store.read_table(nr_path), cpus, t0, t_end)
        if nr_path.exists() else None)
    manifest["foreign_load"] = foreign_load(events, tasks, cpus, t0, t_end,
                                             manifest.get("controller_tids", ()))
    manifest["kernel_counter_agreement"] = _counters(run_dir, events, tasks, t0, tables["runs"],
                                                     t_end)
    manifest["notes"] = _notes(manifest, meta)
    if manifest.get("crosscheck_probe"):
        _crosscheck(run_dir, manifest, cap, tasks, t0, t_end)
    manifest["status"] = "complete"
    laps("checks")
    run = store.Run(run_dir, manifest)
    # the experiment reads the tables just written: hand it those that are in memory as they
    # read back from Parquet (markers' text comes back as pandas' string dtype: left to be read)
    run.preload({"tasks": tasks, **({"kernel_samples": samples} if samples is not None else {}),
                 **{k: v for k, v in tables.items() if k != "markers"}})
    summary = experiment.analyse(run)
    store.write_json(run_dir / "summary.json", summary)
    laps("metrics")
    manifest.setdefault("timings_s", {})["analysis"] = laps.steps
    manifest["figures"], manifest["figures_deferred"] = [], not figures
    if figures:
        draw_figures(run)
    else:
        store.write_json(run_dir / "manifest.json", manifest)
        write_report(run)
    return store.load(run_dir)


def write_tables(run_dir: Path, cap, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                 window_s: float) -> dict[str, pd.DataFrame]:
    """Rebuild a capture's tables for ``tasks`` in [t0, t_end] and store each as Parquet.

    Shared by recorded runs (:func:`analyse`) and imported traces (:mod:`harmony.importer`).
    Returns the tables by name: events, markers, migrations, runs, runqueue, allocation, shares.
    """
    from harmony.analysis import reconstruct

    events = cap.events
    core = reconstruct.df_core(events, tasks, cpus, t0, t_end)
    runs = core["runs"]
    tables = {"events": events, "markers": cap.markers,
              "migrations": core["migrations"], "runs": runs, "runqueue": core["runqueue"],
              "allocation": reconstruct.df_allocation(runs, tasks, t0, t_end, int(window_s * 1e9)),
              "shares": reconstruct.df_task_share(runs, tasks, cpus, t0, t_end)}
    for name, df in tables.items():
        store.write_table(run_dir, name, df)
    return tables


def draw_figures(run: store.Run) -> list[str]:
    """Draw a complete run's figures, record them in its manifest and rewrite report.md."""
    from harmony.analysis.report import write_report
    from harmony.experiments import get_experiment

    laps = Laps()
    fig_dir = run.path / "figures"
    fig_dir.mkdir(exist_ok=True)
    experiment = get_experiment(run.manifest["experiment"])
    run.manifest["figures"] = [str(p.relative_to(run.path)) for p in experiment.plot(run, fig_dir)]
    run.manifest["figures_deferred"] = False
    laps("figures")
    run.manifest.setdefault("timings_s", {})["figures"] = laps.steps["figures"]
    store.write_json(run.path / "manifest.json", run.manifest)
    write_report(run)
    return run.manifest["figures"]


def _counters(run_dir: Path, events: pd.DataFrame, tasks: pd.DataFrame, t0: int,
              runs: pd.DataFrame, t_end: int) -> dict | None:
    """The trace against the workers' own counters (kernel_counters.parquet), if they were read:
    :func:`harmony.analysis.counters.counter_agreement`."""
    from harmony.analysis import reconstruct
    from harmony.analysis.counters import counter_agreement, df_counter_agreement

    path = run_dir / "kernel_counters.parquet"
    if not path.exists():
        return None
    counters = store.read_table(path)
    last_read = int(counters["after_ns"].max()) if len(counters) else t_end
    if last_read > t_end:       # the end read follows the end marker: runs that cover it
        runs = reconstruct.df_runs(events, tasks, t0, last_read)
    return counter_agreement(df_counter_agreement(events, runs, counters))


def _crosscheck(run_dir: Path, manifest: dict, cap, tasks: pd.DataFrame, t0: int, t_end: int) -> None:
    """Compare the cross-check probe's recording with the primary's; write crosscheck.json.

    Sets manifest["probe_agreement"] (the comparison without its examples) and adds a note for any
    disagreement or for a cross-check that could not be done; never fails the run itself.
    """
    from harmony.analysis.probe_agreement import probe_agreement

    name = manifest["crosscheck_probe"]
    try:
        other = get_probe(name).decode_dir(run_dir / "raw" / name)
        blind_spots(other.meta, other.events, tasks)     # its notes say what it did not see
        result = probe_agreement(cap.events, other.events, tasks, t0, t_end,
                                 names=(manifest["probe"], name),
                                 lost=(cap.meta.get("lost_events", -1), other.meta.get("lost_events", -1)),
                                 markers_a=cap.markers, markers_b=other.markers)
        result["events"] = {manifest["probe"]: int(len(cap.events)), name: int(len(other.events))}
        result["notes"] = {name: other.meta.get("notes", [])}
    except ProbeError as exc:
        result = {"probes": [manifest["probe"], name], "error": str(exc), "verdict": "not done"}
    store.write_json(run_dir / "crosscheck.json", result)
    manifest["probe_agreement"] = {k: ({kk: vv for kk, vv in v.items() if kk != "examples"}
                                       if isinstance(v, dict) and k in ("migrations", "runs") else v)
                                   for k, v in result.items() if k not in ("notes",)}
    if result.get("error"):
        manifest["notes"].append(f"the {name} cross-check could not be done: {result['error']}")
    elif result["verdict"] != "agree":
        mig, runs = result["migrations"], result["runs"]
        a = manifest["probe"]
        manifest["notes"].append(
            f"{a} and {name} disagree ({result['verdict']}): migrations only {a} "
            f"{mig[f'only_{a}']}, only {name} {mig[f'only_{name}']}; runs only {a} {runs[f'only_{a}']}, "
            f"only {name} {runs[f'only_{name}']} (examples in crosscheck.json)")


def foreign_load(events, tasks, cpus, t0, t_end, controller_tids) -> dict:
    """The manifest's foreign_load: the most any CPU of the set gave to other tasks (share of the
    window, which CPU, the top task), the controller's own share, and the per-CPU table."""
    from harmony.analysis.foreign import df_foreign_load

    df = df_foreign_load(events, tasks, cpus, t0, t_end, controller_tids)
    worst = df.loc[df["foreign_frac"].idxmax()] if df["foreign_frac"].notna().any() else None
    return {"max_frac": None if worst is None else float(worst["foreign_frac"]),
            "max_cpu": None if worst is None else int(worst["cpu"]),
            "top": "" if worst is None else worst["top_foreign"],
            "controller_frac_max": float((df["controller_s"] / df["window_s"]).max()),
            "per_cpu": df.to_dict(orient="records")}


def blind_spots(meta: dict, events, tasks) -> None:
    """What a probe's own stream proves it did not record, without counting it lost: the tasks it
    saw run but recorded nothing in the context of, and the experiment tasks' moves no
    sched_migrate_task holds (see analysis.crosscheck); into meta and its notes. (perf, on some
    kernels, records nothing while swapper/1 or PID 1's threads run: see probes/perf.py.)"""
    from harmony.analysis.crosscheck import silent_contexts, unrecorded_migrations

    if "silent_contexts" in meta:
        return
    meta["silent_contexts"] = silent = silent_contexts(events)
    meta["unrecorded_migrations"] = moves = unrecorded_migrations(events, tasks["pid"].to_numpy())
    notes = meta.setdefault("notes", [])
    probe = meta.get("probe") or "the probe"
    if silent:
        named = ", ".join(f"{c['comm']} ({'CPU %d' % c['cpu'] if c['pid'] == 0 else 'pid %d' % c['pid']}"
                          f", ran {c['runs']}x)" for c in silent[:5])
        notes.append(f"{probe} recorded no event in the context of {_count(len(silent), 'task')} "
                     f"it saw run: {named}; every tracepoint hit there (their switch-out, what their "
                     "interrupts do, e.g. an idle CPU's balancing migrations) is missing and not "
                     "counted in lost_events")
    if moves["n"]:
        notes.append(f"the experiment tasks' own events in the {probe} recording prove "
                     f"{_count(moves['n'], 'move')} of {_count(len(moves['pids']), 'task')} that no "
                     f"sched_migrate_task records "
                     f"(e.g. {moves['examples'][:2]})")


def _count(n: int, noun: str) -> str:
    """'1 task', '3 tasks'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _notes(manifest: dict, meta: dict) -> list[str]:
    """Everything the run could not see or had to work around, for the report."""
    notes = list(meta.get("notes", []))
    notes += manifest.get("controller_notes", [])
    lost = meta.get("lost_events", -1)
    if lost > 0:
        notes.append(f"{lost} events were lost by the probe: tables may miss migrations or switches")
    elif lost < 0:
        notes.append("the probe could not tell whether events were lost")
    params = manifest.get("params", {})
    asked, got = params.get("duration"), manifest.get("measured_s")
    if asked and got and got - asked > max(0.05, 0.05 * asked):
        notes.append(f"the measured window is {got:.3f} s, not the {asked:g} s asked: the end "
                     f"marker came {got - asked:.3f} s late (the controller, waking at the end, "
                     "waited for a CPU)")
    rel = manifest["release"]
    if rel["not_woken"]:
        notes.append(f"{len(rel['not_woken'])} tasks were never seen waking after t0")
    if rel.get("woke_off_initial_cpu"):
        notes.append(f"{len(rel['woke_off_initial_cpu'])} tasks woke at t0 on a CPU other than their "
                     f"initial one: the layout did not exist at t0 (pids {rel['woke_off_initial_cpu'][:5]})")
    if manifest["reconstruction_anomalies"]:
        kinds = ", ".join(f"{k} {v}" for k, v in manifest["reconstruction_anomaly_kinds"].items())
        # a program's threads share its comm: name each program once
        silent = list(dict.fromkeys(c["comm"] for c in meta.get("silent_contexts") or []))
        why = (("the probe lost no events, so the kernel recorded none for them"
                + (f": it records nothing while {', '.join(silent[:3])} run"
                   if silent else " (some kernels omit a sched_switch into a task)"))
               if lost == 0 else "events were lost")
        notes.append(f"{manifest['reconstruction_anomalies']} contradictions in the event stream were "
                     f"repaired ({kinds}): an event the task state machine needed is missing; {why}. "
                     "The run queues resynchronise at the next event; a run whose switch-in is "
                     "missing starts at the task's wake-up and is flagged unseen_start "
                     "(analysis.reconstruct.df_anomalies lists every repair)")
    if manifest.get("workers_alive_at_end", 0) < len(manifest.get("work_done", [])):
        notes.append("some workers were not alive at the end of the run")
    fl = manifest.get("foreign_load") or {}
    if fl.get("max_frac") is not None and fl["max_frac"] > FOREIGN_LOAD_NOTE:
        notes.append(f"other tasks used {fl['max_frac']:.1%} of CPU {fl['max_cpu']} during the run "
                     f"(most: {fl['top'] or '?'}): the host was not quiet, and balance and share "
                     "metrics assume the CPU set belongs to the experiment")
    kc = manifest.get("kernel_counter_agreement")
    if kc and kc["disagreeing"]:
        why = ("events were lost" if lost > 0 else "the probe cannot tell whether events were lost"
               if lost < 0 else "no event was reported lost")
        notes.append(f"the trace disagrees with the kernel's own counters (/proc/<pid>/sched) for "
                     f"{kc['disagreeing']} of {kc['tasks']} tasks: migrations "
                     f"{kc['migrations']['trace']} in the trace, {kc['migrations']['kernel']} "
                     f"counted; switches {kc['switches']['trace']} / {kc['switches']['kernel']} "
                     f"({why}; analysis.counters.df_counter_agreement gives each task's)")
    ka = manifest.get("kernel_agreement")
    due = (asked or 0) * params.get("sample_hz", 0)
    if ka and not ka["sweeps"] and due >= 2:
        notes.append(f"the kernel sampler made no sweep in the window ({due:.0f} were due): it "
                     "got no CPU time among the tasks (SCHED_FIFO refused?), so the run queues "
                     "were not compared with the kernel's /proc or nr_running")
    elif ka and ka["sweeps"] < SLOW_SAMPLER * due:
        notes.append(f"the kernel sampler swept {ka['sweeps']} times in the window, not the "
                     f"{due:.0f} that {params['sample_hz']:g} Hz asks: after a sweep it sleeps "
                     f"{SWEEP_BUDGET} times as long as the sweep took (its /proc reads alone, "
                     f"{ka['sweep_us_median']:.0f} us here), so that it takes at most ~1 % of a "
                     "CPU from the tasks")
    if ka and ka["agreement"] is not None and ka["agreement"] < 0.99:
        notes.append(f"rebuilt run queues agree with the kernel's /proc view on only "
                     f"{ka['agreement']:.1%} of {ka['sweeps']} sweeps (a sweep reads each task's "
                     f"/proc/PID/stat in turn, {ka['sweep_us_median']:.0f} us here: a task that "
                     "moves meanwhile counts where it was read; the nr_running check is atomic "
                     "per CPU)")
    nr = manifest.get("kernel_nr_running_agreement")
    if nr and nr["agreement"] is not None and nr["agreement"] < 0.99:
        notes.append(f"rebuilt run queues agree with the kernel's nr_running on only "
                     f"{nr['agreement']:.1%} of {nr['clean']} clean samples")
    elif nr and nr["samples"] and not nr["clean"]:
        notes.append("no sample of the kernel's nr_running was clean (other tasks were always "
                     "runnable on the CPU set): not compared")
    return notes
