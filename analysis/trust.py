"""What a run could not see, as data: each check gives notes (a kind and its facts), worded here.

A note is a dict ``{"kind": KIND, **facts}``, JSON as the manifest stores it (``trust_notes``);
:func:`word` turns one into the sentence the report prints (the manifest's ``notes`` hold those
sentences, in the same order). Every sentence about trust is written in this module and nowhere
else, whatever the origin of the capture (recorded here, imported, simulated).

Kinds and their facts:

=======================  ==========================================================================
kind                     facts
=======================  ==========================================================================
recorder                 text: what the probe or trace reader said of its own recording, in its
                         words (pages after lost events, lines perf script could not parse...)
controller               text: what the workload controller had to work around (release method,
                         fork server...)
silent_contexts          probe, contexts (list of {comm, pid, cpu, runs}): tasks seen running in
                         whose context the probe recorded no event
unrecorded_migrations    probe, n, tasks, examples: moves the tasks' own events prove, with no
                         sched_migrate_task
lost_events              lost (int, -1 unknown), by_cpu, origin
window_late              asked_s, measured_s
not_woken                pids, warm (a warm release: never woken at the warm-up)
woke_off_initial_cpu     pids, warm (a warm release: not on it at t0)
rt_throttling            tasks (real-time tasks), runtime_us, period_us (-1: no throttling)
warmup_short             warmed_s, residual (PELT's unconverged fraction at t0)
release_not_modelled     release (the one asked: warm)
anomalies                n, kinds ({kind: count}), lost, silent (comms the probe is blind in),
                         ties (events stamped with another CPU's event's time: analysis.ties)
clock_ties               pairs, groups, events, reordered, clock: events of two CPUs stamped
                         with one time, and the groups put in the scheduler's order
workers_dead             (none)
foreign_load             frac, cpu, top, origin
vcpu_starved             frac, vcpu, setting, accelerator: a VM's vCPU waited for a host CPU
virtual_clock            setting: a VM run under -icount, a set-up measured unfaithful
counters_disagree        disagreeing, tasks, migrations {trace, kernel}, switches {trace, kernel},
                         lost
sampler_silent           due (sweeps due)
sampler_slow             sweeps, due, hz, sweep_us, budget
proc_agreement_low       agreement, sweeps, sweep_us
nr_running_agreement_low agreement, clean
nr_running_unclean       (none)
crosscheck_failed        probe, error
probes_disagree          a, b, verdict, migrations {only_a, only_b}, runs {only_a, only_b}
imported_from            path, what, host
events_absent            absent (list of the sched events Harmony reads that the trace lacks)
wakeups_derived          derived, placed, pulls, after_switch_out
t0_default               (none)
end_default              (none)
cpus_default             cpus (a CPU list: every CPU the file recorded)
cpus_without_events      cpus
realtime_tasks           pids
tasks_outside_cpu_set    what (the description: pids, CPUs, t0)
demand_unknown           (none)
tables_rebuilt           tables ({table: why}): a complete run's tables found missing or
                         unreadable, rebuilt from its raw capture
causes_unknown           n, of (migrations in the window), softirq (whether the scheduler's
                         softirq was recorded), inferred: migrations whose cause the events do
                         not decide (harmony.analysis.causes)
causes_checked           wakeups, other_moves (per-task counts: counted, agreeing, kernel, trace,
                         of kernel_counter_agreement; None where not counted), domains (the
                         schedstat_agreement: kernel, all, unsure, unknown, within; None where
                         not counted), agree: the causes against the kernel's own counters
causes_unchecked         why: the kernel counts no scheduler statistics, so the causes were not
                         checked against its counts
scx_not_enabled          name, ops, states ([s, state] at each change), ejected (the reason, or
                         None): a sched_ext scheduler under test not enabled throughout the run
=======================  ==========================================================================

``origin`` is "recorded" (a Harmony run on this host), "imported" (a trace recorded elsewhere) or
"simulated" (a reference policy, :mod:`harmony.analysis.refpolicy`).
"""

