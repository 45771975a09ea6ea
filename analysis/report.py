"""The report of one run: what was measured, how much to trust it, and the figures.

``summary_text(run)`` is what ``harmony report`` prints; ``write_report(run)`` writes report.md and
report.html from one document (:func:`report_document`). All start from the same lines so the
terminal and the files never disagree.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis import document as D
from harmony.analysis.causes import CAUSES
from harmony.analysis.probe_agreement import agreement_lines
from harmony.analysis.thresholds import USELESS_MIGRATION_WITHIN_S, WASTED_EPISODE_MIN_S
from harmony.analysis.topology import DOMAIN_HEADER, df_cpus, domain_rows, domains_of
from harmony.core.osutil import format_cpulist, parse_cpulist
from harmony.core.wording import plural
from harmony.experiments import experiment_of
from harmony.manifest import system_facts
from harmony.store import atomic_write


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.3f} ms"


def release_line(m: dict) -> str:
    """How the tasks were released at t0. An imported trace was not released by Harmony: what it
    holds is when the chosen tasks first woke after t0, which says nothing of a release."""
    rel = m.get("release", {})
    if "imported" in m.get("source", {}):
        return (f"release spread               n/a: no release by Harmony in an imported trace "
                f"(the chosen tasks' first wake-ups after t0 span {_ms(rel.get('wake_spread_ns'))};"
                f" {rel.get('woken', '?')} woken)")
    if rel.get("warm"):
        return (f"release spread               {_ms(rel.get('release_spread_ns'))} (warm: "
                f"{rel.get('woken', '?')} tasks ran confined for {rel['warmed_s']:.3f} s, then the "
                f"CPU set was widened; {m.get('release_method', '?')})")
    return (f"release spread               {_ms(rel.get('release_spread_ns'))} "
            f"(wake-ups {_ms(rel.get('wake_spread_ns'))}; {rel.get('woken', '?')} tasks woken; "
            f"{m.get('release_method', '?')}, {m.get('release_mode') or 'confined'})")


def vm_lines(m: dict) -> list[str]:
    """A run captured in a VM: the kernel under test, the VM, what the host took from the vCPUs."""
    vm = m.get("vm")
    if not vm:
        return []
    src = (vm.get("kernel") or {}).get("source") or {}
    kernel = (f"{src.get('package')} {src.get('version')}" if src.get("kind") == "debian"
              else f"{src.get('package')} {src.get('version')}, "
                   + ("seeded from a reference build" if src.get("from") == "seed"
                      else "built here") if src.get("kind") == "build"
              else src.get("path", "?"))
    host = m.get("host") or {}
    lines = [f"kernel under test            {(vm.get('kernel') or {}).get('spec', '?')} ({kernel})",
             f"VM                           {(vm.get('accelerator') or '?').upper()}, "
             f"{vm.get('vcpus')} vCPUs, {vm.get('memory_mb')} MiB; QEMU {vm.get('qemu')} "
             f"({vm.get('qemu_setting')}), virtme-ng {vm.get('virtme_ng')}; host "
             f"{host.get('kernel', '?')}, {host.get('ncpus', '?')} CPUs"]
    topo = (vm.get("topology") or {}).get("describe")
    if topo:
        lines.append(f"VM topology                  {topo} (-smp {vm['topology'].get('smp')})")
    died = vm.get("died")
    if died:
        rc = died.get("exit_status")
        lines.append("VM died                      " + ("after" if died.get("booted") else "before")
                     + " the guest said its facts" + (f" (exit {rc})" if rc is not None else "")
                     + f": {died.get('why') or '?'}")
    fr = vm.get("vcpu_wait_frac")
    if fr:
        lines.append(f"vCPU wait for host CPUs      {max(fr):.1%} of the window at most (vCPU "
                     f"{vm.get('vcpu_wait_max_vcpu')}; " + " / ".join(f"{f:.0%}" for f in fr)
                     + ")")
    else:
        lines.append("vCPU wait for host CPUs      not measured")
    return lines


def scx_lines(m: dict) -> list[str]:
    """A run under a sched_ext scheduler (harmony.vm.scx): which, its arguments, its state over the
    run."""
    scx = m.get("scx")
    if not scx:
        return []
    args = f", args {' '.join(scx['args'])}" if scx.get("args") else ""
    if scx.get("enabled_throughout"):
        state = (f"enabled throughout (loaded in {scx['enable_s']:.2f} s)"
                 if scx.get("enable_s") is not None else "enabled throughout")
    elif scx.get("ops"):
        state = f"NOT enabled throughout: {scx.get('ejected') or 'ejected'}"
    else:
        state = "never enabled"
    return [f"sched_ext scheduler          {scx.get('name')} (ops {scx.get('ops') or '?'}{args}): "
            f"{state}"]


def class_lines(m: dict) -> list[str]:
    """The tasks' scheduling classes, and the host's real-time bandwidth where they need it."""
    counts = m.get("sched_class_counts") or {}
    lines = ["scheduling class             " + ("; ".join(f"{label} ({plural(n, 'task')})"
                                                          for label, n in counts.items()) or "?")]
    sched = m.get("sched") or {}
    if any(not label.startswith(("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE")) for label in counts) \
            and sched.get("rt_runtime_us") is not None:
        rt = ("off (sched_rt_runtime_us -1)" if sched["rt_runtime_us"] < 0 else
              f"{sched['rt_runtime_us']} of {sched['rt_period_us']} us "
              f"({sched['rt_runtime_us'] / sched['rt_period_us']:.0%} of a CPU)")
        lines.append(f"RT throttling                {rt}; controller at SCHED_FIFO "
                     f"{sched.get('controller_fifo_priority', '?')}")
    return lines


def trust_lines(m: dict) -> list[str]:
    """What the run could and could not see, one fact per line."""
    host = system_facts(m)
    cap = m.get("capture", {})
    ka = m.get("kernel_agreement")
    lost = m.get("lost_events", -1)
    lines = [
        f"status                       {m.get('status')}",
        f"kernel / scheduler           {host.get('kernel', '?')} / {host.get('scheduler', '?')}",
        f"CPU set                      {format_cpulist(m.get('cpus', []))} "
        f"({'guest' if m.get('vm') else 'host'} has {host.get('ncpus', '?')} online)",
        *vm_lines(m),
        *scx_lines(m),
        f"probe / clock                {m.get('probe')} / {cap.get('clock', '?')}",
        f"events decoded               {cap.get('n_events', '?')} "
        f"({cap.get('bytes', '?')} raw bytes)",
        f"lost events                  {'unknown' if lost is None or lost < 0 else lost}",
        release_line(m),
        *class_lines(m),
        f"measured window              {m.get('measured_s', 0):.3f} s after t0",
    ]
    if ka and ka.get("agreement") is not None:
        lines.append(f"kernel agreement (/proc)     {ka['agreeing']}/{ka['sweeps']} sweeps "
                     f"({ka['agreement']:.1%}; sweep {ka['sweep_us_median']:.0f} us)")
    elif ka:
        lines.append("kernel agreement (/proc)     no sweep in the window")
    else:
        lines.append("kernel agreement (/proc)     not sampled")
    nr = m.get("kernel_nr_running_agreement")
    if nr and nr.get("agreement") is not None:
        lines.append(f"kernel agreement (nr_running) {nr['agreeing']}/{nr['clean']} clean samples "
                     f"({nr['agreement']:.1%}; {nr['samples']} taken; window "
                     f"{nr['window_us_median']:.0f} us)")
    elif nr and nr["samples"]:
        lines.append(f"kernel agreement (nr_running) no clean sample of {nr['samples']}")
    elif nr:
        lines.append("kernel agreement (nr_running) no sample in the window")
    lines.append(counters_line(m))
    fl = m.get("foreign_load") or {}
    if fl.get("max_frac") is not None:
        lines.append(f"foreign load                 {fl['max_frac']:.1%} of CPU {fl['max_cpu']} "
                     f"at most (other tasks on the CPU set"
                     f"{'; most: ' + fl['top'] if fl.get('top') else ''})")
        if fl.get("controller_frac_max") is not None:
            probes = {m.get("probe"), m.get("crosscheck_probe")}
            whose = (["perf record"] * ("perf" in probes)
                     + ["probe drains"] * bool(probes - {"perf", None}))
            lines.append(f"controller's own threads     {fl['controller_frac_max']:.1%} of a CPU "
                         f"at most ({', '.join(whose + ['sampler'])})")
    lines.append(f"reconstruction anomalies     {m.get('reconstruction_anomalies', '?')}")
    if m.get("crosscheck_probe"):
        lines += agreement_lines(m.get("probe_agreement")) or [
            f"probe cross-check            {m['crosscheck_probe']} recorded but not compared"]
    return lines


def counters_line(m: dict) -> str:
    """The trace against the workers' own counters (/proc/<pid>/sched), one line."""
    kc, read = m.get("kernel_counter_agreement"), m.get("kernel_counters") or {}
    head = "kernel counters (/proc)      "
    if not kc:
        if (m.get("source") or {}).get("imported"):
            return head + "not read (an imported trace)"
        return head + ("not read: " + read["why_not"] if read.get("why_not") else "not read")
    if not kc["tasks"]:
        return head + "no task read at both ends"
    mig, sw = kc["migrations"], kc["switches"]
    cpu = ("" if kc["cpu_time_ratio"] is None else f"; run time {kc['cpu_time_ratio']:.3f}x "
           f"the kernel's CPU time (task at most {kc['cpu_diff_ms_max']:.1f} ms off)")
    return (head + f"migrations {mig['agreeing']}/{kc['tasks']} tasks agree ({mig['trace']} in the "
            f"trace, {mig['kernel']} counted), switches {sw['agreeing']}/{kc['tasks']} "
            f"({sw['trace']} / {sw['kernel']}){cpu}")


