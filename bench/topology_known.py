"""Known answers from "The Linux Scheduler: a Decade of Wasted Cores" (Lozi et al., EuroSys'16),
measured in a guest of the kernel under test (issue 45 item 7).

One boot (QEMU TCG through virtme-ng) of a machine of 4 NUMA nodes x 2 cores on an asymmetric
ring (neighbours at distance 20, the opposite node at 30), the kernel's ``sched_verbose`` on:

1. Scheduling-group construction. The paper's bug built the groups of a NUMA domain from one
   node's point of view, so that nodes two hops apart shared a group and were never balanced.
   The fixed kernels (the groups of an overlapping domain are the child domains' spans seen from
   each CPU, ``build_overlap_sched_groups``) give every group of the first NUMA level exactly
   one node. Read from the boot's own account (``CPUn attaching sched-domain(s)``, each level's
   span and groups) and from Harmony's topology (the domains' spans, /proc/schedstat).
   Then the behaviour it broke: single-source on the CPUs of two nodes two hops apart (nodes 1
   and 3), all tasks released on one of them: do tasks cross to the other node?
2. Domains rebuilt after CPU hotplug. CPU 3 is taken offline and back: Harmony's topology read
   before, while offline and after must show the domains gone and back exactly as they were,
   and single-source on CPUs 2-3 afterwards (tasks released on CPU 2) measures that balancing
   onto the CPU that returned resumes.

The runs are the guest agent's own captures (harmony.vm.guest: no pandas in the guest), landed
and analysed here; each run's kernel counters are the independent reading its migrations are
checked against. Prints the findings and writes them as JSON (``--json``).

Usage (the measurement lock held: a VM boot)::

    flock /tmp/harmony-measure.lock python3 bench/topology_known.py --kernel debian:6.12 \
        --out /tmp/known-612
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]     # this tree's Harmony, in the guest too
from common import table  # noqa: E402

from harmony.vm.topology import VmTopology  # noqa: E402

#: the machine: 4 nodes of 2 cores on a ring
NODES, CORES = 4, 2
VCPUS = NODES * CORES
HOTPLUG_CPU = 3
#: nodes 1 and 3 are two hops apart on the ring
FAR_NODES = (1, 3)


def ring_distance(a: int, b: int) -> int:
    hops = min((a - b) % NODES, (b - a) % NODES)
    return 10 + 10 * hops


@dataclasses.dataclass(frozen=True)
class RingTopology(VmTopology):
    """A node per socket whose distances are the ring's (:func:`ring_distance`), not one value
    between every pair: virtme-ng's ``--numa-distance`` per ordered pair of nodes."""

    def vng_args(self, memory_mb: int) -> list[str]:
        # and the kernel's sched_verbose: its boot account of each CPU's domains and groups
        args = super().vng_args(memory_mb) + ["--append", "sched_verbose"]
        for a in range(self.numa):
            for b in range(self.numa):
                if a != b:
                    args += ["--numa-distance", f"{a},{b}={ring_distance(a, b)}"]
        return args


RING = RingTopology(sockets=NODES, cores=CORES, numa=NODES)


def plan(out: Path, duration: float) -> None:
    """The guest's job: the two runs (their parameters drawn here, as a VM suite plans them)."""
    from harmony.experiments import get_experiment
    from harmony.vm.guest import PlannedRun, write_job

    exp = get_experiment("single-source")
    far = [c for n in FAR_NODES for c in range(n * CORES, n * CORES + CORES)]
    runs = []
    for name, cpus, layout in (("hotplug", [2, 3], [4, 0]),
                               ("ring", far, [2 * len(far)] + [0] * (len(far) - 1))):
        params = exp.resolve({"duration": duration, "layout": layout}, cpus)
        runs.append(PlannedRun.of(exp, params, cpus, out / name, "tracefs", 0))
    write_job(out / "job.json", runs)


def guest(out: Path) -> None:
    """In the guest: the boot's account of its groups, the topology around a hotplug, then the
    job's captures, each step said on the console as the guest agent's lines are."""
    from harmony.probes import domains
    from harmony.vm import guest as agent

    facts = agent.guest_facts()
    agent.emit("facts", facts={"kernel": facts.get("kernel")})
    res: dict = {"dmesg": [line for line in subprocess.run(
        ["dmesg"], capture_output=True, text=True).stdout.splitlines()
        if re.search(r"attaching sched-domain|domain-\d+:|groups:", line)]}
    res["before"] = domains.read()
    online = Path(f"/sys/devices/system/cpu/cpu{HOTPLUG_CPU}/online")
    online.write_text("0")
    time.sleep(0.5)
    res["offline"] = domains.read()
    online.write_text("1")
    time.sleep(0.5)
    res["online"] = domains.read()
    agent.emit("hotplug", offline=bool(res["offline"]["domains"].get(str(HOTPLUG_CPU))))
    (out / "known.json").write_text(json.dumps(res))
    res["failed"] = agent.run_job(agent.read_job(out / "job.json"), facts)
    (out / "known.json").write_text(json.dumps(res))


