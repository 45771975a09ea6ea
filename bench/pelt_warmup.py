"""PELT warm-up benchmark: how long a warm release must run the tasks before t0.

A load-based balancer (CFS and EEVDF share one) weighs each task by its PELT load, an average of
the time it was runnable that halves every 32 ms of history. Harmony's cold release wakes tasks
that slept at their start gate, so their load has decayed; its warm release runs them confined to
their initial CPU for ``warm_s`` before t0 (harmony/workload/controller.py). This script measures,
with Harmony's own controller, each task's ``se.avg.load_avg``, ``se.avg.runnable_avg`` and
``se.avg.util_avg`` from /proc/PID/sched:

- warm: sampled through a long warm-up (``--warm``, 1 s); the converged value is the median of
  its last fifth; the time to within 1 % is the first sample after which the signal stays within
  1 % of it (util_avg, of a task sharing its CPU with others, swings by more than 1 % as their
  slices alternate: its swing is reported instead);
- cold: the same tasks held at their gate as long as a run holds them (``--gate``, 0.1 s: spawn to
  release in a capture), woken at t0, sampled at once: the fraction of the converged load the
  balancer sees at t0.

The verdict: the catalog's default warm_s (experiments/base.py WARM_S) is at least the longest
time to within 1 % measured. Needs root; takes the host lock.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.core.osutil import online_cpus  # noqa: E402
from harmony.experiments.base import WARM_S  # noqa: E402
from harmony.workload.controller import Workload  # noqa: E402
from harmony.workload.tasks import layout_tasks  # noqa: E402

SIGNALS = ("load_avg", "runnable_avg", "util_avg")
_FIELD = re.compile(r"^se\.avg\.(load_avg|runnable_avg|util_avg)\s*:\s*(\d+)", re.M)


def read_pelt(pid: int) -> dict | None:
    """The task's PELT signals from /proc/PID/sched (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/sched").read_text()
    except OSError:
        return None
    return {k: int(v) for k, v in _FIELD.findall(text)}


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def sample(pids, until_ns: int, every_s: float, start_ns: int) -> list[tuple[float, int, dict]]:
    """(s after start_ns, task index, signals) every ``every_s`` until ``until_ns``."""
    out = []
    while now() < until_ns:
        for i, pid in enumerate(pids):
            got = read_pelt(pid)
            if got:
                out.append(((now() - start_ns) / 1e9, i, got))
        time.sleep(every_s)
    return out


def converge(samples, ntasks: int, band: float = 0.01) -> dict:
    """Per signal: the converged value (median of the last fifth, median over tasks), the time
    each task's signal stayed within ``band`` of its own from (max over tasks), its swing in the
    last fifth (max - min over the value, max over tasks)."""
    end = max(t for t, _, _ in samples)
    out = {}
    for sig in SIGNALS:
        finals, times, swings = [], [], []
        for i in range(ntasks):
            series = [(t, s[sig]) for t, k, s in samples if k == i and sig in s]
            tail = [v for t, v in series if t >= 0.8 * end]
            if not tail:
                continue
            final = statistics.median(tail)
            finals.append(final)
            swings.append((max(tail) - min(tail)) / final if final else 0.0)
            outside = [t for t, v in series if abs(v - final) > band * final]
            times.append(max(outside) if outside else 0.0)
        out[sig] = {"final": common.median(finals), "within_1pct_s": max(times) if times else None,
                    "swing": max(swings) if swings else None}
    return out


def one(specs, cpus, warm: float | None, gate_s: float, every_s: float, span_s: float):
    """One workload: warm (sampled through the warm-up) or cold (sampled after t0)."""
    with Workload(specs, cpus, warm_s=warm) as w:
        w.spawn()
        marks: dict = {}

        def mark(text):
            marks[text] = now()
            return marks[text]

        if warm is not None:
            releaser = threading.Thread(target=w.release, args=(mark,))
            start = now()
            releaser.start()
            got = sample(w.pids, start + int(warm * 1e9), every_s, start)
            releaser.join()
            return got
        time.sleep(gate_s)
        w.release(mark)
        t0 = marks["harmony t0"]
        return sample(w.pids, t0 + int(span_s * 1e9), every_s, t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, help="tasks on the first CPU (default 2P)")
    ap.add_argument("--warm", type=float, default=1.0, help="warm-up sampled (s)")
    ap.add_argument("--gate", type=float, default=0.1, help="cold: time held at the gate (s)")
    ap.add_argument("--every", type=float, default=0.002, help="sampling interval (s)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the results as JSON (- = stdout)")
    a = ap.parse_args(argv)
    cpus = online_cpus()
    n = a.tasks or 2 * len(cpus)
    specs = layout_tasks([n] + [0] * (len(cpus) - 1), cpus)
    lock = common.host_lock()  # no Harmony run may share the CPUs with this measurement
    rows, reps = [], []
    try:
        for rep in range(a.reps):
            warm = converge(one(specs, cpus, a.warm, a.gate, a.every, 0), n)
            cold = one(specs, cpus, None, a.gate, a.every, 0.02)
            first = {sig: common.median([s[sig] for t, _, s in cold if t <= 0.005 and sig in s])
                     for sig in SIGNALS}
            reps.append({"warm": warm, "cold_at_t0": first})
            for sig in SIGNALS:
                w = warm[sig]
                rows.append([f"rep {rep + 1} {sig}", w["final"], w["within_1pct_s"], w["swing"],
                             first[sig], first[sig] / w["final"] if w["final"] else None])
    finally:
        lock.release()
    print(f"{n} tasks on CPU {cpus[0]} of {len(cpus)}; warm-up sampled {a.warm} s every "
          f"{a.every * 1000:g} ms; cold: held {a.gate} s at the gate")
    common.table(["signal", "converged", "within 1% after (s)", "swing (last fifth)",
                  "cold at t0", "cold / converged"], rows)
    worst = max((r["warm"][s]["within_1pct_s"] for r in reps for s in ("load_avg", "runnable_avg")
                 if r["warm"][s]["within_1pct_s"] is not None), default=None)
    print(common.verdict("default warm_s covers PELT's convergence",
                         None if worst is None else worst <= WARM_S,
                         f"load_avg and runnable_avg within 1% after {worst:.3f} s at most; "
                         f"WARM_S = {WARM_S} s"))
    common.emit_json(a.json, {"tasks": n, "cpus": cpus, "warm_s": a.warm, "gate_s": a.gate,
                              "reps": reps, "worst_within_1pct_s": worst, "default_warm_s": WARM_S})
    return 0


if __name__ == "__main__":
    sys.exit(main())
