"""Shared fixtures and helpers of the test suite, and the rules every test run follows.

- A test that cannot run on this host (no root, no tracefs, no perf, no numba, the host lock held
  by other runs for minutes, a lossy capture, ...) calls :func:`host_skip` with the reason: it
  skips and says why (``-rs`` is in setup.cfg's addopts); in CI (``CI=true``, as root), where
  every test must run, it fails with that reason instead. ``HARMONY_TESTS_NO_KERNEL=<why>`` makes
  the kernel unavailable to the tests (tests/test_suite_rules.py proves a CI run then fails).
- Every test that uses the ``kernel`` fixture, directly or through another fixture, is marked
  ``kernel``; every test marked ``kernel`` checks the kernel before it starts. So
  ``-m "not kernel"`` selects exactly the hermetic tests.
- ``@pytest.mark.needs_tool("perf")`` and ``@pytest.mark.needs_cpus(2)`` state what else a test
  needs from the host, with the same skip-or-fail rule.
- A real-kernel test gates on what Harmony measured agreeing with an independent reading (the
  kernel's own counters, trace-cmd, perf, sysfs read in the test: tests/measured.py), and on
  what its configuration forces; what the kernel chose (balanced or not, fair shares or not) is
  reported (``measured.report_kernel_behaviour``: a warning in the summary), never gated on.
- A parametrisation whose list comes out empty fails at collection (setup.cfg's
  ``empty_parameter_set_mark``); the compiled code's cases are collected without numba too, and
  say so through host_skip.
- Every ``harmony.*`` module must come from this checkout: an editable install made from another
  clone maps ``probes/``, ``analysis/`` and ``experiments/`` there, and the tests would then test
  that clone's code. The session stops with the modules' paths when that happens.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import pytest

# harmony imports: none at the top of this module, and the fixtures and helpers import what they
# use when called. The guard below must be able to say where harmony comes from before any harmony
# import can fail, or bring in modules from another clone.

TRACEFS = Path("/sys/kernel/tracing")

#: the checkout under test: the directory holding tests/
ROOT = Path(__file__).resolve().parent.parent

#: setting it (to a reason) makes the kernel unavailable to the tests
NO_KERNEL_ENV = "HARMONY_TESTS_NO_KERNEL"

#: how long a test waits for other runs to release the host lock before it gives up
BUSY_WAIT_S = 120


# ------------------------------------------------------------------------------ skip or fail

def in_ci() -> bool:
    """True in CI: ``CI`` set to true (as CI services do) and running as root, where every test
    can run and must."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes") and os.geteuid() == 0


def pids_with_comm(prefix: str) -> list[int]:
    """The processes whose command name (/proc/PID/comm) starts with ``prefix``: what a test
    checks is left running (workers, QEMU, sched_ext schedulers)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().startswith(prefix):
                out.append(int(entry.name))
        except OSError:
            pass
    return out


def sigint_as_a_terminal() -> None:
    """``preexec_fn`` of a command a test stops with SIGINT: the signal delivered as a terminal's
    Ctrl-C is, even where the tests run with SIGINT ignored (a shell's background job: its
    commands, pytest's workers and their children inherit the ignored signal, and Python keeps
    it ignored). Without it such a command may never see the signal: simulated suites signalled
    once their first run was written, SIGINT ignored as a background job has it, ran on to
    their end, status 0, 6 times in 6 (2026-12-06)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def venv_with_these_packages(where: Path) -> Path:
    """A venv at ``where`` that sees this Python's packages: ``--system-site-packages`` gives the
    base interpreter's site-packages, which are not this Python's where it runs in a venv itself
    (there they are added by a .pth file, behind the new venv's own)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(where)],
                   check=True, timeout=120)
    if sys.prefix != sys.base_prefix:
        import site
        own = next((where / "lib").glob("python*/site-packages"))
        (own / "_these_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return where


def host_skip(reason: str) -> NoReturn:
    """Skip the test because this host cannot run it; in CI (:func:`in_ci`) fail with the reason."""
    __tracebackhide__ = True    # the skip is reported at the caller's line
    if in_ci():
        pytest.fail(f"CI=true as root, where every test must run: {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str):
    """A tmpfs of ``size`` (mount's syntax: 400k, 1m) mounted at ``mnt`` (made here) for the
    block's time: a disk that fills up. Skip (fail in CI) where none can be mounted."""
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode:
        host_skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@functools.cache
def kernel_skip_reason() -> str | None:
    """Why kernel tests cannot run here, or None if they can."""
    if os.environ.get(NO_KERNEL_ENV):
        return f"{NO_KERNEL_ENV} is set ({os.environ[NO_KERNEL_ENV]}): the kernel is not used"
    if os.geteuid() != 0:
        return "kernel tests need root"
    if not (TRACEFS / "events").is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)
        if not (TRACEFS / "events").is_dir():
            return "tracefs is not mounted and cannot be mounted"
    if not (TRACEFS / "events/sched/sched_switch").is_dir():
        return "the sched tracepoints are not available"
    return None


