"""Figures of large runs: a run queue with more steps than can be drawn is drawn as its envelope."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import forks_counted, host_skip

from harmony.analysis import plots
from harmony.core.jit import numba_version
from harmony.core.osutil import pid_alive


def test_step_envelope_keeps_every_spike_and_dip():
    # 0 .. 10 s in 5 bins of 2 s; value 1 from t=0, a spike to 5 at 3.0-3.001 s, a dip to 0 at 7 s
    t = np.array([0.0, 3.0, 3.001, 7.0, 7.5])
    nr = np.array([1, 5, 1, 0, 1])
    edges, low, high = plots.step_envelope(t, nr, 10.0, bins=5)
    assert list(edges) == [0, 2, 4, 6, 8, 10]
    assert list(high) == [1, 5, 1, 1, 1]       # the spike's bin
    assert list(low) == [1, 1, 1, 0, 1]        # the dip's bin; bin 4 takes the value in force (1)


def test_step_envelope_takes_the_value_in_force_at_a_bins_start():
    t, nr = np.array([0.0, 0.5, 2.0]), np.array([3, 2, 1])   # bins of 1 s; 1 from t=2 on
    _, low, high = plots.step_envelope(t, nr, 4.0, bins=4)
    assert list(low) == [2, 2, 1, 1] and list(high) == [3, 2, 1, 1]


@pytest.mark.parametrize("seed", range(30))
def test_every_cpus_envelope_compiled_is_the_one_a_cpu_at_a_time_gives(seed, monkeypatch):
    """plots.step_envelopes: the compiled passes over the run-queue columns (HARMONY_JIT=1) and
    a CPU at a time (0) give the same CPUs and arrays, and each is step_envelope of that CPU's
    rows: CPUs interleaved, steps at one instant, steps exactly at a bin's start, rows of CPUs
    not drawn, CPUs with too few steps or none, a window ending at a CPU's first step, one bin."""
    if not numba_version():
        host_skip("numba is not installed: the compiled passes cannot run")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    coarse = seed % 3 == 0      # times on a grid: ties, and steps at the bins' starts
    t = np.sort(rng.integers(0, 40, n) / 4 if coarse else rng.uniform(0, 10, n))
    cpu = rng.choice([0, 1, 3, 7], n, p=[0.5, 0.3, 0.15, 0.05]).astype(np.int32)
    nr = rng.integers(0, 6, n).astype(np.int32)
    cpus = [0, 1, 3, 5] if seed % 2 else [3, 0]       # 7 is never drawn, 5 has no step
    t_end = float(t[-1] + rng.uniform(0, 3)) if seed % 5 else float(t[0])
    bins = 1 if seed % 7 == 0 else int(rng.integers(2, 60)) if seed % 4 else 40
    most = int(rng.integers(0, max(1, n // 3)))
    got = {}
    for jit in ("0", "1"):
        monkeypatch.setenv("HARMONY_JIT", jit)
        got[jit] = plots.step_envelopes(cpu, t, nr, cpus, t_end, most_steps=most, bins=bins)
    assert got["0"].keys() == got["1"].keys()
    assert set(got["0"]) == {c for c in cpus if np.count_nonzero(cpu == c) > most}
    for c, arrays in got["1"].items():
        mine = cpu == c
        for ours, numpy_, one in zip(arrays, got["0"][c],
                                     plots.step_envelope(t[mine], nr[mine], t_end, bins)):
            assert np.array_equal(ours, numpy_) and np.array_equal(ours, one)


def test_a_run_queue_with_too_many_steps_is_drawn_binned(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "MAX_STEPS", 100)
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(0, 2, 1000))
    rq = pd.DataFrame({"t": np.concatenate([t, t]), "cpu": np.repeat([0, 1], 1000),
                       "nr": rng.integers(0, 4, 2000), "ts": 0})
    drawn = []
    real = plots.plt.Axes.set_title

    def title(ax, text, *a, **k):
        drawn.append(text)
        return real(ax, text, *a, **k)

    monkeypatch.setattr(plots.plt.Axes, "set_title", title)
    out = plots.plot_runqueue(rq, [0, 1], 4, 2.0, tmp_path / "rq.png")
    assert out.stat().st_size > 0 and "dark band: least to greatest" in drawn[0]
    monkeypatch.setattr(plots, "MAX_STEPS", 10_000)          # few enough: the exact steps
    plots.plot_runqueue(rq, [0, 1], 4, 2.0, tmp_path / "rq2.png")
    assert "dark band" not in drawn[1]
    # balance lost and regained: both times, the first one dotted
    lines = []
    real_vline = plots.plt.Axes.axvline

    def vline(ax, x, *a, **k):
        lines.append((x, k.get("ls", "-")))
        return real_vline(ax, x, *a, **k)

    monkeypatch.setattr(plots.plt.Axes, "axvline", vline)
    plots.plot_runqueue(rq, [0, 1], 4, 2.0, tmp_path / "rq3.png", t_balanced=1.5,
                        t_first_balanced=0.2)
    assert "first at 0.200 s (dotted), for good from 1.500 s" in drawn[2]
    assert lines == [(1.5, "-"), (0.2, ":")] * 2
    plots.plot_runqueue(rq, [0, 1], 4, 2.0, tmp_path / "rq4.png", t_balanced=1.5,
                        t_first_balanced=1.5)        # never lost: one line, as before
    assert drawn[3].count("balanced within 15% at 1.500 s") == 1 and len(lines) == 6


def _png_size(path):
    import struct
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


def _shares(n, roles=("heavy", "light"), seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"pid": np.arange(1000, 1000 + n, dtype=np.int32),
                         "name": [f"t{i:04d}" for i in range(n)],
                         "role": pd.Categorical([roles[i % len(roles)] for i in range(n)]),
                         "share": rng.uniform(0, 0.01, n), "fair": np.full(n, 2 / n)})


def test_many_tasks_are_drawn_ranked_not_a_bar_each(tmp_path, monkeypatch):
    """2000 tasks made a 110 000-pixel-wide bar chart; beyond MANY_TASKS they are points ranked
    by share in a figure of the usual size, and its x axis says so."""
    from harmony.analysis import plots_mixed
    xlabels = []
    real = plots.plt.Axes.set_xlabel
    monkeypatch.setattr(plots.plt.Axes, "set_xlabel",
                        lambda ax, text, *a, **k: (xlabels.append(text),
                                                   real(ax, text, *a, **k))[1])
    many, few = _shares(2000), _shares(plots.MANY_TASKS)
    assert _png_size(plots.plot_shares(many, tmp_path / "many.png"))[0] <= 1000
    assert _png_size(plots.plot_shares(few, tmp_path / "few.png"))[0] > 1000    # a bar each
    static = _shares(2000, seed=1).assign(pid=lambda d: d["pid"] + 5000)       # another run's pids
    out = plots_mixed.plot_shares_vs_static(many, static, tmp_path / "vs.png")
    assert _png_size(out)[0] <= 1000
    assert [x for x in xlabels if x.startswith("task")] == [
        "task (2000, ranked by share within its role)", "task",
        "task (2000, ranked by static ideal share within its role)"]


@pytest.mark.parametrize("names, width", [
    ([f"hmy-pp-{22098 + i}" for i in range(4)], 5.0),     # an import's comm-pid names
    ([f"hmy-worker-{i}" for i in range(10)], 8.0),
    ([f"w{i}" for i in range(4)], 5.0),                    # short: left level
    ([f"hmy-pp-{i}\nheavy" for i in range(6)], 7.2),      # two lines (name, role)
    ([f"a-much-longer-task-name-{i}" for i in range(12)], 9.0)])
def test_category_labels_do_not_overlap(names, width):
    """The tick labels of a bar per task, turned as fit_category_labels chooses, do not overlap
    their neighbours as matplotlib draws them (their rendered boxes, not the estimate the choice
    rests on); an import's four comm-pid names overlapped level."""
    fig, ax = plots.plt.subplots(figsize=(width, 3.6))
    ax.bar(range(len(names)), np.ones(len(names)))
    ax.set_xticks(range(len(names)), names)
    angle = plots.fit_category_labels(ax, names)
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
    plots.plt.close(fig)
    if angle in (0, 90):
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), (angle, boxes)
    else:       # turned: neighbours' boxes overlap as rectangles; their text runs parallel, apart
        import math
        step = boxes[1].x1 - boxes[0].x1              # anchored at their ends: one slot apart
        gap = step * math.sin(math.radians(angle))    # between two parallel lines of text
        lines = max(n.count("\n") + 1 for n in names)
        height = lines * max(t.get_fontsize() for t in ax.get_xticklabels()) * fig.dpi / 72
        assert gap > height, (gap, height)
    assert angle == 0 or names[0] != "w0"


