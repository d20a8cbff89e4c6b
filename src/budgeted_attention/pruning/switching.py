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
        self.lean: nn.Module | None = self._lean_copy() if lean else None
        self._lean_counts = self._active_counts()
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

    def _current_lean(self) -> nn.Module | None:
        """The lean copy, in step with the model, when it may serve; None when the module tree runs.

        The wrapped model's mode decides (a new SlicedModel is in training mode whatever it wraps);
        so do autograd and a router attached since. A copy whose model has since changed (surgery,
        training steps, ``load_state_dict``, a replaced, moved or converted parameter) is rebuilt
        (or dropped, when the model no longer has one), and its active prefixes follow the model's,
        however they were set (``set_budget`` or ``self.model.set_active``): microseconds per call.
        """
        if self.lean is None or self.model.training or self.lean.training or torch.is_grad_enabled() or self.model.router is not None:
            return None
        counts = self._active_counts()
        if not self.lean.is_current(self.model):
            self.lean = self._lean_copy()
            if self.lean is None:
                return None
            self._lean_counts = counts  # a new copy runs the model's active prefixes
        if counts != self._lean_counts:
            self.lean.set_active(*counts)
            self._lean_counts = counts
        return self.lean

    def _lean_copy(self) -> nn.Module | None:
        """The family's lean copy of the sorted model, or None where the family has none."""
        copy = self.model.inference_module()
        return None if copy is self.model else copy

    def _active_counts(self) -> tuple[list[int], list[int] | None]:
        """(heads per layer, FFN neurons per layer or None) the model runs now."""
        return self.model.active_heads(), self.model.active_ffn_widths()
