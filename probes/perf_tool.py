"""Running the ``perf`` tool: what every perf command Harmony starts shares, whatever it does
(``perf record`` in :mod:`harmony.probes.perf`, ``perf script`` in
:mod:`harmony.probes.perf_script`, ``perf report`` in :mod:`harmony.probes.perf_data`).
"""

from __future__ import annotations

import os

from harmony.core.osutil import die_with_parent

#: the environment of every perf command: C locale (the parsers read its English), no pager
PERF_ENV = {**os.environ, "LC_ALL": "C", "PAGER": "cat", "PERF_PAGER": "cat"}


def die_with_parent_preexec(parent_pid: int):
    """preexec_fn: the child gets SIGKILL when the thread that forked it dies (PR_SET_PDEATHSIG)."""
    def setup():
        if not die_with_parent(parent_pid):  # the parent died before the request took effect
            os._exit(1)
    return setup


def first_error_line(text: str) -> str:
    """The most telling line of a perf error message."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Events disabled", "[ perf record"))]
    for i, ln in enumerate(lines):
        if ln.rstrip(":").lower() == "error" and i + 1 < len(lines):
            return lines[i + 1]
    for ln in lines:
        if "error" in ln.lower() or "fail" in ln.lower() or "invalid" in ln.lower():
            return ln
    return lines[-1] if lines else "no output"


__all__ = ["PERF_ENV", "die_with_parent_preexec", "first_error_line"]
