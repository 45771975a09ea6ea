"""Repetitions: N runs of one configuration in ``<dir>/rep-NN/``, and ``<dir>/batch.json``.

batch.json holds the configuration, the repetitions and, per numeric summary key, the median, IQR
and bootstrap 95% CI over the runs (:func:`harmony.analysis.stats.df_aggregate`);
``figures/reps.png`` shows every run as a point.

Runs are made by a *runner*: :class:`KernelRunner` (real captures), :class:`VmRunner` (real
captures of a kernel under test, in a virtual machine) or :class:`SimRunner` (reference
policies). A runner is a context manager; inside it ``capture`` records one run (its companions
first) and the runner analyses it; ``flush`` makes the captures it may have only planned so far.
The kernel runner holds the host lock from enter to exit and analyses either in a background
process while the next run is captured (``overlap``, on CPUs outside the experiment's set) or
after the last capture, in one process per CPU. The VM runner plans every capture, boots the
kernel once for all of them at ``flush`` (the guest agent, :mod:`harmony.vm.guest`, makes them one
after the other), then lands and analyses them on the host, one process per CPU.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil

from harmony import simulate, store
from harmony.analysis.refpolicy import get_policy
from harmony.analysis.stats import df_aggregate
from harmony.core.errors import Interrupted, VmError
from harmony.core.memory import tune_allocations
from harmony.core.osutil import die_with_parent, harmony_python
from harmony.hygiene import HostLock, reclaim_stale
from harmony.manifest import new_manifest, now, reason
from harmony.pipeline import analyse
from harmony.probes import get_probe
from harmony.run import capture, land
from harmony.vm.guest import PlannedRun, write_job
from harmony.vm.machine import (
    VirtualMachine,
    renice_threads,
    vcpu_threads,
    vcpu_times,
    wait_fractions,
)


def rep_dir(out: Path, k: int) -> Path:
    return Path(out) / f"rep-{k:02d}"


class SimRunner:
    """Runs under a reference policy (:mod:`harmony.analysis.refpolicy`); analysis in-process."""

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


class KernelRunner:
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

    AHEAD = 2  # captures handed to a paused analyser before it reports one done

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
        self.worker: subprocess.Popen | None = None
        self.pending: list[tuple[list[str], bool]] = []  # (run dirs in order, draw figures)
        self.handed: list[tuple[list[str], bool]] = []  # given to the analyser, not yet done
        self._out = b""                  # its output not yet parsed (a partial line)
        self._results: list[dict] = []
        self.while_analysing = None  # called while the drained analysis runs (analyse_groups)
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

    def __exit__(self, *exc):
        # the probe's kernel state goes first; then the analysis, still under the lock
        try:
            self._session.close()
        finally:
            try:
                self.results = self.drain()
            finally:
                if self.worker is not None:  # drain did not finish it (an error): no orphan
                    self.worker.kill()
                    self.worker.wait()
                    self.worker = None
                if self.lock:
                    self.lock.release()
                    self.lock = None
        return False

    def _start_worker(self):
        outside = sorted(set(range(psutil.cpu_count())) - set(self.cpus))
        argv, env = harmony_python("harmony.batch", "--analyser",
                                   env=dict(os.environ, HARMONY_ANALYSER_CPUS=",".join(
                                       map(str, outside))))
        # a plain child process, started before any capture: no threads in the controller, which
        # forks the workers. In a session of its own: Ctrl-C at the terminal is for the controller,
        # which drains it or, dying, kills it (osutil.die_with_parent)
        self.worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                       start_new_session=True)
        os.set_blocking(self.worker.stdout.fileno(), False)

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
        """Parse the analyser's output lines: "status<TAB>path[<TAB>error]" per run directory,
        and DONE after each capture. ``until_eof``: wait for it to exit."""
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
            if line == DONE:  # captures are reported in the order they were handed
                self.handed.pop(0)
                continue
            status, _, rest = line.decode().partition("\t")
            path, _, msg = rest.partition("\t")
            self._results.append({"status": status, "path": path, "error": msg or None})

    def _pause_worker(self) -> None:
        """Stop the analyser and wait until the kernel says it is stopped (state T); one that
        does not stop within a second is killed and its captures analysed on exit instead."""
        if self.worker is None:  # lost at an earlier pause of this capture's companions
            return
        pid = self.worker.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if _proc_state(pid) in ("T", "Z", None):
                return
            time.sleep(0.0002)
        self._lose_worker()

    def _resume_worker(self) -> None:
        if self.worker is not None:
            os.kill(self.worker.pid, signal.SIGCONT)

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
        """Finish every analysis; returns one dict per analysed directory (status, path, error)."""
        pending, self.pending = self.pending, []
        if self.worker is None:
            return self._results + analyse_groups(pending, len(os.sched_getaffinity(0)),
                                                  self.while_analysing)
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
        return self._results + results


class VmRunner:
    """Real captures of a kernel under test in a virtual machine, one boot for all of them.

    ``capture`` plans a run (its companions first: :class:`harmony.vm.guest.PlannedRun`) into its
    directory; ``flush`` (or leaving the runner) boots ``kernel`` (:class:`harmony.vm.kernels.Kernel`)
    with ``vcpus`` vCPUs once, the guest agent makes every planned capture, and the host lands each
    one (:func:`harmony.run.land`), completes its manifest (the kernel under test from the guest's
    facts as ``under_test``, the host's own facts as ``host``, the VM as ``vm`` with how long each
    vCPU waited for a host CPU over the run's window, and that window on the host's clock and on
    the guest's) and analyses it after the VM is gone, one process per CPU. The host lock is held
    from enter to exit: the vCPUs are the measurement.

    A failed boot, a guest that panics or hangs, QEMU killed, Ctrl-C: the runs not captured are
    marked incomplete with the reason (the error names the kernel), the ones captured before are
    still analysed (not after Ctrl-C or SIGTERM), and the error is raised.
    """

    #: a run's time beyond its measured window in the guest (its start, the workers, the probe
    #: and their stop under TCG), before the host calls the guest hung
    RUN_MARGIN_S = 180.0

    def __init__(self, kernel, vcpus: int, memory_mb: int = 2048, setting=None,
                 probe: str = "tracefs", facts: dict | None = None, say=None, scx=None):
        self.kernel, self.vcpus, self.memory_mb, self.setting = kernel, vcpus, memory_mb, setting
        self.scx = scx      # a sched_ext scheduler for every run (harmony.vm.scx.ScxSpec), or None
        self.probe, self.facts = probe, facts or {}
        self.say = say or (lambda line: None)
        self.name = f"kernel {kernel.spec} in a VM ({vcpus} vCPUs)"
        self.overlap = False
        self.analysis = "on the host after the VM exits, one process per CPU"
        self.lock = None
        self.planned: list[tuple[object, PlannedRun]] = []   # (experiment, run), in order
        self.groups: list[tuple[list[str], bool]] = []         # (run dirs of a capture, figures)
        self.ready: list[tuple[list[str], bool]] = []          # landed, to be analysed
        self.results: list[dict] = []
        self.system: dict | None = None     # the guest's facts (the kernel under test)
        self.vm: VirtualMachine | None = None
        self.boot_s: float | None = None
        self.reniced: list[int] = []        # the vCPU threads given the setting's nice value
        self.while_analysing = None

    def __enter__(self):
        self.lock = HostLock().acquire()
        try:
            self.reclaimed = reclaim_stale()
        except BaseException:
            self.lock.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        stopped = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Interrupted))
        try:
            if exc_type is None:
                self.flush()
        except (KeyboardInterrupt, Interrupted):
            stopped = True
            raise
        finally:
            try:
                if exc_type is not None:
                    self._abandon(reason(exc) if exc is not None else "stopped")
                if not stopped:       # what was captured before a VM failed is analysed too
                    self.results = self.drain()
            finally:
                if self.vm is not None:
                    self.vm.stop()
                if self.lock:
                    self.lock.release()
                    self.lock = None
        return False

    def capture(self, exp, params, cpus, out, seed, figures: bool = True) -> None:
        """Plan the run (companions first) for the next boot."""
        out = Path(out)
        dirs = []
        for name, overrides in exp.companions(params).items():
            cp = exp.resolve({**params, **overrides}, cpus)
            dirs.append(self._plan(exp, cp, cpus, out / name, seed))
        dirs.append(self._plan(exp, params, cpus, out, seed))
        self.groups.append((dirs, figures))

    def adopt(self, dirs: list[str], figures: bool = True) -> None:
        """Analyse captures already stored (a resumed suite) with the others, after the boot."""
        self.ready.append((list(dirs), figures))

    def _plan(self, exp, params, cpus, out: Path, seed) -> str:
        store.make_run_dir(out)
        self.planned.append((exp, PlannedRun.of(exp, params, cpus, out.absolute(), self.probe,
                                                seed, self.scx)))
        return str(out)

    # --- the boot ---

    def flush(self) -> None:
        """Boot once and make every capture planned since the last flush."""
        todo = [(exp, run) for exp, run in self.planned if not Path(run.dir, "manifest.json")
                .exists()]
        if not todo:
            return
        rwdir = Path(os.path.commonpath([run.dir for _, run in todo]))
        state = {"i": None, "window": {}, "errors": {}, "done": set(), "ended": False}
        runs = [run for _, run in todo]
        jobdir = Path(tempfile.mkdtemp(prefix="harmony-vm-"))
        try:
            job = jobdir / "job.json"
            if self.scx is not None:
                # the guest sees the host's files but not all (virtme-ng mounts a tmpfs over
                # /var/cache, where the kernel cache is): the scheduler goes with the job
                shutil.copy2(self.scx.path, jobdir / Path(self.scx.path).name)
                for run in runs:
                    run.scx = {**run.scx, "path": str(jobdir / Path(self.scx.path).name)}
            write_job(job, runs)
            argv, env = harmony_python("harmony.vm.guest", str(job))
            env = [f"{k}={v}" for k, v in env.items()
                   if k.startswith("HARMONY_") or k == "PYTHONPATH"]
            command = ["env", "PYTHONDONTWRITEBYTECODE=1", *env, *argv]
            self.vm = VirtualMachine(self.kernel, self.vcpus, self.memory_mb, self.setting,
                                     console_log=rwdir / "vm-console.log")
            self.say(f"booting {self.kernel.describe()} with {self.vcpus} vCPUs")
            failure = None
            try:
                self.vm.run(command, rwdir, lambda ev, t: self._on_event(ev, t, runs, state))
                if not state["ended"]:
                    failure = (f"kernel {self.kernel.spec}: the guest agent stopped before the "
                               "end of its runs")
            except VmError as exc:
                failure = str(exc)
            except (KeyboardInterrupt, Interrupted) as exc:
                self._land(todo, state, "interrupted (Ctrl-C)" if isinstance(
                    exc, KeyboardInterrupt) else str(exc), analyse_landed=False)
                raise
            self._land(todo, state, failure)
            if failure:
                raise VmError(failure)
        finally:
            for f in jobdir.iterdir():
                f.unlink()
            jobdir.rmdir()

    def _on_event(self, ev: dict, t: float, runs: list[PlannedRun], state: dict):
        """One line of the guest agent (see harmony.vm.guest); returns the seconds the guest has
        for its next line."""
        kind, i = ev.get("event"), ev.get("run")
        budget = None
        if kind == "facts":
            self.system = {k: v for k, v in ev.get("facts", {}).items()}
            self.boot_s = self.vm.boot_s
            if self.vm.setting.nice and self.vm.qemu_pid:
                self.reniced = renice_threads(self.vm.qemu_pid,
                                              vcpu_threads(self.vm.qemu_pid, self.vcpus),
                                              self.vm.setting.nice)
            self.say(f"booted {self.system.get('kernel')} ({self.system.get('scheduler')}, "
                     f"{self.system.get('ncpus')} CPUs) in {self.boot_s:.1f} s; "
                     f"{self.vm.accel.upper()}")
        elif kind == "start" and i is not None:
            state["i"] = i
            self.say(f"[{i + 1}/{len(runs)}] {Path(runs[i].dir).name}: {runs[i].experiment}")
        elif kind == "measuring" and i is not None:
            threads = vcpu_threads(self.vm.qemu_pid, self.vcpus) if self.vm.qemu_pid else {}
            state["window"][i] = {"t0": t, "threads": threads, "guest_t0": ev.get("mono_ns"),
                                  "before": vcpu_times(self.vm.qemu_pid, threads)}
            budget = float(runs[i].params.get("duration", 0)) + self.RUN_MARGIN_S
        elif kind == "measured" and i is not None and i in state["window"]:
            w = state["window"][i]
            w["seconds"] = t - w["t0"]
            w["after"] = vcpu_times(self.vm.qemu_pid, w["threads"])
            if w["guest_t0"] is not None and ev.get("mono_ns") is not None:
                w["guest_seconds"] = (ev["mono_ns"] - w["guest_t0"]) / 1e9
        elif kind == "error":
            state["errors"][i] = ev.get("message", "?")
            self.say(f"run {'?' if i is None else i + 1} failed in the guest: "
                     f"{ev.get('message')}")
        elif kind == "done" and i is not None:
            state["done"].add(i)
        elif kind == "end":
            state["ended"] = True
        if kind in ("facts", "done", "error", "start") and budget is None:
            nxt = runs[min((i if i is not None else -1) + 1, len(runs) - 1)]
            budget = float(nxt.params.get("duration", 0)) + self.RUN_MARGIN_S
        return budget

    def _land(self, todo, state: dict, failure: str | None, analyse_landed: bool = True) -> None:
        """Complete each run's manifest on the host; runs not captured are marked incomplete."""
        vm_facts = self.vm.describe() if self.vm else {}
        vm_facts["boot_s"] = self.boot_s
        # the nice value the vCPU threads had over the runs (the setting's, where it was given)
        vm_facts["vcpu_nice"] = self.vm.setting.nice if self.vm and self.reniced else 0
        captured = set()
        for i, (exp, run) in enumerate(todo):
            path = Path(run.dir)
            try:
                manifest = store.read_json(path / "manifest.json")
            except store.RunError:
                manifest = new_manifest(exp, run.params, run.cpus, run.probe, run.seed,
                                        self.system or {})
            guest = manifest.pop("host", None)
            manifest["under_test"] = self.system or guest or {}
            if manifest.get("scx"):         # the host's path, not the copy the guest ran
                manifest["scx"] = {**manifest["scx"], "path_in_guest": manifest["scx"]["path"],
                                   "path": self.scx.path}
            if manifest.get("scx") and guest:   # the scheduler the run had, not the boot's
                manifest["under_test"] = {**manifest["under_test"],
                                          "scheduler": guest.get("scheduler"),
                                          "sched_ext": guest.get("sched_ext")}
            manifest["host"] = self.facts
            # the pid of the controller in the guest, and this one: the run's controller here
            manifest["guest_controller_pid"] = manifest.get("controller_pid")
            manifest["controller_pid"] = os.getpid()
            w = state["window"].get(i, {})
            fr = (wait_fractions(w["before"], w["after"], w["seconds"])
                  if "after" in w else {})
            host_s, guest_s = w.get("seconds"), w.get("guest_seconds")
            manifest["vm"] = {**vm_facts, "window_host_s": host_s, "window_guest_s": guest_s,
                              "guest_clock_rate": guest_s / host_s if guest_s and host_s
                              else None,
                              "vcpu_wait_frac": [fr.get(v) for v in range(self.vcpus)] if fr
                              else None,
                              "vcpu_wait_max": max(fr.values()) if fr else None,
                              "vcpu_wait_max_vcpu": max(fr, key=fr.get) if fr else None}
            if manifest.get("status") == "captured":
                try:
                    land(path)
                    captured.add(run.dir)
                except store.RunError as exc:
                    manifest["status"] = "incomplete"
                    manifest["incomplete_reason"] = f"its tables could not be landed: {exc}"
            else:
                why = state["errors"].get(i) or failure or "the guest did not capture it"
                if manifest.get("status") == "incomplete" and manifest.get("incomplete_reason"):
                    why = manifest["incomplete_reason"] + (f"; {failure}" if failure else "")
                manifest["status"] = "incomplete"
                manifest["incomplete_reason"] = why
                manifest.setdefault("ended_at", now())
            store.write_json(path / "manifest.json", manifest)
        if analyse_landed:
            for dirs, figures in self.groups:
                kept = [d for d in dirs if str(Path(d).absolute()) in captured]
                if kept:
                    self.ready.append((kept, figures))
        self.groups = []

    def _abandon(self, why: str) -> None:
        """Leaving on an error before the boot: what was planned is marked incomplete."""
        for exp, run in self.planned:
            path = Path(run.dir) / "manifest.json"
            if not path.exists():
                m = new_manifest(exp, run.params, run.cpus, run.probe, run.seed, {},
                                 status="incomplete")
                m["incomplete_reason"] = why
                store.write_json(path, m)

    def drain(self) -> list[dict]:
        """Analyse every landed capture (one process per CPU: nothing is measured any more)."""
        ready, self.ready = self.ready, []
        if ready:
            self.say(f"analysing {sum(len(d) for d, _ in ready)} runs on the host")
        return analyse_groups(ready, len(os.sched_getaffinity(0)), self.while_analysing)


#: the background analyser's line after each capture it has analysed
DONE = b"\x00done"


def _proc_state(pid: int) -> str | None:
    """The state letter of a process (/proc/PID/stat), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _analyse_group(group: tuple[list[str], bool]) -> list[dict]:
    """Analyse one capture's directories in order (companions before the run that reads them)."""
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


def analyse_groups(groups: list[tuple[list[str], bool]], processes: int,
                   while_waiting=None) -> list[dict]:
    """Analyse captures (see :func:`_analyse_group`) in up to ``processes`` forked processes.

    Only for when nothing is being measured: the processes use every CPU. Forked, so they start
    with this process's modules already imported. Results in the order of ``groups``.
    ``while_waiting()``, if given, runs in this process once the others are forked (the last
    ones to finish leave a CPU idle: a suite imports its report's modules there); analysing in
    this process alone, there is no such time and it is not called.
    """
    if processes <= 1 or len(groups) <= 1:
        return [r for g in groups for r in _analyse_group(g)]
    # largest captures first, so that the last one to finish is a small one and no CPU idles long
    order = sorted(range(len(groups)), key=lambda i: -_raw_bytes(groups[i][0]))
    with ProcessPoolExecutor(min(processes, len(groups)),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        results = pool.map(_analyse_group, [groups[i] for i in order])  # all forked by now
        if while_waiting is not None:
            while_waiting()
        done = dict(zip(order, results))
    return [r for i in range(len(groups)) for r in done[i]]


def _raw_bytes(dirs: list[str]) -> int:
    """Size of what the probes recorded for these runs: the analysis takes time in proportion."""
    return sum(f.stat().st_size for d in dirs for f in (Path(d) / "raw").rglob("*") if f.is_file())


def _analyser_main() -> int:
    """Background analyser: each line is a figures flag (0/1) then the tab-separated run dirs of
    one capture, analysed in order."""
    tune_allocations()  # an entry point of its own: see harmony.core.memory
    cpus = os.environ.get("HARMONY_ANALYSER_CPUS", "")
    try:
        if cpus:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.nice(19)
    except (OSError, AttributeError):
        pass
    # be killed when the controller dies: stopped (SIGSTOP) by it, this process would otherwise
    # never read the end of its input and stay behind
    if not die_with_parent() and os.getppid() == 1:   # nobody is left to feed us
        return 0
    for line in sys.stdin:
        flag, *dirs = line.rstrip("\n").split("\t")
        for r in _analyse_group(([d for d in dirs if d], flag == "1")):
            print("\t".join(v for v in (r["status"], r["path"], r["error"]) if v), flush=True)
        print(DONE.decode(), flush=True)
    return 0




def run_batch(exp, params: dict, cpus: list[int], out: Path, repeat: int, runner, seed: int = 0,
              progress=None, draw_first: bool = True, resume: bool = False) -> list[Path]:
    """Capture ``repeat`` runs into ``out/rep-NN`` (seed, seed+1, ...). Returns the rep dirs.

    Analysis happens in the runner (maybe in the background): call :func:`finish_batch` once the
    runner is drained. The figures of the first repetition are drawn if ``draw_first``; every
    other run's are left to ``harmony report RUN``.

    ``resume``: a repetition already there is not captured again if it is complete (nor analysed)
    or captured (then only analysed); any other (interrupted, incomplete) is moved aside to
    ``rep-NN.incomplete-K`` -- kept, never deleted -- and captured anew.
    """
    out = Path(out)
    store.make_run_dir(out)
    reps = []
    seconds = float(params["duration"]) * (1 + len(exp.companions(params)))
    for k in range(1, repeat + 1):
        d = rep_dir(out, k)
        figures = draw_first and k == 1
        state = _rep_state(d) if resume else None
        if progress:
            progress.show(f"{out.name} rep {k}/{repeat}" + (f" ({state})" if state else ""))
        if state == "captured":             # analysed, not captured again
            runner.adopt([str(d / name) for name in exp.companions(params)] + [str(d)], figures)
        elif state != "complete":
            if state is not None:
                _move_aside(d)
            runner.capture(exp, params, cpus, d, seed + k - 1, figures=figures)
        if progress:
            progress.finished(seconds)
        reps.append(d)
    store.write_json(out / "batch.json", {"experiment": exp.name, "params": params, "cpus": cpus,
                                          "repeat": repeat, "reps": [d.name for d in reps],
                                          "status": "captured"})
    return reps


def _rep_state(d: Path) -> str | None:
    """What a resumed batch finds at ``d``: None (nothing), "complete", "captured" (its
    companions too), else "interrupted" (running, incomplete, unreadable)."""
    if not d.exists():
        return None
    try:
        dirs = [p.parent for p in d.rglob("manifest.json")]
        states = {store.read_json(m / "manifest.json").get("status") for m in dirs}
    except store.RunError:
        return "interrupted"
    if states == {"complete"}:
        return "complete"
    if states and states <= {"complete", "captured"}:
        return "captured"
    return "interrupted"


def _move_aside(d: Path) -> Path:
    """Rename an interrupted repetition out of the way (kept: nothing written is lost)."""
    k = 1
    while (aside := d.with_name(f"{d.name}.incomplete-{k}")).exists():
        k += 1
    d.rename(aside)
    return aside


def finish_batch(out: Path, figures: bool = True) -> dict:
    """Aggregate the analysed repetitions of ``out`` into batch.json and figures/reps.png.

    Repetitions that are not complete are listed with their reason, never silently left out.
    ``figures=False`` leaves figures/reps.png to :func:`draw_batch_figures` (``harmony report
    BATCH``); batch.json says so (``figures_deferred``).
    """
    out = Path(out)
    record = store.read_json(out / "batch.json")
    summaries, failed = [], []
    for name in record["reps"]:
        try:
            run = store.load(out / name)
            summaries.append((name, run.summary))
        except store.RunError as exc:
            failed.append({"rep": name, "reason": str(exc)})
    agg = df_aggregate([s for _, s in summaries])
    agg = agg.astype(object).where(agg.notna(), None)  # no NaN in JSON: None = no value
    record |= {"status": "complete" if not failed else "incomplete", "complete": len(summaries),
               "failed": failed, "aggregates": agg.to_dict(orient="records"),
               "values": {k: [s.get(k) for _, s in summaries] for k in agg["metric"]}}
    record["figures"], record["figures_deferred"] = [], bool(summaries) and not figures
    if figures:
        return draw_batch_figures(out, record)
    store.write_json(out / "batch.json", record)
    return record


def draw_batch_figures(out: Path, record: dict | None = None) -> dict:
    """Draw a finished batch's figures/reps.png and record it in batch.json; returns the record."""
    from harmony.analysis.report_suite import plot_reps

    out = Path(out)
    record = record if record is not None else store.read_json(out / "batch.json")
    figs = []
    if record.get("complete"):
        (out / "figures").mkdir(exist_ok=True)
        p = plot_reps(record, out / "figures" / "reps.png")
        if p:
            figs.append(str(p.relative_to(out)))
    record["figures"], record["figures_deferred"] = figs, False
    store.write_json(out / "batch.json", record)
    return record


def batch_text(record: dict) -> str:
    """Readable aggregates of a batch: one line per metric, median [IQR] (95% CI)."""
    lines = [f"{record['experiment']}: {record['complete']}/{record['repeat']} runs complete", "",
             f"{'metric':34} {'median':>10} {'IQR':>10} {'95% CI of median':>24}  n"]
    for a in record["aggregates"]:
        ci = ("" if a["ci_low"] is None else f"{a['ci_low']:.4g} .. {a['ci_high']:.4g}")
        lines.append(f"{a['metric']:34} {_g(a['median']):>10} {_g(a['iqr']):>10} {ci:>24}  {a['n']}")
    for f in record["failed"]:
        lines.append(f"not complete: {f['rep']}: {f['reason']}")
    return "\n".join(lines)


def _g(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


if __name__ == "__main__" and sys.argv[1:] == ["--analyser"]:
    sys.exit(_analyser_main())
