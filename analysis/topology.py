"""The machine's shape as data: its CPUs, its scheduling domains, and at which level of them each
migration happened.

Needs no events: the manifest's ``topology`` (:func:`harmony.probes.domains.read`, the contract
in TOPOLOGY-CONTRACT.md), read where the run measured (the host, or the guest of a kernel under
test). Tables: :func:`df_domains` (:data:`harmony.analysis.tables.DOMAINS`) and :func:`df_cpus`
(:data:`harmony.analysis.tables.CPUS`).

A migration's level is the lowest domain of the destination CPU whose span holds the source CPU
(:func:`migration_level`): the kernel's own rule for an active balance
(``active_load_balance_cpu_stop`` looks for the lowest domain of the target spanning the busiest
CPU), and the level a periodic or new-idle balance that made the move ran at: ``load_balance``
at a domain pulls from a group of that domain other than the puller's own, and the groups of a
domain are the spans of its child domains, so the source is outside the child's span and inside
the domain's (kernel/sched/fair.c ``find_busiest_group``; the overlapping groups of a NUMA domain
of an asymmetric machine may break this). A wake-up's level is where the wakee landed from where
it last ran, which ``select_task_rq_fair`` bounds by the wake-affine domain (``sd_llc`` and the
domains with SD_WAKE_AFFINE).

The level's index is the destination CPU's (the levels of two CPUs can differ on an asymmetric
machine: a CPU without an SMT sibling has no SMT domain); its key is the domain's name made unique
along the CPU's chain (:func:`harmony.probes.domains.chain_keys`: ``domain<index>`` where the
kernel names none; the second domain of a name up the chain suffixed 2, so that an asymmetric NUMA
machine's two ``NUMA`` levels are ``NUMA`` and ``NUMA2``). Counts by level are counts by key,
everywhere a level is one: the migrations' ``level_name``, the summary's ``migrations_by_level``,
the manifest's ``schedstat_agreement.levels``, the domains table's ``name``, the predictions'
domain, the report's and doctor's chains.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.tables import CPUS, DOMAINS
from harmony.core.columns import STR_DTYPE
from harmony.core.osutil import format_cpulist, parse_cpulist
from harmony.probes.domains import chain_keys

#: where two CPUs sit relative to each other (:func:`relation`), nearest first
RELATIONS = ("same", "smt", "llc", "package", "node", "remote")
#: a migration's level where none applies (a move to the same CPU, no domains known)
NO_LEVEL = -1


def domains_of(manifest_or_topology: dict | None) -> dict[int, list[dict]]:
    """{cpu: [domain, ...]} (int CPU keys) from a manifest (its ``topology``) or a topology
    itself, each domain a copy with its level ``key`` (:func:`chain_keys`); {} where none was
    read (an import, an older run, a kernel that shows none)."""
    topo = manifest_or_topology or {}
    topo = topo.get("topology", topo) or {}
    return {int(c): keyed(d) for c, d in (topo.get("domains") or {}).items()}


def keyed(chain: list[dict]) -> list[dict]:
    """One CPU's domains, copies with their level ``key`` (:func:`chain_keys`)."""
    return [{**d, "key": k} for d, k in zip(chain, chain_keys(list(chain)))]


def _int_domains(domains: dict) -> dict[int, list[dict]]:
    """{cpu: [domain with its key]} from a manifest, a topology or {cpu: [domain...]}."""
    if domains and all(isinstance(k, int) for k in domains):
        return {c: keyed(ds) for c, ds in domains.items()}
    return domains_of(domains)


