"""The topology sources of real guests, captured once and kept as fixtures (tests/data/topology/
<name>.json): each one's /proc/schedstat, debugfs domain files (read with sched/verbose on) and
sysfs topology files, as raw texts. :func:`guest_topology` lays one out as a file tree and reads
it as Harmony reads a system (:func:`harmony.probes.domains.read`).

How they were captured (bench/README.md, "topologies under test"): Debian's kernels booted under
QEMU 7.2 TCG with virtme-ng, e.g. ``vng --run vmlinuz-6.12.118+deb12-amd64 --disable-kvm
--memory 1G --cpus 8,sockets=2,cores=2,threads=2 --numa 512M,cpus=0-3 --numa 512M,cpus=4-7 --
python3 capture.py OUT.json``; each file's ``about`` holds its command line.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "topology"


def names() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def lay_out(fx: dict, root: Path) -> dict[str, Path]:
    """Write a fixture's files under ``root``: sys/, debug/sched/domains/, schedstat; returns
    their paths ({"sysfs", "debugfs", "schedstat"})."""
    for rel, text in fx["sysfs"].items():
        p = root / "sys" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    sched = root / "debug" / "sched"
    sched.mkdir(parents=True, exist_ok=True)
    (sched / "verbose").write_text("Y\n")
    for rel, text in fx["debugfs"].items():
        p = sched / "domains" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "schedstat").write_text(fx["schedstat"])
    return {"sysfs": root / "sys", "debugfs": root / "debug", "schedstat": root / "schedstat"}


def guest_topology(fx: dict, root: Path) -> dict:
    """The manifest topology Harmony reads from a fixture laid out under ``root``."""
    from harmony import hostfacts
    from harmony.probes import domains

    paths = lay_out(fx, root)
    return domains.read(debugfs=paths["debugfs"], topo=hostfacts.topology(paths["sysfs"]),
                        schedstat_path=paths["schedstat"])
