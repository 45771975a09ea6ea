"""harmony.core.kernels: the kernel modules import without numba; the kernels built ahead of time
run a whole import without numba, as numba's JIT does it; a call no export matches goes to numba
and still gives the right answer; an export is called only with the argument types numba would
have compiled it for."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import host_skip, venv_with_these_packages

from harmony.core import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})}, check=False)


def test_the_kernel_modules_import_without_numba():
    """Decorating a kernel compiles nothing and imports no numba: a process that never calls one
    (or calls only built ones) never loads numba's runtime."""
    r = _python(f"""
        import importlib, sys
        for m in {kernels.KERNEL_MODULES!r}:
            importlib.import_module(m)
        print("numba" in sys.modules, "llvmlite" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def _need_built_kernels() -> None:
    """Skip where the kernels are not built ahead of time (fail in CI: install.sh builds them)."""
    if not kernels.aot_ready():
        host_skip("the kernels are not built ahead of time here (python -m harmony.precompile)")


IMPORT = """
    import json, os, sys, numpy as np
    from pathlib import Path
    from harmony.core import kernels
    from harmony.importer import import_trace
    from harmony.probes.encode import write_recording
    from harmony.probes.ringbuf import decode_dir
    from harmony.probes.tracedat_write import write_tracedat
    from harmony.simulate import simulate_run
    here = Path(sys.argv[1])
    sim = simulate_run("poly-balance", "single-source", 2, here / "sim",
                       overrides={"duration": "0.5", "layout": "4,0"})
    write_recording(sim.events, sim.markers, {"cpus": [0, 1], "clock": "mono"}, here / "raw")
    decode_dir(here / "raw")
    dat = write_tracedat(here / "raw", here / "trace.dat")
    import_trace(dat, here / "import", pids=[int(p) for p in sim.tasks["pid"]])
    # a whole system's trace: more comms and task names than an 8-bit code holds, and ties
    # across CPUs (a 20 us clock): its wider codes and the ties' pass (a Debian 6.1 guest's
    # trace of 161 tasks fell back to numba's JIT)
    from harmony.precompile import _coarse
    wide = simulate_run("poly-balance", "single-source", 4, here / "wide-sim",
                        overrides={"duration": "0.2", "layout": "140,0,0,0"})
    write_recording(_coarse(wide.events, 20_000), wide.markers,
                    {"cpus": [0, 1, 2, 3], "clock": "mono"}, here / "wide-raw")
    dat = write_tracedat(here / "wide-raw", here / "wide.dat")
    import_trace(dat, here / "import-wide", pids=[int(p) for p in wide.tasks["pid"]])
    # and the perf.data files of the fuzz corpus (a file, a pipe's, a compressed one)
    from harmony.probes.perf_read import read_perf_data
    for p in sorted(Path(sys.argv[2]).glob("seed-*")):
        read_perf_data(p)
    print(json.dumps({"numba": "numba" in sys.modules, "fallbacks": kernels.fallbacks()}))
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_an_import_by_the_built_kernels_loads_no_numba_and_matches_the_jit(tmp_path, threads):
    """A whole import (decode, tables, checks), one of a whole system's trace (wide codes, ties)
    and the corpus's perf.data files read, with the kernels forced on, once by the kernels
    built ahead of time and once by numba's JIT: the first never loads numba and no call misses
    its exports; both write the same tables."""
    _need_built_kernels()
    import pandas as pd
    env = {"HARMONY_JIT": "1", "HARMONY_THREADS": threads}
    runs = {}
    for aot in ("1", "0"):
        here = tmp_path / f"aot{aot}"
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(IMPORT), str(here),
                            os.path.join(ROOT, "fuzz", "corpus", "perf_data")],
                           capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, **env, "HARMONY_AOT": aot})
        assert r.returncode == 0, r.stderr[-2000:]
        runs[aot] = (json.loads(r.stdout.strip().splitlines()[-1]), here / "import")
    built, jit = runs["1"][0], runs["0"][0]
    assert built == {"numba": False, "fallbacks": {}}
    assert jit["numba"] is True
    for name in ("import", "import-wide"):
        built_run, jit_run = (runs[aot][1].parent / name for aot in ("1", "0"))
        tables = sorted(p.relative_to(built_run) for p in built_run.rglob("*.parquet"))
        assert tables and tables == sorted(p.relative_to(jit_run)
                                           for p in jit_run.rglob("*.parquet"))
        for t in tables:
            pd.testing.assert_frame_equal(pd.read_parquet(built_run / t),
                                          pd.read_parquet(jit_run / t))


