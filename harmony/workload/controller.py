"""The workload controller: real worker processes placed, held, released at t0 and stopped.

Protocol (thesis 6.1: the imbalance is created "instantly rather than slowly accrued"):

1. ``spawn()`` starts one worker per :class:`TaskSpec`, all in one process group, forked by the
   fork server (:mod:`harmony.workload.forkserver`: a small process, so that this big one never
   forks; the controller forks them itself when ``HARMONY_FORKSERVER=0`` or the server cannot start,
   and says so in ``notes``). The worker's code is :mod:`harmony.workload.worker`. Each worker sets
   its comm and nice, is confined to its initial CPU, then sleeps on the start gate of that CPU (a
   futex word in shared memory): it exists but is not runnable. The controller waits until every
   worker sleeps at its gate. Confinement is a cpuset cgroup per initial CPU
   (:mod:`harmony.workload.cpuset`, the worker joins it) or, where cpusets are unavailable, the
   worker's own affinity mask; ``pinned`` tasks (static-ideal runs) always pin their own affinity.
2. ``release(mark)`` runs on the CPU holding the most tasks (the "home" CPU: its wake-ups are then
   local, half the cost of remote ones) as SCHED_FIFO (when allowed: the workers it wakes cannot
   preempt it half-way). The workers must become runnable on their initial CPUs, so that the
   layout is exactly what the scheduler sees at t0. Two ways (``release_mode``):

   - ``occupied`` (default): every other CPU of the set is held by an *occupier*, a small
     SCHED_FIFO process spinning on it (:func:`harmony.workload.worker.occupy`, forked with the
     workers). While the workers still sleep, the controller frees them to the set (one
     ``cpuset.cpus`` write per initial CPU, or one ``sched_setaffinity`` per task: cheap on a
     sleeping task), writes the t0 marker, and each CPU's gate is opened from that CPU (the home
     gate by the controller, the others by their occupiers, at once). The fair class's wake-up path
     keeps a task on its previous CPU when that is the waker's and no CPU is idle, so each task
     wakes where it was held; then the occupiers stop and the "released" marker is written. The
     per-task work under the home CPU's run-queue lock is one wake-up (256 tasks, 2-vCPU VM,
     ``bench/release.py``: medians of 0.75-0.90 ms from the first wake-up to "released" in three
     runs, against 1.12-1.23 ms for ``confined``; the wake-ups themselves cost a little more, as a
     task free to run on two CPUs goes through the wake-up path's search for an idle CPU).
   - ``confined``: the controller writes the t0 marker, wakes each gate with one FUTEX_WAKE while
     the tasks are still confined, then frees them (a dequeue and an enqueue per task under the
     run-queue lock) and writes the "released" marker. Used when a sched_ext scheduler is enabled
     (its own code chooses where a task wakes), when an occupier cannot run as SCHED_FIFO, when
     there is nothing to free or one CPU only, or when ``HARMONY_RELEASE_MODE=confined``.

   Freeing a task while asleep without occupiers would not do: the wake-up path would place it
   on an idle CPU and the layout would never exist. The trace checks it either way
   (``harmony.analysis.release``: where each task woke, migrations before "released").

   That is a *cold* release: the tasks reach t0 asleep, with no load history (PELT decays a
   sleeping task's load, halving it every 32 ms). A *warm* release (``warm_s``, the catalog's
   default: the thesis's tasks were running, bound to their CPU, before it released them) opens
   every gate while the tasks are still confined ("warm-up" marker), lets them run there for
   ``warm_s`` while this thread sleeps above them, then writes t0 and frees them (one
   ``cpuset.cpus`` write per initial CPU): t0 is the instant the CPU set is widened, the tasks
   are running (not woken) then, and no occupier is needed (``release_mode`` "warm").

Scheduling classes (``TaskSpec.policy``). Each worker enters its class before its gate
(:mod:`harmony.workload.worker`). The controller, its occupiers and the threads run.py raises run
SCHED_FIFO at :func:`fifo_priority`: FIFO_PRIO, or one above the highest task's rt_priority,
whichever is higher. Above, for two reasons:

- the window must end: a FIFO task at the controller's own priority never yields the CPU it
  holds (measured here: a SCHED_FIFO 50 process did not return from a 3 s sleep while a
  SCHED_FIFO 50 busy loop ran, until the loop was killed; RT throttling, 950 ms of every 1000 ms
  by default, throttles the controller with the tasks, as they share the root rt_rq);
- an RT release equivalent to the fair one (each task woken on its initial CPU). The RT class
  places a woken task (select_task_rq_rt) on its previous CPU unless the task running there is
  RT and of higher or equal priority or pinned (the occupiers and the releasing controller are
  pinned): then on the CPU of lowest priority (find_lowest_rq), its previous one if that is
  among the lowest. With every CPU of the set held at a priority *above* the task's, no CPU is
  lower than the task, so it stays on its initial CPU, and the push that follows a wake-up
  (task_woken_rt) finds nowhere to push it either. With occupiers *below* the task's priority,
  the second task woken on a CPU already holding one of its priority would be sent to an
  occupied CPU (the woken task outranks the occupier there): the layout would not exist at t0.
  Once the occupiers stop (leaving SCHED_FIFO), each of their CPUs pulls the highest waiting RT
  task (switched_from_rt -> pull_rt_task): from t0 on RT tasks are placed by priority (push and
  pull: a task waits only while every CPU it may use runs one of equal or higher priority),
  never by load.

SCHED_DEADLINE tasks run above every RT task, the controller included; admission control keeps
their bandwidth to sched_rt_runtime_us / sched_rt_period_us of each CPU (less the fair class's
deadline servers, 6.12 on), which leaves the controller its share. The kernel refuses a deadline
task a CPU affinity smaller than its root domain (EPERM; EBUSY to sched_setaffinity on one), but
not a cpuset that confines it: deadline tasks are held by cpusets only, enter their class before
they join one, and may not be ``pinned``. :func:`check_classes` says before anything starts what
this host cannot do (a pinned or cpuset-less deadline task, the bandwidth admission control would
refuse, a warm-up whose confined deadline tasks would take more of a CPU than it gives them);
a worker the kernel still refuses is reported by :meth:`Workload.spawn` in one line, with why.
3. ``stop()`` kills the group and returns once every worker is reaped (by the server, which
   reports exit statuses; a worker that dies before t0 is reported by ``spawn()``), then removes
   the cgroups. Workers carry PR_SET_PDEATHSIG=SIGKILL tied to the process that forked them (the
   server carries it tied to the controller), so they die with the controller even if it is killed
   with SIGKILL (a worker still asleep at its gate too); the cgroups of a killed controller are
   removed by the next start or ``harmony clean`` (:func:`harmony.workload.cpuset.reclaim_stale`).

``HARMONY_RELEASE_PLACEMENT`` (expert option, for comparisons) = ``cpuset`` | ``affinity`` forces a
confinement; default ``auto``: cpusets when available. ``release_method`` says which one a
workload used; the notes say why cpusets were not. ``HARMONY_RELEASE_MODE`` = ``occupied`` |
``confined`` likewise forces the release's order (default ``auto``: occupied where it can be).

Each worker counts its work loops in a shared array (``work_done()``), the raw material for the
observer-effect and slowdown measurements.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import gc
import itertools
import mmap
import os
import platform
import signal
import time
from typing import TYPE_CHECKING

from harmony import hostfacts
from harmony.core.errors import ControllerError  # noqa: F401  (raised here)
from harmony.core.osutil import FUTEX_WAKE, SYS_FUTEX, WAKE_ALL, futex
from harmony.hostfacts import OK, WARN, check
from harmony.probes.schema import MARK_RELEASED, MARK_T0, MARK_WARMUP
from harmony.workload import forkserver, worker
from harmony.workload.cpuset import CpusetGroups, CpusetUnavailable
from harmony.workload.cpuset import hierarchies as cpuset_hierarchies
from harmony.workload.forkserver import ForkServerError
from harmony.workload.tasks import RT_POLICIES, TaskSpec

if TYPE_CHECKING:
    import numpy as np

ENV_PLACEMENT = "HARMONY_RELEASE_PLACEMENT"
PLACEMENTS = ("auto", "cpuset", "affinity")
ENV_MODE = "HARMONY_RELEASE_MODE"
MODES = ("auto", "occupied", "confined")
FIFO_PRIO = 10          # the controller's and the occupiers' SCHED_FIFO priority during the release
OCCUPY_WAIT_S = 0.5     # how long the release waits for an occupier before it does without
_workload_ids = itertools.count(1)


def fifo_priority(specs) -> int:
    """The SCHED_FIFO priority of the controller, its occupiers and its raised threads for a run
    of ``specs``: FIFO_PRIO, or one above the highest RT task (see the module docstring)."""
    return max([FIFO_PRIO] + [s.rt_priority + 1 for s in specs if s.policy in RT_POLICIES])


def warm_s(params: dict) -> float | None:
    """The warm-up of a run with these parameters: ``warm_s`` for ``release=warm``, None for a
    cold release (and for parameters that predate the choice: every run was cold then)."""
    return float(params.get("warm_s", 0.25)) if params.get("release") == "warm" else None


def check_classes(specs, cpus, warm: float | None = None, placement: str | None = None,
                  bandwidth: dict | None = None) -> None:
    """What this host cannot give the tasks' scheduling classes, before anything starts:
    ControllerError, one line. ``bandwidth``: :func:`harmony.hostfacts.rt_bandwidth` (read now
    if not given); ``placement``: the release's (:func:`release_options`)."""
    dl = [s for s in specs if s.policy == "deadline"]
    if not dl:
        return
    pinned = [s for s in dl if s.pinned]
    if pinned:
        raise ControllerError(
            f"task {pinned[0].name} is SCHED_DEADLINE and pinned to CPU {pinned[0].initial_cpu} (a "
            "static-ideal placement, or pin_target=1): the kernel refuses a deadline task a CPU "
            "affinity smaller than its root domain (EPERM)")
    placement = placement or release_options()[0]
    if placement == "affinity" or not cpuset_hierarchies():
        why = f"{ENV_PLACEMENT}=affinity" if placement == "affinity" else "no cpuset hierarchy here"
        raise ControllerError(f"SCHED_DEADLINE tasks can be held on their initial CPU by a cpuset "
                              f"only ({why}): the kernel refuses a deadline task a smaller CPU "
                              "affinity (EPERM)")
    bw = bandwidth or hostfacts.rt_bandwidth()
    per_cpu = bw["dl_bw_per_cpu"] if bw["dl_bw_per_cpu"] is not None else bw["rt_share"]
    if per_cpu is None:        # no limit (sched_rt_runtime_us = -1), or none readable
        return
    reserved = bw["dl_reserved"] or 0.0
    ncpus = bw["dl_rd_cpus"]
    want = sum(s.dl_bandwidth for s in dl)
    room = per_cpu * ncpus - reserved
    label = dl[0].label
    if want > room + 1e-9:
        raise ControllerError(
            f"deadline admission control would refuse the tasks: {len(dl)} x {label} = {want:.2f} "
            f"CPUs, and it admits {per_cpu:.2f} of each of {ncpus} CPUs less {reserved:.2f} "
            f"already reserved (deadline servers, other deadline tasks) = {room:.2f}")
    if warm is not None:
        # confined through the warm-up: a CPU's deadline tasks must leave the controller room
        cpu_room = per_cpu - reserved / ncpus
        for cpu in sorted({s.initial_cpu for s in dl}):
            here = sum(s.dl_bandwidth for s in dl if s.initial_cpu == cpu)
            if here > cpu_room + 1e-9:
                raise ControllerError(
                    "release=warm runs the deadline tasks confined to their initial CPU: "
                    f"CPU {cpu}'s would take {here:.2f} of it, more than the {cpu_room:.2f} a CPU "
                    "gives deadline tasks (the controller would starve there); use release=cold or "
                    "a smaller dl_runtime_ms")


