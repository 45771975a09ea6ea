"""VM fidelity study: which QEMU set-up gives results closest to a quiet machine?

Each set-up (``--setup``, a ``--vm-qemu`` setting) at each vCPU count (``--vm-cpus``) gets one boot
of ``--kernel`` running one plan, the quick forms of what the policy card reads:

- single-source x ``--reps`` (2P tasks on the first CPU: time to balance, migrations after it)
- detection x ``--reps`` (the target cut at a drawn time: the balancing rounds' intervals)
- duty x 1: single-source with one 50 % duty task per CPU (its share from the trace vs 50 %)

``--host`` runs the same plan on the host itself (all its CPUs), the quiet-ish reference for what
does not depend on the kernel version. ``--hog N`` keeps N busy processes on the host (nice 0, one
per host CPU in turn) while the set-ups run: a host that takes CPU time from the vCPU threads.

Per set-up, from the runs' manifests and tables (nothing asserted; bench/README.md keeps them):

  wait     the vCPU threads' wait for a host CPU, share of each run's window (median, max)
  clock    guest seconds per host second over the runs' windows (the guest agent's
           CLOCK_MONOTONIC at the two ends of the window against the host's)
  release  release spread (ms; median, max)
  balance  single-source time to balance (ms, median and range) and migrations after balance
  rounds   detection: the intervals between balancing rounds onto the target after the cut (ms,
           median and range), and how far they fall from a whole number of ticks (ms, median:
           the busy balance runs from the tick, so on a faithful machine this is ~0)
  duty     the 50 % tasks' share from the trace, worst distance from 50 % (percentage points)
  speed    loops per second of a task's run time in the trace, slowest task over fastest in a
           run (median over the runs): 1 when every CPU the guest sees runs as fast as the others
  card     the card's labels for balances, time to balance and detection from all these runs,
           and how many of them the card leaves out (starved vCPUs, busy host)
  wall     the boot (or the host plan), from start to the last analysis (s)

Every run directory stays under ``--out`` (``harmony report``, ``harmony infer`` read them).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from common import emit_json, median, need_root, table  # noqa: E402

from harmony import doctor, store  # noqa: E402
from harmony.analysis import policy, rounds  # noqa: E402
from harmony.batch import finish_batch, run_batch
from harmony.experiments import get_experiment  # noqa: E402
from harmony.runners import KernelRunner  # noqa: E402
from harmony.suite import QUICK  # noqa: E402
from harmony.vm.kernels import kernel as get_kernel  # noqa: E402
from harmony.vm.machine import QemuSetting  # noqa: E402
from harmony.vm.runner import VmRunner

#: the set-ups compared by default (names used in the tables and the directories)
SETUPS = {
    "multi": "accel=tcg,tcg=multi,pin=off",
    "multi-pin": "accel=tcg,tcg=multi,pin=on",
    "single": "accel=tcg,tcg=single,pin=off",
    "icount": "accel=tcg,tcg=icount,pin=off",
}
#: the plan of a boot: (directory, experiment, overrides of its quick form, repetitions or None
#: for --reps)
PLAN = (("single-source", "single-source", {}, None),
        ("detection", "detection", {}, None),
        ("duty", "single-source", {"duty": 50.0, "layout": "one per CPU"}, 1))


def plan_params(name: str, overrides: dict, cpus: list[int]) -> tuple[object, dict]:
    exp = get_experiment(name)
    over = {**QUICK.get(name, {}), **overrides}
    if over.get("layout") == "one per CPU":
        over["layout"] = [1] * len(cpus)
    return exp, exp.resolve(over, cpus)


def run_plan(runner, out: Path, cpus: list[int], reps: int) -> float:
    """Capture the plan through ``runner`` (entered here) into ``out``; the wall time."""
    t0 = time.monotonic()
    batches = []
    with runner:
        for sub, name, overrides, n in PLAN:
            exp, params = plan_params(name, overrides, cpus)
            run_batch(exp, params, cpus, out / sub, n or reps, runner, draw_first=False)
            batches.append(out / sub)
    for b in batches:
        finish_batch(b, figures=False)
    return time.monotonic() - t0


class Hogs:
    """N busy processes on the host (nice 0, pinned one per host CPU in turn), killed on exit."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        cpus = sorted(os.sched_getaffinity(0))
        for k in range(self.n):
            p = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 start_new_session=True)
            os.sched_setaffinity(p.pid, {cpus[k % len(cpus)]})
            self.procs.append(p)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        return False


# --- what the runs show -------------------------------------------------------------------------

