"""Plots (matplotlib, Agg backend, written atomically as PNG)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from budgeted_attention.io import atomic_path  # noqa: E402
from budgeted_attention.reporting.results import aggregate, metric_of  # noqa: E402


# One (colour, marker) per method, the same in every plot; a method's variants (ladder models) are one series.
_STYLE = {
    "dense": ("black", "s"), "dense-long": ("dimgray", "P"), "budgeted": ("tab:blue", "o"), "budgeted-hard": ("tab:orange", "D"),
    "budgeted-sandwich": ("tab:cyan", "^"), "budgeted-hard-sandwich": ("navy", "v"), "budgeted-scratch": ("tab:red", "<"),
    "static": ("tab:green", ">"), "static-soft": ("yellowgreen", "p"), "posthoc": ("tab:purple", "h"),
    "posthoc-recovered": ("tab:brown", "X"), "posthoc-recovered-1ep": ("tab:pink", "d"), "ladder": ("teal", "*"),
    "budgetformer": ("goldenrod", "8"), "capped-routing": ("magenta", "H"),
}
# Methods not in _STYLE draw from colours and markers no listed method uses (by a hash of the name:
# stable across plots; two unlisted methods may share a colour or a marker, never a listed one's).
_SPARE_COLORS = ("olive", "darkred", "slateblue", "sienna", "darkcyan", "crimson", "darkkhaki", "indigo")
_SPARE_MARKERS = ("1", "2", "3", "4", "+", "x")
FLOP_IDEAL_MARKER = "$\\circ$"  # the FLOP-ideal points of a method that was not timed: its colour, this marker, dotted
SPREAD = "error bars: ± std over seeds"
CLIPPED = ", accuracy clipped at 100 %"  # said only where the metric is accuracy


def style(method: str) -> dict[str, str]:
    """The colour and marker of ``method`` (or ``method (variant)``): fixed per method, so stable across plots."""
    base = method.split(" (", 1)[0]
    index = zlib.crc32(base.encode())
    color, marker = _STYLE.get(base) or (_SPARE_COLORS[index % len(_SPARE_COLORS)], _SPARE_MARKERS[(index // 8) % len(_SPARE_MARKERS)])
    return {"color": color, "marker": marker}


def _legend(ax: Any, entries: list[dict[str, Any]] | None = None, axes: tuple[Any, ...] = (), clipped: bool = False) -> None:
    """One legend right of ``ax`` (never over the data) for its series and those of ``axes``,
    titled with the seeds' spread when ``entries`` (the aggregates shown) are given (and, when
    ``clipped``, that error bars stop at 100 % accuracy)."""
    found: dict[str, Any] = {}
    for each in (*axes, ax):
        for handle, label in zip(*each.get_legend_handles_labels(), strict=True):
            found.setdefault(label, handle)
    seeds = sorted({e["seeds"] for e in entries or []})
    n = "" if not seeds else f" (n = {seeds[0]})" if len(seeds) == 1 else f" (n = {seeds[0]}-{seeds[-1]})"
    ax.legend(list(found.values()), list(found), loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8,
              title=f"mean, {SPREAD}{CLIPPED if clipped else ''}{n}" if entries else None, title_fontsize=8)


def _save(fig: Any, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _per_method(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The aggregates (mean ± std over seeds) by base method: a method's variants form one series."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for entry in aggregate(rows):
        methods.setdefault(entry["method"].split(" (", 1)[0], []).append(entry)
    return methods


def _errorbar(ax: Any, method: str, entries: list[dict[str, Any]], x: Any, y: Any, xerr: Any = None, label: str | None = None, **kw: Any) -> None:
    """One series: ``y(entry)`` is (mean, std, the metric's ceiling or None); a bar stops at the ceiling (100 % accuracy)."""
    entries = sorted(entries, key=x)
    points = [y(e) for e in entries]
    below = [std for _, std, _ in points]
    above = [std if ceiling is None else max(0.0, min(std, ceiling - mean)) for mean, std, ceiling in points]
    ax.errorbar([x(e) for e in entries], [mean for mean, _, _ in points], yerr=[below, above],
                xerr=None if xerr is None else [xerr(e) for e in entries], capsize=3, label=label or method,
                **{"linestyle": "-" if len(entries) > 1 else "none", "zorder": 3 if method.startswith("dense") else 2, **style(method), **kw})


def _metric(rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    """(the metric, entry -> (mean, std, ceiling)) in display units; accuracy's ceiling is 100 %."""
    metric = metric_of(rows)
    ceiling = 100.0 if metric.key == "accuracy" else None
    return metric, lambda e: (metric.scale * e[f"{metric.key}_mean"], metric.scale * e[f"{metric.key}_std"], ceiling)


def plot_accuracy_vs_cost(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy (mean ± std over seeds) against estimated cost, one series per method, plus C(b) vs b."""
    metric, y = _metric(rows)
    fig, (ax_acc, ax_cost) = plt.subplots(1, 2, figsize=(11, 4.2))
    cost = lambda e: e.get("cost_mean", e.get("estimated_cost_mean"))  # noqa: E731
    shown = []
    for method, entries in _per_method(rows).items():
        entries = [e for e in entries if cost(e) is not None]
        if entries:
            shown += entries
            _errorbar(ax_acc, method, entries, cost, y)
            if method.startswith("budgeted"):
                ax_cost.plot([e["budget"] for e in entries], [cost(e) for e in entries], label=method, **style(method))
    ax_acc.set_xlabel("attention cost (estimated C(b); hard: kept-head fraction)")
    ax_acc.set_ylabel(metric.label)
    ax_acc.set_title(title)
    ax_acc.grid(alpha=0.3)
    ax_cost.plot([0, 1], [0, 1], "k--", linewidth=1, label="C(b) = b")
    ax_cost.set_xlabel("requested budget b")
    ax_cost.set_ylabel("estimated cost C(b)")
    ax_cost.set_title("budget tracking")
    ax_cost.grid(alpha=0.3)
    _legend(ax_cost, shown, axes=(ax_acc,), clipped=metric.key == "accuracy")
    _save(fig, path)


def plot_speedups(bench_rows: list[dict[str, Any]], path: str | Path) -> None:
    """Measured and FLOP-ideal speedup against budget, one panel line per (batch, seq)."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    settings = sorted({(r.get("scope", "heads"), r.get("input", "random"), r["batch_size"], r["seq_len"]) for r in bench_rows})
    scoped = len({s[0] for s in settings}) > 1
    for scope, source, batch, seq in settings:
        rows = sorted(
            (r for r in bench_rows if (r.get("scope", "heads"), r.get("input", "random"), r["batch_size"], r["seq_len"]) == (scope, source, batch, seq)),
            key=lambda r: r["budget"],
        )
        name = (f"{scope}, " if scoped else "") + f"batch {batch}, seq {seq}" + ("" if source == "random" else f" ({source})")
        line = ax.plot([r["budget"] for r in rows], [r["speedup"] for r in rows], marker="o", label=f"measured, {name}")
        ax.plot([r["budget"] for r in rows], [r["ideal_speedup"] for r in rows], "x--", color=line[0].get_color(), label=f"FLOP-ideal, {name}")
    threads = sorted({r["threads"] for r in bench_rows})
    ax.set_xlabel("budget b")
    ax.set_ylabel("speedup over the dense model (lean executors)")
    ax.set_title(f"CPU speedup of pruned models ({', '.join(map(str, threads))} thread{'s' if threads != [1] else ''})")
    ax.grid(alpha=0.3)
    _legend(ax)
    _save(fig, path)


def plot_accuracy_vs_budget(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy (mean ± std over seeds) against the requested budget, one series per method."""
    metric, y = _metric(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    methods = _per_method(rows)
    for method, entries in methods.items():
        _errorbar(ax, method, entries, lambda e: e["budget"], y)
    ax.set_xlabel("budget b")
    ax.set_ylabel(metric.label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax, [e for entries in methods.values() for e in entries], clipped=metric.key == "accuracy")
    _save(fig, path)


def plot_accuracy_vs_speedup(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy against measured speedup (FLOP-ideal, hollow, where no latency was measured), both
    mean ± std over seeds: the Pareto plot of the operating points, dense models at 1x, one series
    per method (e.g. budgeted-hard against the ladder of smaller dense models)."""
    metric, y = _metric(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    shown = []
    for method, entries in _per_method(rows).items():
        if method in ("dense", "dense-long"):
            shown += entries
            _errorbar(ax, method, entries, lambda e: 1.0, y, markersize=9)
            continue
        measured = [e for e in entries if "speedup_mean" in e]
        # an untimed row that removed nothing (FLOP-ideal 1x) would only hide under the dense point
        ideal = [e for e in entries if "speedup_mean" not in e and e.get("ideal_speedup_mean", 1.0) > 1.0 + 1e-6]
        shown += measured + ideal
        if measured:
            _errorbar(ax, method, measured, lambda e: e["speedup_mean"], y, xerr=lambda e: e["speedup_std"], label=f"{method} (measured)")
        if ideal:
            _errorbar(ax, method, ideal, lambda e: e["ideal_speedup_mean"], y, label=f"{method} (FLOP-ideal, not timed)",
                      marker=FLOP_IDEAL_MARKER, linestyle=":")
    ax.set_xlabel("speedup over the dense model (measured; FLOP-ideal where not timed)")
    ax.set_ylabel(metric.label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax, shown, clipped=metric.key == "accuracy")
    _save(fig, path)


def plot_accuracy_vs_latency(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Test accuracy against measured latency (ms per batch at the rows' ``bench_batch_size`` and
    ``bench_seq_len``, log scale), one series per system of a quantized-models run
    (``benchmarks/int8_peers.py``: ``reference-fp32``, ``dense-int8``, ``budgeted-hard-int8``, ...),
    mean over seeds with the seeds' std as bars in both directions; points labelled with their
    budget (a smaller model's: its forward FLOPs over the full model's), except the ONNX float
    graphs, which sit on their PyTorch models' points."""
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    colours = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]  # 20 distinct, the strong ten first
    markers = "osD^vP*Xh<>"
    methods = list(dict.fromkeys(r["method"] for r in rows if isinstance(r.get("latency_ms"), (int, float))))
    shown = []
    for index, method in enumerate(methods):
        entries = sorted((e for e in aggregate([r for r in rows if r["method"] == method]) if "latency_ms_mean" in e),
                         key=lambda e: e["latency_ms_mean"])
        shown += entries
        colour = colours[index % len(colours)]
        _errorbar(ax, method, entries, lambda e: e["latency_ms_mean"], lambda e: (100 * e["accuracy_mean"], 100 * e["accuracy_std"], 100.0),
                  xerr=lambda e: e["latency_ms_std"], color=colour, marker=markers[index % len(markers)], markersize=6, linewidth=1.2)
        if len(entries) > 1 and not method.endswith("-onnx-fp32"):
            for e in entries:  # float and int8 of one budget sit close together: int8 labels below, others above
                ax.annotate(f"{e['budget']:g}", (e["latency_ms_mean"], 100 * e["accuracy_mean"]), textcoords="offset points",
                            xytext=(4, -10 if method.endswith("int8") else 4), fontsize=7, color=colour)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    first = rows[0] if rows else {}
    ax.set_xlabel(f"latency at batch {first.get('bench_batch_size', '?')}, seq {first.get('bench_seq_len', '?')} (ms, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{title}: labels are budgets (smaller-*: forward FLOPs over the full model's)", fontsize=9)
    ax.grid(alpha=0.3)
    _legend(ax, shown, clipped=True)
    _save(fig, path)


def plot_training_curves(curves: dict[str, list[list[float]]], path: str | Path, title: str, ylabel: str = "training loss") -> None:
    """Training loss against optimiser step, one line per label (e.g. per seed, or per run).

    ``curves``: label -> [(step, mean loss over the window ending at step), ...] as stored by the
    pipeline (``loss_curve`` of a unit record).
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, points in curves.items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax)
    _save(fig, path)
