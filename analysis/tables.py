"""The tables the analysis derives from a run's events: each one's columns, dtypes and meanings.

Declared once here (see :class:`harmony.core.columns.Table`) and built through these declarations by
their producers: :mod:`harmony.analysis.reconstruct` (migrations, runs, runqueue, allocation,
shares, anomalies), :mod:`harmony.analysis.foreign` (foreign load) and
:mod:`harmony.analysis.counters` (counter agreement). ``print(tables.RUNS)`` shows one.

Conventions: ``ts``, ``start``, ``end`` are int64 ns on the trace clock; ``t`` is float seconds
since t0 (negative before the release); ``name`` and ``role`` are the task's, from the tasks table
(:data:`harmony.workload.tasks.TASKS`), as categoricals whose categories are sorted. A table's
``attrs`` (counts of what the reconstruction found wrong in the trace, for instance) are documented
by the function that builds it; they are stored in the Parquet file with the table.

The other tables of a run are declared beside their producers: ``tasks`` in
:mod:`harmony.workload.tasks`, ``kernel_samples``, ``kernel_counters`` and ``kernel_nr_running`` in
the kernel samplers (:mod:`harmony.probes.proc_stat`, :mod:`harmony.probes.proc_sched`,
:mod:`harmony.probes.sched_debug`), ``events`` and ``markers`` in :mod:`harmony.probes.schema`.
"""

from __future__ import annotations

from harmony.core.columns import Table

MIGRATIONS = Table(
    "migrations", "every sched_migrate_task of an experiment task, and every move of one "
                  "its own events prove but no probe recorded (inferred), in time order", [
        ("ts",        "int64",    "event time (ns)"),
        ("t",         "float64",  "s since t0; negative for a set-up move before the release"),
        ("pid",       "int32",    "the task moved"),
        ("name",      "category", "its name"),
        ("role",      "category", "its role"),
        ("src_cpu",   "int32",    "the event's orig_cpu"),
        ("dst_cpu",   "int32",    "the event's dest_cpu"),
        ("event_cpu", "int32",    "CPU that recorded the event: the puller for a load_balance "
                                  "pull, the source CPU's stopper for an active balance, the "
                                  "waker's CPU for a wakeup placement"),
        ("kind",      "category", '"wakeup" or "balance" (its categories, in that order). '
                                  "wakeup: the task was not runnable, its CPU was chosen as it "
                                  "woke or forked (the event precedes its sched_wakeup[_new]); "
                                  "balance: moved while runnable (queued, or - an anomaly - "
                                  "believed running), or asleep but still queued (EEVDF's "
                                  "delayed dequeue: harmony.analysis.causes.queued_asleep)"),
        ("cause",     "category", "why it moved (harmony.analysis.causes.CAUSES, its categories "
                                  "in that order): wakeup, fork, newidle, periodic, active, "
                                  "affinity, numa or unknown, told from the events around it"),
        ("inferred",  "bool",     "no probe recorded this move: the task's own events prove it "
                                  "(harmony.analysis.causes.unrecorded_moves); ts is the "
                                  "placement that proved it (the move came before), event_cpu "
                                  "that placement's CPU"),
        ("level",     "int16",    "the index of the lowest scheduling domain of dst_cpu whose "
                                  "span holds src_cpu (harmony.analysis.topology."
                                  "migration_level); -1: none (src_cpu = dst_cpu, or the run "
                                  "read no domains)"),
        ("level_name", "category", "that level's key: the domain's name (SMT, MC, PKG, NUMA...), "
                                   "or domain<level> where the kernel gives none, made unique "
                                   "along dst_cpu's chain: the n-th domain of a name up the "
                                   "chain (by index, n > 1) is suffixed n, so an asymmetric "
                                   "NUMA machine's two NUMA levels are NUMA and NUMA2 "
                                   "(harmony.probes.domains.chain_keys); missing where level "
                                   "is -1. Categories: the levels, lowest first"),
    ])