def runs_of(d: Path) -> list:
    out = []
    for rep in sorted(d.glob("rep-*")):
        try:
            out.append(store.open_run(rep))
        except store.RunError as exc:
            print(f"  {rep}: not used ({exc})", file=sys.stderr)
    return out


def tick_ms(run, kernel) -> float | None:
    """The tick period of the kernel the run measured (its CONFIG_HZ): the run's facts, else the
    cached kernel's config."""
    hz = (run.manifest.get("under_test") or run.manifest.get("host") or {}).get("hz")
    if hz is None and kernel is not None:
        cfg = Path(kernel.image).parent / f"config-{kernel.release}"
        m = re.search(r"^CONFIG_HZ=(\d+)$", cfg.read_text() if cfg.exists() else "", re.M)
        hz = int(m.group(1)) if m else None
    return 1000.0 / hz if hz else None


def round_intervals(run) -> list[float]:
    """Intervals (ms) between the balancing rounds onto a detection run's target after the cut."""
    m, p = run.manifest, run.manifest["params"]
    r = rounds.df_target_rounds(run.migrations, m["cpus"][-1], p["round_gap_ms"],
                                t_from=p["cut_at_s"])
    starts = r.groupby("round")["ts"].min().to_numpy(dtype=np.int64)
    return (np.diff(starts) / 1e6).tolist()


def speed_ratio(run) -> float | None:
    """Slowest task's loops per second of its run time in the trace over the fastest's."""
    work = run.manifest.get("work_done")
    sh = run.shares
    if not work or len(work) != len(sh):
        return None
    speed = np.asarray(work, float) / sh["cpu_time"].to_numpy()
    speed = speed[np.isfinite(speed) & (speed > 0)]
    return float(speed.min() / speed.max()) if len(speed) else None


def card_of(runs: list) -> tuple[dict, int]:
    """The card's labels from all these runs, and how many the card itself would leave out."""
    ev = [policy.Evidence(r.path, r.manifest["experiment"], r.manifest.get("params", {}),
                          len(r.manifest.get("cpus", [])), r.summary, policy.setup_of(r.manifest))
          for r in runs]
    card = policy.infer_evidence(ev)
    _, skipped = policy.collect([r.path for r in runs])
    return ({q: card.answer(q).label for q in ("balances", "time_to_balance", "detection")},
            len(skipped))


def figures(out: Path, kernel=None) -> dict:
    ss, det, duty = (runs_of(out / sub) for sub, *_ in PLAN)
    every = ss + det + duty
    vm = [r.manifest.get("vm") or {} for r in every]
    waits = [v.get("vcpu_wait_max") for v in vm if v.get("vcpu_wait_max") is not None]
    clocks = [v.get("guest_clock_rate") for v in vm if v.get("guest_clock_rate")]
    spread = [(r.manifest.get("release") or {}).get("release_spread_ns") for r in every]
    spread = [s / 1e6 for s in spread if s is not None]
    ttb = [r.summary.get("time_to_balance_s") for r in ss]
    after = [r.summary.get("migrations_after_balance") for r in ss]
    ivals, off = [], []
    for r in det:
        tick = tick_ms(r, kernel)
        for iv in round_intervals(r):
            ivals.append(iv)
            if tick:
                off.append(abs(iv - tick * round(iv / tick)))
    duty_pp = [float(np.max(np.abs(r.shares["share"].to_numpy() - r.manifest["params"]["duty"]
                                   / 100))) * 100 for r in duty]
    speeds = [s for s in (speed_ratio(r) for r in ss + duty) if s is not None]
    labels, skipped = card_of(ss + det) if ss + det else ({}, 0)
    return {"runs": len(every), "wait_median": median(waits), "wait_max": max(waits, default=None),
            "clock_median": median(clocks), "clock_min": min(clocks, default=None),
            "clock_max": max(clocks, default=None),
            "release_ms_median": median(spread), "release_ms_max": max(spread, default=None),
            "time_to_balance_ms": [None if t is None else t * 1000 for t in ttb],
            "migrations_after_balance": after,
            "round_intervals_ms": ivals, "tick_offset_ms_median": median(off),
            "duty_worst_pp": max(duty_pp, default=None),
            "speed_ratio_median": median(speeds), "card": labels, "card_runs": len(ss + det),
            "card_not_used": skipped,
            "boot_s": median(v.get("boot_s") for v in vm if v)}


def _range(values) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    return f"{median(v):.0f} [{min(v):.0f}-{max(v):.0f}]"


