"""The ``perf`` probe: records the sched tracepoints with ``perf record`` and decodes the perf.data
it wrote directly. It is independent of the tracefs probe in its kernel interface
(perf_event_open ring buffers instead of the ftrace ring buffer; perf's sample records around the
payloads), so the two cross-check each other; the payloads are decoded by the same format-driven
decoder as tracefs's pages. Besides the sched tracepoints it records those that tell why a task
moved (:data:`~harmony.probes.schema.CAUSE_EVENTS`, where the kernel has them: the scheduler's
softirq, filtered on its vector as the tracefs probe's, and the NUMA balancer's), as tracefs does.

This module is the recorder; decode() reads what it recorded with the layers below it:
:mod:`harmony.probes.perf_read` (perf.data -> the events table, the clock its events carry, the
records perf lost) and :mod:`harmony.probes.perf_data` (what those lost records mean for the sched
events). ``perf script`` (:mod:`harmony.probes.perf_script`) decoded them before; the tests
compare the two, row by row.

Files in ``out_dir``::

    perf.data      what ``perf record`` wrote
    perf.log       perf record's stderr
    owner.pid      "<pid> <starttime>" of the Python process that owns the recording
    perf.pid       pid of the perf record process (lets reclaim_stale() prove a perf is ours)
    markers.jsonl  one JSON object per mark(): ts (CLOCK_MONOTONIC ns), cpu, pid, text
    meta.json      written by stop(): perf version, command line, clock, events, cpus, kernel, ...

A suite or batch (:meth:`PerfProbe.session`) keeps one ``perf record`` across its runs: each run
enables the events at its start and, at its stop, disables them and has perf write its stretch to
a file of its own (``--switch-output=signal``), moved in as the run's perf.data; perf.log then
holds the lines perf wrote for that run, and meta.json says which segment of which recording
(``recording_kept``). Starting and ending perf for every run cost ~0.46 s a run.

How start() knows recording is live: perf is started with every event disabled (``-D -1``) and a
control pipe (``--control fd:CTL,ACK``). Once perf has opened and mmapped all events, start()
writes ``enable`` to the control pipe; perf enables every event (ioctl PERF_EVENT_IOC_ENABLE on
every per-CPU fd, synchronous in the kernel) and only then answers ``ack``. start() returns after
reading the ``ack``, so every tracepoint hit after start() returns is recorded (barring ring-buffer
loss, which perf reports and decode() counts).

Timestamps: ``-k CLOCK_MONOTONIC`` makes the kernel stamp every sample with
ktime_get_mono_fast_ns(), the clock tracefs calls "mono" and
``time.clock_gettime_ns(time.CLOCK_MONOTONIC)`` reads, so the events, the markers and the tracefs
probe's events share one time base. decode() checks that every sched event in perf.data really
carries clockid 1.

Markers: a ``trace_marker`` write is an ftrace ``print`` event; it goes into tracefs ring buffers
only, never to perf (perf can open ``ftrace:print`` but receives nothing). So mark() reads
CLOCK_MONOTONIC in user space (vDSO: the same timekeeper as the kernel's stamps) immediately before
returning to the caller's action and appends it to markers.jsonl. The marker therefore precedes
the action it marks (e.g. the SIGCONT that releases the workers) by the few microseconds of one
JSON write; it is never late. Measured against the tracefs probe in ``--crosscheck perf`` runs
(where the perf marker is written right after the tracefs one), over 10 runs: the user-space
stamp trails the kernel's trace_marker stamp by 10-22 us at t0, 4-8 us at "released" and 8-46 us
at the end; this includes the tracefs write itself, so a perf-only marker is closer still. A
kernel-stamped alternative (a filtered syscall tracepoint) would put the marker into perf.data but
needs CONFIG_FTRACE_SYSCALLS and still would not carry the text; the user-space stamp is simpler and
precise enough for t0 and end.

Blind task contexts (measured on this host, kernel 6.18, perf 6.1): perf records *nothing* that
fires while certain tasks are current - swapper/1 (CPU 1's idle task) and threads of PID 1 (the VM's
init agent) - at any level: their sched_switch, and the hardirq/softirq work done on their stack (an
idle CPU 1's timer wake-ups and its idle balancer's migrations), while the same tracepoints in every
other task's context, swapper/0's included, are recorded. No LOST or THROTTLE record appears. The
kernel does count those hits: a tracepoint event opened with perf_event_open() directly (no perf
tool), sampling every hit on CPU 1, read 621 hits (tracefs: 621, 541 of them in swapper/1) but
wrote 74 samples, none from swapper/1, and its lost-sample counter stayed 0. So they are dropped
between the event's count and its ring buffer, inside the kernel; why is not known (tracefs also
records none of these tasks' task-level events, e.g. no switch out of swapper/1, so the kernel
treats those tasks specially). In a ``<4,0>`` run this drops exactly the first moves, which idle
CPU 1 pulls. Every run's analysis (``harmony.pipeline.blind_spots``, for any probe) therefore
reports, from the probe's own stream, the contexts it saw run but recorded nothing in
(``silent_contexts``) and the moves that the tasks' own events prove but no sched_migrate_task
records (``unrecorded_migrations``), in the manifest and notes.

Tracepoint order: when both probes record, the kernel calls the handlers of one tracepoint hit in
the order the probes were enabled; ``harmony run --crosscheck perf`` starts perf first, so perf's
stamp of a hit is ~2 us earlier than tracefs's (see :mod:`harmony.analysis.probe_agreement`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

import pandas as pd

from harmony import hostfacts
from harmony.core.osutil import online_cpus, proc_starttime, sched_getcpu
from harmony.hostfacts import MISSING, OK, WARN, check
from harmony.probes.base import (
    REQUIRED_TRACEPOINTS,
    Capture,
    Probe,
    ProbeError,
    TraceCorrupt,
)
from harmony.probes.perf_data import lost_sched_events
from harmony.probes.perf_read import read_perf_data
from harmony.probes.perf_tool import PERF_ENV as _ENV
from harmony.probes.perf_tool import die_with_parent_preexec as _die_with_parent
from harmony.probes.perf_tool import first_error_line as _first_error_line
from harmony.probes.schema import CAUSE_EVENTS, SCHED_EVENTS, make_markers
from harmony.probes.tracefs import TRACEFS

# _ENV, _die_with_parent, _first_error_line: perf_tool's, by the names the recorder's code called
# them when they were defined here

PERF_EVENTS = ",".join(f"sched:{e}" for e in SCHED_EVENTS)


def cause_events(events_dir: Path = TRACEFS / "events") -> tuple[list[str], list[str], list[str]]:
    """The events that tell why a task moved (:data:`~harmony.probes.schema.CAUSE_EVENTS`) that
    this kernel has, as ``perf record`` arguments (each ``-e system:event``, then its
    ``--filter``: the scheduler's softirq only, as the tracefs probe records it), and the names
    of those it has (``system:event``) and lacks. perf refuses a whole recording for one unknown
    tracepoint, so only those the kernel lists under ``events_dir`` are asked for."""
    args, present, missing = [], [], []
    for system, ev, flt in CAUSE_EVENTS:
        name = f"{system}:{ev}"
        if not (events_dir / system / ev).is_dir():
            missing.append(name)
            continue
        args += ["-e", name, *(["--filter", flt] if flt else [])]
        present.append(name)
    return args, present, missing
CLOCK_NAME = "mono"  # the tracefs name of CLOCK_MONOTONIC (ktime_get_mono_fast_ns)
CLOCK_ID = "CLOCK_MONOTONIC"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------------------------------
# process helpers

def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def mmap_pages_for(duration_s: float, ncpus: int) -> int:
    """Per-CPU ring-buffer size in pages (a power of two, as perf requires).

    perf drains the buffers continuously, so the buffer only has to absorb bursts while perf is
    descheduled or blocked on writing. We budget a burst of ~100k events/s/CPU at ~136 bytes per
    sample for at least 0.3 s (1024 pages of 4 KiB), longer runs get more headroom (up to 8192 pages
    = 32 MiB per CPU), and the total stays under 1/8 of the available memory.
    """
    pages = _pow2_ceil(min(8192, max(1024, int(duration_s * 256))))
    try:
        avail_kb = next(int(line.split()[1]) for line in open("/proc/meminfo")
                        if line.startswith("MemAvailable:"))
        cap = avail_kb * 1024 // 8 // max(1, ncpus) // PAGE_SIZE
        while pages > 64 and pages > cap:
            pages //= 2
    except (OSError, StopIteration, ValueError):
        pass
    if os.geteuid() != 0:  # unprivileged: perf_event_mlock_kb bounds the buffer of each CPU
        try:
            mlock_kb = int(Path("/proc/sys/kernel/perf_event_mlock_kb").read_text())
            while pages > 1 and pages * PAGE_SIZE // 1024 > mlock_kb:
                pages //= 2
        except (OSError, ValueError):
            pass
    return pages


def _perf_version(perf: str) -> str:
    try:
        out = subprocess.run([perf, "version"], capture_output=True, text=True, timeout=10,
                             env=_ENV).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.removeprefix("perf version ").strip()


@functools.lru_cache(maxsize=None)
def _record_help(perf: str) -> str:
    """``perf record -h``'s text ("" if it does not run), asked once per binary."""
    try:
        r = subprocess.run([perf, "record", "-h"], capture_output=True, text=True, timeout=10,
                           env=_ENV)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout + r.stderr


def _record_knows(perf: str, option: str) -> bool:
    """Whether this ``perf record`` has ``option`` (its help lists it)."""
    return option in _record_help(perf)


SESSION_PREFIX = "harmony-perf-session-"


class _KeptRecording:
    """A ``perf record`` that the runs of a :meth:`PerfProbe.session` share, one after another.

    It writes into a directory of its own (``harmony-perf-session-<pid>-*`` in the temporary
    directory, with owner.pid and perf.pid as a run's out dir has them, so that
    :meth:`PerfProbe.reclaim_stale` knows it); each :meth:`switch` yields the file perf wrote
    for the run that just ended.
    """

    def __init__(self, dir: Path, proc: subprocess.Popen, ctl_w: int, ack_r: int, log, cmd,
                 config: tuple):
        self.dir, self.proc, self.ctl_w, self.ack_r, self.log = dir, proc, ctl_w, ack_r, log
        self.cmd, self.config = cmd, config
        self.started_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.user: PerfProbe | None = None   # the probe recording in it, if one is
        self.segments = 0                    # files cut so far
        self._seen: set[str] = set()
        self._finalizer = weakref.finalize(self, _emergency_stop, proc)

    @classmethod
    def launch(cls, probe: PerfProbe, perf: str, config: tuple) -> _KeptRecording:
        me = os.getpid()
        dir = Path(tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{me}-"))
        (dir / "owner.pid").write_text(f"{me} {proc_starttime(me)}\n")
        ctl_r, ctl_w = os.pipe()
        ack_r, ack_w = os.pipe()
        cmd = probe.command(ctl_r, ack_w, perf, output=dir / "perf.data", switch=True)
        log = open(dir / "perf.log", "wb")
        try:
            proc = subprocess.Popen(
                cmd, pass_fds=(ctl_r, ack_w), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=_ENV, cwd=dir,
                start_new_session=True,  # Ctrl-C of the terminal reaches us, and we stop perf
                preexec_fn=_die_with_parent(me))
        except OSError as e:
            for fd in (ctl_r, ctl_w, ack_r, ack_w):
                os.close(fd)
            log.close()
            shutil.rmtree(dir, ignore_errors=True)
            raise ProbeError(f"cannot run perf: {e}") from None
        os.close(ctl_r)
        os.close(ack_w)
        (dir / "perf.pid").write_text(f"{proc.pid}\n")
        return cls(dir, proc, ctl_w, ack_r, log, cmd, config)

    def log_size(self) -> int:
        try:
            return len((self.dir / "perf.log").read_text(errors="replace"))
        except OSError:
            return 0

    def switch(self, timeout: float) -> Path:
        """SIGUSR2: perf reads its buffers, finishes the file (header, features) and renames it
        ``perf.data.<timestamp>`` before it opens a new perf.data; returns that file."""
        self.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while True:
            new = sorted(p.name for p in self.dir.glob("perf.data.*")) if self.dir.is_dir() else []
            new = [n for n in new if n not in self._seen]
            if new:
                self._seen.update(new)
                self.segments += 1
                return self.dir / new[0]
            if self.proc.poll() is not None:
                raise ProbeError(f"perf record exited (status {self.proc.returncode}) before it "
                                 f"wrote the run's data")
            if time.monotonic() > deadline:
                raise ProbeError(f"perf record did not write the run's data within {timeout:.0f} s "
                                 f"of SIGUSR2")
            time.sleep(0.002)

    def end(self) -> None:
        """Stop perf (SIGINT: it writes an empty last file; SIGKILL if it hangs) and remove the
        directory."""
        try:
            _emergency_stop(self.proc)
        finally:
            self._finalizer.detach()
            for fd in (self.ctl_w, self.ack_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# the probe

class PerfProbe(Probe):
    """Records the sched tracepoints system-wide with ``perf record``; see the module docstring."""

    name = "perf"
    START_TIMEOUT_S = 30.0
    STOP_TIMEOUT_S = 60.0
    _available_ok_until = 0.0
    #: the recording shared by the runs of an open :meth:`session` (None: one recording per run)
    _kept: _KeptRecording | None = None
    _session_open = False

    def __init__(self, out_dir: Path, cpus: list[int], duration_s: float):
        super().__init__(out_dir, cpus, duration_s)
        self._proc: subprocess.Popen | None = None
        self._ctl_w: int | None = None
        self._ack_r: int | None = None
        self._log = None
        self._lock = threading.Lock()
        self._markers = None
        self._stopped = False
        self._meta: dict = {}
        self._cause_events: list[str] = []      # CAUSE_EVENTS recorded and missing (command())
        self._events_missing: list[str] = []
        self.meta: dict = {}  # recording facts, complete after stop() (also in meta.json)
        self._finalizer = None
        # the session's recording, if this run is in one
        self._kept_rec: _KeptRecording | None = None
        self._log_path = self.out_dir / "perf.log"   # perf's stderr (a session's: its own)
        self._log_from = 0                            # where this run's part of that log starts

    # ---------------------------------------------------------------------------- availability
    @staticmethod
    def perf_binary() -> str | None:
        return shutil.which("perf")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        perf = cls.perf_binary()
        if not perf:
            return False, "perf is not installed (no 'perf' in PATH)"
        if time.monotonic() < cls._available_ok_until:
            return True, ""
        if not _perf_version(perf):
            return False, f"{perf} does not run ('perf version' failed; no perf for this kernel?)"
        # the real test: a tiny system-wide record of one sched tracepoint on the monotonic clock
        rc, why, _ = try_record(perf, ["sched_switch"], timeout=20.0)
        if rc is None:
            return False, why
        if rc != 0:
            return False, "perf cannot record sched tracepoints system-wide: " + why
        cls._available_ok_until = time.monotonic() + 60.0
        return True, ""

    # ---------------------------------------------------------------------------- recording
    @property
    def perf_data(self) -> Path:
        return self.out_dir / "perf.data"

    def command(self, ctl_fd: int, ack_fd: int, perf: str = "perf", output: Path | None = None,
                switch: bool = False) -> list[str]:
        """``perf record``'s command line, writing ``output`` (default: :attr:`perf_data`);
        ``switch``: a recording kept across runs (:meth:`session`), which writes what it has so
        far to a file of its own on SIGUSR2 and goes on."""
        self.mmap_pages = mmap_pages_for(self.duration_s, os.cpu_count() or 1)
        causes, self._cause_events, self._events_missing = cause_events()
        return [perf, "record", "-a", "-e", PERF_EVENTS, *causes, "-k", CLOCK_ID,
                "-m", str(self.mmap_pages),
                "-B", "-N",          # no build-id post-processing: stop() is quick
                "--synth=no",        # no /proc walk at start: comms come from the tracepoints
                # no side-band thread for BPF program events, which perf waits ~0.5 s for at exit
                # (a perf without the option, older ones, is not given it)
                *(["--no-bpf-event"] if _record_knows(perf, "--no-bpf-event") else []),
                "-D", "-1",          # start with events disabled ...
                "--control", f"fd:{ctl_fd},{ack_fd}",  # ... until start() says "enable"
                *(["--switch-output=signal"] if switch else []),
                "-o", str(output or self.perf_data)]

    def start(self) -> None:
        if self._proc is not None:
            raise ProbeError("perf probe already started")
        perf = self.perf_binary()
        if not perf:
            raise ProbeError("perf is not installed (no 'perf' in PATH)")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("perf.data", "perf.data.old", "markers.jsonl", "meta.json"):
            (self.out_dir / stale).unlink(missing_ok=True)
        me = os.getpid()
        (self.out_dir / "owner.pid").write_text(f"{me} {proc_starttime(me)}\n")
        if PerfProbe._session_open:
            self._start_kept(perf)
        else:
            self._start_own(perf)
        self._meta["live_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self._markers = open(self.out_dir / "markers.jsonl", "a", encoding="utf-8")

    def _start_own(self, perf: str) -> None:
        """A ``perf record`` of this run's own, writing the run's perf.data; stop() ends it."""
        me = os.getpid()
        ctl_r, ctl_w = os.pipe()
        ack_r, ack_w = os.pipe()
        cmd = self.command(ctl_r, ack_w, perf)
        self._log_path = self.out_dir / "perf.log"
        self._log = open(self._log_path, "wb")
        try:
            proc = subprocess.Popen(
                cmd, pass_fds=(ctl_r, ack_w), stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=subprocess.STDOUT, env=_ENV, cwd=self.out_dir,
                start_new_session=True,  # Ctrl-C of the terminal reaches us, and we stop perf
                preexec_fn=_die_with_parent(me))
        except OSError as e:
            for fd in (ctl_r, ctl_w, ack_r, ack_w):
                os.close(fd)
            self._log.close()
            raise ProbeError(f"cannot run perf: {e}") from None
        os.close(ctl_r)
        os.close(ack_w)
        self._proc, self._ctl_w, self._ack_r = proc, ctl_w, ack_r
        self._stopped = False
        self._finalizer = weakref.finalize(self, _emergency_stop, proc)
        (self.out_dir / "perf.pid").write_text(f"{proc.pid}\n")
        self._meta = {"command": cmd, "owner_pid": me, "perf_pid": proc.pid,
                      "start_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC)}
        try:
            self._wait_live()
        except BaseException:
            self._kill()
            self._close()
            self._stopped = True
            raise

    def _start_kept(self, perf: str) -> None:
        """Record this run in the session's ``perf record`` (started now if there is none, or
        if the one there records otherwise than this run asks: then that one is ended)."""
        config = tuple(self.command(-1, -1, perf, output=Path("-"), switch=True))
        kept = PerfProbe._kept
        if kept is not None and (kept.config != config or kept.proc.poll() is not None):
            PerfProbe._kept = None
            kept.end()
            kept = None
        start_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if kept is None:
            kept = PerfProbe._kept = _KeptRecording.launch(self, perf, config)
        kept.user = self
        self._kept_rec = kept
        self._proc, self._ctl_w, self._ack_r = kept.proc, kept.ctl_w, kept.ack_r
        self._log_path = kept.dir / "perf.log"
        self._log_from = kept.log_size()
        self._stopped = False
        (self.out_dir / "perf.pid").write_text(f"{kept.proc.pid}\n")
        self._meta = {"command": kept.cmd, "owner_pid": os.getpid(), "perf_pid": kept.proc.pid,
                      "start_ns": start_ns,
                      "recording_kept": {"segment": kept.segments + 1,
                                         "recording_started_ns": kept.started_ns}}
        try:
            self._wait_live()
        except BaseException:
            self._drop_kept()
            self._stopped = True
            raise

    def _wait_live(self) -> None:
        """Send "enable" on the control pipe and wait for perf's "ack" (see module docstring)."""
        self._control(b"enable", self.START_TIMEOUT_S, "enable its events")

    def _control(self, word: bytes, timeout: float, what: str) -> None:
        """Write ``word`` to perf's control pipe and wait for its "ack"."""
        os.write(self._ctl_w, word + b"\n")
        deadline = time.monotonic() + timeout
        got = b""
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeError(f"perf record did not {what} within "
                                 f"{timeout:.0f} s (see {self._log_path})")
            ready, _, _ = select.select([self._ack_r], [], [], min(left, 0.1))
            if ready:
                chunk = os.read(self._ack_r, 64)
                if not chunk:  # perf closed the pipe: it exited
                    break
                got += chunk
            elif self._proc.poll() is not None:
                break
        if b"ack" not in got:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise ProbeError(f"perf record failed to {what}: "
                             + _first_error_line(self._read_log()))

    def _read_log(self) -> str:
        try:
            text = Path(self._log_path).read_text(errors="replace")
        except OSError:
            return ""
        return text[self._log_from:] if self._kept_rec is not None else text

    def helper_tids(self) -> list[int]:
        """perf record's threads (its main thread and the helpers perf starts), while it records."""
        if self._proc is None or self._stopped or self._proc.poll() is not None:
            return []
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self._proc.pid}/task"))
        except OSError:         # exited meanwhile
            return []

    def mark(self, text: str) -> int:
        with self._lock:
            if self._proc is None or self._stopped or self._markers is None:
                raise ProbeError("perf probe is not recording: call start() before mark()")
            ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            cpu = sched_getcpu()
            self._markers.write(json.dumps({"ts": ts, "cpu": cpu, "pid": threading.get_native_id(),
                                            "text": text.rstrip("\n")}) + "\n")
            self._markers.flush()
        return ts

    def stop(self) -> None:
        with self._lock:
            if self._proc is None or self._stopped:
                return
            self._stopped = True
        if self._kept_rec is not None:
            rc, clean, how = self._stop_kept()
            log = self._read_log()
            (self.out_dir / "perf.log").write_text(log)
        else:
            rc, clean, how = self._stop_own()
            log = self._read_log()
            if how == "exited":
                clean = rc in (0, -signal.SIGINT) and "Captured and wrote" in log
        meta = dict(self._meta)
        meta.update({
            "probe": self.name, "perf_version": _perf_version(self.perf_binary() or "perf"),
            "clock": CLOCK_NAME, "clockid": CLOCK_ID,
            "events_enabled": list(SCHED_EVENTS) + self._cause_events,
            "events_missing": self._events_missing, "cpus": self.cpus,
            "cpus_online": online_cpus(), "kernel": os.uname().release,
            "duration_s": self.duration_s, "mmap_pages": getattr(self, "mmap_pages", None),
            "stop_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "perf_returncode": rc, "perf_clean_exit": clean, "perf_exit": how,
            "perf_log": log.strip().splitlines()[-5:],
        })
        self.meta = meta
        tmp = self.out_dir / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(self.out_dir / "meta.json")
        if not clean:
            raise ProbeError(f"perf record {how} (exit status {rc}): "
                             + _first_error_line(log))

    def _stop_own(self) -> tuple[int | None, bool, str]:
        """End this run's own perf record: (its exit status, False, how it ended)."""
        proc = self._proc
        how = "exited"
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=self.STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    how = f"hung after SIGINT for {self.STOP_TIMEOUT_S:.0f} s, killed"
            else:
                how = "had already exited before stop()"
        finally:
            self._kill()  # no-op unless it is still alive (or we were interrupted)
            self._close()
        return proc.returncode, False, how

    def _stop_kept(self) -> tuple[int | None, bool, str]:
        """Cut this run's perf.data out of the session's recording: the events disabled (perf
        acks once every CPU's event is off: nothing of this run is still to come), then SIGUSR2:
        perf writes what it read so far, header and all, to a file of its own, which becomes the
        run's perf.data. On any failure the recording is ended (the next run starts another)."""
        kept = self._kept_rec
        try:
            self._control(b"disable", self.STOP_TIMEOUT_S, "disable its events")
            segment = kept.switch(self.STOP_TIMEOUT_S)
            shutil.move(segment, self.perf_data)
        except ProbeError as exc:
            self._drop_kept()
            return self._proc.returncode, False, f"failed to end its segment ({exc})"
        except BaseException:
            self._drop_kept()
            raise
        finally:
            kept.user = None
            self._close()
        return None, True, f"wrote segment {kept.segments} of a recording kept across runs"

    def _drop_kept(self) -> None:
        """End the session's recording this run used: it is not trusted for another run."""
        kept = self._kept_rec
        if PerfProbe._kept is kept:
            PerfProbe._kept = None
        kept.user = None
        kept.end()

    def _kill(self) -> None:
        proc = self._proc
        if self._kept_rec is not None:
            return              # the session's: ended by _drop_kept or when the session ends
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if self._finalizer is not None:
            self._finalizer.detach()

    def _close(self) -> None:
        if self._kept_rec is None:  # the session's pipes stay open for its next run
            for attr in ("_ctl_w", "_ack_r"):
                fd = getattr(self, attr)
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                    setattr(self, attr, None)
        for attr in ("_log", "_markers"):
            f = getattr(self, attr)
            if f is not None:
                f.close()
                setattr(self, attr, None)

    # ---------------------------------------------------------------------------- a session
    @classmethod
    @contextlib.contextmanager
    def session(cls):
        """Consecutive captures of this process share one ``perf record`` until the block ends.

        Starting perf (opening the events on every CPU) and ending it (the kernel unregistering
        each tracepoint) cost ~0.12 + 0.34 s a run, a fifth of a quick suite's time. In a
        session, the first run starts ``perf record --switch-output=signal`` (events disabled,
        writing into a directory of its own in the temporary directory) and leaves it running;
        each run enables the events at its start and, at its stop, disables them and has perf
        write what it recorded to a file of its own (SIGUSR2): a complete perf.data (header,
        attrs, tracing data, the CPU and thread maps, the LOST records of its stretch), moved
        into the run's directory. A run that asks for another command line (events, buffer size)
        ends the recording and starts its own. The block's end stops perf and removes the
        directory, also on error; a controller killed inside it takes perf with it
        (PR_SET_PDEATHSIG), and the next run's stale-state sweep removes the directory
        (:meth:`reclaim_stale`).
        """
        if cls._session_open:
            raise ProbeError("a perf session is already open in this process")
        PerfProbe._session_open = True
        try:
            yield
        finally:
            PerfProbe._session_open = False
            kept, PerfProbe._kept = PerfProbe._kept, None
            if kept is not None:
                if kept.user is not None:
                    try:
                        kept.user.stop()  # still recording: the block ended by an error
                    except ProbeError:
                        pass
                kept.end()

    # ---------------------------------------------------------------------------- decoding
    @classmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        out_dir = Path(out_dir)
        path = out_dir / "perf.data"
        if not path.exists():
            raise TraceCorrupt(f"{path}: missing")
        notes: list[str] = []
        meta: dict = {}
        meta_path = out_dir / "meta.json"
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                notes.append("meta.json is unreadable; recording facts are missing")
        else:
            notes.append("meta.json missing (stop() never ran?)")

        t0 = time.perf_counter()
        read = read_perf_data(path)
        events = read.events
        decode_s = time.perf_counter() - t0
        if read.clockids("sched:") - {1}:       # one not on CLOCK_MONOTONIC (clockid 1)
            raise TraceCorrupt(f"{path}: events were not recorded on CLOCK_MONOTONIC (clockid 1)")

        notes.extend(read.notes)
        lost_records = sum(read.lost_by_cpu.values())
        per_event = read.lost_samples_by_event or None
        if meta.get("recording_kept") and lost_records and "LOST_SAMPLES" not in read.records:
            # perf writes its per-event counts (LOST_SAMPLES) when it exits: a run cut from a
            # recording kept across runs has its LOST records only
            per_event = None
        lost, lost_notes = lost_sched_events(lost_records, per_event)
        notes.extend(lost_notes)
        if lost:
            notes.append(f"{lost} sched events lost (perf ring buffer full); lost_by_cpu is from "
                         "PERF_RECORD_LOST records")
        notes.append("markers are not in the kernel trace: mark() timestamps CLOCK_MONOTONIC in "
                     "user space (markers.jsonl)")
        if not meta.get("perf_clean_exit", True):
            notes.append(f"perf record did not exit cleanly: {meta.get('perf_exit')}")

        markers = _read_markers(out_dir / "markers.jsonl")
        meta.update({
            "probe": cls.name, "clock": CLOCK_NAME, "clockid": CLOCK_ID,
            "events_enabled": meta.get("events_enabled", list(SCHED_EVENTS)),
            "lost_events": int(lost), "lost_by_cpu": {int(k): int(v) for k, v in
                                                       sorted(read.lost_by_cpu.items())},
            "lost_samples_by_event": read.lost_samples_by_event,
            "bytes": read.header.size, "n_events": int(len(events)),
            "decode_s": round(decode_s, 3), "decoder": read.decoder,
            "perf_records": read.records,
            "notes": list(meta.get("notes", [])) + notes,
        })
        return Capture(events=events, markers=markers, meta=meta)

    # ---------------------------------------------------------------------------- cleanup
    @classmethod
    def reclaim_stale(cls) -> list[str]:
        """Stop ``perf record`` processes writing into a Harmony out dir whose owner is gone.

        A perf process is ours only if its argv is ``perf record ... -o DIR/perf.data`` and
        DIR/perf.pid names exactly that process; it is stale only if DIR/owner.pid names a process
        that no longer exists (pid gone, or reused: start time differs). Anything else is
        left alone.
        """
        removed = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            argv = [a.decode("utf-8", "replace") for a in argv if a]
            if len(argv) < 4 or not os.path.basename(argv[0]).startswith("perf") \
                    or "record" not in argv or "-o" not in argv:
                continue
            try:
                out = Path(argv[argv.index("-o") + 1])
            except IndexError:
                continue
            if out.name != "perf.data":
                continue
            out_dir = out.parent if out.is_absolute() else None
            if out_dir is None:
                try:
                    out_dir = (Path(os.readlink(entry / "cwd")) / out).parent
                except OSError:
                    continue
            try:
                if int((out_dir / "perf.pid").read_text().split()[0]) != pid:
                    continue
                owner = (out_dir / "owner.pid").read_text().split()
            except (OSError, ValueError, IndexError):
                continue
            owner_pid = int(owner[0])
            owner_start = owner[1] if len(owner) > 1 else "None"
            start_now = proc_starttime(owner_pid)
            if start_now is not None and (owner_start == "None" or str(start_now) == owner_start):
                continue  # owner alive
            if _stop_pid(pid, proc_starttime(pid)):
                removed.append(f"perf record pid {pid} writing {out} (owner pid {owner_pid} gone)")
        removed += _reclaim_session_dirs()
        return removed

    # ---------------------------------------------------------------------------- doctor
    @classmethod
    def doctor_check(cls, facts: dict, test_record: bool = True) -> dict:
        """``harmony doctor``'s ``perf`` check: perf there, its version, and (``test_record``)
        whether it records the required sched tracepoints that tracefs has, by the test
        recording of :meth:`available` (:func:`try_record`, 10 ms, ~0.3 s). Without the test,
        perf is found but ``can_record_sched`` is false: not a usable probe."""
        paranoid = hostfacts.read_int(hostfacts.PROC / "sys/kernel/perf_event_paranoid")
        perf = cls.perf_binary()
        base = dict(present=False, path=perf, version=None, paranoid=paranoid,
                    can_record_sched=False, events_tested=[], test_s=None, error=None)
        if not perf:
            return check(MISSING, "perf not installed", **base)
        version = _perf_version(perf)
        if not version:
            why = "'perf version' failed (no perf for this kernel?)"
            return check(WARN, f"{perf} does not run: {why}", **{**base, "error": why})
        base.update(present=True, version=version)
        if not test_record:
            return check(OK, f"{version}; recording not tested (perf does not record in this run)",
                         **base)
        present = facts["sched_tracepoints"].get("present", [])
        events = [t for t in REQUIRED_TRACEPOINTS if t in present] or ["sched_switch"]
        rc, error, elapsed = try_record(perf, events, timeout=5.0)
        if rc != 0 and not hostfacts.is_root():
            error += " (need root?)"
        base.update(can_record_sched=rc == 0, events_tested=events, test_s=round(elapsed, 3),
                    error=error or None)
        if rc == 0:
            return check(OK, f"{version}; record -e sched:* permitted (paranoid {paranoid})",
                         **base)
        return check(WARN, f"{version}; record -e sched:* refused (paranoid {paranoid}): {error}",
                     **base)


def try_record(perf: str, events: list[str], timeout: float) -> tuple[int | None, str, float]:
    """Record the sched ``events`` system-wide for 10 ms into a temporary directory, with the
    options of a run's recording (:meth:`PerfProbe.command`: the clock, no build-ids, no
    synthesis, no BPF side-band): (perf's exit status, None if it did not finish; the line that
    says why not, "" if it recorded; seconds taken). :meth:`PerfProbe.available` tests
    sched_switch and waits up to 20 s; ``harmony doctor`` tests every required tracepoint
    tracefs has, and gives up after 5 s."""
    cmd = [perf, "record", "-q", "-a", *(a for e in events for a in ("-e", f"sched:{e}")),
           "-k", CLOCK_ID, "--synth=no", "-B", "-N",
           *(["--no-bpf-event"] if _record_knows(perf, "--no-bpf-event") else [])]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harmony-perf-check-") as tmp:
        try:
            r = subprocess.run([*cmd, "-o", f"{tmp}/perf.data", "--", "sleep", "0.01"],
                               capture_output=True, text=True, timeout=timeout, env=_ENV, cwd=tmp,
                               preexec_fn=_die_with_parent(os.getpid()))
        except subprocess.TimeoutExpired:
            return None, (f"perf record of {', '.join(f'sched:{e}' for e in events)} did not "
                          f"finish within {timeout:g} s"), time.monotonic() - t0
        except OSError as e:
            return None, f"cannot run perf: {e}", time.monotonic() - t0
    why = _first_error_line(r.stderr + r.stdout) if r.returncode else ""
    return r.returncode, why, time.monotonic() - t0


# --------------------------------------------------------------------------------------------------
# helpers for decode / cleanup

def _emergency_stop(proc: subprocess.Popen) -> None:
    """weakref/atexit fallback: a started probe that was never stopped stops perf gracefully."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except OSError:
            pass


def _reclaim_session_dirs() -> list[str]:
    """Remove the directories of sessions' recordings (:class:`_KeptRecording`) whose owner is
    gone (their perf was stopped first by :meth:`PerfProbe.reclaim_stale`, or died with it)."""
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{SESSION_PREFIX}*"):
        try:
            owner = (d / "owner.pid").read_text().split()
            pid, start = int(owner[0]), owner[1]
        except (OSError, ValueError, IndexError):
            continue    # not one of ours, or being made: left alone
        now = proc_starttime(pid)
        if now is not None and str(now) == start:
            continue    # owner alive
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"perf session directory {d} (owner pid {pid} gone)")
    return removed


def _stop_pid(pid: int, starttime: int | None) -> bool:
    """SIGINT a process we do not parent; SIGKILL it if it is still there after 5 s."""
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if proc_starttime(pid) != starttime:
            return True
        try:  # reap it if it happens to be our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def read_markers(path: Path) -> pd.DataFrame:
    """The markers of a ``markers.jsonl`` that mark() wrote (an empty table if there is none);
    TraceCorrupt naming a line that is not a marker record."""
    return _read_markers(path)


def _read_markers(path: Path) -> pd.DataFrame:
    if not path.exists():
        return make_markers()
    ts, cpu, pid, text = [], [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ts.append(int(rec["ts"]))
                cpu.append(int(rec["cpu"]))
                pid.append(int(rec["pid"]))
                text.append(str(rec["text"]))
            except (ValueError, KeyError, TypeError):
                raise TraceCorrupt(f"{path}: line {n} is not a marker record") from None
    df = make_markers(ts, cpu, pid, text)
    return df.sort_values("ts", kind="stable", ignore_index=True)


__all__ = ["PerfProbe", "mmap_pages_for", "read_markers", "PERF_EVENTS", "CLOCK_ID",
           "CLOCK_NAME"]
