"""Policy inference rules on hand-made evidence: labels, agreement, gaps, thresholds."""

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from harmony.analysis import policy, stats, thresholds as T, trust
from harmony.analysis.policy import Evidence, infer_evidence


def ev(exp, ncpus=4, params=None, **summary):
    return Evidence(Path(f"/runs/{exp}"), exp, params or {"duration": 10.0}, ncpus, summary)


def test_no_evidence_names_the_experiment():
    card = infer_evidence([])
    for a in card.answers:
        assert a.label is None and a.needs, a
    assert "how-many" in card.answer("how_many").needs
    assert len(card.answers) == len(policy.QUESTIONS)


def test_unanimous_label_and_undecided_on_disagreement():
    hm = [ev("how-many", x=20, first_round_moved=5, poly_prediction=5, pairwise_prediction=10),
          ev("how-many", x=30, first_round_moved=8, poly_prediction=7.5, pairwise_prediction=15)]
    assert infer_evidence(hm).answer("how_many").label == "poly-balance"
    hm.append(ev("how-many", x=40, first_round_moved=20, poly_prediction=10,
                 pairwise_prediction=20))
    a = infer_evidence(hm).answer("how_many")
    assert a.label == policy.UNDECIDED
    assert a.agreement == {"poly-balance": 2, "pairwise": 1}


def test_how_many_on_two_cpus_says_why_not():
    hm = [ev("how-many", ncpus=2, x=20, first_round_moved=10, poly_prediction=10,
             pairwise_prediction=10)]
    a = infer_evidence(hm).answer("how_many")
    assert a.label is None
    assert "x/2" in a.why_not and "3 or more CPUs" in a.why_not


def test_affinity_thresholds_per_cpu_and_weakest_wins():
    strong = ev("single-source", migrations_after_balance_per_s=T.AFFINITY_STRONG_MAX_PER_CPU_S * 4,
                time_to_balance_s=0.2, migrations=10)
    assert infer_evidence([strong]).answer("affinity").label == "strong"
    moderate = ev("intrinsic-imbalance",
                  migrations_per_s=(T.AFFINITY_STRONG_MAX_PER_CPU_S + 0.5) * 4, share_ratio_min=0.8)
    assert infer_evidence([strong, moderate]).answer("affinity").label == "moderate"
    weak = ev("heavy-light", migrations_per_s=T.AFFINITY_WEAK_MIN_PER_CPU_S * 4)
    card = infer_evidence([strong, moderate, weak])
    assert card.answer("affinity").label == "weak"
    # a weak affinity everywhere means tasks never settle: a global queue, and the per-CPU
    # questions are not applicable
    assert card.answer("how_many").label == "global-queue"
    assert card.answer("detection").label.startswith("not applicable")


def test_never_settled_single_source_uses_whole_run_rate():
    e = ev("single-source", migrations_after_balance_per_s=None, time_to_balance_s=None,
           migrations=4000, params={"duration": 10.0})
    a = infer_evidence([e]).answer("affinity")
    assert a.label == "weak"  # 4000 / 10 s / 4 CPUs = 100 per s per CPU
    # balanced for a while, never for good: counted as such, not as "never balanced"
    e = ev("single-source", migrations_after_balance_per_s=None, time_to_balance_s=None,
           first_balanced_s=0.03, balanced_at_end=False, migrations=4, params={"duration": 10.0})
    t = infer_evidence([e]).answer("time_to_balance")
    assert t.label == "never (within the run)" and t.numbers["runs never balanced for good"] == 1


