"""Whole-import benchmark: ``harmony import FILE`` against ``trace-cmd report FILE > /dev/null``.

What a user waits for is the whole command: reading and decoding the trace.dat, the tables and
their Parquet files, the checks, the experiment's metrics, the figures and the report, in a new
process (the ``harmony`` console script). Per trace size, in one run and interleaved:

- harmony: ``harmony import FILE --comm hmy-pp -q --out DIR`` under ``/usr/bin/time -v``: wall
  seconds and peak resident memory (``Maximum resident set size``; bytes/event is that over the
  events decoded); each step's seconds from the run's manifest (``timings_s``)
- trace-cmd: ``trace-cmd report -i FILE > /dev/null`` under ``/usr/bin/time -v`` likewise

"Warm": one import of each file first, not timed (numba's kernels compiled and in its cache, the
file in the page cache), as a user's second command finds them (``bench/first_use.py`` measures
the first). The traces: a real recording of a pipe ping-pong by the tracefs probe (root), or an
existing tracefs recording (``--from``, with ``--comm``), replicated to each size as
``bench/ingest.py`` does (its pages repeated with shifted timestamps) and written as a trace.dat
by Harmony's writer (``harmony.probes.tracedat_write``; not timed). ``--traces DIR`` keeps them
there and uses them again.

The floor: ``python -c 'import ...'`` of the modules every import loads (pandas, pyarrow,
matplotlib, Harmony's pipeline), timed the same way: no import can be faster than that; and of the
libraries alone (``common.LIBRARY_IMPORTS``: numpy, pandas, pyarrow, seaborn, matplotlib), which
no change to Harmony's code can make faster. Per size, interleaved with the two commands, the
reading alone: a new process loading those modules, setting its memory up as the ``harmony``
command does (``harmony.core.memory.tune_allocations``) and reading the file into its events
table (``harmony.importer.read_trace``), nothing more: what the import's reader costs before any
table, check, metric, figure or Parquet file, in time and in peak memory. Where 5x allows less
than a floor, the verdict says so; the largest floor is the reading alone followed by the
import's own figures step (the figures need every table, so the whole decode, before them).
Harmony is run as this interpreter's console script, not through a version manager's shim.

``--trace-cmd``: the traces are instead recorded whole, as ``trace-cmd record -e sched -- LOAD``
would record them: every sched event enabled in tracefs's top-level buffer, the ping-pong run
for as long as each size needs (scaled from a 1 s recording; its processes keep the comm
``python3``: give ``--comm 'python3*'``), then written by ``trace-cmd extract`` (a v7 file
compressed with zstd, trace-cmd record's own layout). ``trace-cmd record`` itself cannot enable
tracing where ``/proc/sys/kernel/ftrace_enabled`` is read-only (this host); extract only reads
the buffers. Such a trace holds sched_stat_runtime, sched_waking and every other sched event
besides the tracefs probe's, as a user's recording does.

``--compression zstd``: each trace converted (``trace-cmd convert --file-version 7 --compression
zstd``, not timed) into the layout ``trace-cmd record`` writes by default, and both commands run
on that. Beside each peak, the estimate the import refuses a file by
(``harmony.importer.memory_needed``): it must not be below the peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TIME = "/usr/bin/time"
#: the modules every `harmony import` loads: its fixed start-up
FLOOR_IMPORTS = ("import harmony.cli, harmony.importer, harmony.pipeline, harmony.analysis.plots, "
                 "harmony.analysis.report, pyarrow.parquet")
#: the reading alone: those modules, the memory set up as the harmony command sets it up, then
#: the file (argv[1]) read into its events table
READING_ALONE = (f"{FLOOR_IMPORTS}; import sys; from pathlib import Path; "
                 "from harmony.core.memory import tune_allocations; tune_allocations(); "
                 "from harmony.importer import read_trace; read_trace(Path(sys.argv[1]))")


def make_traces(base: Path, sizes: list[int], where: Path) -> dict[int, Path]:
    """size -> trace.dat of about that many events, replicated from the recording ``base``;
    existing files of the same name are used again."""
    from ingest import replicate
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracedat_write import write_tracedat

    where.mkdir(parents=True, exist_ok=True)
    out, n_base = {}, None
    for size in sizes:
        dat = where / f"pingpong-{size:.0e}.dat".replace("+", "")
        if not dat.exists():
            n_base = n_base or len(decode_dir(base).events)
            raw = where / f".raw-{size}"
            replicate(base, raw, size / n_base)
            write_tracedat(raw, dat.with_suffix(".part"))
            os.replace(dat.with_suffix(".part"), dat)
            shutil.rmtree(raw)
        out[size] = dat
    return out


TRACEFS = Path("/sys/kernel/tracing")


def record_tracecmd(dat: Path, seconds: float, pairs: int) -> int:
    """``seconds`` of ping-pong recorded with every sched event into ``dat`` as trace-cmd record
    would (see the module's docstring); returns the events it holds (trace-cmd's count)."""
    common.need_root("recording a trace")
    lock = common.host_lock()      # the load must not disturb someone's run
    kb = (TRACEFS / "buffer_size_kb").read_text().split()[0]
    try:
        (TRACEFS / "tracing_on").write_text("0")
        (TRACEFS / "trace").write_text("")
        # ~60 bytes an event, ~450 k events a second, spread over the CPUs: room to spare
        (TRACEFS / "buffer_size_kb").write_text(str(max(16384, int(seconds * 40_000))))
        (TRACEFS / "events/sched/enable").write_text("1")
        (TRACEFS / "tracing_on").write_text("1")
        common.pingpong(pairs, 0, seconds, comm="python3")
        (TRACEFS / "tracing_on").write_text("0")
        subprocess.run(["trace-cmd", "extract", "-o", str(dat)], check=True,
                       capture_output=True)
    finally:
        (TRACEFS / "events/sched/enable").write_text("0")
        (TRACEFS / "trace").write_text("")
        (TRACEFS / "buffer_size_kb").write_text(kb)
        (TRACEFS / "tracing_on").write_text("1")
        lock.release()
    stat = subprocess.run(["trace-cmd", "report", "--stat", "-i", str(dat)], check=True,
                          capture_output=True, text=True).stdout
    lost = sum(int(n) for n in re.findall(r"^overrun: (\d+)", stat, re.M))
    if lost:
        sys.exit(f"{dat}: the recording lost {lost} events (buffers too small)")
    return sum(int(n) for n in re.findall(r"^entries: (\d+)", stat, re.M)) or \
        sum(int(n) for n in re.findall(r"^read events: (\d+)", stat, re.M))


def tracecmd_traces(sizes: list[int], where: Path, pairs: int) -> dict[int, Path]:
    """size -> a trace.dat recorded as trace-cmd record records (:func:`record_tracecmd`) of
    about that many events; existing files of the same name are used again."""
    where.mkdir(parents=True, exist_ok=True)
    out, rate = {}, None
    for size in sizes:
        dat = where / f"tc-pingpong-{size:.0e}.dat".replace("+", "")
        if not dat.exists():
            if rate is None:
                probe = where / ".rate.dat"
                rate = record_tracecmd(probe, 1.0, pairs)
                probe.unlink()
            record_tracecmd(dat.with_suffix(".part"), max(0.5, size / rate), pairs)
            os.replace(dat.with_suffix(".part"), dat)
        out[size] = dat
    return out


def compressed(traces: dict[int, Path], algo: str) -> dict[int, Path]:
    """size -> the trace converted into a v7 trace.dat compressed with ``algo`` (made once)."""
    out = {}
    for size, dat in traces.items():
        z = dat.with_name(f"{dat.stem}-{algo}.dat")
        if not z.exists():
            part = z.with_suffix(".part")
            subprocess.run(["trace-cmd", "convert", "-i", str(dat), "-o", str(part),
                            "--file-version", "7", "--compression", algo], check=True,
                           capture_output=True)
            os.replace(part, z)
        out[size] = z
    return out


def timed(cmd: list[str], stdout=subprocess.DEVNULL, env=None, cwd=None) -> dict:
    """Run ``cmd`` under /usr/bin/time -v (in ``cwd``): wall s, peak RSS bytes, user and sys s."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as rep:
        r = subprocess.run([TIME, "-v", "-o", rep.name, *cmd], stdout=stdout,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
        text = rep.read()
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-300:]}")

    def field(name: str) -> str:
        m = re.search(rf"^\s*{re.escape(name)}: (.+)$", text, re.M)
        return m.group(1).strip() if m else ""

    h, _, s = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").rpartition(":")
    wall = float(s) + sum(float(x) * 60 ** (k + 1)
                          for k, x in enumerate(reversed(h.split(":"))) if x)
    return {"wall_s": wall, "peak_bytes": int(field("Maximum resident set size (kbytes)")) * 1024,
            "user_s": float(field("User time (seconds)")),
            "sys_s": float(field("System time (seconds)"))}


