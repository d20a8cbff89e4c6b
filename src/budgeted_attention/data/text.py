"""Text data -> tensors: stratified splits, per-class sampling, word-level tokenizer, encoding.

The tokenizer is a Hugging Face ``tokenizers`` WordLevel model (BERT normaliser with lower
casing and accent stripping, BERT pre-tokeniser) whose vocabulary is learned from the training
split only (``min_frequency``, ``max_vocab``); sequences are ``[CLS] tokens...`` truncated to
``max_len`` and padded with ``[PAD]``. It is saved as ``tokenizer.json`` in the run directory.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from budgeted_attention.config import check_float, check_int
from budgeted_attention.data.dataset import Split, TensorSplits
from budgeted_attention.data.sources import DataSourceConfig, Example, RawDataset, load_source
from budgeted_attention.errors import ConfigError, DataError
from budgeted_attention.io import atomic_path

PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"


@dataclass
class TextDataConfig(DataSourceConfig):
    """Source plus splitting and tokenisation settings."""

    split_seed: int = 0
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    n_per_class: int = 0
    n_test_per_class: int = 0
    max_len: int = 64
    min_frequency: int = 2
    max_vocab: int = 20000

    def __post_init__(self) -> None:
        """Check every value, naming ``data.<key>`` (``ConfigError``)."""
        super().__post_init__()
        check_int(self.split_seed, "data.split_seed")
        self.val_fraction = check_float(self.val_fraction, "data.val_fraction", gt=0.0, lt=1.0)
        self.test_fraction = check_float(self.test_fraction, "data.test_fraction", ge=0.0, lt=1.0)
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ConfigError(
                f"data.val_fraction ({self.val_fraction}) and data.test_fraction ({self.test_fraction}) must be in (0, 1) with sum < 1"
            )
        check_int(self.n_per_class, "data.n_per_class", ge=0)
        check_int(self.n_test_per_class, "data.n_test_per_class", ge=0)
        check_int(self.max_len, "data.max_len", ge=2)
        check_int(self.min_frequency, "data.min_frequency", ge=0)
        # The vocabulary holds the 3 special tokens ([PAD], [UNK], [CLS]) plus at least one word.
        check_int(self.max_vocab, "data.max_vocab", ge=4)


def _by_class(examples: list[Example]) -> dict[int, list[Example]]:
    groups: dict[int, list[Example]] = defaultdict(list)
    for example in examples:
        groups[example.label].append(example)
    return groups


def sample_per_class(examples: list[Example], n_per_class: int, rng: random.Random) -> list[Example]:
    """At most ``n_per_class`` examples of each class (0 = all), order shuffled deterministically."""
    chosen: list[Example] = []
    for label in sorted(_by_class(examples)):
        group = [e for e in examples if e.label == label]
        rng.shuffle(group)
        chosen += group[:n_per_class] if n_per_class else group
    rng.shuffle(chosen)
    return chosen


def stratified_split(examples: list[Example], fractions: list[float], rng: random.Random) -> list[list[Example]]:
    """Split ``examples`` into len(fractions) + 1 parts, stratified by class; the last part takes
    the rest. Deterministic for a given ``rng`` state."""
    parts: list[list[Example]] = [[] for _ in range(len(fractions) + 1)]
    for label, group in sorted(_by_class(examples).items()):
        group = list(group)
        rng.shuffle(group)
        start = 0
        for index, fraction in enumerate(fractions):
            count = int(math.floor(fraction * len(group) + 0.5))  # half-up, not banker's rounding
            parts[index] += group[start : start + count]
            start += count
        parts[-1] += group[start:]
    for part in parts:
        rng.shuffle(part)
    return parts


def build_tokenizer(texts: list[str], max_len: int, min_frequency: int, max_vocab: int) -> Tokenizer:
    """Word-level tokenizer trained on ``texts`` (see module docstring)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordLevelTrainer(vocab_size=max_vocab, min_frequency=min_frequency, special_tokens=[PAD, UNK, CLS])
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{CLS} $A", special_tokens=[(CLS, tokenizer.token_to_id(CLS))])
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(PAD), pad_token=PAD)
    return tokenizer


