"""Faster versions of per-event checks give what the versions they replaced gave.

Each ``_reference_*`` below is the replaced code as it was (issue 26: whole imports of millions of
events), kept here as the definition the fast path must match, on random event streams with
blind contexts, unknown CPUs and pids the tasks do not hold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import use_implementation

from harmony.analysis import cost, tables
from harmony.analysis import metrics as mt
from harmony.analysis import reconstruct as rc
from harmony.analysis import thresholds as T
from harmony.analysis.arrays import event_mask, in_set, sorted_unique
from harmony.analysis.causes import find_unrecorded_moves
from harmony.analysis.crosscheck import silent_contexts, unrecorded_migrations
from harmony.analysis.reconstruct import NS
from harmony.analysis.taskstate import record_ts, task_records
from harmony.probes.schema import make_events
from harmony.workload.tasks import TaskSpec, tasks_frame

EVENTS = ("sched_switch", "sched_waking", "sched_wakeup", "sched_wakeup_new", "sched_migrate_task",
          "sched_process_exit")


def random_events(seed: int, n: int = 4000, pids: int = 12, cpus: int = 4) -> pd.DataFrame:
    """A canonical events table of ``n`` random sched events in time order; some contexts (a pid,
    or one CPU's swapper) are left without any record of their own, as a blind probe leaves them."""
    rng = np.random.default_rng(seed)
    ev = rng.choice(EVENTS, n, p=[0.5, 0.15, 0.15, 0.03, 0.12, 0.05])
    cpu = rng.integers(0, cpus, n)
    pid = rng.integers(0, pids, n)
    prev = np.where(ev == "sched_switch", rng.integers(0, pids, n), -1)
    common = np.where(ev == "sched_switch", prev, rng.integers(0, pids, n))
    tgt = np.where(np.isin(ev, ["sched_wakeup", "sched_wakeup_new", "sched_migrate_task",
                                "sched_waking"]), rng.integers(-1, cpus, n), -1)
    orig = np.where(ev == "sched_migrate_task", rng.integers(-1, cpus, n), -1)
    blind = (common == seed % pids) | ((common == 0) & (cpu == seed % cpus))
    keep = ~blind
    cols = {"ts": np.arange(n, dtype=np.int64)[keep] * 1000, "cpu": cpu[keep], "event": ev[keep],
            "common_pid": common[keep], "pid": pid[keep], "prev_pid": prev[keep],
            "orig_cpu": orig[keep], "target_cpu": tgt[keep]}
    m = int(keep.sum())
    cols.update(comm=[f"t{p}" if p else "swapper" for p in cols["pid"]],
                prev_comm=[f"t{p}" if p > 0 else "" for p in cols["prev_pid"]],
                prio=rng.integers(98, 124, m), prev_prio=rng.integers(-1, 122, m),
                prev_state=[0] * m)
    return make_events(cols)


def _reference_silent_contexts(events):
    is_sw = (events["event"] == "sched_switch").to_numpy()
    if not is_sw.any():
        return []
    cpu = events["cpu"].to_numpy().astype(np.int64)
    cp = events["common_pid"].to_numpy().astype(np.int64)
    key_of = lambda pid, c: pid * 4096 + np.where(pid == 0, c, 4095)  # noqa: E731
    idx = np.flatnonzero(is_sw)
    nxt = events["pid"].to_numpy()[idx].astype(np.int64)
    scpu = cpu[idx]
    order = np.argsort(scpu, kind="stable")
    done = np.zeros(len(idx), bool)
    done[order[:-1]] = scpu[order[:-1]] == scpu[order[1:]]
    keys, first, runs = np.unique(key_of(nxt, scpu)[done], return_index=True, return_counts=True)
    dark = ~np.isin(keys, np.unique(key_of(cp, cpu)))
    comm = events["comm"].to_numpy()[idx][done]
    out = [{"pid": int(k // 4096), "cpu": int(k % 4096) if k // 4096 == 0 else -1,
            "comm": str(comm[f]), "runs": int(r), "records": 0}
           for k, f, r in zip(keys[dark], first[dark], runs[dark])]
    return sorted(out, key=lambda d: -d["runs"])


def _reference_unrecorded_migrations(events, pids=None, examples=5):
    ev = events["event"]
    sw = (ev == "sched_switch").to_numpy()
    wk = ev.isin(("sched_waking", "sched_wakeup")).to_numpy()
    new = (ev == "sched_wakeup_new").to_numpy()
    mg = (ev == "sched_migrate_task").to_numpy()
    cpu = events["cpu"].to_numpy().astype(np.int64)
    tgt = events["target_cpu"].to_numpy().astype(np.int64)
    ts = events["ts"].to_numpy()
    seq, pid, before, after, fresh = [], [], [], [], []
    for sel, pid_col, b_cpu, a_cpu in (
            (sw, "pid", cpu, cpu), (sw, "prev_pid", cpu, cpu), (wk, "pid", tgt, tgt),
            (new, "pid", tgt, tgt),
            (mg, "pid", events["orig_cpu"].to_numpy().astype(np.int64), tgt)):
        i = np.flatnonzero(sel)
        seq.append(i)
        pid.append(events[pid_col].to_numpy()[i].astype(np.int64))
        before.append(b_cpu[i])
        after.append(a_cpu[i])
        fresh.append(np.full(len(i), sel is new))
    seq, pid, before, after, fresh = (np.concatenate(x)
                                      for x in (seq, pid, before, after, fresh))
    keep = (pid > 0) & (before >= 0)
    if pids is not None:
        keep &= np.isin(pid, np.asarray(list(pids), np.int64))
    seq, pid, before, after, fresh = seq[keep], pid[keep], before[keep], after[keep], fresh[keep]
    order = np.lexsort((seq, pid))
    seq, pid, before, after, fresh = (x[order] for x in (seq, pid, before, after, fresh))
    same_task = np.r_[False, pid[1:] == pid[:-1]]
    last = np.r_[-1, after[:-1]]
    moved = same_task & (before != last) & ~fresh       # a new task (a pid used again): no move
    hit = np.flatnonzero(moved)
    return {"n": int(len(hit)), "pids": [int(x) for x in np.unique(pid[hit])],
            "examples": [{"pid": int(pid[k]), "ts": int(ts[seq[k]]), "from_cpu": int(last[k]),
                          "to_cpu": int(before[k])} for k in hit[:examples]]}


@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("seed", range(12))
def test_blind_spot_checks_match_the_code_they_replaced(seed, implementation):
    events = random_events(seed)
    silent = silent_contexts(events)
    assert silent == _reference_silent_contexts(events)
    assert silent          # the stream has its blind context
    # next tasks never heard of, below 0 and above every pid recorded: silent contexts too
    pid = events["pid"].to_numpy().astype(np.int32)
    pid[np.flatnonzero((events["event"] == "sched_switch").to_numpy())[[3, 7]]] = [-1, 4000]
    odd = events.assign(pid=pid)
    assert silent_contexts(odd) == _reference_silent_contexts(odd)
    assert {-1, 4000} <= {c["pid"] for c in silent_contexts(odd)}
    for pids in (None, [1, 2, 3], [5, 1 << 25]):
        assert unrecorded_migrations(events, pids) == _reference_unrecorded_migrations(events, pids)
    assert unrecorded_migrations(events)["n"] > 0
    assert silent_contexts(events.iloc[:0]) == []


def test_a_tracedat_decodes_the_same_mapped_or_read(tmp_path, monkeypatch):
    """A trace.dat's uncompressed pages are mapped from the file, not copied; where they cannot
    be (unaligned parts, no libc mmap), they are read, with the same result."""
    from test_ringbuf import known_capture, write_dir

    from harmony.probes import ringbuf_pages
    from harmony.probes.tracedat_read import decode_tracedat
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "t.dat")
    mapped, _ = decode_tracedat(dat)
    monkeypatch.setattr(ringbuf_pages, "map_files", lambda *a, **k: None)
    read, _ = decode_tracedat(dat)
    pd.testing.assert_frame_equal(mapped.events, read.events)
    pd.testing.assert_frame_equal(mapped.markers, read.markers)
    assert mapped.meta == read.meta and len(mapped.events) > 0


def test_a_table_written_in_row_groups_reads_back_the_same(tmp_path, monkeypatch):
    from harmony import store
    events = random_events(3, n=5000)
    events.attrs["note"] = "kept"
    monkeypatch.setattr(store, "WRITE_CHUNK_ROWS", 700)
    store.write_table(tmp_path, "events", events)
    back = store.read_table(tmp_path / "events.parquet")
    pd.testing.assert_frame_equal(back, events)
    assert back.attrs == {"note": "kept"}
    import pyarrow.parquet as pq
    assert pq.ParquetFile(tmp_path / "events.parquet").num_row_groups == -(-len(events) // 700)


def test_events_written_beside_the_checks_are_the_runs(tmp_path, monkeypatch):
    """Large tables (events, runs, run queue) are written on other threads while the checks run;
    the run is complete only once they are, and holds what was decoded and rebuilt."""
    from test_ringbuf import known_capture, write_dir

    from harmony import pipeline
    from harmony.importer import import_trace
    from harmony.probes.tracedat_read import decode_tracedat
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "t.dat")
    monkeypatch.setattr(pipeline, "BACKGROUND_WRITE_ROWS", 1)
    run = import_trace(dat, tmp_path / "run", pids=[11, 12])
    assert run.manifest["status"] == "complete"
    assert "waiting" in run.manifest["timings_s"]["analysis"]
    back = pd.read_parquet(tmp_path / "run" / "events.parquet")
    assert len(back) == len(decode_tracedat(dat)[0].events) > 0
    for name in ("runs", "runqueue"):       # as the analysis had them in memory
        served = getattr(run, name)
        assert len(served) > 0
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "run" / f"{name}.parquet"), served)


