"""server: what the balancing policy does to a server's request latency.

A server-shaped workload of real processes talking over real AF_UNIX stream sockets and named
pipes (:mod:`harmony.workload.serve`), every one of them a task of the run (spawned, held, released
at t0 and killed with the controller like any other, so the trace's migrations and run queues are
theirs). One open-loop client sends requests at Poisson arrivals over ``conns`` connections;
each request asks a CPU work drawn from ``sizes`` (exponential of mean ``work_us``; ``pareto``:
heavy-tailed, shape ``alpha``, same mean; ``fixed``: ``work_us`` every time), burnt in the
worker's calibrated loop, after an optional ``block_us`` asleep per stage (a disk-like wait).
``-p shape=``:

- ``thread-per-connection``: one server task per connection (a process each, as a pre-forking
  server's: the scheduler sees a thread and a process alike, a task);
- ``pool-per-stage`` (SEDA): a reader task takes every connection's requests into the first
  stage's pipe; ``stages`` stages of ``pool`` tasks each read their stage's pipe, do 1/stages of
  the work and pass it on; the reader sends the answers back;
- ``event-loop`` (Flash, no helpers): one task serves every connection inline;
- ``thread-per-core``: one event loop per CPU of the set, pinned there, connection c on loop
  c mod P.

Load. ``-p load=`` is the fraction of the capacity measured at the start of the run, where it
is captured (on the host, or by the guest agent in a VM: :meth:`Server.place`): the CPU time one
task spends handling a request besides its work (receive it from a socket, stamp it, record it,
send it on, with the wake-ups and switches that costs) is measured between small processes over
socket pairs with every CPU of the set busy, pairs across two CPUs and a pair within each, the
dearer of the two (``overhead_ns``, :func:`harmony.workload.serve.measure_overhead`: 2000 round
trips, both sides' CPU time; across on a host, within in a TCG guest), and the capacity is the
fewest requests per second any bottleneck allows (:func:`harmony.workload.serve.capacity`): the CPUs
(P s of CPU per s over the work plus one overhead per task a request passes through), each single
task (the client; the reader; a loop), and each pool of tasks that sleep ``block_us``. On this host
it is within -16..+3 % of the throughput each shape reaches overloaded (bench/server_capacity.py).
The rate is load x capacity (``rate`` given: that rate); both are recorded among the parameters. A
load of 1 or more is refused: an open loop at the capacity queues without bound. The client stops
sending, and the run says so, when more than ``max_outstanding`` requests are unanswered.

Requests table (``requests.parquet``, :data:`harmony.analysis.tables.REQUESTS`): every request,
its arrival, start, end, answer, work, the pids that served it, the CPUs they ran it on, the
migrations it met and the time its servers waited in a run queue while it was theirs
(:func:`harmony.analysis.requests.df_requests`). Measured requests are those that arrived before
``end - drain_s``: an unanswered one counts as infinitely late.

Metrics: throughput; latency (answer - arrival) p50/p90/p99/p99.9 (``harmony run --repeat N``
gives each its bootstrap interval over runs); Jain's index (sum x)^2 / (n sum x^2) of the
requests answered per connection (SEDA) and of the mean latency per connection; *service
inversion*, Ruan's eq. 3.1: with the n answered requests ranked by size (the ideal order) and by
latency (the observed one),

    SI = sum_i |pos_latency(i) - pos_size(i)| / floor(n^2 / 2),

0 when latencies are in the order of sizes, 1 when in the reverse order (requests of the same
size: the N-th observed matched with the N-th ideal); and the share of the requests at or above
the p99 latency that met a migration, or waited in a run queue, against that share among all;
run-queue burstiness (Ruan's fig. 3.2: how many tasks are runnable at once, time-weighted).
"""

from __future__ import annotations

import json
from pathlib import Path

from harmony.analysis import requests as req
from harmony.experiments.base import Experiment, Metric, Param, non_negative, positive, task_class
from harmony.workload import serve
from harmony.workload.tasks import TaskSpec

