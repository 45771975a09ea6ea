"""Warm against cold release: how the answers to questions 2-4 change with the tasks' load history.

A cold release wakes tasks that slept at their start gate (PELT's load decayed: ~11 % of a
running task's at t0 here, bench/pelt_warmup.py); a warm one (the catalog's default) runs them
confined to their initial CPU for ``warm_s`` first, so a load-based balancer weighs them as the
running tasks they are (harmony/workload/controller.py). This script runs single-source,
time-to-resolve and how-many under both, interleaved (warm, cold, warm, cold...), each as a plain
``harmony run EXP -p release=R`` of this checkout, and prints per experiment and release the
medians of the metrics behind questions 2-4 and the policy card's answers to them
(``harmony infer`` on that release's runs alone).

``--harmony-args`` is passed to every ``harmony run``: the same comparison on a kernel under test
is ``--harmony-args "--kernel debian:6.1 --vm-cpus 4" --batched``, where ``--batched`` makes one
``harmony run --repeat N`` per experiment and release (one VM boot each) instead of N
interleaved runs. how-many's question needs 3 or more CPUs (on 2 both predictions are x/2); on 2 it
still shows how many tasks the first round moved against x/2. Needs root; every run takes the host
lock (a busy lock is waited for).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.analysis.policy import infer  # noqa: E402

EXPERIMENTS = ("single-source", "time-to-resolve", "how-many")
RELEASES = ("warm", "cold")
QUESTIONS = ("affinity", "how_many", "time_to_balance")
#: the summary keys shown per experiment (those behind questions 2-4)
METRICS = {
    "single-source": ("migrations", "balance_migrations", "first_balanced_s", "time_to_balance_s",
                      "migrations_after_balance_per_s", "share_ratio_min"),
    "time-to-resolve": ("migrations", "first_balanced_s", "time_to_balance_s", "balance_entries"),
    "how-many": ("first_round_moved", "poly_prediction", "pairwise_prediction", "rounds",
                 "moved_to_target", "time_to_balance_s"),
}
BUSY_EXIT_WAIT_S = 5


def harmony_run(exp: str, release: str, out: Path, duration: float, extra: list[str],
                params: list[str], repeat: int = 1) -> list[dict]:
    """One ``harmony run`` (``--repeat`` ``repeat``): the summary and the manifest facts shown of
    each of its runs, or the error."""
    cmd = [sys.executable, "-m", "harmony.cli", "run", exp, "-q", "--out", str(out),
           "-p", f"release={release}", "-p", f"duration={duration}", *params, *extra]
    if repeat > 1:
        cmd += ["--repeat", str(repeat)]
    for _ in range(120):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0 or "is using this host" not in (r.stderr + r.stdout):
            break
        time.sleep(BUSY_EXIT_WAIT_S)    # another run holds the host: wait, then again
    if r.returncode != 0:
        return [{"error": (r.stderr or r.stdout).strip().splitlines()[-1:], "dir": str(out)}]
    return [run_facts(d) for d in ([out] if repeat == 1 else sorted(out.glob("rep-*")))]


def run_facts(d: Path) -> dict:
    """What the tables show of one run directory."""
    m = json.loads((d / "manifest.json").read_text())
    s = json.loads((d / "summary.json").read_text())
    fl = (m.get("foreign_load") or {}).get("max_frac")
    system = m.get("under_test") or m["host"]       # a VM's kernel under test
    return {"summary": s, "foreign": fl, "kernel": system.get("kernel"),
            "scheduler": system.get("scheduler"), "ncpus": len(m["cpus"]),
            "spread_ms": (m["release"].get("release_spread_ns") or 0) / 1e6, "dir": str(d)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="runs per experiment and release")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS),
                    help="comma-separated (default: %(default)s)")
    ap.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every run as -p (e.g. x=20 for how-many)")
    ap.add_argument("--harmony-args", default="", help="more arguments for every `harmony run`")
    ap.add_argument("--batched", action="store_true",
                    help="one `harmony run --repeat REPS` per experiment and release (a kernel "
                         "under test: one boot each), not REPS interleaved runs")
    ap.add_argument("--out", type=Path, help="where the runs go (default: a new directory in /tmp)")
    ap.add_argument("--json", help="write the results as JSON (- = stdout)")
    a = ap.parse_args(argv)
    exps = [e for e in a.experiments.split(",") if e]
    unknown = sorted(set(exps) - set(EXPERIMENTS))
    if unknown:
        ap.error(f"unknown experiment(s) {', '.join(unknown)}: "
                 f"choose from {', '.join(EXPERIMENTS)}")
    out = a.out or Path(f"/tmp/harmony-warm-cold-{time.strftime('%Y%m%d-%H%M%S')}")
    extra = shlex.split(a.harmony_args)
    params = [x for p in a.param for x in ("-p", p)]
    results: dict = {e: {r: [] for r in RELEASES} for e in exps}
    rounds = [(None, a.reps)] if a.batched else [(rep, 1) for rep in range(1, a.reps + 1)]
    for rep, repeat in rounds:
        for exp in exps:
            for release in RELEASES:
                d = out / exp / release / (f"rep-{rep:02d}" if rep else "batch")
                for got in harmony_run(exp, release, d, a.duration, extra, params, repeat):
                    results[exp][release].append(got)
                    print(f"{Path(got['dir']).relative_to(out)}: "
                          + (got["error"][0] if "error" in got else "ok"), file=sys.stderr)
    first = next((g for e in exps for r in RELEASES for g in results[e][r] if "error" not in g),
                 None)
    if first is None:
        print("no run completed")
        return 1
    print(f"kernel {first['kernel']} ({first['scheduler']}), {first['ncpus']} CPUs; {a.reps} runs "
          f"of {a.duration:g} s per experiment and release; runs in {out}")
    cards = {}
    for release in RELEASES:
        dirs = [g["dir"] for e in exps for g in results[e][release] if "error" not in g]
        cards[release] = infer(dirs).to_dict() if dirs else None
    for exp in exps:
        print(f"\n{exp} (medians over the runs)")
        rows = []
        for key in METRICS[exp]:
            rows.append([key] + [common.median(g["summary"].get(key) for g in results[exp][r]
                                               if "error" not in g) for r in RELEASES])
        rows.append(["busy runs (foreign load > 5%)"] + [
            sum(1 for g in results[exp][r] if "error" not in g and (g["foreign"] or 0) > 0.05)
            for r in RELEASES])
        rows.append(["release spread (ms)"] + [
            common.median(g["spread_ms"] for g in results[exp][r] if "error" not in g)
            for r in RELEASES])
        common.table(["metric", *RELEASES], rows)
    print("\npolicy card (each release's runs alone)")
    rows = []
    for q in QUESTIONS:
        rows.append([q] + [next((x["label"] for x in c["answers"] if x["qid"] == q), None)
                           if c else None for c in (cards[r] for r in RELEASES)])
    common.table(["question", *RELEASES], rows)
    common.emit_json(a.json, {"out": str(out), "experiments": exps, "reps": a.reps,
                              "duration": a.duration, "harmony_args": extra, "params": a.param,
                              "results": results,
                              "cards": {r: c and {x["qid"]: x["label"] for x in c["answers"]}
                                        for r, c in cards.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
