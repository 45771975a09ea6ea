"""Reference policies that see the machine's shape: a balancer by scheduling domains, the same
rules over one flat domain, and sched_ext's default CPU selection over one queue.

They extend :class:`harmony.analysis.refpolicy.Simulator` (same tasks, clock, events) with the
machine's topology (the contract's ``manifest["topology"]``: a real machine's or a synthetic one,
:mod:`harmony.analysis.machines`), so that the per-level inference can be proven against policies
whose answers at each level are known by construction.

``hierarchical`` (model "domains"), after the design of the Linux fair class's balancer
(kernel/sched/fair.c: ``sched_balance_domains``, ``sched_balance_rq``, ``find_busiest_group``,
``calculate_imbalance``, ``detach_tasks``, ``need_active_balance``; ``select_idle_sibling``):

- every CPU keeps, per domain of its own (lowest first), a balance interval (starting at
  ``min_interval`` ms), the time of its last balance and a count of failed balances. A domain is
  due when ``interval`` ms have passed: ``balance_interval`` on an idle CPU, ``balance_interval x
  busy_factor - 1`` on a busy one (one jiffy less, as the kernel's, HZ = 1000 here), at most
  ``100 x CPUs`` ms (``max_load_balance_interval``);
- at a due domain, the local group's first idle CPU balances for the group, or its first CPU when
  none is idle (``should_we_balance``); any other CPU stops there, higher domains included;
- the groups of a domain are the spans of the level below (single CPUs at the lowest level). The
  busiest group is the one of the highest type (overloaded: more tasks than CPUs; fully busy;
  with spare CPUs), then the highest load per CPU. Both groups overloaded: an imbalance below
  ``imbalance_pct`` (100 x busiest <= pct x local) is left alone; the count of tasks to move is
  the load that brings both towards the domain's average. The local group with spare CPUs: half
  the difference in tasks (when the level prefers siblings, as every level below NUMA does) or in
  idle CPUs, and at a NUMA level none while the local group would hold at most ``imb_numa_nr``
  tasks and the difference is at most 2 (``adjust_numa_imbalance``);
- tasks are taken from the busiest CPU's queue, the least recently queued first, skipping a task
  that ran this tick (cache hot) until the domain has failed more than ``cache_nice_tries`` times;
  a balance that finds an imbalance resets the interval to ``min_interval``, one that finds none
  doubles it up to ``max_interval``. A failed balance (nothing could move: a lone running task)
  counts a failure; after more than ``cache_nice_tries + 2`` the running task is pushed by the
  source's stopper (active balance: ``migration/N``, woken from the balancing CPU's softirq);
- a CPU about to idle balances at once, domain by domain from the lowest, until a task comes
  (new-idle balance, no interval, no failure counted); a CPU idle already (one that had nothing
  to run at the release, or found nothing) waits for its periodic balance, at the idle
  interval (the kernel's nohz idle balance does it for the idle CPUs at their own intervals);
- a waking task goes to its previous CPU if idle, else to an idle core of that CPU's last-level
  cache, else to an idle CPU of it, else stays (``select_idle_sibling``: wake-ups never leave the
  LLC; the waker is the previous CPU, whose timer fires);
- every CPU of the machine is simulated, the experiment's tasks allowed on the run's CPU set
  only: a CPU outside it balances as the kernel's do (an idle CPU of the target's group balances
  for the group, and moves a task it may not run to a CPU of its group that may,
  LBF_DST_PINNED), and its groups count the CPUs outside the set, idle. A balance that
  affinity kept from evening its level marks its group imbalanced for the level above (the
  group's ``sgc->imbalance``, LBF_SOME_PINNED), where it is then the busiest group and gives
  one task at a time (``group_imbalanced``) until a balance below finds its level even again.
  Not modelled: misfit and asymmetric packing, the NUMA balancer, the new-idle balance's cost
  cut-off.

``flat``: the same rules over one domain spanning the run's CPU set (the MC level of a machine
of one LLC, ``min_interval`` = the set's CPU count; the CPUs outside it do not balance, as CPUs of
another root domain), and wake-ups to an idle CPU anywhere in it: a policy without levels whose
answers are the same between any two CPUs.

``scx-like`` (model "scx"), sched_ext's ``scx_simple`` with the kernel's default CPU selection
(kernel/sched/ext.c ``scx_select_cpu_dfl``, 6.12): one queue for every CPU (a CPU whose slice of
20 ms ends, or that idles, takes the task of least virtual time), and a waking task placed on
its previous CPU if its whole core is idle, else on a wholly idle core anywhere, else on its
previous CPU if idle, else on any idle CPU, else queued: SMT-aware, blind to LLCs and nodes.
"""