from __future__ import annotations

from harmony.analysis import thresholds as T
from harmony.core.wording import plural
from harmony.probes.proc_stat import SWEEP_BUDGET
from harmony.workload.tasks import POLICIES

#: PELT's half-life, s (32 periods of 1024 us): how far a warm-up let a task's load converge
PELT_HALF_LIFE_S = 32 * 1024e-6
#: a warm-up that leaves more than this of PELT's load unconverged at t0 gets a note
WARMUP_RESIDUAL_MAX = 0.01

#: below this share of the sweeps asked, the notes say how many the kernel sampler made
SLOW_SAMPLER = 0.5


def note(kind: str, **facts) -> dict:
    """A note of ``kind`` (see the module docstring) with its facts."""
    if kind not in _WORDING:
        raise ValueError(f"unknown note kind {kind!r}")
    return {"kind": kind, **facts}


def word(n: dict) -> str:
    """The sentence of one note."""
    return _WORDING[n["kind"]](n)


def words(notes: list[dict]) -> list[str]:
    return [word(n) for n in notes]


#: kinds of note that say what a run is or how it was made, not that its measurement is in
#: doubt: a screen may leave them to the full report (``harmony report -v``)
DESCRIPTIVE = frozenset({"controller", "imported_from", "release_not_modelled", "causes_checked",
                         "causes_unchecked", "sampler_slow"})


def is_doubt(n: dict) -> bool:
    """Whether the note ``n`` lessens trust in the run (every kind but :data:`DESCRIPTIVE`)."""
    return n.get("kind") not in DESCRIPTIVE


# --- the checks: facts in, notes out ----------------------------------------------------------

def blind_spot_notes(probe: str | None, silent: list[dict], moves: dict) -> list[dict]:
    """What a probe's own stream proves it did not record (analysis.crosscheck.silent_contexts,
    unrecorded_migrations)."""
    probe = probe or "the probe"
    out = []
    if silent:
        out.append(note("silent_contexts", probe=probe, contexts=silent))
    if moves["n"]:
        out.append(note("unrecorded_migrations", probe=probe, n=moves["n"],
                        tasks=len(moves["pids"]), examples=moves["examples"][:2]))
    return out


