"""The policy card: the nine questions of the thesis's Table 7.1, answered from stored runs.

Inference reads only the summary keys of the experiment contract (summary.json; each key named
below through :func:`harmony.experiments.summary_key`, so it is one its experiment declares) and
manifest facts (experiment, params, cpus, the kernel and scheduler, the tasks' scheduling classes
and the release: a run's *setup*, :func:`setup_of`). Each answer carries its label, the numbers
behind it, the thresholds (:mod:`harmony.analysis.thresholds`) it used and how far the runs agree.
The rules:

- every run gets its own label and the runs vote (:mod:`harmony.analysis.sequential`): the answer
  is *decided* when the anytime-valid lower bound of one label's share of the runs exceeds one
  half at 95 % (6 runs that agree, over two labels), *varies* when no label's share can reach
  95 % (its upper bound is below: the policy gives different labels in different runs, the
  split is the answer), else *undecided*: too few runs to tell. An undecided answer whose runs
  all agree shows their label (not decided: its confidence says how many more runs could
  decide it); one whose runs disagree is "undecided" (with the count of each label), never a
  guess. Every answer with votes carries that confidence (``Answer.confidence``), every median
  among its numbers its bootstrap interval (``Answer.intervals``);
- runs of several configurations (priority-classes at two nice differences: :func:`configurations`)
  also vote each configuration apart: where the runs pooled are undecided and every
  configuration's vote is settled, the answer is decided when they all decided one label, else
  "varies (by configuration: ...)" with each configuration's answer
  (:func:`harmony.analysis.sequential.by_configuration`);
- a run whose metric is None (not measurable in that run) gives no label and is counted apart;
- a question without evidence names the experiment that would answer it; a question the CPU count
  cannot answer says why (e.g. on 2 CPUs the poly-balance and pairwise predictions coincide).

- the card says which scheduling classes its runs' tasks were in when any was not SCHED_OTHER
  (the default, which is not said: such a card reads as it always did); runs of different
  classes or releases are different setups, and a card that pools them says so.

``infer(paths)`` returns a :class:`Card`; ``card.text()`` is what ``harmony infer`` prints and
``card.to_dict()`` its JSON.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import statistics
from pathlib import Path

from harmony import store
from harmony.analysis import policy_levels
from harmony.analysis import sequential
from harmony.analysis import thresholds as T
from harmony.analysis.causes import CAUSES
from harmony.analysis.stats import bootstrap_ci
from harmony.analysis.rounds import round_rule
from harmony.analysis.trust import disqualifying, word
from harmony.core.wording import plural
from harmony.experiments import experiment_of, get_experiment, summary_key
from harmony.workload.tasks import POLICIES, classes_text

UNDECIDED = "undecided"
#: the label of an answer whose runs split between labels, enough of them to tell (the split
#: follows in brackets: "varies (blind 6, informed 5 of 11 runs)")
VARIES = "varies"

# The summary keys the rules read, each checked at import against the declaration of every
# experiment it is read from: a key an experiment renames or drops fails here, not as None.
BALANCE_MIGRATIONS = summary_key("balance_migrations", "single-source")
BALANCED_AT_END = summary_key("balanced_at_end", "single-source", "time-to-resolve")
TIME_TO_BALANCE_S = summary_key("time_to_balance_s", "single-source", "time-to-resolve")
TIME_TO_SETTLE_S = summary_key("time_to_settle_s", "single-source", "time-to-resolve")
EXCURSIONS = summary_key("excursions", "single-source", "time-to-resolve")
LONGEST_EXCURSION_S = summary_key("longest_excursion_s", "single-source", "time-to-resolve")
MIGRATIONS = summary_key("migrations", "single-source")
MIGRATIONS_AFTER_BALANCE_PER_S = summary_key("migrations_after_balance_per_s", "single-source")
MIGRATIONS_PER_S = summary_key("migrations_per_s", "intrinsic-imbalance", "heavy-light")
X = summary_key("x", "how-many")
FIRST_ROUND_MOVED = summary_key("first_round_moved", "how-many")
POLY_PREDICTION = summary_key("poly_prediction", "how-many")
PAIRWISE_PREDICTION = summary_key("pairwise_prediction", "how-many")
TARGET_IDLE_AT_S = summary_key("target_idle_at_s", "work-conservation")
STEAL_LATENCY_S = summary_key("steal_latency_s", "work-conservation")
STOLEN = summary_key("stolen", "work-conservation")
INTERVAL1_MS = summary_key("interval1_ms", "detection")
INTERVAL2_MS = summary_key("interval2_ms", "detection")
INTERVAL3_MS = summary_key("interval3_ms", "detection")
SHARE_RATIO_MIN = summary_key("share_ratio_min", "intrinsic-imbalance")
SHARE_RATIO_MAX = summary_key("share_ratio_max", "intrinsic-imbalance")
JAIN_INDEX = summary_key("jain_index", "intrinsic-imbalance")
LIGHT_DUTY = summary_key("light_duty", "heavy-light")
SMAPE_SHORT = summary_key("smape_short", "heavy-light")
SMAPE_LONG = summary_key("smape_long", "heavy-light")
ONE_HEAVY_ONE_LIGHT_FRACTION = summary_key("one_heavy_one_light_fraction", "heavy-light")
HEAVY_SLOWDOWN_LONG = summary_key("heavy_slowdown_long", "heavy-light")
NICE_DIFF = summary_key("nice_diff", "priority-classes")
HIGH_SPREAD_INDEX = summary_key("high_spread_index", "priority-classes")
LOW_CLUSTER_INDEX = summary_key("low_cluster_index", "priority-classes")
HIGH_ALLOCATION_RATIO = summary_key("high_allocation_ratio", "priority-classes")
#: what the policy cost, every experiment's (harmony.experiments.base.COST_SUMMARY): numbers beside
#: the answers, never a label's input
CAUSE_KEYS = {c: summary_key(f"cause_{c}", "single-source") for c in CAUSES}
WASTED_CPU_S = summary_key("wasted_cpu_s", "work-conservation")
WASTED_EPISODES = summary_key("wasted_episodes", "work-conservation")
USELESS_MIGRATIONS = summary_key("useless_migrations", "single-source")
IDEAL_SHARE_ERROR = summary_key("ideal_share_error", "intrinsic-imbalance", "heavy-light")
IDEAL_JAIN = summary_key("ideal_jain", "intrinsic-imbalance")
IDEAL_SLOWDOWN_MAX = summary_key("ideal_slowdown_max", "heavy-light", "priority-classes")
ROUND_RULE = summary_key("round_rule", "how-many")
#: proportional speedup and concurrency (thesis 9.2): numbers beside the "balances" answer, by P
NTASKS = summary_key("ntasks", "proportional")
SPEEDUP_RATIO = summary_key("speedup_ratio", "proportional")
SPEEDUP_RATIO_MIN = summary_key("speedup_ratio_min", "proportional")
CONCURRENCY_RATIO = summary_key("concurrency_ratio", "proportional")
CONCURRENCY_RATIO_MIN = summary_key("concurrency_ratio_min", "proportional")

QUESTIONS = (
    ("balances", "Does the scheduler perform load balancing across processors?", "6.2"),
    ("affinity", "Does it contain mechanisms for maintaining affinity?", "6.2"),
    ("how_many", "How does the scheduler determine how many processes to migrate?", "6.3"),
    ("time_to_balance", "How long does the scheduler take to get to a stable balance?", "6.4"),
    ("work_conserving", "How long before an idle CPU detects an imbalance (work conservation)?",
     "6.4"),
    ("detection", "How long before a busy CPU detects an imbalance?", "6.4"),
    ("intrinsic", "When there is an intrinsic imbalance, how does the scheduler react?", "7.1"),
    ("selection", "With heavy vs light CPU tasks, how are processes chosen for migration?", "7.2"),
    ("priorities", "With high vs low priorities, how are processes spread?", "7.3"),
)

#: the labels each question's runs can vote (a label's kind: without the number it quotes): how
#: many there are sets the confidence of each (:func:`harmony.analysis.sequential.verdict`)
LABELS = {
    "balances": ("balances", "does not balance"),
    "affinity": ("strong", "moderate", "weak"),
    "how_many": ("poly-balance", "pairwise", "neither prediction"),
    "time_to_balance": ("fast", "slow", "never (within the run)"),
    "work_conserving": ("yes", "no"),
    "detection": ("event-driven", "periodic"),
    "intrinsic": ("fairness-first", "affinity-first", "in between"),
    "selection": ("blind", "informed"),
    "priorities": ("high spread", "high clustered"),
}


@dataclasses.dataclass
class Evidence:
    """One complete run: where it is, what it ran, what it measured."""

    path: Path
    experiment: str
    params: dict
    ncpus: int
    summary: dict
    setup: str = "?"     # the kernel and scheduler it ran under (:func:`setup_of`)
    classes: str = POLICIES["other"]  # its tasks' scheduling classes (:func:`classes_of`)

    @property
    def level(self) -> str:
        """The level it was placed at (harmony.experiments.placement), "" for a CPU set as
        given."""
        return policy_levels.level_of(self)


@dataclasses.dataclass
class Answer:
    """One question's answer. ``label`` is None when there is no evidence."""

    qid: str
    question: str
    thesis: str
    label: str | None = None
    numbers: dict = dataclasses.field(default_factory=dict)
    thresholds: dict = dataclasses.field(default_factory=dict)
    agreement: dict = dataclasses.field(default_factory=dict)  # label -> runs; "no_label": runs
    runs: list = dataclasses.field(default_factory=list)
    needs: str | None = None  # experiment(s) that would answer it
    why_not: str | None = None  # why the evidence at hand cannot answer it
    by_level: dict = dataclasses.field(default_factory=dict)  # level -> label (policy_levels)
    #: how sure the vote is (:meth:`harmony.analysis.sequential.Verdict.to_dict`: state, the
    #: leading label, its votes of the runs with a label, the bounds of its share, the runs that
    #: could settle it); None for an answer without votes (no evidence, or a reference's)
    confidence: dict | None = None
    #: a number's 95 % bootstrap interval of the median (name in ``numbers`` -> [low, high])
    intervals: dict = dataclasses.field(default_factory=dict)

    @property
    def state(self) -> str | None:
        """"decided", "varies" or "undecided" (:mod:`harmony.analysis.sequential`); an answer
        without votes (a reference's, one derived from another) is decided if it has a label;
        None without one."""
        if self.confidence is not None:
            return self.confidence["state"]
        if self.label is None:
            return None
        return sequential.UNDECIDED if self.label == UNDECIDED else sequential.DECIDED

    @property
    def decided(self) -> bool:
        """The label holds at the stated confidence (never for "varies" or "undecided")."""
        return self.label is not None and self.state == sequential.DECIDED

    @property
    def labelled(self) -> bool:
        """The answer names a label, decided or not yet (neither "undecided" nor "varies")."""
        return self.label is not None and self.label != UNDECIDED and not is_varies(self.label)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["runs"] = [str(p) for p in self.runs]
        d["decided"] = self.decided
        d["state"] = self.state
        return d


