"""Harmony's compiled kernels: written once in numba's subset of Python, run compiled ahead of
time where ``python -m harmony.precompile`` built them, else compiled by numba's JIT.

A kernel module (:data:`KERNEL_MODULES`) decorates its functions with :func:`kernel` (called from
Python or from other kernels; compiled ``nogil``, so that :func:`harmony.core.jit.run_split`'s
threads run at once) or :func:`inline` (a helper compiled into each kernel calling it). Neither
decorator imports numba: a :class:`Kernel` is a plain object until it is first called, and then

- **ahead of time**: if :mod:`harmony.precompile` built the kernels into an extension module for
  these very sources (its key: the kernel modules' bytes, Python's, numpy's and numba's versions,
  the CPU), the call goes to the export whose argument types match the arguments as numba types
  them (an array's dtype, dimensions, C order and writability; a scalar's type). Loading that
  extension takes ~1 ms and ~1 MB: no LLVM, no numba in the process (numba's runtime with its
  cached kernels takes ~0.4 s and ~110 MB in every process that decodes a large trace);
- **JIT**: where no extension is built (a plain ``pip install .``, a C compiler missing,
  ``HARMONY_AOT=0``), or none of its exports matches the arguments, numba compiles the kernel as
  ``numba.njit`` would have (cached next to its source), the module's kernels and helpers with
  it. A call that matched no export is counted (:func:`fallbacks`): the tests require none on the
  import's paths.

Both run the same source and give the same results (the tests run the pipeline both ways and
compare the tables).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import threading
import types
from pathlib import Path

#: the modules whose functions are kernels (:func:`kernel`, :func:`inline`)
KERNEL_MODULES = ("harmony.probes.ringbuf_jit", "harmony.analysis.taskstate_jit",
                  "harmony.analysis.reconstruct_jit", "harmony.analysis.causes_jit",
                  "harmony.analysis.checks_jit", "harmony.analysis.cost_jit",
                  "harmony.analysis.ties_jit",
                  "harmony.importer_jit", "harmony.probes.perf_read_jit",
                  "harmony.analysis.plots_jit")

#: the extension module's name (its ``PyInit_`` symbol) and its exports' description
EXTENSION = "_harmony_kernels"
EXPORTS_FILE = "exports.json"
#: changes whenever the extension's layout or the exports' description does
FORMAT = 1

#: numba's options for each kind of function (what ``numba.njit`` was given before)
JIT_OPTIONS = {"kernel": {"cache": True, "nogil": True, "boundscheck": False},
               "inline": {"inline": "always", "boundscheck": False}}

_lock = threading.RLock()
#: module name -> its kernels and helpers, in the order they are defined
_registry: dict[str, list[Kernel]] = {}
#: "module.kernel" -> calls that matched no ahead-of-time export (numba's JIT ran them)
_fallbacks: dict[str, int] = {}


@functools.lru_cache(maxsize=1)
def numba_version() -> str | None:
    """numba's version if it is installed (without importing it), else None."""
    if importlib.util.find_spec("numba") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("numba")
    except PackageNotFoundError:
        return "?"


class Kernel:
    """A function of a kernel module: called, it runs ahead-of-time compiled code or numba's
    (see the module's docstring). ``py_func`` is the Python source function."""

    def __init__(self, fn, kind: str):
        self.py_func = fn
        self.kind = kind
        self.module = fn.__module__
        self.name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._exports = None        # [(checks, function)] once looked up
        self._jit = None            # numba's dispatcher once made
        _registry.setdefault(self.module, []).append(self)

    def __repr__(self) -> str:
        return f"<kernel {self.module}.{self.name}>"

    def __call__(self, *args):
        if aot_enabled():
            exports = self._exports
            if exports is None:
                exports = self._exports = aot_exports().get(f"{self.module}.{self.name}", ())
            for checks, fn in exports:
                if _matches(checks, args):
                    return fn(*args)
            if _aot_state.get("exports"):     # built, but not for these arguments
                with _lock:
                    key = f"{self.module}.{self.name}"
                    _fallbacks[key] = _fallbacks.get(key, 0) + 1
        return self.dispatcher()(*args)

    def dispatcher(self):
        """numba's dispatcher of this function (its module's kernels made with it)."""
        if self._jit is None:
            _jit_module(self.module)
        return self._jit


def kernel(fn) -> Kernel:
    """A kernel: compiled ``nogil``, called from Python or from other kernels."""
    return Kernel(fn, "kernel")


