"""Guest profile bench: where the guest agent's time goes between a VM suite's windows.

Plans a job of the quick suite's runs (``--experiments``, each ``--repeat`` times) as a VM suite
does, boots the kernel under test (``--kernel``, default the sched-ext recipe's build, with
``--scx``, default scx_simple) in virtme-ng as Harmony does (P vCPUs under TCG), and runs the
guest agent over the job under cProfile. Prints, per run, the guest's set-up (its start to its
window) and teardown (the window's end to the run written), from the agent's own lines, and the
profile's functions by cumulative time (``--top``), with the calls and seconds a run.

cProfile slows the Python code it watches (not the kernel's work, nor the windows): read the
figures as shares and as one tree against another (``PYTHONPATH=TREE python3
TREE/bench/guest_profile.py``: the guest runs the Harmony this script imports), not as a
suite's wall time, which bench/vm_suite.py measures. The runs land in ``--out`` (kept) as the
guest wrote them, with ``prof.pstats`` beside the job, for ``python -m pstats``.
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, need_root, table  # noqa: E402
from vm_suite import guest_events, runs_in_guest  # noqa: E402

DEFAULT_EXPERIMENTS = "detection,priority-classes,server,how-many"


def plan_job(job: Path, experiments: list[str], repeat: int, scx_spec, vcpus: int) -> int:
    """The job file of the quick suite's configurations of ``experiments`` at ``vcpus``
    (``repeat`` runs each) in ``job``; how many runs."""
    from harmony import suite
    from harmony.experiments import get_experiment
    from harmony.vm.guest import PlannedRun, write_job

    cpus = list(range(vcpus))
    runs = []
    for cfg in suite.plan(cpus, quick=True):
        if cfg.experiment not in experiments:
            continue
        for _ in range(repeat):
            out = job / "out" / f"r{len(runs):02d}"
            out.mkdir(parents=True)
            runs.append(PlannedRun.of(get_experiment(cfg.experiment), dict(cfg.params), cpus, out,
                                      "tracefs", len(runs), scx_spec))
    write_job(job / "job.json", runs)
    return len(runs)


def guest_runs(console: Path) -> list[dict]:
    """Per run: set-up and teardown in the guest, from the agent's lines (as bench/vm_suite.py
    reads them)."""
    return [{"run": i, "setup_s": r["setup"], "teardown_s": r["teardown"],
             "failed": "t_error" in r}
            for i, r in enumerate(runs_in_guest(guest_events(console)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="sched-ext", help="the kernel under test (default the "
                    "sched-ext recipe's build)")
    ap.add_argument("--scx", default="simple", help="a sched_ext scheduler ('' for none)")
    ap.add_argument("--vm-cpus", type=int, default=4)
    ap.add_argument("--experiments", default=DEFAULT_EXPERIMENTS,
                    help=f"the quick suite's experiments to run (default {DEFAULT_EXPERIMENTS})")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    ap.add_argument("--top", type=int, default=30, help="functions shown")
    ap.add_argument("--out", help="keep the job, its runs and prof.pstats here")
    ap.add_argument("--json", help="also write the figures as JSON here ('-': stdout)")
    args = ap.parse_args()
    if args.vm_cpus < 1 or args.repeat < 1 or args.top < 1:
        ap.error("--vm-cpus, --repeat and --top must be at least 1")
    need_root("guest_profile")
    import harmony
    from harmony.core.errors import HarmonyError
    from harmony.hygiene import HostLock
    from harmony.vm import kernels
    from harmony.vm import scx as scx_mod
    from harmony.vm.bundle import guest_command, write_bundle
    from harmony.vm.machine import QemuSetting, vng_argv

    try:
        kernel = kernels.kernel(args.kernel)
        spec = (scx_mod.resolve(args.scx, None, Path(kernel.image).parent) if args.scx
                else None)
    except HarmonyError as exc:
        print(f"guest_profile: {exc}", file=sys.stderr)
        return 2
    experiments = [e.strip() for e in args.experiments.split(",") if e.strip()]
    job = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="guest-profile-",
                                                                dir="/var/tmp"))
    if args.out:
        shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True, exist_ok=True)
    try:
        if spec is not None:        # the guest does not see the kernel cache (a tmpfs there)
            shutil.copy2(spec.path, job / Path(spec.path).name)
            spec = scx_mod.ScxSpec(spec.name, str(job / Path(spec.path).name), spec.args)
        n = plan_job(job, experiments, args.repeat, spec, args.vm_cpus)
        if n == 0:
            print(f"guest_profile: no quick-suite run of {', '.join(experiments)}",
                  file=sys.stderr)
            return 2
        prof = job / "prof.pstats"
        # the agent's own first steps (harmony.vm.agent), then its main under the profiler
        code = ("import cProfile, sys; from harmony.workload import forkserver; "
                "forkserver.fork_now(); import harmony.vm.guest as g; "
                "cProfile.run('g.main(sys.argv[1:2])', sys.argv[2])")
        tree = Path(harmony.__file__).resolve().parent.parent     # where this Harmony is
        command = guest_command(write_bundle(job), ["PYTHONDONTWRITEBYTECODE=1",
                                                    f"PYTHONPATH={tree}"],
                                ["python3", "-S", "-c", code, str(job / "job.json"),
                                 str(prof)])
        setting, _ = QemuSetting().resolved(args.vm_cpus, len(os.sched_getaffinity(0)))
        argv = vng_argv(kernel, args.vm_cpus, 2048, job, command, setting, "tcg")
        console = job / "console.log"
        print(f"{n} runs of {', '.join(experiments)} in {kernel.describe()} at P = "
              f"{args.vm_cpus}{f', {spec.name}' if spec else ''}, the guest under cProfile",
              file=sys.stderr)
        t0 = time.monotonic()
        with HostLock(), open(console, "w") as f:
            p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=900)
        wall = time.monotonic() - t0
        if not prof.is_file():
            print(f"guest_profile: the guest wrote no profile (exit {p.returncode}): "
                  f"see {console}", file=sys.stderr)
            return 1
        runs = guest_runs(console)
        stats = pstats.Stats(str(prof))
        rows = sorted(((f"{Path(k[0]).name}:{k[1]}({k[2]})", v[1], v[3])
                       for k, v in stats.stats.items()), key=lambda r: -r[2])[:args.top]
        print(f"wall {wall:.1f} s (boot included); {len(runs)} runs; set-up "
              f"{sum(r['setup_s'] for r in runs):.2f} s, teardown "
              f"{sum(r['teardown_s'] or 0 for r in runs):.2f} s in the guest")
        table(["run", "set-up s", "teardown s", ""],
              [[r["run"], f"{r['setup_s']:.2f}",
                "" if r["teardown_s"] is None else f"{r['teardown_s']:.2f}",
                "failed" if r["failed"] else ""] for r in runs])
        print()
        table(["function (cumulative)", "calls/run", "s/run"],
              [[name, f"{calls / max(1, len(runs)):.1f}", f"{cum / max(1, len(runs)):.3f}"]
               for name, calls, cum in rows])
        if args.json:
            emit_json(args.json, {"wall_s": wall, "runs": runs, "job": str(job),
                                  "top": [{"function": n_, "calls": c, "cumulative_s": s}
                                          for n_, c, s in rows]})
        return 0
    finally:
        if not args.out:
            shutil.rmtree(job, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
