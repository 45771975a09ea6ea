"""The ``harmony`` command: a thin layer over the library. Each command does one job.

Exit codes (:func:`exit_status`, the one place that maps errors to them): 0 success; 1 the job
failed (host cannot run, trace corrupt, run incomplete); 2 bad arguments (nothing was started);
130 interrupted by Ctrl-C; 128 + the signal's number when stopped by SIGTERM (143) or SIGHUP.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import sys
import tempfile
from pathlib import Path

import click

from harmony.analysis.thresholds import COMPARE_LEVEL, COMPARE_MIN_RUNS  # constants, no imports
from harmony.core.errors import HarmonyError, Interrupted, ParameterError
from harmony.core.version import __version__


def exit_status(exc: BaseException, inputs: tuple = ()) -> int:
    """The exit status of a command that stopped on ``exc``; ``inputs``: the error types that
    mean, for this command, that what it was given is not acceptable (bad arguments)."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, Interrupted):
        return 128 + exc.signal
    if isinstance(exc, (ParameterError, *inputs)):
        return 2
    return 1


@contextlib.contextmanager
def _errors(marked=None, also: tuple = (), inputs: tuple = ()):
    """Every command's errors: Harmony's (and ``also`` these types) become one line and the
    status :func:`exit_status` gives; ``marked`` (a string, or a function giving one) says what an
    interrupted command leaves behind ("<dir> is marked incomplete")."""
    try:
        yield
    except (KeyboardInterrupt, HarmonyError, *also, *inputs) as exc:
        msg = ("interrupted" if isinstance(exc, KeyboardInterrupt) else
               f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
               if isinstance(exc, OSError) else str(exc))
        if marked and isinstance(exc, (KeyboardInterrupt, Interrupted)):
            said = marked() if callable(marked) else marked
            msg = f"{msg}; {said}" if said else msg
        _fail(msg, exit_status(exc, inputs))


def _left(out: Path) -> str:
    """What a run stopped half-way left in ``out``, in a few words (its manifest says)."""
    try:
        status = json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return "nothing was started" if not out.exists() else f"{out} holds no run"
    if status == "captured":
        return f"{out} holds the capture, not analysed (`harmony report {out}` analyses it)"
    return f"{out} is {'complete' if status == 'complete' else 'marked incomplete'}"


def _fail(msg: str, code: int = 1):
    click.echo(f"harmony: error: {msg}", err=True)
    sys.exit(code)


def _check_out(out: Path) -> None:
    """Refuse, in one line and before anything starts, an --out that cannot be a directory Harmony
    writes: a file in the way, or no writable directory where it would be made."""
    if out.is_symlink():
        raise click.BadParameter(f"{out} is a symbolic link: Harmony does not write through one",
                                 param_hint="--out")
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    base = out if out.exists() else next((a for a in out.absolute().parents if a.exists()), None)
    if base is None or not base.is_dir():
        raise click.BadParameter(f"{out}: {base} is not a directory", param_hint="--out")
    try:  # a real write: root passes permission checks that /proc or a read-only mount do not
        tempfile.TemporaryDirectory(dir=base, prefix=".harmony-check-").cleanup()
    except OSError as exc:
        raise click.BadParameter(f"{out}: cannot write under {base} ({exc.strerror})",
                                 param_hint="--out") from None


def _parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--param")
        out[key.strip()] = value.strip()
    return out


def _check_release_options() -> None:
    """The controller's expert environment options, checked before anything starts."""
    from harmony.workload.controller import ControllerError, release_options
    try:
        release_options()
    except ControllerError as exc:
        raise click.UsageError(str(exc)) from None


def resolve_cpus(text: str | None) -> list[int]:
    """The experiment CPU set: ``text`` (a CPU list) checked against the online CPUs."""
    from harmony.core.osutil import online_cpus, parse_cpulist

    online = online_cpus()
    if text is None:
        return online
    try:
        cpus = parse_cpulist(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cpus") from None
    offline = sorted(set(cpus) - set(online))
    if offline:
        raise click.BadParameter(f"CPU {','.join(map(str, offline))} is not online "
                                 f"(online: {','.join(map(str, online))})", param_hint="--cpus")
    return cpus


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="harmony")
def main():
    """Harmony: extract the actual CPU load-balancing policy of the running Linux scheduler by experiment."""
    from harmony.core.memory import tune_allocations

    tune_allocations()  # decoders and analyses fill and free many large arrays: see harmony.core.memory


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the facts as JSON")
def doctor(as_json):
    """What this host can do: probes, tracepoints, topology, scheduler. Exit 0 if an experiment can run."""
    from harmony import doctor as host

    facts = host.doctor(vm=True)
    click.echo(json.dumps(facts, indent=1, default=str) if as_json else host.format_doctor(facts))
    sys.exit(0 if facts["verdict"]["can_run"] else 1)


#: how ``harmony run EXP --help`` names a parameter's kind (click's words for its own options)
PARAM_METAVARS = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "list": "INTEGER,...",
                  "flist": "FLOAT,..."}


def write_params(formatter: click.HelpFormatter, exp, ncpus: int) -> None:
    """The section of ``exp``'s parameters (its own, then those every experiment has): name, kind,
    help and the default on ``ncpus`` CPUs, for ``harmony run EXP --help`` and ``harmony list -v``."""
    own = {p.name for p in exp.params}
    params = list(exp.params) + [p for p in exp.all_params() if p.name not in own]
    rows = [(f"{p.name} {PARAM_METAVARS[p.kind]}",
             f"{p.help}  [default: {p.format(p.default_for(ncpus))}"
             + (f" with P = {ncpus}]" if p.scales else "]")) for p in params]
    with formatter.section(f"Parameters of {exp.name} (-p KEY=VALUE)"):
        if any(p.scales for p in params):
            formatter.write_text(f"A default that depends on the CPU count P is given for P = {ncpus}, "
                                 "this host's online CPUs (--cpus sets P).")
            formatter.write_paragraph()
        formatter.write_dl(rows)


