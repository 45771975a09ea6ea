"""--until-decided (harmony/decide.py): runs added round by round until a configuration's questions
are decided or shown to vary, through the runner's capture / flush / drain.

Many seeded simulations of the loop run on a runner whose runs are drawn labels (the reference
policies' per-run draw, written as complete runs and read back by the real card): known policies
decide their label, the coin-flip policy varies, the cap stops the loop, a resumed loop takes up
what an interrupted round left, and nothing is read before the runner flushed and drained it. Then
``harmony simulate --until-decided`` end to end, through the simulator and the real analysis."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from harmony import decide
from harmony.analysis import policy, refpolicy
from harmony.analysis import thresholds as T
from harmony.experiments import get_experiment

CPUS = [0, 1, 2, 3]
EXP = get_experiment("how-many")
PARAMS = EXP.resolve({"duration": 1.0, "base": 2, "x": 8}, CPUS)
#: what a how-many run of each reference policy moves in its first round (x = 8 on 4 CPUs)
MOVED = {"poly-balance": 2, "pairwise-random": 4}


class LabelRunner:
    """A runner like the VM's: ``capture`` plans, ``flush`` writes the planned runs (captured),
    ``drain`` completes them (analysed), ``adopt`` queues a stored capture for the next drain. A
    run's first round follows ``draw(seed)`` (a policy name); nothing else is simulated."""

    name, analysis, overlap = "labels", "at drain", False

    def __init__(self, draw):
        self.draw_for = lambda out, seed: draw(seed)
        self.planned, self.captured = [], []
        self.flushes = self.drains = 0
        self.results: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def capture(self, exp, params, cpus, out, seed, figures=True):
        self.planned.append((Path(out), seed))

    def adopt(self, dirs, figures=True):
        self.captured += [Path(d) for d in dirs]

    def flush(self):
        self.flushes += 1
        for out, seed in self.planned:
            out.mkdir(parents=True)
            moved = MOVED[self.draw_for(out, seed)]
            (out / "manifest.json").write_text(json.dumps(
                {"status": "captured", "experiment": "how-many", "params": PARAMS,
                 "cpus": CPUS, "seed": seed}))
            (out / "summary.json").write_text(json.dumps(
                {"first_round_moved": moved, "poly_prediction": 2.0, "pairwise_prediction": 4.0}))
            self.captured.append(out)
        self.planned = []

    def drain(self):
        self.drains += 1
        out = []
        for d in self.captured:
            m = json.loads((d / "manifest.json").read_text())
            (d / "manifest.json").write_text(json.dumps(m | {"status": "complete"}))
            out.append({"status": "ok", "path": str(d), "error": None})
        self.captured = []
        return out


def _loop(tmp: Path, draw, cap=T.UNTIL_DECIDED_MAX_REPEAT, planned=2, seed=0):
    """One configuration's planned runs, then the loop; (its how_many answer, its batch, runner)."""
    runner = LabelRunner(draw)
    with runner:
        decide.batch_until_decided(EXP, PARAMS, CPUS, tmp, planned, runner, seed, cap)
    card = policy.infer([tmp])
    return card.answer("how_many"), json.loads((tmp / "batch.json").read_text()), runner


def _policy(name):
    p = refpolicy.POLICIES[name]
    return lambda seed: refpolicy.drawn(p, seed).name


def test_a_known_policy_is_decided_at_the_fewest_runs(tmp_path):
    a, batch, runner = _loop(tmp_path / "b", _policy("poly-balance"))
    assert a.label == "poly-balance" and a.decided
    assert a.confidence["runs"] == 7 and a.confidence["lower"] > T.DECIDE_SHARE  # 3 labels
    ud = batch["until_decided"]
    assert (ud["planned"], ud["runs"], ud["added"], ud["rounds"], ud["capped"]) == \
        (2, 7, 5, 1, False)
    assert ud["questions"]["how_many"]["state"] == "decided"
    assert batch["reps"] == [f"rep-{k:02d}" for k in range(1, 8)] and batch["repeat"] == 7
    # each round's runs were flushed and drained before the card read them: the planned runs'
    # flush and drain, then one round's
    assert (runner.flushes, runner.drains) == (2, 2)
    seeds = sorted(json.loads((tmp_path / "b" / f"rep-{k:02d}" / "manifest.json").read_text())
                   ["seed"] for k in range(1, 8))
    assert seeds == list(range(7))      # the batch's seeds go on where the plan stopped


