#!/usr/bin/env python3
"""Fuzz one of Harmony's parsers of outside input, or replay its saved corpus.

    python fuzz/run.py --list                     the targets (fuzz/targets.py)
    python fuzz/run.py TARGET --seconds N         fuzz it for N seconds (atheris, coverage-guided)
    python fuzz/run.py TARGET --replay [FILE...]  run every saved input once (no fuzzer needed)
    python fuzz/run.py TARGET --minimize          merge what fuzzing found into fuzz/corpus/TARGET

Fuzzing starts from the saved corpus (fuzz/corpus/TARGET: seeds, inputs that found new coverage,
the inputs of past findings) and works in fuzz/work/TARGET/ (not committed): corpus/ grows as
atheris finds new coverage, findings/ gets each input that broke the contract, log the fuzzer's
output, last.json the counts of the last campaign. An input is a finding when the parser lets
anything but Harmony's one-line error naming the file escape (fuzz/targets.py), takes more than
``--timeout`` seconds (2), or makes the process grow by more than ``--rss-mb`` MiB (1024) over
what it holds before the first input. The fuzzer runs in a child process: the scratch directory
the targets write in is removed however it ends.

A fuzz campaign keeps a CPU busy: on a host where Harmony measures, run it under the measurement
lock (``flock /tmp/harmony-measure.lock python fuzz/run.py ...``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import operator
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from targets import NOT_INSTRUMENTED, TARGETS, Finding, scratch_dir  # noqa: E402

CORPUS = HERE / "corpus"
WORK = HERE / "work"
DICTS = HERE / "dicts"


def corpus_files(target: str) -> list[Path]:
    d = CORPUS / target
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def rss_mb() -> float:
    """This process's resident memory now (MiB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


# --- replay ------------------------------------------------------------------------------------

def replay(target_name: str, files: list[Path], timeout: float, rss_limit: float) -> int:
    """Run each of ``files`` through the target once; print and count what breaks the contract."""
    target = TARGETS[target_name]
    os.environ.update(target.env)
    bad = 0
    with scratch_dir() as tmp:
        scratch = Path(tmp)
        if files:                               # imports, numba's start-up: not an input's time
            try:
                target.one(files[0].read_bytes(), scratch)
            except Exception:  # noqa: BLE001  (the same input runs again below, and is reported)
                pass
        signal.signal(signal.SIGALRM, _alarm)
        for f in files:
            data = f.read_bytes()
            now, peak = rss_mb(), peak_rss_mb()
            t = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                refused = target.one(data, scratch)
                what = None
            except Hang:
                what = f"hang: over {timeout} s"
            except Finding as exc:
                what = str(exc)
            except Exception as exc:  # noqa: BLE001  (every other escape is a finding)
                what = f"{type(exc).__name__}: {exc}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            grew = peak_rss_mb() - now
            if what is None and peak_rss_mb() > peak and grew > rss_limit:
                what = f"memory: this input grew the process by {grew:.0f} MiB"
            if what is not None:
                bad += 1
                print(f"FINDING {f}: {what}"[:2000])
            elif os.environ.get("HARMONY_FUZZ_VERBOSE"):
                print(f"ok {f.name} {time.monotonic() - t:.3f}s "
                      f"{'decoded' if refused is None else 'refused: ' + refused}"[:300])
    print(f"{target_name}: {len(files)} inputs replayed, {bad} findings")
    return 1 if bad else 0


# --- fuzzing (child) ---------------------------------------------------------------------------

#: the operand types whose comparisons atheris traces (to steer the mutations towards them)
_TRACED_TYPES = frozenset({int, float, bool, str, bytes, type(None)})


def _trace_plain_comparisons_only(atheris) -> None:
    """atheris's comparison hook keeps a reference to a result that is not a bool: every numpy
    comparison the instrumented decoder makes (an array each) was never freed, ~15 KiB an input
    here, a GiB in a few minutes. The instrumented code looks the hook up on the atheris module
    at each call: comparisons of other operand types are made here without it."""
    from atheris.version_dependent import CMP_OP_SHIFT_AMOUNT
    native = atheris._trace_cmp
    ops = (operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge)

    def trace_cmp(a, b, op, counter, is_const):
        if type(a) in _TRACED_TYPES and type(b) in _TRACED_TYPES:
            return native(a, b, op, counter, is_const)
        return ops[op >> CMP_OP_SHIFT_AMOUNT](a, b)

    atheris._trace_cmp = trace_cmp


