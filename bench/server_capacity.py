"""What ``-p load=`` of the server experiment means here: the capacity it is a fraction of
(:func:`harmony.workload.serve.capacity`, from the per-hop overhead calibrated at the run's start)
against the capacity a real run reaches.

For each shape, ``harmony run server`` twice (alternating shapes, ``--reps`` times):

- overloaded: ``-p load=LOAD`` is refused at 1 and above, so the rate is given,
  ``--over`` x the capacity this script's own calibration predicts, with a client that never
  stops sending (``max_outstanding`` 10^7): the requests answered per second of the window are
  what the shape serves when it cannot keep up, its *measured capacity*;
- at ``--load`` (default 0.9) as a user runs it (the overhead calibrated at the start of the run,
  recorded in its manifest): how many of the requests offered it answered, and their p99.

Printed: each shape's calibrated overhead, its predicted capacity, the measured one and their
ratio (``-p load=`` means load x predicted/measured of the measured capacity), and what the run
at ``--load`` answered. Hold the measurement lock around it (it runs ``harmony run``).

    python bench/server_capacity.py [--shapes a,b] [--load 0.9] [--over 1.5] [--seconds 3]
                                    [--reps 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.experiments import get_experiment  # noqa: E402
from harmony.experiments.server import SHAPES  # noqa: E402
from harmony.workload import serve  # noqa: E402


def harmony_run(out: Path, seconds: float, *params: str) -> dict:
    """One ``harmony run server`` with ``params`` (``k=v``): its summary and parameters."""
    cmd = [sys.executable, "-m", "harmony.cli", "run", "server", "--duration", str(seconds),
           "--out", str(out), "-q"]
    for p in params:
        cmd += ["-p", p]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    if p.returncode != 0:
        raise SystemExit(f"harmony run failed: {p.stderr.strip()[-300:]}")
    m = json.loads((out / "manifest.json").read_text())
    return {"summary": json.loads((out / "summary.json").read_text()), "params": m["params"],
            "busy": m.get("foreign_load", {}).get("max_frac")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--over", type=float, default=1.5,
                    help="the overloaded runs' rate, x predicted")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    if set(shapes) - set(SHAPES):
        ap.error(f"--shapes: each one of {', '.join(SHAPES)}")
    if not 0 < args.load < 1 or args.over <= 1 or args.seconds < 1 or args.reps < 1:
        ap.error("--load in (0, 1), --over above 1, --seconds at least 1, --reps positive")
    exp = get_experiment("server")
    cpus = sorted(os.sched_getaffinity(0))
    results = {s: [] for s in shapes}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.reps):
            for shape in shapes:
                ovh = serve.measure_overhead(cpus)
                p = exp.resolve({"shape": shape, "overhead_ns": str(ovh), "rate": "1"}, cpus)
                predicted = serve.capacity(p, len(cpus))
                over = harmony_run(Path(tmp) / f"{shape}-over-{k}", args.seconds,
                                   f"shape={shape}", f"overhead_ns={ovh}",
                                   f"rate={args.over * predicted:.1f}", "max_outstanding=10000000")
                at = harmony_run(Path(tmp) / f"{shape}-load-{k}", args.seconds,
                                 f"shape={shape}", f"load={args.load}")
                results[shape].append({"overhead_ns": ovh, "predicted_rps": predicted,
                                       "measured_rps": over["summary"]["throughput_rps"],
                                       "over_busy": over["busy"], "at_load": at})
                print(f"  {shape} {k + 1}/{args.reps} done", file=sys.stderr)
    rows = []
    for shape, rs in results.items():
        med = {key: common.median([r[key] for r in rs]) for key in
               ("overhead_ns", "predicted_rps", "measured_rps")}
        s = [r["at_load"]["summary"] for r in rs]
        offered = common.median([x["rate_rps"] for x in s])
        answered = common.median([x["throughput_rps"] for x in s])
        rows.append([shape, med["overhead_ns"] / 1e3, med["predicted_rps"], med["measured_rps"],
                     med["predicted_rps"] / med["measured_rps"],
                     common.median([r["at_load"]["params"]["overhead_ns"] for r in rs]) / 1e3,
                     offered, offered / med["measured_rps"], answered / offered,
                     common.median([x["latency_p99_ms"] or float("inf") for x in s]),
                     sum(bool(x["overloaded"]) for x in s)])
    print(f"\n{len(cpus)} CPUs, {args.seconds:g} s a run, {args.reps} repetition(s); medians")
    common.table(["shape", "ovh us", "predicted/s", "measured/s", "pred/meas",
                  "run ovh us", f"offered/s @{args.load:g}", "offered/measured",
                  "answered/offered", "p99 ms", "overloaded"], rows)
    common.emit_json(args.json, {"args": vars(args), "cpus": cpus, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
