"""Policy cards side by side: the thesis's questions answered on several hosts, kernels or
schedulers (``harmony compare``).

Each directory given (a run, batch or suite directory, or a folder of them) is one *source*, and
its complete runs make one card, as ``harmony infer DIR`` would make it
(:func:`harmony.analysis.policy.infer`). Cards are never pooled across sources: a card of runs
from two schedulers would only say "undecided" where they differ.

:func:`df_compare` lines the answers up (one row per question and source), :func:`df_sources`
says what each source is, :func:`compare_text` prints both as tables, marking the questions whose
answers differ; :func:`df_compare_runs` holds every run's metrics, :func:`plot_compare` draws
those behind the answers source by source, and :func:`write` stores all of it (``--out``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from harmony import store
from harmony.analysis import policy
from harmony.experiments import summary_key

NO_EVIDENCE = "no evidence"


#: the per-run metrics the comparison figure draws, one panel each: (experiment, summary key,
#: axis label, scale); each is what a card's answer is a median or a vote of. Each key is checked
#: at import against its experiment's declaration (:func:`harmony.experiments.summary_key`).
FIGURE_METRICS = tuple((exp, summary_key(key, exp), label, scale) for exp, key, label, scale in (
    ("single-source", "time_to_balance_s", "time to balance (s)", 1.0),
    ("time-to-resolve", "time_to_balance_s", "time to balance (s)", 1.0),
    ("single-source", "migrations_after_balance_per_s", "migrations/s after balance", 1.0),
    ("how-many", "first_round_moved", "tasks moved in the first round", 1.0),
    ("work-conservation", "steal_latency_s", "idle to first pull (ms)", 1e3),
    ("detection", "interval1_ms", "cut to first migration (ms)", 1.0),
    ("detection", "interval2_ms", "first to second migration (ms)", 1.0),
    ("intrinsic-imbalance", "migrations_per_s", "migrations/s", 1.0),
    ("intrinsic-imbalance", "share_ratio_min", "lowest share / fair share", 1.0),
    ("heavy-light", "smape_long", "run-queue variance SMAPE, long", 1.0),
))


@dataclasses.dataclass
class Comparison:
    sources: list[str]                        # the directories, as given
    cards: list[policy.Card]                  # one per source, in the same order
    evidence: list[list[policy.Evidence]]     # the runs behind each card


def compare(paths) -> Comparison:
    """One card per directory of ``paths`` (at least two); RunError naming a directory that does
    not exist or holds no complete run."""
    paths = [str(p) for p in paths]
    if len(paths) < 2:
        raise store.RunError("compare needs two directories or more")
    seen: dict[Path, str] = {}
    for p in paths:
        if Path(p).resolve() in seen:
            raise store.RunError(f"{p}: given twice (as {seen[Path(p).resolve()]})")
        seen[Path(p).resolve()] = p
    cards, evidence = [], []
    for p in paths:
        ev, skipped = policy.collect([p])
        if not ev:
            raise store.RunError(f"{p}: no complete run")
        cards.append(policy.infer_evidence(ev, skipped))
        evidence.append(ev)
    return Comparison(paths, cards, evidence)


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
    names = [_letter(k) for k in range(len(src))]
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


def to_dict(cmp: Comparison) -> dict:
    """The comparison for programs (``--json``, compare.json): {"sources": :func:`df_sources`'s
    rows, "answers": :func:`df_compare`'s rows}."""
    return {"sources": df_sources(cmp).to_dict("records"),
            "answers": df_compare(cmp).to_dict("records")}


def df_compare_runs(cmp: Comparison) -> pd.DataFrame:
    """Every complete run of every source, one row each: the columns of
    :func:`harmony.analysis.report_suite.df_suite_runs` (path, experiment, config, ncpus, then
    each scalar summary key) and ``source`` (str: the directory as given) and ``letter`` (str: its
    letter in :func:`compare_text`, "A", "B", ...)."""
    from harmony.analysis.report_suite import df_suite_runs

    parts = []
    for k, (src, ev) in enumerate(zip(cmp.sources, cmp.evidence)):
        df = df_suite_runs(ev)
        df.insert(0, "letter", _letter(k))
        df.insert(0, "source", src)
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def plot_compare(runs: pd.DataFrame, path) -> Path | None:
    """The metrics of :data:`FIGURE_METRICS` that some source measured, one panel each, the
    sources side by side (by letter), every run a point and each source's median a red bar;
    None if no source measured any."""
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the suite report's point strips and look, so that both read alike
    from harmony.analysis.report_suite import STYLE, median_bars, numeric, strip_points

    panels = []
    for exp, key, label, scale in FIGURE_METRICS:
        d = runs[runs["experiment"] == exp]
        values = numeric(d, key) * scale
        data = pd.DataFrame({"source": d["letter"], label: values}).dropna()
        if not data.empty:
            panels.append((f"{exp}: {key}", label, data))
    if not panels:
        return None
    letters = list(dict.fromkeys(runs["letter"]))
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, (title, label, data) in zip(axes.flat, panels):
            # every source gets its place on the axis, measured or not
            strip_points(ax, data, x="source", y=label, size=6, order=letters)
            median_bars(ax, data, "source", label, letters)
            ax.set_title(title, fontsize=9)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle("Each source's runs (" + ", ".join(
            f"{letter}: {src}" for letter, src in dict(zip(runs["letter"], runs["source"])).items())
            + "; red: median)", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.97))     # room for the title above the panels
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return Path(path)


def write(cmp: Comparison, out) -> list[Path]:
    """compare.md (the tables of :func:`compare_text` and the figure), compare.json (sources and
    answers) and figures/compare.png into the directory ``out``; the paths written."""
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    fig = plot_compare(df_compare_runs(cmp), out / "figures" / "compare.png")
    md = ["# Policy cards compared", "", "```", compare_text(cmp).rstrip(), "```", ""]
    if fig is not None:
        md += ["![each source's runs](figures/compare.png)", ""]
    store.atomic_write(out / "compare.md", "\n".join(md))
    store.write_json(out / "compare.json", to_dict(cmp))
    return [out / "compare.md", out / "compare.json"] + ([fig] if fig is not None else [])


def _letter(k: int) -> str:
    return chr(ord("A") + k) if k < 26 else f"S{k}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"
