"""Commands that measure: ``run`` (one experiment, or its repetitions), ``suite`` (the whole
catalog) and ``list`` (the catalog), on this host or on a kernel under test in a VM.

The kernel and scheduler under test are checked by :mod:`harmony.vm.plan`; the runs are made by
:mod:`harmony.run`, :mod:`harmony.batch` and :mod:`harmony.suite` with a runner of
:mod:`harmony.runners` or :mod:`harmony.vm.runner`.
"""

from __future__ import annotations

from pathlib import Path

import click

from harmony.cli.common import (
    build_kernels_first,
    check_out,
    check_release_options,
    decide_cap,
    decide_options,
    default_out,
    exit_on_error,
    fail,
    json_option,
    left_behind,
    note,
    parse_params,
    plural,
    print_json,
    quiet_option,
    resolve_cpus,
)
from harmony.cli.screens import Shown
from harmony.core import osutil

#: how ``harmony run EXP --help`` names a parameter's kind (click's words for its own options)
PARAM_METAVARS = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "list": "INTEGER,...",
                  "flist": "FLOAT,..."}


def write_params(formatter: click.HelpFormatter, exp, ncpus: int) -> None:
    """The section of ``exp``'s parameters (its own, then those every experiment has): name, kind,
    help and the default on ``ncpus`` CPUs, for ``harmony run EXP --help`` and
    ``harmony list -v``."""
    own = {p.name for p in exp.params}
    params = list(exp.params) + [p for p in exp.all_params() if p.name not in own]
    rows = [(f"{p.name} {PARAM_METAVARS[p.kind]}",
             f"{p.help}  [default: {p.format(p.default_for(ncpus))}"
             + (f" with P = {ncpus}]" if p.scales else "]")) for p in params]
    with formatter.section(f"Parameters of {exp.name} (-p KEY=VALUE)"):
        if any(p.scales for p in params):
            formatter.write_text("A default that depends on the CPU count P is given for "
                                 f"P = {ncpus}, this host's online CPUs (--cpus sets P).")
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
        name = opts.get("experiment") or opts.get("experiment_option")
        ctx.meta["harmony.run.experiment"] = name if isinstance(name, str) else None
        helps = self.get_help_option(ctx)     # its name is click's (8.5: not "help")
        if helps is not None and opts.get(helps.name) and isinstance(name, str):
            from harmony.experiments import get_experiment  # as in format_options

            try:
                get_experiment(name)
            except ValueError as exc:   # the error `harmony run NAME` gives
                raise click.BadParameter(str(exc), ctx=ctx, param_hint="EXPERIMENT") from None
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter):
        # imported when help is asked for, as every command imports what it uses when it runs
        from harmony.experiments import CATALOG, get_experiment

        super().format_options(ctx, formatter)
        name = ctx.meta.get("harmony.run.experiment")
        if name is not None:
            write_params(formatter, get_experiment(name), len(osutil.online_cpus()))
            return
        with formatter.section("Experiments (harmony run EXPERIMENT --help lists its parameters)"):
            formatter.write_dl([(n, get_experiment(n).question) for n in CATALOG])


@click.command("list")
@click.option("--verbose", "-v", is_flag=True,
              help="also each experiment's parameters, with their defaults on this host")
@json_option("the catalog (each experiment's question, section and parameters, their "
             "defaults on this host's CPUs)")