RUNS = Table(
    "runs", "every interval during which an experiment task ran on a CPU, sorted by "
            "(start, cpu, end)", [
        ("pid",          "int32",    "the task"),
        ("name",         "category", "its name"),
        ("role",         "category", "its role"),
        ("cpu",          "int32",    "the CPU it ran on"),
        ("start",        "int64",    "switch-in (ns); an estimate where unseen_start"),
        ("end",          "int64",    "switch-out (ns), or t_end where truncated"),
        ("duration",     "int64",    "end - start (ns)"),
        ("t",            "float64",  "start, in s since t0"),
        ("end_state",    "int64",    "prev_state at the ending switch: 0 = preempted, else it "
                                     "blocked or died; -1 if truncated, or if the ending switch "
                                     "is another task's (how it ended is unknown)"),
        ("truncated",    "bool",     "still running at t_end or at the end of the trace: closed "
                                     "at t_end"),
        ("unseen_start", "bool",     "its switch-in was not seen (running when the trace began, "
                                     "or a lost switch-in): start is inferred"),
    ])

RUNQUEUE = Table(
    "runqueue", "a step function per CPU, sorted by (ts, cpu), (ts, cpu) unique: the first rows "
                "are each CPU's state at the start of the trace, then one row per change", [
        ("ts",  "int64",   "from this instant on (ns)"),
        ("t",   "float64", "ts, in s since t0"),
        ("cpu", "int32",   "the CPU"),
        ("nr",  "int32",   "experiment tasks running or waiting on the CPU, from ts until the "
                           "CPU's next row"),
    ])

ALLOCATION = Table(
    "allocation", "each experiment task's CPU time in consecutive windows [t0 + k*w, "
                  "t0 + (k+1)*w) of [t0, t_end); every (window, task) pair, sorted by (window, "
                  "task order in the tasks table)", [
        ("pid",          "int32",    "the task"),
        ("name",         "category", "its name"),
        ("role",         "category", "its role"),
        ("window",       "int64",    "the window's index k"),
        ("window_start", "int64",    "the window's start (ns)"),
        ("t",            "float64",  "the window's start, in s since t0"),
        ("window_s",     "float64",  "the window's length (s); the last may be shorter"),
        ("cpu_time",     "float64",  "s the task ran in the window (0 if it did not)"),
        ("share",        "float64",  "cpu_time / window_s: the fraction of one CPU"),
    ])

SHARES = Table(
    "shares", "each experiment task's CPU time in [t0, t_end] against its fair share, in "
              "tasks table order", [
        ("pid",      "int32",    "the task"),
        ("name",     "category", "its name"),
        ("role",     "category", "its role"),
        ("nice",     "int64",    "its nice value"),
        ("weight",   "int64",    "its load weight: the kernel's sched_prio_to_weight of nice "
                                 "(SCHED_IDLE: 3); 0 for fifo, rr and deadline, not shared by "
                                 "weight"),
        ("policy",   "category", "its scheduling class (harmony.workload.tasks.POLICIES; other "
                                 "for a run recorded before classes existed)"),
        ("demand",   "float64",  "duty / 100: the fraction of one CPU it would use alone"),
        ("cpu_time", "float64",  "s it ran in [t0, t_end]"),
        ("share",    "float64",  "cpu_time / (t_end - t0): the fraction of one CPU"),
        ("fair",     "float64",  "its fair share, a fraction of one CPU "
                                 "(harmony.analysis.reconstruct.fair_shares)"),
        ("ratio",    "float64",  "share / fair; NaN where fair is 0"),
    ])