def _record_xticks(monkeypatch) -> list:
    """The tick labels of every set_xticks call from now on (None: positions only)."""
    ticks = []
    real = plots.plt.Axes.set_xticks

    def set_xticks(ax, t, labels=None, **k):
        ticks.append(list(labels) if labels is not None else None)
        return real(ax, t, labels, **k)

    monkeypatch.setattr(plots.plt.Axes, "set_xticks", set_xticks)
    return ticks


def test_time_to_balance_figure_keeps_the_runs_never_balanced(tmp_path, monkeypatch):
    """Both experiments the policy card reads the time from get a strip; an experiment whose
    runs never balanced for good keeps its place, with how many in its label."""
    from harmony.analysis import report_suite
    df = pd.DataFrame({"experiment": ["time-to-resolve", "time-to-resolve", "single-source",
                                      "single-source", "detection"],
                       "time_to_balance_s": [None, None, 0.0033, 0.0034, None]})
    ticks = _record_xticks(monkeypatch)
    out = report_suite.plot_time_to_balance(df, tmp_path / "ttb.png")
    assert out.stat().st_size > 0
    assert ticks[-1] == ["time-to-resolve\n(2 of 2 never)", "single-source"]
    assert report_suite.plot_time_to_balance(df[df["experiment"] == "detection"],
                                             tmp_path / "none.png") is None


