"""harmony compare: one policy card per directory, side by side, never pooled (simulated runs)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from harmony.analysis.compare import compare, compare_text, df_compare, df_sources
from harmony.cli import main
from harmony.store import RunError


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
            r = invoke("simulate", "--policy", policy, "--cpus", 4, "--experiment", "how-many",
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
    assert list(df.columns) == ["qid", "question", "thesis", "source", "label", "decided", "votes",
                                "differs"]
    assert len(df) == 2 * 9
    how = df[df["qid"] == "how_many"].set_index("source")
    assert how.loc[str(poly), "label"] == "poly-balance"
    assert how.loc[str(pair), "label"] == "pairwise"
    assert how["differs"].all() and how["decided"].all()
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
    assert "* 3 how_many" in md and "![each source's runs](figures/compare.png)" in md
    data = json.loads((out / "compare.json").read_text())
    assert len(data["answers"]) == 18 and len(data["sources"]) == 2
    assert (out / "figures" / "compare.png").stat().st_size > 10_000


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


def test_bad_directories_exit_2_naming_them(two_policies, tmp_path):
    poly, _ = two_policies
    r = invoke("compare", poly)
    assert r.exit_code == 2 and "two directories or more" in r.output
    r = invoke("compare", poly, tmp_path / "missing")
    assert r.exit_code == 2 and f"{tmp_path / 'missing'}: no such directory" in r.output
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for command in (["compare", poly, a_file], ["infer", a_file]):
        r = invoke(*command)
        assert r.exit_code == 2 and f"{a_file}: not a directory" in r.output, r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke("compare", poly, empty)
    assert r.exit_code == 2 and f"{empty}: no complete run" in r.output
    assert "Traceback" not in r.output
    with pytest.raises(RunError):
        compare([poly])
    r = invoke("compare", poly, poly.parent / ".." / poly.parent.name / poly.name)
    assert r.exit_code == 2 and "given twice" in r.output and "Traceback" not in r.output
