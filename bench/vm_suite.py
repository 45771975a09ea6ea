"""VM suite bench: where a suite in a virtual machine spends its wall time.

Runs ``harmony suite --quick --kernel K --vm-cpus P [--scx S]`` (a real suite, the command a user
types, in a process of its own; or reads a suite directory already made, ``--from DIR``) and
prints the split of its wall time against its configured time:

- boot: from virtme-ng's start to the guest agent's first line (manifest ``vm.boot_s``), in
  three parts: before the guest's clock starts (virtme-ng, QEMU, the firmware), the kernel and
  virtme-ng's init (to its ``starting script`` line in the kernel log: the agent's command
  starts), and the agent (its script's start to its facts: the bundle's copy, a Python start,
  its imports, its facts); the kernel log's stamps and the agent's CLOCK_MONOTONIC both count
  from the guest's boot
- per run, in the guest (the agent's lines' CLOCK_MONOTONIC, ``vm-console.log``): set-up (its
  start to its window: the scheduler, calibrations, the workers' spawn, the probe's start),
  window (what is measured, the warm release's warm-up included), teardown (the window's end to
  the run written: the workers' stop, the probe's drain, the tables written, the run handed
  over onto the host's share in one file), and the gaps between runs; calibrations (the
  server's, inside set-up: the capture's ``place`` lap where the run recorded one) are shown
  apart
- the transfer of captures: the guest's writing of its tables (the capture's ``write`` lap, in
  teardown: into the guest's memory since the runs are handed over in one file) and the host's
  landing of them (manifest ``vm.land_s`` where recorded: the run unpacked, its tables made)
- the host's analysis and the report (suite.json ``captured_s``, ``analysed_s``,
  ``wall_with_report_s``)

Each figure is a measurement of one suite; run it twice for a spread. No figure is asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, need_root, table  # noqa: E402

from harmony import store  # noqa: E402

PREFIX = "@harmony "
#: virtme-ng's init starting the guest's command, in the kernel log
SCRIPT_LINE = re.compile(r"^\[\s*(\d+\.\d+)\] virtme-ng-init: starting script")


def guest_events(console: Path) -> list[dict]:
    """The agent's lines in the console log, in order."""
    out = []
    for line in console.read_text(errors="replace").splitlines():
        if line.startswith(PREFIX):
            try:
                out.append(json.loads(line[len(PREFIX):]))
            except ValueError:
                continue
    return out


def script_start(console: Path) -> float | None:
    """When virtme-ng's init started the agent's command, in seconds of the guest's clock (the
    kernel log's stamp of its ``starting script`` line); None where the log does not say."""
    for line in console.read_text(errors="replace").splitlines():
        m = SCRIPT_LINE.match(line)
        if m:
            return float(m.group(1))
    return None


def runs_in_guest(events: list[dict]) -> list[dict]:
    """Per run, in order: its directory and the guest's seconds of set-up, window, teardown,
    and the gap before it (since the previous run was written, or the facts)."""
    runs, cur, last = [], None, None
    for ev in events:
        t = ev.get("mono_ns", 0) / 1e9
        kind = ev.get("event")
        if kind == "facts":
            last = t
        elif kind == "start":
            cur = {"dir": ev.get("dir"), "t_start": t, "gap": t - last if last else 0.0}
            runs.append(cur)
        elif cur is not None and kind in ("measuring", "measured", "done", "error"):
            cur["t_" + kind] = t
            if kind in ("done", "error"):
                last = t
    for r in runs:
        end = r.get("t_done", r.get("t_error"))
        r["setup"] = r.get("t_measuring", end) - r["t_start"] if end else None
        r["window"] = (r["t_measured"] - r["t_measuring"]) if "t_measured" in r else None
        r["teardown"] = end - r["t_measured"] if end and "t_measured" in r else None
    return runs