def harmony_import(dat: Path, comm: str, out: Path, env: dict | None = None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    r = timed([common.console_script("harmony") or "harmony", "import", str(dat), "--comm", comm,
               "-q", "--out", str(out)], env=None if env is None else dict(os.environ, **env))
    m = json.loads((out / "manifest.json").read_text())
    r["events"] = int(m["capture"]["n_events"])
    r["steps"] = {**m["timings_s"].get("analysis", {}), "figures": m["timings_s"].get("figures")}
    shutil.rmtree(out, ignore_errors=True)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: python bench/whole_import.py --sizes 1e6,3e6,1e7 "
                                        "--traces /var/tmp/harmony-traces")
    ap.add_argument("--sizes", default="1e6,3e6,1e7",
                    help="approximate events per trace, comma-separated (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per size (default %(default)s)")
    ap.add_argument("--warmups", type=int, default=1, choices=(0, 1),
                    help="untimed imports of each trace before its timed ones (default "
                         "%(default)s: kernels compiled and the file cached; 0: figures of a cold "
                         "import, for a smoke test)")
    ap.add_argument("--from", dest="source", type=Path,
                    help="replicate this tracefs recording (meta.json, formats/, cpuN.raw) instead "
                         "of recording a ping-pong (give --comm)")
    ap.add_argument("--comm", default="hmy-pp", help="the tasks imported (default %(default)s)")
    ap.add_argument("--record-s", type=float, default=1.0,
                    help="seconds of load recorded (default %(default)s)")
    ap.add_argument("--pairs", type=int, default=2, help="ping-pong pairs in the recorded load")
    ap.add_argument("--traces", type=Path, help="keep the traces here and use them again "
                                                "(default: a temporary directory)")
    ap.add_argument("--trace-cmd", action="store_true",
                    help="record the traces as trace-cmd record -e sched does (see above; give "
                         "--comm 'python3*')")
    ap.add_argument("--compression", choices=("none", "zstd"), default="none",
                    help="import the traces as trace-cmd record writes them: v7, compressed "
                         "(default %(default)s)")
    ap.add_argument("--fixed-events", type=float, default=4e4,
                    help="the size of the trace whose import measures an import's fixed costs "
                         "(default %(default)s events; 0: none)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    sizes = common.sizes(ap, a.sizes, a.reps)
    for tool in (TIME, "trace-cmd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (Debian: apt-get install {Path(tool).name})")
    work = Path(tempfile.mkdtemp(prefix="harmony-bench-import-"))
    try:
        return _run(a, sizes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def under_floor(budget_s: float, events: int, floor_s: float,
                floor: str = "loading the libraries alone") -> str:
    """What 5x allows at ``events``, and whether ``floor`` (what every import must do, taking
    ``floor_s``) already takes more."""
    text = f"5x needs {budget_s:.2f} s at {events:,}"
    if budget_s < floor_s:
        text += f" (less than {floor}: {floor_s:.2f} s)"
    return text


def lower_bounds(r: dict) -> list[tuple[float, str]]:
    """What an import of ``r``'s trace cannot take less than, measured beside it: reading the
    trace alone (a new process: the modules, the memory's set-up, the decode into the events
    table), and that followed by drawing the figures (the import's own figures step), which
    need every table and so the whole decode."""
    out = [(r["reading_s"], "reading the trace alone")]
    if r["steps"].get("figures"):
        out.append((r["reading_s"] + r["steps"]["figures"],
                    "reading the trace alone, then drawing its figures"))
    return out


def _run(a, sizes: list[int], work: Path) -> int:
    from ingest import record_base

    base = a.source
    # the trace whose import measures the fixed costs: no larger than the smallest size asked
    fixed = min(int(a.fixed_events), min(sizes)) if a.fixed_events else 0
    asked = set(sizes)
    sizes = sorted(asked | ({fixed} if fixed else set()))

    def small(traces: dict[int, Path]) -> Path | None:
        return None if not fixed else traces[fixed] if fixed in asked else traces.pop(fixed)
    if a.trace_cmd:
        traces = tracecmd_traces(sizes, a.traces or work / "traces", a.pairs)
        return _measure(a, traces, work, small(traces))
    if base is None:
        if a.traces and all((a.traces / f"pingpong-{s:.0e}.dat".replace("+", "")).exists()
                            for s in sizes):
            base = Path("/nonexistent")         # every trace is there already: nothing to record
        else:
            record_base(work / "base", a.record_s, a.pairs)
            base = work / "base" / "raw"
    traces = make_traces(base, sizes, a.traces or work / "traces")
    if a.compression != "none":
        traces = compressed(traces, a.compression)
    return _measure(a, traces, work, small(traces))


def fixed_costs(dat: Path, comm: str, out: Path, reps: int, warmups: int = 1) -> dict:
    """The import of the small trace ``dat`` with the compiled kernels (HARMONY_JIT=1, as every
    large trace's import loads them): what every import pays whatever its size (the libraries,
    numba and its kernels, Harmony's modules, the figures, the report); median wall seconds,
    peak RSS bytes and the events."""
    for _ in range(warmups):                                          # warm, not timed
        harmony_import(dat, comm, out, {"HARMONY_JIT": "1"})
    runs = [harmony_import(dat, comm, out, {"HARMONY_JIT": "1"}) for _ in range(reps)]
    return {"events": runs[0]["events"], "wall_s": common.median([r["wall_s"] for r in runs]),
            "figures_s": common.median([r["steps"].get("figures") for r in runs]),
            "peak_bytes": common.median([r["peak_bytes"] for r in runs])}


def beyond(r: dict, fixed: dict | None) -> str:
    """The bytes an event beyond what every import holds whatever its size (the fixed import's
    peak: the libraries, the figures), where it was measured."""
    if not fixed or r["events"] <= fixed["events"]:
        return ""
    per = (r["peak_bytes"] - fixed["peak_bytes"]) / (r["events"] - fixed["events"])
    return f"; {per:.0f} an event beyond the fixed import's peak"


def _measure(a, traces: dict[int, Path], work: Path, small: Path | None = None) -> int:
    floor = [timed([sys.executable, "-c", FLOOR_IMPORTS]) for _ in range(a.reps)]
    libraries_s = common.library_floor(a.reps)
    fixed = fixed_costs(small, a.comm, work / "run", a.reps, a.warmups) if small else None
    from harmony.importer import memory_needed

    results = []
    for size, dat in traces.items():
        for _ in range(a.warmups):                         # warm: kernels cached, file cached
            harmony_import(dat, a.comm, work / "run")
        ours, theirs, reading = [], [], []
        for _ in range(a.reps):                            # interleaved
            ours.append(harmony_import(dat, a.comm, work / "run"))
            theirs.append(timed(["trace-cmd", "report", "-i", str(dat)]))
            reading.append(timed([sys.executable, "-c", READING_ALONE, str(dat)]))
        n = ours[0]["events"]
        h, t = (common.median([r["wall_s"] for r in ours]),
                common.median([r["wall_s"] for r in theirs]))
        peak = common.median([r["peak_bytes"] for r in ours])
        steps = {k: common.median([r["steps"].get(k) for r in ours]) for k in ours[0]["steps"]}
        results.append({"events": n, "file_bytes": dat.stat().st_size, "harmony_s": h,
                        "tracecmd_s": t, "ratio": t / h, "peak_bytes": peak,
                        "bytes_per_event": peak / n, "estimate_bytes": memory_needed(dat)[0],
                        "tracecmd_peak_bytes": common.median([r["peak_bytes"] for r in theirs]),
                        "user_s": common.median([r["user_s"] for r in ours]),
                        "sys_s": common.median([r["sys_s"] for r in ours]), "steps": steps,
                        "reading_s": common.median([r["wall_s"] for r in reading]),
                        "reading_peak_bytes": common.median([r["peak_bytes"] for r in reading])})
    floor_s = common.median([r["wall_s"] for r in floor])
    print()
    common.table(["events", "file MB", "harmony s", "trace-cmd s", "trace-cmd / harmony",
                  "peak MB", "estimate MB", "bytes/event", "user s", "sys s", "tables s",
                  "checks s", "figures s", "reading alone s", "its bytes/event"],
                 [[r["events"], r["file_bytes"] / 1e6, r["harmony_s"], r["tracecmd_s"],
                   r["ratio"], r["peak_bytes"] / 1e6, r["estimate_bytes"] / 1e6,
                   r["bytes_per_event"], r["user_s"],
                   r["sys_s"], r["steps"].get("tables"), r["steps"].get("checks"),
                   r["steps"].get("figures"), r["reading_s"],
                   r["reading_peak_bytes"] / r["events"]] for r in results])
    print(f"\nfloor: importing the modules every import loads takes {floor_s:.2f} s "
          f"(python -c '{FLOOR_IMPORTS}'); the libraries alone {libraries_s:.2f} s "
          f"(python -c \"{common.LIBRARY_IMPORTS}\")")
    floor_at, what = libraries_s, "loading the libraries alone"
    if fixed:
        print(f"fixed costs: the import of a {fixed['events']:,}-event trace of the same kind with "
              f"the compiled kernels (HARMONY_JIT=1) takes {fixed['wall_s']:.2f} s (its figures "
              f"{fixed['figures_s']:.2f} s) and peaks at {fixed['peak_bytes'] / 1e6:.0f} MB")
        floor_at, what = fixed["wall_s"], "an import's fixed costs"
    # issue 48: from 4 M events up (judged on every size from 3.5 M events)
    judged = [r for r in results if r["events"] >= 3_500_000] or results
    warm = "warm" if a.warmups else "cold"
    print(common.verdict(f">= 5x faster than trace-cmd report ({warm}) from 4 M events",
                         min(r["ratio"] for r in judged) >= 5,
                         ", ".join(f"{r['ratio']:.2f}x at {r['events']:,}" for r in results)
                         + "; " + ", ".join(under_floor(r["tracecmd_s"] / 5, r["events"],
                                                        *max((floor_at, what),
                                                             *lower_bounds(r)))
                                            for r in results if r["ratio"] < 5)))
    low = [r for r in results if r["estimate_bytes"] < r["peak_bytes"]]
    print(common.verdict("the memory estimate an import is refused by is not below its peak",
                         not low, ", ".join(f"{r['estimate_bytes'] / r['peak_bytes']:.2f}x the peak"
                                            f" at {r['events']:,}" for r in results)))
    # issue 48: at 4 M and at 10 M events (judged on every size from 3.5 M events)
    big = [r for r in results if r["events"] >= 3_500_000]
    print(common.verdict("peak memory <= 150 bytes/event from 4 M events",
                         all(r["bytes_per_event"] <= 150 for r in big) if big else None,
                         ", ".join(f"{r['bytes_per_event']:.0f} bytes/event at {r['events']:,} "
                                   f"({r['peak_bytes'] / 1e9:.2f} GB{beyond(r, fixed)}; reading "
                                   f"it alone {r['reading_peak_bytes'] / r['events']:.0f})"
                                   for r in big)))
    common.emit_json(a.json, {"benchmark": "whole_import", "reps": a.reps, "warmups": a.warmups,
                              "floor_s": floor_s,
                              "libraries_s": libraries_s, "fixed": fixed,
                              "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
