"""schbench cross-check (issue 27, item 5): the server experiment's latencies beside schbench's own,
for a configuration both can express.

The configuration: one dispatcher handing requests to a pool of W workers, each request a fixed
CPU work, at R requests per second.

- schbench (github.com/masoncl/schbench; ``make`` builds it): ``-m 1 -t W -R R -L -n OPS -F KB``:
  one message thread, W workers, R requests per second, no per-CPU lock around the work, OPS
  matrix multiplications over a KB cache footprint per request. It reports the *request latency*
  (a worker's start of a request to its end: the work and the preemptions in it) and the *wakeup
  latency* (the message thread's post to the worker running), percentiles 20/50/90/99/99.9 (its
  own histogram buckets).
- Harmony: ``server -p shape=pool-per-stage -p stages=1 -p pool=W -p sizes=fixed -p work_us=X
  -p rate=R``, X being the work schbench's own calibration (``-C``, no sleep, one worker) measured
  for OPS and KB. The same two latencies are read from the stage records (harmony.workload.serve): a
  worker's stage record end - start (request latency), and its start - the reader's hand-over to
  the stage pipe (wakeup latency: it also holds the wait in the pipe behind busy workers, where
  schbench queues on the worker).

What differs, and stays different: schbench posts each second's requests in one burst, then
sleeps until the next second; Harmony's arrivals are Poisson. schbench's work touches a cache
footprint; Harmony's burns CPU time in a loop. Runs alternate (schbench, Harmony, ...) and each
figure is the median over ``--reps``.

    python bench/schbench.py --schbench /path/to/schbench [--rps 2000] [--workers 2] [--ops 5]
                             [--footprint 256] [--seconds 3] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.analysis import requests as req  # noqa: E402
from harmony.workload import serve  # noqa: E402

QUANTILES = (50.0, 90.0, 99.0, 99.9)


def schbench_json(binary: str, args: list[str], seconds: float) -> dict:
    """Run schbench with ``args`` for ``seconds`` holding Harmony's host lock (as a ``harmony
    run`` does: neither disturbs the other); its JSON output as {key: value}."""
    lock = common.host_lock(tries=300)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            p = subprocess.run([binary, *args, "-r", str(int(seconds)), "-j", f.name],
                               capture_output=True, text=True, timeout=seconds + 60)
            if p.returncode != 0:
                raise SystemExit(f"schbench failed ({p.returncode}): {p.stderr.strip()[-300:]}")
            text = Path(f.name).read_text()
    finally:
        lock.release()
    return {k: float(v)
            for k, v in re.findall(r'"([a-z_]+_pct[0-9.]+|[a-z_]+_(?:min|max))": ([0-9.]+)', text)}


def percentiles(kind: str, got: dict) -> list[float]:
    """schbench's ``kind`` (request_latency, wakeup_latency) percentiles, us."""
    return [got.get(f"{kind}_pct{q:.1f}", float("nan")) for q in QUANTILES]


def harmony_run(args, work_us: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "harmony.cli", "run", "server", "-p", "shape=pool-per-stage",
           "-p", "stages=1", "-p", f"pool={args.workers}", "-p", "sizes=fixed", "-p",
           f"work_us={work_us:.1f}", "-p", f"rate={args.rps}", "--duration", str(args.seconds),
           "--out", str(out), "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 300)
    if p.returncode != 0:
        raise SystemExit(f"harmony run failed: {p.stderr.strip()[-300:]}")
    records = out / "raw" / req.RECORDS_DIR
    st = np.concatenate([req.read_records(f) for f in records.glob("*" + serve.STAGE_SUFFIX)])
    m = json.loads((out / "manifest.json").read_text())
    st = st[(st[:, 3] >= m["t0_ns"]) & (st[:, 4] <= m["end_ns"])]
    handed = {int(r[0]): int(r[4]) for r in st[st[:, 1] == 0]}      # the reader's hand-over
    work = st[st[:, 1] == 1]
    service = (work[:, 4] - work[:, 3]) / 1e3
    wake = np.array([r[3] - handed[int(r[0])] for r in work if int(r[0]) in handed]) / 1e3
    s = json.loads((out / "summary.json").read_text())
    return {"request": [float(np.quantile(service, q / 100)) for q in QUANTILES],
            "wakeup": [float(np.quantile(wake, q / 100)) for q in QUANTILES],
            "end_to_end": [s[k] * 1e3 if s[k] is not None else float("nan")
                           for k in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
                                     "latency_p999_ms")],
            "served": int(len(work)), "throughput_rps": s["throughput_rps"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schbench", help="the schbench binary (required)")
    ap.add_argument("--rps", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--ops", type=int, default=5,
                    help="schbench -n: matrix multiplications a request")
    ap.add_argument("--footprint", type=int, default=256, help="schbench -F: cache footprint (KB)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not args.schbench or not os.access(args.schbench, os.X_OK):
        ap.error(f"--schbench {args.schbench}: not an executable")
    if args.rps <= 0 or args.workers <= 0 or args.reps <= 0 or args.seconds < 2:
        ap.error("--rps, --workers and --reps must be positive, --seconds at least 2")
    work = ["-n", str(args.ops), "-F", str(args.footprint)]
    cal = schbench_json(args.schbench, ["-C", "-L", "-m", "1", "-t", "1", *work], 2)
    work_us = percentiles("request_latency", cal)[0]
    print(f"schbench calibration: a request of {args.ops} ops over {args.footprint} KB takes "
          f"{work_us:.0f} us (p50); Harmony's work_us = {work_us:.0f}, sizes fixed")
    sb, hm = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.reps):
            got = schbench_json(args.schbench, ["-L", "-m", "1", "-t", str(args.workers), "-R",
                                                str(args.rps), *work, "-w", "1"], args.seconds + 1)
            sb.append({"request": percentiles("request_latency", got),
                       "wakeup": percentiles("wakeup_latency", got)})
            hm.append(harmony_run(args, work_us, Path(tmp) / f"h{k}"))
            print(f"  repetition {k + 1}/{args.reps} done", file=sys.stderr)
    rows = []
    for kind in ("request", "wakeup"):
        for i, q in enumerate(QUANTILES):
            a = common.median([r[kind][i] for r in sb])
            b = common.median([r[kind][i] for r in hm])
            rows.append([f"{kind} latency p{q:g} (us)", a, b, b / a if a else float("nan")])
    for i, q in enumerate(QUANTILES):
        rows.append([f"end-to-end p{q:g} (us, Harmony only)", None,
                     common.median([r["end_to_end"][i] for r in hm]), None])
    print(f"\n{args.workers} workers, {args.rps} requests/s, {args.seconds:g} s x {args.reps} "
          f"(medians of the repetitions)")
    common.table(["", "schbench", "harmony", "harmony/schbench"], rows)
    common.emit_json(args.json, {"args": vars(args), "work_us": work_us, "schbench": sb,
                                 "harmony": hm, "quantiles": QUANTILES})
    return 0


if __name__ == "__main__":
    sys.exit(main())
