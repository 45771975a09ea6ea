"""Runs under a reference policy: the simulator's recording stored and analysed as any capture.

:mod:`harmony.analysis.refpolicy` simulates the catalog's own workloads under a policy whose
answers are known; here each simulation becomes a run directory -- manifest, tasks.parquet, and
``raw/synthetic/`` (events.parquet, markers.parquet, meta.json: the synthetic probe decodes them
again) -- and goes through :mod:`harmony.pipeline` like a recorded run (``harmony simulate``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harmony import pipeline, store
from harmony.analysis.machines import flat_topology
from harmony.analysis.refpolicy import TICK_NS, Policy, get_policy, refuse_classes
from harmony.analysis.refpolicy_domains import simulator_for
from harmony.core.errors import ParameterError
from harmony.experiments import get_experiment
from harmony.probes import Capture
from harmony.probes.schema import MARK_END, MARK_RELEASED, MARK_T0
from harmony.workload.tasks import sched_classes, tasks_frame

PROBE = "synthetic"


def capture(policy: Policy, exp, params: dict, cpus: list[int], out: Path,
            seed: int = 0, topology: dict | None = None) -> tuple[Capture, pd.DataFrame, dict]:
    """Simulate one run of ``exp`` under ``policy`` and store it as a captured run in ``out``.

    Mirrors :func:`harmony.run.capture`: the experiment's random choices (``exp.draw``) are merged
    into the parameters first. Writes manifest.json (status "captured", probe "synthetic"),
    tasks.parquet and raw/synthetic/{events,markers}.parquet + meta.json. Returns the capture, the
    tasks table and the manifest. ``topology``: the machine (the contract's
    ``manifest["topology"]``, :mod:`harmony.analysis.machines`) the CPU set is part of; without
    one, a machine of one LLC as large as the set's highest CPU number + 1. The manifest records
    it as a recorded run records the machine it ran on.
    """
    out = Path(out)
    store.make_run_dir(out)
    params = {**params, **exp.draw(params, cpus, seed)}
    specs = exp.tasks(params, cpus)
    topology = topology or flat_topology(max(cpus) + 1)
    sim = simulator_for(policy)(policy, specs, cpus, params["duration"], seed, topology)
    events, markers = sim.run()
    raw = out / "raw" / PROBE
    raw.mkdir(parents=True, exist_ok=True)
    store.write_table(raw, "events", events)
    store.write_table(raw, "markers", markers)
    meta = {"probe": PROBE, "clock": "simulated",
            "events_enabled": sorted(set(events["event"].astype(str))),
            "lost_events": 0, "lost_by_cpu": {}, "bytes": 0, "n_events": int(len(events)),
            "notes": [f"simulated by reference policy {policy.name}: {policy.summary}"]}
    store.write_json(raw / "meta.json", meta)
    tasks = tasks_frame(specs, [t.pid for t in sim.tasks])
    store.write_table(out, "tasks", tasks)
    manifest = pipeline.new_manifest(
        exp, params, cpus, PROBE, seed, status="captured",
        host={"kernel": "simulated", "scheduler": f"reference policy {policy.name}",
              "ncpus": len(cpus), "hz": 1000},
        simulated={"policy": policy.name, "summary": policy.summary, "tick_ms": TICK_NS / 1e6,
                   "drawn": sim.p.name},
        sched_classes=sched_classes(specs), topology=topology,
        workers_alive_at_end=sum(t.state != "X" for t in sim.tasks),
        work_done=[0] * len(specs))
    manifest["ended_at"] = manifest["started_at"]
    store.write_json(out / "manifest.json", manifest)
    return Capture(events=events, markers=markers, meta=meta), tasks, manifest


def execute(policy: Policy, exp, params: dict, cpus: list[int], out: Path, seed: int = 0,
            figures: bool = True, topology: dict | None = None) -> store.Run:
    """Simulate then analyse one run, companions first (as :func:`harmony.run.execute` does),
    on the machine ``topology`` (see :func:`capture`)."""
    for name, overrides in exp.companions(params).items():
        companion_params = exp.resolve({**params, **overrides}, cpus)
        _analyse(Path(out) / name, *capture(policy, exp, companion_params, cpus, Path(out) / name,
                                            seed, topology), figures)
    return _analyse(Path(out), *capture(policy, exp, params, cpus, out, seed, topology), figures)


def _analyse(out: Path, cap: Capture, tasks, manifest: dict, figures: bool) -> store.Run:
    """The pipeline on the simulation just stored, from memory (as the synthetic probe would
    decode it from raw/synthetic/)."""
    at = {text: int(ts) for ts, text in zip(cap.markers["ts"], cap.markers["text"])}
    window = pipeline.Window(at[MARK_T0], at[MARK_END], at.get(MARK_RELEASED))
    return pipeline.analyse_capture(out, manifest, cap, tasks, window,
                                    pipeline.Origin("simulated"), figures=figures)


def simulate_run(policy: Policy | str, experiment: str, cpus: int | list[int], out: Path,
                 overrides: dict | None = None, seed: int = 0) -> store.Run:
    """Simulate and analyse one run; returns the :class:`harmony.store.Run`."""
    policy = get_policy(policy) if isinstance(policy, str) else policy
    cpu_list = list(range(cpus)) if isinstance(cpus, int) else list(cpus)
    exp = get_experiment(experiment)
    if exp.not_simulated:
        raise ParameterError(f"{experiment} cannot be simulated: {exp.not_simulated}")
    params = exp.resolve(dict(overrides or {}), cpu_list)
    refuse_classes(params=params)
    return execute(policy, exp, params, cpu_list, out, seed)
