"""The kernel cross-checks (analysis.crosscheck) against their definitions, on random inputs.

The definitions below are the first, pandas implementations, written as the docstrings read;
the module computes the same with numpy. Hand-built cases are in test_crosscheck_kernel.py.
"""

import numpy as np
import pandas as pd
import pytest

from harmony.analysis.crosscheck import _window_range as window_range
from harmony.analysis.crosscheck import kernel_agreement, nr_running_agreement
from harmony.analysis.reconstruct import runqueue_at, runqueue_steps

US = 1000


def _runqueue_at(rq, times):
    times = np.asarray(times, dtype=np.int64)
    cols = {}
    for cpu, g in rq.groupby("cpu", sort=True):
        i = np.searchsorted(g["ts"].to_numpy(), times, side="right") - 1
        cols[int(cpu)] = np.where(i >= 0, g["nr"].to_numpy()[np.maximum(i, 0)], -1).astype(np.int64)
    out = pd.DataFrame(cols, index=pd.Index(times, name="ts"))
    out.columns.name = "cpu"
    return out


def _window_range(rq, cpu, lo, hi, mid):
    vmin, vmax, vmid = (np.full(len(cpu), -1, np.int64) for _ in range(3))
    for c, g in rq.groupby("cpu", sort=True):
        sel = np.flatnonzero(cpu == int(c))
        ts, nr = g["ts"].to_numpy(), g["nr"].to_numpy()
        for j in sel:
            a = np.searchsorted(ts, lo[j], side="right") - 1
            b = np.searchsorted(ts, hi[j], side="right") - 1
            m = np.searchsorted(ts, mid[j], side="right") - 1
            if b >= 0:
                seg = nr[max(a, 0):b + 1]
                vmin[j], vmax[j], vmid[j] = seg.min(), seg.max(), nr[m] if m >= 0 else -1
    return vmin, vmax, vmid


def _kernel_agreement(rq, samples, cpus, t0, t_end):
    s = samples[(samples["ts"] >= t0) & (samples["ts"] <= t_end)]
    if s.empty:
        return {"sweeps": 0, "agreeing": 0, "agreement": None, "sweep_us_median": None,
                "disagreements": []}
    running = s[s["state"] == "R"]
    kernel = (running.groupby(["ts", "cpu"]).size().unstack("cpu", fill_value=0)
              .reindex(index=np.unique(s["ts"]), columns=cpus, fill_value=0))
    rebuilt = _runqueue_at(rq, kernel.index.to_numpy()).reindex(columns=cpus, fill_value=0)
    same = kernel.to_numpy() == rebuilt.to_numpy()
    agree = same.all(axis=1)
    examples = [{"t": (kernel.index[i] - t0) / 1e9, "cpu": cpus[c], "kernel": int(kernel.iat[i, c]),
                 "rebuilt": int(rebuilt.iat[i, c])} for i, c in zip(*np.nonzero(~same))][:10]
    return {"sweeps": int(len(agree)), "agreeing": int(agree.sum()),
            "agreement": float(agree.mean()),
            "sweep_us_median": float(s.groupby("ts")["sweep_ns"].first().median() / 1e3),
            "disagreements": examples}


