"""Write the seed inputs of fuzz/corpus/ from real captures made on this host.

    python fuzz/seeds.py --run RUN_DIR [--perf DIR] [--extract FILE]

RUN_DIR: a complete ``harmony run`` with the tracefs probe (e.g. ``harmony run single-source
--layout 2,0 --duration 0.3``; under the measurement lock): its raw/tracefs recording seeds the
page decoder (its first pages, and the same events as Harmony's own encoder writes them), the
trace.dat reader (``tracedat_write``'s version 6, and ``trace-cmd convert``'s version 7 plain and
zstd, when trace-cmd is installed) and the format parser (each format file); its manifest.json and
summary.json seed the run directory target, and its Parquet tables become fuzz/rundir/, the run
directory that target puts the fuzzed files in. ``--perf DIR``: perf.data, perf.script,
perf.header and perf.stats (``perf record -e sched:sched_switch -e sched:sched_migrate_task -k
CLOCK_MONOTONIC``, of one ``sleep 0.01`` for the perf.data seed (of the whole system it is 140 KB),
then ``perf script -F trace:tid,cpu,time,event,trace --ns --show-lost-events -G``, ``perf report
--header-only``, ``--stats``), and perf.pipe.data if there (the same ``perf record`` with ``-o -``,
its output a pipe-mode perf.data). ``--extract FILE``: a ``trace-cmd extract`` capture (version 7,
zstd; here 1.2 MB, mostly the kernel's symbols and formats: too large a seed, so not used).
Seeds are named seed-*; existing ones are replaced.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from targets import pack  # noqa: E402

#: pages of each CPU kept in a packed recording (a seed is best small: it is mutated whole)
PAGES = 2


def tree(d: Path, cut: dict[str, int] | None = None) -> dict[str, bytes]:
    """The files under ``d`` (relative path -> bytes), each cpuN.raw cut to its first pages."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.suffix == ".raw" and cut:
                data = data[:cut[p.name]]
            out[str(p.relative_to(d))] = data
    return out


def save(target: str, name: str, data: bytes) -> None:
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)
    print(f"{target}/seed-{name}: {len(data)} bytes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--perf", type=Path)
    ap.add_argument("--extract", type=Path)
    args = ap.parse_args()

    import harmony
    from harmony.probes.encode import write_recording
    from harmony.probes.ringbuf import decode_dir, load_meta
    from harmony.probes.tracedat_write import write_tracedat

    raw = args.run / "raw" / "tracefs"
    meta = load_meta(raw)
    page = int(meta["page_size"])
    cut = {p.name: PAGES * page for p in raw.glob("cpu*.raw")}
    files = tree(raw, cut)
    for target in ("ringbuf", "ringbuf_jit"):
        save(target, "tracefs", pack(files))
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small"
        shutil.copytree(raw, small)
        for name, n in cut.items():
            (small / name).write_bytes((raw / name).read_bytes()[:n])
        cap = decode_dir(small)
        enc = Path(tmp) / "encoded"
        write_recording(cap.events, cap.markers, cap.meta, enc)
        for target in ("ringbuf", "ringbuf_jit"):
            save(target, "encoded", pack(tree(enc)))
        dat = write_tracedat(small, Path(tmp) / "v6.dat")
        save("tracedat", "v6", dat.read_bytes())
        trace_cmd = shutil.which("trace-cmd")
        if trace_cmd:
            for name, opts in (("v7-zstd", ["--compression", "zstd"]),
                               ("v7-plain", ["--compression", "none"])):
                out = Path(tmp) / f"{name}.dat"
                subprocess.run([trace_cmd, "convert", "-i", str(dat), "-o", str(out),
                                "--file-version", "7", *opts], check=True, capture_output=True)
                save("tracedat", name, out.read_bytes())
    if args.extract:
        save("tracedat", "extract", args.extract.read_bytes())

    fdir = raw / "formats"
    for p in sorted(fdir.rglob("*")):
        if p.is_file():
            save("formats", "-".join(p.relative_to(fdir).parts[:-1] or [p.name]), p.read_bytes())

    run = harmony.load(args.run)
    assert run.complete
    save("rundir", "run", pack({n: (args.run / n).read_bytes()
                                for n in ("manifest.json", "summary.json")}))
    save("rundir", "run-table", pack({n: (args.run / n).read_bytes()
                                      for n in ("manifest.json", "summary.json",
                                                "runqueue.parquet")}))
    template = HERE / "rundir"
    shutil.rmtree(template, ignore_errors=True)
    template.mkdir()
    for p in sorted(args.run.glob("*.parquet")):
        shutil.copyfile(p, template / p.name)

    if args.perf:
        save("perf_data", "sched", (args.perf / "perf.data").read_bytes())
        if (args.perf / "perf.pipe.data").exists():
            save("perf_data", "pipe", (args.perf / "perf.pipe.data").read_bytes())
        for name in ("script", "header", "stats"):
            save("perf_text", name, (args.perf / f"perf.{name}").read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
