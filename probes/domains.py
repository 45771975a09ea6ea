"""The machine's shape as the kernel sees it: its CPUs (sysfs) and its scheduling domains (debugfs
and /proc/schedstat), read where a run measures, on the host or in a guest.

The load balancer works level by level: each CPU has a chain of scheduling domains, the lowest
first (SMT siblings, the cores of an LLC, a package, NUMA nodes...), each with its own span, flags
and balancing parameters. Two places show them, neither complete:

- debugfs ``sched/domains/cpuN/domainM/`` (kernel/sched/debug.c ``register_sd``): ``name``,
  ``flags``, ``min_interval``, ``max_interval``, ``busy_factor``, ``imbalance_pct``,
  ``cache_nice_tries``, ``max_newidle_lb_cost``, but no span. From 6.6 on (6.12, 6.18) the
  directory exists only while ``sched/verbose`` is Y (``sched_verbose_write`` creates it and
  removes it): :func:`read` turns verbose on for the read and puts it back, recording the switch
  first (:func:`harmony.core.osutil.record_processes`) so that a controller killed in between has it
  put back by the next start (:func:`reclaim_stale`). 6.1 keeps the directory whatever verbose
  says. A kernel in lockdown (integrity) refuses every debugfs file that can be written,
  ``verbose`` and the parameters among them: nothing is read there, and the topology says why.
- /proc/schedstat's domain lines (CONFIG_SCHEDSTATS; :mod:`harmony.probes.schedstat`): each
  domain's span (its CPU mask), and from version 17 (6.15 on) its name.

The result is the manifest's ``topology`` (TOPOLOGY-CONTRACT.md; :func:`read`), JSON: CPU keys
are strings. Names come from debugfs where readable, else from /proc/schedstat version 17, else
are None; spans from /proc/schedstat only. What could not be read is listed in
``source["missing"]`` with why. ``kernel.numa_balancing`` (whose moves the migrations' causes
tell apart: cause ``numa``) is recorded as found; Harmony does not change it.

Nothing here imports pandas: the guest agent reads the topology of every run it captures.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from harmony import hostfacts
from harmony.core.osutil import (format_cpulist, forget_processes, online_cpus, record_processes,
                                 stale_records)
from harmony.probes import schedstat

#: the parameter files of a domain's debugfs directory, read as integers
INT_FILES = ("min_interval", "max_interval", "busy_factor", "imbalance_pct", "cache_nice_tries",
             "max_newidle_lb_cost")
#: every key of a domain in the manifest, in order
DOMAIN_KEYS = ("index", "name", "span", "flags", *INT_FILES)
NUMA_BALANCING = Path("/proc/sys/kernel/numa_balancing")
#: the kind of the record of a controller that turned sched/verbose on
RECORD = "sched-verbose"


def level_key(index: int, name: str | None) -> str:
    """A domain's name, else ``domain<index>`` (the kernel names none: debugfs unreadable and
    /proc/schedstat before version 17); :func:`chain_keys` makes it unique along a chain."""
    return name if name else f"domain{index}"


def chain_keys(chain: list[dict]) -> list[str]:
    """The level keys of one CPU's domains (in the chain's order): the key every per-level count
    of Harmony goes by. The rule: :func:`level_key`, and the n-th domain of the same key up the
    chain (by domain index, the lowest first: by span, since each domain's span holds its
    child's) suffixed with n, n > 1. The kernel names every NUMA level ``NUMA``: an asymmetric
    machine (4 nodes on a ring with ``--numa-distance``) has one per distance, ``MC, NUMA,
    NUMA`` -> ``MC, NUMA, NUMA2``; a chain without a repeated name keeps the kernel's names.
    A CPU whose lower levels are gone (a sibling offline) still counts its own chain from 1."""
    seen: dict[str, int] = {}
    keys = {}
    for k, d in sorted(enumerate(chain), key=lambda kd: int(kd[1].get("index", kd[0]))):
        base = level_key(int(d.get("index", k)), d.get("name"))
        seen[base] = seen.get(base, 0) + 1
        keys[k] = base if seen[base] == 1 else f"{base}{seen[base]}"
    return [keys[k] for k in range(len(chain))]


def debugfs_root() -> Path | None:
    """Where debugfs is mounted (the first mount, else /sys/kernel/debug if it holds sched/),
    None if nowhere."""
    mounts = hostfacts.mountpoints("debugfs")
    if mounts:
        return Path(mounts[0])
    default = hostfacts.DEBUGFS_DEFAULT
    return default if (default / "sched").is_dir() else None


def _error(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _read_domain_dir(d: Path) -> tuple[dict, list[str]]:
    """One debugfs domain directory's name, flags and parameters; (values, unreadable files)."""
    out: dict = {"name": None, "flags": None, **dict.fromkeys(INT_FILES)}
    bad = []
    for f in ("name", "flags", *INT_FILES):
        try:
            text = (d / f).read_text().strip()
        except OSError as exc:
            bad.append(f"{f} ({_error(exc)})")
            continue
        if f == "name":
            out[f] = text or None
        elif f == "flags":
            out[f] = text.split()
        else:
            try:
                out[f] = int(text)
            except ValueError:
                bad.append(f"{f} (not a number: {text[:20]!r})")
    return out, bad


def _read_domains_dir(sched: Path) -> tuple[dict[int, list[dict]], list[str]]:
    """Every CPU's domains under ``sched/domains``: ({cpu: [values, ...]}, problems)."""
    out: dict[int, list[dict]] = {}
    problems: list[str] = []
    root = sched / "domains"
    for cpu_dir in sorted(root.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        cpu = int(cpu_dir.name[3:])
        doms = sorted(cpu_dir.glob("domain[0-9]*"), key=lambda p: int(p.name[6:]))
        out[cpu] = []
        for d in doms:
            values, bad = _read_domain_dir(d)
            out[cpu].append(values)
            problems += [f"debugfs {d.relative_to(sched)}/{b}" for b in bad]
    return out, problems


def read_debugfs(debugfs: Path | None) -> tuple[dict[int, list[dict]] | None, bool, list[str]]:
    """The debugfs domains: ({cpu: [domain values, lowest first]} or None, whether sched/verbose
    was turned on for the read, what could not be read with why). Turns verbose on where the
    domains directory is absent and verbose is N, and back whatever happens."""
    if debugfs is None:
        return None, False, ["debugfs domains (debugfs is not mounted)"]
    sched = Path(debugfs) / "sched"
    verbose = sched / "verbose"
    if not sched.is_dir():
        return None, False, [f"debugfs domains (no {sched}: a kernel without "
                             "CONFIG_SCHED_DEBUG?)"]
    toggled = False
    if not (sched / "domains").is_dir():
        try:
            was = verbose.read_text().strip()
        except OSError as exc:
            return None, False, [f"debugfs domains (no sched/domains, and sched/verbose cannot "
                                 f"be read: {_error(exc)}; a kernel in lockdown refuses it)"]
        if was != "N":
            return None, False, [f"debugfs domains (no sched/domains although sched/verbose "
                                 f"is {was})"]
        # recorded first: a controller killed while verbose is on leaves the record, and the
        # next start (reclaim_stale) puts it back
        record_processes(RECORD, [], path=str(verbose), was=was)
        try:
            verbose.write_text("Y")
            toggled = True
        except OSError as exc:
            forget_processes(RECORD)
            return None, False, [f"debugfs domains (sched/verbose could not be set to Y: "
                                 f"{_error(exc)})"]
    try:
        if not (sched / "domains").is_dir():
            return None, toggled, ["debugfs domains (no sched/domains even with sched/verbose "
                                   "Y)"]
        found, problems = _read_domains_dir(sched)
        return found, toggled, problems
    finally:
        if toggled:
            try:
                verbose.write_text("N")
                forget_processes(RECORD)
            except OSError:
                pass            # the record stays: the next start tries again


def reclaim_stale() -> list[str]:
    """Put sched/verbose back where a dead run turned it on and could not (killed); a line per
    switch put back. Call with the host lock held."""
    out = []
    for rec in stale_records(RECORD):
        path = rec.get("path")
        if not path:
            continue
        try:
            Path(path).write_text(rec.get("was", "N"))
            out.append(f"debugfs sched/verbose back to {rec.get('was', 'N')} (turned on by dead "
                       f"run {rec.get('controller_pid')})")
        except OSError:
            pass
    return out


def read_schedstat(path: Path | None = None) -> tuple[dict | None, list[str]]:
    """/proc/schedstat parsed (:func:`harmony.probes.schedstat.parse`), or (None, why not)."""
    path = Path(path or schedstat.SCHEDSTAT)
    try:
        text = path.read_text()
    except OSError as exc:
        return None, [f"domain spans ({path}: {_error(exc)}: a kernel without "
                      "CONFIG_SCHEDSTATS has none)"]
    try:
        return schedstat.parse(text), []
    except schedstat.SchedstatError as exc:
        return None, [f"domain spans ({exc})"]


def cpus_of(topo: dict) -> dict[str, dict]:
    """The manifest's ``cpus`` from :func:`harmony.hostfacts.topology`: per CPU its package,
    die, core, thread siblings, LLC (the lowest CPU sharing its last-level cache) and node."""
    out = {}
    for r in topo["cpus"]:
        llc = r.get("llc_cpus")
        out[str(r["cpu"])] = {"package": r["package"], "die": r["die"], "core": r["core"],
                              "thread_siblings": r["siblings"],
                              "llc": min(llc) if llc else None, "node": r["node"]}
    return out


def merge(debugfs: dict[int, list[dict]] | None, stats: dict | None,
          missing: list[str]) -> dict[str, list[dict]]:
    """Each CPU's domains from both sources (see the module docstring); a disagreement between
    them (how many domains a CPU has) is added to ``missing``."""
    stat_domains = (stats or {}).get("domains", {})
    cpus = sorted(set(debugfs or {}) | set(stat_domains))
    out: dict[str, list[dict]] = {}
    for cpu in cpus:
        dbg = (debugfs or {}).get(cpu)
        sst = stat_domains.get(cpu)
        if dbg is not None and sst is not None and len(dbg) != len(sst):
            missing.append(f"CPU {cpu}'s domains: debugfs shows {len(dbg)}, /proc/schedstat "
                           f"{len(sst)} (rebuilt between the reads?): debugfs's not kept")
            dbg = None
        n = len(dbg if dbg is not None else sst or [])
        doms = []
        for i in range(n):
            d = dict.fromkeys(DOMAIN_KEYS)
            d["index"] = i
            if sst is not None:
                d["span"] = sst[i]["span"]
                d["name"] = sst[i]["name"]
            if dbg is not None:
                d.update({k: v for k, v in dbg[i].items() if k != "name" or v})
            doms.append(d)
        out[str(cpu)] = doms
    return out


def numa_balancing() -> int | None:
    """kernel.numa_balancing now (0 off, 1 normal, 2 memory tiering...), None if absent."""
    return hostfacts.read_int(NUMA_BALANCING)


#: :func:`read`'s last topology and what it was read under, kept from one run to the next of a
#: process that asked for it (:func:`keep_within_the_boot`): (shape key, topology, ns read)
_kept: tuple | None = None
_keep = False


def keep_within_the_boot() -> None:
    """From now on, :func:`read` in this process reads the CPUs and the domains' parameters again
    only when the domains may have changed: when the CPUs on line or a domain's name or span in
    /proc/schedstat (read each time, ~2 ms) differ from the read it keeps. For the VM agent,
    whose machine nothing else changes: the sysfs topology and sched/verbose's debugfs tree
    (made and removed for each read) cost ~0.1 s of each run's set-up under TCG
    (bench/README.md). A topology taken from the kept read says so
    (``source["kept_from"]``: the read's CLOCK_MONOTONIC ns)."""
    global _keep
    _keep = True


def _shape_key(stats: dict | None) -> tuple | None:
    """What a kept read is valid under: the CPUs on line and each CPU's domains' names and
    spans; None where /proc/schedstat could not be read (then nothing is kept)."""
    if stats is None:
        return None
    doms = stats.get("domains", {})
    return (tuple(online_cpus()),
            tuple((cpu, tuple((d["name"], tuple(d["span"] or ())) for d in doms[cpu]))
                  for cpu in sorted(doms)))


def read(debugfs: Path | None = None, topo: dict | None = None,
         schedstat_path: Path | None = None) -> dict:
    """The manifest's ``topology`` (TOPOLOGY-CONTRACT.md) of this system now: ``cpus`` (sysfs,
    or ``topo``: a :func:`harmony.hostfacts.topology`), ``domains`` (debugfs, with verbose on for
    the read where the kernel needs it, and /proc/schedstat), ``source`` and
    ``numa_balancing``. Never raises for what it cannot read: ``source["missing"]`` says.
    Where asked (:func:`keep_within_the_boot`), the previous read while the shape is the same."""
    global _kept
    stats, missing = read_schedstat(schedstat_path)
    key = _shape_key(stats) if _keep and topo is None and debugfs is None else None
    if key is not None and _kept is not None and _kept[0] == key:
        got = copy.deepcopy(_kept[1])
        nb = numa_balancing()
        got["numa_balancing"] = {"before": nb, "during": nb}
        got["source"]["kept_from"] = _kept[2]
        return got
    got = _read(debugfs, topo, stats, missing)
    if key is not None:
        _kept = (key, copy.deepcopy(got), time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    return got


def _read(debugfs: Path | None, topo: dict | None, stats: dict | None,
          missing: list[str]) -> dict:
    topo = topo if topo is not None else hostfacts.topology()
    debugfs = Path(debugfs) if debugfs is not None else debugfs_root()
    found, toggled, problems = read_debugfs(debugfs)
    missing = problems + missing
    domains = merge(found, stats, missing)
    online = {str(c["cpu"]) for c in topo["cpus"]}
    if not domains and len(online) > 1 and not missing:
        missing.append("scheduling domains (neither debugfs nor /proc/schedstat shows them)")
    nb = numa_balancing()
    return {"cpus": cpus_of(topo), "domains": domains,
            "source": {"debugfs": found is not None, "verbose_toggled": toggled,
                       "schedstat_version": stats["version"] if stats else None,
                       "missing": missing + list(topo.get("notes", []))},
            "numa_balancing": {"before": nb, "during": nb}}


def describe(topology: dict) -> list[str]:
    """Lines for humans: each distinct domain (name, span, parameters), the lowest first, of
    every CPU (a domain shared by CPUs is said once with the CPUs it is the level of)."""
    seen: dict[tuple, list[int]] = {}
    for cpu, doms in sorted(topology.get("domains", {}).items(), key=lambda kv: int(kv[0])):
        for d, name in zip(doms, chain_keys(doms)):
            key = (d["index"], name, tuple(d["span"] or ()), d["min_interval"],
                   d["max_interval"], d["busy_factor"], d["imbalance_pct"],
                   d["cache_nice_tries"])
            seen.setdefault(key, []).append(int(cpu))
    lines = []
    for (i, name, span, lo, hi, busy, imb, tries), cpus in sorted(
            seen.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        params = (f"interval {lo}-{hi} ms, busy_factor {busy}, imbalance_pct {imb}, "
                  f"cache_nice_tries {tries}" if lo is not None else "parameters not read")
        lines.append(f"domain{i} {name} span {format_cpulist(list(span)) or '?'} "
                     f"({'CPU' if len(cpus) == 1 else 'CPUs'} {format_cpulist(cpus)}): {params}")
    return lines


def summary_line(topology: dict) -> str:
    """One line: the levels (names and span sizes) of the lowest CPU's chain, or why none."""
    doms = topology.get("domains", {})
    if not doms:
        missing = topology.get("source", {}).get("missing") or ["not read"]
        return f"domains not read: {missing[0]}"
    first = doms[min(doms, key=int)]
    chain = " < ".join(f"{name}({len(d['span']) if d['span'] else '?'})"
                       for d, name in zip(first, chain_keys(first)))
    return f"{chain} (CPU {min(doms, key=int)}; {len(doms)} CPUs)"
