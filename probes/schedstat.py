"""The kernel's own count of load-balance and wake-up migrations: ``/proc/schedstat``, and the
switch that turns the counting on (``kernel.sched_schedstats``).

A kernel built with ``CONFIG_SCHEDSTATS`` counts, while ``/proc/sys/kernel/sched_schedstats`` is
1 (or booted with ``schedstats=enable``), per task in ``/proc/<pid>/sched``
(:mod:`harmony.probes.proc_sched` reads those) and per CPU and scheduling domain in
``/proc/schedstat`` (kernel/sched/stats.c ``show_schedstat``). Of a domain line, Harmony reads,
summed over the domains of each CPU (a balance counts in the domain it ran at, on the CPU that
pulled):

- ``lb_gained[type]``: tasks ``sched_balance_rq`` (``load_balance``) moved to this CPU, by the
  balancing CPU's idle type: ``busy`` and ``idle`` (the periodic balance, and the nohz idle
  balance done for an idle CPU, both from the SCHED softirq) and ``newidle`` (the new-idle
  balance of ``__schedule``);
- ``alb_pushed``: tasks the active balance's stopper pushed;
- ``ttwu_move_affine``: wake-ups moved to this CPU by the wake-affine choice.

The layout is the file's ``version``: 15 (kernels up to 6.10: idle types in the order idle,
busy, newidle; 8 counters each), 16 (6.11 on: busy, idle, newidle) and 17 (6.15 on: the domain's
name before its CPU mask, 11 counters per idle type, ``lb_imbalance`` split in four). The
counters count every task on the machine, not only a run's: :mod:`harmony.analysis.counters`
compares them knowing that; the per-task ones of /proc/<pid>/sched are exact for a run's tasks.

Each domain line is kept too (:func:`parse`'s ``domains``): its index (0 the lowest), its CPU
mask (the domain's span, printed by the kernel as a hexadecimal bitmap), its name (version 17
only) and its counters, so that the moves can be compared level by level
(:mod:`harmony.analysis.topology`) and the machine's domains read where debugfs cannot
(:mod:`harmony.probes.domains`).
"""

from __future__ import annotations

import time
from pathlib import Path

from harmony.core.osutil import forget_processes, record_processes, stale_records

SCHEDSTAT = Path("/proc/schedstat")
SYSCTL = Path("/proc/sys/kernel/sched_schedstats")

#: the idle types of a domain line's per-type columns, by version (enum cpu_idle_type's order)
IDLE_TYPES = {15: ("idle", "busy", "newidle"), 16: ("busy", "idle", "newidle"),
              17: ("busy", "idle", "newidle")}
#: per idle type: the position of lb_gained among that type's counters, and how many there are
_LB = {15: (4, 8), 16: (4, 8), 17: (7, 11)}
#: after the per-type counters: alb_count alb_failed alb_pushed sbe_count sbe_balanced sbe_pushed
#: sbf_count sbf_balanced sbf_pushed ttwu_wake_remote ttwu_move_affine ttwu_move_balance
_TAIL = ("alb_count", "alb_failed", "alb_pushed", "sbe_count", "sbe_balanced", "sbe_pushed",
         "sbf_count", "sbf_balanced", "sbf_pushed", "ttwu_wake_remote", "ttwu_move_affine",
         "ttwu_move_balance")
#: the counters kept, summed over a CPU's domains
COUNTERS = ("lb_gained_busy", "lb_gained_idle", "lb_gained_newidle", "alb_pushed",
            "ttwu_move_affine")
#: the counters kept per domain: those, and the balance attempts of each idle type (lb_count:
#: the first of a type's counters, lb_failed its third in every version) and the active ones
DOMAIN_COUNTERS = (*COUNTERS, "lb_count_busy", "lb_count_idle", "lb_count_newidle",
                   "lb_failed_busy", "lb_failed_idle", "lb_failed_newidle", "alb_count",
                   "alb_failed")


