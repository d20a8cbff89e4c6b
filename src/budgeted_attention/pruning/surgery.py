"""Structural surgery: turn a budget into a physically smaller model, or a sorted sliceable one.

* :func:`prune_to_budget` copies the model keeping, per layer, the ranking's kept heads for
  the budget (Q/K/V rows and output-projection rows of the kept heads; layers may keep
  different numbers of heads, or none when the ranking allows it).
* :func:`sort_heads` copies the model with every layer's heads permuted into rank order, so
  that the kept heads of *every* budget are a prefix of each layer (see
  :class:`budgeted_attention.pruning.switching.SlicedModel`).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import HeadRanking


def _check_ranking(model: EncoderClassifier, ranking: HeadRanking) -> None:
    cfg = model.config
    if cfg.is_pruned:
        raise ValueError("model is already pruned; prune from the full gated model")
    if (ranking.n_layers, ranking.n_heads) != (cfg.n_layers, cfg.n_heads):
        raise ValueError(
            f"ranking is for {ranking.n_layers}x{ranking.n_heads} heads, model has {cfg.n_layers}x{cfg.n_heads}"
        )


@torch.no_grad()
def keep_heads(model: EncoderClassifier, kept: list[list[int]]) -> EncoderClassifier:
    """A copy of ``model`` with only ``kept[l]`` (head indices, in that order) in layer l.

    The copy's config records the heads per layer; its budget gates are kept as they were for
    reference but a pruned model is meant to run without gates.
    """
    pruned = copy.deepcopy(model)
    for block, heads in zip(pruned.blocks, kept):
        block.attn.keep_heads(heads)
    pruned.config = dataclasses.replace(model.config, heads_per_layer=[len(h) for h in kept])
    return pruned.eval()


def prune_to_budget(model: EncoderClassifier, ranking: HeadRanking, budget: float) -> EncoderClassifier:
    """The physically smaller model for ``budget``: same logits as the hard-masked model."""
    _check_ranking(model, ranking)
    return keep_heads(model, ranking.kept_heads(budget))


@torch.no_grad()
def sort_heads(model: EncoderClassifier, ranking: HeadRanking) -> EncoderClassifier:
    """A copy with each layer's heads (and their gates) permuted into rank order.

    Function-preserving: with gates permuted alongside, logits are unchanged for any budget.
    """
    _check_ranking(model, ranking)
    orders = ranking.layer_orders()
    sorted_model = keep_heads(model, orders)
    index = torch.tensor(orders, dtype=torch.long)  # (n_layers, n_heads)
    sorted_model.gates.bias.copy_(model.gates.bias.gather(1, index))
    sorted_model.gates.slope_raw.copy_(model.gates.slope_raw.gather(1, index))
    # Every head is still present: the config is the unpruned one.
    sorted_model.config = dataclasses.replace(model.config)
    return sorted_model


def sorted_ranking(ranking: HeadRanking) -> HeadRanking:
    """The ranking expressed in the sorted layout (head index = position in its layer's order)."""
    position = {}
    for layer, heads in enumerate(ranking.layer_orders()):
        for rank, head in enumerate(heads):
            position[(layer, head)] = rank
    order = tuple((layer, position[(layer, head)]) for layer, head in ranking.order)
    return HeadRanking(order, ranking.n_layers, ranking.n_heads, ranking.min_one_per_layer)