def raise_threads(tids, prio: int = FIFO_PRIO) -> list[int]:
    """SCHED_FIFO at the release's priority ``prio`` (:attr:`Workload.fifo_prio`) for the
    SCHED_OTHER threads ``tids`` (this process's probe drains and sampler, the probes' own
    processes such as perf record) while a run is measured; returns those raised, for
    :func:`lower_threads`. They sleep nearly all the time,
    but at the tasks' priority a crowded CPU set starves them, and a starved thread holding the
    GIL stalls every other: with 600 tasks on two CPUs the sampler, preempted mid-sweep, held the
    controller's end marker back 0.9 s."""
    raised = []
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(prio))
                raised.append(tid)
        except OSError:       # gone, or SCHED_FIFO refused: it keeps its priority
            pass
    return raised


def lower_threads(tids: list[int]) -> None:
    """Undo :func:`raise_threads` (``tids`` is emptied: safe to call again)."""
    while tids:
        try:
            os.sched_setscheduler(tids.pop(), os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


def keep_off(tids, cpus) -> tuple[dict[int, set[int]], list[int]]:
    """Move the threads ``tids`` (the controller's own and its probes', raised for the window
    by :func:`raise_threads`) onto the CPUs this process may use outside the experiment's
    ``cpus``, where there are any; returns each moved thread's CPUs before, for
    :func:`put_back`, and the CPUs they were moved to (empty: none outside the set, nothing
    moved). Why: their SCHED_FIFO time comes off the capacity of the CPUs they run on
    (``scale_rt_capacity``), and the fair class's balance divides each group's load by its
    capacity (``avg_load``); under TCG they took 3-9 % of a CPU under test, enough to push an
    8-against-7 imbalance over an LLC's imbalance_pct (bench/README.md, "topologies under
    test"). A thread the kernel will not move (gone, or outside its cpuset) stays."""
    spare = sorted(os.sched_getaffinity(0) - set(cpus))
    moved: dict[int, set[int]] = {}
    if not spare:
        return moved, []
    for tid in tids:
        try:
            before = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, spare)
            moved[tid] = before
        except OSError:
            pass
    return moved, spare


