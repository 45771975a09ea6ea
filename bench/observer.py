"""Observer-effect benchmark: what recording costs the workload, and what rate it records losslessly.

Part 1, work rate: one CPU-bound worker per CPU (``harmony.controller.Workload``), released and
left running for ``--seconds``; the rate is the sum of their work counters
(``Workload.work_done()``, loops per second). Probe off and probe on (the tracefs probe recording
the sched tracepoints, as in a run) alternate: off, on, off, on, ... Loss = 1 - the median over the
pairs of on/off (paired, so a slow drift of the host cancels). Target < 1 %. The noise is the
spread of the off samples; a loss smaller than the noise cannot be told from zero, and the
verdict then says so instead of passing.

Part 2, lossless rate: pipe ping-pong pairs (each round: two wake-ups and four context switches)
at rising rates under the tracefs probe with its default buffer; the events the kernel dropped
are read from the probe's per-CPU stats and the decoded trace. Target: zero lost events; the
table gives the highest event rate recorded with zero loss.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def work_rate(cpus: list[int], seconds: float, probe_dir: Path | None) -> tuple[float, float]:
    """(work loops per second of one CPU-bound worker per CPU, CPU share this process used
    meanwhile: the probe's drain threads) with the probe on if probe_dir."""
    from harmony.controller import Workload
    from harmony.probes.tracefs import TracefsProbe
    from harmony.tasks import TaskSpec

    specs = [TaskSpec(name=f"ob{i}", initial_cpu=c) for i, c in enumerate(cpus)]
    with Workload(specs, cpus) as w:
        w.spawn()
        probe = TracefsProbe(probe_dir, cpus, seconds) if probe_dir else None
        if probe:
            probe.start()
        try:
            w.release(probe.mark if probe else (lambda text: time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
            time.sleep(0.2)  # leave out the start-up
            a, ta, ca = w.work_done().sum(), time.monotonic(), _own_cpu_s()
            time.sleep(seconds)
            b, tb, cb = w.work_done().sum(), time.monotonic(), _own_cpu_s()
        finally:
            w.stop()
            if probe:
                probe.stop()
    return float(b - a) / (tb - ta), (cb - ca) / ((tb - ta) * len(cpus))


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def lossless_level(rate: float, pairs: int, seconds: float, out: Path) -> dict:
    """Ping-pong at ``rate`` rounds/s per pair (0 = flat out) under the probe; events and losses."""
    from harmony.host import online_cpus
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracefs import TracefsProbe

    probe = TracefsProbe(out, online_cpus(), seconds)
    probe.start()
    try:
        t = time.monotonic()
        common.pingpong(pairs, rate, seconds)
        wall = time.monotonic() - t
    finally:
        probe.stop()
    cap = decode_dir(out)
    stats = probe.meta.get("stats", {})
    dropped = sum(int(s.get("dropped events", 0)) + int(s.get("overrun", 0)) for s in stats.values())
    return {"requested_rounds_per_s": rate * pairs, "events": int(cap.meta["n_events"]),
            "events_per_s": cap.meta["n_events"] / wall, "lost": int(cap.meta["lost_events"]),
            "kernel_dropped": dropped, "raw_bytes": int(cap.meta["bytes"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per work-rate sample")
    ap.add_argument("--pairs", type=int, default=4, help="off/on pairs of work-rate samples (default %(default)s)")
    ap.add_argument("--rates", default="1000,5000,20000,0",
                    help="ping-pong rounds/s per pair, rising; 0 = as fast as possible (default %(default)s)")
    ap.add_argument("--pp-pairs", type=int, default=2, help="ping-pong pairs (default %(default)s)")
    ap.add_argument("--pp-seconds", type=float, default=2.0, help="seconds per ping-pong level")
    ap.add_argument("--skip-work", action="store_true", help="only the lossless-rate part")
    ap.add_argument("--skip-lossless", action="store_true", help="only the work-rate part")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    try:
        rates = [float(x) for x in a.rates.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--rates: not a list of numbers: {a.rates!r}")
    if a.seconds <= 0 or a.pairs < 1 or a.pp_pairs < 1 or a.pp_seconds <= 0 or any(r < 0 for r in rates):
        ap.error("--seconds, --pairs, --pp-pairs, --pp-seconds must be positive, --rates not negative")
    common.need_root("the observer benchmark")
    from harmony.host import online_cpus

    cpus = online_cpus()
    result: dict = {"benchmark": "observer", "cpus": cpus}
    lock = common.host_lock()  # no Harmony run may share the CPUs with this measurement
    try:
        with tempfile.TemporaryDirectory(prefix="harmony-bench-observer-") as tmp:
            if not a.skip_work:
                off, on, own_off, own_on = [], [], [], []
                for i in range(a.pairs):
                    rate, own = work_rate(cpus, a.seconds, None)
                    off.append(rate)
                    own_off.append(own)
                    rate, own = work_rate(cpus, a.seconds, Path(tmp) / f"on{i}")
                    on.append(rate)
                    own_on.append(own)
                loss = 1 - common.median([b / x for x, b in zip(off, on)])
                print(f"work rate of {len(cpus)} CPU-bound workers, {a.pairs} interleaved off/on pairs of "
                      f"{a.seconds:g} s\n")
                common.table(["probe", "median loops/s", "samples (loops/s)"],
                             [["off", common.median(off), ", ".join(f"{x:,.0f}" for x in off)],
                              ["on", common.median(on), ", ".join(f"{x:,.0f}" for x in on)]])
                spread = (max(off) - min(off)) / common.median(off)
                print(f"\nloss {loss:+.2%} (median of the paired on/off ratios); noise: the off samples "
                      f"spread over {spread:.2%} of their median")
                probe_cpu = common.median(own_on) - common.median(own_off)
                print(f"CPU taken by the probe's drain threads: {probe_cpu:.3%} of the CPU set "
                      f"(this process's CPU time, probe on minus off)")
                result["work"] = {"off": off, "on": on, "loss": loss, "off_spread": spread,
                                  "probe_cpu_share": probe_cpu}
            if not a.skip_lossless:
                levels = [lossless_level(r, a.pp_pairs, a.pp_seconds, Path(tmp) / f"pp{k}")
                          for k, r in enumerate(rates)]
                print(f"\nping-pong under the tracefs probe, {a.pp_pairs} pairs, {a.pp_seconds:g} s per level\n")
                common.table(["rounds/s asked", "events", "events/s", "lost (decoded)", "dropped (kernel)"],
                             [["max" if lv["requested_rounds_per_s"] == 0 else lv["requested_rounds_per_s"],
                               lv["events"], lv["events_per_s"], lv["lost"], lv["kernel_dropped"]]
                              for lv in levels])
                clean = [lv for lv in levels if lv["lost"] == 0 and lv["kernel_dropped"] == 0]
                best = max((lv["events_per_s"] for lv in clean), default=None)
                result["lossless"] = {"levels": levels, "max_lossless_events_per_s": best}
    finally:
        lock.release()
    print()
    if "work" in result:
        w = result["work"]
        resolved = w["off_spread"] < 0.01
        print(common.verdict("observer loss < 1 %", (w["loss"] < 0.01) if resolved else None,
                             f"{w['loss']:+.2%}" + ("" if resolved else
                                                   f"; not resolved: the host's own noise is {w['off_spread']:.1%} "
                                                   "(the vCPUs' speed varies); rerun on a quiet host")))
        print(common.verdict("probe's own CPU use < 1 % of the CPU set", w["probe_cpu_share"] < 0.01,
                             f"{w['probe_cpu_share']:.3%} (drain threads only; the tracepoints' inline cost "
                             "is charged to the tasks that hit them)"))
    if "lossless" in result:
        lv = result["lossless"]["levels"]
        best = result["lossless"]["max_lossless_events_per_s"]
        print(common.verdict("zero lost events at every level", all(x["lost"] == 0 and x["kernel_dropped"] == 0 for x in lv),
                             f"highest rate with zero loss: {best:,.0f} events/s" if best else "every level lost events"))
    common.emit_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