def groups_from_dmesg(lines: list[str]) -> dict[int, list[dict]]:
    """{cpu: [{level, name, span, groups: [span...]}, ...]} from sched_verbose's boot lines."""
    out: dict[int, list[dict]] = {}
    cpu = None
    for line in lines:
        m = re.search(r"CPU(\d+) attaching sched-domain", line)
        if m:
            cpu = int(m.group(1))
            out[cpu] = []
            continue
        m = re.search(r"domain-(\d+): span=(\S+) level=(\S+)", line)
        if m and cpu is not None:
            out[cpu].append({"level": int(m.group(1)), "span": m.group(2), "name": m.group(3),
                             "groups": []})
            continue
        if "groups:" in line and cpu is not None and out[cpu]:
            out[cpu][-1]["groups"] = re.findall(r"span=([0-9,\-]+)", line)
    return out


def node_of(cpu: int) -> int:
    return cpu // CORES


def analyse(out: Path) -> dict:
    """The findings from the guest's readings and runs (landed and analysed here)."""
    from harmony.core.osutil import parse_cpulist

    res = json.loads((out / "known.json").read_text())
    groups = groups_from_dmesg(res["dmesg"])
    first_numa = {c: next((d for d in lv if d["name"] == "NUMA"), None) for c, lv in groups.items()}
    one_node = [all(len({node_of(x) for x in parse_cpulist(g)}) == 1 for g in d["groups"])
                for d in first_numa.values() if d]
    spans = {k: {c: [d["span"] for d in v] for c, v in res[k]["domains"].items()}
             for k in ("before", "offline", "online")}
    second = {c: [d for d in lv if d["name"] == "NUMA"][1:2] for c, lv in groups.items()}
    findings = {
        "groups_read": len(groups),
        "first_numa_groups_one_node": bool(one_node) and all(one_node),
        "example_groups": {c: d["groups"] for c, d in list(first_numa.items())[:2] if d},
        # the level across the ring: its groups are other nodes' first-level spans, which
        # overlap (the groups of an overlapping domain, each seen from its own node)
        "second_numa_groups_cpu0": [d["groups"] for d in second.get(0, [])],
        "domains_before": spans["before"].get(str(HOTPLUG_CPU)),
        "cpu_offline_has_domains": bool(spans["offline"].get(str(HOTPLUG_CPU))),
        "others_spans_offline": spans["offline"].get("2"),
        "domains_back": spans["online"] == spans["before"],
        "failed_runs": res.get("failed"),
    }
    for name in ("hotplug", "ring"):
        findings[name] = run_findings(out / name, name)
    return findings


def run_findings(d: Path, name: str) -> dict | str:
    """One run's moves onto its target (hotplug: the CPU that came back; ring: the far node),
    their causes and levels, and the kernel's counters against them (per task, and per domain
    level from /proc/schedstat)."""
    from harmony.pipeline import analyse as analyse_run
    from harmony.run import land

    if not (d / "manifest.json").exists():
        return "not captured"
    land(d)
    run = analyse_run(d, figures=False)
    mig = run.migrations[run.migrations["t"] >= 0]
    src = run.manifest["cpus"][0]
    if name == "hotplug":
        onto = mig[mig["dst_cpu"] == HOTPLUG_CPU]
    else:       # the moves across the ring: from the release's node into the far one
        onto = mig[[node_of(d) != node_of(src) and node_of(s) == node_of(src)
                    for d, s in zip(mig["dst_cpu"], mig["src_cpu"])]]
    agree = run.manifest.get("kernel_counter_agreement") or {}
    levels = (run.manifest.get("schedstat_agreement") or {}).get("levels") or {}
    return {"moves": int(len(mig)), "onto": int(len(onto)),
            "causes": {str(k): int(v) for k, v in
                       onto["cause"].astype(str).value_counts().items()},
            # by index and key: the ring's two NUMA levels are NUMA and NUMA2
            "levels": {f"{i} {n}": int(v) for (i, n), v in
                       onto.groupby(["level", onto["level_name"].astype(str)]).size().items()},
            "first_onto_s": float(onto["t"].min()) if len(onto) else None,
            "counters_disagreeing": agree.get("disagreeing"),
            "schedstat_levels_within": {k: v.get("within") for k, v in levels.items()},
            "kernel": (run.manifest.get("host") or {}).get("kernel")}


