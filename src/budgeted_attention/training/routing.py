"""What a Meta-Attention model's routing does on data, measured rather than projected.

:func:`routing_statistics` runs a split through a model with Meta-Attention layers and reports,
over real tokens of every routed layer:

* ``projected_cost``: mean of sum_i alpha_i c_i (the paper's projected normalised FLOP cost of the
  soft weights alpha), and ``hard_projected_cost``: mean c of the argmax expert;
* ``entropy_pct``: mean routing entropy -sum alpha log alpha as a percentage of log 3;
* ``expert_fractions``: share of tokens whose argmax is each expert;
* ``prior_agreement``: share of tokens routed to the expert the prior alone picks (argmax of the
  prior mean): 1.0 means the routing ignores the input;
* ``mi_token_bits`` / ``mi_token_fraction``: mutual information between the current token id and
  the chosen expert (plug-in estimate from counts), in bits and as a fraction of the expert's
  entropy: how much the choice depends on the input;
* ``hard_loss``: the split's loss under hard routing (each token computes its chosen expert only),
  and ``attention_flops_fraction``: the attention-core FLOPs that hard pass computed over those of
  full softmax attention on the same sequences (the dense kernel computes all T x T scores).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.config import EXPERTS
from budgeted_attention.tasks import LANGUAGE_MODEL


def _entropy_bits(counts: torch.Tensor) -> float:
    p = counts / counts.sum().clamp_min(1)
    p = p[p > 0]
    return float(-(p * p.log2()).sum())


def mutual_information_bits(features: torch.Tensor, choices: torch.Tensor, n_choices: int = len(EXPERTS)) -> float:
    """Plug-in I(F; E) in bits between integer features (N,) and choices (N,) in [0, n_choices)."""
    _, feature_index = torch.unique(features, return_inverse=True)
    joint = torch.zeros(int(feature_index.max()) + 1, n_choices)
    joint.index_put_((feature_index, choices), torch.ones(len(choices)), accumulate=True)
    return _entropy_bits(joint.sum(1)) + _entropy_bits(joint.sum(0)) - _entropy_bits(joint.flatten())


@torch.no_grad()
def routing_statistics(model: nn.Module, split: Split, batch_size: int = 64) -> dict[str, Any]:
    """Routing figures of ``model`` (with ``meta_layers()``) on ``split``; see the module docstring."""
    layers = model.meta_layers()
    if not layers:
        raise ValueError("routing statistics need a model with Meta-Attention layers")
    was_training = model.training
    model.eval()
    costs = torch.tensor(layers[0].cfg.costs)
    prior = layers[0].controller.prior
    prior_choice = int(torch.argmax(prior / prior.sum()))
    weights, tokens = [], []
    try:
        for layer in layers:
            layer.routing, layer.record, layer.records = "soft", True, []
        for ids, mask, _ in split.batches(batch_size):
            model(ids, mask)
            real = mask.bool()
            tokens.append(ids[real])
        for layer in layers:
            # Row-major real positions, in the order of ``tokens`` (no recorded mask: all real).
            weights.append(torch.cat([w.reshape(-1, len(EXPERTS)) if k is None else w[k] for w, k in layer.records]))
    finally:
        for layer in layers:
            layer.record, layer.records = False, []
    token_ids = torch.cat(tokens)
    alpha = torch.cat(weights)  # (layers * N, 3)
    choice = alpha.argmax(-1)
    entropy = -(alpha.clamp_min(1e-12).log() * alpha).sum(-1) / math.log(len(EXPERTS))
    counts = torch.bincount(choice, minlength=len(EXPERTS)).float()
    mi = mutual_information_bits(token_ids.repeat(len(layers)), choice)
    stats = {
        "projected_cost": float((alpha * costs).sum(-1).mean()),
        "hard_projected_cost": float(costs[choice].mean()),
        "entropy_pct": 100 * float(entropy.mean()),
        "expert_fractions": {name: float(c / counts.sum()) for name, c in zip(EXPERTS, counts)},
        "prior_agreement": float((choice == prior_choice).float().mean()),
        "mi_token_bits": mi,
        "mi_token_fraction": mi / max(_entropy_bits(counts), 1e-12),
    }
    stats.update(_hard_pass(model, layers, split, batch_size))
    model.train(was_training)
    return stats


def _hard_pass(model: nn.Module, layers: list[nn.Module], split: Split, batch_size: int) -> dict[str, float]:
    """Loss under hard routing and its attention-core FLOPs over full attention's."""
    for layer in layers:
        layer.reset_flops()
    model.set_routing("hard")
    try:
        hard_loss = LANGUAGE_MODEL.evaluate(model, split, batch_size)["loss"]
    finally:
        model.set_routing("soft")
    computed = sum(sum(layer.flops.values()) for layer in layers)
    seq = split.input_ids.shape[1]
    full = sum(4 * layer.active_heads * layer.head_dim * seq * seq for layer in layers) * len(split)
    return {
        "hard_loss": hard_loss,
        "attention_flops_fraction": computed / full,
        "hard_flops_by_expert": {name: sum(layer.flops[name] for layer in layers) / full for name in EXPERTS},
    }
