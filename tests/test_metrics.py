"""Hermetic tests of the E1 metrics (harmony.analysis.metrics) on hand-written event streams for
4 and 8 CPUs, whose run queues, balance times and migration counts are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harmony.analysis import metrics as mt
from harmony.analysis import reconstruct as rc
from harmony.analysis.event_streams import Stream
from harmony.workload.tasks import layout_tasks, tasks_frame

MS = 1_000_000
T0, T_END = 1 * MS, 6 * MS
CPUS4 = [0, 1, 2, 3]
TASKS4 = tasks_frame(layout_tasks([8, 0, 0, 0], CPUS4), list(range(101, 109)))


def stream_p4() -> pd.DataFrame:
    """<8,0,0,0> on 4 CPUs. Queue vectors (CPU 0..3) after each step:

    t0+i (i = 1..8)  wake-ups on CPU 0          (i,0,0,0)
    1.1 ms  102 0->1   (7,1,0,0)    1.2 ms  103 0->2   (6,1,1,0)    1.2 ms+1  104 0->2  (5,1,2,0)
    1.3 ms  105 0->3   (4,1,2,1)    1.3 ms+1  106 0->3 (3,1,2,2)    1.4 ms  107 0->1    (2,2,2,2)
    4.0 ms  108 0->3   (1,2,2,3)    4.5 ms  106 3->0   (2,2,2,2)
    4.9 ms  107 runs on CPU 1, 5.0 ms it sleeps           (2,1,2,2)
    5.2 ms  107 is woken onto CPU 2 (wakeup migration)    (2,1,3,2)
    5.3 ms  103 2->1   (2,2,2,2) ... t_end = 6 ms; 6.5 ms 101 0->1 (after the window)
    and, before t0, a set-up wakeup migration of 108 (3->0) at 0.5 ms.
    """
    s = Stream({50: "harmony"})
    s.migrate(MS // 2, 3, pid=108, orig=3, dest=0, common_pid=50)
    s.wakeup(MS // 2, 3, pid=108, target=0, common_pid=50)
    s.switch(MS // 2 + 10, 0, prev=0, state=0, next=108)
    s.switch(MS // 2 + 20, 0, prev=108, state=4, next=0)  # stopped until t0
    for i in range(1, 9):
        s.wakeup(T0 + i, 2, pid=100 + i, target=0, common_pid=50)
    for ts, pid, src, dst in [(1_100_000, 102, 0, 1), (1_200_000, 103, 0, 2),
                              (1_200_001, 104, 0, 2), (1_300_000, 105, 0, 3),
                              (1_300_001, 106, 0, 3), (1_400_000, 107, 0, 1),
                              (4_000_000, 108, 0, 3), (4_500_000, 106, 3, 0)]:
        s.migrate(ts, dst, pid=pid, orig=src, dest=dst, common_pid=0)
    s.switch(4_900_000, 1, prev=0, state=0, next=107)
    s.switch(5_000_000, 1, prev=107, state=1, next=0)
    s.migrate(5_200_000, 2, pid=107, orig=1, dest=2)
    s.wakeup(5_200_000, 2, pid=107, target=2)
    s.migrate(5_300_000, 1, pid=103, orig=2, dest=1)
    s.migrate(6_500_000, 1, pid=101, orig=0, dest=1)
    return s.events()


@pytest.fixture(scope="module")
def p4():
    ev = stream_p4()
    return (rc.df_runqueue(ev, TASKS4, CPUS4, T0, T_END), rc.df_migrations(ev, TASKS4, T0))


def test_balance_timeline_p4(p4):
    rq, _ = p4
    tl = mt.balance_timeline(rq, TASKS4, CPUS4, T0, T_END)
    steps = [T0 + i for i in range(1, 9)] + [1_100_000, 1_200_000, 1_200_001, 1_300_000,
                                             1_300_001, 1_400_000, 4_000_000, 4_500_000,
                                             5_000_000, 5_200_000, 5_300_000]
    assert tl["ts"].tolist() == [T0] + steps
    assert tl["end"].tolist() == steps + [T_END]
    # max |q_i - 2| of (0,0,0,0), (i,0,0,0) for i = 1..8, then the vectors in stream_p4
    assert tl["max_dev"].tolist() == [2, 2, 2, 2, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1, 0, 1, 0, 1, 1, 0]
    assert tl["balanced"].tolist() == [d == 0 for d in tl["max_dev"]]
    assert tl["t"].tolist() == [(ts - T0) / 1e9 for ts in tl["ts"]]


def test_time_to_balance_p4_flicker(p4):
    rq, _ = p4
    tb = mt.time_to_balance(rq, TASKS4, CPUS4, T0, T_END)
    # balanced 1.4-4.0, 4.5-5.0 and 5.3-6.0 ms: the last entry is the one that lasts
    assert tb["ts_balance"] == 5_300_000 and tb["t_balance"] == pytest.approx(0.0043)
    assert tb["ts_first"] == 1_400_000 and tb["t_first"] == pytest.approx(0.0004)
    assert tb["n_entries"] == 3 and tb["balanced_at_end"] is True
    assert tb["balanced_s"] == pytest.approx(0.0038)
    assert (tb["target"], tb["n_tasks"], tb["ncpus"], tb["tolerance"]) == (2.0, 8, 4, 0.15)
    # excursions shorter than 0.4 ms ignored: 5.0-5.3 (two unbalanced segments) merges
    tb = mt.time_to_balance(rq, TASKS4, CPUS4, T0, T_END, min_excursion_ns=400_000)
    assert (tb["ts_balance"], tb["n_entries"], tb["ts_first"]) == (4_500_000, 2, 1_400_000)
    tb = mt.time_to_balance(rq, TASKS4, CPUS4, T0, T_END, min_excursion_ns=600_000)
    assert (tb["ts_balance"], tb["n_entries"]) == (1_400_000, 1)
    assert tb["balanced_s"] == pytest.approx(0.0038)  # strict time, whatever is merged
    # a looser tolerance (1 task of 2) accepts (3,1,2,2) and everything after it
    tb = mt.time_to_balance(rq, TASKS4, CPUS4, T0, T_END, tolerance=0.5)
    assert (tb["ts_balance"], tb["ts_first"], tb["n_entries"]) == (1_300_001, 1_300_001, 1)


#: settled_balance on the p4 stream, by (t_end, restored_ns): balanced 1.4-4.0, 4.5-5.0 and
#: 5.3-6.0 ms, losses 4.0-4.5 (0.5 ms) and 5.0-5.3 ms (0.3 ms); (ts_settled, excursions,
#: longest_excursion_s, ends_in_excursion). A loss of restored_ns or longer counts, a shorter
#: one does not (exactly at it: counts), the run's last one too.
SETTLED_CASES = [
    (T_END, 600_000, (1_400_000, 2, 0.0005, False)),            # both restored fast
    (T_END, 500_001, (1_400_000, 2, 0.0005, False)),
    (T_END, 500_000, (4_500_000, 2, 0.0005, False)),            # the 0.5 ms one counts
    (T_END, 300_001, (4_500_000, 2, 0.0005, False)),
    (T_END, 300_000, (5_300_000, 2, 0.0005, False)),            # both count
    (4_200_000, 200_001, (1_400_000, 1, 0.0002, True)),         # ends 0.2 ms into a loss
    (4_200_000, 200_000, (None, 1, 0.0002, True)),              # ... which counts: not settled
    (1_350_000, 1, (None, 0, None, False)),                     # never balanced
]


@pytest.mark.parametrize("t_end,restored_ns,want", SETTLED_CASES)
def test_settled_balance_counts_only_losses_not_restored_fast(p4, t_end, restored_ns, want):
    rq, _ = p4
    sb = mt.settled_balance(rq, TASKS4, CPUS4, T0, t_end, restored_ns=restored_ns)
    got = (sb["ts_settled"], sb["excursions"], sb["longest_excursion_s"], sb["ends_in_excursion"])
    assert got[:2] == want[:2] and got[3] == want[3]
    assert got[2] == (None if want[2] is None else pytest.approx(want[2]))
    assert sb["t_settled"] == (None if want[0] is None else pytest.approx((want[0] - T0) / 1e9))
    # by default a loss counts from FAST_BALANCE_MAX_S on: these are all restored fast
    if want[0] is not None:
        assert mt.settled_balance(rq, TASKS4, CPUS4, T0, t_end)["ts_settled"] == 1_400_000


def test_time_to_balance_never_or_not_at_end(p4):
    rq, _ = p4
    never = mt.time_to_balance(rq, TASKS4, CPUS4, T0, 1_350_000)
    assert never["ts_balance"] is None and never["t_balance"] is None
    assert never["ts_first"] is None and never["t_first"] is None
    assert never["n_entries"] == 0 and never["balanced_at_end"] is False
    assert never["balanced_s"] == 0.0
    left = mt.time_to_balance(rq, TASKS4, CPUS4, T0, 5_100_000)  # unbalanced again at the end
    assert left["ts_balance"] is None and left["balanced_at_end"] is False
    assert (left["ts_first"], left["n_entries"]) == (1_400_000, 2)
    assert left["balanced_s"] == pytest.approx(0.0031)


def test_time_to_balance_balanced_at_t0():
    """Two tasks per CPU woken before t0 on 8 CPUs: balanced from t0, one entry, t = 0."""
    cpus = list(range(8))
    tasks = tasks_frame(layout_tasks([2] * 8, cpus), list(range(301, 317)))
    s = Stream()
    for k in range(16):
        s.wakeup(100 + k, 0, pid=301 + k, target=k // 2)
    rq = rc.df_runqueue(s.events(), tasks, cpus, 1_000, 2_000)
    tb = mt.time_to_balance(rq, tasks, cpus, 1_000, 2_000)
    assert (tb["ts_balance"], tb["t_balance"], tb["n_entries"]) == (1_000, 0.0, 1)
    assert tb["balanced_s"] == pytest.approx(1e-6)


def test_time_to_balance_p8_pulls_then_ping_pong():
    """<16,0,...,0> on 8 CPUs: CPU k pulls 2 tasks at t0 + k*100 us (balanced after CPU 7's
    second pull); later CPU 3 pulls from CPU 4 and CPU 4 pulls back."""
    cpus = list(range(8))
    tasks = tasks_frame(layout_tasks([16] + [0] * 7, cpus), list(range(201, 217)))
    t0, t_end = 10 * MS, 13 * MS
    s = Stream()
    for i in range(1, 17):
        s.wakeup(t0 + i, 0, pid=200 + i, target=0)
    for k in range(1, 8):
        s.switch(t0 + k * 100_000 - 50_000, k, prev=0, state=0, next=990 + k)  # outside task
        s.switch(t0 + k * 100_000 - 40_000, k, prev=990 + k, state=1, next=0)
        s.migrate(t0 + k * 100_000, k, pid=200 + 2 * k, orig=0, dest=k)
        s.migrate(t0 + k * 100_000 + 1, k, pid=201 + 2 * k, orig=0, dest=k)
    s.migrate(t0 + 2 * MS, 3, pid=209, orig=4, dest=3)
    s.migrate(t0 + 2 * MS + 200_000, 4, pid=207, orig=3, dest=4)
    ev = s.events()
    rq = rc.df_runqueue(ev, tasks, cpus, t0, t_end)
    mig = rc.df_migrations(ev, tasks, t0)
    tb = mt.time_to_balance(rq, tasks, cpus, t0, t_end)
    assert tb["ts_first"] == t0 + 700_001
    assert tb["ts_balance"] == t0 + 2_200_000 and tb["n_entries"] == 2
    assert tb["balanced_s"] == pytest.approx((2 * MS - 700_001 + 800_000) / 1e9)
    # tolerance 0.5 accepts the ping-pong's (3, 1): one stretch from the last pull on
    loose = mt.time_to_balance(rq, tasks, cpus, t0, t_end, tolerance=0.5)
    assert (loose["ts_balance"], loose["n_entries"]) == (t0 + 700_000, 1)  # (3,2,...,2,1)
    after = mt.migrations_after_balance(mig, tb["ts_first"], t_end)
    assert (after["all"], after["balance"]) == (2, 2)
    assert after["window_s"] == pytest.approx((t_end - t0 - 700_001) / 1e9)
    assert mt.migrations_after_balance(mig, tb["ts_balance"], t_end)["all"] == 0


def test_migrations_after_balance(p4):
    _, mig = p4
    # the migration at exactly ts_balance made the balance: not counted
    at = mt.migrations_after_balance(mig, 5_300_000, T_END)
    assert at == {"window_s": pytest.approx(0.0007), "all": 0, "balance": 0, "all_per_s": 0.0,
                  "balance_per_s": 0.0}
    # after the first balance: 4.0, 4.5, 5.3 ms (balance) and 5.2 ms (wakeup); 6.5 ms is after
    first = mt.migrations_after_balance(mig, 1_400_000, T_END)
    assert (first["all"], first["balance"]) == (4, 3)
    assert first["window_s"] == pytest.approx(0.0046)
    assert first["all_per_s"] == pytest.approx(4 / 0.0046)
    assert first["balance_per_s"] == pytest.approx(3 / 0.0046)
    never = mt.migrations_after_balance(mig, None, T_END)
    assert never == {"window_s": 0.0, "all": None, "balance": None, "all_per_s": None,
                     "balance_per_s": None}


def test_migrations_over_time_bins(p4):
    _, mig = p4
    assert mig["t"].min() < 0  # the set-up move is in the table ...
    per_ms = mt.migrations_over_time(mig, 0.001, t_stop=(T_END - T0) / 1e9)
    assert per_ms["t"].tolist() == pytest.approx([0.0, 0.001, 0.002, 0.003, 0.004])
    assert per_ms["all"].tolist() == [6, 0, 0, 2, 2]  # ... but not counted from t = 0
    assert per_ms["balance"].tolist() == [6, 0, 0, 2, 1]
    assert per_ms["wakeup"].tolist() == [0, 0, 0, 0, 1]
    assert per_ms["per_s"].tolist() == pytest.approx([6000, 0, 0, 2000, 2000])
    # default t_stop: just past the last migration (6.5 ms -> t = 5.5 ms: 6 bins)
    dflt = mt.migrations_over_time(mig, 0.001)
    assert dflt["all"].tolist() == [6, 0, 0, 2, 2, 1]
    # from before t0 the set-up wakeup placement at 0.5 ms (t = -0.5 ms) is counted
    pre = mt.migrations_over_time(mig, 0.001, t_start=-0.001, t_stop=0.0)
    assert (pre["all"].tolist(), pre["wakeup"].tolist()) == ([1], [1])
    with pytest.raises(ValueError):
        mt.migrations_over_time(mig, 0.0)


def test_migrations_over_time_bin_edges_are_exact():
    """A migration exactly on a bin edge belongs to the bin it starts (t = 0.3 s, 0.6 s, 0.7 s
    with 0.1 s bins: floating-point division alone puts them one bin early)."""
    tasks = tasks_frame(layout_tasks([1, 0], [0, 1]), [7])
    s = Stream()
    for k, ms in enumerate((300, 600, 700)):
        s.migrate(ms * MS, 1, pid=7, orig=k % 2, dest=1 - k % 2)
    mig = rc.df_migrations(s.events(), tasks, 0)
    out = mt.migrations_over_time(mig, 0.1, t_stop=1.0)
    assert len(out) == 10
    assert out["all"].tolist() == [0, 0, 0, 1, 0, 0, 1, 1, 0, 0]
    assert mt.migrations_over_time(mig, 0.1)["all"].tolist() == [0, 0, 0, 1, 0, 0, 1, 1]


def test_jain_index():
    assert mt.jain_index([1, 1, 1, 1]) == 1.0
    assert mt.jain_index([1, 0, 0, 0]) == 0.25  # k/n when k tasks get everything
    assert mt.jain_index([1, 1, 0, 0]) == 0.5
    assert mt.jain_index([2, 1]) == pytest.approx(9 / 10)
    assert mt.jain_index([1, 1, np.nan]) == 1.0  # NaN (fair share 0) ignored
    assert math.isnan(mt.jain_index([])) and math.isnan(mt.jain_index([0, 0]))


def test_balance_times_is_both_measures_of_one_run(p4):
    rq, _ = p4
    for t_end in (T_END, 4_200_000, 1_350_000):
        assert mt.balance_times(rq, TASKS4, CPUS4, T0, t_end) == (
            mt.time_to_balance(rq, TASKS4, CPUS4, T0, t_end),
            mt.settled_balance(rq, TASKS4, CPUS4, T0, t_end))


@pytest.mark.parametrize("seed", range(6))
def test_balance_times_from_merged_stretches_is_both_measures(seed):
    """balance_times reads the balance steps merged into stretches of one verdict: the same
    measures as from every step, on run queues that flicker in and out of balance many times
    (runs of equal verdicts, runs of one step, an unbalanced or balanced end)."""
    rng = np.random.default_rng(seed)
    n = 3000
    ts = np.sort(rng.choice(np.arange(T0 + 1, T_END), n, replace=False)).astype(np.int64)
    cpu = rng.integers(0, 4, n).astype(np.int32)
    # near the target (2 a CPU) most of the time, so that verdicts come in runs of many steps
    nr = np.where(rng.random(n) < 0.8, 2, rng.integers(0, 5, n)).astype(np.int32)
    rq = pd.DataFrame({"ts": np.r_[np.full(4, T0, np.int64), ts],
                       "t": np.zeros(n + 4), "cpu": np.r_[np.arange(4, dtype=np.int32), cpu],
                       "nr": np.r_[np.full(4, 2, np.int32), nr]})
    for t_end in (T_END, int(ts[n // 2]), int(ts[n // 2]) + 1):
        for tolerance in (0.15, 0.6):
            got = mt.balance_times(rq, TASKS4, CPUS4, T0, t_end, tolerance)
            assert got == (mt.time_to_balance(rq, TASKS4, CPUS4, T0, t_end, tolerance),
                           mt.settled_balance(rq, TASKS4, CPUS4, T0, t_end, tolerance))
            assert got[0]["n_entries"] > 5
