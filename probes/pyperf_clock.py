"""The perf clock tied to CLOCK_MONOTONIC, for the ``pyperf`` probe.

Every perf sample is stamped with the clock of its event, perf's own (``local_clock()``) unless
the event asks for another (``perf_event_attr.use_clockid``, ``clockid``), which is how
``perf record -k CLOCK_MONOTONIC`` puts its samples on the clock tracefs calls "mono" and
Harmony's markers read. The python-perf binding (6.1) cannot ask: ``perf.evsel`` takes no
``use_clockid`` or ``clockid``. So the samples carry the perf clock, and the probe measures how
it stands against CLOCK_MONOTONIC when it starts and when it stops (:func:`tie`), and the decode
maps every stamp with those measurements (:func:`to_mono`); the run's notes and manifest say so
(``clock_tie``).

How: a thread of this process opens a software event through the binding, its own page faults
(PERF_COUNT_SW_PAGE_FAULTS, every one sampled with its time, CPU and faulting address), and on
each CPU in turn touches :data:`FAULTS_PER_CPU` fresh pages of a mapping of its own, each touch
between two reads of CLOCK_MONOTONIC (t1, t2). The kernel stamps a fault's sample (T, perf
clock) as it enters the fault handler, between t1 and t2, so the offset ``T - mono(T)`` lies in
[T - t2, T - t1]. The touch follows t1 within a few hundred ns (a Python store into the mapping)
and the fault handler's work follows the stamp (the page's allocation: 6 us here in a VM), so the
estimate is the tightest upper bound, ``min(T - t1)`` over the faults; ``bound_ns`` is the width
of the interval every fault agrees on (the offset is certainly within it, below the estimate).
When the CPUs' intervals have a common point (one perf clock on every CPU: a stable
``sched_clock``, the usual case) one offset serves them all; otherwise each CPU gets its own, and
the tie says so.

The offset moves between the start and the stop (CLOCK_MONOTONIC is slewed by NTP, the perf
clock is not): the decode interpolates linearly between the two ties, per CPU.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time

import numpy as np

from harmony.core.errors import ProbeError
from harmony.probes.pyperf_ring import (MAP_LOCK, Ring, captured_stderr, keep_alive,
                                        perf_mappings)

FAULTS_PER_CPU = 16
SAMPLE_TIME, SAMPLE_ADDR, SAMPLE_CPU = 1 << 2, 1 << 3, 1 << 7


def _faults(perf, cpus: list[int]) -> tuple[list[tuple[int, int, int, int]], list[str]]:
    """(cpu, T, t1, t2) of every page fault of the calling thread sampled while it touched its
    pages on each CPU of ``cpus``; and libperf's lines. Releases what it opened."""
    tid = threading.get_native_id()
    cpu_map, threads = perf.cpu_map(), perf.thread_map(tid=tid)
    evsel = perf.evsel(type=perf.TYPE_SOFTWARE, config=perf.COUNT_SW_PAGE_FAULTS, freq=0,
                       sample_period=1, sample_type=SAMPLE_TIME | SAMPLE_ADDR | SAMPLE_CPU,
                       disabled=0)
    evlist = perf.evlist(cpu_map, threads)
    evlist.add(evsel)
    keep_alive((evlist, evsel, cpu_map, threads))
    log: list[str] = []
    rings, fds = [], []
    try:
        with MAP_LOCK:
            before = set(perf_mappings())
            try:
                with captured_stderr(log):
                    evlist.open()
                    evlist.mmap(pages=8)
            finally:
                fds = [f.fileno() for f in evlist.get_pollfd()]
                rings = [Ring(a, b) for a, b in sorted(set(perf_mappings()) - before)]
        n = len(cpus) * FAULTS_PER_CPU
        pages = mmap.mmap(-1, n * mmap.PAGESIZE)
        anchor = ctypes.c_char.from_buffer(pages)
        base = ctypes.addressof(anchor)
        del anchor              # the address only: the mapping can be closed
        clock, mono = time.clock_gettime_ns, time.CLOCK_MONOTONIC
        bracket: dict[int, tuple[int, int]] = {}
        mask = os.sched_getaffinity(0)
        try:
            for k, cpu in enumerate(cpus):
                try:
                    os.sched_setaffinity(0, {cpu})
                except OSError:
                    continue                # a CPU this thread may not use: not tied here
                time.sleep(0)
                for i in range(FAULTS_PER_CPU):
                    at = (k * FAULTS_PER_CPU + i) * mmap.PAGESIZE
                    t1 = clock(mono)
                    pages[at] = 1
                    t2 = clock(mono)
                    bracket[base + at] = (t1, t2)
        finally:
            os.sched_setaffinity(0, mask)
        out = []
        for cpu in cpu_map:
            while True:
                ev = evlist.read_on_cpu(cpu)
                if ev is None:
                    break
                hit = bracket.get(getattr(ev, "sample_addr", None))
                if isinstance(ev, perf.sample_event) and hit is not None:
                    out.append((int(ev.sample_cpu), int(ev.sample_time), *hit))
        pages.close()
        return out, log
    finally:
        for ring in rings:
            ring.unmap()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def offsets(faults: list[tuple[int, int, int, int]]) -> dict:
    """The tie from the faults' (cpu, T, t1, t2) (see the module docstring): ``one_clock``,
    ``offset_ns`` and ``bound_ns`` (for all CPUs, or None), ``perf_ns`` (the perf clock when it
    was measured), ``per_cpu`` ({cpu: {offset_ns, bound_ns, faults}}), ``faults``."""
    if not faults:
        raise ProbeError("python-perf: no page fault of the clock tie was sampled: the perf "
                         "clock cannot be tied to CLOCK_MONOTONIC")
    a = np.array(faults, np.int64)
    per_cpu = {}
    for c in np.unique(a[:, 0]):
        f = a[a[:, 0] == c]
        hi, lo = int((f[:, 1] - f[:, 2]).min()), int((f[:, 1] - f[:, 3]).max())
        per_cpu[int(c)] = {"offset_ns": hi, "bound_ns": hi - lo, "faults": int(len(f))}
    hi = min(p["offset_ns"] for p in per_cpu.values())
    lo = max(p["offset_ns"] - p["bound_ns"] for p in per_cpu.values())
    one = lo <= hi
    return {"one_clock": one, "offset_ns": hi if one else None,
            "bound_ns": hi - lo if one else None, "perf_ns": int(a[:, 1].max()),
            "per_cpu": per_cpu, "faults": int(len(a))}


