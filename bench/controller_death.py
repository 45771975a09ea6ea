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

With ``--kernel K`` the run is ``harmony run single-source --kernel K --vm-cpus P --repeat 2``
and the moments are a VM's (``--vm-moments``): ``boot`` (a few seconds after the start, the
guest booting), and the guest agent's steps of the first run as the console log shows them --
``measuring`` (mid-capture), ``measured`` (the window over: the guest stops its workers, drains
the trace and writes the run), ``done`` (between the two runs). After each kill /proc is polled
for what a VM runs on the host -- QEMU, virtme-ng (vng, virtme-run), virtiofsd, the reaper --
until none is left (target: 1 s).
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
    for _, comm, state, _ in common.processes():
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
            "processes": seen["live"],
            "live_gone_ms": None if live_gone is None else live_gone * 1e3,
            "reaped_ms": None if reaped is None else reaped * 1e3, "refused": busy,
            "left": census()["live"]}


#: what a VM runs on the host, by command name (the reaper is python3: found by its script)
VM_COMMS = ("qemu-system", "vng", "virtme-run", "virtiofsd")


def vm_processes() -> list[str]:
    """The processes of VMs still running on the host (zombies left out)."""
    out = []
    for pid, comm, state, cmd in common.processes(cmdline=True):
        reaper = comm.startswith("python") and b"harmony/vm/reaper.py" in cmd
        if state not in ("Z", "X") and (comm.startswith(VM_COMMS) or reaper):
            out.append(f"{pid} {'reaper' if reaper else comm}")
    return out


def vm_kill(kernel: str, vcpus: int, moment: str, duration: float, out: Path,
            timeout: float = 10.0, boot_after_s: float = 5.0) -> dict:
    """Start a VM run, kill its controller at ``moment`` (boot, or an agent step of the first
    run), time the end of its VM's processes."""
    before = set(vm_processes())
    proc = subprocess.Popen([sys.executable, "-m", "harmony.cli", "run", "single-source",
                             "--kernel", kernel, "--vm-cpus", str(vcpus), "--duration",
                             str(duration), "--repeat", "2", "--out", str(out), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    console = out / "vm-console.log"
    t0 = time.monotonic()
    want = None if moment == "boot" else f'"event": "{moment}", '
    while proc.poll() is None and time.monotonic() - t0 < 600:
        if want is None and time.monotonic() - t0 >= boot_after_s:
            break
        if want is not None and console.exists() and any(
                want in line and '"run": 0' in line for line in console.read_text().splitlines()):
            break
        time.sleep(0.02)
    seen = [p for p in vm_processes() if p not in before]
    proc.kill()
    killed = time.monotonic()
    err = proc.communicate()[1].decode(errors="replace")
    gone = None
    while time.monotonic() - killed < timeout:
        if not [p for p in vm_processes() if p not in before]:
            gone = time.monotonic() - killed
            break
        time.sleep(0.005)
    return {"moment": moment, "at_s": round(killed - t0, 1), "processes": len(seen),
            "gone_ms": None if gone is None else gone * 1e3,
            "left": [p for p in vm_processes() if p not in before],
            "refused": "another Harmony run" in err}


def vm_main(a) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="harmony-death-vm-") as tmp:
        for k, moment in enumerate(a.vm_moments.split(",")):
            r = vm_kill(a.kernel, a.vm_cpus, moment, a.duration, Path(tmp) / f"v{k}")
            subprocess.run([sys.executable, "-m", "harmony.cli", "clean"], capture_output=True)
            rows.append(r)
    common.table(["killed at", "s after start", "VM processes", "all gone ms", "left"],
                 [[r["moment"], r["at_s"], r["processes"], r["gone_ms"], len(r["left"])]
                  for r in rows if not r["refused"]])
    timed = [r["gone_ms"] for r in rows if not r["refused"]]
    worst = None if None in timed or not timed else max(timed)
    print()
    print(common.verdict("VM controller death", None if not timed else
                         worst is not None and worst < 1000,
                         f"worst {worst if worst is None else round(worst)} ms to the last VM "
                         f"process gone over {len(timed)} kills ({a.kernel}, {a.vm_cpus} vCPUs)"))
    common.emit_json(a.json, {"kernel": a.kernel, "kills": rows, "worst_gone_ms": worst})
    return 0 if all(not r["left"] for r in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=128, help="tasks of the run (default %(default)s)")
    ap.add_argument("--duration", type=float, default=2.0, help="the run's window, s")
    ap.add_argument("--moments", default="0.3:4.3:0.25",
                    help="kill times after start, FROM:TO:STEP s (default %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    ap.add_argument("--kernel", help="kill VM runs of this kernel instead (e.g. debian:6.1)")
    ap.add_argument("--vm-cpus", type=int, default=4, help="the VM's vCPUs (default %(default)s)")
    ap.add_argument("--vm-moments", default="boot,measuring,measured,done",
                    help="with --kernel: when to kill (default %(default)s)")
    a = ap.parse_args(argv)
    common.need_root("running workloads")
    if a.kernel:
        return vm_main(a)
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
    print(common.verdict("controller death",
                         None if not timed else worst is not None and worst < 100,
                         f"worst {worst if worst is None else round(worst, 1)} ms to the last live "
                         f"process gone over {len(timed)} kills with processes running "
                         f"({a.tasks} tasks); zombies reaped by init after at most "
                         f"{max((r['reaped_ms'] or 0) for r in rows):.0f} ms"))
    common.emit_json(a.json, {"tasks": a.tasks, "duration": a.duration, "kills": rows,
                              "worst_live_gone_ms": worst})
    return 0 if all(not r["left"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
