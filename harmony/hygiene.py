"""Host hygiene: one run at a time, and nothing of ours left behind.

The host lock is an ``flock`` on a file under /run: the kernel releases it when its holder dies,
even by SIGKILL, so a crashed run never blocks the next one. On every start the next run reclaims
what a killed run could not clean: tracefs instances and perf recorders whose owner is gone,
worker processes (comm ``hmy-*``) and fork servers orphaned to init, cpuset cgroups
(``harmony-<pid>``) whose controller is gone, and the QEMU and virtme-ng processes of a virtual
machine whose controller is gone (:func:`harmony.vm.machine.reclaim_stale`), a sched_ext scheduler
under test whose controller is gone (:func:`harmony.vm.scx.reclaim_stale`), the kernel's
scheduler statistics a killed run turned on (:func:`harmony.probes.schedstat.reclaim_stale`), and
the debugfs sched/verbose switch it turned on to read the domains
(:func:`harmony.probes.domains.reclaim_stale`).
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

from harmony.core.errors import HostBusy  # noqa: F401  (raised here)
from harmony.core.osutil import lock_dir, open_own_file
from harmony.probes import PROBES, domains, get_probe, schedstat
from harmony.vm import machine as vm
from harmony.vm import scx
from harmony.workload import cpuset
from harmony.workload.forkserver import COMM as SERVER_COMM

WORKER_PREFIX = "hmy-"


class HostLock:
    """Exclusive, crash-safe lock on this host for the duration of one run."""

    def __init__(self):
        self.fd: int | None = None
        self.path: Path | None = None

    def acquire(self) -> "HostLock":
        try:
            self.path = lock_dir() / "run.lock"
            self.fd = open_own_file(self.path)
        except OSError as exc:
            raise HostBusy(f"cannot take the host lock: {exc}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            self.fd = None
            raise HostBusy(f"another Harmony run (pid {holder}) is using this host; "
                           "wait for it to finish or stop it") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


def _procs() -> dict[int, tuple[str, int]]:
    """pid -> (comm, parent pid) of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
        out[int(entry.name)] = (comm, int(stat[stat.rindex(b")") + 2:].split()[1]))
    return out


def _controller_gone(ppid: int) -> bool:
    try:
        parent = (Path("/proc") / str(ppid) / "cmdline").read_bytes()
    except OSError:
        parent = b""
    return ppid == 1 or not (b"harmony" in parent or b"python" in parent)


def orphans() -> list[tuple[int, str]]:
    """(pid, what) of Harmony workers and fork servers whose controller is gone (reparented to init
    or a subreaper). A worker forked by a fork server belongs to the server's controller."""
    procs, out = _procs(), []
    for pid, (comm, ppid) in procs.items():
        if comm == SERVER_COMM and _controller_gone(ppid):
            out.append((pid, "fork server"))
        elif comm.startswith(WORKER_PREFIX):
            parent_comm, grandparent = procs.get(ppid, ("", 1))
            if _controller_gone(grandparent if parent_comm == SERVER_COMM else ppid):
                out.append((pid, "worker"))
    return out


def reclaim_stale() -> list[str]:
    """Remove what dead Harmony runs left; return a line per thing removed.
    Call with the lock held."""
    removed = []
    for pid, what in orphans():
        try:
            os.kill(pid, signal.SIGKILL)
            removed.append(f"orphan {what} process {pid}")
        except ProcessLookupError:
            pass
    removed += cpuset.reclaim_stale()
    removed += vm.reclaim_stale()
    removed += scx.reclaim_stale()
    removed += schedstat.reclaim_stale()
    removed += domains.reclaim_stale()
    for name in PROBES:
        try:
            removed += get_probe(name).reclaim_stale()
        except ImportError:
            continue
    return removed