@pytest.mark.parametrize("name,want", [("poly-balance", "poly-balance"),
                                       ("pairwise-random", "pairwise"), ("coin-flip", "varies")])
def test_many_seeded_loops_end_where_the_policy_is(tmp_path, name, want):
    """Loops from other seeds, 100 of the coin flip, 20 of each known policy (their runs all
    agree: more seeds draw nothing new): the known policies are decided, always on their own
    label; the coin flip varies in at least 90 % of them (the exact operating characteristic:
    97 % at the default cap over how-many's 3 labels), a label in at most 1 - DECIDE_LEVEL."""
    ends = []
    for k in range(100 if name == "coin-flip" else 20):
        a, batch, _ = _loop(tmp_path / f"s{k}", _policy(name), seed=1000 * k)
        ends.append((a.label.split(" (")[0], a.state, batch["until_decided"]["runs"]))
    if name != "coin-flip":
        assert all(e == (want, "decided", 7) for e in ends), ends
        return
    varies = sum(state == "varies" for _, state, _ in ends)
    labelled = sum(state == "decided" for _, state, _ in ends)
    assert varies >= 90 and labelled <= 100 * (1 - T.DECIDE_LEVEL), ends
    assert all(label == "varies" for label, state, _ in ends if state == "varies")
    assert all(runs <= T.UNTIL_DECIDED_MAX_REPEAT for _, _, runs in ends)


def test_the_cap_stops_the_loop_and_says_so(tmp_path):
    a, batch, _ = _loop(tmp_path / "b", lambda seed: ("poly-balance", "pairwise-random")[seed % 2],
                        cap=4)
    ud = batch["until_decided"]
    assert ud["runs"] == 4 and ud["capped"] and a.state == "undecided"
    assert "could settle it" in policy.confidence_text(a)


def test_a_resumed_loop_takes_up_an_interrupted_round(tmp_path):
    """Runs of an earlier round are kept when complete and made again when interrupted (moved
    aside, never deleted); then the loop goes on from there."""
    out = tmp_path / "b"
    _loop(out, _policy("poly-balance"), cap=5)          # 5 runs: not decided yet (7 needed)
    rep5 = out / "rep-05" / "manifest.json"
    rep5.write_text(json.dumps(json.loads(rep5.read_text()) | {"status": "running"}))
    runner = LabelRunner(_policy("poly-balance"))
    batch = decide.Batch(EXP, PARAMS, out, 2)
    with runner:
        decide.until_decided([batch], CPUS, runner, 20, resume=True)
    assert (out / "rep-05.incomplete-1").is_dir() and batch.runs == 7
    assert policy.infer([out]).answer("how_many").decided
    record = json.loads((out / "batch.json").read_text())["until_decided"]
    assert record["runs"] == 7 and record["rounds"] == 2


def test_a_configuration_without_a_vote_gets_no_more_runs(tmp_path):
    """how-many on 2 CPUs cannot tell its predictions apart: no vote, nothing to decide."""
    runner = LabelRunner(_policy("poly-balance"))
    out = tmp_path / "b"
    with runner:
        runner.capture(EXP, PARAMS, CPUS, out / "rep-01", 0)
        runner.flush()
        runner.drain()
    (out / "rep-01" / "summary.json").write_text(json.dumps(
        {"first_round_moved": 4, "poly_prediction": 4.0, "pairwise_prediction": 4.0}))
    assert decide.next_round(decide.Batch(EXP, PARAMS, out, 1), 20) == 0