def pytest_collection_modifyitems(items):
    """The ``kernel`` marker follows the fixture: every test that uses it is marked."""
    for item in items:
        if "kernel" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("kernel"):
            item.add_marker(pytest.mark.kernel)


def pytest_runtest_setup(item):
    """What a test needs from the host (its ``kernel``, ``needs_tool`` and ``needs_cpus``
    markers), checked before its fixtures start anything."""
    if item.get_closest_marker("kernel"):
        reason = kernel_skip_reason()
        if reason:
            host_skip(reason)
    for mark in item.iter_markers("needs_tool"):
        for tool in mark.args:
            if shutil.which(tool) is None:
                host_skip(f"{tool} is not installed")
    for mark in item.iter_markers("needs_cpus"):
        if len(os.sched_getaffinity(0)) < mark.args[0]:
            host_skip(f"needs {mark.args[0]} CPUs")


@pytest.fixture(scope="session")
def kernel():
    """The real kernel's tracefs, as root; skip (fail in CI) where the host cannot trace."""
    reason = kernel_skip_reason()
    if reason:
        host_skip(reason)
    return TRACEFS


def retry_busy(fn, wait_s: float = BUSY_WAIT_S):
    """Run ``fn``; retry while another run holds the host lock, for up to ``wait_s`` seconds."""
    from harmony.hygiene import HostBusy  # (local: see "harmony imports" above)

    give_up = time.monotonic() + wait_s
    while True:
        try:
            return fn()
        except HostBusy:
            if time.monotonic() > give_up:
                host_skip(f"another Harmony run held the host lock for {wait_s:.0f} s")
            time.sleep(2)


def single_source_run(out: Path, duration: float, **overrides):
    """A single-source run on every online CPU, through the library entry point `harmony run`
    uses (waiting for the host lock)."""
    from harmony.core.osutil import online_cpus
    from harmony.experiments import get_experiment
    from harmony.run import execute

    exp = get_experiment("single-source")
    cpus = online_cpus()
    params = exp.resolve({"duration": duration, **overrides}, cpus)
    return retry_busy(lambda: execute(exp, params, cpus, out, quiet=True))


#: how many times a test measures again when the host was busy during its run
QUIET_TRIES = 3


def measure_quietly(measure, busy, tries: int = QUIET_TRIES):
    """``measure(k)`` (k = 0, 1, ...) until ``busy(result)`` says nothing (None or ""), at most
    ``tries`` times: a check that other jobs on the CPUs would make meaningless is judged on a
    quiet run. Returns that result; after ``tries`` busy ones, :func:`host_skip` with the last
    reason (a failure in CI)."""
    for k in range(tries):
        result = measure(k)
        why = busy(result)
        if not why:
            return result
    host_skip(f"{why} ({tries} runs, all busy)")


@pytest.fixture
def host(kernel):
    """The host lock (waiting for other runs): our workers must not disturb a measurement."""
    from harmony.hygiene import HostBusy, HostLock

    if len(os.sched_getaffinity(0)) < 2:
        host_skip("needs 2 CPUs")
    for _ in range(300):
        try:
            lock = HostLock().acquire()
            break
        except HostBusy:
            time.sleep(1)
    else:
        pytest.fail("the host lock stayed busy for 5 minutes")
    yield
    lock.release()