def boot(kernel_spec: str, out: Path) -> dict:
    """One boot of ``kernel_spec`` on :data:`RING` running :func:`guest` (Harmony's own VM:
    QEMU under its reaper, the console in ``out/console.log``); what it cost: the boot, the
    wall time, and the worst vCPU thread's wait for a host CPU over each run's window."""
    from harmony.vm.kernels import kernel
    from harmony.vm.machine import VirtualMachine, vcpu_threads, vcpu_times, wait_fractions

    # the script puts this tree on its own path (the guest sees the host's files)
    command = ["env", "PYTHONDONTWRITEBYTECODE=1", sys.executable, "-P",
               str(Path(__file__).resolve()), "--guest", "--out", str(out)]
    vm = VirtualMachine(kernel(kernel_spec), VCPUS, 1024, topology=RING,
                        console_log=out / "console.log")
    windows: dict = {}
    said: list[str] = []

    def on_event(ev: dict, t: float):
        i = ev.get("run")
        if ev.get("event") in ("error", "fatal"):
            said.append(f"{ev['event']}: {ev.get('message')}")
            print(f"  the guest: {said[-1]}", file=sys.stderr)
        if ev.get("event") == "measuring" and vm.qemu_pid:
            threads = vcpu_threads(vm.qemu_pid, VCPUS)
            windows[i] = (t, threads, vcpu_times(vm.qemu_pid, threads))
        elif ev.get("event") == "measured" and i in windows:
            t0, threads, before = windows[i]
            fr = wait_fractions(before, vcpu_times(vm.qemu_pid, threads), t - t0)
            windows[i] = max(fr.values()) if fr else None
        return 600.0 if ev.get("event") in ("facts", "hotplug", "start") else None

    t0 = time.monotonic()
    rc = vm.run(command, out, on_event)
    return {"boot_s": vm.boot_s, "wall_s": time.monotonic() - t0, "returncode": rc,
            "accelerator": vm.accel, "topology": RING.describe(),
            "vcpu_wait_max": {i: v for i, v in windows.items() if not isinstance(v, tuple)},
            "guest_errors": said}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="debian:6.12")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--guest", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--analyse-only", action="store_true",
                    help="read back --out's guest readings and runs again (no VM)")
    a = ap.parse_args()
    if a.guest:
        try:
            guest(a.out)
        except Exception as exc:    # said where the host reads it, and in full below
            from harmony.vm import guest as agent

            agent.emit("fatal", message=f"{type(exc).__name__}: {exc}")
            raise
        return
    if a.analyse_only:
        vm = json.loads((a.out / "findings.json").read_text())["vm"]
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        plan(a.out, a.duration)
        vm = boot(a.kernel, a.out)
    if not (a.out / "known.json").exists():
        sys.exit(f"the guest wrote nothing (VM exit {vm['returncode']}; see "
                 f"{a.out / 'console.log'})")
    f = analyse(a.out)
    f["kernel_spec"], f["vm"] = a.kernel, vm
    (a.out / "findings.json").write_text(json.dumps(f, indent=1))
    if a.json:
        print(json.dumps(f, indent=1))
        return
    def yes(v):
        return "yes" if v else "no"

    rows = [["groups of the first NUMA level are single nodes",
             yes(f["first_numa_groups_one_node"])],
            ["example groups (CPU: first NUMA level)", json.dumps(f["example_groups"])],
            ["CPU 0's groups across the ring (second NUMA level)",
             json.dumps(f["second_numa_groups_cpu0"])],
            [f"CPU {HOTPLUG_CPU} has domains while offline", yes(f["cpu_offline_has_domains"])],
            ["CPU 2's spans while CPU 3 is offline", json.dumps(f["others_spans_offline"])],
            ["every CPU's domains back as before", yes(f["domains_back"])]]
    for name in ("hotplug", "ring"):
        v = f.get(name)
        rows.append([f"{name}: moves onto the target (all moves)",
                     v if isinstance(v, str) else f"{v['onto']} ({v['moves']}), first at "
                     f"{v['first_onto_s']:.3f} s, causes {v['causes']}, levels {v['levels']}"])
        if not isinstance(v, str):
            rows.append([f"{name}: counters disagreeing (tasks); schedstat levels agreeing",
                         f"{v['counters_disagreeing']}; {v['schedstat_levels_within']}"])
    print(f"{a.kernel}: one VM of {VCPUS} vCPUs, booted in {vm['boot_s']:.0f} s, "
          f"{vm['wall_s']:.0f} s in all; vCPU wait over the runs' windows "
          f"{json.dumps(vm['vcpu_wait_max'])}")
    table(["known answer", "measured"], rows)


if __name__ == "__main__":
    main()
