"""What the fair class's balancer design implies at each level, from the kernel's own domains,
stated as predictions and checked against what a run measured.

Needs: the manifest's topology (the contract's ``manifest["topology"]``) and HZ (the system's
facts), the run's migrations, and for some checks its tasks, runs and summary. Each prediction
was verified against kernel/sched/fair.c and topology.c of Linux 6.1 and 6.12 (Debian's
6.1.x and 6.12.117 sources); where they differ, the row says so:

1. *Detection slows with the level.* ``sched_balance_domains`` (6.1 ``rebalance_domains``)
   balances a domain when ``get_sd_balance_interval`` has passed: ``balance_interval`` ms on an
   idle CPU, ``balance_interval x busy_factor`` ms less one jiffy on a busy one, clamped to
   ``HZ x CPUs / 10`` jiffies; ``balance_interval`` starts at ``min_interval`` (the span's
   weight in ms), doubles while a balance finds nothing (up to ``max_interval``, twice the
   weight), and returns to ``min_interval`` when one finds an imbalance. Only the local group's
   first idle CPU (6.12: first idle *core*, then first idle SMT thread), or its first CPU when
   none is idle, balances a domain (``should_we_balance``); an idle one balances for the group
   and moves a task it may not run to a CPU of the group that may (LBF_DST_PINNED). So a pair
   placed at level L (:mod:`harmony.experiments.placement`) is balanced by the target itself,
   busy, every ``busy_factor x max_interval - 1 jiffy`` when its local group at L is the target
   alone (L is its lowest domain), and otherwise by an idle CPU of that group every
   ``max_interval`` (the nohz idle balance runs it at its own interval) -- as long as the
   target's group is below the domain's average load: the idle CPUs outside the set count in
   that average, and a group at or above it is balanced (``find_busiest_group``); then only the
   affinity path moves tasks (the source group's idle CPUs fail to pull what may not run on
   them, mark it ``group_imbalanced`` and retry every MAX_PINNED_INTERVAL). The cut's first
   pull comes within that period of the cut -- plus the time the cut takes (its tasks leave as
   they next run) and PREDICTION_SLACK_TICKS.
2. *An imbalance below imbalance_pct is left alone*: only when both groups are overloaded
   (the local group's type may not exceed the busiest's, and group_overloaded is the highest)
   does ``find_busiest_group`` (6.12 ``sched_balance_find_src_group``) compare loads: balanced
   when ``100 x busiest avg_load <= imbalance_pct x local avg_load`` (110 at SMT, 117
   elsewhere); with spare capacity in the local group the imbalance is counted in tasks or idle
   CPUs (``calculate_imbalance``) and the threshold is not consulted. ``avg_load`` is the
   group's PELT load over its *capacity* (``update_sg_lb_stats``), what ``scale_rt_capacity``
   leaves of its CPUs after the RT and deadline classes' averages: for tasks of equal load the
   ratio is the task counts' scaled by the capacities, and the run's SCHED_FIFO controller
   threads lower the capacity of the CPU they run on. The row bounds each CPU's capacity from
   what other tasks took of it in the window and gives a verdict only when the whole range is
   on one side of imbalance_pct (8 against 7 tasks, 114.3 %, is 2.4 % under 117). A clean
   test needs a pair at its lowest level (each group one CPU): where a group holds CPUs
   outside the set, their failed pulls mark it imbalanced (LBF_SOME_PINNED ->
   ``sgc->imbalance``) and the level moves a task whatever the ratio (``group_imbalanced``).
   The gate is the same in 6.1 and 6.12. The row says which case the run was in.
3. *Active balance of a lone running task* only when ``nr_balance_failed > cache_nice_tries + 2``
   (``imbalanced_active_balance``: 3 failures at SMT, 4 at LLC and package levels, 5 at NUMA):
   a domain's failures count only periodic balances, at least ``min_interval`` ms apart (a
   failure resets the interval to it), from 0 after a balanced domain: the first active move at
   level L after the release comes at least ``(cache_nice_tries + 2) x min_interval`` ms after
   t0.
4. *Cores before SMT siblings*: levels above SMT prefer siblings (SD_PREFER_SIBLING; 6.12 adds
   the group type ``group_smt_balance`` and ``sibling_imbalance``, which count tasks per core),
   so that N <= cores tasks end on N cores. *A NUMA level tolerates a small imbalance*:
   ``adjust_numa_imbalance`` leaves a difference of at most 2 tasks (NUMA_IMBALANCE_MIN) while
   the lighter node would hold at most ``imb_numa_nr`` tasks (topology.c: the node's LLC count,
   or an eighth of its CPUs when it is one LLC, at least 1; identical in 6.1 and 6.12). The
   groups' task counts are their CPUs' ``rq->nr_running``, every class: a balance while another
   task (the run's SCHED_FIFO controller threads among them) runs on the source node counts it,
   and 2 tasks plus that one exceed the allowance. 6.1 counts the difference in
   ``calculate_imbalance`` as nr_running less the local's; 6.12 through ``sibling_imbalance``,
   the same for nodes of as many cores.
5. *Wake-ups stay in the LLC*: without SD_BALANCE_WAKE (off in ``sd_init``),
   ``select_task_rq_fair`` picks the waker's or the previous CPU (``wake_affine``) and
   ``select_idle_sibling`` searches that CPU's LLC only: a wake-up move lands in the LLC of the
   task's previous CPU or of its waker's.
6. *sched_ext's default CPU selection has no level structure* (6.12 ``scx_select_cpu_dfl``:
   previous CPU if its core is idle, any idle core, previous CPU, any idle CPU; no LLC or node
   in it): under ``scx_simple`` moves fall on CPU pairs in proportion to their number at every
   level (a locality index within LOCALITY_FLAT_MIN..LOCALITY_FLAT_MAX).

Each check gives rows (:data:`ROW_KEYS`): what was predicted, what was measured, whether it
holds (None: not checkable in this run) and the tolerance, reasoned in
:mod:`harmony.analysis.thresholds`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harmony.analysis import thresholds as T
from harmony.analysis.levels import (df_locality, df_move_levels, df_wake_llc, final_placement,
                                     moves_by_relation, topology_of)
from harmony.analysis.topology import df_cpus, keyed, migration_level, relation

ROW_KEYS = ("check", "level", "domain", "predicted", "measured", "holds", "tolerance", "source")
#: fair.c: a domain whose tasks are all pinned away doubles its interval up to this (ms)
MAX_PINNED_INTERVAL = 512
#: the balance causes whose moves are a load balancer's decision
BALANCE_CAUSES = ("periodic", "newidle", "active")
NS = 1_000_000_000


# ----------------------------------------------------------------------------- kernel arithmetic

def hz_of(manifest: dict) -> int | None:
    """The kernel's HZ as the run's system facts give it (a VM's guest's), or None."""
    facts = manifest.get("under_test") or manifest.get("host") or {}
    hz = facts.get("hz")
    return int(hz) if hz else None


def online_cpus(manifest: dict) -> int:
    """The machine's CPU count: its topology's, else the facts'."""
    n = len(topology_of(manifest).get("cpus") or {})
    facts = manifest.get("under_test") or manifest.get("host") or {}
    return n or int(facts.get("ncpus") or len(manifest.get("cpus") or []) or 1)