def df_domains(manifest: dict) -> pd.DataFrame:
    """One row per (cpu, index) of the run's domains (columns: :data:`tables.DOMAINS`), sorted
    by (cpu, index); empty where the run read none."""
    rows: dict[str, list] = {n: [] for n in DOMAINS.names}
    for cpu, doms in sorted(domains_of(manifest).items()):
        for d in doms:
            span = d.get("span")
            rows["cpu"].append(cpu)
            rows["index"].append(int(d["index"]))
            rows["name"].append(d["key"])
            rows["span"].append(format_cpulist(span) if span else "")
            rows["span_weight"].append(len(span) if span else 0)
            rows["flags"].append(" ".join(d["flags"]) if d.get("flags") is not None else "")
            for k in ("min_interval", "max_interval", "busy_factor", "imbalance_pct",
                      "cache_nice_tries", "max_newidle_lb_cost"):
                v = d.get(k)
                rows[k].append(float("nan") if v is None else float(v))
    return DOMAINS.frame({n: v if DOMAINS.columns[i].dtype == "str"
                          else np.asarray(v, DOMAINS.columns[i].dtype)
                          for i, (n, v) in enumerate(rows.items())})


def df_cpus(manifest: dict) -> pd.DataFrame:
    """One row per CPU of the run's topology (columns: :data:`tables.CPUS`), by CPU; -1 where
    sysfs did not say."""
    topo = (manifest or {}).get("topology", manifest) or {}
    cpus = sorted((int(c), v) for c, v in (topo.get("cpus") or {}).items())

    def col(key):
        return np.asarray([-1 if v.get(key) is None else int(v[key]) for _, v in cpus], np.int32)

    return CPUS.frame({
        "cpu": np.asarray([c for c, _ in cpus], np.int32),
        "package": col("package"), "die": col("die"), "core": col("core"), "llc": col("llc"),
        "node": col("node"),
        "smt_siblings": [format_cpulist(v["thread_siblings"]) if v.get("thread_siblings")
                         else "" for _, v in cpus]})


def migration_level(dst_cpu: int, src_cpu: int, domains: dict) -> tuple[int | None, str | None]:
    """(index, key) of the lowest domain of ``dst_cpu`` whose span holds ``src_cpu``
    (``domains``: a manifest, a topology, or {cpu: [domain...]}); (None, None) when the CPUs
    are the same or no domain of the destination spans the source."""
    doms = _int_domains(domains)
    if dst_cpu == src_cpu:
        return None, None
    for d in doms.get(int(dst_cpu), []):
        if d.get("span") and src_cpu in d["span"]:
            return int(d["index"]), d["key"]
    return None, None


