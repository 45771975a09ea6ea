"""Mixed-workload metrics (analysis.mixed) and the E6/E7/E11 experiments' analysis, hermetic:
synthetic event streams with hand-computed answers, P = 2, 4, 8, passed through the real
reconstruction (analysis.reconstruct) and the real run store."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harmony import store
from harmony.analysis import mixed, reconstruct
from harmony.analysis.event_streams import TASK_INTERRUPTIBLE, TASK_RUNNING, Stream
from harmony.experiments import get_experiment

S = 1_000_000_000
T0 = 10 * S
PS = [2, 4, 8]


def at(s: float) -> int:
    return T0 + int(round(s * S))


def tasks_table(roles: dict[str, list[int]], initial: dict[int, int], **extra) -> pd.DataFrame:
    rows = []
    for role, pids in roles.items():
        for i, pid in enumerate(pids):
            rows.append({"pid": pid, "name": f"{role[0]}{i:02d}", "role": role, "duty": 100.0,
                         "nice": extra.get("nice", {}).get(role, 0), "initial_cpu": initial[pid],
                         "period_ms": 10.0})
    df = pd.DataFrame(rows)
    df["pid"] = df["pid"].astype(np.int32)
    return df


def tables(events, tasks, cpus, t_end):
    return {"migrations": reconstruct.df_migrations(events, tasks, T0),
            "runqueue": reconstruct.df_runqueue(events, tasks, cpus, T0, t_end),
            "runs": reconstruct.df_runs(events, tasks, T0, t_end)}


def heavy_light_dynamic(P):
    """All 2P tasks wake on CPU 0; at 1 s heavy i and light i (i >= 1) move to CPU i; at 2 s
    light 1 (CPU 1) and heavy 0 (CPU 0) swap places. Ends at 3 s."""
    heavy, light = list(range(1000, 1000 + P)), list(range(2000, 2000 + P))
    s = Stream()
    for pid in heavy + light:
        s.wakeup(at(0), 0, pid, 0)
    for i in range(1, P):
        s.migrate(at(1), i, heavy[i], 0, i).migrate(at(1), i, light[i], 0, i)
    s.migrate(at(2), 0, light[1], 1, 0).migrate(at(2), 1, heavy[0], 0, 1)
    tasks = tasks_table({"heavy": heavy, "light": light}, {p: 0 for p in heavy + light})
    return s.events(), tasks, at(3)


def heavy_light_static(P):
    """Heavy i and light i woken on CPU i; light 0 runs, sleeps from 0.5 s and wakes at 1 s."""
    heavy, light = list(range(1000, 1000 + P)), list(range(2000, 2000 + P))
    s = Stream()
    for i in range(P):
        s.wakeup(at(0), i, heavy[i], i).wakeup(at(0), i, light[i], i)
    s.switch(at(0) + 5, 0, prev=0, state=TASK_RUNNING, next=light[0])
    s.switch(at(0.5), 0, prev=light[0], state=TASK_INTERRUPTIBLE, next=heavy[0])
    s.wakeup(at(1), 0, light[0], 0)
    initial = {p: i for i, p in enumerate(heavy)} | {p: i for i, p in enumerate(light)}
    tasks = tasks_table({"heavy": heavy, "light": light}, initial)
    return s.events(), tasks, at(3)


# --------------------------------------------------------------------------------- definitions

def test_smape_definition():
    assert mixed.smape(0.0, 0.0) == 0.0
    assert mixed.smape(1.0, 0.0) == 1.0
    assert mixed.smape(3.0, 1.0) == pytest.approx(0.5)
    assert mixed.smape(1.0, 3.0) == pytest.approx(0.5)
    assert mixed.smape(None, 1.0) is None


def test_spread_index_extremes_and_middle():
    assert mixed.spread_index([4, 0, 0, 0]) == pytest.approx(1.0)
    assert mixed.spread_index([1, 1, 1, 1]) == pytest.approx(0.0)
    # <2,2,0,0>: deviation 1+1+1+1 = 4 of a maximum 2*4*3/4 = 6
    assert mixed.spread_index([2, 2, 0, 0]) == pytest.approx(4 / 6)
    assert np.isnan(mixed.spread_index([0, 0]))
    np.testing.assert_allclose(mixed.spread_index([[2, 0], [1, 1]]), [1.0, 0.0])


def test_windows_follow_params_and_drop_what_does_not_fit():
    assert mixed.windows(10, 5) == {"short": (1.0, 2.0), "long": (5.0, 10.0)}
    assert mixed.windows(1.5, 1.0) == {"long": (1.0, 1.5)}
    assert mixed.windows(1.0, 0.5, 0.25, 0.5) == {"short": (0.25, 0.75), "long": (0.5, 1.0)}


# ------------------------------------------------------------------------ variance and SMAPE

@pytest.mark.parametrize("P", PS)
def test_runqueue_variance_step_function(P):
    events, tasks, t_end = heavy_light_dynamic(P)
    cpus = list(range(P))
    var = mixed.df_runqueue_variance(tables(events, tasks, cpus, t_end)["runqueue"], cpus, T0,
                                     t_end)
    # <2P,0,...> for the first second: variance 4(P-1); <2,...,2> afterwards: 0
    assert mixed.time_average(var, "variance", T0, 0, 1) == pytest.approx(4 * (P - 1))
    assert mixed.time_average(var, "variance", T0, 1, 3) == pytest.approx(0.0)
    assert mixed.time_average(var, "variance", T0, 0.5, 1.5) == pytest.approx(2 * (P - 1))
    assert mixed.time_average(var, "mean", T0, 0, 3) == pytest.approx(2.0)


@pytest.mark.parametrize("P", PS)
def test_smape_against_static_ideal(P):
    cpus = list(range(P))
    ev_d, tasks_d, end_d = heavy_light_dynamic(P)
    ev_s, tasks_s, end_s = heavy_light_static(P)
    vd = mixed.df_runqueue_variance(tables(ev_d, tasks_d, cpus, end_d)["runqueue"], cpus, T0, end_d)
    vs = mixed.df_runqueue_variance(tables(ev_s, tasks_s, cpus, end_s)["runqueue"], cpus, T0, end_s)
    # static: one CPU at 1, the rest at 2 for 0.5 s: variance (P-1)/P^2
    vs_short = mixed.time_average(vs, "variance", T0, 0.5, 1.5)
    assert vs_short == pytest.approx((P - 1) / P ** 2 / 2)
    vd_short = mixed.time_average(vd, "variance", T0, 0.5, 1.5)
    assert mixed.smape(vd_short, vs_short) == pytest.approx((4 * P ** 2 - 1) / (4 * P ** 2 + 1))
    assert mixed.smape(mixed.time_average(vd, "variance", T0, 1, 3),
                       mixed.time_average(vs, "variance", T0, 1, 3)) == 0.0


# -------------------------------------------------------------------------------- placement

@pytest.mark.parametrize("P", PS)
def test_placement_and_one_heavy_one_light(P):
    events, tasks, t_end = heavy_light_dynamic(P)
    cpus = list(range(P))
    t = tables(events, tasks, cpus, t_end)
    placement = mixed.df_placement(t["migrations"], tasks, T0, t_end)
    assert placement.attrs["src_mismatches"] == 0
    h0 = placement[placement["name"] == "h00"]
    assert h0["cpu"].tolist() == [0, 1] and h0["ts"].tolist() == [T0, at(2)]
    counts = mixed.df_class_counts(placement, cpus, T0, t_end)
    # every task is counted once at every instant
    assert (counts.groupby("ts")["count"].sum() == 2 * P).all()
    pairs = mixed.df_pair_timeline(counts, "heavy", "light")
    assert mixed.time_average(pairs, "fraction", T0, 0, 1) == 0.0
    assert mixed.time_average(pairs, "fraction", T0, 1, 2) == 1.0
    # after the swap CPU 0 holds two light tasks and CPU 1 two heavy ones
    assert mixed.time_average(pairs, "fraction", T0, 2, 3) == pytest.approx((P - 2) / P)
    assert mixed.time_average(pairs, "fraction", T0, 0, 3) == pytest.approx((1 + (P - 2) / P) / 3)
    spread = mixed.df_spread(counts)
    for role in ("heavy", "light"):
        sub = spread[spread["role"] == role]
        assert mixed.time_average(sub, "index", T0, 0, 1) == pytest.approx(1.0)
        assert mixed.time_average(sub, "index", T0, 1, 2) == pytest.approx(0.0)
        assert mixed.time_average(sub, "index", T0, 2, 3) == pytest.approx(1 / (P - 1))


def test_placement_counts_a_lost_migration():
    s = Stream().wakeup(at(0), 0, 1000, 0).migrate(at(1), 1, 1000, 0, 1) \
        .migrate(at(2), 0, 1000, 0, 1)
    tasks = tasks_table({"heavy": [1000]}, {1000: 0})
    mig = reconstruct.df_migrations(s.events(), tasks, T0)
    recorded = mig[~mig["inferred"]]
    placement = mixed.df_placement(recorded, tasks, T0, at(3))
    assert placement.attrs["src_mismatches"] == 1
    assert placement["cpu"].tolist() == [0, 1, 1]
    # the migrations table holds the lost move (1 -> 0) as inferred, before the one proving it
    placement = mixed.df_placement(mig, tasks, T0, at(3))
    assert placement.attrs["src_mismatches"] == 0
    assert placement["cpu"].tolist() == [0, 1, 1]


# ------------------------------------------------------------------ allocation and migrations

def alloc_stream(P, heavy_until):
    """On each CPU i heavy i runs [0, heavy_until) then light i runs to 1 s and sleeps."""
    heavy, light = list(range(1000, 1000 + P)), list(range(2000, 2000 + P))
    s = Stream()
    for i in range(P):
        s.wakeup(at(0), i, heavy[i], i).wakeup(at(0), i, light[i], i)
        s.switch(at(0), i, prev=0, state=TASK_RUNNING, next=heavy[i])
        s.switch(at(heavy_until), i, prev=heavy[i], state=TASK_RUNNING, next=light[i])
        s.switch(at(1), i, prev=light[i], state=TASK_INTERRUPTIBLE, next=0)
    initial = {p: i for i, p in enumerate(heavy)} | {p: i for i, p in enumerate(light)}
    return s.events(), tasks_table({"heavy": heavy, "light": light}, initial), at(1)


@pytest.mark.parametrize("P", PS)
def test_window_allocation_and_ratio(P):
    wins = {"short": (0.5, 1.0), "long": (0.0, 1.0)}
    allocs = {}
    for label, until in (("dyn", 0.6), ("static", 0.8)):
        events, tasks, t_end = alloc_stream(P, until)
        runs = reconstruct.df_runs(events, tasks, T0, t_end)
        allocs[label] = mixed.df_window_allocation(runs, tasks, T0, wins)
    a = allocs["dyn"].set_index(["window", "role"])
    assert a.loc[("long", "heavy"), "cpu_time"] == pytest.approx(0.6 * P)
    assert a.loc[("long", "heavy"), "share"] == pytest.approx(0.6)
    assert a.loc[("short", "light"), "share"] == pytest.approx(0.8)
    assert mixed.allocation_ratio(allocs["dyn"], allocs["static"], "heavy", "long") \
        == pytest.approx(0.75)
    assert mixed.allocation_ratio(allocs["dyn"], allocs["static"], "light", "long") \
        == pytest.approx(2.0)
    assert mixed.allocation_ratio(allocs["dyn"], allocs["static"], "heavy", "short") \
        == pytest.approx(1 / 3)
    assert mixed.allocation_ratio(allocs["dyn"], allocs["static"], "heavy", "none") is None


def priority_stream(P):
    """High and low tasks wake on CPU 0; high 0 runs there the whole second; at 0.5 s every other
    high task moves to its own CPU and runs; low tasks never run. Ends at 1 s."""
    high, low = list(range(1000, 1000 + P)), list(range(2000, 2000 + P))
    s = Stream()
    for pid in high + low:
        s.wakeup(at(0), 0, pid, 0)
    s.switch(at(0) + 5, 0, prev=0, state=TASK_RUNNING, next=high[0])
    for i in range(1, P):
        s.migrate(at(0.5), i, high[i], 0, i)
        s.switch(at(0.5) + 5, i, prev=0, state=TASK_RUNNING, next=high[i])
    tasks = tasks_table({"high": high, "low": low}, {p: 0 for p in high + low},
                        nice={"low": 10})
    return s.events(), tasks, at(1)


@pytest.mark.parametrize("P", PS)
def test_migration_rate_and_spread_of_priority_classes(P):
    events, tasks, t_end = priority_stream(P)
    cpus = list(range(P))
    t = tables(events, tasks, cpus, t_end)
    rate = mixed.df_migration_rate(t["migrations"], t["runs"], tasks, T0, t_end).set_index("role")
    high_cpu = (1 - 5e-9) + (P - 1) * (0.5 - 5e-9)
    assert rate.loc["high", "migrations"] == P - 1
    assert rate.loc["high", "cpu_s"] == pytest.approx(high_cpu)
    assert rate.loc["high", "per_cpu_s"] == pytest.approx((P - 1) / high_cpu)
    assert rate.loc["low", "migrations"] == 0 and np.isnan(rate.loc["low", "per_cpu_s"])
    assert rate.loc["all", "per_s"] == pytest.approx(P - 1)
    counts = mixed.df_class_counts(mixed.df_placement(t["migrations"], tasks, T0, t_end),
                                   cpus, T0, t_end)
    spread = mixed.df_spread(counts)
    high, low = spread[spread["role"] == "high"], spread[spread["role"] == "low"]
    assert mixed.time_average(high, "index", T0, 0, 1) == pytest.approx(0.5)
    assert mixed.time_average(low, "index", T0, 0, 1) == pytest.approx(1.0)


# ---------------------------------------------------- experiments' analyse over a stored run

def write_run(path, experiment, events, tasks, cpus, t_end, overrides):
    """A complete run directory from a synthetic stream: the tables `harmony.pipeline` writes."""
    exp = get_experiment(experiment)
    params = exp.resolve({"duration": (t_end - T0) / S} | overrides, cpus)
    path.mkdir(parents=True, exist_ok=True)
    t = tables(events, tasks, cpus, t_end)
    t["shares"] = reconstruct.df_task_share(t["runs"], tasks, cpus, T0, t_end)
    t["allocation"] = reconstruct.df_allocation(t["runs"], tasks, T0, t_end, int(0.5 * S))
    t["tasks"] = tasks
    for name, df in t.items():
        store.write_table(path, name, df)
    manifest = {"experiment": experiment, "params": params, "cpus": cpus, "status": "complete",
                "t0_ns": T0, "end_ns": t_end, "measured_s": (t_end - T0) / S, "seed": 0}
    store.write_json(path / "manifest.json", manifest)
    run = store.open_run(path)
    store.write_json(path / "summary.json", exp.analyse(run))
    return store.open_run(path)


def _four_on_cpu0():
    """(stream, tasks, pids): four CPU-bound tasks woken on CPU 0 at t0."""
    pids = [1000, 1001, 1002, 1003]
    s = Stream()
    for pid in pids:
        s.wakeup(at(0), 0, pid, 0)
    return s, tasks_table({"cpu": pids}, {p: 0 for p in pids}), pids


def test_single_source_that_never_balances_says_so(tmp_path):
    """Four tasks woken on CPU 0 that never move: no balance, so nothing comes after it."""
    s, tasks, _ = _four_on_cpu0()
    run = write_run(tmp_path, "single-source", s.events(), tasks, [0, 1], at(2), {})
    assert run.summary["time_to_balance_s"] is None
    assert run.summary["migrations_after_balance"] is None
    lines = get_experiment("single-source").describe(run.summary)
    assert "migrations after balance     n/a (never balanced)" in lines
    assert not any("None" in line for line in lines)
    # time-to-resolve's line of the same, from a summary that never balanced
    ttr = dict(run.summary, x=2, balanced_s=0.0, rounds_onto_target=0, moved_to_target=0)
    lines = get_experiment("time-to-resolve").describe(ttr)
    assert any(line.endswith("while runnable; never balanced)") for line in lines)
    assert not any("None" in line for line in lines)


def test_single_source_that_loses_its_balance_gives_both_times(tmp_path):
    """Balanced at 1 s, unbalanced at 2 s, balanced again at 3 s: the report line says when it
    was first balanced and from when for good, not the latter alone."""
    s, tasks, pids = _four_on_cpu0()
    s.migrate(at(1), 1, pids[0], 0, 1).migrate(at(1) + 10, 1, pids[1], 0, 1)
    s.migrate(at(2), 1, pids[2], 0, 1)
    s.migrate(at(3), 0, pids[2], 1, 0)
    run = write_run(tmp_path, "single-source", s.events(), tasks, [0, 1], at(4), {})
    assert run.summary["balance_entries"] == 2
    line = next(ln for ln in get_experiment("single-source").describe(run.summary)
                if ln.startswith("balanced within tolerance"))
    assert "1000.0 ms after t0 first, for good from 3000.0 ms (entered balance 2 times)" in line
    # lost and not regained: balanced once, never for good (not "never balanced")
    run = write_run(tmp_path / "lost", "single-source", s.events(), tasks, [0, 1], at(2.5), {})
    assert run.summary["time_to_balance_s"] is None and run.summary["balance_entries"] == 1
    lines = get_experiment("single-source").describe(run.summary)
    assert any("1000.0 ms after t0 first, not for good (entered balance 1 time)" in ln
               for ln in lines)
    assert "migrations after balance     n/a (not balanced for good)" in lines
    ttr = dict(run.summary, x=2, balanced_s=1.0, rounds_onto_target=0, moved_to_target=0)
    assert any(ln.endswith("while runnable; not balanced for good)")
               for ln in get_experiment("time-to-resolve").describe(ttr))


HEAVY_LIGHT_KEYS = {"light_duty", "smape_short", "smape_long", "one_heavy_one_light_fraction",
                    "heavy_slowdown_short", "heavy_slowdown_long", "migrations", "migrations_per_s"}
PRIORITY_KEYS = {"nice_diff", "high_spread_index", "low_cluster_index", "migrations_per_cpu_s",
                 "high_allocation_ratio"}
INTRINSIC_KEYS = {"ntasks", "ncpus", "fair_share", "share_min", "share_max", "share_ratio_min",
                  "share_ratio_max", "jain_index", "migrations_per_s"}


@pytest.mark.parametrize("P", PS)
def test_heavy_light_summary_reads_its_static_companion(tmp_path, P):
    cpus = list(range(P))
    win = {"long_warmup_s": 1.0, "short_warmup_s": 0.5, "short_s": 1.0}
    write_run(tmp_path / "static", "heavy-light", *heavy_light_static(P)[:2], cpus,
              heavy_light_static(P)[2], win | {"static": "1"})
    ev, tasks, t_end = heavy_light_dynamic(P)
    run = write_run(tmp_path, "heavy-light", ev, tasks, cpus, t_end, win)
    s = run.summary
    assert HEAVY_LIGHT_KEYS <= set(s)
    json.dumps(s)  # JSON-serialisable
    assert s["static_run"] == "static"
    assert s["smape_short"] == pytest.approx((4 * P ** 2 - 1) / (4 * P ** 2 + 1))
    assert s["smape_long"] == 0.0
    assert s["one_heavy_one_light_fraction"] == pytest.approx((1 + (P - 2) / P) / 2)
    assert s["migrations"] == 2 * (P - 1) + 2
    assert s["migrations_per_s"] == pytest.approx((2 * (P - 1) + 2) / 3)
    # in the dynamic stream nothing runs; in the static one heavy 0 runs from 0.5 s on
    assert s["heavy_slowdown_long"] == 0.0 and s["heavy_slowdown_short"] == 0.0
    assert s["light_slowdown_long"] is None  # the static light tasks never ran then: no ratio
    static = run.companion("static").summary
    assert static["one_heavy_one_light_fraction"] == 1.0 and static["migrations"] == 0
    assert static["smape_long"] is None


def test_heavy_light_without_companion_reports_none(tmp_path):
    ev, tasks, t_end = heavy_light_dynamic(2)
    s = write_run(tmp_path, "heavy-light", ev, tasks, [0, 1], t_end,
                  {"long_warmup_s": 1.0}).summary
    assert HEAVY_LIGHT_KEYS <= set(s)
    assert s["static_run"] is None and s["smape_long"] is None and s["heavy_slowdown_short"] is None
    assert any("missing" in line for line in get_experiment("heavy-light").describe(s))


@pytest.mark.parametrize("P", PS)
def test_priority_classes_summary(tmp_path, P):
    cpus = list(range(P))
    run = write_run(tmp_path, "priority-classes", *priority_stream(P)[:2], cpus,
                    priority_stream(P)[2],
                    {"long_warmup_s": 0.0, "short_warmup_s": 0.5, "short_s": 0.5,
                     "nice_diff": "10"})
    s = run.summary
    assert PRIORITY_KEYS <= set(s)
    json.dumps(s)
    assert s["high_spread_index"] == pytest.approx(0.5)
    assert s["high_spread_index_short"] == pytest.approx(0.0)
    assert s["low_cluster_index"] == pytest.approx(1.0)
    assert s["high_allocation_ratio"] is None  # no companion stored
    assert s["nice_diff"] == 10 and s["low_nice"] == 10


@pytest.mark.parametrize("P", PS)
def test_intrinsic_imbalance_summary(tmp_path, P):
    """P+1 tasks: P of them run alone on a CPU the whole second, the last one never runs."""
    pids = list(range(1000, 1000 + P + 1))
    s = Stream()
    for pid in pids:
        s.wakeup(at(0), 0, pid, 0)
    s.switch(at(0) + 5, 0, prev=0, state=TASK_RUNNING, next=pids[0])
    for i in range(1, P):
        s.migrate(at(0.5), i, pids[i], 0, i)
        s.switch(at(0.5), i, prev=0, state=TASK_RUNNING, next=pids[i])
    tasks = tasks_table({"cpu": pids}, {p: 0 for p in pids})
    run = write_run(tmp_path, "intrinsic-imbalance", s.events(), tasks, list(range(P)), at(2),
                    {"warmup_s": "1.0", "layout": str(P + 1)})
    out = run.summary
    assert INTRINSIC_KEYS <= set(out)
    assert out["fair_share"] == pytest.approx(P / (P + 1))
    assert out["share_min"] == 0.0
    assert out["share_ratio_max"] == pytest.approx((1 - 2.5e-9) / (P / (P + 1)))
    assert out["migrations"] == P - 1
    assert out["migrations_per_s"] == 0.0  # every move happened in the first second


@pytest.mark.parametrize("layout,msg", [("2,0", "no intrinsic imbalance"), ("4,0", "no intrinsic"),
                                        ("1,0", "no intrinsic")])
def test_intrinsic_imbalance_refuses_divisible_layouts(layout, msg):
    with pytest.raises(ValueError, match=msg):
        get_experiment("intrinsic-imbalance").resolve({"layout": layout}, [0, 1])


def test_defaults_generalise_to_p():
    exp = get_experiment("intrinsic-imbalance")
    assert exp.resolve({}, [0, 1, 2, 3])["layout"] == [5, 0, 0, 0]
    for name, roles in (("heavy-light", ("heavy", "light")), ("priority-classes", ("high", "low"))):
        e = get_experiment(name)
        for P in PS:
            cpus = list(range(10, 10 + P))
            dyn = e.tasks(e.resolve({}, cpus), cpus)
            assert len(dyn) == 2 * P and {t.initial_cpu for t in dyn} == {10}
            assert not any(t.pinned for t in dyn)
            static_p = e.resolve(e.companions(e.resolve({}, cpus))["static"], cpus)
            static = e.tasks(static_p, cpus)
            assert all(t.pinned for t in static)
            for cpu in cpus:  # one of each class pinned per CPU
                assert sorted(t.role for t in static if t.initial_cpu == cpu) == sorted(roles)
            assert e.companions(static_p) == {}


def test_bad_parameters_are_one_line_errors():
    hl, pc = get_experiment("heavy-light"), get_experiment("priority-classes")
    with pytest.raises(ValueError, match="no long window"):
        hl.resolve({"duration": "2", "long_warmup_s": "3"}, [0, 1])
    with pytest.raises(ValueError, match="short window"):
        hl.resolve({"duration": "1.5", "long_warmup_s": "1"}, [0, 1])
    with pytest.raises(ValueError, match="not a nice value"):
        pc.resolve({"nice_diff": "25"}, [0, 1])
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        hl.resolve({}, [0])
    assert pc.tasks(pc.resolve({"nice_diff": "30", "high_nice": "-15"}, [0, 1]),
                    [0, 1])[-1].nice == 15


def test_figures_of_a_run_and_of_a_sweep(tmp_path):
    """Every figure is drawn from stored runs (per run and for a light_duty sweep)."""
    from harmony.analysis.plots_mixed import sweep_figures

    cpus = [0, 1]
    win = {"long_warmup_s": 1.0, "short_warmup_s": 0.5, "short_s": 1.0}
    dirs = []
    for duty in ("30", "70"):
        d = tmp_path / f"hl-{duty}"
        write_run(d / "static", "heavy-light", *heavy_light_static(2)[:2], cpus,
                  heavy_light_static(2)[2], win | {"static": "1", "light_duty": duty})
        run = write_run(d, "heavy-light", *heavy_light_dynamic(2)[:2], cpus,
                        heavy_light_dynamic(2)[2], win | {"light_duty": duty})
        dirs.append(d)
    figs = get_experiment("heavy-light").plot(run, d)  # matplotlib is slow: one run is enough
    assert {p.name for p in figs} == {"migrations.png", "placement.png", "shares.png",
                                      "variance.png", "runqueue.png", "allocation.png"}
    assert all(p.stat().st_size > 1000 for p in figs)
    sweep = mixed.df_sweep([store.open_run(d) for d in dirs])
    assert sweep["light_duty"].tolist() == [30.0, 70.0] and sweep["param_static"].tolist() == [0, 0]
    out = sweep_figures(dirs, tmp_path / "sweep")
    assert [p.name for p in out] == ["smape_vs_duty.png", "slowdown_vs_duty.png"]
    pids = [1000, 1001, 1002]
    stream = Stream().wakeup(at(0), 0, 1000, 0).wakeup(at(0), 0, 1001, 0).wakeup(at(0), 0, 1002, 0)
    stream.switch(at(0.1), 0, prev=0, state=TASK_RUNNING, next=1000).migrate(at(0.2), 1, 1001, 0, 1)
    e6 = write_run(tmp_path / "e6", "intrinsic-imbalance", stream.events(),
                   tasks_table({"cpu": pids}, {p: 0 for p in pids}), cpus, at(2),
                   {"warmup_s": "0.5", "layout": "3"})
    assert len(get_experiment("intrinsic-imbalance").plot(e6, tmp_path / "e6")) == 4


@pytest.mark.parametrize("seed", range(8))
def test_wide_is_the_pivot_table(seed):
    """mixed._wide reshapes a role's class counts as pivot_table does: segments sorted by (ts,
    end), CPUs sorted, duplicates summed, NaN where a segment lacks a CPU."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    counts = pd.DataFrame({"ts": rng.integers(0, 20, n) * 1000,
                           "end": rng.integers(20, 23, n) * 1000,
                           "cpu": rng.integers(0, 6, n).astype(np.int32),
                           "role": rng.choice(["heavy", "light"], n),
                           "count": rng.integers(0, 4, n).astype(np.int64)})
    for role in ("heavy", "light"):
        ts, end, m = mixed._wide(counts, role)
        want = counts[counts["role"] == role].pivot_table(index=["ts", "end"], columns="cpu",
                                                          values="count", aggfunc="sum")
        np.testing.assert_array_equal(ts, want.index.get_level_values(0).to_numpy(np.int64))
        np.testing.assert_array_equal(end, want.index.get_level_values(1).to_numpy(np.int64))
        np.testing.assert_array_equal(m, want.to_numpy(np.float64))


