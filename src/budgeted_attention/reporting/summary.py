"""Headline figures of a run: accuracy at cost caps, budget tracking, warm-start ablation.

Operating points are chosen on the validation split and never on the test split: among the rows
of a (method, seed) whose cost is within a cap, the row with the best ``val_accuracy`` is picked
(ties: the cheaper row) and its *test* ``accuracy`` is reported. Rows without a validation
figure cannot be picked.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from budgeted_attention.reporting.results import row_cost

DEFAULT_COST_CAPS = (0.30, 0.50)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def accuracy_at_cost(rows: list[dict[str, Any]], method: str, seed: int, max_cost: float) -> dict[str, Any] | None:
    """The row of (method, seed) with cost <= ``max_cost`` and the best validation accuracy.

    Ties go to the lower cost. Rows without ``val_accuracy`` (or without a cost) are never
    picked, so the result is None when no row of the group has a validation figure. The
    caller reports the picked row's test ``accuracy``.
    """
    eligible = []
    for row in rows:
        if row.get("method") != method or row.get("seed") != seed:
            continue
        cost, val = row_cost(row), _number(row.get("val_accuracy"))
        if cost is None or val is None or cost > max_cost + 1e-12:
            continue
        eligible.append((val, -cost, row))
    if not eligible:
        return None
    return max(eligible, key=lambda item: (item[0], item[1]))[2]


def has_validation(rows: list[dict[str, Any]], method: str, seed: int | None = None) -> bool:
    """Whether some row of ``method`` (and ``seed``) carries a validation accuracy."""
    return any(
        r.get("method") == method and (seed is None or r.get("seed") == seed) and _number(r.get("val_accuracy")) is not None
        for r in rows
    )


def _key(cap: float) -> str:
    return f"{cap:.2f}"


def headline(rows: list[dict[str, Any]], cost_caps: tuple[float, ...] = DEFAULT_COST_CAPS, method: str = "budgeted") -> dict[str, Any]:
    """Per seed: the validation-chosen row of ``method`` at each cost cap, worst C(b) - b; ablation means.

    ``per_seed`` entries hold, per cap ``X`` (formatted ``0.30``): ``accuracy_at_cost_X`` (test
    accuracy of the picked row), ``val_accuracy_at_cost_X``, ``budget_at_cost_X`` and
    ``cost_at_cost_X`` (all None when nothing could be picked), plus ``has_validation``.
    """
    seeds = sorted({r.get("seed") for r in rows if r.get("method") == method and isinstance(r.get("seed"), int)})
    per_seed = []
    for seed in seeds:
        entry: dict[str, Any] = {"seed": seed, "has_validation": has_validation(rows, method, seed)}
        for cap in cost_caps:
            best = accuracy_at_cost(rows, method, seed, cap)
            entry[f"accuracy_at_cost_{_key(cap)}"] = None if best is None else best.get("accuracy")
            entry[f"val_accuracy_at_cost_{_key(cap)}"] = None if best is None else best.get("val_accuracy")
            entry[f"budget_at_cost_{_key(cap)}"] = None if best is None else best.get("budget")
            entry[f"cost_at_cost_{_key(cap)}"] = None if best is None else row_cost(best)
        gaps = [row_cost(r) - r["budget"] for r in rows if r.get("method") == method and r.get("seed") == seed and row_cost(r) is not None]
        entry["max_cost_minus_budget"] = max(gaps) if gaps else None
        per_seed.append(entry)
    ablation = {}
    for name in ("budgeted", "budgeted-scratch", "budgeted-hard"):
        values = [r["accuracy"] for r in rows if r.get("method") == name and (_number(r.get("budget")) or 1.0) < 1.0 and _number(r.get("accuracy")) is not None]
        if values:
            ablation[name] = statistics.fmean(values)
    return {
        "method": method,
        "full_budget_gap": full_budget_gap(rows),
        "cost_caps": [float(c) for c in cost_caps],
        "selection": "best validation accuracy within the cost cap (ties: lower cost); test accuracy reported",
        "per_seed": per_seed,
        "mean_accuracy_over_budgets_below_1": ablation,
    }


def full_budget_gap(rows: list[dict[str, Any]], near: float = 0.99) -> list[dict[str, Any]]:
    """The "cliff at b = 1" check: per budgeted method and seed, test accuracy at b = ``near`` and at b = 1.

    Only groups that evaluated both budgets appear; ``gap_points`` = 100 * |acc(near) - acc(1)|.
    """
    found: dict[tuple[str, int], dict[float, float]] = {}
    for row in rows:
        method, budget = row.get("method", ""), row.get("budget")
        if not str(method).startswith("budgeted") or budget not in (near, 1.0) or _number(row.get("accuracy")) is None:
            continue
        found.setdefault((method, row.get("seed")), {})[budget] = row["accuracy"]
    return [
        {"method": m, "seed": seed, "budget": near, "accuracy_near": acc[near], "accuracy_full": acc[1.0],
         "gap_points": 100 * abs(acc[near] - acc[1.0])}
        for (m, seed), acc in sorted(found.items())
        if near in acc and 1.0 in acc
    ]


def headline_markdown(summary: dict[str, Any]) -> str:
    """The headline as Markdown: one line per seed, one column per cost cap."""
    caps = [_key(c) for c in summary.get("cost_caps", DEFAULT_COST_CAPS)]
    method = summary.get("method", "budgeted")
    lines = [
        "| seed | " + " | ".join(f"C ≤ {cap}: test acc. (val. acc., budget, cost)" for cap in caps) + " | max C(b) − b |",
        "|---:|" + "---:|" * len(caps) + "---:|",
    ]
    for e in summary["per_seed"]:
        def cell(cap: str) -> str:
            acc = e[f"accuracy_at_cost_{cap}"]
            if acc is None:
                return "none within cap" if e.get("has_validation", True) else "no validation figure"
            val, budget, cost = e.get(f"val_accuracy_at_cost_{cap}"), e[f"budget_at_cost_{cap}"], e.get(f"cost_at_cost_{cap}")
            val_text = "" if val is None else f"val. {100 * val:.2f}%, "
            cost_text = "" if cost is None else f", C={cost:.3f}"
            return f"{100 * acc:.2f}% ({val_text}b={budget:.2f}{cost_text})"

        gap = e.get("max_cost_minus_budget")
        lines.append(f"| {e['seed']} | " + " | ".join(cell(cap) for cap in caps) + f" | {'' if gap is None else f'{gap:+.3f}'} |")
    lines += [
        "",
        f"Operating points of `{method}` chosen by validation accuracy within each cost cap (ties: lower cost); "
        "the test accuracy of that point is reported. Test accuracy never chooses.",
    ]
    gaps = summary.get("full_budget_gap") or []
    if gaps:
        worst = max(gaps, key=lambda g: g["gap_points"])
        lines += ["", f"No cliff at b = 1: largest |acc(b = {worst['budget']}) − acc(b = 1)| over budgeted methods and seeds is "
                  f"{worst['gap_points']:.2f} points ({worst['method']}, seed {worst['seed']}; "
                  f"{100 * worst['accuracy_near']:.2f}% vs {100 * worst['accuracy_full']:.2f}%)."]
    means = summary["mean_accuracy_over_budgets_below_1"]
    if means:
        lines += ["", "Mean test accuracy over the budgets < 1 of the sweep, all seeds: " + ", ".join(f"{m} {100 * v:.2f}%" for m, v in means.items()) + "."]
    return "\n".join(lines) + "\n"
