"""The experiments' declared contract, checked without root: summary keys and parameters.

Every experiment of the catalog runs in the reference-policy simulator
(:func:`harmony.simulate.execute`: real run directories through the real pipeline, no figures)
under each reference policy on 2 and 4 CPUs, once long enough to show its effect and once cut
short (so that what is not measurable reads None). ``analyse`` must return exactly the keys the
experiment declares (``Experiment.summary``), each value of its declared kind, None only where
the declaration says when; the static-ideal companions of the paired experiments too.

Every parameter (``Experiment.params`` and the common ones) is listed, with its default on this
host's CPU count, by ``harmony run EXP --help`` and ``harmony list -v``.
"""

import json

import pytest
from click.testing import CliRunner

from harmony.analysis import compare, policy, refpolicy
from harmony.cli import main
from harmony.cli.measure import PARAM_METAVARS
from harmony.core import osutil
from harmony.experiments import CATALOG, Metric, get_experiment, summary_key
from harmony.experiments.base import UNITS
from harmony.simulate import execute

#: runs that show each experiment's effect in the simulator, and runs cut short, where rounds,
#: balance and windows do not happen (their keys then read None)
RUNS = {
    "single-source": ({"duration": "0.5"}, {"duration": "0.005"}),
    "how-many": ({"duration": "0.5"}, {"duration": "0.005"}),
    "time-to-resolve": ({"duration": "0.5"}, {"duration": "0.005"}),
    "work-conservation": ({"duration": "1", "idle_from_s": "0.3", "idle_to_s": "0.6"},
                          {"duration": "0.2", "idle_at_s": "0.19"}),
    "detection": ({"duration": "1", "cut_from_s": "0.3", "cut_to_s": "0.6"},
                  {"duration": "0.2", "cut_at_s": "0.199"}),
    "intrinsic-imbalance": ({"duration": "1", "warmup_s": "0.5"},
                            {"duration": "0.02", "warmup_s": "0.019"}),
    "heavy-light": ({"duration": "1", "long_warmup_s": "0.5", "short_warmup_s": "0.2",
                     "short_s": "0.3"},
                    {"duration": "0.5", "long_warmup_s": "0.49", "short_warmup_s": "0.2",
                     "short_s": "0.3"}),
    "priority-classes": ({"duration": "1", "long_warmup_s": "0.5", "short_warmup_s": "0.2",
                          "short_s": "0.3"},
                         {"duration": "0.5", "long_warmup_s": "0.49", "short_warmup_s": "0.2",
                          "short_s": "0.3"}),
    "proportional": ({"duration": "0.5"}, {"duration": "0.005"}),
    "spread": ({"duration": "0.5", "settle_s": "0.2"}, {"duration": "0.02", "settle_s": "0.01"}),
}

#: declared keys no simulated run gives a value: a simulated CPU whose last task exits pulls a task
#: from another before it switches away (newidle balance), so it never runs its idle task first
NEVER_SIMULATED = {("work-conservation", "cpu_idle_at_s")} | {
    # valued on a machine with SMT threads, several LLCs, packages or nodes, which the runs
    # here (one LLC of 2 or 4 CPUs) do not have: tests/test_levels.py checks them on machines
    ("spread", key) for key in ("cores_before_siblings", "node_difference", "first_smt_s",
                                "first_package_s", "first_node_s", "first_remote_s")}
#: declared keys of every experiment no simulated run gives a value: none (the simulator's machine
#: has scheduling domains: harmony.analysis.machines)
NEVER_SIMULATED_ANY: set = set()


#: experiments the simulator cannot run (Experiment.not_simulated), checked on real kernels
NOT_SIMULATED = {"server"}


def test_every_experiment_of_the_catalog_is_simulated_here():
    assert set(RUNS) == set(CATALOG) - NOT_SIMULATED
    assert {n for n in CATALOG if get_experiment(n).not_simulated} == NOT_SIMULATED


def test_an_experiment_the_simulator_cannot_run_is_refused_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["simulate", "--policy", "poly-balance", "--experiment", "server",
                                  "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "server cannot be simulated: its tasks serve requests" in r.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", list(RUNS))
def test_analyse_returns_exactly_the_declared_summary(tmp_path, name):
    exp = get_experiment(name)
    valued = set()
    k = 0
    for overrides in RUNS[name]:
        for pol in refpolicy.POLICIES:
            for ncpus in (2, 4):
                k += 1
                cpus = list(range(ncpus))
                run = execute(refpolicy.get_policy(pol), exp, exp.resolve(overrides, cpus), cpus,
                              tmp_path / f"r{k}", seed=k, figures=False)
                runs = [run] + ([run.companion(c) for c in exp.companions(run.manifest["params"])])
                for r in runs:
                    summary = exp.summarise(r)
                    where = f"{pol} on {ncpus} CPUs, {overrides}, {r.path.name}"
                    assert exp.summary_problems(summary) == [], where
                    json.dumps(summary, allow_nan=False)   # what summary.json holds, no NaN
                    assert r.summary == json.loads(json.dumps(summary))  # as the pipeline stored it
                    valued |= {key for key, v in summary.items() if v is not None}
    # every declared kind was checked on a value at least once
    missing = ({m.name for m in exp.declared} - valued - NEVER_SIMULATED_ANY
               - {key for e, key in NEVER_SIMULATED if e == name})
    assert not missing, f"{name}: no simulated run gave a value to {sorted(missing)}"


