"""The kernel's python-perf binding (``perf`` module of tools/perf/util/python.c), found and loaded
without putting a whole system directory on ``sys.path``.

Debian's ``linux-perf`` package ships it as ``/usr/lib/python3/dist-packages/perf.cpython-311-
x86_64-linux-gnu.so``: a C extension built for one CPython ABI, loadable by any interpreter of
that ABI (pyenv's CPython 3.11 as well as Debian's own), and by no other. Putting
``/usr/lib/python3/dist-packages`` on ``sys.path`` to import it would also shadow Harmony's own
libraries with Debian's (numpy, ...): instead the one file is loaded with
:class:`importlib.machinery.ExtensionFileLoader` (:func:`load`), and never entered in
``sys.modules`` (a user's own module named ``perf`` is left alone).

Where it is looked for, in order (:func:`candidates`):

1. ``HARMONY_PYTHON_PERF=FILE``: that file and no other (an expert option: a binding built by
   hand, or a test of what ``harmony doctor`` says of a bad one);
2. the file lists of the installed packages that ship it: dpkg's
   ``/var/lib/dpkg/info/<package>.list`` of ``linux-perf``, ``linux-perf-<version>`` and
   ``python3-perf`` (Debian, Ubuntu), the lines naming ``perf.*.so``;
3. the directories such packages install into: ``/usr/lib/python3/dist-packages``,
   ``/usr/lib/python3*/site-packages``, ``/usr/lib64/python3*/site-packages`` (Fedora's
   ``python3-perf``), ``/usr/local/lib/python3*/{dist,site}-packages``.

Why it may not load, each said in one line by :func:`find` (``harmony doctor``'s ``pyperf``
check): no binding installed (no linux-perf); one built for another Python ABI than this
interpreter's (its file name's tag, e.g. ``cpython-311``, is none of
:data:`importlib.machinery.EXTENSION_SUFFIXES`); one whose import fails (the error's text, e.g. a
missing ``libtraceevent``); a module that is not the kernel's binding (no ``evlist``).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ENV_PATH = "HARMONY_PYTHON_PERF"
DPKG_INFO = Path("/var/lib/dpkg/info")
#: packages whose file list may name the binding (dpkg names; ``linux-perf-5.10`` and the like
#: are matched by the prefix)
PACKAGES = ("linux-perf", "python3-perf")
#: directories searched after the packages' file lists (globs)
SEARCH_DIRS = ("/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
               "/usr/lib64/python3*/site-packages", "/usr/local/lib/python3*/dist-packages",
               "/usr/local/lib/python3*/site-packages")
#: what the module must offer to be the kernel's binding
API = ("evlist", "evsel", "cpu_map", "thread_map", "tracepoint")
_NAME = re.compile(r"perf(\..+)?\.so$")


@dataclasses.dataclass
class Binding:
    """What :func:`find` found: the module (None if it did not load), where, and why not."""

    module: object | None
    path: str | None
    package: str | None           # "linux-perf 6.1.187-1", the package whose list names it
    abi: str | None               # the file name's ABI tag, e.g. "cpython-311-x86_64-linux-gnu"
    why_not: str | None           # one line; None if the module loaded
    tried: list[str]              # every candidate file seen, in the order of the search

    @property
    def loaded(self) -> bool:
        return self.module is not None

    def facts(self) -> dict:
        """JSON facts for a manifest or ``harmony doctor``."""
        return {"present": self.path is not None, "loaded": self.loaded, "path": self.path,
                "package": self.package, "abi": self.abi, "python": python_abi(),
                "why_not": self.why_not, "candidates": self.tried}


def python_abi() -> str:
    """This interpreter's extension-module tag, e.g. ``cpython-311-x86_64-linux-gnu``."""
    tagged = [s for s in importlib.machinery.EXTENSION_SUFFIXES if s.count(".") == 2]
    return tagged[0].strip(".").removesuffix(".so") if tagged else sys.implementation.cache_tag


def abi_tag(path: str) -> str | None:
    """The ABI tag of an extension file name (``perf.cpython-311-x86_64-linux-gnu.so`` ->
    ``cpython-311-x86_64-linux-gnu``); None for an untagged ``perf.so``."""
    m = _NAME.search(os.path.basename(path))
    return m.group(1).strip(".") if m and m.group(1) else None


