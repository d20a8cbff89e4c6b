"""Headline figures of a run: accuracy at cost caps, budget tracking, warm-start ablation."""

from __future__ import annotations

import statistics
from typing import Any


def accuracy_at_cost(rows: list[dict[str, Any]], method: str, seed: int, max_cost: float) -> dict[str, Any] | None:
    """The most accurate row of (method, seed) whose estimated cost is <= ``max_cost``."""
    eligible = [r for r in rows if r["method"] == method and r["seed"] == seed and r["estimated_cost"] <= max_cost + 1e-12]
    return max(eligible, key=lambda r: (r["accuracy"], -r["estimated_cost"]), default=None)


def headline(rows: list[dict[str, Any]], cost_caps: tuple[float, ...] = (0.30, 0.50)) -> dict[str, Any]:
    """Per-seed accuracy of ``budgeted`` at each cost cap, worst C(b) - b, and ablation means."""
    seeds = sorted({r["seed"] for r in rows if r["method"] == "budgeted"})
    per_seed = []
    for seed in seeds:
        entry: dict[str, Any] = {"seed": seed}
        for cap in cost_caps:
            best = accuracy_at_cost(rows, "budgeted", seed, cap)
            entry[f"accuracy_at_cost_{cap:.2f}"] = None if best is None else best["accuracy"]
            entry[f"budget_at_cost_{cap:.2f}"] = None if best is None else best["budget"]
        soft = [r for r in rows if r["method"] == "budgeted" and r["seed"] == seed]
        entry["max_cost_minus_budget"] = max(r["estimated_cost"] - r["budget"] for r in soft)
        per_seed.append(entry)
    ablation = {}
    for method in ("budgeted", "budgeted-scratch", "budgeted-hard"):
        values = [r["accuracy"] for r in rows if r["method"] == method and r["budget"] < 1.0]
        if values:
            ablation[method] = statistics.fmean(values)
    return {"per_seed": per_seed, "mean_accuracy_over_budgets_below_1": ablation}


def headline_markdown(summary: dict[str, Any]) -> str:
    lines = ["| seed | best acc. at C ≤ 0.30 (budget) | best acc. at C ≤ 0.50 (budget) | max C(b) − b |", "|---:|---:|---:|---:|"]
    for e in summary["per_seed"]:
        def cell(cap: str) -> str:
            acc = e[f"accuracy_at_cost_{cap}"]
            return "none" if acc is None else f"{100 * acc:.2f}% (b={e[f'budget_at_cost_{cap}']:.1f})"

        lines.append(f"| {e['seed']} | {cell('0.30')} | {cell('0.50')} | {e['max_cost_minus_budget']:+.3f} |")
    means = summary["mean_accuracy_over_budgets_below_1"]
    if means:
        lines += ["", "Mean accuracy over the budgets < 1 of the sweep, all seeds: " + ", ".join(f"{m} {100 * v:.2f}%" for m, v in means.items()) + "."]
    return "\n".join(lines) + "\n"