def test_strip_figure_says_how_many_runs_have_a_metric(tmp_path, monkeypatch):
    from harmony.analysis import report_suite
    df = pd.DataFrame({"experiment": "detection", "interval1_ms": [33.0, 59.2, 9.4, 20.9],
                       "interval3_ms": [None, 568.0, 240.0, 516.0]})
    ticks = _record_xticks(monkeypatch)
    report_suite.plot_points(df, "detection", ["interval1_ms", "interval3_ms"],
                             tmp_path / "det.png", "Detection", "ms")
    assert ticks[-1] == ["interval1_ms", "interval3_ms\n(3 of 4 runs)"]


def test_migrations_are_counted_per_bin_and_bins_widened_to_what_a_panel_shows(tmp_path,
                                                                               monkeypatch):
    mig = pd.DataFrame({"t": [0.05, 0.06, 0.15, 0.95, 1.0, 5.0], "kind": ["balance", "wakeup",
                                                                          "balance", "balance",
                                                                          "wakeup", "balance"]})
    counts = plots.migration_counts(mig, np.arange(0.0, 1.1, 0.1))
    assert list(counts) == ["balance", "wakeup"]          # bottom to top of the stack
    assert counts["balance"].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1]   # 5.0 s: outside
    assert counts["wakeup"].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]    # 1.0 s: the last bin
    assert plots.migration_counts(mig.iloc[:0], np.arange(0.0, 1.1, 0.1)) == {}
    labels = []
    real = plots.plt.Axes.set_ylabel
    monkeypatch.setattr(plots.plt.Axes, "set_ylabel",
                        lambda ax, text, *a, **k: labels.append(text) or real(ax, text, *a, **k))
    plots.plot_migrations(mig, 6.0, 0.1, tmp_path / "m.png")
    plots.plot_migrations(mig, 600.0, 0.1, tmp_path / "m2.png")   # 6000 bins: widened 14x
    plots.plot_migrations(mig.iloc[:0], 6.0, 0.1, tmp_path / "m3.png")
    assert labels == ["migrations per 100 ms", "migrations per 1400 ms", "migrations per 100 ms"]
    assert all((tmp_path / f).stat().st_size > 0 for f in ("m.png", "m2.png", "m3.png"))


def test_step_means_are_the_step_functions_average_per_bin():
    rng = np.random.default_rng(5)
    t = np.sort(rng.uniform(0.1, 2.0, 300))
    nr = rng.integers(0, 6, 300)
    means = plots.step_means(t, nr, 2.0, 40)
    fine = np.linspace(0, 2.0, 40 * 5000, endpoint=False) + 2.0 / (40 * 5000) / 2
    k = np.searchsorted(t, fine, "right") - 1
    value = np.where(k >= 0, nr[np.maximum(k, 0)], 0)      # 0 before the first step
    assert np.allclose(means, value.reshape(40, -1).mean(axis=1), atol=2e-3)
    assert not plots.step_means(t[:0], nr[:0], 2.0, 4).any()


