"""FFN neuron groups under the budget (``budget_scope: all``): gates, surgery, slicing, save/load,
for our encoder and the transformers BERT family."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import KeptUnits, Ranking
from budgeted_attention.pruning.surgery import keep_units, prune_to_budget
from budgeted_attention.pruning.switching import SlicedModel
from conftest import tiny_config

GROUP = 12  # d_ff 48 -> 4 groups


def _randomize(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gates in (model.gates, model.ffn_gates):
            gates.bias.copy_(torch.randn(gates.bias.shape, generator=gen))
            gates.slope_raw.copy_(torch.randn(gates.slope_raw.shape, generator=gen))


def _encoder():
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(ffn_group_size=GROUP))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out_bias.normal_(std=0.1)
            block.ffn.fc2.bias.normal_(std=0.1)
    _randomize(model)
    return model.eval()


def _bert():
    transformers = pytest.importorskip("transformers")
    from budgeted_attention.hf.bert import GatedBertClassifier

    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=29, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=16, num_labels=3,
    )
    model = GatedBertClassifier(transformers.BertForSequenceClassification(cfg).eval(), ffn_group_size=GROUP)
    _randomize(model)
    return model.eval()


FAMILIES = [_encoder, _bert]
IDS = torch.randint(1, 29, (3, 9), generator=torch.Generator().manual_seed(1))
MASK = torch.ones(3, 9, dtype=torch.long)
MASK[1, 6:] = 0


def _masks(model, kept: KeptUnits) -> UnitGates:
    heads = torch.zeros(model.n_layers, model.n_heads)
    groups = torch.zeros(model.n_layers, model.n_groups)
    for layer in range(model.n_layers):
        heads[layer, kept.heads[layer]] = 1
        groups[layer, kept.groups[layer]] = 1
    return UnitGates(heads, groups)


@pytest.mark.parametrize("make", FAMILIES)
def test_uneven_layers_one_group_and_an_empty_attention_layer(make):
    model = make()
    kept = KeptUnits(heads=[[3, 0], [], [1, 2, 0, 3]], groups=[[2], [0, 3], []])
    pruned = keep_units(model, kept)
    assert pruned.heads_per_layer == [2, 0, 4] and pruned.groups_per_layer == [1, 2, 0]
    assert pruned.ffn_widths() == [GROUP, 2 * GROUP, 0]
    with torch.no_grad():
        expected = model(IDS, MASK, gates=_masks(model, kept))
        assert torch.allclose(pruned(IDS, MASK), expected, atol=1e-5)
        # Soft budgets on the pruned model mean the full model's gates restricted to its units.
        soft = model.unit_gates(0.4)
        restricted = UnitGates(soft.heads * _masks(model, kept).heads, soft.ffn * _masks(model, kept).ffn)
        assert torch.allclose(pruned(IDS, MASK, budget=0.4), model(IDS, MASK, gates=restricted), atol=1e-5)


@pytest.mark.parametrize("make", FAMILIES)
def test_whole_layer_skip(make):
    model = make()
    kept = KeptUnits(heads=[[0], [], [1]], groups=[[1], [], [0]])
    pruned = keep_units(model, kept)
    with torch.no_grad():
        assert torch.allclose(pruned(IDS, MASK), model(IDS, MASK, gates=_masks(model, kept)), atol=1e-5)


@pytest.mark.parametrize("make", FAMILIES)
def test_save_load_round_trip_of_a_pruned_all_scope_model(make, tmp_path):
    model = make()
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(9))
    pruned = prune_to_budget(model, ranking, 0.4)
    save_model(pruned, tmp_path / "m", ranking=ranking.to_dict())
    loaded, description = load_model(tmp_path / "m")
    assert loaded.groups_per_layer == pruned.groups_per_layer and loaded.group_ids == pruned.group_ids
    with torch.no_grad():
        assert torch.equal(loaded(IDS, MASK), pruned(IDS, MASK))
        assert torch.equal(loaded(IDS, MASK, budget=0.3), pruned(IDS, MASK, budget=0.3))


@pytest.mark.parametrize("make", FAMILIES)
def test_sliced_layout_serves_every_budget_like_the_pruned_model(make):
    model = make()
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(9), min_one_per_layer=False)
    sliced = SlicedModel(model, ranking)
    weights = {name: p.data_ptr() for name, p in sliced.named_parameters()}
    with torch.no_grad():
        for budget in (0.05, 0.2, 0.5, 0.8, 1.0):
            sliced.set_budget(budget)
            pruned = prune_to_budget(model, ranking, budget)
            assert torch.allclose(sliced(IDS, MASK), pruned(IDS, MASK), atol=1e-5), budget
    assert weights == {name: p.data_ptr() for name, p in sliced.named_parameters()}  # no copies


@pytest.mark.parametrize("make", FAMILIES)
def test_sorting_ffn_neurons_preserves_the_function(make):
    model = make()
    with torch.no_grad():
        before = model(IDS, MASK)
        orders = [torch.randperm(48, generator=torch.Generator().manual_seed(i)).tolist() for i in range(3)]
        model.sort_ffn_neurons(orders)
        assert torch.allclose(model(IDS, MASK), before, atol=1e-5)
    with pytest.raises(ValueError, match="permutation"):
        model.sort_ffn_neurons([[0, 0] + list(range(2, 48))] * 3)


def _unit_ranking(seed: int, min_one: bool) -> Ranking:
    gen = torch.Generator().manual_seed(seed)
    scores = UnitGates(torch.rand(3, 4, generator=gen), torch.rand(3, 5, generator=gen))
    return Ranking.from_scores(scores, UnitGates(torch.full((3, 4), 3.0), torch.full((3, 5), 2.0)), min_one_per_layer=min_one)


@settings(max_examples=40, deadline=None)
@given(low=st.floats(0.01, 1.0), high=st.floats(0.01, 1.0), seed=st.integers(0, 500), min_one=st.booleans())
def test_unit_ranking_is_nested_and_fits_the_budget(low, high, seed, min_one):
    low, high = sorted((low, high))
    ranking = _unit_ranking(seed, min_one)
    small, large = ranking.kept(low), ranking.kept(high)
    for layer in range(3):
        assert set(small.heads[layer]) <= set(large.heads[layer])
        assert set(small.groups[layer]) <= set(large.groups[layer])
    minimum = (3 * 3.0 + 3 * 2.0) / ranking.total_cost if min_one else 3.0 / ranking.total_cost
    assert ranking.kept_cost(low) <= max(low, minimum) + 1e-9
    if min_one:
        assert all(small.heads_per_layer) and all(small.groups_per_layer)
    assert ranking.kept(1.0).heads_per_layer == [4, 4, 4]


def test_unit_ranking_round_trip_and_bad_dicts():
    ranking = _unit_ranking(3, True)
    assert Ranking.from_dict(ranking.to_dict()) == ranking
    broken = ranking.to_dict()
    broken["order"] = broken["order"][:-1]
    with pytest.raises(ValueError, match="exactly once"):
        Ranking.from_dict(broken)
    heads_only = ranking.heads_only()
    assert heads_only.scope == "heads" and heads_only.kept(1.0).heads == ranking.kept(1.0).heads
    assert Ranking.from_dict(heads_only.to_dict()) == heads_only


def test_model_refuses_ffn_gates_of_the_wrong_shape():
    model = _encoder()
    with pytest.raises(ValueError, match="full-grid shape"):
        model(IDS, MASK, gates=UnitGates(torch.ones(3, 4), torch.ones(3, 2)))
    plain = EncoderClassifier(tiny_config()).eval()
    with pytest.raises(ValueError, match="not gated"):
        plain(IDS, MASK, gates=UnitGates(torch.ones(3, 4), torch.ones(3, 4)))


def test_cost_of_units_and_ideal_speedup():
    model = _encoder()
    cost = model.cost_model(9)
    costs = model.unit_costs(9)
    assert costs.ffn.shape == (3, 4)
    total = cost.total_flops() - cost.classifier_flops()
    assert abs(float(costs.heads.sum() + costs.ffn.sum()) - total) < 1e-6 * total
    assert cost.ideal_speedup([2, 2, 2], [24, 24, 24]) == pytest.approx(cost.total_flops() / (cost.total_flops([2, 2, 2], [24, 24, 24])))
    assert cost.ideal_speedup([2, 2, 2], [24, 24, 24]) > cost.ideal_speedup([2, 2, 2])


def test_group_size_must_divide_the_ffn():
    from budgeted_attention.errors import ConfigError

    with pytest.raises(ConfigError, match="ffn_group_size"):
        tiny_config(ffn_group_size=7)


def test_sorting_ffn_neurons_is_refused_on_a_sliced_model():
    model = _encoder()
    model.set_active([4, 4, 4], [1, 1, 1])
    with pytest.raises(ValueError, match="every unit active"):
        model.sort_ffn_neurons([list(range(48))] * 3)


def test_unit_gradient_importance_puts_heads_and_groups_on_one_scale():
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.pruning.importance import unit_gradient_importance

    model = _encoder()
    split = Split(IDS, MASK, torch.tensor([0, 1, 2]))
    scores = unit_gradient_importance(model, split)
    joint = torch.cat([scores.heads, scores.ffn], dim=1).norm(dim=1)
    assert torch.allclose(joint, torch.ones(3))
