"""Instant budget switching over one weight layout sorted by importance, for every model family.

Because kept sets are nested, the heads kept at any budget are a prefix of every layer in the
sorted layout, so switching budget only changes how many heads (and, under ``budget_scope:
all``, FFN neuron groups) each layer slices (views of the weights, not copies).
"""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.budget import validate_budget
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.lean import LeanFollower
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import sort_heads


class SlicedModel(nn.Module):
    """Serve any budget from one sorted copy of the weights.

    Example::

        served = SlicedModel(model, ranking)
        served.set_budget(0.5)      # microseconds: sets per-layer head counts
        logits = served(input_ids)  # runs only the kept heads, without gate code
    """

    def __init__(self, model: GatedModel, ranking: Ranking, *, lean: bool = True) -> None:
        """``lean``: serve hard selections through the family's lean inference copy of the sorted
        layout (:meth:`GatedModel.inference_module`, e.g. BERT's CompactBert), switched along with
        the module tree; soft gates, training and autograd always run the module tree."""
        super().__init__()
        self.model = sort_heads(model, ranking)
        self._lean = LeanFollower(self.model) if lean else None
        self.ranking = ranking
        self._counts_cache: dict[float, tuple[list[int], list[int] | None]] = {}
        self.budget = 1.0

    def counts_for(self, budget: float) -> tuple[list[int], list[int] | None]:
        """(heads per layer, FFN groups per layer or None) for ``budget`` (memoised)."""
        b = validate_budget(budget)
        counts = self._counts_cache.get(b)
        if counts is None:
            kept = self.ranking.kept(b)
            counts = (kept.heads_per_layer, kept.groups_per_layer)
            self._counts_cache[b] = counts
        return counts

    def set_budget(self, budget: float) -> None:
        """Switch to ``budget``: only per-layer head (and FFN group) counts change; no weights are copied."""
        heads, groups = self.counts_for(budget)
        self.model.set_active(heads, groups)
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
        lean = None if budget is not None else self._current_lean()
        if lean is not None:
            return lean(input_ids, attention_mask, token_type_ids)
        return self.model(input_ids, attention_mask, token_type_ids, budget=budget)

    @property
    def lean(self) -> nn.Module | None:
        """The lean copy serving hard selections (None: the module tree serves; ``model.lean_unsupported()`` says why)."""
        return None if self._lean is None else self._lean.copy

    def _current_lean(self) -> nn.Module | None:
        """The lean copy when it may serve this call (see :class:`LeanFollower`): hard selections
        only, and never with a router attached since (a routed model picks heads per input)."""
        if self._lean is None or self.model.router is not None:
            return None
        return self._lean.current()