ANOMALIES = Table(
    "anomalies", "every contradiction the task state machine repaired "
                 "(harmony.analysis.taskstate), in time order", [
        ("ts",              "int64",        "event time (ns)"),
        ("t",               "float64",      "s since t0"),
        ("pid",             "int32",        "the task"),
        ("name",            "category",     "its name"),
        ("role",            "category",     "its role"),
        ("cpu",             "int32",        "CPU that recorded the event"),
        ("record",          "str | object", 'which record of the event, e.g. "switch_in" '
                                            "(taskstate.RECORDS); object if the table is empty"),
        ("anomaly",         "str | object", "the contradiction (taskstate.ANOMALIES); object if "
                                            "the table is empty"),
        ("cpu_before",      "int32",        "where the task was believed to be"),
        ("runnable_before", "bool",         "whether it was believed runnable"),
        ("running_before",  "bool",         "whether it was believed running"),
    ])

FOREIGN_LOAD = Table(
    "foreign_load", "CPU time of each CPU of the set in [t0, t_end], by whom it went to; a CPU "
                    "without any switch in the window has NaN times (nothing seen, nothing "
                    "claimed)", [
        ("cpu",          "int32",   "the CPU"),
        ("window_s",     "float64", "t_end - t0 (s)"),
        ("experiment_s", "float64", "s experiment tasks ran"),
        ("controller_s", "float64", "s the run's own controller threads ran (probe drains, perf "
                                    "record, sampler)"),
        ("foreign_s",    "float64", "s any other task ran"),
        ("idle_s",       "float64", "s the idle task ran"),
        ("foreign_frac", "float64", "foreign_s / window_s"),
        ("top_foreign",  "str",     'the foreign comm that ran longest, or ""'),
    ])

COUNTER_AGREEMENT = Table(
    "counter_agreement", "one row per task read at both ends of the run (kernel_counters' "
                         '"start" and "end" reads), by pid', [
        ("pid",               "int32", "the task"),
        ("migrations_kernel", "int64", "its nr_migrations' difference between the reads"),
        ("migrations_trace",  "int64", "its migrations (orig_cpu != dest_cpu) surely between "
                                       "the reads"),
        ("migrations_unsure", "int64", "its migrations inside a read's window"),
        ("migrations_agree",  "bool",  "trace <= kernel <= trace + unsure"),
        ("switches_kernel",   "int64", "its nr_switches' difference between the reads"),
        ("switches_trace",    "int64", "its switches away (sched_switch prev) surely between "
                                       "the reads"),
        ("switches_unsure",   "int64", "its switches away inside a read's window"),
        ("switches_agree",    "bool",  "trace <= kernel <= trace + unsure"),
        ("wakeups_kernel",    "int64", "its nr_wakeups_migrate's difference between the reads: its "
                                       "wake-ups that moved it (-1: not counted, a kernel "
                                       "without schedstats)"),
        ("wakeups_trace",     "int64", "its migrations of cause wakeup (recorded or inferred, "
                                       "to another CPU) surely between the reads"),
        ("wakeups_unsure",    "int64", "its migrations of cause wakeup inside a read's window"),
        ("wakeups_agree",     "bool",  "counted, and trace <= kernel <= trace + unsure"),
        ("forced_kernel",     "int64", "its nr_forced_migrations' difference: moves by a load "
                                       "balance despite a hot cache (-1: not counted)"),
        ("cpu_kernel_ns",     "int64", "its sum_exec_runtime's difference between the reads"),
        ("cpu_trace_ns",      "int64", "its run time between the reads' midpoints"),
    ])