from __future__ import annotations

import dataclasses

from harmony.analysis.refpolicy import Simulator, SimTask
from harmony.probes.schema import SCHED_SOFTIRQ_VEC

#: sysctl_sched_migration_cost is 0.5 ms: a task preempted this tick (1 ms) is still cache hot
STOPPER_PID_BASE = 20_000
#: load units: a nice-0 task weighs 1024
NICE_0_LOAD = 1024
#: sysctl_sched_nr_migrate: at most this many tasks move in one balance
SCHED_NR_MIGRATE = 32
#: a domain whose tasks are all pinned away doubles its interval up to this (ms)
MAX_PINNED_INTERVAL = 512

#: group types, in find_busiest_group's order (misfit and asymmetric packing not modelled)
IMBALANCED, OVERLOADED, FULLY_BUSY, HAS_SPARE = 3, 2, 1, 0


@dataclasses.dataclass
class _Level:
    """One domain of one CPU, restricted to the CPU set (indices into it)."""

    index: int
    name: str
    span: list[int]
    groups: list[list[int]]      # the local group first
    flags: frozenset
    min_interval: int
    max_interval: int
    busy_factor: int
    imbalance_pct: int
    cache_nice_tries: int
    prefer_sibling: bool         # the level below prefers siblings (sds->prefer_sibling)
    imb_numa_nr: int
    interval: int = 0            # balance_interval, ms
    last: int = 0                # tick of the last balance
    failed: int = 0              # nr_balance_failed

    @property
    def numa(self) -> bool:
        return "SD_NUMA" in self.flags

    @property
    def llc(self) -> bool:
        return bool(self.flags & {"SD_SHARE_LLC", "SD_SHARE_PKG_RESOURCES"})


def flatten(topology: dict, cpus: list[int]) -> dict:
    """``topology`` with one domain over the CPU set ``cpus`` for each of them and none for the
    other CPUs (which then never balance, as CPUs of another root domain): the flat policy's
    view. The CPUs, caches and nodes stay as they are."""
    from harmony.analysis.machines import Machine, domains_of

    one = domains_of(Machine(cores=len(cpus)), 0)[0]
    level = {**one, "span": sorted(cpus)}
    return {**topology, "domains": {c: ([dict(level)] if int(c) in cpus else [])
                                    for c in topology["cpus"]}}