def check_notes(m: dict, origin: str) -> list[dict]:
    """The notes of the checks every analysed capture goes through, from the facts the pipeline
    put in the manifest ``m`` (lost_events, measured_s, release, reconstruction anomalies,
    foreign_load, kernel_counter_agreement, kernel_agreement, kernel_nr_running_agreement)."""
    out = []
    cap = m.get("capture") or {}
    lost = m.get("lost_events", -1)
    if lost != 0:
        out.append(note("lost_events", lost=lost, by_cpu=cap.get("lost_by_cpu"), origin=origin))
    params = m.get("params", {})
    asked, got = params.get("duration"), m.get("measured_s")
    if asked and got and got - asked > max(0.05, 0.05 * asked):
        out.append(note("window_late", asked_s=asked, measured_s=got))
    rel = m["release"]
    warm = bool(rel.get("warm"))
    if rel["not_woken"]:
        out.append(note("not_woken", pids=rel["not_woken"], warm=warm))
    if rel.get("woke_off_initial_cpu"):
        out.append(note("woke_off_initial_cpu", pids=rel["woke_off_initial_cpu"], warm=warm))
    out += class_notes(m, origin)
    ties = cap.get("clock_ties") or {}
    if ties.get("reordered"):
        out.append(note("clock_ties", **ties, clock=cap.get("clock")))
    if m["reconstruction_anomalies"]:
        # a program's threads share its comm: name each program once
        silent = list(dict.fromkeys(c["comm"] for c in cap.get("silent_contexts") or []))
        out.append(note("anomalies", n=m["reconstruction_anomalies"],
                        kinds=m["reconstruction_anomaly_kinds"], lost=lost, silent=silent[:3],
                        ties=ties.get("events", 0)))
    if m.get("workers_alive_at_end", 0) < len(m.get("work_done", [])):
        out.append(note("workers_dead"))
    out += [n for n in (foreign_load(m, origin), vcpu_starved(m), virtual_clock(m)) if n]
    scx = m.get("scx")
    if scx and not scx.get("enabled_throughout"):
        out.append(note("scx_not_enabled", name=scx.get("name"), ops=scx.get("ops"),
                        states=scx.get("states"), ejected=scx.get("ejected")))
    kc = m.get("kernel_counter_agreement")
    if kc and kc["disagreeing"]:
        out.append(note("counters_disagree", disagreeing=kc["disagreeing"], tasks=kc["tasks"],
                        migrations={k: kc["migrations"][k] for k in ("trace", "kernel")},
                        switches={k: kc["switches"][k] for k in ("trace", "kernel")}, lost=lost))
    ka = m.get("kernel_agreement")
    due = (asked or 0) * params.get("sample_hz", 0)
    if ka and not ka["sweeps"] and due >= 2:
        out.append(note("sampler_silent", due=due))
    elif ka and ka["sweeps"] < SLOW_SAMPLER * due:
        out.append(note("sampler_slow", sweeps=ka["sweeps"], due=due, hz=params["sample_hz"],
                        sweep_us=ka["sweep_us_median"], budget=SWEEP_BUDGET))
    if ka and ka["agreement"] is not None and ka["agreement"] < 0.99:
        out.append(note("proc_agreement_low", agreement=ka["agreement"], sweeps=ka["sweeps"],
                        sweep_us=ka["sweep_us_median"]))
    mc = m.get("migration_causes")
    if mc and mc["counts"].get("unknown"):
        out.append(note("causes_unknown", n=mc["counts"]["unknown"], of=mc["n"],
                        softirq=mc["softirq_recorded"], inferred=mc["counts"].get("inferred", 0)))
    out += cause_counter_notes(m)
    nr = m.get("kernel_nr_running_agreement")
    if nr and nr["agreement"] is not None and nr["agreement"] < 0.99:
        out.append(note("nr_running_agreement_low", agreement=nr["agreement"], clean=nr["clean"]))
    elif nr and nr["samples"] and not nr["clean"]:
        out.append(note("nr_running_unclean"))
    return out


def cause_counter_notes(m: dict) -> list[dict]:
    """The migrations' causes against the kernel's own counts of them (schedstats), from the
    manifest's kernel_counter_agreement (per task) and schedstat_agreement (per domain): what
    they say, agreeing or not, or that the kernel does not count them. Nothing for a capture
    that never read them (an import, an older run)."""
    sa = m.get("schedstat_agreement")
    if sa is None:
        return []
    kc = m.get("kernel_counter_agreement") or {}
    wake = kc.get("wakeups") if (kc.get("wakeups") or {}).get("counted") else None
    domains = sa if sa.get("counted") else None
    if wake is None and domains is None:
        return [note("causes_unchecked", why=sa.get("why_not") or "no task's counts were read")]
    other = kc.get("other_moves") if wake else None
    agree = ((wake is None or wake["agreeing"] == wake["counted"])
             and (other is None or other["agreeing"] == wake["counted"])
             and (domains is None or domains["within"]))
    return [note("causes_checked", wakeups=wake, other_moves=other, agree=agree,
                 domains=None if domains is None else
                 {k: domains[k] for k in ("kernel", "all", "unsure", "unknown", "within")})]


