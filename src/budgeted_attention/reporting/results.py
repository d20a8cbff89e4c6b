"""Result rows and their aggregation.

A result row is a flat dict with at least ``method``, ``budget``, ``seed``, ``accuracy`` and
``estimated_cost``; later stages add fields (``heads_kept``, ``latency_ms``, ``speedup``,
``ideal_speedup``...). ``results.json`` is ``{"rows": [...]}``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from budgeted_attention.io import write_json_atomic, write_text_atomic

METHOD_ORDER = ["dense", "budgeted", "budgeted-hard", "budgeted-scratch", "static", "posthoc", "posthoc-recovered"]
_MEAN_FIELDS = ["accuracy", "estimated_cost", "accuracy_before_adaptation", "heads_kept", "latency_ms", "speedup", "ideal_speedup"]


def _method_key(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (method, budget); one dict per group, sorted."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["method"], float(row["budget"]))].append(row)
    summary = []
    for (method, budget), members in sorted(groups.items(), key=lambda kv: (_method_key(kv[0][0]), kv[0][1])):
        entry: dict[str, Any] = {"method": method, "budget": budget, "seeds": len(members)}
        for field in _MEAN_FIELDS:
            values = [float(m[field]) for m in members if m.get(field) is not None and not _is_nan(m.get(field))]
            if values:
                entry[f"{field}_mean"], entry[f"{field}_std"] = _mean_std(values)
        summary.append(entry)
    return summary


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _fmt_pct(entry: dict[str, Any], field: str) -> str:
    if f"{field}_mean" not in entry:
        return ""
    return f"{100 * entry[f'{field}_mean']:.2f} ± {100 * entry[f'{field}_std']:.2f}"


def _fmt(entry: dict[str, Any], field: str, digits: int = 3, suffix: str = "") -> str:
    if f"{field}_mean" not in entry:
        return ""
    return f"{entry[f'{field}_mean']:.{digits}f}{suffix}"


def markdown_table(summary: list[dict[str, Any]]) -> str:
    """The paper-style table: one line per (method, budget), mean ± std over seeds."""
    header = (
        "| method | budget | seeds | accuracy % | est. cost C(b) | heads kept | "
        "acc. before adapt. % | speedup | FLOP-ideal |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for e in summary:
        lines.append(
            f"| {e['method']} | {e['budget']:.2f} | {e['seeds']} | {_fmt_pct(e, 'accuracy')} | "
            f"{_fmt(e, 'estimated_cost')} | {_fmt(e, 'heads_kept', 1)} | "
            f"{_fmt_pct(e, 'accuracy_before_adaptation')} | {_fmt(e, 'speedup', 2, 'x')} | "
            f"{_fmt(e, 'ideal_speedup', 2, 'x')} |"
        )
    return header + "\n".join(lines) + "\n"


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


def write_results(out_dir: str | Path, rows: list[dict[str, Any]], *, title: str, notes: str = "") -> str:
    """Write results.json, results.csv and results.md atomically; returns the Markdown table."""
    out = Path(out_dir)
    write_json_atomic(out / "results.json", {"rows": rows})
    write_text_atomic(out / "results.csv", rows_to_csv(rows))
    table = markdown_table(aggregate(rows))
    write_text_atomic(out / "results.md", f"# {title}\n\n{table}\n{notes}")
    return table
