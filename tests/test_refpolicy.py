"""Reference policies: the policy card recovers each simulated policy's own labels at P = 4, 8, 16.

The simulated runs go through the real pipeline (synthetic probe -> harmony.pipeline.analyse ->
experiment.analyse -> policy.infer); only the figures are skipped, to keep the test fast.
"""

import pytest

from harmony.analysis import policy, refpolicy
from harmony.batch import finish_batch, run_batch
from harmony.runners import SimRunner
from harmony.simulate import simulate_run

#: short runs: what each experiment needs to show its effect in a simulator, and nothing more
SHORT = {
    "single-source": {"duration": 1.0},
    "how-many": {"duration": 1.0},
    "work-conservation": {"duration": 1.0, "idle_from_s": 0.3, "idle_to_s": 0.6},
    "detection": {"duration": 1.2, "cut_from_s": 0.3, "cut_to_s": 0.6},
    "intrinsic-imbalance": {"duration": 2.0, "warmup_s": 0.5},
    "heavy-light": {"duration": 2.0, "long_warmup_s": 1.0, "short_warmup_s": 0.2, "short_s": 0.3,
                    "light_duty": 20},
}


#: the questions the card answers from SHORT's runs: all but the priorities (priority-classes)
ANSWERED = {qid for qid, _, _ in policy.QUESTIONS} - {"priorities"}


def _how_many(P):
    # base 2 keeps the task count small at P = 16; x = 2P separates x/P from x/2 at every P
    return {"base": 2, "x": 2 * P}


@pytest.mark.parametrize("P", [4, 8, 16])
@pytest.mark.parametrize("name", [n for n, p in refpolicy.POLICIES.items() if not p.mix])
def test_card_recovers_policy(tmp_path, no_figures, name, P):
    from harmony.experiments import CATALOG, get_experiment

    cpus = list(range(P))
    runner = SimRunner(name)
    for exp_name, overrides in SHORT.items():
        if exp_name not in CATALOG:
            continue
        exp = get_experiment(exp_name)
        extra = _how_many(P) if exp_name == "how-many" else {}
        params = exp.resolve({**overrides, **extra}, cpus)
        reps = 3 if exp_name == "detection" else 1
        run_batch(exp, params, cpus, tmp_path / exp_name, reps, runner, seed=P)
        finish_batch(tmp_path / exp_name, figures=False)   # the card reads batch.json only
    card = policy.infer([tmp_path])
    expected = refpolicy.expected_labels(name)
    assert {a.qid for a in card.answers if a.label is not None} == ANSWERED, card.text()
    checked = set()
    for qid, want in expected.items():
        a = card.answer(qid)
        if a.label is None and a.needs:  # none of SHORT's experiments answers it
            continue
        # one run (three of detection) decides nothing at 95 % (issue 46): the label all the
        # runs give, or where they disagree (a periodic check that fell just after detection's
        # cut is early: event-driven), the label most of them give
        got = a.confidence["label"] if a.label == policy.UNDECIDED else a.label
        assert got is not None and got.startswith(want), \
            f"{name} P={P} {qid}: expected {want!r}, card says {a.label!r}\n{card.text()}"
        checked.add(qid)
    assert checked == set(expected) & ANSWERED, card.text()


def test_simulated_run_is_clean(tmp_path, no_figures):
    """The simulator's event stream is consistent: the reconstruction repairs nothing."""
    run = simulate_run("pairwise-random", "single-source", 4, tmp_path / "r",
                                 {"duration": "1", "layout": "6,0,1,1"})
    assert run.complete
    assert run.manifest["reconstruction_anomalies"] == 0
    assert run.manifest["probe"] == "synthetic"
    assert run.summary["balance_migrations"] > 0
    # every migration moved a task between CPUs of the set
    assert set(run.migrations["dst_cpu"]) <= {0, 1, 2, 3}


def test_policies_differ_in_how_many_they_move(tmp_path, no_figures):
    """Poly-balance moves x/P in the first round, pairwise x/2: the simulator obeys its own
    rules."""
    moved = {}
    for name in ("poly-balance", "pairwise-random"):
        run = simulate_run(name, "how-many", 4, tmp_path / name,
                                     {"duration": "0.5", "x": "16", "base": "4"})
        moved[name] = run.summary["first_round_moved"]
    assert moved == {"poly-balance": 4, "pairwise-random": 8}


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown reference policy"):
        refpolicy.get_policy("round-robin")


def test_synthetic_probe_refuses_to_record_and_names_bad_files(tmp_path):
    from harmony.probes import TraceCorrupt, get_probe

    probe = get_probe("synthetic")
    ok, why = probe.available()
    assert not ok and "simulate" in why
    (tmp_path / "events.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceCorrupt, match="events.parquet"):
        probe.decode_dir(tmp_path)