class RunCommand(click.Command):
    """``harmony run``, whose --help also lists the parameters of the experiment it names (or the
    catalog, when it names none).

    Click answers --help before it converts any argument, so the experiment's name is read here
    from the raw arguments, with click's own parser (which tells option values from arguments as
    the command will)."""

    def parse_args(self, ctx, args):
        try:
            opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))
        except click.UsageError:
            opts = {}           # the parse proper says what is wrong
        name = opts.get("experiment")
        ctx.meta["harmony.run.experiment"] = name if isinstance(name, str) else None
        if opts.get("help") and isinstance(name, str):
            from harmony.experiments import get_experiment  # as in format_options

            try:
                get_experiment(name)
            except ValueError as exc:   # the error `harmony run NAME` gives
                raise click.BadParameter(str(exc), ctx=ctx, param_hint="EXPERIMENT") from None
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter):
        # imported when help is asked for, as every command imports what it uses when it runs
        from harmony.core.osutil import online_cpus
        from harmony.experiments import CATALOG, get_experiment

        super().format_options(ctx, formatter)
        name = ctx.meta.get("harmony.run.experiment")
        if name is not None:
            write_params(formatter, get_experiment(name), len(online_cpus()))
            return
        with formatter.section("Experiments (harmony run EXPERIMENT --help lists its parameters)"):
            formatter.write_dl([(n, get_experiment(n).question) for n in CATALOG])


@main.command("list")
@click.option("--verbose", "-v", is_flag=True,
              help="also each experiment's parameters, with their defaults on this host")
def list_experiments(verbose):
    """The experiment catalog: name, question, thesis section (-v: and its parameters)."""
    from harmony.core.osutil import online_cpus
    from harmony.experiments import CATALOG, get_experiment

    ncpus = len(online_cpus()) if verbose else 0
    for i, name in enumerate(CATALOG):
        exp = get_experiment(name)
        if verbose and i:
            click.echo()
        click.echo(f"{name:22} {exp.question}  [thesis {exp.thesis}]")
        if verbose:
            formatter = click.get_current_context().make_formatter()
            with formatter.indentation():
                write_params(formatter, exp, ncpus)
            click.echo(formatter.getvalue().rstrip("\n"))



def vm_options(f):
    """--kernel, --vm-cpus, --vm-memory, --vm-qemu: a kernel under test in a virtual machine."""
    f = click.option("--vm-qemu", metavar="SETTING",
                     help="QEMU set-up: accel=auto|kvm|tcg, tcg=auto|multi|single|icount, "
                          "nice=-20..19 (the vCPU threads'), pin=off|on|CPUS (comma-separated; "
                          "default from HARMONY_VM_QEMU, else accel=auto,tcg=auto,nice=-20,pin=off:"
                          " tcg=auto is multi where the host has more CPUs than the VM has "
                          "vCPUs, else single)")(f)
    f = click.option("--vm-memory", metavar="SIZE", default="2G", show_default=True,
                     help="the VM's memory (e.g. 2G, 1536M)")(f)
    f = click.option("--vm-cpus", type=click.IntRange(min=1, max=64), default=4,
                     show_default=True, help="vCPUs of the VM (its CPU set is all of them)")(f)
    f = click.option("--kernel", metavar="KERNEL",
                     help="run in a VM booting this kernel: debian:6.1, debian:6.12, "
                          "debian:6.1-rt, debian:6.12-rt, sched-ext (harmony kernel build "
                          "sched-ext), or a kernel image's path")(f)
    return f


def scx_options(f):
    """--scx, --scx-args: a sched_ext scheduler under test (harmony.vm.scx)."""
    f = click.option("--scx-args", metavar="ARGS",
                     help="the scheduler's arguments, as one string (e.g. \"-v\")")(f)
    f = click.option("--scx", metavar="NAME",
                     help="run under this sched_ext scheduler, started before each run's tasks "
                          "and stopped after: simple, central, qmap, flatcg (built with "
                          "--kernel sched-ext), bpfland, rusty, lavd (harmony scx build), or a "
                          "scheduler's path")(f)
    return f


def _scx_plan(name: str | None, args: str | None, kernel: str | None, params: list[dict]):
    """Check --scx before anything starts: the scheduler's name (found in the sched-ext kernel's
    build), a kernel that has sched_ext (and what a Rust scheduler needs of it), experiments it
    can run; returns its ScxSpec or None."""
    from harmony.vm import kernels, scx, scx_build

    if name is None:
        if args is not None:
            raise click.UsageError("--scx-args goes with --scx NAME")
        return None
    with _errors():
        for p in params:
            scx.check_params(p)
        directory = None
        if kernel is not None and kernel in kernels.NAMED:
            raise ParameterError(f"kernel {kernel} has no sched_ext (CONFIG_SCHED_CLASS_EXT is "
                               "not set in Debian's kernels): --kernel sched-ext has it")
        if kernel is None:
            scx.check_kernel()
        short = name.removeprefix("scx_")
        if short in scx_build.names() and "/" not in name and kernel in kernels.BUILT:
            config = kernels.built_config(kernel)   # not built: what its recipe sets
            lacks = (scx_build.kernel_lacks(config) if config is not None
                     else scx_build.recipe_lacks(kernels.recipe(kernel)["configitems"]))
            if lacks:
                raise ParameterError(f"scheduler {short} needs {', '.join(lacks)}, which kernel "
                                     f"{kernel} does not have: --kernel sched-ext-full has it")
        if short in scx.KNOWN and "/" not in name:
            if kernel is not None and kernel not in kernels.BUILT:   # an image given by path
                directory = Path(kernel).absolute().parent
            else:
                try:
                    directory = kernels.kernel(kernel or "sched-ext").image.parent
                except kernels.KernelError as exc:
                    raise scx.UnknownScheduler(f"scheduler {name}: {exc}") from None
        spec = scx.resolve(name, args, directory)
    return spec


