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
  the chosen expert in bits, minus the same plug-in estimate with the tokens shuffled (its bias),
  and as a fraction of the expert's entropy; per layer, averaged over layers: how much the
  choice depends on the input;
* ``hard_loss``: the split's loss under hard routing (each token computes its chosen expert only),
  and ``attention_flops_fraction``: the attention-core FLOPs that hard pass computed over those of
  causal softmax attention on the same sequences (2 n hd T (T + 1) per layer: the CPU's causal
  kernel skips the masked half, so the reference is not charged the full square).
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


def causal_attention_flops(n_heads: int, head_dim: int, seq: int) -> int:
    """FLOPs of causal softmax attention's core for one sequence and layer: every query t scores
    and mixes t + 1 keys (2 hd each): 2 n hd T (T + 1). The CPU's causal SDPA kernel skips the
    masked half, so this, not the full T x T square, is what the reference computes."""
    return 2 * n_heads * head_dim * seq * (seq + 1)


def input_dependence(tokens: torch.Tensor, choices: torch.Tensor, seed: int = 0) -> tuple[float, float]:
    """(I(token; expert) minus the same estimate with the tokens shuffled, that over H(expert)).

    The plug-in estimate is biased upwards with many token types; the shuffled baseline (tokens
    made independent of the choices, same marginals) estimates that bias.
    """
    shuffled = tokens[torch.randperm(len(tokens), generator=torch.Generator().manual_seed(seed))]
    excess = mutual_information_bits(tokens, choices) - mutual_information_bits(shuffled, choices)
    entropy = _entropy_bits(torch.bincount(choices, minlength=len(EXPERTS)).float())
    return excess, (excess / entropy if entropy > 1e-12 else 0.0)


@torch.no_grad()
def routing_statistics(model: nn.Module, split: Split, batch_size: int = 64) -> dict[str, Any]:
    """Routing figures of ``model`` (with ``meta_layers()``) on ``split``; see the module docstring.

    Layers with no active head (pruned away) route nothing and are left out.
    """
    layers = [layer for layer in model.meta_layers() if layer.active_heads > 0]
    if not layers:
        raise ValueError("routing statistics need a model with Meta-Attention layers")
    was_training = model.training
    model.eval()
    costs = torch.tensor(layers[0].cfg.costs)
    prior = layers[0].controller.prior
    prior_choice = int(torch.argmax(prior / prior.sum()))
    weights: list[list[torch.Tensor]] = [[] for _ in layers]
    tokens = []
    try:
        for layer in layers:
            layer.routing, layer.record, layer.records = "soft", True, []
        for ids, mask, _ in split.batches(batch_size):
            model(ids, mask)
            real = mask.bool()
            tokens.append(ids[real])
            for index, layer in enumerate(layers):
                # This batch's record: (B, T, 3) weights; keep the real positions, row-major like ``tokens``.
                weights[index].append(layer.records.pop()[0][real])
        stats = _soft_statistics([torch.cat(w) for w in weights], torch.cat(tokens), costs, prior_choice)
        stats.update(_hard_pass(model, layers, split, batch_size))
    finally:
        for layer in layers:
            layer.record, layer.records = False, []
        model.train(was_training)
    return stats


def _soft_statistics(alphas: list[torch.Tensor], tokens: torch.Tensor, costs: torch.Tensor, prior_choice: int) -> dict[str, Any]:
    """Pooled over layers, except input dependence: the mean over layers of the per-layer figure
    (layers with opposite token-to-expert maps would cancel in a pooled table)."""
    alpha = torch.cat(alphas)  # (layers * N, 3)
    choice = alpha.argmax(-1)
    entropy = -(alpha.clamp_min(1e-12).log() * alpha).sum(-1) / math.log(len(EXPERTS))
    counts = torch.bincount(choice, minlength=len(EXPERTS)).float()
    dependence = [input_dependence(tokens, a.argmax(-1)) for a in alphas]
    return {
        "projected_cost": float((alpha * costs).sum(-1).mean()),
        "hard_projected_cost": float(costs[choice].mean()),
        "entropy_pct": 100 * float(entropy.mean()),
        "expert_fractions": {name: float(c / counts.sum()) for name, c in zip(EXPERTS, counts)},
        "prior_agreement": float((choice == prior_choice).float().mean()),
        "mi_token_bits": sum(bits for bits, _ in dependence) / len(dependence),
        "mi_token_fraction": sum(fraction for _, fraction in dependence) / len(dependence),
    }


def _hard_pass(model: nn.Module, layers: list[nn.Module], split: Split, batch_size: int) -> dict[str, Any]:
    """Loss under hard routing, and its attention-core FLOPs over causal softmax attention's on
    the same batches (their trimmed widths)."""
    for layer in layers:
        layer.reset_flops()
    model.set_routing("hard")
    try:
        hard_loss = LANGUAGE_MODEL.evaluate(model, split, batch_size)["loss"]
    finally:
        model.set_routing("soft")
    full = sum(
        len(ids) * sum(causal_attention_flops(layer.active_heads, layer.head_dim, ids.shape[1]) for layer in layers)
        for ids, _, _ in split.batches(batch_size)
    )
    computed = sum(sum(layer.flops.values()) for layer in layers)
    return {
        "hard_loss": hard_loss,
        "attention_flops_fraction": computed / full,
        "hard_flops_by_expert": {name: sum(layer.flops[name] for layer in layers) / full for name in EXPERTS},
    }
