"""Cpuset cgroups that hold each initial CPU's tasks until t0 and release them with one write.

Layout: ``<cpuset hierarchy>/harmony-<controller pid>/cpu<N>``, one child per initial CPU with
``cpuset.cpus`` = N. A worker joins the child of its initial CPU instead of pinning itself; at t0
the controller widens every child's ``cpuset.cpus`` to the run's CPU set: the kernel changes the
allowed CPUs of every member inside that one write (one write per initial CPU instead of one
``sched_setaffinity`` per task).

cgroup v2 (a cgroup2 mount whose root lists ``cpuset``) is preferred; otherwise cgroup v1 (a
``cgroup`` mount with the cpuset option, as on hybrid hosts). v1 cgroups are created with
``sched_load_balance`` 0 so that they never change the host's scheduling domains. On v2, if the
root's ``cgroup.subtree_control`` lacks ``+cpuset``, it is enabled for the run and disabled again
afterwards; a marker file says so in case the controller dies first.

Everything created here is removed by :meth:`CpusetGroups.remove` and, if the controller was
killed, by :func:`reclaim_stale` (from the next run's start and ``harmony clean``). A process that
called :func:`keep_within_the_boot` (the guest agent) keeps its groups from one run to the next
instead, each run narrowing them again, and removes them at its exit.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import signal
import time
from pathlib import Path

from harmony.core.errors import CpusetUnavailable  # noqa: F401  (raised here)
from harmony.core.osutil import lock_dir, parse_cpulist, pid_alive
from harmony.core.wording import plural

PREFIX = "harmony-"
MARKER = "cpuset-enabled-by-"  # file in the lock directory: this pid enabled +cpuset at the v2 root
REMOVE_WAIT_S = 2.0  # how long a cgroup whose last tasks are exiting may stay busy


#: the groups this process keeps from one run to the next (:func:`keep_within_the_boot`): the
#: parent and the v2 root whose +cpuset it turned on (None: it was on), or None before the first
_kept: tuple[Path, Path | None] | None = None
_keeping = False


def keep_within_the_boot() -> None:
    """Keep this process's cpuset cgroups from one workload to the next: made by the first run,
    each next run's narrowed back to its initial CPU (one write each), all removed at this
    process's exit (or by :func:`reclaim_stale` if it is killed). For the guest agent: under
    TCG each run made and removed five cgroups and switched the root's ``+cpuset`` on and off
    (~30 ms a run, bench/README.md), and nothing but Harmony uses the guest's cgroups."""
    global _keeping
    if not _keeping:
        _keeping = True
        atexit.register(_remove_kept)


def _remove_kept() -> list[str]:
    global _kept
    if _kept is None:
        return []
    (parent, enabled), _kept = _kept, None
    errors = _remove_tree(parent) if parent.is_dir() else []
    if enabled is not None:
        errors += _disable_root_cpuset(enabled, os.getpid())
    return errors


def _mounts() -> list[tuple[str, str, list[str]]]:
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            out.append((mnt, parts[2], parts[3].split(",")))
    return out


def hierarchies() -> list[tuple[str, Path]]:
    """Every mounted cpuset hierarchy as (version, root): v2 roots first, then v1."""
    v2 = [("v2", Path(m)) for m, fs, _ in _mounts() if fs == "cgroup2"
          and "cpuset" in _read(Path(m) / "cgroup.controllers").split()]
    v1 = [("v1", Path(m)) for m, fs, opts in _mounts() if fs == "cgroup" and "cpuset" in opts]
    return v2 + v1


