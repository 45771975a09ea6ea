"""How often `harmony compare` marks a difference where there is none: the chance rate of its rule.

Two sources that do not differ should be marked "differs beyond noise" on few metrics. This
measures how few, two ways, and prints the fraction marked (the rule of
``harmony.analysis.compare.runs_difference``; thresholds ``COMPARE_*``):

- draws: both sides drawn from one distribution (normal, and log-normal for a long tail, as
  latencies have), ``--trials`` times at each number of runs a side in ``--sizes``. Also the
  fraction whose interval alone excludes 0, to show what the effect size and the minimum number
  of runs add.
- simulated (``--suites K``): K quick suites of one reference policy (``harmony simulate``, other
  seeds), every pair of them compared: the marked fraction of the metric rows whose runs vary
  (two constants cannot be marked by chance).

Target: at every size of at least ``COMPARE_MIN_RUNS`` runs a side, at most 1 - COMPARE_LEVEL
(5%) marked, within two standard errors of the trials. Nothing here needs root: the simulated
suites run in the simulator.
"""

from __future__ import annotations

import argparse
import itertools
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.analysis import compare as cmp_mod  # noqa: E402
from harmony.analysis import thresholds as T  # noqa: E402


def draws(sizes: list[int], trials: int, seed: int) -> list[dict]:
    """The chance rate on draws from one distribution, per distribution and size."""
    rng = np.random.default_rng(seed)
    out = []
    for dist, draw in (("normal", lambda n: rng.normal(0.0, 1.0, n)),
                       ("log-normal", lambda n: rng.lognormal(0.0, 1.0, n))):
        for n in sizes:
            rows = [cmp_mod.runs_difference(draw(n), draw(n)) for _ in range(trials)]
            excludes = sum(not math.isnan(r["ci_low"]) and (r["ci_low"] > 0 or r["ci_high"] < 0)
                           for r in rows)
            out.append({"distribution": dist, "runs": n, "trials": trials,
                        "interval_excludes_0": excludes / trials,
                        "apart": sum(r["apart"] for r in rows) / trials,
                        "marked": sum(r["differs"] for r in rows) / trials})
    return out


def simulated(suites: int, policy: str, cpus: int, repeat: int, experiment: str | None,
              workdir: Path) -> dict:
    """The chance rate between simulated suites of one policy with different seeds."""
    dirs = []
    for k in range(suites):
        out = workdir / f"{policy}-{k}"
        what = ["--experiment", experiment] if experiment else ["--suite", "--quick"]
        subprocess.run([sys.executable, "-m", "harmony.cli", "simulate", "--policy", policy,
                        "--ncpus", str(cpus), *what, "--repeat", str(repeat),
                        "--seed", str(1000 * (k + 1)), "--out", str(out)],
                       check=True, capture_output=True, text=True)
        dirs.append(out)
    varying = marked = 0
    pairs = []
    for a, b in itertools.combinations(dirs, 2):
        df = cmp_mod.df_metric_differences(cmp_mod.compare([a, b]))
        rows = df[df["verdict"].isin(["differs", "within noise"]) & (df["ci_low"] != df["ci_high"])]
        pairs.append({"a": a.name, "b": b.name, "varying": len(rows),
                      "marked": int(rows["differs"].sum()),
                      "metrics": sorted(set(rows.loc[rows["differs"], "metric"]))})
        varying += len(rows)
        marked += int(rows["differs"].sum())
    return {"policy": policy, "cpus": cpus, "repeat": repeat, "suites": suites, "pairs": pairs,
            "varying": varying, "marked": marked,
            "rate": marked / varying if varying else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2,3,4,5,8,10",
                    help="runs a side to draw (comma-separated; default %(default)s)")
    ap.add_argument("--trials", type=int, default=400, help="draws per size (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--suites", type=int, default=0,
                    help="simulated suites of one policy to compare pairwise (0: none; 4 takes "
                         "~1 min)")
    ap.add_argument("--policy", default="poly-balance", help="their reference policy")
    ap.add_argument("--cpus", type=int, default=4, help="their simulated CPUs")
    ap.add_argument("--repeat", type=int, default=5, help="their runs per configuration")
    ap.add_argument("--experiment", help="simulate this experiment only (default: the quick suite)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON (- = stdout)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: not a list of integers")
    if not sizes or min(sizes) < 2 or args.trials < 1 or args.suites < 0:
        ap.error("--sizes needs integers >= 2, --trials >= 1, --suites >= 0")

    res = {"draws": draws(sizes, args.trials, args.seed)}
    print(f"rule: interval ({T.COMPARE_LEVEL:.0%}) excludes 0, |Cliff's delta| >= "
          f"{T.COMPARE_EFFECT_LARGE}, shift > {T.COMPARE_MIN_RELATIVE:.0%}, >= "
          f"{T.COMPARE_MIN_RUNS} runs a side\n")
    common.table(["distribution", "runs a side", "trials", "interval excludes 0", "apart",
                  "marked"],
                 [[r["distribution"], r["runs"], r["trials"], r["interval_excludes_0"],
                   r["apart"], r["marked"]] for r in res["draws"]])
    verdicts = []
    limit = 1 - T.COMPARE_LEVEL
    for r in res["draws"]:
        if r["runs"] < T.COMPARE_MIN_RUNS:
            continue
        se = math.sqrt(limit * (1 - limit) / r["trials"])
        verdicts.append(common.verdict(
            f"chance marks, {r['distribution']}, {r['runs']} runs a side",
            r["marked"] <= limit + 2 * se,
            f"{r['marked']:.1%} (target <= {limit:.0%} + 2 standard errors = "
            f"{limit + 2 * se:.1%})"))
    if args.suites:
        with tempfile.TemporaryDirectory(prefix="harmony-compare-noise-") as work:
            sim = simulated(args.suites, args.policy, args.cpus, args.repeat, args.experiment,
                            Path(work))
        res["simulated"] = sim
        print(f"\nsimulated: {args.suites} suites of {args.policy} on {args.cpus} CPUs, "
              f"{args.repeat} runs a configuration, compared pairwise")
        common.table(["pair", "varying rows", "marked", "metrics marked"],
                     [[f"{p['a']} / {p['b']}", p["varying"], p["marked"],
                       ", ".join(p["metrics"]) or "-"] for p in sim["pairs"]])
        if sim["varying"]:
            print(f"in all: {sim['marked']} of {sim['varying']} varying rows marked "
                  f"({sim['rate']:.1%}; harmony compare states {T.COMPARE_CHANCE_RATE:.0%})")
    print()
    for v in verdicts:
        print(v)
    common.emit_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