def list_experiments(verbose, as_json):
    """The experiment catalog: name, question, thesis section (-v: and its parameters)."""
    from harmony.experiments import CATALOG, get_experiment

    ncpus = len(osutil.online_cpus()) if verbose or as_json else 0
    if as_json:
        print_json([{"name": name, "question": exp.question, "thesis": exp.thesis,
                     "params": [{"name": p.name, "kind": p.kind, "help": p.help,
                                 "default": p.default_for(ncpus), "scales": p.scales}
                                for p in exp.all_params()]}
                    for name, exp in ((n, get_experiment(n)) for n in CATALOG)])
        return
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
    """--kernel, --vm-cpus, --vm-topology, --vm-memory, --vm-qemu: a kernel under test in a
    virtual machine."""
    f = click.option("--vm-qemu", metavar="SETTING",
                     help="QEMU set-up: accel=auto|kvm|tcg, tcg=auto|multi|single|icount, "
                          "nice=-20..19 (the vCPU threads'), pin=off|on|CPUS (comma-separated; "
                          "default from HARMONY_VM_QEMU, else accel=auto,tcg=auto,nice=-20,pin=off:"
                          " tcg=auto is multi where the host has more CPUs than the VM has "
                          "vCPUs, else single)")(f)
    f = click.option("--vm-memory", metavar="SIZE", default="2G", show_default=True,
                     help="the VM's memory (e.g. 2G, 1536M)")(f)
    f = click.option("--vm-topology", metavar="SPEC",
                     help="the VM's shape: a preset (smt, 2llc, 2socket, 2node, 2node-smt, "
                          "2node-2llc-smt) or sockets=S,cores=C,threads=T[,dies=D]"
                          "[,numa=per-socket|per-die|N][,llc=socket|die][,distance=D]"
                          "[,cpu=MODEL] (docs/topology.md); refused before any run if the "
                          "guest does not get it")(f)
    f = click.option("--vm-cpus", type=click.IntRange(min=1, max=64), default=None,
                     help="vCPUs of the VM (its CPU set is all of them) [default: 4, or the "
                          "--vm-topology's]")(f)
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


def _vm_runner(kernel: str, vm, quiet: bool, scx=None, overlap: str = "auto"):
    """Fetch the kernel (if named and not cached) and make the VM runner; ``overlap`` as
    ``harmony suite --overlap`` (never: the analysis after the VM; auto: between the guest's
    measurements; always: during them too)."""
    from harmony import doctor as host
    from harmony.vm.kernels import kernel as get_kernel
    from harmony.vm.plan import check_kernel_cpus, check_kernel_topology
    from harmony.vm.runner import VmRunner

    say = (lambda line: None) if quiet else (lambda line: click.echo(f"vm: {line}", err=True))
    with exit_on_error():
        k = get_kernel(kernel, progress=say)
        check_kernel_cpus(k, len(vm.cpus))
        check_kernel_topology(k, vm.topology)
    if k.source.get("note"):          # an older build than the source: which one (manifest too)
        note(k.source["note"])
    facts = host.run_facts(host.doctor(mount=False, test_record=False))
    return VmRunner(k, len(vm.cpus), vm.memory_mb, vm.setting, facts=facts, say=say, scx=scx,
                    topology=vm.topology, overlap=overlap != "never", pause=overlap != "always")


@click.command(cls=RunCommand)
@click.argument("experiment", required=False)
@click.option("--experiment", "-e", "experiment_option", metavar="NAME",
              help="the experiment, as every command names it (or give it first: run NAME)")
@click.option("--cpus", help="experiment CPU set, e.g. 0-3 (default: all online CPUs)")
@click.option("--layout", help="tasks per CPU of the set at t0, e.g. 8,0")
@click.option("--duration", type=float, help="seconds measured after t0")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE",
              help="experiment parameter")
@click.option("--probe", default="tracefs", show_default=True,
              help="capture backend: tracefs, perf or pyperf (perf_event through python-perf)")
@click.option("--crosscheck", metavar="PROBE",
              help="also record the run with this second probe (e.g. perf) and compare the two")
@click.option("--out", type=click.Path(path_type=Path),
              help="run directory (default runs/<experiment>-<time>)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the workload's randomness")
@quiet_option
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="runs of this configuration: OUT/rep-NN/ and OUT/batch.json with median, IQR, "
                   "95% CI")
@json_option("the run's manifest facts and metrics (with --repeat: the batch's record)",
             as_report=True)
@click.option("--verbose", "-v", is_flag=True,
              help="every parameter, measurement fact and note (with --repeat: every metric)")
