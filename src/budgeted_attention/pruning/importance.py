"""Post-hoc head importance of a dense model (the paper's zero-shot structural baseline).

* ``unit_gradient_importance``: Michel et al. (2019), "Are Sixteen Heads Really Better than
  One?": attach masks of ones to the heads (and FFN groups), accumulate |dLoss/dmask| over the
  validation split (each batch's contribution weighted by its share of tokens), and normalise
  per layer (L2) so layers are comparable.
* ``leave_one_out_importance``: the validation loss increase when one head is masked out.

Every score takes the task's loss (:mod:`budgeted_attention.tasks`: cross-entropy on labels, or
next-token loss of a language model); higher = more important, for :meth:`Ranking.from_scores`.

* ``ffn_neuron_importance``: DynaBERT's neuron reordering score, |sum over tokens of
  activation x dLoss/dactivation| per FFN neuron (the gradient of a per-neuron mask),
  accumulated over the *training* split, so that sorting neurons by it puts the important ones
  in the first groups (the prefix every budget keeps).
"""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.tasks import CLASSIFY, Task


@torch.no_grad()
def leave_one_out_importance(
    model: nn.Module, split: Split, n_layers: int, n_heads: int, batch_size: int = 256, task: Task = CLASSIFY
) -> torch.Tensor:
    """Validation loss with head (l, h) masked minus the loss with all heads, shape (n_layers, n_heads)."""
    was_training = model.training
    model.eval()

    def loss_with(mask: torch.Tensor) -> float:
        total, count = 0.0, 0
        for ids, attn, labels in split.batches(batch_size):
            batch_total, batch_count = task.summed_loss(model(ids, attn, gates=mask), ids, attn, labels)
            total, count = total + float(batch_total), count + batch_count
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


def unit_gradient_importance(model: nn.Module, split: Split, batch_size: int = 128, normalize: bool = True, task: Task = CLASSIFY) -> UnitGates:
    """|dL/dmask| of every head and FFN group (when the model gates them), summed over ``split``.

    Every layer's scores (heads and groups together, so both stay on one scale for the global
    ranking) are normalised to unit L2 norm, as Michel et al. normalise heads per layer; shapes
    (n_layers, n_heads) and (n_layers, n_groups).
    """
    was_training = model.training
    model.eval()
    masks = UnitGates(
        torch.ones(model.n_layers, model.n_heads, requires_grad=True),
        torch.ones(model.n_layers, model.n_groups, requires_grad=True) if model.has_ffn_units else None,
    )
    parts = masks.parts()
    scores = [torch.zeros_like(p) for p in parts]
    total_tokens = float(split.attention_mask.sum())
    for ids, attn, labels in split.batches(batch_size):
        loss = task.loss(model(ids, attn, gates=masks), ids, attn, labels)
        grads = torch.autograd.grad(loss, parts)
        for score, grad in zip(scores, grads):
            score += grad.abs() * float(attn.sum()) / total_tokens
    model.train(was_training)
    if normalize:
        layer_norm = torch.cat(scores, dim=1).norm(dim=1, keepdim=True).clamp_min(1e-20)
        scores = [s / layer_norm for s in scores]
    return UnitGates(scores[0], scores[1] if len(scores) > 1 else None)


def ffn_neuron_importance(
    model: nn.Module, split: Split, batch_size: int = 128, max_batches: int = 0, task: Task = CLASSIFY,
    *, max_examples: int = 0, seed: int = 0,
) -> list[torch.Tensor]:
    """Per layer, a (width,) importance of each FFN neuron on ``split`` (use the TRAINING split).

    The score is |dL/dm_j| for a mask m_j = 1 multiplying neuron j's activation, i.e.
    |sum over tokens of a_j * dL/da_j|, accumulated per batch (absolute value per batch, as for
    heads). ``max_batches`` > 0 caps the batches read (the score converges quickly);
    ``max_examples`` > 0 reads that many examples drawn without replacement (``seed``) instead of
    the split in order. Only the activations' gradients are computed (no weight gradients).
    """
    was_training = model.training
    model.eval()
    modules = model.ffn_activations()
    scores = [None] * len(modules)
    captured: list[list[torch.Tensor]] = [[] for _ in modules]
    handles = []

    def keep(index: int):
        def hook(_module, _inputs, output):
            captured[index].append(output)

        return hook

    if max_examples and max_examples < len(split):
        chosen = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))[:max_examples].sort().values
        split = Split(split.input_ids[chosen], split.attention_mask[chosen], split.labels[chosen])
    for index, module in enumerate(modules):
        handles.append(module.register_forward_hook(keep(index)))
    try:
        for count, (ids, attn, labels) in enumerate(split.batches(batch_size)):
            if max_batches and count >= max_batches:
                break
            for calls in captured:
                calls.clear()
            loss = task.loss(model(ids, attn), ids, attn, labels)
            if any(len(calls) != 1 for calls in captured):  # one FFN activation per layer and forward, or the scores mean nothing
                counts = [len(calls) for calls in captured]
                raise RuntimeError(f"each FFN activation module must run once per forward pass; calls per layer: {counts}")
            activations = [calls[0] for calls in captured]
            grads = torch.autograd.grad(loss, activations)
            for index, (act, grad) in enumerate(zip(activations, grads)):
                contribution = (act.detach() * grad).flatten(0, -2).sum(dim=0).abs()
                scores[index] = contribution if scores[index] is None else scores[index] + contribution
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [s.detach() for s in scores]


def sort_ffn_by_importance(
    model: nn.Module, split: Split, batch_size: int = 128, max_batches: int = 0, task: Task = CLASSIFY,
    *, max_examples: int = 0, seed: int = 0,
) -> list[list[int]]:
    """Sort every layer's FFN neurons by :func:`ffn_neuron_importance` on ``split`` (most important
    first; function-preserving). Returns the neuron orders applied."""
    scores = ffn_neuron_importance(model, split, batch_size, max_batches, task, max_examples=max_examples, seed=seed)
    orders = [torch.argsort(score, descending=True, stable=True).tolist() for score in scores]
    model.sort_ffn_neurons(orders)
    return orders