def test_a_call_no_export_matches_runs_by_numba_and_is_counted():
    """importer_jit.mark is built for int32 and int16 values: int8 values (a type no import
    gives it) are marked by numba's JIT, rightly, and the call is counted as a fallback."""
    _need_built_kernels()
    from harmony import importer_jit
    before = kernels.fallbacks().get("harmony.importer_jit.mark", 0)
    seen = np.zeros(8, np.bool_)
    importer_jit.mark(np.array([1, 5, 1, 7], np.int32), seen, 0, 4)      # an export
    assert kernels.fallbacks().get("harmony.importer_jit.mark", 0) == before
    assert seen.nonzero()[0].tolist() == [1, 5, 7]
    seen[:] = False
    importer_jit.mark(np.array([2, 3], np.int8), seen, 0, 2)            # none: numba's JIT
    assert kernels.fallbacks()["harmony.importer_jit.mark"] == before + 1
    assert seen.nonzero()[0].tolist() == [2, 3]


def _values():
    a = np.arange(12, dtype=np.int64)
    ro = a.copy()
    ro.flags.writeable = False
    return {"int64": a, "int32": a.astype(np.int32), "readonly": ro, "strided": a[::2],
            "2d": a.reshape(3, 4), "fortran": np.asfortranarray(a.reshape(3, 4)),
            "big-endian": a.astype(">i8"), "bool": a > 3, "py-int": 7, "np-int64": np.int64(7),
            "np-int32": np.int32(7), "py-bool": True, "py-float": 1.5, "np-float32": np.float32(1),
            "unaligned": np.frombuffer(b"\0" + a.tobytes(), np.int64, 12, 1)}


def test_an_export_matches_exactly_the_arguments_numba_would_compile_it_for():
    """For every pair of values (x, y): an export compiled for numba's type of x is called with
    y if and only if numba types y the same, or as the writable form of a read-only array (the
    export only reads it); never with a value numba cannot type (a big-endian array); a type the
    exports cannot describe is never exported."""
    if kernels.numba_version() is None:
        host_skip("numba is not installed")
    import numba
    values = _values()

    def typeof(v):
        try:
            return numba.typeof(v)
        except numba.core.errors.NumbaError:        # a value numba cannot type
            return None

    for xname, x in values.items():
        tx = typeof(x)
        if tx is None:
            assert xname == "big-endian"
            continue
        spec = kernels.arg_spec(tx)
        if spec is None:
            assert xname in ("strided", "fortran"), xname
            continue
        checks = kernels._checks([spec])
        for yname, y in values.items():
            ty = typeof(y)
            same = ty == tx or (isinstance(tx, numba.types.Array) and not tx.mutable
                                and ty == tx.copy(readonly=False))
            assert kernels._matches(checks, (y,)) is same, (xname, yname)


