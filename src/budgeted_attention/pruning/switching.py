"""Instant budget switching over one weight layout sorted by importance, for every model family.

Because kept sets are nested, the heads kept at any budget are a prefix of every layer in the
sorted layout, so switching budget only changes how many heads each layer slices (views of the
weights, not copies).
"""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.budget import validate_budget
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.pruning.surgery import sort_heads


class SlicedModel(nn.Module):
    """Serve any budget from one sorted copy of the weights.

    Example::

        served = SlicedModel(model, ranking)
        served.set_budget(0.5)      # microseconds: sets per-layer head counts
        logits = served(input_ids)  # runs only the kept heads, without gate code
    """

    def __init__(self, model: GatedModel, ranking: HeadRanking) -> None:
        super().__init__()
        self.model = sort_heads(model, ranking)
        self.ranking = ranking
        self._counts_cache: dict[float, list[int]] = {}
        self.budget = 1.0

    def counts_for(self, budget: float) -> list[int]:
        """Heads per layer for ``budget`` (memoised)."""
        b = validate_budget(budget)
        counts = self._counts_cache.get(b)
        if counts is None:
            counts = self.ranking.heads_per_layer(b)
            self._counts_cache[b] = counts
        return counts

    def set_budget(self, budget: float) -> None:
        """Switch to ``budget``: only per-layer head counts change; no weights are copied."""
        self.model.set_active_heads(self.counts_for(budget))
        self.budget = float(budget)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
    ) -> torch.Tensor:
        """Logits of the active sub-model (hard selection of the current budget).

        ``budget``: soft gates g(b) on top of the active heads, re-indexed to the sorted layout
        (rarely wanted when serving; the hard selection alone is the pruned model).
        """
        return self.model(input_ids, attention_mask, token_type_ids, budget=budget)
