"""The rows of a quantized-models run (``benchmarks/int8_peers.py``) read against its peers.

Two readings, each a function of the run's ``results.json`` rows alone:

* :func:`agreement_notes`: per (method, budget), the share of test texts where the int8 graph
  predicts what its float graph predicts (flagged below :data:`MIN_AGREEMENT`), and its speedup
  over the dense int8 graph (mean over seeds, with the range);
* :func:`int8_comparisons`: each ``budgeted-hard-int8`` budget against the dense int8 graph (at
  equal accuracy, within ±:data:`EQUAL_ACCURACY_POINTS`, or not) and against the accuracy-latency
  curve of the smaller pretrained models' int8 graphs (``smaller-int8`` rows).

Both the per-run report (``baa report RUN``) and the studies page print them, and a study's target
(``min_speedup_over_dense_int8``, ``on_smaller_curve``) is judged on :func:`int8_comparisons`.
"""

from __future__ import annotations

import statistics
from typing import Any

from budgeted_attention.reporting.results import display_method

EQUAL_ACCURACY_POINTS = 0.5  # "at equal accuracy": within this many points of test accuracy
MIN_AGREEMENT = 0.99  # an int8 graph should predict what its float graph predicts on this share of the test split


def agreement_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One Markdown bullet per (method, budget) of rows that carry ``agreement_with_float``."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        if isinstance(row.get("agreement_with_float"), (int, float)):
            groups.setdefault((display_method(row), float(row["budget"])), []).append(row)
    lines = []
    for (method, budget), members in groups.items():
        agree = [100 * r["agreement_with_float"] for r in members]
        over = [r["speedup_over_dense_int8"] for r in members if isinstance(r.get("speedup_over_dense_int8"), (int, float))]
        text = f"- {method} b = {budget:g}: int8 = float predictions on {statistics.fmean(agree):.2f}% of the test split (min {min(agree):.2f}%)"
        if min(agree) < 100 * MIN_AGREEMENT:  # each seed's graph is its own: one below is a graph below
            text += f", BELOW {100 * MIN_AGREEMENT:g}%" + (" on a seed" if len(agree) > 1 else "")
        if over:
            text += f"; {statistics.fmean(over):.2f}x over dense int8 [{min(over):.2f}, {max(over):.2f}]"
        lines.append(text)
    return lines


def _mean_points(rows: list[dict[str, Any]], method: str) -> dict[tuple[str, float], tuple[float, float]]:
    """(display name, budget) -> (mean batch-1 latency in ms, mean test accuracy in %) over seeds."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("method") == method and isinstance(r.get("latency_ms"), (int, float)):
            groups.setdefault((display_method(r), float(r["budget"])), []).append(r)
    return {key: (statistics.fmean(r["latency_ms"] for r in members), 100 * statistics.fmean(r["accuracy"] for r in members))
            for key, members in groups.items()}


def int8_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``budgeted-hard-int8`` budget (ascending), a dict of ``budget``, ``latency_ms``,
    ``accuracy`` (%), and where the peers are in the rows: ``over_dense_int8`` (dense int8 latency
    over this one's), ``gap_points`` (accuracy minus dense int8's), ``equal_accuracy`` (|gap| ≤
    0.5), ``below_curve`` (None, or why it lies below the smaller models' int8 curve: a smaller
    model at least as fast and more than 0.5 points more accurate, or the curve, interpolated
    linearly between its two neighbours in latency, more than 0.5 points above it) and
    ``faster_than_curve`` (faster than every smaller model). Means over seeds, batch-1 latency."""
    ours, dense = _mean_points(rows, "budgeted-hard-int8"), _mean_points(rows, "dense-int8")
    curve = sorted(_mean_points(rows, "smaller-int8").items(), key=lambda kv: kv[1][0])
    if not ours or not (dense or curve):
        return []
    out = []
    tolerance = EQUAL_ACCURACY_POINTS
    for (_, budget), (latency, accuracy) in sorted(ours.items(), key=lambda kv: kv[0][1]):
        entry: dict[str, Any] = {"budget": budget, "latency_ms": latency, "accuracy": accuracy}
        if dense:
            dense_latency, dense_accuracy = next(iter(dense.values()))
            gap = round(accuracy - dense_accuracy, 6) + 0.0  # round: equal means of seeds give 0, not 1e-15; + 0.0 turns -0.0 into 0.0
            entry.update(over_dense_int8=dense_latency / latency, gap_points=gap, equal_accuracy=abs(gap) <= tolerance)
        if curve:
            better = [(name, lat, acc) for (name, _), (lat, acc) in curve if lat <= latency and acc > accuracy + tolerance]
            below = None
            if better:
                name, lat, acc = max(better, key=lambda t: t[2])
                below = f"{name} is faster ({lat:.2f} ms vs {latency:.2f}) and {acc - accuracy:+.2f} points more accurate"
            else:
                for ((name_a, _), (lat_a, acc_a)), ((name_b, _), (lat_b, acc_b)) in zip(curve, curve[1:]):  # neighbours in latency
                    if lat_a < latency < lat_b:
                        interpolated = acc_a + (acc_b - acc_a) * (latency - lat_a) / (lat_b - lat_a)
                        if interpolated > accuracy + tolerance:
                            below = f"{interpolated:.2f}% interpolated between {name_a} and {name_b} at its latency"
            entry.update(below_curve=below, faster_than_curve=latency < curve[0][1][0])
        out.append(entry)
    return out


