"""Agreement of two probes that recorded the same run (``harmony run --crosscheck perf``).

Needs, from each probe: the canonical events table (sched_switch, sched_migrate_task,
sched_wakeup[_new], sched_process_exit: what :func:`harmony.analysis.reconstruct.df_migrations` and
:func:`~harmony.analysis.reconstruct.df_runs` read) and its lost-event count; plus the run's tasks
and the window [t0, t_end] on the shared trace clock (CLOCK_MONOTONIC: tracefs "mono", perf
``-k CLOCK_MONOTONIC``). Both probes are reconstructed with the *same* t0 and t_end (the primary's
markers), so the window edges cannot make a difference.

Matching. The two probes stamp the same tracepoint hit at slightly different instants (the kernel
calls the ftrace and the perf handler of a tracepoint one after the other), so a pair matches when
its times differ by at most ``tol_ns``:

- migrations match on (pid, src_cpu, dst_cpu) and ``|ts_a - ts_b| <= tol_ns``;
- run intervals match on (pid, cpu), ``|start_a - start_b| <= tol_ns`` and
  ``|end_a - end_b| <= tol_ns`` (runs clipped to the window).

Matching is one-to-one and in time order within each key. Items near the edges of the window are
matched over a window widened by ``tol_ns`` and then kept only if they lie in [t0, t_end].
Nothing is dropped: every item is either in a pair or reported unmatched, with examples.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Default matching tolerance (ns). Measured on this host (kernel 6.18 in a Firecracker VM, perf
#: 6.1): the perf handler of a tracepoint runs before the ftrace handler when perf was enabled
#: first, and the two stamps of one hit differ by ~2 us (median), ~5 us (p99), but a vCPU stalled
#: between the two handlers produced up to ~110 us. 500 us covers such stalls and is still well
#: below the spacing of two migrations of one task, or of two runs of one task on one CPU that would
#: have to agree at both ends.
TOL_NS = 500_000
SLOW_NS = 50_000  # pairs whose stamps differ by more than this are counted (stalls, not noise)
EXAMPLES = 5


def match_times(key_a: np.ndarray, ts_a: np.ndarray, key_b: np.ndarray, ts_b: np.ndarray,
                tol_ns: int, end_a: np.ndarray | None = None,
                end_b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One-to-one, in-order matching of two lists of timed items with equal keys.

    ``key_*``: one hashable key per item (e.g. a tuple); ``ts_*``: int64 times; optional ``end_*``
    must also agree within ``tol_ns``. Returns (ia, ib): for each item of a the index of its match
    in b (-1 if none), and for each item of b its match in a.
    """
    ia = np.full(len(ts_a), -1, np.int64)
    ib = np.full(len(ts_b), -1, np.int64)
    groups_b: dict = {}
    for j in np.argsort(ts_b, kind="stable"):
        groups_b.setdefault(key_b[j], []).append(j)
    groups_a: dict = {}
    for i in np.argsort(ts_a, kind="stable"):
        groups_a.setdefault(key_a[i], []).append(i)
    for key, la in groups_a.items():
        lb = groups_b.get(key, [])
        p = q = 0
        while p < len(la) and q < len(lb):
            i, j = la[p], lb[q]
            d = int(ts_a[i]) - int(ts_b[j])
            if abs(d) <= tol_ns and (end_a is None or abs(int(end_a[i]) - int(end_b[j])) <= tol_ns):
                ia[i], ib[j] = j, i
                p += 1
                q += 1
            elif d < 0:
                p += 1
            else:
                q += 1
    return ia, ib


def _keys(df: pd.DataFrame, cols: list[str]) -> np.ndarray:
    out = np.empty(len(df), dtype=object)
    out[:] = list(zip(*(df[c].astype(np.int64).to_numpy() for c in cols))) if len(df) else []
    return out


