"""The suite report: the policy card first, then the evidence per question, with figures.

``write(suite_dir)`` builds one document (:mod:`harmony.analysis.document`) and writes it as
report.md (figures as files under figures/) and report.html (a page that stands alone, every
figure embedded): the card as a table (:func:`card_blocks`: each answer styled by its kind, how
firmly the runs agree, its first number, a link to its evidence), the measurement table, then
each question's evidence with its figures beside it. Cross-run figures draw
every run as a point; the experiments' own figures are taken from the first repetition of each
configuration if they were drawn, otherwise the report says which command draws them.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harmony import store  # noqa: E402
from harmony.analysis import document as D  # noqa: E402
from harmony.analysis import policy, sequential, server_card  # noqa: E402
from harmony.analysis import thresholds as T  # noqa: E402
from harmony.analysis.plots import integer_axis, save_figure  # noqa: E402
from harmony.analysis.plots_requests import df_latency_by_load, plot_latency_by_load  # noqa: E402
from harmony.core.wording import plural  # noqa: E402

#: which experiments give the evidence of each question (the card's sources)
EVIDENCE = {
    "balances": ["single-source", "proportional"],
    "affinity": ["single-source", "intrinsic-imbalance", "heavy-light"],
    "how_many": ["how-many"],
    "time_to_balance": ["time-to-resolve", "single-source"],
    "work_conserving": ["work-conservation"],
    "detection": ["detection"],
    "intrinsic": ["intrinsic-imbalance"],
    "selection": ["heavy-light"],
    "priorities": ["priority-classes"],
}


def df_suite_runs(evidence: list[policy.Evidence]) -> pd.DataFrame:
    """One row per complete run: where, what, and every scalar summary key.

    Needs: the evidence of :func:`harmony.analysis.policy.collect`.

    Columns: path (str), experiment (str), config (str: the batch directory name), ncpus (int),
    then one column per scalar summary key (float/bool/None; missing keys are None).
    """
    rows = []
    for e in evidence:
        cfg = e.path.parent.name if e.path.name.startswith("rep-") else e.path.name
        row = {"path": str(e.path), "experiment": e.experiment, "config": cfg, "ncpus": e.ncpus}
        row |= {k: v for k, v in e.summary.items()
                if v is None or isinstance(v, (bool, int, float))}
        rows.append(row)
    return pd.DataFrame(rows)


#: the look of the suite's figures, set here so that it does not depend on what else was imported
STYLE = {"axes.grid": True, "grid.color": "#e6e6e6", "axes.axisbelow": True,
         "axes.edgecolor": "#b0b0b0", "axes.spines.top": False, "axes.spines.right": False}
# colour-blind safe
HUE_COLOURS = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161"]


def _styled(plot):
    @functools.wraps(plot)
    def draw(*args, **kwargs):
        with plt.rc_context(STYLE):
            return plot(*args, **kwargs)
    return draw


def _save(fig, path: Path) -> Path:
    return save_figure(fig, path, dpi=100)


def strip_points(ax, data: pd.DataFrame, x: str, y: str, hue: str | None = None, size: float = 6,
                 color: str = "#2c3e50", order: list | None = None) -> list:
    """Every row of ``data`` a point above its category of ``x``, spread sideways so that equal
    values stay visible; the levels of ``hue`` side by side within a category. Returns the
    categories in drawing order: ``order`` if given (a category without rows keeps its place),
    else numbers sorted and text in order of appearance.

    What seaborn's stripplot drew, in plain matplotlib: a third of the time per figure and no
    seaborn import.
    """
    cats = list(order) if order is not None else list(dict.fromkeys(data[x]))
    if order is None and all(isinstance(c, (int, float, np.number)) for c in cats):
        cats = sorted(cats)
    pos = {c: i for i, c in enumerate(cats)}
    levels = list(dict.fromkeys(data[hue])) if hue else [None]
    rng = np.random.default_rng(0)  # the same picture every time
    step = 0.8 / len(levels)
    for k, level in enumerate(levels):
        d = data if hue is None else data[data[hue] == level]
        offset = (k - (len(levels) - 1) / 2) * step
        xs = d[x].map(pos).to_numpy(float) + offset + rng.uniform(-0.2, 0.2, len(d)) * step
        ax.scatter(xs, d[y], s=size ** 2, zorder=3, label=level,
                   color=HUE_COLOURS[k % len(HUE_COLOURS)] if hue else color)
    ax.set_xticks(range(len(cats)), [f"{c:g}" if isinstance(c, (int, float, np.number)) else str(c)
                                     for c in cats])
    ax.set_xlim(-0.5, len(cats) - 0.5)
    ax.grid(False, axis="x")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if hue:
        ax.legend(title=hue, fontsize=8)
    return cats


def median_bars(ax, data: pd.DataFrame, x: str, y: str, cats: list) -> None:
    """A red bar at the median of ``y`` over each category of ``cats`` that has values, where
    :func:`strip_points` put the category (its place in ``cats``)."""
    med = data.groupby(x, sort=False, observed=True)[y].median()
    for i, c in enumerate(cats):
        if c in med.index:
            ax.hlines(med[c], i - 0.3, i + 0.3, color="#c0392b", lw=2)


def numeric(df: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` of ``df`` as numbers (NaN where a value is not one, or the column is absent:
    a metric some runs lack)."""
    return (pd.to_numeric(df[col], errors="coerce") if col in df
            else pd.Series(np.nan, index=df.index))


