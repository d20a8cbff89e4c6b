import copy

import torch

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.stages import sample_budget, seed_everything, train_budgeted, train_dense, train_hard

DATA = SyntheticConfig(n_train=256, n_val=32, n_test=64, seq_len=8, n_distractors=4)


def _setup(seed=0):
    splits = make_synthetic_splits(DATA, 0)
    cfg = ModelConfig(vocab_size=splits.vocab_size, n_classes=4, max_len=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    seed_everything(seed)
    return splits, EncoderClassifier(cfg)


def test_training_is_deterministic_for_a_seed():
    tc = TrainConfig(dense_steps=10, budgeted_steps=10, batch_size=16)
    results = []
    for _ in range(2):
        splits, model = _setup()
        train_dense(model, splits.train, tc, seed=0, progress=False)
        costs = model.unit_costs(splits.seq_len)
        train_budgeted(model, splits.train, tc, costs, seed=0, teacher=copy.deepcopy(model), progress=False)
        results.append(model.state_dict())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_dense_stage_leaves_gates_untouched():
    splits, model = _setup()
    before = model.gates.bias.clone()
    train_dense(model, splits.train, TrainConfig(dense_steps=5, batch_size=16), seed=0, progress=False)
    assert torch.equal(before, model.gates.bias)


def test_overshoot_penalty_pulls_cost_under_budget():
    splits, model = _setup()
    with torch.no_grad():
        model.gates.bias.fill_(3.0)  # every gate near 1: C(b) far above b
    costs = model.unit_costs(splits.seq_len)
    before = float(estimated_cost(model.unit_gates(0.3), costs).detach())
    tc = TrainConfig(budgeted_steps=100, batch_size=16, distill_weight=0.0, gate_lr=0.1)
    train_budgeted(model, splits.train, tc, costs, seed=0, progress=False)
    after = float(estimated_cost(model.unit_gates(0.3), costs).detach())
    assert after < before - 0.2


def test_hard_stage_trains_only_through_the_mask():
    splits, model = _setup()
    ranking = Ranking.from_scores(UnitGates(torch.tensor([[1.0, 0.0], [0.0, 1.0]])))
    before = copy.deepcopy(model.state_dict())
    log = train_hard(model, splits.train, TrainConfig(hard_steps=5, batch_size=16), ranking, seed=0, progress=False)
    assert log.steps == log.steps_run == len(log.losses) == 5
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_hard_stage_samples_from_hard_budget_min(monkeypatch):
    splits, model = _setup()
    ranking = Ranking.from_scores(UnitGates(torch.tensor([[1.0, 0.0], [0.0, 1.0]])))
    asked = []
    masks = Ranking.masks
    monkeypatch.setattr(Ranking, "masks", lambda self, budget: asked.append(budget) or masks(self, budget))
    tc = TrainConfig(hard_steps=30, batch_size=16, budget_min=0.1, hard_budget_min=0.6, full_budget_prob=0.0)
    train_hard(model, splits.train, tc, ranking, seed=0, progress=False)
    assert len(asked) >= 20 and min(asked) >= 0.6  # budget_min governs the soft stage only
    asked.clear()
    train_hard(model, splits.train, TrainConfig(hard_steps=30, batch_size=16, budget_min=0.1, full_budget_prob=0.0), ranking, seed=0, progress=False)
    assert min(asked) < 0.6  # unset: the hard stage samples from budget_min as before


def test_hard_stage_freezes_gates_so_the_stored_ranking_stays_true():
    splits, model = _setup()
    with torch.no_grad():
        model.gates.bias.copy_(torch.tensor([[2.0, -1.0], [-0.5, 1.0]]))
    ranking = Ranking.from_scores(UnitGates(model.gates.importance()))
    before = [p.clone() for p in model.gates.parameters()]
    tc = TrainConfig(hard_steps=20, batch_size=16, gate_lr=0.5)
    train_hard(model, splits.train, tc, ranking, seed=0, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.gates.parameters()))
    assert Ranking.from_scores(UnitGates(model.gates.importance())) == ranking
    assert all(p.requires_grad for p in model.gates.parameters())  # unfrozen again afterwards