def test_roles_of_pids_with_strangers():
    tasks = pd.DataFrame({"pid": [7, 5, 300], "role": ["light", "heavy", "light"]})
    got = mixed._roles(np.array([5, 7, 99, 300, 1, 400]), tasks)
    assert got.tolist() == ["heavy", "light", "", "light", "", ""]
    assert mixed._roles(np.array([5]), tasks.iloc[:0]).tolist() == [""]


def test_window_spans_print_to_the_ms():
    from harmony.experiments.heavy_light import window_text
    assert window_text([1.5, 3.00012]) == "1.5-3 s"
    assert window_text([0.5, 1.0]) == "0.5-1 s" and window_text(None) == "n/a"
    assert window_text([0.25, 2.0004]) == "0.25-2 s" and window_text([1.0, 2.5006]) == "1-2.501 s"


def test_figures_of_many_cpus_are_heat_maps_of_the_tables(tmp_path, monkeypatch):
    """Beyond MANY_CPUS a panel per CPU (or per task) made figures as tall as the CPUs are many:
    the run queues, the placement and the allocation are heat maps instead, a row per CPU or
    task, each cell the table's own mean there."""
    import matplotlib.image

    from harmony.analysis import plots, plots_mixed

    P = plots.MANY_CPUS + 4
    grids, real = [], plots_mixed.heat_rows

    def heat_rows(ax, grid, edges, labels, *a):
        grids.append((grid, edges, list(labels)))
        return real(ax, grid, edges, labels, *a)

    monkeypatch.setattr(plots_mixed, "heat_rows", heat_rows)
    cpus = list(range(P))
    win = {"long_warmup_s": 1.0, "short_warmup_s": 0.5, "short_s": 1.0}
    write_run(tmp_path / "static", "heavy-light", *heavy_light_static(P)[:2], cpus,
              heavy_light_static(P)[2], win | {"static": "1"})
    run = write_run(tmp_path, "heavy-light", *heavy_light_dynamic(P)[:2], cpus,
                    heavy_light_dynamic(P)[2], win)
    figs = {p.name: p for p in get_experiment("heavy-light").plot(run, tmp_path)}
    for name in ("placement.png", "runqueue.png"):
        height, width = matplotlib.image.imread(figs[name]).shape[:2]
        assert height < 2800 and width < 1200, (name, height, width)
    # placement: heavy then light, 10 ms bins over 3 s; heavy on CPU 0: P, then 1 from 1 s,
    # none from 2 s; on CPU 1 none, then 1, then 2 (heavy 0 came); on the others 1 from 1 s
    (heavy, edges, labels), (light, _, _) = grids[0], grids[1]
    assert heavy.shape == light.shape == (P, plots.HEAT_BINS) and labels == cpus
    assert edges[0] == 0 and edges[-1] == pytest.approx(3.0)
    assert np.allclose(heavy[0], np.repeat([P, 1, 0], 100))
    assert np.allclose(heavy[1], np.repeat([0, 1, 2], 100))
    assert np.allclose(heavy[2:], np.repeat([0, 1, 1], 100))
    assert np.allclose(light[1], np.repeat([0, 1, 0], 100))     # light 1 went back to CPU 0
    # run queues over 1-1.5 s, the static ideal's then the dynamic run's: two on every CPU (the
    # static light 0 slept 0.5-1 s); the dynamic CPU 0 from 2P to 2 at 1 s
    static_rq, dynamic_rq = grids[2][0], grids[3][0]
    assert grids[3][1][0] == 1.0 and grids[3][1][-1] == 1.5
    assert np.allclose(static_rq, 2) and np.allclose(dynamic_rq, 2)
    # intrinsic imbalance, P + 1 tasks: the allocation's windows drawn as they are
    grids.clear()
    pids = list(range(1000, 1000 + P + 1))
    s = Stream()
    for pid in pids:
        s.wakeup(at(0), 0, pid, 0)
    s.switch(at(0), 0, prev=0, state=TASK_RUNNING, next=pids[0])
    for i in range(1, P):
        s.migrate(at(0.5), i, pids[i], 0, i)
        s.switch(at(0.5), i, prev=0, state=TASK_RUNNING, next=pids[i])
    e6 = write_run(tmp_path / "e6", "intrinsic-imbalance", s.events(),
                   tasks_table({"cpu": pids}, {p: 0 for p in pids}), cpus, at(2),
                   {"warmup_s": "1.0", "layout": str(P + 1)})
    figs = get_experiment("intrinsic-imbalance").plot(e6, tmp_path / "e6")
    assert all(matplotlib.image.imread(p).shape[0] < 1400 for p in figs)
    rq, edges, labels = grids[0]                # 1-2 s: CPU 0 two tasks, the others one each
    assert edges[0] == 1.0 and edges[-1] == 2.0 and labels == cpus
    assert np.allclose(rq[0], 2) and np.allclose(rq[1:], 1)
    share, edges, labels = grids[1]             # 4 windows of 0.5 s, a row per task by name
    assert labels == sorted(e6.tasks["name"]) and edges.tolist() == [0, 0.5, 1.0, 1.5, 2.0]
    assert np.allclose(share[0], 100) and np.allclose(share[-1], 0)
    assert np.allclose(share[1:P], [0, 100, 100, 100])