#: how plot_how_many draws each prediction: a line through the x values and a marker at each (a
#: line through one x draws nothing); markers of two sizes, so that equal predictions both show
PREDICTION_STYLES = (
    ("poly_prediction", "poly-balance: q_src - N/P",
     {"ls": "--", "marker": "D", "ms": 11, "mfc": "none", "color": "#2980b9"}),
    ("pairwise_prediction", "pairwise: (q_src - q_target)/2",
     {"ls": ":", "marker": "s", "ms": 6, "mfc": "none", "color": "#e67e22"}),
)


@_styled
def plot_how_many(df: pd.DataFrame, path: Path) -> Path | None:
    """First-round moves vs x (thesis fig 6.6): every run a point; each prediction a marker at
    each x (and a line through them), so that it shows with a single x too; whole-number axes."""
    d = df[df["experiment"] == "how-many"]
    if d.empty or "first_round_moved" not in d:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    x, moved = numeric(d, "x"), numeric(d, "first_round_moved")
    ax.scatter(x, moved, color="#2c3e50", zorder=3, label=f"runs ({int(moved.notna().sum())})")
    ys = [moved]
    for col, lab, style in PREDICTION_STYLES:
        pred = pd.DataFrame({"x": x, "y": numeric(d, col)}).dropna().groupby("x")["y"].mean()
        if pred.empty:
            continue
        ax.plot(pred.index.to_numpy(), pred.to_numpy(), label=lab, zorder=2, **style)
        ys.append(pred)
    xs = x.dropna().unique()
    if len(xs) == 1:                # one x: room either side, so that it reads as a point
        ax.set_xlim(xs[0] - 1, xs[0] + 1)
    integer_axis(ax.xaxis, xs)
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    top = float(pd.concat(ys).max()) if len(pd.concat(ys).dropna()) else 1.0
    ax.set_ylim(0, top * 1.15 + 0.5)
    ax.set_xlabel("x (extra tasks per source CPU)")
    ax.set_ylabel("tasks moved from the first source")
    ax.set_title("How many: first balancing round")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


@_styled
def plot_selection(df: pd.DataFrame, path: Path) -> Path | None:
    """SMAPE of run-queue variance, short vs long term, against light duty (thesis fig 7.6/7.11)."""
    d = df[df["experiment"] == "heavy-light"]
    if d.empty or "smape_short" not in d:
        return None
    long = pd.DataFrame({"light duty (%)": numeric(d, "light_duty"),
                         "SMAPE": numeric(d, "smape_long"), "window": "long term"})
    short = pd.DataFrame({"light duty (%)": numeric(d, "light_duty"),
                          "SMAPE": numeric(d, "smape_short"), "window": "short term"})
    data = pd.concat([short, long], ignore_index=True).dropna()
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    strip_points(ax, data, x="light duty (%)", y="SMAPE", hue="window")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Selection: run-queue variance vs static ideal (0 = match)")
    return _save(fig, path)


@_styled
def plot_priorities(df: pd.DataFrame, path: Path) -> Path | None:
    """Spread of high and low priority tasks against the nice difference (thesis fig 7.13-7.15)."""
    d = df[df["experiment"] == "priority-classes"]
    if d.empty or "high_spread_index" not in d:
        return None
    data = pd.concat([
        pd.DataFrame({"nice difference": numeric(d, "nice_diff"),
                      "index": numeric(d, "high_spread_index"), "tasks": "high priority"}),
        pd.DataFrame({"nice difference": numeric(d, "nice_diff"),
                      "index": numeric(d, "low_cluster_index"), "tasks": "low priority"})],
        ignore_index=True).dropna()
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    strip_points(ax, data, x="nice difference", y="index", hue="tasks")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("spread index (0 = even, 1 = all on one CPU)")
    ax.set_title("Priorities: placement of high and low priority tasks")
    return _save(fig, path)


