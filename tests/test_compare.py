"""harmony compare: one policy card per source, side by side, never pooled, and the metric
differences with their intervals and effect sizes (simulated runs; the thesis's figures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from harmony.analysis.compare import (CONFIG_PARAMS, METRIC_COLUMNS, compare, compare_text,
                                      df_compare, df_metric_differences, df_sources, label_kind,
                                      unmatched)
from harmony.cli import main
from harmony.core.errors import ParameterError


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory):
    """(poly-balance dir, pairwise-random dir): one how-many run each on 4 simulated CPUs, where
    the two reference policies move different numbers of tasks (x/P against x/2)."""
    import harmony.experiments as ex
    real = ex.get_experiment

    def no_plots(name):
        exp = real(name)
        exp.plot = lambda run, fig_dir: []
        return exp

    ex.get_experiment = no_plots
    try:
        root = tmp_path_factory.mktemp("compare")
        dirs = []
        for policy in ("poly-balance", "pairwise-random"):
            out = root / policy
            r = invoke("simulate", "--policy", policy, "--ncpus", 4, "--experiment", "how-many",
                       "--repeat", 1, "--out", out)
            assert r.exit_code == 0, r.output
            dirs.append(out)
        return dirs
    finally:
        ex.get_experiment = real


def test_each_directory_gets_its_own_card_and_differences_are_marked(two_policies):
    poly, pair = two_policies
    cmp = compare([poly, pair])
    df = df_compare(cmp)
    assert list(df.columns) == ["qid", "question", "thesis", "source", "label", "kind", "decided",
                                "state", "votes", "differs", "beyond_noise"]
    assert len(df) == 2 * 9
    how = df[df["qid"] == "how_many"].set_index("source")
    assert how.loc[str(poly), "label"] == "poly-balance"
    assert how.loc[str(pair), "label"] == "pairwise"
    # the labels differ in kind (marked), but one run a side decides neither (issue 46: decided
    # means at 95 %, which takes 7 agreeing runs over how-many's 3 labels): not beyond noise
    assert how["differs"].all() and not how["decided"].any()
    assert (how["state"] == "undecided").all() and not how["beyond_noise"].any()
    # questions neither directory answers are the same ("no evidence"), not a difference
    other = df[df["qid"] != "how_many"]
    assert (other["label"] == "no evidence").all() and not other["differs"].any()
    src = df_sources(cmp)
    assert list(src["setup"]) == ["simulated, reference policy poly-balance",
                                  "simulated, reference policy pairwise-random"]
    assert list(src["runs"]) == [1, 1] and list(src["cpus"]) == ["4", "4"]

    text = compare_text(cmp)
    assert f"A  {poly}: 1 run on 4 CPUs; simulated, reference policy poly-balance" in text
    row = next(line for line in text.splitlines() if "how_many" in line)
    assert row.startswith("*") and row.index("poly-balance") < row.index("pairwise")
    assert not next(line for line in text.splitlines() if " balances " in line).startswith("*")
    assert "1 of 9 questions answered differently" in text


def test_cli_compare_and_json(two_policies):
    poly, pair = two_policies
    r = invoke("compare", poly, pair)
    assert r.exit_code == 0, r.output
    assert "* 3 how_many" in r.output
    r = invoke("compare", poly, pair, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [s["source"] for s in data["sources"]] == [str(poly), str(pair)]
    assert {a["label"] for a in data["answers"] if a["qid"] == "how_many"} == {"poly-balance",
                                                                               "pairwise"}


def test_out_writes_the_tables_the_answers_and_a_figure(two_policies, tmp_path):
    from harmony.analysis.compare import df_compare_runs
    poly, pair = two_policies
    runs = df_compare_runs(compare([poly, pair]))
    assert list(runs.columns[:4]) == ["source", "letter", "path", "experiment"]
    assert list(runs["letter"]) == ["A", "B"]
    # poly-balance moves ~x/P in the first round, pairwise ~x/2: the figure's how-many panel
    moved = runs.set_index("letter")["first_round_moved"]
    assert 0 < moved["A"] < moved["B"]
    out = tmp_path / "cmp"
    r = invoke("compare", poly, pair, "--out", out)
    assert r.exit_code == 0, r.output
    md = (out / "compare.md").read_text()
    # the answers one column per source, the question they answer differently marked
    assert "| * | 3 | How does the scheduler determine how many processes to migrate? " \
           "(how_many) |" in md and "![each source's runs](figures/compare.png)" in md
    # compare.html is the same document, standing alone
    page = (out / "compare.html").read_text()
    assert '<tr class="differs"><td>*</td><td class="num">3</td>' in page
    assert page.count("data:image/png;base64,") == 2 and "<script" not in page
    assert "![the differences and their intervals](figures/differences.png)" in md
    data = json.loads((out / "compare.json").read_text())
    assert len(data["answers"]) == 18 and len(data["sources"]) == 2
    assert [m["verdict"] for m in data["metrics"] if m["metric"] == "first_round_moved"] == \
        ["too few runs"]
    assert (out / "figures" / "compare.png").stat().st_size > 10_000
    assert (out / "figures" / "differences.png").stat().st_size > 10_000


def test_infer_says_when_it_pools_several_setups(two_policies):
    poly, pair = two_policies
    r = invoke("infer", poly, pair)
    assert r.exit_code == 0, r.output
    assert "POOLED: these runs come from 2 setups" in r.output and "harmony compare" in r.output
    # pooled, the two policies' how-many answers cancel out
    assert "undecided" in r.output.split("How does the scheduler determine")[1].split("\n4.")[0]
    r = invoke("infer", poly)
    assert r.exit_code == 0 and "POOLED" not in r.output
    r = invoke("infer", poly, "--json")
    assert json.loads(r.output)["setups"] == {"simulated, reference policy poly-balance": 1}


def test_bad_sources_exit_1_naming_them_and_usage_2(two_policies, tmp_path):
    """A source that is missing or holds no usable run is input (status 1); fewer than two
    sources, or one given twice, is usage (2)."""
    poly, _ = two_policies
    r = invoke("compare", poly)
    assert r.exit_code == 2 and "two sources or more" in r.output
    r = invoke("compare", poly, tmp_path / "missing")
    assert r.exit_code == 1 and f"{tmp_path / 'missing'}: no such directory" in r.output
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for command in (["compare", poly, a_file], ["infer", a_file]):
        r = invoke(*command)
        assert r.exit_code == 1 and f"{a_file}: not a directory" in r.output, r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke("compare", poly, empty)
    assert r.exit_code == 1 and f"{empty}: not a run, batch or suite directory" in r.output
    # runs there, none usable: says why
    incomplete = tmp_path / "incomplete"
    shutil.copytree(poly / "rep-01", incomplete / "rep-01")
    manifest = json.loads((incomplete / "rep-01" / "manifest.json").read_text())
    (incomplete / "rep-01" / "manifest.json").write_text(
        json.dumps(manifest | {"status": "incomplete"}))
    r = invoke("compare", poly, incomplete)
    assert r.exit_code == 1 and f"{incomplete}: no complete run (1 not used; the first, " \
        f"{incomplete / 'rep-01'}: run is incomplete" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert "Traceback" not in r.output
    with pytest.raises(ParameterError):
        compare([poly])
    r = invoke("compare", poly, poly.parent / ".." / poly.parent.name / poly.name)
    assert r.exit_code == 2 and "given twice" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------- metric differences (issue 23)

def _simulate(root: Path, policy: str, experiment: str, runs: int, seed: int, **overrides):
    """``runs`` simulated runs of ``experiment`` on 4 CPUs under ``policy`` into
    root/<experiment>[-k=v]/rep-NN, seeds seed, seed + 1, ... (no figures)."""
    from harmony.analysis.refpolicy import get_policy
    from harmony.experiments import get_experiment
    from harmony.simulate import execute
    exp, cpus = get_experiment(experiment), [0, 1, 2, 3]
    params = exp.resolve(dict(overrides), cpus)
    batch = root / (experiment + "".join(f"-{k}={v}" for k, v in overrides.items()))
    for k in range(runs):
        execute(get_policy(policy), exp, params, cpus, batch / f"rep-{k + 1:02d}", seed + k,
                figures=False)
    return root


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory):
    """Sources of 5 how-many runs each on 4 simulated CPUs (x = 10: poly-balance moves x/P, 2,
    pairwise x/2, 5): poly-balance twice (other seeds), pairwise-random once. The first
    poly-balance source also holds 2 how-many runs at x = 20 and 2 intrinsic-imbalance runs,
    where the thesis has figures of O(1)."""
    root = tmp_path_factory.mktemp("five")
    poly = _simulate(root / "poly", "poly-balance", "how-many", 5, 0)
    _simulate(poly, "poly-balance", "how-many", 2, 10, x=20)
    _simulate(poly, "poly-balance", "intrinsic-imbalance", 2, 20)
    return {"poly": poly,
            "poly-again": _simulate(root / "poly-again", "poly-balance", "how-many", 5, 100),
            "pair": _simulate(root / "pair", "pairwise-random", "how-many", 5, 0)}


def _row(df, config, metric, pair="B vs A"):
    rows = df[(df["pair"] == pair) & (df["config"] == config) & (df["metric"] == metric)]
    assert len(rows) == 1, df[["pair", "config", "metric"]]
    return rows.iloc[0]


def test_policies_whose_labels_differ_differ_beyond_noise_on_the_metric(five_runs):
    cmp = compare([five_runs["poly"], five_runs["pair"]])
    assert df_compare(cmp).set_index(["qid", "source"]).loc["how_many", "differs"].all()
    df = df_metric_differences(cmp)
    assert list(df.columns) == METRIC_COLUMNS
    r = _row(df, "how-many P=4 x=10", "first_round_moved")
    assert (r.n_a, r.n_b, r.value_a, r.value_b, r["diff"]) == (5, 5, 2, 5, 3)
    assert r.ci_low > 0 and r.effect == 1.0 and r.magnitude == "large"
    assert r.apart and r.differs and r.verdict == "differs" and r.statistic == "median"
    assert r.unit == "count" and r.cpus_a == r.cpus_b == 4
    # configurations only one side measured get no row, and are said
    assert not (df["config"] == "how-many P=4 x=20").any()
    assert "B vs A: only A measured how-many P=4 x=20, intrinsic-imbalance P=4" in unmatched(cmp)
    text = compare_text(cmp)
    line = next(ln for ln in text.splitlines() if "first_round_moved" in ln)
    assert line.lstrip().startswith("*") and "+3 .. +3" in line and "+1.00 large" in line
    # the same inputs give the same intervals (a documented seed)
    pd.testing.assert_frame_equal(df, df_metric_differences(compare([five_runs["poly"],
                                                                      five_runs["pair"]])))


def test_a_policy_against_itself_differs_nowhere_beyond_noise(five_runs):
    cmp = compare([five_runs["poly"], five_runs["poly-again"]])
    assert not df_compare(cmp).set_index("qid").loc["how_many", "differs"].any()
    df = df_metric_differences(cmp)
    r = _row(df, "how-many P=4 x=10", "first_round_moved")
    assert (r.value_a, r.value_b, r["diff"], r.effect) == (2, 2, 0, 0)
    assert r.verdict == "within noise" and not r.differs
    assert not df["differs"].any(), df[df["differs"]]
    assert "(0 are marked)" in compare_text(cmp) or "would be marked" not in compare_text(cmp)


def test_two_runs_a_side_are_shown_with_their_interval_but_not_marked(five_runs, tmp_path):
    two = {}
    for name in ("poly", "pair"):      # a folder of two of the runs of each
        two[name] = tmp_path / name
        two[name].mkdir()
        for rep in ("rep-01", "rep-02"):
            (two[name] / rep).symlink_to(five_runs[name] / "how-many" / rep)
    cmp = compare([two["poly"], two["pair"]])
    r = _row(df_metric_differences(cmp), "how-many P=4 x=10", "first_round_moved")
    assert (r.n_a, r.n_b) == (2, 2) and r.ci_low > 0 and r.apart
    assert not r.differs and r.verdict == "too few runs"
    line = next(ln for ln in compare_text(cmp).splitlines() if "first_round_moved" in ln)
    assert line.lstrip().startswith("?") and "too few runs (2, 2)" in line


def test_stats_of_a_difference_between_two_sets_of_runs():
    from harmony.analysis import stats
    assert stats.cliffs_delta([1, 2], [3, 4]) == 1.0
    assert stats.cliffs_delta([3, 4], [1, 2]) == -1.0
    assert stats.cliffs_delta([1, 2, 3], [1, 2, 3]) == 0.0
    assert stats.cliffs_delta([1, None, float("nan"), 3], [2]) == 0.0   # None/NaN left out
    assert stats.cliffs_delta([], [1]) is None
    assert stats.bootstrap_diff_ci([1.0], [2.0, 3.0]) == (None, None)
    assert stats.bootstrap_diff_ci([1, 1, 1], [4, 4]) == (3.0, 3.0)
    # 2 runs a side: the interval is the range of the differences the runs allow
    assert stats.bootstrap_diff_ci([0, 1], [5, 7]) == (4.0, 7.0)
    spread = [1, 5, 2, 8, 3, 9, 4]
    ci = stats.bootstrap_diff_ci(spread, [v + 10 for v in spread])
    assert ci == stats.bootstrap_diff_ci(spread, [v + 10 for v in spread])   # seeded
    assert ci[0] < 10 < ci[1]


def test_answers_of_one_kind_with_other_numbers_are_not_marked():
    assert label_kind("fast (~96 ms)") == label_kind("fast (~250 ms)") == "fast"
    assert label_kind("periodic (~64 ms between checks)") == "periodic"
    assert label_kind("high spread; low clustered") == "high spread; low clustered"


def test_config_params_are_the_suite_sweeps_and_real_parameters():
    from harmony.experiments import get_experiment
    from harmony.suite import SWEEPS
    for exp, (param, _, _) in SWEEPS.items():
        assert param in CONFIG_PARAMS[exp]
    for exp, names in CONFIG_PARAMS.items():
        have = {p.name for p in get_experiment(exp).all_params()}
        assert set(names) <= have


# ------------------------------------------------------------------------- thesis-2011

def test_thesis_reference_loads_and_every_figure_maps_to_a_declared_key():
    from harmony.analysis import policy, reference
    from harmony.experiments import get_experiment, summary_key
    refs = reference.resolve("thesis-2011")
    assert [r.name for r in refs] == ["thesis-2011:o1", "thesis-2011:cfs", "thesis-2011:bfs"]
    assert [r.scheduler for r in refs] == ["O(1)", "CFS", "BFS"]
    assert reference.names() == ["thesis-2011"] + [r.name for r in refs]
    data = json.loads((Path(reference.__file__).parent / "data" / "thesis-2011.json").read_text())
    assert len(data["figures"]) == sum(len(r.figures) for r in refs) > 40
    for fig in data["figures"]:
        assert summary_key(fig["key"], fig["experiment"]) == fig["key"]
        declared = {m.name: m for m in get_experiment(fig["experiment"]).summary}[fig["key"]]
        assert declared.kind in ("int", "float", "bool")
        assert fig["statistic"] in reference.RUN_STATISTIC \
            and fig["statistic"] in data["statistics"]
        assert fig["where"][0].isdigit() and isinstance(fig["value"], (int, float))
        assert fig["note"], fig       # where it comes from and how it maps
    assert all(x["why"] and x["where"] for x in data["not_mapped"])
    qids = [q for q, _, _ in policy.QUESTIONS]
    for r in refs:
        assert [a.qid for a in r.card.answers] == qids and all(a.decided for a in r.card.answers)
        assert r.card.runs == 0 and r.card.cpus == [4] and r.cpus == 4
        assert r.card.answer("balances").numbers["Table 7.1"].startswith("O(1), BFS, and CFS")
    labels = {r.scheduler: r.card.labels() for r in refs}
    assert [labels[s]["how_many"] for s in ("O(1)", "CFS", "BFS")] == \
        ["poly-balance", "pairwise", "global-queue"]
    assert [labels[s]["affinity"] for s in ("O(1)", "CFS", "BFS")] == ["strong", "moderate", "weak"]
    # the O(1) first round at x = 20 on 4 CPUs: poly-balance's x/P
    o1 = refs[0]
    fig = next(f for f in o1.figures if f.key == "first_round_moved" and f.params == {"x": 20})
    assert (fig.value, fig.statistic, fig.where) == (5.0, "typical", "6.3, figure 6.6")


def test_the_reference_file_ships_with_the_package():
    import configparser
    from harmony.analysis import reference
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    globs = cfg["options.package_data"]["harmony.analysis"].split()
    package = Path(reference.__file__).parent      # analysis/, installed as harmony.analysis
    shipped = {p.name for g in globs for p in package.glob(g)}
    assert set(reference.REFERENCES.values()) <= shipped


def test_runs_against_the_thesis_are_points_in_the_figures_statistic(five_runs):
    cmp = compare([five_runs["poly"], "thesis-2011"])
    src = df_sources(cmp)
    assert list(src["source"]) == [str(five_runs["poly"]), "thesis-2011:o1", "thesis-2011:cfs",
                                   "thesis-2011:bfs"]
    assert list(src["kind"]) == ["runs", "reference", "reference", "reference"]
    assert src["setup"].iloc[2] == "2.6.32.21-168.fc12.x86_64, CFS" and src["runs"].iloc[2] == 0
    answers = df_compare(cmp).set_index(["qid", "source"])["label"]
    assert answers["how_many", "thesis-2011:o1"] == answers["how_many", str(five_runs["poly"])]
    assert answers["how_many", "thesis-2011:cfs"] == "pairwise"
    df = df_metric_differences(cmp)
    assert set(df["pair"]) == {"B vs A", "C vs A", "D vs A"}
    points = df[df["source_b"].str.startswith("thesis-2011")]
    assert (points["verdict"] == "point").all() and not points["differs"].any()
    assert points["ci_low"].isna().all() and points["effect"].isna().all()
    assert (points["n_b"] == 0).all() and (points["n_a"] > 0).all()
    # poly-balance's first round at x = 20 on 4 CPUs is O(1)'s: the thesis's x/4
    r = _row(df, "how-many P=4 x=20", "first_round_moved")
    assert (r.value_a, r.value_b, r["diff"], r.statistic, r.n_a) == (5, 5, 0, "median", 2)
    assert r.note.startswith("6.3, figure 6.6 (typical, 10 runs): ")
    # the thesis's figure of CFS is the lowest share of any run: compared with the lowest run
    r = _row(df, "intrinsic-imbalance P=4", "share_ratio_min", "C vs A")
    runs = [json.loads(p.read_text())["share_ratio_min"]
            for p in (five_runs["poly"] / "intrinsic-imbalance").glob("rep-*/summary.json")]
    assert r.statistic == "min" and r.value_a == pytest.approx(min(runs))
    assert r.value_b == 0.8125 and r["diff"] == pytest.approx(0.8125 - min(runs))
    # O(1) keeps affinity with an intrinsic imbalance: 3 tasks a CPU each, 2 share one (0.625)
    r = _row(df, "intrinsic-imbalance P=4", "share_ratio_min")
    assert r.value_a == pytest.approx(0.625, abs=0.01)
    # figures of configurations the runs did not measure are said, not hidden
    assert any(line.startswith("B vs A: 21 of thesis-2011:o1's 25 figures match no configuration")
               for line in unmatched(cmp))


def test_the_reference_may_come_first_and_stand_alone(five_runs):
    cmp = compare(["thesis-2011:cfs", five_runs["poly"]])
    r = _row(df_metric_differences(cmp), "intrinsic-imbalance P=4", "migrations_per_s")
    assert (r.value_a, r.statistic, r.n_a, r.n_b) == (23, "mean", 0, 2)
    assert r["diff"] == pytest.approx(r.value_b - 23)
    # the thesis alone: its schedulers against O(1), figure against figure
    cmp = compare(["thesis-2011"])
    df = df_metric_differences(cmp)
    r = df[(df["pair"] == "B vs A") & (df["metric"] == "interval1_ms")
           & (df["statistic"] == "median")]
    assert list(r["diff"]) == [210.5 - 248]
    text = compare_text(cmp)
    assert "A  thesis-2011:o1: reference, no runs" in text
    assert "* 4 time_to_balance" in text and "  5 work_conserving" in text


def test_cli_against_the_thesis_and_bad_references(five_runs, tmp_path):
    poly = five_runs["poly"]
    r = invoke("compare", poly, "thesis-2011:cfs")
    assert r.exit_code == 0, r.output
    assert "B  thesis-2011:cfs: reference, no runs" in r.output
    line = next(ln for ln in r.output.splitlines() if "migrations_per_s" in ln)
    assert "point" in line and "7.1, figure 7.2 (mean, 25 runs)" in line
    r = invoke("compare", poly, "thesis-2011:cfs", "--json")
    data = json.loads(r.output)
    assert {m["verdict"] for m in data["metrics"]} == {"point"}
    assert all(m["ci_low"] is None for m in data["metrics"])
    for bad, says in (("thesis-2011:zz", "thesis-2011:zz: thesis-2011 has no scheduler 'zz' "
                                         "(it has: o1, cfs, bfs)"),
                      ("thesis-2099", "thesis-2099: no such directory (nor a reference: "
                                      "thesis-2011, thesis-2011:o1")):
        r = invoke("compare", poly, bad)
        assert r.exit_code == 1 and says in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    r = invoke("compare", "thesis-2011:cfs", "thesis-2011:cfs")
    assert r.exit_code == 2 and "given twice" in r.output
    r = invoke("compare", poly, "thesis-2011", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "figures" / "differences.png").stat().st_size > 10_000
    assert "figures/differences.png" in (tmp_path / "out" / "compare.md").read_text()


# -------------------------------------------------- the marker's thresholds, below, at and above

#: runs of two sources that differ: medians 12.5 and 16.5, the interval +1.5 .. +6.5, Cliff's
#: delta 8/9, a shift of 4 / 16.5 = 0.24 of the larger value
RUNS_A, RUNS_B = [10, 11, 12, 13, 14, 15], [14, 15, 16, 17, 18, 19]


def _with(monkeypatch, name, value):
    from harmony.analysis import thresholds as T
    monkeypatch.setattr(T, name, value)
    from harmony.analysis.compare import runs_difference
    return runs_difference(RUNS_A, RUNS_B)


#: (threshold, what the example measures against it, the example's value, what the rule gives,
#: (with the threshold below the value, at it, above it)); tests/test_policy_rules.py counts these
#: among the thresholds tested
COMPARE_CASES = [
    ("COMPARE_MIN_RUNS", "runs a side", 6, lambda r: r["verdict"],
     ("differs", "differs", "too few runs")),
    ("COMPARE_EFFECT_LARGE", "|Cliff's delta|", 8 / 9, lambda r: (r["apart"], r["magnitude"]),
     ((True, "large"), (True, "large"), (False, "medium"))),
    ("COMPARE_EFFECT_MEDIUM", "|Cliff's delta| (large set above 1)", 8 / 9,
     lambda r: r["magnitude"], ("medium", "medium", "small")),
    ("COMPARE_EFFECT_SMALL", "|Cliff's delta| (large and medium set above 1)", 8 / 9,
     lambda r: r["magnitude"], ("small", "small", "negligible")),
    ("COMPARE_MIN_RELATIVE", "|B - A| / the larger median", 4 / 16.5, lambda r: r["apart"],
     (True, False, False)),
    ("COMPARE_LEVEL", "the level at which the interval's lower end reaches 0", 0.999,
     lambda r: r["apart"], (True, False, False)),
]


@pytest.mark.parametrize("name,what,value,rule,want", COMPARE_CASES,
                         ids=[f"{c[0]}: {c[1]}" for c in COMPARE_CASES])
def test_each_compare_threshold_below_at_and_above(monkeypatch, name, what, value, rule, want):
    from harmony.analysis import thresholds as T
    if name == "COMPARE_EFFECT_MEDIUM":
        monkeypatch.setattr(T, "COMPARE_EFFECT_LARGE", 1.5)
    if name == "COMPARE_EFFECT_SMALL":
        monkeypatch.setattr(T, "COMPARE_EFFECT_LARGE", 1.5)
        monkeypatch.setattr(T, "COMPARE_EFFECT_MEDIUM", 1.2)
    if name == "COMPARE_MIN_RUNS":
        got = tuple(rule(_with(monkeypatch, name, n)) for n in (value - 1, value, value + 1))
    elif name == "COMPARE_LEVEL":       # 0.999: the lower end is -0.00025, just below 0
        got = tuple(rule(_with(monkeypatch, name, v)) for v in (0.95, value, 0.9999))
    else:
        got = tuple(rule(_with(monkeypatch, name, v)) for v in (value * 0.99, value, value * 1.01))
    assert got == want, f"{name} ({what})"


def test_the_chance_rate_is_what_the_text_expects(five_runs, monkeypatch):
    from harmony.analysis import thresholds as T
    cmp = compare([five_runs["poly"], five_runs["pair"]])
    df = df_metric_differences(cmp)
    pool = df[df["verdict"].isin(["differs", "within noise"]) & (df["ci_low"] != df["ci_high"])]
    assert len(pool) > 0
    monkeypatch.setattr(T, "COMPARE_CHANCE_RATE", 0.5)
    text = " ".join(compare_text(cmp).split())
    assert (f"of the {len(pool)} metric rows here with enough runs whose runs vary, "
            f"{int(pool['differs'].sum())} are marked; about {0.5 * len(pool):.1f} would be by "
            "chance") in text


# ------------------------------------------------------- the gate for CI: --fail-on-difference

def test_the_gate_fails_on_a_marked_metric_and_passes_a_policy_against_itself(five_runs):
    poly, pair, again = five_runs["poly"], five_runs["pair"], five_runs["poly-again"]
    r = invoke("compare", poly, pair, "--fail-on-difference", "--metric", "first_round_moved",
               "--json")
    assert r.exit_code == 1, r.output
    data = json.loads(r.stdout)
    failing = data["gate"]["metrics_failing"]
    assert [(m["config"], m["metric"], m["verdict"]) for m in failing] == \
        [("how-many P=4 x=10", "first_round_moved", "differs")]
    assert data["gate"]["failed"] and data["gate"]["metrics"] == ["first_round_moved"]
    # the same metric pinned to its experiment; and one policy against itself passes
    r = invoke("compare", poly, pair, "--fail-on-difference", "--metric",
               "how-many:first_round_moved")
    assert r.exit_code == 1 and "gate: FAILED" in r.output
    assert "differs beyond noise: how-many P=4 x=10 first_round_moved: 2 -> 5" in r.output
    r = invoke("compare", poly, again, "--fail-on-difference", "--metric", "first_round_moved")
    assert r.exit_code == 0 and "gate: passed" in r.output, r.output
    # by default the answers: 5 runs of how-many decide nothing over its 3 labels, so the
    # gate cannot fail on them, and says so
    r = invoke("compare", poly, pair, "--fail-on-difference")
    assert r.exit_code == 0, r.output
    assert "gate: passed (9 questions)" in r.output and "could not fail on 1 answers" in r.output


def test_the_gate_fails_on_answers_decided_differently():
    """Answers decided on both sides with labels of different kinds fail the gate; a decided
    answer against an undecided one does not (hand-made evidence: 7 runs decide over 3 labels)."""
    from harmony.analysis import policy
    from harmony.analysis.compare import Comparison, gate

    def runs(moved, n, src):
        return [policy.Evidence(Path(f"/{src}/rep-{k}"), "how-many", {"x": 16}, 4,
                                {"first_round_moved": moved, "poly_prediction": 4.0,
                                 "pairwise_prediction": 8.0}, setup=src) for k in range(n)]

    def cmp_of(*sides):
        ev = [runs(*side) for side in sides]
        return Comparison([s[2] for s in sides], [policy.infer_evidence(e) for e in ev], ev)

    g = gate(cmp_of((4, 7, "a"), (8, 7, "b")))
    assert g["failed"] and [(r["qid"], r["label"]) for r in g["answers_failing"]] == \
        [("how_many", "pairwise")] and g["metrics_failing"] == []
    g = gate(cmp_of((4, 7, "a"), (8, 3, "b")))         # B's 3 runs decide nothing
    assert not g["failed"] and g["answers_open"] == 1
    g = gate(cmp_of((4, 7, "a"), (4, 9, "b")), questions=["3"])
    assert not g["failed"] and g["questions"] == ["how_many"] and g["answers_open"] == 0


def test_the_gate_refuses_unknown_names_before_anything(five_runs):
    poly, pair = five_runs["poly"], five_runs["pair"]
    for args, says in ((("--metric", "no_such_key"), "unknown metric 'no_such_key'"),
                       (("--metric", "detection:first_round_moved"),
                        "unknown metric 'detection:first_round_moved'"),
                       (("--question", "how_much"), "unknown question 'how_much'"),
                       (("--question", "10"), "unknown question '10'")):
        r = invoke("compare", poly, pair, "--fail-on-difference", *args)
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    r = invoke("compare", poly, pair, "--metric", "first_round_moved")
    assert r.exit_code == 2 and "--fail-on-difference" in r.output


def test_answers_by_level_are_wrapped_never_cut(monkeypatch):
    """The answers by level and the predictions' verdicts: whole when piped (each column as
    wide as its longest entry), wrapped within their column on a narrow screen, never cut."""
    import types

    from harmony.analysis import compare as C
    long = "not applicable (global queue: nothing to balance between the CPUs)"
    lv = pd.DataFrame({"qid": "how_many", "level": "llc", "source": ["a", "b"],
                       "label": [long, "pairwise"], "kind": ["n/a", "answer"],
                       "differs": True})
    pr = pd.DataFrame({"check": "balance period", "level": "llc", "source": ["a", "b"],
                       "verdict": ["holds", "fails in 3 of 4 runs at this level"], "runs": 4})
    monkeypatch.setattr(C, "df_compare_levels", lambda cmp: lv)
    monkeypatch.setattr(C, "df_compare_predictions", lambda cmp: pr)
    cmp = types.SimpleNamespace(sources=["a", "b"])
    piped = C.levels_text(cmp)
    assert any(long in line for line in piped)
    assert any("fails in 3 of 4 runs at this level" in line for line in piped)
    narrow = C.levels_text(cmp, 70)
    assert not any(long in line for line in narrow)          # wrapped...
    words = " ".join(" ".join(line.split()) for line in narrow).split()
    for w in long.split() + "fails in 3 of 4 runs at this level".split():
        assert w in words                                     # ...never cut
