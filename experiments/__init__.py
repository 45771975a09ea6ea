"""The experiment catalog as code. ``get_experiment(name)`` returns an instance; ``CATALOG`` lists them."""

from __future__ import annotations

import importlib

from harmony.experiments.base import Experiment, Param

CATALOG = {
    "single-source": "harmony.experiments.single_source:SingleSource",
    "how-many": "harmony.experiments.how_many:HowMany",
    "time-to-resolve": "harmony.experiments.time_to_resolve:TimeToResolve",
    "work-conservation": "harmony.experiments.work_conservation:WorkConservation",
    "detection": "harmony.experiments.detection:Detection",
    "intrinsic-imbalance": "harmony.experiments.intrinsic_imbalance:IntrinsicImbalance",
    "heavy-light": "harmony.experiments.heavy_light:HeavyLight",
    "priority-classes": "harmony.experiments.priority_classes:PriorityClasses",
}


def get_experiment(name: str) -> Experiment:
    try:
        module, cls = CATALOG[name].split(":")
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; the catalog has: {', '.join(CATALOG)}") from None
    return getattr(importlib.import_module(module), cls)()


__all__ = ["CATALOG", "Experiment", "Param", "get_experiment"]
