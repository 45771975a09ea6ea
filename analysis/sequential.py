"""How sure a vote of runs is: anytime-valid bounds on the share of runs that give a label, and
the card's verdict on a question from its runs' labels (``decided``, ``varies`` or ``undecided``).

Each run of an experiment votes one label (or none) for a question of the policy card
(:mod:`harmony.analysis.policy`). The runs are independent draws of the policy's behaviour, so
the runs that give label L are a Bernoulli sample of its *share* p_L, the chance that a run gives
L. The card says

- **decided L** when L's share exceeds one half (``thresholds.DECIDE_SHARE``): L is what the
  policy does in most runs, at ``thresholds.DECIDE_LEVEL`` (95 %);
- **varies** when no label's share reaches ``thresholds.VARIES_SHARE`` (95 %): the policy gives
  different labels in different runs -- itself an answer, with the split;
- **undecided** otherwise: too few runs to tell either way.

Why these bounds: ``harmony suite --until-decided`` adds runs to a configuration until its
questions are decided, so the number of runs depends on what the runs said. A fixed-n interval
(Clopper-Pearson, a bootstrap) looked at after every run and acted on when it first excludes
one half is wrong far more often than its level says. The bounds here are *confidence sequences*
(Robbins 1970; Howard, Ramdas et al. 2021): they hold at every number of runs at once, so they
hold at whatever number of runs the loop stopped. For each share p the beta-binomial mixture

    M_n(p) = B(a + k, b + n - k) / B(a, b) / (p^k (1 - p)^(n - k))        (k of n runs gave L)

is the likelihood ratio of a Beta(a, b) mixture of shares against p: a non-negative martingale
with mean 1 while p is the true share, so by Ville's inequality it ever reaches 1/alpha with
probability alpha at most. The shares it has not excluded, {p : M_n(p) < 1/alpha}, are a
confidence sequence at level 1 - alpha. Each bound uses its own mixture (``thresholds.
DECIDE_PRIOR`` for the lower bound, ``VARIES_PRIOR`` for the upper), each a one-sided bound at
its level. The lower bound is taken at alpha / K over the K labels a question can give
(Bonferroni: at most one wrong label is decided, over all of them, with probability alpha);
the upper bound at alpha (at most one label can have a share of VARIES_SHARE or more).

A question whose runs come from several *configurations* (priority-classes at two nice
differences, heavy-light at two light duties: the suite's batches, each grown by ``--until-
decided`` until its own vote is settled) is voted twice: the runs pooled (as above), and each
configuration apart (:func:`by_configuration`). The pooled verdict stands when it is settled; when
it is undecided and every configuration's own verdict is settled, those answer the question:

- **decided L** when every configuration decided the same L. An intersection-union test (Berger
  1982): "L in most runs of every configuration" is wrong only if L is not the majority of some
  configuration c, and c decided L all the same: for each label L at most (1 - DECIDE_LEVEL) / K
  (c's own Bonferroni share), so over the K labels at most 1 - DECIDE_LEVEL, whatever the
  number of configurations. Each bound holds at every number of runs, so at whatever run each
  configuration's loop stopped.
- **varies by configuration** otherwise (some configuration varies, or two decided different
  labels): the policy's runs do not all give one label, and the card lists each configuration's
  answer. It is wrong only if some configuration's verdict is: at most 1 - DECIDE_LEVEL when it
  rests on one configuration that varies, and at most C (K - 1) / K (1 - DECIDE_LEVEL) when it
  rests on C configurations decided on different labels (1 - DECIDE_LEVEL for two of a two-label
  question: the priorities' and selection's case).

Pooling runs of different configurations is a vote over a mixture whose weights are how many runs
each configuration happened to get (the loop gives more to the one that is slow to settle), not
draws of one share; the pooled verdict is kept where it is settled because it is the card's
answer as it always was, and the per-configuration verdicts, always recorded beside it, show
what it is made of.

:func:`verdict` gives a question's :class:`Verdict` from its votes; :func:`operating_
characteristic` computes exactly, for a policy whose runs give one of two labels at a known
share, how a vote grown one run at a time from ``start`` to ``cap`` runs ends (what
``bench/sequential_rule.py`` prints, and ``thresholds.UNTIL_DECIDED_MAX_REPEAT`` rests on).
"""

from __future__ import annotations

import dataclasses
import math

from harmony.analysis import thresholds as T
from harmony.core.wording import plural

DECIDED, VARIES, UNDECIDED = "decided", "varies", "undecided"


def _log_beta(x: float, y: float) -> float:
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


