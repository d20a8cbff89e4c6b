"""Markdown of per-input head routing results (``routed.json`` of a run directory).

``routed.json``: ``{"bench": {seed: {"rows": [...]}}, "difficulty": {method: {seed: {budget: profile}}},
"calibration": {method: {seed: {budget: offset}}}, "spread": {method: {seed: {budget: choice}}}}`` (see
:func:`budgeted_attention.benchmark.per_input.bench_per_input` and
:func:`budgeted_attention.training.routed.difficulty_profile`). Tables aggregate over seeds
(mean ± std) so a 3-seed run stays readable.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any


def _mean_std(values: list[float], digits: int = 2, suffix: str = "") -> str:
    if not values:
        return ""
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}{suffix}"
    return f"{mean:.{digits}f}{suffix} ± {statistics.stdev(values):.{digits}f}"


def _budget_label(budget: Any, learned: bool = False) -> str:
    return "learned" if learned or budget in (None, "learned") else f"{float(budget):g}"


def _group_rows(
    bench_by_seed: dict[str, dict[str, Any]], keep: Callable[[dict[str, Any]], bool] = lambda row: True
) -> list[tuple[tuple, list[dict[str, Any]]]]:
    """Bench rows of every seed that ``keep`` accepts, grouped by (method, budget label, batch,
    seq), in table order (method, batch, budget)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for bench in bench_by_seed.values():
        for row in bench.get("rows", []):
            if keep(row):
                key = (row["method"], _budget_label(row["budget"], row.get("learned_budget", False)), row["batch_size"], row["seq_len"])
                groups[key].append(row)
    return sorted(groups.items(), key=lambda item: (item[0][0], item[0][2], item[0][1]))