def _nr_running_agreement(rq, samples, cpus, t0, t_end):
    s = samples[(samples["lo"] >= t0) & (samples["hi"] <= t_end) & samples["cpu"].isin(cpus)]
    out = {"samples": int(s["ts"].nunique()), "clean": 0, "agreeing": 0, "agreement": None,
           "agreement_at_midpoint": None, "cpu_clean": 0, "cpu_agreeing": 0, "cpu_agreement": None,
           "adjusted_agreement": None, "count_list_mismatch": 0, "window_us_median": None,
           "busy_comms": {}, "disagreements": []}
    if s.empty:
        return out
    col = lambda df, name: df[name].to_numpy()  # noqa: E731
    def win(df):
        return _window_range(rq, col(df, "cpu"), col(df, "lo"), col(df, "hi"), col(df, "ts"))
    lo_a, hi_a, _ = win(s)
    k_a = (s["nr_running"] - s["reader"] - s["others"]).to_numpy()
    out["adjusted_agreement"] = float(pd.Series((k_a >= lo_a) & (k_a <= hi_a)).groupby(
        col(s, "ts")).all().mean())
    steady = (s["others"] == 0) & (s["nr_running"] == s["listed_runnable"])
    pc = s[steady]
    if len(pc):
        lo_v, hi_v, _ = win(pc)
        k = (pc["nr_running"] - pc["reader"]).to_numpy()
        ok = (k >= lo_v) & (k <= hi_v)
        out |= {"cpu_clean": len(pc), "cpu_agreeing": int(ok.sum()),
                "cpu_agreement": float(ok.mean())}
    complete = s.groupby("ts")["cpu"].nunique() == len(cpus)
    dirty = (~steady).groupby(s["ts"]).any()
    clean_ts = complete.index[complete & ~dirty]
    busy = s.loc[s["others"] > 0, "other_comms"].str.split(",").explode().value_counts()
    out["busy_comms"] = {str(k): int(v) for k, v in busy.head(5).items()}
    out["count_list_mismatch"] = int((s["nr_running"] != s["listed_runnable"]).sum())
    out["window_us_median"] = float((s["hi"] - s["lo"]).median() / 1e3)
    c = s[s["ts"].isin(clean_ts)].sort_values(["ts", "cpu"])
    if c.empty:
        return out
    kernel = (c["nr_running"] - c["reader"]).to_numpy()
    lo_v, hi_v, mid_v = win(c)
    ok = (kernel >= lo_v) & (kernel <= hi_v)
    ts = col(c, "ts")
    agree, agree_mid = pd.Series(ok).groupby(ts).all(), pd.Series(kernel == mid_v).groupby(ts).all()
    out["disagreements"] = [{"t": (int(ts[k]) - t0) / 1e9, "cpu": int(c["cpu"].iat[k]),
                             "kernel": int(kernel[k]), "rebuilt_min": int(lo_v[k]),
                             "rebuilt_max": int(hi_v[k])} for k in np.flatnonzero(~ok)[:10]]
    out |= {"clean": int(len(agree)), "agreeing": int(agree.sum()),
            "agreement": float(agree.mean()),
            "agreement_at_midpoint": float(agree_mid.mean())}
    return out


def _random_runqueue(rng, ncpus):
    rows = []
    for cpu in range(ncpus):
        if rng.random() < 0.15:
            continue  # a CPU of the set the rebuilt run queue never saw
        ts = np.sort(rng.integers(0, 2000, int(rng.integers(1, 300)))) * US
        rows += [(int(t), cpu, int(n)) for t, n in zip(ts, rng.integers(0, 4, len(ts)))]
    df = pd.DataFrame(rows, columns=["ts", "cpu", "nr"])
    return df.sort_values("ts", kind="stable").reset_index(drop=True).astype(
        {"cpu": "int32", "nr": "int32"})


def _random_nr_samples(rng, ncpus, rq):
    comms = ["kworker/0:1", "bash", "sshd", "python3", "kdamond.0", "rcu_sched", "cron"]
    keys = []
    for t in np.sort(rng.choice(np.arange(20, 1990), int(rng.integers(1, 80)), replace=False)):
        for cpu in range(ncpus + 1):           # one beyond the set, sometimes
            if rng.random() < 0.1 or (cpu == ncpus and rng.random() < 0.7):
                continue
            keys.append((int(t) * US, int(t) * US + int(rng.integers(0, 999)), cpu))
    if not keys:
        keys = [(1000 * US, 1000 * US, 0)]
    at = _runqueue_at(rq, [k[1] for k in keys])
    rows = []
    for j, (ts, mid, cpu) in enumerate(keys):
        truth = int(at[cpu].iloc[j]) if cpu in at.columns else 0
        # windows of 0 to ~300 steps: the wide ones take the slice path
        half = int(rng.choice([0, 1, 5, 40, 400], p=[0.2, 0.4, 0.25, 0.1, 0.05])) * US
        reader = int(rng.random() < 0.3)
        others = int(rng.choice([0, 0, 0, 1, 2]))
        nr = max(truth, 0) + reader + others + int(rng.choice([0, 0, 0, 1, -1]))
        listed = nr + int(rng.choice([0, 0, 0, 0, 1, -1]))
        names = ",".join(rng.choice(comms, others)) if others else ""
        # the ts of a sample is shared by its CPUs' rows, as the sampler writes it
        rows.append((ts, mid - half, mid + half, cpu, nr, listed, reader, others, names))
    rows = [rows[k] for k in rng.permutation(len(rows))]  # the definition sorts them itself
    df = pd.DataFrame(rows, columns=["ts", "lo", "hi", "cpu", "nr_running", "listed_runnable",
                                     "reader", "others", "other_comms"])
    return df.astype({"ts": "int64", "lo": "int64", "hi": "int64", "cpu": "int16",
                      "nr_running": "int32", "listed_runnable": "int32", "reader": "int32",
                      "others": "int32", "other_comms": "str"})


