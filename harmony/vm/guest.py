"""The guest agent, run inside a virtual machine: ``python3 -m harmony.vm.agent`` (its fork server
forked first, :mod:`harmony.vm.agent`, then :func:`main`), or ``python3 -m harmony.vm.guest``.

The host (:class:`harmony.vm.runner.VmRunner`) plans captures -- the experiment's parameters
resolved and drawn, its tasks, the run directory under the VM's one writable directory -- and
sends them as jobs: the first as a job file (:func:`write_job`), the next ones, if any, as one
JSON line each (:func:`job_line`) on virtme-ng's ``virtme.stdin`` virtio-serial port
(:func:`job_input`), as many as it likes in one boot; the agent ends when that input ends (or
says ``{"end": true}``), or after its first job where the guest has no such port.

The agent runs with the host's own Python and Harmony (the host's filesystem is shared
read-only), mounts tracefs and debugfs, reports the guest's facts (kernel release, scheduler,
CPUs, tracefs, debugfs...: :func:`harmony.doctor.doctor` with the tracefs probe only), then makes
each job's captures one after the other with :func:`harmony.run.capture`, the same function as on
the host, its side tables kept as plain rows (:class:`harmony.run.JsonRows`). It imports no
pandas, numba or matplotlib: nothing is decoded or analysed in the guest. The host lands each
capture and analyses it like any other. What one boot can pay once is paid once: the probe's
session (one tracefs instance), the fork server, the modules, and the server's calibration for a
CPU set and scheduler (:class:`Calibrations`).

The agent speaks in lines on its standard output (the VM's console), each ``@harmony {json}``
with an ``event`` (:func:`emit`):

    facts      the guest's facts, once, first (the host's boot time ends here), whether
               more jobs can come (``more``: the guest has the input port), and where the
               agent's Harmony came from (``modules``: the bundle, or the shared tree)
    start      run i of job j begins (its directory)
    measuring  run i's workload is about to be released (its measured window begins)
    measured   run i's workload is stopped (its window is over)
    done       run i is captured, or
    error      run i failed (message); the agent goes on with the next run
    flushed    every run of job j was tried (failed: how many failed)
    fatal      the agent itself failed (message: its error) and ends
    end        the agent's input ended; it ends

so that the host shows progress, and times each run's window on its own clock to read how long
the vCPU threads waited for a host CPU over it. Every line also carries the guest's
CLOCK_MONOTONIC when it was written (``mono_ns``): the same window on the guest's clock, to set
against the host's (under ``-icount`` the guest's time is QEMU's virtual clock, not the host's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from harmony import doctor, store
from harmony.core import osutil
from harmony.hygiene import HostLock
from harmony.manifest import reason
from harmony.probes import domains, get_probe, schedstat
from harmony.probes.tracefs import TracefsProbe
from harmony.run import JsonRows, Staged, capture
from harmony.vm.machine import LINE_PREFIX
from harmony.vm.scx import Kept, ScxSpec
from harmony.vm.topology import VmTopology
from harmony.vm.topology import check as check_topology
from harmony.vm.topology import parse as parse_topology
from harmony.workload import cpuset, forkserver, serve
from harmony.workload.tasks import TaskSpec

#: what a job file holds (its "format")
JOB_FORMAT = "harmony-guest-job/1"


def emit(event: str, stream=None, **fields) -> None:
    """Write one agent line: ``@harmony {"event": event, "mono_ns": ..., ...}`` (a single
    write; ``mono_ns``: the guest's CLOCK_MONOTONIC now)."""
    stream = stream or sys.stdout
    line = {"event": event, "mono_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC), **fields}
    stream.write(LINE_PREFIX + json.dumps(line, default=str) + "\n")
    stream.flush()


@dataclasses.dataclass
class PlannedRun:
    """One capture the guest makes, planned on the host: ``capture``'s arguments, with the
    experiment's parameters already drawn and its tasks listed (the guest does not import the
    experiment catalog, whose analyses need pandas)."""

    dir: str
    experiment: str
    question: str
    params: dict
    cpus: list[int]
    tasks: list[dict]
    probe: str = "tracefs"
    seed: int = 0
    scx: dict | None = None       # the sched_ext scheduler of the run (ScxSpec.to_dict())

    @classmethod
    def of(cls, experiment, params: dict, cpus: list[int], out: Path, probe: str,
           seed: int, scx: ScxSpec | None = None) -> "PlannedRun":
        """Plan ``experiment`` with ``params`` as :func:`harmony.run.capture` would run it."""
        drawn = {**params, **experiment.draw(params, cpus, seed)}
        specs = experiment.tasks(drawn, cpus)
        return cls(str(out), experiment.name, experiment.question, drawn, list(cpus),
                   [dataclasses.asdict(s) for s in specs], probe, seed,
                   scx.to_dict() if scx else None)


class PlannedExperiment:
    """What :func:`harmony.run.capture` asks of an experiment, answered from a PlannedRun."""

    def __init__(self, run: PlannedRun):
        self.name, self.question, self._run = run.experiment, run.question, run
        self.scratch: str | None = None     # where a server's tasks keep what they write

    def draw(self, params, cpus, seed) -> dict:
        return {}                       # drawn on the host already

    def tasks(self, params, cpus) -> list[TaskSpec]:
        return [TaskSpec(**t) for t in self._run.tasks]

    def place(self, specs, run_dir, params, cpus) -> tuple[list, dict]:
        """A server-shaped workload's tasks (``serve`` set) made ready in the guest, its capacity
        measured there (:func:`harmony.workload.serve.place`: what the host measured would not be
        the guest's), its records and pipes in a scratch directory of the guest's memory
        (:func:`memory_dir`), moved into the run by :meth:`keep` once its tasks are stopped;
        any other workload as it is (Experiment.place).

        Not in the run directory: it is the host's, shared over 9p, where opening a FIFO fails
        with ENXIO and each write is a round trip to the host (a record of 48 bytes took 3.6 ms
        under TCG, 28 us in the guest's memory, 2026-11-26): at one record per request and
        stage, the pool's reader fell so far behind the requests it took in that it never came
        to the answers, and the client read none (bench/README.md)."""
        if any(s.serve for s in specs):
            self.scratch = tempfile.mkdtemp(prefix="hmy-serve-", dir=memory_dir())
            return serve.place(specs, run_dir, params, cpus, scratch=self.scratch)
        return specs, {}

    def keep(self, run_dir: Path) -> None:
        """What the tasks wrote in the guest's memory (:meth:`place`), moved into ``run_dir``
        (:func:`harmony.workload.serve.keep_records`); nothing if they wrote nothing there."""
        if self.scratch is not None:
            serve.keep_records(self.scratch, run_dir)
            self.scratch = None


#: where the guest may keep what cannot sit on the host's share, first found in memory (tmpfs)
MEMORY_DIRS = ("/dev/shm", "/run", "/tmp", "/dev")


def memory_dir() -> str:
    """The first of :data:`MEMORY_DIRS` that is a file system in memory (tmpfs, devtmpfs): the
    guest's own, gone with the VM, where a FIFO works and a write stays in the guest (on the 9p
    share neither: :meth:`PlannedExperiment.place`)."""
    with open("/proc/mounts") as f:
        kinds = {fields[1]: fields[2] for fields in (line.split() for line in f) if len(fields) > 2}
    for d in MEMORY_DIRS:
        if kinds.get(d) in ("tmpfs", "devtmpfs"):
            return d
    raise OSError(f"none of {', '.join(MEMORY_DIRS)} is a tmpfs here")


def write_job(path: Path, runs: list[PlannedRun], topology: str | None = None) -> None:
    """The job file of ``runs``; ``topology``: the VM's shape asked for (a --vm-topology spec),
    which the agent checks the guest got before any run (:func:`topology_problem`)."""
    store.write_json(path, {"format": JOB_FORMAT, "runs": [dataclasses.asdict(r) for r in runs],
                            "topology": topology})


def job_topology(path: Path) -> VmTopology | None:
    """The VM shape a job file asks for (:func:`write_job`), None if none."""
    spec = store.read_json(path).get("topology")
    return parse_topology(spec) if spec else None


def topology_problem(topo: VmTopology, facts: dict) -> str | None:
    """Why the guest did not get ``topo`` (one line), from its facts (the doctor's
    ``sched_domains`` check: the guest's topology as :func:`harmony.probes.domains.read`
    gives it); None if it did."""
    guest = (facts.get("doctor") or {}).get("sched_domains") or {}
    if "cpus" not in guest:
        return (f"--vm-topology {topo.spec()}: the guest's topology could not be read "
                f"({guest.get('detail', 'no sched_domains check')})")
    why = check_topology(topo, guest)
    return f"--vm-topology {topo.preset or topo.spec()}: {why}" if why else None


def job_line(runs: list[PlannedRun], job: int) -> str:
    """One job as the line the host sends on the agent's input."""
    return json.dumps({"format": JOB_FORMAT, "job": job,
                       "runs": [dataclasses.asdict(r) for r in runs]})


def job_runs(job, where: str) -> list[PlannedRun]:
    """The runs of a job (a dict); RunError naming ``where`` it came from if it is not one."""
    if not isinstance(job, dict) or job.get("format") != JOB_FORMAT:
        raise store.RunError(f"{where}: not a guest job ({JOB_FORMAT})")
    try:
        return [PlannedRun(**r) for r in job["runs"]]
    except (KeyError, TypeError) as exc:
        raise store.RunError(f"{where}: a run of the job is malformed ({exc})") from None


def read_job(path: Path) -> list[PlannedRun]:
    """The runs of a job file; RunError naming it if it is not one."""
    return job_runs(store.read_json(path), str(path))


def guest_facts() -> dict:
    """The guest's facts, as a run's manifest records a system's (:func:`doctor.run_facts`):
    tracefs and debugfs mounted if they are not, the tracefs probe only checked."""
    return doctor.run_facts(doctor.doctor(mount=True, test_record=False, probes=("tracefs",)))


class Calibrations:
    """What a boot measures once and every run of it reuses: the server's per-hop overhead
    (:func:`harmony.workload.serve.measure_overhead`) for a CPU set under a scheduler, measured
    in the first server run that needs it, then given to the next as a parameter, as ``-p
    overhead_ns=`` would be; each run's manifest says where its figure came from
    (``overhead_ns_from``). bench/README.md has what it saves and the figure's spread when it
    was measured for every run."""

    def __init__(self):
        self.overhead: dict[tuple, tuple[int, str]] = {}    # (cpus, scheduler) -> (ns, run dir)

    def params(self, run: PlannedRun) -> tuple[dict, str | None]:
        """``run``'s parameters with what was calibrated already, and whence (None: nothing)."""
        if run.params.get("overhead_ns", 1) or not any(t.get("serve") for t in run.tasks):
            return run.params, None
        got = self.overhead.get(self._key(run))
        if got is None:
            return run.params, None
        return {**run.params, "overhead_ns": got[0]}, got[1]

    def keep(self, run: PlannedRun, manifest_params: dict) -> None:
        """Keep what ``run`` measured (its manifest's parameters) for the next runs."""
        ns = manifest_params.get("overhead_ns")
        if ns and not run.params.get("overhead_ns") and self._key(run) not in self.overhead:
            self.overhead[self._key(run)] = (int(ns), run.dir)

    @staticmethod
    def _key(run: PlannedRun) -> tuple:
        return tuple(run.cpus), json.dumps(run.scx, sort_keys=True)


class Boot:
    """What the runs of one boot share (:func:`run_job`): the server's calibrations
    (:class:`Calibrations`) and the sched_ext schedulers kept loaded from one run to the next
    (:class:`harmony.vm.scx.Kept`: from the first job with two runs of one), stopped by
    :meth:`close`."""

    def __init__(self):
        self.calibrations = Calibrations()
        self.schedulers: dict[str, Kept] = {}

    def scheduler(self, run: PlannedRun, runs: list[PlannedRun]) -> Kept | ScxSpec | None:
        """``run``'s scheduler as a capture takes it: kept loaded where it is already, or where
        more of ``runs`` (its job) have it; else started and stopped for the run alone (a
        single run's record then says how it ended)."""
        if not run.scx:
            return None
        key = json.dumps(run.scx, sort_keys=True)
        if key not in self.schedulers:
            if sum(1 for r in runs if r.scx == run.scx) < 2:
                return ScxSpec.from_dict(run.scx)
            self.schedulers[key] = Kept(ScxSpec.from_dict(run.scx), Path(memory_dir()))
        return self.schedulers[key]

    def close(self) -> list[dict]:
        """Stop the schedulers kept loaded; their last records (:meth:`harmony.vm.scx.Kept.close`:
        how each ended, its exit reason and state after), one per scheduler that ran."""
        out = [kept.close() for kept in self.schedulers.values()]
        self.schedulers = {}
        return [r for r in out if r is not None]


def run_job(runs: list[PlannedRun], facts: dict, stream=None, boot: Boot | None = None,
            job: int | None = None) -> int:
    """Capture every run in turn, saying each step (:func:`emit`); returns how many failed.

    A probe that offers a session (tracefs: one instance for all the runs, emptied for each) keeps
    it open across the runs, as a suite on the host does (bench/README.md: what it saves per run
    under TCG). ``boot`` (:class:`Boot`) carries what is shared across jobs; without one, the
    job's own is closed at its end."""
    failed = 0
    own = boot is None
    boot = Boot() if own else boot
    tag = {} if job is None else {"job": job}
    with HostLock(), contextlib.ExitStack() as sessions:
        if own:
            sessions.callback(boot.close)
        for name in sorted({run.probe for run in runs}):
            session = getattr(get_probe(name), "session", None)
            if session is not None:
                sessions.enter_context(session())
        for i, run in enumerate(runs):
            emit("start", stream, run=i, dir=run.dir, **tag)
            planned = PlannedExperiment(run)
            params, whence = boot.calibrations.params(run)
            scheduler = boot.scheduler(run, runs)
            try:
                # made in the guest's memory, handed to the host's share in one file
                staged = Staged(Path(run.dir), memory_dir(), streamed=_streamed(run.probe))
            except Exception as exc:
                failed += 1
                emit("error", stream, run=i, message=reason(exc), **tag)
                continue
            try:
                try:
                    got = capture(planned, params, run.cpus, staged.path, run.probe, run.seed,
                                  facts, quiet=True, lock_held=True, tables=JsonRows(),
                                  scx=scheduler,
                                  pause=lambda i=i: emit("measuring", stream, run=i, **tag),
                                  resume=lambda i=i: emit("measured", stream, run=i, **tag))
                    boot.calibrations.keep(run, got.manifest.get("params", {}))
                finally:                  # the tasks are stopped: what they wrote joins the run
                    planned.keep(staged.path)
                    _unstage(staged, run, scheduler, whence)
                    staged.hand_over()
            except Exception as exc:      # one run's failure is reported; the next runs go on
                failed += 1
                emit("error", stream, run=i, message=reason(exc), **tag)
                continue
            finally:
                staged.discard()
            emit("done", stream, run=i, **tag)
    return failed


def _streamed(probe: str) -> dict[str, list[str]]:
    """The files probe ``probe`` streams onto the share while a run is measured (its
    ``data_files()``; none where it says none: all of it is then made in memory)."""
    files = getattr(get_probe(probe), "data_files", None)
    return {probe: files()} if files is not None else {}


def _unstage(staged: Staged, run: PlannedRun, scheduler, whence: str | None) -> None:
    """What the run's manifest says of where it was made, said of its own directory: the run a
    kept scheduler was loaded for; and whence its server overhead came (another run), if so."""
    if isinstance(scheduler, Kept) and scheduler.since == str(staged.path):
        scheduler.since = run.dir
    path = staged.path / "manifest.json"
    try:
        m = store.read_json(path)
    except store.RunError:
        return                            # refused before it had one: the host says so
    if (m.get("scx") or {}).get("loaded_since") == str(staged.path):
        m["scx"]["loaded_since"] = run.dir
    if whence is not None:
        m["overhead_ns_from"] = whence
    store.write_json(path, m)


def serve_jobs(lines, facts: dict, stream=None, boot: Boot | None = None) -> int:
    """Run each job of ``lines`` (:func:`job_line`) as it comes, until they end or one says
    ``{"end": true}``; each job ends with a ``flushed`` line. ``boot``: what the jobs share
    (:class:`Boot`; without one, a Boot of their own, closed at the end). Returns how many runs
    failed."""
    own = boot is None
    failed, boot = 0, Boot() if own else boot
    try:
        for k, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                job = json.loads(line)
            except ValueError:
                raise store.RunError(f"job line {k + 1} of the agent's input is not JSON") \
                    from None
            if isinstance(job, dict) and job.get("end"):
                break
            runs = job_runs(job, f"job line {k + 1} of the agent's input")
            n = run_job(runs, facts, stream, boot, job=job.get("job", k))
            emit("flushed", stream, job=job.get("job", k), failed=n)
            failed += n
    finally:
        if own:
            boot.close()
    return failed


#: the virtio-serial port virtme-ng gives a guest command as its standard input
INPUT_PORT = "virtme.stdin"
#: how long the port may take to appear once virtio_console is loaded
PORT_WAIT_S = 5.0


def _port(name: str) -> Path | None:
    """The sysfs directory of the virtio-serial port called ``name``, None if there is none."""
    for d in sorted(Path("/sys/class/virtio-ports").glob("*")):
        try:
            if (d / "name").read_text().strip() == name:
                return d
        except OSError:
            continue
    return None


def job_input():
    """The host's channel for more jobs: virtme-ng's ``virtme.stdin`` port, as lines. It is the
    agent's standard input where virtme-ng could give it (the guest kernel has virtio_console
    built in); else the port is opened here once virtio_console is loaded (a module in Debian's
    kernels: virtme-ng then runs the command on the console, whose input is nothing). None
    where the guest has no such port: it makes its one job and ends."""
    port = _port(INPUT_PORT)
    if port is None:
        subprocess.run(["modprobe", "-q", "virtio_console"], capture_output=True, timeout=60)
        give_up = time.monotonic() + PORT_WAIT_S
        while (port := _port(INPUT_PORT)) is None and time.monotonic() < give_up:
            time.sleep(0.05)
    if port is None:
        return None
    major, minor = (int(x) for x in (port / "dev").read_text().split(":"))
    st = os.fstat(0)
    if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major,
                                                                                     minor):
        return sys.stdin                # virtme-ng made it our input already
    dev = Path("/dev") / port.name
    if not dev.exists():
        os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    return open(dev, encoding="utf-8")


def main(argv: list[str]) -> int:
    """``JOBFILE [--more]``: make the job of the file; with ``--more``, then the jobs the host
    sends on the input channel (:func:`job_input`) until it ends. Without a channel, ``facts``
    says so (``more: false``) and the agent ends after its first job."""
    more = argv[1:] == ["--more"]
    if len(argv) != 1 + more:
        print("usage: python3 -m harmony.vm.guest JOBFILE [--more]", file=sys.stderr)
        return 2
    boot = Boot()
    # the guest's files go to the host's share, which the host makes durable as it lands them;
    # each file made there is a round trip: a run's trace formats in one
    osutil.no_fsync()
    store.compact_json()   # the host rewrites, indented, what it keeps
    TracefsProbe.formats_in_one_file()
    # nothing but Harmony changes the guest's shape: read again only when it changed
    domains.keep_within_the_boot()
    # nothing but Harmony uses the guest's cgroups: one run's cpusets kept for the next
    cpuset.keep_within_the_boot()
    # the fork server forked at the agent's start (harmony.vm.agent); else its start (a fresh
    # interpreter and its imports: ~1.5 s under TCG) made while the guest's facts are gathered,
    # not in the first run's set-up
    threading.Thread(target=forkserver.shared, name="harmony-forkserver-start",
                     daemon=True).start()
    try:
        # on for every run of the boot, never switched between them (under TCG a switch is slow
        # and may crash the guest): each run's kernel_schedstat says so
        schedstat.switch_on_for_the_boot()
        runs = read_job(Path(argv[0]))
        topology = job_topology(Path(argv[0]))
        facts = guest_facts()
        why = topology_problem(topology, facts) if topology is not None else None
        lines = job_input() if more and not why else None
        emit("facts", facts=facts, pid=os.getpid(), more=lines is not None,
             modules=osutil.harmony_top())
        if why:                 # a shape the guest did not get: no run is measured on it
            emit("fatal", message=why)
            return 1
        failed = run_job(runs, facts, boot=boot, job=0)
        emit("flushed", job=0, failed=failed)
        if lines is not None:
            failed += serve_jobs(lines, facts, boot=boot)
    except Exception as exc:    # said on the console, where the host reads it, and why in full
        emit("fatal", message=reason(exc))
        traceback.print_exc()
        return 1
    finally:
        closed = boot.close()
        if closed:            # how the schedulers kept across the runs ended: no run's manifest
            emit("schedulers", records=closed)
    emit("end", failed=failed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
