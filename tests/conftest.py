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
