"""First-use benchmark: a fresh install's first ``harmony import`` against its second.

A fresh install, honestly: a new virtual environment (``python3 -m venv --system-site-packages``,
so the dependencies come from this Python's site-packages, as a Debian install gets them), this
checkout installed into it with ``pip install --no-deps`` (a wheel, built once, installed: new
files, new modification times, no numba cache beside them), and a new, empty matplotlib
configuration directory (``MPLCONFIGDIR``: its font cache, as a new user has none). Then, per
way of installing, in the same fresh environment:

- ``install.sh``: what install.sh does after pip, ``python -m harmony.precompile`` (timed: the
  install's own cost), then the first ``harmony import FILE``, then the second;
- ``pip only``: nothing after pip: the first import builds the kernels itself before it starts
  (``harmony.precompile.ensure_built``: in its wall time), as install.sh's step would.

Each repetition makes new environments for both ways (interleaved). The ratio is the first
import's wall time over the second's (``/usr/bin/time``). The trace: ``--trace FILE --comm
NAME``, or a ping-pong recorded with the tracefs probe (root) replicated to ``--events`` events
and written as a trace.dat, as ``bench/whole_import.py`` makes them (large enough, by default,
that the import runs the compiled kernels: ``harmony.core.jit``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from whole_import import make_traces, timed  # noqa: E402

WAYS = ("install.sh", "pip only")


def build_wheel(where: Path) -> Path:
    """This checkout built once into a wheel under ``where`` (what ``pip install CHECKOUT`` builds
    before it installs: every fresh install then installs the same wheel, not a build each)."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where),
                        str(common.REPO)], capture_output=True, text=True)
    wheels = sorted(where.glob("*.whl"))
    if r.returncode or len(wheels) != 1:
        sys.exit(f"pip wheel {common.REPO} failed: {r.stderr.strip()[-400:]}")
    return wheels[0]


def fresh_install(where: Path, wheel: Path) -> Path:
    """A new venv at ``where`` with this checkout's ``wheel`` installed (not editable); its bin
    directory."""
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(where)
    if sys.prefix != sys.base_prefix:
        # this Python runs in a venv: the new one's system site-packages are the base
        # interpreter's, not this one's, which a .pth file adds (behind the venv's own)
        own = next((where / "lib").glob("python*/site-packages"))
        (own / "_these_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --force-reinstall: a wheel of the version this Python has already is otherwise skipped
    r = subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", str(wheel)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"pip install {wheel} into {where} failed: {r.stderr.strip()[-400:]}")
    return where / "bin"


def one_way(way: str, dat: Path, comm: str, work: Path, wheel: Path) -> dict:
    """A fresh install of ``wheel``, installed the way ``way`` says; its first and second import
    timed."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bin_dir = fresh_install(work / "venv", wheel)
    env = dict(os.environ, MPLCONFIGDIR=str(work / "mpl"), HARMONY_JIT="auto")
    env.pop("NUMBA_CACHE_DIR", None)
    out = {"way": way}
    # run from the scratch directory: `python -m` from a checkout would import the checkout's
    # harmony (the current directory comes first in sys.path), and find its numba cache
    if way == "install.sh":
        out["precompile_s"] = timed([str(bin_dir / "python"), "-m", "harmony.precompile"],
                                    env=env, cwd=work)["wall_s"]
    for k in ("first", "second"):
        run = work / k
        r = timed([str(bin_dir / "harmony"), "import", str(dat), "--comm", comm, "-q", "--out",
                   str(run)], env=env, cwd=work)
        m = json.loads((run / "manifest.json").read_text())
        out[f"{k}_s"], out["events"] = r["wall_s"], int(m["capture"]["n_events"])
        shutil.rmtree(run)
    out["ratio"] = out["first_s"] / out["second_s"]
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="a trace.dat to import (with --comm)")
    ap.add_argument("--comm", default="hmy-pp", help="the tasks imported (default %(default)s)")
    ap.add_argument("--events", type=float, default=3e6,
                    help="events of the recorded trace, without --trace (default %(default)g)")
    ap.add_argument("--reps", type=int, default=2,
                    help="fresh installs per way (default %(default)s)")
    ap.add_argument("--ways", default=",".join(WAYS),
                    help=f"comma-separated, of: {', '.join(WAYS)} (default: both)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    a = ap.parse_args(argv)
    ways = [w.strip() for w in a.ways.split(",") if w.strip()]
    if not ways or set(ways) - set(WAYS) or a.reps < 1:
        ap.error(f"--ways: of {', '.join(WAYS)}; --reps at least 1")
    if a.trace is not None and not a.trace.is_file():
        ap.error(f"--trace: {a.trace} is not a file")
    work = Path(tempfile.mkdtemp(prefix="harmony-bench-first-use-"))
    try:
        dat = a.trace
        if dat is None:
            from ingest import record_base
            record_base(work / "base", 1.0, 2)
            dat = make_traces(work / "base" / "raw", [int(a.events)],
                              work / "traces")[int(a.events)]
        wheel = build_wheel(work / "wheel")
        rows = [one_way(w, dat, a.comm, work / "install", wheel) for _ in range(a.reps)
                for w in ways]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    common.table(["way", "events", "precompile s", "first import s", "second import s",
                  "first / second"],
                 [[r["way"], r["events"], r.get("precompile_s"), r["first_s"], r["second_s"],
                   r["ratio"]] for r in rows])
    for w in ways:
        mine = [r for r in rows if r["way"] == w]
        ratio = common.median([r["ratio"] for r in mine])
        print(common.verdict(f"first import within 1.3x of the second ({w})",
                             ratio <= 1.3 if w == "install.sh" else None,
                             f"median {ratio:.2f}x over {len(mine)} fresh installs"
                             + ("" if w == "install.sh" else " (for comparison: no target)")))
    common.emit_json(a.json, {"benchmark": "first_use", "reps": a.reps, "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
