"""Commands about this host: ``doctor`` (what it can do) and ``clean`` (what killed runs left).
"""

from __future__ import annotations

import json
import re
import sys

import click

from harmony.cli.common import echo, exit_on_error, fail, json_option, print_json, style

#: how doctor's statuses are marked on a terminal
STATUS_STYLES = {"ok": "ok", "warn": "warning", "missing": "error"}


def coloured(table: str) -> str:
    """doctor's table with each row's status marked (a warning must not be missed)."""
    out = []
    for i, line in enumerate(table.splitlines()):
        m = re.match(r"^(\S+\s+)(ok|warn|missing)\b", line) if i else None
        out.append(m.group(1) + style(m.group(2), STATUS_STYLES[m.group(2)]) + line[m.end():]
                   if m else line)
    return "\n".join(out)


@click.command()
@json_option("the facts")
def doctor(as_json):
    """What this host can do: probes, tracepoints, topology, scheduler. Exit 0 if an
    experiment can run."""
    from harmony import doctor as host

    facts = host.doctor(vm=True)
    if as_json:
        click.echo(json.dumps(facts, indent=1, default=str))
    else:
        echo(coloured(host.format_doctor(facts)))
    sys.exit(0 if facts["verdict"]["can_run"] else 1)


@click.command()
@json_option("what was removed")
def clean(as_json):
    """Remove what killed Harmony runs left on this host (instances, recorders, orphan workers,
    cpuset cgroups, VMs, sched_ext schedulers)."""
    from harmony.hostfacts import is_root
    from harmony.hygiene import HostLock, reclaim_stale

    if not is_root():
        fail("clean needs root: what a killed run leaves (tracing instances, cgroups, workers) "
              "is root's to remove")
    with exit_on_error(), HostLock():
        removed = reclaim_stale()
    if as_json:
        print_json({"removed": removed})
        return
    click.echo("\n".join(f"removed {r}" for r in removed) if removed else "nothing to clean")
