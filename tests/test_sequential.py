"""The card's verdict rule (analysis/sequential.py, thresholds DECIDE_*, VARIES_*,
UNTIL_DECIDED_MAX_REPEAT): anytime-valid bounds that hold under optional stopping, checked on
many seeded Bernoulli sequences and by the exact operating characteristic; each threshold's role.
Statistics only: no runs, no timing."""

from __future__ import annotations

import math
import random

import pytest

from harmony.analysis import sequential as S
from harmony.analysis import thresholds as T

#: the thresholds these tests check (test_policy_rules.py's test_every_threshold_is_tested)
SEQUENTIAL_TESTED = {"DECIDE_LEVEL", "DECIDE_SHARE", "VARIES_SHARE", "DECIDE_PRIOR",
                     "VARIES_PRIOR", "UNTIL_DECIDED_MAX_REPEAT"}


def test_decide_share_is_the_bar_of_the_lower_bound(monkeypatch):
    v = S.verdict({"L": 6}, 2)
    assert v.state == S.DECIDED and v.lower > T.DECIDE_SHARE and v.more == 0
    assert S.verdict({"L": 5}, 2).state == S.UNDECIDED       # 2^5 = 32 < 2 / 0.05
    monkeypatch.setattr(T, "DECIDE_SHARE", v.lower + 1e-3)
    assert S.verdict({"L": 6}, 2).state == S.UNDECIDED
    monkeypatch.setattr(T, "DECIDE_SHARE", v.lower - 1e-3)
    assert S.verdict({"L": 6}, 2).state == S.DECIDED


def test_varies_share_is_the_bar_of_the_upper_bound(monkeypatch):
    v = S.verdict({"L": 3, "M": 3}, 2)
    assert v.state == S.VARIES and v.upper < T.VARIES_SHARE and v.more == 0
    assert S.verdict({"L": 3, "M": 2}, 2).state == S.UNDECIDED
    monkeypatch.setattr(T, "VARIES_SHARE", v.upper - 1e-3)
    assert S.verdict({"L": 3, "M": 3}, 2).state == S.UNDECIDED
    monkeypatch.setattr(T, "VARIES_SHARE", v.upper + 1e-3)
    assert S.verdict({"L": 3, "M": 3}, 2).state == S.VARIES


def test_decide_level_and_the_labels_set_the_runs_a_unanimous_vote_needs(monkeypatch):
    # the fewest the bound allows: 2^n >= K / alpha (thresholds' DECIDE_SHARE says why)
    assert _fewest(2) == 6 and _fewest(3) == 7
    monkeypatch.setattr(T, "DECIDE_LEVEL", 0.97)
    assert _fewest(2) == 7


def test_decide_prior_puts_the_weight_near_a_unanimous_share(monkeypatch):
    assert _fewest(2) == 6
    assert [_fewest(2, dissent=d) for d in (1, 2)] == [11, 15]   # as thresholds.py says
    monkeypatch.setattr(T, "DECIDE_PRIOR", (1.0, 1.0))
    assert _fewest(2) == 9


def test_varies_prior_bounds_the_share_where_the_mixture_reaches_one_over_alpha(monkeypatch):
    v = S.verdict({"L": 3, "M": 3}, 2)
    at = S.log_mixture(v.upper, 3, 6, T.VARIES_PRIOR)
    assert at == pytest.approx(math.log(1 / (1 - T.DECIDE_LEVEL)), abs=1e-6)
    # a mixture of other shares gives another (valid) bound: the constant is what is used
    monkeypatch.setattr(T, "VARIES_PRIOR", (5.0, 5.0))
    assert S.verdict({"L": 3, "M": 3}, 2).upper != pytest.approx(v.upper, abs=1e-3)


def _fewest(labels: int, dissent: int = 0) -> int:
    return next(n for n in range(dissent + 1, 100)
                if S.verdict({"L": n - dissent, "M": dissent}, labels).state == S.DECIDED)


