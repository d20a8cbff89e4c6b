import random
from pathlib import Path

import torch

from budgeted_attention.data.sources import Example
from budgeted_attention.data.text import TextDataConfig, make_text_splits, sample_per_class, stratified_split

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_stratified_split_is_deterministic_and_balanced():
    examples = [Example(f"t{i}", i % 3) for i in range(90)]
    a = stratified_split(examples, [0.1, 0.2], random.Random(0))
    b = stratified_split(examples, [0.1, 0.2], random.Random(0))
    assert [[e.text for e in p] for p in a] == [[e.text for e in p] for p in b]
    assert [len(p) for p in a] == [9, 18, 63]
    assert sorted(e.label for e in a[0]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_sample_per_class():
    examples = [Example(f"t{i}", i % 2) for i in range(20)]
    chosen = sample_per_class(examples, 3, random.Random(1))
    assert len(chosen) == 6 and sorted(e.label for e in chosen) == [0, 0, 0, 1, 1, 1]


def test_text_splits_with_official_test_file_and_saved_tokenizer(tmp_path):
    cfg = TextDataConfig(source="ag_news", train_file=str(FIXTURES / "ag_news_train.csv"), test_file=str(FIXTURES / "ag_news_test.csv"), max_len=8, min_frequency=1, val_fraction=0.25)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        splits, tokenizer = make_text_splits(cfg, tokenizer_path=tmp_path / "tokenizer.json")
    assert (tmp_path / "tokenizer.json").is_file()
    assert len(splits.test) == 12 and len(splits.val) == 12 and len(splits.train) == 28
    assert splits.train.input_ids.shape[1] <= 8
    assert torch.all(splits.train.input_ids[:, 0] == tokenizer.token_to_id("[CLS]"))
    padded = splits.train.attention_mask == 0
    assert torch.all(splits.train.input_ids[padded] == splits.pad_id)
    assert splits.n_classes == 4


def test_headered_csv_splits():
    cfg = TextDataConfig(source="csv", train_file=str(FIXTURES / "custom.csv"), text_columns=["headline", "body"], label_column="topic", min_frequency=1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        splits, _ = make_text_splits(cfg)
    assert splits.n_classes == 3 and len(splits.train) + len(splits.val) + len(splits.test) == 30


def test_batches_cut_right_padding_without_changing_outputs():
    import torch

    from budgeted_attention.data.dataset import Split
    from budgeted_attention.model.config import ModelConfig
    from budgeted_attention.model.transformer import EncoderClassifier

    ids = torch.tensor([[5, 6, 0, 0, 0], [7, 0, 0, 0, 0], [5, 6, 7, 8, 0]])
    mask = (ids != 0).long()
    split = Split(ids, mask, torch.tensor([0, 1, 0]))
    (b_ids, b_mask, _), = list(split.batches(2))[:1]
    assert b_ids.shape == (2, 2) and torch.equal(b_mask, torch.tensor([[1, 1], [1, 0]]))
    torch.manual_seed(0)
    model = EncoderClassifier(ModelConfig(vocab_size=9, n_classes=2, max_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=8, pooling="mean")).eval()
    with torch.no_grad():
        full = model(ids[:2], mask[:2])
        assert torch.allclose(model(b_ids, b_mask), full, atol=1e-5)
    left = Split(ids.flip(1), mask.flip(1), torch.tensor([0, 1, 0]))  # left padding: nothing is cut
    assert next(left.batches(2))[0].shape == (2, 5)