def parse_memory(text: str) -> int:
    """``2G`` / ``1536M`` / ``2048`` (MiB) -> MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([MmGg]?)\s*", text or "")
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r} is not a size such as 2G or 1536M",
                                 param_hint="--vm-memory")
    mib = int(m.group(1)) * (1024 if m.group(2).lower() == "g" else 1)
    if mib < 256:
        raise click.BadParameter(f"{text}: a VM needs 256M at least", param_hint="--vm-memory")
    return mib


def _vm_plan(kernel: str, vm_cpus: int, vm_memory: str, vm_qemu: str | None, cpus, probe: str,
             crosscheck=None):
    """Check a VM run's options before anything starts; returns (guest CPU set, MiB, setting)."""
    from harmony.vm.kernels import check_spec
    from harmony.vm.machine import QemuSetting, missing_tools, setting_from_env

    if cpus is not None:
        raise click.UsageError("--cpus is the host's CPU set; a VM's is all its vCPUs (--vm-cpus)")
    if probe != "tracefs" or crosscheck:
        raise click.UsageError("a VM records with the tracefs probe only (the host's perf does "
                               "not match the kernel under test)")
    with _errors():
        check_spec(kernel)
        setting = QemuSetting.parse(vm_qemu) if vm_qemu is not None else setting_from_env()
    memory = parse_memory(vm_memory)
    missing = missing_tools()
    if missing:
        _fail(f"cannot boot kernel {kernel}: missing {', '.join(missing)} (sudo ./install.sh)")
    return list(range(vm_cpus)), memory, setting


def _vm_runner(kernel: str, vm_cpus: int, memory: int, setting, quiet: bool, scx=None):
    """Fetch the kernel (if named and not cached) and make the VM runner."""
    from harmony import doctor as host
    from harmony.vm.kernels import kernel as get_kernel
    from harmony.vm.runner import VmRunner

    say = (lambda line: None) if quiet else (lambda line: click.echo(f"vm: {line}", err=True))
    with _errors():
        k = get_kernel(kernel, progress=say)
    if k.source.get("note"):          # an older build than the source: which one (manifest too)
        click.echo(f"note: {k.source['note']}", err=True)
    facts = host.run_facts(host.doctor(mount=False, test_record=False))
    return VmRunner(k, vm_cpus, memory, setting, facts=facts, say=say, scx=scx)


@main.command(cls=RunCommand)
@click.argument("experiment")
@click.option("--cpus", help="experiment CPU set, e.g. 0-3 (default: all online CPUs)")
@click.option("--layout", help="tasks per CPU of the set at t0, e.g. 8,0")
@click.option("--duration", type=float, help="seconds measured after t0")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="experiment parameter")
@click.option("--probe", default="tracefs", show_default=True, help="capture backend: tracefs or perf")
@click.option("--crosscheck", metavar="PROBE",
              help="also record the run with this second probe (e.g. perf) and compare the two")
@click.option("--out", type=click.Path(path_type=Path), help="run directory (default runs/<experiment>-<time>)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the workload's randomness")
@click.option("--quiet", "-q", is_flag=True, help="no progress display")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="runs of this configuration: OUT/rep-NN/ and OUT/batch.json with median, IQR, 95% CI")
@vm_options
@scx_options
def run(experiment, cpus, layout, duration, params, probe, crosscheck, out, seed, quiet, repeat,
        kernel, vm_cpus, vm_memory, vm_qemu, scx, scx_args):
    """Run one experiment and analyse it; prints the summary."""
    from harmony.experiments import get_experiment
    from harmony.probes import PROBES

    # Everything is checked before anything starts.
    _check_release_options()
    try:
        exp = get_experiment(experiment)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="EXPERIMENT") from None
    if kernel is not None:
        cpu_set, memory, setting = _vm_plan(kernel, vm_cpus, vm_memory, vm_qemu, cpus, probe,
                                            crosscheck)
    else:
        cpu_set = resolve_cpus(cpus)
    overrides = _parse_params(params)
    if layout is not None:
        overrides["layout"] = layout
    if duration is not None:
        overrides["duration"] = str(duration)
    try:
        values = exp.resolve(overrides, cpu_set)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if probe not in PROBES:
        raise click.BadParameter(f"unknown probe {probe!r} (choose {', '.join(PROBES)})", param_hint="--probe")
    if crosscheck is not None and (crosscheck not in PROBES or crosscheck == probe):
        raise click.BadParameter(f"{crosscheck!r} is not another probe than --probe {probe} "
                                 f"(choose from {', '.join(PROBES)})", param_hint="--crosscheck")
    if out is None:
        out = Path("runs") / f"{experiment}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    _check_out(out)
    if (out / "manifest.json").exists():
        raise click.BadParameter(f"{out} already holds a run; choose another --out", param_hint="--out")
    scx_spec = _scx_plan(scx, scx_args, kernel, [values])
    if kernel is not None:
        return _run_in_vm(exp, values, cpu_set, out, seed, quiet, repeat,
                          _vm_runner(kernel, vm_cpus, memory, setting, quiet, scx_spec))
    facts = _host_facts_or_exit(probe, crosscheck)
    if crosscheck:
        from harmony.probes import get_probe
        ok, why = get_probe(crosscheck).available()
        if not ok:
            _fail(f"probe {crosscheck} cannot record here: {why} (see `harmony doctor`)")
    if repeat > 1:
        if crosscheck:
            raise click.UsageError("--crosscheck records one run; use it without --repeat")
        return _repeat_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, repeat,
                                  scx_spec)
    _run_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, crosscheck, scx_spec)