def test_work_conserving_and_detection():
    wc = [ev("work-conservation", target_idle_at_s=1.0, steal_latency_s=0.0002, stolen=True),
          ev("work-conservation", target_idle_at_s=1.2, steal_latency_s=0.0009, stolen=True)]
    assert infer_evidence(wc).answer("work_conserving").label == "yes"
    wc.append(ev("work-conservation", target_idle_at_s=1.1, steal_latency_s=None, stolen=False))
    assert infer_evidence(wc).answer("work_conserving").label == policy.UNDECIDED
    # one early run among periodic ones (a check that fell just after the cut): with 3 runs the
    # vote cannot tell (the median rule of old said periodic; issue 46: a label is decided by a
    # majority of runs at 95 %, which 2 of 3 are not), with 11 it is periodic, decided
    det = [ev("detection", interval1_ms=v, interval2_ms=64.0, interval3_ms=64.0)
           for v in (3.0, 120.0, 200.0)]
    a = infer_evidence(det).answer("detection")
    assert a.label == policy.UNDECIDED and a.confidence["label"] == "periodic"
    det += [ev("detection", interval1_ms=150.0, interval2_ms=64.0, interval3_ms=64.0)] * 8
    a = infer_evidence(det).answer("detection")
    assert a.label == "periodic (~64 ms between checks)" and a.decided
    det = [ev("detection", interval1_ms=v, interval2_ms=1.0, interval3_ms=1.0) for v in (0.2, 0.5)]
    assert infer_evidence(det).answer("detection").label == "event-driven"


def test_intrinsic_selection_priorities():
    fair = ev("intrinsic-imbalance", share_ratio_min=0.99, migrations_per_s=400)
    sticky = ev("intrinsic-imbalance", share_ratio_min=0.62, migrations_per_s=0.0)
    between = ev("intrinsic-imbalance", share_ratio_min=0.8, migrations_per_s=23)
    assert [infer_evidence([x]).answer("intrinsic").label for x in (fair, sticky, between)] == \
        ["fairness-first", "affinity-first", "in between"]
    informed = ev("heavy-light", light_duty=20, smape_short=0.05, smape_long=0.04,
                  one_heavy_one_light_fraction=0.95, migrations_per_s=0)
    blind = ev("heavy-light", light_duty=20, smape_short=0.4, smape_long=0.05,
               one_heavy_one_light_fraction=0.9, migrations_per_s=0)
    too_heavy = ev("heavy-light", light_duty=90, smape_short=0.4, smape_long=0.05,
                   one_heavy_one_light_fraction=0.9, migrations_per_s=0)
    assert infer_evidence([informed, too_heavy]).answer("selection").label == "informed"
    assert infer_evidence([blind]).answer("selection").label == "blind"
    pr = [ev("priority-classes", nice_diff=d, high_spread_index=0.0, low_cluster_index=lc)
          for d, lc in ((4, 0.0), (20, 0.6))]
    assert infer_evidence(pr).answer("priorities").label == \
        "high spread; low spread at nice diff 4, clustered at nice diff 20"
    # its per-difference medians print as the other numbers do (4 significant digits)
    pr = [ev("priority-classes", nice_diff=15, high_spread_index=0.0,
             low_cluster_index=0.08798722409700327)]
    numbers = next(ln for ln in policy.answer_lines(infer_evidence(pr).answer("priorities"))
                   if ln.startswith("numbers: "))
    assert "low_cluster_index by nice diff = {15: 0.08799}" in numbers


def test_none_metric_gives_no_label_but_is_counted():
    runs = [ev("intrinsic-imbalance", share_ratio_min=None, migrations_per_s=None),
            ev("intrinsic-imbalance", share_ratio_min=0.99, migrations_per_s=100)]
    a = infer_evidence(runs).answer("intrinsic")
    assert a.label == "fairness-first" and a.agreement == {"no_label": 1, "fairness-first": 1}


def test_collect_lists_incomplete_runs_and_skips_companions(tmp_path):
    def write(d, status, exp="intrinsic-imbalance", summary=None):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"status": status, "experiment": exp,
                                                     "params": {}, "cpus": [0, 1]}))
        if summary is not None:
            (d / "summary.json").write_text(json.dumps(summary))

    write(tmp_path / "b" / "rep-01", "complete",
          summary={"share_ratio_min": 0.99, "migrations_per_s": 1})
    write(tmp_path / "b" / "rep-01" / "static", "complete", summary={"share_ratio_min": 0.5})
    write(tmp_path / "b" / "rep-02", "incomplete")
    evidence, skipped = policy.collect([tmp_path])
    assert [e.path.name for e in evidence] == ["rep-01"]
    assert [p.name for p, _ in skipped] == ["rep-02"]
    card = policy.infer([tmp_path])
    assert "rep-02" in card.text()
    with pytest.raises(policy.store.RunError, match="no such directory"):
        policy.infer([tmp_path / "missing"])


