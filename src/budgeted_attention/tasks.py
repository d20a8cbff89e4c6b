"""What a model is trained and judged on: sequence classification or causal language modelling.

A :class:`Task` gives the training stages, the importance scores and the pipeline the three
things that differ between the two: the loss on a batch, the distillation loss between a
student's and a teacher's outputs, and the evaluation metrics of a split. Everything else (gates,
budgets, ranking, surgery, benchmarking) is the same code for both.

* :data:`CLASSIFY`: logits (batch, n_classes); loss = cross-entropy on the labels; metric
  ``accuracy`` in [0, 1] (higher is better).
* :data:`LANGUAGE_MODEL`: logits (batch, seq, vocab); loss = next-token cross-entropy in nats over
  real target tokens; metrics ``loss`` (nats per token, lower is better) and ``perplexity``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.data.dataset import Split


def distill_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened distributions over the last dim, scaled by T^2.

    Args:
        student, teacher: logits of the same shape (..., n_outputs).
        weights: optional 0/1 tensor of the leading shape (...): positions that count.

    Returns:
        Mean KL over the counted positions (scalar).
    """
    t = temperature
    per_position = F.kl_div(
        F.log_softmax(student / t, dim=-1), F.log_softmax(teacher / t, dim=-1), log_target=True, reduction="none"
    ).sum(dim=-1)
    if weights is None:
        return per_position.mean() * (t * t)
    weights = weights.to(per_position.dtype)
    return (per_position * weights).sum() / weights.sum().clamp_min(1.0) * (t * t)


def _lm_targets(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T - 1) next-token targets, -100 (ignored) unless both the predicting position t and
    the target t + 1 are real tokens (left or right padding alike)."""
    real = (mask[:, 1:] != 0) & (mask[:, :-1] != 0)
    return ids[:, 1:].masked_fill(~real, -100)


@dataclass(frozen=True)
class Task:
    """Classification (``kind`` ``classify``) or language modelling (``lm``).

    Attributes:
        kind: ``classify`` or ``lm``.
        metric: the primary metric key of result rows (``accuracy`` or ``loss``).
        higher_is_better: direction of ``metric``.
    """

    kind: str
    metric: str
    higher_is_better: bool

    def loss(self, logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Training loss of one batch (mean)."""
        if self.kind == "classify":
            return F.cross_entropy(logits, labels)
        targets = _lm_targets(ids, mask)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)

    def summed_loss(self, logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(summed loss, number of terms) of one batch: examples, or real target tokens."""
        if self.kind == "classify":
            return F.cross_entropy(logits, labels, reduction="sum"), len(labels)
        targets = _lm_targets(ids, mask)
        total = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum")
        return total, int((targets != -100).sum())

    def distill(self, student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
        """Distillation loss: per example (classification) or per real token (language model)."""
        if self.kind == "classify":
            return distill_kl(student, teacher, temperature)
        return distill_kl(student, teacher, temperature, weights=mask)

    @torch.no_grad()
    def difficulty(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-input difficulty, (batch,) nats: the entropy of the predicted distribution
        (classification), or its mean over real tokens (language model). A per-input router
        gives hard inputs more heads by it."""
        log_p = F.log_softmax(logits.float(), dim=-1)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (batch,) or (batch, seq)
        if self.kind == "classify":
            return entropy
        weights = mask.to(entropy.dtype)
        return (entropy * weights).sum(-1) / weights.sum(-1).clamp_min(1.0)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512, **gating: Any) -> dict[str, float]:
        """Metrics of ``model`` on ``split`` under ``gating`` (``budget=`` / ``gates=`` / nothing).

        Classification: ``{"accuracy"}``. Language model: ``{"loss", "perplexity"}``, the loss in
        nats per real target token over the whole split (token-weighted, not a mean of batches).
        """
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        batches = (tuple(t.to(device, non_blocking=True) for t in batch) for batch in split.batches(batch_size))
        try:
            if self.kind == "classify":
                correct = sum(int((model(ids, mask, **gating).argmax(dim=-1) == labels).sum()) for ids, mask, labels in batches)
                return {"accuracy": correct / len(split)}
            total, count = 0.0, 0
            for ids, mask, labels in batches:
                batch_total, batch_count = self.summed_loss(model(ids, mask, **gating), ids, mask, labels)
                total, count = total + float(batch_total), count + batch_count
            loss = total / max(count, 1)
            return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
        finally:
            model.train(was_training)

    def score(self, metrics: dict[str, float]) -> float:
        """The primary metric as a higher-is-better number (early stopping, picks)."""
        value = metrics[self.metric]
        return value if self.higher_is_better else -value


CLASSIFY = Task("classify", "accuracy", True)
LANGUAGE_MODEL = Task("lm", "loss", False)
TASKS = {"classify": CLASSIFY, "lm": LANGUAGE_MODEL}
