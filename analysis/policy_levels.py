"""The policy card by level: the questions whose answers depend on where the source and target
CPUs sit, answered level by level, and the kernel design's predictions checked over the runs.

A run placed at a level (``-p level=smt|llc|package|node|remote``,
:mod:`harmony.experiments.placement`) is evidence for that level only; a run on a CPU set as
given is evidence for the card's own answers, and its moves by relation
(``moves_by_relation``, :mod:`harmony.analysis.levels`) give the affinity at each level. The
rules are the card's own (:data:`harmony.analysis.policy.RULES`, unanimous or undecided),
applied to each level's runs apart: this module groups and words, it decides nothing else.

Used by :mod:`harmony.analysis.policy` (never the other way round): ``infer_evidence`` hands its
own rules in as a function.
"""

from __future__ import annotations

import collections
import statistics

from harmony.analysis import thresholds as T
from harmony.analysis.predictions import ROW_KEYS, scale_checkable, scale_holds
from harmony.analysis.topology import RELATIONS
from harmony.experiments import summary_key

#: the questions answered per level: those whose answer depends on the distance between the
#: CPUs (issue 45: time to balance, detection, how many, work conservation, affinity), and
#: whether it balances at all
LEVEL_QUESTIONS = ("balances", "affinity", "how_many", "time_to_balance", "work_conserving",
                   "detection")
#: the levels, nearest first
LEVEL_ORDER = RELATIONS[1:]
MOVES_BY_RELATION = summary_key("moves_by_relation", "single-source")
PREDICTIONS = summary_key("predictions", "single-source")
INTERVAL1_MS = summary_key("interval1_ms", "detection")
FIRST_ROUND_MOVED = summary_key("first_round_moved", "how-many")
X = summary_key("x", "how-many")
#: where the card reads the affinity at each level from: runs on a whole CPU set whose tasks
#: keep moving once balanced, as for the card's own affinity answer
AFFINITY_EXPERIMENTS = ("single-source", "intrinsic-imbalance", "heavy-light")


def level_of(e) -> str:
    """The level a run was placed at ("" for a CPU set as given)."""
    return (e.params or {}).get("level") or ""


def split(evidence: list) -> tuple[list, dict[str, list]]:
    """(the runs on CPU sets as given, {level: the runs placed there}, levels nearest first)."""
    whole = [e for e in evidence if not level_of(e)]
    placed: dict[str, list] = {}
    for e in evidence:
        if level_of(e):
            placed.setdefault(level_of(e), []).append(e)
    return whole, {lv: placed[lv] for lv in sorted(placed, key=_order)}


def _order(level: str) -> int:
    return LEVEL_ORDER.index(level) if level in LEVEL_ORDER else len(LEVEL_ORDER)


def level_answers(placed: dict[str, list], whole: list, infer, answer, affinity_label) -> dict:
    """{level: {qid: Answer}}: the card's rules (``infer``: evidence -> Card) on each level's
    runs, the questions of :data:`LEVEL_QUESTIONS` with an answer; the affinity at each level
    from the whole-set runs' moves (:func:`affinity_by_relation`, with the card's ``answer``
    class and ``affinity_label`` rule) where no placed run gives it."""
    out: dict[str, dict] = {}
    for level, runs in placed.items():
        card = infer(runs)
        out[level] = {a.qid: a for a in card.answers
                      if a.qid in LEVEL_QUESTIONS and (a.label is not None or a.why_not)}
    for level, a in affinity_by_relation(whole, answer, affinity_label).items():
        out.setdefault(level, {}).setdefault("affinity", a)
    return {lv: out[lv] for lv in sorted(out, key=_order)}