def is_varies(label: str | None) -> bool:
    """Whether ``label`` says the runs split (:data:`VARIES`)."""
    return label is not None and (label == VARIES or label.startswith(VARIES + " ("))


@dataclasses.dataclass
class Card:
    answers: list[Answer]
    runs: int
    experiments: dict  # name -> number of runs
    skipped: list  # (path, reason) of runs not used
    cpus: list  # distinct CPU counts of the runs
    setups: dict = dataclasses.field(default_factory=dict)  # setup_of -> runs
    classes: dict = dataclasses.field(default_factory=dict)  # classes_of -> runs
    #: the answers by level: {level: {qid: Answer}}, and the predictions' verdicts
    #: (harmony.analysis.policy_levels); empty for runs without levels
    levels: dict = dataclasses.field(default_factory=dict)
    predictions: list = dataclasses.field(default_factory=list)

    def answer(self, qid: str) -> Answer:
        return next(a for a in self.answers if a.qid == qid)

    def labels(self) -> dict:
        return {a.qid: a.label for a in self.answers}

    @property
    def other_classes(self) -> bool:
        """Some run's tasks were not all SCHED_OTHER: the card says which classes it describes."""
        return set(self.classes) - {POLICIES["other"]} != set()

    def to_dict(self) -> dict:
        out = {"runs": self.runs, "experiments": self.experiments, "cpus": self.cpus,
               "setups": self.setups,
               "skipped": [{"path": str(p), "reason": r} for p, r in self.skipped],
               "answers": [a.to_dict() for a in self.answers]}
        if self.other_classes:
            out["classes"] = self.classes
        if self.levels:
            out["levels"] = {lv: {q: a.to_dict() for q, a in answers.items()}
                             for lv, answers in self.levels.items()}
        if self.predictions:
            out["predictions"] = self.predictions
        return out

    def head_lines(self) -> list[str]:
        """What the card was made of: its runs, and the classes or setups they mix."""
        exps = ", ".join(f"{k} x{v}" for k, v in self.experiments.items()) or "none"
        out = [f"Policy card: {plural(self.runs, 'run')} on "
               f"{'/'.join(map(str, self.cpus)) or '?'} CPUs ({exps})"]
        if self.other_classes:
            out.append("tasks' scheduling class: " + "; ".join(
                f"{k} ({plural(v, 'run')})" for k, v in self.classes.items()))
        if len(self.setups) > 1:
            mixed = "; ".join(f"{k} ({plural(v, 'run')})"
                              for k, v in self.setups.items())
            out.append(f"POOLED: these runs come from {len(self.setups)} setups ({mixed}); one "
                       "card mixes their answers: `harmony compare` shows each apart")
        return out

    def text(self) -> str:
        out = self.head_lines() + [""]
        for i, a in enumerate(self.answers, 1):
            out.append(f"{i}. {a.question} (thesis {a.thesis})")
            out += ["   " + line for line in answer_lines(a)]
            out.append("")
        out += policy_levels.level_lines(self.levels, self.predictions, QUESTIONS)
        if self.skipped:
            out.append("runs not used:")
            out += [f"  {store.about(p, r)}" for p, r in self.skipped]
        return "\n".join(out).rstrip() + "\n"


