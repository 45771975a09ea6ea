"""The trace against each task's own scheduler counters, read from /proc/<pid>/sched at the start
and at the end of a run (:mod:`harmony.probes.proc_sched`).

Needs events: sched_migrate_task, sched_switch; a runs table that covers the reads (for CPU
time); the ``kernel_counters`` table of a run (:data:`harmony.probes.proc_sched.KERNEL_COUNTERS`).

Between a task's two reads the kernel counted its migrations (to another CPU), its switches away
and its CPU time; the trace must show as many ``sched_migrate_task`` events of the task with
orig_cpu != dest_cpu (with the moves the tasks' own events prove where no probe recorded them),
as many ``sched_switch`` events with the task as prev, and as much run time.
A read happened at some instant of its window [before_ns, after_ns], so an event inside either
window may or may not be in the kernel's difference: a count agrees when the kernel's difference
lies between the events surely between the reads ("trace") and those plus the ones inside the
windows ("unsure"). A lost event shows as a disagreement. CPU time is not judged, only
reported: the kernel brings a running task's time up to date only at ticks and switches (a read
of a running task lags by up to a tick), and a kernel that accounts steal time (a VM with
CONFIG_PARAVIRT_TIME_ACCOUNTING) or interrupt time (CONFIG_IRQ_TIME_ACCOUNTING) leaves it out
of the task's time, while the task's runs in the trace include it (on the 2-vCPU VM Harmony is
developed on, runs came to 1.2-1.9 % more than the kernel's time, its steal being ~1 %).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, in_set
from harmony.analysis.causes import df_all_moves
from harmony.analysis.thresholds import SCHEDSTAT_SLACK
from harmony.analysis.tables import COUNTER_AGREEMENT
from harmony.analysis.topology import LevelTable, chain_keys, domains_of

COUNTS = ("migrations", "switches")
#: the per-task counters of a kernel counting scheduler statistics (-1 in a read: not counted)
SCHEDSTAT_COUNTS = ("nr_wakeups_migrate", "nr_forced_migrations")


def _keys(pid_col: np.ndarray, ts: np.ndarray, pids: np.ndarray, t_min: int, span: int):
    """Sorted search keys of the events whose pid is one of ``pids`` (sorted): the pid's index
    times ``span`` plus the time since ``t_min``, so that one search finds a task's events in a
    time range."""
    keep = in_set(pid_col, pids)
    return np.sort(np.searchsorted(pids, pid_col[keep]).astype(np.int64) * span
                   + (ts[keep] - t_min))


def _count(keys: np.ndarray, base: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           inclusive: bool) -> np.ndarray:
    """Per task (its keys from ``base``): events in (lo, hi), or in [lo, hi] if ``inclusive``
    (lo, hi: times since t_min)."""
    if inclusive:
        return np.searchsorted(keys, base + hi, "right") - np.searchsorted(keys, base + lo, "left")
    return np.maximum(0, np.searchsorted(keys, base + hi, "left")
                      - np.searchsorted(keys, base + lo, "right"))


def df_counter_agreement(events: pd.DataFrame, runs: pd.DataFrame,
                         counters: pd.DataFrame, inferred: pd.DataFrame | None = None,
                         wakeups: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per task read at both ends of the run ("start" and "end" reads), by pid.

    ``runs`` must cover the reads (a :func:`~harmony.analysis.reconstruct.df_runs` table whose
    t_end is at or after the last read). ``inferred``: the moves no probe recorded that the
    tasks' own events prove (the migrations table's ``inferred`` rows: pid, ts), counted with the
    recorded ones. ``wakeups``: the migrations of cause ``wakeup``, recorded and inferred (the
    migrations table's rows: pid, ts, src_cpu, dst_cpu), compared with the task's
    ``nr_wakeups_migrate`` where the kernel counted it (schedstats; ``wakeups_kernel`` is -1 and
    ``wakeups_agree`` False where it did not). Columns:
    :data:`harmony.analysis.tables.COUNTER_AGREEMENT`.
    """
    read = counters["read"].to_numpy()
    c_pid = counters["pid"].to_numpy().astype(np.int64)
    rows = {}
    for r, tag in (("start", "_s"), ("end", "_e")):      # each pid's first read of each kind
        at = np.flatnonzero(read == r)
        pid_of, first = np.unique(c_pid[at], return_index=True)
        rows[tag] = (pid_of, at[first])
    pids, i_s, i_e = np.intersect1d(rows["_s"][0], rows["_e"][0], return_indices=True)
    # a table stored before the schedstat columns existed: not counted (-1)
    counters = counters.assign(**{c: -1 for c in SCHEDSTAT_COUNTS if c not in counters.columns})
    col = {f"{c}{tag}": counters[c].to_numpy().astype(np.int64)[rows[tag][1][i]]
           for c in ("before_ns", "after_ns", "nr_migrations", "nr_switches", "sum_exec_ns",
                     *SCHEDSTAT_COUNTS)
           for tag, i in (("_s", i_s), ("_e", i_e))}
    ts = events["ts"].to_numpy()
    t_min = int(min(ts.min(initial=0), col["before_ns_s"].min(initial=0)))
    span = int(max(ts.max(initial=0), col["after_ns_e"].max(initial=0))) - t_min + 2
    base = np.arange(len(pids), dtype=np.int64) * span
    is_mig = event_mask(events, "sched_migrate_task")
    is_mig &= events["orig_cpu"].to_numpy() != events["target_cpu"].to_numpy()
    is_sw = event_mask(events, "sched_switch")
    mig_pid, mig_ts = events["pid"].to_numpy()[is_mig], ts[is_mig]
    if inferred is not None and len(inferred):
        mig_pid = np.r_[mig_pid, inferred["pid"].to_numpy()]
        mig_ts = np.r_[mig_ts, inferred["ts"].to_numpy()]
    if wakeups is None:
        wakeups = pd.DataFrame({"pid": [], "ts": [], "src_cpu": [], "dst_cpu": []})
    moved = wakeups["src_cpu"].to_numpy() != wakeups["dst_cpu"].to_numpy()
    keys = {"migrations": _keys(mig_pid, mig_ts, pids, t_min, span),
            "switches": _keys(events["prev_pid"].to_numpy()[is_sw], ts[is_sw], pids, t_min, span),
            "wakeups": _keys(wakeups["pid"].to_numpy()[moved].astype(np.int64),
                             wakeups["ts"].to_numpy()[moved].astype(np.int64), pids, t_min, span)}
    w = {k: col[k] - t_min for k in ("before_ns_s", "after_ns_s", "before_ns_e", "after_ns_e")}
    out = {"pid": pids.astype(np.int32)}
    for name, counter in (("migrations", "nr_migrations"), ("switches", "nr_switches"),
                          ("wakeups", "nr_wakeups_migrate")):
        k = keys[name]
        sure = _count(k, base, w["after_ns_s"], w["before_ns_e"], inclusive=False)
        unsure = (_count(k, base, w["before_ns_s"], w["after_ns_s"], inclusive=True)
                  + _count(k, base, w["before_ns_e"], w["after_ns_e"], inclusive=True))
        kernel = col[f"{counter}_e"] - col[f"{counter}_s"]
        agree = (sure <= kernel) & (kernel <= sure + unsure)
        if counter in SCHEDSTAT_COUNTS:     # counted at both reads, or not at all (-1)
            counted = (col[f"{counter}_s"] >= 0) & (col[f"{counter}_e"] >= 0)
            kernel, agree = np.where(counted, kernel, -1), agree & counted
        out |= {f"{name}_kernel": kernel, f"{name}_trace": sure, f"{name}_unsure": unsure,
                f"{name}_agree": agree}
    forced = col["nr_forced_migrations_e"] - col["nr_forced_migrations_s"]
    out["forced_kernel"] = np.where((col["nr_forced_migrations_s"] >= 0)
                                    & (col["nr_forced_migrations_e"] >= 0), forced, -1)
    # CPU time: each run's part between its task's reads' midpoints
    lo = (col["before_ns_s"] + col["after_ns_s"]) // 2
    hi = (col["before_ns_e"] + col["after_ns_e"]) // 2
    r_pid = runs["pid"].to_numpy()
    mine = in_set(r_pid, pids)
    task = np.searchsorted(pids, r_pid[mine])
    ran = (np.clip(runs["end"].to_numpy()[mine], lo[task], hi[task])
           - np.clip(runs["start"].to_numpy()[mine], lo[task], hi[task]))
    out["cpu_kernel_ns"] = col["sum_exec_ns_e"] - col["sum_exec_ns_s"]
    out["cpu_trace_ns"] = np.bincount(task, weights=ran, minlength=len(pids)).astype(np.int64)
    return COUNTER_AGREEMENT.frame(out)


