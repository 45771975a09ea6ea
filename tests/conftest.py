"""Shared fixtures: kernel tests skip with the reason where the host cannot trace."""

import os
from pathlib import Path

import pytest

TRACEFS = Path("/sys/kernel/tracing")


def kernel_skip_reason() -> str | None:
    """Why kernel tests cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "kernel tests need root"
    if not (TRACEFS / "events").is_dir():
        os.system("mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null")
        if not (TRACEFS / "events").is_dir():
            return "tracefs is not mounted and cannot be mounted"
    if not (TRACEFS / "events/sched/sched_switch").is_dir():
        return "the sched tracepoints are not available"
    return None


@pytest.fixture
def kernel():
    """Skip the test unless it can use the real kernel's tracefs as root."""
    reason = kernel_skip_reason()
    if reason:
        pytest.skip(reason)
    return TRACEFS


#: the implementations a compiled-or-numpy test runs under (see :func:`use_implementation`)
IMPLEMENTATIONS = ["compiled", "threads", "numpy"]


def use_implementation(name: str, monkeypatch) -> str:
    """Make Harmony run its compiled kernels ("compiled"), the same split over 3 threads however
    small the input ("threads"), or its numpy code ("numpy"); skip the compiled ones without
    numba."""
    from harmony.jit import numba_version
    if name != "numpy" and numba_version() is None:
        pytest.skip("numba is not installed: only the numpy code runs")
    monkeypatch.setenv("HARMONY_JIT", "0" if name == "numpy" else "1")
    if name == "threads":
        monkeypatch.setenv("HARMONY_THREADS", "3")
        monkeypatch.setattr("harmony.jit.PARALLEL_MIN_ITEMS", 1)
    return name


@pytest.fixture
def no_figures(monkeypatch):
    """Experiments draw no figures: they are not under test and cost most of the analysis time."""
    import harmony.experiments as ex

    real = ex.get_experiment

    def get(name):
        exp = real(name)
        exp.plot = lambda run, fig_dir: []
        return exp

    monkeypatch.setattr(ex, "get_experiment", get)
