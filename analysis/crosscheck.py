"""Cross-checks of a reconstruction against the kernel's own view.

Needs: a rebuilt run queue (:func:`harmony.analysis.reconstruct.df_runqueue`) and kernel samples
(``kernel_samples`` of a run, read from /proc during the run:
:data:`harmony.probes.proc_stat.KERNEL_SAMPLES`).
"""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd

from harmony.analysis.causes import JIT_MIN_EVENTS, unrecorded_moves
from harmony.analysis.arrays import TABLE_KEYS_MAX, event_mask, in_set, index_of, sorted_unique
from harmony.analysis.reconstruct import runqueue_steps, steps_at, steps_by_cpu
from harmony.core.jit import use_compiled


def kernel_agreement(runqueue: pd.DataFrame, samples: pd.DataFrame, cpus: list[int],
                     t0: int, t_end: int) -> dict:
    """Compare the rebuilt per-CPU run queues with the kernel's, sweep by sweep.

    A sweep reads /proc/<pid>/stat of every task; the kernel's run queue of CPU i is the number of
    tasks in state R whose task_cpu is i. A sweep agrees when every CPU's count equals the rebuilt
    step function at the sweep's midpoint. Sweeps are not instantaneous, so a migration during a
    sweep can make an honest disagreement; ``sweep_us_median`` says how long they took.

    Returns: sweeps, agreeing, agreement (fraction, None without sweeps), sweep_us_median,
    disagreements (up to 10 examples: t, cpu, kernel, rebuilt).
    """
    s_ts = samples["ts"].to_numpy()
    keep = (s_ts >= t0) & (s_ts <= t_end)
    if not keep.any():
        return {"sweeps": 0, "agreeing": 0, "agreement": None, "sweep_us_median": None,
                "disagreements": []}
    ts = s_ts[keep].astype(np.int64)
    sweeps, first = np.unique(ts, return_index=True)
    # the kernel's run queue per (sweep, CPU of the set): tasks in state R whose task_cpu it is
    col = index_of(samples["cpu"].to_numpy()[keep], cpus)
    running = (samples["state"] == "R").to_numpy()[keep] & (col >= 0)
    kernel = np.zeros((len(sweeps), len(cpus)), np.int64)
    np.add.at(kernel, (np.searchsorted(sweeps, ts[running]), col[running]), 1)
    rebuilt = steps_at(runqueue_steps(runqueue), sweeps, cpus, absent=0)
    same = kernel == rebuilt
    agree = same.all(axis=1)
    examples = [{"t": (int(sweeps[i]) - t0) / 1e9, "cpu": cpus[c], "kernel": int(kernel[i, c]),
                 "rebuilt": int(rebuilt[i, c])} for i, c in np.argwhere(~same)[:10]]
    return {"sweeps": int(len(agree)), "agreeing": int(agree.sum()),
            "agreement": float(agree.mean()),
            "sweep_us_median": float(np.median(samples["sweep_ns"].to_numpy()[keep][first]) / 1e3),
            "disagreements": examples}


