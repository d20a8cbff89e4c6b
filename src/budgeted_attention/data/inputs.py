"""Benchmark inputs: random token ids, and padded batches with a data set's real lengths.

Timing only full-length unpadded batches overstates what serving real text costs (real
examples are mostly shorter than ``max_len``) and never exercises the masked attention path.
:func:`length_batches` draws per-example lengths from a split's empirical length distribution
and pads each batch to its longest example, as a dynamic-padding server would.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from budgeted_attention.data.dataset import Split


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _as_length(value: Any) -> int | None:
    """``value`` as a Python int if it is a positive integer (numpy/torch ints too), else None."""
    if isinstance(value, bool):
        return None
    try:
        n = operator.index(value)
    except TypeError:
        return None
    return n if n > 0 else None


def _check_lengths(lengths: list[int]) -> list[int]:
    """Validated copy of ``lengths`` as Python ints."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError(f"lengths must be non-empty, got {lengths!r}")
    checked = [_as_length(n) for n in lengths]
    bad = [n for n, c in zip(lengths, checked) if c is None]
    if bad:
        # A length-0 example would be a fully masked row: SDPA returns NaN for it.
        raise ValueError(f"lengths must be positive integers (tokens), got {bad[:5]!r}")
    return checked


def random_ids(vocab_size: int, batch: int, seq: int, *, seed: int = 0, low: int = 0) -> torch.Tensor:
    """(batch, seq) long ids drawn uniformly from ``[low, vocab_size)`` with a seeded generator.

    ``low`` lets callers keep padding/special ids (e.g. 0) out of the input.
    """
    _check_positive("vocab_size", vocab_size)
    _check_positive("batch", batch)
    _check_positive("seq", seq)
    if not 0 <= low < vocab_size:
        raise ValueError(f"low must be in [0, vocab_size={vocab_size}), got {low!r}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab_size, (batch, seq), generator=gen)


def split_lengths(split: Split) -> list[int]:
    """Real (non-padding) token count of each example of ``split``: its attention-mask row sums."""
    return [int(n) for n in split.attention_mask.sum(dim=1).tolist()]


def length_batches(
    lengths: list[int],
    batch_size: int,
    n_batches: int,
    vocab_size: int,
    *,
    seed: int = 0,
    pad_id: int = 0,
    low: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` right-padded batches whose example lengths follow ``lengths``.

    Each example's length is drawn with replacement (uniformly over the entries of
    ``lengths``, so with the empirical distribution) from one generator seeded with ``seed``;
    a batch is padded to its own longest example.

    Args:
        lengths: real token counts of a data set's examples (e.g. :func:`split_lengths`).
        batch_size: examples per batch.
        n_batches: batches to make.
        vocab_size: ids are drawn from ``[low, vocab_size)`` without ``pad_id``.
        seed: seed of the length and id draws.
        pad_id: id written at padding positions.
        low: smallest id for real tokens.

    Returns:
        ``[(input_ids, attention_mask), ...]``: both (batch_size, T_i) long, T_i the longest
        sampled length of batch i; mask is 1 at the first ``length`` positions of a row, 0 after,
        and ids there are ``pad_id``.
    """
    lengths = _check_lengths(lengths)
    _check_positive("batch_size", batch_size)
    _check_positive("n_batches", n_batches)
    _check_positive("vocab_size", vocab_size)
    if not 0 <= low < vocab_size:
        raise ValueError(f"low must be in [0, vocab_size={vocab_size}), got {low!r}")
    pad_in_range = low <= pad_id < vocab_size
    n_ids = vocab_size - low - int(pad_in_range)
    if n_ids <= 0:
        raise ValueError(f"no non-pad ids in [low={low}, vocab_size={vocab_size}) with pad_id={pad_id}")
    gen = torch.Generator().manual_seed(seed)
    table = torch.tensor(lengths, dtype=torch.long)
    picks = table[torch.randint(0, len(lengths), (n_batches, batch_size), generator=gen)]
    batches = []
    for row_lengths in picks:
        seq = int(row_lengths.max())
        mask = (torch.arange(seq).unsqueeze(0) < row_lengths.unsqueeze(1)).long()
        # Uniform over the n_ids non-pad ids: draw from a range one shorter and skip pad_id.
        ids = torch.randint(low, low + n_ids, (batch_size, seq), generator=gen)
        if pad_in_range:
            ids = ids + (ids >= pad_id).long()
        ids = ids.masked_fill(mask == 0, pad_id)
        batches.append((ids, mask))
    return batches
