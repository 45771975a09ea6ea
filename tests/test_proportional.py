"""Proportional speedup and concurrency (harmony.analysis.proportional, the proportional
experiment): GPS ratios computed by hand for small mixes, the experiment's runs under reference
policies whose answer is known, and a CPU no event was recorded on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harmony import store
from harmony.analysis import cost, tables
from harmony.analysis import proportional as prop
from harmony.analysis.event_streams import Stream
from harmony.core.errors import ParameterError
from harmony.experiments import get_experiment
from harmony.simulate import simulate_run


def tasks(names, nice=None):
    n = len(names)
    return pd.DataFrame({"pid": np.arange(100, 100 + n, dtype=np.int32), "name": names,
                         "role": ["cpu"] * n, "duty": [100.0] * n, "nice": nice or [0] * n,
                         "policy": ["other"] * n})


def shares(names, values):
    return pd.DataFrame({"name": names, "share": np.asarray(values, np.float64)})


N3 = ["c00", "c01", "c02"]


def test_three_equal_tasks_on_two_cpus_against_one_by_hand():
    """3 equal tasks: GPS 2/3 each on 2 CPUs, 1/3 on one: ideal speedup 2. Measured: one task
    alone on a CPU (1.0), two sharing the other (0.5 each), 1/3 each on one CPU: speedup 2 in
    total (ratio 1), but the sharing tasks got 1.5x of an ideal 2x (ratio 0.75). Concurrency
    against max(1, 3 // 2) = 1 task alone on one CPU (share 1.0, GPS 1): c00 got 1.0 of an
    ideal 2/3: ratio 1.5; c01, c02 are not in that run (NaN)."""
    t = tasks(N3)
    df = prop.df_proportional(shares(N3, [1.0, 0.5, 0.5]), t, 2,
                              one=(shares(N3, [1 / 3] * 3), t),
                              share=(shares(["c00"], [1.0]), tasks(["c00"])))
    tables.PROPORTIONAL.check(df)
    assert df["ideal_p"].tolist() == pytest.approx([2 / 3] * 3)
    assert df["ideal_1"].tolist() == pytest.approx([1 / 3] * 3)
    assert df["speedup_ratio"].tolist() == pytest.approx([1.5, 0.75, 0.75])
    assert df["concurrency_ratio"].iloc[0] == pytest.approx(1.5)
    assert df["concurrency_ratio"].iloc[1:].isna().all()
    n = prop.proportional_numbers(df)
    assert (n["speedup"], n["ideal_speedup"], n["speedup_ratio"]) == pytest.approx((2, 2, 1))
    assert n["speedup_ratio_min"] == pytest.approx(0.75)
    assert (n["concurrency_ratio"], n["concurrency_ratio_min"]) == pytest.approx((1.5, 1.5))


def test_weights_set_the_ideal_speedup():
    """nice 0 and nice 5 (weights 1024 and 335) on 2 CPUs: each owed a whole CPU (GPS caps a task
    at one CPU); on one CPU 1024/1359 and 335/1359. The heavy task's ideal speedup is 1.33, the
    light one's 4.06; both measured at exactly their ideal: ratio 1 each."""
    names = ["h", "l"]
    t = tasks(names, nice=[0, 5])
    w = np.array([1024, 335]) / 1359
    df = prop.df_proportional(shares(names, [1.0, 1.0]), t, 2, one=(shares(names, w), t))
    assert df["ideal_1"].tolist() == pytest.approx(w.tolist())
    assert df["ideal_speedup"].tolist() == pytest.approx((1 / w).tolist())
    assert df["speedup_ratio"].tolist() == pytest.approx([1.0, 1.0])
    assert prop.proportional_numbers(df)["ideal_speedup"] == pytest.approx(2.0)


def test_missing_baselines_give_none_not_numbers():
    t = tasks(N3)
    n = prop.proportional_numbers(prop.df_proportional(shares(N3, [2 / 3] * 3), t, 2))
    assert set(n.values()) == {None}
    # a task starved on one CPU sped up infinitely: the worst task is another (4/3 of an ideal 2)
    df = prop.df_proportional(shares(N3, [2 / 3] * 3), t, 2, one=(shares(N3, [0.5, 0.5, 0.0]), t))
    assert np.isinf(df["speedup_ratio"].iloc[2])
    assert prop.proportional_numbers(df)["speedup_ratio_min"] == pytest.approx(2 / 3)


def test_the_ideal_curve_over_p():
    c = prop.df_ideal_curve(tasks(["a", "b", "c", "d"]), 6)
    assert c["share_mean"].tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert c["speedup"].tolist() == pytest.approx([1, 2, 3, 4, 4, 4])


def test_a_cpu_that_recorded_nothing_is_not_an_error():
    """Every task pinned to CPU 0: CPU 1 has no event at all (an idle CPU of the set whose probe
    saw nothing there); the wasted-core search finds nothing rather than failing."""
    t = tasks(["a", "b"]).assign(pinned=True)
    ev = Stream().wakeup(0, 0, 100, 0).wakeup(1, 0, 101, 0).switch(2, 0, 0, 0, 100).events()
    w = cost.df_wasted(ev, t, [0, 1], 0, 10_000_000)
    assert len(w) == 0 and w.attrs["wasted_cpu_s"] == 0


def test_parameters():
    exp = get_experiment("proportional")
    p = exp.resolve({}, [0, 1, 2, 3])
    assert p["ntasks"] == 8 and p["on"] == "set"
    assert exp.companions(p) == {"one": {"on": "one"}, "share": {"on": "share"}}
    specs = exp.tasks(p, [0, 1, 2, 3])
    assert [s.initial_cpu for s in specs] == [0, 1, 2, 3] * 2 and not any(s.pinned for s in specs)
    one = exp.tasks(exp.resolve({"on": "one"}, [0, 1, 2, 3]), [0, 1, 2, 3])
    assert len(one) == 8 and all(s.pinned and s.initial_cpu == 0 for s in one)
    share = exp.tasks(exp.resolve({"on": "share", "ntasks": "6", "nices": "0,5"}, [4, 5, 6, 7]),
                      [4, 5, 6, 7])
    assert [(s.name, s.nice, s.initial_cpu) for s in share] == [("c00", 0, 4)]
    assert exp.companions(exp.resolve({"on": "one"}, [0, 1])) == {}
    for bad, message in (({"on": "two"}, "must be one of"), ({"nices": "0,25"}, "nice value"),
                         ({"ntasks": "0"}, "must be positive")):
        with pytest.raises(ParameterError, match=message):
            exp.resolve(bad, [0, 1])
    with pytest.raises(ParameterError, match="compares P CPUs with one"):
        exp.resolve({}, [0])


@pytest.mark.parametrize("policy,worst", [("global-queue", (0.95, 1.05)),
                                          ("poly-balance", (0.70, 0.80))])
def test_the_experiment_under_reference_policies(tmp_path, policy, worst):
    """6 tasks on 4 CPUs. A global queue shares the 4 CPUs equally, 2/3 each: proportional. A
    per-CPU policy with strong affinity (poly-balance) leaves two CPUs with two tasks: those get
    1/2 of an ideal 2/3, a speedup ratio of 0.75 (the thesis's O(1) failing (a)); the total is
    still 4 CPUs' worth (ratio 1)."""
    run = simulate_run(policy, "proportional", 4, tmp_path / policy,
                       {"duration": "2", "ntasks": "6"})
    s = run.summary
    assert (s["ntasks"], s["cpus_used"], s["concurrency_tasks"]) == (6, 4, 1)
    assert s["ideal_speedup"] == pytest.approx(4.0)
    assert s["speedup_ratio"] == pytest.approx(1.0, abs=0.02)
    assert worst[0] <= s["speedup_ratio_min"] <= worst[1]
    assert s["one_cpu_share"] == pytest.approx(1 / 6, abs=0.01)
    one = store.open_run(tmp_path / policy / "one").summary
    assert (one["cpus_used"], one["speedup"], one["one_cpu_share"]) == (1, None, None)
    assert one["ideal_share"] == pytest.approx(1 / 6)
    assert (run.path / "figures" / "proportional.png").stat().st_size > 5000
