"""Wake-ups derived from sched_waking (harmony.analysis.waking), for traces without sched_wakeup."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import IMPLEMENTATIONS, host_skip, use_implementation

from harmony.analysis import reconstruct as rc
from harmony.analysis.arrays import event_mask
from harmony.analysis.event_streams import Stream, simulate
from harmony.analysis.waking import (
    derived_again,
    df_migration_kind_check,
    df_wakeup_check,
    wakeups_from_waking,
)
from harmony.workload.tasks import layout_tasks, tasks_frame
from measured import report_kernel_behaviour

US = 1000
WAKER = 50


@pytest.fixture(params=IMPLEMENTATIONS)
def state_machine(request, monkeypatch):
    """Both implementations of the task state machine, runs and run queue."""
    from harmony.analysis import taskstate
    taskstate._last.clear()
    return use_implementation(request.param, monkeypatch)


def _tasks(pids):
    return tasks_frame(layout_tasks([0, len(pids)], [0, 1]), list(pids))


def _wakeups(events: pd.DataFrame) -> list[tuple]:
    w = events[event_mask(events, "sched_wakeup")]
    return list(zip(w["ts"], w["cpu"], w["pid"], w["target_cpu"], w["common_pid"]))


def test_placement_pull_and_wake_in_place(state_machine):
    t = 1_000_000
    s = (Stream()
         # every task runs once on CPU 1 and sleeps there
         .switch(t, 1, 0, 0, 101).switch(t + 1, 1, 101, 1, 102).switch(t + 2, 1, 102, 1, 103)
         .switch(t + 3, 1, 103, 1, 104).switch(t + 4, 1, 104, 1, 105).switch(t + 5, 1, 105, 1, 0)
         .switch(t + 6, 0, 0, 0, WAKER))
    t += 100 * US
    # 101: woken onto CPU 0 (its placement migration is the next event on the waker's CPU)
    s.waking(t, 0, 101, 1, WAKER).migrate(t + 1 * US, 0, 101, 1, 0, WAKER)
    # 102: woken where it is (the next event on CPU 0 is another task's)
    s.waking(t + 10 * US, 0, 102, 1, WAKER).waking(t + 11 * US, 0, 103, 1, WAKER)
    # 103: woken where it is; the waker then blocks and CPU 0, idle, pulls it: the pull lies
    # nearer to the switch to 103 that follows than to the sched_waking
    s.migrate(t + 20 * US, 0, 103, 1, 0, WAKER).switch(t + 21 * US, 0, WAKER, 1, 103)
    # 104: placed onto CPU 0 within its wake-up; 103, its waker, blocks much later
    s.waking(t + 40 * US, 0, 104, 1, 103).migrate(t + 41 * US, 0, 104, 1, 0, 103)
    s.switch(t + 60 * US, 0, 103, 1, 104)
    # 105: placed onto a third CPU
    s.waking(t + 70 * US, 0, 105, 1, 104).migrate(t + 71 * US, 0, 105, 1, 2, 104)
    ev = s.events()
    got, info = wakeups_from_waking(ev)
    assert info == {"derived": 5, "placed": 3, "pulls": 1, "after_switch_out": 0}
    assert _wakeups(got) == [(t + 1 * US, 0, 101, 0, WAKER), (t + 10 * US, 0, 102, 1, WAKER),
                             (t + 11 * US, 0, 103, 1, WAKER), (t + 41 * US, 0, 104, 0, 103),
                             (t + 71 * US, 0, 105, 2, 104)]
    # the recorded rows are all kept, in order, each derived one right after the row it follows
    kept = got[~event_mask(got, "sched_wakeup")].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, ev, check_categorical=False)
    rows = np.flatnonzero(event_mask(got, "sched_wakeup"))
    before = got["event"].astype(str).to_numpy()[rows - 1].tolist()
    assert before == ["sched_migrate_task", "sched_waking", "sched_waking", "sched_migrate_task",
                      "sched_migrate_task"]
    assert got["ts"].is_monotonic_increasing

    tasks = _tasks([101, 102, 103, 104, 105])
    mig = rc.df_migrations(got, tasks, t)
    assert dict(zip(mig["pid"], mig["kind"].astype(str))) == {
        101: "wakeup", 103: "balance", 104: "wakeup", 105: "wakeup"}
    rq = rc.df_runqueue(got, tasks, [0, 1, 2], t, t + 100 * US)
    assert rq.attrs["anomalies"] == 0
    # without the derived wake-ups, each switch-in of a woken task is a repaired contradiction
    assert rc.df_runqueue(ev, tasks, [0, 1, 2], t, t + 100 * US).attrs["anomalies"] == 2


def test_a_migration_made_by_another_task_than_the_wake_up_is_no_placement(state_machine):
    """Two tasks woken together on an idle CPU 1 (common_pid 0); its switch to the first is not
    recorded (a blind context), and the next event recorded there, made while the first runs,
    moves the second, queued behind it, to CPU 0: an RT push, as in two real recordings. No
    switch comes between a sched_waking and its placement: this one is no placement."""
    t = 1_000_000
    s = (Stream()
         .switch(t, 1, 0, 0, 201).switch(t + 1, 1, 201, 1, 202).switch(t + 2, 1, 202, 1, 0)
         .switch(t + 3, 0, 0, 0, WAKER))
    t += 100 * US
    s.waking(t, 1, 201, 1, 0).waking(t + 1 * US, 1, 202, 1, 0)
    s.migrate(t + 40 * US, 1, 202, 1, 0, 201).switch(t + 75 * US, 0, WAKER, 0, 202)
    got, info = wakeups_from_waking(s.events())
    assert info == {"derived": 2, "placed": 0, "pulls": 0, "after_switch_out": 0}
    assert _wakeups(got) == [(t, 1, 201, 1, 0), (t + 1 * US, 1, 202, 1, 0)]
    tasks = _tasks([201, 202])
    assert rc.df_migrations(got, tasks, t)["kind"].astype(str).tolist() == ["balance"]
    # the same migration made in the wake-up's own context (common_pid 0) is its placement
    s = (Stream()
         .switch(t - 100 * US, 1, 0, 0, 201).switch(t - 99 * US, 1, 201, 1, 202)
         .switch(t - 98 * US, 1, 202, 1, 0).switch(t - 97 * US, 0, 0, 0, WAKER))
    s.waking(t, 1, 201, 1, 0).waking(t + 1 * US, 1, 202, 1, 0)
    s.migrate(t + 2 * US, 1, 202, 1, 0, 0).switch(t + 75 * US, 0, WAKER, 0, 202)
    got, info = wakeups_from_waking(s.events())
    assert info == {"derived": 2, "placed": 1, "pulls": 0, "after_switch_out": 0}
    assert _wakeups(got)[1] == (t + 2 * US, 1, 202, 0, 0)
    assert rc.df_migrations(got, tasks, t)["kind"].astype(str).tolist() == ["wakeup"]


def test_a_task_woken_while_still_on_its_cpu_is_woken_after_its_switch_out(state_machine):
    t = 1_000_000
    s = (Stream()
         .switch(t, 1, 0, 0, 101).switch(t + 1, 1, 101, 1, 103)      # 101 sleeps, 103 runs
         .switch(t + 2, 0, 0, 0, WAKER))
    t += 100 * US
    # 103, on CPU 1, is woken from CPU 0 and switches out to sleep just after: it is queued
    # once off its CPU, after that switch-out; then WAKER sleeps and CPU 0, idle, pulls it
    s.waking(t, 0, 103, 1, WAKER).switch(t + 2 * US, 1, 103, 1, 0)
    s.switch(t + 10 * US, 0, WAKER, 1, 0).migrate(t + 11 * US, 0, 103, 1, 0, 0)
    s.switch(t + 12 * US, 0, 0, 0, 103)
    # 103, running on CPU 0, is woken again (still queued: at once); it runs on (it is current
    # for the sched_waking of WAKER) and sleeps later: the wake-up stays at its sched_waking
    s.waking(t + 20 * US, 1, 103, 0, 0).waking(t + 30 * US, 0, WAKER, 0, 103)
    s.switch(t + 40 * US, 0, 103, 1, 0)
    # 101, asleep since its switch-out, is woken where it is
    s.waking(t + 50 * US, 1, 101, 1, 0)
    got, info = wakeups_from_waking(s.events())
    assert info == {"derived": 4, "placed": 0, "pulls": 0, "after_switch_out": 1}
    assert _wakeups(got) == [(t + 2 * US, 1, 103, 1, WAKER), (t + 20 * US, 1, 103, 0, 0),
                             (t + 30 * US, 0, WAKER, 0, 103), (t + 50 * US, 1, 101, 1, 0)]
    # 103 was runnable when CPU 0 pulled it: a balance migration, as sched_wakeup would show
    mig = rc.df_migrations(got, _tasks([101, 103]), t)
    assert mig["kind"].astype(str).tolist() == ["balance"]
    assert rc.df_runqueue(got, _tasks([101, 103]), [0, 1], t, t + 100 * US).attrs["anomalies"] == 0


def test_a_trace_with_sched_wakeup_or_without_sched_waking_is_returned_as_it_is():
    both = Stream().waking(10, 0, 101, 1).wakeup(12, 1, 101, 1).switch(20, 1, 0, 0, 101).events()
    got, info = wakeups_from_waking(both)
    assert got is both and info == {}
    neither = Stream().switch(20, 1, 0, 0, 101).events()
    got, info = wakeups_from_waking(neither)
    assert got is neither and info == {}


def _as_waking(events: pd.DataFrame, keep_wakeup: bool = False) -> tuple[pd.DataFrame, set[int]]:
    """The simulator's stream as a kernel without sched_wakeup records it: each sched_wakeup
    becomes a sched_waking (target_cpu: the task's CPU before) ahead of its placement migration
    (``keep_wakeup``: and stays, as a kernel with both records them). Also returns the wake-ups
    (by their rank among them) that the next event on the waker's CPU cannot tell apart: a
    migration of the same task that is not the wake-up's placement."""
    out: list[dict] = []
    placed: set[int] = set()           # rows of the sched_waking whose placement follows
    for r in events.to_dict("records"):
        if r["event"] != "sched_wakeup":
            out.append(dict(r))
            continue
        w = dict(r, event="sched_waking")
        last = out[-1] if out else None
        if (last is not None and last["event"] == "sched_migrate_task" and last["pid"] == r["pid"]
                and last["ts"] == r["ts"] and last["cpu"] == r["cpu"]):
            w["target_cpu"] = last["orig_cpu"]
            out.insert(len(out) - 1, w)
            placed.add(len(out) - 2)
        else:
            out.append(w)
        if keep_wakeup:
            out.append(dict(r))
    df = pd.DataFrame(out)
    ambiguous, k = set(), -1
    cpu, ev, pid = df["cpu"].to_numpy(), df["event"].to_numpy(), df["pid"].to_numpy()
    for i in np.flatnonzero(ev == "sched_waking").tolist():
        k += 1
        nxt = next((j for j in range(i + 1, len(df))
                    if cpu[j] == cpu[i] and ev[j] != "sched_wakeup"), None)
        if (i not in placed and nxt is not None and ev[nxt] == "sched_migrate_task"
                and pid[nxt] == pid[i]):
            ambiguous.add(k)
    for c in ("event", "comm", "prev_comm"):
        df[c] = pd.Categorical(df[c].astype(str))
    return df, ambiguous


@pytest.mark.parametrize("ncpus", [4, 16, 64])
def test_simulated_wake_ups_come_back_from_sched_waking(ncpus, state_machine):
    sim = simulate(ncpus=ncpus, ntasks=3 * ncpus, n_events=20_000, seed=ncpus)
    waking, ambiguous = _as_waking(sim.events)
    got, info = wakeups_from_waking(waking)
    want = _wakeups(sim.events)
    assert info["derived"] == len(want) and info["pulls"] == 0
    # each task's k-th wake-up against its k-th derived one (a misplaced one may come later
    # in the table than the next task's); common_pid: the simulator's have none (-1)
    rank: dict[int, list[int]] = {}
    for k, w in enumerate(want):
        rank.setdefault(w[2], []).append(k)
    derived = {}
    for w in _wakeups(got):
        derived[rank[w[2]].pop(0)] = w
    wrong = {k for k, w in enumerate(want) if derived[k] != w}
    # the simulator's balancing pulls right after a wake-up on the puller's CPU, with no switch
    # to the task after them, are taken for placements, as documented: exactly those differ
    assert wrong == ambiguous
    if ncpus == 64:        # none of those: every table is the same as from the real wake-ups
        assert not ambiguous
        cpus = list(range(ncpus))
        mine = rc.df_core(got, sim.tasks, cpus, sim.t0, sim.t_end)
        theirs = rc.df_core(sim.events, sim.tasks, cpus, sim.t0, sim.t_end)
        for name in ("migrations", "runs", "runqueue"):
            pd.testing.assert_frame_equal(mine[name], theirs[name])


def test_wakeup_check_pairs_each_derived_wake_up_with_the_recorded_one():
    sim = simulate(ncpus=64, ntasks=192, n_events=20_000, seed=64)
    both, ambiguous = _as_waking(sim.events, keep_wakeup=True)
    assert not ambiguous
    check = df_wakeup_check(both)
    want = sim.events[event_mask(sim.events, "sched_wakeup")]
    assert len(check) == len(want) and check["rec_ts"].notna().all()
    assert (check["target_cpu"] == check["rec_target_cpu"]).all()
    assert (check["early_ns"] == 0).all()          # the simulator stamps them alike
    # placed: those the simulator recorded right after their wake-up migration
    ev = sim.events
    e, pid, ts = ev["event"].astype(str).to_numpy(), ev["pid"].to_numpy(), ev["ts"].to_numpy()
    moved = ((e[:-1] == "sched_migrate_task") & (e[1:] == "sched_wakeup")
             & (pid[:-1] == pid[1:]) & (ts[:-1] == ts[1:]))
    assert check["placed"].sum() == moved.sum() > 1000
    # and every migration has the same kind from the derived wake-ups as from the recorded ones
    kinds = df_migration_kind_check(both)
    assert len(kinds) > 1000 and (kinds["kind"] == kinds["derived_kind"]).all()
    assert set(kinds["kind"]) == {"wakeup", "balance"}
    # derived once and given to both: the same tables
    derived = derived_again(both)
    pd.testing.assert_frame_equal(df_wakeup_check(both, derived), check)
    pd.testing.assert_frame_equal(df_migration_kind_check(both, derived), kinds)
    # one whose recorded wake-up is missing (a blind probe) is not paired with a later one
    gone = both.drop(index=both.index[event_mask(both, "sched_wakeup")][:1]).reset_index(drop=True)
    assert df_wakeup_check(gone)["rec_ts"].isna().sum() == 1


@pytest.mark.kernel
def test_kernel_wake_ups_derived_from_a_real_run_match_the_recorded_ones(kernel, tmp_path):
    """A real run records both sched_waking and sched_wakeup: derived from the first alone, the
    wake-ups land on the recorded ones' CPUs, a little earlier."""
    from cli_run import cli

    import harmony
    from harmony.probes.ringbuf import decode_dir

    out = tmp_path / "run"
    p = cli("run", "intrinsic-imbalance", "--cpus", "0,1", "--duration", "1.5", "-p",
            "warmup_s=0.5", "--out", out, "-q")
    assert p.returncode == 0, p.stderr
    lost = harmony.load(out).manifest["lost_events"]
    if lost:
        host_skip(f"the run lost {lost} events: its wake-ups are not all there to compare")
    events = decode_dir(out / "raw" / "tracefs").events
    check = df_wakeup_check(events)
    # the kernel's choice whether any wake-up here moved its task (the simulated traces above
    # hold thousands): reported, not gated on
    report_kernel_behaviour("wake-ups that placed their task on another CPU",
                            bool(check["placed"].any()), f"{len(check)} wake-ups, none placed")
    # each derived wake-up against its task's first recorded one after its sched_waking: one
    # may be missing where the probe is blind (on an idle CPU being woken, here) or at the end
    # no recorded wake-up stands for two derived ones: per task, since two tasks' can carry one
    # timestamp (CI, 2026-12-06: 13625's on CPU 1 and 13626's on CPU 0 both at ...933928 ns)
    found = check.dropna(subset=["rec_ts"])
    assert len(found) and not found.duplicated(["pid", "rec_ts"]).any(), check
    # each derived wake-up without a recorded one is explained: its task ran after its
    # sched_waking with no sched_wakeup of it between (fired where the probe is blind: CPU 1's
    # idle context here, the wake list's IPI), or the trace ended before it ran
    missing = check[check["rec_ts"].isna()]
    unexplained = [(ts, pid) for ts, pid in zip(missing["waking_ts"], missing["pid"])
                   if not _woken_unrecorded(events, int(ts), int(pid))]
    assert not unexplained, missing
    # each lands on the recorded one's CPU, unless the task moved between the two (a recorded
    # move to the CPU the sched_wakeup then names), or the wake-up was taken for one placed by
    # a move of the task made once it was queued (analysis/waking.py: seen in a CI run,
    # 2026-12-04, its move 30 us after the sched_wakeup; as the migration kinds' gate allows)
    queued = np.array([_taken_for_a_placement(events, r) for r in found.itertuples()], bool)
    other_cpu = found[(found["target_cpu"] != found["rec_target_cpu"]) & ~queued]
    unexplained = [r for r in other_cpu.itertuples() if not _moved_before_its_wakeup(events, r)]
    assert not unexplained, other_cpu
    # derived from the sched_waking, never after the sched_wakeup it stands for (but for those
    # taken for a later placement); how much before is the host's timing (the waker preempted
    # between the two), reported, not gated on
    assert (found["early_ns"][~queued] >= 0).all(), found[(found["early_ns"] < 0) & ~queued]
    late = found[found["early_ns"] > 1_000_000]
    report_kernel_behaviour("a wake-up's sched_wakeup within 1 ms of its sched_waking",
                            late.empty, f"{len(late)} of {len(found)} later")
    # and the migrations are of the same kinds (wake-up placement or balance), but for those the
    # events without sched_wakeup do not tell from a placement (see analysis.waking): moved by
    # the wake-up's own context once the task was queued (an RT push from the wake-up, a pull by
    # the waker's CPU as the waker runs on). Any other difference is a derivation gone wrong, as
    # the RT pushes made after an unrecorded switch were (2 of 1 283 migrations in 36 runs here,
    # 2026-11-26, before the fix; 1 left of the ambiguous kind, and 1 of 699 in a suite's 31).
    # A recorded kind is no reference where the wake-up's own sched_wakeup was not recorded (fired
    # in a context the probe is blind in: CPU 1's idle one here, the wake list's IPI): 1 of 37 in
    # a fresh-clone CI run, 2026-11-27. Nor can the derivation tell that a task woken while it
    # was going to sleep was on its CPU where its switch-in was not recorded (made in CPU 1's
    # idle context): its wake-up is put at the sched_waking, before its switch-out, and the
    # newly-idle pull that followed looks like a placement (1 of 36 in a CI run, 2026-11-27;
    # taking an earlier sched_waking for the missing switch-in instead put 2 of 15 614
    # migrations of a suite's 45 recordings wrong, which it had right). Each difference must be
    # one of those, however many the kernel's choices make of them.
    kinds = df_migration_kind_check(events)
    differ = kinds[kinds["kind"] != kinds["derived_kind"]]
    queued = [_moved_once_queued(events, ts, pid) or _its_wake_up_unrecorded(events, ts, pid)
              or _its_switch_in_unrecorded(events, ts, pid)
              for ts, pid in zip(differ["ts"], differ["pid"])]
    assert len(kinds) and all(queued), differ.assign(explained=queued)


def _woken_unrecorded(events: pd.DataFrame, waking_ts: int, pid: int) -> bool:
    """Whether ``pid``, after its sched_waking at ``waking_ts``, was switched in with no
    sched_wakeup of it between, or was not switched in again before the trace ended."""
    ev = events["event"].astype(str).to_numpy()
    t = events["ts"].to_numpy()
    after = (events["pid"].to_numpy() == pid) & (t >= waking_ts)
    switched_in = np.flatnonzero(after & (ev == "sched_switch"))
    if not len(switched_in):
        return True
    return not (after & (ev == "sched_wakeup") & (t <= t[switched_in[0]])).any()


def _moved_before_its_wakeup(events: pd.DataFrame, r) -> bool:
    """Whether the task of a wake-up check row ``r`` was moved, after its sched_waking and up to
    its recorded sched_wakeup, to the CPU that sched_wakeup names."""
    ev = events["event"].astype(str).to_numpy()
    t = events["ts"].to_numpy()
    mig = ((ev == "sched_migrate_task") & (events["pid"].to_numpy() == r.pid)
           & (t >= r.waking_ts) & (t <= r.rec_ts))
    return bool((events["target_cpu"].to_numpy()[mig] == r.rec_target_cpu).any())


def _its_wake_up_unrecorded(events: pd.DataFrame, ts: int, pid: int) -> bool:
    """Whether the last wake-up of ``pid`` before its migration at ``ts`` lacks its sched_wakeup:
    after its sched_waking the task was switched in with no sched_wakeup of it between."""
    ev = events["event"].astype(str).to_numpy()
    of = events["pid"].to_numpy() == pid
    t = events["ts"].to_numpy()
    waking = np.flatnonzero(of & (ev == "sched_waking") & (t <= ts))
    if not len(waking):
        return False
    after = np.arange(len(ev)) > waking[-1]
    switched_in = np.flatnonzero(after & of & (ev == "sched_switch"))
    until = switched_in[0] if len(switched_in) else len(ev)
    return not (of & after & (ev == "sched_wakeup"))[:until].any()


def _its_switch_in_unrecorded(events: pd.DataFrame, ts: int, pid: int) -> bool:
    """Whether the last switch-out of ``pid`` before its migration at ``ts`` follows no
    recorded switch-in of it (since its switch-out before that, if any)."""
    ev = events["event"].astype(str).to_numpy()
    t = events["ts"].to_numpy()
    switch = (ev == "sched_switch") & (t <= ts)
    leaves = np.flatnonzero(switch & (events["prev_pid"].to_numpy() == pid))
    if not len(leaves):
        return False
    enters = np.flatnonzero(switch & (events["pid"].to_numpy() == pid))
    since = leaves[-2] if len(leaves) > 1 else -1
    return not ((enters > since) & (enters < leaves[-1])).any()


def _taken_for_a_placement(events: pd.DataFrame, r) -> bool:
    """Whether the derived wake-up of check row ``r`` is one placed by a migration that came
    after its recorded sched_wakeup and that :func:`_moved_once_queued` explains."""
    return bool(r.placed and r.rec_ts < r.ts and _moved_once_queued(events, int(r.ts), int(r.pid)))


def _moved_once_queued(events: pd.DataFrame, ts: int, pid: int) -> bool:
    """Whether the migration of ``pid`` at ``ts`` is recorded on its CPU right after the task's
    sched_waking and then sched_wakeup, the three by the same current task: moved within or
    right after its wake-up, once queued, so that without the sched_wakeup it looks like the
    wake-up's placement."""
    row = np.flatnonzero(event_mask(events, "sched_migrate_task") & (events["ts"].to_numpy() == ts)
                         & (events["pid"].to_numpy() == pid))[0]
    cpu = events["cpu"].to_numpy()
    before = events.iloc[np.flatnonzero(cpu[:row] == cpu[row])[-2:]]
    return (before["event"].astype(str).tolist() == ["sched_waking", "sched_wakeup"]
            and (before["pid"] == pid).all()
            and (before["common_pid"] == events["common_pid"].iloc[row]).all())