def fuzz_child(target_name: str, libfuzzer_args: list[str], rss_limit: float) -> None:
    import atheris

    _trace_plain_comparisons_only(atheris)
    target = TARGETS[target_name]
    os.environ.update(target.env)
    scratch = Path(os.environ["HARMONY_FUZZ_SCRATCH"])
    seeds = corpus_files(target_name)
    with atheris.instrument_imports(include=["harmony"], exclude=NOT_INSTRUMENTED):
        import harmony.pipeline  # noqa: F401  (every module a target may reach, instrumented)
        import harmony.probes.perf_data  # noqa: F401
        import harmony.probes.ringbuf  # noqa: F401
        import harmony.probes.tracedat_read  # noqa: F401
        for f in seeds:                        # whatever the parsers import lazily, and numba
            try:
                target.one(f.read_bytes(), scratch)
            except Exception:  # noqa: BLE001  (the fuzzer runs the seeds again and reports)
                pass
    print(f"run.py: {target_name}: {rss_mb():.0f} MiB resident after start-up",
          file=sys.stderr, flush=True)

    def one(data: bytes) -> None:
        now, peak = rss_mb(), peak_rss_mb()
        target.one(data, scratch)
        grew = peak_rss_mb() - now
        if peak_rss_mb() > peak and grew > rss_limit:
            raise Finding(f"memory: this input grew the process by {grew:.0f} MiB")

    atheris.Setup([sys.argv[0], *libfuzzer_args, f"-rss_limit_mb={BACKSTOP_MB}"], one)
    atheris.Fuzz()


# --- fuzzing (parent) --------------------------------------------------------------------------

_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")


#: a fuzzing child runs this long at most, then a new one goes on from the corpus: the child's
#: memory grows by ~20 KiB an input however small the input (in atheris and libFuzzer's own
#: allocations: the parsers' Python objects do not grow, see fuzz/README.md), which would reach
#: any limit in minutes
CHUNK_S = 60
#: libFuzzer's own limit on the child's memory, a backstop: each input's growth is checked
#: against --rss-mb by the child itself
BACKSTOP_MB = 4096


def fuzz(target_name: str, seconds: int, timeout: int, rss_limit: float, extra: list[str],
         work_root: Path = WORK) -> int:
    work = work_root / target_name
    corpus, findings = work / "corpus", work / "findings"
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    for f in corpus_files(target_name):
        if not (corpus / f.name).exists():
            shutil.copyfile(f, corpus / f.name)
    before = set(os.listdir(findings))
    args = [str(corpus), f"-timeout={timeout}", f"-artifact_prefix={findings}/",
            "-print_final_stats=1", *extra]
    if (DICTS / f"{target_name}.dict").exists():
        args.append(f"-dict={DICTS / f'{target_name}.dict'}")
    started = datetime.datetime.now(datetime.timezone.utc)
    end = time.monotonic() + seconds
    inputs, last, crashed, children = 0, None, 0, 0
    with scratch_dir() as tmp, open(work / "log", "w") as log:
        env = child_env(target_name, tmp, rss_limit)
        while (left := end - time.monotonic()) >= 1:
            cmd = [sys.executable, __file__, *args, f"-max_total_time={int(min(CHUNK_S, left))}"]
            stats = {}
            proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True,
                                    errors="replace")
            try:
                for line in proc.stderr:
                    sys.stderr.write(line)
                    log.write(line)
                    m = _STATUS.match(line)
                    if m:
                        last = m
                    m = re.match(r"stat::(\w+):\s+(\d+)", line)
                    if m:
                        stats[m.group(1)] = int(m.group(2))
                rc = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            children += 1
            inputs += stats.get("number_of_executed_units", 0)
            crashed += rc != 0
            if rc != 0 and not stats:          # died before fuzzing: nothing more will do better
                break
    new = sorted(set(os.listdir(findings)) - before)
    summary = {
        "target": target_name, "date": started.isoformat(timespec="seconds"),
        "command": f"python fuzz/run.py {target_name} --seconds {seconds}",
        "seconds": seconds, "children": children, "children_stopped_by_a_finding": crashed,
        "inputs": inputs, "cov": int(last.group(2)) if last else None,
        "ft": int(last.group(3)) if last else None, "corpus": len(os.listdir(corpus)),
        "findings": new,
    }
    (work / "last.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"run.py: {target_name}: {inputs} inputs in {seconds} s, cov {summary['cov']} "
          f"ft {summary['ft']}, corpus {summary['corpus']}, findings {len(new)}"
          + "".join(f"\n  {findings / n}" for n in new))
    return 1 if new or crashed else 0