class SchedstatError(ValueError):
    """A /proc/schedstat text Harmony cannot read (a version it does not know, a bad line)."""


def parse_mask(text: str) -> list[int]:
    """The CPUs of a kernel cpumask printed as a bitmap (``%*pb``: hexadecimal words of 32 bits,
    the most significant first, separated by commas: ``"00000000,0000000f"`` is CPUs 0-3).
    Raises SchedstatError if it is not one."""
    try:
        bits = int(text.replace(",", ""), 16)
    except ValueError:
        raise SchedstatError(f"/proc/schedstat: {text[:40]!r} is not a CPU mask") from None
    return [cpu for cpu in range(bits.bit_length()) if bits >> cpu & 1]


def _domain(f: list[str], version: int, line: str) -> dict:
    """One domain line's index, name (version 17), span and :data:`DOMAIN_COUNTERS`."""
    at, per = _LB[version]
    types = IDLE_TYPES[version]
    name = f[1] if version >= 17 else None
    mask = f[2] if version >= 17 else f[1]
    values = f[3:] if version >= 17 else f[2:]      # after the name (17) and the mask
    if len(values) != per * len(types) + len(_TAIL) or not f[0][6:].isdigit():
        raise SchedstatError(f"/proc/schedstat version {version}: a domain line with "
                             f"{len(values)} counters, not {per * 3 + len(_TAIL)}: "
                             f"{line[:80]!r}")
    try:
        n = [int(v) for v in values]
    except ValueError:
        raise SchedstatError(f"/proc/schedstat: not a number in {line[:80]!r}") from None
    got = {"index": int(f[0][6:]), "name": name, "span": parse_mask(mask)}
    for k, t in enumerate(types):
        got[f"lb_count_{t}"] = n[k * per]
        got[f"lb_failed_{t}"] = n[k * per + 2]
        got[f"lb_gained_{t}"] = n[k * per + at]
    tail = dict(zip(_TAIL, n[per * len(types):]))
    for name in ("alb_count", "alb_failed", "alb_pushed", "ttwu_move_affine"):
        got[name] = tail[name]
    return got


def parse(text: str) -> dict:
    """``{"version": v, "cpus": {cpu: {counter: value}}, "domains": {cpu: [domain, ...]}}`` from
    a /proc/schedstat text: each CPU's :data:`COUNTERS` summed over its domains, and each of its
    domains, lowest first: ``{"index", "name" (None before version 17), "span" (its CPUs),
    counter: value}`` for the :data:`DOMAIN_COUNTERS`. Raises SchedstatError on a version it
    does not know or a line it cannot read."""
    version, cpus, domains, cpu = None, {}, {}, None
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "version":
            version = int(f[1])
            if version not in IDLE_TYPES:
                raise SchedstatError(f"/proc/schedstat version {version}: Harmony reads "
                                     f"versions {', '.join(map(str, IDLE_TYPES))}")
        elif f[0].startswith("cpu") and f[0][3:].isdigit():
            cpu = int(f[0][3:])
            cpus[cpu] = dict.fromkeys(COUNTERS, 0)
            domains[cpu] = []
        elif f[0].startswith("domain"):
            if version is None or cpu is None:
                raise SchedstatError(f"/proc/schedstat: a domain line before its version or "
                                     f"CPU: {line[:80]!r}")
            got = _domain(f, version, line)
            domains[cpu].append(got)
            for name in COUNTERS:
                cpus[cpu][name] += got[name]
    if version is None:
        raise SchedstatError("/proc/schedstat has no version line")
    return {"version": version, "cpus": cpus, "domains": domains}


def enabled() -> bool | None:
    """Whether the kernel counts now (sched_schedstats is 1); None: it cannot (no
    CONFIG_SCHEDSTATS, no such sysctl)."""
    try:
        return SYSCTL.read_text().strip() == "1"
    except OSError:
        return None


#: the kind of the record (:func:`harmony.core.osutil.record_processes`) of a run that turned the
#: counting on
RECORD = "schedstats"


