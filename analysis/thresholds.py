"""Every threshold policy inference uses, in one place, each with the reason for its value.

The policy card (:mod:`harmony.analysis.policy`) turns measured numbers into labels only through
these constants, and prints the ones it used beside each label, so a reader can see exactly which
line a number crossed. Rates are per CPU of the experiment's CPU set so that one threshold serves
any P. Values are set from the thesis's own results (chapters 6-7, 4-CPU Xeon, HZ=1000) and leave a
wide margin on each side of the behaviour they separate.
"""

#: Work conservation (E4): an idle CPU that pulls a task within this delay steals "at once". The
#: thesis measured ~1 ms for O(1) and < 1 ms for CFS; a periodic busy balance is >= tens of ms.
WORK_CONSERVING_MAX_S = 0.005

#: Affinity (E1 after balance, E6, E7): migrations per second per CPU once nothing needs moving.
#: Up to this rate affinity is "strong" (O(1): 0 after balance; CFS E1: 0 after the first 30).
AFFINITY_STRONG_MAX_PER_CPU_S = 1.0
#: From this rate on it is "weak": tasks are moved all the time (BFS: 163/s on 4 CPUs = 41/s/CPU;
#: CFS with an intrinsic imbalance: 23/s on 4 CPUs = 5.8/s/CPU is "moderate").
AFFINITY_WEAK_MIN_PER_CPU_S = 20.0

#: Affinity from E1: the rate after balance counts only if the queues settled within this fraction
#: of the run; a run that settles later (or never: a global queue keeps every queue in flux) has
#: shown no settled state, and its rate over the whole run is used instead.
SETTLED_BY_FRACTION = 0.5

#: How many (E2): a first-round move count "matches" a prediction when it is within this fraction
#: of the prediction (and at least 1 task), and is nearer to it than to the other prediction.
HOW_MANY_MATCH_FRACTION = 0.25
#: Below this difference between the poly-balance and pairwise predictions (tasks) a run cannot
#: tell them apart: on 2 CPUs both are x/2 by construction.
HOW_MANY_MIN_SEPARATION = 1.0

#: Time to a stable balance (E1, E3): up to this many seconds is "fast" (O(1): 250 ms, "within
#: seconds"); above, "slow" (CFS: ~9 s mean, 26 s worst). Counted to when the queues were
#: balanced and every later loss of balance was restored within this time again (a loss the run
#: ends inside, shorter than it, aside): a balancer that undoes an imbalance that fast is
#: balancing fast, not failing to hold a balance (harmony.analysis.metrics.settled_balance).
#: Measured here: after their first balance, EEVDF's runs leave it 1-3 times (6.18, 2 CPUs, 10
#: runs: 40-304 ms each) and 0-4 times (6.12 guests, 4 CPUs, 26 runs: 36-480 ms), moving a task
#: off a CPU where other processes ran a few ms and back; 6.1's CFS 0-1 times (8-324 ms).
#: Counted strictly (balanced to the end of the run), EEVDF's medians are 2.1 and 1.5 s, "slow",
#: and a run that ends inside such an excursion "never", for a scheduler that balanced in
#: 0.03-0.84 s every time.
FAST_BALANCE_MAX_S = 1.0

#: Detection (E5): a first migration this soon after the target's load is cut means the imbalance
#: is acted on when it happens ("event-driven"); later means a periodic check found it (the
#: thesis: medians 210-248 ms, maxima ~10 s).
EVENT_DRIVEN_MAX_MS = 5.0
#: ... and the period quoted: intervals 2 and 3 (the first balancing round to the second, the
#: second to the third) are two samples of the checks' period, which need not be one: the kernel
#: lengthens a domain's interval when a check finds nothing to do (balance_interval doubles up to
#: max_interval) and multiplies it by busy_factor on a busy CPU, so the thesis's CFS took 256 ms
#: for interval 2 and 64 ms for interval 3 (table 6.1, quoted as "64-256 ms"). Their medians this
#: many times apart, or more, are quoted as that range (one doubling is the smallest step between
#: two periods the kernel makes); closer, as one period (the median of both). One pooled median of
#: two modes described neither: this host's quick suite, medians 56 and 448 ms, read "~328 ms".
PERIOD_RANGE_MIN_RATIO = 2.0