#: the kinds of answer a card gives (:func:`answer_kind`), as a reader would name them
ANSWER_KINDS = {"answered": "answered", "varies": "varies from run to run",
                "undecided": "undecided: too few runs to tell",
                "none": "no evidence", "cannot": "cannot answer here"}


def answer_kind(a: Answer) -> str:
    """"answered" (decided), "varies", "undecided" (too few runs: a label every run agrees on
    but not yet decided, or runs that disagree), "none" (no run of the experiment that answers
    it) or "cannot" (the evidence at hand cannot answer it, e.g. on this CPU count)."""
    if a.why_not:
        return "cannot"
    if a.label is None:
        return "none"
    if a.state == sequential.VARIES:
        return "varies"
    return "answered" if a.decided else "undecided"


def answer_lines(a: Answer) -> list[str]:
    """The readable lines of one answer (label, agreement, numbers, thresholds, gaps)."""
    if a.label is None:
        lines = ["answer: no evidence"]
    else:
        lines = [f"answer: {a.label}" + (", not decided yet" if a.labelled and a.state ==
                                         sequential.UNDECIDED else "")]
    if a.agreement:
        agree = ", ".join(f"{k}: {v}" for k, v in a.agreement.items())
        lines.append(f"runs:   {agree}")
    if a.confidence is not None:
        lines.append(f"confidence: {confidence_text(a)}")
    if a.numbers:
        lines.append("numbers: " + "; ".join(f"{k} = {format_value(v)}{interval_text(a, k)}"
                                             for k, v in a.numbers.items()))
    if a.thresholds:
        lines.append("thresholds: " + "; ".join(f"{k} = {v}" for k, v in a.thresholds.items()))
    if a.why_not:
        lines.append(f"cannot answer: {a.why_not}")
    if a.needs:
        lines.append(f"would be answered by: {a.needs}")
    if a.by_level:
        lines.append("by level: " + "; ".join(f"{lv}: {lab}" for lv, lab in a.by_level.items()))
    return lines


def confidence_text(a: Answer) -> str:
    """The answer's confidence in one line (:meth:`harmony.analysis.sequential.Verdict.text`),
    naming the experiment it comes from when it is one of several (affinity)."""
    c = a.confidence
    src = f" ({c['from']})" if c.get("from") else ""
    if c.get("path") == sequential.PER_CONFIGURATION:
        pooled = f"{c['label']} in {c['votes']} of {c['runs']} runs pooled, undecided"
        each = "; ".join(f"{name}: {_verdict(v).text()}"
                         for name, v in c["configurations"].items())
        return f"{per_configuration_head(c)} ({pooled}){src}: {each}"
    return _verdict(c).text() + src


def per_configuration_head(c: dict) -> str:
    """A confidence answered by each configuration's own vote, in a few words: decided in each,
    or varies by configuration."""
    if c["state"] == sequential.DECIDED:
        return (f"decided at {T.DECIDE_LEVEL:.0%} in each of its {len(c['configurations'])} "
                "configurations")
    return f"varies at {T.DECIDE_LEVEL:.0%} by configuration"


def _verdict(c: dict) -> sequential.Verdict:
    return sequential.Verdict(**{k: c[k] for k in ("state", "label", "votes", "runs", "lower",
                                                    "upper", "labels", "more", "split")})


def interval_text(a: Answer, name: str) -> str:
    """" [95% CI low .. high]" of a median among the numbers, "" where it has none."""
    ci = a.intervals.get(name)
    if not ci or ci[0] is None:
        return ""
    return f" [95% CI {format_value(ci[0])} .. {format_value(ci[1])}]"


def format_value(v) -> str:
    """A value as the card prints it: 4 significant digits, lists and dicts item by item."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {format_value(x)}" for k, x in v.items()) + "}"
    return str(v)


# ------------------------------------------------------------------------------------ collection

def find_runs(paths) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Run directories under ``paths`` (runs, batch dirs, suite dirs), and those not usable.

    A directory holding manifest.json is a run; its ``static/`` companion is part of it and is
    not a run of its own. Other directories are searched. Raises RunError for a path that does not
    exist.
    """
    found, skipped = [], []
    for p in map(Path, paths):
        if not p.is_dir():
            raise store.missing_dir(p)
        stack = [p]
        while stack:
            d = stack.pop()
            if (d / "manifest.json").is_file():
                found.append(d)
                continue
            stack += sorted((c for c in d.iterdir() if c.is_dir() and not c.name.startswith(".")),
                            reverse=True)
    return found, skipped


def collect(paths) -> tuple[list[Evidence], list[tuple[Path, str]]]:
    """Evidence from every complete run under ``paths``; incomplete or unreadable runs are
    listed."""
    dirs, skipped = find_runs(paths)
    out = []
    for d in dirs:
        try:
            run = store.open_run(d)
            summary = run.summary
            experiment_of(run)      # a run of this catalog's (of another Harmony's: not used)
        except store.RunError as exc:
            skipped.append((d, str(exc).replace(f"{d}: ", "")))
            continue
        m = run.manifest
        unfit = disqualifying(m)    # a busy host, starved vCPUs, a virtual clock
        if unfit:
            skipped.append((d, word(unfit)))
            continue
        out.append(Evidence(d, m["experiment"], m.get("params", {}), len(m.get("cpus", [])),
                            summary, setup_of(m), classes_of(m)))
    return out, skipped