@decide_options
@vm_options
@scx_options
def run(experiment, experiment_option, cpus, layout, duration, params, probe, crosscheck, out,
        seed, quiet, repeat, as_json, verbose, until_decided, max_repeat, kernel, vm_cpus,
        vm_topology, vm_memory, vm_qemu, scx, scx_args):
    """Run one experiment (EXPERIMENT, or --experiment NAME) and analyse it; prints the key
    numbers, the answers and where the files are."""
    from harmony.experiments import get_experiment
    from harmony.probes import PROBES
    from harmony.vm.plan import plan_scx, plan_vm

    # Everything is checked before anything starts.
    if experiment and experiment_option and experiment != experiment_option:
        raise click.UsageError(f"two experiments given: {experiment} and --experiment "
                               f"{experiment_option}")
    experiment = experiment or experiment_option
    if not experiment:
        raise click.UsageError("name the experiment: harmony run EXPERIMENT (or --experiment "
                               "NAME); harmony list shows the catalog")
    shown = Shown(as_json, verbose)
    check_release_options()
    try:
        exp = get_experiment(experiment)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="EXPERIMENT") from None
    if kernel is None and vm_topology is not None:
        raise click.UsageError("--vm-topology is a VM's shape: it goes with --kernel")
    if kernel is not None:
        with exit_on_error():
            vm = plan_vm(kernel, vm_cpus, vm_memory, vm_qemu, cpus, probe, crosscheck,
                         vm_topology)
        cpu_set = vm.cpus
    else:
        cpu_set = resolve_cpus(cpus)
    overrides = parse_params(params)
    if layout is not None:
        overrides["layout"] = layout
    if duration is not None:
        overrides["duration"] = str(duration)
    try:
        cpu_set = _placed(overrides, cpu_set, kernel, vm if kernel is not None else None)
        values = exp.resolve(overrides, cpu_set)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if probe not in PROBES:
        raise click.BadParameter(f"unknown probe {probe!r} (choose {', '.join(PROBES)})",
                                 param_hint="--probe")
    if crosscheck is not None and (crosscheck not in PROBES or crosscheck == probe):
        raise click.BadParameter(f"{crosscheck!r} is not another probe than --probe {probe} "
                                 f"(choose from {', '.join(PROBES)})", param_hint="--crosscheck")
    if out is None:
        out = default_out(experiment)
    check_out(out)
    if (out / "manifest.json").exists():
        raise click.BadParameter(f"{out} already holds a run; choose another --out",
                                 param_hint="--out")
    cap = decide_cap(until_decided, max_repeat, repeat)
    if cap is not None and crosscheck:
        raise click.UsageError("--crosscheck records one run; use it without --until-decided")
    with exit_on_error():
        scx_spec = plan_scx(scx, scx_args, kernel, [values])
    build_kernels_first()      # before the first run: its analysis needs them
    if kernel is not None:
        return _run_in_vm(exp, values, cpu_set, out, seed, quiet, repeat,
                          _vm_runner(kernel, vm, quiet, scx_spec), cap, shown)
    facts = _host_facts_or_exit(probe, crosscheck)
    if crosscheck:
        from harmony.probes import get_probe
        ok, why = get_probe(crosscheck).available()
        if not ok:
            fail(f"probe {crosscheck} cannot record here: {why} (see `harmony doctor`)")
    if repeat > 1 or cap is not None:
        if crosscheck:
            raise click.UsageError("--crosscheck records one run; use it without --repeat")
        return _repeat_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, repeat,
                                  scx_spec, cap, shown)
    _run_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, crosscheck, scx_spec,
                    shown)


def _host_topology() -> dict:
    """This host's topology (the contract's, harmony.probes.domains): what places experiments
    at its levels and plans a suite's questions of distance."""
    from harmony.probes import domains

    return domains.read()