def machine_lines(m: dict, summary: dict | None) -> list[str]:
    """The machine the run measured on (its manifest's topology): its shape, its scheduling
    domains, the moves by level, and the per-level check against /proc/schedstat; [] for a run
    that recorded none (an import, a simulation, an older run)."""
    topo = m.get("topology")
    if not topo:
        return []
    cpus = df_cpus(m)

    def n(col):
        return len(set(cpus[col])) if (cpus[col] >= 0).all() else "?"

    threads = cpus["smt_siblings"].map(lambda s: len(parse_cpulist(s)) if s else 1)
    most = int(threads.max())
    lines = [f"machine                      {len(cpus)} CPUs: {plural(n('node'), 'NUMA node')}, "
             f"{plural(n('package'), 'package')}, {plural(n('llc'), 'LLC')}, "
             f"{len(set(cpus['smt_siblings']))} cores of {plural(most, 'thread')}"]
    rows = domain_rows(m)
    if rows:
        lines.append("domains                      " + " < ".join(
            f"{r[1]} ({r[2]})" for r in rows) + f" (CPU {cpus_of_rows(m)})")
    else:
        why = (topo.get("source") or {}).get("missing") or ["not read"]
        lines.append(f"domains                      not read: {why[0]}")
    levels = (summary or {}).get("migrations_by_level")
    if levels:
        lines.append("moves by level               " + "; ".join(
            f"{k} {sum(v.values())} (" + ", ".join(f"{c} {x}" for c, x in v.items()) + ")"
            for k, v in levels.items()))
    by = (m.get("schedstat_agreement") or {}).get("levels")
    if by:
        lines.append("per level vs /proc/schedstat " + "; ".join(
            f"{k}: " + ", ".join(f"{c} {v['all'][c]}/{v['kernel'][c]}"
                                 for c in ("periodic", "newidle", "active"))
            + ("" if v["within"] else " (disagree)") for k, v in by.items()))
    return lines