def test_step_means_of_a_window_and_of_functions_stepping_together():
    """A window [a, b] takes the value in force at a from the step before it; a matrix of step
    functions sharing their times gives each column's means, as one at a time does."""
    rng = np.random.default_rng(6)
    t = np.sort(rng.uniform(0.1, 2.0, 200))
    nr = rng.integers(0, 6, (200, 3))
    fine = np.linspace(0.7, 1.3, 30 * 4000, endpoint=False) + 0.6 / (30 * 4000) / 2
    value = nr[np.searchsorted(t, fine, "right") - 1]
    means = plots.step_means(t, nr, 1.3, 30, t_start=0.7)
    assert means.shape == (3, 30)
    assert np.allclose(means, value.reshape(30, -1, 3).mean(axis=1).T, atol=3e-3)
    assert np.allclose(means[1], plots.step_means(t, nr[:, 1], 1.3, 30, t_start=0.7))
    assert plots.step_means(t[:0], nr[:0], 2.0, 4).shape == (3, 4)


def test_many_cpus_are_one_heat_map_not_a_panel_each(tmp_path, monkeypatch):
    """128 CPUs as 128 panels made a figure 15 600 pixels tall that took 10 s to draw: beyond
    MANY_CPUS the run queues are a heat map of a readable size, the fair length at its centre."""
    import matplotlib.image
    rng = np.random.default_rng(2)
    n = 64
    t = np.sort(rng.uniform(0, 2, 40 * n))
    rq = pd.DataFrame({"t": t, "cpu": rng.integers(0, n, len(t)), "nr": rng.integers(0, 5, len(t)),
                       "ts": 0}).sort_values(["cpu", "t"], kind="stable")
    drawn = []
    real = plots.plt.Axes.set_title
    monkeypatch.setattr(plots.plt.Axes, "set_title",
                        lambda ax, text, *a, **k: drawn.append(text) or real(ax, text, *a, **k))
    out = plots.plot_runqueue(rq, list(range(n)), 2 * n, 2.0, tmp_path / "rq.png", t_balanced=1.0)
    height, width = matplotlib.image.imread(out).shape[:2]
    assert height < 1400 and width < 1200, (height, width)
    assert "mean per 6.67 ms" in drawn[0] and "white: N/P = 2" in drawn[0]
    assert "balanced within 15% at 1.000 s" in drawn[0]
    # a CPU set with gaps: each row is its own CPU's (CPU 1's rows are no row of CPU 0's)
    means = []
    monkeypatch.setattr(plots, "step_means",
                        lambda t, nr, *a: means.append(len(t)) or np.zeros(a[1]))
    plots.plot_runqueue(rq, list(range(0, n, 2)), n, 2.0, tmp_path / "even.png")
    assert means == [int((rq["cpu"] == c).sum()) for c in range(0, n, 2)]
    # not beyond it: a panel each (16 of them: 64 panels took 8 s to draw and tell no more)
    monkeypatch.setattr(plots, "MANY_CPUS", 16)
    few = rq[rq["cpu"] < 16]
    out = plots.plot_runqueue(few, list(range(16)), 32, 2.0, tmp_path / "panels.png")
    assert matplotlib.image.imread(out).shape[0] > 16 * 100


# --- what a figure shows, read from matplotlib's own objects -----------------------------------

def _keep_figures(monkeypatch, module, name="save_figure") -> list:
    """The figures ``module.<name>`` saves from now on (still saved and closed as before; their
    axes, artists and ticks stay readable)."""
    kept = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda fig, path, *a, **k: kept.append(fig)
                        or real(fig, path, *a, **k))
    return kept


def _legends(ax) -> list:
    from matplotlib.legend import Legend
    return [c for c in ax.get_children() if isinstance(c, Legend)]