def df_migration_agreement(mig_a: pd.DataFrame, mig_b: pd.DataFrame, t0: int, t_end: int,
                           tol_ns: int = TOL_NS) -> pd.DataFrame:
    """Pair the migrations two probes saw (tables of :func:`reconstruct.df_migrations`).

    Columns: pid (int64), src_cpu, dst_cpu (int64), ts_a, ts_b (int64 ns; -1 where that probe has
    no such migration), dt (int64 ns, ts_b - ts_a; 0 for unmatched), status (str: "matched",
    "only_a", "only_b"), kind_a, kind_b (str: the migration kind each probe inferred, "" if none).
    Only migrations in [t0, t_end] are kept, and only those a probe recorded (not the moves
    inferred from the tasks' events: ``inferred``).
    """
    lo, hi = t0 - tol_ns, t_end + tol_ns
    mig_a, mig_b = (m[~m["inferred"].to_numpy()] if "inferred" in m.columns else m
                    for m in (mig_a, mig_b))
    a = mig_a[(mig_a["ts"] >= lo) & (mig_a["ts"] <= hi)].reset_index(drop=True)
    b = mig_b[(mig_b["ts"] >= lo) & (mig_b["ts"] <= hi)].reset_index(drop=True)
    cols = ["pid", "src_cpu", "dst_cpu"]
    ia, ib = match_times(_keys(a, cols), a["ts"].to_numpy(), _keys(b, cols), b["ts"].to_numpy(),
                         tol_ns)
    rows = []
    for i in range(len(a)):
        j = ia[i]
        rows.append((*(int(a.at[i, c]) for c in cols), int(a.at[i, "ts"]),
                     int(b.at[j, "ts"]) if j >= 0 else -1, "matched" if j >= 0 else "only_a",
                     str(a.at[i, "kind"]), str(b.at[j, "kind"]) if j >= 0 else ""))
    for j in np.flatnonzero(ib < 0):
        rows.append((*(int(b.at[j, c]) for c in cols), -1, int(b.at[j, "ts"]), "only_b", "",
                     str(b.at[j, "kind"])))
    out = pd.DataFrame(rows, columns=cols + ["ts_a", "ts_b", "status", "kind_a", "kind_b"])
    out = out.astype({c: np.int64 for c in cols + ["ts_a", "ts_b"]})
    out["dt"] = np.where(out["status"] == "matched", out["ts_b"] - out["ts_a"], 0)
    ts = np.where(out["ts_a"] >= 0, out["ts_a"], out["ts_b"])
    out = out[(ts >= t0) & (ts <= t_end)].sort_values(["ts_a", "ts_b"], ignore_index=True)
    return out[cols + ["ts_a", "ts_b", "dt", "status", "kind_a", "kind_b"]]