#: bytes of the saved corpus of one target, past its seeds and regression inputs (the repository
#: keeps all of fuzz/corpus under 2 MiB)
CORPUS_BUDGET = 160 << 10


def minimize(target_name: str, work_root: Path = WORK, budget: int = CORPUS_BUDGET) -> int:
    """Merge the saved corpus and fuzz/work/TARGET/corpus into the fewest inputs that keep all the
    coverage (libFuzzer's -merge), and save the smallest of them, up to ``budget`` bytes, as the
    new fuzz/corpus/TARGET; seed-* and regress-* inputs are always kept."""
    saved = CORPUS / target_name
    keep = [f for f in corpus_files(target_name) if f.name.startswith(("seed-", "regress-"))]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "merged"
        out.mkdir()
        rc = subprocess.call([sys.executable, __file__, "-merge=1", str(out), str(saved),
                              str(work_root / target_name / "corpus")],
                             env=child_env(target_name, tmp, 1024))
        if rc != 0:
            return rc
        kept = {f.read_bytes() for f in keep}
        for f in corpus_files(target_name):
            if f not in keep:
                f.unlink()
        merged = sorted(out.iterdir(), key=lambda f: (f.stat().st_size, f.name))
        used = 0
        for f in merged:
            if f.read_bytes() in kept:
                continue
            used += f.stat().st_size
            if used > budget:
                break
            shutil.copyfile(f, saved / f.name)
    n = corpus_files(target_name)
    print(f"run.py: {target_name}: {len(merged)} inputs keep the coverage; {len(n)} saved "
          f"({sum(f.stat().st_size for f in n)} bytes)")
    return 0


def child_env(target_name: str, scratch: str, rss_limit: float) -> dict:
    """The environment of a fuzzing child: it runs ``run.py <libFuzzer arguments>`` only, since
    libFuzzer runs that command line again for a merge (so run.py is executable, and the Python
    running this one comes first on PATH)."""
    return dict(os.environ, HARMONY_FUZZ_CHILD=target_name, HARMONY_FUZZ_SCRATCH=scratch,
                HARMONY_FUZZ_RSS_MB=str(rss_limit),
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def main() -> int:
    child = os.environ.get("HARMONY_FUZZ_CHILD")
    if child:
        fuzz_child(child, sys.argv[1:], float(os.environ["HARMONY_FUZZ_RSS_MB"]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", choices=sorted(TARGETS))
    ap.add_argument("files", nargs="*", help="with --replay: these inputs only")
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--seconds", type=int, help="fuzz for this long")
    ap.add_argument("--replay", action="store_true", help="run the saved corpus once")
    ap.add_argument("--minimize", action="store_true",
                    help="merge fuzz/work/TARGET/corpus into fuzz/corpus/TARGET")
    ap.add_argument("--timeout", type=int, default=2, help="seconds an input may take")
    ap.add_argument("--rss-mb", type=float, default=1024,
                    help="MiB an input may add to the process (default 1024)")
    ap.add_argument("--work", type=Path, default=WORK,
                    help="where fuzzing keeps its corpus and findings (default fuzz/work)")
    args, extra = ap.parse_known_intermixed_args()
    if args.list or not args.target:
        for t in TARGETS.values():
            print(f"{t.name:12} {t.doc}")
        return 0
    if args.replay:
        return replay(args.target, [Path(f) for f in args.files] or corpus_files(args.target),
                      args.timeout,
                      args.rss_mb)
    if args.minimize:
        return minimize(args.target, args.work)
    if not args.seconds:
        ap.error("give --seconds N, --replay or --minimize")
    return fuzz(args.target, args.seconds, args.timeout, args.rss_mb,
                [a for a in extra if a != "--"], args.work)


if __name__ == "__main__":
    sys.exit(main())