def log_mixture(p: float, k: int, n: int, prior: tuple[float, float]) -> float:
    """log M_n(p): the beta-binomial mixture's evidence against share ``p`` after ``k`` of ``n``
    runs gave the label (see the module's docstring)."""
    a, b = prior
    f = n - k
    if (k and p <= 0.0) or (f and p >= 1.0):
        return math.inf
    like = (k * math.log(p) if k else 0.0) + (f * math.log1p(-p) if f else 0.0)
    return _log_beta(a + k, b + f) - _log_beta(a, b) - like


def excluded(p: float, k: int, n: int, alpha: float, prior: tuple[float, float]) -> bool:
    """Whether share ``p`` is outside the confidence sequence at level 1 - ``alpha``."""
    return log_mixture(p, k, n, prior) >= math.log(1.0 / alpha)


def lower_bound(k: int, n: int, alpha: float, prior=None) -> float:
    """The anytime-valid lower bound of the share, after ``k`` of ``n`` runs: the smallest share
    the confidence sequence keeps (0 without runs or votes)."""
    prior = prior or T.DECIDE_PRIOR
    if n <= 0 or k <= 0:
        return 0.0
    lo, hi = 0.0, k / n      # M is infinite at 0 and below 1/alpha at the observed share
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excluded(mid, k, n, alpha, prior) else (lo, mid)
    return hi


def upper_bound(k: int, n: int, alpha: float, prior=None) -> float:
    """The anytime-valid upper bound of the share, after ``k`` of ``n`` runs (1 without runs,
    or when every run gave the label)."""
    prior = prior or T.VARIES_PRIOR
    if n <= 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excluded(mid, k, n, alpha, prior) else (mid, hi)
    return lo


def alpha_decide(labels: int) -> float:
    """The level of each label's lower bound: 1 - DECIDE_LEVEL shared by the question's
    ``labels`` possible labels (Bonferroni)."""
    return (1.0 - T.DECIDE_LEVEL) / max(1, labels)


def alpha_varies() -> float:
    return 1.0 - T.DECIDE_LEVEL


