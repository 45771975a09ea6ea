"""Reference sources: published figures that ``harmony compare`` sets against measured runs.

A reference is a source without runs: its figures are points (one number each, with the
statistic it is: a median, a mean, the maximum of the runs...) and its card is the answers its
authors gave. One ships with Harmony:

``thesis-2011``
    Meehan's thesis (chapters 6-7; ``analysis/data/thesis-2011.json``): O(1) (2.6.18, RHEL 5.5),
    CFS (2.6.32, Fedora 12) and BFS (2.6.32-bfs.313) on one quad-core Xeon at HZ=1000. Every
    figure names the summary key it maps onto (checked against the experiment's declaration when
    the file is loaded), the thesis's section/table/figure it comes from and a note where the
    mapping is approximate or Harmony's defaults differ from the thesis's set-up; figures the
    thesis gives in a form no summary key holds are listed under ``not_mapped`` with the reason.
    Its cards are Table 7.1's answers in the card's labels.

``thesis-2011`` names all three schedulers (three sources); ``thesis-2011:o1``, ``:cfs`` or
``:bfs`` one. :func:`resolve` turns such a name into :class:`Reference` objects.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources

from harmony.analysis import policy
from harmony.experiments import get_experiment, summary_key
from harmony.store import RunError

#: the references shipped in harmony/analysis/data/, by name
REFERENCES = {"thesis-2011": "thesis-2011.json"}

#: the statistic of a reference figure -> the statistic of a source's runs it is compared with
#: (each file's "statistics" says what its words mean)
RUN_STATISTIC = {"median": "median", "mean": "mean", "min": "min", "max": "max",
                 "typical": "median", "approx": "median", "one run": "median"}


@dataclasses.dataclass(frozen=True)
class Figure:
    """One published number: ``key`` of ``experiment`` (a declared summary key) was ``value``, as
    the ``statistic`` of the authors' runs (:data:`RUN_STATISTIC`), in the configurations whose
    parameters match ``params`` (a value, or [low, high] inclusive; {}: every configuration)."""

    experiment: str
    key: str
    value: float
    statistic: str
    where: str
    note: str = ""
    params: dict = dataclasses.field(default_factory=dict)
    runs: int | None = None

    def matches(self, params: dict) -> bool:
        """Whether a configuration with these parameter values is one this figure describes."""
        for name, want in self.params.items():
            have = params.get(name)
            if have is None:
                return False
            if isinstance(want, list):
                if not want[0] <= have <= want[1]:
                    return False
            elif have != want:
                return False
        return True

    @property
    def config_text(self) -> str:
        return ", ".join(f"{k}={v[0]}..{v[1]}" if isinstance(v, list) else f"{k}={v}"
                         for k, v in self.params.items())


@dataclasses.dataclass
class Reference:
    """One scheduler of a reference: its figures and its card."""

    name: str              # as given to compare: "thesis-2011:cfs"
    cite: str              # where the figures come from, short: "Meehan 2011, chapters 6-7"
    title: str             # ... in full
    scheduler: str         # "CFS"
    kernel: str
    system: str
    machine: str
    cpus: int
    figures: list[Figure]
    card: policy.Card

    @property
    def setup(self) -> str:
        """The setup as :func:`harmony.analysis.policy.setup_of` words a run's: "<kernel>,
        <scheduler>"."""
        return next(iter(self.card.setups))


def names() -> list[str]:
    """Every name :func:`resolve` accepts."""
    out = []
    for ref in REFERENCES:
        out += [ref] + [f"{ref}:{s}" for s in _load(ref)["schedulers"]]
    return out


def is_reference(spec: str) -> bool:
    """Whether ``spec`` names a reference (known or not): ``NAME`` of :data:`REFERENCES` or
    ``NAME:SCHEDULER``."""
    return str(spec).partition(":")[0] in REFERENCES