def class_notes(m: dict, origin: str) -> list[dict]:
    """What the tasks' scheduling classes and the release leave unseen or assumed: RT throttling
    capping real-time tasks (or its absence), a warm-up too short for PELT to converge, a warm
    release asked of a simulation whose reference policy keeps no load history."""
    out = []
    sched = m.get("sched") or {}
    rt = sum(n for label, n in (m.get("sched_class_counts") or {}).items()
             if label.split(" ")[0] in (POLICIES["fifo"], POLICIES["rr"]))
    if rt and sched.get("rt_runtime_us") is not None:
        out.append(note("rt_throttling", tasks=rt, runtime_us=sched["rt_runtime_us"],
                        period_us=sched["rt_period_us"]))
    warmed = (m.get("release") or {}).get("warmed_s")
    if warmed is not None:
        residual = 0.5 ** (warmed / PELT_HALF_LIFE_S)
        if residual > WARMUP_RESIDUAL_MAX:
            out.append(note("warmup_short", warmed_s=warmed, residual=residual))
    if origin == "simulated" and (m.get("params") or {}).get("release") == "warm":
        out.append(note("release_not_modelled", release="warm"))
    return out


def absent_events_notes(absent: list[str]) -> list[dict]:
    """A note when the trace lacks events the analysis needs (no fork, exit or sched_waking is
    usual: the manifest lists those); none for a trace with sched_waking but no sched_wakeup,
    whose wake-ups are derived (a wakeups_derived note says so)."""
    if "sched_migrate_task" in absent or {"sched_wakeup", "sched_waking"} <= set(absent):
        return [note("events_absent", absent=list(absent))]
    return []


def crosscheck_notes(result: dict, a: str, b: str) -> list[dict]:
    """What comparing two probes' recordings of one run (analysis.probe_agreement) found."""
    if result.get("error"):
        return [note("crosscheck_failed", probe=b, error=result["error"])]
    if result["verdict"] == "agree":
        return []
    mig, runs = result["migrations"], result["runs"]
    return [note("probes_disagree", a=a, b=b, verdict=result["verdict"],
                 migrations={"only_a": mig[f"only_{a}"], "only_b": mig[f"only_{b}"]},
                 runs={"only_a": runs[f"only_{a}"], "only_b": runs[f"only_{b}"]})]


# --- the wording ------------------------------------------------------------------------------

def _silent(n):
    named = ", ".join(f"{c['comm']} "
                      f"({'CPU %d' % c['cpu'] if c['pid'] == 0 else 'pid %d' % c['pid']}"
                      f", ran {c['runs']}x)" for c in n["contexts"][:5])
    return (f"{n['probe']} recorded no event in the context of "
            f"{plural(len(n['contexts']), 'task')} it saw run: {named}; every tracepoint hit "
            "there (their switch-out, what their interrupts do, e.g. an idle CPU's balancing "
            "migrations) is missing and not counted in lost_events")


#: the CPUs that lost events a note names one by one, at most (the others: the manifest's
#: capture.lost_by_cpu)
LOST_CPUS_NAMED = 8


def _lost_where(by_cpu: dict) -> str:
    """Where events were lost, from {cpu: count} (-1: unknown; keys int, or str from JSON): each
    CPU that lost any, or beyond :data:`LOST_CPUS_NAMED` how many did and the one that lost
    most."""
    lost = sorted((int(c), int(v)) for c, v in by_cpu.items() if int(v))
    say = [f"{v if v >= 0 else 'unknown'} on CPU {c}" for c, v in lost]
    if len(lost) <= LOST_CPUS_NAMED:
        return "per CPU: " + (", ".join(say) or "none")
    c, v = max(lost, key=lambda cv: cv[1])
    return (f"on {len(lost)} CPUs, most on CPU {c}: {v}; each CPU's count in the manifest's "
            "capture.lost_by_cpu")


def _lost(n):
    if n["lost"] < 0:
        return ("the trace says events were lost but not how many" if n["origin"] == "imported"
                else "the probe could not tell whether events were lost")
    if n["origin"] == "imported":
        return (f"{n['lost']} events were lost when the trace was recorded "
                f"({_lost_where(n['by_cpu'] or {})}): tables may miss migrations or switches")
    return f"{n['lost']} events were lost by the probe: tables may miss migrations or switches"