@_styled
def plot_points(df: pd.DataFrame, experiment: str, cols: list[str], path: Path, title: str,
                ylabel: str, scale: float = 1.0, names: dict | None = None) -> Path | None:
    """Several metrics of one experiment as strip plots, every run a point; a metric some runs
    have no value of (e.g. a third detection round that never came) says how many have one.
    ``names``: a metric's label, where its name's unit is not ``ylabel``'s (the column times
    ``scale``). A duration (``ylabel`` "ms" or "s") is drawn from 0: never a negative delay."""
    d = df[df["experiment"] == experiment]

    def name(c):
        n = int(numeric(d, c).notna().sum())
        label = (names or {}).get(c, c)
        return label if n == len(d) else f"{label}\n({n} of {len(d)} runs)"

    parts = [pd.DataFrame({"metric": name(c), "value": numeric(d, c) * scale})
             for c in cols if c in d]
    if not parts:
        return None
    data = pd.concat(parts, ignore_index=True).dropna()
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(cols) + 2), 3.8))
    cats = strip_points(ax, data, x="metric", y="value", size=7)
    median_bars(ax, data, "metric", "value", cats)
    if ylabel in ("ms", "s"):
        ax.set_ylim(0, max(float(data["value"].max()) * 1.1, 1.0 if ylabel == "ms" else 1e-3))
    ax.set_xlabel("")
    ax.set_ylabel(ylabel)
    ax.set_title(title + " (red: median)")
    return _save(fig, path)


@_styled
def plot_time_to_balance(df: pd.DataFrame, path: Path) -> Path | None:
    """Time to a stable balance of every run the policy card reads it from (time-to-resolve and
    single-source; the settled time, losses of balance restored within FAST_BALANCE_MAX_S aside,
    or for runs analysed before it was measured the time balanced to the end), one strip per
    experiment; the runs never balanced for good have no time and are counted in their
    experiment's label."""
    rows, counts = [], {}
    for exp in ("time-to-resolve", "single-source"):
        d = df[df["experiment"] == exp]
        key = "time_to_settle_s" if "time_to_settle_s" in d else "time_to_balance_s"
        if d.empty or key not in d:
            continue
        t = numeric(d, key)
        label = f"{exp}\n({int(t.isna().sum())} of {len(t)} never)" if t.isna().any() else exp
        counts[label] = len(t)
        rows.append(pd.DataFrame({"experiment": label, "seconds after t0": t}))
    if not rows:
        return None
    data = pd.concat(rows, ignore_index=True).dropna()
    fig, ax = plt.subplots(figsize=(max(4.5, 2.4 * len(counts) + 1), 4.0))
    # every experiment gets its place, even one whose runs never balanced for good
    cats = strip_points(ax, data, x="experiment", y="seconds after t0", size=7, order=list(counts))
    median_bars(ax, data, "experiment", "seconds after t0", cats)
    ax.set_xlabel("")
    ax.set_title("Time to a stable balance (red: median; never: not balanced for good)",
                 fontsize=10)
    return _save(fig, path)


@_styled
def plot_affinity(df: pd.DataFrame, path: Path) -> Path | None:
    """Migrations per second per CPU once nothing needs to move, per experiment, every run a
    point."""
    rows = []
    for exp, key in policy.AFFINITY_SOURCES:
        d = df[df["experiment"] == exp]
        if d.empty or key not in d:
            continue
        rows.append(pd.DataFrame({"experiment": exp,
                                  "per CPU per s": numeric(d, key) / d["ncpus"]}))
    if not rows:
        return None
    data = pd.concat(rows, ignore_index=True).dropna()
    if data.empty:
        return None

    fig, ax = plt.subplots(figsize=(7, 3.8))
    strip_points(ax, data, x="experiment", y="per CPU per s", size=7)
    for y, lab in ((T.AFFINITY_STRONG_MAX_PER_CPU_S, "strong below"),
                   (T.AFFINITY_WEAK_MIN_PER_CPU_S, "weak above")):
        ax.axhline(y, ls="--", color="0.5", lw=0.8)
        ax.text(ax.get_xlim()[1], y, f" {lab}", va="center", fontsize=8)
    top = float(data["per CPU per s"].max())
    if top > 10 * T.AFFINITY_WEAK_MIN_PER_CPU_S:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title("Affinity: migrations per second per CPU after balance")
    return _save(fig, path)


