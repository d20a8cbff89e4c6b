"""Accuracy of a classifier on a split, under a budget, explicit gates, or no gating.

A thin public helper over :data:`budgeted_attention.tasks.CLASSIFY`, the one evaluation path the
pipeline uses (language models: :data:`budgeted_attention.tasks.LANGUAGE_MODEL`).
"""

from __future__ import annotations

import torch
from torch import nn

from budgeted_attention.data.dataset import Split
from budgeted_attention.tasks import CLASSIFY


def evaluate_accuracy(
    model: nn.Module,
    split: Split,
    batch_size: int = 512,
    *,
    budget: float | None = None,
    gates: torch.Tensor | None = None,
) -> float:
    """Fraction of correct predictions in [0, 1]."""
    gating = {key: value for key, value in (("budget", budget), ("gates", gates)) if value is not None}
    return CLASSIFY.evaluate(model, split, batch_size, **gating)["accuracy"]