def setup_of(manifest: dict) -> str:
    """What a run's policy was measured on, from its manifest: "<kernel>, <scheduler>" (the
    scheduler is an enabled sched_ext scheduler's name, or a simulated run's reference policy);
    then, where they are not the default, the tasks' scheduling classes ("tasks SCHED_FIFO 5",
    :func:`classes_of`) and a cold release (runs recorded before the choice were cold); the CPU
    count is the card's apart."""
    host = manifest.get("under_test") or manifest.get("host") or {}   # a VM's kernel under test
    parts = [host.get("kernel") or "?", host.get("scheduler") or "?"]
    cls = classes_text(manifest.get("sched_classes"))
    if cls:
        parts.append(f"tasks {cls}")
    if (manifest.get("params") or {}).get("release", "cold") == "cold" \
            and "imported" not in (manifest.get("source") or {}):
        parts.append("cold release")
    return ", ".join(parts)


def classes_of(manifest: dict) -> str:
    """A run's tasks' scheduling classes in a few words
    (:func:`harmony.workload.tasks.classes_text`); SCHED_OTHER for a run whose tasks all were, or
    that predates the classes."""
    return classes_text(manifest.get("sched_classes")) or POLICIES["other"]


# ------------------------------------------------------------------------------------------ rules

def _vote(per_run: list[tuple[Evidence, str | None]], a: Answer) -> None:
    """Set ``a.label``, ``a.agreement`` and ``a.confidence`` from each run's label (see the
    module's docstring: decided, varies, or undecided, showing the runs' label when they all
    agree). Runs of more than one configuration (:func:`configurations`) also vote each
    configuration apart, recorded in the confidence (``configurations``); where the runs pooled
    are undecided and every configuration's vote is settled, those answer
    (:func:`harmony.analysis.sequential.by_configuration`; ``path`` says which did)."""
    counts = dict(collections.Counter(lab if lab is not None else "no_label"
                                      for _, lab in per_run))
    a.agreement = counts
    a.runs = [e.path for e, _ in per_run]
    votes = {k: v for k, v in counts.items() if k != "no_label"}
    if not votes:
        a.label = None
        return
    k = len(LABELS[a.qid])
    v = sequential.verdict(votes, k)
    configs = {name: sequential.verdict(dict(collections.Counter(labels)), k)
               for name, labels in configurations(per_run).items()}
    state, path = sequential.by_configuration(v, configs)
    a.confidence = v.to_dict() | {"path": path}
    if len(configs) > 1:
        a.confidence["configurations"] = {name: c.to_dict() for name, c in configs.items()}
    if path == sequential.PER_CONFIGURATION:
        a.confidence |= {"state": state, "more": 0}
        if state == sequential.DECIDED:
            a.label = next(iter(configs.values())).label
        else:
            a.label = f"{VARIES} (by configuration: {_by_configuration_text(configs)})"
    elif v.state == sequential.DECIDED or (v.state == sequential.UNDECIDED and len(votes) == 1):
        a.label = v.label
    elif v.state == sequential.VARIES:
        split = ", ".join(f"{k} {n}" for k, n in v.split.items())
        a.label = f"{VARIES} ({split} of {v.runs} runs)"
    else:
        a.label = UNDECIDED


def _by_configuration_text(configs: dict[str, sequential.Verdict]) -> str:
    """Each configuration's answer in a few words: "nice_diff=15: high spread 6/6; nice_diff=4:
    varies, high clustered 4/8"."""
    return "; ".join(f"{name}: {'varies, ' if c.state == sequential.VARIES else ''}"
                     f"{c.label} {c.votes}/{c.runs}" for name, c in configs.items())


def configurations(per_run: list[tuple[Evidence, str | None]]) -> dict[str, list[str]]:
    """The labels of the runs that gave one, by configuration: a run's experiment and parameters
    (:func:`configuration_of`), named by what sets it apart from the others ("nice_diff=4"; the
    experiment too when they differ: "single-source", "time-to-resolve"), in the order of their
    first run. One configuration is named ""."""
    groups: dict[tuple, list[str]] = {}
    for e, lab in per_run:
        if lab is not None:
            groups.setdefault(configuration_of(e), []).append(lab)
    if len(groups) < 2:
        return {"": labels for labels in groups.values()}
    experiments = len({key[0] for key in groups}) > 1
    names = {}
    for key in groups:
        params = [dict(other[1]) for other in groups if other[0] == key[0]]
        differ = [k for k in dict.fromkeys(k for p in params for k in p)
                  if len({p.get(k) for p in params}) > 1]
        words = ([key[0]] if experiments else []) + [f"{k}={dict(key[1]).get(k)}" for k in differ]
        names[key] = " ".join(words)
    return {names[key]: labels for key, labels in groups.items()}


def _param_text(v) -> str:
    """A parameter's value as ``-p`` takes it (a list as "8,0,0,0")."""
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def configuration_of(e: Evidence) -> tuple:
    """The configuration a run is one of: its experiment and its parameters, less those drawn
    for each run from its seed (:meth:`harmony.experiments.base.Experiment.draw`: detection's
    cut time, work conservation's idle time), which differ from run to run of one
    configuration. What ``harmony suite`` makes one batch of (a directory), and
    ``--until-decided`` grows until its own vote is settled."""
    drawn = drawn_params(e.experiment, e.ncpus)
    return (e.experiment, tuple(sorted((k, _param_text(v)) for k, v in (e.params or {}).items()
                                       if k not in drawn)))


@functools.cache
def drawn_params(experiment: str, ncpus: int) -> frozenset:
    """The parameters ``experiment`` draws anew for each run from its seed
    (:meth:`harmony.experiments.base.Experiment.draw`: detection's cut time, work conservation's
    idle time): they differ between any two runs of one configuration. None for an experiment the
    catalog does not know, or whose defaults are not valid on ``ncpus`` CPUs (nothing to draw
    from)."""
    try:
        exp, cpus = get_experiment(experiment), list(range(ncpus))
        return frozenset(exp.draw(exp.resolve({}, cpus), cpus, 0))
    except ValueError:
        return frozenset()


def _values(evs: list[Evidence], key: str) -> list:
    return [e.summary.get(key) for e in evs if e.summary.get(key) is not None]


def _median(values):
    return statistics.median(values) if values else None


def _medians(a: Answer, named: dict) -> dict:
    """{name: the median of its values} of ``named`` (name -> the runs' values), each median's
    95 % bootstrap interval recorded in ``a.intervals`` (two values or more)."""
    out = {}
    for name, values in named.items():
        out[name] = _median(values)
        if len(values) >= 2:
            a.intervals[name] = list(bootstrap_ci(values))
    return out


