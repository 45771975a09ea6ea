"""Controller death: how soon a run's processes stop when its controller is killed (kill -9).

A real ``harmony run single-source`` with N CPU-bound tasks on the first CPU is started and its
controller killed at a series of moments, covering the workers' spawn, their wait at the start
gate, the release, the measurement and the stop. After each kill, /proc is polled every ~1 ms:

- live gone: the last worker, occupier or fork server that still runs (any state but zombie) is
  gone: what Harmony controls (workers and the fork server die with their parent,
  PR_SET_PDEATHSIG). Target: < 100 ms at 128 tasks, at every moment.
- reaped: their zombies are reaped too (by the host's init, to which they were reparented: not
  Harmony's doing; a zombie holds no CPU or memory, only its pid).

At the kill, the phase is read from /proc too: how many workers exist, how many are running (R)
rather than asleep at the gate (S). Then `harmony clean` reclaims the dead run's tracing instance
and cgroups, as the next start would.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony.workload.forkserver import COMM as SERVER_COMM  # noqa: E402


def census() -> dict:
    """Harmony's processes now: live (by kind), zombies, workers running."""
    out = {"live": 0, "zombies": 0, "workers": 0, "running": 0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if not (comm.startswith("hmy-") or comm == SERVER_COMM):
            continue
        if state in ("Z", "X"):
            out["zombies"] += 1
            continue
        out["live"] += 1
        if comm.startswith("hmy-w"):
            out["workers"] += 1
            out["running"] += state == "R"
    return out


def one_kill(ntasks: int, at: float, duration: float, out: Path, timeout: float = 10.0) -> dict:
    """Start a run, kill its controller ``at`` s later, time its processes' end."""
    proc = subprocess.Popen([sys.executable, "-m", "harmony.cli", "run", "single-source",
                             "--layout", f"{ntasks},0", "--duration", str(duration), "--out",
                             str(out), "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(at)
    seen = census()
    proc.kill()
    killed = time.monotonic()
    err = proc.communicate()[1].decode(errors="replace")
    live_gone = reaped = None
    while time.monotonic() - killed < timeout:
        now = census()
        t = time.monotonic() - killed
        if live_gone is None and now["live"] == 0:
            live_gone = t
        if now["live"] + now["zombies"] == 0:
            reaped = t
            break
        time.sleep(0.001)
    busy = "another Harmony run" in err
    return {"at_s": at, "workers": seen["workers"], "running": seen["running"],
            "processes": seen["live"], "live_gone_ms": None if live_gone is None else live_gone * 1e3,
            "reaped_ms": None if reaped is None else reaped * 1e3, "refused": busy,
            "left": census()["live"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=128, help="tasks of the run (default %(default)s)")
    ap.add_argument("--duration", type=float, default=2.0, help="the run's window, s")
    ap.add_argument("--moments", default="0.3:4.3:0.25",
                    help="kill times after start, FROM:TO:STEP s (default %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    common.need_root("running workloads")
    lo, hi, step = (float(x) for x in a.moments.split(":"))
    moments = [round(lo + k * step, 3) for k in range(int((hi - lo) / step + 1e-9) + 1)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="harmony-death-") as tmp:
        for k, at in enumerate(moments):
            r = one_kill(a.tasks, at, a.duration, Path(tmp) / f"r{k}")
            subprocess.run([sys.executable, "-m", "harmony.cli", "clean"], capture_output=True)
            rows.append(r)
    common.table(["killed at s", "workers", "running", "processes", "live gone ms", "reaped ms",
                  "left"],
                 [[r["at_s"], r["workers"], r["running"], r["processes"], r["live_gone_ms"],
                   r["reaped_ms"], r["left"]] for r in rows if not r["refused"]])
    timed = [r["live_gone_ms"] for r in rows if not r["refused"] and r["processes"]]
    worst = max(timed, default=None) if None not in timed else None
    print()
    print(common.verdict("controller death", None if not timed else worst is not None and worst < 100,
                         f"worst {worst if worst is None else round(worst, 1)} ms to the last live "
                         f"process gone over {len(timed)} kills with processes running "
                         f"({a.tasks} tasks); zombies reaped by init after at most "
                         f"{max((r['reaped_ms'] or 0) for r in rows):.0f} ms"))
    common.emit_json(a.json, {"tasks": a.tasks, "duration": a.duration, "kills": rows,
                              "worst_live_gone_ms": worst})
    return 0 if all(not r["left"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
