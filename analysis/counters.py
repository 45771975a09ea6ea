"""The trace against each task's own scheduler counters, read from /proc/<pid>/sched at the start
and at the end of a run (:mod:`harmony.probes.proc_sched`).

Needs events: sched_migrate_task, sched_switch (and what :func:`df_runs` needs, for CPU time);
the ``kernel_counters`` table of a run (read, pid, before_ns, after_ns, nr_migrations,
nr_switches, sum_exec_ns).

Between a task's two reads the kernel counted its migrations (to another CPU), its switches away
and its CPU time; the trace must show as many ``sched_migrate_task`` events of the task with
orig_cpu != dest_cpu, as many ``sched_switch`` events with the task as prev, and as much run time.
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

COUNTS = ("migrations", "switches")


def _events_of(pid_col: np.ndarray, ts: np.ndarray, pids: np.ndarray):
    """(pid, ts) of the events whose pid is in ``pids``, sorted by pid then time."""
    keep = in_set(pid_col, pids)
    p, t = pid_col[keep].astype(np.int64), ts[keep]
    order = np.lexsort((t, p))
    return p[order], t[order]


def _count_between(p_sorted, t_sorted, pid: int, lo: int, hi: int, inclusive: bool) -> int:
    """Events of ``pid`` in (lo, hi), or in [lo, hi] if ``inclusive``."""
    a, b = np.searchsorted(p_sorted, pid, "left"), np.searchsorted(p_sorted, pid, "right")
    t = t_sorted[a:b]
    if inclusive:
        return int(np.searchsorted(t, hi, "right") - np.searchsorted(t, lo, "left"))
    return int(max(0, np.searchsorted(t, hi, "left") - np.searchsorted(t, lo, "right")))


def df_counter_agreement(events: pd.DataFrame, runs: pd.DataFrame,
                         counters: pd.DataFrame) -> pd.DataFrame:
    """One row per task read at both ends of the run ("start" and "end" reads).

    ``runs`` must cover the reads (a :func:`~harmony.analysis.reconstruct.df_runs` table whose
    t_end is at or after the last read). Columns:

    - pid (int32)
    - migrations_kernel, switches_kernel (int64): the counters' differences between the reads
    - migrations_trace, switches_trace (int64): the task's events surely between the reads
    - migrations_unsure, switches_unsure (int64): its events inside a read's window
    - migrations_agree, switches_agree (bool): trace <= kernel <= trace + unsure
    - cpu_kernel_ns (int64): sum_exec_runtime's difference
    - cpu_trace_ns (int64): the task's run time between the reads' midpoints
    """
    start = counters[counters["read"] == "start"].drop_duplicates("pid").set_index("pid")
    end = counters[counters["read"] == "end"].drop_duplicates("pid").set_index("pid")
    pids = np.asarray(sorted(set(start.index) & set(end.index)), np.int64)
    ts = events["ts"].to_numpy()
    is_mig = event_mask(events, "sched_migrate_task")
    is_mig &= events["orig_cpu"].to_numpy() != events["target_cpu"].to_numpy()
    by = {"migrations": _events_of(events["pid"].to_numpy()[is_mig], ts[is_mig], pids),
          "switches": _events_of(events["prev_pid"].to_numpy()[event_mask(events, "sched_switch")],
                                 ts[event_mask(events, "sched_switch")], pids)}
    r_pid = runs["pid"].to_numpy().astype(np.int64)
    r_order = np.argsort(r_pid, kind="stable")
    r_pid, r_start, r_end = (r_pid[r_order], runs["start"].to_numpy()[r_order],
                             runs["end"].to_numpy()[r_order])
    rows = []
    for pid in pids.tolist():
        s, e = start.loc[pid], end.loc[pid]
        row = {"pid": pid}
        for name, (p_sorted, t_sorted) in by.items():
            sure = _count_between(p_sorted, t_sorted, pid, int(s["after_ns"]), int(e["before_ns"]),
                                  inclusive=False)
            unsure = sum(_count_between(p_sorted, t_sorted, pid, int(r["before_ns"]),
                                        int(r["after_ns"]), inclusive=True) for r in (s, e))
            counter = "nr_migrations" if name == "migrations" else "nr_switches"
            kernel = int(e[counter]) - int(s[counter])
            row |= {f"{name}_kernel": kernel, f"{name}_trace": sure, f"{name}_unsure": unsure,
                    f"{name}_agree": sure <= kernel <= sure + unsure}
        lo = (int(s["before_ns"]) + int(s["after_ns"])) // 2
        hi = (int(e["before_ns"]) + int(e["after_ns"])) // 2
        a, b = np.searchsorted(r_pid, pid, "left"), np.searchsorted(r_pid, pid, "right")
        ran = np.clip(r_end[a:b], lo, hi) - np.clip(r_start[a:b], lo, hi)
        row |= {"cpu_kernel_ns": int(e["sum_exec_ns"]) - int(s["sum_exec_ns"]),
                "cpu_trace_ns": int(ran.sum())}
        rows.append(row)
    cols = ["pid"] + [f"{n}_{k}" for n in COUNTS for k in ("kernel", "trace", "unsure", "agree")] \
        + ["cpu_kernel_ns", "cpu_trace_ns"]
    out = pd.DataFrame(rows, columns=cols)
    return out.astype({"pid": "int32", **{c: bool for c in cols if c.endswith("_agree")},
                       **{c: "int64" for c in cols[1:] if not c.endswith("_agree")}})


def counter_agreement(table: pd.DataFrame) -> dict:
    """Summary of :func:`df_counter_agreement`'s table: tasks; per count (migrations, switches):
    agreeing (tasks), kernel and trace (totals over the tasks); cpu_time_ratio (trace / kernel,
    all tasks; None without CPU time), cpu_diff_ms_max (the largest |trace - kernel| of a task);
    disagreeing (tasks whose migrations or switches disagree) and disagreements (up to 5 of
    them: pid and each count's kernel, trace, unsure)."""
    out: dict = {"tasks": int(len(table))}
    for name in COUNTS:
        out[name] = {"agreeing": int(table[f"{name}_agree"].sum()),
                     "kernel": int(table[f"{name}_kernel"].sum()),
                     "trace": int(table[f"{name}_trace"].sum())}
    kernel_cpu = int(table["cpu_kernel_ns"].sum())
    diff = (table["cpu_trace_ns"] - table["cpu_kernel_ns"]).abs()
    out["cpu_time_ratio"] = (float(table["cpu_trace_ns"].sum() / kernel_cpu) if kernel_cpu > 0
                             else None)
    out["cpu_diff_ms_max"] = float(diff.max() / 1e6) if len(table) else None
    bad = table[~(table["migrations_agree"] & table["switches_agree"])]
    out["disagreeing"] = int(len(bad))
    out["disagreements"] = [
        {"pid": int(r["pid"]), **{f"{n}_{k}": int(r[f"{n}_{k}"]) for n in COUNTS
                                  for k in ("kernel", "trace", "unsure")}}
        for _, r in bad.head(5).iterrows()]
    return out
