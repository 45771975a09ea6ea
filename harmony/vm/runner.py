"""The VM runner: real captures of a kernel under test in a virtual machine, one boot for all.

The runner interface is :mod:`harmony.runners`'s; the machine is :mod:`harmony.vm.machine`'s and
the agent inside it :mod:`harmony.vm.guest`'s.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from harmony import store
from harmony.core.errors import Interrupted, VmError
from harmony.core.osutil import harmony_python
from harmony.hostfacts import KERNEL_CONFIG_ENV
from harmony.hygiene import HostLock, reclaim_stale
from harmony.manifest import new_manifest, now, reason
from harmony.manifest import versions as package_versions
from harmony.run import land, unpack
from harmony.runners import BackgroundAnalysis
from harmony.vm.bundle import guest_command, write_bundle
from harmony.vm.guest import PlannedRun, job_line, write_job
from harmony.vm.kernels import kernel_config_text
from harmony.vm.machine import (
    QemuSetting,
    VirtualMachine,
    ended_from_outside,
    guest_error,
    make_job_dir,
    renice_threads,
    topology_facts,
    vcpu_threads,
    vcpu_times,
    versions,
    wait_fractions,
)
from harmony.workload.controller import warm_s


def configured_s(run: PlannedRun) -> float:
    """The seconds a planned run is configured to measure, a warm release's warm-up included."""
    return float(run.params.get("duration", 0)) + (warm_s(run.params) or 0.0)


