"""Policy cards and metrics side by side: the thesis's questions answered on several hosts,
kernels or schedulers, and how far their measurements differ (``harmony compare``).

Each directory given (a run, batch or suite directory, or a folder of them) is one *source*, and
its complete runs make one card, as ``harmony infer DIR`` would make it
(:func:`harmony.analysis.policy.infer`). Cards are never pooled across sources: a card of runs
from two schedulers would only say "undecided" where they differ. A *reference* is a source of
published figures without runs (:mod:`harmony.analysis.reference`: ``thesis-2011`` is the
thesis's O(1), CFS and BFS, three sources; ``thesis-2011:cfs`` one of them).

:func:`df_compare` lines the answers up (one row per question and source; a question is marked
when the sources' answers differ in kind, not merely in the number a label quotes),
:func:`df_sources` says what each source is. :func:`df_metric_differences` sets every source
against the first, per experiment configuration (:func:`config_of`) and summary key: the
difference of medians with a bootstrap 95% interval and Cliff's delta, marked where they differ
beyond noise (the rule and its reasons: :mod:`harmony.analysis.thresholds`, ``COMPARE_*``); a
reference's figure gives a point, never an interval. :func:`compare_text` prints all three as
tables; :func:`df_compare_runs` holds every run's metrics, :func:`plot_compare` draws those behind
the answers source by source, :func:`plot_differences` the differences with their intervals,
and :func:`write` stores all of it (``--out``).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from harmony import store
from harmony.analysis import document as D
from harmony.analysis import policy, reference, stats
from harmony.analysis.policy_levels import by_level_labels
from harmony.analysis import thresholds as T
from harmony.core.errors import ParameterError
from harmony.core.wording import plural
from harmony.experiments import CATALOG, get_experiment, summary_key

NO_EVIDENCE = "no evidence"

#: the parameters that make an experiment's configuration, besides the experiment and its CPU
#: count P: those the suite sweeps (``harmony.suite.SWEEPS``; a test checks they agree),
#: time-to-resolve's imbalance x, and the server's shape, load and request sizes. Runs of
#: different configurations are never pooled; runs of one configuration that differ in another
#: parameter are, and the row's note names the parameter.
CONFIG_PARAMS = {"how-many": ("x",), "time-to-resolve": ("x",), "spread": ("ntasks",),
                 "heavy-light": ("light_duty",), "priority-classes": ("nice_diff",),
                 "server": ("shape", "load", "sizes"), "proportional": ("ntasks",)}

#: the summary keys the policy card's answers are made of, per experiment, each checked against
#: its declaration at import: the metric table of :func:`compare_text` shows these (and any other
#: key that differs beyond noise) unless asked for all.
CARD_METRICS = tuple((exp, summary_key(key, exp)) for exp, key in (
    ("single-source", "balance_migrations"), ("single-source", "migrations"),
    ("single-source", "time_to_settle_s"), ("single-source", "time_to_balance_s"),
    ("single-source", "migrations_after_balance_per_s"),
    ("single-source", "share_ratio_min"),
    ("how-many", "first_round_moved"),
    ("time-to-resolve", "time_to_settle_s"), ("time-to-resolve", "time_to_balance_s"),
    ("work-conservation", "steal_latency_s"),
    ("detection", "interval1_ms"), ("detection", "interval2_ms"), ("detection", "interval3_ms"),
    ("intrinsic-imbalance", "share_ratio_min"), ("intrinsic-imbalance", "share_ratio_max"),
    ("intrinsic-imbalance", "jain_index"), ("intrinsic-imbalance", "migrations_per_s"),
    ("heavy-light", "smape_short"), ("heavy-light", "smape_long"),
    ("heavy-light", "one_heavy_one_light_fraction"), ("heavy-light", "heavy_slowdown_long"),
    ("heavy-light", "migrations_per_s"),
    ("priority-classes", "high_spread_index"), ("priority-classes", "low_cluster_index"),
    ("priority-classes", "high_allocation_ratio"),
    ("proportional", "speedup_ratio"), ("proportional", "speedup_ratio_min"),
    ("proportional", "concurrency_ratio"), ("proportional", "concurrency_ratio_min"),
))


#: the per-run metrics the comparison figure draws, one panel each: (experiment, summary key,
#: axis label, scale); each is what a card's answer is a median or a vote of. Each key is checked
#: at import against its experiment's declaration (:func:`harmony.experiments.summary_key`).
FIGURE_METRICS = tuple((exp, summary_key(key, exp), label, scale) for exp, key, label, scale in (
    ("single-source", "time_to_settle_s", "time to balance (s)", 1.0),
    ("time-to-resolve", "time_to_settle_s", "time to balance (s)", 1.0),
    ("single-source", "migrations_after_balance_per_s", "migrations/s after balance", 1.0),
    ("how-many", "first_round_moved", "tasks moved in the first round", 1.0),
    ("work-conservation", "steal_latency_s", "idle to first pull (ms)", 1e3),
    ("detection", "interval1_ms", "cut to first migration (ms)", 1.0),
    ("detection", "interval2_ms", "first to second migration (ms)", 1.0),
    ("intrinsic-imbalance", "migrations_per_s", "migrations/s", 1.0),
    ("intrinsic-imbalance", "share_ratio_min", "lowest share / fair share", 1.0),
    ("heavy-light", "smape_long", "run-queue variance SMAPE, long", 1.0),
    ("proportional", "speedup_ratio_min", "worst task's speedup / GPS ideal", 1.0),
))


@dataclasses.dataclass
class Comparison:
    sources: list[str]                        # the directories (or reference names), as given
    cards: list[policy.Card]                  # one per source, in the same order
    evidence: list[list[policy.Evidence]]     # the runs behind each card ([] for a reference)
    references: list = dataclasses.field(default_factory=list)  # reference.Reference or None each

    def reference(self, k: int):
        """Source ``k``'s :class:`harmony.analysis.reference.Reference`, None for runs."""
        return self.references[k] if k < len(self.references) else None


def compare(paths) -> Comparison:
    """One card per source of ``paths``: a directory, or a reference name
    (:func:`harmony.analysis.reference.resolve`; "thesis-2011" is three sources). At least two
    sources; RunError naming a directory that does not exist or holds no complete run, an unknown
    reference, or a source given twice. An existing directory is taken as one even when its name
    is also a reference's (give ./thesis-2011 or thesis-2011 accordingly)."""
    specs = [str(p) for p in paths]
    sources: list[tuple[str, object]] = []        # (name, reference or directory path)
    for p in specs:
        if reference.is_reference(p) and not Path(p).exists():
            sources += [(r.name, r) for r in reference.resolve(p)]
        else:
            if not Path(p).exists():
                raise store.RunError(f"{p}: no such directory (nor a reference: "
                                     f"{', '.join(reference.names())})")
            sources.append((p, Path(p).resolve()))
    if len(sources) < 2:    # usage, not input (exit status 2)
        raise ParameterError("compare needs two sources or more (directories, or references "
                             "such as thesis-2011)")
    seen: dict = {}
    for name, what in sources:
        key = what if isinstance(what, Path) else name
        if key in seen:
            raise ParameterError(f"{name}: given twice (as {seen[key]})")
        seen[key] = name
    cmp = Comparison([], [], [], [])
    for name, what in sources:
        if isinstance(what, Path):
            ev, skipped = policy.collect([name])
            if not ev:
                raise store.no_complete_run(name, skipped)
            card, ref = policy.infer_evidence(ev, skipped), None
        else:
            ev, card, ref = [], what.card, what
        cmp.sources.append(name)
        cmp.cards.append(card)
        cmp.evidence.append(ev)
        cmp.references.append(ref)
    return cmp


