"""Repetitions: N runs of one configuration in ``<dir>/rep-NN/``, and ``<dir>/batch.json``.

batch.json holds the configuration, the repetitions and, per numeric summary key, the median, IQR
and bootstrap 95% CI over the runs (:func:`harmony.analysis.stats.df_aggregate`);
``figures/reps.png`` shows every run as a point.

Runs are made by a *runner* (:mod:`harmony.runners`: real captures on this host, or under a
reference policy; :mod:`harmony.vm.runner`: in a virtual machine), given to :func:`run_batch`.
"""

from __future__ import annotations

from pathlib import Path

from harmony import store
from harmony.analysis.stats import df_aggregate
from harmony.core.wording import plural


def rep_dir(out: Path, k: int) -> Path:
    return Path(out) / f"rep-{k:02d}"


def run_batch(exp, params: dict, cpus: list[int], out: Path, repeat: int, runner, seed: int = 0,
              progress=None, draw_first: bool = True, resume: bool = False,
              first: int = 1) -> list[Path]:
    """Capture ``repeat`` runs into ``out/rep-NN`` (seed, seed+1, ...). Returns the rep dirs.

    Analysis happens in the runner (maybe in the background): call :func:`finish_batch` once the
    runner is drained. The figures of the first repetition are drawn if ``draw_first``; every
    other run's are left to ``harmony report RUN``.

    ``resume``: a repetition already there is not captured again if it is complete (nor analysed)
    or captured (then only analysed); any other (interrupted, incomplete) is moved aside to
    ``rep-NN.incomplete-K`` -- kept, never deleted -- and captured anew.

    ``first``: the repetitions before it were made before (a batch grown by
    :mod:`harmony.decide`): only ``first``..``repeat`` are captured, batch.json lists them all.
    """
    out = Path(out)
    with store.new_run_dir(out):    # a stop before the first repetition leaves no directory
        reps = [rep_dir(out, k) for k in range(1, first)]
        seconds = float(params["duration"]) * (1 + len(exp.companions(params)))
        for k in range(first, repeat + 1):
            d = rep_dir(out, k)
            figures = draw_first and k == 1
            state = _rep_state(d) if resume else None
            if progress:
                progress.show(f"{out.name} rep {k}/{repeat}" + (f" ({state})" if state else ""))
            if state == "captured":             # analysed, not captured again
                runner.adopt([str(d / name) for name in exp.companions(params)] + [str(d)], figures)
            elif state != "complete":
                if state is not None:
                    _move_aside(d)
                runner.capture(exp, params, cpus, d, seed + k - 1, figures=figures)
            if progress:
                progress.finished(seconds)
            reps.append(d)
        before = store.read_json(out / "batch.json") if first > 1 else {}
        store.write_json(out / "batch.json", before | {
            "experiment": exp.name, "params": params, "cpus": cpus, "repeat": repeat,
            "reps": [d.name for d in reps], "status": "captured"})
    return reps


def _rep_state(d: Path) -> str | None:
    """What a resumed batch finds at ``d``: None (nothing), "complete", "captured" (its
    companions too), else "interrupted" (running, incomplete, unreadable)."""
    if not d.exists():
        return None
    try:
        dirs = [p.parent for p in d.rglob("manifest.json")]
        states = {store.read_json(m / "manifest.json").get("status") for m in dirs}
    except store.RunError:
        return "interrupted"
    if states == {"complete"}:
        return "complete"
    if states and states <= {"complete", "captured"}:
        return "captured"
    return "interrupted"


def _move_aside(d: Path) -> Path:
    """Rename an interrupted repetition out of the way (kept: nothing written is lost)."""
    k = 1
    while (aside := d.with_name(f"{d.name}.incomplete-{k}")).exists():
        k += 1
    d.rename(aside)
    return aside


def finish_batch(out: Path, figures: bool = True) -> dict:
    """Aggregate the analysed repetitions of ``out`` into batch.json and figures/reps.png.

    Repetitions that are not complete are listed with their reason, never silently left out.
    ``figures=False`` leaves figures/reps.png to :func:`draw_batch_figures` (``harmony report
    BATCH``); batch.json says so (``figures_deferred``).
    """
    out = Path(out)
    record = store.read_json(out / "batch.json")
    summaries, failed = [], []
    for name in record["reps"]:
        try:
            run = store.open_run(out / name)
            summaries.append((name, run.summary))
        except store.RunError as exc:
            failed.append({"rep": name, "reason": str(exc)})
    agg = df_aggregate([s for _, s in summaries])
    agg = agg.astype(object).where(agg.notna(), None)  # no NaN in JSON: None = no value
    record |= {"status": "complete" if not failed else "incomplete", "complete": len(summaries),
               "failed": failed, "aggregates": agg.to_dict(orient="records"),
               "values": {k: [s.get(k) for _, s in summaries] for k in agg["metric"]}}
    record["figures"], record["figures_deferred"] = [], bool(summaries) and not figures
    if figures:
        return draw_batch_figures(out, record)
    store.write_json(out / "batch.json", record)
    return record


def draw_batch_figures(out: Path, record: dict | None = None) -> dict:
    """Draw a finished batch's figures/reps.png and record it in batch.json; returns the record."""
    from harmony.analysis.report_suite import plot_reps

    out = Path(out)
    record = record if record is not None else store.read_json(out / "batch.json")
    figs = []
    if record.get("complete"):
        (out / "figures").mkdir(exist_ok=True)
        p = plot_reps(record, out / "figures" / "reps.png")
        if p:
            figs.append(str(p.relative_to(out)))
    record["figures"], record["figures_deferred"] = figs, False
    store.write_json(out / "batch.json", record)
    return record


def batch_text(record: dict) -> str:
    """Readable aggregates of a batch: one line per metric, median [IQR] (95% CI)."""
    lines = [f"{record['experiment']}: {record['complete']}/{record['repeat']} runs complete", "",
             f"{'metric':34} {'median':>10} {'IQR':>10} {'95% CI of median':>24}  n"]
    for a in record["aggregates"]:
        ci = ("" if a["ci_low"] is None else f"{a['ci_low']:.4g} .. {a['ci_high']:.4g}")
        lines.append(f"{a['metric']:34} {_g(a['median']):>10} {_g(a['iqr']):>10} "
                     f"{ci:>24}  {a['n']}")
    for f in record["failed"]:
        lines.append(f"not complete: {f['rep']}: {f['reason']}")
    ud = record.get("until_decided")
    if ud:
        rounds = plural(ud['rounds'], 'round')
        planned = plural(ud['planned'], 'run')
        lines += ["", f"until decided: {planned} planned, {ud['added']} added in "
                      f"{rounds} (at most {ud['cap']})"]
        lines += [f"  {qid}: {q['state']}, {q['label']} in {q['votes']} of {q['runs']} runs "
                  "with a label" for qid, q in ud["questions"].items()]
    return "\n".join(lines)


def _g(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"