def affinity_by_relation(whole: list, answer, affinity_label) -> dict:
    """{relation: ``answer``}: the moves per second and per CPU between CPUs at each relation,
    in the runs on whole CPU sets of :data:`AFFINITY_EXPERIMENTS`, labelled by the card's own
    affinity rule (``affinity_label``: rate per CPU -> label), with the locality index (their
    share of the moves over the share of the CPU pairs at that relation: 1 for a policy blind
    to the machine's shape)."""
    rates: dict[str, list] = collections.defaultdict(list)
    locality: dict[str, list] = collections.defaultdict(list)
    paths: dict[str, list] = collections.defaultdict(list)
    for e in whole:
        if e.experiment not in AFFINITY_EXPERIMENTS or not e.ncpus:
            continue
        for rel, v in (e.summary.get(MOVES_BY_RELATION) or {}).items():
            rates[rel].append(v["per_s"] / e.ncpus)
            paths[rel].append(e.path)
            if v.get("locality") is not None:
                locality[rel].append(v["locality"])
    out = {}
    for rel in sorted(rates, key=_order):
        a = answer("affinity", "Does it keep tasks near? (moves per s and CPU at this level)",
                   "6.2, at each level")
        med = statistics.median(rates[rel])
        a.label = affinity_label(med)
        a.numbers = {"moves per s and CPU (median)": med,
                     "locality (median)": statistics.median(locality[rel])
                     if locality[rel] else None, "runs": len(rates[rel])}
        a.thresholds = {"AFFINITY_STRONG_MAX_PER_CPU_S": T.AFFINITY_STRONG_MAX_PER_CPU_S,
                        "AFFINITY_WEAK_MIN_PER_CPU_S": T.AFFINITY_WEAK_MIN_PER_CPU_S,
                        "over": "the whole run, not only once balanced"}
        a.runs = paths[rel]
        out[rel] = a
    return out


def by_level_labels(levels: dict[str, dict]) -> dict[str, dict]:
    """{qid: {level: label}} of the per-level answers, for the card's answers' ``by_level``. A
    question the level's two CPUs cannot decide (how many: poly-balance and pairwise predict
    the same on two CPUs) gives its number instead: the tasks the first round moved."""
    out: dict[str, dict] = {}
    for level, answers in levels.items():
        for qid, a in answers.items():
            if a.label is not None:
                label = a.label
            elif qid == "how_many" and a.numbers.get(FIRST_ROUND_MOVED):
                # the runs of the largest imbalance (the suite's imbalance_pct check moves 1)
                pairs = list(zip(a.numbers.get(X) or [], a.numbers[FIRST_ROUND_MOVED]))
                top = max((x for x, _ in pairs if x is not None), default=None)
                moved = [v for x, v in pairs if v is not None and x == top]
                # the kind first, the numbers in brackets (compare.label_kind: levels whose
                # first rounds moved 3 and 4 tasks give answers of one kind)
                label = (f"first round moved ({statistics.median(moved):g} of x = {top}, "
                         "median; 2 CPUs: poly-balance = pairwise)" if moved
                         else "no first round")
            else:
                label = "cannot answer"
            out.setdefault(qid, {})[level] = label
    return out


def differs(labels: dict) -> bool:
    """The answers of one question differ between levels in kind (the label before any number
    it quotes in brackets)."""
    return len({str(v).split(" (", 1)[0] for v in labels.values()}) > 1


# ---------------------------------------------------------------------------------- predictions

def prediction_rows(evidence: list) -> list[dict]:
    """Every run's predicted-vs-measured row (its ``predictions`` summary key), with its run."""
    out = []
    for e in evidence:
        for r in (e.summary.get(PREDICTIONS) or {}).get("rows", []):
            out.append({**{k: r.get(k) for k in ROW_KEYS}, "run": str(e.path),
                        "experiment": e.experiment})
    return out


