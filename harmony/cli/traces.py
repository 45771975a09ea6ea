"""Commands for traces from and to elsewhere: ``import`` (a trace.dat or perf.data into a run)
and ``export`` (a run's capture as a trace.dat, or its timeline for Perfetto).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import click

from harmony.cli.common import (
    build_kernels_first,
    check_out,
    default_out,
    echo,
    exit_on_error,
    fail,
    json_option,
    note,
    parse_params,
    print_json,
    quiet_option,
)

#: the formats of harmony export and their default file names (harmony.export.FORMATS: that
#: module loads pandas, which a usage error must not wait for)
FORMATS = {"trace.dat": "trace.dat", "perfetto": "trace.pftrace"}

@click.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="trace.dat",
              show_default=True,
              help="trace.dat: trace-cmd's, the capture, for KernelShark and `trace-cmd report`; "
                   "perfetto: the run's timeline (runs per CPU and per task, migrations, run "
                   "queues, markers) for Perfetto's UI and trace processor")
@click.option("--out", type=click.Path(path_type=Path),
              help="file to write (default RUN_DIR/trace.dat, or RUN_DIR/trace.pftrace; a "
                   "run that cannot be written needs --out)")
@quiet_option
@json_option("the file written and the notes")
def export(run_dir, fmt, out, quiet, as_json):
    """Write a run's capture as a trace.dat that KernelShark and `trace-cmd report` open, or its
    timeline as a trace that Perfetto's UI opens."""
    from harmony.export import export as write
    from harmony.store import RunError, cannot_write, open_run, results_kind

    with exit_on_error(also=(OSError,)):
        kind = results_kind(run_dir)
        if kind != "run":       # a batch or a suite: a trace is of one run
            first = min((m.parent for m in run_dir.rglob("manifest.json")), default=None)
            raise RunError(f"{run_dir} is a {kind} directory: export takes one of its runs"
                           + (f", such as {first}" if first else ""))
        open_run(run_dir, allow_incomplete=fmt == "trace.dat")  # an incomplete run's capture too
    if out is None:
        why = cannot_write(run_dir)
        if why:
            raise click.UsageError(f"{run_dir} cannot be written ({why}): give --out FILE for "
                                   f"the {fmt}")
    dest = out or run_dir / FORMATS[fmt]
    if dest.is_dir():
        raise click.BadParameter(f"{dest} is a directory", param_hint="--out")
    if not dest.absolute().parent.is_dir():
        raise click.BadParameter(f"{dest.absolute().parent}: no such directory", param_hint="--out")
    check_out(dest.absolute().parent)      # a writable one
    with exit_on_error(also=(OSError,)):
        wrote, notes = write(run_dir, fmt, dest)
    if as_json:
        print_json({"path": str(wrote), "format": fmt, "notes": notes})
        return
    for line in notes:          # note() says nothing under -q
        note(line)
    echo(str(wrote))


@click.command("import")
@click.argument("trace_file", metavar="FILE", type=click.Path(path_type=Path, allow_dash=True))
@click.option("--pid", "pids", type=click.IntRange(min=1), multiple=True,
              help="a task of the experiment")
@click.option("--comm", "comms", multiple=True, metavar="NAME",
              help="tasks whose comm matches NAME (a glob such as 'hmy-*')")
@click.option("--cpus", help="experiment CPU set (default: every CPU in the trace)")
@click.option("--t0", "t0_s", type=float,
              help="t0 in seconds on the trace clock (as trace-cmd report prints)")
@click.option("--t0-marker", metavar="TEXT", help="t0 is the first trace marker with this text")
@click.option("--end", "end_s", type=float,
              help="end of the measured window, seconds on the trace clock")
@click.option("--end-marker", metavar="TEXT", help="the measured window ends at this trace marker")
@click.option("--experiment", "-e", default="single-source", show_default=True, metavar="NAME",
              help="whose metrics and figures")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE",
              help="experiment parameter")
@click.option("--buffer",
              help="trace.dat instance buffer to read (default: the only one with data)")
@click.option("--out", type=click.Path(path_type=Path),
              help="run directory (default runs/import-<time>)")
@quiet_option
@click.option("--tasks", "list_tasks", is_flag=True,
              help="only list the trace's tasks (pid, run time, comm), to choose --pid/--comm from")
@click.option("--no-memory-check", is_flag=True,
              help="import even a trace this host may not have the memory for (refused otherwise, "
                   "before it is read, with the estimate)")
@click.option("--no-figures", is_flag=True,
              help="draw no figures now (a large trace's import waits ~1 s less); `harmony "
                   "report OUT` draws them")
@click.option("--no-disk-check", is_flag=True,
              help="import even where --out's file system may not have the room for the run "
                   "(refused otherwise, before the trace is read, with the estimate)")