def test_simulate_until_decided_end_to_end(tmp_path, no_figures):
    """Through the simulator and the real analysis (~25 s: 7 poly-balance runs and about 10
    coin-flip runs of a 1 s how-many at P = 4): the known policy is decided, the coin flip
    varies, and the batch says how many runs each took."""
    from harmony.cli import main

    for name, want in (("poly-balance", "poly-balance"), ("coin-flip", "varies (")):
        out = tmp_path / name
        r = CliRunner().invoke(main, ["simulate", "--policy", name, "--ncpus", "4", "--experiment",
                                      "how-many", "-p", "duration=1", "-p", "base=2", "-p", "x=8",
                                      "--repeat", "2", "--until-decided", "--out", str(out)])
        assert r.exit_code == 0, r.output
        a = policy.infer([out]).answer("how_many")
        assert a.label.startswith(want) and a.state in ("decided", "varies"), a
        assert "until decided: 2 runs planned" in r.output and "how_many: " in r.output
    drawn = {json.loads(p.read_text())["simulated"]["drawn"]
             for p in (tmp_path / "coin-flip").glob("rep-*/manifest.json")}
    assert drawn == {"poly-balance", "pairwise-random"}
    r = CliRunner().invoke(main, ["simulate", "--policy", "poly-balance", "--experiment",
                                  "how-many", "--max-repeat", "5", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--max-repeat goes with --until-decided" in r.output
    r = CliRunner().invoke(main, ["simulate", "--policy", "poly-balance", "--experiment",
                                  "how-many", "--repeat", "6", "--until-decided", "--max-repeat",
                                  "4", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "fewer runs than the 6 planned" in r.output


def test_the_coin_flip_draws_each_policy_about_half_the_time():
    draws = [refpolicy.drawn(refpolicy.POLICIES["coin-flip"], s).name for s in range(1000)]
    assert 450 <= draws.count("poly-balance") <= 550
    assert refpolicy.drawn(refpolicy.POLICIES["poly-balance"], 3).name == "poly-balance"
    assert random.Random("mix-7").random() == random.Random("mix-7").random()


def test_a_suite_until_decided_records_and_reports_its_rounds(tmp_path, monkeypatch):
    """run_suite with until_decided: each configuration grown on its own, suite.json's total and
    per-configuration record, the report's table of it."""
    from harmony import suite
    from harmony.analysis import report_suite

    configs = [suite.Config("how-many", {}, 2, name, params=dict(PARAMS))
               for name in ("how-many-poly", "how-many-coin")]
    coin, poly = _policy("coin-flip"), _policy("poly-balance")
    runner = LabelRunner(poly)
    runner.draw_for = lambda out, seed: (coin if "coin" in str(out) else poly)(seed)
    written = []
    monkeypatch.setattr(report_suite, "write", lambda out, note=None: written.append(out))
    record = suite.run_suite(configs, CPUS, tmp_path / "s", runner, seed=0, quiet=True,
                             until_decided=T.UNTIL_DECIDED_MAX_REPEAT)
    ud = record["until_decided"]
    assert ud["max_repeat"] == T.UNTIL_DECIDED_MAX_REPEAT and written == [tmp_path / "s"]
    assert ud["configs"]["how-many-poly"]["runs"] == 7
    assert ud["configs"]["how-many-coin"]["questions"]["how_many"]["state"] == "varies"
    assert record["runs"] == sum(c["runs"] for c in ud["configs"].values())
    assert ud["added_runs"] == record["runs"] - 4 and record["status"] == "complete"
    df = report_suite.df_until_decided(ud)
    assert list(df["configuration"]) == ["how-many-poly", "how-many-coin"]
    assert not df["capped"].any() and df["questions"].str.startswith("how_many: ").all()
    blocks = report_suite.until_decided_blocks(ud)
    assert "runs were added in" in blocks[1].text


def test_a_resumed_suite_keeps_its_rounds_and_its_cap(tmp_path, monkeypatch):
    """A suite stopped inside a round: --resume's plan (resume_plan) and cap (suite.json) go on;
    the added runs that were complete are kept, the interrupted one is made again."""
    from harmony import suite
    from harmony.analysis import report_suite

    monkeypatch.setattr(report_suite, "write", lambda out, note=None: None)
    out = tmp_path / "s"
    configs = [suite.Config("how-many", {}, 2, "how-many", params=dict(PARAMS))]
    suite.run_suite(configs, CPUS, out, LabelRunner(_policy("poly-balance")), quiet=True,
                    until_decided=T.UNTIL_DECIDED_MAX_REPEAT)
    # as if stopped in the round: its last run interrupted, the suite not finished
    rep = out / "how-many" / "rep-07" / "manifest.json"
    rep.write_text(json.dumps(json.loads(rep.read_text()) | {"status": "running"}))
    record = json.loads((out / "suite.json").read_text())
    (out / "suite.json").write_text(json.dumps(record | {"status": "running"}))
    configs, cpus, before = suite.resume_plan(out)
    assert before["until_decided"]["max_repeat"] == T.UNTIL_DECIDED_MAX_REPEAT
    runner = LabelRunner(_policy("poly-balance"))
    record = suite.run_suite(configs, cpus, out, runner, quiet=True, resume=True,
                             until_decided=before["until_decided"]["max_repeat"])
    assert record["status"] == "complete" and record["runs"] == 7
    assert (out / "how-many" / "rep-07.incomplete-1").is_dir()
    assert policy.infer([out]).answer("how_many").decided
    assert (runner.flushes, runner.drains) == (2, 2)   # the plan, then the take-up
