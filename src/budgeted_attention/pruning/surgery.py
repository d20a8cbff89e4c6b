"""Structural surgery for every model family: a budget becomes a physically smaller model, or a
sorted, sliceable one.

* :func:`prune_to_budget` copies the model keeping, per layer, the ranking's kept heads for
  the budget (layers may keep different numbers of heads, or none when the ranking allows it).
* :func:`sort_heads` copies the model with every layer's heads permuted into rank order, so
  that the kept heads of *every* budget are a prefix of each layer (see
  :class:`budgeted_attention.pruning.switching.SlicedModel`).

Both record the original head ids, so the copies' budget gates keep their meaning.
"""

from __future__ import annotations

from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import HeadRanking


def check_ranking(model: GatedModel, ranking: HeadRanking) -> None:
    """The ranking must cover the model's full head grid, and the model must hold every head."""
    if (ranking.n_layers, ranking.n_heads) != (model.n_layers, model.n_heads):
        raise ValueError(
            f"ranking is for {ranking.n_layers}x{ranking.n_heads} heads, model has {model.n_layers}x{model.n_heads}"
        )
    if model.is_pruned:
        raise ValueError("model is already pruned; prune from the full gated model")


def keep_heads(model: GatedModel, kept: list[list[int]]) -> GatedModel:
    """A copy of ``model`` with only ``kept[l]`` (original head indices, in that order) in layer l."""
    return model.pruned_copy(kept)


def prune_to_budget(model: GatedModel, ranking: HeadRanking, budget: float) -> GatedModel:
    """The physically smaller model for ``budget``: same logits as the hard-masked model."""
    check_ranking(model, ranking)
    return model.pruned_copy(ranking.kept_heads(budget))


def sort_heads(model: GatedModel, ranking: HeadRanking) -> GatedModel:
    """A copy with each layer's heads permuted into rank order (function-preserving at any budget)."""
    check_ranking(model, ranking)
    return model.pruned_copy(ranking.layer_orders())