def test_a_broken_build_is_not_used(tmp_path, monkeypatch):
    """An exports description that is not JSON, or names no extension file, or an extension
    that does not load: the kernels run by numba's JIT, nothing raised."""
    key = kernels.key()
    monkeypatch.setattr(kernels, "cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(kernels, "_aot_state", {})
    (tmp_path / key).mkdir()
    for text in ("{not json", json.dumps({"file": "missing.so", "kernels": {}}),
                 json.dumps({"kernels": {}})):
        (tmp_path / key / kernels.EXPORTS_FILE).write_text(text)
        kernels._aot_state.clear()
        assert kernels.aot_exports() == {} and kernels.aot_where() is None
    (tmp_path / key / "bad.so").write_bytes(b"\x7fELF truncated")
    (tmp_path / key / kernels.EXPORTS_FILE).write_text(json.dumps({"file": "bad.so",
                                                                   "kernels": {}}))
    kernels._aot_state.clear()
    assert kernels.aot_exports() == {}


def test_a_build_replaces_other_sources_builds_and_is_reused(tmp_path, monkeypatch):
    """harmony.precompile's build: into the cache directory under this key; removed: a build of
    other sources for this environment, one that says no environment, a killed build's
    leftovers (an hour old), all but the newest four of other environments' builds (another
    Python or CPU sharing the install: removed, each built again at its next command and
    removed this one's); kept: another build in progress, the four. Built once, found the
    second time (not rebuilt); loaded from there."""
    import shutil
    import time

    from harmony.precompile import KEEP_OTHER_ENVIRONMENTS, build_extension
    if shutil.which("cc") is None:
        host_skip("no C compiler: the kernels cannot be built ahead of time")
    monkeypatch.setattr(kernels, "cache_dirs", lambda: [tmp_path])
    for name in ("0123456789abcdef01234567", ".busy-build", ".killed-build"):
        (tmp_path / name).mkdir()
    hour_ago = time.time() - 3700
    os.utime(tmp_path / ".killed-build", (hour_ago, hour_ago))
    older = tmp_path / "older-sources"
    older.mkdir()
    (older / kernels.EXPORTS_FILE).write_text(json.dumps({"environment": kernels.environment()}))
    others = [tmp_path / f"other-{i}" for i in range(KEEP_OTHER_ENVIRONMENTS + 1)]
    for i, d in enumerate(others):     # other-0 the oldest
        d.mkdir()
        (d / kernels.EXPORTS_FILE).write_text(json.dumps({"environment": f"elsewhere {i}"}))
        os.utime(d, (hour_ago + i, hour_ago + i))
    where, exported, skipped = build_extension({})
    assert (where, exported, skipped) == (tmp_path / kernels.key(), 0, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".busy-build", kernels.key(), *(d.name for d in others[1:])])
    assert json.loads((where / kernels.EXPORTS_FILE).read_text())["environment"] \
        == kernels.environment()
    for d in others[1:]:
        shutil.rmtree(d)
    described = json.loads((where / kernels.EXPORTS_FILE).read_text())
    assert described["kernels"] == {} and (where / described["file"]).is_file()
    made = (where / kernels.EXPORTS_FILE).stat().st_mtime_ns
    assert build_extension({}) == (where, 0, [])
    assert (where / kernels.EXPORTS_FILE).stat().st_mtime_ns == made
    monkeypatch.setattr(kernels, "_aot_state", {})
    assert kernels.aot_exports() == {} and kernels.aot_where() == where


def test_a_build_lacking_a_signature_found_is_built_again(tmp_path, monkeypatch):
    """The key holds the kernels' sources, not their callers': where a caller now passes other
    types (a signature precompile found that the build under this key does not export), the
    build is made again with it, then reused."""
    import shutil

    import numba

    from harmony.precompile import build_extension
    if shutil.which("cc") is None:
        host_skip("no C compiler: the kernels cannot be built ahead of time")
    monkeypatch.setattr(kernels, "cache_dirs", lambda: [tmp_path])
    where, exported, _ = build_extension({})
    assert exported == 0

    def twice(x):
        return 2 * x

    found = {"harmony.test_only.twice": numba.njit(nogil=True)(twice)}
    assert found["harmony.test_only.twice"](np.int64(21)) == 42
    assert build_extension(found) == (where, 1, [])
    described = json.loads((where / kernels.EXPORTS_FILE).read_text())
    assert list(described["kernels"]) == ["harmony.test_only.twice"]
    made = (where / kernels.EXPORTS_FILE).stat().st_mtime_ns
    assert build_extension(found) == (where, 1, [])             # covered: reused
    assert build_extension({}) == (where, 1, [])                # a subset: reused too
    assert (where / kernels.EXPORTS_FILE).stat().st_mtime_ns == made


