"""Statistics over repetitions: median, interquartile range and a bootstrap 95% confidence interval;
and between two sets of repetitions (``harmony compare``): the difference of their medians with a
bootstrap interval (:func:`bootstrap_diff_ci`) and Cliff's delta as the effect size
(:func:`cliffs_delta`; why that one: :mod:`harmony.analysis.thresholds`, ``COMPARE_*``).

The thesis ran 10-25 runs per configuration and reported medians, maxima and every run as a point;
these helpers give the same numbers for any list of per-run values. None / NaN values (a metric
not measurable in that run) are left out and counted, never silently turned into zeros.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: Bootstrap resamples. 2000 keeps the 2.5/97.5 percentiles stable to about 1% of the spread.
BOOTSTRAP_RESAMPLES = 2000
#: The seed every bootstrap here draws from unless told otherwise: an interval printed twice (a
#: report regenerated, a comparison run again) is the same interval.
BOOTSTRAP_SEED = 0


def clean(values) -> np.ndarray:
    """The numbers of ``values`` as a float array: None, NaN and non-numbers (str, list, dict) left
    out; booleans count as 0/1."""
    out = []
    for v in values:
        if v is None or isinstance(v, (str, list, dict)):
            continue
        f = float(v)
        if not math.isnan(f):
            out.append(f)
    return np.asarray(out, dtype=np.float64)


def bootstrap_ci(values, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float | None, float | None]:
    """Percentile bootstrap confidence interval of the median of ``values``.

    Returns (low, high); (None, None) with fewer than 2 values, where no interval exists.
    Deterministic for a given ``seed`` so a report does not change when regenerated.
    """
    x = clean(values)
    if len(x) < 2:
        return None, None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    medians = np.median(x[idx], axis=1)
    a = (1 - level) / 2
    return float(np.quantile(medians, a)), float(np.quantile(medians, 1 - a))


def bootstrap_diff_ci(a, b, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> tuple[float | None, float | None]:
    """Percentile bootstrap confidence interval of ``median(b) - median(a)``.

    Each resample draws len(a) values of ``a`` and len(b) of ``b`` with replacement, each set
    within itself (the runs of one source are never mixed with the other's), and takes the
    difference of the two medians; the interval is the (1 - level)/2 and (1 + level)/2 quantiles
    of ``resamples`` such differences. Returns (low, high); (None, None) when either side has fewer
    than 2 values. Deterministic for a given ``seed``.

    With few values the interval is only the range of the differences the runs allow (2 runs a
    side: from the largest of ``a`` to the smallest of ``b`` and back): it excludes 0 whenever the
    two sets do not overlap, which 2 runs a side do by chance a third of the time. Hence the
    minimum number of runs (``thresholds.COMPARE_MIN_RUNS``) before a difference is marked.
    """
    x, y = clean(a), clean(b)
    if len(x) < 2 or len(y) < 2:
        return None, None
    rng = np.random.default_rng(seed)
    mx = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    my = np.median(y[rng.integers(0, len(y), size=(resamples, len(y)))], axis=1)
    q = (1 - level) / 2
    lo, hi = np.quantile(my - mx, [q, 1 - q])
    return float(lo), float(hi)


def cliffs_delta(a, b) -> float | None:
    """Cliff's delta of ``b`` against ``a``: P(b > a) - P(b < a) over every pair of one value of
    each, from -1 (every b below every a) through 0 (as often above as below) to +1 (every b above
    every a). Rank-based: no assumption of normality, and a single outlier run moves it by at most
    1 / (len(a) * len(b)) per pair. None when either side has no value."""
    x, y = clean(a), clean(b)
    if not len(x) or not len(y):
        return None
    return float(np.sign(y[:, None] - x[None, :]).mean())


def describe(values) -> dict:
    """Summary of one metric over repetitions.

    Returns a dict: n (values used), missing (None/NaN values left out), median, q1, q3, iqr,
    min, max, ci_low, ci_high (bootstrap 95% CI of the median), values (the used values, in
    order). Numbers are None when there is no value.
    """
    raw = list(values)
    x = clean(raw)
    out = {"n": int(len(x)), "missing": int(len(raw) - len(x))}
    if not len(x):
        return out | {k: None for k in ("median", "q1", "q3", "iqr", "min", "max", "ci_low",
                                        "ci_high")} \
            | {"values": []}
    q1, med, q3 = (float(v) for v in np.quantile(x, [0.25, 0.5, 0.75]))
    lo, hi = bootstrap_ci(x)
    return out | {"median": med, "q1": q1, "q3": q3, "iqr": q3 - q1, "min": float(x.min()),
                  "max": float(x.max()), "ci_low": lo, "ci_high": hi, "values": x.tolist()}


def is_metric(value) -> bool:
    """Whether a summary value is a number (bool counts: it aggregates as a fraction true)."""
    return value is None or isinstance(value, (bool, int, float, np.integer, np.floating))


def df_aggregate(summaries: list[dict]) -> pd.DataFrame:
    """Every numeric summary key across repetitions, one row per key.

    Needs: the summary dicts of the repetitions (summary.json). Keys whose values are not numbers
    (lists, strings, dicts) in some repetition are skipped; booleans count as 0/1, so their
    median is a majority vote and ``mean`` the fraction true.

    Columns: metric (str), n, missing (int), median, q1, q3, iqr, min, max, ci_low, ci_high,
    mean (float or None).
    """
    keys: list[str] = []
    for s in summaries:
        keys += [k for k in s if k not in keys]
    rows = []
    for k in keys:
        vals = [s.get(k) for s in summaries]
        if not all(is_metric(v) for v in vals) or all(v is None for v in vals):
            continue
        d = describe(vals)
        d.pop("values")
        x = clean(vals)
        rows.append({"metric": k, **d, "mean": float(x.mean()) if len(x) else None})
    return pd.DataFrame(rows, columns=["metric", "n", "missing", "median", "q1", "q3", "iqr", "min",
                                       "max", "ci_low", "ci_high", "mean"])