def bootstrap_by_hand(values, level=0.95, resamples=stats.BOOTSTRAP_RESAMPLES,
                      seed=stats.BOOTSTRAP_SEED) -> tuple[float, float]:
    """The percentile bootstrap of the median as its definition reads, written here without
    stats' code: ``resamples`` resamples of len(values) indices drawn one resample at a time from
    numpy's generator seeded with ``seed``, the standard library's median of each, and the
    (1 - level)/2 and (1 + level)/2 quantiles of those medians by linear interpolation between
    order statistics (Hyndman and Fan's type 7, at h = (N - 1) q)."""
    rng = np.random.default_rng(seed)
    n = len(values)
    medians = sorted(statistics.median([values[i] for i in rng.integers(0, n, size=n)])
                     for _ in range(resamples))

    def quantile(q):
        h = (len(medians) - 1) * q
        lo = math.floor(h)
        return medians[lo] + (h - lo) * (medians[min(lo + 1, len(medians) - 1)] - medians[lo])

    a = (1 - level) / 2
    return quantile(a), quantile(1 - a)


def test_stats_describe_and_bootstrap():
    d = stats.describe([1, 2, 3, 4, None, float("nan"), 100])
    assert d["n"] == 5 and d["missing"] == 2
    assert d["median"] == 3 and d["q1"] == 2 and d["q3"] == 4 and d["iqr"] == 2
    assert (d["ci_low"], d["ci_high"]) == pytest.approx(bootstrap_by_hand([1, 2, 3, 4, 100]))
    assert stats.bootstrap_ci([5.0]) == (None, None)
    # from the binomial law, whatever the draws: a resample of 1..5 has median <= 1 when 3 or
    # more of its 5 draws are 1, P = sum_k>=3 C(5,k) 0.2^k 0.8^(5-k) = 0.058, and median <= 2
    # with P = 0.317 (p = 0.4), likewise at the top: the 95 % interval's ends (0.025, 0.975)
    # are 1 and 5, the 50 % interval's (0.25, 0.75) 2 and 4 (2000 resamples: ~116 medians of 1
    # against the 50 below the 2.5 % point; ~635 of 2 or less against 500 below the quartile)
    assert stats.bootstrap_ci([1, 2, 3, 4, 5]) == (1.0, 5.0)
    assert stats.bootstrap_ci([1, 2, 3, 4, 5], level=0.5) == (2.0, 4.0)
    # deterministic: the seed, not the call, draws the resamples; the interval is the one the
    # definition gives on those draws
    spread = [0.3, 1.1, 2.9, 3.4, 4.4, 6.0, 9.7, 12.5]
    for seed in (0, 1):
        want = bootstrap_by_hand(spread, resamples=200, seed=seed)
        assert stats.bootstrap_ci(spread, resamples=200, seed=seed) == pytest.approx(want)
        assert stats.bootstrap_ci(spread, resamples=200, seed=seed) == \
            stats.bootstrap_ci(list(spread), resamples=200, seed=seed)
    assert bootstrap_by_hand(spread, resamples=200, seed=0) != \
        bootstrap_by_hand(spread, resamples=200, seed=1)
    df = stats.df_aggregate([{"a": 1, "b": True, "c": "text"}, {"a": 3, "b": False, "c": "x"}])
    assert list(df["metric"]) == ["a", "b"]
    assert df.set_index("metric").loc["b", "mean"] == 0.5