@pytest.mark.parametrize("name", list(CATALOG))
def test_declarations_are_well_formed(name):
    exp = get_experiment(name)
    names = [m.name for m in exp.summary]
    assert names and len(names) == len(set(names)), names
    for m in exp.summary:
        assert m.unit in UNITS or m.kind == "dict", m
        assert m.help, m


def test_a_summary_that_departs_from_the_declaration_says_how():
    exp = get_experiment("work-conservation")
    good = {m.name: None if m.none_when else {"int": 1, "float": 0.5, "bool": True,
                                              "str": "balance", "dict": {}}[m.kind]
            for m in exp.declared}
    assert exp.summary_problems(good) == []
    bad = dict(good, ncpus=2.0, stolen=1, migrations=None, extra=3)
    del bad["idle_at_s"]
    assert exp.summary_problems(bad) == [
        "work-conservation: idle_at_s is declared but missing",
        "work-conservation: extra is not declared",
        "work-conservation: ncpus = 2.0 (float) is not of kind int",
        "work-conservation: stolen = 1 (int) is not of kind bool",
        "work-conservation: migrations is None, which it is declared never to be",
    ]
    assert Metric("x", "s", "a time").check(True) == "x = True (bool) is not of kind float"
    assert Metric("x", "s", "a time").check(3) is None      # an int is a float
    with pytest.raises(ValueError, match="unit 'parsecs'"):
        Metric("x", "parsecs", "a distance")


def test_keys_are_named_through_the_declarations():
    assert summary_key("steal_latency_s", "work-conservation") == "steal_latency_s"
    with pytest.raises(ValueError, match="detection declares no summary key 'steal_latency_s'"):
        summary_key("steal_latency_s", "work-conservation", "detection")
    with pytest.raises(ValueError, match="unknown experiment"):
        summary_key("steal_latency_s", "no-such")
    # what the card and compare read: each key declared by the experiment it is read from
    for exp, key in policy.AFFINITY_SOURCES \
            + tuple((e, k) for e, k, _, _ in compare.FIGURE_METRICS):
        assert key in {m.name for m in get_experiment(exp).summary}, (exp, key)


# ------------------------------------------------------------------------------------ parameters

def _help_text(monkeypatch, *args, ncpus=4):
    """What ``harmony ARGS`` prints, white space folded, on a host with ``ncpus`` online CPUs."""
    monkeypatch.setattr(osutil, "online_cpus", lambda: list(range(ncpus)))
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, " ".join(r.output.split())


def test_run_help_lists_the_experiments_parameters_with_defaults(monkeypatch):
    code, text = _help_text(monkeypatch, "run", "single-source", "--help")
    assert code == 0
    assert "Parameters of single-source (-p KEY=VALUE):" in text
    assert "tolerance FLOAT balanced when every run queue is within this fraction of N/P " \
           "[default: 0.15]" in text
    assert "layout INTEGER,... tasks per CPU of the set at t0 (default 2P on the first CPU, " \
           "others idle) [default: 8,0,0,0 with P = 4]" in text
    assert "given for P = 4, this host's online CPUs" in text
    # the common parameters too, after the experiment's own
    section = text[text.index("Parameters of"):]
    assert section.index("tolerance FLOAT") < section.index("duration FLOAT") \
        < section.index("sample_hz")
    assert "sample_hz FLOAT rate of sampling" in section
    # the experiment may be named after the option, or with other options around it
    assert _help_text(monkeypatch, "run", "--help", "--cpus", "0", "single-source")[1] == text


@pytest.mark.parametrize("name", list(CATALOG))
def test_every_parameter_is_listed_by_run_help_and_list_v(monkeypatch, name):
    exp = get_experiment(name)
    _, text = _help_text(monkeypatch, "run", name, "-h", ncpus=2)
    _, listed = _help_text(monkeypatch, "list", "-v", ncpus=2)
    section = f"Parameters of {name} (-p KEY=VALUE):"
    assert section in text and section in listed
    mine = listed[listed.index(section):]
    for p in exp.all_params():
        row = f"{p.name} {PARAM_METAVARS[p.kind]} {' '.join(p.help.split())}"
        default = f"[default: {p.format(p.default_for(2))}"
        assert row in text and row in mine, row
        assert default in text[text.index(row):], (p.name, default)
        assert default in mine[mine.index(row):], (p.name, default)


def test_run_help_without_an_experiment_lists_the_catalog(monkeypatch):
    code, text = _help_text(monkeypatch, "run", "--help")
    assert code == 0 and "Parameters of" not in text
    assert all(name in text for name in CATALOG)
    assert "harmony run EXPERIMENT --help lists its parameters" in text


def test_run_help_of_an_unknown_experiment_is_the_usual_error(monkeypatch):
    code, text = _help_text(monkeypatch, "run", "no-such", "--help")
    assert code == 2 and "Parameters of" not in text
    assert "Error: Invalid value for EXPERIMENT: unknown experiment 'no-such'" in text
    assert _help_text(monkeypatch, "run", "no-such")[1] == text   # as without --help


@pytest.mark.parametrize("name", list(CATALOG))
def test_defaults_read_back_and_their_rule_is_in_the_help(name):
    for p in get_experiment(name).all_params():
        if p.scales:    # a default that depends on P says how in its help
            assert "(default " in p.help and "P" in p.help, p
        for ncpus in (2, 4, 8):
            value = p.default_for(ncpus)
            assert p.parse(p.format(value)) == value, (p.name, value)