def _drawn(artist, ax) -> bool:
    """The artist puts something on the panel: a line of two points or more, or a marker, or a
    point of a scatter, or an area of some height, inside the axes' limits."""
    from matplotlib.collections import PathCollection, PolyCollection
    if isinstance(artist, PathCollection):
        xy = np.asarray(artist.get_offsets(), float).reshape(-1, 2)
    elif isinstance(artist, PolyCollection):            # a filled area: of some height
        xy = np.concatenate([p.vertices for p in artist.get_paths()] or [np.zeros((0, 2))])
        if not len(xy) or np.ptp(xy[:, 1]) <= 0:
            return False
    else:
        xy = np.column_stack([artist.get_xdata(), artist.get_ydata()]).astype(float)
        marker = artist.get_marker() not in (None, "None", "", " ")
        line = artist.get_linestyle() not in ("None", "", " ") and len(xy) >= 2
        if not (marker or line):
            return False
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    return bool(((xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0)
                 & (xy[:, 1] <= y1)).any())


def _every_legend_entry_drawn(ax) -> list[str]:
    """The labels of ``ax``'s legend (the first legend), each checked to name an artist drawn."""
    labels = [t.get_text() for t in _legends(ax)[0].get_texts()]
    for label in labels:
        artists = [a for a in ax.lines + ax.collections if a.get_label() == label]
        assert artists and any(_drawn(a, ax) for a in artists), f"{label!r} is not drawn"
    return labels


def _integer_ticks(axis) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_ticklocs() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    return ticks


def test_how_many_draws_both_predictions_at_a_single_x_with_whole_ticks(tmp_path, monkeypatch):
    """8 CPUs, one x (the quick suite): the predictions are one point each, which a line alone
    never shows; both are drawn, even where they are equal (2 CPUs), and x = 32 is one tick."""
    from harmony.analysis import report_suite
    kept = _keep_figures(monkeypatch, report_suite, "_save")
    for pairwise in (16.0, 4.0):                         # 8 CPUs; 2 CPUs: the same number
        df = pd.DataFrame({"experiment": "how-many", "x": [32, 32], "first_round_moved": [4, 3],
                           "poly_prediction": [4.0, 4.0], "pairwise_prediction": pairwise})
        report_suite.plot_how_many(df, tmp_path / "how_many.png")
        ax = kept[-1].axes[0]
        labels = _every_legend_entry_drawn(ax)
        assert labels == ["runs (2)", "poly-balance: q_src - N/P",
                          "pairwise: (q_src - q_target)/2"]
        assert _integer_ticks(ax.xaxis) == [32]
        _integer_ticks(ax.yaxis)
        assert ax.get_ylim()[1] > pairwise


def test_causes_and_migrations_count_in_whole_numbers(tmp_path, monkeypatch):
    """A few migrations per bin: the count axis has no tick at 0.2."""
    kept = _keep_figures(monkeypatch, plots)
    mig = pd.DataFrame({"t": [0.05, 0.06, 0.15, 0.95], "kind": "balance",
                        "cause": ["periodic", "newidle", "periodic", "wakeup"],
                        "inferred": [False, False, True, False]})
    plots.plot_causes(mig, 1.0, 0.1, tmp_path / "causes.png")
    plots.plot_migrations(mig, 1.0, 0.1, tmp_path / "migrations.png")
    for fig in kept:
        ax = fig.axes[0]
        _every_legend_entry_drawn(ax)
        assert max(_integer_ticks(ax.yaxis)) >= 2


def test_latency_by_load_shows_every_shape_and_percentile_at_one_load(tmp_path, monkeypatch):
    """One load (the quick suite): every run a marker; the legends name each shape (its
    colour drawn) and each percentile (its marker drawn), not line styles a single load never
    shows."""
    from matplotlib.markers import MarkerStyle

    from harmony.analysis import plots_requests
    kept = _keep_figures(monkeypatch, plots_requests)
    df = pd.DataFrame({"shape": ["event-loop", "event-loop", "thread-per-core"], "load": 0.5,
                       "latency_p50_ms": [0.5, 0.6, 0.7], "latency_p99_ms": [3.0, 3.5, 4.0],
                       "latency_p999_ms": [9.0, None, 8.0]})
    plots_requests.plot_latency_by_load(df, tmp_path / "lat.png")
    ax = kept[-1].axes[0]
    shapes, percentiles = _legends(ax)
    drawn = [c for c in ax.collections if _drawn(c, ax)]
    colours = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in drawn}
    for handle, text in zip(shapes.legend_handles, shapes.get_texts()):
        from matplotlib.colors import to_rgb
        assert tuple(np.round(to_rgb(handle.get_color()), 3)) in colours, text.get_text()
    def outline(marker):
        style = MarkerStyle(marker)
        return style.get_path().transformed(style.get_transform()).vertices

    texts = [t.get_text() for t in percentiles.get_texts()]
    assert texts == ["p50", "p99", "p99.9"]
    for handle, text in zip(percentiles.legend_handles, texts):    # its marker is on the panel
        shape = outline(handle.get_marker())
        assert any(c.get_paths()[0].vertices.shape == shape.shape
                   and np.allclose(c.get_paths()[0].vertices, shape) for c in drawn), text


