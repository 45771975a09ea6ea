"""One experiment run, end to end: capture (workload + probe) then analysis, into a run directory.

``execute`` is what ``harmony run`` does. Capture and analysis are separate steps (``capture`` and
:func:`harmony.pipeline.analyse`) so a stored capture can be analysed again, e.g. by a newer
Harmony, or in another process (a suite's background analyser), or on the host when the capture
was made in a virtual machine.

The capture's side tables (tasks, the kernel's own view, the workers' counters) go to a *table
sink*: on the host :class:`ParquetTables` builds each one's frame and stores it as Parquet; in a
virtual machine the guest agent (:mod:`harmony.vm.guest`) passes :class:`JsonRows`, which keeps the
plain rows as JSON, and the host turns them into the same Parquet tables (:func:`land`) before it
analyses the run. This module imports no pandas (nor the analysis) for the guest's sake: the
analysis is imported where a run is analysed.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import signal
import stat
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from harmony import store
from harmony.core.errors import ControllerError, TraceCorrupt
from harmony.core.memory import stop_prefault
from harmony.core.stops import held, raise_stop
from harmony.core.timing import Laps
from harmony.core.wording import plural
from harmony.hygiene import HostLock, reclaim_stale
from harmony.manifest import new_manifest, now, reason
from harmony.probes import ProbeError, domains, get_probe, proc_sched, schedstat, tracefs
from harmony.probes.proc_sched import KERNEL_COUNTERS
from harmony.probes.proc_stat import KERNEL_SAMPLES, KernelSampler
from harmony.probes.sched_debug import KERNEL_NR_RUNNING
from harmony.probes.schema import MARK_END
from harmony.vm import scx as scx_mod
from harmony.workload.controller import (
    Workload,
    check_classes,
    keep_off,
    lower_threads,
    put_back,
    raise_threads,
    warm_s,
)
from harmony.workload.tasks import sched_classes, task_rows, tasks_from_rows

#: the side tables a capture stores beside its raw recording, each with the function that builds
#: its frame from its rows (the declarations: harmony.workload.tasks.TASKS and the samplers' tables)
SIDE_TABLES = {"tasks": tasks_from_rows, "kernel_samples": KERNEL_SAMPLES.from_rows,
               "kernel_counters": KERNEL_COUNTERS.from_rows,
               "kernel_nr_running": KERNEL_NR_RUNNING.from_rows}
#: how :class:`JsonRows` names a side table's file (``<name>.rows.json``)
ROWS_SUFFIX = ".rows.json"
#: the file a run made in a virtual machine arrives in (:class:`Staged`), unpacked by :func:`land`
HANDED_NAME = "guest-run.tar"


class ParquetTables:
    """The host's table sink: each side table built as a frame and stored as
    ``<name>.parquet``; ``put`` returns the frame, kept for the analysis that follows."""

    def put(self, out: Path, name: str, rows: list[tuple]):
        frame = SIDE_TABLES[name](rows)
        store.write_table(out, name, frame)
        return frame


class JsonRows:
    """The guest agent's table sink: each side table's rows as they are, in
    ``<name>.rows.json`` (no pandas in the guest); :func:`land` makes the Parquet tables of them
    on the host. ``put`` returns None: nothing is analysed in the guest."""

    def put(self, out: Path, name: str, rows: list[tuple]):
        store.write_json(Path(out) / f"{name}{ROWS_SUFFIX}", {"table": name, "rows": rows})
        return None


class Staged:
    """A run made in the guest's memory and handed to its directory on the host's share as one
    file (:data:`HANDED_NAME`), which :func:`unpack` opens there.

    A file written onto a VM's 9p share costs round trips to the host: an atomic write (a
    temporary file created, written, renamed) took ~30 ms under TCG, and a run writes its
    manifest, its side tables, its probe's formats and meta, a server's records a dozen times
    or more (bench/README.md). Made in memory and handed over once, they cost one file. The
    files a probe streams while the run is measured (``streamed``: probe name -> the names of
    its files in ``raw/<probe>``) alone are links to the run directory's: a recording streams
    onto the share as before (the guest's memory is not sized for a long one). The run
    directory on the share has nothing else until the run is handed over: a run the guest did
    not finish (the VM died) is not there, and the host marks it incomplete as it did a run
    whose manifest said "running"."""

    def __init__(self, run_dir: Path, memory: str, streamed: dict[str, list[str]] | None = None):
        self.run_dir = Path(run_dir)
        self.path = Path(tempfile.mkdtemp(prefix="hmy-run-", dir=memory))
        try:
            for name, files in (streamed or {}).items():
                shared = store.make_run_dir(self.run_dir / "raw" / name)
                (self.path / "raw" / name).mkdir(parents=True)
                for f in files:
                    os.symlink(shared / f, self.path / "raw" / name / f)
        except BaseException:
            self.discard()
            raise

    def hand_over(self) -> None:
        """Write what the run made in memory (the links to the streamed files aside) into the run
        directory as one file, written whole (one write on the share, renamed into place); the
        memory is freed whatever happens."""
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for top, dirs, files in os.walk(self.path):
                    dirs.sort()
                    for name in [*dirs, *sorted(files)]:
                        self._add(tar, os.path.join(top, name))
            store.atomic_write(self.run_dir / HANDED_NAME, buf.getbuffer())
        finally:
            self.discard()

    def _add(self, tar: tarfile.TarFile, path: str) -> None:
        """One file or directory; not a link (a probe's, on the share already). Not
        ``tar.add``: it names each file's owner from /etc/passwd and /etc/group, files on the
        share in a guest (0.15 s a run under TCG)."""
        st = os.lstat(path)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return
        info = tarfile.TarInfo(os.path.relpath(path, self.path))
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            return
        info.size = st.st_size
        with open(path, "rb") as f:
            tar.addfile(info, f)

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def unpack(run_dir: Path) -> bool:
    """Unpack a run a guest handed over (:class:`Staged`) into ``run_dir``, then remove its file;
    False when there is none. Only plain files and directories below ``run_dir`` are taken.
    Raises RunError naming a file that is not such an archive. Idempotent: the file goes only
    once all it holds is in place."""
    path = Path(run_dir) / HANDED_NAME
    if not path.exists():
        return False
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                parts = Path(member.name).parts
                if (not parts or member.name.startswith("/") or ".." in parts
                        or not (member.isfile() or member.isdir())):
                    raise store.RunError(f"{path}: {member.name!r} is not a run's file")
                dest = Path(run_dir, *parts)
                if member.isdir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                store.atomic_write(dest, tar.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise store.RunError(f"{path}: not a run handed over by a guest ({exc})") from None
    path.unlink()
    return True


def land(run_dir: Path) -> list[str]:
    """Turn the side tables a :class:`JsonRows` sink wrote in ``run_dir`` into the Parquet tables
    :class:`ParquetTables` writes (the same frames), removing the JSON, and a probe's formats
    written in one file into their directory (:func:`harmony.probes.tracefs.unpack_formats`);
    returns what it landed. A run handed over in one file (:class:`Staged`) is unpacked first
    (:func:`unpack`). Raises RunError naming a file that is not such a table."""
    unpack(run_dir)
    landed = []
    # a probe's formats written in one piece in the guest (TracefsProbe.formats_in_one_file)
    for raw in sorted((Path(run_dir) / "raw").glob("*/")):
        try:
            if tracefs.unpack_formats(raw):
                landed.append(f"{raw.name} formats")
        except TraceCorrupt as exc:
            raise store.RunError(str(exc)) from None
    for name, build in SIDE_TABLES.items():
        path = Path(run_dir) / f"{name}{ROWS_SUFFIX}"
        if not path.exists():
            continue
        record = store.read_json(path)
        rows = record.get("rows") if isinstance(record, dict) else None
        if record.get("table") != name or not isinstance(rows, list):
            raise store.RunError(f"{path}: not the rows of table {name}")
        try:
            store.write_table(run_dir, name, build(rows))
        except (TypeError, ValueError, IndexError) as exc:
            raise store.RunError(f"{path}: rows that do not fit table {name} ({exc})") from None
        path.unlink()
        landed.append(name)
    return landed


@dataclasses.dataclass
class Captured:
    """What :func:`capture` stored: the run directory, its manifest, and what the table sink
    returned for each side table it stored (frames on the host, kept in memory for the analysis
    that follows in this process)."""

    path: Path
    manifest: dict
    tables: dict


def _progress(label: str, seconds: float, stop: threading.Event, stream=sys.stderr,
              start: float | None = None) -> None:
    """Sleep until ``seconds`` after ``start`` (time.monotonic(); default now) showing progress on
    a terminal; returns early if ``stop`` is set."""
    start = time.monotonic() if start is None else start
    tty = stream.isatty()
    try:
        while True:
            left = seconds - (time.monotonic() - start)
            if left <= 0 or stop.is_set():
                break
            if tty:
                done = seconds - left
                bar = "#" * int(30 * done / seconds)
                stream.write(f"\r{label} [{bar:<30}] {done:5.1f}/{seconds:.1f} s")
                stream.flush()
            stop.wait(min(0.2, left))
    finally:    # also when Ctrl-C stops the wait: the error that follows gets a clean line
        if tty:
            stream.write("\r" + " " * (len(label) + 50) + "\r")
            stream.flush()


def capture(experiment, params: dict, cpus: list[int], out: Path, probe_name: str = "tracefs",
            seed: int = 0, facts: dict | None = None, quiet: bool = False,
            crosscheck: str | None = None, lock_held: bool = False, pause=None,
            resume=None, tables=None, scx: scx_mod.ScxSpec | None = None) -> Captured:
    """Run the workload under the probe and store the raw capture in ``out``; returns what it
    stored (:class:`Captured`).

    ``pause()`` / ``resume()``, if given, are called right before the workload is released and
    once it is stopped (or on any error): a caller's background work (KernelRunner's analyser)
    stops while the run is measured.

    The capture takes the host lock for its duration unless ``lock_held`` says the caller holds it
    already (a suite or batch holds it once across its runs, so no other run slips in between).

    ``crosscheck`` names a second probe that records the same run at the same time into
    ``out/raw/<name>/`` (every marker goes to both); the analysis compares the two.

    ``tables`` is the sink the side tables go to (default :class:`ParquetTables`; the guest
    agent's :class:`JsonRows`).

    ``scx`` names a sched_ext scheduler (:mod:`harmony.vm.scx`) started before the workers, watched
    over the run and stopped after (or a :class:`harmony.vm.scx.Kept` one, loaded already and
    left loaded); its record is the manifest's ``scx``, and the run is incomplete, with the
    reason, if the kernel ejected it.

    The manifest is written first with status "running"; it becomes "captured" only when the
    workload ran its full duration and the probe stopped cleanly, and "incomplete" (with the
    reason) on any error, Ctrl-C or SIGTERM. Every worker and every piece of kernel state is
    removed before this returns or raises. The phases are :class:`_Capture`'s methods.
    """
    run = _Capture(experiment, {**params, **experiment.draw(params, cpus, seed)}, cpus, Path(out),
                   probe_name, seed, crosscheck, pause, resume,
                   tables if tables is not None else ParquetTables(), scx)
    # set before the run is open: a stop as they were set (a C call, after which Python runs a
    # signal's handler) left the run open, its manifest "running"
    old_handlers = {s: signal.signal(s, raise_stop)
                    for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        run.open(facts or {}, lock_held)
        try:
            run.start()
            run.measure(quiet)
            run.collect()
            run.finish()
        except BaseException as exc:
            run.manifest["status"] = "incomplete"
            run.manifest["incomplete_reason"] = reason(exc)
            raise
        finally:
            run.close()
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return Captured(run.out, run.manifest, run.stored)


class _Capture:
    """The state of one :func:`capture` and its phases, in order: :meth:`open` (checks, the host
    lock, the run directory and its manifest), :meth:`start` (the scheduler under test, the
    workers, the probes and samplers), :meth:`measure` (the release and the window),
    :meth:`collect` (what the kernel counted, what the run was), :meth:`finish` (everything
    stopped, the side tables stored) and, whatever happened, :meth:`close` (nothing left)."""

    def __init__(self, experiment, params: dict, cpus: list[int], out: Path, probe_name: str,
                 seed: int, crosscheck: str | None, pause, resume, sink, scx):
        self.experiment, self.params, self.cpus, self.out = experiment, params, cpus, out
        self.probe_name, self.seed, self.crosscheck, self.scx = probe_name, seed, crosscheck, scx
        self.pause, self.resume, self.sink = pause, resume, sink
        self.stored: dict = {}
        self.specs = experiment.tasks(params, cpus)
        self.lock = self.reserve = self.manifest = None
        self.workload = self.sampler = self.probe = self.second = None
        self.counters = self.scheduler = self.schedstats = None
        self.raised: list[int] = []  # this process's threads at SCHED_FIFO while it is measured
        self.moved: dict[int, set[int]] = {}  # and those kept off the CPUs under test: their CPUs
        self.paused = False
        self.laps = Laps()  # manifest["timings_s"]["capture"]: what it spends besides its duration

    def open(self, facts: dict, lock_held: bool) -> None:
        """What the host cannot give the tasks, checked before anything; then the host lock
        (unless held), the run directory and its manifest ("running"). A refused run (HostBusy)
        leaves no trace, not even its directory; a stop leaves none, or the run marked
        incomplete."""
        check_classes(self.specs, self.cpus, warm_s(self.params))
        if self.scx is not None:
            scx_mod.check_classes(s.policy for s in self.specs)
            scx_mod.check_kernel()
        self.lock = None if lock_held else HostLock().acquire()
        try:
            manifest = new_manifest(self.experiment, self.params, self.cpus, self.probe_name,
                                    self.seed, facts, controller_pid=os.getpid(),
                                    sched_classes=sched_classes(self.specs))
            with store.new_run_dir(self.out):
                try:
                    # what a recording that fills the disk leaves room for: the manifest saying so
                    self.reserve = store.SpaceReserve(self.out)
                    store.write_json(self.out / "manifest.json", manifest)
                except BaseException:   # refused or stopped before the run had a manifest
                    if self.reserve is not None:
                        self.reserve.release()
                        self.reserve = None
                    raise
            self.manifest = manifest
        except BaseException as exc:
            if self.reserve is not None:    # written "running", then stopped as the block ended
                manifest.update(status="incomplete", incomplete_reason=reason(exc), ended_at=now())
                self.reserve.release()
                self.reserve = None
                store.write_json(self.out / "manifest.json", manifest)
            if self.lock:
                self.lock.release()
            raise

    def start(self) -> None:
        """The scheduler under test, the tasks' placement, the kernel's counting, the workers
        (forked before any probe thread exists), the probes, the samplers."""
        manifest, out, params = self.manifest, self.out, self.params
        # a caller holding the lock swept stale state when it took it (KernelRunner): no sweep per
        # run
        manifest["reclaimed"] = reclaim_stale() if self.lock else []
        # a previous run's decode may still be faulting in memory at SCHED_IDLE: a runnable task
        # on the CPUs measured, and a thread at the fork below
        stop_prefault()
        if self.scx is not None:   # first: the release reads whether sched_ext is enabled
            self.scheduler = (self.scx.for_run(out / scx_mod.LOG_NAME)
                              if isinstance(self.scx, scx_mod.Kept)
                              else scx_mod.Scheduler(self.scx, out / scx_mod.LOG_NAME))
            self.scheduler.start()
            manifest["reclaimed"] += self.scheduler.reclaimed
            manifest["host"] = {**manifest["host"], "scheduler": self.scheduler.ops,
                                "sched_ext": "enabled"}
            self.laps("scheduler")
        # tasks that keep records of their own are told where, and what the run settles only
        # now (the server's measured capacity, under the scheduler under test) joins its params
        self.specs, settled = self.experiment.place(self.specs, out, params, self.cpus)
        if settled:
            params.update(settled)
            manifest["params"] = {**manifest["params"], **settled}
            store.write_json(out / "manifest.json", manifest)
            self.laps("place")   # a server's calibration: what the run settled as it started
        # the kernel's own count of migrations by kind (/proc/schedstat, and the per-task ones
        # of /proc/<pid>/sched), turned on now if the kernel has it off: before the workers exist
        self.schedstats = schedstat.Reads()
        self.schedstats.begin()
        # the machine's shape where the tasks run: CPUs and scheduling domains (debugfs, with
        # sched/verbose on for the read where the kernel needs it, and /proc/schedstat)
        manifest["topology"] = domains.read()
        self.laps("counters")
        self.workload = Workload(self.specs, self.cpus, seed=self.seed, warm_s=warm_s(params))
        # before the probe's threads exist: fork with no threads running
        self.workload.spawn(laps=self.laps)
        self.stored["tasks"] = self.sink.put(out, "tasks", task_rows(self.specs,
                                                                     self.workload.pids))
        self.laps("tasks_table")
        self.probe = get_probe(self.probe_name)(out / "raw" / self.probe_name, self.cpus,
                                                params["duration"])
        if self.crosscheck:
            manifest["crosscheck_probe"] = self.crosscheck
            self.second = get_probe(self.crosscheck)(out / "raw" / self.crosscheck, self.cpus,
                                                     params["duration"])
            self.second.start()  # first: a perf child is forked before tracefs starts its threads
        self.probe.start()
        self.laps("probe_start")
        if params.get("sample_hz", 0) > 0:
            self.sampler = KernelSampler(self.workload.pids, params["sample_hz"], self.cpus)
            self.sampler.start()
        # each worker's own counters, read now and after the end: the trace must show the same
        ok, why = proc_sched.available()
        manifest["kernel_counters"] = {"read": ok, "why_not": why or None}
        if ok:
            self.counters = proc_sched.CounterReads(self.workload.pids)
            self.counters.take("start")
        self.schedstats.take("start")

    def measure(self, quiet: bool) -> None:
        """The release at t0, the measured window, the end marker."""
        workload, probe, second = self.workload, self.probe, self.second
        mark = probe.mark if second is None else _mark_both(probe, second)
        if self.pause:
            self.pause()
            self.paused = True
        # this thread stays SCHED_FIFO till the end marker, and the others are raised to it: they
        # sleep but for a few short steps, each of which would otherwise wait its turn among the
        # tasks (a CPU set with many more tasks than CPUs made the window 0.5 s longer than asked)
        workload.release(mark, keep_fifo=True)
        own = [int(t) for t in os.listdir("/proc/self/task")]
        # and the probes' own processes (perf record), which would otherwise wait their turn too
        own += [t for p in (probe, second) if p for t in p.helper_tids()]
        self.raised = raise_threads([t for t in own if t != threading.get_native_id()],
                                    prio=workload.fifo_prio)
        # all of them, this one too, on CPUs outside the set where there are any (a set smaller
        # than the machine): their time would come off the capacity of the CPUs under test
        self.moved, spare = keep_off(own, self.cpus)
        self.manifest["controller_cpus"] = spare if self.moved else None
        if self.sampler:
            self.sampler.begin.set()
        # our own threads (probe drains or perf record, sampler), the release's occupiers and a
        # sched_ext scheduler's threads: their CPU time is reported apart from foreign load
        self.manifest["controller_tids"] = sorted(own + workload.occupier_pids + (
            self.scheduler.tids() if self.scheduler else []))
        self.laps("release")
        # the window is counted from t0, not from here: the steps since take time, the more so
        # on a CPU set with many tasks
        _progress(f"{self.experiment.name}", self.params["duration"], threading.Event(),
                  stream=open(os.devnull, "w") if quiet else sys.stderr,
                  start=workload.t0_ns / 1e9)
        mark(MARK_END)
        self.laps("measure")

    def collect(self) -> None:
        """The workers stopped where they are (SIGSTOP), what the kernel counted read, and what
        makes the run no result raised: a sched_ext scheduler ejected, a worker dead."""
        manifest, workload = self.manifest, self.workload
        ejected = self.scheduler.ejected() if self.scheduler else None
        workload.freeze()
        lower_threads(self.raised)
        put_back(self.moved)
        if self.counters:
            self.counters.take("end")
        self.schedstats.take("end")
        manifest["kernel_schedstat"] = self.schedstats.facts()
        manifest["work_done"] = workload.work_counts()
        manifest["workers_alive_at_end"] = len(workload.alive())
        if ejected:
            raise scx_mod.ScxError(f"the sched_ext scheduler {self.scx.name} was ejected during "
                                   f"the run: {ejected}")
        gone = workload.unexpected_exits()
        if gone:    # the workload the experiment describes did not run: not a result
            raise ControllerError(f"{plural(len(gone), 'worker')} died during the run, not by the "
                                  f"experiment's design: {'; '.join(gone[:3])}")
        manifest["controller_notes"] = workload.notes
        manifest["release_method"] = workload.release_method  # cpuset or affinity (controller)
        manifest["release_mode"] = workload.release_mode  # occupied, confined or warm (controller)
        # the tasks' own t0, read just before the t0 marker: their exit and cut times count from it
        manifest["workers_t0_ns"] = workload.workers_t0_ns
        manifest["sched"] = workload.sched  # RT / deadline bandwidth, controller priority, warm-up

    def finish(self) -> None:
        """Everything stopped in order, the side tables stored, the run "captured"."""
        manifest, out, sink, sampler = self.manifest, self.out, self.sink, self.sampler
        if sampler:
            sampler.stopping.set()
            sampler.join()
        self.workload.stop()
        self.probe.stop()
        manifest["probe_meta"] = self.probe.meta
        if self.second:
            self.second.stop()
            manifest["crosscheck_meta"] = self.second.meta
        if self.paused:
            self.paused = False
            self.resume()
        self.laps("stop")
        if self.counters:
            self.stored["kernel_counters"] = sink.put(out, "kernel_counters", self.counters.rows)
            manifest["kernel_counters"]["unreadable"] = self.counters.missing
        if sampler:
            self.stored["kernel_samples"] = sink.put(out, "kernel_samples", sampler.rows)
            manifest["kernel_nr_running"] = {"sampled": sampler.nr is not None,
                                             "why_not": sampler.nr_why_not or None,
                                             "longest_sleep_s": sampler.longest_sleep,
                                             "errors": sampler.nr.errors if sampler.nr else []}
            if sampler.nr:
                self.stored["kernel_nr_running"] = sink.put(out, "kernel_nr_running",
                                                            sampler.nr.rows)
        manifest["status"] = "captured"
        self.laps("write")
        manifest["timings_s"] = {"capture": self.laps.steps}

    def close(self) -> None:
        """Whatever happened: nothing left running or changed (threads lowered, workers, the
        scheduler, the kernel's counting, the probes, the analyser resumed, the lock), and the
        manifest written as it ends; a stop that comes meanwhile is raised once that is done
        (:class:`harmony.core.stops.held`)."""
        with held():
            self._close()

    def _close(self) -> None:
        manifest = self.manifest
        lower_threads(self.raised)
        put_back(self.moved)
        if self.sampler:
            self.sampler.stopping.set()
        if self.workload:
            self.workload.stop()
        if self.scheduler:
            manifest["scx"] = self.scheduler.stop()
        if self.schedstats:
            self.schedstats.restore()
        for p in (self.probe, self.second):
            if p:
                try:
                    p.stop()
                except ProbeError as exc:
                    manifest.setdefault("cleanup_errors", []).append(str(exc))
        if self.paused:
            self.resume()
        if self.lock:
            self.lock.release()
        manifest["ended_at"] = now()
        self.reserve.release()
        store.write_json(self.out / "manifest.json", manifest)


def _mark_both(primary, second):
    """A mark function writing each marker to both probes; returns the primary's time."""
    def mark(text: str) -> int:
        ts = primary.mark(text)
        second.mark(text)
        return ts
    return mark


def execute(experiment, params: dict, cpus: list[int], out: Path, probe_name: str = "tracefs",
            seed: int = 0, facts: dict | None = None, quiet: bool = False,
            crosscheck: str | None = None, scx: scx_mod.ScxSpec | None = None) -> store.Run:
    """Capture then analyse one run; returns the loaded, complete run.

    Companions the experiment declares (``experiment.companions(params)``, e.g. a static-ideal
    placement) are captured and analysed first, each into ``out/<name>/`` as a complete run of its
    own (same CPU set, probe and seed; params updated by the overrides), so that the main run's
    analysis can read them with ``run.companion(name)``.
    """
    for name, overrides in experiment.companions(params).items():
        companion_params = experiment.resolve({**params, **overrides}, cpus)
        _analyse(capture(experiment, companion_params, cpus, Path(out) / name, probe_name, seed,
                         facts, quiet, scx=scx))
    return _analyse(capture(experiment, params, cpus, out, probe_name, seed, facts, quiet,
                            crosscheck=crosscheck, scx=scx))


def _analyse(captured: Captured) -> store.Run:
    """Analyse what was just captured, with the tables it kept in memory."""
    # the analysis (pandas, the decoders) is imported to analyse only: see the module docstring
    from harmony import pipeline

    t = captured.tables
    origin = pipeline.Origin("recorded", kernel_samples=t.get("kernel_samples"),
                             kernel_nr_running=t.get("kernel_nr_running"),
                             kernel_counters=t.get("kernel_counters"),
                             controller_tids=tuple(captured.manifest["controller_tids"]))
    return pipeline.analyse(captured.path, origin=origin, tasks=t["tasks"])
