"""The machine a run measured on, drawn: NUMA nodes, packages, last-level caches, cores and their
hardware threads as nested boxes (the run's CPUs filled), beside the run's migrations by level of
the machine and cause (:func:`harmony.analysis.topology.counts_by_level`).

Needs no events: the manifest's ``topology`` (:mod:`harmony.probes.domains`) and the migrations
table's ``level_name``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Rectangle

from harmony.analysis.plots import CAUSE_COLOURS, figure, save_figure
from harmony.analysis.topology import counts_by_level, df_cpus, domain_rows, domains_of
from harmony.core.osutil import parse_cpulist

#: the nesting drawn, outermost first, and each box's colour (face, edge)
NESTING = (("node", "#f4f6f7", "#7f8c8d"), ("package", "#eaf2f8", "#2e86c1"),
           ("llc", "#e9f7ef", "#229954"), ("core", "#fdf2e9", "#ca6f1e"))
PAD = 0.25


def _tree(cpus: pd.DataFrame) -> dict:
    """{node: {package: {llc: {core: [cpus]}}}} (a core by its lowest thread)."""
    tree: dict = {}
    for r in cpus.itertuples():
        core = parse_cpulist(r.smt_siblings)[0] if r.smt_siblings else int(r.cpu)
        tree.setdefault(r.node, {}).setdefault(r.package, {}).setdefault(r.llc, {}) \
            .setdefault(core, []).append(int(r.cpu))
    return tree


#: the margin around a core's threads
CORE_PAD = 0.1


def _size(group, depth: int) -> tuple[float, float]:
    """(width, height) of a group at ``depth`` of :data:`NESTING` (a core: its CPU list)."""
    if isinstance(group, list):
        return 1.0 + 2 * CORE_PAD, len(group) + 2 * CORE_PAD
    sizes = [_size(g, depth + 1) for g in group.values()]
    return (sum(w for w, _ in sizes) + PAD * (len(sizes) + 1),
            max(h for _, h in sizes) + 2 * PAD + 0.35)


def _draw(ax, group, depth: int, x: float, y: float, label: str, run_cpus: set[int]) -> None:
    """Draw ``group`` (at ``depth`` of :data:`NESTING`) with its lower-left corner at (x, y)."""
    w, h = _size(group, depth)
    _, face, edge = NESTING[depth]
    ax.add_patch(Rectangle((x, y), w, h, fc=face, ec=edge, lw=1.2))
    if isinstance(group, list):             # a core: its threads, stacked
        for k, cpu in enumerate(sorted(group, reverse=True)):      # the lowest on top
            mine = cpu in run_cpus
            ax.add_patch(Rectangle((x + CORE_PAD, y + CORE_PAD + k), 1, 1,
                                   fc="#c0392b" if mine else "white", ec="#34495e", lw=0.8))
            ax.text(x + CORE_PAD + 0.5, y + CORE_PAD + k + 0.5, str(cpu), ha="center",
                    va="center", fontsize=8, color="white" if mine else "#34495e")
        return
    ax.text(x + 0.08, y + h - 0.08, label, ha="left", va="top", fontsize=7, color=edge)
    cx = x + PAD
    for key, sub in sorted(group.items(), key=lambda kv: kv[0]):
        _draw(ax, sub, depth + 1, cx, y + PAD, _label(NESTING[depth + 1][0], key), run_cpus)
        cx += _size(sub, depth + 1)[0] + PAD


def _label(name: str, key) -> str:
    if name == "llc":
        return "LLC"
    return f"{name} {key}" if key != -1 else f"{name} ?"


@figure
def plot_machine(manifest: dict, migrations: pd.DataFrame | None, path: Path) -> Path:
    """The machine (nested boxes, the run's CPUs filled red) and, where the run read its domains,
    the window's migrations by level and cause as stacked bars."""
    cpus = df_cpus(manifest)
    tree = _tree(cpus)
    sizes = [_size(g, 0) for g in tree.values()]
    w = sum(s[0] for s in sizes) + PAD * (len(sizes) + 1)
    h = max((s[1] for s in sizes), default=1.0) + 2 * PAD
    levels = (counts_by_level(migrations, manifest.get("t0_ns", 0), manifest.get("end_ns", 0))
              if migrations is not None and domains_of(manifest) else {})
    fig, axes = plt.subplots(1, 2 if levels else 1, figsize=(10 if levels else 6, 3.4),
                             gridspec_kw={"width_ratios": [3, 2]} if levels else None)
    ax = axes[0] if levels else axes
    x = PAD
    run_cpus = set(manifest.get("cpus", []))
    for node, group in sorted(tree.items(), key=lambda kv: kv[0]):
        _draw(ax, group, 0, x, PAD, f"node {node}" if node >= 0 else "node ?", run_cpus)
        x += _size(group, 0)[0] + PAD
    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.set_aspect("equal")
    ax.axis("off")
    chain = " < ".join(r[1] for r in domain_rows(manifest))
    mine = len(run_cpus & set(int(c) for c in cpus["cpu"]))
    # what the boxes and colours are: a figure read alone, without this docstring
    ax.set_title(f"The machine: {len(cpus)} CPUs, the run's {mine} filled red; orange boxes: "
                 "cores;\n" + (f"domains {chain}" if chain else "its scheduling domains not read"),
                 fontsize=9)
    if levels:
        _plot_levels(axes[1], levels)
    return save_figure(fig, path)


def _plot_levels(ax, levels: dict) -> None:
    keys = list(levels)
    bottom = [0] * len(keys)
    for cause, colour in CAUSE_COLOURS.items():
        n = [levels[k].get(cause, 0) for k in keys]
        if any(n):
            ax.bar(keys, n, bottom=bottom, color=colour, label=cause)
            bottom = [b + v for b, v in zip(bottom, n)]
    ax.set_ylabel("migrations in the window", fontsize=8)
    ax.set_xlabel("level crossed (the lowest domain spanning both CPUs)", fontsize=8)
    ax.set_title("Migrations by level and cause", fontsize=9)
    if any(bottom):
        ax.legend(fontsize=7, loc="upper right")
