"""Per-input head routing (BudgetFormer / budget-capped): the hard forward computes only the
selected heads and equals the masked forward; decisions, schedule, checks and save/load."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.decoder import CausalLM, DecoderConfig
from budgeted_attention.model.router import HeadRouter, RouterConfig, pooled_embeddings
from budgeted_attention.model.transformer import EncoderClassifier

from conftest import tiny_config


def _routed(mode: str = "capped", seed: int = 0, allocation: str = "difficulty") -> EncoderClassifier:
    torch.manual_seed(seed)
    model = EncoderClassifier(tiny_config())
    router = model.attach_router(RouterConfig(mode=mode, allocation=allocation))
    with torch.no_grad():  # distinct scores and fractions per input
        router.scorer.weight.normal_(std=2.0)
        router.controller[2].weight.normal_(std=2.0)
    return model.eval()


def _inputs(batch: int = 6, seq: int = 11):
    ids = torch.randint(0, 29, (batch, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[3, 2:] = 0
    return ids, mask


def test_hard_routing_equals_the_masked_forward_and_the_per_input_forward():
    model = _routed("capped")
    ids, mask = _inputs()
    with torch.no_grad():
        selection = model.router.decide(pooled_embeddings(model.token_embedding, ids, mask), 0.5)
        assert selection.dtype == torch.bool
        assert len(torch.unique(selection.flatten(1), dim=0)) > 1  # a batch of mixed head sets
        hard = model(ids, mask, budget=0.5)
        masked = model(ids, mask, gates=selection.float())
        assert torch.allclose(hard, masked, atol=1e-5)
        for i in range(ids.shape[0]):
            alone = model(ids[i : i + 1], mask[i : i + 1], budget=0.5)
            assert torch.allclose(alone, hard[i : i + 1], atol=1e-5)


@pytest.mark.parametrize(("causal", "qk_norm"), [(False, False), (True, True)])
def test_many_head_sets_computed_head_by_head_equal_the_masked_forward(causal, qk_norm):
    from budgeted_attention.model.attention import GatedSelfAttention
    from budgeted_attention.model.gates import LayerSelection

    torch.manual_seed(3)
    attention = GatedSelfAttention(16, 4, 4, causal=causal, qk_norm=qk_norm).eval()
    with torch.no_grad():
        attention.out_bias.normal_()
    x = torch.randn(24, 7, 16)
    mask = torch.ones(24, 1, 1, 7, dtype=torch.bool)
    mask[3, ..., 4:] = False
    selected = torch.rand(24, 4) < 0.5
    selected[:, 0] = True  # a head every input selected (the no-gather branch)
    assert len(torch.unique(selected, dim=0)) > 4  # more sets than heads: the head-by-head path
    with torch.no_grad():
        hard = attention(x, mask, LayerSelection(chosen=selected))
        masked = attention(x, mask, LayerSelection(gates=selected.float()))
    assert torch.allclose(hard, masked, atol=1e-5)


def test_selected_heads_are_the_top_k_scores_of_every_layer():
    model = _routed("learned")
    ids, mask = _inputs()
    router = model.router
    with torch.no_grad():
        pooled = pooled_embeddings(model.token_embedding, ids, mask)
        selection = router.decide(pooled, None)
        scores = router.scorer(pooled).view(-1, router.n_layers, router.n_heads)
    k = router.last_heads
    assert torch.equal(selection.sum(-1), k.view(-1, 1).expand(-1, router.n_layers))
    for i in range(ids.shape[0]):
        for layer in range(router.n_layers):
            top = set(scores[i, layer].topk(int(k[i])).indices.tolist())
            assert set(selection[i, layer].nonzero().flatten().tolist()) == top


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=0.0, max_value=1.0))
def test_head_count_is_the_ceiling_of_the_fraction_and_at_least_one(fraction):
    router = HeadRouter(8, 2, 6, RouterConfig())
    k = int(router.heads_for(torch.tensor([fraction]))[0])
    assert k == max(1, math.ceil(fraction * 6 - 1e-6))


def test_learned_fraction_stays_in_the_published_range():
    model = _routed("learned")
    ids, mask = _inputs()
    with torch.no_grad():
        pooled = pooled_embeddings(model.token_embedding, ids, mask) * 100
        s = model.router.fraction(pooled, None)
    assert bool((s >= 0.1 - 1e-6).all()) and bool((s <= 0.9 + 1e-6).all())


def test_capped_router_at_full_budget_is_the_dense_model():
    model = _routed("capped")
    ids, mask = _inputs()
    dense = copy.deepcopy(model)
    dense.router = None
    with torch.no_grad():
        assert torch.equal(model(ids, mask, budget=1.0), dense(ids, mask))
        assert torch.equal(model(ids, mask), dense(ids, mask))


def test_learned_router_refuses_a_budget_and_capped_needs_a_valid_one():
    learned, capped = _routed("learned"), _routed("capped")
    ids, mask = _inputs()
    with pytest.raises(ValueError, match="learns its own budget"):
        learned(ids, mask, budget=0.5)
    with pytest.raises(ValueError, match="budget must be a finite number"):
        capped(ids, mask, budget=1.5)


def test_training_mode_queues_the_regulariser_and_the_schedule_switches_to_exploitation():
    model = _routed("capped", allocation="gradient").train()
    ids, mask = _inputs()
    router = model.router
    router.set_phase(0, 10)
    assert not router.exploit and router.noise > 0 and router.temperature == router.cfg.temperature_start
    soft = router.decide(pooled_embeddings(model.token_embedding, ids, mask), 0.5)
    assert soft.dtype == torch.float32 and bool((soft <= 1).all())
    model(ids, mask, budget=0.5)
    loss = model.auxiliary_loss()
    assert loss is not None and loss.requires_grad
    assert model.auxiliary_loss() is None  # cleared
    router.set_phase(6, 10)
    assert router.exploit and router.noise == 0 and router.temperature == pytest.approx(router.cfg.temperature_end)
    hard = router.decide(pooled_embeddings(model.token_embedding, ids, mask), 0.5)
    assert set(torch.unique(hard.detach()).tolist()) <= {0.0, 1.0}
    weights = torch.arange(hard.shape[-1], dtype=torch.float32)  # a loss that prefers some heads
    (hard * weights).sum().backward()  # straight-through: the hard forward still carries a gradient
    assert float(router.scorer.weight.grad.norm()) > 0 and float(router.controller[2].weight.grad.norm()) > 0


def test_difficulty_allocation_regresses_the_controller_onto_difficulty_not_the_task_loss():
    model = _routed("capped").train()
    ids, mask = _inputs()
    router = model.router
    router.set_phase(6, 10)  # exploitation: straight-through hard gates
    hard = router.decide(pooled_embeddings(model.token_embedding, ids, mask), 0.5)
    (hard * torch.arange(hard.shape[-1], dtype=torch.float32)).sum().backward()
    assert router.controller[2].weight.grad is None  # the count does not learn from the task loss
    assert float(router.scorer.weight.grad.norm()) > 0  # which heads still does
    router.zero_grad()
    router.take_loss()
    difficulty = torch.tensor([0.1, 0.2, 0.4, 0.8, 1.6, 3.2])
    router.decide(pooled_embeddings(model.token_embedding, ids, mask), 0.5)
    router.fit_difficulty(difficulty)
    loss = router.take_loss()
    loss.backward()
    assert float(router.controller[2].weight.grad.norm()) > 0
    with pytest.raises(ValueError, match="one difficulty per input"):
        router.fit_difficulty(difficulty[:3])


def test_a_controller_fitted_to_difficulty_gives_harder_inputs_more_heads():
    torch.manual_seed(0)
    router = HeadRouter(4, 2, 8, RouterConfig(mode="capped", spread=2.0)).train()
    pooled = torch.randn(64, 4)
    difficulty = pooled[:, 0].exp()  # harder along the first feature
    optimiser = torch.optim.Adam(router.controller.parameters(), lr=0.02)
    for _ in range(300):
        router.decide(pooled, 0.5)
        router.fit_difficulty(difficulty)
        optimiser.zero_grad()
        router.take_loss().backward()
        optimiser.step()
    router.eval()
    heads = router.head_counts(pooled, 0.5).float()
    easy, hard = difficulty < difficulty.median(), difficulty >= difficulty.median()
    assert float(heads[hard].mean()) > float(heads[easy].mean()) + 1.0
    with pytest.raises(ValueError, match="allocation 'difficulty'"):
        HeadRouter(4, 2, 8, RouterConfig(mode="learned")).fit_difficulty(difficulty)


def test_router_survives_save_and_load_with_its_calibration(tmp_path):
    model = _routed("capped")
    model.router.calibration = {0.25: -1.5, 0.5: 0.25}
    model.router.spread_scale = {0.25: 0.0, 0.5: 0.5}
    ids, mask = _inputs()
    path = save_model(model, tmp_path / "routed")
    loaded, description = load_model(path)
    assert description["router"]["config"]["mode"] == "capped"
    assert loaded.router.calibration == {0.25: -1.5, 0.5: 0.25}
    assert loaded.router.spread_scale == {0.25: 0.0, 0.5: 0.5}
    with torch.no_grad():
        assert torch.equal(loaded(ids, mask, budget=0.5), model(ids, mask, budget=0.5))


def test_calibration_offset_interpolates_between_calibrated_budgets():
    router = HeadRouter(8, 2, 4, RouterConfig(mode="capped"))
    assert router.offset(0.3) == 0.0
    router.calibration = {0.25: -1.0, 0.75: 1.0}
    assert router.offset(0.1) == -1.0 and router.offset(0.9) == 1.0
    assert router.offset(0.5) == pytest.approx(0.0, abs=1e-9)  # logit(0.5) is midway in logit space


def test_router_is_refused_where_it_cannot_work():
    decoder = CausalLM(DecoderConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=0, max_len=8))
    with pytest.raises(ValueError, match="no per-input head routing"):
        decoder.attach_router(RouterConfig())
    pruned = EncoderClassifier(tiny_config())
    pruned.keep_units([[0], [0, 1], [2]])
    with pytest.raises(ValueError, match="unpruned model"):
        pruned.attach_router(RouterConfig())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"mode": "fixed"}, "router.mode"),
        ({"fraction_min": 0.8, "fraction_max": 0.2}, "fraction_min"),
        ({"temperature_end": 0}, "router.temperature_end"),
        ({"colour": 1}, "unknown router key"),
        ({"allocation": "random"}, "router.allocation"),
        ({"spread": -1}, "router.spread"),
    ],
)
def test_router_config_names_the_bad_value(data, match):
    with pytest.raises(ConfigError, match=match):
        RouterConfig.from_dict(data)


def test_ties_pick_the_same_heads_alone_and_in_a_batch():
    router = HeadRouter(8, 2, 8, RouterConfig()).eval()  # zero scorer: every score ties
    pooled = torch.randn(5, 8)
    with torch.no_grad():
        batch = router.decide(pooled, None)
        for i in range(5):
            assert torch.equal(router.decide(pooled[i : i + 1], None)[0], batch[i])


def test_routing_refuses_a_sliced_or_pruned_model():
    model = _routed("capped")
    ids, mask = _inputs()
    model.set_active([4, 2, 4])
    with pytest.raises(ValueError, match="keep and run every head"):
        model(ids, mask, budget=0.5)


@pytest.mark.parametrize(
    ("data", "match"),
    [({"target": 0.95}, "router.target"), ({"explore_fraction": 1.0}, "router.explore_fraction")],
)
def test_router_config_refuses_silent_no_ops(data, match):
    with pytest.raises(ConfigError, match=match):
        RouterConfig.from_dict(data)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from(["learned", "capped"]), st.booleans())
def test_one_input_decision_equals_the_batched_decision(seed, mode, ties):
    torch.manual_seed(seed)
    router = HeadRouter(8, 3, 6, RouterConfig(mode=mode)).eval()
    with torch.no_grad():
        router.controller[2].weight.normal_(std=3.0)
        router.scorer.weight.normal_(std=2.0)
        if ties:  # rounded scores: many equal within a layer
            router.scorer.weight.mul_(0.0).add_(torch.randint(-1, 2, router.scorer.weight.shape).float())
    pooled = torch.randn(4, 8)
    budget = None if mode == "learned" else 0.5
    with torch.no_grad():
        batch = router.decide(pooled, budget)
        batch_heads = router.last_heads
        for i in range(4):
            assert torch.equal(router.decide(pooled[i : i + 1], budget)[0], batch[i])
            assert int(router.last_heads[0]) == int(batch_heads[i])


def test_one_inputs_head_sets_are_the_rows_of_its_mask():
    router = _routed("capped").router
    pooled = torch.randn(1, router.scorer.in_features)
    with torch.no_grad():
        sets = router.decide_sets(pooled, 0.5)
        mask = router.decide(pooled, 0.5)[0]
    assert sets == [tuple(int(h) for h in row.nonzero().flatten()) for row in mask]
    with pytest.raises(ValueError, match="one input in evaluation"):
        router.decide_sets(torch.randn(2, router.scorer.in_features), 0.5)


def test_one_input_on_a_reordered_layout_runs_the_heads_it_chose():
    from budgeted_attention.pruning.selection import Ranking
    from budgeted_attention.pruning.surgery import sort_heads

    model = _routed("capped")
    router = model.router
    model.router = None
    ranking = Ranking.from_scores(UnitGates(torch.randn(model.n_layers, model.n_heads, generator=torch.Generator().manual_seed(4))))
    sorted_model = sort_heads(model, ranking)  # every head kept, each layer's heads permuted
    sorted_model.router = router
    model.router = router
    assert sorted_model.head_ids != model.head_ids
    ids, mask = _inputs()
    with torch.no_grad():
        for i in range(ids.shape[0]):
            one = (ids[i : i + 1], mask[i : i + 1])
            assert torch.allclose(sorted_model(*one, budget=0.5), model(*one, budget=0.5), atol=1e-5)


def test_pooling_without_a_mask_has_the_bits_of_an_all_ones_mask():
    embedding = torch.nn.Embedding(50, 16)
    ids = torch.randint(0, 50, (1, 13))
    with torch.no_grad():
        assert torch.equal(pooled_embeddings(embedding, ids, None), pooled_embeddings(embedding, ids, torch.ones_like(ids)))


@pytest.mark.parametrize("mode", ["capped", "learned"])
def test_one_input_takes_the_head_set_path_not_the_mask_path(mode, monkeypatch):
    from budgeted_attention.model import heads

    model = _routed(mode)
    budget = 0.5 if mode == "capped" else None
    ids, mask = _inputs()
    with torch.no_grad():
        batch = model(ids, mask, budget=budget)  # grouped per head set (the mask path)

    def refuse(*_args, **_kwargs):
        raise AssertionError("one input must not build a per-layer mask")

    monkeypatch.setattr(heads, "attend_chosen", refuse)
    for i in range(ids.shape[0]):
        one = (ids[i : i + 1], mask[i : i + 1])
        with torch.no_grad():
            assert torch.allclose(model(*one, budget=budget), batch[i : i + 1], atol=1e-5)
        assert torch.allclose(model(*one, budget=budget), batch[i : i + 1], atol=1e-5)  # autograd on, eval mode
