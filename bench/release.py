"""Release benchmark: how nearly at once the controller makes N tasks runnable at t0.

Each repetition is a real ``single-source`` run (layout N,0: every task held on the first CPU,
released to the whole set at t0) recorded with the tracefs probe; the spread is read from its
trace by ``harmony.analysis.release.release_spread`` (manifest ``release``):

- wake spread: first to last task's first wake-up after the "harmony t0" marker
- release spread: first wake-up to the "harmony released" marker, written after the last task was
  freed to the whole CPU set (the last cpuset write, or the last sched_setaffinity on the
  fallback): an upper bound of the window in which the layout was not yet what the scheduler sees

Also from the trace: tasks whose first wake-up after t0 was not on their initial CPU ("woke off";
should be 0: the layout exists at t0) and migrations of tasks before "released" ("moved").

Target: release spread < 1 ms at 256 tasks. Sizes run interleaved (8, 64, 256, 8, 64, ...);
``--placement cpuset,affinity`` also interleaves the controller's two ways of holding the tasks
(``HARMONY_RELEASE_PLACEMENT``), ``--mode occupied,confined`` its two orders of release
(``HARMONY_RELEASE_MODE``; see ``harmony/workload/controller.py``). Every run is a cold release
(``-p release=cold``: the tasks asleep at their gate, then woken), which is what a spread of
wake-ups measures; a warm release widens the CPU set of tasks already running (bench/warm_cold.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def one_release(ntasks: int, out: Path, duration: float, placement: str, mode: str) -> dict:
    from harmony.core.osutil import online_cpus
    from harmony.experiments import get_experiment
    from harmony.hygiene import HostBusy
    from harmony.run import execute
    from harmony.workload.controller import ENV_MODE, ENV_PLACEMENT

    exp = get_experiment("single-source")
    cpus = online_cpus()
    params = exp.resolve({"layout": [ntasks] + [0] * (len(cpus) - 1), "duration": duration,
                          "sample_hz": 0.0, "release": "cold"}, cpus)
    os.environ[ENV_PLACEMENT], os.environ[ENV_MODE] = placement, mode
    try:
        for _ in range(60):
            try:
                run = execute(exp, params, cpus, out, quiet=True)
                m = run.manifest
                return m["release"] | {"notes": m.get("controller_notes", []),
                                       "method": f"{m.get('release_method')}/"
                                                 f"{m.get('release_mode')}",
                                       "foreign_load": _foreign_share(m.get("foreign_load"))}
            except HostBusy:
                time.sleep(2)  # another run holds the host lock
    finally:
        del os.environ[ENV_PLACEMENT], os.environ[ENV_MODE]
    sys.exit("another Harmony run held the host lock for two minutes")


def _foreign_share(foreign) -> float | None:
    """The run's foreign load: the busiest CPU's share of time running other programs' tasks."""
    return foreign.get("max_frac") if isinstance(foreign, dict) else None


def main(argv=None) -> int:
    from harmony.workload.controller import MODES, PLACEMENTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="8,64,256",
                    help="task counts, comma-separated (default %(default)s)")
    ap.add_argument("--placement", default="auto",
                    help=f"comma-separated: {', '.join(PLACEMENTS)} (default %(default)s)")
    ap.add_argument("--mode", default="auto",
                    help=f"comma-separated: {', '.join(MODES)} (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per count (default %(default)s)")
    ap.add_argument("--duration", type=float, default=0.3, help="seconds each run lasts after t0")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    try:
        counts = [int(x) for x in a.tasks.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--tasks: not a list of integers: {a.tasks!r}")
    if not counts or min(counts) < 1 or a.reps < 1 or a.duration <= 0:
        ap.error("--tasks, --reps and --duration must be positive")
    placements = [x.strip() for x in a.placement.split(",") if x.strip()]
    if not placements or set(placements) - set(PLACEMENTS):
        ap.error(f"--placement: not a list of {', '.join(PLACEMENTS)}: {a.placement!r}")
    modes = [x.strip() for x in a.mode.split(",") if x.strip()]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--mode: not a list of {', '.join(MODES)}: {a.mode!r}")
    common.need_root("the release benchmark")

    ways = [(pl, mo) for pl in placements for mo in modes]
    got: dict[tuple[tuple[str, str], int], list[dict]] = {(w, n): [] for n in counts for w in ways}
    with tempfile.TemporaryDirectory(prefix="harmony-bench-release-") as tmp:
        for rep in range(a.reps):
            for n in counts:
                for pl, mo in ways:
                    got[(pl, mo), n].append(one_release(n, Path(tmp) / f"{pl}-{mo}-n{n}-r{rep}",
                                                        a.duration, pl, mo))
    rows, results = [], []
    for (way, n), rs in got.items():
        rel = common.median([r["release_spread_ns"] for r in rs]) / 1e6
        wake = common.median([r["wake_spread_ns"] for r in rs]) / 1e6
        worst = max(r["release_spread_ns"] or 0 for r in rs) / 1e6
        first = common.median([r["first_wakeup_after_t0_ns"] for r in rs]) / 1e3
        missing = sum(len(r["not_woken"]) for r in rs)
        loads = [r["foreign_load"] for r in rs if r["foreign_load"] is not None]
        foreign = 100 * max(loads) if loads else float("nan")
        off = sum(len(r.get("woke_off_initial_cpu") or []) for r in rs)
        moved = sum(r.get("moved_before_released") or 0 for r in rs)
        method = ",".join(sorted({str(r["method"]) for r in rs}))
        rows.append([n, method, rel, worst, wake, first, missing, off, moved, foreign])
        results.append({"tasks": n, "way": way, "method": method, "release_spread_ms": rel,
                        "release_spread_worst_ms": worst, "wake_spread_ms": wake,
                        "first_wakeup_after_t0_us": first, "not_woken": missing, "woke_off": off,
                        "moved_before_released": moved, "foreign_load_max_pct": foreign,
                        "runs": [{k: v for k, v in r.items() if k != "not_woken"} for r in rs]})
    print(f"{a.reps} runs per count, medians (worst: the largest of the runs; not woken, woke off "
          f"and moved: totals over the runs)\n")
    common.table(["tasks", "method", "release ms", "worst ms", "wake-ups ms", "t0->first wake us",
                  "not woken", "woke off", "moved", "foreign max %"], rows)
    notes = sorted({nt for rs in got.values() for r in rs for nt in r["notes"]})
    for nt in notes:
        print(f"note: {nt}")
    print()
    top = max(counts)
    for way in ways:
        big = next(r for r in results if r["way"] == way and r["tasks"] == top)
        detail = (f"median {big['release_spread_ms']:.3f} ms, "
                  f"worst {big['release_spread_worst_ms']:.3f} ms")
        print(common.verdict(f"release spread < 1 ms at {top} tasks ({big['method']})",
                             big["release_spread_ms"] < 1.0, detail))
    common.emit_json(a.json, {"benchmark": "release", "reps": a.reps, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