def _from_packages(info: Path = DPKG_INFO) -> list[tuple[str, str]]:
    """(file, package) for every ``perf*.so`` the listed packages' file lists name."""
    out = []
    try:
        lists = sorted(p for p in info.glob("*.list")
                       if p.stem.split(":")[0].startswith(PACKAGES))
    except OSError:
        return out
    for lst in lists:
        try:
            lines = lst.read_text(errors="replace").splitlines()
        except OSError:
            continue
        out += [(ln.strip(), lst.stem.split(":")[0]) for ln in lines
                if _NAME.search(os.path.basename(ln.strip()))]
    return out


def candidates(info: Path = DPKG_INFO, dirs=SEARCH_DIRS) -> list[tuple[str, str | None]]:
    """(file, package or None) of every binding file found, in the search order of the module
    docstring (duplicates removed); with ``HARMONY_PYTHON_PERF`` set, that file only."""
    if os.environ.get(ENV_PATH):
        path = os.environ[ENV_PATH]
        return [(path, None)] if os.path.isfile(path) else []
    seen, out = set(), []
    found = _from_packages(info)
    for d in dirs:
        found += [(f, None) for f in sorted(glob.glob(os.path.join(d, "perf*.so")))
                  if _NAME.search(os.path.basename(f))]
    for path, pkg in found:
        if path not in seen and os.path.isfile(path):
            seen.add(path)
            out.append((path, pkg))
    return out


def _package_version(pkg: str | None) -> str | None:
    if not pkg:
        return None
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return pkg
    return f"{pkg} {r.stdout.strip()}" if r.returncode == 0 and r.stdout.strip() else pkg


def _matches_this_python(path: str) -> bool:
    """Whether the file's ABI tag is this interpreter's (a file without one: left to its import)."""
    tag = abi_tag(path)
    return tag is None or any(s == f".{tag}.so" for s in importlib.machinery.EXTENSION_SUFFIXES)


def load_file(path: str):
    """Load the extension module ``perf`` from ``path`` (not entered in sys.modules); the error of
    its import as ImportError."""
    loader = importlib.machinery.ExtensionFileLoader("perf", path)
    spec = importlib.util.spec_from_file_location("perf", path, loader=loader)
    if spec is None:
        raise ImportError(f"{path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


#: the answers of :func:`find`, by the value of HARMONY_PYTHON_PERF they were given under
_found: dict[str | None, Binding] = {}


def find(refresh: bool = False) -> Binding:
    """The binding this interpreter can load, or why there is none (see the module docstring).
    The answer is kept (a C extension loads once per process), unless ``refresh``."""
    key = os.environ.get(ENV_PATH) or None
    if key not in _found or refresh:
        _found[key] = _search()
    return _found[key]


def _search() -> Binding:
    files = candidates()
    tried = [f for f, _ in files]
    if not files:
        where = (f"{ENV_PATH}={os.environ[ENV_PATH]} is no file" if os.environ.get(ENV_PATH) else
                 "no linux-perf or python3-perf package lists one, none in "
                 + ", ".join(SEARCH_DIRS[:1]) + " and the like")
        return Binding(None, None, None, None, f"no python-perf binding installed ({where}; "
                       "Debian: apt install linux-perf)", tried)
    usable = [(f, p) for f, p in files if _matches_this_python(f)]
    if not usable:
        f, p = files[0]
        return Binding(None, f, _package_version(p), abi_tag(f),
                       f"{f} is built for another Python ABI ({abi_tag(f) or 'untagged'}) than "
                       f"this Harmony's CPython {sys.version.split()[0]} ({python_abi()})", tried)
    errors = []
    for f, p in usable:
        try:
            module = load_file(f)
        except (ImportError, OSError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            errors.append((f, p, f"{f}: import failed: {text}"))
            continue
        lacking = [name for name in API if not hasattr(module, name)]
        if lacking:
            errors.append((f, p, f"{f}: not the kernel's perf binding (it has no "
                                 f"{', '.join(lacking)})"))
            continue
        return Binding(module, f, _package_version(p), abi_tag(f), None, tried)
    f, p, why = errors[0]
    return Binding(None, f, _package_version(p), abi_tag(f), why, tried)


__all__ = ["Binding", "ENV_PATH", "abi_tag", "candidates", "find", "load_file", "python_abi"]
