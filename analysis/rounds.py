"""Balancing rounds onto a target CPU, first-round moves, steal latency and detection intervals.

Metrics of experiments E2-E5 (thesis 6.3-6.4; /work/shared/EXPERIMENTS.md). Every function works
for any CPU count P. Inputs are the reconstructed tables of :mod:`harmony.analysis.reconstruct`
(``migrations``, ``runqueue``, ``runs``) and, for the steal latency, the canonical ``events``.

**Balancing round.** The kernel moves tasks between two CPUs in one balancing pass
(``load_balance()`` detaches several tasks in a row, microseconds apart); passes are separated by
the balance interval (milliseconds). A round is therefore defined from the trace as a maximal
burst of migrations onto the target in which consecutive migrations are at most ``gap_ms`` apart;
a longer gap starts the next round. A round may take tasks from several source CPUs; the *first
source* of a round is the source of its first migration.

**Which migrations a round counts.** E2 asks how many tasks *one balancing pass* moves: the count
``load_balance()`` derives from the imbalance it measures between the busiest group and the
pulling CPU. Given the migrations' causes (:mod:`harmony.analysis.causes`), a round is made of
:data:`ROUND_CAUSES`:

- ``periodic`` (moved inside a SCHED softirq: the destination's periodic balance, or the nohz
  idle balance the idle-load-balance CPU runs on its behalf) is that pass;
- ``active`` is counted: it is the same periodic pass's own outcome when it could detach no
  queued task (all running, cache-hot or pinned) and had the source's stopper push the running
  one; leaving it out would read such a pass as "moved nothing";
- ``newidle`` is not: a CPU about to go idle pulls so that it has something to run, and on a
  preemptible kernel ``detach_tasks()`` stops after the first task it takes on that path
  ("NEWIDLE balancing is a source of latency"), so its count is one by construction and says
  nothing of how many the policy would move; counted, a target whose own tasks blocked for an
  instant would read a first round of one;
- wake-up placements (``wakeup``), ``fork``, ``affinity`` (a cpuset or affinity change moving
  the task) and ``numa`` are not balancing decisions at all.

Without the causes (a probe that did not record the scheduler's softirq, such as ``--probe perf``,
or an imported trace without it: periodic and new-idle pulls are then ``unknown``), rounds fall
back to :data:`FALLBACK_KINDS`, every move of a runnable task (the load balancer's, of any path),
and :func:`round_rule` says so, so that a summary or the card can say which rule counted.

Times: ``ts*`` int64 ns on the trace clock, ``t*`` float seconds since t0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harmony.analysis.arrays import event_mask, sorted_unique
from harmony.analysis.reconstruct import NS, runqueue_at
from harmony.analysis.taskstate import record_ts, task_records

ROUND_COLUMNS = ["ts", "t", "pid", "name", "role", "src_cpu", "dst_cpu", "kind", "cause", "round",
                 "gap_ms"]

#: the causes of the migrations a balancing round is made of, when the causes are known (see the
#: module docstring for why these and not newidle)
ROUND_CAUSES = ("periodic", "active")
#: the migration kinds a round is made of when the causes are not known: moves of runnable tasks
FALLBACK_KINDS = ("balance",)


def round_rule(causes_known: bool) -> dict:
    """How rounds are counted in a run: from :data:`ROUND_CAUSES` when its causes are known (the
    scheduler's softirq was recorded), else from :data:`FALLBACK_KINDS`.

    Returns a dict: ``rule`` (str: the causes joined by "+", e.g. "periodic+active", or
    "runnable" for the fall-back), ``text`` (the same in words, for a summary or the card), and
    ``select`` (the keyword arguments of :func:`df_target_rounds` that apply it)."""
    if causes_known:
        return {"rule": "+".join(ROUND_CAUSES), "select": {"causes": ROUND_CAUSES},
                "text": f"migrations whose cause is {' or '.join(ROUND_CAUSES)}"}
    return {"rule": "runnable", "select": {"kinds": FALLBACK_KINDS},
            "text": "every move of a runnable task (causes unknown: the scheduler's softirq was "
                    "not recorded)"}


def df_target_rounds(migrations: pd.DataFrame, target: int, gap_ms: float = 1.0,
                     t_from: float = 0.0, kinds=FALLBACK_KINDS, causes=None) -> pd.DataFrame:
    """Migrations onto ``target`` at or after ``t_from`` (s since t0), grouped into rounds.

    Needs: a migrations table (:func:`~harmony.analysis.reconstruct.df_migrations`; uses ts, t,
    pid, name, role, src_cpu, dst_cpu, kind, cause). See the module docstring for the round
    definition. Counted: the migrations whose ``cause`` is one of ``causes`` when given (e.g.
    :data:`ROUND_CAUSES`), else those whose ``kind`` is one of ``kinds``.

    Columns: ts (int64 ns), t (float s since t0), pid, name, role, src_cpu, dst_cpu, kind, cause
    (as in the migrations table), round (int64, 1-based, in time order), gap_ms (float: time since
    the previous counted migration onto the target, NaN for the first). Sorted by ts.
    """
    if gap_ms <= 0:
        raise ValueError("gap_ms must be positive")
    m = migrations
    which = (m["cause"].astype(str).isin(list(causes)) if causes is not None
             else m["kind"].astype(str).isin(list(kinds)))
    sel = ((m["dst_cpu"].to_numpy() == int(target)) & (m["t"].to_numpy() >= t_from)
           & which.to_numpy())
    out = m.loc[sel, ROUND_COLUMNS[:9]].sort_values("ts", kind="stable")
    out = out.reset_index(drop=True)
    ts = out["ts"].to_numpy(dtype=np.int64)
    gap = np.full(len(ts), np.nan)
    if len(ts):
        gap[1:] = np.diff(ts) / 1e6
    new_round = np.ones(len(ts), dtype=bool)
    new_round[1:] = gap[1:] > gap_ms
    out["round"] = np.cumsum(new_round).astype(np.int64)
    out["gap_ms"] = gap
    return out


def df_round_moves(rounds: pd.DataFrame) -> pd.DataFrame:
    """Tasks moved per round and source CPU (tidy: one row per (round, src_cpu)).

    Needs: the output of :func:`df_target_rounds`.

    Columns: round (int64), src_cpu (int64), moved (int64), ts_start, ts_end (int64 ns: first and
    last of these moves), t_start, t_end (float s since t0), first_source (bool: this source gave
    the round's first migration). Sorted by (round, ts_start).
    """
    cols = ["round", "src_cpu", "moved", "ts_start", "ts_end", "t_start", "t_end", "first_source"]
    if not len(rounds):
        return pd.DataFrame({c: pd.Series(dtype="bool" if c == "first_source" else
                                          "float64" if c.startswith("t_") else "int64")
                             for c in cols})
    g = rounds.groupby(["round", "src_cpu"], sort=False)
    out = g.agg(moved=("ts", "size"), ts_start=("ts", "min"), ts_end=("ts", "max"),
                t_start=("t", "min"), t_end=("t", "max")).reset_index()
    first_src = rounds.groupby("round", sort=False)["src_cpu"].first()
    out["first_source"] = out["src_cpu"].to_numpy() == first_src.reindex(out["round"]).to_numpy()
    out = out.astype({"round": "int64", "src_cpu": "int64", "moved": "int64",
                      "ts_start": "int64", "ts_end": "int64"})
    return out.sort_values(["round", "ts_start"], kind="stable").reset_index(drop=True)[cols]


def predictions(q_src: float, q_target: float, ntasks: int, ncpus: int) -> dict:
    """What a first move from a source to the target would be under the two policies (thesis 6.3).

    poly-balance: the source's excess over the global mean, q_src - N/P (needs global
    information); pairwise: half the difference of the pair, (q_src - q_target) / 2. On 2 CPUs
    with a target that holds N/P - excess they coincide, so E2 tells them apart only for P > 2.
    """
    return {"poly_prediction": float(q_src - ntasks / ncpus),
            "pairwise_prediction": float((q_src - q_target) / 2)}


def first_round(rounds: pd.DataFrame, runqueue: pd.DataFrame, target: int, ntasks: int,
                ncpus: int, ts_ref: int) -> dict:
    """The first balancing round onto ``target`` and the two policies' predictions for it.

    Needs: :func:`df_target_rounds` output and the run-queue table
    (:func:`~harmony.analysis.reconstruct.df_runqueue`). The queues used for the predictions are
    those just before the round's first migration (``ts_ref``, normally t0, when there is no
    round); the *first source* is the source CPU of the round's first migration.

    Returns a dict: source (CPU or None), moved (tasks moved from the first source in the round),
    to_target (all tasks moved in the round), sources (number of source CPUs in the round),
    ts_start, ts_end, t_start, t_end (None without a round), q_src, q_target (queues before it),
    poly_prediction, pairwise_prediction (see :func:`predictions`), rounds (number of rounds).
    """
    out = {"source": None, "moved": None, "to_target": None, "sources": None, "ts_start": None,
           "ts_end": None, "t_start": None, "t_end": None, "q_src": None, "q_target": None,
           "poly_prediction": None, "pairwise_prediction": None,
           "rounds": int(rounds["round"].max()) if len(rounds) else 0}
    if not len(rounds):
        return out
    r1 = rounds[rounds["round"] == 1]
    src = int(r1["src_cpu"].iloc[0])
    ts_start, ts_end = int(r1["ts"].iloc[0]), int(r1["ts"].iloc[-1])
    q = runqueue_at(runqueue, [ts_start - 1]).iloc[0]
    q_src, q_tgt = int(q.get(src, -1)), int(q.get(int(target), -1))
    out.update(source=src, moved=int((r1["src_cpu"] == src).sum()), to_target=int(len(r1)),
               sources=int(r1["src_cpu"].nunique()), ts_start=ts_start, ts_end=ts_end,
               t_start=float(r1["t"].iloc[0]), t_end=float(r1["t"].iloc[-1]),
               q_src=q_src, q_target=q_tgt)
    if q_src >= 0 and q_tgt >= 0:
        out.update(predictions(q_src, q_tgt, ntasks, ncpus))
    return out


# ------------------------------------------------------------------------------- steal latency

def df_target_load(runqueue: pd.DataFrame, events: pd.DataFrame, tasks: pd.DataFrame,
                   target: int, t0: int, t_end: int | None = None) -> pd.DataFrame:
    """The target's run queue, and how much of it is tasks that are already exiting.

    Needs: the run-queue table and the events of
    :func:`~harmony.analysis.taskstate.task_records` (sched_switch, sched_wakeup[_new],
    sched_migrate_task, sched_process_exit). A task that exits fires sched_process_exit while
    still running; the kernel dequeues it, may pull a task onto the now idle CPU (newidle
    balance, which traces sched_migrate_task) and only then traces the switch away from the dead
    task. Its exit work can also be preempted: switched out runnable, it is switched in again
    before its dead switch-out. The rebuilt queue therefore counts an exiting task until its last
    switch-out, and may never show 0 even though the CPU went idle. ``dying`` counts the
    experiment tasks on ``target`` from their sched_process_exit to where the rebuilt queue
    drops them (the switch-out after which they are not switched in again, or their move off
    ``target``); ``effective = nr - dying`` is the load the balancer saw.

    Columns: ts (int64 ns), t (float s since t0), nr (int64: rebuilt queue), dying (int64),
    effective (int64). One row per change of either, sorted by ts; each value holds until the
    next row. Exits at or after ``t_end`` (the workers killed when the run ends) are left out.
    """
    target = int(target)
    rq = runqueue[runqueue["cpu"] == target]
    pids = tasks["pid"].to_numpy()
    ev_pid = events["pid"].to_numpy()
    ev_cpu = events["cpu"].to_numpy()
    ev_ts = events["ts"].to_numpy(dtype=np.int64)
    is_exit = event_mask(events, "sched_process_exit") & np.isin(ev_pid, pids) & (ev_cpu == target)
    if t_end is not None:
        is_exit &= ev_ts < t_end
    d_ts, d = [], []
    if is_exit.any():
        ends = _exit_ends(events, tasks, target, np.flatnonzero(is_exit))
        for ts_exit, end in zip(ev_ts[is_exit], ends):
            d_ts.append(int(ts_exit))
            d.append(1)
            if end is not None:  # None: no last switch-out seen, dying until the trace's end
                d_ts.append(end)
                d.append(-1)
    times = sorted_unique(np.concatenate([rq["ts"].to_numpy(dtype=np.int64),
                                      np.asarray(d_ts, dtype=np.int64)]))
    nr = (runqueue_at(rq, times)[target].to_numpy() if len(rq)
          else np.zeros(len(times), dtype=np.int64))
    nr = np.maximum(nr, 0)
    d_ts, d = np.asarray(d_ts, dtype=np.int64), np.asarray(d, dtype=np.int64)
    o = np.argsort(d_ts, kind="stable")
    cum = np.cumsum(d[o])
    i = np.searchsorted(d_ts[o], times, side="right") - 1
    dying = np.where(i >= 0, cum[np.maximum(i, 0)] if len(cum) else 0, 0).astype(np.int64)
    out = pd.DataFrame({"ts": times, "t": (times - np.int64(t0)) / NS, "nr": nr.astype(np.int64),
                        "dying": dying, "effective": np.maximum(nr - dying, 0).astype(np.int64)})
    keep = np.ones(len(out), dtype=bool)
    keep[1:] = ((out["nr"].to_numpy()[1:] != out["nr"].to_numpy()[:-1])
                | (out["dying"].to_numpy()[1:] != out["dying"].to_numpy()[:-1]))
    return out[keep].reset_index(drop=True)


def _exit_ends(events: pd.DataFrame, tasks: pd.DataFrame, target: int,
               exit_rows: np.ndarray) -> list[int | None]:
    """For each exit on ``target`` (the events row of its sched_process_exit), when the task
    left the target's queue as the rebuilt queue has it: its first record after the exit that
    leaves it not runnable or on another CPU (:func:`~harmony.analysis.taskstate.task_records`:
    its last switch-out, or its move off ``target``); None if the trace holds none."""
    r = task_records(events, tasks["pid"].to_numpy().astype(np.int32))
    pid, seq = r["pid"].to_numpy(), r["seq"].to_numpy()
    left = ~r["runnable_after"].to_numpy() | (r["cpu_after"].to_numpy() != target)
    ends: list[int | None] = []
    for row, p in zip(exit_rows.tolist(), events["pid"].to_numpy()[exit_rows].tolist()):
        lo, hi = np.searchsorted(pid, p), np.searchsorted(pid, p, side="right")
        k = np.flatnonzero(left[lo:hi] & (seq[lo:hi] > 2 * row))
        ends.append(int(record_ts(events, seq[lo + k[:1]])[0]) if len(k) else None)
    return ends


def cpu_occupancy(events: pd.DataFrame, cpu: int, tasks: pd.DataFrame, ts_a: int,
                  ts_b: int) -> dict:
    """What ``cpu`` ran during [ts_a, ts_b): the idle task, experiment tasks, or anything else.

    Needs events: sched_switch (every task's). The task current at ts_a is the ``next`` of the
    last switch on ``cpu`` before it (unknown before the first switch: counted as ``unknown_s``).

    Returns a dict of seconds: idle_s (pid 0), experiment_s (pids of ``tasks``), other_s (any
    other task: the controller, the probe, other users' work), unknown_s.
    """
    is_sw = event_mask(events, "sched_switch") & (events["cpu"].to_numpy() == int(cpu))
    ts = events["ts"].to_numpy(dtype=np.int64)[is_sw]
    nxt = events["pid"].to_numpy()[is_sw]
    out = {"idle_s": 0.0, "experiment_s": 0.0, "other_s": 0.0, "unknown_s": 0.0}
    if ts_b <= ts_a:
        return out
    i = np.searchsorted(ts, ts_a, side="right") - 1
    j = np.searchsorted(ts, ts_b, side="left")
    edges = np.concatenate([[ts_a], ts[i + 1:j], [ts_b]]).astype(np.int64)
    who = np.concatenate([[nxt[i] if i >= 0 else -1], nxt[i + 1:j]])
    dur = np.diff(edges) / NS
    exp = np.isin(who, tasks["pid"].to_numpy())
    out["idle_s"] = float(dur[who == 0].sum())
    out["experiment_s"] = float(dur[exp].sum())
    out["unknown_s"] = float(dur[who == -1].sum())
    out["other_s"] = float(dur[(who > 0) & ~exp].sum())
    return out


def steal_latency(load: pd.DataFrame, migrations: pd.DataFrame, runs: pd.DataFrame,
                  tasks: pd.DataFrame, target: int, t0: int, ts_from: int,
                  events: pd.DataFrame | None = None) -> dict:
    """E4 work conservation: from the target going idle to the first task it takes from elsewhere.

    Needs: :func:`df_target_load` (the target's effective queue), the migrations table and the
    runs table (:func:`~harmony.analysis.reconstruct.df_runs`). The target *goes idle* at the first
    instant at or after ``ts_from`` (normally the scheduled exit of the target's tasks) at which its
    effective queue is 0. The *first pull* is the first migration of any kind onto the target at
    or after that instant; the *first run* is the first run on the target, starting at or after
    it, of a task that had been on another CPU (role other than "target").

    Its queue being empty is not yet the CPU being idle: a task's exit (freeing its memory) can
    keep the CPU busy for milliseconds after its sched_process_exit. With ``events``,
    ``ts_cpu_idle`` is the first switch to the idle task (pid 0) on the target at or after
    ``ts_idle`` and before the pull, and ``idle_latency_s`` = pull - ts_cpu_idle: how long the CPU
    actually sat idle while work waited elsewhere - the work-conservation figure (0 when the pull
    came before the CPU ever went idle; None without a pull or without events).

    Returns a dict: ts_idle, t_idle (None if the target never went idle), ts_pull, t_pull,
    latency_s (pull - idle), pull_src_cpu, pull_pid, pull_kind (None if nothing was pulled),
    ts_cpu_idle, idle_latency_s (see above),
    ts_first_run, first_run_latency_s (None if none), stolen (bool; None if never idle), and with
    ``events`` (sched_switch) idle_s / other_s: how much of the latency the target spent running
    its idle task / tasks outside the experiment (:func:`cpu_occupancy`; None without a pull). A
    work-conserving CPU keeps idle_s near 0 even when other work delays the pull.
    """
    out = dict.fromkeys(["ts_idle", "t_idle", "ts_pull", "t_pull", "latency_s", "pull_src_cpu",
                         "pull_pid", "pull_kind", "ts_first_run", "first_run_latency_s",
                         "stolen", "idle_s", "other_s", "ts_cpu_idle", "idle_latency_s"])
    ts = load["ts"].to_numpy(dtype=np.int64)
    eff = load["effective"].to_numpy()
    i0 = np.searchsorted(ts, ts_from, side="right") - 1
    cand = np.flatnonzero((eff == 0) & (np.arange(len(ts)) >= max(i0, 0)))
    if not len(cand):
        return out
    ts_idle = max(int(ts[cand[0]]), int(ts_from)) if cand[0] == i0 else int(ts[cand[0]])
    out.update(ts_idle=ts_idle, t_idle=(ts_idle - t0) / NS, stolen=False)
    m = migrations[(migrations["dst_cpu"].to_numpy() == int(target))
                   & (migrations["ts"].to_numpy() >= ts_idle)].sort_values("ts", kind="stable")
    if len(m):
        first = m.iloc[0]
        out.update(ts_pull=int(first["ts"]), t_pull=(int(first["ts"]) - t0) / NS,
                   latency_s=(int(first["ts"]) - ts_idle) / NS, pull_src_cpu=int(first["src_cpu"]),
                   pull_pid=int(first["pid"]), pull_kind=str(first["kind"]), stolen=True)
    if out["ts_pull"] is not None and events is not None:
        occ = cpu_occupancy(events, target, tasks, ts_idle, out["ts_pull"])
        out.update(idle_s=occ["idle_s"], other_s=occ["other_s"])
        sw = events[(events["event"] == "sched_switch") & (events["cpu"] == int(target))
                    & (events["pid"] == 0) & (events["ts"] >= ts_idle)
                    & (events["ts"] <= out["ts_pull"])]
        if len(sw):
            out["ts_cpu_idle"] = int(sw["ts"].iloc[0])
            out["idle_latency_s"] = (out["ts_pull"] - out["ts_cpu_idle"]) / NS
        else:
            out["idle_latency_s"] = 0.0  # never sat idle before the pull
    own = set(tasks.loc[tasks["role"].astype(str) == "target", "pid"].tolist())
    r = runs[(runs["cpu"].to_numpy() == int(target)) & (runs["start"].to_numpy() >= ts_idle)
             & ~runs["pid"].isin(own).to_numpy()].sort_values("start", kind="stable")
    if len(r):
        out.update(ts_first_run=int(r["start"].iloc[0]),
                   first_run_latency_s=(int(r["start"].iloc[0]) - ts_idle) / NS)
    return out


# -------------------------------------------------------------------------- detection intervals

def df_detection_intervals(rounds: pd.DataFrame, ts_cut: int, t0: int, n: int = 3) -> pd.DataFrame:
    """E5 detection intervals (thesis fig. 6.8): cut -> round 1 -> round 2 -> round 3 ...

    Needs: :func:`df_target_rounds` output computed from the cut on (``t_from`` = cut). Interval 1
    runs from the cut (``ts_cut``, when the target's load was reduced) to the first migration onto
    the target; interval k > 1 from the first migration of round k-1 to the first of round k. A
    round, not a single migration, is the unit because one balancing pass moves several tasks
    microseconds apart (see the module docstring).

    Columns (always ``n`` rows, in order): interval (int64, 1..n), ts_start, ts_end (float ns;
    NaN if that round never came), t_start, t_end (float s since t0), ms (float, NaN if missing),
    moved (int64: tasks moved in the round that ends the interval, 0 if missing).
    """
    by_round = rounds.groupby("round", sort=True)["ts"]
    starts = by_round.min().to_numpy(dtype=np.int64)
    sizes = by_round.size().to_numpy(dtype=np.int64)
    marks = [int(ts_cut)] + starts.tolist()
    rows = []
    for k in range(1, n + 1):
        if k < len(marks):
            a, b, moved = float(marks[k - 1]), float(marks[k]), int(sizes[k - 1])
        else:
            a, b, moved = np.nan, np.nan, 0
        rows.append((k, a, b, (a - t0) / NS, (b - t0) / NS, (b - a) / 1e6, moved))
    return pd.DataFrame(rows, columns=["interval", "ts_start", "ts_end", "t_start", "t_end", "ms",
                                       "moved"]).astype({"interval": "int64", "moved": "int64"})


def interval_keys(intervals: pd.DataFrame) -> dict:
    """``{"interval1_ms": ..., ...}`` from :func:`df_detection_intervals` (None where missing)."""
    return {f"interval{int(k)}_ms": (None if np.isnan(ms) else float(ms))
            for k, ms in zip(intervals["interval"], intervals["ms"])}


# ------------------------------------------------------------------------------- across runs

def df_run_summaries(runs) -> pd.DataFrame:
    """One row per run (e.g. the repetitions of a sweep over x) for the cross-run figures.

    Needs: loaded runs (:class:`harmony.store.Run`). Columns: path (str), experiment (str), seed,
    ncpus (int), every parameter as ``p_<name>`` (lists as comma-joined strings) and every scalar
    key of the run's summary.json.
    """
    rows = []
    for run in runs:
        m = run.manifest
        row = {"path": str(run.path), "experiment": m.get("experiment"), "seed": m.get("seed"),
               "ncpus": len(m.get("cpus", []))}
        for k, v in m.get("params", {}).items():
            row[f"p_{k}"] = ",".join(map(str, v)) if isinstance(v, list) else v
        for k, v in run.summary.items():
            if v is None or isinstance(v, (int, float, str, bool)):
                row[k] = v
        rows.append(row)
    return pd.DataFrame(rows)