def counter_agreement(table: pd.DataFrame) -> dict:
    """Summary of :func:`df_counter_agreement`'s table: tasks; per count (migrations, switches):
    agreeing (tasks), kernel and trace (totals over the tasks); cpu_time_ratio (trace / kernel,
    all tasks; None without CPU time), cpu_diff_ms_max (the largest |trace - kernel| of a task);
    wakeups (the moves of cause wakeup against nr_wakeups_migrate, over the tasks the kernel
    counted them of: counted, agreeing, kernel, trace, unsure) and other_moves (every move but
    those, likewise: agreeing, kernel, trace), forced_kernel (nr_forced_migrations over the
    counted tasks; None: none counted);
    disagreeing (tasks whose migrations or switches disagree) and disagreements (up to 5 of
    them: pid and each count's kernel, trace, unsure)."""
    col = {c: table[c].to_numpy() for c in table.columns}
    out: dict = {"tasks": int(len(table))}
    for name in COUNTS:
        out[name] = {"agreeing": int(col[f"{name}_agree"].sum()),
                     "kernel": int(col[f"{name}_kernel"].sum()),
                     "trace": int(col[f"{name}_trace"].sum())}
    kernel_cpu = int(col["cpu_kernel_ns"].sum())
    diff = np.abs(col["cpu_trace_ns"] - col["cpu_kernel_ns"])
    out["cpu_time_ratio"] = (float(col["cpu_trace_ns"].sum() / kernel_cpu) if kernel_cpu > 0
                             else None)
    out["cpu_diff_ms_max"] = float(diff.max() / 1e6) if len(diff) else None
    counted = col["wakeups_kernel"] >= 0
    out["wakeups"] = {"counted": int(counted.sum()),
                      "agreeing": int(col["wakeups_agree"].sum()),
                      "kernel": int(col["wakeups_kernel"][counted].sum()),
                      "trace": int(col["wakeups_trace"][counted].sum()),
                      "unsure": int(col["wakeups_unsure"][counted].sum())}
    # the other moves (load balance, affinity, NUMA): every move less the wake-ups, per task
    k_other = (col["migrations_kernel"] - col["wakeups_kernel"])[counted]
    t_other = (col["migrations_trace"] - col["wakeups_trace"])[counted]
    u_other = col["migrations_unsure"][counted]
    out["other_moves"] = {"agreeing": int(((t_other <= k_other) & (k_other <= t_other + u_other))
                                          .sum()),
                          "kernel": int(k_other.sum()), "trace": int(t_other.sum())}
    forced = col["forced_kernel"][col["forced_kernel"] >= 0]
    out["forced_kernel"] = int(forced.sum()) if len(forced) else None
    bad = np.flatnonzero(~(col["migrations_agree"] & col["switches_agree"]))
    out["disagreeing"] = int(len(bad))
    out["disagreements"] = [
        {"pid": int(col["pid"][i]), **{f"{n}_{k}": int(col[f"{n}_{k}"][i]) for n in COUNTS
                                       for k in ("kernel", "trace", "unsure")}}
        for i in bad[:5]]
    return out