class VmRunner(BackgroundAnalysis):
    """Real captures of a kernel under test in a virtual machine, one boot for all of them.

    ``capture`` plans a run (its companions first: :class:`harmony.vm.guest.PlannedRun`) into its
    directory; ``flush`` makes every capture planned since the last flush: the first boots
    ``kernel`` (:class:`harmony.vm.kernels.Kernel`) with ``vcpus`` vCPUs, and the guest agent makes
    the captures of each flush, sent to it as one job on its input. The host lands each one
    (:func:`harmony.run.land`), completes its manifest (the kernel under test from the guest's
    facts as ``under_test``, the host's own facts as ``host``, the VM as ``vm`` with how long each
    vCPU waited for a host CPU over the run's window, and that window on the host's clock and on
    the guest's) as the guest says it is written, and analyses it in a background analyser on
    the host (:class:`harmony.runners.BackgroundAnalysis`), started once the guest has booted
    and stopped (``pause``) in each window, from the guest's ``measuring`` (before the release
    and its warm-up) to its ``measured``: nothing of Harmony's runs on the host beside a
    measurement, and it analyses in the guest's set-ups and teardowns instead of after the VM.
    What is left when the runner is drained (``drain``) is analysed beside it, one process per
    CPU. ``overlap`` False: no background analyser, every capture analysed after the VM exits;
    ``pause`` False: it is not stopped in the windows (at SCHED_IDLE beside them). The host lock
    is held from enter to exit: the vCPUs are the measurement.

    Rounds: ``flush`` may be called any number of times in one boot. The first flush's runs go
    to the guest agent as a job file at the boot; the guest then stays up, waiting for its next
    job on virtme-ng's ``virtme.stdin`` virtio-serial line (:func:`harmony.vm.guest.job_input`);
    each flush returns once its runs are landed, so that a caller can ``drain`` (analyse) them
    and plan more. A flush boots again where the guest has no such line (a kernel without
    virtio_console: its agent ended after its first job), and where its runs lie outside the
    boot's writable directory (where the first flush's runs' directories are). The VM ends when
    the runner is left (the agent told to end, it ends and the VM powers off; killed if it does
    not within :data:`END_TIMEOUT_S`), and at once if the controller dies
    (:mod:`harmony.vm.reaper`).
    Suite and batch code need not know: leaving the runner flushes and drains as before.

    A failed boot, a guest that panics, hangs or whose agent fails, QEMU killed, Ctrl-C: the runs
    of that flush not captured are marked incomplete with the reason (the error names the kernel
    and, where the guest said why, the guest's own error), the ones captured before are still
    analysed (not after Ctrl-C or SIGTERM), and the error is raised; a later flush boots again.
    """

    #: a run's time beyond its measured window in the guest (its start, the workers, the probe
    #: and their stop under TCG), before the host calls the guest hung
    RUN_MARGIN_S = 180.0
    #: how long the VM may take to end once its input is closed
    END_TIMEOUT_S = 60.0

    def __init__(self, kernel, vcpus: int, memory_mb: int = 2048, setting=None,
                 probe: str = "tracefs", facts: dict | None = None, say=None, scx=None,
                 topology=None, overlap: bool = True, pause: bool = True):
        if topology is not None:        # harmony.vm.topology.VmTopology: its vCPUs, its nodes
            vcpus, memory_mb = topology.vcpus, topology.vm_memory_mb(memory_mb)
        self.topology = topology
        self.kernel, self.vcpus, self.memory_mb, self.setting = kernel, vcpus, memory_mb, setting
        self.scx = scx      # a sched_ext scheduler for every run (harmony.vm.scx.ScxSpec), or None
        self.probe, self.facts = probe, facts or {}
        self.say = say or (lambda line: None)
        self.progress = None    # a suite's Progress: told of each run as the guest makes it
        shape = f"; {topology.describe()}" if topology is not None else ""
        self.name = f"kernel {kernel.spec} in a VM ({vcpus} vCPUs{shape})"
        self._no_analyser()
        self.overlap, self.pause = overlap, pause
        self.analysis = ("on the host after the VM exits, one process per CPU" if not overlap
                         else "on the host between the guest's measurements (stopped while it "
                         "measures), the rest after the VM exits" if pause
                         else "on the host as the guest captures (at SCHED_IDLE), the rest after "
                         "the VM exits")
        self.lock = None
        self.planned: list[tuple[object, PlannedRun]] = []   # (experiment, run), in order
        self.groups: list[tuple[list[str], bool]] = []         # (run dirs of a capture, figures)
        self.results: list[dict] = []
        self.system: dict | None = None     # the guest's facts (the kernel under test)
        self.vm: VirtualMachine | None = None
        self.rwdir: Path | None = None      # the boot's writable directory
        self.jobdir: Path | None = None     # what the guest reads besides the host's files
        self.jobs = 0                       # jobs sent in this boot
        self.more = False                   # the boot's agent takes more jobs (its facts say)
        self.agent_modules: str | None = None   # where the agent's Harmony came from (its facts)
        self.boot_s: float | None = None
        self.reniced: list[int] = []        # the vCPU threads given the setting's nice value
        #: the last records of the sched_ext schedulers the guest kept loaded across runs, as
        #: each boot's agent reported them at its end (harmony.vm.guest.Boot.close)
        self.schedulers_ended: list[dict] = []

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
                self._end_vm()
                if exc_type is not None:
                    self._abandon(reason(exc) if exc is not None else "stopped")
                if not stopped:       # what was captured before a VM failed is analysed too
                    self.results = self.drain()
            finally:
                self._end_worker()
                if self.vm is not None:
                    self.vm.stop()
                if self.lock:
                    self.lock.release()
                    self.lock = None
        return False

    def capture(self, exp, params, cpus, out, seed, figures: bool = True) -> None:
        """Plan the run (companions first) for the next flush."""
        out = Path(out)
        dirs = []
        for name, overrides in exp.companions(params).items():
            cp = exp.resolve({**params, **overrides}, cpus)
            dirs.append(self._plan(exp, cp, cpus, out / name, seed))
        dirs.append(self._plan(exp, params, cpus, out, seed))
        self.groups.append((dirs, figures))

    def adopt(self, dirs: list[str], figures: bool = True) -> None:
        """Analyse captures already stored (a resumed suite) with the others."""
        self.pending.append((list(dirs), figures))
        self._hand_out()

    def _plan(self, exp, params, cpus, out: Path, seed) -> str:
        store.make_run_dir(out)
        self.planned.append((exp, PlannedRun.of(exp, params, cpus, out.absolute(), self.probe,
                                                seed, self.scx)))
        return str(out)

    def to_make(self) -> tuple[int, float]:
        """Captures planned and not made yet (companions count), and their configured seconds."""
        runs = [run for _, run in self.planned if not Path(run.dir, "manifest.json").exists()]
        return len(runs), sum(configured_s(run) for run in runs)

    # --- the boot ---

    def _boot(self, rwdir: Path, console: Path, runs: list[PlannedRun]) -> None:
        """Boot the kernel with the guest agent making ``runs`` (its first job, a file) and
        then waiting for more on its input channel (where the guest has one: ``self.more``)."""
        self.rwdir, self.jobs, self.system, self.boot_s, self.more = rwdir, 0, None, None, False
        self.agent_modules = None
        self.jobdir = make_job_dir()
        self._scx_path(runs)
        write_job(self.jobdir / "job.json", runs,
                  self.topology.spec() if self.topology is not None else None)
        argv, env = harmony_python("harmony.vm.agent", str(self.jobdir / "job.json"), "--more",
                                   site=False)
        env = [f"{k}={v}" for k, v in env.items()
               if k.startswith("HARMONY_") or k == "PYTHONPATH"]
        env += self._kernel_config()
        command = guest_command(write_bundle(self.jobdir), ["PYTHONDONTWRITEBYTECODE=1", *env],
                                argv)
        self.vm = VirtualMachine(self.kernel, self.vcpus, self.memory_mb, self.setting,
                                 console_log=console, topology=self.topology)
        shape = f" ({self.topology.describe()})" if self.topology is not None else ""
        self.say(f"booting {self.kernel.describe()} with {self.vcpus} vCPUs{shape}")
        self.vm.start(command, rwdir, scratch=self.jobdir)
        self.jobs = 1

    def _kernel_config(self) -> list[str]:
        """The kernel's config for the guest's facts (its HZ, preemption model), in the job
        directory: the guest sees neither a Debian kernel's boot/config beside its image (the
        kernel cache is under a tmpfs there) nor, as its own /boot, anything but the host's.
        The environment setting that names it, or none where the kernel has no config."""
        text = kernel_config_text(self.kernel)
        if text is None:
            return []
        path = self.jobdir / "kernel-config"
        path.write_text(text)
        return [f"{KERNEL_CONFIG_ENV}={path}"]

    def _scx_path(self, runs: list[PlannedRun]) -> None:
        """The guest sees the host's files but not all (virtme-ng mounts a tmpfs over
        /var/cache, where the kernel cache is): the scheduler goes in the job directory."""
        if self.scx is None:
            return
        copy = self.jobdir / Path(self.scx.path).name
        if not copy.exists():
            shutil.copy2(self.scx.path, copy)
        for run in runs:
            run.scx = {**run.scx, "path": str(copy)}

    def _end_vm(self) -> None:
        """End this boot: the agent's input closed, the VM waited for, then killed; the job
        directory removed."""
        if self.vm is not None:
            if self.more and self.vm.running:
                try:
                    self.vm.send(json.dumps({"end": True}))
                except VmError:
                    pass            # gone already: finish() says how it ended
            self.vm.finish(self._at_end, self.END_TIMEOUT_S)
        if self.jobdir is not None:
            shutil.rmtree(self.jobdir, ignore_errors=True)
            self.jobdir = None

    def _at_end(self, ev: dict, t: float) -> None:
        """An agent's line after its last job: the kept schedulers' last records."""
        if ev.get("event") == "schedulers":
            self.schedulers_ended += list(ev.get("records") or [])

    def _stopped_why(self, state: dict) -> str:
        """Why the guest agent stopped before the end of its job, in one line."""
        said = state["fatal"] or state["errors"].get(None)
        if said is None and ended_from_outside(self.vm):
            return (f"kernel {self.kernel.spec}: QEMU died or was killed before the end of its "
                    "runs (the guest neither said why nor powered off; exit "
                    f"{self.vm.returncode})")
        if said is None and self.vm is not None:
            said = guest_error(self.vm.console_tail)
        return (f"kernel {self.kernel.spec}: the guest agent stopped before the end of its runs"
                + (f": {said}" if said else "")
                + (f" (exit {self.vm.returncode})" if self.vm and self.vm.returncode else ""))

    @staticmethod
    def _state(todo: list) -> dict:
        return {"i": None, "window": {}, "errors": {}, "done": set(), "flushed": False,
                "fatal": None, "todo": todo, "landed": set(), "captured": set()}

    def flush(self) -> None:
        """Make every capture planned since the last flush, in this boot (booting first if
        there is none, or it cannot take more jobs, or these runs lie outside its writable
        directory)."""
        todo = [(exp, run) for exp, run in self.planned if not Path(run.dir, "manifest.json")
                .exists()]
        if not todo:
            return
        runs = [run for _, run in todo]
        # writable in the guest: where these runs' directories are (their parents: the next
        # flush's runs of a batch or suite go beside them); the console log with the runs
        rwdir = Path(os.path.commonpath([str(Path(run.dir).parent) for run in runs]))
        console = Path(os.path.commonpath([run.dir for run in runs])) / "vm-console.log"
        state = self._state(todo)
        on_event = lambda ev, t: self._on_event(ev, t, runs, state)  # noqa: E731
        failure = None
        try:
            if self.vm is not None and (not self.more or not self.vm.running or not all(
                    Path(run.dir).is_relative_to(self.rwdir) for run in runs)):
                self._end_vm()
                self.vm = None
            if self.vm is None:
                self._boot(rwdir, console, runs)
            else:
                self._scx_path(runs)
                self._start_analyser()
                self.vm.send(job_line(runs, self.jobs), within=self._budget(runs, 0))
                self.jobs += 1
            if not self.vm.pump(on_event, until=lambda: state["flushed"] or state["fatal"]) \
                    or state["fatal"]:
                failure = self._stopped_why(state)
        except VmError as exc:
            failure = str(exc)
        except (KeyboardInterrupt, Interrupted) as exc:
            self._land(todo, state, "interrupted (Ctrl-C)" if isinstance(
                exc, KeyboardInterrupt) else str(exc), analyse_landed=False)
            raise
        dead = None
        if failure and self.vm is not None:
            self._end_vm()
            dead, self.vm = self.vm, None       # its facts go in the manifests all the same
        self._land(todo, state, failure, vm=dead, died=failure is not None)
        if failure:
            raise VmError(failure)

    def _budget(self, runs: list[PlannedRun], i: int) -> float:
        """The seconds the guest has for its next line once run ``i`` is next."""
        if not runs:
            return self.RUN_MARGIN_S
        return float(runs[min(i, len(runs) - 1)].params.get("duration", 0)) + self.RUN_MARGIN_S

    def _on_event(self, ev: dict, t: float, runs: list[PlannedRun], state: dict):
        """One line of the guest agent (see harmony.vm.guest); returns the seconds the guest has
        for its next line."""
        kind, i = ev.get("event"), ev.get("run")
        if ev.get("job") is not None and ev["job"] != self.jobs - 1:
            return None                     # an older job's line (none is expected)
        budget = None
        if kind == "facts":
            self._booted(ev)
        elif kind == "start" and i is not None:
            state["i"] = i
            if self.progress is not None:
                self.progress.show(f"{Path(runs[i].dir).name}: {runs[i].experiment}")
            else:
                self.say(f"[{i + 1}/{len(runs)}] {Path(runs[i].dir).name}: {runs[i].experiment}")
        elif kind == "measuring" and i is not None:
            threads = vcpu_threads(self.vm.qemu_pid, self.vcpus) if self.vm.qemu_pid else {}
            state["window"][i] = {"t0": t, "threads": threads, "guest_t0": ev.get("mono_ns"),
                                  "before": vcpu_times(self.vm.qemu_pid, threads)}
            if self.pause:
                self._pause_worker()        # within the warm-up that precedes t0
            budget = float(runs[i].params.get("duration", 0)) + self.RUN_MARGIN_S
        elif kind == "measured" and i is not None and i in state["window"]:
            self._resume_worker()
            w = state["window"][i]
            w["seconds"] = t - w["t0"]
            w["after"] = vcpu_times(self.vm.qemu_pid, w["threads"])
            if w["guest_t0"] is not None and ev.get("mono_ns") is not None:
                w["guest_seconds"] = (ev["mono_ns"] - w["guest_t0"]) / 1e9
        elif kind == "error":
            self._resume_worker()           # a run that failed in its window says no "measured"
            state["errors"][i] = ev.get("message", "?")
            self.say(f"run {'?' if i is None else i + 1} failed in the guest: "
                     f"{ev.get('message')}")
        elif kind == "fatal":
            state["fatal"] = ev.get("message", "?")
        elif kind == "done" and i is not None:
            state["done"].add(i)
            if 0 <= i < len(state["todo"]):     # written: landed now, analysed meanwhile
                if "vm_facts" not in state:     # QEMU's and virtme-ng's versions: asked once
                    state["vm_facts"] = self._vm_record(self.vm)
                self._land_run(i, state, state["vm_facts"])
                self._hand_landed(state, complete=True)
        elif kind == "flushed":
            state["flushed"] = True
        if kind in ("done", "error", "start") and budget is None:
            budget = self._budget(runs, (i if i is not None else -1) + 1)
        if kind in ("done", "error") and self.progress is not None and i is not None:
            self.progress.finished(configured_s(runs[i]))
        return budget

    def _booted(self, ev: dict) -> None:
        """The agent's facts: the boot is over."""
        self.system = {k: v for k, v in ev.get("facts", {}).items()}
        self.boot_s = self.vm.boot_s
        self.more = bool(ev.get("more"))
        self.agent_modules = ev.get("modules")
        if self.vm.setting.nice and self.vm.qemu_pid:
            self.reniced = renice_threads(self.vm.qemu_pid,
                                          vcpu_threads(self.vm.qemu_pid, self.vcpus),
                                          self.vm.setting.nice)
        self._start_analyser()
        self.say(f"booted {self.system.get('kernel')} ({self.system.get('scheduler')}, "
                 f"{self.system.get('ncpus')} CPUs) in {self.boot_s:.1f} s; "
                 f"{self.vm.accel.upper()}")
        if self.progress is not None:
            self.progress.booted()

    def _start_analyser(self) -> None:
        """The background analyser, once the guest has booted (again after a drain ended it).

        After the boot, not beside it: loading its libraries as the guest booted made the boot
        1.3-2 s longer (QEMU serves the guest's reads of the host's files then), even at
        SCHED_IDLE. No CPU of the host is the VM's alone (:meth:`_analyser_cpus`): it runs under
        SCHED_IDLE at nice 19 anywhere, and is stopped in every window (``pause``)."""
        if self.overlap and self.worker is None:
            self._start_worker()
            self._hand_out()

    def host_vm_facts(self, vm: VirtualMachine | None = None) -> dict:
        """The manifest's ``vm`` facts known on the host, whatever became of the guest: the VM's
        own (:meth:`VirtualMachine.describe`: the kernel asked for, its accelerator, vCPUs,
        memory, QEMU setting and options, topology, QEMU's and virtme-ng's versions) where one
        was made, else what this runner was asked for (no accelerator: none was chosen)."""
        if vm is not None:
            return vm.describe()
        setting = self.setting or QemuSetting()
        return {"kernel": self.kernel.to_dict(), "accelerator": None, "accelerator_why": None,
                "vcpus": self.vcpus, "memory_mb": self.memory_mb, "qemu_setting": setting.text(),
                "qemu_setting_why": None, "qemu_options": None,
                "topology": topology_facts(self.topology), **versions()}

    def _vm_record(self, vm: VirtualMachine | None, died: str | None = None) -> dict:
        """A manifest's ``vm``: :meth:`host_vm_facts`, the boot's time, where the agent's Harmony
        came from (``agent_modules``: its bundle, :mod:`harmony.vm.bundle`, or the shared tree;
        None before its facts), the nice value the vCPU threads had over the runs (the
        setting's, where it was given), and ``died`` (None, or how the guest died, with the
        VM's exit status)."""
        return {**self.host_vm_facts(vm), "boot_s": self.boot_s,
                "agent_modules": self.agent_modules,
                "vcpu_nice": vm.setting.nice if vm and self.reniced else 0,
                "died": None if died is None else {
                    "why": died, "exit_status": vm.returncode if vm else None,
                    "booted": self.system is not None}}

    def _land(self, todo, state: dict, failure: str | None, analyse_landed: bool = True,
              vm: VirtualMachine | None = None, died: bool = False) -> None:
        """Complete the manifest of each run not landed yet (:meth:`_land_run`); runs not
        captured are marked incomplete. ``vm``: the VM of these runs where it is no longer
        ``self.vm`` (ended after a failure); ``died``: the guest died or failed before the end
        of its job (``failure`` says how), recorded in each manifest's ``vm.died`` with the VM's
        exit status. ``analyse_landed``: the captures landed go to the analysis."""
        vm_facts = self._vm_record(vm or self.vm, failure if died else None)
        for i in range(len(todo)):
            if i not in state["landed"]:
                self._land_run(i, state, vm_facts, failure)
        if analyse_landed:
            self._hand_landed(state, complete=False)
        self.groups = []

    def _hand_landed(self, state: dict, complete: bool) -> None:
        """The planned captures whose runs are landed go to the analysis (their captured runs,
        in order); ``complete``: only those of which every run is landed."""
        landed = {str(Path(state["todo"][i][1].dir).absolute()) for i in state["landed"]}
        keep = []
        for dirs, figures in self.groups:
            if complete and not all(str(Path(d).absolute()) in landed for d in dirs):
                keep.append((dirs, figures))
                continue
            kept = [d for d in dirs if str(Path(d).absolute()) in state["captured"]]
            if kept:
                self.pending.append((kept, figures))
        self.groups = keep
        self._hand_out()

    def _land_run(self, i: int, state: dict, vm_facts: dict, failure: str | None = None) -> None:
        """Complete run ``i``'s manifest on the host (the guest's facts, the host's, the VM's
        with the run's window) and land its tables (:func:`harmony.run.land`); a run not
        captured is marked incomplete (``failure``: why the guest stopped, if it did)."""
        exp, run = state["todo"][i]
        state["landed"].add(i)
        path = Path(run.dir)
        broken, t_land = None, time.monotonic()
        try:
            unpack(path)                # the run as the guest handed it over (harmony.run.Staged)
        except store.RunError as exc:
            broken = str(exc)
        try:
            manifest = store.read_json(path / "manifest.json")
        except store.RunError:
            manifest = new_manifest(exp, run.params, run.cpus, run.probe, run.seed,
                                    self.system or {})
        guest = manifest.pop("host", None)
        # a guest that died before it said its facts: the kernel asked for, said as such
        manifest["under_test"] = self.system or guest or {
            "kernel": self.kernel.release, "facts_from": "the kernel asked for (the guest "
            "said none)"}
        if manifest.get("scx"):         # the host's path, not the copy the guest ran
            manifest["scx"] = {**manifest["scx"], "path_in_guest": manifest["scx"]["path"],
                               "path": self.scx.path}
        if manifest.get("scx") and guest:   # the scheduler the run had, not the boot's
            manifest["under_test"] = {**manifest["under_test"],
                                      "scheduler": guest.get("scheduler"),
                                      "sched_ext": guest.get("sched_ext")}
        manifest["host"] = self.facts
        manifest["versions"] = package_versions()  # the agent sees no site dir (python -S)
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
                manifest["vm"]["land_s"] = round(time.monotonic() - t_land, 4)
                state["captured"].add(str(path.absolute()))
            except store.RunError as exc:
                manifest["status"] = "incomplete"
                manifest["incomplete_reason"] = f"its tables could not be landed: {exc}"
        else:
            why = (state["errors"].get(i) or broken or failure
                   or "the guest did not capture it")
            if manifest.get("status") == "incomplete" and manifest.get("incomplete_reason"):
                why = manifest["incomplete_reason"] + (f"; {failure}" if failure else "")
            manifest["status"] = "incomplete"
            manifest["incomplete_reason"] = why
            manifest.setdefault("ended_at", now())
        store.write_json(path / "manifest.json", manifest)

    def _abandon(self, why: str) -> None:
        """Leaving on an error before the boot: what was planned is marked incomplete."""
        for exp, run in self.planned:
            path = Path(run.dir) / "manifest.json"
            if not path.exists():
                m = new_manifest(exp, run.params, run.cpus, run.probe, run.seed, {},
                                 status="incomplete")
                m["incomplete_reason"] = why
                m["vm"] = self._vm_record(self.vm)
                store.write_json(path, m)

    def drain(self) -> list[dict]:
        """Finish the analysis of every landed capture: what the background analyser was handed,
        and the rest beside it, one process per CPU (nothing is measured any more)."""
        left = sum(len(d) for d, _ in self.pending + self.handed)
        if left:
            self.say(f"analysing {left} runs on the host")
        return super().drain()
