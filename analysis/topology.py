"""The machine's shape as data: CPUs, caches, nodes and the kernel's scheduling domains.

The API of the topology data contract (/work/TOPOLOGY-CONTRACT.md, issue 45): a run's manifest
holds ``manifest["topology"]`` = {"cpus": {"<cpu>": {package, die, core, thread_siblings, llc,
node}}, "domains": {"<cpu>": [{index, name, span, flags, min_interval, max_interval, busy_factor,
imbalance_pct, cache_nice_tries, max_newidle_lb_cost}, ... lowest level first]}, "source": {...},
"numa_balancing": {...}}, whether the machine was read (host, guest) or made up
(:mod:`harmony.analysis.machines`, the simulator's).

This module reads that data; it reads nothing from the running kernel.
"""

from __future__ import annotations

import pandas as pd

from harmony.osutil import format_cpulist

#: where two CPUs sit relative to each other (:func:`relation`), nearest first: the same CPU, SMT
#: siblings of one core, cores sharing a last-level cache, LLCs of one package, packages of one
#: NUMA node, and CPUs on different nodes
RELATIONS = ("same", "smt", "llc", "package", "node", "remote")

DOMAIN_COLUMNS = ["cpu", "index", "name", "span", "span_weight", "flags", "min_interval",
                  "max_interval", "busy_factor", "imbalance_pct", "cache_nice_tries",
                  "max_newidle_lb_cost"]
CPU_COLUMNS = ["cpu", "package", "die", "core", "llc", "node", "smt_siblings"]


def topology_of(manifest: dict) -> dict:
    """``manifest["topology"]``, or {} for a run recorded without it."""
    return manifest.get("topology") or {}


def df_domains(manifest: dict) -> pd.DataFrame:
    """One row per (cpu, domain index): cpu (int), index (int, 0 = lowest), name (str or None),
    span (str: a cpulist), span_weight (int), flags (str: space-separated, or None),
    min_interval, max_interval (int ms, or None), busy_factor, imbalance_pct, cache_nice_tries
    (int or None), max_newidle_lb_cost (int ns, or None). Empty (with the columns) when the
    manifest has no domains."""
    rows = []
    for cpu, levels in (topology_of(manifest).get("domains") or {}).items():
        for d in levels:
            span = list(d.get("span") or [])
            flags = d.get("flags")
            rows.append({"cpu": int(cpu), "index": int(d["index"]), "name": d.get("name"),
                         "span": format_cpulist(span), "span_weight": len(span),
                         "flags": " ".join(flags) if flags is not None else None,
                         **{k: d.get(k) for k in DOMAIN_COLUMNS[6:]}})
    df = pd.DataFrame(rows, columns=DOMAIN_COLUMNS)
    return df.sort_values(["cpu", "index"], kind="stable").reset_index(drop=True)


def df_cpus(manifest: dict) -> pd.DataFrame:
    """One row per CPU: cpu, package, die, core, llc (the lowest CPU of its last-level-cache
    group, or None), node (or None), smt_siblings (str: the cpulist of its core's threads)."""
    rows = []
    for cpu, c in (topology_of(manifest).get("cpus") or {}).items():
        rows.append({"cpu": int(cpu), "package": c.get("package"), "die": c.get("die"),
                     "core": c.get("core"), "llc": c.get("llc"), "node": c.get("node"),
                     "smt_siblings": format_cpulist(c.get("thread_siblings") or [int(cpu)])})
    df = pd.DataFrame(rows, columns=CPU_COLUMNS)
    return df.sort_values("cpu", kind="stable").reset_index(drop=True)


def migration_level(dst_cpu: int, src_cpu: int, domains: dict) -> tuple[int | None, str | None]:
    """(index, name) of the lowest domain of ``dst_cpu`` whose span holds ``src_cpu``: the level
    at which the destination's balancer sees the source (the kernel's own rule for active
    balance); (None, None) when they are one CPU or no domain of ``dst_cpu`` spans it.
    ``domains``: the contract's ``topology["domains"]`` (keys are CPU numbers as strings)."""
    if dst_cpu == src_cpu:
        return None, None
    for d in domains.get(str(int(dst_cpu))) or domains.get(int(dst_cpu)) or ():
        if int(src_cpu) in (d.get("span") or ()):
            return int(d["index"]), d.get("name")
    return None, None


def relation(cpu_a: int, cpu_b: int, cpus_df: pd.DataFrame) -> str:
    """Where two CPUs sit relative to each other (:data:`RELATIONS`): "same", "smt" (threads of
    one core), "llc" (one last-level cache, different cores), "package" (one package, different
    LLCs), "node" (one NUMA node, different packages), "remote" (different nodes). A CPU
    ``cpus_df`` (:func:`df_cpus`) does not list is a ValueError."""
    if cpu_a == cpu_b:
        return "same"
    rows = cpus_df.set_index("cpu")
    for c in (cpu_a, cpu_b):
        if c not in rows.index:
            raise ValueError(f"CPU {c} is not in the machine's topology")
    a, b = rows.loc[cpu_a], rows.loc[cpu_b]
    if str(cpu_b) in _siblings(a["smt_siblings"]) and a["package"] == b["package"]:
        return "smt"
    if a["llc"] is not None and not pd.isna(a["llc"]) and a["llc"] == b["llc"]:
        return "llc"
    if _known(a["node"]) and _known(b["node"]) and a["node"] != b["node"]:
        return "remote"
    if a["package"] == b["package"]:
        return "package"
    return "node"


def _known(v) -> bool:
    return v is not None and not pd.isna(v)


def _siblings(cpulist: str) -> set[str]:
    from harmony.osutil import parse_cpulist

    return {str(c) for c in parse_cpulist(cpulist)} if cpulist else set()
