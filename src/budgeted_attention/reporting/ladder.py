"""One budget checkpoint against the ladder of separately trained smaller models, at matched latency.

The ``ladder`` rows of a run are smaller dense models, each timed like the pruned models (same
reference, same setting). For every ladder model and seed this module reads the accuracy of each
pruned curve of the same seed (``budgeted-hard`` and any other physically pruned method, rows of
cost kind ``kept-heads``)
at the ladder model's measured speedup, by linear interpolation between the curve's budgets
(the budget-1 model, the full architecture, counts as 1.00x: it is the reference's model). A
ladder model outside the curve's range of speedups (faster than every budget, or slower than the
full model), or a seed without that curve, has no match. Aggregated over seeds, the table says
whether the curve is above, on or below each ladder model. The verdict rests on the 95%
confidence interval of the mean paired difference (Student's t over the matched seeds): "above"
or "below" when the interval excludes 0, "on" (a tie) when it includes 0. Test accuracies are only read here, never used to choose anything. Language-model
runs (no accuracy) and runs without ladder rows or timed pruned models get no table.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from budgeted_attention.reporting.results import display_method

LADDER = "ladder"

# Two-sided 95% quantiles of Student's t, t(0.975, df) for df = 1..30 (standard tables); beyond
# 30 degrees of freedom the df-30 value is used (conservative: at most 4% above the true quantile).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def confidence_interval(mean: float, std: float, n: int) -> tuple[float, float]:
    """95% confidence interval of a mean over ``n`` >= 2 paired values with sample std ``std``."""
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 values, got {n}")
    t = T_975[min(n - 1, len(T_975)) - 1]
    half = t * std / math.sqrt(n)
    return mean - half, mean + half


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def _curve(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(speedup, test accuracy) points of one method and seed, ascending in speedup; budget 1
    without a timing counts as 1.00x."""
    points = []
    for row in rows:
        if not _finite(row.get("accuracy")):
            continue
        if row.get("speedup") is not None:
            points.append((float(row["speedup"]), float(row["accuracy"])))
        elif float(row["budget"]) == 1.0:
            points.append((1.0, float(row["accuracy"])))
    return sorted(points)


def interpolate(curve: list[tuple[float, float]], speedup: float) -> float | None:
    """The curve's accuracy at ``speedup`` (linear between neighbouring points), or None outside
    its range of speedups."""
    if not curve or not curve[0][0] <= speedup <= curve[-1][0]:
        return None
    for (s0, a0), (s1, a1) in zip(curve, curve[1:]):
        if s0 <= speedup <= s1:
            return a0 if s1 == s0 else a0 + (a1 - a0) * (speedup - s0) / (s1 - s0)
    return curve[0][1]  # a single point at exactly this speedup


def _ladder_label(row: dict[str, Any]) -> str:
    """A ladder model by its name, or its shape (layers, heads, FFN width), and its FLOP cost."""
    cost = f"cost {float(row['budget']):.2f}"
    if row.get("variant"):
        return f"{row['variant']} ({cost})"
    heads, ffn = row.get("heads_per_layer") or [], row.get("ffn_per_layer") or []
    if heads and ffn:
        return f"{len(heads)} layer{'s' if len(heads) != 1 else ''}, {heads[0]} heads, FFN {ffn[0]} ({cost})"
    return f"{display_method(row)} ({cost})"