def _clip_runs(runs: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    r = runs[(runs["end"] > lo) & (runs["start"] < hi)]
    return pd.DataFrame({"pid": r["pid"].to_numpy().astype(np.int64),
                         "cpu": r["cpu"].to_numpy().astype(np.int64),
                         "start": np.maximum(r["start"].to_numpy(), lo),
                         "end": np.minimum(r["end"].to_numpy(), hi)})


def df_run_agreement(runs_a: pd.DataFrame, runs_b: pd.DataFrame, t0: int, t_end: int,
                     tol_ns: int = TOL_NS) -> pd.DataFrame:
    """Pair the run intervals two probes saw (tables of :func:`reconstruct.df_runs`).

    Runs are clipped to [t0 - tol_ns, t_end + tol_ns], matched, then kept if they overlap
    [t0, t_end]. Two runs match when both ends agree within ``tol_ns``. What is left is then
    paired only where one switch was stamped far apart by the two probes (their handlers run one
    after the other; a vCPU stalled between them for 1.1 ms once in CI): on one CPU, the run it
    ends and the run it starts agree on their other ends, and each probe starts the second run
    where it ended the first. The dstart/dend columns and the over-50-us count show the shift.
    Columns: pid, cpu (int64), start_a, end_a, start_b, end_b (int64 ns; -1 where that probe has no
    such run), dstart, dend (int64 ns, b - a; 0 unless matched), status ("matched", "only_a",
    "only_b").
    """
    lo, hi = t0 - tol_ns, t_end + tol_ns
    a, b = _clip_runs(runs_a, lo, hi), _clip_runs(runs_b, lo, hi)
    ia, ib = match_times(_keys(a, ["pid", "cpu"]), a["start"].to_numpy(), _keys(b, ["pid", "cpu"]),
                         b["start"].to_numpy(), tol_ns, a["end"].to_numpy(), b["end"].to_numpy())
    _pair_stamped_apart(a, b, ia, ib, tol_ns)
    ok = ia >= 0
    matched = pd.DataFrame({"pid": a["pid"][ok], "cpu": a["cpu"][ok],
                            "start_a": a["start"][ok], "end_a": a["end"][ok],
                            "start_b": b["start"].to_numpy()[ia[ok]],
                            "end_b": b["end"].to_numpy()[ia[ok]], "status": "matched"})
    only_a = a[~ok].rename(columns={"start": "start_a", "end": "end_a"}).assign(
        start_b=-1, end_b=-1, status="only_a")
    only_b = b[ib < 0].rename(columns={"start": "start_b", "end": "end_b"}).assign(
        start_a=-1, end_a=-1, status="only_b")
    cols = ["pid", "cpu", "start_a", "end_a", "start_b", "end_b", "status"]
    out = pd.concat([matched[cols], only_a[cols], only_b[cols]], ignore_index=True)
    out = out.astype({c: np.int64 for c in cols[:-1]})
    m = (out["status"] == "matched").to_numpy()
    out["dstart"] = np.where(m, out["start_b"] - out["start_a"], 0)
    out["dend"] = np.where(m, out["end_b"] - out["end_a"], 0)
    start = np.where(out["start_a"] >= 0, out["start_a"], out["start_b"])
    end = np.where(out["start_a"] >= 0, out["end_a"], out["end_b"])
    out = out[(end > t0) & (start < t_end)]
    out = out.sort_values(["pid", "cpu", "start_a", "start_b"], ignore_index=True)
    return out[["pid", "cpu", "start_a", "end_a", "start_b", "end_b", "dstart", "dend", "status"]]


def _pair_stamped_apart(a: pd.DataFrame, b: pd.DataFrame, ia: np.ndarray, ib: np.ndarray,
                        tol_ns: int) -> None:
    """Pair (in ia/ib, in place) what one switch stamped far apart leaves unmatched: on one CPU,
    a run whose start agrees but whose end does not, followed in each probe by a run that starts
    exactly where that probe ended the first and whose end agrees again (see df_run_agreement).
    Anything else stays unmatched."""
    def left(df, idx):
        return [(int(i), int(df["pid"].iat[i]), int(df["cpu"].iat[i]), int(df["start"].iat[i]),
                 int(df["end"].iat[i])) for i in np.flatnonzero(idx < 0)]

    la, lb = left(a, ia), left(b, ib)
    next_a = {(c, s): (i, p, e) for i, p, c, s, e in la}   # run of this CPU starting at s
    next_b = {(c, s): (j, p, e) for j, p, c, s, e in lb}
    for i, p, c, sa, ea in la:
        for j, q, cb, sb, eb in lb:
            if (q, cb) != (p, c) or ia[i] >= 0 or ib[j] >= 0 or abs(sa - sb) > tol_ns \
                    or abs(ea - eb) <= tol_ns:
                continue
            na, nb = next_a.get((c, ea)), next_b.get((c, eb))
            if na and nb and na[1] == nb[1] and abs(na[2] - nb[2]) <= tol_ns \
                    and ia[na[0]] < 0 and ib[nb[0]] < 0:
                ia[i], ib[j] = j, i
                ia[na[0]], ib[nb[0]] = nb[0], na[0]


def _side(df: pd.DataFrame, dt_cols: list[str], name_a: str, name_b: str) -> dict:
    """Counts, |dt| statistics and examples of one agreement table."""
    st = df["status"].to_numpy()
    m = st == "matched"
    dts = np.abs(np.concatenate([df[c].to_numpy()[m] for c in dt_cols])) if m.any() else np.zeros(0)
    ex = {f"only_{name_a}": df[st == "only_a"].head(EXAMPLES).to_dict("records"),
          f"only_{name_b}": df[st == "only_b"].head(EXAMPLES).to_dict("records")}
    n_a, n_b = int((st != "only_b").sum()), int((st != "only_a").sum())
    return {name_a: n_a, name_b: n_b, "matched": int(m.sum()),
            f"only_{name_a}": int((st == "only_a").sum()),
            f"only_{name_b}": int((st == "only_b").sum()),
            "agreement": (float(m.sum() / max(n_a, n_b)) if max(n_a, n_b) else None),
            "exact": int((m & np.all([df[c].to_numpy() == 0 for c in dt_cols], axis=0)).sum()),
            "abs_dt_ns_median": float(np.median(dts)) if len(dts) else None,
            "abs_dt_ns_p99": float(np.percentile(dts, 99)) if len(dts) else None,
            "abs_dt_ns_max": int(dts.max()) if len(dts) else None,
            "over_50us": int((dts > SLOW_NS).sum()),
            "b_minus_a_ns_median": (float(np.median(np.concatenate([df[c].to_numpy()[m]
                                                                    for c in dt_cols])))
                                    if m.any() else None),
            "examples": ex}


def probe_agreement(events_a: pd.DataFrame, events_b: pd.DataFrame, tasks: pd.DataFrame,
                    t0: int, t_end: int, names: tuple[str, str] = ("tracefs", "perf"),
                    lost: tuple[int, int] = (0, 0), markers_a: pd.DataFrame | None = None,
                    markers_b: pd.DataFrame | None = None, tol_ns: int = TOL_NS) -> dict:
    """Compare what two probes saw of the experiment's tasks in [t0, t_end].

    Returns a JSON-ready dict: ``probes`` (the two names, a first), ``tol_ns``, ``window_ns``
    ([t0, t_end]), ``lost_events`` ({name: n}), ``migrations`` and ``runs`` (each: per-probe
    counts, ``matched``, ``only_<name>`` counts, ``agreement`` = matched / larger count,
    ``exact`` = pairs with identical times, ``abs_dt_ns_median``/``_p99``/``_max`` (over every
    compared time), ``over_50us`` (times further apart than 50 us), ``b_minus_a_ns_median`` (signed:
    which probe stamps first), ``examples`` of unmatched items), ``markers`` (per marker text: ts
    of each probe and b - a in ns), and
    ``task_events`` ({name: {event: n}}: events about the tasks in the window, informative: edge
    events can fall on either side of t0/t_end), ``run_anomalies`` ({name: n}: contradictions each
    reconstruction repaired, over the stretch both probes recorded (perf starts and stops tens of
    ms apart from tracefs); a sched_switch fired in a context both probes are blind in is
    missing from both),
    ``blind_contexts`` ({name: [...]}: tasks that probe saw run but recorded no event in the context
    of, see :func:`harmony.analysis.crosscheck.silent_contexts`), ``unrecorded_migrations``
    ({name: {n, pids, examples}}: moves of the tasks that the probe's own events prove but no
    sched_migrate_task of it records), and ``verdict``: "agree" (nothing unmatched), "disagree
    (events lost)" (unmatched items, and a probe reported losses), "disagree (blind contexts)"
    (every unmatched item is a migration the other probe missed because it fired in a context that
    probe is blind in, and no run interval differs) or "disagree". Each unmatched migration says in
    which context it fired (``ctx_pid``, ``ctx_cpu``: the task current when the probe that holds it
    recorded it) and whether the other probe is blind there (``blind``).
    """
    from harmony.analysis.crosscheck import silent_contexts, unrecorded_migrations
    from harmony.analysis.reconstruct import df_migrations, df_runs

    a_name, b_name = names
    mig = df_migration_agreement(df_migrations(events_a, tasks, t0),
                                 df_migrations(events_b, tasks, t0), t0, t_end, tol_ns)
    blind = {a_name: silent_contexts(events_a), b_name: silent_contexts(events_b)}
    mig = _with_context(mig, events_a, events_b, blind[a_name], blind[b_name])
    runs_a, runs_b = (df_runs(e, tasks, t0, t_end + tol_ns) for e in (events_a, events_b))
    runs = df_run_agreement(runs_a, runs_b, t0, t_end, tol_ns)
    out = {"probes": [a_name, b_name], "tol_ns": int(tol_ns), "window_ns": [int(t0), int(t_end)],
           "lost_events": {a_name: int(lost[0]), b_name: int(lost[1])},
           "task_events": {a_name: task_event_counts(events_a, tasks, t0, t_end),
                           b_name: task_event_counts(events_b, tasks, t0, t_end)},
           "run_anomalies": _run_anomalies_in_common(events_a, events_b, tasks, t0, t_end + tol_ns,
                                                     (a_name, b_name)),
           "migrations": _side(mig, ["dt"], a_name, b_name),
           "runs": _side(runs, ["dstart", "dend"], a_name, b_name),
           "markers": marker_offsets(markers_a, markers_b),
           "blind_contexts": blind,
           "unrecorded_migrations": {a_name: unrecorded_migrations(events_a, tasks["pid"]),
                                     b_name: unrecorded_migrations(events_b, tasks["pid"])}}
    unmatched = sum(out[k][f"only_{n}"] for k in ("migrations", "runs") for n in names)
    explained = int(((mig["status"] != "matched") & mig["blind"]).sum())
    out["migrations"]["unmatched_in_blind_context"] = explained
    out["unmatched"] = int(unmatched)
    out["verdict"] = ("agree" if unmatched == 0 else
                      "disagree (events lost)" if any(x > 0 for x in lost) else
                      "disagree (blind contexts)" if explained == unmatched else "disagree")
    return out


def _with_context(mig: pd.DataFrame, events_a: pd.DataFrame, events_b: pd.DataFrame,
                  blind_a: list[dict], blind_b: list[dict]) -> pd.DataFrame:
    """Add ctx_pid, ctx_cpu (the task current when the holding probe recorded an unmatched
    migration; -1 for matched ones) and blind (the other probe records nothing in that context)."""
    ctx_pid = np.full(len(mig), -1, np.int64)
    ctx_cpu = np.full(len(mig), -1, np.int64)
    is_blind = np.zeros(len(mig), bool)
    for side, events, other_blind in (("a", events_a, blind_b), ("b", events_b, blind_a)):
        rows = np.flatnonzero((mig["status"] == f"only_{side}").to_numpy())
        if not len(rows):
            continue
        m = events[events["event"] == "sched_migrate_task"]
        at = {(int(t), int(p)): (int(c), int(k)) for t, p, c, k in
              zip(m["ts"], m["pid"], m["common_pid"], m["cpu"])}
        dark = {(c["pid"], c["cpu"]) for c in other_blind}
        for i in rows:
            hit = at.get((int(mig[f"ts_{side}"].iat[i]), int(mig["pid"].iat[i])))
            if hit is None:
                continue
            ctx_pid[i], ctx_cpu[i] = hit
            is_blind[i] = (hit[0], hit[1] if hit[0] == 0 else -1) in dark
    return mig.assign(ctx_pid=ctx_pid, ctx_cpu=ctx_cpu, blind=is_blind)


def task_event_counts(events: pd.DataFrame, tasks: pd.DataFrame, t0: int, t_end: int) -> dict:
    """{event: n} of the events in [t0, t_end] about an experiment task (pid or prev_pid)."""
    pids = tasks["pid"].to_numpy()
    e = events[(events["ts"] >= t0) & (events["ts"] <= t_end)]
    mine = np.isin(e["pid"].to_numpy(), pids) | np.isin(e["prev_pid"].to_numpy(), pids)
    counts = e.loc[mine, "event"].astype(str).value_counts()
    return {str(k): int(v) for k, v in sorted(counts.items())}


def marker_offsets(markers_a: pd.DataFrame | None, markers_b: pd.DataFrame | None) -> dict:
    """{text: {"a": ts, "b": ts, "b_minus_a_ns": ...}} for the markers both probes hold."""
    if markers_a is None or markers_b is None:
        return {}
    out = {}
    for text, ts_a in zip(markers_a["text"], markers_a["ts"]):
        hit = markers_b.loc[markers_b["text"] == text, "ts"]
        if len(hit) and text not in out:
            out[str(text)] = {"a": int(ts_a), "b": int(hit.iloc[0]),
                              "b_minus_a_ns": int(hit.iloc[0]) - int(ts_a)}
    return out


def agreement_lines(x: dict | None) -> list[str]:
    """The cross-check as report lines (verdict, then one per compared table), for the trust
    section."""
    if not x:
        return []
    a, b = x["probes"]
    if x.get("error"):
        return [f"{'probe cross-check':29}{a} vs {b}: not done ({x['error']})"]
    lines = [f"{'probe cross-check':29}{a} vs {b}: {x['verdict']} "
             f"(tolerance {x['tol_ns'] / 1e3:g} us; "
             f"lost events {x['lost_events'][a]}/{x['lost_events'][b]})"]
    for what in ("migrations", "runs"):
        s = x[what]
        agr = "n/a" if s["agreement"] is None else f"{s['agreement']:.1%}"
        dt = ("" if s["abs_dt_ns_max"] is None else
              f"; |dt| median {s['abs_dt_ns_median'] / 1e3:.1f} us, "
              f"p99 {s['abs_dt_ns_p99'] / 1e3:.1f} us, max {s['abs_dt_ns_max'] / 1e3:.1f} us")
        lines.append(f"{'  ' + what:29}{s['matched']} matched of {s[a]}/{s[b]} ({agr}); only {a} "
                     f"{s[f'only_{a}']}, only {b} {s[f'only_{b}']}{dt}")
    for name, ctxs in (x.get("blind_contexts") or {}).items():
        if ctxs:
            who = ", ".join(f"{c['comm']}" + (f" (CPU {c['cpu']})" if c["pid"] == 0
                                              else f" (pid {c['pid']})")
                            for c in ctxs[:4])
            lines.append(f"{'  blind contexts':29}{name} recorded nothing while these ran: {who}")
    n = x["migrations"].get("unmatched_in_blind_context", 0)
    if n:
        lines.append(f"{'':29}{n} unmatched migrations fired in such a context")
    return lines


def _run_anomalies_in_common(events_a, events_b, tasks, t0: int, t_end: int, names) -> dict:
    """{name: contradictions df_runs repaired} in each stream cut to the stretch both recorded
    (a cut start adds none: a CPU's first switch has nothing to contradict)."""
    from harmony.analysis.reconstruct import df_runs

    if not len(events_a) or not len(events_b):
        return {n: 0 for n in names}
    lo = max(int(events_a["ts"].iloc[0]), int(events_b["ts"].iloc[0]))
    hi = min(int(events_a["ts"].iloc[-1]), int(events_b["ts"].iloc[-1]))
    out = {}
    for name, ev in zip(names, (events_a, events_b)):
        ts = ev["ts"].to_numpy()
        cut = ev.iloc[np.searchsorted(ts, lo, "left"):np.searchsorted(ts, hi, "right")]
        out[name] = int(df_runs(cut.reset_index(drop=True), tasks, t0, t_end)
                        .attrs.get("anomalies", 0))
    return out
