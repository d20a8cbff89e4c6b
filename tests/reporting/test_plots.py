"""Plots a reader can trust at a glance: the seeds' spread, one colour and marker per series, the legend off the data."""

from __future__ import annotations

import pytest
from matplotlib.container import ErrorbarContainer

from budgeted_attention.reporting import plots


def _rows():
    rows = []
    for seed in (0, 1, 2):
        rows.append({"method": "dense", "budget": 1.0, "seed": seed, "accuracy": 0.90 + 0.01 * seed, "cost": 1.0, "cost_kind": "dense"})
        for b in (0.25, 0.5, 1.0):
            rows.append({"method": "budgeted", "budget": b, "seed": seed, "accuracy": 0.8 + 0.1 * b + 0.01 * seed,
                         "cost": 0.9 * b, "cost_kind": "soft-estimate"})
            rows.append({"method": "budgeted-hard", "budget": b, "seed": seed, "accuracy": 0.78 + 0.1 * b + 0.01 * seed, "cost": b,
                         "cost_kind": "kept-heads", "speedup": (1 + 0.05 * seed) / b, "ideal_speedup": 1 / b})
        for variant, cost in (("small", 0.3), ("half", 0.5)):  # two ladder models: one series, not two colours from the cycle
            rows.append({"method": "ladder", "variant": variant, "budget": cost, "seed": seed, "accuracy": 0.8 + 0.02 * seed,
                         "cost": cost, "cost_kind": "smaller-dense", "speedup": (1 + 0.1 * seed) / cost})
    return rows


@pytest.fixture
def figures(monkeypatch):
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig))
    yield kept
    for fig in kept:
        plots.plt.close(fig)


@pytest.mark.parametrize("plot", [plots.plot_accuracy_vs_speedup, plots.plot_accuracy_vs_budget, plots.plot_accuracy_vs_cost])
def test_series_have_their_own_style_error_bars_and_a_legend_off_the_data(figures, plot):
    plot(_rows(), "unused.png", "tiny")
    fig = figures[0]
    ax = fig.axes[0]
    series = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    labels = [c.get_label() for c in series]
    assert {label.split(" (")[0] for label in labels} == {"dense", "budgeted-hard", "ladder"} | ({"budgeted"} if "speedup" not in plot.__name__ else set())
    assert all(c.has_yerr for c in series)  # the seeds' spread on every series
    assert [c for c in series if "budgeted-hard" in c.get_label()][0][2], "error bar lines drawn"
    styles = [(c.lines[0].get_color(), c.lines[0].get_marker()) for c in series]
    assert len({color for color, _ in styles}) == len(styles) and len({marker for _, marker in styles}) == len(styles), styles
    if "speedup" in plot.__name__:  # measured speed varies over seeds too
        assert all(c.has_xerr for c in series if "measured" in c.get_label())
    legend = fig.axes[-1].get_legend()
    assert "std over seeds" in legend.get_title().get_text() and "n = 3" in legend.get_title().get_text()
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert not any(box.overlaps(each.get_window_extent()) for each in fig.axes), "the legend covers an axes"


def test_a_method_has_one_style_in_every_plot():
    assert plots.style("ladder (3 layers)") == plots.style("ladder") != plots.style("budgeted-hard")
    assert plots.style("something-new") == plots.style("something-new")
    known = [plots.style(m) for m in plots._STYLE]
    assert len({s["color"] for s in known}) == len(known) and len({s["marker"] for s in known}) == len(known)