def parse_cpus(text: str) -> set[int]:
    """A kernel CPU list ("0-3,6") as a set; an empty list (an empty cgroup file) is empty."""
    return set(parse_cpulist(text)) if text.strip() else set()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CpusetGroups:
    """The cpuset cgroups of one run. ``create()``, workers join,
    ``widen()`` at t0, ``remove()``."""

    def __init__(self, initial_cpus: list[int], run_cpus: list[int], owner: int | None = None):
        self.initial_cpus = sorted(set(initial_cpus))
        self.run_cpus = sorted(set(run_cpus))
        self.owner = owner or os.getpid()
        self.version: str | None = None
        self.parent: Path | None = None
        self._prefix = "cpuset."
        self._fds: list[int] = []
        self._enabled_root: Path | None = None  # v2 root whose +cpuset we turned on
        self.kept = False   # the groups stay for the next run (keep_within_the_boot)
        self._run_list = ",".join(map(str, self.run_cpus)).encode()

    def child(self, cpu: int) -> Path:
        return self.parent / f"cpu{cpu}"

    def procs_file(self, cpu: int) -> str:
        """The file a worker writes its own pid to, to join the cgroup of ``cpu``."""
        return str(self.child(cpu) / "cgroup.procs")

    def create(self) -> None:
        """Create the parent and one child per initial CPU.
        Raises CpusetUnavailable, leaving nothing."""
        found = hierarchies()
        if not found:
            raise CpusetUnavailable("no cpuset cgroup hierarchy is mounted")
        self.version, root = found[0]
        if self.version == "v1" and not (root / "cpuset.cpus").exists():
            self._prefix = ""  # v1 mounted with noprefix
        eff = root / ("cpuset.cpus.effective" if self.version == "v2"
                      else f"{self._prefix}effective_cpus")
        have = parse_cpus(_read(eff) or _read(root / f"{self._prefix}cpus"))
        if not set(self.run_cpus) <= have:
            raise CpusetUnavailable(f"the run's CPUs are not all in the cpuset root {root} "
                                    f"({sorted(have)})")
        self.parent = root / f"{PREFIX}{self.owner}"
        global _kept
        self.kept = _keeping and self.owner == os.getpid()
        if self.kept and _kept is not None and _kept[0] == self.parent and self.parent.is_dir():
            made = True         # the boot's: its parent holds every CPU of the root
        else:
            made, _kept = False, None
        try:
            self._create(root, made, ",".join(map(str, sorted(have))))
        except OSError as exc:
            self.kept = False   # removed whole, the boot's too
            self.remove()
            if made:
                _remove_kept()
            raise CpusetUnavailable(f"cannot create cpuset cgroups under {root}: "
                                    f"{exc.strerror or exc}") from None
        if self.kept:
            _kept = (self.parent, _kept[1] if made else self._enabled_root)

    def _create(self, root: Path, made: bool, root_cpus: str) -> None:
        """The groups made; ``made``: the parent is the boot's, kept (its children narrowed back
        to their CPU, the missing ones made)."""
        p, run = self._prefix, self._run_list.decode()
        if made:
            for c in self.initial_cpus:
                if self.child(c).is_dir():
                    _write(self.child(c) / f"{p}cpus", str(c))
                else:
                    self._make(self.child(c), root, str(c))
        else:
            if self.version == "v2" and \
                    "cpuset" not in _read(root / "cgroup.subtree_control").split():
                (lock_dir() / f"{MARKER}{self.owner}").write_text(f"{root}\n")
                self._enabled_root = root
                _write(root / "cgroup.subtree_control", "+cpuset")
            # a kept parent holds every CPU of the root: the next runs' sets fit in it
            self._make(self.parent, root, root_cpus if self.kept else run)
            for c in self.initial_cpus:
                self._make(self.child(c), root, str(c))
        self._fds = [os.open(self.child(c) / f"{p}cpus", os.O_WRONLY) for c in self.initial_cpus]

    def _make(self, g: Path, root: Path, cpus: str) -> None:
        p = self._prefix
        g.mkdir()
        if self.version == "v1":
            _write(g / f"{p}sched_load_balance", "0")  # first: never a new scheduling domain
            _write(g / f"{p}mems", _read(root / f"{p}mems").strip())
        elif g == self.parent:
            _write(g / "cgroup.subtree_control", "+cpuset")
        _write(g / f"{p}cpus", cpus)

    def widen(self) -> None:
        """Allow every member the run's whole CPU set: one write per initial CPU."""
        for fd in self._fds:
            os.pwrite(fd, self._run_list, 0)

    def members(self) -> dict[int, list[int]]:
        """Pids in each child cgroup, by initial CPU."""
        return {c: [int(x) for x in _read(self.child(c) / "cgroup.procs").split()]
                for c in self.initial_cpus}

    def remove(self) -> list[str]:
        """Remove every cgroup of this run (members must have exited); kept ones
        (:func:`keep_within_the_boot`) stay for the next run. Returns errors, one line each."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self.kept:
            return []
        errors = []
        if self.parent is not None and self.parent.is_dir():
            errors += _remove_tree(self.parent)
        if self._enabled_root is not None:
            errors += _disable_root_cpuset(self._enabled_root, self.owner)
            self._enabled_root = None
        return errors


def _rmdir_retry(path: Path) -> str | None:
    give_up = time.monotonic() + REMOVE_WAIT_S
    while True:
        try:
            path.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > give_up:
                return f"cannot remove cgroup {path}: {exc.strerror}"
            time.sleep(0.01)  # its last members are still exiting


def _remove_tree(parent: Path) -> list[str]:
    errors = [e for c in sorted(parent.iterdir()) if c.is_dir() for e in [_rmdir_retry(c)] if e]
    err = _rmdir_retry(parent)
    return errors + ([err] if err else [])


def _disable_root_cpuset(root: Path, owner: int) -> list[str]:
    """Undo our +cpuset at a v2 root (only if no other cgroup of ours still needs it)."""
    errors = []
    if not any(root.glob(f"{PREFIX}*")):
        try:
            _write(root / "cgroup.subtree_control", "-cpuset")
        except OSError as exc:  # e.g. another user of the host enabled cpusets meanwhile
            errors.append(f"cpuset left enabled in {root}/cgroup.subtree_control: {exc.strerror}")
    try:
        (lock_dir() / f"{MARKER}{owner}").unlink()
    except FileNotFoundError:
        pass
    return errors


def reclaim_stale() -> list[str]:
    """Remove the cpuset cgroups of dead controllers (killing any member left);
    a line per removal."""
    removed = []
    for _, root in hierarchies():
        for parent in sorted(root.glob(f"{PREFIX}*")):
            owner = parent.name[len(PREFIX):]
            if not (owner.isdigit() and parent.is_dir()) or pid_alive(int(owner)):
                continue
            killed = 0
            for procs in parent.glob("*/cgroup.procs"):
                for pid in _read(procs).split():
                    try:  # only a Harmony worker ever joins these cgroups
                        os.kill(int(pid), signal.SIGKILL)
                        killed += 1
                    except ProcessLookupError:
                        pass
            errors = _remove_tree(parent)
            what = f"cpuset cgroup {parent}" + (f" ({plural(killed, 'member')} killed)"
                                                if killed else "")
            removed += [f"{what}: {e}" for e in errors] if errors else [what]
    for marker in lock_dir().glob(f"{MARKER}*"):
        owner = marker.name[len(MARKER):]
        if owner.isdigit() and not pid_alive(int(owner)):
            root = Path(_read(marker).strip())
            errors = _disable_root_cpuset(root, int(owner)) if root.is_dir() else []
            marker.unlink(missing_ok=True)
            removed.append(f"+cpuset at {root} enabled by dead run {owner}"
                           + (f" ({errors[0]})" if errors else ""))
    return removed
