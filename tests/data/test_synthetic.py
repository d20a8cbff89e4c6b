import torch
import torch.nn.functional as F

from budgeted_attention.data.synthetic import MARK_ID, SyntheticConfig, make_synthetic_splits
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.evaluate import evaluate_accuracy
from budgeted_attention.training.stages import seed_everything, train_dense

SMALL = SyntheticConfig(n_train=3000, n_val=200, n_test=1000, seq_len=8, n_distractors=4)


def test_deterministic_and_well_formed():
    a = make_synthetic_splits(SMALL, seed=3)
    b = make_synthetic_splits(SMALL, seed=3)
    with a.final_evaluation() as test_a, b.final_evaluation() as test_b:
        assert torch.equal(a.train.input_ids, b.train.input_ids) and torch.equal(test_a.labels, test_b.labels)
        ids, labels = test_a.input_ids, test_a.labels
    assert ids.shape == (1000, 9) and int(ids.max()) < SMALL.vocab_size
    # The label is the value right after the single marker.
    marker = (ids == MARK_ID).int().argmax(dim=1)
    assert torch.equal((ids[torch.arange(1000), marker + 1] - 3) % SMALL.n_classes, labels)
    # Every sequence holds the same multiset of value tokens and markers.
    counts = F.one_hot(ids, SMALL.vocab_size).sum(dim=1)[:, 2 : 3 + SMALL.n_values]
    assert (counts == counts[0]).all()


def _bag_of_tokens_accuracy(splits) -> float:
    """Logistic regression on token counts (the strongest order-free linear classifier)."""
    def features(split):
        return F.one_hot(split.input_ids, splits.vocab_size).sum(dim=1).float()

    x, y = features(splits.train), splits.train.labels
    weights = torch.zeros(splits.vocab_size, splits.n_classes, requires_grad=True)
    bias = torch.zeros(splits.n_classes, requires_grad=True)
    optimizer = torch.optim.Adam([weights, bias], lr=0.05)
    for _ in range(300):
        optimizer.zero_grad()
        F.cross_entropy(x @ weights + bias, y).backward()
        optimizer.step()
    with splits.final_evaluation() as test:
        predictions = (features(test) @ weights + bias).argmax(dim=1)
        return float((predictions == test.labels).float().mean())


def test_bag_of_tokens_is_near_chance_but_a_transformer_solves_it():
    splits = make_synthetic_splits(SMALL, seed=0)
    chance = 1.0 / SMALL.n_classes
    assert _bag_of_tokens_accuracy(splits) < chance + 0.07

    seed_everything(0)
    model = EncoderClassifier(ModelConfig(vocab_size=splits.vocab_size, n_classes=4, max_len=16, d_model=32, n_layers=2, n_heads=2, d_ff=64))
    train_dense(model, splits.train, TrainConfig(dense_steps=500, batch_size=64, lr=3e-3), seed=0, progress=False)
    with splits.final_evaluation() as test:
        assert evaluate_accuracy(model, test) > 0.9