def cpus_of_rows(m: dict) -> int:
    """The CPU whose domains :func:`domain_rows` lists."""
    doms = domains_of(m)
    return ([c for c in m.get("cpus", []) if c in doms] or sorted(doms))[0]


def cost_rows(summary: dict) -> list[tuple[str, str]]:
    """What the policy cost, as (label, value) rows for any renderer: the window's migrations by
    cause, the CPU time wasted while work waited (and the longest such intervals), the moves undone
    at once, the distance from the ideal (GPS) allocation. [] for a summary without them (a run
    analysed before they existed)."""
    if "wasted_cpu_s" not in summary:
        return []
    by_cause = [(c, summary.get(f"cause_{c}", 0)) for c in CAUSES]
    total = sum(n for _, n in by_cause)
    rows = [("migrations by cause", ", ".join(f"{c} {n}" for c, n in by_cause if n)
             + f" ({total} in all"
             + (f"; {summary['migrations_inferred']} inferred, recorded by no probe"
                if summary.get("migrations_inferred") else "") + ")"
             if total else "none in the window"),
            ("wasted CPU time", f"{summary['wasted_cpu_s']:.3f} s idle while a task waited "
                                f"elsewhere; {summary['wasted_episodes']} intervals of "
                                f"{WASTED_EPISODE_MIN_S * 1e3:g} ms or more, the longest "
                                f"{summary['wasted_longest_ms']:.1f} ms")]
    for e in (summary.get("wasted_longest") or {}).get("episodes", []):
        rows.append(("  idle while waiting", f"CPU {e['cpu']} at {e['t']:.3f} s for {e['ms']:.1f} "
                                             f"ms, {e['waiting']} waiting elsewhere"))
    rows.append(("useless migrations", f"{summary['useless_migrations']} moved back within "
                                       f"{USELESS_MIGRATION_WITHIN_S * 1e3:g} ms"))
    jain, slow = summary.get("ideal_jain"), summary.get("ideal_slowdown_max")
    rows.append(("ideal allocation (GPS)",
                 f"mean absolute share error {summary['ideal_share_error']:.3f} CPU; Jain "
                 + ("n/a" if jain is None else f"{jain:.3f}") + " on share/ideal; worst slowdown "
                 + ("n/a (a task owed a share got none in a window)" if slow is None
                    else f"{slow:.2f}x")))
    return rows


