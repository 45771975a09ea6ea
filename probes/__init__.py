"""Capture backends: each turns kernel sched tracepoints into the canonical events table.

Pick one by name; every backend implements :class:`harmony.probes.base.Probe`.
"""

from harmony.probes.base import Capture, Probe, ProbeError, TraceCorrupt

PROBES = {
    "tracefs": "harmony.probes.tracefs:TracefsProbe",
    "perf": "harmony.probes.perf:PerfProbe",
    "pyperf": "harmony.probes.pyperf:PyperfProbe",     # perf_event through python-perf
    "synthetic": "harmony.probes.synthetic:SyntheticProbe",  # replays `harmony simulate` runs
}


def get_probe(name: str) -> type[Probe]:
    """Return the probe class registered under ``name`` (``tracefs``, ``perf``, ``pyperf``)."""
    import importlib

    try:
        module, cls = PROBES[name].split(":")
    except KeyError:
        raise ProbeError(f"unknown probe {name!r}; choose one of {', '.join(PROBES)}") from None
    return getattr(importlib.import_module(module), cls)


__all__ = ["Capture", "Probe", "ProbeError", "TraceCorrupt", "get_probe", "PROBES"]