def put_back(moved: dict[int, set[int]]) -> None:
    """Undo :func:`keep_off` (``moved`` is emptied: safe to call again)."""
    while moved:
        tid, before = moved.popitem()
        try:
            os.sched_setaffinity(tid, before)
        except OSError:
            pass


def release_options(placement: str | None = None, mode: str | None = None) -> tuple[str, str]:
    """(placement, mode): the given ones, else ``HARMONY_RELEASE_PLACEMENT`` and
    ``HARMONY_RELEASE_MODE`` (default ``auto``); ControllerError (one line) for an unknown one.
    The CLI calls it before it starts anything."""
    placement = placement or os.environ.get(ENV_PLACEMENT, "auto")
    mode = mode or os.environ.get(ENV_MODE, "auto")
    for name, value, allowed in ((ENV_PLACEMENT, placement, PLACEMENTS), (ENV_MODE, mode, MODES)):
        if value not in allowed:
            raise ControllerError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return placement, mode


def confined_why(mode: str, free: bool, other_cpus, sched_ext_state: str) -> str | None:
    """Why a release must wake its tasks while still confined, and free them after, rather than
    be ``occupied``; None if nothing says so. The one rule, for the controller and ``harmony
    doctor``; an occupier refused SCHED_FIFO is the other reason, known only once it tried.
    ``free``: some task is to be freed; ``other_cpus``: the CPUs occupiers would hold."""
    if mode == "confined":
        return f"{ENV_MODE}=confined"
    if not free:
        return "nothing to free"
    if not other_cpus:
        return "one CPU"
    if sched_ext_state == "enabled":
        return "a sched_ext scheduler chooses where woken tasks run"
    return None