def prediction_rows(summary: dict) -> list[list[str]]:
    """The run's predicted-vs-measured rows (its summary's ``predictions``,
    :mod:`harmony.analysis.predictions`): check (with its level), verdict, predicted, measured,
    tolerance; [] without any."""
    out = []
    for r in ((summary or {}).get("predictions") or {}).get("rows", []):
        where = " at " + r["level"] + (f" ({r['domain']})" if r.get("domain") else "") \
            if r.get("level") else ""
        verdict = {True: "holds", False: "does not hold", None: "not checkable"}[r.get("holds")]
        out.append([f"{r['check']}{where}", verdict, r["predicted"], r["measured"],
                    r["tolerance"]])
    return out


def params_line(m: dict) -> str:
    """The run's parameters, ``k=v, ...``; an imported run's then name those its trace's layout
    at t0 showed, and those its trace cannot tell (how the tasks were started and released),
    which it does not list."""
    source = m.get("source") or {}
    unknown, shown = source.get("params_not_known") or [], source.get("params_from_layout") or []
    said = ([f"read from the trace's layout at t0: {', '.join(shown)}"] if shown else []) + (
        [f"not known from the trace: {', '.join(unknown)}"] if unknown else [])
    return ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in m.get("params", {}).items()) + (
        f" ({'; '.join(said)})" if said else "")


