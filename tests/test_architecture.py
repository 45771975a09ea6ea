"""The code's layout is its architecture: data flows one way through the rooms docs/architecture.md
("Layout of the code") names, with no import cycle and no private name borrowed across modules.

A static scan of every import (at module level and inside functions alike) of the four packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the repository's directories and the packages they install as (setup.cfg's package_dir)
PACKAGES = {"harmony": "harmony", "probes": "harmony.probes", "experiments": "harmony.experiments",
            "analysis": "harmony.analysis"}

#: The rooms, in the order data flows through them: a module may import from its own room and the
#: rooms before it, never from a later one (docs/architecture.md). A name
#: ending in ".*" is a package prefix, any other name one module; a module is in the room that
#: names it most precisely (itself, else its longest prefix).
ROOMS = [
    ("foundations", ["harmony.core.*", "harmony.workload.tasks", "harmony.workload.serve",
                     "harmony.store", "harmony.manifest", "harmony.hostfacts"]),
    ("probes", ["harmony.probes.*"]),
    ("analysis", ["harmony.analysis.*"]),
    ("experiments", ["harmony.experiments.*"]),
    ("inference and reports", ["harmony.analysis.policy", "harmony.analysis.policy_levels",
                               "harmony.analysis.reference",
                               "harmony.analysis.server_card",
                               "harmony.analysis.compare", "harmony.analysis.report",
                               "harmony.analysis.report_suite"]),
    ("workload runtime", ["harmony.workload.*"]),
    ("kernels under test", ["harmony.vm.*"]),
    ("orchestration", ["harmony.*", "harmony.vm.agent", "harmony.vm.guest",
                       "harmony.vm.runner"]),
    ("entry points", ["harmony.cli", "harmony.cli.*", "harmony"]),   # the command, harmony.load
]


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) of every harmony import in the module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("harmony")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("harmony"):
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.append((sub, "", node.lineno) if sub in MODULES
                               else (target, a.name, node.lineno))
    return out


EDGES = {name: _imports(name, path) for name, path in MODULES.items()}


def _room(module: str) -> int:
    """The room of a module (see ROOMS)."""
    best, best_len = None, -1
    for k, (_, names) in enumerate(ROOMS):
        for name in names:
            if name.endswith(".*"):
                hit = module == name[:-2] or module.startswith(name[:-1])
                length = len(name) - 2
            else:
                hit, length = module == name, 1 << 16
            if hit and length > best_len:
                best, best_len = k, length
    return best


def test_every_module_is_scanned():
    assert {"harmony.pipeline", "harmony.probes.schema", "harmony.analysis.reconstruct",
            "harmony.experiments.base", "harmony.cli"} <= set(MODULES)


def test_no_import_cycle():
    graph = {m: {t for t, _, _ in EDGES[m] if t in MODULES and t != m} for m in MODULES}
    index, low, stack, on, cycles, n = {}, {}, [], set(), [], [0]

    def visit(v):       # Tarjan's strongly connected components
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_private_name_imported_across_modules():
    private = [f"{m}:{line} imports {t}.{what}" for m, edges in EDGES.items()
               for t, what, line in edges
               if what.startswith("_") and not what.startswith("__") and t != m]
    assert private == []


def test_data_flows_one_way_through_the_rooms():
    upstream = [f"{m}:{line} ({ROOMS[_room(m)][0]}) imports {t} ({ROOMS[_room(t)][0]})"
                for m, edges in EDGES.items() for t, _, line in edges
                if t in MODULES and _room(t) > _room(m)]
    assert upstream == []


@pytest.mark.parametrize("package", ["harmony.probes", "harmony.analysis",
                                     "harmony.experiments"])
def test_a_package_imports_no_orchestration(package):
    """The lower rooms never reach the modules that run them (pipeline, run, importer...)."""
    late = {m for m in MODULES if _room(m) >= _room("harmony.pipeline")}
    bad = [f"{m}:{line} imports {t}" for m, edges in EDGES.items() if m.startswith(package)
           for t, _, line in edges if t in late]
    assert bad == []


def test_every_module_is_named_in_the_architecture_page():
    """docs/architecture.md is the map a newcomer reads: a module it does not name is missing."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(m for m in MODULES if f"`{m}`" not in page)
    assert missing == [], f"add these modules to docs/architecture.md: {', '.join(missing)}"
