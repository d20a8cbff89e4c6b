"""Post-hoc head importance of a dense model (the paper's zero-shot structural baseline).

* ``gradient_importance``: Michel et al. (2019), "Are Sixteen Heads Really Better than One?":
  attach a head mask of ones, accumulate |dLoss/dmask| over the validation split (each batch's
  contribution weighted by its share of tokens), and normalise per layer (L2) so layers are
  comparable.
* ``leave_one_out_importance``: the validation loss increase when one head is masked out.

Both return (n_layers, n_heads) scores, higher = more important, for
:meth:`HeadRanking.from_scores`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.data.dataset import Split


def gradient_importance(model: nn.Module, split: Split, n_layers: int, n_heads: int, batch_size: int = 128, normalize: bool = True) -> torch.Tensor:
    """|dL/dmask| summed over ``split``, shape (n_layers, n_heads)."""
    was_training = model.training
    model.eval()
    mask = torch.ones(n_layers, n_heads, requires_grad=True)
    total_tokens = float(split.attention_mask.sum())
    scores = torch.zeros(n_layers, n_heads)
    for ids, attn, labels in split.batches(batch_size):
        loss = F.cross_entropy(model(ids, attn, gates=mask), labels)
        (grad,) = torch.autograd.grad(loss, mask)
        scores += grad.abs() * float(attn.sum()) / total_tokens
    model.train(was_training)
    if normalize:
        scores = scores / scores.norm(dim=1, keepdim=True).clamp_min(1e-20)
    return scores


@torch.no_grad()
def leave_one_out_importance(model: nn.Module, split: Split, n_layers: int, n_heads: int, batch_size: int = 256) -> torch.Tensor:
    """Validation loss with head (l, h) masked minus the loss with all heads, shape (n_layers, n_heads)."""
    was_training = model.training
    model.eval()

    def loss_with(mask: torch.Tensor) -> float:
        total, count = 0.0, 0
        for ids, attn, labels in split.batches(batch_size):
            total += float(F.cross_entropy(model(ids, attn, gates=mask), labels, reduction="sum"))
            count += len(labels)
        return total / count

    base = loss_with(torch.ones(n_layers, n_heads))
    scores = torch.zeros(n_layers, n_heads)
    for layer in range(n_layers):
        for head in range(n_heads):
            mask = torch.ones(n_layers, n_heads)
            mask[layer, head] = 0.0
            scores[layer, head] = loss_with(mask) - base
    model.train(was_training)
    return scores
