"""A trace from another machine: recorded by trace-cmd's and perf's own recorders in a QEMU TCG
guest (virtme-ng, ``--cpus`` as QEMU's ``-smp``: 8 vCPUs in two sockets by default), then
imported here with ``harmony import``.

In the guest: ``trace-cmd record -e sched`` and ``perf record -e 'sched:*' -a`` of ``perf bench
sched messaging -g GROUPS -l LOOPS`` (its processes' comm: sched-messaging), into ``--out``.
Per file, on the host:

- the import (``harmony import FILE --comm sched-messaging``, the console script) against the
  file's own reader (``trace-cmd report`` / ``perf script`` into /dev/null), in seconds;
- what the run's manifest says: events, the trace clock, lost events, the ties
  (``capture.clock_ties``: pairs of adjacent events of two CPUs with one timestamp, their
  groups, the groups :mod:`harmony.analysis.ties` moved), the contradictions the state machine
  repaired and the moves the tasks' events prove that no sched_migrate_task records;
- the same two counts in the decoders' merged order, before the ties are ordered (the file read
  again by ``harmony.importer.read_trace``; the run's tasks and t0): what ordering them saved.

``--from DIR`` reads the files a run before left in DIR (no guest). Root, for the guest's tracing
(and KVM-less QEMU: TCG). No target: a comparison.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FILES = {"trace.dat": "hackbench-tc.dat", "perf.data": "hackbench.perf.data"}
REFERENCE = {"trace.dat": ["trace-cmd", "report", "-i"], "perf.data": ["perf", "script", "-i"]}
COMM = "sched-messaging"

GUEST_SCRIPT = """#!/bin/sh
exec > {out}/guest.log 2>&1
cd {out}
trace-cmd record -q -b 20000 -e sched -o {tc} -- perf bench sched messaging -g {groups} -l {loops}
echo "trace-cmd record: exit $?"
perf record -e 'sched:*' -a -o {pd} -- perf bench sched messaging -g {groups} -l {loops}
echo "perf record: exit $?"
"""


def record(out: Path, kernel: str, cpus: str, groups: int, loops: int) -> None:
    """Boot the guest once, record both files into ``out``."""
    from harmony.vm import kernels

    image = kernels.kernel(kernel).image
    script = out / "rec.sh"
    script.write_text(GUEST_SCRIPT.format(out=out, tc=FILES["trace.dat"], pd=FILES["perf.data"],
                                          groups=groups, loops=loops))
    script.chmod(0o755)
    n = int(cpus.split(",")[0])
    half = n // 2
    argv = ["vng", "--run", str(image), "--disable-kvm", "--cpus", cpus, "--memory", "4G",
            "--numa", f"2G,cpus=0-{half - 1}", "--numa", f"2G,cpus={half}-{n - 1}",
            "--rwdir", str(out), "--exec", str(script)]
    print(f"recording in a {cpus} guest of {kernel} ...", file=sys.stderr)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    missing = [f for f in FILES.values() if not (out / f).exists()]
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if missing:
        sys.exit(f"foreign_trace: the guest did not record {', '.join(missing)} (vng exit "
                 f"{done.returncode}: {last}; {out / 'guest.log'} says why)")
    if done.returncode != 0:    # vng's own exit: 255 here after a guest script that went well
        print(f"vng exited {done.returncode} ({last}); the guest's log: {out / 'guest.log'}",
              file=sys.stderr)


def timed(argv: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"foreign_trace: {' '.join(argv[:3])} failed: "
                 f"{(done.stderr.strip().splitlines() or [''])[-1]}")
    return time.perf_counter() - t


def measure(kind: str, path: Path, out: Path) -> dict:
    """One file: its import, its reader's time, and the ties' counts before and after."""
    import harmony
    from harmony.analysis.crosscheck import unrecorded_migrations
    from harmony.analysis.reconstruct import df_anomalies
    from harmony.importer import read_trace

    run = out / f"run-{kind.replace('.', '-')}"
    harmony_s = timed([common.console_script("harmony") or "harmony", "import", str(path),
                       "--comm", COMM, "--out", str(run), "-q"])
    reference_s = timed([*REFERENCE[kind], str(path)])
    r = harmony.load(run)
    m, cap = r.manifest, r.manifest["capture"]
    merged, _ = read_trace(path)            # the decoders' order, before the ties are ordered
    pids = r.tasks["pid"].to_numpy()
    return {"file": path.name, "kind": kind, "events": int(cap["n_events"]),
            "clock": cap.get("clock"), "lost": m.get("lost_events"), "harmony_s": harmony_s,
            "reference_s": reference_s, "ties": cap.get("clock_ties"),
            "repairs_merged": int(len(df_anomalies(merged.events, r.tasks, m["t0_ns"]))),
            "repairs": int(m["reconstruction_anomalies"]),
            "unrecorded_merged": int(unrecorded_migrations(merged.events, pids)["n"]),
            "unrecorded": int(cap["unrecorded_migrations"]["n"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/var/tmp/foreign-trace", help="where the files and runs go")
    ap.add_argument("--from", dest="source", help="the files a run before recorded (no guest)")
    ap.add_argument("--kernel", default="debian:6.12", help="the guest's kernel (harmony's name)")
    ap.add_argument("--cpus", default="8,sockets=2,cores=2,threads=2", help="QEMU's -smp")
    ap.add_argument("--groups", type=int, default=4, help="perf bench sched messaging -g")
    ap.add_argument("--loops", type=int, default=400, help="perf bench sched messaging -l")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.groups < 1 or a.loops < 1:
        ap.error("--groups and --loops must be at least 1")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if a.source:
        src = Path(a.source).resolve()
    else:
        common.need_root("a guest's tracing")
        record(out, a.kernel, a.cpus, a.groups, a.loops)
        src = out
    found = {k: src / f for k, f in FILES.items() if (src / f).exists()}
    if not found:
        sys.exit(f"foreign_trace: {src} holds neither {' nor '.join(FILES.values())}")
    res = [measure(kind, path, out) for kind, path in found.items()]
    common.table(["file", "events", "clock", "lost", "harmony s", "reader s", "tie pairs",
                  "groups", "moved", "repairs merged", "repairs", "unrecorded merged",
                  "unrecorded"],
                 [[x["file"], x["events"], x["clock"], x["lost"], x["harmony_s"],
                   x["reference_s"], x["ties"]["pairs"], x["ties"]["groups"],
                   x["ties"]["reordered"], x["repairs_merged"], x["repairs"],
                   x["unrecorded_merged"], x["unrecorded"]] for x in res])
    common.emit_json(a.json, {"params": vars(a), "results": res})


if __name__ == "__main__":
    main()
