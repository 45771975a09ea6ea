"""When Harmony uses its compiled (numba) kernels: the trace decoder and the task state machine.

Compiled, both are several times faster than their numpy versions (which stay, give the same
tables, and are tested against them), but importing numba and loading the kernels from its cache
costs ~0.5-1 s once per process. ``HARMONY_JIT`` chooses:

- ``auto`` (default): compiled when the input is large enough to repay that start-up, or when
  numba is already loaded in this process (the start-up is paid); numpy otherwise
- ``1``: always compiled (where numba is installed); ``0``: never
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys


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


def mode() -> str:
    m = os.environ.get("HARMONY_JIT", "auto").strip().lower()
    return m if m in ("0", "1") else "auto"


def numba_loaded() -> bool:
    """numba is imported in this process already: its start-up is paid."""
    return "numba" in sys.modules


def use_compiled(size: int, min_size: int) -> bool:
    """Whether to run the compiled kernel on an input of ``size`` (bytes, events: the caller's
    unit) when it repays numba's start-up from ``min_size`` on."""
    m = mode()
    if m == "0" or numba_version() is None:
        return False
    return m == "1" or size >= min_size or numba_loaded()


def describe() -> tuple[bool, str]:
    """(compiled kernels usable, a line for ``harmony doctor``)."""
    v = numba_version()
    if v is None:
        return False, "numpy only: numba is not installed (large traces decode 3-5x slower)"
    if mode() == "0":
        return False, f"numpy only: HARMONY_JIT=0 (numba {v} installed)"
    if mode() == "1":
        return True, f"compiled (numba {v}), for every trace (HARMONY_JIT=1)"
    return True, f"compiled (numba {v}) for large traces, numpy below (HARMONY_JIT=auto)"