REQUESTS = Table(
    "requests", "every request of a server run (experiment server), by id: what the client and "
                "the serving tasks recorded (harmony.workload.serve), joined with the trace "
                "(harmony.analysis.requests.df_requests)", [
        ("id",         "int64",   "request id, in the order the client made them"),
        ("conn",       "int32",   "the connection it was sent on"),
        ("arrival",    "int64",   "when it was due (Poisson arrival; ns, CLOCK_MONOTONIC, the "
                                  "trace's clock)"),
        ("sent",       "int64",   "when the client made it (>= arrival: later when the client "
                                  "itself was late)"),
        ("start",      "int64",   "when a serving task first took it; -1 if none did"),
        ("end",        "int64",   "when its last work stage finished; -1 if it did not"),
        ("done",       "int64",   "when the client read its answer; -1 if it did not"),
        ("t",          "float64", "arrival, in s since t0"),
        ("work_ns",    "int64",   "CPU work it asked (ns)"),
        ("latency_ns", "float64", "done - arrival; NaN if unanswered"),
        ("answered",   "bool",    "the client read its answer"),
        ("measured",   "bool",    "it arrived in [t0, end - drain_s]: counted by the metrics"),
        ("pids",       "str",     "the tasks that served it, in the order they did "
                                  "(comma-separated pids)"),
        ("cpus",       "str",     "the CPUs they ran on while it was theirs (runs table; "
                                  "comma-separated, ascending)"),
        ("migrations", "int64",   "migrations of its serving tasks while it was theirs (from "
                                  "reaching a task to that task's end of work on it, or to "
                                  "the client's reading of the answer if sooner)"),
        ("wait_ns",    "int64",   "time its serving tasks were runnable and not running while "
                                  "it was theirs (run-queue wait: preempted, or woken and not "
                                  "yet on a CPU)"),
    ])

WASTED = Table(
    "wasted", "every interval in [t0, t_end] during which a CPU of the set was idle while an "
              "experiment task free to run on it waited runnable on another CPU "
              "(harmony.analysis.cost.df_wasted), by (start, cpu)", [
        ("cpu",      "int32",   "the idle CPU"),
        ("start",    "int64",   "from (ns)"),
        ("end",      "int64",   "to (ns)"),
        ("duration", "int64",   "end - start (ns)"),
        ("t",        "float64", "start, in s since t0"),
        ("waiting",  "int64",   "the most tasks waiting on the other CPUs during it"),
        ("long",     "bool",    "duration >= thresholds.WASTED_EPISODE_MIN_S: not a transient"),
    ])

USELESS_MIGRATIONS = Table(
    "useless_migrations", "every move of a task undone by its next move, back, within "
                          "thresholds.USELESS_MIGRATION_WITHIN_S (harmony.analysis.cost), by ts", [
        ("pid",       "int32",   "the task"),
        ("ts",        "int64",   "the first move (ns)"),
        ("t",         "float64", "ts, in s since t0"),
        ("src_cpu",   "int32",   "where it was"),
        ("dst_cpu",   "int32",   "where it went, and came back from"),
        ("back_ns",   "int64",   "time until the move back (ns)"),
        ("cause",     "str",     "the first move's cause"),
        ("back_cause", "str",    "the move back's cause"),
    ])

IDEAL = Table(
    "ideal", "each experiment task's share in each window of the allocation table against its "
             "ideal (GPS) share there (harmony.analysis.cost.df_ideal), in the allocation's "
             "order", [
        ("pid",      "int32",    "the task"),
        ("name",     "category", "its name"),
        ("role",     "category", "its role"),
        ("window",   "int64",    "the window's index"),
        ("t",        "float64",  "the window's start, in s since t0"),
        ("window_s", "float64",  "the window's length (s); the last may be shorter"),
        ("share",    "float64",  "its CPU time / the window's length: a fraction of one CPU"),
        ("ideal",    "float64",  "its ideal share: the GPS allocation of the tasks' weights and "
                                 "demands on the set's CPUs, at most one CPU"),
        ("error",    "float64",  "share - ideal"),
        ("slowdown", "float64",  "ideal / share (inf: given nothing it was owed); NaN where the "
                                 "ideal is 0"),
    ])