def test_a_delay_of_zero_is_drawn_from_zero_in_its_unit(tmp_path, monkeypatch):
    """Every steal latency 0 (a simulated suite): the axis starts at 0 ms (no negative delay),
    and the metric is labelled without the unit of its column."""
    from harmony.analysis import report_suite
    kept = _keep_figures(monkeypatch, report_suite, "_save")
    ticks = _record_xticks(monkeypatch)
    df = pd.DataFrame({"experiment": "work-conservation", "steal_latency_s": [0.0, 0.0, 0.0]})
    report_suite.plot_points(df, "work-conservation", ["steal_latency_s"], tmp_path / "s.png",
                             "Idle target", "ms", 1000, {"steal_latency_s": "steal latency"})
    ax = kept[-1].axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 0
    assert ticks[-1] == ["steal latency"]


def test_first_round_draws_equal_predictions_at_one_x(tmp_path, monkeypatch):
    """A how-many run's own figure, 2 CPUs, one x: the two predictions are the same number and
    a single point each; both show, and the axes count in whole numbers."""
    from harmony.analysis import plots_rounds
    kept = _keep_figures(monkeypatch, plots_rounds)
    df = pd.DataFrame({"path": ["a"], "x": [8], "ncpus": [2], "first_round_moved": [3],
                       "poly_prediction": [4.0], "pairwise_prediction": [4.0]})
    plots_rounds.plot_first_round(df, tmp_path / "first_round.png")
    ax = kept[-1].axes[0]
    assert len(_every_legend_entry_drawn(ax)) == 3
    assert _integer_ticks(ax.xaxis) == [8]
    _integer_ticks(ax.yaxis)
    assert ax.get_title().endswith("(1 run)")


def test_log_axes_are_labelled_in_plain_numbers():
    """A latency axis from 0.3 to 8 ms read "4 x 10^-1" (matplotlib's mathtext) or "4e-01";
    plain_log_axis labels the ticks matplotlib chooses as numbers a reader reads at once."""
    fig, ax = plots.plt.subplots()
    ax.plot([0, 1], [0.3, 8])
    ax.set_yscale("log")
    plots.plain_log_axis(ax.yaxis)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()
              if t.get_text()]
    plots.plt.close(fig)
    assert {"1"} <= set(labels) and len(labels) >= 3, labels
    assert all("$" not in x and "e" not in x and float(x) > 0 for x in labels), labels


# --- figures written by processes forked for them (plots.written_in_parallel) -------------------

def _sine_figure(k: int, title: str):
    """A small figure of its own: a sine of period ``k + 1``, titled."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(np.arange(60), np.sin(np.arange(60) / (k + 1)))
    ax.set_title(title)
    return fig


def _made(tmp_path: Path, tag: str, n: int = 5) -> list[Path]:
    """``n`` figures of their own given to save_figure, into ``tmp_path/tag``; their paths."""
    (tmp_path / tag).mkdir()
    return [plots.save_figure(_sine_figure(i, f"figure {i}"), tmp_path / tag / f"f{i}.png")
            for i in range(n)]


def test_figures_written_in_parallel_are_the_ones_written_one_after_the_other(tmp_path,
                                                                              monkeypatch):
    """Held until the block ends, then written by this process and two forked ones: the same
    files, byte for byte, as save_figure writes at once outside the block; every figure closed,
    every child reaped."""
    import matplotlib.pyplot as plt

    serial = _made(tmp_path, "serial")
    open_before = plt.get_fignums()
    forked = forks_counted(monkeypatch)
    with plots.written_in_parallel(3):
        split = _made(tmp_path, "split")
        assert not any(p.exists() for p in split)
    assert len(forked) == 2 and not any(pid_alive(pid) for pid in forked)
    assert [p.read_bytes() for p in split] == [p.read_bytes() for p in serial]
    assert plt.get_fignums() == open_before


@plots.figure
def _sine(k: int, path: Path) -> Path:
    """A figure function of the tests': a sine, its pid written beside it (``.pid``)."""
    path.with_suffix(".pid").write_text(str(os.getpid()))
    return plots.save_figure(_sine_figure(k, f"sine {k}"), path)


