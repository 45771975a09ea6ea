"""The experiment catalog as code. ``get_experiment(name)`` returns an instance; ``CATALOG`` lists them."""

from __future__ import annotations

import importlib

from harmony.experiments.base import Experiment, Param

CATALOG = {
    "single-source": "harmony.experiments.single_source:SingleSource",
}


def get_experiment(name: str) -> Experiment:
    try:
        module, cls = CATALOG[name].split(":")
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; the catalog has: {', '.join(CATALOG)}") from None
    return getattr(importlib.import_module(module), cls)()


__all__ = ["CATALOG", "Experiment", "Param", "get_experiment"]
