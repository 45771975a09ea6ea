"""Reference policies: a discrete-time multi-CPU scheduler simulator with known balancing rules.

The simulator runs the catalog's own workloads (the TaskSpecs of
``get_experiment(name).tasks(params, cpus)``) under one of three policies whose answers to the
thesis's questions are known by construction, and writes what a real run would have recorded: the
canonical sched events (:mod:`harmony.probes.schema`) with t0 / released / end markers.
:mod:`harmony.simulate` stores them as a run directory with probe ``synthetic``
(:mod:`harmony.probes.synthetic`) and analyses it as any capture (:mod:`harmony.pipeline`), so the
policy card can be checked against a ground truth at any CPU count without root or a kernel.

Model (one tick = 1 ms):

- a task is sleeping, queued on a CPU, running on a CPU, or dead; a duty < 100 task alternates a
  CPU burst of duty% of a random period (0.5-1.5 x period_ms) with a sleep of the rest; a task past
  ``stop_after_s`` exits the next time it runs; after ``cut_duty_at_s`` its duty is ``cut_duty``
  (0: it blocks for good the next time it runs). Pinned tasks never leave ``initial_cpu``;
- each CPU runs the runnable task with the least virtual runtime (CPU ms x 1024 / nice weight) for
  a time slice, then the least again;
- at t0 every task wakes on its initial CPU, all at once. No policy keeps a load history, so a
  warm release (tasks running before t0) would be the same: the run's notes say so;
- the fair class only (:func:`refuse_classes`): SCHED_BATCH runs as SCHED_OTHER, SCHED_IDLE with
  its load weight of 3; SCHED_FIFO, SCHED_RR and SCHED_DEADLINE are refused with one line.

Policies (:data:`POLICIES`):

global-queue      one queue for all CPUs: whenever a CPU's slice ends it runs the least-vruntime
                  task of the whole system, wherever that task last ran (BFS-like). Work
                  conserving; migrates constantly; fair.
poly-balance      per-CPU queues. Every 64 ms (and at once when a CPU goes idle) a CPU pulls from
                  the busiest CPU exactly enough to bring both towards N/P (poly-balance, global
                  information), choosing the tasks whose demand best evens the load (informed).
                  Leaves a count imbalance of one alone (strong affinity) (O(1)-like).
pairwise-random   per-CPU queues. Every 16-48 ms (random) and when idle a CPU pulls half the count
                  difference from the busiest CPU (ties broken at random; counts include the
                  CPU's sleeping tasks, as blocked load does), taking the tasks at the
                  tail of its queue whatever they are (blind). A CPU whose partner in its lowest
                  domain (cpu ^ 1) is home to one task more takes one over (a remainder task keeps
                  moving: moderate affinity, fairer than poly-balance) (CFS-like).
coin-flip         each run is poly-balance or pairwise-random, drawn from the run's seed like a
                  fair coin: a policy that genuinely varies from run to run. Where the two give
                  different labels (how many, affinity, intrinsic imbalance, selection) its card
                  must say "varies", not a label, once it has runs enough; where they
                  agree (it balances, detection is periodic, idle CPUs steal) it is decided.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import math
import random

from harmony.analysis.event_streams import (
    EXIT_DEAD,
    TASK_INTERRUPTIBLE,
    TASK_RUNNING,
    Stream,
)
from harmony.core.errors import ParameterError
from harmony.probes.schema import MARK_END, MARK_RELEASED, MARK_T0, SCHED_SOFTIRQ_VEC, make_markers
from harmony.workload.tasks import FAIR_POLICIES

TICK_NS = 1_000_000
BASE_NS = 1_000_000_000  # trace clock at t0
PID_BASE = 30_000


@dataclasses.dataclass(frozen=True)
class Policy:
    """A reference policy. ``expected`` holds the policy card labels it must produce (prefixes)."""

    name: str
    summary: str
    global_queue: bool
    slice_ms: int
    balance_ms: tuple[int, int] = (64, 64)  # periodic balance interval, drawn uniformly per check
    amount: str = "poly"  # poly | pairwise
    selection: str = "informed"  # informed | blind
    explore_p: float = 0.0  # chance of moving one task on a count difference of one / load gap
    wake_to_idle: bool = False  # a wakeup goes to an idle CPU when its own CPU is busy
    expected: dict = dataclasses.field(default_factory=dict)
    #: how balancing sees the machine: "simple" (the CPU set as one pool: the policies above),
    #: "domains" (the kernel's scheduling domains, level by level), "flat" (the same rules over
    #: one domain spanning the machine), "scx" (sched_ext's default CPU selection, one queue):
    #: :mod:`harmony.analysis.refpolicy_domains`
    model: str = "simple"
    #: per scheduling level, the labels the per-level card must give (prefixes), for the
    #: policies whose answers depend on the level
    expected_by_level: dict = dataclasses.field(default_factory=dict)
    mix: tuple[str, ...] = ()  # each run is one of these policies, drawn from its seed


POLICIES = {
    "global-queue": Policy(
        "global-queue", "one run queue for all CPUs (BFS-like): constant migration, fair",
        global_queue=True, slice_ms=6, wake_to_idle=True,
        expected={"balances": "balances", "affinity": "weak", "how_many": "global-queue",
                  "work_conserving": "yes", "detection": "not applicable",
                  "intrinsic": "fairness-first", "selection": "not applicable",
                  "time_to_balance": "not applicable"}),
    "poly-balance": Policy(
        "poly-balance",
        "per-CPU queues, poly-balance, informed selection, strong affinity (O(1)-like)",
        global_queue=False, slice_ms=10, balance_ms=(64, 64), amount="poly", selection="informed",
        expected={"balances": "balances", "affinity": "strong", "how_many": "poly-balance",
                  "time_to_balance": "fast", "work_conserving": "yes", "detection": "periodic",
                  "intrinsic": "affinity-first", "selection": "informed",
                  "priorities": "high spread"}),
    "pairwise-random": Policy(
        "pairwise-random",
        "per-CPU queues, randomised pairwise balance, blind selection (CFS-like)",
        global_queue=False, slice_ms=4, balance_ms=(16, 48), amount="pairwise", selection="blind",
        explore_p=1.0, wake_to_idle=False,
        expected={"balances": "balances", "affinity": "moderate", "how_many": "pairwise",
                  "work_conserving": "yes", "detection": "periodic", "intrinsic": "in between",
                  "selection": "blind"}),
}
POLICIES["coin-flip"] = Policy(
    "coin-flip", "each run poly-balance or pairwise-random, a fair coin per run: varies",
    global_queue=False, slice_ms=10, mix=("poly-balance", "pairwise-random"),
    expected={"balances": "balances", "affinity": "varies", "how_many": "varies",
              "work_conserving": "yes", "detection": "periodic", "intrinsic": "varies",
              "selection": "varies"})


def drawn(policy: Policy, seed: int) -> Policy:
    """The policy a run with ``seed`` follows: ``policy`` itself, or for a mixed one the policy
    its seed draws (each equally likely; a string seed: the same draw on every platform)."""
    if not policy.mix:
        return policy
    return POLICIES[random.Random(f"mix-{seed}").choice(policy.mix)]


#: the policies that see the machine's shape (:mod:`harmony.analysis.refpolicy_domains`): their
#: answers are known level by level (``expected_by_level``: the relation of the source and target
#: CPUs, :data:`harmony.analysis.topology.RELATIONS`, -> labels), and they are told apart from the
#: policies above by what they do between near and far CPUs
LEVEL_POLICIES = {
    "hierarchical": Policy(
        "hierarchical", "the Linux balancer's design: per-domain intervals, imbalance_pct, "
        "cache-hot tries, active balance, prefer-sibling, NUMA imbalance, wake-ups in the LLC",
        global_queue=False, slice_ms=4, model="domains",
        expected={"balances": "balances", "work_conserving": "yes", "detection": "periodic"},
        expected_by_level={rel: {"balances": "balances", "work_conserving": "yes",
                                 "detection": "periodic"}
                           for rel in ("smt", "llc", "package", "remote")}),
    "flat": Policy(
        "flat", "the same rules over one domain spanning the machine: no level structure",
        global_queue=False, slice_ms=4, model="flat",
        expected={"balances": "balances", "work_conserving": "yes", "detection": "periodic"},
        expected_by_level={rel: {"balances": "balances", "work_conserving": "yes",
                                 "detection": "periodic"}
                           for rel in ("smt", "llc", "package", "remote")}),
    "scx-like": Policy(
        "scx-like", "sched_ext's scx_simple: one queue, the default CPU selection (idle core, "
        "previous CPU, any idle CPU): no level structure",
        global_queue=True, slice_ms=20, model="scx",
        expected={"balances": "balances", "affinity": "weak", "how_many": "global-queue",
                  "work_conserving": "yes", "detection": "not applicable",
                  "selection": "not applicable", "time_to_balance": "not applicable"},
        expected_by_level={rel: {"balances": "balances", "detection": "not applicable"}
                           for rel in ("smt", "llc", "package", "remote")}),
}
#: every reference policy, by name
ALL_POLICIES = {**POLICIES, **LEVEL_POLICIES}


def get_policy(name: str) -> Policy:
    try:
        return ALL_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown reference policy {name!r}; choose one of "
                         f"{', '.join(ALL_POLICIES)}") from None


def refuse_classes(specs=(), params: dict | None = None) -> None:
    """ParameterError (one line) for tasks the reference policies cannot simulate, given as
    TaskSpecs or as an experiment's resolved parameters (``policy``, ``<role>_policy``): they
    model the fair class only (one queue or per-CPU queues served by virtual runtime, balanced
    by load or count), so SCHED_FIFO, SCHED_RR and SCHED_DEADLINE, whose placement is by
    priority or deadline, are refused; SCHED_BATCH runs as SCHED_OTHER (no wake-up preemption
    is modelled for either), SCHED_IDLE with its load weight of 3."""
    asked = {s.policy for s in specs} | {v for k, v in (params or {}).items()
                                         if (k == "policy" or k.endswith("_policy")) and v}
    odd = sorted(asked - set(FAIR_POLICIES))
    if odd:
        raise ParameterError(f"the reference policies model the fair class only (other, batch, "
                             f"idle): policy {', '.join(odd)} cannot be simulated")


class SimTask:
    """One simulated task: where it is, its state, its virtual runtime and demand."""

    __slots__ = ("i", "pid", "spec", "cpu", "state", "vr", "weight", "duty", "burst_left",
                 "exiting", "blocking", "prio", "sleep_ms")

    def __init__(self, i, spec, weight):
        self.i, self.pid, self.spec = i, PID_BASE + i, spec
        self.cpu = spec.initial_cpu  # index into the CPU set (mapped by the simulator)
        self.state = "S"  # S sleeping, Q queued, R running, X dead
        self.vr = 0.0
        self.weight = weight
        self.duty = spec.duty
        self.burst_left = math.inf
        self.exiting = self.blocking = False
        self.prio = 120 + spec.nice
        self.sleep_ms = 1

    @property
    def load(self) -> float:
        return self.weight / 1024 * self.duty / 100


class Simulator:
    """One simulated run. ``run()`` returns (events, markers); see the module docstring."""

    def __init__(self, policy: Policy, specs, cpus: list[int], duration_s: float, seed: int = 0,
                 topology: dict | None = None):
        from harmony.analysis.reconstruct import class_weight

        refuse_classes(specs)
        self.p = drawn(policy, seed)
        self.topology = topology       # the machine (the contract's manifest["topology"]), or None
        self.cpus = list(cpus)
        self.ncpu = len(cpus)
        index = {c: k for k, c in enumerate(self.cpus)}
        self.rng = random.Random(seed)
        self.ticks = int(round(duration_s * 1000))
        weights = class_weight([s.nice for s in specs], [s.policy for s in specs])
        self.tasks = [SimTask(i, s, int(w)) for i, (s, w) in enumerate(zip(specs, weights))]
        for t in self.tasks:
            t.cpu = index.get(t.spec.initial_cpu, 0)
        self.curr: list[SimTask | None] = [None] * self.ncpu
        self.queue: list[list[SimTask]] = [[] for _ in range(self.ncpu)]
        self.slice_used = [0] * self.ncpu
        self.slice_len = [policy.slice_ms] * self.ncpu
        self.min_vr = [0.0] * self.ncpu
        self.next_balance = [self._interval() * (k + 1) // self.ncpu for k in range(self.ncpu)]
        self.sleepers: list[tuple[int, int, SimTask]] = []
        self.timers: list[tuple[int, int, str, SimTask]] = []
        self.stream = Stream({t.pid: t.spec.comm for t in self.tasks})
        self.k = 0
        self.sub = 0
        self.context = [0] * self.ncpu     # each CPU's current context, for its pulls' common_pid

    # -- emission -------------------------------------------------------------------------------
    def _ts(self) -> int:
        self.sub += 1
        return BASE_NS + self.k * TICK_NS + self.sub * 1000

    def _switch(self, c, prev: SimTask | None, state: int, nxt: SimTask | None):
        self.stream.switch(self._ts(), self.cpus[c], prev.pid if prev else 0, state,
                           nxt.pid if nxt else 0, prev_prio=prev.prio if prev else 120,
                           next_prio=nxt.prio if nxt else 120)

    def _migrate(self, t: SimTask, dst: int, event_cpu: int, context: int = -1):
        """Record the move of ``t`` to ``dst`` on ``event_cpu``, in the context of the task
        ``context`` (its common_pid: the puller's current task, 0 for idle, -1 unsaid)."""
        self.stream.migrate(self._ts(), self.cpus[event_cpu], t.pid, self.cpus[t.cpu],
                            self.cpus[dst], common_pid=context)
        if not self.p.global_queue:  # per-CPU clocks: keep the task's lag relative to the new CPU
            t.vr += self.min_vr[dst] - self.min_vr[t.cpu]
        t.cpu = dst

    # -- helpers ----------------------------------------------------------------------------------
    def _interval(self) -> int:
        lo, hi = self.p.balance_ms
        return self.rng.randint(lo, hi)

    def _nr(self, c) -> int:
        return len(self.queue[c]) + (self.curr[c] is not None)

    def _count(self, c) -> int:
        """What balancing compares: runnable tasks (poly-balance), or tasks whose home the CPU is,
        sleeping ones included (pairwise: like blocked load, a sleeping task still weighs on its
        CPU, so a CPU idle only while its own tasks sleep does not pull)."""
        return self._assigned(c) if self.p.amount == "pairwise" else self._nr(c)

    def _assigned(self, c) -> int:
        """Tasks whose CPU is ``c``, sleeping ones included (what a task's home is)."""
        return sum(1 for t in self.tasks if t.cpu == c and t.state != "X")

    def _load(self, c) -> float:
        return sum(t.load for t in self.queue[c]) + (self.curr[c].load if self.curr[c] else 0.0)

    def _idle(self, c) -> bool:
        return self.curr[c] is None and not self.queue[c]

    def _enqueue(self, t: SimTask, c: int):
        t.state = "Q"
        self.queue[c].append(t)

    def _new_burst(self, t: SimTask):
        if t.duty >= 100:
            t.burst_left = math.inf
            return
        period = t.spec.period_ms * self.rng.uniform(0.5, 1.5)
        t.burst_left = max(0.5, t.duty / 100 * period)
        t.sleep_ms = max(1, int(round(period - t.burst_left)))

    # -- life cycle -------------------------------------------------------------------------------
    def _wake_target(self, t: SimTask) -> int:
        """The CPU a task that wakes (not at the release, not pinned) is placed on."""
        target = t.cpu
        if self.p.wake_to_idle and not self._idle(target):
            idle = [c for c in range(self.ncpu) if self._idle(c)]
            if idle:
                target = idle[0]
        return target

    def _wake(self, t: SimTask, at_release: bool = False):
        target = t.cpu
        if not at_release and t.spec.pinned:
            target = (self.cpus.index(t.spec.initial_cpu) if t.spec.initial_cpu in self.cpus
                      else t.cpu)
        elif not at_release:
            target = self._wake_target(t)
        if target != t.cpu:
            self._wake_move(t, target)
        t.vr = max(t.vr, self.min_vr[target] - self.p.slice_ms)
        self.stream.wakeup(self._ts(), self.cpus[target], t.pid, self.cpus[target])
        self._enqueue(t, target)

    def _wake_move(self, t: SimTask, target: int):
        """Record a wake-up's move of ``t`` to ``target`` (on the target, as before causes were
        told apart by the waker's CPU)."""
        self._migrate(t, target, target)

    def _block(self, t: SimTask):
        t.state = "S"
        if t.duty <= 0:
            return  # cut to zero: never wakes again
        self._new_burst(t)
        heapq.heappush(self.sleepers, (self.k + t.sleep_ms, t.i, t))

    def _movable(self, src: int) -> list[SimTask]:
        return [t for t in self.queue[src] if not t.spec.pinned]

    def _pull(self, dst: int, src: int, n: int) -> int:
        """Move ``n`` queued tasks from ``src`` to ``dst`` (recorded on ``dst``), chosen by
        policy."""
        cand = self._movable(src)
        n = min(n, len(cand))
        if n <= 0:
            return 0
        if self.p.selection == "blind":  # the tail of the queue, whatever those tasks are
            chosen = cand[-n:]
        else:  # informed: the tasks that bring dst's load closest to the average load
            total = sum(self._load(c) for c in range(self.ncpu))
            target = total / self.ncpu
            mean = sum(t.load for t in cand) / len(cand)
            have, chosen = self._load(dst), []
            for r in range(n, 0, -1):
                best = min(cand, key=lambda t: (abs(have + t.load + (r - 1) * mean - target), t.i))
                cand.remove(best)
                chosen.append(best)
                have += best.load
        for t in chosen:
            self.queue[src].remove(t)
            self._migrate(t, dst, dst, self.context[dst])
            self.queue[dst].append(t)
        return n

    def _busiest(self, dst: int) -> int | None:
        others = [c for c in range(self.ncpu) if c != dst and self._movable(c)]
        if not others:
            return None
        top = max(self._count(c) for c in others)
        ties = [c for c in others if self._count(c) == top]
        if self.p.amount == "pairwise" and len(ties) > 1:
            return self.rng.choice(ties)
        return ties[0]

    def _balance(self, dst: int, idle: bool):
        src = self._busiest(dst)
        if src is None:
            return
        qs, qd = self._count(src), self._count(dst)
        if self.p.amount == "poly":
            avg = sum(self._nr(c) for c in range(self.ncpu)) / self.ncpu
            n = int(math.floor(min(qs - avg, avg - qd) + 1e-9)) if qs - qd >= 2 else 0
            if n == 0 and qs - qd >= 2 and avg - qd >= 1:
                n = 1  # dst is a whole task below the mean: one task moves even from a source
                #        only a fraction above it (else a CPU cut late would wait forever)
        else:
            n = (qs - qd) // 2
            partner = dst ^ 1  # the CPU sharing dst's lowest domain
            if (n == 0 and not idle and self.p.explore_p > 0 and partner < self.ncpu
                    and self._movable(partner)
                    and self._assigned(partner) - self._assigned(dst) == 1
                    and self.rng.random() < self.p.explore_p):
                src, n = partner, 1  # keeps trying the other placement of a remainder task
        if idle and qs >= 2 and self.p.amount == "poly":
            n = max(n, 1)  # an idle CPU always takes work when there is any to take
        if n > 0:
            self._pull(dst, src, n)

    def _schedule_order(self):
        """The order in which the CPUs schedule within a tick (who takes a waiting task
        first): by number."""
        return range(self.ncpu)

    def _periodic(self, c: int):
        """CPU ``c``'s periodic balance at this tick, when it is due."""
        if self.next_balance[c] > self.k:
            return
        self.next_balance[c] = self.k + self._interval()
        with self._softirq(c):
            self._balance(c, idle=self._idle(c))

    @contextlib.contextmanager
    def _softirq(self, c: int):
        """The periodic balance runs inside the CPU's SCHED softirq, as the kernel's: its entry
        and exit around it, in the context of the CPU's current task (0: idle)."""
        cur = self.curr[c]
        self.context[c] = cur.pid if cur is not None else 0
        self.stream.softirq(self._ts(), self.cpus[c], True, SCHED_SOFTIRQ_VEC, self.context[c])
        yield
        self.stream.softirq(self._ts(), self.cpus[c], False, SCHED_SOFTIRQ_VEC, self.context[c])

    def _pick_global(self, c) -> SimTask | None:
        best = None
        for q in self.queue:
            for t in q:
                if t.spec.pinned and self.cpus[t.cpu] != self.cpus[c] and t.cpu != c:
                    continue
                if best is None or (t.vr, t.i) < (best.vr, best.i):
                    best = t
        if best is None:
            return None
        self.queue[best.cpu].remove(best)
        if best.cpu != c:
            self._migrate(best, c, c)
        return best

    def _pick(self, c) -> SimTask | None:
        if self.p.global_queue:
            return self._pick_global(c)
        if not self.queue[c]:
            self._balance(c, idle=True)
        if not self.queue[c]:
            return None
        best = min(self.queue[c], key=lambda t: (t.vr, t.i))
        self.queue[c].remove(best)
        return best

    def _schedule(self, c):
        cur = self.curr[c]
        if cur is not None:
            state = None
            if cur.exiting:
                self.stream.exit(self._ts(), self.cpus[c], cur.pid)
                cur.state, state = "X", EXIT_DEAD
            elif cur.blocking:
                cur.blocking = False
                self._block(cur)
                state = TASK_INTERRUPTIBLE
            elif self.slice_used[c] >= self.slice_len[c]:
                waiting = any(self.queue) if self.p.global_queue else bool(self.queue[c])
                if waiting:
                    self._enqueue(cur, c)
                    state = TASK_RUNNING
                else:
                    self.slice_used[c] = 0
            if state is None:
                return
            self.curr[c] = None
        else:
            state = TASK_RUNNING
        prev = cur
        while True:
            # a new-idle pull runs in the context of the task switched out (or of idle)
            self.context[c] = prev.pid if prev is not None else 0
            nxt = self._pick(c)
            if nxt is None:
                if prev is not None:
                    self._switch(c, prev, state, None)
                return
            if prev is not nxt or state != TASK_RUNNING:
                self._switch(c, prev, state, nxt)
            nxt.state = "R"
            self.curr[c], self.slice_used[c] = nxt, 0
            # slices vary a little, as ticks and wakeups do on a real machine: CPUs do not march in
            # step
            self.slice_len[c] = self.rng.randint(max(1, self.p.slice_ms // 2),
                                                 self.p.slice_ms * 3 // 2)
            self.min_vr[c] = max(self.min_vr[c], nxt.vr) if not self.p.global_queue else nxt.vr
            if nxt.exiting:  # a task due to exit does so as soon as it runs
                self.stream.exit(self._ts(), self.cpus[c], nxt.pid)
                nxt.state, prev, state = "X", nxt, EXIT_DEAD
                self.curr[c] = None
                continue
            if nxt.duty <= 0:  # cut to zero while it waited: it blocks when it runs
                self._block(nxt)
                prev, state = nxt, TASK_INTERRUPTIBLE
                self.curr[c] = None
                continue
            return

    def run(self):
        """Simulate; return (events DataFrame, markers DataFrame)."""
        for t in self.tasks:
            s = t.spec
            if s.stop_after_s is not None:
                # the first tick at or after the time: the workload acts when its time has come
                self.timers.append((math.ceil(s.stop_after_s * 1000 - 1e-9), t.i, "exit", t))
            if s.cut_duty_at_s is not None:
                self.timers.append((math.ceil(s.cut_duty_at_s * 1000 - 1e-9), t.i, "cut", t))
        self.timers.sort(key=lambda x: (x[0], x[1]))
        markers = [(BASE_NS, MARK_T0)]
        for t in self.tasks:  # release: everyone wakes on its initial CPU at once
            self._new_burst(t)
            self._wake(t, at_release=True)
        markers.append((self._ts(), MARK_RELEASED))
        ti = 0
        for self.k in range(self.ticks):
            if self.k:
                self.sub = 0
            while ti < len(self.timers) and self.timers[ti][0] <= self.k:
                _, _, what, t = self.timers[ti]
                ti += 1
                if what == "exit" and t.state != "X":
                    t.exiting = True
                    if t.state == "S":  # a sleeping task exits when it next wakes
                        t.duty = max(t.duty, 1.0)
                elif what == "cut":
                    t.duty = t.spec.cut_duty
                    if t.state == "R":
                        t.blocking = t.duty <= 0 or t.blocking
                    if t.duty > 0:
                        t.burst_left = min(t.burst_left, t.duty / 100 * t.spec.period_ms)
            while self.sleepers and self.sleepers[0][0] <= self.k:
                _, _, t = heapq.heappop(self.sleepers)
                if t.state == "S":
                    self._new_burst(t)
                    self._wake(t)
            if not self.p.global_queue:
                for c in range(self.ncpu):
                    self._periodic(c)
            for c in self._schedule_order():
                self._schedule(c)
            for c in range(self.ncpu):  # one tick of CPU time
                t = self.curr[c]
                if t is None:
                    continue
                t.vr += 1024 / t.weight
                self.slice_used[c] += 1
                if t.burst_left != math.inf:
                    t.burst_left -= 1
                    if t.burst_left <= 0:
                        t.blocking = True
        self.k = self.ticks
        self.sub = 0
        markers.append((BASE_NS + self.ticks * TICK_NS, MARK_END))
        mk = make_markers(ts=[m[0] for m in markers], cpu=[0] * len(markers),
                          pid=[0] * len(markers), text=[m[1] for m in markers])
        return self.stream.events(), mk


def expected_labels(policy: Policy | str) -> dict:
    """The card labels (prefixes) ``policy`` must produce; see :data:`POLICIES`."""
    policy = get_policy(policy) if isinstance(policy, str) else policy
    return dict(policy.expected)


__all__ = ["ALL_POLICIES", "LEVEL_POLICIES", "POLICIES", "Policy", "Simulator", "drawn",
           "expected_labels", "get_policy"]
