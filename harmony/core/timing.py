"""Where a run's wall time goes: consecutive steps timed into the manifest (``timings_s``)."""

from __future__ import annotations

import time


class Laps:
    """Wall seconds of consecutive steps: ``laps("spawn")`` ends the step begun by the previous call
    (or by construction) and records it under that name, adding up if a name repeats."""

    def __init__(self):
        self.steps: dict[str, float] = {}
        self._since = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.steps[step] = round(self.steps.get(step, 0.0) + now - self._since, 4)
        self._since = now

    def skip(self) -> None:
        """Begin the next step now: the time since the last call is recorded under no step (it
        was another's: a step timed apart, meanwhile)."""
        self._since = time.monotonic()
