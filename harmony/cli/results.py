"""Commands that read results: ``report`` (a run, batch or suite), ``infer`` (the policy card),
``compare`` (sources side by side) and ``simulate`` (runs under a reference policy, no kernel).

The reading commands write nothing but what they are asked to: a run, batch or suite on a
read-only file system is read as it is, and ``report --out DIR`` writes its report there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from harmony.analysis.thresholds import COMPARE_LEVEL, COMPARE_MIN_RUNS  # constants, no imports
from harmony.cli.common import (
    check_out,
    decide_cap,
    decide_options,
    default_out,
    echo,
    exit_on_error,
    fail,
    json_option,
    note,
    parse_params,
    plural,
    print_json,
    quiet_option,
    warn,
)
from harmony.cli.screens import Shown


def _where_to_write(path: Path, out: Path | None) -> Path | None:
    """Where ``report`` writes: ``out`` if given, else ``path`` if it can be written, else
    nowhere (None; a note says so)."""
    from harmony.store import cannot_write

    if out is not None:
        check_out(out)
        out.mkdir(parents=True, exist_ok=True)
        return out
    why = cannot_write(path)
    if why is None:
        return path
    note(f"{path} cannot be written ({why}): nothing is written there; --out DIR writes the "
         "report in DIR")
    return None


@click.command()
@click.argument("run_dir", metavar="DIR", type=click.Path(path_type=Path))
@json_option("what the report says (a run's manifest facts and metrics, a batch's "
             "aggregates, a suite's card)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="write report.md and report.html (and figures not drawn yet) in this "
                   "directory, leaving DIR as it is (DIR is read-only: nothing is written "
                   "without --out)")
@click.option("--allow-incomplete", is_flag=True,
              help="an incomplete run: report what it captured (marked as such, not a result)")
@quiet_option
def report(run_dir, as_json, out, allow_incomplete, quiet):
    """Print the report of a run, batch or suite (every fact, note and figure), and write
    report.md and report.html beside its figures, drawing any not drawn yet.

    A run: its summary, measurement and notes. A batch (a suite configuration, or `run
    --repeat`): its aggregates and figures/reps.png. A suite: its policy card."""
    from harmony.store import results_kind

    with exit_on_error(also=(OSError,)):
        kind = results_kind(run_dir)
    if kind == "batch":
        return _batch_report(run_dir, as_json, out)
    if kind == "suite":
        return _suite_report(run_dir, as_json, out)
    return _run_report(run_dir, as_json, out, allow_incomplete)


def _run_report(run_dir: Path, as_json: bool, out: Path | None, allow_incomplete: bool):
    from harmony.analysis.report import figures_on_disk, summary_text, write_report
    from harmony.cli.screens import files_lines
    from harmony.pipeline import analyse, draw_figures, load_checked
    from harmony.store import IncompleteRun, cannot_write, why_incomplete

    with exit_on_error(also=(OSError,)):
        run = load_checked(run_dir, allow_incomplete=True)   # its tables checked (and rebuilt)
        status = run.manifest.get("status")
        if status == "captured":  # never analysed (a full disk, a crash)
            why = cannot_write(run_dir)
            if why:
                fail(f"{run_dir}: captured, not analysed yet, and it cannot be written ({why}): "
                     "copy it somewhere writable to analyse it")
            run = analyse(run_dir)
        if not run.complete:
            if not allow_incomplete:
                raise IncompleteRun(f"{run_dir}: {why_incomplete(run.manifest)}", run_dir, status)
            return _incomplete_report(run, as_json)
        dest = _where_to_write(run_dir, out)
        drawn, missing = figures_on_disk(run)
        figures = [run.path / f for f in drawn]
        if dest == run.path:
            if run.manifest.get("figures_deferred") or missing:
                draw_figures(run)       # a later repetition of a batch, or figures since removed
                figures = [run.path / f for f in figures_on_disk(run)[0]]
            write_report(run)
        elif dest is not None:
            if run.manifest.get("figures_deferred") or missing:
                figures = [Path(p) for p in draw_figures(run, into=dest)]
            write_report(run, dest, figures)
    if as_json:
        print_json({"manifest": {k: v for k, v in run.manifest.items() if k != "host"},
                    "summary": run.summary})
        return
    echo(summary_text(run).split("\nfigures\n")[0])
    echo()
    written = dest if dest is not None else (run.path if (run.path / "report.md").is_file()
                                             else None)
    echo("\n".join(files_lines(run.path, written, figures)))
    if dest is None and (run.manifest.get("figures_deferred") or missing):
        echo(f"figures not drawn: `harmony report {run_dir} --out DIR` draws them in DIR")


def _incomplete_report(run, as_json: bool):
    """``report --allow-incomplete``: what an incomplete run captured, marked as such."""
    from harmony.cli.screens import incomplete_screen
    from harmony.results import captured

    facts = captured(run)
    if as_json:
        print_json({"incomplete": True, **facts})
    else:
        echo(incomplete_screen(facts))


def _suite_report(out: Path, as_json: bool, dest: Path | None):
    from harmony.analysis import policy, report_suite
    from harmony.cli.screens import card_screen
    from harmony.store import read_json
    from harmony.suite import cpu_limits

    with exit_on_error(also=(OSError,)):
        info = read_json(out / "suite.json")
        # the note the suite wrote its card with (a suite of an older Harmony did not keep it:
        # what its CPU count cannot answer, at least)
        note_ = info["card_note"] if "card_note" in info else (
            " ".join(cpu_limits(len(info.get("cpus") or []))) or None)
        where = _where_to_write(out, dest)
        written = report_suite.write(out, note=note_, dest=where) if where is not None else None
        card = policy.infer([out])
    if as_json:
        print_json(card.to_dict())
        return
    echo(card_screen(card, verbose=True).rstrip())
    if written:
        echo(f"\nreport: {written[0]} and {written[1]}")
    elif (out / "report.md").is_file():
        echo(f"\nreport (as the suite wrote it): {out / 'report.md'} and {out / 'report.html'}")


def _batch_report(out: Path, as_json: bool, dest: Path | None):
    from harmony.analysis.report_suite import plot_reps
    from harmony.batch import batch_text, draw_batch_figures
    from harmony.store import read_json

    with exit_on_error(also=(OSError,)):
        record = read_json(out / "batch.json")
        if "complete" not in record:
            fail(f"{out}: the batch was not finished (its runs were not all analysed)")
        where = _where_to_write(out, dest)
        figures = [out / f for f in record.get("figures") or [] if (out / f).is_file()]
        if where == out:
            record = draw_batch_figures(out)
            figures = [out / f for f in record["figures"]]
        elif where is not None and record.get("complete"):
            (where / "figures").mkdir(exist_ok=True)
            drawn = plot_reps(record, where / "figures" / "reps.png")
            figures = [drawn] if drawn else []
    if as_json:
        print_json(record)
        return
    echo(batch_text(record))
    if figures:
        echo("\nfigures: " + ", ".join(map(str, figures)))


def _check_sources(dirs) -> None:
    """Each directory given opens as ``harmony report`` and harmony.load open it, though infer
    and compare read the runs under it: a run (missing, corrupt or incomplete: its one error, with
    what can still be done), a batch or a suite by its record (batch.json, suite.json: corrupt,
    the one error naming the file); one that is not a directory is named. A directory with none
    of these files is a folder of results, read for the runs under it."""
    from harmony.store import RESULT_FILES, missing_dir, open_run, read_json

    for d in map(Path, dirs):
        if not d.is_dir():
            raise missing_dir(d)
        record = next((name for name in RESULT_FILES if (d / name).exists()), None)
        if record == "manifest.json":
            open_run(d)
        elif record is not None:
            read_json(d / record)


@click.command()
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...", type=click.Path(path_type=Path))
@json_option("the card")
@click.option("--verbose", "-v", is_flag=True,
              help="each answer's numbers, thresholds and runs, and the runs not used")
def infer(dirs, as_json, verbose):
    """The policy card (thesis Table 7.1) from run, batch or suite directories (or folders of
    them); with server runs, how the scheduler treats each server shape."""
    from harmony.analysis import server_card
    from harmony.analysis.policy import collect, infer_evidence
    from harmony.cli.screens import card_screen
    from harmony.store import no_complete_run

    with exit_on_error(also=(OSError,)):
        _check_sources(dirs)
        evidence, skipped = collect(dirs)
        card = infer_evidence(evidence, skipped)
        if not card.runs:
            raise no_complete_run(", ".join(map(str, dirs)), skipped)
    server = server_card.answers(evidence)
    if as_json:
        print_json(card.to_dict() | ({"server": server} if server else {}))
        return
    echo(card_screen(card, verbose).rstrip())
    if server:
        echo("\nserver-shaped workloads (experiment server):")
        echo("\n".join(server_card.section_lines(evidence)))


@click.command(help=f"""Policy cards and metrics side by side, never pooled: each SOURCE a run,
    batch or suite directory (a host, kernel or scheduler's runs), or a reference of published
    figures: thesis-2011 (the thesis's O(1), CFS and BFS: three sources) or thesis-2011:o1, :cfs,
    :bfs.

    \b
    Prints what each source is, each question's answer per source (* where the answers differ
    in kind; a long answer wraps, never cut), then every source against the first (A), per
    experiment configuration (experiment, P and its swept parameter) and metric: the difference
    of medians B - A with its {COMPARE_LEVEL:.0%} bootstrap interval (runs resampled within each
    source, seeded: the same every time) and Cliff's delta, * where the interval excludes 0, the
    effect is large and each side has {COMPARE_MIN_RUNS} runs or more
    (harmony.analysis.thresholds says why); against a reference's figure, a point (no interval)
    in the figure's statistic.""")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@json_option("sources, answers and metric differences")
@click.option("--all-metrics", is_flag=True,
              help="print every metric compared, not only the card's and those apart")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="also write compare.md, compare.html (a page that stands alone), compare.json "
                   "and figures/ (compare.png: every run; differences.png: the differences with "
                   "their intervals) there")