def _causes(runs: list[Evidence]) -> str:
    """The runs' migrations by cause, each cause's median over the runs (those above 0)."""
    med = {c: _median(_values(runs, k)) for c, k in CAUSE_KEYS.items()}
    return ", ".join(f"{c} {v:g}" for c, v in med.items() if v) or "none"


def _per_cpu(e: Evidence, key: str):
    v = e.summary.get(key)
    return None if v is None or not e.ncpus else float(v) / e.ncpus


def _after_balance_rate(e: Evidence, key: str):
    """Migration rate per CPU once balanced; for a run that never settled (a global queue keeps
    every queue in flux) the rate over the whole run, since nothing ever stopped moving."""
    rate = _per_cpu(e, key)
    if key != MIGRATIONS_AFTER_BALANCE_PER_S:
        return rate
    dur, settled = e.params.get("duration"), e.summary.get(TIME_TO_BALANCE_S)
    if settled is not None and dur and settled <= T.SETTLED_BY_FRACTION * dur:
        return rate
    if dur and e.ncpus and e.summary.get(MIGRATIONS) is not None:
        return e.summary[MIGRATIONS] / dur / e.ncpus
    return rate


def _affinity_label(rate_per_cpu: float | None) -> str | None:
    if rate_per_cpu is None:
        return None
    if rate_per_cpu <= T.AFFINITY_STRONG_MAX_PER_CPU_S:
        return "strong"
    if rate_per_cpu >= T.AFFINITY_WEAK_MIN_PER_CPU_S:
        return "weak"
    return "moderate"


def proportional_word(worst_ratio: float | None) -> str | None:
    """"proportional" when the worst task's ratio to its ideal (speedup or concurrency) reaches
    PROPORTIONAL_MIN_RATIO, else "not proportional"; None without the number."""
    if worst_ratio is None:
        return None
    return "proportional" if worst_ratio >= T.PROPORTIONAL_MIN_RATIO else "not proportional"


def proportional_numbers(runs: list[Evidence]) -> dict:
    """The proportional experiment's runs by CPU count and task count ("P=2 n=4"): the median
    speedup and concurrency ratios to the GPS ideal, the worst task's, and the word
    :func:`proportional_word` gives the median worst task; {} without runs."""
    out = {}
    groups: dict[tuple, list[Evidence]] = {}
    for e in runs:
        groups.setdefault((e.ncpus, e.summary.get(NTASKS)), []).append(e)
    for (ncpus, n), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        parts = []
        for what, key, worst in (("speedup", SPEEDUP_RATIO, SPEEDUP_RATIO_MIN),
                                 ("concurrency", CONCURRENCY_RATIO, CONCURRENCY_RATIO_MIN)):
            med, low = _median(_values(group, key)), _median(_values(group, worst))
            parts.append(f"{what} {format_value(med)} (worst task {format_value(low)}: "
                         f"{proportional_word(low) or 'not measured'})" if med is not None
                         else f"{what} not measured")
        out[f"P={ncpus} n={n} ({plural(len(group), 'run')})"] = \
            "; ".join(parts)
    return out


def q_balances(ev, prior) -> Answer:
    a = _new("balances")
    runs = ev.get("single-source", [])
    prop = proportional_numbers(ev.get("proportional", []))
    if prop:    # numbers beside the answer, never its input: shown with or without E1's runs
        a.numbers["proportional speedup, concurrency / GPS ideal by P (9.2)"] = prop
        a.thresholds["PROPORTIONAL_MIN_RATIO"] = T.PROPORTIONAL_MIN_RATIO
    if not runs:
        a.needs = "single-source (E1)"
        return a
    per = []
    for e in runs:
        s = e.summary
        moved = s.get(BALANCE_MIGRATIONS)
        per.append((e, None if moved is None else "balances" if moved > 0 else "does not balance"))
    _vote(per, a)
    medians = _medians(a, {f"{key} (median)": _values(runs, key)
                           for key in (BALANCE_MIGRATIONS, USELESS_MIGRATIONS)})
    a.numbers = {f"{BALANCE_MIGRATIONS} (median)": medians[f"{BALANCE_MIGRATIONS} (median)"],
                 f"{BALANCED_AT_END} (runs)": sum(bool(e.summary.get(BALANCED_AT_END))
                                                  for e in runs),
                 "migrations by cause (median)": _causes(runs),
                 f"{USELESS_MIGRATIONS} (median)": medians[f"{USELESS_MIGRATIONS} (median)"],
                 **a.numbers}
    a.thresholds = {"rule": "a run balances if tasks moved off the source while runnable",
                    **a.thresholds}
    return a


#: where each experiment reports its migration rate once nothing needs to move
AFFINITY_SOURCES = (("single-source", MIGRATIONS_AFTER_BALANCE_PER_S),
                    ("intrinsic-imbalance", MIGRATIONS_PER_S),
                    ("heavy-light", MIGRATIONS_PER_S))
_RANK = {"weak": 0, "moderate": 1, "strong": 2}


def q_affinity(ev, prior) -> Answer:
    """Weakest affinity any experiment shows, each experiment's runs voting apart: decided when
    an experiment decided "weak" (nothing weaker exists) or every experiment decided; varies
    when one varies (and none decided "weak"); else undecided, showing the weakest label when
    each experiment's runs agree. The confidence is that of the experiment the answer comes
    from (the one with the weakest label, or the one that varies or is undecided)."""
    a = _new("affinity")
    a.thresholds = {"AFFINITY_STRONG_MAX_PER_CPU_S": T.AFFINITY_STRONG_MAX_PER_CPU_S,
                    "AFFINITY_WEAK_MIN_PER_CPU_S": T.AFFINITY_WEAK_MIN_PER_CPU_S,
                    "SETTLED_BY_FRACTION": T.SETTLED_BY_FRACTION}
    subs, all_per = {}, []
    for exp, key in AFFINITY_SOURCES:
        runs = ev.get(exp, [])
        if not runs:
            continue
        per = [(e, _affinity_label(_after_balance_rate(e, key))) for e in runs]
        sub = _new("affinity")
        _vote(per, sub)
        if sub.label is not None:
            subs[exp] = sub
        all_per += per
        rates = [r for r in (_after_balance_rate(e, key) for e in runs) if r is not None]
        a.numbers |= _medians(a, {f"{exp} {key} per CPU (median)": rates})
    if not all_per:
        a.needs = "single-source (E1), intrinsic-imbalance (E6) or heavy-light (E7)"
        return a
    a.agreement = {exp: sub.label for exp, sub in subs.items()}
    a.runs = [e.path for e, _ in all_per]
    if not subs:
        a.why_not = "no run could measure a migration rate after balance"
        return a
    _weakest(a, subs)
    return a


