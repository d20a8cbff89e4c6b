"""The typed result record every method of the pipeline produces (one per method, budget, seed).

A run's results file (:attr:`~budgeted_attention.rundir.RunDir.results_json`) holds
``{"rows": [asdict(row), ...]}``; reporting reads plain dicts, so old run
directories (without the newer fields) still render.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# How a row's ``cost`` was obtained. "kept-heads" rows are physically pruned models (kept heads,
# and kept FFN groups under budget_scope all) and "smaller-dense" rows separately trained smaller
# models (the ladder; cost = their FLOPs over the full model's): both have measurable speed. Soft
# estimates never enter a speed comparison.
# "routed" rows are per-input head routing (BudgetFormer / capped): cost = the mean fraction of
# heads the inputs of the test split ran, each computing its selected heads only.
COST_KINDS = ("dense", "soft-estimate", "kept-heads", "smaller-dense", "routed")
MEASURABLE_KINDS = ("kept-heads", "smaller-dense", "routed")


@dataclass
class ResultRow:
    """One evaluated operating point.

    Attributes:
        method: e.g. ``dense``, ``dense-long``, ``budgeted``, ``budgeted-hard``, ``static``.
        budget: requested budget b in (0, 1].
        seed: training seed.
        accuracy: test accuracy in [0, 1] (final evaluation of the chosen model); None for a
            language model.
        val_accuracy: validation accuracy in [0, 1]: the figure every choice is made on.
        loss / val_loss / perplexity: language models: test and validation next-token loss in
            nats per token, test perplexity exp(loss); ``loss_before_adaptation`` as for accuracy.
        cost: fraction of the budgeted FLOPs used (soft: C(b); hard: kept-unit cost fraction). The
            budgeted FLOPs are the attention heads' (``scope`` heads, the paper) or the heads' and
            the feed-forward blocks' (``scope`` all).
        cost_kind: one of :data:`COST_KINDS`.
        steps: optimiser steps from initialisation (or from the pretrained checkpoint) that
            produced the evaluated weights.
        heads_kept / heads_per_layer: the physical heads of a hard row.
        accuracy_before_adaptation: test accuracy of the same hard mask before the hard stage.
        val_accuracy_before_adaptation: the same on validation.
        ideal_speedup: FLOP-ideal speedup of the kept heads at the benchmark sequence length.
        latency_ms / dense_latency_ms / speedup: measured (single setting, see bench fields).
        reference_speedups: measured speedup against further references (e.g. ``transformers``).
        layer_gates / gates: soft gate values (soft rows).
        ffn_layer_gates: mean FFN group gate per layer (soft rows under ``budget_scope: all``).
        scope: ``heads`` or ``all`` (what the budget covers; ``ladder`` rows: ``all``, whole-model FLOPs).
        ffn_per_layer: FFN neurons per layer of a hard ``all``-scope row.
        flops_fraction: whole-model forward FLOPs of a hard row over the dense model's (at the
            benchmark sequence length).
        variant: a label within the method (``ladder`` entries with a ``name``): rows of one
            method and different variants are aggregated apart, as ``method (variant)``.
        routing: Meta-Attention models: routing statistics on the test split
            (:func:`budgeted_attention.training.routing.routing_statistics`).
        mean_heads: per-input routing rows: mean heads per layer an input ran (test split).
    """

    method: str
    budget: float
    seed: int
    accuracy: float | None
    val_accuracy: float | None
    cost: float
    cost_kind: str
    steps: int
    loss: float | None = None
    val_loss: float | None = None
    perplexity: float | None = None
    loss_before_adaptation: float | None = None
    heads_kept: int | None = None
    heads_per_layer: list[int] | None = None
    accuracy_before_adaptation: float | None = None
    val_accuracy_before_adaptation: float | None = None
    ideal_speedup: float | None = None
    latency_ms: float | None = None
    dense_latency_ms: float | None = None
    speedup: float | None = None
    bench_input: str | None = None
    bench_batch_size: int | None = None
    bench_seq_len: int | None = None
    threads: int | None = None
    reference_speedups: dict[str, float] = field(default_factory=dict)
    layer_gates: list[float] | None = None
    gates: list[list[float]] | None = None
    ffn_layer_gates: list[float] | None = None
    scope: str = "heads"
    ffn_per_layer: list[int] | None = None
    flops_fraction: float | None = None
    routing: dict[str, Any] | None = None
    variant: str | None = None
    mean_heads: float | None = None

    def __post_init__(self) -> None:
        if self.cost_kind not in COST_KINDS:
            raise ValueError(f"cost_kind must be one of {COST_KINDS}, got {self.cost_kind!r}")

    def attach_speed(self, bench_row: dict[str, Any]) -> None:
        """Copy one benchmark row's measured figures onto this (hard) row."""
        if self.cost_kind not in MEASURABLE_KINDS:
            raise ValueError(f"only physically smaller models get measured speed, not {self.method!r} ({self.cost_kind})")
        self.latency_ms = bench_row["latency_ms"]
        self.dense_latency_ms = bench_row["dense_latency_ms"]
        self.speedup = bench_row["speedup"]
        self.ideal_speedup = bench_row["ideal_speedup"]
        self.bench_input = bench_row.get("input", "random")
        self.bench_batch_size = bench_row["batch_size"]
        self.bench_seq_len = bench_row["seq_len"]
        self.threads = bench_row["threads"]
        library = bench_row.get("library")  # the library model's speedup goes under its name (transformers_speedup)
        self.reference_speedups = {
            (library if key == "library_speedup" else key[: -len("_speedup")]): value
            for key, value in bench_row.items()
            if key.endswith("_speedup") and key != "ideal_speedup" and value is not None
            # lean_* and sliced_* figures of earlier releases had another dense reference; <library>_speedup is an alias.
            and not key.startswith(("lean_", "sliced_")) and not (library and key == f"{library}_speedup")
        }

    def to_dict(self) -> dict[str, Any]:
        """Flat dict for the results JSON/CSV; reference speedups become ``<name>_speedup`` keys."""
        data = dataclasses.asdict(self)
        for name, value in data.pop("reference_speedups").items():
            data[f"{name}_speedup"] = value
        return data
