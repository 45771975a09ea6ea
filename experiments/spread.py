"""Spread: N tasks released on one CPU -- where on the machine do they end up?

N CPU-bound tasks start on the first CPU of the set and are released to the whole set at t0.
The question is the order in which the balancer uses the machine's levels: does it fill cores
before SMT siblings (the fair class's SD_PREFER_SIBLING), spread over LLCs and nodes, or keep
a few tasks on one node (the NUMA level's ``imb_numa_nr``)? Measures, from the machine's
topology (:mod:`harmony.analysis.topology`; a run without one measures the placement only):

- where the tasks are at the end (time-averaged over the last ``settle_s``): CPUs, cores, LLCs
  and nodes used, cores holding two tasks while another core is idle, the nodes' difference;
- when the first task arrived at each relation to the source CPU (its SMT sibling, a core of
  its LLC, another LLC, another node) and the order of those arrivals;
- the moves by relation and cause, among them the active balances that move a lone running task.
"""

from __future__ import annotations

from pathlib import Path

from harmony.analysis.levels import MOVE_RELATIONS, df_move_levels, final_placement, relation_table
from harmony.experiments.base import Experiment, Metric, Param, percent, pick, positive, task_class
from harmony.experiments.single_source import SingleSource
from harmony.workload.tasks import layout_tasks


