"""Measured speed of per-input head routing (BudgetFormer / budget-capped) on real inputs.

The routed model decides each input's heads, then computes only those (one input: gathered
weights; a batch: inputs grouped by head set per layer). It is timed on real inputs (routing
depends on them), interleaved with the dense reference (the dense model's lean executor: the
inference path, no gate or router code), 1 thread by default. The FLOP-ideal speedup is the dense model's FLOPs
over the FLOPs of the heads the same inputs selected (cost model at each batch's padded length);
efficiency = measured / ideal, so router overhead and grouping show as lost efficiency.

At batch 1, where the family has a lean inference copy, the same decisions also run through it
(:class:`~budgeted_attention.model.routed_inference.RoutedInference`), timed in the same rounds
against the lean copy's own dense pass (like for like: ``lean_efficiency``) and, with its
runtime gain, against the dense reference (``lean_plain_speedup``); the static slice runs
through a lean copy too (``lean_static_*``), and so do the same head sets decided before the
timing (``lean_preset_*``: the routed pass without the per-input decision, so
``lean_decision_share`` = lean routed speedup / preset speedup is what the routed pass keeps of
the preset run's saving once it decides per input: router, head positions and the lean copy's
staleness check).

At batch 1 a third model runs in the same interleaved rounds: the *static slice*, the same weights
without the router, each input run with its own head count per layer as a prefix of the stored
heads (instant switching, :meth:`~budgeted_attention.model.family.GatedModel.set_active`, whose
few microseconds per input are timed with it). It does
the same FLOPs as the routed pass and none of the routing, so it splits the lost efficiency in two:
what the framework loses on a small pass whatever picks the heads (static speedup / FLOP-ideal),
and what the routing itself costs (routed / static speedup).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import nn

from budgeted_attention.benchmark.allocator import keep_freed_memory
from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.routed_inference import RoutedInference
from budgeted_attention.model.router import pooled_embeddings

Batches = list[tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def selected_heads(model: GatedModel, batches: Batches, budget: float | None) -> list[list[int]]:
    """Heads per layer each input runs, per batch (every head for a capped router at b = 1)."""
    return [
        [int(k) for k in model.router.head_counts(pooled_embeddings(model.input_embedding(), ids, mask), budget)]
        for ids, mask in batches
    ]


def flop_ideal(model: GatedModel, batches: Batches, heads: list[list[int]]) -> float:
    """Dense FLOPs over routed FLOPs of the same inputs, each batch at its own padded length."""
    dense = routed = 0.0
    for (ids, _), batch_heads in zip(batches, heads):
        cost = model.cost_model(int(ids.shape[1]))
        dense += len(batch_heads) * cost.total_flops()
        routed += sum(cost.total_flops([k] * model.n_layers) for k in batch_heads)
    return dense / routed


def static_slice(model: GatedModel) -> GatedModel:
    """A copy of ``model`` without its router: the comparator that runs a given head count per layer
    as a prefix of the stored heads (the same FLOPs as a routed input with that count)."""
    router, model.router = model.router, None
    try:
        static = copy.deepcopy(model)
    finally:
        model.router = router
    return static.eval()


def _run_sliced(static: nn.Module, full: list[int], batches: Batches, counts: list[int]) -> None:
    """The static slice over one-input ``batches``: input i with ``counts[i]`` heads in every layer
    (``static``: the router-free model or its lean copy; ``full``: its stored heads per layer)."""
    for (ids, mask), k in zip(batches, counts):
        static.set_active([min(k, n) for n in full])
        static(ids, mask)


def _lean_runtimes(model: GatedModel, static: GatedModel | None) -> tuple[RoutedInference | None, nn.Module | None]:
    """(routed runtime through the lean copy, lean copy of the static slice), or (None, None) where
    the family has no lean copy of this model."""
    if static is None:
        return None, None
    runtime = RoutedInference(model)
    if runtime.lean is None:  # the model has something the executor does not run (lean_unsupported)
        return None, None
    return runtime, static.inference_module().eval()


# The row fields of the batch-1 lean runs (all None where the family has no lean copy).
LEAN_FIELDS = (
    "lean_latency_ms", "lean_dense_latency_ms", "lean_static_latency_ms", "lean_preset_latency_ms", "lean_speedup",
    "lean_efficiency", "lean_plain_speedup", "lean_static_speedup", "lean_static_efficiency", "lean_routing_share",
    "lean_preset_speedup", "lean_preset_efficiency", "lean_decision_share",
)


def _lean_fields(timed: dict[str, float], ideal: float) -> dict[str, float | None]:
    """Row fields of the lean runs (None where they were not timed)."""
    if "lean_routed" not in timed:
        return dict.fromkeys(LEAN_FIELDS)
    speedup = timed["lean_dense"] / timed["lean_routed"]
    static_speedup = timed["lean_dense"] / timed["lean_static"]
    preset_speedup = timed["lean_dense"] / timed["lean_preset"]
    return {
        "lean_latency_ms": timed["lean_routed"], "lean_dense_latency_ms": timed["lean_dense"],
        "lean_static_latency_ms": timed["lean_static"], "lean_preset_latency_ms": timed["lean_preset"],
        "lean_speedup": speedup, "lean_efficiency": speedup / ideal,
        "lean_plain_speedup": timed["dense"] / timed["lean_routed"], "lean_static_speedup": static_speedup,
        "lean_static_efficiency": static_speedup / ideal, "lean_routing_share": speedup / static_speedup,
        "lean_preset_speedup": preset_speedup, "lean_preset_efficiency": preset_speedup / ideal,
        "lean_decision_share": speedup / preset_speedup,
    }


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
        reference: the dense model's lean executor (``dense.inference_module()``), called as ``reference(ids, mask)``.
        batches: (input_ids, attention_mask) pairs of real inputs of one batch size; each batch
            padded to its longest input (lengths may differ between batches).
        budgets: the caller budgets to time (None: a learned router's own budget).
        method: row label.

    Returns:
        Rows with ``latency_ms`` (all batches, one pass), ``dense_latency_ms``, ``speedup``,
        ``ideal_speedup``, ``efficiency``, ``mean_heads`` and the setting; at batch 1 also
        ``static_latency_ms``, ``static_speedup``, ``static_efficiency`` (static speedup /
        FLOP-ideal) and ``routing_share`` (routed speedup / static speedup); None at larger
        batches, whose inputs have different counts that one slice cannot run. At batch 1 with a
        lean copy also ``lean_latency_ms``, ``lean_dense_latency_ms``, ``lean_speedup`` (lean
        dense over lean routed), ``lean_efficiency``, ``lean_plain_speedup`` (the dense reference over
        lean routed), the lean static slice's ``lean_static_*`` / ``lean_routing_share`` and the
        preset run's ``lean_preset_*`` / ``lean_decision_share`` (:data:`LEAN_FIELDS`).
    """
    model.eval()
    reference.eval()
    batch_size = int(batches[0][0].shape[0])
    lengths = [int(ids.shape[1]) for ids, _ in batches]
    static = static_slice(model) if batch_size == 1 else None
    runtime, static_lean = _lean_runtimes(model, static)
    rows = []
    for budget in budgets:
        per_batch = selected_heads(model, batches, budget)
        heads = [k for batch_heads in per_batch for k in batch_heads]
        ideal = flop_ideal(model, batches, per_batch)

        def routed(b: float | None = budget) -> None:
            for ids, mask in batches:
                model(ids, mask, budget=b)

        def dense() -> None:
            for ids, mask in batches:
                reference(ids, mask)

        functions = {"routed": routed, "dense": dense}
        counts = [batch_heads[0] for batch_heads in per_batch]
        if static is not None:
            functions["static"] = functools.partial(_run_sliced, static, static.heads_per_layer, batches, counts)
        if runtime is not None:
            functions.update(_lean_functions(runtime, static_lean, batches, counts, budget, static.heads_per_layer))
        timed = measure_interleaved(functions, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time)
        speedup = timed["dense"] / timed["routed"]
        static_speedup = timed["dense"] / timed["static"] if static is not None else None
        rows.append({
            "method": method, "budget": 1.0 if budget is None else budget, "learned_budget": budget is None,
            "batch_size": batch_size, "seq_len": max(lengths), "mean_seq_len": sum(lengths) / len(lengths),
            "threads": cfg.threads, "allocator": keep_freed_memory(), "inputs": len(heads), "input": "validation",
            "latency_ms": timed["routed"], "dense_latency_ms": timed["dense"], "speedup": speedup,
            "ideal_speedup": ideal, "efficiency": speedup / ideal, "mean_heads": sum(heads) / len(heads),
            "cost": sum(heads) / (len(heads) * model.n_heads),
            "static_latency_ms": timed.get("static"), "static_speedup": static_speedup,
            "static_efficiency": None if static_speedup is None else static_speedup / ideal,
            "routing_share": None if static_speedup is None else speedup / static_speedup,
            **_lean_fields(timed, ideal),
        })
    return rows


def _lean_functions(
    runtime: RoutedInference, static_lean: nn.Module, batches: Batches, counts: list[int], budget: float | None, full: list[int]
) -> dict[str, Any]:
    """The lean runs of one budget: routed, the copy's dense pass, the static slice, and the
    preset run (the same head sets, decided before timing: the heads' cost without the router's)."""
    lean = runtime.lean
    with torch.no_grad():
        decided = [runtime.head_sets(ids, mask, budget=budget) for ids, mask in batches]

    def lean_routed() -> None:
        for ids, mask in batches:
            runtime(ids, mask, budget=budget)

    def lean_dense() -> None:
        for ids, mask in batches:
            lean(ids, mask)

    def lean_preset() -> None:
        for (ids, mask), sets in zip(batches, decided):
            lean(ids, mask, head_sets=sets)

    return {
        "lean_routed": lean_routed, "lean_dense": lean_dense, "lean_preset": lean_preset,
        "lean_static": functools.partial(_run_sliced, static_lean, full, batches, counts),
    }
