"""Pieces shared by the recipes: budget sweeps of soft and hard models, latency attachment."""

from __future__ import annotations

from typing import Any

import torch

from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.training.evaluate import evaluate_accuracy


def sweep_soft(model: EncoderClassifier, splits: TensorSplits, budgets: list[float], head_costs, method: str, seed: int, batch: int) -> list[dict[str, Any]]:
    """Soft-gate rows: accuracy and C(b) per budget, with per-layer mean gates."""
    rows = []
    with torch.no_grad():
        for b in budgets:
            gates = model.gates(b)
            rows.append(
                {
                    "method": method,
                    "budget": b,
                    "seed": seed,
                    "accuracy": evaluate_accuracy(model, splits.test, batch, gates=gates),
                    "estimated_cost": float(estimated_cost(gates, head_costs)),
                    "layer_gates": [round(float(g), 4) for g in gates.mean(dim=1)],
                    "gates": [[round(float(v), 4) for v in layer] for layer in gates],
                }
            )
    return rows


def sweep_hard(model: EncoderClassifier, splits: TensorSplits, budgets: list[float], ranking: HeadRanking, seed: int, batch: int, method: str = "budgeted-hard") -> list[dict[str, Any]]:
    """Hard-mask rows: accuracy with exactly the kept heads; cost = kept-head fraction."""
    rows = []
    for b in budgets:
        mask = ranking.mask(b)
        rows.append(
            {
                "method": method,
                "budget": b,
                "seed": seed,
                "accuracy": evaluate_accuracy(model, splits.test, batch, gates=mask),
                "estimated_cost": float(mask.mean()),
                "heads_kept": int(mask.sum()),
                "heads_per_layer": [int(v) for v in mask.sum(dim=1)],
            }
        )
    return rows


def attach_latency(rows: list[dict[str, Any]], bench: dict[str, Any], seed: int, method: str = "budgeted-hard") -> None:
    """Copy the first setting's latency figures onto this seed's ``method`` rows."""
    by_budget = {}
    for r in bench["rows"]:
        by_budget.setdefault(r["budget"], r)
    for row in rows:
        if row["method"] == method and row["seed"] == seed and row["budget"] in by_budget:
            b = by_budget[row["budget"]]
            row.update(
                latency_ms=b["latency_ms"], dense_latency_ms=b["dense_latency_ms"], speedup=b["speedup"],
                ideal_speedup=b["ideal_speedup"], bench_batch_size=b["batch_size"], bench_seq_len=b["seq_len"], threads=b["threads"],
            )