class Spread(Experiment):
    name = "spread"
    question = "Released on one CPU, where do N tasks end up: cores before siblings, nodes " \
               "before LLCs?"
    thesis = "not in the thesis (the policy at each level of the machine)"
    workload = frozenset({"duty", "ntasks"})
    params = (
        Param("duration", 3.0, "float", "seconds measured after t0", positive),
        Param("ntasks", lambda P: max(2, P // 2), "int", "tasks released on the first CPU of the "
              "set (default P / 2: one per core on a machine of two threads per core)", positive),
        Param("duty", 100.0, "float", "CPU demand of every task in percent", percent),
        Param("settle_s", 1.0, "float", "the placement is time-averaged over the run's last "
              "settle_s", positive),
    )

    def validate(self, p, cpus):
        if len(cpus) < 2:
            raise ValueError(f"spread needs at least 2 CPUs; the set has {len(cpus)}")
        if p["settle_s"] >= p["duration"]:
            raise ValueError(f"settle_s={p['settle_s']} is not shorter than the run "
                             f"(duration={p['duration']})")

    def tasks(self, p, cpus):
        return layout_tasks([p["ntasks"]], cpus, duty=p["duty"], **task_class(p))

    def from_layout(self, placed, cpus):
        """``ntasks``: the tasks on the first CPU, when every one of them is there at t0."""
        return {"ntasks": placed[0] if placed[0] and not any(placed[1:]) else None}

    summary = (
        *pick(SingleSource.summary, "ntasks", "ncpus"),
        Metric("source_cpu", "cpu", "the CPU the tasks were released on"),
        Metric("cpus_used", "count", "CPUs holding half a task or more at the end"),
        Metric("cores_used", "count", "cores holding half a task or more at the end",
               none_when="no topology"),
        Metric("llcs_used", "count", "last-level caches used at the end", none_when="no topology"),
        Metric("nodes_used", "count", "NUMA nodes used at the end", none_when="no topology"),
        Metric("max_per_cpu", "tasks", "the most tasks on one CPU at the end"),
        Metric("cores_doubled", "count", "cores holding two tasks or more at the end while "
               "another core of the set is idle", none_when="no topology"),
        Metric("cores_before_siblings", "bool", "tasks sit on distinct cores at the end (no core "
               "doubled while one is idle)", none_when="no topology, a machine without SMT, or "
               "more tasks than cores"),
        Metric("node_difference", "tasks", "the most loaded node's tasks less the least loaded's "
               "at the end", none_when="no topology or one node"),
        *(Metric(f"first_{rel}_s", "s", f"the first arrival of a task at a CPU at relation "
                 f"{rel} to the source, after t0", none_when="none arrived (or no such CPU)")
          for rel in MOVE_RELATIONS),
        Metric("spread_order", "name", "the relations in the order tasks first reached them "
               "(\"smt,llc,remote\")", none_when="no topology or no move"),
        Metric("migrations", "count", "migrations from t0 on"),
        Metric("active_moves", "count", "of those, active balances (a lone running task pushed)"),
    )

    def analyse(self, run) -> dict:
        m, cpus, p = run.manifest, run.manifest["cpus"], run.manifest["params"]
        src = cpus[0]
        mig = run.migrations[run.migrations["t"] >= 0]
        out = {"ntasks": int(len(run.tasks)), "ncpus": len(cpus), "source_cpu": src,
               "migrations": int(len(mig)),
               "active_moves": int((mig["cause"].astype(str) == "active").sum())
               if "cause" in mig else 0}
        fin = final_placement(run)
        if fin is None:
            return out | _no_topology(run, cpus, p)
        moves = df_move_levels(run.migrations, m)
        rel = relation_table(cpus, m)
        to_src = {d: rel.get((src, d), "same") for d in set(moves["dst_cpu"])}
        first = {}
        for rel in MOVE_RELATIONS:
            # a task reaching a CPU at this relation to the source, from anywhere
            at = moves[[to_src[d] == rel for d in moves["dst_cpu"]]] if len(moves) else moves
            first[rel] = float(at["t"].min()) if len(at) else None
        order = [r for r, t in sorted(((r, t) for r, t in first.items() if t is not None),
                                      key=lambda kv: kv[1])]
        used = fin[fin["tasks"] >= 0.5]
        cores = fin.groupby("core")["tasks"].sum()
        doubled = int((cores.round() >= 2).sum())
        idle_cores = int((cores.round() == 0).sum())
        n = int(len(run.tasks))
        nodes = fin.groupby("node")["tasks"].sum()
        return out | {
            "cpus_used": int(len(used)), "cores_used": int(used["core"].nunique()),
            "llcs_used": int(used["llc"].nunique()), "nodes_used": int(used["node"].nunique()),
            "max_per_cpu": float(fin["tasks"].max()),
            "cores_doubled": doubled if idle_cores else 0,
            "cores_before_siblings": (None if not fin["smt"].any() or n > cores.size
                                      else not (doubled and idle_cores)),
            "node_difference": float(nodes.max() - nodes.min()) if nodes.size > 1 else None,
            **{f"first_{rel}_s": first[rel] for rel in MOVE_RELATIONS},
            "spread_order": ",".join(order) or None,
        }

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_levels import plot_spread

        m = run.manifest
        return [plot_spread(run.runqueue, m, run.migrations, fig_dir / "spread.png")]

    def describe(self, s: dict) -> list[str]:
        def t(v):
            return "-" if v is None else f"{v * 1000:.1f} ms"

        lines = [f"tasks / CPUs                 {s['ntasks']} / {s['ncpus']} "
                 f"(released on CPU {s['source_cpu']})",
                 f"at the end                   {s['cpus_used']} CPUs used, at most "
                 f"{s['max_per_cpu']:.2f} tasks on one"]
        if s.get("cores_used") is not None:
            lines.append(f"cores / LLCs / nodes used    {s['cores_used']} / {s['llcs_used']} / "
                         f"{s['nodes_used']}; cores doubled while one idles: {s['cores_doubled']}")
        if s.get("node_difference") is not None:
            lines.append(f"nodes' difference            {s['node_difference']:.2f} tasks")
        firsts = ", ".join(f"{rel} {t(s[f'first_{rel}_s'])}" for rel in MOVE_RELATIONS
                           if s.get(f"first_{rel}_s") is not None)
        if firsts:
            lines.append(f"first arrival by relation    {firsts} (order: {s['spread_order']})")
        lines.append(f"migrations                   {s['migrations']} ({s['active_moves']} "
                     "active balances)")
        return lines


def _no_topology(run, cpus, p) -> dict:
    """The placement keys of a run without a topology: what the run queues alone say."""
    from harmony.analysis.levels import df_queue_means

    m = run.manifest
    t_end = m["end_ns"]
    means = df_queue_means(run.runqueue, cpus, max(m["t0_ns"], t_end - int(p["settle_s"] * 1e9)),
                           t_end)
    return {"cpus_used": int((means >= 0.5).sum()), "cores_used": None, "llcs_used": None,
            "nodes_used": None, "max_per_cpu": float(means.max()), "cores_doubled": None,
            "cores_before_siblings": None, "node_difference": None,
            **{f"first_{rel}_s": None for rel in MOVE_RELATIONS}, "spread_order": None}