def _weakest(a: Answer, subs: dict[str, Answer]) -> None:
    """Affinity's label and confidence from its experiments' answers (see :func:`q_affinity`)."""
    def take(source: str, label: str) -> None:
        a.label = label
        a.confidence = dict(subs[source].confidence, **{"from": source})

    # nothing is weaker than weak: an experiment whose runs say so settles the label (decided
    # if that experiment is), whatever the others' runs say
    weak = sorted((exp for exp, sub in subs.items() if sub.label == "weak"),
                  key=lambda exp: not subs[exp].decided)
    varies = [exp for exp, sub in subs.items() if sub.state == sequential.VARIES]
    split = [exp for exp, sub in subs.items() if sub.label == UNDECIDED]
    if weak or varies or split:
        source = (weak or varies or split)[0]
        take(source, subs[source].label)
        return
    # every experiment names a label: the weakest, as decided as the least decided of them
    weakest = min(subs, key=lambda exp: (_RANK[subs[exp].label], subs[exp].decided))
    open_ = [exp for exp, sub in subs.items() if not sub.decided]
    take(open_[0] if open_ and subs[weakest].decided else weakest, subs[weakest].label)


def _how_many_label(e: Evidence) -> str | None:
    s = e.summary
    moved, poly, pair = s.get(FIRST_ROUND_MOVED), s.get(POLY_PREDICTION), s.get(PAIRWISE_PREDICTION)
    if moved is None or poly is None or pair is None:
        return None
    if abs(poly - pair) < T.HOW_MANY_MIN_SEPARATION:
        return None
    if abs(moved - poly) == abs(moved - pair):
        return "neither prediction"   # as near to one as to the other: nearer to neither
    best, pred = min((("poly-balance", poly), ("pairwise", pair)),
                     key=lambda kv: abs(moved - kv[1]))
    tol = max(1.0, T.HOW_MANY_MATCH_FRACTION * abs(pred))
    return best if abs(moved - pred) <= tol else "neither prediction"


def q_how_many(ev, prior) -> Answer:
    a = _new("how_many")
    a.thresholds = {"HOW_MANY_MATCH_FRACTION": T.HOW_MANY_MATCH_FRACTION,
                    "HOW_MANY_MIN_SEPARATION": T.HOW_MANY_MIN_SEPARATION,
                    "global queue when affinity is": "weak"}
    aff = prior.get("affinity")
    runs = ev.get("how-many", [])
    if aff is not None and aff.label == "weak":   # decided as far as affinity is
        a.label = "global-queue"
        a.numbers = {"affinity": "weak: tasks migrate constantly even when balanced"}
        a.runs = aff.runs
        a.agreement = dict(aff.agreement)
        a.confidence = aff.confidence
        if runs:
            a.numbers |= _medians(a, {f"{FIRST_ROUND_MOVED} (median)":
                                      _values(runs, FIRST_ROUND_MOVED)})
        return a
    if not runs:
        a.needs = "how-many (E2)"
        return a
    per = [(e, _how_many_label(e)) for e in runs]
    _vote(per, a)
    a.numbers = {key: [e.summary.get(key) for e in runs]
                 for key in (X, FIRST_ROUND_MOVED, POLY_PREDICTION, PAIRWISE_PREDICTION)}
    a.numbers["migrations by cause (median)"] = _causes(runs)
    a.numbers["rounds counted from"] = _round_rules(runs)
    if a.label is None:
        same = [e for e in runs if e.summary.get(POLY_PREDICTION) is not None
                and e.summary.get(PAIRWISE_PREDICTION) is not None
                and abs(e.summary[POLY_PREDICTION] - e.summary[PAIRWISE_PREDICTION])
                < T.HOW_MANY_MIN_SEPARATION]
        if same:
            a.why_not = (f"on {same[0].ncpus} CPUs the poly-balance and pairwise predictions are "
                         "the same number of tasks (x/2 on 2 CPUs), so the first round cannot tell "
                         "them apart; needs 3 or more CPUs")
        else:
            a.why_not = "no run saw a first balancing round"
    return a


def _round_rules(runs: list[Evidence]) -> str:
    """Which migrations the runs' rounds counted (how-many's round_rule, in words), with the
    number of runs of each rule: by cause (periodic and active) or every move of a runnable task
    (the causes unknown); a run analysed before the rule was recorded counted the latter."""
    rules = collections.Counter(e.summary.get(ROUND_RULE) or "runnable" for e in runs)
    return "; ".join(f"{round_rule(r != 'runnable')['text']} ({plural(n, 'run')})"
                     for r, n in rules.items())


def _global_queue(a: Answer, prior) -> bool:
    """Table 7.1: under a global queue the question is irrelevant; say so instead of a label."""
    hm = prior.get("how_many")
    if hm is None or hm.label != "global-queue":
        return False
    a.label = "not applicable (global queue)"
    a.confidence = hm.confidence     # as sure as the global queue is
    a.numbers = {"why": "one queue for all CPUs: every CPU takes the next task whenever it "
                        "schedules, so there is no per-CPU balance to reach or detect"}
    return True


def q_time_to_balance(ev, prior) -> Answer:
    a = _new("time_to_balance")
    a.thresholds = {"FAST_BALANCE_MAX_S": T.FAST_BALANCE_MAX_S}
    if _global_queue(a, prior):
        return a
    runs = ev.get("time-to-resolve", []) + ev.get("single-source", [])
    if not runs:
        a.needs = "time-to-resolve (E3) or single-source (E1)"
        return a

    def settled(e):
        """The run's time to balance: settled (every later loss of balance restored within
        FAST_BALANCE_MAX_S); for a run analysed before that was measured, balanced to the end."""
        return e.summary.get(TIME_TO_SETTLE_S if TIME_TO_SETTLE_S in e.summary
                             else TIME_TO_BALANCE_S)

    def label(e):
        t = settled(e)
        if t is None:
            ended = TIME_TO_SETTLE_S in e.summary or e.summary.get(BALANCED_AT_END) is False
            return "never (within the run)" if ended else None
        return "fast" if t <= T.FAST_BALANCE_MAX_S else "slow"

    _vote([(e, label(e)) for e in runs], a)
    times = [t for t in map(settled, runs) if t is not None]
    strict = _values(runs, TIME_TO_BALANCE_S)
    # runs that lost balance after their first and restored it fast every time
    lost = [e for e in runs if settled(e) is not None and e.summary.get(EXCURSIONS)
            and (e.summary.get(LONGEST_EXCURSION_S) or 0.0) < T.FAST_BALANCE_MAX_S]
    longest = _values(runs, LONGEST_EXCURSION_S)
    a.numbers = {**_medians(a, {f"{TIME_TO_SETTLE_S} (median)": times}),
                 "max": max(times) if times else None,
                 **_medians(a, {f"{TIME_TO_BALANCE_S}, balanced to the end (median)": strict}),
                 "runs that lost balance again briefly": len(lost),
                 f"{LONGEST_EXCURSION_S} (max)": max(longest) if longest else None,
                 "runs never balanced for good": sum(label(e) == "never (within the run)"
                                                     for e in runs)}
    if a.label in ("fast", "slow") and times:
        a.label += f" (~{_median(times) * 1000:.0f} ms" + (
            f"; lost again briefly in {len(lost)} of {len(runs)} runs)" if lost else ")")
    return a