def df_sources(cmp: Comparison) -> pd.DataFrame:
    """What each source is. Columns: source (str: the directory or reference as given), letter
    (str: "A", "B", ...), kind (str: "runs", or "reference": published figures, no runs), runs
    (int: complete runs used; 0 for a reference), skipped (int: runs not used, e.g. incomplete or
    on a busy host), cpus (str: their CPU counts, "2" or "2/4"), setup (str: "<kernel>,
    <scheduler>", several joined by "; " when the directory mixes them,
    :func:`harmony.analysis.policy.setup_of`)."""
    return pd.DataFrame({
        "source": cmp.sources,
        "letter": [_letter(k) for k in range(len(cmp.sources))],
        "kind": ["runs" if cmp.reference(k) is None else "reference"
                 for k in range(len(cmp.sources))],
        "runs": [c.runs for c in cmp.cards],
        "skipped": [len(c.skipped) for c in cmp.cards],
        "cpus": ["/".join(map(str, c.cpus)) for c in cmp.cards],
        "setup": ["; ".join(c.setups) for c in cmp.cards],
    })


def label_kind(label: str) -> str:
    """What kind of answer ``label`` is, without the number it quotes: "fast (~250 ms)" and "fast
    (~180 ms)" are both "fast", "periodic (~64 ms between checks)" is "periodic". The numbers
    are set against each other by :func:`df_metric_differences`, with their noise."""
    return label.split(" (", 1)[0]


def df_compare(cmp: Comparison) -> pd.DataFrame:
    """The answers, one row per question (in the thesis's order) and source. Columns: qid (str),
    question (str), thesis (str: its section), source (str), label (str: the answer, "undecided",
    "varies (...)", or "no evidence"), kind (str: the label without the number it quotes,
    :func:`label_kind`), decided (bool: the label holds at the card's confidence,
    :mod:`harmony.analysis.sequential`; a reference's are), state (str: "decided", "varies",
    "undecided", or "" without evidence), votes (str: how the runs voted, "label: runs, ...";
    "" without evidence, and for a reference), differs (bool: the sources' answers are not all of
    one kind; the same on every row of a question), beyond_noise (bool: this source's answer
    and the first source's (A's) are both decided and of different kinds: the answer differs
    beyond noise, what ``--fail-on-difference`` fails on; False on A's rows)."""
    rows = []
    for src, card in zip(cmp.sources, cmp.cards):
        for a in card.answers:
            label = a.label if a.label is not None else NO_EVIDENCE
            rows.append({"qid": a.qid, "question": a.question, "thesis": a.thesis, "source": src,
                         "label": label, "kind": label_kind(label), "decided": a.decided,
                         "state": a.state or "",
                         "votes": ", ".join(f"{k}: {v}" for k, v in a.agreement.items())})
    df = pd.DataFrame(rows)
    df["differs"] = df.groupby("qid", sort=False)["kind"].transform("nunique") > 1
    first = df[df["source"] == cmp.sources[0]].set_index("qid")
    df["beyond_noise"] = [bool(r.decided and first.at[r.qid, "decided"]
                               and r.kind != first.at[r.qid, "kind"]) for r in df.itertuples()]
    return df


def df_compare_levels(cmp: Comparison) -> pd.DataFrame:
    """The answers by level set side by side (:mod:`harmony.analysis.policy_levels`): one row
    per question answered at a level by some source, and source. Columns: qid (str), level
    (str: smt, llc, package, node, remote), source (str), label (str: the answer there, or "no
    evidence"), kind (str: :func:`label_kind`), differs (bool: the sources' answers at that
    level are not all of one kind). Empty (with the columns) when no source has levels."""
    cols = ["qid", "level", "source", "label", "kind", "differs"]
    keys: dict[tuple, None] = {}
    for card in cmp.cards:
        for level, answers in card.levels.items():
            for qid in answers:
                keys[(qid, level)] = None
    order = {q: i for i, (q, _, _) in enumerate(policy.QUESTIONS)}
    # the card's own words per level (the suite report's): a question the level's two CPUs
    # cannot decide gives its number (how many: the first round) rather than "no evidence"
    labels = [by_level_labels(card.levels) for card in cmp.cards]
    rows = []
    for qid, level in sorted(keys, key=lambda k: (order.get(k[0], 99), _level_rank(k[1]))):
        for src, by_qid in zip(cmp.sources, labels):
            label = by_qid.get(qid, {}).get(level) or NO_EVIDENCE
            rows.append({"qid": qid, "level": level, "source": src, "label": label,
                         "kind": label_kind(label)})
    df = pd.DataFrame(rows, columns=cols[:-1])
    df["differs"] = (df.groupby(["qid", "level"], sort=False)["kind"].transform("nunique") > 1
                     if len(df) else pd.Series(dtype=bool))
    return df[cols]


def df_compare_predictions(cmp: Comparison) -> pd.DataFrame:
    """The predictions' verdicts side by side: one row per (check, level, source). Columns:
    check, level, source (str), verdict (str: "holds", "fails in k of n", "not checkable", or
    "-" where that source has no such row), runs (int)."""
    cols = ["check", "level", "source", "verdict", "runs"]
    keys: dict[tuple, None] = {}
    for card in cmp.cards:
        for v in card.predictions:
            keys[(v["check"], v["level"])] = None
    rows = []
    for check, level in keys:
        for src, card in zip(cmp.sources, cmp.cards):
            got = [v for v in card.predictions if (v["check"], v["level"]) == (check, level)]
            verdict = "; ".join(sorted({v["verdict"] for v in got})) or "-"
            rows.append({"check": check, "level": level, "source": src, "verdict": verdict,
                         "runs": sum(v["runs"] for v in got)})
    return pd.DataFrame(rows, columns=cols)


def _level_rank(level: str) -> int:
    from harmony.analysis.policy_levels import LEVEL_ORDER

    return LEVEL_ORDER.index(level) if level in LEVEL_ORDER else len(LEVEL_ORDER)


def _wrapped_row(head: str, values: list[str], cols: list[int]) -> list[str]:
    """One row of a table of columns ``cols`` wide: each value wrapped within its column (never
    cut), ``head`` on the first line and its width in blanks on the next."""
    cells = [textwrap.wrap(v, w, break_on_hyphens=False) or [""] for v, w in zip(values, cols)]
    return [((head if k == 0 else " " * len(head))
             + "".join(f"{(c[k] if k < len(c) else ''):<{w + 2}}" for c, w in zip(cells, cols))
             ).rstrip() for k in range(max(map(len, cells)))]


