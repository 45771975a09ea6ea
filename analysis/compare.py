"""Policy cards side by side: the thesis's questions answered on several hosts, kernels or
schedulers (``harmony compare``).

Each directory given (a run, batch or suite directory, or a folder of them) is one *source*, and
its complete runs make one card, as ``harmony infer DIR`` would make it
(:func:`harmony.analysis.policy.infer`). Cards are never pooled across sources: a card of runs
from two schedulers would only say "undecided" where they differ.

:func:`df_compare` lines the answers up (one row per question and source), :func:`df_sources`
says what each source is, :func:`compare_text` prints both as tables, marking the questions whose
answers differ.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from harmony import store
from harmony.analysis import policy

NO_EVIDENCE = "no evidence"


@dataclasses.dataclass
class Comparison:
    sources: list[str]          # the directories, as given
    cards: list[policy.Card]    # one per source, in the same order


def compare(paths) -> Comparison:
    """One card per directory of ``paths`` (at least two); RunError naming a directory that does
    not exist or holds no complete run."""
    paths = [str(p) for p in paths]
    if len(paths) < 2:
        raise store.RunError("compare needs two directories or more")
    cards = []
    for p in paths:
        card = policy.infer([p])
        if not card.runs:
            raise store.RunError(f"{p}: no complete run")
        cards.append(card)
    return Comparison(paths, cards)


def df_sources(cmp: Comparison) -> pd.DataFrame:
    """What each source is. Columns: source (str: the directory as given), runs (int: complete runs
    used), skipped (int: runs not used, e.g. incomplete or on a busy host), cpus (str: their CPU
    counts, "2" or "2/4"), setup (str: "<kernel>, <scheduler>", several joined by "; " when the
    directory mixes them, :func:`harmony.analysis.policy.setup_of`)."""
    return pd.DataFrame({
        "source": cmp.sources,
        "runs": [c.runs for c in cmp.cards],
        "skipped": [len(c.skipped) for c in cmp.cards],
        "cpus": ["/".join(map(str, c.cpus)) for c in cmp.cards],
        "setup": ["; ".join(c.setups) for c in cmp.cards],
    })


def df_compare(cmp: Comparison) -> pd.DataFrame:
    """The answers, one row per question (in the thesis's order) and source. Columns: qid (str),
    question (str), thesis (str: its section), source (str), label (str: the answer, "undecided",
    or "no evidence"), decided (bool: a label every run with one agreed on), votes (str: how the
    runs voted, "label: runs, ..."; "" without evidence), differs (bool: the sources' labels are
    not all the same; the same on every row of a question)."""
    rows = []
    for src, card in zip(cmp.sources, cmp.cards):
        for a in card.answers:
            rows.append({"qid": a.qid, "question": a.question, "thesis": a.thesis, "source": src,
                         "label": a.label if a.label is not None else NO_EVIDENCE,
                         "decided": a.decided,
                         "votes": ", ".join(f"{k}: {v}" for k, v in a.agreement.items())})
    df = pd.DataFrame(rows)
    df["differs"] = df.groupby("qid", sort=False)["label"].transform("nunique") > 1
    return df


def compare_text(cmp: Comparison, width: int = 34) -> str:
    """The two tables ``harmony compare`` prints: the sources, then each question's answer per
    source ("*": the answers differ), each label cut to ``width`` characters."""
    src = df_sources(cmp)
    names = [chr(ord("A") + k) if k < 26 else f"S{k}" for k in range(len(src))]
    out = ["sources:"]
    for n, row in zip(names, src.itertuples()):
        skipped = f", {row.skipped} not used" if row.skipped else ""
        runs = f"{row.runs} run{'s' if row.runs != 1 else ''}"
        out.append(f"  {n}  {row.source}: {runs} on {row.cpus or '?'} CPUs{skipped}; {row.setup}")
    out.append("")
    df = df_compare(cmp)
    table = df.pivot(index="qid", columns="source", values="label").loc[
        list(dict.fromkeys(df["qid"])), cmp.sources]
    differs = df.groupby("qid", sort=False)["differs"].first()
    qw = max(len(q) for q in table.index) + 2
    out.append(f"    {'question':<{qw}}" + "".join(f"{n:<{width + 2}}" for n in names).rstrip())
    for i, (qid, labels) in enumerate(table.iterrows(), 1):
        mark = "*" if differs[qid] else " "
        cells = "".join(f"{_cut(str(v), width):<{width + 2}}" for v in labels)
        out.append(f"{mark}{i:>2} {qid:<{qw}}" + cells.rstrip())
    n_diff = int(differs.sum())
    out += ["", f"{n_diff} of {len(table)} questions answered differently (*); "
                "`harmony infer DIR` gives the numbers and votes behind each answer"]
    return "\n".join(out) + "\n"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"