def _reference_top(codes, names, first, foreign, dur):
    all_names = np.concatenate([np.asarray([first], dtype=object), names[codes]])[foreign]
    comms, which = np.unique(all_names, return_inverse=True)
    by_comm = np.bincount(which, weights=dur[foreign], minlength=len(comms))
    return str(comms[int(np.argmax(by_comm))]) if by_comm.max() > 0 else ""


@pytest.mark.parametrize("seed", range(30))
def test_foreign_loads_top_comm_matches_the_code_it_replaced(seed):
    from harmony.analysis.foreign import _top_comm
    rng = np.random.default_rng(seed)
    names = np.append(np.asarray(["find", "kworker/0:1", "python", "zsh", "a"], dtype=object),
                      "nan")
    n = int(rng.integers(1, 200))
    codes = rng.integers(-1, len(names) - 1, n)             # -1: a missing comm ("nan")
    first = str(rng.choice(["python", "sshd", "nan", "a"]))
    foreign = rng.random(n + 1) < 0.6
    foreign[rng.integers(0, n + 1)] = True
    # durations in whole milliseconds, some zero: ties between comms happen
    dur = rng.integers(0, 4, n + 1).astype(np.float64) / 1000
    assert _top_comm(codes, names, first, foreign, dur) == _reference_top(codes, names, first,
                                                                          foreign, dur)



def _reference_comms(events: pd.DataFrame, pids: np.ndarray) -> dict[int, str]:
    sw = event_mask(events, "sched_switch")
    out = {}
    for col, ccol in (("pid", "comm"), ("prev_pid", "prev_comm")):
        p = events[col].to_numpy()
        rows = np.flatnonzero(sw & in_set(p, pids))
        if len(rows):
            u, first = np.unique(p[rows], return_index=True)
            comm = events[ccol].iloc[rows[first]].astype(str).tolist()
            out.update({int(k): c for k, c in zip(u, comm)})
    return out


@pytest.mark.parametrize("window", [(1, 1), (2, 8), (3, 1 << 20), (1 << 16, 1 << 20)])
@pytest.mark.parametrize("seed", range(8))
def test_the_callers_comms_match_the_code_they_replaced(seed, window, monkeypatch):
    """The comms the migration causes read (the prev_comm of a pid's first switch away, else the
    next_comm of its first switch to it), read a window at a time: every row's comm its own, so
    a later switch's would show; pids named late, never, only as prev_pid, or not at all."""
    from harmony.analysis import causes
    monkeypatch.setattr(causes, "COMMS_WINDOW", window[0])
    monkeypatch.setattr(causes, "COMMS_WINDOW_MOST", window[1])
    events = random_events(seed, n=3000, pids=40)
    rows = np.arange(len(events))
    events = events.assign(comm=pd.Categorical([f"c{r}" for r in rows]),
                           prev_comm=pd.Categorical([f"p{r}" for r in rows]))
    rng = np.random.default_rng(seed)
    late = int(events["pid"].iloc[-1])
    for pids in ([0, 1, 2], [late, 99], sorted(rng.choice(np.arange(45), 20, replace=False)), [],
                 [-1, 5, 1 << 25]):
        pids = np.asarray(pids, np.int64)
        assert causes._comms(events, pids) == _reference_comms(events, pids)
    plain = events.astype({"comm": str, "prev_comm": object})       # not categorical
    assert causes._comms(plain, np.arange(45)) == _reference_comms(events, np.arange(45))


# --- the importer's per-task look-ups (harmony.importer), as they were ------------------------