def _num(v, fmt) -> str:
    return "n/a" if v is None or v != v else format(v, fmt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="debian:6.12", help="kernel under test (debian:6.12)")
    ap.add_argument("--vm-cpus", default="2,4", help="vCPU counts, comma-separated (2,4)")
    ap.add_argument("--setup", action="append", metavar="NAME[=SETTING]",
                    help=f"a set-up: one of {', '.join(SETUPS)}, or NAME=--vm-qemu setting "
                         "(repeatable; default: all four)")
    ap.add_argument("--host", action="store_true", help="the same plan on the host too")
    ap.add_argument("--hog", type=int, default=0, help="busy processes on the host meanwhile")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of single-source, detection")
    ap.add_argument("--out", type=Path, default=Path("runs") / time.strftime("fidelity-%Y%m%d-%H%M%S"),
                    help="directory for every run (runs/fidelity-<time>)")
    ap.add_argument("--json", help="also write the figures as JSON here ('-': stdout)")
    args = ap.parse_args(argv)
    need_root("bench/fidelity.py")
    setups = {}
    try:
        for s in args.setup or list(SETUPS):
            name, _, setting = s.partition("=")
            if not setting and name not in SETUPS:
                raise ValueError(f"--setup {name}: choose {', '.join(SETUPS)} or NAME=SETTING")
            setups[name] = QemuSetting.parse(setting or SETUPS[name])
        vcpus = [int(p) for p in args.vm_cpus.split(",") if p.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if not vcpus and not args.host:
        ap.error("nothing to run: give --vm-cpus or --host")
    facts = doctor.run_facts(doctor.doctor(mount=False, test_record=False))
    kernel = (get_kernel(args.kernel, progress=lambda line: print(line, file=sys.stderr))
              if vcpus else None)
    hog = f"-hog{args.hog}" if args.hog else ""
    rows = {}
    with Hogs(args.hog):
        if args.host:
            cpus = sorted(os.sched_getaffinity(0))
            label = f"host-p{len(cpus)}{hog}"
            print(f"{label}: the plan on the host", file=sys.stderr)
            wall = run_plan(KernelRunner("tracefs", facts, overlap=False, cpus=cpus),
                            args.out / label, cpus, args.reps)
            rows[label] = {**figures(args.out / label), "wall_s": wall}
        for p in vcpus:
            for name, setting in setups.items():
                label = f"p{p}-{name}{hog}"
                print(f"{label}: {kernel.describe()}, {p} vCPUs, {setting.text()}",
                      file=sys.stderr)
                runner = VmRunner(kernel, p, 2048, setting, facts=facts,
                                  say=lambda line: print(f"  vm: {line}", file=sys.stderr))
                wall = run_plan(runner, args.out / label, list(range(p)), args.reps)
                rows[label] = {**figures(args.out / label, kernel), "wall_s": wall,
                               "setting": setting.text()}
    print(f"kernel under test {kernel.describe() if kernel else 'none'}; host {facts.get('kernel')} "
          f"({facts.get('ncpus')} CPUs){'; ' + str(args.hog) + ' busy processes' if hog else ''}"
          f"; {args.reps} single-source + {args.reps} detection + 1 duty run per set-up")
    table(["set-up", "wait med/max", "clock", "release ms", "balance ms", "after bal.",
           "rounds ms", "tick off ms", "duty pp", "speed", "not used", "wall s"],
          [[k, f"{_num(r['wait_median'], '.0%')}/{_num(r['wait_max'], '.0%')}",
            f"{_num(r['clock_median'], '.3f')} ({_num(r['clock_min'], '.2f')}-"
            f"{_num(r['clock_max'], '.2f')})",
            f"{_num(r['release_ms_median'], '.2f')} / {_num(r['release_ms_max'], '.1f')}",
            _range(r["time_to_balance_ms"]),
            ",".join("-" if a is None else str(a) for a in r["migrations_after_balance"]),
            _range(r["round_intervals_ms"]), _num(r["tick_offset_ms_median"], ".2f"),
            _num(r["duty_worst_pp"], ".2f"), _num(r["speed_ratio_median"], ".2f"),
            f"{r['card_not_used']}/{r['card_runs']}", f"{r['wall_s']:.0f}"]
           for k, r in rows.items()])
    print()
    table(["set-up", "balances", "time to balance", "detection"],
          [[k, *(r["card"].get(q) for q in ("balances", "time_to_balance", "detection"))]
           for k, r in rows.items()])
    out = {"kernel": kernel.describe() if kernel else None, "host": facts.get("kernel"), "hog": args.hog,
           "reps": args.reps, "setups": rows}
    emit_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
