"""Plots (matplotlib, Agg backend, written atomically as PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from budgeted_attention.io import atomic_path  # noqa: E402
from budgeted_attention.reporting.results import aggregate, metric_of  # noqa: E402


_COLORS = {
    "dense": "black", "dense-long": "dimgray", "budgeted": "tab:blue", "budgeted-hard": "tab:orange",
    "budgeted-scratch": "tab:red", "static": "tab:green", "static-hard": "tab:olive", "posthoc": "tab:purple",
    "posthoc-recovered": "tab:brown", "posthoc-recovered-1ep": "tab:pink",
    "budgeted-sandwich": "tab:cyan", "budgeted-hard-sandwich": "navy", "ladder": "tab:gray", "static-soft": "yellowgreen",
}


def _color(method: str) -> str | None:
    """One colour per method across every panel and plot."""
    return _COLORS.get(method)


def _save(fig: Any, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_accuracy_vs_cost(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy (mean ± std over seeds) against estimated cost, one line per method, plus C(b) vs b."""
    summary = aggregate(rows)
    metric = metric_of(summary)
    fig, (ax_acc, ax_cost) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = sorted({e["method"] for e in summary}, key=lambda m: [e["method"] for e in summary].index(m))
    for method in methods:
        entries = [e for e in summary if e["method"] == method and ("cost_mean" in e or "estimated_cost_mean" in e)]
        if not entries:
            continue
        xs = [e.get("cost_mean", e.get("estimated_cost_mean")) for e in entries]
        ys = [metric.scale * e[f"{metric.key}_mean"] for e in entries]
        errs = [metric.scale * e[f"{metric.key}_std"] for e in entries]
        ax_acc.errorbar(xs, ys, yerr=errs, marker="s" if method == "dense" else "o", markersize=8 if method == "dense" else 5, capsize=3, label=method, color=_color(method), zorder=3 if method == "dense" else 2)
        if method.startswith("budgeted"):
            ax_cost.plot([e["budget"] for e in entries], xs, marker="o", label=method, color=_color(method))
    ax_acc.set_xlabel("attention cost (estimated C(b); hard: kept-head fraction)")
    ax_acc.set_ylabel(metric.label)
    ax_acc.set_title(title)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend()
    ax_cost.plot([0, 1], [0, 1], "k--", linewidth=1, label="C(b) = b")
    ax_cost.set_xlabel("requested budget b")
    ax_cost.set_ylabel("estimated cost C(b)")
    ax_cost.set_title("budget tracking")
    ax_cost.grid(alpha=0.3)
    ax_cost.legend()
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
        ax.plot([r["budget"] for r in rows], [r["ideal_speedup"] for r in rows], "--", color=line[0].get_color(), label=f"FLOP-ideal, {name}")
    threads = sorted({r["threads"] for r in bench_rows})
    ax.set_xlabel("budget b")
    ax.set_ylabel("speedup over the dense model (lean executors)")
    ax.set_title(f"CPU speedup of pruned models ({threads} thread(s))")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _per_method(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    summary = aggregate(rows)
    methods: dict[str, list[dict[str, Any]]] = {}
    for entry in summary:
        methods.setdefault(entry["method"], []).append(entry)
    return methods


def plot_accuracy_vs_budget(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy (mean ± std over seeds) against the requested budget, one line per method."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    metric = metric_of(rows)
    for method, entries in _per_method(rows).items():
        xs = [e["budget"] for e in entries]
        ys = [metric.scale * e[f"{metric.key}_mean"] for e in entries]
        errs = [metric.scale * e[f"{metric.key}_std"] for e in entries]
        style = "s" if len(entries) == 1 else "o-"
        ax.errorbar(xs, ys, yerr=errs, fmt=style, capsize=3, label=method, color=_color(method))
    ax.set_xlabel("budget b")
    ax.set_ylabel(metric.label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_accuracy_vs_speedup(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Accuracy against measured speedup (FLOP-ideal where no latency was measured): the Pareto
    plot of the operating points, dense models at 1x, one curve per method (e.g. budgeted-hard
    against the ladder of smaller dense models)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    metric = metric_of(rows)
    y = lambda e: metric.scale * e[f"{metric.key}_mean"]  # noqa: E731
    for method, entries in _per_method(rows).items():
        if method in ("dense", "dense-long"):
            ax.plot([1.0] * len(entries), [y(e) for e in entries], "*", markersize=10, label=method, color=_color(method))
            continue
        # Sorted by speed, so a curve reads as a Pareto front (the ladder's costs and speeds differ in order).
        measured = sorted((e for e in entries if "speedup_mean" in e), key=lambda e: e["speedup_mean"])
        ideal = [e for e in entries if "speedup_mean" not in e and "ideal_speedup_mean" in e]
        if measured:
            ax.plot([e["speedup_mean"] for e in measured], [y(e) for e in measured], "o-", label=f"{method} (measured)", color=_color(method))
        if ideal:
            ax.plot([e["ideal_speedup_mean"] for e in ideal], [y(e) for e in ideal], "x--", label=f"{method} (FLOP-ideal)", color=_color(method))
    ax.set_xlabel("speedup over the dense model (single thread)")
    ax.set_ylabel(metric.label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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
    ax.legend(fontsize=8)
    _save(fig, path)