def _reference_pid_comms(events: pd.DataFrame, cmdlines: dict[int, str]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for pid_col, comm_col in (("pid", "comm"), ("prev_pid", "prev_comm")):
        pairs = events[[pid_col, comm_col]].drop_duplicates()
        for pid, comm in zip(pairs[pid_col].to_numpy(), pairs[comm_col].astype(str)):
            if pid > 0 and comm:
                out.setdefault(int(pid), set()).add(comm)
    for pid, comm in cmdlines.items():
        if pid > 0:
            out.setdefault(int(pid), set()).add(comm)
    return out


def _reference_by_pid(pid: np.ndarray, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
    order = np.argsort(pid, kind="stable")
    return (pid[order], *(c[order] for c in cols))


def _reference_where_at(events: pd.DataFrame, pids: list[int], t0: int) -> dict[int, int]:
    pid, prev = events["pid"].to_numpy(), events["prev_pid"].to_numpy()
    want = np.asarray(sorted(pids), np.int64)
    sw = event_mask(events, "sched_switch")
    moved = event_mask(events, "sched_migrate_task", "sched_wakeup", "sched_wakeup_new")
    cpu, target = events["cpu"].to_numpy(), events["target_cpu"].to_numpy()
    rows, who, where = [], [], []
    for mask, p, c in ((sw, pid, cpu), (sw, prev, cpu), (moved, pid, target)):
        r = np.flatnonzero(mask & in_set(p, want))
        rows.append(r), who.append(p[r].astype(np.int64)), where.append(c[r].astype(np.int64))
    rows, who, where = (np.concatenate(x) for x in (rows, who, where))
    known = where >= 0
    rows, who, where = rows[known], who[known], where[known]
    in_time = np.argsort(rows, kind="stable")          # rows are in time order
    who, rows, where = _reference_by_pid(who[in_time], rows[in_time], where[in_time])
    ts = events["ts"].to_numpy()
    out = {}
    for p in pids:
        a, b = np.searchsorted(who, p, "left"), np.searchsorted(who, p, "right")
        k = int(np.searchsorted(ts[rows[a:b]], t0, "right"))
        out[p] = int(where[a + k - 1]) if k else int(where[a]) if b > a else -1
    return out


def _reference_nice(events: pd.DataFrame, pids: list[int]) -> dict[int, tuple[int, int | None]]:
    want = np.asarray(sorted(pids), np.int64)
    who, prio = [], []
    for pc, qc in (("pid", "prio"), ("prev_pid", "prev_prio")):
        p, q = events[pc].to_numpy(), events[qc].to_numpy()
        keep = in_set(p, want) & (q >= 0)
        who.append(p[keep].astype(np.int64)), prio.append(q[keep].astype(np.int64))
    key, count = np.unique((np.concatenate(who) << 32) | np.concatenate(prio),
                           return_counts=True)
    k_pid, k_prio = key >> 32, key & 0xFFFFFFFF
    first = np.lexsort((k_prio, -count, k_pid))       # per pid: most frequent, then lowest
    k_pid, k_prio = k_pid[first], k_prio[first]
    heads = np.flatnonzero(np.diff(k_pid, prepend=-1))               # each pid's first
    out = {p: (0, None) for p in pids}
    for p, q in zip(k_pid[heads].tolist(), k_prio[heads].tolist()):
        out[p] = ((q - 120 if 100 <= q <= 139 else 0), q)
    return out


def _reference_last_comms(events: pd.DataFrame, pids: list[int]) -> dict[int, str]:
    want = np.asarray(sorted(pids), np.int64)
    ts = events["ts"].to_numpy()
    best: dict[int, tuple] = {}
    for src, (pc, cc) in enumerate((("pid", "comm"), ("prev_pid", "prev_comm"))):
        p = events[pc].to_numpy()
        rows = np.flatnonzero(in_set(p, want) & (events[cc] != "").to_numpy())
        who, rows = _reference_by_pid(p[rows].astype(np.int64), rows)
        for r in rows[np.r_[np.flatnonzero(np.diff(who)), len(who) - 1]] if len(who) else []:
            key = (int(ts[r]), src, int(r))          # the latest; at a tie, a prev_comm
            if int(p[r]) not in best or key >= best[int(p[r])][0]:
                best[int(p[r])] = (key, cc)
    return {pid: str(events[cc].iat[key[2]]) for pid, (key, cc) in best.items()}


@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("seed", range(12))
def test_the_importers_task_look_ups_match_the_code_they_replaced(seed, window, implementation,
                                                                 monkeypatch):
    """The same, whether the look-ups read the rows around t0 (and the end) in one window or in
    many (7 rows, then 28, ...), the prios counted at once or in chunks: t0 anywhere, before the
    first event or at the last."""
    from harmony import importer
    if window:
        monkeypatch.setattr(importer, "LOOK_UP_WINDOW", window)
        monkeypatch.setattr(importer, "CHUNK_ROWS", 100 + window)
    events = random_events(seed, n=3000, pids=40)
    rng = np.random.default_rng(seed)
    cmdlines = {3: "cmd3", 0: "idle", 77: "x"}
    assert importer._pid_comms(events, cmdlines) == _reference_pid_comms(events, cmdlines)
    plain = events.astype({"comm": str, "prev_comm": object})       # not categorical
    assert importer._pid_comms(plain, cmdlines) == _reference_pid_comms(events, cmdlines)
    for pids in ([1, 2, 3], sorted(rng.choice(np.arange(1, 45), 15, replace=False).tolist()), [99]):
        t0 = int(events["ts"].iloc[int(rng.integers(0, len(events)))])
        assert importer._where_at(events, pids, t0) == _reference_where_at(events, pids, t0)
        assert importer._nice(events, pids) == _reference_nice(events, pids)
        assert importer._last_comms(events, pids) == _reference_last_comms(events, pids)
        for edge in (int(events["ts"].iloc[0]) - 1, int(events["ts"].iloc[-1])):
            assert importer._where_at(events, pids, edge) == _reference_where_at(events, pids, edge)
    # the first and last rows of the chosen tasks' events (t0 and the end by default)
    for pids in ([1], [2, 3], [5, 39], [99]):
        theirs = np.flatnonzero(np.isin(events[["pid", "prev_pid", "common_pid"]].to_numpy(),
                                        pids).any(axis=1))
        want = (int(theirs[0]), int(theirs[-1])) if len(theirs) else (0, len(events) - 1)
        assert importer._first_and_last(events, pids) == want
    # tasks renamed as they go (exec, prctl): which row is the last to name each one shows
    renamed = events.assign(**{c: pd.Categorical([f"{n}.{i % 13}" if n else n for i, n in
                                                  enumerate(events[c].astype(str))])
                               for c in ("comm", "prev_comm")})
    for pids in ([1, 2, 3], list(range(1, 45))):
        assert importer._last_comms(renamed, pids) == _reference_last_comms(renamed, pids)
    big = [1, 2, 1 << 25]           # a pid no table holds: looked up by a binary search
    assert importer._where_at(events, big, t0) == _reference_where_at(events, big, t0)
    assert importer._nice(events, big) == _reference_nice(events, big)
    assert importer._last_comms(events, big) == _reference_last_comms(events, big)
    # prios no int16 holds (the events' own column), in a wider one: numpy 2.5 refuses to put
    # 1 << 20 in the int16 column where 2.4 widened it
    odd = events.assign(prio=np.where(np.arange(len(events)) % 7 == 0, 1 << 20,
                                      events["prio"].astype(np.int64)))
    assert importer._nice(odd, [1, 2, 3]) == _reference_nice(odd, [1, 2, 3])


def _reference_step_envelope(t, nr, t_end, bins):
    edges = np.linspace(t[0], t_end, bins + 1)
    at_start = nr[np.maximum(np.searchsorted(t, edges[:-1], "right") - 1, 0)]
    low, high = at_start.astype(float), at_start.astype(float)
    k = np.minimum(((t - t[0]) / (t_end - t[0]) * bins).astype(np.int64), bins - 1) \
        if t_end > t[0] else np.zeros(len(t), np.int64)
    np.minimum.at(low, k, nr)
    np.maximum.at(high, k, nr)
    return edges, low, high


@pytest.mark.parametrize("seed", range(40))
def test_the_run_queues_envelope_matches_the_code_it_replaced(seed):
    """Bins with no step, several steps at one instant, an end at the first step, one bin."""
    from harmony.analysis.plots import step_envelope
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    t = np.sort(rng.uniform(0, 10, n) if seed % 3 else rng.integers(0, 5, n).astype(float))
    nr = rng.integers(0, 6, n)
    t_end = float(t[-1] + rng.uniform(0, 3)) if seed % 5 else float(t[0])
    bins = 1 if seed % 7 == 0 else int(rng.integers(2, 60))
    for ours, ref in zip(step_envelope(t, nr, t_end, bins),
                         _reference_step_envelope(t, nr, t_end, bins)):
        assert np.array_equal(ours, ref)


# --- the wasted-cores check (harmony.analysis.cost.df_wasted), as it was -----------------------

def _reference_idle_steps(events: pd.DataFrame, cpu: int) -> tuple[np.ndarray, np.ndarray]:
    """(ts, idle) steps of ``cpu``: idle from a switch to the idle task until the switch out of it.

    A probe blind in the idle task's context (perf on some kernels) misses that switch out: the
    next event the CPU records then shows another task current (a switch away from it, an event
    in its context) while the CPU is believed idle. The idle interval is then cut at the last
    event recorded in the idle context since it began (or at its start: nothing claimed), since
    when the CPU was running is unknown. Before the CPU's first switch its state is unknown,
    counted not idle."""
    rows = np.flatnonzero(events["cpu"].to_numpy() == cpu)
    if not len(rows):               # nothing recorded there (no task ever ran on it): unknown
        return np.array([np.iinfo(np.int64).min]), np.array([False])
    sw = event_mask(events, "sched_switch")[rows]
    cpid = events["common_pid"].to_numpy()[rows]
    ts = events["ts"].to_numpy()[rows]
    to_idle = sw & (events["pid"].to_numpy()[rows] == 0)
    busy_before = (sw & (events["prev_pid"].to_numpy()[rows] != 0)) | (~sw & (cpid > 0))
    sets = sw | (~sw & (cpid > 0))                  # rows that set the state after them
    n = len(rows)
    idx = np.arange(n)
    last_set = np.maximum.accumulate(np.where(sets, idx, -1)) if n else idx
    prev_set = np.r_[-1, last_set[:-1]]
    idle_before = (prev_set >= 0) & to_idle[np.maximum(prev_set, 0)]
    seen_idle = to_idle | (~sw & (cpid == 0))       # evidence the idle task was current
    last_seen = np.r_[-1, np.maximum.accumulate(np.where(seen_idle, idx, -1))[:-1]] if n else idx
    cut = np.flatnonzero(idle_before & busy_before)
    k = np.flatnonzero(sets)
    order = np.r_[k.astype(np.float64), last_seen[cut] + 0.5]
    step_ts = np.r_[ts[k], ts[np.maximum(last_seen[cut], 0)]]
    step_v = np.r_[to_idle[k], np.zeros(len(cut), bool)]
    o = np.lexsort((order, step_ts))
    return np.r_[np.iinfo(np.int64).min, step_ts[o]], np.r_[False, step_v[o]]


def _reference_waiting_steps(events: pd.DataFrame, tasks: pd.DataFrame, cpus) -> dict[int, tuple]:
    """Per CPU of ``cpus``: (ts, count) steps of the experiment tasks waiting there (runnable, not
    running) that are free to move (not pinned)."""
    pids = tasks["pid"].to_numpy().astype(np.int32)
    free = pids[~tasks["pinned"].to_numpy().astype(bool)] if "pinned" in tasks.columns else pids
    r = task_records(events, pids)
    pid = r["pid"].to_numpy()
    ts = record_ts(events, r["seq"].to_numpy())
    waiting = r["runnable_after"].to_numpy() & ~r["running_after"].to_numpy() & in_set(pid, free)
    cpu = r["cpu_after"].to_numpy().astype(np.int64)
    nxt_same = np.r_[pid[1:] == pid[:-1], False]
    end = np.where(nxt_same, np.r_[ts[1:], 0], np.iinfo(np.int64).max)
    out = {}
    for c in cpus:
        k = np.flatnonzero(waiting & (cpu == c))
        t = np.r_[ts[k], end[k]]
        d = np.r_[np.ones(len(k), np.int64), -np.ones(len(k), np.int64)]
        o = np.lexsort((d, t))          # at one instant the ends (-1) first
        out[c] = (t[o], np.cumsum(d[o]))
    return out


def _reference_at(steps: tuple, times: np.ndarray, before=0) -> np.ndarray:
    ts, v = steps
    if not len(ts):
        return np.full(len(times), before)
    i = np.searchsorted(ts, times, side="right") - 1
    return np.where(i >= 0, v[np.maximum(i, 0)], before)


def _reference_df_wasted(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                         t_end: int) -> pd.DataFrame:
    """Every interval in [t0, t_end] during which a CPU of ``cpus`` is idle while an experiment task
    free to run on it (not pinned) waits runnable on another CPU of the set.

    Columns: :data:`harmony.analysis.tables.WASTED`. attrs: ``wasted_cpu_s`` (float) = the CPU time
    those intervals could have given, integral over time of min(CPUs idle with a task waiting
    elsewhere, tasks waiting): two idle CPUs and one waiting task waste one CPU, not two.
    """
    cpus = [int(c) for c in cpus]
    idle = {c: _reference_idle_steps(events, c) for c in cpus}
    wait = _reference_waiting_steps(events, tasks, cpus)
    times = sorted_unique(np.concatenate(
        [np.array([t0, t_end], np.int64)] + [s[0][1:] for s in idle.values()]
        + [s[0] for s in wait.values()]))
    times = times[(times >= t0) & (times <= t_end)]
    if len(times) < 2:
        times = np.array([t0, t_end], np.int64)
    left, dur = times[:-1], np.diff(times)
    w = np.array([_reference_at(wait[c], left) for c in cpus]).reshape(len(cpus), len(left))
    i = np.array([_reference_at(idle[c], left, False) for c in cpus], bool) \
        .reshape(len(cpus), len(left))
    total = w.sum(axis=0)
    rows = []
    wasting = np.zeros((len(cpus), len(left)), bool)
    for k, c in enumerate(cpus):
        elsewhere = total - w[k]
        on = i[k] & (elsewhere > 0)
        wasting[k] = on
        edges = np.diff(np.r_[0, on.astype(np.int8), 0])
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            start, end = int(left[a]), int(left[b - 1] + dur[b - 1])
            rows.append((c, start, end, end - start, (start - t0) / NS,
                         int(elsewhere[a:b].max()), (end - start) / NS >= T.WASTED_EPISODE_MIN_S))
    rows.sort(key=lambda r: (r[1], r[0]))
    out = tables.WASTED.from_rows(rows)
    out.attrs["wasted_cpu_s"] = float((np.minimum(wasting.sum(axis=0), total) * dur).sum() / NS)
    return out


def uneven_times(events: pd.DataFrame, rng) -> pd.DataFrame:
    """``events`` at uneven times: several at one instant, microseconds apart, milliseconds apart
    (idle spells long enough to count); the events of an instant by CPU, as in the canonical
    table."""
    gaps = rng.choice([0, 1_000, 3_000_000, 20_000_000], len(events), p=[0.2, 0.4, 0.3, 0.1])
    ts = np.cumsum(gaps)
    return events.assign(ts=ts).iloc[np.lexsort((events["cpu"].to_numpy(), ts))].reset_index(
        drop=True)


@pytest.mark.parametrize("implementation", ["compiled", "threads", "numpy"], indirect=True)
@pytest.mark.parametrize("lookup", [0, 1 << 40])     # the records of idle periods: looked up, all
@pytest.mark.parametrize("seed", range(16))
def test_wasted_cores_match_the_code_they_replaced(seed, lookup, implementation, monkeypatch):
    monkeypatch.setattr(cost, "LOOKUP_COST", lookup)
    rng = np.random.default_rng(seed)
    # pids 1-4 the tasks, 0 the idle task (blind on one CPU; everywhere when seed % 5 == 0)
    events = uneven_times(random_events(seed, n=int(rng.integers(50, 3000)), pids=5), rng)
    tasks = pd.DataFrame({"pid": np.arange(1, 5, dtype=np.int32), "pinned": rng.random(4) < 0.3})
    ts = events["ts"].to_numpy()
    lo, hi = int(ts[0]), int(ts[-1])
    mid = sorted(rng.integers(lo, hi, 2).tolist())
    windows = [(lo - 5000, hi + 5000), (lo, hi), tuple(mid), (int(ts[len(ts) // 2]),) * 2,
               (mid[1], mid[0]), (hi + 1, hi + 9)]
    for cpus in ([0, 1, 2, 3], [1, 3], [2], [0, 1, 7], [3, 1, 1], []):
        for t0, t_end in windows:
            for tk in (tasks, tasks.drop(columns="pinned")):
                new = cost.df_wasted(events, tk, cpus, t0, t_end)
                old = _reference_df_wasted(events, tk, cpus, t0, t_end)
                pd.testing.assert_frame_equal(new, old)
                assert new.attrs == old.attrs
    if seed % 5:
        full = cost.df_wasted(events, tasks, [0, 1, 2, 3], lo, hi)
        assert full["long"].any() and not full["long"].all()    # the streams do waste CPU time


@pytest.mark.parametrize("implementation", ["compiled", "threads"], indirect=True)
@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_sweep_merges_its_runs_as_a_stable_sort_orders_them(seed, implementation,
                                                                         monkeypatch):
    """The compiled sweep merges the changes' runs in time order itself (a few runs: a CPU's
    idle spells, a task's waits) or sorts them first (many): the same table either way, the
    reference's; also swept in stretches of time on threads, the episodes open across a
    stretch's end made one."""
    rng = np.random.default_rng(seed)
    events = uneven_times(random_events(seed, n=int(rng.integers(50, 3000)), pids=5), rng)
    tasks = pd.DataFrame({"pid": np.arange(1, 5, dtype=np.int32), "pinned": rng.random(4) < 0.3})
    ts = events["ts"].to_numpy()
    lo, hi = int(ts[0]), int(ts[-1])
    for cpus in ([0, 1, 2, 3], [1, 3], [3, 1, 1]):
        for t0, t_end in ((lo - 5000, hi + 5000), (int(ts[len(ts) // 3]), hi)):
            old = _reference_df_wasted(events, tasks, cpus, t0, t_end)
            for most in (0, 1 << 20):           # every run sorted first; every one merged
                monkeypatch.setattr(cost, "MERGED_RUNS_MAX", most)
                new = cost.df_wasted(events, tasks, cpus, t0, t_end)
                pd.testing.assert_frame_equal(new, old)
                assert new.attrs == old.attrs



# --- the run-queue vector and the balance timeline (harmony.analysis.reconstruct.runqueue_changes,
# harmony.analysis.metrics), as they were -------------------------------------------------------

def _reference_runqueue_changes(rq: pd.DataFrame, cpus, t0: int,
                                t_end: int) -> tuple[np.ndarray, np.ndarray]:
    """The run-queue vector of ``cpus`` (sorted) at t0 and at every change of it in (t0, t_end):
    (times: int64 ns, the first t0; q: one row per time and one column per CPU, int32 as the
    code compared to it returns it). Raises ValueError if ``rq`` (from :func:`df_runqueue`) does
    not cover t0 for every CPU."""
    cpus = sorted(set(int(c) for c in cpus))
    sub = rq[rq["cpu"].isin(cpus)]
    ch = sub["ts"].to_numpy(np.int64)
    ch = sorted_unique(ch[(ch > t0) & (ch < t_end)])
    times = np.concatenate([[np.int64(t0)], ch]).astype(np.int64)
    q = rc.steps_at(rc.runqueue_steps(sub), times, cpus, absent=-1)   # arrays: no frame of 1 M rows
    if (q < 0).any():
        raise ValueError("run-queue table does not cover t0 for every CPU")
    return times, q.astype(np.int32)


def _reference_balance_timeline(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                     tolerance: float = 0.15, n: int | None = None) -> pd.DataFrame:
    """Whether the run queues are balanced within ``tolerance``, as a step function on [t0, t_end).

    Needs: a run-queue table (:func:`~harmony.analysis.reconstruct.df_runqueue`). Balanced means
    max_i |q_i - N/P| <= tolerance * N/P over the CPUs i of ``cpus`` (P = len(cpus)), N =
    ``n`` or len(tasks).

    Columns: ts (int64 ns, start of the segment; the first is t0), t (float s since t0),
    end (int64 ns), max_dev (float: max_i |q_i - N/P|), balanced (bool). Consecutive segments
    always differ in the queue vector (not necessarily in ``balanced``).
    """
    cpus = sorted(set(int(c) for c in cpus))
    n_tasks = len(tasks) if n is None else int(n)
    target = n_tasks / len(cpus)
    times, q = _reference_runqueue_changes(rq, cpus, t0, t_end)
    dev = np.abs(q - target).max(axis=1)
    ok = dev <= tolerance * target + 1e-9
    end = np.append(times[1:], np.int64(t_end))
    return pd.DataFrame({"ts": times, "t": (times - t0) / NS, "end": end, "max_dev": dev,
                         "balanced": ok})


def _reference_time_to_balance(rq: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int, t_end: int,
                    tolerance: float = 0.15, n: int | None = None,
                    min_excursion_ns: int = 0) -> dict:
    """E3 time to resolve: when the run queues become balanced within ``tolerance`` and stay so.

    Needs: a run-queue table (:func:`~harmony.analysis.reconstruct.df_runqueue`); N = ``n`` or
    len(tasks), P = len(cpus); see :func:`balance_timeline`.

    The definition is "within 15% of N/P, *and stays there*": ``ts_balance`` is the start of the
    balanced stretch that lasts until ``t_end`` (None if the queues are not balanced just before
    ``t_end``). Flicker - balanced, then unbalanced, then balanced again - therefore moves
    ``ts_balance`` to the last re-entry; ``ts_first`` is the first entry. Unbalanced excursions
    shorter than ``min_excursion_ns`` between two balanced stretches are ignored (default 0: every
    excursion counts, the strict definition).

    Returns a dict: ts_balance, t_balance (s since t0), ts_first, t_first (ns / s, or None),
    balanced_at_end (bool), n_entries (int: times the queues entered balance, after merging short
    excursions; being balanced at t0 counts as one), balanced_s (float: total time balanced in
    [t0, t_end)), target (N/P), tolerance, n_tasks, ncpus.
    """
    tl = _reference_balance_timeline(rq, tasks, cpus, t0, t_end, tolerance, n)
    ts = tl["ts"].to_numpy()
    end = tl["end"].to_numpy()
    ok = tl["balanced"].to_numpy().copy()
    # merge consecutive equal flags into stretches
    brk = np.ones(len(ok), dtype=bool)
    brk[1:] = ok[1:] != ok[:-1]
    st = np.flatnonzero(brk)
    s_ok = ok[st]
    s_start = ts[st]
    s_end = np.append(ts[st[1:]], end[-1])
    if min_excursion_ns > 0 and len(st) > 2:
        inner = np.arange(1, len(st) - 1)
        short = inner[(~s_ok[inner]) & ((s_end[inner] - s_start[inner]) < min_excursion_ns)]
        s_ok[short] = True
        brk2 = np.ones(len(s_ok), dtype=bool)
        brk2[1:] = s_ok[1:] != s_ok[:-1]
        k = np.flatnonzero(brk2)
        s_end = np.append(s_start[k[1:]], s_end[-1])
        s_start, s_ok = s_start[k], s_ok[k]
    entries = s_start[s_ok]
    at_end = bool(s_ok[-1])
    ts_first = int(entries[0]) if len(entries) else None
    ts_bal = int(s_start[-1]) if at_end else None
    return {
        "ts_balance": ts_bal,
        "t_balance": None if ts_bal is None else (ts_bal - t0) / NS,
        "ts_first": ts_first,
        "t_first": None if ts_first is None else (ts_first - t0) / NS,
        "balanced_at_end": at_end,
        "n_entries": int(len(entries)),
        "balanced_s": float((tl["end"] - tl["ts"])[tl["balanced"]].sum()) / NS,
        "target": (len(tasks) if n is None else n) / len(set(cpus)),
        "tolerance": tolerance,
        "n_tasks": len(tasks) if n is None else int(n),
        "ncpus": len(set(cpus)),
    }


def _changes_or_error(f, *args):
    try:
        return f(*args)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("seed", range(12))
def test_the_balance_timeline_matches_the_code_it_replaced(seed, implementation, monkeypatch):
    rng = np.random.default_rng(seed)
    if seed % 2:        # the run-queue rows read a few at a time, each CPU's length carried over
        monkeypatch.setattr(rc, "CHANGES_CHUNK", int(rng.integers(1, 40)))
    events = uneven_times(random_events(seed, n=int(rng.integers(50, 3000)), pids=9), rng)
    tasks = pd.DataFrame({"pid": np.arange(1, 9, dtype=np.int32)})
    ts = events["ts"].to_numpy()
    lo, hi = int(ts[0]), int(ts[-1])
    rq = rc.df_runqueue(events, tasks, [0, 1, 2, 3], lo, hi)
    mid = sorted(rng.integers(lo, hi, 2).tolist())
    at = int(rq["ts"].iloc[int(rng.integers(4, len(rq)))])           # an instant of change
    windows = [(lo, hi), (lo, hi + 5000), tuple(mid), (at, hi), (lo, at), (at, at),
               (mid[1], mid[0]), (lo - 1, hi)]
    for cpus in ([0, 1, 2, 3], [3, 1], [2], [2, 2, 0], [0, 5]):
        for t0, t_end in windows:
            new = _changes_or_error(rc.runqueue_changes, rq, cpus, t0, t_end)
            old = _changes_or_error(_reference_runqueue_changes, rq, cpus, t0, t_end)
            if isinstance(old, str):
                assert new == old
                with pytest.raises(ValueError, match="does not cover t0"):   # either way
                    mt.balance_timeline(rq, tasks, cpus, t0, t_end)
                continue
            for a, b in zip(new, old):
                assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
            for tol, n in ((0.15, None), (0.5, None), (0.0, 4), (1.0, 13)):
                pd.testing.assert_frame_equal(
                    mt.balance_timeline(rq, tasks, cpus, t0, t_end, tol, n),
                    _reference_balance_timeline(rq, tasks, cpus, t0, t_end, tol, n))
                for short in (0, 3000, 5_000_000):
                    assert (mt.time_to_balance(rq, tasks, cpus, t0, t_end, tol, n, short)
                            == _reference_time_to_balance(rq, tasks, cpus, t0, t_end, tol, n,
                                                          short))
    # rows of CPUs outside the set, and none for one of it
    assert (rc.runqueue_changes(rq, [1, 2], lo, hi)[1]
            == _reference_runqueue_changes(rq, [1, 2], lo, hi)[1]).all()
    assert _changes_or_error(rc.runqueue_changes, rq.iloc[:0], [0], lo, hi) == \
        _changes_or_error(_reference_runqueue_changes, rq.iloc[:0], [0], lo, hi)


# --- the moves no probe recorded (harmony.analysis.causes), as they were found -----------------

def _reference_find_unrecorded_moves(events: pd.DataFrame, pids=None) -> dict[str, np.ndarray]:
    sw = event_mask(events, "sched_switch")
    mg = event_mask(events, "sched_migrate_task")
    cpu, tgt, ts = (events[c].to_numpy() for c in ("cpu", "target_cpu", "ts"))
    want = None if pids is None else np.asarray(list(pids), np.int64)
    seq, pid, before, after, code = [], [], [], [], []
    for sel, pid_col, b_cpu, a_cpu, c in (
            (sw, "pid", cpu, cpu, 0), (sw, "prev_pid", cpu, cpu, 0),
            (event_mask(events, "sched_waking"), "pid", tgt, tgt, 1),
            (event_mask(events, "sched_wakeup"), "pid", tgt, tgt, 2),
            (event_mask(events, "sched_wakeup_new"), "pid", tgt, tgt, 3),
            (mg, "pid", events["orig_cpu"].to_numpy(), tgt, 4)):
        p = events[pid_col].to_numpy()
        keep = sel & (p > 0) & (b_cpu >= 0)
        if want is not None:
            keep &= in_set(p, want)
        i = np.flatnonzero(keep)
        seq.append(i)
        pid.append(p[i].astype(np.int64))
        before.append(b_cpu[i].astype(np.int64))
        after.append(a_cpu[i].astype(np.int64))
        code.append(np.full(len(i), c, np.int8))
    seq, pid, before, after, code = (np.concatenate(x) for x in (seq, pid, before, after, code))
    order = np.lexsort((seq, pid))          # by task, then time; one event's in the order above
    seq, pid, before, after, code = (x[order] for x in (seq, pid, before, after, code))
    same_task = np.r_[False, pid[1:] == pid[:-1]]
    last = np.r_[-1, after[:-1]]
    hit = np.flatnonzero(same_task & (before != last) & (code != 3))   # a new task: no move
    return {"row": seq[hit].astype(np.int64), "pid": pid[hit], "ts": ts[seq[hit]].astype(np.int64),
            "from_cpu": last[hit], "to_cpu": before[hit], "proof": code[hit],
            "before": code[np.maximum(hit - 1, 0)]}


def _same_moves(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _hand_moves_stream() -> pd.DataFrame:
    """The cases find_unrecorded_moves' docstring names, by hand: a switch to another CPU with no
    migration, a wake-up placing the task elsewhere, a migration from another CPU than the last,
    placements on no CPU (-1, skipped), a switch of a task to itself, one instant's switch whose
    next task is placed before its previous one, a pid used again by a new task on another CPU
    (no move)."""
    rows = [  # ts, cpu, event, pid, prev_pid, orig_cpu, target_cpu
        (1, 0, "sched_switch", 5, 6, -1, -1),         # 5 and 6 on CPU 0
        (2, 1, "sched_switch", 6, 7, -1, -1),         # 6 on CPU 1: a move; 7 on CPU 1
        (3, 1, "sched_waking", 5, -1, -1, -1),        # on no CPU: skipped
        (4, 1, "sched_wakeup", 5, -1, -1, 1),         # 5 woken on CPU 1: a move
        (5, 0, "sched_migrate_task", 7, -1, 2, 3),    # 7 from CPU 2, last seen on 1: a move
        (6, 3, "sched_switch", 7, 7, -1, -1),         # 7 to itself on CPU 3: none
        (7, 2, "sched_switch", 8, 8, -1, -1),         # 8's first
        (7, 2, "sched_wakeup_new", 9, -1, -1, 2),     # 9's first
        (8, 0, "sched_waking", 9, -1, -1, 0),         # 9 on 0: a move
        (9, 0, "sched_switch", 9, 0, -1, -1),
        (10, 1, "sched_switch", 0, 10, -1, -1),       # 10 leaves CPU 1 (it exits)
        (11, 0, "sched_wakeup_new", 10, -1, -1, 3),   # a new task of pid 10 on CPU 3: none
        (12, 3, "sched_switch", 10, 0, -1, -1),
    ]
    ts, cpu, ev, pid, prev, orig, tgt = zip(*rows)
    return make_events({"ts": ts, "cpu": cpu, "event": ev, "pid": pid, "prev_pid": prev,
                        "common_pid": prev, "orig_cpu": orig, "target_cpu": tgt,
                        "comm": [f"t{p}" for p in pid], "prev_comm": [f"t{p}" for p in prev],
                        "prio": [120] * len(rows), "prev_prio": [120] * len(rows),
                        "prev_state": [0] * len(rows)})


@pytest.fixture
def implementation(request, monkeypatch):
    """The compiled code (forced, however small the input) or the numpy code."""
    return use_implementation(request.param, monkeypatch)


@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("seed", range(8))
def test_unrecorded_moves_match_the_code_they_replaced(seed, implementation):
    """Compiled and numpy, the moves no probe recorded are the ones the replaced code found: on
    random streams (one with more moves than the compiled pass first makes room for), by hand."""
    events = random_events(seed, n=20_000 if seed == 0 else 3000, pids=40)
    rng = np.random.default_rng(seed)
    for pids in (None, [1, 2, 3], rng.choice(np.arange(-1, 45), 15).tolist(), [99], [],
                 [5, 1 << 25]):
        got = find_unrecorded_moves(events, pids)
        _same_moves(got, _reference_find_unrecorded_moves(events, pids))
    assert len(find_unrecorded_moves(events)["row"]) > (4096 if seed == 0 else 0)
    plain = events.astype({"event": str})       # not categorical
    _same_moves(find_unrecorded_moves(plain, [1, 2, 3]),
                _reference_find_unrecorded_moves(events, [1, 2, 3]))
    _same_moves(find_unrecorded_moves(events.iloc[:0]),
                _reference_find_unrecorded_moves(events.iloc[:0]))
    hand = _hand_moves_stream()
    moves = find_unrecorded_moves(hand)
    _same_moves(moves, _reference_find_unrecorded_moves(hand))
    assert list(zip(moves["pid"].tolist(), moves["from_cpu"].tolist(), moves["to_cpu"].tolist())) \
        == [(5, 0, 1), (6, 0, 1), (7, 1, 2), (9, 2, 0)]


# --- the allocation table (harmony.analysis.reconstruct), as it was split ----------------------

def _reference_df_allocation(runs, tasks, t0, t_end, window_ns):
    _pids, _t, _task_info = rc._pids, rc._t, rc._task_info
    w = int(window_ns)
    t0, t_end = int(t0), int(t_end)
    k_n = max(0, -(-(t_end - t0) // w))
    tp = _pids(tasks)
    n_t = len(tp)
    s = np.maximum(runs["start"].to_numpy(), np.int64(t0))
    e = np.minimum(runs["end"].to_numpy(), np.int64(t_end))
    keep = e > s
    pid, s, e = runs["pid"].to_numpy()[keep], s[keep], e[keep]
    known = np.isin(pid, tp)
    pid, s, e = pid[known], s[known], e[known]
    order = np.argsort(tp, kind="stable")
    tix = order[np.searchsorted(tp[order], pid)]
    a = (s - t0) // w
    b = (e - 1 - t0) // w
    cnt = (b - a + 1).astype(np.int64)
    rep = np.repeat(np.arange(len(s)), cnt)
    off = np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    k = a[rep] + off
    ps = np.maximum(s[rep], t0 + k * w)
    pe = np.minimum(e[rep], t0 + (k + 1) * w)
    ns = np.bincount(k * n_t + tix[rep], weights=(pe - ps).astype(np.float64),
                     minlength=k_n * n_t)[:k_n * n_t]
    kk = np.repeat(np.arange(k_n, dtype=np.int64), n_t)
    ti = np.tile(np.arange(n_t), k_n)
    wstart = t0 + kk * w
    wlen = np.minimum(wstart + w, t_end) - wstart
    name, role = _task_info(tp[ti], tasks)
    cpu_time = ns / NS
    return tables.ALLOCATION.frame({
        "pid": tp[ti], "name": name, "role": role, "window": kk, "window_start": wstart,
        "t": _t(wstart, t0), "window_s": wlen / NS, "cpu_time": cpu_time,
        "share": cpu_time / (wlen / NS),
    })


def _random_runs(rng, fewest: int = 0):
    """(tasks, runs, t0, t_end) drawn from ``rng``: five tasks, and up to 800 random runs (at
    least ``fewest``) of them and of pids the table does not hold, before t0, across it, past
    t_end, a tenth of them long (over many windows), some of no length."""
    tasks = tasks_frame([TaskSpec(name=f"t{i}") for i in range(5)], [7, 3, 40, 41, 9])
    n = int(rng.integers(fewest, 800))
    start = np.sort(rng.integers(0, 10_000_000, n))
    long = rng.random(n) < 0.1
    dur = np.where(long, rng.integers(0, 5_000_000, n), rng.integers(0, 200_000, n))
    runs = pd.DataFrame({"pid": rng.choice([7, 3, 40, 41, 9, 5, 0], n).astype(np.int32),
                         "start": start, "end": start + dur})
    t0 = int(rng.integers(0, 2_000_000))
    return tasks, runs, t0, t0 + int(rng.integers(1, 9_000_000))


@pytest.mark.parametrize("chunk", [None, 37])
@pytest.mark.parametrize("seed", range(10))
def test_allocation_matches_the_code_it_replaced(seed, chunk, monkeypatch):
    """Random runs (:func:`_random_runs`), read in one chunk or many: the same table."""
    if chunk:
        monkeypatch.setattr(rc, "ALLOCATION_CHUNK", chunk)
    rng = np.random.default_rng(seed)
    tasks, runs, t0, t_end = _random_runs(rng)
    for w in (int(rng.integers(1, 3_000_000)), 10_000_000, 997):
        got = rc.df_allocation(runs, tasks, t0, t_end, w)
        pd.testing.assert_frame_equal(got, _reference_df_allocation(runs, tasks, t0, t_end, w),
                                      check_exact=True)
    assert rc.df_allocation(runs, tasks, t0, t0, 1000).empty


@pytest.mark.parametrize("chunk", [None, 37])
@pytest.mark.parametrize("seed", range(6))
def test_task_share_matches_the_code_it_replaced(seed, chunk, monkeypatch):
    """Each task's CPU time in the shares table, its runs (:func:`_random_runs`) read in one
    chunk or many: the same as the whole table's runs clipped at once."""
    if chunk:
        monkeypatch.setattr(rc, "ALLOCATION_CHUNK", chunk)
    tasks, runs, t0, t_end = _random_runs(np.random.default_rng(seed), fewest=1)
    # the code it replaced: every run clipped, then the tasks' summed
    s = np.maximum(runs["start"].to_numpy(), t0)
    e = np.minimum(runs["end"].to_numpy(), t_end)
    keep = e > s
    pid, s, e = runs["pid"].to_numpy()[keep], s[keep], e[keep]
    tp = tasks["pid"].to_numpy()
    known = np.isin(pid, tp)
    order = np.argsort(tp, kind="stable")
    tix = order[np.searchsorted(tp[order], pid[known])]
    ns = np.bincount(tix, weights=(e[known] - s[known]).astype(np.float64), minlength=len(tp))
    got = rc.df_task_share(runs, tasks, [0, 1], t0, t_end)
    np.testing.assert_array_equal(got["cpu_time"].to_numpy(), ns / NS)


def _reference_release_spread(events, tasks, t0, released, warmup=None):
    pids = tasks["pid"].to_numpy()
    ts = events["ts"].to_numpy()
    pid = events["pid"].to_numpy()
    ours = in_set(pid, pids)
    start = t0 if warmup is None else warmup
    wake = np.flatnonzero(event_mask(events, "sched_wakeup", "sched_wakeup_new")
                          & (ts >= start) & ours)
    # each task's first wake-up after its release: the earliest, and the first row among equal times
    by_time = wake[np.argsort(ts[wake], kind="stable")]
    woken, at = np.unique(pid[by_time], return_index=True)
    firsts = by_time[at]
    first_ts = ts[firsts]
    not_woken = sorted(set(pids.tolist()) - set(woken.tolist()))
    ran = pid[event_mask(events, "sched_switch") & (ts < start) & ours]
    out = {"warm": warmup is not None, "woken": int(len(woken)), "not_woken": not_woken,
           "ran_before_t0": sorted(set(ran.tolist())),
           "warmed_s": None if warmup is None else (int(t0) - int(warmup)) / 1e9}
    if "initial_cpu" in tasks.columns and "target_cpu" in events.columns and len(wake):
        limit = released if warmup is None else t0
        if limit is not None:
            firsts = firsts[first_ts <= limit]
        home = dict(zip(tasks["pid"].tolist(), tasks["initial_cpu"].tolist()))
        target = events["target_cpu"].to_numpy()
        off = {int(p) for p, c in zip(pid[firsts], target[firsts]) if int(c) != int(home[int(p)])}
        if warmup is not None:
            moved = event_mask(events, "sched_migrate_task") & (ts >= warmup) & (ts < t0) & ours
            off |= set(pid[moved].tolist())
        out["woke_off_initial_cpu"] = sorted(int(p) for p in off)
    else:
        out["woke_off_initial_cpu"] = None
    if released is not None:
        moved = event_mask(events, "sched_migrate_task") & (ts >= t0) & (ts <= released)
        out["moved_before_released"] = int((moved & ours).sum())
    else:
        out["moved_before_released"] = None
    if warmup is not None:
        out |= {"wake_spread_ns": int(first_ts.max() - first_ts.min()) if len(woken) else None,
                "release_spread_ns": None if released is None else int(released) - int(t0),
                "first_wakeup_after_t0_ns": None}
    elif len(woken):
        lo, hi = int(first_ts.min()), int(first_ts.max())
        end = max(hi, released) if released is not None else hi
        out |= {"wake_spread_ns": hi - lo, "release_spread_ns": end - lo,
                "first_wakeup_after_t0_ns": lo - t0}
    else:
        out |= {"wake_spread_ns": None, "release_spread_ns": None, "first_wakeup_after_t0_ns": None}
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_release_checks_match_the_code_they_replaced(seed, monkeypatch):
    """Cold and warm, with and without the released marker, ties of time, a task never woken,
    t0 before, inside and after the trace, and events out of time order (read whole); windows
    of a few rows (read in many) or of the default size, growing or not past a few rows."""
    from harmony.analysis import release
    from harmony.analysis.release import release_spread
    if seed % 2:
        monkeypatch.setattr(release, "FIRST_WINDOW", 3)
    if seed % 4 == 3:
        monkeypatch.setattr(release, "FIRST_WINDOW_MOST", 5)    # windows that stop growing
    events = random_events(seed, n=int(np.random.default_rng(seed).integers(50, 6000)), pids=14)
    rng = np.random.default_rng(seed)
    if seed % 4 == 1:
        events = events.assign(ts=events["ts"].to_numpy() // 3000 * 1000)    # ties
    if seed % 4 == 2:
        events = events.iloc[rng.permutation(len(events))].reset_index(drop=True)
    pids = sorted(rng.choice(np.arange(1, 16), int(rng.integers(1, 8)), replace=False).tolist())
    tasks = pd.DataFrame({"pid": pids, "initial_cpu": rng.integers(0, 4, len(pids))})
    if seed % 5 == 3:
        tasks = tasks.drop(columns="initial_cpu")
    ts = np.sort(events["ts"].to_numpy())
    t0 = int(rng.choice([ts[0] - 5, ts[len(ts) // 3], ts[-1] + 5,
                         ts[int(rng.integers(0, len(ts)))]]))
    released = None if seed % 3 == 0 else t0 + int(rng.integers(0, 3000 * 40))
    warmup = None if seed % 2 else t0 - int(rng.integers(0, 3000 * 40))
    assert release_spread(events, tasks, t0, released, warmup) == \
        _reference_release_spread(events, tasks, t0, released, warmup)


def _reference_foreign_load(events: pd.DataFrame, tasks: pd.DataFrame, cpus, t0: int,
                            t_end: int, controller_tids=()) -> pd.DataFrame:
    from harmony.analysis import foreign
    NS = foreign.NS
    t0, t_end = int(t0), int(t_end)
    window = (t_end - t0) / NS
    is_switch = event_mask(events, "sched_switch")
    cpu_all = events["cpu"].to_numpy()[is_switch]
    order = np.argsort(cpu_all, kind="stable")      # each CPU's switches, in time order
    cpu_sorted = cpu_all[order]
    ts_all = events["ts"].to_numpy(dtype=np.int64)[is_switch][order]
    nxt_all = events["pid"].to_numpy()[is_switch][order]
    prev_all = events["prev_pid"].to_numpy()[is_switch][order]
    comm_codes, comm_names = _reference_codes(events["comm"], is_switch, order)
    prev_codes, prev_names = _reference_codes(events["prev_comm"], is_switch, order)
    pids = tasks["pid"].to_numpy()
    own = np.asarray(list(controller_tids), dtype=np.int64)
    rows = []
    for cpu in sorted(set(int(c) for c in cpus)):
        a, b = np.searchsorted(cpu_sorted, [cpu, cpu + 1])
        if a == b:
            rows.append((cpu, window, np.nan, np.nan, np.nan, np.nan, np.nan, ""))
            continue
        ts = ts_all[a:b]
        # owner of each segment [bounds[k], bounds[k+1]): the task switched in at bounds[k];
        # before the first switch, that switch's prev
        starts = np.concatenate([[np.int64(-2**62)], ts])
        ends = np.concatenate([ts, [np.int64(2**62)]])
        owner = np.concatenate([prev_all[a:a + 1], nxt_all[a:b]])
        dur = (np.clip(ends, t0, t_end) - np.clip(starts, t0, t_end)).astype(np.float64) / NS
        is_idle = owner == 0
        is_exp = in_set(owner, pids)
        is_own = in_set(owner, own)
        is_foreign = ~is_idle & ~is_exp & ~is_own
        foreign_s = float(dur[is_foreign].sum())
        top = ""
        if is_foreign.any():
            top = foreign._top_comm(comm_codes[a:b], comm_names, str(prev_names[prev_codes[a]]),
                            is_foreign, dur)
        rows.append((cpu, window, float(dur[is_exp].sum()), float(dur[is_own].sum()), foreign_s,
                     float(dur[is_idle].sum()), foreign_s / window if window > 0 else np.nan, top))
    return foreign.FOREIGN_LOAD.from_rows(rows)


def _reference_codes(column, rows, order):
    if isinstance(column.dtype, pd.CategoricalDtype):
        # code -1 (a missing value) picks the last name: "nan", as astype(str) would say
        names = np.append(np.asarray(column.cat.categories.astype(str), dtype=object), "nan")
        return column.cat.codes.to_numpy()[rows][order], names
    codes, uniques = pd.factorize(column.astype(str).to_numpy()[rows][order])
    return codes, np.asarray(uniques, dtype=object)


@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("seed", range(30))
def test_the_foreign_load_matches_the_code_it_replaced(seed, implementation):
    """CPUs with and without switches, one beyond the int16 range, windows inside, around and
    outside the trace, controller threads, a CPU column of int64 and comms not categorical (the
    compiled pass's sums are of ns, the replaced code's of seconds: equal to float precision)."""
    from harmony.analysis.foreign import df_foreign_load
    rng = np.random.default_rng(seed)
    events = random_events(seed, n=int(rng.integers(20, 3000)), pids=10, cpus=3)
    if seed % 3 == 1:
        events = events.assign(cpu=events["cpu"].astype(np.int64))
    if seed % 4 == 2:
        events = events.assign(comm=events["comm"].astype(str),
                               prev_comm=events["prev_comm"].astype(object))
    tasks = pd.DataFrame({"pid": sorted(rng.choice(np.arange(1, 12), 4, replace=False).tolist())})
    ts = events["ts"].to_numpy()
    t0 = int(rng.choice([ts[0] - 10, ts[len(ts) // 4], ts[-1] + 10]))
    t_end = t0 + int(rng.integers(0, ts[-1] - ts[0] + 2000))
    cpus = [0, 1, 2, 5] + ([40_000] if seed % 5 == 0 else [])
    own = rng.choice(np.arange(1, 12), 2, replace=False).tolist() if seed % 2 else ()
    pd.testing.assert_frame_equal(df_foreign_load(events, tasks, cpus, t0, t_end, own),
                                  _reference_foreign_load(events, tasks, cpus, t0, t_end, own))


# --- a task's last wake-ups before a row (harmony.analysis.causes.last_wakes) --------------------

@pytest.mark.parametrize("implementation", ["compiled", "numpy"], indirect=True)
@pytest.mark.parametrize("seed", range(8))
def test_last_wakes_match_a_plain_search(seed, implementation):
    """Each task's last sched_waking, sched_wakeup and switch-in before a row, against a search
    of every row: both the compiled pass and the numpy searches (questions out of order, repeated,
    at row 0 and past the end, of pids with no such event)."""
    from harmony.analysis.causes import WAKES, last_wakes

    events = random_events(seed, n=3000, pids=9)
    rng = np.random.default_rng(seed)
    q = int(rng.integers(1, 300))
    pid = rng.integers(1, 11, q).astype(np.int64)
    row = rng.integers(0, len(events) + 5, q).astype(np.int64)
    row[:3] = [0, len(events), len(events) + 4][:min(3, q)]
    got = last_wakes(events, pid, row)
    name, pid_col = events["event"].to_numpy(), events["pid"].to_numpy()
    for k, kind in enumerate(WAKES):
        want = [max([e for e in range(min(int(r), len(events)))
                     if name[e] == kind and pid_col[e] == p], default=-1)
                for p, r in zip(pid, row)]
        assert got[k].tolist() == want, kind


# --- the distinct pids of an import's columns (harmony.importer) ------------------------------

@pytest.mark.parametrize("implementation", ["compiled", "threads", "numpy"], indirect=True)
def test_the_distinct_pids_of_columns_are_every_value_they_hold(implementation):
    """Marked in a table (the compiled pass, on threads, or numpy's), -1 (no pid) included; a
    value below -1 (a damaged trace's) hashed instead: every distinct value, none more."""
    from harmony.importer import _distinct_pids
    rng = np.random.default_rng(5)
    cols = [rng.integers(-1, 5000, n).astype(np.int32) for n in (0, 1, 100_000, 7)]
    want = set(np.unique(np.concatenate(cols)).tolist())
    assert -1 in want and _distinct_pids(cols) == want
    assert _distinct_pids([c[c >= 0] for c in cols]) == want - {-1}
    assert _distinct_pids(cols + [np.array([-7], np.int32)]) == want | {-7}
    assert _distinct_pids([np.zeros(0, np.int32)]) == set()
