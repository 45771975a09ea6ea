"""release_spread on a small hand-made trace: spreads, tasks never woken, the layout checks."""

import pandas as pd

from harmony.analysis.release import release_spread


def _events(rows):
    return pd.DataFrame(rows, columns=["ts", "event", "pid"]).astype({"event": "category"})


def test_spreads_and_checks():
    tasks = pd.DataFrame({"pid": [11, 12, 13]})
    ev = _events([
        (50, "sched_switch", 99),          # a foreign task before t0: not ours
        (100, "sched_waking", 11),
        (110, "sched_wakeup", 11),
        (130, "sched_wakeup", 12),
        (135, "sched_wakeup", 12),          # a second wake-up of 12 does not count
        (150, "sched_migrate_task", 11),    # inside the window
        (400, "sched_migrate_task", 12),    # after it
    ])
    r = release_spread(ev, tasks, t0=100, released=200)
    assert r["woken"] == 2 and r["not_woken"] == [13]
    assert r["wake_spread_ns"] == 20 and r["release_spread_ns"] == 90
    assert r["first_wakeup_after_t0_ns"] == 10
    assert r["ran_before_t0"] == [] and r["moved_before_released"] == 1


def test_a_task_that_ran_before_t0_is_named():
    tasks = pd.DataFrame({"pid": [11]})
    ev = _events([(90, "sched_switch", 11), (120, "sched_wakeup", 11)])
    r = release_spread(ev, tasks, t0=100, released=None)
    assert r["ran_before_t0"] == [11] and r["moved_before_released"] is None
    assert r["release_spread_ns"] == 0


def test_wake_ups_off_the_initial_cpu_are_named():
    """The layout check of an occupied release: each task's first wake-up after t0 must put it on
    its initial CPU (later wake-ups elsewhere are the experiment)."""
    tasks = pd.DataFrame({"pid": [11, 12, 13], "initial_cpu": [0, 0, 1]})
    ev = pd.DataFrame([(90, "sched_wakeup", 11, 1),          # before t0: not counted
                       (110, "sched_wakeup", 11, 0), (120, "sched_wakeup", 12, 1),
                       (125, "sched_wakeup", 13, 1), (300, "sched_wakeup", 11, 1)],
                      columns=["ts", "event", "pid", "target_cpu"]).astype({"event": "category"})
    r = release_spread(ev, tasks, t0=100, released=200)
    assert r["woke_off_initial_cpu"] == [12]
    # a first wake-up recorded after "released" is not the release's: not judged
    assert release_spread(ev, tasks, t0=100, released=115)["woke_off_initial_cpu"] == []
    assert release_spread(ev.drop(columns="target_cpu"),
                          tasks, 100, 200)["woke_off_initial_cpu"] is None