def summary_text(run) -> str:
    m = run.manifest
    exp = experiment_of(run)
    out = [f"{exp.name}: {exp.question}", f"run {run.path}", f"parameters: {params_line(m)}", ""]
    out += exp.describe(run.summary) if run.complete else ["(run is not complete: no metrics)"]
    cost = cost_rows(run.summary) if run.complete else []
    if cost:
        out += ["", "what the policy cost"] + [f"  {k:<27}{v}" for k, v in cost]
    machine = machine_lines(m, run.summary if run.complete else None)
    if machine:
        out += ["", "the machine"] + ["  " + line for line in machine]
    predicted = prediction_rows(run.summary) if run.complete else []
    if predicted:
        out += ["", "predicted from the kernel's domains, and measured"]
        for r in predicted:
            out += [f"  {r[0]}: {r[1]}", f"    predicted: {r[2]}", f"    measured:  {r[3]}"]
    out += ["", "measurement"] + ["  " + line for line in trust_lines(m)]
    notes = m.get("notes", [])
    out += ["", "notes"] + ([f"  - {n}" for n in notes] if notes
                            else ["  - none: nothing was lost or repaired"])
    drawn, missing = figures_on_disk(run)
    out += ["", "figures"] + [f"  {run.path / f}" for f in drawn]
    if m.get("figures_deferred"):
        out.append(f"  not drawn yet: `harmony report {run.path}` draws them")
    if missing:
        out.append(f"  missing: {', '.join(missing)} "
                   f"(`harmony report {run.path}` draws them again)")
    return "\n".join(out)


def figures_on_disk(run) -> tuple[list[str], list[str]]:
    """(the run's figures that are on disk, those its manifest lists but are not): a report names
    only figures that exist."""
    listed = run.manifest.get("figures", [])
    drawn = [f for f in listed if (run.path / f).is_file()]
    return drawn, [f for f in listed if f not in drawn]


def report_document(run, figures: list | None = None) -> list:
    """report.md's and report.html's content (:mod:`harmony.analysis.document`): the results and
    the measurement as "label  value" lines, the notes, the figures (``figures``: these paths,
    by default the run's own on disk)."""
    m = run.manifest
    exp = experiment_of(run)
    doc: list = [D.Heading(f"{exp.name}: {exp.question}", 1),
                 D.Para(f"Thesis: {exp.thesis}. Run started {m.get('started_at')}, Harmony "
                        f"{m.get('harmony_version')}."),
                 D.Para(f"Parameters: `{params_line(m)}`"),
                 D.Heading("Results", 2, "results"), D.Facts(exp.describe(run.summary))]
    cost = cost_rows(run.summary)
    if cost:
        doc += [D.Heading("What the policy cost", 2, "cost"),
                D.Table(["what", "measured"], [[k.strip(), v] for k, v in cost])]
    machine = machine_lines(m, run.summary)
    if machine:
        doc += [D.Heading("The machine", 2, "machine"), D.Facts(machine)]
        rows = domain_rows(m)
        if rows:
            doc.append(D.Table(DOMAIN_HEADER, rows, caption=f"the scheduling domains of CPU "
                                                            f"{cpus_of_rows(m)}, lowest first"))
    predicted = prediction_rows(run.summary)
    if predicted:
        doc += [D.Heading("Predicted from the kernel's domains, and measured", 2, "predictions"),
                D.Table(["check", "verdict", "predicted", "measured", "tolerance"], predicted)]
    doc += [D.Heading("Measurement", 2, "measurement"), D.Facts(trust_lines(m))]
    notes = m.get("notes", [])
    doc += [D.Heading("Notes", 2, "notes"),
            D.Bullets(notes if notes else ["nothing was lost or repaired"]),
            D.Heading("Figures", 2, "figures")]
    drawn, missing = figures_on_disk(run)
    if figures is not None:
        drawn, missing = [], []
        doc += [D.Figure(Path(f), Path(f).name) for f in figures]
    doc += [D.Figure(run.path / f, f) for f in drawn]
    if figures is None and m.get("figures_deferred"):
        doc.append(D.Para(f"Not drawn yet: `harmony report {run.path}` draws them."))
    if missing:
        doc.append(D.Para(f"Missing: {', '.join(missing)} (`harmony report` draws them again)."))
    return doc


def write_report(run, dest=None, figures: list | None = None) -> None:
    """Write report.md and report.html (the same content, figures embedded) beside the figures;
    ``dest``: in that directory instead of the run's (``figures``: the paths to show, by default
    the run's own)."""
    dest = Path(dest) if dest is not None else run.path
    doc = report_document(run, figures)
    atomic_write(dest / "report.md", D.to_markdown(doc, dest))
    exp = run.manifest["experiment"]
    atomic_write(dest / "report.html", D.to_html(doc, f"Harmony run: {exp} ({run.path.name})"))