@_styled
def plot_reps(record: dict, path: Path, max_metrics: int = 12) -> Path | None:
    """A batch's metrics, one panel each: every repetition a point, median and 95% CI."""
    aggs = [a for a in record.get("aggregates", []) if a["n"] and a["metric"] not in ("ncpus",)]
    aggs = [a for a in aggs if not all(isinstance(v, bool) for v in record["values"][a["metric"]]
                                       if v is not None)][:max_metrics]
    if not aggs:
        return None
    cols = min(4, len(aggs))
    rows = math.ceil(len(aggs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.4 * rows), squeeze=False)
    for ax in axes.flat[len(aggs):]:
        ax.set_visible(False)
    for ax, a in zip(axes.flat, aggs):
        vals = [v for v in record["values"][a["metric"]] if v is not None]
        ax.scatter(np.zeros(len(vals)) + np.linspace(-0.1, 0.1, len(vals)), vals, color="#2c3e50",
                   zorder=3)
        ax.hlines(a["median"], -0.3, 0.3, color="#c0392b", lw=2)
        if a["ci_low"] is not None:
            ax.vlines(0.35, a["ci_low"], a["ci_high"], color="#c0392b", lw=4, alpha=0.4)
        ax.set_xlim(-0.5, 0.6)
        ax.set_xticks([])
        ax.set_title(a["metric"], fontsize=8)
        ax.tick_params(labelsize=7)
        if all(float(v).is_integer() for v in vals):        # a count: whole-number ticks
            ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.suptitle(f"{record['experiment']}: {record.get('complete', len(aggs))} runs "
                 "(points; red: median and 95% CI)", fontsize=9)
    return _save(fig, path)


