"""The VM's reaper: a small process that ends a VM with its controller, however the controller ends.

``python3 -P -S reaper.py CONTROLLER_PID [--remove DIR]... -- ARGV...`` (:func:`command`) runs ARGV
(virtme-ng) as its child and watches the controller. virtme-ng starts QEMU through a tree of its own
(``vng``, a shell, ``virtme-run``, which forks QEMU; ``virtiofsd`` started in the background by a
shell and left to whoever reaps orphans): killed with SIGKILL, the controller can neither stop that
tree nor pass anything on to it (PR_SET_PDEATHSIG is one process's, and is not inherited by what it
forks), and QEMU ran on at 100 % of a CPU until the guest's command ended (21-51 s measured). The
reaper is the session leader of that whole tree and its *child subreaper* (PR_SET_CHILD_SUBREAPER:
whatever in it is orphaned becomes its child, not init's); it holds a pidfd of the controller
(pidfd_open, else it polls its parent pid), and the moment the controller is gone it SIGKILLs every
process below it and its process group. When ARGV ends on its own it kills what ARGV left behind and
exits with ARGV's status (a signal N as 128 + N). SIGTERM, SIGINT or SIGHUP to it does the same as
the controller's death. Each ``--remove DIR`` (the VM's job directory, scratch of the controller's)
is removed after the kill when the controller died: its owner cannot; when ARGV ends on its own the
controller is there to remove it.

Standard library only, run as a script with ``-S`` (no site directory) and ``-P``: it starts in
~15 ms, and its environment (PYTHONPATH included) is ARGV's unchanged. It writes nothing on its
standard output, which it shares with ARGV (the console the controller reads).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
#: how often the controller is looked at where pidfd_open is missing (a kernel before 5.3)
POLL_S = 0.1


def command(argv: list[str], controller: int | None = None, remove=()) -> list[str]:
    """The command line that runs ``argv`` under a reaper watching ``controller`` (default: this
    process), removing the directories ``remove`` if the controller dies."""
    removes = [arg for d in remove for arg in ("--remove", str(d))]
    return [sys.executable, "-P", "-S", os.path.abspath(__file__),
            str(controller or os.getpid()), *removes, "--", *argv]


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(ppid, []).append(int(entry))
    return out


def below(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    children, out, todo = _children(), [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_all(me: int, also_group: bool = True, remove=()) -> None:
    """SIGKILL every process below ``me`` and, with ``also_group``, the rest of its process
    group (this process too, last); again until none is left below (one may fork meanwhile).
    The directories ``remove`` go once nothing below runs (before the group: this process is
    in it)."""
    for _ in range(20):
        pids = below(me)
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap()
    if remove:
        import shutil               # here: the reaper's start stays light
        for d in remove:
            shutil.rmtree(d, ignore_errors=True)
    if also_group:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _reap() -> None:
    """Collect the zombies this process (a subreaper) was left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def main(argv: list[str]) -> int:
    remove, i = [], 1
    while i + 1 < len(argv) and argv[i] == "--remove":
        remove.append(argv[i + 1])
        i += 2
    if len(argv) < i + 2 or argv[i] != "--" or not argv[0].isdigit():
        print("usage: reaper.py CONTROLLER_PID [--remove DIR]... -- ARGV...", file=sys.stderr)
        return 2
    controller, cmd, me = int(argv[0]), argv[i + 1:], os.getpid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass        # orphans go to init then: the process group still holds them
    watch = _pidfd(controller)
    if os.getppid() != controller:      # it died before the watch began: start nothing
        return 137
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: kill_all(me, remove=remove))
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"harmony reaper: {cmd[0]} could not start ({exc.strerror})", file=sys.stderr)
        return 127
    fds = [fd for fd in (watch, _pidfd(child.pid)) if fd is not None]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while True:
        poller.poll(POLL_S * 1000 if len(fds) < 2 else None)
        if (watch is None and os.getppid() != controller) or (
                watch is not None and select.select([watch], [], [], 0)[0]):
            kill_all(me, remove=remove)     # the controller is gone: so is everything here
        if child.poll() is not None:
            break
    rc = child.returncode
    kill_all(me, also_group=False)          # what the command left running (a virtiofsd)
    deadline = time.monotonic() + 1.0
    while below(me) and time.monotonic() < deadline:
        time.sleep(0.01)
        _reap()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