def _clock_ties(n):
    return (f"{n['pairs']:,} times two CPUs' events carry the same timestamp (the "
            f"{n.get('clock') or 'trace'} clock's resolution): the trace does not say which "
            f"came first; {n['reordered']:,} of those {n['groups']:,} groups were put in an order "
            "the scheduler can have followed (a task's wake-up after its switch-out on the other "
            "CPU, before its switch-in there: harmony.analysis.ties)")


def _anomalies(n):
    kinds = ", ".join(f"{k} {v}" for k, v in n["kinds"].items())
    if n["lost"] == 0 and n.get("ties"):
        why = ("the probe lost no events: either the kernel recorded none, or they are among "
               f"the {n['ties']:,} events stamped with the time of another CPU's event, whose "
               "order the trace cannot give")
    elif n["lost"] == 0:
        why = ("the probe lost no events, so the kernel recorded none for them"
               + (f": it records nothing while {', '.join(n['silent'])} run" if n["silent"]
                  else " (some kernels omit a sched_switch into a task)"))
    elif n["lost"] > 0:
        why = "events were lost"
    else:
        why = "events may have been lost (the probe cannot tell)"
    missing = "missing or out of order" if n["lost"] == 0 and n.get("ties") else "missing"
    return (f"{n['n']} contradictions in the event stream were repaired ({kinds}): an event the "
            f"task state machine needed is {missing}; {why}. The run queues resynchronise at the "
            "next event; a run whose switch-in is missing starts at the task's wake-up and is "
            "flagged unseen_start (analysis.reconstruct.df_anomalies lists every repair)")


def disqualifying(m: dict) -> dict | None:
    """The note that keeps a run out of the policy card, or None: a host busy with other tasks
    (:func:`foreign_load`), starved vCPUs (:func:`vcpu_starved`) or a virtual clock
    (:func:`virtual_clock`), each measured to change what the policy reads."""
    origin = "imported" if "imported" in (m.get("source") or {}) else "recorded"
    for n in (foreign_load(m, origin), vcpu_starved(m), virtual_clock(m)):
        if n:
            return n
    return None


def foreign_load(m: dict, origin: str) -> dict | None:
    """The ``foreign_load`` note of a run whose CPUs gave other tasks more than
    :data:`thresholds.FOREIGN_LOAD_MAX` of the window; None otherwise."""
    fl = m.get("foreign_load") or {}
    if fl.get("max_frac") is None or fl["max_frac"] <= T.FOREIGN_LOAD_MAX:
        return None
    return note("foreign_load", frac=fl["max_frac"], cpu=fl.get("max_cpu"), top=fl.get("top"),
                origin=origin)


def vcpu_starved(m: dict) -> dict | None:
    """The ``vcpu_starved`` note of a run captured in a VM whose vCPUs waited for a host CPU more
    than :data:`thresholds.VCPU_WAIT_MAX` of its window; None otherwise."""
    vm = m.get("vm") or {}
    frac = vm.get("vcpu_wait_max")
    if frac is None or frac <= T.VCPU_WAIT_MAX:
        return None
    return note("vcpu_starved", frac=frac, vcpu=vm.get("vcpu_wait_max_vcpu"),
                setting=vm.get("qemu_setting") or "", accelerator=vm.get("accelerator"))


def virtual_clock(m: dict) -> dict | None:
    """The ``virtual_clock`` note of a run captured under TCG with ``-icount`` (tcg=icount), a
    set-up whose timing was measured unfaithful (:data:`thresholds.VCPU_WAIT_MAX`); else None."""
    vm = m.get("vm") or {}
    setting = vm.get("qemu_setting") or ""
    if vm.get("accelerator") != "tcg" or "tcg=icount" not in setting:
        return None
    return note("virtual_clock", setting=setting)


