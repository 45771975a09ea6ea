"""The server section of a card: for each server shape, how the scheduler under test treats it.

From server runs (experiment ``server``; :class:`harmony.analysis.policy.Evidence`), one answer
per shape, voted like the policy card's (unanimous over the shape's runs, else ``undecided``),
with the numbers behind it (medians over its runs, per load) and the thresholds used
(:mod:`harmony.analysis.thresholds`):

- thread-per-connection: does it keep a connection's task where it runs (its data's cache)?
  ``keeps`` up to SERVER_KEEPS_MAX_PER_TASK_S migrations per task and second, else ``moves``;
- pool-per-stage: does it spread a stage's pool over the CPUs? ``spread`` when Jain's index of
  the serving tasks' CPU time across the CPUs is SERVER_SPREAD_MIN_JAIN or more, else
  ``packed``;
- event-loop: does the loop get pulled around? ``keeps`` / ``moves`` as thread-per-connection;
- thread-per-core: its loops are pinned: the answer is the latency it gets, no label to vote.

Every shape's lines also give the latency percentiles by load and the share of the p99 requests
that met a migration or waited in a run queue, so that schedulers compare on what a service
sees (``harmony compare`` sets the runs' metrics side by side, per shape, load and sizes).
"""

from __future__ import annotations

import statistics

from harmony.analysis import thresholds as T
from harmony.experiments import summary_key

EXPERIMENT = "server"
KEYS = tuple(summary_key(k, EXPERIMENT) for k in (
    "latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "p99_met_migration", "p99_waited",
    "server_migrations_per_task_s", "server_cpu_jain", "overloaded"))
QUESTIONS = {
    "thread-per-connection": "keeps a connection's task where it runs?",
    "pool-per-stage": "spreads a stage's pool over the CPUs?",
    "event-loop": "keeps the event loop where it runs?",
    "thread-per-core": "latency of loops pinned one per CPU",
}


def _label(shape: str, s: dict) -> str | None:
    """A run's label (None: no vote; a summary of an older Harmony may lack the key)."""
    moved, jain = s.get("server_migrations_per_task_s"), s.get("server_cpu_jain")
    if shape in ("thread-per-connection", "event-loop") and moved is not None:
        return "keeps" if moved <= T.SERVER_KEEPS_MAX_PER_TASK_S else "moves"
    if shape == "pool-per-stage" and jain is not None:
        return "spread" if jain >= T.SERVER_SPREAD_MIN_JAIN else "packed"
    return None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def answers(evidence) -> list[dict]:
    """One answer per shape the server runs among ``evidence`` cover: shape, question, label
    (None for thread-per-core; "undecided" when its runs disagree), votes (label -> runs),
    thresholds, and per load the medians of :data:`KEYS` over its runs."""
    runs = [e for e in evidence if e.experiment == EXPERIMENT]
    out = []
    for shape, question in QUESTIONS.items():
        mine = [e for e in runs if e.params.get("shape") == shape]
        if not mine:
            continue
        votes: dict = {}
        for e in mine:
            lab = _label(shape, e.summary)
            if lab is not None:
                votes[lab] = votes.get(lab, 0) + 1
        label = (next(iter(votes)) if len(votes) == 1 else "undecided") if votes else None
        loads = {}
        for load in sorted({float(e.params["load"]) for e in mine}):
            at = [e.summary for e in mine if float(e.params["load"]) == load]
            loads[load] = {"runs": len(at), **{k: _median([s.get(k) for s in at]) for k in KEYS
                                               if k != "overloaded"},
                           "overloaded": sum(bool(s.get("overloaded")) for s in at)}
        out.append({"shape": shape, "question": question, "label": label, "votes": votes,
                    "thresholds": ({"SERVER_SPREAD_MIN_JAIN": T.SERVER_SPREAD_MIN_JAIN}
                                   if shape == "pool-per-stage" else
                                   {} if shape == "thread-per-core" else
                                   {"SERVER_KEEPS_MAX_PER_TASK_S": T.SERVER_KEEPS_MAX_PER_TASK_S}),
                    "loads": loads})
    return out


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def section_lines(evidence) -> list[str]:
    """The server section as text lines ([] without server runs)."""
    lines = []
    for a in answers(evidence):
        label = a["label"] or ("(pinned loops: no label)" if a["shape"] == "thread-per-core" else
                               "no evidence (summaries without its metrics: analyse them again)")
        votes = ", ".join(f"{k} in {v}" for k, v in a["votes"].items())
        lines.append(f"{a['shape']}: {a['question']}  {label}" + (f" ({votes})" if votes else ""))
        for load, m in a["loads"].items():
            over = f", OVERLOADED in {m['overloaded']}" if m["overloaded"] else ""
            lines.append(
                f"    load {load:g} ({m['runs']} runs{over}): latency p50/p99/p99.9 "
                f"{_ms(m['latency_p50_ms'])} / {_ms(m['latency_p99_ms'])} / "
                f"{_ms(m['latency_p999_ms'])} ms; p99 met a migration "
                f"{_pct(m['p99_met_migration'])}, waited {_pct(m['p99_waited'])}; "
                f"{_ms(m['server_migrations_per_task_s'])} migrations per task-s, CPU-time Jain "
                f"{_ms(m['server_cpu_jain'])}")
        if a["thresholds"]:
            lines.append("    thresholds: "
                         + ", ".join(f"{k} = {v}" for k, v in a["thresholds"].items()))
    return lines


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"
