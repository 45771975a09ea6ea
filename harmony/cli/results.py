"""Commands that read results: ``report`` (a run, batch or suite), ``infer`` (the policy card),
``compare`` (sources side by side) and ``simulate`` (runs under a reference policy, no kernel).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from harmony.analysis.thresholds import COMPARE_LEVEL, COMPARE_MIN_RUNS  # constants, no imports
from harmony.cli.common import check_out, exit_on_error, fail, parse_params


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print manifest facts and metrics as JSON")
def report(run_dir, as_json):
    """Print a run's summary and write report.md beside its figures (drawing any not drawn yet).

    Given a batch (a suite configuration, or `run --repeat`): its aggregates and figures/reps.png.
    Given a suite: its policy card, and report.md / report.html written again."""
    from harmony.analysis.report import figures_on_disk, summary_text, write_report
    from harmony.pipeline import analyse, draw_figures, load_checked
    from harmony.store import why_incomplete

    if (run_dir / "batch.json").is_file():
        return _batch_report(run_dir, as_json)
    if (run_dir / "suite.json").is_file():
        return _suite_report(run_dir, as_json)
    with exit_on_error(also=(OSError,)):
        run = load_checked(run_dir, allow_incomplete=True)   # its tables checked, rebuilt if need be
        if run.manifest.get("status") == "captured":  # never analysed (a full disk, a crash)
            run = analyse(run_dir)
        if not run.complete:
            fail(f"{run_dir}: {why_incomplete(run.manifest)}; no report for an incomplete run")
        # a later repetition of a batch (drawn on demand), or figures since removed
        if run.manifest.get("figures_deferred") or figures_on_disk(run)[1]:
            draw_figures(run)
        write_report(run)
        if as_json:
            click.echo(json.dumps({"manifest": {k: v for k, v in run.manifest.items() if k != "host"},
                                   "summary": run.summary}, indent=1, default=str))
        else:
            click.echo(summary_text(run))
            click.echo(f"\nreport: {run.path / 'report.md'} and {run.path / 'report.html'}")


def _suite_report(out: Path, as_json: bool):
    from harmony.analysis import policy, report_suite
    from harmony.store import read_json
    from harmony.suite import cpu_limits

    with exit_on_error():
        info = read_json(out / "suite.json")
        # the note the suite wrote its card with (a suite of an older Harmony did not keep it:
        # what its CPU count cannot answer, at least)
        note = info["card_note"] if "card_note" in info else (
            " ".join(cpu_limits(len(info.get("cpus") or []))) or None)
        md, html = report_suite.write(out, note=note)
        card = policy.infer([out])
    if as_json:
        click.echo(json.dumps(card.to_dict(), indent=1, default=str))
    else:
        click.echo(card.text().rstrip() + f"\n\nreport: {md} and {html}")


def _batch_report(out: Path, as_json: bool):
    from harmony.batch import batch_text, draw_batch_figures
    from harmony.store import read_json

    with exit_on_error():
        if "complete" not in read_json(out / "batch.json"):
            fail(f"{out}: the batch was not finished (its runs were not all analysed)")
        record = draw_batch_figures(out)
    click.echo(json.dumps(record, indent=1, default=str) if as_json else batch_text(record))
    if not as_json:
        click.echo("\nfigures: " + ", ".join(str(out / f) for f in record["figures"]))


@click.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the card as JSON")
def infer(dirs, as_json):
    """The policy card (thesis Table 7.1) from run, batch or suite directories; with server runs,
    how the scheduler treats each server shape (harmony.analysis.server_card)."""
    from harmony.analysis import server_card
    from harmony.analysis.policy import collect, infer_evidence
    from harmony.store import RunError

    with exit_on_error(inputs=(RunError,)):      # the directories given are the arguments
        evidence, skipped = collect(dirs)
        card = infer_evidence(evidence, skipped)
    if not card.runs:
        fail(f"no complete run under {', '.join(map(str, dirs))}", 2)
    server = server_card.answers(evidence)
    if as_json:
        click.echo(json.dumps(card.to_dict() | ({"server": server} if server else {}), indent=1,
                              default=str))
        return
    click.echo(card.text().rstrip())
    if server:
        click.echo("\nserver-shaped workloads (experiment server):")
        click.echo("\n".join(server_card.section_lines(evidence)))


@click.command(help=f"""Policy cards and metrics side by side, never pooled: each SOURCE a run,
    batch or suite directory (a host, kernel or scheduler's runs), or a reference of published
    figures: thesis-2011 (the thesis's O(1), CFS and BFS: three sources) or thesis-2011:o1, :cfs,
    :bfs.

    \b
    Prints what each source is, each question's answer per source (* where the answers differ
    in kind), then every source against the first (A), per experiment configuration
    (experiment, P and its swept parameter) and metric: the difference of medians B - A with
    its {COMPARE_LEVEL:.0%} bootstrap interval (runs resampled within each source, seeded: the
    same every time) and Cliff's delta, * where the interval excludes 0, the effect is large
    and each side has {COMPARE_MIN_RUNS} runs or more (harmony.analysis.thresholds says why);
    against a reference's figure, a point (no interval) in the figure's statistic.""")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option("--json", "as_json", is_flag=True,
              help="print sources, answers and metric differences as JSON")
@click.option("--all-metrics", is_flag=True,
              help="print every metric compared, not only the card's and those apart")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="also write compare.md, compare.html (a page that stands alone), compare.json "
                   "and figures/ (compare.png: every run; differences.png: the differences with "
                   "their intervals) there")
def compare(sources, as_json, all_metrics, out):
    from harmony.analysis import compare as cmp_mod
    from harmony.store import RunError

    if out is not None:
        check_out(out)
    with exit_on_error(inputs=(RunError,)):      # the sources given are the arguments (two or more)
        cmp = cmp_mod.compare(sources)
    if as_json:
        click.echo(json.dumps(cmp_mod.to_dict(cmp), indent=1))
    else:
        click.echo(cmp_mod.compare_text(cmp, all_metrics=all_metrics).rstrip())
    if out is not None:
        for path in cmp_mod.write(cmp, out, all_metrics=all_metrics):
            click.echo(f"wrote {path}", err=as_json)


@click.command()
@click.option("--policy", "policy_name", required=True,
              help="reference policy: global-queue, poly-balance or pairwise-random")
@click.option("--cpus", "ncpus", type=click.IntRange(min=2), default=4, show_default=True,
              help="number of simulated CPUs")
@click.option("--experiment", help="one experiment of the catalog (default: the whole suite)")
@click.option("--suite", "whole", is_flag=True, help="the whole catalog, as `harmony suite` plans it")
@click.option("--quick", is_flag=True, help="the suite's quick plan (shorter runs, fewer points)")
@click.option("--repeat", type=click.IntRange(min=1), help="runs per configuration")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="experiment parameter")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="output directory")
def simulate(policy_name, ncpus, experiment, whole, quick, repeat, params, seed, out):
    """Run experiments under a reference policy in a simulator (no root, no kernel) and analyse them."""
    from harmony.analysis.refpolicy import get_policy, refuse_classes
    from harmony.batch import batch_text, finish_batch, run_batch
    from harmony.experiments import CATALOG, get_experiment
    from harmony.runners import SimRunner
    from harmony.suite import not_simulated, plan, run_suite

    try:
        get_policy(policy_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from None
    if bool(experiment) == bool(whole):
        raise click.UsageError("give one of --experiment NAME or --suite")
    check_out(out)
    if out.exists() and any(out.iterdir()):
        raise click.BadParameter(f"{out} is not empty; choose another --out", param_hint="--out")
    cpus = list(range(ncpus))
    if whole:
        configs = plan(cpus, quick=quick, repeat=repeat, simulated=True)
        for name, why in not_simulated(CATALOG).items():
            click.echo(f"{name}: left out of a simulated suite ({why})", err=True)
        record = run_suite(configs, cpus, out, SimRunner(policy_name), seed=seed,
                           facts={"kernel": "simulated", "scheduler": f"reference policy {policy_name}",
                                  "ncpus": ncpus})
        click.echo(f"{record['runs']} simulated runs in {record['wall_s']:.0f} s; "
                   f"report: {out / 'report.md'}")
        return
    try:
        exp = get_experiment(experiment)
        if exp.not_simulated:
            raise ValueError(f"{experiment} cannot be simulated: {exp.not_simulated}")
        values = exp.resolve(parse_params(params), cpus)
        refuse_classes(params=values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with SimRunner(policy_name) as runner:
        run_batch(exp, values, cpus, out, repeat or 1, runner, seed=seed)
    click.echo(batch_text(finish_batch(out)))