def speed_table(bench_by_seed: dict[str, dict[str, Any]]) -> str:
    """Measured speed of the routed models per (method, budget, batch), mean ± std over seeds."""
    groups = _group_rows(bench_by_seed)
    lines = [
        "| method | budget | batch | seq | seeds | mean heads | cost | speedup | FLOP-ideal | efficiency | static slice | "
        "static efficiency | routed / static |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (method, budget, batch, seq), rows in groups:
        pick = lambda key: [float(r[key]) for r in rows]  # noqa: E731
        lines.append(
            f"| {method} | {budget} | {batch} | {seq} | {len(rows)} | {_mean_std(pick('mean_heads'))} | {_mean_std(pick('cost'), 3)} | "
            f"{_mean_std(pick('speedup'), 2, 'x')} | {_mean_std(pick('ideal_speedup'), 2, 'x')} | {_mean_std(pick('efficiency'))} | "
            f"{_static_cell(rows, 'static_speedup', 'x')} | {_static_cell(rows, 'static_efficiency')} | {_static_cell(rows, 'routing_share')} |"
        )
    return "\n".join(lines) + "\n"


def lean_table(bench_by_seed: dict[str, dict[str, Any]]) -> str:
    """Batch-1 routing through the lean copy, per (method, budget), mean ± std over seeds; "" when
    no row has it (older records, families without a lean copy)."""
    groups = _group_rows(bench_by_seed, lambda row: row.get("lean_latency_ms") is not None)
    if not groups:
        return ""
    lines = [
        "| method | budget | batch | seq | seeds | lean dense ms | lean routed ms | lean speedup | FLOP-ideal | lean efficiency | "
        "preset efficiency | routed / preset | lean static efficiency | routed / static | over plain dense |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (method, budget, batch, seq), rows in groups:
        pick = lambda key: [float(r[key]) for r in rows]  # noqa: E731
        lines.append(
            f"| {method} | {budget} | {batch} | {seq} | {len(rows)} | {_mean_std(pick('lean_dense_latency_ms'), 3)} | "
            f"{_mean_std(pick('lean_latency_ms'), 3)} | {_mean_std(pick('lean_speedup'), 2, 'x')} | {_mean_std(pick('ideal_speedup'), 2, 'x')} | "
            f"{_mean_std(pick('lean_efficiency'))} | {_static_cell(rows, 'lean_preset_efficiency')} | {_static_cell(rows, 'lean_decision_share')} | "
            f"{_mean_std(pick('lean_static_efficiency'))} | {_mean_std(pick('lean_routing_share'))} | "
            f"{_mean_std(pick('lean_plain_speedup'), 2, 'x')} |"
        )
    return "\n".join(lines) + "\n"


def _static_cell(rows: list[dict[str, Any]], key: str, suffix: str = "") -> str:
    """A column timed at batch 1 only (static slice) or absent from older records (static slice,
    preset run), so its seed count is given when it differs from the row's."""
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    cell = _mean_std(values, 2, suffix)
    return f"{cell} ({len(values)} seeds)" if values and len(values) < len(rows) else cell


def difficulty_table(difficulty: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Mean heads per difficulty bin and the rank correlations, per (method, budget), mean over seeds."""
    rows = []
    marker_bins: list[str] = []
    for method, by_seed in difficulty.items():
        budgets = sorted({b for profiles in by_seed.values() for b in profiles}, key=lambda b: (b != "learned", b))
        for budget in budgets:
            profiles = [p[budget] for p in by_seed.values() if budget in p]
            by_loss: dict[str, list[float]] = defaultdict(list)
            by_markers: dict[str, list[float]] = defaultdict(list)
            for profile in profiles:
                for entry in profile.get("by_dense_loss", []):
                    by_loss[entry["bin"]].append(entry["mean_heads"])
                for entry in profile.get("by_markers", []):
                    by_markers[entry["bin"]].append(entry["mean_heads"])
            marker_bins = sorted(set(marker_bins) | set(by_markers), key=int)
            rows.append((method, budget, profiles, by_loss, by_markers))
    quartiles = ["Q1 (easiest)", "Q2", "Q3", "Q4 (hardest)"]
    header = ["method", "budget", "seeds", "ρ(heads, dense loss)"] + [f"heads, loss {q}" for q in quartiles]
    if marker_bins:
        header += ["ρ(heads, markers)"] + [f"heads, {m} marker(s)" for m in marker_bins]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|" + "---:|" * (len(header) - 2)]
    for method, budget, profiles, by_loss, by_markers in rows:
        cells = [method, _budget_label(budget), str(len(profiles)), _mean_std([p["spearman_dense_loss"] for p in profiles], 3)]
        cells += [_mean_std(by_loss.get(q, [])) for q in quartiles]
        if marker_bins:
            cells.append(_mean_std([p["spearman_markers"] for p in profiles if "spearman_markers" in p], 3))
            cells += [_mean_std(by_markers.get(m, [])) for m in marker_bins]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def spread_table(spread: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The difficulty router's spread multiplier chosen on validation, per (method, budget): how
    often each candidate won over the seeds, and the mean validation score of each candidate."""
    lines = ["| method | budget | seeds | chosen spread (seeds) | validation score by spread |", "|---|---:|---:|---|---|"]
    for method, by_seed in spread.items():
        budgets = sorted({b for choices in by_seed.values() for b in choices}, key=float)
        for budget in budgets:
            picks = [choices[budget] for choices in by_seed.values() if budget in choices]
            if not picks:
                continue
            counts: dict[float, int] = defaultdict(int)
            scores: dict[str, list[float]] = defaultdict(list)
            for pick in picks:
                counts[float(pick["scale"])] += 1
                for c, v in pick["val_scores"].items():
                    scores[c].append(100 * v)
            chosen = ", ".join(f"{c:g} ({n})" for c, n in sorted(counts.items()))
            by_spread = "; ".join(f"{float(c):g}: {_mean_std(v)}" for c, v in sorted(scores.items(), key=lambda item: float(item[0])))
            lines.append(f"| {method} | {_budget_label(budget)} | {len(picks)} | {chosen} | {by_spread} |")
    return "\n".join(lines) + "\n"


def routed_markdown(data: dict[str, Any]) -> str:
    """The per-input routing section of a run: speed, then heads by input difficulty."""
    parts = []
    if data.get("bench"):
        parts += [
            "Measured on validation inputs (each batch padded to its longest input; `seq` = the longest), interleaved with the plain dense reference "
            "(same weights and kernels, no router or gate code), 1 thread unless stated; FLOP-ideal = dense FLOPs over the "
            "mean FLOPs of the heads the same inputs selected; efficiency = speedup / FLOP-ideal. Static slice (batch 1 "
            "only): the same weights without the router, each input run with its own head count per layer as a prefix "
            "of the stored heads, in the same interleaved rounds; the same FLOPs and no routing, so static efficiency is "
            "what the framework keeps of the FLOP saving on a pass this small whoever picks the heads, and routed / static "
            "is what the routing (router, head selection, gathered weights) keeps of it.",
            "",
            speed_table(data["bench"]),
        ]
        allocators = sorted({row["allocator"] for bench in data["bench"].values() for row in bench.get("rows", []) if row.get("allocator")})
        if allocators:
            parts += [f"Allocator: {'; '.join(allocators)}.", ""]
        lean = lean_table(data["bench"])
        if lean:
            parts += [
                "The same batch-1 decisions through the family's lean inference copy (RoutedInference: the router "
                "decides, one flat loop of the same kernels runs each input's head sets, their weight rows gathered "
                "once per set and cached), in the same interleaved rounds. Lean speedup: the copy's own dense pass over "
                "its routed pass (like for like); preset efficiency: the lean copy running the same head sets decided "
                "before the timing (the heads' cost without the router's), so routed / preset is what deciding per "
                "input keeps of the saving; lean static efficiency: the static slice through a lean copy; over "
                "plain dense: the plain dense reference over the lean routed pass (the runtime's own gain included). "
                "Times: all timed inputs, one pass, ms.",
                "",
                lean,
            ]
    if data.get("difficulty"):
        parts += [
            "Heads per layer by input difficulty (test split): quartiles of the dense model's per-input loss and, on the "
            "synthetic task, the number of markers; ρ = Spearman rank correlation with the heads an input got "
            "(0 when every input gets the same count).",
            "",
            difficulty_table(data["difficulty"]),
        ]
    if any(profiles for by_seed in data.get("difficulty_as_trained", {}).values() for profiles in by_seed.values()):
        parts += [
            "The same routers at spread 1 (as trained), where validation chose a smaller spread: how the heads would track "
            "difficulty (test split, heads only; never a result row).",
            "",
            difficulty_table(data["difficulty_as_trained"]),
        ]
    if any(choices for by_seed in data.get("spread", {}).values() for choices in by_seed.values()):
        parts += [
            "Spread of the difficulty allocation, chosen per budget on the validation split: the router's difficulty "
            "logit is multiplied by the spread (0: every input gets the same head count; 1: as trained), the offset "
            "re-calibrated to the budget, and the best validation score wins (ties to the smaller spread). Scores in %.",
            "",
            spread_table(data["spread"]),
        ]
    return "\n".join(parts)
