"""A question whose runs come from several configurations (issue 46): the card votes them pooled
and each configuration apart (analysis/sequential.py's by_configuration, analysis/policy.py's
_vote); where the pooled vote is undecided and every configuration's own vote is settled, those
answer. Synthetic evidence; each expectation set against the verdicts of the counts read by hand
(sequential.verdict), never against what the card printed before."""

from __future__ import annotations

import json
from pathlib import Path

from harmony.analysis import compare, policy, report_suite
from harmony.analysis import sequential as S
from harmony.analysis import thresholds as T
from harmony.analysis.policy import Evidence, infer_evidence
from harmony.experiments import get_experiment

CPUS = [0, 1, 2, 3]
SPREAD, CLUSTERED = 0.0, T.SPREAD_MAX_INDEX + 1.0


def prio(nice_diff: int, index: float, k: int) -> Evidence:
    params = {"duration": 3.0, "nice_diff": nice_diff, "high_nice": 0}
    return Evidence(Path(f"/s/priority-classes-nice_diff={nice_diff}/rep-{k:02d}"),
                    "priority-classes", params, 4,
                    {"nice_diff": nice_diff, "high_spread_index": index, "low_cluster_index": 0.0})


def runs(nice_diff: int, *counts: tuple[float, int]) -> list[Evidence]:
    out = []
    for index, n in counts:
        out += [prio(nice_diff, index, len(out) + 1) for _ in range(n)]
    return out


def test_scx_simple_priorities_vary_by_configuration():
    """scx_simple's suite run until decided (bench/README.md): nice diff 15 decided high spread
    6/6, nice diff 4 varies (high clustered 4 of 8); pooled, 10 of 14 is undecided."""
    assert S.verdict({"high spread": 10, "high clustered": 4}, 2).state == S.UNDECIDED
    assert S.verdict({"high spread": 6}, 2).state == S.DECIDED
    assert S.verdict({"high clustered": 4, "high spread": 4}, 2).state == S.VARIES
    ev = runs(15, (SPREAD, 6)) + runs(4, (CLUSTERED, 4), (SPREAD, 4))
    a = infer_evidence(ev).answer("priorities")
    assert a.label == ("varies (by configuration: nice_diff=15: high spread 6/6; "
                       "nice_diff=4: varies, high clustered 4/8)")
    assert a.state == S.VARIES and not a.decided and not a.labelled
    c = a.confidence
    assert c["path"] == S.PER_CONFIGURATION and c["more"] == 0
    assert (c["label"], c["votes"], c["runs"]) == ("high spread", 10, 14)    # the pooled vote
    assert {k: (v["state"], v["label"], v["votes"], v["runs"])
            for k, v in c["configurations"].items()} == {
        "nice_diff=15": (S.DECIDED, "high spread", 6, 6),
        "nice_diff=4": (S.VARIES, "high clustered", 4, 8)}
    # what reads the answer sees a varies answer, saying why
    assert policy.is_varies(a.label) and compare.label_kind(a.label) == "varies"
    assert policy.answer_kind(a) == "varies"
    text = policy.confidence_text(a)
    assert text.startswith("varies at 95% by configuration (high spread in 10 of 14 runs "
                           "pooled, undecided): nice_diff=15: decided at 95%"), text
    assert "nice_diff=4: varies at 95%" in text
    assert report_suite.confidence_cell(a) == "varies at 95% by configuration (2 configurations)"
    json.dumps(a.to_dict())


def test_configurations_decided_on_one_label_are_decided():
    """Both nice diffs decided high spread: so is the card (pooled: 12 of 12 is decided too, and
    stands; the configurations' verdicts are kept beside it)."""
    a = infer_evidence(runs(15, (SPREAD, 6)) + runs(4, (SPREAD, 6))).answer("priorities")
    assert a.decided and a.label.startswith("high spread")
    assert a.confidence["path"] == S.POOLED
    assert [v["state"] for v in a.confidence["configurations"].values()] == [S.DECIDED] * 2