#: Intrinsic imbalance (E6): every task within this fraction of its fair share = "fairness-first"
#: (BFS: all within 1%); the worst task below it while migrating no more than the strong-affinity
#: rate = "affinity-first" (O(1): 50% vs a fair 80%, ratio 0.63); anything else "in between".
FAIR_SHARE_MIN_RATIO = 0.90

#: Proportional speedup and concurrency (thesis 9.2; numbers beside the card's "balances" answer,
#: not a label's input): a task is served proportionally when its allocation on P CPUs reaches this
#: fraction of what the GPS ratio owes it (P times its 1-CPU allocation, within feasibility; or the
#: allocation it gets on one CPU with n/P tasks). The same bar as FAIR_SHARE_MIN_RATIO, and for the
#: same reason: a 1-CPU baseline shares one run queue by weight almost exactly (this host, 6.18:
#: its four tasks within 0.2 % of one another, 0.4 % under 1/4 for what other tasks took), so the
#: ratio is in effect the P-CPU share over the fair share; O(1)'s intrinsic imbalance left a task
#: 0.63 of its fair share, a global queue gives every task within 1-2 % (the global-queue and
#: poly-balance reference policies, 6 tasks on 4 CPUs: worst task 0.99 and 0.75). A balanced
#: 4-task run on this 2-CPU host: worst task 0.978, well above the bar.
PROPORTIONAL_MIN_RATIO = 0.90

#: Selection (E7/E9): "blind" when the short-term run-queue SMAPE exceeds the long-term one by more
#: than this (the first placement was not chosen and had to be repaired: CFS); "informed" when
#: they differ by at most this and targets mostly hold one heavy + one light (O(1)).
SELECTION_SMAPE_GAP = 0.10
#: ... "mostly": time-averaged fraction of CPUs holding exactly one heavy + one light task.
SELECTION_ONE_HEAVY_ONE_LIGHT_MIN = 0.50
#: Light duties above this make light tasks nearly heavy: which task moves no longer matters, so
#: those runs are not used for the selection label (the thesis: O(1) is fine below 60% light).
SELECTION_MAX_LIGHT_DUTY = 60.0

#: Priorities (E11): a spread index (0 = evenly over the CPUs, 1 = all on one CPU) up to this value
#: means "spread"; above, "clustered".
SPREAD_MAX_INDEX = 0.25

#: A run is evidence only if other tasks used at most this share of every CPU of its set
#: (manifest["foreign_load"]): foreign load changes what a balanced placement is. Harmony's own
#: controller threads (~1-3%) are counted apart and do not count here.
FOREIGN_LOAD_MAX = 0.05

#: A run captured in a virtual machine is evidence only if no vCPU's thread waited for a host CPU
#: more than this share of the run's window (manifest["vm"]["vcpu_wait_max"], read from the
#: threads' schedstat on the host). While a vCPU's thread waits, the guest's clock runs on and that
#: CPU runs nothing: to the guest's scheduler it is a CPU that lost that share of its time to
#: something it cannot see -- foreign load it cannot even count. Hence the limit of foreign load.
#: The same rule holds under single-threaded TCG (its one thread is what the host takes time
#: from) and under ``-icount``: the claim that a virtual clock does not pass while the thread
#: waits did not survive measurement (bench/fidelity.py, bench/README.md "which QEMU set-up": the
#: guest's clock ran 0.84-1.19x the host's, and a 50 % duty task's share from the trace came out
#: 27-30 points off, against 1-3 points under real-time TCG). Runs under icount are therefore
#: not evidence at all (trust note ``virtual_clock``; the card lists them as not used).
VCPU_WAIT_MAX = 0.05

