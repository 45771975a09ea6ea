"""Suite-efficiency benchmark: wall time of ``harmony suite --quick`` over the time it measures.

Runs ``harmony suite --quick --probe PROBE --out DIR`` once per repetition (``--probe``: tracefs,
the default, perf or pyperf), times it, then reads every run directory it wrote (every
``manifest.json`` under DIR, companions included) and adds up their
configured ``params.duration`` (and ``params.warm_s`` of a warm release: its tasks run as asked
before t0): the seconds the suite is asked to run its tasks. Efficiency = wall time /
that sum; 1.0 would mean no time at all spent spawning, analysing, plotting or waiting. Target
<= 1.10.

Then where the wall time went, from what the suite recorded: each run's ``timings_s`` (capture
steps; analysis steps, which run in parallel processes so their sum is CPU-process time, not
wall) and suite.json's phase ends (captured_s, analysed_s, wall_with_report_s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.workload.controller import warm_s  # noqa: E402


def harmony_cmd() -> list[str]:
    exe = common.console_script("harmony")
    return [exe] if exe else [sys.executable, "-m", "harmony.cli"]


def suite_exists() -> tuple[bool, str]:
    r = subprocess.run(harmony_cmd() + ["suite", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["no output"])[-1]
    if "--quick" not in r.stdout:
        return False, "`harmony suite` has no --quick option"
    return True, ""


def configured_seconds(out: Path) -> tuple[float, list[dict]]:
    """Sum of params.duration, plus params.warm_s for a warm release (its tasks run as asked for
    that long before t0), over every run directory under ``out``; and one row per run."""
    runs = []
    for m in sorted(out.rglob("manifest.json")):
        try:
            man = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        if "params" not in man:
            continue
        runs.append({"run": str(m.parent.relative_to(out)), "experiment": man.get("experiment"),
                     "duration": float(man["params"].get("duration", 0.0))
                     + (warm_s(man["params"]) or 0.0), "status": man.get("status")})
    return sum(r["duration"] for r in runs), runs


CAPTURE_STEPS = ("scheduler", "place", "counters", "cpusets", "fork", "held", "tasks_table",
                 "spawn", "probe_start", "release", "measure", "stop", "write")
ANALYSIS_STEPS = ("decode", "tables", "checks", "metrics", "figures")


def where_the_time_goes(out: Path, wall: float) -> list[list]:
    """Rows (phase, seconds, seconds per run) of one suite's wall time, from what it recorded."""
    suite = json.loads((out / "suite.json").read_text())
    mans = [json.loads(m.read_text()) for m in sorted(out.rglob("manifest.json"))]
    mans = [m for m in mans if "params" in m]
    n = len(mans) or 1
    configured = sum(float(m["params"]["duration"]) for m in mans)
    cap = {k: sum(m.get("timings_s", {}).get("capture", {}).get(k, 0.0) for m in mans)
           for k in CAPTURE_STEPS}
    ana = {k: sum((m.get("timings_s", {}).get("analysis", {}) | {"figures": m.get("timings_s", {})
                                                                .get("figures", 0.0)}).get(k, 0.0)
                  for m in mans) for k in ANALYSIS_STEPS}
    captured, analysed = (suite.get("captured_s", 0.0),
                          suite.get("analysed_s", suite.get("captured_s", 0.0)))
    reported = suite.get("wall_with_report_s", analysed)
    rows = [["configured durations", configured, configured / n],
            ["capture: measuring beyond the duration", cap["measure"] - configured,
             (cap["measure"] - configured) / n]]
    rows += [[f"capture: {k}", cap[k], cap[k] / n] for k in CAPTURE_STEPS if k != "measure"]
    rows.append(["between captures (batch files, experiment setup)", captured - sum(cap.values()),
                 (captured - sum(cap.values())) / n])
    rows.append([f"analysis, wall ({suite.get('analysis', '?')})", analysed - captured,
                 (analysed - captured) / n])
    # a background analyser stopped while runs are measured times its steps across those stops
    unit = "s, with stops" if "stopped" in suite.get("analysis", "") else "process-seconds"
    rows += [[f"  analysis: {k} ({unit})", ana[k], ana[k] / n] for k in ANALYSIS_STEPS]
    rows.append(["batch aggregates, policy card, report", reported - analysed, None])
    rows.append(["start-up and exit (imports, host facts, card print)", wall - reported, None])
    rows.append(["total wall", wall, wall / n])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1, help="repetitions (default %(default)s)")
    ap.add_argument("--probe", choices=("tracefs", "perf", "pyperf"), default="tracefs",
                    help="the probe the suite records with (default %(default)s)")
    ap.add_argument("--keep", type=Path, help="keep the suite's output under this directory")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    ok, why = suite_exists()
    if not ok:
        print(f"cannot measure: `harmony suite --quick` is not available yet ({why})",
              file=sys.stderr)
        common.emit_json(a.json, {"benchmark": "suite_efficiency", "available": False, "why": why})
        return 2
    common.need_root("the suite benchmark")

    results = []
    base = Path(a.keep or tempfile.mkdtemp(prefix="harmony-bench-suite-"))
    try:
        for rep in range(a.reps):
            out = base / f"suite-{rep}"
            for _ in range(60):
                t = time.monotonic()
                r = subprocess.run(harmony_cmd() + ["suite", "--quick", "--probe", a.probe,
                                                  "--out", str(out)],
                                   capture_output=True, text=True)
                wall = time.monotonic() - t
                if r.returncode == 0 or "another Harmony run" not in r.stderr:
                    break
                shutil.rmtree(out, ignore_errors=True)
                time.sleep(2)  # the host lock is held by another run: wait and start again
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                sys.exit(f"harmony suite --quick failed (exit {r.returncode}): {last}")
            total, runs = configured_seconds(out)
            if not runs:
                sys.exit(f"harmony suite --quick wrote no run directory under {out}")
            results.append({"wall_s": wall, "configured_s": total, "ratio": wall / total,
                            "runs": runs, "breakdown": where_the_time_goes(out, wall)})
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)

    last = results[-1]
    print(f"runs of the last repetition ({len(last['runs'])}):\n")
    common.table(["run", "experiment", "duration s", "status"],
                 [[r["run"], r["experiment"], r["duration"], r["status"]] for r in last["runs"]])
    print()
    common.table(["repetition", "wall s", "configured s", "wall / configured"],
                 [[i + 1, r["wall_s"], r["configured_s"], r["ratio"]]
                  for i, r in enumerate(results)])
    print("\nwhere the wall time of the last repetition went:\n")
    common.table(["phase", "s", "s per run"], last["breakdown"])
    ratio = common.median([r["ratio"] for r in results])
    print()
    print(common.verdict(f"suite wall time <= 1.10 x its configured durations (probe {a.probe})",
                         ratio <= 1.10,
                         f"median {ratio:.2f} over {len(results)} repetition(s)"))
    common.emit_json(a.json, {"benchmark": "suite_efficiency", "available": True, "ratio": ratio,
                              "probe": a.probe, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