def _guest_topology(kernel: str, vm) -> dict | None:
    """The topology a guest of shape ``vm.topology`` (--vm-topology) will have, by topology.c's
    rules (harmony.analysis.machines), to place runs and plan a suite before it boots: the
    guest agent refuses the boot if its kernel built other domains. None without a shape."""
    from harmony.analysis.machines import machine_topology

    spec = vm.topology.machine_spec("6.1" if kernel.endswith(":6.1") else "6.12") \
        if vm.topology is not None else None
    return machine_topology(spec) if spec else None


def _placed(overrides: dict, cpu_set: list[int], kernel, vm=None) -> list[int]:
    """The run's CPU set for ``-p level=...`` (harmony.experiments.placement): the pair at that
    level of this host's topology, or of the guest's shape (--vm-topology) with ``kernel``;
    ``cpu_set`` without a level. ValueError (one line) for a machine without such a pair, or a
    VM without a shape."""
    from harmony.experiments.placement import placed_cpus

    level = overrides.get("level") or ""
    if not level:
        return cpu_set
    if kernel is None:
        return placed_cpus(level, cpu_set, _host_topology())
    topology = _guest_topology(kernel, vm)
    if topology is None:
        raise ValueError(f"level={level} in a VM needs the guest's shape before it boots: give "
                         "it --vm-topology (a preset, or nodes one per socket or per die)")
    return placed_cpus(level, cpu_set, topology)


def _repeat_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, repeat, scx=None,
                       cap=None, shown=None):
    from harmony.batch import finish_batch
    from harmony.decide import batch_until_decided
    from harmony.runners import KernelRunner
    from harmony.suite import Progress

    progress = Progress(repeat, repeat * values["duration"], quiet=quiet)
    try:
        with exit_on_error(marked=f"the current run under {out} is marked incomplete",
                           also=(OSError,)):
            with KernelRunner(probe, facts, overlap=False, cpus=cpu_set, scx=scx) as runner:
                batch_until_decided(exp, values, cpu_set, out, repeat, runner, seed, cap,
                                    progress)
    finally:
        progress.close()
    (shown or Shown(False, False)).batch(finish_batch(out), out)


def _run_in_vm(exp, values, cpu_set, out, seed, quiet, repeat, runner, cap=None, shown=None):
    """One boot of the kernel under test for the run (or its repetitions; with ``cap``, a round
    more for each that --until-decided adds); analysed on the host."""
    from harmony.batch import finish_batch
    from harmony.decide import batch_until_decided
    from harmony.store import open_run

    shown = shown or Shown(False, False)
    batch = repeat > 1 or cap is not None
    with exit_on_error(marked=f"what {out} holds that was not captured is marked incomplete"):
        with runner:
            if batch:
                drained = batch_until_decided(exp, values, cpu_set, out, repeat, runner, seed,
                                              cap)
            else:
                runner.capture(exp, values, cpu_set, out, seed, figures=True)
        results = {r["path"]: r for r in (drained if batch else []) + runner.results}
        failed = [r for r in results.values() if r["status"] != "ok"]
        if failed:
            fail(f"{failed[0]['path']}: {failed[0]['error']}")
        if batch:
            shown.batch(finish_batch(out), out)
        else:
            shown.run(open_run(out))


def _host_facts_or_exit(probe: str, crosscheck: str | None = None) -> dict:
    from harmony import doctor as host
    from harmony.probes import get_probe

    ok, why = get_probe(probe).available()
    if not ok:
        fail(f"probe {probe} cannot record here: {why} (see `harmony doctor`)")
    # a 10 ms test recording with perf costs ~0.3 s (pyperf's test ~0.1 s): only when it records
    facts = host.doctor(mount=True, test_record=bool({probe, crosscheck} & {"perf", "pyperf"}))
    return host.run_facts(facts)


def _run_and_report(exp, values, cpu_set, out, probe, seed, facts, quiet, crosscheck=None,
                    scx=None, shown=None):
    from harmony.run import execute

    with exit_on_error(marked=lambda: left_behind(out), also=(OSError,)):
        result = execute(exp, values, cpu_set, out, probe, seed, facts, quiet,
                         crosscheck=crosscheck, scx=scx)
    (shown or Shown(False, False)).run(result)