def test_training_budgets_include_the_full_budget():
    import random

    rng = random.Random(0)
    draws = [sample_budget(TrainConfig(full_budget_prob=0.25), rng) for _ in range(2000)]
    share = sum(b == 1.0 for b in draws) / len(draws)
    assert 0.2 < share < 0.3 and min(draws) >= 0.1
    assert all(b < 1.0 for b in (sample_budget(TrainConfig(full_budget_prob=0.0), rng) for _ in range(200)))


def test_dense_early_stopping_on_validation_restores_the_best_weights():
    splits, model = _setup()
    tc = TrainConfig(dense_steps=400, batch_size=16, lr=3e-3, early_stopping_patience=2, eval_every=20)
    log = train_dense(model, splits.train, tc, seed=0, progress=False, val=splits.val)
    best_step, best_score = max(log.val_history, key=lambda entry: (entry[1], -entry[0]))
    assert log.steps == best_step and log.steps <= log.steps_run <= 400
    from budgeted_attention.training.evaluate import evaluate_accuracy

    assert evaluate_accuracy(model, splits.val) == best_score
    if log.steps_run < 400:  # stopped early: the last `patience` evaluations did not improve
        assert all(score <= best_score for _, score in log.val_history[-2:])


def test_loss_curve_averages_equal_windows_of_steps():
    from budgeted_attention.training.stages import StageLog

    log = StageLog(losses=[float(i) for i in range(10)])
    assert log.loss_curve(points=5) == [(2, 0.5), (4, 2.5), (6, 4.5), (8, 6.5), (10, 8.5)]
    assert log.loss_curve(points=3) == [(4, 1.5), (8, 5.5), (10, 8.5)]
    assert StageLog().loss_curve() == []


def test_straight_through_forward_runs_the_hard_selection_and_trains_the_gates():
    from budgeted_attention.training.stages import _straight_through

    splits, model = _setup()
    with torch.no_grad():
        model.gates.bias.copy_(torch.tensor([[2.0, -1.0], [0.5, 1.0]]))
    costs = model.unit_costs(splits.seq_len)
    ids, mask = splits.train.input_ids[:8], splits.train.attention_mask[:8]
    gates = model.unit_gates(0.5)
    st = _straight_through(model, gates, 0.5, UnitGates(costs.heads), True)
    hard = Ranking.from_scores(model.unit_importance()).masks(0.5)
    assert torch.allclose(st.heads, hard.heads.to(st.heads))  # forward values: the 0/1 masks
    assert torch.equal(hard.heads, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    out = model(ids, mask, gates=st)
    assert torch.allclose(out, model(ids, mask, gates=hard.map(lambda t: t.float())), atol=1e-6)
    out.sum().backward()
    assert model.gates.bias.grad is not None and model.gates.bias.grad.abs().sum() > 0


def test_straight_through_budgeted_stage_runs_and_moves_gates():
    splits, model = _setup()
    costs = model.unit_costs(splits.seq_len)
    before = model.gates.bias.clone()
    tc = TrainConfig(budgeted_steps=5, batch_size=16, gate_forward="straight-through")
    log = train_budgeted(model, splits.train, tc, costs, seed=0, teacher=copy.deepcopy(model), progress=False)
    assert log.steps_run == 5 and all(torch.isfinite(torch.tensor(log.losses)))
    assert not torch.equal(before, model.gates.bias)


def test_freeze_embeddings_leaves_the_token_embedding_untouched_and_trains_the_rest():
    splits, model = _setup()
    embedding = model.input_embedding().weight
    before, other = embedding.detach().clone(), copy.deepcopy(model.state_dict())
    tc = TrainConfig(dense_steps=5, batch_size=16, freeze_embeddings=True)
    train_dense(model, splits.train, tc, seed=0, progress=False)
    assert torch.equal(before, embedding)
    assert embedding.requires_grad  # switched back on after the stage
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, other[k])]
    assert changed and "token_embedding.weight" not in changed
