"""The recording probes side by side: tracefs, perf (``perf record``) and pyperf (the kernel's
python-perf binding, read in-process), interleaved in one run.

Part 1, start and stop: ``--reps`` recordings of ``--seconds`` each per probe, in rotating order,
each alone (``harmony run``) and within the probe's session (the runs of a suite or batch: the
first one's start and the last one's stop excluded, as a session pays them once): start() (until
the recording is live), stop() (until it returns), and for pyperf, whose events the kernel
removes in the background after stop() (~0.3 s of RCU grace periods, no CPU), the time until
they are gone. The decode of the recording is timed too.

Part 2, observer effect and losses under a storm: ``--pairs`` ping-pong pairs (two processes
passing a byte back and forth through pipes: each round two wake-ups and four context switches,
the load that makes the most sched events per second) run flat out for ``--window`` seconds,
with no probe and under each probe, in rotating order, ``--rounds`` times. The probe is started
before its window and stopped after it (neither timed), its threads (and perf record's) raised
to SCHED_FIFO for the window as a run raises them. Per probe: the rounds per second the pairs
made, relative to the no-probe windows (median over the rounds of each window against the mean
of the no-probe windows next to it: a slow drift of the host cancels), the events recorded per
second, the events lost, and the probe's own CPU time (this process's threads, or perf
record's) as a share of one CPU. Then the same again with every probe's rings made as small as
``--small-kb`` per CPU (tracefs's buffer_size_kb, perf's ``-m``, pyperf's pages): how soon each
drain empties its rings, where the defaults (tracefs 8 MiB, perf and pyperf 4 MiB a CPU) hide it.

Part 3, the binding's own reader: a storm of ``--window`` seconds recorded through the binding
with no drain (rings large enough to hold it), then every record read with
``evlist.read_on_cpu`` and the fields the events table needs (what the binding offers), against
the pyperf probe's way on the same storm (the rings' bytes copied to a file, decoded after):
microseconds per event.

Suite efficiency is ``bench/suite_efficiency.py --probe pyperf`` (and perf, tracefs).
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROBES = ("tracefs", "perf", "pyperf")
PAGE = mmap.PAGESIZE

#: ping-pong pairs passing a byte back and forth for argv[2] seconds; prints the rounds made
PINGPONG = """
import os, sys, time
pairs, seconds = int(sys.argv[1]), float(sys.argv[2])
out_r, out_w = os.pipe()
kids = []
for _ in range(pairs):
    a, b = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            while os.read(a[0], 1) != b"q":
                os.write(b[1], b"x")
            os._exit(0)
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(64):
                os.write(a[1], b"x")
                os.read(b[0], 1)
            n += 64
        os.write(a[1], b"q")
        os.wait()
        os.write(out_w, f"{n}\\n".encode())
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
os.close(out_w)
print(sum(int(x) for x in os.read(out_r, 1 << 16).split()))
"""


def _available(names) -> dict[str, str]:
    """{probe: why it cannot record here} for those of ``names`` that cannot."""
    from harmony.probes import get_probe

    out = {}
    for name in names:
        ok, why = get_probe(name).available()
        if not ok:
            out[name] = why
    return out


def _wait_gone() -> None:
    from harmony.probes.pyperf_ring import wait_closed
    wait_closed()


def start_stop(names, reps: int, seconds: float, tmp: Path) -> dict:
    """Part 1: {probe: {"alone": {start, stop, gone, decode: [s]}, "session": {...}}}."""
    from harmony.probes import get_probe

    out = {n: {"alone": {"start": [], "stop": [], "gone": [], "decode": []},
               "session": {"start": [], "stop": []}} for n in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            cls = get_probe(name)
            d = tmp / f"ss-{name}-{rep}"
            p = cls(d, [0, 1], seconds)
            t = time.perf_counter()
            p.start()
            t1 = time.perf_counter()
            p.mark("harmony t0")
            time.sleep(seconds)
            t2 = time.perf_counter()
            p.stop()
            t3 = time.perf_counter()
            _wait_gone()
            t4 = time.perf_counter()
            cls.decode_dir(d)
            t5 = time.perf_counter()
            a = out[name]["alone"]
            a["start"].append(t1 - t)
            a["stop"].append(t3 - t2)
            a["gone"].append(t4 - t2)
            a["decode"].append(t5 - t4)
            shutil.rmtree(d, ignore_errors=True)
    for name in names:
        cls = get_probe(name)
        with cls.session():
            for k in range(reps + 1):
                d = tmp / f"se-{name}-{k}"
                p = cls(d, [0, 1], seconds)
                t = time.perf_counter()
                p.start()
                t1 = time.perf_counter()
                time.sleep(seconds)
                t2 = time.perf_counter()
                p.stop()
                t3 = time.perf_counter()
                if k:        # the session's first start and its end are paid once
                    out[name]["session"]["start"].append(t1 - t)
                    out[name]["session"]["stop"].append(t3 - t2)
                shutil.rmtree(d, ignore_errors=True)
        _wait_gone()
    return out


def _cpu_s(tids: list[int]) -> float:
    """CPU seconds the threads ``tids`` used so far (utime + stime)."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        try:
            fields = Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / tick


