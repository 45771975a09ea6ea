"""The migrations' causes against the kernel's per-domain counts (``analysis/counters.py``).

For every run under the given directories that read /proc/schedstat (a kernel with
CONFIG_SCHEDSTATS: Debian's 6.1 and 6.12 in a VM), the moves are classified again from the
run's events with this checkout's code (``causes.df_all_moves``,
``counters.schedstat_agreement``) and put against what the domains counted: per cause the
kernel's count, the moves surely between the reads, those inside a read's window (``unsure``)
and of unknown cause; and the moves of tasks the trace shows asleep but the kernel held queued
(EEVDF's delayed dequeue, ``causes.queued_asleep``), which a wake-up's placement must not be
taken for. Run it with ``PYTHONPATH`` set to another checkout to see what that code makes of the
same runs. Needs no root.

example: harmony run single-source --kernel debian:6.12 --vm-cpus 4 --layout 6,0,0,0
         --duration 2 --repeat 16 --out runs/s612; python bench/schedstat_causes.py runs/s612
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import numpy as np  # noqa: E402

CAUSES = ("periodic", "newidle", "active")


def run_dirs(dirs: list[Path]) -> list[Path]:
    """Every complete run directory under ``dirs`` (sorted)."""
    found = set()
    for d in dirs:
        for m in [d / "manifest.json", *d.rglob("manifest.json")]:
            if m.is_file():
                found.add(m.parent)
    return sorted(found)


def queued_moves(run) -> list[dict]:
    """The moves of tasks asleep in the trace but queued for the kernel, with their causes."""
    from harmony.analysis import causes, taskstate

    ev = run.events
    mg = (ev["event"].astype(str) == "sched_migrate_task").to_numpy()
    pids = np.unique(ev["pid"].to_numpy()[mg])
    r = taskstate.task_records(ev, pids[pids > 0])
    sel = np.flatnonzero((r["record"].to_numpy() == taskstate.MIGRATE)
                         & (r["orig_cpu"].to_numpy() != r["dest_cpu"].to_numpy()))
    sel = sel[np.argsort(r["seq"].to_numpy()[sel], kind="stable")]
    if not hasattr(causes, "queued_asleep"):        # a checkout from before it
        return []
    q = causes.queued_asleep(ev, r, sel)
    cause = causes.migration_causes(ev, r, sel)
    rows = (r["seq"].to_numpy()[sel[q]] // 2).astype(np.int64)
    return [{"ts": int(ev["ts"].iat[i]), "comm": str(ev["comm"].iat[i]),
             "from": int(ev["orig_cpu"].iat[i]), "to": int(ev["target_cpu"].iat[i]),
             "cause": causes.CAUSES[c]} for i, c in zip(rows, cause[q])]


def measure(path: Path) -> dict | None:
    """One run's comparison, or None where it did not read /proc/schedstat."""
    import harmony
    from harmony.analysis.counters import schedstat_agreement
    from harmony.analysis.reconstruct import df_migrations

    run = harmony.load(path)
    m = run.manifest
    facts = m.get("kernel_schedstat")
    if not facts or not facts.get("counting"):
        return None
    mig = df_migrations(run.events, run.tasks, m["t0_ns"])
    sa = schedstat_agreement(facts, mig, run.events, m["cpus"])
    reads = facts["reads"]
    lo, hi = reads["start"]["after_ns"], reads["end"]["before_ns"]
    queued = queued_moves(run)
    return {"run": str(path), "lost": m["lost_events"], "within": sa["within"],
            "kernel": {c: sa["kernel"][c] for c in CAUSES}, "trace": sa["all"],
            "unsure": sa["unsure"], "unknown": sa["unknown"], "queued": queued,
            "queued_between_reads": sum(lo < q["ts"] < hi for q in queued)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="run, batch or suite directories")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    found = run_dirs(args.dirs)
    results = [r for r in map(measure, found) if r is not None]
    if not results:
        print(f"no run that read /proc/schedstat under {' '.join(map(str, args.dirs))} "
              f"({len(found)} runs)")
        common.emit_json(args.json, {"runs": []})
        return
    rows = []
    for r in results:
        rows.append([Path(r["run"]).name, r["lost"]]
                    + [f"{r['trace'][c]}/{r['kernel'][c]}" for c in CAUSES]
                    + [sum(r["unsure"].values()), r["unknown"], len(r["queued"]),
                       r["queued_between_reads"], "yes" if r["within"] else "NO"])
    common.table(["run", "lost", "periodic trace/kernel", "newidle", "active", "unsure",
                  "unknown", "queued asleep", "between reads", "agree"], rows)
    within = sum(r["within"] for r in results)
    print(common.verdict("causes against the domains' counts", within == len(results),
                         f"{within} of {len(results)} runs agree"))
    common.emit_json(args.json, {"runs": results})


if __name__ == "__main__":
    main()