@click.option("--fail-on-difference", is_flag=True,
              help="exit 1 when a chosen answer (decided on both sides, of different kinds) or "
                   "metric (marked *) differs beyond noise between A and another source; the "
                   "failing rows under \"gate\" in --json (a gate for CI: "
                   "docs/card-and-compare.md)")
@click.option("--question", "questions", multiple=True, metavar="QID",
              help="with --fail-on-difference: check this question's answer (how_many, or its "
                   "number 1-9; repeatable; default: every question, unless --metric is given)")
@click.option("--metric", "metrics", multiple=True, metavar="[EXPERIMENT:]KEY",
              help="with --fail-on-difference: check this metric in every configuration that "
                   "has it (repeatable; default: none)")
def compare(sources, as_json, all_metrics, out, fail_on_difference, questions, metrics):
    from harmony.analysis import compare as cmp_mod
    from harmony.cli.screens import width

    if out is not None:
        check_out(out)
    if (questions or metrics) and not fail_on_difference:
        raise click.UsageError("--question and --metric go with --fail-on-difference")
    try:
        cmp_mod.gate_choice(questions, metrics)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--question" if "question" in str(exc)
                                 else "--metric") from None
    with exit_on_error(also=(OSError,)):
        # a run given: its own error; one not there: compare's, which names the references
        _check_sources([s for s in sources if Path(s).is_dir()])
        cmp = cmp_mod.compare(sources)
    g = cmp_mod.gate(cmp, questions, metrics) if fail_on_difference else None
    if as_json:
        print_json(cmp_mod.to_dict(cmp) | ({"gate": g} if g else {}))
    else:
        # a terminal: wrapped to its width; a file or a pipe: each answer whole on its line
        echo(cmp_mod.compare_text(cmp, width=width() if sys.stdout.isatty() else None,
                                  all_metrics=all_metrics).rstrip())
    if out is not None:
        with exit_on_error(also=(OSError,)):
            for path in cmp_mod.write(cmp, out, all_metrics=all_metrics):
                echo(f"wrote {path}", err=as_json)
    if g is not None:
        echo(cmp_mod.gate_text(g), err=as_json)
        if g["failed"]:
            sys.exit(1)


