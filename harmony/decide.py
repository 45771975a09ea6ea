"""Repetitions until decided: after its planned runs, a configuration whose questions are not all
decided or shown to vary gets more runs, a round at a time, up to a cap (``harmony suite
--until-decided [--max-repeat N]``, ``harmony run EXP --repeat N --until-decided``, ``harmony
simulate ... --until-decided``).

A configuration's questions are those its runs alone answer with a vote (the card of its batch
directory, :func:`harmony.analysis.policy.infer`); each carries its verdict
(:mod:`harmony.analysis.sequential`). While one is undecided and the configuration has fewer than
the cap's runs, the next round gives it as many more runs as would settle the soonest of its
undecided questions if they split as its runs so far did (for a split vote at most as many as it
has: a round at most doubles them) and at least as many as could settle one at all
(:func:`next_round`; the bounds hold at every number of runs, so looking only after a round is as
valid as after each run). A round captures the runs of every configuration that needs them
through the runner's own interface -- ``capture`` (by :func:`harmony.batch.run_batch`,
continuing the batch's repetitions and seeds), ``flush`` (a VM runner makes its planned
captures), ``drain`` (every analysis done) -- then reads the cards again. So it works with any
runner: :class:`harmony.runners.SimRunner`, :class:`harmony.runners.KernelRunner`,
:class:`harmony.vm.runner.VmRunner` (a flush there boots the kernel under test, unless the guest
is still up from the last one).

Each batch.json records what the loop did (``until_decided``: planned runs, runs in all, rounds,
each question's state and runs at the end, whether the cap stopped it); ``resume`` (an interrupted
suite) takes up the repetitions beyond the planned ones that are already there before any new
round.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harmony import store
from harmony.analysis import sequential
from harmony.batch import rep_dir, run_batch


@dataclasses.dataclass
class Batch:
    """One configuration the loop may grow: its experiment, parameters, directory and planned
    runs; ``runs`` is how many repetitions it has now."""

    exp: object
    params: dict
    out: Path
    planned: int
    label: str = ""
    runs: int = 0
    rounds: int = 0
    #: its own CPU set (a pair placed at a level, harmony.suite.level_plan), or None: the loop's
    cpus: list | None = None

    def __post_init__(self):
        self.runs = self.runs or self.planned
        self.label = self.label or Path(self.out).name


def questions(out: Path) -> dict:
    """The questions the runs under ``out`` alone answer with a vote: qid -> their answer
    (:class:`harmony.analysis.policy.Answer`, with its confidence)."""
    from harmony.analysis import policy

    evidence, _ = policy.collect([out])
    card = policy.infer_evidence(evidence)
    return {a.qid: a for a in card.answers if a.confidence is not None}


def next_round(batch: Batch, cap: int) -> int:
    """How many runs ``batch`` gets in the next round: as many as would settle the soonest of its
    undecided questions if its later runs split as its runs so far did
    (:func:`harmony.analysis.sequential.runs_at_this_split`; a unanimous vote: the runs that
    decide it), where a vote is split no more than it has (a round at most doubles the runs, so
    that a split that settles sooner than projected is seen), and never fewer than could settle
    one at all; within ``cap`` runs in all. 0 when every question is settled (or none has a
    vote) or the cap is reached."""
    left = cap - batch.runs
    open_ = [a.confidence for a in questions(batch.out).values() if a.state == "undecided"]
    if left <= 0 or not open_:
        return 0
    least = min(c["more"] for c in open_)
    projected = min(sequential.runs_at_this_split(list(c["split"].values()), c["labels"])
                    for c in open_)
    if any(len(c["split"]) > 1 for c in open_):     # split votes: a projection, not a promise
        projected = min(projected, batch.runs)
    return max(1, min(left, max(least, projected)))


def until_decided(batches: list[Batch], cpus: list[int], runner, cap: int, seed: int = 0,
                  progress=None, resume: bool = False) -> list[dict]:
    """Grow ``batches`` round by round (see the module's docstring) inside an entered ``runner``
    whose planned captures are flushed and drained; returns what the rounds' drains reported
    (one dict per analysed directory: status, path, error). Each batch's batch.json gets its
    ``until_decided`` record; :func:`harmony.batch.finish_batch` is left to the caller."""
    results: list[dict] = []
    if resume:
        results += _take_up(batches, cpus, runner, seed, progress)
    # a runner that makes its captures at flush (a VM's) numbers them as they happen
    later = hasattr(runner, "to_make")
    while True:
        grow = [(b, n) for b in batches if (n := next_round(b, cap)) > 0]
        if not grow:
            break
        if progress is not None and not later:
            progress.total_runs += sum(n for _, n in grow)
            progress.total_s += sum(n * float(b.params["duration"]) *
                                    (1 + len(b.exp.companions(b.params))) for b, n in grow)
        for b, n in grow:
            run_batch(b.exp, b.params, b.cpus or cpus, b.out, b.runs + n, runner, seed=seed,
                      progress=None if later else progress, draw_first=False,
                      first=b.runs + 1)
            b.runs += n
            b.rounds += 1
        if later and progress is not None:
            progress.expect(*runner.to_make())
        runner.flush()
        results += runner.drain()
    for b in batches:
        record(b, cap)
    return results


def batch_until_decided(exp, params: dict, cpus: list[int], out: Path, repeat: int, runner,
                        seed: int = 0, cap: int | None = None, progress=None) -> list[dict]:
    """One configuration's ``repeat`` planned runs into ``out`` (:func:`harmony.batch.run_batch`)
    inside an entered ``runner``, then, with a ``cap``, more until its questions are settled
    (:func:`until_decided`); returns what the runner's drains reported (none without a cap: the
    runner drains on leaving)."""
    run_batch(exp, params, cpus, out, repeat, runner, seed=seed, progress=progress)
    if cap is None:
        return []
    runner.flush()
    drained = runner.drain()
    return drained + until_decided([Batch(exp, params, out, repeat)], cpus, runner, cap,
                                   seed=seed, progress=progress)


def _take_up(batches: list[Batch], cpus: list[int], runner, seed: int, progress) -> list[dict]:
    """A resumed suite: the repetitions beyond the planned ones that an earlier round made (or
    began) are kept, analysed or made again as :func:`harmony.batch.run_batch` resumes them."""
    grown = False
    for b in batches:
        before = _record_of(b.out)
        k = b.planned
        while rep_dir(b.out, k + 1).exists():
            k += 1
        if k > b.planned:
            run_batch(b.exp, b.params, b.cpus or cpus, b.out, k, runner, seed=seed,
                      progress=progress, draw_first=False, resume=True, first=b.planned + 1)
            grown = True
        b.runs, b.rounds = k, before.get("rounds", 0)
    if not grown:
        return []
    runner.flush()
    return runner.drain()


def _record_of(out: Path) -> dict:
    try:
        return store.read_json(Path(out) / "batch.json").get("until_decided") or {}
    except store.RunError:
        return {}


def record(b: Batch, cap: int) -> dict:
    """Write ``b``'s ``until_decided`` record into its batch.json and return it: planned runs,
    runs in all, rounds, the cap and whether it stopped the loop, and each question's state,
    runs with a label and leading label."""
    answers = questions(b.out)
    out = {"planned": b.planned, "runs": b.runs, "added": b.runs - b.planned,
           "rounds": b.rounds, "cap": cap,
           "capped": any(a.state == "undecided" for a in answers.values()),
           "questions": {qid: {"state": a.state, "label": a.confidence["label"],
                               "votes": a.confidence["votes"], "runs": a.confidence["runs"]}
                         for qid, a in answers.items()}}
    path = Path(b.out) / "batch.json"
    store.write_json(path, store.read_json(path) | {"until_decided": out})
    return out