@click.command()
@click.option("--quick", is_flag=True, help="short runs, two points per sweep, 2 repetitions")
@click.option("--cpus", help="experiment CPU set, e.g. 0-3 (default: all online CPUs)")
@click.option("--out", type=click.Path(path_type=Path),
              help="suite directory (default runs/suite-<time>)")
@click.option("--repeat", type=click.IntRange(min=1),
              help="runs per configuration (default 5, quick 2)")
@click.option("--experiment", "-e", "experiments", multiple=True, metavar="NAME",
              help="only these experiments (repeatable)")
@click.option("--probe", default="tracefs", show_default=True, help="capture backend")
@click.option("--overlap", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True,
              help="analyse each run while the next is captured; auto: on CPUs outside the "
                   "experiment's set, or without any, between the measurements only (the "
                   "analyser is stopped while a run is measured); always: also during them")
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
@click.option("--resume", is_flag=True,
              help="continue the interrupted suite in --out: its plan, CPU set and seed; complete "
                   "runs kept, captured ones analysed, interrupted ones moved aside and run again "
                   "(a suite in a VM: give its --kernel and --vm-* options again); a suite "
                   "asked --until-decided goes on adding runs with its --max-repeat")
@json_option("the policy card", as_report=True)
@click.option("--verbose", "-v", is_flag=True,
              help="the card's every number, threshold and run not used")