DOMAINS = Table(
    "domains", "the scheduling domains of each CPU the run measured on, as the manifest's "
               "topology records them (harmony.analysis.topology.df_domains), by (cpu, index)", [
        ("cpu",                 "int32",   "the CPU whose domain it is"),
        ("index",               "int32",   "its level on that CPU: 0 the lowest"),
        ("name",                "str",     "its level's key: its name (debugfs, or "
                                           "/proc/schedstat from version 17), or "
                                           "domain<index> where the kernel gives none, made "
                                           "unique along the CPU's chain (NUMA, NUMA2: "
                                           "harmony.probes.domains.chain_keys)"),
        ("span",                "str",     "its CPUs, a cpulist (/proc/schedstat's mask); \"\" "
                                           "where not read"),
        ("span_weight",         "int32",   "how many CPUs it spans (0: not read)"),
        ("flags",               "str",     "its SD_ flags, space-separated (debugfs); \"\" where "
                                           "not read"),
        ("min_interval",        "float64", "its shortest balance interval (ms; NaN: not read)"),
        ("max_interval",        "float64", "its longest balance interval (ms)"),
        ("busy_factor",         "float64", "how much longer a busy CPU waits between balances"),
        ("imbalance_pct",       "float64", "the imbalance (percent) it leaves alone"),
        ("cache_nice_tries",    "float64", "failed balances before a cache-hot task is moved"),
        ("max_newidle_lb_cost", "float64", "the costliest new-idle balance there lately (ns)"),
    ])

CPUS = Table(
    "cpus", "each CPU the run measured on, where it sits (sysfs; harmony.analysis.topology."
            "df_cpus), by CPU; -1 where sysfs does not say", [
        ("cpu",          "int32", "the CPU"),
        ("package",      "int32", "its physical package (socket)"),
        ("die",          "int32", "its die within the package"),
        ("core",         "int32", "its core id within the package"),
        ("llc",          "int32", "its last-level cache: the lowest CPU sharing it"),
        ("node",         "int32", "its NUMA node"),
        ("smt_siblings", "str",   "the CPUs of its core, a cpulist"),
    ])

#: the tables :func:`harmony.pipeline.derive_tables` makes, stored in a run directory as
#: <name>.parquet
STORED = (MIGRATIONS, RUNS, RUNQUEUE, ALLOCATION, SHARES)

PROPORTIONAL = Table(
    "proportional", "each task's allocation on P CPUs against its allocation on one CPU "
                    "(proportional speedup) and against that of a task on one CPU with 1/P of the "
                    "tasks (proportional concurrency), the thesis's 9.2 "
                    "(harmony.analysis.proportional.df_proportional), in the tasks' order", [
        ("name",              "category", "the task (matched by name across the runs)"),
        ("nice",              "int64",    "its nice value"),
        ("share_p",           "float64",  "its CPU time / the window with the tasks on the P CPUs"),
        ("ideal_p",           "float64",  "its GPS share on P CPUs (class_fair_shares)"),
        ("share_1",           "float64",  "the same task's share with all the tasks on one CPU; "
                                          "NaN without that run"),
        ("ideal_1",           "float64",  "its GPS share on one CPU"),
        ("speedup",           "float64",  "share_p / share_1"),
        ("ideal_speedup",     "float64",  "ideal_p / ideal_1 (min(n, P) for n equal CPU-bound "
                                          "tasks)"),
        ("speedup_ratio",     "float64",  "speedup / ideal_speedup: 1 is proportional"),
        ("share_c",           "float64",  "its share on one CPU with the first n/P tasks; NaN "
                                          "for a task not among them or without that run"),
        ("ideal_c",           "float64",  "its GPS share there"),
        ("concurrency_ratio", "float64",  "(share_p / share_c) / (ideal_p / ideal_c): 1 is "
                                          "proportional"),
    ])

#: every table declared here
ALL = STORED + (DOMAINS, CPUS, ANOMALIES, FOREIGN_LOAD, COUNTER_AGREEMENT, REQUESTS, WASTED,
                USELESS_MIGRATIONS, IDEAL, PROPORTIONAL)
