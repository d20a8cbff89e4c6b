"""Tokenised splits held as tensors, mini-batch iteration, and the sealed test split."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


@dataclass
class Split:
    """One split: ``input_ids`` (N, T) long, ``attention_mask`` (N, T) long, ``labels`` (N,) long."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str) -> Split:
        """This split with its tensors on ``device`` (the same object when they already are)."""
        if self.input_ids.device == torch.device(device):
            return self
        return type(self)(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))

    def batches(
        self, batch_size: int, *, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield (input_ids, attention_mask, labels) mini-batches; the last one may be smaller.

        Right padding beyond a batch's longest example is cut off: the split is padded to its
        longest example, and attending over all-padding columns costs time without changing any
        output (masked keys, mask-aware pooling, absolute positions from 0).
        """
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        right_padded = self._right_padded()
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            ids, mask = self.input_ids[index], self.attention_mask[index]
            if right_padded:
                width = max(1, int(mask.sum(dim=1).max()))
                if width < ids.shape[1]:
                    ids, mask = ids[:, :width], mask[:, :width]
            yield ids, mask, self.labels[index]

    def _right_padded(self) -> bool:
        """True when every row's real tokens come first (mask non-increasing along the sequence)."""
        cached = getattr(self, "_right_padded_cache", None)
        if cached is None:
            mask = self.attention_mask
            cached = bool((mask[:, 1:] <= mask[:, :-1]).all()) if mask.shape[1] > 1 else True
            self._right_padded_cache = cached
        return cached

    def lengths(self) -> list[int]:
        """Real (unpadded) token count of every example."""
        return [int(n) for n in self.attention_mask.sum(dim=1)]


class TestSplitSealedError(RuntimeError):
    """The test split was read outside a final evaluation (a choice would have seen test data)."""

    __test__ = False  # a library error, not a pytest test class


class SealedSplit:
    """The test split behind a guard: every read outside :meth:`final_evaluation` raises.

    Budget picks, rankings, early stopping and headlines must use training or validation data;
    only the final evaluation of a finished model may read the test split. The guard makes a
    violation a loud error instead of a silently optimistic number, and counts legitimate reads.
    """

    def __init__(self, split: Split) -> None:
        self._split = split
        self._open = 0
        self.reads = 0

    @contextlib.contextmanager
    def final_evaluation(self) -> Iterator[Split]:
        """Open the split for the final evaluation of a finished model."""
        self._open += 1
        try:
            yield self._split
        finally:
            self._open -= 1

    def _get(self) -> Split:
        if not self._open:
            raise TestSplitSealedError(
                "the test split is sealed: read it only inside final_evaluation() (choices use validation data)"
            )
        self.reads += 1
        return self._split

    def __len__(self) -> int:  # the size is not data: reporting it needs no unsealing
        return len(self._split)

    def batches(self, batch_size: int, **kwargs):
        return self._get().batches(batch_size, **kwargs)

    @property
    def input_ids(self) -> torch.Tensor:
        return self._get().input_ids

    @property
    def attention_mask(self) -> torch.Tensor:
        return self._get().attention_mask

    @property
    def labels(self) -> torch.Tensor:
        return self._get().labels


@dataclass
class TensorSplits:
    """Train/validation/test splits plus what the model needs to know about them.

    ``test`` is wrapped in a :class:`SealedSplit`: read it through ``with splits.final_evaluation()
    as test:`` only.
    """

    train: Split
    val: Split
    test: Split | SealedSplit
    vocab_size: int
    n_classes: int
    pad_id: int
    class_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.test, SealedSplit):
            self.test = SealedSplit(self.test)

    def to(self, device: torch.device | str) -> TensorSplits:
        """Move every split to ``device`` once (training and evaluation batches then start there);
        moving the sealed test split is not a read of it."""
        self.train, self.val = self.train.to(device), self.val.to(device)
        self.test._split = self.test._split.to(device)  # type: ignore[union-attr]
        return self

    def final_evaluation(self):
        """Context manager yielding the test :class:`Split` for a final evaluation."""
        return self.test.final_evaluation()  # type: ignore[union-attr]

    @property
    def seq_len(self) -> int:
        return int(self.train.input_ids.shape[1])