def test_a_command_s_failed_build_is_said_recorded_and_not_tried_again(tmp_path, monkeypatch):
    """Where this code's kernels are not built, a command builds them first
    (harmony.precompile.ensure_built); a build that fails (here: a stand-in command printing
    why and exiting 1) is said as a warning with its last line, recorded beside the builds, and
    never tried again by a command; a successful build later removes the record. Without
    numba's JIT or with HARMONY_AOT=0 nothing is built."""
    from harmony import precompile
    monkeypatch.setattr(kernels, "cache_dirs", lambda: [tmp_path / "none", tmp_path / "k"])
    (tmp_path / "none").write_text("a file: not a directory to build in")
    monkeypatch.setattr(kernels, "_aot_state", {})
    monkeypatch.delenv("HARMONY_AOT", raising=False)
    monkeypatch.setenv("HARMONY_JIT", "auto")
    tries = tmp_path / "tries"
    monkeypatch.setattr(precompile, "BUILD_ARGS", (
        "-c", f"import sys; open({str(tries)!r}, 'a').write('x'); print('building...'); "
              "print('cc: not found', file=sys.stderr); print('done'); raise SystemExit(1)"))
    said, warned = [], []
    assert precompile.build_needed()
    assert precompile.ensure_built(said.append, warned.append) is False
    assert len(said) == 1 and "building Harmony's compiled kernels" in said[0]
    assert len(warned) == 1 and "could not be built (cc: not found)" in warned[0]
    failed = tmp_path / "k" / (kernels.key() + kernels.FAILED_SUFFIX)
    assert json.loads(failed.read_text())["last_line"] == "cc: not found"
    assert not precompile.build_needed()
    assert precompile.ensure_built(said.append, warned.append) is False
    assert tries.read_text() == "x" and len(said) == 1 and len(warned) == 1
    from harmony.core.jit import describe       # doctor's decoder line says why
    assert "a command's build for this code failed (cc: not found)" in describe()[1]
    failed.unlink()
    for env in ({"HARMONY_AOT": "0"}, {"HARMONY_JIT": "0"}):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert not precompile.build_needed()
    import shutil
    if shutil.which("cc") is not None:          # a build that works removes the record
        failed.write_text("{}")
        precompile.build_extension({})
        assert not failed.exists() and (tmp_path / "k" / kernels.key()).is_dir()