def inline(fn) -> Kernel:
    """A helper compiled into every kernel that calls it (a call per field would cost more than
    the work)."""
    return Kernel(fn, "inline")


def _jit_module(module: str) -> None:
    """numba's dispatchers of every function of ``module``, each compiled against a namespace
    where the others are dispatchers too (the module's own globals keep the Kernel objects)."""
    with _lock:
        funcs = _registry.get(module, [])
        if all(k._jit is not None for k in funcs):
            return
        import numba
        namespace = dict(vars(sys.modules[module]))
        for k in funcs:
            f = k.py_func
            g = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__,
                                   f.__closure__)
            g.__qualname__, g.__module__, g.__doc__ = f.__qualname__, f.__module__, f.__doc__
            namespace[k.name] = numba.njit(**JIT_OPTIONS[k.kind])(g)
        for k in funcs:
            k._jit = namespace[k.name]


def jit_dispatchers() -> dict[str, object]:
    """"module.name" -> numba's dispatcher, of every kernel (helpers inlined aside) of
    :data:`KERNEL_MODULES` (imported, made now)."""
    import importlib
    out = {}
    for module in KERNEL_MODULES:
        importlib.import_module(module)
        for k in _registry.get(module, []):
            if k.kind == "kernel":
                out[f"{module}.{k.name}"] = k.dispatcher()
    return out


def fallbacks() -> dict[str, int]:
    """"module.kernel" -> calls in this process that matched none of the ahead-of-time exports
    built for the kernel (numba's JIT ran them)."""
    with _lock:
        return dict(_fallbacks)


# --- the ahead-of-time extension -------------------------------------------------------------

def aot_enabled() -> bool:
    """The kernels built ahead of time may be used (``HARMONY_AOT=0``: never)."""
    return os.environ.get("HARMONY_AOT", "").strip() != "0"


def _cpu_identity() -> str:
    """The CPU the code is compiled for, as /proc/cpuinfo names it (model and flags)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    want = ("vendor_id", "cpu family", "model", "model name", "flags")
    seen = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in want and name not in seen:
            seen[name] = value.strip()
        if not line.strip() and seen:
            break
    return "|".join(seen.get(n, "") for n in want)


def _environment_text() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        numpy_version = version("numpy")        # numpy's, not imported (the guest agent's)
    except PackageNotFoundError:
        numpy_version = None
    return f"{FORMAT}|{sys.version}|{numpy_version}|{numba_version()}|{_cpu_identity()}"


def environment() -> str:
    """What a build is for besides the kernels' sources: :data:`FORMAT`, Python's, numpy's and
    numba's versions, the CPU. A build replaces the builds of other sources for its own
    environment, and keeps a few of other environments' (another Python or venv using the same
    install, another CPU sharing it over NFS: each would otherwise build again at its next
    command, and remove this one's)."""
    return hashlib.sha256(_environment_text().encode()).hexdigest()[:24]


def key() -> str:
    """What the extension must have been built from to be used: the kernel modules' sources and
    its :func:`environment`."""
    h = hashlib.sha256(_environment_text().encode())
    for module in KERNEL_MODULES:
        origin = importlib.util.find_spec(module).origin
        h.update(module.encode() + b"\0" + Path(origin).read_bytes())
    return h.hexdigest()[:24]


def cache_dirs() -> list[Path]:
    """Where the extension is looked for, first the one it is built into when writable: beside
    Harmony's package (``__pycache__/kernels``), then the user's cache directory
    (``$XDG_CACHE_HOME/harmony/kernels``, ``~/.cache/harmony/kernels``)."""
    here = Path(__file__).resolve().parent.parent / "__pycache__" / "kernels"
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [here, Path(home) / "harmony" / "kernels"]


_aot_state: dict = {}


def aot_exports() -> dict[str, list]:
    """"module.kernel" -> [(argument checks, function)] of the extension built for this
    :func:`key`, loaded once per process ({} where none is built)."""
    with _lock:
        if "exports" not in _aot_state:
            _aot_state["exports"] = _load_aot()
        return _aot_state["exports"]


def aot_where() -> Path | None:
    """The directory of the extension this process uses, None if none is built for its key."""
    aot_exports()
    return _aot_state.get("where")


def aot_ready() -> bool:
    """The ahead-of-time kernels are built for these sources and enabled here: found, not
    loaded (a build that does not load leaves its kernels to numba's JIT when they run)."""
    return aot_enabled() and aot_built() is not None


