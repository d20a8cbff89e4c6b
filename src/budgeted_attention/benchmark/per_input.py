"""Measured speed of per-input head routing (BudgetFormer / budget-capped) on real inputs.

The routed model decides each input's heads, then computes only those (one input: gathered
weights; a batch: inputs grouped by head set per layer). It is timed on real inputs (routing
depends on them), interleaved with the plain dense reference (same weights, same kernels, no
gate or router code), 1 thread by default. The FLOP-ideal speedup is the dense model's FLOPs
over the mean FLOPs of the heads the same inputs selected (cost model at their padded length);
efficiency = measured / ideal, so router overhead and grouping show as lost efficiency.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.router import pooled_embeddings

Batches = list[tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def selected_heads(model: GatedModel, batches: Batches, budget: float | None) -> list[int]:
    """Heads per layer each input of ``batches`` runs (every head for a capped router at b = 1)."""
    router = model.router
    if router.cfg.mode == "capped" and (budget is None or budget >= 1.0):
        return [router.n_heads] * sum(int(ids.shape[0]) for ids, _ in batches)
    heads: list[int] = []
    for ids, mask in batches:
        pooled = pooled_embeddings(model.input_embedding(), ids, mask)
        heads += [int(k) for k in router.heads_for(router.fraction(pooled, budget))]
    return heads


def bench_per_input(
    model: GatedModel,
    reference: nn.Module,
    batches: Batches,
    budgets: list[float | None],
    cfg: BenchConfig,
    *,
    method: str,
) -> list[dict[str, Any]]:
    """One row per budget: measured latency of ``model`` over ``batches`` against ``reference``.

    Args:
        model: a routed model (router attached), eval mode.
        reference: the plain dense model, called as ``reference(ids, mask)``.
        batches: (input_ids, attention_mask) pairs of real inputs, all of one batch size and length.
        budgets: the caller budgets to time (None: a learned router's own budget).
        method: row label.

    Returns:
        Rows with ``latency_ms`` (all batches, one pass), ``dense_latency_ms``, ``speedup``,
        ``ideal_speedup``, ``efficiency``, ``mean_heads`` and the setting.
    """
    model.eval()
    reference.eval()
    batch_size, seq_len = (int(s) for s in batches[0][0].shape)
    cost = model.cost_model(seq_len)
    dense_flops = cost.total_flops()
    rows = []
    for budget in budgets:
        heads = selected_heads(model, batches, budget)
        mean_flops = sum(cost.total_flops([k] * model.n_layers) for k in heads) / len(heads)

        def routed(b: float | None = budget) -> None:
            for ids, mask in batches:
                model(ids, mask, budget=b)

        def dense() -> None:
            for ids, mask in batches:
                reference(ids, mask)

        timed = measure_interleaved(
            {"routed": routed, "dense": dense}, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time
        )
        ideal = dense_flops / mean_flops
        speedup = timed["dense"] / timed["routed"]
        rows.append({
            "method": method, "budget": 1.0 if budget is None else budget, "learned_budget": budget is None,
            "batch_size": batch_size, "seq_len": seq_len, "threads": cfg.threads, "inputs": len(heads), "input": "validation",
            "latency_ms": timed["routed"], "dense_latency_ms": timed["dense"], "speedup": speedup,
            "ideal_speedup": ideal, "efficiency": speedup / ideal, "mean_heads": sum(heads) / len(heads),
            "cost": sum(heads) / (len(heads) * model.n_heads),
        })
    return rows


def per_input_markdown(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_per_input` rows."""
    lines = [
        "| method | budget | batch | seq | mean heads | cost | routed ms | dense ms | speedup | FLOP-ideal | efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        budget = "learned" if r.get("learned_budget") else f"{r['budget']:g}"
        lines.append(
            f"| {r['method']} | {budget} | {r['batch_size']} | {r['seq_len']} | {r['mean_heads']:.2f} | {r['cost']:.3f} | "
            f"{r['latency_ms']:.2f} | {r['dense_latency_ms']:.2f} | {r['speedup']:.2f}x | {r['ideal_speedup']:.2f}x | {r['efficiency']:.2f} |"
        )
    return "\n".join(lines) + "\n"
