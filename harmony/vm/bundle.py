"""The guest agent's modules in one file: every Harmony module and the standard library's the
agent imports, compiled, in a zip the guest copies into its own memory before its Python starts
(:func:`write_bundle`, :func:`guest_command`).

Under TCG an import is slow twice over: the interpreter is emulated, and every module is looked
for and read over 9p (a stat per directory and suffix tried, an open, a read: each a round trip
to the host). In a 4-vCPU TCG guest (bench/README.md, 2026-12-04): ``import harmony.vm.guest``
took 3.3 s from the shared tree (4.5 s the first time in a boot), **1.5 s** from this bundle in
the guest's /tmp, copied there in 0.4 s. Read from the share itself a zip is slower still
(11.6 s: zipimport opens the archive again for each module), hence the copy.

The agent and the fork server it starts (:func:`harmony.core.osutil.harmony_python` passes the
bundle on as the directory holding Harmony) find Harmony there; a standard module the bundle
lacks comes from its usual directory behind it, as before. A bundle that cannot be made leaves
the agent on the shared tree: slower, nothing else.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import marshal
import os
import shlex
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

#: what the guest runs: the agent, the fork server it starts, the workers and servers it forks
ENTRY_MODULES = ("harmony.vm.agent", "harmony.vm.guest", "harmony.workload.forkserver",
                 "harmony.workload.serve", "harmony.workload.worker", "harmony.run")
#: the bundle's name in the job directory, and where the guest copies it
NAME = "harmony-agent.zip"
GUEST_COPY = f"/tmp/{NAME}"


def _package_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the harmony package (probes, analysis and
    experiments included, wherever they sit: beside harmony/ in a source tree)."""
    out: dict[str, Path] = {}
    # harmony/ (this file's grandparent) with its own subpackages; the three beside it in a
    # source tree apart
    todo = [("harmony", Path(__file__).resolve().parents[1])]
    for sub in ("probes", "analysis", "experiments"):
        spec = importlib.util.find_spec(f"harmony.{sub}")
        if spec is not None and spec.submodule_search_locations:
            todo.append((f"harmony.{sub}", Path(list(spec.submodule_search_locations)[0])))
    for name, where in todo:
        out.update(_tree(name, where))
    return out


def _imported() -> tuple[dict[str, Path], set[str]]:
    """(module name -> source file of the pure-Python standard modules the guest's entry points
    import, each package among them whole; the names of the modules they import, Harmony's
    too), as a child started as the agent is (``-S -P``) lists them."""
    from harmony.core.osutil import harmony_python

    argv, env = harmony_python("harmony.vm.bundle", "--list-imports", site=False)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    said = json.loads(out.stdout)
    stdlib = {k: Path(v) for k, v in said["stdlib"].items()}
    for name, init in list(stdlib.items()):
        if init.name == "__init__.py":  # a package in the bundle is whole (its __path__ is there)
            stdlib.update(_tree(name, init.parent))
    return stdlib, set(said["stdlib"]) | set(said["harmony"])


#: a standard package's subdirectories left out of the bundle: its tests (never imported)
TESTS = ("test", "tests", "idle_test")


def _tree(name: str, where: Path) -> dict[str, Path]:
    """Module name -> source file of every module of the package ``name`` at ``where``."""
    out = {}
    for entry in sorted(where.iterdir()):
        if entry.suffix == ".py":
            out[name if entry.stem == "__init__" else f"{name}.{entry.stem}"] = entry
        elif (entry / "__init__.py").is_file() and entry.name not in TESTS:
            out.update(_tree(f"{name}.{entry.name}", entry))
    return out


def _code_bytes(source: Path) -> bytes:
    """The module's bytecode as a .pyc holds it: the one Python cached beside the source where
    it is current (install.sh writes them), else compiled now."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    try:
        data = cached.read_bytes()
        st = source.stat()
        flags = int.from_bytes(data[4:8], "little")
        if (data[:4] == importlib.util.MAGIC_NUMBER and flags == 0
                and int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF):
            return data
    except OSError:
        pass
    code = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


@functools.lru_cache(maxsize=1)
def _built() -> bytes:
    """The bundle's bytes, made once a process (a suite boots several times)."""
    stdlib, imported = _imported()
    files = {**stdlib, **_package_files()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, source in sorted(files.items()):
            init = source.name == "__init__.py"
            # what the agent imports is read as it is; the rest (Harmony's analysis and CLI, the
            # other modules of a package it imports: there for a lazy import) compressed
            how = zipfile.ZIP_STORED if name in imported else zipfile.ZIP_DEFLATED
            z.writestr(name.replace(".", "/") + ("/__init__.pyc" if init else ".pyc"),
                       _code_bytes(source), compress_type=how)
    return buf.getvalue()


def write_bundle(job_dir: Path) -> Path | None:
    """The bundle in ``job_dir``; None where it cannot be made (the agent then imports from the
    shared tree, as it did before)."""
    try:
        data = _built()
    except (OSError, SyntaxError, ValueError, subprocess.SubprocessError):
        return None
    path = Path(job_dir) / NAME
    path.write_bytes(data)
    return path


def guest_command(bundle: Path | None, env: list[str], argv: list[str],
                  dest: str | Path = GUEST_COPY) -> list[str]:
    """The guest's command running ``argv`` with ``env`` (``NAME=value`` items): the bundle
    copied to ``dest`` first (the guest's /tmp: its memory) and leading its PYTHONPATH; without
    a bundle, or should the copy fail, the shared tree alone, as before."""
    if bundle is None:
        return ["env", *env, *argv]
    dest = str(dest)
    env = [f"PYTHONPATH={dest}{os.pathsep}{e.partition('=')[2]}"
           if e.startswith("PYTHONPATH=") else e for e in env]
    if not any(e.startswith("PYTHONPATH=") for e in env):
        env.append(f"PYTHONPATH={dest}")
    run = shlex.join(["env", *env, *argv])
    copy, gone = shlex.join(["cp", str(bundle), dest]), shlex.join(["rm", "-f", dest])
    return ["sh", "-c", f"{copy} 2>/dev/null || {gone}; exec {run}"]


def _list_imports() -> dict:
    """In a child started as the agent: {"stdlib": {name: file} of the standard library's
    pure-Python modules the entry points import, "harmony": [names of Harmony's]}."""
    for name in ENTRY_MODULES:
        __import__(name)
    paths = sysconfig.get_paths()
    stdlib = os.path.realpath(paths["stdlib"]) + os.sep
    sites = tuple(os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib"))
    out = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        real = os.path.realpath(f) if f and f.endswith(".py") else ""
        if real.startswith(stdlib) and not real.startswith(sites) and name != "__main__":
            out[name] = f
    return {"stdlib": out, "harmony": sorted(m for m in sys.modules if m.startswith("harmony."))}


if __name__ == "__main__" and sys.argv[1:] == ["--list-imports"]:
    print(json.dumps(_list_imports()))
