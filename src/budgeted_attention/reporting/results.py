"""Result rows and their aggregation.

A result row is a flat dict with at least ``method``, ``budget``, ``seed`` and ``accuracy`` (test
split); later stages add fields (``heads_kept``, ``latency_ms``, ``speedup``, ``ideal_speedup``...).
A run's :attr:`~budgeted_attention.rundir.RunDir.results_json` is ``{"rows": [...]}``.

Two generations of rows are read:

* old rows carry ``estimated_cost`` (soft rows: the estimate C(b); hard rows: kept-head fraction);
* new rows add ``val_accuracy`` (validation split, or null), ``cost`` with ``cost_kind``
  (``"soft-estimate"``, ``"kept-heads"`` or ``"dense"``), ``steps`` (optimizer steps from
  initialisation) and reference speedups such as ``transformers_speedup``.

A missing field is an empty cell, never an error.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.rundir import RunDir

METHOD_ORDER = [
    "dense", "dense-long",
    "budgeted", "budgeted-hard", "budgeted-sandwich", "budgeted-hard-sandwich", "budgeted-scratch",
    "static", "static-soft",
    "posthoc", "posthoc-recovered", "posthoc-recovered-1ep",
    "ladder", "budgetformer", "capped-routing",
]
_MEAN_FIELDS = [
    "accuracy", "val_accuracy", "cost", "estimated_cost", "steps", "accuracy_before_adaptation", "heads_kept",
    "latency_ms", "speedup", "ideal_speedup", "transformers_speedup", "plain_speedup",
    "loss", "val_loss", "perplexity", "loss_before_adaptation", "mean_heads",
]


@dataclass(frozen=True)
class MetricSpec:
    """How a run's primary metric is shown: row key, axis/column label, display scale, digits."""

    key: str
    label: str
    short: str
    scale: float
    digits: int


ACCURACY_METRIC = MetricSpec("accuracy", "test accuracy (%)", "acc. %", 100.0, 2)
LOSS_METRIC = MetricSpec("loss", "test loss (nats/token)", "loss (nats)", 1.0, 3)


def metric_of(entries: list[dict[str, Any]]) -> MetricSpec:
    """Loss (language models) when the rows or aggregates carry a loss and no accuracy, else accuracy."""
    has = lambda key: any(_is_number(e.get(key)) or f"{key}_mean" in e for e in entries)  # noqa: E731
    return LOSS_METRIC if has("loss") and not has("accuracy") else ACCURACY_METRIC
COST_KINDS = ("soft-estimate", "kept-heads", "smaller-dense", "routed", "dense")
SOFT_MARK = "~"
COST_LEGEND = (
    f"Cost: fraction of the dense model's budgeted FLOPs (attention heads; with `budget_scope: all`, heads and "
    f"feed-forward blocks). `{SOFT_MARK}` marks a soft-gate estimate C(b) "
    "(expected cost of the soft gates, no head removed); unmarked: kept-head fraction of the hard-masked / "
    "pruned model, or 1 for dense; `ladder` rows: a separately trained smaller dense model, cost = its forward FLOPs over the full model's; "
    "`budgetformer` / `capped-routing` rows: per-input head routing, cost = mean fraction of heads the test inputs ran "
    "(only those heads computed)."
)


# Old rows have no ``cost_kind``; what their ``estimated_cost`` meant followed from the method.
_LEGACY_COST_KIND = {
    "dense": "dense",
    "budgeted": "soft-estimate", "budgeted-scratch": "soft-estimate", "static": "soft-estimate",
    "budgeted-hard": "kept-heads", "posthoc": "kept-heads", "posthoc-recovered": "kept-heads",
}


def row_cost_kind(row: dict[str, Any]) -> str | None:
    """``cost_kind`` of the row; for old rows (``estimated_cost`` only) inferred from the method."""
    if row.get("cost_kind"):
        return str(row["cost_kind"])
    if row.get("cost") is None and row.get("estimated_cost") is not None:
        return _LEGACY_COST_KIND.get(str(row.get("method")))
    return None