@decide_options
@vm_options
@scx_options
def suite(quick, cpus, out, repeat, experiments, probe, overlap, seed, quiet, resume, as_json,
          verbose, until_decided, max_repeat, kernel, vm_cpus, vm_topology, vm_memory, vm_qemu,
          scx,
          scx_args):
    """Run the whole catalog with repetitions and write one report (policy card first).

    With --kernel, the whole plan runs in one boot of that kernel in a VM with --vm-cpus vCPUs,
    and is analysed on the host as --overlap says: auto, between the guest's measurements (the
    analyser stopped while the guest measures), the rest after the VM exits."""
    from harmony.runners import KernelRunner
    from harmony.store import missing_dir
    from harmony.suite import cpu_limits, plan, resume_plan, run_suite
    from harmony.vm.plan import plan_scx, plan_vm

    check_release_options()
    if kernel is None and vm_topology is not None:
        raise click.UsageError("--vm-topology is a VM's shape: it goes with --kernel")
    if kernel is not None:
        with exit_on_error():
            vm = plan_vm(kernel, vm_cpus, vm_memory, vm_qemu, cpus, probe,
                         vm_topology=vm_topology)
    if resume:
        given = [o for o, v in (("--quick", quick), ("--cpus", cpus), ("--repeat", repeat),
                                ("--experiment", experiments), ("--seed", seed)) if v]
        if out is None or given:
            raise click.UsageError("--resume takes the plan, CPU set and seed of the suite in "
                                   "--out: give --out DIR and none of " + ", ".join(
                                       given or ["--quick, --cpus, --repeat, --experiment, "
                                                 "--seed"]))
        with exit_on_error(also=(OSError,)):
            if not out.is_dir():
                raise missing_dir(out)
            configs, cpu_set, before = resume_plan(out)
        seed = before.get("seed", 0)
        if kernel is not None and cpu_set != vm.cpus:
            raise click.UsageError(f"the suite in {out} ran on {len(cpu_set)} CPUs: resume it "
                                   f"with --vm-cpus {len(cpu_set)}")
        if kernel is None:
            resolve_cpus(",".join(map(str, cpu_set)))       # still online
    else:
        cpu_set = vm.cpus if kernel is not None else resolve_cpus(cpus)
        try:
            configs = plan(cpu_set, quick=quick, repeat=repeat,
                           experiments=list(experiments) or None,
                           topology=(_guest_topology(kernel, vm) if kernel is not None
                                     else _host_topology()))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if out is None:
            out = default_out("suite")
        check_out(out)
        if out.exists() and any(out.iterdir()):
            raise click.BadParameter(f"{out} is not empty; choose another --out (or --resume)",
                                     param_hint="--out")
    # a resumed suite goes on as it was asked (its cap), unless told otherwise
    earlier = (before.get("until_decided") or {}).get("max_repeat") if resume else None
    cap = decide_cap(until_decided or bool(earlier), max_repeat or earlier,
                     max(c.repeat for c in configs))
    with exit_on_error():
        scx_spec = plan_scx(scx, scx_args, kernel, [c.params for c in configs])
    build_kernels_first()      # before the first run: its analysis needs them
    shown = Shown(as_json, verbose)
    if kernel is not None:
        return _suite_in_vm(configs, cpu_set, out, seed, quiet,
                            _vm_runner(kernel, vm, quiet, scx_spec, overlap), resume, cap,
                            shown)
    facts = _host_facts_or_exit(probe)
    limits = cpu_limits(len(cpu_set))
    spare = sorted(set(osutil.online_cpus()) - set(cpu_set))
    overlapped = overlap != "never"
    paused = overlap == "auto" and not spare
    if overlap == "always" and not spare:
        limits.append("--overlap always: the analysis of each run shares the experiment's CPUs "
                      "with the next run (at SCHED_IDLE); every run reports it as foreign load.")
    elif paused:
        limits.append("No CPU outside the experiment's set: the runs are analysed between the "
                      "measurements by a process that is stopped while a run is measured, the rest "
                      "after the last capture, so the analysis never runs beside a measurement.")
    for line in limits:
        note(line)
    runner = KernelRunner(probe, facts, overlap=overlapped, cpus=cpu_set, pause=paused,
                          scx=scx_spec)
    with exit_on_error(marked=f"{out} holds the runs finished so far (`harmony suite --out {out} "
                        "--resume` goes on)", also=(OSError,)):
        record = run_suite(configs, cpu_set, out, runner,
                           facts={k: v for k, v in facts.items() if k != "doctor"},
                           seed=seed, quiet=quiet, card_note=" ".join(limits) or None,
                           resume=resume, until_decided=cap)
    shown.suite(out, f"{plural(record['runs'], 'run')}, {record['wall_s']:.0f} s wall for "
                     f"{record['configured_s']:.0f} s configured (efficiency "
                     f"{record['efficiency']:.2f})", record)
    if record["failures"]:
        fail(f"{plural(len(record['failures']), 'configuration')} failed; see "
             f"{out / 'suite.json'}")


def _suite_in_vm(configs, cpu_set, out, seed, quiet, runner, resume: bool = False, cap=None,
                 shown=None):
    from harmony.suite import cpu_limits, run_suite

    limits = cpu_limits(len(cpu_set))
    for line in limits:
        note(line)
    with exit_on_error(marked=f"{out} holds the runs finished so far (`harmony suite --out {out} "
                        "--resume` with the same --kernel and --vm-* options goes on)",
                 also=(OSError,)):
        record = run_suite(configs, cpu_set, out, runner, facts=runner.facts, seed=seed,
                           quiet=quiet, card_note=" ".join(limits) or None, resume=resume,
                           until_decided=cap)
    rounds = (record.get("until_decided") or {}).get("rounds") or 0
    boots = "one boot" if not rounds else f"{1 + rounds} rounds of runs (flushes)"
    (shown or Shown(False, False)).suite(
        out, f"{plural(record['runs'], 'run')} in {boots} of {runner.kernel.describe()}, "
             f"{record['wall_s']:.0f} s wall for {record['configured_s']:.0f} s configured",
        record)
    if record["failures"]:
        fail(f"{plural(len(record['failures']), 'run or configuration', 'runs or configurations')}"
             f" failed; see {out / 'suite.json'}")