def release_check(sched_ext: dict, cpus: dict) -> dict:
    """``harmony doctor``'s ``release`` check: how a run here releases its tasks at t0: warm by
    default (``default``); a cold release (``mode``) ``occupied`` where it can be (SCHED_FIFO
    occupiers hold the other CPUs while the tasks wake), else ``confined``. ``sched_ext``, ``cpus``:
    the doctor's checks of that name (the sched_ext ``state``, the ``online`` CPUs). SCHED_FIFO is
    tried on the calling thread and put back."""
    try:
        _, mode = release_options()
    except ControllerError as exc:
        return check(WARN, f"{exc}: runs will refuse it", mode=None)
    online = cpus.get("online", [])
    why = confined_why(mode, True, online[1:], sched_ext.get("state"))
    if why is None:
        # the occupiers and the controller run as SCHED_FIFO: try it on this thread, put it back
        before, param = os.sched_getscheduler(0), os.sched_getparam(0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError as exc:
            why = f"SCHED_FIFO not permitted ({exc.strerror})"
        else:
            os.sched_setscheduler(0, before, param)
    warm = "warm by default (tasks run confined, then the CPU set is widened at t0); cold: "
    if why:
        return check(OK, f"{warm}confined (woken on their initial CPU, then freed): {why}",
                     mode="confined", why=why, default="warm")
    return check(OK, f"{warm}occupied (SCHED_FIFO occupiers hold the other CPUs while each CPU's "
                     "tasks wake, already free)", mode="occupied", why=None, default="warm")


def _state(pid: int) -> bytes | None:
    """The process state letter from /proc/<pid>/stat (R, S, Z, ...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


class Workload:
    """A set of worker processes for one run. Use as a context manager: leaving kills them all."""

    def __init__(self, specs: list[TaskSpec], cpus: list[int], seed: int = 0,
                 placement: str | None = None, mode: str | None = None,
                 warm_s: float | None = None):
        if not specs:
            raise ControllerError("the workload has no tasks")
        self.specs = list(specs)
        self.cpus = list(cpus)
        self.seed = seed
        self.placement, self.mode = release_options(placement, mode)
        self.warm_s = warm_s  # None: a cold release; else the warm-up (s) before t0
        if SYS_FUTEX is None:
            raise ControllerError(f"no futex system call number known for {platform.machine()}")
        #: the host's RT / deadline bandwidth now (hostfacts.rt_bandwidth), and this run's
        #: SCHED_FIFO priority for the controller's own (fifo_priority): the manifest's "sched"
        self.bandwidth = hostfacts.rt_bandwidth()
        self.fifo_prio = fifo_priority(self.specs)
        check_classes(self.specs, self.cpus, warm_s, self.placement, self.bandwidth)
        self.warmed_s: float | None = None  # the warm-up as it was: warm-up marker to t0 marker
        self.pids: list[int] = []
        self._unreaped: set[int] = set()
        self._statuses: dict[int, int] = {}   # exited workers' wait statuses, reaped
        self.pgid: int | None = None
        self.notes: list[str] = []
        self.cpusets: CpusetGroups | None = None
        self.release_method: str | None = None  # "cpuset" or "affinity", known after spawn()
        # "occupied", "confined" or "warm", known after spawn()
        self.release_mode: str | None = None
        self._served: tuple[forkserver.ForkServer, int] | None = None  # (server, workload id)
        # the shared page (harmony.workload.worker.Shared): t0, a work counter per worker, one start
        # gate (futex word) per initial CPU, one "at the gate" flag per worker, the occupiers' order
        # and state words. A memfd, so that the fork server can map it too.
        n = len(specs)
        self._gate_cpus = sorted({s.initial_cpu for s in specs})
        counts = {c: sum(s.initial_cpu == c for s in specs) for c in self._gate_cpus}
        self._home = max(counts, key=counts.get)  # the release runs here (see release())
        self._occupied = self._occupiable()       # the CPUs an occupier would hold
        self.occupier_pids: list[int] = []  # the release's helpers (not tasks of the experiment)
        self._fifo_held = False   # release(keep_fifo=True) left the calling thread SCHED_FIFO
        size = worker.Shared.size(n, len(self._gate_cpus), len(self._occupied))
        self._no_memfd: str | None = None
        try:
            self._memfd: int | None = os.memfd_create("harmony-workload")  # close-on-exec
            os.ftruncate(self._memfd, size)
            self._shm = mmap.mmap(self._memfd, size, flags=mmap.MAP_SHARED)
        except OSError as exc:
            self._close_memfd()
            self._shm = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
            self._no_memfd = ("workers forked by the controller: no memfd for the fork server "
                              f"({exc.strerror})")
        self._shared = worker.Shared(self._shm, n, len(self._gate_cpus), len(self._occupied))
        # int64 cells as a memoryview, not a numpy array: the guest agent in a VM imports no
        # numpy (6 s of a TCG boot, over 9p: bench/README.md)
        cells = memoryview(self._shm)[:8 * (n + 1)].cast("q")
        self._t0, self._work = cells[:1], cells[1:]
        self._marked_ns = 0         # t0_ns, once released

    def _occupiable(self) -> list[int]:
        """The CPUs occupiers would hold for an ``occupied`` release (every CPU of the set but the
        home CPU), or [] where that release cannot be used (release_mode says why after spawn)
        or is not wanted (a warm release: its tasks are running at t0, not woken)."""
        self._confined_why = None
        if self.warm_s is not None:
            return []
        others = sorted(set(self.cpus) - {self._home})
        scx = hostfacts.sched_ext_state()["state"]
        self._confined_why = confined_why(self.mode, any(not s.pinned for s in self.specs),
                                          others, scx)
        if self._confined_why and "sched_ext" in self._confined_why:  # the others need no note
            self.notes.append(f"release confined (woken, then freed): {self._confined_why}")
        return [] if self._confined_why else others

    def _close_memfd(self) -> None:
        if getattr(self, "_memfd", None) is not None:
            os.close(self._memfd)
        self._memfd = None

    def _confine(self) -> None:
        """Choose how tasks are held on their initial CPU: cpuset cgroups if possible."""
        free = sorted({s.initial_cpu for s in self.specs if not s.pinned})
        if self.placement != "affinity" and free:
            # the workload's before they exist: stop() removes what a create() stopped half-way
            # (Ctrl-C) made, where this frame, gone, could not (CI saw a group left so)
            self.cpusets = cs = CpusetGroups(free, self.cpus)
            try:
                cs.create()
                self.release_method = "cpuset"
                return
            except CpusetUnavailable as exc:
                self.cpusets = None             # it left nothing
                if self.placement == "cpuset":
                    raise ControllerError(f"{ENV_PLACEMENT}=cpuset: {exc}") from None
                self.notes.append("release by sched_setaffinity per task "
                                  f"(cpusets unavailable: {exc})")
        self.release_method = "affinity"

    # -- life cycle ---------------------------------------------------------------------------
    def spawn(self, timeout_s: float = 30.0, laps=None) -> None:
        """Fork every worker (from the fork server, or from this process if it cannot be used) and
        wait until all of them are held at their start gate. ``laps`` (:class:`Laps`), if given,
        times the steps: ``cpusets`` (the groups made), ``fork``, and ``held`` (till every worker
        is at its gate)."""
        lap = laps or (lambda step: None)
        self._confine()
        lap("cpusets")
        tasks = []
        for slot, spec in enumerate(self.specs):
            join = (self.cpusets.procs_file(spec.initial_cpu)
                    if self.cpusets is not None and not spec.pinned else None)
            tasks.append({"slot": slot, "spec": dataclasses.asdict(spec) | {"comm": spec.comm},
                          "gate": self._gate_cpus.index(spec.initial_cpu),
                          "seed": self.seed * 100_003 + slot, "join": join})
        for k, cpu in enumerate(self._occupied):
            tasks.append({"kind": "occupy", "k": k, "cpu": cpu, "prio": self.fifo_prio,
                          "gate": self._gate_cpus.index(cpu) if cpu in self._gate_cpus else -1})
        try:
            server, note = (forkserver.shared() if self._memfd is not None
                            else (None, self._no_memfd))
            if note:
                self.notes.append(note)
            if server is not None:
                self._spawn_served(server, tasks)
            else:
                self._spawn_forked(tasks)
        finally:
            self._close_memfd()  # the server has mapped it, forked workers inherited the mapping
        n = len(self.specs)
        self.pids, self.occupier_pids = self.pids[:n], self.pids[n:]
        lap("fork")
        self._wait_until_held(time.monotonic() + timeout_s, timeout_s)
        lap("held")
        if worker.FAILED in [self._shared.words[self._shared.occupier(k)]
                             for k in range(len(self.occupier_pids))]:
            self._confined_why = "an occupier could not run as SCHED_FIFO on its CPU"
            self.notes.append(f"release confined (woken, then freed): {self._confined_why}")
        self.release_mode = ("warm" if self.warm_s is not None else
                             "confined" if self._confined_why else "occupied")

    def _spawn_served(self, server: forkserver.ForkServer, tasks: list[dict]) -> None:
        wid = next(_workload_ids)
        try:
            try:
                self._open(server, wid)
            except ForkServerError as exc:
                if server.alive():
                    raise
                # it died since the last workload (nothing of this one is lost): a fresh one
                server, note = forkserver.shared()
                self.notes.append(note or str(exc))
                if server is None:
                    raise
                self._open(server, wid)
            self._served = (server, wid)  # from here on, stop() asks the server to kill and reap
            for i in range(0, len(tasks), forkserver.CHUNK):
                reply = server.request({"op": "fork", "wid": wid,
                                        "tasks": tasks[i:i + forkserver.CHUNK]})
                self.pgid = reply["pgid"]
                self.pids += reply["pids"]
                self._unreaped.update(reply["pids"])
        except ForkServerError as exc:
            raise ControllerError(f"the fork server could not start the workers: {exc}") from None

    def _open(self, server: forkserver.ForkServer, wid: int) -> None:
        """Hand the workload's shared page to the server."""
        server.request({"op": "open", "wid": wid, "n": len(self.specs),
                        "ngates": len(self._gate_cpus), "noccupiers": len(self._occupied),
                        "cpus": self.cpus}, fds=[self._memfd])

    def _spawn_forked(self, tasks: list[dict]) -> None:
        parent = os.getpid()
        for t in tasks:
            pid = os.fork()
            if pid == 0:  # child
                try:
                    os.setpgid(0, self.pgid or 0)
                    worker.start(t, self.cpus, self._shared, parent, parent)
                except BaseException:
                    os._exit(1)
                os._exit(0)
            try:  # also from the parent: no race with the child's own setpgid
                os.setpgid(pid, self.pgid or pid)
            except (PermissionError, ProcessLookupError):
                pass
            if self.pgid is None:
                self.pgid = pid
            self.pids.append(pid)
            self._unreaped.add(pid)

    def _exited(self) -> dict[int, int]:
        """Workers that have exited so far (reaped now): pid -> wait status."""
        if self._served is not None:
            server, wid = self._served
            try:
                got = dict(server.request({"op": "poll", "wid": wid})["exited"])
            except ForkServerError as exc:
                raise ControllerError(f"the fork server failed: {exc}") from None
        else:
            got = {}
            for pid in self._unreaped:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    got[pid] = status
        self._unreaped.difference_update(got)
        return got

    def _wait_until_held(self, deadline: float, timeout_s: float) -> None:
        """Until every worker has flagged itself at its gate and sleeps there, and every occupier
        has said whether it got its CPU (READY or FAILED) and sleeps (state S); one that dies first
        is reported with its exit status (asked for every few ms)."""
        sh = self._shared
        flags = ([(pid, sh.ngates + slot) for slot, pid in enumerate(self.pids)]
                 + [(pid, sh.occupier(k)) for k, pid in enumerate(self.occupier_pids)])
        workers = set(self.pids)

        def kind(pid: int) -> str:
            return "worker" if pid in workers else "occupier"

        waiting, ask_at = flags, 0.0
        while waiting:
            if time.monotonic() >= ask_at:
                exited = self._exited()
                refused = [(pid, -sh.words[i]) for pid, i in flags
                           if pid in exited and sh.words[i] < 0]
                if refused:
                    raise ControllerError(self._refusal(*refused[0]))
                if exited:
                    pid, status = min(exited.items())
                    raise ControllerError(f"{kind(pid)} {pid} died before t0 (status {status:#x})")
                ask_at = time.monotonic() + 0.005
            left = [(pid, i) for pid, i in waiting if not (sh.words[i] and _state(pid) == b"S")]
            if left and time.monotonic() > deadline:
                raise ControllerError(f"{kind(left[0][0])} {left[0][0]} did not reach the start "
                                      f"gate in {timeout_s:.0f} s")
            waiting = left
            if waiting:
                time.sleep(0.001)

    def _refusal(self, pid: int, err: int) -> str:
        """Why the kernel refused worker ``pid`` its scheduling class (errno ``err``), one line."""
        spec = self.specs[self.pids.index(pid)]
        why = os.strerror(err)
        if spec.policy == "deadline" and err == errno.EBUSY:
            why += ": admission control refused the bandwidth"
        elif spec.policy == "deadline" and err == errno.EPERM:
            why += ": a deadline task needs a CPU affinity spanning its root domain"
        elif spec.policy in RT_POLICIES and err == errno.EPERM:
            why += (": real-time priorities need root (or RLIMIT_RTPRIO), and a cpu cgroup "
                    "whose cpu.rt_runtime_us is not 0")
        return f"task {spec.name} could not enter {spec.label} ({why})"

    def release(self, mark, keep_fifo: bool = False) -> tuple[int, int]:
        """Release every worker at once; ``mark(text)`` writes a trace marker and returns its ns.

        Returns (t0, released): marker times before the first wake-up (a warm release: before
        the CPU set is widened, the tasks having run confined for ``warm_s`` since the warm-up
        marker) and after the last task was freed to the experiment CPU set. With ``keep_fifo``
        the calling thread stays SCHED_FIFO (if the release got it) until :meth:`freeze` or
        :meth:`stop`.
        """
        warm = self.release_mode == "warm"
        home, own_mask = self._home, os.sched_getaffinity(0)
        if not warm:  # a warm release wakes no task at t0: it needs no CPU of its own
            try:
                # this thread only: the probe's threads stay where they are
                os.sched_setaffinity(0, {home})
            except OSError as exc:
                self.notes.append(f"release ran off CPU {home} ({exc.strerror}); "
                                  "spread may be larger")
        fifo = self._enter_fifo()
        collecting = gc.isenabled()
        try:
            if warm:
                t0, released = self._release_warm(mark)
            else:
                # no collection pause between the first wake-up and the last freed task
                gc.disable()
                if self.release_mode == "occupied" and self._hold():
                    t0, released = self._release_occupied(mark)
                else:
                    t0, released = self._release_confined(mark)
        finally:
            if collecting:
                gc.enable()
            self._fifo_held = fifo
            if not keep_fifo:
                self.leave_fifo()
            if not warm:
                os.sched_setaffinity(0, own_mask)
        return t0, released

    def _release_warm(self, mark) -> tuple[int, int]:
        """Open every gate of the confined tasks, let them run for ``warm_s`` while this thread
        sleeps above them (SCHED_FIFO), then widen the CPU set at t0."""
        warm = mark(MARK_WARMUP)
        for i in range(len(self._gate_cpus)):
            self._open_gate(i)
        time.sleep(self.warm_s)
        gc.disable()  # no collection pause between t0 and the last freed task
        t0 = self._mark_t0(mark)
        self._free()
        released = mark(MARK_RELEASED)
        self.warmed_s = (t0 - warm) / 1e9
        return t0, released

    @property
    def sched(self) -> dict:
        """The manifest's ``sched``: the host's RT and deadline bandwidth when the workload was
        made (:func:`harmony.hostfacts.rt_bandwidth`), the controller's SCHED_FIFO priority, and
        the warm-up (asked and as it was; None for a cold release)."""
        return {**self.bandwidth, "controller_fifo_priority": self.fifo_prio,
                "warm_s": self.warm_s, "warmed_s": self.warmed_s}

    def leave_fifo(self) -> None:
        """The calling thread back to SCHED_OTHER if the release left it SCHED_FIFO."""
        if self._fifo_held:
            self._fifo_held = False
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    def _free(self) -> None:
        """Allow every free task the run's whole CPU set."""
        if self.cpusets is not None:
            self.cpusets.widen()
        else:
            allowed = set(self.cpus)
            for pid, spec in zip(self.pids, self.specs):
                if not spec.pinned:
                    os.sched_setaffinity(pid, allowed)

    def _open_gate(self, i: int) -> None:
        """Open start gate i from this CPU."""
        self._shared.words[i] = 1
        if futex(self._shared.gate_addr(i), FUTEX_WAKE, WAKE_ALL) < 0:
            err = ctypes.get_errno()
            raise ControllerError(f"the start gate could not be opened: {os.strerror(err)}")

    def _release_confined(self, mark) -> tuple[int, int]:
        t0 = self._mark_t0(mark)
        for i in range(len(self._gate_cpus)):
            self._open_gate(i)
        self._free()
        return t0, mark(MARK_RELEASED)

    def _order(self, value: int) -> None:
        self._shared.words[self._shared.order] = value
        futex(self._shared.word_addr(self._shared.order), FUTEX_WAKE, WAKE_ALL)

    def _await_occupiers(self, state: int, which: list[int]) -> list[int]:
        """Spin until occupiers ``which`` report ``state`` (at most OCCUPY_WAIT_S); returns the
        ones that did not."""
        words, sh = self._shared.words, self._shared
        give_up = time.monotonic() + OCCUPY_WAIT_S
        left = list(which)
        while left and time.monotonic() < give_up:
            left = [k for k in left if words[sh.occupier(k)] != state]
        return left

    def _hold(self) -> bool:
        """Order the occupiers onto their CPUs; False (and a confined release) if one is missing."""
        self._order(worker.HOLD)
        late = self._await_occupiers(worker.HOLDING, list(range(len(self._occupied))))
        if late:
            self._order(worker.LEAVE)
            self.release_mode = "confined"
            self.notes.append(f"release confined (woken, then freed): the occupier of CPU "
                              f"{self._occupied[late[0]]} did not start spinning in "
                              f"{OCCUPY_WAIT_S} s")
            return False
        return True

    def _release_occupied(self, mark) -> tuple[int, int]:
        """Every other CPU is held by its occupier: free the sleeping tasks, then wake each CPU's
        tasks from that CPU, all at once."""
        self._free()
        t0 = self._mark_t0(mark)
        self._shared.words[self._shared.order] = worker.OPEN     # they are spinning: no wake-up
        for i, cpu in enumerate(self._gate_cpus):
            if cpu not in self._occupied:
                self._open_gate(i)
        openers = [k for k, cpu in enumerate(self._occupied) if cpu in self._gate_cpus]
        for k in self._await_occupiers(worker.OPENED, openers):  # never leave a gate shut
            self._open_gate(self._gate_cpus.index(self._occupied[k]))
            self.notes.append(f"the occupier of CPU {self._occupied[k]} did not open its gate in "
                              f"{OCCUPY_WAIT_S} s: opened from CPU {self._home}")
        self._shared.words[self._shared.order] = worker.LEAVE
        return t0, mark(MARK_RELEASED)

    def _enter_fifo(self) -> bool:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.fifo_prio))
            return True
        except (PermissionError, OSError) as exc:
            self.notes.append(f"release ran without SCHED_FIFO ({exc.strerror}); "
                              "spread may be larger")
            return False

    def _mark_t0(self, mark) -> int:
        """Stamp t0: the workers' shared t0 (read just before the marker), the t0 marker, then
        :attr:`t0_ns` (read just after it); returns the marker's time as ``mark`` gives it."""
        self._t0[0] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        t0 = mark(MARK_T0)
        self._marked_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return t0

    @property
    def t0_ns(self) -> int:
        """CLOCK_MONOTONIC ns just after the release's t0 marker was written (set by
        :meth:`release`): no earlier than the marker's own stamp, so that a window timed from it
        is never shorter than asked. (The workers' t0, read just before the marker, can be: on a
        CPU set crowded with 600 tasks a window came out 0.25 ms short.)"""
        return int(self._marked_ns)

    @property
    def workers_t0_ns(self) -> int:
        """The workers' t0 (CLOCK_MONOTONIC ns, read just before the t0 marker; 0 before the
        release): a task's ``stop_after_s`` and ``cut_duty_at_s`` count from it. The marker's own
        stamp comes after it by the marker's write, microseconds on a quiet host and 0.2 ms once
        on CI's: a task leaving at its time can leave that much before the manifest's t0 plus
        its time."""
        return int(self._t0[0])

    def freeze(self) -> None:
        """SIGSTOP every worker (the measurement is over): whatever the controller does next
        (read the workers' counters, stop the probes) no longer competes with them for the CPUs.
        With many more tasks than CPUs, each step at SCHED_OTHER waited its turn among them all:
        2000 tasks on 2 CPUs took 69 s to stop. A stopped task's counters hold still for the end
        read; stop() kills stopped tasks as any other. Then the calling thread leaves SCHED_FIFO
        (``release(keep_fifo=True)``)."""
        if self.pgid is not None and self._unreaped:
            try:
                os.killpg(self.pgid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self.leave_fifo()

    def alive(self) -> list[int]:
        """Pids of workers that have not exited (zombies excluded)."""
        return [pid for pid in self.pids if _state(pid) not in (None, b"Z", b"X")]

    def unexpected_exits(self) -> list[str]:
        """Workers that are gone but were not meant to go (by a signal, an error, or without a
        stop_after_s: someone killed them), each said in a few words; none while all run as
        designed. Reaps those that exited (their status is kept for :meth:`stop`)."""
        self._statuses.update(self._exited())
        out = []
        for pid, spec in zip(self.pids, self.specs):
            status = self._statuses.get(pid)
            if status is None:
                continue
            if os.WIFSIGNALED(status):
                how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            elif os.WEXITSTATUS(status) != 0:
                how = f"exited with status {os.WEXITSTATUS(status)}"
            elif spec.stop_after_s is None:
                how = "exited (it was to run to the end)"
            else:
                continue        # stopped when the experiment asked it to
            out.append(f"{spec.comm} (pid {pid}) {how}")
        return out

    def work_done(self) -> "np.ndarray":
        """Work loops completed by each worker so far (units of SPIN_UNIT iterations)."""
        import numpy as np

        return np.array(self._work, dtype=np.int64)

    def work_counts(self) -> list[int]:
        """:meth:`work_done` as a list (what a run's manifest records), without numpy."""
        return self._work.tolist()

    def stop(self) -> None:
        """Kill every worker and return once all are dead and reaped, then remove the cgroups.
        Idempotent; safe to call from any error path."""
        self.leave_fifo()
        if self._served is not None:
            server, wid = self._served
            if self.pgid is not None and self._unreaped and server.alive():
                # at once from here, not after the server is scheduled; safe: the server reaps
                # only when asked, so a member of the group (a zombie at least) still holds its id
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                server.request({"op": "stop", "wid": wid}, timeout_s=60.0)
                self._unreaped.clear()
            except ForkServerError as exc:  # the server is dead now, and its workers with it
                self.notes.append(f"the fork server failed at stop ({exc}); "
                                  "waited for the workers to die")
                self._await_gone()
            self._served = None  # not before: a stop() interrupted by Ctrl-C is asked again
        else:
            self._kill_and_reap()
        self.pgid = None
        self._close_memfd()
        if self.cpusets is not None:
            self.notes.extend(self.cpusets.remove())
            self.cpusets = None

    def _kill_and_reap(self) -> None:
        """Workers this process forked itself."""
        worker.kill_and_reap(self.pgid, self._unreaped)
        self._unreaped.clear()  # never signal a reaped pid again: it may belong to someone else now

    def _await_gone(self, timeout_s: float = 30.0) -> None:
        """Workers of a dead fork server: they die with it (PR_SET_PDEATHSIG) and init reaps them.
        Wait until their process group and every pid are gone (a pid in the group, zombie or not,
        keeps the group id from being reused, so the group is a safe thing to watch)."""
        give_up, group = time.monotonic() + timeout_s, self.pgid
        while time.monotonic() < give_up:
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    group = None  # gone: never signalled again
            if group is None and not any(_state(pid) is not None for pid in self._unreaped):
                self._unreaped.clear()
                return
            time.sleep(0.005)
        self.notes.append(f"workers {sorted(self._unreaped)} still exist {timeout_s:.0f} s after "
                          "their fork server died")
        self._unreaped.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
