"""sched_ext schedulers under test: one started before a run's tasks, watched, stopped after.

``harmony run|suite --scx NAME [--scx-args "..."]`` names the scheduler: one of :data:`KNOWN`
(the example schedulers of the kernel tree, built with the ``sched-ext`` kernel:
:func:`harmony.vm.kernels.build`; found in that build's cache directory), one of the scx project's
Rust schedulers (``bpfland``, ``rusty``, ``lavd``: built from their crates by
:mod:`harmony.vm.scx_build`) or the path of an executable (any sched_ext scheduler a user
brings). :func:`resolve` turns that into a :class:`ScxSpec`, with a one-line error for an
unknown name, before anything starts.

For a run (:func:`harmony.run.capture`), a :class:`Scheduler`:

- ``start()``: refuses a kernel without sched_ext (``/sys/kernel/sched_ext`` absent) and a
  scheduler someone else has enabled; stops one a dead Harmony run left (:func:`reclaim_stale`);
  starts the binary with its arguments as a child that the kernel kills with the controller
  (``setpriv --pdeathsig KILL``: PR_SET_PDEATHSIG, kept across its exec), its output in the run
  directory (``scx.log``); waits until ``/sys/kernel/sched_ext/state`` is ``enabled`` and
  ``root/ops`` names it. A scheduler that exits first (the BPF verifier rejected it, its
  arguments are wrong) is a one-line :class:`~harmony.core.errors.ScxError` with its last verifier
  line, or its last line.
- while the run is measured a thread samples the state every :data:`SAMPLE_S` and keeps each
  change (:attr:`Scheduler.states`);
- ``ejected()``: why the kernel ejected it (the state left ``enabled``, or its process is gone),
  from its own ``EXIT: ...`` line (the scx schedulers print the kernel's exit reason), else the
  kernel log's ``sched_ext:`` line, else the state seen; None while it is enabled;
- ``stop()``: SIGINT (it unregisters and reports ``EXIT: unregistered from user space``), then
  SIGKILL after :data:`STOP_TIMEOUT_S`; returns the manifest's ``scx`` record: the scheduler,
  its arguments, its ops name, its pid, the states over the run and whether it was enabled
  throughout.

A record of the scheduler's pid (with its start time and the controller's) is kept under the
lock directory while it runs, so that the next start, or ``harmony clean``, stops one that a
killed controller left loaded (it dies with the controller already; the record covers a
controller that died between the fork and the request).

Real-time tasks that hog a CPU starve the sched_ext tasks queued on it, and the kernel's
watchdog then ejects the scheduler (a "runnable task stall": the scx project's issue 1202).
Harmony's own SCHED_FIFO threads sleep but for short steps (the release is confined or warm
under sched_ext: no occupier spins, :func:`harmony.workload.controller.confined_why`); an
experiment's RT or deadline tasks would hog their CPUs, so :func:`check_classes` refuses
them under --scx.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

from harmony.core.errors import ScxError, UnknownScheduler
from harmony.core.osutil import (
    comm,
    forget_processes,
    proc_starttime,
    record_processes,
    stale_processes,
)
from harmony.hostfacts import SCHED_EXT_DIR, read_text, sched_ext_state, sched_ext_state_word
from harmony.vm import scx_build
from harmony.workload.tasks import RT_POLICIES

#: the schedulers Harmony knows by name: the example schedulers of the kernel tree
KNOWN = {"simple": "scx_simple", "central": "scx_central", "qmap": "scx_qmap",
         "flatcg": "scx_flatcg"}
#: how long a scheduler may take to be enabled (its BPF programs verified and loaded: seconds
#: under QEMU's TCG)
ENABLE_TIMEOUT_S = 60.0
#: how long a scheduler has to stop after SIGINT before SIGKILL
STOP_TIMEOUT_S = 5.0
#: how long a scheduler being unloaded (state "disabling") may take before the next starts
SETTLE_S = 10.0
#: the state's sampling period while a run is measured
SAMPLE_S = 0.25
#: the scheduler's output, in the run directory
LOG_NAME = "scx.log"
#: what the scx schedulers print when they end: "EXIT: <the kernel's reason> (<message>)"
EXIT_LINE = re.compile(r"^EXIT: (.+)$", re.M)
#: libbpf's bracket around the verifier's log of a program it could not load
VERIFIER_END = "-- END PROG LOAD LOG --"
#: libbpf's line naming the program the kernel refused
LOAD_FAILED = re.compile(r"prog '([^']+)': BPF program load failed")
#: a terminal colour or style escape
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass(frozen=True)
class ScxSpec:
    """The scheduler of a run: ``name`` as given (``simple``, or a path), the executable's
    ``path``, its ``args``."""

    name: str
    path: str
    args: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "args": list(self.args)}

    @classmethod
    def from_dict(cls, d: dict) -> "ScxSpec":
        return cls(d["name"], d["path"], tuple(d.get("args", ())))

    def command(self) -> list[str]:
        """The command that starts it: the kernel kills it with the thread that started it."""
        return ["setpriv", "--pdeathsig", "KILL", self.path, *self.args]


def known_names() -> str:
    """The names --scx takes: the kernel tree's examples, then the scx project's Rust ones."""
    return ", ".join([*KNOWN, *scx_build.names()])


def resolve(name: str, args: str | None = None, directory: Path | None = None) -> ScxSpec:
    """The scheduler ``name`` (``simple`` or ``scx_simple``; or an executable's path) with the
    arguments ``args`` (split as a shell would). A name of :data:`KNOWN` is found in
    ``directory`` (the sched-ext kernel build's cache directory), a Rust one where
    ``harmony scx build`` put it (:func:`harmony.vm.scx_build.built`). UnknownScheduler, one line,
    otherwise."""
    try:
        argv = tuple(shlex.split(args or ""))
    except ValueError as exc:
        raise UnknownScheduler(f"--scx-args {args!r}: {exc}") from None
    short = name.removeprefix("scx_")
    if short in KNOWN and "/" not in name:
        if directory is None:
            raise UnknownScheduler(f"scheduler {name}: the sched-ext kernel is not built "
                                   "(harmony kernel build sched-ext), and no path was given")
        path = Path(directory) / KNOWN[short]
        if not os.access(path, os.X_OK):
            raise UnknownScheduler(f"scheduler {name}: {path} is missing from the kernel build")
        return ScxSpec(short, str(path), argv)
    if short in scx_build.names() and "/" not in name:
        built = scx_build.built(short)
        if built is None:
            raise UnknownScheduler(f"scheduler {name} is not built: `harmony scx build {short}` "
                                   "builds it from its crate (1-3 min on 2 CPUs)")
        return ScxSpec(short, str(built), argv)
    if "/" in name or name.startswith("."):
        path = Path(name).absolute()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise UnknownScheduler(f"scheduler {name}: no such executable")
        return ScxSpec(str(path), str(path), argv)
    raise UnknownScheduler(f"unknown scheduler {name!r}: give one of {known_names()} or the "
                           "path of a sched_ext scheduler")


def check_kernel(root: Path | None = None) -> None:
    """ScxError (one line) unless the running kernel has sched_ext."""
    root = Path(SCHED_EXT_DIR if root is None else root)
    if not (root / "state").exists():
        raise ScxError(f"this kernel ({os.uname().release}) has no sched_ext ({root} absent): "
                       "boot one that has (--kernel sched-ext)")


class ScxParameterError(UnknownScheduler):
    """An experiment that cannot run under a sched_ext scheduler (bad input: exit 2)."""


def check_classes(policies) -> None:
    """A one-line refusal of real-time or deadline tasks under a sched_ext
    scheduler (``policies``: the tasks' policies): they would hog their CPUs and get it ejected."""
    bad = sorted({p for p in policies if p in RT_POLICIES or p == "deadline"})
    if bad:
        raise ScxParameterError(
            f"policy={bad[0]} under --scx: real-time and deadline tasks that hog a CPU starve "
            "the sched_ext tasks there and the kernel's watchdog ejects the scheduler (scx "
            "issue 1202); run them without --scx")


def check_params(params: dict) -> None:
    """:func:`check_classes` of an experiment's resolved parameters
    (``policy``, ``<role>_policy``)."""
    check_classes(v for k, v in params.items() if (k == "policy" or k.endswith("_policy")) and v)


def exit_reason(log: str) -> str | None:
    """The reason in the scheduler's last ``EXIT: ...`` line, if it printed one."""
    found = EXIT_LINE.findall(log)
    return found[-1].strip() if found else None


def failure_line(log: str) -> str:
    """What a scheduler that ended before it was enabled said last: when libbpf printed the
    verifier's log, the program rejected and the verifier's reason (its last line before the
    ``processed N insns`` summary, which follows in brackets); else its last line. Terminal
    colours (the Rust schedulers' logs) are left out."""
    lines = [line.strip() for line in ANSI.sub("", log).splitlines() if line.strip()]
    if VERIFIER_END in log:
        before = lines[:lines.index(VERIFIER_END)] if VERIFIER_END in lines else lines
        verifier = [line for line in before if not line.startswith("libbpf:")]
        if verifier:
            summary = [line for line in verifier if line.startswith("processed ")]
            reason = [line for line in verifier if not line.startswith("processed ")]
            prog = next((m.group(1) for m in map(LOAD_FAILED.search, lines) if m), None)
            said = reason[-1] if reason else verifier[-1]
            return (f"verifier rejected {prog or 'a program'}: {said}"
                    + (f" ({summary[-1]})" if summary and reason else ""))
    return lines[-1] if lines else "no output"


def kernel_log_reason() -> str | None:
    """The kernel log's last ``sched_ext:`` line (dmesg), if it can be read."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in out.splitlines() if "sched_ext:" in line]
    return lines[-1].split("sched_ext:", 1)[1].strip() if lines else None


def reclaim_stale() -> list[str]:
    """Stop the schedulers of dead Harmony runs (recorded by
    :func:`~harmony.core.osutil.record_processes` with their start times and their controller's: a
    recycled pid is never signalled); a line per scheduler stopped."""
    out = []
    for _rec, pid in stale_processes("scx"):
        name = comm(pid)
        _stop_pid(pid)
        out.append(f"sched_ext scheduler {pid} ({name}) of a dead run")
    return out


def _stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT, then SIGKILL if it is still there after ``timeout_s`` (not our child: polled)."""
    for sig, wait in ((signal.SIGINT, timeout_s), (signal.SIGKILL, timeout_s)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        give_up = time.monotonic() + wait
        while time.monotonic() < give_up:
            if proc_starttime(pid) is None or comm(pid) == "":
                return
            stat = read_text(Path(f"/proc/{pid}/stat")) or ""
            if ") Z" in stat:
                return
            time.sleep(0.02)


class Scheduler:
    """One sched_ext scheduler for one run (see the module's docstring)."""

    def __init__(self, spec: ScxSpec, log_path: Path, root: Path | None = None,
                 enable_timeout_s: float = ENABLE_TIMEOUT_S):
        self.spec, self.log_path = spec, Path(log_path)
        self.root = Path(SCHED_EXT_DIR if root is None else root)
        self.enable_timeout_s = enable_timeout_s
        self.proc: subprocess.Popen | None = None
        self.ops: str | None = None
        self.enable_s: float | None = None    # from the start to "enabled"
        self.states: list[tuple[float, str]] = []   # (s since enabled, state) at each change
        self._t0 = 0.0
        self._watch: threading.Thread | None = None
        self._stopping = threading.Event()
        self.reclaimed: list[str] = []
        self.record: dict | None = None

    def state(self) -> dict:
        return sched_ext_state(self.root)

    def start(self) -> None:
        check_kernel(self.root)
        self.reclaimed = reclaim_stale()
        now = self.state()
        settle = time.monotonic() + SETTLE_S
        while now["state"] in ("disabling", "enabling") and time.monotonic() < settle:
            time.sleep(0.02)     # the previous run's scheduler is still being unloaded
            now = self.state()
        if now["state"] != "disabled":
            raise ScxError(f"a sched_ext scheduler is {now['state']} already (ops "
                           f"{now['ops'] or '?'}): stop it before a run under --scx")
        t_start = time.monotonic()
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(self.spec.command(), stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise ScxError(f"scheduler {self.spec.name} could not start "
                               f"({exc.strerror})") from None
        self._write_record()
        give_up = t_start + self.enable_timeout_s
        while True:
            now = self.state()
            if now["state"] == "enabled" and now["ops"]:
                break
            if self.proc.poll() is not None:
                self._forget()
                raise ScxError(f"scheduler {self.spec.name} exited before it was enabled "
                               f"(status {self.proc.returncode}): {failure_line(self.log())}"[:500])
            if time.monotonic() > give_up:
                self.stop()
                raise ScxError(f"scheduler {self.spec.name} was not enabled within "
                               f"{self.enable_timeout_s:.0f} s (state {now['state']})")
            time.sleep(0.02)
        self.enable_s = time.monotonic() - t_start
        self.ops, self._t0 = now["ops"], time.monotonic()
        self.states = [(0.0, "enabled")]
        self._watch = threading.Thread(target=self._sample, name="harmony-scx", daemon=True)
        self._watch.start()

    def tids(self) -> list[int]:
        """The thread ids of the scheduler's process ([] once it is gone)."""
        try:
            return [int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task")]
        except (OSError, AttributeError):
            return []

    def _sample(self) -> None:
        # the state file alone (not the ops and switch_all beside it): this thread reads it
        # through every measured window, in the controller's process
        last = "enabled"
        while not self._stopping.wait(SAMPLE_S):
            state = sched_ext_state_word(self.root)
            if state != last:
                self.states.append((round(time.monotonic() - self._t0, 3), state))
                last = state

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def ejected(self) -> str | None:
        """Why the kernel ejected the scheduler, one line; None while it is enabled and its
        process runs."""
        now = self.state()
        gone = self.proc is None or self.proc.poll() is not None
        if now["state"] == "enabled" and now["ops"] == self.ops and not gone:
            return None
        if not gone:                  # it prints the kernel's reason as it ends: a moment
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        why = exit_reason(self.log()) or kernel_log_reason() or f"state {now['state']}"
        if gone and now["state"] == "enabled":
            why = f"its process ended (status {self.proc.returncode}): {why}"
        return why

    def stop(self) -> dict:
        """Stop it (SIGINT, then SIGKILL) and return the manifest's record; idempotent."""
        if self.record is not None:
            return self.record
        self._stopping.set()
        if self._watch is not None:
            self._watch.join()
        final = self.state()["state"]
        if self.states and final != self.states[-1][1]:
            self.states.append((round(time.monotonic() - self._t0, 3), final))
        ejection = self.ejected() if self.ops else None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._forget()
        self.record = {**self.spec.to_dict(), "ops": self.ops,
                       "pid": self.proc.pid if self.proc else None,
                       "enable_s": None if self.enable_s is None else round(self.enable_s, 3),
                       "states": [list(s) for s in self.states],
                       "enabled_throughout": bool(self.ops) and ejection is None,
                       "ejected": ejection,
                       "exit": exit_reason(self.log()),
                       "returncode": self.proc.returncode if self.proc else None,
                       "state_after": self.state()["state"], "log": self.log_path.name}
        return self.record

    def _write_record(self) -> None:
        record_processes("scx", [self.proc.pid], scheduler=self.spec.name)

    def _forget(self) -> None:
        forget_processes("scx")


class Kept:
    """A sched_ext scheduler kept loaded across runs (the runs of one VM boot:
    :mod:`harmony.vm.guest`), rather than started and stopped for each: loading its BPF programs
    took 1.3-3.2 s of a TCG guest's time a run, stopping it 0.3-0.5 s (bench/README.md).

    Each run gets a view (:meth:`for_run`) that a capture starts, watches and stops as it would
    a :class:`Scheduler`: its ``start()`` starts the scheduler only if none is loaded, or the
    last was ejected (the view says so); its ``stop()`` leaves it loaded and returns the run's
    ``scx`` record: the states over this run only, whether it was enabled throughout, the
    scheduler's output during the run (in the run's ``scx.log``), and ``kept``: since which run
    it is loaded. :meth:`close` stops it. ``log_dir``: where the scheduler's own log goes (the
    guest's memory)."""

    def __init__(self, spec: ScxSpec, log_dir: Path, root: Path | None = None):
        self.spec, self.log_dir, self.root = spec, Path(log_dir), root
        self.sched: Scheduler | None = None
        self.since: str | None = None      # the run it was started for

    @property
    def name(self) -> str:
        return self.spec.name

    def for_run(self, log_path: Path) -> "KeptRun":
        return KeptRun(self, Path(log_path))

    def close(self) -> dict | None:
        """Stop the scheduler (SIGINT, then SIGKILL); its last record, None if none ran."""
        sched, self.sched = self.sched, None
        return sched.stop() if sched is not None else None


class KeptRun:
    """One run's view of a :class:`Kept` scheduler (see there)."""

    def __init__(self, kept: Kept, log_path: Path):
        self.kept, self.spec, self.log_path = kept, kept.spec, log_path
        self.ops: str | None = None
        self.reclaimed: list[str] = []
        self.enable_s: float | None = None     # None: it was loaded already
        self.restarted: str | None = None      # why a loaded one was replaced (its ejection)
        self.record: dict | None = None
        self._t0, self._states_from, self._log_from = 0.0, 0, 0

    def start(self) -> None:
        kept = self.kept
        if kept.sched is not None:
            why = kept.sched.ejected()
            if why is not None:
                self.restarted = why
                kept.close()
        if kept.sched is None:
            sched = Scheduler(self.spec, kept.log_dir / f"harmony-{LOG_NAME}", root=kept.root)
            sched.start()                       # ScxError as a Scheduler's, nothing kept
            kept.sched, kept.since = sched, str(self.log_path.parent)
            self.reclaimed, self.enable_s = sched.reclaimed, sched.enable_s
        sched = kept.sched
        self.ops, self._t0 = sched.ops, time.monotonic()
        self._states_from = len(sched.states)
        # the run that loaded it has its output from the start (what it said as it loaded)
        self._log_from = 0 if self.enable_s is not None else len(sched.log())

    def ejected(self) -> str | None:
        return self.kept.sched.ejected() if self.kept.sched is not None else "not loaded"

    def tids(self) -> list[int]:
        return self.kept.sched.tids() if self.kept.sched is not None else []

    def stop(self) -> dict:
        """The run's record; the scheduler stays loaded unless the kernel ejected it."""
        if self.record is not None:
            return self.record
        sched = self.kept.sched
        ejection = self.ejected() if self.ops else None
        if sched is None:
            self.record = {**self.spec.to_dict(), "ops": None, "kept": True}
            return self.record
        shift = self._t0 - sched._t0
        states = [[0.0, sched.states[self._states_from - 1][1] if self._states_from else
                   "enabled"]] + [[round(t - shift, 3), s] for t, s in
                                  sched.states[self._states_from:]]
        log = sched.log()[self._log_from:]
        try:
            self.log_path.write_text(log)
        except OSError:
            pass
        if ejection is not None:
            final = self.kept.close()
            states.append([round(time.monotonic() - self._t0, 3), final["state_after"]])
        self.record = {**self.spec.to_dict(), "ops": self.ops, "pid": sched.proc.pid,
                       "enable_s": None if self.enable_s is None else round(self.enable_s, 3),
                       "kept": True, "loaded_since": self.kept.since if ejection is None
                       else str(self.log_path.parent),
                       "restarted_after": self.restarted, "states": states,
                       "enabled_throughout": bool(self.ops) and ejection is None,
                       "ejected": ejection, "exit": exit_reason(log),
                       "returncode": sched.proc.returncode, "state_after":
                       self.kept.sched.state()["state"] if self.kept.sched else states[-1][1],
                       "log": self.log_path.name}
        return self.record
