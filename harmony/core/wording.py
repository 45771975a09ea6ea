"""How Harmony words a count for the user: "1 run", "2 runs", never "2 run(s)".

Standard library only, no Harmony import: every room may use it, down to the modules the guest
agent and the workers import (:mod:`harmony.vm.topology`, :mod:`harmony.workload.cpuset`).
"""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """"1 run", "2 runs": a count that agrees with its noun (``nouns``, the plural when it is not
    ``noun`` + "s")."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
