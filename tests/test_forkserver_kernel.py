"""The fork server on the real kernel: the workers are its children, not the controller's; a worker
that dies before t0 is reported; stop() leaves no process; a controller killed by SIGKILL, Ctrl-C
or an exception leaves neither server nor worker; the controller forks itself, and says so, when
the server is disabled or cannot start."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import sigint_as_a_terminal, until

from harmony import hygiene
from harmony.workload import cpuset, forkserver
from harmony.workload.controller import ControllerError, Workload
from harmony.workload.tasks import TaskSpec

CPUS = [0, 1]


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(comm, parent pid, state) of a process, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], int(rest[1]), rest[0]


def _gone(pid: int, comm: str) -> bool:
    """The process is gone (reaped), or the pid now belongs to something else."""
    st = _stat(pid)
    return st is None or not st[0].startswith(comm)


def _servers() -> list[int]:
    return [pid for pid, (comm, _) in hygiene._procs().items() if comm == forkserver.COMM]


def _specs(n=4):
    return [TaskSpec(name=f"fs{i}", initial_cpu=i % 2) for i in range(n)] + \
        [TaskSpec(name="fsp", initial_cpu=1, pinned=True)]


def test_workers_are_children_of_the_server(host):
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        assert not any("forked by the controller" in n for n in w.notes), w.notes
        server = forkserver._server.pid
        comm, ppid, _ = _stat(server)
        assert comm == forkserver.COMM and ppid == os.getpid()
        for pid, spec in zip(w.pids, w.specs):
            assert _stat(pid)[:2] == (spec.comm, server)
            assert os.getpgid(pid) == w.pgid  # one group, which the controller can signal
        # the server is small: none of the controller's big libraries
        maps = Path(f"/proc/{server}/maps").read_text()
        assert not any(lib in maps for lib in ("pandas", "pyarrow", "numba", "numpy")), \
            sorted({line.split()[-1] for line in maps.splitlines() if "site-packages" in line})
        w.release(lambda text: time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        assert until(lambda: (w.work_done() > 0).all()), w.work_done()  # shared counters work
        pids = list(w.pids)
    # stop() returned: every worker dead and reaped, the server has no child left
    assert all(_stat(pid) is None for pid in pids)
    assert Path(f"/proc/{server}/task/{server}/children").read_text().split() == []
    # the next workload reuses the server
    with Workload(_specs(2), CPUS) as w:
        w.spawn()
        assert forkserver._server.pid == server and _stat(w.pids[0])[1] == server


def test_killpg_from_the_controller(host):
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        os.killpg(w.pgid, signal.SIGKILL)
        assert until(lambda: w.alive() == [])
        pids = list(w.pids)
    assert all(_stat(pid) is None for pid in pids)


def test_worker_dying_before_t0_is_reported_with_its_status(host):
    # a pinned task on a CPU that does not exist: its sched_setaffinity fails and it exits 1
    specs = _specs(2) + [TaskSpec(name="fsbad", initial_cpu=4095, pinned=True)]
    w = Workload(specs, CPUS)
    with pytest.raises(ControllerError, match=r"worker \d+ died before t0 \(status 0x100\)"):
        with w:
            w.spawn(timeout_s=10)
    assert all(_stat(pid) is None for pid in w.pids)


def test_a_dead_server_is_noticed_and_replaced(host):
    w = Workload(_specs(), CPUS)
    with w:
        w.spawn()
        server = forkserver._server.pid
        os.kill(server, signal.SIGKILL)
    # stop() said so and returned once the workers (killed with their server) were reaped by init
    assert any("fork server failed" in n for n in w.notes), w.notes
    assert all(_gone(pid, "hmy-") for pid in w.pids)
    with Workload(_specs(2), CPUS) as w:
        w.spawn()
        assert any("fork server restarted" in n for n in w.notes), w.notes
        assert _stat(w.pids[0])[1] == forkserver._server.pid != server


def test_disabled_server_forks_in_the_controller_and_says_so(host, monkeypatch):
    monkeypatch.setenv(forkserver.ENV, "0")
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        assert any(f"{forkserver.ENV}=0" in n for n in w.notes), w.notes
        assert all(_stat(pid)[1] == os.getpid() for pid in w.pids)
        w.release(lambda text: 0)
        assert until(lambda: (w.work_done() > 0).all())
        pids = list(w.pids)
    assert all(_stat(pid) is None for pid in pids)


def test_server_that_cannot_start_falls_back(host, monkeypatch):
    def broken():
        raise OSError("no such interpreter")

    monkeypatch.setattr(forkserver, "_server", None)
    monkeypatch.setattr(forkserver, "_failed", None)
    monkeypatch.setattr(forkserver, "_start", broken)
    with Workload(_specs(), CPUS) as w:
        w.spawn()
        assert any("fork server could not start (no such interpreter)" in n
                   for n in w.notes), w.notes
        assert all(_stat(pid)[1] == os.getpid() for pid in w.pids)


CHILD = textwrap.dedent("""
    import signal, sys, time
    from harmony.workload import forkserver
    from harmony.workload.controller import Workload
    from harmony.workload.tasks import TaskSpec
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # as the CLI does
    w = Workload([TaskSpec(name=f"fk{i}", initial_cpu=i % 2) for i in range(4)], [0, 1])
    if sys.argv[1] == "raise":
        w.spawn()
        print(forkserver._server.pid, *w.pids, *w.occupier_pids, flush=True)
        sys.stdin.readline()  # the test has seen them alive
        raise RuntimeError("an error that leaves the workload running")
    with w:
        w.spawn()
        print(forkserver._server.pid, *w.pids, *w.occupier_pids, flush=True)  # workers, occupiers
        time.sleep(60)
