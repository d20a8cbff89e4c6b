"""Per-input head routing through a lean inference copy: the router decides, the copy computes.

A routed model (:meth:`~budgeted_attention.model.family.GatedModel.attach_router`) decides each
input's heads from its pooled token embeddings before the first layer, then runs only those
heads. Through the module tree, one input's pass pays the same per-call framework cost whether a
layer runs one head or all of them, so on a small model at batch 1 that fixed cost eats much of
what the removed heads saved. :class:`RoutedInference` keeps the decision with the model and runs
the chosen head sets in the family's lean copy (:meth:`GatedModel.inference_module` with
``routed=True``: one flat loop of the same kernels, each set's weight rows gathered once and
cached). Batches of more than one input, autograd and training mode run the module tree, which
groups a batch's inputs by head set.
"""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.lean import LeanFollower


class RoutedInference(nn.Module):
    """Serve a routed model: ``(input_ids, attention_mask, token_type_ids, budget=) -> logits``.

    Equal to ``model(ids, mask, token_type_ids, budget=budget)`` up to float rounding. One input
    in eval mode without autograd runs through the lean copy (kept in step with the model by
    :class:`~budgeted_attention.model.lean.LeanFollower`); anything else through ``model``.

    Example::

        runtime = RoutedInference(routed_model.eval())
        with torch.no_grad():
            logits = runtime(ids, mask, budget=0.5)   # a capped router; None for a learned one
    """

    def __init__(self, model: GatedModel) -> None:
        super().__init__()
        if model.router is None:
            raise ValueError("RoutedInference needs a model with a per-input head router (attach_router)")
        self.model = model
        self._lean = LeanFollower(model, routed=True)

    @property
    def lean(self) -> nn.Module | None:
        """The lean copy running one input's head sets (None: the module tree serves; ``model.lean_unsupported()`` says why)."""
        return self._lean.copy

    def current_lean(self) -> nn.Module | None:
        """The lean copy when it may serve now, in step with the model; None when the module tree
        runs (training mode, autograd, a router in training mode, no lean copy)."""
        if self.model.router is None or self.model.router.training:
            return None
        return self._lean.current()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
    ) -> torch.Tensor:
        """(batch, seq) ids (optional 0/1 mask, segment ids) -> (batch, n_classes) logits at
        ``budget`` (a capped router's caller budget; None for a learned router)."""
        lean = self.current_lean() if input_ids.shape[0] == 1 else None
        if lean is None:
            return self.model(input_ids, attention_mask, token_type_ids, budget=budget)
        return lean(input_ids, attention_mask, token_type_ids, head_sets=self.head_sets(input_ids, attention_mask, budget=budget))

    def head_sets(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, budget: float | None = None
    ) -> list[tuple[int, ...]] | None:
        """The router's decision for one input as the lean copy runs it: per layer, the stored
        positions (ascending) of the heads it selected; None for every head (a capped router at
        b = 1). ``lean(ids, mask, head_sets=runtime.head_sets(ids, mask, budget=b))`` is this
        runtime's forward pass; deciding ahead and running later separates the router's cost from
        the heads' (the routed benchmark's preset run).

        Args:
            input_ids: (1, seq) token ids of one input.
            attention_mask: optional (1, seq) 0/1 mask.
            budget: a capped router's caller budget; None for a learned router.

        Raises:
            ValueError: more than one input, or the router in training mode (it then gives soft
                gates, not head sets).
        """
        if input_ids.shape[0] != 1:
            raise ValueError(f"head_sets decides for one input, got a batch of {input_ids.shape[0]}")
        if self.model.router.training:
            raise ValueError("head sets are decided by a router in eval mode (call .eval() first)")
        padded = attention_mask is not None and not bool(attention_mask.all())
        selections = self.model.layer_selections(input_ids, attention_mask if padded else None, budget)
        if selections[0].heads is None:  # a capped router at b = 1: the dense model
            return None
        return [selection.heads for selection in selections]