def _repeat_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, repeat, scx=None):
    from harmony.batch import batch_text, finish_batch, run_batch
    from harmony.runners import KernelRunner
    from harmony.suite import Progress

    progress = Progress(repeat, repeat * values["duration"], quiet=quiet)
    try:
        with _errors(marked=f"the current run under {out} is marked incomplete", also=(OSError,)):
            with KernelRunner(probe, facts, overlap=False, cpus=cpu_set, scx=scx) as runner:
                run_batch(exp, values, cpu_set, out, repeat, runner, seed=seed, progress=progress)
    finally:
        progress.close()
    click.echo(batch_text(finish_batch(out)))
    click.echo(f"\nbatch: {out / 'batch.json'}")


def _run_in_vm(exp, values, cpu_set, out, seed, quiet, repeat, runner):
    """One boot of the kernel under test for the run (or its repetitions); analysed on the host."""
    from harmony.analysis.report import summary_text
    from harmony.batch import batch_text, finish_batch, run_batch
    from harmony.store import load

    with _errors(marked=f"what {out} holds that was not captured is marked incomplete"):
        with runner:
            if repeat > 1:
                run_batch(exp, values, cpu_set, out, repeat, runner, seed=seed)
            else:
                runner.capture(exp, values, cpu_set, out, seed, figures=True)
        failed = [r for r in runner.results if r["status"] != "ok"]
        if failed:
            _fail(f"{failed[0]['path']}: {failed[0]['error']}")
        if repeat > 1:
            click.echo(batch_text(finish_batch(out)))
            click.echo(f"\nbatch: {out / 'batch.json'}")
        else:
            click.echo(summary_text(load(out)))


def _host_facts_or_exit(probe: str, crosscheck: str | None = None) -> dict:
    from harmony import doctor as host
    from harmony.probes import get_probe

    ok, why = get_probe(probe).available()
    if not ok:
        _fail(f"probe {probe} cannot record here: {why} (see `harmony doctor`)")
    # a 10 ms test recording with perf costs ~0.3 s: only when perf will record
    facts = host.doctor(mount=True, test_record="perf" in (probe, crosscheck))
    return host.run_facts(facts)


def _run_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, crosscheck=None,
                    scx=None):
    from harmony.analysis.report import summary_text
    from harmony.run import execute

    with _errors(marked=lambda: _left(out), also=(OSError,)):
        result = execute(exp, values, cpu_set, out, probe, seed, facts, quiet, crosscheck=crosscheck,
                         scx=scx)
    click.echo(summary_text(result))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print manifest facts and metrics as JSON")
def report(run_dir, as_json):
    """Print a run's summary and write report.md beside its figures (drawing any not drawn yet).

    Given a batch (a suite configuration, or `run --repeat`): its aggregates and figures/reps.png.
    Given a suite: its policy card, and report.md / report.html written again."""
    from harmony.analysis.report import figures_on_disk, summary_text, write_report
    from harmony.pipeline import analyse, draw_figures, load
    from harmony.store import why_incomplete

    if (run_dir / "batch.json").is_file():
        return _batch_report(run_dir, as_json)
    if (run_dir / "suite.json").is_file():
        return _suite_report(run_dir, as_json)
    with _errors(also=(OSError,)):
        run = load(run_dir, allow_incomplete=True)   # its tables checked, rebuilt if need be
        if run.manifest.get("status") == "captured":  # never analysed (a full disk, a crash)
            run = analyse(run_dir)
        if not run.complete:
            _fail(f"{run_dir}: {why_incomplete(run.manifest)}; no report for an incomplete run")
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

    with _errors():
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

    with _errors():
        if "complete" not in read_json(out / "batch.json"):
            _fail(f"{out}: the batch was not finished (its runs were not all analysed)")
        record = draw_batch_figures(out)
    click.echo(json.dumps(record, indent=1, default=str) if as_json else batch_text(record))
    if not as_json:
        click.echo("\nfigures: " + ", ".join(str(out / f) for f in record["figures"]))


@main.command()
def clean():
    """Remove what killed Harmony runs left on this host (instances, recorders, orphan workers, cpuset
    cgroups, VMs, sched_ext schedulers)."""
    from harmony.hostfacts import is_root
    from harmony.hygiene import HostLock, reclaim_stale

    if not is_root():
        _fail("clean needs root: what a killed run leaves (tracing instances, cgroups, workers) "
              "is root's to remove")
    with _errors(), HostLock():
        removed = reclaim_stale()
    click.echo("\n".join(f"removed {r}" for r in removed) if removed else "nothing to clean")


#: the file ``harmony export RUN --format F`` writes by default, in RUN
EXPORT_FILES = {"trace.dat": "trace.dat", "perfetto": "trace.pftrace"}


