"""Figures of one run. Each ``plot_*`` takes the tables it draws and a path, writes a PNG, returns
it.

Times on the x axis are seconds since t0 (the release).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import inspect
import os
import signal
import threading
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import LogFormatter, MaxNLocator  # noqa: E402

from harmony.analysis.arrays import key_table  # noqa: E402
from harmony.analysis.causes import causes_over_time  # noqa: E402
from harmony.core.jit import use_compiled  # noqa: E402
from harmony.core.osutil import die_with_parent  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")


def save_figure(fig, path: Path, dpi: int = 110, rect=(0, 0, 1, 1)) -> Path:
    """Lay ``fig`` out (its axes within ``rect``, figure fractions (left, bottom, right, top):
    the whole figure by default), write it as ``path`` and close it; returns the path. Within
    :func:`written_in_parallel`, the figure is held and written as that block ends."""
    held = getattr(_holding, "figures", None)
    if held is not None:
        held.append(_Work(_write_figure, (fig, Path(path), dpi, rect), fig=fig))
    else:
        _write_figure(fig, path, dpi, rect)
        plt.close(fig)
    return Path(path)


def figure(fn):
    """Decorate a figure function: one that makes a figure from its arguments, writes it to
    its ``path`` argument and returns that path, always. Called within
    :func:`written_in_parallel`, it returns the path at once and its call is held, to be made
    (the figure made and written) by whichever process has its share."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        held = getattr(_holding, "figures", None)
        if held is None:
            return fn(*args, **kwargs)
        path = Path(signature.bind(*args, **kwargs).arguments["path"])     # a bad call: here
        held.append(_Work(fn, args, kwargs))
        return path
    return call


@dataclasses.dataclass
class _Work:
    """One figure held by :func:`written_in_parallel`: the call that makes and writes it (a
    figure function's), or writes it (:func:`_write_figure`, for ``fig``, a figure made
    already, which the block closes whoever wrote it)."""

    fn: object
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    fig: object = None

    def do(self) -> None:
        self.fn(*self.args, **self.kwargs)


def _write_figure(fig, path: Path, dpi: int, rect) -> None:
    """Lay ``fig`` out and write it. Laid out once: ``tight_layout`` leaves a placeholder layout
    engine on the figure, for which ``savefig`` would draw it once more, unrendered, before
    drawing it into the file (the same pixels; a 10.25 M-event import's four figures took
    0.42-0.46 s against 0.46-0.50). Laid out at the dpi it is written at: the layout measures
    every label with the renderer the file is then drawn with, whose measures the drawing reuses
    (laid out at the figure's default dpi, 100, it measured them all again at 110: a 5.4 M-event
    import's four figures 0.56-0.62 s against 0.61-0.67, medians of 4 draws in 5 interleaved
    pairs, 2026-12-07)."""
    fig.set_dpi(dpi)
    fig.tight_layout(rect=rect)
    fig.set_layout_engine(None)
    fig.savefig(path, dpi=dpi)


#: ``figures``: the :class:`_Work` held in this thread inside :func:`written_in_parallel`, in
#: the order it was given; absent or None outside
_holding = threading.local()


@contextlib.contextmanager
def written_in_parallel(processes: int | None = None):
    """Within the block, the figures this thread makes are held, each returning its path at
    once: a :func:`figure` function's call (not made yet), or a figure given to
    :func:`save_figure` (made, not yet laid out nor written). As the block ends, they are made,
    laid out and written by this process and up to ``processes - 1`` processes forked from it,
    one share each (default: as many as the CPUs this process may run on). Making, laying out
    and writing figures is matplotlib's Python (text, ticks, artists: one CPU a process);
    forked, a child has every table and figure as they are here, nothing loaded again.

    A child writes its share and ends (``os._exit``); it dies with the thread that forked it
    (PR_SET_PDEATHSIG), by Ctrl-C or SIGTERM as they come (their default action: this process
    takes the stop), and is killed and reaped if this process stops or fails first. A share
    whose child did not end well (killed, or an error: it says nothing) is written again here,
    where an error is raised as a figure written here raises it. Fewer than two figures or
    CPUs, a nested block, or no fork to be had: they are written here, one after the other.
    An error or stop inside the block: the figures held are closed unwritten."""
    if getattr(_holding, "figures", None) is not None:     # nested: the outer block writes them
        yield
        return
    _holding.figures = held = []
    try:
        yield
        _holding.figures = None
        _write_shares(held, processes)
    finally:
        _holding.figures = None
        for work in held:
            if work.fig is not None:
                plt.close(work.fig)