@contextlib.contextmanager
def small_rings(kb: int | None):
    """Each probe's ring buffers of ``kb`` KiB per CPU for the block (None: their defaults):
    tracefs's and pyperf's expert options, perf's ``-m`` (the size it computes, replaced)."""
    if not kb:
        yield
        return
    from harmony.probes import perf as perf_probe

    saved = perf_probe.mmap_pages_for
    env = {"HARMONY_TRACEFS_BUFFER_KB": str(kb), "HARMONY_PYPERF_PAGES": str(kb * 1024 // PAGE)}
    os.environ.update(env)
    perf_probe.mmap_pages_for = lambda duration_s, ncpus: kb * 1024 // PAGE
    try:
        yield
    finally:
        perf_probe.mmap_pages_for = saved
        for k in env:
            del os.environ[k]


def storm(names, rounds: int, pairs: int, window: float, tmp: Path,
          ring_kb: int | None = None) -> dict:
    """Part 2: {probe or "none": [{"rounds_s", "events_s", "lost", "own_cpu"}, ...]}."""
    from harmony.workload.controller import lower_threads, raise_threads
    from harmony.probes import get_probe

    conds = ["none", *names]
    out: dict = {c: [] for c in conds}
    for r in range(rounds):
        for cond in conds[r % len(conds):] + conds[:r % len(conds)]:
            p, d = None, tmp / f"st-{cond}-{r}"
            if cond != "none":
                with small_rings(ring_kb):
                    p = get_probe(cond)(d, [0, 1], window)
                    p.start()
            own = [int(t) for t in os.listdir("/proc/self/task")]
            helpers = p.helper_tids() if p else []
            raised = raise_threads([t for t in own + helpers if t != own[0]])
            cpu0 = os.times()
            h0 = _cpu_s(helpers)
            t = time.perf_counter()
            made = subprocess.run([sys.executable, "-c", PINGPONG, str(pairs), str(window)],
                                  capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t
            cpu1 = os.times()
            own_cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) + (_cpu_s(helpers) - h0)
            lower_threads(raised)
            row = {"rounds_s": int(made.stdout.strip()) / window, "own_cpu": own_cpu / wall}
            if p is not None:
                p.stop()
                _wait_gone()
                cap = get_probe(cond).decode_dir(d)
                row.update(events_s=cap.meta["n_events"] / wall, lost=cap.meta["lost_events"])
                shutil.rmtree(d, ignore_errors=True)
            out[cond].append(row)
    return out


def relative(runs: dict, rounds: int) -> dict:
    """Each probe's rounds/s in each round over the mean of that round's no-probe window and the
    next round's (the windows nearest it): {probe: [ratio, ...]}."""
    none = [x["rounds_s"] for x in runs["none"]]
    out = {}
    for name, rows in runs.items():
        if name == "none":
            continue
        out[name] = [row["rounds_s"] / ((none[k] + none[min(k + 1, len(none) - 1)]) / 2)
                     for k, row in enumerate(rows)]
    return out


def binding_reader(window: float, pairs: int, tmp: Path) -> dict:
    """Part 3: microseconds per event of the binding's reader and of the probe's copy+decode."""
    from harmony.probes.perf_binding import find
    from harmony.probes.pyperf import PyperfProbe
    from harmony.probes.pyperf_ring import (IOC_DISABLE, MAP_LOCK, SAMPLE_TYPE, Ring,
                                            captured_stderr, perf_mappings)
    import fcntl

    perf = find().module
    # the binding's reader: one evlist per event (its records carry no name of their event
    # otherwise), the events that make most of a storm
    fields = {"sched_switch": ("prev_comm", "prev_pid", "prev_prio", "prev_state",
                               "next_comm", "next_pid", "next_prio"),
              "sched_waking": ("comm", "pid", "prio", "target_cpu"),
              "sched_wakeup": ("comm", "pid", "prio", "target_cpu")}
    evlists = []
    with MAP_LOCK:
        before = set(perf_mappings())
        for name in fields:
            evsel = perf.evsel(type=perf.TYPE_TRACEPOINT, config=perf.tracepoint("sched", name),
                               freq=0, sample_period=1, sample_type=SAMPLE_TYPE, disabled=0,
                               watermark=1, wakeup_events=1 << 30)
            el = perf.evlist(perf.cpu_map(), perf.thread_map(-1))
            el.add(evsel)
            with captured_stderr([]):
                el.open()
                el.mmap(pages=2048)
            evlists.append((name, el, evsel))
        rings = [Ring(a, b) for a, b in sorted(set(perf_mappings()) - before)]
    subprocess.run([sys.executable, "-c", PINGPONG, str(pairs), str(window)], check=True,
                   capture_output=True)
    fds = [f.fileno() for _, el, _ in evlists for f in el.get_pollfd()]
    for fd in fds:
        fcntl.ioctl(fd, IOC_DISABLE, 0)
    n = lost = 0
    t = time.perf_counter()
    for name, el, _ in evlists:
        names = fields[name]
        for cpu in perf.cpu_map():
            while True:
                ev = el.read_on_cpu(cpu)
                if ev is None:
                    break
                if isinstance(ev, perf.sample_event):
                    (ev.sample_time, ev.sample_cpu, ev.common_pid,
                     *(getattr(ev, f) for f in names))
                    n += 1
                elif isinstance(ev, perf.lost_event):
                    lost += ev.lost
    binding_s = time.perf_counter() - t
    for ring in rings:
        ring.unmap()
    for fd in fds:
        os.close(fd)
    # the probe's way on a storm as long: the rings' bytes to a file, then decoded
    d = tmp / "reader"
    os.environ["HARMONY_PYPERF_DRAIN_STALL"] = f"0:{window + 60}"
    os.environ["HARMONY_PYPERF_PAGES"] = "4096"
    try:
        p = PyperfProbe(d, [0, 1], window)
        p.start()
        subprocess.run([sys.executable, "-c", PINGPONG, str(pairs), str(window)], check=True,
                       capture_output=True)
        t = time.perf_counter()
        p.stop()      # the drain copies what the rings hold (its stall ends at the stop)
        copy_s = time.perf_counter() - t
        t = time.perf_counter()
        cap = PyperfProbe.decode_dir(d)
        decode_s = time.perf_counter() - t
    finally:
        del os.environ["HARMONY_PYPERF_DRAIN_STALL"], os.environ["HARMONY_PYPERF_PAGES"]
    _wait_gone()
    m = cap.meta["n_events"]
    return {"binding_events": n, "binding_lost": lost, "binding_us": 1e6 * binding_s / max(n, 1),
            "probe_events": m, "probe_lost": cap.meta["lost_events"],
            "stop_s": copy_s, "copy_us": 1e6 * copy_s / max(m, 1),
            "decode_us": 1e6 * decode_s / max(m, 1)}


def storm_table(names, runs: dict, rel: dict) -> None:
    rows = [["none", common.median([x["rounds_s"] for x in runs["none"]]), 1.0, None, None,
             None, common.median([x["own_cpu"] for x in runs["none"]])]]
    for n in names:
        rows.append([n, common.median([x["rounds_s"] for x in runs[n]]), common.median(rel[n]),
                     min(rel[n]), common.median([x["events_s"] for x in runs[n]]),
                     sum(x["lost"] for x in runs[n]),
                     common.median([x["own_cpu"] for x in runs[n]])])
    common.table(["probe", "rounds/s", "x none", "worst x", "events/s", "lost (all rounds)",
                  "own CPU (of one)"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", default=",".join(PROBES),
                    help="probes compared, comma-separated (default %(default)s)")
    ap.add_argument("--reps", type=int, default=6, help="part 1 repetitions (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=0.5,
                    help="part 1 recording length (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=8,
                    help="part 2 rounds of windows (default %(default)s)")
    ap.add_argument("--window", type=float, default=2.0,
                    help="part 2 storm length, seconds (default %(default)s)")
    ap.add_argument("--pairs", type=int, default=2, help="ping-pong pairs (default %(default)s)")
    ap.add_argument("--reader-window", type=float, default=1.0,
                    help="part 3 storm length, seconds (default %(default)s)")
    ap.add_argument("--small-kb", type=int, default=256,
                    help="part 2 again with every probe's rings this small, KiB per CPU (a power "
                         "of two, 4 at least; 0: not) (default %(default)s)")
    ap.add_argument("--skip", default="", help="parts to skip, e.g. 1,2s,3")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.probes.split(",") if n.strip()]
    if not names or any(n not in PROBES for n in names):
        ap.error(f"--probes: choose among {', '.join(PROBES)}")
    if a.reps < 1 or a.rounds < 1 or a.seconds <= 0 or a.window <= 0 or a.pairs < 1 \
            or a.reader_window <= 0:
        ap.error("--reps, --rounds, --pairs must be at least 1, --seconds and --window positive")
    if a.small_kb and (a.small_kb < 4 or a.small_kb & (a.small_kb - 1)):
        ap.error("--small-kb must be a power of two, 4 at least (or 0)")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    common.need_root("the probes benchmark")
    missing = _available(names)
    if missing:
        sys.exit("cannot compare: " + "; ".join(f"{n}: {w}" for n, w in missing.items()))
    result: dict = {"benchmark": "probes", "probes": names}
    lock = common.host_lock()
    try:
        with tempfile.TemporaryDirectory(prefix="harmony-bench-probes-") as tmp:
            if "1" not in skip:
                ss = start_stop(names, a.reps, a.seconds, Path(tmp))
                result["start_stop"] = ss
                print(f"start and stop, {a.reps} recordings of {a.seconds:g} s per probe "
                      "(medians, s)\n")
                common.table(["probe", "start", "stop", "until gone", "decode",
                              "session start", "session stop"],
                             [[n, common.median(ss[n]["alone"]["start"]),
                               common.median(ss[n]["alone"]["stop"]),
                               common.median(ss[n]["alone"]["gone"]),
                               common.median(ss[n]["alone"]["decode"]),
                               common.median(ss[n]["session"]["start"]),
                               common.median(ss[n]["session"]["stop"])] for n in names])
                print()
            for part, kb in (("2", None), ("2s", a.small_kb)):
                if part in skip or (part == "2s" and not kb):
                    continue
                runs = storm(names, a.rounds, a.pairs, a.window, Path(tmp), kb)
                rel = relative(runs, a.rounds)
                result["storm" if kb is None else "storm_small_rings"] = {
                    "runs": runs, "relative": rel, "ring_kb": kb}
                rings = "each probe's own ring sizes" if kb is None else \
                    f"rings of {kb} KiB per CPU for every probe"
                print(f"{a.pairs} ping-pong pairs flat out, {a.rounds} rounds of "
                      f"{a.window:g} s windows, {rings} (medians)\n")
                storm_table(names, runs, rel)
                print()
            if "3" not in skip and "pyperf" in names:
                br = binding_reader(a.reader_window, a.pairs, Path(tmp))
                result["reader"] = br
                print(f"reading a {a.reader_window:g} s storm recorded through the binding\n")
                common.table(["reader", "events", "us/event"],
                             [["binding: read_on_cpu + fields", br["binding_events"],
                               br["binding_us"]],
                              ["pyperf: copy of the rings", br["probe_events"], br["copy_us"]],
                              ["pyperf: decode after", br["probe_events"], br["decode_us"]]])
                print()
    finally:
        lock.release()
    common.emit_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