@main.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(list(EXPORT_FILES)), default="trace.dat",
              show_default=True,
              help="trace.dat: trace-cmd's, the capture, for KernelShark and `trace-cmd report`; "
                   "perfetto: the run's timeline (runs per CPU and per task, migrations, run "
                   "queues, markers) for Perfetto's UI and trace processor")
@click.option("--out", type=click.Path(path_type=Path),
              help="file to write (default RUN_DIR/trace.dat, or RUN_DIR/trace.pftrace)")
def export(run_dir, fmt, out):
    """Write a run's capture as a trace.dat that KernelShark and `trace-cmd report` open, or its
    timeline as a trace that Perfetto's UI opens."""
    from harmony.importer import export_tracedat

    if not (run_dir / "manifest.json").is_file():
        raise click.BadParameter(f"{run_dir} is not a run directory (no manifest.json)", param_hint="RUN_DIR")
    dest = out or run_dir / EXPORT_FILES[fmt]
    if dest.is_dir():
        raise click.BadParameter(f"{dest} is a directory", param_hint="--out")
    if not dest.absolute().parent.is_dir():
        raise click.BadParameter(f"{dest.absolute().parent}: no such directory", param_hint="--out")
    _check_out(dest.absolute().parent)      # a writable one
    if fmt == "perfetto":
        from harmony.perfetto_export import export_perfetto  # the protobuf classes: ~0.3 s
        from harmony.pipeline import load

        with _errors(also=(OSError,)):
            click.echo(export_perfetto(load(run_dir), dest))
        return
    with _errors(also=(OSError,)):
        wrote, notes = export_tracedat(run_dir, dest)
    for note in notes:
        click.echo(note, err=True)
    click.echo(wrote)


@main.command("import")
@click.argument("trace_file", metavar="FILE", type=click.Path(exists=True, dir_okay=False, path_type=Path,
                                                              allow_dash=True))
@click.option("--pid", "pids", type=click.IntRange(min=1), multiple=True, help="a task of the experiment")
@click.option("--comm", "comms", multiple=True, metavar="NAME",
              help="tasks whose comm matches NAME (a glob such as 'hmy-*')")
@click.option("--cpus", help="experiment CPU set (default: every CPU in the trace)")
@click.option("--t0", "t0_s", type=float, help="t0 in seconds on the trace clock (as trace-cmd report prints)")
@click.option("--t0-marker", metavar="TEXT", help="t0 is the first trace marker with this text")
@click.option("--end", "end_s", type=float, help="end of the measured window, seconds on the trace clock")
@click.option("--end-marker", metavar="TEXT", help="the measured window ends at this trace marker")
@click.option("--experiment", default="single-source", show_default=True, help="whose metrics and figures")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="experiment parameter")
@click.option("--buffer", help="trace.dat instance buffer to read (default: the only one with data)")
@click.option("--out", type=click.Path(path_type=Path), help="run directory (default runs/import-<time>)")
@click.option("--quiet", "-q", is_flag=True, help="no progress line on a terminal")
@click.option("--tasks", "list_tasks", is_flag=True,
              help="only list the trace's tasks (pid, run time, comm), to choose --pid/--comm from")
@click.option("--no-memory-check", is_flag=True,
              help="import even a trace this host may not have the memory for (refused otherwise, "
                   "before it is read, with the estimate)")
@click.option("--no-disk-check", is_flag=True,
              help="import even where --out's file system may not have the room for the run "
                   "(refused otherwise, before the trace is read, with the estimate)")
def import_(trace_file, pids, comms, cpus, t0_s, t0_marker, end_s, end_marker, experiment, params, buffer, out,
            quiet, list_tasks, no_memory_check, no_disk_check):
    """Analyse a trace.dat (trace-cmd record) or perf.data (perf record -e 'sched:*', perf sched
    record) from another host; FILE "-": one piped in (perf record -o - ... | harmony import -),
    kept in the run directory as it arrives."""
    from harmony.analysis.report import summary_text
    from harmony.core.osutil import parse_cpulist
    from harmony.experiments import get_experiment
    from harmony.importer import import_trace

    # Everything is checked before the file is read.
    piped = str(trace_file) == "-"
    if piped and sys.stdin.isatty():
        raise click.BadParameter("- reads the trace piped into harmony, and standard input is a "
                                 "terminal: pipe one in (perf record -o - ... | harmony import -)",
                                 param_hint="FILE")
    if not piped and not trace_file.is_file():  # a FIFO, a device: reading could wait forever
        raise click.BadParameter(f"{trace_file} is not a regular file", param_hint="FILE")
    if list_tasks:
        from harmony.importer import df_trace_tasks, read_trace, receive_stdin, trace_tasks_text
        with _errors(also=(OSError,)), tempfile.TemporaryDirectory(prefix="harmony-stdin-") as tmp:
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
    overrides = _parse_params(params)
    known = {p.name for p in exp.all_params()}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise click.BadParameter(f"{exp.name} has no parameter {', '.join(unknown)}", param_hint="--param")
    if "duration" in overrides:
        raise click.BadParameter("the measured window of an imported trace is set with --end or --end-marker",
                                 param_hint="--param duration")
    if out is None:
        out = Path("runs") / f"import-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    _check_out(out)
    if (out / "manifest.json").exists():
        raise click.BadParameter(f"{out} already holds a run; choose another --out", param_hint="--out")
    from harmony.suite import Progress
    # a status line on a terminal only: a script or a log gets the summary (or the one-line error)
    progress = Progress(1, 0, quiet=quiet or not sys.stderr.isatty())
    if piped:
        trace_file = _receive_piped_trace(out, progress)
    with _errors(also=(ValueError, OSError)):
        try:
            result = import_trace(trace_file, out, pids=pids, comms=comms, cpus=cpu_set,
                                  t0_s=t0_s, t0_marker=t0_marker, end_s=end_s,
                                  end_marker=end_marker, experiment=experiment, params=overrides,
                                  buffer=buffer, progress=progress.phase,
                                  memory_check=not no_memory_check,
                                  disk_check=not no_disk_check)
        finally:
            progress.clear()        # before the summary, or the error, takes its place
    click.echo(summary_text(result))