# ------------------------------------------------------------------------------------------------
# the kernel's per-domain counts (/proc/schedstat), by kind of balance

#: the causes the domain counters count, and the counters that count them: the periodic and
#: nohz idle balance (lb_gained of the busy and idle types, less the active balance's moves, which
#: detach_one_task counts there too: kernel/sched/fair.c), the new-idle balance, the active
#: balance's stopper (harmony.probes.schedstat)
DOMAIN_CAUSES = {"periodic": ("lb_gained_busy", "lb_gained_idle"),
                 "newidle": ("lb_gained_newidle",), "active": ("alb_pushed",)}


def schedstat_cpus(manifest: dict, cpus: list[int]) -> list[int]:
    """The CPUs whose domain counters a run's moves are compared over (:func:`schedstat_agreement`):
    its CPU set; for a run placed at a level (``-p level=``: a pair of the machine's CPUs), every
    CPU the reads hold, and every task's moves to any of them. An idle CPU of the target's group
    balances the level for it and counts the move it makes onto the target in its own domain
    (``load_balance`` with LBF_DST_PINNED: ``lb_gained`` of the balancing CPU's ``sd``): the
    pair's own counters miss it (seen in a debian 6.12 guest of two nodes: the remote pair's
    NUMA domains counted 0 of 5-37 periodic moves onto the target)."""
    if not (manifest.get("params") or {}).get("level"):
        return list(cpus)
    end = (((manifest.get("kernel_schedstat") or {}).get("reads") or {}).get("end") or {})
    return sorted(int(c) for c in end.get("cpus") or {}) or list(cpus)