#: The card's verdict on a question (:mod:`harmony.analysis.sequential`). Each run votes a label;
#: the share of runs that give label L is estimated with anytime-valid bounds (confidence
#: sequences: they hold at every number of runs at once), because ``--until-decided`` adds runs
#: until a question is decided and so stops when the runs happen to look decided: a fixed-n
#: interval checked after every run is wrong far more often than its level: a coin flip between
#: two labels, checked after each run from 2 to 20 with a one-sided Clopper-Pearson bound at the
#: same level, shows one label's share above one half at some point in 10.7 % of the sequences,
#: these bounds in 4.1 % (``python bench/sequential_rule.py``, exact). Why a confidence sequence
#: and not a group-sequential design or Wald's SPRT: the loop adds as many runs as could settle
#: the question before it looks again, so the looks are neither planned nor evenly spaced, and a
#: question has two to three labels, not two simple hypotheses; a confidence sequence needs no
#: plan, and the same bounds are the confidence the card prints.
#:
#: DECIDE_LEVEL: each verdict holds at this level. A decided label is wrong (its share at most
#: DECIDE_SHARE) with probability at most 1 - DECIDE_LEVEL over all the labels of the question
#: (the lower bound of each of its K labels is taken at (1 - DECIDE_LEVEL) / K); "varies" is wrong
#: (one label does have a share of VARIES_SHARE or more: at most one can) at most as often. A
#: question whose runs come from several configurations, its runs pooled undecided, is answered
#: by each configuration's own verdict (harmony.analysis.sequential.by_configuration: decided at
#: this level still, by an intersection-union test; "varies by configuration" at this level for
#: two configurations of a two-label question).
DECIDE_LEVEL = 0.95
#: A question is *decided* L when the lower bound of L's share exceeds this: L is what the policy
#: does in most runs. One half is the bar that makes the answer a statement about the policy
#: (more runs give L than every other label together), and the lowest a unanimous vote can pass
#: in few runs: to exclude a share of 1/2 at 5 % over 2 labels takes 6 runs that all agree (2^6
#: = 64 >= 2/0.05 = 40; no test can do it in fewer), 7 over 3 labels. A higher bar costs more
#: runs than a VM suite can spend: excluding 3/4 takes 13 agreeing runs, 9/10 takes 36.
DECIDE_SHARE = 0.5
#: A question *varies* when the upper bound of every label's share is below this: no label is
#: given by (nearly) every run. Not 1/2: a policy that flips a coin between two labels has shares
#: of 1/2 exactly, which no bound can ever exclude from "a majority" -- but it is soon shown not
#: to give either label in 95 % of its runs (an even split at 6 runs, 5 of 8 at 8). A policy between
#: the two (a label in 60-90 % of the runs) ends either way, and the card prints its share with
#: both bounds: "L, at least 55 % of the runs" and "varies: L in 70 %" say the same thing.
VARIES_SHARE = 0.95
#: The beta mixture (a, b) of the lower bound's confidence sequence: shares near 1, where a policy
#: that gives one label puts it (mean 10/11). With it a unanimous vote is decided at the fewest
#: runs the bound 2^n >= K / alpha allows (6 over 2 labels, 7 over 3), where a uniform mixture
#: needs 9; one dissenting run costs 5 more runs (10 of 11 are decided over 2 labels, 11 of 12
#: over 3).
DECIDE_PRIOR = (10.0, 1.0)
#: The mixture of the upper bound's: uniform, no share favoured (a split can be anywhere).
VARIES_PRIOR = (1.0, 1.0)
#: ``--until-decided``'s default cap on a configuration's runs (planned runs included;
#: ``--max-repeat``). From the quick suite's 2 runs, the exact operating characteristic (``python
#: bench/sequential_rule.py``; two labels, one run at a time): a policy that gives one label in
#: every run is decided at 6 runs (7 over 3 labels); at 20 runs a policy that gives its label in
#: 95 % of its runs is decided 99 % of the time, in 90 %: 91 %; a coin flip between two labels
#: varies 96 % of the time (a label 4 %, below the 5 % the level allows, undecided 0.3 %); the
#: hardest share, 80 %, still ends decided or varies 93 % of the time, every other at least 95 %.
#: At 16 runs the coin flip is left undecided 3 % of the time and the 80 % policy 20 %. The mean
#: runs a question takes is 6-11 at any share; a configuration never costs more than 10 times the
#: quick suite's 2 runs.
UNTIL_DECIDED_MAX_REPEAT = 20

