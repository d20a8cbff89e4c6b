"""Tokenised splits held as tensors, and mini-batch iteration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class Split:
    """One split: ``input_ids`` (N, T) long, ``attention_mask`` (N, T) long, ``labels`` (N,) long."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(
        self, batch_size: int, *, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield (input_ids, attention_mask, labels) mini-batches; the last one may be smaller."""
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            yield self.input_ids[index], self.attention_mask[index], self.labels[index]


@dataclass
class TensorSplits:
    """Train/validation/test splits plus what the model needs to know about them."""

    train: Split
    val: Split
    test: Split
    vocab_size: int
    n_classes: int
    pad_id: int
    class_names: list[str]

    @property
    def seq_len(self) -> int:
        return int(self.train.input_ids.shape[1])