def nr_running_agreement(runqueue: pd.DataFrame, samples: pd.DataFrame, cpus: list[int],
                         t0: int, t_end: int) -> dict:
    """Compare the rebuilt run queues with the kernel's own ``nr_running`` (sched debug file).

    Needs: a rebuilt run queue (:func:`harmony.analysis.reconstruct.df_runqueue`) and the
    ``kernel_nr_running`` table of a run (:data:`harmony.probes.sched_debug.KERNEL_NR_RUNNING`).

    ``nr_running`` counts every task on the run queue; the rebuilt one counts experiment tasks. A
    sample is usable ("clean") only when, on every CPU of the set, the tasks the kernel lists as
    runnable are experiment tasks or the sampler's own thread (which is running while it reads and
    is subtracted), and the list agrees with the count (a task on its way to sleep is still counted
    but no longer listed as runnable, and it may be anyone's). The kernel wrote a sample at some
    instant of its window [lo, hi], so a CPU agrees when its count lies between the smallest and
    largest rebuilt value in that window; a sample agrees when every CPU does.
    ``agreement_at_midpoint`` is the stricter comparison at the window's middle only.

    On a busy host few samples are clean on every CPU at once; ``cpu_clean`` / ``cpu_agreement``
    apply the same test to each (sample, CPU) pair whose own CPU ran only experiment tasks, and
    ``adjusted_agreement`` uses every sample, with the kernel's count reduced by the other
    runnable tasks it lists (weaker: it trusts the list as much as the count).

    Returns: samples (in [t0, t_end]), clean, agreeing, agreement (fraction of clean samples, None
    without any), agreement_at_midpoint, cpu_clean, cpu_agreeing, cpu_agreement,
    adjusted_agreement (fraction of all samples), count_list_mismatch ((sample, CPU) pairs whose
    nr_running differs from the number listed runnable), window_us_median,
    busy_comms (up to 5 comms that made samples unclean, with counts), disagreements (up to 10
    among the clean samples: t, cpu, kernel, rebuilt_min, rebuilt_max).
    """
    col = {name: samples[name].to_numpy() for name in
           ("ts", "lo", "hi", "cpu", "nr_running", "reader", "others", "listed_runnable")}
    keep = (col["lo"] >= t0) & (col["hi"] <= t_end) & in_set(col["cpu"], cpus)
    ts, lo, hi, cpu, nr, reader, others, listed = (
        col[k][keep].astype(np.int64) for k in ("ts", "lo", "hi", "cpu", "nr_running", "reader",
                                                   "others", "listed_runnable"))
    stamps, sample_of = np.unique(ts, return_inverse=True)
    out = {"samples": int(len(stamps)), "clean": 0, "agreeing": 0, "agreement": None,
           "agreement_at_midpoint": None, "cpu_clean": 0, "cpu_agreeing": 0, "cpu_agreement": None,
           "adjusted_agreement": None, "count_list_mismatch": 0, "window_us_median": None,
           "busy_comms": {}, "disagreements": []}
    if not len(ts):
        return out
    steps = runqueue_steps(runqueue)
    lo_a, hi_a, _ = _window_range(steps, cpu, lo, hi, ts)
    k_a = nr - reader - others
    adjusted_ok = (k_a >= lo_a) & (k_a <= hi_a)
    out["adjusted_agreement"] = float(_all_per(sample_of, adjusted_ok, len(stamps)).mean())
    steady = (others == 0) & (nr == listed)
    if steady.any():
        k = (nr - reader)[steady]
        lo_v, hi_v, _ = _window_range(steps, cpu[steady], lo[steady], hi[steady], ts[steady])
        ok = (k >= lo_v) & (k <= hi_v)
        out |= {"cpu_clean": int(len(k)), "cpu_agreeing": int(ok.sum()),
                "cpu_agreement": float(ok.mean())}
    # clean samples: every CPU of the set read, none of them with another task runnable
    width = int(cpu.max()) + 1
    pairs = sorted_unique(sample_of * width + cpu) // width
    complete = np.bincount(pairs, minlength=len(stamps)) == len(cpus)
    clean = complete & _all_per(sample_of, steady, len(stamps))
    comms = samples["other_comms"].to_numpy()[keep][others > 0]
    busy = collections.Counter(c for text in comms if isinstance(text, str)
                               for c in text.split(","))
    out["busy_comms"] = {str(k): int(v) for k, v in
                         sorted(busy.items(), key=lambda kv: -kv[1])[:5]}  # ties: first seen first
    out["count_list_mismatch"] = int((nr != listed).sum())
    out["window_us_median"] = float(np.median(hi - lo) / 1e3)
    rows = np.flatnonzero(clean[sample_of])
    if not len(rows):
        return out
    rows = rows[np.lexsort((cpu[rows], ts[rows]))]
    kernel = (nr - reader)[rows]
    lo_v, hi_v, mid_v = _window_range(steps, cpu[rows], lo[rows], hi[rows], ts[rows])
    ok = (kernel >= lo_v) & (kernel <= hi_v)
    agree = _all_per(sample_of[rows], ok, len(stamps))[clean]
    agree_mid = _all_per(sample_of[rows], kernel == mid_v, len(stamps))[clean]
    examples = [{"t": (int(ts[rows[k]]) - t0) / 1e9, "cpu": int(cpu[rows[k]]),
                 "kernel": int(kernel[k]), "rebuilt_min": int(lo_v[k]), "rebuilt_max": int(hi_v[k])}
                for k in np.flatnonzero(~ok)[:10]]
    out |= {"clean": int(len(agree)), "agreeing": int(agree.sum()),
            "agreement": float(agree.mean()),
            "agreement_at_midpoint": float(agree_mid.mean()), "disagreements": examples}
    return out


