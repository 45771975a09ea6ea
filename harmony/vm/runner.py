"""The VM runner: real captures of a kernel under test in a virtual machine, one boot for all.

The runner interface is :mod:`harmony.runners`'s; the machine is :mod:`harmony.vm.machine`'s and
the agent inside it :mod:`harmony.vm.guest`'s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from harmony import store
from harmony.core.errors import Interrupted, VmError
from harmony.core.osutil import harmony_python
from harmony.hygiene import HostLock, reclaim_stale
from harmony.manifest import new_manifest, now, reason
from harmony.run import land
from harmony.runners import analyse_groups
from harmony.vm.guest import PlannedRun, write_job
from harmony.vm.machine import (
    VirtualMachine,
    renice_threads,
    vcpu_threads,
    vcpu_times,
    wait_fractions,
)


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
                 probe: str = "tracefs", facts: dict | None = None, say=None, scx=None,
                 topology=None):
        if topology is not None:        # harmony.vm.topology.VmTopology: its vCPUs, its nodes
            vcpus, memory_mb = topology.vcpus, topology.vm_memory_mb(memory_mb)
        self.kernel, self.vcpus, self.memory_mb, self.setting = kernel, vcpus, memory_mb, setting
        self.topology = topology
        self.scx = scx      # a sched_ext scheduler for every run (harmony.vm.scx.ScxSpec), or None
        self.probe, self.facts = probe, facts or {}
        self.say = say or (lambda line: None)
        shape = f"; {topology.describe()}" if topology is not None else ""
        self.name = f"kernel {kernel.spec} in a VM ({vcpus} vCPUs{shape})"
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
            write_job(job, runs, self.topology.spec() if self.topology is not None else None)
            argv, env = harmony_python("harmony.vm.guest", str(job))
            env = [f"{k}={v}" for k, v in env.items()
                   if k.startswith("HARMONY_") or k == "PYTHONPATH"]
            command = ["env", "PYTHONDONTWRITEBYTECODE=1", *env, *argv]
            self.vm = VirtualMachine(self.kernel, self.vcpus, self.memory_mb, self.setting,
                                     console_log=rwdir / "vm-console.log",
                                     topology=self.topology)
            shape = f" ({self.topology.describe()})" if self.topology is not None else ""
            self.say(f"booting {self.kernel.describe()} with {self.vcpus} vCPUs{shape}")
            failure = None
            try:
                self.vm.run(command, rwdir, lambda ev, t: self._on_event(ev, t, runs, state))
                if not state["ended"]:      # the agent's own word where it gave one
                    failure = (f"kernel {self.kernel.spec}: " + state["errors"][None]
                               if state["errors"].get(None) else
                               f"kernel {self.kernel.spec}: the guest agent stopped before the "
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