def tie(perf, cpus: list[int]) -> dict:
    """Measure the perf clock against CLOCK_MONOTONIC on ``cpus`` (:func:`offsets`), from a
    thread of its own (its affinity is changed, not the caller's); ProbeError if it cannot."""
    result: dict = {}

    def measure():
        try:
            result["faults"], result["log"] = _faults(perf, cpus)
        except BaseException as exc:     # handed to the caller
            result["error"] = exc

    t = threading.Thread(target=measure, name="pyperf-clock-tie", daemon=True)
    t.start()
    t.join()
    if "error" in result:
        exc = result["error"]
        if isinstance(exc, ProbeError):
            raise exc
        raise ProbeError(f"python-perf: the clock tie failed: {type(exc).__name__}: {exc}")
    return offsets(result["faults"])


def to_mono(ts: np.ndarray, cpu: np.ndarray, start: dict, stop: dict | None) -> np.ndarray:
    """Perf-clock stamps ``ts`` of samples on ``cpu`` -> CLOCK_MONOTONIC (ns), with the ties
    measured at the start and the stop (None: the start's offset throughout)."""
    ts = np.asarray(ts, np.int64)
    cpu = np.asarray(cpu)
    out = np.empty_like(ts)
    cpus = set(np.unique(cpu).tolist())

    def offset_of(tie: dict, c: int) -> int:
        if tie["one_clock"]:
            return int(tie["offset_ns"])
        got = tie["per_cpu"].get(c, tie["per_cpu"].get(str(c)))
        if got is None:     # a CPU the tie did not reach: the nearest estimate of the others
            return min(int(p["offset_ns"]) for p in tie["per_cpu"].values())
        return int(got["offset_ns"])

    for c in cpus or {0}:
        sel = cpu == c
        o0 = offset_of(start, int(c))
        if stop is None or int(stop["perf_ns"]) <= int(start["perf_ns"]):
            out[sel] = ts[sel] - o0
            continue
        o1 = offset_of(stop, int(c))
        t0, span = int(start["perf_ns"]), int(stop["perf_ns"]) - int(start["perf_ns"])
        drift = ((ts[sel] - t0).astype(np.float64) * ((o1 - o0) / span)).round().astype(np.int64)
        out[sel] = ts[sel] - o0 - drift
    return out


__all__ = ["FAULTS_PER_CPU", "offsets", "tie", "to_mono"]