def interval_ms(balance_interval: int, busy_factor: int, busy: bool, hz: int | None,
                ncpus: int) -> float:
    """``get_sd_balance_interval`` in ms: the interval (x busy_factor, less one jiffy, on a busy
    CPU) rounded up to jiffies, clamped to 1 .. HZ x CPUs / 10 jiffies. HZ unknown: ms as
    given (one jiffy taken as 1 ms)."""
    hz = hz or 1000
    ms = balance_interval * (busy_factor if busy else 1)
    jiffies = math.ceil(ms * hz / 1000) - (1 if busy else 0)
    jiffies = min(max(jiffies, 1), hz * ncpus // 10)
    return jiffies * 1000 / hz


def tick_ms(manifest: dict) -> float:
    return 1000 / (hz_of(manifest) or 1000)


def domain_of(topo: dict, cpu: int, index: int) -> dict | None:
    """``cpu``'s domain of that index, with its level ``key`` (:func:`harmony.analysis.topology.
    chain_keys`: the ring's second NUMA level is NUMA2), None if it has none."""
    for d in keyed((topo.get("domains") or {}).get(str(cpu)) or ()):
        if int(d["index"]) == int(index):
            return d
    return None


def pair_domain(manifest: dict, src: int, dst: int) -> tuple[dict | None, list[int]]:
    """(the destination's lowest domain spanning the source, the destination's local group in
    it: its span one level below, or the destination alone at its lowest level)."""
    topo = topology_of(manifest)
    index, _ = migration_level(dst, src, topo)
    if index is None:
        return None, [dst]
    d = domain_of(topo, dst, index)
    below = [x for x in (topo.get("domains") or {}).get(str(dst)) or () if x["index"] < index]
    return d, sorted(below[-1]["span"]) if below else [dst]


def imb_numa_nr(manifest: dict, cpu: int) -> int:
    """``imb_numa_nr`` of ``cpu``'s lowest NUMA domain by topology.c's rule (its node's LLC
    count, or node CPUs / 8 when the node is one LLC, at least 1); 0 without a NUMA domain."""
    topo = topology_of(manifest)
    cpus = topo.get("cpus") or {}
    me = cpus.get(str(cpu)) or {}
    node = [c for c, v in cpus.items() if v.get("node") == me.get("node")]
    llc = [c for c, v in cpus.items() if v.get("llc") == me.get("llc")]
    if not any("SD_NUMA" in (d.get("flags") or ()) for d in topo["domains"].get(str(cpu), ())):
        return 0
    nr_llcs = len(node) // max(1, len(llc))
    return max(1, len(node) >> 3) if nr_llcs == 1 else nr_llcs


def numa_final_difference(n: int, imb: int) -> int:
    """The difference of tasks between two nodes after the NUMA level has balanced ``n`` tasks
    released on one node (``calculate_imbalance`` with ``adjust_numa_imbalance``: half the
    difference moves, unless the lighter node would hold at most ``imb`` tasks and the
    difference is at most NUMA_IMBALANCE_MIN = 2)."""
    heavy, light = n, 0
    while heavy - light > 1:
        diff = heavy - light
        if light + 1 <= imb and diff <= 2:
            break
        move = diff >> 1
        heavy, light = heavy - move, light + move
    return heavy - light


def df_predicted_domains(manifest: dict, cpu: int | None = None) -> pd.DataFrame:
    """The balancer's parameters and what they imply, per domain of ``cpu`` (default: the run's
    first CPU): index, name, span_weight, idle_interval_ms ("min-max"), busy_interval_ms
    ("min-max"), imbalance_pct, active_after (failed balances before an active one),
    imb_numa_nr (NUMA domains), prefer_sibling (bool: its child prefers siblings)."""
    topo = topology_of(manifest)
    if cpu is None:
        cpu = (manifest.get("cpus") or [0])[0]
    hz, n = hz_of(manifest), online_cpus(manifest)
    rows, child = [], None
    for d in keyed((topo.get("domains") or {}).get(str(cpu)) or ()):
        flags = set(d.get("flags") or ())
        lo, hi, bf = d.get("min_interval"), d.get("max_interval"), d.get("busy_factor")
        known = None not in (lo, hi, bf)
        rows.append({
            "index": d["index"], "name": d["key"], "span_weight": len(d["span"]),
            "idle_interval_ms": f"{interval_ms(lo, 1, False, hz, n):g}-"
                                f"{interval_ms(hi, 1, False, hz, n):g}" if known else None,
            "busy_interval_ms": f"{interval_ms(lo, bf, True, hz, n):g}-"
                                f"{interval_ms(hi, bf, True, hz, n):g}" if known else None,
            "imbalance_pct": d.get("imbalance_pct"),
            "active_after": None if d.get("cache_nice_tries") is None
            else d["cache_nice_tries"] + 3,
            "imb_numa_nr": imb_numa_nr(manifest, cpu) if "SD_NUMA" in flags else None,
            "prefer_sibling": bool(child and "SD_PREFER_SIBLING" in child),
        })
        child = flags
    return pd.DataFrame(rows, columns=["index", "name", "span_weight", "idle_interval_ms",
                                       "busy_interval_ms", "imbalance_pct", "active_after",
                                       "imb_numa_nr", "prefer_sibling"])


# ------------------------------------------------------------------------- the verdicts' rules

def bound_holds(measured_ms: float, period_ms: float, extra_ms: float, jiffy_ms: float) -> bool:
    """A delay predicted to come within a period: at most the period, plus what the run added
    (``extra_ms``: the time its cut took), plus PREDICTION_SLACK_TICKS jiffies."""
    return measured_ms <= period_ms + extra_ms + T.PREDICTION_SLACK_TICKS * jiffy_ms


def scale_checkable(runs: int) -> bool:
    """Enough runs to see a period from below (PREDICTION_SCALE_MIN_RUNS)."""
    return runs >= T.PREDICTION_SCALE_MIN_RUNS


def scale_holds(largest_ms: float, period_ms: float) -> bool:
    """The runs' largest first check reaches PREDICTION_SCALE_FRACTION of the period."""
    return largest_ms >= T.PREDICTION_SCALE_FRACTION * period_ms


def wake_llc_holds(fraction: float) -> bool:
    """Wake-up moves inside the previous or the waker's LLC: at least WAKE_LLC_MIN_FRACTION."""
    return fraction >= T.WAKE_LLC_MIN_FRACTION


def locality_flat(locality: float, moves: int) -> bool | None:
    """A level's locality index within LOCALITY_FLAT_MIN..MAX (no level structure); None with
    fewer than LOCALITY_MIN_MOVES moves."""
    if moves < T.LOCALITY_MIN_MOVES or np.isnan(locality):
        return None
    return T.LOCALITY_FLAT_MIN <= locality <= T.LOCALITY_FLAT_MAX


def numa_holds(got: float, want: float) -> bool:
    """The nodes' difference as the NUMA level leaves it, within NUMA_TASKS_SLACK tasks."""
    return abs(got - want) <= T.NUMA_TASKS_SLACK


# ------------------------------------------------------------------------------------- the rows

def _row(check, level, domain, predicted, measured, holds, tolerance, source) -> dict:
    return dict(zip(ROW_KEYS, (check, level, domain, predicted, measured, holds, tolerance,
                               source)))


def scheduler_kind(manifest: dict) -> str:
    """"scx" for a run under a sched_ext scheduler (or the simulated scx-like policy), "fair"
    otherwise (the fair class balances the tasks: SCHED_OTHER, BATCH, IDLE)."""
    sim = (manifest.get("simulated") or {}).get("policy")
    if manifest.get("scx") or sim == "scx-like":
        return "scx"
    return "fair"


def level_summary(run) -> dict:
    """A run's :data:`harmony.experiments.base.LEVEL_SUMMARY` keys: its moves by relation
    (:func:`harmony.analysis.levels.moves_by_relation`) and its predicted-vs-measured rows
    (:func:`check_run`)."""
    moves = df_move_levels(run.migrations, run.manifest)
    return {"moves_by_relation": moves_by_relation(run, moves),
            "predictions": {"rows": check_run(run, moves)}}


def check_run(run, moves: pd.DataFrame) -> list[dict]:
    """The predicted-vs-measured rows of one run (``moves``: its
    :func:`harmony.analysis.levels.df_move_levels`); [] without a topology."""
    m = run.manifest
    if not topology_of(m).get("domains"):
        return []
    p = m.get("params") or {}
    cpus = m["cpus"]
    level = p.get("level") or ""
    rows = []
    if scheduler_kind(m) == "scx":
        return rows + no_structure_rows(m, moves, cpus)
    if level and len(cpus) == 2:
        src, dst = cpus[0], cpus[-1]
        if m["experiment"] == "detection":
            rows += detection_rows(run, src, dst, level)
        elif m["experiment"] in ("how-many", "time-to-resolve"):
            rows += threshold_rows(run, moves, src, dst, level)
        elif m["experiment"] == "work-conservation":
            rows += steal_rows(run, src, dst, level)
    rows += active_rows(m, moves)
    rows += wake_rows(m, moves)
    if m["experiment"] == "spread":
        rows += spread_rows(run, moves)
    return rows


def detection_rows(run, src: int, dst: int, level: str) -> list[dict]:
    """Check 1: the first pull after the cut comes within the balancing CPU's period at the
    pair's level (see the module docstring), by the case the run was in when the cut was done:
    the target alone in its group (it balances, busy); an idle CPU of its group balancing for
    it, the target's group below the domain's average load (where the run kept its own threads
    on those CPUs, ``controller_cpus``, one may be busy at its balance: the busy period bounds
    it); or the target's group at or above
    that average (the idle CPUs outside the set dilute it), which only the affinity path
    moves tasks for (``group_imbalanced``, raised by the source's group's idle CPUs, whose
    pinned attempts double their interval up to MAX_PINNED_INTERVAL)."""
    m = run.manifest
    d, local = pair_domain(m, src, dst)
    if d is None or None in (d.get("max_interval"), d.get("busy_factor")):
        return []
    hz, n = hz_of(m), online_cpus(m)
    cut = cut_delay_ms(run)
    done = m["t0_ns"] + int((m["params"]["cut_at_s"] * 1000 + cut) * 1e6)
    q_src, q_dst = (queue_at(run.runqueue, c, done) for c in (src, dst))
    if len(local) == 1:
        period = interval_ms(d["max_interval"], d["busy_factor"], True, hz, n)
        who = "the target, busy, every busy_factor x max_interval - 1 jiffy"
    elif q_dst / len(local) < (q_src + q_dst) / len(d["span"]):
        # the idle CPUs of its group outside the set are where the run keeps its own threads
        # (controller_cpus): one of them running those is busy at its balance, every
        # busy_factor x max_interval (should_we_balance picks an idle CPU of the group first)
        ours = sorted(set(m.get("controller_cpus") or ()) & (set(local) - set(m["cpus"])))
        if ours:
            period = interval_ms(d["max_interval"], d["busy_factor"], True, hz, n)
            who = (f"a CPU of its group ({_cl(local)}) balances for it, idle every "
                   f"max_interval, but busy_factor x max_interval while Harmony's own threads "
                   f"ran on {_cl(ours)} (the run's controller_cpus)")
        else:
            period = interval_ms(d["max_interval"], 1, False, hz, n)
            who = f"an idle CPU of its group ({_cl(local)}) balances for it every max_interval"
    else:
        period = interval_ms(MAX_PINNED_INTERVAL, 1, False, hz, n) + interval_ms(
            d["max_interval"], 1, False, hz, n)
        who = (f"the target's group ({q_dst} tasks on {len(local)} CPUs) is at or above the "
               f"domain's average ({q_src + q_dst} on {len(d['span'])}): only the affinity path "
               "(group_imbalanced) moves tasks, within MAX_PINNED_INTERVAL and a balance")
    i1 = _interval1(run)
    measured = ("no pull after the cut" if i1 is None else
                f"first pull {i1:.1f} ms after the cut (the cut took {cut:.1f} ms)")
    return [_row("detection period", level, d["key"],
                 f"first pull within {period:g} ms of the cut completing: {who}",
                 measured, None if i1 is None else bound_holds(i1, period, cut, tick_ms(m)),
                 f"+ the cut's {cut:.1f} ms + {T.PREDICTION_SLACK_TICKS} jiffies",
                 "fair.c get_sd_balance_interval, should_we_balance (6.12 picks an idle core "
                 "first), find_busiest_group, LBF_DST_PINNED and group_imbalanced (6.1 = 6.12)")]


def queue_at(runqueue: pd.DataFrame, cpu: int, ts: int) -> int:
    """The experiment tasks on ``cpu`` at ``ts`` (the run queue's step function)."""
    q = runqueue[(runqueue["cpu"] == cpu) & (runqueue["ts"] <= ts)]
    return int(q["nr"].iloc[-1]) if len(q) else 0


def _interval1(run) -> float | None:
    """The cut to the first pull onto the target, as the detection experiment measures it."""
    from harmony.analysis import rounds

    m, p = run.manifest, run.manifest["params"]
    per = rounds.df_target_rounds(run.migrations, m["cpus"][-1], p.get("round_gap_ms", 1.0),
                                  t_from=p["cut_at_s"])
    if not len(per):
        return None
    return float((per["ts"].min() - m["t0_ns"]) / 1e6 - p["cut_at_s"] * 1000)


def cut_delay_ms(run) -> float:
    """How long the detection cut took: from the cut to the last run of a cut task (its tasks
    leave the next time they run), in ms; 0 when none ran after it."""
    m, p = run.manifest, run.manifest["params"]
    tasks = run.tasks
    cut = tasks[tasks["stop_after_s"].notna() | tasks["cut_duty_at_s"].notna()] \
        if "cut_duty_at_s" in tasks else tasks[tasks["stop_after_s"].notna()]
    at = m["t0_ns"] + int(p.get("cut_at_s", 0) * NS)
    runs = run.runs[run.runs["pid"].isin(cut["pid"])]
    if runs.empty:
        return 0.0
    last = runs["end"].max() if "end" in runs else runs["ts_end"].max()
    return max(0.0, float(last - at) / 1e6)


def threshold_rows(run, moves: pd.DataFrame, src: int, dst: int, level: str) -> list[dict]:
    """Check 2: an imbalance below imbalance_pct between two overloaded groups is left alone.

    The kernel compares the groups' ``avg_load`` = load x SCHED_CAPACITY_SCALE / capacity
    (``update_sg_lb_stats``), not their task counts: the capacity is what ``scale_rt_capacity``
    leaves of the CPU after its RT, deadline (and, with IRQ time accounting, IRQ) averages. The
    run's own controller threads are SCHED_FIFO through the window, so a CPU of the pair they ran
    on has less capacity and a higher avg_load for the same tasks: 8 tasks against 7 (114.3 %)
    cross MC's 117 when 2.4 % of the busier CPU goes to them. Each CPU's capacity is taken from
    the window (:func:`pair_capacity`): between 1 less what other tasks ran on it and 1; the
    verdict is given only when the whole range of ratios, widened by IMBALANCE_PCT_LOAD_MARGIN,
    lies on one side of imbalance_pct, else the row is not checkable (too close to call)."""
    m, p = run.manifest, run.manifest["params"]
    if p.get("x") is None:      # an imported trace whose layout shows no x
        return []
    d, local = pair_domain(m, src, dst)
    if d is None or d.get("imbalance_pct") is None:
        return []
    topo = topology_of(m)
    below = [x for x in topo["domains"][str(src)] if x["index"] < d["index"]]
    busiest = sorted(below[-1]["span"]) if below else [src]
    q_src, q_dst = p["base"] + p["x"], p["base"]
    pct = d["imbalance_pct"]
    onto = moves[(moves["dst_cpu"] == dst) & moves["cause"].isin(BALANCE_CAUSES)]
    if len(busiest) > 1 or len(local) > 1:
        # a CPU outside the set in the source's group fails to pull (its tasks may not run
        # there), marks the group imbalanced for this level (LBF_SOME_PINNED ->
        # sgc->imbalance), and this level then moves a task whatever the ratio
        return [_row("imbalance_pct", level, d["key"],
                     f"not a clean test here: the groups ({_cl(busiest)}, {_cl(local)}) hold "
                     "CPUs outside the set, whose failed pulls force moves (group_imbalanced)",
                     f"{len(onto)} balance moves onto the target", None, "-",
                     "fair.c sched_balance_rq LBF_SOME_PINNED, group_classify (6.1 = 6.12)")]
    overloaded = [_overloaded(q, len(g), pct) for q, g in ((q_src, busiest), (q_dst, local))]
    measured = f"{len(onto)} balance moves onto the target"
    if not all(overloaded):
        # only two overloaded groups reach the avg_load test (the local group's type is not
        # above the busiest's, group_overloaded is the highest); otherwise the imbalance is
        # counted in tasks or idle CPUs (calculate_imbalance's group_has_spare branch)
        return [_row("imbalance_pct", level, d["key"],
                     f"not consulted: the {'local' if not overloaded[1] else 'busiest'} group "
                     f"({_cl(local if not overloaded[1] else busiest)}) is not overloaded",
                     measured, None, "-", "fair.c find_busiest_group (6.12 "
                     "sched_balance_find_src_group), calculate_imbalance (6.1 = 6.12)")]
    (lo_src, hi_src), (lo_dst, hi_dst) = (pair_capacity(m, c) for c in (src, dst))
    margin = T.IMBALANCE_PCT_LOAD_MARGIN
    # the busiest's avg_load over the local's, in %: lowest with the source at full capacity
    # and the target at its least, highest the other way round
    low = 100 * q_src * lo_dst / (q_dst * hi_src) / (1 + margin)
    high = 100 * q_src * hi_dst / (q_dst * lo_src) * (1 + margin)
    ratio = 100 * q_src / q_dst
    caps = (f"capacities {_span(lo_src, hi_src)} (CPU {src}) and {_span(lo_dst, hi_dst)} "
            f"(CPU {dst}): avg_load ratio {low:.1f}-{high:.1f}%")
    src_text = ("fair.c find_busiest_group (6.12 sched_balance_find_src_group), "
                "update_sg_lb_stats avg_load, scale_rt_capacity (6.1 = 6.12)")
    tol = (f"capacity from other tasks' share of each CPU, loads +-{margin:.1%}: undecided "
           "within that range")
    if low <= pct < high:
        return [_row("imbalance_pct", level, d["key"],
                     f"too close to call: {q_src} vs {q_dst} tasks is {ratio:.1f}% against "
                     f"imbalance_pct {pct}, with {caps}", measured, None, tol, src_text)]
    alone = high <= pct
    return [_row("imbalance_pct", level, d["key"],
                 f"{'left alone' if alone else 'balanced'}: {q_src} vs {q_dst} tasks is "
                 f"{ratio:.1f}% {'<=' if alone else '>'} imbalance_pct {pct} ({caps})",
                 measured, bool((len(onto) == 0) == alone), tol, src_text)]


def pair_capacity(manifest: dict, cpu: int) -> tuple[float, float]:
    """The range of ``cpu``'s capacity (a fraction of its full capacity) the balancer may have
    seen in the window: ``scale_rt_capacity`` subtracts the CPU's RT and deadline utilisation
    (PELT averages of the time those classes ran), so at most 1, and 1 less the share of the
    window other tasks ran on it (the run's SCHED_FIFO controller threads, and foreign tasks,
    whose class the record does not keep) as the least; (1.0, 1.0) where the run has no such
    record (an import)."""
    rows = (manifest.get("foreign_load") or {}).get("per_cpu") or ()
    for r in rows:
        if int(r.get("cpu", -1)) == int(cpu):
            window = r.get("window_s") or 0
            other = sum(r.get(k) or 0 for k in ("controller_s", "foreign_s"))
            if window > 0 and not math.isnan(other):
                return max(0.0, 1.0 - other / window), 1.0
    return 1.0, 1.0


def _span(lo: float, hi: float) -> str:
    return f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"


def _overloaded(tasks: int, cpus: int, pct: int) -> bool:
    """group_is_overloaded for ``tasks`` always-runnable tasks of equal load on a group of
    ``cpus``: more tasks than CPUs, and their runnable sum over the capacity by pct."""
    return tasks > cpus and cpus * pct < tasks * 100


def steal_rows(run, src: int, dst: int, level: str) -> list[dict]:
    """Work conservation at a level: the new-idle balance pulls at once; failing that (its cost
    cut-off), the target's idle balance within max_interval."""
    m = run.manifest
    d, _ = pair_domain(m, src, dst)
    if d is None or d.get("max_interval") is None:
        return []
    hz, n = hz_of(m), online_cpus(m)
    bound = interval_ms(d["max_interval"], 1, False, hz, n)
    lat = _steal_latency_ms(run)
    return [_row("idle pull", level, d["key"],
                 f"at once (new-idle balance), at most {bound:g} ms (the idle balance's "
                 "max_interval) when the new-idle balance stops below this level",
                 "nothing pulled" if lat is None else f"{lat:.2f} ms after the target idled",
                 None if lat is None else bound_holds(lat, bound, 0.0, tick_ms(m)),
                 f"+ {T.PREDICTION_SLACK_TICKS} jiffies",
                 "fair.c sched_balance_newidle (6.1 newidle_balance), get_sd_balance_interval")]


def _steal_latency_ms(run) -> float | None:
    from harmony.analysis import rounds

    m, p = run.manifest, run.manifest["params"]
    target, t0 = m["cpus"][-1], m["t0_ns"]
    load = rounds.df_target_load(run.runqueue, run.events, run.tasks, target, t0, m["end_ns"])
    st = rounds.steal_latency(load, run.migrations, run.runs, run.tasks, target, t0,
                              t0 + int(p["idle_at_s"] * NS), run.events)
    return None if st["idle_latency_s"] is None else st["idle_latency_s"] * 1000


def active_rows(manifest: dict, moves: pd.DataFrame) -> list[dict]:
    """Check 3: the first active move at each level comes no earlier than (cache_nice_tries + 2)
    x min_interval after the release."""
    act = moves[(moves["cause"] == "active") & moves["level"].notna()]
    rows = []
    for (rel, name), g in act.groupby(["relation", "level_name"], dropna=False, sort=False):
        first = g.sort_values("t").iloc[0]
        d = domain_of(topology_of(manifest), int(first["dst_cpu"]), int(first["level"]))
        if d is None or None in (d.get("cache_nice_tries"), d.get("min_interval")):
            continue
        bound = (d["cache_nice_tries"] + 2) * d["min_interval"]
        t_ms = float(first["t"]) * 1000
        rows.append(_row("active balance", rel, name,
                         f"only after {d['cache_nice_tries'] + 3} failed balances: not before "
                         f"{bound:g} ms after t0",
                         f"first active move {t_ms:.1f} ms after t0 ({len(g)} in all)",
                         bool(t_ms >= bound - tick_ms(manifest)), "- 1 jiffy",
                         "fair.c need_active_balance, imbalanced_active_balance (6.1 = 6.12)"))
    return rows


def wake_rows(manifest: dict, moves: pd.DataFrame) -> list[dict]:
    """Check 5: every wake-up move lands in the previous CPU's or the waker's LLC."""
    w = df_wake_llc(moves, manifest)
    if w.empty:
        return []
    inside = float(w["in_llc"].mean())
    out = w[~w["in_llc"]]
    example = ("" if out.empty else f"; e.g. CPU {out['src_cpu'].iloc[0]} -> "
               f"{out['dst_cpu'].iloc[0]} woken from CPU {out['waker_cpu'].iloc[0]}")
    return [_row("wake-ups in the LLC", "", None,
                 "every wake-up move stays in the LLC of the previous CPU or the waker's",
                 f"{int(w['in_llc'].sum())} of {len(w)} did ({inside:.1%}){example}",
                 wake_llc_holds(inside),
                 f">= {T.WAKE_LLC_MIN_FRACTION:.0%}",
                 "fair.c select_task_rq_fair, wake_affine, select_idle_sibling (6.1 = 6.12)")]


def no_structure_rows(manifest: dict, moves: pd.DataFrame, cpus: list[int]) -> list[dict]:
    """Check 6: under sched_ext's default CPU selection moves fall on CPU pairs in proportion to
    their number at every level."""
    loc = df_locality(moves, cpus, manifest, float(manifest.get("measured_s") or 1.0))
    total = int(loc["moves"].sum()) if len(loc) else 0
    if len(loc) < 2:
        return []
    lo, hi = T.LOCALITY_FLAT_MIN, T.LOCALITY_FLAT_MAX
    rows = []
    for r in loc.itertuples():
        ok = locality_flat(float(r.locality), total)
        rows.append(_row("no level structure", r.relation, None,
                         f"moves in proportion to the CPU pairs: locality 1 "
                         f"({r.pairs} of the set's pairs)",
                         f"{r.moves} of {total} moves: locality {r.locality:.2f}",
                         ok, f"{lo:g}-{hi:g}, with >= {T.LOCALITY_MIN_MOVES} moves",
                         "ext.c scx_select_cpu_dfl (6.12), scx_simple's one queue"))
    return rows


def spread_rows(run, moves: pd.DataFrame | None = None) -> list[dict]:
    """Check 4: N <= cores tasks released on one CPU end on N cores; the nodes' difference is
    what the NUMA level tolerates (:func:`numa_row`)."""
    fin = final_placement(run)
    if fin is None:
        return []
    rows = []
    n = int(round(fin["tasks"].sum()))
    cores = fin.groupby("core")["tasks"].sum().round()
    ncores = int(cores.size)
    if n <= ncores and fin["smt"].any():
        doubled = int((cores >= 2).sum())
        idle = int((cores == 0).sum())
        rows.append(_row("cores before siblings", "smt", "SMT",
                         f"{n} tasks on {n} cores: no core with two while another is idle",
                         f"{doubled} cores with two or more, {idle} idle (at the end)",
                         bool(not (doubled and idle)), "exact (time-averaged placement)",
                         "fair.c SD_PREFER_SIBLING, sibling_imbalance and group_smt_balance "
                         "(6.12), prefer_sibling nr_running difference (6.1)"))
    nodes = fin.groupby("node")["tasks"].sum().round()
    if nodes.size == 2:
        rows.append(numa_row(run, nodes, n, moves))
    return rows


def numa_row(run, nodes: pd.Series, n: int, moves: pd.DataFrame | None) -> dict:
    """The NUMA allowance's row: ``n`` tasks released on one node end
    :func:`numa_final_difference` apart. The kernel counts a group's tasks as its CPUs'
    ``rq->nr_running`` (``update_sg_lb_stats``: every class, the run's SCHED_FIFO controller
    threads and any other task included), so a balance at the NUMA level while another task runs
    on the source node sees one task more: 2 experiment tasks and that one are a difference of 3,
    over NUMA_IMBALANCE_MIN, and one of the two moves (``calculate_imbalance``'s
    ``group_has_spare`` branch; 6.12 counts it through ``sibling_imbalance``, which for nodes of
    as many cores is the same difference; ``adjust_numa_imbalance`` is the same in 6.1 and 6.12).
    On the destination's node such a task makes the local group's ``sum_nr_running + 1`` exceed
    ``imb_numa_nr``, which turns the allowance off. A difference below the prediction whose every
    move across the nodes came while another task ran on either node is that case, which the
    prediction does not cover: not checkable, with the task named."""
    m = run.manifest
    src = m["cpus"][0]
    imb = imb_numa_nr(m, src)
    want = numa_final_difference(n, imb)
    got = int(abs(nodes.iloc[0] - nodes.iloc[1]))
    holds: bool | None = numa_holds(got, want)
    extra = ""
    if not holds and got < want and moves is not None:
        crossing, others = crossings_with_others(run, moves, src)
        if crossing and len(others) == crossing:
            holds = None
            extra = (f"; each of the {crossing} balance moves across the nodes came while "
                     f"another task ran on one of the two nodes ({'; '.join(sorted(set(others)))}"
                     "), counted in its nr_running: the allowance's condition was not met")
    return _row("NUMA imbalance", "remote", "NUMA",
                f"{n} tasks from one node end {want} apart (imb_numa_nr {imb}: a difference of "
                f"<= 2 stays while the other node would hold <= {imb}), while they are the "
                "only tasks the two nodes run",
                f"{int(nodes.iloc[0])} and {int(nodes.iloc[1])} tasks on the nodes{extra}",
                holds, f"+-{T.NUMA_TASKS_SLACK} task",
                "fair.c update_sg_lb_stats (rq->nr_running), calculate_imbalance, "
                "adjust_numa_imbalance (6.12: sibling_imbalance), topology.c imb_numa_nr "
                "(6.1 = 6.12 here)")


def crossings_with_others(run, moves: pd.DataFrame, src: int) -> tuple[int, list[str]]:
    """(the balance moves out of ``src``'s node to another node, for each of them that came
    while a task other than the experiment's and the idle task ran on a CPU of either node:
    "comm (pid) on CPU c"), from the trace's sched_switch events. On the source node such a
    task makes the difference one more; on the destination's it makes the local group's
    ``sum_nr_running + 1`` exceed ``imb_numa_nr`` (the allowance is then off)."""
    from harmony.analysis.arrays import event_mask

    cpus = df_cpus(run.manifest).set_index("cpu")
    node_of = cpus["node"].to_dict()
    home = [int(c) for c in cpus.index if node_of[c] == node_of[src]]
    across = moves[moves["cause"].isin(BALANCE_CAUSES) & moves["src_cpu"].isin(home)
                   & ~moves["dst_cpu"].isin(home)]
    if across.empty:
        return 0, []
    ev = run.events
    sw = ev[event_mask(ev, "sched_switch")].sort_values("ts", kind="stable")
    ours = set(int(p) for p in run.tasks["pid"])
    t0 = run.manifest["t0_ns"]
    found = []
    for t, dst in zip(across["t"], across["dst_cpu"]):
        ts = t0 + int(round(float(t) * NS))
        there = [int(c) for c in cpus.index if node_of[c] == node_of[int(dst)]]
        for c in home + there:
            before = sw[(sw["cpu"] == c) & (sw["ts"] <= ts)]
            if before.empty:
                continue
            last = before.iloc[-1]
            pid = int(last["pid"])
            if pid != 0 and pid not in ours:
                found.append(f"{last.get('comm', '?')} ({pid}) on CPU {c}")
                break
    return len(across), found


def _cl(cpus) -> str:
    from harmony.core.osutil import format_cpulist

    return format_cpulist(sorted(int(c) for c in cpus))


def relation_of_pair(manifest: dict) -> str | None:
    """The relation of a pair run's two CPUs on its machine, or None (not a pair, no topology)."""
    cpus = manifest.get("cpus") or []
    if len(cpus) != 2 or not topology_of(manifest).get("cpus"):
        return None
    try:
        return relation(cpus[0], cpus[1], df_cpus(manifest))
    except ValueError:
        return None
