"""Runners: what makes the runs of a batch or a suite, and analyses them.

A runner is a context manager; inside it ``capture(exp, params, cpus, out, seed)`` records one
run (its companions first) and the runner analyses it; ``flush`` makes the captures it may have
only planned so far; ``drain`` analyses what is left and returns one result row per run.

- :class:`SimRunner`: runs under a reference policy (:mod:`harmony.simulate`), no kernel;
- :class:`KernelRunner`: real captures on this host (:func:`harmony.run.capture`), the host lock
  held from enter to exit; it analyses either in a background process (``python -m
  harmony.analyser``) while the next run is captured (``overlap``, on CPUs outside the
  experiment's set) or after the last capture, in one process per CPU;
- :class:`harmony.vm.runner.VmRunner`: real captures of a kernel under test in a virtual machine.

:func:`analyse_groups` is the analysis of captures once nothing is measured any more, one process
per CPU; every runner ends with it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil

from harmony import simulate
from harmony.analysis.refpolicy import get_policy
from harmony.core.errors import Interrupted
from harmony.analyser import DONE, READY, analyse_group
from harmony.core.osutil import harmony_python
from harmony.hygiene import HostLock, reclaim_stale
from harmony.pipeline import analyse
from harmony.probes import get_probe
from harmony.run import capture


class SimRunner:
    """Runs under a reference policy (:mod:`harmony.analysis.refpolicy`); analysis in-process."""

    #: a run takes what the simulator needs, not its configured duration (Progress's estimate)
    realtime = False

    def __init__(self, policy: str, topology: dict | None = None):
        self.policy = get_policy(policy)
        self.topology = topology    # the simulated machine (harmony.analysis.machines), or None
        self.name = f"simulated: {self.policy.name}"
        self.overlap = False
        self.analysis = "in line"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def capture(self, exp, params, cpus, out, seed, figures: bool = True) -> None:
        simulate.execute(self.policy, exp, params, cpus, out, seed, figures=figures,
                         topology=self.topology)

    def adopt(self, dirs: list[str], figures: bool = True) -> None:
        """Analyse captures already stored (a resumed suite), in order."""
        for d in dirs:
            analyse(Path(d), figures=figures)

    def flush(self) -> None:
        """Nothing waits: each run was simulated when asked."""

    def drain(self) -> list[dict]:
        return []


class BackgroundAnalysis:
    """A runner's background analyser (:mod:`harmony.analyser`): the captures handed to it are
    analysed while the runner goes on, and what is left when the runner is drained is analysed
    beside it, one process per CPU.

    With ``pause``, the runner stops it (SIGSTOP, and seen stopped) while a run is measured and
    continues it after (:meth:`_pause_worker`, :meth:`_resume_worker`); a paused analyser is
    handed at most :data:`AHEAD` captures at a time, so that what it was not handed is analysed
    beside it at the end. A runner without one (``worker`` None) analyses all when drained.
    """

    AHEAD = 2  # captures handed to a paused analyser before it reports one done

    def _no_analyser(self) -> None:
        self.worker: subprocess.Popen | None = None
        self.pending: list[tuple[list[str], bool]] = []  # (run dirs in order, draw figures)
        self.handed: list[tuple[list[str], bool]] = []  # given to the analyser, not yet done
        self._out = b""                  # its output not yet parsed (a partial line)
        self._ready = False              # it said READY: its death signal is armed
        self._results: list[dict] = []
        self.while_analysing = None  # called while the drained analysis runs (analyse_groups)

    def _end_worker(self) -> None:
        """Kill the analyser if it is still there (drain finishes it; an error or a stop did not
        let drain run): what it did not report done stays "captured", for ``--resume``."""
        if self.worker is not None:
            self.worker.kill()
            self.worker.wait()
            self.worker = None

    def _analyser_cpus(self) -> list[int]:
        """The CPUs the analyser may have to itself (none: it runs anywhere, under SCHED_IDLE at
        nice 19)."""
        return []

    def _start_worker(self) -> None:
        """Start the analyser (on :meth:`_analyser_cpus`)."""
        argv, env = harmony_python("harmony.analyser",
                                   env=dict(os.environ, HARMONY_ANALYSER_CPUS=",".join(
                                       map(str, self._analyser_cpus()))))
        # a plain child process (a KernelRunner starts it before any capture: no threads in the
        # controller, which forks the workers). In a session of its own: Ctrl-C at the terminal
        # is for the controller, which drains it or, dying, kills it (osutil.die_with_parent)
        self.worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                       start_new_session=True)
        self._ready = False
        os.set_blocking(self.worker.stdout.fileno(), False)

    def _hand_out(self) -> None:
        """Collect what the background analyser reported, and hand it captures up to AHEAD."""
        if self.worker is None:
            return
        self._read_worker()
        # on CPUs of its own it analyses all the time: it gets every capture at once
        limit = self.AHEAD if self.pause else len(self.pending) + len(self.handed)
        while self.pending and len(self.handed) < limit:
            jobs, figures = self.pending.pop(0)
            self.handed.append((jobs, figures))
            try:
                self.worker.stdin.write(("\t".join([str(int(figures))] + jobs) + "\n").encode())
                self.worker.stdin.flush()
            except OSError:  # it died: its captures are analysed on exit
                self._lose_worker()
                return

    def _read_worker(self, until_eof: bool = False) -> None:
        """Parse the analyser's output lines: READY first, then "status<TAB>path[<TAB>error]" per
        run directory and DONE after each capture. ``until_eof``: wait for it to exit."""
        fd = self.worker.stdout.fileno()
        if until_eof:
            os.set_blocking(fd, True)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._out += chunk
        *lines, self._out = self._out.split(b"\n")
        for line in lines:
            if line == READY:
                self._ready = True
                continue
            if line == DONE:  # captures are reported in the order they were handed
                self.handed.pop(0)
                continue
            status, _, rest = line.decode().partition("\t")
            path, _, msg = rest.partition("\t")
            self._results.append({"status": status, "path": path, "error": msg or None})

    def _pause_worker(self) -> None:
        """Stop the analyser (and what it forked) and wait until the kernel says it is stopped
        (state T); one that has not said READY (its death signal armed: stopped before, it would
        outlive a killed runner) or does not stop within a second is killed and its captures
        analysed on exit instead."""
        if self.worker is None:  # lost at an earlier pause of this capture's companions
            return
        deadline = time.monotonic() + 1.0
        while not self._ready and time.monotonic() < deadline:
            self._read_worker()
            if not self._ready:
                time.sleep(0.001)
        if not self._ready:
            self._lose_worker()
            return
        pid = self.worker.pid
        # its process group (its session's: start_new_session), so that the processes it forked
        # to write a run's figures (analysis.plots.written_in_parallel) stop with it
        os.killpg(pid, signal.SIGSTOP)
        while time.monotonic() < deadline:
            if _proc_state(pid) in ("T", "Z", None):
                return
            time.sleep(0.0002)
        self._lose_worker()

    def _resume_worker(self) -> None:
        if self.worker is not None:
            os.killpg(self.worker.pid, signal.SIGCONT)

    def _lose_worker(self) -> None:
        """Kill the analyser; what it had not reported done is analysed on exit."""
        self.worker.kill()
        self.worker.wait()
        self._read_worker()
        self.worker = None
        self.pending[:0] = self._take_back()   # to the front of the queue

    def _take_back(self) -> list[tuple[list[str], bool]]:
        """The captures handed to an analyser that will not finish them, whole: what it reported
        of them is dropped, so that each directory is reported once, by whoever analyses it."""
        back, self.handed = self.handed, []
        redo = {d for jobs, _ in back for d in jobs}
        self._results = [r for r in self._results if r["path"] not in redo]
        return back

    def drain(self) -> list[dict]:
        """Finish every analysis; returns one dict per directory analysed since the last drain
        (status, path, error)."""
        pending, self.pending = self.pending, []
        if self.worker is None:
            results = analyse_groups(pending, len(os.sched_getaffinity(0)), self.while_analysing)
            return self._told(results)
        # the analyser finishes what it was handed while the rest is analysed beside it
        self._resume_worker()
        try:
            self.worker.stdin.close()
        except OSError:
            pass  # it died; what it reported stands, and _lose_worker is not needed at the end
        results = analyse_groups(pending, len(os.sched_getaffinity(0)), self.while_analysing)
        if len(pending) <= 1 and self.while_analysing is not None:
            self.while_analysing()  # analyse_groups ran it only beside several processes
        self._read_worker(until_eof=True)
        self.worker.wait()
        self.worker = None
        if self.handed:  # it died before finishing these: analysed here
            results += analyse_groups(self._take_back(), len(os.sched_getaffinity(0)))
        return self._told(results)

    def _told(self, results: list[dict]) -> list[dict]:
        """What the analyser reported since the last drain, then ``results``: each directory is
        told by one drain only (a runner may be drained after each round of captures)."""
        told, self._results = self._results + results, []
        return told


class KernelRunner(BackgroundAnalysis):
    """Real captures (harmony.run.capture) with the host lock held once for all of them.

    ``overlap``: analyse the runs in a background process while the next ones are captured. That
    process runs outside the experiment's CPU set when the host has CPUs outside it, and otherwise
    under SCHED_IDLE at nice 19, so that it only uses CPU time the experiment leaves idle. With
    ``pause`` as well, it is stopped (SIGSTOP, and seen stopped) before each run's workload is
    released and continued once the workload is stopped: it analyses in the gaps between
    measurements only, so nothing runs beside a measurement. Without ``overlap``, the runs are
    captured back to back and analysed when the runner is drained (on exit), in one process per
    CPU.

    A paused background process is handed at most two captures at a time; on exit, what it was
    not handed is analysed in one process per CPU beside it.

    A probe that offers ``session()`` (tracefs: one instance for all runs) keeps it open from
    enter to exit.
    """

    def __init__(self, probe: str = "tracefs", facts: dict | None = None, overlap: bool = True,
                 cpus: list[int] | None = None, pause: bool = False, scx=None):
        self.probe, self.facts, self.overlap, self.pause = probe, facts or {}, overlap, pause
        self.scx = scx      # a sched_ext scheduler for every run (harmony.vm.scx.ScxSpec), or None
        self.cpus = cpus or []
        self.name = f"kernel ({probe})"
        self.analysis = ("between captures (stopped while a run is measured), the rest after the "
                         "last capture" if overlap and pause
                         else "overlapped with the next capture" if overlap
                         else "after the last capture, one process per CPU")
        self.lock = None
        self._no_analyser()
        self._session = contextlib.ExitStack()  # the probe's session, if it has one

    def __enter__(self):

        # held once for every run: captures are told so (lock_held) and no other run slips in
        self.lock = HostLock().acquire()
        try:
            self.reclaimed = reclaim_stale()
            if self.overlap:
                self._start_worker()
            session = getattr(get_probe(self.probe), "session", None)
            if session is not None:
                self._session.enter_context(session())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        # the probe's kernel state goes first; then the analysis, still under the lock. Stopped
        # (Ctrl-C, SIGTERM), the command ends now: the captures not yet analysed stay "captured",
        # for `harmony suite --resume` (or `harmony report`) to analyse, and the analyser is killed
        # below, mid-run if need be (a run is marked complete only once all of it is written).
        # Analysed here, they kept a Ctrl-C waiting 3 s and more, a suite's backlog minutes.
        stopped = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Interrupted))
        try:
            self._session.close()
        finally:
            try:
                if not stopped:
                    self.results = self.drain()
            finally:
                self._end_worker()  # drain did not finish it (an error, a stop): no orphan
                if self.lock:
                    self.lock.release()
                    self.lock = None
        return False

    def _analyser_cpus(self) -> list[int]:
        """The host's CPUs outside the experiment's set."""
        return sorted(set(range(psutil.cpu_count())) - set(self.cpus))

    def capture(self, exp, params, cpus, out, seed, figures: bool = True) -> None:
        """Capture (companions first); the analysis, with figures if ``figures``, follows in the
        background analyser or when the runner is drained."""
        out = Path(out)
        hold = ({"pause": self._pause_worker, "resume": self._resume_worker}
                if self.worker is not None and self.pause else {})
        jobs = []
        for name, overrides in exp.companions(params).items():
            cp = exp.resolve({**params, **overrides}, cpus)
            capture(exp, cp, cpus, out / name, self.probe, seed, self.facts, quiet=True,
                    lock_held=True, scx=self.scx, **hold)
            jobs.append(str(out / name))
        capture(exp, params, cpus, out, self.probe, seed, self.facts, quiet=True, lock_held=True,
                scx=self.scx, **hold)
        jobs.append(str(out))
        self.adopt(jobs, figures)

    def adopt(self, dirs: list[str], figures: bool = True) -> None:
        """Analyse these stored captures (in order: companions first) as if just captured."""
        self.pending.append((list(dirs), figures))
        self._hand_out()

    def flush(self) -> None:
        """Nothing waits: each run was captured when asked."""

def _proc_state(pid: int) -> str | None:
    """The state letter of a process (/proc/PID/stat), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def analyse_groups(groups: list[tuple[list[str], bool]], processes: int,
                   while_waiting=None) -> list[dict]:
    """Analyse captures (see :func:`analyse_group`) in up to ``processes`` forked processes.

    Only for when nothing is being measured: the processes use every CPU. Forked, so they start
    with this process's modules already imported. Results in the order of ``groups``.
    ``while_waiting()``, if given, runs in this process once the others are forked (the last
    ones to finish leave a CPU idle: a suite imports its report's modules there); analysing in
    this process alone, there is no such time and it is not called.
    """
    if processes <= 1 or len(groups) <= 1:
        return [r for g in groups for r in analyse_group(g)]
    # largest captures first, so that the last one to finish is a small one and no CPU idles long
    order = sorted(range(len(groups)), key=lambda i: -_raw_bytes(groups[i][0]))
    with ProcessPoolExecutor(min(processes, len(groups)),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        results = pool.map(analyse_group, [groups[i] for i in order])  # all forked by now
        if while_waiting is not None:
            while_waiting()
        done = dict(zip(order, results))
    return [r for i in range(len(groups)) for r in done[i]]


def _raw_bytes(dirs: list[str]) -> int:
    """Size of what the probes recorded for these runs: the analysis takes time in proportion."""
    return sum(f.stat().st_size for d in dirs for f in (Path(d) / "raw").rglob("*") if f.is_file())
