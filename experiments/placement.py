"""Experiments placed by level: where the source and target CPUs sit relative to each other.

Every experiment of the catalog takes ``level`` (:data:`harmony.experiments.base.COMMON`): empty,
the CPU set as given; else one of :data:`LEVELS`, the relation of the source and the target CPU
(:func:`harmony.analysis.topology.relation`). Resolved against the machine's topology (the
contract's ``manifest["topology"]``: the host's, a guest's, or a synthetic machine's), it makes
the run's CPU set the pair [source, target] (:func:`placed_cpus`): the experiment's tasks may then
run on those two CPUs only, so that only the domain level at which the target's domains first span
the source can move them between the two -- the question is answered at that level. A machine
(or CPU set) without such a pair is refused in one line.

The pair is the lowest CPU of the set that has a partner at that relation, and its lowest such
partner: the same pair for every run of a level on one machine.
"""

from __future__ import annotations

from harmony.analysis.levels import relation_table
from harmony.analysis.topology import RELATIONS, df_cpus

#: the levels an experiment can be placed at (the relations but "same"), nearest first, each with
#: what it means
LEVELS = {
    "smt": "SMT siblings (two threads of one core)",
    "llc": "two cores sharing a last-level cache",
    "package": "two LLCs of one package",
    "node": "two packages of one NUMA node",
    "remote": "two NUMA nodes",
}
assert tuple(LEVELS) == RELATIONS[1:]


def level_word(v) -> str | None:
    """The ``level`` parameter's check: empty, or one of :data:`LEVELS`."""
    return None if v in ("", *LEVELS) else f"must be empty or one of {', '.join(LEVELS)}"


def level_pair(level: str, cpus: list[int], topology: dict) -> list[int]:
    """[source, target]: two CPUs of ``cpus`` at relation ``level`` on the machine
    ``topology``; ValueError (one line) naming what the machine lacks."""
    if level not in LEVELS:
        raise ValueError(f"level={level}: {level_word(level)}")
    if not (topology or {}).get("cpus"):
        raise ValueError(f"level={level} needs the machine's topology, and there is none "
                         "(a run recorded without it, or a kernel that does not show it)")
    known = set(df_cpus({"topology": topology})["cpu"])
    outside = sorted(set(cpus) - known)
    if outside:
        raise ValueError(f"level={level}: CPUs {outside} are not in the machine's topology")
    pairs = relation_table(cpus, {"topology": topology})
    found = sorted(pair for pair, rel in pairs.items() if rel == level)
    if found:
        return list(found[0])
    present = levels_present(cpus, topology)
    raise ValueError(f"level={level}: this machine has no {LEVELS[level]} in CPUs "
                     f"{_cpulist(cpus)} (it has: {', '.join(present) or 'no pair at all'})")


def levels_present(cpus: list[int], topology: dict) -> list[str]:
    """The levels (:data:`LEVELS`) at which ``cpus`` hold a pair, nearest first."""
    found = set(relation_table(cpus, {"topology": topology}).values())
    return [lv for lv in LEVELS if lv in found]


def placed_cpus(level: str, cpus: list[int], topology: dict | None) -> list[int]:
    """The run's CPU set for ``level``: ``cpus`` as they are when it is empty, else the pair
    (:func:`level_pair`)."""
    return list(cpus) if not level else level_pair(level, cpus, topology or {})


def check_placed(level: str, cpus: list[int]) -> None:
    """An experiment placed at a level runs on the pair its level resolved to: ValueError (one
    line) for a placement that was not resolved (a CPU set of more than two)."""
    if level and len(cpus) != 2:
        raise ValueError(f"level={level} places the experiment on two CPUs of the machine's "
                         f"topology; the CPU set {_cpulist(cpus)} was not resolved to a pair "
                         "(harmony run/simulate --level, or the suite on a topology, do that)")


def _cpulist(cpus) -> str:
    from harmony.core.osutil import format_cpulist

    return format_cpulist(sorted(cpus))
