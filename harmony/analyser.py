"""The background analyser of a runner (:class:`harmony.runners.BackgroundAnalysis`):
``python -m harmony.analyser``.

Each line of its input is a figures flag (0/1) and then the tab-separated run directories of one
capture, analysed in order (companions first); for each directory it prints
``status<TAB>path[<TAB>error]``, and :data:`DONE` after each capture. Its first line is
:data:`READY`: its death signal is armed (a runner stops it only from then on).
``HARMONY_ANALYSER_CPUS``: the CPUs it runs on; empty, it runs anywhere under SCHED_IDLE at
nice 19 (CPU time nothing else wants).

Its first steps come before it imports the analysis (seconds): its place (CPUs or priority), and
the death signal tied to the runner, so that a runner killed while this process is stopped
(SIGSTOP, while a run is measured) or still importing takes it along.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harmony.core.osutil import die_with_parent

#: the line that ends a capture's results
DONE = b"\x00done"
#: its first line: the death signal is armed, it may be stopped
READY = b"\x00ready"


def analyse_group(group: tuple[list[str], bool]) -> list[dict]:
    """Analyse one capture's directories (``group``: them in order, companions before the run
    that reads them, and whether to draw figures); one dict per directory: status ("ok",
    "error"), path, error (None, or why in one line)."""
    from harmony.pipeline import analyse   # here: the analyser's first steps come before it

    dirs, figures = group
    out = []
    for d in dirs:
        try:
            analyse(Path(d), figures=figures)
            out.append({"status": "ok", "path": d, "error": None})
        except Exception as exc:  # one bad run must not stop the others; reported per run
            out.append({"status": "error", "path": d,
                        "error": f"{type(exc).__name__}: {exc}".replace("\n", " ")})
    return out


def _place() -> None:
    cpus = os.environ.get("HARMONY_ANALYSER_CPUS", "")
    try:
        if cpus:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.nice(19)
    except (OSError, AttributeError):
        pass


def main() -> int:
    # killed when the runner dies: stopped (SIGSTOP) by it, this process would otherwise never
    # read the end of its input and stay behind
    if not die_with_parent():   # the runner is gone already: nobody is left to feed us
        return 0
    _place()
    print(READY.decode(), flush=True)
    from harmony.core.memory import tune_allocations

    tune_allocations()  # an entry point of its own: see harmony.core.memory
    import harmony.pipeline  # noqa: F401  (the analysis loaded now, before its first capture)

    for line in sys.stdin:
        flag, *dirs = line.rstrip("\n").split("\t")
        for r in analyse_group(([d for d in dirs if d], flag == "1")):
            print("\t".join(v for v in (r["status"], r["path"], r["error"]) if v), flush=True)
        print(DONE.decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