def schedstat_agreement(facts: dict | None, migrations: pd.DataFrame, events: pd.DataFrame,
                        cpus: list[int], topology: dict | None = None) -> dict:
    """The migrations' causes against the kernel's per-domain counters (/proc/schedstat read at the
    start and the end of the run: the ``kernel_schedstat`` facts of
    :class:`harmony.probes.schedstat.Reads`), summed over the CPUs of the set (a balance counts
    on the CPU that pulled).

    The domain counters count every task's moves: they are compared with every task's recorded
    moves to a CPU of the set (:func:`harmony.analysis.causes.df_all_moves`) of the same cause
    (:data:`DOMAIN_CAUSES`). A read happened at some instant of its window, so a move inside a
    window may or may not be counted (``unsure``); a fair task's move whose cause the events do
    not tell (``unknown``, with the experiment tasks' inferred moves of unknown cause) may be any
    of them (a real-time task's is no load balance's).
    A cause agrees when ``sure <= kernel <= sure + unsure + unknown``
    (:data:`~harmony.analysis.thresholds.SCHEDSTAT_SLACK` more: see there).

    ``lb_gained`` counts every task ``detach_tasks`` moves, a task still queued while asleep too
    (EEVDF's delayed dequeue, Linux 6.12 on): such a move is told by its context, a balance's,
    not taken for its wake-up's placement (:func:`harmony.analysis.causes.queued_asleep`). Taken
    for one, it made the domains count one periodic move more than the trace held, no event
    lost, in about one debian 6.12 guest run in eight (bench/README.md, "Causes against the
    domains' counts").

    Returns counted (False: why_not says why), version, kernel ({cause: count}, and
    ``wake_affine``: ttwu_move_affine, reported only), all ({cause: sure count} of every task),
    unsure ({cause: count}), unknown, ours ({cause: count} of the experiment's tasks, every
    cause of the table, recorded and inferred), agreeing (the causes that agree), within (all
    of them do); and ``levels``, the same comparison level by level (:func:`by_level`), where
    the reads kept each domain's counters and ``topology`` (the manifest's) gives the domains.
    """
    if not facts or not facts.get("counting") or not {"start", "end"} <= set(facts["reads"]):
        why = (facts or {}).get("why_not") or "the kernel's /proc/schedstat was not read"
        return {"counted": False, "why_not": why}
    start, end = facts["reads"]["start"], facts["reads"]["end"]

    def total(name):
        return sum(int(end["cpus"][str(c)][name]) - int(start["cpus"][str(c)][name])
                   for c in cpus if str(c) in end["cpus"] and str(c) in start["cpus"])

    kernel = {cause: sum(total(n) for n in names) for cause, names in DOMAIN_CAUSES.items()}
    # the active balance's stopper counts its move in lb_gained[CPU_IDLE] too (detach_one_task)
    kernel["periodic"] -= kernel["active"]
    kernel["wake_affine"] = total("ttwu_move_affine")
    w = [int(start["before_ns"]), int(start["after_ns"]), int(end["before_ns"]),
         int(end["after_ns"])]
    moves = df_all_moves(events)
    moves = moves[in_set(moves["dst_cpu"].to_numpy(), cpus)]
    ts = moves["ts"].to_numpy()
    sure = (ts > w[1]) & (ts < w[2])
    unsure = ((ts >= w[0]) & (ts <= w[1])) | ((ts >= w[2]) & (ts <= w[3]))
    cause = moves["cause"].astype(str).to_numpy()
    m_ts = migrations["ts"].to_numpy()
    mine = migrations[(m_ts >= w[0]) & (m_ts <= w[3])
                      & (migrations["src_cpu"].to_numpy() != migrations["dst_cpu"].to_numpy())]
    m_cause = mine["cause"].astype(str).to_numpy()
    fair = ~moves["rt"].to_numpy()      # load_balance moves only fair tasks
    unknown = (int(((cause == "unknown") & (sure | unsure) & fair).sum())
               + int(((m_cause == "unknown") & mine["inferred"].to_numpy()).sum()))
    out = {"counted": True, "version": int(end["version"]), "kernel": kernel,
           "all": {c: int(((cause == c) & sure).sum()) for c in DOMAIN_CAUSES},
           "unsure": {c: int(((cause == c) & unsure).sum()) for c in DOMAIN_CAUSES},
           "unknown": unknown,
           "ours": {c: int((m_cause == c).sum()) for c in migrations["cause"].cat.categories}}
    out["agreeing"] = [c for c in DOMAIN_CAUSES if out["all"][c] <= kernel[c]
                       <= out["all"][c] + out["unsure"][c] + unknown + SCHEDSTAT_SLACK]
    out["within"] = len(out["agreeing"]) == len(DOMAIN_CAUSES)
    out["levels"] = by_level(start, end, cpus, moves, mine, w, topology)
    return out