def _receive_piped_trace(out: Path, progress) -> Path:
    """The trace piped into ``harmony import -``, written into ``out``'s raw/import/ as it
    arrives; if it cannot be (empty, not a trace, a signal), what was made of ``out`` is
    removed again (nothing else was there: :func:`_check_out`)."""
    from harmony.importer import RAW_DIR, receive_stdin

    target = out / RAW_DIR
    made = [d for d in (*reversed(target.parents), target) if not d.exists()]   # outermost first
    progress.phase("receiving the trace piped in")
    try:
        with _errors(also=(OSError,)):
            return receive_stdin(target)
    except BaseException:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    finally:
        progress.clear()


@main.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the card as JSON")
def infer(dirs, as_json):
    """The policy card (thesis Table 7.1) from run, batch or suite directories; with server runs,
    how the scheduler treats each server shape (harmony.analysis.server_card)."""
    from harmony.analysis import server_card
    from harmony.analysis.policy import collect, infer_evidence
    from harmony.store import RunError

    with _errors(inputs=(RunError,)):      # the directories given are the arguments
        evidence, skipped = collect(dirs)
        card = infer_evidence(evidence, skipped)
    if not card.runs:
        _fail(f"no complete run under {', '.join(map(str, dirs))}", 2)
    server = server_card.answers(evidence)
    if as_json:
        click.echo(json.dumps(card.to_dict() | ({"server": server} if server else {}), indent=1,
                              default=str))
        return
    click.echo(card.text().rstrip())
    if server:
        click.echo("\nserver-shaped workloads (experiment server):")
        click.echo("\n".join(server_card.section_lines(evidence)))


