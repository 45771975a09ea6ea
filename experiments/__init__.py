"""The experiment catalog as code. ``get_experiment(name)`` returns an instance; ``CATALOG`` lists
them; ``summary_key(key, *names)`` is how other modules name a key of the experiments' summaries."""

from __future__ import annotations

import importlib

from harmony.experiments.base import Experiment, Metric, Param

CATALOG = {
    "single-source": "harmony.experiments.single_source:SingleSource",
    "how-many": "harmony.experiments.how_many:HowMany",
    "time-to-resolve": "harmony.experiments.time_to_resolve:TimeToResolve",
    "work-conservation": "harmony.experiments.work_conservation:WorkConservation",
    "detection": "harmony.experiments.detection:Detection",
    "intrinsic-imbalance": "harmony.experiments.intrinsic_imbalance:IntrinsicImbalance",
    "heavy-light": "harmony.experiments.heavy_light:HeavyLight",
    "priority-classes": "harmony.experiments.priority_classes:PriorityClasses",
    "proportional": "harmony.experiments.proportional:Proportional",
    "server": "harmony.experiments.server:Server",
    "spread": "harmony.experiments.spread:Spread",
}


def get_experiment(name: str) -> Experiment:
    try:
        module, cls = CATALOG[name].split(":")
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; "
                         f"the catalog has: {', '.join(CATALOG)}") from None
    return getattr(importlib.import_module(module), cls)()


def experiment_of(run) -> Experiment:
    """The experiment of ``run`` (a :class:`harmony.store.Run`), by its manifest; RunError naming
    the manifest if it names none, or none of this catalog's (a run of another Harmony)."""
    from harmony.store import RunError

    name = run.manifest.get("experiment")
    if not isinstance(name, str):
        raise RunError(f"{run.path / 'manifest.json'}: corrupt: no 'experiment'")
    if name not in CATALOG:
        raise RunError(f"{run.path / 'manifest.json'}: unknown experiment {name!r} (this "
                       f"Harmony's catalog has: {', '.join(CATALOG)})")
    return get_experiment(name)


def summary_key(key: str, *experiments: str) -> str:
    """``key``, checked to be declared (:attr:`Experiment.declared`) by each of ``experiments``;
    ValueError naming the experiment otherwise.

    Modules that read summaries (the policy card, ``harmony compare``) name each key through this
    at import, so that a key an experiment renames or drops fails there instead of reading as None.
    """
    if not experiments:
        raise ValueError(f"summary key {key!r}: name the experiment(s) that declare it")
    for name in experiments:
        declared = [m.name for m in get_experiment(name).declared]
        if key not in declared:
            raise ValueError(f"{name} declares no summary key {key!r} "
                             f"(it declares: {', '.join(declared)})")
    return key


__all__ = ["CATALOG", "Experiment", "Metric", "Param", "get_experiment", "summary_key"]