def cross_figures(df: pd.DataFrame, fig_dir: Path, processes: int = 1) -> dict[str, list[Path]]:
    """The cross-run figures, keyed by the question they support; drawn in up to ``processes``
    forked processes (each figure is independent: ~0.1 s of drawing and PNG encoding)."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    jobs = [  # (question, plot, arguments)
        ("affinity", plot_affinity, (df, fig_dir / "affinity.png")),
        ("how_many", plot_how_many, (df, fig_dir / "how_many.png")),
        ("time_to_balance", plot_time_to_balance, (df, fig_dir / "time_to_balance.png")),
        ("work_conserving", plot_points, (df, "work-conservation", ["steal_latency_s"],
                                          fig_dir / "steal_latency.png",
                                          "Idle target: delay to first pull", "ms", 1000,
                                          {"steal_latency_s": "steal latency"})),
        ("detection", plot_points, (df, "detection",
                                    ["interval1_ms", "interval2_ms", "interval3_ms"],
                                    fig_dir / "detection.png", "Detection intervals (table 6.1)",
                                    "ms")),
        ("intrinsic", plot_points, (df, "intrinsic-imbalance",
                                    ["share_ratio_min", "share_ratio_max", "jain_index"],
                                    fig_dir / "intrinsic.png",
                                    "Intrinsic imbalance: share / fair share", "ratio")),
        ("balances", plot_points, (df, "proportional",
                                   ["speedup_ratio", "speedup_ratio_min", "concurrency_ratio",
                                    "concurrency_ratio_min"], fig_dir / "proportional.png",
                                   "Proportional speedup and concurrency: ratio to the GPS ideal",
                                   "ratio")),
        ("selection", plot_selection, (df, fig_dir / "selection.png")),
        ("priorities", plot_priorities, (df, fig_dir / "priorities.png")),
    ]
    if processes > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(processes, len(jobs)),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            paths = list(pool.map(_draw, jobs))
    else:
        paths = [_draw(job) for job in jobs]
    out: dict[str, list[Path]] = {}
    for (qid, _, _), path in zip(jobs, paths):
        out.setdefault(qid, [])
        if path is not None:
            out[qid].append(path)
    return out


def _draw(job) -> Path | None:
    _, plot, args = job
    return plot(*args)


def _experiment_figures(suite: Path,
                        evidence: list[policy.Evidence]) -> dict[str, tuple[Path, list[Path]]]:
    """Each experiment's own figures, from the first repetition of its first configuration:
    experiment -> (that run, its figures; none if they were left to ``harmony report``)."""
    out: dict[str, tuple[Path, list[Path]]] = {}
    for e in sorted(evidence, key=lambda e: str(e.path)):
        if e.experiment in out:
            continue
        try:
            m = store.read_json(e.path / "manifest.json")
        except store.RunError:
            continue
        out[e.experiment] = (Path(e.path), [e.path / f for f in m.get("figures", [])
                                            if (e.path / f).is_file()])
    return out


def _figures_note(own: dict[str, tuple[Path, list[Path]]]) -> str:
    """Which figures this report shows, and how to draw the others."""
    missing = sorted(exp for exp, (_, figs) in own.items() if not figs)
    text = ("Figures drawn here: the cross-run ones under each question (every run a point)"
            + (", and the first run's own figures of each experiment." if not missing else "."))
    if missing:
        text += (" Not drawn by the suite, to keep it fast: the runs' own figures"
                 + (f" ({', '.join(missing)})" if len(missing) < len(own) else "")
                 + " and each configuration's repetition figure; `harmony report RUN` draws a "
                 "run's (command under each experiment below) and `harmony report CONFIGURATION` "
                 "a configuration's (figures/reps.png).")
    return text


def _limits(card: policy.Card) -> list[str]:
    lines = []
    for a in card.answers:
        if a.why_not:
            lines.append(f"- **{a.question}** {a.why_not}.")
        elif a.label is None and a.needs:
            lines.append(f"- **{a.question}** no run of {a.needs} in this suite.")
        elif a.state == sequential.UNDECIDED and a.confidence is not None:
            lines.append(f"- **{a.question}** {policy.confidence_text(a)} "
                         "(`harmony suite --until-decided` adds them).")
    return lines


def df_measurement(evidence, root: Path) -> pd.DataFrame:
    """One row per run used by the card: how far its measurement can be trusted.

    Columns: run (str, path under ``root``), probe, lost (int events lost by the probe; -1 =
    unknown), release_ms (float: first wake-up to the last task free to move), foreign_pct (float:
    most of one CPU of the set that other tasks used), anomalies (int: repaired contradictions in
    the event stream), proc_agree_pct / nr_agree_pct (float: rebuilt run queues vs the kernel's
    /proc and sched-debug views; NaN when not sampled), counters_agree_pct (float: tasks whose
    migrations and switches in the trace match their own /proc/<pid>/sched counters; NaN when not
    read), notes (int: notes in the run's report).
    """
    def pct(v):
        return np.nan if v is None else 100.0 * v

    rows = []
    for e in evidence:
        try:
            m = store.read_json(Path(e.path) / "manifest.json")
        except store.RunError:
            continue
        rel = m.get("release") or {}
        fl = m.get("foreign_load") or {}
        ka = m.get("kernel_agreement") or {}
        nr = m.get("kernel_nr_running_agreement") or {}
        kc = m.get("kernel_counter_agreement") or {}
        rows.append({
            "run": (str(Path(e.path).relative_to(root)) if Path(e.path).is_relative_to(root)
                    else str(e.path)),
            "probe": m.get("probe", "?"),
            "lost": int(m.get("lost_events", -1) if m.get("lost_events") is not None else -1),
            "release_ms": (np.nan if rel.get("release_spread_ns") is None
                           else rel["release_spread_ns"] / 1e6),
            "foreign_pct": pct(fl.get("max_frac")),
            "anomalies": int(m.get("reconstruction_anomalies") or 0),
            "proc_agree_pct": pct(ka.get("agreement")),
            "nr_agree_pct": pct(nr.get("agreement")),
            "counters_agree_pct": pct((kc["tasks"] - kc["disagreeing"]) / kc["tasks"]
                                      if kc.get("tasks") else None),
            "notes": len(m.get("notes", [])),
        })
    return pd.DataFrame(rows, columns=["run", "probe", "lost", "release_ms", "foreign_pct",
                                       "anomalies", "proc_agree_pct", "nr_agree_pct",
                                       "counters_agree_pct", "notes"]).round(2)


def measurement_summary(meas: pd.DataFrame) -> list[str]:
    """A few lines over :func:`df_measurement`: the worst of each trust figure, plainly."""
    lost = meas["lost"]
    out = [f"lost events: {int(lost[lost > 0].sum())} in {int((lost > 0).sum())} "
           f"of {len(meas)} runs"
           + (f"; unknown in {int((lost < 0).sum())}" if (lost < 0).any() else "")]
    if meas["release_ms"].notna().any():
        out.append(f"release spread: median {meas['release_ms'].median():.3f} ms, "
                   f"worst {meas['release_ms'].max():.3f} ms")
    if meas["foreign_pct"].notna().any():
        worst = meas.loc[meas["foreign_pct"].idxmax()]
        out.append(f"foreign load (other tasks on the CPU set): worst {worst['foreign_pct']:.1f}% "
                   f"of a CPU in {worst['run']}")
    out.append(f"repaired contradictions in the event stream: {int(meas['anomalies'].sum())} "
               "(see each run's report notes)")
    for col, what in (("proc_agree_pct", "/proc"), ("nr_agree_pct", "sched debug nr_running")):
        if meas[col].notna().any():
            out.append(f"rebuilt run queues vs the kernel's {what}: lowest {meas[col].min():.1f}% "
                       f"of samples agree")
    if meas["counters_agree_pct"].notna().any():
        worst = meas.loc[meas["counters_agree_pct"].idxmin()]
        out.append(f"migrations and switches vs each task's own counters (/proc/<pid>/sched): "
                   f"lowest {worst['counters_agree_pct']:.1f}% of tasks agree ({worst['run']})")
    return out


#: the measurement table's columns as a reader would name them (df_measurement documents each)
MEASUREMENT_HEADINGS = {"run": "run", "probe": "probe", "lost": "lost events",
                        "release_ms": "release spread ms", "foreign_pct": "foreign load %",
                        "anomalies": "repaired", "proc_agree_pct": "/proc agree %",
                        "nr_agree_pct": "nr_running agree %",
                        "counters_agree_pct": "counters agree %", "notes": "notes"}


def frame_table(df: pd.DataFrame, headings: dict | None = None,
                caption: str | None = None) -> D.Table:
    """A DataFrame as a document table: numbers right-aligned, NaN as "-"."""
    headings = headings or {}
    cols = [headings.get(c, c) for c in df.columns]
    numeric = frozenset(h for c, h in zip(df.columns, cols) if pd.api.types.is_numeric_dtype(df[c]))
    rows = [["-" if isinstance(v, float) and math.isnan(v) else v for v in row]
            for row in df.itertuples(index=False)]
    return D.Table(cols, rows, numeric=numeric, caption=caption)


def _agreement(a: policy.Answer) -> str:
    """How firmly the runs agree: "5 of 5 runs" when each run voted, else the votes as given."""
    votes = a.agreement
    if a.label in votes and all(isinstance(v, int) for v in votes.values()):
        total = sum(votes.values())
        rest = "; ".join(f"{k}: {v}" for k, v in votes.items() if k != a.label)
        return f"{votes[a.label]} of {total} runs" + (f" ({rest})" if rest else "")
    return ", ".join(f"{k}: {v}" for k, v in votes.items() if v != 0)


def confidence_cell(a: policy.Answer) -> str:
    """How sure an answer is, in a few words: decided (the lower bound of its label's share),
    varies (the leading label's upper bound), or undecided (how many more runs could settle it);
    "" without votes."""
    c = a.confidence
    if c is None:
        return ""
    level = f"{T.DECIDE_LEVEL:.0%}"
    if c.get("path") == sequential.PER_CONFIGURATION:
        head = policy.per_configuration_head(c)
        return (head if c["state"] == sequential.DECIDED
                else f"{head} ({len(c['configurations'])} configurations)")
    if c["state"] == sequential.DECIDED:
        return f"decided at {level}: {c['label']} in at least {c['lower']:.0%} of runs"
    if c["state"] == sequential.VARIES:
        return f"varies at {level}: {c['label']} in at most {c['upper']:.0%} of runs"
    return f"undecided: {plural(c['more'], 'more run')} could settle it"


def card_blocks(card: policy.Card) -> list:
    """The policy card as a table: one row per question, its answer styled by kind, how firmly
    the runs agree and how sure that makes it (:func:`confidence_cell`), its first number (with
    its interval), a link to its evidence."""
    rows = []
    for i, a in enumerate(card.answers, 1):
        kind = policy.answer_kind(a)
        answer = (a.label if kind in ("answered", "undecided", "varies")
                  else policy.ANSWER_KINDS[kind])
        # the first number that sums the runs up (a list holds one value per run)
        key = next((kv for kv in a.numbers.items() if not isinstance(kv[1], list)), None)
        rows.append([str(i), a.question, D.Cell(answer, kind), _agreement(a), confidence_cell(a),
                     "" if key is None else f"{key[0]} = {policy.format_value(key[1])}"
                     + policy.interval_text(a, key[0]),
                     D.Cell(f"thesis {a.thesis}", href=f"#q-{a.qid}")])
    head = card.head_lines()
    return [D.Para(head[0])] + ([D.Bullets(head[1:])] if head[1:] else []) + [
        D.Table(["#", "question", "answer", "runs agree", "confidence", "key number", "evidence"],
                rows, numeric=frozenset({"#"}))]


def df_until_decided(record: dict | None) -> pd.DataFrame:
    """What ``--until-decided`` did (suite.json's ``until_decided``), one row per configuration.

    Columns: configuration (str: its batch directory), planned (int: runs planned), runs (int:
    runs in all), rounds (int: rounds that added runs), questions (str: each question its runs
    answer, "qid: state, label k/n" with the votes of the runs with a label), capped (bool: the
    cap stopped it with a question undecided). Empty without a record."""
    rows = []
    for label, r in ((record or {}).get("configs") or {}).items():
        if not r:
            continue
        qs = "; ".join(f"{qid}: {q['state']}, {q['label']} {q['votes']}/{q['runs']}"
                       for qid, q in r["questions"].items())
        rows.append({"configuration": label, "planned": r["planned"], "runs": r["runs"],
                     "rounds": r["rounds"], "questions": qs, "capped": r["capped"]})
    return pd.DataFrame(rows, columns=["configuration", "planned", "runs", "rounds", "questions",
                                       "capped"])


def until_decided_blocks(record: dict | None) -> list:
    """The report's section on the runs added until decided ([] when not asked)."""
    df = df_until_decided(record)
    if record is None:
        return []
    capped = df[df["capped"]]["configuration"].tolist()
    lead = (f"After the planned runs, {record['added_runs']} runs were added in "
            f"{plural(record['rounds'], 'round')}, at most "
            f"{record['max_repeat']} a configuration, until each configuration's questions were "
            "decided or shown to vary (harmony.decide; the rule: analysis/sequential.py)."
            + (f" Still undecided at the cap: {', '.join(capped)}." if capped else ""))
    return [D.Heading("Runs until decided", 2, "until-decided"), D.Para(lead),
            frame_table(df.assign(capped=df["capped"].map({True: "yes", False: ""})))]


def level_blocks(card: policy.Card, evidence: list, fig_dir: Path) -> list:
    """The card by level (:mod:`harmony.analysis.policy_levels`): each question at each level
    (a row marked where the levels differ), the per-level figure, and the predictions from the
    kernel's domains with their verdicts; [] for a card without levels or predictions."""
    from harmony.analysis import policy_levels
    from harmony.analysis.plots_levels import df_level_runs, plot_levels

    out: list = []
    if card.levels:
        labels = policy_levels.by_level_labels(card.levels)
        levels = list(card.levels)
        rows = [["*" if policy_levels.differs(labels[q]) else "", q,
                 *[labels[q].get(lv, "") for lv in levels]]
                for q, _, _ in policy.QUESTIONS if q in labels]
        out += [D.Heading("By level", 2, "levels"),
                D.Para("Runs placed at a level (-p level=...) answer there: the source and the "
                       "target are SMT siblings (smt), share an LLC (llc), a package (package), "
                       "a node (node), or sit on two nodes (remote). *: the answer differs by "
                       "level. The affinity at each level comes from the runs on the whole "
                       "set (their moves per second and CPU between CPUs at that relation)."),
                D.Table(["", "question"] + levels, rows)]
        fig_dir.mkdir(parents=True, exist_ok=True)
        fig = plot_levels(df_level_runs(evidence), fig_dir / "levels.png")
        if fig is not None:
            out.append(D.Figure(fig, "the questions of distance at each level"))
    if card.predictions:
        out += [D.Heading("Predictions from the kernel's own domains", 2, "predictions"),
                D.Table(["check", "level", "verdict", "runs", "predicted", "measured (examples)",
                         "tolerance"],
                        [[v["check"], v["level"] + (f" ({v['domain']})" if v["domain"] else ""),
                          D.Cell(v["verdict"], "answered" if v["verdict"] == "holds" else
                                 "undecided" if v["verdict"].startswith("fails") else "none"),
                          str(v["runs"]), v["predicted"], "; ".join(v["measured"]),
                          v["tolerance"]] for v in card.predictions])]
    return out


def evidence_items(a: policy.Answer) -> list[str]:
    """An answer's lines (:func:`harmony.analysis.policy.answer_lines`), "key: value" in bold."""
    out = []
    for line in policy.answer_lines(a):
        key, sep, value = line.partition(":")
        out.append(f"**{key}:** {value.strip()}" if sep else line)
    return out


def scheduler_ended_text(r: dict) -> str:
    """One line: how a sched_ext scheduler kept loaded across the suite's runs ended (its last
    record, suite.json's ``scheduler_ended``)."""
    how = f"state after: {r.get('state_after') or '?'}"
    if r.get("ejected"):
        how += f"; ejected: {r['ejected']}"
    if r.get("exit"):
        how += f"; exit: {r['exit']}"
    if r.get("returncode") is not None:
        how += f"; return code {r['returncode']}"
    return f"sched_ext scheduler {r.get('name') or '?'} kept across the runs, at the end: {how}"


def write(suite: Path, note: str | None = None, processes: int | None = None,
          dest: Path | None = None) -> tuple[Path, Path]:
    """Write report.md, report.html, card.json and the cross-run figures in ``suite`` (or in
    ``dest``, leaving the suite as it is); returns the reports' paths. The figures are drawn in
    ``processes`` processes (default: one per CPU this process may use)."""
    suite = Path(suite)
    dest = Path(dest) if dest is not None else suite
    evidence, skipped = policy.collect([suite])
    card = policy.infer_evidence(evidence, skipped)
    store.write_json(dest / "card.json", card.to_dict())
    info = store.read_json(suite / "suite.json") if (suite / "suite.json").exists() else {}
    df = df_suite_runs(evidence)
    fig_dir = dest / "figures"
    processes = processes or len(os.sched_getaffinity(0))
    cross = cross_figures(df, fig_dir, processes) if len(df) else {}
    own = _experiment_figures(suite, evidence)

    # a VM's kernel under test, else the host
    host = info.get("under_test") or info.get("host", {})
    doc: list = [D.Heading("Harmony suite: the load-balancing policy of this scheduler", 1)]
    facts = [f"CPU set: {','.join(map(str, info.get('cpus', []))) or '?'}",
             f"runner: {info.get('runner', '?')}",
             f"kernel / scheduler: {host.get('kernel', '?')} / {host.get('scheduler', '?')}",
             f"runs: {card.runs} complete" + (f", {len(skipped)} not used" if skipped else "")]
    if info.get("wall_s") is not None:
        analysis = info.get("analysis") or ("overlapped with the next capture"
                                            if info.get("analysis_overlapped") else "in line")
        facts.append(f"time: {info['wall_s']:.0f} s wall for {info['configured_s']:.0f} s of "
                     f"configured runs (suite efficiency {info['efficiency']:.2f}; "
                     f"analysis {analysis})")
    facts += [scheduler_ended_text(r) for r in info.get("scheduler_ended") or ()]
    if info.get("incomplete_reason") or info.get("status") == "running":     # stopped, killed
        why = info.get("incomplete_reason") or "no end written: killed, or still running"
        facts.append(f"**the suite did not finish** ({info['status']}: {why}): what follows "
                     f"reads only the runs made before; `harmony suite --out {suite} --resume` "
                     "goes on")
    doc.append(D.Bullets(facts))
    if note:
        doc.append(D.Para(note, "note"))
    doc.append(D.Heading("Policy card", 2, "card"))
    doc += card_blocks(card)
    doc += level_blocks(card, evidence, fig_dir)
    meas = df_measurement(evidence, suite)
    if len(meas):
        doc.append(D.Heading("Measurement: what the runs could and could not see", 2,
                             "measurement"))
        doc.append(D.Bullets(measurement_summary(meas)))
        doc.append(frame_table(meas, MEASUREMENT_HEADINGS))
    doc += until_decided_blocks(info.get("until_decided"))
    limits = _limits(card)
    if limits:
        doc.append(D.Heading("What this suite cannot answer, and why", 2))
        doc.append(D.Bullets([line[2:] for line in limits]))
    doc.append(D.Heading("Evidence per question", 2, "evidence"))
    if own:
        doc.append(D.Para(_figures_note(own), "note"))
    for i, a in enumerate(card.answers, 1):
        doc.append(D.Heading(f"{i}. {a.question} (thesis {a.thesis})", 3, f"q-{a.qid}"))
        text: list = [D.Bullets(evidence_items(a))]
        figs = [D.Figure(p, f"{a.qid}: {p.stem}") for p in cross.get(a.qid, [])]
        for exp in EVIDENCE.get(a.qid, []):
            if exp not in own:
                continue
            run, paths = own.pop(exp)
            figs += [D.Figure(p, f"{exp}: {p.stem}") for p in paths]
            if not paths:
                text.append(D.Para(f"{exp}, one run's own figures: `harmony report {run}` draws "
                                   "them", "note"))
        doc.append(D.Beside(text, figs))
    doc += server_blocks(evidence, fig_dir)
    if info.get("failures"):
        doc.append(D.Heading("Failures", 2))
        doc.append(D.Bullets([f"{f.get('config') or f.get('path')}: {f.get('error')}"
                              for f in info["failures"]]))
    if skipped:
        doc.append(D.Heading("Runs not used", 2))
        doc.append(D.Bullets([store.about(p, r) for p, r in skipped]))
    md_path, html_path = dest / "report.md", dest / "report.html"
    store.atomic_write(md_path, D.to_markdown(doc, dest))
    store.atomic_write(html_path, D.to_html(doc, "Harmony suite report"))
    return md_path, html_path


def server_blocks(evidence, fig_dir: Path) -> list:
    """The report's server section: how the scheduler treats each server shape
    (:mod:`harmony.analysis.server_card`) and the latency against the load, per shape ([] without
    server runs)."""
    lines = server_card.section_lines(evidence)
    if not lines:
        return []
    runs = [store.open_run(e.path) for e in evidence if e.experiment == server_card.EXPERIMENT]
    fig_dir.mkdir(parents=True, exist_ok=True)
    figure = plot_latency_by_load(df_latency_by_load(runs), fig_dir / "server-latency-load.png",
                                  title="server: latency against load, per shape")
    return [D.Heading("Server-shaped workloads (experiment server)", 2, "server"),
            D.Pre("\n".join(lines)), D.Figure(figure, "server: latency against load, per shape")]