def _state(lead: int, n: int, labels: int) -> str:
    """The verdict of a vote whose most frequent label has ``lead`` of ``n`` runs."""
    if n <= 0:
        return UNDECIDED
    if lead / n > T.DECIDE_SHARE and excluded(T.DECIDE_SHARE, lead, n, alpha_decide(labels),
                                              T.DECIDE_PRIOR):
        return DECIDED
    if lead / n < T.VARIES_SHARE and excluded(T.VARIES_SHARE, lead, n, alpha_varies(),
                                              T.VARIES_PRIOR):
        return VARIES
    return UNDECIDED


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A question's verdict from its runs' labels (:func:`verdict`)."""

    state: str          # "decided", "varies" or "undecided"
    label: str | None   # the label most runs gave (the first given, on a tie); None without runs
    votes: int          # runs that gave it
    runs: int           # runs that gave a label (runs without one are not counted)
    lower: float        # anytime-valid lower bound of its share, at alpha / labels
    upper: float        # anytime-valid upper bound of its share, at alpha
    labels: int         # the labels the question can give (the lower bound's Bonferroni K)
    more: int           # fewest further runs after which the verdict could be settled (0: it is)
    split: dict = dataclasses.field(default_factory=dict)   # label -> runs, most first

    @property
    def share(self) -> float | None:
        return self.votes / self.runs if self.runs else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"share": self.share, "level": T.DECIDE_LEVEL,
                                           "rule": RULE}

    def text(self) -> str:
        """One line: the verdict, the votes and the bounds, and how many runs would settle it."""
        if not self.runs:
            return "no run gave a label"
        votes = f"{self.label} in {self.votes} of {self.runs} runs ({self.share:.0%}"
        bounds = (f"; at least {self.lower:.0%}, at most {self.upper:.0%} at "
                  f"{T.DECIDE_LEVEL:.0%}, anytime-valid)")
        if self.state == DECIDED:
            return f"decided at {T.DECIDE_LEVEL:.0%}: {votes}{bounds}"
        if self.state == VARIES:
            return (f"varies at {T.DECIDE_LEVEL:.0%}: no label in {T.VARIES_SHARE:.0%} of the "
                    f"runs; {votes}{bounds}")
        return (f"undecided: {votes}{bounds}; {plural(self.more, 'more run')}"
                " could settle it")


#: the rule in a few words, as the card's JSON states it
RULE = (f"decided: the label's share of runs > {T.DECIDE_SHARE:g} (lower bound); varies: every "
        f"label's share < {T.VARIES_SHARE:g} (upper bound); anytime-valid beta-binomial "
        f"confidence sequences at {T.DECIDE_LEVEL:g}")


def verdict(votes: dict, labels: int) -> Verdict:
    """The verdict of a question from ``votes`` (label -> runs that gave it; runs without a label
    are left out before), for a question that can give ``labels`` labels."""
    votes = {k: v for k, v in votes.items() if v > 0}
    n = sum(votes.values())
    if not n:
        return Verdict(UNDECIDED, None, 0, 0, 0.0, 1.0, labels, 1)
    label = max(votes, key=lambda lab: votes[lab])     # first of equals: dicts keep their order
    k = votes[label]
    state = _state(k, n, labels)
    split = dict(sorted(votes.items(), key=lambda kv: -kv[1]))
    return Verdict(state, label, k, n, lower_bound(k, n, alpha_decide(labels)),
                   upper_bound(k, n, alpha_varies()), labels,
                   0 if state != UNDECIDED else runs_to_settle(list(votes.values()), labels),
                   split)


def runs_to_settle(counts: list[int], labels: int, limit: int = 1000) -> int:
    """The fewest further runs after which a vote of ``counts`` (runs per label) could be decided
    or varies: every further run for the leading label, or each to the label with fewest votes
    (of the question's ``labels``), whichever settles it sooner. Adding this many runs before
    looking again is as valid as looking after each: the bounds hold at every number of runs."""
    counts = sorted(counts, reverse=True) + [0] * max(0, labels - len(counts))
    n = sum(counts)
    spread = list(counts)
    for m in range(1, limit + 1):
        if _state(counts[0] + m, n + m, labels) == DECIDED:
            return m
        spread[spread.index(min(spread))] += 1   # the run that keeps the largest share lowest
        if _state(max(spread), n + m, labels) == VARIES:
            return m
    return limit


def runs_at_this_split(counts: list[int], labels: int, limit: int = 1000) -> int:
    """The further runs after which a vote of ``counts`` (runs per label) would be settled if
    they split as these did (a unanimous vote: the runs that decide it; an even one: those that
    show it varies); at least :func:`runs_to_settle`'s. What ``--until-decided`` adds in one
    round: fewer rounds than one run at a time, each as valid."""
    counts = sorted(counts, reverse=True)
    n, k = sum(counts), counts[0]
    least = runs_to_settle(counts, labels, limit)
    for m in range(least, limit + 1):
        if _state(k + round(m * k / n), n + m, labels) != UNDECIDED:
            return m
    return limit


def operating_characteristic(share: float, start: int, cap: int, labels: int = 2,
                             step: int = 1) -> dict:
    """How a vote ends for a policy whose runs give label L with probability ``share`` and
    another label otherwise, exactly (every path of runs, no sampling): ``start`` runs, then
    ``step`` more at a time while undecided, up to ``cap`` runs in all. Returns the
    probabilities of each end ("decided L", "decided other", "varies", "undecided") and the
    expected number of runs ("runs")."""
    out = {"decided L": 0.0, "decided other": 0.0, "varies": 0.0, "undecided": 0.0, "runs": 0.0}
    n = min(start, cap)
    paths = {k: math.comb(n, k) * share ** k * (1 - share) ** (n - k) for k in range(n + 1)}
    while paths:
        later: dict[int, float] = {}
        for k, prob in paths.items():
            state = _state(max(k, n - k), n, labels)
            if state == UNDECIDED and n < cap:
                m = min(step, cap - n)
                for j in range(m + 1):
                    later[k + j] = later.get(k + j, 0.0) + prob * math.comb(m, j) * \
                        share ** j * (1 - share) ** (m - j)
                continue
            key = ("decided L" if k > n - k else "decided other") if state == DECIDED else state
            out[key] += prob
            out["runs"] += prob * n
        n = min(n + step, cap) if later else n
        paths = later
    return out


#: how a question's verdict was reached (:func:`by_configuration`): its runs pooled into one vote,
#: or each configuration's own vote
POOLED, PER_CONFIGURATION = "pooled", "per configuration"


def by_configuration(pooled: Verdict, configs: dict[str, Verdict]) -> tuple[str, str | None]:
    """The state of a question whose runs come from ``configs`` (name -> that configuration's own
    verdict), given the verdict of its runs ``pooled``, and how it was reached: (state, path)
    where path is :data:`POOLED` or :data:`PER_CONFIGURATION` (see the module's docstring). The
    pooled verdict stands when it is settled, or with fewer than two configurations, or while a
    configuration is undecided; else every configuration decided the same label: decided; else
    varies (by configuration)."""
    if pooled.state != UNDECIDED or len(configs) < 2 or \
            any(v.state == UNDECIDED for v in configs.values()):
        return pooled.state, POOLED
    labels = {v.label for v in configs.values()}
    if all(v.state == DECIDED for v in configs.values()) and len(labels) == 1:
        return DECIDED, PER_CONFIGURATION
    return VARIES, PER_CONFIGURATION