def test_a_failed_build_s_warning_says_its_reason_once(tmp_path, monkeypatch):
    """Where `python -m harmony.precompile` cannot build (numba's compiler raised: here its own
    two lines, as it prints them, then a line of something else), a command's warning gives the
    reason it said, and says only once what runs instead (it said it twice: "...ahead of time
    (<reason>; numba's JIT runs them ...)); numba's JIT runs them ...")."""
    from harmony import precompile
    monkeypatch.setattr(kernels, "cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(kernels, "_aot_state", {})
    monkeypatch.delenv("HARMONY_AOT", raising=False)
    monkeypatch.setenv("HARMONY_JIT", "auto")
    reason = "The 'setuptools' package is required at runtime for pycc support."
    monkeypatch.setattr(precompile, "BUILD_ARGS", (
        "-c", f"import sys; print({precompile.NOT_BUILT + reason!r}, file=sys.stderr); "
              "print('harmony.precompile: numba JIT runs them instead', file=sys.stderr); "
              "print('something else', file=sys.stderr)"))
    warned = []
    assert precompile.ensure_built(lambda line: None, warned.append) is False
    assert warned == [f"the compiled kernels could not be built ({reason}); numba's JIT runs "
                      "them (each large import loads it, ~0.4 s): python -m harmony.precompile "
                      "tries again"]
    failed = tmp_path / (kernels.key() + kernels.FAILED_SUFFIX)
    assert json.loads(failed.read_text())["last_line"] == reason


def test_what_the_kernels_build_imports_is_a_requirement_of_harmony():
    """Every distribution the ahead-of-time build imports (numba.pycc, beyond what Harmony has
    loaded already) is one `pip install .` installs: among harmony-sched's requirements or
    theirs. numba.pycc imports setuptools, which Python 3.12's venvs no longer carry: a plain
    install there could not build its kernels and fell back to numba's JIT (found in a 3.13
    venv, 2026-12-07)."""
    r = _python("""
        import importlib.metadata as md, os, sys, warnings
        import numba, harmony.precompile
        before = set(sys.modules)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # pycc's pending deprecation
            import numba.pycc.compiler
            from numba.pycc import CC  # noqa: F401
        tops = {m.split(".")[0] for m in set(sys.modules) - before} | {"numba"}

        def where(top):
            m = sys.modules.get(top)
            f = getattr(m, "__file__", None) or next(iter(getattr(m, "__path__", [])), None)
            return os.path.realpath(f) if f else None
        # a package's vendored copies (setuptools/_vendor/jaraco ...) are that package's
        homes = {t: os.path.dirname(p) + os.sep for t in tops
                 if (p := where(t)) and p.endswith("__init__.py")}
        own = {t for t in tops
               if not any(o != t and (where(t) or "").startswith(h) for o, h in homes.items())}
        owners = md.packages_distributions()
        print(" ".join(sorted({d for t in own for d in owners.get(t, [])})))
    """)
    assert r.returncode == 0, r.stderr
    from packaging.utils import canonicalize_name
    used = {canonicalize_name(d) for d in r.stdout.split()}
    assert "numba" in used and "setuptools" in used         # the check sees what it checks
    missing = used - _requirement_closure("harmony-sched")
    assert not missing, f"imported by the kernels' build, not required by harmony: {missing}"


def _requirement_closure(root: str) -> set[str]:
    """The distributions installing ``root`` installs (its requirements whose markers hold here,
    theirs, ...; extras left out), by their normalised names, ``root`` included."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        key = canonicalize_name(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            wanted = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in wanted:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.mark.needs_tool("cc")
def test_a_plain_pip_install_builds_its_kernels_at_its_first_command(tmp_path):
    """A fresh install of this checkout by pip alone (a new venv, the dependencies from this
    Python's site-packages) has no kernels built: its first `harmony import` builds them, says
    so, and runs; the second builds nothing and its import loads no numba (the built kernels
    ran, as after install.sh); `harmony doctor` names the build, in the venv. Removed by
    `python -m harmony.precompile --remove`, what compiling wrote is gone with the package at
    `pip uninstall` (a harmony directory of caches stayed in site-packages before)."""
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat
    from harmony.simulate import simulate_run
    sim = simulate_run("poly-balance", "single-source", 2, tmp_path / "sim",
                       overrides={"duration": "0.3", "layout": "4,0"})
    write_recording(sim.events, sim.markers, {"cpus": [0, 1], "clock": "mono"}, tmp_path / "raw")
    dat = write_tracedat(tmp_path / "raw", tmp_path / "t.dat")
    venv = venv_with_these_packages(tmp_path / "venv")
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", ROOT],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items()
           if k not in ("HARMONY_AOT", "HARMONY_JIT", "NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")       # no build of the user's either
    pids = ",".join(str(p) for p in sim.tasks["pid"])

    def harmony(*args):
        return subprocess.run([str(venv / "bin" / "harmony"), *args], capture_output=True,
                              text=True, timeout=900, cwd=tmp_path, env=env)

    first = harmony("import", str(dat), "--pid", pids.split(",")[0], "--out",
                    str(tmp_path / "one"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "note: building Harmony's compiled kernels" in first.stderr, first.stderr[-3000:]
    assert "note: compiled kernels built in" in first.stderr, first.stderr[-3000:]
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import harmony, sys; print(harmony.__file__)"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert site.startswith(str(venv)), site                   # the installed copy ran
    second = harmony("import", str(dat), "--pid", pids.split(",")[0], "--out",
                     str(tmp_path / "two"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "building" not in second.stderr
    doctor = harmony("doctor")
    line = next(x for x in doctor.stdout.splitlines() if x.startswith("decoder"))
    assert "compiled ahead of time" in line and str(venv) in line, line
    r = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent("""
        import sys
        from harmony.core import jit, kernels
        from harmony.importer import read_trace
        from pathlib import Path
        read_trace(Path(sys.argv[1]))
        print(kernels.aot_ready(), "numba" in sys.modules)
        """), str(dat)], capture_output=True, text=True, cwd=tmp_path,
        env={**env, "HARMONY_JIT": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False"]
    # numba's JIT too (its cache files beside the modules), then what an uninstall leaves: the
    # removal first takes every compiled file out, and pip's uninstall leaves no harmony
    # directory behind (one without __init__.py, found first by a later editable install)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent("""
        import sys
        from harmony.importer import read_trace
        from pathlib import Path
        read_trace(Path(sys.argv[1]))
        """), str(dat)], capture_output=True, text=True, cwd=tmp_path,
        env={**env, "HARMONY_JIT": "1", "HARMONY_AOT": "0"}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    package = Path(site).parent
    assert list(package.rglob("*.nbi")) and (package / "__pycache__" / "kernels").is_dir()
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "harmony.precompile", "--remove"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0 and "removed" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "harmony-sched"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not package.exists(), sorted(str(f) for f in package.rglob("*"))[:10]