def prediction_verdicts(evidence: list) -> list[dict]:
    """The predictions over the runs, one per (check, level, domain, prediction): runs, holds
    (runs where it held), fails, unchecked, verdict ("holds", "fails in k of n", "not
    checkable"), measured (up to three runs' measurements), tolerance and source; then, for
    the detection period at each level, whether the runs' first checks reach
    PREDICTION_SCALE_FRACTION of the predicted period (a period much shorter than predicted)."""
    groups: dict[tuple, list] = {}
    for r in prediction_rows(evidence):
        groups.setdefault((r["check"], r["level"], r["domain"], r["predicted"]), []).append(r)
    out = []
    for (check, level, domain, predicted), rows in groups.items():
        holds = sum(r["holds"] is True for r in rows)
        fails = sum(r["holds"] is False for r in rows)
        verdict = ("not checkable" if holds + fails == 0 else "holds" if not fails
                   else f"fails in {fails} of {holds + fails}")
        out.append({"check": check, "level": level or "", "domain": domain,
                    "predicted": predicted, "runs": len(rows), "holds": holds, "fails": fails,
                    "unchecked": len(rows) - holds - fails, "verdict": verdict,
                    "measured": [r["measured"] for r in rows[:3]],
                    "tolerance": rows[0]["tolerance"], "source": rows[0]["source"]})
    out += _detection_scale(evidence)
    return sorted(out, key=lambda r: (r["check"], _order(r["level"])))


def _detection_scale(evidence: list) -> list[dict]:
    """The detection period from below: over a level's runs (at least
    PREDICTION_SCALE_MIN_RUNS), the largest first check reaches PREDICTION_SCALE_FRACTION of the
    predicted period."""
    import re

    out = []
    placed = [e for e in evidence if e.experiment == "detection" and level_of(e)]
    for level, runs in split(placed)[1].items():
        periods = []
        for e in runs:
            for r in (e.summary.get(PREDICTIONS) or {}).get("rows", []):
                m = re.search(r"within ([0-9.]+) ms", r.get("predicted") or "")
                if r["check"] == "detection period" and m:
                    periods.append(float(m.group(1)))
        firsts = [e.summary.get(INTERVAL1_MS) for e in runs
                  if e.summary.get(INTERVAL1_MS) is not None]
        if not periods or not firsts:
            continue
        period = statistics.median(periods)
        enough = scale_checkable(len(firsts))
        reach = scale_holds(max(firsts), period)
        out.append({"check": "detection period (from below)", "level": level, "domain": None,
                    "predicted": f"the runs' first checks spread over the period of {period:g} "
                                 "ms (the largest reaches a quarter of it)",
                    "runs": len(firsts), "holds": int(enough and reach),
                    "fails": int(enough and not reach), "unchecked": int(not enough),
                    "verdict": ("holds" if reach else "fails: checks come more often than "
                                "predicted") if enough else
                    f"not checkable (fewer than {T.PREDICTION_SCALE_MIN_RUNS} runs)",
                    "measured": [f"largest first check {max(firsts):.1f} ms of {len(firsts)} "
                                 "runs"],
                    "tolerance": f">= {T.PREDICTION_SCALE_FRACTION:g} x the period, from "
                                 f"{T.PREDICTION_SCALE_MIN_RUNS} runs",
                    "source": "thresholds.PREDICTION_SCALE_FRACTION"})
    return out


def level_lines(levels: dict[str, dict], verdicts: list[dict], questions) -> list[str]:
    """The card's text for its levels: each question's answer at each level (marked where the
    levels differ), then the predictions and how they fared."""
    out = []
    if levels:
        out.append("By level (where the source and target CPUs sit: smt = SMT siblings, llc = "
                   "one LLC, package = one package, node = one node, remote = two nodes):")
        labels = by_level_labels(levels)
        for qid, title, _ in questions:
            if qid not in labels:
                continue
            mark = "*" if differs(labels[qid]) else " "
            out.append(f" {mark} {qid}: " + "; ".join(f"{lv}: {lab}"
                                                      for lv, lab in labels[qid].items()))
        out.append("   (*: the answer differs by level)")
        out.append("")
    if verdicts:
        out.append("Predictions from the kernel's own domains (fair class), checked:")
        for v in verdicts:
            where = f" at {v['level']}" + (f" ({v['domain']})" if v["domain"] else "") \
                if v["level"] else ""
            out.append(f"  {v['check']}{where}: {v['verdict']} ({v['runs']} runs)")
            out.append(f"    predicted: {v['predicted']}")
            out.append(f"    measured:  {'; '.join(v['measured'])}")
            out.append(f"    tolerance: {v['tolerance']}; source: {v['source']}")
        out.append("")
    return out