def until(cond, timeout_s: float = 10.0) -> bool:
    """Poll ``cond`` (a deadline for a hung kernel, never a timing assertion)."""
    give_up = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------------------- implementations

#: the implementations a compiled-or-numpy test runs under (see :func:`use_implementation`)
IMPLEMENTATIONS = ["compiled", "threads", "numpy"]
#: the compiled ones, for a test that compares each with numpy itself
COMPILED = ["compiled", "threads"]


def forks_counted(monkeypatch) -> list[int]:
    """The children os.fork makes from now on (their pids, as the parent sees them)."""
    forked, real = [], os.fork

    def fork():
        pid = real()
        if pid:
            forked.append(pid)
        return pid
    monkeypatch.setattr(os, "fork", fork)
    return forked


def use_implementation(name: str, monkeypatch) -> str:
    """Make Harmony run its compiled kernels by numba's JIT ("compiled"), or as built ahead of
    time where ``python -m harmony.precompile`` built them (else numba's JIT again) and split
    over 3 threads however small the input ("threads"), or its numpy code ("numpy"); skip the
    compiled ones without numba. A test that needs only some of them says so with
    ``@pytest.mark.parametrize(FIXTURE, [...], indirect=True)``: no copy is made to be skipped."""
    from harmony.core.jit import numba_version
    if name != "numpy" and numba_version() is None:
        host_skip("numba is not installed: only the numpy code runs")
    monkeypatch.setenv("HARMONY_JIT", "0" if name == "numpy" else "1")
    monkeypatch.setenv("HARMONY_AOT", "0" if name == "compiled" else "1")
    if name == "threads":
        monkeypatch.setenv("HARMONY_THREADS", "3")
        monkeypatch.setattr("harmony.core.jit.PARALLEL_MIN_ITEMS", 1)
    return name


@pytest.fixture
def no_figures(monkeypatch):
    """Runs draw no figures: they are not under test and cost most of the analysis time. (Every
    experiment class's plot is replaced, wherever get_experiment was imported, and so is the
    pipeline's drawing of a run's figures: its experiment's, causes.png and machine.png.) A
    batch's figures/reps.png is drawn unless the test asks finish_batch(figures=False)."""
    import harmony.experiments as ex
    from harmony import pipeline

    for name in ex.CATALOG:
        monkeypatch.setattr(type(ex.get_experiment(name)), "plot", lambda self, run, fig_dir: [])
    monkeypatch.setattr(pipeline, "_draw", lambda run, fig_dir=None: [])


# ---------------------------------------------------------------- the checkout under test

#: the packages setup.cfg maps (package_dir); every other harmony module lives in one of them
PACKAGES = ("harmony", "harmony.probes", "harmony.analysis", "harmony.experiments")


def foreign_harmony_modules(modules=None, root: Path = ROOT) -> list[str]:
    """"name (file)" of every ``harmony.*`` module in ``modules`` (default: ``sys.modules``)
    whose file is not under ``root``."""
    out = []
    for name, mod in sorted((sys.modules if modules is None else modules).items()):
        if name != "harmony" and not name.startswith("harmony."):
            continue
        files = [mod.__file__] if getattr(mod, "__file__", None) \
            else list(getattr(mod, "__path__", []))
        out += [f"{name} ({f})" for f in files if not Path(f).resolve().is_relative_to(root)]
    return out


def foreign_packages(root: Path = ROOT) -> list[str]:
    """"name (file)" of each of :data:`PACKAGES` that an import would take from outside ``root``,
    found without importing the subpackages (importing harmony.probes tunes malloc)."""
    out = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        where = spec.origin if spec and spec.origin else None
        if where is None or not Path(where).resolve().is_relative_to(root):
            out.append(f"{name} ({where})")
    return out


def _guard(when: str) -> None:
    foreign = foreign_packages() + foreign_harmony_modules()
    if foreign:
        raise pytest.UsageError(
            f"{when}: harmony modules come from outside the checkout under test ({ROOT}): "
            f"{', '.join(dict.fromkeys(foreign))}. Install this checkout "
            f"(pip install --no-deps -e {ROOT}) or run the tests of the clone installed.")


def pytest_sessionstart(session):
    _guard("before the tests")


def pytest_collection_finish(session):
    _guard("after importing the tests")
