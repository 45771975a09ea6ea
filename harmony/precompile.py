"""Compile Harmony's kernels now, so that the first command after an install is as fast as the
next ones: ``python -m harmony.precompile`` (``install.sh`` runs it; after a plain ``pip
install``, the first command that analyses a trace does: :func:`ensure_built`).

The kernels (:mod:`harmony.core.kernels`: :mod:`harmony.probes.ringbuf_jit`,
:mod:`harmony.analysis.taskstate_jit`, :mod:`harmony.analysis.reconstruct_jit`,
:mod:`harmony.analysis.causes_jit`, :mod:`harmony.analysis.checks_jit`,
:mod:`harmony.analysis.cost_jit`, :mod:`harmony.analysis.ties_jit`, :mod:`harmony.importer_jit`,
:mod:`harmony.probes.perf_read_jit`, :mod:`harmony.analysis.plots_jit`) are compiled twice:

- by numba's JIT (``cache=True``): the first process that calls one compiles it (~15-20 s for
  all of them on a 2-CPU host) and stores the machine code next to its source
  (``__pycache__/*.nbi, *.nbc``); every later process that runs them by numba loads it (~0.5-1
  s). numba keys that cache by the source file's modification time and size and by the CPU, so a
  stale cache is never used. Where the installed package's directories are not writable by
  whoever runs Harmony, numba stores it under that user's cache directory instead
  (``~/.cache/numba``, or ``NUMBA_CACHE_DIR``): run this module as that user (or set
  ``NUMBA_CACHE_DIR`` to a directory both share) for their first command to find it;
- ahead of time (:func:`build_extension`, numba's ``pycc`` and the C compiler, ~20 s): every
  signature the JIT compiled below, into one extension module that loads without numba
  (:mod:`harmony.core.kernels` says where it is kept and when it is used); a build of the same
  key is reused only if it exports every one of those signatures (the key holds the kernels'
  sources, not their callers', which may now pass other types). Where it cannot be
  built (no C compiler; a numba without ``pycc``, which numba marks "pending deprecation" with
  no replacement yet), the JIT's cache serves.

Here every kernel is called once, with the argument types a real command gives it, by running
the real paths on small simulated runs (on 2 and 4 CPUs): their events written as tracefs pages and
decoded (``decode_dir``), the same pages written as a trace.dat and imported (``harmony import``:
the reader, the tables, the checks), with the compiled kernels forced on (``HARMONY_JIT=1``, by
numba: ``HARMONY_AOT=0``) and every kernel split over threads however small its input (the split
paths call kernels the single-range path does not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

def kernels() -> dict[str, object]:
    """numba's dispatcher of every kernel (:mod:`harmony.core.kernels`): "module.name" ->
    dispatcher (helpers only called from other kernels are compiled into them, and never on
    their own)."""
    from harmony.core.kernels import jit_dispatchers
    return jit_dispatchers()


def precompile(work: Path) -> dict:
    """Run every kernel once in this process (see the module's docstring), ``work`` a scratch
    directory. Returns {kernels, compiled (not found in the cache), loaded (from it), seconds,
    cache_dirs}."""
    os.environ["HARMONY_JIT"] = "1"
    os.environ["HARMONY_AOT"] = "0"      # numba's JIT, whose dispatchers record each signature
    from harmony.analysis import cost_jit
    from harmony.analysis.arrays import key_table
    from harmony.analysis.causes import last_wakes
    from harmony.analysis.plots import step_envelopes
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
        # two CPUs (their records merged in parts on threads), four (merged in one pass), and
        # four with 140 tasks: more comms and task names than an 8-bit code holds (a whole
        # system's trace: its codes are wider), stamped by a 20 us clock (ties across CPUs)
        for ncpus, ntasks, clock_ns in ((2, 4, 0), (4, 8, 0), (4, 140, 20_000)):
            here = work / f"p{ncpus}-{ntasks}"
            sim = simulate_run("poly-balance", "single-source", ncpus, here / "sim",
                               overrides={"duration": "0.5" if ntasks < 100 else "0.2",
                                          "layout": f"{ntasks}" + ",0" * (ncpus - 1)})
            raw = here / "raw"
            write_recording(_coarse(sim.events, clock_ns) if clock_ns else sim.events,
                            sim.markers, {"cpus": list(range(ncpus)), "clock": "mono"}, raw)
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
            cost_jit.waits(r["pid"].to_numpy(), r["seq"].to_numpy(), sim.events["ts"].to_numpy(),
                           *(r[c].to_numpy() for c in ("cpu_after", "runnable_after",
                                                       "running_after")),
                           key_table(pids), key_table(range(ncpus)))
        # the ties' settling pass, on a group of one timestamp across CPUs that contradicts
        # itself as merged (a simulated clock never ties events)
        _ties()
        # a perf.data's record walk, on a data section of two FINISHED_ROUND records (read-only
        # bytes, as a mapped file's): its payloads go through the kernels above
        walk_records(np.frombuffer(struct.pack("<IHH", 68, 0, 8) * 2, np.uint8))
        # and its samples read in one pass (two events told apart by the id each sample
        # carries first): a sample of each, on read-only bytes
        _perf_samples()
        # the run-queue figure's envelopes (a CPU's drawn binned only past MAX_STEPS steps), on
        # the run-queue table's column types, read-only as a table read back from its file is
        # (an export that only reads an array takes a writable one too)
        columns = [np.array([0, 1, 0, 1], np.int32), np.array([0.0, 0.1, 0.2, 0.3]),
                   np.array([1, 2, 1, 0], np.int32)]
        for c in columns:
            c.setflags(write=False)
        step_envelopes(*columns, [0, 1], 0.5, most_steps=0, bins=4)
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


def _coarse(events, clock_ns: int):
    """``events`` stamped by a clock of ``clock_ns`` and merged as a decoder merges them (equal
    timestamps CPU by CPU)."""
    events = events.assign(ts=events["ts"].to_numpy() // clock_ns * clock_ns)
    order = np.lexsort((np.arange(len(events)), events["cpu"].to_numpy(), events["ts"].to_numpy()))
    return events.iloc[order].reset_index(drop=True)


def _ties() -> None:
    """:func:`harmony.analysis.ties.order_ties` on a stream where CPU 1, merged first, wakes and
    runs a task CPU 5 woke and ran at the same timestamp (a Debian 6.1 guest's case): its
    settling pass goes back on a choice."""
    from harmony.analysis.event_streams import Stream
    from harmony.analysis.ties import order_ties

    s = Stream({301: "p", 900: "other"})
    s.switch(1_000, 0, prev=0, state=0, next=301)
    s.switch(2_000, 0, prev=301, state=1, next=0)
    for cpu, src in ((5, 0), (1, 5)):
        s.waking(5_000, cpu, pid=301, target=src, common_pid=900)
        s.migrate(5_000, cpu, pid=301, orig=src, dest=cpu, common_pid=900)
        s.wakeup(5_000, cpu, pid=301, target=cpu, common_pid=900)
        s.switch(5_000, cpu, prev=900, state=0, next=301)
        s.switch(5_000, cpu, prev=301, state=1, next=900)
    order_ties(s.events())


def _perf_samples() -> None:
    """:func:`harmony.probes.perf_read.compiled_samples` on a data section of one sample of
    each of two tracepoints (IDENTIFIER, TID, TIME, CPU, RAW), as the reader calls it."""
    from harmony.probes.perf_read import (
        SAMPLE_CPU,
        SAMPLE_IDENTIFIER,
        SAMPLE_RAW,
        SAMPLE_TID,
        SAMPLE_TIME,
        PerfAttr,
        compiled_samples,
        walk_records,
    )
    st = SAMPLE_IDENTIFIER | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_RAW
    attrs = [PerfAttr(2, config, st, 0, 0, None, [id_]) for config, id_ in ((300, 7), (301, 8))]
    body = b"".join(struct.pack("<IHHQIIQIIII", 9, 0, 48, id_, 1, 1, 10 * id_, 0, 0, 4, 0)
                    for id_ in (7, 8))
    buf = np.frombuffer(body, np.uint8)
    walked = walk_records(buf)[:3]
    compiled_samples(buf, walked, attrs, np.ones(2, bool))


def build_extension(found: dict[str, object]) -> tuple[Path, int, list[str]]:
    """Compile every signature numba's dispatchers in ``found`` ran with (:func:`precompile`)
    ahead of time into one extension module (:mod:`harmony.core.kernels`), in the first writable
    of :func:`harmony.core.kernels.cache_dirs` under this :func:`~harmony.core.kernels.key`,
    the builds it replaces removed (:func:`_remove_replaced`), unless one built for this key
    already exports every one of them. Returns (its directory, exports, the signatures not
    exported).
    Raises OSError, or numba's or the C compiler's error, where it cannot be built."""
    import warnings

    from numba.core.errors import NumbaPendingDeprecationWarning

    from harmony.core import kernels as hk

    with warnings.catch_warnings():     # pycc: "pending deprecation", no replacement yet
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        import numba.pycc.compiler as pycc_compiler
        from numba.pycc import CC

    wanted, skipped = [], []        # (name, its signature, its arguments' specs)
    for name, disp in sorted(found.items()):
        if name.rsplit(".", 1)[1].startswith("_"):
            continue                # a helper: compiled into the kernels calling it
        for sig in disp.signatures:
            full = disp.overloads[sig].signature
            args = [hk.arg_spec(t) for t in full.args]
            if any(a is None for a in args):
                skipped.append(f"{name}{full.args}")
            else:
                wanted.append((name, full, args))
    key = hk.key()
    existing = hk.find_build(key)
    if existing is not None and _covers(existing[1], wanted):
        # a second install of the same code: nothing to do. Not where the kernels' callers now
        # pass other types (the key holds the kernels' sources, not their callers'): built again
        return existing[0], sum(len(v) for v in existing[1]["kernels"].values()), skipped
    described: dict[str, list] = {}
    exported = 0
    cc = CC(hk.EXTENSION)
    cc.target_cpu = "host"          # the CPU it runs on: the key holds it
    for name, full, args in wanted:
        symbol = f"k{exported}_{name.rsplit('.', 1)[1]}"
        exported += 1
        cc.export(symbol, full)(found[name].py_func)
        described.setdefault(name, []).append({"symbol": symbol, "args": args})
    # pycc compiles every export with one Flags object, which a compilation may change (numba
    # 0.68 left enable_ssa off after one of these, and the next export's inlined helpers then
    # failed to type): each export gets a fresh copy; and nogil, as numba.njit was given
    compile_extra, fresh = pycc_compiler.compile_extra, {}

    def compile_one(typing, target, fn, args, ret, flags, **kw):
        template = fresh.setdefault(id(flags), flags.copy())
        own = template.copy()
        own.release_gil = True
        return compile_extra(typing, target, fn, args, ret, own, **kw)

    base = _writable(hk.cache_dirs())
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
    work.chmod(0o755)               # readable by every user the package is installed for
    try:
        cc.output_dir = str(work)
        pycc_compiler.compile_extra = compile_one
        try:
            cc.compile()
        finally:
            pycc_compiler.compile_extra = compile_extra
        (work / hk.EXPORTS_FILE).write_text(json.dumps(
            {"format": hk.FORMAT, "key": key, "environment": hk.environment(),
             "file": Path(cc.output_file).name, "kernels": described}, indent=1))
        _remove_replaced(base, work)
        os.replace(work, base / key)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return base / key, exported, skipped


#: builds of other environments kept beside this one's (the newest; each ~1.2 MB)
KEEP_OTHER_ENVIRONMENTS = 4


def _remove_replaced(base: Path, work: Path) -> None:
    """Remove from ``base`` what the build in ``work`` replaces: builds of other sources for
    this :func:`~harmony.core.kernels.environment` (and this key's last one), builds that say
    no environment (made before builds said it), all but the newest
    :data:`KEEP_OTHER_ENVIRONMENTS` of other environments' builds, another build's work in
    progress only when it is an hour old (its precompile was killed), and a command's failed
    build's record."""
    from harmony.core import kernels as hk

    mine, others = hk.environment(), []
    for old in base.iterdir():
        if old.name.endswith(hk.FAILED_SUFFIX):
            old.unlink(missing_ok=True)
        if not old.is_dir() or old == work:
            continue
        if old.name.startswith("."):
            if time.time() - old.stat().st_mtime > 3600:
                shutil.rmtree(old, ignore_errors=True)
            continue
        try:
            theirs = json.loads((old / hk.EXPORTS_FILE).read_text()).get("environment")
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs is None or theirs == mine:
            shutil.rmtree(old, ignore_errors=True)
        else:
            others.append(old)
    others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for old in others[KEEP_OTHER_ENVIRONMENTS:]:
        shutil.rmtree(old, ignore_errors=True)


def _covers(described: dict, wanted: list) -> bool:
    """Whether a build's exports (its description, :data:`harmony.core.kernels.EXPORTS_FILE`)
    hold every signature of ``wanted`` ((name, signature, argument specs), as build_extension
    lists them)."""
    have = {(name, json.dumps(e["args"])) for name, entries in described["kernels"].items()
            for e in entries if isinstance(e, dict) and "args" in e}
    return all((name, json.dumps(args)) in have for name, _, args in wanted)


def _writable(candidates: list[Path]) -> Path:
    for d in candidates:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise OSError(f"none of {', '.join(map(str, candidates))} is writable")


#: a command's build: this module's command, in a child process (it sets the process's
#: environment and compiles by numba's JIT first), run from a directory with no harmony checkout
#: in it (``python -m`` would import that one); its arguments to this Python
BUILD_ARGS = ("-m", "harmony.precompile")
#: how this module's command begins the line saying why the kernels were not built (the rest of
#: the line), which a command's build (:func:`ensure_built`) says in its warning
NOT_BUILT = "harmony.precompile: the kernels were not compiled ahead of time: "
BUILD_TIMEOUT_S = 1800


def build_needed() -> bool:
    """Whether a command should build the kernels ahead of time before it starts: numba is
    installed, neither ``HARMONY_AOT=0`` nor ``HARMONY_JIT=0`` is set, no build for this code
    is found (:func:`harmony.core.kernels.find_build`), and none failed for it before."""
    from harmony.core import kernels as hk
    from harmony.core.jit import mode, numba_version
    if numba_version() is None or not hk.aot_enabled() or mode() == "0":
        return False
    return hk.aot_built() is None and hk.failed_build() is None


def ensure_built(say=print, warn=print) -> bool:
    """Build the kernels ahead of time now (``python -m harmony.precompile``, in a child
    process), where :func:`build_needed` says so: what ``install.sh`` does at install, done by
    the first command after a plain ``pip install``, once. Without the build, each command that
    decodes a large trace loads numba (~0.4 s and ~110 MB more a process) after the first one
    compiled the kernels by its JIT (~20 s). ``say`` gets a line before and after, ``warn`` the
    line of a build that failed. A build that fails is recorded (``<key>.failed`` in the first
    writable cache directory, with its output's last line) and never tried again by a command:
    numba's JIT runs the kernels, as before; this module's command builds again. Concurrent
    commands build once (a lock beside the builds). Returns whether a build for this code is
    there now."""
    import fcntl
    import subprocess

    from harmony.core import kernels as hk
    from harmony.core.osutil import die_with_parent
    if not build_needed():
        return hk.aot_built() is not None
    try:
        base = _writable(hk.cache_dirs())
    except OSError:
        return False            # nowhere to build: numba's JIT, whose cache has its own place
    with open(base / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # another command's build: wait for it, use it
        hk.forget_build()
        if not build_needed():
            return hk.aot_built() is not None
        say("building Harmony's compiled kernels for this code and CPU, once (~40 s on 2 "
            "CPUs; install.sh does it at install: python -m harmony.precompile)")
        t = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="harmony-build-") as cwd:
            try:
                r = subprocess.run([sys.executable, *BUILD_ARGS], cwd=cwd,
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=BUILD_TIMEOUT_S, preexec_fn=die_with_parent)
                # why, where it says: its errors, else the last thing it printed
                out, code = r.stderr.strip() or r.stdout, r.returncode
            except subprocess.TimeoutExpired:
                out, code = f"no build within {BUILD_TIMEOUT_S} s", -1
        hk.forget_build()
        if code == 0 and hk.aot_built() is not None:
            say(f"compiled kernels built in {time.perf_counter() - t:.0f} s, in "
                f"{hk.aot_built()}")
            return True
        lines = out.strip().splitlines()
        # the reason this module's command said, else the last thing it printed
        last = next((ln[len(NOT_BUILT):] for ln in lines if ln.startswith(NOT_BUILT)),
                    (lines or [f"exit status {code}"])[-1])
        (base / (hk.key() + hk.FAILED_SUFFIX)).write_text(json.dumps(
            {"exit": code, "last_line": last, "when": time.time()}) + "\n")
        warn(f"the compiled kernels could not be built ({last}); numba's JIT runs them (each "
             "large import loads it, ~0.4 s): python -m harmony.precompile tries again")
        return False


def remove_builds() -> tuple[int, int]:
    """Remove what compiling the kernels wrote inside Harmony's package: the builds ahead of
    time beside it (the first of :func:`harmony.core.kernels.cache_dirs`, whole) and numba's
    cache files beside the kernel modules (``__pycache__/<module>.*.nbi|nbc``). ``pip
    uninstall`` removes only the files it installed: these stayed in site-packages, a
    ``harmony`` directory without its ``__init__.py`` that a later editable install's
    ``import harmony`` then found first. The user's cache directory (~/.cache/harmony, which
    other installs may use) is left. Returns (files removed, bytes)."""
    import importlib.util

    from harmony.core import kernels as hk
    beside = hk.cache_dirs()[0]
    doomed = [f for f in beside.rglob("*") if f.is_file()] if beside.is_dir() else []
    for module in hk.KERNEL_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        cache = origin.parent / "__pycache__"
        if cache.is_dir():
            doomed += [f for f in cache.glob(f"{origin.stem}.*")
                       if f.suffix in (".nbi", ".nbc")]
    files, size = 0, 0
    for f in doomed:
        try:
            n = f.stat().st_size
            f.unlink()
        except FileNotFoundError:
            continue
        files, size = files + 1, size + n
    shutil.rmtree(beside, ignore_errors=True)
    return files, size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harmony.precompile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--remove", action="store_true",
                    help="remove the compiled kernels instead (the builds and numba's cache "
                         "files beside the modules): before `pip uninstall harmony-sched`, "
                         "which leaves them")
    args = ap.parse_args(argv)
    if args.remove:
        files, size = remove_builds()
        print(f"harmony.precompile: removed {files} files of compiled kernels "
              f"({size / 1e6:.1f} MB)")
        return 0
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
    t = time.perf_counter()
    try:
        where, exported, skipped = build_extension(kernels())
    except Exception as e:       # noqa: BLE001 -- any failure leaves numba's JIT, which works
        line = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        print(f"{NOT_BUILT}{line}", file=sys.stderr)
        print("harmony.precompile: numba's JIT runs them instead (each large import loads it, "
              "~0.4 s)", file=sys.stderr)
        return 0
    print(f"harmony.precompile: {exported} kernel signatures compiled ahead of time, ready in "
          f"{time.perf_counter() - t:.1f} s, in {where}")
    for s in skipped:
        print(f"harmony.precompile: not compiled ahead of time (numba's JIT runs it): {s}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