def _write_shares(held: list, processes: int | None) -> None:
    """Make and write the figures ``held`` (:class:`_Work`), split over this process and
    children forked from it (:func:`written_in_parallel`)."""
    if processes is None:
        processes = len(os.sched_getaffinity(0))
    n = max(1, min(processes, len(held)))
    shares = [held[k::n] for k in range(n)]
    children: dict[int, list] = {}     # pid -> its share, until it ended well
    redo: list = []
    parent = os.getpid()
    if n > 1:
        _ready_to_write()
    # no collection here walks (and copies) the pages the children share; unless another
    # freeze is in force, which is not this block's to end
    frozen = n > 1 and gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        for share in shares[1:]:
            try:
                with warnings.catch_warnings():     # Python 3.12's warning of forks beside threads
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:         # no process to be had: written here
                redo.extend(share)
                continue
            if pid == 0:
                _child_writes(share, parent)    # never returns
            children[pid] = share
        for work in shares[0]:
            work.do()
        for pid in list(children):
            _, status = os.waitpid(pid, 0)
            share = children.pop(pid)
            if status != 0:
                redo.extend(share)
    finally:
        for pid in children:        # this process stopped or failed first: none is left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        if frozen:
            gc.unfreeze()
    for work in redo:
        work.do()


def _ready_to_write() -> None:
    """Load what a process's first PNG loads (matplotlib's Agg backend, Pillow's plugins: ~20
    modules) before forking: once, not in every child; and no child then imports a module that
    another thread of this process was importing as it forked (its lock, held by a thread the
    child does not have, would never be released)."""
    import matplotlib.backends.backend_agg  # noqa: F401
    from PIL import Image, features  # noqa: F401

    Image.preinit()


def _child_writes(share: list, parent: int) -> None:
    """A forked child's work: make and write ``share``, then end (status 0 if every figure was
    written); never returns, nor runs anything of its parent's on the way out."""
    status = 1
    try:
        gc.disable()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        if die_with_parent(parent):
            for work in share:
                work.do()
            status = 0
    except BaseException:       # noqa: BLE001  (the parent writes the share again and says why)
        pass
    finally:
        os._exit(status)


class PlainLogFormatter(LogFormatter):
    """matplotlib's LogFormatter's choice of which ticks to label, each in plain numbers (0.4,
    not 4e-01)."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def plain_log_axis(axis) -> None:
    """Label a log-scaled ``axis`` in plain numbers (0.4, 2, 50), not matplotlib's default
    mathtext (4 x 10^-1); matplotlib still picks which ticks to label."""
    axis.set_major_formatter(PlainLogFormatter())
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


#: a tick label's mean character width in em (DejaVu Sans, matplotlib's font: digits 0.64 em,
#: lowercase letters 0.5-0.65): labels are measured by this estimate, not drawn, since measuring
#: them takes a render of the figure
CHAR_EM = 0.62


def fit_category_labels(ax, labels: list[str]) -> int:
    """Turn a categorical x axis's tick ``labels`` (one a bar, evenly spaced) so that neighbours
    do not overlap: level while the longest fits its bar's slot, 30 degrees (anchored at their
    end) while the slot's height at that angle holds a label's lines, upright beyond. Returns the
    angle."""
    if not labels:
        return 0
    size = ax.xaxis.get_ticklabels()[0].get_fontsize() if ax.xaxis.get_ticklabels() else 10.0
    fig = ax.get_figure()
    slot_in = fig.get_figwidth() * ax.get_position().width / len(labels)
    lines = [str(label).split("\n") for label in labels]
    label_in = CHAR_EM * max(len(line) for label in lines for line in label) * size / 72
    block_in = 1.3 * size / 72 * max(len(label) for label in lines)    # its lines, stacked
    angle = 0 if label_in <= 0.9 * slot_in else 30 if slot_in * 0.5 >= block_in else 90
    if angle:
        ax.set_xticks(ax.get_xticks(), labels, rotation=angle,
                      ha="right" if angle == 30 else "center", rotation_mode="anchor"
                      if angle == 30 else "default")
    return angle


def migration_counts(migrations: pd.DataFrame, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Migrations of each kind present (balance, then wakeup) per bin of ``edges`` (s since t0;
    as ``np.histogram``: the last bin holds its right edge, times outside the edges are left
    out)."""
    t, kind = migrations["t"].to_numpy(), migrations["kind"].to_numpy()
    return {k: np.histogram(t[kind == k], bins=edges)[0] for k in MIGRATION_KINDS
            if len(migrations) and (kind == k).any()}


