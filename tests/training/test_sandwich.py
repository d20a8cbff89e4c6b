"""The sandwich rule and FFN gates in the training stages."""

import dataclasses

import torch

from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.stages import is_gate_parameter, sandwich_budgets, train_budgeted, train_hard


def _setup(sampling: str):
    splits = make_synthetic_splits(SyntheticConfig(n_train=256, n_val=64, n_test=64), 0)
    cfg = ModelConfig(vocab_size=splits.vocab_size, n_classes=splits.n_classes, max_len=splits.seq_len,
                      d_model=16, n_layers=2, n_heads=2, d_ff=32, ffn_group_size=8)
    torch.manual_seed(0)
    model = EncoderClassifier(cfg)
    train = TrainConfig(batch_size=16, budgeted_steps=4, hard_steps=3, budget_sampling=sampling)
    return splits, model, train


def test_gate_parameters_of_heads_and_ffn_are_recognised():
    _, model, _ = _setup("single")
    names = [n for n, _ in model.named_parameters() if is_gate_parameter(n)]
    assert sorted(names) == ["ffn_gates.bias", "ffn_gates.slope_raw", "gates.bias", "gates.slope_raw"]


def test_sandwich_budgets_are_the_smallest_then_random():
    import random

    cfg = TrainConfig(budget_min=0.2, budget_max=0.9, sandwich_random=3)
    budgets = sandwich_budgets(cfg, random.Random(0))
    assert budgets[0] == 0.2 and len(budgets) == 4 and all(0.2 <= b <= 0.9 for b in budgets)


def test_sandwich_soft_and_hard_stages_train_every_gate_and_freeze_them_when_hard():
    splits, model, train = _setup("sandwich")
    costs = model.unit_costs(splits.seq_len)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    log = train_budgeted(model, splits.train, train, costs, seed=0, progress=False)
    assert log.steps == 4 and all(torch.isfinite(torch.tensor(log.losses)))
    assert not torch.equal(before["ffn_gates.bias"], model.ffn_gates.bias)  # FFN gates learn
    ranking = Ranking.from_scores(model.unit_importance(), costs)
    gates = {n: p.detach().clone() for n, p in model.named_parameters() if is_gate_parameter(n)}
    hard = train_hard(model, splits.train, train, ranking, seed=0, progress=False)
    assert hard.steps == 3
    for name, value in gates.items():
        assert torch.equal(value, dict(model.named_parameters())[name])  # frozen in the hard stage


def test_single_and_sandwich_differ():
    splits, model_a, train = _setup("single")
    model_b = EncoderClassifier(model_a.config)
    model_b.load_state_dict(model_a.state_dict())
    costs = model_a.unit_costs(splits.seq_len)
    train_budgeted(model_a, splits.train, train, costs, seed=0, progress=False)
    train_budgeted(model_b, splits.train, dataclasses.replace(train, budget_sampling="sandwich"), costs, seed=0, progress=False)
    assert not torch.equal(model_a.ffn_gates.bias, model_b.ffn_gates.bias)