@main.command(help=f"""Policy cards and metrics side by side, never pooled: each SOURCE a run,
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
        _check_out(out)
    with _errors(inputs=(RunError,)):      # the sources given are the arguments (two or more)
        cmp = cmp_mod.compare(sources)
    if as_json:
        click.echo(json.dumps(cmp_mod.to_dict(cmp), indent=1))
    else:
        click.echo(cmp_mod.compare_text(cmp, all_metrics=all_metrics).rstrip())
    if out is not None:
        for path in cmp_mod.write(cmp, out, all_metrics=all_metrics):
            click.echo(f"wrote {path}", err=as_json)


@main.command()
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
    _check_out(out)
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
        values = exp.resolve(_parse_params(params), cpus)
        refuse_classes(params=values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with SimRunner(policy_name) as runner:
        run_batch(exp, values, cpus, out, repeat or 1, runner, seed=seed)
    click.echo(batch_text(finish_batch(out)))


@main.command()
@click.option("--quick", is_flag=True, help="short runs, two points per sweep, 2 repetitions")
@click.option("--cpus", help="experiment CPU set, e.g. 0-3 (default: all online CPUs)")
@click.option("--out", type=click.Path(path_type=Path), help="suite directory (default runs/suite-<time>)")
@click.option("--repeat", type=click.IntRange(min=1), help="runs per configuration (default 5, quick 2)")
@click.option("--experiment", "experiments", multiple=True, help="only these experiments (repeatable)")
@click.option("--probe", default="tracefs", show_default=True, help="capture backend")
@click.option("--overlap", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True,
              help="analyse each run while the next is captured; auto: on CPUs outside the "
                   "experiment's set, or without any, between the measurements only (the "
                   "analyser is stopped while a run is measured); always: also during them")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="no progress display")
@click.option("--resume", is_flag=True,
              help="continue the interrupted suite in --out: its plan, CPU set and seed; complete "
                   "runs kept, captured ones analysed, interrupted ones moved aside and run again "
                   "(a suite in a VM: give its --kernel and --vm-* options again)")
@vm_options
@scx_options
def suite(quick, cpus, out, repeat, experiments, probe, overlap, seed, quiet, resume, kernel,
          vm_cpus, vm_memory, vm_qemu, scx, scx_args):
    """Run the whole catalog with repetitions and write one report (policy card first).

    With --kernel, the whole plan runs in one boot of that kernel in a VM with --vm-cpus vCPUs,
    and is analysed on the host after the VM exits."""
    from harmony.runners import KernelRunner
    from harmony.suite import cpu_limits, plan, resume_plan, run_suite

    _check_release_options()
    if kernel is not None:
        vm_set, memory, setting = _vm_plan(kernel, vm_cpus, vm_memory, vm_qemu, cpus, probe)
    if resume:
        given = [o for o, v in (("--quick", quick), ("--cpus", cpus), ("--repeat", repeat),
                                ("--experiment", experiments), ("--seed", seed)) if v]
        if out is None or given:
            raise click.UsageError("--resume takes the plan, CPU set and seed of the suite in "
                                   "--out: give --out DIR and none of " + ", ".join(
                                       given or ["--quick, --cpus, --repeat, --experiment, --seed"]))
        with _errors(inputs=(OSError,)):
            configs, cpu_set, before = resume_plan(out)
        seed = before.get("seed", 0)
        if kernel is not None and cpu_set != vm_set:
            raise click.UsageError(f"the suite in {out} ran on {len(cpu_set)} CPUs: resume it "
                                   f"with --vm-cpus {len(cpu_set)}")
        if kernel is None:
            resolve_cpus(",".join(map(str, cpu_set)))       # still online
    else:
        cpu_set = vm_set if kernel is not None else resolve_cpus(cpus)
        try:
            configs = plan(cpu_set, quick=quick, repeat=repeat,
                           experiments=list(experiments) or None)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if out is None:
            out = Path("runs") / f"suite-{datetime.datetime.now():%Y%m%d-%H%M%S}"
        _check_out(out)
        if out.exists() and any(out.iterdir()):
            raise click.BadParameter(f"{out} is not empty; choose another --out (or --resume)",
                                     param_hint="--out")
    scx_spec = _scx_plan(scx, scx_args, kernel, [c.params for c in configs])
    if kernel is not None:
        return _suite_in_vm(configs, cpu_set, out, seed, quiet,
                            _vm_runner(kernel, vm_cpus, memory, setting, quiet, scx_spec), resume)
    facts = _host_facts_or_exit(probe)
    limits = cpu_limits(len(cpu_set))
    from harmony.core.osutil import online_cpus

    spare = sorted(set(online_cpus()) - set(cpu_set))
    overlapped = overlap != "never"
    paused = overlap == "auto" and not spare
    if overlap == "always" and not spare:
        limits.append("--overlap always: the analysis of each run shares the experiment's CPUs with "
                      "the next run (at SCHED_IDLE); every run reports it as foreign load.")
    elif paused:
        limits.append("No CPU outside the experiment's set: the runs are analysed between the "
                      "measurements by a process that is stopped while a run is measured, the rest "
                      "after the last capture, so the analysis never runs beside a measurement.")
    for line in limits:
        click.echo(f"note: {line}", err=True)
    runner = KernelRunner(probe, facts, overlap=overlapped, cpus=cpu_set, pause=paused,
                          scx=scx_spec)
    with _errors(marked=f"{out} holds the runs finished so far (`harmony suite --out {out} "
                        "--resume` goes on)", also=(OSError,)):
        record = run_suite(configs, cpu_set, out, runner,
                           facts={k: v for k, v in facts.items() if k != "doctor"},
                           seed=seed, quiet=quiet, card_note=" ".join(limits) or None,
                           resume=resume)
    from harmony.analysis.policy import infer as infer_card

    click.echo(infer_card([out]).text())
    click.echo(f"{record['runs']} runs, {record['wall_s']:.0f} s wall for {record['configured_s']:.0f} s "
               f"configured (efficiency {record['efficiency']:.2f})")
    click.echo(f"report: {out / 'report.md'} and {out / 'report.html'}")
    if record["failures"]:
        _fail(f"{len(record['failures'])} configurations failed; see {out / 'suite.json'}")


def _suite_in_vm(configs, cpu_set, out, seed, quiet, runner, resume: bool = False):
    from harmony.analysis.policy import infer as infer_card
    from harmony.suite import cpu_limits, run_suite

    limits = cpu_limits(len(cpu_set))
    for line in limits:
        click.echo(f"note: {line}", err=True)
    with _errors(marked=f"{out} holds the runs finished so far (`harmony suite --out {out} "
                        "--resume` with the same --kernel and --vm-* options goes on)",
                 also=(OSError,)):
        record = run_suite(configs, cpu_set, out, runner, facts=runner.facts, seed=seed,
                           quiet=quiet, card_note=" ".join(limits) or None, resume=resume)
    click.echo(infer_card([out]).text())
    click.echo(f"{record['runs']} runs in one boot of {runner.kernel.describe()}, "
               f"{record['wall_s']:.0f} s wall for {record['configured_s']:.0f} s configured")
    click.echo(f"report: {out / 'report.md'} and {out / 'report.html'}")
    if record["failures"]:
        _fail(f"{len(record['failures'])} runs or configurations failed; see {out / 'suite.json'}")


@main.group()
def kernel():
    """Kernels under test: the named Debian kernels and the cache (harmony run|suite --kernel)."""


@kernel.command("list")
def kernel_list():
    """The kernels Harmony knows by name, and those in the cache."""
    from harmony.vm import kernels

    click.echo("named kernels (--kernel NAME):")
    for name, (_, what) in kernels.NAMED.items():
        click.echo(f"  {name:16} {what}")
    click.echo("kernels built here (--kernel NAME; harmony kernel build NAME):")
    for name in kernels.BUILT:
        click.echo(f"  {name:16} {kernels.recipe(name)['what']}")
        click.echo(f"  {'':16} {kernels.status(name)}")
    have = kernels.cached()
    click.echo(f"cached in {kernels.cache_dir()}:" if have else
               f"cached: none yet ({kernels.cache_dir()})")
    for k in have:
        how = {"seed": "  (seeded from a reference build)", "build": "  (built here)"}.get(
            k.source.get("from"), "")
        click.echo(f"  {k.spec:16} {k.source.get('package')} {k.source.get('version')}  "
                   f"release {k.release}  {k.image}{how}")


@kernel.command("build")
@click.argument("name")
@click.option("--rebuild", is_flag=True, help="build again even if this configuration is built")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="make's jobs (default: the CPUs)")
def kernel_build(name, rebuild, jobs):
    """Build a kernel from source into the cache (sched-ext: Linux 6.12 with sched_ext and the
    tree's example schedulers; 12-28 min on 2 CPUs), once per configuration. Installs the Debian
    packages the build needs when they are missing (as root)."""
    import time

    from harmony.vm import kernels

    if name not in kernels.BUILT:
        _fail(f"unknown kernel to build {name!r}: give one of {', '.join(kernels.BUILT)}", 2)
    t0 = time.monotonic()
    with _errors():
        k = kernels.build(name, rebuild=rebuild, jobs=jobs,
                          progress=lambda line: click.echo(line, err=True))
    took = k.source.get("build_s")
    click.echo(f"{k.describe()}: release {k.release}, {k.image}"
               + (f"; built in {took / 60:.1f} min" if took and time.monotonic() - t0 > 60
                  else ""))


@kernel.command("fetch")
@click.argument("name")
def kernel_fetch(name):
    """Fetch a named Debian kernel into the cache (the newest version apt knows)."""
    from harmony.vm import kernels

    if name not in kernels.NAMED:
        _fail(f"unknown kernel {name!r}: give one of {kernels.known_names()}", 2)
    with _errors():
        k = kernels.fetch(name, progress=lambda line: click.echo(line, err=True))
    click.echo(f"{k.spec}: {k.source['package']} {k.source['version']}, release {k.release}, "
               f"{k.image}")


@main.group("scx")
def scx_group():
    """sched_ext schedulers under test (harmony run|suite --scx NAME): which, and building the
    scx project's Rust ones."""


@scx_group.command("list")
def scx_list():
    """The schedulers --scx takes by name, and where each is."""
    from harmony.vm import kernels, scx, scx_build

    click.echo("the kernel tree's examples (built with `harmony kernel build sched-ext`):")
    click.echo(f"  {', '.join(scx.KNOWN)}: {kernels.status('sched-ext')}")
    click.echo("the scx project's Rust schedulers (`harmony scx build NAME`):")
    with _errors():
        for name in scx_build.names():
            click.echo(f"  {name:8} {scx_build.status(name)}")
    click.echo("or the path of any sched_ext scheduler's executable")


@scx_group.command("build")
@click.argument("names", nargs=-1)
@click.option("--rebuild", is_flag=True, help="build again even if this configuration is built")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="cargo's jobs (default: the CPUs)")
def scx_build_cmd(names, rebuild, jobs):
    """Build the scx project's Rust schedulers from their crates (all of them without NAMES:
    bpfland, rusty, lavd; 1-3 min each on 2 CPUs, the first with the shared dependencies), once
    per configuration. Needs cargo; installs the Debian packages the build needs when missing
    (as root)."""
    from harmony.vm import scx_build

    with _errors():
        which = list(names) or scx_build.names()
        built = scx_build.build(which, rebuild=rebuild, jobs=jobs,
                                progress=lambda line: click.echo(line, err=True))
    for name, path in built.items():
        click.echo(f"{name}: {path}")


def _signals_do_not_interrupt_the_teardown() -> None:
    """The command is over and its outcome decided (a run written complete stays complete): a
    Ctrl-C, SIGTERM or SIGHUP while the process tears down (the fork server stopped, threads
    joined) is not raised into the middle of it, where it would print a traceback and leave the
    server to its death signal. A second one ends the process at once (status 128 + its number),
    for a teardown that hangs."""
    import os
    import signal

    seen: list[int] = []

    def later(signum, frame):
        if seen:
            os._exit(128 + signum)
        seen.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, later)


