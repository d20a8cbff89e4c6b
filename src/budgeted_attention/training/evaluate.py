"""Accuracy of a model on a split, under a budget, explicit gates, or no gating."""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.data.dataset import Split


@torch.no_grad()
def predict(
    model: nn.Module,
    split: Split,
    batch_size: int = 512,
    *,
    budget: float | None = None,
    gates: torch.Tensor | None = None,
) -> torch.Tensor:
    """Predicted class per example, shape (N,)."""
    was_training = model.training
    model.eval()
    kwargs = {}
    if budget is not None:
        kwargs["budget"] = budget
    if gates is not None:
        kwargs["gates"] = gates
    predictions = [
        model(ids, mask, **kwargs).argmax(dim=-1) for ids, mask, _ in split.batches(batch_size)
    ]
    model.train(was_training)
    return torch.cat(predictions)


def evaluate_accuracy(
    model: nn.Module,
    split: Split,
    batch_size: int = 512,
    *,
    budget: float | None = None,
    gates: torch.Tensor | None = None,
) -> float:
    """Fraction of correct predictions in [0, 1]."""
    predictions = predict(model, split, batch_size, budget=budget, gates=gates)
    return float((predictions == split.labels).float().mean())