def q_work_conserving(ev, prior) -> Answer:
    a = _new("work_conserving")
    a.thresholds = {"WORK_CONSERVING_MAX_S": T.WORK_CONSERVING_MAX_S}
    runs = ev.get("work-conservation", [])
    if not runs:
        a.needs = "work-conservation (E4)"
        return a

    def label(e):
        s = e.summary
        if s.get(TARGET_IDLE_AT_S) is None:
            return None  # the target never went idle: nothing to steal for
        lat = s.get(STEAL_LATENCY_S)
        return "yes" if lat is not None and lat <= T.WORK_CONSERVING_MAX_S else "no"

    _vote([(e, label(e)) for e in runs], a)
    lat = _values(runs, STEAL_LATENCY_S)
    a.numbers = {**_medians(a, {"steal_latency_ms (median)": [v * 1000 for v in lat]}),
                 "max_ms": None if not lat else max(lat) * 1000,
                 "runs never stolen": sum(not e.summary.get(STOLEN) for e in runs),
                 **_medians(a, {f"{WASTED_CPU_S} (median)": _values(runs, WASTED_CPU_S),
                                f"{WASTED_EPISODES} (median)": _values(runs, WASTED_EPISODES)})}
    return a


def q_detection(ev, prior) -> Answer:
    """Each run votes event-driven (its first migration after the cut came within
    EVENT_DRIVEN_MAX_MS) or periodic (later). A few early runs do not make a periodic check
    event-driven: a check that happens to fall just after the cut is expected in about
    EVENT_DRIVEN_MAX_MS / period of the runs, a share the vote's majority rule
    (:mod:`harmony.analysis.sequential`) leaves periodic once there are runs enough."""
    a = _new("detection")
    a.thresholds = {"EVENT_DRIVEN_MAX_MS": T.EVENT_DRIVEN_MAX_MS,
                    "PERIOD_RANGE_MIN_RATIO": T.PERIOD_RANGE_MIN_RATIO,
                    "rule": "a run is event-driven if interval1 <= threshold, else periodic"}
    if _global_queue(a, prior):
        return a
    runs = ev.get("detection", [])
    if not runs:
        a.needs = "detection (E5)"
        return a
    i1, i2, i3 = (_values(runs, k) for k in (INTERVAL1_MS, INTERVAL2_MS, INTERVAL3_MS))

    def label(e):
        v = e.summary.get(INTERVAL1_MS)
        return None if v is None else "event-driven" if v <= T.EVENT_DRIVEN_MAX_MS else "periodic"

    _vote([(e, label(e)) for e in runs], a)
    a.agreement = {f"interval1 <= {T.EVENT_DRIVEN_MAX_MS:g} ms":
                       sum(v <= T.EVENT_DRIVEN_MAX_MS for v in i1),
                   f"interval1 > {T.EVENT_DRIVEN_MAX_MS:g} ms":
                       sum(v > T.EVENT_DRIVEN_MAX_MS for v in i1),
                   "no_label": len(runs) - len(i1)}
    a.numbers = {**_medians(a, {f"{INTERVAL1_MS} median": i1}),
                 f"{INTERVAL1_MS} max": max(i1) if i1 else None,
                 **_medians(a, {f"{INTERVAL2_MS} median": i2, f"{INTERVAL3_MS} median": i3})}
    if not i1:
        a.why_not = "no run saw a migration after the cut"
        return a
    if a.label == "periodic":
        late = [v for v in i1 if v > T.EVENT_DRIVEN_MAX_MS]
        period = _period(i2, i3)
        a.label = (f"periodic ({period} between checks)" if period else
                   f"periodic (first check ~{_median(late):.0f} ms after the cut, median)")
    return a


def _period(i2: list[float], i3: list[float]) -> str | None:
    """The checks' period the later intervals show (those over EVENT_DRIVEN_MAX_MS): "~64 ms", or
    "56-448 ms" when intervals 2 and 3 have medians PERIOD_RANGE_MIN_RATIO apart or more (see
    there); None when no later interval is over the threshold."""
    later2, later3 = ([v for v in i if v > T.EVENT_DRIVEN_MAX_MS] for i in (i2, i3))
    if later2 and later3:
        lo, hi = sorted((_median(later2), _median(later3)))
        if hi >= T.PERIOD_RANGE_MIN_RATIO * lo:
            return f"{lo:.0f}-{hi:.0f} ms"
    return f"~{_median(later2 + later3):.0f} ms" if later2 or later3 else None


def q_intrinsic(ev, prior) -> Answer:
    a = _new("intrinsic")
    a.thresholds = {"FAIR_SHARE_MIN_RATIO": T.FAIR_SHARE_MIN_RATIO,
                    "AFFINITY_STRONG_MAX_PER_CPU_S": T.AFFINITY_STRONG_MAX_PER_CPU_S}
    runs = ev.get("intrinsic-imbalance", [])
    if not runs:
        a.needs = "intrinsic-imbalance (E6)"
        return a

    def label(e):
        lo, rate = e.summary.get(SHARE_RATIO_MIN), _per_cpu(e, MIGRATIONS_PER_S)
        if lo is None:
            return None
        if lo >= T.FAIR_SHARE_MIN_RATIO:
            return "fairness-first"
        if rate is not None and rate <= T.AFFINITY_STRONG_MAX_PER_CPU_S:
            return "affinity-first"
        return "in between"

    _vote([(e, label(e)) for e in runs], a)
    a.numbers = _medians(a, {f"{key} (median)": _values(runs, key)
                             for key in (SHARE_RATIO_MIN, SHARE_RATIO_MAX, JAIN_INDEX,
                                         IDEAL_SHARE_ERROR, IDEAL_JAIN)})
    a.numbers |= _medians(a, {f"{MIGRATIONS_PER_S} per CPU (median)": [
        r for r in (_per_cpu(e, MIGRATIONS_PER_S) for e in runs) if r is not None]})
    return a


