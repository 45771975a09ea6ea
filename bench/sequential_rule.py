"""How the card's verdict rule behaves when runs are added until a question is decided.

``harmony suite --until-decided`` adds runs to a configuration until each of its questions is
decided or varies (:mod:`harmony.analysis.sequential`, thresholds ``DECIDE_*``, ``VARIES_*``,
``UNTIL_DECIDED_MAX_REPEAT``). This prints, computed exactly over every path of runs (no sampling,
no timing, no root):

- the fewest runs that decide a vote: all agreeing, one or two dissenting, over 2 and 3 labels;
  and the runs a coin flip's even split needs to be shown to vary;
- the operating characteristic: for a policy whose runs give label L with probability p (another
  label otherwise), starting from ``--start`` runs and adding one at a time up to each cap in
  ``--caps``: how often it ends decided L, decided the other label, varies or undecided, and the
  expected number of runs;
- why the bounds must hold at every number of runs: a coin flip checked after every run from
  ``--start`` to the largest cap with a fixed-n 95 % Clopper-Pearson lower bound against the
  same check with the anytime-valid bound: how often either ever shows a "majority".

Targets: a decided label is wrong at most 1 - DECIDE_LEVEL of the time (the coin flip's "decided"
ends, and the other label's for the other shares); at the default cap every share ends decided or
varies at least 90 % of the time.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.analysis import sequential as S  # noqa: E402
from harmony.analysis import thresholds as T  # noqa: E402

SHARES = (1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5)


def fewest_runs(labels: int, dissent: int, limit: int = 200) -> int | None:
    """The fewest runs that decide a vote with ``dissent`` runs against the leading label."""
    for n in range(dissent + 1, limit):
        if S.verdict({"L": n - dissent, "M": dissent}, labels).state == S.DECIDED:
            return n
    return None


def coin_varies(limit: int = 200) -> dict:
    """For each lead of a two-label vote, the fewest runs at which that lead varies."""
    out = {}
    for n in range(2, limit):
        lead = (n + 1) // 2
        if S.verdict({"L": lead, "M": n - lead}, 2).state == S.VARIES and "even" not in out:
            out["even"] = n
        for extra in (1, 2):
            key = f"lead +{extra}"
            if key not in out and n - lead - extra >= 0 and \
                    S.verdict({"L": lead + extra, "M": n - lead - extra}, 2).state == S.VARIES:
                out[key] = n
    return out


def cp_lower(k: int, n: int, alpha: float) -> float:
    """The one-sided Clopper-Pearson lower bound: the share p with P(X >= k | n, p) = alpha."""
    if k == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        tail = sum(math.comb(n, j) * mid ** j * (1 - mid) ** (n - j) for j in range(k, n + 1))
        lo, hi = (mid, hi) if tail < alpha else (lo, mid)
    return lo


def ever_majority(start: int, cap: int, anytime: bool) -> float:
    """P(a coin flip's vote, checked after each run from ``start`` to ``cap``, ever shows a
    label's lower bound above one half): with the fixed-n bound or the anytime-valid one."""
    alpha = 1 - T.DECIDE_LEVEL

    def majority(k, n):
        lead = max(k, n - k)
        if anytime:
            return S._state(lead, n, 2) == S.DECIDED
        return cp_lower(lead, n, alpha / 2) > T.DECIDE_SHARE

    paths = {k: math.comb(start, k) / 2 ** start for k in range(start + 1)}
    hit, n = 0.0, start
    while paths and n <= cap:
        later: dict[int, float] = {}
        for k, prob in paths.items():
            if majority(k, n):
                hit += prob
            elif n < cap:
                for j in (0, 1):
                    later[k + j] = later.get(k + j, 0.0) + prob / 2
        paths, n = later, n + 1
    return hit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=2, help="planned runs before any is added")
    ap.add_argument("--caps", default=f"12,16,{T.UNTIL_DECIDED_MAX_REPEAT},24",
                    help="caps on the runs, comma-separated")
    ap.add_argument("--labels", type=int, default=2, help="labels the question can give")
    ap.add_argument("--json", help="write the results as JSON (- = stdout)")
    args = ap.parse_args()
    caps = common.sizes(ap, args.caps, 1)
    if args.start < 1 or min(caps) < args.start or args.labels < 2:
        ap.error("--start must be >= 1 and <= every cap, --labels >= 2")
    res: dict = {"fewest": {}, "coin": coin_varies(), "oc": [], "peeking": {}}
    print("fewest runs to decide (all agree / one against / two against):")
    for k in (2, 3):
        res["fewest"][k] = [fewest_runs(k, d) for d in (0, 1, 2)]
        print(f"  {k} labels: " + " / ".join(map(str, res["fewest"][k])))
    print("a two-label vote varies at: " + ", ".join(f"{k}: {v} runs"
                                                     for k, v in res["coin"].items()))
    print(f"\noperating characteristic, {args.labels} labels, from {args.start} runs, one at a "
          "time (exact):")
    rows = []
    for cap in caps:
        for p in SHARES:
            oc = S.operating_characteristic(p, args.start, cap, args.labels)
            res["oc"].append({"cap": cap, "share": p, **oc})
            settled = oc["decided L"] + oc["decided other"] + oc["varies"]
            rows.append([cap, p, oc["decided L"], oc["decided other"], oc["varies"],
                         oc["undecided"], settled, oc["runs"]])
    common.table(["cap", "share", "decided L", "decided other", "varies", "undecided",
                  "settled", "mean runs"], rows)
    top = max(caps)
    for anytime in (False, True):
        res["peeking"]["anytime" if anytime else "fixed-n"] = ever_majority(args.start, top,
                                                                            anytime)
    print(f"\na coin flip checked after every run from {args.start} to {top}, ever a majority "
          f"at 95 %: fixed-n Clopper-Pearson {res['peeking']['fixed-n']:.1%}, anytime-valid "
          f"{res['peeking']['anytime']:.1%}")
    default = [r for r in res["oc"] if r["cap"] == T.UNTIL_DECIDED_MAX_REPEAT]
    if default:
        wrong = max(r["decided other"] + (r["decided L"] if r["share"] == 0.5 else 0.0)
                    for r in default)
        settled = min(1 - r["undecided"] for r in default)
        print(common.verdict("a decided label is wrong at most 5 % of the time", wrong <= 0.05,
                             f"worst {wrong:.1%} at cap {T.UNTIL_DECIDED_MAX_REPEAT}"))
        print(common.verdict("every share settled >= 90 % of the time at the default cap",
                             settled >= 0.9, f"worst {settled:.1%}"))
    common.emit_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