def _match(
    ladder_by_seed: dict[Any, dict[str, Any]], curve_rows: dict[Any, list[dict[str, Any]]]
) -> tuple[list[tuple[float, float, float]], dict[str, int]]:
    """Per seed of one ladder model: (speedup, ladder accuracy, curve accuracy there) where the
    curve of the same seed reaches that speedup, and the seeds without a match by reason."""
    pairs, unmatched = [], defaultdict(int)
    for seed, ladder_row in ladder_by_seed.items():
        speedup, curve = float(ladder_row["speedup"]), _curve(curve_rows.get(seed, []))
        matched = interpolate(curve, speedup)
        if matched is not None:
            pairs.append((speedup, float(ladder_row["accuracy"]), matched))
        elif not curve:
            unmatched["no curve for the seed"] += 1
        else:
            unmatched["faster than every budget" if speedup > curve[-1][0] else "slower than the full model"] += 1
    return pairs, dict(unmatched)


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def ladder_comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (curve method, ladder model): the per-seed pairs at matched speedup, aggregated.

    Returns:
        Dicts with ``method``, ``ladder`` (its label), ``seeds`` (ladder seeds), ``matched``
        (seeds with a match), ``unmatched`` (reason -> seeds without one), ``speedup``,
        ``ladder_accuracy``, ``curve_accuracy`` and ``difference`` (curve minus ladder, in [0, 1]
        units) as (mean, std) over matched seeds, ``interval`` (the difference's 95% confidence
        interval; 2 or more matched seeds) and ``above`` (matched seeds where the curve is on or
        above the ladder model).
    """
    ladder: dict[str, dict[Any, dict[str, Any]]] = defaultdict(dict)
    curves: dict[str, dict[Any, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["method"] == LADDER:
            if row.get("speedup") is not None and _finite(row.get("accuracy")):
                ladder[_ladder_label(row)][row.get("seed")] = row
        elif row.get("cost_kind") == "kept-heads":  # physically pruned: a curve of measured speed
            curves[display_method(row)][row.get("seed")].append(row)
    by_speed = sorted(ladder.items(), key=lambda item: statistics.fmean(float(r["speedup"]) for r in item[1].values()))
    results = []
    for method, curve_rows in sorted(curves.items()):
        if not any(row.get("speedup") is not None for seed_rows in curve_rows.values() for row in seed_rows):
            continue
        for label, ladder_by_seed in by_speed:
            pairs, unmatched = _match(ladder_by_seed, curve_rows)
            entry: dict[str, Any] = {
                "method": method, "ladder": label, "seeds": len(ladder_by_seed), "matched": len(pairs), "unmatched": unmatched,
            }
            if pairs:
                speedups, ladder_acc, curve_acc = zip(*pairs)
                entry.update(
                    speedup=_mean_std(list(speedups)), ladder_accuracy=_mean_std(list(ladder_acc)),
                    curve_accuracy=_mean_std(list(curve_acc)), difference=_mean_std([c - a for _, a, c in pairs]),
                    above=sum(c >= a for _, a, c in pairs),
                )
                if len(pairs) > 1:
                    entry["interval"] = confidence_interval(*entry["difference"], len(pairs))
            else:
                entry["speedup"] = (statistics.fmean(float(r["speedup"]) for r in ladder_by_seed.values()), 0.0)
            results.append(entry)
    return results


def _verdict(entry: dict[str, Any]) -> str:
    unmatched = "; ".join(f"no match in {n} seed{'s' if n > 1 else ''}: {why}" for why, n in sorted(entry["unmatched"].items()))
    if not entry["matched"]:
        return unmatched
    mean, _ = entry["difference"]
    if entry["matched"] == 1:
        judged = f"{'on or above' if mean >= 0 else 'below'} (1 seed, no interval)"
    else:
        low, high = entry["interval"]
        if low > 0:
            judged = "above (95% CI above 0)"
        elif high < 0:
            judged = "below (95% CI below 0)"
        else:
            side = "above" if mean > 0 else "below" if mean < 0 else "equal"
            judged = f"on (a tie: the 95% CI includes 0; mean {side})"
    verdict = f"{judged}; above in {entry['above']} of {entry['matched']} seeds"
    return f"{verdict}; {unmatched}" if unmatched else verdict


def ladder_markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table with its explanation; "" without ladder rows with an
    accuracy (language-model runs have none) or without a timed pruned curve."""
    comparison = ladder_comparison(rows)
    if not comparison:
        return ""
    pct = lambda pair: f"{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}"  # noqa: E731
    lines = [
        "Each ladder model (a separately trained smaller dense model) against each pruned curve of the same "
        "seed at the ladder model's measured speedup: the curve's test accuracy is interpolated linearly "
        "between its budgets (budget 1 counts as 1.00x); mean ± std over the seeds with a match; difference "
        "= curve − ladder in points, with the 95% confidence interval of its mean (Student's t over the "
        "matched seeds). Verdict: above / below when that interval excludes 0, on (a tie) when it includes 0.",
        "",
        "| curve | ladder model | matched seeds | ladder speedup | ladder test acc. % | curve at that speedup, test acc. % | difference | 95% CI | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for entry in comparison:
        speedup = f"{entry['speedup'][0]:.2f}x"
        if entry["matched"]:
            interval = entry.get("interval")
            cells = [pct(entry["ladder_accuracy"]), pct(entry["curve_accuracy"]),
                     f"{100 * entry['difference'][0]:+.2f} ± {100 * entry['difference'][1]:.2f}",
                     f"[{100 * interval[0]:+.2f}, {100 * interval[1]:+.2f}]" if interval else ""]
        else:
            cells = ["", "", "", ""]
        lines.append(f"| {entry['method']} | {entry['ladder']} | {entry['matched']} of {entry['seeds']} | {speedup} | "
                     f"{' | '.join(cells)} | {_verdict(entry)} |")
    return "\n".join(lines) + "\n"