def _ncpus(ncpus: int | None, old: int | None) -> int:
    """simulate's CPU count: --ncpus, or the old --cpus N (deprecated: --cpus is a CPU list in
    every other command)."""
    if old is not None:
        if ncpus is not None:
            raise click.UsageError("give --ncpus N only (--cpus N is its old spelling)")
        warn(f"simulate --cpus {old} is deprecated: the number of simulated CPUs is --ncpus "
             f"{old} (--cpus is a CPU list in every other command)")
        return old
    return 4 if ncpus is None else ncpus


@click.command()
@click.argument("experiment", required=False)
@click.option("--policy", "policy_name", required=True,
              help="reference policy: global-queue, poly-balance, pairwise-random or coin-flip "
                   "(each run one of the two before, a fair coin per run); or one that sees the "
                   "machine's levels: hierarchical, flat, scx-like")
@click.option("--ncpus", type=click.IntRange(min=2),
              help="number of simulated CPUs, P (they are CPUs 0..P-1; one LLC; --machine gives "
                   "a shape instead)  [default: 4]")
@click.option("--cpus", "old_cpus", type=click.IntRange(min=2), hidden=True,
              help="deprecated spelling of --ncpus")
@click.option("--machine", help="the simulated machine's shape: a preset (smt, 2llc, 2node, "
              "2node-2llc-smt, server-16, server-32, server-64, ring-4) or "
              "sockets=S,llcs=L,cores=C,threads=T[,numa=socket|llc][,distance=ring]; "
              "-p level=smt|llc|package|node|remote places an experiment at a level of it")
