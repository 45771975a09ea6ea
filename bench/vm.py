"""VM benchmark: what a kernel under test in a virtual machine costs, against a run on the host.

Each measurement is a real ``harmony run single-source`` (the command a user types, in a separate
process), interleaved: on the host; in a VM booting ``--kernel`` with ``--vm-cpus`` vCPUs, one run
per boot; and in a VM with ``--repeat 2`` (two runs in one boot). Reported, as medians:

- boot: from the start of virtme-ng to the guest agent's first line (manifest vm.boot_s)
- wall: the whole command, fetch (cached) and analysis on the host included
- per-run overhead: the VM run's wall time minus the host run's
- one more run in the same boot: wall(--repeat 2) - wall(--repeat 1): what a suite pays per run
- the share of the window the vCPU threads waited for a host CPU (manifest vm.vcpu_wait_max)

No figure is asserted; bench/README.md keeps them with the command.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, median, need_root, table  # noqa: E402

from harmony import store  # noqa: E402


def harmony_run(out: Path, duration: float, vm: list[str], repeat: int = 1) -> dict:
    """One ``harmony run single-source``; its wall time and, in a VM, what the manifest says."""
    argv = [sys.executable, "-m", "harmony.cli", "run", "single-source", "--duration",
            str(duration), "--out", str(out), "-q", *vm]
    if repeat > 1:
        argv += ["--repeat", str(repeat)]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv[3:])}: failed: {p.stderr.strip().splitlines()[-1:]}")
    m = store.read_json((out / "rep-01" if repeat > 1 else out) / "manifest.json")
    v = m.get("vm") or {}
    return {"wall_s": wall, "boot_s": v.get("boot_s"), "vcpu_wait_max": v.get("vcpu_wait_max"),
            "accelerator": v.get("accelerator"), "setting": v.get("qemu_setting"),
            "kernel": (m.get("under_test") or m.get("host") or {}).get("kernel")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="debian:6.1", help="kernel under test (default debian:6.1)")
    ap.add_argument("--vm-cpus", type=int, default=4, help="vCPUs (default 4)")
    ap.add_argument("--vm-qemu", help="QEMU set-up, as harmony run --vm-qemu")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of each measurement")
    ap.add_argument("--json", help="also write the figures as JSON here ('-': stdout)")
    args = ap.parse_args(argv)
    need_root("bench/vm.py")
    vm = ["--kernel", args.kernel, "--vm-cpus", str(args.vm_cpus)]
    if args.vm_qemu:
        vm += ["--vm-qemu", args.vm_qemu]
    rows: dict[str, list[dict]] = {"host": [], "vm": [], "vm2": []}
    with tempfile.TemporaryDirectory(prefix="bench-vm-") as tmp:
        for k in range(args.reps):
            rows["host"].append(harmony_run(Path(tmp) / f"h{k}", args.duration, []))
            rows["vm"].append(harmony_run(Path(tmp) / f"v{k}", args.duration, vm))
            rows["vm2"].append(harmony_run(Path(tmp) / f"w{k}", args.duration, vm, repeat=2))
    host = median(r["wall_s"] for r in rows["host"])
    one = median(r["wall_s"] for r in rows["vm"])
    two = median(r["wall_s"] for r in rows["vm2"])
    boot = median(r["boot_s"] for r in rows["vm"] + rows["vm2"])
    wait = median(r["vcpu_wait_max"] for r in rows["vm"] + rows["vm2"])
    first = rows["vm"][0]
    print(f"kernel under test {first['kernel']} ({args.kernel}), {args.vm_cpus} vCPUs, "
          f"{(first['accelerator'] or '?').upper()} ({first['setting']}); "
          f"single-source, {args.duration:g} s measured; median of {args.reps}")
    table(["figure", "seconds"], [
        ["boot (virtme-ng start to the agent's first line)", f"{boot:.1f}"],
        ["run on the host (wall)", f"{host:.1f}"],
        ["run in a VM, one boot (wall)", f"{one:.1f}"],
        ["per-run overhead (VM - host)", f"{one - host:.1f}"],
        ["two runs in one boot (wall)", f"{two:.1f}"],
        ["one more run in the same boot", f"{two - one:.1f}"],
    ])
    print(f"vCPU wait for host CPUs: {wait:.1%} of the window at most (median)")
    emit_json(args.json, {"kernel": args.kernel, "vcpus": args.vm_cpus, "duration": args.duration,
                          "boot_s": boot, "host_wall_s": host, "vm_wall_s": one,
                          "overhead_s": one - host, "vm2_wall_s": two, "more_run_s": two - one,
                          "vcpu_wait_max": wait, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