def test_the_per_configuration_rule():
    """by_configuration on verdicts of known counts: every configuration decided one label:
    decided; decided on different labels: varies; one undecided: the pooled verdict stands."""
    undecided = S.verdict({"L": 10, "M": 4}, 2)
    assert undecided.state == S.UNDECIDED
    six_l, six_m = S.verdict({"L": 6}, 2), S.verdict({"M": 6}, 2)
    assert S.by_configuration(undecided, {"a": six_l, "b": six_l}) == \
        (S.DECIDED, S.PER_CONFIGURATION)
    assert S.by_configuration(undecided, {"a": six_l, "b": six_m}) == \
        (S.VARIES, S.PER_CONFIGURATION)
    assert S.by_configuration(undecided, {"a": six_l, "b": S.verdict({"L": 3, "M": 1}, 2)}) == \
        (S.UNDECIDED, S.POOLED)
    assert S.by_configuration(undecided, {"a": six_l}) == (S.UNDECIDED, S.POOLED)
    settled = S.verdict({"L": 3, "M": 3}, 2)
    assert settled.state == S.VARIES
    assert S.by_configuration(settled, {"a": six_l, "b": six_l}) == (S.VARIES, S.POOLED)


def test_one_configuration_undecided_leaves_the_card_undecided():
    """nice diff 4 at 3 of 5 (undecided) beside nice diff 15 decided: the pooled 9 of 11 is
    undecided, and so is the card."""
    assert S.verdict({"high spread": 3, "high clustered": 2}, 2).state == S.UNDECIDED
    assert S.verdict({"high spread": 9, "high clustered": 2}, 2).state == S.UNDECIDED
    ev = runs(15, (SPREAD, 6)) + runs(4, (SPREAD, 3), (CLUSTERED, 2))
    a = infer_evidence(ev).answer("priorities")
    assert a.label == policy.UNDECIDED and a.state == S.UNDECIDED
    assert a.confidence["path"] == S.POOLED and a.confidence["more"] > 0
    assert a.confidence["configurations"]["nice_diff=4"]["state"] == S.UNDECIDED


def test_a_single_configuration_votes_as_it_always_did():
    """One configuration's runs (and runs whose only difference is a parameter drawn per run,
    detection's cut time): the pooled vote alone, no configurations recorded."""
    ev = runs(4, (CLUSTERED, 4), (SPREAD, 4))
    a = infer_evidence(ev).answer("priorities")
    assert a.label == "varies (high clustered 4, high spread 4 of 8 runs)"
    assert a.confidence["path"] == S.POOLED and "configurations" not in a.confidence
    params = get_experiment("detection").resolve({}, CPUS)
    det = [Evidence(Path(f"/s/detection/rep-{k}"), "detection", params | {"cut_at_s": 0.5 + k / 10},
                    4, {"interval1_ms": 100.0, "interval2_ms": 64.0, "interval3_ms": 64.0})
           for k in range(4)]
    assert policy.configuration_of(det[0]) == policy.configuration_of(det[1])
    d = infer_evidence(det).answer("detection")
    assert d.state == S.UNDECIDED and "configurations" not in d.confidence


def test_configurations_of_different_experiments_are_named_by_them():
    """time to balance pools single-source and time-to-resolve: each is a configuration, named by
    its experiment."""
    ss = [Evidence(Path(f"/s/single-source/rep-{k}"), "single-source", {"duration": 2.0}, 4,
                   {"time_to_balance_s": 0.1, "time_to_settle_s": 0.1}) for k in range(7)]
    ttr = [Evidence(Path(f"/s/time-to-resolve/rep-{k}"), "time-to-resolve", {"duration": 3.0}, 4,
                    {"time_to_balance_s": t, "time_to_settle_s": t})
           for k, t in enumerate([0.1, 5.0] * 3)]
    a = infer_evidence(ss + ttr).answer("time_to_balance")
    assert S.verdict({"fast": 10, "slow": 3}, 3).state == S.UNDECIDED
    assert S.verdict({"fast": 7}, 3).state == S.DECIDED
    assert S.verdict({"fast": 3, "slow": 3}, 3).state == S.VARIES
    assert list(a.confidence["configurations"]) == ["time-to-resolve", "single-source"]
    assert a.label == ("varies (by configuration: time-to-resolve: varies, fast 3/6; "
                       "single-source: fast 7/7)")
