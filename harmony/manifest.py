"""The manifest every run directory starts with, and what a reader takes from it.

:func:`new_manifest` starts every run's manifest.json (a run recorded here or in a virtual machine,
imported, simulated); :func:`reason` says why a run stopped; :func:`system_facts` reads what the
tasks ran on: the host, or the kernel under test in a virtual machine. Importing this module
loads no pandas (the guest agent, :mod:`harmony.vm.guest`, writes manifests in a virtual machine).
"""

from __future__ import annotations

import datetime
import functools
import platform
import sys

from harmony.core.version import __version__


def new_manifest(experiment, params: dict, cpus: list[int], probe: str, seed: int | None,
                 host: dict, status: str = "running", **facts) -> dict:
    """The manifest every run directory starts with; ``facts`` adds origin-specific keys
    (``controller_pid``, ``source``, ``simulated``...)."""
    return {
        "harmony_version": __version__,
        "experiment": experiment.name,
        "question": experiment.question,
        "params": params,
        "cpus": list(cpus),
        "probe": probe,
        "seed": seed,
        "status": status,
        "started_at": now(),
        **facts,
        "host": host,
        "versions": versions(),
    }


def versions() -> dict:
    """The manifest's ``versions``: Python's, and pandas' and numpy's as installed, read without
    importing them. None for both in a process without site directories (``python -S``: the
    guest agent, which imports neither; the host puts its own in a VM run's manifest as it lands
    the run, the same installation): looking would cost the agent ~1 s of each boot under TCG
    (importlib.metadata walking the path over 9p) for nothing."""
    if sys.flags.no_site:
        return {"python": platform.python_version(), "pandas": None, "numpy": None}
    return {"python": platform.python_version(), "pandas": _version("pandas"),
            "numpy": _version("numpy")}


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str | None:
    """An installed package's version, looked up once a process (the lookup walks every site
    directory: ~30 ms a package in a TCG guest over 9p, for every run of a boot)."""
    from importlib import metadata      # here: 0.6 s of the VM agent's start (TCG, 9p)

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def now() -> str:
    """The time stamps of a manifest (UTC, to the second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def reason(exc: BaseException) -> str:
    """Why a run stopped, for its manifest's incomplete_reason."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def system_facts(manifest: dict) -> dict:
    """The facts of the system a run's tasks ran on (kernel, scheduler, ncpus, ...): the kernel
    under test where the run was captured in a virtual machine (``manifest["under_test"]``), else
    the host (``manifest["host"]``)."""
    return manifest.get("under_test") or manifest.get("host") or {}
