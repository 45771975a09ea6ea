"""What a run did at each level of the machine: its moves by where source and destination sit.

Needs: the migrations table (src_cpu, dst_cpu, event_cpu, cause, t) and the manifest's topology
(the contract's ``manifest["topology"]``, :mod:`harmony.analysis.topology`); nothing else. A run
recorded without a topology has no levels: every function here then returns its empty result.

- :func:`df_move_levels`: every move with its relation (smt, llc, package, node, remote:
  :data:`harmony.analysis.topology.RELATIONS`) and its level (the destination's lowest domain
  spanning the source: ``level``, ``level_name``; the migrations table's own columns where the
  pipeline wrote them);
- :func:`df_locality`: per relation, the moves against the CPU pairs of the set at that
  relation: a policy blind to the machine's shape moves tasks between pairs in proportion to
  their number (a locality index of 1 at every level); a policy that keeps tasks near moves
  more between near pairs (above 1) than far ones (below 1);
- :func:`df_wake_llc`: every wake-up move, and whether it stayed in the last-level cache of the
  task's previous CPU or of its waker's (the fair class's select_idle_sibling, which never
  leaves it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.topology import RELATIONS, df_cpus, level_columns


def topology_of(manifest: dict) -> dict:
    """The manifest's ``topology`` (the contract's), or {} for a run recorded without it."""
    return (manifest or {}).get("topology") or {}

#: the relations a move can have (not "same": a move is between two CPUs)
MOVE_RELATIONS = RELATIONS[1:]

MOVE_LEVEL_COLUMNS = ["t", "pid", "src_cpu", "dst_cpu", "event_cpu", "cause", "relation",
                      "level", "level_name"]


def relation_table(cpus: list[int], manifest: dict) -> dict[tuple[int, int], str]:
    """The relation of every ordered pair of distinct CPUs of ``cpus`` known to the topology:
    :func:`harmony.analysis.topology.relation`'s rule (the contract's: "remote" across nodes,
    then "smt" within a core's threads, "llc", "package", else "node"), applied to the whole
    table at once (asked pair by pair, it reads the table anew each time: 15 s for the levels
    of a 64-CPU machine). tests/test_levels.py holds it to ``relation`` on every pair."""
    table = df_cpus(manifest)
    t = table[table["cpu"].isin(list(cpus))]
    cpu = t["cpu"].to_numpy(int)
    node, llc, package = (t[c].to_numpy(int) for c in ("node", "llc", "package"))
    sib = [set(_cpulist(x)) if x else set() for x in t["smt_siblings"]]
    out = {}
    for i in range(len(cpu)):
        for j in range(len(cpu)):
            if i == j:
                continue
            if node[i] >= 0 and node[j] >= 0 and node[i] != node[j]:
                rel = "remote"
            elif cpu[j] in sib[i]:
                rel = "smt"
            elif llc[i] >= 0 and llc[i] == llc[j]:
                rel = "llc"
            elif package[i] >= 0 and package[i] == package[j]:
                rel = "package"
            else:
                rel = "node"
            out[(int(cpu[i]), int(cpu[j]))] = rel
    return out


def _cpulist(text: str) -> list[int]:
    from harmony.core.osutil import parse_cpulist

    return parse_cpulist(text)


def df_move_levels(migrations: pd.DataFrame, manifest: dict,
                   window: bool = True) -> pd.DataFrame:
    """One row per move (in the measured window, 0 <= t <= its end, with ``window``): t (s since
    t0), pid, src_cpu, dst_cpu, event_cpu (int), cause (str), relation (str: of source and
    destination), level (Int64: the destination's lowest domain index spanning the source; <NA>
    when none does), level_name (str or None). Empty without a topology. The capture runs on a
    little past the window while the tasks are stopped: those moves (the teardown's) are not
    the policy's answer to the run's imbalance."""
    topo = topology_of(manifest)
    if not topo.get("cpus") or migrations is None or migrations.empty:
        return pd.DataFrame(columns=MOVE_LEVEL_COLUMNS)
    mig = migrations
    if window:
        t = migrations["t"].to_numpy(float)
        t0, t_end = manifest.get("t0_ns"), manifest.get("end_ns")
        end = (t_end - t0) / 1e9 if t0 is not None and t_end is not None else np.inf
        mig = migrations[(t >= 0) & (t <= end)]
    mig = mig[mig["src_cpu"] != mig["dst_cpu"]]
    cpus_df = df_cpus(manifest)
    known = set(cpus_df["cpu"])
    mig = mig[mig["src_cpu"].isin(known) & mig["dst_cpu"].isin(known)]
    src, dst = mig["src_cpu"].to_numpy(int), mig["dst_cpu"].to_numpy(int)
    rel = relation_table(sorted(set(src) | set(dst)), manifest)
    # the pipeline's level columns (-1: none), else the same from the topology, in one table
    cols = mig if {"level", "level_name"} <= set(mig.columns) else level_columns(src, dst, topo)
    lv = np.asarray(cols["level"], int)
    level = [None if v < 0 else int(v) for v in lv]
    name = [None if v < 0 else str(n) for v, n in zip(lv, pd.Series(cols["level_name"],
                                                                      dtype=object))]
    return pd.DataFrame({
        "t": mig["t"].to_numpy(float), "pid": mig["pid"].to_numpy(),
        "src_cpu": src, "dst_cpu": dst,
        "event_cpu": (mig["event_cpu"].to_numpy(int) if "event_cpu" in mig.columns
                      else np.full(len(mig), -1)),
        "cause": mig["cause"].astype(str).to_numpy() if "cause" in mig.columns
        else np.full(len(mig), "unknown"),
        "relation": [rel[(a, b)] for a, b in zip(src, dst)],
        "level": pd.array(level, dtype="Int64"), "level_name": name,
    }, columns=MOVE_LEVEL_COLUMNS)


def pair_counts(cpus: list[int], manifest: dict) -> dict[str, int]:
    """Ordered pairs of distinct CPUs of ``cpus`` at each relation ({} without a topology)."""
    topo = topology_of(manifest)
    if not topo.get("cpus"):
        return {}
    out = dict.fromkeys(MOVE_RELATIONS, 0)
    for rel in relation_table(cpus, manifest).values():
        out[rel] += 1
    return {k: v for k, v in out.items() if v}


LOCALITY_COLUMNS = ["relation", "moves", "per_s", "move_share", "pairs", "pair_share", "locality"]


def df_locality(moves: pd.DataFrame, cpus: list[int], manifest: dict, seconds: float,
                causes=None) -> pd.DataFrame:
    """Per relation present among the set's CPU pairs: moves (int: of ``causes`` only, when
    given), per_s (float: per second of ``seconds``), move_share (float: of all such moves; NaN
    without any), pairs (int: ordered CPU pairs of the set at that relation), pair_share (float),
    locality (float: move_share / pair_share: 1 for a policy blind to the machine's shape, NaN
    without moves)."""
    pairs = pair_counts(cpus, manifest)
    if not pairs:
        return pd.DataFrame(columns=LOCALITY_COLUMNS)
    m = moves if causes is None else moves[moves["cause"].isin(list(causes))]
    counts = m["relation"].value_counts()
    total, npairs = int(len(m)), sum(pairs.values())
    rows = []
    for rel, n_pairs in pairs.items():
        n = int(counts.get(rel, 0))
        share = n / total if total else float("nan")
        rows.append({"relation": rel, "moves": n, "per_s": n / seconds if seconds > 0 else 0.0,
                     "move_share": share, "pairs": n_pairs, "pair_share": n_pairs / npairs,
                     "locality": share / (n_pairs / npairs) if total else float("nan")})
    return pd.DataFrame(rows, columns=LOCALITY_COLUMNS)


WAKE_LLC_COLUMNS = ["t", "pid", "src_cpu", "dst_cpu", "waker_cpu", "in_prev_llc",
                    "in_waker_llc", "in_llc"]


def df_wake_llc(moves: pd.DataFrame, manifest: dict) -> pd.DataFrame:
    """Every wake-up move (cause wakeup) of :func:`df_move_levels`: t, pid, src_cpu (its
    previous CPU), dst_cpu, waker_cpu (the CPU that recorded the move: the waker's), in_prev_llc,
    in_waker_llc (bool: the destination shares the last-level cache of the previous CPU, of the
    waker's), in_llc (either)."""
    w = moves[moves["cause"] == "wakeup"]
    if w.empty:
        return pd.DataFrame(columns=WAKE_LLC_COLUMNS)
    llc = df_cpus(manifest).set_index("cpu")["llc"].to_dict()

    def same(a, b):
        return a in llc and b in llc and llc[a] >= 0 and llc[a] == llc[b]

    src, dst, waker = (w[c].to_numpy(int) for c in ("src_cpu", "dst_cpu", "event_cpu"))
    prev = np.array([same(a, b) for a, b in zip(src, dst)], bool)
    wk = np.array([same(a, b) for a, b in zip(waker, dst)], bool)
    return pd.DataFrame({"t": w["t"].to_numpy(float), "pid": w["pid"].to_numpy(),
                         "src_cpu": src, "dst_cpu": dst, "waker_cpu": waker,
                         "in_prev_llc": prev, "in_waker_llc": wk, "in_llc": prev | wk},
                        columns=WAKE_LLC_COLUMNS)


def moves_by_relation(run, moves: pd.DataFrame | None = None) -> dict:
    """A run's summary's ``moves_by_relation`` (:data:`harmony.experiments.base.LEVEL_SUMMARY`):
    {relation: {"moves", "per_s", "locality", "causes": {cause: moves}}} over the measured
    window ({} without a topology); ``moves``: its :func:`df_move_levels`, if made already."""
    m = run.manifest
    moves = df_move_levels(run.migrations, m) if moves is None else moves
    seconds = float(m.get("measured_s") or 0.0)
    loc = df_locality(moves, m["cpus"], m, seconds)
    by_rel = {}
    for row in loc.itertuples():
        causes = moves[moves["relation"] == row.relation]["cause"].value_counts()
        by_rel[row.relation] = {"moves": int(row.moves), "per_s": float(row.per_s),
                                "locality": None if np.isnan(row.locality)
                                else float(row.locality),
                                "causes": {str(k): int(v) for k, v in causes.items()}}
    return by_rel


FINAL_COLUMNS = ["cpu", "tasks", "core", "llc", "node", "package", "smt"]


def df_queue_means(runqueue: pd.DataFrame, cpus: list[int], ts_from: int,
                   ts_to: int) -> pd.Series:
    """Each CPU's experiment tasks (running or waiting), time-averaged over [ts_from, ts_to):
    a Series indexed by CPU (0 for a CPU without a row)."""
    out = {}
    for c in cpus:
        q = runqueue[runqueue["cpu"] == c]
        ts, nr = q["ts"].to_numpy(np.int64), q["nr"].to_numpy(float)
        if not len(ts) or ts_to <= ts_from:
            out[c] = 0.0
            continue
        edges = np.clip(np.append(ts, ts_to), ts_from, ts_to)
        out[c] = float((nr * np.diff(edges)).sum() / (ts_to - ts_from))
    return pd.Series(out, dtype=float)


def final_placement(run, last_fraction: float = 0.25) -> pd.DataFrame | None:
    """Where the tasks ended: per CPU of the set, the experiment tasks on it time-averaged over
    the run's last ``last_fraction`` (the spread experiment's ``settle_s`` when it has one):
    cpu, tasks (float), core, llc, node, package (its place), smt (bool: its core has several
    threads). None without a topology."""
    m = run.manifest
    if not topology_of(m).get("cpus"):
        return None
    t0, t_end = m["t0_ns"], m["end_ns"]
    settle = (m.get("params") or {}).get("settle_s")
    window = int(settle * 1e9) if settle else int((t_end - t0) * last_fraction)
    means = df_queue_means(run.runqueue, m["cpus"], max(t0, t_end - window), t_end)
    place = df_cpus(m).set_index("cpu")
    rows = []
    for c in m["cpus"]:
        p = place.loc[c]
        rows.append({"cpu": c, "tasks": means.get(c, 0.0), "core": (p["package"], p["core"]),
                     "llc": p["llc"], "node": p["node"], "package": p["package"],
                     "smt": "," in p["smt_siblings"] or "-" in p["smt_siblings"]})
    return pd.DataFrame(rows, columns=FINAL_COLUMNS)
