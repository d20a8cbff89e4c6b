"""Structural surgery for every model family: a budget becomes a physically smaller model, or a
sorted, sliceable one.

* :func:`prune_to_budget` copies the model keeping, per layer, the ranking's kept heads (and,
  under ``budget_scope: all``, FFN neuron groups) for the budget (layers may keep different
  numbers of units, or none when the ranking allows it).
* :func:`sort_heads` copies the model with every layer's heads permuted into rank order, so
  that the kept heads of *every* budget are a prefix of each layer (see
  :class:`budgeted_attention.pruning.switching.SlicedModel`).

Both record the original head ids, so the copies' budget gates keep their meaning.
"""

from __future__ import annotations

from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import KeptUnits, Ranking


def check_ranking(model: GatedModel, ranking: Ranking) -> None:
    """The ranking must cover the model's full unit grid (a heads-only ranking prunes heads only,
    the FFN kept whole), and the model must hold every unit."""
    if (ranking.n_layers, ranking.n_heads) != (model.n_layers, model.n_heads):
        raise ValueError(
            f"ranking is for {ranking.n_layers}x{ranking.n_heads} heads, model has {model.n_layers}x{model.n_heads}"
        )
    if ranking.n_groups and ranking.n_groups != model.n_groups:
        raise ValueError(
            f"ranking is for {ranking.n_groups} FFN groups per layer, model has {model.n_groups}"
            + ("" if model.has_ffn_units else " (its feed-forward blocks are not gated)")
        )
    if model.is_pruned:
        raise ValueError("model is already pruned; prune from the full gated model")


def keep_units(model: GatedModel, kept: KeptUnits) -> GatedModel:
    """A copy of ``model`` with only the kept heads and FFN groups (original indices, in that order)."""
    return model.pruned_copy(kept.heads, kept.groups)


def keep_heads(model: GatedModel, kept: list[list[int]]) -> GatedModel:
    """A copy of ``model`` with only ``kept[l]`` (original head indices, in that order) in layer l."""
    return model.pruned_copy(kept)


def prune_to_budget(model: GatedModel, ranking: Ranking, budget: float) -> GatedModel:
    """The physically smaller model for ``budget``: same logits as the hard-masked model."""
    check_ranking(model, ranking)
    return keep_units(model, ranking.kept(budget))


def sort_heads(model: GatedModel, ranking: Ranking) -> GatedModel:
    """A copy with each layer's heads (and FFN groups) permuted into rank order
    (function-preserving at any budget)."""
    check_ranking(model, ranking)
    return keep_units(model, ranking.layer_orders())