def resolve(spec: str) -> list[Reference]:
    """The references ``spec`` names: "thesis-2011" (every scheduler, in the file's order) or
    "thesis-2011:cfs". RunError (one line, naming what exists) for an unknown one."""
    name, _, which = str(spec).partition(":")
    if name not in REFERENCES:
        raise RunError(f"{spec}: no such reference (known: {', '.join(names())})")
    data = _load(name)
    if which and which not in data["schedulers"]:
        raise RunError(f"{spec}: {name} has no scheduler {which!r} (it has: "
                       f"{', '.join(data['schedulers'])})")
    return [_reference(name, data, s) for s in ([which] if which else data["schedulers"])]


def not_mapped(name: str) -> list[dict]:
    """What the reference ``name`` reports that maps onto no summary key, and why (where, what,
    why)."""
    return list(_load(name).get("not_mapped", []))


@functools.cache
def _load(name: str) -> dict:
    """The reference file, checked: every figure's experiment, key (declared by the experiment),
    scheduler and statistic known, every parameter it selects one its experiment has, and a card
    answer for every question. ValueError naming the file and the entry otherwise (a packaging
    defect, not a user's input)."""
    fname = REFERENCES[name]
    where = f"harmony/analysis/data/{fname}"
    try:
        data = json.loads(resources.files("harmony.analysis").joinpath("data", fname).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read the reference ({exc})") from None
    scheds = data["schedulers"]
    qids = [q for q, _, _ in policy.QUESTIONS]
    for k, fig in enumerate(data["figures"]):
        what = (f"{where}: figure {k} ({fig.get('scheduler')} {fig.get('experiment')} "
                f"{fig.get('key')})")
        if fig.get("scheduler") not in scheds:
            raise ValueError(f"{what}: unknown scheduler (the file has {', '.join(scheds)})")
        if fig.get("statistic") not in RUN_STATISTIC:
            raise ValueError(f"{what}: unknown statistic (known: {', '.join(RUN_STATISTIC)})")
        summary_key(fig["key"], fig["experiment"])          # ValueError naming the experiment
        params = {p.name for p in get_experiment(fig["experiment"]).all_params()}
        unknown = sorted(set(fig.get("params", {})) - params)
        if unknown:
            raise ValueError(f"{what}: {fig['experiment']} has no parameter {', '.join(unknown)}")
        if not isinstance(fig.get("value"), (int, float)):
            raise ValueError(f"{what}: value {fig.get('value')!r} is not a number")
    for s in scheds:
        missing = [q for q in qids if q not in data["card"].get(s, {})]
        if missing:
            raise ValueError(f"{where}: the card of {s} has no answer to {', '.join(missing)}")
    return data


def _reference(name: str, data: dict, which: str) -> Reference:
    info = data["schedulers"][which]
    figures = [Figure(f["experiment"], f["key"], float(f["value"]), f["statistic"], f["where"],
                      f.get("note", ""), dict(f.get("params", {})), f.get("runs"))
               for f in data["figures"] if f["scheduler"] == which]
    setup = f"{info['kernel']}, {info['scheduler']}"
    return Reference(f"{name}:{which}", data["cite"], data["title"], info["scheduler"],
                     info["kernel"], info["system"], data["machine"], int(data["cpus"]), figures,
                     _card(data, which, setup, int(data["cpus"])))


def _card(data: dict, which: str, setup: str, cpus: int) -> policy.Card:
    """The reference's answers as a card without runs (``runs`` 0, no experiments): each label
    with Table 7.1's sentence (and the mapping's note) as its numbers."""
    answers = []
    for qid, question, thesis in policy.QUESTIONS:
        given = data["card"][which][qid]
        numbers = {"Table 7.1": data["table_7_1"][qid]}
        if given.get("note"):
            numbers["note"] = given["note"]
        answers.append(policy.Answer(qid, question, thesis, label=given["label"], numbers=numbers))
    return policy.Card(answers=answers, runs=0, experiments={}, skipped=[], cpus=[cpus],
                       setups={setup: 0})