def _foreign(n):
    if n["origin"] == "imported":
        return (f"other tasks used {n['frac']:.1%} of CPU {n['cpu']} in the window (most: "
                f"{n['top'] or '?'}): balance and share metrics assume the CPU set belongs to the "
                f"chosen tasks (limit FOREIGN_LOAD_MAX = {T.FOREIGN_LOAD_MAX:.0%})")
    return (f"other tasks used {n['frac']:.1%} of CPU {n['cpu']} during the run (most: "
            f"{n['top'] or '?'}): the host was not quiet, and balance and share metrics assume "
            f"the CPU set belongs to the experiment (limit FOREIGN_LOAD_MAX = "
            f"{T.FOREIGN_LOAD_MAX:.0%})")


def _counters(n):
    why = ("events were lost" if n["lost"] > 0 else "the probe cannot tell whether events were lost"
           if n["lost"] < 0 else "no event was reported lost")
    return (f"the trace disagrees with the kernel's own counters (/proc/<pid>/sched) for "
            f"{n['disagreeing']} of {n['tasks']} tasks: migrations {n['migrations']['trace']} in "
            f"the trace, {n['migrations']['kernel']} counted; switches {n['switches']['trace']} / "
            f"{n['switches']['kernel']} ({why}; analysis.counters.df_counter_agreement gives "
            "each task's)")


def _disagree(n):
    a, b, mig, runs = n["a"], n["b"], n["migrations"], n["runs"]
    return (f"{a} and {b} disagree ({n['verdict']}): migrations only {a} {mig['only_a']}, only "
            f"{b} {mig['only_b']}; runs only {a} {runs['only_a']}, only {b} {runs['only_b']} "
            "(examples in crosscheck.json)")


def _absent(n):
    what = []
    if "sched_migrate_task" in n["absent"]:
        what.append("migrations are known only where a task's runs show it on another CPU (its "
                    "unrecorded migrations), not when or why it moved")
    if "sched_wakeup" in n["absent"] and "sched_waking" in n["absent"]:
        what.append("a woken task counts as runnable only from its switch-in (its wake-ups are "
                    "not seen), so run queues are short by the tasks waiting, and the release "
                    "spread cannot be measured")
    return (f"the trace holds no {', '.join(n['absent'])} event (not recorded, or none happened): "
            + "; ".join(what))


def _derived(n):
    return (f"the trace holds no sched_wakeup but {n['derived']} sched_waking (perf sched "
            "record records those instead): each stands for the wake-up it starts "
            f"(harmony.analysis.waking), {n['placed']} onto the CPU the wake-up's migration "
            f"moved the task to, the others where the task was ({n['pulls']} migrations "
            "right after a sched_waking taken as idle pulls; "
            f"{n.get('after_switch_out', 0)} of a task still on its CPU put after its "
            "switch-out); a woken task counts as runnable a few microseconds early, and the "
            "sched_wakeup rows of events.parquet are derived, not recorded")


def _causes_checked(n):
    parts = []
    w, o, d = n["wakeups"], n["other_moves"], n["domains"]
    if w:
        parts.append(f"per task (/proc/<pid>/sched): wake-up moves {w['trace']} in the trace, "
                     f"{w['kernel']} counted (nr_wakeups_migrate), other moves {o['trace']} / "
                     f"{o['kernel']} (se.nr_migrations less those), {w['agreeing']} and "
                     f"{o['agreeing']} of {w['counted']} tasks agreeing")
    if d:
        k, a, u = d["kernel"], d["all"], d["unsure"]
        parts.append("per domain (/proc/schedstat, every task's moves to the CPU set, in the "
                     "trace / counted): "
                     + ", ".join(f"{c} {a[c]}" + (f" (+{u[c]} during a read)" if u[c] else "")
                                 + f" / {k[c]}" for c in ("periodic", "newidle", "active"))
                     + (f", {d['unknown']} moves of unknown cause" if d["unknown"] else "")
                     + ("" if d["within"] else
                        " (beyond what the trace's moves can explain: "
                        "analysis.counters.schedstat_agreement)"))
    head = ("the migrations' causes agree with the kernel's own counters" if n["agree"] else
            "the migrations' causes disagree with the kernel's own counters")
    return f"{head}: " + "; ".join(parts)


