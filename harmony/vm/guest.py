"""The guest agent: ``python3 -m harmony.vm.guest JOBFILE``, run inside a virtual machine.

The host (:class:`harmony.vm.runner.VmRunner`) plans every capture of a boot -- the experiment's
parameters resolved and drawn, its tasks, the run directory under the VM's one writable directory
-- and writes them as a job file (:func:`write_job`). The agent runs with the host's own Python and
Harmony (the host's filesystem is shared read-only), mounts tracefs and debugfs, reports the
guest's facts (kernel release, scheduler, CPUs, tracefs, debugfs...: :func:`harmony.doctor.doctor`
with the tracefs probe only), then makes the captures one after the other with
:func:`harmony.run.capture`, the same function as on the host, its side tables kept as plain rows
(:class:`harmony.run.JsonRows`). It imports no pandas, numba or matplotlib: nothing is decoded or
analysed in the guest. The host lands each capture and analyses it like any other.

The agent speaks in lines on its standard output (the VM's console), each ``@harmony {json}``
with an ``event`` (:func:`emit`):

    facts      the guest's facts, once, first (the host's boot time ends here)
    start      run i begins (its directory)
    measuring  run i's workload is about to be released (its measured window begins)
    measured   run i's workload is stopped (its window is over)
    done       run i is captured, or
    error      run i failed (message); the agent goes on with the next run
    end        every run was tried

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
import sys
import tempfile
import time
from pathlib import Path

from harmony import doctor, store
from harmony.hygiene import HostLock
from harmony.manifest import reason
from harmony.probes import get_probe
from harmony.run import JsonRows, capture
from harmony.vm.machine import LINE_PREFIX
from harmony.vm.scx import ScxSpec
from harmony.vm.topology import VmTopology
from harmony.vm.topology import check as check_topology
from harmony.vm.topology import parse as parse_topology
from harmony.workload import serve
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
        measured there (:func:`harmony.workload.serve.place`: what the host measured would not be the
        guest's), its records and pipes in a scratch directory of the guest's memory
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


def read_job(path: Path) -> list[PlannedRun]:
    """The runs of a job file; RunError naming it if it is not one."""
    job = store.read_json(path)
    if not isinstance(job, dict) or job.get("format") != JOB_FORMAT:
        raise store.RunError(f"{path}: not a guest job ({JOB_FORMAT})")
    try:
        return [PlannedRun(**r) for r in job["runs"]]
    except (KeyError, TypeError) as exc:
        raise store.RunError(f"{path}: a run of the job is malformed ({exc})") from None


def guest_facts() -> dict:
    """The guest's facts, as a run's manifest records a system's (:func:`doctor.run_facts`):
    tracefs and debugfs mounted if they are not, the tracefs probe only checked."""
    return doctor.run_facts(doctor.doctor(mount=True, test_record=False, probes=("tracefs",)))


def run_job(runs: list[PlannedRun], facts: dict, stream=None) -> int:
    """Capture every run in turn, saying each step (:func:`emit`); returns how many failed.

    A probe that offers a session (tracefs: one instance for all the runs, emptied for each) keeps
    it open across the runs, as a suite on the host does (bench/README.md: what it saves per run
    under TCG)."""
    failed = 0
    with HostLock(), contextlib.ExitStack() as sessions:
        for name in sorted({run.probe for run in runs}):
            session = getattr(get_probe(name), "session", None)
            if session is not None:
                sessions.enter_context(session())
        for i, run in enumerate(runs):
            emit("start", stream, run=i, dir=run.dir)
            planned = PlannedExperiment(run)
            try:
                try:
                    capture(planned, run.params, run.cpus, Path(run.dir), run.probe, run.seed,
                            facts, quiet=True, lock_held=True, tables=JsonRows(),
                            scx=ScxSpec.from_dict(run.scx) if run.scx else None,
                            pause=lambda i=i: emit("measuring", stream, run=i),
                            resume=lambda i=i: emit("measured", stream, run=i))
                finally:                  # the tasks are stopped: what they wrote joins the run
                    planned.keep(Path(run.dir))
            except Exception as exc:      # one run's failure is reported; the next runs go on
                failed += 1
                emit("error", stream, run=i, message=reason(exc))
                continue
            emit("done", stream, run=i)
    return failed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m harmony.vm.guest JOBFILE", file=sys.stderr)
        return 2
    try:
        runs = read_job(Path(argv[0]))
        topology = job_topology(Path(argv[0]))
        facts = guest_facts()
    except Exception as exc:    # said on the console, where the host reads it
        emit("error", run=None, message=reason(exc))
        return 1
    emit("facts", facts=facts, pid=os.getpid())
    why = topology_problem(topology, facts) if topology is not None else None
    if why:                     # a shape the guest did not get: no run is measured on it
        emit("error", run=None, message=why)
        return 1
    failed = run_job(runs, facts)
    emit("end", failed=failed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