def test_figure_functions_are_made_by_the_process_that_has_their_share(tmp_path, monkeypatch):
    """A @figure function called in the block returns its path before the figure is made; the
    calls are then made, shared out, by this process and a forked one (each writes its pid), and
    give the files the same calls give one after the other, outside the block."""
    (tmp_path / "serial").mkdir()
    (tmp_path / "split").mkdir()
    serial = [_sine(k, tmp_path / "serial" / f"s{k}.png") for k in range(4)]
    forked = forks_counted(monkeypatch)
    with plots.written_in_parallel(2):
        split = [_sine(k, tmp_path / "split" / f"s{k}.png") for k in range(4)]
        assert split == [tmp_path / "split" / f"s{k}.png" for k in range(4)]
        assert not any(p.exists() or p.with_suffix(".pid").exists() for p in split)
    makers = [int(p.with_suffix(".pid").read_text()) for p in split]
    assert len(forked) == 1 and makers == [os.getpid(), forked[0]] * 2
    assert [p.read_bytes() for p in split] == [p.read_bytes() for p in serial]


def test_a_share_whose_child_died_is_written_by_the_parent(tmp_path, monkeypatch):
    """A child killed as it starts writing (SIGKILL: it says nothing): its share is written by
    this process, the same files as written one after the other."""
    serial = _made(tmp_path, "serial", 4)
    parent, write = os.getpid(), plots._write_figure

    def killed_in_a_child(fig, path, dpi, rect):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        write(fig, path, dpi, rect)
    monkeypatch.setattr(plots, "_write_figure", killed_in_a_child)
    forked = forks_counted(monkeypatch)
    with plots.written_in_parallel(2):
        split = _made(tmp_path, "split", 4)
    assert len(forked) == 1 and not pid_alive(forked[0])
    assert [p.read_bytes() for p in split] == [p.read_bytes() for p in serial]


def test_a_figure_that_cannot_be_written_raises_here_and_leaves_no_child(tmp_path, monkeypatch):
    """A figure whose writing fails, whichever process has it: the error is raised in this
    process (which writes a failed child's share again), no child is left, no figure open."""
    import matplotlib.pyplot as plt

    write = plots._write_figure

    def f3_fails(fig, path, dpi, rect):
        if path.name == "f3.png":
            raise ValueError("f3 cannot be drawn")
        write(fig, path, dpi, rect)
    monkeypatch.setattr(plots, "_write_figure", f3_fails)
    open_before = plt.get_fignums()
    forked = forks_counted(monkeypatch)
    with pytest.raises(ValueError, match="f3 cannot be drawn"):
        with plots.written_in_parallel(2):
            _made(tmp_path, "split")
    assert len(forked) == 1 and not pid_alive(forked[0])
    assert plt.get_fignums() == open_before


def test_a_stop_while_children_write_kills_and_reaps_them(tmp_path, monkeypatch):
    """Ctrl-C in this process's share while a child is still writing its own (a child that
    would take a minute): the stop goes on at once, the child killed and reaped, no figure
    left open."""
    import time

    import matplotlib.pyplot as plt

    parent = os.getpid()

    def slow_child_stopped_parent(fig, path, dpi, rect):
        if os.getpid() != parent:
            time.sleep(60)
        raise KeyboardInterrupt
    monkeypatch.setattr(plots, "_write_figure", slow_child_stopped_parent)
    open_before = plt.get_fignums()
    forked = forks_counted(monkeypatch)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with plots.written_in_parallel(2):
            _made(tmp_path, "split", 2)
    assert time.monotonic() - began < 30       # not the child's minute
    assert len(forked) == 1 and not pid_alive(forked[0])
    assert plt.get_fignums() == open_before


def test_one_figure_or_one_process_forks_nothing(tmp_path, monkeypatch):
    """Nothing to share (one figure) or no CPU to share it with: written here, no fork."""
    forked = forks_counted(monkeypatch)
    with plots.written_in_parallel(4):
        one = _made(tmp_path, "one", 1)
    with plots.written_in_parallel(1):
        many = _made(tmp_path, "many", 3)
    assert forked == [] and all(p.is_file() for p in one + many)