def integer_axis(axis, values) -> None:
    """Ticks of an axis of whole numbers (a count, an integer parameter) at whole numbers only:
    at each of ``values`` when they are few (one x: one tick, not 7.6 ... 8.4), else where
    matplotlib puts them, rounded to integers."""
    ticks = sorted({int(v) for v in pd.Series(values).dropna()})
    if 0 < len(ticks) <= 8:
        axis.set_ticks(ticks)
    else:
        axis.set_major_locator(MaxNLocator(integer=True))


#: the most bins plot_migrations draws (more: each bin is widened, by a whole factor)
MAX_MIGRATION_BINS = 450

#: the kinds of migration, bottom to top of the stack, and their colours
MIGRATION_KINDS = {"balance": "#c0392b", "wakeup": "#7f8c8d"}


@figure
def plot_migrations(migrations: pd.DataFrame, duration_s: float, bin_s: float, path: Path,
                    title: str = "Migrations over time") -> Path:
    """Migrations of experiment tasks per time bin (``bin_s``, widened by a whole factor to at
    most MAX_MIGRATION_BINS bins; the y label says the width), stacked by kind (balance / wakeup).

    Counted per bin first (:func:`migration_counts`) and drawn as one filled step polygon per
    kind, whatever the number of bins or migrations (a bar per bin took 18 s for 9000 bins; a
    step patch, ``ax.stairs``, 0.7 s to find its limits segment by segment)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    # a 9-inch panel shows ~900 pixels: bins narrower than two are widened to a multiple of bin_s
    bin_s *= max(1, int(np.ceil(duration_s / bin_s / MAX_MIGRATION_BINS)))
    edges = np.arange(0.0, duration_s + bin_s, bin_s)
    counts = migration_counts(migrations, edges)
    if counts:
        below = np.zeros(len(edges), np.int64)      # per edge: the value of the bin it starts
        handles = []
        for kind, n in counts.items():
            top = below + np.append(n, n[-1:])
            handles.append(ax.fill_between(edges, below, top, step="post", lw=0,
                                           color=MIGRATION_KINDS[kind], alpha=0.75, label=kind))
            below = top
        ax.set_ylim(0, max(1, int(below.max())) * 1.05)
        ax.legend(handles=handles, title="kind", loc="upper right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no migrations", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlim(0, duration_s)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))     # counts: whole numbers
    ax.set_xlabel("time since t0 (s)")
    ax.set_ylabel(f"migrations per {bin_s * 1000:g} ms")
    ax.set_title(f"{title} (total {len(migrations)})")
    return save_figure(fig, path)


#: each cause's colour in plot_causes (harmony.analysis.causes.CAUSES): placements grey, the
#: balancer's own decisions warm, moves imposed from outside cool, unknown light
CAUSE_COLOURS = {"wakeup": "#7f8c8d", "fork": "#bdc3c7", "newidle": "#e67e22",
                 "periodic": "#c0392b", "active": "#8e44ad", "affinity": "#2980b9",
                 "numa": "#16a085", "unknown": "#f1c40f"}


@figure
def plot_causes(migrations: pd.DataFrame, duration_s: float, bin_s: float, path: Path) -> Path:
    """Migrations of experiment tasks per time bin, stacked by cause
    (:func:`harmony.analysis.causes.causes_over_time`; bins widened as in
    :func:`plot_migrations`); the legend gives each cause's total, inferred moves included."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    bin_s *= max(1, int(np.ceil(duration_s / bin_s / MAX_MIGRATION_BINS)))
    over = causes_over_time(migrations, bin_s, duration_s)
    edges = np.r_[over["t"].to_numpy(), len(over) * bin_s]
    below = np.zeros(len(edges), np.int64)
    handles = []
    for cause, colour in CAUSE_COLOURS.items():
        n = over[cause].to_numpy()
        if not n.sum():
            continue
        top = below + np.append(n, n[-1:])
        handles.append(ax.fill_between(edges, below, top, step="post", lw=0, color=colour,
                                       alpha=0.8, label=f"{cause} ({n.sum()})"))
        below = top
    if handles:
        ax.set_ylim(0, max(1, int(below.max())) * 1.05)
        ax.legend(handles=handles, title="cause", loc="upper right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no migrations after t0", transform=ax.transAxes, ha="center",
                va="center")
    inferred = int((migrations["inferred"].to_numpy() & (migrations["t"].to_numpy() >= 0)).sum())
    ax.set_xlim(0, duration_s)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))     # counts: whole numbers
    ax.set_xlabel("time since t0 (s)")
    ax.set_ylabel(f"migrations per {bin_s * 1000:g} ms")
    ax.set_title(f"Why tasks moved (total {int(over[list(CAUSE_COLOURS)].to_numpy().sum())}"
                 + (f", {inferred} inferred" if inferred else "") + ")")
    return save_figure(fig, path)