@click.option("--experiment", "-e", "experiments", multiple=True, metavar="NAME",
              help="one experiment of the catalog; with --suite, only these (repeatable)")
@click.option("--suite", "whole", is_flag=True, help="the catalog, as `harmony suite` plans it")
@click.option("--quick", is_flag=True, help="the suite's quick plan (shorter runs, fewer points)")
@click.option("--repeat", type=click.IntRange(min=1), help="runs per configuration")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE",
              help="experiment parameter")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path),
              help="output directory (default runs/simulate-<policy>-<time>)")
@quiet_option
@json_option("the card (--suite) or the batch's record", as_report=True)
@click.option("--verbose", "-v", is_flag=True, help="every metric, or the card's every number")
@decide_options
def simulate(experiment, policy_name, ncpus, old_cpus, machine, experiments, whole, quick,
             repeat, params, seed, out, quiet, as_json, verbose, until_decided, max_repeat):
    """Run experiments under a reference policy in a simulator (no root, no kernel) and analyse
    them: one experiment (EXPERIMENT or --experiment NAME, as in `harmony run`) or the catalog
    (--suite, and --experiment NAME to keep only some), printing what `harmony run` or `harmony
    suite` prints."""
    experiments = (experiment, *experiments) if experiment else experiments
    from harmony.analysis.machines import flat_topology, machine_topology
    from harmony.analysis.refpolicy import get_policy, refuse_classes
    from harmony.experiments import CATALOG, get_experiment
    from harmony.experiments.placement import placed_cpus
    from harmony.suite import not_simulated, plan

    try:
        get_policy(policy_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from None
    if not whole and len(experiments) != 1:
        raise click.UsageError("give one of --experiment NAME or --suite" if not experiments
                               else "one --experiment without --suite (with --suite: a suite of "
                                    "these experiments)")
    if machine is not None and (ncpus is not None or old_cpus is not None):
        raise click.UsageError("give --ncpus or --machine, not both (a machine has its CPUs)")
    try:
        topology = machine_topology(machine) if machine is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--machine") from None
    cpus = list(range(len(topology["cpus"]) if topology else _ncpus(ncpus, old_cpus)))
    if out is None:
        out = default_out(f"simulate-{policy_name}")
    check_out(out)
    if out.exists() and any(out.iterdir()):
        raise click.BadParameter(f"{out} is not empty; choose another --out", param_hint="--out")
    if whole:
        if params:
            raise click.UsageError("-p sets an experiment's parameter: give it with "
                                   "--experiment NAME, without --suite")
        try:
            configs = plan(cpus, quick=quick, repeat=repeat, simulated=True, topology=topology,
                           experiments=list(experiments) or None)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        cap = decide_cap(until_decided, max_repeat, max(c.repeat for c in configs))
        for name, why in not_simulated(list(experiments) or CATALOG).items():
            note(f"{name}: left out of a simulated suite ({why})")
        return _simulate_suite((policy_name, topology), configs, cpus, out, seed, quiet, cap,
                               Shown(as_json, verbose))
    experiment = experiments[0]
    try:
        exp = get_experiment(experiment)
        if exp.not_simulated:
            raise ValueError(f"{experiment} cannot be simulated: {exp.not_simulated}")
        overrides = parse_params(params)
        cpus = placed_cpus(overrides.get("level") or "", cpus,
                           topology or flat_topology(len(cpus)))
        values = exp.resolve(overrides, cpus)
        refuse_classes(params=values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    cap = decide_cap(until_decided, max_repeat, repeat or 1)
    _simulate_batch((policy_name, topology), exp, values, cpus, out, repeat or 1, seed, quiet,
                    cap, Shown(as_json, verbose))


def _simulate_suite(simulated, configs, cpus, out, seed, quiet, cap, shown):
    """`simulated`: the policy's name and the simulated machine (None: a flat one)."""
    from harmony.runners import SimRunner
    from harmony.suite import run_suite

    with exit_on_error(marked=f"{out} holds the runs finished so far", also=(OSError,)):
        policy_name = simulated[0]
        record = run_suite(configs, cpus, out, SimRunner(*simulated), seed=seed, quiet=quiet,
                           facts={"kernel": "simulated",
                                  "scheduler": f"reference policy {policy_name}",
                                  "ncpus": len(cpus)}, until_decided=cap)
    shown.suite(out, f"{plural(record['runs'], 'simulated run')} in {record['wall_s']:.0f} s",
                record)
    if record["failures"]:
        fail(f"{plural(len(record['failures']), 'configuration')} failed; see "
             f"{out / 'suite.json'}")


def _simulate_batch(simulated, exp, values, cpus, out, repeat, seed, quiet, cap, shown):
    from harmony.batch import finish_batch
    from harmony.decide import batch_until_decided
    from harmony.runners import SimRunner
    from harmony.store import open_run
    from harmony.suite import Progress

    progress = Progress(repeat, repeat * float(values["duration"]), quiet=quiet, realtime=False)
    start = time.monotonic()
    try:
        with exit_on_error(marked=f"{out} holds the runs finished so far", also=(OSError,)):
            with SimRunner(*simulated) as runner:
                batch_until_decided(exp, values, cpus, out, repeat, runner, seed, cap, progress)
            progress.phase("aggregating the runs")
            record = finish_batch(out)
    finally:
        progress.clear()
    runs = len(record.get("reps") or [])
    if runs == 1 and record.get("complete") and not shown.as_json:
        shown.run(open_run(out / "rep-01"))
        echo(f"batch: {out / 'batch.json'}")
    else:
        shown.batch(record, out)
    if not shown.as_json:
        echo(f"{plural(runs, 'simulated run')} in {time.monotonic() - start:.0f} s")
    if record.get("failed"):
        fail(f"{plural(len(record['failed']), 'run')} not complete; see {out / 'batch.json'}")
