"""Probe ``tracefs``: the kernel's own ring buffer, in a tracefs instance of our own.

Never touches the top-level buffer (someone else may be using it). The instance is named
``harmony-<owner pid>`` so that a later run can tell a stale instance (owner gone) from a live one.
One thread per CPU drains ``per_cpu/cpuN/trace_pipe_raw`` into ``cpuN.raw`` during the run, so the
buffer never fills; overwrite is off, so if it does fill the kernel counts what it dropped and we
record it. Stored layout (see :mod:`harmony.probes.ringbuf`)::

    meta.json  formats/header_page  formats/header_event  formats/<system>/<event>/format  cpuN.raw
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
from pathlib import Path

from harmony import hostfacts
from harmony.core.osutil import atomic_write, pid_alive, signals_held
from harmony.hostfacts import MISSING, OK, WARN, check
from harmony.probes.base import (
    REQUIRED_TRACEPOINTS,
    Capture,
    Probe,
    ProbeError,
    TraceCorrupt,
    drain_stall_from_env,
    missing_tracepoints,
)
from harmony.probes.schema import CAUSE_EVENTS, SCHED_EVENTS

TRACEFS = Path("/sys/kernel/tracing")
PREFIX = "harmony-"
#: the instance ``harmony doctor`` tries (``harmony-doctor-<pid>``): PREFIX + digits it is not
DOCTOR_INSTANCE_PREFIX = "harmony-doctor-"
PREFERRED_CLOCKS = ("mono", "local")  # mono: comparable with CLOCK_MONOTONIC and the perf probe
DRAIN_IDLE_S = 0.05  # how long a drain thread sleeps when its buffer is empty
MARK_RETRY_S = 0.25  # a marker refused by a full buffer is retried this long while drains run

# Expert options, for testing how a run reports lost events (never needed in normal use):
#   HARMONY_TRACEFS_BUFFER_KB=N          ring buffer per CPU in KiB (default 8192)
#   HARMONY_TRACEFS_DRAIN_STALL=A:B      drains stop reading from A s after the start for B s,
#                                        so a small buffer overflows and the kernel drops events
ENV_BUFFER_KB = "HARMONY_TRACEFS_BUFFER_KB"
ENV_DRAIN_STALL = "HARMONY_TRACEFS_DRAIN_STALL"


def _expert_options(buffer_kb: int | None, drain_stall: tuple[float, float] | None):
    """Constructor arguments completed from the environment; ProbeError (one line) if malformed."""
    if buffer_kb is None and os.environ.get(ENV_BUFFER_KB):
        try:
            buffer_kb = int(os.environ[ENV_BUFFER_KB])
        except ValueError:
            buffer_kb = 0
        if buffer_kb <= 0:
            raise ProbeError(f"{ENV_BUFFER_KB}={os.environ[ENV_BUFFER_KB]!r}: "
                             "not a positive integer")
    if drain_stall is None:
        drain_stall = drain_stall_from_env(ENV_DRAIN_STALL)
    return buffer_kb, drain_stall


def tracefs_root() -> Path:
    """The mounted tracefs, mounting it if it is not (root only)."""
    if not (TRACEFS / "instances").is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)
    if not (TRACEFS / "instances").is_dir():
        raise ProbeError(f"tracefs is not mounted at {TRACEFS} and could not be mounted")
    return TRACEFS


def _ncpus(tracing_dir: Path) -> int:
    """How many CPUs a tracing directory (the root or an instance) keeps buffers for: each CPU
    the kernel may have (``per_cpu/cpuN``)."""
    return len(list((tracing_dir / "per_cpu").glob("cpu*")))


def _data_name(cpu: int) -> str:
    """The file of CPU ``cpu``'s ring-buffer pages in a recording's directory."""
    return f"cpu{cpu}.raw"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def stale_instances(instances: Path, prefix: str) -> list[Path]:
    """The instances under ``instances`` named ``<prefix><pid>`` whose process is gone."""
    stale = []
    try:
        entries = list(instances.iterdir())
    except OSError:
        return stale
    for path in entries:
        owner = path.name.removeprefix(prefix)
        if path.name.startswith(prefix) and owner.isdigit() and not pid_alive(int(owner)):
            stale.append(path)
    return stale


def remove_instance(path: Path) -> None:
    """Switch an instance off and remove it; retries while a reader still holds a file open."""
    for name, value in (("tracing_on", "0"), ("events/enable", "0")):
        try:
            _write(path / name, value)
        except OSError:
            pass
    for attempt in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == 49:
                raise ProbeError(f"cannot remove tracefs instance {path}: {exc.strerror}") from None
            time.sleep(0.02)


class _Drain(threading.Thread):
    """Copies one CPU's raw ring-buffer pages to a file until told to stop, then empties it.

    While the run lasts it reads only whole pages' worth of events: each poll reads the CPU's
    unread bytes (the ``bytes:`` line of its ``stats``) and takes that many pages. A read that
    catches up with the writer gets the page being written, however little it holds: reading to
    the end at every poll left a CPU with few events a file of mostly empty pages (37 % full on
    average in a 1 s ping-pong recording). The last read, at stop, takes everything."""

    def __init__(self, src: Path, dst: Path, page_size: int, stall: tuple[int, int] | None = None,
                 stats: Path | None = None):
        super().__init__(name=f"drain-{src.parent.name}", daemon=True)
        self.src, self.dst, self.page_size = src, dst, page_size
        self.stall = stall  # (from, until) CLOCK_MONOTONIC ns: do not read (expert option)
        self.stats = stats
        self.stopping = threading.Event()
        self.bytes = 0
        self.error: BaseException | None = None

    def _whole_pages(self, stats_fd: int | None) -> int | None:
        """Pages the unread events fill (a page holds page_size - 16 bytes of them: its
        timestamp and commit words come first); None if the stats cannot say (read to the end)."""
        if stats_fd is None:
            return None
        try:
            unread = _parse_stats(os.pread(stats_fd, 4096, 0).decode(errors="replace")).get("bytes")
        except OSError:
            return None
        return unread // (self.page_size - 16) if isinstance(unread, int) else None

    def run(self):
        try:
            fd = os.open(self.src, os.O_RDONLY | os.O_NONBLOCK)
            stats_fd = None
            try:
                if self.stats is not None:
                    try:
                        stats_fd = os.open(self.stats, os.O_RDONLY)
                    except OSError:
                        pass        # read to the end at every poll, as without stats
                with open(self.dst, "wb") as out:
                    while True:
                        final = self.stopping.is_set()  # read once more after the stop request
                        if self.stall and not final and self.stall[0] <= \
                                time.clock_gettime_ns(time.CLOCK_MONOTONIC) < self.stall[1]:
                            self.stopping.wait(0.01)
                            continue
                        want = None if final else self._whole_pages(stats_fd)   # None: all
                        got = 0
                        while want is None or got < want:
                            try:
                                page = os.read(fd, self.page_size)
                            except BlockingIOError:
                                break
                            if not page:
                                break
                            # keep pages aligned; commit says the length
                            if len(page) < self.page_size:
                                page += bytes(self.page_size - len(page))
                            out.write(page)
                            self.bytes += len(page)
                            got += 1
                        if final:
                            return
                        if not got or want is None or got < want:   # no more whole pages for now
                            self.stopping.wait(DRAIN_IDLE_S)
            finally:
                os.close(fd)
                if stats_fd is not None:
                    os.close(stats_fd)
        except BaseException as exc:  # reported by stop(), never lost
            self.error = exc


#: the file a run's trace formats are written to in one piece by a probe told to
#: (:meth:`TracefsProbe.formats_in_one_file`), beside where its formats/ directory goes; the host
#: unpacks it into that directory as it lands the run (:func:`unpack_formats`)
FORMATS_FILE = "formats.json"


def unpack_formats(raw_dir: Path) -> bool:
    """The formats a probe wrote in one piece (:data:`FORMATS_FILE`) in ``raw_dir`` written out
    as the ``formats/`` directory every reader takes, and the file removed; False if there is none.
    TraceCorrupt naming the file if it is not such a file."""
    path = Path(raw_dir) / FORMATS_FILE
    if not path.exists():
        return False
    try:
        files = json.loads(path.read_text())
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ValueError("not a map of file names to texts")
    except ValueError as exc:
        raise TraceCorrupt(f"{path}: not the trace formats of a run ({exc})") from None
    for rel in files:
        parts = Path(rel).parts
        if parts[:1] != ("formats",) or ".." in parts or Path(rel).is_absolute():
            raise TraceCorrupt(f"{path}: a file outside formats/: {rel!r}")
    for rel, text in files.items():
        dest = Path(raw_dir) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(text.encode("latin-1"))
    path.unlink()
    return True


#: per-CPU counters in ``stats`` that only grow until the buffer is reset
CUMULATIVE_STATS = ("overrun", "commit overrun", "dropped events", "read events")


class _KeptInstance:
    """A configured instance that consecutive probes of this process reuse (see :meth:`session`).

    Creating an instance (ring-buffer allocation, tracepoint registration) and removing it cost
    ~0.1 s per run. Between runs the buffer is already empty (the drains read it to the end), so a
    run records the kernel's counters at its start and reports its own losses net of them; the
    buffer is reset (emptied, counters zeroed: ~10-40 ms, an RCU grace period) only when it is not
    empty or the previous run lost events.
    """

    def __init__(self, path: Path, config: tuple, meta: dict, formats: dict[str, bytes]):
        self.path, self.config, self.meta, self.formats = path, config, meta, formats
        self.user: TracefsProbe | None = None  # the probe recording in it, if one is
        self.needs_reset = False


class TracefsProbe(Probe):
    name = "tracefs"
    check_name = "tracefs_instances"
    #: the instance shared by the probes of an open :meth:`session` (None: one instance per probe)
    _kept: _KeptInstance | None = None
    _session_open = False
    #: formats written in one file (:data:`FORMATS_FILE`) rather than a directory of them
    _formats_one_file = False

    @classmethod
    def formats_in_one_file(cls) -> None:
        """From now on, probes of this process write a run's trace formats as one file
        (:data:`FORMATS_FILE`), not a directory of ~14 and as many files: for the VM agent, whose
        runs are written on the host's share, where each file or directory made is a round trip
        (~0.25 s a run under TCG: bench/README.md). The host unpacks it as it lands the run
        (:func:`harmony.run.land`)."""
        cls._formats_one_file = True

    @staticmethod
    def data_files() -> list[str]:
        """The files a recording streams into its directory while the run is measured: one for
        each CPU the kernel may have (an instance's ``per_cpu/cpuN``), as its drains name them.
        For the VM agent, which makes a run in its memory but these on the host's share
        (:class:`harmony.run.Staged`)."""
        return [_data_name(c) for c in range(_ncpus(tracefs_root()))]

    def __init__(self, out_dir: Path, cpus: list[int], duration_s: float,
                 buffer_kb: int | None = None, events: tuple[str, ...] = SCHED_EVENTS,
                 drain_stall: tuple[float, float] | None = None):
        super().__init__(out_dir, cpus, duration_s)
        buffer_kb, self.drain_stall = _expert_options(buffer_kb, drain_stall)
        self.buffer_kb = buffer_kb or 8192
        self.events = events
        self.instance: Path | None = None
        self._drains: list[_Drain] = []
        self._stats_at_start: dict | None = None  # a reused instance's counters when this run began
        self._marker_fd: int | None = None
        self.meta: dict = {}

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if os.geteuid() != 0:
            return False, "the tracefs probe needs root"
        try:
            root = tracefs_root()
        except ProbeError as exc:
            return False, str(exc)
        missing = [e for e in REQUIRED_TRACEPOINTS if not (root / "events/sched" / e).is_dir()]
        if missing:
            return False, f"tracepoints missing: {', '.join(missing)}"
        return True, ""

    @classmethod
    def reclaim_stale(cls) -> list[str]:
        removed = []
        # a doctor's too (a run's check of its host makes one): stopped as it made it
        for path in (stale_instances(TRACEFS / "instances", PREFIX)
                     + stale_instances(TRACEFS / "instances", DOCTOR_INSTANCE_PREFIX)):
            remove_instance(path)
            removed.append(f"tracefs instance {path.name}")
        return removed

    @classmethod
    def doctor_check(cls, facts: dict, test_record: bool = True) -> dict:
        """``harmony doctor``'s ``tracefs_instances`` check: can an instance of one's own be made,
        as each run makes one, with the sched events in it, and removed again? The test instance
        is ``harmony-doctor-<pid>``; those of doctors that died before removing theirs are removed
        first (``reclaimed``). No event is enabled."""
        tracefs = facts["tracefs"].get("path")
        if not tracefs:
            return check(MISSING, "tracefs not mounted", creatable=False, reclaimed=[])
        instances = Path(tracefs) / "instances"
        try:
            os.listdir(instances)
        except FileNotFoundError:
            return check(MISSING, f"no {instances} (kernel too old?)", creatable=False,
                         reclaimed=[])
        except OSError as e:
            hint = " (need root)" if not hostfacts.is_root() else ""
            return check(WARN, f"{instances}: {e.strerror or e}{hint}", creatable=False,
                         reclaimed=[])
        reclaimed = []
        for path in stale_instances(instances, DOCTOR_INSTANCE_PREFIX):
            try:
                path.rmdir()
                reclaimed.append(path.name)
            except OSError:
                pass
        inst = instances / f"{DOCTOR_INSTANCE_PREFIX}{os.getpid()}"
        created = False
        error = None
        has_sched = False
        removed = True
        try:
            inst.mkdir()
            created = True
            has_sched = (inst / "events/sched/sched_switch/enable").exists()
        except OSError as e:
            error = e.strerror or str(e)
        finally:
            # a stop between mkdir and the flag: the instance is there, and ours all the same
            if created or inst.is_dir():
                removed = False
                for attempt in range(20):
                    try:
                        inst.rmdir()
                        removed = True
                        break
                    except FileNotFoundError:
                        removed = True
                        break
                    except OSError:
                        time.sleep(0.05 * (attempt + 1))
        facts = dict(creatable=created, removed=removed, sched_events=has_sched,
                     reclaimed=reclaimed, path=str(instances))
        if not created:
            hint = " (need root)" if not hostfacts.is_root() else ""
            return check(WARN if not hostfacts.is_root() else MISSING,
                         f"cannot create: {error}{hint}", **facts)
        if not removed:
            return check(WARN, f"created but could not remove {inst}", **facts)
        if not has_sched:
            return check(WARN, "creatable, but without events/sched", **facts)
        return check(OK, "create + remove works", **facts)

    @classmethod
    def cannot_record(cls, facts: dict) -> str | None:
        """Not without tracefs mounted, the :data:`REQUIRED_TRACEPOINTS`, and an instance of its
        own with the sched events."""
        mount, tracepoints, own = (facts["tracefs"], facts["sched_tracepoints"],
                                   facts[cls.check_name])
        if not mount.get("mounted"):
            return f"tracefs: {mount['detail']}"
        if missing_tracepoints(tracepoints):
            return f"tracefs: {tracepoints['detail']}"
        if not own.get("creatable") or not own.get("sched_events"):
            return f"tracefs instances: {own['detail']}"
        return None

    @classmethod
    @contextlib.contextmanager
    def session(cls):
        """Consecutive captures of this process share one instance until the block ends.

        A suite or batch holds the host lock across its runs and records them one after another:
        the instance is created by the first run, emptied (buffer and counters) for each next one,
        and removed when the block ends, also on error. A process killed inside the block leaves
        the instance behind, named after its pid, for the next run's stale-state sweep.
        """
        if cls._session_open:
            raise ProbeError("a tracefs session is already open in this process")
        cls._session_open = True
        try:
            yield
        finally:
            cls._session_open = False
            kept = cls._kept
            if kept is not None and kept.user is not None:
                try:
                    kept.user.stop()  # still recording: the block ended by an error
                except ProbeError:
                    pass  # its instance is removed below all the same
            cls._kept = None
            if kept is not None:
                remove_instance(kept.path)

    def _config(self) -> tuple:
        return (self.buffer_kb, tuple(self.events), self.drain_stall)

    def start(self) -> None:
        kept = TracefsProbe._kept
        if kept is not None and kept.user is None and kept.config == self._config():
            try:
                self._reuse(kept)
            except BaseException as exc:
                TracefsProbe._kept = None  # not trusted again: stop() removes it
                self._stop_after(exc)
                raise
            return
        ok, why = self.available()
        if not ok:
            raise ProbeError(why)
        root = tracefs_root()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.instance = root / "instances" / f"{PREFIX}{os.getpid()}"
        if kept is not None and kept.path == self.instance:  # an incompatible kept one: replace it
            TracefsProbe._kept = None
            remove_instance(kept.path)
        try:
            self.instance.mkdir()
        except FileExistsError:
            raise ProbeError(f"tracefs instance {self.instance.name} already exists "
                             "(another run of this process?)")
        try:
            self._configure(root)
        except BaseException as exc:
            self._stop_after(exc)
            raise
        if TracefsProbe._session_open:
            TracefsProbe._kept = _KeptInstance(self.instance, self._config(), dict(self.meta),
                                               self._formats)
            TracefsProbe._kept.user = self

    def _stop_after(self, exc: BaseException) -> None:
        """:meth:`stop` as :meth:`start` fails with ``exc``: what stop() could not do is added to
        ``exc``'s notes, never raised in its place (a Ctrl-C raised as a ProbeError was a
        suite's failed configuration, and the suite went on)."""
        try:
            self.stop()
        except ProbeError as err:
            exc.add_note(str(err))

    def _reuse(self, kept: _KeptInstance) -> None:
        """Start recording in the kept instance: buffer emptied, formats and meta as configured."""
        kept.user = self
        self.instance = kept.path
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._write_formats(kept.formats)
        self.meta = {k: v for k, v in kept.meta.items() if k not in ("started_ns",)}
        self.meta["instance_reused"] = True
        per_cpu = kept.path / "per_cpu"
        start = {str(c): _read_stats(per_cpu / f"cpu{c}" / "stats") for c in self.meta["cpus"]}
        if kept.needs_reset or any(st.get("entries") for st in start.values()):
            # opening `trace` for writing with O_TRUNC empties every CPU's buffer and its counters
            with open(kept.path / "trace", "w"):
                pass
            kept.needs_reset, start = False, None
        self.meta["instance_reset"] = start is None
        self._stats_at_start = start
        self._start_recording(kept.path, self.meta["page_size"], len(self.meta["cpus"]))

    def _configure(self, root: Path) -> None:
        inst = self.instance
        _write(inst / "tracing_on", "0")
        clocks = (inst / "trace_clock").read_text().replace("[", "").replace("]", "").split()
        clock = next((c for c in PREFERRED_CLOCKS if c in clocks), clocks[0])
        _write(inst / "trace_clock", clock)
        _write(inst / "buffer_size_kb", str(self.buffer_kb))
        _write(inst / "options/overwrite", "0")  # a full buffer drops new events and counts them
        enabled, missing = [], []
        for ev in self.events:
            if (inst / "events/sched" / ev / "enable").exists():
                _write(inst / "events/sched" / ev / "enable", "1")
                enabled.append(f"sched/{ev}")
            else:
                missing.append(ev)
        filters = {}
        for system, ev, flt in CAUSE_EVENTS:     # what tells why a task moved, where present
            d = inst / "events" / system / ev
            if not (d / "enable").exists():
                missing.append(f"{system}:{ev}")
                continue
            if flt:
                try:
                    _write(d / "filter", flt)
                    filters[f"{system}:{ev}"] = flt
                except OSError as exc:      # recorded whole: the analysis keeps what it needs
                    filters[f"{system}:{ev}"] = f"none ({exc.strerror or exc})"
            _write(d / "enable", "1")
            enabled.append(f"{system}/{ev}")
        enabled.append("ftrace/print")  # trace_marker writes; always recorded
        self._save_formats(root, enabled)
        page_size = os.sysconf("SC_PAGE_SIZE")
        sub_kb = inst / "buffer_subbuf_size_kb"
        if sub_kb.exists():
            page_size = int(sub_kb.read_text()) * 1024
        ncpu = _ncpus(inst)
        self.meta = {
            "probe": self.name, "instance": inst.name, "clock": clock, "page_size": page_size,
            "cpus": list(range(ncpu)), "events_enabled": enabled, "events_missing": missing,
            "event_filters": filters,
            "buffer_kb_per_cpu": self.buffer_kb, "kernel": os.uname().release,
            "instance_reused": False,
        }
        self._start_recording(inst, page_size, ncpu)

    def _start_recording(self, inst: Path, page_size: int, ncpu: int) -> None:
        """Open the marker file, start one drain per CPU, switch tracing on. The file and each
        drain are the probe's as they are made, whatever signal comes (stop() closes and joins
        them): one left out holds the instance busy, which then cannot be removed (a Ctrl-C
        between a drain's start and its keeping left a suite's instance behind)."""
        stall = None
        if self.drain_stall:
            t = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(self.drain_stall[0] * 1e9)
            stall = (t, t + int(self.drain_stall[1] * 1e9))
            self.meta["drain_stall_s"] = list(self.drain_stall)
            self.meta["notes"] = ["expert option: the drains stopped reading for "
                                  f"{self.drain_stall[1]:g} s from {self.drain_stall[0]:g} s "
                                  f"after the start ({ENV_DRAIN_STALL})"]
        with signals_held():
            self._marker_fd = os.open(inst / "trace_marker", os.O_WRONLY)
            for cpu in range(ncpu):
                cpu_dir = inst / "per_cpu" / f"cpu{cpu}"
                d = _Drain(cpu_dir / "trace_pipe_raw", self.out_dir / _data_name(cpu), page_size,
                           stall, cpu_dir / "stats")
                d.start()
                self._drains.append(d)
        _write(inst / "tracing_on", "1")
        self.meta["started_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)

    def _save_formats(self, root: Path, enabled: list[str]) -> None:
        """The instance's header and event formats, kept (``self._formats``: a reused instance
        writes them again for each run) and written (:meth:`_write_formats`)."""
        self._formats = {f"formats/{name}": (root / "events" / name).read_bytes()
                         for name in ("header_page", "header_event")}
        self._formats.update({f"formats/{ev}/format": (root / "events" / ev / "format").read_bytes()
                              for ev in enabled})
        self._write_formats(self._formats)

    def _write_formats(self, files: dict[str, bytes]) -> None:
        """``files`` (path under the probe's directory: bytes) as the formats/ directory, or as
        one file (:meth:`formats_in_one_file`)."""
        if TracefsProbe._formats_one_file:
            atomic_write(self.out_dir / FORMATS_FILE,
                         json.dumps({rel: data.decode("latin-1") for rel, data in files.items()}))
            return
        for parent in sorted({(self.out_dir / rel).parent for rel in files}):
            parent.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            (self.out_dir / rel).write_bytes(data)

    def mark(self, text: str) -> int:
        if self._marker_fd is None:
            raise ProbeError("the tracefs probe is not recording")
        give_up = time.monotonic() + MARK_RETRY_S
        while True:
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            try:
                os.write(self._marker_fd, text.encode())
                return now
            except OSError as exc:
                # EBADF: the kernel refuses a marker while the (non-overwriting) buffer is full
                if exc.errno != errno.EBADF or time.monotonic() > give_up:
                    raise ProbeError(f"marker {text!r} could not be written to the trace "
                                     f"({exc.strerror}): the ring buffer stayed full") from None
                time.sleep(0.002)

    def stop(self) -> None:
        if self.instance is None:
            return
        inst, self.instance = self.instance, None
        errors = []
        try:
            _write(inst / "tracing_on", "0")
            self.meta["stopped_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        except OSError as exc:
            errors.append(f"tracing_on: {exc}")
        for d in self._drains:
            d.stopping.set()
        for d in self._drains:
            d.join()
            if isinstance(d.error, OSError) and d.error.errno in (errno.ENOSPC, errno.EDQUOT,
                                                                  errno.EIO):
                errors.append(f"writing {d.dst}: {d.error.strerror}")     # a full disk, most likely
            elif d.error is not None:
                errors.append(f"{d.name}: {d.error}")
        self.meta["stats"] = {}
        base = self._stats_at_start or {}
        for cpu in range(len(self._drains)):
            try:
                st = _read_stats(inst / "per_cpu" / f"cpu{cpu}" / "stats")
            except OSError as exc:
                errors.append(f"stats cpu{cpu}: {exc}")
                continue
            for key in CUMULATIVE_STATS:  # this run's share of a reused instance's counters
                if key in st and key in base.get(str(cpu), {}):
                    st[key] -= base[str(cpu)][key]
            self.meta["stats"][str(cpu)] = st
        if base:
            self.meta["stats_at_start"] = base
        self.meta["bytes"] = sum(d.bytes for d in self._drains)
        self.meta["errors"] = errors
        if self._marker_fd is not None:
            os.close(self._marker_fd)
            self._marker_fd = None
        self._drains = []
        kept = TracefsProbe._kept
        try:
            if kept is not None and kept.path == inst and not errors:
                kept.user = None  # the session's: used by the next run, removed at its end
                kept.needs_reset = any(st.get(k) for st in self.meta["stats"].values()
                                       for k in ("overrun", "commit overrun", "dropped events"))
            else:
                if kept is not None and kept.path == inst:
                    TracefsProbe._kept = None
                remove_instance(inst)
        finally:
            if self.out_dir.is_dir():
                try:
                    atomic_write(self.out_dir / "meta.json", json.dumps(self.meta, indent=1))
                except OSError as exc:       # e.g. a full disk: the run says so, and is incomplete
                    errors.append(f"writing {self.out_dir / 'meta.json'}: {exc.strerror or exc}")
        if errors:
            raise ProbeError("tracefs probe: " + "; ".join(errors))

    @classmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        # the decoder (pandas, numba) is imported to decode only: the guest agent records with
        # this probe in a virtual machine and leaves the decoding to the host
        from harmony.probes.ringbuf import decode_dir

        return decode_dir(Path(out_dir))


def _read_stats(path: Path) -> dict:
    """per_cpu/cpuN/stats as numbers: entries, overrun, commit overrun, dropped events,
    read events..."""
    return _parse_stats(path.read_text())


def _parse_stats(text: str) -> dict:
    """The text of a per_cpu/cpuN/stats file as {key: number} (a value that is not one: str)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        try:
            out[key.strip()] = float(value) if "." in value else int(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out
