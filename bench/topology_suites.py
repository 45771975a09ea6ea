"""Suites on a VM topology (issue 45 item 8), read back: per suite, what it cost here and how
faithful its runs were, from what each run recorded (no new measurement).

For each suite directory (``harmony suite --kernel K --vm-topology T``): the kernel and the shape,
the boot (virtme-ng start to the guest agent's first line), the suite's wall time against its
configured seconds, the vCPU threads' wait for a host CPU over each run's window (median and
worst run: the starvation rule leaves a run out of the card above WAIT threshold), the runs the
card left out, the moves of all runs by level of the machine, how many runs' per-level counts
agreed with the kernel's /proc/schedstat per domain, and the predictions' verdicts (held / not
held / not checkable) over every run.

Usage (reads only; no lock needed)::

    python3 bench/topology_suites.py /tmp/topo/s612-2node /tmp/topo/s61-2node [--json -]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from common import emit_json, median, table  # noqa: E402
from fidelity import level_figures  # noqa: E402

from harmony import store  # noqa: E402


def runs_of(suite: Path) -> list:
    out = []
    for rep in sorted(suite.glob("*/rep-*")):
        try:
            out.append(store.open_run(rep))
        except store.RunError as exc:
            print(f"  {rep}: not used ({exc})", file=sys.stderr)
    return out


def suite_figures(suite: Path) -> dict:
    """The figures of one suite directory (see the module docstring)."""
    from harmony.analysis import policy

    record = store.read_json(suite / "suite.json")
    runs = runs_of(suite)
    vm = [r.manifest.get("vm") or {} for r in runs]
    waits = [v["vcpu_wait_max"] for v in vm if v.get("vcpu_wait_max") is not None]
    verdicts = {"held": 0, "not held": 0, "not checkable": 0}
    for r in runs:
        for row in ((r.summary.get("predictions") or {}).get("rows") or []):
            key = {True: "held", False: "not held"}.get(row.get("holds"), "not checkable")
            verdicts[key] += 1
    _, skipped = policy.collect([r.path for r in runs])
    first = runs[0].manifest if runs else {}
    topo = (first.get("vm") or {}).get("topology") or {}
    under = first.get("under_test") or {}
    return {"suite": str(suite), "kernel": under.get("kernel"),
            "scheduler": under.get("scheduler"), "topology": topo.get("preset") or topo.get("spec"),
            "runs": len(runs), "not_used": len(skipped),
            "boot_s": median(v.get("boot_s") for v in vm),
            "wall_s": record.get("wall_s"), "configured_s": record.get("configured_s"),
            "wait_median": median(waits), "wait_max": max(waits, default=None),
            **level_figures(runs), "predictions": verdicts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("suites", nargs="+", type=Path, help="suite directories")
    ap.add_argument("--json", help="also write the figures as JSON here ('-': stdout)")
    args = ap.parse_args(argv)
    rows = [suite_figures(s) for s in args.suites]

    def pct(v):
        return "-" if v is None or v != v else f"{v:.2%}"      # a wait of 0.01 % shows

    table(["suite", "kernel", "shape", "runs (not used)", "boot s", "wall / configured s",
           "vCPU wait med/max"],
          [[Path(r["suite"]).name, f"{r['kernel']}" + (f" {r['scheduler']}" if r["scheduler"]
                                                        else ""),
            r["topology"], f"{r['runs']} ({r['not_used']})", f"{r['boot_s']:.0f}",
            f"{r['wall_s'] or 0:.0f} / {r['configured_s'] or 0:.0f}",
            f"{pct(r['wait_median'])}/{pct(r['wait_max'])}"] for r in rows])
    print()
    table(["suite", "moves by level (all runs)", "levels agree with /proc/schedstat",
           "predictions held / not / n.c."],
          [[Path(r["suite"]).name, ", ".join(f"{k} {n}" for k, n in r["levels"].items()) or "-",
            f"{r['levels_agree']}/{r['levels_compared']} runs",
            "/".join(str(r["predictions"][k]) for k in ("held", "not held", "not checkable"))]
           for r in rows])
    emit_json(args.json, {"suites": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
