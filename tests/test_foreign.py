"""Foreign load: CPU time of non-experiment tasks on the experiment's CPUs, on a hand-built
stream."""

import numpy as np
import pandas as pd
import pytest

from harmony.analysis.foreign import df_foreign_load
from harmony.analysis.event_streams import Stream

MS = 1_000_000


def test_time_is_split_between_experiment_controller_foreign_and_idle():
    tasks = pd.DataFrame({"pid": [10, 11]})
    s = Stream({10: "hmy-w00", 11: "hmy-w01", 50: "daemon", 60: "harmony"})
    # CPU 0: daemon until 2 ms (before the first switch: owned by its prev), w00 2-7, controller
    # thread 7-8, idle 8-10
    s.switch(2 * MS, 0, prev=50, state=1, next=10)
    s.switch(7 * MS, 0, prev=10, state=0, next=60)
    s.switch(8 * MS, 0, prev=60, state=1, next=0)
    # CPU 1: w01 from before t0 to 4 ms, daemon 4-10 (open at the end)
    s.switch(-5 * MS, 1, prev=0, state=0, next=11)
    s.switch(4 * MS, 1, prev=11, state=1, next=50)
    df = df_foreign_load(s.events(), tasks, [0, 1, 2], 0, 10 * MS, controller_tids=[60])
    c0, c1, c2 = (df[df["cpu"] == c].iloc[0] for c in (0, 1, 2))
    assert (c0["experiment_s"], c0["controller_s"], c0["foreign_s"], c0["idle_s"]) == \
        pytest.approx((0.005, 0.001, 0.002, 0.002))
    assert c0["top_foreign"] == "daemon"
    assert (c1["experiment_s"], c1["foreign_s"], c1["idle_s"]) == pytest.approx((0.004, 0.006, 0))
    assert c1["foreign_frac"] == pytest.approx(0.6)
    # nothing seen on CPU 2: nothing claimed
    assert np.isnan(c2["foreign_s"]) and c2["top_foreign"] == ""
    # the parts of a CPU with switches always add up to the window
    seen = df.dropna()
    total = seen[["experiment_s", "controller_s", "foreign_s", "idle_s"]].sum(axis=1)
    assert np.allclose(total, seen["window_s"])


def _reference(events, tasks, cpus, t0, t_end, controller_tids=()):
    """The definition, CPU by CPU with pandas (the first implementation), to check the fast one."""
    NS = 1e9
    pids = tasks["pid"].to_numpy()
    sw = events[events["event"] == "sched_switch"]
    rows = []
    for cpu in sorted(set(int(c) for c in cpus)):
        s = sw[sw["cpu"] == cpu]
        ts = s["ts"].to_numpy(dtype=np.int64)
        if not len(ts):
            rows.append((cpu, (t_end - t0) / NS, np.nan, np.nan, np.nan, np.nan, np.nan, ""))
            continue
        owner = np.concatenate([[s["prev_pid"].iloc[0]], s["pid"].to_numpy()])
        owner_comm = np.concatenate([[str(s["prev_comm"].iloc[0])],
                                     s["comm"].astype(str).to_numpy()])
        lo = np.clip(np.concatenate([[-2**62], ts]), t0, t_end)
        hi = np.clip(np.concatenate([ts, [2**62]]), t0, t_end)
        dur = (hi - lo).astype(np.float64) / NS
        is_idle, is_exp = owner == 0, np.isin(owner, pids)
        is_own = np.isin(owner, np.asarray(list(controller_tids), dtype=np.int64))
        is_foreign = ~is_idle & ~is_exp & ~is_own
        by_comm = pd.Series(dur[is_foreign]).groupby(owner_comm[is_foreign]).sum()
        top = str(by_comm.idxmax()) if len(by_comm) and by_comm.max() > 0 else ""
        window = (t_end - t0) / NS
        rows.append((cpu, window, dur[is_exp].sum(), dur[is_own].sum(), dur[is_foreign].sum(),
                     dur[is_idle].sum(), dur[is_foreign].sum() / window, top))
    cols = ["cpu", "window_s", "experiment_s", "controller_s", "foreign_s", "idle_s",
            "foreign_frac", "top_foreign"]
    return pd.DataFrame(rows, columns=cols).astype({"cpu": "int32"})


@pytest.mark.parametrize("seed", range(12))
def test_agrees_with_the_definition_on_random_streams(seed):
    rng = np.random.default_rng(seed)
    ncpus = int(rng.integers(1, 9))
    names = {0: "swapper", 10: "hmy-w00", 11: "hmy-w01", 12: "hmy-w02", 60: "harmony",
             61: "harmony", 50: "kworker/0:1", 51: "daemon", 52: "sshd"}
    pool = list(names)
    s = Stream(names)
    current = {c: int(rng.choice(pool)) for c in range(ncpus)}
    for ts in np.sort(rng.integers(-20 * MS, 120 * MS, int(rng.integers(0, 400)))):
        cpu = int(rng.integers(0, ncpus))
        nxt = int(rng.choice(pool))
        s.switch(int(ts), cpu, prev=current[cpu], state=int(rng.integers(0, 2)), next=nxt)
        current[cpu] = nxt
        if rng.random() < 0.3:
            s.wakeup(int(ts) + 1, cpu, int(rng.choice(pool)), target=cpu)
    events = s.events()
    tasks = pd.DataFrame({"pid": [10, 11, 12]})
    cpus = list(range(ncpus + 1))  # the last one never switches
    t0, t_end = 0, int(rng.integers(1, 100)) * MS
    got = df_foreign_load(events, tasks, cpus, t0, t_end, controller_tids=[60, 61])
    pd.testing.assert_frame_equal(got, _reference(events, tasks, cpus, t0, t_end, [60, 61]),
                                  rtol=1e-12)


def test_equal_foreign_times_name_the_first_comm():
    s = Stream({10: "hmy-w00", 50: "zebra", 51: "aardvark"})
    s.switch(1 * MS, 0, prev=10, state=1, next=50)
    s.switch(3 * MS, 0, prev=50, state=1, next=51)
    s.switch(5 * MS, 0, prev=51, state=1, next=10)
    df = df_foreign_load(s.events(), pd.DataFrame({"pid": [10]}), [0], 0, 10 * MS)
    assert df["top_foreign"].iloc[0] == "aardvark"
    assert df["foreign_s"].iloc[0] == pytest.approx(0.004)