def _signals_are_never_swallowed() -> None:
    """Ctrl-C's KeyboardInterrupt or SIGTERM's Interrupted raised while Python runs a finalizer
    (a weakref callback, a ``__del__``: matplotlib's run as a figure is drawn) cannot leave it:
    Python prints "Exception ignored in ..." with a traceback and goes on, and the command would
    run on as if it had never been stopped. Such a signal is sent again (``sys.unraisablehook``)
    10 ms later, from a thread, to be raised where the command is by then: not in the hook, where
    it would be ignored again."""
    import os
    import signal
    import threading

    previous = sys.unraisablehook

    def again(signum: int) -> None:
        timer = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt):
            again(signal.SIGINT)
        elif isinstance(exc, Interrupted):
            again(exc.signal)
        else:
            previous(unraisable)

    sys.unraisablehook = hook


def entry() -> None:
    """The console script: :func:`main`, then a quick exit. Tearing the interpreter down frees a
    suite's few hundred MB of Python objects one by one (0.3-0.5 s measured); the kernel frees
    the process's memory at once. What an orderly exit does first still happens: non-daemon
    threads are joined, atexit handlers run (the fork server's shutdown, temporary files), the
    output is flushed."""
    import atexit
    import os
    import signal
    import threading

    def stopped(signum, frame):     # anywhere a command has not put a handler of its own
        raise Interrupted(f"stopped by {signal.Signals(signum).name}", signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stopped)
    _signals_are_never_swallowed()
    try:
        code = main(standalone_mode=False)      # click's own errors are shown below
        code = code if isinstance(code, int) else 0
    except SystemExit as exc:
        code = exc.code
    except click.ClickException as exc:        # a usage error: click's message, status 2
        exc.show()
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt, Interrupted) as exc:
        # Ctrl-C or SIGTERM where no command caught it (starting up, reading the host...)
        stop = exc if isinstance(exc, Interrupted) else KeyboardInterrupt()
        click.echo(f"harmony: error: {'interrupted' if isinstance(stop, KeyboardInterrupt) else stop}",
                   err=True)
        code = exit_status(stop)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        click.echo(str(code), err=True)
        code = 1
    _signals_do_not_interrupt_the_teardown()
    from harmony.core import jit
    jit.shutdown_pool()
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass   # a closed pipe (harmony ... | head): nothing more can be said
    os._exit(code)


if __name__ == "__main__":
    entry()