def _causes_unknown(n):
    why = ("the events around them do not decide it (an asleep move with no wake-up after it, "
           "a real-time task's push or pull, a stopper whose wake-up was not seen, or a moved "
           "task no probe recorded)" if n["softirq"] else
           "the capture holds no irq:softirq_entry/exit of the scheduler's softirq, so a periodic "
           "balance's pull cannot be told from a new-idle one (nor an active balance from an "
           "affinity change)")
    return (f"the cause of {plural(n['n'], 'migration')} of {n['of']} in the window is unknown: "
            f"{why}; they are counted as unknown, never guessed"
            + (f" ({n['inferred']} inferred moves among all)" if n.get("inferred") else ""))


def _scx(n):
    left = [st for st in n.get("states") or [] if st[1] != "enabled"]
    when = f" at {left[0][0]:.2f} s after it was enabled" if left else ""
    why = f": {n['ejected']}" if n.get("ejected") else ""
    return (f"the sched_ext scheduler {n['name']} (ops {n.get('ops') or '?'}) was not enabled "
            f"throughout the run: the kernel ejected it{when}{why}; from then on the fair class "
            "placed the tasks, not the scheduler under test")


def _rt_throttling(n):
    if n["runtime_us"] < 0:
        return (f"{plural(n['tasks'], 'real-time task')} ran with RT throttling off "
                "(sched_rt_runtime_us = -1): CPU-bound ones may take every CPU they hold from all "
                "other tasks, the host's own included (kernels from 6.12 on still give the fair "
                "class its deadline server's share)")
    return (f"{plural(n['tasks'], 'real-time task')}: RT throttling lets SCHED_FIFO and SCHED_RR "
            f"tasks have at most {n['runtime_us']} us of every {n['period_us']} us of each CPU "
            f"({n['runtime_us'] / n['period_us']:.0%}): a CPU-bound one gets no more, the rest "
            "goes to the fair class, and their fair shares are computed with that cap")