def _all_per(group: np.ndarray, ok: np.ndarray, n: int) -> np.ndarray:
    """For each group id 0..n-1: whether ``ok`` holds on all of its rows (True for none)."""
    return np.bincount(group, weights=~ok, minlength=n) == 0


def _window_range(steps, cpu: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  mid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Smallest, largest and middle value of the rebuilt step function of ``cpu`` in [lo, hi]
    (-1 where it has not begun by ``hi``); ``steps`` from :func:`runqueue_steps`."""
    vmin = np.full(len(cpu), -1, np.int64)
    vmax = np.full(len(cpu), -1, np.int64)
    vmid = np.full(len(cpu), -1, np.int64)
    for c, ts, nr in steps_by_cpu(steps):
        sel = np.flatnonzero(cpu == c)
        if not sel.size:
            continue
        i_lo = np.searchsorted(ts, lo[sel], side="right") - 1
        i_hi = np.searchsorted(ts, hi[sel], side="right") - 1
        i_mid = np.searchsorted(ts, mid[sel], side="right") - 1
        begun = i_hi >= 0
        sel, i_lo, i_hi, i_mid = sel[begun], np.maximum(i_lo[begun], 0), i_hi[begun], i_mid[begun]
        vmin[sel], vmax[sel] = _range_min_max(nr, i_lo, i_hi)
        vmid[sel] = np.where(i_mid >= 0, nr[np.maximum(i_mid, 0)], -1)
    return vmin, vmax, vmid


def _range_min_max(values: np.ndarray, a: np.ndarray, b: np.ndarray,
                   wide: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """min and max of values[a[k]:b[k] + 1] for every k (a <= b). A sampler's window spans a few
    steps: one vectorised pass per step offset, and a slice each for the rare wider ones."""
    mn = values[a].astype(np.int64)
    mx = mn.copy()
    width = np.maximum(b - a, 0)
    for step in range(1, min(int(width.max(initial=0)), wide) + 1):
        k = np.flatnonzero((width >= step) & (width <= wide))
        v = values[a[k] + step]
        mn[k] = np.minimum(mn[k], v)
        mx[k] = np.maximum(mx[k], v)
    for k in np.flatnonzero(width > wide):
        seg = values[a[k]:b[k] + 1]
        mn[k], mx[k] = seg.min(), seg.max()
    return mn, mx


# ------------------------------------------------------------------------------------------------
# completeness of one probe's event stream, judged by the stream itself

def silent_contexts(events: pd.DataFrame) -> list[dict]:
    """Tasks a probe saw run and leave a CPU, yet recorded no event in the context of.

    A task that runs and is switched away from fires at least its own sched_switch (prev = it), so
    a probe that recorded none of its events at all is blind in that task's context: it also misses
    what fires there from interrupts, e.g. the balancing migrations an idle CPU's swapper does from
    its softirq. Measured on this host (kernel 6.18, perf 6.1, over 16 <4,0> runs): perf records
    nothing in the context of swapper/1 and of the threads of PID 1 (the VM's init agent), at any
    interrupt level, and counts nothing lost; tracefs records nothing in the context of some of
    those threads and none of swapper/1's task-level events (its switch-out).

    Needs events: sched_switch (and whatever else was recorded, for the context counts).
    Returns one dict per blind context, most runs first: pid, cpu (the CPU for pid 0, whose
    swapper is one task per CPU; -1 otherwise), comm, runs (times it was switched in and later
    replaced on that CPU), records (0).
    """
    switch = event_mask(events, "sched_switch")
    if not switch.any():
        return []
    cpu = events["cpu"].to_numpy()
    cp = events["common_pid"].to_numpy()
    pid = events["pid"].to_numpy()
    n_pids = max(int(cp.max()), int(pid.max()), 0) + 1
    if use_compiled(len(events), JIT_MIN_EVENTS) and cpu.min() >= 0 and n_pids <= TABLE_KEYS_MAX:
        from harmony.analysis import checks_jit  # the compiled kernels: only on this path
        rows = checks_jit.dark_switches(switch, cpu, cp, pid, int(cpu.max()) + 1, n_pids)
        return _contexts(events, rows, pid[rows], cpu[rows])
    idx = np.flatnonzero(switch)
    del switch
    # contexts with a record: a pid, or for pid 0 (one swapper per CPU) the CPU
    heard = np.zeros(max(int(cp.max()), 0) + 2, bool)
    # every pid at once where none is negative (no mask and copy of millions of them); pid 0's
    # contexts are the swappers', one a CPU: below
    heard[cp if cp.min(initial=0) >= 0 else cp[cp > 0]] = True
    heard[0] = False
    idle_heard = np.zeros(max(int(cpu.max()), 0) + 1, bool)
    idle_heard[cpu[cp == 0]] = True
    # the switches' columns in their own types, and no array of switch numbers kept: this runs
    # beside the task records (pipeline.capture_checks), whose memory it adds to (its peak at 9.4 M
    # events of perf.data 172 -> 126 MiB, tracemalloc; 0.20 -> 0.17 s)
    nxt = pid[idx]
    scpu = cpu[idx]
    # a switch-in completed a run when a later switch happened on the same CPU (rows are in time
    # order): every switch but each CPU's last
    last = np.full(len(idle_heard), -1, np.int64)
    np.maximum.at(last, scpu.astype(np.intp), np.arange(len(idx)))    # ufunc.at: fastest in intp
    done = np.ones(len(idx), bool)
    done[last[last >= 0]] = False
    # a pid below 0 or above every recorded one: a slot never set (heard[0] is cleared above;
    # pid 0 is the idle branch)
    dark = done & np.where(nxt == 0, ~idle_heard[scpu], ~np.take(heard, nxt, mode="clip"))
    del done
    rows = np.flatnonzero(dark)
    return _contexts(events, idx[rows], nxt[rows], scpu[rows])


def _contexts(events: pd.DataFrame, rows: np.ndarray, nxt: np.ndarray,
              cpu: np.ndarray) -> list[dict]:
    """silent_contexts' dicts of the switches at ``rows`` (their next pids ``nxt`` and CPUs),
    each a run of a silent context, in row order."""
    # context key: pid, and for pid 0 the CPU; ascending, as the contexts are listed at a tie
    dn, dc = nxt.astype(np.int64), cpu.astype(np.int64)
    keys, first, runs = np.unique(dn * 4096 + np.where(dn == 0, dc, 4095),
                                  return_index=True, return_counts=True)
    comm = events["comm"]
    out = [{"pid": int(k // 4096), "cpu": int(k % 4096) if k // 4096 == 0 else -1,
            "comm": str(comm.iat[rows[f]]), "runs": int(r), "records": 0}
           for k, f, r in zip(keys, first, runs)]
    return sorted(out, key=lambda d: -d["runs"])


def unrecorded_migrations(events: pd.DataFrame, pids=None, examples: int = 5) -> dict:
    """Moves a task's own events prove but no sched_migrate_task records
    (:func:`harmony.analysis.causes.unrecorded_moves`), as a capture's facts.

    ``pids``: tasks to check (default: every task but the swappers). Returns n (moves), pids
    (tasks with one), examples (up to ``examples``: pid, ts of the placement that proved it,
    from_cpu, to_cpu).
    """
    mv = unrecorded_moves(events, pids)
    return {"n": int(len(mv["pid"])), "pids": [int(x) for x in np.unique(mv["pid"])],
            "examples": [{"pid": int(mv["pid"][k]), "ts": int(mv["ts"][k]),
                          "from_cpu": int(mv["from_cpu"][k]), "to_cpu": int(mv["to_cpu"][k])}
                         for k in range(min(examples, len(mv["pid"])))]}
