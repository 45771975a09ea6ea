"""perf.data import benchmark: ``harmony import FILE`` against ``perf script`` alone on the same
file.

What replaced ``perf script`` in the perf probe and in ``harmony import`` of a perf.data is the
direct reader (:mod:`harmony.probes.perf_read`); the targets (issue 26) are a whole import at
least 5x faster than the ``perf script`` it no longer runs, and at most 150 bytes an event at its
peak at 10 M events (judged on the largest recording, from 9 M events on). Per recording, in one
run and interleaved:

- perf script: the command the perf probe ran (``perf script -f -i FILE --ns --show-lost-events
  -F trace:tid,cpu,time,event,trace -G > /dev/null``), wall seconds
- harmony import: ``harmony import FILE --comm hmy-pp -q --out DIR`` (a new process, warm: one
  import of each file first, not timed): wall seconds, peak memory (``/usr/bin/time -v``) beside
  the estimate an import is refused by (:func:`harmony.importer.memory_needed`), and its steps'
  seconds from the run's manifest (tables, checks, figures)
- the reader alone: ``read_perf_data(FILE)`` in this process (warm), seconds

The recordings are real: ``perf record`` with the perf probe's options (system-wide, the sched
events Harmony decodes, ``-k CLOCK_MONOTONIC``) of a pipe ping-pong (``common.pingpong``), as long
as it takes to hold about each size's events (scaled from a 1 s recording); ``--pipe``: written to a
pipe (``-o -``), pipe-mode files. ``--traces DIR`` keeps them there and uses them again. Run it
under the measurement lock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from whole_import import TIME, harmony_import, under_floor  # noqa: E402

from harmony.importer import memory_needed  # noqa: E402
from harmony.probes.perf import CLOCK_ID, PERF_EVENTS  # noqa: E402
from harmony.probes.perf_read import read_perf_data  # noqa: E402

BENCH = Path(__file__).resolve().parent


def record(path: Path, seconds: float, pairs: int, pipe: bool = False) -> int:
    """``perf record`` (the perf probe's options) of ``seconds`` of ping-pong into ``path``
    (``pipe``: written to a pipe, ``-o -``, as a pipe-mode perf.data); returns the sched events
    it holds."""
    load = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import common; "
            f"common.pingpong({pairs}, 0, {seconds})")
    cmd = ["perf", "record", "-q", "-a", "-e", PERF_EVENTS, "-k", CLOCK_ID, "-m", "4096", "-B",
           "-N", "--synth=no", "--no-bpf-event", "-o", "-" if pipe else str(path), "--",
           sys.executable, "-c", load]
    lock = common.host_lock()      # the load must not disturb someone's run
    try:
        with open(path, "wb") if pipe else open(os.devnull, "wb") as out:
            r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    finally:
        lock.release()
    if r.returncode:
        sys.exit(f"perf record failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return len(read_perf_data(path).events)


def recordings(sizes: list[int], where: Path, pairs: int,
               pipe: bool = False) -> dict[int, Path]:
    """size -> a perf.data of about that many events (existing ones are used again)."""
    where.mkdir(parents=True, exist_ok=True)
    out, rate = {}, None
    for size in sizes:
        path = where / f"pingpong-{size:.0e}{'.pipe' if pipe else ''}.data".replace("+", "")
        if not path.exists():
            if rate is None:
                probe = where / ".rate.data"
                rate = record(probe, 1.0, pairs)
                probe.unlink()
            record(path.with_suffix(".part"), max(0.5, size / rate), pairs, pipe)
            os.replace(path.with_suffix(".part"), path)
        out[size] = path
    return out


def perf_script(path: Path) -> float:
    cmd = ["perf", "script", "-f", "-i", str(path), "--ns", "--show-lost-events",
           "-F", "trace:tid,cpu,time,event,trace", "-G"]
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        sys.exit(f"perf script failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: flock /tmp/harmony-measure.lock python "
                                        "bench/perf_import.py --sizes 1e6,3e6 --traces /var/tmp/pd")
    ap.add_argument("--sizes", default="1e6,3e6",
                    help="approximate events per recording, comma-separated (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions per size (default %(default)s)")
    ap.add_argument("--pairs", type=int, default=2, help="ping-pong pairs in the recorded load")
    ap.add_argument("--comm", default="hmy-pp", help="the tasks imported (default %(default)s)")
    ap.add_argument("--traces", type=Path, help="keep the recordings here and use them again "
                                                "(default: a temporary directory)")
    ap.add_argument("--pipe", action="store_true",
                    help="record to a pipe (perf record -o -): pipe-mode perf.data files")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    sizes = common.sizes(ap, a.sizes, a.reps)
    for tool in (TIME, "perf"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed")
    work = Path(tempfile.mkdtemp(prefix="harmony-bench-perf-"))
    try:
        files = recordings(sizes, a.traces or work / "traces", a.pairs, a.pipe)
        rows = []
        libraries_s = common.library_floor(a.reps)
        for size, path in files.items():
            harmony_import(path, a.comm, work / "warm")         # warm: caches, numba, page cache
            script, imports, reads = [], [], []
            for _ in range(a.reps):
                script.append(perf_script(path))
                imports.append(harmony_import(path, a.comm, work / "run"))
                t = time.perf_counter()
                n = len(read_perf_data(path).events)
                reads.append(time.perf_counter() - t)
            med = statistics.median
            imp = med(r["wall_s"] for r in imports)
            row = {"events": n, "file_mb": path.stat().st_size / 1e6, "perf_script_s": med(script),
                   "import_s": imp, "import_peak_mb": med(r["peak_bytes"] for r in imports) / 1e6,
                   "import_steps_s": {k: med((r["steps"].get(k) or 0) for r in imports)
                                      for k in ("tables", "checks", "figures")},
                   "reader_s": med(reads)}
            row["script_over_import"] = row["perf_script_s"] / imp
            row["bytes_per_event"] = row["import_peak_mb"] * 1e6 / max(n, 1)
            row["script_over_reader"] = row["perf_script_s"] / row["reader_s"]
            row["estimate_mb"] = memory_needed(path)[0] / 1e6     # what a refusal would say
            rows.append(row)
            steps = "/".join(f"{v:.2f}" for v in row["import_steps_s"].values())
            print(f"{n:>10,} events {row['file_mb']:7.0f} MB: "
                  f"perf script {row['perf_script_s']:6.2f} s"
                  f" | harmony import {imp:6.2f} s ({row['script_over_import']:.2f}x, peak "
                  f"{row['import_peak_mb']:.0f} MB, estimate {row['estimate_mb']:.0f} MB; "
                  f"tables/checks/figures {steps} s)"
                  f" | reader {row['reader_s']:.2f} s ({row['script_over_reader']:.1f}x)",
                  flush=True)
        # issue 48: from 4 M events up (judged on every size from 3.5 M events)
        target = all(r["script_over_import"] >= 5 for r in
                     [r for r in rows if r["events"] >= 3_500_000] or rows)
        ratios = ", ".join(f"{r['script_over_import']:.2f}x" for r in rows)
        alone = ", ".join(f"{r['script_over_reader']:.1f}x" for r in rows)
        # every import loads the libraries and reads the file: no import is faster than both
        short = "".join("; " + under_floor(r["perf_script_s"] / 5, r["events"],
                                           libraries_s + r["reader_s"],
                                           "loading the libraries and reading the file alone")
                        for r in rows if r["script_over_import"] < 5)
        print(f"target harmony import >= 5x perf script: {'PASS' if target else 'MISS'} "
              f"({ratios}); the reader alone {alone}{short}")
        print(common.verdict("the memory estimate an import is refused by is not below its peak",
                             all(r["estimate_mb"] >= r["import_peak_mb"] for r in rows),
                             ", ".join(f"{r['estimate_mb'] / r['import_peak_mb']:.2f}x the peak at "
                                       f"{r['events']:,}" for r in rows)))
        big = [r for r in rows if r["events"] >= 3_500_000]   # issue 48: at 4 M and 10 M
        print(common.verdict("peak memory <= 150 bytes/event from 4 M events (perf.data)",
                             all(r["bytes_per_event"] <= 150 for r in big) if big else None,
                             ", ".join(f"{r['bytes_per_event']:.0f} bytes/event at "
                                       f"{r['events']:,} ({r['import_peak_mb'] / 1e3:.2f} GB)"
                                       for r in big)))
        if a.json:
            text = json.dumps({"rows": rows, "reps": a.reps, "libraries_s": libraries_s},
                              indent=1)
            if a.json == "-":
                print(text)
            else:
                Path(a.json).write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
