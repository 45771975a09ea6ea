"""Foreign load: CPU time of non-experiment tasks on the experiment's CPUs, on a hand-built stream."""

import numpy as np
import pandas as pd
import pytest

from harmony.analysis.foreign import df_foreign_load
from harmony.analysis.synthetic import Stream

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