#: a CPU's run queue with more steps than this is drawn as its min-max per bin (STEP_BINS bins):
#: matplotlib took 23 s for 1.1 M steps, and a 9-inch panel shows ~1000 pixels anyway
MAX_STEPS, STEP_BINS = 20_000, 2_000


def step_envelope(t: np.ndarray, nr: np.ndarray, t_end: float,
                  bins: int = STEP_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edges, low, high): the least and greatest value the step function (t, nr) takes in each
    of ``bins`` equal bins of [t[0], t_end] (the value in force at a bin's start included);
    ``edges`` has one more element than low and high."""
    edges = np.linspace(t[0], t_end, bins + 1)
    at_start = nr[np.maximum(np.searchsorted(t, edges[:-1], "right") - 1, 0)]
    low, high = at_start.astype(float), at_start.astype(float)
    k = np.minimum(((t - t[0]) / (t_end - t[0]) * bins).astype(np.int64), bins - 1) \
        if t_end > t[0] else np.zeros(len(t), np.int64)
    # t is sorted, so each bin's steps are one slice: reduced slice by slice (ufunc.at, element
    # by element, took 0.4 s for 5 M steps)
    starts = np.searchsorted(k, np.arange(bins))
    full = np.flatnonzero(np.diff(np.r_[starts, len(k)]) > 0)
    if len(full):
        low[full] = np.minimum(low[full], np.minimum.reduceat(nr, starts[full]))
        high[full] = np.maximum(high[full], np.maximum.reduceat(nr, starts[full]))
    return edges, low, high


#: run-queue rows from which the envelopes are made by the compiled passes where they are not
#: ready already (numba's JIT costs 0.4-1 s to start; the numpy version takes ~0.1-0.3 s at 5 M)
JIT_MIN_STEPS = 20_000_000


def step_envelopes(cpu: np.ndarray, t: np.ndarray, nr: np.ndarray, cpus: list[int],
                   t_end: float, most_steps: int | None = None,
                   bins: int = STEP_BINS) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{CPU: :func:`step_envelope` of its run queue} for each CPU of ``cpus`` whose run queue
    (the rows of the run-queue columns ``cpu``, ``t``, ``nr`` in time order that are its) has
    more than ``most_steps`` steps (default :data:`MAX_STEPS`). Compiled
    (:mod:`harmony.analysis.plots_jit`: two passes over the columns, no copy of a CPU's rows),
    else a CPU at a time: the same arrays."""
    most_steps = MAX_STEPS if most_steps is None else most_steps
    if not (use_compiled(len(t), JIT_MIN_STEPS) and len(cpus)):
        out = {}
        for c in cpus:
            mine = cpu == c
            if np.count_nonzero(mine) > most_steps:
                out[c] = step_envelope(t[mine], nr[mine], t_end, bins)
        return out
    from harmony.analysis import plots_jit  # the compiled kernels: only on this path

    table = key_table(cpus)
    counts, first = np.zeros(len(cpus), np.int64), np.full(len(cpus), -1, np.int64)
    plots_jit.steps_per_cpu(cpu, table, counts, first)
    which = [j for j in range(len(cpus)) if counts[j] > most_steps]
    if not which:
        return {}
    binned = np.full(len(cpus), -1, np.int64)
    binned[which] = np.arange(len(which))
    t0 = t[first[which]].astype(np.float64)
    edges = np.array([np.linspace(a, t_end, bins + 1) for a in t0])
    low, high = np.empty((len(which), bins)), np.empty((len(which), bins))
    plots_jit.envelopes(cpu, t, nr, table, binned, t0, t_end - t0,
                        np.ascontiguousarray(edges[:, :-1]), low, high)
    return {cpus[j]: (edges[k], low[k], high[k]) for k, j in enumerate(which)}


def step_means(t: np.ndarray, nr: np.ndarray, t_end: float, bins: int,
               t_start: float = 0.0) -> np.ndarray:
    """The time-weighted mean of the step function (t, nr) (0 before t[0]) in each of ``bins``
    equal bins of [t_start, t_end]: its integral at the bins' edges, differenced. ``nr`` may be
    a matrix, a column per step function (all stepping at the times t): then a row of means per
    column."""
    edges = np.linspace(t_start, t_end, bins + 1)
    nr = np.asarray(nr, float)
    if not len(t) or t_end <= t_start:
        return np.zeros(nr.shape[1:][::-1] + (bins,))
    t = np.asarray(t, float)
    column = (-1,) + (1,) * (nr.ndim - 1)       # a vector over time, broadcast against nr
    before = np.concatenate([np.zeros((1,) + nr.shape[1:]),      # the integral up to each step
                             np.cumsum(nr[:-1] * np.diff(t).reshape(column), axis=0)])
    k = np.searchsorted(t, edges, "right") - 1
    at = np.maximum(k, 0)
    integral = before[at] + nr[at] * (edges - t[at]).reshape(column)
    integral[k < 0] = 0.0
    return (np.diff(integral, axis=0) / np.diff(edges).reshape(column)).T


#: above this many CPUs a panel per CPU is unreadable (128 CPUs: a figure 15 600 pixels tall,
#: 10 s to draw): the run queues are one heat map instead, a row per CPU, HEAT_BINS time bins
MANY_CPUS, HEAT_BINS = 16, 300


@figure
def plot_runqueue(runqueue: pd.DataFrame, cpus: list[int], ntasks: int, duration_s: float,
                  path: Path, t_balanced: float | None = None, tolerance: float = 0.15,
                  t_first_balanced: float | None = None) -> Path:
    """Per-CPU run-queue length of experiment tasks as the exact step function, one panel per CPU
    (a CPU with more than MAX_STEPS steps: its least and greatest length in each of STEP_BINS
    time bins, which the title says); beyond :data:`MANY_CPUS` CPUs one heat map, each CPU's
    mean length per time bin. ``t_balanced``: balanced for good from then (a green line);
    ``t_first_balanced``: first balanced then, if earlier (balance lost and regained: dotted)."""
    first = (t_first_balanced if t_first_balanced is not None and t_balanced is not None
             and t_first_balanced < t_balanced else None)
    n = len(cpus)
    if n > MANY_CPUS:
        return _runqueue_heat_map(runqueue, cpus, ntasks, duration_s, path, t_balanced, first,
                                  tolerance)
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.2 + 1.1 * n), sharex=True, sharey=True,
                             squeeze=False)
    fair = ntasks / n
    colours = sns.color_palette("colorblind", n)
    top = max(int(runqueue["nr"].max()) if len(runqueue) else 1, int(np.ceil(fair)) + 1)
    rq_cpu, rq_t, rq_nr = (runqueue[c].to_numpy() for c in ("cpu", "t", "nr"))
    envelopes = step_envelopes(rq_cpu, rq_t, rq_nr, list(cpus), duration_s)
    binned = bool(envelopes)
    for ax, cpu, colour in zip(axes[:, 0], cpus, colours):
        if cpu in envelopes:
            edges, low, high = envelopes[cpu]
            low, high = np.append(low, low[-1]), np.append(high, high[-1])
            ax.fill_between(edges, low, step="post", alpha=0.25, color=colour, lw=0)
            ax.fill_between(edges, low, high, step="post", alpha=0.6, color=colour, lw=0)
        else:
            mine = rq_cpu == cpu        # the two columns drawn, not a copy of the whole table
            q_t, q_nr = rq_t[mine], rq_nr[mine]
            t = np.concatenate([q_t, [duration_s]])
            nr = np.concatenate([q_nr, q_nr[-1:] if len(q_t) else [0]])
            ax.step(t, nr, where="post", color=colour, lw=1.0)
            ax.fill_between(t, nr, step="post", alpha=0.25, color=colour)
        ax.axhspan(fair * (1 - tolerance), fair * (1 + tolerance), color="0.5", alpha=0.15, lw=0)
        ax.axhline(fair, color="0.3", ls="--", lw=0.8)
        if t_balanced is not None:
            ax.axvline(t_balanced, color="#27ae60", lw=1.0)
        if first is not None:
            ax.axvline(first, color="#27ae60", lw=1.0, ls=":")
        ax.set_ylabel(f"CPU {cpu}")
        ax.set_ylim(0, top + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # tasks: whole, few
    axes[-1, 0].set_xlim(0, duration_s)
    axes[-1, 0].set_xlabel("time since t0 (s)")
    note = _balanced_note(t_balanced, first, tolerance)
    if binned:
        width_ms = duration_s / STEP_BINS * 1e3
        note += (f"\ndark band: least to greatest length per {width_ms:.3g} ms, as the steps "
                 "are too many to draw")
    axes[0, 0].set_title(f"Run queue per CPU (running + waiting experiment tasks; dashed: "
                         f"N/P = {fair:g}{note})", fontsize=10)
    return save_figure(fig, path)


def _balanced_note(t_balanced: float | None, first: float | None, tolerance: float) -> str:
    """What the run-queue figure's green lines mean, for its title ("" without them)."""
    if t_balanced is None:
        return ""
    if first is None:
        return f"; green: balanced within {tolerance:.0%} at {t_balanced:.3f} s"
    return (f";\ngreen: balanced within {tolerance:.0%} first at {first:.3f} s (dotted), for good "
            f"from {t_balanced:.3f} s")


def runqueue_means(runqueue: pd.DataFrame, cpus: list[int], t_start: float, t_end: float,
                   bins: int) -> np.ndarray:
    """A row per CPU of ``cpus``: its run queue's time-weighted mean length in each of ``bins``
    equal bins of [t_start, t_end] s (:func:`step_means`)."""
    rq_cpu, rq_t, rq_nr = (runqueue[c].to_numpy() for c in ("cpu", "t", "nr"))
    by_cpu = np.argsort(rq_cpu, kind="stable")      # each CPU's rows, in time order, one slice
    lo, hi = (np.searchsorted(rq_cpu[by_cpu], cpus, side) for side in ("left", "right"))
    return np.vstack([step_means(rq_t[by_cpu[a:b]], rq_nr[by_cpu[a:b]], t_end, bins, t_start)
                      for a, b in zip(lo, hi)]).reshape(len(cpus), bins)


def heat_rows(ax, grid: np.ndarray, x_edges: np.ndarray, labels: list, ylabel: str, cmap,
              norm):
    """Draw ``grid`` (a row per label, a column per pair of ``x_edges``) on ``ax``, the first
    row at the top, at most 32 of the labels written; returns the mesh (for a colour bar)."""
    n = len(labels)
    mesh = ax.pcolormesh(x_edges, np.arange(n + 1), grid, cmap=cmap, norm=norm, shading="flat")
    step = max(1, int(np.ceil(n / 32)))
    ax.set_yticks(np.arange(0, n, step) + 0.5, [str(x) for x in labels[::step]], fontsize=7)
    ax.set_ylim(n, 0)
    ax.set_ylabel(f"{ylabel} ({n})")
    ax.grid(False)
    return mesh


def heat_height(rows: int) -> float:
    """Inches for a heat map of ``rows`` rows: readable, never taller than a screen."""
    return min(12.0, 2.4 + 0.05 * rows)


def fair_norm(top: float, fair: float):
    """A colour scale from 0 to ``top`` or more with ``fair`` at its centre (white in "vlag"):
    to at least twice fair, so that as far above fair is as red as as far below is blue, and a
    value a rounding above fair is white (without a fair, from 0 to ``top``)."""
    from matplotlib.colors import Normalize, TwoSlopeNorm

    if fair <= 0:
        return Normalize(0, top)
    return TwoSlopeNorm(vmin=0, vcenter=fair, vmax=max(top, 2 * fair))


def _runqueue_heat_map(runqueue: pd.DataFrame, cpus: list[int], ntasks: int, duration_s: float,
                       path: Path, t_balanced: float | None, first: float | None,
                       tolerance: float) -> Path:
    """:func:`plot_runqueue` for many CPUs: a row per CPU, its mean run-queue length in each of
    :data:`HEAT_BINS` time bins, white at the fair N/P, red above it, blue below."""
    n, fair = len(cpus), ntasks / len(cpus)
    grid = runqueue_means(runqueue, cpus, 0.0, duration_s, HEAT_BINS)
    fig, ax = plt.subplots(figsize=(9, heat_height(n)))
    mesh = heat_rows(ax, grid, np.linspace(0, duration_s, HEAT_BINS + 1), cpus, "CPU", "vlag",
                     fair_norm(float(grid.max()), fair))
    ax.set_xlabel("time since t0 (s)")
    bar = fig.colorbar(mesh, ax=ax, pad=0.015)
    bar.set_label("run-queue length, mean per bin")
    bar.ax.axhline(fair, color="black", lw=1)
    for x, ls in ((t_balanced, "-"), (first, ":")):
        if x is not None:
            ax.axvline(x, color="#27ae60", lw=1.2, ls=ls)
    ax.set_title(f"Run queue per CPU (running + waiting experiment tasks), mean per "
                 f"{duration_s / HEAT_BINS * 1e3:.3g} ms;\nwhite: N/P = {fair:g}, red above, blue "
                 f"below{_balanced_note(t_balanced, first, tolerance)}", fontsize=10)
    return save_figure(fig, path)


#: above this many tasks a bar per task is unreadable, and the figure as wide as they are many
#: (2000 tasks: 110 000 pixels, 8 s to draw): the tasks are drawn as points ranked by share
MANY_TASKS = 40


def ranked(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``df`` sorted by ``by`` with a ``rank`` column (0, 1, ...): the x axis of a figure with
    too many tasks to name (:data:`MANY_TASKS`)."""
    return df.sort_values(by, kind="stable").reset_index(drop=True).assign(rank=lambda d: d.index)


@figure
def plot_shares(shares: pd.DataFrame, path: Path,
                title: str = "CPU share per task vs fair share") -> Path:
    """Each task's CPU share over the run (bars; points ranked by share beyond
    :data:`MANY_TASKS` tasks) against its fair share (black)."""
    hue = "role" if shares["role"].nunique() > 1 else None
    if len(shares) > MANY_TASKS:
        order = ranked(shares, ["role", "share"])
        fig, ax = plt.subplots(figsize=(9, 3.6))
        sns.scatterplot(data=order, x="rank", y="share", hue=hue, s=12, linewidth=0, ax=ax,
                        color=None if hue else "#2980b9", **({} if hue else {"label": "share"}))
        ax.plot(order["rank"], order["fair"], color="black", lw=1, label="fair share")
        ax.set_xlabel(f"task ({len(order)}, ranked by share{' within its role' if hue else ''})")
        # many tasks share the CPUs: their shares are small, and scaled to one CPU they vanish
        top = 1.15 * float(max(order["share"].max(), order["fair"].max(), 1e-3))
        legend_at = "lower right"
    else:
        fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(shares) + 3), 3.6))
        order = shares.sort_values("name")
        # a task has one role: its bar centred on its name, not dodged beside an empty slot
        sns.barplot(data=order, x="name", y="share", hue=hue, ax=ax, dodge=False,
                    color=None if hue else "#2980b9")
        ax.scatter(np.arange(len(order)), order["fair"], marker="_", s=600, color="black",
                   zorder=3, label="fair share")
        ax.set_xlabel("task")
        fit_category_labels(ax, list(order["name"].astype(str)))
        top = max(1.05, float(order["share"].max()) * 1.1)
        legend_at = "best"      # a few bars: where it covers none
    ax.set_ylim(0, top)
    ax.set_ylabel("share of one CPU")
    ax.set_title(title)
    ax.legend(loc=legend_at, fontsize=8)
    return save_figure(fig, path)