@json_option("the run's manifest facts and metrics", as_report=True)
@click.option("--verbose", "-v", is_flag=True,
              help="every parameter, measurement fact and note")
def import_(trace_file, pids, comms, cpus, t0_s, t0_marker, end_s, end_marker, experiment, params,
            buffer, out, quiet, list_tasks, no_memory_check, no_figures, no_disk_check, as_json,
            verbose):
    """Analyse a trace.dat (trace-cmd record) or perf.data (perf record -e 'sched:*', perf sched
    record) from another host; FILE "-": one piped in (perf record -o - ... | harmony import -),
    kept in the run directory as it arrives."""
    from harmony.core.osutil import parse_cpulist
    from harmony.experiments import get_experiment
    from harmony.importer import import_trace

    # Everything is checked before the file is read.
    piped = str(trace_file) == "-"
    if piped and sys.stdin.isatty():
        raise click.BadParameter("- reads the trace piped into harmony, and standard input is a "
                                 "terminal: pipe one in (perf record -o - ... | harmony import -)",
                                 param_hint="FILE")
    if not piped and not trace_file.exists():     # the input: missing is status 1, as a run's
        fail(f"{trace_file}: no such file")
    if not piped and not trace_file.is_file():  # a FIFO, a device: reading could wait forever
        raise click.BadParameter(f"{trace_file} is not a regular file", param_hint="FILE")
    if list_tasks:
        from harmony.importer import df_trace_tasks, read_trace, receive_stdin, trace_tasks_text
        with exit_on_error(also=(OSError,)), \
                tempfile.TemporaryDirectory(prefix="harmony-stdin-") as tmp:
            cap, _ = read_trace(receive_stdin(Path(tmp)) if piped else trace_file, buffer)
        click.echo(trace_tasks_text(df_trace_tasks(cap.events, cap.meta.get("cmdlines"))))
        return
    if not pids and not comms:
        raise click.UsageError("name the experiment's tasks with --pid and/or --comm (--tasks "
                               "lists the trace's)")
    if t0_s is not None and t0_marker is not None:
        raise click.UsageError("give --t0 or --t0-marker, not both")
    if end_s is not None and end_marker is not None:
        raise click.UsageError("give --end or --end-marker, not both")
    if t0_s is not None and end_s is not None and end_s <= t0_s:
        raise click.BadParameter(f"{end_s} is not after --t0 {t0_s}", param_hint="--end")
    try:
        exp = get_experiment(experiment)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--experiment") from None
    cpu_set = None
    if cpus is not None:
        try:
            cpu_set = parse_cpulist(cpus)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--cpus") from None
    overrides = parse_params(params)
    known = {p.name for p in exp.all_params()}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise click.BadParameter(f"{exp.name} has no parameter {', '.join(unknown)}",
                                 param_hint="--param")
    if "duration" in overrides:
        raise click.BadParameter("the measured window of an imported trace is set with --end or "
                                 "--end-marker",
                                 param_hint="--param duration")
    why = exp.import_problem(overrides)
    if why:
        raise click.UsageError(why)
    if out is None:
        out = default_out("import")
    check_out(out)
    if (out / "manifest.json").exists():
        raise click.BadParameter(f"{out} already holds a run; choose another --out",
                                 param_hint="--out")
    from harmony.suite import Progress
    # a status line on a terminal only: a script or a log gets the summary (or the one-line error)
    progress = Progress(1, 0, quiet=quiet or not sys.stderr.isatty())
    if piped:
        trace_file = _receive_piped_trace(out, progress)
    # after a piped trace is in (its writer, perf record, would wait on a full pipe)
    build_kernels_first()
    with exit_on_error(also=(ValueError, OSError)):
        try:
            result = import_trace(trace_file, out, pids=pids, comms=comms, cpus=cpu_set,
                                  t0_s=t0_s, t0_marker=t0_marker, end_s=end_s,
                                  end_marker=end_marker, experiment=experiment, params=overrides,
                                  buffer=buffer, progress=progress.phase,
                                  memory_check=not no_memory_check,
                                  disk_check=not no_disk_check, figures=not no_figures)
        finally:
            progress.clear()        # before the summary, or the error, takes its place
    from harmony.cli.screens import Shown

    Shown(as_json, verbose).run(result)


def _receive_piped_trace(out: Path, progress) -> Path:
    """The trace piped into ``harmony import -``, written into ``out``'s raw/import/ as it
    arrives; if it cannot be (empty, not a trace, a signal), what was made of ``out`` is
    removed again (nothing else was there: :func:`check_out`)."""
    from harmony.importer import RAW_DIR, receive_stdin

    target = out / RAW_DIR
    made = [d for d in (*reversed(target.parents), target) if not d.exists()]   # outermost first
    progress.phase("receiving the trace piped in")
    try:
        with exit_on_error(also=(OSError,)):
            return receive_stdin(target)
    except BaseException:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    finally:
        progress.clear()