def encode(tokenizer: Tokenizer, examples: list[Example]) -> Split:
    """Tensors for ``examples``: (N, T) ids and mask padded to the longest sequence, (N,) labels."""
    encodings = tokenizer.encode_batch([e.text for e in examples])
    ids = torch.tensor([enc.ids for enc in encodings], dtype=torch.long)
    mask = torch.tensor([enc.attention_mask for enc in encodings], dtype=torch.long)
    labels = torch.tensor([e.label for e in examples], dtype=torch.long)
    return Split(ids, mask, labels)


def prepare_pretrained_tokenizer(tokenizer: Tokenizer, max_len: int) -> Tokenizer:
    """A pretrained model's tokenizer (WordPiece of BERT, BPE of RoBERTa...) set to truncate and pad.

    Its own padding token is kept when the tokenizer already pads (``<pad>`` for RoBERTa);
    otherwise ``[PAD]`` must exist.
    """
    tokenizer.enable_truncation(max_length=max_len)
    if tokenizer.padding is not None:
        return tokenizer
    pad_id = tokenizer.token_to_id(PAD)
    if pad_id is None:
        raise DataError(f"the pretrained tokenizer has no padding token ({PAD} not in its vocabulary)")
    tokenizer.enable_padding(pad_id=pad_id, pad_token=PAD)
    return tokenizer


def pad_id_of(tokenizer: Tokenizer) -> int:
    """The id a tokenizer pads with."""
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    return tokenizer.token_to_id(PAD)


def split_examples(cfg: TextDataConfig, raw: RawDataset) -> tuple[list[Example], list[Example], list[Example]]:
    """(train, validation, test) examples: sampled and split as configured, deterministic in
    ``split_seed`` (the load test of ``baa serve`` replays the same test split as raw texts)."""
    rng = random.Random(cfg.split_seed)
    if raw.test is not None:
        pool = sample_per_class(raw.train, cfg.n_per_class, rng)
        val, train = stratified_split(pool, [cfg.val_fraction], rng)
        test = sample_per_class(raw.test, cfg.n_test_per_class, rng)
    else:
        pool = sample_per_class(raw.train, cfg.n_per_class, rng)
        val, test, train = stratified_split(pool, [cfg.val_fraction, cfg.test_fraction], rng)
    if not train or not val or not test:
        raise DataError(f"data set too small to split: {len(train)} train, {len(val)} validation, {len(test)} test examples")
    return train, val, test


def make_text_splits(
    cfg: TextDataConfig,
    tokenizer_path: str | Path | None = None,
    raw: RawDataset | None = None,
    pretrained_tokenizer: Tokenizer | None = None,
) -> tuple[TensorSplits, Tokenizer]:
    """Load, sample, split (stratified, deterministic in ``split_seed``), tokenise and encode.

    With ``pretrained_tokenizer`` (a pretrained model's own tokenizer) no vocabulary is learned.
    """
    raw = raw or load_source(cfg)
    train, val, test = split_examples(cfg, raw)
    if pretrained_tokenizer is not None:
        tokenizer = prepare_pretrained_tokenizer(pretrained_tokenizer, cfg.max_len)
    else:
        tokenizer = build_tokenizer([e.text for e in train], cfg.max_len, cfg.min_frequency, cfg.max_vocab)
    if tokenizer_path is not None:
        with atomic_path(tokenizer_path) as tmp:
            tokenizer.save(str(tmp))
    splits = TensorSplits(
        train=encode(tokenizer, train),
        val=encode(tokenizer, val),
        test=encode(tokenizer, test),
        vocab_size=tokenizer.get_vocab_size(),
        n_classes=len(raw.class_names),
        pad_id=pad_id_of(tokenizer),
        class_names=list(raw.class_names),
    )
    return splits, tokenizer
