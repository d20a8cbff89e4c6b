"""The routing stage, the capped router's calibration on validation data, and routing summaries."""

import copy

import pytest
import torch

from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.routed import calibrate_router, choose_spread, realised_cost, routing_summary, train_routed, _pooled
from budgeted_attention.training.stages import seed_everything, train_dense

DATA = SyntheticConfig(n_train=256, n_val=64, n_test=64, seq_len=8, n_distractors=4)
TRAIN = TrainConfig(dense_steps=20, batch_size=16)


def _setup(mode: str):
    splits = make_synthetic_splits(DATA, 0)
    cfg = ModelConfig(vocab_size=splits.vocab_size, n_classes=4, max_len=splits.seq_len, d_model=16, n_layers=2, n_heads=4, d_ff=32)
    seed_everything(0)
    dense = EncoderClassifier(cfg)
    train_dense(dense, splits.train, TRAIN, seed=0, progress=False)
    model = copy.deepcopy(dense)
    model.attach_router(RouterConfig(mode=mode))
    return splits, dense, model


def test_routing_stage_is_deterministic_and_trains_the_router():
    states = []
    for _ in range(2):
        splits, dense, model = _setup("capped")
        before = copy.deepcopy(model.router.state_dict())
        log = train_routed(model, splits.train, TRAIN, seed=0, steps=12, teacher=dense, progress=False)
        assert log.steps == 12
        assert not torch.equal(before["scorer.weight"], model.router.scorer.weight)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_capped_routing_learns_per_input_counts_from_the_teacher():
    splits, dense, model = _setup("capped")
    train_routed(model, splits.train, TRAIN, seed=0, steps=100, teacher=dense, progress=False)
    calibrate_router(model, splits.val, [0.5])
    pooled = _pooled(model, splits.val, 64)
    counts = model.router.head_counts(pooled, 0.5)
    assert len(counts.unique()) > 1  # not every input at the same count
    assert realised_cost(model, pooled, 0.5) <= 0.5


def test_the_spread_is_chosen_on_validation_and_holds_the_budget():
    splits, dense, model = _setup("capped")
    train_routed(model, splits.train, TRAIN, seed=0, steps=100, teacher=dense, progress=False)
    choices = choose_spread(model, splits.val, [0.5, 1.0], scales=(0.0, 1.0))
    assert set(choices) == {0.5}
    scores = {float(c): v for c, v in choices[0.5]["val_scores"].items()}
    best = choices[0.5]["scale"]
    assert scores[best] == max(scores.values()) and model.router.scale(0.5) == best
    pooled = _pooled(model, splits.val, 64)
    assert realised_cost(model, pooled, 0.5) <= 0.5
    model.router.spread_scale[0.5] = 0.0  # spread 0: every input the same count
    calibrate_router(model, splits.val, [0.5])
    assert len(model.router.head_counts(pooled, 0.5).unique()) == 1
    _, _, learned = _setup("learned")
    with pytest.raises(ValueError, match="allocation 'difficulty'"):
        choose_spread(learned, splits.val, [0.5])


def test_routing_stage_refuses_a_model_without_router():
    splits, dense, _ = _setup("learned")
    with pytest.raises(ValueError, match="head router"):
        train_routed(dense, splits.train, TRAIN, seed=0, steps=2, progress=False)


def test_calibration_holds_the_mean_cost_under_each_budget_on_validation():
    splits, dense, model = _setup("capped")
    train_routed(model, splits.train, TRAIN, seed=0, steps=10, teacher=dense, progress=False)
    table = calibrate_router(model, splits.val, [0.25, 0.5, 0.75, 1.0])
    assert set(table) == {0.25, 0.5, 0.75}
    pooled = _pooled(model, splits.val, 64)
    for b in (0.25, 0.5, 0.75):
        assert realised_cost(model, pooled, b) <= b + 1e-9
        # not needlessly cheap: the cost is the largest within the budget (unless at the bound),
        # and the offset sits inside its flat interval, away from the count boundaries
        if table[b] < 19.9:
            cost = realised_cost(model, pooled, b)
            inside, breaking = table[b], 20.0  # bisect for the first offset that breaks the budget
            for _ in range(40):
                mid = 0.5 * (inside + breaking)
                inside, breaking = (mid, breaking) if realised_cost(model, pooled, b, mid) <= b else (inside, mid)
            assert realised_cost(model, pooled, b, inside) == cost  # the largest cost within b
            gap = breaking - table[b]
            assert gap > 1e-3 and realised_cost(model, pooled, b, max(table[b] - 0.8 * gap, -20.0)) == cost


def test_calibration_is_for_capped_routers_only():
    splits, _, model = _setup("learned")
    with pytest.raises(ValueError, match="capped"):
        calibrate_router(model, splits.val, [0.5])


def test_routing_summary_counts_heads_flops_and_accuracy():
    splits, dense, model = _setup("capped")
    cost = model.cost_model(splits.seq_len)
    with splits.final_evaluation() as test:
        full = routing_summary(model, test, cost, budget=1.0)
        half = routing_summary(model, test, cost, budget=0.5)
        dense_accuracy = (dense(test.input_ids, test.attention_mask).argmax(-1) == test.labels).float().mean()
    assert full.cost == 1.0 and full.ideal_speedup == pytest.approx(1.0)
    assert full.metrics["accuracy"] == pytest.approx(float(dense_accuracy))
    assert len(half.heads) == len(splits.test)
    assert half.cost == pytest.approx(sum(half.heads) / (4 * len(half.heads)))
    assert half.flops_fraction < 1.0 and half.ideal_speedup > 1.0


def test_router_gets_its_own_learning_rate_when_set():
    from budgeted_attention.training.stages import _param_groups

    _, _, model = _setup("capped")
    assert len(_param_groups(model, 1e-3, 2e-2, 0.0)) == 3  # decay, no decay, gates: the router at lr
    model.router.cfg.lr = 5e-3
    groups = _param_groups(model, 1e-3, 2e-2, 0.0)
    router_ids = {id(p) for p in model.router.parameters()}
    assert [g["lr"] for g in groups if {id(p) for p in g["params"]} == router_ids] == [5e-3]


def test_after_calibration_an_input_gets_the_same_count_alone_and_in_a_batch():
    splits, dense, model = _setup("capped")
    train_routed(model, splits.train, TRAIN, seed=0, steps=100, teacher=dense, progress=False)
    calibrate_router(model, splits.val, [0.25, 0.5, 0.75])
    pooled = _pooled(model, splits.val, 64)  # the inputs the offsets were fitted on
    with torch.no_grad():
        for b in (0.25, 0.5, 0.75):
            batched = model.router.decide(pooled, b).sum(-1)
            for i in range(len(pooled)):
                assert torch.equal(model.router.decide(pooled[i : i + 1], b).sum(-1)[0], batched[i])


class _EveryoneTies:
    """A task whose validation score is the same for every spread."""

    def evaluate(self, *args, **kwargs):
        return {"accuracy": 0.5}

    def score(self, metrics):
        return metrics["accuracy"]


def test_spread_ties_go_to_the_smaller_spread():
    splits, dense, model = _setup("capped")
    train_routed(model, splits.train, TRAIN, seed=0, steps=20, teacher=dense, progress=False)
    choices = choose_spread(model, splits.val, [0.5], scales=(1.0, 0.5, 0.0), task=_EveryoneTies())
    assert choices[0.5]["scale"] == 0.0 and model.router.scale(0.5) == 0.0
    assert model.router.calibration[0.5] == choices[0.5]["offsets"]["0.0"]
