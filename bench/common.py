"""Helpers shared by the benchmark scripts: tables, JSON output, loads and the root check.

Every script measures the figures it compares side by side in one run, repeats each measurement
and reports medians, so a figure never depends on a number taken on another day.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from harmony.core.memory import tune_allocations

REPO = Path(__file__).resolve().parent.parent
# the benchmarks measure Harmony as its command runs: with its memory tuning (harmony.core.memory)
tune_allocations()


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list], stream=sys.stdout) -> None:
    """Print rows under headers, columns right-aligned except the first."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, r in enumerate(cells):
        line = "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths)))
        print(line, file=stream)
        if k == 0:
            print("  ".join("-" * w for w in widths), file=stream)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "n/a" if v is None else str(v)


#: the libraries an import loads before any of Harmony's code runs (numpy, pandas, pyarrow's
#: Parquet, seaborn and matplotlib's pyplot: the ones the project is built on); no import can be
#: faster than loading them
LIBRARY_IMPORTS = ("import numpy, pandas, pyarrow.parquet, seaborn, matplotlib; "
                   "matplotlib.use('Agg'); import matplotlib.pyplot")


def console_script(name: str) -> str | None:
    """This interpreter's installed console script ``name`` (e.g. "harmony"), not what PATH
    finds first: a version manager's shim there (pyenv's) runs a shell script before Python,
    ~65 ms a command on this host, which is the shim's time, not Harmony's. None: not installed."""
    own = Path(sysconfig.get_path("scripts")) / name
    return str(own) if own.exists() else shutil.which(name)


def library_floor(reps: int) -> float:
    """Median wall seconds of a new process that only imports :data:`LIBRARY_IMPORTS`."""
    walls = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", LIBRARY_IMPORTS], check=True)
        walls.append(time.perf_counter() - t)
    return median(walls)


def verdict(name: str, ok: bool | None, detail: str) -> str:
    mark = "n/a " if ok is None else ("PASS" if ok else "MISS")
    return f"[{mark}] {name}: {detail}"


def sizes(ap, text: str, reps: int) -> list[int]:
    """A benchmark's ``--sizes`` ("1e6,3e6": events, comma-separated) as integers; the parser's
    one-line error (exit 2) for a list that is not positive numbers, or ``--reps`` below 1."""
    try:
        out = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes: not a list of numbers: {text!r}")
    if not out or min(out) <= 0 or reps < 1:
        ap.error("--sizes must be positive and --reps at least 1")
    return out


def emit_json(path: str | None, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` ("-" = stdout)."""
    if not path:
        return
    text = json.dumps(obj, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")


def run_ns(pid: int) -> int | None:
    """CPU time the kernel has given task ``pid`` so far (ns; /proc/<pid>/schedstat, first
    field), or None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def freed_memory_goes_to_host() -> bool:
    """This is a VM whose balloon device reports freed guest memory to its host (virtio feature
    VIRTIO_BALLOON_F_REPORTING): memory the guest frees goes back to the host, so touching it
    again costs a fault on the host as well as in the guest."""
    for dev in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if int((dev / "device").read_text(), 16) == 5:          # a memory balloon
                features = (dev / "features").read_text().strip()   # bit k = character k
                if len(features) > 5 and features[5] == "1":
                    return True
        except (OSError, ValueError):
            continue
    return False


def need_root(what: str) -> None:
    """Exit 2 with one line if this benchmark cannot use the kernel's tracing."""
    if os.geteuid() != 0:
        sys.exit(f"{what} needs root (it records the kernel's sched tracepoints)")
    if not Path("/sys/kernel/tracing/events/sched/sched_switch").is_dir():
        sys.exit(f"{what} needs tracefs at /sys/kernel/tracing with the sched tracepoints")


def processes(cmdline: bool = False):
    """Every process now, as /proc shows it: (pid, comm, state letter, command line bytes: empty
    unless ``cmdline``); one gone as it is read is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes() if cmdline else b""
        except (OSError, IndexError):
            continue
        yield int(entry.name), comm, state, cmd


def host_lock(tries: int = 60):
    """Harmony's host lock, waiting while another run holds it; exits if it never frees."""
    from harmony.hygiene import HostBusy, HostLock

    for _ in range(tries):
        try:
            return HostLock().acquire()
        except HostBusy:
            time.sleep(2)
    sys.exit(f"another Harmony run held the host lock for {2 * tries} s")


# --- a context-switch-heavy load ----------------------------------------------------------------

def _pingpong_child(rfd: int, wfd: int, rounds_per_s: float, stop_at: float) -> None:
    """Echo every byte back; the initiator paces itself, this side only answers."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        while True:
            b = os.read(rfd, 1)
            if not b or b == b"q":
                break
            os.write(wfd, b)
    finally:
        os._exit(0)


def pingpong(pairs: int, rounds_per_s: float, seconds: float, comm: str = "hmy-pp") -> list[int]:
    """Run ``pairs`` ping-pong pairs over pipes for ``seconds``; 0 rounds_per_s = as fast as
    possible.

    Each round is one wake-up and two context switches on each side. Returns the pids of all the
    processes (each renames itself ``comm``). Blocks until they have exited.
    """
    import ctypes

    libc = ctypes.CDLL(None)
    pids = []
    for _ in range(pairs):
        a_r, b_w = os.pipe()
        b_r, a_w = os.pipe()
        stop_at = time.monotonic() + seconds
        for role in ("echo", "init"):
            pid = os.fork()
            if pid == 0:
                try:
                    libc.prctl(15, comm.encode(), 0, 0, 0)
                    if role == "echo":
                        _pingpong_child(b_r, b_w, rounds_per_s, stop_at)
                    _initiator(a_r, a_w, rounds_per_s, stop_at)
                finally:
                    os._exit(0)
            pids.append(pid)
        for fd in (a_r, b_w, b_r, a_w):
            os.close(fd)
    for pid in pids:
        os.waitpid(pid, 0)
    return pids


def _initiator(rfd: int, wfd: int, rounds_per_s: float, stop_at: float) -> None:
    period = 1.0 / rounds_per_s if rounds_per_s > 0 else 0.0
    nxt = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            if period:
                nxt += period
                if nxt > now:
                    time.sleep(nxt - now)
            os.write(wfd, b"x")
            os.read(rfd, 1)
        os.write(wfd, b"q")
    finally:
        os._exit(0)