def q_selection(ev, prior) -> Answer:
    a = _new("selection")
    a.thresholds = {"SELECTION_SMAPE_GAP": T.SELECTION_SMAPE_GAP,
                    "SELECTION_ONE_HEAVY_ONE_LIGHT_MIN": T.SELECTION_ONE_HEAVY_ONE_LIGHT_MIN,
                    "SELECTION_MAX_LIGHT_DUTY": T.SELECTION_MAX_LIGHT_DUTY}
    if _global_queue(a, prior):
        return a
    all_runs = ev.get("heavy-light", [])
    runs = [e for e in all_runs if (e.summary.get(LIGHT_DUTY) or 0) <= T.SELECTION_MAX_LIGHT_DUTY]
    if not runs:
        a.needs = "heavy-light (E7/E9) with light duty <= " + f"{T.SELECTION_MAX_LIGHT_DUTY:g}%"
        if all_runs:
            a.why_not = "every heavy-light run had light tasks too heavy to tell heavy from light"
        return a

    def label(e):
        s = e.summary
        short, long_, frac = (s.get(SMAPE_SHORT), s.get(SMAPE_LONG),
                              s.get(ONE_HEAVY_ONE_LIGHT_FRACTION))
        if short is None or long_ is None:
            return None
        gap = short - long_
        if gap > T.SELECTION_SMAPE_GAP or (frac is not None
                                           and frac < T.SELECTION_ONE_HEAVY_ONE_LIGHT_MIN):
            return "blind"
        if abs(gap) <= T.SELECTION_SMAPE_GAP:
            return "informed"
        return None  # short term better than long term: says nothing about the first choice

    _vote([(e, label(e)) for e in runs], a)
    a.numbers = {key: [e.summary.get(key) for e in runs]
                 for key in (LIGHT_DUTY, SMAPE_SHORT, SMAPE_LONG, ONE_HEAVY_ONE_LIGHT_FRACTION)}
    a.numbers |= _medians(a, {f"{key} (median)": _values(runs, key)
                              for key in (HEAVY_SLOWDOWN_LONG, IDEAL_SHARE_ERROR,
                                          IDEAL_SLOWDOWN_MAX)})
    return a


def q_priorities(ev, prior) -> Answer:
    a = _new("priorities")
    a.thresholds = {"SPREAD_MAX_INDEX": T.SPREAD_MAX_INDEX}
    runs = ev.get("priority-classes", [])
    if not runs:
        a.needs = "priority-classes (E11)"
        return a

    def label(e):
        v = e.summary.get(HIGH_SPREAD_INDEX)
        if v is None:
            return None
        return "high spread" if v <= T.SPREAD_MAX_INDEX else "high clustered"

    _vote([(e, label(e)) for e in runs], a)
    by_diff: dict = {}
    for e in runs:
        v = e.summary.get(LOW_CLUSTER_INDEX)
        if v is not None:
            by_diff.setdefault(e.summary.get(NICE_DIFF), []).append(v)
    low = {d: ("spread" if _median(v) <= T.SPREAD_MAX_INDEX else "clustered")
           for d, v in sorted(by_diff.items(), key=lambda kv: (kv[0] is None, kv[0]))}
    if a.labelled and low:
        kinds = set(low.values())
        a.label += ("; low " + kinds.pop()) if len(kinds) == 1 else \
            "; low " + ", ".join(f"{k} at nice diff {d}" for d, k in low.items())
    a.numbers = {**_medians(a, {f"{HIGH_SPREAD_INDEX} (median)": _values(runs, HIGH_SPREAD_INDEX)}),
                 f"{LOW_CLUSTER_INDEX} by nice diff": {str(d): _median(v)
                                                       for d, v in by_diff.items()},
                 **_medians(a, {f"{key} (median)": _values(runs, key)
                                for key in (HIGH_ALLOCATION_RATIO, IDEAL_SLOWDOWN_MAX)})}
    return a


RULES = {"balances": q_balances, "affinity": q_affinity, "how_many": q_how_many,
         "time_to_balance": q_time_to_balance, "work_conserving": q_work_conserving,
         "detection": q_detection, "intrinsic": q_intrinsic, "selection": q_selection,
         "priorities": q_priorities}


def _new(qid: str) -> Answer:
    _, question, thesis = next(q for q in QUESTIONS if q[0] == qid)
    return Answer(qid, question, thesis)


def infer_evidence(evidence: list[Evidence], skipped=(), by_level: bool = True,
                   machine: Answer | None = None) -> Card:
    """The card from already collected evidence. Runs placed at a level
    (harmony.experiments.placement) answer that level's questions (``card.levels``,
    :mod:`harmony.analysis.policy_levels`); the card's own answers come from the runs on CPU
    sets as given when there are any, else from all. ``machine``: the whole set's how-many
    answer, for a level's runs: a global queue is the machine's, and where the level's two CPUs
    cannot tell how many moves (poly-balance = pairwise there) the questions that follow from
    it (Table 7.1: time to balance, detection, selection) follow the whole set's global queue,
    as the card's own do, rather than read a periodic balance into one queue's pulls."""
    whole, placed = policy_levels.split(evidence)
    own = whole if whole else evidence
    by_exp: dict[str, list[Evidence]] = {}
    for e in own:
        by_exp.setdefault(e.experiment, []).append(e)
    prior: dict[str, Answer] = {}
    for qid, _, _ in QUESTIONS:
        seen = prior
        if (qid != "how_many" and machine is not None and machine.label == "global-queue"
                and (prior.get("how_many") is None or prior["how_many"].label is None)):
            seen = {**prior, "how_many": machine}
        prior[qid] = RULES[qid](by_exp, seen)
    setups = dict(collections.Counter(e.setup for e in evidence))
    card = Card(answers=[prior[q] for q, _, _ in QUESTIONS], runs=len(evidence),
                experiments=dict(collections.Counter(e.experiment for e in evidence)),
                skipped=list(skipped), cpus=sorted({e.ncpus for e in evidence}), setups=setups,
                classes=dict(collections.Counter(e.classes for e in evidence)))
    if by_level:
        card.levels = policy_levels.level_answers(
            placed, whole,
            lambda ev: infer_evidence(ev, by_level=False, machine=prior["how_many"]), Answer,
            _affinity_label)
        for qid, labels in policy_levels.by_level_labels(card.levels).items():
            card.answer(qid).by_level = labels
        card.predictions = policy_levels.prediction_verdicts(evidence)
    return card


def infer(paths) -> Card:
    """The policy card of every complete run under ``paths`` (run, batch or suite directories)."""
    evidence, skipped = collect(paths)
    return infer_evidence(evidence, skipped)