def test_runs_on_a_busy_host_are_not_evidence(tmp_path):
    def write(d, frac):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({
            "status": "complete", "experiment": "intrinsic-imbalance", "params": {}, "cpus": [0, 1],
            "foreign_load": {"max_frac": frac, "max_cpu": 1, "top": "stress"}}))
        (d / "summary.json").write_text(json.dumps({"share_ratio_min": 0.99,
                                                    "migrations_per_s": 1}))

    write(tmp_path / "quiet", 0.02)
    write(tmp_path / "busy", 0.20)
    evidence, skipped = policy.collect([tmp_path])
    assert [e.path.name for e in evidence] == ["quiet"]
    assert [(p.name, "20.0%" in why and "stress" in why) for p, why in skipped] == [("busy", True)]
    # at the threshold a run is evidence; just above it, not
    t, margin = T.FOREIGN_LOAD_MAX, 1e-6 * T.FOREIGN_LOAD_MAX
    write(tmp_path / "at", t)
    write(tmp_path / "above", t + margin)
    evidence, skipped = policy.collect([tmp_path])
    assert sorted(e.path.name for e in evidence) == ["at", "quiet"]
    assert sorted(p.name for p, _ in skipped) == ["above", "busy"]
    assert all("limit FOREIGN_LOAD_MAX = 5%" in why for _, why in skipped)


def test_runs_whose_vcpus_waited_for_the_host_are_not_evidence(tmp_path):
    def write(d, frac, setting="accel=auto,tcg=multi,pin=off"):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({
            "status": "complete", "experiment": "intrinsic-imbalance", "params": {},
            "cpus": [0, 1, 2, 3], "foreign_load": {"max_frac": 0.0, "max_cpu": 0, "top": ""},
            "vm": {"accelerator": "tcg", "qemu_setting": setting, "vcpu_wait_max": frac,
                   "vcpu_wait_max_vcpu": 2, "vcpu_wait_frac": [0.0, 0.0, frac, 0.0]}}))
        (d / "summary.json").write_text(json.dumps({"share_ratio_min": 0.99,
                                                    "migrations_per_s": 1}))

    t, margin = T.VCPU_WAIT_MAX, 1e-6 * T.VCPU_WAIT_MAX
    write(tmp_path / "at", t)
    write(tmp_path / "above", t + margin)
    write(tmp_path / "starved", 0.5)
    # under -icount (measured unfaithful): never evidence, whatever the wait; single: the rule
    write(tmp_path / "icount", 0.0, "accel=auto,tcg=icount,pin=off")
    write(tmp_path / "single", 0.0, "accel=auto,tcg=single,pin=off")
    evidence, skipped = policy.collect([tmp_path])
    assert sorted(e.path.name for e in evidence) == ["at", "single"]
    why = dict((p.name, w) for p, w in skipped)
    assert sorted(why) == ["above", "icount", "starved"]
    assert all("vCPU 2's thread waited" in why[k] and "limit VCPU_WAIT_MAX = 5%" in why[k]
               for k in ("above", "starved"))
    assert why["icount"].startswith("captured under a virtual clock (accel=auto,tcg=icount")
    icount = json.loads((tmp_path / "icount" / "manifest.json").read_text())
    assert trust.word(trust.virtual_clock(icount)).startswith("captured under a virtual clock")
    assert trust.virtual_clock({"vm": {"accelerator": "kvm", "qemu_setting": "tcg=icount"}}) is None
    note = trust.vcpu_starved(json.loads((tmp_path / "starved" / "manifest.json").read_text()))
    assert trust.word(note).startswith("vCPU 2's thread waited for a host CPU 50.0% of the window")
    assert "(TCG, accel=auto,tcg=multi,pin=off)" in trust.word(note)
    # an older manifest of a VM that died lost the VM's facts: said so, not "(?, )"
    lost = trust.vcpu_starved({"vm": {"vcpu_wait_max": 0.5, "vcpu_wait_max_vcpu": 1}})
    assert "(the VM's accelerator and QEMU setting not recorded)" in trust.word(lost)