SHAPES = ("thread-per-connection", "pool-per-stage", "event-loop", "thread-per-core")
SIZES = ("exp", "pareto", "fixed")
MAX_CONNS = 256        # the client select()s its connections: far below FD_SETSIZE


def _shape(v):
    return None if v in SHAPES else f"must be one of {', '.join(SHAPES)}"


def _sizes(v):
    return None if v in SIZES else f"must be one of {', '.join(SIZES)}"


def _load(v):
    return None if 0 < v < 1 else ("must be in (0, 1): an open loop at or above the capacity "
                                   "cannot keep up, its queue grows without bound")


class Server(Experiment):
    name = "server"
    question = "What does the balancing policy do to a server's request latency?"
    thesis = "beyond the thesis (SEDA, Flash, Gordon's stages)"
    not_simulated = ("its tasks serve requests over sockets; the reference policies simulate CPU "
                     "demand only")
    not_imported = ("its analysis reads the requests its client sent and their answers, which a "
                    "trace does not hold")
    workload = frozenset({"alpha", "block_us", "conns", "max_outstanding", "pool", "sizes",
                          "stages", "work_us"})
    params = (
        Param("shape", "thread-per-connection", "str",
              "server architecture: thread per connection, pool per stage, event loop or thread "
              "per core (each named with hyphens)", _shape),
        Param("load", 0.5, "float",
              "offered load, a fraction of the capacity measured at the start, < 1", _load),
        Param("conns", lambda P: 4 * P, "int", "client connections (default 4P)", positive),
        Param("stages", 2, "int", "pool-per-stage: stages after the reader", positive),
        Param("pool", lambda P: P, "int", "pool-per-stage: tasks per stage (default P)", positive),
        Param("work_us", 200.0, "float", "mean CPU work of a request (us)", positive),
        Param("sizes", "exp", "str", "work distribution: exp (exponential), pareto (a heavy tail, "
              "shape alpha, the same mean) or fixed (work_us every time)", _sizes),
        Param("alpha", 1.5, "float", "pareto: shape (> 1)", positive),
        Param("block_us", 0.0, "float", "sleep of each serving task per request before its work "
              "(a disk-like wait; us)", non_negative),
        Param("rate", 0.0, "float", "requests per second (0: load x the capacity measured)",
              non_negative),
        Param("overhead_ns", 0, "int", "CPU time per request and task besides the work (0: "
              "measured at the start)", non_negative),
        Param("max_outstanding", 2000, "int", "unanswered requests at which the client stops "
              "sending (overloaded)", positive),
        Param("drain_s", 0.25, "float", "requests arriving in the last drain_s of the window are "
              "not measured (they may not have been answered yet)", non_negative),
        Param("duration", 3.0, "float", "seconds measured after t0", positive),
    )

    def validate(self, p, cpus):
        if p["alpha"] <= 1 and p["sizes"] == "pareto":
            raise ValueError(f"parameter alpha={p['alpha']}: a Pareto of shape <= 1 has no mean")
        if p["conns"] > MAX_CONNS:
            raise ValueError(f"parameter conns={p['conns']}: at most {MAX_CONNS}")
        if p["shape"] == "thread-per-core" and p["conns"] < len(cpus):
            raise ValueError(f"thread-per-core with conns={p['conns']} leaves loops of the "
                             f"{len(cpus)} CPUs without a connection: give conns >= {len(cpus)}")
        if p["drain_s"] >= p["duration"]:
            raise ValueError(f"drain_s={p['drain_s']} leaves nothing of "
                             f"duration={p['duration']} to measure")
        if p["policy"] == "deadline":
            raise ValueError("policy=deadline: the server's tasks block on sockets; give them a "
                             "fair or real-time class")

    def suite_points(self, ncpus, quick):
        """Every shape at load 0.5 (quick), or at 0.2, 0.5 and 0.8."""
        return [{"shape": shape, "load": load} for shape in SHAPES
                for load in ((0.5,) if quick else (0.2, 0.5, 0.8))]

    def tasks(self, p, cpus):
        P, shape = len(cpus), p["shape"]
        common = {"work_ns": int(p["work_us"] * 1e3), "block_ns": int(p["block_us"] * 1e3)}
        specs = []

        def add(name, role, cpu, pinned=False, **part):
            specs.append(TaskSpec(name=name, role=role, initial_cpu=cpus[cpu % P], pinned=pinned,
                                  serve=json.dumps({"name": name, **common, **part}),
                                  **task_class(p)))

        if shape == "thread-per-connection":
            targets = [f"c{c}" for c in range(p["conns"])]
            for c in range(p["conns"]):
                add(f"c{c:02d}", "server", c + 1, kind="conn", conn=c)
        elif shape == "pool-per-stage":
            targets = ["r"] * p["conns"]
            add("reader", "server", 1, kind="reader", conns=p["conns"])
            for k in range(1, p["stages"] + 1):
                for w in range(p["pool"]):
                    add(f"s{k}w{w}", "server", k + w, kind="stage", stage=k, stages=p["stages"])
        else:
            n = serve.loops(p, P)
            targets = [f"l{c % n}" for c in range(p["conns"])]
            for k in range(n):
                add(f"loop{k}", "server", k if n > 1 else 1, pinned=n > 1, kind="loop", loop=k,
                    conns=p["conns"])
        add("client", "client", 0, kind="client", targets=targets, rate=p["rate"],
            sizes=p["sizes"], alpha=p["alpha"], max_outstanding=p["max_outstanding"])
        return specs

    def place(self, specs, run_dir, params, cpus):
        """Each task told where its records go, the run's sockets and pipes made, and the
        overhead and rate settled where the run is captured
        (:func:`harmony.workload.serve.place`)."""
        return serve.place(specs, run_dir, params, cpus)

    summary = (
        Metric("requests", "count", "requests measured (arrived before end - drain_s)"),
        Metric("unanswered", "count", "of those, not answered by the end"),
        Metric("overloaded", "bool", "the client stopped sending: max_outstanding unanswered"),
        Metric("rate_rps", "1/s", "requests per second offered (the rate parameter)"),
        Metric("capacity_rps", "1/s", "the capacity the load is a fraction of"),
        Metric("throughput_rps", "1/s", "requests answered per second of the window"),
        *(Metric(key, "ms", f"{q:g}th percentile of the latency (answer - arrival)",
                 none_when="no request measured, or unanswered ones reach it")
          for key, q in req.LATENCY_PERCENTILES.items()),
        Metric("client_lag_p99_ms", "ms", "99th percentile of how late the client sent a request "
               "(the open loop's own delay, in the latency)", none_when="no request measured"),
        Metric("jain_answered", "index", "Jain's index of the requests answered per connection",
               none_when="no request answered"),
        Metric("jain_latency", "index", "Jain's index of the mean latency per connection",
               none_when="no request answered"),
        Metric("service_inversion", "index", "Ruan's eq. 3.1 over the answered requests",
               none_when="fewer than 2 requests answered"),
        Metric("p99_met_migration", "fraction", "of the requests at or above p99, those whose "
               "server migrated while it was theirs", none_when="no request answered"),
        Metric("p99_waited", "fraction", "of the requests at or above p99, those whose servers "
               "waited in a run queue while it was theirs (RQ_WAIT_MIN_NS or more)",
               none_when="no request answered"),
        Metric("all_met_migration", "fraction", "the same among all answered requests",
               none_when="no request answered"),
        Metric("all_waited", "fraction", "the same among all answered requests",
               none_when="no request answered"),
        Metric("runnable_mean", "tasks", "tasks runnable at once over the CPU set (client "
               "included), mean over the window"),
        Metric("runnable_p99", "tasks", "the same, 99th percentile over time (burstiness)"),
        Metric("queued_frac", "fraction", "of the window, the time more tasks were runnable than "
               "the set has CPUs"),
        Metric("server_migrations_per_task_s", "1/s", "migrations of the serving tasks, per task "
               "and second (does it keep a connection's task where its data is?)"),
        Metric("server_cpu_jain", "index", "Jain's index of the serving tasks' CPU time on each "
               "CPU (1: spread evenly; 1/P: all on one CPU)", none_when="the servers never ran"),
    )

    def analyse(self, run) -> dict:
        m, p = run.manifest, run.manifest["params"]
        t0, t_end = m["t0_ns"], m["end_ns"]
        clock = (m.get("probe_meta") or {}).get("clock")
        if clock != "mono":
            raise ValueError(f"the requests are stamped on CLOCK_MONOTONIC, the trace on {clock!r}")
        rq = req.df_requests(run.path / "raw" / req.RECORDS_DIR, run.runs, run.migrations,
                             run.events, run.tasks, t0, t_end, int(p["drain_s"] * 1e9))
        req.store_requests(run.path, rq)
        if "requests" not in m.setdefault("tables", []):
            m["tables"].append("requests")     # held by the run: checked when it is loaded
        return {**req.request_metrics(rq, t0, t_end),
                **req.burstiness(run.runqueue, m["cpus"], t0, t_end),
                **req.server_placement(run.runs, run.migrations, run.tasks, m["cpus"], t0, t_end),
                "overloaded": bool(rq.attrs.get("overloaded", False)),
                "rate_rps": float(p["rate"]), "capacity_rps": serve.capacity(p, len(m["cpus"]))}

    def plot(self, run, fig_dir: Path) -> list[Path]:
        from harmony.analysis.plots_requests import plot_latency

        m = run.manifest
        rq = req.read_requests(run.path)
        return [plot_latency(rq, run.migrations, m["t0_ns"], m["measured_s"],
                             fig_dir / "latency.png",
                             title=f"{m['params']['shape']}, load {m['params']['load']:g}")]

    def describe(self, s: dict) -> list[str]:
        def ms(key):
            return "n/a" if s[key] is None else f"{s[key]:.3f}"

        def f(key, fmt="{:.3f}"):
            return "n/a" if s[key] is None else fmt.format(s[key])

        return [
            f"requests                     {s['requests']} measured, {s['unanswered']} unanswered"
            + ("; OVERLOADED: the client stopped sending" if s["overloaded"] else ""),
            f"rate / capacity / answered   {s['rate_rps']:.0f} / {s['capacity_rps']:.0f} / "
            f"{s['throughput_rps']:.0f} per s",
            f"latency p50/p90/p99/p99.9    {ms('latency_p50_ms')} / {ms('latency_p90_ms')} / "
            f"{ms('latency_p99_ms')} / {ms('latency_p999_ms')} ms (client lag p99 "
            f"{ms('client_lag_p99_ms')} ms)",
            f"Jain (answered / latency)    {f('jain_answered', '{:.4f}')} / "
            f"{f('jain_latency', '{:.4f}')}",
            f"service inversion (eq. 3.1)  {f('service_inversion')}",
            f"p99 requests: migration      {f('p99_met_migration', '{:.1%}')} "
            f"(all: {f('all_met_migration', '{:.1%}')})",
            f"p99 requests: run-queue wait {f('p99_waited', '{:.1%}')} "
            f"(all: {f('all_waited', '{:.1%}')})",
            f"runnable tasks (burstiness)  mean {s['runnable_mean']:.2f}, "
            f"p99 {s['runnable_p99']:.0f}; "
            f"more than the CPUs {s['queued_frac']:.1%} of the time",
            f"servers' placement           {s['server_migrations_per_task_s']:.1f} migrations "
            f"per task and s; CPU time across CPUs Jain {f('server_cpu_jain', '{:.3f}')}",
        ]