def comparison_notes(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`int8_comparisons` as one Markdown bullet per budget."""
    lines = []
    for c in int8_comparisons(rows):
        parts = []
        if "gap_points" in c:
            equal = "equal accuracy" if c["equal_accuracy"] else ("more accurate" if c["gap_points"] > 0 else "LESS accurate")
            parts.append(f"{c['over_dense_int8']:.2f}x faster than dense int8 at {c['gap_points']:+.2f} points ({equal}, ±{EQUAL_ACCURACY_POINTS:g})")
        if "below_curve" in c:
            parts.append(f"BELOW the smaller models' int8 curve: {c['below_curve']}" if c["below_curve"] else
                         "on or above the smaller models' int8 curve" + (" (faster than every smaller model)" if c["faster_than_curve"] else ""))
        lines.append(f"- budgeted-hard-int8 b = {c['budget']:g} ({c['accuracy']:.2f}%, {c['latency_ms']:.2f} ms): " + "; ".join(parts))
    return lines


def int8_notes(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`agreement_notes` then :func:`comparison_notes`; empty for a run without int8 rows."""
    return agreement_notes(rows) + comparison_notes(rows)


def int8_target_failures(rows: list[dict[str, Any]], budget: float, target: dict[str, Any]) -> list[str]:
    """Why the ``budgeted-hard-int8`` row at ``budget`` misses ``target``'s int8 keys
    (``min_speedup_over_dense_int8``: that much faster than dense int8 at equal accuracy;
    ``on_smaller_curve``: not below the smaller models' int8 curve); empty when it meets them."""
    entry = next((c for c in int8_comparisons(rows) if abs(c["budget"] - budget) < 1e-9), None)
    if entry is None and (target.get("min_speedup_over_dense_int8") is not None or target.get("on_smaller_curve")):
        return [f"no budgeted-hard-int8 row at b = {budget:g} to compare with its peers"]
    fails = []
    minimum = target.get("min_speedup_over_dense_int8")
    if minimum is not None:
        if "over_dense_int8" not in entry:
            fails.append("no dense int8 row to compare with")
        elif entry["over_dense_int8"] < minimum or entry["gap_points"] < -EQUAL_ACCURACY_POINTS:
            fails.append(f"{entry['over_dense_int8']:.2f}x over dense int8 at {entry['gap_points']:+.2f} points "
                         f"(target ≥ {minimum:g}x at equal accuracy, ±{EQUAL_ACCURACY_POINTS:g})")
    if target.get("on_smaller_curve"):
        if "below_curve" not in entry:
            fails.append("no smaller model's int8 row to compare with")
        elif entry["below_curve"]:
            fails.append(f"below the smaller models' int8 curve ({entry['below_curve']})")
    return fails
