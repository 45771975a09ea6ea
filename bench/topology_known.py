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
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]     # this tree's Harmony, in the guest too
from common import table  # noqa: E402

#: the machine: 4 nodes of 2 cores on a ring
NODES, CORES = 4, 2
VCPUS = NODES * CORES
HOTPLUG_CPU = 3
#: nodes 1 and 3 are two hops apart on the ring
FAR_NODES = (1, 3)


def ring_distance(a: int, b: int) -> int:
    hops = min((a - b) % NODES, (b - a) % NODES)
    return 10 + 10 * hops


def vng_args(kernel_image: Path, out: Path, memory_mb: int = 1024) -> list[str]:
    per = memory_mb // NODES
    argv = ["vng", "--verbose", "--run", str(kernel_image), "--disable-kvm", "--memory",
            f"{per * NODES}M", "--cpus", f"{VCPUS},sockets={NODES},cores={CORES},threads=1",
            "--rwdir", str(out), "--append", "sched_verbose"]
    for n in range(NODES):
        argv += ["--numa", f"{per}M,cpus={n * CORES}-{n * CORES + CORES - 1}"]
    for a in range(NODES):
        for b in range(NODES):
            if a != b:
                argv += ["--numa-distance", f"{a},{b}={ring_distance(a, b)}"]
    return argv


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
    job's captures."""
    from harmony.probes import domains
    from harmony.vm import guest as agent

    res: dict = {"dmesg": [line for line in subprocess.run(
        ["dmesg"], capture_output=True, text=True).stdout.splitlines()
        if re.search(r"attaching sched-domain|domain-\d+:|groups:", line)]}
    facts = agent.guest_facts()
    res["before"] = domains.read()
    online = Path(f"/sys/devices/system/cpu/cpu{HOTPLUG_CPU}/online")
    online.write_text("0")
    time.sleep(0.5)
    res["offline"] = domains.read()
    online.write_text("1")
    time.sleep(0.5)
    res["online"] = domains.read()
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
    from harmony.pipeline import analyse as analyse_run
    from harmony.run import land

    res = json.loads((out / "known.json").read_text())
    groups = groups_from_dmesg(res["dmesg"])
    first_numa = {c: next((d for d in lv if d["name"] == "NUMA"), None) for c, lv in groups.items()}
    one_node = [all(len({node_of(x) for x in parse_cpulist(g)}) == 1 for g in d["groups"])
                for d in first_numa.values() if d]
    spans = {k: {c: [d["span"] for d in v] for c, v in res[k]["domains"].items()}
             for k in ("before", "offline", "online")}
    findings = {
        "groups_read": len(groups),
        "first_numa_groups_one_node": bool(one_node) and all(one_node),
        "example_groups": {c: d["groups"] for c, d in list(first_numa.items())[:2] if d},
        "domains_before": spans["before"].get(str(HOTPLUG_CPU)),
        "cpu_offline_has_domains": bool(spans["offline"].get(str(HOTPLUG_CPU))),
        "others_spans_offline": spans["offline"].get("2"),
        "domains_back": spans["online"] == spans["before"],
        "failed_runs": res.get("failed"),
    }
    for name in ("hotplug", "ring"):
        d = out / name
        if not (d / "manifest.json").exists():
            findings[name] = "not captured"
            continue
        land(d)
        run = analyse_run(d, figures=False)
        mig = run.migrations[run.migrations["t"] >= 0]
        cpus = run.manifest["cpus"]
        src = cpus[0]
        if name == "hotplug":
            onto = mig[mig["dst_cpu"] == HOTPLUG_CPU]
        else:
            onto = mig[[node_of(c) != node_of(src) for c in mig["dst_cpu"]]]
        agree = run.manifest.get("kernel_counter_agreement") or {}
        findings[name] = {"moves": int(len(mig)), "onto": int(len(onto)),
                          "causes": {str(k): int(v) for k, v in
                                     onto["cause"].astype(str).value_counts().items()},
                          "first_onto_s": float(onto["t"].min()) if len(onto) else None,
                          "counters_disagreeing": agree.get("disagreeing"),
                          "kernel": (run.manifest.get("host") or {}).get("kernel")}
    return findings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="debian:6.12")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--guest", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.guest:
        guest(a.out)
        return
    from harmony.vm.kernels import kernel

    a.out.mkdir(parents=True, exist_ok=True)
    k = kernel(a.kernel)
    plan(a.out, a.duration)
    t0 = time.monotonic()
    cmd = vng_args(k.image, a.out) + ["--", f"env PYTHONPATH={ROOT} {sys.executable} "
                                             f"{Path(__file__).resolve()} --guest --out {a.out}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    (a.out / "vng.log").write_text(p.stdout + p.stderr)
    boot_s = time.monotonic() - t0
    if not (a.out / "known.json").exists():
        sys.exit(f"the guest wrote nothing (vng exit {p.returncode}; see {a.out / 'vng.log'})")
    f = analyse(a.out)
    f["kernel_spec"], f["vm_s"] = a.kernel, boot_s
    (a.out / "findings.json").write_text(json.dumps(f, indent=1))
    if a.json:
        print(json.dumps(f, indent=1))
        return
    rows = [["groups of the first NUMA level are single nodes", f["first_numa_groups_one_node"]],
            ["example groups (CPU: first NUMA level)", json.dumps(f["example_groups"])],
            [f"CPU {HOTPLUG_CPU} has domains while offline", f["cpu_offline_has_domains"]],
            ["CPU 2's spans while CPU 3 is offline", json.dumps(f["others_spans_offline"])],
            ["every CPU's domains back as before", f["domains_back"]]]
    for name in ("hotplug", "ring"):
        v = f.get(name)
        rows.append([f"{name}: moves onto the target (all moves)",
                     v if isinstance(v, str) else f"{v['onto']} ({v['moves']}), first at "
                     f"{v['first_onto_s']} s, causes {v['causes']}, counters disagreeing "
                     f"{v['counters_disagreeing']}"])
    print(f"{a.kernel}: one VM of {VCPUS} vCPUs in {boot_s:.0f} s")
    table(["known answer", "measured"], rows)


if __name__ == "__main__":
    main()