def row_cost(row: dict[str, Any]) -> float | None:
    """The row's attention cost: ``cost`` (new rows) or ``estimated_cost`` (old rows); None if neither."""
    for field in ("cost", "estimated_cost"):
        value = row.get(field)
        if value is not None and not _is_nan(value):
            return float(value)
    return None


def display_method(row: dict[str, Any]) -> str:
    """``method``, or ``method (variant)`` for a named variant (e.g. a ladder entry)."""
    return f"{row['method']} ({row['variant']})" if row.get("variant") else str(row["method"])


def _method_key(method: str) -> tuple[int, str]:
    base = method.split(" (", 1)[0]
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), method)


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (method, budget); one dict per group, sorted."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(display_method(row), float(row["budget"]))].append(row)
    summary = []
    for (method, budget), members in sorted(groups.items(), key=lambda kv: (_method_key(kv[0][0]), kv[0][1])):
        entry: dict[str, Any] = {"method": method, "budget": budget, "seeds": len(members)}
        for field in _MEAN_FIELDS:
            values = [float(m[field]) for m in members if _is_number(m.get(field))]
            if values:
                entry[f"{field}_mean"], entry[f"{field}_std"] = _mean_std(values)
        kinds = sorted({k for k in (row_cost_kind(m) for m in members) if k})
        if kinds:
            entry["cost_kind"] = kinds[0] if len(kinds) == 1 else "mixed"
        summary.append(entry)
    return summary


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not _is_nan(value)


def _fmt_pct(entry: dict[str, Any], field: str, scale: float = 100.0, digits: int = 2) -> str:
    if f"{field}_mean" not in entry:
        return ""
    return f"{scale * entry[f'{field}_mean']:.{digits}f} ± {scale * entry[f'{field}_std']:.{digits}f}"


def _fmt(entry: dict[str, Any], field: str, digits: int = 3, suffix: str = "") -> str:
    if f"{field}_mean" not in entry:
        return ""
    return f"{entry[f'{field}_mean']:.{digits}f}{suffix}"


def _fmt_cost(entry: dict[str, Any]) -> str:
    field = "cost" if "cost_mean" in entry else "estimated_cost"
    text = _fmt(entry, field)
    if text and entry.get("cost_kind") in ("soft-estimate", "mixed"):
        text = SOFT_MARK + text
    return text


def _gap(entry: dict[str, Any], dense_loss: float | None) -> str:
    """Mean test loss minus the dense model's (nats; positive = worse), empty without both."""
    if dense_loss is None or "loss_mean" not in entry:
        return ""
    return f"{entry['loss_mean'] - dense_loss:+.3f}"


def _fmt_steps(entry: dict[str, Any]) -> str:
    if "steps_mean" not in entry:
        return ""
    return f"{entry['steps_mean']:,.0f}"


