"""Compile Harmony's numba kernels into numba's cache now, so that the first command after an
install is as fast as the next ones: ``python -m harmony.precompile`` (``install.sh`` runs it).

The kernels (:mod:`harmony.probes.ringbuf_jit`, :mod:`harmony.analysis.taskstate_jit`,
:mod:`harmony.analysis.reconstruct_jit`, :mod:`harmony.analysis.causes_jit`,
:mod:`harmony.analysis.cost_jit`, :mod:`harmony.importer_jit`,
:mod:`harmony.probes.perf_read_jit`) are compiled with
``cache=True``: the first process that calls one compiles it (numba, ~15-20 s for all of them on a
2-CPU host) and stores the machine code next to its source (``__pycache__/*.nbi, *.nbc``); every
later process loads it (~0.5-1 s). numba keys that cache by the source file's modification time and
size and by the CPU it was compiled for, so a cache left by an older version of a file, or built on
another machine, is never used: it is compiled again.

Here every kernel is called once, with the argument types a real command gives it, by running
the real paths on small simulated runs (on 2 and 4 CPUs): their events written as tracefs pages and
decoded (``decode_dir``), the same pages written as a trace.dat and imported (``harmony import``:
the reader, the tables, the checks), with the compiled kernels forced on (``HARMONY_JIT=1``) and
every kernel split over threads however small its input (the split paths call kernels the
single-range path does not).

Where the installed package's directories are not writable by whoever runs Harmony, numba
stores the cache under that user's cache directory instead (``~/.cache/numba``, or
``NUMBA_CACHE_DIR``): run this module as that user (or set ``NUMBA_CACHE_DIR`` to a directory
both share) for their first command to find it.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: the modules whose kernels are compiled (each ``numba.njit(cache=True)``)
KERNEL_MODULES = ("harmony.probes.ringbuf_jit", "harmony.analysis.taskstate_jit",
                  "harmony.analysis.reconstruct_jit", "harmony.analysis.causes_jit",
                  "harmony.analysis.checks_jit", "harmony.analysis.cost_jit",
                  "harmony.importer_jit", "harmony.probes.perf_read_jit")


def kernels() -> dict[str, object]:
    """Every numba dispatcher of :data:`KERNEL_MODULES` that caches what it compiles:
    "module.name" -> dispatcher (helpers only called from other kernels are compiled into them,
    and never on their own)."""
    import importlib

    out = {}
    for name in KERNEL_MODULES:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if hasattr(obj, "stats") and getattr(obj, "targetoptions", {}).get("nogil"):
                out[f"{name}.{attr}"] = obj
    return out


def precompile(work: Path) -> dict:
    """Run every kernel once in this process (see the module's docstring), ``work`` a scratch
    directory. Returns {kernels, compiled (not found in the cache), loaded (from it), seconds,
    cache_dirs}."""
    os.environ["HARMONY_JIT"] = "1"
    from harmony.analysis import cost_jit
    from harmony.analysis.arrays import key_table
    from harmony.analysis.causes import last_wakes
    from harmony.analysis.taskstate import task_records
    from harmony.core import jit
    from harmony.importer import import_trace
    from harmony.probes.encode import write_recording
    from harmony.probes.perf_read import walk_records
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracedat_write import write_tracedat
    from harmony.simulate import simulate_run

    from harmony.probes import ringbuf_stream
    t = time.perf_counter()
    saved, jit.PARALLEL_MIN_ITEMS = jit.PARALLEL_MIN_ITEMS, 1
    # a streamed decode's string table grown from its smallest, and its slabs of a page
    # (parts on threads, their rows merged): the kernels that grow it and merge them, too
    slots, ringbuf_stream.TABLE_SLOTS = ringbuf_stream.TABLE_SLOTS, 4
    slab, ringbuf_stream.SLAB_BYTES = ringbuf_stream.SLAB_BYTES, 1     # a page each
    try:
        # two CPUs (their records merged in parts on threads) and four (merged in one pass)
        for ncpus in (2, 4):
            here = work / f"p{ncpus}"
            sim = simulate_run("poly-balance", "single-source", ncpus, here / "sim",
                               overrides={"duration": "0.5",
                                          "layout": f"{2 * ncpus}" + ",0" * (ncpus - 1)})
            raw = here / "raw"
            write_recording(sim.events, sim.markers, {"cpus": list(range(ncpus)), "clock": "mono"},
                            raw)
            decode_dir(raw)
            dat = write_tracedat(raw, here / "trace.dat")
            import_trace(dat, here / "import", pids=[int(p) for p in sim.tasks["pid"]])
            # a task's last wake-ups before a move: asked only of moves of tasks asleep, which
            # a short run may not have
            last_wakes(sim.events, np.asarray(sim.tasks["pid"], np.int64),
                        np.full(len(sim.tasks), len(sim.events), np.int64))
            # the waits of the wasted time, where every task record is read (a run whose
            # CPUs are never idle reads none)
            pids = np.asarray(sim.tasks["pid"], np.int32)
            r = task_records(sim.events, pids)
            cost_jit.waits(*(r[c].to_numpy() for c in ("pid", "ts", "cpu_after", "runnable_after",
                                                       "running_after")),
                           key_table(pids), key_table(range(ncpus)))
        # a perf.data's record walk, on a data section of two FINISHED_ROUND records (read-only
        # bytes, as a mapped file's): its payloads go through the kernels above
        walk_records(np.frombuffer(struct.pack("<IHH", 68, 0, 8) * 2, np.uint8))
    finally:
        jit.PARALLEL_MIN_ITEMS = saved
        ringbuf_stream.TABLE_SLOTS = slots
        ringbuf_stream.SLAB_BYTES = slab
    found = {k: d for k, d in kernels().items() if d.signatures}     # called from Python
    return {"kernels": len(found),
            "compiled": sum(d.stats.cache_misses.total() for d in found.values()),
            "loaded": sum(d.stats.cache_hits.total() for d in found.values()),
            "seconds": time.perf_counter() - t,
            "cache_dirs": sorted({str(d._cache._cache_path) for d in found.values()})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harmony.precompile",
                                 description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    from harmony.core.jit import numba_version
    if numba_version() is None:
        print("harmony.precompile: numba is not installed: nothing to compile (numpy decoder)")
        return 0
    with tempfile.TemporaryDirectory(prefix="harmony-precompile-") as tmp:
        r = precompile(Path(tmp))
    print(f"harmony.precompile: {r['kernels']} kernels ready in {r['seconds']:.1f} s "
          f"({r['compiled']} compiled, {r['loaded']} loaded from the cache) in "
          f"{', '.join(r['cache_dirs'])}")
    if not r["kernels"]:
        print("harmony.precompile: no cached kernel found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