#: Comparison (``harmony compare``): two sources' runs of one configuration differ "beyond noise"
#: on a metric when (1) each side has at least COMPARE_MIN_RUNS runs with a value, (2) the bootstrap
#: interval of the difference of their medians (COMPARE_LEVEL; :func:`harmony.analysis.stats.
#: bootstrap_diff_ci`) excludes 0, (3) the effect is large: |Cliff's delta| >= COMPARE_EFFECT_LARGE,
#: and (4) the difference is not negligible (COMPARE_MIN_RELATIVE).
#:
#: The effect size is Cliff's delta (P(B > A) - P(B < A) over all pairs of runs), not Hedges' g:
#: Harmony's metrics are counts, latencies and ratios with floors, ceilings and long tails (a
#: detection interval of 64 ms in most runs and 10 s in one), at 2-10 runs a side; delta uses only
#: the order of the runs, so it assumes no normal distribution, and one outlier run cannot swing
#: it, where g's pooled standard deviation would be dominated by that one run.
#:
#: COMPARE_MIN_RUNS: with fewer runs the percentile bootstrap of a median marks noise. Its interval
#: then only spans the differences the runs allow, and excludes 0 whenever the two sets do not
#: overlap, which happens by chance in 1/3 of the cases at 2 runs a side and 1/10 at 3 (exactly
#: 2/C(2n, n)); at 4 a side it still excludes 0 in 7-9.5% of the cases where nothing differs.
#: Measured on draws from one distribution (``python bench/compare_noise.py``: normal and
#: log-normal, 400-1000 trials at each size): the interval excludes 0 in 30-34% of the cases at
#: 2 runs a side, 7-12% at 3, 7-9.5% at 4, 2.7-3.5% at 5, 3.8-4.1% at 6, 3-4% at 8, 2.8-3.3% at 10.
#: 5 is the fewest that keeps within the interval's 5% -- and the full suite's repetitions
#: (``harmony.suite.REPEATS``). Fewer runs are still shown, with their interval, and said to be
#: too few, never marked.
COMPARE_MIN_RUNS = 5
#: The rule marks about this fraction of the metrics of two sources that do not differ at all (the
#: measured 2.7-4.1% at 5-10 runs a side above; 6 of 210 varying metric rows, 2.9%, between the six
#: pairs of four simulated quick suites of poly-balance with different seeds, 5 runs a side:
#: ``python bench/compare_noise.py --suites 4``). Every mark is a statement about its own
#: metric, so among many metrics a few are marked by chance: ``harmony compare`` says how many
#: to expect. (A family-wide correction cannot help at these run counts: with 5 runs a side the
#: smallest exact two-sided p-value is 2/252 = 0.008, above any Bonferroni level for 10 metrics.)
COMPARE_CHANCE_RATE = 0.03
#: The interval's confidence level.
COMPARE_LEVEL = 0.95
#: (4) of the rule: the difference of medians exceeds this fraction of the larger of the two. A
#: smaller shift is below anything the card turns on (its own thresholds lie 10% or more apart:
#: FAIR_SHARE_MIN_RATIO, SELECTION_SMAPE_GAP, HOW_MANY_MATCH_FRACTION) and below what the metrics
#: resolve; without it two deterministic simulations whose shares differ in the sixth digit (float
#: sums over different event orders) would "differ" with delta 1 and an interval of width 0.
COMPARE_MIN_RELATIVE = 0.01
#: |Cliff's delta| from which an effect is "large", "medium", "small" (below: "negligible"):
#: Romano et al. (2006)'s bounds, the values of delta that correspond to Cohen's d of 0.8, 0.5
#: and 0.2 between two normal distributions. "Large" (0.474) means about 74% of the pairs of runs
#: fall one way: a shift of the whole distribution, not of a tail.
COMPARE_EFFECT_LARGE = 0.474
COMPARE_EFFECT_MEDIUM = 0.33
COMPARE_EFFECT_SMALL = 0.147