def _kernel_by_level(start: dict, end: dict, cpus: list[int],
                     names: dict[int, list[str]]) -> dict[str, dict[str, int]] | None:
    """{level key: {cause: count}} of the domain counters between two reads, summed over the
    CPUs of the set domain by domain; None where a read kept no domain lines, or a CPU's
    domains changed between the reads (rebuilt: a CPU taken offline, a cpuset partition)."""
    if "domains" not in start or "domains" not in end:
        return None
    out: dict[str, dict[str, int]] = {}
    for c in cpus:
        a, b = start["domains"].get(str(c)), end["domains"].get(str(c))
        if a is None or b is None:
            continue
        if [d["span"] for d in a] != [d["span"] for d in b]:
            return None
        # the run's topology's keys; a CPU it lacks or whose chain is shorter: the read's own
        known = names.get(c, [])
        own = chain_keys(b)
        for k, (da, db) in enumerate(zip(a, b)):
            key = known[k] if k < len(known) else own[k]
            got = out.setdefault(key, dict.fromkeys([*DOMAIN_CAUSES, "wake_affine"], 0))
            for cause, counters in DOMAIN_CAUSES.items():
                got[cause] += sum(int(db[n]) - int(da[n]) for n in counters)
            got["wake_affine"] += int(db["ttwu_move_affine"]) - int(da["ttwu_move_affine"])
    for got in out.values():        # the stopper's move is in lb_gained[CPU_IDLE] too
        got["periodic"] -= got["active"]
    return out


def by_level(start: dict, end: dict, cpus: list[int], moves: pd.DataFrame, mine: pd.DataFrame,
             w: list[int], topology: dict | None) -> dict | None:
    """The per-domain comparison of :func:`schedstat_agreement`, level by level: each domain's
    counters (:mod:`harmony.probes.schedstat` keeps them per domain) against every task's moves
    to a CPU of the set at that level (:func:`harmony.analysis.topology.migration_level`: the
    level a balance that made the move ran at). {level key: {kernel, all, unsure, unknown,
    agreeing, within}} with the meanings of the whole's, lowest level first; None where the
    reads or the run's domains do not allow it."""
    domains = domains_of(topology)
    if not domains:
        return None
    names = {c: [d["key"] for d in ds] for c, ds in domains.items()}
    kernel = _kernel_by_level(start, end, cpus, names)
    if kernel is None:
        return None
    table = LevelTable(domains)
    keys = table.keys + [k for k in kernel if k not in table.keys]

    def key_of(df):
        _, code = table.of(df["dst_cpu"].to_numpy(), df["src_cpu"].to_numpy())
        return np.where(code >= 0, np.asarray(table.keys + [""], object)[code], "")

    ts = moves["ts"].to_numpy()
    sure = (ts > w[1]) & (ts < w[2])
    unsure = ((ts >= w[0]) & (ts <= w[1])) | ((ts >= w[2]) & (ts <= w[3]))
    cause = moves["cause"].astype(str).to_numpy()
    fair = ~moves["rt"].to_numpy()
    level, m_level = key_of(moves), key_of(mine)
    m_unknown = ((mine["cause"].astype(str).to_numpy() == "unknown")
                 & mine["inferred"].to_numpy())
    out = {}
    for key in keys:
        at = level == key
        got = {"kernel": kernel.get(key, dict.fromkeys([*DOMAIN_CAUSES, "wake_affine"], 0)),
               "all": {c: int(((cause == c) & sure & at).sum()) for c in DOMAIN_CAUSES},
               "unsure": {c: int(((cause == c) & unsure & at).sum()) for c in DOMAIN_CAUSES},
               "unknown": int(((cause == "unknown") & (sure | unsure) & fair & at).sum())
               + int((m_unknown & (m_level == key)).sum())}
        got["agreeing"] = [c for c in DOMAIN_CAUSES if got["all"][c] <= got["kernel"][c]
                           <= got["all"][c] + got["unsure"][c] + got["unknown"]
                           + SCHEDSTAT_SLACK]
        got["within"] = len(got["agreeing"]) == len(DOMAIN_CAUSES)
        out[key] = got
    return out