""")


def _controller(how: str, **kw) -> tuple[subprocess.Popen, int, list[int]]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    line = child.stdout.readline().split()
    assert line, child.communicate()[1]
    server, *pids = map(int, line)
    assert _stat(server)[0] == forkserver.COMM and all(_stat(p)[1] == server for p in pids)
    child.stdin.write("seen\n")  # "raise" goes on to raise only now (no race with its exit)
    child.stdin.flush()
    return child, server, pids


def test_sigkill_of_the_controller_takes_server_and_workers(host):
    child, server, pids = _controller("sleep")
    child.kill()
    child.wait()
    # the server dies with its controller, the workers with their server (PR_SET_PDEATHSIG)
    assert until(lambda: _gone(server, forkserver.COMM) and all(_gone(p, "hmy-") for p in pids))
    assert not [pid for pid, _ in hygiene.orphans()]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "raise"])
def test_controller_exit_leaves_nothing(host, how):
    # ctrl-c: SIGINT to the whole process group, as a terminal sends it (the server ignores it)
    child, server, pids = _controller("raise" if how == "raise" else "sleep",
                                      start_new_session=True)
    if how == "ctrl-c":
        os.killpg(child.pid, signal.SIGINT)
    elif how == "sigterm":
        child.terminate()
    _, err = child.communicate(timeout=30)
    assert child.returncode != 0
    if how == "raise":
        assert "an error that leaves" in err
    # at once, not eventually: the controller's exit waits for the server, which reaps its workers
    assert _gone(server, forkserver.COMM), _stat(server)
    assert all(_gone(p, "hmy-") for p in pids), [_stat(p) for p in pids]
    if how == "raise":  # the workload was never stopped: its cgroups are left for the next start
        cpuset.reclaim_stale()
    assert not [p for _, root in cpuset.hierarchies()
                for p in root.glob(f"{cpuset.PREFIX}{child.pid}")]


LATE_SIGNAL = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from harmony.workload import forkserver
    from harmony.cli import entry

    server, why = forkserver.shared()
    assert server is not None, why
    print(server.pid, flush=True)
    sig = getattr(signal, sys.argv[1])

    def signal_at_exit():   # runs before the server's shutdown (atexit: last registered, first run)
        os.kill(os.getpid(), sig)
        time.sleep(0.2)

    atexit.register(signal_at_exit)
    sys.argv = ["harmony", "--help"]
    entry()
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_tears_down_is_no_traceback(host, sig):
    """Ctrl-C or SIGTERM after the command's outcome is decided (a run written complete) but
    while the process tears down: exit as the command decided, no traceback, the server gone."""
    p = subprocess.run([sys.executable, "-c", LATE_SIGNAL, sig], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    server = int(p.stdout.split()[0])
    assert _gone(server, forkserver.COMM), _stat(server)


SIGNAL_IN_A_FINALIZER = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from harmony.core.stops import never_swallowed
    from harmony.core.errors import Interrupted

    def stopped(signum, frame):
        raise Interrupted("stopped by SIGTERM", signum)

    signal.signal(signal.SIGTERM, stopped)
    sig = getattr(signal, sys.argv[1])
    if sys.argv[2] == "hook":
        never_swallowed()

    class Figure:
        pass

    def finalizer(ref):        # the signal's handler runs in here, inside a weakref callback
        os.kill(os.getpid(), sig)
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass

    figure = Figure()
    ref = weakref.ref(figure, finalizer)
    try:
        del figure
        for _ in range(100):
            time.sleep(0.01)
        print("ran on")
    except (Interrupted, KeyboardInterrupt):
        print("stopped")
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_raised_inside_a_finalizer_still_stops_the_command(sig):
    """SIGTERM's Interrupted or Ctrl-C's KeyboardInterrupt raised while a finalizer runs (a CI run
    was stopped while matplotlib's ran): Python ignores it, printing a traceback; the command
    sends it again and stops. Without that, it runs on."""
    def run(how):
        return subprocess.run([sys.executable, "-c", SIGNAL_IN_A_FINALIZER, sig, how],
                              capture_output=True, text=True, timeout=60,
                              preexec_fn=sigint_as_a_terminal)
    p = run("hook")
    assert p.stdout.strip() == "stopped" and "Traceback" not in p.stderr, p.stderr
    p = run("none")
    assert p.stdout.strip() == "ran on" and "Exception ignored" in p.stderr


THREAD = textwrap.dedent("""
    import threading
    from harmony.workload import forkserver
    from harmony.workload.controller import Workload
    from harmony.workload.tasks import TaskSpec

    def run():
        with Workload([TaskSpec(name="ft0")], [0, 1]) as w:
            w.spawn()

    t = threading.Thread(target=run)
    t.start()
    t.join()  # the server's death signal must not be tied to this thread
    first = forkserver._server.pid
    run()
    assert forkserver._server.pid == first and forkserver._server.alive()
    print("same server", first)
""")


def test_server_started_from_a_thread_outlives_it(host):
    p = subprocess.run([sys.executable, "-c", THREAD], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "same server" in p.stdout, p.stderr
    assert _gone(int(p.stdout.split()[-1]), forkserver.COMM)


def test_orphaned_server_and_its_workers_are_reclaimed(monkeypatch):
    # 10: a server whose controller is gone (its parent is init), 11: its worker; 20: a server
    # whose controller (30, python) lives, 21: its worker; 40: a worker of a dead in-process run
    procs = {10: (forkserver.COMM, 1), 11: ("hmy-w00", 10), 20: (forkserver.COMM, 30),
             21: ("hmy-w01", 20), 30: ("python3", 1), 40: ("hmy-w02", 1)}
    monkeypatch.setattr(hygiene, "_procs", lambda: procs)
    monkeypatch.setattr(hygiene, "_controller_gone", lambda ppid: ppid == 1)
    assert sorted(hygiene.orphans()) == [(10, "fork server"), (11, "worker"), (40, "worker")]
