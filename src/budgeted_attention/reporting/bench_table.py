"""Markdown of a benchmark result (:attr:`~budgeted_attention.rundir.RunDir.bench_json`): the one
renderer of ``baa bench``'s output, the experiments' benchmark Markdown and the speed sections of
``baa report``.

Tolerant of missing and extra fields (run directories written by older versions): a column is
shown when it is always shown or some row has its field.
"""

from __future__ import annotations

from typing import Any

# (header, key, format, suffix, always shown)
Column = tuple[str, str, str, str, bool]

_LEADING: list[Column] = [
    ("budget", "budget", ".2f", "", True),
    ("batch", "batch_size", "d", "", True),
    ("seq", "seq_len", "d", "", True),
    ("threads", "threads", "d", "", True),
]
_TIMED: list[Column] = [
    ("dense ms", "dense_latency_ms", ".3f", "", True),
    ("pruned ms", "latency_ms", ".3f", "", True),
    ("speedup", "speedup", ".2f", "x", True),
    ("FLOP-ideal", "ideal_speedup", ".2f", "x", True),
    ("speedup / ideal", "efficiency", ".2f", "", True),
]
# ONNX Runtime (baa bench --onnx): the pruned graph against the dense graph, same runtime.
_ONNX: list[Column] = [
    ("ORT dense ms", "onnx_dense_latency_ms", ".3f", "", False),
    ("ORT pruned ms", "onnx_latency_ms", ".3f", "", False),
    ("ORT speedup", "onnx_speedup", ".2f", "x", False),
    ("ORT / ideal", "onnx_efficiency", ".2f", "", False),
]
# int8 (baa bench --onnx --int8): the pruned int8 graph against the dense int8 graph and the float library model.
_INT8: list[Column] = [
    ("int8 dense ms", "int8_dense_latency_ms", ".3f", "", False),
    ("int8 pruned ms", "int8_latency_ms", ".3f", "", False),
    ("int8 speedup", "int8_speedup", ".2f", "x", False),
    ("int8 vs library fp32", "int8_library_speedup", ".2f", "x", False),
]


def num(row: dict[str, Any], key: str, fmt: str, suffix: str = "") -> str:
    """``row[key]`` formatted, or "" when it is missing or not a number."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return f"{value:{fmt}}{suffix}"


def _library(setting: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(name of the library model the rows were timed against, rows with ``library_speedup``).
    Records of earlier releases name it in ``library_references`` and keep its speedup as
    ``<name>_speedup`` (there, the module tree's over it)."""
    name = setting.get("library")
    if not isinstance(name, str):
        legacy = [n for n in setting.get("library_references", []) if isinstance(n, str)]
        name = legacy[0] if legacy else ("transformers" if any("transformers_speedup" in r for r in rows) else None)
    if name is None:
        return None, rows
    return name, [r if "library_speedup" in r or f"{name}_speedup" not in r else {**r, "library_speedup": r[f"{name}_speedup"]} for r in rows]


def _columns(library: str | None, rows: list[dict[str, Any]]) -> tuple[list[Column], list[Column]]:
    """(leading, trailing) columns: trailing are the timings, the library model's and the ORT columns."""
    trailing = _TIMED + ([(f"vs {library}", "library_speedup", ".2f", "x", False)] if library else []) + _ONNX + _INT8
    shown = lambda column: column[4] or any(column[1] in r for r in rows)  # noqa: E731
    return [c for c in _LEADING if shown(c)], [c for c in trailing if shown(c)]


def bench_table(result: dict[str, Any]) -> str:
    """Markdown table of a benchmark result: one row per (budget, scope, input, batch, seq), then
    the switch time and notes on the runtimes."""
    setting = result.get("setting") if isinstance(result.get("setting"), dict) else {}
    library, rows = _library(setting, [r for r in result.get("rows", []) if isinstance(r, dict)])
    leading, trailing = _columns(library, rows)
    lines = []
    if setting.get("dense_reference"):
        lines += [f"Dense reference: {setting['dense_reference']}.", ""]
    # Under budget_scope all, rows of both scopes (heads only, and heads + FFN) stand side by side.
    scoped = any(r.get("scope") for r in rows)
    lengths = any(r.get("input") not in (None, "random") for r in rows)
    ffn = any(r.get("ffn_per_layer") is not None for r in rows)
    flops = any(isinstance(r.get("flops_fraction"), (int, float)) for r in rows)
    header = [leading[0][0]] + (["scope"] if scoped else []) + (["input"] if lengths else []) + [c[0] for c in leading[1:]]
    header += ["heads kept"] + (["FFN neurons per layer"] if ffn else []) + (["FLOPs"] if flops else []) + [c[0] for c in trailing]
    lines += ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for r in rows:
        cells = [num(r, c[1], c[2], c[3]) for c in leading]
        head = cells[:1] + ([str(r.get("scope", "heads"))] if scoped else []) + ([str(r.get("input", "random"))] if lengths else [])
        heads = ""
        if r.get("heads_kept") is not None:
            heads = str(r["heads_kept"]) + (f" {r['heads_per_layer']}" if r.get("heads_per_layer") is not None else "")
        extra = []
        if ffn:
            widths = r.get("ffn_per_layer")
            extra.append("all" if widths is None else str(widths))
        if flops:
            fraction = {"f": 100 * r["flops_fraction"]} if isinstance(r.get("flops_fraction"), (int, float)) else {}
            extra.append(num(fraction, "f", ".0f", "%"))
        lines.append("| " + " | ".join(head + cells[1:] + [heads] + extra + [num(r, c[1], c[2], c[3]) for c in trailing]) + " |")
    lines += _notes(result, setting, rows, library)
    return "\n".join(lines) + "\n"


def _notes(result: dict[str, Any], setting: dict[str, Any], rows: list[dict[str, Any]], library: str | None) -> list[str]:
    """Switch time, speedups, runtimes and timing method, a paragraph each."""
    lines: list[str] = []
    switch = result.get("switch")
    if isinstance(switch, dict) and isinstance(switch.get("switch_ms"), (int, float)):
        lines += ["", f"Budget switch (sliced layout): {1000 * switch['switch_ms']:.1f} µs median."]
    if "library" in setting:  # records of this release: every model timed through its lean executor
        versus = f"; vs {library} = the unmodified {library} model's latency over the pruned one's (the runtime's gain included)" if library else ""
        lines += ["", f"Speedup = the dense reference's latency over the pruned model's, both through the family's lean executor (like for like){versus}."]
    if setting.get("onnx"):
        lines += ["", f"ORT: {setting['onnx']}; ORT speedup = the dense graph's latency over the pruned graph's."]
    if setting.get("int8"):
        lines += ["", f"int8: {setting['int8']}; int8 speedup = the dense int8 graph's latency over the pruned int8 graph's."]
    if any(r.get("input") == "lengths" for r in rows):
        lines += ["", "`lengths` rows: padded batches whose lengths are sampled from the data set; seq = mean padded length, "
                  f"latency per batch over {setting.get('length_batches')} batches."]
    timing = [str(setting[k]) for k in ("timer",) if setting.get(k)]
    if setting.get("rounds") is not None:
        timing.append(f"{setting['rounds']} round(s)")
    if timing:
        lines += ["", "Timing: " + ", ".join(timing) + "."]
    if setting.get("allocator"):
        lines += ["", f"Allocator: {setting['allocator']}."]
    return lines