#: Server requests (experiment server): a request "waited in a run queue" when its serving tasks
#: were runnable and not running for this long or longer while it was theirs. Shorter waits are
#: the wake-up path itself: in a thread-per-connection run on this 2-vCPU host (load 0.5) the
#: wake-up-to-run times formed a cluster at 0.3-2.4 us (the IPI, the idle exit) and the next
#: began at ~7 us, where another task held the CPU first.
RQ_WAIT_MIN_NS = 10_000

#: Server card, thread-per-connection and event-loop: the scheduler "keeps" a serving task where
#: it runs (its data's cache) up to this many migrations per task and second, "moves" it above
#: (the same line as AFFINITY_STRONG_MAX_PER_CPU_S: a move a second is rare next to a task that
#: wakes thousands of times a second; a 2-CPU EEVDF host moved them ~50 times a second).
SERVER_KEEPS_MAX_PER_TASK_S = 1.0
#: Server card, pool-per-stage: the pool is "spread" when Jain's index of its CPU time across the
#: CPUs is at least this: on 2 CPUs, the less used CPU then has a third of it or more (Jain 0.5:
#: all on one CPU; 1: even), on 4 CPUs the index of two busy CPUs and two idle is 0.5.
SERVER_SPREAD_MIN_JAIN = 0.9

#: Migration causes (harmony.analysis.causes): a pull by the destination CPU outside a softirq is
#: a new-idle balance when that CPU's next switch, within this delay, puts the pulling context to
#: sleep (or is the idle task's). The new-idle balance runs inside __schedule between the pick and
#: the switch, and gives up once its cost exceeds the CPU's expected idle time, which the kernel
#: caps at 2 * sysctl_sched_migration_cost = 1 ms (rq->max_idle_balance_cost); 2 ms adds the
#: switch itself and a preempted vCPU's slack. A task that moves another by sched_setaffinity and
#: blocks later than this is not taken for a new-idle pull.
NEWIDLE_SWITCH_WITHIN_NS = 2_000_000

#: Wasted cores (issue 29, after Lozi et al.): an interval during which a CPU of the set is idle
#: while a task allowed on it waits runnable on another CPU. Such intervals shorter than this are
#: the ordinary transient of a wake-up placed on a busy CPU before the idle one's next balance:
#: the kernel clears them at the idle CPU's next periodic balance, whose interval is its domain's
#: weight in ms (<= 8 ms for the <= 8-CPU sets used here), after the busy CPU's next tick kicks it
#: (4 ms at HZ=250, Debian's). Longer than 12 ms is an episode that outlived one whole balance
#: cycle: a missed balance. (Lozi et al. flag only conditions persisting for 100 ms: coarser.)
WASTED_EPISODE_MIN_S = 0.012
#: Useless migrations: a task moved from one CPU to another and back within this delay gained
#: nothing from the first move but a cold cache. Taken as one balance cycle, as above: a move the
#: next balance undoes was no decision the policy stood by.
USELESS_MIGRATION_WITHIN_S = 0.012

#: The kernel's per-domain counts of balance moves (/proc/schedstat: lb_gained, alb_pushed)
#: against every task's recorded moves of that cause (harmony.analysis.counters.
#: schedstat_agreement): the counts are of the same set_task_cpu calls, read at the start and the
#: end; moves inside a read's window and moves of unknown cause already widen the bound, so no
#: further slack is allowed: any difference beyond them is a move the trace lacks or tells wrong.
SCHEDSTAT_SLACK = 0

