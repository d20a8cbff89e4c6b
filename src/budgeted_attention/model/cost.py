"""FLOP cost model of the encoder, used for per-head costs, C(b) and FLOP-ideal speedups.

One multiply-add counts as 2 FLOPs. Layer norms, softmax, GELU and embedding look-ups are
ignored (they are a few percent and not reduced by head pruning except softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from budgeted_attention.model.config import ModelConfig


@dataclass(frozen=True)
class CostModel:
    """FLOPs of one forward pass of an :class:`EncoderClassifier` for one sequence of ``seq_len``."""

    config: ModelConfig
    seq_len: int

    def head_flops(self) -> int:
        """FLOPs of one attention head: Q/K/V and output projections, scores and weighted sum."""
        t, d, hd = self.seq_len, self.config.d_model, self.config.head_dim
        projections = 3 * 2 * t * d * hd + 2 * t * hd * d
        scores = 2 * t * t * hd
        weighted_sum = 2 * t * t * hd
        return projections + scores + weighted_sum

    def ffn_flops(self) -> int:
        """FLOPs of one feed-forward block (two linear layers)."""
        t, d, f = self.seq_len, self.config.d_model, self.config.d_ff
        return 2 * 2 * t * d * f

    def classifier_flops(self) -> int:
        return 2 * self.config.d_model * self.config.n_classes

    def head_costs(self) -> torch.Tensor:
        """Per-head cost, shape (n_layers, n_heads); all heads have equal shape here."""
        cfg = self.config
        return torch.full((cfg.n_layers, cfg.n_heads), float(self.head_flops()), dtype=torch.float64)

    def total_flops(self, heads_per_layer: list[int] | None = None) -> int:
        """FLOPs of the whole forward pass with ``heads_per_layer`` heads (default: the config's)."""
        heads = self.config.heads_per_layer if heads_per_layer is None else heads_per_layer
        per_layer_fixed = self.ffn_flops()
        return sum(h * self.head_flops() + per_layer_fixed for h in heads) + self.classifier_flops()

    def ideal_speedup(self, heads_per_layer: list[int]) -> float:
        """Dense FLOPs / pruned FLOPs of the whole forward pass: the speed limit of head pruning."""
        dense = self.total_flops([self.config.n_heads] * self.config.n_layers)
        return dense / self.total_flops(heads_per_layer)


def estimated_cost(gates: torch.Tensor, head_costs: torch.Tensor) -> torch.Tensor:
    """Estimated attention cost C = sum(cost * gate) / sum(cost), a scalar in [0, 1].

    Args:
        gates: (n_layers, n_heads) gate values in [0, 1].
        head_costs: (n_layers, n_heads) FLOPs per head.
    """
    costs = head_costs.to(gates.dtype)
    return (gates * costs).sum() / costs.sum()