def aot_built() -> Path | None:
    """The directory of the build for this :func:`key`, if there is one (its description and
    its extension file present; nothing loaded, no numpy imported)."""
    with _lock:
        if "built" not in _aot_state:
            try:
                _aot_state["built"] = find_build(key())
            except (OSError, AttributeError, TypeError):
                _aot_state["built"] = None
        built = _aot_state["built"]
        return built[0] if built else None


def forget_build() -> None:
    """Look for this key's build again at the next call (one was built since: a command's own
    build, :func:`harmony.precompile.ensure_built`). Nothing loaded from it is unloaded."""
    with _lock:
        _aot_state.pop("built", None)
        if not _aot_state.get("exports"):
            _aot_state.pop("exports", None)


#: a key's failed build, as a command's build records it beside where the build would be
#: (:func:`harmony.precompile.ensure_built`): never tried again by a command
FAILED_SUFFIX = ".failed"


def failed_build() -> dict | None:
    """The record of a failed build for this :func:`key` ({"exit", "last_line", "when"}), if a
    command's build failed and none was built since; else None."""
    k = key()
    for base in cache_dirs():
        try:
            record = json.loads((base / (k + FAILED_SUFFIX)).read_text())
        except OSError:             # none there (or no directory, or none this user may read)
            continue
        except ValueError:          # recorded, its reason unreadable
            record = {}
        return record if isinstance(record, dict) else {}
    return None


def find_build(k: str) -> tuple[Path, dict] | None:
    """(directory, exports' description) of a build for key ``k`` in :func:`cache_dirs` whose
    description reads, lists its kernels and names an extension file that is there; None if
    there is none."""
    for base in cache_dirs():
        try:
            described = json.loads((base / k / EXPORTS_FILE).read_text())
            if isinstance(described["kernels"], dict) and (base / k / described["file"]).is_file():
                return base / k, described
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _load_aot() -> dict[str, list]:
    if aot_built() is None:
        return {}
    where, described = _aot_state["built"]
    try:
        spec = importlib.util.spec_from_file_location(EXTENSION, where / described["file"])
        ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ext)
        out = {name: [(_checks(e["args"]), getattr(ext, e["symbol"])) for e in entries]
               for name, entries in described["kernels"].items()}
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return {}           # its kernels run by numba's JIT
    _aot_state["where"] = where
    return out


# --- the arguments' types, as numba would type them ------------------------------------------

def _checks(args: list) -> tuple:
    """The checks an argument list must pass for an export (:func:`arg_spec`'s description of
    each of its arguments) to be called with it."""
    import numpy as np
    if not _PYTHON:
        _PYTHON.update({int: np.int64, float: np.float64, bool: np.bool_})
    out = []
    for a in args:
        if a[0] == "array":
            out.append((np.dtype(a[1]), int(a[2]), bool(a[3])))
        else:
            out.append(np.dtype(a[1]).type)
    return tuple(out)


#: the numpy scalar type numba gives a Python scalar (an int: int64), filled by :func:`_checks`
_PYTHON: dict = {}


def _matches(checks: tuple, args: tuple) -> bool:
    """Whether ``args`` are what numba would type as the export's arguments (``checks``, from
    :func:`_checks`): an ndarray of its dtype and dimensions, C-ordered, writable unless the
    export only reads it; a scalar of its type (or the Python type numba gives it)."""
    import numpy as np
    if len(args) != len(checks):
        return False
    for c, x in zip(checks, args):
        if type(c) is tuple:
            if type(x) is not np.ndarray or x.dtype != c[0] or x.ndim != c[1]:
                return False
            f = x.flags
            if not (f.c_contiguous and (c[2] or f.writeable)):
                return False
        elif type(x) is not c and _PYTHON.get(type(x)) is not c:
            return False
    return True


def arg_spec(numba_type) -> list | None:
    """How the exports' description writes a numba argument type (None: a type the matching
    does not know, which is not exported): ["array", dtype, ndim, readonly] for a C-ordered
    array (numba types every array as aligned), ["scalar", dtype] for a number or a bool (not a
    literal: only a kernel's own calls give one)."""
    import numpy as np
    from numba.core import types as nt
    if isinstance(numba_type, nt.Array):
        if numba_type.layout != "C" or not numba_type.aligned:
            return None
        try:
            dtype = np.dtype(str(numba_type.dtype))
        except TypeError:
            return None
        return ["array", dtype.str, numba_type.ndim, not numba_type.mutable]
    if isinstance(numba_type, (nt.Integer, nt.Float, nt.Boolean)) and \
            not isinstance(numba_type, nt.Literal):
        return ["scalar", np.dtype(str(numba_type)).str]
    return None