_WORDING = {
    "recorder": lambda n: n["text"],
    "controller": lambda n: n["text"],
    "silent_contexts": _silent,
    "unrecorded_migrations": lambda n: (
        f"the experiment tasks' own events in the {n['probe']} recording prove "
        f"{plural(n['n'], 'move')} of {plural(n['tasks'], 'task')} that no sched_migrate_task "
        f"records (e.g. {n['examples']})"),
    "lost_events": _lost,
    "window_late": lambda n: (
        f"the measured window is {n['measured_s']:.3f} s, not the {n['asked_s']:g} s asked: the "
        f"end marker came {n['measured_s'] - n['asked_s']:.3f} s late (the controller, waking "
        "at the end, waited for a CPU)"),
    "not_woken": lambda n: (f"{len(n['pids'])} tasks were never seen waking "
                            + ("at the warm-up (before t0)" if n.get("warm") else "after t0")),
    "woke_off_initial_cpu": lambda n: (
        f"{len(n['pids'])} tasks "
        + ("were not on their initial CPU at t0 (woken elsewhere at the warm-up, or moved while "
           "confined)" if n.get("warm") else "woke at t0 on a CPU other than their initial one")
        + f": the layout did not exist at t0 (pids {n['pids'][:5]})"),
    "rt_throttling": _rt_throttling,
    "warmup_short": lambda n: (
        f"the warm release ran the tasks confined for {n['warmed_s']:.3f} s before t0, "
        f"{n['warmed_s'] / PELT_HALF_LIFE_S:.1f} PELT half-lives: {n['residual']:.1%} of their "
        "load history had not converged at t0 (within 1% takes 0.22 s)"),
    "release_not_modelled": lambda n: (
        "a warm release was asked, but the reference policy keeps no load history: warm and "
        "cold releases are the same in the simulation (it wakes every task at t0)"),
    "anomalies": _anomalies,
    "clock_ties": _clock_ties,
    "workers_dead": lambda n: "some workers were not alive at the end of the run",
    "foreign_load": _foreign,
    "vcpu_starved": lambda n: (
        f"vCPU {n['vcpu']}'s thread waited for a host CPU {n['frac']:.1%} of the window "
        + (f"({n['accelerator'].upper()}, {n['setting'] or '?'})" if n['accelerator'] else
           "(the VM's accelerator and QEMU setting not recorded)")
        + ": the guest's clock ran on while "
        "that CPU ran nothing, which its scheduler cannot see (more vCPUs than idle host CPUs, "
        f"or a busy host; limit VCPU_WAIT_MAX = {T.VCPU_WAIT_MAX:.0%})"),
    "virtual_clock": lambda n: (
        f"captured under a virtual clock ({n['setting']}): measured unfaithful, a 50% duty "
        "task's share came out ~30 points off (bench/README.md, \"which QEMU set-up\"); the "
        "policy card does not use the run"),
    "counters_disagree": _counters,
    "sampler_silent": lambda n: (
        f"the kernel sampler made no sweep in the window ({n['due']:.0f} were due): it got no "
        "CPU time among the tasks (SCHED_FIFO refused?), so the run queues were not compared "
        "with the kernel's /proc or nr_running"),
    "sampler_slow": lambda n: (
        f"the kernel sampler swept {n['sweeps']} times in the window, not the {n['due']:.0f} "
        f"that {n['hz']:g} Hz asks: after a sweep it sleeps {n['budget']} times the CPU time "
        f"the sweep took (its /proc reads alone, {n['sweep_us']:.0f} us of wall time here), so "
        "that it takes at most ~1 % of a CPU from the tasks"),
    "proc_agreement_low": lambda n: (
        f"rebuilt run queues agree with the kernel's /proc view on only {n['agreement']:.1%} of "
        f"{n['sweeps']} sweeps (a sweep reads each task's /proc/PID/stat in turn, "
        f"{n['sweep_us']:.0f} us here: a task that moves meanwhile counts where it was read; the "
        "nr_running check is atomic per CPU)"),
    "nr_running_agreement_low": lambda n: (
        f"rebuilt run queues agree with the kernel's nr_running on only {n['agreement']:.1%} of "
        f"{n['clean']} clean samples"),
    "nr_running_unclean": lambda n: (
        "no sample of the kernel's nr_running was clean (other tasks were always runnable on the "
        "CPU set): not compared"),
    "crosscheck_failed": lambda n: f"the {n['probe']} cross-check could not be done: {n['error']}",
    "probes_disagree": _disagree,
    "imported_from": lambda n: f"imported from {n['path']} ({n['what']}), recorded on {n['host']}",
    "events_absent": _absent,
    "wakeups_derived": _derived,
    "causes_unknown": _causes_unknown,
    "causes_checked": _causes_checked,
    "causes_unchecked": lambda n: (f"the migrations' causes were not checked against the "
                                   f"kernel's own counts: {n['why']}"),
    "t0_default": lambda n: ("t0 is the first event of the chosen tasks (no --t0 or --t0-marker "
                             "given)"),
    "end_default": lambda n: ("the window ends at the last event of the chosen tasks (no --end or "
                              "--end-marker given)"),
    "cpus_default": lambda n: (f"the CPU set is every CPU the file recorded, {n['cpus']} (no "
                               "--cpus given)"),
    "cpus_without_events": lambda n: f"CPUs {n['cpus']} of the CPU set recorded no event",
    "realtime_tasks": lambda n: (
        f"tasks {n['pids']} have real-time priorities; their fair share is computed as if they "
        "were nice 0"),
    "tasks_outside_cpu_set": lambda n: n["what"],
    "tables_rebuilt": lambda n: (
        "rebuilt from the raw capture: " + "; ".join(f"{k}.parquet (was {v})"
                                                     for k, v in n["tables"].items())),
    "scx_not_enabled": _scx,
    "demand_unknown": lambda n: ("fair shares assume every task wants a whole CPU (duty 100%): "
                                 "the trace does not say what the tasks demand"),
}
