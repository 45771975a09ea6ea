"""The guest agent's entry point, ``python3 -S -P -m harmony.vm.agent JOBFILE [--more]``: the fork
server forked from this process first, then the agent (:func:`harmony.vm.guest.main`).

The agent's workers come from a fork server (:mod:`harmony.workload.forkserver`). A controller on
a host starts it as a fresh interpreter, because the controller is large (pandas, pyarrow) and
a fork of it costs its page tables. In a TCG guest a fresh interpreter costs its start and its
imports, 1.1 s and ~0.5 s of each boot (bench/README.md, 2026-12-05); the agent, here, has
imported what the server needs (this module imports :mod:`harmony.workload.forkserver` and the
little it brings), nothing of its own yet, and no thread runs: a fork of it is the server a fresh
interpreter would be, without its start.
"""

from __future__ import annotations

import sys

from harmony.workload import forkserver


def main(argv: list[str]) -> int:
    forkserver.fork_now()
    from harmony.vm import guest    # the agent's own modules, after the fork

    return guest.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