class LevelTable:
    """The level of every (destination, source) pair of CPUs at once: ``index[dst, src]`` (int16,
    :data:`NO_LEVEL` where none) and ``key_code[dst, src]`` into ``keys`` (the level keys,
    lowest first)."""

    def __init__(self, domains: dict):
        doms = _int_domains(domains)
        n = max([*doms, *(c for ds in doms.values() for d in ds for c in (d.get("span") or ()))],
                default=-1) + 1
        self.n = n
        self.index = np.full((n, n), NO_LEVEL, np.int16)
        seen = np.full((n, n), -1, np.int16)        # the key's number in ``met``
        met: dict[str, list[int]] = {}              # key -> its index on each CPU
        for dst, ds in doms.items():
            for d in sorted(ds, key=lambda d: -int(d["index"])):    # lower levels overwrite
                i = int(d["index"])
                key = d["key"]
                met.setdefault(key, []).append(i)
                span = [c for c in (d.get("span") or ()) if c != dst]
                self.index[dst, span] = i
                seen[dst, span] = list(met).index(key)
        # lowest first: by the mean of a key's indexes (an asymmetric machine's MC is index 0 on
        # a CPU without an SMT sibling, 1 on the others: after SMT), then as first met
        self.keys = sorted(met, key=lambda k: (np.mean(met[k]), list(met).index(k)))
        remap = np.asarray([self.keys.index(k) for k in met] or [0], np.int16)
        self.key_code = np.where(seen >= 0, remap[np.maximum(seen, 0)], -1).astype(np.int16)

    def of(self, dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(level index, key code) of each (dst, src) pair; NO_LEVEL / -1 where none (a CPU
        outside the table too)."""
        dst = np.asarray(dst, np.int64)
        src = np.asarray(src, np.int64)
        ok = (dst >= 0) & (dst < self.n) & (src >= 0) & (src < self.n)
        index = np.full(len(dst), NO_LEVEL, np.int16)
        code = np.full(len(dst), -1, np.int16)
        index[ok] = self.index[dst[ok], src[ok]]
        code[ok] = self.key_code[dst[ok], src[ok]]
        return index, code


def level_columns(src: np.ndarray, dst: np.ndarray, domains: dict | None) -> dict:
    """The migrations table's ``level`` (int16, :data:`NO_LEVEL` where none) and ``level_name``
    (category of the level keys, lowest first; missing where no level) of moves from ``src`` to
    ``dst``."""
    table = LevelTable(domains or {})
    index, code = table.of(dst, src)
    # categories of strings even when there are none: stored, an empty category of no type
    # would read back as objects
    keys = pd.Index(table.keys, dtype=STR_DTYPE)
    return {"level": index,
            "level_name": pd.Categorical.from_codes(code.astype(np.int32), categories=keys)}


def relation(cpu_a: int, cpu_b: int, cpus_df: pd.DataFrame) -> str:
    """Where two CPUs sit relative to each other (:data:`RELATIONS`, from :func:`df_cpus`):
    ``same``; ``smt`` (thread siblings of one core); ``llc`` (share a last-level cache);
    ``package`` (one package and one NUMA node, other LLCs); ``node`` (one NUMA node, other
    packages); ``remote`` (other NUMA nodes). A fact sysfs did not give (-1) counts as shared
    for the node, as different for the others."""
    if cpu_a == cpu_b:
        return "same"
    rows = cpus_df.set_index("cpu")
    a, b = rows.loc[cpu_a], rows.loc[cpu_b]
    if a["node"] >= 0 and b["node"] >= 0 and a["node"] != b["node"]:
        return "remote"
    sib = a["smt_siblings"]
    if sib and cpu_b in parse_cpulist(sib):
        return "smt"
    if a["llc"] >= 0 and a["llc"] == b["llc"]:
        return "llc"
    if a["package"] >= 0 and a["package"] == b["package"]:
        return "package"
    return "node"


def counts_by_level(migrations: pd.DataFrame, t0: int, t_end: int) -> dict[str, dict[str, int]]:
    """The summary's ``migrations_by_level``: the moves of the window [t0, t_end] to another CPU,
    by level key (lowest level first) and cause ({key: {cause: count}}, only the causes seen);
    a move no domain spans (level -1) under ``"none"``."""
    ts = migrations["ts"].to_numpy()
    mig = migrations[(ts >= t0) & (ts <= t_end)
                     & (migrations["src_cpu"].to_numpy() != migrations["dst_cpu"].to_numpy())]
    if "level_name" not in mig.columns:
        return {}
    key = mig["level_name"].astype(object).where(mig["level"].to_numpy() >= 0, "none")
    out: dict[str, dict[str, int]] = {}
    order = [*mig["level_name"].cat.categories, "none"]
    counts = pd.crosstab(key, mig["cause"].astype(str)) if len(mig) else pd.DataFrame()
    for k in order:
        if k in counts.index:
            row = counts.loc[k]
            out[str(k)] = {str(c): int(n) for c, n in row.items() if n}
    return out


def domain_rows(manifest: dict) -> list[list[str]]:
    """A text table of the domains of the run's lowest CPU, lowest level first: level, name,
    span, interval (ms), busy_factor, imbalance_pct, cache_nice_tries, flags (short)."""
    doms = domains_of(manifest)
    if not doms:
        return []
    cpus = [c for c in manifest.get("cpus", []) if c in doms] or sorted(doms)
    rows = []
    for d in doms[cpus[0]]:
        g = {k: "?" if d.get(k) is None else str(d[k]) for k in d}
        flags = " ".join(f.removeprefix("SD_") for f in (d.get("flags") or [])) or "?"
        rows.append([str(d["index"]), d["key"],
                     format_cpulist(d["span"]) if d.get("span") else "?",
                     f"{g.get('min_interval', '?')}-{g.get('max_interval', '?')}",
                     g.get("busy_factor", "?"), g.get("imbalance_pct", "?"),
                     g.get("cache_nice_tries", "?"), flags])
    return rows


DOMAIN_HEADER = ["level", "name", "span", "interval ms", "busy_factor", "imbalance_pct",
                 "cache_nice_tries", "flags"]