def markdown_table(summary: list[dict[str, Any]]) -> str:
    """The paper-style table: one line per (method, budget), mean ± std over seeds.

    Columns ``vs HF`` / ``vs plain`` (reference speedups) appear only when some row has them; a
    legend line follows the table when some cost is a soft estimate.
    """
    extra = [(f, label) for f, label in (("transformers_speedup", "vs transformers"), ("plain_speedup", "vs plain")) if any(f"{f}_mean" in e for e in summary)]
    metric = metric_of(summary)
    key, short = metric.key, metric.short
    lm = metric is LOSS_METRIC
    dense_loss = next((e["loss_mean"] for e in summary if e["method"] == "dense" and "loss_mean" in e), None) if lm else None
    header = (
        f"| method | budget | seeds | steps | val. {short} | test {short} |" + (" test ppl. | vs dense (nats) |" if lm else "")
        + f" cost | heads kept | {short} before adapt. | speedup | FLOP-ideal |" + "".join(f" {label} |" for _, label in extra) + "\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if lm else "") + "---:|" * len(extra) + "\n"
    )
    lines = []
    for e in summary:
        value = lambda field: _fmt_pct(e, field, metric.scale, metric.digits)  # noqa: E731
        lines.append(
            f"| {e['method']} | {e['budget']:.2f} | {e['seeds']} | {_fmt_steps(e)} | {value(f'val_{key}')} | "
            f"{value(key)} |" + (f" {_fmt(e, 'perplexity', 2)} | {_gap(e, dense_loss)} |" if lm else "") + f" {_fmt_cost(e)} | {_fmt(e, 'heads_kept', 1)} | "
            f"{value(f'{key}_before_adaptation')} | {_fmt(e, 'speedup', 2, 'x')} | "
            f"{_fmt(e, 'ideal_speedup', 2, 'x')} |" + "".join(f" {_fmt(e, f, 2, 'x')} |" for f, _ in extra)
        )
    table = header + "\n".join(lines) + "\n"
    if any(e.get("cost_kind") in ("soft-estimate", "mixed") for e in summary):
        table += "\n" + COST_LEGEND + "\n"
    return table


_ROUTING_FIELDS = [
    ("projected_cost", "projected cost %", 100.0), ("hard_projected_cost", "hard cost %", 100.0),
    ("attention_flops_fraction", "measured attn. FLOPs %", 100.0), ("entropy_pct", "entropy %", 1.0),
    ("prior_agreement", "= prior's choice %", 100.0), ("mi_token_fraction", "MI(token; expert) / H(expert) %", 100.0),
]


def routing_table(rows: list[dict[str, Any]]) -> str:
    """Meta-Attention rows (with ``routing``): one line per method, mean ± std over seeds; empty if none.

    Soft loss: the row's test loss (routing weights mixed); hard loss: each token computes only
    its argmax expert; measured FLOPs: attention core of that hard pass over full softmax attention.
    """
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if isinstance(row.get("routing"), dict) and _is_number(row.get("loss")):
            groups[display_method(row)].append(row)
    if not groups:
        return ""
    header = ["method", "seeds", "test loss (soft)", "test loss (hard)"] + [label for _, label, _ in _ROUTING_FIELDS] + ["tokens full / linear / window %"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for method, members in sorted(groups.items(), key=lambda kv: _method_key(kv[0])):
        def cell(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
            mean, std = _mean_std([scale * v for v in values])
            return f"{mean:.{digits}f} ± {std:.{digits}f}"

        routing = [m["routing"] for m in members]
        cells = [method, str(len(members)), cell([m["loss"] for m in members], digits=3), cell([r["hard_loss"] for r in routing], digits=3)]
        cells += [cell([r[key] for r in routing], scale) for key, _, scale in _ROUTING_FIELDS]
        fractions = [statistics.fmean(r["expert_fractions"][e] for r in routing) for e in ("full", "linear", "window")]
        cells.append(" / ".join(f"{100 * f:.1f}" for f in fractions))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """All rows as CSV; the columns are the union of the rows' scalar fields."""
    fields: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in fields and not isinstance(value, (list, dict)):
                fields.append(key)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_results(out_dir: str | Path, rows: list[dict[str, Any]], *, title: str, notes: str = "", partial: str | None = None) -> str:
    """Write the run directory's results (JSON, CSV and Markdown) atomically; returns the Markdown table.

    ``partial``: a sentence saying the run is unfinished (kept in the JSON for reports)."""
    run = RunDir(out_dir)
    write_json_atomic(run.results_json, {"rows": rows, **({"partial": partial} if partial else {})})
    write_text_atomic(run.results_csv, rows_to_csv(rows))
    table = markdown_table(aggregate(rows))
    routing = routing_table(rows)
    if routing:
        table += "\n## Routing (Meta-Attention, test split)\n\n" + routing
    write_text_atomic(run.results_md, f"# {title}\n\n{table}\n{notes}")
    return table