def split(suite: Path) -> dict:
    """The split of a suite directory's wall time (see the module)."""
    record = store.read_json(suite / "suite.json")
    events = guest_events(suite / "vm-console.log")
    runs = runs_in_guest(events)
    manifests = {}
    for r in runs:
        try:
            manifests[r["dir"]] = store.read_json(Path(r["dir"]) / "manifest.json")
        except store.RunError:
            manifests[r["dir"]] = {}
    vm = next((m.get("vm") for m in manifests.values() if m.get("vm")), {}) or {}
    boot = vm.get("boot_s") or 0.0
    laps = {d: (m.get("timings_s") or {}).get("capture", {}) for d, m in manifests.items()}
    by_exp = collections.defaultdict(list)
    for r in runs:
        by_exp[manifests[r["dir"]].get("experiment", "?")].append(r)
    first_facts = next((e["mono_ns"] / 1e9 for e in events if e.get("event") == "facts"), None)
    last = max((r.get("t_done", r.get("t_error", 0)) for r in runs), default=first_facts or 0)
    land = [m.get("vm", {}).get("land_s") for m in manifests.values()]
    out = {
        "configured_s": record["configured_s"], "wall_s": record.get("wall_with_report_s")
        or record["wall_s"], "captured_s": record["captured_s"],
        "analysed_s": record["analysed_s"] - record["captured_s"],
        "report_s": (record.get("wall_with_report_s") or record["wall_s"])
        - record["analysed_s"],
        "boot_s": boot, "runs": len(runs), "guest_s": last - first_facts if first_facts else None,
        "setup_s": sum(r["setup"] or 0 for r in runs),
        "window_s": sum(r["window"] or 0 for r in runs),
        "teardown_s": sum(r["teardown"] or 0 for r in runs),
        "gaps_s": sum(r["gap"] for r in runs),
        "calibration_s": sum(laps[r["dir"]].get("place", 0) for r in runs
                             if manifests[r["dir"]].get("experiment") == "server"),
        "guest_write_s": sum(laps[r["dir"]].get("write", 0) for r in runs),
        "land_s": sum(x for x in land if x) if any(land) else None,
        "by_experiment": {
            e: {"runs": len(rs), "setup_s": sum(r["setup"] or 0 for r in rs),
                "window_s": sum(r["window"] or 0 for r in rs),
                "teardown_s": sum(r["teardown"] or 0 for r in rs),
                "laps": {k: round(sum(laps[r["dir"]].get(k, 0) for r in rs), 2)
                         for k in sorted({k for r in rs for k in laps[r["dir"]]})}}
            for e, rs in by_exp.items()},
    }
    out["rest_s"] = out["captured_s"] - boot - (out["guest_s"] or 0)
    script = script_start(suite / "vm-console.log")
    if first_facts is not None and boot:
        out["boot_before_clock_s"] = boot - first_facts
        out["boot_kernel_s"] = script
        out["boot_agent_s"] = first_facts - script if script is not None else None
    return out


def print_split(s: dict) -> None:
    w = s["wall_s"]

    def row(name, v):
        return [name, "" if v is None else f"{v:.1f}", "" if v is None else f"{v / w:.0%}"]
    print(f"{s['runs']} captures; wall {w:.1f} s for {s['configured_s']:.1f} s configured: "
          f"{w / s['configured_s']:.2f}x")
    table(["part", "s", "of wall"], [
        row("boot (virtme-ng start to the agent's facts)", s["boot_s"]),
        row("  of which before the guest's clock (virtme-ng, QEMU, firmware)",
            s.get("boot_before_clock_s")),
        row("  of which the kernel and virtme-ng's init (to the agent's script)",
            s.get("boot_kernel_s")),
        row("  of which the agent (its script's start to its facts)", s.get("boot_agent_s")),
        row("runs' set-up in the guest (start to window)", s["setup_s"]),
        row("  of which the server's calibrations", s["calibration_s"]),
        row("runs' windows (measured, warm-up included)", s["window_s"]),
        row("runs' teardown in the guest (window end to written)", s["teardown_s"]),
        row("  of which the tables written (in the guest's memory)", s["guest_write_s"]),
        row("gaps between runs in the guest", s["gaps_s"]),
        row("after the guest: landing, VM end (captured - boot - guest)", s["rest_s"]),
        row("  of which landing the captures on the host", s["land_s"]),
        row("host's analysis", s["analysed_s"]),
        row("report", s["report_s"]),
    ])
    rows = []
    for e, v in sorted(s["by_experiment"].items(), key=lambda kv: -kv[1]["setup_s"]):
        n = v["runs"]
        laps = ", ".join(f"{k} {x / n:.1f}" for k, x in v["laps"].items() if x / n >= 0.05)
        rows.append([e, n, f"{v['setup_s'] / n:.1f}", f"{v['window_s'] / n:.1f}",
                     f"{v['teardown_s'] / n:.1f}", laps])
    print()
    table(["experiment", "runs", "set-up s/run", "window s/run", "teardown s/run",
           "capture laps s/run"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="sched-ext",
                    help="--kernel of the suite (default %(default)s: the recipe's build)")
    ap.add_argument("--scx", default="simple", help="a sched_ext scheduler ('' for none)")
    ap.add_argument("--vm-cpus", type=int, default=4)
    ap.add_argument("--from", dest="suite", help="a suite directory made already: split it")
    ap.add_argument("--out", help="keep the suite made in this directory (default: removed)")
    ap.add_argument("--json", help="also write the figures as JSON here ('-': stdout)")
    args = ap.parse_args(argv)
    if args.suite:
        s = split(Path(args.suite))
    else:
        need_root("bench/vm_suite.py")
        with tempfile.TemporaryDirectory(prefix="bench-vm-suite-") as tmp:
            out = Path(args.out) if args.out else Path(tmp) / "suite"
            cmd = [sys.executable, "-m", "harmony.cli", "suite", "--quick", "--kernel",
                   args.kernel, "--vm-cpus", str(args.vm_cpus), "--out", str(out), "-q"]
            if args.scx:
                cmd += ["--scx", args.scx]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.monotonic() - t0
            if not (out / "suite.json").exists():
                sys.exit(f"the suite failed: {p.stderr.strip().splitlines()[-1:]}")
            s = split(out)
            s["command_wall_s"] = wall
            print(f"`{' '.join(cmd[1:])}`: {wall:.1f} s (exit {p.returncode})")
    print_split(s)
    emit_json(args.json, s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