def reclaim_stale() -> list[str]:
    """Turn the counting back off where a dead run turned it on and could not (killed); a line
    per switch put back. Call with the host lock held (no other run counts then)."""
    out = []
    for rec in stale_records(RECORD):
        if not rec:
            continue
        try:
            SYSCTL.write_text(rec.get("was", "0"))
            out.append(f"kernel.sched_schedstats back to {rec.get('was', '0')} "
                       f"(turned on by dead run {rec.get('controller_pid')})")
        except OSError:
            pass
    return out


#: why nothing is counted on a kernel without the switch
NOT_COUNTED = ("the kernel does not count scheduler statistics (no "
               "/proc/sys/kernel/sched_schedstats: built without CONFIG_SCHEDSTATS)")


def _not_switched(exc: OSError) -> str:
    return f"kernel.sched_schedstats is 0 and could not be set to 1 ({exc.strerror or exc})"


#: the counting was turned on by :func:`switch_on_for_the_boot` in this process
_on_for_the_boot = False


def switch_on_for_the_boot() -> str | None:
    """Turn the kernel's counting on and leave it on: for a guest of Harmony's own (the VM agent),
    whose runs then never switch it. A switch of ``kernel.sched_schedstats`` patches the
    kernel's text (a static key): 6-18 ms under TCG, and four switches within 40 ms crashed a
    TCG guest (an int3 of the patching taken as an oops in sched_balance_rq; bench/README.md),
    where every run switched it on and back off. None once it counts, else why not. Each run's
    record says so (:meth:`Reads.facts`: ``enabled_for_the_boot``)."""
    global _on_for_the_boot
    state = enabled()
    if state is None:
        return NOT_COUNTED
    if not state:
        try:
            SYSCTL.write_text("1")
        except OSError as exc:
            return _not_switched(exc)
        _on_for_the_boot = True
    return None


class Reads:
    """/proc/schedstat read at the start and the end of a run (:meth:`take`), with the counting
    turned on for the run if the kernel has it off (:meth:`begin`; :meth:`restore` puts the
    switch back as it was: call it whatever happens). :meth:`facts` gives what the manifest
    keeps: whether the kernel counts, why not, and each read (ns CLOCK_MONOTONIC before and
    after it, each CPU's counters)."""

    def __init__(self):
        self.state = enabled()            # as found
        self.turned_on = False            # set to 1 by begin(), back to 0 by restore()
        self.enabled_here = False
        self.why_not: str | None = None
        self.reads: dict[str, dict] = {}

    def begin(self) -> None:
        if self.state is None:
            self.why_not = NOT_COUNTED
            return
        if not self.state:
            try:
                # recorded first: a controller killed while it counts leaves the switch on, and
                # the next run's start (reclaim_stale) turns it back off
                record_processes(RECORD, [], sysctl=str(SYSCTL), was="0")
                SYSCTL.write_text("1")
                self.turned_on = self.enabled_here = True
            except OSError as exc:
                self.why_not = _not_switched(exc)

    def counting(self) -> bool:
        return self.why_not is None

    def take(self, label: str) -> None:
        if not self.counting():
            return
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        try:
            text = SCHEDSTAT.read_text()
        except OSError as exc:
            self.why_not = f"{SCHEDSTAT} is not readable ({exc.strerror or exc})"
            return
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        try:
            got = parse(text)
        except SchedstatError as exc:
            self.why_not = str(exc)
            return
        self.reads[label] = {"before_ns": before, "after_ns": after, **got}

    def restore(self) -> None:
        if self.turned_on:
            try:
                SYSCTL.write_text("0")
                self.turned_on = False
            except OSError:
                return          # the record stays: the next start tries again
        forget_processes(RECORD)

    def facts(self) -> dict:
        return {"counting": self.counting(), "why_not": self.why_not,
                "enabled_for_the_run": self.enabled_here,
                "enabled_for_the_boot": _on_for_the_boot, "reads": self.reads}