def imb_numa_nr(topology: dict, cpu: int) -> dict[int, int]:
    """Each domain index of ``cpu`` -> its ``imb_numa_nr`` by topology.c's rule (6.1 and 6.12
    alike): at the first domain above the LLC, the node's LLC count (or an eighth of the node's
    CPUs when the node is one LLC, at least 1); above it, that times the span's weight over the
    first NUMA domain's. The domains above the LLC are rebuilt with the package level (x86:
    the node) that a machine whose node is its LLC loses as degenerate."""
    cpus = topology["cpus"]
    me = cpus[str(cpu)]
    node = [c for c, v in cpus.items() if v.get("node") == me.get("node")]
    llc = [c for c, v in cpus.items() if v.get("llc") == me.get("llc")]
    nr_llcs = len(node) // max(1, len(llc))
    imb = max(1, len(node) >> 3) if nr_llcs == 1 else nr_llcs
    levels = topology["domains"][str(cpu)]
    first_numa = next((len(d["span"]) for d in levels if "SD_NUMA" in (d.get("flags") or ())),
                      None)
    out = {}
    for d in levels:
        w = len(d["span"])
        if w <= len(llc):
            out[d["index"]] = 0
        elif w <= len(node):
            out[d["index"]] = imb
        else:
            out[d["index"]] = imb * max(1, w // (first_numa or w))
    return out


class DomainSimulator(Simulator):
    """The ``hierarchical`` and ``flat`` policies (see the module docstring). Every CPU of the
    machine is simulated; the experiment's tasks may run on the run's CPU set only."""

    def __init__(self, policy, specs, cpus, duration_s, seed=0, topology=None):
        from harmony.analysis.machines import flat_topology

        machine = topology or flat_topology(max(cpus) + 1)
        if policy.model == "flat":
            machine = flatten(machine, cpus)
        everything = sorted(int(c) for c in machine["cpus"])
        if everything != list(range(len(everything))) or not set(cpus) <= set(everything):
            raise ValueError(f"the CPU set {cpus} is not part of the machine's CPUs 0-"
                             f"{len(everything) - 1}")
        super().__init__(policy, specs, everything, duration_s, seed, topology)
        self.machine = machine
        self.allowed = frozenset(cpus)             # where the experiment's tasks may run
        self.levels = [self._levels(c) for c in range(self.ncpu)]
        self.max_interval_ms = 100 * self.ncpu     # HZ * num_online_cpus / 10, at HZ = 1000
        self.llc = [self._llc(c) for c in range(self.ncpu)]
        self.siblings = [list(machine["cpus"][str(c)].get("thread_siblings") or [c])
                         for c in range(self.ncpu)]
        self.ran_at: dict[int, int] = {}
        self.due: dict[tuple, int] = {}         # (cpu, busy) -> the tick its next domain is due
        self.moves, self.util, self.util_at = 0, [], None
        #: groups (level index, span) marked imbalanced by a failed balance below them
        self.imbalanced: set[tuple] = set()
        #: the CPU idles already: the new-idle balance runs as a CPU becomes idle, not while it is
        self.idle = [True] * self.ncpu
        self.stopper = {c: STOPPER_PID_BASE + c for c in range(self.ncpu)}
        for c, pid in self.stopper.items():
            self.stream.names[pid] = f"migration/{c}"

    # -- the machine ----------------------------------------------------------------------------
    def _levels(self, c: int) -> list[_Level]:
        doms = self.machine["domains"][str(c)]
        imb = imb_numa_nr(self.machine, c)
        out = []
        for k, d in enumerate(doms):
            span = sorted(d["span"])
            groups, covered = [], set()
            for x in [c] + [x for x in span if x != c]:
                if x in covered:
                    continue
                g = sorted(self.machine["domains"][str(x)][k - 1]["span"]) if k else [x]
                groups.append(g)
                covered |= set(g)
            child_flags = set(doms[k - 1].get("flags") or ()) if k else set()
            out.append(_Level(d["index"], d.get("name") or "?", span, groups,
                              frozenset(d.get("flags") or ()), d["min_interval"],
                              d["max_interval"], d["busy_factor"], d["imbalance_pct"],
                              d["cache_nice_tries"], "SD_PREFER_SIBLING" in child_flags,
                              imb.get(d["index"], 0), interval=d["min_interval"]))
        return out

    def _llc(self, c: int) -> list[int]:
        """``c``'s last-level cache domain's CPUs (sd_llc): where its wake-ups may go."""
        doms = self.machine["domains"][str(c)]
        llc = [d for d in doms if {"SD_SHARE_LLC", "SD_SHARE_PKG_RESOURCES"} & set(d.get("flags")
                                                                                  or ())]
        return sorted(llc[-1]["span"]) if llc else [c]

    def _may_run(self, t: SimTask, x: int) -> bool:
        return x == t.cpu if t.spec.pinned else x in self.allowed

    # -- wake-ups --------------------------------------------------------------------------------
    def _wake_target(self, t: SimTask) -> int:
        prev = t.cpu
        if self._idle(prev):
            return prev
        llc = [x for x in self.llc[prev] if self._may_run(t, x)]
        for x in llc:                      # an idle core: all its threads idle
            if self._idle(x) and all(self._idle(y) for y in self.siblings[x]):
                return x
        for x in llc:
            if self._idle(x):
                return x
        return prev

    def _wake_move(self, t: SimTask, target: int):
        """The wake-up's move, made by the waker (the previous CPU, whose timer fired): its
        sched_waking and the move are recorded there."""
        waker = t.cpu
        self.stream.waking(self._ts(), waker, t.pid, waker, common_pid=self._running_pid(waker))
        self._migrate(t, target, waker, self._running_pid(waker))

    def _running_pid(self, c: int) -> int:
        cur = self.curr[c]
        return cur.pid if cur is not None else 0

    def _enqueue(self, t: SimTask, c: int):
        if t.state == "R":
            self.ran_at[t.i] = self.k      # preempted now: cache hot this tick
        super()._enqueue(t, c)

    # -- balancing -------------------------------------------------------------------------------
    def _due(self, c: int, busy: bool) -> int:
        """The tick CPU ``c``'s next domain is due at (cached until a balance of its changes
        an interval or a time)."""
        key = (c, busy)
        if key not in self.due:
            self.due[key] = min((lv.last + self._interval_of(lv, busy) for lv in self.levels[c]),
                                default=self.ticks + 1)
        return self.due[key]

    def _periodic(self, c: int):
        busy = not self._idle(c)
        if self.k < self._due(c, busy):
            return
        self.due.pop((c, True), None)
        self.due.pop((c, False), None)
        # the softirq's entry and exit, recorded on a CPU of the set always, elsewhere only
        # around a move (an idle CPU outside the set balances often and moves nothing)
        cur = self.curr[c]
        self.context[c] = cur.pid if cur is not None else 0
        entry, before = self._ts(), len(self.stream)
        for lv in self.levels[c]:
            if self.k < lv.last + self._interval_of(lv, busy):
                continue
            lv.last = self.k
            if not self._should_balance(c, lv):
                lv.failed = 0
                self._relax(lv)
                break                      # another CPU of the group balances from here up
            if self._load_balance(c, lv, "busy" if busy else "idle"):
                busy = not self._idle(c)
        if c in self.allowed or len(self.stream) > before:
            self.stream.softirq(entry, c, True, SCHED_SOFTIRQ_VEC, self.context[c])
            self.stream.softirq(self._ts(), c, False, SCHED_SOFTIRQ_VEC, self.context[c])

    def _interval_of(self, lv: _Level, busy: bool) -> int:
        ms = lv.interval * lv.busy_factor - 1 if busy else lv.interval
        return max(1, min(ms, self.max_interval_ms))

    def _should_balance(self, c: int, lv: _Level) -> bool:
        local = lv.groups[0]
        idle = [x for x in local if self._idle(x)]
        return (idle[0] if idle else local[0]) == c

    @staticmethod
    def _relax(lv: _Level):
        if lv.interval < lv.max_interval:
            lv.interval *= 2

    def _pick(self, c):
        if not self.queue[c] and not self.idle[c]:
            for lv in self.levels[c]:          # new-idle balance, lowest domain first
                if self._load_balance(c, lv, "newidle"):
                    break
        if not self.queue[c]:
            self.idle[c] = True                # idle from now on: only its periodic balance pulls
            return None
        self.idle[c] = False
        best = min(self.queue[c], key=lambda t: (t.vr, t.i))
        self.queue[c].remove(best)
        return best

    def _util(self, x: int) -> float:
        """CPU ``x``'s utilisation, 0..1: the demand of the tasks whose CPU it is, sleeping ones
        included (PELT's util_avg keeps a sleeping task's share); summed once per tick and
        move."""
        if self.util_at != (self.k, self.moves):
            util = [0.0] * self.ncpu
            for t in self.tasks:
                if t.state != "X":
                    util[t.cpu] += t.duty / 100
            self.util, self.util_at = [min(1.0, u) for u in util], (self.k, self.moves)
        return self.util[x]

    def _migrate(self, t: SimTask, dst: int, event_cpu: int, context: int = -1):
        self.moves += 1
        super()._migrate(t, dst, event_cpu, context)

    def _stats(self, g: list[int], pct: int, index: int = -1) -> dict:
        """A group's statistics and type, by update_sg_lb_stats and group_classify: overloaded
        when it has more tasks than CPUs and its utilisation or its runnable tasks exceed its
        capacity by imbalance_pct; with spare capacity when it has fewer tasks than CPUs, or its
        runnable tasks do not exceed it and its utilisation stays below it by imbalance_pct;
        fully busy otherwise (runnable: one CPU's worth per runnable task)."""
        nr = sum(self._nr(x) for x in g)
        load = sum(self._load(x) for x in g)
        util = sum(self._util(x) for x in g)
        w = len(g)
        if nr > w and (w * 100 < util * pct or w * pct < nr * 100):
            kind = OVERLOADED
        elif nr < w or (not w * pct < nr * 100 and w * 100 > util * pct):
            kind = HAS_SPARE
        else:
            kind = FULLY_BUSY
        if (index, frozenset(g)) in self.imbalanced:
            kind = IMBALANCED              # affinity kept a child level from balancing it
        return {"cpus": g, "nr": nr, "load": load, "w": w, "avg": load / w, "type": kind,
                "idle": sum(self._idle(x) for x in g)}

    def _groups(self, lv: _Level) -> tuple[dict, dict | None, float]:
        """(the local group's statistics, the busiest group's or None, the domain's load per
        CPU)."""
        stats = [self._stats(g, lv.imbalance_pct, lv.index) for g in lv.groups]
        local, others = stats[0], [s for s in stats[1:] if s["nr"] > 0]
        dom_avg = sum(s["load"] for s in stats) / sum(s["w"] for s in stats)
        if not others:
            return local, None, dom_avg
        busiest = max(others, key=lambda s: (s["type"], s["avg"] if s["type"] >= OVERLOADED
                                             else -s["idle"], s["nr"]))
        return local, busiest, dom_avg

    def _imbalance(self, lv: _Level, idle: str) -> tuple[str, float, dict | None]:
        """(migration type, amount: tasks or load, the busiest group) of find_busiest_group and
        calculate_imbalance; amount 0: balanced."""
        local, busiest, dom_avg = self._groups(lv)
        if busiest is not None and busiest["type"] == IMBALANCED:
            return "task", 1, busiest      # move any task: the next balance evens it again
        if busiest is None or local["type"] > busiest["type"]:
            return "none", 0, None
        if local["type"] == OVERLOADED:
            if local["avg"] >= busiest["avg"] or local["avg"] >= dom_avg:
                return "none", 0, None
            if 100 * busiest["avg"] <= lv.imbalance_pct * local["avg"]:
                return "none", 0, None     # below imbalance_pct: left alone
        forced = (lv.prefer_sibling and local["type"] == HAS_SPARE
                  and busiest["nr"] > local["nr"] + 1)
        if not forced and busiest["type"] != OVERLOADED and (
                idle == "busy" or (busiest["w"] > 1 and local["idle"] <= busiest["idle"] + 1)
                or busiest["nr"] <= 1):
            return "none", 0, None
        if local["type"] == HAS_SPARE:
            if busiest["type"] == OVERLOADED and not lv.llc:
                return "task", max(local["idle"], 1 if idle != "busy" else 0), busiest
            if busiest["w"] == 1 or lv.prefer_sibling:
                diff = max(0, busiest["nr"] - local["nr"])
            else:
                diff = max(0, local["idle"] - busiest["idle"])
            if lv.numa and local["nr"] + 1 <= lv.imb_numa_nr and diff <= 2:
                diff = 0                   # a small imbalance between nodes is allowed
            return "task", diff >> 1, busiest
        if local["type"] < OVERLOADED and (local["avg"] >= busiest["avg"]
                                           or local["avg"] >= dom_avg):
            return "none", 0, None
        amount = min((busiest["avg"] - dom_avg) * busiest["w"],
                     (dom_avg - local["avg"]) * local["w"])
        return "load", amount, busiest

    def _load_balance(self, c: int, lv: _Level, idle: str) -> int:
        self.due.pop((c, True), None)          # its interval may change here
        self.due.pop((c, False), None)
        kind, amount, busiest = self._imbalance(lv, idle)
        parent = self._parent(c, lv)
        if amount <= 0:
            lv.failed = 0
            self.imbalanced.discard(parent)    # balanced: the level above may trust its averages
            if idle != "newidle":
                self._relax(lv)
            return 0
        cand = [x for x in busiest["cpus"] if self._nr(x) > 0]
        src = max(cand, key=(lambda x: (self._nr(x), -x)) if kind == "task"
                  else (lambda x: (self._load(x), -x)))
        moved, left, all_pinned, some_pinned = self._detach(c, src, lv, kind, amount, idle)
        if some_pinned and left > 0 and parent is not None:
            self.imbalanced.add(parent)        # affinity kept this level from balancing
        if all_pinned:                         # nothing there may run in this group
            lv.failed = 0
            if idle != "newidle" and lv.interval < max(lv.max_interval, MAX_PINNED_INTERVAL):
                lv.interval *= 2
            return 0
        if not moved:
            if idle != "newidle":
                lv.failed += 1
            cur = self.curr[src]
            if (kind == "task" and lv.failed > lv.cache_nice_tries + 2 and cur is not None
                    and self._may_run(cur, c)):
                self._active_push(src, c)
        else:
            lv.failed = 0
        lv.interval = lv.min_interval          # unbalanced: reset the interval
        return moved

    def _parent(self, c: int, lv: _Level) -> tuple | None:
        """The key of the group ``lv``'s span forms in ``c``'s next domain up (sgc->imbalance
        of sd->parent->groups), or None at the top."""
        above = [x for x in self.levels[c] if x.index > lv.index]
        return (above[0].index, frozenset(lv.span)) if above else None

    def _detach(self, c, src, lv: _Level, kind: str, amount: float,
                idle: str) -> tuple[int, float, bool, bool]:
        """Move tasks from ``src`` to ``c``, or, for tasks that may not run there, to another
        CPU of ``c``'s local group where they may (LBF_DST_PINNED); (moved, the amount left,
        all pinned: nothing of ``src`` may run in the group, some pinned: a task could not run
        on ``c``)."""
        moved, any_allowed, some_pinned = 0, False, False
        local = lv.groups[0]
        for t in reversed(list(self.queue[src])):      # the least recently queued first
            if amount <= 0 or moved >= SCHED_NR_MIGRATE or (idle != "busy"
                                                            and self._nr(src) <= 1):
                break
            if not self._may_run(t, c):
                some_pinned = True
            dst = c if self._may_run(t, c) else next(
                (x for x in local if self._may_run(t, x)), None)
            if dst is None:
                continue
            any_allowed = True
            if self.ran_at.get(t.i) == self.k and lv.failed <= lv.cache_nice_tries:
                continue                                 # cache hot
            if kind == "load":
                load = t.weight / NICE_0_LOAD
                if load / (1 << min(lv.failed, 30)) > amount:
                    continue
                amount -= load
            else:
                amount -= 1
            self.queue[src].remove(t)
            self._migrate(t, dst, c, self.context[c])
            self.queue[dst].append(t)
            moved += 1
        cur = self.curr[src]
        running_allowed = cur is not None and any(self._may_run(cur, x) for x in local)
        if cur is not None and not self._may_run(cur, c):
            some_pinned = True
        return moved, amount, not any_allowed and not running_allowed, some_pinned

    def _active_push(self, src: int, dst: int):
        """The source's stopper pushes its running task to ``dst`` (active balance): woken from
        the balancing CPU's softirq, it preempts the task, moves it and leaves the CPU."""
        cur, pid = self.curr[src], self.stopper[src]
        self.stream.waking(self._ts(), dst, pid, src, common_pid=self.context[dst])
        self.stream.wakeup(self._ts(), dst, pid, src, common_pid=self.context[dst])
        self.stream.switch(self._ts(), src, cur.pid, 0, pid, prev_prio=cur.prio, next_prio=0)
        self.curr[src] = None
        self._migrate(cur, dst, src, pid)
        cur.state = "Q"
        self.queue[dst].append(cur)
        self.context[src] = pid
        self.idle[src] = False
        nxt = self._pick(src)
        self.stream.switch(self._ts(), src, pid, 1, nxt.pid if nxt else 0, prev_prio=0,
                           next_prio=nxt.prio if nxt else 120)
        if nxt is not None:
            nxt.state = "R"
            self.curr[src], self.slice_used[src] = nxt, 0


class ScxSimulator(Simulator):
    """``scx-like``: one queue, sched_ext's default CPU selection at wake-up (see the module
    docstring)."""

    def __init__(self, policy, specs, cpus, duration_s, seed=0, topology=None):
        from harmony.analysis.machines import flat_topology

        super().__init__(policy, specs, cpus, duration_s, seed, topology)
        machine = topology or flat_topology(len(cpus))
        where = {c: k for k, c in enumerate(self.cpus)}
        self.siblings = [[where[s] for s in machine["cpus"][str(c)].get("thread_siblings") or [c]
                          if s in where] for c in self.cpus]
        self.smt = any(len(s) > 1 for s in self.siblings)

    def _schedule_order(self):
        """Idle CPUs take from the one queue in no order of the machine's: a random one each
        tick (the default selection picks an idle CPU with cpumask_any_and_distribute)."""
        order = list(range(self.ncpu))
        self.rng.shuffle(order)
        return order

    def _core_idle(self, c: int) -> bool:
        return all(self._idle(x) for x in self.siblings[c])

    def _wake_target(self, t: SimTask) -> int:
        prev = t.cpu
        if self.smt:
            if self._core_idle(prev):
                return prev
            cores = [x for x in range(self.ncpu) if self._core_idle(x)]
            if cores:
                return self.rng.choice(cores)
        if self._idle(prev):
            return prev
        idle = [x for x in range(self.ncpu) if self._idle(x)]
        return self.rng.choice(idle) if idle else prev


def simulator_for(policy) -> type[Simulator]:
    """The simulator class of ``policy`` (its ``model``)."""
    return {"domains": DomainSimulator, "flat": DomainSimulator,
            "scx": ScxSimulator}.get(policy.model, Simulator)