def _random_sweeps(rng, ncpus):
    rows = []
    for t in np.sort(rng.choice(np.arange(0, 2000), int(rng.integers(1, 60)), replace=False)):
        sweep = int(rng.integers(50, 5000)) * US // 10
        for pid in range(100, 100 + int(rng.integers(1, 9))):
            rows.append((int(t) * US, sweep, pid, int(rng.integers(0, ncpus + 1)),
                         str(rng.choice(["R", "S", "R", "D"]))))
    return pd.DataFrame(rows, columns=["ts", "sweep_ns", "pid", "cpu", "state"]).astype(
        {"cpu": "int16", "state": "str"})


@pytest.mark.parametrize("seed", range(20))
def test_agreements_match_their_definitions(seed):
    rng = np.random.default_rng(seed)
    ncpus = int(rng.integers(1, 7))
    cpus = list(range(ncpus))
    rq = _random_runqueue(rng, ncpus)
    t0, t_end = int(rng.integers(0, 300)) * US, int(rng.integers(1500, 2100)) * US
    nr = _random_nr_samples(rng, ncpus, rq)
    want = _nr_running_agreement(rq, nr, cpus, t0, t_end)
    assert nr_running_agreement(rq, nr, cpus, t0, t_end) == want
    sweeps = _random_sweeps(rng, ncpus)
    want = _kernel_agreement(rq, sweeps, cpus, t0, t_end)
    assert kernel_agreement(rq, sweeps, cpus, t0, t_end) == want
    times = rng.integers(-10, 2100, 50) * US
    pd.testing.assert_frame_equal(runqueue_at(rq, times), _runqueue_at(rq, times))


def test_the_random_cases_reach_every_branch():
    """The cases above are not all trivially equal: clean samples, disagreements, wide windows."""
    seen = {"clean": 0, "disagree": 0, "wide": 0, "kernel_disagree": 0, "busy": 0}
    for seed in range(30):
        rng = np.random.default_rng(seed)
        ncpus = int(rng.integers(1, 7))
        rq = _random_runqueue(rng, ncpus)
        t0, t_end = int(rng.integers(0, 300)) * US, int(rng.integers(1500, 2100)) * US
        nr = _random_nr_samples(rng, ncpus, rq)
        out = _nr_running_agreement(rq, nr, list(range(ncpus)), t0, t_end)
        seen["clean"] += out["clean"] > 0
        seen["disagree"] += len(out["disagreements"]) > 0
        seen["busy"] += len(out["busy_comms"]) == 5
        seen["wide"] += int(((nr["hi"] - nr["lo"]) >= 800 * US).any())
        k = _kernel_agreement(rq, _random_sweeps(rng, ncpus), list(range(ncpus)), t0, t_end)
        seen["kernel_disagree"] += len(k["disagreements"]) > 0
    assert all(v >= 3 for v in seen.values()), seen


@pytest.mark.parametrize("seed", range(10))
def test_window_range_matches_its_definition(seed):
    """Windows from before a CPU's first step to across hundreds of steps (the sliced ones)."""
    rng = np.random.default_rng(seed)
    rq = _random_runqueue(rng, 3)
    if seed % 2:  # rising counts: a window's largest value is its last step, its smallest the first
        rq["nr"] = rq.groupby("cpu").cumcount().astype("int32")
    n = 400
    cpu = rng.integers(0, 4, n)
    mid = rng.integers(-50, 2100, n) * US
    lo = mid - rng.choice([0, 1, 30, 900], n) * US
    hi = mid + rng.choice([0, 1, 30, 900], n) * US
    got = window_range(runqueue_steps(rq), cpu, lo, hi, mid)
    want = _window_range(rq, cpu, lo, hi, mid)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
