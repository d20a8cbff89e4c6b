"""The "marked-token" synthetic task: a sequence classification task that needs attention.

Definition (all choices configurable in :class:`SyntheticConfig`):

* Vocabulary: ``0`` = PAD, ``1`` = CLS, ``2`` = MARK, then ``n_values`` *value* tokens
  (value v has id ``3 + v``), then ``n_distractors`` distractor tokens.
* A sequence is ``[CLS] x_1 ... x_T``. ``n_markers`` positions hold MARK, and the token right
  after each marker is a value token ``v_j`` (the *marked* values).
* Every value token occurs exactly ``value_repeats`` times in every sequence (marked
  occurrences included) at random positions; all other positions hold random distractors.
* The label is ``(v_1 + ... + v_m) mod n_classes`` (with the defaults, one marker and
  ``n_values == n_classes``: the label is the marked value).
* ``mixed_markers``: each sequence draws its number of markers m uniformly from
  1..``n_markers``: a data set of mixed difficulty (more markers = more positions to relate and
  a sum to form), with the difficulty of an input readable from its ids (the MARK count).

Because every sequence holds the same multiset of value and marker tokens, a bag-of-tokens
classifier is at chance *by construction* (tested); the model must relate the marker to its
right neighbour, which needs attention between positions. ``label_noise`` replaces a
fraction of *training* labels by a random class; validation and test labels stay clean.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from budgeted_attention.data.dataset import Split, TensorSplits
from budgeted_attention.errors import ConfigError

PAD_ID, CLS_ID, MARK_ID = 0, 1, 2
_FIRST_VALUE_ID = 3


@dataclass
class SyntheticConfig:
    """Parameters of the marked-token task (sizes in examples, lengths in tokens)."""

    n_train: int = 20000
    n_val: int = 2000
    n_test: int = 4000
    seq_len: int = 16
    n_values: int = 4
    value_repeats: int = 1
    n_distractors: int = 16
    n_markers: int = 1
    n_classes: int = 4
    label_noise: float = 0.0
    mixed_markers: bool = False

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "n_test", "seq_len", "n_values", "n_markers", "n_classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"data.{name} must be a positive integer, got {value!r}")
        if self.n_distractors < 1:
            raise ConfigError(f"data.n_distractors must be >= 1, got {self.n_distractors!r}")
        if self.value_repeats < self.n_markers:
            raise ConfigError(
                f"data.value_repeats ({self.value_repeats}) must be >= data.n_markers ({self.n_markers})"
            )
        if 2 * self.n_markers + self.n_values * self.value_repeats > self.seq_len + self.n_markers:
            raise ConfigError(
                f"data.seq_len ({self.seq_len}) is too short for {self.n_markers} markers and "
                f"{self.n_values} values x {self.value_repeats} repeats"
            )
        if not 0.0 <= self.label_noise < 1.0:
            raise ConfigError(f"data.label_noise must be in [0, 1), got {self.label_noise!r}")
        if not isinstance(self.mixed_markers, bool):
            raise ConfigError(f"data.mixed_markers must be true or false, got {self.mixed_markers!r}")

    @property
    def vocab_size(self) -> int:
        return _FIRST_VALUE_ID + self.n_values + self.n_distractors


def _sequence(cfg: SyntheticConfig, rng: random.Random) -> tuple[list[int], int]:
    """One body of ``seq_len`` tokens and its clean label."""
    # Non-adjacent marker slots in [0, T-1): choose m of T - m, sort, add offsets 0..m-1.
    n_markers = rng.randint(1, cfg.n_markers) if cfg.mixed_markers else cfg.n_markers
    slots = sorted(rng.sample(range(cfg.seq_len - n_markers), n_markers))
    markers = [slot + offset for offset, slot in enumerate(slots)]
    marked_values = [rng.randrange(cfg.n_values) for _ in markers]
    body = [-1] * cfg.seq_len
    for position, value in zip(markers, marked_values):
        body[position] = MARK_ID
        body[position + 1] = _FIRST_VALUE_ID + value
    remaining = []
    for value in range(cfg.n_values):
        remaining += [_FIRST_VALUE_ID + value] * (cfg.value_repeats - marked_values.count(value))
    free = [i for i, token in enumerate(body) if token == -1]
    for position, token in zip(rng.sample(free, len(remaining)), remaining):
        body[position] = token
    first_distractor = _FIRST_VALUE_ID + cfg.n_values
    body = [t if t != -1 else first_distractor + rng.randrange(cfg.n_distractors) for t in body]
    return body, sum(marked_values) % cfg.n_classes


def marker_counts(input_ids: torch.Tensor) -> torch.Tensor:
    """Markers per sequence, (N,) long: the difficulty of an input under ``mixed_markers``."""
    return (input_ids == MARK_ID).sum(dim=1)


def _generate(cfg: SyntheticConfig, count: int, rng: random.Random, noisy: bool) -> Split:
    bodies, labels = zip(*(_sequence(cfg, rng) for _ in range(count)))
    label_list = list(labels)
    if noisy and cfg.label_noise > 0:
        label_list = [
            rng.randrange(cfg.n_classes) if rng.random() < cfg.label_noise else label for label in label_list
        ]
    body = torch.tensor(bodies, dtype=torch.long)
    input_ids = torch.cat([torch.full((count, 1), CLS_ID), body], dim=1)
    return Split(input_ids, torch.ones_like(input_ids), torch.tensor(label_list, dtype=torch.long))


def make_synthetic_splits(cfg: SyntheticConfig, seed: int) -> TensorSplits:
    """Generate train/val/test splits deterministically from ``seed``."""
    rng = random.Random(10_007 * seed + 17)
    train = _generate(cfg, cfg.n_train, rng, noisy=True)
    val = _generate(cfg, cfg.n_val, rng, noisy=False)
    test = _generate(cfg, cfg.n_test, rng, noisy=False)
    return TensorSplits(
        train=train,
        val=val,
        test=test,
        vocab_size=cfg.vocab_size,
        n_classes=cfg.n_classes,
        pad_id=PAD_ID,
        class_names=[str(c) for c in range(cfg.n_classes)],
    )
