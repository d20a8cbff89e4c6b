from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.data.dataset import Split
from budgeted_attention.data.inputs import length_batches, random_ids, split_lengths


def _split(lengths: list[int], seq: int) -> Split:
    mask = (torch.arange(seq) < torch.tensor(lengths).unsqueeze(1)).long()
    ids = torch.randint(1, 20, (len(lengths), seq)).masked_fill(mask == 0, 0)
    return Split(ids, mask, torch.zeros(len(lengths), dtype=torch.long))


def test_random_ids_shape_range_and_seed():
    ids = random_ids(50, 3, 7, seed=4, low=2)
    assert ids.shape == (3, 7) and ids.dtype == torch.long
    assert int(ids.min()) >= 2 and int(ids.max()) < 50
    assert torch.equal(ids, random_ids(50, 3, 7, seed=4, low=2))
    assert not torch.equal(ids, random_ids(50, 3, 7, seed=5, low=2))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(vocab_size=0, batch=1, seq=1), "vocab_size"),
        (dict(vocab_size=5, batch=0, seq=1), "batch"),
        (dict(vocab_size=5, batch=1, seq=-2), "seq"),
        (dict(vocab_size=5, batch=1, seq=1, low=5), "low"),
    ],
)
def test_random_ids_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        random_ids(**kwargs)


def test_split_lengths_are_mask_sums():
    assert split_lengths(_split([3, 1, 8, 5], 8)) == [3, 1, 8, 5]


def test_length_batches_shapes_padding_and_ids():
    lengths = [2, 3, 5, 9]
    batches = length_batches(lengths, batch_size=6, n_batches=10, vocab_size=12, seed=1, pad_id=3, low=1)
    assert len(batches) == 10
    for ids, mask in batches:
        assert ids.shape == mask.shape and ids.shape[0] == 6
        assert ids.dtype == mask.dtype == torch.long
        row_lengths = mask.sum(dim=1)
        assert set(row_lengths.tolist()) <= set(lengths)
        assert ids.shape[1] == int(row_lengths.max())  # padded to the longest example only
        # Right padding: a row's mask is 1...1 0...0.
        assert torch.equal(mask, (torch.arange(ids.shape[1]) < row_lengths.unsqueeze(1)).long())
        assert bool((ids[mask == 0] == 3).all())
        real = ids[mask == 1]
        assert bool((real != 3).all()) and int(real.min()) >= 1 and int(real.max()) < 12


def test_length_batches_seed_determinism():
    a = length_batches([4, 7, 11], 3, 5, 30, seed=2)
    b = length_batches([4, 7, 11], 3, 5, 30, seed=2)
    c = length_batches([4, 7, 11], 3, 5, 30, seed=3)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert any(x[0].shape != y[0].shape or not torch.equal(x[0], y[0]) for x, y in zip(a, c))


def test_length_batches_uses_every_non_pad_id():
    # vocab 4 with pad 0 and low 0: real ids are exactly {1, 2, 3}, none missing.
    ids, mask = length_batches([50], 4, 1, 4, seed=0, pad_id=0)[0]
    assert set(ids[mask == 1].tolist()) == {1, 2, 3}


@pytest.mark.parametrize(
    "args, kwargs, word",
    [
        (([], 2, 2, 10), {}, "lengths"),
        (([3, 0], 2, 2, 10), {}, "lengths"),
        (([3, 1.5], 2, 2, 10), {}, "lengths"),
        (([3], 0, 2, 10), {}, "batch_size"),
        (([3], 2, 0, 10), {}, "n_batches"),
        (([3], 2, 2, 0), {}, "vocab_size"),
        (([3], 2, 2, 10), {"low": 10}, "low"),
        (([3], 2, 2, 1), {"pad_id": 0}, "non-pad"),
    ],
)
def test_length_batches_validation(args, kwargs, word):
    with pytest.raises(ValueError, match=word):
        length_batches(*args, **kwargs)


def test_length_sampling_follows_distribution():
    # 1/4 of examples have 3 tokens, 3/4 have 10: sampled frequencies must match.
    lengths = [3] * 25 + [10] * 75
    batches = length_batches(lengths, 16, 250, 20, seed=0)
    counts = Counter(n for _, mask in batches for n in mask.sum(dim=1).tolist())
    total = sum(counts.values())
    assert set(counts) == {3, 10}
    assert abs(counts[3] / total - 0.25) < 0.02  # 4000 draws: ~7 standard errors of margin


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    batch_size=st.integers(1, 5),
    n_batches=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_sampled_lengths_stay_in_support(lengths, batch_size, n_batches, seed):
    batches = length_batches(lengths, batch_size, n_batches, 9, seed=seed)
    assert len(batches) == n_batches
    for ids, mask in batches:
        sampled = mask.sum(dim=1).tolist()
        assert len(sampled) == batch_size and set(sampled) <= set(lengths)
        assert ids.shape[1] == max(sampled)


@settings(max_examples=15, deadline=None)
@given(weights=st.lists(st.integers(1, 5), min_size=2, max_size=4), seed=st.integers(0, 1000))
def test_sampled_frequencies_track_empirical_frequencies(weights, seed):
    # Length i+1 appears weights[i] times; 3000 draws put each frequency within 0.06 (>5 sigma).
    lengths = [i + 1 for i, w in enumerate(weights) for _ in range(w)]
    batches = length_batches(lengths, 30, 100, 9, seed=seed)
    counts = Counter(n for _, mask in batches for n in mask.sum(dim=1).tolist())
    for i, w in enumerate(weights):
        assert abs(counts[i + 1] / 3000 - w / len(lengths)) < 0.06


def _family_models():
    """A tiny model of each family: (model, pad id, first ordinary id its vocabulary has)."""
    from budgeted_attention.model.config import ModelConfig  # noqa: PLC0415
    from budgeted_attention.model.decoder import CausalLM, DecoderConfig  # noqa: PLC0415
    from budgeted_attention.model.transformer import EncoderClassifier  # noqa: PLC0415

    models = [
        (EncoderClassifier(ModelConfig(vocab_size=40, n_classes=2, max_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=16)), 0, 3),
        (CausalLM(DecoderConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=0, max_len=8)), 0, 3),
    ]
    try:
        from transformers import BertConfig, BertForSequenceClassification  # noqa: PLC0415

        from budgeted_attention.hf.bert import GatedBertClassifier  # noqa: PLC0415
    except ImportError:
        return models
    bert = BertForSequenceClassification(BertConfig(vocab_size=3000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=16, num_labels=2))
    return [*models, (GatedBertClassifier(bert.eval()), 0, 1000)]


def test_synthetic_inputs_never_draw_the_pad_or_special_ids_in_any_family():
    # Regression: bench drew ids from 0 (the pad id) for our families while export and serving
    # warm-up started at 3; now every synthetic input starts at the family's first ordinary id.
    from budgeted_attention.benchmark.config import BenchConfig  # noqa: PLC0415
    from budgeted_attention.benchmark.runner import _input_settings  # noqa: PLC0415

    for model, pad_id, first in _family_models():
        assert model.first_ordinary_id() == first, type(model).__name__
        vocab = model.input_embedding().num_embeddings
        cfg = BenchConfig(batch_sizes=[4], seq_lens=[8])
        for _, _, _, batches in _input_settings(model, cfg, vocab, [3, 5, 8, 8], pad_id, None):
            for ids, mask in batches:
                real = ids if mask is None else ids[mask.bool()]
                assert int(real.min()) >= first, type(model).__name__