def test_bars_stop_at_100_percent_and_untimed_rows_keep_off_the_dense_point(figures):
    rows = [{"method": "dense", "budget": 1.0, "seed": s, "accuracy": a, "cost": 1.0, "cost_kind": "dense"} for s, a in ((0, 1.0), (1, 0.98))]
    rows += [{"method": "budgeted-hard", "budget": b, "seed": s, "accuracy": 0.99, "cost": b, "cost_kind": "kept-heads",
              "ideal_speedup": 1 / b, **({"speedup": 1.5} if b == 0.5 else {})} for s in (0, 1) for b in (0.25, 0.5, 1.0)]
    plots.plot_accuracy_vs_speedup(rows, "unused.png", "tiny")
    ax = figures[0].axes[0]
    series = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
    assert set(series) == {"dense", "budgeted-hard (measured)", "budgeted-hard (FLOP-ideal, not timed)"}
    top = max(y for segment in series["dense"][2][0].get_segments() for _, y in segment)
    assert top == pytest.approx(100.0)  # 99 ± 1.41: the bar stops at 100 %
    ideal = series["budgeted-hard (FLOP-ideal, not timed)"]
    assert list(ideal[0].get_xdata()) == [4.0] and ideal[0].get_marker() != series["budgeted-hard (measured)"][0].get_marker()


def test_methods_without_a_fixed_style_never_take_a_listed_methods_colour_or_marker():
    known = {(s["color"], s["marker"]) for s in map(plots.style, plots._STYLE)}
    for name in ("reference-fp32", "dense-int8", "smaller-int8", "something-new"):
        color, marker = plots.style(name)["color"], plots.style(name)["marker"]
        assert color not in {c for c, _ in known} and marker not in {m for _, m in known}


def test_only_an_accuracy_legend_says_its_bars_stop_at_100_percent(figures):
    """A language model's loss has no ceiling: its legend says nothing of clipping."""
    loss_rows = [{"method": m, "budget": b, "seed": s, "loss": 2.0 + s * 0.1 + (1 - b), "cost": b, "cost_kind": "kept-heads"}
                 for s in (0, 1) for m, b in (("dense", 1.0), ("budgeted-hard", 0.5))]
    plots.plot_accuracy_vs_budget(loss_rows, "unused.png", "lm")
    plots.plot_accuracy_vs_budget(_rows(), "unused.png", "tiny")
    loss_title, accuracy_title = (fig.axes[-1].get_legend().get_title().get_text() for fig in figures)
    assert "clipped" not in loss_title and "std over seeds" in loss_title
    assert "clipped at 100 %" in accuracy_title


def test_accuracy_against_latency_gives_every_system_its_own_style_and_keeps_the_legend_off(figures):
    """The quantized-models plot (benchmarks/int8_peers.py, redrawn by baa report): one series per
    system, the seeds' spread both ways, labels on the budgets but not on the ONNX float graphs."""
    rows = [{"method": m, "budget": b, "seed": s, "accuracy": 0.9 + 0.01 * s, "latency_ms": lat * (1 + 0.05 * s),
             "bench_batch_size": 1, "bench_seq_len": 128, **({"variant": v} if v else {})}
            for s in (0, 1, 2)
            for m, b, lat, v in (("reference-fp32", 1.0, 30.0, ""), ("dense-int8", 1.0, 11.0, ""), ("budgeted-hard-int8", 0.5, 7.0, ""),
                                 ("budgeted-hard-int8", 0.25, 5.0, ""), ("budgeted-hard-onnx-fp32", 0.5, 14.0, ""),
                                 ("budgeted-hard-onnx-fp32", 0.25, 7.5, ""), ("smaller-int8", 0.5, 5.5, "l3"), ("smaller-int8", 0.33, 3.5, "l2"))]
    plots.plot_accuracy_vs_latency(rows, "unused.png", "int8")
    fig = figures[0]
    ax = fig.axes[0]
    series = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [c.get_label() for c in series] == ["reference-fp32", "dense-int8", "budgeted-hard-int8", "budgeted-hard-onnx-fp32", "smaller-int8"]
    assert all(c.has_xerr and c.has_yerr for c in series)
    styles = [(c.lines[0].get_color(), c.lines[0].get_marker()) for c in series]
    assert len(set(styles)) == len(styles)
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["0.25", "0.33", "0.5", "0.5"]  # int8 budgets and the smaller models; none on the float graphs
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    assert not box.overlaps(ax.get_window_extent())