#: Predictions from the kernel's domains (harmony.analysis.predictions), each checked with a
#: tolerance reasoned here. A balance interval is counted in jiffies and runs from the timer
#: softirq: a domain due at jiffy j balances in the softirq of the tick that sees it due, on an
#: idle (tickless) CPU when the nohz balancer is kicked from a busy CPU's tick, a tick later at
#: worst: 2 jiffies past the predicted period. (Under TCG a vCPU's tick may come late too: a run
#: whose vCPUs waited is not evidence, VCPU_WAIT_MAX.)
PREDICTION_SLACK_TICKS = 2
#: ... a bound on the first check after a cut is an upper bound only; that the checks are not
#: much more frequent than predicted is shown across runs: the first checks are uniform over the
#: period P (the cut falls at a random time within it), so the largest of n runs' stays below
#: P / 4 with probability (1/4)^n: 0.4 % at 4 runs. The per-level card marks a period whose
#: runs all stay under this fraction of it as checked more often than predicted, from 4 runs.
PREDICTION_SCALE_FRACTION = 0.25
PREDICTION_SCALE_MIN_RUNS = 4
#: Wake-ups in the LLC: select_idle_sibling searches the LLC of the waker's or the previous CPU
#: and nothing else (fair.c, 6.1 and 6.12), so every wake-up move is in one of the two: no
#: exception is tolerated. A move the trace gets wrong (its waker's CPU) would be a probe fault
#: that the crosscheck and the causes' kernel counters report apart.
WAKE_LLC_MIN_FRACTION = 1.0
#: No level structure (sched_ext's default CPU selection): a policy blind to the machine's shape
#: moves tasks between CPU pairs in proportion to their number, a locality index of 1 at every
#: level. With m moves over k levels the share at a level with pair share s has a binomial
#: spread sqrt(s (1 - s) / m); at m >= 40 and s >= 1/8 (the smallest share among the levels of
#: the machines simulated here: 2-LLC and 2-node pairs of 8-64 CPUs) two standard deviations
#: are under 0.5 x s (0.46 at s = 1/8, m = 40), so a blind policy's index stays in 0.5-2 (the
#: upper end the same factor, reciprocally); the fair class's keeps moves in SMT and LLC pairs
#: several times their share (the hierarchical reference policy: above 4) and under a tenth of
#: the remote pairs' share. Fewer moves than LOCALITY_MIN_MOVES: not checked.
LOCALITY_FLAT_MIN = 0.5
LOCALITY_FLAT_MAX = 2.0
LOCALITY_MIN_MOVES = 40
#: imbalance_pct: the balancer compares the two groups' avg_load (their PELT load over their
#: capacity, update_sg_lb_stats), which the check derives from the task counts. A task's load
#: converges geometrically to its weight (half-life 32 x 1024 us); a warm release runs the tasks
#: WARM_S (0.25 s) before t0, which leaves each within 2^-(0.25 / 0.032768) = 0.504 % of it from
#: any start (experiments.base.WARM_S), so two groups' loads may be off in opposite directions
#: by that: the ratio within (1.00504 / 0.99496) - 1 = 1.02 %. The capacities are not assumed
#: equal: each CPU's is bounded from what the run's other tasks took of it
#: (predictions.pair_capacity; its SCHED_FIFO controller threads lower it through
#: scale_rt_capacity). A ratio whose range straddles imbalance_pct is not checkable: 8 tasks
#: against 7 is 114.3 %, 2.4 % under MC's 117, so 2.4 % of the busier CPU's time given to RT
#: threads decides it the other way.
IMBALANCE_PCT_LOAD_MARGIN = 0.0102
#: NUMA imbalance: the nodes' task counts after the NUMA level balanced a release on one node
#: are a count the rule decides exactly (harmony.analysis.predictions.numa_final_difference);
#: a task moving in or out at the end of the averaging window makes the time-averaged counts
#: round a task off: one task of slack.
NUMA_TASKS_SLACK = 1

ALL = {k: v for k, v in dict(globals()).items() if k.isupper()}
