"""Ctrl-C in a suite: how long a user waits for ``harmony suite`` to end once stopped, and what
it leaves.

A real ``harmony suite --quick -e single-source -e intrinsic-imbalance`` (four runs) is started
and sent SIGINT, as a terminal's Ctrl-C would, at a chosen moment of its life (``--at``):

- ``start``: as its second run starts, 0-45 ms after its manifest is written "running" (5 ms
  more at each try, round the ten: the first run captured and waiting for its analysis, the
  second making its cgroups and forking its workers);
- ``window``: in the second run's measured window (its workers running);
- ``between``: as the third run starts.

The wait is from the signal to the command's exit, polled every millisecond. Then what it left:
its exit status (130 expected), Harmony's processes still there (workers ``hmy-*``, fork servers,
analysers), its tracing instances and cpuset cgroups. Target: every stop ends within 1 s
(nothing is analysed or drained after a Ctrl-C: the captures wait for ``--resume``), status 130,
nothing left. Run it alone on the host (it measures): ``flock /tmp/harmony-measure.lock python3
bench/ctrl_c.py --tries 10``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.workload.forkserver import COMM as SERVER_COMM  # noqa: E402

TRACEFS = Path("/sys/kernel/tracing")
MOMENTS = {"start": ("rep-02", "running", 0.0), "window": ("rep-02", "running", 1.0),
           "between": ("rep-01", "running", 0.0)}
#: ``start``'s signal this much later at each try (the set-up's steps take a few ms each)
START_STEP_S = 0.005


def _status(run: Path) -> str | None:
    try:
        return json.loads((run / "manifest.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def left_on_host() -> list[str]:
    """What a stopped suite may leave: Harmony's processes (zombies aside), tracing instances,
    cpuset cgroups."""
    left = [f"process {pid} ({comm})" for pid, comm, state, cmd in common.processes(True)
            if state not in ("Z", "X") and (comm.startswith("hmy-") or comm == SERVER_COMM
                                            or b"--analyser" in cmd)]
    inst = TRACEFS / "instances"
    if inst.is_dir():
        left += [f"instance {p.name}" for p in inst.iterdir() if p.name.startswith("harmony-")]
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpuset")):
        if root.is_dir():
            left += [f"cgroup {p}" for p in root.glob("harmony-*")]
    return left


def one_stop(at: str, out: Path, later_s: float = 0.0, timeout_s: float = 180.0) -> dict:
    """Start the suite, send SIGINT at moment ``at`` (``later_s`` after it), time its end and
    read what it left."""
    shutil.rmtree(out, ignore_errors=True)
    experiment = "intrinsic-imbalance" if at == "between" else "single-source"
    rep, status, after_s = MOMENTS[at]
    proc = subprocess.Popen([sys.executable, "-m", "harmony.cli", "suite", "--quick",
                             "-e", "single-source", "-e", "intrinsic-imbalance", "--out",
                             str(out), "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # SIGINT as a terminal's Ctrl-C is, even where this bench runs as a
                            # shell's background job (SIGINT inherited ignored, kept by Python)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < timeout_s:
        # a configuration's directory is named by its label (the experiment, and its point)
        if any(_status(d / rep) == status for d in out.glob(f"{experiment}*")):
            break
        time.sleep(0.005)
    time.sleep(after_s + later_s)
    if proc.poll() is not None:
        return {"at": at, "wait_s": None, "status": proc.returncode, "left": [],
                "note": "ended before the signal"}
    proc.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    while proc.poll() is None and time.monotonic() - stopped < timeout_s:
        time.sleep(0.001)
    wait = time.monotonic() - stopped
    err = proc.communicate()[1].decode(errors="replace").strip().splitlines()
    left = left_on_host()
    return {"at": at, "later_s": later_s, "wait_s": wait, "status": proc.returncode,
            "left": left, "note": err[-1] if err and proc.returncode != 130 else "",
            "stderr": err}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=5, help="stops at each moment")
    ap.add_argument("--at", default="start,window,between",
                    help="moments, comma-separated: " + ", ".join(MOMENTS))
    ap.add_argument("--json", help="write the results here (- for standard output)")
    args = ap.parse_args()
    moments = [m for m in args.at.split(",") if m]
    if args.tries < 1 or not moments or set(moments) - set(MOMENTS):
        ap.error(f"--tries must be at least 1 and --at among {', '.join(MOMENTS)}")
    common.need_root("a suite's cgroups and tracing")
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="ctrl-c-") as tmp:
        for k in range(args.tries):
            for at in moments:
                later = (k % 10) * START_STEP_S if at == "start" else 0.0
                r = one_stop(at, Path(tmp) / "suite", later)
                results.append(r)
                rows.append([f"{at} #{k + 1}", later * 1e3, r["wait_s"], r["status"],
                             len(r["left"]),
                             ("; ".join(r["left"]) + " " + r["note"]).strip()[:100]])
                if r["left"]:       # the next try starts clean, as the next start would make it
                    subprocess.run([sys.executable, "-m", "harmony.cli", "clean"],
                                   capture_output=True)
    common.table(["stop", "+ms", "wait s", "status", "left", "what"], rows)
    waits = [r["wait_s"] for r in results if r["wait_s"] is not None]
    ok = (bool(waits) and max(waits) < 1.0 and all(r["status"] == 130 for r in results
                                                   if r["wait_s"] is not None)
          and not any(r["left"] for r in results))
    print(common.verdict("Ctrl-C ends a suite within 1 s, status 130, nothing left", ok,
                         f"wait median {common.median(waits):.3f} s, max "
                         f"{max(waits, default=float('nan')):.3f} s over {len(waits)} stops; "
                         f"left something {sum(bool(r['left']) for r in results)} times"))
    common.emit_json(args.json, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