def levels_text(cmp: Comparison, width: int | None = None) -> list[str]:
    """The answers by level and the predictions' verdicts, one column per source; [] when no
    source has either. Each column as wide as its longest entry, or for a screen ``width``
    characters wide its share of it (never narrower than ANSWER_MIN_WIDTH), an entry longer
    than that wrapped within it: never cut."""
    names = [_letter(k) for k in range(len(cmp.sources))]
    out = []
    lv, pr = df_compare_levels(cmp), df_compare_predictions(cmp)
    entries = [[str(v) for v in lv.loc[lv["source"] == s, "label"]]
               + [str(v) for v in pr.loc[pr["source"] == s, "verdict"]] for s in cmp.sources]
    heads = ([f"{q} @ {lvl}" for q, lvl in zip(lv["qid"], lv["level"])]
             + [f"{c}" + (f" @ {lvl}" if lvl else "") for c, lvl in zip(pr["check"], pr["level"])])
    # the heads' column as wide as the longest ("detection period (from below) @ remote"):
    # a verdict never runs into its head
    wide = max([27] + [len(h) for h in heads]) + 1
    share = (max(ANSWER_MIN_WIDTH, (width - wide - 4) // max(1, len(names)) - 2)
             if width is not None else 10 ** 6)
    cols = [min(share, max([len(n)] + [len(v) for v in e])) for n, e in zip(names, entries)]
    if len(lv):
        out.append("by level (where the source and target CPUs sit; *: answers of another kind):")
        for (qid, level), d in lv.groupby(["qid", "level"], sort=False):
            mark = "*" if d["differs"].iloc[0] else " "
            out += _wrapped_row(f"{mark}  {f'{qid} @ {level}':<{wide}}",
                                list(map(str, d["label"])), cols)
        out.append("")
    if len(pr):
        out.append("predictions from the kernel's domains, checked (" + ", ".join(names) + "):")
        for (check, level), d in pr.groupby(["check", "level"], sort=False):
            head = f"{check}" + (f" @ {level}" if level else "")
            out += _wrapped_row(f"   {head:<{wide}}", list(map(str, d["verdict"])), cols)
        out.append("")
    return out


# ------------------------------------------------------------------------------ metric differences

#: the columns of :func:`df_metric_differences`, in order
METRIC_COLUMNS = ["pair", "a", "b", "source_a", "source_b", "experiment", "config", "cpus_a",
                  "cpus_b", "metric", "unit", "statistic", "n_a", "n_b", "value_a", "value_b",
                  "diff", "ci_low", "ci_high", "effect", "magnitude", "apart", "differs",
                  "verdict", "note"]

#: how each statistic a row may use summarises a side's runs
_STATISTICS = {"median": np.median, "mean": np.mean, "min": np.min, "max": np.max}


def config_of(e: policy.Evidence) -> tuple:
    """A run's configuration: (experiment, CPU count, ((parameter, value), ...)) over the
    experiment's :data:`CONFIG_PARAMS`, and its level when it was placed at one (runs at two
    levels are never pooled)."""
    params = tuple((name, e.params.get(name)) for name in CONFIG_PARAMS.get(e.experiment, ()))
    return (e.experiment, e.ncpus, params + ((("level", e.level),) if e.level else ()))


def config_label(config: tuple) -> str:
    """A configuration as the tables name it: "how-many P=4 x=16" (a reference figure's range of
    values: "nice_diff=2..6")."""
    experiment, ncpus, params = config
    return " ".join([experiment, f"P={ncpus}"] + [
        f"{k}={_num(v[0])}..{_num(v[1])}" if isinstance(v, list) else f"{k}={_num(v)}"
        for k, v in params])


def metrics_of(experiment: str) -> list:
    """The summary keys of ``experiment`` a comparison sets side by side: every declared number
    (kind int, float or bool: a bool's median is a majority, its mean the fraction true), less
    those that only repeat a parameter (x, light_duty, a drawn cut time...) and CPU numbers (a
    label, not a quantity)."""
    exp = get_experiment(experiment)
    params = {p.name for p in exp.all_params()}
    return [m for m in exp.declared if m.kind in ("int", "float", "bool") and m.unit != "cpu"
            and m.name not in params]


def _by_config(evidence: list[policy.Evidence]) -> dict[tuple, list[policy.Evidence]]:
    out: dict[tuple, list[policy.Evidence]] = {}
    for e in evidence:
        out.setdefault(config_of(e), []).append(e)
    return out


def _param_note(config: tuple, runs_a: list, runs_b: list) -> str:
    """The parameters, other than the configuration's and drawn ones, whose values differ between
    the two sides' runs or among one side's: what else the difference may come from."""
    experiment, ncpus, cparams = config
    skip = policy.drawn_params(experiment, ncpus) | {k for k, _ in cparams}

    def values(runs, name):
        return sorted({_num(e.params.get(name)) for e in runs}, key=str)

    names = sorted({k for e in runs_a + runs_b for k in e.params} - skip)
    parts = []
    for name in names:
        va, vb = values(runs_a, name), values(runs_b, name)
        if va != vb or len(va) > 1:
            parts.append(f"{name} {'/'.join(va)} vs {'/'.join(vb)}")
    return "parameters differ: " + "; ".join(parts) if parts else ""


def _magnitude(delta: float | None) -> str:
    if delta is None:
        return ""
    d = abs(delta)
    return ("large" if d >= T.COMPARE_EFFECT_LARGE else "medium" if d >= T.COMPARE_EFFECT_MEDIUM
            else "small" if d >= T.COMPARE_EFFECT_SMALL else "negligible")


def runs_difference(a, b) -> dict:
    """One metric between two sides' runs, ``a`` and ``b`` their values (None/NaN left out): the
    row of :func:`df_metric_differences` from statistic to verdict (statistic "median", n_a, n_b,
    value_a, value_b, diff, ci_low, ci_high, effect, magnitude, apart, differs, verdict)."""
    x, y = stats.clean(a), stats.clean(b)
    row = {"statistic": "median", "n_a": len(x), "n_b": len(y),
           "value_a": float(np.median(x)) if len(x) else math.nan,
           "value_b": float(np.median(y)) if len(y) else math.nan}
    row["diff"] = row["value_b"] - row["value_a"]
    lo, hi = stats.bootstrap_diff_ci(x, y, level=T.COMPARE_LEVEL)
    delta = stats.cliffs_delta(x, y)
    larger = max(abs(row["value_a"]), abs(row["value_b"])) if len(x) and len(y) else 0.0
    apart = lo is not None and (lo > 0 or hi < 0) and delta is not None \
        and abs(delta) >= T.COMPARE_EFFECT_LARGE \
        and abs(row["diff"]) > T.COMPARE_MIN_RELATIVE * larger
    enough = min(len(x), len(y)) >= T.COMPARE_MIN_RUNS
    if not len(x) or not len(y):
        verdict = "no value"
    elif not enough:
        verdict = "too few runs"
    else:
        verdict = "differs" if apart else "within noise"
    return row | {"ci_low": math.nan if lo is None else lo,
                  "ci_high": math.nan if hi is None else hi,
                  "effect": math.nan if delta is None else delta, "magnitude": _magnitude(delta),
                  "apart": bool(apart), "differs": bool(apart and enough), "verdict": verdict}


def _point_row(statistic: str, a, b) -> dict:
    """One metric where a side is a reference's figure: ``a`` and ``b`` each a list of run values
    or a float (the figure); a difference without interval or effect, never marked."""
    def side(v):
        if isinstance(v, float):
            return 0, v
        x = stats.clean(v)
        return len(x), float(_STATISTICS[statistic](x)) if len(x) else math.nan

    (n_a, va), (n_b, vb) = side(a), side(b)
    return {"statistic": statistic, "n_a": n_a, "n_b": n_b, "value_a": va, "value_b": vb,
            "diff": vb - va, "ci_low": math.nan, "ci_high": math.nan, "effect": math.nan,
            "magnitude": "", "apart": False, "differs": False,
            "verdict": "point" if not (math.isnan(va) or math.isnan(vb)) else "no value"}


def _figure_note(fig, ref, ncpus: int | None) -> str:
    runs = f", {fig.runs} runs" if fig.runs else ""
    note = f"{fig.where} ({fig.statistic}{runs}): {fig.note}".rstrip(": ")
    if ncpus is not None and ncpus != ref.cpus:
        note += f"; the thesis ran {ref.cpus} CPUs, these runs {ncpus}"
    return note


def _pair_rows(cmp: Comparison, i: int, j: int) -> list[dict]:
    """The rows of source ``j`` (B) against source ``i`` (A)."""
    ref_a, ref_b = cmp.reference(i), cmp.reference(j)
    rows = []
    if ref_a is None and ref_b is None:
        conf_a, conf_b = _by_config(cmp.evidence[i]), _by_config(cmp.evidence[j])
        for config in (c for c in conf_a if c in conf_b):
            runs_a, runs_b = conf_a[config], conf_b[config]
            note = _param_note(config, runs_a, runs_b)
            for m in metrics_of(config[0]):
                a = [e.summary.get(m.name) for e in runs_a]
                b = [e.summary.get(m.name) for e in runs_b]
                if not len(stats.clean(a)) and not len(stats.clean(b)):
                    continue
                rows.append({"config": config, "metric": m.name, "unit": m.unit,
                             "cpus_a": config[1], "cpus_b": config[1], "note": note}
                            | runs_difference(a, b))
    elif ref_a is not None and ref_b is not None:
        for fa in ref_a.figures:
            stat = reference.RUN_STATISTIC[fa.statistic]
            for fb in ref_b.figures:
                if (fa.experiment, fa.key, stat, fa.params) != \
                        (fb.experiment, fb.key, reference.RUN_STATISTIC[fb.statistic], fb.params):
                    continue
                rows.append({"config": (fa.experiment, ref_a.cpus, tuple(fa.params.items())),
                             "metric": fa.key, "unit": _unit(fa.experiment, fa.key),
                             "cpus_a": ref_a.cpus, "cpus_b": ref_b.cpus,
                             "note": f"{fa.where} ({fa.statistic} / {fb.statistic}): A: "
                                     f"{fa.note}; {_letter(j)}: {fb.note}"}
                            | _point_row(stat, fa.value, fb.value))
    else:
        ref, runs_k = (ref_a, j) if ref_a is not None else (ref_b, i)
        configs = _by_config(cmp.evidence[runs_k])
        for fig in ref.figures:
            for config, runs in configs.items():
                if config[0] != fig.experiment or not fig.matches(dict(config[2])):
                    continue
                values = [e.summary.get(fig.key) for e in runs]
                stat = reference.RUN_STATISTIC[fig.statistic]
                a, b = (fig.value, values) if ref_a is not None else (values, fig.value)
                rows.append({"config": config, "metric": fig.key,
                             "unit": _unit(fig.experiment, fig.key),
                             "cpus_a": ref.cpus if ref_a is not None else config[1],
                             "cpus_b": ref.cpus if ref_b is not None else config[1],
                             "note": _figure_note(fig, ref, config[1])}
                            | _point_row(stat, a, b))
    return rows


def _unit(experiment: str, key: str) -> str:
    return next(m.unit for m in get_experiment(experiment).declared if m.name == key)


def df_metric_differences(cmp: Comparison) -> pd.DataFrame:
    """Every source against the first (A), per experiment configuration (:func:`config_of`: never
    pooled across configurations, P included) and summary key (:func:`metrics_of`).

    Between two sources of runs: the difference of the medians B - A, a bootstrap interval
    (``thresholds.COMPARE_LEVEL``, 95%: each source's runs resampled within it,
    ``stats.BOOTSTRAP_RESAMPLES`` times from ``stats.BOOTSTRAP_SEED``, so the same inputs give
    the same interval) and Cliff's delta of B's runs against A's; "differs" when the interval
    excludes 0, the effect is large, the shift exceeds ``thresholds.COMPARE_MIN_RELATIVE`` of
    the larger value and each side has ``thresholds.COMPARE_MIN_RUNS`` runs with a value.
    Against a reference (:mod:`harmony.analysis.reference`): each figure of it against the runs
    of every configuration it describes (any P: the note says when the thesis's differs), with
    the figure's statistic on both sides (a mean against the runs' mean, a maximum against their
    maximum...): a point, no interval, never marked. Two references: their figures of the same
    key, configuration and statistic.

    Columns: pair (str: "B vs A"), a, b (str: letters), source_a, source_b (str), experiment
    (str), config (str: :func:`config_label`), cpus_a, cpus_b (int: CPU counts; the thesis's 4),
    metric (str: the summary key), unit (str: its declared unit), statistic (str: "median",
    "mean", "min" or "max": what value_a and value_b are), n_a, n_b (int: runs with a value; 0 for
    a figure), value_a, value_b (float: the statistic of each side; NaN without a value), diff
    (float: value_b - value_a), ci_low, ci_high (float: the interval of diff; NaN for a point or
    below 2 runs a side), effect (float: Cliff's delta, -1..1, positive when B is larger; NaN for
    a point), magnitude (str: "negligible", "small", "medium", "large"; "" for a point), apart
    (bool: the interval excludes 0, the effect is large and the shift not negligible, however
    many runs), differs (bool:
    apart with enough runs: the marker), verdict (str: "differs", "within noise", "too few runs",
    "point", "no value"), note (str: where a figure comes from and how it maps; parameters that
    differ; CPU counts that differ). One row per pair, configuration and metric, in the
    catalog's order; a configuration only one side measured has no row.
    """
    rows = []
    for j in range(1, len(cmp.sources)):
        for r in _pair_rows(cmp, 0, j):
            config = r.pop("config")
            rows.append({"pair": f"{_letter(j)} vs A", "a": "A", "b": _letter(j),
                         "source_a": cmp.sources[0], "source_b": cmp.sources[j],
                         "experiment": config[0], "config": config_label(config), **r,
                         "_order": (j, list(CATALOG).index(config[0]), config[1],
                                    tuple(_sortable(v) for _, v in config[2]),
                                    _metric_index(config[0], r["metric"]))})
    if not rows:
        return pd.DataFrame(columns=METRIC_COLUMNS)
    df = pd.DataFrame(rows).sort_values("_order", kind="stable").drop(columns="_order")
    return df[METRIC_COLUMNS].reset_index(drop=True)


def _sortable(value) -> tuple:
    """A configuration's parameter value as a sort key: numbers by value (x=8 before x=16)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _metric_index(experiment: str, key: str) -> int:
    names = [m.name for m in get_experiment(experiment).declared]
    return names.index(key) if key in names else len(names)


def unmatched(cmp: Comparison) -> list[str]:
    """What one side of a pair measured and the other did not, as lines: configurations of runs
    without a counterpart, and a reference's figures that no configuration of the runs matched."""
    out = []
    conf = [None if cmp.reference(k) is not None else _by_config(cmp.evidence[k])
            for k in range(len(cmp.sources))]
    for j in range(1, len(cmp.sources)):
        pair = f"{_letter(j)} vs A"
        if conf[0] is not None and conf[j] is not None:
            for k, other in ((0, j), (j, 0)):
                only = [config_label(c) for c in conf[k] if c not in conf[other]]
                if only:
                    out.append(f"{pair}: only {_letter(k)} measured {', '.join(only)}")
        elif (conf[0] is None) != (conf[j] is None):
            ref, runs = ((cmp.reference(0), conf[j]) if conf[0] is None
                         else (cmp.reference(j), conf[0]))
            missed = [f for f in ref.figures if not any(
                c[0] == f.experiment and f.matches(dict(c[2])) for c in runs)]
            if missed:
                exps = sorted({f.experiment + (f" {f.config_text}" if f.params else "")
                               for f in missed})
                out.append(f"{pair}: {len(missed)} of {ref.name}'s {len(ref.figures)} figures "
                           f"match no configuration of the runs ({', '.join(exps)})")
    return out


def source_what(cmp: Comparison, k: int, row) -> str:
    """What source ``k`` is (``row``: its row of :func:`df_sources`): its runs, or a reference's
    figures."""
    ref = cmp.reference(k)
    if ref is not None:
        return (f"reference, no runs: {len(ref.figures)} figures and the answers of "
                f"{ref.cite}, on {row.cpus} CPUs")
    skipped = f", {row.skipped} not used" if row.skipped else ""
    return f"{plural(row.runs, 'run')} on {row.cpus or '?'} CPUs{skipped}"


def answers_table(cmp: Comparison) -> tuple[pd.DataFrame, pd.Series]:
    """(one row per question, index qid, one column of labels per source; whether the sources'
    answers differ in kind, per qid)."""
    df = df_compare(cmp)
    table = df.pivot(index="qid", columns="source", values="label").loc[
        list(dict.fromkeys(df["qid"])), cmp.sources]
    return table, df.groupby("qid", sort=False)["differs"].first()


def answers_note(n_diff: int, n: int) -> str:
    return (f"{n_diff} of {n} questions answered differently (*: answers of another kind; "
            "the numbers a label quotes are compared below); `harmony infer DIR` gives the numbers "
            "and votes behind each answer")


def compare_text(cmp: Comparison, width: int | None = None, all_metrics: bool = False) -> str:
    """The tables ``harmony compare`` prints: the sources, each question's answer per source
    ("*": answers of another kind), then :func:`metrics_text`. For a screen ``width`` columns
    wide, a label longer than its column is wrapped onto the next lines; without ``width`` (a
    file, a pipe) each column is as wide as its longest label. An answer is never cut."""
    src = df_sources(cmp)
    names = list(src["letter"])
    out = ["sources:"]
    for k, row in enumerate(src.itertuples()):
        out.append(f"  {row.letter}  {row.source}: {source_what(cmp, k, row)}; {row.setup}")
    out.append("")
    table, differs = answers_table(cmp)
    out += answers_lines(table, differs, names, width)
    out += [""] + textwrap.wrap(answers_note(int(differs.sum()), len(table)), min(width or 100,
                                                                                 100)) + [""]
    out += levels_text(cmp, width)
    out += metrics_text(cmp, df_metric_differences(cmp), all_metrics)
    return "\n".join(out).rstrip() + "\n"


#: the narrowest a column of answers gets, however many sources share the screen
ANSWER_MIN_WIDTH = 16


def answers_lines(table: pd.DataFrame, differs: pd.Series, names: list[str],
                  width: int | None = None) -> list[str]:
    """The answers per question and source: each column as wide as its longest label, or, for a
    screen ``width`` characters wide, as its share of it (never narrower than
    ANSWER_MIN_WIDTH), a longer label wrapped within its column."""
    qw = max(len(q) for q in table.index) + 2
    share = (max(ANSWER_MIN_WIDTH, (width - qw - 4) // max(1, len(names)) - 2)
             if width is not None else 10 ** 6)
    cols = [min(share, max([len(n)] + [len(str(v)) for v in table[c]]))
            for n, c in zip(names, table.columns)]
    out = [(f"    {'question':<{qw}}"
            + "".join(f"{n:<{w + 2}}" for n, w in zip(names, cols))).rstrip()]
    for i, (qid, labels) in enumerate(table.iterrows(), 1):
        cells = [textwrap.wrap(str(v), w, break_on_hyphens=False) or [""]
                 for v, w in zip(labels, cols)]
        for k in range(max(map(len, cells))):
            head = (f"{'*' if differs[qid] else ' '}{i:>2} {qid:<{qw}}" if k == 0
                    else " " * (qw + 4))
            out.append((head + "".join(f"{(c[k] if k < len(c) else ''):<{w + 2}}"
                                       for c, w in zip(cells, cols))).rstrip())
    return out


def metrics_intro(cmp: Comparison) -> str:
    return (f"Metrics, {'each source' if len(cmp.sources) > 2 else 'B'} against A, per "
            "configuration (experiment, P, swept parameter): the difference of medians B - A "
            f"with its {T.COMPARE_LEVEL:.0%} bootstrap interval (each source's runs resampled "
            f"within it, {stats.BOOTSTRAP_RESAMPLES} resamples, seed {stats.BOOTSTRAP_SEED}) "
            "and Cliff's delta; against a reference's figure, a point (no interval) in the "
            "figure's statistic.")


def pair_title(d: pd.DataFrame) -> str:
    """The heading of one pair's table (``d``: its rows of :func:`df_metric_differences`)."""
    return f"{d['pair'].iloc[0]} ({d['source_b'].iloc[0]} against {d['source_a'].iloc[0]}):"


def hidden_note(hidden: int) -> str:
    return (f"{hidden} more metric rows, none apart: `--all-metrics` prints them; "
            "--json and compare.json hold every row")


def metrics_footnote(df: pd.DataFrame) -> str:
    """What the marks mean, and how many chance alone would give among ``df``'s rows."""
    # rows that chance could mark: enough runs, and runs that vary (two constants cannot)
    runs = df[df["verdict"].isin(["differs", "within noise"])]
    pool = runs[runs["ci_low"] != runs["ci_high"]]
    chance = ""
    if len(pool):
        chance = (f" Each mark is a {T.COMPARE_LEVEL:.0%} statement about its own metric: of the "
                  f"{len(pool)} metric rows here with enough runs whose runs vary, "
                  f"{int(pool['differs'].sum())} are marked; about "
                  f"{T.COMPARE_CHANCE_RATE * len(pool):.1f} would be by chance if the sources did "
                  "not differ at all.")
    return (f"*: differs beyond noise: the interval excludes 0, |delta| >= "
            f"{T.COMPARE_EFFECT_LARGE} (large) and the difference exceeds "
            f"{T.COMPARE_MIN_RELATIVE:.0%} of the larger value, with >= {T.COMPARE_MIN_RUNS} runs "
            "a side with a value (thresholds.COMPARE_*). ?: as far apart, with fewer runs: not "
            f"marked (2 runs a side are that far apart by chance 1 time in 3).{chance}")


NO_COMMON = ("no configuration measured on both sides (or described by a reference's "
             "figure)")


def metrics_text(cmp: Comparison, df: pd.DataFrame, all_metrics: bool = False) -> list[str]:
    """The metric tables of :func:`compare_text`, one per pair (B vs A, C vs A, ...), from
    :func:`df_metric_differences`'s ``df``: the card's metrics (:data:`CARD_METRICS`), every
    reference figure and any metric whose sides are apart, or every row with ``all_metrics``."""
    shown = _shown(df, all_metrics)
    out = textwrap.wrap(metrics_intro(cmp), 100)
    for _, d in shown.groupby("pair", sort=False):
        out += ["", pair_title(d)]
        out += _metric_table(d)
    if shown.empty:
        out += ["", NO_COMMON]
    out += [""] + [f"  {line}" for line in unmatched(cmp)]
    hidden = len(df) - len(shown)
    if hidden:
        out.append("  " + hidden_note(hidden))
    out += [""] + textwrap.wrap(metrics_footnote(df), 100)
    return [line.rstrip() for line in out]


def _shown(df: pd.DataFrame, all_metrics: bool = False, apart: bool = True) -> pd.DataFrame:
    """The rows the tables (and, without those ``apart``, the figure) show: every row with
    ``all_metrics``; else those of :data:`CARD_METRICS`, every reference figure and any row whose
    sides are apart."""
    if all_metrics:
        return df
    keep = pd.Series([(e, m) in CARD_METRICS for e, m in zip(df["experiment"], df["metric"])],
                     index=df.index, dtype=bool) | (df["verdict"] == "point")
    return df[keep | (df["apart"].astype(bool) if apart else False)]


def metric_rows(d: pd.DataFrame) -> tuple[tuple, list[tuple]]:
    """(the heading, the rows) of one pair's metric table (``d``: its rows of
    :func:`df_metric_differences`); each row's first cell is its mark ("*", "?" or " ")."""
    a, b = d["a"].iloc[0], d["b"].iloc[0]
    rows = []
    for r in d.itertuples():
        mark = "*" if r.differs else "?" if r.apart else " "
        stat = "" if r.statistic == "median" else f" ({r.statistic})"
        if r.verdict == "point":
            interval, effect = "point", ""
            verdict = r.note.split(": ", 1)[0]
        else:
            interval = ("" if math.isnan(r.ci_low) else
                        f"{_signed(r.ci_low)} .. {_signed(r.ci_high)}")
            effect = "" if math.isnan(r.effect) else f"{r.effect:+.2f} {r.magnitude}"
            verdict = r.verdict + (f" ({r.n_a}, {r.n_b})" if r.verdict == "too few runs" else "")
        rows.append((mark, r.config, f"{r.metric} [{r.unit}]{stat}",
                     f"{_number(r.value_a)} ({r.n_a})" if r.n_a else _number(r.value_a),
                     f"{_number(r.value_b)} ({r.n_b})" if r.n_b else _number(r.value_b),
                     _signed(r.diff), interval, effect, verdict))
    side = {x: f"{x} (runs)" if (d[n] > 0).any() else f"{x} (figure)"
            for x, n in ((a, "n_a"), (b, "n_b"))}
    head = ("", "configuration", "metric [unit]", side[a], side[b], f"{b} - {a}",
            f"{T.COMPARE_LEVEL:.0%} interval", "delta", "")
    return head, rows


def _metric_table(d: pd.DataFrame) -> list[str]:
    head, rows = metric_rows(d)
    widths = [max(len(str(x[c])) for x in [head] + rows) for c in range(len(head))]
    return ["  " + "  ".join(f"{str(x[c]):<{widths[c]}}" for c in range(len(head))).rstrip()
            for x in [head] + rows]


def _number(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"


def _signed(v: float) -> str:
    if v is None or math.isnan(v):
        return "-"
    return ("+" if v > 0 else "") + _number(v) if v != 0 else "0"


def _num(v) -> str:
    """A parameter value as ``-p`` takes it: 20.0 as 20, a list as "8,0,0,0"."""
    if isinstance(v, (list, tuple)):
        return ",".join(_num(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def to_dict(cmp: Comparison) -> dict:
    """The comparison for programs (``--json``, compare.json): {"sources": :func:`df_sources`'s
    rows, "answers": :func:`df_compare`'s rows, "metrics": :func:`df_metric_differences`'s rows
    (NaN as null), "unmatched": :func:`unmatched`}."""
    metrics = df_metric_differences(cmp)
    return {"sources": df_sources(cmp).to_dict("records"),
            "answers": df_compare(cmp).to_dict("records"),
            "levels": df_compare_levels(cmp).to_dict("records"),
            "predictions": df_compare_predictions(cmp).to_dict("records"),
            "metrics": metrics.astype(object).where(metrics.notna(), None).to_dict("records"),
            "unmatched": unmatched(cmp)}


# ------------------------------------------------------------------------------------- the gate

def gate_choice(questions=(), metrics=()) -> tuple[list[str], list[tuple[str | None, str]]]:
    """What ``--fail-on-difference`` checks: (qids, [(experiment or None, summary key)]). No
    choice at all: every question, no metric (a metric row is marked by chance about
    COMPARE_CHANCE_RATE of the time, so among the dozens a suite has some would fail two suites
    of one kernel: name the metrics that matter). A question is its id (how_many) or number
    (1-9); a metric a summary key (first_round_moved) or EXPERIMENT:KEY. ValueError, one line,
    naming an unknown one."""
    qids = [q for q, _, _ in policy.QUESTIONS]
    chosen_q = []
    for q in questions:
        qid = qids[int(q) - 1] if q.isdigit() and 1 <= int(q) <= len(qids) else q
        if qid not in qids:
            raise ValueError(f"unknown question {q!r}: give one of {', '.join(qids)} (or 1-"
                             f"{len(qids)})")
        chosen_q.append(qid)
    known = {(name, m.name) for name in CATALOG for m in metrics_of(name)}
    chosen_m = []
    for m in metrics:
        exp, sep, key = m.rpartition(":")
        exp = exp if sep else None
        if not any(key == k and exp in (None, e) for e, k in known):
            raise ValueError(f"unknown metric {m!r}: give a summary key an experiment declares "
                             "(first_round_moved, or how-many:first_round_moved; `harmony "
                             "compare --all-metrics` lists those compared)")
        chosen_m.append((exp, key))
    if not chosen_q and not chosen_m:
        chosen_q = qids
    return chosen_q, chosen_m


def gate(cmp: Comparison, questions=(), metrics=()) -> dict:
    """``harmony compare --fail-on-difference``: whether a chosen answer or metric differs beyond
    noise between the first source (A) and another (:func:`gate_choice` says what is chosen).
    An answer differs beyond noise when both sources decided it, with labels of different kinds
    (df_compare's ``beyond_noise``); a metric when compare marks it (``differs``: the interval
    excludes 0, the effect is large, enough runs a side). Returns {"failed": bool, "questions":
    qids checked, "metrics": the metric names checked, "answers_failing": df_compare's failing
    rows, "metrics_failing": df_metric_differences' failing rows, "answers_open": chosen answers
    not decided on both sides of a pair (they could not fail), "metrics_open": chosen metric
    rows that could not be marked (too few runs, no value), "answers_missing": chosen answers
    without evidence on one side of a pair}."""
    qids, chosen = gate_choice(questions, metrics)
    answers = df_compare(cmp)
    answers = answers[answers["qid"].isin(qids)]
    first = answers[answers["source"] == cmp.sources[0]].set_index("qid")
    others = answers[answers["source"] != cmp.sources[0]]
    both = [(q, d and first.at[q, "decided"]) for q, d, lab in
            zip(others["qid"], others["decided"], others["label"])
            if lab != NO_EVIDENCE and first.at[q, "label"] != NO_EVIDENCE]
    rows = df_metric_differences(cmp)
    picked = pd.Series(False, index=rows.index)
    for exp, key in chosen:
        picked |= (rows["metric"] == key) & ((rows["experiment"] == exp) if exp else True)
    rows = rows[picked & (rows["verdict"] != "point")]
    bad_a, bad_m = others[others["beyond_noise"]], rows[rows["differs"].astype(bool)]
    return {"failed": bool(len(bad_a) or len(bad_m)), "questions": qids,
            "metrics": [f"{e}:{k}" if e else k for e, k in chosen],
            "answers_failing": bad_a.to_dict("records"),
            "metrics_failing": bad_m.astype(object).where(bad_m.notna(), None).to_dict("records"),
            "answers_open": sum(not d for _, d in both),
            "answers_missing": len(others) - len(both),
            "metrics_open": int((~rows["verdict"].isin(["differs", "within noise"])).sum())}


def gate_text(g: dict) -> str:
    """The gate's verdict in a few lines: what failed (each answer and metric), else that nothing
    did, and how much of what was chosen could not have failed (too few runs)."""
    out = []
    for r in g["answers_failing"]:
        out.append(f"differs beyond noise: {r['qid']}: {r['source']} says {r['label']!r} "
                   "(decided on both sides)")
    for r in g["metrics_failing"]:
        out.append(f"differs beyond noise: {r['config']} {r['metric']}: {_number(r['value_a'])} "
                   f"-> {_number(r['value_b'])} ({r['pair']}, interval {_signed(r['ci_low'])} .. "
                   f"{_signed(r['ci_high'])})")
    checked = (plural(len(g['questions']), 'question')
               + (f", metrics {', '.join(g['metrics'])}" if g["metrics"] else ""))
    out.append(f"gate: {'FAILED' if g['failed'] else 'passed'} ({checked})")
    if g["answers_open"] or g["metrics_open"]:
        out.append(f"gate: could not fail on {g['answers_open']} answers not decided on both "
                   f"sides and {g['metrics_open']} metric rows with too few runs "
                   "(`harmony suite --until-decided` gives both their runs)")
    if g["answers_missing"]:
        out.append(f"gate: {g['answers_missing']} chosen answers have no evidence on one side")
    return "\n".join(out)


def df_compare_runs(cmp: Comparison) -> pd.DataFrame:
    """Every complete run of every source, one row each: the columns of
    :func:`harmony.analysis.report_suite.df_suite_runs` (path, experiment, config, ncpus, then
    each scalar summary key) and ``source`` (str: the directory as given) and ``letter`` (str: its
    letter in :func:`compare_text`, "A", "B", ...)."""
    from harmony.analysis.report_suite import df_suite_runs

    parts = []
    for k, (src, ev) in enumerate(zip(cmp.sources, cmp.evidence)):
        df = df_suite_runs(ev)
        df.insert(0, "letter", _letter(k))
        df.insert(0, "source", src)
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def plot_compare(runs: pd.DataFrame, path) -> Path | None:
    """The metrics of :data:`FIGURE_METRICS` that some source measured, one panel each, the
    sources side by side (by letter), every run a point and each source's median a red bar;
    None if no source measured any."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harmony.analysis.plots import save_figure
    # the suite report's point strips and look, so that both read alike
    from harmony.analysis.report_suite import STYLE, median_bars, numeric, strip_points

    if runs.empty or "experiment" not in runs:
        return None
    panels = []
    for exp, key, label, scale in FIGURE_METRICS:
        d = runs[runs["experiment"] == exp]
        values = numeric(d, key) * scale
        data = pd.DataFrame({"source": d["letter"], label: values}).dropna()
        if not data.empty:
            panels.append((f"{exp}: {key}", label, data))
    if not panels:
        return None
    letters = list(dict.fromkeys(runs["letter"]))
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, (title, label, data) in zip(axes.flat, panels):
            # every source gets its place on the axis, measured or not
            strip_points(ax, data, x="source", y=label, size=6, order=letters)
            median_bars(ax, data, "source", label, letters)
            ax.set_title(title, fontsize=9)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle("Each source's runs (" + ", ".join(
            f"{letter}: {src}" for letter, src in dict(zip(runs["letter"], runs["source"])).items())
            + "; red: median)", fontsize=9)
        # room for the title above the panels
        return save_figure(fig, path, dpi=100, rect=(0, 0, 1, 0.97))


#: colours of :func:`plot_differences`' rows, by what the row says
DIFF_COLOURS = {"differs": "#c0392b", "apart": "#de8f05", "other": "#7f8c8d", "point": "#0173b2"}
#: the relative differences :func:`plot_differences` draws (beyond: an arrow at the edge)
DIFF_LIMIT = 2.0


def plot_differences(df: pd.DataFrame, path, all_metrics: bool = False) -> Path | None:
    """Every pair's metric differences (:func:`df_metric_differences`: the card's metrics and the
    reference figures, or every row with ``all_metrics``) as a forest plot, one panel per
    pair, one line per configuration and metric: the difference B - A and its interval,
    relative to the larger of the two values (so that counts, seconds and ratios share one
    axis; the absolute difference is written beside each line). Red: differs beyond noise;
    orange: as far apart with too few runs; grey: within noise or too few runs; blue
    diamond: against a reference's figure (a point, no interval). None when there is no row."""
    import matplotlib       # ~0.3 s to import: only when a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harmony.analysis.plots import save_figure
    from harmony.analysis.report_suite import STYLE

    d = _shown(df, all_metrics, apart=False)
    if d.empty:
        return None
    pairs = list(dict.fromkeys(d["pair"]))
    sizes = [int((d["pair"] == p).sum()) for p in pairs]
    # 100% when every value is >= 0 (the usual case), up to DIFF_LIMIT when signs differ
    extent = np.nanmax(np.abs(d[["diff", "ci_low", "ci_high"]].to_numpy(float)) / np.maximum(
        np.maximum(d["value_a"].abs(), d["value_b"].abs()).to_numpy(float)[:, None], 1e-300),
        initial=0.0)
    limit = min(DIFF_LIMIT, max(1.0, float(extent)))
    with plt.rc_context(STYLE):
        height = 1.2 + 0.27 * sum(sizes) + 0.9 * len(pairs)
        fig, axes = plt.subplots(len(pairs), 1, figsize=(11, height), squeeze=False,
                                 gridspec_kw={"height_ratios": [n + 2 for n in sizes]})
        for ax, pair in zip(axes[:, 0], pairs):
            rows = d[d["pair"] == pair].reset_index(drop=True)
            scale = np.maximum(rows["value_a"].abs(),
                               rows["value_b"].abs()).to_numpy(float, copy=True)
            scale[~(scale > 0)] = 1.0       # both 0 (or NaN): the difference is 0 (or absent)
            rel = (rows["diff"].to_numpy(float) / scale)
            lo, hi = rows["ci_low"].to_numpy(float) / scale, rows["ci_high"].to_numpy(float) / scale
            y = np.arange(len(rows))[::-1]
            for k, r in rows.iterrows():
                kind = ("point" if r["verdict"] == "point" else "differs" if r["differs"]
                        else "apart" if r["apart"] else "other")
                colour = DIFF_COLOURS[kind]
                if not math.isnan(lo[k]):
                    ax.hlines(y[k], max(lo[k], -DIFF_LIMIT), min(hi[k], DIFF_LIMIT),
                              color=colour, lw=2)
                if not math.isnan(rel[k]):
                    ax.plot(np.clip(rel[k], -DIFF_LIMIT, DIFF_LIMIT), y[k],
                            "D" if kind == "point" else "o", color=colour, ms=5, zorder=3)
                stat = "" if r["statistic"] == "median" else f" ({r['statistic']})"
                ax.text(1.01, y[k], f"{_signed(r['diff'])} {r['unit']}{stat}", va="center",
                        fontsize=7, transform=ax.get_yaxis_transform(), color=colour)
            ax.axvline(0, color="#2c3e50", lw=0.8)
            ax.set_xlim(-limit * 1.05, limit * 1.05)
            ax.set_yticks(y, [f"{c}  {m}" for c, m in zip(rows["config"], rows["metric"])],
                          fontsize=7)
            ax.set_ylim(-0.7, len(rows) - 0.3)
            ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
            ax.grid(False, axis="y")
            ax.set_title(f"{pair}: {rows['source_b'].iloc[0]} against {rows['source_a'].iloc[0]}",
                         fontsize=9, loc="left")
        axes[-1, 0].set_xlabel(f"B - A relative to the larger of the two values; bar: its "
                               f"{T.COMPARE_LEVEL:.0%} bootstrap interval\nred: differs beyond "
                               "noise; orange: as far apart with too few runs; grey: within noise "
                               "or too few runs\nblue diamond: against a reference's figure (a "
                               "point, no interval)", fontsize=8)
        return save_figure(fig, path, dpi=100)


def _label_cell(a: policy.Answer) -> D.Cell:
    """An answer in the answers table, styled by its kind (:func:`harmony.analysis.policy.
    answer_kind`): a label not decided yet is styled undecided."""
    kind = policy.answer_kind(a)
    return D.Cell(a.label if a.label is not None else NO_EVIDENCE,
                  "none" if kind == "cannot" else kind)


def _level_label_cell(label: str) -> D.Cell:
    """A label of the answers by level (:func:`df_compare_levels`' label column), styled by it."""
    kind = ("none" if label == NO_EVIDENCE else
            "undecided" if label == policy.UNDECIDED else "answered")
    return D.Cell(label, kind)


def compare_document(cmp: Comparison, figures: list[tuple[Path, str]] = (),
                     all_metrics: bool = False) -> list:
    """compare.md's and compare.html's content (:mod:`harmony.analysis.document`): the sources,
    the answers one column per source (the questions answered differently marked), each pair's
    metric differences with their intervals and effect sizes, then ``figures`` ((path, alt))."""
    src = df_sources(cmp)
    doc: list = [D.Heading("Policy cards compared", 1), D.Heading("Sources", 2, "sources"),
                 D.Table(["", "source", "what", "setup"],
                         [[row.letter, row.source, source_what(cmp, k, row), row.setup]
                          for k, row in enumerate(src.itertuples())])]
    table, differs = answers_table(cmp)
    questions = df_compare(cmp).drop_duplicates("qid").set_index("qid")["question"]
    doc += [D.Heading("Answers", 2, "answers"),
            D.Table(["", "#", "question"] + list(src["letter"]),
                    [["*" if differs[qid] else "", str(i), f"{questions[qid]} ({qid})",
                      *(_label_cell(card.answer(qid)) for card in cmp.cards)]
                     for i, qid in enumerate(table.index, 1)],
                    row_kinds=["differs" if differs[qid] else None for qid in table.index],
                    numeric=frozenset({"#"})),
            D.Para(answers_note(int(differs.sum()), len(table)))]
    lv = df_compare_levels(cmp)
    if len(lv):
        keys = list(dict.fromkeys(zip(lv["qid"], lv["level"])))
        doc += [D.Heading("Answers by level", 2, "levels"),
                D.Table(["", "question @ level"] + list(src["letter"]),
                        [["*" if lv[(lv["qid"] == q) & (lv["level"] == L)]["differs"].iloc[0]
                          else "", f"{q} @ {L}",
                          *map(_level_label_cell,
                              lv[(lv["qid"] == q) & (lv["level"] == L)]["label"])]
                         for q, L in keys])]
    pr = df_compare_predictions(cmp)
    if len(pr):
        keys = list(dict.fromkeys(zip(pr["check"], pr["level"])))
        doc += [D.Heading("Predictions from the kernel's domains", 2, "predictions"),
                D.Table(["check @ level"] + list(src["letter"]),
                        [[f"{c}" + (f" @ {L}" if L else ""),
                          *pr[(pr["check"] == c) & (pr["level"] == L)]["verdict"]]
                         for c, L in keys])]
    df = df_metric_differences(cmp)
    shown = _shown(df, all_metrics)
    doc += [D.Heading("Metrics", 2, "metrics"), D.Para(metrics_intro(cmp))]
    for _, d in shown.groupby("pair", sort=False):
        head, rows = metric_rows(d)
        doc.append(D.Heading(pair_title(d).rstrip(":"), 3))
        doc.append(D.Table(list(head), [list(r) for r in rows],
                           row_kinds=["differs" if r[0] == "*" else "apart" if r[0] == "?" else None
                                      for r in rows],
                           numeric=frozenset(head[3:7])))
    if shown.empty:
        doc.append(D.Para(NO_COMMON))
    notes = unmatched(cmp) + ([hidden_note(len(df) - len(shown))] if len(df) > len(shown) else [])
    if notes:
        doc.append(D.Bullets(notes))
    doc.append(D.Para(metrics_footnote(df), "note"))
    if figures:
        doc.append(D.Heading("Figures", 2, "figures"))
        doc += [D.Figure(path, alt) for path, alt in figures]
    return doc


def write(cmp: Comparison, out, all_metrics: bool = False) -> list[Path]:
    """compare.md and compare.html (one document, :func:`compare_document`; the HTML stands
    alone, figures embedded), compare.json (:func:`to_dict`: sources, answers, every metric row),
    figures/compare.png (every run) and figures/differences.png (:func:`plot_differences`) into
    the directory ``out``; the paths written."""
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    diffs = df_metric_differences(cmp)
    fig = plot_compare(df_compare_runs(cmp), out / "figures" / "compare.png")
    forest = plot_differences(diffs, out / "figures" / "differences.png", all_metrics)
    figures = [(p, alt) for p, alt in ((forest, "the differences and their intervals"),
                                       (fig, "each source's runs")) if p is not None]
    doc = compare_document(cmp, figures, all_metrics)
    store.atomic_write(out / "compare.md", D.to_markdown(doc, out))
    store.atomic_write(out / "compare.html", D.to_html(doc, "Harmony: policy cards compared"))
    store.write_json(out / "compare.json", to_dict(cmp))
    return ([out / "compare.md", out / "compare.html", out / "compare.json"]
            + [f for f in (fig, forest) if f is not None])


def _letter(k: int) -> str:
    return chr(ord("A") + k) if k < 26 else f"S{k}"