def test_the_cap_settles_every_share_as_thresholds_says():
    """UNTIL_DECIDED_MAX_REPEAT's reasons, computed exactly from the quick suite's 2 runs."""
    cap = T.UNTIL_DECIDED_MAX_REPEAT
    oc = {p: S.operating_characteristic(p, 2, cap) for p in (1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5)}
    assert oc[1.0]["decided L"] == 1.0 and oc[1.0]["runs"] == 6.0
    assert oc[0.95]["decided L"] >= 0.98 and oc[0.9]["decided L"] >= 0.9
    coin = oc[0.5]
    assert coin["varies"] >= 0.95 and coin["decided L"] + coin["decided other"] <= 0.05
    assert all(1 - o["undecided"] >= 0.93 for o in oc.values())
    assert all(o["decided other"] <= 1 - T.DECIDE_LEVEL for o in oc.values())
    assert all(6 <= o["runs"] <= 11.5 for o in oc.values())
    # a smaller cap leaves more undecided, never changes what the rule decides
    small = S.operating_characteristic(0.8, 2, 16)
    assert small["undecided"] > oc[0.8]["undecided"]


@pytest.mark.parametrize("share", [0.2, 0.5, 0.7, 0.95])
def test_the_bounds_hold_at_every_number_of_runs(share):
    """Optional stopping: over 1000 seeded sequences of 60 runs, the true share falls outside
    the bounds at ANY number of runs (what a loop that stops when it likes could hit) at most
    as often as their levels allow: alpha / 2 below (the lower bound over 2 labels), alpha
    above."""
    rng = random.Random(46)
    below = above = 0
    a_lo, a_hi = S.alpha_decide(2), S.alpha_varies()
    for _ in range(1000):
        k, lo_missed, hi_missed = 0, False, False
        for n in range(1, 61):
            k += rng.random() < share
            lo_missed = lo_missed or (k / n > share and S.excluded(share, k, n, a_lo,
                                                                   T.DECIDE_PRIOR))
            hi_missed = hi_missed or (k / n < share and S.excluded(share, k, n, a_hi,
                                                                   T.VARIES_PRIOR))
        below += lo_missed
        above += hi_missed
    assert below / 1000 <= a_lo and above / 1000 <= a_hi


def test_bounds_are_the_edges_of_what_the_mixture_keeps():
    lo, hi = S.lower_bound(8, 10, 0.025), S.upper_bound(8, 10, 0.05)
    assert 0 < lo < 0.8 < hi < 1
    assert S.excluded(lo - 1e-6, 8, 10, 0.025, T.DECIDE_PRIOR)
    assert not S.excluded(lo + 1e-6, 8, 10, 0.025, T.DECIDE_PRIOR)
    assert S.excluded(hi + 1e-6, 8, 10, 0.05, T.VARIES_PRIOR)
    assert not S.excluded(hi - 1e-6, 8, 10, 0.05, T.VARIES_PRIOR)
    # more runs at the same share: narrower
    assert S.lower_bound(80, 100, 0.025) > lo and S.upper_bound(80, 100, 0.05) < hi
    assert (S.lower_bound(0, 5, 0.05), S.upper_bound(5, 5, 0.05)) == (0.0, 1.0)


def test_runs_to_settle_is_the_fewest_that_could():
    v = S.verdict({"L": 2}, 2)
    assert v.state == S.UNDECIDED and v.more == 4
    assert S.verdict({"L": 2 + v.more - 1}, 2).state == S.UNDECIDED
    assert S.verdict({"L": 2 + v.more}, 2).state == S.DECIDED
    # a split heads for "varies" sooner than for a label
    v = S.verdict({"L": 2, "M": 1}, 2)
    assert v.more == 3 and S.verdict({"L": 3, "M": 3}, 2).state == S.VARIES
    # no runs with a label: one run could start it
    assert S.verdict({}, 2).more == 1


def test_the_leading_label_and_its_text():
    v = S.verdict({"blind": 5, "informed": 6, "x": 0}, 2)
    assert (v.label, v.votes, v.runs, v.state) == ("informed", 6, 11, S.VARIES)
    assert v.text().startswith("varies at 95%: no label in 95% of the runs; informed in 6 of 11")
    d = S.verdict({"fast": 7}, 3).to_dict()
    assert d["state"] == "decided" and d["share"] == 1.0 and d["level"] == T.DECIDE_LEVEL
    assert S.verdict({"fast": 7}, 3).text().startswith("decided at 95%: fast in 7 of 7 runs")
    assert "4 more runs could settle it" in S.verdict({"a": 2}, 2).text()
