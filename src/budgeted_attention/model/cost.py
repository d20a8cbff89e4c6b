"""FLOP cost model of the encoder, used for per-head costs, C(b) and FLOP-ideal speedups.

One multiply-add counts as 2 FLOPs. Layer norms, softmax, GELU and embedding look-ups are
ignored (they are a few percent and not reduced by head pruning except softmax).

Prunable units: attention heads (projections, scores, weighted sum) and, under
``budget_scope: all``, feed-forward neuron groups (``group_size`` neurons: their rows of the
first linear layer and columns of the second). The classifier is fixed cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.gates import UnitGates


@dataclass(frozen=True)
class CostModel:
    """FLOPs of one forward pass of an :class:`EncoderClassifier` for one sequence of ``seq_len``."""

    config: ModelConfig
    seq_len: int

    def attention_pairs(self) -> int:
        """(query, key) pairs one head scores and mixes: every query with every key, T x T."""
        return self.seq_len * self.seq_len

    def head_flops(self) -> int:
        """FLOPs of one attention head: Q/K/V and output projections, scores and weighted sum."""
        t, d, hd = self.seq_len, self.config.d_model, self.config.head_dim
        projections = 3 * 2 * t * d * hd + 2 * t * hd * d
        return projections + 2 * 2 * self.attention_pairs() * hd  # scores and weighted sum

    def group_flops(self, group_size: int) -> int:
        """FLOPs of ``group_size`` feed-forward neurons (one row of fc1 and one column of fc2 each)."""
        return 2 * 2 * self.seq_len * self.config.d_model * group_size

    def classifier_flops(self) -> int:
        return 2 * self.config.d_model * self.config.n_classes

    def unit_costs(self, group_size: int = 0) -> UnitGates:
        """FLOPs per prunable unit: heads (n_layers, n_heads) and, when ``group_size`` > 0, FFN groups
        (n_layers, d_ff // group_size); every head (and group) has the same shape here."""
        cfg = self.config
        heads = torch.full((cfg.n_layers, cfg.n_heads), float(self.head_flops()), dtype=torch.float64)
        if group_size <= 0:
            return UnitGates(heads, None)
        groups = torch.full((cfg.n_layers, cfg.d_ff // group_size), float(self.group_flops(group_size)), dtype=torch.float64)
        return UnitGates(heads, groups)

    def total_flops(self, heads_per_layer: list[int] | None = None, ffn_widths: list[int] | None = None) -> int:
        """FLOPs of the whole forward pass with ``heads_per_layer`` heads and ``ffn_widths`` FFN
        neurons per layer (defaults: every head, the full ``d_ff``)."""
        heads = [self.config.n_heads] * self.config.n_layers if heads_per_layer is None else heads_per_layer
        widths = [self.config.d_ff] * self.config.n_layers if ffn_widths is None else ffn_widths
        per_neuron = self.group_flops(1)
        return sum(h * self.head_flops() + w * per_neuron for h, w in zip(heads, widths)) + self.classifier_flops()

    def ideal_speedup(self, heads_per_layer: list[int], ffn_widths: list[int] | None = None) -> float:
        """Dense FLOPs / pruned FLOPs of the whole forward pass: the speed limit of pruning
        (``ffn_widths`` None: the FFN is kept whole, head pruning only)."""
        return self.total_flops() / self.total_flops(heads_per_layer, ffn_widths)


def estimated_cost(gates: UnitGates, costs: UnitGates) -> torch.Tensor:
    """Estimated cost C = sum(cost * gate) / sum(cost) over every gated unit, a scalar in [0, 1].

    Args:
        gates: gate values in [0, 1] of the heads (n_layers, n_heads) and, when gated, FFN groups.
        costs: FLOPs per unit, of the same structure. Under ``budget_scope: heads`` this is the
            paper's attention cost; with FFN groups, the fraction of the prunable forward FLOPs.
    """
    gates_parts, cost_parts = gates.parts(), costs.parts()
    if len(gates_parts) != len(cost_parts):
        raise ValueError("gates and costs must both include (or both omit) the feed-forward groups")
    dtype = gates_parts[0].dtype
    spent = sum((g * c.to(dtype)).sum() for g, c in zip(gates_parts, cost_parts))
    total = sum(float(c.sum()) for c in cost_parts)
    return spent / total
