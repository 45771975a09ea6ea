"""Requests of a server-shaped run (experiment ``server``): the records its tasks wrote, joined with
the trace, and the metrics of a service.

Needs the records of :mod:`harmony.workload.serve` (``raw/requests/``: the client's ``client.sent``
and ``client.done``, each serving task's ``<name>.stage``) and the run's ``runs``, ``migrations``
and ``events`` (``sched_wakeup``/``sched_wakeup_new`` of the tasks) tables.

:func:`df_requests` returns the ``requests`` table (:data:`harmony.analysis.tables.REQUESTS`);
:func:`request_metrics` the metrics of its measured requests; :func:`service_inversion` is
Ruan's eq. 3.1 (see :mod:`harmony.experiments.server`); :func:`burstiness` the run queues' (the
``runqueue`` table).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harmony import store
from harmony.analysis.metrics import jain_index
from harmony.analysis.reconstruct import runqueue_changes
from harmony.analysis.tables import REQUESTS
from harmony.analysis.thresholds import RQ_WAIT_MIN_NS
from harmony.core.errors import RunError
from harmony.workload import serve

RECORDS_DIR = serve.RECORDS_DIR     # under raw/
#: the latency percentiles of a server run's summary: key -> percentile
LATENCY_PERCENTILES = {"latency_p50_ms": 50, "latency_p90_ms": 90, "latency_p99_ms": 99,
                       "latency_p999_ms": 99.9}
WAKEUPS = ("sched_wakeup", "sched_wakeup_new")


def read_records(path: Path) -> np.ndarray:
    """The whole :data:`harmony.workload.serve.REC` records of one file, as an (n, 6) int64 array (a
    last record cut short by the task's end is left out)."""
    data = Path(path).read_bytes()
    n = len(data) // serve.REC.size
    return np.frombuffer(data[:n * serve.REC.size], dtype="<i8").reshape(n, 6).astype(np.int64)


def _runnable(runs: pd.DataFrame, events: pd.DataFrame, pids) -> dict[int, tuple]:
    """Per pid, its run-queue waits as sorted disjoint intervals (starts, ends, cumulative
    lengths before each): after a run that ended preempted (end_state 0), until its next run; after
    one that ended blocked, from its next wake-up until its next run."""
    wk = events[events["event"].astype(str).isin(WAKEUPS)]
    out = {}
    for pid in pids:
        r = runs[runs["pid"] == pid].sort_values("start")
        st, en, state = r["start"].to_numpy(), r["end"].to_numpy(), r["end_state"].to_numpy()
        wts = np.sort(wk.loc[wk["pid"] == pid, "ts"].to_numpy(np.int64))
        a, b = en[:-1].copy(), st[1:].copy()
        blocked = state[:-1] != 0
        # a blocked run's wait starts at the first wake-up after it (none seen: no wait counted)
        i = np.searchsorted(wts, a[blocked], side="left")
        woke = (np.where(i < len(wts), wts[np.minimum(i, len(wts) - 1)], b[blocked]) if len(wts)
                else b[blocked])
        a[blocked] = np.minimum(woke, b[blocked])
        keep = b > a
        a, b = a[keep], b[keep]
        out[int(pid)] = (a, b, np.concatenate([[0], np.cumsum(b - a)]))
    return out


def _waited(iv: tuple, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the intervals ``iv`` (:func:`_runnable`) inside each [lo, hi]."""
    a, b, cum = iv

    def before(x):
        i = np.searchsorted(a, x, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.where(i >= 0, np.clip(x - a[j], 0, (b - a)[j]) if len(a) else 0, 0)
        return np.where(i >= 0, cum[j] + inside, 0) if len(a) else np.zeros(len(x), np.int64)

    return np.maximum(before(hi) - before(lo), 0).astype(np.int64)


def df_requests(records: Path, runs: pd.DataFrame, migrations: pd.DataFrame, events: pd.DataFrame,
                tasks: pd.DataFrame, t0: int, t_end: int, drain_ns: int) -> pd.DataFrame:
    """The ``requests`` table (:data:`REQUESTS`) of the records in ``records``; attrs:
    ``overloaded`` (the client stopped sending), ``overload_t`` (s since t0, when)."""
    records = Path(records)
    sent_f, done_f = records / serve.SENT_FILE, records / serve.DONE_FILE
    if not sent_f.exists():
        raise RunError(f"{records}: no client records ({serve.SENT_FILE}): not a server run's "
                       "capture")
    sent = read_records(sent_f)
    over = sent[sent[:, 0] == serve.OVERLOAD]
    sent = sent[sent[:, 0] != serve.OVERLOAD]
    done = read_records(done_f) if done_f.exists() else np.zeros((0, 6), np.int64)
    n = len(sent)
    order = np.argsort(sent[:, 0], kind="stable")
    sent = sent[order]
    ids = sent[:, 0]
    done_at = np.full(n, -1, np.int64)
    if len(done):
        k = np.searchsorted(ids, done[:, 0])
        ok = (k < n) & (ids[np.minimum(k, n - 1)] == done[:, 0])
        done_at[k[ok]] = done[ok, 4]
    stages = [read_records(f) for f in sorted(records.glob("*" + serve.STAGE_SUFFIX))]
    st = np.concatenate(stages) if stages else np.zeros((0, 6), np.int64)
    st = st[np.lexsort((st[:, 3], st[:, 0]))]          # by request, then start
    pos = np.searchsorted(ids, st[:, 0])
    valid = (pos < n) & (ids[np.minimum(pos, n - 1)] == st[:, 0])
    st, pos = st[valid], pos[valid]
    work = (st[:, 1] >= 1) & (st[:, 1] < serve.ANSWER)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    if len(st):
        first = np.r_[True, pos[1:] != pos[:-1]]
        start[pos[first]] = st[first, 3]
        w = np.where(work)[0]
        end[pos[w]] = st[w, 4]                          # the last work stage's (sorted by start)
    # each stage record holds its request from when it reached the task (the previous record's
    # end, or when the client made it) to the end of its work there
    if len(st):
        reach = np.where(np.r_[True, pos[1:] != pos[:-1]], sent[pos, 3], np.r_[0, st[:-1, 4]])
    else:
        reach = np.zeros(0, np.int64)
    # ... and no longer than the client's reading of its answer: the pool's reader may finish
    # its answer stage (sendall, its record) after the client has read it, and what its task
    # meets then (a migration, a wait) does not delay the request
    until = st[:, 4].copy()
    if len(st):
        answered_at = done_at[pos]
        until = np.where(answered_at >= 0, np.minimum(until, answered_at), until)
    pid = st[:, 2]
    mig_count = np.zeros(len(st), np.int64)
    waits = np.zeros(len(st), np.int64)
    cpus_of: list[set] = [set() for _ in range(n)]
    pids_of: list[list] = [[] for _ in range(n)]
    iv = _runnable(runs, events, np.unique(pid))
    for p in np.unique(pid):
        sel = np.where(pid == p)[0]
        lo, hi = reach[sel], until[sel]
        mts = np.sort(migrations.loc[migrations["pid"] == p, "ts"].to_numpy(np.int64))
        mig_count[sel] = np.maximum(np.searchsorted(mts, hi, side="right")
                                    - np.searchsorted(mts, lo, side="left"), 0)
        waits[sel] = _waited(iv[int(p)], lo, hi)
        r = runs[runs["pid"] == p].sort_values("start")
        rs, re, rc = r["start"].to_numpy(), r["end"].to_numpy(), r["cpu"].to_numpy()
        a = np.searchsorted(re, st[sel, 3], side="right")     # first run ending after its start
        b = np.searchsorted(rs, hi, side="left")              # runs starting before its end
        for k, i, j in zip(sel, a, b):
            cpus_of[pos[k]].update(rc[i:max(i, j)].tolist())
    for k in range(len(st)):
        if not pids_of[pos[k]] or pids_of[pos[k]][-1] != pid[k]:
            pids_of[pos[k]].append(int(pid[k]))
    answered = done_at >= 0
    arrival = sent[:, 2]
    df = REQUESTS.frame({
        "id": ids, "conn": sent[:, 1].astype(np.int32), "arrival": arrival, "sent": sent[:, 3],
        "start": start, "end": end, "done": done_at, "t": (arrival - t0) / 1e9,
        "work_ns": sent[:, 5],
        "latency_ns": np.where(answered, (done_at - arrival).astype(np.float64), np.nan),
        "answered": answered, "measured": (arrival >= t0) & (arrival <= t_end - drain_ns),
        "pids": [",".join(map(str, x)) for x in pids_of],
        "cpus": [",".join(map(str, sorted(x))) for x in cpus_of],
        "migrations": np.bincount(pos, mig_count, minlength=n).astype(np.int64),
        "wait_ns": np.bincount(pos, waits, minlength=n).astype(np.int64)})
    df.attrs["overloaded"] = bool(len(over))
    df.attrs["overload_t"] = float((over[0, 2] - t0) / 1e9) if len(over) else None
    return df


def store_requests(run_dir: Path, df: pd.DataFrame) -> None:
    store.write_table(run_dir, "requests", df)


def read_requests(run_dir: Path) -> pd.DataFrame:
    return store.read_table(Path(run_dir) / "requests.parquet")


def service_inversion(size, latency) -> float | None:
    """Ruan's eq. 3.1: sum over the n requests of |position by latency - position by size|,
    over floor(n^2 / 2); requests of one size take that size's ideal positions in their observed
    order. None for fewer than 2 requests."""
    size, latency = np.asarray(size), np.asarray(latency)
    n = len(size)
    if n < 2:
        return None
    observed = np.empty(n, np.int64)
    observed[np.argsort(latency, kind="stable")] = np.arange(n)
    ideal = np.empty(n, np.int64)
    ideal[np.lexsort((observed, size))] = np.arange(n)
    return float(np.abs(observed - ideal).sum() / (n * n // 2))


def percentile_ms(latency_ns, q: float) -> float | None:
    """The ``q``-th percentile (0-100, the lower value: one a request had) of latencies in ms,
    NaN (unanswered) counting as infinite; None if empty or an unanswered one is at it."""
    x = np.sort(np.where(np.isnan(latency_ns), np.inf, latency_ns))
    if not len(x):
        return None
    v = x[min(len(x) - 1, int(np.ceil(q / 100 * len(x))) - 1 if q > 0 else 0)]
    return None if np.isinf(v) else float(v / 1e6)


def request_metrics(df: pd.DataFrame, t0: int, t_end: int) -> dict:
    """The server experiment's request metrics of ``df``'s measured requests (see its
    summary declaration)."""
    m = df[df["measured"]]
    ans = m[m["answered"]]
    lat = m["latency_ns"].to_numpy()
    window = (t_end - t0) / 1e9
    done = df["done"].to_numpy()
    out = {"requests": int(len(m)), "unanswered": int((~m["answered"]).sum()),
           "throughput_rps": float(((done >= t0) & (done <= t_end)).sum() / window)}
    for key, q in LATENCY_PERCENTILES.items():
        out[key] = percentile_ms(lat, q)
    out["client_lag_p99_ms"] = (percentile_ms((m["sent"] - m["arrival"]).to_numpy(np.float64), 99)
                                if len(m) else None)
    if len(ans):
        conns = sorted(df["conn"].unique())
        per = ans.groupby("conn")["latency_ns"]
        out["jain_answered"] = jain_index(per.size().reindex(conns, fill_value=0)
                                          .to_numpy(np.float64))
        out["jain_latency"] = jain_index(per.mean().to_numpy())
        p99 = np.quantile(ans["latency_ns"], 0.99, method="inverted_cdf")
        tail = ans[ans["latency_ns"] >= p99]
        out["p99_met_migration"] = float((tail["migrations"] > 0).mean())
        out["p99_waited"] = float((tail["wait_ns"] >= RQ_WAIT_MIN_NS).mean())
        out["all_met_migration"] = float((ans["migrations"] > 0).mean())
        out["all_waited"] = float((ans["wait_ns"] >= RQ_WAIT_MIN_NS).mean())
    else:
        out.update(dict.fromkeys(("jain_answered", "jain_latency", "p99_met_migration",
                                  "p99_waited", "all_met_migration", "all_waited")))
    out["service_inversion"] = service_inversion(ans["work_ns"].to_numpy(),
                                                 ans["latency_ns"].to_numpy())
    return out


def burstiness(rq: pd.DataFrame, cpus, t0: int, t_end: int) -> dict:
    """Run-queue burstiness (Ruan, fig. 3.2: how many of the server's tasks are runnable at once),
    weighted by time over [t0, t_end] from the ``runqueue`` table: ``runnable_mean`` and
    ``runnable_p99`` (tasks running or waiting over every CPU of the set) and ``queued_frac``
    (the fraction of the time more were runnable than the set has CPUs: some waited)."""
    times, q = runqueue_changes(rq, cpus, t0, t_end)
    total = q.sum(axis=1)
    dur = np.diff(np.append(times, t_end)).astype(np.float64)
    order = np.argsort(total, kind="stable")
    cum = np.cumsum(dur[order]) / dur.sum()
    return {"runnable_mean": float((total * dur).sum() / dur.sum()),
            "runnable_p99": float(total[order][np.searchsorted(cum, 0.99)]),
            "queued_frac": float(dur[total > len(set(cpus))].sum() / dur.sum())}


def server_placement(runs: pd.DataFrame, migrations: pd.DataFrame, tasks: pd.DataFrame, cpus,
                     t0: int, t_end: int) -> dict:
    """Where the scheduler put the serving tasks (role ``server``) in [t0, t_end]:
    ``server_migrations_per_task_s`` (their migrations per task and second: does it keep a
    connection's task where its data is) and ``server_cpu_jain`` (Jain's index of their CPU time
    on each CPU of the set: 1 when spread evenly, 1/P when all on one CPU: does it spread a
    pool)."""
    servers = tasks.loc[tasks["role"] == "server", "pid"].to_numpy()
    mig = migrations[migrations["pid"].isin(servers) & (migrations["ts"] >= t0)
                     & (migrations["ts"] <= t_end)]
    r = runs[runs["pid"].isin(servers)]
    busy = (np.minimum(r["end"].to_numpy(), t_end) - np.maximum(r["start"].to_numpy(), t0)).clip(0)
    per_cpu = pd.Series(busy, index=r["cpu"].to_numpy()).groupby(level=0).sum()
    per_cpu = per_cpu.reindex(sorted(int(c) for c in cpus), fill_value=0)
    return {"server_migrations_per_task_s": float(len(mig) / max(len(servers), 1)
                                                  / ((t_end - t0) / 1e9)),
            "server_cpu_jain": _finite(jain_index(per_cpu.to_numpy(np.float64)))}


def _finite(v: float) -> float | None:
    return None if np.isnan(v) else float(v)
